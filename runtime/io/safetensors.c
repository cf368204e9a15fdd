/* safetensors.c: checkpoints in the safetensors format, interoperable with PyTorch's.
 *
 * Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
 * N bytes of UTF-8 JSON {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets":
 * [begin, end]}} (offsets relative to the data area that follows the header), then the raw
 * little-endian tensor data.
 *
 * Reading maps the file and validates everything before any tensor is used: the header length
 * (under 100 MB and inside the file), well-formed JSON without duplicate keys, a known dtype for
 * every tensor (the format's full dtype list; planrt_st_read_block converts F32, BF16 and F16),
 * shape product * dtype size equal to the data_offsets span, offsets inside the data area, no two
 * tensors overlapping, and, for files planrt wrote, the checksum in __metadata__.
 *
 * Writing follows the Python writer: header keys in byte order (sorted, jansson's
 * JSON_SORT_KEYS, compact separators), the header padded with spaces to a multiple of 8 bytes so
 * that the data area starts 8-byte aligned, and the tensor data without gaps ordered by element
 * size (largest first), then name, as the Rust writer lays it out, so that every tensor starts
 * aligned to its element size.
 * __metadata__ holds {"format": "pt", "planrt_checksum": "fnv1a64:<16 hex digits>"}, the FNV-1a
 * hash of the data area. The write is atomic: everything goes to path.tmp.<pid>, which is
 * flushed, fsync'ed and renamed over path (then the directory is fsync'ed); on any failure the
 * temporary file is removed and path is left as it was. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h" /* planrt_st_count, planrt_st_raw */
#include "planrt_outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "planrt's safetensors code assumes a little-endian host"
#endif

enum { MAX_DIMS = 8 };
#define MAX_HEADER (100ull * 1000 * 1000)
#define CHECKSUM_KEY "planrt_checksum"

static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
	{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}, {"I32", 4}, {"I64", 8}, {"I16", 2}, {"I8", 1},
	{"U8", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};
enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_I32 = 4 };

typedef struct {
	const char *name; /* owned by the JSON document */
	int dtype;        /* index in dtypes */
	int rank;
	int64_t dims[MAX_DIMS];
	uint64_t begin, end;
} entry_t;

struct planrt_st {
	char *path;
	unsigned char *map;
	size_t size;
	const unsigned char *data;
	uint64_t data_size;
	json_t *header;
	entry_t *t;
	int n;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}
#define FNV_BASIS 0xcbf29ce484222325ull

static void shape_text(int rank, const int64_t *dims, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < rank && len < n; d++)
		len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)dims[d]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
}

void planrt_st_close(planrt_st_t f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->size);
	json_decref(f->header);
	free(f->t);
	free(f->path);
	free(f);
}

static int cmp_begin(const void *a, const void *b)
{
	const entry_t *x = *(const entry_t *const *)a, *y = *(const entry_t *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Checks one header entry and fills e; returns 0 or sets the error. */
static planrt_result_t parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size, entry_t *e)
{
	if (!json_is_object(v))
		return planrt_error_(planrt_format_error, "'%s': tensor '%s' in the header is not a JSON object; the file is corrupt",
				     path, name);
	json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
	       *offs = json_object_get(v, "data_offsets");
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2)
		return planrt_error_(planrt_format_error,
				     "'%s': tensor '%s' needs \"dtype\" (a string), \"shape\" (an array) and "
				     "\"data_offsets\" ([begin, end]); the file is corrupt",
				     path, name);
	e->name = name;
	e->dtype = -1;
	for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
		if (!strcmp(json_string_value(dt), dtypes[i].name))
			e->dtype = (int)i;
	if (e->dtype < 0)
		return planrt_error_(planrt_format_error,
				     "'%s': tensor '%s' has unknown dtype \"%s\"; safetensors dtypes are F32, BF16, F16, "
				     "F64, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2",
				     path, name, json_string_value(dt));
	if (json_array_size(shape) > MAX_DIMS)
		return planrt_error_(planrt_format_error, "'%s': tensor '%s' has %zu dimensions; planrt reads up to %d", path,
				     name, json_array_size(shape), MAX_DIMS);
	e->rank = (int)json_array_size(shape);
	uint64_t elems = 1;
	int overflow = 0;
	for (int d = 0; d < e->rank; d++) {
		json_t *x = json_array_get(shape, (size_t)d);
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return planrt_error_(planrt_format_error,
					     "'%s': tensor '%s' has a shape entry that is not a non-negative integer", path,
					     name);
		e->dims[d] = json_integer_value(x);
		uint64_t dim = (uint64_t)e->dims[d];
		if (dim && elems > UINT64_MAX / dim)
			overflow = 1;
		elems *= dim;
	}
	json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
	if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
	    json_integer_value(en) < json_integer_value(b))
		return planrt_error_(planrt_format_error,
				     "'%s': tensor '%s' has data_offsets that are not integers 0 <= begin <= end", path,
				     name);
	e->begin = (uint64_t)json_integer_value(b);
	e->end = (uint64_t)json_integer_value(en);
	char s[160];
	shape_text(e->rank, e->dims, s, sizeof s);
	size_t es = dtypes[e->dtype].size;
	if (overflow || elems > UINT64_MAX / es || elems * es != e->end - e->begin)
		return planrt_error_(planrt_format_error,
				     "'%s': tensor '%s' has shape %s of %s (%llu bytes) but its data_offsets [%llu, %llu] "
				     "span %llu bytes; the file is corrupt",
				     path, name, s, dtypes[e->dtype].name, (unsigned long long)(elems * es),
				     (unsigned long long)e->begin, (unsigned long long)e->end,
				     (unsigned long long)(e->end - e->begin));
	if (e->end > data_size)
		return planrt_error_(planrt_format_error,
				     "'%s': tensor '%s' data_offsets [%llu, %llu] run past the end of the data (%llu "
				     "bytes); the file is truncated or corrupt",
				     path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
				     (unsigned long long)data_size);
	return planrt_success;
}

static planrt_result_t validate(planrt_st_t f)
{
	const char *path = f->path;
	if (f->size < 8)
		return planrt_error_(planrt_format_error,
				     "'%s' is truncated (%zu bytes): a safetensors file starts with an 8-byte header "
				     "length; rewrite the checkpoint",
				     path, f->size);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | f->map[i];
	if (hlen >= MAX_HEADER)
		return planrt_error_(planrt_format_error,
				     "'%s': header length %llu is over the 100 MB limit; the file is corrupt or not a "
				     "safetensors file",
				     path, (unsigned long long)hlen);
	if (hlen > f->size - 8)
		return planrt_error_(planrt_format_error,
				     "'%s': header length %llu runs past the end of the file (%zu bytes); the file is "
				     "truncated or not a safetensors file",
				     path, (unsigned long long)hlen, f->size);
	json_error_t jerr;
	f->header = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!f->header)
		return planrt_error_(planrt_format_error, "'%s': the header is not valid JSON (%s, at byte %d of the header)",
				     path, jerr.text, jerr.position);
	if (!json_is_object(f->header))
		return planrt_error_(planrt_format_error, "'%s': the header is not a JSON object; the file is corrupt", path);
	f->data = f->map + 8 + hlen;
	f->data_size = f->size - 8 - hlen;
	size_t n = json_object_size(f->header);
	f->t = calloc(n ? n : 1, sizeof *f->t);
	entry_t **order = calloc(n ? n : 1, sizeof *order);
	if (!f->t || !order) {
		free(order);
		return planrt_error_(planrt_system_error, "out of memory reading '%s'", path);
	}
	const char *key;
	json_t *v;
	const char *checksum = NULL;
	json_object_foreach(f->header, key, v)
	{
		if (!strcmp(key, "__metadata__")) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(v)) {
				free(order);
				return planrt_error_(planrt_format_error, "'%s': __metadata__ is not a JSON object", path);
			}
			json_object_foreach(v, mk, mv)
			{
				if (!json_is_string(mv)) {
					free(order);
					return planrt_error_(planrt_format_error,
							     "'%s': __metadata__ value '%s' is not a string", path, mk);
				}
			}
			json_t *c = json_object_get(v, CHECKSUM_KEY);
			checksum = c ? json_string_value(c) : NULL;
			continue;
		}
		planrt_result_t r = parse_entry(path, key, v, f->data_size, &f->t[f->n]);
		if (r != planrt_success) {
			free(order);
			return r;
		}
		order[f->n] = &f->t[f->n];
		f->n++;
	}
	/* by start; each non-empty tensor must start at or after the furthest end so far */
	qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
	const entry_t *furthest = NULL;
	for (int i = 0; i < f->n; i++) {
		const entry_t *e = order[i];
		if (e->begin == e->end)
			continue;
		if (furthest && e->begin < furthest->end) {
			planrt_result_t r = planrt_error_(planrt_format_error,
							  "'%s': tensors '%s' and '%s' overlap in the data area; the file is "
							  "corrupt",
							  path, furthest->name, e->name);
			free(order);
			return r;
		}
		if (!furthest || e->end > furthest->end)
			furthest = e;
	}
	free(order);
	if (checksum) {
		char want[40];
		snprintf(want, sizeof want, "fnv1a64:%016llx",
			 (unsigned long long)fnv1a(FNV_BASIS, f->data, (size_t)f->data_size));
		if (strcmp(want, checksum))
			return planrt_error_(planrt_format_error,
					     "'%s': the data does not match the header's checksum (%s, computed %s); the file "
					     "is corrupt, restore it or start from another checkpoint",
					     path, checksum, want);
	}
	return planrt_success;
}

planrt_result_t planrt_st_open(const char *path, planrt_st_t *out)
{
	*out = NULL;
	planrt_st_t f = calloc(1, sizeof *f);
	if (!f || !(f->path = strdup(path))) {
		free(f);
		return planrt_error_(planrt_system_error, "out of memory opening '%s'", path);
	}
	int fd = open(path, O_RDONLY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		planrt_result_t r = planrt_error_(planrt_io_error, "cannot open checkpoint '%s': %s; check the path", path,
						  strerror(errno));
		if (fd >= 0)
			close(fd);
		planrt_st_close(f);
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		planrt_st_close(f);
		return planrt_error_(planrt_io_error, "checkpoint '%s' is not a regular file; pass a .safetensors file", path);
	}
	f->size = (size_t)st.st_size;
	if (f->size) {
		void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			planrt_result_t r = planrt_error_(planrt_io_error, "cannot map checkpoint '%s': %s", path, strerror(errno));
			close(fd);
			planrt_st_close(f);
			return r;
		}
		f->map = m;
	}
	close(fd);
	planrt_result_t r = validate(f);
	if (r != planrt_success) {
		planrt_st_close(f);
		return r;
	}
	*out = f;
	return planrt_success;
}

planrt_result_t planrt_st_read_block(planrt_st_t f, const char *name, int rank, const int64_t *gdims,
				     const int64_t *ldims, const int64_t *offs, float *dst)
{
	if (!f)
		return planrt_error_(planrt_invalid_usage, "planrt_st_read_block on a NULL checkpoint");
	const entry_t *e = NULL;
	for (int i = 0; i < f->n && !e; i++)
		if (!strcmp(f->t[i].name, name))
			e = &f->t[i];
	char want[160], have[160];
	shape_text(rank, gdims, want, sizeof want);
	if (!e)
		return planrt_error_(planrt_format_error,
				     "tensor '%s' (expected shape %s) is not in '%s' (%d tensors); check the parameter "
				     "names the model and the checkpoint use",
				     name, want, f->path, f->n);
	shape_text(e->rank, e->dims, have, sizeof have);
	int same = e->rank == rank;
	for (int d = 0; same && d < rank; d++)
		same = e->dims[d] == gdims[d];
	if (!same)
		return planrt_error_(planrt_format_error,
				     "tensor '%s' in '%s' has shape %s but the model expects %s; load a checkpoint of "
				     "this model's configuration",
				     name, f->path, have, want);
	if (e->dtype != DT_F32 && e->dtype != DT_BF16 && e->dtype != DT_F16)
		return planrt_error_(planrt_format_error,
				     "tensor '%s' in '%s' has dtype %s (shape %s) but the model expects a float tensor "
				     "%s (F32, BF16 or F16)",
				     name, f->path, dtypes[e->dtype].name, have, want);
	int64_t n = 1, gstride[MAX_DIMS], idx[MAX_DIMS] = {0};
	for (int d = rank - 1, s = 1; d >= 0; d--) {
		if (offs[d] < 0 || ldims[d] < 0 || offs[d] + ldims[d] > gdims[d])
			return planrt_error_(planrt_invalid_argument,
					     "tensor '%s': block at offset %lld of size %lld exceeds dimension %d (size %lld)",
					     name, (long long)offs[d], (long long)ldims[d], d, (long long)gdims[d]);
		gstride[d] = s;
		s *= gdims[d];
		n *= ldims[d];
	}
	if (n == 0)
		return planrt_success;
	const unsigned char *base = f->data + e->begin;
	size_t es = dtypes[e->dtype].size;
	int64_t inner = rank ? ldims[rank - 1] : 1;
	for (int64_t done = 0; done < n; done += inner) {
		int64_t g = 0;
		for (int d = 0; d < rank; d++)
			g += (offs[d] + idx[d]) * gstride[d];
		const unsigned char *src = base + (size_t)g * es;
		if (e->dtype == DT_F32) {
			memcpy(dst + done, src, (size_t)inner * 4);
		} else {
			planrt_dtype_t t = e->dtype == DT_BF16 ? planrt_bf16 : planrt_f16;
			for (int64_t i = 0; i < inner; i++) {
				uint16_t h;
				memcpy(&h, src + 2 * i, 2);
				dst[done + i] = planrt_half_to_f32_(h, t);
			}
		}
		for (int d = rank - 2; d >= 0; d--) {
			if (++idx[d] < ldims[d])
				break;
			idx[d] = 0;
		}
	}
	return planrt_success;
}

const char *planrt_st_metadata_(planrt_st_t f, const char *key)
{
	return f ? json_string_value(json_object_get(json_object_get(f->header, "__metadata__"), key)) : NULL;
}

const char *planrt_st_name_(planrt_st_t f, int i)
{
	return f && i >= 0 && i < f->n ? f->t[i].name : NULL;
}

planrt_result_t planrt_st_find_(planrt_st_t f, const char *name, int *dtype, int64_t *n, const void **data)
{
	for (int i = 0; i < f->n; i++) {
		const entry_t *e = &f->t[i];
		if (strcmp(e->name, name))
			continue;
		static const int as_planrt[] = {[DT_F32] = planrt_f32, [DT_BF16] = planrt_bf16, [DT_F16] = planrt_f16,
						[3] = planrt_f64, [DT_I32] = planrt_i32};
		*dtype = e->dtype <= DT_I32 ? as_planrt[e->dtype] : -1;
		*n = (int64_t)((e->end - e->begin) / dtypes[e->dtype].size);
		*data = f->data + e->begin;
		return planrt_success;
	}
	return planrt_error_(planrt_format_error, "tensor '%s' is not in '%s' (%d tensors); the checkpoint is incomplete",
			     name, f->path, f->n);
}

/* ------------------------------------------------------------------ writing */

static const planrt_st_tensor_t *sort_base;

static int cmp_name(const void *a, const void *b)
{
	return strcmp(sort_base[*(const int *)a].name, sort_base[*(const int *)b].name);
}

/* data order: larger elements first (so every tensor starts aligned to its element size, as
 * the Rust writer arranges it), then by name */
static int cmp_layout(const void *a, const void *b)
{
	const planrt_st_tensor_t *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
	size_t sx = planrt_dtype_size(x->dtype), sy = planrt_dtype_size(y->dtype);
	if (sx != sy)
		return sx > sy ? -1 : 1;
	return strcmp(x->name, y->name);
}

static const char *dtype_tag(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return "F32";
	case planrt_bf16: return "BF16";
	case planrt_f16: return "F16";
	case planrt_i32: return "I32";
	case planrt_f64: return "F64";
	default: return NULL;
	}
}

static size_t tensor_bytes(const planrt_st_tensor_t *t)
{
	size_t n = planrt_dtype_size(t->dtype);
	for (int d = 0; d < t->rank; d++)
		n *= (size_t)t->dims[d];
	return n;
}

/* The tensor's bytes, chunk by chunk: fn(ctx, chunk, n) for each; from memory at once, or read from
 * its source file 1 MiB at a time. 0, or the errno of a failed read. */
static int tensor_chunks(const planrt_st_tensor_t *t, int (*fn)(void *ctx, const void *chunk, size_t n), void *ctx)
{
	size_t bytes = tensor_bytes(t);
	if (!bytes)
		return 0;
	if (t->data || !t->source)
		return fn(ctx, t->data, bytes);
	enum { CHUNK = 1 << 20 };
	static unsigned char buf[CHUNK];
	for (size_t done = 0; done < bytes;) {
		size_t n = bytes - done < CHUNK ? bytes - done : CHUNK;
		ssize_t r = pread(t->source->fd, buf, n, (off_t)(t->source->offset + (int64_t)done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? errno : EIO;
		int e = fn(ctx, buf, (size_t)r);
		if (e)
			return e;
		done += (size_t)r;
	}
	return 0;
}

static int hash_chunk(void *ctx, const void *chunk, size_t n)
{
	uint64_t *h = ctx;
	*h = fnv1a(*h, chunk, n);
	return 0;
}

static int write_chunk(void *ctx, const void *chunk, size_t n)
{
	return fwrite(chunk, 1, n, (FILE *)ctx) == n ? 0 : (errno ? errno : EIO);
}

/* The header text, padded with spaces to a multiple of 8 bytes; NULL on failure (error set). */
static char *build_header(const char *path, const planrt_st_tensor_t *ts, const int *order, int n, size_t *len,
			  const char *meta_key, const char *meta_value, char *checksum, size_t checksum_n)
{
	json_t *root = json_object(), *meta = json_object();
	uint64_t off = 0, h = FNV_BASIS;
	int ok = root && meta;
	for (int k = 0; ok && k < n; k++) {
		const planrt_st_tensor_t *t = &ts[order[k]];
		size_t bytes = tensor_bytes(t);
		json_t *shape = json_array();
		ok = shape != NULL;
		for (int d = 0; ok && d < t->rank; d++)
			ok = !json_array_append_new(shape, json_integer(t->dims[d]));
		json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_tag(t->dtype), "shape", shape, "data_offsets",
				      (json_int_t)off, (json_int_t)(off + bytes));
		ok = ok && e && !json_object_set_new(root, t->name, e);
		off += bytes;
		int rerr = tensor_chunks(t, hash_chunk, &h);
		if (rerr) {
			json_decref(meta);
			json_decref(root);
			planrt_error_(planrt_system_error, "cannot read '%s' for '%s' from the optimizer state file: %s", t->name,
				      path, strerror(rerr));
			return NULL;
		}
	}
	char sum[40];
	snprintf(sum, sizeof sum, "fnv1a64:%016llx", (unsigned long long)h);
	if (checksum)
		snprintf(checksum, checksum_n, "%s", sum);
	ok = ok && !json_object_set_new(meta, "format", json_string("pt")) &&
	     !json_object_set_new(meta, CHECKSUM_KEY, json_string(sum)) &&
	     (!meta_key || !json_object_set_new(meta, meta_key, json_string(meta_value ? meta_value : ""))) &&
	     !json_object_set(root, "__metadata__", meta);
	char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(meta);
	json_decref(root);
	if (!text) {
		planrt_error_(planrt_system_error, "cannot build the header of '%s' (out of memory)", path);
		return NULL;
	}
	size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
	char *out = realloc(text, padded + 1);
	if (!out) {
		free(text);
		planrt_error_(planrt_system_error, "out of memory writing '%s'", path);
		return NULL;
	}
	memset(out + raw, ' ', padded - raw);
	out[padded] = 0;
	*len = padded;
	return out;
}

planrt_result_t planrt_st_write(const char *path, const planrt_st_tensor_t *tensors, int n)
{
	return planrt_st_write_(path, tensors, n, NULL, NULL, NULL, 0);
}

planrt_result_t planrt_st_write_(const char *path, const planrt_st_tensor_t *tensors, int n, const char *meta_key,
				 const char *meta_value, char *checksum, size_t checksum_n)
{
	if (n < 0 || (n > 0 && !tensors))
		return planrt_error_(planrt_invalid_argument, "planrt_st_write('%s'): bad tensor list", path);
	for (int i = 0; i < n; i++) {
		const planrt_st_tensor_t *t = &tensors[i];
		if (!t->name || !*t->name || !strcmp(t->name, "__metadata__"))
			return planrt_error_(planrt_invalid_argument, "planrt_st_write('%s'): tensor %d has no usable name",
					     path, i);
		if (!dtype_tag(t->dtype))
			return planrt_error_(planrt_invalid_argument,
					     "planrt_st_write('%s'): tensor '%s' has dtype %d; checkpoints hold f32, bf16, f16, "
					     "i32 or f64",
					     path, t->name, (int)t->dtype);
		if (t->rank < 0 || t->rank > MAX_DIMS)
			return planrt_error_(planrt_invalid_argument, "planrt_st_write('%s'): tensor '%s' has rank %d", path,
					     t->name, t->rank);
		for (int d = 0; d < t->rank; d++)
			if (t->dims[d] < 0)
				return planrt_error_(planrt_invalid_argument,
						     "planrt_st_write('%s'): tensor '%s' has a negative dimension", path, t->name);
		if (!t->data && !t->source && tensor_bytes(t))
			return planrt_error_(planrt_invalid_argument, "planrt_st_write('%s'): tensor '%s' has no data", path,
					     t->name);
	}
	int *order = malloc(sizeof *order * (size_t)(n ? n : 1));
	if (!order)
		return planrt_error_(planrt_system_error, "out of memory writing '%s'", path);
	for (int i = 0; i < n; i++)
		order[i] = i;
	sort_base = tensors;
	/* duplicate names: adjacent in name order */
	qsort(order, (size_t)n, sizeof *order, cmp_name);
	for (int k = 1; k < n; k++)
		if (!strcmp(tensors[order[k]].name, tensors[order[k - 1]].name)) {
			planrt_result_t r = planrt_error_(planrt_invalid_argument,
							  "planrt_st_write('%s'): two tensors are named '%s'", path,
							  tensors[order[k]].name);
			free(order);
			return r;
		}
	qsort(order, (size_t)n, sizeof *order, cmp_layout);
	size_t hlen = 0;
	char *header = build_header(path, tensors, order, n, &hlen, meta_key, meta_value, checksum, checksum_n);
	if (!header) {
		free(order);
		return planrt_system_error;
	}

	/* planrt_outfile: a temporary file beside the target, renamed over it (a device in place) */
	planrt_outfile_t out;
	char why[1024] = "";
	const char *step = "create";
	int err = 0;
	FILE *fp = NULL;
	int opened = planrt_outfile_open(&out, "the file", path, (long)getpid(), why, sizeof why) == 0;
	if (!opened || !(fp = planrt_outfile_stream(&out, why, sizeof why)))
		goto fail;
	unsigned char len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	step = "write";
	if (fwrite(len8, 1, 8, fp) != 8 || fwrite(header, 1, hlen, fp) != hlen) {
		err = errno;
		goto fail;
	}
	for (int k = 0; k < n; k++) {
		const planrt_st_tensor_t *t = &tensors[order[k]];
		int e = tensor_chunks(t, write_chunk, fp);
		if (e) {
			err = e;
			goto fail;
		}
	}
	if (planrt_outfile_commit(&out, why, sizeof why) != 0) {
		opened = 0; /* the commit removed the temporary file */
		goto fail;
	}
	free(header);
	free(order);
	return planrt_success;
fail:
	if (opened)
		planrt_outfile_discard(&out);
	if (why[0])
		planrt_error_(planrt_io_error, "cannot write checkpoint '%s': %s", path, why);
	else
		planrt_error_(planrt_io_error,
			      "cannot write checkpoint '%s' (%s of '%s' failed: %s); check free space and permissions of its "
			      "directory",
			      path, step, out.tmp, err ? strerror(err) : "short write");
	free(header);
	free(order);
	return planrt_io_error;
}

/* For data sets (dataset.c): tensor i of an open file, its dtype's name ("F32", "I64", ...), shape
 * and data in the mapped file (validated by planrt_st_open). */
int planrt_st_count(planrt_st_t f)
{
	return f ? f->n : 0;
}

void planrt_st_raw(planrt_st_t f, int i, const char **name, const char **dtype, int *rank, int64_t *dims,
		   const void **data)
{
	const entry_t *e = &f->t[i];
	*name = e->name;
	*dtype = dtypes[e->dtype].name;
	*rank = e->rank;
	for (int d = 0; d < e->rank; d++)
		dims[d] = e->dims[d];
	*data = f->data + e->begin;
}
