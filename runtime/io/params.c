/* params.c: the running program's parameters: where this rank's block of each sits in the global
 * tensor, whether this rank writes it to a checkpoint (replicas do not), and planrt_init_param,
 * the init phase's kernel: a block drawn from the seed (rng.c) or read from --init (under --map's
 * names when given). The program and the name map come with the phase's context. */
#define PLANRT_INTERNAL
#include "planrt_params.h"

#include "planrt_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the parameter's entry in the running program's table (ctx->program, set by planrt_main and by
 * the reshard's played ranks) */
static const planrt_param_t *param_of(const planrt_ctx_t *ctx, int param)
{
	const planrt_program_t *prog = ctx->program;
	if (!prog)
		planrt_fatal("internal error: a planrt_program.h kernel called outside a program's run");
	if (param < 0 || param >= prog->nparams)
		planrt_fatal("internal error: parameter %d of %d", param, prog->nparams);
	return &prog->params[param];
}

/* the local block's offsets in the global tensor; returns its element count */
int64_t planrt_param_block_(const planrt_param_t *p, int64_t *offs)
{
	int64_t n = 1;
	for (int d = 0; d < p->rank; d++) {
		offs[d] = p->split_axis[d] >= 0 ? (int64_t)planrt_mesh_coord(p->split_axis[d]) * p->ldims[d] : 0;
		n *= p->ldims[d];
	}
	return n;
}

/* Does this rank write its piece of p? Replicas (coordinate > 0 on an axis that neither splits p,
 * nor is the pipeline, nor holds ZeRO shards of it) skip. */
int planrt_param_writes_(const planrt_program_t *prog, const planrt_param_t *p, int shard_axis)
{
	for (int a = 0; a < prog->naxes; a++) {
		if (a == shard_axis || a == prog->pipe_axis)
			continue;
		int splits = 0;
		for (int d = 0; d < p->rank; d++)
			splits |= p->split_axis[d] == a;
		if (!splits && planrt_mesh_coord(a) != 0)
			return 0;
	}
	return 1;
}

/* A parameter's block from --init under planc's names; a file under Hugging Face's names (no
 * --map given) gets the fix named */
static void read_init_block(planrt_st_t f, const planrt_param_t *p, const int64_t *offs, float *block)
{
	if (planrt_st_read_block(f, p->name, p->rank, p->gdims, p->ldims, offs, block) == planrt_success)
		return;
	char cause[600];
	snprintf(cause, sizeof cause, "%s", planrt_last_error());
	int dtype;
	int64_t n;
	const void *data;
	if (planrt_st_find_(f, "model.embed_tokens.weight", &dtype, &n, &data) == planrt_success)
		planrt_fatal("--init: %s; the file is under Hugging Face's names (model.embed_tokens.weight): pass --map "
			     "NAMES.map, e.g. stdlib/maps/hf_llama.map (docs/namemap.md)",
			     cause);
	planrt_fatal("--init: %s", cause);
}

void planrt_init_param(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int64_t lo, int64_t n)
{
	const planrt_param_t *p = param_of(ctx, param);
	if (dtype != planrt_f32 && dtype != planrt_bf16)
		planrt_fatal("internal error: parameter '%s' initialised as dtype %d; f32 or bf16", p->name, (int)dtype);
	if (n <= 0)
		return;
	int64_t offs[PLANRT_PARAM_MAX_DIMS];
	int64_t local = planrt_param_block_(p, offs);
	/* [j0, j1): the positions that hold local elements; the rest is padding */
	int64_t j0 = lo < 0 ? (-lo < n ? -lo : n) : 0;
	int64_t j1 = local - lo < n ? local - lo : n;
	if (j1 < j0)
		j1 = j0;
	if (j1 <= j0)
		return;
	/* from --init: the whole block is read (the file's layout); else only the elements wanted are
	 * drawn (each from its global index alone), so a record initialised in pieces costs its size */
	int from_file = ctx->init_file && !(p->init_kind >= PLANRT_INIT_ARANGE && p->init_kind <= PLANRT_INIT_ROPE_SIN);
	int64_t first = from_file ? lo + j0 : 0, count = from_file ? local : j1 - j0;
	float *block = malloc(sizeof(float) * (size_t)count);
	if (!block)
		planrt_fatal("out of memory initialising '%s' (%lld elements)", p->name, (long long)count);
	if (from_file) {
		if (ctx->name_map)
			PLANRT_CHECK(planrt_namemap_read_block(ctx->name_map, ctx->init_file, param, p->ldims, offs, block));
		else
			read_init_block(ctx->init_file, p, offs, block);
		for (int64_t i = 0; i < local; i++) /* training from a NaN or Inf would only spread it */
			if (!isfinite(block[i]))
				planrt_fatal("--init: tensor '%s' holds %s at element %lld of this rank's block; refusing to "
					     "train from non-finite weights (the file was saved from a diverged run?)",
					     p->name, isnan(block[i]) ? "NaN" : block[i] > 0 ? "+Inf" : "-Inf", (long long)i);
	}
	else
		planrt_init_range(block, p->rank, p->gdims, p->ldims, offs, lo + j0, count, p->init_kind, p->a, p->b,
				  ctx->seed, p->name);
	/* positions outside [j0, j1) are left as they are: a ZeRO bucket shard holds several
	 * parameters, each initialising its own part */
	if (dtype == planrt_f32)
		memcpy((float *)dst + j0, block + first, sizeof(float) * (size_t)(j1 - j0));
	else
		planrt_k_f32_to_bf16(block + first, (uint16_t *)dst + j0, j1 - j0);
	free(block);
}
