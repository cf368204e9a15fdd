/* diag.c: the one diagnostic printer. Every user-facing message goes through here so they all
 * look alike (cproc / chibicc style):
 *
 *   file:line:col: error: message
 *     12 |   shard wq : [_, tensr]
 *        |                  ^~~~~
 *   note: did you mean 'tensor'?
 *
 * Messages are lower case with no final period. Internal errors (bugs in planc) are separate:
 * they print "internal compiler error" and abort, so a user error never looks like a crash and a
 * crash never looks like a user error.
 *
 * Errors are capped as compilers cap them (gcc -fmax-errors, clang -ferror-limit): after 20, one
 * note says so and every later diagnostic is dropped; diag_stopped() tells the lexer, sema and
 * the driver to stop working, so hostile input with 100,000 errors costs what 20 do. Line and
 * column come from a line table (diag_index_lines) when the Source has one, so a file with many
 * warnings is not rescanned from its start for each.
 *
 * An error or warning that repeats one already printed (the same place and the same words, numbers
 * aside: an error in a model that every plan of the file elaborates, with each plan's batch size
 * in its shapes) is counted but not printed again, nor are its notes; the cap counts printed
 * errors. */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_ERRORS = 20 };

static FILE *diag_stream;
static int error_count, shown_errors;
static bool stopped; /* MAX_ERRORS reached: everything after is dropped */
static bool muted;   /* the last error or warning repeated an earlier one: its notes are dropped */
enum { SEEN = 4096 };
static uint64_t seen[SEEN]; /* hashes of the errors and warnings printed (0: empty) */

void diag_set_stream(FILE *f) { diag_stream = f; }
int diag_error_count(void) { return error_count; }
bool diag_stopped(void) { return stopped; }
void diag_reset(void)
{
	error_count = shown_errors = 0;
	stopped = muted = false;
	memset(seen, 0, sizeof seen);
}

/* Whether the diagnostic (kind, place, text) was printed before; records it if not. */
static bool repeated(const char *kind, const Source *src, Loc loc, const char *fmt, va_list ap)
{
	char text[1024];
	va_list copy;
	va_copy(copy, ap);
	vsnprintf(text, sizeof text, fmt, copy);
	va_end(copy);
	uint64_t h = 0xcbf29ce484222325ull;
	const char *parts[3] = {kind, src ? src->path : "", text};
	for (int i = 0; i < 3; i++)
		for (const char *c = parts[i];; c++) {
			if (*c >= '0' && *c <= '9' && c[1] >= '0' && c[1] <= '9')
				continue; /* a number counts as its last digit, made '#' below */
			unsigned char b = *c >= '0' && *c <= '9' ? '#' : (unsigned char)*c;
			h = (h ^ b) * 0x100000001b3ull; /* the NUL separates the parts */
			if (!*c)
				break;
		}
	h = (h ^ (uint64_t)(unsigned)loc.off) * 0x100000001b3ull;
	h = (h ^ (uint64_t)(unsigned)loc.len) * 0x100000001b3ull;
	h |= 1;
	for (unsigned i = (unsigned)h % SEEN, k = 0; k < SEEN; i = (i + 1) % SEEN, k++) {
		if (seen[i] == h)
			return true;
		if (!seen[i]) {
			seen[i] = h;
			return false;
		}
	}
	return false; /* full: print it */
}

static FILE *out(void) { return diag_stream ? diag_stream : stderr; }

Loc loc_span(Loc a, Loc b)
{
	Loc r = a;
	int end = b.off + b.len;
	if (end > a.off)
		r.len = end - a.off;
	return r;
}

void diag_index_lines(Arena *a, Source *src)
{
	int n = 1;
	for (int i = 0; i < src->len; i++)
		n += src->text[i] == '\n';
	int *starts = arena_alloc(a, sizeof(int) * (size_t)n);
	n = 0;
	starts[n++] = 0;
	for (int i = 0; i < src->len; i++)
		if (src->text[i] == '\n')
			starts[n++] = i + 1;
	src->line_starts = starts;
	src->nlines = n;
}

/* a UTF-8 byte-order mark that starts the file: the lexer skips it, and columns and the source
 * lines shown start after it */
static int bom_length(const Source *src)
{
	return src->len >= 3 && !memcmp(src->text, "\xef\xbb\xbf", 3) ? 3 : 0;
}

void diag_line_col(const Source *src, int off, int *line, int *col)
{
	int l = 1, c = 1;
	if (off > src->len)
		off = src->len;
	if (off < bom_length(src))
		off = bom_length(src);
	if (src->line_starts) { /* the last line start at or before off */
		int lo = 0, hi = src->nlines - 1;
		while (lo < hi) {
			int mid = (lo + hi + 1) / 2;
			if (src->line_starts[mid] <= off)
				lo = mid;
			else
				hi = mid - 1;
		}
		*line = lo + 1;
		*col = off - (lo ? src->line_starts[lo] : bom_length(src)) + 1;
		return;
	}
	for (int i = bom_length(src); i < off; i++) {
		if (src->text[i] == '\n') {
			l++;
			c = 1;
		} else {
			c++;
		}
	}
	*line = l;
	*col = c;
}

/* Prints the source line holding loc.off and a caret range under loc (clipped to the line). */
static void show_source_line(const Source *src, Loc loc)
{
	int off = loc.off < 0 ? 0 : loc.off > src->len ? src->len : loc.off;
	if (off < bom_length(src))
		off = bom_length(src);
	int start = off;
	while (start > bom_length(src) && src->text[start - 1] != '\n')
		start--;
	int end = off;
	while (end < src->len && src->text[end] != '\n')
		end++;
	int line, col;
	diag_line_col(src, off, &line, &col);
	FILE *f = out();
	fprintf(f, "%5d | ", line);
	for (int i = start; i < end; i++) {
		unsigned char ch = (unsigned char)src->text[i];
		fputc(ch == '\t' ? ' ' : (ch < 32 || ch == 127) ? '?' : ch, f);
	}
	fputc('\n', f);
	fprintf(f, "      | ");
	for (int i = start; i < off; i++)
		fputc(' ', f);
	fputc('^', f);
	int len = loc.len;
	if (off + len > end)
		len = end - off;
	for (int i = 1; i < len; i++)
		fputc('~', f);
	fputc('\n', f);
}

static void report(const char *kind, const Source *src, Loc loc, const char *fmt, va_list ap)
{
	FILE *f = out();
	if (src) {
		int line, col;
		diag_line_col(src, loc.off, &line, &col);
		fprintf(f, "%s:%d:%d: %s: ", src->path, line, col, kind);
	} else {
		fprintf(f, "planc: %s: ", kind);
	}
	vfprintf(f, fmt, ap);
	fputc('\n', f);
	if (src)
		show_source_line(src, loc);
}

void diag_error(const Source *src, Loc loc, const char *fmt, ...)
{
	error_count++;
	if (stopped)
		return;
	va_list ap;
	va_start(ap, fmt);
	muted = repeated("error", src, loc, fmt, ap);
	if (!muted && shown_errors == MAX_ERRORS) {
		fprintf(out(), "note: too many errors; stopping after %d\n", MAX_ERRORS);
		stopped = true;
	} else if (!muted) {
		shown_errors++;
		report("error", src, loc, fmt, ap);
	}
	va_end(ap);
}

void diag_warning(const Source *src, Loc loc, const char *fmt, ...)
{
	if (stopped)
		return;
	va_list ap;
	va_start(ap, fmt);
	muted = repeated("warning", src, loc, fmt, ap);
	if (!muted)
		report("warning", src, loc, fmt, ap);
	va_end(ap);
}

void diag_note(const Source *src, Loc loc, const char *fmt, ...)
{
	if (stopped || muted)
		return;
	va_list ap;
	va_start(ap, fmt);
	report("note", src, loc, fmt, ap);
	va_end(ap);
}

void diag_note_plain(const char *fmt, ...)
{
	if (stopped || muted)
		return;
	va_list ap;
	va_start(ap, fmt);
	FILE *f = out();
	fputs("note: ", f);
	vfprintf(f, fmt, ap);
	fputc('\n', f);
	va_end(ap);
}

_Noreturn void internal_error(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "planc: internal compiler error at %s:%d: ", file, line);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	fputs("planc: this is a bug in planc, not in your plan; please report it with the input\n", stderr);
	va_end(ap);
	fflush(NULL);
	abort();
}

static int edit_distance(const char *a, const char *b)
{
	int la = (int)strlen(a), lb = (int)strlen(b);
	if (la > 64 || lb > 64)
		return 1 << 20;
	int prev[65], cur[65];
	for (int j = 0; j <= lb; j++)
		prev[j] = j;
	for (int i = 1; i <= la; i++) {
		cur[0] = i;
		for (int j = 1; j <= lb; j++) {
			int cost = a[i - 1] == b[j - 1] ? 0 : 1;
			int v = prev[j - 1] + cost;
			if (prev[j] + 1 < v)
				v = prev[j] + 1;
			if (cur[j - 1] + 1 < v)
				v = cur[j - 1] + 1;
			cur[j] = v;
		}
		memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
	}
	return prev[lb];
}

const char *closest_name(const char *name, const char *const *candidates, int n)
{
	const char *best = NULL;
	int best_d = 1 << 20;
	int limit = (int)strlen(name) / 3 + 1;
	if (limit > 3)
		limit = 3;
	for (int i = 0; i < n; i++) {
		if (!candidates[i] || !strcmp(candidates[i], name))
			continue;
		int d = edit_distance(name, candidates[i]);
		if (d < best_d) {
			best_d = d;
			best = candidates[i];
		}
	}
	return best_d <= limit ? best : NULL;
}
