/* memplan.c: where every transient buffer lives, for one arena per rank.
 *
 * A stage may hold several micro-batches in flight (the pipeline schedule). Their activations are
 * kept in *slots*: one micro-batch's values from its forward to its backward, in a layout shared by
 * every micro-batch of a model chunk. The schedule table is walked to give each micro-batch and
 * chunk a slot (interval colouring: a slot is busy from the forward to the backward), and a
 * receive *inbox* where the forward's inputs arrive one action early (busy from the action before
 * the forward, when its receive is posted, to the backward). The arena is
 *     [ transient region | nslots slots | ninbox inboxes ]
 * where the transient region holds what lives within one phase call (a forward's temporaries, the
 * step's scratch). A stage that runs one micro-batch at a time with nothing received ahead plans
 * its forward and backward together in one slot placed over the transient region (they never run
 * at the same time as the other phases), which is the classic single-arena plan.
 *
 * Within each group (one phase call for the transient region, one chunk's forward-and-backward for
 * a slot) buffers get offsets by liveness and first fit by decreasing size, the way TFLite's arena
 * planner and XLA's heap simulator place buffers. A buffer that is sent stays live to the end of
 * its slot's backward: the walker completes sends only before the slot is reused. Persistent state
 * is sized here too (per kind) from the STATE buffers the program allocates. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

enum { ALIGN = 64 };

static size_t align(size_t x)
{
	return (x + ALIGN - 1) / ALIGN * ALIGN;
}

typedef struct Interval {
	int buf;
	size_t bytes;
	int first, last;
	size_t offset;
} Interval;

static int by_size_desc(const void *a, const void *b)
{
	const Interval *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	if (x->first != y->first)
		return x->first - y->first;
	return x->buf - y->buf;
}

/* A placed buffer's bytes [lo, hi). */
typedef struct Range {
	size_t lo, hi;
} Range;

/* Sorted, disjoint byte ranges: the union of some placed buffers' bytes. Adding a range merges
 * it with those it touches. The arrays come from a pool freed at once (a group's tree holds a
 * list at most of its nodes, most of a few ranges). */
typedef struct Segs {
	Range *r;
	int n, cap;
} Segs;

typedef struct RangePool {
	Range *chunk;
	size_t used, size;
	Range **chunks;
	int nchunks, capchunks;
} RangePool;

static Range *range_take(RangePool *pool, int n)
{
	if (pool->used + (size_t)n > pool->size) {
		pool->size = (size_t)n > 16384 ? (size_t)n : 16384;
		pool->chunk = malloc(sizeof(Range) * pool->size);
		if (pool->nchunks == pool->capchunks) {
			pool->capchunks = pool->capchunks ? 2 * pool->capchunks : 16;
			pool->chunks = realloc(pool->chunks, sizeof(Range *) * (size_t)pool->capchunks);
		}
		if (!pool->chunk || !pool->chunks)
			ICE("out of memory");
		pool->chunks[pool->nchunks++] = pool->chunk;
		pool->used = 0;
	}
	Range *r = pool->chunk + pool->used;
	pool->used += (size_t)n;
	return r;
}

/* Adds x to the union; false when it was there already. */
static bool segs_add(RangePool *pool, Segs *s, Range x)
{
	int a = 0, hi = s->n; /* the first range that ends at or after x starts */
	while (a < hi) {
		int mid = (a + hi) / 2;
		if (s->r[mid].hi < x.lo)
			a = mid + 1;
		else
			hi = mid;
	}
	if (a < s->n && s->r[a].lo <= x.lo && x.hi <= s->r[a].hi)
		return false;
	int b = a; /* ranges [a, b) touch x and merge with it */
	for (; b < s->n && s->r[b].lo <= x.hi; b++) {
		if (s->r[b].lo < x.lo)
			x.lo = s->r[b].lo;
		if (s->r[b].hi > x.hi)
			x.hi = s->r[b].hi;
	}
	if (a == b && s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 4;
		Range *r = range_take(pool, cap);
		if (s->n) /* a list never grown has no array */
			memcpy(r, s->r, sizeof(Range) * (size_t)s->n);
		s->r = r;
		s->cap = cap;
	}
	memmove(&s->r[a + 1], &s->r[b], sizeof(Range) * (size_t)(s->n - b));
	s->r[a] = x;
	s->n += 1 - (b - a);
	return true;
}

/* The bytes that placed buffers occupy at some time of a window, as a union, without visiting
 * the buffers one by one: a segment tree over the group's kernel positions where each node keeps
 * the union of the buffers whose lifetime covers the node's positions and is split there (cover),
 * and the union of every buffer split at the node or below it (below). A buffer alive somewhere
 * in a window either covers one of the window's nodes or an ancestor of one (cover, up the
 * paths), or is split below one of them (below). First fit needs only the union: the lowest gap
 * of a buffer's size in it is where the buffer goes, exactly as when each overlapping buffer is
 * looked at. The unions stay a few ranges (buffers packed side by side merge), so a query costs
 * about log^2 of the group, however many buffers are alive across it: thousands in a large
 * model's backward, where a buffer-by-buffer search took most of planc's time. */
typedef struct Occupancy {
	int leaves;       /* a power of two, at least the group's positions */
	Segs *cover, *below;
	RangePool pool;
	int *stamp;       /* per node: the query that collected its cover last */
	int query;
} Occupancy;

static void occupancy_init(Occupancy *o, int positions)
{
	for (o->leaves = 1; o->leaves < positions; o->leaves *= 2)
		;
	o->cover = calloc(2 * (size_t)o->leaves, sizeof(Segs));
	o->below = calloc(2 * (size_t)o->leaves, sizeof(Segs));
	o->stamp = calloc(2 * (size_t)o->leaves, sizeof(int));
	o->query = 0;
	memset(&o->pool, 0, sizeof o->pool);
	if (!o->cover || !o->below || !o->stamp)
		ICE("out of memory");
}

static void occupancy_free(Occupancy *o)
{
	for (int i = 0; i < o->pool.nchunks; i++)
		free(o->pool.chunks[i]);
	free(o->pool.chunks);
	free(o->cover);
	free(o->below);
	free(o->stamp);
}

static void occupancy_add(Occupancy *o, const Interval *x)
{
	Range r = {x->offset, x->offset + x->bytes};
	for (int l = x->first + o->leaves, h = x->last + 1 + o->leaves; l < h; l /= 2, h /= 2) {
		int nodes[2], nn = 0;
		if (l & 1)
			nodes[nn++] = l++;
		if (h & 1)
			nodes[nn++] = --h;
		for (int i = 0; i < nn; i++) {
			segs_add(&o->pool, &o->cover[nodes[i]], r);
			/* an ancestor's union holds its descendants': once one has r, the rest have it */
			for (int a = nodes[i]; a >= 1 && segs_add(&o->pool, &o->below[a], r); a /= 2)
				;
		}
	}
}

/* The unions whose union is what the placed buffers occupy at some time in x's lifetime: the
 * below lists of x's window's nodes and the cover lists of their ancestors. */
static int occupancy_of(Occupancy *o, const Interval *x, const Segs **out)
{
	int n = 0, q = ++o->query;
	for (int l = x->first + o->leaves, h = x->last + 1 + o->leaves; l < h; l /= 2, h /= 2) {
		int nodes[2], nn = 0;
		if (l & 1)
			nodes[nn++] = l++;
		if (h & 1)
			nodes[nn++] = --h;
		for (int i = 0; i < nn; i++) {
			if (o->below[nodes[i]].n)
				out[n++] = &o->below[nodes[i]];
			for (int a = nodes[i] / 2; a >= 1 && o->stamp[a] != q; a /= 2) {
				o->stamp[a] = q;
				if (o->cover[a].n)
					out[n++] = &o->cover[a];
			}
		}
	}
	return n;
}

/* The lowest offset where size bytes fit between the ranges of the sorted lists: a sweep in
 * offset order over their merge (a heap of the lists' next ranges), stopping at the first gap
 * that is large enough. The same offset as a first fit over every overlapping buffer. */
typedef struct Cursor {
	const Segs *s;
	int at;
} Cursor;

/* Moves heap[j] down a binary min-heap of n cursors ordered by their next range's start. */
static void sift_down(Cursor *heap, int n, int j)
{
	for (;;) {
		int m = j, l = 2 * j + 1, r = l + 1;
		if (l < n && heap[l].s->r[heap[l].at].lo < heap[m].s->r[heap[m].at].lo)
			m = l;
		if (r < n && heap[r].s->r[heap[r].at].lo < heap[m].s->r[heap[m].at].lo)
			m = r;
		if (m == j)
			return;
		Cursor t = heap[j];
		heap[j] = heap[m];
		heap[m] = t;
		j = m;
	}
}

static size_t lowest_gap(Cursor *heap, int n, size_t size)
{
	for (int i = n / 2 - 1; i >= 0; i--)
		sift_down(heap, n, i);
	size_t off = 0;
	while (n > 0) {
		Range x = heap[0].s->r[heap[0].at];
		if (x.lo >= off + size)
			break;
		if (x.hi > off)
			off = x.hi;
		if (++heap[0].at == heap[0].s->n)
			heap[0] = heap[--n];
		sift_down(heap, n, 0);
	}
	return off;
}

/* First fit by decreasing size over kernel positions [0, positions); returns the region's size. */
static size_t place(Interval *iv, int n, int positions)
{
	qsort(iv, (size_t)n, sizeof *iv, by_size_desc);
	Occupancy o;
	occupancy_init(&o, positions);
	int depth = 2;
	for (int l = 1; l < o.leaves; l *= 2)
		depth++;
	const Segs **lists = malloc(sizeof(Segs *) * (size_t)(4 * depth));
	Cursor *heap = malloc(sizeof(Cursor) * (size_t)(4 * depth));
	if (!lists || !heap)
		ICE("out of memory");
	size_t top = 0;
	for (int i = 0; i < n; i++) {
		Interval *x = &iv[i];
		int nl = occupancy_of(&o, x, lists);
		for (int j = 0; j < nl; j++)
			heap[j] = (Cursor){lists[j], 0};
		x->offset = lowest_gap(heap, nl, x->bytes);
		occupancy_add(&o, x);
		if (x->offset + x->bytes > top)
			top = x->offset + x->bytes;
	}
	free(lists);
	free(heap);
	occupancy_free(&o);
	return top;
}

static bool forward_side(Phase ph)
{
	return ph == PH_PREPARE_F || ph == PH_FORWARD;
}

static bool backward_side(Phase ph)
{
	return ph == PH_PREPARE_B || ph == PH_BACKWARD;
}

static bool micro_phase(Phase ph)
{
	return forward_side(ph) || backward_side(ph);
}

/* ------------------------------------------------------------------ slots */

/* Indices of slots (or inboxes) as a set of free ones: the lowest free one is taken (a bitmap
 * scanned a word at a time), and a unit's slot is released when its backward has run. */
typedef struct Pool {
	unsigned long long *free; /* bit i: index i is free */
	int n, words;
} Pool;

static int pool_take(Pool *p)
{
	for (int w = 0; w < p->words; w++)
		if (p->free[w]) {
			int i = w * 64 + __builtin_ctzll(p->free[w]);
			p->free[w] &= p->free[w] - 1;
			return i;
		}
	if (p->n == p->words * 64) {
		p->words = p->words ? 2 * p->words : 1;
		p->free = realloc(p->free, sizeof(unsigned long long) * (size_t)p->words);
		if (!p->free)
			ICE("out of memory");
		for (int w = p->words / 2; w < p->words; w++)
			p->free[w] = 0;
		if (p->words == 1)
			p->free[0] = 0;
	}
	return p->n++;
}

static void pool_release(Pool *p, int i)
{
	if (i >= 0)
		p->free[i / 64] |= 1ull << (i % 64);
}

/* The stage's actions with a slot per in-flight micro-batch and chunk, and an inbox where the
 * forward receives. */
static void assign_slots(LProg *p)
{
	Graph *g = p->g;
	const Schedule *sc = g->sched;
	int v = p->nchunks;
	bool *receives = calloc((size_t)v, sizeof(bool));
	if (!receives)
		ICE("out of memory");
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].phase == PH_PREPARE_F)
			receives[p->k[i].chunk] = true;
	int n = sc ? 2 * sc->micro * sc->chunks : 0;
	int m = sc ? sc->micro : 1;
	p->actions = arena_alloc(g->arena, sizeof(SlotAction) * (size_t)(n ? n : 1));
	p->nactions = n;
	int *fwd_at = malloc(sizeof(int) * (size_t)(m * v)), *bwd_at = malloc(sizeof(int) * (size_t)(m * v));
	int *slot = malloc(sizeof(int) * (size_t)(m * v)), *inbox = malloc(sizeof(int) * (size_t)(m * v));
	if (!fwd_at || !bwd_at || !slot || !inbox)
		ICE("out of memory");
	for (int t = 0; t < n; t++) {
		const Action *a = &sc->table[p->stage][t];
		int unit = a->micro * v + a->chunk;
		(a->kind == ACT_FORWARD ? fwd_at : bwd_at)[unit] = t;
	}
	Pool slots = {0}, inboxes = {0};
	for (int t = -1; t < n; t++) {
		/* what starts at t: the inbox of the forward at t + 1, the slot of the forward at t; what
		 * ends at t: the backward's slot and inbox */
		if (t + 1 < n) {
			const Action *a = &sc->table[p->stage][t + 1];
			int unit = a->micro * v + a->chunk;
			if (a->kind == ACT_FORWARD)
				inbox[unit] = receives[a->chunk] ? pool_take(&inboxes) : -1;
		}
		if (t >= 0) {
			const Action *a = &sc->table[p->stage][t];
			int unit = a->micro * v + a->chunk;
			if (a->kind == ACT_FORWARD)
				slot[unit] = pool_take(&slots);
			if (bwd_at[unit] == t) { /* the unit's last action */
				pool_release(&slots, slot[unit]);
				pool_release(&inboxes, inbox[unit]);
			}
		}
	}
	for (int t = 0; t < n; t++) {
		const Action *a = &sc->table[p->stage][t];
		int unit = a->micro * v + a->chunk;
		p->actions[t] = (SlotAction){a->kind, a->micro, a->chunk, slot[unit], inbox[unit]};
	}
	p->nslots = slots.n ? slots.n : 1;
	p->ninbox = inboxes.n;
	free(slots.free);
	free(inboxes.free);
	free(fwd_at);
	free(bwd_at);
	free(slot);
	free(inbox);
	free(receives);
}

/* ------------------------------------------------------------------ classes */

/* Which region each transient buffer of a forward / backward lives in. */
static void classify(LProg *p, bool unified)
{
	int nb = p->nbuf;
	unsigned char *side = calloc((size_t)nb, 1); /* bit 1 forward side, 2 backward side, 4 other phases */
	bool *sent = calloc((size_t)nb, 1), *inbox = calloc((size_t)nb, 1), *recv_b = calloc((size_t)nb, 1);
	int *chunk = malloc(sizeof(int) * (size_t)nb);
	if (!side || !sent || !inbox || !recv_b || !chunk)
		ICE("out of memory");
	for (int b = 0; b < nb; b++)
		chunk[b] = -1;
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		unsigned char bit = forward_side(k->phase) ? 1 : backward_side(k->phase) ? 2 : 4;
		for (int pass = 0; pass < 2; pass++) {
			const int *list = pass ? k->defs : k->uses;
			int cnt = pass ? k->ndefs : k->nuses;
			for (int j = 0; j < cnt; j++) {
				int r = buffer_root(p, list[j]);
				side[r] |= bit;
				if (bit != 4)
					chunk[r] = k->chunk;
				if (k->kind == K_SEND_START && !pass)
					sent[r] = true;
				if (k->kind == K_RECV_START && pass)
					(k->phase == PH_PREPARE_F ? inbox : recv_b)[r] = true;
			}
		}
	}
	for (int b = 0; b < nb; b++) {
		Buffer *x = &p->buf[b];
		if (x->cls != BUF_ARENA || !(side[b] & 3))
			continue;
		x->chunk = chunk[b] < 0 ? 0 : chunk[b];
		if (inbox[b] && !unified)
			x->cls = BUF_INBOX;
		else if (unified || (side[b] & 3) == 3 || sent[b] || recv_b[b])
			x->cls = BUF_SLOT;
	}
	free(side);
	free(sent);
	free(inbox);
	free(recv_b);
	free(chunk);
}

/* ------------------------------------------------------------------ placement */

/* Places the buffers of class cls that kernels seq[0..n) touch; sent buffers (slot) stay live to
 * the end. Returns the group's size. */
static size_t plan_group(LProg *p, const int *seq, int n, BufClass cls, int group, int *first, int *last)
{
	int nb = p->nbuf;
	for (int b = 0; b < nb; b++)
		first[b] = last[b] = -1;
	for (int s = 0; s < n; s++) {
		const Kernel *k = &p->k[seq[s]];
		for (int pass = 0; pass < 2; pass++) {
			const int *list = pass ? k->defs : k->uses;
			int cnt = pass ? k->ndefs : k->nuses;
			for (int j = 0; j < cnt; j++) {
				int r = buffer_root(p, list[j]);
				if (p->buf[r].cls != cls)
					continue;
				if (first[r] < 0)
					first[r] = s;
				last[r] = s;
				if (k->kind == K_SEND_START && cls == BUF_SLOT)
					last[r] = n; /* until the slot is reused */
			}
		}
	}
	Interval *iv = malloc(sizeof(Interval) * (size_t)(nb + 1));
	if (!iv)
		ICE("out of memory");
	int ni = 0;
	for (int b = 0; b < nb; b++)
		if (first[b] >= 0)
			iv[ni++] = (Interval){b, align(p->buf[b].bytes ? p->buf[b].bytes : 1), first[b], last[b], 0};
	size_t top = place(iv, ni, n + 1);
	for (int i = 0; i < ni; i++) {
		Buffer *x = &p->buf[iv[i].buf];
		x->offset = iv[i].offset;
		x->first = iv[i].first;
		x->last = iv[i].last;
		x->group = group;
	}
	free(iv);
	return align(top);
}

static int phase_rank(Phase ph)
{
	switch (ph) {
	case PH_PREPARE_F:
		return 0;
	case PH_FORWARD:
		return 1;
	case PH_PREPARE_B:
		return 2;
	case PH_BACKWARD:
		return 3;
	default:
		return 4;
	}
}

static void memplan_prog(LProg *p)
{
	assign_slots(p);
	bool unified = p->nslots == 1 && p->ninbox == 0;
	classify(p, unified);
	int *seq = malloc(sizeof(int) * (size_t)(p->nk + 1));
	int *first = malloc(sizeof(int) * (size_t)p->nbuf), *last = malloc(sizeof(int) * (size_t)p->nbuf);
	if (!seq || !first || !last)
		ICE("out of memory");
	int group = 0;
	/* the transient region: each phase call on its own */
	size_t transient = 0;
	for (int ph = 0; ph < PH_COUNT; ph++)
		for (int c = 0; c < (micro_phase((Phase)ph) ? p->nchunks : 1); c++) {
			int n = 0;
			for (int i = 0; i < p->nk; i++)
				if (p->k[i].phase == (Phase)ph && (!micro_phase((Phase)ph) || p->k[i].chunk == c))
					seq[n++] = i;
			size_t sz = plan_group(p, seq, n, BUF_ARENA, group++, first, last);
			if (sz > transient)
				transient = sz;
		}
	/* slots and inboxes: one layout per chunk, the largest sets the size */
	size_t slot = 0, inbox = 0;
	for (int c = 0; c < p->nchunks; c++) {
		int n = 0;
		for (int r = 0; r < 4; r++)
			for (int i = 0; i < p->nk; i++)
				if (p->k[i].chunk == c && micro_phase(p->k[i].phase) && phase_rank(p->k[i].phase) == r)
					seq[n++] = i;
		size_t s = plan_group(p, seq, n, BUF_SLOT, group++, first, last);
		if (s > slot)
			slot = s;
		size_t b = plan_group(p, seq, n, BUF_INBOX, group++, first, last);
		if (b > inbox)
			inbox = b;
	}
	p->transient_bytes = transient;
	p->slot_bytes = slot;
	p->inbox_bytes = inbox;
	if (unified) {
		p->slot_offset = 0;
		p->inbox_offset = 0;
		p->arena_bytes = slot > transient ? slot : transient;
	} else {
		p->slot_offset = transient;
		p->inbox_offset = transient + (size_t)p->nslots * slot;
		p->arena_bytes = p->inbox_offset + (size_t)p->ninbox * inbox;
	}
	memset(p->state_bytes, 0, sizeof p->state_bytes);
	memset(p->host_state_bytes, 0, sizeof p->host_state_bytes);
	for (int b = 0; b < p->nbuf; b++)
		if (p->buf[b].cls == BUF_STATE) {
			p->state_bytes[p->buf[b].state] += p->buf[b].bytes;
			if (p->buf[b].place == PLACE_HOST)
				p->host_state_bytes[p->buf[b].state] += p->buf[b].bytes;
		}
	free(seq);
	free(first);
	free(last);
}

int memplan_slots(LProg *p)
{
	assign_slots(p);
	return p->nslots;
}

bool memplan(Lowered *low)
{
	for (int i = 0; i < low->nprogs; i++)
		memplan_prog(low->progs[i]);
	return true;
}
