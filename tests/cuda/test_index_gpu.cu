/* test_index_gpu.cu: the CUDA permute and sum_to on the GPU (scripts/gpu-check.sh runs it; CI
 * builds it in cuda_one_process and it skips without a GPU). planrt_cu_k_permute_16 / _f32 must
 * equal the CPU's planrt_k_permute_16 / _f32 bit for bit; planrt_cu_k_sum_to_16 / _acc_16 / _f32
 * the CPU's sums within f32 rounding (into f32 their rows are added in chunks of 256, the chunks
 * atomically; into bf16 in a 32 x 32 tile, then rounded once: within one bf16 rounding more).
 * The cases: the GPT's split and merge of heads (16-byte units), a transpose, odd sizes
 * (elements), buffers off 16-byte alignment (elements), a bias gradient and a sum onto inner
 * dims; and RoPE (a thread a position and frequency walking the heads; PLANRT_INDEX=64: a thread an
 * element pair) against the CPU's within the device's powf / cosf / sinf rounding; and the
 * cross-entropy's gradient (rows by grid y, no division an element; in place too) against the CPU's. The planned 32-bit arithmetic (runtime/include/planrt_index_math.h) is the default;
 * PLANRT_INDEX=64 runs the same cases through the 64-bit kernels.
 * Prints PASS/FAIL lines; exit status 0 when all passed, 77 without a GPU. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "device_copy.h"
#include "tally.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int64_t elems(int rank, const int64_t *dims)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= dims[d];
	return n;
}

/* random bits as elements (f32: finite values) */
static void *random_elems(int64_t n, int elem)
{
	uint32_t *x = (uint32_t *)malloc((size_t)n * 4);
	uint32_t s = (uint32_t)n * 2654435761u + 1;
	for (int64_t i = 0; i < n; i++) {
		s = s * 1103515245u + 12345u;
		x[i] = elem == 4 ? (s >> 9) | 0x3f000000u : s >> 7; /* f32 in [0.5, 1) ... [1, 2) */
	}
	return x;
}

/* a permute on the device (at `shift` elements past an aligned start) against the CPU's */
static void permute_case(int rank, const int64_t *dims, const int *perm, int elem, int shift, const char *what)
{
	int64_t n = elems(rank, dims);
	size_t bytes = (size_t)n * (size_t)elem;
	void *in = random_elems(n, elem), *want = malloc(bytes), *got = malloc(bytes);
	if (elem == 2)
		planrt_k_permute_16(rank, dims, perm, in, want);
	else
		planrt_k_permute_f32(rank, dims, perm, (const float *)in, (float *)want);
	char *d_in = NULL, *d_out = NULL;
	if (cudaMalloc(&d_in, bytes + 16) != cudaSuccess || cudaMalloc(&d_out, bytes + 16) != cudaSuccess ||
	    cudaMemcpy(d_in + shift * elem, in, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
	    cudaMemset(d_out, 0xff, bytes + 16) != cudaSuccess) {
		printf("FAIL: %s: cudaMalloc / cudaMemcpy\n", what);
		exit(1);
	}
	if (elem == 2)
		planrt_cu_k_permute_16(rank, dims, perm, d_in + shift * elem, d_out + shift * elem, PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_permute_f32(rank, dims, perm, (const float *)(d_in + shift * elem), (float *)(d_out + shift * elem),
					PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
	from_device(got, d_out + shift * elem, bytes);
	int64_t first = -1;
	for (int64_t i = 0; i < (int64_t)bytes && first < 0; i++)
		if (((const char *)got)[i] != ((const char *)want)[i])
			first = i / elem;
	CHECK(first < 0, "%s: element %lld differs from the CPU's", what, (long long)first);
	printf("  %s: %s\n", what, first < 0 ? "the CPU's, bit for bit" : "DIFFERS");
	free(in);
	free(want);
	free(got);
	cudaFree(d_in);
	cudaFree(d_out);
}

/* sum_to (kind 0: _f32, 1: _16 bf16, 2: _acc_16 bf16 onto a nonzero out) against the CPU's, the
 * 16-bit kinds' out stored as acc (f32, or bf16: widened, summed in f32, rounded once) */
static void sum_case(int rank, const int64_t *dims, const int64_t *ostr, int kind, planrt_dtype_t acc, const char *what)
{
	int64_t n = elems(rank, dims), out_n = 1;
	for (int d = 0; d < rank; d++)
		out_n += (dims[d] - 1) * ostr[d];
	float *f = (float *)malloc(sizeof(float) * (size_t)n);
	uint32_t s = 12345;
	for (int64_t i = 0; i < n; i++) {
		s = s * 1103515245u + 12345u;
		f[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	void *h16 = malloc(2 * (size_t)n);
	planrt_cast(f, planrt_f32, h16, planrt_bf16, n);
	size_t ob = (acc == planrt_f32 ? 4 : 2) * (size_t)out_n;
	float *start = (float *)malloc(sizeof(float) * (size_t)out_n), *want = (float *)malloc(sizeof(float) * (size_t)out_n);
	float *got = (float *)malloc(sizeof(float) * (size_t)out_n);
	void *want_as = malloc(ob), *got_as = malloc(ob);
	for (int64_t i = 0; i < out_n; i++)
		start[i] = kind == 2 ? 0.25f * (float)(i % 7) : 0;
	planrt_cast(start, planrt_f32, want_as, acc, out_n);
	void *d_out = to_device(want_as, ob);
	void *d_in = kind ? to_device(h16, 2 * (size_t)n) : to_device(f, sizeof(float) * (size_t)n);
	if (kind == 0) {
		planrt_k_sum_to_f32(rank, dims, f, ostr, (float *)want_as, out_n);
		planrt_cu_k_sum_to_f32(rank, dims, (const float *)d_in, ostr, (float *)d_out, out_n, PLANRT_STREAM_COMPUTE);
	} else if (kind == 1) {
		planrt_k_sum_to_16(rank, dims, h16, ostr, want_as, out_n, acc, planrt_bf16);
		planrt_cu_k_sum_to_16(rank, dims, d_in, ostr, d_out, out_n, acc, planrt_bf16, PLANRT_STREAM_COMPUTE);
	} else {
		planrt_k_sum_to_acc_16(rank, dims, h16, ostr, want_as, out_n, acc, planrt_bf16);
		planrt_cu_k_sum_to_acc_16(rank, dims, d_in, ostr, d_out, out_n, acc, planrt_bf16, PLANRT_STREAM_COMPUTE);
	}
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
	from_device(got_as, d_out, ob);
	planrt_cast(want_as, acc, want, planrt_f32, out_n);
	planrt_cast(got_as, acc, got, planrt_f32, out_n);
	/* f32 sums of up to red_n terms of magnitude <= 1 in another order: within red_n x 2^-24 x red_n;
	 * stored as bf16, one rounding of the result either way more (2^-8 of it) */
	double red = (double)n / (double)out_n, tol = red * red * 6e-8 + 1e-6, worst = 0;
	for (int64_t i = 0; i < out_n; i++) {
		double d = fabs((double)got[i] - (double)want[i]), t = tol + (acc == planrt_f32 ? 0 : fabs(want[i]) / 128);
		worst = fmax(worst, d / t * tol);
	}
	CHECK(worst <= tol, "%s: worst difference %.3g (at most %.3g)", what, worst, tol);
	printf("  %s: worst difference from the CPU's %.3g (at most %.3g)\n", what, worst, tol);
	void *all[] = {f, h16, start, want, got, want_as, got_as};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
	cudaFree(d_in);
	cudaFree(d_out);
}

/* RoPE (f32 and bf16; positions from a table or from the offsets) on the device against the CPU's:
 * the angles go through the device's powf / cosf / sinf (a few ulps from the host's), so within 1e-5
 * of the largest value in f32 and within a bf16 unit in the last place of it in bf16 */
static void rope_case(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim, int heads_first,
		      int table, planrt_dtype_t t, const char *what)
{
	int64_t n = batch * seq * heads * head_dim, pos_stride = seq + 3;
	float *x = (float *)malloc(sizeof(float) * (size_t)n), *want = (float *)malloc(sizeof(float) * (size_t)n);
	float *got = (float *)malloc(sizeof(float) * (size_t)n);
	int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)(batch * pos_stride));
	uint32_t s = 777;
	for (int64_t i = 0; i < n; i++) {
		s = s * 1103515245u + 12345u;
		x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	for (int64_t i = 0; i < batch * pos_stride; i++)
		pos[i] = (int32_t)((i * 37) % 4000);
	size_t eb = t == planrt_f32 ? 4 : 2;
	void *x_as = malloc(eb * (size_t)n), *got_as = malloc(eb * (size_t)n);
	planrt_cast(x, planrt_f32, x_as, t, n);
	planrt_cast(x_as, t, x, planrt_f32, n); /* the values the device reads */
	const int32_t *hpos = table ? pos : NULL;
	planrt_k_rope_f32(x, want, batch, seq, heads, head_dim, rot_dim, heads_first, hpos, pos_stride, 5, 900, 10000.0);
	void *d_x = to_device(x_as, eb * (size_t)n), *d_y = to_device(x_as, eb * (size_t)n);
	void *d_pos = to_device(pos, sizeof(int32_t) * (size_t)(batch * pos_stride));
	cudaMemset(d_y, 0xff, eb * (size_t)n);
	if (t == planrt_f32)
		planrt_cu_k_rope_f32((const float *)d_x, (float *)d_y, batch, seq, heads, head_dim, rot_dim, heads_first,
				     table ? (const int32_t *)d_pos : NULL, pos_stride, 5, 900, 10000.0, PLANRT_STREAM_COMPUTE);
	else
		planrt_cu_k_rope_16(d_x, d_y, batch, seq, heads, head_dim, rot_dim, heads_first,
				    table ? (const int32_t *)d_pos : NULL, pos_stride, 5, 900, 10000.0, t, PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
	from_device(got_as, d_y, eb * (size_t)n);
	planrt_cast(got_as, t, got, planrt_f32, n);
	double big = 0, worst = 0;
	for (int64_t i = 0; i < n; i++)
		big = fmax(big, fabs(want[i]));
	double tol = t == planrt_f32 ? 1e-5 * big : ldexp(1.0, (int)floor(log2(big)) - 7);
	for (int64_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)got[i] - (double)want[i]));
	CHECK(worst <= tol, "%s: worst difference %.3g (at most %.3g)", what, worst, tol);
	printf("  %s: worst difference from the CPU's %.3g (at most %.3g)\n", what, worst, tol);
	void *host[] = {x, want, got, pos, x_as, got_as};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	cudaFree(d_x);
	cudaFree(d_y);
	cudaFree(d_pos);
}

/* the cross-entropy's gradient on the device (rows by grid y, columns by grid x; in place when asked)
 * against the CPU's planrt_k_ce_grad_f32: within the device's expf rounding */
static void ce_grad_case(int64_t rows, int64_t cols, int64_t vocab_lo, int in_place, const char *what)
{
	int64_t n = rows * cols;
	float *x = (float *)malloc(sizeof(float) * (size_t)n), *want = (float *)malloc(sizeof(float) * (size_t)n);
	float *got = (float *)malloc(sizeof(float) * (size_t)n), *lse = (float *)malloc(sizeof(float) * (size_t)rows);
	int32_t *tg = (int32_t *)malloc(sizeof(int32_t) * (size_t)rows);
	uint32_t s = 99;
	for (int64_t i = 0; i < n; i++) {
		s = s * 1103515245u + 12345u;
		x[i] = (float)((s >> 8) & 0xffff) / 8192.0f - 4.0f;
	}
	for (int64_t r = 0; r < rows; r++) {
		lse[r] = 3.0f + (float)(r % 5);
		tg[r] = (int32_t)((r * 7) % (cols + 4)) + (int32_t)vocab_lo - 2; /* some outside this rank's columns */
	}
	float one = 1.0f;
	planrt_k_ce_grad_f32(x, tg, lse, rows, cols, vocab_lo, 0.5, want);
	void *d_x = to_device(x, sizeof(float) * (size_t)n), *d_lse = to_device(lse, sizeof(float) * (size_t)rows);
	void *d_tg = to_device(tg, sizeof(int32_t) * (size_t)rows), *d_one = to_device(&one, sizeof one);
	void *d_out = in_place ? d_x : to_device(x, sizeof(float) * (size_t)n);
	planrt_cu_k_ce_grad_f32((const float *)d_x, (const int32_t *)d_tg, (const float *)d_lse, rows, cols, vocab_lo,
				(const float *)d_one, 0.5, (float *)d_out, PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
	from_device(got, d_out, sizeof(float) * (size_t)n);
	double worst = 0;
	for (int64_t i = 0; i < n; i++)
		worst = fmax(worst, fabs((double)got[i] - (double)want[i]) / (1e-30 + fabs((double)want[i]) + 1e-6));
	CHECK(worst <= 1e-5, "%s: worst relative difference %.3g (at most 1e-5)", what, worst);
	printf("  %s: worst relative difference from the CPU's %.3g (at most 1e-5)\n", what, worst);
	void *host[] = {x, want, got, lse, tg};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	void *dev[] = {d_x, d_lse, d_tg, d_one};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		cudaFree(dev[i]);
	if (!in_place)
		cudaFree(d_out);
}

int main(void)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		printf("skip: no CUDA GPU here (this test runs on the GPU machine: scripts/gpu-check.sh)\n");
		return 77;
	}
	const char *mode = getenv("PLANRT_INDEX");
	printf("planrt_cu_k_permute_* and sum_to_* (%s index arithmetic) against the CPU's:\n",
	       mode && !strcmp(mode, "64") ? "64-bit" : "planned 32-bit");
	const int swap[4] = {0, 2, 1, 3}, t2[2] = {1, 0}, rot[3] = {2, 0, 1};
	const int64_t split[4] = {2, 130, 4, 64}, merge[4] = {2, 4, 130, 64}, odd[4] = {3, 5, 7, 9};
	const int64_t wgrad[2] = {96, 1030}, three[3] = {6, 10, 12};
	permute_case(4, split, swap, 2, 0, "split heads [2,130,4,64] bf16 (16-byte units)");
	permute_case(4, merge, swap, 2, 0, "merge heads [2,4,130,64] bf16 (16-byte units)");
	permute_case(4, split, swap, 4, 0, "split heads f32 (16-byte units)");
	permute_case(4, split, swap, 2, 1, "split heads bf16, one element off alignment (elements)");
	permute_case(2, wgrad, t2, 2, 0, "a transpose [96,1030] bf16");
	permute_case(4, odd, swap, 2, 0, "[3,5,7,9] (0,2,1,3) bf16");
	permute_case(3, three, rot, 4, 0, "[6,10,12] (2,0,1) f32");
	const int64_t bias[3] = {4, 300, 96}, bias_st[3] = {0, 0, 1};
	const int64_t inner[4] = {3, 4, 50, 8}, inner_st[4] = {0, 8, 0, 1}, col[2] = {2000, 3}, col_st[2] = {0, 1};
	const planrt_dtype_t f32 = planrt_f32, bf16 = planrt_bf16;
	sum_case(3, bias, bias_st, 0, f32, "bias gradient [4,300,96] f32");
	sum_case(3, bias, bias_st, 1, f32, "bias gradient [4,300,96] bf16");
	sum_case(3, bias, bias_st, 2, f32, "bias gradient [4,300,96] bf16, accumulated");
	sum_case(4, inner, inner_st, 1, f32, "[3,4,50,8] onto dims 1 and 3, bf16");
	sum_case(2, col, col_st, 2, f32, "[2000,3] onto 3, bf16, accumulated (8 chunks)");
	sum_case(3, bias, bias_st, 1, bf16, "bias gradient [4,300,96] bf16 into bf16");
	sum_case(3, bias, bias_st, 2, bf16, "bias gradient [4,300,96] bf16, accumulated into bf16");
	sum_case(4, inner, inner_st, 2, bf16, "[3,4,50,8] onto dims 1 and 3, bf16, accumulated into bf16");
	sum_case(2, col, col_st, 2, bf16, "[2000,3] onto 3, bf16, accumulated into bf16 (3 of a 32-column tile)");
	rope_case(2, 64, 4, 128, 128, 0, 0, planrt_f32, "rope f32 [2,64,4,128], positions from the offsets");
	rope_case(2, 64, 4, 128, 128, 0, 1, planrt_bf16, "rope bf16 [2,64,4,128], positions from a table");
	rope_case(3, 17, 5, 40, 24, 1, 1, planrt_f32, "rope f32 [3,5,17,40] heads first, 24 dims rotated");
	rope_case(3, 17, 5, 40, 24, 0, 0, planrt_bf16, "rope bf16 [3,17,5,40], 24 dims rotated");
	ce_grad_case(33, 1000, 0, 0, "cross-entropy gradient [33, 1000]");
	ce_grad_case(5, 300001, 100, 1, "cross-entropy gradient [5, 300001] of a vocab shard, in place");
	ce_grad_case(70000, 3, 0, 0, "cross-entropy gradient [70000, 3] (more rows than grid y)");
	return tally_report("permute, sum_to, RoPE and the cross-entropy gradient on the GPU");
}
