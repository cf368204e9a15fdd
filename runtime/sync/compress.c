/* compress.c: gradient compression for `sync strict, compress = ...` (docs/sync.md).
 *
 * A compressor replaces the all-reduce (or, with ZeRO 1, the reduce-scatter) of one flat f32
 * gradient bucket on the batch axis. What each rank sends is a lossy function of its partial
 * gradient; what every rank gets back, in the bucket, is the sum over the ranks of what they sent,
 * decompressed — the same on every rank, so the replicas stay identical:
 *   bf16, fp16   each element rounded to the half type; the sum of the rounded values formed in f32
 *                and rounded once (comm_mpi.c's half-precision reduction); 2 bytes per element;
 *   topk         per tensor, the k = ceil(ratio n) entries of largest magnitude (ties: the lower
 *                index) as (f32 bits, index) pairs; every rank's pairs are all-gathered and added,
 *                rank by rank, into a zeroed bucket: an entry no rank kept is 0 this step;
 *   powersgd     per matrix (a tensor's block viewed as rows x last dim) whose rank-r factors are
 *                smaller than it, one power iteration warm-started from the previous step's Q
 *                (Vogels et al. 2019): P = M Q summed and orthonormalised (Gram-Schmidt), Q = M^T P
 *                summed, M ~ P Q^T; vectors and small matrices are summed exactly.
 * Error feedback (Seide et al. 2014; Karimireddy et al. 2019), when the plan asks for it: a
 * residual per bucket, added to the gradient before compressing, keeps what this rank's message
 * lost: v - round(v) for the half types, the entries not kept for top-k, and v - P Q^T / N for
 * PowerSGD (N ranks: the rank's share of the decompressed sum, as torch's PowerSGD hook does with
 * averages). */
#define PLANRT_INTERNAL
#include "planrt_program.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static void narrow(const float *x, uint16_t *h, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		planrt_k_f32_to_bf16(x, h, n);
	else
		for (int64_t i = 0; i < n; i++)
			h[i] = planrt_f32_to_half_(x[i], t);
}

static void widen(const uint16_t *h, float *x, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		planrt_k_bf16_to_f32(h, x, n);
	else
		for (int64_t i = 0; i < n; i++)
			x[i] = planrt_half_to_f32_(h[i], t);
}

static void add_residual(float *x, const float *residual, int64_t n)
{
	for (int64_t i = 0; residual && i < n; i++)
		x[i] += residual[i];
}

void planrt_compress_cast(float *grad, int64_t n, planrt_dtype_t wire, float *residual, void *scratch, int64_t chunk,
			  planrt_comm_t c)
{
	if (wire != planrt_bf16 && wire != planrt_f16)
		planrt_fatal("internal error: planrt_compress_cast to dtype %d (bf16 or f16)", (int)wire);
	uint16_t *q = scratch;
	add_residual(grad, residual, n);
	narrow(grad, q, n, wire);
	if (residual) {
		widen(q, residual, n, wire);
		for (int64_t i = 0; i < n; i++) /* exact: the rounding error of a coarser format */
			residual[i] = grad[i] - residual[i];
	}
	if (!chunk) {
		PLANRT_CHECK(planrt_allreduce(q, q, (size_t)n, wire, planrt_sum, c, NULL, NULL));
		widen(q, grad, n, wire);
		return;
	}
	size_t at = (size_t)planrt_comm_rank(c) * (size_t)chunk;
	PLANRT_CHECK(planrt_reduce_scatter(q, q + at, (size_t)chunk, wire, planrt_sum, c, NULL, NULL));
	widen(q + at, grad + at, chunk, wire);
}

/* ------------------------------------------------------------------ top-k */

/* The k-th largest of a[0, n) (1 <= k <= n); reorders a (Hoare's selection). */
static float kth_largest(float *a, int64_t n, int64_t k)
{
	int64_t lo = 0, hi = n - 1, want = k - 1;
	while (lo < hi) {
		float pivot = a[lo + (hi - lo) / 2];
		int64_t i = lo, j = hi;
		while (i <= j) {
			while (a[i] > pivot)
				i++;
			while (a[j] < pivot)
				j--;
			if (i <= j) {
				float x = a[i];
				a[i++] = a[j];
				a[j--] = x;
			}
		}
		if (want <= j)
			hi = j;
		else if (want >= i)
			lo = i;
		else
			return a[want];
	}
	return a[want];
}

void planrt_compress_topk(float *grad, int nseg, const int64_t *off, const int64_t *len, const int64_t *k,
			  float *residual, void *scratch, planrt_comm_t c)
{
	int64_t kept = 0;
	for (int s = 0; s < nseg; s++) {
		if (k[s] < 1 || k[s] > len[s] || off[s] + len[s] > INT32_MAX)
			planrt_fatal("internal error: top-k of %lld of %lld entries at %lld", (long long)k[s], (long long)len[s],
				     (long long)off[s]);
		kept += k[s];
	}
	int size = planrt_comm_size(c);
	int32_t *out = scratch, *all = out + 2 * kept;
	float *mag = (float *)(all + 2 * kept * size);
	int32_t *pair = out;
	for (int s = 0; s < nseg; s++) {
		float *v = grad + off[s];
		add_residual(v, residual ? residual + off[s] : NULL, len[s]);
		for (int64_t i = 0; i < len[s]; i++)
			mag[i] = fabsf(v[i]);
		float thr = kth_largest(mag, len[s], k[s]);
		int64_t above = 0;
		for (int64_t i = 0; i < len[s]; i++)
			above += fabsf(v[i]) > thr;
		int64_t ties = k[s] - above;
		for (int64_t i = 0; i < len[s]; i++) {
			float a = fabsf(v[i]);
			if (a > thr || (a == thr && ties-- > 0)) {
				memcpy(pair++, &v[i], 4);
				*pair++ = (int32_t)(off[s] + i);
				if (residual)
					residual[off[s] + i] = 0;
			} else if (residual) {
				residual[off[s] + i] = v[i];
			}
		}
	}
	PLANRT_CHECK(planrt_allgather(out, all, (size_t)(2 * kept), planrt_i32, c, NULL, NULL));
	for (int s = 0; s < nseg; s++)
		memset(grad + off[s], 0, sizeof(float) * (size_t)len[s]);
	for (int64_t e = 0; e < kept * size; e++) { /* rank by rank: the same sum on every rank */
		float x;
		memcpy(&x, &all[2 * e], 4);
		grad[all[2 * e + 1]] += x;
	}
}

/* ------------------------------------------------------------------ PowerSGD */

/* The r columns of p (rows x r, row-major) made orthonormal, in order (Gram-Schmidt). */
static void orthonormalise(float *p, int64_t rows, int r)
{
	for (int j = 0; j < r; j++) {
		for (int k = 0; k < j; k++) {
			double dot = 0;
			for (int64_t i = 0; i < rows; i++)
				dot += (double)p[i * r + j] * p[i * r + k];
			for (int64_t i = 0; i < rows; i++)
				p[i * r + j] -= (float)dot * p[i * r + k];
		}
		double norm = 0;
		for (int64_t i = 0; i < rows; i++)
			norm += (double)p[i * r + j] * p[i * r + j];
		float scale = (float)(1.0 / (sqrt(norm) + 1e-8));
		for (int64_t i = 0; i < rows; i++)
			p[i * r + j] *= scale;
	}
}

void planrt_compress_powersgd(float *grad, int nseg, const int64_t *off, const int64_t *rows, const int64_t *cols,
			      int r, float *q, float *residual, float *scratch, planrt_comm_t c)
{
	int64_t np = 0, nq = 0, nd = 0;
	for (int s = 0; s < nseg; s++) {
		np += cols[s] ? rows[s] * r : 0;
		nq += cols[s] * r;
		nd += cols[s] ? 0 : rows[s];
	}
	float *P = scratch, *D = scratch + np;
	int64_t pp = 0, qq = 0, dd = 0;
	for (int s = 0; s < nseg; s++) { /* P = M Q; the whole segments packed */
		float *m = grad + off[s];
		if (!cols[s]) {
			memcpy(D + dd, m, sizeof(float) * (size_t)rows[s]);
			dd += rows[s];
			continue;
		}
		add_residual(m, residual ? residual + off[s] : NULL, rows[s] * cols[s]);
		planrt_k_matmul_f32(1, rows[s], r, cols[s], m, 0, 0, q + qq, 0, 0, P + pp, 0, 0);
		pp += rows[s] * r;
		qq += cols[s] * r;
	}
	if (np) {
		PLANRT_CHECK(planrt_allreduce(P, P, (size_t)np, planrt_f32, planrt_sum, c, NULL, NULL));
		pp = qq = 0;
		for (int s = 0; s < nseg; s++) /* Q = M^T P, from the orthonormal P */
			if (cols[s]) {
				orthonormalise(P + pp, rows[s], r);
				planrt_k_matmul_f32(1, cols[s], r, rows[s], grad + off[s], 1, 0, P + pp, 0, 0, q + qq, 0, 0);
				pp += rows[s] * r;
				qq += cols[s] * r;
			}
		PLANRT_CHECK(planrt_allreduce(q, q, (size_t)nq, planrt_f32, planrt_sum, c, NULL, NULL));
		float share = 1.0f / (float)planrt_comm_size(c);
		pp = qq = 0;
		for (int s = 0; s < nseg; s++)
			if (cols[s]) { /* M ~ P Q^T; the residual keeps M minus this rank's share of it */
				int64_t n = rows[s] * cols[s];
				float *m = grad + off[s];
				if (residual)
					memcpy(residual + off[s], m, sizeof(float) * (size_t)n);
				planrt_k_matmul_f32(1, rows[s], cols[s], r, P + pp, 0, 0, q + qq, 1, 0, m, 0, 0);
				for (int64_t i = 0; residual && i < n; i++)
					residual[off[s] + i] -= m[i] * share;
				pp += rows[s] * r;
				qq += cols[s] * r;
			}
	}
	if (nd) {
		PLANRT_CHECK(planrt_allreduce(D, D, (size_t)nd, planrt_f32, planrt_sum, c, NULL, NULL));
		dd = 0;
		for (int s = 0; s < nseg; s++)
			if (!cols[s]) {
				memcpy(grad + off[s], D + dd, sizeof(float) * (size_t)rows[s]);
				dd += rows[s];
			}
	}
}

void planrt_powersgd_init(planrt_ctx_t *ctx, float *q, int64_t n)
{
	int64_t dims[1] = {n}, offs[1] = {0};
	planrt_init_block(q, 1, dims, dims, offs, 0, 0.0, 1.0, ctx->seed, "powersgd_q");
}
