/* load.c: turns a path on the command line into a Program: the main module and every module it
 * imports, transitively. Input files are treated as hostile: directories, unreadable files,
 * files over 16 MiB and files holding NUL bytes are refused with a one-line cause before the
 * lexer sees them. `import std.X` resolves to X.plan in the stdlib directory ($PLANC_STDLIB, or
 * the directory compiled in as PLANC_STDLIB_DIR). */
#include "planc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "planc: error: cannot open '%s': %s\n", path, strerror(errno));
		return false;
	}
	if (S_ISDIR(st.st_mode)) {
		fprintf(stderr, "planc: error: '%s' is a directory, not a .plan file\n", path);
		return false;
	}
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "planc: error: cannot open '%s': %s\n", path, strerror(errno));
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
	return parse_module(a, arena_strdup(a, path), copy, len);
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
	Program *p = arena_alloc(a, sizeof *p);
	p->arena = a;
	p->main = m;
	p->modules = m;
	if (!load_imports(p, m, 0))
		return NULL;
	return p;
}
