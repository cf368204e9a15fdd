/* test_attention_math.c: the CUDA target's fused attention arithmetic (runtime/cuda/
 * planrt_attention_math.h, the per-row functions attention_cuda.cu's threads run) executed on the
 * host, against planrt's CPU kernels (planrt_k_attention_f32 and _grad_f32, tiled): outputs, row
 * logsumexps and dq, dk, dv within 2e-5 of the largest magnitude, for odd sizes (S not a multiple
 * of the CPU's 64-row tiles), head dims 64 / 80 / 128, GQA ratios 1 / 4 / 8, causal, additive
 * padding and no mask, with and without dropout (the keep decisions must be the CPU's: a mismatch
 * moves the outputs far beyond the tolerance). Prints PASS/FAIL per case; exits 1 on a failure. */
#include "planrt_kernels.h"
#include "../../runtime/cuda/planrt_attention_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float *rnd(int64_t n, unsigned *s)
{
	float *x = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		*s = *s * 1103515245u + 12345u;
		x[i] = (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	return x;
}

static double worst(const float *a, const float *b, int64_t n)
{
	double w = 0, big = 1e-6;
	for (int64_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		w = d > w ? d : w;
		big = fabs(a[i]) > big ? fabs(a[i]) : big;
	}
	return w / big;
}

static int run_case(int64_t S, int64_t dh, int64_t H, int64_t Hk, int mask_kind, double p)
{
	unsigned seed = (unsigned)(S * 131 + dh * 7 + H + mask_kind * 3 + (p > 0));
	int64_t B = 2, nq = B * H * S * dh, nk = B * Hk * S * dh, nl = B * H * S;
	int64_t ldims[4] = {B, H, S, dh}, gdims[4] = {B, H, S, S}, offs[8] = {0, 0, 0, 0, B / 2, H / 2, S / 2, dh / 2};
	int64_t mstr[4] = {S, 0, 0, 1}; /* a [B, 1, 1, S] key padding mask */
	float *q = rnd(nq, &seed), *k = rnd(nk, &seed), *v = rnd(nk, &seed), *dout = rnd(nq, &seed);
	float *mask = calloc((size_t)(B * S), sizeof(float));
	for (int64_t b = 0; b < B; b++)
		for (int64_t j = S - 1 - b * (S / 3); j < S; j++)
			mask[b * S + j] = -1e9f; /* the last keys of each sample padded */
	float *o[2], *lse[2], *g[2][3];
	for (int w = 0; w < 2; w++) {
		o[w] = calloc((size_t)nq, sizeof(float));
		lse[w] = calloc((size_t)nl, sizeof(float));
		g[w][0] = calloc((size_t)nq, sizeof(float));
		g[w][1] = calloc((size_t)nk, sizeof(float));
		g[w][2] = calloc((size_t)nk, sizeof(float));
	}
	void *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * dh + 3 * 64));
	planrt_k_attention_f32(q, k, v, mask, mstr, o[0], lse[0], 4, ldims, Hk, S, 1 / sqrt((double)dh), mask_kind, p,
			       77, 5, gdims, offs, scratch);
	planrt_k_attention_grad_f32(q, k, v, mask, mstr, o[0], lse[0], dout, g[0][0], g[0][1], g[0][2], 4, ldims, Hk, S,
				    1 / sqrt((double)dh), mask_kind, p, 77, 5, gdims, offs, scratch);
	AttnParams a;
	if (!attn_params(&a, 4, ldims, Hk, S, 1 / sqrt((double)dh), mask_kind, mstr, p, 77, 5, gdims, offs))
		return 1;
	for (int64_t b = 0; b < B; b++)
		for (int64_t h = 0; h < H; h++)
			for (int64_t i = 0; i < S; i++)
				attn_forward_row(&a, q, k, v, mask, b, h, i, o[1], lse[1]);
	const float *in[6] = {q, k, v, o[0], lse[0], dout};
	for (int64_t b = 0; b < B; b++) {
		for (int64_t h = 0; h < H; h++)
			for (int64_t i = 0; i < S; i++)
				attn_dq_row(&a, in, mask, b, h, i, g[1][0]);
		for (int64_t h = 0; h < Hk; h++)
			for (int64_t j = 0; j < S; j++)
				attn_dkdv_row(&a, in, mask, b, h, j, g[1][1], g[1][2]);
	}
	double e[5] = {worst(o[0], o[1], nq), worst(lse[0], lse[1], nl), worst(g[0][0], g[1][0], nq),
		       worst(g[0][1], g[1][1], nk), worst(g[0][2], g[1][2], nk)};
	double m = 0;
	for (int i = 0; i < 5; i++)
		m = e[i] > m ? e[i] : m;
	static const char *const masks[] = {"none", "causal", "padding"};
	int ok = m <= 2e-5;
	printf("%s: S %lld, head dim %lld, heads %lld / kv %lld, mask %s, dropout %g: worst relative difference %.2e "
	       "(out %.1e lse %.1e dq %.1e dk %.1e dv %.1e)\n",
	       ok ? "PASS" : "FAIL", (long long)S, (long long)dh, (long long)H, (long long)Hk, masks[mask_kind], p, m, e[0],
	       e[1], e[2], e[3], e[4]);
	return !ok;
}

int main(void)
{
	static const struct {
		int64_t S, dh, H, Hk;
		int mask;
		double p;
	} cases[] = {{67, 64, 2, 2, 1, 0}, {130, 80, 4, 1, 2, 0}, {97, 128, 8, 1, 0, 0},
		     {67, 64, 4, 1, 1, 0.1}, {130, 80, 8, 2, 2, 0.2}, {65, 128, 2, 2, 0, 0.1}};
	int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
	for (int i = 0; i < n; i++)
		failed += run_case(cases[i].S, cases[i].dh, cases[i].H, cases[i].Hk, cases[i].mask, cases[i].p);
	printf("attention math: %d passed, %d failed\n", n - failed, failed);
	return failed != 0;
}
