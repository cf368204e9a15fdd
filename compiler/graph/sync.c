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
 * The ops made here for local SGD and async describe the traffic for --dump-after=sync; state.c
 * writes the kernels that run it. Tied parameters copied to two pipeline stages have their
 * gradients all-reduced between those two stages (Megatron's embedding group). */
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

static int flat_value(Graph *g, DType t, long long elems, const char *name)
{
	long long d[1] = {elems};
	int v = graph_add_value(g, t, 1, d, NULL);
	g->vals[v].name = name;
	g->vals[v].role = ROLE_GRAD;
	return v;
}

/* One bucket's collective on `axis`. */
static Op *emit_bucket(Sync *s, OpKind kind, int axis, int stage, DType t, long long elems, bool per_step,
		       double every, const char *name, int role, int peer)
{
	Graph *g = s->g;
	int in = flat_value(g, t, elems, name);
	Op *op = add(s);
	op->kind = kind;
	op->nin = 1;
	op->in[0] = in;
	if (kind != OP_SEND) {
		int out = flat_value(g, t, kind == OP_ALL_GATHER ? elems * g->ps->axes[axis].size : elems, name);
		if (kind == OP_REDUCE_SCATTER)
			g->vals[out].lay.on[axis] = LAYOUT_FLAT;
		op->nout = 1;
		op->out[0] = out;
		g->vals[out].def = s->list.n - 1;
	}
	if (kind == OP_REDUCE_SCATTER)
		g->vals[in].lay.on[axis] = LAYOUT_R;
	op->axis = axis;
	op->stage = stage;
	op->per_step = per_step;
	op->backward = true;
	op->every = every;
	op->role = role;
	op->peer = peer;
	return op;
}

typedef struct Pending {
	int stage;
	DType dtype;
	long long elems;
	int count;
	int members[4096];
} Pending;

int sync_axis(const PlanSpec *ps)
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

static void flush(Sync *s, Pending *p, OpKind kind, int axis, bool per_step, double every, const char *what)
{
	if (p->elems == 0)
		return;
	const char *name = arena_printf(s->g->arena, "%s bucket (%d tensors)", what, p->count);
	Op *op = emit_bucket(s, kind, axis, p->stage, p->dtype, p->elems, per_step, every, name, RANKROLE_ANY, -1);
	op->members = arena_alloc(s->g->arena, sizeof(int) * (size_t)p->count);
	memcpy(op->members, p->members, sizeof(int) * (size_t)p->count);
	op->nmembers = p->count;
	p->elems = 0;
	p->count = 0;
}

bool sync_grads(Graph *g)
{
	PlanSpec *ps = g->ps;
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
	 * come after the buckets. */
	bool per_micro = ps->zero_stage >= 2 && ps->zero_axis >= 0 && ps->axes[ps->zero_axis].size > 1;
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
	int nstages = g->nstages;
	/* parameters in the order their gradients complete: reverse of the update order */
	int nupd = 0;
	int *upd = malloc(sizeof(int) * (size_t)(g->nops + 1));
	if (!upd)
		ICE("out of memory");
	for (int i = first_update; i < g->nops; i++)
		if (g->ops[i].kind == OP_OPTIMIZER_STEP)
			upd[nupd++] = i;
	double bucket_bytes = ps->bucket_bytes > 0 ? ps->bucket_bytes : 25.0 * 1024 * 1024;
	/* every other axis first: a gradient is whole on them before the ZeRO axis splits it */
	int order[MAX_AXES], norder = 0;
	for (int a = 0; a < ps->naxes; a++)
		if (a != ps->zero_axis)
			order[norder++] = a;
	if (ps->zero_axis >= 0)
		order[norder++] = ps->zero_axis;
	for (int oa = 0; oa < norder; oa++) {
		int a = order[oa];
		bool zero_axis = a == ps->zero_axis && ps->zero_stage >= 1 && ps->axes[a].size > 1;
		bool data_like = false;
		for (int r = 0; r < ps->nrules; r++)
			if (ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim) &&
			    ps->rules[r].axis == a)
				data_like = true;
		bool local_sgd = data_like && ps->sync == SYNC_LOCAL_SGD;
		bool async = data_like && ps->sync == SYNC_ASYNC;
		bool compressed = data_like && ps->compress != COMPRESS_NONE;
		bool per_step = !per_micro;
		Pending *pend = calloc((size_t)nstages, sizeof(Pending));
		if (!pend)
			ICE("out of memory");
		for (int k = nupd - 1; k >= 0; k--) {
			const Op *u = &g->ops[upd[k]];
			int grad = u->in[1];
			Value *gv = &g->vals[grad];
			if (gv->lay.on[a] != LAYOUT_P)
				continue;
			OpKind kind = zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE;
			long long elems = value_local_elems(g, grad);
			DType t = gv->dtype;
			gv->lay.on[a] = zero_axis && ps->zero_stage >= 2 ? LAYOUT_FLAT : LAYOUT_R;
			if (local_sgd || async)
				continue;
			Pending *p = &pend[u->stage];
			if (p->elems && p->dtype != t)
				flush(&s, p, kind, a, per_step, 0, compressed ? "compressed gradient" : "gradient");
			if (p->count == (int)(sizeof p->members / sizeof p->members[0]))
				flush(&s, p, kind, a, per_step, 0, compressed ? "compressed gradient" : "gradient");
			p->stage = u->stage;
			p->dtype = t;
			p->elems += elems;
			p->members[p->count++] = grad;
			if ((double)p->elems * dtype_bytes(t) >= bucket_bytes)
				flush(&s, p, kind, a, per_step, 0, compressed ? "compressed gradient" : "gradient");
		}
		for (int st = 0; st < nstages; st++)
			flush(&s, &pend[st], zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, a, per_step, 0,
			      compressed ? "compressed gradient" : "gradient");
		if (local_sgd || async) {
			/* parameters (not gradients) travel: averaged every K steps, or to and from the master */
			for (int st = 0; st < nstages; st++) {
				long long elems = 0;
				DType t = ps->param_dtype;
				for (int k = 0; k < nupd; k++)
					if (g->ops[upd[k]].stage == st)
						elems += value_local_elems(g, g->ops[upd[k]].in[0]);
				if (!elems)
					continue;
				if (local_sgd) {
					emit_bucket(&s, OP_ALL_REDUCE, a, st, ps->master_dtype, elems, true, ps->every,
						    "parameter average", RANKROLE_ANY, -1);
				} else {
					/* each worker: gradients (and its loss and parameter version) out, parameters
					 * back; the master serves every worker */
					int n = ps->axes[a].size;
					long long msg = elems + 16 / dtype_bytes(t);
					emit_bucket(&s, OP_SEND, a, st, t, msg, true, 0, "gradients to the master", RANKROLE_WORKER, 0);
					emit_bucket(&s, OP_RECV, a, st, t, elems, true, 0, "parameters from the master",
						    RANKROLE_WORKER, 0);
					for (int w = 1; w < n; w++) {
						emit_bucket(&s, OP_RECV, a, st, t, msg, true, 0, "gradients from a worker", RANKROLE_MASTER,
							    w);
						emit_bucket(&s, OP_SEND, a, st, t, elems, true, 0, "parameters to a worker",
							    RANKROLE_MASTER, w);
					}
				}
			}
		}
		free(pend);
	}
	/* tied parameter copies on two stages: sum their gradients over the pipe axis */
	if (ps->pipe_axis >= 0)
		for (int k = 0; k < nupd; k++) {
			const Op *u = &g->ops[upd[k]];
			int p = u->in[0];
			int orig = g->vals[p].tied_to;
			if (orig < 0)
				continue;
			int ou = -1;
			for (int j = 0; j < nupd; j++)
				if (g->ops[upd[j]].in[0] == orig)
					ou = upd[j];
			if (ou < 0)
				continue;
			Op *op = add(&s);
			op->kind = OP_ALL_REDUCE;
			op->nin = 2;
			op->in[0] = g->ops[ou].in[1];
			op->in[1] = u->in[1];
			op->nout = 0;
			op->axis = ps->pipe_axis;
			op->stage = g->ops[ou].stage;
			op->stage_group[0] = g->ops[ou].stage;
			op->stage_group[1] = u->stage;
			op->per_step = true;
			op->backward = true;
			op->loc = g->ops[g->vals[p].def].loc;
			op->src = g->ops[g->vals[p].def].src;
		}
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
