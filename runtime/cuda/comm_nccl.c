/* comm_nccl.c: the NCCL comm layer. planrt's collectives and point-to-point calls
 * (planrt_allreduce ... planrt_recv_tagged, planrt.h) on a device stream come here: comm_mpi.c
 * checks and counts them as it does its own, and this layer enqueues them on the stream with
 * NCCL. MPI is used only to bootstrap.
 *
 * Communicators. When the mesh starts (planrt_device_start), rank 0 makes an NCCL unique id and
 * MPI broadcasts it; every rank joins the world communicator, which ncclCommSplit splits into one
 * communicator per mesh axis (the ranks of the planrt axis communicator, in its order). A
 * tied-parameter pair (planrt_make_pair_comm) gets one split from the world when the program makes
 * it. A communicator of one member needs no NCCL: its collectives are copies. With one rank in
 * the world NCCL is never initialised.
 *
 * Pipeline channels. MPI matches point-to-point messages per (peer, tag), so each pipeline channel
 * (the tag) is a FIFO of its own. NCCL runs the operations of one communicator in the order they
 * were enqueued, whichever stream they are on, so the pipe axis gets a communicator per channel,
 * and per channel one per sender parity (an even sender, an odd one, and the last stage wrapping
 * to stage 0 when the stage count is odd): on each of them a rank only sends or only receives, so
 * a receive posted ahead never holds up a send. The role axis of a `sync async` plan gets one
 * communicator per tag the same way (parameter versions, master to workers; gradients, workers to
 * master): a worker's receive of the next version, posted ahead, never holds up its gradient.
 *
 * Watchdog. Every enqueued operation records an event; a thread polls the oldest pending ones and
 * every communicator's ncclCommGetAsyncError. When an operation has been pending longer than
 * PLANRT_WATCHDOG seconds (default 300, 0 off) or NCCL reports an asynchronous error, it prints
 * the rank, the operation (kind, count, dtype, communicator, its call number there, how long) and
 * the error, aborts every communicator (ncclCommAbort) and ends the process, so that the launcher
 * ends the job. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "planrt.h"
#include "planrt_cuda_internal.h"
#include "planrt_program.h"

enum { MAX_COMMS = 80, MAX_CHANNELS = 16, RING = 1024 };

typedef struct entry {
	planrt_comm_t comm;
	ncclComm_t nccl;                      /* NULL: one member */
	ncclComm_t chan[MAX_CHANNELS][3];     /* the pipe axis's channel communicators */
	int nchan, ncolors;
} entry_t;

static entry_t table[MAX_COMMS];
static int ntable;
static ncclComm_t world;
static int world_rank;

static const char *const kind_text[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
					 "broadcast", "send", "recv"};
static const char *const dtype_text[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

static void nccl_check(ncclResult_t r, const char *what)
{
	if (r != ncclSuccess && r != ncclInProgress)
		planrt_fatal("NCCL %s failed: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));
}

/* ------------------------------------------------------------------ the watchdog */

typedef struct pending {
	cudaEvent_t ev;
	double start;
	char what[160];
} pending_t;

static pending_t ring[RING];
static int ring_head, ring_len;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static double watchdog_s = 300;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void abort_all(const char *cause)
{
	fprintf(stderr, "planrt: rank %d: NCCL watchdog: %s; aborting the NCCL communicators (PLANRT_WATCHDOG=%g)\n",
		world_rank, cause, watchdog_s);
	fflush(stderr);
	for (int i = 0; i < ntable; i++) {
		if (table[i].nccl)
			ncclCommAbort(table[i].nccl);
		for (int c = 0; c < table[i].nchan; c++)
			for (int k = 0; k < table[i].ncolors; k++)
				if (table[i].chan[c][k])
					ncclCommAbort(table[i].chan[c][k]);
	}
	if (world)
		ncclCommAbort(world);
	_exit(1);
}

static void *watchdog_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
		char cause[320] = "";
		pthread_mutex_lock(&ring_lock);
		while (ring_len > 0) {
			pending_t *p = &ring[ring_head];
			if (cudaEventQuery(p->ev) != cudaSuccess) {
				double waited = now() - p->start;
				if (watchdog_s > 0 && waited > watchdog_s)
					snprintf(cause, sizeof cause, "%s pending for %.0f s", p->what, waited);
				break;
			}
			ring_head = (ring_head + 1) % RING;
			ring_len--;
		}
		char oldest[160] = "";
		if (ring_len > 0)
			snprintf(oldest, sizeof oldest, "%s", ring[ring_head].what);
		pthread_mutex_unlock(&ring_lock);
		for (int i = 0; i < ntable && !cause[0]; i++) {
			ncclResult_t async = ncclSuccess;
			if (table[i].nccl && ncclCommGetAsyncError(table[i].nccl, &async) == ncclSuccess && async != ncclSuccess &&
			    async != ncclInProgress)
				snprintf(cause, sizeof cause, "%s on %s: %s%s%s", ncclGetErrorString(async), table[i].comm->name,
					 ncclGetLastError(NULL), oldest[0] ? "; pending: " : "", oldest);
		}
		if (cause[0])
			abort_all(cause);
	}
	return NULL;
}

/* an operation just enqueued on stream, for the watchdog */
static void record(cudaStream_t stream, const char *what)
{
	pthread_mutex_lock(&ring_lock);
	if (ring_len == RING) { /* the oldest must be done by now or the watchdog would have fired */
		pending_t *p = &ring[ring_head];
		pthread_mutex_unlock(&ring_lock);
		cudaEventSynchronize(p->ev);
		pthread_mutex_lock(&ring_lock);
		ring_head = (ring_head + 1) % RING;
		ring_len--;
	}
	pending_t *p = &ring[(ring_head + ring_len) % RING];
	if (!p->ev)
		planrt_cu_check_(cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming), "cudaEventCreate");
	planrt_cu_check_(cudaEventRecord(p->ev, stream), "cudaEventRecord");
	p->start = now();
	snprintf(p->what, sizeof p->what, "%s", what);
	ring_len++;
	pthread_mutex_unlock(&ring_lock);
}

/* ------------------------------------------------------------------ communicators */

static entry_t *entry_of(planrt_comm_t c)
{
	for (int i = 0; i < ntable; i++)
		if (table[i].comm == c)
			return &table[i];
	return NULL;
}

static entry_t *add_entry(planrt_comm_t c)
{
	if (ntable == MAX_COMMS)
		planrt_fatal("internal error: more than %d NCCL communicators", MAX_COMMS);
	entry_t *e = &table[ntable++];
	memset(e, 0, sizeof *e);
	e->comm = c;
	return e;
}

/* the NCCL split of the world for the planrt communicator c (collective over the world: every rank
 * calls it, members with c, the others with NULL) */
static ncclComm_t split_world(planrt_comm_t c)
{
	int color = NCCL_SPLIT_NOCOLOR, key = 0;
	if (c) {
		int mine = world_rank, lowest = world_rank;
		MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, c->comm);
		color = lowest;
		key = planrt_comm_rank(c);
	}
	ncclComm_t out = NULL;
	nccl_check(ncclCommSplit(world, color, key, &out, NULL), "ncclCommSplit");
	return out;
}

static const planrt_comm_layer_t nccl_layer;

void planrt_nccl_start_(void)
{
	planrt_comm_t w = planrt_world_comm();
	int size = planrt_comm_size(w);
	world_rank = planrt_comm_rank(w);
	const char *s = getenv("PLANRT_WATCHDOG");
	if (s && *s)
		watchdog_s = atof(s);
	planrt_comm_layer_set_(&nccl_layer);
	const planrt_program_t *prog = planrt_cu_program_();
	for (int a = 0; prog && a < prog->naxes; a++)
		add_entry(planrt_axis_comm(a));
	add_entry(w);
	if (size == 1)
		return; /* every communicator has one member: no NCCL */
	ncclUniqueId id;
	if (world_rank == 0)
		nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
	if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, w->comm) != MPI_SUCCESS)
		planrt_fatal("broadcasting the NCCL id over MPI failed");
	nccl_check(ncclCommInitRank(&world, size, id, world_rank), "ncclCommInitRank (the world)");
	entry_of(w)->nccl = world;
	for (int a = 0; prog && a < prog->naxes; a++) {
		entry_t *e = entry_of(planrt_axis_comm(a));
		ncclComm_t n = split_world(e->comm);
		e->nccl = planrt_comm_size(e->comm) > 1 ? n : NULL;
		if (n && !e->nccl)
			ncclCommDestroy(n);
	}
	/* the pipe axis's channels: 2 directions x the most model chunks of a stage */
	if (prog && prog->pipe_axis >= 0) {
		entry_t *e = entry_of(planrt_axis_comm(prog->pipe_axis));
		int chunks = 1, nroles = prog->nroles > 1 ? prog->nroles : 1;
		for (int i = 0; i < prog->nstages * nroles; i++)
			chunks = prog->stages[i].nchunks > chunks ? prog->stages[i].nchunks : chunks;
		int stages = planrt_comm_size(e->comm);
		if (e->nccl && 2 * chunks <= MAX_CHANNELS) {
			e->nchan = 2 * chunks;
			e->ncolors = stages % 2 ? 3 : 2;
			for (int c = 0; c < e->nchan; c++)
				for (int k = 0; k < e->ncolors; k++)
					nccl_check(ncclCommSplit(e->nccl, 0, planrt_comm_rank(e->comm), &e->chan[c][k], NULL),
						   "ncclCommSplit (a pipeline channel)");
		}
	}
	/* async: the role axis's two tags (sync.c's TAG_PARAMS and TAG_GRADS) */
	if (prog && prog->nroles == 2 && prog->role_axis >= 0) {
		entry_t *e = entry_of(planrt_axis_comm(prog->role_axis));
		if (e->nccl && !e->nchan) {
			e->nchan = 2;
			e->ncolors = 1;
			for (int c = 0; c < e->nchan; c++)
				nccl_check(ncclCommSplit(e->nccl, 0, planrt_comm_rank(e->comm), &e->chan[c][0], NULL),
					   "ncclCommSplit (an async tag)");
		}
	}
	pthread_t t;
	if (pthread_create(&t, NULL, watchdog_main, NULL) != 0)
		planrt_fatal("cannot start the NCCL watchdog thread");
	pthread_detach(t);
}

void planrt_nccl_pair_(int axis, int a, int b, planrt_comm_t mpi_pair)
{
	(void)axis;
	(void)a;
	(void)b;
	if (!world)
		return;
	ncclComm_t n = split_world(mpi_pair);
	if (!mpi_pair)
		return;
	entry_t *e = add_entry(mpi_pair);
	e->nccl = planrt_comm_size(mpi_pair) > 1 ? n : NULL;
}

/* ------------------------------------------------------------------ operations */

static ncclDataType_t nccl_type(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return ncclFloat32;
	case planrt_bf16: return ncclBfloat16;
	case planrt_f16: return ncclFloat16;
	case planrt_i32: return ncclInt32;
	case planrt_u8: return ncclUint8;
	case planrt_f64: return ncclFloat64;
	}
	return ncclFloat32;
}

/* the channel communicator a point-to-point message uses: the sender's parity on its channel */
static ncclComm_t channel_comm(const entry_t *e, int tag, int sender)
{
	if (!e->nchan || tag < 0 || tag >= e->nchan)
		return e->nccl;
	if (e->ncolors == 1) /* an async tag: one direction only */
		return e->chan[tag][0];
	int stages = planrt_comm_size(e->comm);
	int color = stages % 2 && sender == stages - 1 ? 2 : sender % 2;
	return e->chan[tag][color];
}

typedef struct device_req {
	cudaEvent_t ev;
} device_req_t;

static planrt_result_t req_wait(void *impl)
{
	device_req_t *r = impl;
	cudaError_t e = cudaStreamWaitEvent(planrt_cu_stream_(0), r->ev, 0);
	cudaEventDestroy(r->ev);
	free(r);
	return e == cudaSuccess ? planrt_success
				: planrt_error_(planrt_system_error, "waiting for a device request: %s", cudaGetErrorString(e));
}

static planrt_result_t req_test(void *impl, int *done)
{
	device_req_t *r = impl;
	cudaError_t e = cudaEventQuery(r->ev);
	*done = e == cudaSuccess;
	return e == cudaSuccess || e == cudaErrorNotReady
		       ? planrt_success
		       : planrt_error_(planrt_system_error, "testing a device request: %s", cudaGetErrorString(e));
}

static const planrt_request_ops_t req_ops = {req_wait, req_test};

planrt_request_t planrt_cu_request_(cudaStream_t stream, const char *what)
{
	(void)what;
	device_req_t *r = calloc(1, sizeof *r);
	if (!r)
		planrt_fatal("out of memory for a device request");
	planrt_cu_check_(cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming), "cudaEventCreate");
	planrt_cu_check_(cudaEventRecord(r->ev, stream), "cudaEventRecord");
	return planrt_request_external_(r, &req_ops);
}

static planrt_result_t nccl_run(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				planrt_op_t op, int peer, int tag, planrt_comm_t c, planrt_stream_t stream_handle,
				planrt_request_t *req)
{
	cudaStream_t stream = (cudaStream_t)stream_handle;
	entry_t *e = entry_of(c);
	if (!e)
		return planrt_error_(planrt_invalid_usage, "%s on a communicator the NCCL layer does not know",
				     kind_text[kind]);
	size_t es = planrt_dtype_size(t), n = (size_t)planrt_comm_size(c);
	char what[160];
	snprintf(what, sizeof what, "%s #%llu of %zu %s on %s (member %d of %zu)", kind_text[kind],
		 (unsigned long long)c->ncalls + 1, count, dtype_text[t], c->name, planrt_comm_rank(c), n);
	if (!e->nccl) { /* one member: a copy */
		if (kind == planrt_coll_send || kind == planrt_coll_recv)
			return planrt_error_(planrt_invalid_argument, "%s to itself on %s", kind_text[kind], c->name);
		if (recv != send && count)
			planrt_cu_check_(cudaMemcpyAsync(recv, send, count * es, cudaMemcpyDeviceToDevice, stream),
					 "cudaMemcpyAsync");
	} else {
		ncclDataType_t dt = nccl_type(t);
		ncclRedOp_t rop = op == planrt_max ? ncclMax : ncclSum;
		ncclComm_t nc = e->nccl;
		switch (kind) {
		case planrt_coll_allreduce:
			nccl_check(ncclAllReduce(send, recv, count, dt, rop, nc, stream), what);
			break;
		case planrt_coll_reduce_scatter:
			nccl_check(ncclReduceScatter(send, recv, count, dt, rop, nc, stream), what);
			break;
		case planrt_coll_allgather:
			nccl_check(ncclAllGather(send, recv, count, dt, nc, stream), what);
			break;
		case planrt_coll_alltoall:
			nccl_check(ncclGroupStart(), what);
			for (size_t p = 0; p < n; p++) {
				nccl_check(ncclSend((const char *)send + p * count * es, count, dt, (int)p, nc, stream), what);
				nccl_check(ncclRecv((char *)recv + p * count * es, count, dt, (int)p, nc, stream), what);
			}
			nccl_check(ncclGroupEnd(), what);
			break;
		case planrt_coll_broadcast:
			nccl_check(ncclBroadcast(send, recv, count, dt, peer, nc, stream), what);
			break;
		case planrt_coll_send:
			nccl_check(ncclSend(send, count, dt, peer, channel_comm(e, tag, planrt_comm_rank(c)), stream), what);
			break;
		case planrt_coll_recv:
			nccl_check(ncclRecv(recv, count, dt, peer, channel_comm(e, tag, peer), stream), what);
			break;
		default:
			return planrt_error_(planrt_invalid_argument, "unknown collective %d", (int)kind);
		}
		record(stream, what);
	}
	if (req)
		*req = planrt_cu_request_(stream, what);
	return planrt_success;
}

/* planrt_alltoallv_on: one NCCL group of a send and a receive per other member that has rows for
 * it (a zero count is no message on either side: the counts were exchanged first), and the block to
 * itself a copy on the stream */
static planrt_result_t nccl_alltoallv(const void *send, const int64_t *sc, const int64_t *sd, void *recv,
				      const int64_t *rc, const int64_t *rd, planrt_dtype_t t, planrt_comm_t c,
				      planrt_stream_t stream_handle)
{
	cudaStream_t stream = (cudaStream_t)stream_handle;
	entry_t *e = entry_of(c);
	if (!e)
		return planrt_error_(planrt_invalid_usage, "alltoallv on a communicator the NCCL layer does not know");
	size_t es = planrt_dtype_size(t);
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	if (sc[me] != rc[me])
		return planrt_error_(planrt_invalid_argument,
				     "alltoallv on %s: member %d sends itself %lld elements but receives %lld", c->name, me,
				     (long long)sc[me], (long long)rc[me]);
	long long sent = 0;
	for (int p = 0; p < n; p++)
		sent += p == me ? 0 : sc[p];
	char what[160];
	snprintf(what, sizeof what, "alltoallv #%llu of %lld %s on %s (member %d of %d)", (unsigned long long)c->ncalls + 1,
		 sent, dtype_text[t], c->name, me, n);
	if (sc[me])
		planrt_cu_check_(cudaMemcpyAsync((char *)recv + (size_t)rd[me] * es, (const char *)send + (size_t)sd[me] * es,
						 (size_t)sc[me] * es, cudaMemcpyDeviceToDevice, stream),
				 "cudaMemcpyAsync");
	if (!e->nccl)
		return planrt_success;
	ncclDataType_t dt = nccl_type(t);
	nccl_check(ncclGroupStart(), what);
	for (int p = 0; p < n; p++) {
		if (p == me)
			continue;
		if (sc[p])
			nccl_check(ncclSend((const char *)send + (size_t)sd[p] * es, (size_t)sc[p], dt, p, e->nccl, stream),
				   what);
		if (rc[p])
			nccl_check(ncclRecv((char *)recv + (size_t)rd[p] * es, (size_t)rc[p], dt, p, e->nccl, stream), what);
	}
	nccl_check(ncclGroupEnd(), what);
	record(stream, what);
	return planrt_success;
}

static const planrt_comm_layer_t nccl_layer = {"nccl", nccl_run, nccl_alltoallv};

/* ------------------------------------------------------------------ the NCCL-shaped shorthands */

planrt_result_t planrt_nccl_allreduce(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_op_t op,
				      planrt_comm_t c, cudaStream_t stream)
{
	return planrt_allreduce(send, recv, count, t, op, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, planrt_dtype_t t,
					   planrt_op_t op, planrt_comm_t c, cudaStream_t stream)
{
	return planrt_reduce_scatter(send, recv, recvcount, t, op, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_allgather(const void *send, void *recv, size_t sendcount, planrt_dtype_t t, planrt_comm_t c,
				      cudaStream_t stream)
{
	return planrt_allgather(send, recv, sendcount, t, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_alltoall(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_comm_t c,
				     cudaStream_t stream)
{
	return planrt_alltoall(send, recv, count, t, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_send(const void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream)
{
	return planrt_send(buf, count, t, peer, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_recv(void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream)
{
	return planrt_recv(buf, count, t, peer, c, (planrt_stream_t)stream, NULL);
}
