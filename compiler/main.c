/* main.c: the planc command line. Parses arguments, loads the program, runs sema and the pass
 * driver, and hands the result to the requested command. Exit status: 0 success, 1 an error in
 * the user's input (reported with file:line:col), 2 a usage error; internal errors abort. */
#include "search.h"
#ifdef PLANC_CALIBRATE
int calibrate_main(int argc, char **argv); /* calibrate.c, built into planc with planrt */
#endif
#include "data/data.h"
#include "planrt_outfile.h" /* the rule every output file is written by (runtime/core/outfile.c) */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PLANC_MPICC
#define PLANC_MPICC "mpicc"
#endif
#ifndef PLANC_RUNTIME_DIR
#define PLANC_RUNTIME_DIR "runtime"
#endif
#ifndef PLANC_RUNTIME_LIB
#define PLANC_RUNTIME_LIB "libplanrt.a"
#endif
#ifndef PLANC_LINK_LIBS
#define PLANC_LINK_LIBS "-lopenblas -ljansson"
#endif
#ifndef PLANC_FUSE_LD /* the linker mpicc links programs with (CMakeLists.txt: PLANC_LINKER), or "" */
#define PLANC_FUSE_LD ""
#endif

static const char usage[] =
	"usage: planc COMMAND FILE [options]\n"
	"\n"
	"commands:\n"
	"  check FILE [--plan NAME]          check the model and every plan (or one) in FILE\n"
	"  explain FILE [--plan NAME] [--json] [--svg FILE]\n"
	"                                    memory, communication, FLOPs and pipeline bubble per rank role\n"
	"  fmt FILE [-w]                     print FILE in canonical layout (-w: rewrite it in place)\n"
	"  emit c FILE --plan NAME -o DIR    write the plan's training program as C (DIR/prog.c)\n"
	"  emit llvm FILE --plan NAME -o DIR the same as LLVM IR (DIR/prog.ll)\n"
	"  emit ptx FILE --plan NAME -o DIR  its fused element-wise kernels as sm_80 PTX (DIR/kernels.ptx)\n"
	"  emit cuda FILE --plan NAME -o DIR the program for NVIDIA GPUs: DIR/prog.c (host), DIR/kernels.cu\n"
	"                                    (the fused loops) and DIR/loops.h\n"
	"  build FILE --plan NAME -o PROG    emit and compile it with the planrt runtime\n"
	"                                    (run: mpirun -np WORLD PROG --steps K --data FILE ...)\n"
	"  run FILE [--plan NAME] PROGRAM-OPTIONS...\n"
	"                                    compile in-process (LLVM JIT) and train: mpirun -np WORLD\n"
	"                                    planc run FILE --plan NAME --steps K --data FILE ...; every\n"
	"                                    option but --plan, --verify-ir, --dump-after and --model-arg\n"
	"                                    goes to the program ('planc run FILE --plan NAME --help' lists\n"
	"                                    them)\n"
	"  reshard FILE --plan NAME CKPT -o DIR\n"
	"                                    rewrite the checkpoint CKPT (a --save-every directory or a\n"
	"                                    step-N, written under any plan of the model) into DIR/step-N as\n"
	"                                    plan NAME holds it, offline (one process, no MPI, no training);\n"
	"                                    then: mpirun -np WORLD PROG ... --resume DIR\n"
	"  search FILE --model M --world N --batch B [--device=D] [--memory SIZE] [--top K] [--write NAME]\n"
	"                                    the fastest plans for M on N ranks that pass every check and fit\n"
	"                                    in memory, as plan text ('planc search --help'; docs/search.md)\n"
	"  calibrate -o FILE [--device BASE] measure this machine (run under mpirun -np N: the kernels and\n"
	"                                    collectives of planc's programs on every rank at once) and\n"
	"                                    write a device file for --device=FILE ('planc calibrate --help')\n"
	"  data vocab|tokenize|decode ...    text to token files: a GPT-2 byte-level BPE vocabulary, Megatron /\n"
	"                                    nanoGPT / llm.c token files ('planc data --help'; docs/data.md)\n"
	"\n"
	"options:\n"
	"  --plan NAME        the plan to use (default: the file's first plan)\n"
	"  --json             machine-readable output for explain\n"
	"  --device=NAME|FILE the device explain's estimated step time assumes: h200 (default), h100,\n"
	"                     a100, cpu, or a device file (docs/search.md; planc calibrate writes one)\n"
	"  -o PATH            output directory (emit) or program (build); never an input or a .plan file\n"
	"  --native           build: compile for this machine's CPU only (-march=native; with --backend llvm\n"
	"                     the host CPU's target machine); by default the fused loops and planrt's\n"
	"                     kernels are compiled for every instruction-set level (x86-64, AVX2, AVX-512)\n"
	"                     and the program runs the best its CPU has, so one binary runs on every node\n"
	"                     of a cluster ('planc run' compiles for this CPU; PLANRT_ISA=LEVEL forces one)\n"
	"  --no-layer-loops   emit c / cuda, build: print every layer's kernels in full; by default each run of\n"
	"                     identical layers is one loop over per-layer tables (docs/ir.md; the same\n"
	"                     numbers bit for bit)\n"
	"  --svg FILE         explain: also draw each rank role's pipeline schedule and memory over the\n"
	"                     step as an SVG picture\n"
	"  --backend=c|llvm   build: compile the C with mpicc (c, the default) or through LLVM (llvm:\n"
	"                     a native object linked with planrt, no C compiler involved)\n"
	"  --target=cpu|cuda  build: for CPUs (the default) or NVIDIA GPUs (emit cuda's files compiled with\n"
	"                     nvcc for sm_80 and sm_90 plus PTX, linked with planrt_cuda, cuBLAS and NCCL)\n"
	"  --dump-after=PASS  print the IR after PASS: the graph after graph pipeline autodiff shard recompute\n"
	"                     zero sync; the loop-level IR after lower state overlap offload_params\n"
	"                     offload_activations memplan check streams; the\n"
	"                     generated C after emit; the decode graph for generation after decode\n"
	"  --generate         check, build, emit c: also the model's decode program for generation (one\n"
	"                     token per step with a key/value cache): PROG --generate TEXT (docs/generate.md)\n"
	"  --verify-ir        check the loop-level IR's invariants after every back-end pass\n"
	"  --model-arg NAME=VALUE\n"
	"                     check, explain, emit, build, run, reshard: the model's hyperparameter NAME\n"
	"                     is the number VALUE in every plan, over the plan's own `for m(NAME = ...)`\n"
	"                     (repeat it for several: --model-arg D=64 --model-arg S=32)\n"
	"  --help, --version\n"
	"\n"
	"environment: PLANC_STDLIB overrides the directory 'import std.X' reads X.plan from;\n"
	"             PLANC_MPICC the compiler planc build runs (default: this build's mpicc);\n"
	"             TMPDIR where planc build compiles (default /tmp; removed afterwards)\n";

typedef struct Options {
	const char *command;
	const char *file;
	const char *plan;
	const char *dump_after;
	bool json;
	bool write;
	const char *output;
	const char *target; /* emit: "c", "llvm" or "ptx" */
	const char *checkpoint; /* reshard: the checkpoint read */
	const char *backend; /* build: "c" or "llvm" */
	bool cuda;          /* build --target cuda */
	bool verify;
	bool native;        /* build: -march=native */
	bool no_layer_loops; /* emit c, build: every layer printed unrolled */
	bool generate;      /* check: build and check the decode graph too (decode.c) */
	const char *svg;    /* explain: the picture's path */
	int nmodel_args;    /* --model-arg NAME=VALUE, in the order given */
	char **model_args;
	int prog_argc;      /* run: the program's arguments (prog_argv[0] is set by main) */
	char **prog_argv;
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
	if (!strcmp(name, "emit"))
		return true;
	for (int i = 0; pass_names[i]; i++)
		if (!strcmp(pass_names[i], name))
			return true;
	return false;
}

/* planc's own options in `planc run FILE ...`; every other argument after FILE is the program's */
static bool run_option(const char *a)
{
	return !strcmp(a, "--plan") || !strncmp(a, "--plan=", 7) || !strcmp(a, "--verify-ir") || !strncmp(a, "--dump-after=", 13) ||
	       !strcmp(a, "--model-arg") || !strncmp(a, "--model-arg=", 12);
}

/* Whether option a (its name: "--plan" for "--plan=x" too) was given before among seen[0..n);
 * records it. An option given twice is a usage error, never "the last one wins". */
static bool seen_before(const char *a, const char **seen, int *n, int max)
{
	size_t len = strcspn(a, "=");
	for (int k = 0; k < *n; k++)
		if (strlen(seen[k]) == len && !strncmp(seen[k], a, len))
			return true;
	if (*n < max) {
		char *name = strndup(a, len);
		if (name)
			seen[(*n)++] = name;
	}
	return false;
}

static int parse_args(int argc, char **argv, Options *o)
{
	o->prog_argv = calloc((size_t)argc + 1, sizeof *o->prog_argv);
	o->prog_argc = 1;
	o->model_args = calloc((size_t)argc + 1, sizeof *o->model_args);
	const char *seen[32];
	int nseen = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool program_arg = o->command && !strcmp(o->command, "run") && o->file && !run_option(a);
		bool repeatable = !strcmp(a, "--model-arg") || !strncmp(a, "--model-arg=", 12);
		if (!program_arg && !repeatable && a[0] == '-' && a[1] && seen_before(a, seen, &nseen, 32)) {
			fprintf(stderr, "planc: %.*s is given twice; give it once\nrun 'planc --help' for usage\n",
				(int)strcspn(a, "="), a);
			return 2;
		}
		if (program_arg) {
			o->prog_argv[o->prog_argc++] = argv[i];
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage, stdout);
			exit(0);
		} else if (!strcmp(a, "--version")) {
			printf("planc %s\n", PLANC_VERSION);
			exit(0);
		} else if (!strcmp(a, "--json")) {
			o->json = true;
		} else if (!strncmp(a, "--device=", 9)) {
			if (!device_select(a + 9))
				return 2;
		} else if (!strcmp(a, "--verify-ir")) {
			o->verify = true;
		} else if (!strcmp(a, "--native")) {
			o->native = true;
		} else if (!strcmp(a, "--no-layer-loops")) {
			o->no_layer_loops = true;
		} else if (!strcmp(a, "--generate")) {
			o->generate = true;
		} else if (!strcmp(a, "--svg") || !strncmp(a, "--svg=", 6)) {
			o->svg = a[5] == '=' ? a + 6 : ++i < argc ? argv[i] : NULL;
			if (!o->svg || !*o->svg)
				return usage_error("%s needs a file name", "--svg");
		} else if (!strncmp(a, "--backend=", 10) || !strcmp(a, "--backend")) {
			const char *v = a[9] == '=' ? a + 10 : ++i < argc ? argv[i] : NULL;
			if (!v || (strcmp(v, "c") && strcmp(v, "llvm")))
				return usage_error("--backend takes 'c' or 'llvm'%s", "");
			o->backend = v;
		} else if (!strncmp(a, "--target=", 9) || !strcmp(a, "--target")) {
			const char *v = a[8] == '=' ? a + 9 : ++i < argc ? argv[i] : NULL;
			if (!v || (strcmp(v, "cpu") && strcmp(v, "cuda")))
				return usage_error("--target takes 'cpu' or 'cuda'%s", "");
			o->cuda = !strcmp(v, "cuda");
		} else if (!strcmp(a, "-w")) {
			o->write = true;
		} else if (!strcmp(a, "-o")) {
			if (++i == argc)
				return usage_error("%s needs a path", a);
			o->output = argv[i];
		} else if (!strcmp(a, "--plan")) {
			if (++i == argc)
				return usage_error("%s needs a plan name", a);
			o->plan = argv[i];
		} else if (!strncmp(a, "--plan=", 7)) {
			o->plan = a + 7;
		} else if (repeatable) {
			char *v = a[11] == '=' ? argv[i] + 12 : ++i < argc ? argv[i] : NULL;
			if (!v || !*v)
				return usage_error("%s needs NAME=VALUE, e.g. --model-arg D=64", "--model-arg");
			o->model_args[o->nmodel_args++] = v;
		} else if (!strncmp(a, "--dump-after=", 13)) {
			o->dump_after = a + 13;
			if (!known_pass(o->dump_after))
				return usage_error("unknown pass '%s' for --dump-after", o->dump_after);
		} else if (a[0] == '-' && a[1]) {
			return usage_error("unknown option '%s'", a);
		} else if (!o->command) {
			o->command = a;
		} else if (!strcmp(o->command, "emit") && !o->target) {
			o->target = a;
		} else if (!o->file) {
			o->file = a;
		} else if (!strcmp(o->command, "reshard") && !o->checkpoint) {
			o->checkpoint = a;
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

/* Writes path by planrt_outfile's rule (a temporary file beside it, renamed over it; a character
 * device in place; anything else refused): write(f, arg) prints the content and returns false on
 * an error it reported. False after reporting why; the target is then as it was. */
static bool write_output(const char *what, const char *path, bool (*write)(FILE *, void *), void *arg)
{
	planrt_outfile_t f;
	char why[1024] = "";
	FILE *out = NULL;
	if (planrt_outfile_open(&f, what, path, (long)getpid(), why, sizeof why) != 0 ||
	    !(out = planrt_outfile_stream(&f, why, sizeof why))) {
		if (f.fd >= 0)
			planrt_outfile_discard(&f);
		fprintf(stderr, "planc: error: %s\n", why);
		return false;
	}
	if (!write(out, arg) || ferror(out)) {
		int e = errno;
		planrt_outfile_discard(&f);
		fprintf(stderr, "planc: error: cannot write %s '%s': %s\n", what, path, strerror(e ? e : EIO));
		return false;
	}
	if (planrt_outfile_commit(&f, why, sizeof why) != 0) {
		fprintf(stderr, "planc: error: %s\n", why);
		return false;
	}
	return true;
}

static bool write_fmt(FILE *f, void *module)
{
	fmt_module(f, module);
	return true;
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
	return write_output("fmt -w", o->file, write_fmt, m) ? 0 : 1;
}

typedef struct SvgArgs {
	Graph *g;
	const Lowered *low;
} SvgArgs;

static bool write_svg(FILE *f, void *arg)
{
	const SvgArgs *a = arg;
	return explain_svg(f, a->g, a->low);
}

/* Runs sema, the middle end and the back end for one plan (the collective check reads the
 * lowered program); prints explain output when asked. */
static Lowered *compile_plan(Program *p, Item *plan, const Options *o, bool do_explain)
{
	PlanSpec *ps = sema_plan(p, plan);
	if (!ps)
		return NULL;
	Graph *g = run_passes(ps, o->dump_after, stdout);
	if (!g)
		return NULL;
	Graph *decode = NULL;
	if ((o->generate || (o->dump_after && !strcmp(o->dump_after, "decode"))) &&
	    !(decode = run_decode(ps, g, o->dump_after, stdout)))
		return NULL;
	Lowered *low = run_backend(g, o->dump_after, stdout, o->verify);
	if (!low)
		return NULL;
	/* --generate: the decode program too, printed and built beside the training program */
	if (decode && !(low->decode = run_backend(decode, NULL, stdout, o->verify)))
		return NULL;
	if (do_explain)
		explain(stdout, g, o->json, low);
	if (do_explain && o->svg && !write_output("--svg", o->svg, write_svg, &(SvgArgs){g, low}))
		return NULL;
	return low;
}

/* ---- planc build's scratch: a planc-build-* directory and the program linked beside its target.
 * Removed on every exit path, and by SIGTERM, SIGINT or SIGHUP: the handler stops the compiler
 * running (its process group), removes the files the build makes and the directory, and the
 * temporary program (planrt_outfile's pending file), then dies of the signal as it would have. */

enum { SCRATCH_FILES = 8 };
static struct {
	char dir[4096];
	char files[SCRATCH_FILES][4160]; /* what the build may create in dir */
	int nfiles;
	volatile pid_t child;            /* the compiler running, in a process group of its own */
} scratch;

static void scratch_remove(void) /* async-signal-safe: unlink, rmdir */
{
	for (int i = 0; i < scratch.nfiles; i++)
		unlink(scratch.files[i]);
	if (scratch.dir[0])
		rmdir(scratch.dir);
	planrt_outfile_remove_pending();
}

static void scratch_on_signal(int sig)
{
	pid_t child = scratch.child;
	if (child > 0) {
		kill(-child, SIGTERM);
		waitpid(child, NULL, 0);
	}
	scratch_remove();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* A new scratch directory under $TMPDIR holding (at most) the named files; NULL after reporting. */
static const char *scratch_begin(Arena *a, const char *const *names, int n)
{
	const char *tmp = getenv("TMPDIR");
	char *dir = mkdtemp(arena_printf(a, "%s/planc-build-XXXXXX", tmp && *tmp ? tmp : "/tmp"));
	if (!dir) {
		fprintf(stderr, "planc: error: cannot create a temporary directory: %s\n", strerror(errno));
		return NULL;
	}
	snprintf(scratch.dir, sizeof scratch.dir, "%s", dir);
	scratch.nfiles = 0;
	for (int i = 0; i < n && i < SCRATCH_FILES; i++)
		snprintf(scratch.files[scratch.nfiles++], sizeof scratch.files[0], "%s/%s", dir, names[i]);
	struct sigaction sa = {.sa_handler = scratch_on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	return dir;
}

static void scratch_end(void)
{
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	scratch_remove();
	scratch.dir[0] = 0;
	scratch.nfiles = 0;
}

static int run_command(char *const argv[])
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		setpgid(0, 0); /* planc's signal handler stops the compiler and everything it started */
		execvp(argv[0], argv);
		fprintf(stderr, "planc: error: cannot run '%s': %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid);
	scratch.child = pid;
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR) {
			scratch.child = 0;
			return -1;
		}
	scratch.child = 0;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The link line's last step: argv (with "-o" followed by NULL, to fill) links the program into a
 * temporary file beside -o, renamed over it once linked (planrt_outfile); a character device
 * target gets the linked bytes written in place. False after reporting. */
static bool link_program(char **argv, int out_at, const char *output, Arena *a)
{
	planrt_outfile_t f;
	char why[1024];
	if (planrt_outfile_open(&f, "-o", output, (long)getpid(), why, sizeof why) != 0) {
		fprintf(stderr, "planc: error: %s\n", why);
		return false;
	}
	const char *linked = f.in_place ? arena_printf(a, "%s/prog", scratch.dir) : f.tmp;
	if (f.in_place && scratch.nfiles < SCRATCH_FILES)
		snprintf(scratch.files[scratch.nfiles++], sizeof scratch.files[0], "%s", linked);
	if (!f.in_place) { /* the linker creates the file (executable); its name stays the pending one */
		planrt_outfile_close(&f);
		unlink(f.tmp);
	}
	argv[out_at] = (char *)linked;
	if (run_command(argv) != 0) {
		planrt_outfile_discard(&f);
		return false;
	}
	if (!f.in_place)
		f.fd = open(f.tmp, O_RDONLY | O_CLOEXEC); /* for the commit's fsync */
	bool ok = true;
	FILE *in = f.in_place ? fopen(linked, "rb") : NULL;
	if (f.in_place) { /* the device gets the program's bytes */
		char buf[65536];
		size_t got;
		ok = in != NULL;
		while (ok && (got = fread(buf, 1, sizeof buf, in)) > 0)
			ok = write(f.fd, buf, got) == (ssize_t)got;
		if (in)
			fclose(in);
	}
	if (!ok || planrt_outfile_commit(&f, why, sizeof why) != 0) {
		if (!ok)
			planrt_outfile_discard(&f);
		fprintf(stderr, "planc: error: %s\n", ok ? why : strerror(errno));
		return false;
	}
	return true;
}

/* ---- outputs: checked before any work, they never replace an input */

static bool same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* An output path (what: "-o" or "--svg"; is_dir: emit's or reshard's directory) is refused when it
 * is the plan file or a module the plan imports (modules NULL: before loading, the plan file
 * only), a .plan source, a file that planrt_outfile's rule refuses (a directory, FIFO, socket,
 * block device or symbolic link), a directory output that exists and is not one, or a path whose
 * directory is not writable. */
static bool output_ok(const char *what, const char *path, bool is_dir, const Options *o, const Module *modules)
{
	const char *input = NULL;
	if (!modules && same_file(path, o->file))
		input = o->file;
	for (const Module *m = modules; m && !input; m = m->next)
		if (same_file(path, m->src.path))
			input = m->src.path;
	if (input) {
		fprintf(stderr, "planc: error: %s '%s' is %s '%s'; planc never overwrites its input\n", what, path,
			same_file(input, o->file) ? "the plan file" : "the imported module", input);
		diag_note_plain("write the output somewhere else: %s %s", what, is_dir ? "DIR" : "prog");
		return false;
	}
	size_t n = strlen(path);
	if (!is_dir && n >= 5 && !strcmp(path + n - 5, ".plan")) {
		fprintf(stderr, "planc: error: %s '%s' names a .plan source; planc does not write over plan files\n", what, path);
		return false;
	}
	struct stat st;
	char why[1024];
	if (!is_dir && !modules && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
		return true; /* judged after loading, when the imports are known: a link to one is named so */
	if (!is_dir && planrt_outfile_check(what, path, why, sizeof why) != 0) {
		fprintf(stderr, "planc: error: %s\n", why);
		return false;
	}
	if (!is_dir && lstat(path, &st) == 0 && S_ISCHR(st.st_mode))
		return true; /* a device, written in place */
	if (is_dir && stat(path, &st) == 0) {
		if (!S_ISDIR(st.st_mode)) {
			fprintf(stderr, "planc: error: %s '%s' exists and is not a directory\n", what, path);
			return false;
		}
		if (access(path, W_OK | X_OK) != 0) {
			fprintf(stderr, "planc: error: %s '%s' is not writable: %s\n", what, path, strerror(errno));
			return false;
		}
		return true;
	}
	/* a new file or directory, or a file renamed over: its parent must exist and be writable
	 * ("out/": out's parent) */
	while (n > 1 && path[n - 1] == '/')
		n--;
	const char *slash = NULL;
	for (size_t i = 0; i < n; i++)
		if (path[i] == '/')
			slash = path + i;
	char parent[4096];
	snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1, slash ? path : ".");
	if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "planc: error: cannot write %s '%s': directory '%s' does not exist\n", what, path, parent);
		return false;
	}
	if (access(parent, W_OK | X_OK) != 0) {
		fprintf(stderr, "planc: error: cannot write %s '%s': directory '%s' is not writable\n", what, path, parent);
		return false;
	}
	return true;
}

static bool outputs_ok(const Options *o, const Module *modules, bool is_emit, bool is_build, bool is_explain)
{
	if ((is_emit || is_build) && o->output && !output_ok("-o", o->output, is_emit, o, modules))
		return false;
	if (is_explain && o->svg && !output_ok("--svg", o->svg, false, o, modules))
		return false;
	return true;
}

/* The CUDA target: emit cuda writes DIR/prog.c, kernels.cu and loops.h; build --target cuda compiles
 * kernels.cu with nvcc (sm_80 and sm_90 machine code, and compute_80 PTX that newer GPUs compile at
 * load), prog.c with the C compiler (host code: it calls planrt_cuda and launches kernels, so -O1),
 * and links them with planrt_cuda, planrt, cuBLAS, NCCL and the static CUDA runtime (never the
 * driver's libcuda: the program starts on a machine without one and says there is no GPU). */
#ifndef PLANC_NVCC
#define PLANC_NVCC ""
#endif
#ifndef PLANC_CUDA_LIB
#define PLANC_CUDA_LIB ""
#endif
#ifndef PLANC_CUDA_LINK
#define PLANC_CUDA_LINK ""
#endif
#ifndef PLANC_CUDA_INCLUDE
#define PLANC_CUDA_INCLUDE ""
#endif


static bool cmd_cuda(Lowered *low, const Options *o, bool compile)
{
	if (!cuda_executable(low, true))
		return false;
	Arena *a = low->g->arena;
	bool dump = o->dump_after && !strcmp(o->dump_after, "emit");
	if (!compile)
		return emit_cuda(low, o->output, o->file, !o->no_layer_loops) &&
		       (!dump || (dump_after_emit(arena_printf(a, "%s/prog.c", o->output), stdout) &&
				  dump_after_emit(arena_printf(a, "%s/kernels.cu", o->output), stdout)));
	if (!*PLANC_NVCC || !*PLANC_CUDA_LIB) {
		fprintf(stderr, "planc: error: this planc was built without the CUDA toolkit (no nvcc when it was configured), "
				"so it cannot build for --target cuda\n");
		diag_note_plain("'planc emit cuda %s --plan %s -o DIR' writes the sources; runtime/README.md says how to build "
				"them elsewhere", o->file, low->ps->plan->name);
		return false;
	}
	static const char *const files[] = {"prog.c", "kernels.cu", "loops.h", "prog.o", "kernels.o"};
	const char *dir = scratch_begin(a, files, 5);
	if (!dir)
		return false;
	bool ok = emit_cuda(low, dir, o->file, !o->no_layer_loops);
	if (ok && dump)
		ok = dump_after_emit(arena_printf(a, "%s/prog.c", dir), stdout) &&
		     dump_after_emit(arena_printf(a, "%s/kernels.cu", dir), stdout);
	const char *inc = arena_printf(a, "-I%s", PLANC_RUNTIME_DIR);
	const char *cc = getenv("PLANC_MPICC");
	cc = cc && *cc ? cc : PLANC_MPICC;
	const char *nvcc = getenv("PLANC_NVCC");
	nvcc = nvcc && *nvcc ? nvcc : PLANC_NVCC;
	if (ok) {
		char *argv[] = {(char *)nvcc, "-std=c++17", "-gencode", "arch=compute_80,code=[sm_80,sm_90,compute_80]",
				"-Xcompiler", "-Wall", (char *)inc, "-c", arena_printf(a, "%s/kernels.cu", dir), "-o",
				arena_printf(a, "%s/kernels.o", dir), NULL};
		ok = run_command(argv) == 0;
	}
	if (ok) {
		char *argv[] = {(char *)cc, "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", (char *)inc,
				"-c", arena_printf(a, "%s/prog.c", dir), "-o", arena_printf(a, "%s/prog.o", dir), NULL};
		ok = run_command(argv) == 0;
	}
	if (ok) {
		char *libs = arena_printf(a, "%s %s", PLANC_CUDA_LINK, PLANC_LINK_LIBS);
		char *argv[96];
		int n = 0;
		argv[n++] = (char *)cc;
		if (*PLANC_FUSE_LD)
			argv[n++] = PLANC_FUSE_LD;
		argv[n++] = arena_printf(a, "%s/prog.o", dir);
		argv[n++] = arena_printf(a, "%s/kernels.o", dir);
		argv[n++] = "-o";
		int out_at = n++;
		argv[n++] = (char *)PLANC_CUDA_LIB;
		argv[n++] = (char *)PLANC_RUNTIME_LIB;
		for (char *t = strtok(libs, " "); t && n < 92; t = strtok(NULL, " "))
			argv[n++] = t;
		argv[n++] = "-lm";
		argv[n] = NULL;
		ok = link_program(argv, out_at, o->output, a);
	}
	scratch_end();
	if (!ok) {
		fprintf(stderr, "planc: error: building the CUDA program failed\n");
		diag_note_plain("'planc emit cuda %s --plan %s -o DIR' writes what was compiled, for inspection", o->file,
				low->ps->plan->name);
	}
	return ok;
}

/* ---- the LLVM back end: a module loaded by the commands that use it (CMakeLists.txt says why) */

static void *llvm_symbol(const char *name)
{
	static void *module;
	if (!module && !(module = dlopen(PLANC_LLVM_MODULE, RTLD_NOW | RTLD_LOCAL))) {
		fprintf(stderr, "planc: error: cannot load the LLVM back end: %s\n", dlerror());
		diag_note_plain("rebuild planc (cmake --build build), or use the C back end: planc build FILE --plan P -o PROG");
		return NULL;
	}
	void *f = dlsym(module, name);
	if (!f)
		fprintf(stderr, "planc: error: the LLVM back end %s has no %s\n", PLANC_LLVM_MODULE, name);
	return f;
}

static bool llvm_emit_ir(const Lowered *low, const char *dir, const char *source_path, FILE *dump)
{
	bool (*f)(const Lowered *, const char *, const char *, FILE *) = llvm_symbol("emit_llvm_ir");
	return f && f(low, dir, source_path, dump);
}

static bool llvm_emit_ptx(const Lowered *low, const char *dir, FILE *dump)
{
	bool (*f)(const Lowered *, const char *, FILE *) = llvm_symbol("emit_ptx");
	return f && f(low, dir, dump);
}

static bool llvm_emit_object(const Lowered *low, const char *path, const char *source_path, bool verify, bool native)
{
	bool (*f)(const Lowered *, const char *, const char *, bool, bool) = llvm_symbol("emit_llvm_object");
	return f && f(low, path, source_path, verify, native);
}

static int llvm_jit(const Lowered *low, const char *source_path, int argc, char **argv, bool verify)
{
	int (*f)(const Lowered *, const char *, int, char **, bool) = llvm_symbol("llvm_run");
	return f ? f(low, source_path, argc, argv, verify) : -1;
}

/* emit / build: print the lowered program as C (emit llvm: LLVM IR; emit ptx: the fused kernels as
 * PTX); build then compiles it against planrt: the C with mpicc, or (--backend llvm) an object LLVM
 * writes, linked by the same mpicc line. */
static bool cmd_codegen(Lowered *low, const Options *o, bool compile)
{
	if (!lowered_executable(low, true))
		return false;
	Graph *g = low->g;
	FILE *dump = o->dump_after && !strcmp(o->dump_after, "emit") ? stdout : NULL;
	if (!compile && !strcmp(o->target, "llvm"))
		return llvm_emit_ir(low, o->output, o->file, dump);
	if (!compile && !strcmp(o->target, "ptx"))
		return llvm_emit_ptx(low, o->output, dump);
	bool llvm = compile && o->backend && !strcmp(o->backend, "llvm");
	const char *dir = o->output;
	static const char *const files[] = {"prog.c", "prog.o", "decode.c"};
	if (compile && !(dir = scratch_begin(g->arena, files, 3)))
		return false;
	const char *src = arena_printf(g->arena, llvm ? "%s/prog.o" : "%s/prog.c", dir);
	if (llvm ? !llvm_emit_object(low, src, o->file, o->verify, o->native)
		 : !run_emit(low, dir, o->file, !o->no_layer_loops, o->dump_after, stdout)) {
		if (compile)
			scratch_end();
		return false;
	}
	if (!compile)
		return true;
	char *libs = arena_strdup(g->arena, PLANC_LINK_LIBS);
	char *argv[64];
	int n = 0;
	const char *cc = getenv("PLANC_MPICC");
	argv[n++] = (char *)(cc && *cc ? cc : PLANC_MPICC);
	if (*PLANC_FUSE_LD)
		argv[n++] = PLANC_FUSE_LD;
	if (!llvm) {
		argv[n++] = "-std=gnu11";
		argv[n++] = "-O3";
		/* floating-point selects if-convert, so the fused loops vectorise (only the exception
		 * flags of discarded lanes differ, which nothing reads) */
		argv[n++] = "-fno-trapping-math";
		if (o->native) { /* for this CPU only; else every level (planrt_cpu.h): any node of a cluster */
			argv[n++] = "-march=native";
			argv[n++] = "-DPLANRT_CPU_NATIVE";
		}
		argv[n++] = "-Wall";
		argv[n++] = "-Wextra";
		argv[n++] = "-Werror";
		argv[n++] = (char *)arena_printf(g->arena, "-I%s", PLANC_RUNTIME_DIR);
	}
	argv[n++] = (char *)src;
	if (low->decode) /* --generate: the decode program */
		argv[n++] = (char *)arena_printf(g->arena, "%s/decode.c", dir);
	argv[n++] = "-o";
	int out_at = n++;
	argv[n++] = (char *)PLANC_RUNTIME_LIB;
	for (char *t = strtok(libs, " "); t && n < 62; t = strtok(NULL, " "))
		argv[n++] = t;
	argv[n++] = "-lm";
	argv[n] = NULL;
	bool linked = link_program(argv, out_at, o->output, g->arena);
	scratch_end();
	if (!linked) {
		fprintf(stderr, "planc: error: %s the generated program failed\n", llvm ? "linking" : "compiling");
		diag_note_plain("'planc emit %s %s --plan %s -o DIR' writes what was %s, for inspection", llvm ? "llvm" : "c",
				o->file, low->ps->plan->name, llvm ? "linked" : "compiled");
		return false;
	}
	return true;
}

/* run: the LLVM back end's JIT, then the program with the arguments after FILE */
static int cmd_run(Lowered *low, Options *o)
{
	if (!lowered_executable(low, true))
		return 1;
	o->prog_argv[0] = arena_printf(low->g->arena, "planc run %s --plan %s", o->file, low->ps->plan->name);
	int status = llvm_jit(low, o->file, o->prog_argc, o->prog_argv, o->verify);
	return status < 0 ? 1 : status;
}

/* reshard: the plan's program, JIT-compiled as for run, rewrites a checkpoint of any plan of the
 * model as this plan lays it out (planrt_ckpt_reshard: one process plays every rank in turn) */
static int cmd_reshard(Lowered *low, Options *o)
{
	if (!lowered_executable(low, true))
		return 1;
	char *argv[] = {arena_printf(low->g->arena, "planc reshard %s --plan %s", o->file, low->ps->plan->name),
			"--reshard", (char *)o->checkpoint, (char *)o->output, NULL};
	int status = llvm_jit(low, o->file, 4, argv, o->verify);
	return status < 0 ? 1 : status;
}

int main(int argc, char **argv)
{
	heap_tune();
	if (argc > 1 && !strcmp(argv[1], "data")) /* text to tokens: its own options (data/data_cli.c) */
		return data_main(argc - 1, argv + 1);
#ifdef PLANC_CALIBRATE
	if (argc > 1 && !strcmp(argv[1], "calibrate")) /* a measured device file: its own options (calibrate.c) */
		return calibrate_main(argc - 1, argv + 1);
#endif
	if (argc > 1 && !strcmp(argv[1], "search")) /* the fastest plan that fits: its own options (search.c) */
		return search_main(argc - 1, argv + 1);
	Options o = {0};
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	bool is_check = !strcmp(o.command, "check"), is_explain = !strcmp(o.command, "explain");
	bool is_fmt = !strcmp(o.command, "fmt");
	bool is_emit = !strcmp(o.command, "emit"), is_build = !strcmp(o.command, "build");
	bool is_run = !strcmp(o.command, "run"), is_reshard = !strcmp(o.command, "reshard");
	if (is_reshard && (!o.file || !o.checkpoint || !o.output))
		return usage_error("reshard needs the plan file, the checkpoint and -o: planc reshard FILE --plan NAME CKPT -o "
				   "DIR%s", "");
	if (!is_check && !is_explain && !is_fmt && !is_emit && !is_build && !is_run && !is_reshard)
		return usage_error("unknown command '%s'", o.command);
	if (is_emit && (!o.target || (strcmp(o.target, "c") && strcmp(o.target, "llvm") && strcmp(o.target, "ptx") &&
				      strcmp(o.target, "cuda"))))
		return usage_error("emit supports the targets c, llvm, ptx and cuda: planc emit c FILE --plan NAME -o DIR%s", "");
	if (o.cuda && !is_build)
		return usage_error("--target applies to 'build' (emit names its target: planc emit cuda ...)%s", "");
	if (o.cuda && o.backend)
		return usage_error("--target cuda compiles with nvcc and the C compiler; --backend does not apply%s", "");
	if (o.backend && !is_build)
		return usage_error("--backend applies to 'build' ('run' always uses llvm)%s", "");
	if ((is_emit || is_build) && !o.output)
		return usage_error("'%s' needs -o PATH", o.command);
	if (!o.file)
		return usage_error("'%s' needs a FILE", o.command);
	if (o.native && !is_build)
		return usage_error("--native applies to 'build'%s", "");
	if (o.no_layer_loops && !is_build && !(is_emit && o.target && (!strcmp(o.target, "c") || !strcmp(o.target, "cuda"))))
		return usage_error("--no-layer-loops applies to 'emit c', 'emit cuda' and 'build' (the C they print)%s", "");
	if (o.svg && !is_explain)
		return usage_error("--svg applies to 'explain'%s", "");
	if (o.nmodel_args && is_fmt)
		return usage_error("--model-arg applies to the commands that compile a plan, not to 'fmt'%s", "");
	if ((o.generate || (o.dump_after && !strcmp(o.dump_after, "decode"))) && !is_check && !is_build &&
	    !(is_emit && o.target && !strcmp(o.target, "c")))
		return usage_error("--generate applies to 'check', 'build' and 'emit c' (docs/generate.md)%s", "");
	if (o.generate && is_build && (o.cuda || (o.backend && !strcmp(o.backend, "llvm"))))
		return usage_error("--generate builds with the C back end for CPUs: drop --backend llvm / --target cuda "
				   "(docs/generate.md)%s", "");
	setvbuf(stderr, NULL, _IOLBF, BUFSIZ); /* a diagnostic's source line is one write, not one per byte */
	if (!outputs_ok(&o, NULL, is_emit, is_build, is_explain))
		return 1;
	if (is_reshard) { /* "DIR/" is DIR: no "DIR//step-N" in what the runtime prints */
		size_t n = strlen(o.output);
		while (n > 1 && o.output[n - 1] == '/')
			n--;
		char *dir = strndup(o.output, n);
		if (!dir)
			return 1;
		o.output = dir; /* lives until exit */
	}
	if (is_reshard && !output_ok("-o", o.output, true, &o, NULL))
		return 1;
	Arena *a = arena_new();
	if (is_fmt) {
		rc = cmd_fmt(&o, a);
		arena_free(a);
		return rc;
	}
	Program *p = load_program(a, o.file);
	if (p && !load_model_args(p, o.model_args, o.nmodel_args)) {
		arena_free(a);
		return 1;
	}
	if (p && !outputs_ok(&o, p->modules, is_emit, is_build, is_explain)) { /* the imports are inputs too */
		arena_free(a);
		return 1;
	}
	/* one plan (--plan, or the one explain, emit, build and run use): only it is checked, so
	 * errors in the file's other plans and models do not block it */
	bool one = o.plan || is_explain || is_emit || is_build || is_run || is_reshard;
	Item *plan = p && one ? default_plan(p, o.plan) : NULL;
	bool ok = p != NULL;
	if (p && one && !plan) {
		if (o.plan)
			fprintf(stderr, "planc: error: no plan named '%s' in %s\n", o.plan, o.file);
		else
			fprintf(stderr, "planc: error: %s has no plan\n", o.file);
		ok = false;
	}
	ok = ok && sema_check_plan(p, plan);
	int nplans = 0;
	if (ok) {
		if (one) {
			Arena *program_arena = plan_arena_begin(p);
			Lowered *low = compile_plan(p, plan, &o, is_explain);
			ok = low != NULL;
			if (ok && (is_run || is_reshard)) {
				rc = is_run ? cmd_run(low, &o) : cmd_reshard(low, &o);
				arena_free(a);
				return rc;
			}
			if (ok && (is_emit || is_build))
				ok = o.cuda || (is_emit && !strcmp(o.target, "cuda")) ? cmd_cuda(low, &o, is_build)
										      : cmd_codegen(low, &o, is_build);
			plan_arena_end(p, program_arena);
			nplans = 1;
		} else {
			for (Item *it = p->main->items; it && !diag_stopped(); it = it->next) {
				if (it->kind != I_PLAN)
					continue;
				Arena *program_arena = plan_arena_begin(p); /* a file of 20,000 plans needs one plan's memory */
				if (!compile_plan(p, it, &o, false))
					ok = false;
				plan_arena_end(p, program_arena);
				nplans++;
			}
		}
	}
	if (diag_error_count() > 0)
		ok = false;
	if (ok && is_check) { /* one line that says it worked */
		if (plan)
			printf("%s: plan %s checked: no errors\n", o.file, plan->name);
		else
			printf("%s: %d plan%s checked: no errors\n", o.file, nplans, nplans == 1 ? "" : "s");
	}
	arena_free(a);
	return ok ? 0 : 1;
}
