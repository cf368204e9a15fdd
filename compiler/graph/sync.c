/* sync.c: gradient synchronisation, the part of a step where data-parallel replicas agree.
 *
 * After sharding, a parameter's gradient is a partial sum on every axis over which the batch (or
 * the sequence, for layer-norm weights under sequence parallelism) was split. This pass turns
 * those partial sums into the plan's `sync` strategy (docs/sync.md):
 *   strict     buckets of `bucket` bytes, filled in the order gradients become ready in the
 *              backward (last layer first, as PyTorch DDP does); one all-reduce per bucket, or a
 *              reduce-scatter on the ZeRO axis (stage 2 and 3: every micro-batch, since the
 *              full gradient is never stored; stage 1: once per step);
 *   compress   the same buckets on the batch axis, reduced by a compressor (state.c): bf16 / fp16
 *              on the wire, top-k entries with their indices (an all-gather), or PowerSGD's two
 *              low-rank factors per matrix (all-reduces), with error feedback when asked;
 *   local_sgd  no gradient traffic on the batch axis: parameters are averaged every K steps;
 *   async      workers send gradients to the master (coordinate 0 of the batch axis, which also
 *              computes gradients on its own share of the batch: a co-located parameter server),
 *              which updates and sends parameters back; the runtime enforces the staleness bound.
 * Tied parameters copied to two pipeline stages have their gradients all-reduced between those
 * two stages (Megatron's embedding group).
 *
 * The pass annotates; it inserts no communication ops. What it decides is g->sync: the mode, the
 * batch axis and whether it has replicas, compression, overlap, the buckets (axis, stage,
 * members, reduce-scatter or all-reduce, every micro-batch or once per step) and the tied pairs;
 * it marks the gradients' layouts (whole, or a flat ZeRO shard), and orders the ops so that the
 * updates come after the backward. state.c writes every kernel of it (--dump-after=sync prints
 * the annotation after the ops). */
#include "graph/graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Sync {
	Graph *g;
	OpList list;
} Sync;

static Op *add(Sync *s)
{
	return oplist_add(s->g, &s->list, NULL);
}

typedef struct Pending {
	int stage;
	DType dtype;
	long long elems;
	int count;
	int members[4096];
} Pending;

/* the axis the batch is split over, where local SGD averages and async masters serve (-1: none) */
static int sync_axis(const PlanSpec *ps)
{
	for (int r = 0; r < ps->nrules; r++)
		if (ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim))
			return ps->rules[r].axis;
	return -1;
}

/* Top-k keeps ceil(ratio * n) entries of each gradient block, at least one. */
long long topk_entries(const PlanSpec *ps, long long elems)
{
	long long k = (long long)ceil(ps->topk_ratio * (double)elems);
	return k < 1 ? 1 : k > elems ? elems : k;
}

/* PowerSGD factors a matrix (the block as rows x cols, cols its last dim) when the factors are
 * smaller than it; vectors and small matrices travel whole (the PowerSGD paper's choice). */
bool powersgd_factors(const PlanSpec *ps, long long rows, long long cols)
{
	return rows > 1 && cols > 1 && (rows + cols) * ps->powersgd_rank < rows * cols;
}

/* The pending gradients of a stage as one bucket of g->sync. */
static void flush(Graph *g, Pending *p, OpKind kind, int axis, bool per_step, const char *what)
{
	if (p->elems == 0)
		return;
	GradSync *gs = &g->sync;
	if (gs->nbuckets % 64 == 0) {
		GradBucket *more = arena_alloc(g->arena, sizeof(GradBucket) * (size_t)(gs->nbuckets + 64));
		if (gs->nbuckets)
			memcpy(more, gs->buckets, sizeof(GradBucket) * (size_t)gs->nbuckets);
		gs->buckets = more;
	}
	GradBucket *b = &gs->buckets[gs->nbuckets++];
	b->coll = kind;
	b->axis = axis;
	b->stage = p->stage;
	b->dtype = p->dtype;
	b->elems = p->elems;
	b->per_step = per_step;
	b->what = arena_printf(g->arena, "%s bucket (%d tensors)", what, p->count);
	b->members = arena_alloc(g->arena, sizeof(int) * (size_t)p->count);
	memcpy(b->members, p->members, sizeof(int) * (size_t)p->count);
	b->nmembers = p->count;
	p->elems = 0;
	p->count = 0;
}

/* The tied parameter copies on two stages, whose gradients are summed over the pipe axis. */
static void tied_pairs(Graph *g, const int *upd, int nupd)
{
	GradSync *gs = &g->sync;
	gs->tied = arena_alloc(g->arena, sizeof(TiedGrads) * (size_t)(nupd ? nupd : 1));
	for (int k = 0; k < nupd; k++) {
		const Op *u = &g->ops[upd[k]];
		int orig = g->vals[u->in[0]].tied_to;
		if (orig < 0)
			continue;
		int ou = -1;
		for (int j = 0; j < nupd; j++)
			if (g->ops[upd[j]].in[0] == orig)
				ou = upd[j];
		if (ou < 0)
			continue;
		gs->tied[gs->ntied++] = (TiedGrads){.stage = {g->ops[ou].stage, u->stage},
						    .grad = {g->ops[ou].in[1], u->in[1]},
						    .param = u->in[0]};
	}
}

/* The buckets of one axis a: every gradient that is a partial sum on it becomes whole (or, on the
 * ZeRO axis under ZeRO 2 and 3, this rank's flat shard), and under strict sync joins a bucket of
 * its stage, in the order the gradients complete (upd: the updates, last first). */
static void axis_buckets(Graph *g, int a, const int *upd, int nupd, bool per_micro)
{
	const PlanSpec *ps = g->ps;
	const ZeroSharding *z = &g->zero;
	bool zero_axis = a == z->axis && z->stage >= 1;
	bool data_like = false; /* the batch is split over a (an axis of a rule for the batch dim) */
	for (int r = 0; r < ps->nrules; r++)
		if (ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim) &&
		    ps->rules[r].axis == a)
			data_like = true;
	bool replicas_agree = data_like && (ps->sync == SYNC_LOCAL_SGD || ps->sync == SYNC_ASYNC);
	const char *what = data_like && ps->compress != COMPRESS_NONE ? "compressed gradient" : "gradient";
	OpKind kind = zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE;
	double bucket_bytes = ps->bucket_bytes > 0 ? ps->bucket_bytes : 25.0 * 1024 * 1024;
	Pending *pend = calloc((size_t)g->nstages, sizeof(Pending));
	if (!pend)
		ICE("out of memory");
	for (int k = nupd - 1; k >= 0; k--) {
		const Op *u = &g->ops[upd[k]];
		int grad = u->in[1];
		Value *gv = &g->vals[grad];
		if (gv->lay.on[a] != LAYOUT_P)
			continue;
		long long elems = value_local_elems(g, grad);
		DType t = gv->dtype;
		gv->lay.on[a] = zero_axis && z->stage >= 2 ? LAYOUT_FLAT : LAYOUT_R;
		if (replicas_agree)
			continue; /* local SGD and async move parameters, not gradients (state.c) */
		Pending *p = &pend[u->stage];
		if (p->elems && p->dtype != t)
			flush(g, p, kind, a, !per_micro, what);
		if (p->count == (int)(sizeof p->members / sizeof p->members[0]))
			flush(g, p, kind, a, !per_micro, what);
		p->stage = u->stage;
		p->dtype = t;
		p->elems += elems;
		p->members[p->count++] = grad;
		if ((double)p->elems * dtype_bytes(t) >= bucket_bytes)
			flush(g, p, kind, a, !per_micro, what);
	}
	for (int st = 0; st < g->nstages; st++)
		flush(g, &pend[st], kind, a, !per_micro, what);
	free(pend);
}

bool sync_grads(Graph *g)
{
	PlanSpec *ps = g->ps;
	GradSync *gs = &g->sync;
	gs->mode = ps->sync;
	gs->axis = sync_axis(ps);
	gs->replicas = gs->axis >= 0 && ps->axes[gs->axis].size > 1;
	/* (bf16 gradients sent as bf16 are not compressed: the warning says so) */
	gs->compress = ps->sync == SYNC_STRICT && ps->compress != COMPRESS_NONE && gs->replicas && ps->param_dtype == DT_F32;
	gs->overlap = ps->overlap;
	Sync s = {.g = g};
	int first_update = -1;
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].kind == OP_OPTIMIZER_STEP) {
			first_update = i;
			break;
		}
	if (first_update < 0)
		first_update = g->nops;
	/* Everything but the updates runs first: the forward and backward, and the conversions that
	 * shard.c put before each update to bring a gradient to its parameter's layout (a gradient
	 * is synchronised after those). With ZeRO 2/3 gradients leave the rank every micro-batch, so
	 * those conversions run every micro-batch too. The updates, and what reads their results,
	 * come after the buckets (which state.c writes between them). */
	bool per_micro = g->zero.stage >= 2;
	char *after = calloc((size_t)g->nops + 1, 1);
	if (!after)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind == OP_OPTIMIZER_STEP)
			after[i] = 1;
		for (int k = 0; k < op->nin && !after[i]; k++) {
			int d = g->vals[op->in[k]].def;
			if (d >= 0 && after[d])
				after[i] = 1;
		}
	}
	for (int i = 0; i < g->nops; i++) {
		if (after[i])
			continue;
		Op *op = add(&s);
		*op = g->ops[i];
		if (per_micro && i >= first_update && op->per_step) {
			op->per_step = false;
			op->backward = true;
		}
	}
	/* parameters in the order their gradients complete: reverse of the update order */
	int nupd = 0;
	int *upd = malloc(sizeof(int) * (size_t)(g->nops + 1));
	if (!upd)
		ICE("out of memory");
	for (int i = first_update; i < g->nops; i++)
		if (g->ops[i].kind == OP_OPTIMIZER_STEP)
			upd[nupd++] = i;
	/* every other axis first: a gradient is whole on them before the ZeRO axis splits it */
	for (int a = 0; a < ps->naxes; a++)
		if (a != ps->zero_axis)
			axis_buckets(g, a, upd, nupd, per_micro);
	if (ps->zero_axis >= 0)
		axis_buckets(g, ps->zero_axis, upd, nupd, per_micro);
	if (ps->pipe_axis >= 0)
		tied_pairs(g, upd, nupd);
	for (int i = 0; i < g->nops; i++) {
		if (!after[i])
			continue;
		Op *op = add(&s);
		*op = g->ops[i];
		if (ps->sync == SYNC_ASYNC && op->kind == OP_OPTIMIZER_STEP)
			op->role = RANKROLE_MASTER;
	}
	free(after);
	free(upd);
	graph_set_ops(g, &s.list);
	return true;
}
