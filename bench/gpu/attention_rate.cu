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
#include "bench_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* milliseconds a call: one to warm up, then about two seconds' worth */
static double time_calls(const BenchAttn *b, int grad)
{
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMPUTE);
	cudaEvent_t e0, e1;
	BENCH_CHECK(cudaEventCreate(&e0));
	BENCH_CHECK(cudaEventCreate(&e1));
	bench_attn_call(b, grad);
	BENCH_CHECK(cudaEventRecord(e0, s));
	bench_attn_call(b, grad);
	BENCH_CHECK(cudaEventRecord(e1, s));
	BENCH_CHECK(cudaEventSynchronize(e1));
	float one;
	BENCH_CHECK(cudaEventElapsedTime(&one, e0, e1));
	int reps = one > 0 ? (int)(2000 / one) : 10;
	reps = reps < 1 ? 1 : reps > 20 ? 20 : reps;
	BENCH_CHECK(cudaEventRecord(e0, s));
	for (int i = 0; i < reps; i++)
		bench_attn_call(b, grad);
	BENCH_CHECK(cudaEventRecord(e1, s));
	BENCH_CHECK(cudaEventSynchronize(e1));
	float ms;
	BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
	BENCH_CHECK(cudaEventDestroy(e0));
	BENCH_CHECK(cudaEventDestroy(e1));
	return ms / reps;
}

/* the output is finite (a kernel that failed silently leaves NaNs or garbage) */
static int finite_output(const BenchAttn *b, size_t n)
{
	size_t m = n < 4096 ? n : 4096;
	uint16_t *h = (uint16_t *)malloc(m * 2);
	BENCH_CHECK(cudaMemcpy(h, b->out, m * 2, cudaMemcpyDeviceToHost));
	int ok = 1;
	for (size_t i = 0; i < m; i++)
		ok &= isfinite(planrt_widen_bf16(h[i])) != 0;
	free(h);
	return ok;
}

int main(int argc, char **argv)
{
	bench_name = "attention_rate";
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
			BenchAttn b;
			bench_attn_alloc(&b, S, D, planrt_bf16);
			double fwd = time_calls(&b, 0), bwd = time_calls(&b, 1);
			printf("planc attention causal S %lld D %lld: fwd %.3f ms %.2f TFLOP/s, bwd %.3f ms %.2f TFLOP/s\n",
			       (long long)S, (long long)D, fwd, bench_attn_flops(&b, 0) / fwd / 1e9, bwd,
			       bench_attn_flops(&b, 1) / bwd / 1e9);
			fflush(stdout);
			if (!finite_output(&b, (size_t)(BENCH_BATCH * BENCH_HEADS * S * D))) {
				printf("FAIL: non-finite attention output at S %lld D %lld\n", (long long)S, (long long)D);
				failed = 1;
			}
			bench_attn_free(&b);
		}
	}
	return failed;
}
