/* input.c: the load_input kernel (planrt_load_data), which fills a model input's buffer with this
 * rank's block of the step's global batch (or of a held-out batch while evaluating). data.c
 * decides which sample each row is; this file turns the rows into the input's values:
 *   - token data: `tokens` and `targets` (the first two inputs, i32 [B, S]: each window's tokens
 *     [0, S) and [1, S]), and by name the inputs a model of packed documents asks for:
 *     `positions` i32 [B, S] (each token's position in its document: Megatron's reset_position_ids)
 *     and `document_mask` f32 [B, 1, S, S] (0 where query i may attend key j: j <= i in the same
 *     document, -inf elsewhere; added to the attention scores, it keeps attention inside a
 *     document and is causal);
 *   - a data set: its tensor named after the input (dataset.c), or `padding_mask` f32 [B, 1, 1, S]
 *     built from its `lengths` tensor (0 on a sample's first lengths[i] keys, -inf on padding).
 * A rank loads its block of every dim (offs, ldims): rows, the positions sequence parallelism
 * gives it, the queries and keys of a mask. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* what loading keeps for the run (grown, freed by planrt_input_release_) */
static int32_t *input_scratch;
static size_t input_scratch_n;
static planrt_row_t *row_scratch;
static int64_t *sample_scratch;
static size_t row_scratch_n;
static int tokens_checked, documents_noted;

static void *grow(void *p, size_t *have, size_t need, size_t size)
{
	if (need <= *have)
		return p;
	free(p);
	p = malloc(size * need);
	*have = p ? need : 0;
	if (!p)
		planrt_fatal("out of memory loading a batch (%zu elements)", need);
	return p;
}

/* the rows [lo, lo + n) of the batch being run (the step's, or the held-out batch's) */
static const planrt_row_t *batch_rows(planrt_ctx_t *ctx, int64_t lo, int64_t n)
{
	if (n > (int64_t)row_scratch_n) {
		free(row_scratch);
		free(sample_scratch);
		row_scratch = malloc(sizeof *row_scratch * (size_t)n);
		sample_scratch = malloc(sizeof *sample_scratch * (size_t)n);
		if (!row_scratch || !sample_scratch)
			planrt_fatal("out of memory loading a batch of %lld samples", (long long)n);
		row_scratch_n = (size_t)n;
	}
	PLANRT_CHECK(planrt_data_rows_(ctx->data, ctx->step, ctx->eval_batch, lo, lo + n, ctx->seed, row_scratch));
	return row_scratch;
}

void planrt_load_input(planrt_ctx_t *ctx, int32_t *dst, int stream, int64_t row_lo, int64_t rows, int64_t s_lo,
		       int64_t s_n)
{
	if (!ctx->program)
		planrt_fatal("internal error: planrt_load_input outside a program's run");
	int64_t seq = ctx->program->seq;
	if ((stream != 0 && stream != 1) || row_lo < 0 || rows < 0 || s_lo < 0 || s_n < 0 || s_lo + s_n > seq)
		planrt_fatal("internal error: planrt_load_input(stream %d, rows [%lld, +%lld), positions [%lld, +%lld)) "
			     "of windows of %lld",
			     stream, (long long)row_lo, (long long)rows, (long long)s_lo, (long long)s_n, (long long)seq);
	if (!rows)
		return;
	const planrt_row_t *r = batch_rows(ctx, row_lo, rows);
	int32_t *w = input_scratch = grow(input_scratch, &input_scratch_n, (size_t)seq + 1, sizeof *input_scratch);
	for (int64_t i = 0; i < rows; i++) {
		planrt_data_window_(&r[i], seq, w);
		memcpy(dst + i * s_n, w + stream + s_lo, sizeof(int32_t) * (size_t)s_n);
	}
}

/* positions i32 [B, S]: each token's position in its document */
static void load_positions(planrt_ctx_t *ctx, int32_t *dst, const int64_t *ldims, const int64_t *offs)
{
	const planrt_row_t *r = batch_rows(ctx, offs[0], ldims[0]);
	for (int64_t i = 0; i < ldims[0]; i++)
		for (int64_t j = 0; j < ldims[1]; j++) {
			int64_t pos = offs[1] + j;
			dst[i * ldims[1] + j] = (int32_t)(pos - planrt_data_doc_start_(&r[i], pos));
		}
}

/* document_mask f32 [B, 1, S, S]: 0 where key k <= query q in the same document, -inf elsewhere */
static void load_document_mask(planrt_ctx_t *ctx, void *dst, planrt_dtype_t t, const int64_t *ldims,
			       const int64_t *offs)
{
	const planrt_row_t *r = batch_rows(ctx, offs[0], ldims[0]);
	size_t esize = planrt_dtype_size(t);
	float neg = -INFINITY, zero = 0.0f;
	uint16_t neg_half = t == planrt_f32 ? 0 : planrt_f32_to_half_(neg, t),
		 zero_half = t == planrt_f32 ? 0 : planrt_f32_to_half_(zero, t);
	unsigned char *out = dst;
	for (int64_t i = 0; i < ldims[0]; i++)
		for (int64_t q = 0; q < ldims[2]; q++) {
			int64_t query = offs[2] + q, start = planrt_data_doc_start_(&r[i], query);
			for (int64_t k = 0; k < ldims[3]; k++) {
				int64_t key = offs[3] + k;
				int open = key <= query && key >= start;
				unsigned char *o = out + (size_t)((i * ldims[2] + q) * ldims[3] + k) * esize;
				if (t == planrt_f32)
					memcpy(o, open ? &zero : &neg, 4);
				else
					memcpy(o, open ? &zero_half : &neg_half, 2);
			}
		}
}

/* the derived inputs of token data, by name (0: not one of them) */
static int load_document_input(planrt_ctx_t *ctx, void *dst, const char *name, planrt_dtype_t t, int rank,
			       const int64_t *gdims, const int64_t *ldims, const int64_t *offs)
{
	int64_t seq = ctx->program->seq;
	char a[128];
	int positions = !strcmp(name, "positions"), mask = !strcmp(name, "document_mask");
	if (!positions && !mask)
		return 0;
	int ok = positions ? t == planrt_i32 && rank == 2 && gdims[1] == seq
			   : t != planrt_i32 && rank == 4 && gdims[1] == 1 && gdims[2] == seq && gdims[3] == seq;
	if (!ok)
		planrt_fatal("input '%s' is %s %s but token data gives %s; declare it so (docs/data.md)", name,
			     t == planrt_i32 ? "i32" : "float", planrt_shape_text_(rank, gdims, a, sizeof a),
			     positions ? "positions as i32[B, S]" : "document_mask as f32[B, 1, S, S]");
	if (!documents_noted && planrt_world_rank_() == 0 && !planrt_data_has_documents_(ctx->data))
		fprintf(stderr, "planrt: note: input '%s': the data has no document boundaries (a Megatron .idx gives "
				"them), so each window is one document%s\n",
			name, mask ? " and document_mask is the causal mask" : "");
	documents_noted = 1;
	if (positions)
		load_positions(ctx, dst, ldims, offs);
	else
		load_document_mask(ctx, dst, t, ldims, offs);
	return 1;
}

/* a data set's input: its tensor, or padding_mask from `lengths` */
static void load_set_input(planrt_ctx_t *ctx, planrt_dataset_t d, void *dst, const char *name, planrt_dtype_t t,
			   int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes)
{
	const planrt_row_t *r = batch_rows(ctx, offs[0], ldims[0]);
	for (int64_t i = 0; i < ldims[0]; i++)
		sample_scratch[i] = r[i].at;
	d = r[0].set ? r[0].set : d; /* --eval-data: the evaluation data set */
	if (!strcmp(name, "padding_mask") && !planrt_dataset_has_(d, name)) {
		planrt_dataset_padding_mask_(d, sample_scratch, dst, t, rank, gdims, ldims, offs);
		return;
	}
	planrt_dataset_load_(d, sample_scratch, dst, name, t, rank, gdims, ldims, offs, classes);
}

static void load_block(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
		       const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes);

/* A block in two halves apart in the global tensor (a balanced ring's: planrt_block_split_dim) is
 * loaded half by half into a temporary block and placed. */
void planrt_load_data(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
		      const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes)
{
	int m = rank >= 1 && rank <= 8 ? planrt_block_split_dim(rank, ldims, offs) : -1;
	if (m < 0) {
		load_block(ctx, dst, input, name, t, rank, gdims, ldims, offs, classes);
		return;
	}
	size_t esize = planrt_dtype_size(t);
	int64_t outer = 1, inner = 1, elems = 1;
	for (int d = 0; d < rank; d++) {
		outer *= d < m ? ldims[d] : 1;
		inner *= d > m ? ldims[d] : 1;
		elems *= ldims[d];
	}
	char *half = malloc((size_t)elems * esize + 1);
	if (!half)
		planrt_fatal("out of memory loading input '%s'", name);
	for (int h = 0; h < 2; h++) {
		int64_t hdims[8], hoffs[16];
		int64_t first = planrt_block_half(rank, ldims, offs, m, h, hdims, hoffs);
		planrt_load_data(ctx, half, input, name, t, rank, gdims, hdims, hoffs, classes);
		size_t run = (size_t)(hdims[m] * inner) * esize;
		for (int64_t o = 0; o < outer; o++)
			memcpy((char *)dst + (size_t)((o * ldims[m] + first) * inner) * esize, half + (size_t)o * run, run);
	}
	free(half);
}

static void load_block(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
		       const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes)
{
	planrt_dataset_t d = planrt_data_set(ctx->data);
	if (d) {
		load_set_input(ctx, d, dst, name, t, rank, gdims, ldims, offs, classes);
		return;
	}
	if (load_document_input(ctx, dst, name, t, rank, gdims, ldims, offs))
		return;
	/* token windows: tokens (0) and targets (1), i32 [B, S] */
	char a[128];
	if (input > 1 || t != planrt_i32 || rank != 2)
		planrt_fatal("the data is token data: it gives token windows (tokens, then targets, i32 [B, S]) and, by "
			     "name, positions and document_mask, but input '%s' is %s %s; pass a data set whose tensors are "
			     "named after the inputs (a .safetensors file or a directory of NAME.npy files)",
			     name, t == planrt_i32 ? "i32" : "float", planrt_shape_text_(rank, gdims, a, sizeof a));
	if (classes > 0 && !tokens_checked) {
		tokens_checked = 1;
		int64_t pos = 0;
		int32_t bad = 0;
		if (planrt_data_check_tokens_(ctx->data, classes, &pos, &bad))
			planrt_fatal("the data's token %d at offset %lld is a target (input '%s'), a label of a "
				     "cross_entropy over %lld classes, outside [0, %lld); fix the data or the model's "
				     "number of classes",
				     bad, (long long)pos, name, (long long)classes, (long long)classes);
	}
	planrt_load_input(ctx, dst, input, offs[0], ldims[0], offs[1], ldims[1]);
}

void planrt_input_release_(void)
{
	free(input_scratch);
	free(row_scratch);
	free(sample_scratch);
	input_scratch = NULL;
	row_scratch = NULL;
	sample_scratch = NULL;
	input_scratch_n = row_scratch_n = 0;
	tokens_checked = documents_noted = 0;
}
