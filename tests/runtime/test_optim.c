/* test_optim.c: planrt_opt_step against PyTorch 1.13's torch.optim (numbers generated once by
 * make_optim_reference.py into optim_reference.txt), the learning-rate schedule and the sum of
 * squares. */
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

enum { MAXN = 64 };

static int read_floats(char *line, const char *tag, float *x, int n)
{
	size_t len = strlen(tag);
	if (strncmp(line, tag, len) || line[len] != ' ')
		return 0;
	char *p = line + len;
	for (int i = 0; i < n; i++) {
		char *end;
		x[i] = strtof(p, &end);
		if (end == p)
			return 0;
		p = end;
	}
	return 1;
}

static void test_against_pytorch(void **state)
{
	FILE *fp = fopen(RUNTIME_TEST_DIR "/optim_reference.txt", "r");
	assert_non_null(fp);
	char line[4096];
	int cases = 0, steps = 0;
	double worst = 0;
	while (fgets(line, sizeof line, fp)) {
		if (strncmp(line, "case ", 5))
			continue;
		char kind[16];
		planrt_opt_t o = {0};
		int n, nsteps;
		assert_int_equal(sscanf(line, "case %15s lr=%lf beta1=%lf beta2=%lf eps=%lf wd=%lf momentum=%lf n=%d steps=%d",
					kind, &o.lr, &o.beta1, &o.beta2, &o.eps, &o.weight_decay, &o.momentum, &n, &nsteps),
				 9);
		assert_true(n <= MAXN);
		o.kind = !strcmp(kind, "sgd")        ? planrt_opt_sgd
			 : !strcmp(kind, "momentum") ? planrt_opt_momentum
			 : !strcmp(kind, "adam")     ? planrt_opt_adam
						     : planrt_opt_adamw;
		float p[MAXN], g[MAXN], want[MAXN], m[MAXN] = {0}, v[MAXN] = {0};
		assert_non_null(fgets(line, sizeof line, fp));
		assert_true(read_floats(line, "init", p, n));
		for (int t = 1; t <= nsteps; t++) {
			int ts;
			double lr;
			assert_non_null(fgets(line, sizeof line, fp));
			assert_int_equal(sscanf(line, "step %d %lf", &ts, &lr), 2);
			assert_int_equal(ts, t);
			assert_non_null(fgets(line, sizeof line, fp));
			assert_true(read_floats(line, "grad", g, n));
			assert_non_null(fgets(line, sizeof line, fp));
			assert_true(read_floats(line, "param", want, n));
			float before[MAXN];
			memcpy(before, p, sizeof before);
			planrt_opt_step(&o, lr, t, p, g, m, v, (size_t)n);
			for (int i = 0; i < n; i++) {
				/* torch's vector kernels fuse multiply-adds (one rounding fewer): allow a few
				 * ulps of the operands of the last update, which may cancel */
				double err = fabs((double)p[i] - want[i]);
				double tol = 2.5e-7 * (fabs(want[i]) + fabs(before[i])) + 1e-12;
				if (err > tol)
					fail_msg("%s case %d step %d element %d: planrt %.9g, torch %.9g", kind, cases, t, i,
						 p[i], want[i]);
				if (err / tol > worst)
					worst = err / tol;
			}
			steps++;
		}
		cases++;
	}
	fclose(fp);
	assert_int_equal(cases, 9);
	print_message("%d cases, %d steps against torch; worst difference %.2f of the tolerance\n", cases, steps, worst);
}

/* The update formulas by hand, one element, to pin the semantics independently of the file. */
static void test_by_hand(void **state)
{
	planrt_opt_t o = {planrt_opt_adamw, 0.01, 0.9, 0.999, 1e-8, 0.1, 0};
	float p = 1.0f, g = 0.5f, m = 0, v = 0;
	planrt_opt_step(&o, 0.01, 1, &p, &g, &m, &v, 1);
	/* step 1: decay 1 * (1 - 0.001); m_hat = g, v_hat = g^2: update = lr * g / (|g| + eps) */
	double want = 0.999 - 0.01 * 0.5 / (0.5 + 1e-8);
	assert_true(fabs(p - want) < 1e-6);
	assert_true(fabs(m - 0.05) < 1e-8 && fabs(v - 0.00025) < 1e-9);
	o.kind = planrt_opt_momentum;
	o.momentum = 0.9;
	o.weight_decay = 0;
	p = 1.0f;
	m = 123; /* ignored at step 1: the buffer starts as the gradient */
	planrt_opt_step(&o, 0.1, 1, &p, &g, &m, NULL, 1);
	assert_true(m == 0.5f && fabs(p - 0.95) < 1e-7);
	planrt_opt_step(&o, 0.1, 2, &p, &g, &m, NULL, 1);
	assert_true(fabs(m - 0.95) < 1e-7 && fabs(p - (0.95 - 0.095)) < 1e-6);
}

static void test_lr_schedule(void **state)
{
	const double lr = 1e-3, lo = 1e-4;
	/* warmup: (step + 1) / warmup of lr, so step 0 already trains */
	assert_true(fabs(planrt_lr_at(lr, 0, 10, 100, lo) - 1e-4) < 1e-15);
	assert_true(fabs(planrt_lr_at(lr, 9, 10, 100, lo) - 1e-3) < 1e-15);
	/* cosine from lr at warmup to min_lr at total */
	assert_true(fabs(planrt_lr_at(lr, 10, 10, 100, lo) - lr) < 1e-15);
	assert_true(fabs(planrt_lr_at(lr, 55, 10, 100, lo) - (lo + lr) / 2) < 1e-15);
	assert_true(planrt_lr_at(lr, 99, 10, 100, lo) > lo);
	assert_true(planrt_lr_at(lr, 99, 10, 100, lo) < lo * 1.01);
	assert_true(planrt_lr_at(lr, 100, 10, 100, lo) == lo);
	assert_true(planrt_lr_at(lr, 5000, 10, 100, lo) == lo);
	/* total 0: constant after the warmup; no warmup: lr from step 0 */
	assert_true(planrt_lr_at(lr, 5000, 0, 0, lo) == lr);
	assert_true(planrt_lr_at(lr, 0, 0, 0, lo) == lr);
	assert_true(fabs(planrt_lr_at(lr, 1, 4, 0, lo) - lr / 2) < 1e-15);
	assert_true(planrt_lr_at(lr, 0, 0, 100, lo) == lr);
	/* monotone decay */
	for (int s = 11; s < 100; s++)
		assert_true(planrt_lr_at(lr, s, 10, 100, lo) <= planrt_lr_at(lr, s - 1, 10, 100, lo));
}

static void test_sum_squares(void **state)
{
	float x[1000];
	double want = 0;
	for (int i = 0; i < 1000; i++) {
		x[i] = (float)(i % 17) * 0.125f - 1;
		want += (double)x[i] * x[i];
	}
	assert_true(planrt_sum_squares(x, 1000) == want);
	assert_true(planrt_sum_squares(x, 0) == 0);
	float big[2] = {1e30f, 1e30f};
	assert_true(fabs(planrt_sum_squares(big, 2) / 2e60 - 1) < 1e-6); /* no f32 overflow */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_against_pytorch),
		cmocka_unit_test(test_by_hand),
		cmocka_unit_test(test_lr_schedule),
		cmocka_unit_test(test_sum_squares),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
