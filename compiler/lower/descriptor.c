/* descriptor.c: the program descriptor (planrt_program_t, runtime/include/planrt_program.h),
 * computed once from the lowered program for every target to print: emit_c.c prints it as a
 * designated initializer, emit_llvm.c builds the same struct as an LLVM constant (the CUDA target
 * prints through emit_c.c). Before this file each target computed the fields itself.
 *
 * The descriptor's scalars: names, the mesh, the sizes, the learning-rate schedule, the async
 * roles, the sync mode and the optimizer as the checkpoint records them, and the fingerprint, a
 * hash of the whole lowered program that planrt records in every checkpoint (a checkpoint resumes
 * bit for bit under a program with the same one and is resharded otherwise). The tables the
 * descriptor points to (axes, stages, parameters) are each target's to print. */
#include "lower/lower.h"

#include <stdint.h>
#include <string.h>

static const char *sync_mode_name(SyncMode m)
{
	return m == SYNC_LOCAL_SGD ? "local_sgd" : m == SYNC_ASYNC ? "async" : "strict";
}

/* The plan's optimizer as the program descriptor records it (torch's argument names): a checkpoint
 * keeps it, and planrt refuses to resume under another kind. */
static const char *plan_optimizer_text(const Lowered *low)
{
	const PlanSpec *ps = low->ps;
	switch (ps->optimizer) {
	case OPT_SGD:
		return arena_printf(low->g->arena, "sgd(lr = %.9g)", ps->lr);
	case OPT_MOMENTUM:
		return arena_printf(low->g->arena, "momentum(lr = %.9g, momentum = %.9g)", ps->lr, ps->momentum);
	default:
		return arena_printf(low->g->arena, "%s(lr = %.9g, betas = (%.9g, %.9g), eps = %.9g, weight_decay = %.9g)",
				    ps->optimizer == OPT_ADAM ? "adam" : "adamw", ps->lr, ps->beta1, ps->beta2, ps->eps,
				    ps->weight_decay);
	}
}

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
	const unsigned char *b = data;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static uint64_t fnv_ll(uint64_t h, long long x)
{
	return fnv(h, &x, sizeof x);
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
	return s ? fnv(h, s, strlen(s) + 1) : fnv(h, "", 1);
}

/* A hash of everything a rank's program is: the mesh, the parameter table, every buffer and every
 * kernel with its arguments, in order. planrt records it in each checkpoint and resumes bit for
 * bit (rank-local state included) only under a program with the same one. "fnv1a64:" and 16 hex
 * digits. */
static const char *plan_fingerprint(const Lowered *low)
{
	const PlanSpec *ps = low->ps;
	uint64_t h = 0xcbf29ce484222325ull;
	h = fnv_str(h, ps->model->name);
	h = fnv_ll(h, ps->world);
	for (int a = 0; a < ps->naxes; a++) {
		h = fnv_str(h, ps->axes[a].name);
		h = fnv_ll(h, ps->axes[a].size);
	}
	h = fnv_ll(h, ps->batch);
	h = fnv_ll(h, ps->micro_batches);
	for (int i = 0; i < low->nparams; i++) {
		const ParamEntry *e = &low->params[i];
		h = fnv_str(h, e->name);
		h = fnv_ll(h, e->stage);
		for (int d = 0; d < e->rank; d++) {
			h = fnv_ll(h, e->gdims[d]);
			h = fnv_ll(h, e->ldims[d]);
			h = fnv_ll(h, e->split_axis[d]);
		}
	}
	for (int i = 0; i < low->nprogs; i++) {
		const LProg *p = low->progs[i];
		h = fnv_ll(h, p->stage);
		h = fnv_ll(h, p->role);
		for (int b = 0; b < p->nbuf; b++) {
			const Buffer *x = &p->buf[b];
			h = fnv_str(h, x->name);
			h = fnv_ll(h, x->cls);
			h = fnv_ll(h, x->state);
			h = fnv_ll(h, x->dtype);
			h = fnv_ll(h, x->elems);
			h = fnv_ll(h, x->view_of);
			h = fnv_ll(h, x->view_off);
		}
		for (int k = 0; k < p->nk; k++) {
			const Kernel *kk = &p->k[k];
			h = fnv_ll(h, kk->kind);
			h = fnv_ll(h, kk->phase);
			h = fnv_ll(h, kk->chunk);
			h = fnv_ll(h, kk->only_last_micro);
			for (int a = 0; a < kk->nargs; a++) {
				const KArg *x = &kk->args[a];
				h = fnv_ll(h, x->kind);
				h = fnv_ll(h, x->buf);
				h = fnv_ll(h, x->i);
				h = fnv(h, &x->f, sizeof x->f);
				h = fnv_ll(h, x->axis);
				h = fnv_ll(h, x->stride);
				h = fnv_ll(h, x->dim);
				for (int j = 0; j < x->n; j++)
					h = fnv_ll(h, x->kind == KA_INTS ? x->ints[j] : x->bufs[j]);
			}
		}
	}
	return arena_printf(low->g->arena, "fnv1a64:%016llx", (unsigned long long)h);
}

/* the axes ring attention's shifts run on (nn.context_parallel's), as bits */
static unsigned ring_axes(const Lowered *low)
{
	unsigned axes = 0;
	for (int i = 0; i < low->nprogs; i++)
		for (int k = 0; k < low->progs[i]->nk; k++) {
			const Kernel *x = &low->progs[i]->k[k];
			if (x->kind == K_RING_SHIFT && x->ncomm && x->comm[0].axis >= 0)
				axes |= 1u << x->comm[0].axis;
		}
	return axes;
}

ProgramDesc program_desc(const Lowered *low, const char *source_path)
{
	const PlanSpec *ps = low->ps;
	return (ProgramDesc){
		.plan = ps->plan->name,
		.model = ps->model->name,
		.source = source_path,
		.world = ps->world,
		.naxes = ps->naxes,
		.pipe_axis = ps->pipe_axis,
		.nstages = low->nprogs / low->nroles,
		.nparams = low->nparams,
		.micro_batches = ps->micro_batches > 0 ? ps->micro_batches : 1,
		.batch = ps->batch,
		.seq = low->seq,
		.vocab = low->vocab,
		.lr = ps->lr,
		.min_lr = ps->min_lr,
		.warmup = ps->warmup,
		.total_steps = ps->total_steps,
		.nroles = low->nroles,
		.role_axis = low->nroles > 1 ? low->state.sync_axis : -1, /* async masters and workers */
		.ring_axes = ring_axes(low),
		.fingerprint = plan_fingerprint(low),
		.sync = sync_mode_name(low->state.sync),
		.loss_scale = ps->loss_scale,
		.optimizer = plan_optimizer_text(low),
	};
}
