/* comm_mpi.c: collectives and point-to-point transfers over MPI, with the watchdog.
 *
 * A blocking call is MPI's blocking call, so planrt costs what plain MPI costs; a watchdog thread
 * (started on the first call, when PLANRT_WATCHDOG > 0, default 300 s) watches the blocking call
 * in progress and, if it is pending that long, prints what the rank waits for (kind, count,
 * dtype, communicator, its sequence number there) and ends the process, which makes mpirun end
 * the job: a stall becomes an error instead of a hang. The thread makes no MPI calls (MPI is
 * initialised funneled). A nonblocking operation is started with the MPI-3 call (MPI_Iallreduce,
 * ...) and completed by a polling wait (MPI_Test in a loop, yielding the core after a short
 * spin) that applies the same limit itself. When the node's ranks outnumber the cores they may
 * run on (4 ranks on a 2-core laptop or CI machine), a waiting rank looks at a counter the node's
 * ranks share (shared memory: how many of them are not in a wait). While any of them computes,
 * it sleeps between polls, 1 us doubling to 32 us: a yielding rank stays runnable and takes the
 * time slices of the rank it waits for (a pipeline stage waiting for the previous one; ranks
 * waiting for a straggler). Once every rank of the node waits, they are in the same transfers and
 * each moves only when its peers call MPI, so they yield instead: sleeping there made a 4-rank
 * data-parallel step 1.6x slower (tests/README.md, "Oversubscribed ranks sleep"). On a core of its
 * own a rank never sleeps. PLANRT_WAIT=yield (never sleep) or sleep (always, up to 256 us) overrides
 * this choice, auto (the default); bench/oversubscribed_wait.py compares the three.
 *
 * bf16 and f16 reductions accumulate in f32: the operands are converted to f32, reduced with
 * MPI_FLOAT and rounded back once, so the result is the f32 sum of the inputs rounded to the
 * half type (independent of the reduction tree's shape up to f32 rounding). That doubles the
 * bytes MPI moves for those calls; planrt_bytes_sent counts the half-precision bytes (below).
 *
 * In place: send == recv for allreduce, and recv == send + rank * recvcount (NCCL) or
 * send == recv (MPI) for reduce-scatter, send == recv + rank * sendcount (NCCL) or send == recv
 * for allgather (the block is moved to slot rank first), any overlap for alltoall (staged through
 * a copy). NCCL's in-place reduce-scatter on a member other than 0 (where recv != send) reduces
 * into the staging buffer kept between calls (below) and copies the block out at completion.
 *
 * Point-to-point messages carry a tag (planrt_send / planrt_recv: tag 0); MPI matches messages
 * between two ranks in order within one (communicator, tag).
 *
 * The counters (planrt_bytes_sent_by, planrt_calls_by, planrt_bytes_sent) count algorithm bytes,
 * the figure planc explain predicts as "wire bytes": what this rank sends with ring algorithms.
 * For one call on a communicator of n members, with es the size of the call's dtype in bytes
 * (bf16 and f16: 2, although their reductions move f32 operands) and B the bytes of the call's
 * buffer in that dtype,
 *   allreduce       B = count * es                   bytes = round(2 (n - 1) B / n)
 *   reduce-scatter  B = n * recvcount * es (input)   bytes = round((n - 1) B / n)
 *   allgather       B = n * sendcount * es (output)  bytes = round((n - 1) B / n)
 *   alltoall        B = n * count * es (input)       bytes = round((n - 1) B / n)
 *   broadcast       B = count * es                   bytes = round((n - 1) B / n), root or not
 *   send            B = count * es                   bytes = B
 *   recv                                             bytes = 0
 *   alltoallv       (variable counts per member)     bytes = the bytes sent to the other members
 * and bytes = 0 for every kind when n = 1. round(x) is llround of the exact rational x: the
 * nearest integer, halves rounded up (x >= 0), computed exactly in 64-bit integers as
 * (2 k (n - 1) B + n) / (2 n) with k = 2 for allreduce and 1 otherwise (integer division). Each
 * call's rounded figure is added, when the call has started successfully, to a 64-bit counter for
 * its kind and its communicator's group (the mesh axis index, pair or world, set where the
 * communicator is made; planrt.c), and its call counter is incremented; planrt_bytes_sent is the
 * sum of the rounded figures over every kind and group. A call refused before it starts (a bad
 * argument, a NULL communicator) or that MPI fails to start counts nothing. The counters are
 * plain integers, touched only by the thread that calls planrt (MPI is initialised funneled). */
#define _GNU_SOURCE /* sched_getaffinity */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef planrt_coll_t kind_t;
#define K_ALLREDUCE planrt_coll_allreduce
#define K_REDUCE_SCATTER planrt_coll_reduce_scatter
#define K_ALLGATHER planrt_coll_allgather
#define K_ALLTOALL planrt_coll_alltoall
#define K_BROADCAST planrt_coll_broadcast
#define K_SEND planrt_coll_send
#define K_RECV planrt_coll_recv
#define K_ALLTOALLV planrt_coll_alltoallv

static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
					 "broadcast", "send", "recv", "alltoallv"};
_Static_assert(sizeof kind_names / sizeof *kind_names == planrt_coll_kinds, "a name for every planrt_coll_t");
static const char *const dtype_names[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

struct planrt_request {
	MPI_Request mreq;
	int done; /* completed and finished (results in place) */
	/* what it is, for the watchdog */
	kind_t kind;
	size_t count;
	planrt_dtype_t dtype;
	planrt_op_t op;
	int peer; /* send / recv peer, broadcast root */
	int tag;  /* send / recv */
	const int *vcounts; /* alltoallv: send counts, send displacements, receive counts and displacements */
	planrt_comm_t comm;
	uint64_t seq;
	uint64_t rec; /* its id in the monitor's record of recent operations (0: none) */
	/* work left for completion */
	float *staged;       /* f32 operands of a half-precision reduction */
	void *staged_dst;    /* ... converted back into here */
	size_t staged_count;
	void *copy_dst;      /* then memcpy(copy_dst, copy_src, copy_bytes) */
	const void *copy_src;
	size_t copy_bytes;
	void *scratch;       /* freed at completion */
	void *pair_dst;      /* a two-member reduce-scatter: pair_dst[i] = a[i] (+ or max) b[i] of the */
	const void *pair_src; /* two blocks at pair_src (pair_exchange), before the above */
	size_t pair_count;
	int pair_f64, pair_max;
	void *ext;           /* an external request (the device comm layer's): completed by ext_ops */
	const planrt_request_ops_t *ext_ops;
	struct planrt_request *older, *newer; /* the list of started operations in flight (poke) */
	int listed;
};

static double watchdog_s = 300;
static volatile int world_size = 1; /* the monitor's copy, set once MPI is up */
static int tag_ub = 32767; /* MPI_TAG_UB, read by planrt_comm_init_ */
static __thread int mpi_thread; /* set on the thread that makes the rank's MPI calls (planrt_comm_init_) */
/* PLANRT_WAIT: what a polling wait does between polls once its short spin is over */
static enum { WAIT_AUTO, WAIT_YIELD, WAIT_SLEEP } wait_policy = WAIT_AUTO;
/* How many of the node's ranks are not in a polling wait, in memory the node's ranks share, when
 * they outnumber its cores (set by planrt_comm_init_). NULL on a node with a core per rank, or
 * where the shared page could not be made: a wait then yields, the choice that never slows a
 * transfer. */
static int *node_computing;
/* PLANRT_MPI_REDUCE_SCATTER set: a two-member reduce-scatter is MPI's call, not pair_exchange (read
 * once; every rank must see the same, as the two make different MPI calls) */
static int mpi_reduce_scatter;

/* The counters, [kind][slot]: slot 0 world, 1 pair, 2 + k mesh axis k. */
enum { GROUP_SLOTS = PLANRT_MAX_AXES_ + 2 };
static uint64_t bytes_by[planrt_coll_kinds][GROUP_SLOTS], calls_by[planrt_coll_kinds][GROUP_SLOTS];

/* A counter every rank of `node` maps, set to `value`: local rank 0 makes a POSIX shared memory
 * object under a name no other job uses (O_EXCL), the others map it by the name it broadcasts,
 * and once all have it is unlinked, so nothing is left behind however the job ends. NULL on every
 * rank if any rank could not map it. */
static int *share_counter(MPI_Comm node, int value)
{
	int me = 0, ok = 1, all_ok = 0;
	MPI_Comm_rank(node, &me);
	char name[64] = "";
	int fd = -1;
	if (me == 0) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		snprintf(name, sizeof name, "/planrt-busy-%ld-%ld", (long)getpid(), (long)now.tv_nsec);
		fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)sysconf(_SC_PAGESIZE)) != 0)
			name[0] = '\0';
	}
	MPI_Bcast(name, (int)sizeof name, MPI_BYTE, 0, node);
	if (me != 0 && name[0])
		fd = shm_open(name, O_RDWR, 0600);
	int *counter = NULL;
	if (fd >= 0) {
		void *p = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		counter = p == MAP_FAILED ? NULL : p;
		close(fd);
	}
	ok = counter != NULL;
	if (me == 0 && counter)
		__atomic_store_n(counter, value, __ATOMIC_RELEASE);
	if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node) != MPI_SUCCESS)
		all_ok = 0;
	if (me == 0 && name[0])
		shm_unlink(name);
	if (!all_ok && counter) {
		munmap(counter, (size_t)sysconf(_SC_PAGESIZE));
		counter = NULL;
	}
	return counter;
}

/* The node's shared counter of computing ranks if this node runs more ranks than there are cores
 * among the ranks' affinity masks (their union: a rank bound to one core by `mpirun --bind-to
 * core` is not oversubscribed when its neighbours are bound to others), else NULL. */
static int *oversubscribed_counter(void)
{
	MPI_Comm node;
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
		return NULL;
	int local = 1, ncpus = 0;
	MPI_Comm_size(node, &local);
	cpu_set_t mine, *all = calloc((size_t)local, sizeof mine);
	CPU_ZERO(&mine);
	if (sched_getaffinity(0, sizeof mine, &mine) != 0)
		CPU_ZERO(&mine);
	if (all && MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node) == MPI_SUCCESS) {
		cpu_set_t any;
		CPU_ZERO(&any);
		for (int i = 0; i < local; i++)
			CPU_OR(&any, &any, &all[i]);
		ncpus = CPU_COUNT(&any);
	}
	free(all);
	int *counter = ncpus > 0 && local > ncpus ? share_counter(node, local) : NULL;
	MPI_Comm_free(&node);
	return counter;
}

void planrt_comm_init_(void)
{
	const char *s = getenv("PLANRT_WATCHDOG");
	if (s && *s) {
		char *end;
		double v = strtod(s, &end);
		if ((*end || v < 0 || !isfinite(v)) && planrt_world_rank_() <= 0)
			fprintf(stderr, "planrt: rank %d: PLANRT_WATCHDOG='%s' is not a number of seconds >= 0; "
					"using %g\n", planrt_world_rank_(), s, watchdog_s);
		if (!*end && v >= 0 && isfinite(v))
			watchdog_s = v;
	}
	int *ub = NULL, flag = 0;
	if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub && *ub > 0)
		tag_ub = *ub;
	s = getenv("PLANRT_WAIT");
	if (s && *s) {
		if (!strcmp(s, "yield") || !strcmp(s, "sleep") || !strcmp(s, "auto"))
			wait_policy = s[0] == 'y' ? WAIT_YIELD : s[0] == 's' ? WAIT_SLEEP : WAIT_AUTO;
		else if (planrt_world_rank_() <= 0)
			fprintf(stderr, "planrt: rank %d: PLANRT_WAIT='%s' is not auto, yield or sleep; using auto\n",
				planrt_world_rank_(), s);
	}
	node_computing = oversubscribed_counter();
	int size = 1;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	world_size = size;
	mpi_reduce_scatter = getenv("PLANRT_MPI_REDUCE_SCATTER") != NULL;
	mpi_thread = 1;
}

void planrt_watchdog_set(double seconds)
{
	watchdog_s = seconds > 0 ? seconds : 0;
}

/* The counters' slot of a group, -1 if it names none. */
static int group_slot(int group)
{
	if (group >= 0)
		return group < PLANRT_MAX_AXES_ ? 2 + group : -1;
	return group == PLANRT_GROUP_WORLD ? 0 : group == PLANRT_GROUP_PAIR ? 1 : -1;
}

uint64_t planrt_bytes_sent(void)
{
	uint64_t sum = 0;
	for (int k = 0; k < planrt_coll_kinds; k++)
		for (int g = 0; g < GROUP_SLOTS; g++)
			sum += bytes_by[k][g];
	return sum;
}

uint64_t planrt_bytes_sent_by(planrt_coll_t kind, int group)
{
	int g = group_slot(group);
	return (unsigned)kind < planrt_coll_kinds && g >= 0 ? bytes_by[kind][g] : 0;
}

uint64_t planrt_calls_by(planrt_coll_t kind, int group)
{
	int g = group_slot(group);
	return (unsigned)kind < planrt_coll_kinds && g >= 0 ? calls_by[kind][g] : 0;
}

const char *planrt_coll_name(planrt_coll_t kind)
{
	return (unsigned)kind < planrt_coll_kinds ? kind_names[kind] : "?";
}

MPI_Datatype planrt_mpi_type_(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return MPI_FLOAT;
	case planrt_bf16: return MPI_UINT16_T;
	case planrt_f16: return MPI_UINT16_T;
	case planrt_i32: return MPI_INT32_T;
	case planrt_u8: return MPI_UINT8_T;
	case planrt_f64: return MPI_DOUBLE;
	}
	return MPI_DATATYPE_NULL;
}

static int is_half(planrt_dtype_t t)
{
	return t == planrt_bf16 || t == planrt_f16;
}

static planrt_result_t mpi_fail(int rc, const struct planrt_request *q)
{
	char text[MPI_MAX_ERROR_STRING];
	int len = 0;
	MPI_Error_string(rc, text, &len);
	return planrt_error_(planrt_system_error, "MPI %s on %s failed: %s", kind_names[q->kind], q->comm->name, text);
}

static void describe(const struct planrt_request *q, char *buf, size_t n)
{
	int len = snprintf(buf, n, "%s #%llu of %zu %s", kind_names[q->kind], (unsigned long long)q->seq, q->count,
			   dtype_names[q->dtype]);
	if (len < 0 || (size_t)len >= n)
		return;
	if (q->kind == K_ALLREDUCE || q->kind == K_REDUCE_SCATTER)
		len += snprintf(buf + len, n - (size_t)len, " (%s)", q->op == planrt_sum ? "sum" : "max");
	else if (q->kind == K_SEND || q->kind == K_RECV)
		len += snprintf(buf + len, n - (size_t)len, q->tag ? " %s member %d tag %d" : " %s member %d",
				q->kind == K_SEND ? "to" : "from", q->peer, q->tag);
	else if (q->kind == K_BROADCAST)
		len += snprintf(buf + len, n - (size_t)len, " from root %d", q->peer);
	if (len >= 0 && (size_t)len < n)
		snprintf(buf + len, n - (size_t)len, " on %s (member %d of %d)", q->comm->name, q->comm->rank,
			 q->comm->size);
}

/* A call's wire bytes, by the formula at the top of this file. */
static uint64_t wire_bytes(const struct planrt_request *q)
{
	uint64_t n = (uint64_t)q->comm->size, B = (uint64_t)q->count * planrt_dtype_size(q->dtype), k = 1, bytes;
	if (n <= 1 || q->kind == K_RECV) {
		bytes = 0;
	} else if (q->kind == K_SEND || q->kind == K_ALLTOALLV) { /* alltoallv: count is what leaves */
		bytes = B;
	} else {
		if (q->kind == K_ALLREDUCE)
			k = 2;
		else if (q->kind != K_BROADCAST)
			B *= n; /* reduce-scatter, allgather, alltoall: n blocks of count */
		bytes = (2 * k * (n - 1) * B + n) / (2 * n);
	}
	return bytes;
}

/* One started call into the counters. */
static void count_call(const struct planrt_request *q)
{
	if (q->comm->group == PLANRT_GROUP_CONTROL_)
		return; /* planrt's own control messages: not the plan's traffic */
	int g = group_slot(q->comm->group);
	if (g < 0)
		g = 0;
	bytes_by[q->kind][g] += wire_bytes(q);
	calls_by[q->kind][g]++;
}

/* --trace: a call is an event of category collective or p2p, from its start to its completion
 * (blocking) or to the return of the call that posts it (started: its completion is the wait's
 * event); a wait is an event of category wait. Their arguments: the communicator and its size,
 * count, dtype, the wire bytes (the counters' figure), the call's sequence number there. planrt's
 * control messages are not the plan's and are left out. */
static int traced(const struct planrt_request *q)
{
	return planrt_tracing_ && q->comm->group != PLANRT_GROUP_CONTROL_;
}

static void trace_call_args(const struct planrt_request *q, const char *mode)
{
	char args[200];
	int len = snprintf(args, sizeof args,
			   "\"op\":\"%s\",\"group\":\"%s\",\"members\":%d,\"count\":%zu,\"dtype\":\"%s\",\"bytes\":%llu,"
			   "\"seq\":%llu,\"mode\":\"%s\"",
			   kind_names[q->kind], q->comm->name, q->comm->size, q->count, dtype_names[q->dtype],
			   (unsigned long long)wire_bytes(q), (unsigned long long)q->seq, mode);
	if (len > 0 && (size_t)len < sizeof args && (q->kind == K_SEND || q->kind == K_RECV || q->kind == K_BROADCAST))
		snprintf(args + len, sizeof args - (size_t)len, ",\"%s\":%d", q->kind == K_BROADCAST ? "root" : "peer", q->peer);
	planrt_trace_end_(args);
}

/* f32 staging for half-precision reductions. One buffer is kept between calls (so a training
 * loop does not fault in fresh pages on every bucket); a request that finds it taken by another
 * in-flight request gets its own. */
static float *stage_cache;
static size_t stage_cap;
static int stage_busy;

static float *stage_get(size_t n)
{
	if (stage_busy)
		return malloc(n ? n * sizeof(float) : 1);
	if (stage_cap < n) {
		free(stage_cache);
		stage_cap = 0;
		if (!(stage_cache = malloc(n * sizeof(float))))
			return NULL;
		stage_cap = n;
	}
	stage_busy = 1;
	return stage_cache ? stage_cache : (stage_cache = malloc(1));
}

static void stage_put(float *p)
{
	if (p && p == stage_cache)
		stage_busy = 0;
	else
		free(p);
}

static float *to_f32(const void *src, size_t n, planrt_dtype_t t)
{
	float *f = stage_get(n);
	if (f)
		planrt_halves_to_f32_(src, f, n, t);
	return f;
}

static void from_f32(const float *f, uint16_t *h, size_t n, planrt_dtype_t t)
{
	planrt_f32_to_halves_(f, h, n, t);
}

/* Runs after MPI reports completion: half-precision results back, staged copies out. */
static void record_end(const struct planrt_request *q);

/* The two blocks of a two-member reduce-scatter, each member's contribution, into one (the same
 * result in either order: a sum or a maximum of two is commutative, bit for bit). */
static void pair_combine(const struct planrt_request *q)
{
	size_t n = q->pair_count;
	if (q->pair_f64) {
		const double *a = q->pair_src, *b = a + n;
		double *d = q->pair_dst;
		for (size_t i = 0; i < n; i++)
			d[i] = q->pair_max ? (a[i] > b[i] ? a[i] : b[i]) : a[i] + b[i];
	} else {
		const float *a = q->pair_src, *b = a + n;
		float *d = q->pair_dst;
		for (size_t i = 0; i < n; i++)
			d[i] = q->pair_max ? (a[i] > b[i] ? a[i] : b[i]) : a[i] + b[i];
	}
}

/* ------------------------------------------------------------------ progress while computing
 * The started operations of this layer still in flight, oldest first (a request joins when its
 * nonblocking call returns and leaves when it is finished or abandoned), and their number, which
 * the CPU kernels read before calling planrt_comm_poke_. Only the thread that makes the rank's MPI
 * calls (planrt_comm_init_'s) keeps the list; a kernel running on a pool thread does not poke. */
int planrt_comm_pending_;
static struct planrt_request *oldest, *newest;

static void pending_add(struct planrt_request *q)
{
	q->older = newest;
	q->newer = NULL;
	if (newest)
		newest->newer = q;
	else
		oldest = q;
	newest = q;
	q->listed = 1;
	__atomic_store_n(&planrt_comm_pending_, planrt_comm_pending_ + 1, __ATOMIC_RELAXED);
}

static void pending_remove(struct planrt_request *q)
{
	if (!q->listed)
		return;
	if (q->older)
		q->older->newer = q->newer;
	else
		oldest = q->newer;
	if (q->newer)
		q->newer->older = q->older;
	else
		newest = q->older;
	q->listed = 0;
	__atomic_store_n(&planrt_comm_pending_, planrt_comm_pending_ - 1, __ATOMIC_RELAXED);
}

static void finish(struct planrt_request *q);

/* MPI_Test on the oldest operation in flight: a test of an incomplete request runs MPI's progress
 * engine, which advances every outstanding operation; one that completed is finished here (its
 * results put in place, as its wait would) and the next is tested. At most one poke a
 * millisecond: a test that finds nothing to do yields the core (Open MPI's mpi_yield_when_idle, on
 * where ranks outnumber cores), and a poke at every GEMM made a data = 2, pipe = 2 GPT step on 4
 * ranks / 2 cores 5-7% slower; once a millisecond costs nothing measurable there and keeps pp2's
 * gain on 2 ranks (79 -> 53 ms a step; every GEMM: 52 ms). */
#define POKE_INTERVAL_S 1e-3
static double next_poke;
void planrt_comm_poke_(void)
{
	if (!mpi_thread)
		return;
	double now = planrt_now();
	if (now < next_poke)
		return;
	next_poke = now + POKE_INTERVAL_S;
	while (oldest) {
		struct planrt_request *q = oldest;
		int flag = 0, rc = MPI_Test(&q->mreq, &flag, MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS)
			PLANRT_CHECK(mpi_fail(rc, q));
		if (!flag)
			return;
		finish(q);
	}
}

static void finish(struct planrt_request *q)
{
	pending_remove(q);
	record_end(q);
	if (q->pair_dst)
		pair_combine(q);
	if (q->staged_dst)
		from_f32(q->staged, q->staged_dst, q->staged_count, q->dtype);
	if (q->copy_dst)
		memcpy(q->copy_dst, q->copy_src, q->copy_bytes);
	stage_put(q->staged);
	free(q->scratch);
	q->staged = NULL;
	q->scratch = NULL;
	q->done = 1;
}

static void abandon(struct planrt_request *q)
{
	pending_remove(q);
	record_end(q);
	stage_put(q->staged);
	free(q->scratch);
	q->staged = q->scratch = NULL;
}

/* ------------------------------------------------------------------ the monitor thread
 *
 * One thread per process watches the rank from outside the MPI calls (it makes none: MPI is
 * initialised funneled):
 *   watchdog   the operation the rank waits in (a blocking call, or the wait of a nonblocking
 *              one) is published here; pending longer than PLANRT_WATCHDOG seconds, the thread
 *              prints it and ends the process, which makes the launcher end the job;
 *   signals    SIGTERM, SIGINT and SIGHUP are blocked in every other thread (planrt_init blocks
 *              them before MPI starts its threads, which inherit the mask) and taken here with
 *              sigtimedwait: the thread prints where the rank was (the step and phase, the
 *              operation it waits in and for how long, the nonblocking ones in flight, the last
 *              one completed), runs the program's cleanup (a checkpoint's temporary files), and
 *              ends the process by the signal. A launcher stopping a job whose rank died sends
 *              these signals to the survivors, so every survivor says what it was waiting for,
 *              as PyTorch's Flight Recorder does;
 *   record     the last RECENT operations started (kind, count, dtype, group, sequence number,
 *              start and end time), for that report.
 * What the thread reads is written by the rank's thread without locks; a report may show an
 * operation a moment out of date, never a torn one (gen is checked around every copy). */

/* The operation the rank waits in: gen changes on every arm and disarm, and the thread trusts
 * what it read through q only if gen was the same before and after (the request lives for the
 * length of the wait). A coarse clock is enough. */
static struct {
	volatile uint64_t gen; /* odd while a call is armed */
	volatile double since;
	const struct planrt_request *volatile q;
} wd;

enum { RECENT = 16 };
static struct recent_op {
	volatile uint64_t id;       /* 1 + the index in the sequence of every operation started */
	struct planrt_request q;    /* a copy (its comm pointer stays valid until planrt_finalize) */
	volatile double started, ended; /* ended 0: not completed yet */
} recent[RECENT];
static uint64_t nstarted;

/* where the program is (planrt_where_), for reports */
static volatile int64_t where_step = -1;
static const char *volatile where_phase;
static volatile int where_micro = -1, where_chunk = -1;
static void (*volatile signal_cleanup)(void);
static int monitor_running;

/* How long a rank stopped by a signal in a job of several ranks lives on after its report.
 * Open MPI 4.1's launcher (orte odls kill_local_procs) sends SIGTERM to every survivor, sleeps
 * odls_base_sigkill_timeout (1 s) and then SIGKILLs them all; but the first child's death ends
 * that sleep (SIGCHLD interrupts it, and glibc's sleep returns the whole seconds left: 0). So the
 * fastest survivor to exit took the others' time to report: measured, the SIGKILL came 0.9 ms
 * after a survivor's SIGTERM, and on a loaded machine its monitor thread had not run yet. Each
 * survivor therefore waits this long after writing its report, and the launcher's SIGKILL, not
 * the signal, usually ends it. */
static const double SIGNAL_LINGER_S = 0.5;

static double coarse_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void planrt_where_(int64_t step, const char *phase, int micro, int chunk)
{
	where_step = step;
	where_phase = phase;
	where_micro = micro;
	where_chunk = chunk;
}

void planrt_on_signal_(void (*cleanup)(void))
{
	signal_cleanup = cleanup;
}

/* a started operation into the record; q->rec is its id */
static void record_start(struct planrt_request *q)
{
	struct recent_op *r = &recent[nstarted % RECENT];
	q->rec = ++nstarted;
	r->id = 0;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	r->q = *q;
	r->started = coarse_now();
	r->ended = 0;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	r->id = q->rec;
}

static void record_end(const struct planrt_request *q)
{
	struct recent_op *r = &recent[(q->rec - 1) % RECENT];
	if (q->rec && r->id == q->rec)
		r->ended = coarse_now();
}

static void where_text(char *buf, size_t n)
{
	int64_t step = where_step;
	const char *phase = where_phase;
	int micro = where_micro, chunk = where_chunk;
	if (!phase) {
		snprintf(buf, n, "outside the training loop");
		return;
	}
	int len = step >= 0 ? snprintf(buf, n, "at step %lld (%s", (long long)step, phase) : snprintf(buf, n, "in %s", phase);
	if (len < 0 || (size_t)len >= n)
		return;
	if (micro >= 0)
		len += snprintf(buf + len, n - (size_t)len, "%smicro-batch %d, chunk %d", step >= 0 ? ", " : " (", micro,
				chunk);
	if (len >= 0 && (size_t)len < n && (step >= 0 || micro >= 0))
		snprintf(buf + len, n - (size_t)len, ")");
}

/* What the rank was doing, for a signal's report: the wait it is in, the nonblocking operations
 * in flight, the last completed one. */
static void activity_text(char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	uint64_t g = __atomic_load_n(&wd.gen, __ATOMIC_ACQUIRE);
	if (g & 1) {
		double since = wd.since;
		struct planrt_request q = *wd.q;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&wd.gen, __ATOMIC_ACQUIRE) == g) {
			char what[256];
			describe(&q, what, sizeof what);
			len += (size_t)snprintf(buf + len, n - len, "waiting %.1f s in %s", coarse_now() - since, what);
		}
	}
	if (!len)
		len += (size_t)snprintf(buf, n, "not waiting in a collective or transfer (computing)");
	const struct recent_op *last = NULL;
	int inflight = 0;
	char first[256] = "";
	for (int i = 0; i < RECENT; i++) {
		const struct recent_op *r = &recent[i];
		uint64_t id = r->id;
		if (!id)
			continue;
		struct planrt_request q = r->q;
		double ended = r->ended;
		if (r->id != id)
			continue;
		if (!ended && !first[0] && (!(g & 1) || q.seq != wd.q->seq || q.comm != wd.q->comm))
			describe(&q, first, sizeof first);
		inflight += !ended;
		if (ended && (!last || r->id > last->id))
			last = r;
	}
	if (len < n && inflight > ((g & 1) ? 1 : 0) && first[0])
		len += (size_t)snprintf(buf + len, n - len, "; %d nonblocking in flight, such as %s", inflight - ((g & 1) ? 1 : 0),
					first);
	if (len < n && last) {
		char what[256];
		struct planrt_request q = last->q;
		describe(&q, what, sizeof what);
		snprintf(buf + len, n - len, "; last completed: %s, %.1f s ago", what, coarse_now() - last->ended);
	}
}

static void report_signal(int sig)
{
	char where[160], what[1024];
	where_text(where, sizeof where);
	activity_text(what, sizeof what);
	const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "a signal";
	fprintf(stderr,
		"planrt: rank %d: stopped by %s %s: %s; the job is being stopped (when another rank died, the "
		"launcher's message or that rank's names it)\n",
		planrt_world_rank_(), name, where, what);
	fflush(stderr);
}

static void watchdog_check(void)
{
	uint64_t g = __atomic_load_n(&wd.gen, __ATOMIC_ACQUIRE);
	if (!(g & 1) || watchdog_s <= 0)
		return;
	double since = wd.since;
	struct planrt_request q = *wd.q;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&wd.gen, __ATOMIC_ACQUIRE) != g || coarse_now() - since <= watchdog_s)
		return;
	char what[256], where[160];
	describe(&q, what, sizeof what);
	where_text(where, sizeof where);
	fprintf(stderr,
		"planrt: rank %d: watchdog: %s still pending after %g s %s; another rank has stalled, died or called "
		"its collectives in a different order (PLANRT_WATCHDOG=seconds changes the limit, 0 turns it off)\n",
		planrt_world_rank_(), what, watchdog_s, where);
	fflush(stderr);
	_exit(1); /* the launcher then ends the other ranks */
}

static const int monitored[] = {SIGTERM, SIGINT, SIGHUP};

static void monitored_set(sigset_t *set)
{
	sigemptyset(set);
	for (size_t i = 0; i < sizeof monitored / sizeof monitored[0]; i++)
		sigaddset(set, monitored[i]);
}

static void *monitor_main(void *arg)
{
	(void)arg;
	sigset_t set;
	monitored_set(&set);
	for (;;) {
		double step = watchdog_s > 10 ? 1.0 : watchdog_s / 10 > 0.05 ? watchdog_s / 10 : watchdog_s > 0 ? 0.05 : 1.0;
		struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
		int sig = sigtimedwait(&set, NULL, &ts);
		if (sig > 0) {
			report_signal(sig);
			void (*cleanup)(void) = signal_cleanup;
			if (cleanup)
				cleanup();
			if (world_size > 1) {
				struct timespec linger = {0, (long)(SIGNAL_LINGER_S * 1e9)};
				while (nanosleep(&linger, &linger) != 0 && errno == EINTR)
					;
			}
			signal(sig, SIG_DFL);
			sigset_t one;
			sigemptyset(&one);
			sigaddset(&one, sig);
			pthread_sigmask(SIG_UNBLOCK, &one, NULL);
			raise(sig);
			_exit(128 + sig);
		}
		watchdog_check();
	}
	return NULL;
}

void planrt_monitor_start_(void)
{
	if (monitor_running)
		return;
	sigset_t set, old;
	monitored_set(&set);
	pthread_sigmask(SIG_BLOCK, &set, &old);
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, monitor_main, NULL) != 0) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		fprintf(stderr, "planrt: rank %d: cannot start the monitor thread; stalls and signals will not be reported\n",
			planrt_world_rank_());
	} else {
		monitor_running = 1;
	}
	pthread_attr_destroy(&attr);
}

/* The wait the rank is in; the record is kept with the watchdog off too (signal reports). */
static void watchdog_arm(const struct planrt_request *q)
{
	wd.q = q;
	wd.since = coarse_now();
	__atomic_add_fetch(&wd.gen, 1, __ATOMIC_RELEASE); /* odd: armed */
}

static void watchdog_disarm(void)
{
	__atomic_add_fetch(&wd.gen, 1, __ATOMIC_RELEASE); /* even: idle */
}

/* The end of a polling wait: the watchdog disarmed and, if the wait counted itself out of the
 * node's computing ranks, counted back in. */
static void wait_end(int counted_out)
{
	watchdog_disarm();
	if (counted_out)
		__atomic_add_fetch(node_computing, 1, __ATOMIC_RELAXED);
}

/* A sleep between two polls: 1 us the first time, twice as long each next time up to 1 us <<
 * longest (naps: the sleeps so far). */
static void nap(unsigned *naps, unsigned longest)
{
	struct timespec ts = {0, 1000L << (*naps < longest ? *naps : longest)};
	(*naps)++;
	nanosleep(&ts, NULL);
}

/* Between two polls of an oversubscribed rank's wait (PLANRT_WAIT=auto): sleep while another rank
 * of the node computes (up to 32 us, so that the wait notices within that much when the last of
 * them starts waiting); yield when every rank of the node waits (they are in the same transfers,
 * which move only as fast as each of them polls). */
static void oversubscribed_pause(unsigned *naps)
{
	if (__atomic_load_n(node_computing, __ATOMIC_RELAXED) <= 0) {
		*naps = 0;
		sched_yield();
	} else {
		nap(naps, 5);
	}
}

static planrt_result_t poll_wait(struct planrt_request *q)
{
	int rc;
	watchdog_arm(q);
	if (watchdog_s <= 0) {
		rc = MPI_Wait(&q->mreq, MPI_STATUS_IGNORE);
		watchdog_disarm();
		return rc == MPI_SUCCESS ? planrt_success : mpi_fail(rc, q);
	}
	double t0 = planrt_now();
	int counted_out = 0;
	unsigned naps = 0;
	for (unsigned spins = 0;; spins++) {
		int flag = 0;
		rc = MPI_Test(&q->mreq, &flag, MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS) {
			wait_end(counted_out);
			return mpi_fail(rc, q);
		}
		if (flag) {
			wait_end(counted_out);
			return planrt_success;
		}
		if (spins < 256)
			continue;
		if (planrt_now() - t0 > watchdog_s) {
			char what[256], where[160];
			describe(q, what, sizeof what);
			where_text(where, sizeof where);
			wait_end(counted_out);
			planrt_fatal("watchdog: %s still pending after %g s %s; another rank has stalled, died or called its "
				     "collectives in a different order (PLANRT_WATCHDOG=seconds changes the limit, 0 turns it off)",
				     what, watchdog_s, where);
		}
		if (wait_policy == WAIT_SLEEP) { /* the least CPU, the slowest transfers: up to 256 us */
			nap(&naps, 8);
			continue;
		}
		if (wait_policy == WAIT_YIELD || !node_computing) {
			sched_yield();
			continue;
		}
		if (!counted_out) {
			__atomic_sub_fetch(node_computing, 1, __ATOMIC_RELAXED);
			counted_out = 1;
		}
		oversubscribed_pause(&naps);
	}
}

/* ------------------------------------------------------------------ starting operations */

static const void *in_place_or(const void *sendbuf, const void *recvbuf)
{
	return sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
	const char *pa = a, *pb = b;
	return pa < pb + bn && pb < pa + an;
}

/* A reduce-scatter over two members of f32 or f64: each member's two blocks go one to each by an
 * all-to-all (one exchange), and completion combines the two blocks a member received into out.
 * Open MPI 4.1 runs MPI_Reduce_scatter_block here as a reduce of the whole buffer to member 0, in
 * segments, then a scatter: twice the bytes and a hand-off per segment that needs both ranks on a
 * core at once: 8-12 ms for a 1.7 MiB gradient bucket where ranks share cores, a step 25% slower
 * (docs/cpu.md). The result is the same bits. PLANRT_MPI_REDUCE_SCATTER (set on every rank) keeps
 * MPI's call. 0: it does not apply; 1: started (*rc MPI's status); -1: out of memory (an error,
 * never MPI's call instead, which the other member would not make). */
static int pair_exchange(struct planrt_request *q, const void *in, void *out, int cnt, MPI_Datatype dt, MPI_Op mop,
			 MPI_Comm comm, int direct, int *rc)
{
	if (q->comm->size != 2 || (dt != MPI_FLOAT && dt != MPI_DOUBLE) || mpi_reduce_scatter)
		return 0;
	size_t es = dt == MPI_FLOAT ? sizeof(float) : sizeof(double);
	if (!(q->scratch = malloc(2 * (size_t)cnt * es)))
		return -1;
	q->pair_src = q->scratch;
	q->pair_dst = out;
	q->pair_count = (size_t)cnt;
	q->pair_f64 = dt == MPI_DOUBLE;
	q->pair_max = mop == MPI_MAX;
	*rc = direct ? MPI_Alltoall(in, cnt, dt, q->scratch, cnt, dt, comm)
		     : MPI_Ialltoall(in, cnt, dt, q->scratch, cnt, dt, comm, &q->mreq);
	return 1;
}

/* Starts q (described by its fields) with the given buffers. blocking: the caller waits right
 * after; with the watchdog off that uses MPI's blocking call instead. On return q->done is set
 * when the blocking path already completed it. */
static planrt_result_t start(struct planrt_request *q, const void *sendbuf, void *recvbuf, int blocking)
{
	planrt_comm_t c = q->comm;
	MPI_Comm comm = c->comm;
	MPI_Datatype dt = planrt_mpi_type_(q->dtype);
	MPI_Op mop = q->op == planrt_max ? MPI_MAX : MPI_SUM;
	size_t es = planrt_dtype_size(q->dtype), n = (size_t)c->size;
	int cnt = (int)q->count;
	int direct = blocking;
	int rc = MPI_SUCCESS;
	q->mreq = MPI_REQUEST_NULL;
	if (direct)
		watchdog_arm(q);

	switch (q->kind) {
	case K_ALLREDUCE:
		if (is_half(q->dtype)) {
			if (!(q->staged = to_f32(sendbuf, q->count, q->dtype)))
				goto oom;
			q->staged_dst = recvbuf;
			q->staged_count = q->count;
			rc = direct ? MPI_Allreduce(MPI_IN_PLACE, q->staged, cnt, MPI_FLOAT, mop, comm)
				    : MPI_Iallreduce(MPI_IN_PLACE, q->staged, cnt, MPI_FLOAT, mop, comm, &q->mreq);
		} else {
			const void *s = in_place_or(sendbuf, recvbuf);
			rc = direct ? MPI_Allreduce(s, recvbuf, cnt, dt, mop, comm)
				    : MPI_Iallreduce(s, recvbuf, cnt, dt, mop, comm, &q->mreq);
		}
		break;
	case K_REDUCE_SCATTER: {
		/* in -> out; in place (MPI_IN_PLACE): the input in out, the result in its first block */
		const void *in = sendbuf;
		void *out = recvbuf;
		MPI_Datatype edt = dt;
		if (is_half(q->dtype)) {
			if (!(q->staged = to_f32(sendbuf, n * q->count, q->dtype)))
				goto oom;
			q->staged_dst = recvbuf;
			q->staged_count = q->count;
			in = out = q->staged;
			edt = MPI_FLOAT;
		} else if (sendbuf != recvbuf && overlaps(sendbuf, n * q->count * es, recvbuf, q->count * es)) {
			/* e.g. NCCL's in place, recv = send + rank * recvcount: the result goes to the
			 * staging buffer (no conversion: staged_dst stays NULL) and is copied out at
			 * completion */
			if (!(q->staged = stage_get((q->count * es + sizeof(float) - 1) / sizeof(float))))
				goto oom;
			out = q->staged;
			q->copy_dst = recvbuf;
			q->copy_src = q->staged;
			q->copy_bytes = q->count * es;
		}
		int pair = pair_exchange(q, in, out, cnt, edt, mop, comm, direct, &rc);
		if (pair < 0)
			goto oom;
		const void *min = in == out ? MPI_IN_PLACE : in;
		if (!pair)
			rc = direct ? MPI_Reduce_scatter_block(min, out, cnt, edt, mop, comm)
				    : MPI_Ireduce_scatter_block(min, out, cnt, edt, mop, comm, &q->mreq);
		break;
	}
	case K_ALLGATHER: {
		char *slot = (char *)recvbuf + (size_t)c->rank * q->count * es;
		const void *s = sendbuf;
		if (overlaps(sendbuf, q->count * es, recvbuf, n * q->count * es)) {
			if (sendbuf != slot)
				memmove(slot, sendbuf, q->count * es);
			s = MPI_IN_PLACE;
		}
		rc = direct ? MPI_Allgather(s, cnt, dt, recvbuf, cnt, dt, comm)
			    : MPI_Iallgather(s, cnt, dt, recvbuf, cnt, dt, comm, &q->mreq);
		break;
	}
	case K_ALLTOALL: {
		const void *s = sendbuf;
		size_t bytes = n * q->count * es;
		if (overlaps(sendbuf, bytes, recvbuf, bytes)) {
			if (!(q->scratch = malloc(bytes + 1)))
				goto oom;
			memcpy(q->scratch, sendbuf, bytes);
			s = q->scratch;
		}
		rc = direct ? MPI_Alltoall(s, cnt, dt, recvbuf, cnt, dt, comm)
			    : MPI_Ialltoall(s, cnt, dt, recvbuf, cnt, dt, comm, &q->mreq);
		break;
	}
	case K_BROADCAST:
		rc = direct ? MPI_Bcast(recvbuf, cnt, dt, q->peer, comm)
			    : MPI_Ibcast(recvbuf, cnt, dt, q->peer, comm, &q->mreq);
		break;
	case K_SEND:
		rc = direct ? MPI_Send(sendbuf, cnt, dt, q->peer, q->tag, comm)
			    : MPI_Isend(sendbuf, cnt, dt, q->peer, q->tag, comm, &q->mreq);
		break;
	case K_RECV:
		rc = direct ? MPI_Recv(recvbuf, cnt, dt, q->peer, q->tag, comm, MPI_STATUS_IGNORE)
			    : MPI_Irecv(recvbuf, cnt, dt, q->peer, q->tag, comm, &q->mreq);
		break;
	case K_ALLTOALLV: {
		const int *v = q->vcounts;
		rc = direct ? MPI_Alltoallv(sendbuf, v, v + n, dt, recvbuf, v + 2 * n, v + 3 * n, dt, comm)
			    : MPI_Ialltoallv(sendbuf, v, v + n, dt, recvbuf, v + 2 * n, v + 3 * n, dt, comm, &q->mreq);
		break;
	}
	case planrt_coll_kinds: /* not a kind; run() never passes it */
		break;
	}
	if (direct)
		watchdog_disarm();
	if (rc != MPI_SUCCESS) {
		abandon(q);
		return mpi_fail(rc, q);
	}
	count_call(q);
	record_start(q);
	if (direct)
		finish(q);
	return planrt_success;
oom:
	if (direct)
		watchdog_disarm();
	abandon(q);
	return planrt_error_(planrt_system_error, "out of memory staging a %s of %zu %s", kind_names[q->kind], q->count,
			     dtype_names[q->dtype]);
}

/* ------------------------------------------------------------------ the device comm layer
 * An operation on a device stream goes to the comm layer the device registered (NCCL, comm_nccl.c),
 * which enqueues it on the stream; it is counted here like the MPI layer's. A request it returns
 * is an external one: planrt_wait and planrt_test call its own functions. */
static const planrt_comm_layer_t *device_layer;

void planrt_comm_layer_set_(const planrt_comm_layer_t *layer)
{
	device_layer = layer;
}

planrt_request_t planrt_request_external_(void *impl, const planrt_request_ops_t *ops)
{
	struct planrt_request *q = calloc(1, sizeof *q);
	if (!q)
		planrt_fatal("out of memory for a request");
	q->ext = impl;
	q->ext_ops = ops;
	return q;
}

static planrt_result_t run_device(kind_t kind, const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t,
				  planrt_op_t op, int peer, int tag, planrt_comm_t c, planrt_stream_t stream,
				  planrt_request_t *req)
{
	if (!device_layer)
		return planrt_error_(planrt_invalid_usage,
				     "%s on a device stream, but no device comm layer is registered (a program built with "
				     "--target cuda registers NCCL's)",
				     kind_names[kind]);
	planrt_result_t r = device_layer->run(kind, sendbuf, recvbuf, count, t, op, peer, tag, c, stream, req);
	if (r == planrt_success) {
		struct planrt_request counted = {.kind = kind, .count = count, .dtype = t, .comm = c};
		c->ncalls++;
		count_call(&counted);
	}
	return r;
}

/* Common entry: checks, then a blocking run (req NULL) or a started request in *req. */
static planrt_result_t run(kind_t kind, const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t,
			   planrt_op_t op, int peer, int tag, planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req)
{
	if (req)
		*req = NULL;
	if (!c)
		return planrt_error_(planrt_invalid_usage,
				     "%s on a NULL communicator (before planrt_init, or a pair group this rank is "
				     "not in)",
				     kind_names[kind]);
	if ((unsigned)t > planrt_f64)
		return planrt_error_(planrt_invalid_argument, "%s: unknown dtype %d", kind_names[kind], (int)t);
	if (op != planrt_sum && op != planrt_max)
		return planrt_error_(planrt_invalid_argument, "%s: unknown reduction %d", kind_names[kind], (int)op);
	size_t total = kind == K_ALLREDUCE || kind == K_BROADCAST || kind == K_SEND || kind == K_RECV
			       ? count
			       : count * (size_t)c->size;
	if ((count > INT_MAX && !stream) || total > INT_MAX)
		return planrt_error_(planrt_invalid_argument,
				     "%s of %zu elements per rank exceeds MPI's int counts; split it into buckets",
				     kind_names[kind], count);
	if (stream) /* the device layer's counts are size_t */
		total = 0;
	if ((kind == K_SEND || kind == K_RECV || kind == K_BROADCAST) && (peer < 0 || peer >= c->size))
		return planrt_error_(planrt_invalid_argument, "%s: member %d is not in %s (size %d)", kind_names[kind],
				     peer, c->name, c->size);
	if (tag < 0 || tag > tag_ub)
		return planrt_error_(planrt_invalid_argument, "%s: tag %d is outside MPI's range 0 to %d", kind_names[kind],
				     tag, tag_ub);
	if (stream)
		return run_device(kind, sendbuf, recvbuf, count, t, op, peer, tag, c, stream, req);
	struct planrt_request local, *q = &local;
	if (req && !(q = malloc(sizeof *q)))
		return planrt_error_(planrt_system_error, "out of memory for a request");
	memset(q, 0, sizeof *q);
	q->kind = kind;
	q->count = count;
	q->dtype = t;
	q->op = op;
	q->peer = peer;
	q->tag = tag;
	q->comm = c;
	q->seq = ++c->ncalls;
	int tracing = traced(q);
	if (tracing)
		planrt_trace_begin_(kind_names[kind], kind == K_SEND || kind == K_RECV ? "p2p" : "collective");
	planrt_result_t r = start(q, sendbuf, recvbuf, req == NULL);
	if (r == planrt_success && !req && !q->done) {
		r = poll_wait(q);
		if (r != planrt_success)
			abandon(q);
		else
			finish(q);
	}
	if (tracing)
		trace_call_args(q, req ? "started" : "blocking");
	if (r != planrt_success) {
		if (req)
			free(q);
		return r;
	}
	if (req) {
		if (!q->done && q->mreq != MPI_REQUEST_NULL)
			pending_add(q);
		*req = q;
	}
	return planrt_success;
}

planrt_result_t planrt_allreduce(const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t, planrt_op_t op,
				 planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_ALLREDUCE, sendbuf, recvbuf, count, t, op, 0, 0, c, stream, req);
}

planrt_result_t planrt_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, planrt_dtype_t t,
				      planrt_op_t op, planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, t, op, 0, 0, c, stream, req);
}

planrt_result_t planrt_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, planrt_dtype_t t,
				 planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_ALLGATHER, sendbuf, recvbuf, sendcount, t, planrt_sum, 0, 0, c, stream, req);
}

planrt_result_t planrt_alltoall(const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t, planrt_comm_t c,
				planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_ALLTOALL, sendbuf, recvbuf, count, t, planrt_sum, 0, 0, c, stream, req);
}

planrt_result_t planrt_alltoallv(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls, void *recvbuf,
				 const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t, planrt_comm_t c)
{
	if (!c)
		return planrt_error_(planrt_invalid_usage, "alltoallv on a NULL communicator (before planrt_init)");
	if ((unsigned)t > planrt_f64)
		return planrt_error_(planrt_invalid_argument, "alltoallv: unknown dtype %d", (int)t);
	int n = c->size;
	int *v = malloc(sizeof(int) * 4 * (size_t)n);
	if (!v)
		return planrt_error_(planrt_system_error, "out of memory for an alltoallv's counts");
	size_t others = 0;
	for (int r = 0; r < n; r++) {
		const int64_t x[4] = {sendcounts[r], sdispls[r], recvcounts[r], rdispls[r]};
		for (int k = 0; k < 4; k++) {
			if (x[k] < 0 || x[k] > INT_MAX) {
				free(v);
				return planrt_error_(planrt_invalid_argument,
						     "alltoallv: a count or displacement of %lld elements is outside MPI's int range",
						     (long long)x[k]);
			}
			v[k * n + r] = (int)x[k];
		}
		if (r != c->rank)
			others += (size_t)sendcounts[r];
	}
	struct planrt_request q;
	memset(&q, 0, sizeof q);
	q.kind = K_ALLTOALLV;
	q.count = others;
	q.dtype = t;
	q.op = planrt_sum;
	q.comm = c;
	q.seq = ++c->ncalls;
	q.vcounts = v;
	int tracing = traced(&q);
	if (tracing)
		planrt_trace_begin_("alltoallv", "collective");
	planrt_result_t r = start(&q, sendbuf, recvbuf, 1);
	if (r == planrt_success && !q.done) {
		r = poll_wait(&q);
		if (r != planrt_success)
			abandon(&q);
		else
			finish(&q);
	}
	if (tracing)
		trace_call_args(&q, "blocking");
	free(v);
	return r;
}

planrt_result_t planrt_alltoallv_on(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
				    void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t,
				    planrt_comm_t c, planrt_stream_t stream)
{
	if (!stream)
		return planrt_alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, c);
	if (!c)
		return planrt_error_(planrt_invalid_usage, "alltoallv on a NULL communicator (before planrt_init)");
	if ((unsigned)t > planrt_f64)
		return planrt_error_(planrt_invalid_argument, "alltoallv: unknown dtype %d", (int)t);
	if (!device_layer || !device_layer->alltoallv)
		return planrt_error_(planrt_invalid_usage,
				     "alltoallv on a device stream, but no device comm layer with alltoallv is registered");
	size_t others = 0;
	for (int r = 0; r < c->size; r++) {
		if (sendcounts[r] < 0 || sdispls[r] < 0 || recvcounts[r] < 0 || rdispls[r] < 0)
			return planrt_error_(planrt_invalid_argument, "alltoallv: a negative count or displacement");
		if (r != c->rank)
			others += (size_t)sendcounts[r];
	}
	planrt_result_t r = device_layer->alltoallv(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, c, stream);
	if (r == planrt_success) {
		struct planrt_request counted = {.kind = K_ALLTOALLV, .count = others, .dtype = t, .comm = c};
		c->ncalls++;
		count_call(&counted);
	}
	return r;
}

planrt_result_t planrt_broadcast(void *buf, size_t count, planrt_dtype_t t, int root, planrt_comm_t c,
				 planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_BROADCAST, buf, buf, count, t, planrt_sum, root, 0, c, stream, req);
}

planrt_result_t planrt_send_tagged(const void *buf, size_t count, planrt_dtype_t t, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_SEND, buf, NULL, count, t, planrt_sum, peer, tag, c, stream, req);
}

planrt_result_t planrt_recv_tagged(void *buf, size_t count, planrt_dtype_t t, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_RECV, NULL, buf, count, t, planrt_sum, peer, tag, c, stream, req);
}

planrt_result_t planrt_send(const void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
			    planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_SEND, buf, NULL, count, t, planrt_sum, peer, 0, c, stream, req);
}

planrt_result_t planrt_recv(void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
			    planrt_stream_t stream, planrt_request_t *req)
{
	return run(K_RECV, NULL, buf, count, t, planrt_sum, peer, 0, c, stream, req);
}

/* A request is finished by exactly one planrt_wait, which frees it (also after planrt_test
 * reported it done). */
planrt_result_t planrt_wait(planrt_request_t q)
{
	if (!q)
		return planrt_error_(planrt_invalid_argument, "planrt_wait on a NULL request");
	if (q->ext_ops) {
		planrt_result_t e = q->ext_ops->wait(q->ext);
		free(q);
		return e;
	}
	planrt_result_t r = planrt_success;
	int tracing = traced(q);
	if (tracing)
		planrt_trace_begin_("wait", "wait");
	if (!q->done) {
		r = poll_wait(q);
		if (r == planrt_success)
			finish(q);
		else
			abandon(q);
	}
	if (tracing)
		trace_call_args(q, "wait");
	free(q);
	return r;
}

planrt_result_t planrt_test(planrt_request_t q, int *done)
{
	*done = 0;
	if (!q)
		return planrt_error_(planrt_invalid_argument, "planrt_test on a NULL request");
	if (q->ext_ops)
		return q->ext_ops->test(q->ext, done);
	if (q->done) {
		*done = 1;
		return planrt_success;
	}
	int flag = 0, rc = MPI_Test(&q->mreq, &flag, MPI_STATUS_IGNORE);
	if (rc != MPI_SUCCESS)
		return mpi_fail(rc, q);
	if (flag) {
		finish(q);
		*done = 1;
	}
	return planrt_success;
}
