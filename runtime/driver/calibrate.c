/* calibrate.c: the measurements behind `planc calibrate` (issue 20; planrt_calibrate.h).
 *
 * explain's step-time estimate prices each kernel by a roofline of a device model: matmuls at a
 * FLOP rate, the fused attention at its own rate, element-wise kernels at a memory bandwidth,
 * collectives by a link's bus bandwidth and latency. The named devices are data-sheet figures;
 * this file measures the same quantities with the code the generated programs run:
 *   - planrt_k_matmul_f32 (OpenBLAS) on square and transformer-shaped GEMMs;
 *   - y = a x + y over arrays far larger than the caches (the bytes explain counts for a fused
 *     loop: every operand once);
 *   - planrt_k_attention_f32 and its gradient, causal, at two head dims: the rate of its products
 *     and each computed score's own cost (the row work), forward and backward, as explain prices them;
 *   - planrt's dropout over an array the caches hold: the rate of its mask draws;
 *   - a tiny GEMM and a tiny element-wise add through planrt, whose time is almost all the fixed
 *     cost of a call (the device model's kernel.latency, which a roofline leaves out);
 *   - planrt_allreduce / reduce_scatter / allgather / send+recv by message size, within a node
 *     (the ranks sharing memory) and between nodes (one rank per node and local index), when the
 *     launch spans several.
 * Every rank measures at the same time (a barrier before each timing) and each figure is the
 * slowest rank's: a rank's rate while all the others run, which is what a step sees, also on a
 * machine with more ranks than cores. Each timing is the median of three batches of calls that
 * together run for a minimum time. */
#include "planrt.h"
#include "planrt_calibrate.h"
#include "planrt_cpu.h"
#include "planrt_kernels.h"
#include "planrt_outfile.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double min_seconds; /* how long each timing runs at least */

static void *calib_alloc(size_t bytes)
{
	void *p = calloc(1, bytes);
	if (!p)
		planrt_fatal("planc calibrate: cannot allocate %zu bytes", bytes);
	return p;
}

/* The slowest rank's seconds per call of fn(arg), over comm: every rank runs it the same number
 * of times (rank 0's count, agreed before timing), after one warm-up call. The count fills a
 * third of min_seconds, and the figure is the median of three such batches: on a machine that
 * other work shares (the test suite's two cores), one batch that lost its core for a time slice
 * does not move it, where a single batch's time did (planc calibrate --quick beside the suite
 * once measured the attention's backward row work below nothing, which is written as 0). */
static double timed(MPI_Comm comm, void (*fn)(void *), void *arg)
{
	fn(arg);
	long reps = 1;
	double batch[3];
	int done = 0;
	for (;;) { /* rank 0 finds how many calls take a third of min_seconds; every rank runs that many */
		MPI_Barrier(comm);
		double t0 = planrt_now();
		for (long i = 0; i < reps; i++)
			fn(arg);
		double dt = planrt_now() - t0, slowest;
		MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
		if (done || slowest >= min_seconds / 3 || reps >= 1L << 24) {
			batch[done++] = slowest / (double)reps;
			if (done == 3)
				break;
			continue;
		}
		reps *= slowest > 0 ? (long)(min_seconds / 3 / slowest * 1.2) + 1 : 16;
	}
	double lo = batch[0] < batch[1] ? batch[0] : batch[1], hi = batch[0] < batch[1] ? batch[1] : batch[0];
	return batch[2] < lo ? lo : batch[2] > hi ? hi : batch[2];
}

/* ---------------------------------------------------------------- compute */

typedef struct Gemm {
	int64_t m, n, k;
	float *a, *b, *c;
} Gemm;

static void run_gemm(void *arg)
{
	Gemm *g = arg;
	planrt_k_matmul_f32(1, g->m, g->n, g->k, g->a, 0, 0, g->b, 0, 0, g->c, 0, 0);
}

static void measure_gemms(planrt_calibration_t *c, int quick)
{
	/* square, then a transformer layer's shapes (tokens x D x D and tokens x 4D x D), then the small
	 * ones of a micro-batch of a small model (64 tokens, D = 128; its backward's D x D weight
	 * gradient over 64 tokens), whose operands weigh more against their products: planc fits a
	 * GEMM's seconds as its FLOPs at one rate plus its operands' bytes at another (compiler/
	 * calibrate.c), and needs shapes of both kinds for it */
	static const int64_t full[][3] = {{256, 256, 256}, {1024, 1024, 1024}, {2048, 512, 512}, {2048, 2048, 512},
					  {4096, 1024, 1024}, {64, 128, 128}, {128, 512, 128}, {512, 512, 64}};
	static const int64_t small[][3] = {{64, 64, 64}, {128, 128, 128}, {256, 128, 128}, {64, 256, 64}};
	const int64_t(*shapes)[3] = quick ? small : full;
	c->ngemms = quick ? 4 : 8;
	for (int i = 0; i < c->ngemms; i++) {
		Gemm g = {shapes[i][0], shapes[i][1], shapes[i][2], NULL, NULL, NULL};
		g.a = calib_alloc(sizeof(float) * (size_t)(g.m * g.k));
		g.b = calib_alloc(sizeof(float) * (size_t)(g.k * g.n));
		g.c = calib_alloc(sizeof(float) * (size_t)(g.m * g.n));
		for (int64_t j = 0; j < g.m * g.k; j++)
			g.a[j] = (float)(j % 7) * 0.25f;
		for (int64_t j = 0; j < g.k * g.n; j++)
			g.b[j] = (float)(j % 5) * 0.5f;
		double s = timed(MPI_COMM_WORLD, run_gemm, &g);
		memcpy(c->gemm_mnk[i], shapes[i], sizeof c->gemm_mnk[i]);
		c->gemm_rate[i] = 2.0 * (double)g.m * (double)g.n * (double)g.k / s;
		free(g.a);
		free(g.b);
		free(g.c);
	}
}

typedef struct Axpy {
	int64_t n;
	float *x, *y;
} Axpy;

static void run_axpy(void *arg)
{
	Axpy *a = arg;
	for (int64_t i = 0; i < a->n; i++)
		a->y[i] = 0.999f * a->x[i] + a->y[i] * 0.5f;
}

static double measure_memory(int quick)
{
	Axpy a = {quick ? 1 << 20 : 1 << 24, NULL, NULL}; /* 4 MiB or 64 MiB per array */
	a.x = calib_alloc(sizeof(float) * (size_t)a.n);
	a.y = calib_alloc(sizeof(float) * (size_t)a.n);
	double s = timed(MPI_COMM_WORLD, run_axpy, &a);
	free(a.x);
	free(a.y);
	return 3.0 * sizeof(float) * (double)a.n / s; /* x read, y read and written */
}

typedef struct Attn {
	int64_t ldims[4]; /* batch 1, heads, seq, head dim */
	float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
	void *scratch;
} Attn;

static void run_attention_forward(void *arg)
{
	Attn *a = arg;
	int64_t h = a->ldims[1], s = a->ldims[2];
	int64_t gdims[4] = {1, h, s, s}, offs[8] = {0, 0, 0, 0, 0, h / 2, s / 2, a->ldims[3] / 2};
	planrt_k_attention_f32(a->q, a->k, a->v, NULL, NULL, a->out, a->lse, 4, a->ldims, h, s, 1.0 / 8.0, 1, 0, 0, 0,
			       gdims, offs, a->scratch);
}

static void run_attention(void *arg)
{
	Attn *a = arg;
	int64_t h = a->ldims[1], s = a->ldims[2];
	int64_t gdims[4] = {1, h, s, s}, offs[8] = {0, 0, 0, 0, 0, h / 2, s / 2, a->ldims[3] / 2};
	run_attention_forward(a);
	planrt_k_attention_grad_f32(a->q, a->k, a->v, NULL, NULL, a->out, a->lse, a->dout, a->dq, a->dk, a->dv, 4,
				    a->ldims, h, s, 1.0 / 8.0, 1, 0, 0, 0, gdims, offs, a->scratch);
}

/* Seconds of the forward alone and of forward + backward, causal, 4 heads of s rows, head dim dh. */
static void time_attention(int64_t s, int64_t dh, double *forward, double *both)
{
	Attn a = {.ldims = {1, 4, s, dh}};
	size_t n = (size_t)(a.ldims[1] * a.ldims[2] * a.ldims[3]), rows = (size_t)(a.ldims[1] * a.ldims[2]);
	float **bufs[] = {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
		*bufs[i] = calib_alloc(sizeof(float) * n);
		for (size_t j = 0; j < n; j++)
			(*bufs[i])[j] = (float)((j * 2654435761u + i) % 1000) * 1e-3f - 0.5f;
	}
	a.lse = calib_alloc(sizeof(float) * rows);
	/* ATTN_SCRATCH_FLOATS(dh) (cpu/attention_impl.h) */
	a.scratch = calib_alloc(sizeof(float) * (3 * PLANRT_ATTN_TILE * PLANRT_ATTN_TILE + 3 * PLANRT_ATTN_TILE * (size_t)dh +
						  3 * PLANRT_ATTN_TILE));
	*forward = timed(MPI_COMM_WORLD, run_attention_forward, &a);
	*both = timed(MPI_COMM_WORLD, run_attention, &a);
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		free(*bufs[i]);
	free(a.lse);
	free(a.scratch);
}

/* The fused attention's time is linear in the head dim at a given number of scores: each
 * computed score costs its products (2 dh FLOPs a product; 2 forward, 5 backward) at the GEMM
 * kernel's rate, and row work of its own (exp, max, sum, mask, scale) that does not grow with dh.
 * Measured here (2 cores, S 64-1024, dh 16-128): 0.82 ns forward and 0.75 ns backward a computed
 * score besides the products, which is a quarter of the time at dh 32 and an eighth at dh 64, so
 * one rate at one head dim misprices the others. Two head dims give both terms. The computed
 * scores: under the causal mask every tile with an unmasked score runs whole, (n + 1) / 2n of
 * them for n tiles of the sequence (S = 64: all of them, not half). */
static void measure_attention(planrt_calibration_t *c, int quick)
{
	const int64_t s = quick ? 128 : 1024, heads = 4, lo = 16, hi = 64, t = PLANRT_ATTN_TILE;
	double computed = 0; /* scores of the 4 heads the kernel computes */
	for (int64_t r0 = 0; r0 < s; r0 += t) {
		int64_t rows = s - r0 < t ? s - r0 : t, keys = r0 + t < s ? r0 + t : s;
		computed += (double)(heads * rows * keys);
	}
	double f_lo, b_lo, f_hi, b_hi;
	time_attention(s, lo, &f_lo, &b_lo);
	time_attention(s, hi, &f_hi, &b_hi);
	double per_dh = 2.0 * (2 + 5) * computed; /* FLOPs of both directions per unit of dh */
	double rate = b_hi > b_lo ? per_dh * (double)(hi - lo) / (b_hi - b_lo) : per_dh * (double)hi / b_hi;
	double fwd = f_lo / computed - 2.0 * 2 * (double)lo / rate, bwd = (b_lo - f_lo) / computed - 2.0 * 5 * (double)lo / rate;
	c->attention_rate = rate;
	c->attention_score[0] = fwd > 0 ? fwd : 0;
	c->attention_score[1] = bwd > 0 ? bwd : 0;
	c->attention_tile = (int)t;
}

/* Dropout's mask draws: planrt's f32 dropout (p = 0.1) over 64 Ki floats, which the caches hold,
 * so its time is the Philox blocks (one per 4 elements), not its bytes, which memory.* prices. In
 * mask elements per second. */
enum { DROPOUT_ELEMS = 1 << 16 };

typedef struct Drop {
	float *x, *y;
	uint8_t *mask;
	uint64_t seed;
} Drop;

static void run_dropout(void *arg)
{
	Drop *d = arg;
	static const int64_t dims[1] = {DROPOUT_ELEMS}, offs[1] = {0};
	planrt_k_dropout_f32(d->x, d->y, d->mask, 0.1, d->seed++, 7, 1, dims, dims, offs);
}

static double measure_dropout(void)
{
	Drop d = {calib_alloc(sizeof(float) * DROPOUT_ELEMS), calib_alloc(sizeof(float) * DROPOUT_ELEMS),
		  calib_alloc(DROPOUT_ELEMS), 1};
	for (int i = 0; i < DROPOUT_ELEMS; i++)
		d.x[i] = (float)(i % 11) * 0.125f;
	double s = timed(MPI_COMM_WORLD, run_dropout, &d);
	free(d.x);
	free(d.y);
	free(d.mask);
	return DROPOUT_ELEMS / s;
}

/* A kernel's fixed cost: the mean of a tiny GEMM (OpenBLAS's call and set-up) and a tiny
 * element-wise add (planrt's kernel dispatch), less nothing: their FLOPs and bytes take a few
 * nanoseconds at the rates above. */
typedef struct Tiny {
	float a[64], b[64], c[64];
} Tiny;

static void run_tiny(void *arg)
{
	Tiny *t = arg;
	static const int64_t dims[1] = {64}, unit[1] = {1};
	planrt_k_matmul_f32(1, 8, 8, 8, t->a, 0, 0, t->b, 0, 0, t->c, 0, 0);
	planrt_k_binary_f32(PLANRT_ADD, 1, dims, t->a, unit, t->c, unit, t->b);
}

static double measure_launch(void)
{
	Tiny t;
	for (int i = 0; i < 64; i++)
		t.a[i] = t.b[i] = t.c[i] = (float)(i % 9) * 0.125f;
	return timed(MPI_COMM_WORLD, run_tiny, &t) / 2;
}

/* ---------------------------------------------------------------- collectives */

typedef struct Coll {
	planrt_comm_t comm;
	int kind; /* 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 send+recv around the ring */
	size_t count;
	float *send, *recv;
} Coll;

static void run_collective(void *arg)
{
	Coll *c = arg;
	int n = planrt_comm_size(c->comm), me = planrt_comm_rank(c->comm);
	switch (c->kind) {
	case 0:
		PLANRT_CHECK(planrt_allreduce(c->send, c->recv, c->count, planrt_f32, planrt_sum, c->comm, NULL, NULL));
		break;
	case 1:
		PLANRT_CHECK(planrt_reduce_scatter(c->send, c->recv, c->count / (size_t)n, planrt_f32, planrt_sum, c->comm, NULL,
					    NULL));
		break;
	case 2:
		PLANRT_CHECK(planrt_allgather(c->send, c->recv, c->count / (size_t)n, planrt_f32, c->comm, NULL, NULL));
		break;
	default: {
		planrt_request_t rq;
		PLANRT_CHECK(planrt_recv(c->recv, c->count, planrt_f32, (me + n - 1) % n, c->comm, NULL, &rq));
		PLANRT_CHECK(planrt_send(c->send, c->count, planrt_f32, (me + 1) % n, c->comm, NULL, NULL));
		PLANRT_CHECK(planrt_wait(rq));
	}
	}
}

/* The link through comm (its size > 1), on every rank of the world (ranks outside comm's kind of
 * group measure their own group of the same kind at the same time). */
static void measure_link(planrt_calib_link_t *l, planrt_comm_t comm, MPI_Comm timing, int quick)
{
	int n = planrt_comm_size(comm);
	size_t largest = quick ? (size_t)1 << 18 : (size_t)1 << 24; /* floats: 1 MiB or 64 MiB */
	Coll c = {comm, 0, 1, calib_alloc(sizeof(float) * largest), calib_alloc(sizeof(float) * largest)};
	l->ranks = n;
	l->latency = timed(timing, run_collective, &c);
	l->nsizes = 0;
	for (size_t count = 1024; count <= largest && l->nsizes < PLANRT_CALIB_SIZES; count *= 4) {
		c.count = count;
		l->bytes[l->nsizes] = (double)count * sizeof(float);
		l->allreduce_s[l->nsizes] = timed(timing, run_collective, &c);
		l->nsizes++;
	}
	double bytes = (double)largest * sizeof(float), share = (double)(n - 1) / n;
	/* the best size's bus bandwidth: the link's rate where a message's latency no longer counts (as
	 * matmul.* takes the best GEMM). Not the largest size's alone: on a machine with more ranks than
	 * cores, 4 ranks' 64 MiB all-reduce ran at 0.2 GB/s where 1-16 MiB ran at 1.6-1.8 GB/s, and the
	 * programs' messages are the smaller ones (docs/search.md) */
	l->allreduce_busbw = 0;
	for (int i = 0; i < l->nsizes; i++)
		if (2 * share * l->bytes[i] / l->allreduce_s[i] > l->allreduce_busbw)
			l->allreduce_busbw = 2 * share * l->bytes[i] / l->allreduce_s[i];
	c.count = largest - largest % (size_t)n;
	c.kind = 1;
	l->reduce_scatter_busbw = share * (double)c.count * sizeof(float) / timed(timing, run_collective, &c);
	c.kind = 2;
	l->allgather_busbw = share * (double)c.count * sizeof(float) / timed(timing, run_collective, &c);
	c.kind = 3;
	c.count = largest;
	l->sendrecv_busbw = bytes / timed(timing, run_collective, &c);
	free(c.send);
	free(c.recv);
}

/* ---------------------------------------------------------------- the measurement */

/* Ranks per node (those sharing memory with this one) and whether the launch numbered them node
 * by node (world rank = node * ranks per node + local index), which the mesh below needs. */
static int node_layout(int world_rank, int *node_ranks)
{
	MPI_Comm local;
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &local);
	int lsize, lrank;
	MPI_Comm_size(local, &lsize);
	MPI_Comm_rank(local, &lrank);
	MPI_Comm_free(&local);
	int mine = world_rank == (world_rank / lsize) * lsize + lrank, all;
	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	MPI_Allreduce(&lsize, node_ranks, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	int most;
	MPI_Allreduce(&lsize, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	return all && most == *node_ranks;
}

static void measure_links(planrt_calibration_t *c, int quick)
{
	if (c->ranks < 2)
		return;
	if (c->nodes == 1) {
		measure_link(&c->node, planrt_world_comm(), MPI_COMM_WORLD, quick);
		return;
	}
	const int sizes[2] = {c->nodes, c->node_ranks};
	const char *const names[2] = {"node", "local"};
	PLANRT_CHECK(planrt_mesh_init(2, sizes, names));
	if (c->node_ranks > 1)
		measure_link(&c->node, planrt_axis_comm(1), MPI_COMM_WORLD, quick);
	measure_link(&c->net, planrt_axis_comm(0), MPI_COMM_WORLD, quick);
}

int planrt_calibrate(planrt_calibration_t *c, const char *out_path, int quick, char *why, int nwhy)
{
	memset(c, 0, sizeof *c);
	int rank, world;
	planrt_result_t r = planrt_init(NULL, NULL, &rank, &world);
	if (r != planrt_success) {
		snprintf(why, (size_t)nwhy, "%s", planrt_last_error());
		return -1;
	}
	int ok = 1;
	if (rank == 0)
		ok = planrt_outfile_check("-o", out_path, why, (size_t)nwhy) == 0;
	MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
	if (!ok) {
		if (rank != 0)
			snprintf(why, (size_t)nwhy, "rank 0 cannot write %s", out_path);
		return -1;
	}
	PLANRT_CHECK(planrt_cpu_select());
	min_seconds = quick ? 0.02 : 0.25;
	c->ranks = world;
	int numbered = node_layout(rank, &c->node_ranks);
	c->nodes = numbered ? world / c->node_ranks : 1;
	if (!numbered)
		c->node_ranks = world; /* one link measured over all ranks */
	gethostname(c->host, sizeof c->host - 1);
	double loads[1] = {0};
	if (getloadavg(loads, 1) == 1)
		c->load = loads[0];
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	c->capacity = pages > 0 && page > 0 ? (double)pages * (double)page / c->node_ranks : 0;
	measure_gemms(c, quick);
	c->memory_bw = measure_memory(quick);
	measure_attention(c, quick);
	c->launch = measure_launch();
	c->dropout_rate = measure_dropout();
	measure_links(c, quick);
	return rank;
}

void planrt_calibrate_end(void)
{
	planrt_finalize();
}
