/* bench_attention.h: what the two GPU benchmarks that time planc's attention share
 * (attention_rate.cu: issue 18's table; calibrate_gpu.cu: explain's attention rate), so that both
 * time the same call: a checked CUDA call, random 16-bit operands, one shape's buffers, and one call
 * of planrt_cu_k_attention_16 (forward) or _grad_16 (backward) as a bf16 / f16 program makes it,
 * causal, B x H = 2 x 16 heads, the rows in one run (the tiles take it where they apply). */
#ifndef BENCH_GPU_BENCH_ATTENTION_H
#define BENCH_GPU_BENCH_ATTENTION_H

#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_half.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* the program's name in its error messages (each program defines it) */
static const char *bench_name;

#define BENCH_CHECK(x)                                                                               \
	do {                                                                                         \
		cudaError_t e_ = (x);                                                                \
		if (e_ != cudaSuccess) {                                                             \
			fprintf(stderr, "%s: %s: %s\n", bench_name, #x, cudaGetErrorString(e_));     \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)

enum { BENCH_BATCH = 2, BENCH_HEADS = 16 };

/* n values in [-0.5, 0.5) of type t (bf16 or f16), a hash of the index and seed */
__global__ static void bench_fill_random(uint16_t *x, size_t n, unsigned seed, int f16)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned h = (unsigned)i * 2654435761u ^ seed;
		h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
		float v = (float)(h & 0xffff) / 65536.0f - 0.5f;
		x[i] = f16 ? __half_as_ushort(__float2half(v)) : __bfloat16_as_ushort(__float2bfloat16(v));
	}
}

/* a device buffer of n random values of type t */
static uint16_t *bench_random(size_t n, planrt_dtype_t t, unsigned seed)
{
	uint16_t *p = NULL;
	BENCH_CHECK(cudaMalloc(&p, n * 2));
	bench_fill_random<<<1024, 256>>>(p, n, seed, t == planrt_f16);
	BENCH_CHECK(cudaGetLastError());
	return p;
}

/* one shape's operands and results */
typedef struct BenchAttn {
	int64_t S, D;
	planrt_dtype_t t;
	uint16_t *q, *k, *v, *out, *dout, *dq, *dk, *dv;
	float *lse;
} BenchAttn;

static void bench_attn_alloc(BenchAttn *a, int64_t S, int64_t D, planrt_dtype_t t)
{
	size_t n = (size_t)(BENCH_BATCH * BENCH_HEADS * S * D);
	a->S = S;
	a->D = D;
	a->t = t;
	uint16_t **all[] = {&a->q, &a->k, &a->v, &a->out, &a->dout, &a->dq, &a->dk, &a->dv};
	for (int i = 0; i < 8; i++)
		*all[i] = bench_random(n, t, 17u * (unsigned)i + 1u);
	BENCH_CHECK(cudaMalloc(&a->lse, sizeof(float) * BENCH_BATCH * BENCH_HEADS * S));
}

static void bench_attn_free(BenchAttn *a)
{
	void *all[] = {a->q, a->k, a->v, a->out, a->dout, a->dq, a->dk, a->dv, a->lse};
	for (int i = 0; i < 9; i++)
		BENCH_CHECK(cudaFree(all[i]));
}

/* one call of the forward (grad 0) or the backward (grad 1) */
static void bench_attn_call(const BenchAttn *a, int grad)
{
	int64_t S = a->S, D = a->D;
	int64_t ldims[4] = {BENCH_BATCH, BENCH_HEADS, S, D}, gdims[4] = {BENCH_BATCH, BENCH_HEADS, S, S};
	int64_t offs[8] = {0, 0, 0, 0, BENCH_BATCH / 2, BENCH_HEADS / 2, S / 2, D / 2}, mstr[4] = {0, 0, 0, 0};
	double scale = 1 / sqrt((double)D);
	if (grad)
		planrt_cu_k_attention_grad_16(a->q, a->k, a->v, NULL, mstr, a->out, a->lse, a->dout, a->dq, a->dk, a->dv, 4,
					      ldims, BENCH_HEADS, S, scale, 1, 0.0, 0, 0, gdims, offs, NULL, a->t,
					      PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_attention_16(a->q, a->k, a->v, NULL, mstr, a->out, a->lse, 4, ldims, BENCH_HEADS, S, scale, 1, 0.0,
					 0, 0, gdims, offs, NULL, a->t, PLANRT_STREAM_COMPUTE);
}

/* FLOPs of a call as FlashAttention and explain count them: forward 2 products of S^2 Dh a head,
 * backward 5, 2 FLOPs a multiply-add, halved by the causal mask */
static double bench_attn_flops(const BenchAttn *a, int grad)
{
	return (grad ? 5.0 : 2.0) * 2.0 * (double)a->S * a->S * a->D * BENCH_BATCH * BENCH_HEADS / 2;
}

#endif
