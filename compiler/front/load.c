/* load.c: turns a path on the command line into a Program: the main module and every module it
 * imports, transitively. Input files are treated as hostile: directories, FIFOs, devices and
 * other files that are not regular (a FIFO would block the read forever), unreadable files,
 * files over 16 MiB and files holding NUL bytes are refused with a one-line cause before the
 * lexer sees them, and a main file that defines nothing (empty, or only comments and imports) is
 * an error rather than a silent success. `import std.X` resolves to X.plan in the stdlib directory ($PLANC_STDLIB, or
 * the directory compiled in as PLANC_STDLIB_DIR). */
#include "front/front.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef PLANC_STDLIB_DIR
#define PLANC_STDLIB_DIR "stdlib"
#endif

enum { MAX_SOURCE_BYTES = 16 << 20 };

const char *stdlib_dir(void)
{
	const char *env = getenv("PLANC_STDLIB");
	return env && *env ? env : PLANC_STDLIB_DIR;
}

bool load_file(const char *path, char **text, int *len)
{
	/* opened without blocking and checked on the descriptor: a FIFO put in place after a stat
	 * could still block an open, and one opened for reading waits for a writer forever */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "planc: error: cannot open '%s': %s\n", path, strerror(errno));
		return false;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		fprintf(stderr, "planc: error: cannot open '%s': %s\n", path, strerror(errno));
		close(fd);
		return false;
	}
	if (!S_ISREG(st.st_mode)) {
		if (S_ISDIR(st.st_mode))
			fprintf(stderr, "planc: error: '%s' is a directory, not a .plan file\n", path);
		else
			fprintf(stderr, "planc: error: '%s' is a %s, not a regular file; planc reads plans from files\n", path,
				S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
		close(fd);
		return false;
	}
	int flags = fcntl(fd, F_GETFL);
	FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
	if (!f) {
		fprintf(stderr, "planc: error: cannot open '%s': %s\n", path, strerror(errno));
		close(fd);
		return false;
	}
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	if (!buf)
		ICE("out of memory");
	for (;;) {
		if (n == cap) {
			if (cap >= MAX_SOURCE_BYTES) {
				fprintf(stderr, "planc: error: '%s' is larger than 16 MiB; a plan file should be small text\n", path);
				free(buf);
				fclose(f);
				return false;
			}
			cap *= 2;
			char *nb = realloc(buf, cap + 1);
			if (!nb)
				ICE("out of memory");
			buf = nb;
		}
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	bool read_error = ferror(f);
	fclose(f);
	if (read_error) {
		fprintf(stderr, "planc: error: cannot read '%s'\n", path);
		free(buf);
		return false;
	}
	if (memchr(buf, 0, n)) {
		fprintf(stderr, "planc: error: '%s' holds NUL bytes; it is not a text .plan file\n", path);
		free(buf);
		return false;
	}
	buf[n] = 0;
	*text = buf;
	*len = (int)n;
	return true;
}

static Module *parse_path(Arena *a, const char *path)
{
	char *text;
	int len;
	if (!load_file(path, &text, &len))
		return NULL;
	char *copy = arena_strndup(a, text, (size_t)len);
	free(text);
	Module *m = parse_module(a, arena_strdup(a, path), copy, len);
	if (m) {
		diag_index_lines(a, &m->src);
		module_index(a, m);
	}
	return m;
}

void module_index(Arena *a, Module *m)
{
	m->items_by_name = symtab_new(a);
	m->imports_by_alias = symtab_new(a);
	int n = 0;
	for (Item *it = m->items; it; it = it->next)
		n++;
	Item **items = arena_alloc(a, sizeof *items * (size_t)(n + 1));
	n = 0;
	for (Item *it = m->items; it; it = it->next)
		items[n++] = it;
	for (int i = n - 1; i >= 0; i--) { /* backwards, each put in front: chains in source order */
		Item *it = items[i];
		if (it->kind == I_IMPORT) {
			if (it->alias)
				symtab_put(m->imports_by_alias, it->alias, it);
		} else if (it->name) {
			ItemChain *c = arena_alloc(a, sizeof *c);
			c->item = it;
			c->next = symtab_get(m->items_by_name, it->name);
			symtab_put(m->items_by_name, it->name, c);
		}
	}
}

static Module *find_module(Program *p, const char *import_name)
{
	for (Module *m = p->modules; m; m = m->next)
		if (m->import_name && !strcmp(m->import_name, import_name))
			return m;
	return NULL;
}

/* Loads the modules that m imports, depth first; reports unknown ones at the import. */
static bool load_imports(Program *p, Module *m, int depth)
{
	bool ok = true;
	for (Item *it = m->items; it; it = it->next) {
		if (it->kind != I_IMPORT || find_module(p, it->name))
			continue;
		if (strncmp(it->name, "std.", 4) != 0 || strchr(it->name + 4, '.') || !it->name[4]) {
			diag_error(&m->src, it->name_loc, "unknown module '%s'", it->name);
			diag_note_plain("modules come from the standard library: 'import std.nn'");
			ok = false;
			continue;
		}
		if (depth > 16) {
			diag_error(&m->src, it->name_loc, "imports nested too deeply");
			return false;
		}
		const char *path = arena_printf(p->arena, "%s/%s.plan", stdlib_dir(), it->name + 4);
		struct stat st;
		if (stat(path, &st) != 0) {
			diag_error(&m->src, it->name_loc, "unknown module '%s'", it->name);
			diag_note_plain("no file %s", path);
			ok = false;
			continue;
		}
		Module *dep = parse_path(p->arena, path);
		if (!dep)
			return false;
		dep->import_name = it->name;
		Module *last = p->modules;
		while (last->next)
			last = last->next;
		last->next = dep;
		if (!load_imports(p, dep, depth + 1))
			ok = false;
	}
	return ok;
}

Program *load_program(Arena *a, const char *path)
{
	Module *m = parse_path(a, path);
	if (!m)
		return NULL;
	bool defines = false;
	for (Item *it = m->items; it && !defines; it = it->next)
		defines = it->kind != I_IMPORT;
	if (!defines) {
		fprintf(stderr, "planc: error: '%s' %s no model and no plan\n", path, m->src.len ? "defines" : "is empty: it defines");
		fprintf(stderr, "note: a plan file holds a model and the plans for it: 'model m(...) { ... }' and "
				"'plan p for m { ... }' (examples/gpt.plan)\n");
		return NULL;
	}
	Program *p = arena_alloc(a, sizeof *p);
	p->arena = a;
	p->main = m;
	p->modules = m;
	if (!load_imports(p, m, 0))
		return NULL;
	return p;
}

Arena *plan_arena_begin(Program *p)
{
	Arena *program_arena = p->arena;
	p->arena = arena_new();
	return program_arena;
}

void plan_arena_end(Program *p, Arena *program_arena)
{
	arena_free(p->arena);
	p->arena = program_arena;
}

/* `--model-arg NAME=VALUE` (main.c): the arguments joined by ", " are one Source named
 * "<command line>", so that a diagnostic about one of them (here a malformed one, in sema.c a
 * name the plan's model does not have) points into it like into a file. VALUE is a number, as a
 * plan's own `for gpt(D = 64)` override usually is: an integer (E_INT) or else a float (E_FLOAT). */
bool load_model_args(Program *p, char *const *args, int n)
{
	Arena *a = p->arena;
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += strlen(args[i]) + 2;
	char *text = arena_alloc(a, len + 1);
	Source *src = arena_alloc(a, sizeof *src);
	*src = (Source){"<command line>", text, 0, NULL, 0};
	int *ends = arena_alloc(a, sizeof *ends * (size_t)(n + 1));
	for (int i = 0; i < n; i++) /* the whole text first: a diagnostic prints its line */
		ends[i] = src->len += sprintf(text + src->len, "%s%s", i ? ", " : "", args[i]);
	Arg **tail = &p->model_args;
	bool ok = true;
	for (int i = 0; i < n; i++) {
		int off = ends[i], start = off - (int)strlen(args[i]);
		const char *arg = arena_strndup(a, text + start, (size_t)(off - start)), *eq = strchr(arg, '=');
		int name_len = eq ? (int)(eq - arg) : 0;
		bool name_ok = name_len > 0 && (isalpha((unsigned char)arg[0]) || arg[0] == '_');
		for (int k = 1; k < name_len; k++)
			name_ok = name_ok && (isalnum((unsigned char)arg[k]) || arg[k] == '_');
		if (!name_ok) {
			diag_error(src, (Loc){start, (int)strlen(arg)}, "--model-arg takes NAME=VALUE, e.g. --model-arg D=64");
			ok = false;
			continue;
		}
		Loc key_loc = {start, name_len}, value_loc = {start + name_len + 1, off - start - name_len - 1};
		const char *value = eq + 1;
		char *end;
		errno = 0;
		long long iv = strtoll(value, &end, 10);
		Expr *e = NULL;
		if (*value && !*end && !errno) {
			e = expr_new(a, E_INT, value_loc);
			e->ival = iv;
		} else {
			errno = 0;
			double fv = strtod(value, &end);
			if (*value && !isspace((unsigned char)*value) && !*end && !errno && isfinite(fv)) {
				e = expr_new(a, E_FLOAT, value_loc);
				e->fval = fv;
				e->text = arena_strndup(a, value, strlen(value));
			}
		}
		if (!e) {
			diag_error(src, value_loc, "the value of '%.*s' is not a number", name_len, arg);
			diag_note_plain("--model-arg takes NAME=VALUE with VALUE an integer or a decimal number, e.g. D=64 or P=0.0");
			ok = false;
			continue;
		}
		const char *key = arena_strndup(a, arg, (size_t)name_len);
		for (Arg *prev = p->model_args; prev; prev = prev->next)
			if (!strcmp(prev->key, key)) {
				diag_error(src, key_loc, "hyperparameter '%s' is given twice", key);
				diag_note(src, prev->key_loc, "first given here");
				ok = false;
				e = NULL;
				break;
			}
		if (!e)
			continue;
		*tail = arg_new(a, key, key_loc, e, (Loc){start, off - start});
		tail = &(*tail)->next;
	}
	p->model_args_src = src;
	return ok;
}
