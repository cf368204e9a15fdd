/* autodiff.c: reverse-mode differentiation of the forward graph, then the optimizer update.
 *
 * The forward ops are walked from the loss back to the parameters; for each op whose outputs
 * carry a gradient, the backward ops of its op-table entry are appended (the same rules as
 * torch.autograd: matmul gives two matmuls, layer_norm gives layer_norm_grad, a broadcast add
 * gives sum_to). A value used twice gets the sum of its gradients. Backward ops reference forward
 * values directly; the forward values they read are exactly the activations that must be saved
 * for the backward pass, which is what explain.c and recompute.c count and trade.
 *
 * Gradients flow only into values that depend on a parameter. Each parameter ends with one
 * gradient value (role ROLE_GRAD, grad_of set) and one per-step optimizer_step op. */
#include "graph/graph.h"

#include <string.h>

typedef struct AD {
	Graph *g;
	int *grad;       /* value id -> its gradient value id, or -1 */
	bool *needs;     /* value id -> depends on a parameter */
	int cur_fwd;     /* the forward op being differentiated */
} AD;

static int new_like(Graph *g, int like, DType t)
{
	const Value *v = &g->vals[like];
	return graph_add_value(g, t, v->rank, v->dim, (const char *const *)v->dim_name);
}

static int bop(AD *ad, OpKind k, int nin, const int *in, int nout, const int *out)
{
	Graph *g = ad->g;
	int o = graph_add_op(g, k, nin, in, nout, out);
	const Op *f = &g->ops[ad->cur_fwd];
	Op *op = &g->ops[o];
	op_inherit(op, f);
	op->backward = true;
	op->fwd_op = ad->cur_fwd;
	for (int i = 0; i < nout; i++) {
		g->vals[out[i]].layer = f->layer;
		if (g->vals[out[i]].role == ROLE_ACT)
			g->vals[out[i]].role = ROLE_GRAD;
	}
	return o;
}

/* One-input, one-output backward op shaped like `like`. */
static int b1(AD *ad, OpKind k, int x, int like)
{
	int y = new_like(ad->g, like, ad->g->vals[like].dtype);
	bop(ad, k, 1, &x, 1, &y);
	return y;
}

static int b2(AD *ad, OpKind k, int x0, int x1, int like)
{
	int y = new_like(ad->g, like, ad->g->vals[like].dtype);
	int in[2] = {x0, x1};
	bop(ad, k, 2, in, 1, &y);
	return y;
}

static int transpose_of(AD *ad, int x)
{
	Graph *g = ad->g;
	int y = new_like(g, x, g->vals[x].dtype);
	Value *vy = &g->vals[y];
	int r = vy->rank;
	vy->dim[r - 1] = g->vals[x].dim[r - 2];
	vy->dim[r - 2] = g->vals[x].dim[r - 1];
	vy->dim_name[r - 1] = g->vals[x].dim_name[r - 2];
	vy->dim_name[r - 2] = g->vals[x].dim_name[r - 1];
	vy->alias_of = x;
	bop(ad, OP_TRANSPOSE, 1, &x, 1, &y);
	return y;
}

/* Reduces a broadcast gradient back to the shape of `target`. */
static int sum_to(AD *ad, int dy, int target)
{
	Graph *g = ad->g;
	if (value_elems(g, dy) == value_elems(g, target) && g->vals[dy].rank == g->vals[target].rank)
		return dy;
	return b1(ad, OP_SUM_TO, dy, target);
}

static void accumulate(AD *ad, int v, int dv)
{
	if (dv < 0 || !ad->needs[v])
		return;
	if (ad->grad[v] < 0) {
		ad->grad[v] = dv;
		return;
	}
	ad->grad[v] = b2(ad, OP_ADD, ad->grad[v], dv, v);
}

/* A backward MoE op keeps its forward op's routing attributes (and n: top_k or the slots). */
static void moe_grad_attributes(Op *op, const Op *f)
{
	op->n = f->n;
	op->f = f->f;
	op->moe_group = f->moe_group;
	op->moe_capacity = f->moe_capacity;
	op->moe_normalize = f->moe_normalize;
}

/* ------------------------------------------------------------------ the derivative of each op kind
 *
 * grad_KIND(ad, f, dy) appends the backward ops of the forward op f (a copy: g->ops may move
 * while ops are appended), given dy, the gradient of its first output, and accumulates the
 * gradients of its inputs. The table below maps every op kind the forward graph holds to one. */

typedef void Derivative(AD *ad, const Op *f, int dy);

/* inputs, parameters and fills: the gradient stops */
static void grad_none(AD *ad, const Op *f, int dy) {}

/* the gradient travels back: SEND on this stage, RECV on the sender's */
static void grad_recv(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int so = bop(ad, OP_SEND, 1, &dy, 0, NULL);
	g->ops[so].axis = f->axis;
	g->ops[so].n = f->n;
	g->ops[so].stage = f->stage;
	int dx = new_like(g, a, g->vals[a].dtype);
	int ro = bop(ad, OP_RECV, 1, &dy, 1, &dx);
	g->ops[ro].axis = f->axis;
	g->ops[ro].n = f->stage;
	g->ops[ro].stage = (int)f->n;
	accumulate(ad, a, dx);
}

/* y = a @ b: da = dy @ b^T; db = a^T @ dy (a weight b: contracted over every leading dim) */
static void grad_matmul(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0], b = f->in[1];
	const Value *vb = &g->vals[b];
	if (ad->needs[a]) {
		int bt = transpose_of(ad, b);
		int in[2] = {dy, bt};
		int da = new_like(g, a, g->vals[a].dtype);
		bop(ad, OP_MATMUL, 2, in, 1, &da);
		accumulate(ad, a, da);
	}
	if (ad->needs[b]) {
		int db = new_like(g, b, g->vals[b].dtype);
		if (vb->rank == 2) { /* a weight: contract a and dy over every leading dim */
			int in[2] = {a, dy};
			bop(ad, OP_MATMUL_WGRAD, 2, in, 1, &db);
		} else {
			int in[2] = {transpose_of(ad, a), dy};
			bop(ad, OP_MATMUL, 2, in, 1, &db);
		}
		accumulate(ad, b, db);
	}
}

static void grad_transpose(AD *ad, const Op *f, int dy) { accumulate(ad, f->in[0], transpose_of(ad, dy)); }

/* split_heads and merge_heads: each other's inverse, a view of dy */
static void grad_heads(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = b1(ad, f->kind == OP_SPLIT_HEADS ? OP_MERGE_HEADS : OP_SPLIT_HEADS, dy, a);
	g->vals[dx].alias_of = dy;
	g->ops[g->vals[dx].def].n = f->n;
	accumulate(ad, a, dx);
}

/* a + b, a - b: dy (negated for b), summed back over broadcast dims */
static void grad_add_sub(AD *ad, const Op *f, int dy)
{
	int a = f->in[0], b = f->in[1];
	if (ad->needs[a])
		accumulate(ad, a, sum_to(ad, dy, a));
	if (ad->needs[b])
		accumulate(ad, b, sum_to(ad, f->kind == OP_SUB ? b1(ad, OP_NEG, dy, dy) : dy, b));
}

static void grad_mul(AD *ad, const Op *f, int dy)
{
	int a = f->in[0], b = f->in[1];
	if (ad->needs[a])
		accumulate(ad, a, sum_to(ad, b2(ad, OP_MUL, dy, b, f->out[0]), a));
	if (ad->needs[b])
		accumulate(ad, b, sum_to(ad, b2(ad, OP_MUL, dy, a, f->out[0]), b));
}

static void grad_div(AD *ad, const Op *f, int dy)
{
	int a = f->in[0], b = f->in[1];
	if (ad->needs[a])
		accumulate(ad, a, sum_to(ad, b2(ad, OP_DIV, dy, b, f->out[0]), a));
	if (ad->needs[b]) { /* d(a/b)/db = -(a/b)/b */
		int q = b2(ad, OP_DIV, f->out[0], b, f->out[0]);
		int t = b2(ad, OP_MUL, dy, q, f->out[0]);
		accumulate(ad, b, sum_to(ad, b1(ad, OP_NEG, t, t), b));
	}
}

static void grad_scale(AD *ad, const Op *f, int dy)
{
	int dx = b1(ad, OP_SCALE, dy, f->in[0]);
	ad->g->ops[ad->g->vals[dx].def].f = f->f;
	accumulate(ad, f->in[0], dx);
}

static void grad_neg(AD *ad, const Op *f, int dy) { accumulate(ad, f->in[0], b1(ad, OP_NEG, dy, f->in[0])); }

/* the activations' gradient ops, from the input (gelu, silu) or the output (relu, softmax) */
static void grad_gelu(AD *ad, const Op *f, int dy)
{
	int a = f->in[0];
	int dx = b2(ad, OP_GELU_GRAD, a, dy, a);
	ad->g->ops[ad->g->vals[dx].def].s = f->s;
	accumulate(ad, a, dx);
}

static void grad_relu(AD *ad, const Op *f, int dy)
{
	accumulate(ad, f->in[0], b2(ad, OP_RELU_GRAD, f->out[0], dy, f->in[0]));
}

static void grad_silu(AD *ad, const Op *f, int dy)
{
	accumulate(ad, f->in[0], b2(ad, OP_SILU_GRAD, f->in[0], dy, f->in[0]));
}

static void grad_softmax(AD *ad, const Op *f, int dy)
{
	accumulate(ad, f->in[0], b2(ad, OP_SOFTMAX_GRAD, f->out[0], dy, f->in[0]));
}

/* dy through the forward's mask */
static void grad_dropout(AD *ad, const Op *f, int dy)
{
	int a = f->in[0];
	int dx = b2(ad, OP_DROPOUT_GRAD, f->out[1], dy, a);
	ad->g->ops[ad->g->vals[dx].def].f = f->f;
	accumulate(ad, a, dx);
}

/* the masked entries get no gradient */
static void grad_causal_mask(AD *ad, const Op *f, int dy)
{
	int a = f->in[0];
	int dx = b1(ad, OP_CAUSAL_MASK, dy, a);
	ad->g->ops[ad->g->vals[dx].def].n = 1; /* fill with zero, not -inf */
	accumulate(ad, a, dx);
}

/* layer_norm: dx, dw, db from the saved mean and rstd */
static void grad_layer_norm(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = new_like(g, a, g->vals[a].dtype);
	int dw = new_like(g, f->in[1], g->vals[f->in[1]].dtype);
	int db = new_like(g, f->in[2], g->vals[f->in[2]].dtype);
	int in[5] = {a, f->in[1], f->out[1], f->out[2], dy};
	int o2 = bop(ad, OP_LAYER_NORM_GRAD, 5, in, 3, (int[]){dx, dw, db});
	g->ops[o2].f = f->f;
	accumulate(ad, a, dx);
	accumulate(ad, f->in[1], dw);
	accumulate(ad, f->in[2], db);
}

/* rms_norm: dx, dw from the saved rstd */
static void grad_rms_norm(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = new_like(g, a, g->vals[a].dtype);
	int dw = new_like(g, f->in[1], g->vals[f->in[1]].dtype);
	int in[4] = {a, f->in[1], f->out[1], dy};
	int o2 = bop(ad, OP_RMS_NORM_GRAD, 4, in, 2, (int[]){dx, dw});
	g->ops[o2].f = f->f;
	accumulate(ad, a, dx);
	accumulate(ad, f->in[1], dw);
}

/* the table's rows the ids picked get dy (the ids get none) */
static void grad_embed(AD *ad, const Op *f, int dy)
{
	int a = f->in[0];
	if (ad->needs[a])
		accumulate(ad, a, b2(ad, OP_EMBED_GRAD, f->in[1], dy, a));
}

static void grad_cross_entropy(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dl = new_like(g, a, g->vals[a].dtype);
	int in[4] = {a, f->in[1], f->out[1], dy};
	bop(ad, OP_CROSS_ENTROPY_GRAD, 4, in, 1, &dl);
	accumulate(ad, a, dl);
}

/* gates get gradients from moe_combine; the router turns them into logit gradients */
static void grad_moe_router(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dg = ad->grad[f->out[0]];
	if (dg < 0)
		return;
	int dl = new_like(g, a, g->vals[a].dtype);
	int in[4] = {a, f->out[0], f->out[1], dg};
	int o2 = bop(ad, OP_MOE_ROUTER_GRAD, 4, in, 1, &dl);
	moe_grad_attributes(&g->ops[o2], f);
	accumulate(ad, a, dl);
}

static void grad_moe_dispatch(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = new_like(g, a, g->vals[a].dtype);
	int in[3] = {dy, f->in[1], f->in[2]};
	int o2 = bop(ad, OP_MOE_DISPATCH_GRAD, 3, in, 1, &dx);
	moe_grad_attributes(&g->ops[o2], f);
	accumulate(ad, a, dx);
}

/* the expert outputs' gradient and the gates' */
static void grad_moe_combine(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = new_like(g, a, g->vals[a].dtype);
	int dgate = new_like(g, f->in[1], g->vals[f->in[1]].dtype);
	int in[4] = {dy, a, f->in[1], f->in[2]};
	int o2 = bop(ad, OP_MOE_COMBINE_GRAD, 4, in, 2, (int[]){dx, dgate});
	moe_grad_attributes(&g->ops[o2], f);
	accumulate(ad, a, dx);
	accumulate(ad, f->in[1], dgate);
}

/* moe_aux_loss, moe_z_loss: the router logits' gradient */
static void grad_moe_loss(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dl = new_like(g, a, g->vals[a].dtype);
	int in[3] = {a, f->in[1], dy};
	int o2 = bop(ad, f->kind == OP_MOE_AUX_LOSS ? OP_MOE_AUX_LOSS_GRAD : OP_MOE_Z_LOSS_GRAD, 3, in, 1, &dl);
	moe_grad_attributes(&g->ops[o2], f);
	accumulate(ad, a, dl);
}

static void grad_unary_fn(AD *ad, const Op *f, int dy)
{
	int a = f->in[0];
	int dx = b2(ad, OP_UNARY_FN_GRAD, a, dy, a);
	ad->g->ops[ad->g->vals[dx].def].n = f->n;
	accumulate(ad, a, dx);
}

/* sum_dim (and mean): dy broadcast back; max_dim: dy to each argmax */
static void grad_reduce(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = f->kind == OP_SUM_DIM ? b1(ad, OP_SUM_DIM_GRAD, dy, a) : b2(ad, OP_MAX_DIM_GRAD, f->out[1], dy, a);
	Op *bo = &g->ops[g->vals[dx].def];
	bo->dim = f->dim;
	bo->f = f->f;
	accumulate(ad, a, dx);
}

/* mse_loss and l1_loss: d/dtarget = -d/dx */
static void grad_mse_loss(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0], b = f->in[1];
	int dx = new_like(g, a, g->vals[a].dtype);
	int in[3] = {a, b, dy};
	int o2 = bop(ad, OP_MSE_LOSS_GRAD, 3, in, 1, &dx);
	g->ops[o2].n = f->n;
	g->ops[o2].f = f->f;
	accumulate(ad, a, dx);
	if (ad->needs[b])
		accumulate(ad, b, b1(ad, OP_NEG, dx, b));
}

/* dy into the narrowed rows, zeros elsewhere */
static void grad_narrow(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = b1(ad, OP_NARROW_GRAD, dy, a);
	Op *bo = &g->ops[g->vals[dx].def];
	bo->dim = f->dim;
	bo->dim2 = f->dim2;
	bo->start = f->start;
	bo->length = f->length;
	accumulate(ad, a, dx);
}

/* each input's gradient is its rows of dy */
static void grad_concat(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	long long start = 0;
	for (int i = 0; i < f->nin; i++) {
		int x = f->in[i];
		long long n = g->vals[x].dim[f->dim];
		if (ad->needs[x]) {
			int dx = b1(ad, OP_NARROW, dy, x);
			Op *bo = &g->ops[g->vals[dx].def];
			bo->dim = f->dim;
			bo->start = start;
			bo->length = n;
			accumulate(ad, x, dx);
		}
		start += n;
	}
}

static void grad_reshape(AD *ad, const Op *f, int dy)
{
	accumulate(ad, f->in[0], b1(ad, OP_RESHAPE, dy, f->in[0]));
}

static void grad_swap_dims(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = b1(ad, OP_SWAP_DIMS, dy, a);
	g->ops[g->vals[dx].def].dim = f->dim;
	g->ops[g->vals[dx].def].dim2 = f->dim2;
	accumulate(ad, a, dx);
}

/* the copies of each head summed */
static void grad_repeat_kv(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = b1(ad, OP_REPEAT_KV_GRAD, dy, a);
	g->ops[g->vals[dx].def].dim = f->dim;
	g->ops[g->vals[dx].def].n = f->n;
	accumulate(ad, a, dx);
}

/* the rotation by minus the angles, at the same positions */
static void grad_rope(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int a = f->in[0];
	int dx = new_like(g, a, g->vals[a].dtype);
	int in[2] = {dy, f->nin > 1 ? f->in[1] : -1};
	Op *bo = &g->ops[bop(ad, OP_ROPE_GRAD, f->nin, in, 1, &dx)];
	bo->f = f->f;
	bo->n = f->n;
	bo->dim = f->dim;
	bo->dim2 = f->dim2;
	accumulate(ad, a, dx);
}

/* fused attention (attention.c): dq, dk, dv from q, k, v, the output and its row logsumexps, the
 * scores recomputed tile by tile; k and v's gradients sum over each kv head's query heads */
static void grad_attention(AD *ad, const Op *f, int dy)
{
	Graph *g = ad->g;
	int dq = new_like(g, f->in[0], g->vals[f->in[0]].dtype);
	int dk = new_like(g, f->in[1], g->vals[f->in[1]].dtype);
	int dv = new_like(g, f->in[2], g->vals[f->in[2]].dtype);
	int in[7] = {f->in[0], f->in[1], f->in[2], f->out[0], f->out[1], dy, f->nin > 3 ? f->in[3] : -1};
	Op *bo = &g->ops[bop(ad, OP_ATTENTION_GRAD, f->nin > 3 ? 7 : 6, in, 3, (int[]){dq, dk, dv})];
	bo->f = f->f;
	bo->n = f->n;
	bo->dropout_p = f->dropout_p;
	bo->orig = f->orig;
	accumulate(ad, f->in[0], dq);
	accumulate(ad, f->in[1], dk);
	accumulate(ad, f->in[2], dv);
}

/* Every op kind of a forward graph; the others (backward and communication ops, which no forward
 * graph holds) are an internal error. */
static Derivative *const derivatives[OP_COUNT] = {
	[OP_INPUT] = grad_none,
	[OP_PARAM] = grad_none,
	[OP_FILL] = grad_none,
	[OP_RECV] = grad_recv,
	[OP_MATMUL] = grad_matmul,
	[OP_TRANSPOSE] = grad_transpose,
	[OP_SPLIT_HEADS] = grad_heads,
	[OP_MERGE_HEADS] = grad_heads,
	[OP_ADD] = grad_add_sub,
	[OP_SUB] = grad_add_sub,
	[OP_MUL] = grad_mul,
	[OP_DIV] = grad_div,
	[OP_SCALE] = grad_scale,
	[OP_NEG] = grad_neg,
	[OP_GELU] = grad_gelu,
	[OP_RELU] = grad_relu,
	[OP_SILU] = grad_silu,
	[OP_DROPOUT] = grad_dropout,
	[OP_CAUSAL_MASK] = grad_causal_mask,
	[OP_SOFTMAX] = grad_softmax,
	[OP_LAYER_NORM] = grad_layer_norm,
	[OP_RMS_NORM] = grad_rms_norm,
	[OP_EMBED] = grad_embed,
	[OP_CROSS_ENTROPY] = grad_cross_entropy,
	[OP_MOE_ROUTER] = grad_moe_router,
	[OP_MOE_DISPATCH] = grad_moe_dispatch,
	[OP_MOE_COMBINE] = grad_moe_combine,
	[OP_MOE_AUX_LOSS] = grad_moe_loss,
	[OP_MOE_Z_LOSS] = grad_moe_loss,
	[OP_UNARY_FN] = grad_unary_fn,
	[OP_SUM_DIM] = grad_reduce,
	[OP_MAX_DIM] = grad_reduce,
	[OP_MSE_LOSS] = grad_mse_loss,
	[OP_NARROW] = grad_narrow,
	[OP_CONCAT] = grad_concat,
	[OP_RESHAPE] = grad_reshape,
	[OP_SWAP_DIMS] = grad_swap_dims,
	[OP_REPEAT_KV] = grad_repeat_kv,
	[OP_ROPE] = grad_rope,
	[OP_ATTENTION] = grad_attention,
};

static void differentiate(AD *ad, int o)
{
	Graph *g = ad->g;
	Op f = g->ops[o]; /* copy: g->ops may move while we append */
	if (f.nout == 0)
		return;
	int dy = ad->grad[f.out[0]];
	if (dy < 0 && f.kind != OP_MOE_ROUTER)
		return;
	ad->cur_fwd = o;
	if (!derivatives[f.kind])
		ICE("no derivative for op '%s'", op_names[f.kind]);
	derivatives[f.kind](ad, &f, dy);
}

bool autodiff(Graph *g)
{
	int nfwd = g->nops;
	int cap = g->nvals;
	AD ad = {.g = g};
	/* values are appended while differentiating: size the maps generously and grow by rebuild */
	size_t room = (size_t)cap * 8 + 1024;
	ad.grad = arena_alloc(g->arena, sizeof(int) * room);
	ad.needs = arena_alloc(g->arena, sizeof(bool) * room);
	for (size_t i = 0; i < room; i++)
		ad.grad[i] = -1;
	for (int o = 0; o < nfwd; o++) {
		const Op *op = &g->ops[o];
		bool need = op->kind == OP_PARAM && !g->vals[op->out[0]].frozen; /* buffers, `freeze` */
		for (int i = 0; i < op->nin; i++)
			if (ad.needs[op->in[i]])
				need = true;
		/* integer outputs (ids), masks and statistics never carry gradients */
		for (int i = 0; i < op->nout; i++) {
			ValueRole r = g->vals[op->out[i]].role;
			ad.needs[op->out[i]] = need && r != ROLE_MASK && r != ROLE_INDEX && r != ROLE_STAT;
		}
	}
	/* d loss / d loss = 1 */
	int one = graph_add_value(g, DT_F32, 0, NULL, NULL);
	int fo = graph_add_op(g, OP_FILL, 0, NULL, 1, &one);
	g->ops[fo].f = 1.0;
	g->ops[fo].backward = true;
	g->ops[fo].fwd_op = g->vals[g->loss].def;
	g->ops[fo].stage = g->ops[g->vals[g->loss].def].stage;
	ad.grad[g->loss] = one;
	for (int o = nfwd - 1; o >= 0; o--) {
		if ((size_t)g->nvals + 64 > room)
			ICE("autodiff value map overflow");
		differentiate(&ad, o);
	}
	g->nfwd = nfwd;
	/* one gradient per parameter, then the optimizer update */
	for (int o = 0; o < nfwd; o++) {
		if (g->ops[o].kind != OP_PARAM)
			continue;
		int p = g->ops[o].out[0];
		int dp = ad.grad[p];
		if (dp < 0 && g->vals[p].frozen)
			continue;
		if (dp < 0) {
			const Op *pop = &g->ops[o];
			diag_warning(pop->src, pop->loc, "parameter '%s' does not affect the loss and is never updated",
				     g->vals[p].name);
			continue;
		}
		if (g->vals[dp].grad_of >= 0 || g->vals[dp].role != ROLE_GRAD || g->vals[dp].alias_of >= 0) {
			/* the gradient is shared with another value (e.g. straight from dy): copy */
			int c = new_like(g, p, g->vals[p].dtype);
			int op = graph_add_op(g, OP_SCALE, 1, &dp, 1, &c);
			g->ops[op].f = 1.0;
			g->ops[op].backward = true;
			g->ops[op].fwd_op = o;
			g->ops[op].layer = g->ops[o].layer;
			g->ops[op].stage = g->ops[o].stage;
			dp = c;
		}
		g->vals[dp].role = ROLE_GRAD;
		g->vals[dp].grad_of = p;
		g->vals[dp].name = arena_printf(g->arena, "%s.grad", g->vals[p].name);
		g->vals[p].grad = dp;
	}
	for (int o = 0; o < nfwd; o++) {
		if (g->ops[o].kind != OP_PARAM)
			continue;
		int p = g->ops[o].out[0];
		if (g->vals[p].grad < 0)
			continue;
		int newp = new_like(g, p, g->vals[p].dtype);
		int in[2] = {p, g->vals[p].grad};
		int op = graph_add_op(g, OP_OPTIMIZER_STEP, 2, in, 1, &newp);
		g->ops[op].per_step = true;
		g->ops[op].layer = g->ops[o].layer;
		g->ops[op].stage = g->ops[o].stage;
		g->ops[op].fwd_op = o;
		g->ops[op].scope = g->ops[o].scope;
		g->vals[newp].role = ROLE_PARAM;
		g->vals[newp].name = g->vals[p].name;
	}
	return true;
}
