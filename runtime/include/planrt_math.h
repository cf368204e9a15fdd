/* planrt_math.h: branch-free, vectorisable expf and erff shared by the kernels (kernels.c) and the
 * fused element-wise loops planc emits, so a fused GELU and the kernel one give the same bits.
 * kexpf is within 1 ulp of expf; kerff is Abramowitz and Stegun 7.1.26 (absolute error < 1.5e-7),
 * the formula ATen's vectorised CPU erf uses. Then the element-wise functions and their derivatives
 * (planrt_F(x), planrt_F_grad(x, dy) = dy F'(x), from the input) that planrt_k_unary_f32 computes. */
#ifndef PLANRT_MATH_H
#define PLANRT_MATH_H

#include <math.h>
#include <stdint.h>

/* The CUDA target's fused loops (kernels.cu) call these on the device too. */
#ifdef __CUDACC__
#define PLANRT_HD __host__ __device__
#else
#define PLANRT_HD
#endif

/* a vectorisable expf ------------------------------------------------------------------------
 * exp(x) = 2^k e^r with k = round(x / ln 2), |r| <= ln2 / 2, e^r by a degree-6 polynomial (Cephes
 * coefficients); 2^k built in the exponent bits. Below -87.33 the result is 0 (so -inf gives 0, as
 * masked softmax needs), above 88.72 +inf, NaN propagates. Branch-free so loops calling it
 * vectorise. */
static inline PLANRT_HD float kexpf(float x)
{
	const float hi = 88.7228317f, lo = -87.3365479f;
	float xc = x > hi ? hi : (x < lo ? lo : x);
	float k = xc * 1.44269504089f + 12582912.0f; /* round to nearest through the float mantissa */
	k -= 12582912.0f;
	float r = xc - k * 0.693359375f;
	r = r - k * -2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	int32_t ki = (int32_t)k;
	/* k in [-126, 128]: split 2^k in two factors so that k = 128 does not overflow the exponent */
	int32_t k1 = ki >> 1, k2 = ki - k1;
	union {
		int32_t i;
		float f;
	} s1, s2;
	s1.i = (k1 + 127) << 23;
	s2.i = (k2 + 127) << 23;
	float y = p * s1.f * s2.f;
	y = x > hi ? INFINITY : y;
	y = x < lo ? 0.0f : y;
	return x != x ? x : y;
}

/* erf(x) = sign(x) (1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-x^2)), t = 1 / (1 + p |x|):
 * Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7. Branch-free. */
static inline PLANRT_HD float kerff(float x)
{
	float ax = fabsf(x);
	float t = 1.0f / (1.0f + 0.3275911f * ax);
	float p = 1.061405429f;
	p = p * t - 1.453152027f;
	p = p * t + 1.421413741f;
	p = p * t - 0.284496736f;
	p = p * t + 0.254829592f;
	float r = 1.0f - p * t * kexpf(-ax * ax);
	return copysignf(r, x);
}

static inline PLANRT_HD float planrt_gelu_erf(float x)
{
	return 0.5f * x * (1.0f + kerff(x * 0.70710678118654752f));
}

/* cdf is 0.5 + 0.5 erf, not 0.5 (1 + erf): the same bits at every level (halving is exact), and
 * cdf + x pdf then adds one product, not two, so that gcc's -ffp-contract=fast and planc's LLVM back
 * end fuse the same one (docs/cpu.md: which of two products gcc fuses depends on its code's shape) */
static inline PLANRT_HD float planrt_gelu_erf_grad(float x, float dy)
{
	float cdf = 0.5f + 0.5f * kerff(x * 0.70710678118654752f);
	float pdf = 0.39894228040143268f * kexpf(-0.5f * x * x);
	return dy * (cdf + x * pdf);
}

static inline PLANRT_HD float planrt_silu(float x)
{
	return x / (1.0f + kexpf(-x));
}

static inline PLANRT_HD float planrt_silu_grad(float x, float dy)
{
	float s = 1.0f / (1.0f + kexpf(-x));
	return dy * s * (1.0f + x * (1.0f - s));
}

/* torch.sin, cos, exp, log, tanh, sigmoid. tanh is libm's: the 1 - 2 / (e^2x + 1) form loses its
 * relative precision near 0. */
static inline PLANRT_HD float planrt_sin(float x)
{
	return sinf(x);
}

static inline PLANRT_HD float planrt_sin_grad(float x, float dy)
{
	return dy * cosf(x);
}

static inline PLANRT_HD float planrt_cos(float x)
{
	return cosf(x);
}

static inline PLANRT_HD float planrt_cos_grad(float x, float dy)
{
	return -dy * sinf(x);
}

static inline PLANRT_HD float planrt_exp(float x)
{
	return kexpf(x);
}

static inline PLANRT_HD float planrt_exp_grad(float x, float dy)
{
	return dy * kexpf(x);
}

static inline PLANRT_HD float planrt_log(float x)
{
	return logf(x);
}

static inline PLANRT_HD float planrt_log_grad(float x, float dy)
{
	return dy / x;
}

static inline PLANRT_HD float planrt_tanh(float x)
{
	return tanhf(x);
}

static inline PLANRT_HD float planrt_tanh_grad(float x, float dy)
{
	float t = tanhf(x);
	return dy * (1.0f - t * t);
}

static inline PLANRT_HD float planrt_sigmoid(float x)
{
	return 1.0f / (1.0f + kexpf(-x));
}

static inline PLANRT_HD float planrt_sigmoid_grad(float x, float dy)
{
	float s = 1.0f / (1.0f + kexpf(-x));
	return dy * s * (1.0f - s);
}

#endif
