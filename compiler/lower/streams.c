/* streams.c: the device schedule of every stage program (the pass after memplan).
 *
 * A GPU runs kernels on streams: each stream runs its work in order, and two streams are ordered
 * only by events (one records an event after a kernel, another waits for it). This pass decides,
 * for every kernel of the loop-level IR, the stream it runs on and the events it waits for, so that
 * the program computes exactly what the C target computes (which runs every kernel in program
 * order) while communication and copies overlap compute. The CUDA printer (emit_cuda.c) prints the
 * result; the C and LLVM targets ignore it. It is data, and tests/cuda checks it on a CPU.
 *
 *   streams   compute kernels and fused loops on the compute stream; collectives (gradient buckets,
 *             tensor- and sequence-parallel conversions, ZeRO gathers) on the communication stream;
 *             input loading and offload copies on the copy stream; what runs on the host (the
 *             offloaded optimizer, disk I/O) on the host "stream" (the host thread, in program
 *             order); pipeline sends and receives on a stream per channel and direction, so that
 *             each channel is a FIFO of its own as the MPI tags make it on the CPU. The waits of
 *             a request (finish, progress, p2p_finish) run on compute: they make compute wait for
 *             the request's event, which planrt records when it starts the operation.
 *   events    within one phase call (a phase function: a micro-batch's forward or backward of a
 *             chunk, the step, ...) kernel j waits for the latest earlier kernel i on each other
 *             stream whose memory it conflicts with (i writes what j reads or writes, or reads
 *             what j writes). Memory is compared as byte ranges: the arena's transient region,
 *             the running slot and inbox by their planned offsets (buffers that share bytes at
 *             different times conflict too), state by root buffer and view offset (a view at a
 *             coordinate-dependent offset covers its whole root). A wait is left out when stream
 *             order and the waits already made imply it (vector clocks).
 *   entry     a phase call's first kernel on a stream other than compute (the host's too) waits
 *             for the compute stream as it was when the call began (unless an in-call wait implies
 *             it), so it sees everything earlier calls wrote;
 *   exit      the call ends with the compute stream waiting for the last kernel on each other
 *             stream that no request tracks (join). Started operations (overlapped buckets,
 *             ZeRO-3 prefetches, pipeline transfers: a request argument) are not joined: their
 *             finish kernel, or the walker before a slot is reused, waits for them, which is what
 *             lets a bucket's reduction run across the rest of the backward.
 *   host      a kernel on the host waits for a device kernel by synchronising with its event; a
 *             device kernel never waits for a host kernel: it is enqueued after the host kernel
 *             returned, and so after everything the host had waited for. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

const char *stream_name(int stream, char *buf, size_t n)
{
	static const char *const names[] = {"compute", "comm", "copy", "host"};
	if (stream < STREAM_P2P)
		snprintf(buf, n, "%s", names[stream]);
	else
		snprintf(buf, n, "p2p%d_%s", (stream - STREAM_P2P) / 2, (stream - STREAM_P2P) % 2 ? "recv" : "send");
	return buf;
}

static bool has_request(const Kernel *k)
{
	for (int a = 0; a < k->nargs; a++)
		if (k->args[a].kind == KA_REQ || k->args[a].kind == KA_SLOTREQ)
			return true;
	return false;
}

/* A kernel runs on the host when every buffer it touches lives in host memory (offloaded state). */
static bool on_host(const LProg *p, const Kernel *k)
{
	if (k->kind == K_OFFLOAD_COPY || k->nuses + k->ndefs == 0)
		return false;
	for (int i = 0; i < k->nuses + k->ndefs; i++) {
		int b = buffer_root(p, i < k->nuses ? k->uses[i] : k->defs[i - k->nuses]);
		if (p->buf[b].cls != BUF_STATE || p->buf[b].place != PLACE_HOST)
			return false;
	}
	return true;
}

/* The stream of a kernel, by its kind and class and where its buffers live. */
static int stream_of(const LProg *p, const Kernel *k)
{
	switch (k->kind) {
	case K_SEND_START:
	case K_RECV_START: {
		int channel = k->ncomm ? k->comm[0].channel : 0;
		return STREAM_P2P + 2 * (channel > 0 ? channel : 0) + (k->kind == K_RECV_START);
	}
	case K_LOAD_INPUT:
	case K_OFFLOAD_COPY:
		return STREAM_COPY;
	case K_OFFLOAD_OPEN:
	case K_OFFLOAD_READ:
	case K_OFFLOAD_WRITE:
	case K_OFFLOAD_WAIT:
		return STREAM_HOST;
	default:
		break;
	}
	if (on_host(p, k))
		return STREAM_HOST;
	return kernel_classes[k->kind] == KC_COMM ? STREAM_COMM : STREAM_COMPUTE;
}

/* The bytes a buffer occupies: a region (0 the transient arena, 1 the running slot, 2 the running
 * inbox, 3 + b state buffer b) and a byte range in it; whole: the range is unknown (a view at a
 * coordinate-dependent offset), so the whole region counts. */
typedef struct Span {
	int region;
	long long lo, hi;
	bool whole;
} Span;

static Span span_of(const LProg *p, int b)
{
	Span s = {0, 0, 0, false};
	long long off = 0;
	while (p->buf[b].cls == BUF_VIEW) {
		const Buffer *x = &p->buf[b];
		if (x->view_axis >= 0 || x->view_axis == VIEW_SLOT)
			s.whole = true;
		off += x->view_off * dtype_bytes(p->buf[x->view_of].dtype);
		b = x->view_of;
	}
	const Buffer *x = &p->buf[b];
	switch (x->cls) {
	case BUF_ARENA:
		s.region = 0;
		off += (long long)x->offset;
		break;
	case BUF_SLOT:
		s.region = 1;
		off += (long long)x->offset;
		break;
	case BUF_INBOX:
		s.region = 2;
		off += (long long)x->offset;
		break;
	default:
		s.region = 3 + b;
		break;
	}
	s.lo = off;
	s.hi = off + (long long)p->buf[b].bytes;
	if (s.hi == s.lo)
		s.hi = s.lo + 1;
	return s;
}

enum { NONE = -2, ENTRY = -1 };

static bool overlaps(Span a, Span b)
{
	return a.region == b.region && (a.whole || b.whole || (a.lo < b.hi && b.lo < a.hi));
}

/* The accesses of a phase call's kernels so far, by stream, so that finding the latest earlier
 * kernel of a stream that conflicts with a kernel does not walk the stream's kernels (a walk grew
 * with the call's compute kernels times its in-flight collectives):
 *   - a state buffer's accesses (region 3 + b) in a chain per (stream, region), from the latest
 *     back: few kernels touch one state buffer in a call;
 *   - the transient regions' bytes (arena, slot, inbox: every temporary shares them) in two trees
 *     per stream, writes and reads: segment trees over the byte ranges of the program's buffers
 *     (their bounds, sorted), each node keeping the latest position of an access split at it
 *     (tag) and at or below it (below). The latest access overlapping a range is then a range
 *     maximum, log n. */
typedef struct Access {
	int pos;        /* the kernel's position in the call */
	bool write;
	Span span;
	int prev;       /* the previous access of the same stream and region, or -1 */
} Access;

typedef struct Latest {
	int *tag, *below; /* per node: the latest position + 1 (0: none) */
	int *touched;     /* nodes set in this call (reset after it) */
	int ntouched, cap;
} Latest;

typedef struct Accesses {
	int nregions, ns;
	int *head;      /* [stream * nregions + region]: the latest access, or -1 */
	Access *a;
	int n, cap;
	int *touched;   /* head entries set in this call (reset after it) */
	int ntouched, captouched;
	unsigned long long *keys; /* the transient regions' byte bounds, (region << 56) + byte, sorted */
	int nkeys, leaves;
	Latest *latest; /* [stream * 2 + write] */
	int *count;     /* per stream: its accesses in this call (none: nothing to look up) */
} Accesses;

enum { TRANSIENT_REGIONS = 3 };

static unsigned long long key_of(int region, long long byte)
{
	return ((unsigned long long)region << 56) + (unsigned long long)byte;
}

static int by_key(const void *a, const void *b)
{
	unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
	return (x > y) - (x < y);
}

/* A span's bounds as keys: a whole-region span covers its region. */
static void span_keys(Span x, unsigned long long *lo, unsigned long long *hi)
{
	*lo = x.whole ? key_of(x.region, 0) : key_of(x.region, x.lo);
	*hi = x.whole ? key_of(x.region + 1, 0) : key_of(x.region, x.hi);
}

static int key_index(const Accesses *A, unsigned long long k)
{
	int lo = 0, hi = A->nkeys;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (A->keys[mid] < k)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void accesses_init(Accesses *A, const LProg *p, const Span *spans, int ns)
{
	memset(A, 0, sizeof *A);
	A->nregions = TRANSIENT_REGIONS + p->nbuf;
	A->ns = ns;
	A->head = malloc(sizeof(int) * (size_t)ns * (size_t)A->nregions);
	A->keys = malloc(sizeof(unsigned long long) * (2 * (size_t)p->nbuf + 2));
	A->latest = calloc(2 * (size_t)ns, sizeof(Latest));
	A->count = calloc((size_t)ns, sizeof(int));
	if (!A->head || !A->keys || !A->latest || !A->count)
		ICE("out of memory");
	for (int h = 0; h < ns * A->nregions; h++)
		A->head[h] = -1;
	for (int b = 0; b < p->nbuf; b++)
		if (spans[b].region < TRANSIENT_REGIONS)
			span_keys(spans[b], &A->keys[A->nkeys], &A->keys[A->nkeys + 1]), A->nkeys += 2;
	qsort(A->keys, (size_t)A->nkeys, sizeof *A->keys, by_key);
	int u = 0;
	for (int i = 0; i < A->nkeys; i++)
		if (!u || A->keys[i] != A->keys[u - 1])
			A->keys[u++] = A->keys[i];
	A->nkeys = u;
	for (A->leaves = 1; A->leaves < A->nkeys; A->leaves *= 2)
		;
}

static void accesses_free(Accesses *A)
{
	for (int i = 0; i < 2 * A->ns; i++) {
		free(A->latest[i].tag);
		free(A->latest[i].below);
		free(A->latest[i].touched);
	}
	free(A->latest);
	free(A->count);
	free(A->keys);
	free(A->head);
	free(A->a);
	free(A->touched);
}

static void latest_touch(Latest *t, int node)
{
	if (t->ntouched == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 256;
		t->touched = realloc(t->touched, sizeof(int) * (size_t)t->cap);
		if (!t->touched)
			ICE("out of memory");
	}
	t->touched[t->ntouched++] = node;
}

/* Records an access at pos over the span's bytes in tree t. */
static void latest_set(const Accesses *A, Latest *t, Span x, int pos)
{
	if (!t->tag) {
		t->tag = calloc(2 * (size_t)A->leaves, sizeof(int));
		t->below = calloc(2 * (size_t)A->leaves, sizeof(int));
		if (!t->tag || !t->below)
			ICE("out of memory");
	}
	unsigned long long klo, khi;
	span_keys(x, &klo, &khi);
	for (int l = key_index(A, klo) + A->leaves, h = key_index(A, khi) + A->leaves; l < h; l /= 2, h /= 2) {
		int nodes[2], nn = 0;
		if (l & 1)
			nodes[nn++] = l++;
		if (h & 1)
			nodes[nn++] = --h;
		for (int i = 0; i < nn; i++) {
			t->tag[nodes[i]] = pos + 1;
			latest_touch(t, nodes[i]);
			for (int a = nodes[i]; a >= 1 && t->below[a] < pos + 1; a /= 2)
				t->below[a] = pos + 1;
		}
	}
}

/* The latest position of an access over any of the span's bytes in tree t, or NONE. */
static int latest_get(const Accesses *A, const Latest *t, Span x)
{
	int best = 0;
	if (!t->tag)
		return NONE;
	unsigned long long klo, khi;
	span_keys(x, &klo, &khi);
	for (int l = key_index(A, klo) + A->leaves, h = key_index(A, khi) + A->leaves; l < h; l /= 2, h /= 2) {
		int nodes[2], nn = 0;
		if (l & 1)
			nodes[nn++] = l++;
		if (h & 1)
			nodes[nn++] = --h;
		for (int i = 0; i < nn; i++) {
			if (t->below[nodes[i]] > best)
				best = t->below[nodes[i]];
			for (int a = nodes[i] / 2; a >= 1; a /= 2)
				if (t->tag[a] > best)
					best = t->tag[a];
		}
	}
	return best ? best - 1 : NONE;
}

static int region_slot(const Accesses *A, int stream, int region)
{
	return stream * A->nregions + region;
}

static void access_add(Accesses *A, int stream, int pos, bool write, Span span)
{
	A->count[stream]++;
	if (span.region < TRANSIENT_REGIONS) {
		latest_set(A, &A->latest[2 * stream + write], span, pos);
		return;
	}
	if (A->n == A->cap) {
		A->cap = A->cap ? 2 * A->cap : 1024;
		A->a = realloc(A->a, sizeof(Access) * (size_t)A->cap);
		if (!A->a)
			ICE("out of memory");
	}
	int h = region_slot(A, stream, span.region);
	if (A->head[h] < 0) {
		if (A->ntouched == A->captouched) {
			A->captouched = A->captouched ? 2 * A->captouched : 256;
			A->touched = realloc(A->touched, sizeof(int) * (size_t)A->captouched);
			if (!A->touched)
				ICE("out of memory");
		}
		A->touched[A->ntouched++] = h;
	}
	A->a[A->n] = (Access){pos, write, span, A->head[h]};
	A->head[h] = A->n++;
}

static void accesses_reset(Accesses *A)
{
	for (int i = 0; i < A->ntouched; i++)
		A->head[A->touched[i]] = -1;
	A->ntouched = 0;
	A->n = 0;
	memset(A->count, 0, sizeof(int) * (size_t)A->ns);
	for (int i = 0; i < 2 * A->ns; i++) {
		Latest *t = &A->latest[i];
		for (int j = 0; j < t->ntouched; j++)
			for (int a = t->touched[j]; a >= 1 && (t->tag[a] || t->below[a]); a /= 2)
				t->tag[a] = t->below[a] = 0;
		t->ntouched = 0;
	}
}

/* The latest access of stream s after position after that conflicts with span x (x written, or
 * read: then only a write conflicts), or best when none is later than best. */
static int latest_conflict(const Accesses *A, int s, Span x, bool write, int after, int best)
{
	if (x.region < TRANSIENT_REGIONS) {
		int w = latest_get(A, &A->latest[2 * s + 1], x);
		int r = write ? latest_get(A, &A->latest[2 * s], x) : NONE;
		int latest = w > r ? w : r;
		return latest > after && latest > best ? latest : best;
	}
	for (int e = A->head[region_slot(A, s, x.region)]; e >= 0; e = A->a[e].prev) {
		const Access *ac = &A->a[e];
		if (ac->pos <= after || ac->pos <= best)
			break;
		if ((write || ac->write) && overlaps(x, ac->span))
			return ac->pos;
	}
	return best;
}

/* On stream s, the latest kernel after position after whose memory conflicts with k's (one
 * writes what the other reads or writes), or NONE. */
static int conflicting(const Accesses *A, const Span *spans, const Kernel *k, int s, int after)
{
	int best = NONE;
	if (!A->count[s])
		return NONE;
	for (int i = 0; i < k->ndefs; i++)
		best = latest_conflict(A, s, spans[k->defs[i]], true, after, best);
	for (int i = 0; i < k->nuses; i++)
		best = latest_conflict(A, s, spans[k->uses[i]], false, after, best);
	return best;
}

/* the kernels of one phase call, in program order */
static bool same_call(const Kernel *a, const Kernel *b)
{
	if (a->phase != b->phase)
		return false;
	switch (a->phase) {
	case PH_PREPARE_F:
	case PH_FORWARD:
	case PH_PREPARE_B:
	case PH_BACKWARD:
		return a->chunk == b->chunk;
	default:
		return true;
	}
}

/* One phase call: members[0..n) are kernel indices in program order. Vector clocks: vc[i * ns + s]
 * is the latest kernel of stream s known complete when kernel i completes (ENTRY: the compute
 * stream's state at the call's entry; NONE: nothing). */
static void schedule_call(LProg *p, const Span *spans, Accesses *A, const int *members, int n, int ns)
{
	Arena *a = p->g->arena;
	int *vc = malloc(sizeof(int) * (size_t)n * (size_t)ns);
	int *cur = malloc(sizeof(int) * (size_t)ns * (size_t)ns); /* each stream's clock after its last kernel */
	int *last = malloc(sizeof(int) * (size_t)ns);             /* each stream's last member (position) */
	int *want = malloc(sizeof(int) * (size_t)ns);
	for (int s = 0; s < ns * ns; s++)
		cur[s] = NONE;
	for (int s = 0; s < ns; s++) {
		last[s] = -1;
		cur[s * ns + STREAM_COMPUTE] = s == STREAM_COMPUTE ? ENTRY : NONE;
	}
	for (int j = 0; j < n; j++) {
		Kernel *k = &p->k[members[j]];
		int sj = k->stream;
		int *clock = &vc[j * ns];
		memcpy(clock, &cur[sj * ns], sizeof(int) * (size_t)ns);
		/* a device kernel is enqueued after every host kernel before it returned, and so after
		 * everything the host waited for */
		for (int s = 0; s < ns && sj != STREAM_HOST; s++)
			if (cur[STREAM_HOST * ns + s] > clock[s])
				clock[s] = cur[STREAM_HOST * ns + s];
		/* on each other device stream, the latest earlier kernel not yet known complete that
		 * conflicts with k */
		for (int s = 0; s < ns; s++)
			want[s] = s == sj || s == STREAM_HOST ? NONE : conflicting(A, spans, k, s, clock[s]);
		int nw = 0;
		int *waits = arena_alloc(a, sizeof(int) * (size_t)(ns + 1));
		for (int s = 0; s < ns; s++) {
			if (want[s] == NONE || clock[s] >= want[s])
				continue;
			int i = want[s];
			waits[nw++] = members[i];
			p->k[members[i]].event = true;
			for (int t = 0; t < ns; t++)
				if (vc[i * ns + t] > clock[t])
					clock[t] = vc[i * ns + t];
		}
		/* the first kernel of a side stream in the call sees what earlier calls wrote */
		if (sj != STREAM_COMPUTE && last[sj] < 0 && clock[STREAM_COMPUTE] < ENTRY) {
			waits[nw++] = ENTRY;
			clock[STREAM_COMPUTE] = ENTRY;
		}
		clock[sj] = j;
		k->waits = waits;
		k->nwaits = nw;
		memcpy(&cur[sj * ns], clock, sizeof(int) * (size_t)ns);
		last[sj] = j;
		for (int d = 0; d < k->ndefs; d++)
			access_add(A, sj, j, true, spans[k->defs[d]]);
		for (int u = 0; u < k->nuses; u++)
			access_add(A, sj, j, false, spans[k->uses[u]]);
	}
	accesses_reset(A);
	/* the exit: compute waits for each side stream's last kernel no request tracks */
	int *end = &cur[STREAM_COMPUTE * ns];
	for (int s = 0; s < ns; s++) {
		if (s == STREAM_COMPUTE || s == STREAM_HOST || last[s] < 0)
			continue;
		for (int j = last[s]; j >= 0; j--) {
			Kernel *k = &p->k[members[j]];
			if (k->stream != s || has_request(k))
				continue;
			if (end[s] < j) {
				k->join = k->event = true;
				for (int t = 0; t < ns; t++)
					if (vc[j * ns + t] > end[t])
						end[t] = vc[j * ns + t];
			}
			break;
		}
	}
	free(vc);
	free(cur);
	free(last);
	free(want);
}

static void streams_prog(LProg *p)
{
	int ns = STREAM_P2P;
	for (int i = 0; i < p->nk; i++) {
		Kernel *k = &p->k[i];
		k->stream = stream_of(p, k);
		k->waits = NULL;
		k->nwaits = 0;
		k->event = k->join = false;
		if (k->stream + 1 > ns)
			ns = k->stream + 1;
	}
	int nk = p->nk ? p->nk : 1, nb = p->nbuf ? p->nbuf : 1;
	int *members = malloc(sizeof(int) * (size_t)nk);
	Span *spans = malloc(sizeof(Span) * (size_t)nb);
	char *done = calloc((size_t)nk, 1);
	if (!members || !spans || !done)
		ICE("out of memory");
	for (int b = 0; b < p->nbuf; b++)
		spans[b] = span_of(p, b);
	Accesses A;
	accesses_init(&A, p, spans, ns);
	for (int i = 0; i < p->nk; i++) {
		if (done[i])
			continue;
		int n = 0;
		for (int j = i; j < p->nk; j++)
			if (!done[j] && same_call(&p->k[i], &p->k[j])) {
				members[n++] = j;
				done[j] = 1;
			}
		schedule_call(p, spans, &A, members, n, ns);
	}
	free(members);
	free(spans);
	free(done);
	accesses_free(&A);
}

bool plan_streams(Lowered *low)
{
	for (int i = 0; i < low->nprogs; i++)
		streams_prog(low->progs[i]);
	return true;
}

void streams_dump(FILE *out, const LProg *p)
{
	char sb[32];
	fprintf(out, "# stage %d%s: the device schedule\n", p->stage,
		p->role == RANKROLE_MASTER ? " (master)" : p->role == RANKROLE_WORKER ? " (workers)" : "");
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		fprintf(out, "%5d %-16s c%d %-22s %-10s", i, phase_names[k->phase], k->chunk, kernel_names[k->kind],
			stream_name(k->stream, sb, sizeof sb));
		for (int w = 0; w < k->nwaits; w++)
			if (k->waits[w] == ENTRY)
				fprintf(out, " wait entry");
			else
				fprintf(out, " wait %d", k->waits[w]);
		if (k->event)
			fprintf(out, " event");
		if (k->join)
			fprintf(out, " join");
		fprintf(out, "\n");
	}
}
