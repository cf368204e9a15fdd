/* fuzz_compile.c: libFuzzer harnesses for the whole compiler. Each input is a plan file; it goes
 * the way `planc check FILE` takes it (load.c with its imports from stdlib/, sema, for every plan
 * the graph passes and the back end with the IR verifier on), and further by the stage, which is
 * the name the harness runs under (one executable, fuzz_compile, and three links to it, so the
 * sanitized compiler is linked once):
 *
 *   fuzz_check    (stage 0) what `planc check` runs, for every plan of the file
 *   fuzz_explain  (stage 1) and explain's report, text and JSON, and its SVG picture
 *   fuzz_emit     (stage 2) and the emitters: C (emit_c), CUDA C (emit_cuda) where the CUDA
 *                 target can run the plan, and the LLVM module (built and verified, unoptimised)
 *
 * Output goes to /dev/null and a scratch directory of the process. A crash, a sanitizer report,
 * an internal compiler error (ICE aborts), or an input slower than libFuzzer's -timeout is a bug
 * in planc. So that a case stays fast, the harness lowers the largest repeat count the compiler
 * takes (graph_max_repeat: 100000 in planc, which never changes it) and leaves out plans of more
 * than MAX_RANKS ranks or MAX_MICRO micro-batches after sema (the collective check and the
 * schedule tables grow with them; tests/scale covers the large ones).
 * plan_mutator.c is linked in: libFuzzer mutates plans through the grammar, so most inputs parse.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DPLANC_FUZZ=ON && make -C build-fuzz fuzz_emit
 *   build-fuzz/tests/fuzz/fuzz_emit -max_total_time=60 CORPUS_DIR */
#include "passes.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_INPUT = 64 << 10, MAX_PLANS = 4, MAX_REPEAT = 8, MAX_RANKS = 1 << 12, MAX_MICRO = 16 };

static FILE *devnull;
static char scratch[256];  /* this process's directory: the input file and the emitted sources */
static char input_path[320];
static LLVMTargetMachineRef host;
static long long inputs, parsed; /* how many inputs came, how many of them loaded (parsed) */
static int stage = -1;            /* 0 check, 1 explain, 2 emit: from the name run under */

static void report_parsed(void)
{
	if (inputs)
		fprintf(stderr, "fuzz: inputs that parse: %lld of %lld (%.0f%%)\n", parsed, inputs, 100.0 * parsed / inputs);
}

static void setup(void)
{
	devnull = fopen("/dev/null", "w");
	const char *tmp = getenv("TMPDIR");
	snprintf(scratch, sizeof scratch, "%s/planc-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!devnull || !mkdtemp(scratch))
		abort();
	snprintf(input_path, sizeof input_path, "%s/input.plan", scratch);
	diag_set_stream(devnull);
	atexit(report_parsed);
	graph_max_repeat = MAX_REPEAT; /* sizes that keep one case to milliseconds */
	if (stage >= 2) {
		LLVMInitializeNativeTarget();
		LLVMInitializeNativeAsmPrinter();
		char *triple = LLVMGetDefaultTargetTriple();
		LLVMTargetRef t;
		if (LLVMGetTargetFromTriple(triple, &t, NULL))
			abort();
		host = LLVMCreateTargetMachine(t, triple, "", "", LLVMCodeGenLevelNone, LLVMRelocPIC, LLVMCodeModelDefault);
		LLVMDisposeMessage(triple);
	}
}

static bool write_input(const uint8_t *data, size_t size)
{
	int fd = open(input_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return false;
	bool ok = write(fd, data, size) == (ssize_t)size;
	close(fd);
	return ok;
}

/* the back end's outputs for one lowered plan */
static void emit_all(const Lowered *low)
{
	if (!lowered_executable(low, false))
		return;
	emit_c(low, scratch, input_path, true);
	if (cuda_executable(low, false))
		emit_cuda(low, scratch, input_path, true);
	LLVMContextRef c = LLVMContextCreate();
	LLVMModuleRef m = llvm_build_module(low, c, host, false, input_path);
	if (m) {
		if (!llvm_verify(m, "the fuzzed plan's module"))
			abort(); /* the back end built a broken module: a bug in planc */
		LLVMDisposeModule(m);
	}
	LLVMContextDispose(c);
}

static void compile(Program *p, Item *plan)
{
	Arena *program_arena = plan_arena_begin(p);
	PlanSpec *ps = sema_plan(p, plan);
	if (ps && (ps->world > MAX_RANKS || ps->micro_batches > MAX_MICRO))
		ps = NULL;
	Graph *g = ps ? run_passes(ps, NULL, NULL) : NULL;
	Lowered *low = g ? run_backend(g, NULL, NULL, true) : NULL;
	if (low && stage >= 1) {
		explain(devnull, g, false, low);
		explain(devnull, g, true, low);
		explain_svg(devnull, g, low);
	}
	if (low && stage >= 2)
		emit_all(low);
	plan_arena_end(p, program_arena);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* the stage from the name the harness runs under (argv[0]: .../fuzz_check, fuzz_explain, fuzz_emit
 * or fuzz_cov_* of them); any other name is a usage error */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char *const names[] = {"check", "explain", "emit"};
	const char *self = strrchr((*argv)[0], '/') ? strrchr((*argv)[0], '/') + 1 : (*argv)[0];
	const char *name = strrchr(self, '_') ? strrchr(self, '_') + 1 : self;
	for (int i = 0; i < 3; i++)
		if (!strcmp(name, names[i]))
			stage = i;
	if (stage < 0) {
		fprintf(stderr, "%s: run this harness as fuzz_check, fuzz_explain or fuzz_emit (links to it: the name is "
				"the stage)\n", self);
		exit(2);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!devnull)
		setup();
	if (size > MAX_INPUT || !write_input(data, size))
		return 0;
	diag_reset();
	Arena *a = arena_new();
	Program *p = load_program(a, input_path);
	inputs++;
	parsed += p != NULL;
	if (p && sema_check_plan(p, NULL)) {
		int n = 0;
		for (Item *it = p->main->items; it && n < MAX_PLANS && !diag_stopped(); it = it->next)
			if (it->kind == I_PLAN) {
				compile(p, it);
				n++;
			}
	}
	arena_free(a);
	return 0;
}
