/* lower.c: from the sharded, scheduled graph to the loop-level IR of one rank role.
 *
 * Every op of the stage becomes kernels over *local* shapes (each value's block on this rank):
 *   - matmuls, row-wise ops (softmax, norms), embedding, cross-entropy, dropout: calls into the
 *     planrt kernels; a transposed operand folds into the gemm's transpose flag;
 *   - element-wise ops become loop nests, and a chain of them whose intermediates have one
 *     consumer and are not kept for the backward is fused into one loop (one pass over memory);
 *   - collectives become planrt calls on the communicator of their mesh axis, with packing for
 *     dims that are not outermost done inside the runtime's *_dim helpers;
 *   - the gradient of each parameter accumulates over micro-batches in the state block; the
 *     per-step phase packs gradient buckets, reduces them, and runs the optimizer.
 * What the runtime cannot execute yet (pipeline transfers, experts, ZeRO, offload, sync other
 * than strict, bf16) is refused by build_supported() in main.c before lowering. */
#include "planc.h"

#include <stdlib.h>
#include <string.h>

typedef struct Lower {
	LProg *p;
	Graph *g;
	int *consumers;   /* per value: number of ops (on this stage) reading it */
	bool *kept;       /* per value: read by a backward op while produced in the forward */
	bool *skip;       /* per op: folded into another kernel */
	bool failed;
} Lower;

static Kernel *add_kernel(Lower *L, KernelKind kind, Phase ph, int op)
{
	LProg *p = L->p;
	if (p->nk == p->capk) {
		p->capk = p->capk ? p->capk * 2 : 1024;
		Kernel *nk = arena_alloc(L->g->arena, sizeof(Kernel) * (size_t)p->capk);
		if (p->nk)
			memcpy(nk, p->k, sizeof(Kernel) * (size_t)p->nk);
		p->k = nk;
	}
	Kernel *k = &p->k[p->nk++];
	memset(k, 0, sizeof *k);
	k->kind = kind;
	k->phase = ph;
	k->op = op;
	k->out = -1;
	return k;
}

static void arg_value(Kernel *k, int v)
{
	k->args[k->nargs].kind = KA_VALUE;
	k->args[k->nargs++].value = v;
}

static void arg_int(Kernel *k, long long i)
{
	k->args[k->nargs].kind = KA_INT;
	k->args[k->nargs++].i = i;
}

static void arg_f64(Kernel *k, double f)
{
	k->args[k->nargs].kind = KA_F64;
	k->args[k->nargs++].f = f;
}

static void arg_text(Kernel *k, const char *t)
{
	k->args[k->nargs].kind = KA_TEXT;
	k->args[k->nargs++].text = t;
}

/* A value-related argument; KA_OFFS with i = -1 is the whole offsets array. */
static void arg_kind(Kernel *k, KArgKind kind, int v)
{
	k->args[k->nargs].kind = kind;
	k->args[k->nargs].i = -1;
	k->args[k->nargs++].value = v;
}

static void arg_ints(Lower *L, Kernel *k, const long long *a, int n)
{
	long long *copy = arena_alloc(L->g->arena, sizeof(long long) * (size_t)(n ? n : 1));
	memcpy(copy, a, sizeof(long long) * (size_t)n);
	k->args[k->nargs].kind = KA_INTS;
	k->args[k->nargs].ints = copy;
	k->args[k->nargs++].nints = n;
}

static void use(Kernel *k, int v)
{
	if (v >= 0 && k->nuses < 16)
		k->uses[k->nuses++] = v;
}

static void def(Kernel *k, int v)
{
	if (v >= 0 && k->ndefs < 4)
		k->defs[k->ndefs++] = v;
}

static long long ldim(const Graph *g, int v, int d)
{
	const Value *val = &g->vals[v];
	long long n = val->dim[d];
	for (int a = 0; a < g->ps->naxes; a++)
		if (val->lay.on[a] == d)
			n /= g->ps->axes[a].size;
	return n;
}

static void local_dims(const Graph *g, int v, long long *out)
{
	for (int d = 0; d < g->vals[v].rank; d++)
		out[d] = ldim(g, v, d);
}

static long long lelems(const Graph *g, int v)
{
	return value_local_elems(g, v);
}

static const char *comm_of_axis(Lower *L, int axis)
{
	return arena_printf(L->g->arena, "planrt_axis_comm(%d)", axis);
}

static Phase phase_of(const Op *op)
{
	return op->per_step ? PH_STEP : op->backward ? PH_BACKWARD : PH_FORWARD;
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

/* Materialises a transpose view for a consumer that needs it contiguous. */
static void lower_transpose(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int src = op->in[0], out = op->out[0];
	long long dims[MAX_DIMS];
	local_dims(g, src, dims);
	int r = g->vals[src].rank;
	long long perm[MAX_DIMS];
	for (int d = 0; d < r; d++)
		perm[d] = d;
	perm[r - 1] = r - 2;
	perm[r - 2] = r - 1;
	Kernel *k = add_kernel(L, KER_CALL, phase_of(op), oi);
	k->fn = "planrt_k_permute_f32";
	arg_int(k, r);
	arg_ints(L, k, dims, r);
	k->args[k->nargs].kind = KA_INTS;
	long long *pc = arena_alloc(g->arena, sizeof(long long) * (size_t)r);
	memcpy(pc, perm, sizeof(long long) * (size_t)r);
	k->args[k->nargs].ints = pc;
	k->args[k->nargs++].nints = -r; /* negative: print as an int array */
	arg_value(k, src);
	arg_value(k, out);
	use(k, src);
	def(k, out);
	L->p->buf[out].cls = BUF_ARENA;
}

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
	Kernel *k = add_kernel(L, KER_CALL, phase_of(op), oi);
	k->fn = "planrt_k_matmul_f32";
	arg_int(k, batch);
	arg_int(k, M);
	arg_int(k, N);
	arg_int(k, K);
	arg_value(k, a);
	arg_int(k, ta);
	arg_int(k, stride_a);
	arg_value(k, b);
	arg_int(k, tb);
	arg_int(k, stride_b);
	arg_value(k, out);
	arg_int(k, stride_c);
	arg_int(k, g->vals[out].grad_of >= 0); /* parameter gradients accumulate over micro-batches */
	use(k, a);
	use(k, b);
	def(k, out);
}

static void lower_wgrad(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int ta, tb;
	int a = storage(g, op->in[0], &ta), dy = storage(g, op->in[1], &tb);
	if (ta || tb) {
		diag_error(op->src, op->loc, "cannot execute a weight gradient of a transposed activation yet");
		L->failed = true;
		return;
	}
	int out = op->out[0];
	const Value *va = &g->vals[op->in[0]];
	long long K = ldim(g, op->in[0], va->rank - 1);
	long long N = ldim(g, out, 1);
	long long R = lelems(g, op->in[0]) / K;
	Kernel *k = add_kernel(L, KER_CALL, phase_of(op), oi);
	k->fn = "planrt_k_matmul_f32";
	arg_int(k, 1);
	arg_int(k, K);
	arg_int(k, N);
	arg_int(k, R);
	arg_value(k, a);
	arg_int(k, 1);
	arg_int(k, 0);
	arg_value(k, dy);
	arg_int(k, 0);
	arg_int(k, 0);
	arg_value(k, out);
	arg_int(k, 0);
	arg_int(k, g->vals[out].grad_of >= 0);
	use(k, a);
	use(k, dy);
	def(k, out);
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
	e->value = v;
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

static void collect_loads(Kernel *k, const LExpr *e)
{
	if (!e)
		return;
	if (e->kind == LX_LOAD)
		use(k, e->value);
	collect_loads(k, e->a);
	collect_loads(k, e->b);
}

static void lower_elementwise(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int out = op->out[0];
	Kernel *k = add_kernel(L, KER_LOOP, phase_of(op), oi);
	k->out = out;
	k->rank = g->vals[out].rank;
	local_dims(g, out, k->dims);
	k->expr = expr_for(L, op, out);
	k->accumulate = g->vals[out].grad_of >= 0; /* gradients accumulate over micro-batches */
	for (const Op *f = op; f; ) { /* count the fused chain for the dump */
		k->nfused++;
		const Op *next = NULL;
		for (int i = 0; i < f->nin; i++) {
			int d = g->vals[f->in[i]].def;
			if (d >= 0 && L->skip[d] && elementwise(g->ops[d].kind))
				next = &g->ops[d];
		}
		f = next;
	}
	collect_loads(k, k->expr);
	def(k, out);
}

/* An element-wise op is fused into its consumer when its only reader is an element-wise op of the
 * same phase with the same output shape and nothing else keeps it. */
static void plan_fusion(Lower *L, int stage)
{
	Graph *g = L->g;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != stage || !elementwise(op->kind) || op->nout != 1)
			continue;
		int v = op->out[0];
		if (L->consumers[v] != 1 || L->kept[v] || g->vals[v].grad_of >= 0 || g->vals[v].role == ROLE_LOSS)
			continue;
		/* find the consumer */
		for (int j = i + 1; j < g->nops; j++) {
			const Op *c = &g->ops[j];
			bool reads = false;
			for (int k = 0; k < c->nin; k++)
				if (c->in[k] == v)
					reads = true;
			if (!reads)
				continue;
			if (c->stage == stage && elementwise(c->kind) && phase_of(c) == phase_of(op) &&
			    value_local_elems(g, c->out[0]) == value_local_elems(g, v) &&
			    g->vals[c->out[0]].rank == g->vals[v].rank)
				L->skip[i] = true;
			break;
		}
	}
}

/* ------------------------------------------------------------------ the other ops */

static Kernel *call(Lower *L, const Op *op, int oi, const char *fn)
{
	Kernel *k = add_kernel(L, KER_CALL, phase_of(op), oi);
	k->fn = fn;
	return k;
}

/* Outputs that accumulate (layer-norm weight gradients, embedding gradients) start from zero
 * unless they are a parameter's gradient accumulator, which the step zeroes. */
static void zero_unless_accumulator(Lower *L, const Op *op, int oi, int v)
{
	if (L->g->vals[v].grad_of >= 0)
		return;
	Kernel *z = call(L, op, oi, "planrt_fill_f32");
	arg_value(z, v);
	arg_int(z, lelems(L->g, v));
	arg_text(z, "0.0");
	def(z, v);
}

/* Buffer arguments in order, recorded as reads (or writes) for liveness. */
static void value_args(Kernel *k, const int *vals, int n, bool writes)
{
	for (int i = 0; i < n; i++) {
		arg_value(k, vals[i]);
		if (writes)
			def(k, vals[i]);
		else
			use(k, vals[i]);
	}
}

static long long rows_of(const Graph *g, int v)
{
	const Value *val = &g->vals[v];
	return lelems(g, v) / ldim(g, v, val->rank - 1);
}

static const char *dtype_enum(DType t)
{
	switch (t) {
	case DT_BF16:
		return "planrt_bf16";
	case DT_F16:
		return "planrt_f16";
	case DT_I32:
		return "planrt_i32";
	case DT_U8:
		return "planrt_u8";
	case DT_F64:
		return "planrt_f64";
	default:
		return "planrt_f32";
	}
}

/* Conversions inserted by shard.c between layouts: collectives along one mesh axis. */
static void lower_collective(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	int in = op->in[0], out = op->out[0];
	int r = g->vals[in].rank;
	long long dims[MAX_DIMS];
	local_dims(g, in, dims);
	Kernel *k = add_kernel(L, KER_CALL, phase_of(op), oi);
	size_t bytes = (size_t)lelems(g, in) * (size_t)dtype_bytes(g->vals[in].dtype);
	switch (op->kind) {
	case OP_ALL_REDUCE:
		k->fn = "planrt_allreduce_dim";
		arg_value(k, in);
		arg_value(k, out);
		arg_int(k, lelems(g, in));
		break;
	case OP_REDUCE_SCATTER:
		k->fn = "planrt_reduce_scatter_dim";
		arg_value(k, in);
		arg_value(k, out);
		arg_int(k, r);
		arg_ints(L, k, dims, r);
		arg_int(k, op->coll_dim);
		k->scratch = bytes;
		break;
	case OP_ALL_GATHER:
		k->fn = "planrt_allgather_dim";
		arg_value(k, in);
		arg_value(k, out);
		arg_int(k, r);
		arg_ints(L, k, dims, r);
		arg_int(k, op->coll_dim);
		k->scratch = bytes * (size_t)g->ps->axes[op->axis].size;
		break;
	case OP_ALL_TO_ALL:
		k->fn = "planrt_alltoall_dim";
		arg_value(k, in);
		arg_value(k, out);
		arg_int(k, r);
		arg_ints(L, k, dims, r);
		arg_int(k, op->coll_dim);
		arg_int(k, op->coll_dim2);
		k->scratch = 2 * bytes;
		break;
	case OP_SLICE:
		k->fn = "planrt_slice_dim";
		arg_value(k, in);
		arg_value(k, out);
		arg_int(k, r);
		arg_ints(L, k, dims, r);
		arg_int(k, op->coll_dim);
		break;
	default:
		ICE("not a conversion");
	}
	arg_text(k, dtype_enum(g->vals[in].dtype));
	arg_text(k, comm_of_axis(L, op->axis));
	k->typed = true;
	if (k->scratch)
		arg_kind(k, KA_SCRATCH, 0);
	use(k, in);
	def(k, out);
}

static void lower_op(Lower *L, const Op *op, int oi)
{
	Graph *g = L->g;
	Kernel *k;
	int x = op->nin ? op->in[0] : -1, y = op->nout ? op->out[0] : -1;
	switch (op->kind) {
	case OP_PARAM:
	case OP_INPUT:
	case OP_OPTIMIZER_STEP:
		return; /* handled by the program skeleton */
	case OP_FILL:
		k = call(L, op, oi, "planrt_fill_f32");
		arg_value(k, y);
		arg_int(k, 1);
		arg_text(k, "1.0 / MICRO_BATCHES");
		def(k, y);
		return;
	case OP_TRANSPOSE:
		return; /* folded into consumers; materialised on demand below */
	case OP_MATMUL:
		lower_matmul(L, op, oi);
		return;
	case OP_MATMUL_WGRAD:
		lower_wgrad(L, op, oi);
		return;
	case OP_SPLIT_HEADS:
	case OP_MERGE_HEADS: {
		/* [.., S, H*Dh] <-> [.., H, S, Dh]: a permutation of [.., S, H, Dh] */
		const Value *vi = &g->vals[x];
		int split = op->kind == OP_SPLIT_HEADS;
		int r = split ? vi->rank + 1 : vi->rank; /* rank of the 4-d (or more) view */
		long long dims[MAX_DIMS];
		long long perm[MAX_DIMS];
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
		k = call(L, op, oi, "planrt_k_permute_f32");
		arg_int(k, r);
		arg_ints(L, k, dims, r);
		long long *pc = arena_alloc(g->arena, sizeof(long long) * (size_t)r);
		memcpy(pc, perm, sizeof(long long) * (size_t)r);
		k->args[k->nargs].kind = KA_INTS;
		k->args[k->nargs].ints = pc;
		k->args[k->nargs++].nints = -r;
		arg_value(k, x);
		arg_value(k, y);
		use(k, x);
		def(k, y);
		return;
	}
	case OP_SUM_TO: {
		const Value *vi = &g->vals[x], *vo = &g->vals[y];
		long long dims[MAX_DIMS], ostr[MAX_DIMS];
		local_dims(g, x, dims);
		long long stride = 1;
		for (int d = vi->rank - 1; d >= 0; d--) {
			int dout = d - (vi->rank - vo->rank);
			if (dout < 0 || (ldim(g, y, dout) == 1 && dims[d] != 1)) {
				ostr[d] = 0;
				continue;
			}
			ostr[d] = stride;
			stride *= ldim(g, y, dout);
		}
		bool acc = g->vals[y].grad_of >= 0;
		k = call(L, op, oi, acc ? "planrt_k_sum_to_acc_f32" : "planrt_k_sum_to_f32");
		arg_int(k, vi->rank);
		arg_ints(L, k, dims, vi->rank);
		arg_value(k, x);
		arg_ints(L, k, ostr, vi->rank);
		arg_value(k, y);
		arg_int(k, lelems(g, y));
		use(k, x);
		def(k, y);
		return;
	}
	case OP_DROPOUT: {
		long long ld[MAX_DIMS];
		local_dims(g, x, ld);
		k = call(L, op, oi, "planrt_k_dropout_f32");
		arg_value(k, x);
		arg_value(k, y);
		arg_value(k, op->out[1]);
		arg_f64(k, op->f);
		arg_text(k, "step_seed");
		arg_int(k, op->orig);
		arg_int(k, g->vals[x].rank);
		arg_kind(k, KA_GDIMS, x);
		arg_ints(L, k, ld, g->vals[x].rank);
		arg_kind(k, KA_OFFS, x);
		use(k, x);
		def(k, y);
		def(k, op->out[1]);
		return;
	}
	case OP_CAUSAL_MASK: {
		int r = g->vals[x].rank;
		long long rows = ldim(g, x, r - 2), cols = ldim(g, x, r - 1);
		k = call(L, op, oi, "planrt_causal_mask_block_f32");
		arg_value(k, x);
		arg_value(k, y);
		arg_int(k, lelems(g, x) / (rows * cols));
		arg_int(k, rows);
		arg_int(k, cols);
		arg_kind(k, KA_OFFS, x);
		arg_int(k, r);
		arg_int(k, op->n == 1); /* gradient: fill with zero */
		use(k, x);
		def(k, y);
		return;
	}
	case OP_SOFTMAX:
		k = call(L, op, oi, "planrt_k_softmax_f32");
		arg_value(k, x);
		arg_value(k, y);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		use(k, x);
		def(k, y);
		return;
	case OP_SOFTMAX_GRAD:
		k = call(L, op, oi, "planrt_k_softmax_grad_f32");
		arg_value(k, op->in[0]);
		arg_value(k, op->in[1]);
		arg_value(k, y);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		use(k, op->in[0]);
		use(k, op->in[1]);
		def(k, y);
		return;
	case OP_LAYER_NORM:
		k = call(L, op, oi, "planrt_k_layer_norm_f32");
		value_args(k, op->in, 3, false);
		value_args(k, op->out, 3, true);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		arg_f64(k, op->f);
		return;
	case OP_LAYER_NORM_GRAD:
		zero_unless_accumulator(L, op, oi, op->out[1]);
		zero_unless_accumulator(L, op, oi, op->out[2]);
		k = call(L, op, oi, "planrt_k_layer_norm_grad_f32");
		value_args(k, op->in, 5, false);
		value_args(k, op->out, 3, true);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		return;
	case OP_RMS_NORM:
		k = call(L, op, oi, "planrt_k_rms_norm_f32");
		value_args(k, op->in, 2, false);
		value_args(k, op->out, 2, true);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		arg_f64(k, op->f);
		return;
	case OP_RMS_NORM_GRAD:
		zero_unless_accumulator(L, op, oi, op->out[1]);
		k = call(L, op, oi, "planrt_k_rms_norm_grad_f32");
		value_args(k, op->in, 4, false);
		value_args(k, op->out, 2, true);
		arg_int(k, rows_of(g, x));
		arg_int(k, ldim(g, x, g->vals[x].rank - 1));
		return;
	case OP_EMBED: {
		int table = op->in[0], ids = op->in[1];
		k = call(L, op, oi, "planrt_k_embed_f32");
		arg_value(k, table);
		arg_value(k, ids);
		arg_value(k, y);
		arg_int(k, lelems(g, ids));
		arg_int(k, ldim(g, table, 1));
		k->args[k->nargs].kind = KA_OFFS;
		k->args[k->nargs].value = table;
		k->args[k->nargs++].i = 0; /* element 0 of the table's offsets: the vocab offset */
		arg_int(k, ldim(g, table, 0));
		use(k, table);
		use(k, ids);
		def(k, y);
		return;
	}
	case OP_EMBED_GRAD: {
		int ids = op->in[0], dy = op->in[1];
		const Op *fwd = op->fwd_op >= 0 ? &g->ops[op->fwd_op] : NULL;
		int table = fwd ? fwd->in[0] : y;
		zero_unless_accumulator(L, op, oi, y);
		k = call(L, op, oi, "planrt_k_embed_grad_f32");
		arg_value(k, ids);
		arg_value(k, dy);
		arg_value(k, y);
		arg_int(k, lelems(g, ids));
		arg_int(k, ldim(g, y, 1));
		k->args[k->nargs].kind = KA_OFFS;
		k->args[k->nargs].value = table;
		k->args[k->nargs++].i = 0;
		arg_int(k, ldim(g, y, 0));
		use(k, ids);
		use(k, dy);
		def(k, y);
		return;
	}
	case OP_CROSS_ENTROPY: {
		int logits = op->in[0], targets = op->in[1];
		int vaxis = -1;
		int r = g->vals[logits].rank;
		for (int a = 0; a < g->ps->naxes; a++)
			if (g->vals[logits].lay.on[a] == r - 1)
				vaxis = a;
		k = call(L, op, oi, "planrt_cross_entropy_f32");
		arg_value(k, logits);
		arg_value(k, targets);
		arg_value(k, op->out[0]);
		arg_value(k, op->out[1]);
		arg_int(k, rows_of(g, logits));
		arg_int(k, ldim(g, logits, r - 1));
		k->args[k->nargs].kind = KA_OFFS;
		k->args[k->nargs].value = logits;
		k->args[k->nargs++].i = r - 1;
		arg_f64(k, 1.0 / (double)value_elems(g, targets));
		arg_text(k, vaxis >= 0 ? comm_of_axis(L, vaxis) : "NULL");
		k->scratch = (size_t)rows_of(g, logits) * 3 * sizeof(float);
		arg_kind(k, KA_SCRATCH, 0);
		use(k, logits);
		use(k, targets);
		def(k, op->out[0]);
		def(k, op->out[1]);
		return;
	}
	case OP_CROSS_ENTROPY_GRAD: {
		int logits = op->in[0], targets = op->in[1], lse = op->in[2], dl = op->in[3];
		int r = g->vals[logits].rank;
		k = call(L, op, oi, "planrt_k_ce_grad_f32");
		arg_value(k, logits);
		arg_value(k, targets);
		arg_value(k, lse);
		arg_int(k, rows_of(g, logits));
		arg_int(k, ldim(g, logits, r - 1));
		k->args[k->nargs].kind = KA_OFFS;
		k->args[k->nargs].value = logits;
		k->args[k->nargs++].i = r - 1;
		k->args[k->nargs].kind = KA_SCALAR;
		k->args[k->nargs].value = dl;
		k->args[k->nargs++].f = 1.0 / (double)value_elems(g, targets);
		arg_value(k, y);
		use(k, logits);
		use(k, targets);
		use(k, lse);
		use(k, dl);
		def(k, y);
		return;
	}
	case OP_ALL_REDUCE:
		if (op->internal)
			return; /* vocab-parallel cross-entropy reductions: inside planrt_cross_entropy_f32 */
		/* fall through */
	case OP_REDUCE_SCATTER:
	case OP_ALL_GATHER:
	case OP_ALL_TO_ALL:
	case OP_SLICE:
		if (op->kind == OP_ALL_GATHER && op->per_step && g->vals[x].def >= 0 &&
		    g->ops[g->vals[x].def].kind == OP_OPTIMIZER_STEP)
			return; /* ZeRO 1/2: the updated shards are gathered by update() in the program */
		if (op->kind == OP_ALL_GATHER && g->vals[x].lay.on[op->axis] == LAYOUT_FLAT) {
			/* ZeRO 3: the whole parameter from every rank's chunk, before a use */
			k = call(L, op, oi, "planrt_allgather_flat");
			k->typed = true;
			arg_value(k, x);
			arg_value(k, y);
			long long n = 1;
			for (int d = 0; d < g->vals[y].rank; d++)
				n *= ldim(g, y, d);
			arg_int(k, n);
			arg_text(k, dtype_enum(g->vals[x].dtype));
			arg_text(k, comm_of_axis(L, op->axis));
			arg_kind(k, KA_SCRATCH, 0);
			int size = g->ps->axes[op->axis].size;
			k->scratch = (size_t)((n + size - 1) / size) * (size_t)size * (size_t)dtype_bytes(g->vals[x].dtype);
			use(k, x);
			def(k, y);
			return;
		}
		if (op->nmembers && op->kind == OP_REDUCE_SCATTER) { /* ZeRO: a gradient bucket into chunks */
			int size = g->ps->axes[op->axis].size;
			k = call(L, op, oi, "planrt_bucket_reduce_scatter");
			k->typed = true;
			arg_int(k, op->nmembers);
			long long *mem = arena_alloc(g->arena, sizeof(long long) * (size_t)op->nmembers);
			long long *cnt = arena_alloc(g->arena, sizeof(long long) * (size_t)op->nmembers);
			char *shards = arena_strdup(g->arena, "(float *const[]){");
			long long total = 0;
			for (int i = 0; i < op->nmembers; i++) {
				int gv = op->members[i];
				mem[i] = gv;
				cnt[i] = L->p->buf[gv].elems;
				total += (cnt[i] + size - 1) / size;
				shards = arena_printf(g->arena, "%s%sGS%d", shards, i ? ", " : "", g->vals[gv].grad_of);
				use(k, gv);
			}
			k->args[k->nargs].kind = KA_INTS;
			k->args[k->nargs].ints = mem;
			k->args[k->nargs++].nints = -1000 - op->nmembers;
			arg_ints(L, k, cnt, op->nmembers);
			arg_text(k, dtype_enum(g->vals[op->members[0]].dtype));
			arg_text(k, arena_printf(g->arena, "%s}", shards));
			arg_int(k, g->ps->zero_stage >= 2);
			arg_int(k, g->ps->zero_stage >= 2);
			arg_text(k, comm_of_axis(L, op->axis));
			arg_kind(k, KA_SCRATCH, 0);
			k->scratch = (size_t)(size + 1) * (size_t)total * sizeof(float);
			return;
		}
		if (op->nmembers) { /* a gradient bucket */
			if (op->kind != OP_ALL_REDUCE) /* top-k all-gathers: compression, refused by build */
				ICE("gradient bucket '%s' reached lowering", op_names[op->kind]);
			k = call(L, op, oi, "planrt_bucket_allreduce");
			k->typed = true;
			arg_int(k, op->nmembers);
			long long *mem = arena_alloc(g->arena, sizeof(long long) * (size_t)op->nmembers);
			long long *cnt = arena_alloc(g->arena, sizeof(long long) * (size_t)op->nmembers);
			for (int i = 0; i < op->nmembers; i++) {
				mem[i] = op->members[i];
				cnt[i] = L->p->buf[op->members[i]].elems;
				use(k, op->members[i]);
			}
			k->args[k->nargs].kind = KA_INTS;
			k->args[k->nargs].ints = mem;
			k->args[k->nargs++].nints = -1000 - op->nmembers; /* printed as an array of buffer addresses */
			arg_ints(L, k, cnt, op->nmembers);
			arg_text(k, dtype_enum(g->vals[op->members[0]].dtype));
			arg_text(k, comm_of_axis(L, op->axis));
			long long total = 0; /* the members' whole local blocks (the bucket value may be ZeRO-split) */
			for (int i = 0; i < op->nmembers; i++)
				total += cnt[i];
			k->scratch = (size_t)total * (size_t)dtype_bytes(g->vals[op->members[0]].dtype);
			arg_kind(k, KA_SCRATCH, 0);
			return;
		}
		lower_collective(L, op, oi);
		return;
	default:
		if (elementwise(op->kind)) {
			if (!L->skip[oi])
				lower_elementwise(L, op, oi);
			return;
		}
		diag_error(op->src, op->loc, "planc build cannot execute '%s' yet", op_names[op->kind]);
		L->failed = true;
	}
}

/* bf16 storage: a call that is not typed (every compute kernel) computes in f32 on converted
 * copies of its bf16 operands (bf16 storage, f32 compute, as CPU autocast does); typed calls
 * (collectives) move bf16 as it is. */
static void plan_conversions(Lower *L)
{
	LProg *p = L->p;
	for (int i = 0; i < p->nk; i++) {
		Kernel *k = &p->k[i];
		if (k->kind != KER_CALL || k->typed)
			continue;
		for (int a = 0; a < k->nargs; a++) {
			if (k->args[a].kind != KA_VALUE)
				continue;
			int v = k->args[a].value;
			int r = v;
			while (p->buf[r].cls == BUF_VIEW && p->buf[r].view_of >= 0)
				r = p->buf[r].view_of;
			if (p->buf[r].dtype != DT_BF16)
				continue;
			if (k->nconv == 8)
				ICE("too many bf16 operands in one call");
			bool in = false, out = false;
			for (int u = 0; u < k->nuses; u++)
				if (k->uses[u] == v)
					in = true;
			for (int d = 0; d < k->ndefs; d++)
				if (k->defs[d] == v)
					out = true;
			/* accumulating outputs (gradients) are read too */
			if (out && L->g->vals[v].grad_of >= 0)
				in = true;
			int c = k->nconv++;
			k->conv_arg[c] = a;
			k->conv_in[c] = in || !out;
			k->conv_out[c] = out;
			k->conv_offset[c] = k->conv_bytes;
			k->conv_bytes += ((size_t)p->buf[r].elems * 4 + 63) / 64 * 64;
		}
	}
}

/* The members (gradient values) of a bucket kernel: its buffer-address array argument. */
static const KArg *bucket_members(const Kernel *k)
{
	for (int a = 0; a < k->nargs; a++)
		if (k->args[a].kind == KA_INTS && k->args[a].nints <= -1000)
			return &k->args[a];
	return NULL;
}

/* `sync strict, overlap`: every gradient bucket starts (nonblocking) right after the backward kernel
 * that finalises the last of its members, and finishes where the blocking call was. */
static void overlap_buckets(Lower *L)
{
	LProg *p = L->p;
	Graph *g = L->g;
	if (!g->ps->overlap)
		return;
	int nb = 0;
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].kind == KER_CALL && (!strcmp(p->k[i].fn, "planrt_bucket_allreduce") ||
						 !strcmp(p->k[i].fn, "planrt_bucket_reduce_scatter")))
			nb++;
	if (!nb)
		return;
	Kernel *out = arena_alloc(g->arena, sizeof(Kernel) * (size_t)(p->nk + nb));
	int *start_after = malloc(sizeof(int) * (size_t)p->nk);
	int *bucket_of = malloc(sizeof(int) * (size_t)p->nk);
	if (!start_after || !bucket_of)
		ICE("out of memory");
	p->bucket_bytes = arena_alloc(g->arena, sizeof(size_t) * (size_t)nb);
	for (int i = 0; i < p->nk; i++)
		start_after[i] = bucket_of[i] = -1;
	int b = 0;
	for (int i = 0; i < p->nk; i++) {
		Kernel *k = &p->k[i];
		const KArg *mem = k->kind == KER_CALL ? bucket_members(k) : NULL;
		if (!mem || (strcmp(k->fn, "planrt_bucket_allreduce") && strcmp(k->fn, "planrt_bucket_reduce_scatter")))
			continue;
		/* it can start early only if the backward finalises every member, and no earlier bucket
		 * (of another axis) still has to reduce the same gradients first */
		int last = -1;
		bool early = true;
		int nm = -1000 - mem->nints;
		for (int j = 0; j < i && early; j++) {
			const Kernel *kj = &p->k[j];
			for (int d = 0; d < kj->ndefs; d++)
				for (int m = 0; m < nm; m++)
					if (kj->defs[d] == (int)mem->ints[m]) {
						if (kj->phase == PH_BACKWARD)
							last = j;
						else
							early = false;
					}
			const KArg *other = kj->kind == KER_CALL ? bucket_members(kj) : NULL;
			for (int o = 0; other && o < -1000 - other->nints; o++)
				for (int m = 0; m < nm; m++)
					if (other->ints[o] == mem->ints[m])
						early = false;
		}
		if (last < 0 || !early)
			continue; /* keep the blocking call where it is */
		start_after[last] = i;
		bucket_of[i] = b;
		p->bucket_bytes[b++] = k->scratch;
	}
	p->nbuckets = b;
	int n = 0;
	for (int i = 0; i < p->nk; i++) {
		Kernel k = p->k[i];
		if (bucket_of[i] >= 0) { /* the finish, where the blocking call was */
			int id = bucket_of[i];
			bool ar = !strcmp(k.fn, "planrt_bucket_allreduce");
			Kernel f = k;
			f.nargs = 0;
			f.scratch = 0;
			f.fn = ar ? "planrt_bucket_allreduce_finish" : "planrt_bucket_reduce_scatter_finish";
			arg_text(&f, arena_printf(g->arena, "&BUCKET%d", id));
			if (ar) { /* (n, bufs, counts, dtype, comm, scratch) */
				f.args[f.nargs++] = k.args[0];
				f.args[f.nargs++] = k.args[1];
				f.args[f.nargs++] = k.args[2];
				f.args[f.nargs++] = k.args[3];
			} else { /* (n, bufs, counts, dtype, shards, accumulate, zero_source, comm, scratch) */
				f.args[f.nargs++] = k.args[0];
				f.args[f.nargs++] = k.args[2];
				f.args[f.nargs++] = k.args[4];
				f.args[f.nargs++] = k.args[5];
				f.args[f.nargs++] = k.args[7];
			}
			arg_text(&f, arena_printf(g->arena, "BUCKETBUF%d", id));
			out[n++] = f;
		} else {
			out[n++] = k;
		}
		if (start_after[i] >= 0) {
			const Kernel *bk = &p->k[start_after[i]];
			int id = bucket_of[start_after[i]];
			bool ar = !strcmp(bk->fn, "planrt_bucket_allreduce");
			Kernel s = *bk;
			s.nargs = 0;
			s.scratch = 0;
			s.phase = PH_BACKWARD;
			s.only_last_micro = bk->phase == PH_STEP; /* per-step buckets: the last micro-batch only */
			s.fn = ar ? "planrt_bucket_allreduce_start" : "planrt_bucket_reduce_scatter_start";
			arg_text(&s, arena_printf(g->arena, "&BUCKET%d", id));
			if (ar) {
				for (int a = 0; a < 5; a++)
					s.args[s.nargs++] = bk->args[a];
			} else {
				s.args[s.nargs++] = bk->args[0];
				s.args[s.nargs++] = bk->args[1];
				s.args[s.nargs++] = bk->args[2];
				s.args[s.nargs++] = bk->args[3];
				s.args[s.nargs++] = bk->args[6];
				s.args[s.nargs++] = bk->args[7];
			}
			arg_text(&s, arena_printf(g->arena, "BUCKETBUF%d", id));
			out[n++] = s;
		}
	}
	free(start_after);
	free(bucket_of);
	p->k = out;
	p->nk = n;
	p->capk = p->nk;
}

/* ZeRO-3 prefetch: each parameter's all-gather starts (nonblocking) as soon as the previous
 * gather of its phase has finished, so it travels while the previous parameter is used; the
 * gathered buffer is padded to whole chunks so the collective writes into it directly. */
static void prefetch_gathers(Lower *L)
{
	LProg *p = L->p;
	Graph *g = L->g;
	if (g->ps->zero_stage < 3)
		return;
	int ng = 0;
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].kind == KER_CALL && !strcmp(p->k[i].fn, "planrt_allgather_flat"))
			ng++;
	if (!ng)
		return;
	Kernel *out = arena_alloc(g->arena, sizeof(Kernel) * (size_t)(p->nk + ng));
	int *starts_before = malloc(sizeof(int) * (size_t)(p->nk + 1)); /* kernel index -> gather to start before it */
	int *gather_id = malloc(sizeof(int) * (size_t)p->nk);
	int *after = malloc(sizeof(int) * (size_t)p->nk);
	if (!starts_before || !gather_id || !after)
		ICE("out of memory");
	for (int i = 0; i <= p->nk; i++)
		starts_before[i] = -1;
	for (int i = 0; i < p->nk; i++)
		gather_id[i] = after[i] = -1;
	int id = 0;
	for (int ph = PH_FORWARD; ph <= PH_BACKWARD; ph++) {
		int prev = -1, first = -1;
		for (int i = 0; i < p->nk; i++) {
			if (p->k[i].phase != (Phase)ph)
				continue;
			if (first < 0)
				first = i;
			if (p->k[i].kind != KER_CALL || strcmp(p->k[i].fn, "planrt_allgather_flat"))
				continue;
			gather_id[i] = id++;
			if (prev < 0)
				starts_before[first] = i; /* the phase's first gather starts with the phase */
			else
				after[prev] = i;          /* the others start when the previous one finished */
			prev = i;
			int y = p->k[i].args[1].value;
			int size = g->ps->axes[g->ops[p->k[i].op].axis].size;
			long long n = p->buf[y].elems, c = (n + size - 1) / size;
			p->buf[y].bytes = (size_t)(c * size) * (size_t)dtype_bytes(p->buf[y].dtype);
		}
	}
	p->nprefetch = id;
	int n = 0;
	for (int i = 0; i < p->nk; i++) {
		for (int pass = 0; pass < 2; pass++) {
			int gi = pass == 0 ? starts_before[i] : -1;
			if (pass == 1) {
				Kernel k = p->k[i];
				if (gather_id[i] >= 0) { /* the finish, where the blocking gather was */
					Kernel f = k;
					f.nargs = 0;
					f.scratch = 0;
					f.nuses = 0;
					f.ndefs = 0;
					f.fn = "planrt_allgather_flat_finish";
					arg_text(&f, arena_printf(g->arena, "&GATHER%d", gather_id[i]));
					use(&f, k.args[1].value);
					out[n++] = f;
				} else {
					out[n++] = k;
				}
				gi = after[i];
			}
			if (gi < 0)
				continue;
			const Kernel *gk = &p->k[gi];
			Kernel s = *gk;
			s.nargs = 0;
			s.scratch = 0;
			s.nuses = s.ndefs = 0;
			s.fn = "planrt_allgather_flat_start";
			arg_text(&s, arena_printf(g->arena, "&GATHER%d", gather_id[gi]));
			for (int a = 0; a < 5; a++) /* shard, full, n, dtype, comm */
				s.args[s.nargs++] = gk->args[a];
			use(&s, gk->args[0].value);
			def(&s, gk->args[1].value);
			out[n++] = s;
		}
	}
	free(starts_before);
	free(gather_id);
	free(after);
	p->k = out;
	p->nk = n;
	p->capk = n;
}

LProg *lower(Graph *g, int stage)
{
	LProg *p = arena_alloc(g->arena, sizeof *p);
	p->g = g;
	p->ps = g->ps;
	p->stage = stage;
	p->loss = -1;
	p->buf = arena_alloc(g->arena, sizeof(Buffer) * (size_t)g->nvals);
	Lower L = {.p = p, .g = g};
	L.consumers = calloc((size_t)g->nvals, sizeof(int));
	L.kept = calloc((size_t)g->nvals, sizeof(bool));
	L.skip = calloc((size_t)g->nops, sizeof(bool));
	if (!L.consumers || !L.kept || !L.skip)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != stage)
			continue;
		for (int k = 0; k < op->nin; k++) {
			L.consumers[op->in[k]]++;
			int d = g->vals[op->in[k]].def;
			if (op->backward && d >= 0 && !g->ops[d].backward)
				L.kept[op->in[k]] = true;
		}
		for (int k = 0; k < op->nmembers; k++)
			L.consumers[op->members[k]]++;
	}
	/* buffers: parameters and gradient accumulators persist; views alias; the rest is arena */
	p->params = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nops + 1));
	p->inputs = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nops + 1));
	for (int v = 0; v < g->nvals; v++) {
		Buffer *b = &p->buf[v];
		const Value *val = &g->vals[v];
		b->cls = BUF_NONE;
		b->dtype = val->dtype;
		b->elems = value_local_elems(g, v);
		b->bytes = (size_t)b->elems * (size_t)dtype_bytes(val->dtype);
		b->view_of = -1;
		b->first = b->last = -1;
		local_dims(g, v, b->ldims);
		if (val->grad_of >= 0) { /* a gradient accumulator holds the whole local block (ZeRO shards it apart) */
			b->elems = 1;
			for (int d = 0; d < val->rank; d++)
				b->elems *= b->ldims[d];
			b->bytes = (size_t)b->elems * (size_t)dtype_bytes(val->dtype);
		}
	}
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != stage)
			continue;
		for (int k = 0; k < op->nout; k++) {
			int v = op->out[k];
			Buffer *b = &p->buf[v];
			if (op->kind == OP_PARAM || g->vals[v].grad_of >= 0)
				b->cls = BUF_STATE;
			else if (op->kind == OP_TRANSPOSE) {
				b->cls = BUF_VIEW;
				b->view_of = op->in[0];
			} else if (op->kind == OP_OPTIMIZER_STEP) {
				b->cls = BUF_VIEW;
				b->view_of = op->in[0];
			} else
				b->cls = BUF_ARENA;
		}
		if (op->kind == OP_PARAM)
			p->params[p->nparams++] = op->out[0];
		if (op->kind == OP_INPUT)
			p->inputs[p->ninputs++] = op->out[0];
		if (op->kind == OP_CROSS_ENTROPY || (g->vals[g->loss].def == i))
			p->loss = g->loss;
	}
	plan_fusion(&L, stage);
	for (int i = 0; i < g->nops && !L.failed; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != stage || op->role != RANKROLE_ANY)
			continue;
		/* a transpose read by anything but a matmul is materialised */
		if (op->kind == OP_TRANSPOSE) {
			bool only_matmul = true;
			for (int j = i + 1; j < g->nops; j++) {
				const Op *c = &g->ops[j];
				for (int k = 0; k < c->nin; k++)
					if (c->in[k] == op->out[0] && c->kind != OP_MATMUL)
						only_matmul = false;
			}
			if (!only_matmul)
				lower_transpose(&L, op, i);
			continue;
		}
		lower_op(&L, op, i);
	}
	plan_conversions(&L);
	overlap_buckets(&L);
	prefetch_gathers(&L);
	free(L.consumers);
	free(L.kept);
	free(L.skip);
	if (L.failed)
		return NULL;
	return p;
}

void lprog_dump(FILE *out, const LProg *p)
{
	static const char *const phases[] = {"forward", "backward", "step"};
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		fprintf(out, "%4d %-8s ", i, phases[k->phase]);
		if (k->kind == KER_LOOP)
			fprintf(out, "loop %%%d[%lld elems]%s (fused %d)\n", k->out, p->buf[k->out].elems,
				k->accumulate ? " +=" : "", k->nfused);
		else
			fprintf(out, "%s\n", k->fn);
	}
	fprintf(out, "arena %zu bytes, state %zu bytes\n", p->arena_bytes, p->state_bytes);
}
