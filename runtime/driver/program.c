/* program.c: planrt_main, the part of every generated program that is the same for all of them,
 * and the kernels of planrt_program.h that the program's phase functions call.
 *
 * A generated program is tables (mesh, parameters, state buffers, the arena layout, one action
 * table per pipeline stage) and phase functions; planrt_main(argc, argv, &PROGRAM) does the rest
 * in one place, so that flag parsing, the world-size check, allocation, --init / --save, the data
 * file, the step loop, progress, metrics and the measurement hooks the tests rely on are written
 * once instead of printed into every program:
 *
 *   1. --help is answered before MPI starts (a single process without mpirun works); then
 *      planrt_init, the world size against the plan, the mesh, the options' errors;
 *   2. --save is probed (a file created and removed beside it) and --log opened before anything
 *      expensive, so an unusable path fails in the first second, not after training;
 *   3. this rank's stage (its pipe coordinate) gets its state buffers (zeroed, 64-byte aligned,
 *      counted per kind), its arena (every word set to a canary, whose highest overwritten word
 *      is the measured high-water mark) and its slots' request sets;
 *   4. data, --init, stage->init;
 *   5. the steps: step_begin, the action table, step_end; rank 0 logs and prints progress;
 *   6. --save, the PLANRT_REPORT_* lines, planrt_finalize.
 *
 * The walker. Action i + 1 is prepared (its receives posted) right before action i runs, so a
 * transfer overlaps the previous action's compute. Each activation slot owns nreqs request
 * handles; a send started from a slot stays in flight until the slot is reused: before a forward
 * action is prepared, its slot's requests are waited and cleared (the forward is the first user
 * of a slot for a new micro-batch), and every slot is drained at the end of the step. When the
 * action that runs between the forward's prepare and the forward itself uses the same slot (in
 * 1F1B, B m is followed by F m + nslots), that drain moves to right before the forward runs, so
 * that it also covers the sends B m starts, and it spares the receives the forward's own prepare
 * posted.
 *
 * Checkpoints are written without moving parameters between ranks: every rank computes the same
 * safetensors layout (it is a function of the parameter table), rank 0 creates a temporary file
 * beside the target with the header and the full size, every rank pwrite()s its own pieces at
 * their offsets, the ranks agree on success, and rank 0 fills in the checksum, fsyncs and renames
 * the file over the target. The bytes are exactly those planrt_st_write would write for the same
 * tensors (sorted compact JSON header padded to 8 bytes, data ordered by name, the FNV-1a
 * checksum of the data area in __metadata__; the checksum's 16 hex digits have a fixed width, so
 * rank 0 writes a placeholder and patches it after reading the data back). On any failure the
 * temporary file is removed and the target is left as it was.
 *
 * The control messages of a checkpoint (the temporary file's name, the agreement) use MPI on the
 * world directly, so that planrt's per-kind traffic counters hold only the plan's own traffic,
 * which planc explain predicts. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "../io/planrt_ckpt.h"
#include "planrt_cpu.h"
#include "planrt_device.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "../io/planrt_namemap.h"
#include "planrt_offload.h"
#include "planrt_program.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_DIMS = 8, NO_INBOX = 0xffff };
#define CANARY 0x5A17C0DE5A17C0DEull
#define DEFAULT_SEED 1234
#define CHECKSUM_PLACEHOLDER "\"planrt_checksum\":\"fnv1a64:0000000000000000\""

/* the running program, for the kernels (set by planrt_main) */
static const planrt_program_t *prog;
/* --map: --init and --save under another framework's names (namemap.c) */
static planrt_namemap_t name_map;

/* ------------------------------------------------------------------ options */

typedef struct options {
	int64_t steps; /* -1: not given */
	uint64_t seed;
	int seed_given;
	const char *data, *init, *save, *log, *map;
	const char *save_every_dir, *resume, *trace;
	const char *reshard_from, *reshard_to; /* --reshard SRC OUT */
	int nother;                            /* options other than --reshard given */
	int64_t save_every, keep, eval_every, eval_batches, max_skips;
	int max_skips_given;                   /* --max-skips was given (fp16 plans only) */
	double loss_scale_init;                /* --loss-scale-init, or 0: the plan's */
	int help;
	char error[512]; /* the first usage error, reported after planrt_init */
} options_t;

static const char usage_line[] =
	"--steps K --data FILE [--init W.safetensors] [--save W.safetensors] [--map NAMES.map] [--log run.jsonl] "
	"[--seed S] [--save-every N DIR [--keep K]] [--resume DIR] [--trace T.json] [--eval-every N [--eval-batches B]] "
	"[--max-skips K] [--loss-scale-init S]";

static void set_error(options_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(options_t *o, const char *fmt, ...)
{
	if (o->error[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->error, sizeof o->error, fmt, ap);
	va_end(ap);
}

/* strtoll / strtoull accept leading spaces and signs and wrap negatives for unsigned: only plain
 * decimal digits are numbers here */
static int all_digits(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* An integer option's value: plain decimal digits in [lo, hi] (an empty value, a sign, spaces or
 * a number out of range is an error naming the range, never clamped). */
static int parse_count(options_t *o, const char *opt, const char *v, long long lo, long long hi, int64_t *out)
{
	const char *what = lo > 0 ? "a positive integer" : "a non-negative integer";
	if (!*v) {
		set_error(o, "%s needs %s, not an empty value", opt, what);
		return 0;
	}
	errno = 0;
	unsigned long long k = all_digits(v) ? strtoull(v, NULL, 10) : 0;
	if (!all_digits(v)) {
		set_error(o, "%s needs %s, not %s", opt, what, v);
		return 0;
	}
	if (errno == ERANGE || k < (unsigned long long)lo || k > (unsigned long long)hi) {
		set_error(o, "%s needs %s from %lld to %lld, not %s", opt, what, lo, hi, v);
		return 0;
	}
	*out = (int64_t)k;
	return 1;
}

/* Parses argv without failing: the first error is kept for after planrt_init, so that --help
 * anywhere is still answered before MPI starts. A value that looks like an option ("--x") is a
 * missing value; an empty value is an error. */
static void parse_options(int argc, char **argv, options_t *o)
{
	memset(o, 0, sizeof *o);
	o->steps = -1;
	o->seed = DEFAULT_SEED;
	o->eval_batches = 4;
	o->max_skips = 20;
	const long long most = 1ll << 62;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			o->help = 1;
			continue;
		}
		const char **text = !strcmp(a, "--data")     ? &o->data
				    : !strcmp(a, "--init")   ? &o->init
				    : !strcmp(a, "--save")   ? &o->save
				    : !strcmp(a, "--log")    ? &o->log
				    : !strcmp(a, "--resume") ? &o->resume
				    : !strcmp(a, "--trace")  ? &o->trace
				    : !strcmp(a, "--map")    ? &o->map
							     : NULL;
		int numeric = !strcmp(a, "--steps") || !strcmp(a, "--seed") || !strcmp(a, "--keep") ||
			      !strcmp(a, "--eval-every") || !strcmp(a, "--eval-batches") || !strcmp(a, "--max-skips") ||
			      !strcmp(a, "--loss-scale-init");
		int pair = !strcmp(a, "--save-every"); /* N DIR */
		int reshard = !strcmp(a, "--reshard"); /* SRC OUT */
		if (!reshard)
			o->nother++;
		if (reshard) {
			if (i + 2 >= argc || !strncmp(argv[i + 1], "--", 2) || !strncmp(argv[i + 2], "--", 2)) {
				set_error(o, "missing values after --reshard (--reshard CHECKPOINT OUT_DIR)");
				i = argc;
				continue;
			}
			o->reshard_from = argv[++i];
			o->reshard_to = argv[++i];
			if (!*o->reshard_from || !*o->reshard_to)
				set_error(o, "--reshard needs a checkpoint and an output directory, not an empty value");
			continue;
		}
		if (!text && !numeric && !pair) {
			set_error(o, "unknown option %s", a);
			continue;
		}
		int values = pair ? 2 : 1;
		int missing = 0;
		for (int k = 1; k <= values; k++)
			missing |= i + k >= argc || !strncmp(argv[i + k], "--", 2) || !strcmp(argv[i + k], "-h");
		if (missing) {
			set_error(o, pair ? "missing values after %s (--save-every N DIR)" : "missing value after %s", a);
			continue;
		}
		const char *v = argv[++i];
		if (text) {
			if (!*v)
				set_error(o, "%s needs a path, not an empty value", a);
			*text = v;
		} else if (pair) {
			parse_count(o, "--save-every", v, 1, most, &o->save_every);
			o->save_every_dir = argv[++i];
			if (!*o->save_every_dir)
				set_error(o, "--save-every needs a directory after its step count, not an empty value");
		} else if (!strcmp(a, "--steps")) {
			parse_count(o, "--steps", v, 0, most, &o->steps);
		} else if (!strcmp(a, "--keep")) {
			parse_count(o, "--keep", v, 1, 1000000, &o->keep);
		} else if (!strcmp(a, "--eval-every")) {
			parse_count(o, "--eval-every", v, 1, most, &o->eval_every);
		} else if (!strcmp(a, "--eval-batches")) {
			parse_count(o, "--eval-batches", v, 1, 1000000, &o->eval_batches);
		} else if (!strcmp(a, "--max-skips")) {
			parse_count(o, "--max-skips", v, 1, 1000000, &o->max_skips);
			o->max_skips_given = 1;
		} else if (!strcmp(a, "--loss-scale-init")) {
			char *end;
			errno = 0;
			double x = strtod(v, &end);
			if (*end || errno == ERANGE || !isfinite(x) || x <= 0)
				set_error(o, "--loss-scale-init needs a positive finite number (e.g. 65536), not %s", v);
			else
				o->loss_scale_init = x;
		} else {
			errno = 0;
			unsigned long long s = all_digits(v) ? strtoull(v, NULL, 10) : 0;
			if (!all_digits(v) || errno == ERANGE)
				set_error(o, "--seed needs an unsigned integer (0 to 18446744073709551615), not %s", v);
			else
				o->seed = s;
			o->seed_given = 1;
		}
	}
	if (!o->help && !o->error[0] && o->reshard_from && o->nother)
		set_error(o, "--reshard CHECKPOINT OUT_DIR takes no other option (it trains nothing)");
	if (!o->help && !o->error[0] && !o->reshard_from && (o->steps < 0 || !o->data))
		set_error(o, "--steps and --data are required");
	if (!o->help && !o->error[0] && o->keep && !o->save_every_dir)
		set_error(o, "--keep needs --save-every N DIR (it keeps the newest K checkpoints there)");
	if (!o->help && !o->error[0] && o->resume && o->init)
		set_error(o, "--resume and --init both set the weights; pass one of them");
}

static void mesh_text(const planrt_program_t *p, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	for (int a = 0; a < p->naxes && len < n; a++)
		len += (size_t)snprintf(buf + len, n - len, "%s%s = %d", a ? ", " : "",
					p->axis_names && p->axis_names[a] ? p->axis_names[a] : "?", p->axis_sizes[a]);
	if (!p->naxes)
		snprintf(buf, n, "no axes");
}

/* Under mpirun every rank would print the help; only the first does (the launchers' rank
 * variables; no MPI call is made for --help). */
static int launcher_rank0(void)
{
	const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return !strcmp(v, "0");
	}
	return 1;
}

static void print_help(const char *prog_name, const planrt_program_t *p)
{
	char mesh[512];
	mesh_text(p, mesh, sizeof mesh);
	printf("usage: %s %s\n\n", prog_name, usage_line);
	printf("Trains plan %s of model %s%s%s%s.\n", p->plan ? p->plan : "?", p->model ? p->model : "?",
	       p->source ? " (" : "", p->source ? p->source : "", p->source ? ")" : "");
	printf("  mesh: %s; world %d ranks: launch with mpirun -np %d %s ...\n", mesh, p->world, p->world, prog_name);
	if (p->pipe_axis >= 0 && p->pipe_axis < p->naxes)
		printf("  pipeline: %d stages on axis %s, %d micro-batches\n", p->nstages,
		       p->axis_names && p->axis_names[p->pipe_axis] ? p->axis_names[p->pipe_axis] : "?", p->micro_batches);
	else
		printf("  no pipeline; %d micro-batch%s per step\n", p->micro_batches, p->micro_batches == 1 ? "" : "es");
	printf("  step: %lld samples of %lld tokens (vocabulary %lld)\n", (long long)p->batch, (long long)p->seq,
	       (long long)p->vocab);
	char cpu[512];
	if (planrt_cpu_select() == planrt_success)
		planrt_cpu_describe(cpu, sizeof cpu);
	else
		snprintf(cpu, sizeof cpu, "%s", planrt_last_error());
	printf("  cpu: %s\n\n", cpu);
	printf("options:\n"
	       "  --steps K             optimizer steps to train (required; 0 initialises, loads and saves)\n"
	       "  --data FILE           training tokens: a text file (bytes) or a nanoGPT uint16 .bin file "
	       "(required)\n"
	       "  --init W.safetensors  initial weights (default: drawn from the seed)\n"
	       "  --save W.safetensors  write the trained weights there (temporary file, fsync, rename)\n"
	       "  --map NAMES.map       --init and --save under another framework's names and layouts\n"
	       "                        (stdlib/maps/hf_llama.map: Hugging Face's Llama)\n"
	       "  --log run.jsonl       rank 0 writes one JSON line of metrics per step (appended to with --resume)\n"
	       "  --seed S              seed of initialisation, data order and dropout (default %d)\n"
	       "  --save-every N DIR    every N steps and after the last, a sharded checkpoint in DIR/step-K (each\n"
	       "                        rank its pieces of the parameters, optimizer state and master weights, and\n"
	       "                        a manifest written last; atomic, checksummed)\n"
	       "  --keep K              keep the newest K checkpoints in DIR (default: all)\n"
	       "  --resume DIR          continue from the newest complete checkpoint in DIR (or DIR/step-K): bit\n"
	       "                        for bit under the plan that wrote it, resharded under another plan\n"
	       "  --reshard CKPT OUT    no training: the checkpoint CKPT (a --save-every directory or a step-N\n"
	       "                        of any plan of this model) rewritten into OUT/step-N as this plan holds it;\n"
	       "                        one process, without mpirun; then --resume OUT (planc reshard does the same)\n"
	       "  --trace T.json        a Chrome-trace / Perfetto timeline of every rank (compute, collectives,\n"
	       "                        transfers, waits)\n"
	       "  --eval-every N        every N steps, the loss on held-out data (the last tenth of the tokens,\n"
	       "                        which training then never sees) over --eval-batches B batches (default 4)\n"
	       "  --max-skips K         fp16 loss scaling: stop after K consecutive skipped steps (default 20)\n"
	       "  --loss-scale-init S   fp16 loss scaling: the first step's scale (default: the plan's, 65536 for\n"
	       "                        dynamic)\n"
	       "  --help, -h            this text\n"
	       "environment: PLANRT_WATCHDOG=SECONDS (stall limit, 0 off), PLANRT_REPORT_MEMORY, "
	       "PLANRT_REPORT_TIMING, PLANRT_REPORT_COMM (one stderr line per rank),\n"
	       "  PLANRT_STRAGGLER=RANK:MS or random:MS (that rank, or one drawn per step, sleeps MS ms at each "
	       "step's start),\n"
	       "  PLANRT_ISA=LEVEL (the instruction-set level of the fused loops and kernels, one of the cpu line's;\n"
	       "  default: the best this CPU runs)\n",
	       DEFAULT_SEED);
	fflush(stdout);
}

/* A path the run will write must be usable before training: its directory exists and takes a new
 * file (a probe created and removed beside the target), and it is not a directory itself. */
static void probe_writable(const char *what, const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		planrt_fatal("%s '%s' is a directory; pass a file name such as '%s/weights.safetensors'", what, path, path);
	char *copy = strdup(path);
	if (!copy)
		planrt_fatal("out of memory checking %s '%s'", what, path);
	const char *dir = dirname(copy);
	if (stat(dir, &st) != 0)
		planrt_fatal("cannot write %s '%s': directory '%s': %s; create it first", what, path, dir, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		planrt_fatal("cannot write %s '%s': '%s' is not a directory", what, path, dir);
	size_t n = strlen(path) + 48;
	char *probe = malloc(n);
	if (!probe)
		planrt_fatal("out of memory checking %s '%s'", what, path);
	int fd = -1;
	for (int k = 0; k < 100 && fd < 0; k++) {
		snprintf(probe, n, "%s.tmp.probe.%ld.%d", path, (long)getpid(), k);
		fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0)
		planrt_fatal("cannot write %s '%s': cannot create a file in '%s': %s; check its permissions and free space",
			     what, path, dir, strerror(errno));
	close(fd);
	unlink(probe);
	free(probe);
	free(copy);
}

/* ------------------------------------------------------------------ checks of the tables
 * The tables are generated; an inconsistency is planc's bug, reported before it corrupts memory. */

static void check_program(const planrt_program_t *p, int stage_index)
{
	int nroles = p->nroles > 1 ? p->nroles : 1;
	if (p->nstages < 1 || !p->stages)
		planrt_fatal("internal error: program '%s' has no stages", p->plan);
	if (p->pipe_axis >= p->naxes || (nroles > 1 && (p->role_axis < 0 || p->role_axis >= p->naxes)))
		planrt_fatal("internal error: pipe axis %d, role axis %d of a %d-axis mesh", p->pipe_axis, p->role_axis,
			     p->naxes);
	if (stage_index < 0 || stage_index >= p->nstages * nroles)
		planrt_fatal("internal error: this rank runs program %d but the program has %d stages of %d roles",
			     stage_index, p->nstages, nroles);
	const planrt_stage_t *s = &p->stages[stage_index];
	if (s->nslots < 0 || s->ninbox < 0 || s->nreqs < 0 || s->nchunks < 0 || s->nactions < 0 || s->nstate < 0)
		planrt_fatal("internal error: stage %d has a negative count", stage_index);
	if (s->nslots && (s->slot_offset > s->arena_bytes ||
			  s->slot_bytes > (s->arena_bytes - s->slot_offset) / (size_t)s->nslots))
		planrt_fatal("internal error: stage %d's %d slots of %zu bytes at %zu overrun the %zu-byte arena",
			     stage_index, s->nslots, s->slot_bytes, s->slot_offset, s->arena_bytes);
	if (s->ninbox && (s->inbox_offset > s->arena_bytes ||
			  s->inbox_bytes > (s->arena_bytes - s->inbox_offset) / (size_t)s->ninbox))
		planrt_fatal("internal error: stage %d's %d inboxes of %zu bytes at %zu overrun the %zu-byte arena",
			     stage_index, s->ninbox, s->inbox_bytes, s->inbox_offset, s->arena_bytes);
	for (int i = 0; i < s->nactions; i++) {
		const planrt_action_t *a = &s->actions[i];
		const planrt_phase_fn *run = a->kind == PLANRT_FORWARD ? s->forward : s->backward;
		if (a->kind > PLANRT_BACKWARD || a->chunk >= s->nchunks || a->slot >= s->nslots ||
		    (a->inbox != NO_INBOX && a->inbox >= s->ninbox) || !run || !run[a->chunk])
			planrt_fatal("internal error: stage %d action %d (kind %d, chunk %d, slot %d, inbox %d) does not fit "
				     "the stage (%d chunks, %d slots, %d inboxes) or has no function",
				     stage_index, i, a->kind, a->chunk, a->slot, a->inbox, s->nchunks, s->nslots, s->ninbox);
	}
	for (int i = 0; i < s->nstate; i++)
		if (s->state[i].kind >= planrt_state_kinds || !s->state[i].ptr)
			planrt_fatal("internal error: state buffer '%s' has kind %d or no pointer", s->state[i].name,
				     s->state[i].kind);
	for (int i = 0; i < p->nparams; i++) {
		const planrt_param_t *q = &p->params[i];
		if (q->rank < 0 || q->rank > MAX_DIMS)
			planrt_fatal("internal error: parameter '%s' has rank %d", q->name, q->rank);
		for (int d = 0; d < q->rank; d++) {
			int ax = q->split_axis[d];
			int64_t off = ax >= 0 ? (int64_t)planrt_mesh_coord(ax) * q->ldims[d] : 0;
			if (ax >= p->naxes || q->ldims[d] < 0 || off < 0 || off + q->ldims[d] > q->gdims[d])
				planrt_fatal("internal error: parameter '%s' dim %d: block of %lld at %lld (axis %d) "
					     "outside %lld",
					     q->name, d, (long long)q->ldims[d], (long long)off, ax, (long long)q->gdims[d]);
		}
	}
}

/* ------------------------------------------------------------------ parameters */

static const planrt_param_t *param_of(int param)
{
	if (!prog)
		planrt_fatal("internal error: a planrt_program.h kernel called outside planrt_main");
	if (param < 0 || param >= prog->nparams)
		planrt_fatal("internal error: parameter %d of %d", param, prog->nparams);
	return &prog->params[param];
}

/* the local block's offsets in the global tensor; returns its element count */
static int64_t block_of(const planrt_param_t *p, int64_t *offs)
{
	int64_t n = 1;
	for (int d = 0; d < p->rank; d++) {
		offs[d] = p->split_axis[d] >= 0 ? (int64_t)planrt_mesh_coord(p->split_axis[d]) * p->ldims[d] : 0;
		n *= p->ldims[d];
	}
	return n;
}

/* A parameter's block from --init under planc's names; a file under Hugging Face's names (no
 * --map given) gets the fix named */
static void read_init_block(planrt_st_t f, const planrt_param_t *p, const int64_t *offs, float *block)
{
	if (planrt_st_read_block(f, p->name, p->rank, p->gdims, p->ldims, offs, block) == planrt_success)
		return;
	char cause[600];
	snprintf(cause, sizeof cause, "%s", planrt_last_error());
	int dtype;
	int64_t n;
	const void *data;
	if (planrt_st_find_(f, "model.embed_tokens.weight", &dtype, &n, &data) == planrt_success)
		planrt_fatal("--init: %s; the file is under Hugging Face's names (model.embed_tokens.weight): pass --map "
			     "NAMES.map, e.g. stdlib/maps/hf_llama.map (docs/namemap.md)",
			     cause);
	planrt_fatal("--init: %s", cause);
}

void planrt_init_param(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int64_t lo, int64_t n)
{
	const planrt_param_t *p = param_of(param);
	if (dtype != planrt_f32 && dtype != planrt_bf16)
		planrt_fatal("internal error: parameter '%s' initialised as dtype %d; f32 or bf16", p->name, (int)dtype);
	if (n <= 0)
		return;
	int64_t offs[MAX_DIMS];
	int64_t local = block_of(p, offs);
	/* [j0, j1): the positions that hold local elements; the rest is padding */
	int64_t j0 = lo < 0 ? (-lo < n ? -lo : n) : 0;
	int64_t j1 = local - lo < n ? local - lo : n;
	if (j1 < j0)
		j1 = j0;
	float *block = NULL;
	if (j1 > j0) {
		block = malloc(sizeof(float) * (size_t)local);
		if (!block)
			planrt_fatal("out of memory initialising '%s' (%lld elements)", p->name, (long long)local);
		if (ctx->init_file && !(p->init_kind >= 4 && p->init_kind <= 6)) { /* computed buffers are never read */
			if (name_map)
				PLANRT_CHECK(planrt_namemap_read_block(name_map, ctx->init_file, param, p->ldims, offs, block));
			else
				read_init_block(ctx->init_file, p, offs, block);
			for (int64_t i = 0; i < local; i++) /* training from a NaN or Inf would only spread it */
				if (!isfinite(block[i]))
					planrt_fatal("--init: tensor '%s' holds %s at element %lld of this rank's block; refusing to "
						     "train from non-finite weights (the file was saved from a diverged run?)",
						     p->name, isnan(block[i]) ? "NaN" : block[i] > 0 ? "+Inf" : "-Inf", (long long)i);
		}
		else
			planrt_init_block(block, p->rank, p->gdims, p->ldims, offs, p->init_kind, p->a, p->b, ctx->seed,
					  p->name);
	}
	/* positions outside [j0, j1) are left as they are: a ZeRO bucket shard holds several
	 * parameters, each initialising its own part */
	if (j1 > j0 && dtype == planrt_f32)
		memcpy((float *)dst + j0, block + lo + j0, sizeof(float) * (size_t)(j1 - j0));
	else if (j1 > j0)
		planrt_k_f32_to_bf16(block + lo + j0, (uint16_t *)dst + j0, j1 - j0);
	free(block);
}

/* ------------------------------------------------------------------ checkpoints */

struct planrt_save {
	const char *path, *tmp;
	int fd;
	uint64_t data_start;   /* 8 + header length */
	int64_t *offset;       /* [nparams]: byte offset of the tensor in the data area, -1 if not saved */
	char error[1024];      /* the first failure on this rank */
};

typedef struct layout {
	char *header; /* padded JSON, checksum placeholder */
	size_t hlen;
	size_t checksum_at; /* offset of the 16 hex digits in the header */
	int64_t *offset;
	uint64_t data_bytes;
} layout_t;

static const planrt_program_t *sort_prog;

static int cmp_param_name(const void *a, const void *b)
{
	return strcmp(sort_prog->params[*(const int *)a].name, sort_prog->params[*(const int *)b].name);
}

static uint64_t param_elems(const planrt_param_t *p)
{
	uint64_t n = 1;
	for (int d = 0; d < p->rank; d++)
		n *= (uint64_t)p->gdims[d];
	return n;
}

/* The header and offsets planrt_st_write would produce for the saved parameters as f32 tensors
 * (the same on every rank: a function of the table). */
static void build_layout(const planrt_program_t *p, const char *path, layout_t *L)
{
	memset(L, 0, sizeof *L);
	int n = 0;
	int *order = malloc(sizeof(int) * (size_t)(p->nparams ? p->nparams : 1));
	L->offset = malloc(sizeof(int64_t) * (size_t)(p->nparams ? p->nparams : 1));
	if (!order || !L->offset)
		planrt_fatal("out of memory saving '%s'", path);
	for (int i = 0; i < p->nparams; i++) {
		L->offset[i] = -1;
		if (p->params[i].saved)
			order[n++] = i;
	}
	sort_prog = p;
	qsort(order, (size_t)n, sizeof *order, cmp_param_name);
	json_t *root = json_object(), *meta = json_object();
	int ok = root && meta;
	uint64_t off = 0;
	for (int k = 0; ok && k < n; k++) {
		const planrt_param_t *q = &p->params[order[k]];
		if (k && !strcmp(q->name, p->params[order[k - 1]].name))
			planrt_fatal("internal error: two saved parameters are named '%s'", q->name);
		if (!*q->name || !strcmp(q->name, "__metadata__"))
			planrt_fatal("internal error: a saved parameter is named '%s'", q->name);
		uint64_t bytes = 4 * param_elems(q);
		json_t *shape = json_array();
		ok = shape != NULL;
		for (int d = 0; ok && d < q->rank; d++)
			ok = !json_array_append_new(shape, json_integer(q->gdims[d]));
		json_t *e = ok ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
					   (json_int_t)off, (json_int_t)(off + bytes))
			       : NULL;
		ok = ok && e && !json_object_set_new(root, q->name, e);
		L->offset[order[k]] = (int64_t)off;
		off += bytes;
	}
	ok = ok && !json_object_set_new(meta, "format", json_string("pt")) &&
	     !json_object_set_new(meta, "planrt_checksum", json_string("fnv1a64:0000000000000000")) &&
	     !json_object_set(root, "__metadata__", meta);
	char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(meta);
	json_decref(root);
	free(order);
	if (!text)
		planrt_fatal("cannot build the header of '%s' (out of memory)", path);
	size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
	char *h = realloc(text, padded + 1);
	if (!h)
		planrt_fatal("out of memory saving '%s'", path);
	memset(h + raw, ' ', padded - raw);
	h[padded] = 0;
	const char *at = strstr(h, CHECKSUM_PLACEHOLDER);
	if (!at)
		planrt_fatal("internal error: no checksum placeholder in the header of '%s'", path);
	L->header = h;
	L->hlen = padded;
	L->checksum_at = (size_t)(at - h) + strlen(CHECKSUM_PLACEHOLDER) - 17;
	L->data_bytes = off;
}

static void save_fail(struct planrt_save *sv, const char *step, int err)
{
	if (!sv->error[0])
		snprintf(sv->error, sizeof sv->error,
			 "cannot write checkpoint '%s' (%s of '%s' failed: %s); check free space and permissions of its "
			 "directory",
			 sv->path, step, sv->tmp, err ? strerror(err) : "short write");
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t at)
{
	const char *p = buf;
	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)at);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : ENOSPC;
		p += w;
		n -= (size_t)w;
		at += (uint64_t)w;
	}
	return 0;
}

/* Does this rank write its piece of p? Replicas (coordinate > 0 on an axis that neither splits p,
 * nor is the pipeline, nor holds ZeRO shards of it) skip. */
static int writes_piece(const planrt_param_t *p, int shard_axis)
{
	for (int a = 0; a < prog->naxes; a++) {
		if (a == shard_axis || a == prog->pipe_axis)
			continue;
		int splits = 0;
		for (int d = 0; d < p->rank; d++)
			splits |= p->split_axis[d] == a;
		if (!splits && planrt_mesh_coord(a) != 0)
			return 0;
	}
	return 1;
}

/* for checkpoint.c (planrt_ckpt.h) */
const planrt_program_t *planrt_program_(void)
{
	return prog;
}

int64_t planrt_param_block_(int param, int64_t *offs)
{
	return block_of(param_of(param), offs);
}

int planrt_param_writes_(int param, int shard_axis)
{
	return writes_piece(param_of(param), shard_axis);
}

void planrt_save_param(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
		       int shard_axis)
{
	struct planrt_save *sv = ctx->save_file;
	if (!sv)
		planrt_fatal("internal error: planrt_save_param outside the save phase");
	if (sv->error[0])
		return;
	if (!prog || param < 0 || param >= prog->nparams) {
		snprintf(sv->error, sizeof sv->error, "internal error: saving parameter %d of %d", param,
			 prog ? prog->nparams : 0);
		return;
	}
	const planrt_param_t *p = &prog->params[param];
	if (dtype != planrt_f32 && dtype != planrt_bf16) {
		snprintf(sv->error, sizeof sv->error, "internal error: parameter '%s' saved from dtype %d; f32 or bf16",
			 p->name, (int)dtype);
		return;
	}
	if (shard_axis >= prog->naxes) {
		snprintf(sv->error, sizeof sv->error, "internal error: parameter '%s' sharded on axis %d of %d", p->name,
			 shard_axis, prog->naxes);
		return;
	}
	if (!p->saved || n <= 0 || !writes_piece(p, shard_axis))
		return;
	int64_t offs[MAX_DIMS], gstride[MAX_DIMS], stride = 1;
	int64_t local = block_of(p, offs);
	for (int d = p->rank - 1; d >= 0; d--) {
		gstride[d] = stride;
		stride *= p->gdims[d];
	}
	/* runs: the local block is contiguous in the file over its trailing dims that are whole, plus
	 * the first dim (from the end) that is not */
	int64_t unit = 1;
	for (int d = p->rank - 1; d >= 0; d--) {
		unit *= p->ldims[d];
		if (p->ldims[d] != p->gdims[d])
			break;
	}
	int64_t first = lo < 0 ? 0 : lo, end = lo + n < local ? lo + n : local;
	uint64_t base = sv->data_start + (uint64_t)sv->offset[param];
	enum { CHUNK = 16384 };
	float conv[CHUNK];
	for (int64_t idx = first; idx < end;) {
		int64_t len = unit - idx % unit;
		if (len > end - idx)
			len = end - idx;
		int64_t g = 0, rest = idx;
		for (int d = p->rank - 1; d >= 0; d--) {
			int64_t i = p->ldims[d] ? rest % p->ldims[d] : 0;
			rest = p->ldims[d] ? rest / p->ldims[d] : 0;
			g += (offs[d] + i) * gstride[d];
		}
		int err = 0;
		if (dtype == planrt_f32) {
			err = pwrite_all(sv->fd, (const float *)src + (idx - lo), sizeof(float) * (size_t)len,
					 base + 4 * (uint64_t)g);
		} else {
			for (int64_t k = 0; k < len && !err; k += CHUNK) {
				int64_t m = len - k < CHUNK ? len - k : CHUNK;
				planrt_k_bf16_to_f32((const uint16_t *)src + (idx - lo) + k, conv, m);
				err = pwrite_all(sv->fd, conv, sizeof(float) * (size_t)m, base + 4 * (uint64_t)(g + k));
			}
		}
		if (err) {
			save_fail(sv, "write", err);
			return;
		}
		idx += len;
	}
}

static uint64_t fnv1a(uint64_t h, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* rank 0, after every rank wrote: the checksum of the data area into the header, fsync, rename.
 * Returns 0 or sets sv->error (the caller removes the temporary file). */
static int finish_checkpoint(struct planrt_save *sv, const layout_t *L)
{
	int fd = open(sv->tmp, O_RDWR);
	if (fd < 0) {
		save_fail(sv, "reopen", errno);
		return -1;
	}
	enum { BUF = 1 << 20 };
	unsigned char *buf = malloc(BUF);
	if (!buf) {
		close(fd);
		save_fail(sv, "checksum", ENOMEM);
		return -1;
	}
	uint64_t h = 0xcbf29ce484222325ull;
	for (uint64_t at = 0; at < L->data_bytes;) {
		size_t want = L->data_bytes - at < BUF ? (size_t)(L->data_bytes - at) : BUF;
		ssize_t got = pread(fd, buf, want, (off_t)(sv->data_start + at));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			save_fail(sv, "read back", got < 0 ? errno : 0);
			free(buf);
			close(fd);
			return -1;
		}
		h = fnv1a(h, buf, (size_t)got);
		at += (uint64_t)got;
	}
	free(buf);
	char hex[17];
	snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
	int err = pwrite_all(fd, hex, 16, 8 + L->checksum_at);
	const char *step = "checksum write";
	if (!err && fsync(fd) != 0) {
		err = errno;
		step = "fsync";
	}
	if (close(fd) != 0 && !err) {
		err = errno;
		step = "close";
	}
	if (!err && rename(sv->tmp, sv->path) != 0) {
		err = errno;
		step = "rename";
	}
	if (err) {
		save_fail(sv, step, err);
		return -1;
	}
	char *copy = strdup(sv->path);
	if (copy) {
		int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
		free(copy);
	}
	return 0;
}

/* Every rank: writes --save (see the top comment). A failure anywhere ends every rank with the
 * failing rank's one-line cause, after the temporary file is removed. */
static void save_checkpoint(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *path, int rank)
{
	layout_t L;
	build_layout(prog, path, &L);
	struct planrt_save sv = {.path = path, .fd = -1, .data_start = 8 + L.hlen, .offset = L.offset};
	/* rank 0 names the file after its pid and creates it; the broadcast of the pid tells the
	 * others that it exists */
	long pid = (long)getpid();
	size_t tlen = strlen(path) + 32;
	char *tmp = malloc(tlen);
	if (!tmp)
		planrt_fatal("out of memory saving '%s'", path);
	snprintf(tmp, tlen, "%s.tmp.%ld", path, pid);
	sv.tmp = tmp;
	if (rank == 0) {
		const char *step = "create";
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666), err = fd < 0 ? errno : 0;
		unsigned char len8[8];
		for (int i = 0; i < 8; i++)
			len8[i] = (unsigned char)((uint64_t)L.hlen >> (8 * i));
		if (!err && (step = "write", err = pwrite_all(fd, len8, 8, 0)) == 0)
			err = pwrite_all(fd, L.header, L.hlen, 8);
		if (!err && (step = "resize", ftruncate(fd, (off_t)(sv.data_start + L.data_bytes)) != 0))
			err = errno;
		if (fd >= 0 && close(fd) != 0 && !err) {
			step = "close";
			err = errno;
		}
		if (err) {
			save_fail(&sv, step, err);
			if (fd >= 0)
				unlink(tmp);
			planrt_fatal("%s", sv.error);
		}
	}
	planrt_comm_t ctl = planrt_control_comm_();
	int64_t id = pid;
	PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	pid = (long)id;
	snprintf(tmp, tlen, "%s.tmp.%ld", path, pid);
	if (rank == 0)
		planrt_pending_tmp_(tmp); /* a signal that ends the job removes it */
	sv.fd = open(tmp, O_WRONLY);
	if (sv.fd < 0)
		save_fail(&sv, "open", errno);
	ctx->save_file = &sv;
	if (sv.fd >= 0 && stage->save)
		stage->save(ctx);
	ctx->save_file = NULL;
	if (sv.fd >= 0 && close(sv.fd) != 0)
		save_fail(&sv, "close", errno);
	planrt_test_pause("save", 0);
	/* agree (on planrt's control group, under the watchdog): the lowest failing rank, if any,
	 * reports after rank 0 removed the temporary file; the others wait for its MPI_Abort */
	int world = planrt_comm_size(ctl);
	int32_t mine = sv.error[0] ? world - rank : 0, worst = 0, sync = 0;
	PLANRT_CHECK(planrt_allreduce(&mine, &worst, 1, planrt_i32, planrt_max, ctl, NULL, NULL));
	if (worst) {
		if (rank == 0)
			unlink(tmp);
		PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
		if (rank == world - worst)
			planrt_fatal("%s", sv.error);
		PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
		planrt_fatal("checkpoint '%s' not written (rank %d failed)", path, world - worst);
	}
	if (rank == 0 && finish_checkpoint(&sv, &L) != 0) {
		unlink(tmp);
		planrt_fatal("%s", sv.error);
	}
	planrt_pending_tmp_(NULL);
	/* the others pass this once rank 0 has renamed the file (or ended the job) */
	PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	free(tmp);
	free(L.header);
	free(L.offset);
}

/* ------------------------------------------------------------------ inputs and pipeline transfers */

static int32_t *input_scratch;
static size_t input_scratch_n;

void planrt_load_input(planrt_ctx_t *ctx, int32_t *dst, int stream, int64_t row_lo, int64_t rows, int64_t s_lo,
		       int64_t s_n)
{
	if (!prog)
		planrt_fatal("internal error: planrt_load_input outside planrt_main");
	int64_t seq = prog->seq;
	if ((stream != 0 && stream != 1) || row_lo < 0 || rows < 0 || s_lo < 0 || s_n < 0 || s_lo + s_n > seq)
		planrt_fatal("internal error: planrt_load_input(stream %d, rows [%lld, +%lld), positions [%lld, +%lld)) "
			     "of windows of %lld",
			     stream, (long long)row_lo, (long long)rows, (long long)s_lo, (long long)s_n, (long long)seq);
	if (!rows)
		return;
	size_t need = 2 * (size_t)rows * (size_t)seq;
	if (need > input_scratch_n) {
		free(input_scratch);
		input_scratch = malloc(sizeof(int32_t) * need);
		input_scratch_n = input_scratch ? need : 0;
		if (!input_scratch)
			planrt_fatal("out of memory loading a batch of %lld samples", (long long)rows);
	}
	int32_t *tok = input_scratch, *tgt = tok + rows * seq;
	if (ctx->eval_batch >= 0) /* evaluating: a held-out batch */
		PLANRT_CHECK(planrt_data_eval_batch_(ctx->data, ctx->eval_batch, row_lo, row_lo + rows, ctx->seed, tok, tgt));
	else
		PLANRT_CHECK(planrt_data_batch(ctx->data, ctx->step, row_lo, row_lo + rows, ctx->seed, tok, tgt));
	const int32_t *from = stream ? tgt : tok;
	for (int64_t r = 0; r < rows; r++)
		memcpy(dst + r * s_n, from + r * seq + s_lo, sizeof(int32_t) * (size_t)s_n);
}

static planrt_comm_t pipe_comm(const char *what)
{
	planrt_comm_t c = prog && prog->pipe_axis >= 0 ? planrt_axis_comm(prog->pipe_axis) : NULL;
	if (!c)
		planrt_fatal("internal error: %s in a program without a pipeline axis", what);
	return c;
}

void planrt_p2p_send_start(const void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req)
{
	PLANRT_CHECK(planrt_send_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline send"), NULL, req));
}

/* set while the walker evaluates: only forwards run, so the receives of gradients (channels from
 * the stage's chunk count on) that forwards post for their backward are not posted */
static int forward_only_chunks;

void planrt_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req)
{
	if (forward_only_chunks && channel >= forward_only_chunks)
		return;
	PLANRT_CHECK(planrt_recv_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline receive"), NULL, req));
}

void planrt_p2p_finish(planrt_ctx_t *ctx, planrt_request_t *req)
{
	if (!*req)
		return;
	double t0 = planrt_now();
	PLANRT_CHECK(planrt_wait(*req));
	*req = NULL;
	ctx->wait_s += planrt_now() - t0;
}

/* ------------------------------------------------------------------ the walker */

/* --trace: an action (or the prepare that posts its receives) is a compute event, "F 3" or
 * "B 3" (micro-batch 3; ".1" for chunk 1 of an interleaved schedule) */
static void trace_action(const char *prefix, const planrt_action_t *a)
{
	if (!planrt_tracing_)
		return;
	char name[64], args[96];
	snprintf(name, sizeof name, a->chunk ? "%s%c %d.%d" : "%s%c %d", prefix, a->kind == PLANRT_FORWARD ? 'F' : 'B',
		 (int)a->micro, a->chunk);
	planrt_trace_begin_(name, "compute");
	snprintf(args, sizeof args, "\"micro_batch\":%d,\"chunk\":%d", (int)a->micro, a->chunk);
	planrt_trace_args_(args);
}

/* --trace: a run phase (init, a step, a checkpoint, ...) as an event with its step */
static void trace_phase(const char *name, int64_t step)
{
	if (!planrt_tracing_)
		return;
	char args[48];
	planrt_trace_begin_(name, "run");
	snprintf(args, sizeof args, "\"step\":%lld", (long long)step);
	planrt_trace_args_(args);
}

typedef struct walker {
	const planrt_stage_t *stage;
	planrt_ctx_t *ctx;
	planrt_request_t *reqs; /* nslots * nreqs */
	unsigned char *own;     /* nslots * nreqs: started by the prepare of the forward that is next */
	int deferred;           /* the next forward's slot still ran the previous action: drain at its run */
} walker_t;

/* waits for and clears the requests of set[0, n) (those with keep[r] == 0 when keep is given) */
static void drain(walker_t *w, planrt_request_t *set, int n, const unsigned char *keep)
{
	double t0 = 0;
	int waited = 0;
	for (int r = 0; r < n; r++)
		if (set[r] && !(keep && keep[r])) {
			if (!waited++)
				t0 = planrt_now();
			PLANRT_CHECK(planrt_wait(set[r]));
			set[r] = NULL;
		}
	if (waited)
		w->ctx->wait_s += planrt_now() - t0;
}

/* the ctx fields of action a */
static void point_at(walker_t *w, const planrt_action_t *a)
{
	const planrt_stage_t *s = w->stage;
	planrt_ctx_t *ctx = w->ctx;
	ctx->micro = (int)a->micro;
	ctx->chunk = a->chunk;
	ctx->slot = ctx->arena + s->slot_offset + (size_t)a->slot * s->slot_bytes;
	ctx->slot_index = a->slot;
	ctx->reqs = w->reqs + (size_t)a->slot * (size_t)s->nreqs;
	ctx->inbox = a->inbox == NO_INBOX ? NULL : ctx->arena + s->inbox_offset + (size_t)a->inbox * s->inbox_bytes;
}

/* Prepares action i; action i - 1 (if any) runs next. A forward starts a new micro-batch in its
 * slot, so the slot's requests (sends of the micro-batch that used it before) are drained first.
 * When action i - 1 itself uses that slot (1F1B: B m is followed by F m + slots on the same slot),
 * it has not run yet: its sends start only when it runs, and its prepared receives belong to it.
 * Then the drain waits until just before the forward runs, and spares the receives the forward's
 * own prepare posted (recorded in own). */
static void prepare(walker_t *w, int i)
{
	const planrt_stage_t *s = w->stage;
	const planrt_action_t *a = &s->actions[i];
	int nr = s->nreqs;
	planrt_request_t *set = w->reqs + (size_t)a->slot * (size_t)nr;
	unsigned char *own = w->own + (size_t)a->slot * (size_t)nr;
	w->deferred = 0;
	if (a->kind == PLANRT_FORWARD) {
		w->deferred = i > 0 && s->actions[i - 1].slot == a->slot;
		if (!w->deferred)
			drain(w, set, nr, NULL);
		for (int r = 0; r < nr; r++)
			own[r] = set[r] != NULL; /* marks what prepare adds, below */
	}
	const planrt_phase_fn *fns = a->kind == PLANRT_FORWARD ? s->prepare_forward : s->prepare_backward;
	if (fns && fns[a->chunk]) {
		point_at(w, a);
		trace_action("prepare ", a);
		fns[a->chunk](w->ctx);
		planrt_trace_end_(NULL);
	}
	if (a->kind == PLANRT_FORWARD)
		for (int r = 0; r < nr; r++)
			own[r] = !own[r] && set[r] != NULL;
}

/* outside actions: no micro-batch, no slot */
static void clear_action(planrt_ctx_t *ctx)
{
	ctx->micro = 0;
	ctx->chunk = 0;
	ctx->slot = NULL;
	ctx->slot_index = 0;
	ctx->inbox = NULL;
	ctx->reqs = NULL;
}

static void walk(walker_t *w)
{
	const planrt_stage_t *s = w->stage;
	w->deferred = 0;
	if (s->nactions > 0)
		prepare(w, 0);
	for (int i = 0; i < s->nactions; i++) {
		const planrt_action_t *a = &s->actions[i];
		if (a->kind == PLANRT_FORWARD && w->deferred) {
			size_t at = (size_t)a->slot * (size_t)s->nreqs;
			drain(w, w->reqs + at, s->nreqs, w->own + at);
		}
		if (i + 1 < s->nactions)
			prepare(w, i + 1);
		point_at(w, a);
		planrt_where_(w->ctx->step, a->kind == PLANRT_FORWARD ? "forward" : "backward", (int)a->micro, a->chunk);
		trace_action("", a);
		(a->kind == PLANRT_FORWARD ? s->forward : s->backward)[a->chunk](w->ctx);
		planrt_trace_end_(NULL);
	}
	drain(w, w->reqs, s->nslots * s->nreqs, NULL);
	clear_action(w->ctx);
}

/* ------------------------------------------------------------------ planrt_main */

static size_t arena_high_water(const unsigned char *arena, size_t bytes)
{
	size_t high = bytes / 8;
	while (high > 0) {
		uint64_t w;
		memcpy(&w, arena + 8 * (high - 1), 8);
		if (w != CANARY)
			break;
		high--;
	}
	return 8 * high;
}

static void report_comm(int rank, const planrt_program_t *p)
{
	for (int k = 0; k < planrt_coll_kinds; k++)
		for (int gi = 0; gi < p->naxes + 2; gi++) {
			int group = gi < p->naxes ? gi : gi == p->naxes ? PLANRT_GROUP_PAIR : PLANRT_GROUP_WORLD;
			uint64_t calls = planrt_calls_by((planrt_coll_t)k, group);
			if (!calls)
				continue;
			const char *name = group == PLANRT_GROUP_PAIR	 ? "pair"
					   : group == PLANRT_GROUP_WORLD ? "world"
					   : p->axis_names && p->axis_names[group] ? p->axis_names[group]
										    : "?";
			fprintf(stderr, "planrt: rank %d: comm kind=%s group=%s calls=%llu bytes=%llu\n", rank,
				planrt_coll_name((planrt_coll_t)k), name, (unsigned long long)calls,
				(unsigned long long)planrt_bytes_sent_by((planrt_coll_t)k, group));
		}
}

/* PLANRT_STRAGGLER=RANK:MS or random:MS: the delay (seconds) this rank sleeps at the start of
 * step; random picks one rank per step from (seed, step). */
static double straggler_delay(const char *setting, int rank, int world, uint64_t seed, int64_t step)
{
	if (!setting || !*setting)
		return 0;
	const char *colon = strchr(setting, ':');
	char *end = NULL;
	double ms = colon ? strtod(colon + 1, &end) : -1;
	int random = colon && !strncmp(setting, "random", (size_t)(colon - setting)) && colon - setting == 6;
	long who = random ? -1 : colon ? strtol(setting, &end, 10) : -1;
	if (!colon || ms < 0 || (!random && (who < 0 || who >= world || end != colon)))
		planrt_fatal("PLANRT_STRAGGLER='%s': expected RANK:MS (a rank below %d) or random:MS", setting, world);
	if (random) {
		uint32_t r[4];
		planrt_philox(seed, 0x5374726167676c65ull /* "Straggle" */, (uint64_t)step, r);
		who = (long)(r[0] % (uint32_t)world);
	}
	return who == rank ? ms * 1e-3 : 0;
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	while (s > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* The async master's versions for the log: "versions":[...],"staleness":max. */
static void log_versions(const planrt_stage_t *stage)
{
	if (!stage->versions || !*stage->versions || stage->nversions < 1)
		return;
	const double *v = *stage->versions;
	char text[1024];
	int at = snprintf(text, sizeof text, "\"versions\":[");
	double worst = 0;
	for (int i = 0; i < stage->nversions && at < (int)sizeof text - 64; i++) {
		at += snprintf(text + at, sizeof text - (size_t)at, "%s%.0f", i ? "," : "", v[i]);
		if (v[0] - v[i] > worst)
			worst = v[0] - v[i];
	}
	snprintf(text + at, sizeof text - (size_t)at, "],\"staleness\":%.0f", worst);
	planrt_log_fields(text);
}

/* ------------------------------------------------------------------ the run's files */

/* the temporary file this rank is writing, removed if a signal ends the process */
static char pending_tmp[4096];

void planrt_pending_tmp_(const char *path)
{
	snprintf(pending_tmp, sizeof pending_tmp, "%s", path ? path : "");
}

static void on_signal(void)
{
	if (pending_tmp[0])
		unlink(pending_tmp);
}

typedef struct run_file {
	const char *what, *path;
	int output;
	int exists;
	struct stat st;
	char canon[4096]; /* the directory's real path and the name: equal for two paths of one file */
} run_file_t;

static void canonical(run_file_t *f)
{
	char *a = strdup(f->path), *b = strdup(f->path), real[PATH_MAX];
	if (!a || !b)
		planrt_fatal("out of memory");
	int n = realpath(dirname(a), real) ? snprintf(f->canon, sizeof f->canon, "%.2048s/%.1024s", real, basename(b))
					   : snprintf(f->canon, sizeof f->canon, "%.3000s", f->path);
	(void)n;
	free(a);
	free(b);
}

/* Before any work (rank 0): an input that is not a regular file (a FIFO would block), an output
 * that is an input or another output (the same file, by inode or by path), each an error; then
 * every output is probed. Nothing has been written yet. */
static void check_run_files(const options_t *o)
{
	const char *what[] = {"--data", "--init", "--resume", "the program", "--save", "--log", "--trace", "--save-every"};
	const char *path[] = {o->data, o->init, o->resume, "/proc/self/exe", o->save, o->log, o->trace, o->save_every_dir};
	enum { N = sizeof what / sizeof what[0], FIRST_OUTPUT = 4 };
	run_file_t f[N];
	memset(f, 0, sizeof f);
	int n = N;
	for (int i = 0; i < n; i++) {
		f[i].what = what[i];
		f[i].path = path[i];
		f[i].output = i >= FIRST_OUTPUT;
	}
	for (int i = 0; i < n; i++) {
		if (!f[i].path)
			continue;
		f[i].exists = stat(f[i].path, &f[i].st) == 0;
		canonical(&f[i]);
		if (f[i].exists && !f[i].output && i < 2 && !S_ISREG(f[i].st.st_mode) && !S_ISDIR(f[i].st.st_mode))
			planrt_fatal("%s '%s' is not a regular file (a FIFO, socket or device, which would block or never end); "
				     "pass a file",
				     f[i].what, f[i].path);
	}
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			if (!f[i].path || !f[j].path || (!f[i].output && !f[j].output))
				continue;
			if (!strcmp(f[i].what, "--resume") && !strcmp(f[j].what, "--save-every"))
				continue; /* resuming from the directory the run keeps saving to */
			int same = f[i].exists && f[j].exists ? f[i].st.st_dev == f[j].st.st_dev && f[i].st.st_ino == f[j].st.st_ino
							     : !strcmp(f[i].canon, f[j].canon);
			if (same)
				planrt_fatal("%s '%s' and %s '%s' are the same file: writing %s would destroy %s; pass another path",
					     f[i].what, f[i].path, f[j].what, f[j].path, f[j].what,
					     f[i].output ? "the other output" : "the input");
		}
	if (o->save)
		probe_writable("--save", o->save);
	if (o->trace)
		probe_writable("--trace", o->trace);
	if (o->save_every_dir) {
		struct stat st;
		if (stat(o->save_every_dir, &st) == 0 && !S_ISDIR(st.st_mode))
			planrt_fatal("--save-every '%s' is not a directory; pass a directory for the checkpoints", o->save_every_dir);
		if (stat(o->save_every_dir, &st) != 0 && mkdir(o->save_every_dir, 0777) != 0)
			planrt_fatal("cannot create the --save-every directory '%s': %s; create its parent first",
				     o->save_every_dir, strerror(errno));
		size_t len = strlen(o->save_every_dir) + 16;
		char *probe = malloc(len);
		if (!probe)
			planrt_fatal("out of memory");
		snprintf(probe, len, "%s/probe", o->save_every_dir);
		probe_writable("--save-every", probe);
		free(probe);
	}
}

/* whether pid is a live process of this host (a zombie, a killed process nobody reaped, is not) */
static int pid_alive(long pid)
{
	if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
		return 0;
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *state = strrchr(buf, ')'); /* "pid (comm) S ..." */
	return !(state && state[1] == ' ' && state[2] == 'Z');
}

/* A temporary file planrt names PATH.tmp.PID (or .tmp.probe.PID.K) is stale when no process of
 * this host has that pid: a save that was killed. Rank 0 removes them beside --save at start. */
static void remove_stale_temps(const char *target)
{
	char *a = strdup(target), *b = strdup(target);
	if (!a || !b)
		planrt_fatal("out of memory");
	const char *dir = dirname(a), *base = basename(b);
	size_t bl = strlen(base);
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".tmp.", 5))
			continue;
		const char *t = e->d_name + bl + 5;
		if (!strncmp(t, "probe.", 6))
			t += 6;
		char *end;
		long pid = strtol(t, &end, 10);
		if (end == t || (*end && *end != '.') || pid_alive(pid))
			continue;
		size_t n = strlen(dir) + strlen(e->d_name) + 2;
		char *p = malloc(n);
		if (p) {
			snprintf(p, n, "%s/%s", dir, e->d_name);
			if (unlink(p) == 0)
				fprintf(stderr, "planrt: note: removed '%s', the temporary file of a save that did not finish\n", p);
			free(p);
		}
	}
	if (d)
		closedir(d);
	free(a);
	free(b);
}

/* ------------------------------------------------------------------ checkpoints, resume, evaluation */

/* The run's position for a checkpoint's manifest (planrt_ckpt.h). */
static json_t *run_info(const planrt_program_t *p, const options_t *o, int64_t step, uint64_t seed, planrt_data_t data,
			int64_t train_tokens)
{
	char s[32], key[32];
	snprintf(s, sizeof s, "%llu", (unsigned long long)seed);
	snprintf(key, sizeof key, "%llu", (unsigned long long)(seed * 0x9E3779B97F4A7C15ull + (uint64_t)step));
	json_t *mesh = json_array();
	for (int a = 0; a < p->naxes; a++)
		json_array_append_new(mesh, json_pack("[s, i]", p->axis_names[a], p->axis_sizes[a]));
	json_t *run = json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:{s:s, s:s, s:s}, s:{s:s, s:I, s:I, s:I, s:I, s:I}}",
				"step", (json_int_t)step, "plan", p->plan ? p->plan : "?", "model", p->model ? p->model : "?",
				"source", p->source ? p->source : "?", "fingerprint", p->fingerprint ? p->fingerprint : "?",
				"sync", p->sync ? p->sync : "strict", "world", p->world, "mesh", mesh, "rng", "seed", s,
				"generator", "philox4x32-10: init (seed, name, element), data (seed, step, sample)",
				"next_dropout_key", key, "data", "path", o->data, "tokens", (json_int_t)planrt_data_tokens(data),
				"train_tokens", (json_int_t)train_tokens, "next_step", (json_int_t)step, "samples_per_step",
				(json_int_t)p->batch, "sequence", (json_int_t)p->seq);
	if (!run)
		planrt_fatal("out of memory describing a checkpoint");
	return run;
}

/* --resume: the checkpoint's run against this one; sets the seed and returns the first step. */
static int64_t check_resume(planrt_ckpt_t *c, const planrt_program_t *p, const options_t *o, planrt_data_t data,
			    int64_t train_tokens, uint64_t *seed, int rank)
{
	json_t *m = planrt_ckpt_manifest(c);
	const char *model = json_string_value(json_object_get(m, "model")) ?: "?";
	const char *plan = json_string_value(json_object_get(m, "plan")) ?: "?";
	const char *sync = json_string_value(json_object_get(m, "sync")) ?: "strict";
	json_t *d = json_object_get(m, "data");
	int64_t step = json_integer_value(json_object_get(m, "step"));
	unsigned long long s = strtoull(json_string_value(json_object_get(json_object_get(m, "rng"), "seed")) ?: "0", NULL, 10);
	if (strcmp(model, p->model ? p->model : "?"))
		planrt_fatal("--resume: the checkpoint is of model '%s' (plan %s), this program trains model '%s'; resume it "
			     "with a plan of '%s'",
			     model, plan, p->model, model);
	if (json_integer_value(json_object_get(d, "tokens")) != planrt_data_tokens(data))
		planrt_fatal("--resume: the checkpoint was trained on data of %lld tokens ('%s'), --data '%s' has %lld; "
			     "resume on the same data",
			     (long long)json_integer_value(json_object_get(d, "tokens")),
			     json_string_value(json_object_get(d, "path")) ?: "?", o->data, (long long)planrt_data_tokens(data));
	if (json_integer_value(json_object_get(d, "train_tokens")) != train_tokens)
		planrt_fatal("--resume: the checkpoint's run trained on the first %lld tokens, this one on %lld (--eval-every "
			     "holds out the last tenth); resume with the same --eval-every setting",
			     (long long)json_integer_value(json_object_get(d, "train_tokens")), (long long)train_tokens);
	if (o->seed_given && o->seed != s)
		planrt_fatal("--resume: the checkpoint's run has --seed %llu, this one %llu; drop --seed (a resumed run "
			     "keeps its seed)",
			     s, (unsigned long long)o->seed);
	if (step > o->steps)
		planrt_fatal("--resume: the checkpoint is of step %lld, past --steps %lld; pass --steps above it",
			     (long long)step, (long long)o->steps);
	int exact = planrt_ckpt_exact(c);
	if (!exact && !strcmp(sync, "local_sgd"))
		planrt_fatal("--resume: the checkpoint of plan %s (sync local_sgd) holds each replica's own state, which "
			     "only the same plan can read; resume it with plan %s",
			     plan, plan);
	const char *from = json_string_value(json_object_get(json_object_get(m, "resharded_from"), "plan"));
	if (rank == 0 && !exact && from && !strcmp(plan, p->plan ? p->plan : "?"))
		fprintf(stderr, "planrt: note: the checkpoint was resharded offline from plan %s into this plan %s; the run "
				"continues as resuming plan %s's checkpoint here would, equal up to float rounding to plan %s "
				"continuing\n",
			from, plan, from, from);
	else if (rank == 0 && !exact)
		fprintf(stderr, "planrt: note: resharding the checkpoint of plan %s (%s) into plan %s; the run continues "
				"equal up to float rounding, not bit for bit\n",
			plan, json_string_value(json_object_get(m, "fingerprint")) ?: "?", p->plan);
	if (rank == 0 && !exact) {
		if (json_array_size(json_object_get(m, "local")))
			fprintf(stderr, "planrt: note: the rank-local state of plan %s (gradient compression's error feedback) "
					"restarts from zero under plan %s\n",
				plan, p->plan);
	}
	*seed = s;
	return step;
}

/* --eval-every: the mean loss of batches held-out batches, each run through the forward actions
 * of the schedule (no backward: dropout off, gradient receives not posted) between eval_begin and
 * eval_end, which leaves its loss reduced on every rank. Touches no state the next step reads. */
static double evaluate(walker_t *w, const planrt_stage_t *stage, planrt_ctx_t *ctx, int64_t batches, int64_t step)
{
	double sum = 0;
	planrt_evaluating_ = 1;
	forward_only_chunks = stage->nchunks > 0 ? stage->nchunks : 1;
	for (int64_t b = 0; b < batches; b++) {
		ctx->eval_batch = b;
		clear_action(ctx);
		planrt_where_(step, "evaluation", -1, -1);
		trace_phase("evaluation batch", step);
		if (stage->eval_begin)
			stage->eval_begin(ctx);
		walk(w);
		if (stage->eval_end)
			stage->eval_end(ctx);
		planrt_trace_end_(NULL);
		sum += stage->eval_loss && *stage->eval_loss ? **stage->eval_loss : NAN;
	}
	ctx->eval_batch = -1;
	planrt_evaluating_ = 0;
	forward_only_chunks = 0;
	clear_action(ctx);
	return sum / (double)batches;
}

/* --trace: every rank's events joined into the file, each rank named by its mesh coordinates */
static void trace_close(const planrt_program_t *p)
{
	char name[256];
	int len = snprintf(name, sizeof name, "rank %d", planrt_world_rank_());
	for (int a = 0; a < p->naxes && len > 0 && (size_t)len < sizeof name; a++)
		len += snprintf(name + len, sizeof name - (size_t)len, "%s%s %d", a ? ", " : " (",
				p->axis_names && p->axis_names[a] ? p->axis_names[a] : "?", planrt_mesh_coord(a));
	if (p->naxes > 0 && len > 0 && (size_t)len < sizeof name)
		snprintf(name + len, sizeof name - (size_t)len, ")");
	planrt_trace_close_(name);
}

/* The stage with its forward actions only (evaluation), built once. */
static planrt_stage_t forward_stage(const planrt_stage_t *s)
{
	planrt_stage_t f = *s;
	planrt_action_t *acts = calloc((size_t)(s->nactions ? s->nactions : 1), sizeof *acts);
	if (!acts)
		planrt_fatal("out of memory");
	int n = 0;
	for (int i = 0; i < s->nactions; i++)
		if (s->actions[i].kind == PLANRT_FORWARD)
			acts[n++] = s->actions[i];
	f.actions = acts;
	f.nactions = n;
	return f;
}

int planrt_main(int argc, char **argv, const planrt_program_t *program)
{
	options_t opt;
	parse_options(argc, argv, &opt);
	const char *prog_name = argc > 0 && argv[0] ? argv[0] : "prog";
	if (opt.help) {
		if (launcher_rank0())
			print_help(prog_name, program);
		return 0;
	}

	/* --reshard: one process, no MPI (the ranks are played in turn) */
	if (opt.reshard_from && opt.error[0])
		planrt_fatal("%s; usage: %s --reshard CHECKPOINT OUT_DIR", opt.error, prog_name);
	if (opt.reshard_from) {
		prog = program;
		int rc = planrt_ckpt_reshard(program, opt.reshard_from, opt.reshard_to);
		prog = NULL;
		return rc;
	}

	/* 1. the world and the mesh */
	int rank, world;
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (planrt_cpu_select() != planrt_success) /* the instruction-set level: this rank's CPU, or PLANRT_ISA */
		planrt_fatal("%s", planrt_last_error());
	if (world != program->world)
		planrt_fatal("this program was built for %d ranks (plan %s) but runs on %d; launch it with mpirun -np %d",
			     program->world, program->plan, world, program->world);
	PLANRT_CHECK(planrt_mesh_init(program->naxes, program->axis_sizes, program->axis_names));
	planrt_device_start();
	prog = program;

	/* 2. options, then the paths the run reads and writes, before any work */
	if (!opt.error[0] && program->loss_scale == 0 && (opt.max_skips_given || opt.loss_scale_init > 0))
		set_error(&opt, "%s applies to fp16 plans with loss scaling (plan %s has none); leave it out",
			  opt.max_skips_given ? "--max-skips" : "--loss-scale-init", program->plan);
	if (opt.error[0])
		planrt_fatal("%s; usage: %s %s (--help explains)", opt.error, prog_name, usage_line);
	int async = program->nroles > 1;
	if (async && (opt.save_every_dir || opt.resume))
		planrt_fatal("sync async plans cannot checkpoint: their workers' gradients and parameter versions are in "
			     "flight at every step boundary; use --save for the final weights, or sync strict / local_sgd");
	if (async && opt.eval_every)
		planrt_fatal("--eval-every: sync async plans do not evaluate (their replicas hold parameter versions of "
			     "different ages); evaluate the saved weights with a strict plan");
	planrt_on_signal_(on_signal);
	int ckpt_lock = -1;
	if (rank == 0) {
		check_run_files(&opt);
		if (opt.save)
			remove_stale_temps(opt.save);
		if (opt.save_every_dir) {
			char err[1024];
			if ((ckpt_lock = planrt_ckpt_lock(opt.save_every_dir, err, sizeof err)) < 0)
				planrt_fatal("%s", err);
			planrt_ckpt_clean(opt.save_every_dir, (int)opt.keep);
		}
	}
	if (opt.map && !opt.init && !opt.save)
		planrt_fatal("--map applies to --init and --save; pass one of them, or drop --map");
	if (opt.map)
		PLANRT_CHECK(planrt_namemap_open(opt.map, program, &name_map));
	if (opt.log && rank == 0)
		PLANRT_CHECK(planrt_log_open_(opt.log, opt.resume != NULL));
	if (opt.trace) /* every rank (the origin of its clock is agreed on) */
		planrt_trace_open_(opt.trace);

	/* 3. this rank's stage and role, its state and its arena */
	int stage_index = program->pipe_axis >= 0 ? planrt_mesh_coord(program->pipe_axis) : 0;
	int nroles = program->nroles > 1 ? program->nroles : 1;
	int role = nroles > 1 && planrt_mesh_coord(program->role_axis) != 0 ? 1 : 0; /* 0: the async master */
	check_program(program, stage_index * nroles + role);
	const planrt_stage_t *stage = &program->stages[stage_index * nroles + role];
	size_t kind_bytes[planrt_state_kinds] = {0}, state_bytes = 0;
	for (int i = 0; i < stage->nstate; i++) {
		const planrt_state_buf_t *b = &stage->state[i];
		void *ptr = NULL;
		if (planrt_state_alloc(b, &ptr) != planrt_success)
			planrt_fatal("cannot allocate %zu bytes for '%s' (%s); choose a plan with less memory per rank (planc "
				     "explain shows it)",
				     b->bytes, b->name, planrt_last_error());
		*b->ptr = ptr;
		kind_bytes[b->kind] += b->bytes;
		state_bytes += b->bytes;
	}
	void *arena_base;
	PLANRT_CHECK(planrt_arena_create(stage->arena_bytes, &arena_base));
	unsigned char *arena = arena_base;
	/* a canary in every arena word: the highest word changed after the run is the arena's
	 * measured high-water mark */
	planrt_arena_fill64(CANARY);
	size_t nreq = (size_t)stage->nslots * (size_t)stage->nreqs;
	planrt_request_t *reqs = calloc(nreq ? nreq : 1, sizeof *reqs);
	unsigned char *own = calloc(nreq ? nreq : 1, 1);
	if (!reqs || !own)
		planrt_fatal("out of memory for %zu requests", nreq);

	/* 4. data, initial weights (or the checkpoint resumed) */
	planrt_ctx_t ctx = {.seed = opt.seed, .arena = arena, .steps = opt.steps, .eval_batch = -1, .loss_scale = 1.0};
	PLANRT_CHECK(planrt_data_open(opt.data, program->vocab, program->seq, &ctx.data));
	int64_t train_tokens = planrt_data_tokens(ctx.data), first_step = 0;
	if (opt.eval_every)
		PLANRT_CHECK(planrt_data_hold_out_(ctx.data, &train_tokens));
	struct stat resume_st, every_st;
	int fresh_ok = opt.resume && opt.save_every_dir && stat(opt.resume, &resume_st) == 0 &&
		       stat(opt.save_every_dir, &every_st) == 0 && resume_st.st_dev == every_st.st_dev &&
		       resume_st.st_ino == every_st.st_ino; /* --resume DIR --save-every N DIR: a first run too */
	planrt_ckpt_t *resume = opt.resume ? planrt_ckpt_resume_open(opt.resume, program, fresh_ok) : NULL;
	/* fp16 loss scaling's state as the checkpoint left it (scale <= 0: none saved) */
	double resumed_scale = 0;
	int64_t resumed_good = 0, resumed_in_row = 0;
	if (resume) {
		first_step = check_resume(resume, program, &opt, ctx.data, train_tokens, &ctx.seed, rank);
		json_t *ls = json_object_get(planrt_ckpt_manifest(resume), "loss_scaling");
		if (ls && program->loss_scale != 0) {
			resumed_scale = json_number_value(json_object_get(ls, "scale"));
			resumed_good = json_integer_value(json_object_get(ls, "good_steps"));
			resumed_in_row = json_integer_value(json_object_get(ls, "skips_in_row"));
			planrt_steps_skipped_ = json_integer_value(json_object_get(ls, "skipped"));
		}
	}
	uint64_t seed = ctx.seed;
	if (opt.init)
		PLANRT_CHECK(planrt_st_open(opt.init, &ctx.init_file));
	if (name_map && ctx.init_file)
		PLANRT_CHECK(planrt_namemap_check_file(name_map, ctx.init_file, opt.init));
	planrt_where_(-1, "init", -1, -1);
	trace_phase("init", -1);
	if (stage->init)
		stage->init(&ctx);
	planrt_trace_end_(NULL);
	planrt_st_close(ctx.init_file);
	ctx.init_file = NULL;
	if (resume) {
		planrt_where_(-1, "resume", -1, -1);
		ctx.ckpt = resume;
		trace_phase("resume", first_step);
		if (stage->resume)
			stage->resume(&ctx);
		planrt_trace_end_(NULL);
		ctx.ckpt = NULL;
		planrt_ckpt_close(resume);
		if (rank == 0)
			fprintf(stderr, "planrt: resumed at step %lld from '%s'\n", (long long)first_step, opt.resume);
	}

	/* 5. the steps */
	walker_t walker = {stage, &ctx, reqs, own, 0};
	int64_t tokens = program->batch * program->seq;
	double start = planrt_now(), timed_s = 0, timed_wait_s = 0, timed_update_s = 0;
	long long timed_steps = 0;
	/* local SGD logs a step's loss when its replicas average: rows wait here until then */
	int window = stage->loss_window > 1 ? stage->loss_window : 1;
	enum { ROW = 4 }; /* lr, gradient norm, step seconds, held-out loss (NaN: none) */
	double *pending = calloc((size_t)window * ROW, sizeof(double)), shown_loss = NAN;
	double *kept = calloc((size_t)window, sizeof(double)); /* the window's losses across an evaluation */
	if (!pending || !kept)
		planrt_fatal("out of memory for %d log rows", window);
	const char *straggler = getenv("PLANRT_STRAGGLER");
	planrt_stage_t fwd = opt.eval_every ? forward_stage(stage) : *stage;
	walker_t evaluator = {&fwd, &ctx, reqs, own, 0};
	int64_t saved_step = first_step, stopped = -1;
	int strict = !program->sync || !strcmp(program->sync, "strict");
	/* fp16 loss scaling (GradScaler's rule): a step whose gradients overflowed is skipped and a
	 * dynamic scale halves; after 2000 good steps in a row it doubles */
	int scaled = program->loss_scale != 0, dynamic = program->loss_scale < 0;
	double scale = opt.loss_scale_init > 0 ? opt.loss_scale_init : program->loss_scale > 0 ? program->loss_scale : 65536.0;
	int64_t good_steps = 0, skips_in_row = 0, skip_stopped = -1;
	if (resumed_scale > 0) { /* a resumed run goes on with its scale, as GradScaler's state_dict does */
		scale = resumed_scale;
		good_steps = resumed_good;
		skips_in_row = resumed_in_row;
	}
	enum { GROWTH_INTERVAL = 2000 };
	char cpu_members[128]; /* the first line of the log names rank 0's instruction-set level */
	planrt_cpu_log_members(cpu_members, sizeof cpu_members);
	planrt_log_fields(cpu_members);
	for (int64_t step = first_step; step < opt.steps; step++) {
		double t0 = planrt_now(), wait0 = ctx.wait_s;
		double step_scale = scaled ? scale : 1.0;
		ctx.loss_scale = step_scale;
		ctx.step_skipped = 0;
		sleep_s(straggler_delay(straggler, rank, world, seed, step));
		ctx.step = step;
		ctx.step_seed = seed * 0x9E3779B97F4A7C15ull + (uint64_t)step;
		clear_action(&ctx);
		planrt_where_(step, "step_begin", -1, -1);
		trace_phase("step", step);
		if (stage->step_begin)
			stage->step_begin(&ctx);
		double t_walk = planrt_now();
		walk(&walker);
		double t_end = planrt_now();
		planrt_where_(step, "update", -1, -1);
		if (planrt_tracing_)
			planrt_trace_begin_("update", "compute");
		if (stage->step_end)
			stage->step_end(&ctx);
		planrt_trace_end_(NULL);
		planrt_trace_end_(NULL); /* the step */
		double update_s = planrt_now() - t_end + (t_walk - t0);
		double norm = stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : NAN;
		double step_s = planrt_now() - t0;
		if (step > first_step || opt.steps == first_step + 1) {
			timed_s += step_s;
			timed_wait_s += ctx.wait_s - wait0;
			timed_update_s += update_s;
			timed_steps++;
		}
		/* a loss or gradient norm that is not finite: stop before anything is written from this
		 * state (the loss is known when the step's row is: local SGD knows it at averages) */
		int known = window == 1 || (step + 1) % window == 0 || step == opt.steps - 1;
		double loss_now = known && stage->loss && *stage->loss ? (*stage->loss)[step % window] : 0;
		double norm_now = stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : 0;
		int skipped = scaled && ctx.step_skipped; /* the same verdict on every rank: sumsq is all-reduced */
		if (skipped) {
			planrt_steps_skipped_++;
			good_steps = 0;
			if (dynamic)
				scale /= 2;
			if (++skips_in_row >= opt.max_skips) {
				skip_stopped = step;
				stopped = step;
			}
		} else if (scaled) {
			skips_in_row = 0;
			if (dynamic && ++good_steps == GROWTH_INTERVAL) {
				scale *= 2;
				good_steps = 0;
			}
		}
		if (!skipped && (!isfinite(loss_now) || !isfinite(norm_now))) {
			if (!strict) /* each replica has its own: this one's verdict ends the job */
				planrt_fatal("step %lld: the loss is %g and the gradient norm %g on this replica; training stopped "
					     "before writing anything from this state; lower the learning rate or clip the gradients",
					     (long long)step, loss_now, norm_now);
			stopped = step; /* every rank sees the same reduced values and stops here */
		}
		double eval = NAN;
		if (stopped < 0 && opt.eval_every && (step + 1) % opt.eval_every == 0) {
			/* the held-out forward passes compute their loss where the step's is: keep the
			 * step's (the log reads it below) */
			int nkept = stage->loss && *stage->loss ? window : 0;
			for (int i = 0; i < nkept; i++)
				kept[i] = (*stage->loss)[i];
			trace_phase("evaluation", step);
			eval = evaluate(&evaluator, stage, &ctx, opt.eval_batches, step);
			planrt_trace_end_(NULL);
			for (int i = 0; i < nkept; i++)
				(*stage->loss)[i] = kept[i];
		}
		if (rank == 0) {
			double *row = pending + (step % window) * ROW;
			row[0] = planrt_lr_at(program->lr, step, program->warmup, program->total_steps, program->min_lr);
			row[1] = norm;
			row[2] = step_s;
			row[3] = eval;
			if (known || stopped >= 0) {
				/* (a resumed run logs from where it resumed; the window's earlier rows were logged) */
				for (int64_t s = step - step % window > first_step ? step - step % window : first_step; s <= step; s++) {
					const double *r = pending + (s % window) * ROW;
					shown_loss = stage->loss && *stage->loss ? (*stage->loss)[s % window] : NAN;
					log_versions(stage);
					if (scaled) { /* fp16 runs are strict: the window is this one step */
						char f[96];
						snprintf(f, sizeof f, "\"loss_scale\":%.9g,\"skipped\":%s", step_scale,
							 skipped ? "true" : "false");
						planrt_log_fields(f);
					}
					if (!isnan(r[3])) {
						char f[64];
						snprintf(f, sizeof f, "\"eval_loss\":%.9g", r[3]);
						planrt_log_fields(f);
					}
					planrt_log_step(s, shown_loss, r[0], r[1], tokens, r[2] * 1e3);
				}
			}
			planrt_progress(step + 1, opt.steps, shown_loss, step_s > 0 ? (double)tokens / step_s : 0,
					planrt_now() - start);
			if (!isnan(eval))
				fprintf(stderr, "eval after step %lld: held-out loss %.4f (%lld batches)\n", (long long)step + 1, eval,
					(long long)opt.eval_batches);
		}
		if (stopped >= 0)
			break;
		if (opt.save_every_dir && ((step + 1) % opt.save_every == 0 || step == opt.steps - 1)) {
			clear_action(&ctx);
			json_t *run = run_info(program, &opt, step + 1, seed, ctx.data, train_tokens);
			if (scaled && json_object_set_new(run, "loss_scaling",
							  json_pack("{s:f, s:I, s:I, s:I}", "scale", scale, "good_steps",
								    (json_int_t)good_steps, "skips_in_row",
								    (json_int_t)skips_in_row, "skipped",
								    (json_int_t)planrt_steps_skipped_)))
				planrt_fatal("out of memory describing a checkpoint");
			trace_phase("checkpoint", step + 1);
			planrt_ckpt_save(&ctx, stage, opt.save_every_dir, step + 1, run, (int)opt.keep);
			planrt_trace_end_(NULL);
			json_decref(run);
			saved_step = step + 1;
		}
	}
	free(pending);
	free(kept);
	if (fwd.actions != stage->actions)
		free((void *)fwd.actions);
	if (skip_stopped >= 0 && rank == 0)
		fprintf(stderr,
			"planrt: rank 0: step %lld: %lld steps in a row skipped by loss scaling (--max-skips %lld): the "
			"gradients overflow at every scale tried, down to %g; training stopped: nothing is written from "
			"this state; lower the learning rate, clip the gradients or use bf16 precision\n",
			(long long)skip_stopped, (long long)skips_in_row, (long long)opt.max_skips, dynamic ? scale * 2 : scale);
	else if (stopped >= 0 && rank == 0)
		fprintf(stderr,
			"planrt: rank 0: step %lld: the loss is %g and the gradient norm %g; training stopped: nothing is written "
			"from this state (%s%s%s%s%s); lower the learning rate, clip the gradients (clip = 1.0) or resume from "
			"the last checkpoint\n",
			(long long)stopped, stage->loss && *stage->loss ? **stage->loss : NAN,
			stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : NAN,
			opt.save ? "--save '" : "no --save", opt.save ? opt.save : "", opt.save ? "' is left as it was" : "",
			opt.save_every_dir ? "; the checkpoints keep the last good state" : "",
			opt.save_every_dir && saved_step > 0 ? ", the newest of it" : "");
	(void)saved_step;

	/* 6. the checkpoint and the reports */
	clear_action(&ctx);
	planrt_where_(-1, "save", -1, -1);
	if (opt.save && stopped < 0)
		trace_phase("save", opt.steps);
	if (opt.save && stopped < 0 && !name_map) {
		save_checkpoint(&ctx, stage, opt.save, rank);
	} else if (opt.save && stopped < 0) {
		/* planc's names first, in a temporary file beside it that a later run's remove_stale_temps
		 * recognises (rank 0's pid); then rank 0 rewrites it under the map's names */
		planrt_comm_t ctl = planrt_control_comm_();
		int64_t id = (int64_t)getpid();
		PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
		size_t n = strlen(opt.save) + 48;
		char *tmp = malloc(n);
		if (!tmp)
			planrt_fatal("out of memory saving '%s'", opt.save);
		snprintf(tmp, n, "%s.tmp.%lld.planc-names", opt.save, (long long)id);
		save_checkpoint(&ctx, stage, tmp, rank);
		if (rank == 0) {
			planrt_result_t r = planrt_namemap_convert(name_map, tmp, opt.save);
			unlink(tmp);
			if (r != planrt_success)
				planrt_fatal("--save '%s' under the names of --map '%s': %s", opt.save, opt.map,
					     planrt_last_error());
		}
		int32_t sync = 0; /* the others pass this once rank 0 has written the file (or ended the job) */
		PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
		free(tmp);
	}
	if (opt.save && stopped < 0)
		planrt_trace_end_(NULL);
	planrt_namemap_close(name_map);
	name_map = NULL;
	if (opt.trace)
		trace_close(program);
	if (getenv("PLANRT_REPORT_MEMORY"))
		fprintf(stderr,
			"planrt: rank %d: memory arena_high_water=%zu arena_planned=%zu state=%zu peak_rss=%zu stage=%d "
			"param=%zu grad=%zu optim=%zu master=%zu buffer=%zu metric=%zu offload=%zu disk=%lld%s\n",
			rank, arena_high_water(planrt_arena_snapshot(), stage->arena_bytes), stage->arena_bytes, state_bytes,
			planrt_peak_rss_bytes(), stage_index, kind_bytes[planrt_state_param], kind_bytes[planrt_state_grad],
			kind_bytes[planrt_state_optim], kind_bytes[planrt_state_master], kind_bytes[planrt_state_buffer],
			kind_bytes[planrt_state_metric], kind_bytes[planrt_state_offload], (long long)planrt_offload_bytes(),
			planrt_device_report());
	if (getenv("PLANRT_REPORT_TIMING"))
		fprintf(stderr, "planrt: rank %d: timing stage=%d steps=%lld step_s=%.6f busy_s=%.6f wait_s=%.6f update_s=%.6f\n",
			rank, stage_index, timed_steps, timed_s, timed_s - timed_wait_s, timed_wait_s, timed_update_s);
	if (getenv("PLANRT_REPORT_COMM"))
		report_comm(rank, program);

	planrt_log_close();
	planrt_data_close(ctx.data);
	free(input_scratch);
	input_scratch = NULL;
	input_scratch_n = 0;
	free(reqs);
	free(own);
	planrt_arena_destroy();
	for (int i = 0; i < stage->nstate; i++) {
		planrt_state_free(&stage->state[i]);
		*stage->state[i].ptr = NULL;
	}
	prog = NULL;
	planrt_where_(-1, "finalize", -1, -1);
	PLANRT_CHECK(planrt_finalize());
	if (ckpt_lock >= 0)
		close(ckpt_lock);
	return stopped >= 0 ? 1 : 0;
}
