/* gemm_epilogue_cuda.cu: a 16-bit GEMM with its consumer's bias and residual adds folded in
 * (planrt_cu_k_matmul_epilogue_16), which the CUDA printer calls where a bf16 or f16 matmul's only
 * reader is a fused loop that adds a bias over the rows and/or a residual to it
 * (compiler/target/cuda/epilogues.c): the linear layers' bias adds and the blocks' residual adds of
 * a GPT, forward. Without it the GEMM writes its product in bf16 and the loop reads it back, adds
 * and writes again: for gpt350m 5.4 GB a step (docs/gpu.md, "GEMM epilogues").
 *
 * D [rows, N] = op(A) op(B) + R + bias (bias broadcast over the rows, R and D of the GEMM's 16-bit
 * type, bias that type or f32), through cuBLASLt: one kernel whose epilogue adds R (as beta C, beta
 * = 1) and the bias (CUBLASLT_EPILOGUE_BIAS) to the f32 accumulator and rounds once. The unfused
 * program rounded the product to 16 bits first and then the sum; the results differ by that
 * rounding (within the bf16 tolerance the GPU is held to against the CPU).
 *
 * Where cuBLASLt has no algorithm for the shape, for a batch that is not one GEMM, or under
 * PLANRT_EPILOGUE=0 (which also unfuses the norm-gradient and dropout adds, kernels_cuda.cu), the
 * call is the unfused arithmetic: the 16-bit GEMM into D, then one kernel
 * D = round(round(product) + bias + R) in the loop's order ((product + bias) + R), which is what the
 * printed loop computed, bit for bit. tests/cuda/test_epilogue_gpu.cu holds the fused call to that
 * on the GPU.
 *
 * cuBLASLt's workspace: 32 MiB a stream, allocated at the first fused call on that stream (as
 * cuBLAS's own default workspace on Hopper), outside the arena explain plans. Each distinct call
 * (shape, transposes, types, epilogue) is planned once (descriptors and the heuristic's algorithm)
 * and reused. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_half.h"

#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EPI_WORKSPACE = 32 << 20, EPI_PLANS = 64, EPI_STREAMS = 64 };

static void lt_check(cublasStatus_t s, const char *what)
{
	if (s != CUBLAS_STATUS_SUCCESS)
		planrt_fatal("cuBLASLt %s failed: %s", what, cublasGetStatusString(s));
}

/* ------------------------------------------------------------------ the unfused arithmetic */

__device__ static float epi_ld(const void *p, int64_t i, int t)
{
	if (t == planrt_f32)
		return ((const float *)p)[i];
	uint16_t h = ((const uint16_t *)p)[i];
	return t == planrt_bf16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

/* d[i] = round((d[i] + bias[i mod n]) + r[i]): the printed loop's arithmetic on the GEMM's rounded
 * product */
__global__ static void epilogue_add_kernel(uint16_t *d, const void *r, const void *bias, int bias_type, int t,
					   int64_t n, int64_t total)
{
	GRID_STRIDE(i, total)
	{
		float x = t == planrt_bf16 ? planrt_widen_bf16(d[i]) : planrt_widen_f16(d[i]);
		if (bias)
			x = x + epi_ld(bias, i % n, bias_type);
		if (r)
			x = x + epi_ld(r, i, t);
		d[i] = t == planrt_bf16 ? planrt_narrow_bf16(x) : planrt_narrow_f16(x);
	}
}

static void unfused(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a, int64_t stride_a,
		    const uint16_t *B, int trans_b, int64_t stride_b, planrt_dtype_t t, void *D, int64_t stride_c,
		    const void *R, const void *bias, planrt_dtype_t bias_type, int stream)
{
	if (t == planrt_bf16)
		planrt_cu_k_matmul_bf16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, D, t, stride_c, 0, stream);
	else
		planrt_cu_k_matmul_f16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, D, t, stride_c, 0, stream);
	int64_t total = (batch > 1 ? batch : 1) * M * N;
	LAUNCH(epilogue_add_kernel, total, stream, (uint16_t *)D, R, bias, (int)bias_type, (int)t, N, total);
}

/* ------------------------------------------------------------------ cuBLASLt */

/* one planned call: what it is for, and its descriptors and algorithm (ok = 0: cuBLASLt has none) */
typedef struct EpiPlan {
	int64_t rows, N, K;
	int ta, tb, has_r, has_bias;
	unsigned align; /* the least alignment of the call's pointers, at most 256 bytes */
	planrt_dtype_t t, bias_type;
	int ok;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c;
	cublasLtMatmulAlgo_t algo;
} EpiPlan;

static cublasLtHandle_t lt;
static EpiPlan plans[EPI_PLANS];
static int nplans;
static void *workspace[EPI_STREAMS];

static cudaDataType cuda_type(planrt_dtype_t t)
{
	return t == planrt_bf16 ? CUDA_R_16BF : t == planrt_f16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Row-major D [rows, N] = op(A) [rows, K] op(B) [K, N] is column-major D^T = op(B)^T op(A)^T: cuBLAS's
 * "A" is our B (N x K as it is read, or K x N transposed), its "B" our A, D is N x rows. */
static void plan_call(EpiPlan *p)
{
	cudaDataType t16 = cuda_type(p->t);
	cublasOperation_t oa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
	lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa), "TRANSA");
	lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob), "TRANSB");
	cublasLtEpilogue_t epi = p->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "EPILOGUE");
	if (p->has_bias) {
		cudaDataType bt = cuda_type(p->bias_type);
		lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
			 "BIAS_DATA_TYPE");
	}
	/* cuBLAS's A: our B, N x K (not transposed: leading dimension N) or K x N (transposed: K) */
	lt_check(cublasLtMatrixLayoutCreate(&p->a, t16, p->tb ? p->K : p->N, p->tb ? p->N : p->K, p->tb ? p->K : p->N),
		 "layout A");
	/* cuBLAS's B: our A, K x rows (leading dimension K) or rows x K (transposed: rows) */
	lt_check(cublasLtMatrixLayoutCreate(&p->b, t16, p->ta ? p->rows : p->K, p->ta ? p->K : p->rows,
					    p->ta ? p->rows : p->K),
		 "layout B");
	lt_check(cublasLtMatrixLayoutCreate(&p->c, t16, p->N, p->rows, p->N), "layout C");
	cublasLtMatmulPreference_t pref;
	size_t ws = EPI_WORKSPACE;
	lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
	lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
		 "MAX_WORKSPACE_BYTES");
	/* algorithms that need no more alignment than the pointers have (cuBLASLt assumes 256 bytes) */
	static const cublasLtMatmulPreferenceAttributes_t aligns[] = {
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
	for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
		lt_check(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &p->align, sizeof p->align), "MIN_ALIGNMENT");
	cublasLtMatmulHeuristicResult_t best;
	int found = 0;
	cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &best, &found);
	cublasLtMatmulPreferenceDestroy(pref);
	p->ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
	if (p->ok)
		p->algo = best.algo;
}

/* the plan of a call (NULL: the plans are full; the call then runs unfused) */
static EpiPlan *plan_of(int64_t rows, int64_t N, int64_t K, int ta, int tb, int has_r, int has_bias, unsigned align,
			planrt_dtype_t t, planrt_dtype_t bias_type)
{
	for (int i = 0; i < nplans; i++) {
		EpiPlan *p = &plans[i];
		if (p->rows == rows && p->N == N && p->K == K && p->ta == ta && p->tb == tb && p->has_r == has_r &&
		    p->has_bias == has_bias && p->align == align && p->t == t && (!has_bias || p->bias_type == bias_type))
			return p;
	}
	if (nplans == EPI_PLANS)
		return NULL;
	if (!lt)
		lt_check(cublasLtCreate(&lt), "cublasLtCreate");
	EpiPlan *p = &plans[nplans++];
	*p = (EpiPlan){rows, N, K, ta, tb, has_r, has_bias, align, t, bias_type, 0, NULL, NULL, NULL, NULL, {}};
	plan_call(p);
	return p;
}

/* the largest power of two, at most 256, that divides every pointer given */
static unsigned alignment(const void *a, const void *b, const void *c, const void *d, const void *e)
{
	uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e | 256;
	return (unsigned)(bits & (~bits + 1));
}

void planrt_cu_k_matmul_epilogue_16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
				    int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, planrt_dtype_t t,
				    void *D, int64_t stride_c, const void *R, const void *bias, planrt_dtype_t bias_type,
				    int stream)
{
	if (t != planrt_bf16 && t != planrt_f16)
		planrt_fatal("planrt_cu_k_matmul_epilogue_16: dtype %d is not bf16 or f16", (int)t);
	if (bias && bias_type != t && bias_type != planrt_f32)
		planrt_fatal("planrt_cu_k_matmul_epilogue_16: a bias of dtype %d on a %s product", (int)bias_type,
			     t == planrt_bf16 ? "bf16" : "f16");
	if (batch <= 0 || M <= 0 || N <= 0)
		return;
	int64_t rows = M;
	/* one tall GEMM: a shared B under A blocks laid end to end (a linear layer), as the GEMM kernel */
	int one = batch == 1 || (stride_b == 0 && !trans_a && stride_a == M * K && stride_c == M * N);
	if (one)
		rows *= batch;
	EpiPlan *p = NULL;
	/* cuBLASLt's alignment preferences name A, B, C and D, not the bias: a bias off 16 bytes (a view
	 * into a flat buffer) runs unfused rather than on an algorithm that may load it in vectors */
	if (planrt_cu_epilogue_fused_() && one && rows <= 2147483647 && N <= 2147483647 && K <= 2147483647 && K > 0 &&
	    stream >= 0 && stream < EPI_STREAMS && ((uintptr_t)bias & 15) == 0)
		p = plan_of(rows, N, K, trans_a != 0, trans_b != 0, R != NULL, bias != NULL, alignment(A, B, R, D, bias), t,
			    bias_type);
	if (!p || !p->ok) {
		/* said once on rank 0 (the step is then slower than the count of bench/gpu/count_step.py says) */
		static int told;
		if (planrt_cu_epilogue_fused_() && !told++ && planrt_world_rank_() <= 0)
			fprintf(stderr, "planrt: rank 0: a GEMM epilogue runs unfused (%lld x %lld x %lld, %s): %s\n",
				(long long)rows, (long long)N, (long long)K, t == planrt_bf16 ? "bf16" : "f16",
				!one ? "a batch that is not one GEMM"
				: ((uintptr_t)bias & 15) ? "a bias off 16 bytes"
				: !p && nplans == EPI_PLANS ? "the plan cache is full"
				: !p ? "a size beyond 32-bit dims, K = 0 or a stream it does not plan for"
				     : "cuBLASLt has no algorithm for it");
		unfused(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, t, D, stride_c, R, bias, bias_type, stream);
		return;
	}
	if (!workspace[stream])
		planrt_cu_check_(cudaMalloc(&workspace[stream], EPI_WORKSPACE), "cudaMalloc (cuBLASLt workspace)");
	if (bias)
		lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
			 "BIAS_POINTER");
	float alpha = 1.0f, beta = R ? 1.0f : 0.0f;
	lt_check(cublasLtMatmul(lt, p->desc, &alpha, B, p->a, A, p->b, &beta, R ? R : D, p->c, D, p->c, &p->algo,
				workspace[stream], EPI_WORKSPACE, planrt_cu_stream(stream)),
		 "cublasLtMatmul");
}

void planrt_cu_epilogue_destroy_(void)
{
	for (int i = 0; i < nplans; i++) {
		cublasLtMatrixLayoutDestroy(plans[i].a);
		cublasLtMatrixLayoutDestroy(plans[i].b);
		cublasLtMatrixLayoutDestroy(plans[i].c);
		cublasLtMatmulDescDestroy(plans[i].desc);
	}
	nplans = 0;
	for (int s = 0; s < EPI_STREAMS; s++) {
		if (workspace[s])
			cudaFree(workspace[s]);
		workspace[s] = NULL;
	}
	if (lt)
		cublasLtDestroy(lt);
	lt = NULL;
}
