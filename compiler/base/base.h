/* base.h: what every part of the compiler uses: the arena every compilation allocates from
 * (arena.c), string-keyed hash tables (symtab.c) and the one diagnostic printer with source
 * locations as byte offsets (diag.c). It includes nothing of the compiler's. */
#ifndef PLANC_BASE_H
#define PLANC_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PLANC_VERSION "0.1.0"

typedef struct Arena Arena;
typedef struct Source Source;

/* ---------------------------------------------------------------- arena.c */
/* One arena per compilation: everything the compiler allocates lives until arena_free. */
Arena *arena_new(void);
void *arena_alloc(Arena *a, size_t n); /* zeroed, 16-byte aligned; aborts on OOM */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);
/* Empties the arena as arena_free would, but keeps its memory for what it allocates next: a
 * caller compiling many plans one after another (planc search) touches the same pages again
 * instead of faulting in fresh ones. Nothing allocated before may be used after. */
void arena_reset(Arena *a);
/* *slot is a heap array (malloc, realloc) that lives as long as the arena: arena_free frees it. For
 * the big arrays that grow (a program's kernels and buffers), where realloc can move pages instead
 * of leaving a copy in the arena at each doubling. slot itself must live in the arena. */
void arena_own(Arena *a, void **slot);
/* Tunes the process's malloc for a compiler that grows and frees arrays of tens of MiB (kept, not
 * unmapped; transparent huge pages): called once, first thing in main. */
void heap_tune(void);

/* ---------------------------------------------------------------- symtab.c */
/* String-keyed hash tables (open addressing) in an arena, for every name lookup: expected O(1).
 * symtab_put adds or replaces; keys are not copied. */
typedef struct SymTab SymTab;
SymTab *symtab_new(Arena *a);
void *symtab_get(const SymTab *t, const char *key); /* NULL if absent (or t is NULL) */
void symtab_put(SymTab *t, const char *key, void *value);

/* ---------------------------------------------------------------- diag.c */
/* Locations are byte offsets into a Source; line and column are computed only when reporting. */
typedef struct Loc {
	int off; /* byte offset of the first character */
	int len; /* length in bytes (>= 0) */
} Loc;

struct Source {
	const char *path; /* as given on the command line, used in messages */
	const char *text; /* NUL-terminated */
	int len;
	const int *line_starts; /* byte offset of each line (diag_index_lines), or NULL: scanned */
	int nlines;
};

Loc loc_span(Loc a, Loc b); /* from the start of a to the end of b */
void diag_error(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note_plain(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* "note: ..." with no location */
int diag_error_count(void);
/* After 20 errors one note says so and later diagnostics are dropped: the lexer, sema and the
 * driver stop when diag_stopped() (compilers' -fmax-errors). diag_reset starts counting again. */
bool diag_stopped(void);
void diag_reset(void);
void diag_index_lines(Arena *a, Source *src); /* a line table for src, so line:col is a lookup */
void diag_set_stream(FILE *f); /* default stderr */
void diag_line_col(const Source *src, int off, int *line, int *col); /* 1-based */
/* Internal errors: a bug in planc, never the user's fault. Prints and aborts. */
_Noreturn void internal_error(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define ICE(...) internal_error(__FILE__, __LINE__, __VA_ARGS__)
#define internal_assert(c) ((c) ? (void)0 : ICE("assertion failed: %s", #c))
/* did-you-mean: the closest of candidates[0..n) to name by edit distance, or NULL */
const char *closest_name(const char *name, const char *const *candidates, int n);

#endif
