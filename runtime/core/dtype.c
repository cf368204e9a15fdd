/* dtype.c: element sizes, and the conversions between f32 and the 16-bit floats (bf16 rounds to
 * nearest even, NaN kept quiet; f16 IEEE half with subnormals and overflow to infinity) that
 * checkpoints, data, compression and half-precision reductions over MPI use on the host. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_half.h"

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

float planrt_half_to_f32_(uint16_t h, planrt_dtype_t t)
{
	return t == planrt_bf16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

/* f16 as planrt_half.h; bf16 to nearest even, but a NaN keeps its payload (made quiet), unlike the
 * compute kernels' single quiet NaN */
uint16_t planrt_f32_to_half_(float x, planrt_dtype_t t)
{
	if (t != planrt_bf16)
		return planrt_narrow_f16(x);
	uint32_t u = f32_bits(x);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

void planrt_halves_to_f32_(const uint16_t *h, float *f, size_t n, planrt_dtype_t t)
{
	for (size_t i = 0; i < n; i++)
		f[i] = planrt_half_to_f32_(h[i], t);
}

void planrt_f32_to_halves_(const float *f, uint16_t *h, size_t n, planrt_dtype_t t)
{
	for (size_t i = 0; i < n; i++)
		h[i] = planrt_f32_to_half_(f[i], t);
}
