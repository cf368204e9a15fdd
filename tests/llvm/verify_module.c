/* tests/llvm/verify_module.c: the LLVM back end's modules pass LLVMVerifyModule.
 *
 * For every plan of every FILE: the host module (the whole program, for plans planc build
 * executes) and the NVPTX module (the fused kernels) are built as `planc emit llvm` and `planc emit
 * ptx` build them and checked with LLVMVerifyModule. (The optimised modules are verified too: by
 * run_diff.py's builds, which pass --verify-ir, and by ptxas.sh's code generation.) Then two
 * failure paths: a module made invalid on purpose is reported by llvm_verify as a planc diagnostic
 * ("planc: error: ... is invalid: ...") and not an abort, and every kernel kind of KERNEL_TABLE with
 * a planrt function has a signature in emit_llvm.c (a kind added without one would be refused).
 * Prints PASS/FAIL lines and a closing tally.
 * usage: verify_module FILE... (from the repository root) */
#include "passes.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed;

static void check(bool ok, const char *what, const char *detail)
{
	printf("%s: %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
	if (ok)
		passed++;
	else
		failed++;
}

static LLVMTargetMachineRef machine(const char *triple, const char *cpu, const char *features)
{
	LLVMTargetRef t;
	char *err = NULL;
	if (LLVMGetTargetFromTriple(triple, &t, &err)) {
		fprintf(stderr, "verify_module: no LLVM target for %s: %s\n", triple, err);
		exit(1);
	}
	return LLVMCreateTargetMachine(t, triple, cpu, features, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
				       LLVMCodeModelDefault);
}

/* LLVMVerifyModule's own answer (the message printed on failure) */
static bool verifies(LLVMModuleRef m)
{
	char *msg = NULL;
	bool broken = LLVMVerifyModule(m, LLVMReturnStatusAction, &msg);
	if (broken)
		fprintf(stderr, "%s\n", msg);
	LLVMDisposeMessage(msg);
	return !broken;
}

static void verify_plan(const Lowered *low, const char *name, LLVMTargetMachineRef host, LLVMTargetMachineRef gpu)
{
	static const struct {
		bool gpu;
		const char *what;
	} kinds[] = {{false, "host module"}, {true, "NVPTX module"}};
	for (int i = 0; i < 2; i++) {
		if (!kinds[i].gpu && !lowered_executable(low, false))
			continue;
		LLVMTargetMachineRef tm = kinds[i].gpu ? gpu : host;
		LLVMContextRef c = LLVMContextCreate();
		LLVMModuleRef m = llvm_build_module(low, c, tm, kinds[i].gpu, "verify_module");
		char what[600];
		snprintf(what, sizeof what, "%s %s", name, kinds[i].what);
		check(verifies(m), what, NULL);
		LLVMDisposeModule(m);
		LLVMContextDispose(c);
	}
}

/* llvm_verify reports a broken module as a planc error on stderr and returns false */
static void verify_reports(const Lowered *low, LLVMTargetMachineRef host)
{
	LLVMContextRef c = LLVMContextCreate();
	LLVMModuleRef m = llvm_build_module(low, c, host, false, "verify_module");
	LLVMValueRef f = LLVMAddFunction(m, "broken", LLVMFunctionType(LLVMVoidTypeInContext(c), NULL, 0, 0));
	LLVMAppendBasicBlockInContext(c, f, "no_terminator");
	char path[] = "/tmp/planc-verify-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	fflush(stderr);
	dup2(fd, 2);
	bool ok = llvm_verify(m, "the test module");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	char text[4096] = {0};
	lseek(fd, 0, SEEK_SET);
	ssize_t n = read(fd, text, sizeof text - 1);
	close(fd);
	unlink(path);
	bool said = n > 0 && strstr(text, "planc: error: the test module is invalid: ") && strstr(text, "note: ");
	check(!ok && said, "a broken module is a planc diagnostic", said ? NULL : text);
	LLVMDisposeModule(m);
	LLVMContextDispose(c);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: verify_module FILE...\n");
		return 2;
	}
	LLVMInitializeAllTargetInfos();
	LLVMInitializeAllTargets();
	LLVMInitializeAllTargetMCs();
	LLVMInitializeAllAsmPrinters();
	char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
	LLVMTargetMachineRef host = machine(triple, cpu, features);
	LLVMTargetMachineRef gpu = machine("nvptx64-nvidia-cuda", "sm_80", "+ptx70");
	bool reported = false;
	for (int i = 1; i < argc; i++) {
		Arena *a = arena_new();
		Program *p = load_program(a, argv[i]);
		if (!p || !sema_check(p)) {
			check(false, argv[i], "does not check");
			arena_free(a);
			continue;
		}
		for (Item *it = p->main->items; it; it = it->next) {
			if (it->kind != I_PLAN)
				continue;
			PlanSpec *ps = sema_plan(p, it);
			Graph *g = ps ? run_passes(ps, NULL, stdout) : NULL;
			Lowered *low = g ? run_backend(g, NULL, stdout, false) : NULL;
			char name[256];
			snprintf(name, sizeof name, "%s %s", argv[i], it->name);
			if (!low) {
				check(false, name, "does not compile");
				continue;
			}
			verify_plan(low, name, host, gpu);
			if (!reported && lowered_executable(low, false)) {
				verify_reports(low, host);
				reported = true;
			}
		}
		arena_free(a);
	}
	int unknown = 0;
	for (int k = 0; k < K_COUNT; k++)
		if (kernel_functions[k] && !llvm_kernel_known((KernelKind)k)) {
			fprintf(stderr, "kernel '%s' (%s) has no signature in emit_llvm.c's KERNEL_SIGNATURES\n", kernel_names[k],
				kernel_functions[k]);
			unknown++;
		}
	check(!unknown, "every planrt kernel function has an LLVM signature", NULL);
	LLVMDisposeTargetMachine(host);
	LLVMDisposeTargetMachine(gpu);
	LLVMDisposeMessage(triple);
	LLVMDisposeMessage(cpu);
	LLVMDisposeMessage(features);
	printf("llvm verify: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
