/* test_step_kernels.c (mpirun -np 4): the step kernels of planrt_exec.h and what they rest on in
 * comm_mpi.c. Values: fills, accumulation and casts against an independent correctly rounded
 * reference (the nearest half-precision value by exact distance, ties to even), including the
 * half-way cases where rounding a double through plain f32 would round twice; sums of squares,
 * the clipping coefficient, the loss sum; the optimizer step bitwise equal to planrt_opt_step on
 * a scaled copy of the gradient for every optimizer kind and f32 / bf16 / f16 gradients, with the
 * gradient left untouched. Communication: the in-place all-reduce, reduce-scatter and all-gather
 * on the world and on both axes of a 2 x 2 mesh, blocking and started then finished; the
 * per-kind, per-group byte and call counters against the formula of comm_mpi.c evaluated here
 * for every call; tagged messages whose two tags interleave in opposite orders on the two sides.
 * Mismatches are counted on each rank and summed over the world at the end of each test, so that
 * every rank reaches the same assertions. */
#define PLANRT_INTERNAL /* half-precision conversions and the communicator's MPI handle */
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include "mpi_expect.h"

static const char *const dtype_names[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* uniform in [-1, 1) times 2^e with e in [-emax, emax] */
static double random_double(int emax)
{
	double u = (double)(next_random() >> 11) * 0x1p-53 * 2 - 1;
	int e = (int)(next_random() % (uint64_t)(2 * emax + 1)) - emax;
	return ldexp(u, e);
}

/* ------------------------------------------------------------------ the rounding reference */

static double half_value(uint16_t h, planrt_dtype_t t)
{
	return (double)planrt_half_to_f32_(h, t);
}

/* The half-precision value nearest to the finite x (ties to the even bit pattern), found by
 * comparing exact distances to the candidates around a first guess. Values past the largest
 * finite one round to infinity at the half-way point to the next power of two. */
static uint16_t ref_round(double x, planrt_dtype_t t)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0, inf = t == planrt_bf16 ? 0x7f80 : 0x7c00;
	double ax = fabs(x), top = t == planrt_bf16 ? 0x1p128 : 0x1p16;
	if (isnan(x))
		return t == planrt_bf16 ? 0x7fc0 : 0x7e00;
	if (isinf(x))
		return sign | inf;
	uint16_t guess = (uint16_t)(planrt_f32_to_half_((float)ax, t) & 0x7fff);
	uint16_t best = 0;
	double bestd = INFINITY;
	for (int d = -2; d <= 2; d++) {
		int m = guess + d;
		if (m < 0 || m > inf)
			continue;
		double v = m == inf ? top : half_value((uint16_t)m, t);
		double dist = fabs(ax - v);
		if (dist < bestd || (dist == bestd && !(m & 1))) {
			best = (uint16_t)m;
			bestd = dist;
		}
	}
	return sign | best;
}

static int same_half(uint16_t a, uint16_t b, planrt_dtype_t t)
{
	uint16_t inf = t == planrt_bf16 ? 0x7f80 : 0x7c00;
	int nan_a = (a & 0x7fff) > inf, nan_b = (b & 0x7fff) > inf;
	return nan_a || nan_b ? nan_a && nan_b : a == b;
}

/* Values that stress rounding, as doubles: ties to even and just past them, the double-rounding
 * traps (a tie in f32 that is not a tie in double), subnormals, overflow, signs. */
static const double tricky[] = {
	0.0, -0.0, 1.0, -2.5, 0.1, 1.0 / 3.0,
	1 + 0x1p-8, 1 + 3 * 0x1p-8, 1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-8 - 0x1p-40, -(1 + 0x1p-8 + 0x1p-40),
	1 + 0x1p-11, 1 + 3 * 0x1p-11, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11 - 0x1p-40,
	1024 + 0.5, 1025 + 0.5, 65504, 65519, 65520, 0x1p-24, 3 * 0x1p-25, 0x1p-25, 0x1p-26, 0x1p-130,
	0x1.fep127, 3.3961e38, 1e30, -1e-30, 12345.678,
};
enum { NTRICKY = sizeof tricky / sizeof *tricky };

/* ------------------------------------------------------------------ fill, accumulate, cast */

static void test_fill(void **state)
{
	(void)state;
	float f[5];
	double d[3];
	int32_t i32[4];
	uint8_t u8[6];
	uint16_t h[3];
	planrt_fill(f, 5, planrt_f32, 0.1);
	planrt_fill(d, 3, planrt_f64, 0.1);
	planrt_fill(i32, 4, planrt_i32, -7);
	planrt_fill(u8, 6, planrt_u8, 200);
	for (int i = 0; i < 5; i++)
		EXPECT(f[i] == 0.1f, "f32 fill %g", f[i]);
	for (int i = 0; i < 3; i++)
		EXPECT(d[i] == 0.1, "f64 fill %g", d[i]);
	for (int i = 0; i < 4; i++)
		EXPECT(i32[i] == -7, "i32 fill %d", i32[i]);
	for (int i = 0; i < 6; i++)
		EXPECT(u8[i] == 200, "u8 fill %d", u8[i]);
	planrt_fill(f, 0, planrt_f32, 5); /* nothing */
	EXPECT(f[0] == 0.1f, "n = 0 writes nothing");

	/* the traps by hand: rounding through (float) would give 0x3f80 and 0x3c00 */
	planrt_fill(h, 3, planrt_bf16, 1 + 0x1p-8 + 0x1p-40);
	EXPECT(h[0] == 0x3f81 && h[2] == 0x3f81, "bf16 fill of 1 + 2^-8 + 2^-40: %04x", h[0]);
	planrt_fill(h, 3, planrt_bf16, 1 + 0x1p-8);
	EXPECT(h[1] == 0x3f80, "bf16 tie to even: %04x", h[1]);
	planrt_fill(h, 3, planrt_bf16, 1 + 3 * 0x1p-8);
	EXPECT(h[1] == 0x3f82, "bf16 tie to even (up): %04x", h[1]);
	planrt_fill(h, 3, planrt_f16, 1 + 0x1p-11 + 0x1p-40);
	EXPECT(h[0] == 0x3c01, "f16 fill of 1 + 2^-11 + 2^-40: %04x", h[0]);
	planrt_fill(h, 3, planrt_f16, 65520);
	EXPECT(h[0] == 0x7c00, "f16 65520 overflows: %04x", h[0]);
	planrt_fill(h, 3, planrt_f16, -INFINITY);
	EXPECT(h[0] == 0xfc00, "f16 -inf: %04x", h[0]);
	planrt_fill(h, 3, planrt_bf16, NAN);
	EXPECT((h[0] & 0x7fff) > 0x7f80, "bf16 NaN: %04x", h[0]);

	for (int ti = 0; ti < 2; ti++) {
		planrt_dtype_t t = ti ? planrt_f16 : planrt_bf16;
		for (int k = 0; k < NTRICKY + 2000; k++) {
			double x = k < NTRICKY ? tricky[k] : random_double(k % 2 ? 12 : 30);
			planrt_fill(h, 1, t, x);
			uint16_t want = ref_round(x, t);
			EXPECT(h[0] == want, "%s fill of %a: %04x, want %04x", dtype_names[t], x, h[0], want);
		}
	}
	assert_all_ranks_clean();
}

static void test_accumulate(void **state)
{
	(void)state;
	float fd[3] = {1, 2.5f, -3}, fs[3] = {0.25f, -1, 3};
	planrt_accumulate(fd, fs, 3, planrt_f32);
	EXPECT(fd[0] == 1.25f && fd[1] == 1.5f && fd[2] == 0, "f32 accumulate %g %g %g", fd[0], fd[1], fd[2]);
	double dd[2] = {0.1, 1e300}, ds[2] = {0.2, 1e300};
	planrt_accumulate(dd, ds, 2, planrt_f64);
	EXPECT(dd[0] == 0.1 + 0.2 && dd[1] == 2e300, "f64 accumulate %g %g", dd[0], dd[1]);

	/* hand cases: ties to even, overflow */
	struct {
		planrt_dtype_t t;
		double a, b, sum;
	} cases[] = {
		{planrt_bf16, 1, 0x1p-8, 1},
		{planrt_bf16, 1 + 0x1p-7, 0x1p-8, 1 + 0x1p-6},
		{planrt_bf16, 1, 0x1p-9, 1},
		{planrt_bf16, 0x1.fep127, 0x1.fep127, INFINITY},
		{planrt_bf16, -3, 1.5, -1.5},
		{planrt_f16, 1024, 0.5, 1024},
		{planrt_f16, 1025, 0.5, 1026},
		{planrt_f16, 60000, 60000, INFINITY},
		{planrt_f16, 0x1p-24, 0x1p-24, 0x1p-23},
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		uint16_t a = planrt_f32_to_half_((float)cases[k].a, cases[k].t);
		uint16_t b = planrt_f32_to_half_((float)cases[k].b, cases[k].t);
		planrt_accumulate(&a, &b, 1, cases[k].t);
		double got = half_value(a, cases[k].t);
		EXPECT(got == cases[k].sum, "%s %a + %a = %a, want %a", dtype_names[cases[k].t], cases[k].a, cases[k].b,
		       got, cases[k].sum);
	}

	/* random operands of moderate range (their sum is exact in double): the correctly rounded sum */
	enum { N = 3000 };
	static uint16_t a[N], b[N], a0[N];
	for (int ti = 0; ti < 2; ti++) {
		planrt_dtype_t t = ti ? planrt_f16 : planrt_bf16;
		for (int i = 0; i < N; i++) {
			a[i] = a0[i] = ref_round(random_double(ti ? 6 : 20), t);
			b[i] = ref_round(i % 3 ? random_double(ti ? 6 : 20) : -half_value(a[i], t) * 0.75, t);
		}
		planrt_accumulate(a, b, N, t);
		for (int i = 0; i < N; i++) {
			uint16_t want = ref_round(half_value(a0[i], t) + half_value(b[i], t), t);
			EXPECT(a[i] == want, "%s %a + %a: %04x, want %04x", dtype_names[t], half_value(a0[i], t),
			       half_value(b[i], t), a[i], want);
		}
	}
	assert_all_ranks_clean();
}

/* x (exactly representable in from) stored as from */
static void store(void *buf, int i, planrt_dtype_t t, double x)
{
	switch (t) {
	case planrt_f32: ((float *)buf)[i] = (float)x; break;
	case planrt_f64: ((double *)buf)[i] = x; break;
	default: ((uint16_t *)buf)[i] = ref_round(x, t); break;
	}
}

static double load(const void *buf, int i, planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return ((const float *)buf)[i];
	case planrt_f64: return ((const double *)buf)[i];
	default: return half_value(((const uint16_t *)buf)[i], t);
	}
}

static void test_cast(void **state)
{
	(void)state;
	static const planrt_dtype_t types[] = {planrt_f32, planrt_bf16, planrt_f16, planrt_f64};
	enum { N = NTRICKY + 1000 + 3 };
	static double values[N];
	for (int i = 0; i < N; i++)
		values[i] = i < NTRICKY ? tricky[i] : i < N - 3 ? random_double(i % 2 ? 14 : 40) : 0;
	values[N - 3] = INFINITY;
	values[N - 2] = -INFINITY;
	values[N - 1] = NAN;
	static double src[N], dst[N]; /* big enough for any dtype */
	for (int fi = 0; fi < 4; fi++)
		for (int ti = 0; ti < 4; ti++) {
			planrt_dtype_t from = types[fi], to = types[ti];
			for (int i = 0; i < N; i++)
				store(src, i, from, values[i]);
			memset(dst, 0x5a, sizeof dst);
			planrt_cast(src, from, dst, to, N);
			for (int i = 0; i < N; i++) {
				double x = load(src, i, from); /* the exact source value */
				if (to == planrt_f64 || to == planrt_f32) {
					double want = to == planrt_f64 ? x : (double)(float)x, got = load(dst, i, to);
					EXPECT(isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want),
					       "cast %s -> %s of %a: %a, want %a", dtype_names[from], dtype_names[to], x, got,
					       want);
				} else {
					uint16_t got = ((uint16_t *)dst)[i];
					uint16_t want = ref_round(x, to);
					EXPECT(same_half(got, want, to), "cast %s -> %s of %a: %04x, want %04x",
					       dtype_names[from], dtype_names[to], x, got, want);
				}
			}
		}
	/* f32 -> bf16 is bitwise the kernels' conversion, NaN included */
	float fx[4] = {NAN, -NAN, 1 + 0x1p-8f, -0.0f};
	uint16_t via_cast[4], via_kernel[4];
	planrt_cast(fx, planrt_f32, via_cast, planrt_bf16, 4);
	planrt_k_f32_to_bf16(fx, via_kernel, 4);
	EXPECT(!memcmp(via_cast, via_kernel, sizeof via_cast), "f32 -> bf16 differs from planrt_k_f32_to_bf16");
	/* the same dtype is a copy, of any dtype */
	int32_t ia[3] = {1, -2, 3}, ib[3] = {0};
	planrt_cast(ia, planrt_i32, ib, planrt_i32, 3);
	EXPECT(ib[0] == 1 && ib[1] == -2 && ib[2] == 3, "i32 copy");
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ clipping, loss */

static void test_sums_clip_and_loss(void **state)
{
	(void)state;
	float x[3] = {1, 2, 3};
	double acc = 1;
	planrt_sum_squares_acc(&acc, x, 3, planrt_f32, 0.5);
	EXPECT(acc == 8, "f32 sum of squares %g", acc);
	enum { N = 1001 };
	static float fx[N];
	static uint16_t hx[N];
	for (int ti = 0; ti < 3; ti++) {
		planrt_dtype_t t = ti == 0 ? planrt_f32 : ti == 1 ? planrt_bf16 : planrt_f16;
		double want = 0;
		for (int i = 0; i < N; i++) {
			fx[i] = (float)random_double(4);
			if (t != planrt_f32)
				hx[i] = ref_round(fx[i], t);
			double v = t == planrt_f32 ? fx[i] : half_value(hx[i], t);
			want += v * v;
		}
		double got = 0.25;
		planrt_sum_squares_acc(&got, t == planrt_f32 ? (void *)fx : (void *)hx, N, t, 1.0 / 3);
		want = 0.25 + 1.0 / 3 * want;
		/* the library may fuse the multiply-adds (-march=native): equal to double rounding */
		EXPECT(fabs(got - want) <= 1e-13 * want, "%s sum of squares %.17g, want %.17g", dtype_names[t], got, want);
	}

	double sumsq = 25, norm = 0, coef = 0;
	planrt_clip_coef(&sumsq, &norm, &coef, 1.0);
	EXPECT(norm == 5 && coef == 1.0 / (5 + 1e-6), "clip to 1: norm %g coef %.17g", norm, coef);
	planrt_clip_coef(&sumsq, &norm, &coef, 10);
	EXPECT(coef == 1.0, "norm below the limit: coef %g", coef);
	planrt_clip_coef(&sumsq, &norm, &coef, 5);
	EXPECT(coef == 1.0, "norm at the limit: coef %g", coef);
	planrt_clip_coef(&sumsq, &norm, &coef, 0);
	EXPECT(coef == 1.0, "clipping off: coef %g", coef);

	double loss_acc = 0.5;
	float loss = 2;
	planrt_loss_accumulate(&loss_acc, &loss, 0.25);
	EXPECT(loss_acc == 1.0, "loss %g", loss_acc);
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ the optimizer step */

static void test_optimizer_step(void **state)
{
	(void)state;
	enum { N = 2 * 4096 + 777, STEPS = 4 };
	const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1, mom = 0.9, min_lr = 0.001;
	const int64_t warmup = 2, total = 10;
	float *p = malloc(N * sizeof *p), *m = malloc(N * sizeof *m), *v = malloc(N * sizeof *v);
	float *pr = malloc(N * sizeof *pr), *mr = malloc(N * sizeof *mr), *vr = malloc(N * sizeof *vr);
	float *g32 = malloc(N * sizeof *g32), *scaled = malloc(N * sizeof *scaled);
	unsigned char *grad = malloc(N * 4), *before = malloc(N * 4);
	static const planrt_dtype_t gts[] = {planrt_f32, planrt_bf16, planrt_f16};
	static const double coefs[] = {1.0, 0.37, -1};
	for (int kind = planrt_opt_sgd; kind <= planrt_opt_adamw; kind++)
		for (int gi = 0; gi < 3; gi++)
			for (int ci = 0; ci < 3; ci++) {
				planrt_dtype_t gt = gts[gi];
				const double *coef = coefs[ci] < 0 ? NULL : &coefs[ci]; /* NULL: no clipping */
				const planrt_opt_t o = {(planrt_opt_kind_t)kind, lr, b1, b2, eps, wd, mom};
				for (int i = 0; i < N; i++) {
					p[i] = pr[i] = (float)random_double(1);
					m[i] = mr[i] = v[i] = vr[i] = 0;
				}
				int has_m = kind != planrt_opt_sgd, has_v = kind >= planrt_opt_adam;
				for (int64_t step = 0; step < STEPS; step++) {
					for (int i = 0; i < N; i++)
						g32[i] = (float)random_double(3);
					size_t gbytes = (size_t)N * planrt_dtype_size(gt);
					if (gt == planrt_f32)
						memcpy(grad, g32, gbytes);
					else
						planrt_cast(g32, planrt_f32, grad, gt, N);
					memcpy(before, grad, gbytes);
					planrt_optimizer_step(kind, lr, b1, b2, eps, wd, mom, warmup, total, min_lr, step, p, grad,
							      gt, has_m ? m : NULL, has_v ? v : NULL, N, coef);
					/* the reference: what programs did, on a widened and scaled copy in one call */
					if (gt == planrt_f32)
						memcpy(scaled, grad, gbytes);
					else
						for (int i = 0; i < N; i++)
							scaled[i] = planrt_half_to_f32_(((uint16_t *)grad)[i], gt);
					if (coef && *coef != 1.0)
						planrt_k_scale_f32(scaled, scaled, N, *coef);
					planrt_opt_step(&o, planrt_lr_at(lr, step, warmup, total, min_lr), step + 1, pr, scaled,
							has_m ? mr : NULL, has_v ? vr : NULL, N);
					EXPECT(!memcmp(grad, before, gbytes), "kind %d %s: the gradient was modified", kind,
					       dtype_names[gt]);
					int same = !memcmp(p, pr, N * sizeof *p) && (!has_m || !memcmp(m, mr, N * sizeof *m)) &&
						   (!has_v || !memcmp(v, vr, N * sizeof *v));
					EXPECT(same, "kind %d, %s gradient, coef %g, step %lld: not bitwise planrt_opt_step",
					       kind, dtype_names[gt], coef ? *coef : 1.0, (long long)step);
				}
			}
	void *blocks[] = {p, m, v, pr, mr, vr, g32, scaled, grad, before};
	for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
		free(blocks[i]);
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ in-place collectives */

static int members[4]; /* world ranks of the communicator's members, by member index */

static void learn_members(planrt_comm_t c)
{
	MPI_Allgather(&rank, 1, MPI_INT, members, 1, MPI_INT, c->comm);
}

/* a value exact in every dtype used, whose sums over 4 ranks are exact too */
static double val(int r, int64_t i)
{
	return (double)((r * 7 + (int)(i % 1000) * 3) % 29 - 14) * 0.25;
}

enum { BLOCKING, STARTED, NMODES };
static const char *const mode_names[] = {"blocking", "started and finished"};

static planrt_request_t *begin(int mode, planrt_request_t *req)
{
	*req = NULL;
	return mode == BLOCKING ? NULL : req;
}

static void end(int mode, planrt_request_t *req)
{
	if (mode == STARTED) {
		EXPECT(*req != NULL, "no request started");
		for (int k = 0; k < 5; k++) /* what the GEMMs do while it is in flight: it may finish here */
			planrt_comm_poke_();
		planrt_request_finish(req);
	}
	EXPECT(*req == NULL, "the request slot is not cleared");
	EXPECT(planrt_comm_pending_ == 0, "%d operations left in flight", planrt_comm_pending_);
	planrt_request_finish(req); /* no request: nothing to do */
	planrt_comm_poke_();
}

static void check_collectives_on(planrt_comm_t c, planrt_dtype_t t)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	learn_members(c);
	static const int64_t sizes[] = {1, 257, 1031};
	size_t es = planrt_dtype_size(t);
	for (int mode = 0; mode < NMODES; mode++)
		for (int si = 0; si < 3; si++) {
			int64_t len = sizes[si], full = len * n;
			char *buf = malloc((size_t)full * es);
			planrt_request_t req;

			for (int64_t i = 0; i < len; i++)
				store(buf, (int)i, t, val(rank, i));
			planrt_allreduce_inplace(buf, len, t, c, begin(mode, &req));
			end(mode, &req);
			for (int64_t i = 0; i < len; i++) {
				double want = 0;
				for (int k = 0; k < n; k++)
					want += val(members[k], i);
				EXPECT(load(buf, (int)i, t) == want, "allreduce_inplace %s %s on %s, n %lld: [%lld] = %g, want %g",
				       dtype_names[t], mode_names[mode], c->name, (long long)len, (long long)i,
				       load(buf, (int)i, t), want);
			}

			for (int64_t i = 0; i < full; i++)
				store(buf, (int)i, t, val(rank, i));
			planrt_reduce_scatter_inplace(buf, len, t, c, begin(mode, &req));
			end(mode, &req);
			for (int64_t i = me * len; i < (me + 1) * len; i++) {
				double want = 0;
				for (int k = 0; k < n; k++)
					want += val(members[k], i);
				EXPECT(load(buf, (int)i, t) == want,
				       "reduce_scatter_inplace %s %s on %s, chunk %lld: [%lld] = %g, want %g", dtype_names[t],
				       mode_names[mode], c->name, (long long)len, (long long)i, load(buf, (int)i, t), want);
			}

			memset(buf, 0x5a, (size_t)full * es);
			for (int64_t i = 0; i < len; i++)
				store(buf, (int)(me * len + i), t, val(rank, i));
			planrt_allgather_inplace(buf, len, t, c, begin(mode, &req));
			end(mode, &req);
			for (int k = 0; k < n; k++)
				for (int64_t i = 0; i < len; i++)
					EXPECT(load(buf, (int)(k * len + i), t) == val(members[k], i),
					       "allgather_inplace %s %s on %s, chunk %lld: block %d [%lld] = %g, want %g",
					       dtype_names[t], mode_names[mode], c->name, (long long)len, k, (long long)i,
					       load(buf, (int)(k * len + i), t), val(members[k], i));
			free(buf);
		}
}

static void test_inplace_collectives(void **state)
{
	(void)state;
	int sizes[2] = {2, 2};
	const char *names[2] = {"data", "tensor"};
	assert_int_equal(planrt_mesh_init(2, sizes, names), planrt_success);
	planrt_comm_t comms[3] = {planrt_world_comm(), planrt_axis_comm(0), planrt_axis_comm(1)};
	static const planrt_dtype_t types[] = {planrt_f32, planrt_bf16, planrt_f16, planrt_f64};
	for (int ci = 0; ci < 3; ci++)
		for (int ti = 0; ti < 4; ti++)
			check_collectives_on(comms[ci], types[ti]);

	/* bf16 / f16 sums accumulate in f32 and round once (see test_collectives): rank 0 gives 1,
	 * the others 2^-9 (bf16) or 1024 and 0.5 (f16); pairwise half sums would stay at 1 / 1024 */
	for (int mode = 0; mode < NMODES; mode++) {
		planrt_request_t req;
		uint16_t b[4];
		for (int i = 0; i < 4; i++)
			b[i] = planrt_f32_to_half_(rank == 0 ? 1.0f : 0x1p-9f, planrt_bf16);
		planrt_reduce_scatter_inplace(b, 1, planrt_bf16, planrt_world_comm(), begin(mode, &req));
		end(mode, &req);
		EXPECT(half_value(b[rank], planrt_bf16) == 1.0078125, "bf16 reduce_scatter_inplace %s: %g",
		       mode_names[mode], half_value(b[rank], planrt_bf16));
		uint16_t h = planrt_f32_to_half_(rank == 0 ? 1024.0f : 0.5f, planrt_f16);
		planrt_allreduce_inplace(&h, 1, planrt_f16, planrt_world_comm(), begin(mode, &req));
		end(mode, &req);
		EXPECT(half_value(h, planrt_f16) == 1026, "f16 allreduce_inplace %s: %g", mode_names[mode],
		       half_value(h, planrt_f16));
	}
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ counters */

enum { NSLOTS = 2 + PLANRT_MAX_AXES_ };
static int slot_group(int s)
{
	return s == 0 ? PLANRT_GROUP_WORLD : s == 1 ? PLANRT_GROUP_PAIR : s - 2;
}

static uint64_t base_bytes[planrt_coll_kinds][NSLOTS], base_calls[planrt_coll_kinds][NSLOTS], base_total;
static uint64_t want_bytes[planrt_coll_kinds][NSLOTS], want_calls[planrt_coll_kinds][NSLOTS];

static void counters_begin(void)
{
	for (int k = 0; k < planrt_coll_kinds; k++)
		for (int s = 0; s < NSLOTS; s++) {
			base_bytes[k][s] = planrt_bytes_sent_by((planrt_coll_t)k, slot_group(s));
			base_calls[k][s] = planrt_calls_by((planrt_coll_t)k, slot_group(s));
			want_bytes[k][s] = want_calls[k][s] = 0;
		}
	base_total = planrt_bytes_sent();
}

/* The formula of comm_mpi.c, evaluated independently: llround of the wire bytes. */
static void expect_call(planrt_coll_t kind, planrt_comm_t c, size_t count, planrt_dtype_t t)
{
	int n = planrt_comm_size(c);
	double es = (double)planrt_dtype_size(t), b = (double)count * es, bytes;
	if (kind == planrt_coll_reduce_scatter || kind == planrt_coll_allgather || kind == planrt_coll_alltoall)
		b *= n;
	if (n == 1 || kind == planrt_coll_recv)
		bytes = 0;
	else if (kind == planrt_coll_send)
		bytes = b;
	else
		bytes = (kind == planrt_coll_allreduce ? 2.0 : 1.0) * (n - 1) * b / n;
	int s = c->group == PLANRT_GROUP_WORLD ? 0 : c->group == PLANRT_GROUP_PAIR ? 1 : 2 + c->group;
	want_bytes[kind][s] += (uint64_t)llround(bytes);
	want_calls[kind][s]++;
}

static void counters_check(const char *phase)
{
	uint64_t sum = 0;
	for (int k = 0; k < planrt_coll_kinds; k++)
		for (int s = 0; s < NSLOTS; s++) {
			uint64_t b = planrt_bytes_sent_by((planrt_coll_t)k, slot_group(s)) - base_bytes[k][s];
			uint64_t c = planrt_calls_by((planrt_coll_t)k, slot_group(s)) - base_calls[k][s];
			EXPECT(b == want_bytes[k][s] && c == want_calls[k][s],
			       "%s: %s on group %d: %llu bytes in %llu calls, want %llu in %llu", phase,
			       planrt_coll_name((planrt_coll_t)k), slot_group(s), (unsigned long long)b,
			       (unsigned long long)c, (unsigned long long)want_bytes[k][s],
			       (unsigned long long)want_calls[k][s]);
			sum += want_bytes[k][s];
		}
	EXPECT(planrt_bytes_sent() - base_total == sum, "%s: planrt_bytes_sent grew by %llu, want %llu", phase,
	       (unsigned long long)(planrt_bytes_sent() - base_total), (unsigned long long)sum);
}

static void test_counters(void **state)
{
	(void)state;
	static const char *const names[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
					    "broadcast", "send", "recv", "alltoallv"};
	for (int k = 0; k < planrt_coll_kinds; k++)
		EXPECT(!strcmp(planrt_coll_name((planrt_coll_t)k), names[k]), "name of kind %d: %s", k,
		       planrt_coll_name((planrt_coll_t)k));
	EXPECT(planrt_coll_name(planrt_coll_kinds) != NULL, "name of a bad kind");
	EXPECT(planrt_bytes_sent_by(planrt_coll_kinds, PLANRT_GROUP_WORLD) == 0 &&
		       planrt_bytes_sent_by(planrt_coll_allreduce, PLANRT_MAX_AXES_) == 0 &&
		       planrt_calls_by(planrt_coll_allreduce, -3) == 0,
	       "out-of-range kind or group counts nothing");

	int sizes[2] = {2, 2};
	const char *mesh_names[2] = {"data", "tensor"};
	assert_int_equal(planrt_mesh_init(2, sizes, mesh_names), planrt_success);
	planrt_comm_t w = planrt_world_comm(), a0 = planrt_axis_comm(0), a1 = planrt_axis_comm(1), pair;
	assert_int_equal(planrt_pair_comm(1, 0, 1, &pair), planrt_success); /* every rank is in one */
	static unsigned char x[4096], y[4096];
	planrt_request_t req, reqs[2];
	int next = (rank + 1) % world, prev = (rank + world - 1) % world;

	counters_begin();
	/* the world (n = 4): 2 * 3/4 * 7 = 10.5 rounds to 11; 3/4 * 7 = 5.25 to 5, 3/4 * 5 to 4,
	 * 3/4 * 2 = 1.5 to 2 */
	PLANRT_CHECK(planrt_allreduce(x, y, 7, planrt_u8, planrt_sum, w, NULL, NULL));
	expect_call(planrt_coll_allreduce, w, 7, planrt_u8);
	PLANRT_CHECK(planrt_allreduce(x, y, 3, planrt_bf16, planrt_sum, w, NULL, NULL));
	expect_call(planrt_coll_allreduce, w, 3, planrt_bf16);
	PLANRT_CHECK(planrt_allreduce(x, y, 5, planrt_f32, planrt_max, w, NULL, &req));
	expect_call(planrt_coll_allreduce, w, 5, planrt_f32);
	PLANRT_CHECK(planrt_wait(req));
	PLANRT_CHECK(planrt_reduce_scatter(x, y, 3, planrt_i32, planrt_sum, w, NULL, NULL));
	expect_call(planrt_coll_reduce_scatter, w, 3, planrt_i32);
	PLANRT_CHECK(planrt_allgather(x, y, 5, planrt_f16, w, NULL, NULL));
	expect_call(planrt_coll_allgather, w, 5, planrt_f16);
	PLANRT_CHECK(planrt_alltoall(x, y, 3, planrt_u8, w, NULL, NULL));
	expect_call(planrt_coll_alltoall, w, 3, planrt_u8);
	PLANRT_CHECK(planrt_broadcast(y, 7, planrt_u8, 1, w, NULL, NULL));
	expect_call(planrt_coll_broadcast, w, 7, planrt_u8);
	PLANRT_CHECK(planrt_broadcast(y, 5, planrt_u8, 0, w, NULL, NULL));
	expect_call(planrt_coll_broadcast, w, 5, planrt_u8);
	PLANRT_CHECK(planrt_broadcast(y, 2, planrt_u8, 3, w, NULL, &req));
	expect_call(planrt_coll_broadcast, w, 2, planrt_u8);
	PLANRT_CHECK(planrt_wait(req));
	PLANRT_CHECK(planrt_recv(y, 25, planrt_f32, prev, w, NULL, &reqs[0]));
	expect_call(planrt_coll_recv, w, 25, planrt_f32);
	PLANRT_CHECK(planrt_send(x, 25, planrt_f32, next, w, NULL, NULL));
	expect_call(planrt_coll_send, w, 25, planrt_f32);
	PLANRT_CHECK(planrt_wait(reqs[0]));
	PLANRT_CHECK(planrt_recv_tagged(y, 3, planrt_u8, prev, 5, w, NULL, &reqs[0]));
	expect_call(planrt_coll_recv, w, 3, planrt_u8);
	PLANRT_CHECK(planrt_send_tagged(x, 3, planrt_u8, next, 5, w, NULL, &reqs[1]));
	expect_call(planrt_coll_send, w, 3, planrt_u8);
	PLANRT_CHECK(planrt_wait(reqs[0]));
	PLANRT_CHECK(planrt_wait(reqs[1]));
	/* refused calls count nothing */
	EXPECT(planrt_send(x, 1, planrt_f32, world, w, NULL, NULL) == planrt_invalid_argument, "peer out of range");
	EXPECT(planrt_send_tagged(x, 1, planrt_f32, next, -1, w, NULL, NULL) == planrt_invalid_argument, "negative tag");
	EXPECT(planrt_allreduce(x, y, 1, planrt_f32, planrt_sum, NULL, NULL, NULL) == planrt_invalid_usage, "NULL comm");
	/* axis 0 (n = 2): 2 * 1/2 * 7 = 7; 1/2 * 7 = 3.5 rounds to 4; the in-place step kernels */
	PLANRT_CHECK(planrt_allreduce(x, y, 7, planrt_u8, planrt_sum, a0, NULL, NULL));
	expect_call(planrt_coll_allreduce, a0, 7, planrt_u8);
	PLANRT_CHECK(planrt_broadcast(y, 7, planrt_u8, 0, a0, NULL, NULL));
	expect_call(planrt_coll_broadcast, a0, 7, planrt_u8);
	planrt_reduce_scatter_inplace(x, 3, planrt_f32, a0, NULL);
	expect_call(planrt_coll_reduce_scatter, a0, 3, planrt_f32);
	/* axis 1 */
	planrt_allgather_inplace(y, 5, planrt_bf16, a1, NULL);
	expect_call(planrt_coll_allgather, a1, 5, planrt_bf16);
	req = NULL;
	planrt_allreduce_inplace(y, 3, planrt_f64, a1, &req);
	expect_call(planrt_coll_allreduce, a1, 3, planrt_f64);
	planrt_request_finish(&req);
	/* the pair group, both ways */
	PLANRT_CHECK(planrt_allreduce(x, y, 3, planrt_f32, planrt_sum, pair, NULL, NULL));
	expect_call(planrt_coll_allreduce, pair, 3, planrt_f32);
	int other = 1 - planrt_comm_rank(pair);
	PLANRT_CHECK(planrt_recv(y, 4, planrt_f32, other, pair, NULL, &reqs[0]));
	expect_call(planrt_coll_recv, pair, 4, planrt_f32);
	PLANRT_CHECK(planrt_send(x, 4, planrt_f32, other, pair, NULL, NULL));
	expect_call(planrt_coll_send, pair, 4, planrt_f32);
	PLANRT_CHECK(planrt_wait(reqs[0]));
	counters_check("mesh 2 x 2");

	/* a one-member group (axis 1 of a 4 x 1 mesh) counts calls and no bytes, p2p to itself
	 * included; axis 0 now has 4 members: 2 * 3/4 * 1 = 1.5 rounds to 2 */
	int sizes41[2] = {4, 1};
	const char *names41[2] = {"pipe", "one"};
	assert_int_equal(planrt_mesh_init(2, sizes41, names41), planrt_success);
	planrt_comm_t one = planrt_axis_comm(1), pipe = planrt_axis_comm(0);
	counters_begin();
	PLANRT_CHECK(planrt_allreduce(x, y, 10, planrt_f32, planrt_sum, one, NULL, NULL));
	expect_call(planrt_coll_allreduce, one, 10, planrt_f32);
	PLANRT_CHECK(planrt_recv_tagged(y, 8, planrt_f32, 0, 3, one, NULL, &req));
	expect_call(planrt_coll_recv, one, 8, planrt_f32);
	PLANRT_CHECK(planrt_send_tagged(x, 8, planrt_f32, 0, 3, one, NULL, NULL));
	expect_call(planrt_coll_send, one, 8, planrt_f32);
	PLANRT_CHECK(planrt_wait(req));
	PLANRT_CHECK(planrt_allreduce(x, y, 1, planrt_u8, planrt_sum, pipe, NULL, NULL));
	expect_call(planrt_coll_allreduce, pipe, 1, planrt_u8);
	counters_check("mesh 4 x 1");
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ tagged p2p */

/* Between partners r and r ^ 1, each side sends two messages on tag 1 and two on tag 2, in the
 * orders 1 2 1 2 (even ranks) and 2 1 2 1 (odd ranks), and receives them tag by tag in the order
 * opposite to its partner's: 2 2 1 1 (even) and 1 1 2 2 (odd). Message k of tag T from rank r
 * holds r * 1000 + T * 100 + k + i at index i; the first on tag 1 is large (MPI's rendezvous
 * protocol rather than eager). Round 0 starts the sends and receives blocking; round 1 posts the
 * receives first and sends blocking. */
static int msg_count(int tag, int k)
{
	return tag == 1 && k == 0 ? 70000 : 64 + tag * 8 + k;
}

static void test_tagged_p2p(void **state)
{
	(void)state;
	planrt_comm_t w = planrt_world_comm();
	int partner = rank ^ 1, even = rank % 2 == 0;
	static const int order_a[4] = {1, 2, 1, 2}, order_b[4] = {2, 1, 2, 1};
	static const int recv_a[4] = {2, 2, 1, 1}, recv_b[4] = {1, 1, 2, 2};
	const int *send_tags = even ? order_a : order_b, *recv_tags = even ? recv_a : recv_b;
	for (int round = 0; round < 2; round++) {
		float *out[4], *in[4];
		int sent[3] = {0}, got[3] = {0};
		planrt_request_t sreq[4], rreq[4];
		for (int j = 0; j < 4; j++) {
			int tag = send_tags[j], k = sent[tag]++, cnt = msg_count(tag, k);
			out[j] = malloc(sizeof(float) * (size_t)cnt);
			for (int i = 0; i < cnt; i++)
				out[j][i] = (float)(rank * 1000 + tag * 100 + k + i % 50);
			int tag_r = recv_tags[j], k_r = got[tag_r]++;
			in[j] = calloc((size_t)msg_count(tag_r, k_r), sizeof(float));
		}
		if (round == 0) {
			for (int j = 0; j < 4; j++)
				PLANRT_CHECK(planrt_send_tagged(out[j], (size_t)msg_count(send_tags[j], j / 2), planrt_f32,
								partner, send_tags[j], w, NULL, &sreq[j]));
			for (int j = 0; j < 4; j++)
				PLANRT_CHECK(planrt_recv_tagged(in[j], (size_t)msg_count(recv_tags[j], j % 2), planrt_f32,
								partner, recv_tags[j], w, NULL, NULL));
			for (int j = 0; j < 4; j++)
				PLANRT_CHECK(planrt_wait(sreq[j]));
		} else {
			for (int j = 0; j < 4; j++)
				PLANRT_CHECK(planrt_recv_tagged(in[j], (size_t)msg_count(recv_tags[j], j % 2), planrt_f32,
								partner, recv_tags[j], w, NULL, &rreq[j]));
			for (int j = 0; j < 4; j++)
				PLANRT_CHECK(planrt_send_tagged(out[j], (size_t)msg_count(send_tags[j], j / 2), planrt_f32,
								partner, send_tags[j], w, NULL, NULL));
			for (int j = 3; j >= 0; j--)
				PLANRT_CHECK(planrt_wait(rreq[j]));
		}
		for (int j = 0; j < 4; j++) {
			int tag = recv_tags[j], k = j % 2, cnt = msg_count(tag, k);
			for (int i = 0; i < cnt; i++)
				if (in[j][i] != (float)(partner * 1000 + tag * 100 + k + i % 50)) {
					EXPECT(0, "round %d: message %d of tag %d from %d: [%d] = %g", round, k, tag, partner,
					       i, in[j][i]);
					break;
				}
			free(out[j]);
			free(in[j]);
		}
	}
	assert_all_ranks_clean();
}

int main(int argc, char **argv)
{
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world != 4) {
		if (rank == 0)
			fprintf(stderr, "test_step_kernels runs on 4 ranks (mpirun -np 4), not %d\n", world);
		planrt_finalize();
		return 1;
	}
	rng_state += (uint64_t)rank; /* each rank draws its own values; every check is local */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fill),
		cmocka_unit_test(test_accumulate),
		cmocka_unit_test(test_cast),
		cmocka_unit_test(test_sums_clip_and_loss),
		cmocka_unit_test(test_optimizer_step),
		cmocka_unit_test(test_inplace_collectives),
		cmocka_unit_test(test_counters),
		cmocka_unit_test(test_tagged_p2p),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	int any = 0;
	MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	planrt_finalize();
	return any ? 1 : 0;
}
