/* planrt_attention_math.h: the per-row logic of the CUDA target's fused attention
 * (attention_cuda.cu), as plain C that compiles for the device and for the host, so that
 * tests/cuda/test_attention_math.c runs exactly this code on the CPU against planrt's CPU kernels
 * (cpu/attention_impl.h) and the CPU's dropout masks.
 *
 * Shapes and masks as planrt_k_attention (planrt_kernels.h). One thread owns a query row for the
 * forward (an online softmax over every key: running maximum m, sum l, the accumulator rescaled
 * by exp(m_old - m_new); out = acc / l, lse = m + log l) and for dq (P = exp(s - lse) recomputed,
 * D = dout . out), and a key row of a kv head for dk and dv (every query row of the head's group
 * of query heads). The dropout keep decision is Philox-4x32-10's first word on the scores' global
 * index, the CPU's stream (kernels.c's philox_first), so the device drops what the CPU drops.
 *
 * Positions are global: query row i of the block is at attn_query_pos (its block offset list's two
 * halves: apart on a causally balanced ring), key j at attn_key_pos (0 + j but on the ring, where
 * the block held started on coordinate s: s sk + j, or its two mirrored chunks s and 2 size - 1 - s
 * of 2 size, attn_ring_keys). The causal mask, the additive mask's key columns (whole on every rank)
 * and the dropout index read them, as cpu/attention_impl.h does. A ring step merges its row into out
 * and lse (attn_merge_row), and its backward adds to dq (accumulate). */
#ifndef PLANRT_ATTENTION_MATH_H
#define PLANRT_ATTENTION_MATH_H

#include <math.h>
#include <stdint.h>

#include "planrt_half.h"

#ifdef __CUDACC__
#define ATTN_FN __host__ __device__ static inline
#else
#define ATTN_FN static inline
#endif

#define ATTN_MAX_RANK 8
#define ATTN_MAX_DH 256 /* the head dims a thread's accumulators hold */

typedef struct AttnParams {
	int rank, causal, has_mask;
	int64_t heads, kv_heads, sq, sk, dh, nlead;
	int64_t qhalf, qoff2;        /* query rows from qhalf on start at global row qoff2 */
	int64_t khalf, kshift[2];    /* key j is at global j + kshift[j >= khalf] */
	int64_t ldims[ATTN_MAX_RANK], mstr[ATTN_MAX_RANK], gst[ATTN_MAX_RANK], offs[ATTN_MAX_RANK];
	float scale, keep_scale;
	uint64_t thr, seed, key;
	int storage; /* how q, k, v, out, dout, dq, dk, dv are stored: ATTN_F32, ATTN_BF16 or ATTN_F16 */
	int tile_vec; /* planrt_attention_tiles.h: every 16-bit operand 16-byte aligned (loads 8 at a time) */
} AttnParams;

/* the storage types (planrt_dtype_t's numbers: planrt_f32, planrt_bf16, planrt_f16) */
enum { ATTN_F32 = 0, ATTN_BF16 = 1, ATTN_F16 = 2 };

/* Element i of a buffer stored as a->storage, as f32 (exact), and v stored there (rounded to nearest
 * even, as planrt_cast rounds: planrt_half.h). */
ATTN_FN float attn_ld(const AttnParams *a, const void *p, int64_t i)
{
	if (a->storage == ATTN_F32)
		return ((const float *)p)[i];
	uint16_t h = ((const uint16_t *)p)[i];
	return a->storage == ATTN_BF16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

ATTN_FN void attn_st(const AttnParams *a, void *p, int64_t i, float v)
{
	if (a->storage == ATTN_F32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = a->storage == ATTN_BF16 ? planrt_narrow_bf16(v) : planrt_narrow_f16(v);
}

/* Fills a from the kernel's arguments (host side); returns 0 when the shapes are out of range. */
ATTN_FN int attn_params(AttnParams *a, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk, double scale,
			int mask_kind, const int64_t *mask_strides, double p, uint64_t seed, uint64_t key,
			const int64_t *gdims, const int64_t *offs)
{
	if (rank < 3 || rank > ATTN_MAX_RANK || ldims[rank - 1] > ATTN_MAX_DH || kv_heads <= 0 ||
	    ldims[rank - 3] % kv_heads)
		return 0;
	a->rank = rank;
	a->causal = mask_kind == 1;
	a->has_mask = mask_kind == 2;
	a->heads = ldims[rank - 3];
	a->kv_heads = kv_heads;
	a->sq = ldims[rank - 2];
	a->sk = sk;
	a->dh = ldims[rank - 1];
	a->nlead = 1;
	int64_t st = 1;
	for (int d = rank - 1; d >= 0; d--) {
		a->ldims[d] = ldims[d];
		a->mstr[d] = mask_strides ? mask_strides[d] : 0;
		a->offs[d] = offs[d];
		a->gst[d] = st;
		st *= gdims[d];
		if (d < rank - 3)
			a->nlead *= ldims[d];
	}
	a->qhalf = a->sq / 2;
	a->qoff2 = offs[2 * rank - 2];
	a->khalf = sk;
	a->kshift[0] = a->kshift[1] = 0;
	a->scale = (float)scale;
	a->keep_scale = p >= 1 ? 0.0f : (float)(1.0 / (1.0 - p));
	a->thr = !(p > 0) ? 0 : p >= 1 ? (uint64_t)1 << 32 : (uint64_t)ceil(p * 4294967296.0);
	a->seed = seed;
	a->key = key;
	a->storage = ATTN_F32;
	a->tile_vec = 0;
	return 1;
}

/* A ring step's key block (host side, as cpu/attention_impl.h's attn_ring_keys): the block that
 * started on coordinate s = (coord - step) mod size; mirrored, its chunks s and 2 size - 1 - s of
 * 2 size. Returns 0 when the step or coordinate is out of range. */
ATTN_FN int attn_ring_keys(AttnParams *a, int64_t coord, int step, int size, int mirrored)
{
	if (size <= 0 || coord < 0 || coord >= size || step < 0 || step >= size)
		return 0;
	int64_t s = (coord - step + size) % size, half = a->sk / 2;
	if (!mirrored) {
		a->kshift[0] = a->kshift[1] = s * a->sk;
		return 1;
	}
	a->khalf = half;
	a->kshift[0] = s * half;
	a->kshift[1] = (2 * size - 1 - s) * half - half;
	return 1;
}

ATTN_FN int64_t attn_query_pos(const AttnParams *a, int64_t i)
{
	return i < a->qhalf ? a->offs[a->rank - 2] + i : a->qoff2 + i - a->qhalf;
}

ATTN_FN int64_t attn_key_pos(const AttnParams *a, int64_t j)
{
	return j + a->kshift[j >= a->khalf];
}

ATTN_FN uint32_t attn_philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1)
{
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k0 += 0x9E3779B9u;
			k1 += 0xBB67AE85u;
		}
		uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		c1 = (uint32_t)p1;
		c3 = (uint32_t)p0;
		c0 = n0;
		c2 = n2;
	}
	return c0;
}

/* Where head (b, h) starts: in the mask, and in the scores' global index (dropout). */
ATTN_FN void attn_head_bases(const AttnParams *a, int64_t b, int64_t h, int64_t *mask_base, uint64_t *drop_base)
{
	int r = a->rank;
	int64_t rest = b, mb = 0, gb = 0;
	for (int d = r - 4; d >= 0; d--) {
		int64_t i = rest % a->ldims[d];
		rest /= a->ldims[d];
		mb += i * a->mstr[d];
		gb += (i + a->offs[d]) * a->gst[d];
	}
	*mask_base = mb + h * a->mstr[r - 3];
	*drop_base = (uint64_t)(gb + (h + a->offs[r - 3]) * a->gst[r - 3]); /* + the row's and key's (global) */
}

/* Score (i, j) of a head: q_i . k_j scaled (the rows at qi and kj of q and k), plus the mask; -inf
 * where causal masks it. */
ATTN_FN float attn_score(const AttnParams *a, const void *q, int64_t qi, const void *k, int64_t kj,
			 const float *mask, int64_t mask_base, int64_t i, int64_t j)
{
	int64_t key = attn_key_pos(a, j);
	if (a->causal && key > attn_query_pos(a, i))
		return -INFINITY;
	float s = 0;
	for (int64_t d = 0; d < a->dh; d++)
		s += attn_ld(a, q, qi + d) * a->scale * attn_ld(a, k, kj + d);
	if (a->has_mask)
		s += mask[mask_base + i * a->mstr[a->rank - 2] + key * a->mstr[a->rank - 1]];
	return s;
}

/* The factor dropout gives probability (i, j): 0 dropped, 1 / (1 - p) kept, 1 without dropout. */
ATTN_FN float attn_dropout_factor(const AttnParams *a, uint64_t drop_base, int64_t i, int64_t j)
{
	if (!a->thr)
		return 1.0f;
	uint64_t g = drop_base + (uint64_t)(attn_query_pos(a, i) * a->gst[a->rank - 2] + attn_key_pos(a, j));
	uint32_t u = attn_philox_first((uint32_t)g, (uint32_t)(g >> 32), (uint32_t)a->key, (uint32_t)(a->key >> 32),
				       (uint32_t)a->seed, (uint32_t)(a->seed >> 32));
	return (uint64_t)u >= a->thr ? a->keep_scale : 0.0f;
}

/* Stores a row's online-softmax result (accumulator acc, running maximum m, sum l) into the row at oi
 * of out and into lse_i, or (merge: a later ring step) merges it into them: lse = logaddexp(lse_a,
 * lse_b), out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse); a row whose keys here are all
 * masked stays. */
ATTN_FN void attn_store_row(const AttnParams *a, const float *acc, float m, float l, int merge, void *out, int64_t oi,
			    float *lse_i)
{
	float inv = l > 0 ? 1 / l : 0, lse = l > 0 ? m + logf(l) : -INFINITY, old = merge ? *lse_i : -INFINITY;
	if (merge && lse == -INFINITY)
		return;
	if (old == -INFINITY) {
		for (int64_t d = 0; d < a->dh; d++)
			attn_st(a, out, oi + d, acc[d] * inv);
		*lse_i = lse;
		return;
	}
	float hi = old > lse ? old : lse, merged = hi + logf(expf(old - hi) + expf(lse - hi));
	float wa = expf(old - merged), wb = expf(lse - merged) * inv;
	for (int64_t d = 0; d < a->dh; d++)
		attn_st(a, out, oi + d, attn_ld(a, out, oi + d) * wa + acc[d] * wb);
	*lse_i = merged;
}

/* Query row i of head (b, h): out_i and lse_i by an online softmax over every key (merge: merged
 * into them, a ring step after the first). */
ATTN_FN void attn_forward_row(const AttnParams *a, const void *q, const void *k, const void *v, const float *mask,
			      int64_t b, int64_t h, int64_t i, int merge, void *out, float *lse)
{
	float acc[ATTN_MAX_DH];
	int64_t dh = a->dh, qh = b * a->heads + h, kh = b * a->kv_heads + h / (a->heads / a->kv_heads);
	int64_t qi = (qh * a->sq + i) * dh, kb = kh * a->sk * dh;
	int64_t mask_base;
	uint64_t drop_base;
	attn_head_bases(a, b, h, &mask_base, &drop_base);
	float m = -INFINITY, l = 0;
	for (int64_t d = 0; d < dh; d++)
		acc[d] = 0;
	for (int64_t j = 0; j < a->sk; j++) {
		float s = attn_score(a, q, qi, k, kb + j * dh, mask, mask_base, i, j);
		if (s == -INFINITY)
			continue;
		float mnew = s > m ? s : m, corr = expf(m - mnew), pj = expf(s - mnew);
		l = l * corr + pj;
		m = mnew;
		float pd = pj * attn_dropout_factor(a, drop_base, i, j);
		for (int64_t d = 0; d < dh; d++)
			acc[d] = acc[d] * corr + pd * attn_ld(a, v, kb + j * dh + d);
	}
	attn_store_row(a, acc, m, l, merge, out, qi, lse + qh * a->sq + i);
}

/* The gradient pieces of entry (i, j): P (undropped), the dropout factor z, dS = P (z dP - D). */
ATTN_FN float attn_ds(const AttnParams *a, float s, float lse_i, float dpd, float z, float D, float *pz)
{
	float p = lse_i == -INFINITY || s == -INFINITY ? 0 : expf(s - lse_i);
	*pz = p * z;
	return p * (dpd * z - D) * a->scale;
}

/* the dot product of the rows at xi of x and yi of y */
ATTN_FN float attn_dot(const AttnParams *a, const void *x, int64_t xi, const void *y, int64_t yi, int64_t n)
{
	float s = 0;
	for (int64_t d = 0; d < n; d++)
		s += attn_ld(a, x, xi + d) * attn_ld(a, y, yi + d);
	return s;
}

/* dq of query row i of head (b, h) (overwritten; accumulate: added to, a ring step after the
 * first). in: q, k, v, out, lse (f32), dout. */
ATTN_FN void attn_dq_row(const AttnParams *a, const void *const *in, const float *mask, int64_t b, int64_t h,
			 int64_t i, int accumulate, void *dq)
{
	const void *q = in[0], *k = in[1], *v = in[2], *o = in[3], *dout = in[5];
	const float *lse = (const float *)in[4];
	float g[ATTN_MAX_DH];
	int64_t dh = a->dh, qh = b * a->heads + h, kh = b * a->kv_heads + h / (a->heads / a->kv_heads);
	int64_t qi = (qh * a->sq + i) * dh;
	float li = lse[qh * a->sq + i], pz;
	float D = attn_dot(a, dout, qi, o, qi, dh);
	int64_t mask_base;
	uint64_t drop_base;
	attn_head_bases(a, b, h, &mask_base, &drop_base);
	for (int64_t d = 0; d < dh; d++)
		g[d] = accumulate ? attn_ld(a, dq, qi + d) : 0;
	for (int64_t j = 0; j < a->sk; j++) {
		int64_t kj = (kh * a->sk + j) * dh;
		float s = attn_score(a, q, qi, k, kj, mask, mask_base, i, j);
		if (s == -INFINITY)
			continue;
		float dpd = attn_dot(a, dout, qi, v, kj, dh);
		float ds = attn_ds(a, s, li, dpd, attn_dropout_factor(a, drop_base, i, j), D, &pz);
		for (int64_t d = 0; d < dh; d++)
			g[d] += ds * attn_ld(a, k, kj + d);
	}
	for (int64_t d = 0; d < dh; d++)
		attn_st(a, dq, qi + d, g[d]);
}

/* dk and dv of key row j of kv head (b, hk) (overwritten): every query row of its query heads. */
ATTN_FN void attn_dkdv_row(const AttnParams *a, const void *const *in, const float *mask, int64_t b, int64_t hk,
			   int64_t j, void *dk, void *dv)
{
	const void *q = in[0], *k = in[1], *v = in[2], *o = in[3], *dout = in[5];
	const float *lse = (const float *)in[4];
	float gk[ATTN_MAX_DH], gv[ATTN_MAX_DH];
	int64_t dh = a->dh, group = a->heads / a->kv_heads, kh = b * a->kv_heads + hk;
	int64_t kj = (kh * a->sk + j) * dh;
	for (int64_t d = 0; d < dh; d++)
		gk[d] = gv[d] = 0;
	for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
		int64_t qh = b * a->heads + h, mask_base;
		uint64_t drop_base;
		attn_head_bases(a, b, h, &mask_base, &drop_base);
		for (int64_t i = 0; i < a->sq; i++) {
			int64_t qi = (qh * a->sq + i) * dh;
			float s = attn_score(a, q, qi, k, kj, mask, mask_base, i, j), pz;
			if (s == -INFINITY)
				continue;
			float D = attn_dot(a, dout, qi, o, qi, dh), dpd = attn_dot(a, dout, qi, v, kj, dh);
			float ds = attn_ds(a, s, lse[qh * a->sq + i], dpd, attn_dropout_factor(a, drop_base, i, j), D, &pz);
			for (int64_t d = 0; d < dh; d++) {
				gv[d] += pz * attn_ld(a, dout, qi + d);
				gk[d] += ds * attn_ld(a, q, qi + d);
			}
		}
	}
	for (int64_t d = 0; d < dh; d++) {
		attn_st(a, dk, kj + d, gk[d]);
		attn_st(a, dv, kj + d, gv[d]);
	}
}

#endif
