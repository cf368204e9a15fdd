/* attention_rate.cu: the fused attention's rates on the GPU, issue 18's table: planrt_cu_k_attention_16
 * and _grad_16 (the kernels a bf16 program runs: the tiles, or the exact kernels under
 * PLANRT_ATTENTION=exact) on random bf16 q, k, v, dout of B x H = 2 x 16 heads,
 * causal, at head dims 64 and 128 and each S given (1024 4096 16384 by default). Per shape one call
 * of each to warm up, then as many as fit in about two seconds (at least one), timed with CUDA
 * events. FLOPs as FlashAttention counts them: forward 4 S^2 Dh a head, backward 10 S^2 Dh (2.5
 * times), both halved by the causal mask. Prints one line a shape,
 *   "planc attention causal S <S> D <Dh>: fwd <ms> ms <rate> TFLOP/s, bwd <ms> ms <rate> TFLOP/s",
 * which scripts/gpu-check.sh sets beside PyTorch SDPA's (bench/gpu/torch_attention.py, the same
 * format). Exit status 1 on a CUDA error or a non-finite output. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                     \
	do {                                                                                         \
		cudaError_t e_ = (x);                                                                \
		if (e_ != cudaSuccess) {                                                             \
			fprintf(stderr, "attention_rate: %s: %s\n", #x, cudaGetErrorString(e_));     \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)

enum { BATCH = 2, HEADS = 16 };

__global__ static void fill_random(__nv_bfloat16 *x, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
		x[i] = __float2bfloat16(((float)(h & 0xffff) / 65536.0f - 0.5f));
	}
}

/* the buffers of one shape */
typedef struct Bufs {
	__nv_bfloat16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
	float *lse;
} Bufs;

static void alloc_bufs(Bufs *b, size_t n, size_t rows)
{
	__nv_bfloat16 **all[] = {&b->q, &b->k, &b->v, &b->out, &b->dout, &b->dq, &b->dk, &b->dv};
	for (int i = 0; i < 8; i++) {
		CHECK(cudaMalloc(all[i], n * sizeof(__nv_bfloat16)));
		fill_random<<<1024, 256>>>(*all[i], n, 17u * (unsigned)i + 1u);
	}
	CHECK(cudaMalloc(&b->lse, rows * sizeof(float)));
	CHECK(cudaGetLastError());
}

static void free_bufs(Bufs *b)
{
	void *all[] = {b->q, b->k, b->v, b->out, b->dout, b->dq, b->dk, b->dv, b->lse};
	for (int i = 0; i < 9; i++)
		CHECK(cudaFree(all[i]));
}

/* one call of the forward (grad 0) or the backward (grad 1) */
static void call(const Bufs *b, int64_t S, int64_t D, int grad)
{
	int64_t ldims[4] = {BATCH, HEADS, S, D}, gdims[4] = {BATCH, HEADS, S, S};
	int64_t offs[8] = {0, 0, 0, 0, BATCH / 2, HEADS / 2, S / 2, S / 2}, mstr[4] = {0, 0, 0, 0};
	double scale = 1 / sqrt((double)D);
	if (grad)
		planrt_cu_k_attention_grad_16(b->q, b->k, b->v, NULL, mstr, b->out, b->lse, b->dout, b->dq, b->dk, b->dv, 4, ldims,
					      HEADS, S, scale, 1, 0.0, 0, 0, gdims, offs, NULL, planrt_bf16,
					      PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_attention_16(b->q, b->k, b->v, NULL, mstr, b->out, b->lse, 4, ldims, HEADS, S, scale, 1, 0.0, 0, 0,
					 gdims, offs, NULL, planrt_bf16, PLANRT_STREAM_COMPUTE);
}

/* milliseconds a call: one to warm up, then about two seconds' worth */
static double time_calls(const Bufs *b, int64_t S, int64_t D, int grad)
{
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMPUTE);
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	call(b, S, D, grad);
	CHECK(cudaEventRecord(e0, s));
	call(b, S, D, grad);
	CHECK(cudaEventRecord(e1, s));
	CHECK(cudaEventSynchronize(e1));
	float one;
	CHECK(cudaEventElapsedTime(&one, e0, e1));
	int reps = one > 0 ? (int)(2000 / one) : 10;
	reps = reps < 1 ? 1 : reps > 20 ? 20 : reps;
	CHECK(cudaEventRecord(e0, s));
	for (int i = 0; i < reps; i++)
		call(b, S, D, grad);
	CHECK(cudaEventRecord(e1, s));
	CHECK(cudaEventSynchronize(e1));
	float ms;
	CHECK(cudaEventElapsedTime(&ms, e0, e1));
	CHECK(cudaEventDestroy(e0));
	CHECK(cudaEventDestroy(e1));
	return ms / reps;
}

/* the output is finite (a kernel that failed silently leaves NaNs or garbage) */
static int finite_output(const Bufs *b, size_t n)
{
	size_t m = n < 4096 ? n : 4096;
	__nv_bfloat16 *h = (__nv_bfloat16 *)malloc(m * sizeof(__nv_bfloat16));
	CHECK(cudaMemcpy(h, b->out, m * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
	int ok = 1;
	for (size_t i = 0; i < m; i++)
		ok &= isfinite(__bfloat162float(h[i])) != 0;
	free(h);
	return ok;
}

int main(int argc, char **argv)
{
	int64_t sizes[16] = {1024, 4096, 16384}, nsizes = 3;
	if (argc > 1) {
		nsizes = 0;
		for (int i = 1; i < argc && nsizes < 16; i++)
			sizes[nsizes++] = atoll(argv[i]);
	}
	int failed = 0;
	for (int64_t si = 0; si < nsizes; si++) {
		for (int64_t D = 64; D <= 128; D += 64) {
			int64_t S = sizes[si];
			size_t n = (size_t)(BATCH * HEADS * S * D);
			Bufs b;
			alloc_bufs(&b, n, (size_t)(BATCH * HEADS * S));
			double fwd = time_calls(&b, S, D, 0), bwd = time_calls(&b, S, D, 1);
			double flops = 4.0 * (double)S * (double)S * (double)D * BATCH * HEADS / 2; /* causal */
			printf("planc attention causal S %lld D %lld: fwd %.3f ms %.2f TFLOP/s, bwd %.3f ms %.2f TFLOP/s\n",
			       (long long)S, (long long)D, fwd, flops / fwd / 1e9, bwd, 2.5 * flops / bwd / 1e9);
			fflush(stdout);
			if (!finite_output(&b, n)) {
				printf("FAIL: non-finite attention output at S %lld D %lld\n", (long long)S, (long long)D);
				failed = 1;
			}
			free_bufs(&b);
		}
	}
	return failed;
}
