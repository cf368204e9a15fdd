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
	/* persistent state: parameters, gradient accumulators, optimizer moments (ZeRO: this rank's
	 * chunk of each; parameters of ZeRO 1/2 padded to whole chunks), f32 master weights */
	size_t state = 0;
	PlanSpec *ps = g->ps;
	int moments = ps->optimizer == OPT_ADAM || ps->optimizer == OPT_ADAMW ? 2 : ps->optimizer == OPT_MOMENTUM ? 1 : 0;
	bool zero = ps->zero_stage >= 1 && ps->zero_axis >= 0 && ps->axes[ps->zero_axis].size > 1;
	int zn = zero ? ps->axes[ps->zero_axis].size : 1;
	for (int v = 0; v < g->nvals; v++) {
		const Buffer *b = &p->buf[v];
		if (b->cls != BUF_STATE || (b->first < 0 && g->vals[v].role != ROLE_PARAM))
			continue;
		if (g->vals[v].def < 0 || g->ops[g->vals[v].def].stage != p->stage)
			continue;
		size_t bytes = b->bytes;
		if (zero && ps->zero_stage < 3 && g->vals[v].role == ROLE_PARAM && g->ops[g->vals[v].def].kind == OP_PARAM)
			bytes = (size_t)((b->elems + zn - 1) / zn) * (size_t)zn * (size_t)dtype_bytes(b->dtype);
		state += bytes;
	}
	for (int i = 0; i < p->nparams; i++) {
		const Buffer *b = &p->buf[p->params[i]];
		long long elems = 1;
		for (int d = 0; d < g->vals[p->params[i]].rank; d++)
			elems *= b->ldims[d];
		long long owned = zero ? (elems + zn - 1) / zn : elems;
		state += (size_t)owned * 4 * (size_t)moments;
		if (b->dtype != DT_F32)
			state += (size_t)owned * 4; /* f32 master weights (this rank's chunk under ZeRO) */
	}
	long long widest = 0; /* lower precision: one parameter's gradient widened to f32 at a time */
	for (int i = 0; i < p->nparams; i++)
		if (p->buf[p->params[i]].dtype != DT_F32 && p->buf[p->params[i]].elems > widest)
			widest = p->buf[p->params[i]].elems;
	state += (size_t)widest * 4;
	for (int b = 0; b < p->nbuckets; b++) /* overlapped gradient buckets keep their own buffers */
		state += p->bucket_bytes[b];
	p->state_bytes = state;
	free(iv);
	free(placed);
	free(conflict);
}
