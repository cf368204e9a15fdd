/* rng.c: the counter-based generator behind sharding-independent initialisation (docs/architecture.md, contract 2).
 *
 * Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
 * constants and round function of Random123). planrt_philox(seed, key, counter) maps its three
 * 64-bit inputs onto Philox's 64-bit key and 128-bit counter as
 *     key     = (lo32(seed), hi32(seed))
 *     counter = (lo32(counter), hi32(counter), lo32(key), hi32(key))
 * and returns the four 32-bit output words.
 *
 * Parameter initialisation: key = planrt_name_key(name), the 64-bit FNV-1a hash of the name's
 * bytes; counter = the element's global row-major index in the full (unsharded) tensor. With
 * x = philox(seed, key, index) and 2^-32 written as E:
 *     uniform(a, b):  a + (b - a) * (x[0] * E)                          (u in [0, 1))
 *     normal(m, s):   u1 = (x[0] + 1) * E  (in (0, 1]),  u2 = x[1] * E  (in [0, 1))
 *                     m + s * sqrt(-2 ln u1) * cos(2 pi u2)             (Box-Muller, cosine branch)
 * computed in double and rounded once to f32. One Philox call per element, so the value depends
 * on nothing but (seed, name, global index), whatever block a rank reads. */
#define PLANRT_INTERNAL
#include "planrt.h"

#include <math.h>

void planrt_philox(uint64_t seed, uint64_t key, uint64_t counter, uint32_t out[4])
{
	uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
	uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = (uint32_t)key, c3 = (uint32_t)(key >> 32);
	for (int round = 0; round < 10; round++) {
		uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
		uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
		c0 = hi1 ^ c1 ^ k0;
		c1 = lo1;
		c2 = hi0 ^ c3 ^ k1;
		c3 = lo0;
		k0 += 0x9E3779B9u;
		k1 += 0xBB67AE85u;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

uint64_t planrt_name_key(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= 0x100000001b3ull;
	}
	return h;
}

static float sample(int kind, double a, double b, uint64_t seed, uint64_t key, uint64_t index)
{
	uint32_t x[4];
	const double E = 0x1p-32;
	switch (kind) {
	case 0:
		planrt_philox(seed, key, index, x);
		return (float)(a + b * sqrt(-2.0 * log(((double)x[0] + 1.0) * E)) * cos(2.0 * M_PI * ((double)x[1] * E)));
	case 1:
		planrt_philox(seed, key, index, x);
		return (float)(a + (b - a) * ((double)x[0] * E));
	case 2:
		return 0.0f;
	default:
		return 1.0f;
	}
}

/* Buffers computed at init (kinds 4-6), from an element's row-major index g in a tensor whose last
 * dim is last: arange (g itself), and Hugging Face's LlamaRotaryEmbedding tables [.., Dh] at
 * position p = g / Dh, in float: inv_freq = 1 / powf(theta, (float)2i / Dh) for i = (g mod Dh) mod
 * Dh / 2 (the halves repeat: torch.cat((freqs, freqs))), then cosf / sinf((float)p * inv_freq), as
 * planrt_k_rope computes its angles. */
static float computed(int kind, double theta, uint64_t g, int64_t last)
{
	if (kind == 4)
		return (float)g;
	int64_t h = last / 2, i = (int64_t)(g % (uint64_t)last) % h;
	float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)last);
	float a = (float)(g / (uint64_t)last) * inv;
	return kind == 5 ? cosf(a) : sinf(a);
}

void planrt_init_range(float *dst, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
		       int64_t first, int64_t count, int kind, double a, double b, uint64_t seed, const char *name)
{
	uint64_t key = planrt_name_key(name);
	int64_t gstride[16], idx[16] = {0};
	if (rank > 16)
		planrt_fatal("planrt_init_range: tensor '%s' has rank %d; at most 16 dimensions", name, rank);
	int64_t n = 1, s = 1; /* 64-bit: a global tensor may pass 2^31 elements */
	for (int d = rank - 1; d >= 0; d--) {
		gstride[d] = s;
		s *= gdims[d];
		n *= ldims[d];
	}
	if (first < 0 || count < 0 || first + count > n)
		planrt_fatal("internal error: elements [%lld, %lld) of '%s' outside its %lld-element block", (long long)first,
			     (long long)(first + count), name, (long long)n);
	if (count <= 0)
		return;
	if (kind == 7)
		planrt_fatal("buffer '%s' is loaded (~ load): pass --init with a tensor '%s'", name, name);
	/* Walk the local block row-major from element `first`; the innermost dimension is contiguous in
	 * both. idx[] starts at the row holding `first`, i0 at its column. */
	int64_t inner = rank > 0 ? ldims[rank - 1] : 1;
	int64_t row = first / inner, i0 = first % inner;
	for (int d = rank - 2; d >= 0; d--) {
		idx[d] = row % ldims[d];
		row /= ldims[d];
	}
	for (int64_t done = 0; done < count; i0 = 0) {
		uint64_t g = 0;
		for (int d = 0; d < rank; d++)
			g += (uint64_t)((offs[d] + idx[d]) * gstride[d]);
		int64_t stop = inner - i0 < count - done ? inner : i0 + (count - done);
		for (int64_t i = i0; i < stop; i++, done++)
			dst[done] = kind >= 4 && kind <= 6 ? computed(kind, a, g + (uint64_t)i, rank ? gdims[rank - 1] : 1)
							   : sample(kind, a, b, seed, key, g + (uint64_t)i);
		for (int d = rank - 2; d >= 0; d--) {
			if (++idx[d] < ldims[d])
				break;
			idx[d] = 0;
		}
	}
}

void planrt_init_block(float *dst, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
		       int kind, double a, double b, uint64_t seed, const char *name)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= ldims[d];
	planrt_init_range(dst, rank, gdims, ldims, offs, 0, n > 0 ? n : 0, kind, a, b, seed, name);
}
