/* kernels_cuda.cu: planrt_cuda's compute kernels (planrt_cuda.h): the CPU kernels' operations
 * (kernels_impl.h, exec.c, step.c, optim.c) on device memory, each enqueued on the stream it is
 * given.
 *
 * Semantics follow the CPU's, operation for operation where it matters for the result: Philox
 * dropout masks are bit for bit the CPU's (the same counter and key mapping, kernels.c), exp is
 * planrt_math.h's kexpf on both, the optimizer's scalars (learning rate, bias corrections) are
 * computed on the host exactly as optim.c computes them and its element update is optim.c's, the
 * bf16 roundings are step.c's. What differs is the order of summation in reductions (a row's sum
 * over a block's threads, a column's over row chunks, embedding gradients added atomically), so
 * results agree with the CPU's to float rounding, not bit for bit.
 *
 * Row-wise kernels (softmax, the norms, cross-entropy) give each row to a block of threads;
 * parameter gradients of the norms are column sums over the rows (a thread per column walks a
 * chunk of rows; chunks are added atomically). GEMMs are cuBLAS: f32 math with TF32 off (the CPU's
 * precision; PLANRT_TF32=1 allows TF32), or, for planrt_cu_k_matmul_bf16, bf16 operands read as
 * they are on the tensor cores with f32 accumulation and C in f32 or bf16. Casts are one kernel per
 * dtype pair (bf16 or f16 to and from f32 in f32 arithmetic, 16 bytes of halves per thread). */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_index_math.h"
#include "planrt_kernels.h"
#include "planrt_math.h"

#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KMAX = 8, ROW_THREADS = 256, COL_ROWS = 256 };

typedef struct Dims {
	int64_t v[KMAX];
} Dims;

static Dims dims_of(int rank, const int64_t *d)
{
	Dims x;
	for (int i = 0; i < KMAX; i++)
		x.v[i] = i < rank ? d[i] : 1;
	return x;
}

static void check_rank(const char *what, int rank)
{
	if (rank < 0 || rank > KMAX)
		planrt_fatal("internal error: %s of rank %d (at most %d)", what, rank, KMAX);
}

/* A column sum over rows in chunks of COL_ROWS rows a block row of the grid (chunks added
 * atomically when there are several), and fewer, larger chunks where the grid's y limit needs it:
 * *chunk rows a chunk, the number of chunks returned. */
static int64_t col_chunks(int64_t rows, int64_t *chunk)
{
	*chunk = rows < COL_ROWS ? (rows > 0 ? rows : 1) : COL_ROWS;
	int64_t splits = (rows + *chunk - 1) / *chunk;
	if (splits > 65535) {
		*chunk = (rows + 65534) / 65535;
		splits = (rows + *chunk - 1) / *chunk;
	}
	return splits;
}

/* ------------------------------------------------------------------ block reductions */

__device__ static float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ static float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1) {
		float w = __shfl_xor_sync(0xffffffffu, v, o);
		v = w > v ? w : v;
	}
	return v;
}

/* the block's sum (max) of v, on every thread; blockDim.x a multiple of 32, at most 1024 */
__device__ static float block_sum(float v)
{
	__shared__ float part[32];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	float s = 0;
	for (int w = 0; w < (int)(blockDim.x >> 5); w++)
		s += part[w];
	return s;
}

__device__ static float block_max(float v)
{
	__shared__ float part[32];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	float m = part[0];
	for (int w = 1; w < (int)(blockDim.x >> 5); w++)
		m = part[w] > m ? part[w] : m;
	return m;
}

__device__ static double block_sum_d(double v)
{
	__shared__ double part[32];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	double s = 0;
	for (int w = 0; w < (int)(blockDim.x >> 5); w++)
		s += part[w];
	return s;
}

static unsigned row_grid(int64_t rows)
{
	return (unsigned)(rows < 1 ? 1 : rows > 2147483647 ? 2147483647 : rows);
}

/* ------------------------------------------------------------------ dtypes */

__device__ static float bf16_f32(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

__device__ static uint16_t f32_bf16(float x)
{
	uint32_t u = __float_as_uint(x);
	return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ static float f16_f32(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

__device__ static uint16_t f32_f16(float x)
{
	return __half_as_ushort(__float2half_rn(x));
}

__device__ static float half_f32(uint16_t h, int t)
{
	return t == planrt_bf16 ? bf16_f32(h) : f16_f32(h);
}

__device__ static uint16_t f32_half(float x, int t)
{
	return t == planrt_bf16 ? f32_bf16(x) : f32_f16(x);
}

/* An element of a buffer stored as H (planrt_f32, planrt_bf16 or planrt_f16) read as f32, and an
 * f32 value stored as H (rounded to nearest even): the kernels below that take H are the f32
 * kernels' arithmetic on 16-bit storage (the IR's _16 variants), with no f32 copies. */
template <int H> __device__ __forceinline__ float ld(const void *p, int64_t i)
{
	return H == planrt_f32 ? ((const float *)p)[i] : half_f32(((const uint16_t *)p)[i], H);
}

template <int H> __device__ __forceinline__ void st(void *p, int64_t i, float v)
{
	if (H == planrt_f32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = f32_half(v, H);
}

/* Whether the epilogue calls (gemm_epilogue_cuda.cu's GEMM; the norm-gradient and dropout adds
 * below) fold their adds in: yes, unless PLANRT_EPILOGUE=0; any other value is refused at the first
 * call. Here, below the GEMM epilogue's file, so that the two files' calls go one way. */
int planrt_cu_epilogue_fused_(void)
{
	static int wanted = -1;
	if (wanted < 0) {
		const char *e = getenv("PLANRT_EPILOGUE");
		if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
			planrt_fatal("PLANRT_EPILOGUE=%s: expected 1 (cuBLASLt's epilogues, the default) or 0 (the GEMM, then an "
				     "add kernel)",
				     e);
		wanted = !(e && !strcmp(e, "0"));
	}
	return wanted;
}

/* y = round(add + y) over n 16-bit elements: the printed loop's residual add, for the epilogue calls
 * under PLANRT_EPILOGUE=0 */
template <int H>
__global__ static void add_into_kernel(void *y, const void *add, int64_t n)
{
	GRID_STRIDE(i, n)
	st<H>(y, i, ld<H>(add, i) + ld<H>(y, i));
}

/* The _16 variants' entry points: `call` with H the storage type's constant (bf16 or f16). */
#define BY_STORAGE(what, storage, call)                                                                               \
	do {                                                                                                          \
		if ((storage) == planrt_bf16) {                                                                        \
			const int H = planrt_bf16;                                                                     \
			call;                                                                                          \
		} else if ((storage) == planrt_f16) {                                                                  \
			const int H = planrt_f16;                                                                      \
			call;                                                                                          \
		} else {                                                                                               \
			planrt_fatal("%s: storage type %d is not bf16 or f16", what, (int)(storage));                  \
		}                                                                                                      \
	} while (0)

/* x rounded to f32 with round-to-odd (step.c's f32_round_odd): then one rounding to a half type */
__device__ static float f32_round_odd(double x)
{
	float f = __double2float_rz(x);
	if (isinf(f) || isnan(f) || (double)f == x)
		return (float)x;
	return __uint_as_float(__float_as_uint(f) | 1u);
}

/* ------------------------------------------------------------------ GEMMs (cuBLAS) */

static cublasHandle_t blas;

void planrt_cu_blas_destroy_(void)
{
	if (blas)
		cublasDestroy(blas);
	blas = NULL;
}

static void blas_check(cublasStatus_t s, const char *what)
{
	if (s != CUBLAS_STATUS_SUCCESS)
		planrt_fatal("cuBLAS %s failed: %s", what, cublasGetStatusString(s));
}

static cublasHandle_t blas_on(int stream)
{
	if (!blas)
		blas_check(cublasCreate(&blas), "cublasCreate");
	blas_check(cublasSetStream(blas, planrt_cu_stream(stream)), "cublasSetStream");
	return blas;
}

/* The element types of a GEMM: its operands', C's, and the products' and sums' (cuBLAS's compute
 * type). f32 with TF32 off is the CPU's precision (PLANRT_TF32=1 allows TF32); bf16 operands go
 * to the tensor cores with f32 accumulation. */
typedef struct {
	cudaDataType ab, c;
	size_t ab_size, c_size;
	cublasComputeType_t compute;
} GemmTypes;

/* row-major C[M, N] (+)= op(A) op(B), batch entries at the given element strides, as column-major
 * C^T */
static void gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const void *A, int ta, int64_t sa, const void *B,
		 int tb, int64_t sb, void *C, int64_t sc, int accumulate, GemmTypes t, int stream)
{
	if (batch <= 0 || M <= 0 || N <= 0)
		return;
	if (M > 2147483647 || N > 2147483647 || K > 2147483647)
		planrt_fatal("a matmul of %lld x %lld x %lld is beyond cuBLAS's 32-bit dimensions", (long long)M, (long long)N,
			     (long long)K);
	cublasHandle_t h = blas_on(stream);
	float one = 1.0f, zero = 0.0f;
	/* one tall GEMM: a shared B under A blocks laid end to end (a linear layer) */
	if (batch > 1 && sb == 0 && !ta && sa == M * K && sc == M * N) {
		M *= batch;
		batch = 1;
	}
	/* one GEMM over the stacked K: C = sum of A_i^T B_i (a weight gradient) */
	if (batch > 1 && sc == 0 && ta && !tb && sa == K * M && sb == K * N) {
		K *= batch;
		batch = 1;
	}
	int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
	cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	if (batch == 1 || sc != 0) {
		blas_check(cublasGemmStridedBatchedEx(h, ob, oa, (int)N, (int)M, (int)K, &one, B, t.ab, ldb > 0 ? ldb : 1, sb, A,
						      t.ab, lda > 0 ? lda : 1, sa, accumulate ? &one : &zero, C, t.c, (int)N,
						      sc, (int)batch, t.compute, CUBLAS_GEMM_DEFAULT),
			   "gemm");
		return;
	}
	/* several products into one C: in order, each added to the last */
	for (int64_t b = 0; b < batch; b++)
		blas_check(cublasGemmEx(h, ob, oa, (int)N, (int)M, (int)K, &one, (const char *)B + (size_t)(b * sb) * t.ab_size,
					t.ab, ldb > 0 ? ldb : 1, (const char *)A + (size_t)(b * sa) * t.ab_size, t.ab,
					lda > 0 ? lda : 1, accumulate || b ? &one : &zero, C, t.c, (int)N, t.compute,
					CUBLAS_GEMM_DEFAULT),
			   "gemm");
}

static GemmTypes f32_gemm(void)
{
	static const char *tf32 = NULL;
	if (!tf32)
		tf32 = getenv("PLANRT_TF32") ? getenv("PLANRT_TF32") : "0";
	return (GemmTypes){CUDA_R_32F, CUDA_R_32F, 4, 4, !strcmp(tf32, "1") ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
}

void planrt_cu_k_matmul_f32(int64_t batch, int64_t M, int64_t N, int64_t K, const float *A, int trans_a, int64_t stride_a,
			    const float *B, int trans_b, int64_t stride_b, float *C, int64_t stride_c, int accumulate,
			    int stream)
{
	gemm(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, C, stride_c, accumulate, f32_gemm(), stream);
}

/* 16-bit operands of type ab (bf16 or f16) read as they are (no widened copies), f32 accumulation on
 * the tensor cores, C in f32 or ab (rounded once by cuBLAS's epilogue) */
static void matmul_16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a, int64_t stride_a,
		      const uint16_t *B, int trans_b, int64_t stride_b, planrt_dtype_t ab, void *C, planrt_dtype_t c_type,
		      int64_t stride_c, int accumulate, int stream)
{
	if (c_type != planrt_f32 && c_type != ab)
		planrt_fatal("planrt_cu_k_matmul_%s: C must be f32 or %s, not dtype %d", ab == planrt_bf16 ? "bf16" : "f16",
			     ab == planrt_bf16 ? "bf16" : "f16", (int)c_type);
	cudaDataType t16 = ab == planrt_bf16 ? CUDA_R_16BF : CUDA_R_16F;
	GemmTypes t = {t16, c_type == planrt_f32 ? CUDA_R_32F : t16, 2, c_type == planrt_f32 ? 4u : 2u, CUBLAS_COMPUTE_32F};
	gemm(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, C, stride_c, accumulate, t, stream);
}

void planrt_cu_k_matmul_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			     int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			     int64_t stride_c, int accumulate, int stream)
{
	matmul_16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, planrt_bf16, C, c_type, stride_c, accumulate,
		  stream);
}

/* precision fp16's */
void planrt_cu_k_matmul_f16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			    int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			    int64_t stride_c, int accumulate, int stream)
{
	matmul_16(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, planrt_f16, C, c_type, stride_c, accumulate,
		  stream);
}

/* ------------------------------------------------------------------ permute, sum_to */

/* one element type for every permute: f32, and 2-byte bf16 / f16 moved as stored (permute_16) */
template <typename E>
__global__ static void permute_kernel(int rank, Dims odims, Dims pst, const E *in, E *out, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		int64_t rest = i, off = 0;
		for (int d = rank - 1; d >= 0; d--) {
			int64_t c = rest % odims.v[d];
			rest /= odims.v[d];
			off += c * pst.v[d];
		}
		out[i] = in[off];
	}
}

static void strides_of(int rank, const int64_t *dims, int64_t *st)
{
	int64_t s = 1;
	for (int d = rank - 1; d >= 0; d--) {
		st[d] = s;
		s *= dims[d];
	}
}

/* Whether permute and sum_to take the planned 32-bit index arithmetic (planrt_index_math.h): yes,
 * unless PLANRT_INDEX=64 (the 64-bit division of every index, as before; bench/gpu/permute_rate.cu
 * times both); any other value is refused at the first call. */
static int index_planned(void)
{
	static int planned = -1;
	if (planned < 0) {
		const char *e = getenv("PLANRT_INDEX");
		if (e && *e && strcmp(e, "64") && strcmp(e, "32"))
			planrt_fatal("PLANRT_INDEX=%s: expected 32 (planned 32-bit index arithmetic, the default) or 64", e);
		planned = !(e && !strcmp(e, "64"));
	}
	return planned;
}

/* the planned permute (planrt_index_math.h): out[i] = in[src(i)] over units U of the plan's width,
 * an element or 16 bytes of them, with 32-bit offsets and no division instruction */
template <typename U>
__global__ static void permute_units_kernel(planrt_permute_plan_t p, const U *in, U *out)
{
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
		out[i] = in[planrt_permute_src(&p, i)];
}

template <typename E>
static void permute(int rank, const int64_t *in_dims, const int *perm, const E *in, E *out, int stream)
{
	check_rank("permute", rank);
	planrt_permute_plan_t plan;
	int aligned = (uintptr_t)in % 16 == 0 && (uintptr_t)out % 16 == 0;
	if (index_planned() && planrt_permute_plan(rank, in_dims, perm, (int)sizeof(E), aligned, &plan)) {
		if (plan.n == 0)
			return;
		cudaStream_t s = planrt_cu_stream(stream);
		if (plan.vec > 1)
			permute_units_kernel<uint4><<<planrt_cu_grid(plan.n), PLANRT_CU_BLOCK, 0, s>>>(
				plan, (const uint4 *)(const void *)in, (uint4 *)(void *)out);
		else
			permute_units_kernel<E><<<planrt_cu_grid(plan.n), PLANRT_CU_BLOCK, 0, s>>>(plan, in, out);
		planrt_cu_check_launch("permute");
		return;
	}
	/* 2^31 elements or more (or PLANRT_INDEX=64): 64-bit offsets */
	int64_t ist[KMAX], od[KMAX], ps[KMAX], n = 1;
	strides_of(rank, in_dims, ist);
	for (int d = 0; d < rank; d++) {
		od[d] = in_dims[perm[d]];
		ps[d] = ist[perm[d]];
		n *= od[d];
	}
	LAUNCH(permute_kernel<E>, n, stream, rank, dims_of(rank, od), dims_of(rank, ps), in, out, n);
}

void planrt_cu_k_permute_f32(int rank, const int64_t *in_dims, const int *perm, const float *in, float *out, int stream)
{
	permute(rank, in_dims, perm, in, out, stream);
}

void planrt_cu_k_permute_16(int rank, const int64_t *in_dims, const int *perm, const void *in, void *out, int stream)
{
	permute(rank, in_dims, perm, (const uint16_t *)in, (uint16_t *)out, stream);
}

/* out[o] += the sum over the reduced dims of in, for the output elements; the reduced index range
 * [r0, r1) of this block's chunk. kept: the dims with out_strides != 0, in order. out stored as A:
 * f32 (the chunks added atomically when there are several), or 16-bit (one chunk: widened, added to
 * and rounded once) */
template <int H, int A>
__global__ static void sum_to_kernel(int nkept, Dims kdims, Dims kin, Dims kout, int nred, Dims rdims, Dims rin,
				     int64_t out_n, int64_t red_n, int64_t chunk, const void *in, void *out, int atomic)
{
	int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < red_n ? r0 + chunk : red_n;
	for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < out_n; o += (int64_t)gridDim.x * blockDim.x) {
		int64_t rest = o, base = 0, ooff = 0;
		for (int d = nkept - 1; d >= 0; d--) {
			int64_t c = rest % kdims.v[d];
			rest /= kdims.v[d];
			base += c * kin.v[d];
			ooff += c * kout.v[d];
		}
		float s = 0;
		for (int64_t r = r0; r < r1; r++) {
			int64_t rr = r, off = base;
			for (int d = nred - 1; d >= 0; d--) {
				int64_t c = rr % rdims.v[d];
				rr /= rdims.v[d];
				off += c * rin.v[d];
			}
			s += ld<H>(in, off);
		}
		if (A == planrt_f32 && atomic)
			atomicAdd((float *)out + ooff, s);
		else
			st<A>(out, ooff, ld<A>(out, ooff) + s);
	}
}

/* sum_to_kernel with the planned index arithmetic (planrt_index_math.h): 32-bit offsets, and a
 * reduced run of one dim (a bias gradient's rows) walked at its stride, with no division a row */
template <int H>
__global__ static void sum_planned_kernel(planrt_sum_plan_t p, uint32_t chunk, const void *in, float *out, int atomic)
{
	uint32_t r0 = blockIdx.y * chunk, r1 = p.red_n - r0 < chunk ? p.red_n : r0 + chunk;
	for (uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < p.out_n; o += gridDim.x * blockDim.x) {
		uint32_t base, at;
		planrt_sum_kept(&p, o, &base, &at);
		float s = 0;
		if (p.nred == 1)
			for (uint32_t r = r0, off = base + r0 * p.rin[0]; r < r1; r++, off += p.rin[0])
				s += ld<H>(in, off);
		else
			for (uint32_t r = r0; r < r1; r++)
				s += ld<H>(in, base + planrt_sum_red(&p, r));
		if (atomic)
			atomicAdd(&out[at], s);
		else
			out[at] += s;
	}
}

/* A sum over rows into out stored as A (bf16 or f16: a bias gradient kept as the plan stores it).
 * A block of 32 x 32 threads takes 32 outputs; each row of threads sums every 32nd reduced index,
 * the 32 partial sums of an output are added in shared memory in a fixed order, and out is widened,
 * added to and rounded once: one launch, no atomics and no f32 copy (the widening and narrowing
 * casts around an f32 accumulator it replaces were two more launches). */
#define ACC_TILE 32
template <int H, int A>
__global__ static void __launch_bounds__(ACC_TILE *ACC_TILE) sum_acc16_kernel(planrt_sum_plan_t p, const void *in, void *out)
{
	__shared__ float part[ACC_TILE][ACC_TILE + 1];
	uint32_t tx = threadIdx.x, ty = threadIdx.y, o = blockIdx.x * ACC_TILE + tx, at = 0;
	float s = 0;
	if (o < p.out_n) {
		uint32_t base;
		planrt_sum_kept(&p, o, &base, &at);
		for (uint32_t r = ty; r < p.red_n; r += ACC_TILE)
			s += ld<H>(in, base + planrt_sum_red(&p, r));
	}
	part[ty][tx] = s;
	__syncthreads();
	if (ty == 0 && o < p.out_n) {
		float t = 0;
		for (int g = 0; g < ACC_TILE; g++)
			t += part[g][tx];
		st<A>(out, at, ld<A>(out, at) + t);
	}
}

/* sum_to's dims for the 64-bit kernel: the kept ones (out_strides != 0, or of size 1) and the reduced
 * ones, each with its input stride; false when a dim is 0 (nothing to sum) */
typedef struct SumDims {
	int nk, nr;
	int64_t kd[KMAX], ki[KMAX], ko[KMAX], rd[KMAX], ri[KMAX], out_n, red_n;
} SumDims;

static bool sum_dims(int rank, const int64_t *dims, const int64_t *out_strides, SumDims *sd)
{
	int64_t ist[KMAX];
	strides_of(rank, dims, ist);
	sd->nk = sd->nr = 0;
	sd->out_n = sd->red_n = 1;
	for (int d = 0; d < rank; d++) {
		if (dims[d] == 0)
			return false;
		if (out_strides[d] != 0 || dims[d] == 1) {
			sd->kd[sd->nk] = dims[d];
			sd->ki[sd->nk] = ist[d];
			sd->ko[sd->nk++] = out_strides[d];
			sd->out_n *= dims[d];
		} else {
			sd->rd[sd->nr] = dims[d];
			sd->ri[sd->nr++] = ist[d];
			sd->red_n *= dims[d];
		}
	}
	return true;
}

/* the 64-bit sum_to_kernel over chunks of `chunk` reduced elements (several: added atomically) */
template <int H, int A>
static void sum_wide(const SumDims *sd, int64_t chunk, const void *in, void *out, cudaStream_t s)
{
	int64_t splits = (sd->red_n + chunk - 1) / chunk;
	unsigned gx = (unsigned)((sd->out_n + PLANRT_CU_BLOCK - 1) / PLANRT_CU_BLOCK);
	dim3 grid(gx < 1 ? 1 : gx > 65535 ? 65535 : gx, (unsigned)(splits < 1 ? 1 : splits));
	sum_to_kernel<H, A><<<grid, PLANRT_CU_BLOCK, 0, s>>>(sd->nk, dims_of(sd->nk, sd->kd), dims_of(sd->nk, sd->ki),
							    dims_of(sd->nk, sd->ko), sd->nr, dims_of(sd->nr, sd->rd),
							    dims_of(sd->nr, sd->ri), sd->out_n, sd->red_n, chunk, in, out,
							    grid.y > 1);
	planrt_cu_check_launch("sum_to");
}

/* out (+)= in summed onto out_strides, out stored as A: f32 (chunks of rows, added atomically when
 * there are several), or 16-bit (sum_acc16_kernel: widened, added to and rounded once) */
template <int H, int A>
static void sum_to(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
		   int64_t out_elems, int accumulate, int stream)
{
	check_rank("sum_to", rank);
	cudaStream_t s = planrt_cu_stream(stream);
	if (!accumulate && out_elems > 0)
		planrt_cu_check_(cudaMemsetAsync(out, 0, (A == planrt_f32 ? 4 : 2) * (size_t)out_elems, s), "cudaMemsetAsync");
	planrt_sum_plan_t plan;
	if (index_planned() && planrt_sum_plan(rank, dims, out_strides, &plan)) {
		if constexpr (A == planrt_f32) {
			int64_t chunk, splits = col_chunks(plan.red_n, &chunk);
			unsigned gx = (unsigned)((plan.out_n + PLANRT_CU_BLOCK - 1) / PLANRT_CU_BLOCK);
			dim3 grid(gx > 65535 ? 65535 : gx, (unsigned)splits);
			sum_planned_kernel<H><<<grid, PLANRT_CU_BLOCK, 0, s>>>(plan, (uint32_t)chunk, in, (float *)out, splits > 1);
		} else {
			dim3 grid((unsigned)((plan.out_n + ACC_TILE - 1) / ACC_TILE)), block(ACC_TILE, ACC_TILE);
			sum_acc16_kernel<H, A><<<grid, block, 0, s>>>(plan, in, out);
		}
		planrt_cu_check_launch("sum_to");
		return;
	}
	/* 2^31 elements or more (or PLANRT_INDEX=64): 64-bit offsets; into 16 bits one thread an output
	 * over every reduced element (no atomics) */
	SumDims sd;
	if (!sum_dims(rank, dims, out_strides, &sd))
		return;
	int64_t chunk = sd.red_n;
	if (A == planrt_f32)
		col_chunks(sd.red_n, &chunk);
	sum_wide<H, A>(&sd, chunk, in, out, s);
}

void planrt_cu_k_sum_to_f32(int rank, const int64_t *dims, const float *in, const int64_t *out_strides, float *out,
			    int64_t out_elems, int stream)
{
	sum_to<planrt_f32, planrt_f32>(rank, dims, in, out_strides, out, out_elems, 0, stream);
}

void planrt_cu_k_sum_to_acc_f32(int rank, const int64_t *dims, const float *in, const int64_t *out_strides, float *out,
				int64_t out_elems, int stream)
{
	sum_to<planrt_f32, planrt_f32>(rank, dims, in, out_strides, out, out_elems, 1, stream);
}

/* a sum's `acc`: f32, or the storage type */
static void check_acc(planrt_dtype_t acc, planrt_dtype_t storage, const char *what)
{
	if (acc != planrt_f32 && acc != storage)
		planrt_fatal("%s: a sum stored as type %d (f32 or the storage type %d expected)", what, (int)acc, (int)storage);
}

/* a 16-bit in (sum_to_16, sum_to_acc_16); out f32 or stored as in */
static void sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
		      int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int accumulate, int stream)
{
	check_acc(acc, storage, "sum_to_16");
	if (acc == planrt_f32)
		BY_STORAGE("sum_to_16", storage,
			   (sum_to<H, planrt_f32>(rank, dims, in, out_strides, out, out_elems, accumulate, stream)));
	else
		BY_STORAGE("sum_to_16", storage, (sum_to<H, H>(rank, dims, in, out_strides, out, out_elems, accumulate, stream)));
}

void planrt_cu_k_sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			   int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int stream)
{
	sum_to_16(rank, dims, in, out_strides, out, out_elems, acc, storage, 0, stream);
}

void planrt_cu_k_sum_to_acc_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			       int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int stream)
{
	sum_to_16(rank, dims, in, out_strides, out, out_elems, acc, storage, 1, stream);
}

/* ------------------------------------------------------------------ dropout (Philox, as kernels.c) */

__device__ static uint32_t philox_first(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1)
{
	for (int r = 0; r < 10; r++) {
		if (r > 0) {
			k0 += 0x9E3779B9u;
			k1 += 0xBB67AE85u;
		}
		uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
		uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
		uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
		c0 = n0;
		c1 = lo1;
		c2 = n2;
		c3 = lo0;
	}
	return c0;
}

/* x, y stored as H (f32, or the 16-bit storage of dropout_16). Each element keys on its global index:
 * local coordinate c of dim d is at global first[d] + c in the block's first half of that dim and at
 * second[d] + c - half in its second (a balanced ring's block holds two halves apart on one dim;
 * elsewhere second = first + half, one run), as the CPU's dropout_mask draws it. */
template <int H>
__device__ static void dropout_element(const void *x, const void *add, void *y, uint8_t *mask, uint64_t thr, float sc,
				       uint64_t seed, uint64_t key, int64_t i, uint64_t g)
{
	uint32_t u = philox_first((uint32_t)g, (uint32_t)(g >> 32), (uint32_t)key, (uint32_t)(key >> 32), (uint32_t)seed,
				  (uint32_t)(seed >> 32));
	uint8_t keep = (uint64_t)u >= thr;
	mask[i] = keep;
	float v = keep ? ld<H>(x, i) * sc : 0.0f;
	if (add) /* the residual the loop after it added (epilogues.c) */
		v = ld<H>(add, i) + v;
	st<H>(y, i, v);
}

/* 64-bit offsets (2^31 elements or more, or PLANRT_INDEX=64): a division of a 64-bit index a dim */
template <int H>
__global__ static void dropout_kernel(const void *x, const void *add, void *y, uint8_t *mask, uint64_t thr, float sc,
				      uint64_t seed, uint64_t key, int rank, Dims ldims, Dims gst, Dims first, Dims second,
				      int64_t n)
{
	GRID_STRIDE(i, n)
	{
		int64_t rest = i;
		uint64_t g = 0;
		for (int d = rank - 1; d >= 0; d--) {
			int64_t c = rest % ldims.v[d], half = ldims.v[d] / 2;
			rest /= ldims.v[d];
			g += (uint64_t)((c < half ? first.v[d] + c : second.v[d] + c - half) * gst.v[d]);
		}
		dropout_element<H>(x, add, y, mask, thr, sc, seed, key, i, g);
	}
}

/* the planned index arithmetic (planrt_index_math.h): a multiply-high a dim, 32-bit */
template <int H>
__global__ static void dropout_planned_kernel(planrt_dropout_plan_t p, const void *x, const void *add, void *y,
					      uint8_t *mask, uint64_t thr, float sc, uint64_t seed, uint64_t key)
{
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
		dropout_element<H>(x, add, y, mask, thr, sc, seed, key, i, planrt_dropout_key(&p, i));
}

template <int H>
static void dropout(const void *x, const void *add, void *y, uint8_t *mask, double p, uint64_t seed, uint64_t key,
		    int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int stream)
{
	check_rank("dropout", rank);
	if (planrt_evaluating_)
		p = 0;
	int64_t gst[KMAX], n = 1;
	strides_of(rank, gdims, gst);
	for (int d = 0; d < rank; d++)
		n *= ldims[d];
	uint64_t thr = !(p > 0) ? 0 : p >= 1 ? (uint64_t)1 << 32 : (uint64_t)ceil(p * 4294967296.0);
	float sc = p >= 1 ? 0.0f : (float)(1.0 / (1.0 - p));
	planrt_dropout_plan_t plan;
	if (index_planned() && planrt_dropout_plan(rank, gdims, ldims, offs, &plan)) {
		LAUNCH(dropout_planned_kernel<H>, (int64_t)plan.n, stream, plan, x, add, y, mask, thr, sc, seed, key);
		return;
	}
	LAUNCH(dropout_kernel<H>, n, stream, x, add, y, mask, thr, sc, seed, key, rank, dims_of(rank, ldims),
	       dims_of(rank, gst), dims_of(rank, offs), dims_of(rank, offs + rank), n);
}

void planrt_cu_k_dropout_f32(const float *x, float *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			     const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int stream)
{
	dropout<planrt_f32>(x, NULL, y, mask, p, seed, key, rank, gdims, ldims, offs, stream);
}

void planrt_cu_k_dropout_16(const void *x, void *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			    const int64_t *gdims, const int64_t *ldims, const int64_t *offs, planrt_dtype_t storage,
			    int stream)
{
	BY_STORAGE("dropout_16", storage, dropout<H>(x, NULL, y, mask, p, seed, key, rank, gdims, ldims, offs, stream));
}

/* dropout_16 whose y is add + the dropped x, rounded once (epilogues.c: the residual add after it) */
void planrt_cu_k_dropout_add_16(const void *x, const void *add, void *y, uint8_t *mask, double p, uint64_t seed,
				uint64_t key, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
				planrt_dtype_t storage, int stream)
{
	int fused = planrt_cu_epilogue_fused_();
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= ldims[d];
	BY_STORAGE("dropout_add_16", storage, {
		dropout<H>(x, fused ? add : NULL, y, mask, p, seed, key, rank, gdims, ldims, offs, stream);
		if (!fused)
			LAUNCH(add_into_kernel<H>, n, stream, y, add, n);
	});
}

/* ------------------------------------------------------------------ attention pieces */

/* local query row r is at global row_off + r, or row_off2 + r - half from row half on (a balanced
 * ring's two mirrored chunks; otherwise row_off2 = row_off + half, one run) */
__global__ static void causal_mask_kernel(const float *x, float *y, int64_t rows, int64_t cols, int64_t row_off,
					  int64_t row_off2, int64_t col_off, float fill, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		int64_t j = i % cols, r = i / cols % rows, half = rows / 2;
		int64_t keep = (r < half ? row_off + r : row_off2 + r - half) - col_off + 1;
		y[i] = j < keep ? x[i] : fill;
	}
}

void planrt_cu_causal_mask_block_f32(const float *x, float *y, int64_t batch, int64_t rows, int64_t cols,
				     const int64_t *offs, int rank, int gradient, int stream)
{
	if (offs[2 * rank - 1] != offs[rank - 1] + cols / 2)
		planrt_fatal("causal mask: the key columns are split over a balanced ring; the ring attention keeps "
			     "its keys in blocks, the unfused mask needs them whole");
	int64_t n = batch * rows * cols;
	LAUNCH(causal_mask_kernel, n, stream, x, y, rows, cols, offs[rank - 2], offs[2 * rank - 2], offs[rank - 1],
	       gradient ? 0.0f : -INFINITY, n);
}

__global__ static void softmax_kernel(const float *x, float *y, int64_t cols)
{
	const float *xr = x + (int64_t)blockIdx.x * cols;
	float *yr = y + (int64_t)blockIdx.x * cols;
	float m = -INFINITY;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		m = xr[j] > m ? xr[j] : m;
	m = block_max(m);
	float s = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float e = kexpf(xr[j] - m);
		yr[j] = e;
		s += e;
	}
	float inv = 1 / block_sum(s);
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		yr[j] *= inv;
}

void planrt_cu_k_softmax_f32(const float *x, float *y, int64_t rows, int64_t cols, int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	softmax_kernel<<<row_grid(rows), cols < ROW_THREADS ? 32 * ((cols + 31) / 32) : ROW_THREADS, 0,
			 planrt_cu_stream(stream)>>>(x, y, cols);
	planrt_cu_check_launch("softmax");
}

__global__ static void softmax_grad_kernel(const float *y, const float *dy, float *dx, int64_t cols)
{
	int64_t at = (int64_t)blockIdx.x * cols;
	float s = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		s += y[at + j] * dy[at + j];
	s = block_sum(s);
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		dx[at + j] = y[at + j] * (dy[at + j] - s);
}

void planrt_cu_k_softmax_grad_f32(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	softmax_grad_kernel<<<row_grid(rows), cols < ROW_THREADS ? 32 * ((cols + 31) / 32) : ROW_THREADS, 0,
			      planrt_cu_stream(stream)>>>(y, dy, dx, cols);
	planrt_cu_check_launch("softmax_grad");
}

/* ------------------------------------------------------------------ layer norm, RMS norm
 * x, w, b, y, dy and dx stored as H (f32, or the _16 variants' bf16 / f16); the statistics and the
 * weight gradients f32. */

static unsigned row_threads(int64_t cols)
{
	return cols < ROW_THREADS ? 32 * (unsigned)((cols + 31) / 32) : ROW_THREADS;
}

template <int H>
__global__ static void layer_norm_kernel(const void *x, const void *w, const void *b, void *y, float *mean,
					 float *rstd, int64_t cols, float eps)
{
	int64_t at = (int64_t)blockIdx.x * cols;
	float s = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		s += ld<H>(x, at + j);
	float mu = block_sum(s) / (float)cols;
	float q = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float d = ld<H>(x, at + j) - mu;
		q += d * d;
	}
	float rs = 1 / sqrtf(block_sum(q) / (float)cols + eps);
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float v = (ld<H>(x, at + j) - mu) * rs;
		if (w)
			v = v * ld<H>(w, j);
		if (b)
			v = v + ld<H>(b, j);
		st<H>(y, at + j, v);
	}
	if (threadIdx.x == 0) {
		mean[blockIdx.x] = mu;
		rstd[blockIdx.x] = rs;
	}
}

template <int H>
static void layer_norm(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd, int64_t rows,
		       int64_t cols, double eps, int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	layer_norm_kernel<H><<<row_grid(rows), row_threads(cols), 0, planrt_cu_stream(stream)>>>(x, w, b, y, mean, rstd,
												  cols, (float)eps);
	planrt_cu_check_launch("layer_norm");
}

/* dx of a row; add (NULL: none) is added to it before it is rounded (a residual gradient: the
 * CUDA printer's epilogues.c folds the add that follows into the kernel) */
template <int H>
__global__ static void layer_norm_dx_kernel(const void *x, const void *w, const float *mean, const float *rstd,
					    const void *dy, const void *add, void *dx, int64_t cols)
{
	int64_t at = (int64_t)blockIdx.x * cols;
	float mu = mean[blockIdx.x], rs = rstd[blockIdx.x];
	float sg = 0, sgx = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float g = ld<H>(dy, at + j) * (w ? ld<H>(w, j) : 1.0f);
		sg += g;
		sgx += g * (ld<H>(x, at + j) - mu);
	}
	float mg = block_sum(sg) / (float)cols, mgx = block_sum(sgx) * rs / (float)cols;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float xh = (ld<H>(x, at + j) - mu) * rs;
		float d = rs * (ld<H>(dy, at + j) * (w ? ld<H>(w, j) : 1.0f) - mg - xh * mgx);
		if (add)
			d = ld<H>(add, at + j) + d;
		st<H>(dx, at + j, d);
	}
}

/* dw[j] += sum over rows of dy * xhat, db[j] += sum of dy (rms: mean NULL, xhat = x rstd) */
template <int H>
__global__ static void norm_params_kernel(const void *x, const float *mean, const float *rstd, const void *dy,
					  float *dw, float *db, int64_t rows, int64_t cols, int64_t chunk, int atomic)
{
	int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= cols)
		return;
	int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
	float sw = 0, sb = 0;
	for (int64_t r = r0; r < r1; r++) {
		float g = ld<H>(dy, r * cols + j);
		sw += g * ((ld<H>(x, r * cols + j) - (mean ? mean[r] : 0.0f)) * rstd[r]);
		sb += g;
	}
	if (atomic) {
		if (dw)
			atomicAdd(&dw[j], sw);
		if (db)
			atomicAdd(&db[j], sb);
	} else {
		if (dw)
			dw[j] += sw;
		if (db)
			db[j] += sb;
	}
}

/* norm_params_kernel into dw, db stored as A (bf16 or f16), as sum_acc16_kernel: a block of 32 x 32
 * threads takes 32 columns, each row of threads every 32nd row, the partial sums added in shared
 * memory in a fixed order, and dw / db widened, added to and rounded once */
template <int H, int A>
__global__ static void __launch_bounds__(ACC_TILE *ACC_TILE) norm_params_acc16_kernel(const void *x, const float *mean, const float *rstd, const void *dy,
						void *dw, void *db, int64_t rows, int64_t cols)
{
	__shared__ float pw[ACC_TILE][ACC_TILE + 1], pb[ACC_TILE][ACC_TILE + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int64_t j = (int64_t)blockIdx.x * ACC_TILE + tx;
	float sw = 0, sb = 0;
	if (j < cols)
		for (int64_t r = ty; r < rows; r += ACC_TILE) {
			float g = ld<H>(dy, r * cols + j);
			sw += g * ((ld<H>(x, r * cols + j) - (mean ? mean[r] : 0.0f)) * rstd[r]);
			sb += g;
		}
	pw[ty][tx] = sw;
	pb[ty][tx] = sb;
	__syncthreads();
	if (ty == 0 && j < cols) {
		float tw = 0, tb = 0;
		for (int g = 0; g < ACC_TILE; g++) {
			tw += pw[g][tx];
			tb += pb[g][tx];
		}
		if (dw)
			st<A>(dw, j, ld<A>(dw, j) + tw);
		if (db)
			st<A>(db, j, ld<A>(db, j) + tb);
	}
}

/* dw, db (either NULL) summed over the rows into their values, stored as acc: f32 (atomics across
 * chunks of rows) or H (norm_params_acc16_kernel) */
template <int H>
static void norm_params(const void *x, const float *mean, const float *rstd, const void *dy, void *dw, void *db,
			int64_t rows, int64_t cols, planrt_dtype_t acc, int stream)
{
	if (!dw && !db)
		return;
	if constexpr (H != planrt_f32) /* an f32 norm's dw / db are f32 */
		if (acc != planrt_f32) {
			dim3 grid((unsigned)((cols + ACC_TILE - 1) / ACC_TILE)), block(ACC_TILE, ACC_TILE);
			norm_params_acc16_kernel<H, H><<<grid, block, 0, planrt_cu_stream(stream)>>>(x, mean, rstd, dy, dw, db,
												   rows, cols);
			planrt_cu_check_launch("norm parameter gradients");
			return;
		}
	int64_t chunk, splits = col_chunks(rows, &chunk);
	dim3 grid((unsigned)((cols + PLANRT_CU_BLOCK - 1) / PLANRT_CU_BLOCK), (unsigned)splits);
	norm_params_kernel<H><<<grid, PLANRT_CU_BLOCK, 0, planrt_cu_stream(stream)>>>(x, mean, rstd, dy, (float *)dw,
										       (float *)db, rows, cols, chunk, splits > 1);
	planrt_cu_check_launch("norm parameter gradients");
}

template <int H>
static void layer_norm_grad(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
			    const void *add, void *dx, void *dw, void *db, int64_t rows, int64_t cols, planrt_dtype_t acc,
			    int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	/* dw, db first: with an add (epilogues.c), dx may be x's or dy's memory, which the dx kernel reads a
	 * row, or an element, before it writes it */
	norm_params<H>(x, mean, rstd, dy, dw, db, rows, cols, acc, stream);
	layer_norm_dx_kernel<H><<<row_grid(rows), row_threads(cols), 0, planrt_cu_stream(stream)>>>(x, w, mean, rstd,
												     dy, add, dx, cols);
	planrt_cu_check_launch("layer_norm_grad");
}

template <int H>
__global__ static void rms_norm_kernel(const void *x, const void *w, void *y, float *rstd, int64_t cols, float eps)
{
	int64_t at = (int64_t)blockIdx.x * cols;
	float q = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		q += ld<H>(x, at + j) * ld<H>(x, at + j);
	float rs = 1 / sqrtf(block_sum(q) / (float)cols + eps);
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		st<H>(y, at + j, w ? ld<H>(x, at + j) * rs * ld<H>(w, j) : ld<H>(x, at + j) * rs);
	if (threadIdx.x == 0)
		rstd[blockIdx.x] = rs;
}

template <int H>
static void rms_norm(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols, double eps,
		     int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	rms_norm_kernel<H><<<row_grid(rows), row_threads(cols), 0, planrt_cu_stream(stream)>>>(x, w, y, rstd, cols,
												(float)eps);
	planrt_cu_check_launch("rms_norm");
}

template <int H>
__global__ static void rms_norm_dx_kernel(const void *x, const void *w, const float *rstd, const void *dy,
					  const void *add, void *dx, int64_t cols)
{
	int64_t at = (int64_t)blockIdx.x * cols;
	float rs = rstd[blockIdx.x], sgx = 0;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
		sgx += ld<H>(dy, at + j) * (w ? ld<H>(w, j) : 1.0f) * ld<H>(x, at + j);
	float c = block_sum(sgx) * rs * rs / (float)cols;
	for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
		float d = rs * (ld<H>(dy, at + j) * (w ? ld<H>(w, j) : 1.0f) - ld<H>(x, at + j) * c);
		if (add)
			d = ld<H>(add, at + j) + d;
		st<H>(dx, at + j, d);
	}
}

template <int H>
static void rms_norm_grad(const void *x, const void *w, const float *rstd, const void *dy, const void *add, void *dx,
			  void *dw, int64_t rows, int64_t cols, planrt_dtype_t acc, int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	norm_params<H>(x, NULL, rstd, dy, dw, NULL, rows, cols, acc, stream); /* first: as layer_norm_grad's */
	rms_norm_dx_kernel<H><<<row_grid(rows), row_threads(cols), 0, planrt_cu_stream(stream)>>>(x, w, rstd, dy, add,
												   dx, cols);
	planrt_cu_check_launch("rms_norm_grad");
}

void planrt_cu_k_layer_norm_f32(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
				int64_t rows, int64_t cols, double eps, int stream)
{
	layer_norm<planrt_f32>(x, w, b, y, mean, rstd, rows, cols, eps, stream);
}

void planrt_cu_k_layer_norm_grad_f32(const float *x, const float *w, const float *mean, const float *rstd,
				     const float *dy, float *dx, float *dw, float *db, int64_t rows, int64_t cols,
				     int stream)
{
	layer_norm_grad<planrt_f32>(x, w, mean, rstd, dy, NULL, dx, dw, db, rows, cols, planrt_f32, stream);
}

void planrt_cu_k_rms_norm_f32(const float *x, const float *w, float *y, float *rstd, int64_t rows, int64_t cols,
			      double eps, int stream)
{
	rms_norm<planrt_f32>(x, w, y, rstd, rows, cols, eps, stream);
}

void planrt_cu_k_rms_norm_grad_f32(const float *x, const float *w, const float *rstd, const float *dy, float *dx,
				   float *dw, int64_t rows, int64_t cols, int stream)
{
	rms_norm_grad<planrt_f32>(x, w, rstd, dy, NULL, dx, dw, rows, cols, planrt_f32, stream);
}

void planrt_cu_k_layer_norm_16(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd,
			       int64_t rows, int64_t cols, double eps, planrt_dtype_t storage, int stream)
{
	BY_STORAGE("layer_norm_16", storage, layer_norm<H>(x, w, b, y, mean, rstd, rows, cols, eps, stream));
}

void planrt_cu_k_layer_norm_grad_16(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
				    void *dx, void *dw, void *db, int64_t rows, int64_t cols, planrt_dtype_t acc,
				    planrt_dtype_t storage, int stream)
{
	check_acc(acc, storage, "layer_norm_grad_16");
	BY_STORAGE("layer_norm_grad_16", storage,
		   layer_norm_grad<H>(x, w, mean, rstd, dy, NULL, dx, dw, db, rows, cols, acc, stream));
}

/* layer_norm_grad_16 whose dx is add + dx, rounded once (epilogues.c: the residual gradient's add) */
void planrt_cu_k_layer_norm_grad_add_16(const void *x, const void *w, const float *mean, const float *rstd,
					const void *dy, const void *add, void *dx, void *dw, void *db, int64_t rows,
					int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage, int stream)
{
	int fused = planrt_cu_epilogue_fused_();
	check_acc(acc, storage, "layer_norm_grad_add_16");
	BY_STORAGE("layer_norm_grad_add_16", storage, {
		layer_norm_grad<H>(x, w, mean, rstd, dy, fused ? add : NULL, dx, dw, db, rows, cols, acc, stream);
		if (!fused)
			LAUNCH(add_into_kernel<H>, rows * cols, stream, dx, add, rows * cols);
	});
}

void planrt_cu_k_rms_norm_16(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols,
			     double eps, planrt_dtype_t storage, int stream)
{
	BY_STORAGE("rms_norm_16", storage, rms_norm<H>(x, w, y, rstd, rows, cols, eps, stream));
}

void planrt_cu_k_rms_norm_grad_16(const void *x, const void *w, const float *rstd, const void *dy, void *dx,
				  void *dw, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage, int stream)
{
	check_acc(acc, storage, "rms_norm_grad_16");
	BY_STORAGE("rms_norm_grad_16", storage, rms_norm_grad<H>(x, w, rstd, dy, NULL, dx, dw, rows, cols, acc, stream));
}

/* rms_norm_grad_16 whose dx is add + dx, rounded once (epilogues.c) */
void planrt_cu_k_rms_norm_grad_add_16(const void *x, const void *w, const float *rstd, const void *dy, const void *add,
				      void *dx, void *dw, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage,
				      int stream)
{
	int fused = planrt_cu_epilogue_fused_();
	check_acc(acc, storage, "rms_norm_grad_add_16");
	BY_STORAGE("rms_norm_grad_add_16", storage, {
		rms_norm_grad<H>(x, w, rstd, dy, fused ? add : NULL, dx, dw, rows, cols, acc, stream);
		if (!fused)
			LAUNCH(add_into_kernel<H>, rows * cols, stream, dx, add, rows * cols);
	});
}

/* ------------------------------------------------------------------ embedding */

/* E: float, or uint16_t for a 16-bit table moved as stored (embed_16; 0 is zero in bf16 and f16) */
template <typename E>
__global__ static void embed_kernel(const E *table, const int32_t *ids, E *out, int64_t dim, int64_t vocab_lo,
				    int64_t vocab_local, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		int64_t t = i / dim, j = i % dim, v = (int64_t)ids[t] - vocab_lo;
		out[i] = v >= 0 && v < vocab_local ? table[v * dim + j] : (E)0;
	}
}

void planrt_cu_k_embed_f32(const float *table, const int32_t *ids, float *out, int64_t ntok, int64_t dim,
			   int64_t vocab_lo, int64_t vocab_local, int stream)
{
	int64_t n = ntok * dim;
	LAUNCH(embed_kernel<float>, n, stream, table, ids, out, dim, vocab_lo, vocab_local, n);
}

void planrt_cu_k_embed_16(const void *table, const int32_t *ids, void *out, int64_t ntok, int64_t dim,
			  int64_t vocab_lo, int64_t vocab_local, planrt_dtype_t storage, int stream)
{
	if (storage != planrt_bf16 && storage != planrt_f16)
		planrt_fatal("embed_16: storage type %d is not bf16 or f16", (int)storage);
	int64_t n = ntok * dim;
	LAUNCH(embed_kernel<uint16_t>, n, stream, (const uint16_t *)table, ids, (uint16_t *)out, dim, vocab_lo,
	       vocab_local, n);
}

__global__ static void embed_grad_kernel(const int32_t *ids, const float *dy, float *dtable, int64_t dim,
					 int64_t vocab_lo, int64_t vocab_local, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		int64_t t = i / dim, j = i % dim, v = (int64_t)ids[t] - vocab_lo;
		if (v >= 0 && v < vocab_local)
			atomicAdd(&dtable[v * dim + j], dy[i]);
	}
}

void planrt_cu_k_embed_grad_f32(const int32_t *ids, const float *dy, float *dtable, int64_t ntok, int64_t dim,
				int64_t vocab_lo, int64_t vocab_local, int stream)
{
	int64_t n = ntok * dim;
	LAUNCH(embed_grad_kernel, n, stream, ids, dy, dtable, dim, vocab_lo, vocab_local, n);
}

/* ------------------------------------------------------------------ cross-entropy */

/* per row: max, sum of exp(x - max), the target's logit (0 outside this rank's columns); logits
 * stored as H */
template <int H>
__global__ static void ce_stats_kernel(const void *logits, const int32_t *targets, int64_t cols, int64_t vocab_lo,
				       float *rowmax, float *sumexp, float *tlogit, int phase)
{
	int64_t r = blockIdx.x, at = r * cols;
	if (phase == 0) {
		float m = -INFINITY;
		for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
			float x = ld<H>(logits, at + j);
			m = x > m ? x : m;
		}
		m = block_max(m);
		if (threadIdx.x == 0) {
			rowmax[r] = cols > 0 ? m : -INFINITY;
			int64_t c = (int64_t)targets[r] - vocab_lo;
			tlogit[r] = c >= 0 && c < cols ? ld<H>(logits, at + c) : 0.0f;
		}
	} else {
		float m = rowmax[r], s = 0;
		for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
			s += kexpf(ld<H>(logits, at + j) - m);
		s = block_sum(s);
		if (threadIdx.x == 0)
			sumexp[r] = s;
	}
}

/* lse per row and the loss, summed in double in one block (in row order per thread); correct
 * (non-NULL): plus the rows whose target's logit is the row's max */
__global__ static void ce_loss_kernel(const float *rowmax, const float *sumexp, const float *tlogit, int64_t rows,
				      float *lse, float *loss, double scale, double *correct)
{
	double s = 0, n = 0;
	for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
		double l = (double)rowmax[r] + log((double)sumexp[r]);
		lse[r] = (float)l;
		s += l - (double)tlogit[r];
		n += tlogit[r] >= rowmax[r];
	}
	s = block_sum_d(s);
	if (correct)
		n = block_sum_d(n);
	if (threadIdx.x == 0) {
		*loss = (float)(s * scale);
		if (correct)
			*correct += n;
	}
}

template <int H>
static void cross_entropy(const void *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
			  int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
			  void *scratch, int stream)
{
	float *rowmax = (float *)scratch, *sumexp = rowmax + rows, *tlogit = sumexp + rows;
	cudaStream_t s = planrt_cu_stream(stream);
	if (rows > 0) {
		ce_stats_kernel<H><<<row_grid(rows), row_threads(cols), 0, s>>>(logits, targets, cols, vocab_lo, rowmax,
										sumexp, tlogit, 0);
		planrt_cu_check_launch("cross_entropy");
	}
	if (vocab_comm)
		PLANRT_CHECK(planrt_nccl_allreduce(rowmax, rowmax, (size_t)rows, planrt_f32, planrt_max, vocab_comm, s));
	if (rows > 0) {
		ce_stats_kernel<H><<<row_grid(rows), row_threads(cols), 0, s>>>(logits, targets, cols, vocab_lo, rowmax,
										sumexp, tlogit, 1);
		planrt_cu_check_launch("cross_entropy");
	}
	if (vocab_comm) {
		PLANRT_CHECK(planrt_nccl_allreduce(sumexp, sumexp, (size_t)rows, planrt_f32, planrt_sum, vocab_comm, s));
		PLANRT_CHECK(planrt_nccl_allreduce(tlogit, tlogit, (size_t)rows, planrt_f32, planrt_sum, vocab_comm, s));
	}
	ce_loss_kernel<<<1, 1024, 0, s>>>(rowmax, sumexp, tlogit, rows, lse, loss, scale, correct);
	planrt_cu_check_launch("cross_entropy loss");
}

void planrt_cu_cross_entropy_f32(const float *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
				 int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
				 void *scratch, int stream)
{
	cross_entropy<planrt_f32>(logits, targets, loss, lse, rows, cols, vocab_lo, scale, correct, vocab_comm, scratch,
				  stream);
}

void planrt_cu_cross_entropy_16(const void *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
				int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
				uint8_t *scratch, planrt_dtype_t storage, int stream)
{
	BY_STORAGE("cross_entropy_16", storage,
		   cross_entropy<H>(logits, targets, loss, lse, rows, cols, vocab_lo, scale, correct, vocab_comm, scratch,
				    stream));
}

/* dlogits = softmax(logits) * ds, less ds at the target: blocks of a row's columns (grid x) by rows
 * (grid y), so no element divides its index to find its row (gpt350m's 8192 x 50304 logits: two
 * 64-bit divisions an element cost more than the element's bytes). Elementwise, so dlogits may be
 * logits' own memory. */
template <int H>
__global__ static void ce_grad_kernel(const void *logits, const int32_t *targets, const float *lse, int64_t rows,
				      int64_t cols, int64_t vocab_lo, const float *dscale, double factor, void *dlogits)
{
	float ds = (float)((double)*dscale * factor);
	for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
		float l = lse[r];
		int64_t c = (int64_t)targets[r] - vocab_lo, at = r * cols;
		for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
			float v = kexpf(ld<H>(logits, at + j) - l) * ds;
			if (j == c)
				v -= ds;
			st<H>(dlogits, at + j, v);
		}
	}
}

template <int H>
static void ce_grad(const void *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
		    int64_t vocab_lo, const float *dscale, double factor, void *dlogits, int stream)
{
	if (rows <= 0 || cols <= 0)
		return;
	int64_t gx = (cols + PLANRT_CU_BLOCK - 1) / PLANRT_CU_BLOCK;
	dim3 grid((unsigned)(gx > 1024 ? 1024 : gx), (unsigned)(rows > 65535 ? 65535 : rows));
	ce_grad_kernel<H><<<grid, PLANRT_CU_BLOCK, 0, planrt_cu_stream(stream)>>>(logits, targets, lse, rows, cols, vocab_lo,
										   dscale, factor, dlogits);
	planrt_cu_check_launch("cross_entropy_grad");
}

void planrt_cu_k_ce_grad_f32(const float *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			     int64_t vocab_lo, const float *dscale, double factor, float *dlogits, int stream)
{
	ce_grad<planrt_f32>(logits, targets, lse, rows, cols, vocab_lo, dscale, factor, dlogits, stream);
}

void planrt_cu_k_ce_grad_16(const void *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			    int64_t vocab_lo, const float *dscale, double factor, void *dlogits, planrt_dtype_t storage,
			    int stream)
{
	BY_STORAGE("cross_entropy_grad_16", storage,
		   ce_grad<H>(logits, targets, lse, rows, cols, vocab_lo, dscale, factor, dlogits, stream));
}

/* Labels: the first one outside [0, classes) (its flat index, by atomicMin), read back on the host;
 * a bad label ends the run with the CPU's message (planrt_check_labels on a host copy), before the
 * cross-entropy that follows it runs. One 8-byte read per call: the labels are checked every step as
 * on the CPU. */
__global__ static void check_labels_kernel(const int32_t *labels, int64_t n, int64_t classes,
					   unsigned long long *first_bad)
{
	GRID_STRIDE(i, n)
	{
		if (labels[i] < 0 || labels[i] >= classes)
			atomicMin(first_bad, (unsigned long long)i);
	}
}

void planrt_cu_check_labels(const int32_t *labels, int rank, const int64_t *ldims, const int64_t *offs,
			    int64_t classes, const char *what, int64_t step, int stream)
{
	static unsigned long long *first_bad, *host_first_bad;
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= ldims[d];
	if (n <= 0)
		return;
	if (!first_bad) {
		planrt_cu_check_(cudaMalloc(&first_bad, sizeof *first_bad), "cudaMalloc");
		planrt_cu_check_(cudaMallocHost(&host_first_bad, sizeof *host_first_bad), "cudaMallocHost");
	}
	cudaStream_t s = planrt_cu_stream(stream);
	planrt_cu_check_(cudaMemsetAsync(first_bad, 0xff, sizeof *first_bad, s), "cudaMemsetAsync");
	LAUNCH(check_labels_kernel, n, stream, labels, n, classes, first_bad);
	planrt_cu_check_(cudaMemcpyAsync(host_first_bad, first_bad, sizeof *first_bad, cudaMemcpyDeviceToHost, s),
			 "cudaMemcpyAsync");
	planrt_cu_check_(cudaStreamSynchronize(s), "checking the labels (cudaStreamSynchronize)");
	if (*host_first_bad == ~0ull)
		return;
	int32_t *copy = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
	if (!copy)
		planrt_fatal("out of memory reading back %lld labels", (long long)n);
	planrt_cu_check_(cudaMemcpy(copy, labels, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost), "cudaMemcpy");
	planrt_check_labels(copy, rank, ldims, offs, classes, what, step); /* reports and ends the run */
	free(copy);
}

/* ------------------------------------------------------------------ narrow, rope (kernels_impl.h's) */

/* y[o, 0:len, :] = x[o, start:start+len, :] (grad: dx[o, start:start+len, :] (+)= dy, the rest 0),
 * elements of esize bytes */
__global__ static void narrow_kernel(const char *x, char *y, int64_t n_in, int64_t n_out, int64_t off_in,
				     int64_t off_out, int64_t len, int64_t inner, int esize, int accumulate, int64_t total)
{
	GRID_STRIDE(i, total)
	{
		int64_t j = i % inner, r = i / inner, k = r % len, o = r / len;
		int64_t src = (o * n_in + off_in + k) * inner + j, dst = (o * n_out + off_out + k) * inner + j;
		if (esize == 4 && accumulate)
			((float *)y)[dst] += ((const float *)x)[src];
		else if (esize == 4)
			((int32_t *)y)[dst] = ((const int32_t *)x)[src];
		else
			for (int b = 0; b < esize; b++)
				y[dst * esize + b] = x[src * esize + b];
	}
}

static void narrow(const void *x, void *y, int64_t outer, int64_t n_in, int64_t n_out, int64_t off_in, int64_t off_out,
		   int64_t len, int64_t inner, int esize, int accumulate, int stream)
{
	int64_t total = outer * len * inner;
	LAUNCH(narrow_kernel, total, stream, (const char *)x, (char *)y, n_in, n_out, off_in, off_out, len, inner, esize,
	       accumulate, total);
}

void planrt_cu_k_slice_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, int64_t start,
			   int64_t len, int stream)
{
	if (start < 0 || len < 0 || start + len > n)
		planrt_fatal("slice out of range");
	narrow(x, y, outer, n, len, start, 0, len, inner, 4, 0, stream);
}

void planrt_cu_k_slice_grad_f32(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner, int64_t start,
				int64_t len, int accumulate, int stream)
{
	if (start < 0 || len < 0 || start + len > n)
		planrt_fatal("slice_grad out of range");
	if (!accumulate)
		planrt_cu_check_(cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)(outer * n * inner), planrt_cu_stream(stream)),
				 "cudaMemsetAsync");
	narrow(dy, dx, outer, len, n, 0, start, len, inner, 4, accumulate, stream);
}

void planrt_cu_narrow_i32(const int32_t *x, int32_t *y, int64_t outer, int64_t n, int64_t inner, int64_t start,
			  int64_t len, int stream)
{
	narrow(x, y, outer, n, len, start, 0, len, inner, 4, 0, stream);
}

/* y = x rotated by the angles p f_i (sign 1) or -p f_i (sign -1): one thread per row and frequency,
 * with the CPU's float recipe (inv_freq = 1 / powf(theta, 2i / rot_dim), a = p * inv_freq); the dims
 * past rot_dim pass through. */
template <int H>
__global__ static void rope_kernel(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads,
				   int64_t head_dim, int64_t rot_dim, int heads_first, const int32_t *pos,
				   int64_t pos_stride, int64_t pos_off, int64_t pos_off2, float theta, float sign,
				   int64_t total)
{
	int64_t h = rot_dim / 2, pass = head_dim - rot_dim, per_row = h + pass;
	GRID_STRIDE(t, total)
	{
		int64_t row = t / per_row, i = t % per_row, at = row * head_dim;
		if (i >= h) {
			st<H>(y, at + rot_dim + i - h, ld<H>(x, at + rot_dim + i - h));
			continue;
		}
		int64_t b, s;
		if (heads_first) {
			s = row % seq;
			b = row / seq / heads;
		} else {
			s = row / heads % seq;
			b = row / heads / seq;
		}
		float p = pos ? (float)pos[b * pos_stride + s] : (float)(s < seq / 2 ? pos_off + s : pos_off2 + s - seq / 2);
		float inv = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
		float a = p * inv, c = cosf(a), sn = sign * sinf(a);
		float u = ld<H>(x, at + i), w = ld<H>(x, at + i + h);
		st<H>(y, at + i, u * c - w * sn);
		st<H>(y, at + i + h, w * c + u * sn);
	}
}

/* rope_kernel with the planned index arithmetic (planrt_index_math.h): a thread a (b, s, j), its angle,
 * cosine and sine once for every head, the heads' rows walked; each block computes the frequencies'
 * inverses (the same expression as rope_kernel's) once into shared memory. Every element gets the
 * arithmetic rope_kernel gives it. */
#define ROPE_TABLE 256 /* frequencies a block tables (rot_dim up to 512); beyond, each thread computes its own */
template <int H>
__global__ static void rope_planned_kernel(planrt_rope_plan_t p, const void *x, void *y, const int32_t *pos,
					   int64_t pos_stride, int64_t pos_off, int64_t pos_off2, float theta, float sign)
{
	__shared__ float inv_freq[ROPE_TABLE];
	for (uint32_t i = threadIdx.x; i < p.h && i < ROPE_TABLE; i += blockDim.x)
		inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)p.rot_dim);
	__syncthreads();
	for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.n; t += gridDim.x * blockDim.x) {
		uint32_t b, s, j;
		planrt_rope_where(&p, t, &b, &s, &j);
		if (j >= p.h) {
			uint32_t e = p.rot_dim + j - p.h;
			for (uint32_t hd = 0; hd < p.heads; hd++) {
				uint32_t at = planrt_rope_row(&p, b, s, hd);
				st<H>(y, at + e, ld<H>(x, at + e));
			}
			continue;
		}
		int64_t seq = p.seq.d;
		float pp = pos ? (float)pos[(int64_t)b * pos_stride + s]
			       : (float)((int64_t)s < seq / 2 ? pos_off + s : pos_off2 + s - seq / 2);
		float inv = j < ROPE_TABLE ? inv_freq[j] : 1.0f / powf(theta, (float)(2 * j) / (float)p.rot_dim);
		float a = pp * inv, c = cosf(a), sn = sign * sinf(a);
		for (uint32_t hd = 0; hd < p.heads; hd++) {
			uint32_t at = planrt_rope_row(&p, b, s, hd);
			float u = ld<H>(x, at + j), w = ld<H>(x, at + j + p.h);
			st<H>(y, at + j, u * c - w * sn);
			st<H>(y, at + j + p.h, w * c + u * sn);
		}
	}
}

template <int H>
static void rope(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim,
		 int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off, int64_t pos_off2, double theta,
		 float sign, int stream)
{
	if (rot_dim < 0 || rot_dim % 2 || rot_dim > head_dim)
		planrt_fatal("rope: rot_dim must be even and at most head_dim");
	planrt_rope_plan_t plan;
	if (index_planned() && planrt_rope_plan(batch, seq, heads, head_dim, rot_dim, heads_first, &plan)) {
		LAUNCH(rope_planned_kernel<H>, (int64_t)plan.n, stream, plan, x, y, pos, pos_stride, pos_off, pos_off2,
		       (float)theta, sign);
		return;
	}
	/* 2^31 elements or more (or PLANRT_INDEX=64): a thread an element pair, 64-bit offsets */
	int64_t total = batch * seq * heads * (rot_dim / 2 + head_dim - rot_dim);
	LAUNCH(rope_kernel<H>, total, stream, x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride,
	       pos_off, pos_off2, (float)theta, sign, total);
}

void planrt_cu_k_rope_f32(const float *x, float *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			  int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			  int64_t pos_off2, double theta, int stream)
{
	rope<planrt_f32>(x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta,
			 1.0f, stream);
}

void planrt_cu_k_rope_grad_f32(const float *dy, float *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			       int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride,
			       int64_t pos_off, int64_t pos_off2, double theta, int stream)
{
	rope<planrt_f32>(dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2,
			 theta, -1.0f, stream);
}

void planrt_cu_k_rope_16(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			 int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			 int64_t pos_off2, double theta, planrt_dtype_t storage, int stream)
{
	BY_STORAGE("rope_16", storage,
		   rope<H>(x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta,
			   1.0f, stream));
}

void planrt_cu_k_rope_grad_16(const void *dy, void *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			      int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			      int64_t pos_off2, double theta, planrt_dtype_t storage, int stream)
{
	BY_STORAGE("rope_grad_16", storage,
		   rope<H>(dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2,
			   theta, -1.0f, stream));
}

/* ------------------------------------------------------------------ unary functions, repeat_kv */

__device__ static float unary_of(int op, float x)
{
	switch (op) {
	case PLANRT_SIN: return sinf(x);
	case PLANRT_COS: return cosf(x);
	case PLANRT_EXP: return kexpf(x);
	case PLANRT_LOG: return logf(x);
	case PLANRT_TANH: return tanhf(x);
	default: return 1 / (1 + kexpf(-x)); /* PLANRT_SIGMOID */
	}
}

__global__ static void unary_kernel(int op, const float *x, float *y, int64_t n)
{
	GRID_STRIDE(i, n)
	y[i] = unary_of(op, x[i]);
}

/* dx = dy f'(x), as kernels_impl.h's planrt_k_unary_grad */
__global__ static void unary_grad_kernel(int op, const float *x, const float *dy, float *dx, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		float v = x[i], g = dy[i];
		switch (op) {
		case PLANRT_SIN: dx[i] = g * cosf(v); break;
		case PLANRT_COS: dx[i] = -g * sinf(v); break;
		case PLANRT_EXP: dx[i] = g * kexpf(v); break;
		case PLANRT_LOG: dx[i] = g / v; break;
		case PLANRT_TANH: {
			float t = tanhf(v);
			dx[i] = g * (1 - t * t);
			break;
		}
		default: {
			float sg = 1 / (1 + kexpf(-v));
			dx[i] = g * sg * (1 - sg);
		}
		}
	}
}

static void check_unary(int op)
{
	if (op < PLANRT_SIN || op > PLANRT_SIGMOID)
		planrt_fatal("unary: unknown op %d", op);
}

void planrt_cu_k_unary_f32(int op, const float *x, float *y, int64_t n, int stream)
{
	check_unary(op);
	LAUNCH(unary_kernel, n, stream, op, x, y, n);
}

void planrt_cu_k_unary_grad_f32(int op, const float *x, const float *dy, float *dx, int64_t n, int stream)
{
	check_unary(op);
	LAUNCH(unary_grad_kernel, n, stream, op, x, dy, dx, n);
}

/* y[o, h, :] = x[o, (h + lo) / n_rep, :] for y's y_heads heads; the gradient sums each x head's
 * copies among them in order (zero where it has none) */
__global__ static void repeat_kv_kernel(const float *x, float *y, int64_t heads, int64_t n_rep, int64_t inner,
					int64_t y_heads, int64_t lo, int64_t total)
{
	GRID_STRIDE(i, total)
	{
		int64_t j = i % inner, h = i / inner % y_heads, o = i / inner / y_heads;
		y[i] = x[(o * heads + (h + lo) / n_rep) * inner + j];
	}
}

__global__ static void repeat_kv_grad_kernel(const float *dy, float *dx, int64_t heads, int64_t n_rep, int64_t inner,
					     int64_t y_heads, int64_t lo, int64_t total)
{
	GRID_STRIDE(i, total)
	{
		int64_t j = i % inner, h = i / inner % heads, o = i / inner / heads;
		int64_t first = h * n_rep - lo, end = first + n_rep; /* y's heads copied from x's head h */
		float s = 0;
		for (int64_t r = first < 0 ? 0 : first; r < end && r < y_heads; r++)
			s += dy[(o * y_heads + r) * inner + j];
		dx[i] = s;
	}
}

void planrt_cu_k_repeat_kv_f32(const float *x, float *y, int64_t outer, int64_t heads, int64_t n_rep, int64_t inner,
			       int64_t y_heads, int64_t y_head_lo, int stream)
{
	int64_t total = outer * y_heads * inner;
	LAUNCH(repeat_kv_kernel, total, stream, x, y, heads, n_rep, inner, y_heads, y_head_lo, total);
}

void planrt_cu_k_repeat_kv_grad_f32(const float *dy, float *dx, int64_t outer, int64_t heads, int64_t n_rep,
				    int64_t inner, int64_t y_heads, int64_t y_head_lo, int stream)
{
	int64_t total = outer * heads * inner;
	LAUNCH(repeat_kv_grad_kernel, total, stream, dy, dx, heads, n_rep, inner, y_heads, y_head_lo, total);
}

/* ------------------------------------------------------------------ fills, casts, sums */

__global__ static void fill_kernel(void *dst, int64_t n, int t, double value, uint16_t half, int32_t i32)
{
	GRID_STRIDE(i, n)
	{
		switch (t) {
		case planrt_f32: ((float *)dst)[i] = (float)value; break;
		case planrt_f64: ((double *)dst)[i] = value; break;
		case planrt_bf16:
		case planrt_f16: ((uint16_t *)dst)[i] = half; break;
		case planrt_i32: ((int32_t *)dst)[i] = i32; break;
		default: ((uint8_t *)dst)[i] = (uint8_t)i32; break;
		}
	}
}

/* step.c's rounding of a double to a half type: through f32 rounded to odd, then once */
static uint16_t host_half_of(double x, planrt_dtype_t t)
{
	float f = (float)x;
	if (isfinite(f) && (double)f != x) {
		uint32_t u;
		memcpy(&u, &f, 4);
		if (!(u & 1))
			u = fabs((double)f) > fabs(x) ? u - 1 : u + 1;
		memcpy(&f, &u, 4);
	}
	if (t != planrt_bf16)
		return planrt_f32_to_half_(f, t);
	uint32_t u;
	memcpy(&u, &f, 4);
	return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void planrt_cu_fill(void *dst, int64_t n, planrt_dtype_t t, double value, int stream)
{
	if (n <= 0)
		return;
	cudaStream_t s = planrt_cu_stream(stream);
	/* +0 is all zero bits in every type planrt stores (the step's gradient clears, bf16 ones too) */
	if (value == 0 && !signbit(value)) {
		planrt_cu_check_(cudaMemsetAsync(dst, 0, (size_t)n * planrt_dtype_size(t), s), "cudaMemsetAsync");
		return;
	}
	if (t == planrt_i32 && !(value >= INT32_MIN && value <= INT32_MAX && value == floor(value)))
		planrt_fatal("planrt_fill: %g is not an i32 value", value);
	if (t == planrt_u8 && !(value >= 0 && value <= 255 && value == floor(value)))
		planrt_fatal("planrt_fill: %g is not a u8 value", value);
	uint16_t half = t == planrt_bf16 || t == planrt_f16 ? host_half_of(value, t) : 0;
	LAUNCH(fill_kernel, n, stream, dst, n, (int)t, value, half, (int32_t)(t == planrt_i32 || t == planrt_u8 ? value : 0));
}

__device__ static double load_as_double(const void *p, int t, int64_t i)
{
	switch (t) {
	case planrt_f32: return ((const float *)p)[i];
	case planrt_f64: return ((const double *)p)[i];
	default: return half_f32(((const uint16_t *)p)[i], t);
	}
}

/* Casts with f64 at one end: through double (exact), a half type rounded once from f64 by way of
 * round-to-odd f32 */
__global__ static void cast_f64_kernel(const void *src, int from, void *dst, int to, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		if (to == planrt_f32)
			((float *)dst)[i] = (float)((const double *)src)[i];
		else if (to == planrt_f64)
			((double *)dst)[i] = load_as_double(src, from, i);
		else
			((uint16_t *)dst)[i] = f32_half(f32_round_odd(((const double *)src)[i]), to);
	}
}

/* A half type widened to f32 (exact) and f32 rounded to a half type (nearest even): one kernel per
 * pair, in f32, eight elements (16 bytes of halves) per thread when the pointers are aligned. */
template <int HALF> __global__ static void widen_kernel(const uint16_t *src, float *dst, int64_t n)
{
	int64_t n8 = ((uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0) ? n / 8 : 0;
	GRID_STRIDE(j, n8)
	{
		uint4 h = ((const uint4 *)src)[j];
		const uint16_t *hv = (const uint16_t *)&h;
		float4 a, b;
		a.x = half_f32(hv[0], HALF), a.y = half_f32(hv[1], HALF), a.z = half_f32(hv[2], HALF), a.w = half_f32(hv[3], HALF);
		b.x = half_f32(hv[4], HALF), b.y = half_f32(hv[5], HALF), b.z = half_f32(hv[6], HALF), b.w = half_f32(hv[7], HALF);
		((float4 *)dst)[2 * j] = a;
		((float4 *)dst)[2 * j + 1] = b;
	}
	GRID_STRIDE(i, n - n8 * 8)
	dst[n8 * 8 + i] = half_f32(src[n8 * 8 + i], HALF);
}

template <int HALF> __global__ static void narrow_kernel(const float *src, uint16_t *dst, int64_t n)
{
	int64_t n8 = ((uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0) ? n / 8 : 0;
	GRID_STRIDE(j, n8)
	{
		float4 a = ((const float4 *)src)[2 * j], b = ((const float4 *)src)[2 * j + 1];
		uint4 h;
		uint16_t *hv = (uint16_t *)&h;
		hv[0] = f32_half(a.x, HALF), hv[1] = f32_half(a.y, HALF), hv[2] = f32_half(a.z, HALF), hv[3] = f32_half(a.w, HALF);
		hv[4] = f32_half(b.x, HALF), hv[5] = f32_half(b.y, HALF), hv[6] = f32_half(b.z, HALF), hv[7] = f32_half(b.w, HALF);
		((uint4 *)dst)[j] = h;
	}
	GRID_STRIDE(i, n - n8 * 8)
	dst[n8 * 8 + i] = f32_half(src[n8 * 8 + i], HALF);
}

/* one half type to the other, through f32 (exact widening, one rounding) */
__global__ static void bf16_f16_kernel(const uint16_t *src, uint16_t *dst, int64_t n)
{
	GRID_STRIDE(i, n)
	dst[i] = f32_f16(bf16_f32(src[i]));
}

__global__ static void f16_bf16_kernel(const uint16_t *src, uint16_t *dst, int64_t n)
{
	GRID_STRIDE(i, n)
	dst[i] = f32_bf16(f16_f32(src[i]));
}

static int is_float(planrt_dtype_t t)
{
	return t == planrt_f32 || t == planrt_f64 || t == planrt_bf16 || t == planrt_f16;
}

void planrt_cu_cast(const void *src, planrt_dtype_t from, void *dst, planrt_dtype_t to, int64_t n, int stream)
{
	if (n <= 0)
		return;
	if (from == to) {
		planrt_cu_check_(cudaMemcpyAsync(dst, src, (size_t)n * planrt_dtype_size(from), cudaMemcpyDefault,
						 planrt_cu_stream(stream)),
				 "cudaMemcpyAsync");
		return;
	}
	if (!is_float(from) || !is_float(to))
		planrt_fatal("planrt_cast: no cast from dtype %d to %d (casts are among f32, bf16, f16 and f64)", (int)from,
			     (int)to);
	const uint16_t *hs = (const uint16_t *)src;
	uint16_t *hd = (uint16_t *)dst;
	if (from == planrt_f64 || to == planrt_f64)
		LAUNCH(cast_f64_kernel, n, stream, src, (int)from, dst, (int)to, n);
	else if (from == planrt_bf16 && to == planrt_f32)
		LAUNCH(widen_kernel<planrt_bf16>, n, stream, hs, (float *)dst, n);
	else if (from == planrt_f16 && to == planrt_f32)
		LAUNCH(widen_kernel<planrt_f16>, n, stream, hs, (float *)dst, n);
	else if (from == planrt_f32 && to == planrt_bf16)
		LAUNCH(narrow_kernel<planrt_bf16>, n, stream, (const float *)src, hd, n);
	else if (from == planrt_f32 && to == planrt_f16)
		LAUNCH(narrow_kernel<planrt_f16>, n, stream, (const float *)src, hd, n);
	else if (from == planrt_bf16)
		LAUNCH(bf16_f16_kernel, n, stream, hs, hd, n);
	else
		LAUNCH(f16_bf16_kernel, n, stream, hs, hd, n);
}

__global__ static void accumulate_kernel(void *dst, const void *src, int t, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		if (t == planrt_f32)
			((float *)dst)[i] += ((const float *)src)[i];
		else if (t == planrt_f64)
			((double *)dst)[i] += ((const double *)src)[i];
		else
			((uint16_t *)dst)[i] = f32_half(half_f32(((uint16_t *)dst)[i], t) + half_f32(((const uint16_t *)src)[i], t), t);
	}
}

void planrt_cu_accumulate(void *dst, const void *src, int64_t n, planrt_dtype_t t, int stream)
{
	if (t == planrt_i32 || t == planrt_u8)
		planrt_fatal("planrt_accumulate: integer buffers are not accumulated (f32, bf16, f16 or f64)");
	LAUNCH(accumulate_kernel, n, stream, dst, src, (int)t, n);
}

__global__ static void accumulate_f32_kernel(void *dst, int t, const float *src, int64_t n)
{
	GRID_STRIDE(i, n)
	{
		if (t == planrt_f32)
			((float *)dst)[i] += src[i];
		else
			((uint16_t *)dst)[i] = f32_half(half_f32(((uint16_t *)dst)[i], t) + src[i], t);
	}
}

void planrt_cu_accumulate_f32_(void *dst, planrt_dtype_t t, const float *src, int64_t n, int stream)
{
	if (t != planrt_f32 && t != planrt_bf16 && t != planrt_f16)
		planrt_fatal("planrt_accumulate_f32: into dtype %d (f32, bf16 or f16)", (int)t);
	LAUNCH(accumulate_f32_kernel, n, stream, dst, (int)t, src, n);
}

/* A multi-tensor table (planrt_cuda.h): whether its device copy holds these count entries of
 * `bytes` bytes in all. If not, the old copy is freed (after the launches that may read it) and a
 * host copy of the new entries kept; the caller then checks them and calls table_upload. */
static bool table_current(planrt_cu_table_t *t, const void *entries, size_t bytes, int count, int stream)
{
	if (t->host && t->count == count && memcmp(t->host, entries, bytes) == 0)
		return true;
	if (t->host) {
		planrt_cu_check_(cudaStreamSynchronize(planrt_cu_stream(stream)), "cudaStreamSynchronize");
		cudaFree(t->entries);
		cudaFree(t->prefix);
		free(t->host);
	}
	t->host = malloc(bytes);
	if (!t->host)
		planrt_fatal("planrt_cuda: out of host memory for a table of %d tensors", count);
	memcpy(t->host, entries, bytes);
	t->count = count;
	return false;
}

static void *upload(const void *host, size_t bytes)
{
	void *dev;
	planrt_cu_check_(cudaMalloc(&dev, bytes), "cudaMalloc (multi-tensor table)");
	planrt_cu_check_(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (multi-tensor table)");
	return dev;
}

/* the device copy: the entries, and the prefix of each one's blocks (planrt_cu_grid of its n) */
static void table_upload(planrt_cu_table_t *t, const int64_t *ns, size_t n_stride, const char *what)
{
	int64_t *prefix = (int64_t *)malloc(sizeof(int64_t) * (size_t)(t->count + 1));
	if (!prefix)
		planrt_fatal("%s: out of host memory for a table of %d tensors", what, t->count);
	prefix[0] = 0;
	for (int e = 0; e < t->count; e++)
		prefix[e + 1] = prefix[e] + (int64_t)planrt_cu_grid(*(const int64_t *)((const char *)ns + n_stride * (size_t)e));
	if (prefix[t->count] > 0x7fffffff)
		planrt_fatal("%s: %lld blocks in one launch", what, (long long)prefix[t->count]);
	t->entries = upload(t->host, n_stride * (size_t)t->count);
	t->prefix = (int64_t *)upload(prefix, sizeof(int64_t) * (size_t)(t->count + 1));
	t->blocks = prefix[t->count];
	free(prefix);
}

/* *acc += weight * the sum of x^2 (in double), from partial sums per block added in one block */
__global__ static void sumsq_kernel(const void *x, int t, int64_t n, double *partial)
{
	double s = 0;
	GRID_STRIDE(i, n)
	{
		double v = load_as_double(x, t, i);
		s += v * v;
	}
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		partial[blockIdx.x] = s;
}

__global__ static void sumsq_finish_kernel(const double *partial, int nblocks, double *acc, double weight)
{
	double s = 0;
	for (int b = threadIdx.x; b < nblocks; b += blockDim.x)
		s += partial[b];
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		*acc += weight * s;
}

/* the partial sums: one device buffer per stream, grown as needed (cuBLAS-style workspace) */
static double *partials[16];
static unsigned npartials[16];

static double *partials_for(int stream, unsigned blocks)
{
	int k = stream < 16 ? stream : 15;
	if (npartials[k] < blocks) {
		if (partials[k]) {
			planrt_cu_check_(cudaStreamSynchronize(planrt_cu_stream(stream)), "cudaStreamSynchronize");
			cudaFree(partials[k]);
		}
		planrt_cu_check_(cudaMalloc((void **)&partials[k], sizeof(double) * blocks), "cudaMalloc (partial sums)");
		npartials[k] = blocks;
	}
	return partials[k];
}

static void sum_squares(double *acc, const void *x, int64_t n, planrt_dtype_t t, double weight, int stream)
{
	if (t != planrt_f32 && t != planrt_bf16 && t != planrt_f16)
		planrt_fatal("planrt_sum_squares_acc: dtype %d input (f32, bf16 or f16)", (int)t);
	cudaStream_t s = planrt_cu_stream(stream);
	unsigned blocks = planrt_cu_grid(n > 0 ? n : 1);
	double *partial = partials_for(stream, blocks);
	sumsq_kernel<<<blocks, PLANRT_CU_BLOCK, 0, s>>>(x, (int)t, n, partial);
	planrt_cu_check_launch("sum_squares");
	sumsq_finish_kernel<<<1, PLANRT_CU_BLOCK, 0, s>>>(partial, (int)blocks, acc, weight);
	planrt_cu_check_launch("sum_squares");
}

/* the multi-tensor sum of squares: each block of each tensor's own launch writes the partial sum the
 * per-tensor kernel's block writes (planrt_om_sumsq_thread on the same elements, the same block
 * reduction), then one block adds each tensor's partial sums and its weighted total to *acc in
 * the table's order: the numbers of one planrt_cu_sum_squares_acc per tensor, bit for bit */
__global__ static void sumsq_multi_kernel(const planrt_om_sq_entry_t *entries, const int64_t *prefix, int count,
					  double *partial)
{
	int e = planrt_om_tensor_of(prefix, count, blockIdx.x);
	double s = planrt_om_sumsq_thread(&entries[e], planrt_om_first(prefix, e, blockIdx.x, threadIdx.x),
					  planrt_om_stride(prefix, e));
	s = block_sum_d(s);
	if (threadIdx.x == 0)
		partial[blockIdx.x] = s;
}

__global__ static void sumsq_multi_finish_kernel(const planrt_om_sq_entry_t *entries, const int64_t *prefix,
						 int count, const double *partial, double *acc)
{
	for (int e = 0; e < count; e++) {
		double s = 0;
		for (int64_t b = prefix[e] + threadIdx.x; b < prefix[e + 1]; b += blockDim.x)
			s += partial[b];
		s = block_sum_d(s);
		if (threadIdx.x == 0)
			*acc += entries[e].weight * s;
	}
}

void planrt_cu_sum_squares_multi(planrt_cu_table_t *table, const planrt_om_sq_entry_t *entries, int count,
				 double *acc, int stream)
{
	if (count <= 0)
		return;
	if (!table_current(table, entries, sizeof(planrt_om_sq_entry_t) * (size_t)count, count, stream)) {
		for (int e = 0; e < count; e++)
			if (entries[e].t != planrt_f32 && entries[e].t != planrt_bf16 && entries[e].t != planrt_f16)
				planrt_fatal("planrt_sum_squares_multi: dtype %d input (f32, bf16 or f16)", entries[e].t);
		table_upload(table, &entries[0].n, sizeof(planrt_om_sq_entry_t), "planrt_sum_squares_multi");
	}
	cudaStream_t s = planrt_cu_stream(stream);
	double *partial = partials_for(stream, (unsigned)table->blocks);
	const planrt_om_sq_entry_t *dev = (const planrt_om_sq_entry_t *)table->entries;
	sumsq_multi_kernel<<<(unsigned)table->blocks, PLANRT_CU_BLOCK, 0, s>>>(dev, table->prefix, count, partial);
	planrt_cu_check_launch("sum_squares_multi");
	sumsq_multi_finish_kernel<<<1, PLANRT_CU_BLOCK, 0, s>>>(dev, table->prefix, count, partial, acc);
	planrt_cu_check_launch("sum_squares_multi");
}

void planrt_cu_sum_squares_acc(double *acc, const void *x, int64_t n, planrt_dtype_t t, double weight, int stream)
{
	if (n < 0)
		planrt_fatal("planrt_sum_squares_acc: negative element count %lld", (long long)n);
	sum_squares(acc, x, n, t, weight, stream);
}

void planrt_cu_sum_squares_shard(double *acc, const void *shard, planrt_dtype_t t, int64_t lo, int64_t n, int nseg,
				 const int64_t *seg_off, const int64_t *seg_len, const int64_t *replicas, int stream)
{
	size_t elem = t == planrt_f32 ? 4 : 2;
	for (int i = 0; i < nseg; i++) {
		if (replicas[i] <= 0)
			continue;
		int64_t a = seg_off[i] > lo ? seg_off[i] : lo;
		int64_t b = seg_off[i] + seg_len[i] < lo + n ? seg_off[i] + seg_len[i] : lo + n;
		if (b <= a)
			continue;
		sum_squares(acc, (const char *)shard + (size_t)(a - lo) * elem, b - a, t, 1.0 / (double)replicas[i], stream);
	}
}

__global__ static void clip_coef_kernel(const double *sumsq, double *norm, double *coef, double max_norm)
{
	*norm = sqrt(*sumsq);
	*coef = max_norm > 0 && *norm > max_norm ? max_norm / (*norm + 1e-6) : 1.0;
}

void planrt_cu_clip_coef(const double *sumsq, double *norm, double *coef, double max_norm, int stream)
{
	clip_coef_kernel<<<1, 1, 0, planrt_cu_stream(stream)>>>(sumsq, norm, coef, max_norm);
	planrt_cu_check_launch("clip_coef");
}

__global__ static void loss_accumulate_kernel(double *acc, const float *loss, double scale)
{
	*acc += scale * (double)*loss;
}

void planrt_cu_loss_accumulate(double *acc, const float *loss, double scale, int stream)
{
	loss_accumulate_kernel<<<1, 1, 0, planrt_cu_stream(stream)>>>(acc, loss, scale);
	planrt_cu_check_launch("loss_accumulate");
}

__global__ static void scale_metric_kernel(double *x, double f)
{
	*x *= f;
}

void planrt_cu_scale_metric(double *x, double f, int stream)
{
	scale_metric_kernel<<<1, 1, 0, planrt_cu_stream(stream)>>>(x, f);
	planrt_cu_check_launch("scale_metric");
}

/* ------------------------------------------------------------------ the optimizer (optim.c's update)
 * planrt_optim_math.h's element update, per tensor or over a table of tensors in one launch */

static_assert((int)planrt_bf16 == (int)PLANRT_SM_BF16 && (int)planrt_f16 == (int)PLANRT_SM_F16, "planrt_om_grad's dtypes");
static_assert((int)planrt_opt_sgd == (int)PLANRT_OM_SGD && (int)planrt_opt_momentum == (int)PLANRT_OM_MOMENTUM,
	      "the optimizer kinds");
static_assert((int)PLANRT_OM_BLOCK == (int)PLANRT_CU_BLOCK, "the multi-tensor block");

/* the clipping coefficient, read once per block (NULL: 1) */
__device__ static double coef_of_block(const double *coef)
{
	__shared__ double k_shared;
	if (threadIdx.x == 0)
		k_shared = coef ? *coef : 1.0;
	__syncthreads();
	return k_shared;
}

__global__ static void optimizer_kernel(planrt_om_scalars_t o, planrt_om_entry_t x, const double *coef)
{
	double k = coef_of_block(coef);
	planrt_om_thread(&o, &x, k, (int64_t)blockIdx.x * blockDim.x + threadIdx.x, (int64_t)gridDim.x * blockDim.x);
}

/* one block per block of each tensor's own launch: the same threads see the same elements */
__global__ static void optimizer_multi_kernel(planrt_om_scalars_t o, const planrt_om_entry_t *entries,
					      const int64_t *prefix, int count, const double *coef)
{
	double k = coef_of_block(coef);
	int e = planrt_om_tensor_of(prefix, count, blockIdx.x);
	planrt_om_thread(&o, &entries[e], k, planrt_om_first(prefix, e, blockIdx.x, threadIdx.x),
			 planrt_om_stride(prefix, e));
}

/* the scalars as optim.c computes them, for step + 1; Adam's t counts the steps that updated
 * (step.c: the schedule's step does not) */
static planrt_om_scalars_t step_scalars(int kind, double lr, double beta1, double beta2, double eps,
					double weight_decay, double momentum, int64_t warmup, int64_t total, double min_lr,
					int64_t step)
{
	if (kind < planrt_opt_sgd || kind > planrt_opt_adamw)
		planrt_fatal("planrt_optimizer_step: unknown optimizer kind %d", kind);
	double lr_t = planrt_lr_at(lr, step, warmup, total, min_lr);
	step -= planrt_steps_skipped_;
	return planrt_om_scalars(kind, lr_t, (double)(step + 1), beta1, beta2, eps, weight_decay, momentum,
				 kind == planrt_opt_adamw);
}

static void check_grad_dtype(int gt)
{
	if (gt != planrt_f32 && gt != planrt_bf16 && gt != planrt_f16)
		planrt_fatal("planrt_optimizer_step: dtype %d gradients (f32, bf16 or f16)", gt);
}

void planrt_cu_optimizer_step(int kind, double lr, double beta1, double beta2, double eps, double weight_decay,
			      double momentum, int64_t warmup, int64_t total, double min_lr, int64_t step, float *param,
			      const void *grad, planrt_dtype_t gt, float *m, float *v, int64_t n, const double *coef,
			      int stream)
{
	check_grad_dtype((int)gt);
	planrt_om_scalars_t o =
		step_scalars(kind, lr, beta1, beta2, eps, weight_decay, momentum, warmup, total, min_lr, step);
	planrt_om_entry_t x = {param, grad, m, v, NULL, n, (int32_t)gt, 0};
	LAUNCH(optimizer_kernel, n, stream, o, x, coef);
}

/* the table's device copy of count entries: uploaded at the first call, again only if they change */
static void opt_table_build(planrt_cu_table_t *table, const planrt_om_entry_t *entries, int count, int stream)
{
	if (table_current(table, entries, sizeof(planrt_om_entry_t) * (size_t)count, count, stream))
		return;
	for (int e = 0; e < count; e++) {
		check_grad_dtype(entries[e].gt);
		if (entries[e].low && entries[e].low_t != planrt_bf16 && entries[e].low_t != planrt_f16)
			planrt_fatal("planrt_optimizer_multi: a dtype %d parameter copy (bf16 or f16)", entries[e].low_t);
	}
	table_upload(table, &entries[0].n, sizeof(planrt_om_entry_t), "planrt_optimizer_multi");
}

void planrt_cu_optimizer_multi(planrt_cu_table_t *table, const planrt_om_entry_t *entries, int count, int kind,
			       double lr, double beta1, double beta2, double eps, double weight_decay, double momentum,
			       int64_t warmup, int64_t total, double min_lr, int64_t step, const double *coef, int stream)
{
	if (count <= 0)
		return;
	planrt_om_scalars_t o =
		step_scalars(kind, lr, beta1, beta2, eps, weight_decay, momentum, warmup, total, min_lr, step);
	opt_table_build(table, entries, count, stream);
	optimizer_multi_kernel<<<(unsigned)table->blocks, PLANRT_CU_BLOCK, 0, planrt_cu_stream(stream)>>>(
		o, (const planrt_om_entry_t *)table->entries, table->prefix, count, coef);
	planrt_cu_check_launch("optimizer_multi");
}
