/* comm_nccl.c: the NCCL backend of the device comm layer (comm_cuda.c chooses it for a communicator
 * whose members each have their own GPU). comm_mpi.c checks and counts every operation as it does
 * its own; this file enqueues it on its stream with NCCL. MPI is used only to bootstrap.
 *
 * Communicators. planrt_nccl_open_ makes the NCCL communicator of one planrt communicator (a mesh
 * axis group, a tied pair) from one unique id per group: member 0 makes it and MPI broadcasts it over
 * the group's own MPI communicator; ncclCommInitRank joins it. So starting costs each rank one id
 * and one NCCL initialisation per group it belongs to, whatever the world's size, and no
 * communicator spans the world. A communicator of one member is opened only when asked for (the
 * world-of-one unit test); otherwise comm_cuda.c copies for it.
 *
 * Pipeline channels. MPI matches point-to-point messages per (peer, tag), so each pipeline channel
 * (the tag) is a FIFO of its own. NCCL runs the operations of one communicator in the order they
 * were enqueued, whichever stream they are on, so a communicator with channels (the pipe axis: per
 * direction and chunk; async's role axis: per tag) gets one NCCL communicator per channel and
 * colour, split from the group's (planrt_channel_lane_ picks it: the sender's parity, so on each a
 * rank only sends or only receives, and a receive posted ahead never holds up a send).
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
#include "planrt_staged.h"

enum { MAX_COMMS = 80, MAX_CHANNELS = 16, RING = 1024 };

typedef struct entry {
	planrt_comm_t comm;
	ncclComm_t nccl;
	ncclComm_t chan[MAX_CHANNELS][3]; /* the channel communicators (planrt_channel_lane_) */
	int nchan, ncolors;
} entry_t;

static entry_t table[MAX_COMMS];
static int ntable;
static int world_rank;
static int watchdog_running;

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

int planrt_nccl_has_(planrt_comm_t c)
{
	return c && entry_of(c) != NULL;
}

static void watchdog_start(void)
{
	if (watchdog_running)
		return;
	world_rank = planrt_world_rank_();
	const char *s = getenv("PLANRT_WATCHDOG");
	if (s && *s)
		watchdog_s = atof(s);
	pthread_t t;
	if (pthread_create(&t, NULL, watchdog_main, NULL) != 0)
		planrt_fatal("cannot start the NCCL watchdog thread");
	pthread_detach(t);
	watchdog_running = 1;
}

planrt_result_t planrt_nccl_open_(planrt_comm_t c, int nchan, int ncolors)
{
	if (!c || entry_of(c))
		return planrt_success;
	if (ntable == MAX_COMMS)
		return planrt_error_(planrt_internal_error, "more than %d NCCL communicators", MAX_COMMS);
	if (nchan < 0 || ncolors < 0 || ncolors > 3)
		return planrt_error_(planrt_invalid_argument, "NCCL: %d channels of %d colours", nchan, ncolors);
	if (nchan > MAX_CHANNELS) /* more than 8 model chunks a stage: the transfers share the group's communicator */
		nchan = 0;
	ncclUniqueId id;
	memset(&id, 0, sizeof id);
	if (c->rank == 0)
		nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
	if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->comm) != MPI_SUCCESS)
		return planrt_error_(planrt_system_error, "broadcasting the NCCL id of %s over MPI failed", c->name);
	entry_t *e = &table[ntable];
	memset(e, 0, sizeof *e);
	e->comm = c;
	char what[96];
	snprintf(what, sizeof what, "ncclCommInitRank (%s, member %d of %d)", c->name, c->rank, c->size);
	nccl_check(ncclCommInitRank(&e->nccl, c->size, id, c->rank), what);
	e->nchan = nchan;
	e->ncolors = nchan ? ncolors : 0;
	for (int ch = 0; ch < e->nchan; ch++)
		for (int k = 0; k < e->ncolors; k++)
			nccl_check(ncclCommSplit(e->nccl, 0, c->rank, &e->chan[ch][k], NULL), "ncclCommSplit (a channel)");
	ntable++;
	watchdog_start();
	return planrt_success;
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

/* the channel communicator a point-to-point message uses (planrt_channel_lane_: the sender's parity
 * on its channel), else the group's */
static ncclComm_t channel_comm(const entry_t *e, int tag, int sender)
{
	int lane = planrt_channel_lane_(e->nchan, e->ncolors, planrt_comm_size(e->comm), tag, sender);
	return lane < 0 ? e->nccl : e->chan[lane / e->ncolors][lane % e->ncolors];
}

planrt_result_t planrt_nccl_run_(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				 planrt_op_t op, int peer, int tag, planrt_comm_t c, cudaStream_t stream)
{
	entry_t *e = entry_of(c);
	if (!e)
		return planrt_error_(planrt_invalid_usage, "%s on a communicator the NCCL layer does not know",
				     kind_text[kind]);
	size_t es = planrt_dtype_size(t), n = (size_t)planrt_comm_size(c);
	char what[160];
	snprintf(what, sizeof what, "%s #%llu of %zu %s on %s (member %d of %zu)", kind_text[kind],
		 (unsigned long long)c->ncalls + 1, count, dtype_text[t], c->name, planrt_comm_rank(c), n);
	{
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
	return planrt_success;
}

/* planrt_alltoallv_on: one NCCL group of a send and a receive per other member that has rows for
 * it (a zero count is no message on either side: the counts were exchanged first), and the block to
 * itself a copy on the stream */
planrt_result_t planrt_nccl_alltoallv_(const void *send, const int64_t *sc, const int64_t *sd, void *recv,
				       const int64_t *rc, const int64_t *rd, planrt_dtype_t t, planrt_comm_t c,
				       cudaStream_t stream)
{
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
