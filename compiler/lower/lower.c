/* lower.c: from the sharded, scheduled graph to the loop-level IR, one program per pipeline stage
 * and rank role.
 *
 * Every graph value becomes a buffer of the program that defines it (over its *local* shape,
 * this rank's block) and every op of the stage becomes kernels in a phase and a model chunk:
 *   - matmuls, row-wise ops (softmax, norms), embedding, cross-entropy, dropout: calls into the
 *     planrt kernels; a transposed operand folds into the gemm's transpose flag;
 *   - element-wise ops become loop nests, and a chain of them whose intermediates have one
 *     consumer and are not kept for the backward is fused into one loop (one pass over memory);
 *   - layout conversions become collectives on the communicator of their mesh axis (packing for
 *     dims that are not outermost happens inside the runtime's *_dim helpers);
 *   - pipeline transfers become nonblocking sends, and receives posted one action ahead (in the
 *     chunk's prepare phase) and completed where the value is first needed;
 *   - inputs are loaded by a kernel at the start of the forward that reads them, and the loss is
 *     added into the stage's loss metric after each micro-batch;
 *   - a compute kernel whose operands are stored in bf16 computes on f32 copies made by explicit
 *     cast kernels around it (bf16 storage, f32 compute, as CPU autocast does).
 * What lowering leaves to state.c: the optimizer steps, gradient buckets, tied-parameter
 * reductions and the ZeRO gathers after the update, which depend on how state is laid out.
 * An op the C target has no kernel for (MoE routing, async transfers) becomes an opaque kernel,
 * so that the program stays complete for the collective check and explain; planc build refuses
 * it by name.
 *
 * This file also holds the helpers every back-end pass uses to make kernels and buffers. */
#include "lower/lower.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

const char *const phase_names[PH_COUNT] = {"init", "step_begin", "prepare_forward", "forward", "prepare_backward",
					   "backward", "step", "save", "checkpoint", "resume", "eval_begin", "eval_end"};
const char *const state_kind_names[SC_COUNT] = {"parameters", "gradients", "optimizer states", "master weights",
						"runtime buffers", "metrics", "offload staging"};

/* ------------------------------------------------------------------ helpers for every pass */

/* Grows an arena array of elem-sized items so that index n fits. */
static void *grow(Arena *a, void *old, int n, int *cap, size_t elem)
{
	if (n < *cap)
		return old;
	int nc = *cap ? *cap * 2 : 8;
	while (nc <= n)
		nc *= 2;
	void *fresh = arena_alloc(a, elem * (size_t)nc);
	if (*cap)
		memcpy(fresh, old, elem * (size_t)*cap);
	*cap = nc;
	return fresh;
}

/* An offload copy of src's n elements into dst (between host and device memory), appended. */
Kernel *kernel_copy(LProg *p, Phase ph, int chunk, int op, int dst, int src, long long n, const char *note)
{
	Kernel *k = kernel_new(p, K_OFFLOAD_COPY, ph, chunk, op);
	k->note = note;
	karg_buf(p, k, dst, false, true);
	karg_buf(p, k, src, true, false);
	karg_int(p, k, n * dtype_bytes(p->buf[src].dtype));
	return k;
}

/* Grows a program's kernel or buffer array (a heap array the arena owns, arena_own) so that index
 * n fits: realloc moves it without leaving a copy behind. */
static void *grow_heap(void *old, int n, int *cap, size_t elem)
{
	if (n < *cap)
		return old;
	int nc = *cap ? *cap * 2 : 64;
	while (nc <= n)
		nc *= 2;
	void *fresh = realloc(old, elem * (size_t)nc);
	if (!fresh)
		ICE("out of memory");
	*cap = nc;
	return fresh;
}

Kernel *kernel_new(LProg *p, KernelKind kind, Phase ph, int chunk, int op)
{
	p->k = grow_heap(p->k, p->nk, &p->capk, sizeof(Kernel));
	Kernel *k = &p->k[p->nk++];
	memset(k, 0, sizeof *k);
	k->kind = kind;
	k->phase = ph;
	k->chunk = chunk;
	k->op = op;
	k->out = -1;
	k->bucket = -1;
	return k;
}

/* A C identifier: lead, then s with every character but letters and digits made '_' (and "t"
 * before it when it starts with a digit; "t" for no s), then "_index" when index >= 0. Built
 * without printf: a 1T-parameter plan names a hundred thousand buffers. */
static char *identifier(Arena *a, const char *lead, const char *s, long long index)
{
	if (!s || !*s)
		s = "t";
	char digits[24], rev[24];
	int nd = 0, nr = 0;
	if (index >= 0) {
		do
			rev[nr++] = (char)('0' + index % 10);
		while ((index /= 10) > 0);
		digits[nd++] = '_';
		while (nr)
			digits[nd++] = rev[--nr];
	}
	size_t nl = strlen(lead), ns = strlen(s);
	int t = isdigit((unsigned char)s[0]) ? 1 : 0;
	char *id = arena_alloc(a, nl + (size_t)t + ns + (size_t)nd + 1), *q = id;
	memcpy(q, lead, nl);
	q += nl;
	if (t)
		*q++ = 't';
	for (size_t i = 0; i < ns; i++)
		*q++ = isalnum((unsigned char)s[i]) ? s[i] : '_';
	memcpy(q, digits, (size_t)nd);
	q[nd] = 0;
	return id;
}

int buffer_new(LProg *p, BufClass cls, DType t, long long elems, const char *name, const char *what)
{
	p->buf = grow_heap(p->buf, p->nbuf, &p->capbuf, sizeof(Buffer));
	int i = p->nbuf++;
	Buffer *b = &p->buf[i];
	memset(b, 0, sizeof *b);
	b->name = identifier(p->g->arena, "", name, (long long)i + p->name_base);
	b->what = what;
	b->cls = cls;
	b->dtype = t;
	b->elems = elems;
	b->bytes = (size_t)elems * (size_t)dtype_bytes(t);
	b->value = -1;
	b->view_of = -1;
	b->view_axis = -1;
	b->rank = 1;
	b->ldims[0] = elems;
	for (int d = 0; d < MAX_DIMS; d++)
		b->split_axis[d] = b->split_outer[d] = -1;
	b->micro_dim = -1;
	b->first = b->last = -1;
	b->chunk = 0;
	return i;
}

static KArg blank_arg(KArgKind kind)
{
	KArg a;
	memset(&a, 0, sizeof a);
	a.kind = kind;
	a.buf = -1;
	a.axis = -1;
	return a;
}

/* Appends a as the kernel's next argument: the builders fill the parameters of the kind's table
 * row in order, and an argument that does not fit its parameter (karg_fits), or a buffer written
 * through a read-only parameter, is a bug in the pass that builds it. */
static KArg *push_arg(LProg *p, Kernel *k, const KArg *a, bool writes)
{
	int i = k->nargs;
	if (!karg_fits(k->kind, i, a))
		ICE("a '%s' kernel's argument %d (%s) cannot take a %s", kernel_names[k->kind], i,
		    i < kernel_nparams[k->kind] ? kernel_params[k->kind][i].name : "none: too many", karg_kind_name(a->kind));
	if (writes && kernel_nparams[k->kind] >= 0) {
		KParamType t = kernel_params[k->kind][i].type;
		if (t == KPT_F32_IN || t == KPT_I32_IN || t == KPT_F64_IN || t == KPT_BF16_IN || t == KPT_F16_IN ||
		    t == KPT_IN)
			ICE("a '%s' kernel writes its read-only argument '%s'", kernel_names[k->kind],
			    kernel_params[k->kind][i].name);
	}
	/* a kernel's arguments start as many as the program's kernels of its kind have had at most (then
	 * double): most kernels get theirs in one array of the right size */
	if (!k->capargs && k->nargs == 0 && p->arg_hint[k->kind] > 0) {
		k->capargs = p->arg_hint[k->kind];
		k->args = arena_alloc(p->g->arena, sizeof(KArg) * (size_t)k->capargs);
	}
	k->args = grow(p->g->arena, k->args, k->nargs, &k->capargs, sizeof(KArg));
	if (k->nargs + 1 > p->arg_hint[k->kind])
		p->arg_hint[k->kind] = k->nargs + 1;
	k->args[k->nargs] = *a;
	return &k->args[k->nargs++];
}

void kernel_use(LProg *p, Kernel *k, int b)
{
	internal_assert(b >= 0 && b < p->nbuf);
	k->uses = grow(p->g->arena, k->uses, k->nuses, &k->capuses, sizeof(int));
	k->uses[k->nuses++] = b;
}

void kernel_def(LProg *p, Kernel *k, int b)
{
	internal_assert(b >= 0 && b < p->nbuf);
	k->defs = grow(p->g->arena, k->defs, k->ndefs, &k->capdefs, sizeof(int));
	k->defs[k->ndefs++] = b;
}

void karg_buf(LProg *p, Kernel *k, int b, bool reads, bool writes)
{
	KArg a = blank_arg(KA_BUF);
	a.buf = b;
	push_arg(p, k, &a, writes);
	if (reads)
		kernel_use(p, k, b);
	if (writes)
		kernel_def(p, k, b);
}

void karg_int(LProg *p, Kernel *k, long long i)
{
	KArg a = blank_arg(KA_INT);
	a.i = i;
	push_arg(p, k, &a, false);
}

void karg_f64(LProg *p, Kernel *k, double f)
{
	KArg a = blank_arg(KA_F64);
	a.f = f;
	push_arg(p, k, &a, false);
}

void karg(LProg *p, Kernel *k, KArgKind kind, long long i)
{
	KArg a = blank_arg(kind);
	a.i = i;
	push_arg(p, k, &a, false);
}

void karg_ints(LProg *p, Kernel *k, const long long *v, int n, bool i32)
{
	long long *copy = arena_alloc(p->g->arena, sizeof(long long) * (size_t)(n ? n : 1));
	if (n)
		memcpy(copy, v, sizeof(long long) * (size_t)n);
	KArg a = blank_arg(KA_INTS);
	a.ints = copy;
	a.n = n;
	a.i32 = i32;
	push_arg(p, k, &a, false);
}

void karg_bufs(LProg *p, Kernel *k, const int *bufs, int n, bool reads, bool writes)
{
	int *copy = arena_alloc(p->g->arena, sizeof(int) * (size_t)(n ? n : 1));
	if (n)
		memcpy(copy, bufs, sizeof(int) * (size_t)n);
	KArg a = blank_arg(KA_BUFS);
	a.bufs = copy;
	a.n = n;
	push_arg(p, k, &a, writes);
	for (int i = 0; i < n; i++) {
		if (reads)
			kernel_use(p, k, bufs[i]);
		if (writes)
			kernel_def(p, k, bufs[i]);
	}
}

void karg_coord(LProg *p, Kernel *k, long long base, int axis, long long stride)
{
	KArg a = blank_arg(KA_COORD);
	a.i = base;
	a.axis = axis;
	a.stride = stride;
	push_arg(p, k, &a, false);
}

void karg_copy(LProg *p, Kernel *k, const KArg *a)
{
	internal_assert(a->kind != KA_BUF && a->kind != KA_BUFS && a->kind != KA_SCALAR);
	push_arg(p, k, a, false);
}

bool block_mirrored(const Lowered *low, const Buffer *b, int d)
{
	return low->g->ring_mirrored && d >= 0 && d < b->rank && b->split_axis[d] >= 0 &&
	       b->split_axis[d] == low->ps->ring_axis && b->split_outer[d] < 0 && b->micro_dim != d;
}

static void karg_offset(LProg *p, Kernel *k, int b, int dim)
{
	KArg a = blank_arg(KA_OFFSET);
	a.buf = b;
	a.dim = dim;
	push_arg(p, k, &a, false);
}

/* where the second half of buffer b's block on dim starts (a block offset list's entry rank + dim) */
static void karg_second_half(LProg *p, Kernel *k, int b, int dim)
{
	KArg a = blank_arg(KA_OFFSET);
	a.buf = b;
	a.dim = dim;
	a.i = 1;
	push_arg(p, k, &a, false);
}

static void karg_str(LProg *p, Kernel *k, const char *str)
{
	KArg a = blank_arg(KA_STR);
	a.str = str;
	push_arg(p, k, &a, false);
}

static void karg_scalar(LProg *p, Kernel *k, int b, double f)
{
	KArg a = blank_arg(KA_SCALAR);
	a.buf = b;
	a.f = f;
	push_arg(p, k, &a, false);
	kernel_use(p, k, b);
}

Comm *kernel_comm(LProg *p, Kernel *k)
{
	if (k->ncomm >= k->capcomm) /* no room, or an array shared with a copied kernel: grow apart */
		k->capcomm = k->ncomm;
	k->comm = grow(p->g->arena, k->comm, k->ncomm, &k->capcomm, sizeof(Comm));
	Comm *n = &k->comm[k->ncomm++];
	memset(n, 0, sizeof *n);
	n->axis = -1;
	n->pair = -1;
	n->peer = -1;
	n->op = -1;
	return n;
}

int handle_new(LProg *p, HandleType t, const char *name)
{
	p->handles = grow(p->g->arena, p->handles, p->nhandles, &p->caphandles, sizeof(Handle));
	p->handles[p->nhandles].type = t;
	p->handles[p->nhandles].name = arena_printf(p->g->arena, "%s_%d", name, p->nhandles);
	return p->nhandles++;
}

int buffer_root(const LProg *p, int b)
{
	while (p->buf[b].cls == BUF_VIEW && p->buf[b].view_of >= 0)
		b = p->buf[b].view_of;
	return b;
}

void inserts_add(Inserts *ins, Kernel k, int before)
{
	if (ins->n == ins->cap) {
		ins->cap = ins->cap ? ins->cap * 2 : 64;
		ins->k = realloc(ins->k, sizeof(Kernel) * (size_t)ins->cap);
		ins->before = realloc(ins->before, sizeof(int) * (size_t)ins->cap);
		if (!ins->k || !ins->before)
			ICE("out of memory");
	}
	ins->k[ins->n] = k;
	ins->before[ins->n++] = before;
}

void inserts_apply(LProg *p, Inserts *ins)
{
	kernels_insert(p, ins->k, ins->before, ins->n);
	free(ins->k);
	free(ins->before);
	memset(ins, 0, sizeof *ins);
}

void kernels_insert(LProg *p, Kernel *new_k, const int *before, int n)
{
	if (n == 0)
		return;
	/* a stable counting sort by insertion point, then one merge: n + nk, whatever the order of
	 * the inserts (a pass may add one after every matmul for every bucket it starts) */
	int *first = calloc((size_t)p->nk + 2, sizeof(int)), *order = malloc(sizeof(int) * (size_t)n);
	if (!first || !order)
		ICE("out of memory");
	for (int i = 0; i < n; i++) {
		internal_assert(before[i] >= 0 && before[i] <= p->nk);
		first[before[i] + 1]++;
	}
	for (int i = 0; i <= p->nk; i++)
		first[i + 1] += first[i];
	for (int i = 0; i < n; i++)
		order[first[before[i]]++] = i; /* first[b] ends as the start of b + 1's inserts */
	int total = p->nk + n;
	if (total > p->capk) { /* room to spare: a pass that appends and takes back a kernel copies nothing */
		int cap = total + total / 4 + 16;
		p->k = realloc(p->k, sizeof(Kernel) * (size_t)cap);
		if (!p->k)
			ICE("out of memory");
		p->capk = cap;
	}
	/* merged in place from the back: old kernel i moves to a position at or after i */
	int at = total, next = n - 1;
	for (int i = p->nk; i >= 0; i--) {
		if (i < p->nk)
			p->k[--at] = p->k[i];
		while (next >= 0 && before[order[next]] == i)
			p->k[--at] = new_k[order[next--]];
	}
	internal_assert(at == 0 && next == -1);
	free(order);
	free(first);
	p->nk = total;
}

/* ------------------------------------------------------------------ the lowering state */

typedef struct Lower {
	LProg *p;
	Graph *g;
	const int *ops;   /* the ops on this program's stage (lowered_stage_ops), in order */
	int nops;
	int *consumers;   /* per value: number of ops (on this stage) reading it */
	bool *kept;       /* per value: read by a backward op while produced in the forward */
	bool *skip;       /* per op: fused into another kernel */
	bool *materialise; /* per op: a transpose read by something other than a matmul */
	int *chunk;       /* per op: its model chunk (-1 before it is known; the same on every program) */
	int first_layer_op;
	int moe_stats;    /* the step's routing metrics (lower_moe), or -1 */
	int *moe_idx;     /* per value: a dropless MoE layer's dispatched buffer (or a value like it on the
			   * way to moe_combine, or its gradient): the layer's idx as the dispatch read it; else -1 */
} Lower;

static long long ldim(const Graph *g, int v, int d)
{
	const Value *val = &g->vals[v];
	long long n = val->dim[d];
	for (int a = 0; a < g->ps->naxes; a++)
		if (val->lay.on[a] == d)
			n /= g->ps->axes[a].size;
	return n;
}

/* Elements of v's local block. A gradient that ZeRO marks flat on its axis is still whole here:
 * it is reduce-scattered into a shard by state.c; only parameters are stored as ZeRO chunks. */
static long long lelems(const Graph *g, int v)
{
	long long n = 1;
	for (int d = 0; d < g->vals[v].rank; d++)
		n *= ldim(g, v, d);
	return n;
}

static Phase phase_of(const Op *op)
{
	return op->per_step ? PH_STEP : op->backward ? PH_BACKWARD : PH_FORWARD;
}

/* The model chunk an op belongs to: its layer's chunk; backward ops follow the forward op they
 * differentiate; ops outside the layers go to the first chunk before the layers and to the last
 * after them. A transfer carries the layer of the value it moves, which is the producer's: that
 * is right for the producer's side (the forward send, the backward receive of the gradient) but
 * not for the consumer's, so a forward receive takes the chunk of its first consumer and the
 * backward send of the gradient follows that receive (the interleaved schedule's wrap-around
 * transfers connect different chunks). */
static int chunk_of(Lower *L, int i)
{
	Graph *g = L->g;
	if (L->chunk[i] >= 0)
		return L->chunk[i];
	const Op *op = &g->ops[i];
	int c;
	if (op->kind == OP_RECV && !op->backward) {
		c = -1;
		for (int j = i + 1; j < g->nops && c < 0; j++) {
			const Op *u = &g->ops[j];
			if (u->stage != op->stage)
				continue;
			for (int k = 0; k < u->nin; k++)
				if (u->in[k] == op->out[0])
					c = chunk_of(L, j);
		}
		if (c < 0)
			c = 0;
	} else if (op->kind == OP_SEND && op->backward && op->fwd_op >= 0 && op->fwd_op != i) {
		c = chunk_of(L, op->fwd_op);
	} else if (op->layer >= 0 && g->layer_chunk) {
		c = g->layer_chunk[op->layer];
	} else if (op->fwd_op >= 0 && op->fwd_op != i) {
		c = chunk_of(L, op->fwd_op);
	} else {
		c = i < L->first_layer_op ? 0 : L->p->nchunks - 1;
	}
	L->chunk[i] = c;
	return c;
}

/* The storage a value's reads go through: a transpose view reads its source. */
static int storage(const Graph *g, int v, int *transposed)
{
	int t = 0;
	for (;;) {
		int d = g->vals[v].def;
		if (d < 0 || g->ops[d].kind != OP_TRANSPOSE)
			break;
		v = g->ops[d].in[0];
		t ^= 1;
	}
	if (transposed)
		*transposed = t;
	return v;
}

static Kernel *call(Lower *L, KernelKind kind, int oi)
{
	const Op *op = &L->g->ops[oi];
	Kernel *k = kernel_new(L->p, kind, phase_of(op), chunk_of(L, oi), oi);
	if (op->scope && *op->scope) { /* "OP in SCOPE" */
		const char *name = op_names[op->kind];
		size_t n = strlen(name), m = strlen(op->scope);
		char *note = arena_alloc(L->g->arena, n + m + 5);
		memcpy(note, name, n);
		memcpy(note + n, " in ", 4);
		memcpy(note + n + 4, op->scope, m + 1);
		k->note = note;
	} else {
		k->note = op_names[op->kind];
	}
	return k;
}

static void arg_value(Lower *L, Kernel *k, int v, bool reads, bool writes)
{
	karg_buf(L->p, k, v, reads, writes);
}

/* A scratch buffer in the transient region for one kernel. */
static void arg_scratch(Lower *L, Kernel *k, size_t bytes)
{
	int b = buffer_new(L->p, BUF_ARENA, DT_U8, (long long)(bytes ? bytes : 1), "scratch", "a kernel's scratch");
	karg_buf(L->p, k, b, false, true);
}

static void arg_dims(Lower *L, Kernel *k, int v)
{
	long long dims[MAX_DIMS];
	for (int d = 0; d < L->g->vals[v].rank; d++)
		dims[d] = ldim(L->g, v, d);
	karg_ints(L->p, k, dims, L->g->vals[v].rank, false);
}

/* ------------------------------------------------------------------ matmuls and views */

static void lower_matmul(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int ta, tb;
	int a = storage(g, op->in[0], &ta), b = storage(g, op->in[1], &tb);
	int out = op->out[0];
	const Value *vo = &g->vals[out];
	const Value *va = &g->vals[op->in[0]], *vb = &g->vals[op->in[1]];
	int r = vo->rank;
	long long M = ldim(g, op->in[0], va->rank - 2), K = ldim(g, op->in[0], va->rank - 1);
	long long N = ldim(g, op->in[1], vb->rank - 1);
	long long batch = 1;
	for (int d = 0; d < r - 2; d++)
		batch *= ldim(g, out, d);
	bool b_batched = vb->rank > 2;
	long long stride_a = M * K, stride_b = b_batched ? K * N : 0, stride_c = M * N;
	if (!b_batched && !ta) { /* one gemm over every leading dim */
		M *= batch;
		batch = 1;
	}
	LProg *p = L->p;
	Kernel *k = call(L, K_MATMUL, oi);
	karg_int(p, k, batch);
	karg_int(p, k, M);
	karg_int(p, k, N);
	karg_int(p, k, K);
	arg_value(L, k, a, true, false);
	karg_int(p, k, ta);
	karg_int(p, k, stride_a);
	arg_value(L, k, b, true, false);
	karg_int(p, k, tb);
	karg_int(p, k, stride_b);
	bool acc = g->vals[out].grad_of >= 0; /* parameter gradients accumulate over micro-batches */
	arg_value(L, k, out, acc, true);
	karg_int(p, k, stride_c);
	karg_int(p, k, acc);
}

/* The contiguous element strides of v's local block over its first n dims (the dims after them
 * are one block each). */
static void block_strides(const Graph *g, int v, long long *stride)
{
	long long s = 1;
	for (int d = g->vals[v].rank - 1; d >= 0; d--) {
		stride[d] = s;
		s *= ldim(g, v, d);
	}
}

/* A matmul through planrt_k_bmm: the iteration runs the batch dims of the operands and the output
 * broadcast together (right aligned); an operand, or the output, that is shorter or has size 1
 * along one gets stride 0 there: read once for all, or summed into (the gradient of an operand
 * that was broadcast). wgrad: out [K, N] = the sum over every leading dim of a^T dy (the weight
 * gradient, here for a transposed activation). */
static void lower_bmm(Lower *L, const Op *op, int oi, bool wgrad)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int ta, tb;
	int a = storage(g, op->in[0], &ta), b = storage(g, op->in[1], &tb);
	int la = op->in[0], lb = op->in[1], out = op->out[0];
	int ra = g->vals[la].rank, rb = g->vals[lb].rank, ro = g->vals[out].rank;
	long long sa[MAX_DIMS], sb[MAX_DIMS], so[MAX_DIMS];
	block_strides(g, la, sa);
	block_strides(g, lb, sb);
	block_strides(g, out, so);
	long long M, N, K;
	int nb, trans_a, trans_b;
	long long dims[MAX_DIMS], astr[MAX_DIMS], bstr[MAX_DIMS], cstr[MAX_DIMS];
	if (wgrad) { /* a [.., M, K], dy [.., M, N]: batches over a's leading dims, C summed over all */
		nb = ra - 2;
		M = ldim(g, la, ra - 1);
		K = ldim(g, la, ra - 2);
		N = ldim(g, lb, rb - 1);
		trans_a = !ta;
		trans_b = tb;
		for (int j = 0; j < nb; j++) {
			dims[j] = ldim(g, la, j);
			astr[j] = sa[j];
			bstr[j] = sb[j];
			cstr[j] = 0;
		}
	} else {
		int nr = ra > rb ? ra : rb;
		if (ro > nr)
			nr = ro;
		nb = nr - 2;
		M = ldim(g, la, ra - 2);
		K = ldim(g, la, ra - 1);
		N = ldim(g, lb, rb - 1);
		trans_a = ta;
		trans_b = tb;
		for (int j = 0; j < nb; j++) {
			int da = j - (nr - ra), db = j - (nr - rb), dc = j - (nr - ro);
			long long n = 1;
			if (da >= 0 && ldim(g, la, da) > n)
				n = ldim(g, la, da);
			if (db >= 0 && ldim(g, lb, db) > n)
				n = ldim(g, lb, db);
			if (dc >= 0 && ldim(g, out, dc) > n)
				n = ldim(g, out, dc);
			dims[j] = n;
			astr[j] = da >= 0 && ldim(g, la, da) == n ? sa[da] : 0;
			bstr[j] = db >= 0 && ldim(g, lb, db) == n ? sb[db] : 0;
			cstr[j] = dc >= 0 && ldim(g, out, dc) == n ? so[dc] : 0;
		}
	}
	if (nb == 0) { /* one product: a batch of one (no empty arrays in the C) */
		nb = 1;
		dims[0] = 1;
		astr[0] = bstr[0] = cstr[0] = 0;
	}
	Kernel *k = call(L, K_BMM, oi);
	karg_int(p, k, nb);
	karg_ints(p, k, dims, nb, false);
	karg_int(p, k, M);
	karg_int(p, k, N);
	karg_int(p, k, K);
	arg_value(L, k, a, true, false);
	karg_int(p, k, trans_a);
	karg_ints(p, k, astr, nb, false);
	arg_value(L, k, b, true, false);
	karg_int(p, k, trans_b);
	karg_ints(p, k, bstr, nb, false);
	bool acc = g->vals[out].grad_of >= 0; /* parameter gradients accumulate over micro-batches */
	arg_value(L, k, out, acc, true);
	karg_ints(p, k, cstr, nb, false);
	karg_int(p, k, acc);
}

static bool lower_wgrad(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int ta, tb;
	int a = storage(g, op->in[0], &ta), dy = storage(g, op->in[1], &tb);
	if (ta || tb)
		return false; /* lower_bmm's */
	int out = op->out[0];
	const Value *va = &g->vals[op->in[0]];
	long long K = ldim(g, op->in[0], va->rank - 1);
	long long N = ldim(g, out, 1);
	long long R = lelems(g, op->in[0]) / K;
	LProg *p = L->p;
	Kernel *k = call(L, K_MATMUL, oi);
	karg_int(p, k, 1);
	karg_int(p, k, K);
	karg_int(p, k, N);
	karg_int(p, k, R);
	arg_value(L, k, a, true, false);
	karg_int(p, k, 1);
	karg_int(p, k, 0);
	arg_value(L, k, dy, true, false);
	karg_int(p, k, 0);
	karg_int(p, k, 0);
	bool acc = g->vals[out].grad_of >= 0;
	arg_value(L, k, out, acc, true);
	karg_int(p, k, 0);
	karg_int(p, k, acc);
	return true;
}

static void permute(Lower *L, int oi, int rank, const long long *dims, const long long *perm, int in, int out)
{
	Kernel *k = call(L, K_PERMUTE, oi);
	karg_int(L->p, k, rank);
	karg_ints(L->p, k, dims, rank, false);
	karg_ints(L->p, k, perm, rank, true);
	arg_value(L, k, in, true, false);
	arg_value(L, k, out, false, true);
}

/* Materialises a transpose view for a consumer that needs it contiguous. */
static void lower_transpose(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int src = op->in[0];
	long long dims[MAX_DIMS], perm[MAX_DIMS];
	int r = g->vals[src].rank;
	for (int d = 0; d < r; d++) {
		dims[d] = ldim(g, src, d);
		perm[d] = d;
	}
	perm[r - 1] = r - 2;
	perm[r - 2] = r - 1;
	permute(L, oi, r, dims, perm, src, op->out[0]);
}

/* [.., S, H*Dh] <-> [.., H, S, Dh]: a permutation of [.., S, H, Dh] */
static void lower_heads(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int x = op->in[0], y = op->out[0];
	const Value *vi = &g->vals[x];
	bool split = op->kind == OP_SPLIT_HEADS;
	int r = split ? vi->rank + 1 : vi->rank; /* rank of the 4-d (or more) view */
	long long dims[MAX_DIMS], perm[MAX_DIMS];
	int lead = r - 3;
	long long h = split ? ldim(g, y, r - 3) : ldim(g, x, r - 3);
	for (int d = 0; d < lead; d++) {
		dims[d] = ldim(g, split ? x : y, d);
		perm[d] = d;
	}
	if (split) { /* in: [.., S, H, Dh] -> out [.., H, S, Dh] */
		dims[lead] = ldim(g, x, vi->rank - 2);
		dims[lead + 1] = h;
		dims[lead + 2] = ldim(g, y, r - 1);
	} else { /* in: [.., H, S, Dh] -> out [.., S, H, Dh] */
		dims[lead] = h;
		dims[lead + 1] = ldim(g, x, r - 2);
		dims[lead + 2] = ldim(g, x, r - 1);
	}
	perm[lead] = lead + 1;
	perm[lead + 1] = lead;
	perm[lead + 2] = lead + 2;
	permute(L, oi, r, dims, perm, x, y);
}

/* ------------------------------------------------------------------ element-wise loops */

static bool elementwise(OpKind k)
{
	switch (k) {
	case OP_ADD:
	case OP_SUB:
	case OP_MUL:
	case OP_DIV:
	case OP_SCALE:
	case OP_NEG:
	case OP_GELU:
	case OP_RELU:
	case OP_SILU:
	case OP_GELU_GRAD:
	case OP_RELU_GRAD:
	case OP_SILU_GRAD:
	case OP_DROPOUT_GRAD:
		return true;
	default:
		return false;
	}
}

/* A load of value v broadcast into the output's local shape (numpy rules, right aligned). */
static LExpr *load(Lower *L, int v, int out)
{
	Graph *g = L->g;
	LExpr *e = arena_alloc(g->arena, sizeof *e);
	e->kind = LX_LOAD;
	e->buf = v;
	const Value *vv = &g->vals[v], *vo = &g->vals[out];
	long long stride = 1;
	for (int d = vo->rank - 1; d >= 0; d--) {
		int dv = d - (vo->rank - vv->rank);
		if (dv < 0) {
			e->stride[d] = 0;
			continue;
		}
		long long n = ldim(g, v, dv);
		e->stride[d] = n == 1 && ldim(g, out, d) != 1 ? 0 : stride;
		stride *= n;
	}
	return e;
}

static LExpr *expr_for(Lower *L, const Op *op, int out);

/* The expression computing input i of op: the fused producer's expression or a load. */
static LExpr *operand(Lower *L, const Op *op, int i, int out)
{
	Graph *g = L->g;
	int v = op->in[i];
	int d = g->vals[v].def;
	if (d >= 0 && L->skip[d] && elementwise(g->ops[d].kind))
		return expr_for(L, &g->ops[d], out);
	return load(L, v, out);
}

static LExpr *expr_for(Lower *L, const Op *op, int out)
{
	LExpr *e = arena_alloc(L->g->arena, sizeof *e);
	e->op = op->kind;
	e->f = op->f;
	e->s = op->s;
	switch (op->kind) {
	case OP_SCALE:
	case OP_NEG:
	case OP_GELU:
	case OP_RELU:
	case OP_SILU:
		e->kind = LX_UNARY;
		e->a = operand(L, op, 0, out);
		break;
	default:
		e->kind = LX_BINARY;
		e->a = operand(L, op, 0, out);
		e->b = operand(L, op, 1, out);
		break;
	}
	return e;
}

static void collect_loads(LProg *p, Kernel *k, const LExpr *e)
{
	if (!e)
		return;
	if (e->kind == LX_LOAD)
		kernel_use(p, k, e->buf);
	collect_loads(p, k, e->a);
	collect_loads(p, k, e->b);
}

static void lower_elementwise(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int out = op->out[0];
	Kernel *k = call(L, K_LOOP, oi);
	k->out = out;
	k->rank = g->vals[out].rank;
	for (int d = 0; d < k->rank; d++)
		k->dims[d] = ldim(g, out, d);
	k->expr = expr_for(L, op, out);
	k->accumulate = g->vals[out].grad_of >= 0; /* gradients accumulate over micro-batches */
	for (const Op *f = op; f;) { /* count the fused chain */
		k->nfused++;
		const Op *next = NULL;
		for (int i = 0; i < f->nin; i++) {
			int d = g->vals[f->in[i]].def;
			if (d >= 0 && L->skip[d] && elementwise(g->ops[d].kind))
				next = &g->ops[d];
		}
		f = next;
	}
	collect_loads(L->p, k, k->expr);
	if (k->accumulate)
		kernel_use(L->p, k, out);
	kernel_def(L->p, k, out);
}

/* An element-wise op is fused into its consumer when its only reader is an element-wise op of the
 * same phase and chunk with the same output shape and nothing else keeps it. */
static void plan_fusion(Lower *L)
{
	Graph *g = L->g;
	int stage = L->p->stage;
	for (int t = 0; t < L->nops; t++) {
		int i = L->ops[t];
		const Op *op = &g->ops[i];
		if (op->stage != stage || !elementwise(op->kind) || op->nout != 1)
			continue;
		int v = op->out[0];
		if (L->consumers[v] != 1 || L->kept[v] || g->vals[v].grad_of >= 0 || g->vals[v].role == ROLE_LOSS)
			continue;
		for (int j = i + 1; j < g->nops; j++) {
			const Op *c = &g->ops[j];
			bool reads = false;
			for (int k = 0; k < c->nin; k++)
				if (c->in[k] == v)
					reads = true;
			if (!reads)
				continue;
			if (c->stage == stage && elementwise(c->kind) && phase_of(c) == phase_of(op) &&
			    chunk_of(L, j) == chunk_of(L, i) && value_local_elems(g, c->out[0]) == value_local_elems(g, v) &&
			    g->vals[c->out[0]].rank == g->vals[v].rank)
				L->skip[i] = true;
			break;
		}
	}
}

/* ------------------------------------------------------------------ the other compute ops */

/* Outputs that accumulate (layer-norm weight gradients, embedding gradients) start from zero
 * unless they are a parameter's gradient, which accumulates over the micro-batches. */
static void zero_unless_gradient(Lower *L, int oi, int v)
{
	if (L->g->vals[v].grad_of >= 0)
		return;
	Kernel *z = call(L, K_FILL, oi);
	arg_value(L, z, v, false, true);
	karg_int(L->p, z, lelems(L->g, v));
	karg(L->p, z, KA_DTYPE, L->g->vals[v].dtype);
	karg_f64(L->p, z, 0.0);
}

static long long rows_of(const Graph *g, int v)
{
	const Value *val = &g->vals[v];
	return lelems(g, v) / ldim(g, v, val->rank - 1);
}

static long long cols_of(const Graph *g, int v)
{
	return ldim(g, v, g->vals[v].rank - 1);
}

/* Comm for a collective op: the value that is the call's buffer B of the wire formula. */
static void comm_of_op(Lower *L, Kernel *k, const Op *op, int oi)
{
	Graph *g = L->g;
	Comm *c = kernel_comm(L->p, k);
	c->coll = op->kind;
	c->axis = op->axis;
	c->op = oi;
	int v = op->kind == OP_ALL_GATHER || op->kind == OP_RECV ? op->out[0] : op->in[0];
	c->elems = lelems(g, v);
	c->dtype = g->vals[v].dtype;
	const Value *val = &g->vals[v];
	int wv = op->kind == OP_RECV ? op->out[0] : op->in[0]; /* the shape the check compares */
	const Value *wval = &g->vals[wv];
	c->rank = wval->rank;
	for (int d = 0; d < wval->rank; d++)
		c->shape[d] = ldim(g, wv, d);
	c->what = val->name ? val->name : g->vals[wv].name;
	if (op->kind == OP_SEND || op->kind == OP_RECV) {
		c->peer = op->peer >= 0 ? op->peer : (int)op->n;
		c->channel = op->backward ? 1 : 0;
	}
}

/* (in, out, rank, dims, dim[, dim2], dtype, comm): the arguments of the *_dim conversions */
static Kernel *conversion_call(Lower *L, const Op *op, int oi, KernelKind kind, int dim2)
{
	int in = op->in[0];
	Kernel *k = call(L, kind, oi);
	arg_value(L, k, in, true, false);
	arg_value(L, k, op->out[0], false, true);
	karg_int(L->p, k, L->g->vals[in].rank);
	arg_dims(L, k, in);
	karg_int(L->p, k, op->coll_dim);
	bool mirrored = L->g->ring_mirrored && op->axis == L->g->ps->ring_axis; /* block_mirrored's split */
	if (dim2 >= 0) {
		internal_assert(!mirrored); /* no all-to-all on the ring axis: it splits only the sequence */
		karg_int(L->p, k, dim2);
	} else {
		karg_int(L->p, k, mirrored);
	}
	karg(L->p, k, KA_DTYPE, L->g->vals[in].dtype);
	karg(L->p, k, KA_AXIS, op->axis);
	return k;
}

static void lower_moe_exchange(Lower *L, const Op *op, int oi);

/* Conversions between layouts inserted by shard.c: collectives along one mesh axis. */
static void lower_conversion(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int in = op->in[0], out = op->out[0];
	size_t bytes = (size_t)lelems(g, in) * (size_t)dtype_bytes(g->vals[in].dtype);
	DType t = g->vals[in].dtype;
	Kernel *k;
	switch (op->kind) {
	case OP_ALL_REDUCE:
		k = call(L, K_ALLREDUCE_DIM, oi);
		arg_value(L, k, in, true, false);
		arg_value(L, k, out, false, true);
		karg_int(p, k, lelems(g, in));
		karg(p, k, KA_DTYPE, t);
		karg(p, k, KA_AXIS, op->axis);
		break;
	case OP_REDUCE_SCATTER:
	case OP_ALL_GATHER:
		k = conversion_call(L, op, oi, op->kind == OP_REDUCE_SCATTER ? K_REDUCE_SCATTER_DIM : K_ALLGATHER_DIM, -1);
		arg_scratch(L, k, op->kind == OP_REDUCE_SCATTER ? bytes : bytes * (size_t)g->ps->axes[op->axis].size);
		break;
	case OP_ALL_TO_ALL:
		if (L->moe_idx && L->moe_idx[in] >= 0) {
			lower_moe_exchange(L, op, oi);
			return;
		}
		k = conversion_call(L, op, oi, K_ALLTOALL_DIM, op->coll_dim2);
		arg_scratch(L, k, 2 * bytes);
		break;
	case OP_SLICE:
		conversion_call(L, op, oi, K_SLICE_DIM, -1);
		return; /* a local copy: no communication */
	default:
		ICE("'%s' is not a layout conversion", op_names[op->kind]);
	}
	comm_of_op(L, k, op, oi);
}

/* ZeRO-3: the whole parameter from every rank's chunk, before a use. The gathered buffer is
 * padded to whole chunks so that a prefetch (overlap.c) can gather into it directly. */
static void lower_param_gather(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int x = op->in[0], y = op->out[0];
	int size = g->ps->axes[op->axis].size;
	long long n = 1;
	for (int d = 0; d < g->vals[y].rank; d++)
		n *= ldim(g, y, d);
	long long c = (n + size - 1) / size;
	p->buf[y].bytes = (size_t)(c * size) * (size_t)dtype_bytes(g->vals[y].dtype);
	Kernel *k = call(L, K_ALLGATHER_FLAT, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, y, false, true);
	karg_int(p, k, n);
	karg(p, k, KA_DTYPE, g->vals[x].dtype);
	karg(p, k, KA_AXIS, op->axis);
	arg_scratch(L, k, (size_t)(c * size) * (size_t)dtype_bytes(g->vals[x].dtype));
	Comm *cm = kernel_comm(p, k);
	cm->coll = OP_ALL_GATHER;
	cm->axis = op->axis;
	cm->op = oi;
	cm->elems = c * size;
	cm->dtype = g->vals[x].dtype;
	cm->rank = 1;
	cm->shape[0] = c;
	cm->what = g->vals[x].name;
}

/* The input a value was loaded from, through layout conversions and views (-1: computed). */
static int input_of(const Graph *g, int v)
{
	for (;;) {
		int d = g->vals[v].def;
		if (d < 0)
			return -1;
		const Op *op = &g->ops[d];
		if (op->kind == OP_INPUT)
			return v;
		OpClass c = op_classes[op->kind];
		if (op->nin != 1 || (c != OPK_COLLECTIVE && c != OPK_VIEW && op->kind != OP_RECV && op->kind != OP_NARROW &&
				     op->kind != OP_RESHAPE))
			return -1;
		v = op->in[0];
	}
}

/* Class labels are checked against the classes before every cross-entropy: a label outside them
 * ends the run with its value and position, never trains silently on a wrong target. */
static void check_labels(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int logits = op->in[0], targets = op->in[1];
	int src = input_of(g, targets), line, col;
	diag_line_col(op->src, op->loc.off, &line, &col);
	const char *what = src >= 0 ? arena_printf(g->arena, "input '%s'", g->vals[src].name) : "the labels";
	Kernel *k = call(L, K_CHECK_LABELS, oi);
	arg_value(L, k, targets, true, false);
	karg_int(p, k, p->buf[targets].rank);
	karg_ints(p, k, p->buf[targets].ldims, p->buf[targets].rank, false);
	karg_offset(p, k, targets, -1);
	karg_int(p, k, g->vals[logits].dim[g->vals[logits].rank - 1]);
	karg_str(p, k, arena_printf(g->arena, "%s (the targets of cross_entropy at %s:%d:%d)", what, op->src->path, line, col));
	karg(p, k, KA_STEP, 0);
}

/* A loss that is a cross-entropy's output is a classification's: every stage gets the metric
 * counting the rows whose target class has the largest logit (zero where the loss is not
 * computed), which the cross-entropy kernel adds to and evaluation reports as the accuracy
 * (state.c's phase_eval) over the batch's accuracy_rows (its micro-batches' targets). */
static void accuracy_metric(Lower *L)
{
	const Graph *g = L->g;
	LProg *p = L->p;
	int d = g->loss >= 0 ? g->vals[g->loss].def : -1;
	if (d < 0 || g->ops[d].kind != OP_CROSS_ENTROPY)
		return;
	p->accuracy_metric = buffer_new(p, BUF_STATE, DT_F64, 1, "correct", "the rows whose target has the largest logit");
	p->buf[p->accuracy_metric].state = SC_METRIC;
	p->accuracy_rows = value_elems(g, g->ops[d].in[1]) * (g->ps->micro_batches > 0 ? g->ps->micro_batches : 1);
}

/* Vocab-parallel cross-entropy all-reduces its row statistics inside its kernel: the internal
 * reductions shard.c placed right after it are this kernel's communication. */
static void lower_cross_entropy(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int logits = op->in[0], targets = op->in[1];
	int vaxis = -1, r = g->vals[logits].rank;
	for (int a = 0; a < g->ps->naxes; a++)
		if (g->vals[logits].lay.on[a] == r - 1)
			vaxis = a;
	check_labels(L, op, oi);
	Kernel *k = call(L, K_CROSS_ENTROPY, oi);
	arg_value(L, k, logits, true, false);
	arg_value(L, k, targets, true, false);
	arg_value(L, k, op->out[0], false, true);
	arg_value(L, k, op->out[1], false, true);
	karg_int(p, k, rows_of(g, logits));
	karg_int(p, k, cols_of(g, logits));
	karg_offset(p, k, logits, r - 1);
	karg_f64(p, k, 1.0 / (double)value_elems(g, targets));
	if (op->out[0] == g->loss && p->accuracy_metric >= 0)
		karg_buf(p, k, p->accuracy_metric, true, true);
	else
		karg(p, k, KA_NULL, 0);
	karg(p, k, vaxis >= 0 ? KA_AXIS : KA_NULL, vaxis);
	arg_scratch(L, k, (size_t)rows_of(g, logits) * 3 * sizeof(float));
	int ki = p->nk - 1;
	for (int j = oi + 1; j < g->nops && g->ops[j].internal; j++)
		comm_of_op(L, &p->k[ki], &g->ops[j], j);
}

/* ------------------------------------------------------------------ reductions, shapes, RoPE */

/* A kernel that overwrites its output cannot write a parameter's gradient, which accumulates over
 * the micro-batches: it writes a transient copy, added by overwritten_done. */
static int overwrite_target(Lower *L, int v)
{
	const Graph *g = L->g;
	if (g->vals[v].grad_of < 0)
		return v;
	return buffer_new(L->p, BUF_ARENA, g->vals[v].dtype, lelems(g, v), "grad_part", g->vals[v].name);
}

static void overwritten_done(Lower *L, int oi, int v, int written)
{
	if (written == v)
		return;
	Kernel *k = call(L, K_ACCUMULATE, oi);
	arg_value(L, k, v, true, true);
	arg_value(L, k, written, true, false);
	karg_int(L->p, k, lelems(L->g, v));
	karg(L->p, k, KA_DTYPE, L->g->vals[v].dtype);
}

/* v's local block viewed as [outer, n, inner] around dim d (d < 0: [1, every element, 1]) */
static void around_dim(const Graph *g, int v, int d, long long *outer, long long *n, long long *inner)
{
	*outer = *inner = 1;
	*n = lelems(g, v);
	if (d < 0)
		return;
	*n = ldim(g, v, d);
	for (int i = 0; i < g->vals[v].rank; i++)
		if (i < d)
			*outer *= ldim(g, v, i);
		else if (i > d)
			*inner *= ldim(g, v, i);
}

static void arg_around(Lower *L, Kernel *k, int v, int d)
{
	long long outer, n, inner;
	around_dim(L->g, v, d, &outer, &n, &inner);
	karg_int(L->p, k, outer);
	karg_int(L->p, k, n);
	karg_int(L->p, k, inner);
}

/* rows [start, start + len) of dim d of y get x (added to y's rows; the others are left) */
static void narrow_into(Lower *L, int oi, int x, int y, int d, long long start, long long len, bool accumulate)
{
	Kernel *k = call(L, K_NARROW_GRAD, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, y, accumulate, true);
	arg_around(L, k, y, d);
	karg_int(L->p, k, start);
	karg_int(L->p, k, len);
	karg_int(L->p, k, accumulate);
}

static void lower_rope(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int x = op->in[0], y = op->out[0], pos = op->nin > 1 ? op->in[1] : -1;
	bool first = op->dim2 != 0;
	int w = op->kind == OP_ROPE_GRAD ? overwrite_target(L, y) : y;
	Kernel *k = call(L, op->kind == OP_ROPE ? K_ROPE : K_ROPE_GRAD, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, w, false, true);
	karg_int(p, k, ldim(g, x, 0));                /* batch */
	karg_int(p, k, ldim(g, x, first ? 2 : 1));    /* seq */
	karg_int(p, k, ldim(g, x, first ? 1 : 2));    /* heads */
	karg_int(p, k, ldim(g, x, 3));                /* head_dim */
	karg_int(p, k, op->n);                        /* rot_dim */
	karg_int(p, k, first);
	if (pos >= 0) {
		arg_value(L, k, pos, true, false);
		karg_int(p, k, g->vals[pos].rank == 2 ? ldim(g, pos, 1) : 0);
		karg_int(p, k, 0);
		karg_int(p, k, 0);
	} else { /* positions 0, 1, ..: this block's two halves start at their offsets in the sequence
		  * (apart on a balanced ring: its two mirrored chunks) */
		karg(p, k, KA_NULL, 0);
		karg_int(p, k, 0);
		karg_offset(p, k, x, op->dim);
		karg_second_half(p, k, x, op->dim);
	}
	karg_f64(p, k, op->f);
	overwritten_done(L, oi, y, w);
}

/* A fill: the backward's seed (1/m per micro-batch), or loss * scale under fp16 loss scaling. */
static void lower_fill(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int y = op->out[0];
	if (g->ps->loss_scale != 0 && op->backward && g->loss >= 0 && op->fwd_op == g->vals[g->loss].def) {
		/* fp16 loss scaling: the backward starts from loss * the run's current scale */
		k = call(L, K_LOSS_SEED, oi);
		karg(p, k, KA_CTX, 0);
		arg_value(L, k, y, false, true);
		karg_f64(p, k, 1.0 / (g->ps->micro_batches > 0 ? g->ps->micro_batches : 1));
		return;
	}
	k = call(L, K_FILL, oi);
	arg_value(L, k, y, false, true);
	karg_int(p, k, 1);
	karg(p, k, KA_DTYPE, g->vals[y].dtype);
	karg_f64(p, k, 1.0 / (g->ps->micro_batches > 0 ? g->ps->micro_batches : 1));
}

/* A broadcast's gradient: x summed down to y's shape (strides of 0 on the summed dims). */
static void lower_sum_to(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0], y = op->out[0];
	const Value *vi = &g->vals[x], *vo = &g->vals[y];
	long long dims[MAX_DIMS], ostr[MAX_DIMS];
	long long stride = 1;
	for (int d = vi->rank - 1; d >= 0; d--) {
		dims[d] = ldim(g, x, d);
		int dout = d - (vi->rank - vo->rank);
		if (dout < 0 || (ldim(g, y, dout) == 1 && dims[d] != 1)) {
			ostr[d] = 0;
			continue;
		}
		ostr[d] = stride;
		stride *= ldim(g, y, dout);
	}
	bool acc = g->vals[y].grad_of >= 0;
	k = call(L, acc ? K_SUM_TO_ACC : K_SUM_TO, oi);
	karg_int(p, k, vi->rank);
	karg_ints(p, k, dims, vi->rank, false);
	arg_value(L, k, x, true, false);
	karg_ints(p, k, ostr, vi->rank, false);
	arg_value(L, k, y, acc, true);
	karg_int(p, k, lelems(g, y));
}

/* Dropout: masks keyed on the global sample, so that every split draws the single rank's mask. */
static void lower_dropout(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0], y = op->out[0];
	int r = g->vals[x].rank;
	long long gd[MAX_DIMS];
	const Value *vx = &g->vals[x];
	for (int d = 0; d < r; d++) /* the batch dim is the step's batch: masks key on global samples */
		gd[d] = d == p->buf[x].micro_dim ? g->ps->batch : vx->dim[d];
	k = call(L, K_DROPOUT, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, y, false, true);
	arg_value(L, k, op->out[1], false, true);
	karg_f64(p, k, op->f);
	karg(p, k, KA_STEP_SEED, 0);
	karg_int(p, k, op->orig);
	karg_int(p, k, r);
	karg_ints(p, k, gd, r, false);
	arg_dims(L, k, x);
	karg_offset(p, k, x, -1);
}

/* The causal mask over the scores' last two dims (its gradient fills with zero). */
static void lower_causal_mask(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0], y = op->out[0];
	int r = g->vals[x].rank;
	long long rows = ldim(g, x, r - 2), cols = ldim(g, x, r - 1);
	k = call(L, K_CAUSAL_MASK, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, y, false, true);
	karg_int(p, k, lelems(g, x) / (rows * cols));
	karg_int(p, k, rows);
	karg_int(p, k, cols);
	karg_offset(p, k, x, -1);
	karg_int(p, k, r);
	karg_int(p, k, op->n == 1); /* gradient: fill with zero */
}

/* Layer norm (x, weight, bias) or RMS norm (x, weight) over the last dim. */
static void lower_norm(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0];
	bool ln = op->kind == OP_LAYER_NORM;
	k = call(L, ln ? K_LAYER_NORM : K_RMS_NORM, oi);
	for (int i = 0; i < (ln ? 3 : 2); i++)
		arg_value(L, k, op->in[i], true, false);
	for (int i = 0; i < (ln ? 3 : 2); i++)
		arg_value(L, k, op->out[i], false, true);
	karg_int(p, k, rows_of(g, x));
	karg_int(p, k, cols_of(g, x));
	karg_f64(p, k, op->f);
}

/* The norms' backward; the weight (and bias) gradients accumulate. */
static void lower_norm_grad(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0];
	bool ln = op->kind == OP_LAYER_NORM_GRAD;
	for (int i = 1; i < (ln ? 3 : 2); i++)
		zero_unless_gradient(L, oi, op->out[i]);
	k = call(L, ln ? K_LAYER_NORM_GRAD : K_RMS_NORM_GRAD, oi);
	for (int i = 0; i < (ln ? 5 : 4); i++)
		arg_value(L, k, op->in[i], true, false);
	for (int i = 0; i < (ln ? 3 : 2); i++) /* weight gradients accumulate */
		arg_value(L, k, op->out[i], i > 0, true);
	karg_int(p, k, rows_of(g, x));
	karg_int(p, k, cols_of(g, x));
}

/* An embedding lookup from the vocab rows this rank holds. */
static void lower_embed(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int y = op->out[0];
	int table = op->in[0], ids = op->in[1];
	k = call(L, K_EMBED, oi);
	arg_value(L, k, table, true, false);
	arg_value(L, k, ids, true, false);
	arg_value(L, k, y, false, true);
	karg_int(p, k, lelems(g, ids));
	karg_int(p, k, ldim(g, table, 1));
	karg_offset(p, k, table, 0); /* the vocab rows this rank holds */
	karg_int(p, k, ldim(g, table, 0));
}

/* The embedding's gradient, scattered into the rows this rank holds. */
static void lower_embed_grad(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int y = op->out[0];
	int ids = op->in[0], dy = op->in[1];
	const Op *fwd = op->fwd_op >= 0 ? &g->ops[op->fwd_op] : NULL;
	int table = fwd ? fwd->in[0] : y;
	zero_unless_gradient(L, oi, y);
	k = call(L, K_EMBED_GRAD, oi);
	arg_value(L, k, ids, true, false);
	arg_value(L, k, dy, true, false);
	arg_value(L, k, y, true, true);
	karg_int(p, k, lelems(g, ids));
	karg_int(p, k, ldim(g, y, 1));
	karg_offset(p, k, p->buf[table].cls != BUF_NONE ? table : y, 0);
	karg_int(p, k, ldim(g, y, 0));
}

/* Cross-entropy's gradient from the logits, targets and log-sum-exp. */
static void lower_cross_entropy_grad(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int y = op->out[0];
	int logits = op->in[0], targets = op->in[1], lse = op->in[2], dl = op->in[3];
	int r = g->vals[logits].rank;
	k = call(L, K_CE_GRAD, oi);
	arg_value(L, k, logits, true, false);
	arg_value(L, k, targets, true, false);
	arg_value(L, k, lse, true, false);
	karg_int(p, k, rows_of(g, logits));
	karg_int(p, k, cols_of(g, logits));
	karg_offset(p, k, logits, r - 1);
	karg_scalar(p, k, dl, 1.0 / (double)value_elems(g, targets));
	arg_value(L, k, y, false, true);
}

/* Concatenation: zeros, then each input added into its rows (x + 0 is x exactly). */
static void lower_concat(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int y = op->out[0];
	k = call(L, K_FILL, oi);
	arg_value(L, k, y, false, true);
	karg_int(p, k, lelems(g, y));
	karg(p, k, KA_DTYPE, g->vals[y].dtype);
	karg_f64(p, k, 0.0);
	long long start = 0;
	for (int i = 0; i < op->nin; i++) {
		long long n = ldim(g, op->in[i], op->dim);
		narrow_into(L, oi, op->in[i], y, op->dim, start, n, true);
		start += n;
	}
}

/* Two dims swapped: a permuting copy. */
static void lower_swap_dims(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int x = op->in[0], y = op->out[0];
	long long dims[MAX_DIMS], perm[MAX_DIMS];
	int r = g->vals[x].rank;
	for (int d = 0; d < r; d++) {
		dims[d] = ldim(g, x, d);
		perm[d] = d;
	}
	perm[op->dim] = op->dim2;
	perm[op->dim2] = op->dim;
	int w = overwrite_target(L, y);
	permute(L, oi, r, dims, perm, x, w);
	overwritten_done(L, oi, y, w);
}

/* GQA's K/V heads repeated to the query heads (and the gradient summed back). */
static void lower_repeat_kv(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->in[0], y = op->out[0];
	bool grad = op->kind == OP_REPEAT_KV_GRAD;
	int w = grad ? overwrite_target(L, y) : y;
	long long outer, heads, inner;
	around_dim(g, grad ? y : x, op->dim, &outer, &heads, &inner);
	k = call(L, grad ? K_REPEAT_KV_GRAD : K_REPEAT_KV, oi);
	arg_value(L, k, x, true, false);
	arg_value(L, k, w, false, true);
	karg_int(p, k, outer);
	karg_int(p, k, heads);
	karg_int(p, k, op->n);
	karg_int(p, k, inner);
	/* the repeated side's heads: a block matching the kv heads' block, or, where the kv heads
	 * are whole on the rank (replicated over the tensor ranks that share them: shard.c), the
	 * rank's block of the query heads from its first */
	int rep = grad ? x : y, kv = grad ? y : x;
	karg_int(p, k, ldim(g, rep, op->dim));
	if (ldim(g, kv, op->dim) == g->vals[kv].dim[op->dim] && ldim(g, rep, op->dim) < g->vals[rep].dim[op->dim])
		karg_offset(p, k, rep, op->dim);
	else
		karg_int(p, k, 0);
	overwritten_done(L, oi, y, w);
}

static void lower_shape_op(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int x = op->in[0], y = op->out[0];
	Kernel *k;
	switch (op->kind) {
	case OP_UNARY_FN:
		k = call(L, K_UNARY, oi);
		karg_int(p, k, op->n);
		arg_value(L, k, x, true, false);
		arg_value(L, k, y, false, true);
		karg_int(p, k, lelems(g, x));
		return;
	case OP_UNARY_FN_GRAD: {
		int w = overwrite_target(L, y);
		k = call(L, K_UNARY_GRAD, oi);
		karg_int(p, k, op->n);
		arg_value(L, k, x, true, false);
		arg_value(L, k, op->in[1], true, false);
		arg_value(L, k, w, false, true);
		karg_int(p, k, lelems(g, x));
		overwritten_done(L, oi, y, w);
		return;
	}
	case OP_SUM_DIM:
		k = call(L, K_SUM_DIM, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, y, false, true);
		arg_around(L, k, x, op->dim);
		karg_f64(p, k, op->f);
		return;
	case OP_SUM_DIM_GRAD: {
		int w = overwrite_target(L, y);
		k = call(L, K_SUM_DIM_GRAD, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, w, false, true);
		arg_around(L, k, y, op->dim);
		karg_f64(p, k, op->f);
		overwritten_done(L, oi, y, w);
		return;
	}
	case OP_MAX_DIM:
		k = call(L, K_MAX_DIM, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, y, false, true);
		arg_value(L, k, op->out[1], false, true);
		arg_around(L, k, x, op->dim);
		return;
	case OP_MAX_DIM_GRAD: {
		int w = overwrite_target(L, y);
		k = call(L, K_MAX_DIM_GRAD, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, op->in[1], true, false);
		arg_value(L, k, w, false, true);
		arg_around(L, k, y, op->dim);
		overwritten_done(L, oi, y, w);
		return;
	}
	case OP_MSE_LOSS:
		k = call(L, K_REGRESSION_LOSS, oi);
		karg_int(p, k, op->n);
		arg_value(L, k, x, true, false);
		arg_value(L, k, op->in[1], true, false);
		karg_int(p, k, lelems(g, x));
		karg_f64(p, k, op->f);
		arg_value(L, k, y, false, true);
		return;
	case OP_MSE_LOSS_GRAD: {
		int w = overwrite_target(L, y);
		k = call(L, K_REGRESSION_LOSS_GRAD, oi);
		karg_int(p, k, op->n);
		arg_value(L, k, x, true, false);
		arg_value(L, k, op->in[1], true, false);
		karg_int(p, k, lelems(g, x));
		karg_scalar(p, k, op->in[2], op->f);
		arg_value(L, k, w, false, true);
		overwritten_done(L, oi, y, w);
		return;
	}
	case OP_NARROW:
		k = call(L, g->vals[x].dtype == DT_I32 ? K_NARROW_I32 : K_NARROW, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, y, false, true);
		arg_around(L, k, x, op->dim);
		karg_int(p, k, op->start);
		karg_int(p, k, op->length);
		return;
	case OP_NARROW_GRAD:
		narrow_into(L, oi, x, y, op->dim, op->start, op->length, g->vals[y].grad_of >= 0);
		return;
	case OP_CONCAT:
		lower_concat(L, op, oi);
		return;
	case OP_RESHAPE: /* the same elements in the same order: a copy */
		if (g->vals[y].grad_of >= 0) {
			overwritten_done(L, oi, y, x);
			return;
		}
		k = call(L, K_CAST, oi);
		arg_value(L, k, x, true, false);
		karg(p, k, KA_DTYPE, g->vals[x].dtype);
		arg_value(L, k, y, false, true);
		karg(p, k, KA_DTYPE, g->vals[y].dtype);
		karg_int(p, k, lelems(g, x));
		return;
	case OP_SWAP_DIMS:
		lower_swap_dims(L, op, oi);
		return;
	case OP_REPEAT_KV:
	case OP_REPEAT_KV_GRAD:
		lower_repeat_kv(L, op, oi);
		return;
	case OP_ROPE:
	case OP_ROPE_GRAD:
		lower_rope(L, op, oi);
		return;
	default:
		ICE("'%s' is not lowered here", op_names[op->kind]);
	}
}

/* The receive matching a transfer op: the RECV of the same value on the peer stage. */
static int matching_recv(const Graph *g, int oi)
{
	const Op *op = &g->ops[oi];
	if (op->kind == OP_RECV)
		return oi;
	for (int j = oi + 1; j < g->nops; j++)
		if (g->ops[j].kind == OP_RECV && g->ops[j].in[0] == op->in[0] && g->ops[j].backward == op->backward)
			return j;
	ICE("a send without its receive");
}

/* Point-to-point on the pipe axis. A send starts after its value is computed and is completed by
 * the walker before its slot is reused. A forward input is received into the inbox, posted when
 * the forward is prepared (one action ahead); a gradient coming back is received into the slot,
 * posted when the same micro-batch's forward runs, long before the peer's backward sends it. So
 * a send always finds its receive posted soon after it starts, and completing sends before a
 * slot is reused never waits on the peer. Messages travel on a channel per direction and
 * receiving chunk (the interleaved schedule runs the chunks' backwards in another order than
 * their forwards); within one channel they match in order. */
static void lower_p2p(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int v = op->kind == OP_SEND ? op->in[0] : op->out[0];
	int req = p->nslotreqs++;
	int channel = (op->backward ? 1 : 0) * p->nchunks + chunk_of(L, matching_recv(g, oi));
	Kernel *k = call(L, op->kind == OP_SEND ? K_SEND_START : K_RECV_START, oi);
	if (op->kind == OP_RECV)
		k->phase = op->backward ? PH_FORWARD : PH_PREPARE_F;
	arg_value(L, k, v, op->kind == OP_SEND, op->kind == OP_RECV);
	karg_int(p, k, lelems(g, v));
	karg(p, k, KA_DTYPE, g->vals[v].dtype);
	int peer = op->peer >= 0 ? op->peer : (int)op->n;
	karg_int(p, k, peer);
	karg_int(p, k, channel);
	karg(p, k, KA_SLOTREQ, req);
	comm_of_op(L, k, op, oi);
	p->k[p->nk - 1].comm[0].channel = channel;
	if (op->kind == OP_RECV) {
		Kernel *f = call(L, K_P2P_FINISH, oi);
		karg(p, f, KA_CTX, 0);
		karg(p, f, KA_SLOTREQ, req);
		kernel_def(p, f, v); /* the value is complete from here on */
	}
}

/* The model's inputs in declaration order: their index in the data (token data: 0 tokens, 1
 * targets; a data set names them). */
static int input_stream(const Graph *g, int v)
{
	const char *name = g->vals[v].name;
	int stream = 0;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind != OP_INPUT || g->vals[op->out[0]].tied_to >= 0)
			continue;
		const char *n = g->vals[op->out[0]].name;
		if (n && name && !strcmp(n, name))
			return stream;
		stream++;
	}
	return 0;
}

static void lower_input(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int v = op->out[0];
	/* loaded at the start of the forward of the chunk that first reads it */
	int c = 0;
	for (int j = oi + 1; j < g->nops; j++) {
		const Op *u = &g->ops[j];
		bool reads = false;
		for (int k = 0; k < u->nin; k++)
			if (u->in[k] == v)
				reads = true;
		if (reads && u->stage == p->stage) {
			c = chunk_of(L, j);
			break;
		}
	}
	L->chunk[oi] = c;
	const Value *val = &g->vals[v];
	if (p->buf[v].micro_dim != 0) { /* samples are rows of the batch dim: refused by planc build */
		Kernel *k = call(L, K_OPAQUE, oi);
		arg_value(L, k, v, false, true);
		return;
	}
	/* the labels of a cross-entropy are checked against its classes when the data is opened */
	long long classes = 0;
	for (int i = 0; i < g->nops; i++) {
		const Op *ce = &g->ops[i];
		int src = ce->kind == OP_CROSS_ENTROPY && !ce->backward ? input_of(g, ce->in[1]) : -1;
		if (src >= 0 && g->vals[src].name && val->name && !strcmp(g->vals[src].name, val->name))
			classes = g->vals[ce->in[0]].dim[g->vals[ce->in[0]].rank - 1];
	}
	/* ids that index an embedding table are checked against its rows (a negative bound: an index) */
	for (int i = 0; i < g->nops && !classes; i++) {
		const Op *e = &g->ops[i];
		int src = e->kind == OP_EMBED && !e->backward ? input_of(g, e->in[1]) : -1;
		if (src >= 0 && g->vals[src].name && val->name && !strcmp(g->vals[src].name, val->name))
			classes = -g->vals[e->in[0]].dim[0];
	}
	long long gdims[MAX_DIMS];
	for (int d = 0; d < val->rank; d++)
		gdims[d] = d == 0 ? g->ps->batch : val->dim[d];
	Kernel *k = call(L, K_LOAD_INPUT, oi);
	karg(p, k, KA_CTX, 0);
	arg_value(L, k, v, false, true);
	karg_int(p, k, input_stream(g, v));
	karg_str(p, k, val->name);
	karg(p, k, KA_DTYPE, val->dtype);
	karg_int(p, k, val->rank);
	karg_ints(p, k, gdims, val->rank, false);
	arg_dims(L, k, v);
	karg_offset(p, k, v, -1);
	karg_int(p, k, classes);
}

/* The op's inputs and outputs as arguments of an opaque kernel, and its communication. */
static void lower_opaque(Lower *L, const Op *op, int oi)
{
	Kernel *k = call(L, K_OPAQUE, oi);
	for (int i = 0; i < op->nin; i++)
		if (L->p->buf[op->in[i]].cls != BUF_NONE)
			arg_value(L, k, op->in[i], true, false);
	for (int i = 0; i < op->nout; i++)
		if (L->p->buf[op->out[i]].cls != BUF_NONE)
			arg_value(L, k, op->out[i], false, true);
	OpClass c = op_classes[op->kind];
	if ((c == OPK_COLLECTIVE && op->kind != OP_SLICE) || c == OPK_P2P)
		comm_of_op(L, &L->p->k[L->p->nk - 1], op, oi);
}

Kernel *kernel_opaque(LProg *p, int oi, Phase ph, int chunk)
{
	const Op *op = &p->g->ops[oi];
	Kernel *k = kernel_new(p, K_OPAQUE, ph, chunk, oi);
	k->note = op_names[op->kind];
	OpClass c = op_classes[op->kind];
	if ((c == OPK_COLLECTIVE && op->kind != OP_SLICE) || c == OPK_P2P) {
		Lower L = {.p = p, .g = p->g};
		comm_of_op(&L, k, op, oi);
	}
	return &p->k[p->nk - 1];
}

/* ------------------------------------------------------------------ mixture of experts */

/* Mixture-of-experts ops (docs/moe.md) become planrt's moe kernels on this rank's block: tokens
 * split only along their batch dim (whole routing groups, shard.c), the dispatched buffer [E, C, D]
 * split on C (the rank's groups) or on E (after the all-to-all). The router also adds its pairs
 * dropped and routed per expert into the step's routing metrics (a view of L->moe_stats; a forward
 * recomputed in the backward adds nothing). */
static int moe_stats_offset(const Graph *g, int oi)
{
	long long at = 0;
	for (int i = 0; i < oi; i++) {
		const Op *r = &g->ops[i];
		if (r->kind == OP_MOE_ROUTER && !r->recompute)
			at += 1 + g->vals[r->in[0]].dim[g->vals[r->in[0]].rank - 1];
	}
	return (int)at;
}

static void lower_moe(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int l = op->in[0];
	long long groups = g->vals[l].dim[0]; /* the micro-batch's samples: one routing group each */
	long long tokens_all = value_elems(g, l) / g->vals[l].dim[g->vals[l].rank - 1];
	switch (op->kind) {
	case OP_MOE_ROUTER: {
		k = call(L, K_MOE_ROUTE, oi);
		arg_value(L, k, l, true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, cols_of(g, l));
		karg_int(p, k, op->n);
		karg_int(p, k, op->moe_group);
		karg_int(p, k, op->moe_capacity);
		karg_int(p, k, op->moe_normalize);
		arg_value(L, k, op->out[0], false, true);
		arg_value(L, k, op->out[1], false, true);
		karg(p, k, KA_NULL, 0);
		if (L->moe_stats >= 0 && !op->recompute && !op->backward) {
			long long E = cols_of(g, l);
			int v = buffer_new(p, BUF_VIEW, DT_F64, 1 + E, "moe_stats_layer", "a layer's routing metrics");
			p->buf[v].view_of = L->moe_stats;
			p->buf[v].view_off = moe_stats_offset(g, oi);
			p->buf[v].view_axis = -1;
			karg_buf(p, k, v, true, true);
		} else {
			karg(p, k, KA_NULL, 0);
		}
		return;
	}
	case OP_MOE_ROUTER_GRAD: /* (logits, gates, idx, dgates) -> dlogits */
		k = call(L, K_MOE_ROUTE_GRAD, oi);
		arg_value(L, k, l, true, false);
		arg_value(L, k, op->in[3], true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, cols_of(g, l));
		karg_int(p, k, op->n);
		karg_int(p, k, op->moe_normalize);
		arg_value(L, k, op->out[0], false, true);
		return;
	case OP_MOE_DISPATCH: /* (x, gates, idx) -> buffer */
		k = call(L, K_MOE_DISPATCH, oi);
		arg_value(L, k, l, true, false);
		arg_value(L, k, op->in[2], true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, ldim(g, op->in[2], 1));
		karg_int(p, k, cols_of(g, l));
		karg_int(p, k, rows_of(g, op->out[0]));
		arg_value(L, k, op->out[0], false, true);
		return;
	case OP_MOE_DISPATCH_GRAD: /* (dbuffer, gates, idx) -> dx */
		k = call(L, K_MOE_DISPATCH_GRAD, oi);
		arg_value(L, k, l, true, false);
		arg_value(L, k, op->in[2], true, false);
		karg_int(p, k, rows_of(g, op->out[0]));
		karg_int(p, k, ldim(g, op->in[2], 1));
		karg_int(p, k, cols_of(g, op->out[0]));
		arg_value(L, k, op->out[0], false, true);
		return;
	case OP_MOE_COMBINE: /* (buffer, gates, idx) -> tokens */
		k = call(L, K_MOE_COMBINE, oi);
		arg_value(L, k, l, true, false);
		arg_value(L, k, op->in[1], true, false);
		arg_value(L, k, op->in[2], true, false);
		karg_int(p, k, rows_of(g, op->out[0]));
		karg_int(p, k, ldim(g, op->in[2], 1));
		karg_int(p, k, cols_of(g, op->out[0]));
		arg_value(L, k, op->out[0], false, true);
		return;
	case OP_MOE_COMBINE_GRAD: /* (dtokens, buffer, gates, idx) -> dbuffer, dgates */
		k = call(L, K_MOE_COMBINE_GRAD, oi);
		for (int i = 0; i < 4; i++)
			arg_value(L, k, op->in[i], true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, ldim(g, op->in[3], 1));
		karg_int(p, k, cols_of(g, l));
		karg_int(p, k, rows_of(g, op->out[0]));
		arg_value(L, k, op->out[0], false, true);
		arg_value(L, k, op->out[1], false, true);
		return;
	case OP_MOE_AUX_LOSS:
	case OP_MOE_Z_LOSS: { /* (logits, idx) -> this rank's share of the weighted mean */
		bool aux = op->kind == OP_MOE_AUX_LOSS;
		k = call(L, aux ? K_MOE_AUX_LOSS : K_MOE_Z_LOSS, oi);
		arg_value(L, k, l, true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, cols_of(g, l));
		if (aux)
			karg_int(p, k, op->moe_group);
		karg_f64(p, k, op->f / (double)(aux ? groups : tokens_all));
		arg_value(L, k, op->out[0], false, true);
		return;
	}
	case OP_MOE_AUX_LOSS_GRAD:
	case OP_MOE_Z_LOSS_GRAD: { /* (logits, idx, dloss) -> dlogits */
		bool aux = op->kind == OP_MOE_AUX_LOSS_GRAD;
		k = call(L, aux ? K_MOE_AUX_LOSS_GRAD : K_MOE_Z_LOSS_GRAD, oi);
		arg_value(L, k, l, true, false);
		karg_int(p, k, rows_of(g, l));
		karg_int(p, k, cols_of(g, l));
		if (aux)
			karg_int(p, k, op->moe_group);
		karg_scalar(p, k, op->in[2], op->f / (double)(aux ? groups : tokens_all));
		arg_value(L, k, op->out[0], false, true);
		return;
	}
	default:
		ICE("'%s' is not a mixture-of-experts op", op_names[op->kind]);
	}
}

/* Dropless layers' buffers (L->moe_idx): the dispatched buffer [E, C, D] holds every token, an
 * expert's rows packed from its first, so between the token and the expert layouts only the rows
 * that exist travel (planrt_moe_exchange: the counts, then the rows) instead of the all-to-all of
 * the whole buffer. A value is such a buffer when it comes from a dropless moe_dispatch (or is
 * moe_combine_grad's) through ops that keep the buffer's [E, C, ..] shape. */
static int *moe_buffers(const Graph *g)
{
	int *moe_idx = malloc(sizeof(int) * ((size_t)g->nvals + 1));
	if (!moe_idx)
		ICE("out of memory");
	for (int v = 0; v < g->nvals; v++)
		moe_idx[v] = -1;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (!op->nout)
			continue;
		int y = op->out[0];
		if ((op->kind == OP_MOE_DISPATCH || op->kind == OP_MOE_COMBINE_GRAD) && !op->moe_capacity) {
			moe_idx[y] = op->in[op->kind == OP_MOE_DISPATCH ? 2 : 3];
			continue;
		}
		if (op->kind == OP_MOE_COMBINE || op->kind == OP_MOE_DISPATCH_GRAD || op->kind == OP_MOE_COMBINE_GRAD)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int x = op->in[k], ix = moe_idx[x];
			const Value *vx = &g->vals[x], *vy = &g->vals[y];
			if (ix >= 0 && vy->rank == vx->rank && vy->dim[0] == vx->dim[0] && vy->dim[1] == vx->dim[1]) {
				moe_idx[y] = ix;
				break;
			}
		}
	}
	return moe_idx;
}

static void lower_moe_exchange(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int in = op->in[0], out = op->out[0], idx = L->moe_idx[in];
	bool to_experts = op->coll_dim == 1 && op->coll_dim2 == 0;
	if (!to_experts && !(op->coll_dim == 0 && op->coll_dim2 == 1))
		ICE("a dropless MoE buffer's all-to-all moves dims %d -> %d", op->coll_dim, op->coll_dim2);
	int tokens_side = to_experts ? in : out;
	long long n = g->ps->axes[op->axis].size, E = g->vals[in].dim[0], el = E / n;
	long long slots = ldim(g, tokens_side, 1), dim = ldim(g, in, 2), k = ldim(g, idx, 1);
	DType t = g->vals[in].dtype;
	Kernel *kn = call(L, K_MOE_EXCHANGE, oi);
	arg_value(L, kn, in, true, false);
	arg_value(L, kn, out, false, true);
	karg_int(p, kn, to_experts);
	arg_value(L, kn, idx, true, false);
	karg_int(p, kn, lelems(g, idx));
	karg_int(p, kn, E);
	karg_int(p, kn, slots);
	karg_int(p, kn, dim);
	karg(p, kn, KA_DTYPE, t);
	karg(p, kn, KA_AXIS, op->axis);
	arg_scratch(L, kn, (size_t)(2 * E * slots * dim) * (size_t)dtype_bytes(t) + (size_t)(8 * (4 * n + E)));
	Comm *c = kernel_comm(p, &p->k[p->nk - 1]); /* the counts */
	c->coll = OP_ALL_TO_ALL;
	c->axis = op->axis;
	c->op = oi;
	c->elems = E;
	c->dtype = DT_I32;
	c->rank = 2;
	c->shape[0] = n;
	c->shape[1] = el;
	c->what = "expert row counts";
	/* the rows: the tokens' side sends each token's pairs with other members' experts, at most
	 * min(k, E - E / n) of them; the experts' side sends back what it received from the others */
	long long rows = to_experts ? slots * (k < E - el ? k : E - el) : (n - 1) * slots * (k < el ? k : el);
	c = kernel_comm(p, &p->k[p->nk - 1]);
	c->coll = OP_ALL_TO_ALL;
	c->bound = true;
	c->axis = op->axis;
	c->op = oi;
	c->elems = rows * dim;
	c->dtype = t;
	c->rank = 3;
	c->shape[0] = ldim(g, in, 0);
	c->shape[1] = ldim(g, in, 1);
	c->shape[2] = dim;
	c->what = g->vals[in].name ? g->vals[in].name : "the dispatched tokens";
}

/* The step's routing metrics: summed over the ranks that route different tokens (and over the
 * pipeline, whose stages hold different layers), then written into rank 0's log line. Every
 * stage program has the buffer, zeroed at step_begin with the other metrics (state.c). */
static void lower_moe_metrics(Lower *L)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int nlayers = 0;
	long long *experts = arena_alloc(g->arena, sizeof(long long) * (size_t)(g->nops + 1));
	const Op *first = NULL;
	for (int i = 0; i < g->nops; i++) {
		const Op *r = &g->ops[i];
		if (r->kind != OP_MOE_ROUTER || r->recompute)
			continue;
		experts[nlayers++] = g->vals[r->in[0]].dim[g->vals[r->in[0]].rank - 1];
		if (!first)
			first = r;
	}
	if (!first)
		return;
	const PlanSpec *ps = g->ps;
	for (int a = 0; a < ps->naxes; a++) {
		bool split = g->vals[first->out[0]].lay.on[a] >= 0 || (a == ps->pipe_axis && g->nstages > 1);
		if (!split || ps->axes[a].size <= 1)
			continue;
		Kernel *k = kernel_new(p, K_ALLREDUCE_INPLACE, PH_STEP, 0, -1);
		k->note = "the step's routing metrics";
		karg_buf(p, k, L->moe_stats, true, true);
		karg_int(p, k, p->buf[L->moe_stats].elems);
		karg(p, k, KA_DTYPE, DT_F64);
		karg(p, k, KA_AXIS, a);
		karg(p, k, KA_NULL, 0);
		Comm *c = kernel_comm(p, k);
		c->coll = OP_ALL_REDUCE;
		c->axis = a;
		c->op = -1;
		c->elems = p->buf[L->moe_stats].elems;
		c->dtype = DT_F64;
		c->rank = 1;
		c->shape[0] = c->elems;
		c->what = "routing metrics";
	}
	Kernel *k = kernel_new(p, K_MOE_METRICS, PH_STEP, 0, -1);
	k->note = "the step's routing metrics into the log";
	karg_buf(p, k, L->moe_stats, true, false);
	karg_int(p, k, nlayers);
	karg_ints(p, k, experts, nlayers, false);
}

/* Fused attention (graph/attention.c) and its gradient: one planrt call each, over q's local
 * block; dropout keys on the scores' global shape (the step's batch, every key) as the unfused
 * dropout does. The scratch holds a few 64 x 64 score tiles: ATTN_SCRATCH_FLOATS in
 * runtime/cpu/attention_impl.h, the same formula. */
static void lower_attention(Lower *L, const Op *op, int oi)
{
	enum { BQ = 64, BK = 64 };
	Graph *g = L->g;
	LProg *p = L->p;
	bool grad = op->kind == OP_ATTENTION_GRAD;
	int q = op->in[0], kv = op->in[1], r = g->vals[q].rank, ntensors = grad ? 6 : 3;
	int mask = op->nin > ntensors ? op->in[ntensors] : -1;
	long long ldims[MAX_DIMS], gd[MAX_DIMS], mstr[MAX_DIMS] = {0};
	for (int d = 0; d < r; d++) {
		ldims[d] = ldim(g, q, d);
		gd[d] = d == p->buf[q].micro_dim ? g->ps->batch : g->vals[q].dim[d];
	}
	long long sk = ldim(g, kv, r - 2), dh = ldims[r - 1];
	gd[r - 1] = g->vals[kv].dim[r - 2];
	for (long long d = r - 1, stride = 1; mask >= 0 && d >= 0; d--) { /* broadcast dims read stride 0 */
		long long n = ldim(g, mask, (int)d), scores = d == r - 1 ? sk : ldims[d];
		mstr[d] = n == 1 && scores != 1 ? 0 : stride;
		stride *= n;
	}
	Kernel *k = call(L, grad ? K_ATTENTION_GRAD : K_ATTENTION, oi);
	for (int i = 0; i < 3; i++)
		arg_value(L, k, op->in[i], true, false);
	if (mask >= 0)
		arg_value(L, k, mask, true, false);
	else
		karg(p, k, KA_NULL, 0);
	karg_ints(p, k, mstr, r, false);
	for (int i = 3; i < ntensors; i++)
		arg_value(L, k, op->in[i], true, false);
	for (int i = 0; i < op->nout; i++)
		arg_value(L, k, op->out[i], false, true);
	karg_int(p, k, r);
	karg_ints(p, k, ldims, r, false);
	karg_int(p, k, ldim(g, kv, r - 3));
	karg_int(p, k, sk);
	karg_f64(p, k, op->f);
	karg_int(p, k, op->n);
	karg_f64(p, k, op->dropout_p);
	karg(p, k, KA_STEP_SEED, 0);
	karg_int(p, k, op->orig);
	karg_ints(p, k, gd, r, false);
	karg_offset(p, k, q, -1);
	arg_scratch(L, k, sizeof(float) * (size_t)(3 * BQ * BK + 2 * BK * dh + BQ * dh + 3 * BQ));
}

/* Generation's decode program (graph/decode.c): the token and its position come from the run
 * (ctx), each decode attention appends to its layer's caches and attends over them, and the
 * logits of the next token go back to the run. */
static void lower_decode_input(Lower *L, const Op *op, int oi)
{
	Kernel *k = call(L, K_DECODE_INPUT, oi);
	karg(L->p, k, KA_CTX, 0);
	arg_value(L, k, op->out[0], false, true);
	karg_int(L->p, k, op->out[0] == L->g->position);
}

static void lower_decode_attention(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	int q = op->in[0], kc = op->in[4];
	int r = g->vals[q].rank;
	Kernel *k = call(L, K_DECODE_ATTENTION, oi);
	for (int i = 0; i < 3; i++)
		arg_value(L, k, op->in[i], true, false);
	arg_value(L, k, op->in[4], true, true);
	arg_value(L, k, op->in[5], true, true);
	arg_value(L, k, op->out[0], false, true);
	arg_value(L, k, op->in[3], true, false);
	karg_int(p, k, lelems(g, q) / (ldim(g, q, r - 3) * ldim(g, q, r - 1)));
	karg_int(p, k, ldim(g, q, r - 3));
	karg_int(p, k, ldim(g, kc, r - 3));
	karg_int(p, k, ldim(g, q, r - 1));
	karg_int(p, k, ldim(g, kc, r - 2));
	karg_f64(p, k, op->f);
}

static void lower_decode_logits(Lower *L, int oi)
{
	Kernel *k = call(L, K_DECODE_LOGITS, oi);
	k->note = "the next token's logits";
	karg(L->p, k, KA_CTX, 0);
	arg_value(L, k, L->g->logits, true, false);
	karg_int(L->p, k, lelems(L->g, L->g->logits));
}

static void lower_op(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	LProg *p = L->p;
	Kernel *k;
	int x = op->nin ? op->in[0] : -1, y = op->nout ? op->out[0] : -1;
	switch (op->kind) {
	case OP_PARAM:
	case OP_TRANSPOSE: /* folded into consumers; materialised in lower() when needed */
		return;
	case OP_INPUT:
		if (g->decode)
			lower_decode_input(L, op, oi);
		else
			lower_input(L, op, oi);
		return;
	case OP_KV_CACHE: /* persistent state, written by the decode attention that reads it */
		return;
	case OP_DECODE_ATTENTION:
		lower_decode_attention(L, op, oi);
		return;
	case OP_FILL:
		lower_fill(L, op, oi);
		return;
	case OP_MATMUL:
		if (matmul_broadcasts(g, op))
			lower_bmm(L, op, oi, false);
		else
			lower_matmul(L, op, oi);
		return;
	case OP_MATMUL_WGRAD:
		if (!lower_wgrad(L, op, oi))
			lower_bmm(L, op, oi, true); /* a transposed activation (or gradient) */
		return;
	case OP_SPLIT_HEADS:
	case OP_MERGE_HEADS:
		lower_heads(L, op, oi);
		return;
	case OP_SUM_TO:
		lower_sum_to(L, op, oi);
		return;
	case OP_DROPOUT:
		lower_dropout(L, op, oi);
		return;
	case OP_CAUSAL_MASK:
		lower_causal_mask(L, op, oi);
		return;
	case OP_SOFTMAX:
		k = call(L, K_SOFTMAX, oi);
		arg_value(L, k, x, true, false);
		arg_value(L, k, y, false, true);
		karg_int(p, k, rows_of(g, x));
		karg_int(p, k, cols_of(g, x));
		return;
	case OP_SOFTMAX_GRAD:
		k = call(L, K_SOFTMAX_GRAD, oi);
		arg_value(L, k, op->in[0], true, false);
		arg_value(L, k, op->in[1], true, false);
		arg_value(L, k, y, false, true);
		karg_int(p, k, rows_of(g, x));
		karg_int(p, k, cols_of(g, x));
		return;
	case OP_LAYER_NORM:
	case OP_RMS_NORM:
		lower_norm(L, op, oi);
		return;
	case OP_LAYER_NORM_GRAD:
	case OP_RMS_NORM_GRAD:
		lower_norm_grad(L, op, oi);
		return;
	case OP_EMBED:
		lower_embed(L, op, oi);
		return;
	case OP_EMBED_GRAD:
		lower_embed_grad(L, op, oi);
		return;
	case OP_CROSS_ENTROPY:
		lower_cross_entropy(L, op, oi);
		return;
	case OP_ATTENTION:
	case OP_ATTENTION_GRAD:
		lower_attention(L, op, oi);
		return;
	case OP_UNARY_FN:
	case OP_UNARY_FN_GRAD:
	case OP_SUM_DIM:
	case OP_SUM_DIM_GRAD:
	case OP_MAX_DIM:
	case OP_MAX_DIM_GRAD:
	case OP_MSE_LOSS:
	case OP_MSE_LOSS_GRAD:
	case OP_NARROW:
	case OP_NARROW_GRAD:
	case OP_CONCAT:
	case OP_RESHAPE:
	case OP_SWAP_DIMS:
	case OP_REPEAT_KV:
	case OP_REPEAT_KV_GRAD:
	case OP_ROPE:
	case OP_ROPE_GRAD:
		lower_shape_op(L, op, oi);
		return;
	case OP_CROSS_ENTROPY_GRAD:
		lower_cross_entropy_grad(L, op, oi);
		return;
	case OP_SEND:
	case OP_RECV:
		if (op->role != RANKROLE_ANY || op->axis != g->ps->pipe_axis)
			lower_opaque(L, op, oi); /* async transfers: not executed by the C target */
		else
			lower_p2p(L, op, oi);
		return;
	case OP_ALL_REDUCE:
		if (op->internal)
			return; /* vocab-parallel cross-entropy's reductions: inside its kernel */
		/* fall through */
	case OP_REDUCE_SCATTER:
	case OP_ALL_GATHER:
	case OP_ALL_TO_ALL:
	case OP_SLICE:
		if (op->kind == OP_ALL_GATHER && g->vals[x].lay.on[op->axis] == LAYOUT_FLAT)
			lower_param_gather(L, op, oi);
		else
			lower_conversion(L, op, oi);
		return;
	default:
		if (elementwise(op->kind)) {
			if (!L->skip[oi])
				lower_elementwise(L, op, oi);
			return;
		}
		if (op_classes[op->kind] == OPK_MOE) {
			lower_moe(L, op, oi);
			return;
		}
		lower_opaque(L, op, oi);
	}
}

/* ------------------------------------------------------------------ buffers of graph values */

/* Shape and placement of value v's local block. */
static void describe_value(LProg *p, int v)
{
	Graph *g = p->g;
	PlanSpec *ps = g->ps;
	const Value *val = &g->vals[v];
	Buffer *b = &p->buf[v];
	b->value = v;
	b->dtype = val->dtype;
	b->rank = val->rank;
	bool flat = false; /* a ZeRO-3 parameter chunk */
	for (int a = 0; a < ps->naxes; a++)
		if (val->lay.on[a] == LAYOUT_FLAT && val->role == ROLE_PARAM)
			flat = true;
	for (int d = 0; d < val->rank; d++) {
		b->ldims[d] = ldim(g, v, d);
		b->split_axis[d] = b->split_outer[d] = -1;
		for (int a = 0; a < ps->naxes; a++)
			if (val->lay.on[a] == d) {
				b->split_outer[d] = b->split_axis[d];
				b->split_axis[d] = (signed char)a;
			}
	}
	b->elems = flat ? value_local_elems(g, v) : lelems(g, v);
	if (flat) {
		b->rank = 1;
		b->ldims[0] = b->elems;
		b->split_axis[0] = b->split_outer[0] = -1;
	}
	if (val->rank == 0) {
		b->rank = 1;
		b->ldims[0] = 1;
	}
	b->bytes = (size_t)b->elems * (size_t)dtype_bytes(val->dtype);
	b->micro_dim = -1;
	if (ps->batch_dim && !flat)
		for (int d = 0; d < val->rank; d++)
			if (val->dim_name[d] && !strcmp(val->dim_name[d], ps->batch_dim))
				b->micro_dim = d;
	b->micro_rows = ps->batch / (ps->micro_batches > 0 ? ps->micro_batches : 1);
	const char *base = val->name;
	if (val->role == ROLE_PARAM && val->name)
		b->name = identifier(g->arena, "p_", val->name, -1);
	else if (val->grad_of >= 0 && g->vals[val->grad_of].name && g->vals[val->grad_of].grad == v)
		b->name = identifier(g->arena, "g_", g->vals[val->grad_of].name, -1);
	else if (val->grad_of >= 0 && g->vals[val->grad_of].name) /* a partial gradient before a conversion */
		b->name = identifier(g->arena, "g_", g->vals[val->grad_of].name, v);
	else if (base)
		b->name = identifier(g->arena, "", base, v);
	else /* op names are identifiers */
		b->name = identifier(g->arena, "", val->def >= 0 ? op_names[g->ops[val->def].kind] : "v", v);
	b->what = val->name;
}

static bool on_prog(const LProg *p, const Op *op)
{
	if (op->role != RANKROLE_ANY && op->role != p->role)
		return false;
	return op->stage == p->stage;
}

/* What lowering keeps from one program of a plan to the next: arrays over the graph's values and
 * ops, put back after each program only where its ops changed them, so that lowering a stage costs
 * its ops, not the model's (a 64-stage plan lowers 64 programs).
 *   scratch     one blank buffer per graph value (no name yet: describe_value names those
 *               a program defines), the array a program lowers into; compact_prog then moves what
 *               it uses into the program's own;
 *   touched     the values the program's ops read, write or list (its ins, outs and members):
 *               every value whose blank buffer, consumer count or "kept" flag lowering may
 *               change. */
typedef struct Shared {
	Buffer *scratch;
	int cap;            /* scratch's size: the blank value buffers and the buffers lowering adds */
	Buffer proto;       /* a pristine blank value buffer (dtype, bytes and value set per value) */
	int *consumers;     /* per value (Lower.consumers) */
	bool *kept;         /* per value (Lower.kept) */
	bool *skip, *materialise; /* per op */
	int *chunk;         /* per op */
	int *moe_idx;       /* per value (program-independent), or NULL */
	int first_layer_op;
	int *touched, ntouched; /* this program's values, ascending */
	int *stamp;         /* per value: the program (+ 1) that touched it last */
	int *map;           /* compaction: old buffer -> new, -1 (per scratch buffer) */
	bool *seen;         /* compaction: named by a kernel (per scratch buffer) */
} Shared;

static void reset_value_buffer(const Graph *g, const Shared *sh, int v)
{
	Buffer *b = &sh->scratch[v];
	*b = sh->proto;
	b->dtype = g->vals[v].dtype;
	b->bytes = (size_t)dtype_bytes(b->dtype);
	b->value = v;
}

static void shared_init(Shared *sh, const Graph *g)
{
	memset(sh, 0, sizeof *sh);
	Buffer *x = &sh->proto;
	x->cls = BUF_NONE;
	x->elems = 1;
	x->view_of = x->view_axis = -1;
	x->rank = 1;
	x->ldims[0] = 1;
	for (int d = 0; d < MAX_DIMS; d++)
		x->split_axis[d] = x->split_outer[d] = -1;
	x->micro_dim = -1;
	x->first = x->last = -1;
	sh->cap = 2 * g->nvals + 64; /* lowering about doubles the buffers */
	sh->scratch = malloc(sizeof(Buffer) * (size_t)sh->cap);
	sh->consumers = calloc((size_t)g->nvals + 1, sizeof(int));
	sh->kept = calloc((size_t)g->nvals + 1, sizeof(bool));
	sh->skip = calloc((size_t)g->nops + 1, sizeof(bool));
	sh->materialise = calloc((size_t)g->nops + 1, sizeof(bool));
	sh->chunk = malloc(sizeof(int) * (size_t)(g->nops + 1));
	sh->touched = malloc(sizeof(int) * (size_t)(g->nvals + 1));
	sh->stamp = calloc((size_t)g->nvals + 1, sizeof(int));
	if (!sh->scratch || !sh->consumers || !sh->kept || !sh->skip || !sh->materialise || !sh->chunk || !sh->touched ||
	    !sh->stamp)
		ICE("out of memory");
	for (int v = 0; v < g->nvals; v++)
		reset_value_buffer(g, sh, v);
	sh->first_layer_op = g->nops;
	for (int i = 0; i < g->nops; i++) {
		sh->chunk[i] = -1;
		if (g->ops[i].layer >= 0 && sh->first_layer_op == g->nops && !g->ops[i].backward)
			sh->first_layer_op = i;
	}
	sh->moe_idx = g->has_moe ? moe_buffers(g) : NULL;
}

static void shared_free(Shared *sh)
{
	free(sh->scratch);
	free(sh->consumers);
	free(sh->kept);
	free(sh->skip);
	free(sh->materialise);
	free(sh->chunk);
	free(sh->touched);
	free(sh->stamp);
	free(sh->map);
	free(sh->seen);
	free(sh->moe_idx);
}

static int by_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

static void touch_value(Shared *sh, int v, int program)
{
	if (v >= 0 && sh->stamp[v] != program + 1) {
		sh->stamp[v] = program + 1;
		sh->touched[sh->ntouched++] = v;
	}
}

/* The values the program's ops touch and those state.c reads on its stage (sync.c's bucket
 * members and tied gradients), ascending, in sh->touched. */
static void touch_values(Shared *sh, const Graph *g, int stage, const int *ops, int nops, int program)
{
	sh->ntouched = 0;
	for (int t = 0; t < nops; t++) {
		const Op *op = &g->ops[ops[t]];
		for (int k = 0; k < op->nin; k++)
			touch_value(sh, op->in[k], program);
		for (int k = 0; k < op->nout; k++)
			touch_value(sh, op->out[k], program);
	}
	for (int i = 0; i < g->sync.nbuckets; i++)
		for (int k = 0; g->sync.buckets[i].stage == stage && k < g->sync.buckets[i].nmembers; k++)
			touch_value(sh, g->sync.buckets[i].members[k], program);
	for (int i = 0; i < g->sync.ntied; i++)
		if (g->sync.tied[i].stage[0] == stage || g->sync.tied[i].stage[1] == stage) {
			touch_value(sh, g->sync.tied[i].grad[0], program);
			touch_value(sh, g->sync.tied[i].grad[1], program);
		}
	qsort(sh->touched, (size_t)sh->ntouched, sizeof(int), by_int);
}

static LProg *lower_prog(Lowered *low, int stage, int role, Shared *sh)
{
	Graph *g = low->g;
	LProg *p = arena_alloc(g->arena, sizeof *p);
	arena_own(g->arena, (void **)&p->k);
	p->low = low;
	p->g = g;
	p->ps = g->ps;
	p->stage = stage;
	p->role = role;
	p->nchunks = g->sched && g->sched->chunks > 0 ? g->sched->chunks : 1;
	p->loss_metric = p->norm_metric = p->accuracy_metric = -1;
	p->opaque_op = -1;
	/* one buffer per graph value (the blank value buffers), then the buffers lowering makes */
	p->buf = sh->scratch;
	p->nbuf = g->nvals;
	p->capbuf = sh->cap;
	Lower L = {.p = p, .g = g, .consumers = sh->consumers, .kept = sh->kept, .skip = sh->skip,
		   .materialise = sh->materialise, .chunk = sh->chunk, .first_layer_op = sh->first_layer_op,
		   .moe_idx = sh->moe_idx};
	L.ops = lowered_stage_ops(low, stage, &L.nops);
	for (int t = 0; t < L.nops; t++) {
		const Op *op = &g->ops[L.ops[t]];
		if (!on_prog(p, op))
			continue;
		for (int k = 0; k < op->nin; k++) {
			L.consumers[op->in[k]]++;
			int d = g->vals[op->in[k]].def;
			if (op->backward && d >= 0 && !g->ops[d].backward)
				L.kept[op->in[k]] = true;
		}
	}
	/* what state.c reads: the gradient buckets' members, the tied pairs' gradients */
	for (int i = 0; i < g->sync.nbuckets; i++)
		for (int k = 0; g->sync.buckets[i].stage == stage && k < g->sync.buckets[i].nmembers; k++)
			L.consumers[g->sync.buckets[i].members[k]]++;
	for (int i = 0; i < g->sync.ntied; i++)
		if (g->sync.tied[i].stage[0] == stage || g->sync.tied[i].stage[1] == stage) {
			L.consumers[g->sync.tied[i].grad[0]]++;
			L.consumers[g->sync.tied[i].grad[1]]++;
		}
	/* buffers of the values this program defines */
	for (int t = 0; t < L.nops; t++) {
		const Op *op = &g->ops[L.ops[t]];
		if (!on_prog(p, op) || op->kind == OP_OPTIMIZER_STEP) /* the update: state.c */
			continue;
		for (int k = 0; k < op->nout; k++) {
			int v = op->out[k];
			describe_value(p, v);
			Buffer *b = &p->buf[v];
			if (op->kind == OP_PARAM || op->kind == OP_KV_CACHE) { /* a cache lives across decode steps */
				b->cls = BUF_STATE;
				b->state = op->kind == OP_PARAM ? SC_PARAM : SC_BUFFER;
			} else if (g->vals[v].grad_of >= 0) {
				b->cls = BUF_STATE;
				b->state = SC_GRAD;
			} else {
				b->cls = BUF_ARENA;
			}
		}
	}
	/* a transpose read by anything but a matmul is materialised; otherwise it is no buffer. A
	 * transpose of a transpose is a view too (a matmul reads through both, storage()): its
	 * source is materialised only when it is, as lower_transpose reads that source (the tied
	 * embedding's forward transpose, whose backward transposes it back for the input gradient's
	 * matmul, was copied every step and never read) */
	bool *materialise = L.materialise;
	for (int t = 0; t < L.nops; t++) {
		const Op *c = &g->ops[L.ops[t]];
		if (!on_prog(p, c) || c->kind == OP_MATMUL || c->kind == OP_TRANSPOSE)
			continue;
		for (int k = 0; k < c->nin; k++) {
			int d = g->vals[c->in[k]].def;
			if (d >= 0 && g->ops[d].kind == OP_TRANSPOSE)
				materialise[d] = true;
		}
	}
	for (int t = L.nops - 1; t >= 0; t--) {
		const Op *c = &g->ops[L.ops[t]];
		int d = c->kind == OP_TRANSPOSE && materialise[L.ops[t]] ? g->vals[c->in[0]].def : -1;
		if (d >= 0 && g->ops[d].kind == OP_TRANSPOSE)
			materialise[d] = true;
	}
	for (int t = 0; t < L.nops; t++) {
		int i = L.ops[t];
		if (g->ops[i].kind == OP_TRANSPOSE && on_prog(p, &g->ops[i]) && !materialise[i])
			p->buf[g->ops[i].out[0]].cls = BUF_NONE;
	}
	/* the loss metric: every stage has one (zero where the loss is not computed) */
	p->loss_metric = buffer_new(p, BUF_STATE, DT_F64, 1, "loss", "the step's mean loss");
	p->buf[p->loss_metric].state = SC_METRIC;
	accuracy_metric(&L);
	L.moe_stats = -1;
	if (g->has_moe) {
		long long n = moe_stats_offset(g, g->nops);
		L.moe_stats = buffer_new(p, BUF_STATE, DT_F64, n, "moe_stats", "the step's routing metrics");
		p->buf[L.moe_stats].state = SC_METRIC;
	}
	plan_fusion(&L);
	for (int t = 0; t < L.nops; t++) {
		int i = L.ops[t];
		const Op *op = &g->ops[i];
		if (!on_prog(p, op) || op->kind == OP_OPTIMIZER_STEP) /* the update: state.c */
			continue;
		if (op->kind == OP_TRANSPOSE) {
			if (materialise[i])
				lower_transpose(&L, op, i);
			continue;
		}
		lower_op(&L, op, i);
		if (g->decode && op->nout && op->out[0] == g->logits)
			lower_decode_logits(&L, i);
		if (op->nout && op->out[0] == g->loss) {
			Kernel *k = call(&L, K_LOSS_ACCUMULATE, i);
			k->note = "the step's loss";
			karg_buf(p, k, p->loss_metric, true, true);
			karg_buf(p, k, g->loss, true, false);
			karg_f64(p, k, 1.0 / (g->ps->micro_batches > 0 ? g->ps->micro_batches : 1));
		}
	}
	if (L.moe_stats >= 0)
		lower_moe_metrics(&L);
	return p;
}

/* Puts back what lowering program changed in the shared arrays: the blank value buffers, counts and
 * flags of its values (a transpose it materialised: the op of a value it read), its ops' flags. */
static void shared_reset(Shared *sh, const Graph *g, const int *ops, int nops)
{
	for (int i = 0; i < sh->ntouched; i++) {
		int v = sh->touched[i];
		reset_value_buffer(g, sh, v);
		sh->consumers[v] = 0;
		sh->kept[v] = false;
		if (g->vals[v].def >= 0)
			sh->materialise[g->vals[v].def] = false;
	}
	for (int t = 0; t < nops; t++)
		sh->skip[ops[t]] = sh->materialise[ops[t]] = false;
}


/* ------------------------------------------------------------------ bf16 storage */

/* Compute kernels of planrt take f32: a bf16 operand is cast into an f32 copy in the transient
 * region before the call (when it is read, or accumulated into) and cast back after (when it is
 * written). */
static bool takes_f32_only(KernelKind k)
{
	switch (k) {
	case K_MATMUL:
	case K_PERMUTE:
	case K_MOE_ROUTE:
	case K_MOE_ROUTE_GRAD:
	case K_MOE_DISPATCH:
	case K_MOE_DISPATCH_GRAD:
	case K_MOE_COMBINE:
	case K_MOE_COMBINE_GRAD:
	case K_MOE_AUX_LOSS:
	case K_MOE_AUX_LOSS_GRAD:
	case K_MOE_Z_LOSS:
	case K_MOE_Z_LOSS_GRAD:
	case K_SUM_TO:
	case K_SUM_TO_ACC:
	case K_DROPOUT:
	case K_CAUSAL_MASK:
	case K_SOFTMAX:
	case K_SOFTMAX_GRAD:
	case K_LAYER_NORM:
	case K_LAYER_NORM_GRAD:
	case K_RMS_NORM:
	case K_RMS_NORM_GRAD:
	case K_EMBED:
	case K_EMBED_GRAD:
	case K_CROSS_ENTROPY:
	case K_CE_GRAD:
	case K_BMM:
	case K_UNARY:
	case K_UNARY_GRAD:
	case K_SUM_DIM:
	case K_SUM_DIM_GRAD:
	case K_MAX_DIM:
	case K_MAX_DIM_GRAD:
	case K_NARROW:
	case K_NARROW_GRAD:
	case K_REPEAT_KV:
	case K_REPEAT_KV_GRAD:
	case K_ROPE:
	case K_ROPE_GRAD:
	case K_REGRESSION_LOSS:
	case K_REGRESSION_LOSS_GRAD:
	case K_ATTENTION:
	case K_ATTENTION_GRAD:
	case K_DECODE_ATTENTION:
	case K_DECODE_LOGITS:
		return true;
	default:
		return false;
	}
}

static bool listed(const int *a, int n, int x)
{
	for (int i = 0; i < n; i++)
		if (a[i] == x)
			return true;
	return false;
}

static Kernel cast_kernel(LProg *p, const Kernel *around, int from, int to, long long n)
{
	Kernel c;
	memset(&c, 0, sizeof c);
	c.kind = K_CAST;
	c.phase = around->phase;
	c.chunk = around->chunk;
	c.op = around->op;
	c.out = -1;
	c.only_last_micro = around->only_last_micro;
	c.note = p->buf[buffer_root(p, from)].dtype == DT_F16 || p->buf[buffer_root(p, to)].dtype == DT_F16
		 ? "f16 storage, f32 compute" : "bf16 storage, f32 compute";
	karg_buf(p, &c, from, true, false);
	karg(p, &c, KA_DTYPE, p->buf[from].dtype);
	karg_buf(p, &c, to, false, true);
	karg(p, &c, KA_DTYPE, p->buf[to].dtype);
	karg_int(p, &c, n);
	return c;
}

/* a buffer argument's element type, -1 for any other argument */
static int root_dtype(const LProg *p, const KArg *a)
{
	return a->kind == KA_BUF ? (int)p->buf[buffer_root(p, a->buf)].dtype : -1;
}

/* A GEMM of two bf16 operands (or two f16 ones) reads them as they are (f32 accumulation) and
 * writes C in its own dtype, f32 or the operands': the same arguments as the f32 GEMM's, with C's
 * dtype after C. */
static bool matmul_reads_16(LProg *p, Kernel *k)
{
	if (k->kind != K_MATMUL)
		return false;
	int ab = root_dtype(p, KARG(k, MATMUL, A)), c = root_dtype(p, KARG(k, MATMUL, C));
	if ((ab != DT_BF16 && ab != DT_F16) || root_dtype(p, KARG(k, MATMUL, B)) != ab || (c != DT_F32 && c != ab))
		return false;
	const KArg *old = k->args;
	int n = k->nargs, at_c = KARG_INDEX(MATMUL, C);
	k->kind = ab == DT_BF16 ? K_MATMUL_BF16 : K_MATMUL_F16;
	k->args = NULL;
	k->nargs = k->capargs = 0;
	for (int a = 0; a < n; a++) {
		push_arg(p, k, &old[a], a == at_c);
		if (a == at_c) {
			KArg t = blank_arg(KA_DTYPE);
			t.i = c;
			push_arg(p, k, &t, false);
		}
	}
	return true;
}

/* A permute whose input and output are stored in one 2-byte type (bf16, f16) moves them as they
 * are: the values widening, permuting in f32 and narrowing would give (a NaN keeps its payload,
 * which the narrowing made the quiet NaN), without the two casts and their f32 copies. */
static bool permute_moves_16(LProg *p, Kernel *k)
{
	if (k->kind != K_PERMUTE)
		return false;
	int in = root_dtype(p, KARG(k, PERMUTE, in)), out = root_dtype(p, KARG(k, PERMUTE, out));
	if (in != out || (in != DT_BF16 && in != DT_F16))
		return false;
	k->kind = K_PERMUTE_16; /* the same arguments, in the same order */
	return true;
}

/* Kinds with a variant that reads and writes the buffers of its IN and OUT parameters in their
 * 16-bit storage type, named by its last parameter (`storage`): each element widened to f32 as it is
 * read and rounded once as it is written, the arithmetic the f32 kind's. Every other parameter is
 * the f32 kind's, in its order, and statistics stay f32. The gradients summed over rows (a norm's
 * weight gradient, a bias gradient: ACC parameters) are taken as stored when they are stored in the
 * storage type (`acc`, before `storage`): the kernel widens them, sums in f32 and rounds each once,
 * the casts around the call it replaces, so the step has no f32 copy of them; else they are f32 and
 * cast around the call. */
static const KernelKind storage_16_variants[][2] = {
	{K_SUM_TO, K_SUM_TO_16},
	{K_SUM_TO_ACC, K_SUM_TO_ACC_16},
	{K_LAYER_NORM, K_LAYER_NORM_16},
	{K_LAYER_NORM_GRAD, K_LAYER_NORM_GRAD_16},
	{K_RMS_NORM, K_RMS_NORM_16},
	{K_RMS_NORM_GRAD, K_RMS_NORM_GRAD_16},
	{K_ATTENTION, K_ATTENTION_16},
	{K_ATTENTION_GRAD, K_ATTENTION_GRAD_16},
	{K_CROSS_ENTROPY, K_CROSS_ENTROPY_16},
	{K_CE_GRAD, K_CE_GRAD_16},
	{K_ROPE, K_ROPE_16},
	{K_ROPE_GRAD, K_ROPE_GRAD_16},
	{K_EMBED, K_EMBED_16},
	{K_DROPOUT, K_DROPOUT_16},
};

/* The 16-bit variant when every buffer its IN / OUT parameters take is stored in one 16-bit type
 * (bf16 or f16) and none of its OUT buffers is accumulated into (their old value would be rounded
 * again); else the kernel keeps its kind and its casts. A context-parallel plan's attention keeps
 * them too (the ring passes K/V blocks stored and casts each into the f32 copy its step reads). */
static bool reads_storage_16(LProg *p, Kernel *k)
{
	KernelKind v = K_COUNT;
	for (size_t i = 0; i < sizeof storage_16_variants / sizeof storage_16_variants[0]; i++)
		if (storage_16_variants[i][0] == k->kind)
			v = storage_16_variants[i][1];
	int acc_at = v == K_COUNT ? -1 : kernel_acc_param(v);
	if (v == K_COUNT || k->nargs + 1 + (acc_at >= 0) != kernel_nparams[v])
		return false;
	/* the ring (ring.c, after lowering) replaces the plain attention kernels of a context-parallel
	 * plan, reading its f32 copies of K and V */
	if ((v == K_ATTENTION_16 || v == K_ATTENTION_GRAD_16) && p->ps->ring_axis >= 0)
		return false;
	int storage = -1;
	for (int a = 0; a < k->nargs; a++) {
		KParamType t = kernel_params[v][a].type;
		if ((t != KPT_IN && t != KPT_OUT) || k->args[a].kind != KA_BUF)
			continue;
		int d = root_dtype(p, &k->args[a]);
		if ((d != DT_BF16 && d != DT_F16) || (storage >= 0 && d != storage))
			return false;
		if (t == KPT_OUT && listed(k->uses, k->nuses, k->args[a].buf))
			return false;
		storage = d;
	}
	if (storage < 0)
		return false;
	int acc = storage; /* the ACC buffers as stored when every one is in the storage type */
	for (int a = 0; a < k->nargs; a++)
		if (kernel_params[v][a].type == KPT_ACC && k->args[a].kind == KA_BUF && root_dtype(p, &k->args[a]) != storage)
			acc = DT_F32;
	k->kind = v;
	if (acc_at >= 0) {
		KArg t = blank_arg(KA_DTYPE);
		t.i = acc;
		push_arg(p, k, &t, false);
	}
	KArg s = blank_arg(KA_DTYPE);
	s.i = storage;
	push_arg(p, k, &s, false);
	return true;
}

/* a buffer argument the kernel takes as f32: every buffer of an f32-only kind; a 16-bit variant's
 * F32 parameters, and its ACC ones when its `acc` is f32 */
static bool takes_f32_at(const Kernel *k, int a)
{
	if (kernel_storage_param(k->kind) < 0)
		return true;
	KParamType t = kernel_params[k->kind][a].type;
	if (t == KPT_ACC)
		return k->args[kernel_acc_param(k->kind)].i == DT_F32;
	return t == KPT_F32_IN || t == KPT_F32_OUT;
}

static void lower_conversions(LProg *p)
{
	Inserts casts = {0};
	int nk = p->nk;
	for (int i = 0; i < nk; i++) {
		if (matmul_reads_16(p, &p->k[i]) || permute_moves_16(p, &p->k[i]))
			continue;
		if (!reads_storage_16(p, &p->k[i]) && !takes_f32_only(p->k[i].kind))
			continue;
		for (int a = 0; a < p->k[i].nargs; a++) {
			Kernel *k = &p->k[i];
			if (k->args[a].kind != KA_BUF || !takes_f32_at(k, a))
				continue;
			int b = k->args[a].buf;
			DType stored = p->buf[buffer_root(p, b)].dtype;
			if (stored != DT_BF16 && stored != DT_F16)
				continue;
			bool in = listed(k->uses, k->nuses, b), out = listed(k->defs, k->ndefs, b);
			long long elems = p->buf[b].elems;
			int c = buffer_new(p, BUF_ARENA, DT_F32, elems, "f32_copy", p->buf[b].what);
			k->args[a].buf = c;
			for (int u = 0; u < k->nuses; u++)
				if (k->uses[u] == b)
					k->uses[u] = c;
			for (int d = 0; d < k->ndefs; d++)
				if (k->defs[d] == b)
					k->defs[d] = c;
			if (in || !out)
				inserts_add(&casts, cast_kernel(p, k, b, c, elems), i);
			if (out)
				inserts_add(&casts, cast_kernel(p, k, c, b, elems), i + 1);
		}
	}
	inserts_apply(p, &casts);
}

/* ------------------------------------------------------------------ compaction
 * Lowering addresses a value's buffer by the value's number, so a program starts with a
 * blank buffer for every graph value, and a pipeline stage uses a share of them (1/64 of a 64-stage
 * model's). Once lowered, a program keeps the buffers it defines or references, in their order
 * (the value buffers first, by value), in an array of its own; every reference is renumbered, and
 * lprog_value_buffer finds a value's buffer by binary search. A plan's programs then hold their
 * stages' buffers, not stages times the model's. */

static int renumber(void *map, int b)
{
	int n = ((const int *)map)[b];
	internal_assert(n >= 0); /* a buffer the program names is one it keeps */
	return n;
}

/* The program's buffers: its values (sh->touched) and those lowering added ([nvals, nbuf)); kept
 * when on the program or named by a kernel, and what a kept view views. */
static void compact_prog(LProg *p, Shared *sh, int nvals)
{
	int nb = p->nbuf;
	if (nb > sh->cap || !sh->map) { /* lowering may have outgrown the scratch (buffer_new) */
		sh->map = realloc(sh->map, sizeof(int) * (size_t)(nb > sh->cap ? nb : sh->cap));
		sh->seen = realloc(sh->seen, sizeof(bool) * (size_t)(nb > sh->cap ? nb : sh->cap));
		if (!sh->map || !sh->seen)
			ICE("out of memory");
		for (int b = 0; b < (nb > sh->cap ? nb : sh->cap); b++) {
			sh->map[b] = -1;
			sh->seen[b] = false;
		}
	}
	sh->scratch = p->buf; /* buffer_new may have moved it */
	if (nb > sh->cap)
		sh->cap = nb;
	int *map = sh->map;
	bool *seen = sh->seen;
	for (int i = 0; i < p->nk; i++)
		kernel_buffers(&p->k[i], seen);
	if (p->loss_metric >= 0)
		seen[p->loss_metric] = true;
	if (p->accuracy_metric >= 0)
		seen[p->accuracy_metric] = true;
	for (int i = 0; i < sh->ntouched; i++)
		seen[sh->touched[i]] |= p->buf[sh->touched[i]].cls != BUF_NONE;
	for (int b = nvals; b < nb; b++)
		seen[b] |= p->buf[b].cls != BUF_NONE;
	for (bool grew = true; grew;) { /* a kept view keeps what it views (an added view's base may be a value) */
		grew = false;
		for (int b = nb - 1; b >= nvals; b--)
			if (seen[b] && p->buf[b].cls == BUF_VIEW && p->buf[b].view_of >= 0 && !seen[p->buf[b].view_of])
				grew = seen[p->buf[b].view_of] = true;
		for (int i = sh->ntouched - 1; i >= 0; i--) {
			int b = sh->touched[i];
			if (seen[b] && p->buf[b].cls == BUF_VIEW && p->buf[b].view_of >= 0 && !seen[p->buf[b].view_of])
				grew = seen[p->buf[b].view_of] = true;
		}
	}
	int n = 0;
	for (int i = 0; i < sh->ntouched; i++)
		if (seen[sh->touched[i]])
			map[sh->touched[i]] = n++;
	p->nvalbufs = n;
	for (int b = nvals; b < nb; b++)
		if (seen[b])
			map[b] = n++;
	int cap = n + n / 4 + 16; /* the later passes add buffers */
	Buffer *bufs = malloc(sizeof(Buffer) * (size_t)cap);
	if (!bufs)
		ICE("out of memory");
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0, end = pass ? nb - nvals : sh->ntouched; i < end; i++) {
			int b = pass ? nvals + i : sh->touched[i];
			if (!seen[b])
				continue;
			Buffer *x = &bufs[map[b]];
			*x = p->buf[b];
			if (x->view_of >= 0)
				x->view_of = map[x->view_of];
			if (!x->name) /* a value of another stage a kernel names (the verifier reports it) */
				x->name = arena_printf(p->g->arena, "v_%d", b);
		}
	for (int i = 0; i < p->nk; i++)
		kernel_map_buffers(p, &p->k[i], renumber, map);
	if (p->loss_metric >= 0)
		p->loss_metric = map[p->loss_metric];
	if (p->accuracy_metric >= 0)
		p->accuracy_metric = map[p->accuracy_metric];
	for (int i = 0; i < sh->ntouched; i++) /* the shared arrays as they were */
		map[sh->touched[i]] = -1, seen[sh->touched[i]] = false;
	for (int b = nvals; b < nb; b++)
		map[b] = -1, seen[b] = false;
	p->buf = bufs;
	p->nbuf = n;
	p->capbuf = cap;
	p->name_base += nb - n; /* a buffer added later is numbered past every name made before */
	arena_own(p->g->arena, (void **)&p->buf);
}

static void expr_buffers(const LExpr *e, bool *seen)
{
	for (; e; e = e->b) {
		if (e->kind == LX_LOAD)
			seen[e->buf] = true;
		expr_buffers(e->a, seen);
	}
}

/* Marks the buffers kernel k names in seen. */
void kernel_buffers(const Kernel *k, bool *seen)
{
	for (int a = 0; a < k->nargs; a++) {
		const KArg *x = &k->args[a];
		if (x->kind == KA_BUF || x->kind == KA_OFFSET || x->kind == KA_SCALAR)
			seen[x->buf] = true;
		else if (x->kind == KA_BUFS)
			for (int j = 0; j < x->n; j++)
				seen[x->bufs[j]] = true;
	}
	for (int u = 0; u < k->nuses; u++)
		seen[k->uses[u]] = true;
	for (int d = 0; d < k->ndefs; d++)
		seen[k->defs[d]] = true;
	if (k->kind == K_LOOP && k->out >= 0)
		seen[k->out] = true;
	if (k->kind == K_LOOP)
		expr_buffers(k->expr, seen);
}

static LExpr *map_expr(LProg *p, const LExpr *e, int (*f)(void *, int), void *ctx)
{
	if (!e)
		return NULL;
	LExpr *c = arena_alloc(p->g->arena, sizeof *c);
	*c = *e;
	if (c->kind == LX_LOAD)
		c->buf = f(ctx, c->buf);
	c->a = map_expr(p, e->a, f, ctx);
	c->b = map_expr(p, e->b, f, ctx);
	return c;
}

/* Every buffer kernel k names becomes f(ctx, buffer); the lists and expression it changes are
 * copied first (a kernel copied by a pass may share them with its original). */
void kernel_map_buffers(LProg *p, Kernel *k, int (*f)(void *, int), void *ctx)
{
	Arena *a = p->g->arena;
	for (int i = 0; i < k->nargs; i++) {
		KArg *x = &k->args[i];
		if (x->kind == KA_BUF || x->kind == KA_OFFSET || x->kind == KA_SCALAR)
			x->buf = f(ctx, x->buf);
		else if (x->kind == KA_BUFS) {
			int *bufs = arena_alloc(a, sizeof(int) * (size_t)(x->n ? x->n : 1));
			for (int j = 0; j < x->n; j++)
				bufs[j] = f(ctx, x->bufs[j]);
			x->bufs = bufs;
		}
	}
	int *lists = arena_alloc(a, sizeof(int) * (size_t)(k->nuses + k->ndefs + 1));
	for (int u = 0; u < k->nuses; u++)
		lists[u] = f(ctx, k->uses[u]);
	for (int d = 0; d < k->ndefs; d++)
		lists[k->nuses + d] = f(ctx, k->defs[d]);
	k->uses = lists;
	k->capuses = k->nuses;
	k->defs = lists + k->nuses;
	k->capdefs = k->ndefs;
	if (k->kind == K_LOOP) {
		if (k->out >= 0)
			k->out = f(ctx, k->out);
		k->expr = map_expr(p, k->expr, f, ctx);
	}
}

int lprog_value_buffer(const LProg *p, int v)
{
	int lo = 0, hi = p->nvalbufs;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (p->buf[mid].value < v)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < p->nvalbufs && p->buf[lo].value == v ? lo : -1;
}

/* ------------------------------------------------------------------ the plan */

/* The ops on each stage, in order, once: every pass that works on one stage's program walks these,
 * not the model's ops. */
static void stage_ops_index(Lowered *low)
{
	Graph *g = low->g;
	int ns = g->nstages;
	low->stage_first = arena_alloc(g->arena, sizeof(int) * (size_t)(ns + 2));
	for (int pass = 0; pass < 2; pass++) {
		int *at = pass ? calloc((size_t)ns + 1, sizeof(int)) : NULL;
		if (pass && !at)
			ICE("out of memory");
		for (int i = 0; i < g->nops; i++) {
			int on = g->ops[i].stage;
			if (on < 0 || on >= ns)
				continue;
			if (pass)
				low->stage_op[low->stage_first[on] + at[on]++] = i;
			else
				low->stage_first[on + 1]++;
		}
		if (!pass) {
			for (int st = 0; st < ns; st++)
				low->stage_first[st + 1] += low->stage_first[st];
			low->stage_op = arena_alloc(g->arena, sizeof(int) * (size_t)(low->stage_first[ns] + 1));
		}
		free(at);
	}
}

const int *lowered_stage_ops(const Lowered *low, int stage, int *n)
{
	*n = low->stage_first[stage + 1] - low->stage_first[stage];
	return low->stage_op + low->stage_first[stage];
}

LProg *lowered_prog(const Lowered *low, int stage, int role)
{
	for (int i = 0; i < low->nprogs; i++)
		if (low->progs[i]->stage == stage && (low->nroles == 1 || low->progs[i]->role == role))
			return low->progs[i];
	return NULL;
}

/* The parameter table: every parameter of every stage, originals saved, tied copies not. */
static void param_table(Lowered *low)
{
	Graph *g = low->g;
	low->params = arena_alloc(g->arena, sizeof(ParamEntry) * (size_t)(g->nops + 1));
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind != OP_PARAM)
			continue;
		int v = op->out[0];
		const Value *val = &g->vals[v];
		ParamEntry *e = &low->params[low->nparams++];
		e->name = val->name;
		e->value = v;
		e->stage = op->stage;
		e->rank = val->rank;
		for (int d = 0; d < val->rank; d++) {
			e->gdims[d] = val->dim[d];
			e->ldims[d] = val->dim[d];
			e->split_axis[d] = -1;
			for (int a = 0; a < g->ps->naxes; a++)
				if (val->lay.on[a] == d) {
					e->ldims[d] /= g->ps->axes[a].size;
					e->split_axis[d] = (signed char)a;
				}
		}
		e->init_kind = val->init_kind;
		e->init_a = val->init_a;
		e->init_b = val->init_b;
		e->saved = val->tied_to < 0 && !(val->buffer && val->init_kind >= INIT_ARANGE && val->init_kind <= INIT_ROPE_SIN);
	}
}

Lowered *lower(Graph *g)
{
	Lowered *low = arena_alloc(g->arena, sizeof *low);
	low->g = g;
	low->ps = g->ps;
	low->nroles = g->sync.mode == SYNC_ASYNC ? 2 : 1; /* sync.c's: async masters and workers */
	low->progs = arena_alloc(g->arena, sizeof(LProg *) * (size_t)(g->nstages * low->nroles));
	/* tied-parameter pair groups (sync.c's tied gradients) */
	for (int i = 0; i < g->sync.ntied; i++) {
		const TiedGrads *t = &g->sync.tied[i];
		bool known = false;
		for (int q = 0; q < low->npairs; q++)
			if (low->pair_a[q] == t->stage[0] && low->pair_b[q] == t->stage[1])
				known = true;
		if (known)
			continue;
		if (low->npairs == 64)
			ICE("more than 64 tied-parameter groups");
		low->pair_a[low->npairs] = t->stage[0];
		low->pair_b[low->npairs++] = t->stage[1];
	}
	param_table(low);
	low->vocab = 256;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind == OP_INPUT && g->vals[op->out[0]].rank == 2 && !low->seq)
			low->seq = g->vals[op->out[0]].dim[1];
		if (op->kind == OP_EMBED) {
			low->vocab = g->vals[op->in[0]].dim[0];
			break;
		}
	}
	stage_ops_index(low);
	Shared sh;
	shared_init(&sh, g);
	for (int s = 0; s < g->nstages; s++)
		for (int r = 0; r < low->nroles; r++) {
			int role = low->nroles == 1 ? RANKROLE_ANY : r == 0 ? RANKROLE_MASTER : RANKROLE_WORKER;
			int nops;
			const int *ops = lowered_stage_ops(low, s, &nops);
			touch_values(&sh, g, s, ops, nops, low->nprogs);
			LProg *p = lower_prog(low, s, role, &sh);
			lower_conversions(p);
			compact_prog(p, &sh, g->nvals);
			shared_reset(&sh, g, ops, nops);
			low->progs[low->nprogs++] = p;
		}
	shared_free(&sh);
	return low;
}

/* ------------------------------------------------------------------ dump */

static void dump_arg(FILE *out, const LProg *p, const KArg *a)
{
	switch (a->kind) {
	case KA_BUF:
		fprintf(out, "%s", p->buf[a->buf].name);
		break;
	case KA_NULL:
		fprintf(out, "null");
		break;
	case KA_BUFS:
		fprintf(out, "[%d buffers]", a->n);
		break;
	case KA_INT:
		fprintf(out, "%lld", a->i);
		break;
	case KA_INTS:
		fprintf(out, "{");
		for (int i = 0; i < a->n; i++)
			fprintf(out, "%s%lld", i ? "," : "", a->ints[i]);
		fprintf(out, "}");
		break;
	case KA_F64:
		fprintf(out, "%g", a->f);
		break;
	case KA_DTYPE:
		fprintf(out, "%s", dtype_name((DType)a->i));
		break;
	case KA_AXIS:
		fprintf(out, "axis %s", p->ps->axes[a->i].name);
		break;
	case KA_PAIR:
		fprintf(out, "pair %lld", a->i);
		break;
	case KA_REQ:
		fprintf(out, "&%s", p->handles[a->i].name);
		break;
	case KA_SLOTREQ:
		fprintf(out, "slot request %lld", a->i);
		break;
	case KA_COORD:
		fprintf(out, "%lld + coord(%s) * %lld", a->i, a->axis >= 0 ? p->ps->axes[a->axis].name : "-", a->stride);
		break;
	case KA_OFFSET:
		fprintf(out, "%s(%s, %d)", a->i ? "second_half" : "offset", p->buf[a->buf].name, a->dim);
		break;
	case KA_SCALAR:
		fprintf(out, "%s[0] * %g", p->buf[a->buf].name, a->f);
		break;
	case KA_PARAM:
		fprintf(out, "param %lld", a->i);
		break;
	case KA_CTX:
		fprintf(out, "ctx");
		break;
	case KA_STEP:
		fprintf(out, "step");
		break;
	case KA_STEP_SEED:
		fprintf(out, "step_seed");
		break;
	case KA_STR:
		fprintf(out, "\"%s\"", a->str);
		break;
	}
}

static const char *class_name(BufClass c)
{
	static const char *const names[] = {"none", "state", "arena", "slot", "inbox", "view"};
	return names[c];
}

void lprog_dump(FILE *out, const LProg *p)
{
	fprintf(out, "# stage %d%s: %d kernels, %d buffers\n", p->stage,
		p->role == RANKROLE_MASTER ? " (master)" : p->role == RANKROLE_WORKER ? " (workers)" : "", p->nk, p->nbuf);
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		fprintf(out, "%5d %-16s c%d %s%s(", i, phase_names[k->phase], k->chunk, k->only_last_micro ? "[last micro] " : "",
			kernel_names[k->kind]);
		if (k->kind == K_LOOP) {
			fprintf(out, "%s %s %d ops", p->buf[k->out].name, k->accumulate ? "+=" : "=", k->nfused);
		} else if (k->kind == K_OPAQUE) {
			fprintf(out, "%s", k->op >= 0 ? op_names[p->g->ops[k->op].kind] : "?");
		} else {
			for (int a = 0; a < k->nargs; a++) {
				if (a)
					fprintf(out, ", ");
				dump_arg(out, p, &k->args[a]);
			}
		}
		fprintf(out, ")");
		if (k->bucket >= 0)
			fprintf(out, " {bucket %d}", k->bucket);
		for (int c = 0; c < k->ncomm; c++) {
			const Comm *cm = &k->comm[c];
			fprintf(out, " [%s %lld %s on %s%s]", op_names[cm->coll], cm->elems, dtype_name(cm->dtype),
				cm->pair >= 0 ? "pair " : "", cm->axis >= 0 ? p->ps->axes[cm->axis].name : "?");
		}
		fprintf(out, "\n");
	}
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls == BUF_NONE)
			continue;
		fprintf(out, "  buffer %-40s %-5s %s %lld", x->name, class_name(x->cls), dtype_name(x->dtype), x->elems);
		if (x->cls == BUF_STATE)
			fprintf(out, " %s", state_kind_names[x->state]);
		if (x->cls == BUF_VIEW)
			fprintf(out, " of %s + %lld%s%s", p->buf[x->view_of].name, x->view_off,
				x->view_axis >= 0 ? " + coord " : x->view_axis == VIEW_SLOT ? " + slot" : "",
				x->view_axis >= 0 ? p->ps->axes[x->view_axis].name : "");
		if (buf_class_transient(x->cls))
			fprintf(out, " @%zu live %d..%d", x->offset, x->first, x->last);
		fprintf(out, "\n");
	}
	if (p->arena_bytes)
		fprintf(out, "  arena %zu bytes: transient %zu, %d slot%s of %zu at %zu, %d inbox%s of %zu at %zu\n",
			p->arena_bytes, p->transient_bytes, p->nslots, p->nslots == 1 ? "" : "s", p->slot_bytes, p->slot_offset,
			p->ninbox, p->ninbox == 1 ? "" : "es", p->inbox_bytes, p->inbox_offset);
}
