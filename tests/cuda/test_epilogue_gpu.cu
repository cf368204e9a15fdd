/* test_epilogue_gpu.cu: the GEMM epilogue on the GPU (scripts/gpu-check.sh runs it; CI builds it in
 * cuda_one_process and it skips without a GPU). planrt_cu_k_matmul_epilogue_16 (D = op(A) op(B) +
 * R + bias over the rows, 16-bit, rounded once: cuBLASLt) against the CPU: planrt_k_matmul_bf16 /
 * _f16 with an f32 product, plus R and the bias in f32, rounded once. Every element within 1.5
 * units in the last place of the largest |D| (the sums differ in order; the unfused path rounds
 * twice); a wrong layout or transpose is off by the values themselves. The cases: the GPT's
 * bias and residual shapes, transposed operands, a batch that is one tall GEMM, odd sizes, an f32
 * bias, f16, no bias, no residual, pointers off 16-byte alignment. PLANRT_EPILOGUE=0 runs the same
 * cases through the unfused path (the GEMM rounded, then the adds: within the same bound). And the
 * norm gradients with the residual gradient's add (planrt_cu_k_layer_norm_grad_add_16, _rms_): dx
 * + add against the CPU's f32 gradient plus add, within 1.5 units; dw, db within 1e-4 relative. And
 * dropout with the residual add after it (planrt_cu_k_dropout_add_16): the CPU's mask bit for bit, y
 * within 1.5 units of the CPU's f32 add + dropped x.
 * Prints PASS/FAIL lines; exit status 0 when all passed, 77 without a GPU. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_exec.h"
#include "planrt_half.h"
#include "planrt_kernels.h"
#include "device_copy.h"
#include "tally.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct Case {
	int64_t batch, M, N, K;
	int ta, tb, resid, bias; /* bias: 0 none, 1 the product's type, 2 f32 */
	planrt_dtype_t t;
	int shift; /* elements every device pointer is moved past an aligned start */
} Case;

static float widen(uint16_t h, planrt_dtype_t t)
{
	return t == planrt_bf16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

static uint16_t *random16(int64_t n, planrt_dtype_t t, unsigned seed)
{
	uint16_t *x = (uint16_t *)malloc(2 * (size_t)(n ? n : 1));
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		float v = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
		x[i] = t == planrt_bf16 ? planrt_narrow_bf16(v) : planrt_narrow_f16(v);
	}
	return x;
}

static void run_case(const Case *c)
{
	int64_t nA = c->batch * c->M * c->K, nB = c->K * c->N, nD = c->batch * c->M * c->N;
	uint16_t *A = random16(nA, c->t, 1), *B = random16(nB, c->t, 2), *R = random16(nD, c->t, 3);
	uint16_t *b16 = random16(c->N, c->t, 4);
	float *b32 = (float *)malloc(sizeof(float) * (size_t)c->N), *prod = (float *)malloc(sizeof(float) * (size_t)nD);
	for (int64_t j = 0; j < c->N; j++)
		b32[j] = widen(b16[j], c->t) * 0.5f + 0.001f * (float)j;
	int64_t sa = c->M * c->K, sc = c->M * c->N;
	/* the CPU: the f32 product, then the adds, rounded once */
	if (c->t == planrt_bf16)
		planrt_k_matmul_bf16(c->batch, c->M, c->N, c->K, A, c->ta, sa, B, c->tb, 0, prod, planrt_f32, sc, 0);
	else
		planrt_k_matmul_f16(c->batch, c->M, c->N, c->K, A, c->ta, sa, B, c->tb, 0, prod, planrt_f32, sc, 0);
	float *want = (float *)malloc(sizeof(float) * (size_t)nD);
	double big = 0;
	for (int64_t i = 0; i < nD; i++) {
		float x = prod[i];
		if (c->bias)
			x += c->bias == 2 ? b32[i % c->N] : widen(b16[i % c->N], c->t);
		if (c->resid)
			x += widen(R[i], c->t);
		want[i] = x;
		big = fmax(big, fabs(x));
	}
	int sh = c->shift * 2;
	void *dA = to_device_at(A, 2 * (size_t)nA, 2 * (size_t)nA + 256, sh);
	void *dB = to_device_at(B, 2 * (size_t)nB, 2 * (size_t)nB + 256, sh);
	void *dR = to_device_at(R, 2 * (size_t)nD, 2 * (size_t)nD + 256, sh);
	void *dbias = c->bias == 2 ? to_device_at(b32, 4 * (size_t)c->N, 4 * (size_t)c->N + 256, 4 * c->shift)
				   : to_device_at(b16, 2 * (size_t)c->N, 2 * (size_t)c->N + 256, sh);
	char *dD = (char *)to_device_at(R, 2 * (size_t)nD, 2 * (size_t)nD + 256, sh);
	cudaMemset(dD, 0xff, 2 * (size_t)nD + 256);
	planrt_cu_k_matmul_epilogue_16(c->batch, c->M, c->N, c->K, (const uint16_t *)((char *)dA + sh), c->ta, sa,
				       (const uint16_t *)((char *)dB + sh), c->tb, 0, c->t, dD + sh, sc,
				       c->resid ? (char *)dR + sh : NULL,
				       c->bias ? (char *)dbias + (c->bias == 2 ? 4 * c->shift : sh) : NULL,
				       c->bias == 2 ? planrt_f32 : c->t, PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "the call: %s", cudaGetErrorString(e));
	uint16_t *got = (uint16_t *)malloc(2 * (size_t)nD);
	cudaMemcpy(got, dD + sh, 2 * (size_t)nD, cudaMemcpyDeviceToHost);
	/* one unit in the last place of the largest value, in the product's type */
	double ulp = ldexp(1.0, (int)floor(log2(big > 0 ? big : 1)) - (c->t == planrt_bf16 ? 7 : 10)), worst = 0;
	for (int64_t i = 0; i < nD; i++)
		worst = fmax(worst, fabs((double)widen(got[i], c->t) - (double)want[i]) / ulp);
	const char *tn = c->t == planrt_bf16 ? "bf16" : "f16";
	static const char *const biases[] = {"no bias", "bias", "f32 bias"};
	CHECK(worst <= 1.5, "%s batch %lld M %lld N %lld K %lld ta %d tb %d, %s%s, shift %d: %.2f ulp", tn,
	      (long long)c->batch, (long long)c->M, (long long)c->N, (long long)c->K, c->ta, c->tb, biases[c->bias],
	      c->resid ? " + residual" : "", c->shift, worst);
	printf("  %s batch %lld M %lld N %lld K %lld ta %d tb %d, %s%s, shift %d: worst %.2f units in the last place of "
	       "the largest value (at most 1.5)\n",
	       tn, (long long)c->batch, (long long)c->M, (long long)c->N, (long long)c->K, c->ta, c->tb, biases[c->bias],
	       c->resid ? " + residual" : "", c->shift, worst);
	void *host[] = {A, B, R, b16, b32, prod, want, got};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	void *dev[] = {dA, dB, dR, dbias, dD};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		cudaFree(dev[i]);
}

/* a norm gradient with the residual gradient's add (rms: the RMS norm's): dx + add against the CPU's
 * f32 gradient of the widened inputs plus add, rounded once; dw and db (from zero, stored as acc: f32
 * or t) within f32 rounding, and one rounding to t more when stored as t */
static void norm_case(int64_t rows, int64_t cols, int rms, planrt_dtype_t t, planrt_dtype_t acc)
{
	int64_t n = rows * cols;
	uint16_t *x = random16(n, t, 5), *w = random16(cols, t, 6), *dy = random16(n, t, 7), *add = random16(n, t, 8);
	float *xf = (float *)malloc(4 * (size_t)n), *wf = (float *)malloc(4 * (size_t)cols);
	float *dyf = (float *)malloc(4 * (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		xf[i] = widen(x[i], t);
		dyf[i] = widen(dy[i], t);
	}
	for (int64_t j = 0; j < cols; j++)
		wf[j] = widen(w[j], t);
	float *y = (float *)malloc(4 * (size_t)n), *mean = (float *)calloc((size_t)rows, 4);
	float *rstd = (float *)calloc((size_t)rows, 4), *dx = (float *)malloc(4 * (size_t)n);
	float *dw = (float *)calloc((size_t)cols, 4), *db = (float *)calloc((size_t)cols, 4);
	if (rms) {
		planrt_k_rms_norm_f32(xf, wf, y, rstd, rows, cols, 1e-5);
		planrt_k_rms_norm_grad_f32(xf, wf, rstd, dyf, dx, dw, rows, cols);
	} else {
		planrt_k_layer_norm_f32(xf, wf, NULL, y, mean, rstd, rows, cols, 1e-5);
		planrt_k_layer_norm_grad_f32(xf, wf, mean, rstd, dyf, dx, dw, db, rows, cols);
	}
	double big = 0;
	for (int64_t i = 0; i < n; i++) {
		dx[i] += widen(add[i], t);
		big = fmax(big, fabs(dx[i]));
	}
	void *d_x = to_device(x, 2 * (size_t)n), *d_w = to_device(w, 2 * (size_t)cols);
	void *d_dy = to_device(dy, 2 * (size_t)n);
	void *d_add = to_device(add, 2 * (size_t)n), *d_mean = to_device(mean, 4 * (size_t)rows);
	void *d_rstd = to_device(rstd, 4 * (size_t)rows), *d_out = to_device(add, 2 * (size_t)n);
	size_t pb = (acc == planrt_f32 ? 4 : 2) * (size_t)cols; /* dw's and db's bytes */
	float *zeros = (float *)calloc((size_t)cols, 4); /* +0 in f32, bf16 and f16 alike */
	void *d_dw = to_device(zeros, pb), *d_db = to_device(zeros, pb);
	cudaMemset(d_out, 0xff, 2 * (size_t)n);
	if (rms)
		planrt_cu_k_rms_norm_grad_add_16(d_x, d_w, (const float *)d_rstd, d_dy, d_add, d_out, d_dw, rows, cols, acc,
						 t, PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_layer_norm_grad_add_16(d_x, d_w, (const float *)d_mean, (const float *)d_rstd, d_dy, d_add, d_out,
						   d_dw, d_db, rows, cols, acc, t, PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "the norm call: %s", cudaGetErrorString(e));
	uint16_t *got = (uint16_t *)malloc(2 * (size_t)n);
	float *gdw = (float *)malloc(4 * (size_t)cols), *gdb = (float *)malloc(4 * (size_t)cols);
	void *gdw_as = malloc(pb), *gdb_as = malloc(pb);
	cudaMemcpy(got, d_out, 2 * (size_t)n, cudaMemcpyDeviceToHost);
	cudaMemcpy(gdw_as, d_dw, pb, cudaMemcpyDeviceToHost);
	cudaMemcpy(gdb_as, d_db, pb, cudaMemcpyDeviceToHost);
	planrt_cast(gdw_as, acc, gdw, planrt_f32, cols);
	planrt_cast(gdb_as, acc, gdb, planrt_f32, cols);
	double ptol = acc == planrt_f32 ? 1e-4 : t == planrt_bf16 ? 1e-2 : 2e-3; /* dw / db relative */
	double ulp = ldexp(1.0, (int)floor(log2(big > 0 ? big : 1)) - (t == planrt_bf16 ? 7 : 10)), worst = 0, wp = 0;
	for (int64_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)widen(got[i], t) - (double)dx[i]) / ulp);
	for (int64_t j = 0; j < cols; j++)
		wp = fmax(wp, fmax(fabs(gdw[j] - dw[j]), rms ? 0 : fabs(gdb[j] - db[j])) / (1 + fabs(dw[j]) + fabs(db[j])));
	CHECK(worst <= 1.5 && wp <= ptol, "%s %s gradient + add, %lld x %lld, dw / db %s: dx %.2f ulp, dw / db %.1e",
	      rms ? "rms" : "layer", t == planrt_bf16 ? "bf16" : "f16", (long long)rows, (long long)cols,
	      acc == planrt_f32 ? "f32" : "16-bit", worst, wp);
	printf("  %s norm gradient + add, %s, %lld x %lld: dx + add within %.2f units in the last place of the largest (at "
	       "most 1.5), dw / db (%s) %.1e relative (at most %.0e)\n",
	       rms ? "rms" : "layer", t == planrt_bf16 ? "bf16" : "f16", (long long)rows, (long long)cols, worst,
	       acc == planrt_f32 ? "f32" : "16-bit", wp, ptol);
	void *host[] = {x, w, dy, add, xf, wf, dyf, y, mean, rstd, dx, dw, db, zeros, got, gdw, gdb, gdw_as, gdb_as};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	void *dev[] = {d_x, d_w, d_dy, d_add, d_mean, d_rstd, d_out, d_dw, d_db};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		cudaFree(dev[i]);
}

/* dropout with the residual add after it: y = add + (keep ? x / (1 - p) : 0), rounded once, against
 * the CPU's mask (bit for bit: the same Philox stream) and its f32 arithmetic */
static void dropout_case(int64_t rows, int64_t cols, double p, planrt_dtype_t t)
{
	int64_t n = rows * cols, dims[2] = {rows, cols}, offs[4] = {0, 0, rows / 2, cols / 2};
	uint16_t *x = random16(n, t, 9), *add = random16(n, t, 10), *y16 = (uint16_t *)malloc(2 * (size_t)n);
	uint8_t *mask = (uint8_t *)malloc((size_t)n), *gmask = (uint8_t *)malloc((size_t)n);
	planrt_k_dropout_16(x, y16, mask, p, 1234, 77, 2, dims, dims, offs, t);
	float sc = (float)(1.0 / (1.0 - p)), *want = (float *)malloc(4 * (size_t)n);
	double big = 0;
	for (int64_t i = 0; i < n; i++) {
		want[i] = widen(add[i], t) + (mask[i] ? widen(x[i], t) * sc : 0.0f);
		big = fmax(big, fabs(want[i]));
	}
	void *d_x = to_device(x, 2 * (size_t)n), *d_add = to_device(add, 2 * (size_t)n);
	void *d_y = to_device(add, 2 * (size_t)n);
	void *d_mask = to_device(mask, (size_t)n);
	cudaMemset(d_y, 0xff, 2 * (size_t)n);
	cudaMemset(d_mask, 0xff, (size_t)n);
	planrt_cu_k_dropout_add_16(d_x, d_add, d_y, (uint8_t *)d_mask, p, 1234, 77, 2, dims, dims, offs, t,
				   PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "the dropout call: %s", cudaGetErrorString(e));
	uint16_t *got = (uint16_t *)malloc(2 * (size_t)n);
	cudaMemcpy(got, d_y, 2 * (size_t)n, cudaMemcpyDeviceToHost);
	cudaMemcpy(gmask, d_mask, (size_t)n, cudaMemcpyDeviceToHost);
	double ulp = ldexp(1.0, (int)floor(log2(big > 0 ? big : 1)) - (t == planrt_bf16 ? 7 : 10)), worst = 0;
	for (int64_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)widen(got[i], t) - (double)want[i]) / ulp);
	int masks_equal = !memcmp(mask, gmask, (size_t)n);
	CHECK(worst <= 1.5 && masks_equal, "dropout %g + add, %lld x %lld: %.2f ulp, masks %s", p, (long long)rows,
	      (long long)cols, worst, masks_equal ? "equal" : "DIFFER");
	printf("  dropout %g + add, %s, %lld x %lld (a balanced block's halves): the CPU's mask bit for bit: %s; y within "
	       "%.2f units in the last place of the largest (at most 1.5)\n",
	       p, t == planrt_bf16 ? "bf16" : "f16", (long long)rows, (long long)cols, masks_equal ? "yes" : "NO", worst);
	void *host[] = {x, add, y16, mask, gmask, want, got};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	void *dev[] = {d_x, d_add, d_y, d_mask};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		cudaFree(dev[i]);
}

int main(void)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		printf("skip: no CUDA GPU here (this test runs on the GPU machine: scripts/gpu-check.sh)\n");
		return 77;
	}
	const char *mode = getenv("PLANRT_EPILOGUE");
	printf("planrt_cu_k_matmul_epilogue_16 (%s) against the CPU's f32 product and adds:\n",
	       mode && !strcmp(mode, "0") ? "the GEMM, then the adds" : "cuBLASLt's epilogue");
	static const Case cases[] = {
		{1, 512, 256, 128, 0, 0, 0, 1, planrt_bf16, 0}, /* q, k, v: the bias */
		{1, 512, 256, 384, 0, 0, 1, 1, planrt_bf16, 0}, /* the output projections: bias and residual */
		{1, 512, 256, 128, 0, 0, 1, 0, planrt_bf16, 0}, /* a residual alone (no bias: Llama) */
		{4, 128, 256, 128, 0, 0, 1, 1, planrt_bf16, 0}, /* a batch laid end to end: one tall GEMM */
		{1, 300, 100, 72, 0, 0, 1, 2, planrt_bf16, 0},	/* odd sizes, an f32 bias */
		{1, 256, 128, 64, 1, 1, 0, 1, planrt_bf16, 0},	/* both operands transposed */
		{1, 256, 192, 96, 0, 1, 1, 1, planrt_f16, 0},	/* f16, B transposed */
		{1, 256, 128, 64, 0, 0, 1, 1, planrt_bf16, 1},	/* pointers 2 bytes past alignment */
		{3, 64, 96, 32, 1, 0, 1, 1, planrt_bf16, 0},	/* A transposed in a batch: separate GEMMs */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		run_case(&cases[i]);
	norm_case(300, 1024, 0, planrt_bf16, planrt_f32);
	norm_case(77, 300, 0, planrt_f16, planrt_f32);
	norm_case(300, 1024, 1, planrt_bf16, planrt_f32);
	norm_case(300, 1024, 0, planrt_bf16, planrt_bf16); /* dw / db as the plan stores them */
	norm_case(77, 300, 0, planrt_f16, planrt_f16);
	norm_case(300, 1024, 1, planrt_bf16, planrt_bf16);
	dropout_case(64, 256, 0.1, planrt_bf16);
	dropout_case(30, 98, 0.5, planrt_f16);
	return tally_report("the GEMM, norm-gradient and dropout epilogues on the GPU");
}
