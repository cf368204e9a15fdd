/* schedule.c: the collective-sequence check (DESIGN 1.4), on the loop-level IR.
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
 * master against workers, and every point-to-point stream. The work is proportional to the stages
 * and the kernels, not to the ranks. */
#include "planc.h"

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

/* What one program issues, per group. */
typedef struct Issued {
	const LProg *p;
	Seq *coll;  /* [naxes + npairs] */
	Seq *sends; /* [naxes * npeer * 2 channels] */
	Seq *recvs;
} Issued;

typedef struct Check {
	const Lowered *low;
	const PlanSpec *ps;
	int ncomm, npeer, nchannel;
	int async_axis;
	Issued *is; /* [nprogs] */
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

static int peer_index(const Check *C, int axis, int peer, int channel)
{
	if (peer < 0 || peer >= C->npeer || channel < 0 || channel >= C->nchannel)
		ICE("p2p peer %d (channel %d) out of range", peer, channel);
	return (axis * C->npeer + peer) * C->nchannel + channel;
}

static void issue_kernel(Check *C, Issued *is, const Kernel *k, int micro)
{
	for (int i = 0; i < k->ncomm; i++) {
		const Comm *c = &k->comm[i];
		if (c->coll == OP_SEND || c->coll == OP_RECV) {
			Seq *s = c->coll == OP_SEND ? is->sends : is->recvs;
			push(&s[peer_index(C, c->axis, c->peer, c->channel)], c, k->op, micro);
		} else {
			push(&is->coll[c->pair >= 0 ? C->ps->naxes + c->pair : c->axis], c, k->op, micro);
		}
	}
}

static void issue_phase(Check *C, Issued *is, Phase ph, int chunk, int micro, int last_micro)
{
	const LProg *p = is->p;
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		if (k->phase != ph || (chunk >= 0 && k->chunk != chunk))
			continue;
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
}

/* ------------------------------------------------------------------ ranks and programs */

/* The program a rank with coordinate c on axis (others 0) runs. */
static int program_at(const Check *C, int axis, int c)
{
	const PlanSpec *ps = C->ps;
	int stage = axis == ps->pipe_axis ? c : 0;
	int role = C->async_axis < 0 ? RANKROLE_ANY : (axis == C->async_axis ? c : 0) == 0 ? RANKROLE_MASTER : RANKROLE_WORKER;
	for (int i = 0; i < C->low->nprogs; i++) {
		const LProg *p = C->low->progs[i];
		if (p->stage == stage && (C->low->nroles == 1 || p->role == role))
			return i;
	}
	ICE("no program for stage %d role %d", stage, role);
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

bool check_collectives(const Lowered *low)
{
	const PlanSpec *ps = low->ps;
	Check C = {.low = low, .ps = ps, .async_axis = -1};
	if (ps->sync == SYNC_ASYNC)
		for (int r = 0; r < ps->nrules; r++)
			if (ps->rules[r].dim_name && ps->batch_dim && !strcmp(ps->rules[r].dim_name, ps->batch_dim))
				C.async_axis = ps->rules[r].axis;
	C.ncomm = ps->naxes + low->npairs;
	C.nchannel = 2 * (low->g->sched && low->g->sched->chunks > 0 ? low->g->sched->chunks : 1);
	C.npeer = 1; /* transfers run along the pipe axis and the async axis only */
	for (int a = 0; a < ps->naxes; a++)
		if ((a == ps->pipe_axis || a == C.async_axis) && ps->axes[a].size > C.npeer)
			C.npeer = ps->axes[a].size;
	C.is = calloc((size_t)low->nprogs, sizeof(Issued));
	if (!C.is)
		ICE("out of memory");
	for (int i = 0; i < low->nprogs; i++) {
		Issued *is = &C.is[i];
		is->p = low->progs[i];
		is->coll = calloc((size_t)C.ncomm, sizeof(Seq));
		is->sends = calloc((size_t)ps->naxes * (size_t)C.npeer * (size_t)C.nchannel, sizeof(Seq));
		is->recvs = calloc((size_t)ps->naxes * (size_t)C.npeer * (size_t)C.nchannel, sizeof(Seq));
		if (!is->coll || !is->sends || !is->recvs)
			ICE("out of memory");
		issue_program(&C, is);
	}
	bool ok = true;
	char group[160];
	/* groups whose members run different programs: the pipe axis and the async axis */
	for (int a = 0; a < ps->naxes && ok; a++) {
		if (a != ps->pipe_axis && a != C.async_axis)
			continue;
		int i0 = program_at(&C, a, 0);
		for (int c = 1; c < ps->axes[a].size && ok; c++) {
			int ic = program_at(&C, a, c);
			if (ic == i0)
				continue;
			snprintf(group, sizeof group, "'%s'", ps->axes[a].name);
			ok = compare(&C, &C.is[i0].coll[a], &C.is[ic].coll[a], i0, ic, rank_at(ps, a, 0), rank_at(ps, a, c), group,
				     false, false);
		}
	}
	/* tied-parameter pairs */
	for (int q = 0; q < low->npairs && ok; q++) {
		int ia = program_at(&C, ps->pipe_axis, low->pair_a[q]), ib = program_at(&C, ps->pipe_axis, low->pair_b[q]);
		snprintf(group, sizeof group, "tied-parameter (stages %d and %d)", low->pair_a[q], low->pair_b[q]);
		ok = compare(&C, &C.is[ia].coll[ps->naxes + q], &C.is[ib].coll[ps->naxes + q], ia, ib,
			     rank_at(ps, ps->pipe_axis, low->pair_a[q]), rank_at(ps, ps->pipe_axis, low->pair_b[q]), group, false,
			     true);
	}
	/* point to point: what the rank at coordinate c sends to its peer p, p receives from c */
	for (int a = 0; a < ps->naxes && ok; a++) {
		if (a != ps->pipe_axis && a != C.async_axis)
			continue;
		for (int c = 0; c < ps->axes[a].size && ok; c++) {
			int ic = program_at(&C, a, c);
			for (int peer = 0; peer < ps->axes[a].size && ok; peer++)
				for (int ch = 0; ch < C.nchannel && ok; ch++) {
					const Seq *out = &C.is[ic].sends[peer_index(&C, a, peer, ch)];
					int ip = program_at(&C, a, peer);
					const Seq *in = &C.is[ip].recvs[peer_index(&C, a, c, ch)];
					if (!out->n && !in->n)
						continue;
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
		}
	}
	for (int i = 0; i < low->nprogs; i++) {
		for (int k = 0; k < C.ncomm; k++)
			free(C.is[i].coll[k].e);
		for (int k = 0; k < ps->naxes * C.npeer * C.nchannel; k++) {
			free(C.is[i].sends[k].e);
			free(C.is[i].recvs[k].e);
		}
		free(C.is[i].coll);
		free(C.is[i].sends);
		free(C.is[i].recvs);
	}
	free(C.is);
	return ok;
}
