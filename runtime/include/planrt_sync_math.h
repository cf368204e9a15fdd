/* planrt_sync_math.h: the per-element logic of the sync strategies' device kernels (sync_cuda.cu),
 * plain C that compiles for the host and, under nvcc, for the device, so that tests/cuda/
 * test_sync_math.c runs it on the CPU against the CPU runtime's kernels (compress.c, sync.c,
 * step.c, comm_mpi.c's half reduction) on random inputs, bit for bit.
 *
 *   half types      f32 -> bf16 / f16 rounded to nearest even (NaN quiet, past the largest finite
 *                   value infinity) and back, planrt_f32_to_half_'s and planrt_half_to_f32_'s bits;
 *   compress_cast   the error-feedback narrowing v = g + r, h = round(v), r = v - h; the sum of the
 *                   ranks' halves formed in f32 in rank order and rounded once;
 *   compress_topk   magnitudes as ordered bits, one step of the bit-by-bit search for the k-th
 *                   largest, and which entries are kept (above the threshold, then ties by index);
 *   compress_powersgd  the Gram-Schmidt orthonormalisation of P's columns, in compress.c's order
 *                   (the device runs it on one thread per matrix: the sums are sequential doubles);
 *   local_average   the average and the outer (DiLoCo) SGD step of one element;
 *   async           the master's check of the parameter version a worker computed a step on;
 *   fp16            the loss-scale rule: unscaled norm, the found-inf verdict, the clipping coefficient.
 *
 * Products and sums are written with sm_mul / sm_add, which on the device round each operation
 * (__fmul_rn, __fadd_rn): nvcc would otherwise contract a * b + c into one FMA, which the CPU
 * (x86-64 without -march=native) never does. */
#ifndef PLANRT_SYNC_MATH_H
#define PLANRT_SYNC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "planrt_math.h" /* PLANRT_HD */

#define PLANRT_SM static inline PLANRT_HD

/* the dtype codes of planrt.h's planrt_dtype_t that matter here */
enum { PLANRT_SM_BF16 = 1, PLANRT_SM_F16 = 2 };

PLANRT_SM uint32_t sm_bits(float x)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(x);
#else
	uint32_t u;
	memcpy(&u, &x, 4);
	return u;
#endif
}

PLANRT_SM float sm_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float x;
	memcpy(&x, &u, 4);
	return x;
#endif
}

PLANRT_SM float sm_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

PLANRT_SM float sm_add(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fadd_rn(a, b);
#else
	return a + b;
#endif
}

PLANRT_SM float sm_sub(float a, float b)
{
#ifdef __CUDA_ARCH__
	return __fsub_rn(a, b);
#else
	return a - b;
#endif
}

PLANRT_SM double sm_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
	return __dmul_rn(a, b);
#else
	return a * b;
#endif
}

PLANRT_SM double sm_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
	return __dadd_rn(a, b);
#else
	return a + b;
#endif
}

/* ------------------------------------------------------------------ half types */

PLANRT_SM float sm_widen(uint16_t h, int t)
{
	if (t == PLANRT_SM_BF16)
		return sm_float((uint32_t)h << 16);
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
		float f = (float)m * 5.9604644775390625e-8f;
		return sign ? -f : f;
	}
	if (e == 31)
		return sm_float(sign | 0x7f800000u | (m << 13));
	return sm_float(sign | ((e + 112) << 23) | (m << 13));
}

PLANRT_SM uint16_t sm_narrow(float x, int t)
{
	uint32_t u = sm_bits(x);
	if (t == PLANRT_SM_BF16) {
		if ((u & 0x7fffffffu) > 0x7f800000u)
			return (uint16_t)((u >> 16) | 0x40u);
		return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	}
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u);
	if (a >= 0x477ff000u) /* 65520 and above (infinity included) */
		return (uint16_t)(sign | 0x7c00u);
	if (a < 0x38800000u) { /* an f16 subnormal: the f32 significand shifted to units of 2^-24 */
		int e = (int)(a >> 23);
		if (e < 102) /* below 2^-25 (f32 subnormals too): rounds to zero */
			return sign;
		uint32_t sig = (a & 0x7fffffu) | 0x800000u;
		int shift = 126 - e; /* 14 .. 24 */
		uint32_t m = sig >> shift, rest = sig & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
		if (rest > halfway || (rest == halfway && (m & 1u)))
			m++;
		return (uint16_t)(sign | m);
	}
	a += 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

/* ------------------------------------------------------------------ compress_cast */

/* One element of the gradient bucket: the residual added (the bucket keeps v = g + r, as
 * compress.c leaves it), v rounded to the wire type, the residual what the rounding lost. */
PLANRT_SM uint16_t sm_feedback_narrow(float *g, float *residual, int t)
{
	float v = residual ? sm_add(*g, *residual) : *g;
	*g = v;
	uint16_t h = sm_narrow(v, t);
	if (residual)
		*residual = sm_sub(v, sm_widen(h, t));
	return h;
}

/* The ranks' halves of one element (part r at parts[r * stride]) summed in f32 in rank order and
 * rounded once: comm_mpi.c's half-precision reduction (there in MPI's order; see docs/gpu.md). */
PLANRT_SM uint16_t sm_sum_halves(const uint16_t *parts, int64_t stride, int nparts, int t)
{
	float s = sm_widen(parts[0], t);
	for (int r = 1; r < nparts; r++)
		s = sm_add(s, sm_widen(parts[(int64_t)r * stride], t));
	return sm_narrow(s, t);
}

/* ------------------------------------------------------------------ compress_topk */

/* |v| as bits: for magnitudes (no NaN) their order is the values' order */
PLANRT_SM uint32_t sm_magnitude_bits(float v)
{
	return sm_bits(v) & 0x7fffffffu;
}

/* One step of the search for the k-th largest magnitude, from the top bit down: the threshold so
 * far with bit set is kept when at least k magnitudes are at or above it (count_at_least). After
 * bit 0 the threshold is the k-th largest magnitude exactly. */
PLANRT_SM uint32_t sm_kth_step(uint32_t thr, int bit, int64_t count_at_least, int64_t k)
{
	return count_at_least >= k ? thr | (1u << bit) : thr;
}

PLANRT_SM uint32_t sm_kth_candidate(uint32_t thr, int bit)
{
	return thr | (1u << bit);
}

/* Whether the entry of magnitude bits a is kept: above the threshold, or at it among the first
 * `ties` such entries in index order (tie_rank: how many entries at the threshold come before it). */
PLANRT_SM int sm_topk_keep(uint32_t a, uint32_t thr, int64_t tie_rank, int64_t ties)
{
	return a > thr || (a == thr && tie_rank < ties);
}

/* ------------------------------------------------------------------ compress_powersgd */

/* The r columns of p (rows x r, row-major) made orthonormal in order (classical Gram-Schmidt
 * against the columns already done, dot products summed in double), compress.c's orthonormalise. */
PLANRT_SM void sm_orthonormalise(float *p, int64_t rows, int r)
{
	for (int j = 0; j < r; j++) {
		for (int k = 0; k < j; k++) {
			double dot = 0;
			for (int64_t i = 0; i < rows; i++)
				dot = sm_dadd(dot, sm_dmul((double)p[i * r + j], (double)p[i * r + k]));
			float d = (float)dot;
			for (int64_t i = 0; i < rows; i++)
				p[i * r + j] = sm_sub(p[i * r + j], sm_mul(d, p[i * r + k]));
		}
		double norm = 0;
		for (int64_t i = 0; i < rows; i++)
			norm = sm_dadd(norm, sm_dmul((double)p[i * r + j], (double)p[i * r + j]));
		float scale = (float)(1.0 / (sqrt(norm) + 1e-8));
		for (int64_t i = 0; i < rows; i++)
			p[i * r + j] = sm_mul(p[i * r + j], scale);
	}
}

/* The error-feedback residual of one element after decompression: what this rank's share of the
 * sum (m ~ P Q^T, share = 1 / ranks) did not carry. */
PLANRT_SM float sm_powersgd_residual(float before, float after, float share)
{
	return sm_sub(before, sm_mul(after, share));
}

/* ------------------------------------------------------------------ local_average */

/* One element of the averaged parameters from the replicas' sum. outer 0: plain local SGD; 1 and
 * 2: torch.optim.SGD (dampening 0; 2 Nesterov) on the outer gradient anchor - average, with
 * momentum when momentum is not NULL; the result is the new anchor. */
PLANRT_SM float sm_local_average(float sum, float replicas, int outer, float lr, float mu, float *anchor,
				 float *momentum)
{
	float x = sum / replicas;
	if (!outer)
		return x;
	float g = sm_sub(*anchor, x);
	if (momentum) {
		*momentum = sm_add(sm_mul(mu, *momentum), g);
		g = outer == 2 ? sm_add(g, sm_mul(mu, *momentum)) : *momentum;
	}
	*anchor = sm_sub(*anchor, sm_mul(lr, g));
	return *anchor;
}

/* ------------------------------------------------------------------ async */

/* sync.c's planrt_async_gather: a worker's gradient of step `step` computed on parameter version
 * `version` is refused when the version is from the future or more than `staleness` updates old */
PLANRT_SM int sm_async_too_stale(double version, int64_t step, int staleness)
{
	return version > (double)step || (double)step - version > staleness;
}

/* ------------------------------------------------------------------ fp16 loss scaling */

/* step.c's planrt_unscale_clip_coef: the unscaled norm from the scaled gradients' sum of squares;
 * when it is not finite the step is skipped (returns 1, *coef NaN, which the optimizer reads as
 * "leave everything as it is"); else *coef folds 1 / scale into the clipping coefficient. */
PLANRT_SM int sm_unscale_clip(double sumsq, double scale, double max_norm, double *norm, double *coef)
{
	*norm = sqrt(sumsq) / scale;
	if (!isfinite(*norm)) {
		*coef = NAN;
		return 1;
	}
	*coef = (max_norm > 0 && *norm > max_norm ? max_norm / (*norm + 1e-6) : 1.0) / scale;
	return 0;
}

#endif
