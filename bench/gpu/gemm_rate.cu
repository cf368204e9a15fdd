/* gemm_rate.cu: the GPU's bf16 GEMM rate through cuBLAS, the ceiling scripts/gpu-check.sh takes MFU
 * against. C[M, N] = A[M, K] B[K, N] with bf16 operands and f32 accumulation (cublasGemmEx,
 * CUBLAS_COMPUTE_32F), on random data, M = N = K = 8192 unless given: three products to warm up,
 * then the mean of ten timed with CUDA events. Prints one line: "bf16 gemm M N K: T TFLOP/s". */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                     \
	do {                                                                                         \
		cudaError_t e_ = (x);                                                                \
		if (e_ != cudaSuccess) {                                                             \
			fprintf(stderr, "gemm_rate: %s: %s\n", #x, cudaGetErrorString(e_));          \
			return 1;                                                                    \
		}                                                                                    \
	} while (0)
#define BCHECK(x)                                                                                    \
	do {                                                                                         \
		cublasStatus_t s_ = (x);                                                             \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
			fprintf(stderr, "gemm_rate: %s: %s\n", #x, cublasGetStatusString(s_));       \
			return 1;                                                                    \
		}                                                                                    \
	} while (0)

__global__ static void fill_random(__nv_bfloat16 *x, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
		x[i] = __float2bfloat16(((float)(h & 0xffff) / 65536.0f - 0.5f));
	}
}

int main(int argc, char **argv)
{
	int M = argc > 1 ? atoi(argv[1]) : 8192, N = argc > 2 ? atoi(argv[2]) : M, K = argc > 3 ? atoi(argv[3]) : M;
	__nv_bfloat16 *A, *B;
	float *C;
	CHECK(cudaMalloc(&A, sizeof *A * (size_t)M * K));
	CHECK(cudaMalloc(&B, sizeof *B * (size_t)K * N));
	CHECK(cudaMalloc(&C, sizeof *C * (size_t)M * N));
	fill_random<<<1024, 256>>>(A, (size_t)M * K, 1u);
	fill_random<<<1024, 256>>>(B, (size_t)K * N, 2u);
	CHECK(cudaDeviceSynchronize());
	cublasHandle_t h;
	BCHECK(cublasCreate(&h));
	float one = 1, zero = 0;
	cudaEvent_t t0, t1;
	CHECK(cudaEventCreate(&t0));
	CHECK(cudaEventCreate(&t1));
	for (int r = 0; r < 13; r++) {
		if (r == 3)
			CHECK(cudaEventRecord(t0));
		BCHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N, A, CUDA_R_16BF, K, &zero, C,
				    CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	}
	CHECK(cudaEventRecord(t1));
	CHECK(cudaEventSynchronize(t1));
	float ms = 0;
	CHECK(cudaEventElapsedTime(&ms, t0, t1));
	double tflops = 2.0 * M * N * K * 10 / (ms * 1e-3) / 1e12;
	printf("bf16 gemm %d %d %d: %.1f TFLOP/s\n", M, N, K, tflops);
	return 0;
}
