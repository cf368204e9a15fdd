/* kernels16.c: the 16-bit variants of sum_to, the norms, the embedding, the cross-entropy's gradient,
 * RoPE and the fused attention on the CPU (planrt_exec.h; the loss itself is exec.c's, beside the
 * f32 one).
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
 * dim, whose blocks the f32 kernel walks in the order it walks the whole. The attention blocks by
 * heads (below). */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

/* A sum over rows (sum_to's out, a norm's dw / db) stored as acc: its f32 values to add into,
 * itself when acc is f32, else a widened copy that sum_close rounds back once (the casts the
 * compiler put around the call before the kernel took it as stored); NULL stays NULL. */
static float *sum_open(void *out, int64_t n, planrt_dtype_t acc, planrt_dtype_t storage, const char *what)
{
	if (acc != planrt_f32 && acc != storage)
		planrt_fatal("%s: a sum stored as type %d (f32 or the storage type %d expected)", what, (int)acc,
			     (int)storage);
	if (!out || acc == planrt_f32)
		return out;
	float *s = scratch_floats(n, what);
	widen(out, 0, s, n, acc);
	return s;
}

static void sum_close(float *s, void *out, int64_t n, planrt_dtype_t acc)
{
	if (!out || acc == planrt_f32)
		return;
	narrow(s, out, 0, n, acc);
	free(s);
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

/* sum_to_16 into out stored as acc */
static void sum_to_16_as(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			 int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int accumulate)
{
	const char *what = accumulate ? "sum_to_acc_16" : "sum_to_16";
	check_storage(storage, what);
	float *s = sum_open(out, out_elems, acc, storage, what);
	sum_to_16(rank, dims, in, out_strides, s, out_elems, storage, accumulate);
	sum_close(s, out, out_elems, acc);
}

void planrt_k_sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage)
{
	sum_to_16_as(rank, dims, in, out_strides, out, out_elems, acc, storage, 0);
}

void planrt_k_sum_to_acc_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			    int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage)
{
	sum_to_16_as(rank, dims, in, out_strides, out, out_elems, acc, storage, 1);
}

/* ---- the norms ----------------------------------------------------------------------------------
 * One call on blocks of rows: the weights (and bias) widened once, then per block the row operands
 * (x, and dy for a backward) widened, the f32 kernel on the block (its statistics and the f32
 * weight gradients at the block's rows), and its row output (y or dx) rounded in place. */

typedef enum { LAYER_NORM, LAYER_NORM_GRAD, RMS_NORM, RMS_NORM_GRAD } NormKind;

typedef struct NormCall {
	NormKind kind;
	const void *x, *w, *b, *dy; /* dy: the backwards' */
	void *out;                  /* y, or dx */
	float *mean, *rstd;         /* written by the forwards, read by the backwards */
	float *dw, *db;             /* the backwards' weight gradients (f32, accumulated) */
	double eps;
} NormCall;

static const char *const norm_names[] = {"layer_norm_16", "layer_norm_grad_16", "rms_norm_16", "rms_norm_grad_16"};

/* the widened weight (NULL stays NULL) */
static const float *widened_param(const void *w, float *at, int64_t cols, planrt_dtype_t storage)
{
	if (!w)
		return NULL;
	widen(w, 0, at, cols, storage);
	return at;
}

static void norm_16(const NormCall *c, int64_t rows, int64_t cols, planrt_dtype_t storage)
{
	check_storage(storage, norm_names[c->kind]);
	if (rows <= 0 || cols <= 0)
		return;
	bool grad = c->kind == LAYER_NORM_GRAD || c->kind == RMS_NORM_GRAD;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(2 * cols + 3 * blk, norm_names[c->kind]);
	const float *w32 = widened_param(c->w, s, cols, storage), *b32 = widened_param(c->b, s + cols, cols, storage);
	float *xs = s + 2 * cols, *gs = xs + blk, *os = gs + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		float *mean = c->mean ? c->mean + r0 : NULL, *rstd = c->rstd + r0;
		widen(c->x, r0 * cols, xs, nr * cols, storage);
		if (grad)
			widen(c->dy, r0 * cols, gs, nr * cols, storage);
		switch (c->kind) {
		case LAYER_NORM: planrt_k_layer_norm_f32(xs, w32, b32, os, mean, rstd, nr, cols, c->eps); break;
		case LAYER_NORM_GRAD: planrt_k_layer_norm_grad_f32(xs, w32, mean, rstd, gs, os, c->dw, c->db, nr, cols); break;
		case RMS_NORM: planrt_k_rms_norm_f32(xs, w32, os, rstd, nr, cols, c->eps); break;
		case RMS_NORM_GRAD: planrt_k_rms_norm_grad_f32(xs, w32, rstd, gs, os, c->dw, nr, cols); break;
		}
		narrow(os, c->out, r0 * cols, nr * cols, storage);
	}
	free(s);
}

void planrt_k_layer_norm_16(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd,
			    int64_t rows, int64_t cols, double eps, planrt_dtype_t storage)
{
	NormCall c = {.kind = LAYER_NORM, .x = x, .w = w, .b = b, .out = y, .mean = mean, .rstd = rstd, .eps = eps};
	norm_16(&c, rows, cols, storage);
}

void planrt_k_layer_norm_grad_16(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
				 void *dx, void *dw, void *db, int64_t rows, int64_t cols, planrt_dtype_t acc,
				 planrt_dtype_t storage)
{
	check_storage(storage, "layer_norm_grad_16");
	NormCall c = {.kind = LAYER_NORM_GRAD, .x = x, .w = w, .dy = dy, .out = dx, .mean = (float *)mean,
		      .rstd = (float *)rstd, .dw = sum_open(dw, cols, acc, storage, "layer_norm_grad_16"),
		      .db = sum_open(db, cols, acc, storage, "layer_norm_grad_16")};
	norm_16(&c, rows, cols, storage);
	sum_close(c.dw, dw, cols, acc);
	sum_close(c.db, db, cols, acc);
}

void planrt_k_rms_norm_16(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols, double eps,
			  planrt_dtype_t storage)
{
	NormCall c = {.kind = RMS_NORM, .x = x, .w = w, .out = y, .rstd = rstd, .eps = eps};
	norm_16(&c, rows, cols, storage);
}

void planrt_k_rms_norm_grad_16(const void *x, const void *w, const float *rstd, const void *dy, void *dx, void *dw,
			       int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage)
{
	check_storage(storage, "rms_norm_grad_16");
	NormCall c = {.kind = RMS_NORM_GRAD, .x = x, .w = w, .dy = dy, .out = dx, .rstd = (float *)rstd,
		      .dw = sum_open(dw, cols, acc, storage, "rms_norm_grad_16")};
	norm_16(&c, rows, cols, storage);
	sum_close(c.dw, dw, cols, acc);
}

/* ---- the embedding: a row of the table is moved as stored (the bits of widening and narrowing it,
 * but for a NaN's payload, which it keeps), a token outside this rank's rows gets zeros ------------ */
void planrt_k_embed_16(const void *table, const int32_t *ids, void *out, int64_t ntok, int64_t dim, int64_t vocab_lo,
		       int64_t vocab_local, planrt_dtype_t storage)
{
	check_storage(storage, "embed_16");
	const uint16_t *t16 = table;
	uint16_t *o16 = out;
	for (int64_t t = 0; t < ntok; t++) {
		int64_t v = (int64_t)ids[t] - vocab_lo;
		if (v >= 0 && v < vocab_local)
			memcpy(o16 + t * dim, t16 + v * dim, sizeof(uint16_t) * (size_t)dim);
		else
			memset(o16 + t * dim, 0, sizeof(uint16_t) * (size_t)dim);
	}
}

/* ---- the cross-entropy's gradient (the loss itself: exec.c's planrt_cross_entropy_16) ------------ */
void planrt_k_ce_grad_16(const void *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			 int64_t vocab_lo, double dscale, void *dlogits, planrt_dtype_t storage)
{
	check_storage(storage, "cross_entropy_grad_16");
	if (rows <= 0 || cols <= 0)
		return;
	int64_t per = block_rows(cols), blk = (per < rows ? per : rows) * cols;
	float *s = scratch_floats(2 * blk, "cross_entropy_grad_16"), *xs = s, *ds = s + blk;
	for (int64_t r0 = 0; r0 < rows; r0 += per) {
		int64_t nr = rows - r0 < per ? rows - r0 : per;
		widen(logits, r0 * cols, xs, nr * cols, storage);
		planrt_k_ce_grad_f32(xs, targets + r0, lse + r0, nr, cols, vocab_lo, dscale, ds);
		narrow(ds, dlogits, r0 * cols, nr * cols, storage);
	}
	free(s);
}

/* ---- rotary position embeddings: blocks of whole samples (the positions by sample and sequence
 * index, as the f32 kernel reads them) ------------------------------------------------------------ */
static void rope_16(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
		    int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
		    int64_t pos_off2, double theta, planrt_dtype_t storage, int grad)
{
	const char *what = grad ? "rope_grad_16" : "rope_16";
	check_storage(storage, what);
	int64_t sample = seq * heads * head_dim;
	if (batch <= 0 || sample <= 0)
		return;
	int64_t per = block_rows(sample), blk = (per < batch ? per : batch) * sample;
	float *s = scratch_floats(2 * blk, what), *xs = s, *ys = s + blk;
	for (int64_t b0 = 0; b0 < batch; b0 += per) {
		int64_t nb = batch - b0 < per ? batch - b0 : per;
		const int32_t *bpos = pos ? pos + b0 * pos_stride : NULL;
		widen(x, b0 * sample, xs, nb * sample, storage);
		if (grad)
			planrt_k_rope_grad_f32(xs, ys, nb, seq, heads, head_dim, rot_dim, heads_first, bpos, pos_stride, pos_off,
					       pos_off2, theta);
		else
			planrt_k_rope_f32(xs, ys, nb, seq, heads, head_dim, rot_dim, heads_first, bpos, pos_stride, pos_off,
					  pos_off2, theta);
		narrow(ys, y, b0 * sample, nb * sample, storage);
	}
	free(s);
}

void planrt_k_rope_16(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
		      int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
		      int64_t pos_off2, double theta, planrt_dtype_t storage)
{
	rope_16(x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta, storage,
		0);
}

void planrt_k_rope_grad_16(const void *dy, void *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			   int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			   int64_t pos_off2, double theta, planrt_dtype_t storage)
{
	rope_16(dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta,
		storage, 1);
}

/* ---- the fused attention ------------------------------------------------------------------------
 * A unit is a kv head with its group of query heads in one sample (an index of the leading dims):
 * flattened as u = sample * kv_heads + kv head, its q, out, dout, dq rows, its k, v, dk, dv rows and
 * its lse lie at u times a unit's size, so a run of units is one contiguous block of each. Units are
 * independent (the f32 kernel's threads work unit by unit too). A block is whole indices of the
 * first leading dim when they fit the bound, else a run of kv heads within one sample; it is given
 * its shape, its offsets in the scores' global shape (dropout's index) and its share of the mask,
 * so every unit computes what it computes in one call. */

/* floats of widened operands an attention block holds at most (16 MiB; at least one unit); a variable
 * so that tests/kernels/test_kernels16.c can make it small and check blocks against one call */
int64_t planrt_k16_attention_block_ = (int64_t)1 << 22;

typedef struct AttnBlocks {
	int rank;
	int64_t kv_heads, group, nlead, inner; /* inner: samples per index of the first leading dim */
	int64_t q, kv, lse;                    /* elements of a unit in q / out, k / v, lse */
	const int64_t *ldims, *offs, *mstr;
	/* the block being worked on: its shape, offsets, kv heads and mask offset */
	int64_t bdims[16], boffs[32], bkv, bmask;
} AttnBlocks;

static void attn_blocks(AttnBlocks *b, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
			const int64_t *mask_strides, const int64_t *offs, const char *what)
{
	if (rank < 3 || rank > 16 || kv_heads <= 0 || ldims[rank - 3] % kv_heads)
		planrt_fatal("%s: rank %d or %lld kv heads out of range", what, rank, (long long)kv_heads);
	int64_t sq = ldims[rank - 2], dh = ldims[rank - 1];
	*b = (AttnBlocks){.rank = rank, .kv_heads = kv_heads, .group = ldims[rank - 3] / kv_heads, .nlead = 1,
			  .inner = 1, .ldims = ldims, .offs = offs, .mstr = mask_strides};
	for (int d = 0; d < rank - 3; d++) {
		b->nlead *= ldims[d];
		if (d > 0)
			b->inner *= ldims[d];
	}
	b->q = b->group * sq * dh;
	b->kv = sk * dh;
	b->lse = b->group * sq;
}

/* units a block takes at most: its widened operands (per unit: nq q-sized and nkv kv-sized) within
 * the bound, at least one */
static int64_t attn_block_units(const AttnBlocks *b, int nq, int nkv)
{
	int64_t per = nq * b->q + nkv * b->kv, n = per > 0 ? planrt_k16_attention_block_ / per : 1;
	return n < 1 ? 1 : n;
}

/* Points the block at units [u0, u0 + n) and returns n: whole indices of the first leading dim when
 * `per` units hold at least one, else kv heads of one sample (n <= per, not past its last). */
static int64_t attn_block_at(AttnBlocks *b, int64_t u0, int64_t per)
{
	int r = b->rank;
	int64_t sample = b->kv_heads * b->inner; /* the units an index of dim 0 has */
	for (int d = 0; d < r; d++) {
		b->bdims[d] = b->ldims[d];
		b->boffs[d] = b->offs[d];
		b->boffs[r + d] = b->offs[r + d];
	}
	b->bkv = b->kv_heads;
	b->bmask = 0;
	if (r > 3 && per >= sample) { /* whole indices of dim 0 */
		int64_t i0 = u0 / sample, ni = per / sample;
		ni = ni < b->ldims[0] - i0 ? ni : b->ldims[0] - i0;
		b->bdims[0] = ni;
		b->boffs[0] += i0;
		b->boffs[r] = b->boffs[0] + ni / 2;
		b->bmask = b->mstr ? i0 * b->mstr[0] : 0;
		return ni * sample;
	}
	int64_t s = u0 / b->kv_heads, g0 = u0 % b->kv_heads, n = b->kv_heads - g0 < per ? b->kv_heads - g0 : per;
	for (int d = r - 4; d >= 0; d--) { /* sample s's index on each leading dim */
		int64_t i = s % b->ldims[d];
		s /= b->ldims[d];
		b->bdims[d] = 1;
		b->boffs[d] += i;
		b->boffs[r + d] = b->boffs[d];
		b->bmask += b->mstr ? i * b->mstr[d] : 0;
	}
	b->bdims[r - 3] = n * b->group;
	b->boffs[r - 3] += g0 * b->group;
	b->boffs[2 * r - 3] = b->boffs[r - 3] + b->bdims[r - 3] / 2;
	b->bmask += b->mstr ? g0 * b->group * b->mstr[r - 3] : 0;
	b->bkv = n;
	return n;
}

void planrt_k_attention_16(const void *q, const void *k, const void *v, const float *mask, const int64_t *mask_strides,
			   void *out, float *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
			   double scale, int mask_kind, double p, uint64_t seed, uint64_t key, const int64_t *gdims,
			   const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage)
{
	check_storage(storage, "attention_16");
	AttnBlocks b;
	attn_blocks(&b, rank, ldims, kv_heads, sk, mask_strides, offs, "attention_16");
	int64_t per = attn_block_units(&b, 2, 2), total = b.nlead * kv_heads, most = per < total ? per : total;
	float *s = scratch_floats(most * (2 * b.q + 2 * b.kv), "attention_16");
	float *qs = s, *ks = qs + most * b.q, *vs = ks + most * b.kv, *os = vs + most * b.kv;
	for (int64_t u0 = 0, n; u0 < total; u0 += n) {
		n = attn_block_at(&b, u0, per);
		widen(q, u0 * b.q, qs, n * b.q, storage);
		widen(k, u0 * b.kv, ks, n * b.kv, storage);
		widen(v, u0 * b.kv, vs, n * b.kv, storage);
		planrt_k_attention_f32(qs, ks, vs, mask ? mask + b.bmask : NULL, mask_strides, os, lse + u0 * b.lse, rank,
				       b.bdims, b.bkv, sk, scale, mask_kind, p, seed, key, gdims, b.boffs, scratch);
		narrow(os, out, u0 * b.q, n * b.q, storage);
	}
	free(s);
}

void planrt_k_attention_grad_16(const void *q, const void *k, const void *v, const float *mask,
				const int64_t *mask_strides, const void *out, const float *lse, const void *dout, void *dq,
				void *dk, void *dv, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				double scale, int mask_kind, double p, uint64_t seed, uint64_t key, const int64_t *gdims,
				const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage)
{
	check_storage(storage, "attention_grad_16");
	AttnBlocks b;
	attn_blocks(&b, rank, ldims, kv_heads, sk, mask_strides, offs, "attention_grad_16");
	int64_t per = attn_block_units(&b, 4, 4), total = b.nlead * kv_heads, most = per < total ? per : total;
	float *s = scratch_floats(most * (4 * b.q + 4 * b.kv), "attention_grad_16");
	float *qs = s, *os = qs + most * b.q, *gs = os + most * b.q, *dqs = gs + most * b.q;
	float *ks = dqs + most * b.q, *vs = ks + most * b.kv, *dks = vs + most * b.kv, *dvs = dks + most * b.kv;
	for (int64_t u0 = 0, n; u0 < total; u0 += n) {
		n = attn_block_at(&b, u0, per);
		widen(q, u0 * b.q, qs, n * b.q, storage);
		widen(out, u0 * b.q, os, n * b.q, storage);
		widen(dout, u0 * b.q, gs, n * b.q, storage);
		widen(k, u0 * b.kv, ks, n * b.kv, storage);
		widen(v, u0 * b.kv, vs, n * b.kv, storage);
		planrt_k_attention_grad_f32(qs, ks, vs, mask ? mask + b.bmask : NULL, mask_strides, os, lse + u0 * b.lse, gs,
					    dqs, dks, dvs, rank, b.bdims, b.bkv, sk, scale, mask_kind, p, seed, key, gdims,
					    b.boffs, scratch);
		narrow(dqs, dq, u0 * b.q, n * b.q, storage);
		narrow(dks, dk, u0 * b.kv, n * b.kv, storage);
		narrow(dvs, dv, u0 * b.kv, n * b.kv, storage);
	}
	free(s);
}
