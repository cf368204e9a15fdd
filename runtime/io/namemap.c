/* namemap.c: --map, checkpoints under another framework's names (planrt_namemap.h).
 *
 * Binding. Every parameter of the program gets a file tensor: the first rule whose planc pattern
 * matches its name (with {i} capturing a layer index) gives the file name; a T rule transposes
 * (planc [in, out], the file [out, in]); cat rules concatenate their parameters along the file
 * tensor's first dim in the order of the rules (and of the layer index: every {i} has its own file
 * tensor). A parameter no rule matches keeps its name and layout. Every tensor of an --init file
 * must be some parameter's or named by a `- FILE_NAME` rule: a tensor the model would silently
 * drop (a bias it lacks) is an error.
 *
 * Reading (--init) takes each rank's block from the file directly: the block's rows and columns
 * are swapped into the file's layout for a T tensor, shifted by the part's first row for a cat one,
 * read by planrt_st_read_block and transposed back. Writing (--save) first writes planc's own
 * checkpoint (every rank its pieces, as without a map), then rank 0 rewrites it under the map's
 * names: whole tensors, in memory, once, which is what a conversion script would do. */
#define PLANRT_INTERNAL
#include "planrt_namemap.h"
#include "planrt_dataset.h" /* planrt_st_count, planrt_st_raw */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_RULES = 256, MAX_DIMS = 8 };

typedef struct rule {
	char planc[256], file[256];
	int transpose, cat, line;
	int ignore; /* `- FILE_NAME`: a file tensor --init does not read */
} rule_t;

typedef struct bound {
	char file[320];
	int transpose, cat;
	int rule;            /* the rule's index (the order of cat parts), -1: no rule */
	int64_t row_off;     /* cat: the part's first row in the file tensor */
	int64_t rows;        /* the part's rows in the file tensor (its first dim there) */
	int rank;
	int64_t fdims[MAX_DIMS]; /* the file tensor's dims */
} bound_t;

struct planrt_namemap {
	const planrt_program_t *prog;
	char path[512];
	rule_t r[MAX_RULES];
	int n;
	bound_t *b; /* [prog->nparams] */
};

/* name against pattern, where {i} matches one or more digits; *idx gets them ("" when none) */
static int match(const char *pat, const char *name, char *idx, size_t n)
{
	const char *hole = strstr(pat, "{i}");
	idx[0] = 0;
	if (!hole)
		return !strcmp(pat, name);
	size_t head = (size_t)(hole - pat);
	if (strncmp(pat, name, head))
		return 0;
	const char *d = name + head;
	size_t k = strspn(d, "0123456789");
	if (!k || k >= n || strcmp(hole + 3, d + k))
		return 0;
	memcpy(idx, d, k);
	idx[k] = 0;
	return 1;
}

static void substitute(const char *pat, const char *idx, char *out, size_t n)
{
	const char *hole = strstr(pat, "{i}");
	if (!hole)
		snprintf(out, n, "%s", pat);
	else
		snprintf(out, n, "%.*s%s%s", (int)(hole - pat), pat, idx, hole + 3);
}

/* The map file's rules, line by line: 'PLANC_NAME FILE_NAME [T] [cat]' or '- FILE_NAME'; '#'
 * starts a comment. The first malformed line is the error. */
static planrt_result_t read_rules(planrt_namemap_t m, FILE *fp, const char *path)
{
	char line[1024];
	planrt_result_t r = planrt_success;
	for (int ln = 1; r == planrt_success && fgets(line, sizeof line, fp); ln++) {
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char *words[4];
		int nw = 0, too_many = 0;
		for (char *t = strtok(line, " \t\r\n"); t; t = strtok(NULL, " \t\r\n")) {
			if (nw == 4) {
				too_many = 1;
				break;
			}
			words[nw++] = t;
		}
		if (!nw)
			continue;
		int transpose = 0, cat = 0, ignore = nw == 2 && !strcmp(words[0], "-");
		const char *unknown = NULL; /* a flag that is neither T nor cat (a lower-case t) */
		for (int i = 2; i < nw && !unknown; i++) {
			if (!strcmp(words[i], "T"))
				transpose = 1;
			else if (!strcmp(words[i], "cat"))
				cat = 1;
			else
				unknown = words[i];
		}
		if (unknown) {
			r = planrt_error_(planrt_format_error,
					  "--map '%s' line %d: unknown flag '%s' after the names; the flags are 'T' (transposed) "
					  "and 'cat' (a part of a fused tensor)",
					  path, ln, unknown);
			break;
		}
		if (too_many || nw < 2 || strlen(words[0]) >= 256 || strlen(words[1]) >= 256 ||
		    (!ignore && (strstr(words[0], "{i}") != NULL) != (strstr(words[1], "{i}") != NULL))) {
			r = planrt_error_(planrt_format_error,
					  "--map '%s' line %d: expected 'PLANC_NAME FILE_NAME [T] [cat]' ({i} in both names or "
					  "neither) or '- FILE_NAME'",
					  path, ln);
			break;
		}
		if (m->n == MAX_RULES) {
			r = planrt_error_(planrt_format_error, "--map '%s' has more than %d rules", path, MAX_RULES);
			break;
		}
		rule_t *x = &m->r[m->n++];
		snprintf(x->planc, sizeof x->planc, "%s", words[0]);
		snprintf(x->file, sizeof x->file, "%s", words[1]);
		x->transpose = transpose;
		x->cat = cat;
		x->ignore = ignore;
		x->line = ln;
	}
	return r;
}

planrt_result_t planrt_namemap_open(const char *path, const planrt_program_t *prog, planrt_namemap_t *out)
{
	*out = NULL;
	/* a regular file only: a FIFO would block every rank, a directory reads as an empty map */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return planrt_error_(planrt_io_error, "cannot open --map '%s': %s; pass a name map file (stdlib/maps/*.map)",
				     path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return planrt_error_(planrt_io_error, "--map '%s' is %s, not a name map file; pass a file (stdlib/maps/*.map)",
				     path, S_ISDIR(st.st_mode) ? "a directory" : "not a regular file (a FIFO, socket or device)");
	}
	FILE *fp = fdopen(fd, "r");
	if (!fp) {
		close(fd);
		return planrt_error_(planrt_system_error, "cannot read --map '%s': %s", path, strerror(errno));
	}
	planrt_namemap_t m = calloc(1, sizeof *m);
	if (!m || !(m->b = calloc((size_t)(prog->nparams ? prog->nparams : 1), sizeof *m->b))) {
		fclose(fp);
		free(m);
		return planrt_error_(planrt_system_error, "out of memory reading --map '%s'", path);
	}
	m->prog = prog;
	snprintf(m->path, sizeof m->path, "%s", path);
	planrt_result_t r = read_rules(m, fp, path);
	fclose(fp);
	/* bind: each parameter's file tensor */
	for (int p = 0; r == planrt_success && p < prog->nparams; p++) {
		const planrt_param_t *q = &prog->params[p];
		bound_t *b = &m->b[p];
		b->rule = -1;
		snprintf(b->file, sizeof b->file, "%s", q->name);
		b->rank = q->rank;
		for (int d = 0; d < q->rank; d++)
			b->fdims[d] = q->gdims[d];
		char idx[32];
		for (int k = 0; k < m->n; k++)
			if (!m->r[k].ignore && match(m->r[k].planc, q->name, idx, sizeof idx)) {
				substitute(m->r[k].file, idx, b->file, sizeof b->file);
				b->rule = k;
				b->transpose = m->r[k].transpose;
				b->cat = m->r[k].cat;
				break;
			}
		if (b->transpose && q->rank != 2) {
			r = planrt_error_(planrt_format_error, "--map '%s' line %d transposes '%s', which has %d dims; T applies "
					  "to 2-D tensors", path, m->r[b->rule].line, q->name, q->rank);
			break;
		}
		if (b->transpose) {
			b->fdims[0] = q->gdims[1];
			b->fdims[1] = q->gdims[0];
		}
		b->rows = b->rank ? b->fdims[0] : 1;
	}
	/* one file tensor, one parameter, unless every part of it says cat */
	for (int p = 0; r == planrt_success && p < prog->nparams; p++)
		for (int o = p + 1; r == planrt_success && o < prog->nparams; o++)
			if (!strcmp(m->b[p].file, m->b[o].file) && (!m->b[p].cat || !m->b[o].cat))
				r = planrt_error_(planrt_format_error,
						  "--map '%s': parameters '%s' and '%s' both map to '%s'; mark both rules "
						  "'cat' if they are parts of one fused tensor, else give each its own name",
						  path, prog->params[p].name, prog->params[o].name, m->b[p].file);
	/* cat: the parts of one file tensor, in rule order, stacked along its first dim */
	for (int p = 0; r == planrt_success && p < prog->nparams; p++) {
		bound_t *b = &m->b[p];
		if (!b->cat)
			continue;
		int64_t before = 0, total = 0;
		for (int o = 0; o < prog->nparams; o++) {
			const bound_t *c = &m->b[o];
			if (!c->cat || strcmp(c->file, b->file) || !strcmp(prog->params[o].name, prog->params[p].name))
				continue;
			int same = c->rank == b->rank;
			for (int d = 1; same && d < b->rank; d++)
				same = c->fdims[d] == b->fdims[d];
			if (!same) {
				r = planrt_error_(planrt_format_error,
						  "--map '%s': '%s' and '%s' are parts of '%s' but differ in its dims after the first",
						  path, prog->params[p].name, prog->params[o].name, b->file);
				break;
			}
			if (c->rule < b->rule)
				before += c->rows;
			total += c->rows;
		}
		b->row_off = before;
		b->fdims[0] = total + b->rows; /* the whole file tensor's */
	}
	if (r != planrt_success) {
		planrt_namemap_close(m);
		return r;
	}
	*out = m;
	return planrt_success;
}

/* A file tensor no parameter reads: when a rule of the map names it, that rule's planc name is
 * what is wrong (a model whose embedding is not called wte), not the file. */
static planrt_result_t unread_tensor(planrt_namemap_t m, const char *path, const char *name)
{
	char idx[32];
	for (int k = 0; k < m->n; k++)
		if (!m->r[k].ignore && match(m->r[k].file, name, idx, sizeof idx))
			return planrt_error_(planrt_format_error,
					     "--init '%s' holds '%s', which line %d of --map '%s' maps to '%s', but the model has no "
					     "parameter of that name; put the model's name for it on that line (--save without "
					     "--map writes the model's names)",
					     path, name, m->r[k].line, m->path, m->r[k].planc);
	return planrt_error_(planrt_format_error,
			     "--init '%s' holds '%s', which no parameter of the model maps to under --map '%s' (a bias or "
			     "layer the model lacks?); load it into a model that has it, or add a line '- %s' to the map "
			     "to leave it unread",
			     path, name, m->path, name);
}

/* A 2-D tensor whose shape is exactly the transpose of what the map expects: the rule's T is
 * missing (or extra). A square weight without its T cannot be told from its shape (docs/namemap.md). */
static planrt_result_t check_transposes(planrt_namemap_t m, planrt_st_t f, const char *path)
{
	for (int i = 0; i < planrt_st_count(f); i++) {
		const char *name, *type;
		int rank;
		int64_t dims[MAX_DIMS];
		const void *data;
		planrt_st_raw(f, i, &name, &type, &rank, dims, &data);
		for (int p = 0; p < m->prog->nparams; p++) {
			const bound_t *b = &m->b[p];
			if (strcmp(b->file, name) || b->rank != 2 || rank != 2 || b->cat || b->rule < 0)
				continue;
			if (dims[0] == b->fdims[0] && dims[1] == b->fdims[1])
				continue;
			if (dims[0] == b->fdims[1] && dims[1] == b->fdims[0])
				return planrt_error_(planrt_format_error,
						     "--init '%s': '%s' is [%lld, %lld], the transpose of the [%lld, %lld] that line %d "
						     "of --map '%s' reads for '%s'; %s T on that line",
						     path, name, (long long)dims[0], (long long)dims[1], (long long)b->fdims[0],
						     (long long)b->fdims[1], m->r[b->rule].line, m->path, m->prog->params[p].name,
						     b->transpose ? "remove" : "add");
		}
	}
	return planrt_success;
}

planrt_result_t planrt_namemap_check_file(planrt_namemap_t m, planrt_st_t f, const char *path)
{
	const char *name;
	char idx[32];
	for (int i = 0; (name = planrt_st_name_(f, i)); i++) {
		int used = 0;
		for (int p = 0; !used && p < m->prog->nparams; p++)
			used = !strcmp(m->b[p].file, name);
		for (int k = 0; !used && k < m->n; k++)
			used = m->r[k].ignore && match(m->r[k].file, name, idx, sizeof idx);
		if (!used)
			return unread_tensor(m, path, name);
	}
	return check_transposes(m, f, path);
}

void planrt_namemap_close(planrt_namemap_t m)
{
	if (!m)
		return;
	free(m->b);
	free(m);
}

planrt_result_t planrt_namemap_read_block(planrt_namemap_t m, planrt_st_t f, int param, const int64_t *ldims,
					  const int64_t *offs, float *dst)
{
	const bound_t *b = &m->b[param];
	int64_t fl[MAX_DIMS], fo[MAX_DIMS], n = 1;
	for (int d = 0; d < b->rank; d++) {
		fl[d] = ldims[d];
		fo[d] = offs[d];
		n *= ldims[d];
	}
	if (b->transpose) {
		fl[0] = ldims[1], fl[1] = ldims[0];
		fo[0] = offs[1], fo[1] = offs[0];
	}
	if (b->rank)
		fo[0] += b->row_off;
	if (!b->transpose)
		return planrt_st_read_block(f, b->file, b->rank, b->fdims, fl, fo, dst);
	float *t = malloc(sizeof(float) * (size_t)(n ? n : 1));
	if (!t)
		return planrt_error_(planrt_system_error, "out of memory reading '%s'", b->file);
	planrt_result_t r = planrt_st_read_block(f, b->file, b->rank, b->fdims, fl, fo, t);
	for (int64_t i = 0; r == planrt_success && i < fl[0]; i++) /* [cols, rows] -> [rows, cols] */
		for (int64_t j = 0; j < fl[1]; j++)
			dst[j * fl[0] + i] = t[i * fl[1] + j];
	free(t);
	return r;
}

planrt_result_t planrt_namemap_convert(planrt_namemap_t m, const char *from, const char *to)
{
	const planrt_program_t *prog = m->prog;
	planrt_st_t f;
	planrt_result_t r = planrt_st_open(from, &f);
	if (r != planrt_success)
		return r;
	int n = 0;
	planrt_st_tensor_t *out = calloc((size_t)(prog->nparams ? prog->nparams : 1), sizeof *out);
	float **data = calloc((size_t)(prog->nparams ? prog->nparams : 1), sizeof *data);
	if (!out || !data)
		r = planrt_error_(planrt_system_error, "out of memory converting '%s'", from);
	for (int p = 0; r == planrt_success && p < prog->nparams; p++) {
		const planrt_param_t *q = &prog->params[p];
		const bound_t *b = &m->b[p];
		if (!q->saved)
			continue;
		int k = 0; /* the file tensor, new or a cat tensor met before */
		while (k < n && strcmp(out[k].name, b->file))
			k++;
		int64_t fn = 1, pn = 1, zero[MAX_DIMS] = {0};
		for (int d = 0; d < b->rank; d++) {
			fn *= b->fdims[d];
			pn *= q->gdims[d];
		}
		if (k == n) {
			if (!(data[n] = calloc((size_t)(fn ? fn : 1), sizeof(float)))) {
				r = planrt_error_(planrt_system_error, "out of memory converting '%s'", from);
				break;
			}
			out[n].name = b->file;
			out[n].dtype = planrt_f32;
			out[n].rank = b->rank;
			for (int d = 0; d < b->rank; d++)
				out[n].dims[d] = b->fdims[d];
			out[n].data = data[n];
			n++;
		}
		float *whole = malloc(sizeof(float) * (size_t)(pn ? pn : 1));
		if (!whole) {
			r = planrt_error_(planrt_system_error, "out of memory converting '%s'", from);
			break;
		}
		r = planrt_st_read_block(f, q->name, q->rank, q->gdims, q->gdims, zero, whole);
		int64_t row = pn / (q->rank ? q->gdims[0] : 1); /* elements per row of the part in the file */
		if (b->transpose)
			for (int64_t i = 0; i < q->gdims[0]; i++)
				for (int64_t j = 0; j < q->gdims[1]; j++)
					data[k][(b->row_off + j) * q->gdims[0] + i] = whole[i * q->gdims[1] + j];
		else
			memcpy(data[k] + b->row_off * row, whole, sizeof(float) * (size_t)pn);
		free(whole);
	}
	planrt_st_close(f);
	if (r == planrt_success)
		r = planrt_st_write(to, out, n);
	for (int i = 0; i < n; i++)
		free(data[i]);
	free(data);
	free(out);
	return r;
}
