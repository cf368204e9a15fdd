/* test_partition.c: pipeline_partition (compiler/graph/pipeline.c) against independent answers.
 *
 * Thousands of small random instances (n <= 12) against the brute-force optimum over every
 * placement of the k - 1 cuts: integer costs must match exactly, real ones within 1e-9
 * relative; costs include zeros and one huge item, with random end costs. The examples
 * (105 layers on 35 stages, 128 on 64) must give equal stages. Large instances (n = 5000,
 * k = 300) are checked against an O(k n log n) dynamic program, and the time of the largest
 * inputs (n = 10^4, k = 1024) is printed, not asserted. Every result must be a valid partition:
 * part_of non-decreasing from 0 to k - 1 in steps of at most one, so every part is non-empty.
 * Prints PASS/FAIL lines and `N passed, M failed`; exits 1 on any failure. */
#include "passes.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/report.h"

/* ---- random numbers: splitmix64, fixed seed ---------------------------------------------- */

static uint64_t rng_state = 0x5eed2024u;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) /* uniform in [lo, hi] */
{
	return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

static double rng_real(void) /* uniform in [0, 1) */
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- checks -------------------------------------------------------------------------------- */

/* The cost of every part summed directly (no prefix sums); -1 when part_of is not a partition
 * into k non-empty contiguous parts. */
static double partition_max(const double *costs, int n, int k, double first, double last, const int *part_of)
{
	if (part_of[0] != 0 || part_of[n - 1] != k - 1)
		return -1;
	for (int i = 1; i < n; i++)
		if (part_of[i] != part_of[i - 1] && part_of[i] != part_of[i - 1] + 1)
			return -1;
	double most = 0, c = first;
	for (int i = 0; i < n; i++) {
		if (i > 0 && part_of[i] != part_of[i - 1]) {
			if (c > most)
				most = c;
			c = 0;
		}
		c += costs[i];
	}
	c += last;
	return c > most ? c : most;
}

/* The optimum over every placement of k - 1 cuts in the n - 1 gaps, part costs summed directly. */
static void brute_cuts(const double *costs, int n, int k, double first, double last, int *part_of, int i, int part,
		       double *best)
{
	if (i == n) {
		if (part == k - 1) {
			double m = partition_max(costs, n, k, first, last, part_of);
			if (m < *best)
				*best = m;
		}
		return;
	}
	if (i == 0) {
		part_of[0] = 0;
		brute_cuts(costs, n, k, first, last, part_of, 1, 0, best);
		return;
	}
	if (n - i > k - 1 - part) { /* item i stays in the part: enough items remain for the rest */
		part_of[i] = part;
		brute_cuts(costs, n, k, first, last, part_of, i + 1, part, best);
	}
	if (part < k - 1) { /* a cut before item i */
		part_of[i] = part + 1;
		brute_cuts(costs, n, k, first, last, part_of, i + 1, part + 1, best);
	}
}

static double brute_force(const double *costs, int n, int k, double first, double last)
{
	int part_of[16];
	double best = INFINITY;
	brute_cuts(costs, n, k, first, last, part_of, 0, 0, &best);
	return best;
}

/* The optimum by dynamic programming: best[j][i] is the least largest part over the first i
 * items in j parts (part 0 with `first`). best[j - 1][s] rises with s and the cost of items
 * [s, i) falls, so the best s is where they cross, found by binary search: O(k n log n). */
static double dp_optimum(const double *costs, int n, int k, double first, double last)
{
	long double *sum = malloc(sizeof(long double) * (size_t)(n + 1));
	double *prev = malloc(sizeof(double) * (size_t)(n + 1));
	double *cur = malloc(sizeof(double) * (size_t)(n + 1));
	if (!sum || !prev || !cur)
		abort();
	sum[0] = 0;
	for (int i = 0; i < n; i++)
		sum[i + 1] = sum[i] + costs[i];
	if (k == 1) {
		double r = (double)(sum[n] + first + last);
		free(sum);
		free(prev);
		free(cur);
		return r;
	}
	for (int i = 0; i <= n; i++)
		prev[i] = (double)(first + sum[i]);
	for (int j = 2; j <= k; j++) {
		int lo_i = j == k ? n : j, hi_i = j == k ? n : n - (k - j);
		for (int i = lo_i; i <= hi_i; i++) {
			double tail = j == k ? last : 0;
			int lo = j - 1, hi = i - 1; /* least s with prev[s] >= cost(s, i) */
			while (lo < hi) {
				int mid = lo + (hi - lo) / 2;
				if (prev[mid] >= (double)(sum[i] - sum[mid] + tail))
					hi = mid;
				else
					lo = mid + 1;
			}
			double v = fmax(prev[lo], (double)(sum[i] - sum[lo] + tail));
			if (lo > j - 1) {
				double w = fmax(prev[lo - 1], (double)(sum[i] - sum[lo - 1] + tail));
				if (w < v)
					v = w;
			}
			cur[i] = v;
		}
		double *t = prev;
		prev = cur;
		cur = t;
	}
	double r = prev[n];
	free(sum);
	free(prev);
	free(cur);
	return r;
}

static bool same_value(double got, double want, bool exact)
{
	if (exact)
		return got == want;
	return fabs(got - want) <= 1e-9 * fmax(fabs(want), 1e-300);
}

/* ---- instances ----------------------------------------------------------------------------- */

/* n costs: integers (exact sums) or reals, about a quarter of them zero, and sometimes one huge
 * item; end costs zero, small or huge. */
static void random_instance(double *costs, int n, bool integer, double *first, double *last)
{
	for (int i = 0; i < n; i++) {
		if (rng_int(0, 3) == 0)
			costs[i] = 0;
		else
			costs[i] = integer ? rng_int(1, 20) : rng_real() * 20;
	}
	if (rng_int(0, 3) == 0)
		costs[rng_int(0, n - 1)] = integer ? 1e6 : 1e6 * (1 + rng_real());
	double *ends[2] = {first, last};
	for (int e = 0; e < 2; e++) {
		switch (rng_int(0, 4)) {
		case 0:
			*ends[e] = 0;
			break;
		case 1:
			*ends[e] = integer ? 1e6 : 1e6 * (1 + rng_real());
			break;
		default:
			*ends[e] = integer ? rng_int(0, 40) : rng_real() * 40;
		}
	}
}

static void test_brute_force(int count)
{
	double costs[12];
	int part_of[12], again[12];
	int failed = 0, checked = 0;
	long long placements = 0;
	for (int t = 0; t < count; t++) {
		bool integer = t % 2 == 0;
		int n = rng_int(1, 12), k = rng_int(1, n);
		double first, last;
		random_instance(costs, n, integer, &first, &last);
		pipeline_partition(costs, n, k, first, last, part_of);
		pipeline_partition(costs, n, k, first, last, again);
		double got = partition_max(costs, n, k, first, last, part_of);
		double want = brute_force(costs, n, k, first, last);
		checked++;
		long long c = 1; /* C(n - 1, k - 1) placements */
		for (int i = 0; i < k - 1; i++)
			c = c * (n - 1 - i) / (i + 1);
		placements += c;
		bool ok = got >= 0 && same_value(got, want, integer) && !memcmp(part_of, again, sizeof(int) * (size_t)n);
		if (!ok && failed++ < 10) {
			printf("  instance %d: n = %d, k = %d, first = %.17g, last = %.17g, got %.17g, want %.17g%s\n", t, n,
			       k, first, last, got, want, got < 0 ? " (not a partition)" : "");
			printf("  costs:");
			for (int i = 0; i < n; i++)
				printf(" %.17g", costs[i]);
			printf("\n  part_of:");
			for (int i = 0; i < n; i++)
				printf(" %d", part_of[i]);
			printf("\n");
		}
	}
	report(failed == 0, "brute force: %d random instances (n <= 12, half integer, half real; %lld cut placements)",
	       checked, placements);
	if (failed)
		printf("  %d instances wrong\n", failed);
}

/* n equal layers on k stages: each stage gets n / k layers. */
static void test_equal(int n, int k)
{
	double *costs = malloc(sizeof(double) * (size_t)n);
	int *part_of = malloc(sizeof(int) * (size_t)n);
	if (!costs || !part_of)
		abort();
	for (int i = 0; i < n; i++)
		costs[i] = 1;
	pipeline_partition(costs, n, k, 0, 0, part_of);
	bool ok = true;
	for (int i = 0; i < n; i++)
		if (part_of[i] != i / (n / k))
			ok = false;
	report(ok, "%d equal layers on %d stages: %d layers each", n, k, n / k);
	free(costs);
	free(part_of);
}

/* n equal layers on k stages with a remainder: the largest stage has ceil(n / k) layers and, as
 * the top of pipeline.c promises, the others are within one of it. */
static void test_remainder(int n, int k)
{
	double *costs = malloc(sizeof(double) * (size_t)n);
	int *part_of = malloc(sizeof(int) * (size_t)n);
	int *size = calloc((size_t)k, sizeof(int));
	if (!costs || !part_of || !size)
		abort();
	for (int i = 0; i < n; i++)
		costs[i] = 1;
	pipeline_partition(costs, n, k, 0, 0, part_of);
	double got = partition_max(costs, n, k, 0, 0, part_of);
	int most = (n + k - 1) / k, fewest = most;
	for (int i = 0; i < n; i++)
		size[part_of[i]]++;
	for (int j = 0; j < k; j++)
		if (size[j] < fewest)
			fewest = size[j];
	report(got == most && fewest >= most - 1, "%d equal layers on %d stages: at most %d layers, at least %d (%g, %d)",
	       n, k, most, most - 1, got, fewest);
	free(costs);
	free(part_of);
	free(size);
}

/* All costs zero: any partition is optimal; it must still have k non-empty parts. */
static void test_zeros(void)
{
	double costs[10] = {0};
	int part_of[10];
	pipeline_partition(costs, 10, 7, 0, 0, part_of);
	double got = partition_max(costs, 10, 7, 0, 0, part_of);
	pipeline_partition(costs, 10, 10, 0, 5, part_of);
	double got2 = partition_max(costs, 10, 10, 0, 5, part_of);
	report(got == 0 && got2 == 5, "zero costs: 7 and 10 non-empty parts of 10 items (max %g, %g)", got, got2);
}

static void test_large(int n, int k, bool integer, double first, double last)
{
	double *costs = malloc(sizeof(double) * (size_t)n);
	int *part_of = malloc(sizeof(int) * (size_t)n);
	if (!costs || !part_of)
		abort();
	for (int i = 0; i < n; i++)
		costs[i] = rng_int(0, 9) == 0 ? 0 : integer ? rng_int(1, 1000) : rng_real() * 1000;
	double t0 = now_ms();
	pipeline_partition(costs, n, k, first, last, part_of);
	double t1 = now_ms();
	double got = partition_max(costs, n, k, first, last, part_of);
	double want = dp_optimum(costs, n, k, first, last);
	double t2 = now_ms();
	report(got >= 0 && same_value(got, want, integer),
	       "n = %d, k = %d, %s costs, first = %g, last = %g: max %.17g, dp %.17g (%.3f ms; dp %.0f ms)", n, k,
	       integer ? "integer" : "real", first, last, got, want, t1 - t0, t2 - t1);
	free(costs);
	free(part_of);
}

/* The largest inputs the contract names; the time is printed, not asserted. */
static void time_largest(int n, int k)
{
	double *costs = malloc(sizeof(double) * (size_t)n);
	int *part_of = malloc(sizeof(int) * (size_t)n);
	if (!costs || !part_of)
		abort();
	for (int i = 0; i < n; i++)
		costs[i] = rng_real() * 1e12;
	int reps = 20;
	double t0 = now_ms();
	for (int r = 0; r < reps; r++)
		pipeline_partition(costs, n, k, 3e12, 3e12, part_of);
	double t1 = now_ms();
	double got = partition_max(costs, n, k, 3e12, 3e12, part_of);
	report(got >= 0, "n = %d, k = %d, real costs: a partition, max %.6g (%.3f ms each)", n, k, got,
	       (t1 - t0) / reps);
	free(costs);
	free(part_of);
}

int main(void)
{
	test_brute_force(20000);
	test_equal(105, 35);
	test_equal(128, 64);
	test_equal(96, 8);
	test_remainder(100, 8);
	test_remainder(100, 40);
	test_remainder(1000, 999);
	test_zeros();
	test_large(5000, 300, true, 0, 0);
	test_large(5000, 300, true, 20000, 5000);
	test_large(5000, 300, false, 1234.5, 0);
	test_large(5000, 300, false, 3e5, 3e5);
	time_largest(10000, 1024);
	time_largest(10000, 8);
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
