/* passes.c: the one driver that runs the middle end's passes in order (QBE's main.c,
 * Halide's Lower.cpp). After any pass the IR can be printed: `planc --dump-after=shard ...`.
 *
 *   graph      elaborate the model into ops over concrete shapes (graph.c)
 *   pipeline   stage partition, tied-parameter copies, sends and receives, schedule (pipeline.c)
 *   autodiff   backward graph and optimizer update (autodiff.c)
 *   shard      layouts per mesh axis, collectives inserted (shard.c)
 *   recompute  activation recomputation (recompute.c)
 *   zero       ZeRO state sharding (zero.c)
 *   sync       gradient synchronisation (sync.c)
 *   check      the collective-sequence check over every rank (schedule.c) */
#include "planc.h"

#include <string.h>

const char *const pass_names[] = {"graph", "pipeline", "autodiff", "shard", "recompute", "zero", "sync", "check", NULL};

static bool dump_if(const char *want, const char *pass, Graph *g, FILE *out)
{
	if (!want || strcmp(want, pass))
		return false;
	fprintf(out, "# IR after %s: %d ops, %d values\n", pass, g->nops, g->nvals);
	graph_dump(out, g);
	return true;
}

Graph *run_passes(PlanSpec *ps, const char *dump_after, FILE *dump_out)
{
	Graph *g = graph_build(ps);
	if (!g)
		return NULL;
	dump_if(dump_after, "graph", g, dump_out);
	static bool (*const passes[])(Graph *) = {pipeline, autodiff, shard, recompute, zero, sync_grads, check_collectives};
	for (int i = 0; i < (int)(sizeof passes / sizeof passes[0]); i++) {
		if (!passes[i](g) || diag_error_count())
			return NULL;
		dump_if(dump_after, pass_names[i + 1], g, dump_out);
	}
	return g;
}
