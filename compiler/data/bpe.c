/* bpe.c: GPT-2's byte-level BPE tokenizer (Radford et al. 2019, OpenAI's encoder.py), and a
 * trainer for vocabularies in its format.
 *
 * Text is cut into pieces by GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (first alternative that matches, leftmost; written out below as a scanner over UTF-8, where \s
 * is Unicode's White_Space and a byte that is not valid UTF-8 is a character of its own, neither
 * space, letter nor number). Each piece's bytes become GPT-2's printable byte characters (the
 * byte encoder), and the pair of adjacent symbols whose merge ranks first in merges.txt is merged,
 * everywhere in the piece, until no pair has a rank; the symbols are then looked up in vocab.json.
 * Training: the pieces of the corpus are counted, and the most frequent adjacent pair (ties: the
 * lower left id, then the lower right id) becomes the next merge, until the vocabulary has
 * vocab_size - 1 tokens; <|endoftext|> is the last. */
#include "data.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_TOKEN = 1024 };

/* ------------------------------------------------------------------ characters */

enum { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static int in_ranges(uint32_t c, const uint32_t (*r)[2], int n)
{
	int lo = 0, hi = n - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		if (c < r[mid][0])
			hi = mid - 1;
		else if (c > r[mid][1])
			lo = mid + 1;
		else
			return 1;
	}
	return 0;
}

static int is_white_space(uint32_t c)
{
	return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
	       c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The character at text[i] (strict UTF-8: no overlongs, surrogates or values past U+10FFFF; an
 * invalid byte is one character of class other): its class and byte length. */
static int char_at(const char *text, size_t n, size_t i, uint32_t *cp, size_t *len)
{
	const unsigned char *s = (const unsigned char *)text + i;
	size_t left = n - i;
	uint32_t c = s[0], min = 0;
	size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
	int ok = k > 0 && k <= left;
	if (ok && k > 1) {
		c &= 0x7F >> k;
		min = k == 2 ? 0x80 : k == 3 ? 0x800 : 0x10000;
		for (size_t j = 1; j < k && ok; j++) {
			ok = (s[j] & 0xC0) == 0x80;
			c = c << 6 | (s[j] & 0x3F);
		}
		ok = ok && c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
	}
	if (!ok) {
		*cp = 0xFFFFFFFF;
		*len = 1;
		return C_OTHER;
	}
	*cp = c;
	*len = k;
	if (is_white_space(c))
		return C_SPACE;
	if (in_ranges(c, bpe_letter_ranges, bpe_letter_ranges_count))
		return C_LETTER;
	if (in_ranges(c, bpe_number_ranges, bpe_number_ranges_count))
		return C_NUMBER;
	return C_OTHER;
}

static int class_at(const char *text, size_t n, size_t i, size_t *len)
{
	uint32_t cp;
	return char_at(text, n, i, &cp, len);
}

/* the end of the run of class k that starts at i */
static size_t run_end(const char *text, size_t n, size_t i, int k)
{
	size_t len;
	while (i < n && class_at(text, n, i, &len) == k)
		i += len;
	return i;
}

size_t bpe_next_piece(const char *text, size_t n, size_t i)
{
	size_t len, next_len;
	int k = class_at(text, n, i, &len);
	if (text[i] == '\'' && i + 1 < n) { /* 's 't 'm 'd, then 're 've 'll */
		char a = text[i + 1], b = i + 2 < n ? text[i + 2] : 0;
		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return i + 2;
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
			return i + 3;
	}
	if (text[i] == ' ' && i + 1 < n) { /* ' ?' before a letter, number or other run */
		int after = class_at(text, n, i + 1, &next_len);
		if (after != C_SPACE)
			return run_end(text, n, i + 1, after);
	}
	if (k != C_SPACE)
		return run_end(text, n, i, k);
	/* \s+(?!\S): the run, less its last character when a non-space follows and it is longer
	 * than one; \s+: the whole run */
	size_t end = i, last = i, chars = 0;
	while (end < n && class_at(text, n, end, &len) == C_SPACE) {
		last = end;
		end += len;
		chars++;
	}
	return end < n && chars > 1 ? last : end;
}

/* ------------------------------------------------------------------ GPT-2's byte characters */

/* byte b's character (GPT-2's bytes_to_unicode) as UTF-8, and the id order of the byte tokens:
 * the printable bytes first, in order, then the others */
static int byte_char(int b, char *out)
{
	int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
	int cp = b;
	if (!printable) {
		int k = 0;
		for (int x = 0; x < b; x++)
			k += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
		cp = 256 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xC0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

static int byte_order(int rank_of[256], int byte_at[256])
{
	int n = 0;
	for (int b = 0; b < 256; b++)
		if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
			byte_at[n++] = b;
	for (int b = 0; b < 256; b++)
		if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)))
			byte_at[n++] = b;
	for (int i = 0; i < 256; i++)
		rank_of[byte_at[i]] = i;
	return n;
}

/* ------------------------------------------------------------------ hash tables */

static uint64_t hash_bytes(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t hash_pair(uint64_t key)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	return key ^ key >> 33;
}

/* pair (a, b) -> value, open addressing; key 0 is empty (pairs are stored as key + 1) */
typedef struct PairMap {
	uint64_t *key;
	int64_t *val;
	size_t cap, n;
} PairMap;

static int pair_init(PairMap *m, size_t want)
{
	m->cap = 16;
	while (m->cap < 2 * want)
		m->cap *= 2;
	m->n = 0;
	m->key = calloc(m->cap, sizeof *m->key);
	m->val = calloc(m->cap, sizeof *m->val);
	return m->key && m->val ? 0 : -1;
}

static void pair_free(PairMap *m)
{
	free(m->key);
	free(m->val);
}

static int64_t *pair_slot(PairMap *m, int32_t a, int32_t b, int insert)
{
	uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
	for (size_t i = hash_pair(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (m->key[i] == k)
			return &m->val[i];
		if (!m->key[i]) {
			if (!insert)
				return NULL;
			m->key[i] = k;
			m->n++;
			return &m->val[i];
		}
	}
}

/* ------------------------------------------------------------------ the vocabulary */

struct Bpe {
	int n;                   /* tokens */
	char **text;             /* [n] each token's characters (UTF-8 of GPT-2's byte characters) */
	int32_t byte_token[256]; /* the token of each byte */
	PairMap merges;          /* (a, b) -> rank << 32 | merged id */
	int32_t eot;
	/* token text -> id, for loading */
	char **slot_text;
	int32_t *slot_id;
	size_t slots;
};

static int32_t vocab_find(const Bpe *b, const char *s)
{
	for (size_t i = hash_bytes(s, strlen(s)) & (b->slots - 1);; i = (i + 1) & (b->slots - 1)) {
		if (!b->slot_text[i])
			return -1;
		if (!strcmp(b->slot_text[i], s))
			return b->slot_id[i];
	}
}

void bpe_free(Bpe *b)
{
	if (!b)
		return;
	for (int i = 0; i < b->n; i++)
		free(b->text[i]);
	free(b->text);
	free(b->slot_text);
	free(b->slot_id);
	pair_free(&b->merges);
	free(b);
}

#define LOAD_FAIL(...)                          \
	do {                                    \
		snprintf(err, errn, __VA_ARGS__); \
		if (vocab)                      \
			json_decref(vocab);     \
		if (fp)                         \
			fclose(fp);             \
		bpe_free(b);                    \
		return NULL;                    \
	} while (0)

/* vocab.json: {"token": id, ...}, ids 0 .. n - 1 each once */
static int load_vocab(Bpe *b, json_t *vocab, char *err, size_t errn, const char *path)
{
	size_t n = json_object_size(vocab);
	b->n = (int)n;
	b->text = calloc(n ? n : 1, sizeof *b->text);
	b->slots = 16;
	while (b->slots < 2 * n)
		b->slots *= 2;
	b->slot_text = calloc(b->slots, sizeof *b->slot_text);
	b->slot_id = calloc(b->slots, sizeof *b->slot_id);
	if (!b->text || !b->slot_text || !b->slot_id) {
		snprintf(err, errn, "out of memory reading '%s'", path);
		return -1;
	}
	const char *key;
	json_t *value;
	json_object_foreach(vocab, key, value) {
		json_int_t id = json_integer_value(value);
		if (!json_is_integer(value) || id < 0 || id >= (json_int_t)n || b->text[id]) {
			snprintf(err, errn, "'%s': token '%s' has id %s; vocab.json maps each token to a distinct id in [0, %zu)",
				 path, key, json_is_integer(value) ? "out of range or repeated" : "that is not an integer", n);
			return -1;
		}
		if (!(b->text[id] = strdup(key))) {
			snprintf(err, errn, "out of memory reading '%s'", path);
			return -1;
		}
		size_t i = hash_bytes(key, strlen(key)) & (b->slots - 1);
		while (b->slot_text[i])
			i = (i + 1) & (b->slots - 1);
		b->slot_text[i] = b->text[id];
		b->slot_id[i] = (int32_t)id;
	}
	return 0;
}

Bpe *bpe_load(const char *dir, char *err, size_t errn)
{
	char path[4096], line[2 * MAX_TOKEN + 8];
	json_t *vocab = NULL;
	FILE *fp = NULL;
	json_error_t je;
	Bpe *b = calloc(1, sizeof *b);
	if (!b)
		LOAD_FAIL("out of memory");
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	if (!(vocab = json_load_file(path, 0, &je)) || !json_is_object(vocab))
		LOAD_FAIL("cannot read the vocabulary '%s': %s; --vocab names a directory with GPT-2's vocab.json and "
			  "merges.txt (planc data vocab writes one)",
			  path, vocab ? "not a JSON object" : je.text);
	if (load_vocab(b, vocab, err, errn, path) < 0) {
		json_decref(vocab);
		bpe_free(b);
		return NULL;
	}
	json_decref(vocab);
	vocab = NULL;
	int rank_of[256], byte_at[256];
	byte_order(rank_of, byte_at);
	for (int x = 0; x < 256; x++) {
		char c[3] = {0};
		byte_char(x, c);
		if ((b->byte_token[x] = vocab_find(b, c)) < 0)
			LOAD_FAIL("'%s/vocab.json' has no token for byte %d ('%s'); a byte-level BPE vocabulary holds all 256",
				  dir, x, c);
	}
	b->eot = vocab_find(b, "<|endoftext|>");
	snprintf(path, sizeof path, "%s/merges.txt", dir);
	if (!(fp = fopen(path, "r")))
		LOAD_FAIL("cannot read '%s'; --vocab names a directory with vocab.json and merges.txt", path);
	if (pair_init(&b->merges, (size_t)b->n) < 0)
		LOAD_FAIL("out of memory");
	int64_t rank = 0;
	int lineno = 0;
	while (fgets(line, sizeof line, fp)) {
		lineno++;
		line[strcspn(line, "\r\n")] = 0;
		if (!line[0] || (lineno == 1 && !strncmp(line, "#version", 8)))
			continue;
		char *space = strchr(line, ' '), merged[2 * MAX_TOKEN + 8];
		if (!space || strchr(space + 1, ' '))
			LOAD_FAIL("%s:%d: '%s' is not a merge (two tokens separated by one space)", path, lineno, line);
		*space = 0;
		snprintf(merged, sizeof merged, "%s%s", line, space + 1);
		int32_t l = vocab_find(b, line), r = vocab_find(b, space + 1), m = vocab_find(b, merged);
		if (l < 0 || r < 0 || m < 0)
			LOAD_FAIL("%s:%d: merge '%s %s' uses or makes a token that vocab.json does not have ('%s')", path, lineno,
				  line, space + 1, l < 0 ? line : r < 0 ? space + 1 : merged);
		if (b->merges.n * 2 >= b->merges.cap)
			LOAD_FAIL("%s: more merges than vocab.json has tokens", path);
		int64_t *v = pair_slot(&b->merges, l, r, 1);
		if (!*v) /* the first rank of a pair counts */
			*v = (rank << 32 | m) + 1;
		rank++;
	}
	fclose(fp);
	return b;
}
#undef LOAD_FAIL

int bpe_vocab_size(const Bpe *b)
{
	return b->n;
}

int32_t bpe_eot(const Bpe *b)
{
	return b->eot;
}

/* one piece's symbols merged in rank order (GPT-2's bpe()) */
static size_t merge_piece(const Bpe *b, int32_t *sym, size_t n)
{
	while (n > 1) {
		int64_t best = -1;
		for (size_t i = 0; i + 1 < n; i++) {
			int64_t *v = pair_slot((PairMap *)&b->merges, sym[i], sym[i + 1], 0);
			if (v && (best < 0 || *v < best))
				best = *v;
		}
		if (best < 0)
			break;
		int64_t rank_id = best - 1;
		int32_t merged = (int32_t)(rank_id & 0xFFFFFFFF);
		size_t out = 0;
		for (size_t i = 0; i < n; i++) {
			int64_t *v = i + 1 < n ? pair_slot((PairMap *)&b->merges, sym[i], sym[i + 1], 0) : NULL;
			if (v && *v == best) {
				sym[out++] = merged;
				i++;
			} else {
				sym[out++] = sym[i];
			}
		}
		n = out;
	}
	return n;
}

int bpe_encode(const Bpe *b, const char *text, size_t n, int32_t **ids, size_t *len, size_t *cap)
{
	int32_t *sym = NULL;
	size_t sym_cap = 0;
	for (size_t i = 0; i < n;) {
		size_t end = bpe_next_piece(text, n, i);
		if (end - i > sym_cap) {
			free(sym);
			sym_cap = 2 * (end - i);
			if (!(sym = malloc(sizeof *sym * sym_cap)))
				return -1;
		}
		size_t k = 0;
		for (size_t j = i; j < end; j++)
			sym[k++] = b->byte_token[(unsigned char)text[j]];
		k = merge_piece(b, sym, k);
		if (*len + k > *cap) {
			size_t grown = 2 * (*len + k) + 1024;
			int32_t *p = realloc(*ids, sizeof *p * grown);
			if (!p) {
				free(sym);
				return -1;
			}
			*ids = p;
			*cap = grown;
		}
		memcpy(*ids + *len, sym, sizeof *sym * k);
		*len += k;
		i = end;
	}
	free(sym);
	return 0;
}

/* a token's bytes: its GPT-2 characters decoded back (the special tokens are their own text) */
static void token_bytes(const Bpe *b, int32_t id, FILE *out)
{
	const unsigned char *s = (const unsigned char *)b->text[id];
	if (id == b->eot) {
		fputs((const char *)s, out);
		return;
	}
	for (size_t i = 0; s[i];) {
		uint32_t cp = s[i] < 0x80 ? s[i] : (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
		i += s[i] < 0x80 ? 1 : 2;
		for (int x = 0; x < 256; x++) {
			char c[3] = {0};
			int k = byte_char(x, c);
			uint32_t xc = k == 1 ? (unsigned char)c[0] : (uint32_t)((unsigned char)c[0] & 0x1F) << 6 | (c[1] & 0x3F);
			if (xc == cp) {
				fputc(x, out);
				break;
			}
		}
	}
}

int bpe_decode(const Bpe *b, const int32_t *ids, size_t n, FILE *out)
{
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= b->n)
			return -1;
		token_bytes(b, ids[i], out);
	}
	return 0;
}

/* ------------------------------------------------------------------ training */

typedef struct Piece {
	int32_t *sym;
	size_t n;
	int64_t count;
} Piece;

/* the distinct pieces of text and their counts, each as its byte tokens */
static Piece *count_pieces(const char *text, size_t n, const int32_t *byte_token, size_t *npieces)
{
	size_t cap = 1024, used = 0, slots = 4096;
	Piece *p = malloc(sizeof *p * cap);
	size_t *slot = calloc(slots, sizeof *slot); /* index + 1 into p, by the piece's bytes */
	const char **start = malloc(sizeof *start * cap);
	if (!p || !slot || !start)
		return NULL;
	for (size_t i = 0; i < n;) {
		size_t end = bpe_next_piece(text, n, i), len = end - i;
		if (2 * (used + 1) > slots) { /* rehash */
			size_t grown = slots * 2, *s2 = calloc(grown, sizeof *s2);
			if (!s2)
				return NULL;
			for (size_t k = 0; k < used; k++) {
				size_t h = hash_bytes(start[k], p[k].n) & (grown - 1);
				while (s2[h])
					h = (h + 1) & (grown - 1);
				s2[h] = k + 1;
			}
			free(slot);
			slot = s2;
			slots = grown;
		}
		size_t h = hash_bytes(text + i, len) & (slots - 1);
		while (slot[h] && !(p[slot[h] - 1].n == len && !memcmp(start[slot[h] - 1], text + i, len)))
			h = (h + 1) & (slots - 1);
		if (!slot[h]) {
			if (used == cap) {
				cap *= 2;
				p = realloc(p, sizeof *p * cap);
				start = realloc(start, sizeof *start * cap);
				if (!p || !start)
					return NULL;
			}
			p[used] = (Piece){malloc(sizeof(int32_t) * len), len, 0};
			if (!p[used].sym)
				return NULL;
			for (size_t j = 0; j < len; j++)
				p[used].sym[j] = byte_token[(unsigned char)text[i + j]];
			start[used] = text + i;
			slot[h] = ++used;
		}
		p[slot[h] - 1].count++;
		i = end;
	}
	free(slot);
	free(start);
	*npieces = used;
	return p;
}

/* the most frequent adjacent pair (ties: lower left id, then lower right id); 0 when none */
static int best_pair(const Piece *p, size_t np, int32_t *a, int32_t *b)
{
	size_t pairs = 0;
	for (size_t i = 0; i < np; i++)
		pairs += p[i].n;
	PairMap m;
	if (pair_init(&m, pairs + 1) < 0)
		return -1;
	int64_t best = 0;
	for (size_t i = 0; i < np; i++)
		for (size_t j = 0; j + 1 < p[i].n; j++)
			*pair_slot(&m, p[i].sym[j], p[i].sym[j + 1], 1) += p[i].count;
	for (size_t s = 0; s < m.cap; s++) {
		if (!m.key[s])
			continue;
		uint64_t k = m.key[s] - 1;
		int32_t l = (int32_t)(k >> 32), r = (int32_t)(k & 0xFFFFFFFF);
		if (m.val[s] > best || (m.val[s] == best && (l < *a || (l == *a && r < *b)))) {
			best = m.val[s];
			*a = l;
			*b = r;
		}
	}
	pair_free(&m);
	return best > 0;
}

static void apply_merge(Piece *p, size_t np, int32_t a, int32_t b, int32_t merged)
{
	for (size_t i = 0; i < np; i++) {
		size_t out = 0;
		for (size_t j = 0; j < p[i].n; j++) {
			if (j + 1 < p[i].n && p[i].sym[j] == a && p[i].sym[j + 1] == b) {
				p[i].sym[out++] = merged;
				j++;
			} else {
				p[i].sym[out++] = p[i].sym[j];
			}
		}
		p[i].n = out;
	}
}

/* vocab.json (ids in order) and merges.txt */
static int write_vocab(const char *dir, char **text, int n, const int32_t (*merges)[2], int nmerges, char *err,
		       size_t errn)
{
	char path[4096];
	json_t *v = json_object();
	for (int i = 0; v && i < n; i++)
		if (json_object_set_new(v, text[i], json_integer(i))) {
			json_decref(v);
			v = NULL;
		}
	snprintf(path, sizeof path, "%s/vocab.json", dir);
	if (!v || json_dump_file(v, path, JSON_PRESERVE_ORDER | JSON_COMPACT) != 0) {
		snprintf(err, errn, "cannot write '%s'", path);
		json_decref(v);
		return -1;
	}
	json_decref(v);
	snprintf(path, sizeof path, "%s/merges.txt", dir);
	FILE *fp = fopen(path, "w");
	if (!fp) {
		snprintf(err, errn, "cannot write '%s'", path);
		return -1;
	}
	fputs("#version: 0.2\n", fp);
	for (int i = 0; i < nmerges; i++)
		fprintf(fp, "%s %s\n", text[merges[i][0]], text[merges[i][1]]);
	if (fclose(fp) != 0) {
		snprintf(err, errn, "cannot write '%s'", path);
		return -1;
	}
	return 0;
}

int bpe_train(const char *text, size_t n, int vocab_size, const char *dir, char *err, size_t errn)
{
	if (vocab_size < 257 || vocab_size > 1 << 20) {
		snprintf(err, errn, "--vocab-size %d: a byte-level vocabulary has 257 (the bytes and <|endoftext|>) to %d tokens",
			 vocab_size, 1 << 20);
		return -1;
	}
	int rank_of[256], byte_at[256];
	byte_order(rank_of, byte_at);
	char **tok = calloc((size_t)vocab_size, sizeof *tok);
	int32_t (*merges)[2] = malloc(sizeof *merges * (size_t)vocab_size);
	size_t np = 0;
	Piece *p = tok && merges ? count_pieces(text, n, rank_of, &np) : NULL;
	int rc = -1;
	if (!p) {
		snprintf(err, errn, "out of memory training a vocabulary");
		goto done;
	}
	for (int i = 0; i < 256; i++) {
		tok[i] = calloc(3, 1);
		byte_char(byte_at[i], tok[i]);
	}
	int ntok = 256, nmerges = 0;
	while (ntok < vocab_size - 1) {
		int32_t a = INT32_MAX, b = INT32_MAX;
		int found = best_pair(p, np, &a, &b);
		if (found < 0) {
			snprintf(err, errn, "out of memory training a vocabulary");
			goto done;
		}
		if (!found || strlen(tok[a]) + strlen(tok[b]) >= MAX_TOKEN)
			break; /* the corpus has no pair left to merge */
		size_t la = strlen(tok[a]), lb = strlen(tok[b]);
		if (!(tok[ntok] = malloc(la + lb + 1))) {
			snprintf(err, errn, "out of memory training a vocabulary");
			goto done;
		}
		memcpy(tok[ntok], tok[a], la);
		memcpy(tok[ntok] + la, tok[b], lb + 1);
		merges[nmerges][0] = a;
		merges[nmerges++][1] = b;
		apply_merge(p, np, a, b, ntok);
		ntok++;
	}
	tok[ntok++] = strdup("<|endoftext|>");
	mkdir(dir, 0777);
	rc = write_vocab(dir, tok, ntok, (const int32_t(*)[2])merges, nmerges, err, errn);
	if (rc == 0 && ntok < vocab_size)
		fprintf(stderr, "planc data vocab: note: the corpus has no pair left to merge after %d merges: the vocabulary has %d "
				"tokens, not %d\n",
			nmerges, ntok, vocab_size);
done:
	for (size_t i = 0; p && i < np; i++)
		free(p[i].sym);
	free(p);
	for (int i = 0; tok && i < vocab_size; i++)
		free(tok[i]);
	free(tok);
	free(merges);
	return rc;
}
