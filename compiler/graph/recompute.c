/* recompute.c: activation recomputation (Chen et al. 2016; Korthikanti et al. 2022).
 *
 * After autodiff and sharding, a backward op reads forward values: those are the activations kept
 * alive from the forward pass until the backward. This pass trades memory for compute by
 * re-running forward ops inside the backward instead of keeping their outputs:
 *   - always: an all-gather output (sequence parallelism's gathered layer-norm output) is not
 *     kept; the all-gather is repeated in the backward and its sharded input is kept instead,
 *     as Megatron-LM does;
 *   - `recompute selective`: ops inside an @recompute fn (the stdlib's core attention: the
 *     O(s^2) scores, softmax and dropout) are recomputed from that fn's inputs;
 *   - `recompute full`: every op of a layer is recomputed from the layer's input.
 * A clone is placed just before the first backward op that needs it and shared by the others. */
#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>

typedef struct Remat {
	Graph *g;
	RecomputeMode mode;
	OpList list;
	int *memo; /* value -> recomputed copy, or -1 */
	int nmemo;
	char *escapes; /* value read by a forward op outside @recompute fns: a region output, kept */
} Remat;

static bool recomputable(const Remat *r, const Op *op)
{
	if (op->backward || op->per_step)
		return false;
	switch (op->kind) {
	case OP_PARAM:
	case OP_INPUT:
	case OP_RECV:
	case OP_SEND:
	case OP_FILL:
		return false;
	default:
		break;
	}
	if (op->kind == OP_ALL_GATHER)
		return true;
	if (r->mode == RECOMPUTE_SELECTIVE)
		return op->in_recompute_fn;
	if (r->mode == RECOMPUTE_FULL)
		return op->layer >= 0;
	return false;
}

static int remat(Remat *r, int v, const Op *consumer)
{
	Graph *g = r->g;
	if (v < r->nmemo && r->memo[v] >= 0)
		return r->memo[v];
	int def = g->vals[v].def;
	if (def < 0 || !recomputable(r, &g->ops[def]))
		return v;
	if (r->mode == RECOMPUTE_SELECTIVE && g->ops[def].kind != OP_ALL_GATHER && v < r->nmemo && r->escapes[v])
		return v;
	Op clone = g->ops[def];
	/* the layer's input under full recompute is kept: stop at ops of another layer */
	for (int i = 0; i < clone.nin; i++) {
		int in = clone.in[i];
		int idef = g->vals[in].def;
		if (idef >= 0 && r->mode == RECOMPUTE_FULL && g->ops[idef].layer != clone.layer &&
		    g->ops[idef].kind != OP_ALL_GATHER)
			continue;
		clone.in[i] = remat(r, in, consumer);
	}
	for (int k = 0; k < clone.nout; k++) {
		int o = clone.out[k];
		const Value *ov = &g->vals[o];
		int c = graph_add_value(g, ov->dtype, ov->rank, ov->dim, (const char *const *)ov->dim_name);
		Value *cv = &g->vals[c];
		ov = &g->vals[o];
		cv->role = ov->role;
		cv->name = ov->name;
		cv->layer = ov->layer;
		cv->lay = ov->lay;
		cv->alias_of = ov->alias_of >= 0 ? clone.in[0] : -1;
		if (o < r->nmemo)
			r->memo[o] = c;
		clone.out[k] = c;
	}
	clone.backward = true;
	clone.recompute = true;
	clone.fwd_op = def;
	clone.stage = consumer->stage;
	oplist_add(r->g, &r->list, &clone);
	return r->memo[v];
}

bool recompute(Graph *g)
{
	Remat r = {0};
	r.g = g;
	r.mode = g->ps->recompute;
	r.nmemo = g->nvals;
	r.memo = malloc(sizeof(int) * (size_t)r.nmemo);
	if (!r.memo)
		ICE("out of memory");
	for (int i = 0; i < r.nmemo; i++)
		r.memo[i] = -1;
	/* what leaves a checkpointed region is kept, as torch.utils.checkpoint keeps its outputs */
	r.escapes = calloc((size_t)r.nmemo, 1);
	if (!r.escapes)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->backward || op->per_step || op->in_recompute_fn)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k];
			while (v >= 0) { /* through views and collectives back to the region's value */
				r.escapes[v] = 1;
				int d = g->vals[v].def;
				if (d < 0 || !(op_classes[g->ops[d].kind] == OPK_COLLECTIVE || op_classes[g->ops[d].kind] == OPK_VIEW) ||
				    !g->ops[d].in_recompute_fn)
					break;
				v = g->ops[d].in[0];
			}
		}
	}
	int *newpos = malloc(sizeof(int) * (size_t)g->nops);
	if (!newpos)
		ICE("out of memory");
	Op *old = g->ops;
	int nold = g->nops;
	for (int i = 0; i < nold; i++) {
		Op op = old[i];
		if (op.backward && !op.recompute)
			for (int k = 0; k < op.nin; k++)
				op.in[k] = remat(&r, op.in[k], &op);
		newpos[i] = r.list.n;
		oplist_add(g, &r.list, &op);
	}
	for (int i = 0; i < r.list.n; i++)
		if (r.list.ops[i].fwd_op >= 0)
			r.list.ops[i].fwd_op = newpos[r.list.ops[i].fwd_op];
	int nfwd = g->nfwd < nold ? newpos[g->nfwd] : r.list.n;
	free(newpos);
	free(r.memo);
	free(r.escapes);
	graph_set_ops(g, &r.list);
	g->nfwd = nfwd;
	return true;
}
