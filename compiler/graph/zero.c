/* zero.c: ZeRO state sharding (Rajbhandari et al. 2020) over the plan's zero axis.
 *
 *   zero 1  optimizer states (and f32 master weights) are split evenly over the axis; after the
 *           optimizer step each rank all-gathers the updated parameters.
 *   zero 2  gradients are also split: sync.c reduce-scatters them instead of all-reducing.
 *   zero 3  parameters are split too: each use of a parameter in the forward and again in the
 *           backward is preceded by an all-gather of it (per micro-batch; freed after use).
 * Split here means flattened, padded and divided evenly (LAYOUT_FLAT), as DeepSpeed does, so
 * ZeRO never imposes divisibility on a parameter's dims.
 *
 * This pass decides whether ZeRO is in effect (the stage, over an axis of more than one rank) and
 * records it in g->zero, the one place later passes read it from; under ZeRO 3 it marks the
 * parameters flat and inserts the gathers before their uses, which are the model's dataflow. What
 * happens around the update (the sharded optimizer state, the gathers of the updated shards under
 * ZeRO 1 and 2) is state.c's, from g->zero. Offload placement is not a graph change either. */
#include "graph/graph.h"

#include <stdlib.h>

bool zero(Graph *g)
{
	PlanSpec *ps = g->ps;
	int za = ps->zero_axis;
	if (ps->zero_stage == 0 || za < 0 || ps->axes[za].size <= 1)
		return true; /* g->zero stays stage 0 */
	g->zero = (ZeroSharding){.stage = ps->zero_stage, .axis = za, .size = ps->axes[za].size};
	if (g->zero.stage < 3)
		return true; /* the state is laid out by state.c; the graph is unchanged */
	OpList list = {0};
	/* value -> gathered copy, per phase (0 forward, 1 backward) */
	int nv = g->nvals;
	int *gathered = malloc(sizeof(int) * (size_t)nv * 2);
	int *newpos = malloc(sizeof(int) * (size_t)g->nops);
	if (!gathered || !newpos)
		ICE("out of memory");
	for (int i = 0; i < nv * 2; i++)
		gathered[i] = -1;
	for (int i = 0; i < g->nops; i++) {
		Op op = g->ops[i];
		if (op.kind != OP_OPTIMIZER_STEP && op.kind != OP_PARAM) {
			for (int k = 0; k < op.nin; k++) {
				int v = op.in[k];
				if (v >= nv || g->vals[v].role != ROLE_PARAM)
					continue;
				int phase = op.backward ? 1 : 0;
				int *slot = &gathered[v * 2 + phase];
				if (*slot < 0) {
					const Value *pv = &g->vals[v];
					int full = graph_add_value(g, pv->dtype, pv->rank, pv->dim, (const char *const *)pv->dim_name);
					g->vals[full].role = ROLE_ACT;
					g->vals[full].name = g->vals[v].name;
					g->vals[full].layer = g->vals[v].layer;
					g->vals[full].lay = g->vals[v].lay;
					g->vals[full].lay.on[za] = LAYOUT_R;
					Op *ag = oplist_add(g, &list, NULL);
					ag->kind = OP_ALL_GATHER;
					ag->nin = 1;
					ag->in[0] = v;
					ag->nout = 1;
					ag->out[0] = full;
					op_inherit(ag, &op);
					ag->axis = za;
					*slot = full;
				}
				op.in[k] = *slot;
			}
		}
		newpos[i] = list.n;
		oplist_add(g, &list, &op);
	}
	/* mark what each rank stores */
	for (int v = 0; v < nv; v++) {
		Value *val = &g->vals[v];
		if (val->role == ROLE_PARAM && val->def >= 0 && g->ops[val->def].kind == OP_PARAM)
			val->lay.on[za] = LAYOUT_FLAT;
	}
	for (int i = 0; i < list.n; i++)
		if (list.ops[i].fwd_op >= 0)
			list.ops[i].fwd_op = list.ops[i].fwd_op < g->nops ? newpos[list.ops[i].fwd_op] : -1;
	g->nfwd = g->nfwd < g->nops ? newpos[g->nfwd] : list.n;
	free(gathered);
	free(newpos);
	graph_set_ops(g, &list);
	return true;
}
