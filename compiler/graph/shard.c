/* shard.c: sharding propagation and collective insertion.
 *
 * Every value gets a Layout: on each mesh axis it is replicated (R), a partial sum (P, OneFlow's
 * SBP) or split along one of its dims (S(d)). Parameters take their layout from the plan's
 * parameter rules (`shard layers.*.mlp.w1 : [_, tensor]`); inputs from the dim rules
 * (`shard B -> data`). Every other value's layout follows from its op's rule, walking the graph
 * in program order (forward, then backward, so the backward collectives of Megatron's f and g
 * operators fall out of the same rules as the forward ones).
 *
 * When an op cannot consume its inputs as they are, the cheapest conversion is inserted:
 *   P -> R    all_reduce          P -> S(d)  reduce_scatter
 *   S(d) -> R all_gather          S(d) -> S(e) all_to_all      R -> S(d)  slice (no traffic)
 * A partial sum is resolved into the dim a dim rule prefers on that axis (`shard S -> tensor`
 * makes Megatron's all-reduce a reduce-scatter: sequence parallelism), else all-reduced.
 * Divisibility of every split dim by its axes is checked here, with the op's location.
 *
 * Key/value heads fewer than the tensor ranks that split the query heads (MQA, GQA with
 * kv_heads < tp) are replicated as Megatron-LM does: the K/V projection weights stay whole on
 * every rank (a column rule on them is not applied on that axis), each rank computes the kv heads
 * and repeats the one its query heads share (repeat_kv of its block), and the gradient of the
 * repeat is each rank's partial sum, so the projections' gradients are all-reduced over the
 * ranks that replicate them (sync.c, as any partial-sum gradient). */
#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>

typedef struct Conv {
	Layout lay;
	int value;
	struct Conv *next;
} Conv;

typedef struct Shard {
	Graph *g;
	PlanSpec *ps;
	OpList out;             /* the rewritten op list */
	Conv **convs;     /* per value: converted copies */
	int nconvs;
	const Op *cur;    /* op being placed: collectives inherit its attributes */
	bool failed;
	/* forward value -> the converted copy every forward consumer read (-1 none, -2 several or
	 * the value itself): the backward reads that copy too, as the forward saved it */
	int *fwd_copy;
	int nfwd_copy;
	/* MoE (moe_analyse): per value, the class of an expert parameter (MP_*) and its layer (the
	 * moe_dispatch op's index in the input op list; also set for each router's idx); the input op
	 * list and the index of the op being placed in it */
	signed char *moe_param;
	int *moe_layer;
	int moe_nvals; /* the values moe_analyse classed; later ones (collectives' outputs) are none */
	const Op *old;
	int cur_old;
	/* key/value heads replicated over tensor ranks (kv_analyse): per value, the kv heads of the
	 * attention a K/V projection weight or bias feeds (0: none) and its query heads; for the
	 * attention gradient being placed, the gradients of k and v it now gives per replica (-1:
	 * none) with the kv gradient each is summed into, the axis and the repeat factor */
	int *kv_heads, *kv_q_heads;
	int kv_nvals;
	int kv_grad[2], kv_grad_of[2], kv_axis, kv_rep;
	int ring_ops; /* attention ops placed as a ring over the plan's ring axis */
} Shard;

/* ---------------------------------------------------------------- op list rebuilding */

/* Appends op to the new list; its outputs' producer is known at once (the rules look it up). */
static Op *push_op(Shard *s, const Op *op)
{
	Op *placed = oplist_add(s->g, &s->out, op);
	for (int i = 0; i < op->nout; i++)
		s->g->vals[op->out[i]].def = s->out.n - 1;
	return placed;
}

static int copy_value(Shard *s, int v)
{
	Graph *g = s->g;
	const Value *src = &g->vals[v];
	int nv = graph_add_value(g, src->dtype, src->rank, src->dim, (const char *const *)src->dim_name);
	Value *d = &g->vals[nv];
	src = &g->vals[v];
	d->role = src->role == ROLE_PARAM ? ROLE_ACT : src->role;
	d->name = src->name;
	d->layer = src->layer;
	d->lay = src->lay;
	return nv;
}

/* ---------------------------------------------------------------- layouts */

static long long split_product(const Shard *s, const Layout *l, int dim)
{
	long long n = 1;
	for (int a = 0; a < s->ps->naxes; a++)
		if (l->on[a] == dim)
			n *= s->ps->axes[a].size;
	return n;
}

/* "nn.tensor_parallel, nn.sequence_parallel": the strategies the plan uses, for notes */
static void plan_strategies(const Shard *s, char *buf, size_t n)
{
	size_t used = 0;
	buf[0] = 0;
	for (const PlanStmt *st = s->ps->plan->rules; st && used < n; st = st->next) {
		const Expr *e = st->args ? st->args->value : NULL;
		if (strcmp(st->word, "use") || !e)
			continue;
		const Expr *callee = e->kind == E_CALL ? e->lhs : e;
		if (callee->kind == E_MEMBER && callee->lhs && callee->lhs->kind == E_NAME)
			used += (size_t)snprintf(buf + used, n - used, "%s%s.%s", used ? ", " : "", callee->lhs->text, callee->text);
		else if (callee->kind == E_NAME)
			used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : "", callee->text);
	}
}

/* A split dim that its axes do not divide. The message names the plan (the model is every plan's:
 * without it, the same error of two plans would read as one) and the strategies it uses. */
static bool check_divisible(Shard *s, int v, const Layout *l, int dim, const Op *at)
{
	const Value *val = &s->g->vals[v];
	long long n = split_product(s, l, dim);
	if (n <= 1 || val->dim[dim] % n == 0)
		return true;
	if (!s->failed) {
		char axes[128] = "", uses[256];
		size_t used = 0;
		for (int a = 0; a < s->ps->naxes; a++)
			if (l->on[a] == dim && used < sizeof axes)
				used += (size_t)snprintf(axes + used, sizeof axes - used, "%s'%s' of size %d",
							 used ? " and " : "", s->ps->axes[a].name, s->ps->axes[a].size);
		plan_strategies(s, uses, sizeof uses);
		const char *dn = val->dim_name[dim], *plan = s->ps->plan->name;
		const Source *src = at && at->src ? at->src : s->ps->src;
		Loc loc = at && at->src ? at->loc : s->ps->plan->name_loc;
		bool heads = at && at->kind == OP_SPLIT_HEADS && dim == val->rank - 3;
		bool fused = at && op_classes[at->kind] == OPK_ATTENTION && v != at->in[0]; /* its k or v */
		bool kv = at && (at->kind == OP_REPEAT_KV || at->kind == OP_REPEAT_KV_GRAD || fused) && dim == val->rank - 3;
		if (heads || kv)
			diag_error(src, loc, "plan %s: the %lld %sheads%s%s%s are not divisible by mesh axis %s", plan, val->dim[dim],
				   kv ? "key/value " : "attention ", dn ? " (" : "", dn ? dn : "", dn ? ")" : "", axes);
		else if (dn)
			diag_error(src, loc, "plan %s: dimension %s = %lld%s%s is not divisible by mesh axis %s", plan, dn,
				   val->dim[dim], val->name ? " of " : "", val->name ? val->name : "", axes);
		else
			diag_error(src, loc, "plan %s: dimension %d (size %lld)%s%s is not divisible by mesh axis %s", plan, dim,
				   val->dim[dim], val->name ? " of " : "", val->name ? val->name : "", axes);
		if (at && at->call_src)
			diag_note(at->call_src, at->call_loc, "in the call to '%s' here", at->call_fn);
		diag_note(s->ps->src, s->ps->plan->name_loc, "plan %s%s%s", plan, uses[0] ? " uses " : " splits it",
			  uses[0] ? uses : "");
		if (kv)
			diag_note_plain("the query heads are split over the axis, and repeat_kv gives each its key/value head, "
					"so those would be split too; key/value heads fewer than the ranks are replicated only "
					"when the axis is a multiple of kv_heads: use kv_heads dividing or divisible by the "
					"axis, or leave the query projection unsplit");
		else if (heads)
			diag_note_plain("column-parallel attention weights split the heads over the axis; use a head count "
					"divisible by it or a smaller axis");
		else
			diag_note_plain("change the size or shard this dimension over a smaller axis");
	}
	s->failed = true;
	return false;
}

/* The dim in [lo, hi) of v that a dim rule prefers on axis a, or -1. */
static int preferred_dim_in(const Shard *s, int v, int a, int lo, int hi)
{
	const Value *val = &s->g->vals[v];
	for (int r = 0; r < s->ps->nrules; r++) {
		const ShardRule *rule = &s->ps->rules[r];
		if (!rule->dim_name || rule->axis != a)
			continue;
		for (int d = lo; d < hi && d < val->rank; d++)
			if (val->dim_name[d] && !strcmp(val->dim_name[d], rule->dim_name) &&
			    val->dim[d] % s->ps->axes[a].size == 0)
				return d;
	}
	return -1;
}

/* The dim of v that a dim rule prefers on axis a, or -1. */
static int preferred_dim(const Shard *s, int v, int a)
{
	return preferred_dim_in(s, v, a, 0, MAX_DIMS);
}

static OpKind conversion_kind(int from, int to)
{
	if (from == LAYOUT_P)
		return to == LAYOUT_R ? OP_ALL_REDUCE : OP_REDUCE_SCATTER;
	if (from >= 0)
		return to == LAYOUT_R ? OP_ALL_GATHER : OP_ALL_TO_ALL;
	return OP_SLICE;
}

/* Converts v on axis a to state `to` (R or a split dim; never P), emitting one collective. */
static int convert_axis(Shard *s, int v, int a, int to)
{
	Graph *g = s->g;
	int from = g->vals[v].lay.on[a];
	if (from == to)
		return v;
	internal_assert(to != LAYOUT_P);
	Layout want = g->vals[v].lay;
	want.on[a] = (signed char)to;
	for (Conv *c = s->convs[v]; c; c = c->next)
		if (!memcmp(&c->lay, &want, sizeof want))
			return c->value;
	if (to >= 0 && !check_divisible(s, v, &want, to, s->cur))
		return v;
	int nv = copy_value(s, v);
	g->vals[nv].lay = want;
	Op op;
	op_clear(&op);
	op.kind = conversion_kind(from, to);
	op.nin = 1;
	op.in[0] = v;
	op.nout = 1;
	op.out[0] = nv;
	op.axis = a;
	op.coll_dim = op.kind == OP_ALL_GATHER ? from : op.kind == OP_ALL_TO_ALL ? from : to;
	op.coll_dim2 = op.kind == OP_ALL_TO_ALL ? to : -1;
	op_inherit(&op, s->cur);
	op.n = -1;
	push_op(s, &op);
	if (op.kind == OP_SLICE)
		g->vals[nv].alias_of = v;
	Conv *c = arena_alloc(g->arena, sizeof *c);
	c->lay = want;
	c->value = nv;
	c->next = s->convs[v];
	s->convs[v] = c;
	return nv;
}

/* Resolves a partial sum: into the preferred dim if a dim rule names one, else replicated. */
static int resolve_partial(Shard *s, int v, int a)
{
	if (s->g->vals[v].lay.on[a] != LAYOUT_P)
		return v;
	int d = preferred_dim(s, v, a);
	return convert_axis(s, v, a, d >= 0 ? d : LAYOUT_R);
}

/* Makes dim d of v whole on axis a: all-to-all into a preferred dim when one exists, else gather. */
static int unsplit(Shard *s, int v, int a, int d)
{
	if (s->g->vals[v].lay.on[a] != d)
		return v;
	int p = preferred_dim(s, v, a);
	return convert_axis(s, v, a, p >= 0 && p != d ? p : LAYOUT_R);
}

/* ---------------------------------------------------------------- per-op rules */

/* Output dim of input dim d for a broadcast elementwise op (right aligned), or -1. */
static int bcast_dim(const Value *in, const Value *out, int d)
{
	return d + out->rank - in->rank;
}

static void set_out(Shard *s, const Op *op, int a, int state)
{
	for (int i = 0; i < op->nout; i++) {
		Value *v = &s->g->vals[op->out[i]];
		int st = state;
		if (st >= v->rank)
			st = LAYOUT_R;
		v->lay.on[a] = (signed char)st;
	}
}

static int st(const Shard *s, int v, int a) { return s->g->vals[v].lay.on[a]; }

/* Elementwise ops over broadcast operands. `linear_p`: how many P operands the op tolerates. */
static void rule_elementwise(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	const Value *out = &g->vals[op->out[0]];
	bool any_p = false, all_p = true;
	for (int i = 0; i < op->nin; i++) {
		if (st(s, op->in[i], a) == LAYOUT_P)
			any_p = true;
		else
			all_p = false;
	}
	bool linear_add = op->kind == OP_ADD || op->kind == OP_SUB;
	if (any_p && all_p && linear_add) {
		set_out(s, op, a, LAYOUT_P);
		return;
	}
	if (any_p && (op->kind == OP_MUL || op->kind == OP_DIV) && op->nin == 2) {
		int p = st(s, op->in[0], a) == LAYOUT_P ? 0 : 1;
		int other = op->in[1 - p];
		if (st(s, other, a) == LAYOUT_R && !(op->kind == OP_DIV && p == 1)) {
			set_out(s, op, a, LAYOUT_P);
			return;
		}
	}
	/* target split: the first split operand's dim (in output space) */
	int target = LAYOUT_R;
	for (int i = 0; i < op->nin && target == LAYOUT_R; i++) {
		int x = st(s, op->in[i], a);
		if (x >= 0)
			target = bcast_dim(&g->vals[op->in[i]], out, x);
	}
	if (any_p && target == LAYOUT_R) {
		/* resolve the partial sums first; they may land split on a preferred dim */
		for (int i = 0; i < op->nin; i++)
			if (st(s, op->in[i], a) == LAYOUT_P) {
				op->in[i] = resolve_partial(s, op->in[i], a);
				int x = st(s, op->in[i], a);
				if (x >= 0 && target == LAYOUT_R)
					target = bcast_dim(&g->vals[op->in[i]], out, x);
			}
	}
	for (int i = 0; i < op->nin; i++) {
		const Value *in = &g->vals[op->in[i]];
		int x = in->lay.on[a];
		int want; /* in input-dim space */
		if (target == LAYOUT_R) {
			want = LAYOUT_R;
		} else {
			int d = target - (out->rank - in->rank);
			want = (d >= 0 && in->dim[d] == out->dim[target]) ? d : LAYOUT_R; /* broadcast dims stay whole */
		}
		if (x == want)
			continue;
		if (x == LAYOUT_P)
			op->in[i] = convert_axis(s, op->in[i], a, want);
		else if (x >= 0 && want == LAYOUT_R)
			op->in[i] = convert_axis(s, op->in[i], a, LAYOUT_R);
		else
			op->in[i] = convert_axis(s, op->in[i], a, want);
	}
	set_out(s, op, a, target);
}

/* One input carried through with its layout (unary ops, linear ops, views without remapping). */
static void rule_unary(Shard *s, Op *op, int a, bool linear, int whole_from)
{
	int x = op->in[0];
	if (!linear)
		x = resolve_partial(s, x, a);
	const Value *v = &s->g->vals[x];
	for (int d = whole_from; d >= 0 && d < v->rank; d++)
		x = unsplit(s, x, a, d);
	op->in[0] = x;
	set_out(s, op, a, st(s, x, a));
}

static bool is_param_like(const Shard *s, int v)
{
	while (v >= 0) {
		const Value *val = &s->g->vals[v];
		if (val->role == ROLE_PARAM)
			return true;
		int def = val->def;
		if (def < 0)
			return false;
		const Op *op = &s->out.ops[def];
		if (op->kind != OP_TRANSPOSE && op->kind != OP_RECV)
			return false;
		v = op->in[0];
	}
	return false;
}

/* A contraction (matmul, weight gradient) of operands in0 and in1 on axis a: a partial sum times a
 * replicated operand stays a partial sum (true: decided); otherwise partial sums are resolved
 * first and the caller looks at the splits. */
static bool contraction_partials(Shard *s, Op *op, int a)
{
	int s0 = st(s, op->in[0], a), s1 = st(s, op->in[1], a);
	if ((s0 == LAYOUT_P && s1 == LAYOUT_R) || (s1 == LAYOUT_P && s0 == LAYOUT_R)) {
		set_out(s, op, a, LAYOUT_P);
		return true;
	}
	if (s0 == LAYOUT_P)
		op->in[0] = resolve_partial(s, op->in[0], a);
	if (st(s, op->in[1], a) == LAYOUT_P)
		op->in[1] = resolve_partial(s, op->in[1], a);
	return false;
}

/* Iteration dim j of a matmul whose batch dims broadcast (nr: the iteration's rank, the largest
 * of the operands' and the output's): v's dim for it, or -1 where v has none. */
static int bmm_dim(const Shard *s, int v, int nr, int j)
{
	int d = j - (nr - s->g->vals[v].rank);
	return d >= 0 ? d : -1;
}

/* whether v runs the whole of iteration batch dim j (not broadcast along it) */
static bool bmm_full(const Shard *s, const Op *op, int v, int nr, int j)
{
	int d = bmm_dim(s, v, nr, j);
	if (d < 0)
		return false;
	long long n = 1;
	for (int k = 0; k < op->nin; k++) {
		int dk = bmm_dim(s, op->in[k], nr, j);
		if (dk >= 0 && s->g->vals[op->in[k]].dim[dk] > n)
			n = s->g->vals[op->in[k]].dim[dk];
	}
	return s->g->vals[v].dim[d] == n;
}

/* A matmul whose batch dims broadcast (torch.matmul): a split batch dim that one operand runs
 * whole splits the other where it runs it too (it stays whole where it broadcasts) and the output
 * where it has the dim, else the output is a partial sum (the gradient of a broadcast operand sums
 * over the dim). The row, column and inner splits are those of a plain matmul; anything else is
 * made whole. */
static void rule_bmm(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	if (contraction_partials(s, op, a))
		return;
	int out = op->out[0];
	int nr = g->vals[out].rank;
	for (int k = 0; k < 2; k++)
		if (g->vals[op->in[k]].rank > nr)
			nr = g->vals[op->in[k]].rank;
	for (int k = 0; k < 2; k++) {
		int v = op->in[k], sv = st(s, v, a), r = g->vals[v].rank;
		if (sv < 0 || sv >= r - 2)
			continue;
		int j = sv + (nr - r);
		if (!bmm_full(s, op, v, nr, j))
			continue;
		int w = op->in[1 - k];
		int want = bmm_full(s, op, w, nr, j) ? bmm_dim(s, w, nr, j) : LAYOUT_R;
		if (st(s, w, a) != want)
			op->in[1 - k] = convert_axis(s, w, a, want);
		int od = bmm_dim(s, out, nr, j);
		set_out(s, op, a, od >= 0 && bmm_full(s, op, out, nr, j) ? od : LAYOUT_P);
		return;
	}
	int ra = g->vals[op->in[0]].rank, rb = g->vals[op->in[1]].rank, ro = g->vals[out].rank;
	int sa = st(s, op->in[0], a), sb = st(s, op->in[1], a);
	if (sa == ra - 2) { /* rows */
		if (sb != LAYOUT_R)
			op->in[1] = convert_axis(s, op->in[1], a, LAYOUT_R);
		set_out(s, op, a, ro - 2);
	} else if (sb == rb - 1) { /* columns */
		if (sa != LAYOUT_R)
			op->in[0] = convert_axis(s, op->in[0], a, LAYOUT_R);
		set_out(s, op, a, ro - 1);
	} else if (sa == ra - 1 || sb == rb - 2) { /* the inner dim: a partial sum */
		if (sa != ra - 1)
			op->in[0] = convert_axis(s, op->in[0], a, ra - 1);
		if (st(s, op->in[1], a) != rb - 2)
			op->in[1] = convert_axis(s, op->in[1], a, rb - 2);
		set_out(s, op, a, LAYOUT_P);
	} else {
		for (int k = 0; k < 2; k++)
			if (st(s, op->in[k], a) != LAYOUT_R)
				op->in[k] = convert_axis(s, op->in[k], a, LAYOUT_R);
		set_out(s, op, a, LAYOUT_R);
	}
}

static void rule_matmul(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	if (matmul_broadcasts(g, op)) {
		rule_bmm(s, op, a);
		return;
	}
	const Value *va = &g->vals[op->in[0]], *vb = &g->vals[op->in[1]];
	int ra = va->rank, rb = vb->rank;
	int aM = ra - 2, aK = ra - 1;
	int bK = rb - 2, bN = rb - 1;
	bool batched = rb > 2;
	if (contraction_partials(s, op, a))
		return;
	int sa, sb;
	/* Ulysses-style moves: operands split on a row/column dim while a dim rule prefers one of
	 * their batch dims on this axis go there by all-to-all (sequence -> heads). */
	for (int k = 0; k < 2; k++) {
		int v = op->in[k];
		int x = st(s, v, a);
		int rank = g->vals[v].rank;
		int p = preferred_dim_in(s, v, a, 0, rank - 2);
		bool x_batch = x >= 0 && x < rank - 2;
		if (x >= 0 && !x_batch && p >= 0 && batched && g->vals[op->in[1 - k]].rank == rank)
			op->in[k] = convert_axis(s, v, a, p);
	}
	/* an operand split off the other's batch split whose copy in that split exists already (the
	 * expert-split gradient of an MoE layer's buffer): that copy, at no cost */
	for (int k = 0; k < 2 && batched && ra == rb; k++) {
		int x = st(s, op->in[1 - k], a), y = st(s, op->in[k], a);
		if (x >= 0 && x < ra - 2 && y >= 0 && y != x) {
			Layout want = g->vals[op->in[k]].lay;
			want.on[a] = (signed char)x;
			for (Conv *c = s->convs[op->in[k]]; c; c = c->next)
				if (!memcmp(&c->lay, &want, sizeof want)) {
					op->in[k] = c->value;
					break;
				}
		}
	}
	/* a split on K while the weight is whole and a dim rule prefers another dim: all-to-all */
	if (st(s, op->in[0], a) == aK && st(s, op->in[1], a) == LAYOUT_R) {
		int p = preferred_dim(s, op->in[0], a);
		if (p >= 0 && p != aK && !batched)
			op->in[0] = convert_axis(s, op->in[0], a, p);
	}
	for (int round = 0; round < 3; round++) {
		sa = st(s, op->in[0], a);
		sb = st(s, op->in[1], a);
		if (sa == LAYOUT_R && sb == LAYOUT_R) {
			set_out(s, op, a, LAYOUT_R);
			return;
		}
		if (sa >= 0 && sa < aM && sb == LAYOUT_R) { /* batch dim of a */
			if (batched)
				op->in[1] = convert_axis(s, op->in[1], a, sa);
			set_out(s, op, a, sa);
			return;
		}
		if (sa == aM && sb == LAYOUT_R) {
			set_out(s, op, a, aM);
			return;
		}
		if (sa == aK && sb == LAYOUT_R) {
			op->in[1] = convert_axis(s, op->in[1], a, bK);
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (sa == LAYOUT_R && sb == bK) {
			op->in[0] = convert_axis(s, op->in[0], a, aK);
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (sa == LAYOUT_R && sb == bN) {
			set_out(s, op, a, ra - 1);
			return;
		}
		if (sa == LAYOUT_R && batched && sb >= 0 && sb < bK) {
			op->in[0] = convert_axis(s, op->in[0], a, sb);
			set_out(s, op, a, sb);
			return;
		}
		if (sa == aK && sb == bK) {
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (batched && sa >= 0 && sa < aM && sa == sb) {
			set_out(s, op, a, sa);
			return;
		}
		/* conflict: keep the weight (parameter) as the plan laid it out and move the other */
		int fix = is_param_like(s, op->in[1]) || !is_param_like(s, op->in[0]) ? 0 : 1;
		int keep_state = fix == 0 ? sb : sa;
		int want = LAYOUT_R;
		if (fix == 0) {
			if (keep_state == bK)
				want = aK;
			else if (batched && keep_state >= 0 && keep_state < bK)
				want = keep_state;
		} else {
			if (keep_state == aK)
				want = bK;
			else if (batched && keep_state >= 0 && keep_state < aM)
				want = keep_state;
		}
		op->in[fix] = convert_axis(s, op->in[fix], a, want);
		if (s->failed)
			return;
	}
	ICE("matmul sharding did not converge");
}

/* matmul_wgrad(a [.., M, K], dy [.., M, N]) -> [K, N]: contracts every leading dim. */
static void rule_wgrad(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int ra = g->vals[op->in[0]].rank;
	if (contraction_partials(s, op, a))
		return;
	int sa, sd;
	for (int round = 0; round < 3; round++) {
		sa = st(s, op->in[0], a);
		sd = st(s, op->in[1], a);
		bool ca = sa >= 0 && sa < ra - 1, cd = sd >= 0 && sd < ra - 1; /* contracted dims */
		if (sa == LAYOUT_R && sd == LAYOUT_R) {
			set_out(s, op, a, LAYOUT_R);
			return;
		}
		if (ca && sd == sa) {
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (ca && sd == LAYOUT_R) {
			op->in[1] = convert_axis(s, op->in[1], a, sa);
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (cd && sa == LAYOUT_R) {
			op->in[0] = convert_axis(s, op->in[0], a, sd);
			set_out(s, op, a, LAYOUT_P);
			return;
		}
		if (sa == ra - 1 && sd == LAYOUT_R) {
			set_out(s, op, a, 0);
			return;
		}
		if (sa == LAYOUT_R && sd == ra - 1) {
			set_out(s, op, a, 1);
			return;
		}
		/* conflict. The weight's split decides: a gradient split on N (column parallel) needs the
		 * whole input (gathered again, as Megatron's sequence parallelism does); an input split
		 * on K (row parallel) needs the whole gradient; otherwise align the token splits. */
		const Op *fwd = op->fwd_op >= 0 ? &g->ops[op->fwd_op] : NULL;
		bool weight_whole = fwd && fwd->kind == OP_MATMUL && st(s, fwd->in[1], a) == LAYOUT_R;
		if (sd == ra - 1 && ca && weight_whole) /* Ulysses: the gradient returns to the token split */
			op->in[1] = convert_axis(s, op->in[1], a, sa);
		else if (sd == ra - 1 && ca)
			op->in[0] = convert_axis(s, op->in[0], a, LAYOUT_R);
		else if (sa == ra - 1 && cd)
			op->in[1] = convert_axis(s, op->in[1], a, LAYOUT_R);
		else if (sa == ra - 1 && sd == ra - 1)
			op->in[1] = convert_axis(s, op->in[1], a, LAYOUT_R);
		else
			op->in[1] = convert_axis(s, op->in[1], a, sa);
		if (s->failed)
			return;
	}
	ICE("wgrad sharding did not converge");
}

static void rule_embed(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int table = op->in[0], ids = op->in[1];
	int si = st(s, ids, a);
	if (si == LAYOUT_P || si >= g->vals[ids].rank)
		op->in[1] = ids = convert_axis(s, ids, a, LAYOUT_R);
	int stt = st(s, table, a);
	if (stt >= 0 && st(s, ids, a) >= 0)
		op->in[1] = ids = convert_axis(s, ids, a, LAYOUT_R);
	si = st(s, ids, a);
	if (stt == 0)
		set_out(s, op, a, LAYOUT_P);
	else if (stt == 1)
		set_out(s, op, a, g->vals[ids].rank);
	else
		set_out(s, op, a, si);
}

static void rule_embed_grad(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int ids = op->in[0];
	int dy = resolve_partial(s, op->in[1], a);
	int si = st(s, ids, a);
	int rank = g->vals[ids].rank;
	const Op *fwd = op->fwd_op >= 0 ? &g->ops[op->fwd_op] : NULL;
	int table_state = fwd ? st(s, fwd->in[0], a) : LAYOUT_R;
	if (table_state >= 0 && si >= 0) {
		op->in[0] = ids = convert_axis(s, ids, a, LAYOUT_R);
		si = LAYOUT_R;
	}
	if (si >= 0) {
		dy = convert_axis(s, dy, a, si);
		op->in[1] = dy;
		set_out(s, op, a, LAYOUT_P);
		return;
	}
	if (table_state == 1) {
		op->in[1] = convert_axis(s, dy, a, rank);
		set_out(s, op, a, 1);
		return;
	}
	op->in[1] = convert_axis(s, dy, a, LAYOUT_R);
	set_out(s, op, a, table_state == 0 ? 0 : LAYOUT_R);
}

/* Row-wise ops: the last dim of the first input must be whole; others follow the first. */
static void rule_rowwise(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int x = resolve_partial(s, op->in[0], a);
	x = unsplit(s, x, a, g->vals[x].rank - 1);
	op->in[0] = x;
	int sx = st(s, x, a);
	for (int i = 1; i < op->nin; i++) {
		int v = op->in[i];
		const Value *vv = &g->vals[v];
		int want;
		if (vv->role == ROLE_PARAM || (vv->rank == 1 && g->vals[x].rank > 1))
			want = LAYOUT_R; /* per-feature weights */
		else if (vv->rank == g->vals[x].rank - 1)
			want = sx >= 0 && sx < vv->rank ? sx : LAYOUT_R; /* statistics */
		else
			want = sx;
		if (st(s, v, a) != want)
			op->in[i] = convert_axis(s, v, a, want);
	}
	for (int k = 0; k < op->nout; k++) {
		Value *o = &g->vals[op->out[k]];
		if (o->rank == g->vals[x].rank)
			o->lay.on[a] = (signed char)sx;
		else if (o->rank == g->vals[x].rank - 1)
			o->lay.on[a] = (signed char)(sx >= 0 && sx < o->rank ? sx : LAYOUT_R);
		else /* weight gradients: partial over split token dims */
			o->lay.on[a] = sx >= 0 ? LAYOUT_P : LAYOUT_R;
	}
}

/* Collective helper for vocab-parallel cross entropy: a reduction over the axis of a [tokens]
 * statistic (max, sum of exp, target logit: three in the forward). */
static void emit_stat_all_reduce(Shard *s, int stat, int a, int count)
{
	for (int i = 0; i < count; i++) {
		int nv = copy_value(s, stat);
		Op op;
	op_clear(&op);
		op.kind = OP_ALL_REDUCE;
		op.nin = 1;
		op.in[0] = stat;
		op.nout = 1;
		op.out[0] = nv;
		op.axis = a;
		op_inherit(&op, s->cur);
		op.n = i;
		op.internal = true;
		push_op(s, &op);
	}
}

static void rule_loss(Shard *s, Op *op, int a, bool *vocab_parallel)
{
	Graph *g = s->g;
	int logits = resolve_partial(s, op->in[0], a);
	int rank = g->vals[logits].rank;
	int sl = st(s, logits, a);
	op->in[0] = logits;
	if (sl == rank - 1) {
		*vocab_parallel = true;
		for (int i = 1; i < op->nin; i++)
			if (st(s, op->in[i], a) != LAYOUT_R && g->vals[op->in[i]].rank != 0)
				op->in[i] = convert_axis(s, op->in[i], a, LAYOUT_R);
		if (op->kind == OP_CROSS_ENTROPY) {
			g->vals[op->out[0]].lay.on[a] = LAYOUT_R;
			g->vals[op->out[1]].lay.on[a] = LAYOUT_R;
		} else {
			g->vals[op->out[0]].lay.on[a] = (signed char)sl;
		}
		return;
	}
	for (int i = 1; i < op->nin; i++) {
		int v = op->in[i];
		if (g->vals[v].rank == 0) {
			op->in[i] = convert_axis(s, resolve_partial(s, v, a), a, LAYOUT_R);
			continue;
		}
		if (st(s, v, a) != sl)
			op->in[i] = convert_axis(s, v, a, sl >= 0 && sl < g->vals[v].rank ? sl : LAYOUT_R);
	}
	if (op->kind == OP_CROSS_ENTROPY) {
		g->vals[op->out[0]].lay.on[a] = sl >= 0 ? LAYOUT_P : LAYOUT_R;
		g->vals[op->out[1]].lay.on[a] = (signed char)sl;
	} else {
		g->vals[op->out[0]].lay.on[a] = (signed char)sl;
	}
}

/* MoE: tokens arrive split over an axis along their first (batch) dim only, whole samples, so that
 * every routing group (one sample) is routed on one rank as the single rank routes it; other splits
 * of the tokens are gathered first. The dispatched buffer [E, C, D] is then split on its capacity
 * dim (its groups are the rank's samples), and an expert rule (`shard experts -> axis`, or a dim
 * rule on the expert dim) moves it to the expert dim: the all-to-all (place_op, below). */
static int moe_tokens(Shard *s, int v, int a, int last)
{
	for (int d = 1; d < last; d++)
		v = unsplit(s, v, a, d);
	return v;
}

static void rule_moe(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	for (int i = 0; i < op->nin; i++)
		if (st(s, op->in[i], a) == LAYOUT_P)
			op->in[i] = resolve_partial(s, op->in[i], a);
	switch (op->kind) {
	case OP_MOE_ROUTER:
	case OP_MOE_AUX_LOSS:
	case OP_MOE_Z_LOSS: {
		int r = g->vals[op->in[0]].rank;
		int l = moe_tokens(s, unsplit(s, op->in[0], a, r - 1), a, r);
		op->in[0] = l;
		int sl = st(s, l, a);
		int tok = sl >= 0 ? 0 : LAYOUT_R;
		if (op->kind == OP_MOE_ROUTER) {
			set_out(s, op, a, tok);
		} else {
			if (st(s, op->in[1], a) != tok)
				op->in[1] = convert_axis(s, op->in[1], a, tok);
			set_out(s, op, a, sl >= 0 ? LAYOUT_P : LAYOUT_R);
		}
		break;
	}
	case OP_MOE_ROUTER_GRAD:
	case OP_MOE_AUX_LOSS_GRAD:
	case OP_MOE_Z_LOSS_GRAD: {
		int sl = st(s, op->in[0], a);
		int tok = sl >= 0 ? 0 : LAYOUT_R;
		for (int i = 1; i < op->nin; i++) {
			int r = g->vals[op->in[i]].rank;
			int want = r == 0 ? LAYOUT_R : tok;
			if (st(s, op->in[i], a) != want)
				op->in[i] = convert_axis(s, op->in[i], a, want);
		}
		set_out(s, op, a, sl);
		break;
	}
	case OP_MOE_DISPATCH:
	case OP_MOE_COMBINE_GRAD: {
		/* tokens [.., D] (+ routing) -> buffer [E, C, D] */
		int rx = g->vals[op->in[0]].rank;
		int x = op->in[0] = moe_tokens(s, op->in[0], a, rx - 1);
		int sx = st(s, x, a);
		int gates = op->kind == OP_MOE_DISPATCH ? 1 : 2;
		int sg = st(s, op->in[gates], a);
		if (sx == 0) {
			for (int i = gates; i < op->nin; i++)
				if (st(s, op->in[i], a) != 0)
					op->in[i] = convert_axis(s, op->in[i], a, 0);
			if (op->kind == OP_MOE_COMBINE_GRAD) {
				int y = op->in[1];
				if (st(s, y, a) != 1)
					op->in[1] = convert_axis(s, y, a, 1);
			}
			set_out(s, op, a, 1);
			if (op->kind == OP_MOE_COMBINE_GRAD)
				g->vals[op->out[1]].lay.on[a] = 0;
		} else {
			if (sg >= 0)
				for (int i = gates; i < op->nin; i++)
					op->in[i] = convert_axis(s, op->in[i], a, LAYOUT_R);
			int out = sx == rx - 1 ? 2 : LAYOUT_R;
			if (op->kind == OP_MOE_COMBINE_GRAD && st(s, op->in[1], a) != out)
				op->in[1] = convert_axis(s, op->in[1], a, out);
			set_out(s, op, a, out);
			if (op->kind == OP_MOE_COMBINE_GRAD)
				g->vals[op->out[1]].lay.on[a] = LAYOUT_R;
		}
		break;
	}
	case OP_MOE_COMBINE:
	case OP_MOE_DISPATCH_GRAD: {
		/* buffer [E, C, D] (+ routing) -> tokens [.., D] */
		int sg = st(s, op->in[1], a);
		int buf = op->in[0];
		if (sg == 0) {
			if (st(s, buf, a) != 1)
				op->in[0] = convert_axis(s, buf, a, 1);
			if (st(s, op->in[2], a) != 0)
				op->in[2] = convert_axis(s, op->in[2], a, 0);
			if (op->nin > 3 && st(s, op->in[3], a) != 0)
				op->in[3] = convert_axis(s, op->in[3], a, 0);
			set_out(s, op, a, 0);
		} else {
			int sb = st(s, buf, a);
			if (sb != LAYOUT_R && sb != 2)
				op->in[0] = convert_axis(s, buf, a, LAYOUT_R);
			int rank = g->vals[op->out[0]].rank;
			set_out(s, op, a, st(s, op->in[0], a) == 2 ? rank - 1 : LAYOUT_R);
		}
		break;
	}
	default:
		ICE("not an MoE op");
	}
}

/* Where dim d of a tensor goes when dim `gone` is dropped (d != gone), and back. */
static int drop_dim(int d, int gone)
{
	return gone >= 0 && d > gone ? d - 1 : d;
}

static int add_dim(int d, int gone)
{
	return gone >= 0 && d >= gone ? d + 1 : d;
}

/* Reductions over a dim and the regression losses. A sum over a split dim (or over every dim of a
 * split tensor) is a partial sum; max needs its dim whole. A loss of split operands is a partial
 * sum (the scale is 1 / the global count). */
static void rule_reduce(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	switch (op->kind) {
	case OP_SUM_DIM:
	case OP_MAX_DIM: {
		bool max = op->kind == OP_MAX_DIM;
		int x = max ? resolve_partial(s, op->in[0], a) : op->in[0], d = op->dim;
		int sx = st(s, x, a);
		if (max && sx >= 0 && (d < 0 || sx == d)) {
			x = convert_axis(s, x, a, LAYOUT_R);
			sx = LAYOUT_R;
		}
		op->in[0] = x;
		bool keep = g->vals[op->out[0]].rank == g->vals[x].rank;
		if (sx == LAYOUT_P || (sx >= 0 && (d < 0 || sx == d)))
			set_out(s, op, a, LAYOUT_P);
		else
			set_out(s, op, a, sx >= 0 && !keep ? drop_dim(sx, d) : sx);
		break;
	}
	case OP_SUM_DIM_GRAD: { /* dx = scale * dy broadcast over the dim: linear in dy */
		int sdy = st(s, op->in[0], a), d = op->dim;
		bool keep = g->vals[op->out[0]].rank == g->vals[op->in[0]].rank;
		set_out(s, op, a, sdy >= 0 && !keep ? add_dim(sdy, d) : sdy);
		break;
	}
	case OP_MAX_DIM_GRAD: { /* (argmax, dy): dy follows argmax; linear in dy */
		int am = op->in[0], sam = st(s, am, a), d = op->dim;
		bool keep = g->vals[op->out[0]].rank == g->vals[am].rank;
		if (st(s, op->in[1], a) == LAYOUT_P && sam == LAYOUT_R) {
			set_out(s, op, a, LAYOUT_P);
			break;
		}
		int dy = resolve_partial(s, op->in[1], a);
		if (st(s, dy, a) != sam)
			dy = convert_axis(s, dy, a, sam);
		op->in[1] = dy;
		set_out(s, op, a, sam >= 0 && !keep ? add_dim(sam, d) : sam);
		break;
	}
	case OP_MSE_LOSS:
	case OP_MSE_LOSS_GRAD: {
		int x = resolve_partial(s, op->in[0], a), t = resolve_partial(s, op->in[1], a);
		int sx = st(s, x, a);
		if (sx == LAYOUT_R && st(s, t, a) >= 0) /* take the target's split: a slice costs nothing */
			x = convert_axis(s, x, a, sx = st(s, t, a));
		if (st(s, t, a) != sx)
			t = convert_axis(s, t, a, sx);
		op->in[0] = x;
		op->in[1] = t;
		if (op->kind == OP_MSE_LOSS) {
			set_out(s, op, a, sx >= 0 ? LAYOUT_P : LAYOUT_R);
		} else {
			int dl = resolve_partial(s, op->in[2], a);
			op->in[2] = convert_axis(s, dl, a, LAYOUT_R);
			set_out(s, op, a, sx);
		}
		break;
	}
	default:
		ICE("'%s' is not a reduction", op_names[op->kind]);
	}
}

/* Slices, concat, reshape, transposes, repeat_kv and RoPE: all linear, so partial sums pass
 * through; a split dim maps to where it goes, and the dim an op works along is made whole. */
static void rule_shape(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int x = op->in[0], sx = st(s, x, a);
	const Value *vx = &g->vals[x], *vy = &g->vals[op->out[0]];
	switch (op->kind) {
	case OP_NARROW:
		if (sx == op->dim)
			op->in[0] = x = unsplit(s, x, a, op->dim);
		sx = st(s, x, a);
		set_out(s, op, a, sx >= 0 && op->dim2 ? drop_dim(sx, op->dim) : sx);
		break;
	case OP_NARROW_GRAD: /* dy -> dx, zero outside the rows */
		if (!op->dim2 && sx == op->dim)
			op->in[0] = x = convert_axis(s, x, a, LAYOUT_R);
		sx = st(s, x, a);
		set_out(s, op, a, sx >= 0 && op->dim2 ? add_dim(sx, op->dim) : sx);
		break;
	case OP_CONCAT: {
		bool all_p = true;
		for (int i = 0; i < op->nin; i++)
			all_p = all_p && st(s, op->in[i], a) == LAYOUT_P;
		if (all_p) {
			set_out(s, op, a, LAYOUT_P);
			break;
		}
		int target = LAYOUT_R;
		for (int i = 0; i < op->nin; i++) {
			op->in[i] = unsplit(s, resolve_partial(s, op->in[i], a), a, op->dim);
			if (target == LAYOUT_R && st(s, op->in[i], a) >= 0 && st(s, op->in[i], a) != op->dim)
				target = st(s, op->in[i], a);
		}
		for (int i = 0; i < op->nin; i++)
			if (st(s, op->in[i], a) != target)
				op->in[i] = convert_axis(s, op->in[i], a, target);
		set_out(s, op, a, target);
		break;
	}
	case OP_RESHAPE: { /* a split dim in the leading dims both shapes share stays split */
		int p = 0;
		while (p < vx->rank && p < vy->rank && vx->dim[p] == vy->dim[p])
			p++;
		if (sx >= p) {
			op->in[0] = convert_axis(s, x, a, LAYOUT_R);
			sx = LAYOUT_R;
		}
		set_out(s, op, a, sx);
		break;
	}
	case OP_SWAP_DIMS:
		set_out(s, op, a, sx == op->dim ? op->dim2 : sx == op->dim2 ? op->dim : sx);
		break;
	case OP_REPEAT_KV:
	case OP_REPEAT_KV_GRAD: /* a block of kv heads gives the matching block of query heads */
		set_out(s, op, a, sx);
		break;
	case OP_ROPE:
	case OP_ROPE_GRAD: {
		if (sx == vx->rank - 1) /* a head's dims rotate together */
			op->in[0] = x = unsplit(s, x, a, sx);
		sx = st(s, x, a);
		if (op->nin > 1) { /* positions [S] or [B, S] follow the batch and sequence splits */
			int pos = op->in[1], rp = g->vals[pos].rank;
			int want = sx == op->dim ? rp - 1 : sx == 0 && rp == 2 ? 0 : LAYOUT_R;
			if (st(s, pos, a) != want)
				op->in[1] = convert_axis(s, resolve_partial(s, pos, a), a, want);
		}
		set_out(s, op, a, sx);
		break;
	}
	default:
		ICE("'%s' is not a shape op", op_names[op->kind]);
	}
}

/* ---------------------------------------------------------------- expert rules
 *
 * `shard experts -> axis` (nn.expert_parallel) splits the experts of every MoE layer over an axis
 * and `shard expert_hidden -> axis` (nn.expert_tensor_parallel) splits each expert's hidden units,
 * whatever the model calls its expert weights: they are found from the graph. An expert parameter
 * is one an MoE layer's experts apply to its dispatched tokens [E, C, D]: the batched weights of
 * the matmuls between moe_dispatch and moe_combine (and parameters added on the way), whose first
 * dim is the layer's expert count. A weight applied to the dispatched tokens themselves is an
 * input weight (its last dim is the hidden one: column parallel); the others are output weights
 * (their dim before last: row parallel); a parameter added to a hidden activation splits its last
 * dim too. `experts(PATTERN)` keeps to the expert parameters matching PATTERN. */
enum { MP_NONE = -1, MP_IN, MP_OUT, MP_HIDDEN_BIAS, MP_BIAS };

static int param_root(const Graph *g, const Op *old, int v)
{
	while (v >= 0) {
		if (g->vals[v].role == ROLE_PARAM)
			return v;
		int d = g->vals[v].def;
		if (d < 0 || old[d].kind != OP_TRANSPOSE)
			return -1;
		v = old[d].in[0];
	}
	return -1;
}

static void moe_analyse(Shard *s, const Op *old, int nold)
{
	Graph *g = s->g;
	s->old = old;
	s->moe_nvals = g->nvals;
	s->moe_param = malloc((size_t)g->nvals + 1);
	s->moe_layer = malloc(sizeof(int) * ((size_t)g->nvals + 1));
	int *act = malloc(sizeof(int) * ((size_t)g->nvals + 1)); /* the layer of an expert activation */
	char *kind = malloc((size_t)g->nvals + 1);                 /* 0 the dispatched tokens, 1 hidden, 2 other */
	if (!s->moe_param || !s->moe_layer || !act || !kind)
		ICE("out of memory");
	for (int v = 0; v < g->nvals; v++) {
		s->moe_param[v] = MP_NONE;
		s->moe_layer[v] = act[v] = -1;
		kind[v] = 2;
	}
	for (int i = 0; i < nold && i < g->nfwd; i++) {
		const Op *op = &old[i];
		if (op->kind == OP_MOE_DISPATCH) {
			act[op->out[0]] = i;
			kind[op->out[0]] = 0;
			s->moe_layer[op->in[2]] = i;
			continue;
		}
		int layer = -1, hidden = 0;
		for (int k = 0; k < op->nin; k++)
			if (act[op->in[k]] >= 0) {
				layer = act[op->in[k]];
				hidden |= kind[op->in[k]] == 1;
			}
		if (layer < 0 || op->kind == OP_MOE_COMBINE || op->nout != 1)
			continue;
		long long E = g->vals[old[layer].out[0]].dim[0];
		OpClass c = op_classes[op->kind];
		int out = op->out[0];
		if (op->kind == OP_MATMUL && act[op->in[0]] >= 0) {
			int w = param_root(g, old, op->in[1]);
			if (w >= 0 && g->vals[w].rank == 3 && g->vals[w].dim[0] == E) {
				s->moe_param[w] = kind[op->in[0]] == 0 ? MP_IN : MP_OUT;
				s->moe_layer[w] = layer;
			}
			act[out] = layer;
			kind[out] = kind[op->in[0]] == 0 ? 1 : 2;
		} else if (c == OPK_BINARY || c == OPK_UNARY || c == OPK_LINEAR || c == OPK_UNARY_GRAD) {
			for (int k = 0; k < op->nin; k++) {
				int w = param_root(g, old, op->in[k]);
				if (w >= 0 && g->vals[w].rank == 3 && g->vals[w].dim[0] == E) {
					s->moe_param[w] = hidden ? MP_HIDDEN_BIAS : MP_BIAS;
					s->moe_layer[w] = layer;
				}
			}
			act[out] = layer;
			kind[out] = hidden ? 1 : 2;
		}
	}
	free(act);
	free(kind);
}

/* The layer (moe_dispatch op index in the input list) a dispatch or combine_grad belongs to. */
static int moe_layer_of(const Shard *s, const Op *op)
{
	if (op->kind == OP_MOE_DISPATCH)
		return s->cur_old;
	const Op *fwd = op->fwd_op >= 0 ? &s->old[op->fwd_op] : NULL; /* the moe_combine */
	return fwd && fwd->nin > 2 ? s->moe_layer[fwd->in[2]] : -1;
}

/* Whether layer's experts are split on axis a along their expert dim. */
static bool moe_experts_split(const Shard *s, int layer, int a)
{
	if (layer < 0)
		return false;
	for (int v = 0; v < s->moe_nvals; v++)
		if (s->moe_param[v] != MP_NONE && s->moe_layer[v] == layer && s->g->vals[v].lay.on[a] == 0)
			return true;
	return false;
}


/* The expert rules on an expert parameter, after the parameter rules (they compose: a rule
 * splits one dim and leaves the others as the parameter rules laid them out). */
static void moe_param_layout(Shard *s, Op *op)
{
	Graph *g = s->g;
	int p = op->out[0];
	Value *v = &g->vals[p];
	int cls = s->moe_param[p];
	if (cls == MP_NONE)
		return;
	for (int r = 0; r < s->ps->nrules && !s->failed; r++) {
		ShardRule *rule = &s->ps->rules[r];
		if (!rule->moe || (rule->stage >= 0 && rule->stage != op->stage))
			continue;
		if (rule->moe_pattern && !param_pattern_match(rule->moe_pattern, v->name))
			continue;
		int d = 0;
		if (rule->moe == MOE_RULE_HIDDEN) {
			if (cls == MP_BIAS)
				continue; /* added after the output weights: whole, as Megatron's b2 */
			d = cls == MP_OUT ? v->rank - 2 : v->rank - 1;
		}
		rule->used = true;
		int a = rule->axis;
		if (v->lay.on[a] == d)
			continue;
		bool taken = v->lay.on[a] != LAYOUT_R;
		for (int b = 0; b < s->ps->naxes; b++)
			taken |= b != a && v->lay.on[b] == d;
		if (taken) {
			diag_error(rule->src, rule->loc, "expert parameter '%s' cannot be split over '%s' on its %s dim as well",
				   v->name, s->ps->axes[a].name, d == 0 ? "expert" : "hidden");
			diag_note(op->src, op->loc, "'%s' is declared here", v->name);
			diag_note_plain("a parameter dim is split over one mesh axis, and a mesh axis splits one of its dims");
			s->failed = true;
			return;
		}
		v->lay.on[a] = (signed char)d;
		long long n = split_product(s, &v->lay, d);
		if (v->dim[d] % n) {
			diag_error(rule->src, rule->loc, "the %lld %s of '%s' are not divisible by mesh axis '%s' of size %d",
				   v->dim[d], d == 0 ? "experts" : "hidden units", v->name, s->ps->axes[a].name,
				   s->ps->axes[a].size);
			diag_note(op->src, op->loc, "'%s' is declared here", v->name);
			s->failed = true;
			return;
		}
	}
}

/* An expert rule that splits nothing is an error, never a silent replication. */
static void moe_rules_check(Shard *s)
{
	Graph *g = s->g;
	const char **names = NULL;
	int n = 0;
	for (int r = 0; r < s->ps->nrules; r++) {
		const ShardRule *rule = &s->ps->rules[r];
		if (!rule->moe || rule->used)
			continue;
		const char *what = rule->moe == MOE_RULE_EXPERTS ? "experts" : "expert_hidden";
		if (!g->has_moe) {
			diag_error(rule->src, rule->loc, "shard rule '%s -> %s': model '%s' has no mixture-of-experts layer",
				   what, s->ps->axes[rule->axis].name, s->ps->model->name);
			diag_note_plain("expert rules split the experts of moe_dispatch .. moe_combine (nn.moe, nn.moe_swiglu)");
			s->failed = true;
			continue;
		}
		if (!names) { /* the expert parameters, layer numbers as '*': the patterns a user means */
			names = arena_alloc(g->arena, sizeof(char *) * ((size_t)g->nvals + 1));
			for (int v = 0; v < s->moe_nvals; v++) {
				if (s->moe_param[v] == MP_NONE || !g->vals[v].name)
					continue;
				char buf[256];
				size_t at = 0;
				for (const char *c = g->vals[v].name; *c && at + 2 < sizeof buf;) {
					bool seg = c == g->vals[v].name || c[-1] == '.';
					if (seg && *c >= '0' && *c <= '9') {
						while (*c >= '0' && *c <= '9')
							c++;
						buf[at++] = '*';
					} else {
						buf[at++] = *c++;
					}
				}
				buf[at] = 0;
				bool dup = false;
				for (int k = 0; k < n; k++)
					dup |= !strcmp(names[k], buf);
				if (!dup)
					names[n++] = arena_strdup(g->arena, buf);
			}
		}
		diag_error(rule->src, rule->loc, "shard rule '%s(%s) -> %s' matches no expert parameter", what,
			   rule->moe_pattern ? rule->moe_pattern : "*", s->ps->axes[rule->axis].name);
		const char *best = rule->moe_pattern ? closest_name(rule->moe_pattern, names, n) : NULL;
		if (best)
			diag_note_plain("did you mean '%s'?", best);
		else if (n)
			diag_note_plain("the expert parameters are %s%s%s", names[0], n > 1 ? ", " : "", n > 1 ? names[1] : "");
		if (rule->moe == MOE_RULE_HIDDEN && n)
			diag_note_plain("expert_hidden splits weights applied to the dispatched tokens and what follows them");
		s->failed = true;
	}
}

/* Layout of a parameter from the plan's rules (the last matching rule wins). */
/* ---------------------------------------------------------------- key/value heads replicated */

/* Marks the K/V projection parameters (weight of the matmul, bias added) that value v, the k or v
 * input of an attention with kv key/value heads and q query heads, comes from: through rope,
 * split_heads, a bias add and the matmul by the weight (or its transpose). */
static void mark_kv_projection(Shard *s, const Op *old, int v, int kv, int q)
{
	const Graph *g = s->g;
	for (int steps = 0; v >= 0 && steps < 16; steps++) {
		int d = g->vals[v].def;
		if (d < 0)
			return;
		const Op *op = &old[d];
		int next = -1;
		for (int i = 0; i < op->nin && (op->kind == OP_ADD || op->kind == OP_MATMUL); i++) {
			int w = op->in[i], wd = g->vals[w].def;
			if (wd >= 0 && old[wd].kind == OP_TRANSPOSE)
				w = old[wd].in[0], wd = g->vals[w].def;
			if (wd >= 0 && old[wd].kind == OP_PARAM && w < s->kv_nvals) {
				s->kv_heads[w] = kv;
				s->kv_q_heads[w] = q;
			} else if (op->kind == OP_ADD) {
				next = op->in[i];
			}
		}
		if (op->kind == OP_ROPE || op->kind == OP_SPLIT_HEADS)
			next = op->in[0];
		v = next;
	}
}

/* The K/V projections of every attention (fused, or repeat_kv's input when unfused). */
static void kv_analyse(Shard *s, const Op *old, int nold)
{
	s->kv_nvals = s->g->nvals;
	s->kv_heads = calloc((size_t)s->kv_nvals + 1, sizeof(int));
	s->kv_q_heads = calloc((size_t)s->kv_nvals + 1, sizeof(int));
	if (!s->kv_heads || !s->kv_q_heads)
		ICE("out of memory");
	for (int i = 0; i < nold; i++) {
		const Op *op = &old[i];
		if (op->backward || (op->kind != OP_ATTENTION && op->kind != OP_REPEAT_KV))
			continue;
		const Value *q = &s->g->vals[op->kind == OP_ATTENTION ? op->in[0] : op->out[0]];
		int hd = op->kind == OP_ATTENTION ? q->rank - 3 : op->dim;
		for (int j = op->kind == OP_ATTENTION ? 1 : 0; j < (op->kind == OP_ATTENTION ? 3 : 1); j++)
			mark_kv_projection(s, old, op->in[j], (int)s->g->vals[op->in[j]].dim[hd], (int)q->dim[hd]);
	}
}

/* Whether kv key/value heads under q query heads split over n ranks are replicated: fewer kv
 * heads than ranks, each rank's query heads within one kv head's group. */
static bool kv_replicated(long long kv, long long q, long long n)
{
	return n > 1 && kv > 0 && kv % n != 0 && n % kv == 0 && q % n == 0;
}

/* A K/V projection weight or bias whose output columns an axis would split into parts of kv
 * heads fewer than the ranks stays whole on that axis (Megatron's replicated K/V projection). */
static void replicate_kv_projection(Shard *s, int v)
{
	Value *val = &s->g->vals[v];
	if (v >= s->kv_nvals || !s->kv_heads[v])
		return;
	for (int a = 0; a < s->ps->naxes; a++)
		if (val->lay.on[a] == val->rank - 1 && kv_replicated(s->kv_heads[v], s->kv_q_heads[v], s->ps->axes[a].size))
			val->lay.on[a] = LAYOUT_R;
}

static bool param_layout(Shard *s, Op *op)
{
	Graph *g = s->g;
	Value *v = &g->vals[op->out[0]];
	const ShardRule *hit = NULL;
	for (int r = 0; r < s->ps->nrules; r++) {
		ShardRule *rule = &s->ps->rules[r];
		if (!rule->pattern || (rule->stage >= 0 && rule->stage != op->stage))
			continue;
		if (!param_pattern_match(rule->pattern, v->name))
			continue;
		rule->used = true;
		hit = rule;
	}
	if (!hit)
		return true;
	if (hit->ndims != v->rank) {
		diag_error(hit->src, hit->loc, "layout has %d entries but parameter '%s' has %d dimensions", hit->ndims,
			   v->name, v->rank);
		diag_note(op->src, op->loc, "'%s' is declared here", v->name);
		s->failed = true;
		return false;
	}
	for (int d = 0; d < v->rank; d++)
		if (hit->axes[d] >= 0)
			v->lay.on[hit->axes[d]] = (signed char)d;
	replicate_kv_projection(s, op->out[0]);
	for (int d = 0; d < v->rank; d++) {
		long long n = split_product(s, &v->lay, d);
		if (n > 1 && v->dim[d] % n) {
			int axis = hit->axes[d];
			diag_error(hit->src, hit->loc,
				   "dimension %d of '%s' (size %lld%s%s) is not divisible by mesh axis '%s' of size %d", d,
				   v->name, v->dim[d], v->dim_name[d] ? ", " : "", v->dim_name[d] ? v->dim_name[d] : "",
				   s->ps->axes[axis].name, s->ps->axes[axis].size);
			diag_note(op->src, op->loc, "'%s' is declared here", v->name);
			s->failed = true;
			return false;
		}
	}
	return true;
}

static bool input_layout(Shard *s, Op *op)
{
	Value *v = &s->g->vals[op->out[0]];
	for (int r = 0; r < s->ps->nrules; r++) {
		const ShardRule *rule = &s->ps->rules[r];
		if (!rule->dim_name)
			continue;
		for (int d = 0; d < v->rank; d++)
			if (v->dim_name[d] && !strcmp(v->dim_name[d], rule->dim_name) && v->lay.on[rule->axis] == LAYOUT_R) {
				v->lay.on[rule->axis] = (signed char)d;
				if (!check_divisible(s, op->out[0], &v->lay, d, op))
					return false;
			}
	}
	return true;
}

/* (x or mask, dy): linear in dy; dy follows x */
static void rule_unary_grad(Shard *s, Op *op, int a)
{
	int x = resolve_partial(s, op->in[0], a);
	op->in[0] = x;
	int sx = st(s, x, a);
	int dy = op->in[1];
	if (st(s, dy, a) != sx)
		op->in[1] = convert_axis(s, dy, a, sx);
	set_out(s, op, a, sx);
}

/* sum_to: a split dim the reduction keeps stays split, one it sums over becomes a partial sum */
static void rule_sum_to(Shard *s, Op *op, int a)
{
	const Graph *g = s->g;
	int x = op->in[0];
	int sx = st(s, x, a);
	const Value *in = &g->vals[x], *out = &g->vals[op->out[0]];
	if (sx == LAYOUT_P || sx == LAYOUT_R) {
		set_out(s, op, a, sx);
	} else {
		int d = sx - (in->rank - out->rank);
		bool kept = d >= 0 && out->dim[d] == in->dim[sx];
		set_out(s, op, a, kept ? d : LAYOUT_P);
	}
}

/* transpose, split_heads, merge_heads: the split dim moves with the view (merge_heads of a split
 * head dim gathers it first) */
static void rule_view(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	int x = op->in[0];
	int sx = st(s, x, a);
	int rin = g->vals[x].rank;
	int out = sx;
	if (op->kind == OP_TRANSPOSE && sx >= rin - 2)
		out = sx == rin - 1 ? rin - 2 : rin - 1;
	else if (op->kind == OP_SPLIT_HEADS && sx >= 0) {
		/* [.., S, D] -> [.., H, S, Dh]: a split hidden dim splits the heads */
		if (sx == rin - 1)
			out = rin - 2;
		else if (sx == rin - 2)
			out = rin - 1;
	} else if (op->kind == OP_MERGE_HEADS && sx >= 0) {
		if (sx == rin - 1) {
			x = op->in[0] = convert_axis(s, x, a, LAYOUT_R);
			out = LAYOUT_R;
		} else if (sx == rin - 3)
			out = rin - 2;
		else if (sx == rin - 2)
			out = rin - 3;
	}
	set_out(s, op, a, out);
	if (out >= 0)
		check_divisible(s, op->out[0], &g->vals[op->out[0]].lay, out, op);
}

/* k or v [.., K, S, Dh] of an attention whose query heads axis a splits, with K kv heads fewer
 * than its ranks: made whole on the axis and repeated rep times, each rank keeping the block of
 * the K rep heads its query heads read (repeat_kv from the whole kv heads: no communication). */
static int replicate_kv(Shard *s, int v, int a, int rep)
{
	Graph *g = s->g;
	v = convert_axis(s, v, a, LAYOUT_R);
	const Value *src = &g->vals[v];
	int r = src->rank;
	long long dim[MAX_DIMS];
	for (int d = 0; d < r; d++)
		dim[d] = src->dim[d];
	dim[r - 3] *= rep;
	int nv = graph_add_value(g, src->dtype, r, dim, (const char *const *)g->vals[v].dim_name);
	g->vals[nv].name = g->vals[v].name;
	g->vals[nv].layer = g->vals[v].layer;
	g->vals[nv].lay = g->vals[v].lay;
	g->vals[nv].lay.on[a] = (signed char)(r - 3);
	Op op;
	op_clear(&op);
	op_inherit(&op, s->cur);
	op.kind = OP_REPEAT_KV;
	op.nin = op.nout = 1;
	op.in[0] = v;
	op.out[0] = nv;
	op.dim = r - 3;
	op.n = rep;
	push_op(s, &op);
	return nv;
}

/* The attention gradient's dk or dv (output i) where its k or v was replicated: the op gives the
 * gradient of the repeated heads (a new value), which kv_grads sums into the kv heads after it. */
static void replicated_kv_grad(Shard *s, Op *op, int i, int a)
{
	Graph *g = s->g;
	const Value *rep = &g->vals[op->in[i]], *kv = &g->vals[op->out[i]];
	int r = rep->rank;
	if (rep->dim[r - 3] == kv->dim[r - 3] || st(s, op->in[i], a) != r - 3 ||
	    !kv_replicated(kv->dim[r - 3], g->vals[op->in[0]].dim[r - 3], s->ps->axes[a].size))
		return;
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	for (int d = 0; d < r; d++)
		dim[d] = rep->dim[d], names[d] = rep->dim_name[d];
	int nv = graph_add_value(g, kv->dtype, r, dim, names);
	g->vals[nv].name = g->vals[op->out[i]].name;
	g->vals[nv].layer = g->vals[op->out[i]].layer;
	g->vals[nv].lay = g->vals[op->out[i]].lay; /* as the axes placed before this one left it */
	s->kv_grad[i - 1] = nv;
	s->kv_grad_of[i - 1] = op->out[i];
	s->kv_axis = a;
	s->kv_rep = (int)(g->vals[nv].dim[r - 3] / g->vals[op->out[i]].dim[r - 3]);
	op->out[i] = nv;
}

/* After an attention gradient with replicated k and v: each rank's dk, dv of its repeated heads
 * summed into the kv heads (repeat_kv_grad), a partial sum over the axis that replicated them. */
static void kv_grads(Shard *s, const Op *placed)
{
	for (int i = 0; i < 2; i++) {
		if (s->kv_grad[i] < 0)
			continue;
		Graph *g = s->g;
		int dk = s->kv_grad[i], out = s->kv_grad_of[i];
		g->vals[out].lay = g->vals[dk].lay;
		g->vals[out].lay.on[s->kv_axis] = LAYOUT_P;
		Op op;
		op_clear(&op);
		op_inherit(&op, placed);
		op.kind = OP_REPEAT_KV_GRAD;
		op.nin = op.nout = 1;
		op.in[0] = dk;
		op.out[0] = out;
		op.dim = g->vals[dk].rank - 3;
		op.n = s->kv_rep;
		push_op(s, &op);
		s->kv_grad[i] = -1;
	}
}

/* A causal ring attention: the ring axis's blocks become two mirrored chunks each (Megatron-Core's
 * causal load balancing, docs/attention.md), which needs the sequence to divide into 2 |axis|
 * chunks. */
static void ring_balance(Shard *s, const Op *op)
{
	const PlanSpec *ps = s->ps;
	const Value *q = &s->g->vals[op->in[0]];
	long long seq = q->dim[q->rank - 2], n = ps->axes[ps->ring_axis].size;
	if (seq % (2 * n) == 0) {
		s->g->ring_mirrored = true;
		return;
	}
	if (!s->failed) {
		diag_error(ps->ring_src, ps->ring_loc, "causal ring attention over mesh axis '%s' needs the sequence (%lld) "
			   "to split into 2 x %lld chunks", ps->axes[ps->ring_axis].name, seq, n);
		if (op->src)
			diag_note(op->src, op->loc, "the attention it would run");
		diag_note_plain("each rank holds two mirrored chunks so that every rank does the same causal work; make "
				"the sequence a multiple of %lld, or write 'shard ring_attention(contiguous) -> %s'",
				2 * n, ps->axes[ps->ring_axis].name);
	}
	s->failed = true;
}

/* `shard ring_attention -> axis` that no attention took: the sequence is not split over the axis
 * where attention runs, the attention is unfused, or Ulysses moved the split to the heads. */
static void ring_unused(Shard *s)
{
	const PlanSpec *ps = s->ps;
	const char *axis = ps->axes[ps->ring_axis].name;
	diag_error(ps->ring_src, ps->ring_loc, "ring attention over mesh axis '%s' applies to no attention", axis);
	if (ps->attention_unfused)
		diag_note_plain("the ring runs the fused attention op: remove 'attention unfused'");
	else
		diag_note_plain("the ring needs fused attention whose sequence is split over '%s' (shard S -> %s) and "
				"its heads not (Ulysses: shard H -> %s)", axis, axis, axis);
	s->failed = true;
}

/* Fused attention (attention.c) q, k, v [.., H, S, Dh] (and out, lse, dy in its gradient): a split
 * batch or head dim stays split, and k, v and the others follow it; Ulysses moves a sequence split
 * to the heads when a dim rule prefers them (an all-to-all); a split of the query rows stays, with
 * k and v gathered whole (each rank attends its rows to every key) and their gradients partial
 * sums, unless the axis is the plan's ring (context parallelism): then k, v and their gradients
 * stay split like q, and lowering passes the blocks around the ring; a head-dim split is gathered.
 * An additive mask follows where it has the split dim; its key dim stays whole (the ring's blocks
 * read their columns of it at their global keys: a padding mask [B, 1, 1, S] is replicated, a
 * document mask [B, 1, S, S] split by its query rows). Key/value heads fewer than the ranks
 * splitting the query heads are replicated (replicate_kv). */
static void rule_attention(Shard *s, Op *op, int a)
{
	Graph *g = s->g;
	bool grad = op->kind == OP_ATTENTION_GRAD;
	int r = g->vals[op->in[0]].rank, nt = grad ? 6 : 3, mask = op->nin > nt ? nt : -1;
	for (int i = 0; i < op->nin; i++)
		op->in[i] = resolve_partial(s, op->in[i], a);
	int sq = st(s, op->in[0], a);
	if (sq >= r - 2) {
		int p = preferred_dim_in(s, op->in[0], a, 0, r - 2);
		op->in[0] = convert_axis(s, op->in[0], a, p >= 0 ? p : sq == r - 2 ? sq : LAYOUT_R);
		sq = st(s, op->in[0], a);
	}
	bool rows = sq == r - 2, ring = rows && a == s->ps->ring_axis;
	s->ring_ops += ring && !grad;
	if (ring && !grad && op->n == 1 && !s->ps->ring_contiguous)
		ring_balance(s, op);
	long long n = s->ps->axes[a].size, q_heads = g->vals[op->in[0]].dim[r - 3];
	for (int i = 1; i < nt; i++) {
		int want = rows && !ring && (i == 1 || i == 2) ? LAYOUT_R : sq;
		long long kv = g->vals[op->in[i]].dim[r - 3];
		if (!grad && (i == 1 || i == 2) && want == r - 3 && kv_replicated(kv, q_heads, n))
			op->in[i] = replicate_kv(s, op->in[i], a, (int)(n / kv));
		else if (st(s, op->in[i], a) != want)
			op->in[i] = convert_axis(s, op->in[i], a, want);
	}
	for (int i = 1; grad && i < 3; i++)
		replicated_kv_grad(s, op, i, a);
	if (mask >= 0) {
		const Value *m = &g->vals[op->in[mask]], *q = &g->vals[op->in[0]];
		int want = sq >= 0 && m->dim[sq] == q->dim[sq] ? sq : LAYOUT_R;
		if (st(s, op->in[mask], a) != want)
			op->in[mask] = convert_axis(s, op->in[mask], a, want);
	}
	set_out(s, op, a, sq);
	if (grad && rows && !ring)
		for (int i = 1; i < 3; i++)
			g->vals[op->out[i]].lay.on[a] = LAYOUT_P;
}

/* The rule of op's class on mesh axis a: its inputs converted as it needs, its outputs' state. */
static void place_on_axis(Shard *s, Op *op, int a)
{
	bool vocab_parallel = false; /* set by rule_loss; the reductions follow the op */
	switch (op_classes[op->kind]) {
	case OPK_MATMUL:
		if (op->kind == OP_MATMUL)
			rule_matmul(s, op, a);
		else
			rule_wgrad(s, op, a);
		break;
	case OPK_BINARY:
		rule_elementwise(s, op, a);
		break;
	case OPK_UNARY:
		rule_unary(s, op, a, false, op->kind == OP_CAUSAL_MASK ? s->g->vals[op->in[0]].rank - 2 : -1);
		break;
	case OPK_UNARY_GRAD:
		rule_unary_grad(s, op, a);
		break;
	case OPK_LINEAR:
		if (op->kind == OP_SUM_TO)
			rule_sum_to(s, op, a);
		else
			rule_unary(s, op, a, true, -1);
		break;
	case OPK_VIEW:
		rule_view(s, op, a);
		break;
	case OPK_ROWWISE:
		rule_rowwise(s, op, a);
		break;
	case OPK_EMBED:
		if (op->kind == OP_EMBED)
			rule_embed(s, op, a);
		else
			rule_embed_grad(s, op, a);
		break;
	case OPK_LOSS:
		rule_loss(s, op, a, &vocab_parallel);
		break;
	case OPK_MOE:
		rule_moe(s, op, a);
		break;
	case OPK_REDUCE:
		rule_reduce(s, op, a);
		break;
	case OPK_SHAPE:
		rule_shape(s, op, a);
		break;
	case OPK_ATTENTION:
		rule_attention(s, op, a);
		break;
	default:
		ICE("no sharding rule for '%s'", op_names[op->kind]);
	}
}

/* The gradient must match the parameter's layout on every axis where it is not a partial sum;
 * partial sums are the gradient synchronisation, placed by sync.c (which makes them whole: a
 * partial sum of a parameter split on that axis is reduce-scattered here). */
static void place_optimizer_step(Shard *s, Op *op)
{
	Graph *g = s->g;
	int p = op->in[0];
	for (int a = 0; a < s->ps->naxes; a++) {
		int sp = st(s, p, a), sgr = st(s, op->in[1], a);
		if ((sgr == LAYOUT_P && sp < 0) || sgr == sp)
			continue;
		int gv = convert_axis(s, op->in[1], a, sp);
		op->in[1] = gv;
	}
	int gv = op->in[1];
	if (g->vals[gv].grad_of < 0) {
		g->vals[gv].grad_of = p;
		g->vals[gv].role = ROLE_GRAD;
		g->vals[p].grad = gv;
	}
	g->vals[op->out[0]].lay = g->vals[p].lay;
}

/* After a forward op is placed: which converted copy of each forward input it read (fwd_copy). */
static void note_forward_copies(Shard *s, const Op *placed, const int *original_in)
{
	if (placed->backward || placed->per_step)
		return;
	for (int k = 0; k < placed->nin; k++) {
		int orig = original_in[k];
		if (orig >= s->nfwd_copy)
			continue;
		int now = placed->in[k];
		int *slot = &s->fwd_copy[orig];
		if (now == orig || (*slot >= 0 && *slot != now))
			*slot = -2;
		else if (*slot == -1)
			*slot = now;
	}
}

/* vocab-parallel cross entropy's reductions (max, sum of exp, target logit) */
static void vocab_parallel_reductions(Shard *s, const Op *placed)
{
	if (placed->kind != OP_CROSS_ENTROPY && placed->kind != OP_CROSS_ENTROPY_GRAD)
		return;
	const Value *l = &s->g->vals[placed->in[0]];
	for (int a = 0; a < s->ps->naxes; a++)
		if (l->lay.on[a] == l->rank - 1 && placed->kind == OP_CROSS_ENTROPY) {
			Op copy = *placed;
			s->cur = &copy;
			emit_stat_all_reduce(s, copy.out[1], a, 3);
		}
}

/* MoE: where the layer's experts are split (an expert rule, or a dim rule on the expert dim),
 * the dispatched buffer follows: from the capacity split, the all-to-all; from replicated
 * tokens, a slice (and an all-gather after the experts) */
static void moe_dispatched_layout(Shard *s, const Op *placed)
{
	if (placed->kind != OP_MOE_DISPATCH && placed->kind != OP_MOE_COMBINE_GRAD)
		return;
	Op copy = *placed;
	s->cur = &copy;
	int layer = moe_layer_of(s, &copy);
	for (int a = 0; a < s->ps->naxes; a++) {
		int buf = copy.out[0];
		int sb = st(s, buf, a);
		if ((sb == 1 || sb == LAYOUT_R) && (preferred_dim(s, buf, a) == 0 || moe_experts_split(s, layer, a)))
			convert_axis(s, buf, a, 0);
	}
}

/* divisibility of every split output dim */
static void check_outputs_divisible(Shard *s, const Op *placed)
{
	Graph *g = s->g;
	for (int k = 0; k < placed->nout && !s->failed; k++) {
		int v = placed->out[k];
		for (int a = 0; a < s->ps->naxes; a++) {
			int d = g->vals[v].lay.on[a];
			if (d >= 0 && !check_divisible(s, v, &g->vals[v].lay, d, placed))
				break;
		}
	}
}

/* Places op: its layout on every mesh axis (with the conversions its inputs need before it) and
 * the collectives its outputs need after it. Returns its index in the new op list. */
static int place_op(Shard *s, Op *op)
{
	Graph *g = s->g;
	s->cur = op;
	int original_in[7];
	for (int k = 0; k < op->nin; k++) {
		if (op->backward && op->in[k] < s->nfwd_copy && s->fwd_copy[op->in[k]] >= 0)
			op->in[k] = s->fwd_copy[op->in[k]];
		original_in[k] = op->in[k];
	}
	switch (op->kind) {
	case OP_INPUT:
		input_layout(s, op);
		break;
	case OP_PARAM:
		if (param_layout(s, op))
			moe_param_layout(s, op);
		break;
	case OP_FILL:
	case OP_SEND:
		break;
	case OP_RECV:
		g->vals[op->out[0]].lay = g->vals[op->in[0]].lay;
		break;
	case OP_OPTIMIZER_STEP:
		place_optimizer_step(s, op);
		break;
	default:
		for (int a = 0; a < s->ps->naxes && !s->failed; a++)
			place_on_axis(s, op, a);
	}
	Op *placed = push_op(s, op);
	int placed_index = s->out.n - 1;
	note_forward_copies(s, placed, original_in);
	vocab_parallel_reductions(s, placed);
	kv_grads(s, placed);
	moe_dispatched_layout(s, placed);
	check_outputs_divisible(s, placed);
	return placed_index;
}

bool shard(Graph *g)
{
	Shard s = {0};
	s.g = g;
	s.ps = g->ps;
	int nold = g->nops;
	Op *old = g->ops;
	s.convs = calloc((size_t)g->nvals * 4 + 1024, sizeof(Conv *));
	s.nconvs = g->nvals * 4 + 1024;
	if (!s.convs)
		ICE("out of memory");
	int nfwd_new = -1;
	s.nfwd_copy = g->nvals;
	s.fwd_copy = malloc(sizeof(int) * (size_t)s.nfwd_copy);
	if (!s.fwd_copy)
		ICE("out of memory");
	for (int i = 0; i < s.nfwd_copy; i++)
		s.fwd_copy[i] = -1;
	int *remap = arena_alloc(g->arena, sizeof(int) * (size_t)(nold + 1));
	moe_analyse(&s, old, nold);
	kv_analyse(&s, old, nold);
	s.kv_grad[0] = s.kv_grad[1] = -1;
	for (int i = 0; i < nold && !s.failed; i++) {
		if (i == g->nfwd)
			nfwd_new = s.out.n;
		if (g->nvals + 64 >= s.nconvs) {
			int grow = s.nconvs * 2;
			Conv **nc = realloc(s.convs, sizeof(Conv *) * (size_t)grow);
			if (!nc)
				ICE("out of memory");
			memset(nc + s.nconvs, 0, sizeof(Conv *) * (size_t)(grow - s.nconvs));
			s.convs = nc;
			s.nconvs = grow;
		}
		Op op = old[i];
		s.cur_old = i;
		remap[i] = place_op(&s, &op);
	}
	free(s.convs);
	free(s.fwd_copy);
	if (!s.failed)
		moe_rules_check(&s);
	if (!s.failed && g->ps->ring_axis >= 0 && !s.ring_ops)
		ring_unused(&s);
	free(s.moe_param);
	free(s.moe_layer);
	free(s.kv_heads);
	free(s.kv_q_heads);
	if (s.failed)
		return false;
	for (int i = 0; i < s.out.n; i++)
		if (s.out.ops[i].fwd_op >= 0)
			s.out.ops[i].fwd_op = remap[s.out.ops[i].fwd_op];
	graph_set_ops(g, &s.out);
	g->nfwd = nfwd_new >= 0 ? nfwd_new : s.out.n;
	/* a parameter rule that matches nothing is almost always a typo (or a strategy written for
	 * other parameter names): an error, with the name it most likely meant */
	bool ok = true;
	for (int r = 0; r < g->ps->nrules; r++) {
		const ShardRule *rule = &g->ps->rules[r];
		if (rule->pattern && !rule->used) {
			unmatched_pattern(g, "shard rule", rule->pattern, rule->src, rule->loc, rule->strategy);
			ok = false;
		}
	}
	return ok;
}
