/* decode.c: the two kernels generation adds to a training runtime (docs/generate.md).
 *
 * Decode attention is the fused attention of one new token against a key/value cache: the token's
 * keys and values are appended at its position and its query attends over positions 0 .. t, so a
 * generated token costs O(t) instead of re-running the whole prefix (O(t^2)). It computes what
 * planrt_k_attention_f32 computes for the last row of a causal attention over the same keys (the
 * tests compare the two within 1e-5). The sampler turns a row of logits into the next token:
 * greedy, or temperature and top-k drawn with the run's Philox seed, so every rank of every plan
 * draws the same token. */
#include "planrt.h"
#include "planrt_kernels.h"
#include "planrt_program.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One query row against cache rows [0, n): out = softmax(scale * q . k_j) @ v_j. */
static void attend_row(const float *q, const float *kc, const float *vc, float *out, int64_t n, int64_t hd,
		       double scale, float *scores)
{
	float max = -INFINITY;
	for (int64_t j = 0; j < n; j++) {
		float s = 0;
		for (int64_t d = 0; d < hd; d++)
			s += q[d] * kc[j * hd + d];
		scores[j] = s * (float)scale;
		if (scores[j] > max)
			max = scores[j];
	}
	float sum = 0;
	for (int64_t j = 0; j < n; j++) {
		scores[j] = expf(scores[j] - max);
		sum += scores[j];
	}
	for (int64_t d = 0; d < hd; d++)
		out[d] = 0;
	for (int64_t j = 0; j < n; j++) {
		float p = scores[j] / sum;
		for (int64_t d = 0; d < hd; d++)
			out[d] += p * vc[j * hd + d];
	}
}

int64_t planrt_k_decode_attention_f32(const float *q, const float *k, const float *v, float *kcache, float *vcache,
				      float *out, const int32_t *pos, int64_t batch, int64_t heads, int64_t kv_heads,
				      int64_t head_dim, int64_t tmax, double scale)
{
	for (int64_t b = 0; b < batch; b++)
		if (pos[b] < 0 || pos[b] >= tmax)
			return b;
	float *scores = malloc(sizeof(float) * (size_t)(tmax ? tmax : 1));
	if (!scores)
		abort();
	int64_t group = heads / kv_heads;
	for (int64_t b = 0; b < batch; b++) {
		int64_t t = pos[b];
		for (int64_t kh = 0; kh < kv_heads; kh++) {
			int64_t row = ((b * kv_heads + kh) * tmax + t) * head_dim;
			memcpy(kcache + row, k + (b * kv_heads + kh) * head_dim, sizeof(float) * (size_t)head_dim);
			memcpy(vcache + row, v + (b * kv_heads + kh) * head_dim, sizeof(float) * (size_t)head_dim);
		}
		for (int64_t h = 0; h < heads; h++) {
			int64_t base = (b * kv_heads + h / group) * tmax * head_dim;
			attend_row(q + (b * heads + h) * head_dim, kcache + base, vcache + base,
				   out + (b * heads + h) * head_dim, t + 1, head_dim, scale, scores);
		}
	}
	free(scores);
	return -1;
}

void planrt_decode_attention_f32(const float *q, const float *k, const float *v, float *kcache, float *vcache,
				 float *out, const int32_t *pos, int64_t batch, int64_t heads, int64_t kv_heads,
				 int64_t head_dim, int64_t tmax, double scale)
{
	int64_t b = planrt_k_decode_attention_f32(q, k, v, kcache, vcache, out, pos, batch, heads, kv_heads, head_dim,
						  tmax, scale);
	if (b >= 0)
		planrt_fatal("generation: position %d of sequence %lld is past the model's context of %lld tokens",
			     (int)pos[b], (long long)b, (long long)tmax);
}

static int64_t argmax_first(const float *x, int64_t n)
{
	int64_t best = 0;
	for (int64_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* The k-th largest logit (k in [1, n]): the threshold top-k keeps at and above. */
static float kth_largest(const float *x, int64_t n, int64_t k)
{
	float *sorted = malloc(sizeof(float) * (size_t)n);
	if (!sorted)
		abort();
	memcpy(sorted, x, sizeof(float) * (size_t)n);
	/* partial selection: k passes of the largest remaining (k is small in practice) or a full sort */
	for (int64_t i = 0; i < k; i++) {
		int64_t m = i;
		for (int64_t j = i + 1; j < n; j++)
			if (sorted[j] > sorted[m])
				m = j;
		float t = sorted[i];
		sorted[i] = sorted[m];
		sorted[m] = t;
	}
	float kth = sorted[k - 1];
	free(sorted);
	return kth;
}

/* keep[i]: logit i is among the top_k largest (all when top_k <= 0 or >= vocab); ties at the k-th
 * largest are taken in index order, so exactly k are kept. */
static void top_k_keep(const float *x, int64_t n, int64_t k, unsigned char *keep)
{
	if (k <= 0 || k >= n) {
		memset(keep, 1, (size_t)n);
		return;
	}
	float kth = kth_largest(x, n, k);
	int64_t above = 0;
	for (int64_t i = 0; i < n; i++)
		above += x[i] > kth;
	int64_t ties = k - above;
	for (int64_t i = 0; i < n; i++) {
		keep[i] = x[i] > kth || (x[i] == kth && ties > 0);
		ties -= x[i] == kth && keep[i];
	}
}

int32_t planrt_sample_token(const float *logits, int64_t vocab, double temperature, int64_t top_k, uint64_t seed,
			    uint64_t draw)
{
	if (temperature <= 0 || vocab <= 1)
		return (int32_t)argmax_first(logits, vocab);
	unsigned char *keep = malloc((size_t)vocab);
	if (!keep)
		abort();
	top_k_keep(logits, vocab, top_k, keep);
	float max = logits[argmax_first(logits, vocab)];
	double total = 0;
	for (int64_t i = 0; i < vocab; i++)
		if (keep[i])
			total += exp(((double)logits[i] - max) / temperature);
	uint32_t r[4];
	planrt_philox(seed, planrt_name_key("generate"), draw, r);
	double u = ((double)(((uint64_t)r[0] << 21) ^ r[1]) / 9007199254740992.0) * total; /* 53 bits in [0, 1) */
	double acc = 0;
	int64_t pick = -1;
	for (int64_t i = 0; i < vocab && pick < 0; i++) {
		if (!keep[i])
			continue;
		acc += exp(((double)logits[i] - max) / temperature);
		if (u < acc)
			pick = i;
	}
	for (int64_t i = vocab - 1; pick < 0; i--) /* u rounded to the very top of the total */
		if (keep[i])
			pick = i;
	free(keep);
	return (int32_t)pick;
}
