/* dtype.c: element sizes, and the conversions between f32 and the 16-bit floats (bf16 rounds to
 * nearest even, NaN kept quiet; f16 IEEE half with subnormals and overflow to infinity) that
 * checkpoints, data, compression and half-precision reductions over MPI use on the host. */
#define PLANRT_INTERNAL
#include "planrt.h"

#include <string.h>

size_t planrt_dtype_size(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return 4;
	case planrt_bf16: return 2;
	case planrt_f16: return 2;
	case planrt_i32: return 4;
	case planrt_u8: return 1;
	case planrt_f64: return 8;
	}
	return 0;
}

static uint32_t f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float x;
	memcpy(&x, &u, 4);
	return x;
}

float planrt_half_to_f32_(uint16_t h, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		return bits_f32((uint32_t)h << 16);
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
	if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
		float f = (float)mant * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t planrt_f32_to_half_(float x, planrt_dtype_t t)
{
	uint32_t u = f32_bits(x);
	if (t == planrt_bf16) {
		if ((u & 0x7fffffffu) > 0x7f800000u)
			return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
		return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
	}
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	u &= 0x7fffffffu;
	if (u >= 0x7f800000u)
		return sign | 0x7c00 | (u > 0x7f800000u ? 0x200 : 0);
	if (u >= 0x477ff000u) /* at least 65520: rounds to infinity */
		return sign | 0x7c00;
	if (u < 0x38800000u) { /* below 2^-14: an f16 subnormal, mantissa = x * 2^24 rounded to even */
		float f = bits_f32(u) * 0x1p24f;
		float r = f - (float)(uint32_t)f; /* f < 1024: exact */
		uint32_t m = (uint32_t)f;
		if (r > 0.5f || (r == 0.5f && (m & 1)))
			m++;
		return (uint16_t)(sign | m);
	}
	u += 0xfffu + ((u >> 13) & 1);
	return (uint16_t)(sign | ((u - 0x38000000u) >> 13));
}

void planrt_halves_to_f32_(const uint16_t *h, float *f, size_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16) {
		for (size_t i = 0; i < n; i++)
			f[i] = bits_f32((uint32_t)h[i] << 16);
		return;
	}
	for (size_t i = 0; i < n; i++)
		f[i] = planrt_half_to_f32_(h[i], t);
}

void planrt_f32_to_halves_(const float *f, uint16_t *h, size_t n, planrt_dtype_t t)
{
	for (size_t i = 0; i < n; i++)
		h[i] = planrt_f32_to_half_(f[i], t);
}
