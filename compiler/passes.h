/* passes.h: the pass driver (passes.c): the graph passes in order, then the back end's, with
 * --dump-after after any of them and the IR verifier between them; main.c's CLI calls it. */
#ifndef PLANC_PASSES_H
#define PLANC_PASSES_H

#include "explain/explain.h"

Graph *run_passes(PlanSpec *ps, const char *dump_after, FILE *dump_out);
extern const char *const pass_names[];
/* The back end's driver (passes.c): lower, state, overlap, memplan, with --dump-after after each
 * and the IR verifier between passes when verify. NULL after reporting errors. */
Lowered *run_backend(Graph *g, const char *dump_after, FILE *dump_out, bool verify);
/* The emit pass: DIR/prog.c, printed after it when dump_after is "emit". */
bool run_emit(const Lowered *low, const char *dir, const char *source_path, bool layer_loops, const char *dump_after,
	      FILE *dump_out);
bool dump_after_emit(const char *path, FILE *out);
/* The decode graph for generation (decode.c), printed after it when dump_after is "decode". NULL
 * after reporting why the model cannot generate. */
Graph *run_decode(PlanSpec *ps, const Graph *train, const char *dump_after, FILE *dump_out);

#endif
