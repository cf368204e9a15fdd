/* test_matmul_bf16.c: planrt_k_matmul_bf16, the GEMM of bf16 operands that `precision bf16`
 * programs run without widened copies (docs/gpu.md), against two references on random bf16 data:
 *   - the path it replaces: both operands widened whole to f32, planrt_k_matmul_f32, C rounded to
 *     bf16 afterwards (for a bf16 C: widened first when accumulating): equal bit for bit where the
 *     product fits the 16 MiB of widened tiles (one f32 GEMM, what the small models run);
 *   - a double-precision product of the same bf16 values (independent of OpenBLAS): within f32
 *     rounding of the sum, and within half a bf16 ulp more for a bf16 C.
 * Shapes cover both transposes, products past the scratch (tiles halved on the longer side, edges
 * not multiples of the tile; OpenBLAS orders a smaller GEMM's terms its own way, so those are held
 * to the double reference only), K = 0, the batch merges (a shared B under stacked A; a
 * sum of A_i^T B_i into one C) and a plain batch, overwrite and accumulate, f32 and bf16 C. Then
 * planrt_k_matmul_f16 (`precision fp16`) the same way on f16 operands and an f16 C (within half an
 * f16 ulp more), on every case but the largest tiled ones. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "report.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* in [-1, 1) */
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

/* the operands' and a 16-bit C's type: bf16 (planrt_k_matmul_bf16), then f16 (planrt_k_matmul_f16) */
static planrt_dtype_t AB = planrt_bf16;

static uint16_t *random_bf16(int64_t n)
{
	float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
	uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
	for (int64_t i = 0; i < n; i++)
		f[i] = uniform();
	planrt_cast(f, planrt_f32, h, AB, n);
	free(f);
	return h;
}

static float *widened(const uint16_t *h, int64_t n)
{
	float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
	planrt_cast(h, AB, f, planrt_f32, n);
	return f;
}

typedef struct {
	const char *what;
	int64_t batch, M, N, K;
	int ta, tb;
	int64_t sa, sb, sc; /* -1: the dense stride of the operand */
} Case;

/* op(X) of a batch entry as doubles, row i holding its K terms contiguously: rows = M for A (op(A)
 * is M x K), and for B its transpose (op(B)^T is N x K), so the reference's inner loop is a walk */
static double *packed(const float *x, int trans, int64_t rows, int64_t K, int rows_are_columns)
{
	double *d = malloc(sizeof(double) * (size_t)(rows * K > 0 ? rows * K : 1));
	for (int64_t i = 0; i < rows; i++)
		for (int64_t k = 0; k < K; k++)
			d[i * K + k] = rows_are_columns ? (trans ? x[i * K + k] : x[k * rows + i])
							: (trans ? x[k * rows + i] : x[i * K + k]);
	return d;
}

/* The double reference of a case's products, without C's initial value: sum[at] and abs_sum[at]
 * for every element checked (a shared C: once, as the sum of every batch entry's product) */
static void double_reference(const Case *c, const float *Af, const float *Bf, int64_t sa, int64_t sb, int64_t sc,
			     double *sum, double *abs_sum)
{
	for (int64_t b = 0; b < c->batch; b++) {
		if (sc == 0 && b < c->batch - 1)
			continue; /* a shared C: checked once, as the sum of every entry */
		for (int64_t e = sc == 0 ? 0 : b; e <= b; e++) {
			double *a = packed(Af + e * sa, c->ta, c->M, c->K, 0), *bt = packed(Bf + e * sb, c->tb, c->N, c->K, 1);
			for (int64_t i = 0; i < c->M; i++)
				for (int64_t j = 0; j < c->N; j++) {
					double s = 0, abs_s = 0;
					for (int64_t k = 0; k < c->K; k++) {
						double p = a[i * c->K + k] * bt[j * c->K + k];
						s += p;
						abs_s += fabs(p);
					}
					sum[b * sc + i * c->N + j] += s;
					abs_sum[b * sc + i * c->N + j] += abs_s;
				}
			free(a), free(bt);
		}
	}
}

/* one case with a C of type ct, overwritten or accumulated into, on the case's operands */
static void check_variant(const Case *c, planrt_dtype_t ct, int accumulate, const uint16_t *A, const uint16_t *B,
			  const uint16_t *C0, const float *Af, const float *Bf, const float *Cf, const double *sum,
			  const double *abs_sum)
{
	int64_t sa = c->sa < 0 ? c->M * c->K : c->sa, sb = c->sb < 0 ? c->K * c->N : c->sb,
		sc = c->sc < 0 ? c->M * c->N : c->sc;
	int whole = (c->M + c->N) * c->K * (c->sc == 0 ? c->batch : 1) + c->M * c->N <= ((int64_t)1 << 22);
	int64_t nc = (c->batch - 1) * sc + c->M * c->N;
	/* the replaced path */
	float *want = malloc(sizeof(float) * (size_t)nc);
	memcpy(want, Cf, sizeof(float) * (size_t)nc);
	planrt_k_matmul_f32(c->batch, c->M, c->N, c->K, Af, c->ta, sa, Bf, c->tb, sb, want, sc, accumulate);
	/* the bf16 GEMM */
	void *got = ct == planrt_f32 ? (void *)malloc(sizeof(float) * (size_t)nc) : (void *)malloc(sizeof(uint16_t) * (size_t)nc);
	if (ct == planrt_f32)
		memcpy(got, Cf, sizeof(float) * (size_t)nc);
	else
		memcpy(got, C0, sizeof(uint16_t) * (size_t)nc);
	(AB == planrt_bf16 ? planrt_k_matmul_bf16 : planrt_k_matmul_f16)(c->batch, c->M, c->N, c->K, A, c->ta, sa, B, c->tb,
									   sb, got, ct, sc, accumulate);
	float *gotf = ct == planrt_f32 ? (float *)got : widened((const uint16_t *)got, nc);
	if (ct != planrt_f32) { /* the replaced path rounds C once, after the products */
		uint16_t *r = malloc(sizeof(uint16_t) * (size_t)nc);
		planrt_cast(want, planrt_f32, r, AB, nc);
		free(want);
		want = widened(r, nc);
		free(r);
	}
	int64_t same = 0;
	for (int64_t i = 0; i < nc; i++)
		same += memcmp(&want[i], &gotf[i], 4) == 0;
	double worst = 0;
	for (int64_t b = sc == 0 ? c->batch - 1 : 0; b < c->batch; b++)
		for (int64_t i = 0; i < c->M; i++)
			for (int64_t j = 0; j < c->N; j++) {
				int64_t at = b * sc + i * c->N + j;
				double ref = (accumulate ? Cf[at] : 0) + sum[at],
				       scale = (accumulate ? fabs(Cf[at]) : 0) + abs_sum[at];
				double err = fabs(gotf[at] - ref) / (scale > 0 ? scale : 1);
				worst = err > worst ? err : worst;
			}
	double tol = (ct == planrt_bf16 ? 0x1p-8 : ct == planrt_f16 ? 0x1p-11 : 0) +
		     0x1p-21 * (double)(c->K * (sc == 0 ? c->batch : 1) + 2);
	const char *ab = AB == planrt_bf16 ? "bf16" : "f16", *cn = ct == planrt_f32 ? "f32" : ab;
	if (whole)
		report(same == nc, "%s %s, %s C, %s: %lld of %lld elements equal the widened f32 GEMM's bit for bit", ab,
		       c->what, cn, accumulate ? "accumulate" : "overwrite", (long long)same, (long long)nc);
	report(worst <= tol, "%s %s, %s C, %s: worst error %.2e of the absolute sum against double (bound %.2e)", ab,
	       c->what, cn, accumulate ? "accumulate" : "overwrite", worst, tol);
	free(want), free(got);
	if (gotf != got)
		free(gotf);
}

/* a case's random operands, its double reference computed once, then its four variants (f32 or
 * bf16 C, overwritten or accumulated into) checked on them */
static void run_case(const Case *c)
{
	int64_t sa = c->sa < 0 ? c->M * c->K : c->sa, sb = c->sb < 0 ? c->K * c->N : c->sb,
		sc = c->sc < 0 ? c->M * c->N : c->sc;
	int64_t na = (c->batch - 1) * sa + c->M * c->K, nb = (c->batch - 1) * sb + c->K * c->N,
		nc = (c->batch - 1) * sc + c->M * c->N;
	uint16_t *A = random_bf16(na), *B = random_bf16(nb), *C0 = random_bf16(nc);
	float *Af = widened(A, na), *Bf = widened(B, nb), *Cf = widened(C0, nc);
	double *sum = calloc((size_t)nc, sizeof(double)), *abs_sum = calloc((size_t)nc, sizeof(double));
	double_reference(c, Af, Bf, sa, sb, sc, sum, abs_sum);
	for (int ct = 0; ct < 2; ct++)
		for (int acc = 0; acc < 2; acc++)
			check_variant(c, ct ? AB : planrt_f32, acc, A, B, C0, Af, Bf, Cf, sum, abs_sum);
	free(A), free(B), free(C0), free(Af), free(Bf), free(Cf), free(sum), free(abs_sum);
}

int main(void)
{
	const Case cases[] = {
		{"16x24x40", 1, 16, 24, 40, 0, 0, -1, -1, -1},
		{"A^T B^T 33x17x29", 1, 33, 17, 29, 1, 1, -1, -1, -1},
		{"one GEMM: 300x520x64", 1, 300, 520, 64, 0, 0, -1, -1, -1},
		{"one GEMM, A^T: 40x300x9000", 1, 40, 300, 9000, 1, 0, -1, -1, -1},
		{"tiled in M: 300x260x8000", 1, 300, 260, 8000, 0, 0, -1, -1, -1},
		{"tiled in M and N, A^T B^T: 130x150x20000", 1, 130, 150, 20000, 1, 1, -1, -1, -1},
		{"tiled, B^T, K = 70000: 50x70x70000", 1, 50, 70, 70000, 0, 1, -1, -1, -1},
		{"K = 0", 1, 5, 7, 0, 0, 0, -1, -1, -1},
		{"shared B under stacked A (a linear layer)", 3, 20, 30, 12, 0, 0, -1, 0, -1},
		{"sum of A_i^T B_i into one C (a weight gradient)", 4, 18, 22, 10, 1, 0, -1, -1, 0},
		{"a plain batch of 3, B^T", 3, 9, 11, 13, 0, 1, -1, -1, -1},
		{"a shared C over a batch of 3 (A B^T)", 3, 6, 5, 7, 0, 1, -1, -1, 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		run_case(&cases[i]);
	AB = planrt_f16; /* the same cases of f16 operands, but for the largest tiled ones */
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (cases[i].K < 10000)
			run_case(&cases[i]);
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
