/* schedule.c: the collective-sequence check (DESIGN 1.4).
 *
 * Before anything is emitted, planc proves that no rank can wait forever on a collective: for
 * every communicator (a mesh axis group, or the two-stage group of a tied parameter) every member
 * must issue the same collectives in the same order with the same element counts and dtypes, and
 * for every pair of ranks the sends of one must match the receives of the other.
 *
 * Each rank is visited through its mesh coordinates. Ranks with the same pipeline stage and async
 * role run the same op list, so their per-communicator sequences are built once and shared; every
 * group of every axis is then compared member by member. */
#include "planc.h"

#include <stdlib.h>
#include <string.h>

typedef struct Entry {
	OpKind kind;
	long long count;
	DType dtype;
	int op; /* index in the graph, for messages */
	int rank;
	long long shape[MAX_DIMS]; /* the local block: equal counts with different blocks still differ */
} Entry;

typedef struct Seq {
	Entry *e;
	int n, cap;
} Seq;

typedef struct Checker {
	Graph *g;
	PlanSpec *ps;
	int nroles;  /* stages x roles */
	int ncomms;  /* mesh axes, then one per tied-parameter stage pair */
	int pair_a[64], pair_b[64];
	int npairs;
	Seq *seqs;   /* [role][comm] */
	int async_axis;
} Checker;

static void seq_push(Seq *s, Entry e)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 64;
		Entry *ne = realloc(s->e, sizeof(Entry) * (size_t)s->cap);
		if (!ne)
			ICE("out of memory");
		s->e = ne;
	}
	s->e[s->n++] = e;
}

static int rank_stage(const Checker *c, const int *coord)
{
	return c->ps->pipe_axis >= 0 ? coord[c->ps->pipe_axis] : 0;
}

static int rank_role(const Checker *c, const int *coord)
{
	if (c->async_axis < 0)
		return RANKROLE_ANY;
	return coord[c->async_axis] == 0 ? RANKROLE_MASTER : RANKROLE_WORKER;
}

static int role_index(const Checker *c, int stage, int role)
{
	return stage * 3 + role;
}

static bool runs_on(const Op *op, int stage, int role)
{
	if (op->role != RANKROLE_ANY && op->role != role)
		return false;
	if (op->stage_group[0] >= 0)
		return stage == op->stage_group[0] || stage == op->stage_group[1];
	return op->stage == stage;
}

static int comm_of(Checker *c, const Op *op)
{
	if (op->stage_group[0] < 0)
		return op->axis;
	for (int i = 0; i < c->npairs; i++)
		if (c->pair_a[i] == op->stage_group[0] && c->pair_b[i] == op->stage_group[1])
			return c->ps->naxes + i;
	if (c->npairs == 64)
		ICE("too many tied-parameter groups");
	c->pair_a[c->npairs] = op->stage_group[0];
	c->pair_b[c->npairs] = op->stage_group[1];
	return c->ps->naxes + c->npairs++;
}

static long long entry_count(const Graph *g, const Op *op, int stage)
{
	int v = op->in[0];
	if (op->stage_group[0] >= 0 && stage == op->stage_group[1] && op->nin > 1)
		v = op->in[1];
	if (op->kind == OP_RECV)
		v = op->out[0];
	return value_local_elems(g, v);
}

static DType entry_dtype(const Graph *g, const Op *op)
{
	return g->vals[op->kind == OP_RECV ? op->out[0] : op->in[0]].dtype;
}

static Entry make_entry(const Graph *g, const Op *op, int index, int stage)
{
	Entry e;
	memset(&e, 0, sizeof e);
	e.kind = op->kind;
	e.count = entry_count(g, op, stage);
	e.dtype = entry_dtype(g, op);
	e.op = index;
	int v = op->in[0];
	if (op->stage_group[0] >= 0 && stage == op->stage_group[1] && op->nin > 1)
		v = op->in[1];
	if (op->kind == OP_RECV)
		v = op->out[0];
	const Value *val = &g->vals[v];
	e.rank = val->rank;
	for (int d = 0; d < val->rank; d++) {
		e.shape[d] = val->dim[d];
		for (int a = 0; a < g->ps->naxes; a++)
			if (val->lay.on[a] == d)
				e.shape[d] /= g->ps->axes[a].size;
	}
	return e;
}

static bool same_entry(const Entry *x, const Entry *y)
{
	if (x->kind != y->kind || x->count != y->count || x->dtype != y->dtype || x->rank != y->rank)
		return false;
	for (int d = 0; d < x->rank; d++)
		if (x->shape[d] != y->shape[d])
			return false;
	return true;
}

static void describe(const Checker *c, const Entry *e, int stage, const char *who)
{
	const Graph *g = c->g;
	const Op *op = &g->ops[e->op];
	const char *what = g->vals[op->kind == OP_RECV ? op->out[0] : op->in[0]].name;
	char shape[128] = "";
	size_t used = 0;
	for (int d = 0; d < e->rank && used < sizeof shape; d++)
		used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? ", " : "", e->shape[d]);
	diag_note_plain("%s (stage %d) issues %s of %lld %s [%s]%s%s", who, stage, op_names[e->kind], e->count,
			dtype_name(e->dtype), shape, what ? " for " : "", what ? what : "");
}

static bool compare(Checker *c, const Seq *a, const Seq *b, int sa, int sb, int ra, int rb, const char *group)
{
	int n = a->n > b->n ? a->n : b->n;
	for (int i = 0; i < n; i++) {
		const Entry *x = i < a->n ? &a->e[i] : NULL, *y = i < b->n ? &b->e[i] : NULL;
		if (x && y && same_entry(x, y))
			continue;
		const Op *op = x ? &c->g->ops[x->op] : &c->g->ops[y->op];
		const Source *src = op->src ? op->src : c->ps->src;
		Loc loc = op->src ? op->loc : c->ps->plan->name_loc;
		diag_error(src, loc, "collectives would not match: call #%d in the %s group differs between rank %d and rank %d",
			   i + 1, group, ra, rb);
		char who[64];
		if (x) {
			snprintf(who, sizeof who, "rank %d", ra);
			describe(c, x, sa, who);
		} else {
			diag_note_plain("rank %d (stage %d) issues nothing more", ra, sa);
		}
		if (y) {
			snprintf(who, sizeof who, "rank %d", rb);
			describe(c, y, sb, who);
		} else {
			diag_note_plain("rank %d (stage %d) issues nothing more", rb, sb);
		}
		if (op->stage_group[0] >= 0)
			diag_note_plain("a parameter shared by two pipeline stages must have the same layout on both; "
					"make their stage rules agree");
		return false;
	}
	return true;
}

static void rank_coords(const PlanSpec *ps, int rank, int *coord)
{
	for (int a = ps->naxes - 1; a >= 0; a--) {
		coord[a] = rank % ps->axes[a].size;
		rank /= ps->axes[a].size;
	}
}

static int coords_rank(const PlanSpec *ps, const int *coord)
{
	int r = 0;
	for (int a = 0; a < ps->naxes; a++)
		r = r * ps->axes[a].size + coord[a];
	return r;
}

bool check_collectives(Graph *g)
{
	PlanSpec *ps = g->ps;
	Checker c = {.g = g, .ps = ps, .async_axis = -1};
	if (ps->sync == SYNC_ASYNC)
		for (int r = 0; r < ps->nrules; r++)
			if (ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim))
				c.async_axis = ps->rules[r].axis;
	int nstages = g->nstages;
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].stage_group[0] >= 0)
			comm_of(&c, &g->ops[i]);
	c.ncomms = ps->naxes + c.npairs;
	c.nroles = nstages * 3;
	c.seqs = calloc((size_t)c.nroles * (size_t)c.ncomms, sizeof(Seq));
	/* p2p: sends[role][peer stage or coord] kept as sequences too */
	int npeer = nstages > 1 ? nstages : 1;
	int maxc = 1;
	for (int a = 0; a < ps->naxes; a++)
		if (ps->axes[a].size > maxc)
			maxc = ps->axes[a].size;
	if (npeer < maxc)
		npeer = maxc;
	Seq *sends = calloc((size_t)c.nroles * (size_t)npeer, sizeof(Seq));
	Seq *recvs = calloc((size_t)c.nroles * (size_t)npeer, sizeof(Seq));
	if (!c.seqs || !sends || !recvs)
		ICE("out of memory");
	for (int s = 0; s < nstages; s++)
		for (int role = 0; role < 3; role++) {
			int ri = role_index(&c, s, role);
			for (int i = 0; i < g->nops; i++) {
				const Op *op = &g->ops[i];
				OpClass k = op_classes[op->kind];
				if ((k != OPK_COLLECTIVE && k != OPK_P2P) || op->kind == OP_SLICE)
					continue;
				if (!runs_on(op, s, role))
					continue;
				Entry e = make_entry(g, op, i, s);
				if (k == OPK_COLLECTIVE) {
					seq_push(&c.seqs[ri * c.ncomms + comm_of(&c, op)], e);
				} else {
					int peer = op->peer >= 0 ? op->peer : (int)op->n;
					if (peer < 0 || peer >= npeer)
						ICE("p2p peer out of range");
					seq_push(&(op->kind == OP_SEND ? sends : recvs)[ri * npeer + peer], e);
				}
			}
		}
	bool ok = true;
	int world = ps->world > 0 ? ps->world : 1;
	int coord[MAX_AXES], other[MAX_AXES];
	char group[128];
	/* every group of every mesh axis: compare each member with the group's first member */
	for (int r = 0; r < world && ok; r++) {
		rank_coords(ps, r, coord);
		int s = rank_stage(&c, coord), role = rank_role(&c, coord);
		for (int a = 0; a < ps->naxes && ok; a++) {
			if (coord[a] != 0)
				continue; /* r is the first member of this group */
			for (int k = 1; k < ps->axes[a].size && ok; k++) {
				memcpy(other, coord, sizeof coord);
				other[a] = k;
				int s2 = rank_stage(&c, other), role2 = rank_role(&c, other);
				if (s2 == s && role2 == role)
					continue; /* same op list: identical sequences */
				snprintf(group, sizeof group, "'%s'", ps->axes[a].name);
				ok = compare(&c, &c.seqs[role_index(&c, s, role) * c.ncomms + a],
					     &c.seqs[role_index(&c, s2, role2) * c.ncomms + a], s, s2, r, coords_rank(ps, other), group);
			}
		}
		for (int p = 0; p < c.npairs && ok; p++) {
			if (s != c.pair_a[p])
				continue;
			memcpy(other, coord, sizeof coord);
			other[ps->pipe_axis] = c.pair_b[p];
			snprintf(group, sizeof group, "tied-parameter (stages %d and %d)", c.pair_a[p], c.pair_b[p]);
			int ri = role_index(&c, s, role), ri2 = role_index(&c, c.pair_b[p], rank_role(&c, other));
			ok = compare(&c, &c.seqs[ri * c.ncomms + ps->naxes + p], &c.seqs[ri2 * c.ncomms + ps->naxes + p], s,
				     c.pair_b[p], r, coords_rank(ps, other), group);
		}
	}
	/* point to point: what rank r sends to its peer, the peer receives from r, in order */
	for (int r = 0; r < world && ok; r++) {
		rank_coords(ps, r, coord);
		int s = rank_stage(&c, coord), role = rank_role(&c, coord);
		int ri = role_index(&c, s, role);
		for (int peer = 0; peer < npeer && ok; peer++) {
			const Seq *out = &sends[ri * npeer + peer];
			if (!out->n)
				continue;
			const Op *op = &g->ops[out->e[0].op];
			memcpy(other, coord, sizeof coord);
			other[op->axis] = peer;
			int ps2 = rank_stage(&c, other), role2 = rank_role(&c, other);
			int me = coord[op->axis];
			const Seq *in = &recvs[role_index(&c, ps2, role2) * npeer + me];
			snprintf(group, sizeof group, "point-to-point (rank %d to rank %d)", r, coords_rank(ps, other));
			Seq a = *out, b = *in;
			/* compare kinds as transfers: a SEND matches a RECV */
			Seq bb = {0};
			for (int i = 0; i < b.n; i++) {
				Entry e = b.e[i];
				e.kind = OP_SEND;
				seq_push(&bb, e);
			}
			ok = compare(&c, &a, &bb, s, ps2, r, coords_rank(ps, other), group);
			free(bb.e);
		}
	}
	/* and a receive that no send feeds: the receiver would wait forever */
	for (int r = 0; r < world && ok; r++) {
		rank_coords(ps, r, coord);
		int s = rank_stage(&c, coord), role = rank_role(&c, coord);
		int ri = role_index(&c, s, role);
		for (int peer = 0; peer < npeer && ok; peer++) {
			const Seq *in = &recvs[ri * npeer + peer];
			if (!in->n)
				continue;
			const Op *op = &g->ops[in->e[0].op];
			memcpy(other, coord, sizeof coord);
			other[op->axis] = peer;
			int s2 = rank_stage(&c, other), role2 = rank_role(&c, other);
			const Seq *out = &sends[role_index(&c, s2, role2) * npeer + coord[op->axis]];
			if (out->n)
				continue; /* matched above, from the sender's side */
			const Source *src = op->src ? op->src : ps->src;
			diag_error(src, op->src ? op->loc : ps->plan->name_loc,
				   "rank %d would wait forever: it receives from rank %d, which sends it nothing", r,
				   coords_rank(ps, other));
			ok = false;
		}
	}
	for (int i = 0; i < c.nroles * c.ncomms; i++)
		free(c.seqs[i].e);
	for (int i = 0; i < c.nroles * npeer; i++) {
		free(sends[i].e);
		free(recvs[i].e);
	}
	free(c.seqs);
	free(sends);
	free(recvs);
	return ok;
}
