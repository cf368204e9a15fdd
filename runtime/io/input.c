/* input.c: the load_input kernel (planrt_load_data), which fills a model input's buffer with this
 * rank's block of the step's global batch: token windows of a token file (tokens and targets, the
 * positions [s_lo, s_lo + s_n) of each row under sequence parallelism), or a data set's named
 * tensor (dataset.c). data.c decides which samples a step draws; evaluation reads the held-out
 * batches instead. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h"
#include "planrt_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the rows of a batch before the positions this rank holds are cut out (grown, kept for the run) */
static int32_t *input_scratch;
static size_t input_scratch_n;

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
	size_t need = 2 * (size_t)rows * (size_t)seq;
	if (need > input_scratch_n) {
		free(input_scratch);
		input_scratch = malloc(sizeof(int32_t) * need);
		input_scratch_n = input_scratch ? need : 0;
		if (!input_scratch)
			planrt_fatal("out of memory loading a batch of %lld samples", (long long)rows);
	}
	int32_t *tok = input_scratch, *tgt = tok + rows * seq;
	if (ctx->eval_batch >= 0) /* evaluating: a held-out batch */
		PLANRT_CHECK(planrt_data_eval_batch_(ctx->data, ctx->eval_batch, row_lo, row_lo + rows, ctx->seed, tok, tgt));
	else
		PLANRT_CHECK(planrt_data_batch(ctx->data, ctx->step, row_lo, row_lo + rows, ctx->seed, tok, tgt));
	const int32_t *from = stream ? tgt : tok;
	for (int64_t r = 0; r < rows; r++)
		memcpy(dst + r * s_n, from + r * seq + s_lo, sizeof(int32_t) * (size_t)s_n);
}

/* a token file's labels against the classes of the cross-entropy they feed (once) */
static int tokens_checked;

void planrt_load_data(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
		      const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes)
{
	planrt_dataset_t d = planrt_data_set(ctx->data);
	if (d) {
		planrt_dataset_load_(d, ctx, dst, name, t, rank, gdims, ldims, offs, classes);
		return;
	}
	/* token windows: tokens (0) and targets (1), i32 [B, S] */
	char a[128];
	if (input > 1 || t != planrt_i32 || rank != 2)
		planrt_fatal("the data is a token file: it gives token windows (tokens, then targets, i32 [B, S]), "
			     "but input '%s' is %s %s; pass a data set whose tensors are named after the inputs (a "
			     ".safetensors file or a directory of NAME.npy files)",
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
	input_scratch = NULL;
	input_scratch_n = 0;
	tokens_checked = 0;
}
