/* test_comm_staged.c: the MPI device backend (runtime/comm/staged.c) on the CPU, under mpirun.
 *
 * The backend reaches the device only through planrt_stage_ops_t. Here that interface is host
 * threads: a stream is a thread running a queue of items (copies, event records, event waits,
 * gates, functions) in order, each after a random delay of up to JITTER microseconds (a copy also
 * takes time: it moves its bytes in pieces with delays between them); an event is
 * a completion counter that the stream raises when it reaches the record. "Device" buffers are
 * plain memory only stream threads touch. So the staging, the lanes and every ordering edge run
 * as they do on a GPU, with timings shuffled on every rank:
 *
 *   values    every collective kind and point-to-point transfer on a device stream (f32, bf16,
 *             f16, i32, u8, f64; sum and max; NCCL's in-place forms), against planrt's MPI
 *             collectives on the host (stream NULL) on the same inputs: equal bit for bit, and the
 *             same bytes in planrt_bytes_sent_by;
 *   ordering  many iterations of: the compute stream writes the input; the comm stream waits for
 *             that, runs an allreduce on the backend with a request; planrt_wait(request) makes the
 *             compute stream wait; the compute stream checks the result. Dropping any edge (the
 *             lane waiting for the staging copy, the gate before the copy back, the request's
 *             wait, a stage reused before its operation's `done`) reads stale or future data
 *             and fails it; two streams on two communicators share the staging pool meanwhile;
 *   pool      many operations in flight on two streams at once; the host interface also checks, at
 *             every copy enqueued, that no other stream's pending copy still uses its host memory
 *             (a staging buffer handed on before its operation's copy back has run);
 *   p2p       a ring of sends and receives on pipeline channels (tags, sender parity lanes), the
 *             receives posted ahead on their own stream, checked by the compute stream;
 *   ring      context parallelism's K/V shifts as the CUDA target composes them (the receive on a
 *             stream of its own, the comm stream waiting for it before the next shift sends the
 *             block received); with that wait dropped the blocks sent are stale;
 *   watchdog  (argument "watchdog") rank 1 skips an allreduce: the other ranks' must be reported
 *             within PLANRT_WATCHDOG seconds, naming the operation (tests/cuda/gpu_ranks.cmake
 *             matches the first rank's line: its exit ends the job).
 *
 *   mpirun -np 4 test_comm_staged [watchdog]      (exit status 0 when every check passed) */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"
#include "planrt_staged.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ host streams and events */

struct planrt_stage_event {
	pthread_mutex_t m;
	pthread_cond_t cv;
	unsigned long recorded, reached; /* records enqueued, records the stream has reached */
	int refs, freed;                 /* items that still name it; event_free called */
};
typedef struct planrt_stage_event hevent_t;

static int jitter_us = 200;
static long mismatches;
static int rank, world;

/* The host memory every enqueued copy reads or writes, until it has run: a copy enqueued on one
 * stream into host memory another stream's pending copy still uses is a race on a real device (the
 * backend reused a staging buffer too early). */
typedef struct pending {
	struct pending *next;
	const char *lo, *hi;
	const void *stream;
} pending_t;
static pending_t *pending;
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static long reuse_races;

enum { I_COPY, I_RECORD, I_WAIT, I_GATE, I_FN };
typedef struct item {
	struct item *next;
	int type;
	pending_t *use; /* a copy's host memory */
	void *dst;
	const void *src;
	size_t n;
	hevent_t *ev;
	unsigned long ticket;
	volatile uint32_t *flag;
	uint32_t value;
	void (*fn)(void *);
	void *arg;
} item_t;

typedef struct hstream {
	pthread_t th;
	pthread_mutex_t m;
	pthread_cond_t cv;
	item_t *head, *tail;
	int stop;
	unsigned seed;
} hstream_t;


static void ev_unref(hevent_t *e)
{
	pthread_mutex_lock(&e->m);
	int gone = --e->refs == 0 && e->freed;
	pthread_mutex_unlock(&e->m);
	if (gone) {
		pthread_mutex_destroy(&e->m);
		pthread_cond_destroy(&e->cv);
		free(e);
	}
}

static void *stream_main(void *arg)
{
	hstream_t *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->m);
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->m);
		item_t *it = s->head;
		if (it) {
			s->head = it->next;
			if (!s->head)
				s->tail = NULL;
		}
		pthread_mutex_unlock(&s->m);
		if (!it)
			return NULL;
		if (jitter_us)
			usleep((useconds_t)(rand_r(&s->seed) % (unsigned)jitter_us));
		switch (it->type) {
		case I_COPY: /* in pieces, taking time, as a DMA engine does */
			for (size_t at = 0, piece = it->n / 4 + 1; at < it->n; at += piece) {
				memcpy((char *)it->dst + at, (const char *)it->src + at, it->n - at < piece ? it->n - at : piece);
				if (jitter_us)
					usleep((useconds_t)(rand_r(&s->seed) % (unsigned)(jitter_us / 4 + 1)));
			}
			pthread_mutex_lock(&pending_lock);
			for (pending_t **at = &pending; *at; at = &(*at)->next)
				if (*at == it->use) {
					*at = it->use->next;
					break;
				}
			pthread_mutex_unlock(&pending_lock);
			free(it->use);
			break;
		case I_RECORD:
			pthread_mutex_lock(&it->ev->m);
			if (it->ticket > it->ev->reached)
				it->ev->reached = it->ticket;
			pthread_cond_broadcast(&it->ev->cv);
			pthread_mutex_unlock(&it->ev->m);
			ev_unref(it->ev);
			break;
		case I_WAIT:
			pthread_mutex_lock(&it->ev->m);
			while (it->ev->reached < it->ticket)
				pthread_cond_wait(&it->ev->cv, &it->ev->m);
			pthread_mutex_unlock(&it->ev->m);
			ev_unref(it->ev);
			break;
		case I_GATE:
			while ((int32_t)(__atomic_load_n(it->flag, __ATOMIC_ACQUIRE) - it->value) < 0)
				usleep(20);
			break;
		case I_FN: it->fn(it->arg); break;
		}
		free(it);
	}
}

static hstream_t *stream_new(unsigned seed)
{
	hstream_t *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->seed = seed;
	pthread_create(&s->th, NULL, stream_main, s);
	return s;
}

static void push(planrt_stream_t stream, item_t it)
{
	hstream_t *s = (hstream_t *)stream;
	item_t *p = malloc(sizeof *p);
	*p = it;
	p->next = NULL;
	pthread_mutex_lock(&s->m);
	if (s->tail)
		s->tail->next = p;
	else
		s->head = p;
	s->tail = p;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->m);
}

static void stream_end(hstream_t *s)
{
	pthread_mutex_lock(&s->m);
	s->stop = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->m);
	pthread_join(s->th, NULL);
}

static void *h_alloc(size_t bytes)
{
	void *p = NULL;
	return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}

static void h_free(void *p)
{
	free(p);
}

/* registers a copy's host memory, after checking no other stream's pending copy uses it */
static pending_t *use_host(const void *host, size_t bytes, planrt_stream_t s)
{
	pending_t *u = malloc(sizeof *u);
	u->lo = host;
	u->hi = (const char *)host + bytes;
	u->stream = s;
	pthread_mutex_lock(&pending_lock);
	for (pending_t *p = pending; p; p = p->next)
		if (p->stream != s && p->lo < u->hi && u->lo < p->hi) {
			reuse_races++;
			break;
		}
	u->next = pending;
	pending = u;
	pthread_mutex_unlock(&pending_lock);
	return u;
}

static void h_to_host(void *host, const void *dev, size_t bytes, planrt_stream_t s)
{
	push(s, (item_t){.type = I_COPY, .dst = host, .src = dev, .n = bytes, .use = use_host(host, bytes, s)});
}

static void h_to_device(void *dev, const void *host, size_t bytes, planrt_stream_t s)
{
	push(s, (item_t){.type = I_COPY, .dst = dev, .src = host, .n = bytes, .use = use_host(host, bytes, s)});
}

static planrt_stage_event_t h_event_new(void)
{
	hevent_t *e = calloc(1, sizeof *e);
	pthread_mutex_init(&e->m, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->refs = 1; /* the owner's, dropped by event_free */
	return e;
}

static void h_event_free(planrt_stage_event_t e)
{
	pthread_mutex_lock(&e->m);
	e->freed = 1;
	pthread_mutex_unlock(&e->m);
	ev_unref(e);
}

static void h_record(planrt_stage_event_t e, planrt_stream_t s)
{
	pthread_mutex_lock(&e->m);
	unsigned long ticket = ++e->recorded;
	e->refs++;
	pthread_mutex_unlock(&e->m);
	push(s, (item_t){.type = I_RECORD, .ev = e, .ticket = ticket});
}

static int h_query(planrt_stage_event_t e)
{
	pthread_mutex_lock(&e->m);
	int done = e->reached >= e->recorded;
	pthread_mutex_unlock(&e->m);
	return done;
}

static void h_host_wait(planrt_stage_event_t e)
{
	pthread_mutex_lock(&e->m);
	unsigned long target = e->recorded;
	while (e->reached < target)
		pthread_cond_wait(&e->cv, &e->m);
	pthread_mutex_unlock(&e->m);
}

static void h_stream_wait(planrt_stream_t s, planrt_stage_event_t e)
{
	pthread_mutex_lock(&e->m);
	unsigned long ticket = e->recorded;
	e->refs++;
	pthread_mutex_unlock(&e->m);
	push(s, (item_t){.type = I_WAIT, .ev = e, .ticket = ticket});
}

static void h_gate(planrt_stream_t s, volatile uint32_t *flag, uint32_t value)
{
	push(s, (item_t){.type = I_GATE, .flag = flag, .value = value});
}

static hstream_t *compute, *comm_a, *comm_b, *p2p_send, *p2p_recv;

static planrt_stream_t h_compute(void)
{
	return (planrt_stream_t)compute;
}

static const planrt_stage_ops_t host_ops = {"host threads", h_alloc, h_free, h_to_host, h_to_device, h_event_new,
					    h_event_free, h_record, h_query, h_host_wait, h_stream_wait, h_gate,
					    h_compute, NULL};

static void fn(hstream_t *s, void (*f)(void *), void *arg)
{
	push((planrt_stream_t)s, (item_t){.type = I_FN, .fn = f, .arg = arg});
}

/* the host waits until stream s has run everything enqueued so far */
static void drain(hstream_t *s)
{
	planrt_stage_event_t e = h_event_new();
	h_record(e, (planrt_stream_t)s);
	h_host_wait(e);
	h_event_free(e);
}

/* ------------------------------------------------------------------ checks */

#define EXPECT(cond, ...)                                                                                          \
	do {                                                                                                       \
		if (!(cond) && __atomic_fetch_add(&mismatches, 1, __ATOMIC_RELAXED) < 20) {                        \
			fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);                             \
			fprintf(stderr, __VA_ARGS__);                                                              \
			fputc('\n', stderr);                                                                       \
		}                                                                                                  \
	} while (0)

/* the ranks' mismatches (and staging races) summed; prints the verdict on rank 0 */
static int verdict(const char *what)
{
	pthread_mutex_lock(&pending_lock);
	long races = reuse_races;
	reuse_races = 0;
	pthread_mutex_unlock(&pending_lock);
	EXPECT(races == 0, "%ld copies were enqueued into host memory another stream's pending copy still used", races);
	long total = 0, mine = __atomic_exchange_n(&mismatches, 0, __ATOMIC_RELAXED);
	MPI_Allreduce(&mine, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%s: %s (%ld mismatches over %d ranks)\n", total ? "FAIL" : "ok", what, total, world);
	fflush(stdout);
	return total != 0;
}

static uint64_t bytes_all(planrt_coll_t k)
{
	uint64_t b = 0;
	for (int g = -2; g < 2; g++)
		b += planrt_bytes_sent_by(k, g);
	return b;
}

/* values every dtype holds exactly (small integers, and for the floating types a few binary
 * fractions), so that sums of them are exact in any order: the MPI library may order a
 * reduction differently for in-place and out-of-place calls */
static void fill(void *p, planrt_dtype_t t, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++) {
		double v = (double)((int)((i * 7 + (size_t)seed * 13) % 23) - 11);
		double f = v + (double)((i + (size_t)seed) % 5) * 0.3125 + seed * 0.0009765625;
		switch (t) {
		case planrt_f32: ((float *)p)[i] = (float)f; break;
		case planrt_f64: ((double *)p)[i] = f; break;
		case planrt_bf16:
		case planrt_f16: ((uint16_t *)p)[i] = planrt_f32_to_half_((float)f, t); break;
		case planrt_i32: ((int32_t *)p)[i] = (int32_t)v * 1000 + seed; break;
		case planrt_u8: ((uint8_t *)p)[i] = (uint8_t)(i * 3 + (size_t)seed); break;
		}
	}
}

/* one kind on c: the backend on stream comm_a against the host MPI layer, same inputs */
static void compare(planrt_coll_t kind, planrt_dtype_t t, planrt_op_t op, size_t count, planrt_comm_t c, int in_place,
		    int root)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	size_t es = planrt_dtype_size(t), in_n = count, out_n = count;
	if (kind == planrt_coll_reduce_scatter || kind == planrt_coll_alltoall)
		in_n = count * (size_t)n;
	if (kind == planrt_coll_allgather || kind == planrt_coll_alltoall)
		out_n = count * (size_t)n;
	size_t buf_n = (in_n > out_n ? in_n : out_n) + 8;
	char *dev_in = calloc(buf_n, es), *dev_out = calloc(buf_n, es), *host_in = calloc(buf_n, es),
	     *host_out = calloc(buf_n, es);
	fill(dev_in, t, buf_n, rank + 1);
	fill(host_in, t, buf_n, rank + 1);
	memset(dev_out, 0x5a, buf_n * es);
	memset(host_out, 0x5a, buf_n * es);
	/* in place as NCCL has it: allreduce recv == send; reduce-scatter recv = send + me * count;
	 * allgather send = recv + me * count; broadcast always */
	const void *ds = dev_in, *hs = host_in;
	void *dr = dev_out, *hr = host_out;
	if (in_place && kind == planrt_coll_allreduce)
		dr = dev_in, hr = host_in;
	if (in_place && kind == planrt_coll_reduce_scatter)
		dr = dev_in + (size_t)me * count * es, hr = host_in + (size_t)me * count * es;
	if (in_place && kind == planrt_coll_allgather) {
		memcpy(dev_out + (size_t)me * count * es, dev_in, count * es);
		memcpy(host_out + (size_t)me * count * es, host_in, count * es);
		ds = dev_out + (size_t)me * count * es, hs = host_out + (size_t)me * count * es;
	}
	if (kind == planrt_coll_broadcast)
		dr = dev_in, hr = host_in;
	uint64_t b0 = bytes_all(kind);
	planrt_result_t r1 = planrt_success, r2 = planrt_success;
	planrt_stream_t s = (planrt_stream_t)comm_a;
	switch (kind) {
	case planrt_coll_allreduce: r1 = planrt_allreduce(ds, dr, count, t, op, c, s, NULL); break;
	case planrt_coll_reduce_scatter: r1 = planrt_reduce_scatter(ds, dr, count, t, op, c, s, NULL); break;
	case planrt_coll_allgather: r1 = planrt_allgather(ds, dr, count, t, c, s, NULL); break;
	case planrt_coll_alltoall: r1 = planrt_alltoall(ds, dr, count, t, c, s, NULL); break;
	case planrt_coll_broadcast: r1 = planrt_broadcast(dr, count, t, root, c, s, NULL); break;
	default: break;
	}
	drain(comm_a);
	uint64_t b1 = bytes_all(kind);
	switch (kind) {
	case planrt_coll_allreduce: r2 = planrt_allreduce(hs, hr, count, t, op, c, NULL, NULL); break;
	case planrt_coll_reduce_scatter: r2 = planrt_reduce_scatter(hs, hr, count, t, op, c, NULL, NULL); break;
	case planrt_coll_allgather: r2 = planrt_allgather(hs, hr, count, t, c, NULL, NULL); break;
	case planrt_coll_alltoall: r2 = planrt_alltoall(hs, hr, count, t, c, NULL, NULL); break;
	case planrt_coll_broadcast: r2 = planrt_broadcast(hr, count, t, root, c, NULL, NULL); break;
	default: break;
	}
	uint64_t b2 = bytes_all(kind);
	EXPECT(r1 == planrt_success && r2 == planrt_success, "%s: %s / %s", planrt_coll_name(kind), planrt_error_string(r1),
	       planrt_last_error());
	EXPECT(memcmp(dev_in, host_in, buf_n * es) == 0 && memcmp(dev_out, host_out, buf_n * es) == 0,
	       "%s of %zu %d (in place %d) on %s: the backend's result differs from the MPI layer's",
	       planrt_coll_name(kind), count, (int)t, in_place, planrt_comm_size(c) == world ? "world" : "an axis");
	EXPECT(b1 - b0 == b2 - b1, "%s: the backend counted %llu bytes, the MPI layer %llu", planrt_coll_name(kind),
	       (unsigned long long)(b1 - b0), (unsigned long long)(b2 - b1));
	free(dev_in), free(dev_out), free(host_in), free(host_out);
}

static int test_values(void)
{
	planrt_comm_t w = planrt_world_comm(), a = planrt_axis_comm(0), b = planrt_axis_comm(1);
	const planrt_dtype_t all[] = {planrt_f32, planrt_bf16, planrt_f16, planrt_i32, planrt_f64};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
		compare(planrt_coll_allreduce, all[i], planrt_sum, 1000, w, 0, 0);
		compare(planrt_coll_allreduce, all[i], planrt_sum, 37, a, 1, 0);
		compare(planrt_coll_reduce_scatter, all[i], planrt_sum, 250, w, 0, 0);
		compare(planrt_coll_reduce_scatter, all[i], planrt_sum, 33, b, 1, 0);
	}
	compare(planrt_coll_allreduce, planrt_f32, planrt_max, 513, w, 1, 0);
	compare(planrt_coll_allreduce, planrt_bf16, planrt_max, 64, b, 0, 0);
	compare(planrt_coll_allreduce, planrt_f32, planrt_sum, 300000, w, 1, 0); /* several stages' worth */
	const planrt_dtype_t moved[] = {planrt_f32, planrt_bf16, planrt_i32, planrt_u8, planrt_f64};
	for (size_t i = 0; i < sizeof moved / sizeof *moved; i++) {
		compare(planrt_coll_allgather, moved[i], planrt_sum, 129, w, 0, 0);
		compare(planrt_coll_allgather, moved[i], planrt_sum, 17, a, 1, 0);
		compare(planrt_coll_alltoall, moved[i], planrt_sum, 45, w, 0, 0);
		compare(planrt_coll_broadcast, moved[i], planrt_sum, 77, w, 0, 2);
		compare(planrt_coll_broadcast, moved[i], planrt_sum, 5, b, 0, 1);
	}
	compare(planrt_coll_allreduce, planrt_f32, planrt_sum, 0, w, 0, 0);
	return verdict("values: every collective kind and dtype on the backend equals planrt's MPI layer, bit for bit, "
		       "with the same byte counts");
}

/* alltoallv: variable blocks with gaps between them, against MPI_Alltoallv on the host */
static int test_alltoallv(void)
{
	planrt_comm_t w = planrt_world_comm();
	int n = world;
	int64_t sc[16], sd[16], rc[16], rd[16];
	int64_t at = 0;
	for (int p = 0; p < n; p++) { /* to member p: (rank + 2p) % 5 + 1 elements, a gap of 3 after each */
		sc[p] = (rank + 2 * p) % 5 + 1;
		sd[p] = at;
		at += sc[p] + 3;
	}
	int64_t in_n = at;
	at = 0;
	for (int p = 0; p < n; p++) {
		rc[p] = (p + 2 * rank) % 5 + 1;
		rd[p] = at;
		at += rc[p] + 2;
	}
	int64_t out_n = at;
	float *in = calloc((size_t)in_n, 4), *dev_out = calloc((size_t)out_n, 4), *host_out = calloc((size_t)out_n, 4);
	fill(in, planrt_f32, (size_t)in_n, rank + 3);
	for (int64_t i = 0; i < out_n; i++)
		dev_out[i] = host_out[i] = -1.5f; /* the gaps must keep this */
	uint64_t b0 = planrt_bytes_sent_by(planrt_coll_alltoallv, PLANRT_GROUP_WORLD);
	planrt_result_t r = planrt_alltoallv_on(in, sc, sd, dev_out, rc, rd, planrt_f32, w, (planrt_stream_t)comm_a);
	drain(comm_a);
	uint64_t b1 = planrt_bytes_sent_by(planrt_coll_alltoallv, PLANRT_GROUP_WORLD);
	planrt_result_t r2 = planrt_alltoallv(in, sc, sd, host_out, rc, rd, planrt_f32, w);
	uint64_t b2 = planrt_bytes_sent_by(planrt_coll_alltoallv, PLANRT_GROUP_WORLD);
	EXPECT(r == planrt_success && r2 == planrt_success, "alltoallv: %s", planrt_last_error());
	EXPECT(!memcmp(dev_out, host_out, (size_t)out_n * 4), "alltoallv: the backend's blocks differ from MPI's");
	EXPECT(b1 - b0 == b2 - b1 && b1 > b0, "alltoallv: %llu bytes counted, MPI layer %llu",
	       (unsigned long long)(b1 - b0), (unsigned long long)(b2 - b1));
	free(in), free(dev_out), free(host_out);
	return verdict("alltoallv: variable blocks with gaps, equal to MPI_Alltoallv, the gaps untouched, the same bytes");
}

/* ------------------------------------------------------------------ ordering */

typedef struct iter {
	float *x, *y;
	size_t n;
	int k, members;
	planrt_comm_t c;
	int seed_base;
} iter_t;

/* rank r's value of element i in iteration k */
static float value_of(int k, int r, size_t i)
{
	return (float)((k * 31 + r * 7 + (int)(i % 101)) % 64);
}

static void write_values(const iter_t *it)
{
	for (size_t i = 0; i < it->n; i++)
		it->x[i] = value_of(it->k, it->seed_base, i);
}

/* on the compute stream: the iteration's input (frees arg) */
static void write_input(void *arg)
{
	write_values(arg);
	free(arg);
}

static void check_result(void *arg)
{
	iter_t *it = arg;
	for (size_t i = 0; i < it->n; i++) {
		float want = 0;
		for (int m = 0; m < it->members; m++)
			want += value_of(it->k, m, i); /* member m's seed is its coordinate */
		if (it->y[i] != want) {
			EXPECT(0, "ordering: iteration %d element %zu: %g, not %g (a missing wait or an early copy)", it->k, i,
			       (double)it->y[i], (double)want);
			break;
		}
	}
	free(it);
}

/* the comm stream s runs k allreduces on c while the other stream runs its own on another
 * communicator; each one's input is written by the compute stream, its output read there after
 * planrt_wait. The seed of a member is its coordinate on c's axis, so every member knows the sum. */
static int test_ordering(int iterations)
{
	planrt_comm_t ca = planrt_axis_comm(0), cb = planrt_axis_comm(1);
	size_t n = 4099;
	enum { SLOTS = 3 };
	float *xa[SLOTS], *ya[SLOTS], *xb[SLOTS], *yb[SLOTS];
	for (int i = 0; i < SLOTS; i++) {
		xa[i] = calloc(n, 4), ya[i] = calloc(n, 4), xb[i] = calloc(n, 4), yb[i] = calloc(n, 4);
	}
	planrt_stage_event_t written = h_event_new(), checked[SLOTS];
	for (int i = 0; i < SLOTS; i++)
		checked[i] = h_event_new();
	for (int k = 0; k < iterations; k++) {
		int slot = k % SLOTS;
		/* the slot's previous check has run before its buffers are written again */
		h_host_wait(checked[slot]);
		iter_t *wa = calloc(1, sizeof *wa), *wb = calloc(1, sizeof *wb);
		*wa = (iter_t){xa[slot], ya[slot], n, k, planrt_comm_size(ca), ca, planrt_comm_rank(ca)};
		*wb = (iter_t){xb[slot], yb[slot], n, k + 1000, planrt_comm_size(cb), cb, planrt_comm_rank(cb)};
		iter_t *ca_it = malloc(sizeof *ca_it), *cb_it = malloc(sizeof *cb_it);
		*ca_it = *wa;
		*cb_it = *wb;
		fn(compute, write_input, wa);
		fn(compute, write_input, wb);
		h_record(written, (planrt_stream_t)compute);
		h_stream_wait((planrt_stream_t)comm_a, written);
		h_stream_wait((planrt_stream_t)comm_b, written);
		planrt_request_t qa = NULL, qb = NULL;
		planrt_result_t r1 = planrt_allreduce(xa[slot], ya[slot], n, planrt_f32, planrt_sum, ca, (planrt_stream_t)comm_a, &qa);
		planrt_result_t r2 = planrt_allreduce(xb[slot], yb[slot], n, planrt_f32, planrt_sum, cb, (planrt_stream_t)comm_b, &qb);
		EXPECT(r1 == planrt_success && r2 == planrt_success, "ordering: %s", planrt_last_error());
		/* the compute stream goes on (it may overwrite nothing the operations read: the next
		 * iteration uses the next slot), then waits for the results and checks them */
		EXPECT(planrt_wait(qa) == planrt_success && planrt_wait(qb) == planrt_success, "planrt_wait");
		fn(compute, check_result, ca_it);
		fn(compute, check_result, cb_it);
		h_record(checked[slot], (planrt_stream_t)compute);
	}
	drain(compute);
	drain(comm_a);
	drain(comm_b);
	h_event_free(written);
	for (int i = 0; i < SLOTS; i++) {
		h_event_free(checked[i]);
		free(xa[i]), free(ya[i]), free(xb[i]), free(yb[i]);
	}
	char what[200];
	snprintf(what, sizeof what,
		 "ordering: %d iterations of write, allreduce with a request, planrt_wait, check, on two streams and two "
		 "communicators, with random delays of up to %d us on every stream",
		 iterations, jitter_us);
	return verdict(what);
}

/* many operations in flight on two streams and two communicators at once, enqueued at uneven
 * times with no host wait between them, so that staging buffers are handed from one stream's
 * operation to the other's as soon as the pool lets them go: a stage reused before its
 * operation's copy back has run (say, once the MPI call is done) hands that copy the other
 * operation's data */
static int test_pool(int per_stream)
{
	planrt_comm_t c[2] = {planrt_axis_comm(0), planrt_axis_comm(1)};
	hstream_t *s[2] = {comm_a, comm_b};
	size_t n = 3001;
	float **x = calloc(2 * (size_t)per_stream, sizeof *x), **y = calloc(2 * (size_t)per_stream, sizeof *y);
	unsigned seed = 7u + (unsigned)rank;
	for (int k = 0; k < per_stream; k++)
		for (int j = 0; j < 2; j++) {
			float *in = x[2 * k + j] = malloc(n * 4), *out = y[2 * k + j] = malloc(n * 4);
			for (size_t i = 0; i < n; i++)
				in[i] = value_of(k + 5000 * j, planrt_comm_rank(c[j]), i);
			EXPECT(planrt_allreduce(in, out, n, planrt_f32, planrt_sum, c[j], (planrt_stream_t)s[j], NULL) ==
				       planrt_success,
			       "pool: %s", planrt_last_error());
			usleep((useconds_t)(rand_r(&seed) % 150));
		}
	drain(comm_a);
	drain(comm_b);
	for (int k = 0; k < per_stream; k++)
		for (int j = 0; j < 2; j++) {
			iter_t it = {x[2 * k + j], y[2 * k + j], n, k + 5000 * j, 2, c[j], 0};
			for (size_t i = 0; i < n; i++)
				if (it.y[i] != value_of(it.k, 0, i) + value_of(it.k, 1, i)) {
					EXPECT(0, "pool: operation %d on stream %d: element %zu is %g", k, j, i, (double)it.y[i]);
					break;
				}
			free(x[2 * k + j]), free(y[2 * k + j]);
		}
	free(x), free(y);
	return verdict("pool: operations in flight on two streams share the staging buffers, each reused only after its "
		       "operation's copy back");
}

/* ------------------------------------------------------------------ point to point */

typedef struct p2p_check {
	float *buf;
	size_t n;
	int from, k, tag;
} p2p_check_t;

static void check_p2p(void *arg)
{
	p2p_check_t *c = arg;
	for (size_t i = 0; i < c->n; i++)
		if (c->buf[i] != value_of(c->k + 100 * c->tag, c->from, i)) {
			EXPECT(0, "p2p: message %d tag %d from %d: element %zu is %g", c->k, c->tag, c->from, i, (double)c->buf[i]);
			break;
		}
	free(c);
}

/* on the world as a pipeline axis: tag 0 to the next member, tag 1 to the previous, receives posted
 * ahead on their own stream, sends on another, the compute stream waiting on every request */
static int test_p2p(int messages)
{
	planrt_comm_t w = planrt_world_comm();
	int next = (rank + 1) % world, prev = (rank + world - 1) % world;
	size_t n = 1000;
	enum { SLOTS = 4 };
	float *out[2][SLOTS], *in[2][SLOTS];
	for (int t = 0; t < 2; t++)
		for (int i = 0; i < SLOTS; i++)
			out[t][i] = calloc(n, 4), in[t][i] = calloc(n, 4);
	planrt_stage_event_t used[SLOTS];
	for (int i = 0; i < SLOTS; i++)
		used[i] = h_event_new();
	for (int k = 0; k < messages; k++) {
		int slot = k % SLOTS;
		h_host_wait(used[slot]);
		planrt_request_t rq[2], sq[2];
		for (int tag = 0; tag < 2; tag++) /* receives first: posted ahead */
			EXPECT(planrt_recv_tagged(in[tag][slot], n, planrt_f32, tag == 0 ? prev : next, tag, w,
						  (planrt_stream_t)p2p_recv, &rq[tag]) == planrt_success,
			       "recv: %s", planrt_last_error());
		for (int tag = 0; tag < 2; tag++) {
			iter_t wr = {out[tag][slot], NULL, n, k + 100 * tag, 1, w, rank};
			write_values(&wr); /* the host writes it: the send stream starts after */
			EXPECT(planrt_send_tagged(out[tag][slot], n, planrt_f32, tag == 0 ? next : prev, tag, w,
						  (planrt_stream_t)p2p_send, &sq[tag]) == planrt_success,
			       "send: %s", planrt_last_error());
		}
		for (int tag = 0; tag < 2; tag++) {
			planrt_wait(rq[tag]);
			planrt_wait(sq[tag]);
			p2p_check_t *c = calloc(1, sizeof *c);
			*c = (p2p_check_t){in[tag][slot], n, tag == 0 ? prev : next, k, tag};
			fn(compute, check_p2p, c);
		}
		h_record(used[slot], (planrt_stream_t)compute);
	}
	drain(compute);
	drain(p2p_send);
	drain(p2p_recv);
	for (int i = 0; i < SLOTS; i++) {
		h_event_free(used[i]);
		for (int t = 0; t < 2; t++)
			free(out[t][i]), free(in[t][i]);
	}
	return verdict("p2p: tagged sends and receives on pipeline channel lanes (receives posted ahead), checked after "
		"planrt_wait on the compute stream");
}

/* the values a ring block that started on member origin holds */
typedef struct ring_check {
	const float *buf;
	size_t n;
	int origin, shift;
} ring_check_t;

static void check_ring(void *arg)
{
	ring_check_t *c = arg;
	for (size_t i = 0; i < c->n; i++)
		if (c->buf[i] != (float)(c->origin * 4096 + (int)i)) {
			EXPECT(0, "ring shift %d: element %zu is %g, the block of member %d holds %d", c->shift, i,
			       (double)c->buf[i], c->origin, c->origin * 4096 + (int)i);
			break;
		}
	free(c);
}

/* A context-parallel ring on the world, composed as runtime/cuda/exec_cuda.cu's
 * planrt_cu_ring_shift_start composes it: each shift receives from the previous member on a stream
 * of its own (p2p_recv) after the point the comm stream has reached, sends to the next member on the
 * comm stream (comm_a), and the comm stream then waits for the receive; the next shift sends the
 * block just received, so after t shifts member r holds the block member (r - t) mod n started with.
 * The compute stream checks each block after planrt_wait; the receive stream waits for that check
 * before a later receive overwrites the buffer, and nothing but the receive's own wait orders the
 * comm stream's next send after it. Tags 0 and 1 alternate: the
 * ring's messages ride the channel lanes (by tag and sender parity). drop_wait: the comm stream does
 * not wait for the receive, so a shift can send a block before it has arrived; must mismatch. */
static int test_ring(int shifts, int drop_wait)
{
	planrt_comm_t w = planrt_world_comm();
	int next = (rank + 1) % world, prev = (rank + world - 1) % world;
	size_t n = 4000;
	float *buf[2] = {calloc(n, 4), calloc(n, 4)};
	for (size_t i = 0; i < n; i++)
		buf[0][i] = (float)(rank * 4096 + (int)i);
	planrt_stage_event_t ready = h_event_new(), received = h_event_new(), checked = h_event_new();
	for (int t = 1; t <= shifts; t++) {
		float *send = buf[(t - 1) % 2], *recv = buf[t % 2];
		planrt_request_t rq, sq;
		h_stream_wait((planrt_stream_t)p2p_recv, checked);
		h_record(ready, (planrt_stream_t)comm_a);
		h_stream_wait((planrt_stream_t)p2p_recv, ready);
		EXPECT(planrt_recv_tagged(recv, n, planrt_f32, prev, t % 2, w, (planrt_stream_t)p2p_recv, &rq) ==
			       planrt_success,
		       "recv: %s", planrt_last_error());
		EXPECT(planrt_send_tagged(send, n, planrt_f32, next, t % 2, w, (planrt_stream_t)comm_a, &sq) == planrt_success,
		       "send: %s", planrt_last_error());
		if (!drop_wait) {
			h_record(received, (planrt_stream_t)p2p_recv);
			h_stream_wait((planrt_stream_t)comm_a, received);
		}
		planrt_wait(rq);
		planrt_wait(sq);
		ring_check_t *c = calloc(1, sizeof *c);
		*c = (ring_check_t){recv, n, ((rank - t) % world + world) % world, t};
		fn(compute, check_ring, c);
		h_record(checked, (planrt_stream_t)compute);
	}
	drain(compute);
	drain(comm_a);
	drain(p2p_recv);
	h_event_free(ready), h_event_free(received), h_event_free(checked);
	free(buf[0]), free(buf[1]);
	const char *what = "ring: K/V shifts around the world, receives on their own stream, the comm stream waiting for "
			   "each, blocks checked after planrt_wait";
	if (!drop_wait)
		return verdict(what);
	long total = 0, mine = __atomic_exchange_n(&mismatches, 0, __ATOMIC_RELAXED);
	MPI_Allreduce(&mine, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%s: ring with the comm stream not waiting for the receive must send stale blocks (%ld "
		       "mismatches over %d ranks)\n", total ? "ok" : "FAIL", total, world);
	fflush(stdout);
	return total == 0;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
	int provided;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	if (planrt_init(&argc, &argv, &rank, &world) != planrt_success) {
		fprintf(stderr, "planrt_init: %s\n", planrt_last_error());
		return 1;
	}
	if (world != 4) {
		if (rank == 0)
			fprintf(stderr, "test_comm_staged runs on 4 ranks (mpirun -np 4), not %d\n", world);
		return 1;
	}
	const int sizes[2] = {2, 2};
	const char *names[2] = {"a", "b"};
	PLANRT_CHECK(planrt_mesh_init(2, sizes, names));
	const char *j = getenv("STAGED_JITTER_US");
	if (j)
		jitter_us = atoi(j);
	compute = stream_new(11u + 17u * (unsigned)rank);
	comm_a = stream_new(23u + 29u * (unsigned)rank);
	comm_b = stream_new(31u + 37u * (unsigned)rank);
	p2p_send = stream_new(41u + 43u * (unsigned)rank);
	p2p_recv = stream_new(47u + 53u * (unsigned)rank);
	PLANRT_CHECK(planrt_staged_start_(&host_ops));
	planrt_comm_layer_set_(&planrt_staged_layer_);
	PLANRT_CHECK(planrt_staged_add_(planrt_world_comm(), 2, 2));
	PLANRT_CHECK(planrt_staged_add_(planrt_axis_comm(0), 0, 0));
	PLANRT_CHECK(planrt_staged_add_(planrt_axis_comm(1), 0, 0));
	int fail = 0;
	if (argc > 1 && !strcmp(argv[1], "watchdog")) {
		/* rank 1 never joins: the others' allreduce must be reported by the watchdog */
		float x[4] = {1, 2, 3, 4};
		if (rank != 1)
			planrt_allreduce(x, x, 4, planrt_f32, planrt_sum, planrt_world_comm(), (planrt_stream_t)comm_a, NULL);
		sleep(30);
		return 1;
	}
	int iterations = argc > 1 ? atoi(argv[1]) : 150;
	fail |= test_values();
	fail |= test_alltoallv();
	fail |= test_ordering(iterations);
	fail |= test_pool(iterations);
	fail |= test_p2p(iterations / 2);
	fail |= test_ring(iterations / 2, 0);
	fail |= test_ring(iterations / 2, 1);
	planrt_staged_stop_();
	size_t peak = planrt_staged_host_peak_();
	if (rank == 0)
		printf("staging memory at most %zu bytes\n", peak);
	stream_end(compute), stream_end(comm_a), stream_end(comm_b), stream_end(p2p_send), stream_end(p2p_recv);
	planrt_finalize();
	MPI_Finalize();
	return fail; /* verdict's totals are the same on every rank */
}
