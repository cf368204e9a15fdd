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
	int a = f.in[0], b = f.nin > 1 ? f.in[1] : -1;
	switch (f.kind) {
	case OP_INPUT:
	case OP_PARAM:
	case OP_FILL:
		break;
	case OP_RECV: { /* the gradient travels back: SEND on this stage, RECV on the sender's */
		int so = bop(ad, OP_SEND, 1, &dy, 0, NULL);
		g->ops[so].axis = f.axis;
		g->ops[so].n = f.n;
		g->ops[so].stage = f.stage;
		int dx = new_like(g, a, g->vals[a].dtype);
		int ro = bop(ad, OP_RECV, 1, &dy, 1, &dx);
		g->ops[ro].axis = f.axis;
		g->ops[ro].n = f.stage;
		g->ops[ro].stage = (int)f.n;
		accumulate(ad, a, dx);
		break;
	}
	case OP_MATMUL: {
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
		break;
	}
	case OP_TRANSPOSE:
		accumulate(ad, a, transpose_of(ad, dy));
		break;
	case OP_SPLIT_HEADS: {
		int dx = b1(ad, OP_MERGE_HEADS, dy, a);
		g->vals[dx].alias_of = dy;
		g->ops[g->vals[dx].def].n = f.n;
		accumulate(ad, a, dx);
		break;
	}
	case OP_MERGE_HEADS: {
		int dx = b1(ad, OP_SPLIT_HEADS, dy, a);
		g->vals[dx].alias_of = dy;
		g->ops[g->vals[dx].def].n = f.n;
		accumulate(ad, a, dx);
		break;
	}
	case OP_ADD:
		if (ad->needs[a])
			accumulate(ad, a, sum_to(ad, dy, a));
		if (ad->needs[b])
			accumulate(ad, b, sum_to(ad, dy, b));
		break;
	case OP_SUB:
		if (ad->needs[a])
			accumulate(ad, a, sum_to(ad, dy, a));
		if (ad->needs[b])
			accumulate(ad, b, sum_to(ad, b1(ad, OP_NEG, dy, dy), b));
		break;
	case OP_MUL:
		if (ad->needs[a])
			accumulate(ad, a, sum_to(ad, b2(ad, OP_MUL, dy, b, f.out[0]), a));
		if (ad->needs[b])
			accumulate(ad, b, sum_to(ad, b2(ad, OP_MUL, dy, a, f.out[0]), b));
		break;
	case OP_DIV:
		if (ad->needs[a])
			accumulate(ad, a, sum_to(ad, b2(ad, OP_DIV, dy, b, f.out[0]), a));
		if (ad->needs[b]) { /* d(a/b)/db = -(a/b)/b */
			int q = b2(ad, OP_DIV, f.out[0], b, f.out[0]);
			int t = b2(ad, OP_MUL, dy, q, f.out[0]);
			accumulate(ad, b, sum_to(ad, b1(ad, OP_NEG, t, t), b));
		}
		break;
	case OP_SCALE: {
		int dx = b1(ad, OP_SCALE, dy, a);
		g->ops[g->vals[dx].def].f = f.f;
		accumulate(ad, a, dx);
		break;
	}
	case OP_NEG:
		accumulate(ad, a, b1(ad, OP_NEG, dy, a));
		break;
	case OP_GELU: {
		int dx = b2(ad, OP_GELU_GRAD, a, dy, a);
		g->ops[g->vals[dx].def].s = f.s;
		accumulate(ad, a, dx);
		break;
	}
	case OP_RELU:
		accumulate(ad, a, b2(ad, OP_RELU_GRAD, f.out[0], dy, a));
		break;
	case OP_SILU:
		accumulate(ad, a, b2(ad, OP_SILU_GRAD, a, dy, a));
		break;
	case OP_DROPOUT: {
		int dx = b2(ad, OP_DROPOUT_GRAD, f.out[1], dy, a);
		g->ops[g->vals[dx].def].f = f.f;
		accumulate(ad, a, dx);
		break;
	}
	case OP_CAUSAL_MASK: { /* the masked entries get no gradient */
		int dx = b1(ad, OP_CAUSAL_MASK, dy, a);
		g->ops[g->vals[dx].def].n = 1; /* fill with zero, not -inf */
		accumulate(ad, a, dx);
		break;
	}
	case OP_SOFTMAX:
		accumulate(ad, a, b2(ad, OP_SOFTMAX_GRAD, f.out[0], dy, a));
		break;
	case OP_LAYER_NORM: {
		int dx = new_like(g, a, g->vals[a].dtype);
		int dw = new_like(g, f.in[1], g->vals[f.in[1]].dtype);
		int db = new_like(g, f.in[2], g->vals[f.in[2]].dtype);
		int in[5] = {a, f.in[1], f.out[1], f.out[2], dy};
		int o2 = bop(ad, OP_LAYER_NORM_GRAD, 5, in, 3, (int[]){dx, dw, db});
		g->ops[o2].f = f.f;
		accumulate(ad, a, dx);
		accumulate(ad, f.in[1], dw);
		accumulate(ad, f.in[2], db);
		break;
	}
	case OP_RMS_NORM: {
		int dx = new_like(g, a, g->vals[a].dtype);
		int dw = new_like(g, f.in[1], g->vals[f.in[1]].dtype);
		int in[4] = {a, f.in[1], f.out[1], dy};
		int o2 = bop(ad, OP_RMS_NORM_GRAD, 4, in, 2, (int[]){dx, dw});
		g->ops[o2].f = f.f;
		accumulate(ad, a, dx);
		accumulate(ad, f.in[1], dw);
		break;
	}
	case OP_EMBED:
		if (ad->needs[a])
			accumulate(ad, a, b2(ad, OP_EMBED_GRAD, b, dy, a));
		break;
	case OP_CROSS_ENTROPY: {
		int dl = new_like(g, a, g->vals[a].dtype);
		int in[4] = {a, b, f.out[1], dy};
		bop(ad, OP_CROSS_ENTROPY_GRAD, 4, in, 1, &dl);
		accumulate(ad, a, dl);
		break;
	}
	case OP_MOE_ROUTER: {
		/* gates get gradients from moe_combine; the router turns them into logit gradients */
		int dg = ad->grad[f.out[0]];
		if (dg < 0)
			break;
		int dl = new_like(g, a, g->vals[a].dtype);
		int in[4] = {a, f.out[0], f.out[1], dg};
		int o2 = bop(ad, OP_MOE_ROUTER_GRAD, 4, in, 1, &dl);
		moe_grad_attributes(&g->ops[o2], &f);
		accumulate(ad, a, dl);
		break;
	}
	case OP_MOE_DISPATCH: {
		int dx = new_like(g, a, g->vals[a].dtype);
		int in[3] = {dy, f.in[1], f.in[2]};
		int o2 = bop(ad, OP_MOE_DISPATCH_GRAD, 3, in, 1, &dx);
		moe_grad_attributes(&g->ops[o2], &f);
		accumulate(ad, a, dx);
		break;
	}
	case OP_MOE_COMBINE: {
		int dx = new_like(g, a, g->vals[a].dtype);
		int dgate = new_like(g, f.in[1], g->vals[f.in[1]].dtype);
		int in[4] = {dy, a, f.in[1], f.in[2]};
		int o2 = bop(ad, OP_MOE_COMBINE_GRAD, 4, in, 2, (int[]){dx, dgate});
		moe_grad_attributes(&g->ops[o2], &f);
		accumulate(ad, a, dx);
		accumulate(ad, f.in[1], dgate);
		break;
	}
	case OP_MOE_AUX_LOSS:
	case OP_MOE_Z_LOSS: {
		int dl = new_like(g, a, g->vals[a].dtype);
		int in[3] = {a, b, dy};
		int o2 = bop(ad, f.kind == OP_MOE_AUX_LOSS ? OP_MOE_AUX_LOSS_GRAD : OP_MOE_Z_LOSS_GRAD, 3, in, 1, &dl);
		moe_grad_attributes(&g->ops[o2], &f);
		accumulate(ad, a, dl);
		break;
	}
	case OP_UNARY_FN: {
		int dx = b2(ad, OP_UNARY_FN_GRAD, a, dy, a);
		g->ops[g->vals[dx].def].n = f.n;
		accumulate(ad, a, dx);
		break;
	}
	case OP_SUM_DIM:
	case OP_MAX_DIM: {
		int dx = f.kind == OP_SUM_DIM ? b1(ad, OP_SUM_DIM_GRAD, dy, a) : b2(ad, OP_MAX_DIM_GRAD, f.out[1], dy, a);
		Op *bo = &g->ops[g->vals[dx].def];
		bo->dim = f.dim;
		bo->f = f.f;
		accumulate(ad, a, dx);
		break;
	}
	case OP_MSE_LOSS: { /* d/dtarget = -d/dx */
		int dx = new_like(g, a, g->vals[a].dtype);
		int in[3] = {a, b, dy};
		int o2 = bop(ad, OP_MSE_LOSS_GRAD, 3, in, 1, &dx);
		g->ops[o2].n = f.n;
		g->ops[o2].f = f.f;
		accumulate(ad, a, dx);
		if (ad->needs[b])
			accumulate(ad, b, b1(ad, OP_NEG, dx, b));
		break;
	}
	case OP_NARROW: {
		int dx = b1(ad, OP_NARROW_GRAD, dy, a);
		Op *bo = &g->ops[g->vals[dx].def];
		bo->dim = f.dim;
		bo->dim2 = f.dim2;
		bo->start = f.start;
		bo->length = f.length;
		accumulate(ad, a, dx);
		break;
	}
	case OP_CONCAT: { /* each input's gradient is its rows of dy */
		long long start = 0;
		for (int i = 0; i < f.nin; i++) {
			int x = f.in[i];
			long long n = g->vals[x].dim[f.dim];
			if (ad->needs[x]) {
				int dx = b1(ad, OP_NARROW, dy, x);
				Op *bo = &g->ops[g->vals[dx].def];
				bo->dim = f.dim;
				bo->start = start;
				bo->length = n;
				accumulate(ad, x, dx);
			}
			start += n;
		}
		break;
	}
	case OP_RESHAPE:
		accumulate(ad, a, b1(ad, OP_RESHAPE, dy, a));
		break;
	case OP_SWAP_DIMS: {
		int dx = b1(ad, OP_SWAP_DIMS, dy, a);
		g->ops[g->vals[dx].def].dim = f.dim;
		g->ops[g->vals[dx].def].dim2 = f.dim2;
		accumulate(ad, a, dx);
		break;
	}
	case OP_REPEAT_KV: {
		int dx = b1(ad, OP_REPEAT_KV_GRAD, dy, a);
		g->ops[g->vals[dx].def].dim = f.dim;
		g->ops[g->vals[dx].def].n = f.n;
		accumulate(ad, a, dx);
		break;
	}
	case OP_ROPE: { /* the rotation by minus the angles, at the same positions */
		int dx = new_like(g, a, g->vals[a].dtype);
		int in[2] = {dy, b};
		Op *bo = &g->ops[bop(ad, OP_ROPE_GRAD, f.nin, in, 1, &dx)];
		bo->f = f.f;
		bo->n = f.n;
		bo->dim = f.dim;
		bo->dim2 = f.dim2;
		accumulate(ad, a, dx);
		break;
	}
	default:
		ICE("no derivative for op '%s'", op_names[f.kind]);
	}
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
