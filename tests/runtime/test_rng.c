/* test_rng.c: Philox known answers, FNV-1a, the documented element mapping, determinism,
 * sharding independence (any block of a tensor reads the same values as the whole tensor) and
 * the statistics of normal and uniform samples. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"

/* Random123's kat_vectors for philox4x32-10: counter (4 words), key (2 words), output. */
static void test_philox_known_answers(void **state)
{
	static const uint32_t kat[3][10] = {
		{0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
		{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
		 0xa20bc7c6, 0x6d5451fd},
		{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
		 0x5001e420, 0x24126ea1},
	};
	for (int k = 0; k < 3; k++) {
		const uint32_t *v = kat[k];
		uint64_t counter = v[0] | (uint64_t)v[1] << 32, key = v[2] | (uint64_t)v[3] << 32,
			 seed = v[4] | (uint64_t)v[5] << 32;
		uint32_t out[4];
		planrt_philox(seed, key, counter, out);
		for (int i = 0; i < 4; i++)
			assert_int_equal(out[i], v[6 + i]);
	}
}

static void test_fnv1a(void **state)
{
	assert_true(planrt_name_key("") == 0xcbf29ce484222325ull);
	assert_true(planrt_name_key("a") == 0xaf63dc4c8601ec8cull);
	assert_true(planrt_name_key("foobar") == 0x85944171f73967e8ull);
	assert_true(planrt_name_key("wte") != planrt_name_key("wpe"));
}

/* The mapping rng.c documents, recomputed from planrt_philox. */
static void test_documented_mapping(void **state)
{
	int64_t g[2] = {5, 7}, o[2] = {0, 0};
	float x[35], u[35];
	planrt_init_block(x, 2, g, g, o, 0, 0.5, 0.02, 42, "h.0.attn.w");
	planrt_init_block(u, 2, g, g, o, 1, -0.1, 0.3, 42, "h.0.attn.w");
	uint64_t key = planrt_name_key("h.0.attn.w");
	for (uint64_t i = 0; i < 35; i++) {
		uint32_t r[4];
		planrt_philox(42, key, i, r);
		double u1 = ((double)r[0] + 1) * 0x1p-32, u2 = (double)r[1] * 0x1p-32;
		float want = (float)(0.5 + 0.02 * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
		assert_true(x[i] == want);
		float wu = (float)(-0.1 + 0.4 * ((double)r[0] * 0x1p-32));
		assert_true(u[i] == wu);
	}
}

/* planrt_init_range: every piece [first, first + count) of a 3-D block (offset in the tensor,
 * starting and ending mid-row, one element, a whole row, the whole block) equals the block's
 * elements there, for a normal and a computed (arange) kind: a record initialised piece by piece
 * (offload, bucket shards) gets the values the whole block has. */
static void test_ranges_match_block(void **state)
{
	int64_t g[3] = {4, 6, 10}, l[3] = {2, 3, 7}, o[3] = {1, 2, 3};
	int n = 2 * 3 * 7;
	float whole[42], piece[42];
	int pieces[][2] = {{0, 42}, {0, 1}, {41, 1}, {5, 9}, {7, 7}, {13, 20}, {3, 39}, {20, 0}};
	for (int kind = 0; kind <= 4; kind += 4) {
		planrt_init_block(whole, 3, g, l, o, kind, 0.0, 1.0, 11, "blocks.w");
		for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
			int first = pieces[k][0], count = pieces[k][1];
			assert_true(first + count <= n);
			memset(piece, 0xff, sizeof piece);
			planrt_init_range(piece, 3, g, l, o, first, count, kind, 0.0, 1.0, 11, "blocks.w");
			assert_memory_equal(piece, whole + first, sizeof(float) * (size_t)count);
			for (int i = count; i < n; i++) /* nothing past the piece is written */
				assert_true(isnan(piece[i]));
		}
	}
}

static void test_determinism(void **state)
{
	int64_t g[1] = {1000}, o[1] = {0};
	float *a = malloc(1000 * sizeof *a), *b = malloc(1000 * sizeof *b);
	planrt_init_block(a, 1, g, g, o, 0, 0, 1, 7, "w");
	planrt_init_block(b, 1, g, g, o, 0, 0, 1, 7, "w");
	assert_memory_equal(a, b, 1000 * sizeof *a);
	planrt_init_block(b, 1, g, g, o, 0, 0, 1, 8, "w");
	int same = 0;
	for (int i = 0; i < 1000; i++)
		same += a[i] == b[i];
	assert_true(same < 5);
	planrt_init_block(b, 1, g, g, o, 0, 0, 1, 7, "w2");
	same = 0;
	for (int i = 0; i < 1000; i++)
		same += a[i] == b[i];
	assert_true(same < 5);
	planrt_init_block(b, 1, g, g, o, 2, 0, 1, 7, "w");
	for (int i = 0; i < 1000; i++)
		assert_true(b[i] == 0.0f);
	planrt_init_block(b, 1, g, g, o, 3, 0, 1, 7, "w");
	for (int i = 0; i < 1000; i++)
		assert_true(b[i] == 1.0f);
	free(a);
	free(b);
}

/* Every block of a [4, 6, 10] tensor holds the values of the whole tensor at its global indices. */
static void test_blocks_match_whole(void **state)
{
	int64_t g[3] = {4, 6, 10}, zero[3] = {0, 0, 0};
	float whole[240], block[240];
	for (int kind = 0; kind < 2; kind++) {
		planrt_init_block(whole, 3, g, g, zero, kind, 0, 1, 99, "blocks");
		static const int64_t shapes[][6] = {
			/* offs, ldims */
			{0, 0, 0, 4, 6, 10}, {2, 0, 0, 2, 6, 10}, {0, 3, 0, 4, 3, 10}, {0, 0, 5, 4, 6, 5},
			{1, 2, 3, 2, 3, 4},  {3, 5, 9, 1, 1, 1},  {0, 1, 2, 3, 4, 7},
		};
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
			const int64_t *off = shapes[s], *l = shapes[s] + 3;
			planrt_init_block(block, 3, g, l, off, kind, 0, 1, 99, "blocks");
			int64_t k = 0;
			for (int64_t i = 0; i < l[0]; i++)
				for (int64_t j = 0; j < l[1]; j++)
					for (int64_t m = 0; m < l[2]; m++, k++) {
						int64_t gi = ((off[0] + i) * 6 + off[1] + j) * 10 + off[2] + m;
						assert_true(block[k] == whole[gi]);
					}
		}
	}
}

static void test_normal_statistics(void **state)
{
	enum { N = 1000000 };
	int64_t g[2] = {1000, 1000}, o[2] = {0, 0};
	float *x = malloc(N * sizeof *x);
	planrt_init_block(x, 2, g, g, o, 0, 0, 1, 2024, "stats");
	double s = 0, s2 = 0, s4 = 0;
	int tail = 0;
	for (int i = 0; i < N; i++) {
		s += x[i];
		s2 += (double)x[i] * x[i];
		s4 += (double)x[i] * x[i] * x[i] * x[i];
		tail += fabs(x[i]) > 3;
	}
	double mean = s / N, var = s2 / N - mean * mean;
	/* standard errors: mean 0.001, std 0.0007; 5 sigma */
	assert_true(fabs(mean) < 0.005);
	assert_true(fabs(sqrt(var) - 1) < 0.004);
	assert_true(fabs(s4 / N - 3) < 0.05);              /* kurtosis of a normal */
	assert_true(tail > 2400 && tail < 3000);          /* P(|z| > 3) = 0.0027 */
	/* mean and std are honoured */
	planrt_init_block(x, 2, g, g, o, 0, 3.0, 0.02, 2024, "stats");
	s = s2 = 0;
	for (int i = 0; i < N; i++) {
		s += x[i];
		s2 += (double)x[i] * x[i];
	}
	mean = s / N;
	assert_true(fabs(mean - 3) < 0.0001);
	assert_true(fabs(sqrt(s2 / N - mean * mean) - 0.02) < 0.0001);
	/* uniform: range and mean */
	planrt_init_block(x, 2, g, g, o, 1, -2, 6, 5, "u");
	s = 0;
	for (int i = 0; i < N; i++) {
		assert_true(x[i] >= -2 && x[i] <= 6);
		s += x[i];
	}
	assert_true(fabs(s / N - 2) < 0.01);
	free(x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_philox_known_answers), cmocka_unit_test(test_fnv1a),
		cmocka_unit_test(test_documented_mapping),   cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_ranges_match_block),
		cmocka_unit_test(test_blocks_match_whole),   cmocka_unit_test(test_normal_statistics),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
