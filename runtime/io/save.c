/* save.c: --save, the trained weights as one safetensors file of f32 tensors under planc's names
 * (or --map's), written without moving parameters between ranks.
 *
 * Every rank computes the same safetensors layout (it is a function of the parameter table), rank
 * 0 creates a temporary file beside the target with the header and the full size (planrt_outfile:
 * a target that is not a regular file is refused, a character device such as /dev/null is
 * written in place), every rank pwrite()s its own pieces at their offsets (the save phase's
 * planrt_save_param kernels), the ranks agree on success, and rank 0 fills in the checksum,
 * fsyncs and renames the file over the target. The bytes are exactly those planrt_st_write would write for the same tensors (sorted
 * compact JSON header padded to 8 bytes, data ordered by name, the FNV-1a checksum of the data
 * area in __metadata__; the checksum's 16 hex digits have a fixed width, so rank 0 writes a
 * placeholder and patches it after reading the data back). On any failure the temporary file is
 * removed and the target is left as it was.
 *
 * The control messages (the temporary file's name, the agreement) use planrt's control group, so
 * that the per-kind traffic counters hold only the plan's own traffic, which planc explain
 * predicts. */
#define PLANRT_INTERNAL
#include "planrt_ckpt.h"
#include "planrt_kernels.h"
#include "planrt_params.h"
#include "planrt_save.h"
#include "planrt_outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECKSUM_PLACEHOLDER "\"planrt_checksum\":\"fnv1a64:0000000000000000\""

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

void planrt_save_param(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
		       int shard_axis)
{
	struct planrt_save *sv = ctx->save_file;
	if (!sv)
		planrt_fatal("internal error: planrt_save_param outside the save phase");
	if (sv->error[0])
		return;
	const planrt_program_t *prog = ctx->program;
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
	if (!p->saved || n <= 0 || !planrt_param_writes_(prog, p, shard_axis))
		return;
	int64_t offs[PLANRT_PARAM_MAX_DIMS], gstride[PLANRT_PARAM_MAX_DIMS], stride = 1;
	int64_t local = planrt_param_block_(p, offs);
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

/* rank 0, after every rank wrote: the checksum of the data area into the header, then the file
 * committed (fsync, rename; a device is only closed: its bytes cannot be read back). Returns 0 or
 * sets sv->error (the temporary file is removed). */
static int finish_checkpoint(struct planrt_save *sv, planrt_outfile_t *of, const layout_t *L)
{
	char why[1024];
	if (of->in_place)
		goto commit;
	of->fd = open(sv->tmp, O_RDWR | O_CLOEXEC);
	if (of->fd < 0) {
		save_fail(sv, "reopen", errno);
		planrt_outfile_discard(of);
		return -1;
	}
	enum { BUF = 1 << 20 };
	unsigned char *buf = malloc(BUF);
	if (!buf) {
		save_fail(sv, "checksum", ENOMEM);
		planrt_outfile_discard(of);
		return -1;
	}
	uint64_t h = 0xcbf29ce484222325ull;
	for (uint64_t at = 0; at < L->data_bytes;) {
		size_t want = L->data_bytes - at < BUF ? (size_t)(L->data_bytes - at) : BUF;
		ssize_t got = pread(of->fd, buf, want, (off_t)(sv->data_start + at));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			save_fail(sv, "read back", got < 0 ? errno : 0);
			free(buf);
			planrt_outfile_discard(of);
			return -1;
		}
		h = fnv1a(h, buf, (size_t)got);
		at += (uint64_t)got;
	}
	free(buf);
	char hex[17];
	snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
	int err = pwrite_all(of->fd, hex, 16, 8 + L->checksum_at);
	if (err) {
		save_fail(sv, "checksum write", err);
		planrt_outfile_discard(of);
		return -1;
	}
commit:
	if (planrt_outfile_commit(of, why, sizeof why) != 0) {
		snprintf(sv->error, sizeof sv->error, "%s", why);
		return -1;
	}
	return 0;
}

/* Every rank: writes path (see the top comment). A failure anywhere ends every rank with the
 * failing rank's one-line cause, after the temporary file is removed. */
static void save_file(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *path, int rank)
{
	layout_t L;
	build_layout(ctx->program, path, &L);
	struct planrt_save sv = {.path = path, .fd = -1, .data_start = 8 + L.hlen, .offset = L.offset};
	/* rank 0 names the file after its pid and creates it; the broadcast of the pid tells the
	 * others that it exists */
	long pid = (long)getpid();
	planrt_outfile_t of = {.fd = -1};
	if (rank == 0) {
		char why[1024];
		if (planrt_outfile_open(&of, "--save", path, pid, why, sizeof why) != 0)
			planrt_fatal("%s", why);
		const char *step = "write";
		unsigned char len8[8];
		for (int i = 0; i < 8; i++)
			len8[i] = (unsigned char)((uint64_t)L.hlen >> (8 * i));
		sv.tmp = of.tmp;
		int err = pwrite_all(of.fd, len8, 8, 0);
		if (!err)
			err = pwrite_all(of.fd, L.header, L.hlen, 8);
		if (!err && !of.in_place && (step = "resize", ftruncate(of.fd, (off_t)(sv.data_start + L.data_bytes)) != 0))
			err = errno;
		if (err) {
			save_fail(&sv, step, err);
			planrt_outfile_discard(&of);
			planrt_fatal("%s", sv.error);
		}
		planrt_outfile_close(&of); /* still the pending temporary file: a signal removes it */
	}
	planrt_comm_t ctl = planrt_control_comm_();
	int64_t id = pid;
	PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	pid = (long)id;
	planrt_outfile_t part; /* this rank's descriptor of the file */
	char why[1024];
	if (planrt_outfile_join(&part, path, pid, why, sizeof why) != 0)
		save_fail(&sv, "open", errno);
	sv.fd = part.fd;
	sv.tmp = part.tmp;
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
			planrt_outfile_discard(&of);
		PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
		if (rank == world - worst)
			planrt_fatal("%s", sv.error);
		PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
		planrt_fatal("checkpoint '%s' not written (rank %d failed)", path, world - worst);
	}
	if (rank == 0 && finish_checkpoint(&sv, &of, &L) != 0)
		planrt_fatal("%s", sv.error);
	/* the others pass this once rank 0 has renamed the file (or ended the job) */
	PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	free(L.header);
	free(L.offset);
}

void planrt_save_weights_(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *path, const char *map_path, int rank)
{
	if (!ctx->name_map) {
		save_file(ctx, stage, path, rank);
		return;
	}
	/* planc's names first, in a temporary file beside it that a later run's
	 * planrt_outfile_remove_stale recognises (rank 0's pid); then rank 0 rewrites it under the map's names */
	planrt_comm_t ctl = planrt_control_comm_();
	int64_t id = (int64_t)getpid();
	PLANRT_CHECK(planrt_broadcast(&id, 1, planrt_f64 /* 8 bytes */, 0, ctl, NULL, NULL));
	size_t n = strlen(path) + 48;
	char *tmp = malloc(n);
	if (!tmp)
		planrt_fatal("out of memory saving '%s'", path);
	snprintf(tmp, n, "%s.tmp.%lld.planc-names", path, (long long)id);
	save_file(ctx, stage, tmp, rank);
	if (rank == 0) {
		planrt_result_t r = planrt_namemap_convert(ctx->name_map, tmp, path);
		unlink(tmp);
		if (r != planrt_success)
			planrt_fatal("--save '%s' under the names of --map '%s': %s", path, map_path, planrt_last_error());
	}
	int32_t sync = 0; /* the others pass this once rank 0 has written the file (or ended the job) */
	PLANRT_CHECK(planrt_allreduce(&sync, &sync, 1, planrt_i32, planrt_sum, ctl, NULL, NULL));
	free(tmp);
}
