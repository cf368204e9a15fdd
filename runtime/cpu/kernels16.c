/* kernels16.c: the 16-bit variants of sum_to and the norms on the CPU (planrt_kernels.h).
 *
 * A bf16 or f16 program stores its activations in 2 bytes; the compute kernels work in f32. Before
 * these variants the compiler cast every 16-bit operand into an f32 copy before the call and every
 * 16-bit result back after it. Here the kernel takes the 16-bit buffers as they are stored: each
 * widens a block of rows into a scratch, runs the f32 kernel on the block and rounds the block's
 * results into place. Rows are independent in these kernels, and the weight gradients (f32) add
 * the rows in row order whether the rows come in one call or in blocks, so the numbers are the
 * casts' and the f32 kernel's bit for bit at every instruction-set level (the f32 kernel is the one
 * that runs). On the GPU the same variants read and write the 16-bit values directly
 * (kernels_cuda.cu); on the CPU what they save is the arena's f32 copies.
 *
 * sum_to has no row structure to block by when it reduces a whole tensor to one value (its f32
 * kernel then sums one run of every element with eight partial sums), so that case streams the
 * widened blocks through the same eight partial sums; every other sum_to blocks by its outermost
 * dim, whose blocks the f32 kernel walks in the order it walks the whole. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <stdlib.h>

/* floats of scratch an operand's block takes at most (a block is at least one row) */
#define PLANRT_K16_BLOCK ((int64_t)1 << 18)

static float *scratch_floats(int64_t n, const char *what)
{
	float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
	if (!p)
		planrt_fatal("%s: out of memory for a scratch of %lld floats", what, (long long)n);
	return p;
}

static void widen(const void *x, int64_t off, float *to, int64_t n, planrt_dtype_t storage)
{
	planrt_cast((const uint16_t *)x + off, storage, to, planrt_f32, n);
}

static void narrow(const float *from, void *y, int64_t off, int64_t n, planrt_dtype_t storage)
{
	planrt_cast(from, planrt_f32, (uint16_t *)y + off, storage, n);
}

static void check_storage(planrt_dtype_t storage, const char *what)
{
	if (storage != planrt_bf16 && storage != planrt_f16)
		planrt_fatal("%s: a 16-bit kernel called with storage type %d (bf16 or f16 expected)", what, (int)storage);
}

/* rows of cols elements in one block */
static int64_t block_rows(int64_t cols)
{
	int64_t r = cols > 0 ? PLANRT_K16_BLOCK / cols : 1;
	return r < 1 ? 1 : r;
}

/* ---- sum_to ------------------------------------------------------------------------------------ */

/* out[0] += the sum of all n elements of in, as planrt_k_sum_to_acc_f32 sums one run: eight partial
 * sums over the groups of eight, the tail on its own, then ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) */
static void sum_all(const void *in, int64_t n, float *out, planrt_dtype_t storage, float *s)
{
	float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0;
	int64_t groups = n / 8 * 8, chunk = PLANRT_K16_BLOCK / 8 * 8;
	for (int64_t i0 = 0; i0 < groups; i0 += chunk) {
		int64_t m = groups - i0 < chunk ? groups - i0 : chunk;
		widen(in, i0, s, m, storage);
		for (int64_t i = 0; i < m; i += 8)
			for (int j = 0; j < 8; j++)
				acc[j] += s[i + j];
	}
	widen(in, groups, s, n - groups, storage);
	for (int64_t i = 0; i < n - groups; i++)
		tail += s[i];
	out[0] += tail + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, float *out,
		      int64_t out_elems, planrt_dtype_t storage, int accumulate)
{
	const char *what = accumulate ? "sum_to_acc_16" : "sum_to_16";
	check_storage(storage, what);
	if (rank < 1 || rank > 16)
		planrt_fatal("%s: rank %d out of range", what, rank);
	int64_t total = 1, outer = -1, kept = 0;
	for (int d = 0; d < rank; d++) {
		total *= dims[d];
		if (dims[d] > 1 && outer < 0)
			outer = d;
		if (dims[d] > 1 && out_strides[d] != 0)
			kept++;
	}
	if (!accumulate)
		for (int64_t i = 0; i < out_elems; i++)
			out[i] = 0;
	if (total == 0)
		return;
	if (outer < 0 || kept == 0) { /* every element into out[0] */
		float *s = scratch_floats(total < PLANRT_K16_BLOCK ? total : PLANRT_K16_BLOCK, what);
		sum_all(in, total, out, storage, s);
		free(s);
		return;
	}
	int64_t inner = total / dims[outer], per = block_rows(inner);
	int64_t bdims[16];
	for (int d = 0; d < rank; d++)
		bdims[d] = dims[d];
	float *s = scratch_floats((per < dims[outer] ? per : dims[outer]) * inner, what);
	for (int64_t r0 = 0; r0 < dims[outer]; r0 += per) {
		int64_t nr = dims[outer] - r0 < per ? dims[outer] - r0 : per;
		bdims[outer] = nr;
		widen(in, r0 * inner, s, nr * inner, storage);
		planrt_k_sum_to_acc_f32(rank, bdims, s, out_strides, out + r0 * out_strides[outer], out_elems);
	}
	free(s);
}

void planrt_k_sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, float *out,
			int64_t out_elems, planrt_dtype_t storage)
{
	sum_to_16(rank, dims, in, out_strides, out, out_elems, storage, 0);
}

void planrt_k_sum_to_acc_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, float *out,
			    int64_t out_elems, planrt_dtype_t storage)
{
	sum_to_16(rank, dims, in, out_strides, out, out_elems, storage, 1);
}

/* ---- the norms ----------------------------------------------------------------------------------
 * The scratch: the weights (and bias) widened once, then one block each of the row operands. */

/* the widened weight (NULL stays NULL) */
static const float *widened_param(const void *w, float *at, int64_t cols, planrt_dtype_t storage)
{
	if (!w)
		return NULL;
	widen(w, 0, at, cols, storage);
	return at;
}

void planrt_k_layer_norm_16(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd,
			    int64_t rows, int64_t cols, double eps, planrt_dtype_t storage)
{
	check_storage(storage, "layer_norm_16");
	if (rows <= 0 || cols <= 0)
		return;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(2 * cols + 2 * blk, "layer_norm_16");
	const float *w32 = widened_param(w, s, cols, storage), *b32 = widened_param(b, s + cols, cols, storage);
	float *xs = s + 2 * cols, *ys = xs + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		widen(x, r0 * cols, xs, nr * cols, storage);
		planrt_k_layer_norm_f32(xs, w32, b32, ys, mean + r0, rstd + r0, nr, cols, eps);
		narrow(ys, y, r0 * cols, nr * cols, storage);
	}
	free(s);
}

void planrt_k_layer_norm_grad_16(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
				 void *dx, float *dw, float *db, int64_t rows, int64_t cols, planrt_dtype_t storage)
{
	check_storage(storage, "layer_norm_grad_16");
	if (rows <= 0 || cols <= 0)
		return;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(cols + 3 * blk, "layer_norm_grad_16");
	const float *w32 = widened_param(w, s, cols, storage);
	float *xs = s + cols, *gs = xs + blk, *ds = gs + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		widen(x, r0 * cols, xs, nr * cols, storage);
		widen(dy, r0 * cols, gs, nr * cols, storage);
		planrt_k_layer_norm_grad_f32(xs, w32, mean + r0, rstd + r0, gs, ds, dw, db, nr, cols);
		narrow(ds, dx, r0 * cols, nr * cols, storage);
	}
	free(s);
}

void planrt_k_rms_norm_16(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols, double eps,
			  planrt_dtype_t storage)
{
	check_storage(storage, "rms_norm_16");
	if (rows <= 0 || cols <= 0)
		return;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(cols + 2 * blk, "rms_norm_16");
	const float *w32 = widened_param(w, s, cols, storage);
	float *xs = s + cols, *ys = xs + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		widen(x, r0 * cols, xs, nr * cols, storage);
		planrt_k_rms_norm_f32(xs, w32, ys, rstd + r0, nr, cols, eps);
		narrow(ys, y, r0 * cols, nr * cols, storage);
	}
	free(s);
}

void planrt_k_rms_norm_grad_16(const void *x, const void *w, const float *rstd, const void *dy, void *dx, float *dw,
			       int64_t rows, int64_t cols, planrt_dtype_t storage)
{
	check_storage(storage, "rms_norm_grad_16");
	if (rows <= 0 || cols <= 0)
		return;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(cols + 3 * blk, "rms_norm_grad_16");
	const float *w32 = widened_param(w, s, cols, storage);
	float *xs = s + cols, *gs = xs + blk, *ds = gs + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		widen(x, r0 * cols, xs, nr * cols, storage);
		widen(dy, r0 * cols, gs, nr * cols, storage);
		planrt_k_rms_norm_grad_f32(xs, w32, rstd + r0, gs, ds, dw, nr, cols);
		narrow(ds, dx, r0 * cols, nr * cols, storage);
	}
	free(s);
}
