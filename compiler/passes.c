/* passes.c: the one driver that runs the middle end's passes in order (QBE's main.c,
 * Halide's Lower.cpp). After any pass the IR can be printed: `planc --dump-after=shard ...`.
 *
 *   graph      elaborate the model into ops over concrete shapes (graph.c)
 *   attention  attention chains fused into one op with an online softmax (attention.c)
 *   pipeline   stage partition, tied-parameter copies, sends and receives, schedule (pipeline.c)
 *   autodiff   backward graph and optimizer update (autodiff.c)
 *   shard      layouts per mesh axis, collectives inserted (shard.c)
 *   recompute  activation recomputation (recompute.c)
 *   zero       ZeRO state sharding (zero.c)
 *   sync       gradient synchronisation (sync.c)
 * and the back end, on the loop-level IR of every stage program (run_backend):
 *   lower      graph ops to kernels over buffers (lower.c)
 *   ring       context parallelism: attention over a split sequence as the K/V ring (ring.c)
 *   state      persistent state, buckets, ZeRO, the optimizer, init and save (state.c)
 *   overlap    buckets during the backward, ZeRO-3 prefetch (overlap.c)
 *   offload_params, offload_activations
 *              parameters and saved activations in host memory (offload_params.c, offload_activations.c)
 *   inplace    an elementwise kernel's output over an input that dies at it (inplace.c)
 *   memplan    slots, inboxes and arena offsets (memplan.c)
 *   check      the collective-sequence check (schedule.c)
 *   streams    the device schedule: streams, events, joins (streams.c; printed by the CUDA target)
 *   layers     (an analysis, printed only) the runs of identical layers a loop would fold (layer_runs.c)
 *   emit       the C printer (emit_c.c), for planc emit and planc build (run_emit)
 * and, with --generate, beside them:
 *   decode     the model's decode graph for generation: one token per step, a key/value cache
 *              (decode.c; run_decode)
 * With verification on (the tests), the IR verifier runs after every back-end pass. */
#include "passes.h"

#include <string.h>

const char *const pass_names[] = {"graph", "attention", "pipeline", "autodiff", "shard", "recompute", "zero", "sync",
				  "lower", "ring", "state", "overlap", "offload_params", "offload_activations", "inplace", "memplan",
				  "check",
				  "streams", "layers", "decode", NULL};

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
	int errors_before = diag_error_count(); /* another plan's errors are not this one's */
	Graph *g = graph_build(ps);
	if (!g)
		return NULL;
	dump_if(dump_after, "graph", g, dump_out);
	static bool (*const passes[])(Graph *) = {fuse_attention, pipeline, autodiff, shard, recompute, zero,
						    sync_grads};
	for (int i = 0; i < (int)(sizeof passes / sizeof passes[0]); i++) {
		if (!passes[i](g) || diag_error_count() != errors_before)
			return NULL;
		dump_if(dump_after, pass_names[i + 1], g, dump_out);
	}
	return g;
}

/* The decode graph of the plan's model (generation, decode.c), printed after `--dump-after=decode`. */
Graph *run_decode(PlanSpec *ps, const Graph *train, const char *dump_after, FILE *dump_out)
{
	int errors_before = diag_error_count();
	Graph *g = decode_graph(ps, train);
	if (!g || diag_error_count() != errors_before)
		return NULL;
	dump_if(dump_after, "decode", g, dump_out);
	return g;
}

static void dump_backend(const char *want, const char *pass, const Lowered *low, FILE *out)
{
	if (!want || strcmp(want, pass))
		return;
	fprintf(out, "# loop-level IR after %s\n", pass);
	for (int i = 0; i < low->nprogs; i++)
		lprog_dump(out, low->progs[i]);
}

Lowered *run_backend(Graph *g, const char *dump_after, FILE *dump_out, bool verify)
{
	int errors_before = diag_error_count();
	Lowered *low = lower(g);
	if (verify && !verify_ir(low, "lower"))
		return NULL;
	dump_backend(dump_after, "lower", low, dump_out);
	static bool (*const passes[])(Lowered *) = {plan_ring, plan_state, plan_overlap, plan_offload_params,
						    plan_offload_activations, plan_inplace, memplan};
	static const char *const names[] = {"ring", "state", "overlap", "offload_params", "offload_activations", "inplace",
					    "memplan"};
	for (int i = 0; i < (int)(sizeof passes / sizeof passes[0]); i++) {
		if (!passes[i](low) || diag_error_count() != errors_before)
			return NULL;
		if (verify && !verify_ir(low, names[i]))
			return NULL;
		dump_backend(dump_after, names[i], low, dump_out);
	}
	if (!check_collectives(low) || diag_error_count() != errors_before)
		return NULL;
	dump_backend(dump_after, "check", low, dump_out);
	if (!plan_streams(low))
		return NULL;
	if (dump_after && !strcmp(dump_after, "streams")) {
		fprintf(dump_out, "# loop-level IR after streams\n");
		for (int i = 0; i < low->nprogs; i++)
			streams_dump(dump_out, low->progs[i]);
	}
	if (dump_after && !strcmp(dump_after, "layers"))
		layer_runs_dump(dump_out, low);
	return low;
}

/* The printer, as the last pass: writes DIR/prog.c, and prints it after `--dump-after=emit`. */
bool run_emit(const Lowered *low, const char *dir, const char *source_path, bool layer_loops, const char *dump_after,
	      FILE *dump_out)
{
	if (!emit_c(low, dir, source_path, layer_loops))
		return false;
	if (!dump_after || strcmp(dump_after, "emit"))
		return true;
	return dump_after_emit(arena_printf(low->g->arena, "%s/prog.c", dir), dump_out);
}

/* `--dump-after=emit`: a file the printer wrote, read back whole onto out under a header. */
bool dump_after_emit(const char *path, FILE *out)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "planc: error: cannot read back '%s'\n", path);
		return false;
	}
	char buf[65536];
	size_t n;
	fprintf(out, "# %s after emit\n", path);
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, n, out);
	fclose(f);
	return true;
}
