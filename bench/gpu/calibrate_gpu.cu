/* calibrate_gpu.cu: `planc calibrate` for one GPU (docs/search.md; runtime/driver/calibrate.c measures
 * CPUs). It measures, with the calls planc's CUDA programs make, the figures explain's device model
 * prices a step with, and writes them as a device file over a named base device:
 *   matmul.bf16, matmul.f16  the best rate of planrt_cu_k_matmul_bf16 / _f16 (f32 accumulation, a
 *                            bf16 / f16 output) over transformer-shaped products and 8192^3;
 *   memory.*                 planrt_cu_cast of 512 Mi elements bf16 -> f32 and back: bytes read and
 *                            written over the seconds (every element type gets the figure);
 *   attention.bf16, .f16     planrt_cu_k_attention_16 and _grad_16 (the tiles), causal, B x H = 32,
 *                            head dim 128, S 4096: FLOPs as explain counts them (forward 2, backward
 *                            5 products of S^2 Dh per head, halved by the mask) over the seconds;
 *   kernel.latency           seconds a call of planrt_cu_fill of one element costs, 2,000 back to back.
 * Each figure is the best of timed repetitions (CUDA events) after a warm-up. f32 GEMMs and the links
 * keep the base's figures (the single-GPU programs run bf16; one GPU measures no link).
 *   usage: calibrate_gpu OUT [BASE]      (BASE: h200 unless given)
 * Then, on the build machine: planc explain PLAN --plan NAME --device=OUT. Prints each figure;
 * exit status 1 on a CUDA error or an output it cannot write (OUT is written whole or not at all). */
#include "bench_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* what one repetition runs, and its argument */
typedef void (*Work)(const void *arg);

/* the best seconds of `reps` timed calls of work after two untimed ones */
static double best_seconds(Work work, const void *arg, int reps)
{
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMPUTE);
	cudaEvent_t e0, e1;
	BENCH_CHECK(cudaEventCreate(&e0));
	BENCH_CHECK(cudaEventCreate(&e1));
	work(arg);
	work(arg);
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		BENCH_CHECK(cudaEventRecord(e0, s));
		work(arg);
		BENCH_CHECK(cudaEventRecord(e1, s));
		BENCH_CHECK(cudaEventSynchronize(e1));
		float ms;
		BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
		best = ms / 1e3 < best ? ms / 1e3 : best;
	}
	BENCH_CHECK(cudaEventDestroy(e0));
	BENCH_CHECK(cudaEventDestroy(e1));
	BENCH_CHECK(cudaGetLastError());
	return best;
}

typedef struct Gemm {
	int64_t M, N, K;
	planrt_dtype_t t;
	const uint16_t *A, *B;
	void *C;
} Gemm;

static void gemm(const void *arg)
{
	const Gemm *g = (const Gemm *)arg;
	if (g->t == planrt_bf16)
		planrt_cu_k_matmul_bf16(1, g->M, g->N, g->K, g->A, 0, 0, g->B, 0, 0, g->C, planrt_bf16, 0, 0,
					PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_matmul_f16(1, g->M, g->N, g->K, g->A, 0, 0, g->B, 0, 0, g->C, planrt_f16, 0, 0,
				       PLANRT_STREAM_COMPUTE);
}

/* the best GEMM rate of type t: tokens x (D -> 3D, D -> 4D, 4D -> D) for D 1024 / 2048 / 4096 at 8192
 * tokens, and 8192^3 */
static double gemm_rate(planrt_dtype_t t)
{
	const int64_t shapes[][3] = {{8192, 3072, 1024}, {8192, 4096, 1024}, {8192, 1024, 4096}, {8192, 6144, 2048},
				     {8192, 8192, 2048}, {8192, 2048, 8192}, {8192, 12288, 4096}, {8192, 4096, 4096},
				     {8192, 8192, 8192}};
	size_t most = (size_t)8192 * 16384;
	uint16_t *A = bench_random(most, t, 1), *B = bench_random(most, t, 2), *C = bench_random(most, t, 3);
	double best = 0;
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		Gemm g = {shapes[i][0], shapes[i][1], shapes[i][2], t, A, B, C};
		double s = best_seconds(gemm, &g, 10), rate = 2.0 * g.M * g.N * g.K / s;
		printf("  %s GEMM %lld x %lld x %lld: %.1f TFLOP/s\n", t == planrt_bf16 ? "bf16" : "f16", (long long)g.M,
		       (long long)g.N, (long long)g.K, rate / 1e12);
		best = rate > best ? rate : best;
	}
	BENCH_CHECK(cudaFree(A));
	BENCH_CHECK(cudaFree(B));
	BENCH_CHECK(cudaFree(C));
	return best;
}

typedef struct Casts {
	void *half, *f32;
	int64_t n;
} Casts;

static void casts(const void *arg)
{
	const Casts *c = (const Casts *)arg;
	planrt_cu_cast(c->half, planrt_bf16, c->f32, planrt_f32, c->n, PLANRT_STREAM_COMPUTE);
	planrt_cu_cast(c->f32, planrt_f32, c->half, planrt_bf16, c->n, PLANRT_STREAM_COMPUTE);
}

static void attention(const void *arg)
{
	bench_attn_call((const BenchAttn *)arg, 0);
	bench_attn_call((const BenchAttn *)arg, 1);
}

static double attention_rate(planrt_dtype_t t)
{
	BenchAttn a;
	bench_attn_alloc(&a, 4096, 128, t);
	double s = best_seconds(attention, &a, 5), flops = bench_attn_flops(&a, 0) + bench_attn_flops(&a, 1);
	printf("  %s attention (tiles), causal, B x H = %d, S %lld, head dim %lld: forward and backward %.3f ms, "
	       "%.1f TFLOP/s\n",
	       t == planrt_bf16 ? "bf16" : "f16", BENCH_BATCH * BENCH_HEADS, (long long)a.S, (long long)a.D, s * 1e3,
	       flops / s / 1e12);
	bench_attn_free(&a);
	return flops / s;
}

typedef struct Fills {
	void *x;
	int calls;
} Fills;

static void fills(const void *arg)
{
	const Fills *f = (const Fills *)arg;
	for (int i = 0; i < f->calls; i++)
		planrt_cu_fill(f->x, 1, planrt_f32, 1.0, PLANRT_STREAM_COMPUTE);
}

int main(int argc, char **argv)
{
	bench_name = "calibrate_gpu";
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: calibrate_gpu OUT [BASE]\n");
		return 2;
	}
	const char *out = argv[1], *base = argc > 2 ? argv[2] : "h200";
	/* written to OUT.tmp, renamed over OUT at the end: an earlier OUT stays whole until then; the
	 * path is checked before anything is measured */
	char tmp[4096];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", out) >= (int)sizeof tmp) {
		fprintf(stderr, "calibrate_gpu: the output path is too long\n");
		return 1;
	}
	FILE *f = fopen(tmp, "w");
	if (!f) {
		perror(tmp);
		return 1;
	}
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		fprintf(stderr, "calibrate_gpu: no CUDA GPU here\n");
		fclose(f);
		remove(tmp);
		return 1;
	}
	cudaDeviceProp prop;
	BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("calibrating %s (%d multiprocessors, %.1f GiB)\n", prop.name, prop.multiProcessorCount,
	       (double)prop.totalGlobalMem / (1 << 30));
	double mm_bf16 = gemm_rate(planrt_bf16), mm_f16 = gemm_rate(planrt_f16);
	Casts c = {NULL, NULL, (int64_t)512 << 20};
	c.half = bench_random((size_t)c.n, planrt_bf16, 5);
	BENCH_CHECK(cudaMalloc(&c.f32, (size_t)c.n * 4));
	double mem = 2.0 * (double)c.n * 6 / best_seconds(casts, &c, 5); /* each cast reads and writes 6 bytes */
	BENCH_CHECK(cudaFree(c.half));
	BENCH_CHECK(cudaFree(c.f32));
	printf("  memory: casts bf16 <-> f32 of %lld elements: %.2f TB/s\n", (long long)c.n, mem / 1e12);
	double at_bf16 = attention_rate(planrt_bf16), at_f16 = attention_rate(planrt_f16);
	Fills fl = {NULL, 2000};
	BENCH_CHECK(cudaMalloc(&fl.x, 4));
	double latency = best_seconds(fills, &fl, 5) / fl.calls;
	BENCH_CHECK(cudaFree(fl.x));
	printf("  kernel latency: %.2f us a call (planrt_cu_fill of one element, %d back to back)\n", latency * 1e6,
	       fl.calls);
	time_t now = time(NULL);
	char when[64];
	strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
	fprintf(f, "# measured by bench/gpu/calibrate_gpu on %s (%d multiprocessors), %s; the rest is %s's\n",
		prop.name, prop.multiProcessorCount, when, base);
	fprintf(f, "base = %s\nname = %s, calibrated\n", base, prop.name);
	fprintf(f, "matmul.bf16 = %.6g\nmatmul.f16 = %.6g\n", mm_bf16, mm_f16);
	fprintf(f, "memory.f32 = %.6g\nmemory.bf16 = %.6g\nmemory.f16 = %.6g\n", mem, mem, mem);
	fprintf(f, "attention.bf16 = %.6g\nattention.f16 = %.6g\n", at_bf16, at_f16);
	fprintf(f, "kernel.latency = %.6g\n", latency);
	if (fclose(f) != 0 || rename(tmp, out) != 0) {
		perror(out);
		remove(tmp);
		return 1;
	}
	printf("wrote %s (base %s): planc explain PLAN --device=%s\n", out, base, out);
	return 0;
}
