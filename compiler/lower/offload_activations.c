/* offload_activations.c: `offload activations -> host`, the pass before memplan.
 *
 * A saved activation is a transient buffer that a micro-batch's forward writes and its backward
 * reads; memplan would keep it on the device from one to the other. Here each one gets a pinned
 * host copy (a state buffer of kind "offload staging") and a second device buffer for the
 * backward: the forward copies it to the host right after its last forward access, and the
 * backward copies it back one first access ahead of its own (so the next one travels while this
 * one is in use; buffers one kernel reads first all travel during the access before it). Backward
 * kernels read the second buffer. The device then holds a saved activation only while the forward
 * or the backward works near it, and memplan packs the rest as usual. The copies sit in the forward and backward phase calls themselves, never in the
 * prepare calls, which the walker runs one action early.
 *
 * A pipeline stage holds several micro-batches in flight (memplan.c's slots): each saved buffer's
 * host copy is one per slot, the copies addressing the running action's (a VIEW_SLOT view). On
 * the CUDA target the copies run on the copy stream (streams.c); on the CPU they are memcpy (tests
 * only: the CPU target refuses `-> host` for users, it would free nothing). */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

typedef struct Remap {
	LProg *p;
	int from, to;   /* the saved buffer, its backward copy */
	int *view_of;   /* memo: a view (by index) -> its clone over `to`, where owner[view] == from */
	int *owner;
	int nmemo;
} Remap;

/* b, or its counterpart over the backward copy (views of the saved buffer are cloned) */
static int remap(Remap *m, int b)
{
	LProg *p = m->p;
	if (b == m->from)
		return m->to;
	if (p->buf[b].cls != BUF_VIEW || p->buf[b].view_of < 0)
		return b;
	if (b < m->nmemo && m->owner[b] == m->from)
		return m->view_of[b];
	int base = remap(m, p->buf[b].view_of);
	if (base == p->buf[b].view_of)
		return b;
	Buffer copy = p->buf[b];
	int c = buffer_new(p, BUF_VIEW, copy.dtype, copy.elems, copy.name, copy.what);
	const char *name = p->buf[c].name;
	p->buf[c] = copy;
	p->buf[c].name = name;
	p->buf[c].view_of = base;
	if (b < m->nmemo) {
		m->view_of[b] = c;
		m->owner[b] = m->from;
	}
	return c;
}

static int remap_buffer(void *m, int b)
{
	return remap(m, b);
}

static void remap_kernel(Remap *m, Kernel *k)
{
	kernel_map_buffers(m->p, k, remap_buffer, m);
}

/* a forward copy to the host: its place in the insert list, its position, the buffer */
typedef struct Out {
	int insert, at, buf;
} Out;

static int by_position(const void *a, const void *b)
{
	const Out *x = a, *y = b;
	return x->at != y->at ? x->at - y->at : x->insert - y->insert;
}

static const int *order_first_b; /* by_first_use's key */

static int by_first_use(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return order_first_b[x] != order_first_b[y] ? order_first_b[x] - order_first_b[y] : x - y;
}

/* an offload copy of the whole of src, taken off the program's list for an insert */
static Kernel copy_kernel(LProg *p, Phase ph, int chunk, int dst, int src, const char *note)
{
	kernel_copy(p, ph, chunk, -1, dst, src, p->buf[src].elems, note);
	return p->k[--p->nk];
}

static void offload_prog(LProg *p)
{
	int nb = p->nbuf, nk = p->nk;
	int nslots = memplan_slots(p);
	/* per root buffer: its last forward access, its first backward access (kernel indices), and
	 * whether anything else (another phase, a transfer, a prepare call's backward access) uses it */
	int *last_f = malloc(sizeof(int) * (size_t)nb), *first_b = malloc(sizeof(int) * (size_t)nb);
	bool *other = calloc((size_t)nb, sizeof(bool));
	if (!last_f || !first_b || !other)
		ICE("out of memory");
	for (int b = 0; b < nb; b++)
		last_f[b] = first_b[b] = -1;
	for (int i = 0; i < nk; i++) {
		const Kernel *k = &p->k[i];
		for (int j = 0; j < k->nuses + k->ndefs; j++) {
			int r = buffer_root(p, j < k->nuses ? k->uses[j] : k->defs[j - k->nuses]);
			if (p->buf[r].cls != BUF_ARENA)
				continue;
			if (k->kind == K_SEND_START || k->kind == K_RECV_START)
				other[r] = true;
			if (k->phase == PH_PREPARE_F || k->phase == PH_FORWARD)
				last_f[r] = i;
			else if (k->phase == PH_BACKWARD && first_b[r] < 0)
				first_b[r] = i;
			else if (k->phase != PH_BACKWARD)
				other[r] = true; /* prepare_backward, the step, ... */
		}
	}
	/* the saved buffers in the order the backward first reads them */
	int *saved = malloc(sizeof(int) * (size_t)(nb + 1)), ns = 0;
	if (!saved)
		ICE("out of memory");
	for (int b = 0; b < nb; b++)
		if (first_b[b] >= 0 && last_f[b] >= 0 && !other[b])
			saved[ns++] = b;
	order_first_b = first_b;
	qsort(saved, (size_t)ns, sizeof *saved, by_first_use);
	/* the backward kernels that touch each saved buffer, in order (one walk over the kernels) */
	int *index = malloc(sizeof(int) * (size_t)nb);
	int **uses = calloc((size_t)ns + 1, sizeof(int *)), *nuse = calloc((size_t)ns + 1, sizeof(int)),
	    *capuse = calloc((size_t)ns + 1, sizeof(int));
	if (!index || !uses || !nuse || !capuse)
		ICE("out of memory");
	for (int b = 0; b < nb; b++)
		index[b] = -1;
	for (int s = 0; s < ns; s++)
		index[saved[s]] = s;
	for (int i = 0; i < nk; i++) {
		const Kernel *k = &p->k[i];
		if (k->phase != PH_BACKWARD)
			continue;
		for (int j = 0; j < k->nuses + k->ndefs; j++) {
			int s = index[buffer_root(p, j < k->nuses ? k->uses[j] : k->defs[j - k->nuses])];
			if (s < 0 || (nuse[s] && uses[s][nuse[s] - 1] == i))
				continue;
			if (nuse[s] == capuse[s]) {
				capuse[s] = capuse[s] ? 2 * capuse[s] : 4;
				uses[s] = realloc(uses[s], sizeof(int) * (size_t)capuse[s]);
				if (!uses[s])
					ICE("out of memory");
			}
			uses[s][nuse[s]++] = i;
		}
	}
	int *forward_start = malloc(sizeof(int) * (size_t)(p->nchunks + 1));
	if (!forward_start)
		ICE("out of memory");
	for (int c = 0; c < p->nchunks; c++)
		forward_start[c] = nk;
	for (int i = nk - 1; i >= 0; i--)
		if (p->k[i].phase == PH_FORWARD && p->k[i].chunk >= 0 && p->k[i].chunk < p->nchunks)
			forward_start[p->k[i].chunk] = i;
	Inserts ins = {0};
	Out *fwd = malloc(sizeof(Out) * (size_t)(ns + 1));
	Remap m = {p, -1, -1, malloc(sizeof(int) * (size_t)nb), malloc(sizeof(int) * (size_t)nb), nb};
	if (!fwd || !m.view_of || !m.owner)
		ICE("out of memory");
	for (int b = 0; b < nb; b++)
		m.owner[b] = -1;
	for (int s = 0; s < ns; s++) {
		int r = saved[s];
		Buffer orig = p->buf[r];
		const char *what = orig.what ? orig.what : orig.name;
		/* one copy per micro-batch in flight, at the running action's slot */
		int all = buffer_new(p, BUF_STATE, orig.dtype, orig.elems * nslots, "saved_host",
				     arena_printf(p->g->arena, "saved for the backward, on the host: %s", what));
		p->buf[all].state = SC_OFFLOAD;
		p->buf[all].place = PLACE_HOST;
		int host = all;
		if (nslots > 1) {
			host = buffer_new(p, BUF_VIEW, orig.dtype, orig.elems, "saved_host_slot", p->buf[all].what);
			p->buf[host].view_of = all;
			p->buf[host].view_axis = VIEW_SLOT;
			p->buf[host].view_stride = orig.elems;
		}
		int back = buffer_new(p, BUF_ARENA, orig.dtype, orig.elems, "saved_back", what);
		const char *name = p->buf[back].name;
		p->buf[back] = orig;
		p->buf[back].name = name;
		/* the backward reads the copy */
		m.from = r;
		m.to = back;
		for (int u = 0; u < nuse[s]; u++)
			remap_kernel(&m, &p->k[uses[s][u]]);
		/* to the host after the last forward access, in the forward call itself */
		int at = last_f[r] + 1, chunk = p->k[last_f[r]].chunk;
		if (p->k[last_f[r]].phase != PH_FORWARD) /* only a prepare call touched it: the forward's start */
			at = forward_start[chunk];
		fwd[s] = (Out){ins.n, at, r};
		inserts_add(&ins, copy_kernel(p, PH_FORWARD, chunk, host, r, "a saved activation to the host"), at);
		/* back one first access ahead of its own: at the first access of the saved buffer before it
		 * that a different kernel reads first (one kernel, a fused attention's gradient, may read
		 * several first: their copies must not all land right before it) */
		int t = s - 1;
		while (t >= 0 && first_b[saved[t]] == first_b[r])
			t--;
		int before = t >= 0 ? first_b[saved[t]] : first_b[r];
		inserts_add(&ins, copy_kernel(p, PH_BACKWARD, p->k[first_b[r]].chunk, back, host, "a saved activation back from the host"),
			    before);
	}
	/* a saved buffer stays allocated until the next one goes to the host, so that its copy runs
	 * beside the compute after it rather than before a kernel that would reuse its bytes */
	qsort(fwd, (size_t)ns, sizeof *fwd, by_position);
	for (int s = 0; s + 1 < ns; s++)
		if (ins.k[fwd[s + 1].insert].chunk == ins.k[fwd[s].insert].chunk) /* within one phase call */
			kernel_use(p, &ins.k[fwd[s + 1].insert], fwd[s].buf);
	inserts_apply(p, &ins);
	free(fwd);
	free(m.view_of);
	free(m.owner);
	free(forward_start);
	for (int s = 0; s < ns; s++)
		free(uses[s]);
	free(uses);
	free(nuse);
	free(capuse);
	free(index);
	free(saved);
	free(last_f);
	free(first_b);
	free(other);
}

bool plan_offload_activations(Lowered *low)
{
	if (low->state.offload_activations != PLACE_HOST)
		return true;
	for (int i = 0; i < low->nprogs; i++)
		offload_prog(low->progs[i]);
	return true;
}
