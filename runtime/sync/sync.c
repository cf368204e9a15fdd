/* sync.c: the kernels of the sync strategies other than strict (docs/sync.md): local SGD's
 * periodic average and the bounded-staleness parameter server of `sync async`.
 *
 * Local SGD. Each replica (a coordinate of the batch axis) trains on its own; every K steps, and
 * after the last step so that the run ends with one model, planrt_local_average sums the
 * replicas' parameters (the f32 master weights of a bf16 plan) and divides by their number. The
 * same call sums the losses each replica recorded since the previous average, so the logged loss
 * of a step is the mean over replicas of their own losses, as strict sync's is.
 *
 * Async (the stale synchronous parallel model, Ho et al. 2013). The master is coordinate 0 of the
 * batch axis and also computes a gradient on its own share of each step's batch. Version v of the
 * parameters is what the master holds after v updates; update t adds every rank's gradient of
 * step t. A worker computes step t on the newest version it has received, which must be at least
 * t - staleness: it blocks only when it is further ahead. Messages, on the batch axis's
 * communicator:
 *   tag 0, master to worker   version v (n parameters), for v = 1 .. steps, in order
 *   tag 1, worker to master   step t's gradient, then its loss and the version it used (2 f64)
 * A worker keeps one receive posted; its gradient messages leave from a ring of staleness + 1
 * slots and the master's versions from a ring of staleness + 2. Neither ring ever waits on the
 * other side: the worker reuses slot t mod (S + 1) at step t, when it holds version t - S, which
 * the master made after receiving step t - S - 1's gradient (the slot's previous message); the
 * master reuses a slot for version t + 1 when version t + 1 - (S + 2) = t - S - 1 went out, and
 * every worker, which sent step t's gradient at version >= t - S, has received it. The master
 * waits for the workers' gradients of the step it updates; a worker waits for a version at most S
 * behind its step, which the master made S + 1 updates earlier: neither waits for the other in a
 * cycle. With staleness 0 every worker computes step t on version t, which is strict sync with
 * the gradient summed in worker order.
 *
 * The requests in flight and a worker's version counters are this file's; the buffers are the
 * program's state, planned and reported like any other. */
#define PLANRT_INTERNAL
#include "planrt_program.h"
#include "planrt_exec.h"

#include <stdlib.h>
#include <string.h>

enum { TAG_PARAMS = 0, TAG_GRADS = 1, TAIL_BYTES = 16 };

static struct {
	int64_t version, received;   /* worker: version in use; versions received */
	planrt_request_t pull;       /* worker: the receive of version received + 1 */
	planrt_request_t *push;      /* worker: [staleness + 1] */
	planrt_request_t *recv;      /* master: [nworkers] */
	planrt_request_t *publish;   /* master: [(staleness + 2) * nworkers] */
	int nslots;                  /* worker: the push ring's slots */
} A;

static planrt_request_t *requests(planrt_request_t **set, int n)
{
	if (!*set) {
		*set = calloc((size_t)(n > 0 ? n : 1), sizeof **set);
		if (!*set)
			planrt_fatal("out of memory for %d async requests", n);
	}
	return *set;
}

static void finish(planrt_ctx_t *ctx, planrt_request_t *q)
{
	if (!*q)
		return;
	double t0 = planrt_now();
	planrt_request_t r = *q;
	*q = NULL;
	PLANRT_CHECK(planrt_wait(r));
	ctx->wait_s += planrt_now() - t0;
}

static void finish_all(planrt_ctx_t *ctx, planrt_request_t **set, int n)
{
	for (int i = 0; *set && i < n; i++)
		finish(ctx, &(*set)[i]);
	free(*set);
	*set = NULL;
}

void planrt_scale_metric(double *x, double f)
{
	*x *= f;
}

/* ------------------------------------------------------------------ local SGD */

void planrt_local_average(planrt_ctx_t *ctx, int every, void *flat, int64_t n, planrt_dtype_t t, void *params,
			  planrt_dtype_t pt, const double *loss, double *history, planrt_comm_t c, int outer, double outer_lr,
			  double outer_momentum, float *anchor, float *momentum)
{
	if (every < 1 || t != planrt_f32)
		planrt_fatal("internal error: planrt_local_average every %d, dtype %d (f32 averages)", every, (int)t);
	history[ctx->step % every] = *loss;
	if ((ctx->step + 1) % every && ctx->step != ctx->steps - 1)
		return;
	PLANRT_CHECK(planrt_allreduce(history, history, (size_t)every, planrt_f64, planrt_sum, c, NULL, NULL));
	PLANRT_CHECK(planrt_allreduce(flat, flat, (size_t)n, planrt_f32, planrt_sum, c, NULL, NULL));
	float *x = flat, replicas = (float)planrt_comm_size(c);
	for (int64_t i = 0; i < n; i++)
		x[i] /= replicas;
	if (outer) { /* torch.optim.SGD on the outer gradient anchor - average (dampening 0) */
		float mu = (float)outer_momentum, lr = (float)outer_lr;
		for (int64_t i = 0; i < n; i++) {
			float g = anchor[i] - x[i];
			if (momentum) {
				momentum[i] = mu * momentum[i] + g;
				g = outer == 2 ? g + mu * momentum[i] : momentum[i];
			}
			anchor[i] -= lr * g;
			x[i] = anchor[i];
		}
	}
	if (params)
		planrt_cast(flat, planrt_f32, params, pt, n);
}

/* ------------------------------------------------------------------ async: the worker */

/* Receives versions in order until the newest is at least need (or none is left to come). */
static void pull_until(planrt_ctx_t *ctx, int64_t need, void *params, void *inbox, int64_t n, planrt_dtype_t t,
		       planrt_comm_t c)
{
	for (;;) {
		if (!A.pull && A.received < ctx->steps)
			PLANRT_CHECK(planrt_recv_tagged(inbox, (size_t)n, t, 0, TAG_PARAMS, c, NULL, &A.pull));
		if (!A.pull)
			break;
		if (A.version >= need) { /* take what has arrived, wait for nothing */
			int done = 0;
			PLANRT_CHECK(planrt_test(A.pull, &done));
			if (!done)
				break;
		}
		finish(ctx, &A.pull);
		memcpy(params, inbox, (size_t)n * planrt_dtype_size(t));
		A.version = ++A.received;
	}
	if (A.version < need)
		planrt_fatal("internal error: async worker needs parameter version %lld but the master sends %lld",
			     (long long)need, (long long)ctx->steps);
}

void planrt_async_pull(planrt_ctx_t *ctx, int staleness, void *params, void *inbox, int64_t n, planrt_dtype_t t,
		       planrt_comm_t c)
{
	if (ctx->step == 0)
		A.version = A.received = 0; /* every rank starts from the same initial parameters */
	pull_until(ctx, ctx->step - staleness, params, inbox, n, t, c);
}

void planrt_async_push(planrt_ctx_t *ctx, int staleness, const void *grads, int64_t n, planrt_dtype_t t, void *ring,
		       const double *loss, planrt_comm_t c)
{
	size_t es = planrt_dtype_size(t), bytes = (size_t)n * es + TAIL_BYTES;
	A.nslots = staleness + 1;
	planrt_request_t *q = &requests(&A.push, A.nslots)[ctx->step % A.nslots];
	finish(ctx, q);
	unsigned char *msg = (unsigned char *)ring + (size_t)(ctx->step % (staleness + 1)) * bytes;
	double tail[2] = {*loss, (double)A.version};
	memcpy(msg, grads, (size_t)n * es);
	memcpy(msg + (size_t)n * es, tail, TAIL_BYTES);
	PLANRT_CHECK(planrt_send_tagged(msg, bytes / es, t, 0, TAG_GRADS, c, NULL, q));
}

void planrt_async_drain(planrt_ctx_t *ctx, void *params, void *inbox, int64_t n, planrt_dtype_t t, planrt_comm_t c)
{
	if (ctx->step != ctx->steps - 1)
		return;
	pull_until(ctx, ctx->steps, params, inbox, n, t, c);
	finish_all(ctx, &A.push, A.nslots);
}

/* ------------------------------------------------------------------ async: the master */

void planrt_async_post(planrt_ctx_t *ctx, void *inbox, int64_t msg, planrt_dtype_t t, int nworkers, planrt_comm_t c)
{
	planrt_request_t *q = requests(&A.recv, nworkers);
	for (int w = 0; w < nworkers; w++) {
		if (q[w])
			planrt_fatal("internal error: async gradient receive of worker %d posted twice", w + 1);
		PLANRT_CHECK(planrt_recv_tagged((unsigned char *)inbox + (size_t)w * (size_t)msg * planrt_dtype_size(t),
						(size_t)msg, t, w + 1, TAG_GRADS, c, NULL, &q[w]));
	}
	(void)ctx;
}

void planrt_async_gather(planrt_ctx_t *ctx, int staleness, void *grads, int64_t n, planrt_dtype_t t,
			 const void *inbox, int nworkers, double *loss, double *versions)
{
	size_t es = planrt_dtype_size(t), bytes = (size_t)n * es + TAIL_BYTES;
	versions[0] = (double)ctx->step;
	for (int w = 0; w < nworkers; w++) {
		finish(ctx, &requests(&A.recv, nworkers)[w]);
		const unsigned char *msg = (const unsigned char *)inbox + (size_t)w * bytes;
		double tail[2];
		memcpy(tail, msg + (size_t)n * es, TAIL_BYTES);
		if (tail[1] > (double)ctx->step || (double)ctx->step - tail[1] > staleness)
			planrt_fatal("async: worker %d computed step %lld on parameter version %.0f, %.0f updates old; the "
				     "plan's bound is staleness = %d",
				     w + 1, (long long)ctx->step, tail[1], (double)ctx->step - tail[1], staleness);
		planrt_accumulate(grads, msg, n, t);
		*loss += tail[0];
		versions[w + 1] = tail[1];
	}
	if (ctx->step == ctx->steps - 1) {
		free(A.recv);
		A.recv = NULL;
	}
}

void planrt_async_publish(planrt_ctx_t *ctx, int staleness, const void *params, int64_t n, planrt_dtype_t t, void *ring,
			  int nworkers, planrt_comm_t c)
{
	int slots = staleness + 2;
	size_t bytes = (size_t)n * planrt_dtype_size(t);
	int slot = (int)((ctx->step + 1) % slots);
	planrt_request_t *q = requests(&A.publish, slots * nworkers) + (size_t)slot * (size_t)nworkers;
	for (int w = 0; w < nworkers; w++)
		finish(ctx, &q[w]);
	unsigned char *copy = (unsigned char *)ring + (size_t)slot * bytes;
	memcpy(copy, params, bytes);
	for (int w = 0; w < nworkers; w++)
		PLANRT_CHECK(planrt_send_tagged(copy, (size_t)n, t, w + 1, TAG_PARAMS, c, NULL, &q[w]));
	if (ctx->step == ctx->steps - 1)
		finish_all(ctx, &A.publish, slots * nworkers);
}
