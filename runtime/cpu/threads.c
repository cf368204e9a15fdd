/* threads.c: the threads a rank runs planrt's own CPU kernels on (planrt_cpu.h), and the check that
 * the rank may run that many at all.
 *
 * How many. The same setting as OpenBLAS's threads, read in OpenBLAS's order: OPENBLAS_NUM_THREADS,
 * else GOTO_NUM_THREADS, else OMP_NUM_THREADS; unset, one thread (one rank per core, the MPI way).
 * So `OPENBLAS_NUM_THREADS=2 mpirun --bind-to none -np 1 ./prog` runs its GEMMs and its kernels on
 * two threads. PLANRT_NUM_THREADS, when set, sets planrt's threads alone (OpenBLAS keeps its own).
 *
 * The pool. planrt_threads_start starts THREADS - 1 workers once; planrt_parallel_for splits
 * [0, n) into THREADS contiguous chunks by a fixed rule (chunk t is [n t / T, n (t + 1) / T)), runs
 * chunk 0 on the calling thread and the others on the workers, and returns when all are done.
 * Kernels split only over independent outputs (rows, heads, elements), and each output is computed
 * by the same code in the same order whichever thread runs it, so results are bit for bit the same
 * for every planrt thread count (OpenBLAS's own thread count changes its GEMMs' last bits, as in
 * any program that uses it). Idle workers block on a condition variable (no spinning: eight ranks on
 * two cores stay usable). With one thread nothing is started and planrt_parallel_for is a call.
 * While a split kernel runs, OpenBLAS is held to one thread (the tile GEMMs of the fused attention
 * run inside the chunks), at every pool size, one included, and set back after.
 *
 * The affinity check. mpirun binds each rank to one core when it starts two ranks or fewer
 * (OpenMPI's --bind-to core default), so a rank's second thread shares the first one's core and
 * gains nothing. planrt_threads_start compares the threads asked for with the CPUs in the rank's
 * affinity mask and, on rank 0, warns with the fix (docs/cpu.md, "Threads"). */
#define _GNU_SOURCE
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_cpu.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS's; weak references, NULL with another BLAS */
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int) __attribute__((weak));

#define MAX_THREADS 256

/* PLANRT_NUM_THREADS sets planrt's threads alone; the others are OpenBLAS's, in its order */
static const char *const settings[] = {"PLANRT_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
				       "OMP_NUM_THREADS"};

typedef struct {
	void *buf;
	size_t bytes;
} scratch_t;

static struct {
	int threads; /* 1 until planrt_threads_start starts the workers */
	const char *setting; /* the variable the count came from, NULL: the default */
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	unsigned long generation; /* bumped per job; a worker runs each generation once */
	int pending;              /* workers still running the job */
	int busy;                 /* a call holds the pool (one at a time; another runs inline) */
	planrt_chunk_fn fn;
	void *ctx;
	int64_t n;
	scratch_t scratch[MAX_THREADS];
} pool = {.threads = 1, .lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER,
	  .done = PTHREAD_COND_INITIALIZER};

static __thread int inside_pool; /* a worker, or the caller while its job runs: nested calls run inline */
static __thread int this_thread;  /* the pool's index of this thread (0: the rank's own) */

/* The thread count the environment asks for (1 when unset), or -1 with the cause in err. */
static int requested_threads(const char **setting, char *err, size_t n)
{
	for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
		const char *v = getenv(settings[i]);
		if (!v || !*v)
			continue;
		char *end;
		errno = 0;
		long t = strtol(v, &end, 10);
		if (errno || *end || t < 1 || t > MAX_THREADS) {
			snprintf(err, n, "%s=%s: not a thread count; set it to a whole number from 1 to %d", settings[i], v,
				 MAX_THREADS);
			return -1;
		}
		*setting = settings[i];
		return (int)t;
	}
	*setting = NULL;
	return 1;
}

static void run_chunk(int t, planrt_chunk_fn fn, void *ctx, int64_t n, int threads)
{
	int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
	if (lo < hi)
		fn(ctx, lo, hi, t);
}

static void *worker_main(void *arg)
{
	int t = (int)(intptr_t)arg;
	unsigned long seen = 0;
	inside_pool = 1;
	this_thread = t;
	for (;;) {
		pthread_mutex_lock(&pool.lock);
		while (pool.generation == seen)
			pthread_cond_wait(&pool.work, &pool.lock);
		seen = pool.generation;
		planrt_chunk_fn fn = pool.fn;
		void *ctx = pool.ctx;
		int64_t n = pool.n;
		int threads = pool.threads;
		pthread_mutex_unlock(&pool.lock);
		run_chunk(t, fn, ctx, n, threads);
		pthread_mutex_lock(&pool.lock);
		if (--pool.pending == 0)
			pthread_cond_signal(&pool.done);
		pthread_mutex_unlock(&pool.lock);
	}
	return NULL;
}

/* the CPUs this process may run on (its affinity mask), 0 when unknown */
static int affinity_cpus(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

static void check_affinity(int rank, int threads, const char *setting)
{
	int cpus = affinity_cpus();
	if (rank != 0 || threads <= 1 || cpus <= 0 || threads <= cpus)
		return;
	fprintf(stderr,
		"planrt: warning: %s=%d asks for %d threads per rank but rank 0 may run on %d CPU%s only (its affinity "
		"mask; mpirun binds each rank to one core when it starts 2 ranks or fewer), so its threads share "
		"%s: launch with mpirun --bind-to none, or --map-by slot:PE=%d to give each rank %d cores\n",
		setting, threads, threads, cpus, cpus == 1 ? "" : "s", cpus == 1 ? "one core" : "those", threads, threads);
}

planrt_result_t planrt_threads_start(int rank)
{
	char err[256];
	const char *setting;
	int threads = requested_threads(&setting, err, sizeof err);
	if (threads < 0)
		return planrt_error_(planrt_invalid_argument, "%s", err);
	if (pool.threads > 1 || threads == 1)
		return planrt_success; /* started already, or nothing to start */
	check_affinity(rank, threads, setting);
	for (int t = 1; t < threads; t++) {
		pthread_t id;
		if (pthread_create(&id, NULL, worker_main, (void *)(intptr_t)t) != 0)
			return planrt_error_(planrt_system_error, "cannot start planrt's thread %d of %d (%s=%d): %s", t + 1,
					     threads, setting, threads, strerror(errno));
		pthread_detach(id);
	}
	pool.threads = threads;
	pool.setting = setting;
	return planrt_success;
}

int planrt_threads(void)
{
	return pool.threads;
}

void planrt_threads_describe(char *buf, size_t n)
{
	char err[256];
	const char *setting;
	int threads = pool.threads > 1 ? pool.threads : requested_threads(&setting, err, sizeof err);
	if (threads < 0) {
		snprintf(buf, n, "%s", err);
		return;
	}
	if (pool.threads > 1)
		setting = pool.setting;
	snprintf(buf, n, "%d per rank for planrt's kernels (%s%s; OPENBLAS_NUM_THREADS or OMP_NUM_THREADS sets "
		 "OpenBLAS's and planrt's, PLANRT_NUM_THREADS planrt's alone; with more than one, launch with mpirun "
		 "--bind-to none)",
		 threads, setting ? setting : "the default", setting ? " set" : "");
}

void planrt_parallel_for(int64_t n, planrt_chunk_fn fn, void *ctx)
{
	if (n <= 0)
		return;
	if (inside_pool) { /* a nested call: this thread runs it all */
		fn(ctx, 0, n, this_thread);
		return;
	}
	if (__atomic_exchange_n(&pool.busy, 1, __ATOMIC_ACQUIRE)) { /* another thread's call holds the pool */
		fn(ctx, 0, n, 0); /* thread 0's scratch is the call's own */
		return;
	}
	int blas = openblas_get_num_threads && openblas_set_num_threads ? openblas_get_num_threads() : 1;
	if (blas > 1) /* the chunks' GEMMs on one thread each, whatever the pool's size: the same bits */
		openblas_set_num_threads(1);
	inside_pool = 1;
	if (pool.threads == 1 || n == 1) {
		fn(ctx, 0, n, 0);
	} else {
		pthread_mutex_lock(&pool.lock);
		pool.fn = fn;
		pool.ctx = ctx;
		pool.n = n;
		pool.pending = pool.threads - 1;
		pool.generation++;
		pthread_cond_broadcast(&pool.work);
		pthread_mutex_unlock(&pool.lock);
		run_chunk(0, fn, ctx, n, pool.threads);
		pthread_mutex_lock(&pool.lock);
		while (pool.pending > 0)
			pthread_cond_wait(&pool.done, &pool.lock);
		pthread_mutex_unlock(&pool.lock);
	}
	inside_pool = 0;
	if (blas > 1)
		openblas_set_num_threads(blas);
	__atomic_store_n(&pool.busy, 0, __ATOMIC_RELEASE);
}

void *planrt_thread_scratch(int thread, size_t bytes)
{
	if (thread < 0 || thread >= MAX_THREADS)
		planrt_fatal("internal error: thread %d out of range", thread);
	scratch_t *s = &pool.scratch[thread];
	if (s->bytes < bytes) {
		free(s->buf);
		s->buf = malloc(bytes);
		if (!s->buf)
			planrt_fatal("out of memory for %zu bytes of thread %d's scratch", bytes, thread);
		s->bytes = bytes;
	}
	return s->buf;
}
