/* permute_rate.cu: the bandwidth of the CUDA permute and sum_to at gpt350m's shapes (bf16: the
 * split and merge of heads, 193 permutes a step with the classifier's transpose; the bias
 * gradients, 145 sum_to_acc_16 a step: into an f32 accumulator, chunks of rows added atomically,
 * which the step then narrows, and into the bf16 gradient itself in one 32 x 32 tile a 32 columns,
 * which a bf16 plan's step runs; and llama1b's RoPE, 80 calls a step), against a device-to-device copy
 * of the same bytes.
 * scripts/gpu-check.sh runs it twice, with the planned 32-bit index arithmetic (the default) and
 * with PLANRT_INDEX=64 (the 64-bit division of every index it replaced), so the two stand side by
 * side in one run. Each shape: two calls to warm up, then 20 timed with CUDA events. Prints one
 * line a shape: "<what>: <us> us, <GB/s> GB/s (<share> of the copy's)" where the bytes are those
 * read and written once. Exit status 1 on a CUDA error. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                                     \
	do {                                                                                         \
		cudaError_t e_ = (x);                                                                \
		if (e_ != cudaSuccess) {                                                             \
			fprintf(stderr, "permute_rate: %s: %s\n", #x, cudaGetErrorString(e_));        \
			exit(1);                                                                     \
		}                                                                                    \
	} while (0)

enum { WARM = 2, REPS = 20 };

typedef struct Shape {
	const char *what;
	int kind; /* 0 permute_16, 1 sum_to_acc_16 into f32, 2 the copy, 3 sum_to_acc_16 into bf16, 4 rope_16
		   * of dims [batch, heads, seq, head_dim] (llama1b's, heads first, every dim rotated) */
	int rank;
	int64_t dims[4];
	int perm[4];
	int64_t ostr[4];
} Shape;

static void *in_, *out_;

static void call(const Shape *s, size_t bytes)
{
	if (s->kind == 0)
		planrt_cu_k_permute_16(s->rank, s->dims, s->perm, in_, out_, PLANRT_STREAM_COMPUTE);
	else if (s->kind == 4)
		planrt_cu_k_rope_16(in_, out_, s->dims[0], s->dims[2], s->dims[1], s->dims[3], s->dims[3], 1, NULL, 0, 0,
				    s->dims[2] / 2, 1e4, planrt_bf16, PLANRT_STREAM_COMPUTE);
	else if (s->kind == 1 || s->kind == 3)
		planrt_cu_k_sum_to_acc_16(s->rank, s->dims, in_, s->ostr, out_, s->dims[s->rank - 1],
					  s->kind == 1 ? planrt_f32 : planrt_bf16, planrt_bf16, PLANRT_STREAM_COMPUTE);
	else
		CHECK(cudaMemcpyAsync(out_, in_, bytes, cudaMemcpyDeviceToDevice, planrt_cu_stream(PLANRT_STREAM_COMPUTE)));
}

/* microseconds a call */
static double time_us(const Shape *s, size_t bytes)
{
	cudaStream_t st = planrt_cu_stream(PLANRT_STREAM_COMPUTE);
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	for (int i = 0; i < WARM; i++)
		call(s, bytes);
	CHECK(cudaEventRecord(e0, st));
	for (int i = 0; i < REPS; i++)
		call(s, bytes);
	CHECK(cudaEventRecord(e1, st));
	CHECK(cudaEventSynchronize(e1));
	float ms;
	CHECK(cudaEventElapsedTime(&ms, e0, e1));
	CHECK(cudaEventDestroy(e0));
	CHECK(cudaEventDestroy(e1));
	return 1e3 * ms / REPS;
}

int main(void)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		fprintf(stderr, "permute_rate: no CUDA GPU here\n");
		return 1;
	}
	const char *mode = getenv("PLANRT_INDEX");
	const char *arith = mode && !strcmp(mode, "64") ? "64-bit index division" : "planned 32-bit index";
	static const Shape shapes[] = {
		{"split heads [8,1024,16,64] (0,2,1,3)", 0, 4, {8, 1024, 16, 64}, {0, 2, 1, 3}, {0}},
		{"merge heads [8,16,1024,64] (0,2,1,3)", 0, 4, {8, 16, 1024, 64}, {0, 2, 1, 3}, {0}},
		{"transpose [1024,50304] (1,0)", 0, 2, {1024, 50304}, {1, 0}, {0}},
		{"bias gradient [8,1024,1024] -> [1024]", 1, 3, {8, 1024, 1024}, {0}, {0, 0, 1}},
		{"bias gradient [8,1024,4096] -> [4096]", 1, 3, {8, 1024, 4096}, {0}, {0, 0, 1}},
		{"bias gradient [8,1024,1024] -> [1024] bf16", 3, 3, {8, 1024, 1024}, {0}, {0, 0, 1}},
		{"bias gradient [8,1024,4096] -> [4096] bf16", 3, 3, {8, 1024, 4096}, {0}, {0, 0, 1}},
		{"llama1b's q [8,16,1024,128]", 4, 4, {8, 16, 1024, 128}, {0}, {0}},
		{"llama1b's k [8,4,1024,128]", 4, 4, {8, 4, 1024, 128}, {0}, {0}},
	};
	size_t most = 0;
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		size_t n = 1;
		for (int d = 0; d < shapes[i].rank; d++)
			n *= (size_t)shapes[i].dims[d];
		most = n > most ? n : most;
	}
	CHECK(cudaMalloc(&in_, 2 * most));
	CHECK(cudaMalloc(&out_, 4 * most));
	CHECK(cudaMemset(in_, 0x3c, 2 * most)); /* bf16 1.1: finite sums */
	CHECK(cudaMemset(out_, 0, 4 * most));
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		const Shape *s = &shapes[i];
		size_t n = 1;
		for (int d = 0; d < s->rank; d++)
			n *= (size_t)s->dims[d];
		/* bytes moved once: a permute or RoPE reads and writes every element; a sum reads every element */
		size_t bytes = s->kind == 0 || s->kind == 4 ? 4 * n : 2 * n;
		Shape copy = *s;
		copy.kind = 2;
		double us = time_us(s, bytes), copy_us = time_us(&copy, bytes / 2);
		printf("%s %s (%s): %.1f us, %.0f GB/s (%.2f of a copy of the same bytes: %.1f us)\n",
		       s->kind == 0   ? "permute_16"
		       : s->kind == 1 ? "sum_to_acc_16 into f32"
		       : s->kind == 3 ? "sum_to_acc_16 into bf16"
				      : "rope_16",
		       s->what, arith, us, bytes / us * 1e-3, copy_us / us,
		       copy_us);
	}
	CHECK(cudaDeviceSynchronize());
	return 0;
}
