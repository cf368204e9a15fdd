/* test_check.c: the collective-sequence check (compiler/lower/schedule.c) still finds every mismatch
 * after it became linear in the distinct groups. Plans of a million ranks (and an async plan with
 * 2,000 workers) are compiled through planc_core; then one communication of one program is
 * changed and check_collectives must refuse the plan with the right message, and accept it again
 * once the change is undone:
 *   - a pipeline send of a different size: the point-to-point stream between two stages differs;
 *   - a pipeline send removed: the next stage would wait forever for it;
 *   - the tied embedding's all-reduce of a different size on one of its two stages;
 *   - the async master receiving a different size from its last worker (coordinate 1999): the
 *     check must still visit every worker's stream, not only the first.
 * Prints PASS/FAIL lines and `N passed, N failed`; exits 1 on any failure. */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/report.h"

static const char model[] =
	"import std.nn\n"
	"model gpt(V = 256, S = 64, D = 128, H = 8, L = 8) {\n"
	"  input tokens : i32[B, S]\n"
	"  input targets : i32[B, S]\n"
	"  param wte : f32[V, D] ~ normal(0, 0.02)\n"
	"  param wpe : f32[S, D] ~ normal(0, 0.02)\n"
	"  x = embed(wte, tokens) + wpe\n"
	"  repeat L { x = nn.block(x, heads = H, ffn = 4 * D) }\n"
	"  loss = cross_entropy(nn.layernorm(x) @ wte.T, targets)\n"
	"}\n"
	"plan pp for gpt {\n"
	"  mesh data = 31250, pipe = 4, tensor = 8\n"
	"  batch B = 125000, micro_batches = 4\n"
	"  shard B -> data\n"
	"  use nn.megatron(tensor)\n"
	"  pipeline pipe: 1f1b\n"
	"}\n"
	"plan async for gpt {\n"
	"  mesh data = 2000, tensor = 8\n"
	"  batch B = 2000\n"
	"  shard B -> data\n"
	"  use nn.megatron(tensor)\n"
	"  sync async, staleness = 2\n"
	"}\n";

static char diag_text[1 << 16];

/* check_collectives with the diagnostics captured in diag_text */
static bool check(const Lowered *low)
{
	FILE *f = fmemopen(diag_text, sizeof diag_text - 1, "w");
	diag_set_stream(f);
	diag_reset();
	bool ok = check_collectives(low);
	fclose(f);
	diag_set_stream(NULL);
	diag_reset();
	return ok;
}

static const Lowered *compile(Program *p, const char *name)
{
	Item *plan = default_plan(p, name);
	PlanSpec *ps = plan ? sema_plan(p, plan) : NULL;
	Graph *g = ps ? run_passes(ps, NULL, NULL) : NULL;
	return g ? run_backend(g, NULL, NULL, false) : NULL;
}

/* The first communication of the program (stage, role) with collective kind on its pipe/async
 * axis (peer >= 0: to or from that peer; pair: a tied-parameter group). */
static Comm *find_comm(const Lowered *low, int stage, int role, OpKind kind, int peer, bool pair, Kernel **kernel)
{
	LProg *p = lowered_prog(low, stage, role);
	for (int i = 0; p && i < p->nk; i++)
		for (int c = 0; c < p->k[i].ncomm; c++) {
			Comm *m = &p->k[i].comm[c];
			if (m->coll == kind && (peer < 0 || m->peer == peer) && (m->pair >= 0) == pair) {
				*kernel = &p->k[i];
				return m;
			}
		}
	return NULL;
}

/* Changes *elems, expects the check to fail with want in its message, and undoes it. */
static void expect_mismatch(const Lowered *low, const char *what, long long *elems, const char *want)
{
	long long saved = *elems;
	*elems += 1;
	bool ok = check(low);
	report(!ok && strstr(diag_text, want), "%s: refused with '%s'%s%s", what, want, ok ? " (accepted!)" : ": ",
	       ok ? "" : diag_text);
	*elems = saved;
	report(check(low), "%s undone: accepted again", what);
}

int main(void)
{
	char path[] = "/tmp/planc-test-check-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || write(fd, model, sizeof model - 1) != (ssize_t)(sizeof model - 1) || close(fd) != 0) {
		perror("test_check: temporary plan");
		return 2;
	}
	Arena *a = arena_new();
	Program *p = load_program(a, path);
	if (!p || !sema_check(p)) {
		fprintf(stderr, "test_check: the plans do not compile\n");
		remove(path);
		return 2;
	}

	const Lowered *pp = compile(p, "pp");
	if (report(pp != NULL, "pp (1,000,000 ranks, 4 stages) compiles and checks")) {
		report(check(pp), "pp: unchanged, the check accepts it");
		Kernel *k;
		Comm *send = find_comm(pp, 1, RANKROLE_ANY, OP_SEND, 2, false, &k);
		if (report(send != NULL, "pp: stage 1 sends to stage 2")) {
			expect_mismatch(pp, "a pipeline send one element longer", &send->elems, "point-to-point (rank ");
			int saved = k->ncomm;
			k->ncomm = 0;
			bool ok = check(pp);
			report(!ok && strstr(diag_text, "would wait forever"), "a pipeline send removed: refused, %s",
			       ok ? "accepted!" : diag_text);
			k->ncomm = saved;
			report(check(pp), "the send restored: accepted again");
		}
		Comm *tied = find_comm(pp, 0, RANKROLE_ANY, OP_ALL_REDUCE, -1, true, &k);
		if (report(tied != NULL, "pp: stage 0 all-reduces the tied embedding with stage 3"))
			expect_mismatch(pp, "the tied all-reduce one element longer on stage 0", &tied->elems, "tied-parameter");
	}

	const Lowered *as = compile(p, "async");
	if (report(as != NULL, "async (16,000 ranks, 2,000 on the async axis) compiles and checks")) {
		report(check(as), "async: unchanged, the check accepts it");
		Kernel *k;
		Comm *recv = find_comm(as, 0, RANKROLE_MASTER, OP_RECV, 1999, false, &k);
		if (report(recv != NULL, "async: the master receives from worker 1999"))
			expect_mismatch(as, "the master's receive from its last worker one element longer", &recv->elems,
					"rank 15992"); /* data coordinate 1999 x tensor 8 */
	}
	arena_free(a);
	remove(path);
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
