/* schedule.c: the collective-sequence check (docs/architecture.md, contract 4), on the loop-level IR.
 *
 * Before anything is emitted, planc proves that no rank can wait forever on communication: for
 * every group every member must issue the same collectives in the same order with the same
 * element counts, dtypes and local block shapes, and for every pair of ranks the sends of one
 * must match the receives of the other, in order, on each channel.
 *
 * The sequences are read off the kernels that run, in the order they run in one step: init,
 * step_begin, the stage's action table (each action prepared one ahead, as the walker does:
 * receives are posted when the next action is prepared, sends when an action runs; kernels of the
 * last micro-batch only where they say so), then step and save. Every rank of a stage and role
 * runs the same program, so members of a group along any axis other than the pipeline (and the
 * async axis) issue identical sequences by construction; what is compared is therefore one
 * sequence per stage and role: the pipe axis's collectives across stages, each tied-parameter pair,
 * master against workers, and every point-to-point stream. The work is proportional to the
 * kernels and the distinct groups (each program compared once along an axis, each transfer stream
 * once per coordinate that runs it), never to the ranks: a 1,000,000-rank mesh checks as fast as
 * an 8-rank one with the same stages (tests/scale). */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

typedef struct Entry {
	const Comm *c;
	int op;
	int micro; /* the micro-batch of the action that issued it (transfers match micro-batch by
		    * micro-batch: equal shapes alone would not show two streams crossed) */
} Entry;

typedef struct Seq {
	Entry *e;
	int n, cap;
} Seq;

/* Point-to-point streams are sparse (a stage talks to its neighbours, an async worker to its
 * master), so they are kept as one list per program, sorted by stream, instead of a table over
 * every possible peer: a table would cost programs x axis size, and a million-rank async axis
 * would make that the whole check. A stream is (direction, axis, peer, channel). */
enum { DIR_SEND, DIR_RECV };
typedef struct Xfer {
	int dir, axis, peer, channel;
	Entry e;
} Xfer;
typedef struct Stream {
	int dir, axis, peer, channel;
	Seq s; /* entries of one stream, in issue order (points into Issued.xe) */
} Stream;

/* What one program issues, per group. */
typedef struct Issued {
	const LProg *p;
	Seq *coll;    /* [naxes + npairs] */
	Seq *ring;    /* [2 naxes]: the ring shifts' sends and receives on each axis (ring.c) */
	Xfer *xfers;  /* while issuing */
	int nxfers, capxfers;
	Entry *xe;    /* the entries of every stream, sorted by stream */
	Stream *streams;
	int nstreams;
	int **by_phase; /* [PH_COUNT * (nchunks + 1)]: kernel indices of a phase (slot 0: every chunk;
			 * slot 1 + c: chunk c), -1 terminated */
} Issued;

typedef struct Check {
	const Lowered *low;
	const PlanSpec *ps;
	int ncomm, nchannel;
	int async_axis;
	int nstages;
	int *prog_of; /* [stage * 3 + rank role]: the program index */
	Issued *is;   /* [nprogs] */
} Check;

static void push(Seq *s, const Comm *c, int op, int micro)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 32;
		s->e = realloc(s->e, sizeof(Entry) * (size_t)s->cap);
		if (!s->e)
			ICE("out of memory");
	}
	s->e[s->n++] = (Entry){c, op, micro};
}

static void push_xfer(const Check *C, Issued *is, const Comm *c, int op, int micro)
{
	if (c->axis < 0 || c->axis >= C->ps->naxes || c->peer < 0 || c->peer >= C->ps->axes[c->axis].size ||
	    c->channel < 0 || c->channel >= C->nchannel)
		ICE("p2p peer %d (axis %d, channel %d) out of range", c->peer, c->axis, c->channel);
	if (is->nxfers == is->capxfers) {
		is->capxfers = is->capxfers ? is->capxfers * 2 : 32;
		is->xfers = realloc(is->xfers, sizeof(Xfer) * (size_t)is->capxfers);
		if (!is->xfers)
			ICE("out of memory");
	}
	is->xfers[is->nxfers] = (Xfer){c->coll == OP_SEND ? DIR_SEND : DIR_RECV, c->axis, c->peer, c->channel, {c, op, micro}};
	is->nxfers++;
}

static int stream_cmp(int d1, int a1, int p1, int c1, int d2, int a2, int p2, int c2)
{
	if (d1 != d2)
		return d1 < d2 ? -1 : 1;
	if (a1 != a2)
		return a1 < a2 ? -1 : 1;
	if (p1 != p2)
		return p1 < p2 ? -1 : 1;
	return (c1 > c2) - (c1 < c2);
}

static unsigned stream_hash(const Xfer *x)
{
	unsigned h = (unsigned)x->dir * 0x9e3779b1u;
	h = (h ^ (unsigned)x->axis) * 0x85ebca6bu;
	h = (h ^ (unsigned)x->peer) * 0xc2b2ae35u;
	return (h ^ (unsigned)x->channel) * 0x27d4eb2fu;
}

static int by_stream_key(const void *pa, const void *pb)
{
	const Xfer *a = *(const Xfer *const *)pa, *b = *(const Xfer *const *)pb;
	return stream_cmp(a->dir, a->axis, a->peer, a->channel, b->dir, b->axis, b->peer, b->channel);
}

/* Groups the issued transfers into streams, sorted by stream and in issue order within each: each
 * distinct stream found through a hash table, the streams (few next to the transfers: a stage's
 * neighbours) sorted, then every transfer placed by counting, which keeps issue order. */
static void build_streams(Issued *is)
{
	int n = is->nxfers, size = 16;
	while (size < 2 * n)
		size *= 2;
	int *slot = malloc(sizeof(int) * (size_t)size), *sid = malloc(sizeof(int) * (size_t)(n + 1));
	const Xfer **first = malloc(sizeof(Xfer *) * (size_t)(n + 1));
	is->xe = malloc(sizeof(Entry) * (size_t)(n + 1));
	is->streams = malloc(sizeof(Stream) * (size_t)(n + 1));
	if (!slot || !sid || !first || !is->xe || !is->streams)
		ICE("out of memory");
	for (int h = 0; h < size; h++)
		slot[h] = -1;
	int ns = 0;
	for (int i = 0; i < n; i++) { /* sid[i]: the stream of transfer i, numbered as first seen */
		const Xfer *x = &is->xfers[i];
		unsigned h = stream_hash(x) & (unsigned)(size - 1);
		for (;; h = (h + 1) & (unsigned)(size - 1)) {
			if (slot[h] < 0) {
				slot[h] = ns;
				first[ns++] = x;
				break;
			}
			const Xfer *y = first[slot[h]];
			if (!stream_cmp(x->dir, x->axis, x->peer, x->channel, y->dir, y->axis, y->peer, y->channel))
				break;
		}
		sid[i] = slot[h];
	}
	qsort(first, (size_t)ns, sizeof *first, by_stream_key);
	int *rank = malloc(sizeof(int) * (size_t)(ns + 1)), *at = calloc((size_t)ns + 1, sizeof(int));
	if (!rank || !at)
		ICE("out of memory");
	for (int r = 0; r < ns; r++) /* a stream's number (first seen) -> its place in key order */
		rank[sid[first[r] - is->xfers]] = r;
	for (int i = 0; i < n; i++)
		at[rank[sid[i]] + 1]++;
	for (int r = 0; r < ns; r++) {
		at[r + 1] += at[r];
		const Xfer *x = first[r];
		is->streams[r] = (Stream){x->dir, x->axis, x->peer, x->channel, {&is->xe[at[r]], at[r + 1] - at[r], 0}};
	}
	is->nstreams = ns;
	for (int i = 0; i < n; i++)
		is->xe[at[rank[sid[i]]]++] = is->xfers[i].e;
	free(slot);
	free(sid);
	free(first);
	free(rank);
	free(at);
	free(is->xfers);
	is->xfers = NULL;
}

/* The stream of program is in one direction on (axis, peer, channel); an empty one if none. */
static const Seq *stream_of(const Issued *is, int dir, int axis, int peer, int channel)
{
	static const Seq empty;
	int lo = 0, hi = is->nstreams;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		const Stream *s = &is->streams[mid];
		int r = stream_cmp(s->dir, s->axis, s->peer, s->channel, dir, axis, peer, channel);
		if (!r)
			return &s->s;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return &empty;
}

static void issue_kernel(Check *C, Issued *is, const Kernel *k, int micro)
{
	for (int i = 0; i < k->ncomm; i++) {
		const Comm *c = &k->comm[i];
		if ((c->coll == OP_SEND || c->coll == OP_RECV) && (c->peer == PEER_RING_NEXT || c->peer == PEER_RING_PREV))
			push(&is->ring[2 * c->axis + (c->coll == OP_RECV)], c, k->op, micro);
		else if (c->coll == OP_SEND || c->coll == OP_RECV)
			push_xfer(C, is, c, k->op, micro);
		else
			push(&is->coll[c->pair >= 0 ? C->ps->naxes + c->pair : c->axis], c, k->op, micro);
	}
}

/* The communicating kernels per phase and chunk, so that walking the action table costs the
 * collectives and transfers each action issues, not the whole program per action. */
static void index_phases(Issued *is)
{
	const LProg *p = is->p;
	int nch = p->nchunks > 0 ? p->nchunks : 1, slots = PH_COUNT * (nch + 1);
	int *count = calloc((size_t)slots, sizeof(int));
	is->by_phase = calloc((size_t)slots, sizeof(int *));
	if (!count || !is->by_phase)
		ICE("out of memory");
	for (int pass = 0; pass < 2; pass++) {
		for (int s = 0; pass == 1 && s < slots; s++) {
			is->by_phase[s] = malloc(sizeof(int) * (size_t)(count[s] + 1));
			if (!is->by_phase[s])
				ICE("out of memory");
			is->by_phase[s][count[s]] = -1;
			count[s] = 0;
		}
		for (int i = 0; i < p->nk; i++) {
			const Kernel *k = &p->k[i];
			if (!k->ncomm)
				continue; /* issues nothing */
			int all = (int)k->phase * (nch + 1);
			if (pass == 1)
				is->by_phase[all][count[all]] = i;
			count[all]++;
			if (k->chunk >= 0 && k->chunk < nch) {
				int one = all + 1 + k->chunk;
				if (pass == 1)
					is->by_phase[one][count[one]] = i;
				count[one]++;
			}
		}
	}
	free(count);
}

static void issue_phase(Check *C, Issued *is, Phase ph, int chunk, int micro, int last_micro)
{
	const LProg *p = is->p;
	int nch = p->nchunks > 0 ? p->nchunks : 1;
	if (chunk >= nch)
		return;
	const int *list = is->by_phase[(int)ph * (nch + 1) + (chunk >= 0 ? 1 + chunk : 0)];
	for (; *list >= 0; list++) {
		const Kernel *k = &p->k[*list];
		if (k->only_last_micro && micro != last_micro)
			continue;
		issue_kernel(C, is, k, micro);
	}
}

static void prepare(Check *C, Issued *is, const SlotAction *a, int last_micro)
{
	issue_phase(C, is, a->kind == ACT_FORWARD ? PH_PREPARE_F : PH_PREPARE_B, a->chunk, a->micro, last_micro);
}

/* One step of a program, in execution order. */
static void issue_program(Check *C, Issued *is)
{
	const LProg *p = is->p;
	int last = p->ps->micro_batches > 0 ? p->ps->micro_batches - 1 : 0;
	index_phases(is);
	issue_phase(C, is, PH_INIT, -1, 0, last);
	issue_phase(C, is, PH_STEP_BEGIN, -1, 0, last);
	if (p->nactions)
		prepare(C, is, &p->actions[0], last);
	for (int i = 0; i < p->nactions; i++) {
		if (i + 1 < p->nactions)
			prepare(C, is, &p->actions[i + 1], last);
		const SlotAction *a = &p->actions[i];
		issue_phase(C, is, a->kind == ACT_FORWARD ? PH_FORWARD : PH_BACKWARD, a->chunk, a->micro, last);
	}
	issue_phase(C, is, PH_STEP, -1, 0, last);
	issue_phase(C, is, PH_SAVE, -1, 0, last);
	/* the end of an evaluation (its loss reductions); checkpoint and resume communicate nothing */
	for (Phase ph = PH_CHECKPOINT; ph <= PH_EVAL_END; ph++)
		issue_phase(C, is, ph, -1, 0, last);
	build_streams(is);
}

/* ------------------------------------------------------------------ ranks and programs */

/* The program a rank with coordinate c on axis (others 0) runs. */
static int program_at(const Check *C, int axis, int c)
{
	const PlanSpec *ps = C->ps;
	int stage = axis == ps->pipe_axis ? c : 0;
	int role = C->async_axis < 0 ? RANKROLE_ANY : (axis == C->async_axis ? c : 0) == 0 ? RANKROLE_MASTER : RANKROLE_WORKER;
	int i = stage >= 0 && stage < C->nstages ? C->prog_of[stage * 3 + role] : -1;
	if (i < 0)
		ICE("no program for stage %d role %d", stage, role);
	return i;
}

static void index_programs(Check *C)
{
	const Lowered *low = C->low;
	C->nstages = low->g->nstages > 0 ? low->g->nstages : 1;
	C->prog_of = malloc(sizeof(int) * (size_t)C->nstages * 3);
	if (!C->prog_of)
		ICE("out of memory");
	for (int i = 0; i < C->nstages * 3; i++)
		C->prog_of[i] = -1;
	for (int i = low->nprogs - 1; i >= 0; i--) { /* the first program of a stage and role wins */
		const LProg *p = low->progs[i];
		if (p->stage < 0 || p->stage >= C->nstages)
			ICE("program for stage %d of %d", p->stage, C->nstages);
		for (int role = 0; role < 3; role++)
			if (low->nroles == 1 || p->role == role)
				C->prog_of[p->stage * 3 + role] = i;
	}
}

/* The coordinates on axis whose ranks run different programs, as runs [lo, hi) of one program
 * each: a pipeline has one per stage, an async axis two (the master and its workers). */
typedef struct Range {
	int lo, hi, prog;
} Range;

static Range *program_ranges(const Check *C, int axis, int *n)
{
	int size = C->ps->axes[axis].size;
	Range *r = NULL;
	int nr = 0, cap = 0;
	for (int c = 0; c < size; c++) {
		int i = program_at(C, axis, c);
		if (nr && r[nr - 1].prog == i && r[nr - 1].hi == c) {
			r[nr - 1].hi = c + 1;
			continue;
		}
		if (nr == cap) {
			cap = cap ? cap * 2 : 8;
			r = realloc(r, sizeof(Range) * (size_t)cap);
			if (!r)
				ICE("out of memory");
		}
		r[nr++] = (Range){c, c + 1, i};
	}
	*n = nr;
	return r;
}

static int rank_at(const PlanSpec *ps, int axis, int c)
{
	int r = 0;
	for (int a = 0; a < ps->naxes; a++)
		r = r * ps->axes[a].size + (a == axis ? c : 0);
	return r;
}

/* ------------------------------------------------------------------ comparing */

static bool same(const Entry *ex, const Entry *ey, bool transfer)
{
	const Comm *x = ex->c, *y = ey->c;
	if ((!transfer && x->coll != y->coll) || x->elems != y->elems || x->dtype != y->dtype || x->rank != y->rank)
		return false;
	if (transfer && ex->micro != ey->micro)
		return false;
	for (int d = 0; d < x->rank; d++)
		if (x->shape[d] != y->shape[d])
			return false;
	return true;
}

static void describe(const Entry *e, int stage, int rank, bool transfer)
{
	const Comm *c = e->c;
	char shape[128] = "";
	size_t used = 0;
	for (int d = 0; d < c->rank && used < sizeof shape; d++)
		used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? ", " : "", c->shape[d]);
	if (transfer)
		diag_note_plain("rank %d (stage %d) issues %s of %lld %s [%s]%s%s of micro-batch %d", rank, stage,
				op_names[c->coll], c->elems, dtype_name(c->dtype), shape, c->what ? " for " : "",
				c->what ? c->what : "", e->micro);
	else
		diag_note_plain("rank %d (stage %d) issues %s of %lld %s [%s]%s%s", rank, stage, op_names[c->coll], c->elems,
				dtype_name(c->dtype), shape, c->what ? " for " : "", c->what ? c->what : "");
}

static bool compare(const Check *C, const Seq *a, const Seq *b, int ia, int ib, int ra, int rb, const char *group,
		    bool transfer, bool tied)
{
	const Graph *g = C->low->g;
	int n = a->n > b->n ? a->n : b->n;
	for (int i = 0; i < n; i++) {
		const Entry *x = i < a->n ? &a->e[i] : NULL, *y = i < b->n ? &b->e[i] : NULL;
		if (x && y && same(x, y, transfer))
			continue;
		int op = x ? x->op : y->op;
		const Op *o = op >= 0 ? &g->ops[op] : NULL;
		const Source *src = o && o->src ? o->src : C->ps->src;
		Loc loc = o && o->src ? o->loc : C->ps->plan->name_loc;
		diag_error(src, loc, "collectives would not match: call #%d in the %s group differs between rank %d and rank %d",
			   i + 1, group, ra, rb);
		int sa = C->low->progs[ia]->stage, sb = C->low->progs[ib]->stage;
		if (x)
			describe(x, sa, ra, transfer);
		else
			diag_note_plain("rank %d (stage %d) issues nothing more", ra, sa);
		if (y)
			describe(y, sb, rb, transfer);
		else
			diag_note_plain("rank %d (stage %d) issues nothing more", rb, sb);
		if (tied)
			diag_note_plain("a parameter shared by two pipeline stages must have the same layout on both; "
					"make their stage rules agree");
		return false;
	}
	return true;
}

/* A pair of ranks on one axis and channel whose transfers are compared: c sends, p receives. */
typedef struct Pair {
	int c, p, channel;
} Pair;

static int pair_cmp(const void *pa, const void *pb)
{
	const Pair *a = pa, *b = pb;
	if (a->c != b->c)
		return a->c < b->c ? -1 : 1;
	if (a->p != b->p)
		return a->p < b->p ? -1 : 1;
	return (a->channel > b->channel) - (a->channel < b->channel);
}

/* Every (sender, receiver, channel) on axis where either side has a stream, in coordinate order:
 * a program's streams times the coordinates that run it, so the work follows the transfers the
 * program holds, never axis size squared. */
static Pair *transfer_pairs(const Check *C, int a, const Range *rg, int nrg, int *npairs)
{
	Pair *v = NULL;
	long long n = 0, cap = 0;
	for (int r = 0; r < nrg; r++) {
		const Issued *is = &C->is[rg[r].prog];
		for (int s = 0; s < is->nstreams; s++) {
			const Stream *st = &is->streams[s];
			if (st->axis != a)
				continue;
			for (int x = rg[r].lo; x < rg[r].hi; x++) {
				if (n == cap) {
					cap = cap ? cap * 2 : 64;
					v = realloc(v, sizeof(Pair) * (size_t)cap);
					if (!v)
						ICE("out of memory");
				}
				v[n++] = st->dir == DIR_SEND ? (Pair){x, st->peer, st->channel} : (Pair){st->peer, x, st->channel};
			}
		}
	}
	if (n)
		qsort(v, (size_t)n, sizeof(Pair), pair_cmp);
	int m = 0;
	for (long long i = 0; i < n; i++)
		if (!m || pair_cmp(&v[m - 1], &v[i]))
			v[m++] = v[i];
	*npairs = m;
	return v;
}

bool check_collectives(const Lowered *low)
{
	const PlanSpec *ps = low->ps;
	/* async masters and workers: the batch axis state.c ran them on */
	Check C = {.low = low, .ps = ps, .async_axis = low->nroles > 1 ? low->state.sync_axis : -1};
	C.ncomm = ps->naxes + low->npairs;
	C.nchannel = 2 * (low->g->sched && low->g->sched->chunks > 0 ? low->g->sched->chunks : 1);
	index_programs(&C);
	C.is = calloc(low->nprogs > 0 ? (size_t)low->nprogs : 1, sizeof(Issued));
	if (!C.is)
		ICE("out of memory");
	for (int i = 0; i < low->nprogs; i++) {
		Issued *is = &C.is[i];
		is->p = low->progs[i];
		is->coll = calloc((size_t)C.ncomm, sizeof(Seq));
		is->ring = calloc((size_t)(2 * ps->naxes + 1), sizeof(Seq));
		if (!is->coll || !is->ring)
			ICE("out of memory");
		issue_program(&C, is);
	}
	bool ok = true;
	char group[160];
	/* groups whose members run different programs: the pipe axis and the async axis; each
	 * program is compared once with coordinate 0's (a million workers run one program) */
	char *compared = calloc((size_t)(low->nprogs > 0 ? low->nprogs : 1), 1);
	if (!compared)
		ICE("out of memory");
	for (int a = 0; a < ps->naxes && ok; a++) {
		if (a != ps->pipe_axis && a != C.async_axis)
			continue;
		int nrg;
		Range *rg = program_ranges(&C, a, &nrg);
		int i0 = rg[0].prog;
		memset(compared, 0, (size_t)low->nprogs);
		compared[i0] = 1;
		for (int r = 1; r < nrg && ok; r++) {
			int ic = rg[r].prog;
			if (compared[ic])
				continue;
			compared[ic] = 1;
			snprintf(group, sizeof group, "'%s'", ps->axes[a].name);
			ok = compare(&C, &C.is[i0].coll[a], &C.is[ic].coll[a], i0, ic, rank_at(ps, a, 0), rank_at(ps, a, rg[r].lo),
				     group, false, false);
		}
		free(rg);
	}
	free(compared);
	/* tied-parameter pairs */
	for (int q = 0; q < low->npairs && ok; q++) {
		int ia = program_at(&C, ps->pipe_axis, low->pair_a[q]), ib = program_at(&C, ps->pipe_axis, low->pair_b[q]);
		snprintf(group, sizeof group, "tied-parameter (stages %d and %d)", low->pair_a[q], low->pair_b[q]);
		ok = compare(&C, &C.is[ia].coll[ps->naxes + q], &C.is[ib].coll[ps->naxes + q], ia, ib,
			     rank_at(ps, ps->pipe_axis, low->pair_a[q]), rank_at(ps, ps->pipe_axis, low->pair_b[q]), group, false,
			     true);
	}
	/* ring shifts: every member of the axis runs the program, sending to the next coordinate what
	 * the next receives from it, so the k-th send must be the k-th receive */
	for (int i = 0; i < low->nprogs && ok; i++)
		for (int a = 0; a < ps->naxes && ok; a++) {
			if (!C.is[i].ring[2 * a].n && !C.is[i].ring[2 * a + 1].n)
				continue;
			snprintf(group, sizeof group, "ring (mesh axis '%s')", ps->axes[a].name);
			ok = compare(&C, &C.is[i].ring[2 * a], &C.is[i].ring[2 * a + 1], i, i, rank_at(ps, a, 0),
				     rank_at(ps, a, 1 % ps->axes[a].size), group, true, false);
		}
	/* point to point: what the rank at coordinate c sends to its peer p, p receives from c */
	for (int a = 0; a < ps->naxes && ok; a++) {
		if (a != ps->pipe_axis && a != C.async_axis)
			continue;
		int nrg, npairs;
		Range *rg = program_ranges(&C, a, &nrg);
		Pair *pairs = transfer_pairs(&C, a, rg, nrg, &npairs);
		for (int k = 0; k < npairs && ok; k++) {
			int c = pairs[k].c, peer = pairs[k].p, ch = pairs[k].channel;
			int ic = program_at(&C, a, c), ip = program_at(&C, a, peer);
			const Seq *out = stream_of(&C.is[ic], DIR_SEND, a, peer, ch);
			const Seq *in = stream_of(&C.is[ip], DIR_RECV, a, c, ch);
			int rc = rank_at(ps, a, c), rp = rank_at(ps, a, peer);
			if (!out->n) {
				const Op *o = in->e[0].op >= 0 ? &low->g->ops[in->e[0].op] : NULL;
				diag_error(o && o->src ? o->src : ps->src, o && o->src ? o->loc : ps->plan->name_loc,
					   "rank %d would wait forever: it receives from rank %d, which sends it nothing", rp, rc);
				ok = false;
				break;
			}
			snprintf(group, sizeof group, "point-to-point (rank %d to rank %d)", rc, rp);
			ok = compare(&C, out, in, ic, ip, rc, rp, group, true, false);
		}
		free(pairs);
		free(rg);
	}
	for (int i = 0; i < low->nprogs; i++) {
		Issued *is = &C.is[i];
		for (int k = 0; k < C.ncomm; k++)
			free(is->coll[k].e);
		for (int k = 0; k < 2 * ps->naxes; k++)
			free(is->ring[k].e);
		free(is->coll);
		free(is->ring);
		free(is->xe);
		free(is->streams);
		int nch = is->p->nchunks > 0 ? is->p->nchunks : 1;
		for (int s = 0; s < PH_COUNT * (nch + 1); s++)
			free(is->by_phase[s]);
		free(is->by_phase);
	}
	free(C.is);
	free(C.prog_of);
	return ok;
}
