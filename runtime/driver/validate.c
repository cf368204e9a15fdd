/* validate.c: the generated tables checked against each other before planrt_main uses them: the
 * stage this rank runs (its slots and inboxes inside its arena, every action's chunk, slot, inbox
 * and function, its state buffers' kinds) and every parameter's block inside its tensor. The
 * tables are planc's output: an inconsistency is planc's bug, reported before it corrupts memory. */
#include "driver.h"

enum { MAX_DIMS = 8 };

void planrt_check_program_(const planrt_program_t *p, int stage_index)
{
	int nroles = p->nroles > 1 ? p->nroles : 1;
	if (p->nstages < 1 || !p->stages)
		planrt_fatal("internal error: program '%s' has no stages", p->plan);
	if (p->pipe_axis >= p->naxes || (nroles > 1 && (p->role_axis < 0 || p->role_axis >= p->naxes)))
		planrt_fatal("internal error: pipe axis %d, role axis %d of a %d-axis mesh", p->pipe_axis, p->role_axis,
			     p->naxes);
	if (stage_index < 0 || stage_index >= p->nstages * nroles)
		planrt_fatal("internal error: this rank runs program %d but the program has %d stages of %d roles",
			     stage_index, p->nstages, nroles);
	const planrt_stage_t *s = &p->stages[stage_index];
	if (s->nslots < 0 || s->ninbox < 0 || s->nreqs < 0 || s->nchunks < 0 || s->nactions < 0 || s->nstate < 0)
		planrt_fatal("internal error: stage %d has a negative count", stage_index);
	if (s->nslots && (s->slot_offset > s->arena_bytes ||
			  s->slot_bytes > (s->arena_bytes - s->slot_offset) / (size_t)s->nslots))
		planrt_fatal("internal error: stage %d's %d slots of %zu bytes at %zu overrun the %zu-byte arena",
			     stage_index, s->nslots, s->slot_bytes, s->slot_offset, s->arena_bytes);
	if (s->ninbox && (s->inbox_offset > s->arena_bytes ||
			  s->inbox_bytes > (s->arena_bytes - s->inbox_offset) / (size_t)s->ninbox))
		planrt_fatal("internal error: stage %d's %d inboxes of %zu bytes at %zu overrun the %zu-byte arena",
			     stage_index, s->ninbox, s->inbox_bytes, s->inbox_offset, s->arena_bytes);
	for (int i = 0; i < s->nactions; i++) {
		const planrt_action_t *a = &s->actions[i];
		const planrt_phase_fn *run = a->kind == PLANRT_FORWARD ? s->forward : s->backward;
		if (a->kind > PLANRT_BACKWARD || a->chunk >= s->nchunks || a->slot >= s->nslots ||
		    (a->inbox != PLANRT_NO_INBOX && a->inbox >= s->ninbox) || !run || !run[a->chunk])
			planrt_fatal("internal error: stage %d action %d (kind %d, chunk %d, slot %d, inbox %d) does not fit "
				     "the stage (%d chunks, %d slots, %d inboxes) or has no function",
				     stage_index, i, a->kind, a->chunk, a->slot, a->inbox, s->nchunks, s->nslots, s->ninbox);
	}
	for (int i = 0; i < s->nstate; i++)
		if (s->state[i].kind >= planrt_state_kinds || !s->state[i].ptr)
			planrt_fatal("internal error: state buffer '%s' has kind %d or no pointer", s->state[i].name,
				     s->state[i].kind);
	for (int i = 0; i < s->nfamilies; i++)
		if (s->families[i].kind >= planrt_state_kinds || (!s->families[i].ptrs && !s->layers) ||
		    s->families[i].count < 1 || s->families[i].stride < 0)
			planrt_fatal("internal error: state family '%s' has kind %d, %d members, stride %d or no pointers",
				     s->families[i].name, s->families[i].kind, s->families[i].count, s->families[i].stride);
	if (s->nfamilies < 0 || (s->nfamilies && !s->families))
		planrt_fatal("internal error: stage %d has %d state families", stage_index, s->nfamilies);
	for (int i = 0; i < p->nparams; i++) {
		const planrt_param_t *q = &p->params[i];
		if (q->rank < 0 || q->rank > MAX_DIMS)
			planrt_fatal("internal error: parameter '%s' has rank %d", q->name, q->rank);
		for (int d = 0; d < q->rank; d++) {
			int ax = q->split_axis[d];
			int64_t off = ax >= 0 ? (int64_t)planrt_mesh_coord(ax) * q->ldims[d] : 0;
			if (ax >= p->naxes || q->ldims[d] < 0 || off < 0 || off + q->ldims[d] > q->gdims[d])
				planrt_fatal("internal error: parameter '%s' dim %d: block of %lld at %lld (axis %d) "
					     "outside %lld",
					     q->name, d, (long long)q->ldims[d], (long long)off, ax, (long long)q->gdims[d]);
		}
	}
}
