/* exec.c: the glue between compute kernels that a generated training step calls: layout
 * conversions of tensors split along any dim (MPI collectives move flat blocks, so a split that is
 * not the outermost dim is packed into [peer][block] order first and unpacked after), gradient
 * buckets, the composed cross-entropy (vocab-parallel when the logits are split), input loading,
 * and sums for clipping and the logged loss. See planrt_exec.h. */
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_layout_math.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

void planrt_causal_mask_block_f32(const float *x, float *y, int64_t batch, int64_t rows, int64_t cols,
				  const int64_t *offs, int rank, int gradient)
{
	float fill = gradient ? 0.0f : -INFINITY;
	if (offs[2 * rank - 1] != offs[rank - 1] + cols / 2)
		planrt_fatal("causal mask: the key columns are split over a balanced ring; the ring attention keeps "
			     "its keys in blocks, the unfused mask needs them whole");
	if (offs[2 * rank - 2] == offs[rank - 2] + rows / 2) {
		planrt_k_causal_mask_f32(x, y, batch, rows, cols, offs[rank - 2], offs[rank - 1], fill);
		return;
	}
	/* the query rows are two mirrored chunks (a balanced ring's): each half at its global rows */
	int64_t half = rows / 2;
	for (int64_t b = 0; b < batch; b++)
		for (int h = 0; h < 2; h++) {
			size_t at = (size_t)((b * rows + (h ? half : 0)) * cols);
			planrt_k_causal_mask_f32(x + at, y + at, 1, h ? rows - half : half, cols,
						 offs[h ? 2 * rank - 2 : rank - 2], offs[rank - 1], fill);
		}
}

/* ------------------------------------------------------------------ packing */

/* Splits dim `dim` of a [dims] tensor into n equal blocks and copies them to/from [n][block]. A
 * mirrored split (the causally balanced ring, docs/attention.md) cuts the dim into 2n chunks and
 * block p is the chunks p and 2n - 1 - p (planrt_layout_math.h, which the CUDA target's packing
 * shares). */
static void pack_blocks(const void *tensor, void *packed, int rank, const int64_t *dims, int dim, int n, size_t elem,
			int to_packed, int mirrored)
{
	int64_t outer = 1, inner = 1;
	for (int d = 0; d < dim; d++)
		outer *= dims[d];
	for (int d = dim + 1; d < rank; d++)
		inner *= dims[d];
	int pieces = mirrored ? 2 : 1;
	int64_t rows = dims[dim] / n / pieces; /* rows of one chunk */
	size_t chunk = (size_t)(rows * inner) * elem;
	size_t block = chunk * (size_t)pieces * (size_t)outer;
	for (int p = 0; p < n; p++)
		for (int64_t o = 0; o < outer; o++)
			for (int h = 0; h < pieces; h++) {
				int64_t at = planrt_lm_chunk(n, mirrored, p, h); /* the chunk's index */
				char *t = (char *)tensor + ((size_t)(o * dims[dim] + at * rows) * (size_t)inner) * elem;
				char *b = (char *)packed + (size_t)p * block + ((size_t)o * (size_t)pieces + (size_t)h) * chunk;
				if (to_packed)
					memcpy(b, t, chunk);
				else
					memcpy(t, b, chunk);
			}
}

/* out = a copy of dims; returns their product (the tensor's elements) */
static int64_t copy_dims(int rank, const int64_t *dims, int64_t *out)
{
	int64_t count = 1;
	for (int d = 0; d < rank; d++) {
		count *= dims[d];
		out[d] = dims[d];
	}
	return count;
}

void planrt_allreduce_dim(const void *in, void *out, int64_t n, planrt_dtype_t t, planrt_comm_t c)
{
	PLANRT_CHECK(planrt_allreduce(in, out, (size_t)n, t, planrt_sum, c, NULL, NULL));
}

void planrt_reduce_scatter_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
			       planrt_dtype_t t, planrt_comm_t c, void *scratch)
{
	int n = planrt_comm_size(c);
	int64_t total = 1;
	for (int d = 0; d < rank; d++)
		total *= dims[d];
	const void *src = in;
	if (dim > 0 || mirrored) {
		pack_blocks(in, scratch, rank, dims, dim, n, planrt_dtype_size(t), 1, mirrored);
		src = scratch;
	}
	PLANRT_CHECK(planrt_reduce_scatter(src, out, (size_t)(total / n), t, planrt_sum, c, NULL, NULL));
}

void planrt_allgather_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
			  planrt_dtype_t t, planrt_comm_t c, void *scratch)
{
	int n = planrt_comm_size(c);
	int64_t full[8];
	int64_t count = copy_dims(rank, dims, full);
	full[dim] *= n;
	if (dim == 0 && !mirrored) {
		PLANRT_CHECK(planrt_allgather(in, out, (size_t)count, t, c, NULL, NULL));
		return;
	}
	PLANRT_CHECK(planrt_allgather(in, scratch, (size_t)count, t, c, NULL, NULL));
	pack_blocks(out, scratch, rank, full, dim, n, planrt_dtype_size(t), 0, mirrored);
}

void planrt_alltoall_dim(const void *in, void *out, int rank, const int64_t *dims, int from_dim, int to_dim,
			 planrt_dtype_t t, planrt_comm_t c, void *scratch)
{
	int n = planrt_comm_size(c);
	size_t elem = planrt_dtype_size(t);
	int64_t outd[8];
	int64_t count = copy_dims(rank, dims, outd);
	outd[from_dim] *= n;
	outd[to_dim] /= n;
	char *send = scratch, *recv = (char *)scratch + (size_t)count * elem;
	pack_blocks(in, send, rank, dims, to_dim, n, elem, 1, 0);
	PLANRT_CHECK(planrt_alltoall(send, recv, (size_t)(count / n), t, c, NULL, NULL));
	pack_blocks(out, recv, rank, outd, from_dim, n, elem, 0, 0);
}

void planrt_slice_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
		      planrt_dtype_t t, planrt_comm_t c)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	size_t elem = planrt_dtype_size(t);
	int64_t outer = 1, inner = 1;
	for (int d = 0; d < dim; d++)
		outer *= dims[d];
	for (int d = dim + 1; d < rank; d++)
		inner *= dims[d];
	int pieces = mirrored ? 2 : 1;
	int64_t rows = dims[dim] / n / pieces; /* a mirrored block: the chunks me and 2n - 1 - me */
	size_t chunk = (size_t)(rows * inner) * elem;
	for (int64_t o = 0; o < outer; o++)
		for (int h = 0; h < pieces; h++) {
			int64_t at = planrt_lm_chunk(n, mirrored, me, h);
			memcpy((char *)out + ((size_t)o * (size_t)pieces + (size_t)h) * chunk,
			       (const char *)in + ((size_t)(o * dims[dim] + at * rows) * (size_t)inner) * elem, chunk);
		}
}

void planrt_bucket_allreduce(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t, planrt_comm_t c,
			     void *scratch)
{
	planrt_bucket_t b = {0};
	planrt_bucket_allreduce_start(&b, n, bufs, counts, t, c, scratch);
	planrt_bucket_allreduce_finish(&b, n, bufs, counts, t, scratch);
}

int64_t planrt_flat_chunk(int64_t n, planrt_comm_t c)
{
	int size = planrt_comm_size(c);
	return (n + size - 1) / size;
}

void planrt_allgather_flat(const void *shard, void *full, int64_t n, planrt_dtype_t t, planrt_comm_t c, void *scratch)
{
	int64_t chunk = planrt_flat_chunk(n, c);
	PLANRT_CHECK(planrt_allgather(shard, scratch, (size_t)chunk, t, c, NULL, NULL));
	memcpy(full, scratch, planrt_dtype_size(t) * (size_t)n);
}

void planrt_allgather_flat_start(planrt_request_t *req, const void *shard, void *full, int64_t n, planrt_dtype_t t,
				 planrt_comm_t c)
{
	int64_t chunk = planrt_flat_chunk(n, c);
	PLANRT_CHECK(planrt_allgather(shard, full, (size_t)chunk, t, c, NULL, req));
}

void planrt_allgather_flat_finish(planrt_request_t *req)
{
	PLANRT_CHECK(planrt_wait(*req));
	*req = NULL;
}

void planrt_bucket_reduce_scatter(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t,
				  void *const *shards, planrt_dtype_t shard_t, int accumulate, int zero_source,
				  planrt_comm_t c, void *scratch)
{
	planrt_bucket_t b = {0};
	planrt_bucket_reduce_scatter_start(&b, n, bufs, counts, t, zero_source, c, scratch);
	planrt_bucket_reduce_scatter_finish(&b, n, counts, shards, shard_t, accumulate, c, scratch);
}

static size_t pack(int n, void *const *bufs, const int64_t *counts, size_t elem, char *packed)
{
	size_t at = 0;
	for (int i = 0; i < n; i++) {
		memcpy(packed + at, bufs[i], elem * (size_t)counts[i]);
		at += elem * (size_t)counts[i];
	}
	return at / elem;
}

void planrt_bucket_allreduce_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
				   planrt_dtype_t t, planrt_comm_t c, void *buf)
{
	size_t count = pack(n, bufs, counts, planrt_dtype_size(t), buf);
	PLANRT_CHECK(planrt_allreduce(buf, buf, count, t, planrt_sum, c, NULL, &b->req));
	b->active = 1;
}

void planrt_bucket_allreduce_finish(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
				    planrt_dtype_t t, void *buf)
{
	if (!b->active)
		planrt_fatal("internal error: a gradient bucket finished before it started");
	PLANRT_CHECK(planrt_wait(b->req));
	b->active = 0;
	size_t elem = planrt_dtype_size(t), at = 0;
	for (int i = 0; i < n; i++) {
		memcpy(bufs[i], (char *)buf + at, elem * (size_t)counts[i]);
		at += elem * (size_t)counts[i];
	}
}

void planrt_bucket_reduce_scatter_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
					planrt_dtype_t t, int zero_source, planrt_comm_t c, void *buf)
{
	int size = planrt_comm_size(c);
	int half = t == planrt_bf16;
	int64_t total = 0;
	for (int i = 0; i < n; i++)
		total += planrt_flat_chunk(counts[i], c);
	float *send = buf, *recv = send + (size_t)size * (size_t)total;
	for (int q = 0; q < size; q++) {
		float *at = send + (size_t)q * (size_t)total;
		for (int i = 0; i < n; i++) {
			int64_t chunk = planrt_flat_chunk(counts[i], c), lo = q * chunk;
			int64_t have = counts[i] - lo;
			have = have > chunk ? chunk : have < 0 ? 0 : have;
			if (have && half)
				planrt_k_bf16_to_f32((const uint16_t *)bufs[i] + lo, at, have);
			else if (have)
				memcpy(at, (const float *)bufs[i] + lo, sizeof(float) * (size_t)have);
			memset(at + have, 0, sizeof(float) * (size_t)(chunk - have));
			at += chunk;
		}
	}
	if (zero_source)
		for (int i = 0; i < n; i++)
			memset(bufs[i], 0, planrt_dtype_size(t) * (size_t)counts[i]);
	PLANRT_CHECK(planrt_reduce_scatter(send, recv, (size_t)total, planrt_f32, planrt_sum, c, NULL, &b->req));
	b->active = 1;
}

void planrt_bucket_reduce_scatter_finish(planrt_bucket_t *b, int n, const int64_t *counts, void *const *shards,
					 planrt_dtype_t shard_t, int accumulate, planrt_comm_t c, void *buf)
{
	if (!b->active)
		planrt_fatal("internal error: a gradient bucket finished before it started");
	PLANRT_CHECK(planrt_wait(b->req));
	b->active = 0;
	int size = planrt_comm_size(c);
	int64_t total = 0;
	for (int i = 0; i < n; i++)
		total += planrt_flat_chunk(counts[i], c);
	const float *at = (const float *)buf + (size_t)size * (size_t)total;
	for (int i = 0; i < n; i++) {
		int64_t chunk = planrt_flat_chunk(counts[i], c);
		if (shard_t == planrt_f32) {
			float *dst = shards[i];
			if (accumulate)
				for (int64_t j = 0; j < chunk; j++)
					dst[j] += at[j];
			else
				memcpy(dst, at, sizeof(float) * (size_t)chunk);
		} else if (accumulate) {
			planrt_accumulate_f32(shards[i], shard_t, at, chunk);
		} else {
			planrt_cast(at, planrt_f32, shards[i], shard_t, chunk);
		}
		at += chunk;
	}
}

/* ------------------------------------------------------------------ tied-parameter groups */

enum { MAX_PAIRS = 64 };
static planrt_comm_t pairs[MAX_PAIRS];

void planrt_make_pair_comm(int axis, int a, int b, int index)
{
	if (index < 0 || index >= MAX_PAIRS)
		planrt_fatal("internal error: tied-parameter group %d (at most %d)", index, MAX_PAIRS);
	PLANRT_CHECK(planrt_pair_comm(axis, a, b, &pairs[index]));
}

planrt_comm_t planrt_pair(int index)
{
	if (index < 0 || index >= MAX_PAIRS || !pairs[index])
		planrt_fatal("internal error: tied-parameter group %d used on a rank outside it", index);
	return pairs[index];
}

/* Rows [r0, r0 + n) of logits stored as t, as f32: in place (f32), or widened into buf (bf16, f16:
 * the cross-entropy's 16-bit variant reads the logits a block of rows at a time). */
static const float *logit_rows(const void *logits, planrt_dtype_t t, int64_t cols, int64_t r0, int64_t n, float *buf)
{
	if (t == planrt_f32)
		return (const float *)logits + r0 * cols;
	planrt_cast((const uint16_t *)logits + r0 * cols, t, buf, planrt_f32, n * cols);
	return buf;
}

/* The loss over logits stored as t, `per` rows at a time (all of them for f32): the rows are
 * independent, so the statistics are those of one pass over every row. */
static void cross_entropy(const void *logits, planrt_dtype_t t, int64_t per, const int32_t *targets, float *loss,
			  float *lse, int64_t rows, int64_t cols, int64_t vocab_lo, double scale, double *correct,
			  planrt_comm_t vocab_comm, void *scratch)
{
	float *rowmax = scratch, *sumexp = rowmax + rows, *tlogit = sumexp + rows, *buf = NULL;
	if (t != planrt_f32 && rows > 0 && !(buf = malloc(sizeof(float) * (size_t)((per < rows ? per : rows) * cols + 1))))
		planrt_fatal("cross_entropy_16: out of memory for a block of %lld logits", (long long)(per * cols));
	/* a block's maxima, then (without a vocabulary split) its sums and targets from the same widened
	 * rows; with a split the maxima are all-reduced first, and the rows widened again */
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t n = rows - r0 < per ? rows - r0 : per;
		const float *x = logit_rows(logits, t, cols, r0, n, buf);
		planrt_k_ce_max_f32(x, n, cols, rowmax + r0);
		if (!vocab_comm) {
			planrt_k_ce_sumexp_f32(x, rowmax + r0, n, cols, sumexp + r0);
			planrt_k_ce_target_f32(x, targets + r0, n, cols, vocab_lo, tlogit + r0);
		}
	}
	if (vocab_comm) {
		PLANRT_CHECK(planrt_allreduce(rowmax, rowmax, (size_t)rows, planrt_f32, planrt_max, vocab_comm, NULL, NULL));
		for (int64_t r0 = 0; r0 < rows; r0 += per) {
			int64_t n = rows - r0 < per ? rows - r0 : per;
			const float *x = logit_rows(logits, t, cols, r0, n, buf);
			planrt_k_ce_sumexp_f32(x, rowmax + r0, n, cols, sumexp + r0);
			planrt_k_ce_target_f32(x, targets + r0, n, cols, vocab_lo, tlogit + r0);
		}
	}
	free(buf);
	if (vocab_comm) {
		PLANRT_CHECK(planrt_allreduce(sumexp, sumexp, (size_t)rows, planrt_f32, planrt_sum, vocab_comm, NULL, NULL));
		PLANRT_CHECK(planrt_allreduce(tlogit, tlogit, (size_t)rows, planrt_f32, planrt_sum, vocab_comm, NULL, NULL));
	}
	*loss = (float)planrt_k_ce_loss_f32(rowmax, sumexp, tlogit, rows, lse, scale);
	if (correct) { /* the target's logit (summed from its one piece: exact) is the row's max */
		int64_t n = 0;
		for (int64_t r = 0; r < rows; r++)
			n += tlogit[r] >= rowmax[r];
		*correct += (double)n;
	}
}

void planrt_cross_entropy_f32(const float *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
			      int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
			      void *scratch)
{
	cross_entropy(logits, planrt_f32, rows > 0 ? rows : 1, targets, loss, lse, rows, cols, vocab_lo, scale, correct,
		      vocab_comm, scratch);
}

void planrt_cross_entropy_16(const void *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
			     int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
			     uint8_t *scratch, planrt_dtype_t storage)
{
	if (storage != planrt_bf16 && storage != planrt_f16)
		planrt_fatal("cross_entropy_16: storage type %d is not bf16 or f16", (int)storage);
	int64_t per = cols > 0 ? ((int64_t)1 << 18) / cols : 1; /* at most 1 MiB of widened logits (one row at least) */
	cross_entropy(logits, storage, per > 0 ? per : 1, targets, loss, lse, rows, cols, vocab_lo, scale, correct,
		      vocab_comm, scratch);
}

double planrt_world_sum(double x)
{
	double out = x; /* through planrt, so the watchdog sees a stall here as everywhere else */
	PLANRT_CHECK(planrt_allreduce(&out, &out, 1, planrt_f64, planrt_sum, planrt_world_comm(), NULL, NULL));
	return out;
}

double planrt_axes_sum(double x, unsigned axes_mask)
{
	double v = x;
	for (int a = 0; axes_mask >> a; a++)
		if (axes_mask & (1u << a))
			PLANRT_CHECK(planrt_allreduce(&v, &v, 1, planrt_f64, planrt_sum, planrt_axis_comm(a), NULL, NULL));
	return v;
}
