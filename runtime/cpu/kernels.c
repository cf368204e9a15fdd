/* kernels.c: the compute kernels of planrt (see planrt_kernels.h for the API and semantics, which
 * follow torch.nn.functional).
 *
 * The typed kernels are written once, in kernels_impl.h, and instantiated here by including it with
 * T = float (suffix _f32), T = double (suffix _f64) and, for the kernels that save statistics, with
 * double statistics (suffix _f64d, see the header). This file holds what is not typed: the
 * n-dimensional iteration helper, the Philox-4x32-10 generator behind dropout, the bf16 conversions
 * and block copies.
 *
 * Performance notes. Matrix products go to OpenBLAS (cblas_?gemm, row major, transposes passed as
 * flags, never materialised). Row loops are written so that GCC vectorises them; GCC 12's -O2 uses
 * the "very-cheap" vectoriser cost model, which declines almost every loop whose trip count is not
 * known, so this file asks for the dynamic cost model itself (the pragma below), and for
 * -fno-trapping-math (floating-point selects may be if-converted; results are unchanged, only the
 * exception flags of discarded lanes differ) and -fno-math-errno (sqrtf inline). Float reductions
 * use eight partial sums, which vectorise without -ffast-math. The exp- and erf-heavy f32 loops
 * (softmax, cross-entropy, silu, gelu) use branch-free vectorisable versions of our own (kexpf,
 * within 1 ulp of expf; kerff, Abramowitz-Stegun 7.1.26, absolute error < 1.5e-7, the same
 * approximation ATen's vectorised CPU erf uses); the f64 instantiation, which the
 * finite-difference tests use, calls libm. No kernel
 * allocates, except moe_route / moe_aux_loss with more than KSTACK_EXPERTS experts (per-expert
 * counters).
 *
 * Instruction-set levels (planrt_cpu.h, cpu_table.h). Built with PLANRT_CPU_VARIANT=avx2 (and the
 * level's -march), this file holds only the f32 kernels, named planrt_k_*_f32_avx2, and their
 * table planrt_cpu_table_avx2; in the baseline build every f32 kernel first hands its call to the
 * running level's table when planrt_cpu_select has set one. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math", "no-math-errno")
#endif

#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_cpu.h"
#include "planrt_exec.h"
#include "planrt_half.h"
#include "planrt_kernels.h"
#include "planrt_math.h"

#include "cpu_table.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KMAX_RANK 16      /* most dims any n-dimensional kernel takes */
#define KSTACK_EXPERTS 1024 /* MoE per-expert counters live on the stack up to this many experts */

static void kfatal(const char *what)
{
	fprintf(stderr, "planrt: internal error: %s\n", what);
	abort();
}

/* ---- n-dimensional iteration ------------------------------------------------------------------
 * A KView is an index space of up to KMAX_RANK dims with up to three stride sets (one per operand).
 * kview_init drops dims of size 1 and merges neighbouring dims that every operand walks contiguously,
 * so that the innermost dim is as long as possible; kernels then run a plain loop over the innermost
 * dim and kview_next steps the outer ones. */
typedef struct {
	int rank;               /* >= 1 after kview_init */
	int nst;                /* number of stride sets */
	int64_t total;          /* number of elements, 0 if any dim is 0 */
	int64_t dims[KMAX_RANK];
	int64_t st[3][KMAX_RANK];
	int64_t idx[KMAX_RANK]; /* position in the outer dims */
	int64_t off[3];         /* element offset of the current row per operand */
} KView;

static void kview_init(KView *v, int rank, const int64_t *dims, int nst, const int64_t *s0, const int64_t *s1,
		       const int64_t *s2)
{
	const int64_t *src[3] = {s0, s1, s2};
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("kernel rank out of range");
	v->nst = nst;
	v->rank = 0;
	v->total = 1;
	for (int d = 0; d < rank; d++) {
		v->total *= dims[d];
		if (dims[d] == 1)
			continue;
		int r = v->rank;
		int merge = r > 0;
		for (int s = 0; s < nst && merge; s++)
			merge = v->st[s][r - 1] == src[s][d] * dims[d];
		if (merge) {
			v->dims[r - 1] *= dims[d];
			for (int s = 0; s < nst; s++)
				v->st[s][r - 1] = src[s][d];
			continue;
		}
		v->dims[r] = dims[d];
		for (int s = 0; s < nst; s++)
			v->st[s][r] = src[s][d];
		v->rank++;
	}
	if (v->rank == 0) {
		v->rank = 1;
		v->dims[0] = 1;
		for (int s = 0; s < nst; s++)
			v->st[s][0] = 0;
	}
	for (int d = 0; d < v->rank; d++)
		v->idx[d] = 0;
	for (int s = 0; s < 3; s++)
		v->off[s] = 0;
}

/* Advances the outer dims (all but the innermost) by one row. */
static inline void kview_next(KView *v)
{
	for (int d = v->rank - 2; d >= 0; d--) {
		for (int s = 0; s < v->nst; s++)
			v->off[s] += v->st[s][d];
		if (++v->idx[d] < v->dims[d])
			return;
		for (int s = 0; s < v->nst; s++)
			v->off[s] -= v->st[s][d] * v->dims[d];
		v->idx[d] = 0;
	}
}

/* Row-major strides of dims. */
static void kstrides(int rank, const int64_t *dims, int64_t *st)
{
	int64_t s = 1;
	for (int d = rank - 1; d >= 0; d--) {
		st[d] = s;
		s *= dims[d];
	}
}

/* ---- Philox-4x32-10 ---------------------------------------------------------------------------
 * Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), the Random123 reference
 * constants. Dropout keeps global element i of (seed, key) when the first output word of
 *   philox4x32_10(counter = (lo32(i), hi32(i), lo32(key), hi32(key)), key = (lo32(seed), hi32(seed)))
 * divided by 2^32 is >= p. The generator's two key words take the 64-bit seed and the 64-bit
 * per-tensor key goes into the upper counter words, so neither is truncated. Any other
 * implementation (the CUDA backend) must use this exact mapping to reproduce the masks. */
static inline uint32_t philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1)
{
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k0 += 0x9E3779B9u;
			k1 += 0xBB67AE85u;
		}
		uint64_t p0 = (uint64_t)0xD2511F53u * c0;
		uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n1 = (uint32_t)p1;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		uint32_t n3 = (uint32_t)p0;
		c0 = n0;
		c1 = n1;
		c2 = n2;
		c3 = n3;
	}
	return c0;
}

#ifndef PLANRT_CPU_VARIANT
/* Set while planrt_main evaluates held-out batches: dropout is the identity then, as in PyTorch's
 * eval mode. */
int planrt_evaluating_;
long long planrt_attention_tiles_[2], planrt_attention_scores_[2];
double planrt_attention_s_;
#endif

/* The keep threshold: u / 2^32 >= p  <=>  u >= ceil(p 2^32) for integer u (p 2^32 is exact). */
static uint64_t dropout_threshold(double p)
{
	if (!(p > 0))
		return 0;
	if (p >= 1)
		return (uint64_t)1 << 32;
	return (uint64_t)ceil(p * 4294967296.0);
}

/* Philox's rounds over a vector of counters (x86-64, every level): one lane per element, the
 * widest vector the build's instruction set has. The 32 x 32 -> 64-bit products are pmuludq's
 * (the low halves of 64-bit lanes, even and odd lanes in turn), which gcc's vector extensions do
 * not express: written as 64-bit products they become full 64-bit multiplies (vpmullq), three
 * times the work. */
#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__AVX512F__)
#define KV_BYTES 64
#define KV_MUL_EPU32(a, b) ((kv64)_mm512_mul_epu32((__m512i)(a), (__m512i)(b)))
#elif defined(__AVX2__)
#define KV_BYTES 32
#define KV_MUL_EPU32(a, b) ((kv64)_mm256_mul_epu32((__m256i)(a), (__m256i)(b)))
#else
#define KV_BYTES 16
#define KV_MUL_EPU32(a, b) ((kv64)_mm_mul_epu32((__m128i)(a), (__m128i)(b)))
#endif
typedef uint32_t kv32 __attribute__((vector_size(KV_BYTES)));
typedef uint64_t kv64 __attribute__((vector_size(KV_BYTES)));
#define KV_LANES (KV_BYTES / 4)

/* the high and low halves of m * a, lane by lane */
static inline void kv_mulhilo(kv32 a, uint32_t m, kv32 *hi, kv32 *lo)
{
	kv64 mm = (kv64){0} + m;
	kv64 even = KV_MUL_EPU32(a, mm), odd = KV_MUL_EPU32((kv64)a >> 32, mm);
	*lo = (kv32)((even & 0xffffffffu) | (odd << 32));
	*hi = (kv32)((even >> 32) | (odd & 0xffffffff00000000u));
}

typedef uint8_t kv8 __attribute__((vector_size(KV_LANES)));

/* mask[l] for the KV_LANES counters (c0, c1) (the element indices' low and high words), as
 * philox_first: kept iff the first output word u >= thr (thr32 = thr, or all dropped when thr is
 * 2^32, p = 1) */
static inline void kv_dropout_lanes(uint8_t *mask, kv32 c0, kv32 c1, uint64_t thr, uint32_t k0, uint32_t k1,
				    uint32_t c2k, uint32_t c3k)
{
	kv32 c2 = (kv32){0} + c2k, c3 = (kv32){0} + c3k;
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k0 += 0x9E3779B9u;
			k1 += 0xBB67AE85u;
		}
		kv32 hi0, lo0, hi1, lo1;
		kv_mulhilo(c0, 0xD2511F53u, &hi0, &lo0);
		kv_mulhilo(c2, 0xCD9E8D57u, &hi1, &lo1);
		c0 = hi1 ^ c1 ^ k0;
		c2 = hi0 ^ c3 ^ k1;
		c1 = lo1;
		c3 = lo0;
	}
	kv32 keep = thr > 0xffffffffu ? (kv32){0} : (kv32)(c0 >= (uint32_t)thr) & 1;
	kv8 bytes = __builtin_convertvector(keep, kv8);
	memcpy(mask, &bytes, KV_LANES);
}

/* the counters of KV_LANES elements with global indices g0 + l * gs */
static inline void kv_counters(uint64_t g0, int64_t gs, kv32 *c0, kv32 *c1)
{
	kv32 iota;
	for (int l = 0; l < KV_LANES; l++)
		iota[l] = (uint32_t)l;
	if (gs == 1 && (uint32_t)g0 <= 0xffffffffu - KV_LANES) { /* no carry into the high word */
		*c0 = (uint32_t)g0 + iota;
		*c1 = (kv32){0} + (uint32_t)(g0 >> 32);
		return;
	}
	for (int l = 0; l < KV_LANES; l++) {
		uint64_t g = g0 + (uint64_t)(l * gs);
		(*c0)[l] = (uint32_t)g;
		(*c1)[l] = (uint32_t)(g >> 32);
	}
}
#endif

/* Writes mask[i] for n elements whose global indices are g0 + i * gs: KV_LANES counters at a time
 * on x86-64 (above), else sixteen in separate lanes of arrays so that the 32x32 -> 64-bit
 * multiplies of Philox vectorise; the stream is the same as philox_first element by element. */
static void dropout_mask_row(uint8_t *mask, int64_t n, uint64_t g0, int64_t gs, uint64_t thr, uint64_t seed,
			     uint64_t key)
{
	const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
	const uint32_t c2k = (uint32_t)key, c3k = (uint32_t)(key >> 32);
	int64_t i = 0;
#ifdef KV_LANES
	for (; i + KV_LANES <= n; i += KV_LANES) {
		kv32 c0, c1;
		kv_counters(g0 + (uint64_t)(i * gs), gs, &c0, &c1);
		kv_dropout_lanes(mask + i, c0, c1, thr, k0, k1, c2k, c3k);
	}
#else
	enum { LANES = 16 };
	for (; i + LANES <= n; i += LANES) {
		uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
		for (int l = 0; l < LANES; l++) {
			uint64_t g = g0 + (uint64_t)((i + l) * gs);
			c0[l] = (uint32_t)g;
			c1[l] = (uint32_t)(g >> 32);
			c2[l] = c2k;
			c3[l] = c3k;
		}
		uint32_t r0 = k0, r1 = k1;
		for (int r = 0; r < 10; r++) {
			if (r > 0) {
				r0 += 0x9E3779B9u;
				r1 += 0xBB67AE85u;
			}
			for (int l = 0; l < LANES; l++) {
				uint64_t p0 = (uint64_t)0xD2511F53u * c0[l];
				uint64_t p1 = (uint64_t)0xCD9E8D57u * c2[l];
				uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ r0;
				uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ r1;
				c1[l] = (uint32_t)p1;
				c3[l] = (uint32_t)p0;
				c0[l] = n0;
				c2[l] = n2;
			}
		}
		for (int l = 0; l < LANES; l++)
			mask[i + l] = (uint64_t)c0[l] >= thr;
	}
#endif
	for (; i < n; i++) {
		uint64_t g = g0 + (uint64_t)(i * gs);
		uint32_t u = philox_first((uint32_t)g, (uint32_t)(g >> 32), c2k, c3k, k0, k1);
		mask[i] = (uint64_t)u >= thr;
	}
}

/* Fills the mask of a local block (see planrt_k_dropout_*) and returns the element count. A block
 * in two halves that are apart in the global tensor (a balanced ring's, planrt_block_split_dim) is
 * drawn half by half: each element keys on its global index. */
static int64_t dropout_mask(uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank, const int64_t *gdims,
			    const int64_t *ldims, const int64_t *offs)
{
	int64_t gst[KMAX_RANK] = {0}, lst[KMAX_RANK] = {0};
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("dropout rank out of range");
	kstrides(rank, gdims, gst);
	kstrides(rank, ldims, lst);
	int m = planrt_block_split_dim(rank, ldims, offs);
	int64_t total = 0;
	for (int h = 0; h < (m < 0 ? 1 : 2); h++) {
		int64_t hdims[KMAX_RANK], hoffs[2 * KMAX_RANK], first = 0;
		if (m >= 0)
			first = planrt_block_half(rank, ldims, offs, m, h, hdims, hoffs);
		const int64_t *dims = m >= 0 ? hdims : ldims, *at = m >= 0 ? hoffs : offs;
		uint64_t gbase = 0;
		for (int d = 0; d < rank; d++)
			gbase += (uint64_t)(at[d] * gst[d]);
		KView v;
		kview_init(&v, rank, dims, 2, lst, gst, NULL);
		if (v.total == 0)
			continue;
		uint64_t thr = dropout_threshold(p);
		uint8_t *base = mask + (m >= 0 ? first * lst[m] : 0);
		int64_t n = v.dims[v.rank - 1], gs = v.st[1][v.rank - 1];
		for (int64_t done = 0; done < v.total; done += n) {
			dropout_mask_row(base + v.off[0], n, gbase + (uint64_t)v.off[1], gs, thr, seed, key);
			kview_next(&v);
		}
		total += v.total;
	}
	return total;
}

#ifndef PLANRT_CPU_VARIANT
/* dropout on x, y stored as `storage` (bf16 / f16): the mask as planrt_k_dropout draws it, each kept
 * element widened, scaled in f32 and rounded once, as the casts around the f32 kernel compute it */
void planrt_k_dropout_16(const void *x, void *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			 const int64_t *gdims, const int64_t *ldims, const int64_t *offs, planrt_dtype_t storage)
{
	if (storage != planrt_bf16 && storage != planrt_f16)
		kfatal("dropout_16: the storage type is not bf16 or f16");
	if (planrt_evaluating_) /* evaluation: the identity */
		p = 0;
	int64_t n = dropout_mask(mask, p, seed, key, rank, gdims, ldims, offs);
	float sc = p >= 1 ? 0.0f : (float)(1.0 / (1.0 - p));
	const uint16_t *xs = (const uint16_t *)x;
	uint16_t *ys = (uint16_t *)y;
	if (storage == planrt_bf16)
		for (int64_t i = 0; i < n; i++)
			ys[i] = planrt_narrow_bf16(mask[i] ? planrt_widen_bf16(xs[i]) * sc : 0.0f);
	else
		for (int64_t i = 0; i < n; i++)
			ys[i] = planrt_narrow_f16(mask[i] ? planrt_widen_f16(xs[i]) * sc : 0.0f);
}
#endif

/* kexpf and kerff, the vectorisable expf and erff, live in planrt_math.h (generated programs use
 * them in fused loops too). */

/* ---- labels ------------------------------------------------------------------------------------
 * A label counts for a loss over classes when it is in [0, classes) and not ignore_index; one that
 * is neither is bad (see planrt_k_check_labels). */
static inline int klabel_counts(int32_t label, int64_t classes, int32_t ignore_index)
{
	return label != ignore_index && label >= 0 && label < classes;
}

#ifndef PLANRT_CPU_VARIANT
int64_t planrt_k_check_labels(const int32_t *labels, int64_t n, int64_t classes, int32_t ignore_index, int64_t *valid,
			      int64_t *bad_index, int32_t *bad_value)
{
	int64_t bad = 0, good = 0;
	for (int64_t i = 0; i < n; i++) {
		if (klabel_counts(labels[i], classes, ignore_index)) {
			good++;
		} else if (labels[i] != ignore_index) {
			if (bad++ == 0) {
				*bad_index = i;
				*bad_value = labels[i];
			}
		}
	}
	if (valid)
		*valid = good;
	return bad;
}
#endif

/* ---- the typed kernels ------------------------------------------------------------------------- */
#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define FN(name) KCAT(name, S)

#define T float
#define ST float
#ifdef PLANRT_CPU_VARIANT /* a level's build: planrt_k_*_f32_<level> */
#define S PLANRT_CPU_NAME(f32, PLANRT_CPU_VARIANT)
#define KLEVEL(name, args) ((void)0)
#define KLEVEL_VALUE(name, args) ((void)0)
#else
#define S f32
#define KLEVEL PLANRT_CPU_DISPATCH
#define KLEVEL_VALUE PLANRT_CPU_DISPATCH_VALUE
#endif
#define KEXP kexpf
#define KLOG logf
#define KERF kerff
#define KTANH tanhf
#define KSIN sinf
#define KCOS cosf
#define KPOW powf
#define KSQRT sqrtf
#define KGEMM cblas_sgemm
#include "kernels_impl.h"
#include "attention_impl.h"
#undef KLEVEL
#undef KLEVEL_VALUE
#undef T
#undef ST
#undef S
#undef KEXP
#undef KLOG
#undef KERF
#undef KTANH
#undef KSIN
#undef KCOS
#undef KPOW
#undef KSQRT
#undef KGEMM

#ifdef PLANRT_CPU_VARIANT
/* the level's table: its build of every f32 kernel and of optim.c's functions */
const planrt_cpu_table_t PLANRT_CPU_NAME(planrt_cpu_table, PLANRT_CPU_VARIANT) = {
#define KENTRY(name) .name = PLANRT_CPU_NAME(name##_f32, PLANRT_CPU_VARIANT),
#define FENTRY(name) .name = PLANRT_CPU_NAME(name, PLANRT_CPU_VARIANT),
	PLANRT_CPU_KERNELS(KENTRY) PLANRT_CPU_FUNCTIONS(FENTRY)
#undef KENTRY
#undef FENTRY
};
#else /* the baseline's double kernels (the finite-difference tests), bf16 and block copies */
#define KLEVEL(name, args) ((void)0)
#define KLEVEL_VALUE(name, args) ((void)0)
#define T double
#define ST float
#define S f64
#define KEXP exp
#define KLOG log
#define KERF erf
#define KTANH tanh
#define KSIN sin
#define KCOS cos
#define KPOW pow
#define KSQRT sqrt
#define KGEMM cblas_dgemm
#include "kernels_impl.h"
#include "attention_impl.h"
#undef ST
#undef S

#define ST double
#define S f64d
#define KI_STATS_ONLY
#include "kernels_impl.h"
#undef KI_STATS_ONLY
#undef T
#undef ST
#undef S
#undef KEXP
#undef KLOG
#undef KERF
#undef KTANH
#undef KSIN
#undef KCOS
#undef KPOW
#undef KSQRT
#undef KGEMM

/* ---- 2-byte elements permuted as they are stored (bf16, f16): K_PERMUTE_16 ----------------------- */
#define T uint16_t
#define S u16
void planrt_k_permute_u16(int rank, const int64_t *in_dims, const int *perm, const uint16_t *in, uint16_t *out);
#include "permute_impl.h"
#undef T
#undef S

void planrt_k_permute_16(int rank, const int64_t *in_dims, const int *perm, const void *in, void *out)
{
	planrt_k_permute_u16(rank, in_dims, perm, in, out);
}

/* ---- bf16 ---------------------------------------------------------------------------------------
 * Round to nearest even on the upper 16 bits, as torch's c10::BFloat16: infinities stay infinite,
 * finite values past the largest bf16 round to infinity, every NaN becomes the quiet NaN 0x7fc0. */
void planrt_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &x[i], 4);
		uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
		y[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0 : (uint16_t)r;
	}
}

void planrt_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)x[i] << 16;
		memcpy(&y[i], &u, 4);
	}
}

/* ---- bf16 and f16 GEMMs -----------------------------------------------------------------------
 * The operands stay bf16 (f16) in memory; each f32 GEMM runs on tiles widened into one scratch
 * allocation of at most 16 MiB: a tile of columns of op(B) (all of K), then each tile of rows of
 * op(A) under it (all of K), and, for a bf16 C, the C tile, widened when accumulating and rounded
 * back once. The tiles are as large as that bound allows (halving the longer side), so a product
 * that fits is one f32 GEMM, the widened f32 GEMM's bit for bit; a larger one is several, each
 * element still one f32 dot product over all of K (OpenBLAS may order its terms differently for a
 * smaller GEMM: equal to f32 rounding, not bit for bit). The batch
 * entries merge as planrt_k_bmm merges them (a shared B under stacked A: one tall GEMM; a sum of
 * A_i^T B_i into one C: one GEMM over the stacked K); other products into one C add up in f32. */
#define KBF16_SCRATCH_FLOATS ((int64_t)1 << 22)

/* n values of 16-bit type t widened to f32, and back (bf16: the loops above; f16: planrt_cast's) */
static void widen_16(const uint16_t *x, float *y, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		planrt_k_bf16_to_f32(x, y, n);
	else
		planrt_cast(x, t, y, planrt_f32, n);
}

static void narrow_16(const float *x, uint16_t *y, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		planrt_k_f32_to_bf16(x, y, n);
	else
		planrt_cast(x, planrt_f32, y, t, n);
}

/* rows [r0, r0 + nr) of op(X) = X (trans = 0, X stored [rows, K]) or X^T (trans = 1, X stored
 * [K, rows]), of 16-bit type ab, into t, in X's layout: [nr, K] or [K, nr]; returns the tile's
 * leading dimension */
static int64_t widen_rows(const uint16_t *X, planrt_dtype_t ab, int trans, int64_t rows, int64_t K, int64_t r0,
			  int64_t nr, float *t)
{
	if (!trans) {
		widen_16(X + r0 * K, t, nr * K, ab);
		return K;
	}
	for (int64_t k = 0; k < K; k++)
		widen_16(X + k * rows + r0, t + k * nr, nr, ab);
	return nr;
}

typedef struct {
	int64_t m, n; /* rows of op(A), columns of op(B) per tile */
} Bf16Tile;

static Bf16Tile bf16_tile(int64_t M, int64_t N, int64_t K)
{
	Bf16Tile t = {M, N};
	while ((t.m + t.n) * K + t.m * t.n > KBF16_SCRATCH_FLOATS && (t.m > 16 || t.n > 16)) {
		if (t.m >= t.n)
			t.m = (t.m + 1) / 2;
		else
			t.n = (t.n + 1) / 2;
	}
	return t;
}

static void bf16_gemm_one(int ta, int tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, const uint16_t *B,
			  planrt_dtype_t ab, void *C, planrt_dtype_t c_type, int beta, Bf16Tile tile, float *scratch)
{
	float *bt = scratch, *at = bt + tile.n * K, *ct = at + tile.m * K;
	for (int64_t n0 = 0; n0 < N; n0 += tile.n) {
		int64_t nt = N - n0 < tile.n ? N - n0 : tile.n;
		int64_t ldb = widen_rows(B, ab, !tb, N, K, n0, nt, bt); /* op(B)'s columns are op(B)^T's rows */
		for (int64_t m0 = 0; m0 < M; m0 += tile.m) {
			int64_t mt = M - m0 < tile.m ? M - m0 : tile.m;
			int64_t lda = widen_rows(A, ab, ta, M, K, m0, mt, at);
			float *c = c_type == planrt_f32 ? (float *)C + m0 * N + n0 : ct;
			int64_t ldc = c_type == planrt_f32 ? N : nt;
			uint16_t *ch = (uint16_t *)C + m0 * N + n0;
			if (c_type != planrt_f32 && beta)
				for (int64_t i = 0; i < mt; i++)
					widen_16(ch + i * N, ct + i * nt, nt, c_type);
			cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)mt,
				    (int)nt, (int)K, 1.0f, at, lda > 0 ? (int)lda : 1, bt, ldb > 0 ? (int)ldb : 1,
				    beta ? 1.0f : 0.0f, c, (int)ldc);
			if (c_type != planrt_f32)
				for (int64_t i = 0; i < mt; i++)
					narrow_16(ct + i * nt, ch + i * N, nt, c_type);
		}
	}
}

static void matmul_16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a, int64_t stride_a,
		      const uint16_t *B, int trans_b, int64_t stride_b, planrt_dtype_t ab, void *C, planrt_dtype_t c_type,
		      int64_t stride_c, int accumulate)
{
	if (c_type != planrt_f32 && c_type != ab)
		kfatal("planrt_k_matmul_bf16 / _f16: C must be f32 or the operands' type");
	if (batch <= 0 || M <= 0 || N <= 0)
		return;
	planrt_comm_progress_(); /* a transfer in flight moves before the GEMM, not after it (planrt.h) */
	if (batch > 1 && stride_b == 0 && !trans_a && stride_a == M * K && stride_c == M * N) {
		M *= batch;
		batch = 1;
	} else if (batch > 1 && stride_c == 0 && trans_a && !trans_b && stride_a == K * M && stride_b == K * N) {
		K *= batch;
		batch = 1;
	}
	Bf16Tile tile = bf16_tile(M, N, K);
	float *scratch = malloc(sizeof(float) * (size_t)((tile.m + tile.n) * K + tile.m * tile.n + 1));
	if (!scratch)
		kfatal("planrt_k_matmul_bf16 / _f16: out of memory for the widened tiles");
	if (planrt_tracing_)
		planrt_trace_begin_("gemm", "kernel");
	int reduces = batch > 1 && stride_c == 0;
	if (reduces) { /* one C that every product adds into, in f32, a 16-bit C rounded once at the end */
		float *sum = c_type == planrt_f32 ? (float *)C : malloc(sizeof(float) * (size_t)(M * N));
		if (!sum)
			kfatal("planrt_k_matmul_bf16 / _f16: out of memory for the sum");
		if (!accumulate)
			memset(sum, 0, sizeof(float) * (size_t)(M * N));
		else if (c_type != planrt_f32)
			widen_16((const uint16_t *)C, sum, M * N, c_type);
		for (int64_t b = 0; b < batch; b++)
			bf16_gemm_one(trans_a, trans_b, M, N, K, A + b * stride_a, B + b * stride_b, ab, sum, planrt_f32, 1, tile,
				      scratch);
		if (c_type != planrt_f32) {
			narrow_16(sum, (uint16_t *)C, M * N, c_type);
			free(sum);
		}
	} else {
		size_t esize = c_type == planrt_f32 ? 4 : 2;
		for (int64_t b = 0; b < batch; b++)
			bf16_gemm_one(trans_a, trans_b, M, N, K, A + b * stride_a, B + b * stride_b, ab,
				      (char *)C + (size_t)(b * stride_c) * esize, c_type, accumulate, tile, scratch);
	}
	if (planrt_tracing_) {
		char args[160];
		snprintf(args, sizeof args, "\"M\":%lld,\"N\":%lld,\"K\":%lld,\"flops\":%.0f,\"dtype\":\"%s\"", (long long)M,
			 (long long)N, (long long)K, 2.0 * (double)batch * (double)M * (double)N * (double)K,
			 ab == planrt_bf16 ? "bf16" : "f16");
		planrt_trace_end_(args);
	}
	free(scratch);
}

void planrt_k_matmul_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			  int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			  int64_t stride_c, int accumulate)
{
	matmul_16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, planrt_bf16, C, c_type, stride_c, accumulate);
}

void planrt_k_matmul_f16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			 int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			 int64_t stride_c, int accumulate)
{
	matmul_16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, planrt_f16, C, c_type, stride_c, accumulate);
}

/* ---- block copies ----------------------------------------------------------------------------- */
void planrt_k_block_copy(size_t elem, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
			 void *tensor, void *block, int gather)
{
	int64_t gst[KMAX_RANK], lst[KMAX_RANK];
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("block_copy rank out of range");
	kstrides(rank, gdims, gst);
	kstrides(rank, ldims, lst);
	int64_t base = 0;
	for (int d = 0; d < rank; d++)
		base += offs[d] * gst[d];
	KView v;
	kview_init(&v, rank, ldims, 2, lst, gst, NULL);
	if (v.total == 0)
		return;
	char *t = (char *)tensor + (size_t)base * elem, *b = block;
	int64_t n = v.dims[v.rank - 1], ts = v.st[1][v.rank - 1];
	for (int64_t done = 0; done < v.total; done += n) {
		char *tp = t + (size_t)v.off[1] * elem, *bp = b + (size_t)v.off[0] * elem;
		if (ts == 1 || n == 1) {
			if (gather)
				memcpy(bp, tp, (size_t)n * elem);
			else
				memcpy(tp, bp, (size_t)n * elem);
		} else {
			for (int64_t i = 0; i < n; i++) {
				if (gather)
					memcpy(bp + (size_t)i * elem, tp + (size_t)(i * ts) * elem, elem);
				else
					memcpy(tp + (size_t)(i * ts) * elem, bp + (size_t)i * elem, elem);
			}
		}
		kview_next(&v);
	}
}
#endif /* !PLANRT_CPU_VARIANT */
