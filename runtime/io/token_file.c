/* token_file.c: one token file, mapped and checked (planrt_tokens.h).
 *
 * The format is told by the name and the bytes, in this order:
 *   - PREFIX.idx, or PREFIX / PREFIX.bin with PREFIX.idx beside it: Megatron-LM's indexed data set.
 *     The index is "MMIDIDX\0\0", version u64 = 1, the token dtype code u8 (1 uint8, 2 int8,
 *     3 int16, 4 int32, 5 int64, 8 uint16), the sequence count u64, the document count u64 (the
 *     length of the document index, one more than the documents), then int32 lengths[sequences],
 *     int64 byte pointers[sequences] into the .bin and int64 document_index[documents + 1] (the
 *     first sequence of each document, then the sequence count). Every field is checked against the
 *     others and against the .bin's size; the sequences must lie back to back, as Megatron's
 *     builder writes them.
 *   - a .bin whose first int32 is 20240520 (version 1, uint16) or 20240801 (version 7, uint32),
 *     with the token count in the third and the tokens after 1024 bytes: an llm.c shard;
 *   - any other .bin: nanoGPT's raw little-endian uint16 tokens;
 *   - anything else: text, each byte a token. */
#include "planrt_tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct planrt_tokens {
	char *path;
	const char *format;
	void *map, *idx_map;
	size_t map_size, idx_size;
	const unsigned char *base; /* the first token */
	int esize, is_signed;
	int64_t ntok;
	/* Megatron: the index's arrays (in idx_map) */
	int64_t nseq, ndocs;
	const unsigned char *seq_ptr, *doc_index; /* int64 little-endian arrays, maybe unaligned */
};

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && !strcmp(s + n - m, suffix);
}

static int64_t i64_at(const unsigned char *p, int64_t i)
{
	int64_t v;
	memcpy(&v, p + 8 * i, 8);
	return v;
}

/* Maps path read-only; an empty file maps to NULL with size 0. */
static planrt_result_t map_file(const char *path, const char *what, void **map, size_t *size)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return planrt_error_(planrt_io_error, "cannot open %s '%s': %s; pass an existing file with --data", what, path,
				     strerror(errno));
	if (S_ISDIR(st.st_mode))
		return planrt_error_(planrt_io_error,
				     "%s '%s' is a directory; pass a text file, a token file (.bin) or a Megatron prefix", what,
				     path);
	if (!S_ISREG(st.st_mode)) /* a FIFO or a device would block the open or never end */
		return planrt_error_(planrt_io_error,
				     "%s '%s' is not a regular file (a FIFO, socket or device); pass a text or token file", what,
				     path);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return planrt_error_(planrt_io_error, "cannot open %s '%s': %s; check the path and its permissions", what, path,
				     strerror(errno));
	*size = (size_t)st.st_size;
	*map = NULL;
	if (*size) {
		void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			close(fd);
			return planrt_error_(planrt_io_error, "cannot map %s '%s': %s", what, path, strerror(errno));
		}
		*map = m;
	}
	close(fd);
	return planrt_success;
}

/* the Megatron prefix of path, when PREFIX.idx exists (path: PREFIX, PREFIX.bin or PREFIX.idx) */
static int megatron_prefix(const char *path, char *prefix, size_t n)
{
	size_t len = strlen(path);
	if (ends_with(path, ".idx") || ends_with(path, ".bin"))
		len -= 4;
	if (len + 5 > n)
		return 0;
	char idx[4104];
	snprintf(prefix, n, "%.*s", (int)len, path);
	snprintf(idx, sizeof idx, "%.4096s.idx", prefix);
	struct stat st;
	return stat(idx, &st) == 0;
}

/* the error, written before t is closed (its arguments read t's fields) */
#define FAIL(...)                                                                         \
	do {                                                                              \
		planrt_result_t failed_ = planrt_error_(planrt_format_error, __VA_ARGS__); \
		planrt_tokens_close_(t);                                                  \
		return failed_;                                                           \
	} while (0)

/* Megatron-LM's .idx and .bin: the header, the arrays against each other and the .bin's size */
static planrt_result_t open_megatron(planrt_tokens_t *t, const char *prefix)
{
	static const struct {
		int code, size, is_signed;
	} codes[] = {{1, 1, 0}, {2, 1, 1}, {3, 2, 1}, {4, 4, 1}, {5, 8, 1}, {8, 2, 0}};
	char idx[4104], bin[4104];
	snprintf(idx, sizeof idx, "%.4096s.idx", prefix);
	snprintf(bin, sizeof bin, "%.4096s.bin", prefix);
	planrt_result_t r = map_file(idx, "Megatron index", &t->idx_map, &t->idx_size);
	if (r == planrt_success)
		r = map_file(bin, "Megatron data", &t->map, &t->map_size);
	if (r != planrt_success) {
		planrt_tokens_close_(t);
		return r;
	}
	const unsigned char *h = t->idx_map;
	if (t->idx_size < 34 || memcmp(h, "MMIDIDX\0\0", 9))
		FAIL("data '%s' is not a Megatron index (no MMIDIDX header); write it with Megatron-LM's "
		     "tools/preprocess_data.py or planc data tokenize",
		     idx);
	uint64_t version, nseq, ndoc;
	memcpy(&version, h + 9, 8);
	memcpy(&nseq, h + 18, 8);
	memcpy(&ndoc, h + 26, 8);
	if (version != 1)
		FAIL("data '%s': Megatron index version %llu is not known (1 is)", idx, (unsigned long long)version);
	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
		if (codes[i].code == h[17]) {
			t->esize = codes[i].size;
			t->is_signed = codes[i].is_signed;
		}
	if (!t->esize)
		FAIL("data '%s': token dtype code %d is not an integer type (1-5 or 8)", idx, h[17]);
	if (nseq > (1ull << 40) || ndoc > (1ull << 40) || ndoc < 1 || 34 + 12 * nseq + 8 * ndoc > t->idx_size)
		FAIL("data '%s': %llu sequences and %llu document entries do not fit the index's %zu bytes; the index is "
		     "truncated or not Megatron's",
		     idx, (unsigned long long)nseq, (unsigned long long)ndoc, t->idx_size);
	const unsigned char *lengths = h + 34;
	t->seq_ptr = lengths + 4 * nseq;
	t->doc_index = t->seq_ptr + 8 * nseq;
	t->nseq = (int64_t)nseq;
	t->ndocs = (int64_t)ndoc - 1;
	int64_t at = 0;
	for (int64_t i = 0; i < t->nseq; i++) {
		int32_t len;
		memcpy(&len, lengths + 4 * i, 4);
		if (len < 0 || i64_at(t->seq_ptr, i) != at * t->esize)
			FAIL("data '%s': sequence %lld (length %d, pointer %lld) does not follow the one before; planrt reads "
			     "sequences written back to back (Megatron's builder writes them so)",
			     idx, (long long)i, len, (long long)i64_at(t->seq_ptr, i));
		at += len;
	}
	if ((uint64_t)at * (uint64_t)t->esize != t->map_size)
		FAIL("data '%s' has %zu bytes but its index '%s' counts %lld tokens of %d bytes; the two files are not a pair",
		     bin, t->map_size, idx, (long long)at, t->esize);
	for (int64_t d = 0; d <= t->ndocs; d++) {
		int64_t s = i64_at(t->doc_index, d);
		if (s < 0 || s > t->nseq || (d > 0 && s < i64_at(t->doc_index, d - 1)) || (d == 0 && s != 0) ||
		    (d == t->ndocs && s != t->nseq))
			FAIL("data '%s': document index entry %lld (sequence %lld) is out of order; the index is corrupt", idx,
			     (long long)d, (long long)s);
	}
	t->format = "megatron";
	t->base = t->map;
	t->ntok = at;
	return planrt_success;
}

/* an llm.c shard's header, when the file starts with one (0: not llm.c) */
static int llmc_header(const planrt_tokens_t *t, int64_t *ntok, int *esize)
{
	if (t->map_size < 1024)
		return 0;
	int32_t head[3];
	memcpy(head, t->map, sizeof head);
	if (!((head[0] == 20240520 && head[1] == 1) || (head[0] == 20240801 && head[1] == 7)))
		return 0;
	*ntok = head[2];
	*esize = head[0] == 20240520 ? 2 : 4;
	return 1;
}

static planrt_result_t open_plain(planrt_tokens_t *t, const char *path)
{
	planrt_result_t r = map_file(path, "data", &t->map, &t->map_size);
	if (r != planrt_success) {
		planrt_tokens_close_(t);
		return r;
	}
	int64_t ntok;
	int esize;
	if (ends_with(path, ".bin") && llmc_header(t, &ntok, &esize)) {
		if (ntok < 0 || (uint64_t)ntok * (uint64_t)esize != t->map_size - 1024)
			FAIL("data '%s': its llm.c header counts %lld tokens of %d bytes but the file holds %zu bytes after the "
			     "header; the shard is truncated",
			     path, (long long)ntok, esize, t->map_size - 1024);
		t->format = "llm.c";
		t->base = (const unsigned char *)t->map + 1024;
		t->esize = esize;
		t->ntok = ntok;
	} else if (ends_with(path, ".bin")) {
		if (t->map_size % 2)
			FAIL("data '%s' has an odd size (%zu bytes) but a .bin file holds uint16 tokens; regenerate it "
			     "(nanoGPT prepare.py) or rename it if it is text",
			     path, t->map_size);
		t->format = "nanogpt";
		t->base = t->map;
		t->esize = 2;
		t->ntok = (int64_t)(t->map_size / 2);
	} else {
		t->format = "text";
		t->base = t->map;
		t->esize = 1;
		t->ntok = (int64_t)t->map_size;
	}
	return planrt_success;
}

static int64_t token_at(const planrt_tokens_t *t, int64_t i)
{
	const unsigned char *p = t->base + (size_t)i * (size_t)t->esize;
	switch (t->esize) {
	case 1:
		return t->is_signed ? (int8_t)*p : *p;
	case 2: {
		uint16_t v;
		memcpy(&v, p, 2);
		return t->is_signed ? (int16_t)v : v;
	}
	case 4: {
		uint32_t v;
		memcpy(&v, p, 4);
		return t->is_signed ? (int64_t)(int32_t)v : (int64_t)v;
	}
	default: {
		int64_t v;
		memcpy(&v, p, 8);
		return v;
	}
	}
}

planrt_result_t planrt_tokens_open_(const char *path, int64_t vocab, planrt_tokens_t **out)
{
	*out = NULL;
	planrt_tokens_t *t = calloc(1, sizeof *t);
	if (!t || !(t->path = strdup(path))) {
		free(t);
		return planrt_error_(planrt_system_error, "out of memory opening data '%s'", path);
	}
	char prefix[4096];
	planrt_result_t r = megatron_prefix(path, prefix, sizeof prefix) ? open_megatron(t, prefix) : open_plain(t, path);
	if (r != planrt_success)
		return r; /* t is closed */
	int text = !strcmp(t->format, "text");
	for (int64_t i = 0; i < t->ntok; i++) {
		int64_t v = token_at(t, i);
		if (v < 0 || v >= vocab)
			FAIL(text ? "data '%s': byte %lld at offset %lld is outside the model's vocabulary of %lld; a text file "
				    "needs V >= 256"
				  : "data '%s': token %lld at position %lld is outside the model's vocabulary of %lld; tokenize "
				    "with the model's tokenizer or raise the vocabulary V",
			     path, (long long)v, (long long)i, (long long)vocab);
	}
	*out = t;
	return planrt_success;
}
#undef FAIL

void planrt_tokens_close_(planrt_tokens_t *t)
{
	if (!t)
		return;
	if (t->map)
		munmap(t->map, t->map_size);
	if (t->idx_map)
		munmap(t->idx_map, t->idx_size);
	free(t->path);
	free(t);
}

int64_t planrt_tokens_count_(const planrt_tokens_t *t)
{
	return t->ntok;
}

const char *planrt_tokens_format_(const planrt_tokens_t *t)
{
	return t->format;
}

const char *planrt_tokens_path_(const planrt_tokens_t *t)
{
	return t->path;
}

void planrt_tokens_read_(const planrt_tokens_t *t, int64_t at, int64_t n, int32_t *dst)
{
	if (t->esize == 2 && !t->is_signed) { /* the common case, one pass */
		const unsigned char *p = t->base + 2 * (size_t)at;
		for (int64_t i = 0; i < n; i++)
			dst[i] = p[2 * i] | p[2 * i + 1] << 8;
		return;
	}
	for (int64_t i = 0; i < n; i++)
		dst[i] = (int32_t)token_at(t, at + i);
}

int64_t planrt_tokens_documents_(const planrt_tokens_t *t)
{
	return t->doc_index ? t->ndocs : 1;
}

/* the token where document d starts (d == ndocs: the end) */
static int64_t doc_first_token(const planrt_tokens_t *t, int64_t d)
{
	int64_t s = i64_at(t->doc_index, d);
	return s >= t->nseq ? t->ntok : i64_at(t->seq_ptr, s) / t->esize;
}

int64_t planrt_tokens_doc_start_(const planrt_tokens_t *t, int64_t pos)
{
	if (!t->doc_index)
		return 0;
	int64_t lo = 0, hi = t->ndocs - 1; /* the last document starting at or before pos */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo + 1) / 2;
		if (doc_first_token(t, mid) <= pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	return doc_first_token(t, lo);
}
