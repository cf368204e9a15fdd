/* test_decode.c: generation's kernels (runtime/cpu/decode.c) against independent references.
 *   - planrt_k_decode_attention_f32, fed one token at a time with a key/value cache, against
 *     planrt_k_attention_f32 over the whole causal sequence (the no-cache forward): every position's
 *     output within 1e-5, for multi-head, grouped-query and multi-query shapes and batch 2; the
 *     cache holds exactly the keys and values fed; a position outside the cache is reported.
 *   - planrt_sample_token: temperature 0 is torch.argmax (the first largest); top_k = 1 is greedy
 *     at any temperature; the same (seed, draw) gives the same token; top-k never leaves the k
 *     largest; at temperature T the frequencies of 40,000 draws match softmax(logits / T). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_kernels.h"
#include "report.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void) /* in [-1, 1) */
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static float *random_floats(int64_t n)
{
	float *x = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		x[i] = uniform();
	return x;
}

/* x[b, h, t, :] of a [B, H, S, D] tensor into row (b, h) of a [B, H, 1, D] one */
static void take_position(const float *x, float *row, int64_t B, int64_t H, int64_t S, int64_t D, int64_t t)
{
	for (int64_t bh = 0; bh < B * H; bh++)
		memcpy(row + bh * D, x + (bh * S + t) * D, sizeof(float) * (size_t)D);
}

static void check_decode(int64_t B, int64_t H, int64_t Hk, int64_t S, int64_t D)
{
	float *q = random_floats(B * H * S * D), *k = random_floats(B * Hk * S * D), *v = random_floats(B * Hk * S * D);
	float *full = calloc((size_t)(B * H * S * D), sizeof(float)), *lse = calloc((size_t)(B * H * S), sizeof(float));
	void *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * D + 3 * 64));
	int64_t ldims[4] = {B, H, S, D}, gdims[4] = {B, H, S, S}, offs[8] = {0, 0, 0, 0, B / 2, H / 2, S / 2, D / 2}, mstr[4] = {0, 0, 0, 0};
	double scale = 1 / sqrt((double)D);
	planrt_k_attention_f32(q, k, v, NULL, mstr, full, lse, 4, ldims, Hk, S, scale, 1, 0, 0, 0, gdims, offs, scratch);

	float *kc = calloc((size_t)(B * Hk * S * D), sizeof(float)), *vc = calloc((size_t)(B * Hk * S * D), sizeof(float));
	float *qt = malloc(sizeof(float) * (size_t)(B * H * D)), *kt = malloc(sizeof(float) * (size_t)(B * Hk * D));
	float *vt = malloc(sizeof(float) * (size_t)(B * Hk * D)), *out = malloc(sizeof(float) * (size_t)(B * H * D));
	int32_t *pos = malloc(sizeof(int32_t) * (size_t)B);
	double worst = 0;
	int64_t bad = -1;
	for (int64_t t = 0; t < S; t++) {
		take_position(q, qt, B, H, S, D, t);
		take_position(k, kt, B, Hk, S, D, t);
		take_position(v, vt, B, Hk, S, D, t);
		for (int64_t b = 0; b < B; b++)
			pos[b] = (int32_t)t;
		if (planrt_k_decode_attention_f32(qt, kt, vt, kc, vc, out, pos, B, H, Hk, D, S, scale) != -1)
			bad = t;
		for (int64_t bh = 0; bh < B * H; bh++)
			for (int64_t d = 0; d < D; d++)
				worst = fmax(worst, fabs(out[bh * D + d] - full[(bh * S + t) * D + d]));
	}
	report(bad == -1 && worst <= 1e-5,
	       "decode attention B=%lld H=%lld Hk=%lld S=%lld D=%lld: cached token by token = causal forward (max diff %.2e)",
	       (long long)B, (long long)H, (long long)Hk, (long long)S, (long long)D, worst);
	report(!memcmp(kc, k, sizeof(float) * (size_t)(B * Hk * S * D)) &&
		       !memcmp(vc, v, sizeof(float) * (size_t)(B * Hk * S * D)),
	       "decode attention B=%lld Hk=%lld: the caches hold every key and value fed, at their positions",
	       (long long)B, (long long)Hk);
	pos[B - 1] = (int32_t)S;
	report(planrt_k_decode_attention_f32(qt, kt, vt, kc, vc, out, pos, B, H, Hk, D, S, scale) == B - 1,
	       "decode attention: position %lld past a cache of %lld is reported (sample %lld)", (long long)S, (long long)S,
	       (long long)(B - 1));
	free(q), free(k), free(v), free(full), free(lse), free(scratch), free(kc), free(vc);
	free(qt), free(kt), free(vt), free(out), free(pos);
}

static void check_sampler(void)
{
	float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.5f, 0.0f};
	report(planrt_sample_token(logits, 6, 0, 0, 1, 0) == 1, "sample: temperature 0 is the first largest logit");
	int greedy = 1;
	for (uint64_t d = 0; d < 200; d++)
		greedy &= planrt_sample_token(logits, 6, 1.7, 1, 42, d) == 1;
	report(greedy, "sample: top_k = 1 is greedy at temperature 1.7 over 200 draws");
	int same = 1, differs = 0;
	for (uint64_t d = 0; d < 200; d++) {
		int32_t a = planrt_sample_token(logits, 6, 1.0, 0, 7, d);
		same &= a == planrt_sample_token(logits, 6, 1.0, 0, 7, d);
		differs |= a != planrt_sample_token(logits, 6, 1.0, 0, 8, d);
	}
	report(same && differs, "sample: the same (seed, draw) gives the same token; another seed another sequence");
	int inside = 1;
	for (uint64_t d = 0; d < 2000; d++) {
		int32_t t = planrt_sample_token(logits, 6, 5.0, 3, 3, d);
		inside &= t == 1 || t == 3 || t == 4;
	}
	report(inside, "sample: top_k = 3 draws only the 3 largest logits (at temperature 5)");
	enum { DRAWS = 40000 };
	int count[6] = {0};
	double T = 0.8, z = 0, worst = 0;
	for (uint64_t d = 0; d < DRAWS; d++)
		count[planrt_sample_token(logits, 6, T, 0, 11, d)]++;
	for (int i = 0; i < 6; i++)
		z += exp(logits[i] / T);
	for (int i = 0; i < 6; i++)
		worst = fmax(worst, fabs((double)count[i] / DRAWS - exp(logits[i] / T) / z));
	report(worst < 0.01, "sample: %d draws at temperature %.1f follow softmax(logits / T) (max frequency error %.4f)",
	       DRAWS, T, worst);
}

int main(void)
{
	check_decode(1, 4, 4, 9, 16);  /* multi-head */
	check_decode(2, 4, 2, 13, 8);  /* grouped-query, batch 2 */
	check_decode(1, 6, 1, 70, 32); /* multi-query, past one 64-key tile */
	check_sampler();
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
