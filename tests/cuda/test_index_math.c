/* test_index_math.c: the CUDA permute's, sum_to's and RoPE's index arithmetic (runtime/include/
 * planrt_index_math.h, which runtime/cuda/kernels_cuda.cu's kernels run) on the host, against the
 * plain definitions:
 *   - planrt_div / planrt_mod against / and % for every divisor up to 4,096 and powers of two and
 *     their neighbours up to 2^31 - 1, at dividends around multiples of the divisor, near 2^31 and
 *     random;
 *   - a permute plan's source unit for every output unit of random tensors (rank 0-6, random
 *     permutations, dims of 1, 2- and 4-byte elements, aligned or not), the GPT's split and merge of
 *     heads among them, against the source index computed dim by dim; that 16-byte units are taken
 *     where the innermost run allows them and only there; that too large a tensor is refused;
 *   - a sum_to plan's sums of random tensors (random kept and reduced dims, the output's dims in
 *     their order or another) against the sums of the whole tensor walked in order, and the bias
 *     gradient's rows walked without a division;
 *   - a RoPE plan's threads, each a sample, position and frequency walking the heads, against the
 *     64-bit kernel's thread an element pair: every element once, with the same angle's inputs;
 *   - a dropout plan's global index (the random number's key) of every element of a local block,
 *     its halves at their offsets, against the 64-bit kernel's.
 * Prints the failures and a PASS/FAIL line; exit 1 on any failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt_index_math.h"
#include "tally.h"

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static int div_fails;

static void check_div(uint32_t d, uint32_t n)
{
	planrt_divmod_t dm = planrt_divmod_make(d);
	if (planrt_div(dm, n) != n / d || planrt_mod(dm, n) != n % d) {
		if (div_fails++ < 10)
			printf("FAIL: %u / %u: %u rest %u, want %u rest %u\n", n, d, planrt_div(dm, n), planrt_mod(dm, n), n / d,
			       n % d);
	}
}

static void divisions(void)
{
	const uint32_t top = 2147483647u; /* 2^31 - 1 */
	uint32_t ds[8192];
	int nd = 0;
	for (uint32_t d = 1; d <= 4096; d++)
		ds[nd++] = d;
	for (int k = 12; k <= 31; k++) {
		uint32_t p = (uint32_t)(1ull << k);
		if (k < 31)
			ds[nd++] = p;
		ds[nd++] = p - 1;
		if (k < 31)
			ds[nd++] = p + 1;
	}
	for (int j = 0; j < 1000; j++)
		ds[nd++] = 1 + rnd(top);
	ds[nd++] = 50304;
	ds[nd++] = 1000003;
	long long tried = 0;
	for (int j = 0; j < nd; j++) {
		uint32_t d = ds[j];
		for (uint32_t n = 0; n < 300; n++)
			check_div(d, n);
		for (uint32_t q = 1; q < 64 && (uint64_t)q * d + 1 <= top; q++) {
			check_div(d, q * d - 1);
			check_div(d, q * d);
			check_div(d, q * d + 1);
		}
		uint32_t q = top / d;
		check_div(d, q * d - 1);
		check_div(d, q * d);
		for (uint32_t n = top - 64; n < top; n++)
			check_div(d, n);
		check_div(d, top);
		for (int r = 0; r < 200; r++)
			check_div(d, rnd(top) + 1);
		tried += 300 + 3 * 64 + 67 + 200;
	}
	CHECK(div_fails == 0, "%d of about %lld divisions wrong", div_fails, tried);
}

/* the source element of output element i of in (dims, row-major) permuted by perm, dim by dim */
static int64_t permute_src_plain(int rank, const int64_t *dims, const int *perm, int64_t i)
{
	int64_t ist[8], s = 1, off = 0;
	for (int d = rank - 1; d >= 0; d--) {
		ist[d] = s;
		s *= dims[d];
	}
	for (int d = rank - 1; d >= 0; d--) {
		int64_t od = dims[perm[d]];
		off += i % od * ist[perm[d]];
		i /= od;
	}
	return off;
}

/* a permute planned and walked as the kernel walks it, element by element against the plain one;
 * returns the plan's unit width (0 when refused) */
static int permute_case(int rank, const int64_t *dims, const int *perm, int elem, int aligned, const char *what)
{
	planrt_permute_plan_t p;
	if (!planrt_permute_plan(rank, dims, perm, elem, aligned, &p)) {
		CHECK(0, "%s: refused", what);
		return 0;
	}
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= dims[d];
	int bad = 0;
	CHECK((int64_t)p.n * p.vec == n, "%s: %u units of %d for %lld elements", what, p.n, p.vec, (long long)n);
	for (uint32_t u = 0; u < p.n && !bad; u++) {
		uint32_t src = planrt_permute_src(&p, u);
		for (int e = 0; e < p.vec; e++) {
			int64_t want = permute_src_plain(rank, dims, perm, (int64_t)u * p.vec + e);
			if ((int64_t)src * p.vec + e != want) {
				CHECK(0, "%s: output element %lld reads %lld, want %lld", what, (long long)u * p.vec + e,
				      (long long)src * p.vec + e, (long long)want);
				bad = 1;
				break;
			}
		}
	}
	if (!bad)
		CHECK(1, "%s", what);
	/* 16-byte units exactly where the innermost output run is contiguous, aligned and a multiple of 16
	 * bytes (runs merged across dims that stay adjacent) */
	int64_t run = 1;
	for (int d = rank - 1; d >= 0; d--) {
		int src = perm[d];
		if (dims[src] == 1)
			continue;
		int64_t below = 1;
		for (int e = src + 1; e < rank; e++)
			below *= dims[e];
		if (below != run)
			break;
		run *= dims[src];
	}
	int want_vec = aligned && 16 % elem == 0 && n > 0 && run * elem % 16 == 0 ? 16 / elem : 1;
	CHECK(p.vec == want_vec, "%s: units of %d elements, want %d (innermost run %lld)", what, p.vec, want_vec,
	      (long long)run);
	return p.vec;
}

static void permutes(void)
{
	/* the GPT's heads: [B, S, H, Dh] -> [B, H, S, Dh] and back, bf16: 16-byte units of 8 */
	const int64_t split[4] = {8, 1024, 16, 64}, merge[4] = {8, 16, 1024, 64};
	const int swap[4] = {0, 2, 1, 3}, t2[2] = {1, 0};
	CHECK(permute_case(4, split, swap, 2, 1, "split heads [8,1024,16,64] bf16") == 8, "split heads: units of 8");
	CHECK(permute_case(4, merge, swap, 2, 1, "merge heads [8,16,1024,64] bf16") == 8, "merge heads: units of 8");
	CHECK(permute_case(4, split, swap, 4, 1, "split heads f32") == 4, "split heads f32: units of 4");
	CHECK(permute_case(4, split, swap, 2, 0, "split heads, unaligned") == 1, "unaligned: elements");
	const int64_t wgrad[2] = {1024, 50304}, odd[4] = {3, 5, 7, 9};
	CHECK(permute_case(2, wgrad, t2, 2, 1, "a transpose [1024, 50304]") == 1, "a transpose: elements");
	permute_case(4, odd, swap, 2, 1, "[3,5,7,9] (0,2,1,3)");
	const int64_t big[2] = {65536, 32768};
	planrt_permute_plan_t p;
	CHECK(!planrt_permute_plan(2, big, t2, 2, 1, &p), "2^31 elements: refused (64-bit arithmetic)");
	const int64_t empty[3] = {4, 0, 8};
	const int id3[3] = {2, 0, 1};
	CHECK(planrt_permute_plan(3, empty, id3, 4, 1, &p) && p.n == 0, "no elements: nothing to move");
	CHECK(planrt_permute_plan(0, empty, id3, 4, 1, &p) && p.n == 1 && planrt_permute_src(&p, 0) == 0,
	      "rank 0: one element");
	for (int c = 0; c < 400; c++) {
		int rank = 1 + (int)rnd(6), perm[8];
		int64_t dims[8];
		for (int d = 0; d < rank; d++) {
			uint32_t k = rnd(10);
			dims[d] = k < 3 ? 1 : k < 8 ? 1 + rnd(7) : 8 * (1 + rnd(4));
			perm[d] = d;
		}
		for (int d = rank - 1; d > 0; d--) {
			int j = (int)rnd((uint32_t)d + 1), t = perm[d];
			perm[d] = perm[j];
			perm[j] = t;
		}
		char what[160];
		int len = snprintf(what, sizeof what, "random permute %d: dims", c);
		for (int d = 0; d < rank; d++)
			len += snprintf(what + len, sizeof what - (size_t)len, " %lld", (long long)dims[d]);
		len += snprintf(what + len, sizeof what - (size_t)len, ", perm");
		for (int d = 0; d < rank; d++)
			len += snprintf(what + len, sizeof what - (size_t)len, " %d", perm[d]);
		permute_case(rank, dims, perm, rnd(2) ? 2 : 4, (int)rnd(2), what);
	}
}

/* sum_to planned and summed as the kernel sums (each output element over its reduced elements in
 * order), against the whole input walked in order with each element added to its output element */
static void sum_case(int rank, const int64_t *dims, const int64_t *ostr, const char *what)
{
	planrt_sum_plan_t p;
	if (!planrt_sum_plan(rank, dims, ostr, &p)) {
		CHECK(0, "%s: refused", what);
		return;
	}
	int64_t n = 1, out_n = 1;
	for (int d = 0; d < rank; d++) {
		n *= dims[d];
		out_n += (dims[d] - 1) * ostr[d];
	}
	int64_t *want = calloc((size_t)out_n, sizeof(int64_t)), *got = calloc((size_t)out_n, sizeof(int64_t));
	for (int64_t i = 0; i < n; i++) {
		int64_t rest = i, at = 0;
		for (int d = rank - 1; d >= 0; d--) {
			at += rest % dims[d] * ostr[d];
			rest /= dims[d];
		}
		want[at] += i * i + 7;
	}
	for (uint32_t o = 0; o < p.out_n; o++) {
		uint32_t base, at;
		planrt_sum_kept(&p, o, &base, &at);
		for (uint32_t r = 0; r < p.red_n; r++) {
			int64_t i = (int64_t)base + planrt_sum_red(&p, r);
			got[at] += i * i + 7;
		}
	}
	CHECK(!memcmp(want, got, sizeof(int64_t) * (size_t)out_n), "%s: the sums", what);
	free(want);
	free(got);
}

static void sums(void)
{
	/* a bias gradient: [8, 1024, 4096] -> [4096]; the rows are one reduced run */
	const int64_t bias[3] = {8, 1024, 4096}, bias_st[3] = {0, 0, 1};
	planrt_sum_plan_t p;
	CHECK(planrt_sum_plan(3, bias, bias_st, &p) && p.nred == 1 && p.red_n == 8192 && p.rin[0] == 4096 &&
		      p.nkept == 1 && p.out_n == 4096,
	      "bias gradient: one reduced run of 8192 rows at stride 4096, 4096 outputs");
	const int64_t small[3] = {3, 5, 12}, small_st[3] = {0, 0, 1};
	sum_case(3, small, small_st, "bias gradient [3, 5, 12]");
	const int64_t mid[4] = {2, 3, 4, 5}, mid_st[4] = {0, 5, 0, 1}; /* keep 1 and 3: out [3, 5] */
	sum_case(4, mid, mid_st, "[2,3,4,5] onto dims 1 and 3");
	const int64_t big[2] = {65536, 32768}, big_st[2] = {0, 1};
	CHECK(!planrt_sum_plan(2, big, big_st, &p), "2^31 elements: refused");
	for (int c = 0; c < 300; c++) {
		int rank = 1 + (int)rnd(5);
		int64_t dims[8], ostr[8];
		int keep[8];
		for (int d = 0; d < rank; d++) {
			dims[d] = rnd(4) ? 1 + rnd(6) : 1;
			keep[d] = (int)rnd(2);
		}
		/* the output's layout: the kept dims in order, or (every other case) in a random order */
		int order[8];
		for (int d = 0; d < rank; d++)
			order[d] = d;
		for (int d = rank - 1; d > 0 && c % 2; d--) {
			int j = (int)rnd((uint32_t)d + 1), t = order[d];
			order[d] = order[j];
			order[j] = t;
		}
		int64_t s = 1;
		for (int j = rank - 1; j >= 0; j--) {
			int d = order[j];
			ostr[d] = keep[d] ? s : 0;
			s *= keep[d] ? dims[d] : 1;
		}
		char what[160];
		int len = snprintf(what, sizeof what, "random sum_to %d: dims", c);
		for (int d = 0; d < rank; d++)
			len += snprintf(what + len, sizeof what - (size_t)len, " %lld%s", (long long)dims[d], keep[d] ? "" : "*");
		sum_case(rank, dims, ostr, what);
	}
}

/* A RoPE plan's threads, each walking the heads as rope_planned_kernel does: every element of the
 * tensor written once, from the element the 64-bit rope_kernel reads for it, with the sample, position
 * and frequency rope_kernel gives its row and pair (its row t / per_row, b and s from the row) */
static void rope_case(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim, int heads_first)
{
	planrt_rope_plan_t p;
	char what[120];
	snprintf(what, sizeof what, "rope [%lld, %lld, %lld, %lld] rot %lld%s", (long long)batch, (long long)seq,
		 (long long)heads, (long long)head_dim, (long long)rot_dim, heads_first ? " heads first" : "");
	if (!planrt_rope_plan(batch, seq, heads, head_dim, rot_dim, heads_first, &p)) {
		CHECK(0, "%s: refused", what);
		return;
	}
	int64_t n = batch * seq * heads * head_dim, h = rot_dim / 2, per_row = h + head_dim - rot_dim, bad = 0;
	/* the 64-bit kernel's view: element e of the tensor -> (b, s, the pair index or -1 - passed dim) */
	int64_t *key = malloc(sizeof(int64_t) * (size_t)n), *seen = calloc((size_t)n, sizeof(int64_t));
	for (int64_t t = 0; t < n / head_dim * per_row; t++) {
		int64_t row = t / per_row, i = t % per_row, at = row * head_dim, b, sq;
		if (heads_first) {
			sq = row % seq;
			b = row / seq / heads;
		} else {
			sq = row / heads % seq;
			b = row / heads / seq;
		}
		int64_t k = (b * seq + sq) * per_row + i;
		if (i >= h) {
			key[at + rot_dim + i - h] = k;
		} else {
			key[at + i] = k;
			key[at + i + h] = k;
		}
	}
	for (uint32_t t = 0; t < p.n; t++) {
		uint32_t b, sq, j;
		planrt_rope_where(&p, t, &b, &sq, &j);
		int64_t k = ((int64_t)b * seq + sq) * per_row + j;
		for (uint32_t hd = 0; hd < p.heads; hd++) {
			int64_t at = planrt_rope_row(&p, b, sq, hd);
			int64_t e1 = j >= p.h ? at + p.rot_dim + j - p.h : at + j, e2 = j >= p.h ? -1 : at + j + p.h;
			bad += e1 < 0 || e1 >= n || key[e1] != k || (e2 >= 0 && (e2 >= n || key[e2] != k));
			if (e1 >= 0 && e1 < n)
				seen[e1]++;
			if (e2 >= 0 && e2 < n)
				seen[e2]++;
		}
	}
	for (int64_t e = 0; e < n; e++)
		bad += seen[e] != 1;
	CHECK(p.n == (uint32_t)(batch * seq * per_row) && bad == 0,
	      "%s: %u threads, every element once with rope_kernel's sample, position and frequency (%lld wrong)", what,
	      p.n, (long long)bad);
	free(key);
	free(seen);
}

static void ropes(void)
{
	rope_case(2, 64, 4, 128, 128, 0); /* a Llama's q: every dim rotated */
	rope_case(2, 64, 4, 128, 128, 1);
	rope_case(3, 17, 5, 40, 24, 1);  /* 24 of 40 dims rotated, odd sizes */
	rope_case(3, 17, 5, 40, 24, 0);
	rope_case(1, 5, 1, 6, 0, 0);     /* nothing rotated: a copy */
	rope_case(4, 9, 3, 8, 8, 0);
	for (int c = 0; c < 40; c++) {
		int64_t hd = 2 * (1 + rnd(40)), rot = 2 * (int64_t)rnd((uint32_t)hd / 2 + 1);
		rope_case(1 + rnd(4), 1 + rnd(40), 1 + rnd(6), hd, rot, (int)rnd(2));
	}
	planrt_rope_plan_t p;
	CHECK(!planrt_rope_plan(8, 65536, 32, 128, 128, 0, &p) && !planrt_rope_plan(1, 4, 2, 8, 3, 0, &p) &&
		      !planrt_rope_plan(1, 4, 2, 8, 10, 0, &p),
	      "rope: 2^31 elements, an odd rot_dim and rot_dim > head_dim refused (the 64-bit kernel, or its error)");
}

/* A dropout plan's key of every element of a local block against the 64-bit kernel's (dropout_kernel:
 * a % and a / of the 64-bit index a dim, the block's halves at their global offsets) */
static void dropout_case(int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, const char *what)
{
	planrt_dropout_plan_t p;
	if (!planrt_dropout_plan(rank, gdims, ldims, offs, &p)) {
		CHECK(0, "%s: refused", what);
		return;
	}
	int64_t gst[PLANRT_IM_MAX_RANK], s = 1, n = 1, bad = 0;
	for (int d = rank - 1; d >= 0; d--) {
		gst[d] = s;
		s *= gdims[d];
		n *= ldims[d];
	}
	for (int64_t i = 0; i < n; i++) {
		int64_t rest = i;
		uint64_t g = 0;
		for (int d = rank - 1; d >= 0; d--) {
			int64_t c = rest % ldims[d], half = ldims[d] / 2;
			rest /= ldims[d];
			g += (uint64_t)((c < half ? offs[d] + c : offs[rank + d] + c - half) * gst[d]);
		}
		bad += planrt_dropout_key(&p, (uint32_t)i) != g;
	}
	CHECK(p.n == (uint32_t)n && bad == 0, "%s: %lld elements' keys as the 64-bit kernel's (%lld differ)", what,
	      (long long)n, (long long)bad);
}

static void dropouts(void)
{
	/* a block of samples, a balanced ring's halves (rows 8-15 and 48-55 of 64), a whole tensor */
	const int64_t g3[3] = {4, 64, 48}, l1[3] = {2, 64, 48}, o1[6] = {2, 0, 0, 3, 32, 24};
	const int64_t l2[3] = {4, 16, 48}, o2[6] = {0, 8, 0, 2, 48, 24}, o3[6] = {0, 0, 0, 2, 32, 24};
	dropout_case(3, g3, l1, o1, "dropout: samples 2-3 of [4, 64, 48]");
	dropout_case(3, g3, l2, o2, "dropout: rows 8-15 and 48-55 of [4, 64, 48] (a balanced block's halves)");
	dropout_case(3, g3, g3, o3, "dropout: [4, 64, 48] whole");
	for (int c = 0; c < 60; c++) {
		int rank = 1 + (int)rnd(4);
		int64_t g[4], l[4], o[8];
		char what[120];
		int len = snprintf(what, sizeof what, "dropout: random block %d of", c);
		for (int d = 0; d < rank; d++) {
			l[d] = 1 + rnd(9);
			g[d] = l[d] * (1 + rnd(3));
			o[d] = rnd((uint32_t)(g[d] - l[d] + 1));
			o[rank + d] = o[d] + l[d] / 2 + (c % 2 ? rnd((uint32_t)(g[d] - l[d] + 1)) : 0);
			len += snprintf(what + len, sizeof what - (size_t)len, " %lld/%lld", (long long)l[d], (long long)g[d]);
		}
		dropout_case(rank, g, l, o, what);
	}
	planrt_dropout_plan_t p;
	const int64_t big[2] = {65536, 32768}, off0[4] = {0, 0, 32768, 16384};
	CHECK(!planrt_dropout_plan(2, big, big, off0, &p), "dropout: a block of 2^31 elements refused");
}

int main(void)
{
	divisions();
	permutes();
	sums();
	ropes();
	dropouts();
	return tally_report("the permute, sum_to, RoPE and dropout index arithmetic");
}
