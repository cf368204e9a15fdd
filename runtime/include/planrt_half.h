/* planrt_half.h: f32 <-> bf16 and f32 <-> f16 on bit patterns, written once for the host and the
 * device. bf16 widens exactly and narrows to nearest even (infinities stay, finite values past the
 * largest bf16 become infinities, every NaN the quiet NaN 0x7fc0, as torch's c10::BFloat16); f16 is
 * IEEE half: exact widening, narrowing to nearest even with subnormals, overflow to infinity, a NaN
 * kept quiet with its sign. planrt_cast's element conversions (cpu/step.c) and the files that
 * convert single values (core/dtype.c) use these on the host; the CUDA attention's rows
 * (cuda/planrt_attention_math.h) use them on the device, so the device rounds as planrt_cast does
 * (tests/cuda/test_attention_math.c compares them over every 16-bit pattern). */
#ifndef PLANRT_HALF_H
#define PLANRT_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PLANRT_HALF_FN __host__ __device__ static inline
#else
#define PLANRT_HALF_FN static inline
#endif

PLANRT_HALF_FN uint32_t planrt_half_f32_bits_(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return u;
}

PLANRT_HALF_FN float planrt_half_bits_f32_(uint32_t u)
{
	float x;
	memcpy(&x, &u, 4);
	return x;
}

PLANRT_HALF_FN float planrt_widen_bf16(uint16_t h)
{
	return planrt_half_bits_f32_((uint32_t)h << 16);
}

PLANRT_HALF_FN uint16_t planrt_narrow_bf16(float x)
{
	uint32_t u = planrt_half_f32_bits_(x);
	return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

PLANRT_HALF_FN float planrt_widen_f16(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
	if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
		float f = (float)mant * 5.9604644775390625e-8f;
		return sign ? -f : f;
	}
	if (exp == 31)
		return planrt_half_bits_f32_(sign | 0x7f800000u | (mant << 13));
	return planrt_half_bits_f32_(sign | ((exp + 112) << 23) | (mant << 13));
}

PLANRT_HALF_FN uint16_t planrt_narrow_f16(float x)
{
	uint32_t u = planrt_half_f32_bits_(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	u &= 0x7fffffffu;
	if (u >= 0x7f800000u)
		return (uint16_t)(sign | 0x7c00u | (u > 0x7f800000u ? 0x200u : 0u));
	if (u >= 0x477ff000u) /* at least 65520: rounds to infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (u < 0x38800000u) { /* below 2^-14: an f16 subnormal, mantissa = x * 2^24 rounded to even */
		float f = planrt_half_bits_f32_(u) * 16777216.0f;
		float r = f - (float)(uint32_t)f; /* f < 1024: exact */
		uint32_t m = (uint32_t)f;
		if (r > 0.5f || (r == 0.5f && (m & 1u)))
			m++;
		return (uint16_t)(sign | m);
	}
	u += 0xfffu + ((u >> 13) & 1u);
	return (uint16_t)(sign | ((u - 0x38000000u) >> 13));
}

#endif
