/* sampling.c: the two rules that decide which sample a row of a global batch is, with no state a
 * plan could change: an epoch's permutation (a keyed Feistel bijection, so that a run of any
 * length and a resumed run need no stored order) and Megatron-LM's blending of several sources by
 * weight. docs/data.md writes both out; tests/runtime/test_data_formats.c holds them against an
 * independent reading of that page. */
#include "planrt_tokens.h"

#include <string.h>

/* "shuff" in the key's high bytes: these Philox streams never meet the data's (key = step) or the
 * initialisation's (key = FNV-1a of a name) in practice */
#define SHUFFLE_KEY 0x7368756666000000ull

uint64_t planrt_shuffle_(uint64_t seed, uint64_t epoch, uint64_t j, uint64_t n)
{
	if (n <= 1)
		return 0;
	int h = 1;
	while (h < 32 && (1ull << (2 * h)) < n)
		h++;
	uint64_t mask = (1ull << h) - 1, x = j;
	do { /* cycle walking: at most 4^h < 4n values, so a few rounds on average */
		uint64_t left = x >> h, right = x & mask;
		for (uint64_t r = 0; r < 4; r++) {
			uint32_t f[4];
			planrt_philox(seed, SHUFFLE_KEY + 4 * epoch + r, right, f);
			uint64_t next = left ^ ((uint64_t)f[0] & mask);
			left = right;
			right = next;
		}
		x = left << h | right;
	} while (x >= n);
	return x;
}

void planrt_blend_init_(planrt_blend_t *b, int n, const double *weights)
{
	memset(b, 0, sizeof *b);
	b->n = n;
	double sum = 0;
	for (int d = 0; d < n; d++)
		sum += weights[d];
	for (int d = 0; d < n; d++)
		b->w[d] = weights[d] / sum;
}

/* the source of sample at, and the counts advanced past it */
static int blend_step(planrt_blend_t *b)
{
	double x = b->at > 1 ? (double)b->at : 1.0;
	int best = 0;
	double best_error = b->w[0] * x - (double)b->count[0];
	for (int d = 1; d < b->n; d++) {
		double error = b->w[d] * x - (double)b->count[d];
		if (error > best_error) {
			best_error = error;
			best = d;
		}
	}
	b->count[best]++;
	b->at++;
	return best;
}

void planrt_blend_pick_(planrt_blend_t *b, int64_t g, int *source, int64_t *k)
{
	if (g < b->at) { /* an earlier sample: replay from the start */
		b->at = 0;
		memset(b->count, 0, sizeof b->count);
	}
	while (b->at < g)
		blend_step(b);
	int d = blend_step(b);
	*source = d;
	*k = b->count[d] - 1;
}
