/* planrt_attention_tiles.h: the CUDA target's tiled attention for 16-bit storage (bf16 / f16), the
 * fast path of attention_cuda.cu: a block of 128 threads (4 warps) owns a tile of 64 query rows
 * (forward, dq) or 64 key rows of a kv head (dk, dv) and walks the other side 64 rows at a time
 * through shared memory. The products (scores Q K^T, dP = dO V^T, P V, dS K, P^T dO, dS^T Q) run
 * on the tensor cores (WMMA 16 x 16 x 16, f32 accumulation); the softmax, masks and dropout are
 * the exact kernels' per-entry functions (planrt_attention_math.h) on the tile in shared memory.
 * Memory is the exact kernels': the output and each row's logsumexp, the scores never leave the
 * block. What differs from the exact kernels is rounding: the probabilities P (times the dropout
 * factor) and dS are rounded to the storage type before their products, as FlashAttention rounds
 * them, and sums run in the tensor cores' order.
 *
 * Each block's work is written once, as a function every thread of the block runs (tid 0-127),
 * with ATTN_SYNC() where the block synchronises and attn_warp_mma for a warp's product of a 16-row
 * strip. Compiled by nvcc these are __syncthreads() and WMMA; compiled as C on the host,
 * ATTN_SYNC() is attn_tiles_host_sync() (the caller's barrier over 128 host threads) and a warp's
 * product is plain loops run by its lane 0, with the layouts WMMA's load_matrix_sync documents
 * (row-major: element (r, c) at r ld + c; column-major: at r + c ld). So
 * tests/cuda/test_attention_tiles.c runs exactly this code on the CPU, threads and barriers
 * included, against planrt's CPU kernels.
 *
 * Layout as planrt_attention_math.h: q [lead..., heads, sq, dh], k and v [lead..., kv_heads, sk,
 * dh], contiguous. Taken for a call (attn_tiles_take) when storage is 16-bit and dh a multiple of 16
 * up to 128; not for the ring's steps (context parallelism keeps f32 and the exact kernels). A
 * causal tile whose keys all lie after its last query is skipped. */
#ifndef PLANRT_ATTENTION_TILES_H
#define PLANRT_ATTENTION_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "planrt_attention_math.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <type_traits>
#define ATTN_TILE_FN __device__ static inline
#define ATTN_SYNC() __syncthreads()
#else
#define ATTN_TILE_FN static inline
/* the host's barrier over the 128 threads that run a block (provided by whoever runs the block on
 * the host: tests/cuda/test_attention_tiles.c) */
void attn_tiles_host_sync(void);
#define ATTN_SYNC() attn_tiles_host_sync()
#endif

#define ATTN_TILE 64          /* rows of a tile, either side */
#define ATTN_TILE_THREADS 128 /* threads of a block: 4 warps, a 16-row strip each */
#define ATTN_TILE_MAX_DH 128

/* which kernel a block runs (its shared memory differs) */
enum { ATTN_TILES_FORWARD = 0, ATTN_TILES_DQ = 1, ATTN_TILES_DKDV = 2 };

/* Whether the tiles take a call with these parameters: 16-bit storage, a head dim they hold, and
 * positions that rise with the row (the query rows' second half after the first, as a causally
 * balanced split holds them; keys not a ring step's two halves). */
ATTN_FN int attn_tiles_take(const AttnParams *a)
{
	return a->storage != ATTN_F32 && a->dh >= 16 && a->dh % 16 == 0 && a->dh <= ATTN_TILE_MAX_DH &&
	       a->qoff2 >= a->offs[a->rank - 2] + a->qhalf && a->khalf == a->sk && a->kshift[0] == 0;
}

/* A block's shared memory, carved from one buffer: 16-bit tiles of 64 rows (q, k, v, dout: dh wide,
 * row stride ldh; p, ds: 64 wide, ldp), f32 tiles (s, dp: 64 x 64, ldf; acc, acc2: 64 x dh, lda)
 * and per-row values. Strides are padded (+8 16-bit, +4 f32 elements) against bank conflicts and
 * keep every 16-row strip 32-byte aligned, as WMMA's loads need. */
typedef struct AttnTiles {
	uint16_t *q, *k, *v, *dout, *p, *ds;
	float *s, *dp, *acc, *acc2;
	float *m, *l, *lse, *delta;
	float *part; /* the forward's per-thread partial row maxima, then sums (two threads a row) */
	int ldh, ldp, ldf, lda;
} AttnTiles;

/* Carves base (may be NULL: only counts) for a block of kind `which`; returns the bytes it takes. */
ATTN_FN size_t attn_tiles_carve(AttnTiles *t, unsigned char *base, int64_t dh, int which)
{
	size_t at = 0;
	t->ldh = (int)dh + 8;
	t->ldp = ATTN_TILE + 8;
	t->ldf = ATTN_TILE + 4;
	t->lda = (int)dh + 4;
#define ATTN_CARVE(field, type, count)                                                                  \
	do {                                                                                            \
		t->field = base ? (type *)(void *)(base + at) : (type *)0;                                  \
		at += ((size_t)(count) * sizeof(type) + 127) / 128 * 128;                                    \
	} while (0)
	size_t h16 = (size_t)ATTN_TILE * t->ldh, p16 = (size_t)ATTN_TILE * t->ldp;
	size_t f64 = (size_t)ATTN_TILE * t->ldf, fdh = (size_t)ATTN_TILE * t->lda;
	t->dout = t->p = t->ds = 0;
	t->dp = t->acc2 = 0;
	ATTN_CARVE(q, uint16_t, h16);
	ATTN_CARVE(k, uint16_t, h16);
	ATTN_CARVE(v, uint16_t, h16);
	ATTN_CARVE(s, float, f64);
	ATTN_CARVE(acc, float, fdh);
	ATTN_CARVE(m, float, ATTN_TILE);
	ATTN_CARVE(l, float, ATTN_TILE);
	t->part = 0;
	if (which == ATTN_TILES_FORWARD) {
		ATTN_CARVE(p, uint16_t, p16);
		ATTN_CARVE(part, float, 2 * ATTN_TILE_THREADS);
	} else {
		ATTN_CARVE(dout, uint16_t, h16);
		ATTN_CARVE(dp, float, f64);
		/* dS and P (16-bit) are written over dP and S (f32), which attn_tile_grad_entries has read
		 * by then: the dk / dv block fits twice in an SM at head dim 64 (104.5 KB, not 125) */
		t->ds = (uint16_t *)(void *)t->dp;
		if (which == ATTN_TILES_DKDV) {
			t->p = (uint16_t *)(void *)t->s;
			ATTN_CARVE(acc2, float, fdh);
		}
	}
#undef ATTN_CARVE
	t->lse = t->m; /* the backward's per-row logsumexp and D = dout . out share the forward's m, l */
	t->delta = t->l;
	return at;
}

/* x stored as the tiles' 16-bit type, and back */
ATTN_FN uint16_t attn_tile_st16(const AttnParams *a, float x)
{
	return a->storage == ATTN_BF16 ? planrt_narrow_bf16(x) : planrt_narrow_f16(x);
}

ATTN_FN float attn_tile_ld16(const AttnParams *a, uint16_t h)
{
	return a->storage == ATTN_BF16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

#ifdef __CUDACC__
/* one warp's C[16, n] (+)= A[16, kdim] B[kdim, n] in WMMA fragments (T: the 16-bit type; ACOL /
 * BCOL: A / B column-major) */
template <typename T, bool ACOL, bool BCOL>
__device__ static inline void attn_wmma(const uint16_t *A, int lda, const uint16_t *B, int ldb, float *C, int ldc,
					 int n, int kdim, int accumulate)
{
	using namespace nvcuda;
	typedef typename std::conditional<ACOL, wmma::col_major, wmma::row_major>::type AL;
	typedef typename std::conditional<BCOL, wmma::col_major, wmma::row_major>::type BL;
	for (int nb = 0; nb < n; nb += 16) {
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
		if (accumulate)
			wmma::load_matrix_sync(c, C + nb, (unsigned)ldc, wmma::mem_row_major);
		else
			wmma::fill_fragment(c, 0.0f);
		for (int kk = 0; kk < kdim; kk += 16) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, T, AL> fa;
			wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BL> fb;
			const T *pa = (const T *)A + (ACOL ? (size_t)kk * lda : (size_t)kk);
			const T *pb = (const T *)B + (BCOL ? (size_t)kk + (size_t)nb * ldb : (size_t)kk * ldb + nb);
			wmma::load_matrix_sync(fa, pa, (unsigned)lda);
			wmma::load_matrix_sync(fb, pb, (unsigned)ldb);
			wmma::mma_sync(c, fa, fb, c);
		}
		wmma::store_matrix_sync(C + nb, c, (unsigned)ldc, wmma::mem_row_major);
	}
}
#endif

/* A warp's product of a 16-row strip: C[16, n] (+ C when accumulate) = A[16, kdim] B[kdim, n]. A's
 * element (r, c) is at A[r lda + c], or A[r + c lda] when a_col; B's likewise; C row-major. Every
 * lane of the warp calls it. The layouts used: A row-major with B column-major (Q K^T, dO V^T), both
 * row-major (P V, dS K), A column-major with B row-major (P^T dO, dS^T Q). */
ATTN_TILE_FN void attn_warp_mma(const AttnParams *a, int lane, const uint16_t *A, int lda, int a_col,
				const uint16_t *B, int ldb, int b_col, float *C, int ldc, int n, int kdim,
				int accumulate)
{
#ifdef __CUDACC__
	(void)lane;
	if (a->storage == ATTN_BF16) {
		if (a_col)
			attn_wmma<__nv_bfloat16, true, false>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
		else if (b_col)
			attn_wmma<__nv_bfloat16, false, true>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
		else
			attn_wmma<__nv_bfloat16, false, false>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
	} else {
		if (a_col)
			attn_wmma<__half, true, false>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
		else if (b_col)
			attn_wmma<__half, false, true>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
		else
			attn_wmma<__half, false, false>(A, lda, B, ldb, C, ldc, n, kdim, accumulate);
	}
#else
	if (lane != 0)
		return;
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < n; c++) {
			float sum = accumulate ? C[r * ldc + c] : 0.0f;
			for (int x = 0; x < kdim; x++) {
				uint16_t av = a_col ? A[r + x * lda] : A[r * lda + x];
				uint16_t bv = b_col ? B[x + c * ldb] : B[x * ldb + c];
				sum += attn_tile_ld16(a, av) * attn_tile_ld16(a, bv);
			}
			C[r * ldc + c] = sum;
		}
#endif
}

/* Rows row0 .. row0 + 63 of a [rows, dh] 16-bit matrix into a tile (rows past the end: zeros), by
 * the block's threads: 8 elements (16 bytes) at a time when a->tile_vec says every operand is
 * 16-byte aligned, else one. */
ATTN_TILE_FN void attn_tile_load(const AttnParams *a, uint16_t *dst, int ld, const void *src, int64_t row0,
				 int64_t rows, int tid)
{
	const uint16_t *s = (const uint16_t *)src;
	int64_t dh = a->dh;
	if (a->tile_vec) {
		int64_t chunks = dh / 8;
		for (int64_t e = tid; e < ATTN_TILE * chunks; e += ATTN_TILE_THREADS) {
			int64_t r = e / chunks, d = (e % chunks) * 8;
			uint16_t *to = dst + r * ld + d;
			if (row0 + r < rows) {
#ifdef __CUDACC__
				*(uint4 *)(void *)to = *(const uint4 *)(const void *)(s + (row0 + r) * dh + d);
#else
				memcpy(to, s + (row0 + r) * dh + d, 16);
#endif
			} else {
				for (int x = 0; x < 8; x++)
					to[x] = 0;
			}
		}
		return;
	}
	for (int64_t e = tid; e < ATTN_TILE * dh; e += ATTN_TILE_THREADS) {
		int64_t r = e / dh, d = e % dh;
		dst[r * ld + d] = row0 + r < rows ? s[(row0 + r) * dh + d] : 0;
	}
}

/* the largest global position of query rows i0 .. i0 + n - 1 and the smallest of keys j0 .. j0 + n - 1:
 * the last row's and the first key's, as positions rise with the row (attn_tiles_take: the second
 * half of the rows lies after the first; no ring step's key halves) */
ATTN_TILE_FN int64_t attn_tile_qmax(const AttnParams *a, int64_t i0, int64_t n)
{
	return attn_query_pos(a, i0 + n - 1);
}

ATTN_TILE_FN int64_t attn_tile_kmin(const AttnParams *a, int64_t j0)
{
	return attn_key_pos(a, j0);
}

/* whether every entry of query tile i0 and key tile j0 is causally masked */
ATTN_TILE_FN int attn_tile_skip(const AttnParams *a, int64_t i0, int64_t j0)
{
	int64_t nq = a->sq - i0 < ATTN_TILE ? a->sq - i0 : ATTN_TILE;
	return a->causal && attn_tile_kmin(a, j0) > attn_tile_qmax(a, i0, nq);
}

/* Score (i, j) from its product q_i . k_j: scaled, plus the mask; -inf where causal masks it or
 * past the keys (attn_score's rule on a product the tensor cores made). */
ATTN_TILE_FN float attn_tile_score(const AttnParams *a, float dot, const float *mask, int64_t mask_base, int64_t i,
				   int64_t j)
{
	if (j >= a->sk)
		return -INFINITY;
	int64_t key = attn_key_pos(a, j);
	if (a->causal && key > attn_query_pos(a, i))
		return -INFINITY;
	float s = dot * a->scale;
	if (a->has_mask)
		s += mask[mask_base + i * a->mstr[a->rank - 2] + key * a->mstr[a->rank - 1]];
	return s;
}

/* The forward's online softmax over a tile pair (query rows i0 .., keys j0 ..), by every thread: two
 * threads a row, each over half its 64 columns (visited from r on, and the second half from r + 16:
 * a skew that puts a warp's 32 threads on 32 different banks).
 * - attn_tile_softmax_max: the scores' products (t->s) become scores (scaled, masked) in place, and
 *   the half's maximum goes to t->part[tid].
 * - attn_tile_softmax_exp (after a barrier): the row's new maximum from both halves and the old
 *   one; P (t->p, times the dropout factor, rounded) of the half, its sum to t->part[128 + tid], and
 *   the half of the row's accumulated output (t->acc) it owns rescaled to the new maximum.
 * - attn_tile_softmax_row_stats (after another, one thread a row): the row's maximum and sum (t->m,
 *   t->l) updated; the product P V that follows touches neither. */
ATTN_TILE_FN void attn_tile_softmax_max(const AttnParams *a, const AttnTiles *t, int tid, int64_t i0, int64_t j0,
					const float *mask, int64_t mask_base)
{
	int r = tid / 2, half = tid % 2;
	int64_t i = i0 + r;
	float *srow = t->s + r * t->ldf, mx = -INFINITY;
	if (i < a->sq)
		for (int cc = 0; cc < ATTN_TILE / 2; cc++) {
			int c = half * (ATTN_TILE / 2) + ((cc + r + 16 * half) & (ATTN_TILE / 2 - 1));
			float s = attn_tile_score(a, srow[c], mask, mask_base, i, j0 + c);
			srow[c] = s;
			mx = s > mx ? s : mx;
		}
	t->part[tid] = mx;
}

/* the row's maximum after the tile: the old one and the two halves' (attn_tile_softmax_max) */
ATTN_TILE_FN float attn_tile_row_max(const AttnTiles *t, int r)
{
	float m = t->m[r], a = t->part[2 * r], b = t->part[2 * r + 1];
	m = a > m ? a : m;
	return b > m ? b : m;
}

ATTN_TILE_FN void attn_tile_softmax_exp(const AttnParams *a, const AttnTiles *t, int tid, int64_t i0, int64_t j0,
					uint64_t drop_base)
{
	int r = tid / 2, half = tid % 2;
	int64_t i = i0 + r;
	float *srow = t->s + r * t->ldf, *acc = t->acc + r * t->lda, sum = 0;
	uint16_t *prow = t->p + r * t->ldp;
	if (i >= a->sq) {
		for (int c = half * (ATTN_TILE / 2); c < (half + 1) * (ATTN_TILE / 2); c++)
			prow[c] = 0;
		t->part[ATTN_TILE_THREADS + tid] = 0;
		return;
	}
	float m = t->m[r], mnew = attn_tile_row_max(t, r), corr = mnew == -INFINITY ? 1.0f : expf(m - mnew);
	for (int cc = 0; cc < ATTN_TILE / 2; cc++) {
		int c = half * (ATTN_TILE / 2) + ((cc + r + 16 * half) & (ATTN_TILE / 2 - 1));
		float s = srow[c], p = s == -INFINITY ? 0.0f : expf(s - mnew);
		sum += p;
		prow[c] = attn_tile_st16(a, p == 0 ? 0.0f : p * attn_dropout_factor(a, drop_base, i, j0 + c));
	}
	t->part[ATTN_TILE_THREADS + tid] = sum;
	if (corr != 1.0f) {
		int64_t lo = half * (a->dh / 2), n = half ? a->dh - a->dh / 2 : a->dh / 2;
		for (int64_t dd = 0; dd < n; dd++)
			acc[lo + (dd + r) % n] *= corr;
	}
}

ATTN_TILE_FN void attn_tile_softmax_row_stats(const AttnParams *a, const AttnTiles *t, int r, int64_t i0)
{
	if (i0 + r >= a->sq)
		return;
	float m = t->m[r], mnew = attn_tile_row_max(t, r), corr = mnew == -INFINITY ? 1.0f : expf(m - mnew);
	t->l[r] = t->l[r] * corr + t->part[ATTN_TILE_THREADS + 2 * r] + t->part[ATTN_TILE_THREADS + 2 * r + 1];
	t->m[r] = mnew;
}

/* The backward's entries of a tile pair, by every thread: from the scores (t->s) and dP = dO V^T
 * (t->dp), dS (attn_ds, rounded into t->ds) and, for dv (want_p), P times the dropout factor (t->p).
 * t->ds and t->p lie over t->dp and t->s (attn_tiles_carve), so the block goes in two rounds of 32
 * rows: each thread computes its 16 entries of the round's rows, keeping them, and stores them after
 * a barrier, when the round's scores have all been read. A 16-bit row (ldp = 72 elements, 144 bytes)
 * is shorter than an f32 one (ldf = 68, 272 bytes), so rows 0-31 of dS lie within rows 0-16 of dP
 * (read in the first round) and rows 32-63 within rows 16-34 (read by the second round's barrier). */
ATTN_TILE_FN void attn_tile_grad_entries(const AttnParams *a, const AttnTiles *t, int tid, int64_t i0, int64_t j0,
					 const float *mask, int64_t mask_base, uint64_t drop_base, int want_p)
{
	enum { ROUNDS = 2, PER_ROUND = ATTN_TILE * ATTN_TILE / ATTN_TILE_THREADS / ROUNDS };
	for (int round = 0; round < ROUNDS; round++) {
		uint32_t kept[PER_ROUND]; /* dS in the low half, P z in the high */
		for (int n = 0; n < PER_ROUND; n++) {
			int e = tid + (round * PER_ROUND + n) * ATTN_TILE_THREADS, r = e / ATTN_TILE, c = e % ATTN_TILE;
			int64_t i = i0 + r, j = j0 + c;
			float ds = 0, pz = 0;
			if (i < a->sq) {
				float s = attn_tile_score(a, t->s[r * t->ldf + c], mask, mask_base, i, j);
				if (s != -INFINITY)
					ds = attn_ds(a, s, t->lse[r], t->dp[r * t->ldf + c],
						     attn_dropout_factor(a, drop_base, i, j), t->delta[r], &pz);
			}
			kept[n] = attn_tile_st16(a, ds) | (uint32_t)attn_tile_st16(a, pz) << 16;
		}
		ATTN_SYNC(); /* the round's scores and dP read */
		for (int n = 0; n < PER_ROUND; n++) {
			int e = tid + (round * PER_ROUND + n) * ATTN_TILE_THREADS, r = e / ATTN_TILE, c = e % ATTN_TILE;
			t->ds[r * t->ldp + c] = (uint16_t)kept[n];
			if (want_p)
				t->p[r * t->ldp + c] = (uint16_t)(kept[n] >> 16);
		}
	}
}

/* row r's logsumexp and D = dout . out (query i0 + r of query head qh), for the backward */
ATTN_TILE_FN void attn_tile_row_stats(const AttnParams *a, const AttnTiles *t, int r, int64_t qh, int64_t i0,
				      const void *out, const float *lse, const void *dout)
{
	int64_t i = i0 + r;
	if (i >= a->sq) {
		t->lse[r] = -INFINITY;
		t->delta[r] = 0;
		return;
	}
	int64_t qi = (qh * a->sq + i) * a->dh;
	t->lse[r] = lse[qh * a->sq + i];
	t->delta[r] = attn_dot(a, dout, qi, out, qi, a->dh);
}

/* zeros n floats of a tile, by the block's threads */
ATTN_TILE_FN void attn_tile_zero(float *x, int64_t n, int tid)
{
	for (int64_t e = tid; e < n; e += ATTN_TILE_THREADS)
		x[e] = 0;
}

/* rows of an f32 tile (64 x dh, stride lda) rounded into rows row0 .. of a [rows, dh] matrix */
ATTN_TILE_FN void attn_tile_store(const AttnParams *a, void *dst, int64_t row0, int64_t rows, const float *x, int ld,
				  int tid)
{
	uint16_t *d16 = (uint16_t *)dst;
	for (int64_t e = tid; e < ATTN_TILE * a->dh; e += ATTN_TILE_THREADS) {
		int64_t r = e / a->dh, d = e % a->dh;
		if (row0 + r < rows)
			d16[(row0 + r) * a->dh + d] = attn_tile_st16(a, x[r * ld + d]);
	}
}

/* Forward block `bid`: query tile (bid mod tiles) of query head (bid / tiles); out and lse of its
 * rows. smem: attn_tiles_carve(.., ATTN_TILES_FORWARD)'s bytes. */
ATTN_TILE_FN void attn_tile_forward_block(const AttnParams *a, const void *q, const void *k, const void *v,
					  const float *mask, void *out, float *lse, int64_t bid, int tid,
					  unsigned char *smem)
{
	AttnTiles t;
	attn_tiles_carve(&t, smem, a->dh, ATTN_TILES_FORWARD);
	int64_t ntq = (a->sq + ATTN_TILE - 1) / ATTN_TILE, qh = bid / ntq, i0 = bid % ntq * ATTN_TILE;
	int64_t b = qh / a->heads, h = qh % a->heads, kh = b * a->kv_heads + h / (a->heads / a->kv_heads);
	int64_t dh = a->dh, mask_base;
	uint64_t drop_base;
	int warp = tid / 32, lane = tid % 32, strip = warp * 16;
	attn_head_bases(a, b, h, &mask_base, &drop_base);
	const unsigned char *kbase = (const unsigned char *)k + kh * a->sk * dh * 2;
	const unsigned char *vbase = (const unsigned char *)v + kh * a->sk * dh * 2;
	attn_tile_load(a, t.q, t.ldh, (const unsigned char *)q + qh * a->sq * dh * 2, i0, a->sq, tid);
	attn_tile_zero(t.acc, (int64_t)ATTN_TILE * t.lda, tid);
	if (tid < ATTN_TILE) {
		t.m[tid] = -INFINITY;
		t.l[tid] = 0;
	}
	for (int64_t j0 = 0; j0 < a->sk; j0 += ATTN_TILE) {
		if (attn_tile_skip(a, i0, j0))
			continue;
		ATTN_SYNC();
		attn_tile_load(a, t.k, t.ldh, kbase, j0, a->sk, tid);
		attn_tile_load(a, t.v, t.ldh, vbase, j0, a->sk, tid);
		ATTN_SYNC();
		attn_warp_mma(a, lane, t.q + strip * t.ldh, t.ldh, 0, t.k, t.ldh, 1, t.s + strip * t.ldf, t.ldf,
			      ATTN_TILE, (int)dh, 0);
		ATTN_SYNC();
		attn_tile_softmax_max(a, &t, tid, i0, j0, mask, mask_base);
		ATTN_SYNC();
		attn_tile_softmax_exp(a, &t, tid, i0, j0, drop_base);
		ATTN_SYNC();
		if (tid < ATTN_TILE)
			attn_tile_softmax_row_stats(a, &t, tid, i0);
		attn_warp_mma(a, lane, t.p + strip * t.ldp, t.ldp, 0, t.v, t.ldh, 0, t.acc + strip * t.lda, t.lda,
			      (int)dh, ATTN_TILE, 1);
	}
	ATTN_SYNC();
	if (tid < ATTN_TILE && i0 + tid < a->sq) {
		float l = t.l[tid], inv = l > 0 ? 1 / l : 0;
		for (int64_t d = 0; d < dh; d++)
			t.acc[tid * t.lda + d] *= inv;
		lse[qh * a->sq + i0 + tid] = l > 0 ? t.m[tid] + logf(l) : -INFINITY;
	}
	ATTN_SYNC();
	attn_tile_store(a, (unsigned char *)out + qh * a->sq * dh * 2, i0, a->sq, t.acc, t.lda, tid);
}

/* dq block `bid`: query tile (bid mod tiles) of query head (bid / tiles), dq of its rows
 * (overwritten) from every key tile. in: q, k, v, out, lse (f32), dout. */
ATTN_TILE_FN void attn_tile_dq_block(const AttnParams *a, const void *const *in, const float *mask, void *dq,
				     int64_t bid, int tid, unsigned char *smem)
{
	AttnTiles t;
	attn_tiles_carve(&t, smem, a->dh, ATTN_TILES_DQ);
	int64_t ntq = (a->sq + ATTN_TILE - 1) / ATTN_TILE, qh = bid / ntq, i0 = bid % ntq * ATTN_TILE;
	int64_t b = qh / a->heads, h = qh % a->heads, kh = b * a->kv_heads + h / (a->heads / a->kv_heads);
	int64_t dh = a->dh, mask_base, head = qh * a->sq * dh * 2, khead = kh * a->sk * dh * 2;
	uint64_t drop_base;
	int warp = tid / 32, lane = tid % 32, strip = warp * 16;
	attn_head_bases(a, b, h, &mask_base, &drop_base);
	attn_tile_load(a, t.q, t.ldh, (const unsigned char *)in[0] + head, i0, a->sq, tid);
	attn_tile_load(a, t.dout, t.ldh, (const unsigned char *)in[5] + head, i0, a->sq, tid);
	attn_tile_zero(t.acc, (int64_t)ATTN_TILE * t.lda, tid);
	if (tid < ATTN_TILE)
		attn_tile_row_stats(a, &t, tid, qh, i0, in[3], (const float *)in[4], in[5]);
	for (int64_t j0 = 0; j0 < a->sk; j0 += ATTN_TILE) {
		if (attn_tile_skip(a, i0, j0))
			continue;
		ATTN_SYNC();
		attn_tile_load(a, t.k, t.ldh, (const unsigned char *)in[1] + khead, j0, a->sk, tid);
		attn_tile_load(a, t.v, t.ldh, (const unsigned char *)in[2] + khead, j0, a->sk, tid);
		ATTN_SYNC();
		attn_warp_mma(a, lane, t.q + strip * t.ldh, t.ldh, 0, t.k, t.ldh, 1, t.s + strip * t.ldf, t.ldf,
			      ATTN_TILE, (int)dh, 0);
		attn_warp_mma(a, lane, t.dout + strip * t.ldh, t.ldh, 0, t.v, t.ldh, 1, t.dp + strip * t.ldf, t.ldf,
			      ATTN_TILE, (int)dh, 0);
		ATTN_SYNC();
		attn_tile_grad_entries(a, &t, tid, i0, j0, mask, mask_base, drop_base, 0);
		ATTN_SYNC();
		attn_warp_mma(a, lane, t.ds + strip * t.ldp, t.ldp, 0, t.k, t.ldh, 0, t.acc + strip * t.lda, t.lda,
			      (int)dh, ATTN_TILE, 1);
	}
	ATTN_SYNC();
	attn_tile_store(a, (unsigned char *)dq + head, i0, a->sq, t.acc, t.lda, tid);
}

/* dk, dv block `bid`: key tile (bid mod tiles) of kv head (bid / tiles), dk and dv of its rows
 * (overwritten) from every query tile of the kv head's query heads. in as attn_tile_dq_block's. */
ATTN_TILE_FN void attn_tile_dkdv_block(const AttnParams *a, const void *const *in, const float *mask, void *dk,
				       void *dv, int64_t bid, int tid, unsigned char *smem)
{
	AttnTiles t;
	attn_tiles_carve(&t, smem, a->dh, ATTN_TILES_DKDV);
	int64_t ntk = (a->sk + ATTN_TILE - 1) / ATTN_TILE, kh = bid / ntk, j0 = bid % ntk * ATTN_TILE;
	int64_t b = kh / a->kv_heads, hk = kh % a->kv_heads, group = a->heads / a->kv_heads;
	int64_t dh = a->dh, khead = kh * a->sk * dh * 2;
	int warp = tid / 32, lane = tid % 32, strip = warp * 16;
	attn_tile_load(a, t.k, t.ldh, (const unsigned char *)in[1] + khead, j0, a->sk, tid);
	attn_tile_load(a, t.v, t.ldh, (const unsigned char *)in[2] + khead, j0, a->sk, tid);
	attn_tile_zero(t.acc, (int64_t)ATTN_TILE * t.lda, tid);  /* dk */
	attn_tile_zero(t.acc2, (int64_t)ATTN_TILE * t.lda, tid); /* dv */
	for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
		int64_t qh = b * a->heads + h, head = qh * a->sq * dh * 2, mask_base;
		uint64_t drop_base;
		attn_head_bases(a, b, h, &mask_base, &drop_base);
		for (int64_t i0 = 0; i0 < a->sq; i0 += ATTN_TILE) {
			if (attn_tile_skip(a, i0, j0))
				continue;
			ATTN_SYNC();
			attn_tile_load(a, t.q, t.ldh, (const unsigned char *)in[0] + head, i0, a->sq, tid);
			attn_tile_load(a, t.dout, t.ldh, (const unsigned char *)in[5] + head, i0, a->sq, tid);
			if (tid < ATTN_TILE)
				attn_tile_row_stats(a, &t, tid, qh, i0, in[3], (const float *)in[4], in[5]);
			ATTN_SYNC();
			attn_warp_mma(a, lane, t.q + strip * t.ldh, t.ldh, 0, t.k, t.ldh, 1, t.s + strip * t.ldf, t.ldf,
				      ATTN_TILE, (int)dh, 0);
			attn_warp_mma(a, lane, t.dout + strip * t.ldh, t.ldh, 0, t.v, t.ldh, 1, t.dp + strip * t.ldf,
				      t.ldf, ATTN_TILE, (int)dh, 0);
			ATTN_SYNC();
			attn_tile_grad_entries(a, &t, tid, i0, j0, mask, mask_base, drop_base, 1);
			ATTN_SYNC();
			/* this warp's 16 keys: dv += (P z)^T dout, dk += dS^T q */
			attn_warp_mma(a, lane, t.p + strip, t.ldp, 1, t.dout, t.ldh, 0, t.acc2 + strip * t.lda, t.lda,
				      (int)dh, ATTN_TILE, 1);
			attn_warp_mma(a, lane, t.ds + strip, t.ldp, 1, t.q, t.ldh, 0, t.acc + strip * t.lda, t.lda,
				      (int)dh, ATTN_TILE, 1);
		}
	}
	ATTN_SYNC();
	attn_tile_store(a, (unsigned char *)dk + khead, j0, a->sk, t.acc, t.lda, tid);
	attn_tile_store(a, (unsigned char *)dv + khead, j0, a->sk, t.acc2, t.lda, tid);
}

#endif
