/* test_sync_kernels.c (mpirun -np 4): the kernels of the sync strategies against a reference
 * computed here, on every rank, from every rank's data (each rank draws all four from the same
 * seed), with no collective and no BLAS.
 * Local SGD (runtime/comm/sync.c): the average only every K steps and after the last; the replicas'
 * mean, the losses summed; DiLoCo's outer step (torch.optim.SGD with Nesterov momentum on
 * anchor - average) and plain SGD with lr 1 (the average itself); the cast to bf16 parameters.
 * The compressors of runtime/comm/compress.c:
 *   bf16 / fp16   the sum of the four rounded gradients rounded once (exact in double here), the
 *                 error-feedback residual v - round(v) bitwise, and the ZeRO-1 reduce-scatter's
 *                 chunk;
 *   topk          each rank's k largest magnitudes found by sorting (ties: lower index), summed
 *                 rank by rank; the residual holds exactly the entries not kept;
 *   powersgd      one power iteration in double: P = sum M_r Q, Gram-Schmidt, Q' = sum M_r^T P,
 *                 M ~ P Q'^T, within 1e-4 of the largest entry; the vectors summed exactly; the
 *                 residual M_r - M~ / 4; and a rank-r matrix is reproduced (power iteration finds
 *                 its range).
 * Also the byte counters: each call's traffic is the size of what it sends (bf16: 2 bytes an
 * element; top-k: 8 bytes a kept entry, all-gathered; PowerSGD: the factors).
 * Mismatches are summed over the world, so every rank reaches the same verdict. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_program.h"

#include "../kernels/report.h"

enum { RANKS = 4 };

static int rank;

static uint64_t state;
static double uniform(void) /* [-1, 1) */
{
	state ^= state << 13;
	state ^= state >> 7;
	state ^= state << 17;
	return (double)(state >> 11) * 0x1p-53 * 2 - 1;
}

/* g[r][i]: rank r's gradient, the same draw on every rank: magnitudes in [0.5, 16), so that the
 * sum of four half-precision values is exact in f32 whatever the order */
static void gradients(float g[RANKS][4096], int64_t n, uint64_t seed)
{
	state = seed;
	for (int r = 0; r < RANKS; r++)
		for (int64_t i = 0; i < n; i++) {
			double u = uniform();
			g[r][i] = (float)((u < 0 ? -1 : 1) * (0.5 + 0.5 * fabs(uniform())) * ldexp(1, (int)(fabs(u) * 4)));
		}
}

/* every rank's verdict: true when no rank failed */
static int all_ok(int ok)
{
	int bad = !ok, sum = 0;
	MPI_Allreduce(&bad, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	return sum == 0;
}

static float g[RANKS][4096];

static void test_cast(planrt_dtype_t wire, const char *name)
{
	const int64_t n = 1000;
	gradients(g, n, 11 + (uint64_t)wire);
	float grad[1000], res[1000];
	uint16_t scratch[1000];
	memcpy(grad, g[rank], sizeof grad);
	memset(res, 0, sizeof res);
	uint64_t before = planrt_bytes_sent_by(planrt_coll_allreduce, PLANRT_GROUP_WORLD);
	planrt_compress_cast(grad, n, wire, res, scratch, 0, planrt_world_comm());
	uint64_t bytes = planrt_bytes_sent_by(planrt_coll_allreduce, PLANRT_GROUP_WORLD) - before;
	int ok = bytes == (uint64_t)(2 * 2 * (RANKS - 1) * (2 * n) + RANKS) / (2 * RANKS);
	for (int64_t i = 0; i < n; i++) {
		double sum = 0;
		for (int r = 0; r < RANKS; r++)
			sum += planrt_half_to_f32_(planrt_f32_to_half_(g[r][i], wire), wire);
		float want = planrt_half_to_f32_(planrt_f32_to_half_((float)sum, wire), wire);
		float mine = planrt_half_to_f32_(planrt_f32_to_half_(g[rank][i], wire), wire);
		ok = ok && grad[i] == want && res[i] == g[rank][i] - mine;
	}
	report(all_ok(ok), "%s: the sum of the rounded gradients rounded once; residual v - round(v); 2 bytes a value",
	       name);
	/* ZeRO 1: this rank's chunk of the reduce-scatter, no error feedback */
	memcpy(grad, g[rank], sizeof grad);
	planrt_compress_cast(grad, n, wire, NULL, scratch, n / RANKS, planrt_world_comm());
	ok = 1;
	for (int64_t i = rank * (n / RANKS); i < (rank + 1) * (n / RANKS); i++) {
		double sum = 0;
		for (int r = 0; r < RANKS; r++)
			sum += planrt_half_to_f32_(planrt_f32_to_half_(g[r][i], wire), wire);
		ok = ok && grad[i] == planrt_half_to_f32_(planrt_f32_to_half_((float)sum, wire), wire);
	}
	report(all_ok(ok), "%s reduce-scatter: this rank's chunk of the sum", name);
}

/* the k largest |x| of x[0, n), ties to the lower index, as a mask (a sort, not a selection) */
static int cmp_desc(const void *a, const void *b)
{
	const double *x = a, *y = b; /* (|value|, -index) pairs */
	return x[0] < y[0] ? 1 : x[0] > y[0] ? -1 : x[1] < y[1] ? 1 : x[1] > y[1] ? -1 : 0;
}

static void top_mask(const float *x, int64_t n, int64_t k, char *mask)
{
	double(*pairs)[2] = malloc(sizeof *pairs * (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		pairs[i][0] = fabs((double)x[i]);
		pairs[i][1] = -(double)i;
	}
	qsort(pairs, (size_t)n, sizeof *pairs, cmp_desc);
	memset(mask, 0, (size_t)n);
	for (int64_t j = 0; j < k; j++)
		mask[(int64_t)-pairs[j][1]] = 1;
	free(pairs);
}

static void test_topk(void)
{
	const int64_t off[2] = {0, 600}, len[2] = {600, 400}, k[2] = {13, 7}, n = 1000;
	gradients(g, n, 7);
	for (int r = 0; r < RANKS; r++) /* ties: equal magnitudes at several indices */
		g[r][10] = g[r][20] = g[r][30] = r == 1 ? -1000.0f : 1000.0f;
	float grad[1000], res[1000];
	static unsigned char scratch[4 * (2 * 20 * (RANKS + 1) + 1000)];
	memcpy(grad, g[rank], sizeof grad);
	memset(res, 0, sizeof res);
	uint64_t before = planrt_bytes_sent_by(planrt_coll_allgather, PLANRT_GROUP_WORLD);
	planrt_compress_topk(grad, 2, off, len, k, res, scratch, planrt_world_comm());
	uint64_t bytes = planrt_bytes_sent_by(planrt_coll_allgather, PLANRT_GROUP_WORLD) - before;
	double want[1000] = {0};
	char mask[1000], mine[1000];
	for (int r = 0; r < RANKS; r++)
		for (int s = 0; s < 2; s++) {
			top_mask(g[r] + off[s], len[s], k[s], mask + off[s]);
			for (int64_t i = off[s]; i < off[s] + len[s]; i++)
				if (mask[i])
					want[i] += g[r][i];
			if (r == rank)
				memcpy(mine + off[s], mask + off[s], (size_t)len[s]);
		}
	int ok = bytes == (uint64_t)((RANKS - 1) * RANKS * 2 * 20 * 4 / RANKS), ok_res = 1;
	for (int64_t i = 0; i < n; i++) {
		ok = ok && fabs(grad[i] - want[i]) <= 1e-6 * fabs(want[i]);
		ok_res = ok_res && res[i] == (mine[i] ? 0.0f : g[rank][i]);
	}
	report(all_ok(ok), "topk: every rank's largest entries per tensor summed (ties to the lower index); 8 bytes an "
			   "entry, all-gathered");
	report(all_ok(ok_res), "topk: the residual holds exactly the entries not sent");
	/* error feedback: the next step sends what was left */
	memcpy(grad, g[rank], sizeof grad);
	for (int64_t i = 0; i < n; i++)
		grad[i] = 0;
	planrt_compress_topk(grad, 2, off, len, k, res, scratch, planrt_world_comm());
	ok = 1;
	for (int64_t i = 0; i < n; i++)
		ok = ok && (mine[i] ? res[i] == 0 : 1);
	report(all_ok(ok), "topk: a residual entry once sent is zero");
}

/* Gram-Schmidt in double, as the definition */
static void gram_schmidt(double *p, int64_t rows, int r)
{
	for (int j = 0; j < r; j++) {
		for (int k = 0; k < j; k++) {
			double dot = 0;
			for (int64_t i = 0; i < rows; i++)
				dot += p[i * r + j] * p[i * r + k];
			for (int64_t i = 0; i < rows; i++)
				p[i * r + j] -= dot * p[i * r + k];
		}
		double norm = 0;
		for (int64_t i = 0; i < rows; i++)
			norm += p[i * r + j] * p[i * r + j];
		for (int64_t i = 0; i < rows; i++)
			p[i * r + j] /= sqrt(norm) + 1e-8;
	}
}

static void test_powersgd(int low_rank)
{
	enum { ROWS = 24, COLS = 16, R = 3, VEC = 40 };
	const int64_t off[2] = {0, ROWS * COLS}, rows[2] = {ROWS, VEC}, cols[2] = {COLS, 0};
	const int64_t n = ROWS * COLS + VEC;
	gradients(g, n, 99 + (uint64_t)low_rank);
	if (low_rank) /* every rank's matrix of rank R: the sum has rank <= R and is found exactly */
		for (int r = 0; r < RANKS; r++)
			for (int i = 0; i < ROWS; i++)
				for (int j = 0; j < COLS; j++) {
					double x = 0;
					for (int t = 0; t < R; t++)
						x += cos(0.3 * (i + 1) * (t + 1)) * sin(0.7 * (j + 2) * (t + r + 1));
					g[r][i * COLS + j] = (float)x;
				}
	float q[COLS * R], q0[COLS * R], grad[ROWS * COLS + VEC], res[ROWS * COLS + VEC], scratch[ROWS * R + VEC];
	state = 5;
	for (int i = 0; i < COLS * R; i++)
		q[i] = q0[i] = (float)uniform();
	memcpy(grad, g[rank], sizeof(float) * (size_t)n);
	memset(res, 0, sizeof res);
	uint64_t before = planrt_bytes_sent_by(planrt_coll_allreduce, PLANRT_GROUP_WORLD);
	planrt_compress_powersgd(grad, 2, off, rows, cols, R, q, res, scratch, planrt_world_comm());
	uint64_t bytes = planrt_bytes_sent_by(planrt_coll_allreduce, PLANRT_GROUP_WORLD) - before;
	static double P[ROWS * R], Q[COLS * R], approx[ROWS * COLS], sum[ROWS * COLS];
	memset(P, 0, sizeof P);
	memset(Q, 0, sizeof Q);
	for (int r = 0; r < RANKS; r++)
		for (int i = 0; i < ROWS; i++)
			for (int t = 0; t < R; t++)
				for (int j = 0; j < COLS; j++)
					P[i * R + t] += (double)g[r][i * COLS + j] * q0[j * R + t];
	gram_schmidt(P, ROWS, R);
	for (int r = 0; r < RANKS; r++)
		for (int j = 0; j < COLS; j++)
			for (int t = 0; t < R; t++)
				for (int i = 0; i < ROWS; i++)
					Q[j * R + t] += (double)g[r][i * COLS + j] * P[i * R + t];
	double big = 0, worst = 0, worst_res = 0, worst_sum = 0;
	for (int i = 0; i < ROWS; i++)
		for (int j = 0; j < COLS; j++) {
			approx[i * COLS + j] = sum[i * COLS + j] = 0;
			for (int t = 0; t < R; t++)
				approx[i * COLS + j] += P[i * R + t] * Q[j * R + t];
			for (int r = 0; r < RANKS; r++)
				sum[i * COLS + j] += g[r][i * COLS + j];
			big = fmax(big, fabs(approx[i * COLS + j]));
		}
	for (int e = 0; e < ROWS * COLS; e++) {
		worst = fmax(worst, fabs(grad[e] - approx[e]));
		worst_res = fmax(worst_res, fabs(res[e] - (g[rank][e] - approx[e] / RANKS)));
		worst_sum = fmax(worst_sum, fabs(grad[e] - sum[e]));
	}
	int vec_ok = 1;
	for (int i = 0; i < VEC; i++) {
		float want = 0;
		for (int r = 0; r < RANKS; r++)
			want += g[r][ROWS * COLS + i];
		vec_ok = vec_ok && fabsf(grad[ROWS * COLS + i] - want) <= 1e-5f * fabsf(want) + 1e-6f;
	}
	uint64_t want_bytes = 0;
	const int64_t sizes[3] = {ROWS * R, COLS * R, VEC};
	for (int c = 0; c < 3; c++)
		want_bytes += (uint64_t)(2 * 2 * (RANKS - 1) * 4 * sizes[c] + RANKS) / (2 * RANKS);
	if (!low_rank) {
		report(all_ok(worst <= 1e-4 * big && worst_res <= 1e-4 * big),
		       "powersgd: P Q^T of one power iteration (double reference) within %.1e of %.3g; residual M - P Q^T / 4",
		       worst, big);
		report(all_ok(vec_ok), "powersgd: vectors summed whole");
		report(all_ok(bytes == want_bytes), "powersgd: the bytes of P, Q and the vectors (%llu, want %llu)",
		       (unsigned long long)bytes, (unsigned long long)want_bytes);
	} else {
		double norm = 0;
		for (int e = 0; e < ROWS * COLS; e++)
			norm = fmax(norm, fabs(sum[e]));
		report(all_ok(worst_sum <= 1e-4 * norm), "powersgd: a sum of rank %d is reproduced (worst %.1e of %.3g)", R,
		       worst_sum, norm);
	}
}

/* ------------------------------------------------------------------ local SGD */

static void test_local_average(void)
{
	enum { N = 300, EVERY = 4 };
	gradients(g, N, 3);
	float flat[N], anchor[N], mom[N], a0[N], m0[N];
	uint16_t params[N];
	double hist[EVERY] = {0}, loss = 1.5 + rank;
	state = 77;
	for (int i = 0; i < N; i++) {
		a0[i] = (float)uniform();
		m0[i] = (float)uniform() * 0.1f;
	}
	planrt_ctx_t ctx = {.step = 5, .steps = 20};
	memcpy(flat, g[rank], sizeof flat);
	planrt_local_average(&ctx, EVERY, flat, N, planrt_f32, NULL, planrt_f32, &loss, hist, planrt_world_comm(), 0, 0, 0,
			     NULL, NULL);
	int ok = !memcmp(flat, g[rank], sizeof flat) && hist[1] == loss && hist[0] == 0;
	report(all_ok(ok), "local average: step 5 of every 4 records its loss and averages nothing");
	ctx.step = 7;
	planrt_local_average(&ctx, EVERY, flat, N, planrt_f32, params, planrt_bf16, &loss, hist, planrt_world_comm(), 0, 0,
			     0, NULL, NULL);
	double worst = 0;
	int cast_ok = 1;
	for (int i = 0; i < N; i++) {
		double mean = 0;
		for (int r = 0; r < RANKS; r++)
			mean += g[r][i];
		mean /= RANKS;
		worst = fmax(worst, fabs(flat[i] - mean)); /* values below 16: f32 rounding of a 4-term sum */
		cast_ok = cast_ok && params[i] == planrt_f32_to_half_(flat[i], planrt_bf16);
	}
	ok = worst <= 1e-5 && hist[3] == 1.5 * RANKS + RANKS * (RANKS - 1) / 2.0 && hist[1] == hist[3];
	report(all_ok(ok && cast_ok), "local average: step 7 averages the replicas (worst %.1e), sums the 4 losses, casts "
				       "to bf16",
	       worst);
	/* DiLoCo: the outer Nesterov step on anchor - average, from the last step (not a multiple) */
	memcpy(flat, g[rank], sizeof flat);
	memcpy(anchor, a0, sizeof anchor);
	memcpy(mom, m0, sizeof mom);
	ctx.step = 19;
	planrt_local_average(&ctx, EVERY, flat, N, planrt_f32, NULL, planrt_f32, &loss, hist, planrt_world_comm(), 2, 0.7,
			     0.9, anchor, mom);
	worst = 0;
	for (int i = 0; i < N; i++) {
		double mean = 0;
		for (int r = 0; r < RANKS; r++)
			mean += g[r][i];
		mean /= RANKS;
		double gr = a0[i] - mean, m = 0.9 * m0[i] + gr, x = a0[i] - 0.7 * (gr + 0.9 * m);
		worst = fmax(worst, fabs(flat[i] - x) + fabs(anchor[i] - x) + fabs(mom[i] - m));
	}
	report(all_ok(worst <= 1e-5), "local average: the last step averages; Nesterov outer step (worst %.1e)", worst);
	/* outer SGD with lr 1 and no momentum: the new model is the average */
	memcpy(flat, g[rank], sizeof flat);
	memcpy(anchor, a0, sizeof anchor);
	planrt_local_average(&ctx, EVERY, flat, N, planrt_f32, NULL, planrt_f32, &loss, hist, planrt_world_comm(), 1, 1.0,
			     0.0, anchor, NULL);
	worst = 0;
	for (int i = 0; i < N; i++) {
		double mean = 0;
		for (int r = 0; r < RANKS; r++)
			mean += g[r][i];
		worst = fmax(worst, fabs(flat[i] - mean / RANKS));
	}
	report(all_ok(worst <= 1e-5), "local average: outer sgd(lr = 1) gives the average (worst %.1e)", worst);
}

int main(int argc, char **argv)
{
	int world;
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world != RANKS) {
		fprintf(stderr, "test_sync_kernels: run with mpirun -np %d\n", RANKS);
		return 2;
	}
	if (rank != 0 && !freopen("/dev/null", "w", stdout)) /* every rank checks, rank 0 reports */
		return 2;
	test_local_average();
	test_cast(planrt_bf16, "bf16");
	test_cast(planrt_f16, "fp16");
	test_topk();
	test_powersgd(0);
	test_powersgd(1);
	printf("%d passed, %d failed\n", npass, nfail);
	int failed = nfail;
	PLANRT_CHECK(planrt_finalize());
	return failed ? 1 : 0;
}
