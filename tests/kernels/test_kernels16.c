/* test_kernels16.c: the 16-bit variants of sum_to and the norms (planrt_k_*_16, which a bf16 or
 * f16 program calls on its 2-byte activations instead of casting them into f32 copies) against the
 * path they replace: every 16-bit operand cast whole to f32, the _f32 kernel, every 16-bit result
 * cast back. They must agree bit for bit, in bf16 and in f16, on shapes that fit one block of rows,
 * that take several (the last one short), rows longer than a block, and the sums that reduce a
 * whole tensor (streamed through the eight partial sums) or keep some dims (blocked by the outer
 * dim), with the f32 outputs that accumulate (sum_to_acc's out, the weight gradients) starting
 * from non-zero values. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "report.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void) /* in [-1, 1) */
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static void *xalloc(size_t n)
{
	void *p = calloc(n ? n : 1, 1);
	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	return p;
}

/* n random values stored as t (2 bytes each) */
static uint16_t *random_16(int64_t n, planrt_dtype_t t)
{
	float *f = xalloc(sizeof(float) * (size_t)n);
	uint16_t *h = xalloc(sizeof(uint16_t) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		f[i] = 2 * uniform();
	planrt_cast(f, planrt_f32, h, t, n);
	free(f);
	return h;
}

static float *random_f32(int64_t n)
{
	float *f = xalloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		f[i] = uniform();
	return f;
}

static float *widened(const uint16_t *h, int64_t n, planrt_dtype_t t)
{
	if (!h)
		return NULL;
	float *f = xalloc(sizeof(float) * (size_t)n);
	planrt_cast(h, t, f, planrt_f32, n);
	return f;
}

static uint16_t *narrowed(const float *f, int64_t n, planrt_dtype_t t)
{
	uint16_t *h = xalloc(sizeof(uint16_t) * (size_t)n);
	planrt_cast(f, planrt_f32, h, t, n);
	return h;
}

static float *copy_f32(const float *f, int64_t n)
{
	float *c = xalloc(sizeof(float) * (size_t)n);
	memcpy(c, f, sizeof(float) * (size_t)n);
	return c;
}

static int same(const void *a, const void *b, size_t bytes)
{
	return memcmp(a, b, bytes) == 0;
}

static const char *tname(planrt_dtype_t t)
{
	return t == planrt_bf16 ? "bf16" : "f16";
}

static void layer_norm(planrt_dtype_t t, int64_t rows, int64_t cols, int with_w, int with_b)
{
	int64_t n = rows * cols;
	uint16_t *x = random_16(n, t), *w = with_w ? random_16(cols, t) : NULL, *b = with_b ? random_16(cols, t) : NULL;
	uint16_t *y = xalloc(2 * (size_t)n), *dy = random_16(n, t), *dx = xalloc(2 * (size_t)n);
	float *mean = xalloc(4 * (size_t)rows), *rstd = xalloc(4 * (size_t)rows);
	float *dw0 = random_f32(cols), *db0 = random_f32(cols);
	float *dw = copy_f32(dw0, cols), *db = copy_f32(db0, cols);
	planrt_k_layer_norm_16(x, w, b, y, mean, rstd, rows, cols, 1e-5, t);
	planrt_k_layer_norm_grad_16(x, w, mean, rstd, dy, dx, with_w ? dw : NULL, with_b ? db : NULL, rows, cols, t);

	float *x32 = widened(x, n, t), *w32 = widened(w, cols, t), *b32 = widened(b, cols, t), *dy32 = widened(dy, n, t);
	float *y32 = xalloc(4 * (size_t)n), *dx32 = xalloc(4 * (size_t)n);
	float *rmean = xalloc(4 * (size_t)rows), *rrstd = xalloc(4 * (size_t)rows);
	float *rdw = copy_f32(dw0, cols), *rdb = copy_f32(db0, cols);
	planrt_k_layer_norm_f32(x32, w32, b32, y32, rmean, rrstd, rows, cols, 1e-5);
	planrt_k_layer_norm_grad_f32(x32, w32, rmean, rrstd, dy32, dx32, with_w ? rdw : NULL, with_b ? rdb : NULL, rows,
				     cols);
	uint16_t *ry = narrowed(y32, n, t), *rdx = narrowed(dx32, n, t);
	report(same(y, ry, 2 * (size_t)n) && same(mean, rmean, 4 * (size_t)rows) && same(rstd, rrstd, 4 * (size_t)rows),
	       "layer_norm_16 %s %lld x %lld%s%s: y, mean, rstd as the casts and layer_norm_f32", tname(t),
	       (long long)rows, (long long)cols, with_w ? " w" : "", with_b ? " b" : "");
	report(same(dx, rdx, 2 * (size_t)n) && same(dw, rdw, 4 * (size_t)cols) && same(db, rdb, 4 * (size_t)cols),
	       "layer_norm_grad_16 %s %lld x %lld%s%s: dx, dw, db as the casts and layer_norm_grad_f32", tname(t),
	       (long long)rows, (long long)cols, with_w ? " w" : "", with_b ? " b" : "");
	void *all[] = {x, w, b, y, dy, dx, mean, rstd, dw0, db0, dw, db, x32, w32, b32, dy32, y32, dx32, rmean, rrstd,
		       rdw, rdb, ry, rdx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

static void rms_norm(planrt_dtype_t t, int64_t rows, int64_t cols, int with_w)
{
	int64_t n = rows * cols;
	uint16_t *x = random_16(n, t), *w = with_w ? random_16(cols, t) : NULL;
	uint16_t *y = xalloc(2 * (size_t)n), *dy = random_16(n, t), *dx = xalloc(2 * (size_t)n);
	float *rstd = xalloc(4 * (size_t)rows), *dw0 = random_f32(cols), *dw = copy_f32(dw0, cols);
	planrt_k_rms_norm_16(x, w, y, rstd, rows, cols, 1e-6, t);
	planrt_k_rms_norm_grad_16(x, w, rstd, dy, dx, with_w ? dw : NULL, rows, cols, t);

	float *x32 = widened(x, n, t), *w32 = widened(w, cols, t), *dy32 = widened(dy, n, t);
	float *y32 = xalloc(4 * (size_t)n), *dx32 = xalloc(4 * (size_t)n), *rrstd = xalloc(4 * (size_t)rows);
	float *rdw = copy_f32(dw0, cols);
	planrt_k_rms_norm_f32(x32, w32, y32, rrstd, rows, cols, 1e-6);
	planrt_k_rms_norm_grad_f32(x32, w32, rrstd, dy32, dx32, with_w ? rdw : NULL, rows, cols);
	uint16_t *ry = narrowed(y32, n, t), *rdx = narrowed(dx32, n, t);
	report(same(y, ry, 2 * (size_t)n) && same(rstd, rrstd, 4 * (size_t)rows) && same(dx, rdx, 2 * (size_t)n) &&
		       same(dw, rdw, 4 * (size_t)cols),
	       "rms_norm_16 and rms_norm_grad_16 %s %lld x %lld%s: y, rstd, dx, dw as the casts and the f32 kernels",
	       tname(t), (long long)rows, (long long)cols, with_w ? " w" : "");
	void *all[] = {x, w, y, dy, dx, rstd, dw0, dw, x32, w32, dy32, y32, dx32, rrstd, rdw, ry, rdx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* in of dims summed into out, whose strides keep the dims where keep[d] */
static void sum_to(planrt_dtype_t t, int rank, const int64_t *dims, const int *keep, const char *what)
{
	int64_t n = 1, ostr[8], out_elems = 1;
	for (int d = 0; d < rank; d++)
		n *= dims[d];
	for (int d = rank - 1; d >= 0; d--) {
		ostr[d] = keep[d] ? out_elems : 0;
		out_elems *= keep[d] ? dims[d] : 1;
	}
	uint16_t *in = random_16(n, t);
	float *in32 = widened(in, n, t), *out0 = random_f32(out_elems);
	float *acc = copy_f32(out0, out_elems), *racc = copy_f32(out0, out_elems);
	float *ovr = copy_f32(out0, out_elems), *rovr = copy_f32(out0, out_elems);
	planrt_k_sum_to_acc_16(rank, dims, in, ostr, acc, out_elems, t);
	planrt_k_sum_to_acc_f32(rank, dims, in32, ostr, racc, out_elems);
	planrt_k_sum_to_16(rank, dims, in, ostr, ovr, out_elems, t);
	planrt_k_sum_to_f32(rank, dims, in32, ostr, rovr, out_elems);
	report(same(acc, racc, 4 * (size_t)out_elems) && same(ovr, rovr, 4 * (size_t)out_elems),
	       "sum_to_16 and sum_to_acc_16 %s, %s (%lld elements into %lld): as the cast and the f32 kernels", tname(t),
	       what, (long long)n, (long long)out_elems);
	free(in);
	free(in32);
	free(out0);
	free(acc);
	free(racc);
	free(ovr);
	free(rovr);
}

int main(void)
{
	planrt_dtype_t types[] = {planrt_bf16, planrt_f16};
	for (int i = 0; i < 2; i++) {
		planrt_dtype_t t = types[i];
		layer_norm(t, 3, 5, 1, 1);
		layer_norm(t, 700, 1000, 1, 1); /* 262 rows a block: three blocks, the last short */
		layer_norm(t, 97, 129, 1, 0);
		layer_norm(t, 64, 33, 0, 0);
		layer_norm(t, 2, 300001, 1, 1); /* a row longer than a block */
		rms_norm(t, 5, 7, 1);
		rms_norm(t, 600, 1024, 1);
		rms_norm(t, 33, 100, 0);
		rms_norm(t, 3, 270000, 1);
		int64_t bias[] = {1000, 300}, all[] = {600001}, all2[] = {700, 901}, mid[] = {4, 5, 6}, lead1[] = {1, 2000, 300},
			kept_inner[] = {3, 1100, 97};
		int keep_bias[] = {0, 1}, keep_all[] = {0, 0}, keep_mid[] = {0, 1, 0}, keep_lead1[] = {0, 0, 1},
		    keep_inner[] = {1, 0, 1};
		sum_to(t, 2, bias, keep_bias, "a bias gradient [1000, 300] -> [300] (two blocks)");
		sum_to(t, 1, all, keep_all, "all of [600001] (streamed, a tail of 1)");
		sum_to(t, 2, all2, keep_all, "all of [700, 901]");
		sum_to(t, 3, mid, keep_mid, "[4, 5, 6] -> [5]");
		sum_to(t, 3, lead1, keep_lead1, "[1, 2000, 300] -> [300] (blocked by the second dim)");
		sum_to(t, 3, kept_inner, keep_inner, "[3, 1100, 97] -> [3, 97]");
	}
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
