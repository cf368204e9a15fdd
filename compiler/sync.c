/* sync.c: gradient synchronisation, the part of a step where data-parallel replicas agree.
 *
 * After sharding, a parameter's gradient is a partial sum on every axis over which the batch (or
 * the sequence, for layer-norm weights under sequence parallelism) was split. This pass turns
 * those partial sums into the plan's `sync` strategy:
 *   strict     buckets of `bucket` bytes, filled in the order gradients become ready in the
 *              backward (last layer first, as PyTorch DDP does); one all-reduce per bucket, or a
 *              reduce-scatter on the ZeRO axis (stage 2 and 3: every micro-batch, since the
 *              full gradient is never stored; stage 1: once per step);
 *   compress   bf16 / fp16 halve the bytes; topk(r) sends r of the entries with their indices
 *              (an all-gather); powersgd(rank) sends two low-rank factors per matrix;
 *   local_sgd  no gradient traffic on the data axis: parameters are averaged every K steps;
 *   async      workers send gradients to the master (data coordinate 0, which also computes
 *              gradients on its own share of the batch, like a co-located parameter server),
 *              which updates and sends parameters back; the runtime enforces the staleness bound.
 * Tied parameters copied to two pipeline stages have their gradients all-reduced between those
 * two stages (Megatron's embedding group). */
#include "planc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Sync {
	Graph *g;
	PlanSpec *ps;
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

static DType wire_dtype(const PlanSpec *ps, DType t)
{
	if (ps->compress == COMPRESS_BF16 && t == DT_F32)
		return DT_BF16;
	if (ps->compress == COMPRESS_FP16 && t == DT_F32)
		return DT_F16;
	return t;
}

/* Gradient elements this rank sends for one parameter's gradient under compression. */
static long long compressed_elems(const Sync *s, int grad, OpKind *kind)
{
	const PlanSpec *ps = s->ps;
	const Value *v = &s->g->vals[grad];
	long long n = value_local_elems(s->g, grad);
	if (ps->compress == COMPRESS_TOPK) {
		*kind = OP_ALL_GATHER;
		long long k = (long long)ceil(ps->topk_ratio * (double)n);
		return 2 * (k < 1 ? 1 : k); /* value + index per entry */
	}
	if (ps->compress == COMPRESS_POWERSGD && v->rank >= 2) {
		long long rows = n / v->dim[v->rank - 1], cols = v->dim[v->rank - 1];
		long long r = ps->powersgd_rank;
		if ((rows + cols) * r < n)
			return (rows + cols) * r; /* P and Q factors */
	}
	return n;
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
	Sync s = {.g = g, .ps = ps};
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
			long long elems = data_like ? compressed_elems(&s, grad, &kind) : value_local_elems(g, grad);
			if (kind == OP_ALL_GATHER && zero_axis)
				kind = OP_REDUCE_SCATTER; /* sema refuses topk with ZeRO; keep the sizes sane */
			DType t = data_like ? wire_dtype(ps, gv->dtype) : gv->dtype;
			gv->lay.on[a] = zero_axis && ps->zero_stage >= 2 ? LAYOUT_FLAT : LAYOUT_R;
			if (local_sgd || async)
				continue;
			Pending *p = &pend[u->stage];
			if (p->elems && (p->dtype != t || kind != (zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE)))
				flush(&s, p, zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, a, per_step, 0, "gradient");
			if (kind == OP_ALL_GATHER) { /* top-k: one sparse all-gather per tensor */
				Op *tk = emit_bucket(&s, OP_ALL_GATHER, a, u->stage, DT_I32, elems, per_step, 0,
						     arena_printf(g->arena, "%s top-k", g->vals[u->in[0]].name), RANKROLE_ANY, -1);
				tk->members = arena_alloc(g->arena, sizeof(int));
				tk->members[0] = grad;
				tk->nmembers = 1;
				continue;
			}
			if (p->count == (int)(sizeof p->members / sizeof p->members[0]))
				flush(&s, p, kind, a, per_step, 0, "gradient");
			p->stage = u->stage;
			p->dtype = t;
			p->elems += elems;
			p->members[p->count++] = grad;
			if ((double)p->elems * dtype_bytes(t) >= bucket_bytes)
				flush(&s, p, kind, a, per_step, 0, "gradient");
		}
		for (int st = 0; st < nstages; st++)
			flush(&s, &pend[st], zero_axis ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, a, per_step, 0, "gradient");
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
					emit_bucket(&s, OP_ALL_REDUCE, a, st, t, elems, true, ps->every, "parameter average",
						    RANKROLE_ANY, -1);
				} else {
					/* each worker: gradients out, parameters back; the master serves every worker */
					int n = ps->axes[a].size;
					emit_bucket(&s, OP_SEND, a, st, wire_dtype(ps, t), elems, true, 0, "gradients to the master",
						    RANKROLE_WORKER, 0);
					emit_bucket(&s, OP_RECV, a, st, t, elems, true, 0, "parameters from the master",
						    RANKROLE_WORKER, 0);
					for (int w = 1; w < n; w++) {
						emit_bucket(&s, OP_RECV, a, st, wire_dtype(ps, t), elems, true, 0,
							    "gradients from a worker", RANKROLE_MASTER, w);
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
