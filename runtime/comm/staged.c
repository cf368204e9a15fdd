/* staged.c: the MPI device backend. planrt's collectives and point-to-point transfers on a device
 * stream, carried out by MPI on host copies of the device buffers: what lets several ranks share
 * one GPU (NCCL refuses two ranks on a device) and a machine without NCCL run any plan, as gloo
 * serves CUDA tensors in PyTorch. comm_mpi.c checks and counts each call as it counts the NCCL
 * layer's; the device is reached only through planrt_stage_ops_t (planrt_staged.h), so this file
 * runs, and is tested, with host threads standing in for streams.
 *
 * An operation on stream s, enqueued by the program's thread:
 *   1. s copies the data this rank contributes from device memory into a staging buffer (host
 *      memory the device can reach: pinned on a GPU), then records the event `staged`;
 *   2. a gate holds s until the operation's lane has finished its MPI call;
 *   3. s copies the result from the staging buffer into device memory and records `done`;
 * and the operation goes to its lane: a host thread that, in enqueue order, waits for `staged`,
 * makes the MPI call on the lane's duplicate of the communicator (its own, so the program's MPI
 * calls on the same group never interleave with it), and raises the lane's flag, which opens the
 * gate. So s is ordered exactly as with NCCL: what came before the operation on s is in the data it
 * sends, what comes after sees the result, and the rest of the device (the compute stream, other
 * streams) runs on: the schedule's overlap is kept. A request (a started bucket, a prefetched
 * gather, a pipeline transfer) is an event recorded after step 3; its planrt_wait makes the compute
 * stream wait for it. A staging buffer is reused only after `done` has passed, so never while its
 * MPI call or its copy back may still read it.
 *
 * Lanes. A communicator's collectives run on one lane, in enqueue order, as NCCL runs a
 * communicator's operations; point-to-point messages on the channels of the NCCL layer
 * (planrt_channel_lane_: a pipeline channel by sender parity, an async tag) have a lane each, so a
 * receive posted ahead never holds up a send, exactly as the NCCL layer's channel communicators
 * arrange. The lanes' MPI calls are nonblocking ones completed by polling (a short spin, then
 * yielding, then short sleeps), beside the program's own MPI calls: the MPI library must provide
 * MPI_THREAD_MULTIPLE.
 *
 * Reductions of bf16 and f16 are summed in f32 and rounded once, as comm_mpi.c sums them, so a
 * plan's numbers over this backend are the CPU program's.
 *
 * Watchdog. A thread looks at the operations in flight; one pending longer than PLANRT_WATCHDOG
 * seconds (default 300, 0 off) is printed with its communicator, call number and what it waits
 * for (its stream to reach it, the other members in the MPI call, or the copy back), and the
 * process ends, so that the launcher ends the job. An MPI error in a lane stops the run with the
 * operation named. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"
#include "planrt_staged.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_ENTRIES = 128, STAGE_SMALL = 1 << 20 };

static const char *const kind_text[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
					 "broadcast", "send", "recv", "alltoallv"};
static const char *const dtype_text[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

typedef struct op op_t;

typedef struct lane {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	op_t *head, *tail; /* enqueued, not yet taken by the thread */
	int stop, running;
	volatile uint32_t *done; /* the last operation whose MPI call finished: the gates' flag */
	uint32_t issued;         /* operations enqueued (the program's thread) */
	MPI_Comm comm;
	int size, rank;
	float *f32; /* half-precision reductions in f32 (the lane thread's) */
	size_t f32_cap;
} lane_t;

typedef struct stage {
	struct stage *next;
	char *p;
	size_t cap;
	int busy;
} stage_t;

struct op {
	op_t *next;          /* in its lane's queue */
	op_t *next_inflight; /* in the list of operations in flight */
	lane_t *lane;
	planrt_coll_t kind;
	planrt_dtype_t t;
	planrt_op_t rop;
	size_t count; /* elements: per member for reduce-scatter, allgather and alltoall */
	int peer, tag;
	int *v;       /* alltoallv: send counts, send displacements, receive counts, receive displacements */
	stage_t *stage;
	size_t out_at; /* where the received data starts in the stage (after the sent, for all-to-all(v)) */
	size_t in_bytes; /* alltoallv: the bytes of the send buffer staged (its span) */
	uint32_t seq;
	planrt_stage_event_t staged, done;
	volatile int phase; /* 0 waiting for its stream, 1 in the MPI call, 2 copying back */
	double since;
	char what[200];
};

typedef struct entry {
	planrt_comm_t comm;
	MPI_Comm dup;
	int nchan, ncolors, nlanes;
	lane_t *lanes; /* [0]: the collectives; [1 + i]: point-to-point lane i */
} entry_t;

static struct {
	const planrt_stage_ops_t *ops;
	int started;
	pthread_mutex_t lock; /* the list in flight, the free operations and the stages */
	op_t *inflight, *free_ops;
	stage_t *stages;
	size_t host_bytes, host_peak;
	double watchdog_s;
	pthread_t watchdog;
	int watchdog_running;
	volatile int stopping;
	entry_t entries[MAX_ENTRIES];
	int nentries;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .watchdog_s = 300};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int planrt_channel_lane_(int nchan, int ncolors, int size, int tag, int sender)
{
	if (nchan <= 0 || ncolors <= 0 || tag < 0 || tag >= nchan)
		return -1;
	if (ncolors == 1)
		return tag;
	int color = size % 2 && sender == size - 1 ? 2 : sender % 2;
	return tag * ncolors + (color < ncolors ? color : ncolors - 1);
}

/* ------------------------------------------------------------------ staging buffers */

/* operations whose `done` has passed: their stages and themselves back to the free lists */
static void reclaim(void)
{
	pthread_mutex_lock(&S.lock);
	for (op_t **at = &S.inflight; *at;) {
		op_t *o = *at;
		if (!S.ops->query(o->done)) {
			at = &o->next_inflight;
			continue;
		}
		*at = o->next_inflight;
		o->stage->busy = 0;
		o->stage = NULL;
		free(o->v);
		o->v = NULL;
		o->next = S.free_ops;
		S.free_ops = o;
	}
	pthread_mutex_unlock(&S.lock);
}

static size_t stage_size(size_t bytes)
{
	if (bytes <= STAGE_SMALL) {
		size_t cap = 4096;
		while (cap < bytes)
			cap *= 2;
		return cap;
	}
	return (bytes + STAGE_SMALL - 1) / STAGE_SMALL * STAGE_SMALL;
}

/* the oldest operation in flight, waited for by the host (when host memory for staging runs out) */
static int wait_oldest(void)
{
	pthread_mutex_lock(&S.lock);
	op_t *o = S.inflight;
	while (o && o->next_inflight)
		o = o->next_inflight;
	planrt_stage_event_t e = o ? o->done : NULL;
	pthread_mutex_unlock(&S.lock);
	if (e)
		S.ops->host_wait(e);
	return e != NULL;
}

static stage_t *stage_get(size_t bytes)
{
	for (;;) {
		reclaim();
		pthread_mutex_lock(&S.lock);
		stage_t *best = NULL;
		for (stage_t *g = S.stages; g; g = g->next)
			if (!g->busy && g->cap >= bytes && (!best || g->cap < best->cap))
				best = g;
		if (best) {
			best->busy = 1;
			pthread_mutex_unlock(&S.lock);
			return best;
		}
		pthread_mutex_unlock(&S.lock);
		size_t cap = stage_size(bytes);
		stage_t *g = calloc(1, sizeof *g);
		char *p = g ? S.ops->host_alloc(cap) : NULL;
		if (p) {
			g->p = p;
			g->cap = cap;
			g->busy = 1;
			pthread_mutex_lock(&S.lock);
			g->next = S.stages;
			S.stages = g;
			S.host_bytes += cap;
			if (S.host_bytes > S.host_peak)
				S.host_peak = S.host_bytes;
			pthread_mutex_unlock(&S.lock);
			return g;
		}
		free(g);
		if (!wait_oldest()) /* nothing in flight to give memory back: there is none */
			planrt_fatal("MPI device backend: no host memory for a staging buffer of %zu bytes (%s)", cap,
				     S.ops->name);
	}
}

/* ------------------------------------------------------------------ the lanes */

void planrt_poll_backoff_(unsigned *spins)
{
	++*spins;
	if (*spins < 64)
		return;
	if (*spins < 4000) {
		sched_yield();
		return;
	}
	struct timespec ts = {0, *spins < 40000 ? 20000 : 50000};
	nanosleep(&ts, NULL);
}

static float *lane_f32(lane_t *L, size_t n)
{
	if (L->f32_cap < n) {
		free(L->f32);
		L->f32 = malloc(n * sizeof(float));
		L->f32_cap = L->f32 ? n : 0;
		if (!L->f32)
			planrt_fatal("MPI device backend: out of memory for %zu f32 values of a half-precision reduction", n);
	}
	return L->f32;
}

static int is_half(planrt_dtype_t t)
{
	return t == planrt_bf16 || t == planrt_f16;
}

/* starts o's MPI call on the stage (the lane's thread) */
static int mpi_start(lane_t *L, op_t *o, MPI_Request *q)
{
	char *in = o->stage->p, *out = in + o->out_at;
	MPI_Datatype dt = planrt_mpi_type_(o->t);
	MPI_Op mop = o->rop == planrt_max ? MPI_MAX : MPI_SUM;
	int cnt = (int)o->count, n = L->size;
	switch (o->kind) {
	case planrt_coll_allreduce:
	case planrt_coll_reduce_scatter: {
		int scatter = o->kind == planrt_coll_reduce_scatter;
		size_t all = scatter ? o->count * (size_t)n : o->count;
		void *buf = in;
		if (is_half(o->t)) { /* summed in f32, rounded once (comm_mpi.c's rule) */
			buf = lane_f32(L, all);
			planrt_halves_to_f32_((const uint16_t *)in, buf, all, o->t);
			dt = MPI_FLOAT;
		}
		return scatter ? MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, cnt, dt, mop, L->comm, q)
			       : MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, dt, mop, L->comm, q);
	}
	case planrt_coll_allgather:
		return MPI_Iallgather(MPI_IN_PLACE, cnt, dt, in, cnt, dt, L->comm, q);
	case planrt_coll_alltoall:
		return MPI_Ialltoall(in, cnt, dt, out, cnt, dt, L->comm, q);
	case planrt_coll_broadcast:
		return MPI_Ibcast(in, cnt, dt, o->peer, L->comm, q);
	case planrt_coll_send:
		return MPI_Isend(in, cnt, dt, o->peer, o->tag, L->comm, q);
	case planrt_coll_recv:
		return MPI_Irecv(in, cnt, dt, o->peer, o->tag, L->comm, q);
	case planrt_coll_alltoallv:
		return MPI_Ialltoallv(in, o->v, o->v + n, dt, out, o->v + 2 * n, o->v + 3 * n, dt, L->comm, q);
	case planrt_coll_kinds:
		break;
	}
	return MPI_ERR_OTHER;
}

static void mpi_failed(const op_t *o, int rc)
{
	char text[MPI_MAX_ERROR_STRING];
	int len = 0;
	MPI_Error_string(rc, text, &len);
	planrt_fatal("MPI device backend: %s failed: %s", o->what, text);
}

/* o's MPI call, start to finish, then the half-precision result back into the stage */
static void lane_run(lane_t *L, op_t *o)
{
	MPI_Request q = MPI_REQUEST_NULL;
	int rc = mpi_start(L, o, &q);
	if (rc != MPI_SUCCESS)
		mpi_failed(o, rc);
	for (unsigned spins = 0;; planrt_poll_backoff_(&spins)) {
		int flag = 0;
		rc = MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS)
			mpi_failed(o, rc);
		if (flag)
			break;
	}
	if (is_half(o->t) && (o->kind == planrt_coll_allreduce || o->kind == planrt_coll_reduce_scatter))
		planrt_f32_to_halves_(L->f32, (uint16_t *)o->stage->p, o->count, o->t);
}

static void *lane_main(void *arg)
{
	lane_t *L = arg;
	if (S.ops->thread_start)
		S.ops->thread_start();
	for (;;) {
		pthread_mutex_lock(&L->lock);
		while (!L->head && !L->stop)
			pthread_cond_wait(&L->wake, &L->lock);
		op_t *o = L->head;
		if (o) {
			L->head = o->next;
			if (!L->head)
				L->tail = NULL;
		}
		pthread_mutex_unlock(&L->lock);
		if (!o)
			return NULL; /* stopped, and nothing left */
		S.ops->host_wait(o->staged); /* the data to send is in the stage */
		o->phase = 1;
		lane_run(L, o);
		o->phase = 2;
		/* the last thing the lane does with o: open the gate (its stream copies the result back) */
		__atomic_store_n(L->done, o->seq, __ATOMIC_RELEASE);
	}
}

static planrt_result_t lane_init(lane_t *L, planrt_comm_t c, MPI_Comm dup)
{
	memset(L, 0, sizeof *L);
	pthread_mutex_init(&L->lock, NULL);
	pthread_cond_init(&L->wake, NULL);
	L->done = S.ops->host_alloc(64);
	if (!L->done)
		return planrt_error_(planrt_system_error, "MPI device backend: no host memory for a lane's flag");
	*L->done = 0;
	L->comm = dup;
	L->size = c->size;
	L->rank = c->rank;
	if (pthread_create(&L->thread, NULL, lane_main, L) != 0)
		return planrt_error_(planrt_system_error, "MPI device backend: cannot start a lane thread for %s", c->name);
	L->running = 1;
	return planrt_success;
}

static void lane_push(lane_t *L, op_t *o)
{
	o->next = NULL;
	pthread_mutex_lock(&L->lock);
	if (L->tail)
		L->tail->next = o;
	else
		L->head = o;
	L->tail = o;
	pthread_cond_signal(&L->wake);
	pthread_mutex_unlock(&L->lock);
}

static void lane_end(lane_t *L)
{
	if (L->running) {
		pthread_mutex_lock(&L->lock);
		L->stop = 1;
		pthread_cond_signal(&L->wake);
		pthread_mutex_unlock(&L->lock);
		pthread_join(L->thread, NULL);
	}
	if (L->done)
		S.ops->host_free((void *)L->done);
	free(L->f32);
	pthread_mutex_destroy(&L->lock);
	pthread_cond_destroy(&L->wake);
}

/* ------------------------------------------------------------------ the watchdog */

static void *watchdog_main(void *arg)
{
	(void)arg;
	while (!S.stopping) {
		double step = S.watchdog_s / 10 < 0.2 ? S.watchdog_s / 10 : 0.2;
		struct timespec ts = {0, (long)(step * 1e9)};
		nanosleep(&ts, NULL);
		char what[sizeof ((op_t *)0)->what] = "";
		double waited = 0;
		int phase = 0;
		pthread_mutex_lock(&S.lock);
		for (op_t *o = S.inflight; o; o = o->next_inflight) {
			double t = now_s() - o->since;
			if (t > S.watchdog_s && t > waited && !S.ops->query(o->done)) {
				waited = t;
				phase = o->phase;
				snprintf(what, sizeof what, "%s", o->what);
			}
		}
		pthread_mutex_unlock(&S.lock);
		if (!what[0])
			continue;
		static const char *const phase_text[] = {
			"its stream has not reached it (the data to send is not ready)",
			"in the MPI call (waiting for the other members)", "copying the result back to the device"};
		fprintf(stderr,
			"planrt: rank %d: watchdog: %s still pending after %g s, %s; another rank has stalled, died or called "
			"its collectives in a different order (PLANRT_WATCHDOG=seconds changes the limit, 0 turns it off)\n",
			planrt_world_rank_(), what, S.watchdog_s, phase_text[phase]);
		fflush(stderr);
		_exit(1); /* the launcher then ends the other ranks */
	}
	return NULL;
}

/* ------------------------------------------------------------------ start, communicators, end */

planrt_result_t planrt_staged_start_(const planrt_stage_ops_t *ops)
{
	if (S.started)
		return planrt_error_(planrt_invalid_usage, "the MPI device backend is already started");
	int provided = MPI_THREAD_SINGLE;
	MPI_Query_thread(&provided);
	if (provided < MPI_THREAD_MULTIPLE)
		return planrt_error_(planrt_system_error,
				     "the MPI device backend needs MPI_THREAD_MULTIPLE, which this MPI library does not "
				     "provide (level %d); use an MPI built with threads (Open MPI's and MPICH's are), or one "
				     "rank per GPU with PLANRT_COMM=nccl",
				     provided);
	const char *s = getenv("PLANRT_WATCHDOG");
	if (s && *s) {
		char *end;
		double v = strtod(s, &end);
		if (!*end && v >= 0 && isfinite(v))
			S.watchdog_s = v;
	}
	S.ops = ops;
	S.stopping = 0;
	S.started = 1;
	if (S.watchdog_s > 0) {
		if (pthread_create(&S.watchdog, NULL, watchdog_main, NULL) != 0)
			return planrt_error_(planrt_system_error, "MPI device backend: cannot start its watchdog thread");
		S.watchdog_running = 1;
	}
	return planrt_success;
}

static entry_t *entry_of(planrt_comm_t c)
{
	for (int i = 0; i < S.nentries; i++)
		if (S.entries[i].comm == c)
			return &S.entries[i];
	return NULL;
}

int planrt_staged_has_(planrt_comm_t c)
{
	return c && entry_of(c) != NULL;
}

planrt_result_t planrt_staged_add_(planrt_comm_t c, int nchan, int ncolors)
{
	if (!S.started)
		return planrt_error_(planrt_invalid_usage, "planrt_staged_add_ before planrt_staged_start_");
	if (!c || entry_of(c))
		return planrt_success;
	if (S.nentries == MAX_ENTRIES)
		return planrt_error_(planrt_internal_error, "more than %d communicators on the MPI device backend", MAX_ENTRIES);
	if (nchan < 0 || ncolors < 0 || (nchan > 0 && ncolors < 1) || nchan > 64 || ncolors > 3)
		return planrt_error_(planrt_invalid_argument, "MPI device backend: %d channels of %d colours", nchan, ncolors);
	entry_t *e = &S.entries[S.nentries];
	memset(e, 0, sizeof *e);
	e->comm = c;
	int rc = MPI_Comm_dup(c->comm, &e->dup);
	if (rc != MPI_SUCCESS)
		return planrt_error_(planrt_system_error, "MPI device backend: MPI_Comm_dup of %s failed", c->name);
	e->nchan = nchan;
	e->ncolors = nchan ? ncolors : 0;
	e->nlanes = 1 + nchan * e->ncolors;
	e->lanes = calloc((size_t)e->nlanes, sizeof *e->lanes);
	if (!e->lanes)
		return planrt_error_(planrt_system_error, "MPI device backend: out of memory for the lanes of %s", c->name);
	for (int i = 0; i < e->nlanes; i++) {
		planrt_result_t r = lane_init(&e->lanes[i], c, e->dup);
		if (r != planrt_success)
			return r;
	}
	S.nentries++;
	return planrt_success;
}

void planrt_staged_stop_(void)
{
	if (!S.started)
		return;
	for (;;) { /* everything in flight finished */
		reclaim();
		pthread_mutex_lock(&S.lock);
		op_t *o = S.inflight;
		pthread_mutex_unlock(&S.lock);
		if (!o)
			break;
		S.ops->host_wait(o->done);
	}
	S.stopping = 1;
	if (S.watchdog_running)
		pthread_join(S.watchdog, NULL);
	S.watchdog_running = 0;
	for (int i = 0; i < S.nentries; i++) {
		entry_t *e = &S.entries[i];
		for (int l = 0; l < e->nlanes; l++)
			lane_end(&e->lanes[l]);
		free(e->lanes);
		MPI_Comm_free(&e->dup);
	}
	S.nentries = 0;
	while (S.free_ops) {
		op_t *o = S.free_ops;
		S.free_ops = o->next;
		S.ops->event_free(o->staged);
		S.ops->event_free(o->done);
		free(o);
	}
	while (S.stages) {
		stage_t *g = S.stages;
		S.stages = g->next;
		S.ops->host_free(g->p);
		free(g);
	}
	S.host_bytes = 0;
	S.started = 0;
}

size_t planrt_staged_host_bytes_(void)
{
	return S.host_bytes;
}

size_t planrt_staged_host_peak_(void)
{
	return S.host_peak;
}

/* ------------------------------------------------------------------ operations */

static op_t *op_new(void)
{
	pthread_mutex_lock(&S.lock);
	op_t *o = S.free_ops;
	if (o)
		S.free_ops = o->next;
	pthread_mutex_unlock(&S.lock);
	if (!o) {
		o = calloc(1, sizeof *o);
		if (!o)
			planrt_fatal("MPI device backend: out of memory for an operation");
		o->staged = S.ops->event_new();
		o->done = S.ops->event_new();
	}
	o->next = o->next_inflight = NULL;
	o->v = NULL;
	o->phase = 0;
	o->out_at = o->in_bytes = 0;
	return o;
}

typedef struct staged_req {
	planrt_stage_event_t ev;
} staged_req_t;

static planrt_result_t req_wait(void *impl)
{
	staged_req_t *r = impl;
	S.ops->stream_wait(S.ops->compute(), r->ev);
	S.ops->event_free(r->ev);
	free(r);
	return planrt_success;
}

static planrt_result_t req_test(void *impl, int *done)
{
	staged_req_t *r = impl;
	*done = S.ops->query(r->ev);
	return planrt_success;
}

static const planrt_request_ops_t req_ops = {req_wait, req_test};

static void put(void *host, const void *dev, size_t bytes, planrt_stream_t s)
{
	if (bytes)
		S.ops->to_host(host, dev, bytes, s);
}

static void get(void *dev, const void *host, size_t bytes, planrt_stream_t s)
{
	if (bytes)
		S.ops->to_device(dev, host, bytes, s);
}

/* step 1: this rank's data into the stage */
static void stage_in(const op_t *o, const void *send, planrt_stream_t s)
{
	size_t es = planrt_dtype_size(o->t), n = (size_t)o->lane->size, me = (size_t)o->lane->rank;
	char *g = o->stage->p;
	switch (o->kind) {
	case planrt_coll_allreduce: put(g, send, o->count * es, s); break;
	case planrt_coll_reduce_scatter:
	case planrt_coll_alltoall: put(g, send, n * o->count * es, s); break;
	case planrt_coll_allgather: put(g + me * o->count * es, send, o->count * es, s); break;
	case planrt_coll_broadcast:
		if ((int)me == o->peer)
			put(g, send, o->count * es, s);
		break;
	case planrt_coll_send: put(g, send, o->count * es, s); break;
	case planrt_coll_alltoallv: put(g, send, o->in_bytes, s); break;
	default: break;
	}
}

/* step 3: the result out of the stage */
static void stage_out(const op_t *o, void *recv, planrt_stream_t s)
{
	size_t es = planrt_dtype_size(o->t), n = (size_t)o->lane->size, me = (size_t)o->lane->rank;
	const char *g = o->stage->p, *out = g + o->out_at;
	switch (o->kind) {
	case planrt_coll_allreduce:
	case planrt_coll_reduce_scatter:
	case planrt_coll_recv: get(recv, g, o->count * es, s); break;
	case planrt_coll_allgather: get(recv, g, n * o->count * es, s); break;
	case planrt_coll_alltoall: get(recv, out, n * o->count * es, s); break;
	case planrt_coll_broadcast:
		if ((int)me != o->peer)
			get(recv, g, o->count * es, s);
		break;
	case planrt_coll_alltoallv:
		for (size_t p = 0; p < n; p++) /* block by block: the gaps between them are not ours */
			get((char *)recv + (size_t)o->v[3 * n + p] * es, out + (size_t)o->v[3 * n + p] * es,
			    (size_t)o->v[2 * n + p] * es, s);
		break;
	default: break;
	}
}

/* steps 1 to 3 on stream s, and o to its lane */
static void enqueue(op_t *o, const void *send, void *recv, planrt_stream_t s, planrt_request_t *req)
{
	const planrt_stage_ops_t *ops = S.ops;
	lane_t *L = o->lane;
	stage_in(o, send, s);
	ops->record(o->staged, s);
	o->seq = ++L->issued;
	ops->gate(s, L->done, o->seq);
	stage_out(o, recv, s);
	ops->record(o->done, s);
	o->since = now_s();
	pthread_mutex_lock(&S.lock);
	o->next_inflight = S.inflight;
	S.inflight = o;
	pthread_mutex_unlock(&S.lock);
	lane_push(L, o);
	if (req) {
		staged_req_t *r = calloc(1, sizeof *r);
		if (!r)
			planrt_fatal("MPI device backend: out of memory for a request");
		r->ev = ops->event_new();
		ops->record(r->ev, s);
		*req = planrt_request_external_(r, &req_ops);
	}
}

/* the bytes of host memory o needs: what it sends, then (out_at on) what it receives */
static planrt_result_t sizes(op_t *o, size_t n, size_t *bytes)
{
	size_t es = planrt_dtype_size(o->t), per = o->count;
	if (o->kind == planrt_coll_reduce_scatter || o->kind == planrt_coll_allgather || o->kind == planrt_coll_alltoall) {
		if (per > SIZE_MAX / n / es / 2)
			return planrt_error_(planrt_invalid_argument, "%s of %zu elements per member overflows", kind_text[o->kind],
					     per);
		per *= n;
	}
	*bytes = per * es;
	if (o->kind == planrt_coll_alltoall) {
		o->out_at = (*bytes + 63) / 64 * 64;
		*bytes = o->out_at + per * es;
	}
	return planrt_success;
}

static lane_t *lane_for(entry_t *e, planrt_coll_t kind, int tag, int peer)
{
	if (kind != planrt_coll_send && kind != planrt_coll_recv)
		return &e->lanes[0];
	int sender = kind == planrt_coll_send ? e->comm->rank : peer;
	int l = planrt_channel_lane_(e->nchan, e->ncolors, e->comm->size, tag, sender);
	return &e->lanes[l < 0 ? 0 : 1 + l];
}

static void describe(op_t *o, planrt_comm_t c, size_t count)
{
	int len = snprintf(o->what, sizeof o->what, "%s #%llu of %zu %s", kind_text[o->kind],
			   (unsigned long long)c->ncalls + 1, count, dtype_text[o->t]);
	if (len > 0 && (size_t)len < sizeof o->what && (o->kind == planrt_coll_send || o->kind == planrt_coll_recv))
		len += snprintf(o->what + len, sizeof o->what - (size_t)len, " %s member %d tag %d",
				o->kind == planrt_coll_send ? "to" : "from", o->peer, o->tag);
	if (len > 0 && (size_t)len < sizeof o->what)
		snprintf(o->what + len, sizeof o->what - (size_t)len, " on %s (member %d of %d, MPI device backend)", c->name,
			 c->rank, c->size);
}

planrt_result_t planrt_staged_run_(planrt_coll_t kind, const void *sendbuf, void *recvbuf, size_t count,
				   planrt_dtype_t t, planrt_op_t rop, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req)
{
	if (req)
		*req = NULL;
	entry_t *e = c ? entry_of(c) : NULL;
	if (!e)
		return planrt_error_(planrt_invalid_usage, "%s on a communicator the MPI device backend does not know",
				     (unsigned)kind < planrt_coll_kinds ? kind_text[kind] : "?");
	if ((unsigned)kind >= planrt_coll_alltoallv)
		return planrt_error_(planrt_invalid_argument, "unknown collective %d", (int)kind);
	if ((kind == planrt_coll_send || kind == planrt_coll_recv) && peer == c->rank)
		return planrt_error_(planrt_invalid_argument, "%s to itself on %s", kind_text[kind], c->name);
	if (count > INT_MAX)
		return planrt_error_(planrt_invalid_argument,
				     "%s of %zu elements exceeds MPI's int counts (MPI device backend); split it into buckets",
				     kind_text[kind], count);
	op_t *o = op_new();
	o->kind = kind;
	o->t = t;
	o->rop = rop;
	o->count = count;
	o->peer = peer;
	o->tag = tag;
	o->lane = lane_for(e, kind, tag, peer);
	size_t bytes = 0;
	planrt_result_t r = sizes(o, (size_t)c->size, &bytes);
	if (r != planrt_success) {
		pthread_mutex_lock(&S.lock);
		o->next = S.free_ops;
		S.free_ops = o;
		pthread_mutex_unlock(&S.lock);
		return r;
	}
	describe(o, c, count);
	o->stage = stage_get(bytes);
	enqueue(o, sendbuf, recvbuf, stream, req);
	return planrt_success;
}

planrt_result_t planrt_staged_alltoallv_(const void *sendbuf, const int64_t *sc, const int64_t *sd, void *recvbuf,
					 const int64_t *rc, const int64_t *rd, planrt_dtype_t t, planrt_comm_t c,
					 planrt_stream_t stream)
{
	entry_t *e = c ? entry_of(c) : NULL;
	if (!e)
		return planrt_error_(planrt_invalid_usage, "alltoallv on a communicator the MPI device backend does not know");
	int n = c->size;
	if (sc[c->rank] != rc[c->rank])
		return planrt_error_(planrt_invalid_argument,
				     "alltoallv on %s: member %d sends itself %lld elements but receives %lld", c->name,
				     c->rank, (long long)sc[c->rank], (long long)rc[c->rank]);
	op_t *o = op_new();
	o->kind = planrt_coll_alltoallv;
	o->t = t;
	o->rop = planrt_sum;
	o->lane = &e->lanes[0];
	o->v = malloc(sizeof(int) * 4 * (size_t)n);
	if (!o->v)
		planrt_fatal("MPI device backend: out of memory for an alltoallv's counts");
	int64_t span_in = 0, span_out = 0, sent = 0;
	for (int p = 0; p < n; p++) {
		const int64_t x[4] = {sc[p], sd[p], rc[p], rd[p]};
		for (int k = 0; k < 4; k++) {
			if (x[k] < 0 || x[k] > INT_MAX)
				planrt_fatal("MPI device backend: alltoallv on %s: a count or displacement of %lld elements is "
					     "outside MPI's int range",
					     c->name, (long long)x[k]);
			o->v[k * n + p] = (int)x[k];
		}
		span_in = sd[p] + sc[p] > span_in ? sd[p] + sc[p] : span_in;
		span_out = rd[p] + rc[p] > span_out ? rd[p] + rc[p] : span_out;
		sent += p == c->rank ? 0 : sc[p];
	}
	size_t es = planrt_dtype_size(t);
	o->count = (size_t)sent;
	o->out_at = ((size_t)span_in * es + 63) / 64 * 64;
	describe(o, c, (size_t)sent);
	o->in_bytes = (size_t)span_in * es;
	o->stage = stage_get(o->out_at + (size_t)span_out * es);
	enqueue(o, sendbuf, recvbuf, stream, NULL);
	return planrt_success;
}

const planrt_comm_layer_t planrt_staged_layer_ = {"mpi (host-staged)", planrt_staged_run_, planrt_staged_alltoallv_};
