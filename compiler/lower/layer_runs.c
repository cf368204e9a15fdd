/* layer_runs.c: the runs of identical layers a program could run as one loop (issue 21, `repeat`
 * as a loop; the first step of docs/ir.md's plan). An analysis of the finished loop-level IR: it
 * changes nothing, and `planc check --dump-after=layers` prints what it finds.
 *
 * Elaboration unrolls `repeat L` (graph.c tags each op with its layer), so every phase of a
 * program holds, for each layer, a block of consecutive kernels from that layer's ops. Two
 * adjacent blocks of one phase are *identical* when their kernels agree pairwise in everything a
 * printer prints (kind, integers, floats, strings, loop shapes and expressions, what goes on the
 * wire) and their buffers correspond one to one: each buffer of the first block stands for one
 * buffer of the second of the same class, dtype and size (the layer's own parameter, gradient,
 * slot or transient), or for itself (shared by every layer). A run is a maximal chain of
 * identical blocks; a loop target prints its body once and indexes per-layer buffer *families*
 * (the chains of corresponding buffers) by the layer. A random stream's key (a dropout's is its
 * op's number), parameter table indexes and message strings may differ by layer: they become
 * per-layer tables too, and are counted, not refused; every other integer must be equal, and
 * corresponding buffers alike.
 *
 * The figure that matters is the kernels a loop target prints: every kernel outside a run, and
 * one body per run. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

typedef struct Matcher {
	const LProg *p;
	int *fwd, *bwd; /* buffer of the earlier block -> of the later, and back; -1 none */
	int *touched, ntouched;
} Matcher;

static int buffer_layer(const LProg *p, int b)
{
	while (b >= 0 && p->buf[b].cls == BUF_VIEW && p->buf[b].value < 0)
		b = p->buf[b].view_of;
	return b >= 0 && p->buf[b].value >= 0 ? p->g->vals[p->buf[b].value].layer : -1;
}

/* The layer a kernel works for: its op's; for the kernels state.c writes (no op: init, the
 * optimizer, checkpoints), the layer of the first parameter or value it names. A pipeline
 * transfer works for none: it sits between two stages, so the stage's first layer (which reads
 * what the recv delivered) and its last (whose output the send takes) are blocks like the rest. */
static int kernel_layer(const LProg *p, const Kernel *k)
{
	if (k->op >= 0 && (p->g->ops[k->op].kind == OP_SEND || p->g->ops[k->op].kind == OP_RECV))
		return -1;
	if (k->op >= 0)
		return p->g->ops[k->op].layer;
	for (int i = 0; i < k->nargs; i++) {
		const KArg *a = &k->args[i];
		int l = a->kind == KA_BUF || a->kind == KA_SCALAR || a->kind == KA_OFFSET ? buffer_layer(p, a->buf)
			: a->kind == KA_BUFS && a->n > 0			     ? buffer_layer(p, a->bufs[0])
			: a->kind == KA_PARAM && a->i >= 0 && a->i < p->low->nparams
				? p->g->vals[p->low->params[a->i].value].layer
				: -1;
		if (l >= 0)
			return l;
	}
	return -1;
}

/* Buffers of two layers correspond only within one class, except that a transient value may lie in
 * the arena, an activation slot or an inbox: a stage's first layer reads its input from the inbox
 * the pipeline received it into, the next layers from the slot the layer before wrote. The
 * targets take each layer's address from its own buffer (layer_values.c: a per-layer table where
 * the places do not step evenly), so the loop's kernels read what the unrolled ones read. */
static bool same_class(BufClass a, BufClass b)
{
	return a == b || (buf_class_transient(a) && buf_class_transient(b));
}

/* a and b (a buffer of the earlier block, of the later) correspond: consistently, and alike */
static bool same_buffer(Matcher *m, int a, int b)
{
	if (a < 0 || b < 0)
		return a == b;
	if (m->fwd[a] >= 0 || m->bwd[b] >= 0)
		return m->fwd[a] == b && m->bwd[b] == a;
	const Buffer *x = &m->p->buf[a], *y = &m->p->buf[b];
	if (!same_class(x->cls, y->cls) || x->dtype != y->dtype || x->elems != y->elems || x->state != y->state)
		return false;
	/* views: of corresponding buffers, at any offset (each layer's gradient is its own place in
	 * one flat bucket: the family is a table of pointers) */
	if (x->cls == BUF_VIEW && (x->view_axis != y->view_axis || x->view_stride != y->view_stride ||
				   !same_buffer(m, x->view_of, y->view_of)))
		return false;
	m->fwd[a] = b;
	m->bwd[b] = a;
	m->touched[m->ntouched++] = a;
	m->touched[m->ntouched++] = b;
	return true;
}

static bool same_expr(Matcher *m, const LExpr *a, const LExpr *b, int rank)
{
	if (!a || !b)
		return a == b;
	if (a->kind != b->kind || a->op != b->op || a->f != b->f || (a->s != b->s && (!a->s || !b->s || strcmp(a->s, b->s))))
		return false;
	if (a->kind == LX_LOAD)
		return same_buffer(m, a->buf, b->buf) && !memcmp(a->stride, b->stride, sizeof(long long) * (size_t)rank);
	return same_expr(m, a->a, b->a, rank) && same_expr(m, a->b, b->b, rank);
}

static bool same_arg(Matcher *m, const KArg *a, const KArg *b, const char *param, int *differ)
{
	if (a->kind != b->kind || a->f != b->f || a->axis != b->axis || a->stride != b->stride || a->dim != b->dim ||
	    a->n != b->n || a->i32 != b->i32)
		return false;
	switch (a->kind) {
	case KA_BUF:
	case KA_OFFSET:
	case KA_SCALAR:
		return same_buffer(m, a->buf, b->buf) && a->i == b->i;
	case KA_BUFS:
		for (int i = 0; i < a->n; i++)
			if (!same_buffer(m, a->bufs[i], b->bufs[i]))
				return false;
		return true;
	case KA_INTS:
		return !a->n || !memcmp(a->ints, b->ints, sizeof(long long) * (size_t)a->n);
	case KA_PARAM: /* the layer's entry of the parameter table: a per-layer table */
		*differ += a->i != b->i;
		return true;
	case KA_STR: /* a message naming the layer's tensor: a per-layer table */
		*differ += (a->str != b->str) && (!a->str || !b->str || strcmp(a->str, b->str));
		return true;
	case KA_INT: /* a random stream's key (its op's number): a per-layer table; any other integer equal */
		if (a->i == b->i)
			return true;
		*differ += param && !strcmp(param, "key");
		return param && !strcmp(param, "key");
	default:
		return a->i == b->i;
	}
}

static bool same_comm(const Comm *a, const Comm *b)
{
	return a->coll == b->coll && a->axis == b->axis && a->pair == b->pair && a->peer == b->peer &&
	       a->channel == b->channel && a->elems == b->elems && a->dtype == b->dtype && a->every == b->every &&
	       a->bound == b->bound;
}

static bool same_kernel(Matcher *m, const Kernel *a, const Kernel *b, int *differ)
{
	if (a->kind != b->kind || a->phase != b->phase || a->chunk != b->chunk || a->only_last_micro != b->only_last_micro ||
	    a->nargs != b->nargs || a->ncomm != b->ncomm || a->accumulate != b->accumulate || a->rank != b->rank ||
	    a->nfused != b->nfused || a->stream != b->stream)
		return false;
	if (a->kind == K_LOOP && (memcmp(a->dims, b->dims, sizeof(long long) * (size_t)a->rank) ||
				  !same_buffer(m, a->out, b->out) || !same_expr(m, a->expr, b->expr, a->rank)))
		return false;
	for (int i = 0; i < a->nargs; i++) {
		const char *param = i < kernel_nparams[a->kind] ? kernel_params[a->kind][i].name : NULL;
		if (!same_arg(m, &a->args[i], &b->args[i], param, differ))
			return false;
	}
	for (int i = 0; i < a->ncomm; i++)
		if (!same_comm(&a->comm[i], &b->comm[i]))
			return false;
	return true;
}

/* the blocks of n kernels from seq[a] and from seq[b] are identical up to a renaming of buffers */
static bool same_block(Matcher *m, const int *seq, int a, int b, int n, int *differ)
{
	bool same = true;
	for (int i = 0; same && i < n; i++)
		same = same_kernel(m, &m->p->k[seq[a + i]], &m->p->k[seq[b + i]], differ);
	for (int i = 0; i < m->ntouched; i++)
		m->fwd[m->touched[i]] = m->bwd[m->touched[i]] = -1;
	m->ntouched = 0;
	return same;
}

/* the end of the layer block that starts at seq[i]: the same chunk and layer */
static int block_end(const LProg *p, const int *seq, int n, int i)
{
	const Kernel *k = &p->k[seq[i]];
	int layer = kernel_layer(p, k), j = i + 1;
	while (j < n && p->k[seq[j]].chunk == k->chunk && kernel_layer(p, &p->k[seq[j]]) == layer)
		j++;
	return j;
}

/* The runs in one phase's kernels seq[0 .. n), in order, appended to runs. */
static int phase_runs(Matcher *m, const int *seq, int n, LayerRun *runs, int nruns, int cap)
{
	const LProg *p = m->p;
	for (int i = 0; i < n;) {
		int end = block_end(p, seq, n, i), layer = kernel_layer(p, &p->k[seq[i]]);
		if (layer < 0) {
			i = end;
			continue;
		}
		LayerRun r = {.phase = p->k[seq[i]].phase, .chunk = p->k[seq[i]].chunk, .first = seq[i], .body = end - i,
			      .first_layer = layer, .nlayers = 1};
		int step = 0, at = end;
		while (at < n) {
			int next = block_end(p, seq, n, at), l = kernel_layer(p, &p->k[seq[at]]);
			int d = l - (r.first_layer + (r.nlayers - 1) * step);
			if (l < 0 || next - at != r.body || (d != 1 && d != -1) || (step && d != step) ||
			    !same_block(m, seq, at - r.body, at, r.body, &r.tables))
				break;
			step = d;
			r.nlayers++;
			at = next;
		}
		r.step = step ? step : 1;
		if (r.nlayers > 1 && nruns < cap)
			runs[nruns] = r;
		nruns += r.nlayers > 1;
		i = r.nlayers > 1 ? at : end;
	}
	return nruns;
}

int layer_runs(const LProg *p, LayerRun *runs, int cap)
{
	Matcher m = {.p = p};
	size_t n = (size_t)p->nbuf + 1;
	m.fwd = malloc(sizeof(int) * n);
	m.bwd = malloc(sizeof(int) * n);
	m.touched = malloc(sizeof(int) * 2 * n);
	int *seq = malloc(sizeof(int) * ((size_t)p->nk + 1));
	if (!m.fwd || !m.bwd || !m.touched || !seq)
		ICE("out of memory");
	for (size_t b = 0; b < n; b++)
		m.fwd[b] = m.bwd[b] = -1;
	int nruns = 0;
	for (int ph = 0; ph < PH_COUNT; ph++) { /* a phase is printed as its own function(s) */
		int nseq = 0;
		for (int i = 0; i < p->nk; i++)
			if (p->k[i].phase == (Phase)ph)
				seq[nseq++] = i;
		nruns = phase_runs(&m, seq, nseq, runs, nruns, cap);
	}
	free(m.fwd);
	free(m.bwd);
	free(m.touched);
	free(seq);
	return nruns;
}

int *layer_run_kernels(const LProg *p, const LayerRun *r, Arena *a)
{
	int n = r->body * r->nlayers, m = 0;
	int *ks = arena_alloc(a, sizeof(int) * (size_t)n);
	for (int i = r->first; i < p->nk && m < n; i++)
		if (p->k[i].phase == r->phase)
			ks[m++] = i;
	if (m != n)
		ICE("a run of layers has %d kernels of %d", m, n);
	return ks;
}

void layer_runs_dump(FILE *out, const Lowered *low)
{
	long long total = 0, folded = 0;
	fprintf(out, "# runs of identical layers (a loop target prints each body once)\n");
	for (int pi = 0; pi < low->nprogs; pi++) {
		const LProg *p = low->progs[pi];
		int cap = p->nk + 1;
		LayerRun *runs = malloc(sizeof(LayerRun) * (size_t)cap);
		if (!runs)
			ICE("out of memory");
		int n = layer_runs(p, runs, cap);
		long long saved = 0;
		fprintf(out, "program stage %d role %d: %d kernels\n", p->stage, p->role, p->nk);
		for (int i = 0; i < n; i++) {
			const LayerRun *r = &runs[i];
			fprintf(out, "  %s chunk %d: layers %d..%d (%d x %d kernels from kernel %d)", phase_names[r->phase],
				r->chunk, r->first_layer, r->first_layer + (r->nlayers - 1) * r->step, r->nlayers, r->body,
				r->first);
			if (r->tables)
				fprintf(out, ", %d per-layer table entries", r->tables);
			fprintf(out, "\n");
			saved += (long long)(r->nlayers - 1) * r->body;
		}
		fprintf(out, "  as loops: %lld kernels printed of %d\n", p->nk - saved, p->nk);
		total += p->nk;
		folded += p->nk - saved;
		free(runs);
	}
	fprintf(out, "all programs: %lld kernels, %lld as loops\n", total, folded);
}
