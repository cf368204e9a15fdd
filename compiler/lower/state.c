/* state.c: the persistent state of every stage program, and the phases around the micro-batches.
 *
 * Lowering (lower.c) leaves each parameter and gradient accumulator as a buffer of its own. This
 * pass decides how state is stored and writes the kernels that maintain it:
 *
 *   gradient buckets  The buckets sync.c formed on the primary axis (the ZeRO axis, else the axis
 *                     that reduces the most gradient bytes) become flat buffers, and each member
 *                     gradient a view into one (PyTorch DDP's gradient_as_bucket_view): the bucket
 *                     is reduced in place, with no copy. Buckets on other axes (sequence-parallel
 *                     layer-norm gradients) are packed into a transient buffer and unpacked.
 *   ZeRO 1 and 2      Megatron's distributed-optimizer layout: a bucket is padded to a multiple of
 *                     the ZeRO axis size N and rank r owns the contiguous shard r. Parameters of a
 *                     bucket are views into a flat parameter buffer in the same order, so after
 *                     the update one in-place all-gather per bucket makes them whole. ZeRO 1 keeps
 *                     whole gradients (reduce-scattered in place at the end of the step); ZeRO 2
 *                     keeps only a gradient shard: whole gradients live in the transient region,
 *                     bucket by bucket, during each micro-batch's backward.
 *   ZeRO 3            Parameters are per-tensor chunks (zero.c gathers them before each use), as
 *                     are their gradient shards; whole gradients are transient, reduce-scattered
 *                     every micro-batch into the chunks by packed buckets.
 *   optimizer state   Moments (and f32 master weights for lower-precision parameters) for exactly
 *                     the elements the rank updates: its shard, its chunk, or the whole block.
 *
 * So the persistent state per rank is the ZeRO paper's: 16 Psi without ZeRO (bf16 with f32
 * master weights and Adam), 4 Psi + 12 Psi / N with ZeRO 1, 2 Psi + 14 Psi / N with ZeRO 2 and
 * 16 Psi / N with ZeRO 3, plus padding to whole chunks and the metric scalars.
 *
 * Phases written here: init (parameters drawn or read, master weights, the tied-parameter pair
 * communicators), step_begin (zero the gradients and metrics), the synchronisation that ZeRO 2
 * and 3 run every micro-batch at the end of the backward, step (tied-parameter reductions,
 * buckets, the gradient norm and clipping, the optimizer, master-weight casts, ZeRO gathers, the
 * loss reduction) and save (each rank writes the parameter pieces it holds).
 *
 * The other sync strategies (docs/sync.md) change how the batch axis agrees:
 *   compression       the batch axis's flat buckets are reduced by a compressor kernel (bf16 / fp16
 *                     on the wire, top-k entries and indices gathered, PowerSGD's factors reduced),
 *                     with an error-feedback residual per bucket; what the optimizer sees is the
 *                     decompressed sum, in the bucket, and the rest of the step is strict's;
 *   local SGD         every parameter of the stage lies in one flat buffer; each replica clips and
 *                     steps on its own gradient (scaled to its own mean) with its own optimizer
 *                     state, and every K steps one kernel averages the parameters (or the f32 master
 *                     weights) over the batch axis, with the optional outer optimizer, and the last
 *                     K losses;
 *   async             parameters and gradients are flat; a worker pulls parameters at step_begin
 *                     (at most `staleness` versions old) and pushes its gradient, loss and version
 *                     at the step's end; the master posts the workers' receives at step_begin, adds
 *                     their gradients into its own after the backward, steps the optimizer alone and
 *                     publishes the new version to every worker. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

typedef struct Update {
	int op;             /* the optimizer_step op */
	int param, grad;    /* buffers (graph values) */
	int flat;           /* the flat bucket holding the gradient, or -1 */
	long long off;      /* the gradient's (and parameter's) offset in that bucket */
	long long n;        /* elements of the local block */
	long long replicas; /* identical copies of the gradient across the mesh; 0: a tied copy (its
			     * original is counted) */
	int chunk_grad;     /* ZeRO 3: the gradient shard buffer */
	int master, m, v;   /* buffers, or -1 (offload optimizer -> disk: in the record instead) */
} Update;

typedef struct Flat {
	int bucket;         /* its gradient bucket (g->sync.buckets) */
	int *upd;
	int nupd;
	long long total;    /* member elements, padded to chunk * N under ZeRO */
	long long chunk;    /* ZeRO: each rank's shard */
	int grad;           /* buffer: the flat gradients */
	int param;          /* ZeRO 1/2: the flat parameters */
	int grad_shard;     /* ZeRO 2: this rank's gradient shard */
	int master, m, v;   /* the shard's optimizer state */
} Flat;

/* An optimizer call with offloaded state (offload below): a piece of a ZeRO 1/2 bucket shard, or
 * of an update's whole block or ZeRO-3 chunk. */
typedef struct Group {
	Flat *f;            /* one of the two */
	Update *u;
	int target;         /* the parameters it updates */
	int grad;           /* their gradients */
	long long at;       /* the piece's first element in the shard, block or chunk */
	long long n;        /* elements */
	long long rec;      /* disk: the record's byte offset in the state file */
} Group;

typedef struct State {
	LProg *p;
	Graph *g;
	PlanSpec *ps;
	const int *ops;     /* the ops on this program's stage (lowered_stage_ops) */
	int nops;
	int *upd_of_grad, *upd_of_param, *param_of; /* per value buffer: its update, parameter table
						     * entry, or -1 */
	Update *u;
	int nu;
	Flat *f;
	int nf;
	int zero, za, zn;   /* ZeRO stage in effect (0 when its axis has size 1), axis, size */
	int primary;        /* the axis of the flat buckets, or -1 */
	int moments;
	bool low;           /* parameters below f32: f32 master weights */
	int sumsq, coef;    /* metric buffers */
	/* sync strategies */
	int sa;             /* local SGD and async: the batch axis they run on (size > 1), else -1 */
	bool local, master, worker; /* local SGD; this program is the async master or a worker */
	bool compress;      /* the batch axis's buckets are compressed */
	bool optimizes;     /* steps the optimizer (an async worker does not) */
	long long nflat;    /* local SGD, async: elements of every parameter of the stage */
	int param_flat, master_flat, grad_flat; /* their flat buffers, or -1 */
	int inbox;          /* async: the worker's parameter inbox, the master's gradient inbox */
	/* offload optimizer (offload below) */
	OffloadPlace off;   /* PLACE_HOST, PLACE_DISK, or PLACE_NONE: not offloaded */
	Group *grp;
	int ngrp;
	int parts;          /* f32 arrays per group: master weights (bf16 / f16 parameters) and moments */
	long long grp_max;  /* elements of the largest group */
	int slot[2];        /* disk: the two host buffers records are read into */
	int stage_grad[DT_F64 + 1][2], stage_param[DT_F64 + 1][2]; /* host copies, by dtype, or -1 */
	int coef_host;      /* the clipping coefficient, copied to the host */
} State;

static int state_buf(State *S, StateKind kind, DType t, long long elems, const char *name, const char *what)
{
	int b = buffer_new(S->p, BUF_STATE, t, elems, name, what);
	S->p->buf[b].state = kind;
	return b;
}

static void make_view(State *S, int b, int base, long long off, int axis, long long stride)
{
	Buffer *x = &S->p->buf[b];
	x->cls = BUF_VIEW;
	x->view_of = base;
	x->view_off = off;
	x->view_axis = axis;
	x->view_stride = stride;
}

static int view_new(State *S, int base, long long off, int axis, long long stride, long long elems, const char *name)
{
	Buffer *bb = &S->p->buf[base];
	int b = buffer_new(S->p, BUF_VIEW, bb->dtype, elems, name, bb->what);
	make_view(S, b, base, off, axis, stride);
	return b;
}

static Kernel *step_kernel(State *S, KernelKind kind, Phase ph, const char *note)
{
	Kernel *k = kernel_new(S->p, kind, ph, 0, -1);
	k->note = note;
	return k;
}

/* Graph value v's buffer in the program: it must have one. */
static int value_buffer(const LProg *p, int v)
{
	int b = lprog_value_buffer(p, v);
	if (b < 0)
		ICE("value %%%d has no buffer on stage %d", v, p->stage);
	return b;
}

static int param_index(const State *S, int value)
{
	int b = lprog_value_buffer(S->p, value), i = b >= 0 ? S->param_of[b] : -1;
	if (i < 0)
		ICE("parameter %%%d has no table entry", value);
	return i;
}

/* The lookups by value buffer: each update's gradient and parameter (the first update wins, as a
 * search from the front would find), each parameter's table entry on this stage. */
static void index_updates(State *S)
{
	LProg *p = S->p;
	const Lowered *low = p->low;
	int n = p->nvalbufs + 1;
	S->upd_of_grad = malloc(sizeof(int) * (size_t)n);
	S->upd_of_param = malloc(sizeof(int) * (size_t)n);
	S->param_of = malloc(sizeof(int) * (size_t)n);
	if (!S->upd_of_grad || !S->upd_of_param || !S->param_of)
		ICE("out of memory");
	for (int b = 0; b < n; b++)
		S->upd_of_grad[b] = S->upd_of_param[b] = S->param_of[b] = -1;
	for (int i = S->nu - 1; i >= 0; i--) {
		S->upd_of_grad[S->u[i].grad] = i;
		S->upd_of_param[S->u[i].param] = i;
	}
	for (int i = low->nparams - 1; i >= 0; i--) {
		int b = low->params[i].stage == p->stage ? lprog_value_buffer(p, low->params[i].value) : -1;
		if (b >= 0)
			S->param_of[b] = i;
	}
}

/* an update's parameter (a buffer: value buffers are numbered apart from their values once
 * dead values have none) in the parameter table */
static int update_param_index(const State *S, const Update *u)
{
	return param_index(S, S->p->buf[u->param].value);
}

/* Whether an update is on a ZeRO 1/2 shard of a flat bucket (else it updates its whole block, or
 * its ZeRO-3 chunk). */
static bool sharded(const State *S, const Update *u)
{
	return u->flat >= 0 && S->zero >= 1;
}

static int update_of_grad(const State *S, int grad)
{
	return grad >= 0 && grad < S->p->nvalbufs ? S->upd_of_grad[grad] : -1;
}

static int update_of_param(const State *S, int param)
{
	return param >= 0 && param < S->p->nvalbufs ? S->upd_of_param[param] : -1;
}

/* ------------------------------------------------------------------ collectives */

static void comm_flat(State *S, Kernel *k, OpKind coll, int axis, long long elems, DType t, const char *what)
{
	Comm *c = kernel_comm(S->p, k);
	c->coll = coll;
	c->axis = axis;
	c->elems = elems;
	c->dtype = t;
	c->rank = 1;
	c->shape[0] = elems;
	c->what = what;
}

/* buf (elems of dtype t) summed in place over axis (or a tied pair when pair >= 0) */
static void allreduce_inplace(State *S, Phase ph, int buf, long long elems, int axis, int pair, const char *note)
{
	LProg *p = S->p;
	Kernel *k = step_kernel(S, K_ALLREDUCE_INPLACE, ph, note);
	karg_buf(p, k, buf, true, true);
	karg_int(p, k, elems);
	karg(p, k, KA_DTYPE, p->buf[buf].dtype);
	karg(p, k, pair >= 0 ? KA_PAIR : KA_AXIS, pair >= 0 ? pair : axis);
	karg(p, k, KA_NULL, 0);
	comm_flat(S, k, OP_ALL_REDUCE, axis, elems, p->buf[buf].dtype, p->buf[buf].what);
	k->comm[0].pair = pair;
	const Buffer *b = &p->buf[buf];
	if (b->value >= 0) { /* a tensor: the check compares its block's shape */
		k->comm[0].rank = b->rank;
		memcpy(k->comm[0].shape, b->ldims, sizeof b->ldims);
		if (S->g->vals[b->value].name)
			k->comm[0].what = S->g->vals[b->value].name;
	}
}

/* ------------------------------------------------------------------ layout */

static long long replicas_of(const State *S, int grad)
{
	const Graph *g = S->g;
	long long r = 1;
	for (int a = 0; a < S->ps->naxes; a++)
		if (g->vals[grad].lay.on[a] == LAYOUT_R && a != S->za && a != S->ps->pipe_axis && a != S->sa)
			r *= S->ps->axes[a].size;
	return r;
}

static void collect_updates(State *S)
{
	Graph *g = S->g;
	LProg *p = S->p;
	S->u = calloc((size_t)S->nops + 1, sizeof(Update));
	if (!S->u)
		ICE("out of memory");
	for (int so = 0; so < S->nops; so++) {
		int i = S->ops[so];
		const Op *op = &g->ops[i];
		if (op->kind != OP_OPTIMIZER_STEP || op->stage != p->stage)
			continue; /* an async worker keeps the parameters and gradients of the master's updates */
		Update *u = &S->u[S->nu++];
		u->op = i;
		u->param = value_buffer(p, op->in[0]);
		u->grad = value_buffer(p, op->in[1]);
		u->flat = -1;
		u->n = p->buf[u->grad].elems;
		u->replicas = g->vals[op->in[0]].tied_to >= 0 ? 0 : replicas_of(S, op->in[1]);
		u->chunk_grad = u->master = u->m = u->v = -1;
	}
}

/* The axis whose buckets hold the gradients flat: the ZeRO axis, else the one reducing the most. */
static int primary_axis(const State *S)
{
	Graph *g = S->g;
	if (S->zero >= 1)
		return S->zero >= 3 ? -1 : S->za;
	double best = 0;
	int axis = -1;
	for (int a = 0; a < S->ps->naxes; a++) {
		double bytes = 0;
		for (int i = 0; i < g->sync.nbuckets; i++) {
			const GradBucket *b = &g->sync.buckets[i];
			if (b->coll == OP_ALL_REDUCE && b->axis == a && b->stage == S->p->stage)
				bytes += (double)b->elems;
		}
		if (bytes > best) {
			best = bytes;
			axis = a;
		}
	}
	return axis;
}

/* The flat buckets and the views that make member gradients (and ZeRO 1/2 parameters) theirs. */
static void layout_flat(State *S)
{
	Graph *g = S->g;
	LProg *p = S->p;
	S->f = calloc((size_t)g->sync.nbuckets + 1, sizeof(Flat));
	if (!S->f)
		ICE("out of memory");
	for (int i = 0; i < g->sync.nbuckets; i++) {
		const GradBucket *bk = &g->sync.buckets[i];
		if (bk->stage != p->stage || bk->axis != S->primary)
			continue;
		if (bk->coll != (S->zero >= 1 ? OP_REDUCE_SCATTER : OP_ALL_REDUCE))
			continue;
		Flat *f = &S->f[S->nf];
		f->bucket = i;
		f->upd = arena_alloc(g->arena, sizeof(int) * (size_t)bk->nmembers);
		f->grad_shard = f->master = f->m = f->v = f->param = -1;
		DType gt = DT_F32;
		for (int m = 0; m < bk->nmembers; m++) {
			int ui = update_of_grad(S, value_buffer(p, bk->members[m]));
			if (ui < 0 || S->u[ui].flat >= 0)
				ICE("bucket member %%%d is no update's gradient", bk->members[m]);
			Update *u = &S->u[ui];
			u->flat = S->nf;
			u->off = f->total;
			f->total += u->n;
			f->upd[f->nupd++] = ui;
			gt = p->buf[u->grad].dtype;
		}
		if (S->zero >= 1) {
			f->chunk = (f->total + S->zn - 1) / S->zn;
			f->total = f->chunk * S->zn;
		}
		const char *what = arena_printf(g->arena, "gradient bucket %d (%d tensors)", S->nf, f->nupd);
		if (S->zero >= 2) { /* whole gradients only during the backward */
			f->grad = buffer_new(p, BUF_ARENA, gt, f->total, "grad_bucket", what);
			f->grad_shard = state_buf(S, SC_GRAD, gt, f->chunk, "grad_shard", arena_printf(g->arena, "this rank's shard of %s", what));
		} else {
			f->grad = state_buf(S, SC_GRAD, gt, f->total, "grad_bucket", what);
		}
		for (int m = 0; m < f->nupd; m++)
			make_view(S, S->u[f->upd[m]].grad, f->grad, S->u[f->upd[m]].off, -1, 0);
		if (S->zero >= 1) {
			DType pt = p->buf[S->u[f->upd[0]].param].dtype;
			f->param = state_buf(S, SC_PARAM, pt, f->total, "param_bucket",
					     arena_printf(g->arena, "the parameters of gradient bucket %d", S->nf));
			for (int m = 0; m < f->nupd; m++)
				make_view(S, S->u[f->upd[m]].param, f->param, S->u[f->upd[m]].off, -1, 0);
		}
		S->nf++;
	}
	/* ZeRO 2 and 3: whole gradients (accumulators and what converts them) are transient */
	if (S->zero >= 2)
		for (int b = 0; b < p->nvalbufs; b++) {
			Buffer *x = &p->buf[b];
			if (x->cls == BUF_STATE && x->state == SC_GRAD)
				x->cls = BUF_ARENA;
		}
}

/* Optimizer state for the elements each update (or flat bucket shard) owns. */
static void layout_optimizer(State *S)
{
	LProg *p = S->p;
	Graph *g = S->g;
	if (!S->optimizes)
		return;
	if (S->param_flat >= 0 && S->low)
		S->master_flat = state_buf(S, SC_MASTER, DT_F32, S->nflat, "master_flat", "f32 master weights of every parameter");
	bool resident = S->off != PLACE_DISK; /* on disk: records of the state file (offload below) */
	for (int i = 0; i < S->nf && S->zero >= 1 && resident; i++) {
		Flat *f = &S->f[i];
		const char *what = arena_printf(g->arena, "shard of gradient bucket %d", i);
		if (S->moments >= 1)
			f->m = state_buf(S, SC_OPTIM, DT_F32, f->chunk, "m_shard", what);
		if (S->moments >= 2)
			f->v = state_buf(S, SC_OPTIM, DT_F32, f->chunk, "v_shard", what);
		if (S->low)
			f->master = state_buf(S, SC_MASTER, DT_F32, f->chunk, "master_shard", what);
	}
	for (int i = 0; i < S->nu; i++) {
		Update *u = &S->u[i];
		if (sharded(S, u))
			continue;
		const char *name = g->vals[p->buf[u->param].value].name;
		long long n = p->buf[u->param].elems; /* the whole block, or the ZeRO-3 chunk */
		if (S->zero >= 3)
			u->chunk_grad = state_buf(S, SC_GRAD, p->buf[u->grad].dtype, n, "grad_chunk", name);
		if (!resident)
			continue;
		if (S->moments >= 1)
			u->m = state_buf(S, SC_OPTIM, DT_F32, n, "m", name);
		if (S->moments >= 2)
			u->v = state_buf(S, SC_OPTIM, DT_F32, n, "v", name);
		if (S->master_flat >= 0)
			u->master = view_new(S, S->master_flat, u->off, -1, 0, n, "master");
		else if (S->low)
			u->master = state_buf(S, SC_MASTER, DT_F32, n, "master", name);
	}
}

/* Local SGD and async: every parameter of the stage in one flat buffer (and, for async, every
 * gradient), the tensors views into it, so that an average or a message is one call. */
static void layout_whole(State *S)
{
	LProg *p = S->p;
	S->nflat = 0;
	for (int i = 0; i < S->nu; i++) {
		S->u[i].off = S->nflat;
		S->nflat += S->u[i].n;
	}
	if (!S->nu)
		return;
	S->param_flat = state_buf(S, SC_PARAM, p->buf[S->u[0].param].dtype, S->nflat, "param_flat",
				  "every parameter of the stage");
	if (S->master || S->worker)
		S->grad_flat = state_buf(S, SC_GRAD, p->buf[S->u[0].grad].dtype, S->nflat, "grad_flat",
					 "every gradient of the stage");
	for (int i = 0; i < S->nu; i++) {
		make_view(S, S->u[i].param, S->param_flat, S->u[i].off, -1, 0);
		if (S->grad_flat >= 0)
			make_view(S, S->u[i].grad, S->grad_flat, S->u[i].off, -1, 0);
	}
}

/* ------------------------------------------------------------------ phases */

static void init_param(State *S, int dst, DType t, int param, long long base, int axis, long long stride, long long n)
{
	LProg *p = S->p;
	Kernel *k = step_kernel(S, K_INIT_PARAM, PH_INIT, p->low->params[param].name);
	karg(p, k, KA_CTX, 0);
	karg_buf(p, k, dst, false, true);
	karg(p, k, KA_DTYPE, t);
	karg(p, k, KA_PARAM, param);
	karg_coord(p, k, base, axis, stride);
	karg_int(p, k, n);
}

static void save_param(State *S, int src, int param, long long base, int axis, long long stride, long long n)
{
	LProg *p = S->p;
	Kernel *k = step_kernel(S, K_SAVE_PARAM, PH_SAVE, p->low->params[param].name);
	karg(p, k, KA_CTX, 0);
	karg_buf(p, k, src, true, false);
	karg(p, k, KA_DTYPE, p->buf[src].dtype);
	karg(p, k, KA_PARAM, param);
	karg_coord(p, k, base, axis, stride);
	karg_int(p, k, n);
	karg_int(p, k, axis);
}

static void cast(State *S, Phase ph, int from, int to, long long n)
{
	LProg *p = S->p;
	Kernel *k = step_kernel(S, K_CAST, ph, "master weights to the parameters");
	karg_buf(p, k, from, true, false);
	karg(p, k, KA_DTYPE, p->buf[from].dtype);
	karg_buf(p, k, to, false, true);
	karg(p, k, KA_DTYPE, p->buf[to].dtype);
	karg_int(p, k, n);
}

static void fill(State *S, Phase ph, int b, long long n, const char *note)
{
	LProg *p = S->p;
	Kernel *k = step_kernel(S, K_FILL, ph, note);
	karg_buf(p, k, b, false, true);
	karg_int(p, k, n);
	karg(p, k, KA_DTYPE, p->buf[b].dtype);
	karg_f64(p, k, 0.0);
}

/* ------------------------------------------------------------------ offloaded optimizer state
 *
 * `offload optimizer -> host | disk` (ZeRO-Offload; ZeRO-Infinity's NVMe offload). The optimizer
 * calls become groups: a ZeRO 1/2 bucket shard, or an update's whole block or ZeRO-3 chunk. A
 * group's state (f32 master weights of lower-precision parameters, then the moments) lives
 *   host  in pinned host memory, a buffer per array as without offload;
 *   disk  in one file per rank (planrt_offload_open; zero-filled, the moments' initial value), a
 *         record per group, its arrays one after the other. Whatever touches a group's state
 *         (init, the update, save, checkpoint and resume) reads the record (or its master part)
 *         into a host slot first and writes back what it changed.
 * The update runs on the host (CPU Adam): the group's gradient is copied to a host staging buffer,
 * the optimizer steps the master weights (f32 parameters: a host copy of them), and the new
 * parameters go back through a second staging buffer. Two of each (and two record slots)
 * alternate, so that the next group's copies and record read overlap this group's update
 * (streams.c puts the copies on the copy stream and the update on the host; the C target runs
 * everything in order, a copy being a memcpy, and the record I/O the same asynchronous way). The
 * device keeps no optimizer state: explain prints the host's staging and state, and the file. */

static void mark_host(State *S, int b)
{
	if (b >= 0)
		S->p->buf[b].place = PLACE_HOST;
}

static int host_buf(State *S, DType t, long long elems, const char *name, const char *what)
{
	int b = state_buf(S, SC_OFFLOAD, t, elems, name, what);
	mark_host(S, b);
	return b;
}

/* The pieces of a shard, block or chunk of n elements (target and grad: its parameters and
 * gradients): each at most `piece` elements, so that the host staging stays a fraction of the
 * state however large a tensor or bucket is (DeepSpeed's sub-groups). */
static void group_add(State *S, Flat *f, Update *u, int target, int grad, long long n, long long piece)
{
	for (long long at = 0; at < n || (at == 0 && n == 0); at += piece) {
		long long len = n - at < piece ? n - at : piece;
		Group *G = &S->grp[S->ngrp];
		bool whole = at == 0 && len == n;
		*G = (Group){f, u, whole ? target : view_new(S, target, at, -1, 0, len, "param_piece"),
			     whole ? grad : view_new(S, grad, at, -1, 0, len, "grad_piece"), at, len, 0};
		S->ngrp++;
		if (len > S->grp_max)
			S->grp_max = len;
		if (n == 0)
			break;
	}
}

enum { PIECE_MIN = 1 << 16, PIECE_MAX = 1 << 22 };

/* The groups in the update's order, where their state lives, the file's records, the staging. */
static void offload_layout(State *S)
{
	LProg *p = S->p;
	for (int t = 0; t <= DT_F64; t++)
		S->stage_grad[t][0] = S->stage_grad[t][1] = S->stage_param[t][0] = S->stage_param[t][1] = -1;
	S->slot[0] = S->slot[1] = S->coef_host = -1;
	if (S->ps->offload_params == PLACE_HOST && S->zero >= 3) /* ZeRO-3 chunks (offload_params.c) */
		for (int b = 0; b < p->nbuf; b++)
			if (p->buf[b].cls == BUF_STATE && p->buf[b].state == SC_PARAM)
				p->buf[b].place = PLACE_HOST;
	if (S->off == PLACE_NONE)
		return;
	S->parts = (S->low ? 1 : 0) + S->moments;
	/* pieces of a sixteenth of the rank's optimizer elements, within [PIECE_MIN, PIECE_MAX]: the
	 * staging (two pieces' records, gradients and parameters) is an eighth of the state or less */
	long long total = 0, count = 0;
	for (int i = 0; i < S->nf && S->zero >= 1; i++)
		total += S->f[i].chunk;
	for (int i = 0; i < S->nu; i++)
		if (!sharded(S, &S->u[i]))
			total += p->buf[S->u[i].param].elems;
	long long piece = (total + 15) / 16;
	piece = piece < PIECE_MIN ? PIECE_MIN : piece > PIECE_MAX ? PIECE_MAX : piece;
	for (int i = 0; i < S->nf && S->zero >= 1; i++)
		count += (S->f[i].chunk + piece - 1) / piece + 1;
	for (int i = 0; i < S->nu; i++)
		count += (p->buf[S->u[i].param].elems + piece - 1) / piece + 1;
	S->grp = calloc((size_t)count + 1, sizeof(Group));
	if (!S->grp)
		ICE("out of memory");
	for (int i = 0; i < S->nf && S->zero >= 1; i++) {
		Flat *f = &S->f[i];
		int grad = f->grad_shard >= 0 ? f->grad_shard : view_new(S, f->grad, 0, S->za, f->chunk, f->chunk, "grad_shard_view");
		group_add(S, f, NULL, view_new(S, f->param, 0, S->za, f->chunk, f->chunk, "param_shard"), grad, f->chunk, piece);
	}
	for (int i = 0; i < S->nu; i++) {
		Update *u = &S->u[i];
		if (!sharded(S, u))
			group_add(S, NULL, u, u->param, u->chunk_grad >= 0 ? u->chunk_grad : u->grad, p->buf[u->param].elems, piece);
	}
	long long file = 0;
	for (int i = 0; i < S->ngrp; i++) {
		Group *G = &S->grp[i];
		long long bytes;
		if (__builtin_mul_overflow(G->n, (long long)S->parts * 4, &bytes) || __builtin_add_overflow(file, bytes, &file))
			ICE("the optimizer state file overflows 64 bits");
		G->rec = file - bytes;
		if (S->off == PLACE_HOST) { /* the state itself (views for pieces: their roots) */
			mark_host(S, G->f ? G->f->master : G->u->master);
			mark_host(S, G->f ? G->f->m : G->u->m);
			mark_host(S, G->f ? G->f->v : G->u->v);
		}
		DType gt = p->buf[G->grad].dtype, pt = p->buf[G->target].dtype;
		for (int s = 0; s < 2; s++) {
			if (S->stage_grad[gt][s] < 0)
				S->stage_grad[gt][s] = host_buf(S, gt, S->grp_max, "grad_host", "a group's gradients, copied to the host");
			if (S->stage_param[pt][s] < 0)
				S->stage_param[pt][s] = host_buf(S, pt, S->grp_max, "param_host", "a group's parameters, on the host");
		}
	}
	if (S->off == PLACE_DISK) {
		p->disk_bytes = (size_t)file;
		for (int s = 0; s < 2; s++)
			S->slot[s] = host_buf(S, DT_F32, S->grp_max * S->parts > 0 ? S->grp_max * S->parts : 1, "record",
					      "a group's record of the optimizer state file, read in");
	}
	S->coef_host = host_buf(S, DT_F64, 1, "clip_coef_host", "the clipping coefficient, on the host");
}

/* A group's master weights and moments (-1: none) where kernels reach them: its buffers, or (disk)
 * views of record slot `slot`. */
static void group_state(State *S, const Group *G, int slot, int bufs[3])
{
	if (S->off != PLACE_DISK) {
		int own[3] = {G->f ? G->f->master : G->u->master, G->f ? G->f->m : G->u->m, G->f ? G->f->v : G->u->v};
		for (int j = 0; j < 3; j++)
			bufs[j] = own[j] < 0 || (G->at == 0 && G->n == S->p->buf[own[j]].elems)
					  ? own[j]
					  : view_new(S, own[j], G->at, -1, 0, G->n, S->p->buf[own[j]].name);
		return;
	}
	static const char *const names[3] = {"master_rec", "m_rec", "v_rec"};
	bool has[3] = {S->low, S->moments >= 1, S->moments >= 2};
	long long at = 0;
	for (int j = 0; j < 3; j++) {
		bufs[j] = -1;
		if (!has[j])
			continue;
		bufs[j] = view_new(S, S->slot[slot], at, -1, 0, G->n, names[j]);
		at += G->n;
	}
}

/* Disk: the group's record (master_only: its master weights, the record's first array) read into
 * or written from slot `slot`; on I/O slot io (its own order, finished by io_wait), or done before
 * the kernel returns (io < 0). */
static void record_io(State *S, Phase ph, const Group *G, int slot, bool write, int io, bool master_only)
{
	LProg *p = S->p;
	long long elems = master_only ? G->n : G->n * S->parts;
	int view = view_new(S, S->slot[slot], 0, -1, 0, elems > 0 ? elems : 1, "record_in_slot");
	Kernel *k = step_kernel(S, write ? K_OFFLOAD_WRITE : K_OFFLOAD_READ, ph,
				write ? "optimizer state written back to its file" : "optimizer state read from its file");
	karg_buf(p, k, view, write, !write);
	karg_int(p, k, G->rec);
	karg_int(p, k, elems * 4);
	karg_int(p, k, io);
}

static void io_wait(State *S, Phase ph, int io)
{
	Kernel *k = step_kernel(S, K_OFFLOAD_WAIT, ph, "the optimizer state file's reads and writes on this slot done");
	karg_int(S->p, k, io);
}

/* A member of a group (a parameter whose elements the piece holds some of): the update, and the
 * piece's first element as init_param, save_param and ckpt_piece place pieces (lo = base +
 * coord(axis) * stride). */
static int members(const Group *G)
{
	return G->f ? G->f->nupd : 1;
}

static const Update *member(const State *S, const Group *G, int m, long long *base, int *axis, long long *stride)
{
	if (G->f) {
		const Update *u = &S->u[G->f->upd[m]];
		*base = -u->off + G->at;
		*axis = S->za;
		*stride = G->f->chunk;
		return u;
	}
	*base = G->at;
	*axis = S->zero >= 3 ? S->za : -1;
	*stride = S->zero >= 3 ? S->p->buf[G->u->param].elems : 0;
	return G->u;
}

static void offload_copy(State *S, int dst, int src, long long n, const char *note)
{
	kernel_copy(S->p, PH_STEP, 0, -1, dst, src, n, note);
}

/* Group i's inputs to the host, into slot s: its record, its gradients, and f32 parameters that
 * have no master weights (the optimizer steps the host copy). */
static bool target_on_host(const State *S, const Group *G)
{
	return S->p->buf[buffer_root(S->p, G->target)].place == PLACE_HOST; /* offload params -> host */
}

static void offload_fetch(State *S, int i, int s)
{
	LProg *p = S->p;
	const Group *G = &S->grp[i];
	if (S->off == PLACE_DISK)
		record_io(S, PH_STEP, G, s, false, s, false);
	offload_copy(S, S->stage_grad[p->buf[G->grad].dtype][s], G->grad, G->n, "a group's gradients to the host");
	if (!S->low && !target_on_host(S, G))
		offload_copy(S, S->stage_param[p->buf[G->target].dtype][s], G->target, G->n, "a group's parameters to the host");
}

static void optimizer(State *S, int target, int grad, int m, int v, long long n);

/* The step's update of every group on the host, pipelined over two slots. */
static void offload_update(State *S)
{
	LProg *p = S->p;
	offload_copy(S, S->coef_host, S->coef, 1, "the clipping coefficient to the host");
	if (S->ngrp)
		offload_fetch(S, 0, 0);
	for (int i = 0; i < S->ngrp; i++) {
		const Group *G = &S->grp[i];
		int s = i & 1;
		if (i + 1 < S->ngrp)
			offload_fetch(S, i + 1, 1 - s);
		if (S->off == PLACE_DISK)
			io_wait(S, PH_STEP, s);
		int bufs[3];
		group_state(S, G, s, bufs);
		bool in_place = target_on_host(S, G); /* the parameters are host memory already */
		int host_param = in_place ? G->target : S->stage_param[p->buf[G->target].dtype][s];
		optimizer(S, bufs[0] >= 0 ? bufs[0] : host_param, S->stage_grad[p->buf[G->grad].dtype][s], bufs[1], bufs[2], G->n);
		if (bufs[0] >= 0)
			cast(S, PH_STEP, bufs[0], host_param, G->n);
		if (!in_place)
			offload_copy(S, G->target, host_param, G->n, "a group's new parameters to the device");
		if (S->off == PLACE_DISK)
			record_io(S, PH_STEP, G, s, true, s, false);
	}
	if (S->off == PLACE_DISK) {
		io_wait(S, PH_STEP, 0);
		io_wait(S, PH_STEP, 1);
	}
}

/* init (disk): each piece's master weights drawn (or read) into a record slot and written to the
 * file; a bucket shard's padding keeps the file's zeros. Parameters outside buckets are the cast
 * of their master weights, as without offload. */
static void offload_init_masters(State *S)
{
	if (S->off != PLACE_DISK || !S->low)
		return;
	for (int i = 0; i < S->ngrp; i++) {
		const Group *G = &S->grp[i];
		int bufs[3];
		group_state(S, G, 0, bufs);
		if (G->f)
			record_io(S, PH_INIT, G, 0, false, -1, true);
		for (int m = 0; m < members(G); m++) {
			long long base, stride;
			int axis;
			const Update *u = member(S, G, m, &base, &axis, &stride);
			init_param(S, bufs[0], DT_F32, update_param_index(S, u), base, axis, stride, G->n);
		}
		if (!G->f)
			cast(S, PH_INIT, bufs[0], G->target, G->n);
		record_io(S, PH_INIT, G, 0, true, -1, true);
	}
}

/* save (disk): each piece's master weights read in, and every member's part of them written. */
static void offload_save_masters(State *S)
{
	if (S->off != PLACE_DISK || !S->low)
		return;
	for (int i = 0; i < S->ngrp; i++) {
		const Group *G = &S->grp[i];
		int bufs[3];
		record_io(S, PH_SAVE, G, 0, false, -1, true);
		group_state(S, G, 0, bufs);
		for (int m = 0; m < members(G); m++) {
			long long base, stride;
			int axis;
			const Update *u = member(S, G, m, &base, &axis, &stride);
			int pi = update_param_index(S, u);
			if (S->p->low->params[pi].saved)
				save_param(S, bufs[0], pi, base, axis, stride, G->n);
		}
	}
}

static void ckpt_piece(State *S, int buf, int param, CkptKind kind, long long base, int axis, long long stride,
		       long long n, int shard_axis);

/* checkpoint and resume (disk): each piece's record read in, every member's part of its master
 * weights and moments written (resume: read, and the record written back). */
static void offload_checkpoint(State *S, CkptKind first_moment)
{
	if (S->off != PLACE_DISK)
		return;
	CkptKind kinds[3] = {CKPT_MASTER, first_moment, CKPT_EXP_AVG_SQ};
	for (int i = 0; i < S->ngrp; i++) {
		const Group *G = &S->grp[i];
		int bufs[3];
		record_io(S, PH_CHECKPOINT, G, 0, false, -1, false);
		record_io(S, PH_RESUME, G, 0, false, -1, false);
		group_state(S, G, 0, bufs);
		for (int m = 0; m < members(G); m++) {
			long long base, stride;
			int axis;
			const Update *u = member(S, G, m, &base, &axis, &stride);
			for (int j = 0; j < 3; j++)
				if (bufs[j] >= 0)
					ckpt_piece(S, bufs[j], update_param_index(S, u), kinds[j], base, axis, stride, G->n,
						   G->f || S->zero >= 3 ? S->za : -1);
		}
		record_io(S, PH_RESUME, G, 0, true, -1, false);
	}
}

/* init: the tied pairs' communicators, then every parameter of the stage (and master weights):
 * drawn from the seed or read from --init by each rank for what it holds, with no communication. */
static void phase_init(State *S)
{
	LProg *p = S->p;
	Graph *g = S->g;
	for (int q = 0; q < p->low->npairs; q++) {
		Kernel *k = step_kernel(S, K_PAIR_COMM, PH_INIT, "the tied-parameter group");
		karg_int(p, k, S->ps->pipe_axis);
		karg_int(p, k, p->low->pair_a[q]);
		karg_int(p, k, p->low->pair_b[q]);
		karg_int(p, k, q);
	}
	if (S->off == PLACE_DISK) {
		Kernel *k = step_kernel(S, K_OFFLOAD_OPEN, PH_INIT, "the optimizer state file");
		karg_int(p, k, (long long)p->disk_bytes);
	}
	for (int so = 0; so < S->nops; so++) {
		int i = S->ops[so];
		const Op *op = &g->ops[i];
		if (op->kind != OP_PARAM || op->stage != p->stage)
			continue;
		int pi = param_index(S, op->out[0]), v = value_buffer(p, op->out[0]);
		int ui = update_of_param(S, v);
		const Update *u = ui >= 0 ? &S->u[ui] : NULL;
		long long n = p->buf[v].elems;
		DType pt = p->buf[v].dtype;
		if (S->off == PLACE_DISK && S->low && u && !sharded(S, u))
			continue; /* drawn into its master weights' record: offload_init_masters */
		if (S->zero >= 3) { /* this rank's chunk */
			if (u && u->master >= 0) {
				init_param(S, u->master, DT_F32, pi, 0, S->za, n, n);
				cast(S, PH_INIT, u->master, v, n);
			} else {
				init_param(S, v, pt, pi, 0, S->za, n, n);
			}
		} else if (u && sharded(S, u)) { /* the whole block, and the master shard's part of it */
			const Flat *f = &S->f[u->flat];
			init_param(S, v, pt, pi, 0, -1, 0, n);
			if (f->master >= 0)
				init_param(S, f->master, DT_F32, pi, -u->off, S->za, f->chunk, f->chunk);
		} else if (u && u->master >= 0) {
			init_param(S, u->master, DT_F32, pi, 0, -1, 0, n);
			cast(S, PH_INIT, u->master, v, n);
		} else {
			init_param(S, v, pt, pi, 0, -1, 0, n);
		}
	}
	offload_init_masters(S);
}

/* save: every rank writes the pieces it holds of the stage's saved parameters, in f32 from the
 * master weights where there are some. */
static void phase_save(State *S)
{
	LProg *p = S->p;
	Graph *g = S->g;
	for (int so = 0; so < S->nops; so++) {
		int i = S->ops[so];
		const Op *op = &g->ops[i];
		if (op->kind != OP_PARAM || op->stage != p->stage)
			continue;
		int pi = param_index(S, op->out[0]), v = value_buffer(p, op->out[0]);
		if (!p->low->params[pi].saved)
			continue;
		int ui = update_of_param(S, v);
		const Update *u = ui >= 0 ? &S->u[ui] : NULL;
		long long n = p->buf[v].elems;
		if (S->off == PLACE_DISK && S->low && u)
			continue; /* from the file: offload_save_masters */
		if (S->zero >= 3)
			save_param(S, u && u->master >= 0 ? u->master : v, pi, 0, S->za, n, n);
		else if (u && sharded(S, u) && S->f[u->flat].master >= 0)
			save_param(S, S->f[u->flat].master, pi, -u->off, S->za, S->f[u->flat].chunk, S->f[u->flat].chunk);
		else
			save_param(S, u && u->master >= 0 ? u->master : v, pi, 0, -1, 0, n);
	}
	offload_save_masters(S);
}

/* ------------------------------------------------------------------ checkpoints and evaluation */

/* A piece of a logical tensor (runtime/planrt_program.h, planrt_ckpt_write): the checkpoint phase
 * writes it (only the original of a tied pair), the resume phase reads it back (into every copy:
 * both take the same updates, so the original's state is the copy's). lo = base + coord(axis) *
 * stride, as init_param's. */
static void ckpt_piece(State *S, int buf, int param, CkptKind kind, long long base, int axis, long long stride,
		       long long n, int shard_axis)
{
	/* CKPT_COPY: a record slot holds the next record before the checkpoint is written out */
	int copy = S->slot[0] >= 0 && buffer_root(S->p, buf) == S->slot[0] ? CKPT_COPY : 0;
	LProg *p = S->p;
	for (int io = 0; io < 2; io++) {
		if (!io && !p->low->params[param].saved)
			continue;
		Kernel *k = step_kernel(S, io ? K_CKPT_READ : K_CKPT_WRITE, io ? PH_RESUME : PH_CHECKPOINT, p->low->params[param].name);
		karg(p, k, KA_CTX, 0);
		karg_buf(p, k, buf, !io, io);
		karg(p, k, KA_DTYPE, p->buf[buf].dtype);
		karg(p, k, KA_PARAM, param);
		karg_int(p, k, io ? kind : kind | copy);
		karg_coord(p, k, base, axis, stride);
		karg_int(p, k, n);
		if (!io)
			karg_int(p, k, shard_axis);
	}
}

/* A rank-local buffer, whole, by its index in the program (resumed only under the same plan). */
static void ckpt_local(State *S, int buf)
{
	LProg *p = S->p;
	for (int io = 0; io < 2; io++) {
		Kernel *k = step_kernel(S, io ? K_CKPT_READ_LOCAL : K_CKPT_WRITE_LOCAL, io ? PH_RESUME : PH_CHECKPOINT,
					p->buf[buf].what);
		karg(p, k, KA_CTX, 0);
		karg_buf(p, k, buf, !io, io);
		karg(p, k, KA_DTYPE, p->buf[buf].dtype);
		karg_int(p, k, p->buf[buf].elems);
		karg_int(p, k, buf);
	}
}

/* checkpoint and resume: the state a run needs to continue bit for bit. Strict sync: every
 * parameter (its storage dtype), its f32 master weights and optimizer moments as pieces of
 * logical tensors, where each rank holds them (the whole block, a ZeRO-1/2 bucket shard's part,
 * a ZeRO-3 chunk), so that another plan of the model can read them; compression's error-feedback
 * residuals and PowerSGD factors are rank-local. Local SGD's replicas differ until they
 * average, so all of their state is rank-local. The async roles have messages in flight at any
 * step boundary: planrt refuses their checkpoints, and nothing is written here. Gradients and
 * metrics start from zero every step; the step itself, the seed and the data position are
 * planrt's (the manifest). */
static void phase_checkpoint(State *S)
{
	LProg *p = S->p;
	Graph *g = S->g;
	if (S->master || S->worker)
		return;
	if (S->local) {
		for (int b = 0; b < p->nbuf; b++) {
			const Buffer *x = &p->buf[b];
			if (x->cls == BUF_STATE && (x->state == SC_PARAM || x->state == SC_OPTIM || x->state == SC_MASTER ||
						    x->state == SC_BUFFER || b == p->loss_history))
				ckpt_local(S, b);
		}
		return;
	}
	CkptKind first = S->moments >= 2 ? CKPT_EXP_AVG : CKPT_MOMENTUM;
	for (int so = 0; so < S->nops; so++) {
		int i = S->ops[so];
		const Op *op = &g->ops[i];
		if (op->kind != OP_PARAM || op->stage != p->stage)
			continue;
		int pi = param_index(S, op->out[0]), v = value_buffer(p, op->out[0]);
		int ui = update_of_param(S, v);
		const Update *u = ui >= 0 ? &S->u[ui] : NULL;
		long long n = p->buf[v].elems;
		if (S->zero >= 3)
			ckpt_piece(S, v, pi, CKPT_PARAM, 0, S->za, n, n, S->za);
		else
			ckpt_piece(S, v, pi, CKPT_PARAM, 0, -1, 0, n, -1);
		if (!u)
			continue;
		if (S->off == PLACE_DISK)
			continue; /* in the file: offload_checkpoint */
		const Flat *f = sharded(S, u) ? &S->f[u->flat] : NULL;
		int bufs[3] = {f ? f->master : u->master, f ? f->m : u->m, f ? f->v : u->v};
		CkptKind kinds[3] = {CKPT_MASTER, first, CKPT_EXP_AVG_SQ};
		for (int j = 0; j < 3; j++) {
			if (bufs[j] < 0)
				continue;
			if (f)
				ckpt_piece(S, bufs[j], pi, kinds[j], -u->off, S->za, f->chunk, f->chunk, S->za);
			else if (S->zero >= 3)
				ckpt_piece(S, bufs[j], pi, kinds[j], 0, S->za, n, n, S->za);
			else
				ckpt_piece(S, bufs[j], pi, kinds[j], 0, -1, 0, n, -1);
		}
	}
	offload_checkpoint(S, first);
	for (int b = 0; b < p->nbuf; b++)
		if (p->buf[b].cls == BUF_STATE && p->buf[b].state == SC_BUFFER)
			ckpt_local(S, b);
}

static void reduce_loss(State *S, Phase ph, int metric, const char *what); /* (the step's phases, below) */

/* A metric times f, in place. */
static void scale_metric(State *S, Phase ph, int metric, double f, const char *note)
{
	Kernel *k = step_kernel(S, K_SCALE_METRIC, ph, note);
	karg_buf(S->p, k, metric, true, true);
	karg_f64(S->p, k, f);
}

/* eval_begin and eval_end: the loss of a held-out batch, whose forwards planrt runs between them,
 * reduced as the step's loss is; local SGD's replicas (each its own model) are averaged. A
 * classification's count of correct rows is summed over the same groups (the rows a data-parallel
 * rank holds, the pipeline's last stage; a class split leaves every rank of it the same count) and
 * divided by the batch's rows: the accuracy. The async roles do not evaluate. */
static void phase_eval(State *S)
{
	LProg *p = S->p;
	if (S->master || S->worker)
		return;
	fill(S, PH_EVAL_BEGIN, p->loss_metric, 1, "the held-out batch's loss");
	if (p->accuracy_metric >= 0)
		fill(S, PH_EVAL_BEGIN, p->accuracy_metric, 1, "the held-out batch's correct rows");
	reduce_loss(S, PH_EVAL_END, p->loss_metric, "the step's loss");
	if (p->accuracy_metric >= 0) {
		reduce_loss(S, PH_EVAL_END, p->accuracy_metric, "the batch's correct rows");
		scale_metric(S, PH_EVAL_END, p->accuracy_metric, 1.0 / (double)p->accuracy_rows, "over its rows");
	}
	if (S->local) {
		allreduce_inplace(S, PH_EVAL_END, p->loss_metric, 1, S->sa, -1, "the replicas' held-out loss");
		scale_metric(S, PH_EVAL_END, p->loss_metric, 1.0 / S->ps->axes[S->sa].size, "their mean");
		if (p->accuracy_metric >= 0) {
			allreduce_inplace(S, PH_EVAL_END, p->accuracy_metric, 1, S->sa, -1, "the replicas' accuracy");
			scale_metric(S, PH_EVAL_END, p->accuracy_metric, 1.0 / S->ps->axes[S->sa].size, "their mean");
		}
	}
}

/* step_begin: gradients and metrics start from zero; per-micro-batch gradients (ZeRO 2/3) are
 * cleared before their first write in each backward instead. */
static void phase_step_begin(State *S)
{
	LProg *p = S->p;
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls == BUF_STATE && (x->state == SC_GRAD || x->state == SC_METRIC) && b != p->loss_history)
			fill(S, PH_STEP_BEGIN, b, x->elems, "zero the step's accumulators");
	}
}

/* ZeRO 2 and 3: whole gradients live in the transient region; each micro-batch's backward clears
 * one right before its first access. */
static void clear_transient_gradients(State *S)
{
	LProg *p = S->p;
	if (S->zero < 2)
		return;
	bool *done = calloc((size_t)p->nbuf, sizeof(bool));
	if (!done)
		ICE("out of memory");
	Inserts ins = {0};
	int nk = p->nk;
	for (int i = 0; i < nk; i++) {
		const Kernel *k = &p->k[i];
		if (k->phase != PH_BACKWARD && k->phase != PH_STEP)
			continue;
		for (int d = 0; d < k->ndefs + k->nuses; d++) { /* the first access: a bf16 copy reads first */
			int r = buffer_root(p, d < k->ndefs ? k->defs[d] : k->uses[d - k->ndefs]);
			const Buffer *x = &p->buf[r];
			bool grad = x->value >= 0 ? S->g->vals[x->value].grad_of >= 0 : false;
			for (int f = 0; f < S->nf; f++)
				if (S->f[f].grad == r)
					grad = true;
			if (x->cls != BUF_ARENA || !grad || done[r])
				continue;
			done[r] = true;
			Phase ph = k->phase;
			fill(S, ph, r, x->elems, "this micro-batch's gradients start from zero");
			inserts_add(&ins, p->k[--p->nk], i); /* made at the end, moved before kernel i */
			k = &p->k[i];
		}
	}
	inserts_apply(p, &ins);
	free(done);
}

static void compress_bucket(State *S, Flat *f); /* (sync strategies, below) */

/* The tied pairs' gradients summed over the pipe axis (before anything that could split them). */
static void sync_tied(State *S)
{
	Graph *g = S->g;
	LProg *p = S->p;
	for (int i = 0; i < g->sync.ntied; i++) {
		const TiedGrads *t = &g->sync.tied[i];
		if (p->stage != t->stage[0] && p->stage != t->stage[1])
			continue;
		int q = -1;
		for (int k = 0; k < p->low->npairs; k++)
			if (p->low->pair_a[k] == t->stage[0] && p->low->pair_b[k] == t->stage[1])
				q = k;
		int grad = value_buffer(p, p->stage == t->stage[0] ? t->grad[0] : t->grad[1]);
		allreduce_inplace(S, PH_STEP, grad, p->buf[grad].elems, S->ps->pipe_axis, q, "tied-parameter gradients");
		p->k[p->nk - 1].op = g->vals[t->param].def; /* messages point at the copy's declaration */
	}
}

/* A flat bucket (layout_flat): reduced in place (ZeRO 1 and 2: reduce-scattered, and under
 * ZeRO 2 this micro-batch's shard added to the step's). */
static void sync_flat(State *S, Flat *f, int bi, Phase ph)
{
	LProg *p = S->p;
	const GradBucket *bk = &S->g->sync.buckets[bi];
	DType t = p->buf[f->grad].dtype;
	const char *what = p->buf[f->grad].what;
	Kernel *k = step_kernel(S, S->zero >= 1 ? K_REDUCE_SCATTER_INPLACE : K_ALLREDUCE_INPLACE, ph, what);
	k->bucket = bi;
	karg_buf(p, k, f->grad, true, true);
	karg_int(p, k, S->zero >= 1 ? f->chunk : f->total);
	karg(p, k, KA_DTYPE, t);
	karg(p, k, KA_AXIS, bk->axis);
	karg(p, k, KA_NULL, 0);
	comm_flat(S, k, S->zero >= 1 ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, bk->axis, f->total, t, what);
	if (S->zero >= 2) { /* this micro-batch's shard into the step's */
		int mine = view_new(S, f->grad, 0, S->za, f->chunk, f->chunk, "grad_bucket_mine");
		Kernel *a = step_kernel(S, K_ACCUMULATE, ph, "this rank's gradient shard");
		karg_buf(p, a, f->grad_shard, true, true);
		karg_buf(p, a, mine, true, false);
		karg_int(p, a, f->chunk);
		karg(p, a, KA_DTYPE, t);
	}
}

/* A packed bucket: members are copied into a transient buffer around the collective. */
static void sync_packed(State *S, int bi, Phase ph)
{
	Graph *g = S->g;
	LProg *p = S->p;
	const GradBucket *bk = &g->sync.buckets[bi];
	int n = bk->nmembers;
	int *bufs = malloc(sizeof(int) * (size_t)n);
	long long *counts = malloc(sizeof(long long) * (size_t)n);
	int *shards = malloc(sizeof(int) * (size_t)n);
	if (!bufs || !counts || !shards)
		ICE("out of memory");
	long long total = 0, chunks = 0;
	int size = S->ps->axes[bk->axis].size;
	for (int m = 0; m < n; m++) {
		bufs[m] = value_buffer(p, bk->members[m]);
		counts[m] = p->buf[bufs[m]].elems;
		total += counts[m];
		chunks += (counts[m] + size - 1) / size;
		int ui = update_of_grad(S, bufs[m]);
		shards[m] = ui >= 0 ? S->u[ui].chunk_grad : -1;
	}
	DType t = p->buf[bufs[0]].dtype;
	const char *what = arena_printf(g->arena, "gradient bucket on '%s' (%d tensors)", S->ps->axes[bk->axis].name, n);
	bool rs = bk->coll == OP_REDUCE_SCATTER;
	for (int m = 0; rs && m < n; m++)
		if (shards[m] < 0)
			ICE("a reduce-scattered gradient without a shard");
	int scratch = buffer_new(p, BUF_ARENA, DT_U8,
				 rs ? (long long)((size_t)(size + 1) * (size_t)chunks * sizeof(float)) : total * dtype_bytes(t),
				 "bucket_scratch", what);
	Kernel *k = step_kernel(S, rs ? K_BUCKET_RS : K_BUCKET_ALLREDUCE, ph, what);
	k->bucket = bi;
	karg_int(p, k, n);
	karg_bufs(p, k, bufs, n, true, !rs);
	karg_ints(p, k, counts, n, false);
	karg(p, k, KA_DTYPE, t);
	if (rs) {
		karg_bufs(p, k, shards, n, true, true);
		karg(p, k, KA_DTYPE, p->buf[shards[0]].dtype);
		karg_int(p, k, 1); /* accumulate into the shards */
		karg_int(p, k, 0); /* the whole gradients are cleared before the next micro-batch */
	}
	karg(p, k, KA_AXIS, bk->axis);
	karg_buf(p, k, scratch, false, true);
	/* on the wire: f32 (bf16 is widened while packing) chunks of every member for a
	 * reduce-scatter; the members as they are for an all-reduce */
	comm_flat(S, k, rs ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, bk->axis, rs ? chunks * size : total, rs ? DT_F32 : t, what);
	free(bufs);
	free(counts);
	free(shards);
}

/* The tied pairs, then the buckets sync.c made, in its order. */
static void phase_sync(State *S)
{
	Graph *g = S->g;
	LProg *p = S->p;
	sync_tied(S);
	for (int i = 0; i < g->sync.nbuckets; i++) {
		const GradBucket *bk = &g->sync.buckets[i];
		if (bk->stage != p->stage)
			continue;
		Phase ph = bk->per_step ? PH_STEP : PH_BACKWARD;
		int fi = -1;
		for (int f = 0; f < S->nf; f++)
			if (S->f[f].bucket == i)
				fi = f;
		if (fi >= 0 && S->compress && bk->axis == S->primary)
			compress_bucket(S, &S->f[fi]);
		else if (fi >= 0)
			sync_flat(S, &S->f[fi], i, ph);
		else
			sync_packed(S, i, ph);
	}
}

/* The global gradient norm, counting each distinct gradient element once: a piece replicated on
 * r ranks weighs 1 / r; then summed over every axis. */
static void phase_norm(State *S)
{
	LProg *p = S->p;
	PlanSpec *ps = S->ps;
	double local_scale = S->local ? (double)ps->axes[S->sa].size : 1.0;
	for (int i = 0; i < S->nf && S->zero >= 1; i++) {
		const Flat *f = &S->f[i];
		int shard = f->grad_shard >= 0 ? f->grad_shard : view_new(S, f->grad, 0, S->za, f->chunk, f->chunk, "grad_shard_view");
		long long *off = malloc(sizeof(long long) * (size_t)f->nupd), *len = malloc(sizeof(long long) * (size_t)f->nupd);
		long long *rep = malloc(sizeof(long long) * (size_t)f->nupd);
		if (!off || !len || !rep)
			ICE("out of memory");
		for (int m = 0; m < f->nupd; m++) {
			off[m] = S->u[f->upd[m]].off;
			len[m] = S->u[f->upd[m]].n;
			rep[m] = S->u[f->upd[m]].replicas;
		}
		Kernel *k = step_kernel(S, K_SUM_SQUARES_SHARD, PH_STEP, "gradient norm");
		karg_buf(p, k, S->sumsq, true, true);
		karg_buf(p, k, shard, true, false);
		karg(p, k, KA_DTYPE, p->buf[shard].dtype);
		karg_coord(p, k, 0, S->za, f->chunk);
		karg_int(p, k, f->chunk);
		karg_int(p, k, f->nupd);
		karg_ints(p, k, off, f->nupd, false);
		karg_ints(p, k, len, f->nupd, false);
		karg_ints(p, k, rep, f->nupd, false);
		free(off);
		free(len);
		free(rep);
	}
	for (int i = 0; i < S->nu; i++) {
		const Update *u = &S->u[i];
		if (sharded(S, u) || u->replicas == 0)
			continue;
		int grad = u->chunk_grad >= 0 ? u->chunk_grad : u->grad;
		Kernel *k = step_kernel(S, K_SUM_SQUARES, PH_STEP, "gradient norm");
		karg_buf(p, k, S->sumsq, true, true);
		karg_buf(p, k, grad, true, false);
		karg_int(p, k, p->buf[grad].elems);
		karg(p, k, KA_DTYPE, p->buf[grad].dtype);
		karg_f64(p, k, local_scale * local_scale / (double)u->replicas);
	}
	for (int a = 0; a < ps->naxes; a++)
		if (ps->axes[a].size > 1 && a != S->sa)
			allreduce_inplace(S, PH_STEP, S->sumsq, 1, a, -1, "gradient norm");
	Kernel *k;
	if (ps->loss_scale != 0) { /* fp16: unscale, and skip the step when a gradient overflowed */
		k = step_kernel(S, K_UNSCALE_CLIP, PH_STEP, "unscaling and clipping");
		karg(p, k, KA_CTX, 0);
	} else {
		k = step_kernel(S, K_CLIP_COEF, PH_STEP, "clipping");
	}
	karg_buf(p, k, S->sumsq, true, false);
	karg_buf(p, k, p->norm_metric, false, true);
	karg_buf(p, k, S->coef, false, true);
	karg_f64(p, k, ps->clip);
	if (S->local) { /* the replica steps on its own mean gradient: N times its partial sum */
		k = step_kernel(S, K_SCALE_METRIC, PH_STEP, "a replica's mean gradient");
		karg_buf(p, k, S->coef, true, true);
		karg_f64(p, k, local_scale);
	}
}

static void optimizer(State *S, int target, int grad, int m, int v, long long n)
{
	LProg *p = S->p;
	PlanSpec *ps = S->ps;
	Kernel *k = step_kernel(S, K_OPTIMIZER, PH_STEP, p->buf[target].what);
	karg_int(p, k, ps->optimizer);
	karg_f64(p, k, ps->lr);
	karg_f64(p, k, ps->beta1);
	karg_f64(p, k, ps->beta2);
	karg_f64(p, k, ps->eps);
	karg_f64(p, k, ps->weight_decay);
	karg_f64(p, k, ps->momentum);
	karg_int(p, k, ps->warmup);
	karg_int(p, k, ps->total_steps);
	karg_f64(p, k, ps->min_lr);
	karg(p, k, KA_STEP, 0);
	karg_buf(p, k, target, true, true);
	karg_buf(p, k, grad, true, false);
	karg(p, k, KA_DTYPE, p->buf[grad].dtype);
	if (m >= 0)
		karg_buf(p, k, m, true, true);
	else
		karg(p, k, KA_NULL, 0);
	if (v >= 0)
		karg_buf(p, k, v, true, true);
	else
		karg(p, k, KA_NULL, 0);
	karg_int(p, k, n);
	karg_buf(p, k, S->coef_host >= 0 ? S->coef_host : S->coef, true, false); /* offload: the host's copy */
}

/* The update of every owned element, the casts to lower-precision parameters, and the ZeRO 1/2
 * gathers that make the parameters whole again. */
static void phase_update(State *S)
{
	LProg *p = S->p;
	if (S->off != PLACE_NONE)
		offload_update(S);
	for (int i = 0; i < S->nf && S->zero >= 1 && S->off == PLACE_NONE; i++) {
		const Flat *f = &S->f[i];
		int grad = f->grad_shard >= 0 ? f->grad_shard : view_new(S, f->grad, 0, S->za, f->chunk, f->chunk, "grad_shard_view");
		int mine = view_new(S, f->param, 0, S->za, f->chunk, f->chunk, "param_shard");
		optimizer(S, f->master >= 0 ? f->master : mine, grad, f->m, f->v, f->chunk);
		if (f->master >= 0)
			cast(S, PH_STEP, f->master, mine, f->chunk);
	}
	for (int i = 0; i < S->nu && S->off == PLACE_NONE; i++) {
		const Update *u = &S->u[i];
		if (sharded(S, u))
			continue;
		int grad = u->chunk_grad >= 0 ? u->chunk_grad : u->grad;
		long long n = p->buf[u->param].elems;
		optimizer(S, u->master >= 0 ? u->master : u->param, grad, u->m, u->v, n);
		if (u->master >= 0)
			cast(S, PH_STEP, u->master, u->param, n);
	}
	for (int i = 0; i < S->nf && S->zero >= 1; i++) {
		const Flat *f = &S->f[i];
		Kernel *k = step_kernel(S, K_ALLGATHER_INPLACE, PH_STEP, "the updated parameters made whole");
		karg_buf(p, k, f->param, true, true);
		karg_int(p, k, f->chunk);
		karg(p, k, KA_DTYPE, p->buf[f->param].dtype);
		karg(p, k, KA_AXIS, S->za);
		karg(p, k, KA_NULL, 0);
		comm_flat(S, k, OP_ALL_GATHER, S->za, f->total, p->buf[f->param].dtype, p->buf[f->param].what);
	}
}

/* The step's loss (or a metric summed like it), on every rank: summed where it is a partial sum,
 * and over the pipeline (only the last stage computes it); in phase ph (the step, or the end of an
 * evaluation). */
static void reduce_loss(State *S, Phase ph, int metric, const char *what)
{
	Graph *g = S->g;
	PlanSpec *ps = S->ps;
	for (int a = 0; a < ps->naxes; a++) {
		bool partial = g->vals[g->loss].lay.on[a] == LAYOUT_P;
		if ((partial || (a == ps->pipe_axis && g->nstages > 1)) && ps->axes[a].size > 1 && a != S->sa)
			allreduce_inplace(S, ph, metric, 1, a, -1, what);
	}
}

static void phase_loss(State *S)
{
	reduce_loss(S, PH_STEP, S->p->loss_metric, "the step's loss");
}

/* ------------------------------------------------------------------ sync strategies */

static void arg_buf_or_null(State *S, Kernel *k, int b, bool reads, bool writes)
{
	if (b >= 0)
		karg_buf(S->p, k, b, reads, writes);
	else
		karg(S->p, k, KA_NULL, 0);
}

static void copy_state(State *S, Phase ph, int from, int to, long long n, const char *note)
{
	cast(S, ph, from, to, n);
	S->p->k[S->p->nk - 1].note = note;
}

/* Strict sync with compression: flat bucket f of the batch axis, reduced by the plan's
 * compressor. Its kernel leaves in the bucket the sum over the axis of what every rank sent,
 * decompressed (with ZeRO 1, bf16 / fp16 reduce-scatter and leave this rank's shard); with error
 * feedback a residual per bucket keeps what compression dropped and adds it to the next step's. */
static void compress_bucket(State *S, Flat *f)
{
	LProg *p = S->p;
	PlanSpec *ps = S->ps;
	Graph *g = S->g;
	int axis = g->sync.buckets[f->bucket].axis, size = ps->axes[axis].size;
	const char *what = p->buf[f->grad].what;
	long long used = 0;
	for (int m = 0; m < f->nupd; m++)
		used += S->u[f->upd[m]].n;
	int resid = ps->error_feedback ? state_buf(S, SC_BUFFER, DT_F32, f->total, "ef_residual",
						   arena_printf(g->arena, "error feedback of %s", what))
				       : -1;
	long long *off = malloc(sizeof(long long) * (size_t)f->nupd), *len = malloc(sizeof(long long) * (size_t)f->nupd);
	long long *aux = malloc(sizeof(long long) * (size_t)f->nupd), *aux2 = malloc(sizeof(long long) * (size_t)f->nupd);
	if (!off || !len || !aux || !aux2)
		ICE("out of memory");
	for (int m = 0; m < f->nupd; m++) {
		off[m] = S->u[f->upd[m]].off;
		len[m] = S->u[f->upd[m]].n;
	}
	Kernel *k;
	if (ps->compress == COMPRESS_BF16 || ps->compress == COMPRESS_FP16) {
		DType wire = ps->compress == COMPRESS_BF16 ? DT_BF16 : DT_F16;
		int scratch = buffer_new(p, BUF_ARENA, wire, f->total, "wire", what);
		k = step_kernel(S, K_COMPRESS_CAST, PH_STEP, what);
		karg_buf(p, k, f->grad, true, true);
		karg_int(p, k, f->total);
		karg(p, k, KA_DTYPE, wire);
		arg_buf_or_null(S, k, resid, true, true);
		karg_buf(p, k, scratch, false, true);
		karg_int(p, k, S->zero >= 1 ? f->chunk : 0);
		karg(p, k, KA_AXIS, axis);
		comm_flat(S, k, S->zero >= 1 ? OP_REDUCE_SCATTER : OP_ALL_REDUCE, axis, f->total, wire, what);
	} else if (ps->compress == COMPRESS_TOPK) {
		long long kept = 0;
		for (int m = 0; m < f->nupd; m++)
			kept += aux[m] = topk_entries(ps, len[m]);
		/* (value bits, index) pairs out, every rank's in; |v| of the bucket to select from */
		int scratch = buffer_new(p, BUF_ARENA, DT_U8, 4 * (2 * kept * (size + 1) + used), "topk_scratch", what);
		k = step_kernel(S, K_COMPRESS_TOPK, PH_STEP, what);
		karg_buf(p, k, f->grad, true, true);
		karg_int(p, k, f->nupd);
		karg_ints(p, k, off, f->nupd, false);
		karg_ints(p, k, len, f->nupd, false);
		karg_ints(p, k, aux, f->nupd, false);
		arg_buf_or_null(S, k, resid, true, true);
		karg_buf(p, k, scratch, false, true);
		karg(p, k, KA_AXIS, axis);
		comm_flat(S, k, OP_ALL_GATHER, axis, 2 * kept * size, DT_I32, what);
	} else {
		long long r = ps->powersgd_rank, np = 0, nq = 0, dense = 0;
		for (int m = 0; m < f->nupd; m++) {
			const Buffer *gb = &p->buf[S->u[f->upd[m]].grad];
			long long cols = gb->rank >= 2 ? gb->ldims[gb->rank - 1] : 1;
			aux2[m] = powersgd_factors(ps, len[m] / cols, cols) ? cols : 0; /* 0: summed whole */
			aux[m] = aux2[m] ? len[m] / cols : len[m];                  /* rows, or every element */
			np += aux2[m] ? aux[m] * r : 0;
			nq += aux2[m] * r;
			dense += aux2[m] ? 0 : len[m];
		}
		int q = nq ? state_buf(S, SC_BUFFER, DT_F32, nq, "powersgd_q", arena_printf(g->arena, "PowerSGD's Q factors of %s", what))
			   : -1;
		if (q >= 0) {
			Kernel *init = step_kernel(S, K_POWERSGD_INIT, PH_INIT, "PowerSGD's first Q: the same normal draw on every rank");
			karg(p, init, KA_CTX, 0);
			karg_buf(p, init, q, false, true);
			karg_int(p, init, nq);
		}
		int scratch = buffer_new(p, BUF_ARENA, DT_F32, np + dense > 0 ? np + dense : 1, "powersgd_scratch", what);
		k = step_kernel(S, K_COMPRESS_POWERSGD, PH_STEP, what);
		karg_buf(p, k, f->grad, true, true);
		karg_int(p, k, f->nupd);
		karg_ints(p, k, off, f->nupd, false);
		karg_ints(p, k, aux, f->nupd, false);
		karg_ints(p, k, aux2, f->nupd, false);
		karg_int(p, k, r);
		arg_buf_or_null(S, k, q, true, true);
		arg_buf_or_null(S, k, resid, true, true);
		karg_buf(p, k, scratch, false, true);
		karg(p, k, KA_AXIS, axis);
		if (np) { /* P = M Q, then Q = M^T P: each summed over the axis */
			comm_flat(S, k, OP_ALL_REDUCE, axis, np, DT_F32, arena_printf(g->arena, "PowerSGD's P of %s", what));
			comm_flat(S, k, OP_ALL_REDUCE, axis, nq, DT_F32, arena_printf(g->arena, "PowerSGD's Q of %s", what));
		}
		if (dense)
			comm_flat(S, k, OP_ALL_REDUCE, axis, dense, DT_F32, arena_printf(g->arena, "vectors of %s", what));
	}
	k->bucket = f->bucket;
	free(off);
	free(len);
	free(aux);
	free(aux2);
}

/* Local SGD: every K steps (and after the last step) the replicas' parameters, or their f32
 * master weights, are averaged over the batch axis, through the outer optimizer when there is one;
 * the same call sums the losses of the steps since the last average, which planrt then logs. */
static void local_average(State *S)
{
	LProg *p = S->p;
	PlanSpec *ps = S->ps;
	if (S->param_flat < 0)
		return;
	int target = S->master_flat >= 0 ? S->master_flat : S->param_flat;
	int K = ps->every;
	p->loss_history = state_buf(S, SC_METRIC, DT_F64, K, "loss_history", "each replica's losses since the last average");
	p->loss_window = K;
	int anchor = -1, momentum = -1;
	if (ps->outer != OUTER_NONE) {
		anchor = state_buf(S, SC_OPTIM, DT_F32, S->nflat, "outer_anchor", "the parameters at the last average");
		if (ps->outer_momentum > 0)
			momentum = state_buf(S, SC_OPTIM, DT_F32, S->nflat, "outer_momentum", "the outer optimizer's momentum");
		copy_state(S, PH_INIT, target, anchor, S->nflat, "the outer optimizer starts from the initial parameters");
	}
	Kernel *k = step_kernel(S, K_LOCAL_AVERAGE, PH_STEP, "the replicas' average");
	karg(p, k, KA_CTX, 0);
	karg_int(p, k, K);
	karg_buf(p, k, target, true, true);
	karg_int(p, k, S->nflat);
	karg(p, k, KA_DTYPE, p->buf[target].dtype);
	arg_buf_or_null(S, k, target != S->param_flat ? S->param_flat : -1, false, true);
	karg(p, k, KA_DTYPE, p->buf[S->param_flat].dtype);
	karg_buf(p, k, p->loss_metric, true, false);
	karg_buf(p, k, p->loss_history, true, true);
	karg(p, k, KA_AXIS, S->sa);
	karg_int(p, k, ps->outer);
	karg_f64(p, k, ps->outer_lr);
	karg_f64(p, k, ps->outer_momentum);
	arg_buf_or_null(S, k, anchor, true, true);
	arg_buf_or_null(S, k, momentum, true, true);
	comm_flat(S, k, OP_ALL_REDUCE, S->sa, S->nflat, p->buf[target].dtype, "the parameter average");
	comm_flat(S, k, OP_ALL_REDUCE, S->sa, K, DT_F64, "the losses since the last average");
	for (int c = 0; c < k->ncomm; c++)
		k->comm[c].every = K;
}

/* An async message on the batch axis to or from the rank with coordinate peer there: channel 0
 * carries parameters (master to worker), channel 1 gradients (worker to master). */
static void comm_p2p(State *S, Kernel *k, OpKind coll, int peer, int channel, long long elems, DType t, const char *what)
{
	comm_flat(S, k, coll, S->sa, elems, t, what);
	k->comm[k->ncomm - 1].peer = peer;
	k->comm[k->ncomm - 1].channel = channel;
}

/* A worker's message: its gradients in their dtype, then its loss and the version it computed on
 * (two doubles). */
static long long push_elems(const State *S)
{
	return S->nflat + 16 / dtype_bytes(S->p->buf[S->grad_flat].dtype);
}

/* step_begin: the worker pulls parameters (blocking only while its newest version is more than
 * `staleness` updates behind the step); the master posts the receives of the workers' gradients. */
static void async_begin(State *S)
{
	LProg *p = S->p;
	int n = S->ps->axes[S->sa].size;
	DType pt = p->buf[S->param_flat].dtype, gt = p->buf[S->grad_flat].dtype;
	if (S->worker) {
		S->inbox = state_buf(S, SC_BUFFER, pt, S->nflat, "param_inbox", "the next parameter version from the master");
		Kernel *k = step_kernel(S, K_ASYNC_PULL, PH_STEP_BEGIN, "parameters at most 'staleness' versions old");
		karg(p, k, KA_CTX, 0);
		karg_int(p, k, S->ps->staleness);
		karg_buf(p, k, S->param_flat, false, true);
		karg_buf(p, k, S->inbox, true, true);
		karg_int(p, k, S->nflat);
		karg(p, k, KA_DTYPE, pt);
		karg(p, k, KA_AXIS, S->sa);
		comm_p2p(S, k, OP_RECV, 0, 0, S->nflat, pt, "parameters from the master");
		return;
	}
	int inbox = state_buf(S, SC_BUFFER, gt, (n - 1) * push_elems(S), "grad_inbox", "the workers' gradients of the step");
	Kernel *k = step_kernel(S, K_ASYNC_POST, PH_STEP_BEGIN, "receive the workers' gradients of this step");
	karg(p, k, KA_CTX, 0);
	karg_buf(p, k, inbox, false, true);
	karg_int(p, k, push_elems(S));
	karg(p, k, KA_DTYPE, gt);
	karg_int(p, k, n - 1);
	karg(p, k, KA_AXIS, S->sa);
	for (int w = 1; w < n; w++)
		comm_p2p(S, k, OP_RECV, w, 1, push_elems(S), gt, "gradients from a worker");
	S->inbox = inbox;
}

/* The master, after its own loss is complete: adds every worker's gradient and loss (in worker
 * order) and records the version each computed on. */
static void async_gather(State *S)
{
	LProg *p = S->p;
	int n = S->ps->axes[S->sa].size;
	p->versions_metric = state_buf(S, SC_METRIC, DT_F64, n, "versions", "the parameter version each rank computed on");
	Kernel *k = step_kernel(S, K_ASYNC_GATHER, PH_STEP, "the workers' gradients and losses added to the master's");
	karg(p, k, KA_CTX, 0);
	karg_int(p, k, S->ps->staleness);
	karg_buf(p, k, S->grad_flat, true, true);
	karg_int(p, k, S->nflat);
	karg(p, k, KA_DTYPE, p->buf[S->grad_flat].dtype);
	karg_buf(p, k, S->inbox, true, false);
	karg_int(p, k, n - 1);
	karg_buf(p, k, p->loss_metric, true, true);
	karg_buf(p, k, p->versions_metric, false, true);
}

/* The step's end: the worker pushes and, after its last step, drains the versions still coming;
 * the master publishes the new version to every worker. */
static void async_end(State *S)
{
	LProg *p = S->p;
	int n = S->ps->axes[S->sa].size, stale = S->ps->staleness;
	DType pt = p->buf[S->param_flat].dtype, gt = p->buf[S->grad_flat].dtype;
	if (S->worker) {
		int ring = state_buf(S, SC_BUFFER, gt, (stale + 1) * push_elems(S), "push_ring",
				     "the worker's gradient messages still in flight (staleness + 1)");
		Kernel *k = step_kernel(S, K_ASYNC_PUSH, PH_STEP, "gradients, loss and version to the master");
		karg(p, k, KA_CTX, 0);
		karg_int(p, k, stale);
		karg_buf(p, k, S->grad_flat, true, false);
		karg_int(p, k, S->nflat);
		karg(p, k, KA_DTYPE, gt);
		karg_buf(p, k, ring, true, true);
		karg_buf(p, k, p->loss_metric, true, false);
		karg(p, k, KA_AXIS, S->sa);
		comm_p2p(S, k, OP_SEND, 0, 1, push_elems(S), gt, "gradients to the master");
		k = step_kernel(S, K_ASYNC_DRAIN, PH_STEP, "after the last step: the versions still coming");
		karg(p, k, KA_CTX, 0);
		karg_buf(p, k, S->param_flat, false, true);
		karg_buf(p, k, S->inbox, true, true);
		karg_int(p, k, S->nflat);
		karg(p, k, KA_DTYPE, pt);
		karg(p, k, KA_AXIS, S->sa);
		return;
	}
	int ring = state_buf(S, SC_BUFFER, pt, (stale + 2) * S->nflat, "publish_ring",
			     "parameter versions in flight to the workers (staleness + 2)");
	Kernel *k = step_kernel(S, K_ASYNC_PUBLISH, PH_STEP, "the new version to every worker");
	karg(p, k, KA_CTX, 0);
	karg_int(p, k, stale);
	karg_buf(p, k, S->param_flat, true, false);
	karg_int(p, k, S->nflat);
	karg(p, k, KA_DTYPE, pt);
	karg_buf(p, k, ring, true, true);
	karg_int(p, k, n - 1);
	karg(p, k, KA_AXIS, S->sa);
	for (int w = 1; w < n; w++)
		comm_p2p(S, k, OP_SEND, w, 0, S->nflat, pt, "parameters to a worker");
}

static void state_prog(LProg *p)
{
	State S = {.p = p, .g = p->g, .ps = p->ps};
	S.ops = lowered_stage_ops(p->low, p->stage, &S.nops);
	PlanSpec *ps = p->ps;
	/* ZeRO and sync as zero.c and sync.c decided them */
	const ZeroSharding *z = &S.g->zero;
	const GradSync *gs = &S.g->sync;
	S.zero = z->stage;
	S.za = z->axis;
	S.zn = z->size;
	S.moments = ps->optimizer == OPT_ADAM || ps->optimizer == OPT_ADAMW ? 2 : ps->optimizer == OPT_MOMENTUM ? 1 : 0;
	S.low = ps->param_dtype != DT_F32;
	int ba = gs->axis;
	S.local = gs->mode == SYNC_LOCAL_SGD && gs->replicas;
	S.master = gs->mode == SYNC_ASYNC && gs->replicas && p->role == RANKROLE_MASTER;
	S.worker = gs->mode == SYNC_ASYNC && gs->replicas && p->role == RANKROLE_WORKER;
	S.sa = S.local || S.master || S.worker ? ba : -1;
	S.compress = gs->compress;
	S.optimizes = !S.worker;
	S.off = S.optimizes ? ps->offload_optimizer : PLACE_NONE;
	S.param_flat = S.master_flat = S.grad_flat = S.inbox = -1;
	p->loss_history = p->versions_metric = -1;
	p->loss_window = 0;
	p->norm_metric = state_buf(&S, SC_METRIC, DT_F64, 1, "grad_norm", "the gradient norm before clipping");
	S.sumsq = state_buf(&S, SC_METRIC, DT_F64, 1, "grad_sumsq", "the squared gradient norm");
	S.coef = state_buf(&S, SC_METRIC, DT_F64, 1, "clip_coef", "the clipping coefficient");
	collect_updates(&S);
	index_updates(&S);
	if (S.sa < 0) {
		/* compression works on the batch axis's flat buckets */
		S.primary = S.compress ? (S.zero ? S.za : ba) : primary_axis(&S);
		layout_flat(&S);
	} else {
		S.primary = -1;
		S.f = calloc(1, sizeof(Flat));
		layout_whole(&S);
	}
	layout_optimizer(&S);
	offload_layout(&S);
	phase_init(&S);
	phase_step_begin(&S);
	if (S.master || S.worker)
		async_begin(&S);
	phase_sync(&S);
	if (S.worker) {
		phase_loss(&S);
		async_end(&S);
	} else if (S.master) {
		phase_loss(&S);
		async_gather(&S);
		phase_norm(&S);
		phase_update(&S);
		async_end(&S);
	} else {
		phase_norm(&S);
		phase_update(&S);
		phase_loss(&S);
		if (S.local)
			local_average(&S);
	}
	phase_save(&S);
	phase_checkpoint(&S);
	phase_eval(&S);
	clear_transient_gradients(&S);
	free(S.u);
	free(S.f);
	free(S.grp);
	free(S.upd_of_grad);
	free(S.upd_of_param);
	free(S.param_of);
}

/* What the programs run, for every pass after this one, the targets and explain. */
static void record_state(Lowered *low)
{
	const Graph *g = low->g;
	const PlanSpec *ps = low->ps;
	StateRecord *r = &low->state;
	r->zero = g->zero;
	r->sync = g->sync.mode;
	r->sync_axis = g->sync.axis;
	r->local_sgd = g->sync.mode == SYNC_LOCAL_SGD && g->sync.replicas;
	r->async = g->sync.mode == SYNC_ASYNC && g->sync.replicas;
	r->compress = g->sync.compress;
	r->error_feedback = g->sync.compress && ps->error_feedback;
	r->overlap = g->sync.overlap;
	r->offload_optimizer = ps->offload_optimizer;
	r->offload_params = ps->offload_params;
	r->offload_activations = ps->offload_activations;
}

bool plan_state(Lowered *low)
{
	record_state(low);
	for (int i = 0; i < low->nprogs; i++)
		state_prog(low->progs[i]);
	return true;
}
