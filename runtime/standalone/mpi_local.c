/* mpi_local.c: planrt's node-local MPI (mpi.h beside it): the processes planrt-run started on one
 * node, exchanging messages through the shared memory it created.
 *
 * The segment (a memfd the launcher sized and passed down as PLANRT_RUN_FD) holds a header and a
 * ring per ordered pair of ranks: a single-producer, single-consumer byte stream whose head (bytes
 * written) and tail (bytes read) are atomic counters. A message is a 16-byte header (context,
 * tag, length) and its bytes, streamed through the ring as room appears, so a message of any size
 * passes through a ring of a megabyte. Without PLANRT_RUN_FD a process is a world of one rank (a
 * private ring to itself).
 *
 * Progress. Every call runs the progress engine under one process-wide lock (MPI_THREAD_MULTIPLE):
 * it pushes the pending sends of each destination in order, and reads each source's ring: a
 * message's header is matched against the posted receives (context, source, tag, in post order)
 * and its bytes go straight into the receive buffer; a message nobody waits for yet goes into an
 * unexpected buffer that a later receive takes (in arrival order, so messages between two ranks on
 * one context and tag never overtake each other). Blocking calls poll: a short spin, then
 * sched_yield, then short sleeps, so ranks that outnumber cores still progress.
 *
 * Collectives are state machines over internal messages on the communicator's collective context
 * (context + 1), tagged with the communicator's collective sequence number, started by the call
 * and advanced by progress: direct exchanges (each member sends each other member its block).
 * Reductions are a reduce-scatter then an all-gather: member p sums block p of every member's
 * vector in member order (((v0 + v1) + v2) ...) and sends the sum to the others, so the result is
 * the same bits on every member and in every run. split / dup agree on a fresh context with an
 * all-gather of (colour, key, next free context) over the parent. */
#define _GNU_SOURCE
#include "mpi.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the shared segment */

enum { SEG_MAGIC = 0x706c6d70, SEG_HEADER = 64, ONE_RING = 1 << 16 };

typedef struct seg_header {
	uint32_t magic, nranks;
	uint64_t ring_bytes;
} seg_header_t;

typedef struct ring {
	_Atomic uint64_t head; /* bytes the sender has written */
	char pad0[56];
	_Atomic uint64_t tail; /* bytes the receiver has read */
	char pad1[56];
} ring_t; /* followed by ring_bytes of data */

typedef struct msg_header {
	uint32_t ctx;
	int32_t tag;
	uint64_t len;
} msg_header_t;

static struct {
	int init, fin, rank, size;
	char *base;
	uint64_t cap;  /* bytes of data per ring */
	size_t stride; /* sizeof(ring_t) + cap */
} W;

static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;

static ring_t *ring_of(int src, int dst)
{
	return (ring_t *)(W.base + SEG_HEADER + ((size_t)src * (size_t)W.size + (size_t)dst) * W.stride);
}

static uint64_t ring_room(ring_t *r)
{
	return W.cap - (atomic_load_explicit(&r->head, memory_order_relaxed) -
			atomic_load_explicit(&r->tail, memory_order_acquire));
}

static uint64_t ring_ready(ring_t *r)
{
	return atomic_load_explicit(&r->head, memory_order_acquire) - atomic_load_explicit(&r->tail, memory_order_relaxed);
}

static void ring_put(ring_t *r, const void *p, uint64_t n)
{
	uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed), at = h % W.cap;
	uint64_t first = n < W.cap - at ? n : W.cap - at;
	char *data = (char *)(r + 1);
	memcpy(data + at, p, first);
	memcpy(data, (const char *)p + first, n - first);
	atomic_store_explicit(&r->head, h + n, memory_order_release);
}

/* n bytes out of the ring into p (NULL: dropped) */
static void ring_get(ring_t *r, void *p, uint64_t n)
{
	uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed), at = t % W.cap;
	uint64_t first = n < W.cap - at ? n : W.cap - at;
	const char *data = (const char *)(r + 1);
	if (p) {
		memcpy(p, data + at, first);
		memcpy((char *)p + first, data, n - first);
	}
	atomic_store_explicit(&r->tail, t + n, memory_order_release);
}

/* ------------------------------------------------------------------ requests, communicators */

enum { REQ_SEND, REQ_RECV, REQ_COLL };
enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_ALLTOALL, C_ALLTOALLV, C_BCAST, C_BARRIER };

typedef struct coll coll_t;
struct planrt_lmpi_req {
	int kind, done, err;
	struct planrt_lmpi_req *next; /* in its destination's send queue or the posted receives */
	int peer;                     /* world rank */
	uint32_t ctx;
	int tag;
	char *buf;
	uint64_t len, pos;
	int header_sent;
	coll_t *coll;
};
typedef struct planrt_lmpi_req req_t;

typedef struct comm {
	int size, rank;
	int *world; /* member -> world rank */
	uint32_t ctx;
	uint32_t seq; /* collectives started on it */
} comm_t;

struct coll {
	int kind, phase;
	const comm_t *c;
	uint32_t ctx;
	int tag;
	const char *s;
	char *r;
	int count, root;
	MPI_Datatype t;
	MPI_Op op;
	int *v; /* all-to-all(v): send counts, send displacements, receive counts, receive displacements */
	req_t **sub;
	int nsub;
	char *tmp;
	req_t *owner;
	coll_t *next_active;
};

/* the message being read from one source */
typedef struct unexpected {
	struct unexpected *next;
	int src;
	uint32_t ctx;
	int tag;
	char *data;
	uint64_t len;
	int complete;
	req_t *claimed; /* a receive posted while it still streamed in */
} unexpected_t;

typedef struct peer {
	req_t *send_head, *send_tail;
	int reading;
	msg_header_t h;
	uint64_t pos, keep; /* keep: the bytes that fit where they go (the rest is a truncation) */
	char *dst;
	req_t *recv;
	unexpected_t *ux;
} peer_t;

static peer_t *peers;
static req_t *posted_head, *posted_tail;
static unexpected_t *ux_head;
static coll_t *active;
enum { MAX_COMMS = 4096 };
static comm_t *comms[MAX_COMMS]; /* handle h is comms[h - 1]; a fixed table, read without the lock */
static int ncomms;
static uint32_t next_ctx = 2; /* the world uses 0 (point to point) and 1 (collectives) */

static void die(const char *what)
{
	fprintf(stderr, "planrt: rank %d: node-local MPI: %s\n", W.rank, what);
	fflush(stderr);
	_exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		die("out of memory");
	return p;
}

static const comm_t *comm_get(MPI_Comm c)
{
	return c > 0 && c <= __atomic_load_n(&ncomms, __ATOMIC_ACQUIRE) ? comms[c - 1] : NULL;
}

static MPI_Comm comm_add(comm_t *c)
{
	if (ncomms == MAX_COMMS)
		die("more than 4096 communicators");
	comms[ncomms] = c;
	__atomic_store_n(&ncomms, ncomms + 1, __ATOMIC_RELEASE); /* the slot is filled before it is counted */
	return ncomms;
}

static size_t type_size(MPI_Datatype t)
{
	return (size_t)(t & 0xff);
}

static int type_ok(MPI_Datatype t)
{
	return t > 0 && (t >> 8) >= 1 && (t >> 8) <= 9 && type_size(t) > 0;
}

/* ------------------------------------------------------------------ point to point */

static req_t *req_new(int kind, int peer, uint32_t ctx, int tag, const void *buf, uint64_t len)
{
	req_t *q = xcalloc(1, sizeof *q);
	q->kind = kind;
	q->peer = peer;
	q->ctx = ctx;
	q->tag = tag;
	q->buf = (char *)buf;
	q->len = len;
	return q;
}

static void push_sends(int d)
{
	peer_t *p = &peers[d];
	ring_t *r = ring_of(W.rank, d);
	while (p->send_head) {
		req_t *q = p->send_head;
		if (!q->header_sent) {
			if (ring_room(r) < sizeof(msg_header_t))
				return;
			msg_header_t h = {q->ctx, q->tag, q->len};
			ring_put(r, &h, sizeof h);
			q->header_sent = 1;
		}
		uint64_t n = q->len - q->pos, room = ring_room(r);
		if (n > room)
			n = room;
		if (n) {
			ring_put(r, q->buf + q->pos, n);
			q->pos += n;
		}
		if (q->pos < q->len)
			return;
		p->send_head = q->next;
		if (!p->send_head)
			p->send_tail = NULL;
		q->next = NULL;
		q->done = 1;
	}
}

static void post_send(req_t *q)
{
	peer_t *p = &peers[q->peer];
	if (p->send_tail)
		p->send_tail->next = q;
	else
		p->send_head = q;
	p->send_tail = q;
	push_sends(q->peer);
}

/* a complete unexpected message into the receive that takes it */
static void deliver(unexpected_t *ux, req_t *q)
{
	uint64_t n = ux->len < q->len ? ux->len : q->len;
	if (n)
		memcpy(q->buf, ux->data, n);
	q->pos = n;
	q->err = ux->len > q->len ? MPI_ERR_TRUNCATE : MPI_SUCCESS;
	q->done = 1;
}

static void ux_remove(unexpected_t *ux)
{
	for (unexpected_t **at = &ux_head; *at; at = &(*at)->next)
		if (*at == ux) {
			*at = ux->next;
			break;
		}
	free(ux->data);
	free(ux);
}

static void post_recv(req_t *q)
{
	for (unexpected_t *ux = ux_head; ux; ux = ux->next)
		if (!ux->claimed && ux->ctx == q->ctx && ux->src == q->peer && ux->tag == q->tag) {
			if (ux->complete) {
				deliver(ux, q);
				ux_remove(ux);
			} else {
				ux->claimed = q;
			}
			return;
		}
	if (posted_tail)
		posted_tail->next = q;
	else
		posted_head = q;
	posted_tail = q;
}

/* a header from source s: the posted receive it matches, else an unexpected buffer */
static void start_message(int s, peer_t *p)
{
	p->reading = 1;
	p->pos = 0;
	p->recv = NULL;
	p->ux = NULL;
	req_t *prev = NULL;
	for (req_t *q = posted_head; q; prev = q, q = q->next)
		if (q->ctx == p->h.ctx && q->peer == s && q->tag == p->h.tag) {
			if (prev)
				prev->next = q->next;
			else
				posted_head = q->next;
			if (posted_tail == q)
				posted_tail = prev;
			q->next = NULL;
			p->recv = q;
			p->dst = q->buf;
			p->keep = p->h.len < q->len ? p->h.len : q->len;
			q->err = p->h.len > q->len ? MPI_ERR_TRUNCATE : MPI_SUCCESS;
			return;
		}
	unexpected_t *ux = xcalloc(1, sizeof *ux);
	ux->src = s;
	ux->ctx = p->h.ctx;
	ux->tag = p->h.tag;
	ux->len = p->h.len;
	ux->data = malloc(p->h.len ? p->h.len : 1);
	if (!ux->data)
		die("out of memory for a message nobody has asked for yet");
	unexpected_t **at = &ux_head;
	while (*at)
		at = &(*at)->next;
	*at = ux;
	p->ux = ux;
	p->dst = ux->data;
	p->keep = p->h.len;
}

static void finish_message(peer_t *p)
{
	if (p->recv) {
		p->recv->pos = p->keep;
		p->recv->done = 1;
	} else if (p->ux) {
		p->ux->complete = 1;
		if (p->ux->claimed) {
			deliver(p->ux, p->ux->claimed);
			ux_remove(p->ux);
		}
	}
	p->reading = 0;
	p->recv = NULL;
	p->ux = NULL;
}

static void pull(int s)
{
	peer_t *p = &peers[s];
	ring_t *r = ring_of(s, W.rank);
	for (;;) {
		uint64_t ready = ring_ready(r);
		if (!p->reading) {
			if (ready < sizeof(msg_header_t))
				return;
			ring_get(r, &p->h, sizeof p->h);
			start_message(s, p);
			continue;
		}
		uint64_t n = p->h.len - p->pos;
		if (n > ready)
			n = ready;
		if (n) {
			uint64_t kept = p->pos < p->keep ? (p->keep - p->pos < n ? p->keep - p->pos : n) : 0;
			if (kept)
				ring_get(r, p->dst + p->pos, kept);
			if (n > kept)
				ring_get(r, NULL, n - kept);
			p->pos += n;
		}
		if (p->pos < p->h.len)
			return;
		finish_message(p);
	}
}

static void coll_advance(coll_t *k);

static void progress(void)
{
	for (int d = 0; d < W.size; d++)
		if (peers[d].send_head)
			push_sends(d);
	for (int s = 0; s < W.size; s++)
		pull(s);
	for (coll_t **at = &active; *at;) {
		coll_t *k = *at;
		coll_advance(k);
		if (k->owner->done)
			*at = k->next_active;
		else
			at = &k->next_active;
	}
}

/* ------------------------------------------------------------------ collectives */

static void reduce_into(void *acc, const void *in, size_t n, MPI_Datatype t, MPI_Op op)
{
#define REDUCE(T)                                                                                                  \
	do {                                                                                                       \
		T *a = acc;                                                                                        \
		const T *b = in;                                                                                   \
		for (size_t i = 0; i < n; i++)                                                                     \
			a[i] = op == MPI_SUM ? (T)(a[i] + b[i]) : op == MPI_MAX ? (b[i] > a[i] ? b[i] : a[i])           \
										: (b[i] < a[i] ? b[i] : a[i]);          \
	} while (0)
	switch (t >> 8) {
	case 1: case 2: REDUCE(uint8_t); break;
	case 3: REDUCE(uint16_t); break;
	case 4: REDUCE(int32_t); break;
	case 5: REDUCE(float); break;
	case 6: REDUCE(double); break;
	case 7: REDUCE(int64_t); break;
	case 8: REDUCE(uint64_t); break;
	case 9: REDUCE(uint32_t); break;
	}
#undef REDUCE
}

static void sub_add(coll_t *k, int kind, int member, const void *buf, uint64_t len)
{
	req_t *q = req_new(kind, k->c->world[member], k->ctx, k->tag, buf, len);
	k->sub[k->nsub++] = q;
	if (kind == REQ_SEND)
		post_send(q);
	else
		post_recv(q);
}

/* block p of count elements split over n members: [lo, hi) */
static size_t block_lo(int count, int n, int p)
{
	return (size_t)((long long)count * p / n);
}

/* the reduce-scatter half: send block p to member p, receive every member's block of mine */
static void exchange_blocks(coll_t *k, const char *in, int even)
{
	const comm_t *c = k->c;
	size_t es = type_size(k->t), mine = even ? (size_t)k->count : block_lo(k->count, c->size, c->rank + 1) -
								 block_lo(k->count, c->size, c->rank);
	k->tmp = xcalloc((size_t)c->size, mine * es);
	for (int p = 0; p < c->size; p++) {
		if (p == c->rank)
			continue;
		size_t lo = even ? (size_t)p * (size_t)k->count : block_lo(k->count, c->size, p);
		size_t len = even ? (size_t)k->count : block_lo(k->count, c->size, p + 1) - lo;
		sub_add(k, REQ_SEND, p, in + lo * es, len * es);
		sub_add(k, REQ_RECV, p, k->tmp + (size_t)p * mine * es, mine * es);
	}
}

/* every member's block of mine (mine from own), summed in member order into out */
static void reduce_blocks(coll_t *k, const char *own, char *out, size_t mine)
{
	size_t es = type_size(k->t);
	memcpy(k->tmp + (size_t)k->c->rank * mine * es, own, mine * es);
	for (int p = 1; p < k->c->size; p++)
		reduce_into(k->tmp, k->tmp + (size_t)p * mine * es, mine, k->t, k->op);
	memcpy(out, k->tmp, mine * es);
}

static void start_phase(coll_t *k)
{
	const comm_t *c = k->c;
	int n = c->size, me = c->rank;
	size_t es = type_size(k->t);
	k->nsub = 0;
	switch (k->kind) {
	case C_ALLREDUCE:
		if (k->phase == 0) {
			if (k->s != MPI_IN_PLACE && k->s != k->r)
				memmove(k->r, k->s, (size_t)k->count * es);
			exchange_blocks(k, k->r, 0);
		} else if (k->phase == 1) {
			size_t lo = block_lo(k->count, n, me), mine = block_lo(k->count, n, me + 1) - lo;
			reduce_blocks(k, k->r + lo * es, k->r + lo * es, mine);
			for (int p = 0; p < n; p++) {
				if (p == me)
					continue;
				size_t plo = block_lo(k->count, n, p), plen = block_lo(k->count, n, p + 1) - plo;
				sub_add(k, REQ_SEND, p, k->r + lo * es, mine * es);
				sub_add(k, REQ_RECV, p, k->r + plo * es, plen * es);
			}
		}
		break;
	case C_REDUCE_SCATTER:
		if (k->phase == 0) {
			exchange_blocks(k, k->s == MPI_IN_PLACE ? k->r : k->s, 1);
		} else if (k->phase == 1) {
			const char *in = k->s == MPI_IN_PLACE ? k->r : k->s;
			reduce_blocks(k, in + (size_t)me * (size_t)k->count * es, k->r, (size_t)k->count);
		}
		break;
	case C_ALLGATHER:
		if (k->phase == 0) {
			size_t blk = (size_t)k->count * es;
			if (k->s != MPI_IN_PLACE)
				memmove(k->r + (size_t)me * blk, k->s, blk);
			for (int p = 0; p < n; p++)
				if (p != me) {
					sub_add(k, REQ_SEND, p, k->r + (size_t)me * blk, blk);
					sub_add(k, REQ_RECV, p, k->r + (size_t)p * blk, blk);
				}
		}
		break;
	case C_ALLTOALL:
	case C_ALLTOALLV:
		if (k->phase == 0) {
			for (int p = 0; p < n; p++) {
				size_t sc = (size_t)k->v[p], sd = (size_t)k->v[n + p], rc = (size_t)k->v[2 * n + p],
				       rd = (size_t)k->v[3 * n + p];
				if (p == me)
					memmove(k->r + rd * es, k->s + sd * es, (sc < rc ? sc : rc) * es);
				else {
					sub_add(k, REQ_SEND, p, k->s + sd * es, sc * es);
					sub_add(k, REQ_RECV, p, k->r + rd * es, rc * es);
				}
			}
		}
		break;
	case C_BCAST:
		if (k->phase == 0) {
			size_t bytes = (size_t)k->count * es;
			for (int p = 0; p < n; p++)
				if (me == k->root && p != me)
					sub_add(k, REQ_SEND, p, k->r, bytes);
			if (me != k->root)
				sub_add(k, REQ_RECV, k->root, k->r, bytes);
		}
		break;
	case C_BARRIER:
		if (k->phase == 0)
			for (int p = 0; p < n; p++)
				if (p != me) {
					sub_add(k, REQ_SEND, p, NULL, 0);
					sub_add(k, REQ_RECV, p, NULL, 0);
				}
		break;
	}
}

/* the last phase of each kind: allreduce 2, reduce-scatter 1 (its reduction ran when it began) */
static int last_phase(const coll_t *k)
{
	return k->kind == C_ALLREDUCE ? 2 : k->kind == C_REDUCE_SCATTER ? 1 : 1;
}

static void coll_advance(coll_t *k)
{
	while (!k->owner->done) {
		for (int i = 0; i < k->nsub; i++)
			if (!k->sub[i]->done)
				return;
		for (int i = 0; i < k->nsub; i++) {
			if (k->sub[i]->err && !k->owner->err)
				k->owner->err = k->sub[i]->err;
			free(k->sub[i]);
		}
		k->nsub = 0;
		k->phase++;
		if (k->phase > last_phase(k) || k->owner->err) {
			k->owner->done = 1;
			return;
		}
		start_phase(k);
		if (k->phase == last_phase(k) && k->nsub == 0) {
			k->owner->done = 1;
			return;
		}
	}
}

/* starts a collective on c (lock held); *q its request */
static int coll_start(int kind, MPI_Comm cm, const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, int root,
		      const int *v4, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	const comm_t *c = comm_get(cm);
	if (!c)
		return MPI_ERR_COMM;
	if (count < 0)
		return MPI_ERR_ARG;
	if (!type_ok(t))
		return MPI_ERR_TYPE;
	if ((kind == C_ALLREDUCE || kind == C_REDUCE_SCATTER) && op != MPI_SUM && op != MPI_MAX && op != MPI_MIN)
		return MPI_ERR_OP;
	if (kind == C_BCAST && (root < 0 || root >= c->size))
		return MPI_ERR_RANK;
	req_t *owner = req_new(REQ_COLL, -1, 0, 0, NULL, 0);
	coll_t *k = xcalloc(1, sizeof *k);
	k->kind = kind;
	k->c = c;
	k->ctx = c->ctx + 1;
	k->tag = (int)(((comms[cm - 1]->seq)++) & 0x3fffffff);
	k->s = s;
	k->r = r;
	k->count = count;
	k->t = t;
	k->op = op;
	k->root = root;
	k->owner = owner;
	k->sub = xcalloc(2 * (size_t)c->size, sizeof *k->sub);
	owner->coll = k;
	if (kind == C_ALLTOALL || kind == C_ALLTOALLV) {
		k->v = xcalloc(4 * (size_t)c->size, sizeof *k->v);
		for (int p = 0; p < c->size; p++)
			for (int j = 0; j < 4; j++)
				k->v[j * c->size + p] = v4 ? v4[j * c->size + p] : j % 2 ? p * count : count;
	}
	start_phase(k);
	k->next_active = active;
	active = k;
	coll_advance(k);
	*q = owner;
	return MPI_SUCCESS;
}

/* ------------------------------------------------------------------ waiting */

static void req_free(req_t *q)
{
	if (q->coll) {
		for (int i = 0; i < q->coll->nsub; i++)
			free(q->coll->sub[i]);
		free(q->coll->sub);
		free(q->coll->tmp);
		free(q->coll->v);
		free(q->coll);
	}
	free(q);
}

static void backoff(unsigned *spins)
{
	++*spins;
	if (*spins < 64)
		return;
	if (*spins < 2000) {
		sched_yield();
		return;
	}
	struct timespec ts = {0, *spins < 20000 ? 20000 : 100000};
	nanosleep(&ts, NULL);
}

int MPI_Wait(MPI_Request *qp, MPI_Status *st)
{
	req_t *q = *qp;
	if (!q)
		return MPI_SUCCESS;
	for (unsigned spins = 0;; backoff(&spins)) {
		pthread_mutex_lock(&big);
		progress();
		int done = q->done;
		pthread_mutex_unlock(&big);
		if (done)
			break;
	}
	int err = q->err;
	if (st) {
		st->MPI_SOURCE = q->peer;
		st->MPI_TAG = q->tag;
		st->MPI_ERROR = err;
	}
	req_free(q);
	*qp = MPI_REQUEST_NULL;
	return err;
}

int MPI_Test(MPI_Request *qp, int *flag, MPI_Status *st)
{
	req_t *q = *qp;
	*flag = 1;
	if (!q)
		return MPI_SUCCESS;
	pthread_mutex_lock(&big);
	progress();
	int done = q->done;
	pthread_mutex_unlock(&big);
	*flag = done;
	return done ? MPI_Wait(qp, st) : MPI_SUCCESS;
}

/* ------------------------------------------------------------------ the API: point to point */

static int p2p_start(int kind, const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm cm, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	const comm_t *c = comm_get(cm);
	if (!c)
		return MPI_ERR_COMM;
	if (n < 0 || tag < 0 || !type_ok(t))
		return MPI_ERR_ARG;
	if (peer < 0 || peer >= c->size)
		return MPI_ERR_RANK;
	req_t *r = req_new(kind, c->world[peer], c->ctx, tag, b, (uint64_t)n * type_size(t));
	pthread_mutex_lock(&big);
	if (kind == REQ_SEND)
		post_send(r);
	else
		post_recv(r);
	pthread_mutex_unlock(&big);
	*q = r;
	return MPI_SUCCESS;
}

int MPI_Isend(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q)
{
	return p2p_start(REQ_SEND, b, n, t, peer, tag, c, q);
}

int MPI_Irecv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q)
{
	return p2p_start(REQ_RECV, b, n, t, peer, tag, c, q);
}

int MPI_Send(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c)
{
	MPI_Request q;
	int rc = MPI_Isend(b, n, t, peer, tag, c, &q);
	return rc ? rc : MPI_Wait(&q, MPI_STATUS_IGNORE);
}

int MPI_Recv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Status *st)
{
	MPI_Request q;
	int rc = MPI_Irecv(b, n, t, peer, tag, c, &q);
	return rc ? rc : MPI_Wait(&q, st);
}

/* ------------------------------------------------------------------ the API: collectives */

static int coll_run(int kind, MPI_Comm c, const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root,
		    const int *v4, MPI_Request *q)
{
	pthread_mutex_lock(&big);
	int rc = coll_start(kind, c, s, r, n, t, op, root, v4, q);
	pthread_mutex_unlock(&big);
	return rc;
}

static int coll_block(int kind, MPI_Comm c, const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root,
		      const int *v4)
{
	MPI_Request q;
	int rc = coll_run(kind, c, s, r, n, t, op, root, v4, &q);
	return rc ? rc : MPI_Wait(&q, MPI_STATUS_IGNORE);
}

/* the four count arrays of an all-to-all(v) in one block: sc, sd, rc, rd */
static int *pack_v(MPI_Comm cm, const int *sc, const int *sd, const int *rc, const int *rd)
{
	const comm_t *c = comm_get(cm);
	if (!c)
		return NULL;
	int *v = xcalloc(4 * (size_t)c->size, sizeof *v);
	for (int p = 0; p < c->size; p++) {
		v[p] = sc[p];
		v[c->size + p] = sd[p];
		v[2 * c->size + p] = rc[p];
		v[3 * c->size + p] = rd[p];
	}
	return v;
}

int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q)
{
	return coll_run(C_ALLREDUCE, c, s, r, n, t, op, 0, NULL, q);
}

int MPI_Ireduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q)
{
	return coll_run(C_REDUCE_SCATTER, c, s, r, n, t, op, 0, NULL, q);
}

int MPI_Iallgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c, MPI_Request *q)
{
	(void)rn, (void)rt;
	return coll_run(C_ALLGATHER, c, s, r, n, t, MPI_SUM, 0, NULL, q);
}

int MPI_Ialltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c, MPI_Request *q)
{
	(void)rn, (void)rt;
	return coll_run(C_ALLTOALL, c, s, r, n, t, MPI_SUM, 0, NULL, q);
}

int MPI_Ialltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc, const int *rd,
		   MPI_Datatype rt, MPI_Comm c, MPI_Request *q)
{
	(void)rt;
	int *v = pack_v(c, sc, sd, rc, rd);
	if (!v)
		return MPI_ERR_COMM;
	int rcode = coll_run(C_ALLTOALLV, c, s, r, 0, t, MPI_SUM, 0, v, q);
	free(v);
	return rcode;
}

int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *q)
{
	return coll_run(C_BCAST, c, b, b, n, t, MPI_SUM, root, NULL, q);
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	return coll_block(C_ALLREDUCE, c, s, r, n, t, op, 0, NULL);
}

int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	return coll_block(C_REDUCE_SCATTER, c, s, r, n, t, op, 0, NULL);
}

int MPI_Allgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
	(void)rn, (void)rt;
	return coll_block(C_ALLGATHER, c, s, r, n, t, MPI_SUM, 0, NULL);
}

int MPI_Alltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
	(void)rn, (void)rt;
	return coll_block(C_ALLTOALL, c, s, r, n, t, MPI_SUM, 0, NULL);
}

int MPI_Alltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc, const int *rd,
		  MPI_Datatype rt, MPI_Comm c)
{
	MPI_Request q;
	int rcode = MPI_Ialltoallv(s, sc, sd, t, r, rc, rd, rt, c, &q);
	return rcode ? rcode : MPI_Wait(&q, MPI_STATUS_IGNORE);
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
	return coll_block(C_BCAST, c, b, b, n, t, MPI_SUM, root, NULL);
}

int MPI_Barrier(MPI_Comm c)
{
	return coll_block(C_BARRIER, c, NULL, NULL, 0, MPI_BYTE, MPI_SUM, 0, NULL);
}

/* ------------------------------------------------------------------ the API: communicators */

int MPI_Comm_rank(MPI_Comm cm, int *rank)
{
	const comm_t *c = comm_get(cm);
	*rank = c ? c->rank : -1;
	return c ? MPI_SUCCESS : MPI_ERR_COMM;
}

int MPI_Comm_size(MPI_Comm cm, int *size)
{
	const comm_t *c = comm_get(cm);
	*size = c ? c->size : 0;
	return c ? MPI_SUCCESS : MPI_ERR_COMM;
}

int MPI_Comm_split(MPI_Comm cm, int color, int key, MPI_Comm *out)
{
	*out = MPI_COMM_NULL;
	const comm_t *c = comm_get(cm);
	if (!c)
		return MPI_ERR_COMM;
	if (color < 0 && color != MPI_UNDEFINED)
		return MPI_ERR_ARG;
	int n = c->size, mine[3] = {color, key, 0};
	pthread_mutex_lock(&big);
	mine[2] = (int)next_ctx;
	pthread_mutex_unlock(&big);
	int *all = xcalloc(3 * (size_t)n, sizeof *all);
	int rc = MPI_Allgather(mine, 3, MPI_INT, all, 3, MPI_INT, cm);
	if (rc) {
		free(all);
		return rc;
	}
	uint32_t ctx = 0;
	int members = 0;
	for (int p = 0; p < n; p++) {
		ctx = (uint32_t)all[3 * p + 2] > ctx ? (uint32_t)all[3 * p + 2] : ctx;
		members += color != MPI_UNDEFINED && all[3 * p] == color;
	}
	pthread_mutex_lock(&big);
	if (next_ctx < ctx + 2)
		next_ctx = ctx + 2;
	pthread_mutex_unlock(&big);
	if (color == MPI_UNDEFINED) {
		free(all);
		return MPI_SUCCESS;
	}
	comm_t *nc = xcalloc(1, sizeof *nc);
	nc->world = xcalloc((size_t)members, sizeof *nc->world);
	nc->size = members;
	nc->ctx = ctx;
	/* members by (key, parent rank): insertion into order */
	int *parent = xcalloc((size_t)members, sizeof *parent), m = 0;
	for (int p = 0; p < n; p++) {
		if (all[3 * p] != color)
			continue;
		int at = m++;
		while (at > 0 && all[3 * parent[at - 1] + 1] > all[3 * p + 1]) {
			parent[at] = parent[at - 1];
			at--;
		}
		parent[at] = p;
	}
	for (int i = 0; i < members; i++) {
		nc->world[i] = c->world[parent[i]];
		if (parent[i] == c->rank)
			nc->rank = i;
	}
	free(parent);
	free(all);
	pthread_mutex_lock(&big);
	*out = comm_add(nc);
	pthread_mutex_unlock(&big);
	return MPI_SUCCESS;
}

int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out)
{
	int rank;
	int rc = MPI_Comm_rank(c, &rank);
	return rc ? rc : MPI_Comm_split(c, 0, rank, out);
}

/* every process of this MPI is on one node */
int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out)
{
	(void)info;
	return MPI_Comm_split(c, type == MPI_COMM_TYPE_SHARED ? 0 : MPI_UNDEFINED, key, out);
}

int MPI_Comm_free(MPI_Comm *cm)
{
	pthread_mutex_lock(&big);
	if (*cm > 1 && *cm <= ncomms && comms[*cm - 1]) {
		free(comms[*cm - 1]->world);
		free(comms[*cm - 1]);
		comms[*cm - 1] = NULL;
	}
	pthread_mutex_unlock(&big);
	*cm = MPI_COMM_NULL;
	return MPI_SUCCESS;
}

int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler h)
{
	(void)h;
	return comm_get(c) ? MPI_SUCCESS : MPI_ERR_COMM;
}

int MPI_Comm_get_attr(MPI_Comm c, int key, void *value, int *flag)
{
	static int tag_ub = 0x3fffffff;
	(void)c;
	*flag = key == MPI_TAG_UB;
	if (*flag)
		*(int **)value = &tag_ub;
	return MPI_SUCCESS;
}

int MPI_Error_string(int code, char *text, int *len)
{
	const char *what = code == MPI_ERR_RANK       ? "a rank outside the communicator"
			   : code == MPI_ERR_COMM     ? "not a communicator"
			   : code == MPI_ERR_TRUNCATE ? "a message longer than the receive buffer"
			   : code == MPI_ERR_TYPE     ? "a datatype the node-local MPI does not have"
			   : code == MPI_ERR_OP       ? "a reduction the node-local MPI does not have"
			   : code == MPI_ERR_ARG      ? "a negative count or tag"
						      : "an error";
	*len = snprintf(text, MPI_MAX_ERROR_STRING, "%s (planrt's node-local MPI, error %d)", what, code);
	return MPI_SUCCESS;
}

/* ------------------------------------------------------------------ the API: start and end */

/* the launcher's segment (PLANRT_RUN_FD, PLANRT_RUN_RANK, PLANRT_RUN_SIZE), else a world of one */
static void attach(void)
{
	const char *fd_text = getenv("PLANRT_RUN_FD"), *rank_text = getenv("PLANRT_RUN_RANK"),
		   *size_text = getenv("PLANRT_RUN_SIZE");
	if (fd_text && rank_text && size_text) {
		int fd = atoi(fd_text);
		W.rank = atoi(rank_text);
		W.size = atoi(size_text);
		seg_header_t h;
		if (W.size < 1 || W.rank < 0 || W.rank >= W.size || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
		    h.magic != SEG_MAGIC || (int)h.nranks != W.size)
			die("PLANRT_RUN_FD does not name planrt-run's shared memory for this world; start the program with "
			    "planrt-run -n N, or alone");
		W.cap = h.ring_bytes;
		W.stride = sizeof(ring_t) + W.cap;
		size_t bytes = SEG_HEADER + (size_t)W.size * (size_t)W.size * W.stride;
		W.base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (W.base == MAP_FAILED)
			die("cannot map planrt-run's shared memory");
		close(fd);
	} else {
		W.rank = 0;
		W.size = 1;
		W.cap = ONE_RING;
		W.stride = sizeof(ring_t) + W.cap;
		W.base = mmap(NULL, SEG_HEADER + W.stride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (W.base == MAP_FAILED)
			die("cannot map memory for a world of one");
	}
	peers = xcalloc((size_t)W.size, sizeof *peers);
	comm_t *world = xcalloc(1, sizeof *world);
	world->size = W.size;
	world->rank = W.rank;
	world->world = xcalloc((size_t)W.size, sizeof *world->world);
	for (int i = 0; i < W.size; i++)
		world->world[i] = i;
	world->ctx = 0;
	comm_add(world);
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	(void)argc, (void)argv, (void)required;
	if (W.init)
		return MPI_ERR_OTHER;
	attach();
	W.init = 1;
	*provided = MPI_THREAD_MULTIPLE;
	return MPI_SUCCESS;
}

int MPI_Init(int *argc, char ***argv)
{
	int provided;
	return MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
}

int MPI_Query_thread(int *provided)
{
	*provided = MPI_THREAD_MULTIPLE;
	return MPI_SUCCESS;
}

int MPI_Initialized(int *flag)
{
	*flag = W.init;
	return MPI_SUCCESS;
}

int MPI_Finalized(int *flag)
{
	*flag = W.fin;
	return MPI_SUCCESS;
}

/* the messages this rank sent stay readable in the segment after it ends (the launcher holds it) */
int MPI_Finalize(void)
{
	W.fin = 1;
	return MPI_SUCCESS;
}

int MPI_Abort(MPI_Comm c, int code)
{
	(void)c;
	fflush(stdout);
	fflush(stderr);
	_exit(code ? code : 1); /* planrt-run then stops the other ranks */
}
