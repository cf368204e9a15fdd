/* arena.c: one arena per compilation. The compiler allocates AST nodes, IR values and strings
 * from it and never frees them one by one; arena_free releases everything at once (QBE's
 * alloc/freeall). Blocks grow geometrically so a 96-layer model costs a handful of mallocs. Blocks
 * of 2 MiB and more are aligned to 2 MiB and offered to the kernel as transparent huge pages: a
 * 1T-parameter program fills a few hundred MiB of arena, and touching it 4 KiB at a time cost more
 * page faults than the passes' work. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

/* Out of memory is the machine's limit, not a bug in planc and not the plan's mistake: one line and
 * exit status 1 (the arena sits below the diagnostic printer, which allocates from it). */
static _Noreturn void out_of_memory(size_t bytes)
{
	fflush(stdout);
	fprintf(stderr, "planc: error: out of memory (allocating %zu bytes); free memory or compile on a larger machine\n",
		bytes);
	exit(1);
}

typedef struct Block {
	struct Block *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
} Block;

/* A heap array the arena frees with itself (arena_own): *slot when the arena is freed. */
typedef struct Owned {
	struct Owned *next;
	void **slot;
} Owned;

struct Arena {
	Block *head;
	size_t next_cap;
	Owned *owned;
	Block *spare; /* blocks arena_reset emptied, largest first: used again before new ones */
};

Arena *arena_new(void)
{
	Arena *a = calloc(1, sizeof *a);
	if (!a)
		out_of_memory(sizeof *a);
	a->next_cap = 64 * 1024;
	return a;
}

enum { HUGE_PAGE = 2u << 20 };

/* The process heap, tuned once when planc starts (heap_tune, from main). A 1T-parameter program
 * grows arrays of tens of MiB (kernels, buffers, the liveness of each) and frees and allocates
 * again per pass; with glibc's defaults each array over 128 KiB is its own mmap, unmapped on free,
 * and every page is faulted in 4 KiB at a time again by the next pass: 12,000 faults and about
 * half of the 1T ZeRO-3 plan's CPU time went to them (more on a virtual machine, where a fault
 * costs more). Here arrays up to 32 MiB come from the brk heap, freed memory is kept for the next
 * pass instead of trimmed, the heap grows 256 MiB at a time (address space only: pages are touched
 * when used), and the heap is offered to the kernel as transparent huge pages (what
 * GLIBC_TUNABLES=glibc.malloc.hugetlb=1 does): about 500 faults, and a peak resident memory
 * 10 MiB higher (146 MiB for that plan). A hint: where the kernel has no huge pages to give, or
 * malloc is not glibc's (a sanitizer's), nothing changes but the time. */
enum { HEAP_MMAP_THRESHOLD = 32u << 20, HEAP_TRIM_THRESHOLD = 512u << 20, HEAP_PAD = 256u << 20 };
static uintptr_t heap_advised_lo, heap_advised_hi; /* the brk heap offered as huge pages so far */

/* Offers the heap's new end (since the last call) as huge pages: a hint, one system call when the
 * heap grew, none otherwise. */
static void heap_advise(void)
{
	if (!heap_advised_lo)
		return;
	uintptr_t end = (uintptr_t)sbrk(0);
	if (end == (uintptr_t)-1 || end <= heap_advised_hi)
		return;
	(void)madvise((void *)heap_advised_hi, end - heap_advised_hi, MADV_HUGEPAGE);
	heap_advised_hi = end;
}

void heap_tune(void)
{
	(void)mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD);
	(void)mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD);
	(void)mallopt(M_TOP_PAD, HEAP_PAD);
	/* grows the heap once now (freed at once, kept as the heap's top) so that it can be advised */
	void *probe = malloc(HEAP_MMAP_THRESHOLD / 2);
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), end = (uintptr_t)sbrk(0);
	if (probe && end != (uintptr_t)-1 && (uintptr_t)probe < end) { /* from the brk heap, not an mmap */
		heap_advised_lo = heap_advised_hi = (uintptr_t)probe / page * page;
		heap_advise();
	}
	free(probe);
}

static Block *block_alloc(size_t bytes)
{
	heap_advise();
	if (bytes < HUGE_PAGE)
		return malloc(bytes);
	bytes = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
	Block *b = aligned_alloc(HUGE_PAGE, bytes);
	if (b)
		(void)madvise(b, bytes, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
	return b;
}

void *arena_alloc(Arena *a, size_t n)
{
	if (n > SIZE_MAX / 4)
		out_of_memory(n);
	n = (n + 15) & ~(size_t)15;
	Block *b = a->head;
	if ((!b || b->cap - b->used < n) && a->spare && a->spare->cap >= n) {
		b = a->spare;
		a->spare = b->next;
		b->next = a->head;
		b->used = 0;
		a->head = b;
	} else if (!b || b->cap - b->used < n) {
		size_t cap = a->next_cap;
		while (cap < n)
			cap *= 2;
		if (a->next_cap < (64u << 20))
			a->next_cap *= 2;
		b = block_alloc(sizeof *b + cap);
		if (!b)
			out_of_memory(sizeof *b + cap);
		b->next = a->head;
		b->used = 0;
		b->cap = cap;
		a->head = b;
	}
	void *p = b->data + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n)
{
	char *p = arena_alloc(a, n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

char *arena_strdup(Arena *a, const char *s)
{
	return arena_strndup(a, s, strlen(s));
}

char *arena_printf(Arena *a, const char *fmt, ...)
{
	va_list ap, ap2;
	va_start(ap, fmt);
	va_copy(ap2, ap);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *p = arena_alloc(a, (size_t)n + 1);
	vsnprintf(p, (size_t)n + 1, fmt, ap2);
	va_end(ap2);
	return p;
}

void arena_own(Arena *a, void **slot)
{
	Owned *o = arena_alloc(a, sizeof *o);
	o->slot = slot;
	o->next = a->owned;
	a->owned = o;
}

static void free_blocks(Block *b)
{
	while (b) {
		Block *next = b->next;
		free(b);
		b = next;
	}
}

static void free_owned(Arena *a)
{
	for (Owned *o = a->owned; o; o = o->next)
		free(*o->slot);
	a->owned = NULL;
}

void arena_reset(Arena *a)
{
	free_owned(a);
	while (a->head) { /* into the spare list, largest first (a few dozen blocks) */
		Block *b = a->head, **at = &a->spare;
		a->head = b->next;
		while (*at && (*at)->cap > b->cap)
			at = &(*at)->next;
		b->next = *at;
		*at = b;
	}
}

void arena_free(Arena *a)
{
	if (!a)
		return;
	free_owned(a);
	free_blocks(a->head);
	free_blocks(a->spare);
	free(a);
}
