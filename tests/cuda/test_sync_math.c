/* test_sync_math.c (mpirun -np 4): the per-element logic of the CUDA target's sync-strategy kernels
 * (runtime/include/planrt_sync_math.h, which runtime/cuda/sync_cuda.cu runs on the device) run here on the CPU,
 * composed the way sync_cuda.cu composes it (the same block layouts, orders and strides), against
 * the CPU runtime's kernels on random inputs, bit for bit:
 *   the half types    every bf16 and f16 value widened, and f32 values (random bits, the rounding
 *                     boundaries, subnormals, infinities, NaN) narrowed: planrt.c's conversions;
 *   compress_cast     bf16 and f16 wires, with and without error feedback, all-reduce (a length not
 *                     divisible by the ranks: the tail path) and ZeRO 1's reduce-scatter: the
 *                     device's all-to-all blocks summed in rank order and rounded once, against
 *                     compress.c over MPI (values whose f32 sums are exact in any order, so MPI's
 *                     tree order cannot matter: docs/gpu.md);
 *   compress_topk     segments with many ties, with and without error feedback: the bit-by-bit
 *                     threshold, the kept pairs in index order (against compress.c's message) and
 *                     the rank-by-rank sum;
 *   compress_powersgd the orthonormalisation and the residual update (the GEMMs and sums are the
 *                     CPU's here: on the device they are cuBLAS's and NCCL's);
 *   local_average     plain, outer SGD, outer Nesterov, with the loss history;
 *   async             the master's staleness verdict against planrt_async_gather's (run before MPI
 *                     starts, in a child process per case: the CPU's verdict is planrt_fatal);
 *   fp16              the loss-scale verdict and coefficient against planrt_unscale_clip_coef.
 * Mismatches are counted per rank and summed over the world; the exit status is 1 when any. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_program.h"
#include "planrt_sync_math.h"

static int rank, world;
static long mismatches;

static uint64_t rng_state;
static uint64_t next_random(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void seed(uint64_t s)
{
	rng_state = 0x9E3779B97F4A7C15ull ^ (s * 0xD1B54A32D192ED03ull);
	if (!rng_state)
		rng_state = 1;
	for (int i = 0; i < 4; i++)
		next_random();
}

/* uniform in [-1, 1) times 2^e, e in [-emax, emax] */
static float random_float(int emax)
{
	double u = (double)(next_random() >> 11) * 0x1p-53 * 2 - 1;
	int e = (int)(next_random() % (uint64_t)(2 * emax + 1)) - emax;
	return (float)ldexp(u, e);
}

static void fail(const char *what, long i, double want, double got)
{
	if (mismatches++ < 10)
		fprintf(stderr, "rank %d: %s: element %ld: the CPU kernel gives %.9g, the shared logic %.9g\n", rank, what, i,
			want, got);
}

static void compare(const char *what, const float *want, const float *got, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		if (memcmp(&want[i], &got[i], 4))
			fail(what, (long)i, want[i], got[i]);
}

/* ------------------------------------------------------------------ the half types */

static void test_conversions(void)
{
	for (int t = PLANRT_SM_BF16; t <= PLANRT_SM_F16; t++) {
		for (uint32_t h = 0; h < 65536; h++) {
			float want = planrt_half_to_f32_((uint16_t)h, (planrt_dtype_t)t), got = sm_widen((uint16_t)h, t);
			if (memcmp(&want, &got, 4))
				fail(t == PLANRT_SM_BF16 ? "bf16 widen" : "f16 widen", (long)h, want, got);
		}
		static const uint32_t edges[] = {0,          0x80000000u, 1,          0x007fffffu, 0x00800000u, 0x33000000u,
						 0x33000001u, 0x32ffffffu, 0x33800000u, 0x33c00000u, 0x387fffffu, 0x38800000u,
						 0x38801000u, 0x38802000u, 0x38803000u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
						 0x47800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
						 0xffc00001u, 0x3f808000u, 0x3f818000u, 0x3f807fffu};
		int64_t count = 1 << 20;
		for (int64_t i = 0; i < count + (int64_t)(sizeof edges / sizeof edges[0]); i++) {
			uint32_t u = i < count ? (uint32_t)next_random() : edges[i - count];
			if (i < count && i % 3 == 0) /* the f16 range, where most of its cases are */
				u = (u & 0x80000000u) | (0x33000000u + (u % (0x47800000u - 0x33000000u)));
			float x;
			memcpy(&x, &u, 4);
			uint16_t want = planrt_f32_to_half_(x, (planrt_dtype_t)t), got = sm_narrow(x, t);
			if (want != got)
				fail(t == PLANRT_SM_BF16 ? "bf16 narrow" : "f16 narrow", (long)u, want, got);
		}
	}
}

/* ------------------------------------------------------------------ compress_cast */

static void cast_inputs(int r, int64_t n, float *g, float *res)
{
	seed(1000 + (uint64_t)r);
	/* multiples of 2^-10 below 32 after the residual: the halves are too, and any f32 sum of four
	 * of them is exact, whatever the order */
	for (int64_t i = 0; i < n; i++) {
		g[i] = (float)((int64_t)(next_random() % 8192) - 4096) * 0x1p-8f;
		if (res)
			res[i] = (float)((int)(next_random() % 65) - 32) * 0x1p-10f;
	}
}

static void test_compress_cast(int t, int64_t n, int64_t chunk, int feedback)
{
	float *g = malloc(sizeof(float) * (size_t)n), *res = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	uint16_t *wire = malloc(2 * (size_t)n);
	cast_inputs(rank, n, g, res);
	planrt_compress_cast(g, n, (planrt_dtype_t)t, res, wire, chunk, planrt_world_comm());

	/* the device: every rank's narrowed message (q) and the residuals */
	uint16_t *q = malloc(2 * (size_t)n * (size_t)world);
	float *mine = malloc(sizeof(float) * (size_t)n), *mres = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	float *x = malloc(sizeof(float) * (size_t)n), *xr = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	for (int r = 0; r < world; r++) {
		cast_inputs(r, n, x, xr);
		for (int64_t i = 0; i < n; i++)
			q[(size_t)r * (size_t)n + (size_t)i] = sm_feedback_narrow(&x[i], xr ? &xr[i] : NULL, t);
		if (r == rank) {
			memcpy(mine, x, sizeof(float) * (size_t)n);
			if (feedback)
				memcpy(mres, xr, sizeof(float) * (size_t)n);
		}
	}
	if (feedback)
		compare("compress_cast residual", res, mres, n);
	/* the all-to-all: rank p receives block p of every rank's q, at recv[r * block] */
	int64_t block = chunk ? chunk : n / world, whole = block * world, tail = n - whole;
	uint16_t *result = malloc(2 * (size_t)n);
	uint16_t *recv = malloc(2 * (size_t)(world * (block > tail ? block : tail) + 1));
	for (int p = 0; p < world; p++) {
		for (int r = 0; r < world; r++)
			memcpy(recv + (size_t)r * (size_t)block, q + (size_t)r * (size_t)n + (size_t)p * (size_t)block,
			       2 * (size_t)block);
		for (int64_t j = 0; j < block; j++)
			result[p * block + j] = sm_sum_halves(recv + j, block, world, t);
	}
	if (!chunk && tail) {
		for (int r = 0; r < world; r++)
			memcpy(recv + (size_t)r * (size_t)tail, q + (size_t)r * (size_t)n + (size_t)whole, 2 * (size_t)tail);
		for (int64_t j = 0; j < tail; j++)
			result[whole + j] = sm_sum_halves(recv + j, tail, world, t);
	}
	int64_t lo = chunk ? rank * chunk : 0, len = chunk ? chunk : n;
	for (int64_t i = lo; i < lo + len; i++)
		x[i] = sm_widen(result[i], t);
	compare(t == PLANRT_SM_BF16 ? "compress_cast bf16 sum" : "compress_cast f16 sum", g + lo, x + lo, len);
	(void)mine;
	free(g), free(res), free(wire), free(q), free(mine), free(mres), free(x), free(xr), free(result), free(recv);
}

/* ------------------------------------------------------------------ compress_topk */

enum { TOPK_SEGS = 5 };
static const int64_t topk_len[TOPK_SEGS] = {7, 1000, 1, 333, 4096}, topk_k[TOPK_SEGS] = {3, 17, 1, 333, 41};

static void topk_inputs(int r, int64_t n, float *g, float *res)
{
	seed(2000 + (uint64_t)r);
	for (int64_t i = 0; i < n; i++) {
		/* the first three segments take a few levels (many ties at the threshold), the others
		 * distinct values */
		if (i < topk_len[0] + topk_len[1] + topk_len[2])
			g[i] = (float)((int)(next_random() % 9) - 4) * 0.25f;
		else
			g[i] = random_float(3);
		if (res)
			res[i] = next_random() % 3 ? 0.0f : (float)((int)(next_random() % 5) - 2) * 0.25f;
	}
}

/* the device's pairs of one rank (topk_kernel, sequentially): returns the count written */
static int64_t device_topk(float *v, float *res, const int64_t *off, int32_t *pairs)
{
	int64_t at = 0;
	for (int s = 0; s < TOPK_SEGS; s++) {
		float *x = v + off[s], *rx = res ? res + off[s] : NULL;
		int64_t len = topk_len[s], k = topk_k[s];
		for (int64_t i = 0; rx && i < len; i++)
			x[i] = sm_add(x[i], rx[i]);
		uint32_t thr = 0;
		for (int bit = 31; bit >= 0; bit--) {
			uint32_t cand = sm_kth_candidate(thr, bit);
			int64_t count = 0;
			for (int64_t i = 0; i < len; i++)
				count += sm_magnitude_bits(x[i]) >= cand;
			thr = sm_kth_step(thr, bit, count, k);
		}
		int64_t above = 0, tie_rank = 0;
		for (int64_t i = 0; i < len; i++)
			above += sm_magnitude_bits(x[i]) > thr;
		for (int64_t i = 0; i < len; i++) {
			uint32_t a = sm_magnitude_bits(x[i]);
			int keep = sm_topk_keep(a, thr, tie_rank, k - above);
			tie_rank += a == thr;
			if (keep) {
				pairs[2 * at] = (int32_t)sm_bits(x[i]);
				pairs[2 * at + 1] = (int32_t)(off[s] + i);
				at++;
				if (rx)
					rx[i] = 0;
			} else if (rx) {
				rx[i] = x[i];
			}
		}
	}
	return at;
}

static void test_compress_topk(int feedback)
{
	int64_t off[TOPK_SEGS], n = 0, kept = 0;
	for (int s = 0; s < TOPK_SEGS; s++) {
		off[s] = n;
		n += topk_len[s];
		kept += topk_k[s];
	}
	float *g = malloc(sizeof(float) * (size_t)n), *res = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	size_t scratch_bytes = 4 * ((size_t)(2 * kept * (world + 1)) + (size_t)n);
	int32_t *scratch = malloc(scratch_bytes);
	topk_inputs(rank, n, g, res);
	planrt_compress_topk(g, TOPK_SEGS, off, topk_len, topk_k, res, scratch, planrt_world_comm());

	float *x = malloc(sizeof(float) * (size_t)n), *xr = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	float *sum = calloc((size_t)n, sizeof(float));
	int32_t *pairs = malloc(sizeof(int32_t) * 2 * (size_t)kept);
	for (int r = 0; r < world; r++) { /* rank by rank, as scatter_add_kernel's launches */
		topk_inputs(r, n, x, xr);
		int64_t got = device_topk(x, xr, off, pairs);
		if (got != kept)
			fail("compress_topk pair count", r, (double)kept, (double)got);
		if (r == rank) {
			for (int64_t e = 0; e < 2 * kept; e++)
				if (scratch[e] != pairs[e])
					fail("compress_topk message", (long)e, scratch[e], pairs[e]);
			if (feedback)
				compare("compress_topk residual", res, xr, n);
		}
		for (int64_t e = 0; e < kept; e++)
			sum[pairs[2 * e + 1]] = sm_add(sum[pairs[2 * e + 1]], sm_float((uint32_t)pairs[2 * e]));
	}
	compare("compress_topk sum", g, sum, n);
	free(g), free(res), free(scratch), free(x), free(xr), free(sum), free(pairs);
}

/* ------------------------------------------------------------------ compress_powersgd */

enum { PSGD_SEGS = 4, PSGD_R = 3 };
static const int64_t psgd_rows[PSGD_SEGS] = {40, 17, 64, 9}, psgd_cols[PSGD_SEGS] = {24, 0, 32, 5};

static void psgd_inputs(int64_t n, int64_t nq, float *g, float *res, float *q)
{
	seed(3000 + (uint64_t)rank);
	for (int64_t i = 0; i < n; i++) {
		g[i] = random_float(2);
		if (res)
			res[i] = random_float(2) * 0.01f;
	}
	seed(3999); /* Q is the same on every rank */
	for (int64_t i = 0; i < nq; i++)
		q[i] = random_float(1);
}

static void test_compress_powersgd(int feedback)
{
	int64_t off[PSGD_SEGS], n = 0, nq = 0, np = 0, nd = 0;
	for (int s = 0; s < PSGD_SEGS; s++) {
		off[s] = n;
		n += psgd_rows[s] * (psgd_cols[s] ? psgd_cols[s] : 1);
		nq += psgd_cols[s] * PSGD_R;
		np += psgd_cols[s] ? psgd_rows[s] * PSGD_R : 0;
		nd += psgd_cols[s] ? 0 : psgd_rows[s];
	}
	float *g = malloc(sizeof(float) * (size_t)n), *res = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	float *q = malloc(sizeof(float) * (size_t)nq), *scratch = malloc(sizeof(float) * (size_t)(np + nd));
	psgd_inputs(n, nq, g, res, q);
	planrt_compress_powersgd(g, PSGD_SEGS, off, psgd_rows, psgd_cols, PSGD_R, q, res, scratch, planrt_world_comm());

	/* sync_cuda.cu's sequence, with the CPU's GEMMs and MPI's sums in place of cuBLAS and NCCL */
	float *x = malloc(sizeof(float) * (size_t)n), *xr = feedback ? malloc(sizeof(float) * (size_t)n) : NULL;
	float *xq = malloc(sizeof(float) * (size_t)nq), *P = malloc(sizeof(float) * (size_t)(np + nd)), *D = P + np;
	psgd_inputs(n, nq, x, xr, xq);
	int64_t pp = 0, qq = 0, dd = 0;
	for (int s = 0; s < PSGD_SEGS; s++) {
		float *m = x + off[s];
		if (!psgd_cols[s]) {
			memcpy(D + dd, m, sizeof(float) * (size_t)psgd_rows[s]);
			dd += psgd_rows[s];
			continue;
		}
		for (int64_t i = 0; xr && i < psgd_rows[s] * psgd_cols[s]; i++)
			m[i] = sm_add(m[i], xr[off[s] + i]);
		planrt_k_matmul_f32(1, psgd_rows[s], PSGD_R, psgd_cols[s], m, 0, 0, xq + qq, 0, 0, P + pp, 0, 0);
		pp += psgd_rows[s] * PSGD_R;
		qq += psgd_cols[s] * PSGD_R;
	}
	PLANRT_CHECK(planrt_allreduce(P, P, (size_t)np, planrt_f32, planrt_sum, planrt_world_comm(), NULL, NULL));
	pp = qq = 0;
	for (int s = 0; s < PSGD_SEGS; s++)
		if (psgd_cols[s]) {
			sm_orthonormalise(P + pp, psgd_rows[s], PSGD_R);
			planrt_k_matmul_f32(1, psgd_cols[s], PSGD_R, psgd_rows[s], x + off[s], 1, 0, P + pp, 0, 0, xq + qq, 0, 0);
			pp += psgd_rows[s] * PSGD_R;
			qq += psgd_cols[s] * PSGD_R;
		}
	PLANRT_CHECK(planrt_allreduce(xq, xq, (size_t)nq, planrt_f32, planrt_sum, planrt_world_comm(), NULL, NULL));
	float share = 1.0f / (float)world;
	pp = qq = 0;
	for (int s = 0; s < PSGD_SEGS; s++)
		if (psgd_cols[s]) {
			int64_t len = psgd_rows[s] * psgd_cols[s];
			float *m = x + off[s];
			if (xr)
				memcpy(xr + off[s], m, sizeof(float) * (size_t)len);
			planrt_k_matmul_f32(1, psgd_rows[s], psgd_cols[s], PSGD_R, P + pp, 0, 0, xq + qq, 1, 0, m, 0, 0);
			for (int64_t i = 0; xr && i < len; i++)
				xr[off[s] + i] = sm_powersgd_residual(xr[off[s] + i], m[i], share);
			pp += psgd_rows[s] * PSGD_R;
			qq += psgd_cols[s] * PSGD_R;
		}
	PLANRT_CHECK(planrt_allreduce(D, D, (size_t)nd, planrt_f32, planrt_sum, planrt_world_comm(), NULL, NULL));
	dd = 0;
	for (int s = 0; s < PSGD_SEGS; s++)
		if (!psgd_cols[s]) {
			memcpy(x + off[s], D + dd, sizeof(float) * (size_t)psgd_rows[s]);
			dd += psgd_rows[s];
		}
	compare("compress_powersgd gradient", g, x, n);
	compare("compress_powersgd q", q, xq, nq);
	if (feedback)
		compare("compress_powersgd residual", res, xr, n);
	free(g), free(res), free(q), free(scratch), free(x), free(xr), free(xq), free(P);
}

/* ------------------------------------------------------------------ local_average */

static void average_inputs(int64_t n, float *flat, float *anchor, float *momentum)
{
	seed(4000 + (uint64_t)rank);
	for (int64_t i = 0; i < n; i++)
		flat[i] = random_float(3);
	seed(4999); /* the anchor and the momentum are the same on every rank */
	for (int64_t i = 0; i < n; i++) {
		anchor[i] = random_float(3);
		momentum[i] = random_float(1);
	}
}

static void test_local_average(int outer, int with_momentum)
{
	enum { N = 777, EVERY = 3 };
	float flat[N], anchor[N], momentum[N], x[N], xa[N], xm[N];
	double history[EVERY] = {0}, loss = 1.5 + rank;
	planrt_ctx_t ctx;
	memset(&ctx, 0, sizeof ctx);
	ctx.step = EVERY - 1;
	ctx.steps = 10;
	average_inputs(N, flat, anchor, momentum);
	planrt_local_average(&ctx, EVERY, flat, N, planrt_f32, NULL, planrt_f32, &loss, history, planrt_world_comm(),
			     outer, 0.7, 0.9, outer ? anchor : NULL, outer && with_momentum ? momentum : NULL);
	average_inputs(N, x, xa, xm);
	PLANRT_CHECK(planrt_allreduce(x, x, N, planrt_f32, planrt_sum, planrt_world_comm(), NULL, NULL));
	for (int i = 0; i < N; i++)
		x[i] = sm_local_average(x[i], (float)world, outer, 0.7f, 0.9f, outer ? &xa[i] : NULL,
					outer && with_momentum ? &xm[i] : NULL);
	compare("local_average parameters", flat, x, N);
	if (outer)
		compare("local_average anchor", anchor, xa, N);
	if (outer && with_momentum)
		compare("local_average momentum", momentum, xm, N);
	double want = 0;
	for (int r = 0; r < world; r++)
		want += 1.5 + r;
	if (history[EVERY - 1] != want)
		fail("local_average loss history", EVERY - 1, want, history[EVERY - 1]);
}

/* ------------------------------------------------------------------ async */

/* Every (step, staleness, version) of a small grid: a child process gives planrt_async_gather one
 * worker's message with that version; the CPU refuses it when the child exits with status 1. Runs
 * before MPI starts (planrt_fatal then exits without aborting the job). Returns the mismatches. */
static long test_async_staleness(void)
{
	long found = 0;
	for (int64_t step = 0; step < 6; step++)
		for (int staleness = 0; staleness < 4; staleness++)
			for (int v = -1; v < 9; v++) {
				double version = v + (v == 7 ? 0.5 : 0.0); /* a fractional one too */
				pid_t pid = fork();
				if (pid == 0) {
					if (!freopen("/dev/null", "w", stderr))
						_exit(3);
					float grads[1] = {0}, inbox[1 + 4] = {1.0f};
					double tail[2] = {0.25, version}, loss = 0, versions[2];
					memcpy(inbox + 1, tail, sizeof tail);
					planrt_ctx_t ctx;
					memset(&ctx, 0, sizeof ctx);
					ctx.step = step;
					ctx.steps = 100;
					planrt_async_gather(&ctx, staleness, grads, 1, planrt_f32, inbox, 1, &loss, versions);
					_exit(0);
				}
				int status = 0;
				if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) > 1) {
					fprintf(stderr, "async staleness: the child process for step %lld failed to run\n", (long long)step);
					found++;
					continue;
				}
				int cpu = WEXITSTATUS(status) == 1, shared = sm_async_too_stale(version, step, staleness);
				if (cpu != shared && found++ < 10)
					fprintf(stderr, "async staleness: step %lld, staleness %d, version %g: the CPU %s, the shared rule %s\n",
						(long long)step, staleness, version, cpu ? "refuses" : "accepts", shared ? "refuses" : "accepts");
			}
	return found;
}

/* ------------------------------------------------------------------ fp16 loss scaling */

static void test_unscale_clip(void)
{
	static const double specials[] = {0, INFINITY, NAN, 1e308, 4e-320, 1.0};
	seed(5000);
	for (int i = 0; i < 20000; i++) {
		double sumsq = i < 6 ? specials[i] : ldexp((double)(next_random() >> 11) * 0x1p-53, (int)(next_random() % 200) - 60);
		double scale = ldexp(1.0, (int)(next_random() % 32)), max_norm = i % 4 ? ldexp(1.0, (int)(next_random() % 12) - 4) : 0;
		planrt_ctx_t ctx;
		memset(&ctx, 0, sizeof ctx);
		ctx.loss_scale = scale;
		double norm = 0, coef = 0, snorm = 0, scoef = 0;
		planrt_unscale_clip_coef(&ctx, &sumsq, &norm, &coef, max_norm);
		int skipped = sm_unscale_clip(sumsq, scale, max_norm, &snorm, &scoef);
		if (skipped != ctx.step_skipped)
			fail("unscale_clip verdict", i, ctx.step_skipped, skipped);
		if (memcmp(&norm, &snorm, 8) && !(isnan(norm) && isnan(snorm)))
			fail("unscale_clip norm", i, norm, snorm);
		if (memcmp(&coef, &scoef, 8) && !(isnan(coef) && isnan(scoef)))
			fail("unscale_clip coefficient", i, coef, scoef);
	}
}

int main(int argc, char **argv)
{
	long stale_found = test_async_staleness(); /* before MPI: each rank runs it; rank 0 reports */
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world != 4) {
		if (rank == 0)
			fprintf(stderr, "test_sync_math runs on 4 ranks (mpirun -np 4), not %d\n", world);
		planrt_finalize();
		return 1;
	}
	long before = 0;
	struct {
		const char *name;
		long found;
	} report[16];
	int nreport = 0;
#define RUN(title, call)                                                                                    \
	do {                                                                                                \
		call;                                                                                       \
		report[nreport].name = title;                                                               \
		report[nreport++].found = mismatches - before;                                              \
		before = mismatches;                                                                        \
	} while (0)
	seed(1);
	RUN("half-type conversions", test_conversions());
	RUN("compress_cast bf16 all-reduce (n mod 4 = 3)", test_compress_cast(PLANRT_SM_BF16, 1003, 0, 0));
	RUN("compress_cast f16 all-reduce, error feedback", test_compress_cast(PLANRT_SM_F16, 1003, 0, 1));
	RUN("compress_cast bf16 reduce-scatter, error feedback", test_compress_cast(PLANRT_SM_BF16, 1000, 250, 1));
	RUN("compress_cast f16 reduce-scatter", test_compress_cast(PLANRT_SM_F16, 1000, 250, 0));
	RUN("compress_topk", test_compress_topk(0));
	RUN("compress_topk, error feedback", test_compress_topk(1));
	RUN("compress_powersgd", test_compress_powersgd(0));
	RUN("compress_powersgd, error feedback", test_compress_powersgd(1));
	RUN("local_average", test_local_average(0, 0));
	RUN("local_average, outer SGD", test_local_average(1, 0));
	RUN("local_average, outer SGD with momentum", test_local_average(1, 1));
	RUN("local_average, outer Nesterov", test_local_average(2, 1));
	RUN("fp16 loss-scale rule", test_unscale_clip());
	RUN("async staleness verdict", mismatches += stale_found);
	int failed = 0;
	for (int i = 0; i < nreport; i++) {
		long total = 0;
		MPI_Allreduce(&report[i].found, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0)
			printf("%s: %s (%ld mismatches over 4 ranks)\n", total ? "FAIL" : "ok", report[i].name, total);
		failed |= total != 0;
	}
	planrt_finalize();
	return failed;
}
