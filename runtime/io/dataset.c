/* dataset.c: data sets of named tensors (planrt_dataset.h) and planrt_load_data's work for them.
 *
 * A data set is read once: a .safetensors file through safetensors.c (mapped and validated), or a
 * directory of NAME.npy files, each mapped and its header parsed here (magic, version 1-3, the
 * dict's descr, fortran_order and shape; little-endian or single-byte dtypes, C order). A tensor
 * is then a dtype, a shape and a pointer into a mapping. When an input is loaded for the first time
 * it is checked against the model (a tensor of that name, the sample dims, a dtype of the right
 * kind, integers that fit i32, labels in [0, classes), token ids inside the embedding table they
 * index); then every load copies the rows data.c chose for the step (or the held-out batch), so
 * the batch does not depend on the plan and a data-parallel rank gets exactly its rows. */
#define PLANRT_INTERNAL
#include "planrt_dataset.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_DIMS = 8, MAX_TENSORS = 64 };

/* element kinds of a file's tensors */
typedef enum { K_F64, K_F32, K_F16, K_BF16, K_I64, K_I32, K_I16, K_I8, K_U8, K_BOOL, K_OTHER } elem_t;

static const struct {
	const char *st, *npy; /* safetensors' name, numpy's descr (without the byte order) */
	size_t size;
	int is_float;
} elems[] = {
	[K_F64] = {"F64", "f8", 8, 1}, [K_F32] = {"F32", "f4", 4, 1},  [K_F16] = {"F16", "f2", 2, 1},
	[K_BF16] = {"BF16", NULL, 2, 1}, [K_I64] = {"I64", "i8", 8, 0}, [K_I32] = {"I32", "i4", 4, 0},
	[K_I16] = {"I16", "i2", 2, 0},  [K_I8] = {"I8", "i1", 1, 0},   [K_U8] = {"U8", "u1", 1, 0},
	[K_BOOL] = {"BOOL", "b1", 1, 0},
};

typedef struct tensor {
	char name[256];
	elem_t elem;
	char type[32]; /* as the file names it, for messages */
	int rank;
	int64_t dims[MAX_DIMS];
	const unsigned char *data;
	void *map; /* .npy: the mapping to release */
	size_t map_size;
	int checked; /* loaded before: checked against the model */
} tensor_t;

struct planrt_dataset {
	char *path;
	planrt_st_t st;
	tensor_t t[MAX_TENSORS];
	int n;
	int64_t samples;
};

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && !strcmp(s + n - m, suffix);
}

int planrt_dataset_path(const char *path)
{
	struct stat st;
	return ends_with(path, ".safetensors") || ends_with(path, ".npy") ||
	       (stat(path, &st) == 0 && S_ISDIR(st.st_mode));
}

int64_t planrt_dataset_samples(planrt_dataset_t d)
{
	return d ? d->samples : 0;
}

const char *planrt_shape_text_(int rank, const int64_t *dims, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < rank && len < n; i++)
		len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)dims[i]);
	if (len < n)
		snprintf(buf + len, n - len, "]");
	return buf;
}

/* ------------------------------------------------------------------ .npy */

/* the value of 'key': in a numpy header dict (a Python literal) */
static const char *dict_value(const char *h, const char *key)
{
	char pat[32];
	snprintf(pat, sizeof pat, "'%s':", key);
	const char *at = strstr(h, pat);
	if (!at)
		return NULL;
	at += strlen(pat);
	while (*at == ' ')
		at++;
	return at;
}

static planrt_result_t npy_open(const char *path, const char *name, tensor_t *t)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return planrt_error_(planrt_io_error, "cannot open data '%s': %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size < 16) {
		close(fd);
		return planrt_error_(planrt_format_error, "data '%s' is not a .npy file (too short)", path);
	}
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return planrt_error_(planrt_io_error, "cannot map data '%s': %s", path, strerror(errno));
	const unsigned char *b = map;
	size_t size = (size_t)st.st_size, hlen, at;
/* the error, written before the file is unmapped (its arguments may read the header) */
#define NPY_FAIL(...)                                                                      \
	do {                                                                               \
		planrt_result_t failed_ = planrt_error_(planrt_format_error, __VA_ARGS__); \
		munmap(map, size);                                                         \
		return failed_;                                                            \
	} while (0)
	if (memcmp(b, "\x93NUMPY", 6))
		NPY_FAIL("data '%s' is not a .npy file (no \\x93NUMPY magic); write it with numpy.save", path);
	if (b[6] == 1) {
		hlen = (size_t)(b[8] | b[9] << 8);
		at = 10;
	} else if (b[6] == 2 || b[6] == 3) {
		hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
		at = 12;
	} else {
		NPY_FAIL("data '%s': .npy version %d is not known (1 to 3 are)", path, b[6]);
	}
	if (hlen > 65536 || at + hlen > size)
		NPY_FAIL("data '%s': the .npy header runs past the file", path);
	char h[65537];
	memcpy(h, b + at, hlen);
	h[hlen] = 0;
	const char *descr = dict_value(h, "descr"), *fortran = dict_value(h, "fortran_order"),
		   *shape = dict_value(h, "shape");
	if (!descr || !fortran || !shape || *descr != '\'' || *shape != '(')
		NPY_FAIL("data '%s': the .npy header has no descr, fortran_order and shape", path);
	if (!strncmp(fortran, "True", 4))
		NPY_FAIL("data '%s' is in Fortran order; save a C-ordered array (numpy.ascontiguousarray)", path);
	char type[32] = "";
	sscanf(descr + 1, "%31[^']", type);
	t->elem = K_OTHER;
	char order = type[0];
	for (int k = 0; k < K_OTHER; k++)
		if (elems[k].npy && !strcmp(type + 1, elems[k].npy) &&
		    (order == '<' || order == '|' || order == '=')) /* '=': native, little-endian here */
			t->elem = (elem_t)k;
	if (t->elem == K_OTHER)
		NPY_FAIL("data '%s' holds numpy dtype '%s'; a data set holds little-endian float64/32/16, int64/32/16/8, "
			 "uint8 or bool",
			 path, type);
	snprintf(t->type, sizeof t->type, "%s", type);
	t->rank = 0;
	const char *p = shape + 1;
	while (*p && *p != ')') {
		while (*p == ' ' || *p == ',')
			p++;
		if (*p == ')')
			break;
		char *end;
		long long v = strtoll(p, &end, 10);
		if (end == p || v < 0 || t->rank == MAX_DIMS)
			NPY_FAIL("data '%s': cannot read the .npy shape %.40s", path, shape);
		t->dims[t->rank++] = v;
		p = end;
	}
	/* the elements the shape counts, at most what the file holds after the header (each product
	 * checked against that room: a shape whose product overflows is refused, not wrapped) */
	size_t data_at = at + hlen;
	uint64_t n = 1, room = (size - data_at) / elems[t->elem].size;
	int fits = 1;
	for (int d = 0; d < t->rank; d++)
		if (t->dims[d] == 0)
			n = 0;
	for (int d = 0; d < t->rank && n; d++) {
		fits = n <= room / (uint64_t)t->dims[d];
		if (!fits)
			break;
		n *= (uint64_t)t->dims[d];
	}
	if (!fits || n > room)
		NPY_FAIL("data '%s': shape %s needs more data than the file's %zu bytes after its header", path,
			 planrt_shape_text_(t->rank, t->dims, (char[128]){0}, 128), size - data_at);
#undef NPY_FAIL
	snprintf(t->name, sizeof t->name, "%s", name);
	t->data = b + data_at;
	t->map = map;
	t->map_size = size;
	return planrt_success;
}

/* ------------------------------------------------------------------ opening */

static elem_t st_elem(const char *type)
{
	for (int k = 0; k < K_OTHER; k++)
		if (!strcmp(elems[k].st, type))
			return (elem_t)k;
	return K_OTHER;
}

planrt_result_t planrt_dataset_open(const char *path, planrt_dataset_t *out)
{
	*out = NULL;
	planrt_dataset_t d = calloc(1, sizeof *d);
	if (!d || !(d->path = strdup(path))) {
		free(d);
		return planrt_error_(planrt_system_error, "out of memory opening data '%s'", path);
	}
	planrt_result_t r = planrt_success;
	struct stat st;
	if (stat(path, &st) != 0) {
		r = planrt_error_(planrt_io_error, "cannot open data '%s': %s; pass an existing file with --data", path,
				  strerror(errno));
	} else if (S_ISDIR(st.st_mode)) { /* NAME.npy files */
		DIR *dir = opendir(path);
		struct dirent *de;
		if (!dir)
			r = planrt_error_(planrt_io_error, "cannot read data directory '%s': %s", path, strerror(errno));
		while (r == planrt_success && dir && (de = readdir(dir))) {
			size_t len = strlen(de->d_name);
			if (len < 5 || !ends_with(de->d_name, ".npy") || len - 4 >= sizeof d->t[0].name)
				continue;
			if (d->n == MAX_TENSORS) {
				r = planrt_error_(planrt_format_error, "data '%s' has more than %d .npy files", path, MAX_TENSORS);
				break;
			}
			char name[256], file[4096];
			snprintf(name, sizeof name, "%.*s", (int)(len - 4), de->d_name);
			snprintf(file, sizeof file, "%s/%s", path, de->d_name);
			r = npy_open(file, name, &d->t[d->n]);
			if (r == planrt_success)
				d->n++;
		}
		if (dir)
			closedir(dir);
		if (r == planrt_success && d->n == 0)
			r = planrt_error_(planrt_io_error,
					  "data '%s' is a directory without .npy files; pass a text file, a nanoGPT .bin token "
					  "file, a .safetensors data set or a directory of NAME.npy files (one per model input)",
					  path);
	} else if (ends_with(path, ".npy")) {
		r = planrt_error_(planrt_invalid_usage,
				  "data '%s' is one .npy file; a data set is a directory of NAME.npy files, one per model "
				  "input (or a .safetensors file)",
				  path);
	} else if ((r = planrt_st_open(path, &d->st)) == planrt_success) {
		for (int i = 0; i < planrt_st_count(d->st) && r == planrt_success; i++) {
			if (d->n == MAX_TENSORS) {
				r = planrt_error_(planrt_format_error, "data '%s' has more than %d tensors", path, MAX_TENSORS);
				break;
			}
			tensor_t *t = &d->t[d->n++];
			const char *name, *type;
			const void *data;
			planrt_st_raw(d->st, i, &name, &type, &t->rank, t->dims, &data);
			snprintf(t->name, sizeof t->name, "%s", name);
			snprintf(t->type, sizeof t->type, "%s", type);
			t->elem = st_elem(type);
			t->data = data;
		}
	}
	/* every tensor has samples along its first dim, the same number */
	for (int i = 0; i < d->n && r == planrt_success; i++) {
		const tensor_t *t = &d->t[i];
		if (t->rank < 1 || t->dims[0] < 1)
			r = planrt_error_(planrt_format_error, "data '%s': tensor '%s' of shape %s has no samples (its first dim "
					  "counts them)", path, t->name, planrt_shape_text_(t->rank, t->dims, (char[128]){0}, 128));
		else if (i > 0 && t->dims[0] != d->samples)
			r = planrt_error_(planrt_format_error,
					  "data '%s': tensor '%s' has %lld samples but '%s' has %lld; every tensor of a data set "
					  "has one row per sample",
					  path, t->name, (long long)t->dims[0], d->t[0].name, (long long)d->samples);
		else
			d->samples = t->dims[0];
	}
	if (r != planrt_success) {
		planrt_dataset_close(d);
		return r;
	}
	*out = d;
	return planrt_success;
}

void planrt_dataset_close(planrt_dataset_t d)
{
	if (!d)
		return;
	for (int i = 0; i < d->n; i++)
		if (d->t[i].map)
			munmap(d->t[i].map, d->t[i].map_size);
	planrt_st_close(d->st);
	free(d->path);
	free(d);
}

/* ------------------------------------------------------------------ values */

static double float_at(const tensor_t *t, int64_t i)
{
	const unsigned char *p = t->data + (size_t)i * elems[t->elem].size;
	switch (t->elem) {
	case K_F64: {
		double v;
		memcpy(&v, p, 8);
		return v;
	}
	case K_F32: {
		float v;
		memcpy(&v, p, 4);
		return v;
	}
	case K_F16:
	case K_BF16: {
		uint16_t h;
		memcpy(&h, p, 2);
		return planrt_half_to_f32_(h, t->elem == K_F16 ? planrt_f16 : planrt_bf16);
	}
	default:
		return 0;
	}
}

static int64_t int_at(const tensor_t *t, int64_t i)
{
	const unsigned char *p = t->data + (size_t)i * elems[t->elem].size;
	switch (t->elem) {
	case K_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		return v;
	}
	case K_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	case K_I16: {
		int16_t v;
		memcpy(&v, p, 2);
		return v;
	}
	case K_I8:
		return (int8_t)*p;
	default:
		return *p;
	}
}

/* the position of flat element i of a tensor, "[sample, ...]" */
static const char *position(const tensor_t *t, int64_t i, char *buf, size_t n)
{
	int64_t idx[MAX_DIMS];
	for (int d = t->rank - 1; d >= 0; d--) {
		idx[d] = i % t->dims[d];
		i /= t->dims[d];
	}
	return planrt_shape_text_(t->rank, idx, buf, n);
}

static const tensor_t *find(planrt_dataset_t d, const char *name)
{
	for (int i = 0; i < d->n; i++)
		if (!strcmp(d->t[i].name, name))
			return &d->t[i];
	return NULL;
}

/* The checks of input `name` against the data set, once. */
static void check_input(planrt_dataset_t d, tensor_t *t, const char *name, planrt_dtype_t want, int rank,
			const int64_t *gdims, int64_t classes)
{
	char a[128], b[128];
	int ok = t->rank == rank;
	for (int i = 1; ok && i < rank; i++)
		ok = t->dims[i] == gdims[i];
	if (!ok) {
		int64_t sample[MAX_DIMS];
		sample[0] = t->dims[0];
		for (int i = 1; i < rank; i++)
			sample[i] = gdims[i];
		planrt_fatal("data '%s': tensor '%s' has shape %s but input '%s' needs %s (samples first, then the input's "
			     "dims after the batch dim)",
			     d->path, t->name, planrt_shape_text_(t->rank, t->dims, a, sizeof a), name,
			     planrt_shape_text_(rank, sample, b, sizeof b));
	}
	int float_input = want != planrt_i32;
	/* integers feed float inputs too (a 0/1 mask, as torch's .float()); floats never feed i32 */
	if (t->elem == K_OTHER || (elems[t->elem].is_float && !float_input))
		planrt_fatal("data '%s': tensor '%s' holds %s but input '%s' is %s; give it %s values", d->path, t->name,
			     t->type, name, float_input ? "floating point" : "i32",
			     float_input ? "float (F32, F64, F16 or BF16) or integer" : "integer (I64, I32, I16, I8, U8 or BOOL)");
	int64_t n = 1;
	for (int i = 0; i < t->rank; i++)
		n *= t->dims[i];
	for (int64_t i = 0; !float_input && i < n; i++) {
		int64_t v = int_at(t, i);
		if (v < INT32_MIN || v > INT32_MAX)
			planrt_fatal("data '%s': value %lld of '%s' at %s does not fit input '%s' (i32)", d->path, (long long)v,
				     t->name, position(t, i, a, sizeof a), name);
		if (classes < 0 && (v < 0 || v >= -classes))
			planrt_fatal("data '%s': token id %lld of '%s' at %s (sample %lld) is outside the embedding table's %lld "
				     "rows [0, %lld) that input '%s' indexes; fix the data or the model's vocabulary",
				     d->path, (long long)v, t->name, position(t, i, a, sizeof a),
				     (long long)(i / (n / t->dims[0])), (long long)-classes, (long long)-classes, name);
		if (classes > 0 && (v < 0 || v >= classes))
			planrt_fatal("data '%s': label %lld of '%s' at %s (sample %lld) is outside [0, %lld): its "
				     "cross_entropy has %lld classes; fix the labels or the model's number of classes",
				     d->path, (long long)v, t->name, position(t, i, a, sizeof a),
				     (long long)(i / (n / t->dims[0])), (long long)classes, (long long)classes);
	}
	t->checked = 1;
}

/* ------------------------------------------------------------------ loading */

void planrt_dataset_load_(planrt_dataset_t d, const int64_t *samples, void *dst, const char *name, planrt_dtype_t t,
			  int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes)
{
	tensor_t *x = (tensor_t *)find(d, name);
	if (!x) {
		char names[512];
		size_t len = 0;
		names[0] = 0;
		for (int i = 0; i < d->n && len < sizeof names; i++)
			len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", i ? ", " : "", d->t[i].name);
		planrt_fatal("data '%s' has no tensor '%s' for the model's input '%s' (it has %s)", d->path, name, name,
			     names);
	}
	if (!x->checked)
		check_input(d, x, name, t, rank, gdims, classes);
	if (rank > MAX_DIMS)
		planrt_fatal("internal error: input '%s' of rank %d", name, rank);
	/* one sample's block: dims 1.. of the local block at offs 1.. */
	int64_t sample_elems = 1, block = 1;
	for (int i = 1; i < rank; i++) {
		sample_elems *= gdims[i];
		block *= ldims[i];
	}
	size_t esize = planrt_dtype_size(t);
	unsigned char *out = dst;
	for (int64_t r = 0; r < ldims[0]; r++) {
		int64_t sample = samples[r];
		for (int64_t j = 0; j < block; j++) {
			/* element j of the block: its index in the sample */
			int64_t rest = j, at = 0, stride = 1;
			for (int i = rank - 1; i >= 1; i--) {
				at += (offs[i] + rest % ldims[i]) * stride;
				rest /= ldims[i];
				stride *= gdims[i];
			}
			int64_t src = sample * sample_elems + at;
			unsigned char *o = out + (size_t)(r * block + j) * esize;
			if (t == planrt_i32) {
				int32_t v = (int32_t)int_at(x, src);
				memcpy(o, &v, 4);
			} else if (t == planrt_f32) {
				float v = elems[x->elem].is_float ? (float)float_at(x, src) : (float)int_at(x, src);
				memcpy(o, &v, 4);
			} else {
				float f = elems[x->elem].is_float ? (float)float_at(x, src) : (float)int_at(x, src);
				uint16_t h = planrt_f32_to_half_(f, t);
				memcpy(o, &h, 2);
			}
		}
	}
}

int planrt_dataset_has_(planrt_dataset_t d, const char *name)
{
	return find(d, name) != NULL;
}

/* padding_mask [B, 1, 1, S] (or [B, S]): 0 on the first lengths[sample] keys, -inf after them */
void planrt_dataset_padding_mask_(planrt_dataset_t d, const int64_t *samples, void *dst, planrt_dtype_t t, int rank,
				  const int64_t *gdims, const int64_t *ldims, const int64_t *offs)
{
	char a[128];
	const tensor_t *len = find(d, "lengths");
	int64_t keys = gdims[rank - 1];
	int shape_ok = t != planrt_i32 && (rank == 2 || (rank == 4 && gdims[1] == 1 && gdims[2] == 1));
	if (!len || !shape_ok || len->rank != 1 || elems[len->elem].is_float)
		planrt_fatal("input 'padding_mask' (%s %s): data '%s' has no tensor of that name%s; give it one, or an integer "
			     "tensor 'lengths' [N] and declare the input f32[B, 1, 1, S] (docs/data.md)",
			     t == planrt_i32 ? "i32" : "float", planrt_shape_text_(rank, gdims, a, sizeof a), d->path,
			     len ? " and its 'lengths' is not integers [N]" : "");
	size_t esize = planrt_dtype_size(t);
	float neg = -INFINITY, zero = 0.0f;
	uint16_t neg_half = t == planrt_f32 ? 0 : planrt_f32_to_half_(neg, t),
		 zero_half = t == planrt_f32 ? 0 : planrt_f32_to_half_(zero, t);
	int64_t per_row = 1;
	for (int i = 1; i < rank; i++)
		per_row *= ldims[i];
	for (int64_t r = 0; r < ldims[0]; r++) {
		int64_t n = int_at(len, samples[r]);
		if (n < 1 || n > keys)
			planrt_fatal("data '%s': lengths[%lld] = %lld is outside [1, %lld] (the input's %lld positions)", d->path,
				     (long long)samples[r], (long long)n, (long long)keys, (long long)keys);
		for (int64_t j = 0; j < per_row; j++) {
			int open = offs[rank - 1] + j % ldims[rank - 1] < n;
			unsigned char *o = (unsigned char *)dst + (size_t)(r * per_row + j) * esize;
			if (t == planrt_f32)
				memcpy(o, open ? &zero : &neg, 4);
			else
				memcpy(o, open ? &zero_half : &neg_half, 2);
		}
	}
}
