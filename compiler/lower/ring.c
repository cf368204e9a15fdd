/* ring.c: the ring pass, context parallelism's ring attention (Ring Attention, Megatron-Core's
 * context parallel), on the loop-level IR right after lower.
 *
 * Under `use nn.context_parallel(ctx)` every activation is split along the sequence over ctx, and
 * shard.c keeps a fused attention op's K and V split like its queries (and their gradients split,
 * not partial sums). lower.c builds the op's ordinary attention kernel over the local blocks; this
 * pass replaces each such kernel by the ring, size = |ctx| steps in the same phase:
 *
 *   forward, step t:  start shifting the K/V block held to the next rank and receiving the
 *                     previous rank's (ring_shift), attend the local queries to the block held
 *                     (ring_attention: the block that started at coordinate (coord - t) mod size,
 *                     so causal masking and dropout use global key positions; step 0 writes out
 *                     and lse, later steps merge by the online-softmax rule), finish the shift.
 *   backward, step t: the same K/V shifts; ring_attention_grad adds the block's share to dq and
 *                     writes the block's dk, dv partial into a buffer; then the partial the
 *                     previous rank sent for the same block (its sum over the ranks the block has
 *                     visited) is received and added, and the sum is shifted on. After the last
 *                     step each rank holds the complete dk, dv of the next rank's block: one more
 *                     shift takes them home, into the op's dk and dv.
 *
 * Every transfer starts before the compute of its step and is finished after it (the gradient
 * sums: before the next step's add), so the wire time hides behind the block's attention. The
 * shifts are point-to-point on the ctx axis (Comm peer PEER_RING_NEXT / PEER_RING_PREV): explain
 * counts them as sends and receives on ctx, planrt counts the same, and the collective check
 * requires each program's ring sends and receives to match one for one (every member of a ctx
 * group runs the same program, so rank c's k-th send is rank c + 1's k-th receive). Buffers: two
 * K and two V blocks (and in the backward two dk, dv partials and one received sum each), all in
 * the transient arena; memplan places them like any other.
 *
 * bf16 / f16 storage: lowering already cast the plain kernel's operands into f32 copies (lower.c's
 * lower_conversions: K and V cast in before it, out, lse, dq, dk, dv cast back after it). The ring
 * passes the K/V blocks in their stored type (half the bytes of f32, and the values the single
 * rank reads) and casts each received block into the f32 copy before its step's attention; the
 * dk, dv partials and their sums stay f32 (one rounding, at the cast back after the ring, as on one
 * rank). */
#include "lower/lower.h"

#include <stdlib.h>

enum { TAG_KV = 1, TAG_DKV = 2 }; /* the K/V ring and the ring of their gradient sums */

typedef struct Ring {
	LProg *p;
	Kernel plain;  /* the attention kernel the ring replaces (its arguments are reused) */
	bool grad;
	int axis, size;
	int k, v;      /* the local K and V blocks (f32: the kernel's operands) */
	int k16, v16;  /* under bf16 / f16 storage, the stored blocks that k and v are cast from; else -1 */
	int scratch;
} Ring;

static int block_like(Ring *R, int like, const char *name, const char *what)
{
	const Buffer *b = &R->p->buf[like];
	return buffer_new(R->p, BUF_ARENA, b->dtype, b->elems, name, what);
}

static Kernel *ring_kernel(Ring *R, KernelKind kind, const char *note)
{
	Kernel *k = kernel_new(R->p, kind, R->plain.phase, R->plain.chunk, R->plain.op);
	k->note = note;
	k->only_last_micro = R->plain.only_last_micro;
	return k;
}

static void ring_comm(Ring *R, Kernel *k, OpKind dir, int b)
{
	const Buffer *buf = &R->p->buf[b];
	Comm *c = kernel_comm(R->p, k);
	c->coll = dir;
	c->axis = R->axis;
	c->peer = dir == OP_SEND ? PEER_RING_NEXT : PEER_RING_PREV;
	c->elems = buf->elems;
	c->dtype = buf->dtype;
	c->rank = 1;
	c->shape[0] = buf->elems;
	c->op = R->plain.op;
	c->what = buf->what;
}

/* send -> the next rank, recv <- the previous one, started into requests req[0] (send), req[1] */
static void shift(Ring *R, int send, int recv, int tag, const int *req)
{
	LProg *p = R->p;
	Kernel *k = ring_kernel(R, K_RING_SHIFT, tag == TAG_KV ? "ring: K/V to the next rank" : "ring: dK/dV sums on");
	karg_buf(p, k, send, true, false);
	karg_buf(p, k, recv, false, true);
	karg_int(p, k, p->buf[send].elems);
	karg(p, k, KA_DTYPE, p->buf[send].dtype);
	karg(p, k, KA_AXIS, R->axis);
	karg_int(p, k, tag);
	karg(p, k, KA_REQ, req[0]);
	karg(p, k, KA_REQ, req[1]);
	ring_comm(R, k, OP_SEND, send);
	ring_comm(R, k, OP_RECV, recv);
}

/* waits for a shift: the sent block stays alive until here, the received one is complete */
static void finish(Ring *R, int send, int recv, const int *req)
{
	LProg *p = R->p;
	for (int i = 0; i < 2; i++) {
		Kernel *f = ring_kernel(R, K_P2P_FINISH, "ring: transfer done");
		karg(p, f, KA_CTX, 0);
		karg(p, f, KA_REQ, req[i]);
		if (i == 0)
			kernel_use(p, f, send);
		else
			kernel_def(p, f, recv);
	}
}

/* Step t's attention kernel: the plain kernel's arguments with the K/V block held (and, in the
 * backward, the dk, dv partial buffers) in place of its own, then the ring's coordinate, step
 * and size. */
static void attend(Ring *R, int t, int k, int v, int dk, int dv)
{
	LProg *p = R->p;
	const Kernel *x = &R->plain;
	Kernel *a = ring_kernel(R, R->grad ? K_RING_ATTENTION_GRAD : K_RING_ATTENTION,
				R->grad ? "ring attention backward" : "ring attention");
	int ik = R->grad ? KARG_INDEX(ATTENTION_GRAD, k) : KARG_INDEX(ATTENTION, k);
	int iv = R->grad ? KARG_INDEX(ATTENTION_GRAD, v) : KARG_INDEX(ATTENTION, v);
	int idk = R->grad ? KARG_INDEX(ATTENTION_GRAD, dk) : -1, idv = R->grad ? KARG_INDEX(ATTENTION_GRAD, dv) : -1;
	int iout = R->grad ? KARG_INDEX(ATTENTION_GRAD, dq) : KARG_INDEX(ATTENTION, out);
	int ilse = R->grad ? -1 : KARG_INDEX(ATTENTION, lse);
	int outputs = R->grad ? KARG_INDEX(ATTENTION_GRAD, dq) : KARG_INDEX(ATTENTION, out);
	for (int i = 0; i < x->nargs; i++) {
		KArg arg = x->args[i];
		if (arg.kind != KA_BUF) {
			karg_copy(p, a, &arg);
			continue;
		}
		int b = i == ik ? k : i == iv ? v : i == idk ? dk : i == idv ? dv : arg.buf;
		bool is_scratch = b == R->scratch;
		bool merged = t > 0 && (i == iout || i == ilse); /* read, then written: merged or accumulated */
		bool writes = is_scratch || (i >= outputs && i <= (R->grad ? idv : ilse));
		karg_buf(p, a, b, !is_scratch && (!writes || merged), writes);
	}
	karg_coord(p, a, 0, R->axis, 1);
	karg_int(p, a, t);
	karg_int(p, a, R->size);
	karg_int(p, a, p->g->ring_mirrored); /* causal load balancing: blocks of two mirrored chunks */
}

/* The block the attention reads at step t: under bf16 / f16 storage the stored block held, cast
 * into the f32 copy (step 0's copy was cast before the ring), else the block held itself. */
static int readable(Ring *R, int held_block, int f32_copy, int t)
{
	if (R->k16 < 0)
		return held_block;
	if (t == 0)
		return f32_copy;
	LProg *p = R->p;
	Kernel *c = ring_kernel(R, K_CAST, p->buf[held_block].dtype == DT_F16 ? "f16 storage, f32 compute"
									   : "bf16 storage, f32 compute");
	karg_buf(p, c, held_block, true, false);
	karg(p, c, KA_DTYPE, p->buf[held_block].dtype);
	karg_buf(p, c, f32_copy, false, true);
	karg(p, c, KA_DTYPE, DT_F32);
	karg_int(p, c, p->buf[held_block].elems);
	return f32_copy;
}

static void requests(Ring *R, int *req, int n)
{
	for (int i = 0; i < n; i++)
		req[i] = handle_new(R->p, HANDLE_REQUEST, "ring");
}

/* the K/V block held at step t: the local one, then the two receive buffers in turn */
static int held(const int *bufs, int local, int t)
{
	return t == 0 ? local : bufs[(t - 1) & 1];
}

/* the K/V blocks that travel: the stored ones (bf16 / f16 storage) or the kernel's f32 ones */
static int travelling_k(const Ring *R)
{
	return R->k16 >= 0 ? R->k16 : R->k;
}

static int travelling_v(const Ring *R)
{
	return R->v16 >= 0 ? R->v16 : R->v;
}

static void ring_forward(Ring *R)
{
	int kb[2], vb[2], kreq[2], vreq[2];
	for (int i = 0; i < 2; i++) {
		kb[i] = block_like(R, travelling_k(R), "ring_k", "a K block of the ring");
		vb[i] = block_like(R, travelling_v(R), "ring_v", "a V block of the ring");
	}
	requests(R, kreq, 2);
	requests(R, vreq, 2);
	for (int t = 0; t < R->size; t++) {
		int k = held(kb, travelling_k(R), t), v = held(vb, travelling_v(R), t);
		bool more = t + 1 < R->size;
		if (more) {
			shift(R, k, kb[t & 1], TAG_KV, kreq);
			shift(R, v, vb[t & 1], TAG_KV, vreq);
		}
		int k32 = readable(R, k, R->k, t), v32 = readable(R, v, R->v, t);
		attend(R, t, k32, v32, -1, -1);
		if (more) {
			finish(R, k, kb[t & 1], kreq);
			finish(R, v, vb[t & 1], vreq);
		}
	}
}

/* dst += src, elementwise (a partial dk or dv plus the sum received for the same block) */
static void add_into(Ring *R, int dst, int src)
{
	LProg *p = R->p;
	Kernel *k = ring_kernel(R, K_ACCUMULATE, "ring: add the block's gradient so far");
	karg_buf(p, k, dst, true, true);
	karg_buf(p, k, src, true, false);
	karg_int(p, k, p->buf[dst].elems);
	karg(p, k, KA_DTYPE, p->buf[dst].dtype);
}

static void ring_backward(Ring *R)
{
	const Kernel *x = &R->plain;
	int dk = x->args[KARG_INDEX(ATTENTION_GRAD, dk)].buf, dv = x->args[KARG_INDEX(ATTENTION_GRAD, dv)].buf;
	int kb[2], vb[2], pk[2], pv[2], kreq[2], vreq[2], dkreq[2], dvreq[2];
	for (int i = 0; i < 2; i++) {
		kb[i] = block_like(R, travelling_k(R), "ring_k", "a K block of the ring");
		vb[i] = block_like(R, travelling_v(R), "ring_v", "a V block of the ring");
		pk[i] = block_like(R, dk, "ring_dk", "a dK partial of the ring");
		pv[i] = block_like(R, dv, "ring_dv", "a dV partial of the ring");
	}
	int ak = block_like(R, dk, "ring_dk_in", "the dK sum received"), av = block_like(R, dv, "ring_dv_in", "the dV sum received");
	requests(R, kreq, 2);
	requests(R, vreq, 2);
	requests(R, dkreq, 2);
	requests(R, dvreq, 2);
	for (int t = 0; t < R->size; t++) {
		int k = held(kb, travelling_k(R), t), v = held(vb, travelling_v(R), t), cur = t & 1;
		bool more = t + 1 < R->size;
		if (more) {
			shift(R, k, kb[cur], TAG_KV, kreq);
			shift(R, v, vb[cur], TAG_KV, vreq);
		}
		int k32 = readable(R, k, R->k, t), v32 = readable(R, v, R->v, t);
		attend(R, t, k32, v32, pk[cur], pv[cur]);
		if (more) {
			finish(R, k, kb[cur], kreq);
			finish(R, v, vb[cur], vreq);
		}
		if (t > 0) {
			finish(R, pk[cur ^ 1], ak, dkreq);
			finish(R, pv[cur ^ 1], av, dvreq);
			add_into(R, pk[cur], ak);
			add_into(R, pv[cur], av);
		}
		shift(R, pk[cur], more ? ak : dk, TAG_DKV, dkreq);
		shift(R, pv[cur], more ? av : dv, TAG_DKV, dvreq);
	}
	int last = (R->size - 1) & 1;
	finish(R, pk[last], dk, dkreq);
	finish(R, pv[last], dv, dvreq);
}

/* Under bf16 / f16 storage, the stored buffer that f32 buffer b was cast from by one of the casts
 * right before the attention (lower_conversions puts them there), the last of the n kernels k;
 * -1 when b is not such a copy. */
static int stored_source(const Kernel *k, int n, int b)
{
	for (int i = n - 1; i >= 0 && k[i].kind == K_CAST; i--)
		if (KARG(&k[i], CAST, dst)->buf == b)
			return KARG(&k[i], CAST, src)->buf;
	return -1;
}

/* Appends the ring that replaces plain attention kernel x (a copy: the program's kernel array
 * is being rebuilt; its first n kernels, those before x, are in place). */
static void ring_attention(LProg *p, const Kernel *x, int axis)
{
	Ring R = {.p = p, .plain = *x, .axis = axis, .size = p->ps->axes[axis].size};
	R.grad = x->kind == K_ATTENTION_GRAD;
	int ik = R.grad ? KARG_INDEX(ATTENTION_GRAD, k) : KARG_INDEX(ATTENTION, k);
	int iv = R.grad ? KARG_INDEX(ATTENTION_GRAD, v) : KARG_INDEX(ATTENTION, v);
	int is = R.grad ? KARG_INDEX(ATTENTION_GRAD, scratch) : KARG_INDEX(ATTENTION, scratch);
	R.k = x->args[ik].buf;
	R.v = x->args[iv].buf;
	R.k16 = stored_source(p->k, p->nk, R.k);
	R.v16 = stored_source(p->k, p->nk, R.v);
	R.scratch = x->args[is].buf;
	if (R.grad)
		ring_backward(&R);
	else
		ring_forward(&R);
}

/* whether attention kernel k reads K/V split over the ring axis (shard.c kept them split); under
 * bf16 / f16 storage it reads K's f32 copy, cast by one of the kernels before it in p */
static bool on_ring(const LProg *p, const Kernel *k, int axis)
{
	if (k->kind != K_ATTENTION && k->kind != K_ATTENTION_GRAD)
		return false;
	int b = k->args[k->kind == K_ATTENTION ? KARG_INDEX(ATTENTION, k) : KARG_INDEX(ATTENTION_GRAD, k)].buf;
	int stored = stored_source(p->k, p->nk, b);
	int v = p->buf[buffer_root(p, stored >= 0 ? stored : b)].value;
	return v >= 0 && p->g->vals[v].lay.on[axis] == p->g->vals[v].rank - 2;
}

bool plan_ring(Lowered *low)
{
	int axis = low->ps->ring_axis;
	if (axis < 0)
		return true;
	for (int i = 0; i < low->nprogs; i++) {
		LProg *p = low->progs[i];
		if (!p)
			continue;
		Kernel *old = p->k;
		int n = p->nk;
		p->k = NULL;
		p->nk = p->capk = 0;
		for (int j = 0; j < n; j++) {
			if (on_ring(p, &old[j], axis))
				ring_attention(p, &old[j], axis);
			else
				*kernel_new(p, old[j].kind, old[j].phase, old[j].chunk, old[j].op) = old[j];
		}
		free(old);
	}
	return true;
}
