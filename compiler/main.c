/* main.c: the planc command line. Parses arguments, loads the program, runs sema and the pass
 * driver, and hands the result to the requested command. Exit status: 0 success, 1 an error in
 * the user's input (reported with file:line:col), 2 a usage error; internal errors abort. */
#include "planc.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
	"usage: planc COMMAND FILE [options]\n"
	"\n"
	"commands:\n"
	"  check FILE [--plan NAME]          check the model and every plan (or one) in FILE\n"
	"  explain FILE [--plan NAME] [--json]\n"
	"                                    memory, communication, FLOPs and pipeline bubble per rank role\n"
	"  fmt FILE [-w]                     print FILE in canonical layout (-w: rewrite it in place)\n"
	"\n"
	"options:\n"
	"  --plan NAME        the plan to use (default: the file's first plan)\n"
	"  --json             machine-readable output for explain\n"
	"  --dump-after=PASS  print the IR after PASS (graph pipeline autodiff shard recompute zero sync check)\n"
	"  --help, --version\n"
	"\n"
	"environment: PLANC_STDLIB overrides the directory 'import std.X' reads X.plan from\n";

typedef struct Options {
	const char *command;
	const char *file;
	const char *plan;
	const char *dump_after;
	bool json;
	bool write;
} Options;

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "planc: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nrun 'planc --help' for usage\n");
	return 2;
}

static bool known_pass(const char *name)
{
	for (int i = 0; pass_names[i]; i++)
		if (!strcmp(pass_names[i], name))
			return true;
	return false;
}

static int parse_args(int argc, char **argv, Options *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage, stdout);
			exit(0);
		} else if (!strcmp(a, "--version")) {
			printf("planc %s\n", PLANC_VERSION);
			exit(0);
		} else if (!strcmp(a, "--json")) {
			o->json = true;
		} else if (!strcmp(a, "-w")) {
			o->write = true;
		} else if (!strcmp(a, "--plan")) {
			if (++i == argc)
				return usage_error("%s needs a plan name", a);
			o->plan = argv[i];
		} else if (!strncmp(a, "--plan=", 7)) {
			o->plan = a + 7;
		} else if (!strncmp(a, "--dump-after=", 13)) {
			o->dump_after = a + 13;
			if (!known_pass(o->dump_after))
				return usage_error("unknown pass '%s' for --dump-after", o->dump_after);
		} else if (a[0] == '-' && a[1]) {
			return usage_error("unknown option '%s'", a);
		} else if (!o->command) {
			o->command = a;
		} else if (!o->file) {
			o->file = a;
		} else {
			return usage_error("unexpected argument '%s'", a);
		}
	}
	if (!o->command) {
		fputs(usage, stderr);
		return 2;
	}
	return 0;
}

static int cmd_fmt(const Options *o, Arena *a)
{
	char *text;
	int len;
	if (!load_file(o->file, &text, &len))
		return 1;
	char *copy = arena_strndup(a, text, (size_t)len);
	free(text);
	Module *m = parse_module(a, o->file, copy, len);
	if (!m)
		return 1;
	if (!o->write) {
		fmt_module(stdout, m);
		return 0;
	}
	/* rewrite atomically: a temporary file beside the original, then rename */
	const char *tmp = arena_printf(a, "%s.fmt-tmp", o->file);
	FILE *f = fopen(tmp, "w");
	if (!f) {
		fprintf(stderr, "planc: error: cannot write '%s'\n", tmp);
		return 1;
	}
	fmt_module(f, m);
	if (fclose(f) != 0 || rename(tmp, o->file) != 0) {
		remove(tmp);
		fprintf(stderr, "planc: error: cannot rewrite '%s'\n", o->file);
		return 1;
	}
	return 0;
}

/* Runs sema and the passes for one plan; prints explain output when asked. */
static bool compile_plan(Program *p, Item *plan, const Options *o, bool do_explain)
{
	PlanSpec *ps = sema_plan(p, plan);
	if (!ps)
		return false;
	Graph *g = run_passes(ps, o->dump_after, stdout);
	if (!g)
		return false;
	if (do_explain)
		explain(stdout, g, o->json);
	return true;
}

int main(int argc, char **argv)
{
	Options o = {0};
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	bool is_check = !strcmp(o.command, "check"), is_explain = !strcmp(o.command, "explain");
	bool is_fmt = !strcmp(o.command, "fmt");
	if (!strcmp(o.command, "emit") || !strcmp(o.command, "build") || !strcmp(o.command, "run")) {
		fprintf(stderr,
			"planc: error: '%s' is not available yet: this planc checks and explains plans; code generation "
			"(C, CUDA, LLVM) is not built in this version\n",
			o.command);
		return 2;
	}
	if (!is_check && !is_explain && !is_fmt)
		return usage_error("unknown command '%s'", o.command);
	if (!o.file)
		return usage_error("'%s' needs a FILE", o.command);
	Arena *a = arena_new();
	if (is_fmt) {
		rc = cmd_fmt(&o, a);
		arena_free(a);
		return rc;
	}
	Program *p = load_program(a, o.file);
	bool ok = p && sema_check(p);
	if (ok) {
		if (o.plan || is_explain) {
			Item *plan = default_plan(p, o.plan);
			if (!plan) {
				if (o.plan)
					fprintf(stderr, "planc: error: no plan named '%s' in %s\n", o.plan, o.file);
				else
					fprintf(stderr, "planc: error: %s has no plan to explain\n", o.file);
				ok = false;
			} else {
				ok = compile_plan(p, plan, &o, is_explain);
			}
		} else {
			for (Item *it = p->main->items; it; it = it->next)
				if (it->kind == I_PLAN && !compile_plan(p, it, &o, false))
					ok = false;
		}
	}
	if (diag_error_count() > 0)
		ok = false;
	arena_free(a);
	return ok ? 0 : 1;
}
