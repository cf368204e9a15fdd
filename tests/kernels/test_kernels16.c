/* test_kernels16.c: the 16-bit variants of sum_to, the norms, the embedding, RoPE, the
 * cross-entropy and the fused attention (planrt_k_*_16 and planrt_cross_entropy_16, which a bf16 or
 * f16 program calls on its 2-byte activations instead of casting them into f32 copies) against the
 * path they replace: every 16-bit operand cast whole to f32, the _f32 kernel, every 16-bit result
 * cast back. They must agree bit for bit, in bf16 and in f16, on shapes that fit one block of rows,
 * that take several (the last one short), rows longer than a block, the sums that reduce a whole
 * tensor (streamed through the eight partial sums) or keep some dims (blocked by the outer dim),
 * RoPE in place and by blocks of samples (the position table must follow each block), and
 * attention blocks of one kv head, one sample (over two leading dims) or whole indices of the first
 * dim (the bound lowered: dropout and the mask must follow each block), with the outputs that accumulate (sum_to_acc's out, the weight
 * gradients) starting from non-zero values, stored as f32 and as the 16-bit type (`acc`: widened,
 * summed in f32 and rounded once, as the casts around an f32 accumulator). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "report.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void) /* in [-1, 1) */
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static void *xalloc(size_t n)
{
	void *p = calloc(n ? n : 1, 1);
	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	return p;
}

/* n random values stored as t (2 bytes each) */
static uint16_t *random_16(int64_t n, planrt_dtype_t t)
{
	float *f = xalloc(sizeof(float) * (size_t)n);
	uint16_t *h = xalloc(sizeof(uint16_t) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		f[i] = 2 * uniform();
	planrt_cast(f, planrt_f32, h, t, n);
	free(f);
	return h;
}

static float *random_f32(int64_t n)
{
	float *f = xalloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		f[i] = uniform();
	return f;
}

static float *widened(const uint16_t *h, int64_t n, planrt_dtype_t t)
{
	if (!h)
		return NULL;
	float *f = xalloc(sizeof(float) * (size_t)n);
	planrt_cast(h, t, f, planrt_f32, n);
	return f;
}

static uint16_t *narrowed(const float *f, int64_t n, planrt_dtype_t t)
{
	uint16_t *h = xalloc(sizeof(uint16_t) * (size_t)n);
	planrt_cast(f, planrt_f32, h, t, n);
	return h;
}

static float *copy_f32(const float *f, int64_t n)
{
	float *c = xalloc(sizeof(float) * (size_t)n);
	memcpy(c, f, sizeof(float) * (size_t)n);
	return c;
}

static int same(const void *a, const void *b, size_t bytes)
{
	return memcmp(a, b, bytes) == 0;
}

static const char *tname(planrt_dtype_t t)
{
	return t == planrt_bf16 ? "bf16" : t == planrt_f16 ? "f16" : "f32";
}

/* A sum over rows (sum_to's out, a norm's dw / db) stored as acc, starting from the values v0 (acc
 * f32), or v0 rounded (acc bf16 / f16): the kernel's buffer; acc_ref is its f32 copy for the f32
 * kernel, and acc_same compares what the kernel left with the f32 kernel's result stored as acc. */
static void *acc_start(const float *v0, int64_t n, planrt_dtype_t acc)
{
	return acc == planrt_f32 ? (void *)copy_f32(v0, n) : (void *)narrowed(v0, n, acc);
}

static float *acc_ref(const void *start, int64_t n, planrt_dtype_t acc)
{
	return acc == planrt_f32 ? copy_f32(start, n) : widened(start, n, acc);
}

static int acc_same(const void *got, const float *ref, int64_t n, planrt_dtype_t acc)
{
	if (!got)
		return 1;
	if (acc == planrt_f32)
		return same(got, ref, 4 * (size_t)n);
	uint16_t *r = narrowed(ref, n, acc);
	int ok = same(got, r, 2 * (size_t)n);
	free(r);
	return ok;
}

static void layer_norm(planrt_dtype_t t, planrt_dtype_t acc, int64_t rows, int64_t cols, int with_w, int with_b)
{
	int64_t n = rows * cols;
	uint16_t *x = random_16(n, t), *w = with_w ? random_16(cols, t) : NULL, *b = with_b ? random_16(cols, t) : NULL;
	uint16_t *y = xalloc(2 * (size_t)n), *dy = random_16(n, t), *dx = xalloc(2 * (size_t)n);
	float *mean = xalloc(4 * (size_t)rows), *rstd = xalloc(4 * (size_t)rows);
	float *dw0 = random_f32(cols), *db0 = random_f32(cols);
	void *dw = acc_start(dw0, cols, acc), *db = acc_start(db0, cols, acc);
	float *rdw = acc_ref(dw, cols, acc), *rdb = acc_ref(db, cols, acc);
	planrt_k_layer_norm_16(x, w, b, y, mean, rstd, rows, cols, 1e-5, t);
	planrt_k_layer_norm_grad_16(x, w, mean, rstd, dy, dx, with_w ? dw : NULL, with_b ? db : NULL, rows, cols, acc, t);

	float *x32 = widened(x, n, t), *w32 = widened(w, cols, t), *b32 = widened(b, cols, t), *dy32 = widened(dy, n, t);
	float *y32 = xalloc(4 * (size_t)n), *dx32 = xalloc(4 * (size_t)n);
	float *rmean = xalloc(4 * (size_t)rows), *rrstd = xalloc(4 * (size_t)rows);
	planrt_k_layer_norm_f32(x32, w32, b32, y32, rmean, rrstd, rows, cols, 1e-5);
	planrt_k_layer_norm_grad_f32(x32, w32, rmean, rrstd, dy32, dx32, with_w ? rdw : NULL, with_b ? rdb : NULL, rows,
				     cols);
	uint16_t *ry = narrowed(y32, n, t), *rdx = narrowed(dx32, n, t);
	report(same(y, ry, 2 * (size_t)n) && same(mean, rmean, 4 * (size_t)rows) && same(rstd, rrstd, 4 * (size_t)rows),
	       "layer_norm_16 %s %lld x %lld%s%s: y, mean, rstd as the casts and layer_norm_f32", tname(t),
	       (long long)rows, (long long)cols, with_w ? " w" : "", with_b ? " b" : "");
	report(same(dx, rdx, 2 * (size_t)n) && acc_same(dw, rdw, cols, acc) && acc_same(db, rdb, cols, acc),
	       "layer_norm_grad_16 %s %lld x %lld%s%s, dw / db %s: dx, dw, db as the casts and layer_norm_grad_f32",
	       tname(t), (long long)rows, (long long)cols, with_w ? " w" : "", with_b ? " b" : "", tname(acc));
	void *all[] = {x, w, b, y, dy, dx, mean, rstd, dw0, db0, dw, db, x32, w32, b32, dy32, y32, dx32, rmean, rrstd,
		       rdw, rdb, ry, rdx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

static void rms_norm(planrt_dtype_t t, planrt_dtype_t acc, int64_t rows, int64_t cols, int with_w)
{
	int64_t n = rows * cols;
	uint16_t *x = random_16(n, t), *w = with_w ? random_16(cols, t) : NULL;
	uint16_t *y = xalloc(2 * (size_t)n), *dy = random_16(n, t), *dx = xalloc(2 * (size_t)n);
	float *rstd = xalloc(4 * (size_t)rows), *dw0 = random_f32(cols);
	void *dw = acc_start(dw0, cols, acc);
	float *rdw = acc_ref(dw, cols, acc);
	planrt_k_rms_norm_16(x, w, y, rstd, rows, cols, 1e-6, t);
	planrt_k_rms_norm_grad_16(x, w, rstd, dy, dx, with_w ? dw : NULL, rows, cols, acc, t);

	float *x32 = widened(x, n, t), *w32 = widened(w, cols, t), *dy32 = widened(dy, n, t);
	float *y32 = xalloc(4 * (size_t)n), *dx32 = xalloc(4 * (size_t)n), *rrstd = xalloc(4 * (size_t)rows);
	planrt_k_rms_norm_f32(x32, w32, y32, rrstd, rows, cols, 1e-6);
	planrt_k_rms_norm_grad_f32(x32, w32, rrstd, dy32, dx32, with_w ? rdw : NULL, rows, cols);
	uint16_t *ry = narrowed(y32, n, t), *rdx = narrowed(dx32, n, t);
	report(same(y, ry, 2 * (size_t)n) && same(rstd, rrstd, 4 * (size_t)rows) && same(dx, rdx, 2 * (size_t)n) &&
		       acc_same(dw, rdw, cols, acc),
	       "rms_norm_16 and rms_norm_grad_16 %s %lld x %lld%s, dw %s: y, rstd, dx, dw as the casts and the f32 kernels",
	       tname(t), (long long)rows, (long long)cols, with_w ? " w" : "", tname(acc));
	void *all[] = {x, w, y, dy, dx, rstd, dw0, dw, x32, w32, dy32, y32, dx32, rrstd, rdw, ry, rdx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* in of dims summed into out (stored as acc), whose strides keep the dims where keep[d] */
static void sum_to(planrt_dtype_t t, planrt_dtype_t acc, int rank, const int64_t *dims, const int *keep,
		   const char *what)
{
	int64_t n = 1, ostr[8], out_elems = 1;
	for (int d = 0; d < rank; d++)
		n *= dims[d];
	for (int d = rank - 1; d >= 0; d--) {
		ostr[d] = keep[d] ? out_elems : 0;
		out_elems *= keep[d] ? dims[d] : 1;
	}
	uint16_t *in = random_16(n, t);
	float *in32 = widened(in, n, t), *out0 = random_f32(out_elems);
	void *sum = acc_start(out0, out_elems, acc), *ovr = acc_start(out0, out_elems, acc);
	float *rsum = acc_ref(sum, out_elems, acc), *rovr = acc_ref(ovr, out_elems, acc);
	planrt_k_sum_to_acc_16(rank, dims, in, ostr, sum, out_elems, acc, t);
	planrt_k_sum_to_acc_f32(rank, dims, in32, ostr, rsum, out_elems);
	planrt_k_sum_to_16(rank, dims, in, ostr, ovr, out_elems, acc, t);
	planrt_k_sum_to_f32(rank, dims, in32, ostr, rovr, out_elems);
	report(acc_same(sum, rsum, out_elems, acc) && acc_same(ovr, rovr, out_elems, acc),
	       "sum_to_16 and sum_to_acc_16 %s into %s, %s (%lld elements into %lld): as the cast and the f32 kernels",
	       tname(t), tname(acc), what, (long long)n, (long long)out_elems);
	void *all[] = {in, in32, out0, sum, ovr, rsum, rovr};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* The embedding of ntok tokens from this rank's vocab rows [vocab_lo, vocab_lo + vocab) of a table. */
static void embed(planrt_dtype_t t, int64_t ntok, int64_t dim, int64_t vocab_lo, int64_t vocab)
{
	uint16_t *table = random_16(vocab * dim, t), *out = xalloc(2 * (size_t)(ntok * dim));
	int32_t *ids = xalloc(4 * (size_t)ntok);
	for (int64_t i = 0; i < ntok; i++)
		ids[i] = (int32_t)((i * 131) % (vocab_lo + vocab + 5)); /* some outside this rank's rows */
	float *t32 = widened(table, vocab * dim, t), *o32 = xalloc(4 * (size_t)(ntok * dim));
	planrt_k_embed_16(table, ids, out, ntok, dim, vocab_lo, vocab, t);
	planrt_k_embed_f32(t32, ids, o32, ntok, dim, vocab_lo, vocab);
	uint16_t *ro = narrowed(o32, ntok * dim, t);
	report(same(out, ro, 2 * (size_t)(ntok * dim)),
	       "embed_16 %s, %lld tokens of %lld, rows [%lld, %lld): as the casts and embed_f32", tname(t),
	       (long long)ntok, (long long)dim, (long long)vocab_lo, (long long)(vocab_lo + vocab));
	void *all[] = {table, out, ids, t32, o32, ro};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* Dropout of a local block ldims at offs of gdims (rank 3; balanced: a block in two halves apart). */
static void dropout(planrt_dtype_t t, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, double p,
		    const char *what)
{
	int64_t n = ldims[0] * ldims[1] * ldims[2];
	uint16_t *x = random_16(n, t), *y = xalloc(2 * (size_t)n);
	uint8_t *mask = xalloc((size_t)n), *mask32 = xalloc((size_t)n);
	float *x32 = widened(x, n, t), *y32 = xalloc(4 * (size_t)n);
	planrt_k_dropout_16(x, y, mask, p, 41, 7, 3, gdims, ldims, offs, t);
	planrt_k_dropout_f32(x32, y32, mask32, p, 41, 7, 3, gdims, ldims, offs);
	uint16_t *ry = narrowed(y32, n, t);
	int64_t kept = 0;
	for (int64_t i = 0; i < n; i++)
		kept += mask[i];
	report(same(y, ry, 2 * (size_t)n) && same(mask, mask32, (size_t)n) && (p > 0 ? kept < n : kept == n),
	       "dropout_16 %s, %s, p %g: y and the mask as the casts and dropout_f32 (%lld of %lld kept)", tname(t), what,
	       p, (long long)kept, (long long)n);
	void *all[] = {x, y, mask, mask32, x32, y32, ry};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* The cross-entropy over rows x cols logits (this rank's columns from vocab_lo) and its gradient. */
static void cross_entropy(planrt_dtype_t t, int64_t rows, int64_t cols, int64_t vocab_lo)
{
	int64_t n = rows * cols;
	uint16_t *x = random_16(n, t), *dx = xalloc(2 * (size_t)n);
	int32_t *targets = xalloc(4 * (size_t)rows);
	for (int64_t r = 0; r < rows; r++)
		targets[r] = (int32_t)((r * 7919) % (cols + vocab_lo + 3)); /* some outside this rank's columns */
	float loss = 0, rloss = 0, *lse = xalloc(4 * (size_t)rows), *rlse = xalloc(4 * (size_t)rows);
	float *scratch = xalloc(12 * (size_t)rows);
	double correct = 2, rcorrect = 2;
	planrt_cross_entropy_16(x, targets, &loss, lse, rows, cols, vocab_lo, 0.25, &correct, NULL, (uint8_t *)scratch, t);
	planrt_k_ce_grad_16(x, targets, lse, rows, cols, vocab_lo, 0.5, dx, t);
	float *x32 = widened(x, n, t), *dx32 = xalloc(4 * (size_t)n);
	planrt_cross_entropy_f32(x32, targets, &rloss, rlse, rows, cols, vocab_lo, 0.25, &rcorrect, NULL, scratch);
	planrt_k_ce_grad_f32(x32, targets, rlse, rows, cols, vocab_lo, 0.5, dx32);
	uint16_t *rdx = narrowed(dx32, n, t);
	report(same(&loss, &rloss, 4) && same(lse, rlse, 4 * (size_t)rows) && correct == rcorrect &&
		       same(dx, rdx, 2 * (size_t)n),
	       "cross_entropy_16 and cross_entropy_grad_16 %s %lld x %lld from column %lld: loss, lse, correct, dlogits "
	       "as the casts and the f32 kernels",
	       tname(t), (long long)rows, (long long)cols, (long long)vocab_lo);
	void *all[] = {x, dx, targets, lse, rlse, scratch, x32, dx32, rdx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* RoPE over [batch, seq, heads, head_dim] (or heads first), rotating rot_dim of each head's dims,
 * at positions from a table (pos) or the sequence index; x and y apart, or y in place over x. */
static void rope(planrt_dtype_t t, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim,
		 int heads_first, int with_pos, int in_place, const char *what)
{
	int64_t n = batch * seq * heads * head_dim;
	uint16_t *x = random_16(n, t), *y = in_place ? x : xalloc(2 * (size_t)n), *dy = random_16(n, t);
	uint16_t *dx = in_place ? dy : xalloc(2 * (size_t)n);
	int32_t *pos = xalloc(4 * (size_t)(batch * seq));
	for (int64_t i = 0; i < batch * seq; i++)
		pos[i] = (int32_t)((i * 37) % 500);
	float *x32 = widened(x, n, t), *dy32 = widened(dy, n, t), *y32 = xalloc(4 * (size_t)n), *dx32 = xalloc(4 * (size_t)n);
	planrt_k_rope_f32(x32, y32, batch, seq, heads, head_dim, rot_dim, heads_first, with_pos ? pos : NULL, seq, 3, 9,
			  10000.0);
	planrt_k_rope_grad_f32(dy32, dx32, batch, seq, heads, head_dim, rot_dim, heads_first, with_pos ? pos : NULL, seq, 3,
			       9, 10000.0);
	uint16_t *ry = narrowed(y32, n, t), *rdx = narrowed(dx32, n, t);
	planrt_k_rope_16(x, y, batch, seq, heads, head_dim, rot_dim, heads_first, with_pos ? pos : NULL, seq, 3, 9, 10000.0,
			 t);
	planrt_k_rope_grad_16(dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, with_pos ? pos : NULL, seq, 3, 9,
			      10000.0, t);
	report(same(y, ry, 2 * (size_t)n) && same(dx, rdx, 2 * (size_t)n),
	       "rope_16 and rope_grad_16 %s, %s: y and dx as the casts and the f32 kernels", tname(t), what);
	void *all[] = {x, dy, pos, x32, dy32, y32, dx32, ry, rdx, in_place ? NULL : y, in_place ? NULL : dx};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

/* The fused attention: q [lead.., H, S, Dh], k and v [lead.., Hk, S, Dh], causal or an additive mask,
 * dropout p, on scores whose global shape puts this block at offset `at` on the first dim (dropout
 * indexes the global score); block: the widened floats a block of units may hold (small: several
 * blocks, each a unit or a few). */
static void attention(planrt_dtype_t t, int rank, const int64_t *ldims, int64_t kv_heads, int mask_kind, double p,
		      int64_t at, int64_t block, const char *what)
{
	int64_t heads = ldims[rank - 3], S = ldims[rank - 2], dh = ldims[rank - 1], lead = 1;
	for (int d = 0; d < rank - 3; d++)
		lead *= ldims[d];
	int64_t nq = lead * heads * S * dh, nkv = lead * kv_heads * S * dh, nl = lead * heads * S;
	int64_t gdims[8], offs[16], mstr[8], nmask = 1;
	for (int d = 0; d < rank; d++) {
		gdims[d] = d == rank - 1 ? S : ldims[d] + (d == 0 ? at + 1 : 0); /* the scores' [.., H, S, S] */
		offs[d] = d == 0 ? at : 0;
		offs[rank + d] = offs[d] + (d == rank - 2 ? S / 2 : 0);
	}
	for (int d = rank - 1; d >= 0; d--) { /* a mask over [.., H, S, S] */
		mstr[d] = nmask;
		nmask *= d == rank - 1 ? S : ldims[d];
	}
	uint16_t *q = random_16(nq, t), *k = random_16(nkv, t), *v = random_16(nkv, t), *dout = random_16(nq, t);
	float *mask = mask_kind == 2 ? random_f32(nmask) : NULL, *lse = xalloc(4 * (size_t)nl), *rlse = xalloc(4 * (size_t)nl);
	uint16_t *out = xalloc(2 * (size_t)nq), *dq = xalloc(2 * (size_t)nq), *dk = xalloc(2 * (size_t)nkv),
		 *dv = xalloc(2 * (size_t)nkv);
	uint8_t *scratch = xalloc(sizeof(float) * (size_t)(3 * 64 * 64 + 2 * 64 * dh + 64 * dh + 3 * 64));
	int64_t saved = planrt_k16_attention_block_;
	planrt_k16_attention_block_ = block;
	planrt_k_attention_16(q, k, v, mask, mstr, out, lse, rank, ldims, kv_heads, S, 0.3, mask_kind, p, 11, 3, gdims,
			      offs, scratch, t);
	planrt_k_attention_grad_16(q, k, v, mask, mstr, out, lse, dout, dq, dk, dv, rank, ldims, kv_heads, S, 0.3,
				   mask_kind, p, 11, 3, gdims, offs, scratch, t);
	planrt_k16_attention_block_ = saved;

	float *q32 = widened(q, nq, t), *k32 = widened(k, nkv, t), *v32 = widened(v, nkv, t), *g32 = widened(dout, nq, t);
	float *o32 = xalloc(4 * (size_t)nq), *dq32 = xalloc(4 * (size_t)nq), *dk32 = xalloc(4 * (size_t)nkv),
	      *dv32 = xalloc(4 * (size_t)nkv);
	planrt_k_attention_f32(q32, k32, v32, mask, mstr, o32, rlse, rank, ldims, kv_heads, S, 0.3, mask_kind, p, 11, 3,
			       gdims, offs, scratch);
	uint16_t *ro = narrowed(o32, nq, t);
	float *o32n = widened(ro, nq, t); /* the backward reads out as the program stored it */
	planrt_k_attention_grad_f32(q32, k32, v32, mask, mstr, o32n, rlse, g32, dq32, dk32, dv32, rank, ldims, kv_heads,
				    S, 0.3, mask_kind, p, 11, 3, gdims, offs, scratch);
	uint16_t *rdq = narrowed(dq32, nq, t), *rdk = narrowed(dk32, nkv, t), *rdv = narrowed(dv32, nkv, t);
	report(same(out, ro, 2 * (size_t)nq) && same(lse, rlse, 4 * (size_t)nl),
	       "attention_16 %s, %s: out and lse as the casts and attention_f32", tname(t), what);
	report(same(dq, rdq, 2 * (size_t)nq) && same(dk, rdk, 2 * (size_t)nkv) && same(dv, rdv, 2 * (size_t)nkv),
	       "attention_grad_16 %s, %s: dq, dk, dv as the casts and attention_grad_f32", tname(t), what);
	void *all[] = {q, k, v, dout, mask, lse, rlse, out, dq, dk, dv, scratch, q32, k32, v32, g32, o32, dq32, dk32,
		       dv32, ro, o32n, rdq, rdk, rdv};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

int main(void)
{
	planrt_dtype_t types[] = {planrt_bf16, planrt_f16};
	for (int i = 0; i < 2; i++) {
		planrt_dtype_t t = types[i];
		for (int a = 0; a < 2; a++) { /* the sums over rows f32, then stored as t */
			planrt_dtype_t acc = a ? t : planrt_f32;
			layer_norm(t, acc, 3, 5, 1, 1);
			layer_norm(t, acc, 700, 1000, 1, 1); /* 262 rows a block: three blocks, the last short */
			layer_norm(t, acc, 97, 129, 1, 0);
			layer_norm(t, acc, 64, 33, 0, 0);
			layer_norm(t, acc, 2, 300001, 1, 1); /* a row longer than a block */
			rms_norm(t, acc, 5, 7, 1);
			rms_norm(t, acc, 600, 1024, 1);
			rms_norm(t, acc, 33, 100, 0);
			rms_norm(t, acc, 3, 270000, 1);
			int64_t bias[] = {1000, 300}, all[] = {600001}, all2[] = {700, 901}, mid[] = {4, 5, 6},
				lead1[] = {1, 2000, 300}, kept_inner[] = {3, 1100, 97};
			int keep_bias[] = {0, 1}, keep_all[] = {0, 0}, keep_mid[] = {0, 1, 0}, keep_lead1[] = {0, 0, 1},
			    keep_inner[] = {1, 0, 1};
			sum_to(t, acc, 2, bias, keep_bias, "a bias gradient [1000, 300] -> [300] (two blocks)");
			sum_to(t, acc, 1, all, keep_all, "all of [600001] (streamed, a tail of 1)");
			sum_to(t, acc, 2, all2, keep_all, "all of [700, 901]");
			sum_to(t, acc, 3, mid, keep_mid, "[4, 5, 6] -> [5]");
			sum_to(t, acc, 3, lead1, keep_lead1, "[1, 2000, 300] -> [300] (blocked by the second dim)");
			sum_to(t, acc, 3, kept_inner, keep_inner, "[3, 1100, 97] -> [3, 97]");
		}
		rope(t, 5, 300, 4, 64, 64, 0, 1, 0, "[5, 300, 4, 64], positions from a table, 3 samples a block");
		rope(t, 3, 33, 5, 40, 24, 1, 0, 1, "[3, 5, 33, 40] heads first, 24 dims rotated, in place");
		rope(t, 2, 1100, 2, 128, 128, 0, 0, 0, "[2, 1100, 2, 128], a sample a block");
		embed(t, 300, 48, 20, 100);
		/* offsets: where the block starts, then where its second half starts on each dim */
		int64_t dg[] = {4, 64, 48}, dl[] = {2, 64, 48}, doff[] = {2, 0, 0, 3, 32, 24}, whole[] = {0, 0, 0, 2, 32, 24};
		int64_t bl[] = {4, 16, 48}, boff[] = {0, 8, 0, 2, 48, 24}; /* rows 8-15 and 48-55 of 64 */
		dropout(t, dg, dl, doff, 0.1, "samples 2-3 of [4, 64, 48]");
		dropout(t, dg, bl, boff, 0.5, "rows 8-15 and 48-55 of [4, 64, 48] (a balanced block's halves)");
		dropout(t, dg, dg, whole, 0.0, "[4, 64, 48] whole (p 0: every element kept)");
		cross_entropy(t, 13, 50001, 0); /* 5 rows a block: three blocks */
		cross_entropy(t, 7, 97, 40);
		int64_t b4[] = {3, 4, 37, 16}, h3[] = {8, 45, 24}, b5[] = {2, 3, 2, 19, 8};
		attention(t, 4, b4, 2, 1, 0.1, 2, 1, "[3, 4, 37, 16], kv 2, causal, dropout 0.1, at batch 2, a kv head a block");
		attention(t, 4, b4, 2, 1, 0.1, 2, 15000,
			  "[3, 4, 37, 16], kv 2, causal, dropout 0.1, at batch 2, samples 2 + 1 (forward), 1 (backward) a block");
		attention(t, 4, b4, 4, 2, 0.0, 0, 1 << 22, "[3, 4, 37, 16], kv 4, an additive mask, one block");
		attention(t, 4, b4, 4, 2, 0.1, 0, 1, "[3, 4, 37, 16], kv 4, an additive mask, dropout 0.1, a kv head a block");
		attention(t, 3, h3, 8, 2, 0.0, 0, 1, "[8, 45, 24], kv 8, an additive mask, a head a block");
		attention(t, 3, h3, 2, 1, 0.2, 1, 12000, "[8, 45, 24], kv 2 (groups of 4), causal, dropout 0.2, a group a block");
		attention(t, 5, b5, 1, 0, 0.0, 0, 1, "[2, 3, 2, 19, 8], kv 1, no mask, a sample (two leading dims) a block");
		attention(t, 5, b5, 1, 2, 0.1, 1, 3000,
			  "[2, 3, 2, 19, 8], kv 1, an additive mask, dropout 0.1, an index of the first dim a block");
	}
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
