/* memplan.c: buffer assignment. Every arena value of one micro-batch (inputs, activations kept
 * for the backward, temporaries, collective scratch) gets an offset in one arena per rank:
 * liveness over the kernel list (forward, backward, then the per-step kernels, which reuse the
 * arena once the micro-batch is done), then first-fit by decreasing size, the way TFLite's
 * arena planner and XLA's heap simulator place buffers. Views take no space; persistent state
 * (parameters, gradient accumulators, optimizer moments) is counted in state_bytes. */
#include "planc.h"

#include <stdlib.h>
#include <string.h>

enum { ALIGN = 64 };

typedef struct Interval {
	int value; /* -1 for scratch */
	int kernel;
	size_t bytes;
	int first, last;
	size_t offset;
} Interval;

static int root_of(const LProg *p, int v)
{
	while (p->buf[v].cls == BUF_VIEW && p->buf[v].view_of >= 0)
		v = p->buf[v].view_of;
	return v;
}

static int by_size_desc(const void *a, const void *b)
{
	const Interval *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return x->first - y->first;
}

static int by_offset(const void *a, const void *b)
{
	const Interval *x = *(Interval *const *)a, *y = *(Interval *const *)b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void memplan(LProg *p)
{
	Graph *g = p->g;
	for (int v = 0; v < g->nvals; v++)
		p->buf[v].first = p->buf[v].last = -1;
	/* inputs are written when the micro-batch starts */
	for (int i = 0; i < p->ninputs; i++)
		p->buf[p->inputs[i]].first = 0;
	int nscratch = 0;
	for (int k = 0; k < p->nk; k++) {
		const Kernel *ker = &p->k[k];
		for (int i = 0; i < ker->ndefs; i++) {
			Buffer *b = &p->buf[root_of(p, ker->defs[i])];
			if (b->first < 0)
				b->first = k;
			if (b->last < k)
				b->last = k;
		}
		for (int i = 0; i < ker->nuses; i++) {
			Buffer *b = &p->buf[root_of(p, ker->uses[i])];
			if (b->first < 0)
				b->first = k;
			b->last = k;
		}
		if (ker->scratch || ker->conv_bytes)
			nscratch++;
	}
	/* the loss is read after the backward (logging) */
	if (p->loss >= 0 && p->buf[p->loss].cls == BUF_ARENA)
		p->buf[root_of(p, p->loss)].last = p->nk;
	Interval *iv = malloc(sizeof(Interval) * (size_t)(g->nvals + nscratch + 1));
	if (!iv)
		ICE("out of memory");
	int n = 0;
	for (int v = 0; v < g->nvals; v++) {
		Buffer *b = &p->buf[v];
		if (b->cls != BUF_ARENA || b->first < 0)
			continue;
		size_t bytes = (b->bytes + ALIGN - 1) / ALIGN * ALIGN;
		iv[n++] = (Interval){v, -1, bytes ? bytes : ALIGN, b->first, b->last, 0};
	}
	for (int k = 0; k < p->nk; k++) {
		size_t bytes = (p->k[k].scratch + ALIGN - 1) / ALIGN * ALIGN + p->k[k].conv_bytes;
		if (bytes)
			iv[n++] = (Interval){-1, k, bytes, k, k, 0};
	}
	qsort(iv, (size_t)n, sizeof *iv, by_size_desc);
	Interval **placed = malloc(sizeof(Interval *) * (size_t)(n + 1));
	Interval **conflict = malloc(sizeof(Interval *) * (size_t)(n + 1));
	if (!placed || !conflict)
		ICE("out of memory");
	int nplaced = 0;
	size_t top = 0;
	for (int i = 0; i < n; i++) {
		Interval *x = &iv[i];
		int nc = 0;
		for (int j = 0; j < nplaced; j++)
			if (placed[j]->first <= x->last && x->first <= placed[j]->last)
				conflict[nc++] = placed[j];
		qsort(conflict, (size_t)nc, sizeof *conflict, by_offset);
		size_t off = 0;
		for (int j = 0; j < nc; j++) {
			if (conflict[j]->offset >= off + x->bytes)
				break;
			size_t end = conflict[j]->offset + conflict[j]->bytes;
			if (end > off)
				off = end;
		}
		x->offset = off;
		placed[nplaced++] = x;
		if (off + x->bytes > top)
			top = off + x->bytes;
	}
	for (int i = 0; i < n; i++) {
		if (iv[i].value >= 0)
			p->buf[iv[i].value].offset = iv[i].offset;
		else
			p->k[iv[i].kernel].scratch_offset = iv[i].offset;
	}
	p->arena_bytes = top;
	/* Persistent state, decided here once (emit_c.c allocates exactly this, explain reports it):
	 * parameters and gradient accumulators (ZeRO 1/2 parameters padded to whole chunks); per
	 * parameter the optimizer's f32 moments and, for lower precision, f32 master weights, both
	 * for the elements this rank updates (its ZeRO chunk); ZeRO's f32 gradient chunks and gather
	 * scratch; the widened gradient of lower precision. */
	size_t state = 0;
	PlanSpec *ps = g->ps;
	int moments = ps->optimizer == OPT_ADAM || ps->optimizer == OPT_ADAMW ? 2 : ps->optimizer == OPT_MOMENTUM ? 1 : 0;
	bool zero = ps->zero_stage >= 1 && ps->zero_axis >= 0 && ps->axes[ps->zero_axis].size > 1;
	int zn = zero ? ps->axes[ps->zero_axis].size : 1;
	for (int v = 0; v < g->nvals; v++) {
		Buffer *b = &p->buf[v];
		b->alloc_bytes = 0;
		if (b->cls != BUF_STATE || (b->first < 0 && g->vals[v].role != ROLE_PARAM))
			continue;
		if (g->vals[v].def < 0 || g->ops[g->vals[v].def].stage != p->stage)
			continue;
		b->alloc_bytes = b->bytes;
		if (zero && ps->zero_stage < 3 && g->vals[v].role == ROLE_PARAM && g->ops[g->vals[v].def].kind == OP_PARAM)
			b->alloc_bytes = (size_t)((b->elems + zn - 1) / zn) * (size_t)zn * (size_t)dtype_bytes(b->dtype);
		state += b->alloc_bytes;
	}
	int np = p->nparams ? p->nparams : 1;
	p->owned = arena_alloc(g->arena, sizeof(long long) * (size_t)np);
	p->moment_bytes = arena_alloc(g->arena, sizeof(size_t) * (size_t)np);
	p->master_bytes = arena_alloc(g->arena, sizeof(size_t) * (size_t)np);
	p->gchunk_bytes = arena_alloc(g->arena, sizeof(size_t) * (size_t)np);
	p->zero_scratch_bytes = p->widened_bytes = 0;
	for (int i = 0; i < p->nparams; i++) {
		const Buffer *b = &p->buf[p->params[i]];
		long long elems = 1;
		for (int d = 0; d < g->vals[p->params[i]].rank; d++)
			elems *= b->ldims[d];
		p->owned[i] = zero ? (elems + zn - 1) / zn : elems;
		p->moment_bytes[i] = moments ? (size_t)p->owned[i] * 4 : 0;
		p->master_bytes[i] = b->dtype != DT_F32 ? (size_t)p->owned[i] * 4 : 0;
		p->gchunk_bytes[i] = zero ? (size_t)p->owned[i] * 4 : 0;
		state += p->moment_bytes[i] * (size_t)moments + p->master_bytes[i] + p->gchunk_bytes[i];
		if (zero && (size_t)p->owned[i] * (size_t)zn * 4 > p->zero_scratch_bytes)
			p->zero_scratch_bytes = (size_t)p->owned[i] * (size_t)zn * 4;
		if (b->dtype != DT_F32 && (size_t)b->elems * 4 > p->widened_bytes)
			p->widened_bytes = (size_t)b->elems * 4;
	}
	state += p->zero_scratch_bytes + p->widened_bytes;
	for (int b = 0; b < p->nbuckets; b++) /* overlapped gradient buckets keep their own buffers */
		state += p->bucket_bytes[b];
	p->state_bytes = state;
	free(iv);
	free(placed);
	free(conflict);
}
