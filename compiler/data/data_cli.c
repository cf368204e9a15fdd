/* data_cli.c: `planc data`, text to the token files planrt trains on (docs/data.md).
 *
 *   planc data vocab FILE... --vocab-size N -o DIR        train a byte-level BPE vocabulary
 *   planc data tokenize FILE... --vocab DIR -o OUT         documents -> tokens
 *        [--format megatron|nanogpt|llmc] [--split-paragraphs]
 *   planc data decode FILE --vocab DIR                     tokens -> text (stdout)
 *
 * A .jsonl input holds one document per line ({"text": ...}, Megatron's preprocess_data.py input);
 * any other file is one document, or one per paragraph (text between blank lines) with
 * --split-paragraphs. Every document ends with <|endoftext|>. megatron (the default) writes
 * OUT.bin and OUT.idx, one sequence per document (Megatron-LM's indexed data set, whose document
 * boundaries planrt uses); nanogpt writes OUT as raw uint16 tokens; llmc an llm.c shard. Outputs
 * are never overwritten: an existing one is an error. */
#include "data.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct DataOptions {
	const char *cmd, *out, *vocab, *format;
	const char *inputs[256];
	int ninputs, vocab_size, split_paragraphs;
} DataOptions;

static const char data_usage[] =
	"usage: planc data vocab FILE... --vocab-size N -o DIR\n"
	"       planc data tokenize FILE... --vocab DIR -o OUT [--format megatron|nanogpt|llmc] [--split-paragraphs]\n"
	"       planc data decode FILE --vocab DIR\n"
	"(docs/data.md)\n";

/* a command's arguments missing: its usage line, exit status 2 (planc's usage errors) */
static int usage_fail(const char *line)
{
	fprintf(stderr, "planc data: usage: %s\n", line);
	return 2;
}

static int fail(const char *fmt, const char *a, const char *b)
{
	fprintf(stderr, "planc data: ");
	fprintf(stderr, fmt, a, b);
	fprintf(stderr, "\n");
	return 1;
}

/* the whole file (NUL-terminated), or NULL */
static char *read_all(const char *path, size_t *n)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap + 1);
	size_t got;
	while (buf && (got = fread(buf + len, 1, cap - len, fp)) > 0) {
		len += got;
		if (len == cap) {
			char *grown = realloc(buf, 2 * cap + 1);
			if (!grown) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = grown;
			cap *= 2;
		}
	}
	int bad = ferror(fp);
	fclose(fp);
	if (!buf || bad) {
		free(buf);
		return NULL;
	}
	buf[len] = 0;
	*n = len;
	return buf;
}

static int parse(int argc, char **argv, DataOptions *o)
{
	memset(o, 0, sizeof *o);
	o->format = "megatron";
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		fputs(data_usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : -1;
	}
	o->cmd = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		int has = i + 1 < argc;
		if (!strcmp(a, "-o") && has)
			o->out = argv[++i];
		else if (!strcmp(a, "--vocab") && has)
			o->vocab = argv[++i];
		else if (!strcmp(a, "--format") && has)
			o->format = argv[++i];
		else if (!strcmp(a, "--vocab-size") && has)
			o->vocab_size = atoi(argv[++i]);
		else if (!strcmp(a, "--split-paragraphs"))
			o->split_paragraphs = 1;
		else if (a[0] == '-' && a[1])
			return fail("unknown option or missing value: '%s'%s", a, ""), 2;
		else if (o->ninputs < 256)
			o->inputs[o->ninputs++] = a;
		else
			return fail("at most 256 input files%s%s", "", ""), 2;
	}
	if (strcmp(o->format, "megatron") && strcmp(o->format, "nanogpt") && strcmp(o->format, "llmc"))
		return fail("--format '%s': megatron, nanogpt or llmc%s", o->format, ""), 2;
	return 0;
}

/* ------------------------------------------------------------------ writing token files */

typedef struct Writer {
	const char *format;
	FILE *bin;
	char bin_path[4096], idx_path[4096];
	int esize;            /* 2 (uint16) or 4 (int32 / uint32) */
	int64_t tokens;
	int32_t *lengths;     /* per document */
	size_t ndocs, cap;
} Writer;

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static int writer_open(Writer *w, const char *out, const char *format, int vocab_size)
{
	memset(w, 0, sizeof *w);
	w->format = format;
	int megatron = !strcmp(format, "megatron");
	w->esize = vocab_size <= 65536 ? 2 : 4;
	if (!strcmp(format, "nanogpt") && w->esize != 2)
		return fail("--format nanogpt holds uint16 tokens; the vocabulary has more than 65536 (use megatron)%s%s", "", "");
	snprintf(w->bin_path, sizeof w->bin_path, megatron ? "%s.bin" : "%s", out);
	snprintf(w->idx_path, sizeof w->idx_path, "%s.idx", out);
	if (exists(w->bin_path) || (megatron && exists(w->idx_path)))
		return fail("'%s' exists; planc data never overwrites a file: remove it or choose another -o%s",
			    exists(w->bin_path) ? w->bin_path : w->idx_path, "");
	if (!(w->bin = fopen(w->bin_path, "wb")))
		return fail("cannot write '%s': %s", w->bin_path, strerror(errno));
	if (!strcmp(format, "llmc")) { /* the header, its count written at the end */
		int32_t head[256] = {0};
		fwrite(head, sizeof head, 1, w->bin);
	}
	return 0;
}

static int writer_document(Writer *w, const int32_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t v = (uint32_t)ids[i];
		unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
		fwrite(b, (size_t)w->esize, 1, w->bin);
	}
	w->tokens += (int64_t)n;
	if (w->ndocs == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 1024;
		int32_t *grown = realloc(w->lengths, sizeof *grown * w->cap);
		if (!grown)
			return fail("out of memory%s%s", "", "");
		w->lengths = grown;
	}
	w->lengths[w->ndocs++] = (int32_t)n;
	return 0;
}

static void put_u64(FILE *fp, uint64_t v)
{
	fwrite(&v, 8, 1, fp);
}

/* the Megatron index (docs/data.md), the llm.c header's count */
static int writer_close(Writer *w)
{
	int bad = 0;
	if (!strcmp(w->format, "llmc")) {
		int32_t head[3] = {w->esize == 2 ? 20240520 : 20240801, w->esize == 2 ? 1 : 7, (int32_t)w->tokens};
		bad |= fseek(w->bin, 0, SEEK_SET) != 0 || fwrite(head, sizeof head, 1, w->bin) != 1;
	}
	bad |= ferror(w->bin) | (fclose(w->bin) != 0);
	if (!bad && !strcmp(w->format, "megatron")) {
		FILE *idx = fopen(w->idx_path, "wb");
		if (!idx)
			return fail("cannot write '%s': %s", w->idx_path, strerror(errno));
		fwrite("MMIDIDX\0\0", 9, 1, idx);
		put_u64(idx, 1);
		fputc(w->esize == 2 ? 8 : 4, idx); /* uint16 or int32 */
		put_u64(idx, w->ndocs);
		put_u64(idx, w->ndocs + 1);
		fwrite(w->lengths, sizeof *w->lengths, w->ndocs, idx);
		int64_t at = 0;
		for (size_t i = 0; i < w->ndocs; i++) {
			put_u64(idx, (uint64_t)at);
			at += (int64_t)w->lengths[i] * w->esize;
		}
		for (size_t i = 0; i <= w->ndocs; i++)
			put_u64(idx, i);
		bad |= ferror(idx) | (fclose(idx) != 0);
	}
	free(w->lengths);
	if (bad)
		return fail("cannot write '%s' (disk full?)%s", w->bin_path, "");
	fprintf(stderr, "planc data: %lld tokens in %zu documents -> %s%s\n", (long long)w->tokens, w->ndocs, w->bin_path,
		!strcmp(w->format, "megatron") ? " (+ .idx)" : "");
	return 0;
}

/* ------------------------------------------------------------------ documents */

typedef int (*doc_fn)(void *ctx, const char *text, size_t n);

/* the documents of one input: .jsonl lines, paragraphs, or the whole file */
static int each_document(const char *path, int split_paragraphs, doc_fn fn, void *ctx)
{
	size_t n;
	char *text = read_all(path, &n);
	if (!text)
		return fail("cannot read '%s': %s", path, strerror(errno));
	size_t plen = strlen(path);
	int rc = 0, jsonl = plen > 6 && !strcmp(path + plen - 6, ".jsonl");
	for (size_t i = 0; i < n && !rc;) {
		size_t end = i;
		if (jsonl) {
			while (end < n && text[end] != '\n')
				end++;
			if (end > i) {
				json_error_t je;
				json_t *doc = json_loadb(text + i, end - i, 0, &je);
				json_t *t = json_object_get(doc, "text");
				if (!json_is_string(t)) {
					fprintf(stderr, "planc data: %s: a line without a \"text\" string (%s)\n", path,
						doc ? "no text member" : je.text);
					rc = 1;
				} else {
					rc = fn(ctx, json_string_value(t), json_string_length(t));
				}
				json_decref(doc);
			}
			i = end + 1;
		} else if (split_paragraphs) {
			while (end < n && !(text[end] == '\n' && end + 1 < n && text[end + 1] == '\n'))
				end++;
			if (end > i)
				rc = fn(ctx, text + i, end - i);
			i = end;
			while (i < n && text[i] == '\n')
				i++;
		} else {
			rc = fn(ctx, text, n);
			i = n;
		}
	}
	free(text);
	return rc;
}

typedef struct TokenizeCtx {
	const Bpe *bpe;
	Writer *w;
	int32_t *ids;
	size_t len, cap;
} TokenizeCtx;

static int tokenize_document(void *p, const char *text, size_t n)
{
	TokenizeCtx *c = p;
	c->len = 0;
	if (bpe_encode(c->bpe, text, n, &c->ids, &c->len, &c->cap) < 0)
		return fail("out of memory tokenizing%s%s", "", "");
	if (bpe_eot(c->bpe) >= 0) {
		int32_t eot = bpe_eot(c->bpe);
		if (c->len + 1 > c->cap) {
			int32_t *grown = realloc(c->ids, sizeof *grown * (c->len + 1));
			if (!grown)
				return fail("out of memory tokenizing%s%s", "", "");
			c->ids = grown;
			c->cap = c->len + 1;
		}
		c->ids[c->len++] = eot;
	}
	return writer_document(c->w, c->ids, c->len);
}

typedef struct Corpus {
	char *text;
	size_t n;
} Corpus;

static int append_document(void *p, const char *text, size_t n)
{
	Corpus *c = p;
	char *grown = realloc(c->text, c->n + n + 1);
	if (!grown)
		return fail("out of memory reading the corpus%s%s", "", "");
	memcpy(grown + c->n, text, n);
	c->text = grown;
	c->n += n;
	c->text[c->n++] = '\n'; /* documents never merge across their boundary */
	return 0;
}

/* ------------------------------------------------------------------ commands */

static int cmd_vocab(const DataOptions *o)
{
	if (!o->ninputs || !o->out || o->vocab_size <= 0)
		return usage_fail("planc data vocab FILE... --vocab-size N -o DIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/vocab.json", o->out);
	if (exists(path))
		return fail("'%s' exists; planc data never overwrites a file: remove it or choose another -o%s", path, "");
	Corpus c = {0};
	for (int i = 0; i < o->ninputs; i++)
		if (each_document(o->inputs[i], o->split_paragraphs, append_document, &c)) {
			free(c.text);
			return 1;
		}
	char err[512];
	int rc = bpe_train(c.text ? c.text : "", c.n, o->vocab_size, o->out, err, sizeof err);
	free(c.text);
	if (rc < 0)
		return fail("%s%s", err, "");
	fprintf(stderr, "planc data: vocabulary -> %s/vocab.json, %s/merges.txt\n", o->out, o->out);
	return 0;
}

static int cmd_tokenize(const DataOptions *o)
{
	if (!o->ninputs || !o->out || !o->vocab)
		return usage_fail("planc data tokenize FILE... --vocab DIR -o OUT [--format megatron|nanogpt|llmc]");
	char err[512];
	Bpe *b = bpe_load(o->vocab, err, sizeof err);
	if (!b)
		return fail("%s%s", err, "");
	if (bpe_eot(b) < 0)
		fprintf(stderr, "planc data: note: the vocabulary has no <|endoftext|>: documents are not separated by one\n");
	Writer w;
	if (writer_open(&w, o->out, o->format, bpe_vocab_size(b))) {
		bpe_free(b);
		return 1;
	}
	TokenizeCtx c = {b, &w, NULL, 0, 0};
	int rc = 0;
	for (int i = 0; i < o->ninputs && !rc; i++)
		rc = each_document(o->inputs[i], o->split_paragraphs, tokenize_document, &c);
	free(c.ids);
	rc |= writer_close(&w);
	bpe_free(b);
	return rc;
}

/* the tokens of a file this command wrote (or any Megatron / nanoGPT / llm.c file of uint16 or
 * 32-bit tokens) */
static int cmd_decode(const DataOptions *o)
{
	if (o->ninputs != 1 || !o->vocab)
		return usage_fail("planc data decode FILE --vocab DIR");
	char err[512], bin[4096], idx[4096];
	Bpe *b = bpe_load(o->vocab, err, sizeof err);
	if (!b)
		return fail("%s%s", err, "");
	const char *in = o->inputs[0];
	size_t len = strlen(in);
	int megatron = 0, esize = 2;
	snprintf(idx, sizeof idx, "%.*s.idx", (int)(len > 4 && !strcmp(in + len - 4, ".bin") ? len - 4 : len), in);
	snprintf(bin, sizeof bin, "%s", in);
	if (exists(idx)) {
		megatron = 1;
		snprintf(bin, sizeof bin, "%.*s.bin", (int)(strlen(idx) - 4), idx);
		size_t n;
		char *head = read_all(idx, &n);
		esize = head && n > 17 && head[17] == 4 ? 4 : 2;
		free(head);
	}
	size_t n;
	unsigned char *raw = (unsigned char *)read_all(bin, &n);
	if (!raw) {
		bpe_free(b);
		return fail("cannot read '%s': %s", bin, strerror(errno));
	}
	size_t at = 0;
	int32_t head[2] = {0};
	if (!megatron && n >= 1024)
		memcpy(head, raw, sizeof head);
	if (!megatron && ((head[0] == 20240520 && head[1] == 1) || (head[0] == 20240801 && head[1] == 7))) {
		at = 1024;
		esize = head[0] == 20240520 ? 2 : 4;
	}
	int rc = 0;
	for (; at + (size_t)esize <= n && !rc; at += (size_t)esize) {
		int32_t id = esize == 2 ? raw[at] | raw[at + 1] << 8
				       : (int32_t)((uint32_t)raw[at] | (uint32_t)raw[at + 1] << 8 | (uint32_t)raw[at + 2] << 16 |
						   (uint32_t)raw[at + 3] << 24);
		if (bpe_decode(b, &id, 1, stdout) < 0)
			rc = fail("token at byte %s of '%s' is outside the vocabulary", "?", bin);
	}
	free(raw);
	bpe_free(b);
	return rc;
}

int data_main(int argc, char **argv)
{
	DataOptions o;
	int rc = parse(argc, argv, &o);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (!strcmp(o.cmd, "vocab"))
		return cmd_vocab(&o);
	if (!strcmp(o.cmd, "tokenize"))
		return cmd_tokenize(&o);
	if (!strcmp(o.cmd, "decode"))
		return cmd_decode(&o);
	fail("unknown command 'data %s'%s", o.cmd, "");
	fputs(data_usage, stderr);
	return 2;
}
