/* walker.c: one step's (or one held-out batch's) walk over the stage's action table, and the
 * pipeline transfers the actions' kernels start.
 *
 * Action i + 1 is prepared (its receives posted) right before action i runs, so a transfer
 * overlaps the previous action's compute. Each activation slot owns nreqs request handles; a send
 * started from a slot stays in flight until the slot is reused: before a forward action is
 * prepared, its slot's requests are waited and cleared (the forward is the first user of a slot
 * for a new micro-batch), and every slot is drained at the end of the step. When the action that
 * runs between the forward's prepare and the forward itself uses the same slot (in 1F1B, B m is
 * followed by F m + nslots), that drain moves to right before the forward runs, so that it also
 * covers the sends B m starts, and it spares the receives the forward's own prepare posted.
 *
 * Evaluation walks a forward-only copy of the table: dropout off, and the receives of gradients
 * (channels from the stage's chunk count on) that forwards post for their backward not posted. */
#include "driver.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* the pipe axis of the program being walked (planrt_walk_ sets it from its stage's program); the
 * transfer kernels take no context */
static int pipe_axis = -1;

static planrt_comm_t pipe_comm(const char *what)
{
	planrt_comm_t c = pipe_axis >= 0 ? planrt_axis_comm(pipe_axis) : NULL;
	if (!c)
		planrt_fatal("internal error: %s in a program without a pipeline axis", what);
	return c;
}

void planrt_p2p_send_start(const void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req)
{
	PLANRT_CHECK(planrt_send_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline send"), NULL, req));
}

/* set while the walker evaluates: only forwards run, so the receives of gradients (channels from
 * the stage's chunk count on) that forwards post for their backward are not posted */
static int forward_only_chunks;

void planrt_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req)
{
	if (forward_only_chunks && channel >= forward_only_chunks)
		return;
	PLANRT_CHECK(planrt_recv_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline receive"), NULL, req));
}

void planrt_p2p_finish(planrt_ctx_t *ctx, planrt_request_t *req)
{
	if (!*req)
		return;
	double t0 = planrt_now();
	PLANRT_CHECK(planrt_wait(*req));
	*req = NULL;
	ctx->wait_s += planrt_now() - t0;
}

/* --trace: an action (or the prepare that posts its receives) is a compute event, "F 3" or
 * "B 3" (micro-batch 3; ".1" for chunk 1 of an interleaved schedule) */
static void trace_action(const char *prefix, const planrt_action_t *a)
{
	if (!planrt_tracing_)
		return;
	char name[64], args[96];
	snprintf(name, sizeof name, a->chunk ? "%s%c %d.%d" : "%s%c %d", prefix, a->kind == PLANRT_FORWARD ? 'F' : 'B',
		 (int)a->micro, a->chunk);
	planrt_trace_begin_(name, "compute");
	snprintf(args, sizeof args, "\"micro_batch\":%d,\"chunk\":%d", (int)a->micro, a->chunk);
	planrt_trace_args_(args);
}

/* --trace: a run phase (init, a step, a checkpoint, ...) as an event with its step */
void planrt_trace_phase_(const char *name, int64_t step)
{
	if (!planrt_tracing_)
		return;
	char args[48];
	planrt_trace_begin_(name, "run");
	snprintf(args, sizeof args, "\"step\":%lld", (long long)step);
	planrt_trace_args_(args);
}

/* waits for and clears the requests of set[0, n) (those with keep[r] == 0 when keep is given) */
static void drain(walker_t *w, planrt_request_t *set, int n, const unsigned char *keep)
{
	double t0 = 0;
	int waited = 0;
	for (int r = 0; r < n; r++)
		if (set[r] && !(keep && keep[r])) {
			if (!waited++)
				t0 = planrt_now();
			PLANRT_CHECK(planrt_wait(set[r]));
			set[r] = NULL;
		}
	if (waited)
		w->ctx->wait_s += planrt_now() - t0;
}

/* the ctx fields of action a */
static void point_at(walker_t *w, const planrt_action_t *a)
{
	const planrt_stage_t *s = w->stage;
	planrt_ctx_t *ctx = w->ctx;
	ctx->micro = (int)a->micro;
	ctx->chunk = a->chunk;
	ctx->slot = ctx->arena + s->slot_offset + (size_t)a->slot * s->slot_bytes;
	ctx->slot_index = a->slot;
	ctx->reqs = w->reqs + (size_t)a->slot * (size_t)s->nreqs;
	ctx->inbox = a->inbox == PLANRT_NO_INBOX ? NULL : ctx->arena + s->inbox_offset + (size_t)a->inbox * s->inbox_bytes;
}

/* Prepares action i; action i - 1 (if any) runs next. A forward starts a new micro-batch in its
 * slot, so the slot's requests (sends of the micro-batch that used it before) are drained first.
 * When action i - 1 itself uses that slot (1F1B: B m is followed by F m + slots on the same slot),
 * it has not run yet: its sends start only when it runs, and its prepared receives belong to it.
 * Then the drain waits until just before the forward runs, and spares the receives the forward's
 * own prepare posted (recorded in own). */
static void prepare(walker_t *w, int i)
{
	const planrt_stage_t *s = w->stage;
	const planrt_action_t *a = &s->actions[i];
	int nr = s->nreqs;
	planrt_request_t *set = w->reqs + (size_t)a->slot * (size_t)nr;
	unsigned char *own = w->own + (size_t)a->slot * (size_t)nr;
	w->deferred = 0;
	if (a->kind == PLANRT_FORWARD) {
		w->deferred = i > 0 && s->actions[i - 1].slot == a->slot;
		if (!w->deferred)
			drain(w, set, nr, NULL);
		for (int r = 0; r < nr; r++)
			own[r] = set[r] != NULL; /* marks what prepare adds, below */
	}
	const planrt_phase_fn *fns = a->kind == PLANRT_FORWARD ? s->prepare_forward : s->prepare_backward;
	if (fns && fns[a->chunk]) {
		point_at(w, a);
		trace_action("prepare ", a);
		fns[a->chunk](w->ctx);
		planrt_trace_end_(NULL);
	}
	if (a->kind == PLANRT_FORWARD)
		for (int r = 0; r < nr; r++)
			own[r] = !own[r] && set[r] != NULL;
}

/* outside actions: no micro-batch, no slot */
void planrt_clear_action_(planrt_ctx_t *ctx)
{
	ctx->micro = 0;
	ctx->chunk = 0;
	ctx->slot = NULL;
	ctx->slot_index = 0;
	ctx->inbox = NULL;
	ctx->reqs = NULL;
}

void planrt_walk_(walker_t *w)
{
	const planrt_stage_t *s = w->stage;
	pipe_axis = w->ctx->program ? w->ctx->program->pipe_axis : -1;
	w->deferred = 0;
	if (s->nactions > 0)
		prepare(w, 0);
	for (int i = 0; i < s->nactions; i++) {
		const planrt_action_t *a = &s->actions[i];
		if (a->kind == PLANRT_FORWARD && w->deferred) {
			size_t at = (size_t)a->slot * (size_t)s->nreqs;
			drain(w, w->reqs + at, s->nreqs, w->own + at);
		}
		if (i + 1 < s->nactions)
			prepare(w, i + 1);
		point_at(w, a);
		planrt_where_(w->ctx->step, a->kind == PLANRT_FORWARD ? "forward" : "backward", (int)a->micro, a->chunk);
		trace_action("", a);
		(a->kind == PLANRT_FORWARD ? s->forward : s->backward)[a->chunk](w->ctx);
		planrt_trace_end_(NULL);
	}
	drain(w, w->reqs, s->nslots * s->nreqs, NULL);
	planrt_clear_action_(w->ctx);
}

/* --eval-every: the mean loss of batches held-out batches, each run through the forward actions
 * of the schedule (no backward: dropout off, gradient receives not posted) between eval_begin and
 * eval_end, which leaves its loss (and a classification's accuracy) reduced on every rank; the
 * batches are the same size, so the accuracy over all is their mean. Touches no state the next
 * step reads. */
double planrt_evaluate_(walker_t *w, const planrt_stage_t *stage, planrt_ctx_t *ctx, int64_t batches, int64_t step,
			double *accuracy)
{
	double sum = 0, correct = 0;
	planrt_evaluating_ = 1;
	forward_only_chunks = stage->nchunks > 0 ? stage->nchunks : 1;
	for (int64_t b = 0; b < batches; b++) {
		ctx->eval_batch = b;
		planrt_clear_action_(ctx);
		planrt_where_(step, "evaluation", -1, -1);
		planrt_trace_phase_("evaluation batch", step);
		if (stage->eval_begin)
			stage->eval_begin(ctx);
		planrt_walk_(w);
		if (stage->eval_end)
			stage->eval_end(ctx);
		planrt_trace_end_(NULL);
		sum += stage->eval_loss && *stage->eval_loss ? **stage->eval_loss : NAN;
		correct += stage->eval_accuracy && *stage->eval_accuracy ? **stage->eval_accuracy : NAN;
	}
	*accuracy = correct / (double)batches;
	ctx->eval_batch = -1;
	planrt_evaluating_ = 0;
	forward_only_chunks = 0;
	planrt_clear_action_(ctx);
	return sum / (double)batches;
}

/* The stage with its forward actions only (evaluation), built once. */
planrt_stage_t planrt_forward_stage_(const planrt_stage_t *s)
{
	planrt_stage_t f = *s;
	planrt_action_t *acts = calloc((size_t)(s->nactions ? s->nactions : 1), sizeof *acts);
	if (!acts)
		planrt_fatal("out of memory");
	int n = 0;
	for (int i = 0; i < s->nactions; i++)
		if (s->actions[i].kind == PLANRT_FORWARD)
			acts[n++] = s->actions[i];
	f.actions = acts;
	f.nactions = n;
	return f;
}
