/* checkpoint.c: sharded checkpoints (--save-every, --keep, --resume), in the manner of
 * torch.distributed.checkpoint: every rank writes the pieces it holds of the logical tensors to a
 * file of its own, and a manifest written last maps every piece to its file and its place in the
 * global tensor (the layout is planrt_ckpt.h's).
 *
 * Saving (planrt_ckpt_save, every rank at a step boundary): rank 0 draws a token that names this
 * save's files and creates DIR/step-N; each rank runs its stage's checkpoint phase, whose kernels
 * (planrt_ckpt_write*) add its pieces, and writes its file atomically (planrt_st_write_: temporary
 * file, fsync, rename); the ranks' descriptions are gathered (allgather on planrt's control group,
 * under the watchdog); if any rank failed, the lowest failing rank reports and nothing is
 * committed; else rank 0 writes the manifest (temporary file, fsync, rename, directory fsync),
 * removes the files of the directory the manifest does not name (the checkpoint it replaced, if
 * the step was saved before) and, with --keep K, the complete checkpoints older than the newest
 * K. Until the manifest's rename the directory's previous state stands, so a save killed at any
 * point leaves every complete checkpoint as it was; the next run that writes to DIR removes what
 * the killed save left (planrt_ckpt_clean).
 *
 * Resuming (planrt_ckpt_resume): rank 0 picks the checkpoint (the newest whose manifest and files
 * check out: checksums, sizes; a newer one that does not is named in a note and skipped) and
 * broadcasts its manifest; every rank checks it against the program (model, data, seed) and runs
 * its stage's resume phase, whose kernels (planrt_ckpt_read*) gather each piece this rank holds
 * from the pieces that cover it, whatever plan wrote them: the same plan reads back its own
 * pieces, another plan of the model (mesh, ZeRO stage, tensor or pipeline split) reassembles its
 * blocks and shards from them. The fingerprint tells which: under the same plan the rank-local
 * state (error-feedback residuals, local SGD's replicas) is read back too and the run continues
 * bit for bit; under another it starts from zero (a note says so), and local SGD, whose
 * replicas' state is all rank-local, refuses.
 *
 * The manifest's checksum covers its own content; each rank file carries the FNV-1a checksum of
 * its data (safetensors.c), which the manifest repeats, so a file that was damaged or swapped is
 * found before anything is read from it. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt_ckpt.h"
#include "planrt_device.h"
#include "planrt_exec.h"
#include "planrt_offload.h"
#include "planrt_params.h"
#include "planrt_outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_DIMS = 8 };
#define FORMAT_NAME "planrt sharded checkpoint"
/* format 2: each rank file's __metadata__ holds its part of the manifest (PART_KEY) */
enum { FORMAT_VERSION = 2 };
#define PART_KEY "planrt_checkpoint"

typedef struct piece {
	char *tensor;          /* logical tensor */
	int rank;              /* its rank (dims) */
	int64_t gdims[MAX_DIMS], offs[MAX_DIMS], block[MAX_DIMS];
	int64_t lo, hi;        /* the block's row-major elements [lo, hi) */
	planrt_dtype_t dtype;  /* as stored */
	const void *data;      /* writing: hi - lo elements */
	void *owned;           /* writing: data, when the piece holds a copy (PLANRT_CKPT_COPY) */
	planrt_st_source_t source; /* writing, data NULL: the bytes are in the offloaded optimizer's state file */
	int file;              /* reading: index in files */
	char *key;             /* reading: the tensor's key in that file */
} piece_t;

typedef struct local {
	int id;
	planrt_dtype_t dtype;
	int64_t n;
	const void *data;
	void *owned;           /* data, when the buffer was copied (planrt_ckpt_write_local_copy_) */
} local_t;

struct planrt_ckpt {
	int writing;
	char *dir;
	int rank;
	/* writing */
	char *token;
	char run_sum[40];      /* the checksum of the run's fields the manifest will hold */
	piece_t *pieces;
	int npieces, cappieces;
	local_t *locals;
	int nlocals, caplocals;
	char error[1024];
	/* reading */
	json_t *manifest;
	char **files;
	planrt_st_t *open;
	int nfiles;
	int exact;
	int own_file;          /* exact: the file of this rank's rank-local state, or -1 */
};

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, n, fmt, ap);
	va_end(ap);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static char *path_join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *s = malloc(n);
	if (!s)
		planrt_fatal("out of memory");
	snprintf(s, n, "%s/%s", a, b);
	return s;
}

void planrt_ckpt_tensor_name(int kind, const char *param, char *buf, size_t n)
{
	switch (kind) {
	case PLANRT_CKPT_MASTER: snprintf(buf, n, "master.%s", param); break;
	case PLANRT_CKPT_EXP_AVG: snprintf(buf, n, "optim.%s.exp_avg", param); break;
	case PLANRT_CKPT_EXP_AVG_SQ: snprintf(buf, n, "optim.%s.exp_avg_sq", param); break;
	case PLANRT_CKPT_MOMENTUM: snprintf(buf, n, "optim.%s.momentum_buffer", param); break;
	default: snprintf(buf, n, "%s", param); break;
	}
}

static const char *dtype_tag(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return "F32";
	case planrt_bf16: return "BF16";
	case planrt_f16: return "F16";
	case planrt_f64: return "F64";
	case planrt_i32: return "I32";
	default: return "U8";
	}
}

static void fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* ------------------------------------------------------------------ writing */

/* the checksum of a JSON value: FNV-1a of its compact, key-sorted text */
static void json_checksum(json_t *j, char *out, size_t n)
{
	char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
	snprintf(out, n, "fnv1a64:%016llx", (unsigned long long)fnv1a(0xcbf29ce484222325ull, text ? text : "", text ? strlen(text) : 0));
	free(text);
}

/* the manifest's members that are not the run's: derived from the rank files, or the format */
static const char *const derived_members[] = {"files", "tensors", "local", "manifest_checksum", "format", "version"};

/* the checksum of a manifest's run (its members but the derived ones); run may be a manifest */
static void run_checksum(json_t *run, char *out, size_t n)
{
	json_t *copy = json_copy(run);
	for (size_t i = 0; i < sizeof derived_members / sizeof *derived_members; i++)
		json_object_del(copy, derived_members[i]);
	json_checksum(copy, out, n);
	json_decref(copy);
}

planrt_ckpt_t *planrt_ckpt_writer(const char *stepdir, const char *token, json_t *run, int rank)
{
	planrt_ckpt_t *c = calloc(1, sizeof *c);
	if (!c || !(c->dir = strdup(stepdir)) || !(c->token = strdup(token)))
		planrt_fatal("out of memory starting a checkpoint");
	run_checksum(run, c->run_sum, sizeof c->run_sum);
	c->writing = 1;
	c->rank = rank;
	c->own_file = -1;
	return c;
}

void planrt_ckpt_add_piece(planrt_ckpt_t *c, const char *tensor, int rank, const int64_t *gdims, const int64_t *offs,
			   const int64_t *block, int64_t lo, int64_t hi, planrt_dtype_t dtype, const void *data)
{
	if (c->npieces == c->cappieces) {
		c->cappieces = c->cappieces ? 2 * c->cappieces : 32;
		c->pieces = realloc(c->pieces, sizeof *c->pieces * (size_t)c->cappieces);
		if (!c->pieces)
			planrt_fatal("out of memory listing a checkpoint's pieces");
	}
	piece_t *p = &c->pieces[c->npieces++];
	memset(p, 0, sizeof *p);
	if (!(p->tensor = strdup(tensor)))
		planrt_fatal("out of memory listing a checkpoint's pieces");
	p->rank = rank;
	for (int d = 0; d < rank; d++) {
		p->gdims[d] = gdims[d];
		p->offs[d] = offs[d];
		p->block[d] = block[d];
	}
	p->lo = lo;
	p->hi = hi;
	p->dtype = dtype;
	p->data = data;
}

void planrt_ckpt_add_local(planrt_ckpt_t *c, int id, planrt_dtype_t dtype, int64_t n, const void *data)
{
	if (c->nlocals == c->caplocals) {
		c->caplocals = c->caplocals ? 2 * c->caplocals : 8;
		c->locals = realloc(c->locals, sizeof *c->locals * (size_t)c->caplocals);
		if (!c->locals)
			planrt_fatal("out of memory listing a checkpoint's pieces");
	}
	c->locals[c->nlocals++] = (local_t){id, dtype, n, data, NULL};
}

static json_t *int_array(const int64_t *v, int n)
{
	json_t *a = json_array();
	for (int i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(v[i]));
	return a;
}

static void writer_free(planrt_ckpt_t *c)
{
	for (int i = 0; i < c->npieces; i++) {
		free(c->pieces[i].tensor);
		free(c->pieces[i].owned);
	}
	free(c->pieces);
	for (int i = 0; i < c->nlocals; i++)
		free(c->locals[i].owned);
	free(c->locals);
	free(c->token);
	free(c->dir);
	free(c);
}

json_t *planrt_ckpt_write_rank(planrt_ckpt_t *c, char *err, size_t errn)
{
	json_t *desc = json_object(), *pieces = json_array(), *locals = json_array();
	if (!desc || !pieces || !locals)
		planrt_fatal("out of memory describing a checkpoint");
	json_object_set_new(desc, "rank", json_integer(c->rank));
	int n = c->npieces + c->nlocals;
	if (c->error[0]) {
		set_err(err, errn, "%s", c->error);
		goto fail;
	}
	if (!n) { /* a rank that holds nothing new (every piece is a replica's) writes no file */
		json_object_set_new(desc, "file", json_null());
		json_object_set_new(desc, "pieces", pieces);
		json_object_set_new(desc, "local", locals);
		writer_free(c);
		return desc;
	}
	planrt_st_tensor_t *ts = calloc((size_t)n, sizeof *ts);
	char **keys = calloc((size_t)n, sizeof *keys);
	if (!ts || !keys)
		planrt_fatal("out of memory writing a checkpoint");
	for (int i = 0; i < c->npieces; i++) {
		const piece_t *p = &c->pieces[i];
		keys[i] = strdup(p->tensor);
		for (int j = 0; j < i && keys[i]; j++) /* a second piece of one tensor: a key of its own */
			if (!strcmp(keys[j], keys[i])) {
				char *k = malloc(strlen(p->tensor) + 24);
				if (k)
					sprintf(k, "%s#%d", p->tensor, i);
				free(keys[i]);
				keys[i] = k;
				break;
			}
		if (!keys[i])
			planrt_fatal("out of memory writing a checkpoint");
		ts[i] = (planrt_st_tensor_t){keys[i], p->dtype, 1, {p->hi - p->lo}, p->data, p->data ? NULL : &p->source};
		json_t *e = json_pack("{s:s, s:s, s:o, s:s, s:o, s:o, s:[I, I]}", "tensor", p->tensor, "key", keys[i], "shape",
				      int_array(p->gdims, p->rank), "dtype", dtype_tag(p->dtype), "offsets",
				      int_array(p->offs, p->rank), "block", int_array(p->block, p->rank), "range",
				      (json_int_t)p->lo, (json_int_t)p->hi);
		if (!e || json_array_append_new(pieces, e))
			planrt_fatal("out of memory describing a checkpoint");
	}
	for (int i = 0; i < c->nlocals; i++) {
		const local_t *l = &c->locals[i];
		int k = c->npieces + i;
		keys[k] = malloc(32);
		if (!keys[k])
			planrt_fatal("out of memory writing a checkpoint");
		snprintf(keys[k], 32, "local.%d", l->id);
		ts[k] = (planrt_st_tensor_t){keys[k], l->dtype, 1, {l->n}, l->data, NULL};
		json_array_append_new(locals, json_pack("{s:i, s:s, s:s, s:I}", "id", l->id, "key", keys[k], "dtype",
							dtype_tag(l->dtype), "elements", (json_int_t)l->n));
	}
	char name[96], checksum[40] = "";
	snprintf(name, sizeof name, "rank-%05d.%s.safetensors", c->rank, c->token);
	char *path = path_join(c->dir, name);
	/* the file's own description of itself, which the manifest must agree with (check_dir) */
	json_t *part = json_pack("{s:i, s:s, s:O, s:O}", "rank", c->rank, "run", c->run_sum, "pieces", pieces, "local", locals);
	char *part_text = part ? json_dumps(part, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(part);
	if (!part_text)
		planrt_fatal("out of memory describing a checkpoint");
	planrt_result_t r = planrt_st_write_(path, ts, n, PART_KEY, part_text, checksum, sizeof checksum);
	free(part_text);
	struct stat st;
	int ok = r == planrt_success && stat(path, &st) == 0;
	if (!ok)
		set_err(err, errn, "%s", r != planrt_success ? planrt_last_error() : strerror(errno));
	for (int i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(ts);
	free(path);
	if (!ok)
		goto fail;
	json_object_set_new(desc, "file", json_string(name));
	json_object_set_new(desc, "bytes", json_integer((json_int_t)st.st_size));
	json_object_set_new(desc, "checksum", json_string(checksum));
	json_object_set_new(desc, "pieces", pieces);
	json_object_set_new(desc, "local", locals);
	writer_free(c);
	return desc;
fail:
	json_decref(pieces);
	json_decref(locals);
	json_decref(desc);
	writer_free(c);
	return NULL;
}

/* the manifest's checksum: of the compact, key-sorted JSON without "manifest_checksum" */
static void manifest_checksum(json_t *m, char *out, size_t n)
{
	json_t *copy = json_copy(m);
	json_object_del(copy, "manifest_checksum");
	json_checksum(copy, out, n);
	json_decref(copy);
}

static int ours(const char *name)
{
	return !strncmp(name, "rank-", 5) || !strncmp(name, "manifest.json", 13);
}

/* every file of the directory that is ours and not in keep (NULL: every one); returns the count */
static int remove_unnamed(const char *dir, json_t *files)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int removed = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!ours(e->d_name) || (files && !strcmp(e->d_name, "manifest.json")))
			continue;
		int named = 0;
		size_t i;
		json_t *f;
		json_array_foreach(files, i, f)
		{
			const char *fn = json_string_value(json_object_get(f, "name"));
			named |= fn && !strcmp(fn, e->d_name);
		}
		if (named)
			continue;
		char *p = path_join(dir, e->d_name);
		removed += unlink(p) == 0;
		free(p);
	}
	closedir(d);
	return removed;
}

/* A manifest's "files", "tensors" and "local" from the ranks' descriptions ({"rank", "file",
 * "bytes", "checksum", "pieces", "local"}; borrowed; a rank without a file is left out), in rank
 * order. The save builds the manifest with it, and check_dir rebuilds it from the files' own
 * descriptions to compare. */
static void manifest_listing(json_t *const *ranks, int nranks, json_t *m)
{
	json_t *files = json_array(), *tensors = json_object(), *locals = json_array();
	if (!files || !tensors || !locals)
		planrt_fatal("out of memory describing a checkpoint");
	for (int r = 0; r < nranks; r++) {
		json_t *d = ranks[r];
		const char *file = json_string_value(json_object_get(d, "file"));
		if (!file)
			continue;
		json_int_t fi = (json_int_t)json_array_size(files);
		json_array_append_new(files, json_pack("{s:s, s:I, s:O, s:O}", "name", file, "rank",
						       json_integer_value(json_object_get(d, "rank")), "bytes",
						       json_object_get(d, "bytes") ?: json_null(), "checksum",
						       json_object_get(d, "checksum") ?: json_null()));
		size_t i;
		json_t *p;
		json_array_foreach(json_object_get(d, "pieces"), i, p)
		{
			const char *name = json_string_value(json_object_get(p, "tensor")) ?: "?";
			json_t *t = json_object_get(tensors, name);
			if (!t) {
				t = json_pack("{s:O, s:O, s:[]}", "shape", json_object_get(p, "shape") ?: json_null(), "dtype",
					      json_object_get(p, "dtype") ?: json_null(), "pieces");
				json_object_set_new(tensors, name, t);
			}
			json_array_append_new(json_object_get(t, "pieces"),
					      json_pack("{s:I, s:O, s:O, s:O, s:O, s:O}", "file", fi, "key",
							json_object_get(p, "key") ?: json_null(), "dtype",
							json_object_get(p, "dtype") ?: json_null(), "offsets",
							json_object_get(p, "offsets") ?: json_null(), "block",
							json_object_get(p, "block") ?: json_null(), "range",
							json_object_get(p, "range") ?: json_null()) ?:
						      json_null());
		}
		if (json_array_size(json_object_get(d, "local")))
			json_array_append_new(locals, json_pack("{s:I, s:I, s:O}", "rank", json_integer_value(json_object_get(d, "rank")),
								"file", fi, "buffers", json_object_get(d, "local")));
	}
	json_object_set_new(m, "files", files);
	json_object_set_new(m, "tensors", tensors);
	json_object_set_new(m, "local", locals);
}

int planrt_ckpt_commit(const char *stepdir, json_t *run, json_t **ranks, int nranks, char *err, size_t errn)
{
	json_t *m = run;
	json_object_set_new(m, "format", json_string(FORMAT_NAME));
	json_object_set_new(m, "version", json_integer(FORMAT_VERSION));
	manifest_listing(ranks, nranks, m);
	for (int r = 0; r < nranks; r++)
		json_decref(ranks[r]);
	char sum[40];
	manifest_checksum(m, sum, sizeof sum);
	json_object_set_new(m, "manifest_checksum", json_string(sum));
	char *text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
	if (!text) {
		json_decref(m);
		set_err(err, errn, "out of memory writing the manifest of '%s'", stepdir);
		return -1;
	}
	char *path = path_join(stepdir, "manifest.json"), why[1024];
	planrt_outfile_t out;
	FILE *f = NULL;
	int ok = planrt_outfile_open(&out, "the manifest", path, (long)getpid(), why, sizeof why) == 0;
	if (ok && (!(f = planrt_outfile_stream(&out, why, sizeof why)) || fputs(text, f) < 0 || fputc('\n', f) < 0)) {
		planrt_outfile_discard(&out);
		snprintf(why, sizeof why, "cannot write '%.900s': %s", out.tmp, strerror(errno));
		ok = 0;
	}
	ok = ok && planrt_outfile_commit(&out, why, sizeof why) == 0;
	free(text);
	if (!ok) {
		set_err(err, errn, "cannot write the manifest: %s", why);
		free(path);
		json_decref(m);
		return -1;
	}
	remove_unnamed(stepdir, json_object_get(m, "files"));
	free(path);
	json_decref(m);
	return 0;
}

/* ------------------------------------------------------------------ finding and checking */

static int step_of(const char *name, long long *step)
{
	char *end;
	if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9')
		return 0;
	errno = 0;
	*step = strtoll(name + 5, &end, 10);
	return !*end && !errno && *step >= 0;
}

static char *read_text(const char *path, size_t limit)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK);
	struct stat st;
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
		close(fd);
		errno = EINVAL;
		return NULL;
	}
	char *text = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (text && got < (size_t)st.st_size) {
		ssize_t r = read(fd, text + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (!text || got != (size_t)st.st_size) {
		free(text);
		return NULL;
	}
	text[got] = 0;
	return text;
}

/* the checksum a safetensors file's header records, and (part not NULL) its description of itself
 * (PART_KEY, parsed; NULL when the file has none) */
static int file_checksum(const char *path, char *out, size_t n, json_t **part)
{
	int fd = open(path, O_RDONLY);
	unsigned char len8[8];
	if (part)
		*part = NULL;
	if (fd < 0 || read(fd, len8, 8) != 8) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	uint64_t h = 0;
	for (int i = 7; i >= 0; i--)
		h = h << 8 | len8[i];
	char *text = h < 100000000 ? malloc(h + 1) : NULL;
	int ok = text && read(fd, text, h) == (ssize_t)h;
	close(fd);
	if (!ok) {
		free(text);
		return -1;
	}
	text[h] = 0;
	json_t *j = json_loads(text, 0, NULL);
	free(text);
	json_t *meta = json_object_get(j, "__metadata__");
	const char *c = json_string_value(json_object_get(meta, "planrt_checksum"));
	if (c)
		snprintf(out, n, "%s", c);
	const char *p = json_string_value(json_object_get(meta, PART_KEY));
	if (part && p)
		*part = json_loads(p, 0, NULL);
	json_decref(j);
	return c ? 0 : -1;
}

/* Format 2: the manifest must say what its files say of themselves (each rank file's header
 * records its rank, the checksum of the run's fields and its pieces): the run's fields, the
 * files' ranks, every tensor's pieces and the rank-local buffers are rebuilt from the files and
 * compared with the manifest. An edit of the manifest alone (a step, a seed, a piece moved),
 * even with its checksum recomputed, is refused. parts[i]: file i's description (borrowed). */
static int manifest_agrees(json_t *m, json_t **parts, char *why, size_t whyn)
{
	json_t *files = json_object_get(m, "files");
	size_t nfiles = json_array_size(files);
	char run_sum[40];
	run_checksum(m, run_sum, sizeof run_sum);
	json_t **descs = calloc(nfiles + 1, sizeof *descs);
	if (!descs)
		planrt_fatal("out of memory checking a checkpoint");
	int ok = 1;
	for (size_t i = 0; ok && i < nfiles; i++) {
		json_t *f = json_array_get(files, i), *part = parts[i];
		const char *name = json_string_value(json_object_get(f, "name")) ?: "?";
		if (!part) {
			set_err(why, whyn, "its file '%s' does not describe itself (a file of format 1, or not planrt's)", name);
			ok = 0;
		} else if (strcmp(json_string_value(json_object_get(part, "run")) ?: "", run_sum)) {
			set_err(why, whyn, "its manifest's run (step, seed, plan, data position) is not the one its file '%s' was "
				"saved with: the manifest was edited or belongs to another save",
				name);
			ok = 0;
		} else {
			descs[i] = json_pack("{s:O, s:s, s:O, s:O, s:O, s:O}", "rank", json_object_get(part, "rank") ?: json_null(),
					     "file", name, "bytes", json_object_get(f, "bytes") ?: json_null(), "checksum",
					     json_object_get(f, "checksum") ?: json_null(), "pieces",
					     json_object_get(part, "pieces") ?: json_null(), "local",
					     json_object_get(part, "local") ?: json_null());
			ok = descs[i] != NULL;
		}
	}
	if (ok) {
		json_t *rebuilt = json_object();
		manifest_listing(descs, (int)nfiles, rebuilt);
		const char *what[] = {"files", "tensors", "local"};
		for (size_t k = 0; ok && k < sizeof what / sizeof *what; k++)
			if (!json_equal(json_object_get(rebuilt, what[k]), json_object_get(m, what[k]))) {
				set_err(why, whyn, "its manifest's %s disagree with what its files hold: the manifest was edited or "
					"belongs to another save",
					!strcmp(what[k], "files") ? "files' ranks" : !strcmp(what[k], "tensors") ? "tensors' pieces"
														 : "rank-local buffers");
				ok = 0;
			}
		json_decref(rebuilt);
	}
	for (size_t i = 0; i < nfiles; i++)
		json_decref(descs[i]);
	free(descs);
	return ok;
}

/* A step directory's manifest and files check out: returns the manifest text, or NULL with why. */
static char *check_dir(const char *dir, int deep, char *why, size_t whyn)
{
	char *mpath = path_join(dir, "manifest.json");
	char *text = read_text(mpath, 1u << 30);
	free(mpath);
	if (!text) {
		set_err(why, whyn, errno == ENOENT ? "it has no manifest (its save did not finish)" : "its manifest cannot be read: %s",
			strerror(errno));
		return NULL;
	}
	json_error_t je;
	json_t *m = json_loads(text, 0, &je);
	const char *sum = json_string_value(json_object_get(m, "manifest_checksum"));
	char want[40];
	if (m)
		manifest_checksum(m, want, sizeof want);
	if (!m || !sum || strcmp(sum, want) || strcmp(json_string_value(json_object_get(m, "format")) ?: "", FORMAT_NAME)) {
		set_err(why, whyn, m ? "its manifest does not match its checksum (damaged)" : "its manifest is not JSON (%s)",
			je.text);
		json_decref(m);
		free(text);
		return NULL;
	}
	json_int_t version = json_integer_value(json_object_get(m, "version"));
	if (version < 1 || version > FORMAT_VERSION) {
		set_err(why, whyn, "its manifest is of format %lld, this planrt reads formats 1 to %d", (long long)version,
			FORMAT_VERSION);
		json_decref(m);
		free(text);
		return NULL;
	}
	size_t i, nfiles = json_array_size(json_object_get(m, "files"));
	json_t *f, **parts = calloc(nfiles + 1, sizeof *parts);
	if (!parts)
		planrt_fatal("out of memory checking a checkpoint");
	int bad = 0;
	const char *bad_name = "?";
	json_array_foreach(json_object_get(m, "files"), i, f)
	{
		const char *name = json_string_value(json_object_get(f, "name"));
		char *p = path_join(dir, name ? name : "?");
		struct stat st;
		char have[40] = "";
		bad = !name || strchr(name, '/') || stat(p, &st) != 0 ? 1
		      : st.st_size != json_integer_value(json_object_get(f, "bytes")) ? 2
		      : file_checksum(p, have, sizeof have, &parts[i]) || strcmp(have, json_string_value(json_object_get(f, "checksum")) ?: "") ? 3
																	 : 0;
		if (!bad && deep) { /* the data against the checksum */
			planrt_st_t st_f = NULL;
			bad = planrt_st_open(p, &st_f) != planrt_success ? 4 : 0;
			planrt_st_close(st_f);
		}
		free(p);
		if (bad) {
			bad_name = name ? name : "?";
			break;
		}
	}
	if (bad)
		set_err(why, whyn, "its file '%s' is %s", bad_name,
			bad == 1 ? "missing" : bad == 2 ? "of the wrong size" : bad == 3 ? "not the one the manifest names"
										: "damaged (its data does not match its checksum)");
	else if (version >= 2 && !manifest_agrees(m, parts, why, whyn))
		bad = 5;
	for (i = 0; i < nfiles; i++)
		json_decref(parts[i]);
	free(parts);
	json_decref(m);
	if (bad) {
		free(text);
		return NULL;
	}
	return text;
}

static int cmp_desc(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* the step directories of dir, newest first (malloc'd steps; count in *n) */
static long long *list_steps(const char *dir, int *n)
{
	*n = 0;
	DIR *d = opendir(dir);
	if (!d)
		return NULL;
	long long *steps = NULL;
	int cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		long long s;
		if (!step_of(e->d_name, &s))
			continue;
		if (*n == cap) {
			cap = cap ? 2 * cap : 16;
			steps = realloc(steps, sizeof *steps * (size_t)cap);
			if (!steps)
				planrt_fatal("out of memory listing '%s'", dir);
		}
		steps[(*n)++] = s;
	}
	closedir(d);
	qsort(steps, (size_t)*n, sizeof *steps, cmp_desc);
	return steps;
}

static void step_dir(const char *dir, long long step, char *out, size_t n)
{
	snprintf(out, n, "%s/step-%08lld", dir, step);
}

char *planrt_ckpt_find(const char *path, char *dir, size_t dirn, char *err, size_t errn)
{
	struct stat st;
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
		set_err(err, errn, "--resume '%s' %s; pass the --save-every directory or one of its step-N directories", path,
			stat(path, &st) != 0 ? strerror(errno) : "is not a directory");
		return NULL;
	}
	char why[512];
	char *mpath = path_join(path, "manifest.json");
	int direct = access(mpath, F_OK) == 0;
	free(mpath);
	if (direct) {
		char *text = check_dir(path, 1, why, sizeof why);
		if (!text)
			set_err(err, errn, "cannot resume from '%s': %s", path, why);
		else
			snprintf(dir, dirn, "%s", path);
		return text;
	}
	int n;
	long long *steps = list_steps(path, &n);
	for (int i = 0; i < n; i++) {
		char d[4096];
		step_dir(path, steps[i], d, sizeof d);
		char *text = check_dir(d, 1, why, sizeof why);
		if (text) {
			snprintf(dir, dirn, "%s", d);
			free(steps);
			return text;
		}
		fprintf(stderr, "planrt: note: skipping checkpoint '%s': %s\n", d, why);
	}
	free(steps);
	set_err(err, errn, "'%s' holds no complete checkpoint (no step-N directory with a manifest whose files check out); "
		"start without --resume", path);
	return NULL;
}

/* ------------------------------------------------------------------ cleaning */

/* Called by the one run that writes to dir (rank 0 holds its lock: planrt_ckpt_lock), so every
 * temporary file there is a killed save's. A step directory without a manifest is an unfinished
 * save: removed. One whose manifest or files do not check out is left for the user (a note says
 * so). A complete one loses the files its manifest does not name; beyond the newest keep, it is
 * removed, its manifest first, so that a reader never sees a manifest without its files. */
int planrt_ckpt_clean(const char *dir, int keep)
{
	int n, removed = 0, complete = 0;
	long long *steps = list_steps(dir, &n);
	for (int i = 0; i < n; i++) {
		char d[4096], why[512];
		step_dir(dir, steps[i], d, sizeof d);
		char *mp = path_join(d, "manifest.json");
		int has_manifest = access(mp, F_OK) == 0;
		char *text = has_manifest ? check_dir(d, 0, why, sizeof why) : NULL;
		json_t *m = text ? json_loads(text, 0, NULL) : NULL;
		free(text);
		if (has_manifest && !m) {
			fprintf(stderr, "planrt: note: leaving checkpoint '%s' alone: %s\n", d, why);
		} else if (m && (keep <= 0 || ++complete <= keep)) {
			removed += remove_unnamed(d, json_object_get(m, "files"));
		} else {
			removed += unlink(mp) == 0;
			removed += remove_unnamed(d, NULL);
			removed += rmdir(d) == 0;
			if (!has_manifest)
				fprintf(stderr, "planrt: note: removed '%s', a checkpoint whose save did not finish (no manifest)\n", d);
		}
		json_decref(m);
		free(mp);
	}
	free(steps);
	return removed;
}

int planrt_ckpt_lock(const char *dir, char *err, size_t errn)
{
	char *p = path_join(dir, ".planrt-lock");
	int fd = open(p, O_RDWR | O_CREAT, 0666);
	if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
		set_err(err, errn,
			fd < 0 ? "cannot write checkpoints to '%s': %s; check the directory's permissions"
			       : "another run writes checkpoints to '%s' (it holds %s); give this run another --save-every directory",
			dir, fd < 0 ? strerror(errno) : p);
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	free(p);
	return fd;
}

/* ------------------------------------------------------------------ reading */

planrt_ckpt_t *planrt_ckpt_reader(const char *dir, const char *manifest_text, int rank, int exact, char *err, size_t errn)
{
	json_error_t je;
	json_t *m = json_loads(manifest_text, 0, &je);
	if (!m) {
		set_err(err, errn, "the manifest of '%s' is not JSON (%s)", dir, je.text);
		return NULL;
	}
	planrt_ckpt_t *c = calloc(1, sizeof *c);
	if (!c || !(c->dir = strdup(dir)))
		planrt_fatal("out of memory reading a checkpoint");
	c->manifest = m;
	c->rank = rank;
	c->exact = exact;
	c->own_file = -1;
	json_t *files = json_object_get(m, "files");
	c->nfiles = (int)json_array_size(files);
	c->files = calloc((size_t)c->nfiles + 1, sizeof *c->files);
	c->open = calloc((size_t)c->nfiles + 1, sizeof *c->open);
	if (!c->files || !c->open)
		planrt_fatal("out of memory reading a checkpoint");
	for (int i = 0; i < c->nfiles; i++) {
		json_t *f = json_array_get(files, (size_t)i);
		const char *name = json_string_value(json_object_get(f, "name"));
		c->files[i] = path_join(dir, name ? name : "?");
		if (json_integer_value(json_object_get(f, "rank")) == rank)
			c->own_file = i;
	}
	return c;
}

json_t *planrt_ckpt_manifest(planrt_ckpt_t *c)
{
	return c->manifest;
}

int planrt_ckpt_exact(const planrt_ckpt_t *c)
{
	return c->exact;
}

void planrt_ckpt_close(planrt_ckpt_t *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->nfiles; i++) {
		planrt_st_close(c->open[i]);
		free(c->files[i]);
	}
	free(c->files);
	free(c->open);
	json_decref(c->manifest);
	free(c->dir);
	free(c);
}

static planrt_st_t file_at(planrt_ckpt_t *c, int i, char *err, size_t errn)
{
	if (i < 0 || i >= c->nfiles) {
		set_err(err, errn, "the manifest of '%s' names file %d of %d", c->dir, i, c->nfiles);
		return NULL;
	}
	if (!c->open[i] && planrt_st_open(c->files[i], &c->open[i]) != planrt_success) {
		set_err(err, errn, "%s", planrt_last_error());
		return NULL;
	}
	return c->open[i];
}

static int json_dims(json_t *a, int64_t *out, int max)
{
	if (!json_is_array(a) || (int)json_array_size(a) > max)
		return -1;
	for (size_t i = 0; i < json_array_size(a); i++)
		out[i] = json_integer_value(json_array_get(a, i));
	return (int)json_array_size(a);
}

static void shape_text(int rank, const int64_t *d, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < rank && len < n; i++)
		len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)d[i]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
}

int planrt_ckpt_gather(planrt_ckpt_t *c, const char *tensor, int rank, const int64_t *gdims, const int64_t *offs,
		       const int64_t *block, int64_t lo, int64_t n, float *dst, char *err, size_t errn)
{
	json_t *t = json_object_get(json_object_get(c->manifest, "tensors"), tensor);
	char want[160], have[160];
	shape_text(rank, gdims, want, sizeof want);
	if (!t) {
		set_err(err, errn,
			"tensor '%s' (shape %s) is not in checkpoint '%s'; it was written by a plan whose model or optimizer "
			"differs (%s)",
			tensor, want, c->dir, json_string_value(json_object_get(c->manifest, "plan")) ?: "?");
		return -1;
	}
	int64_t shape[MAX_DIMS];
	int srank = json_dims(json_object_get(t, "shape"), shape, MAX_DIMS);
	int same = srank == rank;
	for (int d = 0; same && d < rank; d++)
		same = shape[d] == gdims[d];
	if (!same) {
		shape_text(srank, shape, have, sizeof have);
		set_err(err, errn, "tensor '%s' has shape %s in checkpoint '%s' but the model's is %s; resume a checkpoint of this model",
			tensor, have, c->dir, want);
		return -1;
	}
	/* this block's row-major strides; the elements [lo, lo + n) wanted */
	int R = rank > 0 ? rank : 1;
	int64_t bdim[MAX_DIMS], boff[MAX_DIMS], bstride[MAX_DIMS];
	for (int d = 0; d < R; d++) {
		bdim[d] = rank > 0 ? block[d] : 1;
		boff[d] = rank > 0 ? offs[d] : 0;
	}
	for (int d = R - 1, s = 1; d >= 0; d--) {
		bstride[d] = s;
		s *= bdim[d];
	}
	int64_t covered = 0;
	size_t i;
	json_t *p;
	json_array_foreach(json_object_get(t, "pieces"), i, p)
	{
		int64_t po[MAX_DIMS] = {0}, pb[MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 1};
		if (json_dims(json_object_get(p, "offsets"), po, MAX_DIMS) != rank ||
		    json_dims(json_object_get(p, "block"), pb, MAX_DIMS) != rank) {
			set_err(err, errn, "checkpoint '%s': a piece of '%s' has a malformed block", c->dir, tensor);
			return -1;
		}
		json_t *range = json_object_get(p, "range");
		int64_t plo = json_integer_value(json_array_get(range, 0)), phi = json_integer_value(json_array_get(range, 1));
		/* a hostile or damaged piece (its rank file's header is not under the data checksum): its
		 * block inside the tensor, its range inside its block, before anything is divided by or
		 * read at them */
		int64_t elems = 1;
		int within = 1;
		for (int d = 0; d < rank && within; d++) {
			within = pb[d] >= 1 && po[d] >= 0 && po[d] <= shape[d] && pb[d] <= shape[d] - po[d];
			elems *= within ? pb[d] : 1; /* at most the tensor's elements: no overflow */
		}
		if (!within || plo < 0 || plo > phi || phi > elems) {
			char po_text[160], pb_text[160];
			shape_text(rank, po, po_text, sizeof po_text);
			shape_text(rank, pb, pb_text, sizeof pb_text);
			set_err(err, errn,
				"checkpoint '%s': a piece of '%s' (shape %s) has offsets %s, block %s and range [%lld, %lld), "
				"which do not lie inside the tensor; its rank file is damaged or was edited",
				c->dir, tensor, want, po_text, pb_text, (long long)plo, (long long)phi);
			return -1;
		}
		/* a piece whose block misses this block on some dim holds nothing wanted */
		int misses = 0;
		for (int d = 0; d < rank; d++)
			misses |= po[d] >= boff[d] + bdim[d] || boff[d] >= po[d] + pb[d];
		if (misses || phi <= plo)
			continue;
		planrt_st_t f = file_at(c, (int)json_integer_value(json_object_get(p, "file")), err, errn);
		if (!f)
			return -1;
		int dtype;
		int64_t count;
		const void *data;
		const char *key = json_string_value(json_object_get(p, "key"));
		if (planrt_st_find_(f, key ? key : "?", &dtype, &count, &data) != planrt_success) {
			set_err(err, errn, "%s", planrt_last_error());
			return -1;
		}
		if (count != phi - plo || (dtype != planrt_f32 && dtype != planrt_bf16 && dtype != planrt_f16)) {
			set_err(err, errn, "checkpoint '%s': piece '%s' of '%s' holds %lld elements of %s, the manifest says %lld",
				c->dir, key, tensor, (long long)count, dtype >= 0 ? dtype_tag((planrt_dtype_t)dtype) : "?",
				(long long)(phi - plo));
			return -1;
		}
		size_t es = planrt_dtype_size((planrt_dtype_t)dtype);
		/* walk the piece in runs along its last dim */
		int64_t last = pb[R - 1];
		for (int64_t idx = plo; idx < phi;) {
			int64_t col = idx % last, len = last - col < phi - idx ? last - col : phi - idx;
			int64_t rest = idx / last, at = 0, inside = 1;
			for (int d = R - 2; d >= 0; d--) { /* the run's global row, and its place in this block */
				int64_t g = po[d] + rest % pb[d];
				rest /= pb[d];
				if (g < boff[d] || g >= boff[d] + bdim[d])
					inside = 0;
				at += (g - boff[d]) * bstride[d];
			}
			int64_t g0 = po[R - 1] + col, g1 = g0 + len; /* global columns of the run */
			int64_t c0 = g0 > boff[R - 1] ? g0 : boff[R - 1], c1 = g1 < boff[R - 1] + bdim[R - 1] ? g1 : boff[R - 1] + bdim[R - 1];
			if (inside && c0 < c1) {
				int64_t j0 = at + (c0 - boff[R - 1]), j1 = j0 + (c1 - c0); /* this block's elements */
				int64_t w0 = j0 > lo ? j0 : lo, w1 = j1 < lo + n ? j1 : lo + n;
				if (w0 < w1) {
					const unsigned char *src = (const unsigned char *)data + es * (size_t)(idx - plo + (c0 - g0) + (w0 - j0));
					planrt_cast(src, (planrt_dtype_t)dtype, dst + (w0 - lo), planrt_f32, w1 - w0);
					covered += w1 - w0;
				}
			}
			idx += len;
		}
	}
	if (covered != n) {
		set_err(err, errn,
			"checkpoint '%s' holds %lld of the %lld elements of '%s' this rank needs; the checkpoint is incomplete "
			"(written by an unfinished or different save)",
			c->dir, (long long)covered, (long long)n, tensor);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------ the test hook */

void planrt_test_pause(const char *what, int64_t step)
{
	const char *s = getenv("PLANRT_TEST_PAUSE");
	size_t n = strlen(what);
	if (!s || strncmp(s, what, n) || (s[n] && (s[n] != ':' || strtoll(s + n + 1, NULL, 10) != step)))
		return;
	fprintf(stderr, "planrt: rank %d: PLANRT_TEST_PAUSE: paused in the %s of step %lld\n", planrt_world_rank_(), what,
		(long long)step);
	fflush(stderr);
	for (int i = 0; i < 600; i++)
		sleep(1);
}

/* ------------------------------------------------------------------ the kernels of the IR */

void planrt_ckpt_write(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int kind, int64_t lo,
		       int64_t n, int shard_axis)
{
	planrt_ckpt_t *c = ctx->ckpt;
	const planrt_program_t *prog = ctx->program;
	int copy = kind >= 0 && (kind & PLANRT_CKPT_COPY);
	if (copy)
		kind &= ~PLANRT_CKPT_COPY;
	if (!c || !c->writing || !prog || param < 0 || param >= prog->nparams || kind < 0 || kind >= PLANRT_CKPT_KINDS)
		planrt_fatal("internal error: planrt_ckpt_write(parameter %d, kind %d) outside a checkpoint", param, kind);
	const planrt_param_t *p = &prog->params[param];
	if (!p->saved || n <= 0 || !planrt_param_writes_(prog, p, shard_axis))
		return;
	int64_t offs[MAX_DIMS];
	int64_t local = planrt_param_block_(p, offs);
	int64_t first = lo < 0 ? 0 : lo, end = lo + n < local ? lo + n : local;
	if (end <= first)
		return;
	char name[512];
	planrt_ckpt_tensor_name(kind, p->name, name, sizeof name);
	const unsigned char *data = (const unsigned char *)src + planrt_dtype_size(dtype) * (size_t)(first - lo);
	planrt_st_source_t from;
	if (copy && planrt_offload_source_(data, planrt_dtype_size(dtype) * (size_t)(end - first), &from.fd, &from.offset)) {
		/* a record the state file still holds as read: written out from there, no copy in memory */
		planrt_ckpt_add_piece(c, name, p->rank, p->gdims, offs, p->ldims, first, end, dtype, NULL);
		c->pieces[c->npieces - 1].source = from;
		return;
	}
	if (copy) {
		size_t bytes = planrt_dtype_size(dtype) * (size_t)(end - first);
		void *own = malloc(bytes);
		if (!own)
			planrt_fatal("out of memory copying '%s' (%zu bytes) into the checkpoint", name, bytes);
		memcpy(own, data, bytes);
		data = own;
		planrt_ckpt_add_piece(c, name, p->rank, p->gdims, offs, p->ldims, first, end, dtype, data);
		c->pieces[c->npieces - 1].owned = own;
		return;
	}
	planrt_ckpt_add_piece(c, name, p->rank, p->gdims, offs, p->ldims, first, end, dtype, data);
}

/* The tensor a read of kind takes its values from (in name). Under the same plan, its own. Across
 * precisions (another plan): a plan whose parameters are f32 takes a mixed-precision checkpoint's
 * master weights (the f32 values its bf16 or f16 parameters were rounded from), and a
 * mixed-precision plan whose checkpoint source had f32 parameters (and so no master weights)
 * takes those as its master weights: both continue from the f32 state of the run. */
static void precision_source(planrt_ckpt_t *c, int kind, const char *param, planrt_dtype_t dtype, char *name, size_t n)
{
	planrt_ckpt_tensor_name(kind, param, name, n);
	if (c->exact)
		return;
	json_t *tensors = json_object_get(c->manifest, "tensors");
	char master[512];
	planrt_ckpt_tensor_name(PLANRT_CKPT_MASTER, param, master, sizeof master);
	if (kind == PLANRT_CKPT_PARAM && dtype == planrt_f32 && json_object_get(tensors, master))
		snprintf(name, n, "%s", master);
	else if (kind == PLANRT_CKPT_MASTER && !json_object_get(tensors, master) &&
		 !strcmp(json_string_value(json_object_get(json_object_get(tensors, param), "dtype")) ?: "", "F32"))
		snprintf(name, n, "%s", param);
}

void planrt_ckpt_read(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int kind, int64_t lo, int64_t n)
{
	planrt_ckpt_t *c = ctx->ckpt;
	const planrt_program_t *prog = ctx->program;
	if (!c || c->writing || !prog || param < 0 || param >= prog->nparams || kind < 0 || kind >= PLANRT_CKPT_KINDS)
		planrt_fatal("internal error: planrt_ckpt_read(parameter %d, kind %d) outside a resume", param, kind);
	const planrt_param_t *p = &prog->params[param];
	int64_t offs[MAX_DIMS];
	int64_t local = planrt_param_block_(p, offs);
	/* [j0, j1): the buffer's positions that hold local elements (the rest: another parameter's) */
	int64_t j0 = lo < 0 ? (-lo < n ? -lo : n) : 0, j1 = local - lo < n ? local - lo : n;
	if (j1 <= j0)
		return;
	float *tmp = malloc(sizeof(float) * (size_t)(j1 - j0));
	if (!tmp)
		planrt_fatal("out of memory resuming '%s'", p->name);
	char name[512], err[1024];
	precision_source(c, kind, p->name, dtype, name, sizeof name);
	if (planrt_ckpt_gather(c, name, p->rank, p->gdims, offs, p->ldims, lo + j0, j1 - j0, tmp, err, sizeof err))
		planrt_fatal("--resume: %s", err);
	planrt_cast(tmp, planrt_f32, (unsigned char *)dst + planrt_dtype_size(dtype) * (size_t)j0, dtype, j1 - j0);
	free(tmp);
}

static int resharding; /* planrt_ckpt_reshard: rank-local state is not carried between plans */

void planrt_ckpt_write_local(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id)
{
	planrt_ckpt_t *c = ctx->ckpt;
	if (!c || !c->writing)
		planrt_fatal("internal error: planrt_ckpt_write_local outside a checkpoint");
	if (n > 0 && !resharding)
		planrt_ckpt_add_local(c, id, dtype, n, src);
}

void planrt_ckpt_write_local_copy_(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id)
{
	planrt_ckpt_t *c = ctx->ckpt;
	if (!c || !c->writing)
		planrt_fatal("internal error: planrt_ckpt_write_local outside a checkpoint");
	if (n <= 0 || resharding)
		return;
	size_t bytes = planrt_dtype_size(dtype) * (size_t)n;
	void *own = malloc(bytes);
	if (!own)
		planrt_fatal("out of memory copying a rank-local buffer (%zu bytes) into the checkpoint", bytes);
	memcpy(own, src, bytes);
	planrt_ckpt_add_local(c, id, dtype, n, own);
	c->locals[c->nlocals - 1].owned = own;
}

void planrt_ckpt_read_local(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int64_t n, int id)
{
	planrt_ckpt_t *c = ctx->ckpt;
	if (!c || c->writing)
		planrt_fatal("internal error: planrt_ckpt_read_local outside a resume");
	if (!c->exact || n <= 0)
		return; /* another plan: rank-local state starts from zero (planrt_ckpt_resume's note) */
	char key[32], err[1024];
	snprintf(key, sizeof key, "local.%d", id);
	planrt_st_t f = file_at(c, c->own_file, err, sizeof err);
	int have;
	int64_t count;
	const void *data;
	if (!f)
		planrt_fatal("--resume: this rank's rank-local state: %s", err);
	if (planrt_st_find_(f, key, &have, &count, &data) != planrt_success || have != (int)dtype || count != n)
		planrt_fatal("--resume: checkpoint '%s' lacks this rank's state buffer %d (%lld elements of %s); it was "
			     "written by another build of the plan",
			     c->dir, id, (long long)n, dtype_tag(dtype));
	memcpy(dst, data, planrt_dtype_size(dtype) * (size_t)n);
}

/* ------------------------------------------------------------------ planrt_main's side */

/* text of every rank, gathered on planrt's control group: out[r] (malloc'd) */
static char **allgather_text(const char *mine)
{
	planrt_comm_t ctl = planrt_control_comm_();
	int world = planrt_comm_size(ctl);
	int64_t len = (int64_t)strlen(mine) + 1, *lens = malloc(sizeof *lens * (size_t)world);
	if (!lens)
		planrt_fatal("out of memory gathering a checkpoint's description");
	PLANRT_CHECK(planrt_allgather(&len, lens, 1, planrt_f64 /* 8 bytes */, ctl, NULL, NULL));
	int64_t most = 0;
	for (int r = 0; r < world; r++)
		most = lens[r] > most ? lens[r] : most;
	char *all = calloc((size_t)world, (size_t)most), *buf = calloc(1, (size_t)most);
	char **out = calloc((size_t)world, sizeof *out);
	if (!all || !buf || !out)
		planrt_fatal("out of memory gathering a checkpoint's description (%d x %lld bytes)", world, (long long)most);
	memcpy(buf, mine, (size_t)len);
	PLANRT_CHECK(planrt_allgather(buf, all, (size_t)most, planrt_u8, ctl, NULL, NULL));
	for (int r = 0; r < world; r++) {
		out[r] = malloc((size_t)most + 1);
		if (!out[r])
			planrt_fatal("out of memory");
		memcpy(out[r], all + (size_t)r * (size_t)most, (size_t)most);
		out[r][most] = 0;
	}
	free(lens);
	free(all);
	free(buf);
	return out;
}

/* rank 0's text to every rank (malloc'd) */
static char *broadcast_text(const char *text)
{
	planrt_comm_t ctl = planrt_control_comm_();
	int64_t len = text ? (int64_t)strlen(text) + 1 : 0;
	PLANRT_CHECK(planrt_broadcast(&len, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	char *out = malloc((size_t)len + 1);
	if (!out)
		planrt_fatal("out of memory");
	if (text)
		memcpy(out, text, (size_t)len);
	PLANRT_CHECK(planrt_broadcast(out, (size_t)len, planrt_u8, 0, ctl, NULL, NULL));
	out[len] = 0;
	return out;
}

void planrt_ckpt_save(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *dir, int64_t step, json_t *run,
		      int keep)
{
	int rank = planrt_world_rank_();
	char token[32] = "", sd[4096], err[1024] = "";
	if (rank == 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		snprintf(token, sizeof token, "%012llx", (unsigned long long)(fnv1a(t, &t, sizeof t) ^ (uint64_t)getpid()) & 0xffffffffffffull);
		step_dir(dir, step, sd, sizeof sd);
		if (mkdir(sd, 0777) != 0 && errno != EEXIST)
			planrt_fatal("cannot create checkpoint directory '%s': %s; check free space and permissions", sd,
				     strerror(errno));
	}
	char *tok = broadcast_text(token); /* after rank 0 made the directory */
	step_dir(dir, step, sd, sizeof sd);
	planrt_ckpt_t *c = planrt_ckpt_writer(sd, tok, run, rank);
	free(tok);
	ctx->ckpt = c;
	planrt_where_(step, "checkpoint", -1, -1);
	if (stage->checkpoint)
		stage->checkpoint(ctx);
	ctx->ckpt = NULL;
	json_t *desc = planrt_ckpt_write_rank(c, err, sizeof err);
	if (!desc)
		desc = json_pack("{s:i, s:s}", "rank", rank, "error", err);
	char *mine = json_dumps(desc, JSON_COMPACT);
	json_decref(desc);
	if (!mine)
		planrt_fatal("out of memory describing checkpoint '%s'", sd);
	char **all = allgather_text(mine);
	free(mine);
	int world = planrt_comm_size(planrt_control_comm_());
	planrt_test_pause("checkpoint", step);
	int ok = 1;
	if (rank == 0) {
		json_t **ranks = calloc((size_t)world, sizeof *ranks);
		if (!ranks)
			planrt_fatal("out of memory");
		for (int r = 0; r < world; r++) {
			ranks[r] = json_loads(all[r], 0, NULL);
			const char *e = json_string_value(json_object_get(ranks[r], "error"));
			if ((e || !ranks[r]) && ok) {
				ok = 0;
				snprintf(err, sizeof err, "rank %d: %s", r, e ? e : "its description is malformed");
			}
		}
		if (ok && planrt_ckpt_commit(sd, json_incref(run), ranks, world, err, sizeof err))
			ok = 0;
		else if (!ok)
			for (int r = 0; r < world; r++)
				json_decref(ranks[r]);
		if (!ok) { /* nothing committed: this save's files go; the checkpoints before stand */
			char *mp = path_join(sd, "manifest.json");
			if (access(mp, F_OK) != 0) {
				remove_unnamed(sd, NULL);
				rmdir(sd);
			} else {
				json_t *m = json_loads(read_text(mp, 1u << 30) ?: "", 0, NULL);
				remove_unnamed(sd, json_object_get(m, "files"));
				json_decref(m);
			}
			free(mp);
			planrt_fatal("checkpoint '%s' not written: %s", sd, err);
		}
		fsync_dir(dir);
		planrt_ckpt_clean(dir, keep);
		free(ranks);
	}
	for (int r = 0; r < world; r++)
		free(all[r]);
	free(all);
	char *done = broadcast_text("committed"); /* every rank continues once the manifest is in place */
	free(done);
}

/* whether directory path holds no step-N entry at all (a --save-every directory nothing was saved
 * into yet; what an unfinished save left was removed by planrt_ckpt_clean before) */
static int holds_no_step(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return 0;
	int none = 1;
	for (struct dirent *e; none && (e = readdir(d));)
		none = strncmp(e->d_name, "step-", 5) != 0;
	closedir(d);
	return none;
}

planrt_ckpt_t *planrt_ckpt_resume_open(const char *path, const planrt_program_t *prog, int fresh_ok)
{
	int rank = planrt_world_rank_();
	char dir[4096] = "", err[1024] = "";
	char *text = NULL;
	int fresh = 0;
	if (rank == 0 && fresh_ok && holds_no_step(path)) {
		fresh = 1;
		fprintf(stderr, "planrt: note: --resume: '%s' holds no checkpoint yet; starting at step 0\n", path);
	} else if (rank == 0 && !(text = planrt_ckpt_find(path, dir, sizeof dir, err, sizeof err))) {
		planrt_fatal("%s", err);
	}
	(void)fresh;
	char *d = broadcast_text(dir), *m = broadcast_text(text);
	free(text);
	if (!*m) { /* rank 0 found the directory fresh */
		free(d);
		free(m);
		return NULL;
	}
	json_t *j = json_loads(m, 0, NULL);
	const char *fp = json_string_value(json_object_get(j, "fingerprint"));
	int exact = fp && prog->fingerprint && !strcmp(fp, prog->fingerprint) &&
		    json_integer_value(json_object_get(j, "world")) == prog->world;
	json_decref(j);
	planrt_ckpt_t *c = planrt_ckpt_reader(d, m, rank, exact, err, sizeof err);
	free(d);
	free(m);
	if (!c)
		planrt_fatal("--resume: %s", err);
	return c;
}

/* a state buffer of rank *arg under --reshard */
static void reshard_allocate(const planrt_state_buf_t *b, void *rank)
{
	void *ptr = NULL;
	if (planrt_state_alloc(b, &ptr) != planrt_success)
		planrt_fatal("--reshard: cannot allocate %zu bytes for '%s' of rank %d (%s)", b->bytes, b->name, *(int *)rank,
			     planrt_last_error());
	*b->ptr = ptr;
}

/* ------------------------------------------------------------------ resharding offline
 *
 * planrt_ckpt_reshard (PROG --reshard SRC OUT, planc reshard): the checkpoint SRC, written under any
 * plan of the model, rewritten as this program's plan would have written it, in one process
 * without MPI: for every rank of this plan in turn, its state is allocated, its resume phase
 * gathers its blocks and shards from SRC (as --resume under another plan does), and its
 * checkpoint phase writes its file; then the manifest, last, as a save does. Rank-local state
 * (error feedback) does not carry between plans and is not written. The run's position (step,
 * seed, data) is SRC's; the fingerprint says the checkpoint was resharded, so resuming it takes
 * the resharding path, whose reads now find each block whole in one piece of the rank's own file.
 * Resuming OUT under this plan continues exactly as resuming SRC under it does (a test compares
 * them bit for bit). Returns 0, or ends the process with the cause. */
int planrt_ckpt_reshard(const planrt_program_t *prog, const char *src, const char *out,
			int (*reshardable)(const char *sync_mode))
{
	char dir[4096], err[1024] = "";
	const char *into = prog->sync ? prog->sync : "strict";
	if (!reshardable(into)) /* before anything is read or written */
		planrt_fatal("--reshard: plan %s (sync %s) keeps each replica's own state, which it reads only from its own "
			     "checkpoints, so no checkpoint can be resharded into it; reshard into a strict plan of the model",
			     prog->plan, into);
	char *text = planrt_ckpt_find(src, dir, sizeof dir, err, sizeof err);
	if (!text)
		planrt_fatal("--reshard: %s", err);
	json_t *m = json_loads(text, 0, NULL);
	const char *model = json_string_value(json_object_get(m, "model")) ?: "?";
	const char *from_plan = json_string_value(json_object_get(m, "plan")) ?: "?";
	const char *sync = json_string_value(json_object_get(m, "sync")) ?: "strict";
	json_int_t step = json_integer_value(json_object_get(m, "step"));
	if (strcmp(model, prog->model ? prog->model : "?"))
		planrt_fatal("--reshard: '%s' is a checkpoint of model '%s' (plan %s); plan %s is of model '%s'", dir, model,
			     from_plan, prog->plan, prog->model);
	if (!reshardable(sync))
		planrt_fatal("--reshard: the checkpoint of plan %s (sync %s) holds each replica's own state, which "
			     "only plan %s can read",
			     from_plan, sync, from_plan);
	json_t *d = json_object_get(m, "data");
	if (json_integer_value(json_object_get(d, "samples_per_step")) != prog->batch ||
	    json_integer_value(json_object_get(d, "sequence")) != prog->seq)
		planrt_fatal("--reshard: plan %s takes %lld samples of %lld per step, the checkpoint's run %lld of %lld; the "
			     "data position would not carry over",
			     prog->plan, (long long)prog->batch, (long long)prog->seq,
			     (long long)json_integer_value(json_object_get(d, "samples_per_step")),
			     (long long)json_integer_value(json_object_get(d, "sequence")));
	/* OUT: a directory of its own (a --save-every directory), never SRC's */
	struct stat so, ss;
	if (mkdir(out, 0777) != 0 && errno != EEXIST)
		planrt_fatal("--reshard: cannot create '%s': %s; create its parent first", out, strerror(errno));
	if (stat(out, &so) != 0 || !S_ISDIR(so.st_mode))
		planrt_fatal("--reshard: '%s' is not a directory; name a directory for the resharded checkpoint", out);
	char srcdir[4096];
	snprintf(srcdir, sizeof srcdir, "%s", dir);
	char *parent = dirname(srcdir);
	if ((stat(dir, &ss) == 0 && ss.st_dev == so.st_dev && ss.st_ino == so.st_ino) ||
	    (stat(parent, &ss) == 0 && ss.st_dev == so.st_dev && ss.st_ino == so.st_ino))
		planrt_fatal("--reshard: '%s' is where the checkpoint is read from; write the resharded one elsewhere", out);
	char sd[4096];
	step_dir(out, step, sd, sizeof sd);
	char *mp = path_join(sd, "manifest.json");
	if (access(mp, F_OK) == 0)
		planrt_fatal("--reshard: '%s' already holds a checkpoint of step %lld; remove it or name another directory", out,
			     (long long)step);
	free(mp);
	if (mkdir(sd, 0777) != 0 && errno != EEXIST)
		planrt_fatal("--reshard: cannot create '%s': %s", sd, strerror(errno));
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	char token[32];
	snprintf(token, sizeof token, "%012llx", (unsigned long long)(fnv1a(t, &t, sizeof t) ^ (uint64_t)getpid()) & 0xffffffffffffull);

	/* the run's position is SRC's; the plan's fields are this program's */
	json_t *run = json_deep_copy(m);
	for (size_t i = 0; i < sizeof derived_members / sizeof *derived_members; i++)
		json_object_del(run, derived_members[i]);
	json_t *mesh = json_array();
	for (int a = 0; a < prog->naxes; a++)
		json_array_append_new(mesh, json_pack("[s, i]", prog->axis_names[a], prog->axis_sizes[a]));
	char fp[256];
	snprintf(fp, sizeof fp, "resharded:%s", prog->fingerprint ? prog->fingerprint : "?");
	json_object_set_new(run, "resharded_from",
			    json_pack("{s:s, s:O, s:O, s:O}", "plan", from_plan, "fingerprint",
				      json_object_get(m, "fingerprint") ?: json_null(), "mesh",
				      json_object_get(m, "mesh") ?: json_null(), "world", json_object_get(m, "world") ?: json_null()));
	json_object_set_new(run, "plan", json_string(prog->plan ? prog->plan : "?"));
	json_object_set_new(run, "source", json_string(prog->source ? prog->source : "?"));
	json_object_set_new(run, "fingerprint", json_string(fp));
	json_object_set_new(run, "sync", json_string(prog->sync ? prog->sync : "strict"));
	json_object_set_new(run, "world", json_integer(prog->world));
	json_object_set_new(run, "mesh", mesh);
	json_t **ranks = calloc((size_t)prog->world, sizeof *ranks);
	if (!ranks)
		planrt_fatal("out of memory");
	resharding = 1;
	for (int r = 0; r < prog->world; r++) {
		planrt_mesh_offline_(prog->naxes, prog->axis_sizes, r);
		int stage_index = prog->pipe_axis >= 0 ? planrt_mesh_coord(prog->pipe_axis) : 0;
		const planrt_stage_t *stage = &prog->stages[stage_index];
		planrt_stage_state_each(stage, reshard_allocate, &r);
		planrt_ctx_t ctx = {.seed = 0, .eval_batch = -1, .program = prog};
		planrt_ckpt_t *in = planrt_ckpt_reader(dir, text, r, 0, err, sizeof err);
		if (!in)
			planrt_fatal("--reshard: %s", err);
		ctx.ckpt = in;
		if (stage->resume)
			stage->resume(&ctx);
		planrt_ckpt_close(in);
		planrt_ckpt_t *w = planrt_ckpt_writer(sd, token, run, r);
		ctx.ckpt = w;
		if (stage->checkpoint)
			stage->checkpoint(&ctx);
		ranks[r] = planrt_ckpt_write_rank(w, err, sizeof err);
		if (!ranks[r])
			planrt_fatal("--reshard: rank %d of plan %s: %s", r, prog->plan, err);
		planrt_stage_state_free(stage);
	}
	resharding = 0;
	if (planrt_ckpt_commit(sd, run, ranks, prog->world, err, sizeof err))
		planrt_fatal("--reshard: checkpoint '%s' not written: %s", sd, err);
	fsync_dir(out);
	free(ranks);
	if (json_array_size(json_object_get(m, "local")))
		fprintf(stderr, "planrt: note: the rank-local state of plan %s (gradient compression's error feedback) is not "
				"carried into plan %s: it restarts from zero there\n",
			from_plan, prog->plan);
	fprintf(stderr, "planrt: resharded '%s' (plan %s, step %lld) into '%s' for plan %s (%d ranks); resume it with "
			"--resume %s\n",
		dir, from_plan, (long long)step, sd, prog->plan, prog->world, out);
	json_decref(m);
	free(text);
	return 0;
}
