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

#include "planrt_program.h"
#include "planrt_kernels.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_DIMS = 8, NO_INBOX = 0xffff };
#define CANARY 0x5A17C0DE5A17C0DEull
#define DEFAULT_SEED 1234
#define CHECKSUM_PLACEHOLDER "\"planrt_checksum\":\"fnv1a64:0000000000000000\""

/* the running program, for the kernels (set by planrt_main) */
static const planrt_program_t *prog;

/* ------------------------------------------------------------------ options */

typedef struct options {
	int64_t steps; /* -1: not given */
	uint64_t seed;
	const char *data, *init, *save, *log;
	int help;
	char error[512]; /* the first usage error, reported after planrt_init */
} options_t;

static const char usage_line[] =
	"--steps K --data FILE [--init W.safetensors] [--save W.safetensors] [--log run.jsonl] [--seed S]";

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

/* Parses argv without failing: the first error is kept for after planrt_init, so that --help
 * anywhere is still answered before MPI starts. A value that looks like an option ("--x") is a
 * missing value. */
static void parse_options(int argc, char **argv, options_t *o)
{
	memset(o, 0, sizeof *o);
	o->steps = -1;
	o->seed = DEFAULT_SEED;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			o->help = 1;
			continue;
		}
		const char **text = !strcmp(a, "--data")   ? &o->data
				    : !strcmp(a, "--init") ? &o->init
				    : !strcmp(a, "--save") ? &o->save
				    : !strcmp(a, "--log")  ? &o->log
							   : NULL;
		int numeric = !strcmp(a, "--steps") || !strcmp(a, "--seed");
		if (!text && !numeric) {
			set_error(o, "unknown option %s", a);
			continue;
		}
		if (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2) || !strcmp(argv[i + 1], "-h")) {
			set_error(o, "missing value after %s", a);
			continue;
		}
		const char *v = argv[++i];
		if (text) {
			*text = v;
		} else if (!strcmp(a, "--steps")) {
			errno = 0;
			long long k = all_digits(v) ? strtoll(v, NULL, 10) : -1;
			if (k < 0 || errno == ERANGE)
				set_error(o, "--steps needs a non-negative integer, not %s", v);
			else
				o->steps = k;
		} else {
			errno = 0;
			unsigned long long s = all_digits(v) ? strtoull(v, NULL, 10) : 0;
			if (!all_digits(v) || errno == ERANGE)
				set_error(o, "--seed needs an unsigned integer (0 to 18446744073709551615), not %s", v);
			else
				o->seed = s;
		}
	}
	if (!o->help && !o->error[0] && (o->steps < 0 || !o->data))
		set_error(o, "--steps and --data are required");
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
	printf("  step: %lld samples of %lld tokens (vocabulary %lld)\n\n", (long long)p->batch, (long long)p->seq,
	       (long long)p->vocab);
	printf("options:\n"
	       "  --steps K             optimizer steps to train (required; 0 initialises, loads and saves)\n"
	       "  --data FILE           training tokens: a text file (bytes) or a nanoGPT uint16 .bin file "
	       "(required)\n"
	       "  --init W.safetensors  initial weights (default: drawn from the seed)\n"
	       "  --save W.safetensors  write the trained weights there (temporary file, fsync, rename)\n"
	       "  --log run.jsonl       rank 0 writes one JSON line of metrics per step\n"
	       "  --seed S              seed of initialisation, data order and dropout (default %d)\n"
	       "  --help, -h            this text\n"
	       "environment: PLANRT_WATCHDOG=SECONDS (stall limit, 0 off), PLANRT_REPORT_MEMORY, "
	       "PLANRT_REPORT_TIMING, PLANRT_REPORT_COMM (one stderr line per rank),\n"
	       "  PLANRT_STRAGGLER=RANK:MS or random:MS (that rank, or one drawn per step, sleeps MS ms at each "
	       "step's start)\n",
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
		if (ctx->init_file && !(p->init_kind >= 4 && p->init_kind <= 6)) /* computed buffers are never read */
			PLANRT_CHECK(planrt_st_read_block(ctx->init_file, p->name, p->rank, p->gdims, p->ldims, offs, block));
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
	if (MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
		planrt_fatal("MPI_Bcast failed naming the checkpoint's temporary file");
	snprintf(tmp, tlen, "%s.tmp.%ld", path, pid);
	sv.fd = open(tmp, O_WRONLY);
	if (sv.fd < 0)
		save_fail(&sv, "open", errno);
	ctx->save_file = &sv;
	if (sv.fd >= 0 && stage->save)
		stage->save(ctx);
	ctx->save_file = NULL;
	if (sv.fd >= 0 && close(sv.fd) != 0)
		save_fail(&sv, "close", errno);
	/* agree: the lowest failing rank, if any, reports after rank 0 removed the temporary file;
	 * the others wait in a barrier its MPI_Abort ends */
	int mine[2] = {sv.error[0] ? 1 : 0, rank}, worst[2];
	if (MPI_Allreduce(mine, worst, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD) != MPI_SUCCESS)
		planrt_fatal("MPI_Allreduce failed agreeing on the checkpoint '%s'", path);
	if (worst[0]) {
		if (rank == 0)
			unlink(tmp);
		MPI_Barrier(MPI_COMM_WORLD);
		if (rank == worst[1])
			planrt_fatal("%s", sv.error);
		MPI_Barrier(MPI_COMM_WORLD);
		planrt_fatal("checkpoint '%s' not written (rank %d failed)", path, worst[1]);
	}
	if (rank == 0 && finish_checkpoint(&sv, &L) != 0) {
		unlink(tmp);
		planrt_fatal("%s", sv.error);
	}
	/* the others pass this barrier once rank 0 has renamed the file (or ended the job) */
	MPI_Barrier(MPI_COMM_WORLD);
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
	PLANRT_CHECK(planrt_send_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline send"), req));
}

void planrt_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req)
{
	PLANRT_CHECK(planrt_recv_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline receive"), req));
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
		fns[a->chunk](w->ctx);
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
		(a->kind == PLANRT_FORWARD ? s->forward : s->backward)[a->chunk](w->ctx);
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

	/* 1. the world and the mesh */
	int rank, world;
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world != program->world)
		planrt_fatal("this program was built for %d ranks (plan %s) but runs on %d; launch it with mpirun -np %d",
			     program->world, program->plan, world, program->world);
	PLANRT_CHECK(planrt_mesh_init(program->naxes, program->axis_sizes, program->axis_names));
	prog = program;

	/* 2. options, then the paths the run will write */
	if (opt.error[0])
		planrt_fatal("%s; usage: %s %s (--help explains)", opt.error, prog_name, usage_line);
	if (opt.save && rank == 0)
		probe_writable("--save", opt.save);
	if (opt.log && rank == 0)
		PLANRT_CHECK(planrt_log_open(opt.log));

	/* 3. this rank's stage and role, its state and its arena */
	int stage_index = program->pipe_axis >= 0 ? planrt_mesh_coord(program->pipe_axis) : 0;
	int nroles = program->nroles > 1 ? program->nroles : 1;
	int role = nroles > 1 && planrt_mesh_coord(program->role_axis) != 0 ? 1 : 0; /* 0: the async master */
	check_program(program, stage_index * nroles + role);
	const planrt_stage_t *stage = &program->stages[stage_index * nroles + role];
	size_t kind_bytes[planrt_state_kinds] = {0}, state_bytes = 0;
	for (int i = 0; i < stage->nstate; i++) {
		const planrt_state_buf_t *b = &stage->state[i];
		size_t bytes = b->bytes ? b->bytes : 64;
		void *ptr = NULL;
		if (posix_memalign(&ptr, 64, bytes))
			planrt_fatal("cannot allocate %zu bytes for '%s'; choose a plan with less memory per rank (planc "
				     "explain shows it)",
				     b->bytes, b->name);
		memset(ptr, 0, bytes);
		*b->ptr = ptr;
		kind_bytes[b->kind] += b->bytes;
		state_bytes += b->bytes;
	}
	void *arena_base;
	PLANRT_CHECK(planrt_arena_create(stage->arena_bytes, &arena_base));
	unsigned char *arena = arena_base;
	/* a canary in every arena word: the highest word changed after the run is the arena's
	 * measured high-water mark */
	for (size_t w = 0; w < stage->arena_bytes / 8; w++)
		memcpy(arena + 8 * w, &(uint64_t){CANARY}, 8);
	size_t nreq = (size_t)stage->nslots * (size_t)stage->nreqs;
	planrt_request_t *reqs = calloc(nreq ? nreq : 1, sizeof *reqs);
	unsigned char *own = calloc(nreq ? nreq : 1, 1);
	if (!reqs || !own)
		planrt_fatal("out of memory for %zu requests", nreq);

	/* 4. data, initial weights */
	planrt_ctx_t ctx = {.seed = opt.seed, .arena = arena, .steps = opt.steps};
	PLANRT_CHECK(planrt_data_open(opt.data, program->vocab, program->seq, &ctx.data));
	if (opt.init)
		PLANRT_CHECK(planrt_st_open(opt.init, &ctx.init_file));
	if (stage->init)
		stage->init(&ctx);
	planrt_st_close(ctx.init_file);
	ctx.init_file = NULL;

	/* 5. the steps */
	walker_t walker = {stage, &ctx, reqs, own, 0};
	int64_t tokens = program->batch * program->seq;
	double start = planrt_now(), timed_s = 0, timed_wait_s = 0, timed_update_s = 0;
	long long timed_steps = 0;
	/* local SGD logs a step's loss when its replicas average: rows wait here until then */
	int window = stage->loss_window > 1 ? stage->loss_window : 1;
	double *pending = calloc((size_t)window * 3, sizeof(double)), shown_loss = NAN;
	if (!pending)
		planrt_fatal("out of memory for %d log rows", window);
	const char *straggler = getenv("PLANRT_STRAGGLER");
	for (int64_t step = 0; step < opt.steps; step++) {
		double t0 = planrt_now(), wait0 = ctx.wait_s;
		sleep_s(straggler_delay(straggler, rank, world, opt.seed, step));
		ctx.step = step;
		ctx.step_seed = opt.seed * 0x9E3779B97F4A7C15ull + (uint64_t)step;
		clear_action(&ctx);
		if (stage->step_begin)
			stage->step_begin(&ctx);
		double t_walk = planrt_now();
		walk(&walker);
		double t_end = planrt_now();
		if (stage->step_end)
			stage->step_end(&ctx);
		double update_s = planrt_now() - t_end + (t_walk - t0);
		double norm = stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : NAN;
		double step_s = planrt_now() - t0;
		if (step > 0 || opt.steps == 1) {
			timed_s += step_s;
			timed_wait_s += ctx.wait_s - wait0;
			timed_update_s += update_s;
			timed_steps++;
		}
		if (rank != 0)
			continue;
		double *row = pending + (step % window) * 3;
		row[0] = planrt_lr_at(program->lr, step, program->warmup, program->total_steps, program->min_lr);
		row[1] = norm;
		row[2] = step_s;
		if (window == 1 || (step + 1) % window == 0 || step == opt.steps - 1) {
			for (int64_t s = step - step % window; s <= step; s++) {
				const double *r = pending + (s % window) * 3;
				shown_loss = stage->loss && *stage->loss ? (*stage->loss)[s % window] : NAN;
				log_versions(stage);
				planrt_log_step(s, shown_loss, r[0], r[1], tokens, r[2] * 1e3);
			}
		}
		planrt_progress(step + 1, opt.steps, shown_loss, step_s > 0 ? (double)tokens / step_s : 0, planrt_now() - start);
	}
	free(pending);

	/* 6. the checkpoint and the reports */
	clear_action(&ctx);
	if (opt.save)
		save_checkpoint(&ctx, stage, opt.save, rank);
	if (getenv("PLANRT_REPORT_MEMORY"))
		fprintf(stderr,
			"planrt: rank %d: memory arena_high_water=%zu arena_planned=%zu state=%zu peak_rss=%zu stage=%d "
			"param=%zu grad=%zu optim=%zu master=%zu buffer=%zu metric=%zu\n",
			rank, arena_high_water(arena, stage->arena_bytes), stage->arena_bytes, state_bytes,
			planrt_peak_rss_bytes(), stage_index, kind_bytes[planrt_state_param], kind_bytes[planrt_state_grad],
			kind_bytes[planrt_state_optim], kind_bytes[planrt_state_master], kind_bytes[planrt_state_buffer],
			kind_bytes[planrt_state_metric]);
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
		free(*stage->state[i].ptr);
		*stage->state[i].ptr = NULL;
	}
	prog = NULL;
	PLANRT_CHECK(planrt_finalize());
	return 0;
}
