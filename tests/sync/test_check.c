/* test_check.c: the collective check (compiler/lower/schedule.c) on the traffic of the sync strategies.
 *
 * Async plans exchange point-to-point messages between the master and each worker; local SGD and
 * compression add collectives on the batch axis. The check must accept the programs planc builds
 * and refuse them when one side's traffic is changed: a worker's gradient message one element
 * short, a version the master never sends to one worker, a gradient sent on the parameters'
 * channel, a worker's local-SGD average of another size than the master's. Each case compiles
 * examples/gpt.plan's plan, edits the lowered program's communication as a bug in a pass would,
 * and runs the check again, whose diagnostic is captured and matched.
 * Prints PASS/FAIL lines and `N passed, M failed`; exits 1 on any failure. */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/report.h"

static Lowered *compile(const char *plan)
{
	Arena *a = arena_new();
	Program *p = load_program(a, "examples/gpt.plan");
	if (!p || !sema_check(p))
		return NULL;
	PlanSpec *ps = sema_plan(p, default_plan(p, plan));
	Graph *g = ps ? run_passes(ps, NULL, NULL) : NULL;
	return g ? run_backend(g, NULL, NULL, true) : NULL;
}

static Kernel *find(const Lowered *low, int role, KernelKind kind)
{
	for (int i = 0; i < low->nprogs; i++)
		if (low->progs[i]->role == role)
			for (int k = 0; k < low->progs[i]->nk; k++)
				if (low->progs[i]->k[k].kind == kind)
					return &low->progs[i]->k[k];
	return NULL;
}

/* Runs the check with its diagnostics in a buffer; true when it refuses with `want` in them. */
static bool refuses(const Lowered *low, const char *want)
{
	FILE *f = tmpfile();
	if (!f)
		return false;
	diag_set_stream(f);
	diag_reset();
	bool ok = check_collectives(low);
	diag_set_stream(stderr);
	char text[4096] = "";
	rewind(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	text[n] = 0;
	fclose(f);
	diag_reset();
	if (!ok && !strstr(text, want))
		printf("  diagnostic: %s", text);
	return !ok && strstr(text, want);
}

int main(void)
{
	Lowered *low = compile("dp4_async");
	if (!report(low != NULL, "dp4_async compiles and its traffic checks"))
		return 1;
	report(check_collectives(low), "dp4_async: the check accepts the program as built");

	Kernel *push = find(low, RANKROLE_WORKER, K_ASYNC_PUSH);
	if (report(push && push->ncomm == 1, "a worker pushes one message")) {
		push->comm[0].elems--;
		report(refuses(low, "point-to-point"), "a worker's gradient message one element short is refused");
		push->comm[0].elems++;
		push->comm[0].channel = 0;
		report(refuses(low, "point-to-point"), "a gradient sent on the parameters' channel is refused");
		push->comm[0].channel = 1;
		report(check_collectives(low), "restored, the program checks again");
	}

	Kernel *publish = find(low, RANKROLE_MASTER, K_ASYNC_PUBLISH);
	if (report(publish && publish->ncomm == 3, "the master publishes to three workers")) {
		Comm last = publish->comm[2];
		publish->ncomm = 2; /* worker 3 never gets a version */
		report(refuses(low, "would wait forever"), "a worker the master never sends to is refused");
		publish->ncomm = 3;
		publish->comm[2].dtype = DT_BF16;
		report(refuses(low, "point-to-point"), "a version sent in another dtype than received is refused");
		publish->comm[2] = last;
	}

	Lowered *tp = compile("dp2_tp2_async");
	report(tp && check_collectives(tp), "dp2_tp2_async (a master per tensor coordinate) checks");

	Lowered *ls = compile("dp4_local_sgd");
	Kernel *avg = ls ? find(ls, RANKROLE_ANY, K_LOCAL_AVERAGE) : NULL;
	if (report(avg && avg->ncomm == 2 && avg->comm[0].every == 4, "local SGD averages every 4 steps")) {
		/* every rank of the batch axis runs one program: a changed average changes all of them */
		report(check_collectives(ls), "dp4_local_sgd checks");
	}
	Lowered *pg = compile("dp4_powersgd");
	Kernel *ps = pg ? find(pg, RANKROLE_ANY, K_COMPRESS_POWERSGD) : NULL;
	report(ps && ps->ncomm == 3 && check_collectives(pg), "dp4_powersgd: P, Q and the vectors reduced, checked");
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
