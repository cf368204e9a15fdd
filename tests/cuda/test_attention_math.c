/* test_attention_math.c: the CUDA target's fused attention arithmetic (runtime/cuda/
 * planrt_attention_math.h, the per-row functions attention_cuda.cu's threads run) executed on the
 * host, against planrt's CPU kernels (planrt_k_attention_f32 and _grad_f32, tiled): outputs, row
 * logsumexps and dq, dk, dv within 2e-5 of the largest magnitude, for odd sizes (S not a multiple
 * of the CPU's 64-row tiles), head dims 64 / 80 / 128, GQA ratios 1 / 4 / 8, causal, additive
 * padding and no mask, with and without dropout (the keep decisions must be the CPU's: a mismatch
 * moves the outputs far beyond the tolerance). The ring's steps (context parallelism) the same way:
 * for every coordinate of a ring of 2, 3 or 4, contiguous and mirrored (causal load balancing), a
 * K/V block per step through attn_ring_keys' global key positions, the forward merged step after
 * step and the backward's dq accumulated, against planrt_k_ring_attention_f32 and _grad_f32 (out,
 * lse, dq after the last step; each step's dk, dv partial). Prints PASS/FAIL per case; exits 1 on a
 * failure. */
#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "../../runtime/cuda/planrt_attention_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Every row of a call through the math's functions, as attention_cuda.cu's threads run them: the
 * forward's into out and lse, then dq, dk and dv from in (q, k, v, out, lse, dout). */
static void math_rows(const AttnParams *a, int64_t B, const void *q, const void *k, const void *v, const float *mask,
		      void *out, float *lse, const void *const *in, void *dq, void *dk, void *dv)
{
	for (int64_t b = 0; b < B; b++)
		for (int64_t h = 0; h < a->heads; h++)
			for (int64_t i = 0; i < a->sq; i++)
				attn_forward_row(a, q, k, v, mask, b, h, i, 0, out, lse);
	for (int64_t b = 0; b < B; b++) {
		for (int64_t h = 0; h < a->heads; h++)
			for (int64_t i = 0; i < a->sq; i++)
				attn_dq_row(a, in, mask, b, h, i, 0, dq);
		for (int64_t h = 0; h < a->kv_heads; h++)
			for (int64_t j = 0; j < a->sk; j++)
				attn_dkdv_row(a, in, mask, b, h, j, dk, dv);
	}
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
	const void *in[6] = {q, k, v, o[0], lse[0], dout};
	math_rows(&a, B, q, k, v, mask, o[1], lse[1], in, g[1][0], g[1][1], g[1][2]);
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

/* the ring case's buffers: [0] the CPU's, [1] the math's */
typedef struct RingBufs {
	float *o[2], *lse[2], *dq[2], *dk[2], *dv[2];
} RingBufs;

static void ring_alloc(RingBufs *r, int64_t nq, int64_t nk, int64_t nl)
{
	for (int w = 0; w < 2; w++) {
		r->o[w] = calloc((size_t)nq, sizeof(float));
		r->lse[w] = calloc((size_t)nl, sizeof(float));
		r->dq[w] = calloc((size_t)nq, sizeof(float));
		r->dk[w] = calloc((size_t)nk, sizeof(float));
		r->dv[w] = calloc((size_t)nk, sizeof(float));
	}
}

static void ring_free(RingBufs *r)
{
	for (int w = 0; w < 2; w++) {
		free(r->o[w]);
		free(r->lse[w]);
		free(r->dq[w]);
		free(r->dk[w]);
		free(r->dv[w]);
	}
}

/* One rank (coordinate coord) of a ring of `size` over a sequence of S: its query block (two
 * mirrored chunks or one contiguous block, as the offset list says) against a K/V block per step,
 * forward then backward, the CPU's ring kernels against the math's rows; returns the worst
 * relative difference (out, lse and dq after the last step, dk and dv at every step). */
static double ring_rank(int64_t S, int64_t dh, int64_t H, int64_t Hk, int mask_kind, double p, int size, int mirrored,
			int64_t coord, unsigned *seed)
{
	int64_t B = 2, n = S / size, half = n / 2, nq = B * H * n * dh, nk = B * Hk * n * dh, nl = B * H * n;
	int64_t first = mirrored ? coord * half : coord * n, second = mirrored ? (2 * size - 1 - coord) * half
									      : coord * n + half;
	int64_t ldims[4] = {B, H, n, dh}, gdims[4] = {B, H, S, S};
	int64_t offs[8] = {0, 0, first, 0, B / 2, H / 2, second, dh / 2}, mstr[4] = {S, 0, 0, 1};
	float *q = rnd(nq, seed), *dout = rnd(nq, seed), *mask = calloc((size_t)(B * S), sizeof(float));
	for (int64_t b = 0; b < B; b++)
		for (int64_t j = S - 1 - b * (S / 3); j < S; j++)
			mask[b * S + j] = -1e9f; /* the last keys of each sample padded: whole blocks for sample 1 */
	float *k[4], *v[4];
	for (int t = 0; t < size; t++) {
		k[t] = rnd(nk, seed);
		v[t] = rnd(nk, seed);
	}
	RingBufs r;
	ring_alloc(&r, nq, nk, nl);
	double scale = 1 / sqrt((double)dh), e = 0;
	void *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * dh + 3 * 64));
	AttnParams a;
	for (int t = 0; t < size; t++) {
		planrt_k_ring_attention_f32(q, k[t], v[t], mask, mstr, r.o[0], r.lse[0], 4, ldims, Hk, n, scale, mask_kind,
					    p, 77, 5, gdims, offs, scratch, coord, t, size, mirrored);
		if (!attn_params(&a, 4, ldims, Hk, n, scale, mask_kind, mstr, p, 77, 5, gdims, offs) ||
		    !attn_ring_keys(&a, coord, t, size, mirrored))
			return 1;
		for (int64_t b = 0; b < B; b++)
			for (int64_t h = 0; h < H; h++)
				for (int64_t i = 0; i < n; i++)
					attn_forward_row(&a, q, k[t], v[t], mask, b, h, i, t > 0, r.o[1], r.lse[1]);
	}
	double ef[2] = {worst(r.o[0], r.o[1], nq), worst(r.lse[0], r.lse[1], nl)};
	e = ef[0] > ef[1] ? ef[0] : ef[1];
	for (int t = 0; t < size; t++) {
		planrt_k_ring_attention_grad_f32(q, k[t], v[t], mask, mstr, r.o[0], r.lse[0], dout, r.dq[0], r.dk[0], r.dv[0],
						 4, ldims, Hk, n, scale, mask_kind, p, 77, 5, gdims, offs, scratch, coord, t,
						 size, mirrored);
		attn_params(&a, 4, ldims, Hk, n, scale, mask_kind, mstr, p, 77, 5, gdims, offs);
		attn_ring_keys(&a, coord, t, size, mirrored);
		const void *in[6] = {q, k[t], v[t], r.o[0], r.lse[0], dout};
		for (int64_t b = 0; b < B; b++) {
			for (int64_t h = 0; h < H; h++)
				for (int64_t i = 0; i < n; i++)
					attn_dq_row(&a, in, mask, b, h, i, t > 0, r.dq[1]);
			for (int64_t h = 0; h < Hk; h++)
				for (int64_t j = 0; j < n; j++)
					attn_dkdv_row(&a, in, mask, b, h, j, r.dk[1], r.dv[1]);
		}
		double eb[2] = {worst(r.dk[0], r.dk[1], nk), worst(r.dv[0], r.dv[1], nk)};
		e = eb[0] > e ? eb[0] : eb[1] > e ? eb[1] : e;
	}
	double edq = worst(r.dq[0], r.dq[1], nq);
	e = edq > e ? edq : e;
	for (int t = 0; t < size; t++) {
		free(k[t]);
		free(v[t]);
	}
	ring_free(&r);
	free(q);
	free(dout);
	free(mask);
	free(scratch);
	return e;
}

static int run_ring_case(int64_t S, int64_t dh, int64_t H, int64_t Hk, int mask_kind, double p, int size, int mirrored)
{
	unsigned seed = (unsigned)(S * 17 + dh + H * 3 + size * 5 + mirrored);
	double m = 0;
	for (int64_t c = 0; c < size; c++) {
		double e = ring_rank(S, dh, H, Hk, mask_kind, p, size, mirrored, c, &seed);
		m = e > m ? e : m;
	}
	static const char *const masks[] = {"none", "causal", "padding"};
	int ok = m <= 2e-5;
	printf("%s: ring of %d (%s), S %lld, head dim %lld, heads %lld / kv %lld, mask %s, dropout %g: every rank and "
	       "step, worst relative difference %.2e\n",
	       ok ? "PASS" : "FAIL", size, mirrored ? "mirrored" : "contiguous", (long long)S, (long long)dh, (long long)H,
	       (long long)Hk, masks[mask_kind], p, m);
	return !ok;
}

/* attn_ld and attn_st (the device's conversions) against planrt_cast's, bit for bit */
static int conversions_case(planrt_dtype_t t)
{
	AttnParams a = {0};
	a.storage = t == planrt_bf16 ? ATTN_BF16 : ATTN_F16;
	int bad = 0;
	int64_t n = 0;
	unsigned seed = 99;
	for (int64_t i = 0; i < 400000; i++) {
		uint32_t u;
		if (i < 65536) { /* every 16-bit pattern widened, then narrowed back */
			uint16_t h = (uint16_t)i;
			float want, got = attn_ld(&a, &h, 0);
			planrt_cast(&h, t, &want, planrt_f32, 1);
			uint16_t back = 0, want_back = 0;
			attn_st(&a, &back, 0, got);
			planrt_cast(&got, planrt_f32, &want_back, t, 1);
			bad += memcmp(&got, &want, 4) != 0 || back != want_back;
			n++;
			continue;
		}
		seed = seed * 1664525u + 1013904223u;
		u = i % 3 == 0 ? seed : i % 3 == 1 ? (seed & 0x807fffffu) | ((110u + seed % 40u) << 23) /* near f16's range */
						 : (seed & 0xffff8000u) | 0x8000u * (seed & 1u); /* bf16 ties */
		float x;
		memcpy(&x, &u, 4);
		uint16_t got = 0, want = 0;
		attn_st(&a, &got, 0, x);
		planrt_cast(&x, planrt_f32, &want, t, 1);
		bad += got != want;
		n++;
	}
	printf("%s: attn_ld / attn_st %s against planrt_cast: %lld values, %d differ\n", bad ? "FAIL" : "PASS",
	       t == planrt_bf16 ? "bf16" : "f16", (long long)n, bad);
	return bad != 0;
}

static uint16_t *stored(const float *x, int64_t n, planrt_dtype_t t)
{
	uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
	planrt_cast(x, planrt_f32, h, t, n);
	return h;
}

/* the largest difference of two stored tensors over the largest magnitude of the first */
static double worst16(const uint16_t *a, const uint16_t *b, int64_t n, planrt_dtype_t t)
{
	float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
	planrt_cast(a, t, x, planrt_f32, n);
	planrt_cast(b, t, y, planrt_f32, n);
	double w = worst(x, y, n);
	free(x);
	free(y);
	return w;
}

/* attention on 16-bit storage: the rows (a.storage) against planrt_k_attention_16 / _grad_16 */
static int run_case_16(int64_t S, int64_t dh, int64_t H, int64_t Hk, int mask_kind, double p, planrt_dtype_t t)
{
	unsigned seed = (unsigned)(S * 17 + dh + H * 5 + mask_kind + (p > 0));
	int64_t B = 2, nq = B * H * S * dh, nk = B * Hk * S * dh, nl = B * H * S;
	int64_t ldims[4] = {B, H, S, dh}, gdims[4] = {B, H, S, S}, offs[8] = {0, 0, 0, 0, B / 2, H / 2, S / 2, dh / 2};
	int64_t mstr[4] = {S, 0, 0, 1};
	float *qf = rnd(nq, &seed), *kf = rnd(nk, &seed), *vf = rnd(nk, &seed), *gf = rnd(nq, &seed);
	uint16_t *q = stored(qf, nq, t), *k = stored(kf, nk, t), *v = stored(vf, nk, t), *dout = stored(gf, nq, t);
	float *mask = calloc((size_t)(B * S), sizeof(float)), *lse[2];
	for (int64_t b = 0; b < B; b++)
		for (int64_t j = S - 1 - b * (S / 3); j < S; j++)
			mask[b * S + j] = -1e9f;
	uint16_t *o[2], *g[2][3];
	for (int w = 0; w < 2; w++) {
		o[w] = calloc((size_t)nq, 2);
		lse[w] = calloc((size_t)nl, sizeof(float));
		g[w][0] = calloc((size_t)nq, 2);
		g[w][1] = calloc((size_t)nk, 2);
		g[w][2] = calloc((size_t)nk, 2);
	}
	uint8_t *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * dh + 3 * 64));
	double scale = 1 / sqrt((double)dh);
	planrt_k_attention_16(q, k, v, mask, mstr, o[0], lse[0], 4, ldims, Hk, S, scale, mask_kind, p, 77, 5, gdims, offs,
			      scratch, t);
	planrt_k_attention_grad_16(q, k, v, mask, mstr, o[0], lse[0], dout, g[0][0], g[0][1], g[0][2], 4, ldims, Hk, S,
				   scale, mask_kind, p, 77, 5, gdims, offs, scratch, t);
	AttnParams a;
	if (!attn_params(&a, 4, ldims, Hk, S, scale, mask_kind, mstr, p, 77, 5, gdims, offs))
		return 1;
	a.storage = t == planrt_bf16 ? ATTN_BF16 : ATTN_F16;
	const void *in[6] = {q, k, v, o[0], lse[0], dout};
	math_rows(&a, B, q, k, v, mask, o[1], lse[1], in, g[1][0], g[1][1], g[1][2]);
	double e[5] = {worst16(o[0], o[1], nq, t), worst(lse[0], lse[1], nl), worst16(g[0][0], g[1][0], nq, t),
		       worst16(g[0][1], g[1][1], nk, t), worst16(g[0][2], g[1][2], nk, t)};
	double m = 0, ulp = t == planrt_bf16 ? 1.0 / 128 : 1.0 / 1024; /* of a value in [1, 2) */
	for (int i = 0; i < 5; i++)
		m = e[i] > m ? e[i] : m;
	int ok = m <= ulp && e[1] <= 2e-5;
	static const char *const masks[] = {"none", "causal", "padding"};
	printf("%s: %s storage, S %lld, head dim %lld, heads %lld / kv %lld, mask %s, dropout %g: worst relative "
	       "difference %.2e, one unit in the last place of the largest value %.2e (out %.1e lse %.1e dq %.1e dk %.1e dv %.1e)\n",
	       ok ? "PASS" : "FAIL", t == planrt_bf16 ? "bf16" : "f16", (long long)S, (long long)dh, (long long)H,
	       (long long)Hk, masks[mask_kind], p, m, ulp, e[0], e[1], e[2], e[3], e[4]);
	void *all[] = {qf, kf, vf, gf, q, k, v, dout, mask, scratch, o[0], o[1], lse[0], lse[1], g[0][0], g[0][1],
		       g[0][2], g[1][0], g[1][1], g[1][2]};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
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
	static const struct {
		int64_t S, dh, H, Hk;
		int mask;
		double p;
		int size, mirrored;
	} rings[] = {{192, 64, 4, 1, 1, 0.1, 2, 1}, {200, 80, 2, 2, 1, 0, 4, 1}, {144, 64, 2, 2, 1, 0.2, 3, 0},
		     {130, 64, 4, 2, 2, 0.1, 2, 0}, {132, 128, 2, 1, 0, 0, 4, 0}};
	int nr = (int)(sizeof rings / sizeof rings[0]);
	for (int i = 0; i < nr; i++)
		failed += run_ring_case(rings[i].S, rings[i].dh, rings[i].H, rings[i].Hk, rings[i].mask, rings[i].p,
					rings[i].size, rings[i].mirrored);
	n += nr;
	failed += conversions_case(planrt_bf16) + conversions_case(planrt_f16);
	failed += run_case_16(67, 64, 4, 1, 1, 0.1, planrt_bf16) + run_case_16(130, 80, 4, 2, 2, 0, planrt_f16) +
		  run_case_16(65, 128, 2, 2, 0, 0.2, planrt_bf16);
	n += 5;
	printf("attention math: %d passed, %d failed\n", n - failed, failed);
	return failed != 0;
}
