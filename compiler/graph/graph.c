/* graph.c: elaborates a model into the model graph IR.
 *
 * The model body is evaluated once per micro-batch shape: hyperparameters become numbers, every
 * fn call is inlined, every `repeat` is unrolled with the iteration recorded as the op's layer,
 * and every tensor expression becomes an op over concrete shapes. Shape errors are found here
 * (both shapes printed, with the chain of call sites as notes). Parameters are named by their
 * path: model-level params keep their name, params inside a repeat are `layers.<i>.` followed by
 * the chain of fn names that declared them (a second call of the same fn in one scope gets `_1`).
 *
 * The graph never learns about ranks: it describes one micro-batch on one device as if there
 * were only one. Sharding, pipelining and ZeRO are applied to it by later passes. */
#include "graph/graph.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const op_names[OP_COUNT] = {
#define X(name, text, kind) text,
	OP_TABLE(X)
#undef X
};

const OpClass op_classes[OP_COUNT] = {
#define X(name, text, kind) kind,
	OP_TABLE(X)
#undef X
};

long long graph_max_repeat = 100000;

/* ------------------------------------------------------------------ graph building blocks */

int graph_add_value(Graph *g, DType t, int rank, const long long *dim, const char *const *names)
{
	if (g->nvals == g->capvals) {
		int cap = g->capvals ? g->capvals * 2 : 1024;
		Value *nv = arena_alloc(g->arena, sizeof(Value) * (size_t)cap);
		if (g->nvals)
			memcpy(nv, g->vals, sizeof(Value) * (size_t)g->nvals);
		g->vals = nv;
		g->capvals = cap;
	}
	internal_assert(rank >= 0 && rank <= MAX_DIMS);
	Value *v = &g->vals[g->nvals];
	memset(v, 0, sizeof *v);
	v->id = g->nvals;
	v->dtype = t;
	v->rank = rank;
	for (int i = 0; i < rank; i++) {
		v->dim[i] = dim[i];
		v->dim_name[i] = names ? names[i] : NULL;
	}
	v->def = -1;
	v->layer = -1;
	v->grad_of = -1;
	v->grad = -1;
	v->alias_of = -1;
	v->tied_to = -1;
	for (int a = 0; a < MAX_AXES; a++)
		v->lay.on[a] = LAYOUT_R;
	return g->nvals++;
}

int graph_add_op(Graph *g, OpKind k, int nin, const int *in, int nout, const int *out)
{
	if (g->nops == g->capops) {
		int cap = g->capops ? g->capops * 2 : 1024;
		Op *no = arena_alloc(g->arena, sizeof(Op) * (size_t)cap);
		if (g->nops)
			memcpy(no, g->ops, sizeof(Op) * (size_t)g->nops);
		g->ops = no;
		g->capops = cap;
	}
	internal_assert(nin <= 7 && nout <= 3);
	Op *op = &g->ops[g->nops];
	op_clear(op);
	op->kind = k;
	op->nin = nin;
	op->nout = nout;
	for (int i = 0; i < nin; i++)
		op->in[i] = in[i];
	for (int i = 0; i < nout; i++) {
		op->out[i] = out[i];
		g->vals[out[i]].def = g->nops;
	}
	return g->nops++;
}

void op_clear(Op *op)
{
	memset(op, 0, sizeof *op);
	op->layer = -1;
	op->peer = -1;
	op->fwd_op = -1;
	op->axis = -1;
	op->coll_dim = -1;
	op->coll_dim2 = -1;
}

void op_inherit(Op *op, const Op *from)
{
	op->layer = from->layer;
	op->stage = from->stage;
	op->backward = from->backward;
	op->recompute = from->recompute;
	op->per_step = from->per_step;
	op->fwd_op = from->fwd_op;
	op->scope = from->scope;
	op->loc = from->loc;
	op->src = from->src;
	op->call_src = from->call_src;
	op->call_loc = from->call_loc;
	op->call_fn = from->call_fn;
}

Op *oplist_add(Graph *g, OpList *l, const Op *op)
{
	if (!l->cap && g->capspare) { /* the list the last rewrite replaced */
		l->ops = g->spare_ops;
		l->cap = g->capspare;
		g->spare_ops = NULL;
		g->capspare = 0;
	}
	if (l->n == l->cap) {
		int cap = l->cap ? l->cap * 2 : g->nops > 512 ? 2 * g->nops : 1024;
		Op *no = arena_alloc(g->arena, sizeof(Op) * (size_t)cap);
		if (l->n)
			memcpy(no, l->ops, sizeof(Op) * (size_t)l->n);
		l->ops = no;
		l->cap = cap;
	}
	Op *slot = &l->ops[l->n++];
	if (op)
		*slot = *op;
	else
		op_clear(slot);
	return slot;
}

void graph_set_ops(Graph *g, OpList *l)
{
	g->spare_ops = g->ops;
	g->capspare = g->capops;
	g->ops = l->ops;
	g->nops = l->n;
	g->capops = l->cap;
	for (int i = 0; i < g->nops; i++)
		for (int k = 0; k < g->ops[i].nout; k++)
			g->vals[g->ops[i].out[k]].def = i;
}

long long value_elems(const Graph *g, int v)
{
	long long n = 1;
	for (int i = 0; i < g->vals[v].rank; i++)
		n *= g->vals[v].dim[i];
	return n;
}

long long value_local_elems(const Graph *g, int v)
{
	const Value *val = &g->vals[v];
	long long n = value_elems(g, v);
	for (int a = 0; a < g->ps->naxes; a++) {
		int k = g->ps->axes[a].size;
		if (val->lay.on[a] >= 0)
			n /= k;
		else if (val->lay.on[a] == LAYOUT_FLAT)
			n = (n + k - 1) / k;
	}
	return n;
}

int value_root(const Graph *g, int v)
{
	while (g->vals[v].alias_of >= 0)
		v = g->vals[v].alias_of;
	return v;
}

/* whether a matmul's batch dims broadcast: operands of different ranks (other than a rank-2
 * weight) or batch dims of different sizes among the operands and the output */
bool matmul_broadcasts(const Graph *g, const Op *op)
{
	const Value *va = &g->vals[op->in[0]], *vb = &g->vals[op->in[1]], *vo = &g->vals[op->out[0]];
	if (vb->rank == 2)
		return false;
	if (va->rank != vb->rank || vo->rank != va->rank)
		return true;
	for (int d = 0; d < va->rank - 2; d++)
		if (va->dim[d] != vb->dim[d] || vo->dim[d] != va->dim[d])
			return true;
	return false;
}

bool param_pattern_match(const char *pat, const char *name)
{
	if (!*pat)
		return !*name;
	if (pat[0] == '*' && (pat[1] == '.' || !pat[1])) {
		const char *rest = pat[1] ? pat + 2 : pat + 1;
		const char *p = name;
		while (*p) {
			const char *end = strchr(p, '.');
			const char *next = end ? end + 1 : p + strlen(p);
			if (!*rest ? !end : (end && param_pattern_match(rest, next)))
				return true;
			if (!end)
				break;
			p = next;
		}
		return false;
	}
	size_t n = 0;
	while (pat[n] && pat[n] != '.')
		n++;
	if (strncmp(pat, name, n) || (name[n] != '.' && name[n] != 0))
		return false;
	if (!pat[n])
		return !name[n];
	if (!name[n])
		return false;
	return param_pattern_match(pat + n + 1, name + n + 1);
}

/* The candidates a pattern may have meant: each parameter's path, the path with its layer index
 * written '*', and that with the segments after the '*' shortened to any suffix
 * (layers.*.block.attention.wq, layers.*.attention.wq, layers.*.wq). */
static void pattern_candidates(const Graph *g, const char ***out, int *n)
{
	int cap = 64, count = 0;
	const char **c = arena_alloc(g->arena, sizeof *c * (size_t)cap);
	for (int i = 0; i < g->nops; i++) {
		if (g->ops[i].kind != OP_PARAM || g->vals[g->ops[i].out[0]].tied_to >= 0)
			continue;
		const char *name = g->vals[g->ops[i].out[0]].name;
		char *star = arena_strdup(g->arena, name);
		char *digits = NULL;
		for (char *seg = star; seg && *seg;) { /* the first all-digit segment becomes '*' */
			char *end = strchr(seg, '.');
			size_t len = end ? (size_t)(end - seg) : strlen(seg);
			if (len && strspn(seg, "0123456789") == len) {
				digits = seg;
				memmove(seg + 1, seg + len, strlen(seg + len) + 1);
				*seg = '*';
				break;
			}
			seg = end ? end + 1 : NULL;
		}
		const char *more[MAX_DIMS + 8];
		int m = 0;
		more[m++] = name;
		if (digits) {
			more[m++] = star;
			size_t head = (size_t)(digits - star) + 1; /* "layers.*" */
			for (const char *rest = strchr(digits, '.'); rest && m < MAX_DIMS + 8; rest = strchr(rest + 1, '.'))
				if (strchr(rest + 1, '.') || rest[1])
					more[m++] = arena_printf(g->arena, "%.*s%s", (int)head, star, rest);
		}
		for (int k = 0; k < m; k++) {
			if (count == cap) {
				const char **bigger = arena_alloc(g->arena, sizeof *c * (size_t)cap * 2);
				memcpy(bigger, c, sizeof *c * (size_t)cap);
				c = bigger;
				cap *= 2;
			}
			c[count++] = more[k];
		}
	}
	*out = c;
	*n = count;
}

void unmatched_pattern(const Graph *g, const char *what, const char *pattern, const Source *src, Loc loc,
		       const char *strategy)
{
	diag_error(src, loc, "%s '%s' matches no parameter of model '%s'", what, pattern, g->ps->model->name);
	if (strategy)
		diag_note_plain("the rule comes from strategy '%s'", strategy);
	const char **c;
	int n;
	pattern_candidates(g, &c, &n);
	const char *best = closest_name(pattern, c, n);
	if (best) {
		diag_note_plain("did you mean '%s'?", best);
		return;
	}
	/* else the parameters named like its last segment, or the first few */
	const char *last = strrchr(pattern, '.');
	last = last ? last + 1 : pattern;
	char list[512];
	size_t len = 0;
	int shown = 0;
	for (int pass = 0; pass < 2 && !shown; pass++)
		for (int i = 0; i < g->nops && shown < 4; i++) {
			if (g->ops[i].kind != OP_PARAM || g->vals[g->ops[i].out[0]].tied_to >= 0)
				continue;
			const char *name = g->vals[g->ops[i].out[0]].name, *seg = strrchr(name, '.');
			seg = seg ? seg + 1 : name;
			if (pass == 0 && strcmp(seg, last))
				continue;
			len += (size_t)snprintf(list + len, sizeof list - len > len ? sizeof list - len : 0, "%s'%s'",
						shown ? ", " : "", name);
			shown++;
		}
	if (shown)
		diag_note_plain("the model's parameters include %s (planc check FILE --plan P --dump-after=graph lists "
				"them all)", list);
}

const char *layout_string(const Graph *g, int v, char *buf, size_t n)
{
	const Value *val = &g->vals[v];
	size_t used = 0;
	buf[0] = 0;
	for (int a = 0; a < g->ps->naxes; a++) {
		int s = val->lay.on[a];
		if (s == LAYOUT_R)
			continue;
		int w;
		if (s == LAYOUT_P)
			w = snprintf(buf + used, n - used, "%s%s:P", used ? " " : "", g->ps->axes[a].name);
		else if (s == LAYOUT_FLAT)
			w = snprintf(buf + used, n - used, "%s%s:flat", used ? " " : "", g->ps->axes[a].name);
		else
			w = snprintf(buf + used, n - used, "%s%s:S(%d)", used ? " " : "", g->ps->axes[a].name, s);
		if (w < 0 || (size_t)w >= n - used)
			break;
		used += (size_t)w;
	}
	return buf;
}

static void dump_value(FILE *out, const Graph *g, int v)
{
	const Value *val = &g->vals[v];
	fprintf(out, "%%%d:%s[", v, dtype_name(val->dtype));
	for (int i = 0; i < val->rank; i++) {
		if (i)
			fputc(',', out);
		if (val->dim_name[i])
			fprintf(out, "%s=", val->dim_name[i]);
		fprintf(out, "%lld", val->dim[i]);
	}
	fputc(']', out);
	char buf[128];
	layout_string(g, v, buf, sizeof buf);
	if (buf[0])
		fprintf(out, "{%s}", buf);
}

/* The ZeRO and sync annotations (zero.c, sync.c), after the ops. */
static void dump_state(FILE *out, const Graph *g)
{
	const PlanSpec *ps = g->ps;
	if (g->zero.stage)
		fprintf(out, "zero %d over %s (%d ranks)\n", g->zero.stage, ps->axes[g->zero.axis].name, g->zero.size);
	const GradSync *gs = &g->sync;
	if (!gs->nbuckets && !gs->ntied && gs->axis < 0)
		return;
	static const char *const modes[] = {"strict", "local_sgd", "async"};
	fprintf(out, "sync %s over %s%s%s%s\n", modes[gs->mode], gs->axis >= 0 ? ps->axes[gs->axis].name : "no axis",
		gs->replicas ? "" : " (one replica)", gs->compress ? ", compressed" : "", gs->overlap ? ", overlapped" : "");
	for (int i = 0; i < gs->nbuckets; i++) {
		const GradBucket *b = &gs->buckets[i];
		fprintf(out, "bucket %d: %s axis=%s stage=%d %s, %lld %s elements of", i, op_names[b->coll],
			ps->axes[b->axis].name, b->stage, b->per_step ? "per step" : "per micro-batch", b->elems,
			dtype_name(b->dtype));
		for (int m = 0; m < b->nmembers; m++)
			fprintf(out, " %%%d", b->members[m]);
		fputc('\n', out);
	}
	for (int i = 0; i < gs->ntied; i++)
		fprintf(out, "tied: %%%d (stage %d) + %%%d (stage %d) over %s\n", gs->tied[i].grad[0], gs->tied[i].stage[0],
			gs->tied[i].grad[1], gs->tied[i].stage[1], ps->axes[ps->pipe_axis].name);
}

void graph_dump(FILE *out, const Graph *g)
{
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		fprintf(out, "%4d %s%s", i, op->backward ? "B " : op->per_step ? "U " : "F ", op->recompute ? "R " : "");
		for (int k = 0; k < op->nout; k++) {
			if (k)
				fputs(", ", out);
			dump_value(out, g, op->out[k]);
		}
		fprintf(out, " = %s", op_names[op->kind]);
		for (int k = 0; k < op->nin; k++)
			fprintf(out, "%s%%%d", k ? ", " : " ", op->in[k]);
		if (op_classes[op->kind] == OPK_COLLECTIVE || op_classes[op->kind] == OPK_P2P)
			fprintf(out, " axis=%s", op->axis >= 0 ? g->ps->axes[op->axis].name : "?");
		if (op->coll_dim >= 0)
			fprintf(out, " dim=%d", op->coll_dim);
		if (op->layer >= 0)
			fprintf(out, " layer=%d", op->layer);
		if (g->ps->pipe_axis >= 0)
			fprintf(out, " stage=%d", op->stage);
		if (op->kind == OP_PARAM || op->kind == OP_INPUT || op->kind == OP_KV_CACHE)
			fprintf(out, " %s", g->vals[op->out[0]].name);
		fputc('\n', out);
	}
	dump_state(out, g);
	if (g->decode)
		fprintf(out, "# decode: the next token's logits %%%d; position %%%d; caches of %lld rows\n", g->logits,
			g->position, g->context);
}

/* ------------------------------------------------------------------ elaboration */

typedef enum { EV_NONE, EV_TENSOR, EV_NUM, EV_STR, EV_FN } EnvKind;

typedef struct EnvVal {
	EnvKind kind;
	int tensor;       /* EV_TENSOR */
	double num;       /* EV_NUM */
	bool is_int;
	long long inum;   /* EV_NUM and is_int: the exact value (num is its nearest double) */
	const char *dim_name; /* EV_NUM: the hyperparameter it came from */
	const char *str;  /* EV_STR */
	Item *fn;         /* EV_FN */
} EnvVal;

typedef struct Binding {
	const char *name;
	EnvVal val;
	struct Binding *next;
} Binding;

typedef struct CallCounter {
	const char *fn;
	int count;
	struct CallCounter *next;
} CallCounter;

typedef struct Scope {
	const char *path;       /* "" at model level, "layers.3", "layers.3.block" ... */
	CallCounter *counters;  /* calls made from this scope, for the _1 suffixes */
	Binding *env;
	int nenv;
	SymTab *index;          /* name -> Binding, once the scope holds more than a few names */
	const Module *module;   /* for resolving imports */
	EnvVal ret;
	bool returned;
} Scope;

typedef struct CallSite {
	const Source *src;
	Loc loc;
	const char *fn;
} CallSite;

typedef struct Elab {
	Graph *g;
	PlanSpec *ps;
	Arena *a;
	int layer;            /* current top-level repeat iteration or -1 */
	int repeat_depth;
	bool in_recompute;    /* inside an @recompute fn */
	const char *op_scope; /* scope path for ops */
	CallSite stack[64];
	int depth;
	const Source *src;    /* source of the statement being elaborated */
	bool failed;
	DType act_dtype;
	SymTab *primitives;   /* name -> Primitive */
	int folded;           /* ops folded away as identities (dropout at p = 0, scale by 1): they keep
			       * their elaboration index, so the later ops' RNG keys do not move */
} Elab;

static void call_notes(Elab *e)
{
	for (int i = e->depth - 1; i >= 0; i--)
		diag_note(e->stack[i].src, e->stack[i].loc, "in call to '%s' here", e->stack[i].fn);
}

static void shape_text(const Graph *g, int v, char *buf, size_t n)
{
	const Value *val = &g->vals[v];
	size_t used = 0;
	used += (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < val->rank && used < n; i++)
		used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", val->dim[i]);
	if (used < n)
		snprintf(buf + used, n - used, "]");
}

static void elab_error(Elab *e, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void elab_error(Elab *e, Loc loc, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!e->failed) {
		diag_error(e->src, loc, "%s", msg);
		call_notes(e);
	}
	e->failed = true;
}

static Binding *lookup(Scope *sc, const char *name)
{
	if (sc->index)
		return symtab_get(sc->index, name);
	for (Binding *b = sc->env; b; b = b->next)
		if (!strcmp(b->name, name))
			return b;
	return NULL;
}

/* A fn's few parameters are searched in a list; a model body with thousands of variables gets a
 * hash table once it holds more than 8 names. */
static void bind(Elab *e, Scope *sc, const char *name, EnvVal v)
{
	Binding *b = lookup(sc, name);
	if (!b) {
		b = arena_alloc(e->a, sizeof *b);
		b->name = name;
		b->next = sc->env;
		sc->env = b;
		if (++sc->nenv > 8 && !sc->index) {
			sc->index = symtab_new(e->a);
			for (Binding *o = sc->env; o; o = o->next)
				symtab_put(sc->index, o->name, o);
		} else if (sc->index) {
			symtab_put(sc->index, name, b);
		}
	}
	b->val = v;
}

static EnvVal num_val(double x, bool is_int, const char *name)
{
	EnvVal v = {.kind = EV_NUM, .num = x, .is_int = is_int, .dim_name = name};
	return v;
}

/* Integers stay exact 64-bit values: sizes above 2^53 are not rounded through a double. */
static EnvVal int_val(long long x, const char *name)
{
	EnvVal v = {.kind = EV_NUM, .num = (double)x, .is_int = true, .inum = x, .dim_name = name};
	return v;
}

static EnvVal tensor_val(int t)
{
	EnvVal v = {.kind = EV_TENSOR, .tensor = t};
	return v;
}

/* Shapes are checked where they are made: a tensor's element count and bytes must be exact
 * products below 2^60 bytes (1 EiB), never wrapped. Every size computed from them later (local
 * blocks, buffers, buckets, arenas, wire bytes) is then a product or sum that fits 64 bits, which
 * graph_build's total check below makes sure of for sums. */
#define MAX_TENSOR_BYTES (1LL << 60)

static bool shape_bytes(const Value *v, long long *bytes)
{
	long long n = 1;
	for (int i = 0; i < v->rank; i++)
		if (v->dim[i] < 0 || __builtin_mul_overflow(n, v->dim[i], &n))
			return false;
	return !__builtin_mul_overflow(n, (long long)dtype_bytes(v->dtype), bytes) && *bytes <= MAX_TENSOR_BYTES;
}

static void check_shape(Elab *e, OpKind k, int v, Loc loc)
{
	const Value *val = &e->g->vals[v];
	long long bytes;
	if (shape_bytes(val, &bytes) || e->failed)
		return;
	char shape[192];
	shape_text(e->g, v, shape, sizeof shape);
	double elems = 1;
	for (int i = 0; i < val->rank; i++)
		elems *= (double)val->dim[i];
	const char *what = k == OP_PARAM ? arena_printf(e->a, "param '%s'", val->name)
			   : k == OP_INPUT ? arena_printf(e->a, "input '%s'", val->name)
					   : arena_printf(e->a, "the result of %s", op_names[k]);
	elab_error(e, loc, "%s of shape %s %s holds %.4g elements, %.4g bytes: more than the 2^60 bytes (1 EiB) one tensor may hold",
		   what, shape, dtype_name(val->dtype), elems, elems * dtype_bytes(val->dtype));
	diag_note_plain("planc computes sizes as exact 64-bit integers; make the dimensions smaller");
}

/* A new op in the current scope and layer with fresh output values. */
static int emit(Elab *e, OpKind k, int nin, const int *in, int nout, const int *out, Loc loc)
{
	for (int i = 0; i < nout; i++)
		check_shape(e, k, out[i], loc);
	int o = graph_add_op(e->g, k, nin, in, nout, out);
	Op *op = &e->g->ops[o];
	op->orig = o + e->folded;
	op->layer = e->layer;
	op->scope = e->op_scope;
	op->loc = loc;
	op->src = e->src;
	op->in_recompute_fn = e->in_recompute;
	if (e->depth > 0) {
		op->call_src = e->stack[0].src;
		op->call_loc = e->stack[0].loc;
		op->call_fn = e->stack[0].fn;
	}
	for (int i = 0; i < nout; i++)
		e->g->vals[out[i]].layer = e->layer;
	return o;
}

static int new_value_like(Elab *e, int like, DType t)
{
	const Value *v = &e->g->vals[like];
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	for (int i = 0; i < v->rank; i++) {
		dim[i] = v->dim[i];
		names[i] = v->dim_name[i];
	}
	return graph_add_value(e->g, t, v->rank, dim, names);
}

static bool is_float(DType t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16 || t == DT_F64; }

static EnvVal eval(Elab *e, Scope *sc, Expr *x);

static bool eval_int(Elab *e, Scope *sc, Expr *x, long long *out, const char **name)
{
	EnvVal v = eval(e, sc, x);
	if (e->failed)
		return false;
	if (v.kind != EV_NUM || !v.is_int) {
		elab_error(e, x->loc, "expected an integer here");
		return false;
	}
	*out = v.inum;
	if (name)
		*name = v.dim_name;
	return true;
}

static int eval_tensor(Elab *e, Scope *sc, Expr *x)
{
	EnvVal v = eval(e, sc, x);
	if (e->failed)
		return -1;
	if (v.kind != EV_TENSOR) {
		elab_error(e, x->loc, "expected a tensor here");
		return -1;
	}
	return v.tensor;
}

/* Unary op whose output has the input's shape. */
static int unary(Elab *e, OpKind k, int x, Loc loc)
{
	int y = new_value_like(e, x, e->g->vals[x].dtype);
	emit(e, k, 1, &x, 1, &y, loc);
	return y;
}

/* Broadcast two shapes (numpy rules) into out; false if incompatible. */
static bool broadcast_shape(const Value *a, const Value *b, int *rank, long long *dim, const char **names)
{
	int r = a->rank > b->rank ? a->rank : b->rank;
	for (int i = 0; i < r; i++) {
		int ia = a->rank - r + i, ib = b->rank - r + i;
		long long da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
		const char *na = ia >= 0 ? a->dim_name[ia] : NULL, *nb = ib >= 0 ? b->dim_name[ib] : NULL;
		if (da != db && da != 1 && db != 1)
			return false;
		dim[i] = da > db ? da : db;
		names[i] = da >= db && na ? na : nb ? nb : na;
	}
	*rank = r;
	return true;
}

static int binary(Elab *e, OpKind k, int a, int b, Loc loc, const char *opname)
{
	const Value *va = &e->g->vals[a], *vb = &e->g->vals[b];
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	int rank;
	if (!broadcast_shape(va, vb, &rank, dim, names)) {
		char sa[128], sb[128];
		shape_text(e->g, a, sa, sizeof sa);
		shape_text(e->g, b, sb, sizeof sb);
		elab_error(e, loc, "shapes %s and %s do not broadcast for '%s'", sa, sb, opname);
		return -1;
	}
	if (!is_float(va->dtype) || !is_float(vb->dtype)) {
		elab_error(e, loc, "'%s' needs floating-point tensors, not %s and %s", opname, dtype_name(va->dtype),
			   dtype_name(vb->dtype));
		return -1;
	}
	int y = graph_add_value(e->g, va->dtype, rank, dim, names);
	int in[2] = {a, b};
	emit(e, k, 2, in, 1, &y, loc);
	return y;
}

static int matmul(Elab *e, int a, int b, Loc loc)
{
	const Value *va = &e->g->vals[a], *vb = &e->g->vals[b];
	char sa[128], sb[128];
	shape_text(e->g, a, sa, sizeof sa);
	shape_text(e->g, b, sb, sizeof sb);
	if (va->rank < 2 || vb->rank < 2) {
		elab_error(e, loc, "'@' needs operands of rank 2 or more, got %s @ %s", sa, sb);
		return -1;
	}
	if (va->dim[va->rank - 1] != vb->dim[vb->rank - 2]) {
		elab_error(e, loc, "matmul inner dimensions differ: %s @ %s (%lld vs %lld)", sa, sb,
			   va->dim[va->rank - 1], vb->dim[vb->rank - 2]);
		return -1;
	}
	/* batch dims broadcast (torch.matmul, numpy rules, right aligned); a rank-2 b is a weight
	 * applied to every row of a */
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	int rank = va->rank > vb->rank ? va->rank : vb->rank;
	for (int i = 0; i < rank - 2; i++) {
		int ia = i - (rank - va->rank), ib = i - (rank - vb->rank);
		long long da = ia >= 0 ? va->dim[ia] : 1, db = ib >= 0 ? vb->dim[ib] : 1;
		if (da != db && da != 1 && db != 1) {
			elab_error(e, loc, "batched matmul batch dimensions do not broadcast: %s @ %s", sa, sb);
			return -1;
		}
		dim[i] = da > db ? da : db;
		names[i] = ia >= 0 && va->dim[ia] == dim[i] ? va->dim_name[ia] : ib >= 0 ? vb->dim_name[ib] : NULL;
	}
	dim[rank - 2] = va->dim[va->rank - 2];
	names[rank - 2] = va->dim_name[va->rank - 2];
	dim[rank - 1] = vb->dim[vb->rank - 1];
	names[rank - 1] = vb->dim_name[vb->rank - 1];
	int y = graph_add_value(e->g, va->dtype, rank, dim, names);
	int in[2] = {a, b};
	emit(e, OP_MATMUL, 2, in, 1, &y, loc);
	return y;
}

static int transpose(Elab *e, int x, Loc loc)
{
	const Value *v = &e->g->vals[x];
	if (v->rank < 2) {
		elab_error(e, loc, "'.T' needs a tensor of rank 2 or more");
		return -1;
	}
	int y = new_value_like(e, x, v->dtype);
	Value *vy = &e->g->vals[y];
	vy->dim[v->rank - 1] = v->dim[v->rank - 2];
	vy->dim[v->rank - 2] = v->dim[v->rank - 1];
	vy->dim_name[v->rank - 1] = v->dim_name[v->rank - 2];
	vy->dim_name[v->rank - 2] = v->dim_name[v->rank - 1];
	vy->alias_of = x;
	emit(e, OP_TRANSPOSE, 1, &x, 1, &y, loc);
	return y;
}

/* Keyword and positional arguments of a primitive call. */
typedef struct CallArgs {
	Expr *pos[8];
	int npos;
	Arg *kw[8];
	int nkw;
	Loc loc;
} CallArgs;

static Expr *kwarg(CallArgs *ca, const char *key, int pos_index)
{
	for (int i = 0; i < ca->nkw; i++)
		if (!strcmp(ca->kw[i]->key, key))
			return ca->kw[i]->value;
	if (pos_index >= 0 && pos_index < ca->npos)
		return ca->pos[pos_index];
	return NULL;
}

static double num_arg(Elab *e, Scope *sc, CallArgs *ca, const char *key, int pos, double def)
{
	Expr *x = kwarg(ca, key, pos);
	if (!x)
		return def;
	EnvVal v = eval(e, sc, x);
	if (e->failed)
		return def;
	if (v.kind != EV_NUM) {
		elab_error(e, x->loc, "'%s' must be a number", key);
		return def;
	}
	return v.num;
}

static bool check_arity(Elab *e, CallArgs *ca, const char *name, int min, int max, const char *const *keys)
{
	if (ca->npos < min) {
		elab_error(e, ca->loc, "'%s' needs %d argument%s, got %d", name, min, min == 1 ? "" : "s", ca->npos);
		return false;
	}
	if (ca->npos > max) {
		elab_error(e, ca->pos[max]->loc, "too many arguments to '%s' (at most %d)", name, max);
		return false;
	}
	for (int i = 0; i < ca->nkw; i++) {
		bool ok = false;
		int nkeys = 0;
		for (const char *const *k = keys; k && *k; k++, nkeys++)
			if (!strcmp(*k, ca->kw[i]->key))
				ok = true;
		if (!ok) {
			elab_error(e, ca->kw[i]->key_loc, "'%s' has no argument '%s'", name, ca->kw[i]->key);
			const char *best = closest_name(ca->kw[i]->key, keys, nkeys);
			if (best)
				diag_note_plain("did you mean '%s'?", best);
			return false;
		}
	}
	return true;
}

/* The routing attributes every op reading a route carries (its router's). */
static void moe_attributes(Op *op, const Op *router)
{
	op->moe_group = router->moe_group;
	op->moe_capacity = router->moe_capacity;
	op->moe_normalize = router->moe_normalize;
}

static int route_of(Elab *e, int route, Loc loc, const char *fn)
{
	if (route < 0)
		return -1;
	int def = e->g->vals[route].def;
	if (def < 0 || e->g->ops[def].kind != OP_MOE_ROUTER) {
		elab_error(e, loc, "'%s' needs the result of moe_router", fn);
		return -1;
	}
	return def;
}

/* ------------------------------------------------------------------ the primitives' arguments: dims,
 * positions, lists; x[i, _, j] indexing */

/* A dim argument in [-rank, rank), returned in [0, rank). */
static bool dim_arg(Elab *e, Scope *sc, Expr *x, int rank, int *d)
{
	long long i;
	if (!eval_int(e, sc, x, &i, NULL))
		return false;
	if (i < -rank || i >= rank) {
		elab_error(e, x->loc, "dimension %lld out of range for a tensor of rank %d", i, rank);
		return false;
	}
	*d = (int)(i < 0 ? i + rank : i);
	return true;
}

static int float_tensor(Elab *e, Scope *sc, Expr *x, const char *fn)
{
	int t = eval_tensor(e, sc, x);
	if (t >= 0 && !is_float(e->g->vals[t].dtype)) {
		elab_error(e, x->loc, "'%s' needs a floating-point tensor, not %s", fn, dtype_name(e->g->vals[t].dtype));
		return -1;
	}
	return t;
}

/* v's dims without dim d (drop), or with d set to n */
static int reshaped_like(Elab *e, int v, int d, long long n, bool drop, DType t)
{
	const Value *val = &e->g->vals[v];
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	int r = 0;
	for (int i = 0; i < val->rank; i++) {
		if (i == d && drop)
			continue;
		dim[r] = i == d ? n : val->dim[i];
		names[r] = i == d && n != val->dim[i] ? NULL : val->dim_name[i];
		r++;
	}
	return graph_add_value(e->g, t, r, dim, names);
}

/* rows [start, start + len) of dim d; drop: len is 1 and the dim goes (x[.., i, ..]) */
static int narrow(Elab *e, int x, int d, long long start, long long len, bool drop, Loc loc)
{
	int y = reshaped_like(e, x, d, len, drop, e->g->vals[x].dtype);
	int o = emit(e, OP_NARROW, 1, &x, 1, &y, loc);
	Op *op = &e->g->ops[o];
	op->dim = d;
	op->dim2 = drop;
	op->start = start;
	op->length = len;
	return y;
}

/* An index in [-n, n) (end: in [-n, n]) as a position in [0, n] */
static bool position_arg(Elab *e, Scope *sc, Expr *x, long long n, bool end, long long *at)
{
	long long i;
	if (!eval_int(e, sc, x, &i, NULL))
		return false;
	if (i < -n || i > (end ? n : n - 1)) {
		elab_error(e, x->loc, "index %lld is out of range for a dimension of size %lld", i, n);
		return false;
	}
	*at = i < 0 ? i + n : i;
	return true;
}

/* x[i, _, j]: each entry a position (the dim is dropped, torch's select) or '_' (the whole dim) */
static int index_tensor(Elab *e, Scope *sc, Expr *x)
{
	int t = eval_tensor(e, sc, x->lhs);
	if (t < 0)
		return -1;
	int n = 0;
	for (Expr *i = x->rhs; i; i = i->next)
		n++;
	if (n > e->g->vals[t].rank) {
		elab_error(e, x->loc, "%d indices for a tensor of rank %d", n, e->g->vals[t].rank);
		return -1;
	}
	int d = 0;
	for (Expr *i = x->rhs; i && t >= 0; i = i->next) {
		if (i->kind == E_NAME && !strcmp(i->text, "_")) {
			d++;
			continue;
		}
		long long at;
		if (!position_arg(e, sc, i, e->g->vals[t].dim[d], false, &at))
			return -1;
		t = narrow(e, t, d, at, 1, true, i->loc);
	}
	return t;
}

/* The items of a list or tuple argument (or the argument itself), at most max. */
static int list_items(Elab *e, Expr *x, Expr **items, int max, const char *fn)
{
	int n = 0;
	if (x->kind != E_LIST && x->kind != E_TUPLE) {
		items[n++] = x;
		return n;
	}
	for (Expr *i = x->items; i; i = i->next) {
		if (n == max) {
			elab_error(e, i->loc, "'%s' takes at most %d %s here%s", fn, max, strcmp(fn, "concat") ? "items" : "tensors",
				   strcmp(fn, "concat") ? "" : "; concatenate in steps (a concat of concats)");
			return -1;
		}
		items[n++] = i;
	}
	return n;
}

/* ------------------------------------------------------------------ primitive ops
 *
 * Each primitive is a row of the table below: its name, the positional arguments it takes
 * (min..max) and its keyword names, which call_primitive checks for every call before the row's
 * handler runs, and the handler, which evaluates the arguments and emits the op. A handler shared
 * by several primitives tells them apart by the row's op (the op kind it emits) or code (below).
 * The elaborator looks names up through a symbol table built from the rows (elab_primitives). */

typedef struct Primitive Primitive;
typedef void PrimitiveBuild(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out);
struct Primitive {
	const char *name;
	PrimitiveBuild *build;
	int min_args, max_args;  /* positional */
	const char *const *keys; /* keyword names, NULL-terminated */
	OpKind op;               /* the op it emits (OP_COUNT: none); shared handlers read it */
	int code;                /* unary functions: the UnaryFn; mean: 1;
				  * l1_loss: 1 (the op's n) */
};

/* dim(x, i): the size of x's dim i, as an integer named like the dim */
static void prim_dim(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	long long i;
	if (x < 0 || !eval_int(e, sc, ca->pos[1], &i, NULL))
		return;
	int r = g->vals[x].rank;
	if (i < -r || i >= r) {
		elab_error(e, ca->pos[1]->loc, "dimension %lld out of range for a tensor of rank %d", i, r);
		return;
	}
	if (i < 0)
		i += r;
	*out = int_val(g->vals[x].dim[i], g->vals[x].dim_name[i]);
}

/* sqrt(n) of a number (hyperparameter arithmetic; tensors take their element-wise functions) */
static void prim_sqrt(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	EnvVal v = eval(e, sc, ca->pos[0]);
	if (e->failed)
		return;
	if (v.kind != EV_NUM || v.num < 0) {
		elab_error(e, ca->pos[0]->loc, "'sqrt' needs a non-negative number");
		return;
	}
	*out = num_val(sqrt(v.num), false, NULL);
}

/* embed(table [V, D], ids i32 [..]) -> [.., D] */
static void prim_embed(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int t = eval_tensor(e, sc, ca->pos[0]);
	int ids = t < 0 ? -1 : eval_tensor(e, sc, ca->pos[1]);
	if (ids < 0)
		return;
	const Value *vt = &g->vals[t], *vi = &g->vals[ids];
	if (vt->rank != 2) {
		elab_error(e, ca->pos[0]->loc, "embedding table must be 2-D [V, D]");
		return;
	}
	if (vi->dtype != DT_I32) {
		elab_error(e, ca->pos[1]->loc, "embedding ids must be i32, not %s", dtype_name(vi->dtype));
		return;
	}
	if (vi->rank + 1 > MAX_DIMS) {
		elab_error(e, ca->loc, "too many dimensions");
		return;
	}
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	for (int i = 0; i < vi->rank; i++) {
		dim[i] = vi->dim[i];
		names[i] = vi->dim_name[i];
	}
	dim[vi->rank] = vt->dim[1];
	names[vi->rank] = vt->dim_name[1];
	int y = graph_add_value(g, e->act_dtype, vi->rank + 1, dim, names);
	int in[2] = {t, ids};
	emit(e, OP_EMBED, 2, in, 1, &y, ca->loc);
	*out = tensor_val(y);
}

/* layer_norm(x, w, b, eps) and rms_norm(x, w, eps) over the last dim; the statistics the backward
 * reads are outputs too */
static void prim_norm(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	bool ln = p->op == OP_LAYER_NORM;
	int x = eval_tensor(e, sc, ca->pos[0]);
	int w = x < 0 ? -1 : eval_tensor(e, sc, ca->pos[1]);
	int b = (!ln || w < 0) ? -1 : eval_tensor(e, sc, ca->pos[2]);
	if (w < 0 || (ln && b < 0))
		return;
	const Value *vx = &g->vals[x];
	long long d = vx->dim[vx->rank - 1];
	for (int k = 1; k < (ln ? 3 : 2); k++) {
		int wb = k == 1 ? w : b;
		if (g->vals[wb].rank != 1 || g->vals[wb].dim[0] != d) {
			char s1[128], s2[128];
			shape_text(g, x, s1, sizeof s1);
			shape_text(g, wb, s2, sizeof s2);
			elab_error(e, ca->pos[k]->loc, "%s weight has shape %s but the input %s needs [%lld]", p->name, s2, s1,
				   d);
			return;
		}
	}
	double eps = num_arg(e, sc, ca, "eps", -1, ln ? 1e-5 : 1e-6);
	int y = new_value_like(e, x, vx->dtype);
	long long sdim[MAX_DIMS];
	for (int i = 0; i < vx->rank - 1; i++)
		sdim[i] = vx->dim[i];
	int mean = graph_add_value(g, DT_F32, vx->rank - 1, sdim, (const char *const *)g->vals[x].dim_name);
	int rstd = graph_add_value(g, DT_F32, vx->rank - 1, sdim, (const char *const *)g->vals[x].dim_name);
	g->vals[mean].role = ROLE_STAT;
	g->vals[rstd].role = ROLE_STAT;
	int in[3] = {x, w, b};
	int outs[3] = {y, mean, rstd};
	int o = ln ? emit(e, OP_LAYER_NORM, 3, in, 3, outs, ca->loc) : emit(e, OP_RMS_NORM, 2, in, 2, (int[]){y, rstd}, ca->loc);
	g->ops[o].f = eps;
	*out = tensor_val(y);
}

/* relu, silu, softmax (over the last dim), causal_mask (of square last two dims) */
static void prim_activation(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	if (x < 0)
		return;
	if (p->op == OP_CAUSAL_MASK) {
		const Value *v = &g->vals[x];
		if (v->rank < 2 || v->dim[v->rank - 1] != v->dim[v->rank - 2]) {
			char s[128];
			shape_text(g, x, s, sizeof s);
			elab_error(e, ca->loc, "causal_mask needs square last two dimensions, got %s", s);
			return;
		}
	}
	*out = tensor_val(unary(e, p->op, x, ca->loc));
}

/* gelu(x, approximate = "none" | "tanh") */
static void prim_gelu(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	int x = eval_tensor(e, sc, ca->pos[0]);
	if (x < 0)
		return;
	const char *approx = "none";
	Expr *a = kwarg(ca, "approximate", -1);
	if (a) {
		EnvVal v = eval(e, sc, a);
		if (v.kind != EV_STR || (strcmp(v.str, "none") && strcmp(v.str, "tanh"))) {
			elab_error(e, a->loc, "gelu approximate must be \"none\" or \"tanh\"");
			return;
		}
		approx = v.str;
	}
	int y = unary(e, OP_GELU, x, ca->loc);
	e->g->ops[e->g->vals[y].def].s = approx;
	*out = tensor_val(y);
}

/* dropout(x, p): the mask the backward reads is an output */
static void prim_dropout(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	if (x < 0)
		return;
	double prob = num_arg(e, sc, ca, "p", 1, 0.1);
	if (e->failed)
		return;
	if (prob < 0 || prob >= 1) {
		elab_error(e, ca->loc, "dropout probability must be in [0, 1), got %g", prob);
		return;
	}
	if (prob == 0) { /* the identity: no random numbers, no mask, no kernel, no gradient op */
		e->folded++;
		*out = tensor_val(x);
		return;
	}
	int y = new_value_like(e, x, g->vals[x].dtype);
	int mask = new_value_like(e, x, DT_U8);
	g->vals[mask].role = ROLE_MASK;
	int o = emit(e, OP_DROPOUT, 1, &x, 2, (int[]){y, mask}, ca->loc);
	g->ops[o].f = prob;
	*out = tensor_val(y);
}

/* split_heads(x [.., S, D], heads = H) -> [.., H, S, D / H], a view of x */
static void prim_split_heads(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	Expr *hx = kwarg(ca, "heads", 1);
	if (x < 0)
		return;
	if (!hx) {
		elab_error(e, ca->loc, "split_heads needs the number of heads");
		return;
	}
	long long h;
	const char *hname;
	if (!eval_int(e, sc, hx, &h, &hname))
		return;
	const Value *v = &g->vals[x];
	if (v->rank < 2 || v->rank + 1 > MAX_DIMS) {
		elab_error(e, ca->loc, "split_heads needs a tensor [.., S, D]");
		return;
	}
	long long d = v->dim[v->rank - 1];
	if (h <= 0 || d % h) {
		elab_error(e, hx->loc, "hidden size %lld is not divisible by %lld heads", d, h);
		return;
	}
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	int r = v->rank;
	for (int i = 0; i < r - 2; i++) {
		dim[i] = v->dim[i];
		names[i] = v->dim_name[i];
	}
	dim[r - 2] = h;
	names[r - 2] = hname ? hname : "heads";
	dim[r - 1] = v->dim[r - 2];
	names[r - 1] = v->dim_name[r - 2];
	dim[r] = d / h;
	names[r] = NULL;
	int y = graph_add_value(g, v->dtype, r + 1, dim, names);
	g->vals[y].alias_of = x;
	int o = emit(e, OP_SPLIT_HEADS, 1, &x, 1, &y, ca->loc);
	g->ops[o].n = h;
	*out = tensor_val(y);
}

/* merge_heads(x [.., H, S, Dh]) -> [.., S, H * Dh], a view of x */
static void prim_merge_heads(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	if (x < 0)
		return;
	const Value *v = &g->vals[x];
	if (v->rank < 3) {
		elab_error(e, ca->loc, "merge_heads needs a tensor [.., H, S, Dh]");
		return;
	}
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	int r = v->rank;
	for (int i = 0; i < r - 3; i++) {
		dim[i] = v->dim[i];
		names[i] = v->dim_name[i];
	}
	dim[r - 3] = v->dim[r - 2];
	names[r - 3] = v->dim_name[r - 2];
	dim[r - 2] = v->dim[r - 3] * v->dim[r - 1];
	names[r - 2] = NULL;
	int y = graph_add_value(g, v->dtype, r - 1, dim, names);
	g->vals[y].alias_of = x;
	int o = emit(e, OP_MERGE_HEADS, 1, &x, 1, &y, ca->loc);
	g->ops[o].n = v->dim[r - 3];
	*out = tensor_val(y);
}

/* cross_entropy(logits [.., V], targets i32 [..]): the mean over tokens; the log-sum-exp the
 * backward reads is an output */
static void prim_cross_entropy(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int l = eval_tensor(e, sc, ca->pos[0]);
	int t = l < 0 ? -1 : eval_tensor(e, sc, ca->pos[1]);
	if (t < 0)
		return;
	const Value *vl = &g->vals[l], *vt = &g->vals[t];
	bool ok = vt->dtype == DT_I32 && vl->rank == vt->rank + 1;
	for (int i = 0; ok && i < vt->rank; i++)
		ok = vl->dim[i] == vt->dim[i];
	if (!ok) {
		char s1[128], s2[128];
		shape_text(g, l, s1, sizeof s1);
		shape_text(g, t, s2, sizeof s2);
		elab_error(e, ca->loc, "cross_entropy needs logits [.., V] and i32 targets [..], got %s and %s %s", s1,
			   dtype_name(vt->dtype), s2);
		diag_note_plain("the targets have the logits' dims but the last (the classes): per-sample labels "
				"i32 [B] go with logits [B, C], so pool or select a position first (x[_, 0])");
		return;
	}
	int loss = graph_add_value(g, DT_F32, 0, NULL, NULL);
	g->vals[loss].role = ROLE_LOSS;
	int lse = graph_add_value(g, DT_F32, vt->rank, vt->dim, (const char *const *)g->vals[t].dim_name);
	g->vals[lse].role = ROLE_STAT;
	int in[2] = {l, t};
	emit(e, OP_CROSS_ENTROPY, 2, in, 2, (int[]){loss, lse}, ca->loc);
	*out = tensor_val(loss);
}

/* The plan's `experts count = N` against the router's N: the plan does not choose it. */
static bool router_matches_plan(Elab *e, long long experts, Loc loc)
{
	const PlanSpec *ps = e->ps;
	if (!ps->has_experts || !ps->expert_count || ps->expert_count == experts)
		return true;
	if (!e->failed) {
		diag_error(ps->src, ps->expert_count_loc, "experts count = %d does not match the model's %lld experts",
			   ps->expert_count, experts);
		diag_note(e->src, loc, "this router chooses among %lld experts", experts);
		diag_note_plain("the number of experts is the model's: set it through the model's "
				"hyperparameters (plan %s for %s(...)), or leave count out",
				ps->plan->name, ps->model->name);
	}
	e->failed = true;
	return false;
}

/* moe_router(logits [.., E], top_k, capacity_factor, normalize, dropless) -> gates [T, k] (and
 * the chosen experts [T, k] as its second output); the plan's experts top_k and capacity_factor
 * override the model's */
static void prim_moe_router(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	Loc loc = ca->loc;
	int l = eval_tensor(e, sc, ca->pos[0]);
	if (l < 0)
		return;
	double k = num_arg(e, sc, ca, "top_k", -1, 2);
	double cf = num_arg(e, sc, ca, "capacity_factor", -1, 1.25);
	double normalize = num_arg(e, sc, ca, "normalize", -1, 0);
	double dropless = num_arg(e, sc, ca, "dropless", -1, 0);
	if (e->ps->has_experts) {
		if (e->ps->top_k > 0)
			k = e->ps->top_k;
		if (e->ps->capacity_factor > 0)
			cf = e->ps->capacity_factor;
	}
	const Value *vl = &g->vals[l];
	long long E = vl->dim[vl->rank - 1];
	if (!router_matches_plan(e, E, loc))
		return;
	if (k < 1 || k > (double)E || k != floor(k)) {
		elab_error(e, loc, "top_k = %g must be a whole number between 1 and the %lld experts", k, E);
		return;
	}
	if ((normalize != 0 && normalize != 1) || (dropless != 0 && dropless != 1)) {
		elab_error(e, loc, "normalize and dropless are 0 or 1");
		return;
	}
	if (!dropless && !(cf > 0)) {
		elab_error(e, loc, "capacity_factor = %g must be positive", cf);
		diag_note_plain("for every token to reach its experts, route with dropless = 1");
		return;
	}
	if (vl->rank < 2) {
		elab_error(e, loc, "moe_router needs logits [.., E] with a batch dim first");
		return;
	}
	long long tokens = 1;
	for (int i = 0; i < vl->rank - 1; i++)
		tokens *= vl->dim[i];
	long long group = tokens / vl->dim[0]; /* a routing group: the tokens of one sample */
	long long dim[2] = {tokens, (long long)k};
	int gates = graph_add_value(g, DT_F32, 2, dim, NULL);
	int idx = graph_add_value(g, DT_I32, 2, dim, NULL);
	g->vals[idx].role = ROLE_INDEX;
	int o = emit(e, OP_MOE_ROUTER, 1, &l, 2, (int[]){gates, idx}, loc);
	Op *op = &g->ops[o];
	op->n = (long long)k;
	op->f = dropless ? 0 : cf;
	op->moe_group = group;
	/* pairs an expert takes per group: GShard's ceil(k G cf / E); dropless: every token */
	op->moe_capacity = dropless ? 0 : (long long)ceil((double)k * (double)group * cf / (double)E);
	if (!dropless && op->moe_capacity < 1)
		op->moe_capacity = 1;
	op->moe_normalize = normalize != 0;
	g->has_moe = true;
	*out = tensor_val(gates);
}

/* moe_dispatch(x [.., D], route) -> [E, C, D] and moe_combine(y [E, C, D], route) -> [.., D]:
 * tokens to their experts' slots and back */
static void prim_moe_route(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	bool dispatch = p->op == OP_MOE_DISPATCH;
	int x = eval_tensor(e, sc, ca->pos[0]);
	int r = x < 0 ? -1 : eval_tensor(e, sc, ca->pos[1]);
	int ro = route_of(e, r, ca->pos[1]->loc, p->name);
	if (ro < 0)
		return;
	const Op *router = &g->ops[ro];
	const Value *logits = &g->vals[router->in[0]];
	long long E = logits->dim[logits->rank - 1];
	long long tokens = g->vals[router->out[0]].dim[0];
	/* slots per expert: every group's capacity (dropless: every token) */
	long long cap = router->moe_capacity ? tokens / router->moe_group * router->moe_capacity : tokens;
	const Value *vx = &g->vals[x];
	int idx = router->out[1];
	int y;
	if (dispatch) {
		long long t = 1;
		for (int i = 0; i < vx->rank - 1; i++)
			t *= vx->dim[i];
		if (t != tokens || vx->dim[0] != logits->dim[0]) {
			elab_error(e, ca->loc, "moe_dispatch input has %lld tokens but the router saw %lld", t, tokens);
			return;
		}
		long long dim[3] = {E, cap, vx->dim[vx->rank - 1]};
		const char *names[3] = {logits->dim_name[logits->rank - 1], NULL, vx->dim_name[vx->rank - 1]};
		y = graph_add_value(g, vx->dtype, 3, dim, names);
	} else {
		if (vx->rank != 3 || vx->dim[0] != E || vx->dim[1] != cap) {
			char s[128];
			shape_text(g, x, s, sizeof s);
			elab_error(e, ca->loc, "moe_combine needs expert outputs [%lld, %lld, D], got %s", E, cap, s);
			return;
		}
		long long dim[MAX_DIMS];
		const char *names[MAX_DIMS];
		for (int i = 0; i < logits->rank - 1; i++) {
			dim[i] = logits->dim[i];
			names[i] = logits->dim_name[i];
		}
		dim[logits->rank - 1] = vx->dim[2];
		names[logits->rank - 1] = vx->dim_name[2];
		y = graph_add_value(g, vx->dtype, logits->rank, dim, names);
	}
	int in[3] = {x, r, idx};
	int o = emit(e, p->op, 3, in, 1, &y, ca->loc);
	g->ops[o].n = cap;
	moe_attributes(&g->ops[o], &g->ops[ro]);
	*out = tensor_val(y);
}

/* moe_aux_loss(route, weight) and moe_z_loss(route, weight): a weighted auxiliary loss of the
 * routing; graph_build adds it to the model's loss */
static void prim_moe_loss(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int r = eval_tensor(e, sc, ca->pos[0]);
	int ro = route_of(e, r, ca->pos[0]->loc, p->name);
	if (ro < 0)
		return;
	double w = num_arg(e, sc, ca, "weight", 1, p->op == OP_MOE_AUX_LOSS ? 0.01 : 0.001);
	if (!(w >= 0)) {
		elab_error(e, ca->loc, "the weight of %s must be 0 or more, not %g", p->name, w);
		return;
	}
	int y = graph_add_value(g, DT_F32, 0, NULL, NULL);
	int in[2] = {g->ops[ro].in[0], g->ops[ro].out[1]};
	int o = emit(e, p->op, 2, in, 1, &y, ca->loc);
	g->ops[o].f = w;
	moe_attributes(&g->ops[o], &g->ops[ro]);
	*out = tensor_val(y);
}

/* sin, cos, exp, log, tanh, sigmoid: one element-wise op with the function's code */
static void prim_unary_fn(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	int x = float_tensor(e, sc, ca->pos[0], p->name);
	if (x < 0)
		return;
	int y = unary(e, OP_UNARY_FN, x, ca->loc);
	e->g->ops[e->g->vals[y].def].n = p->code;
	*out = tensor_val(y);
}

/* sum, mean, max(x, dim, keepdim): over every element, or over dim (max: its argmax an output) */
static void prim_reduce(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = float_tensor(e, sc, ca->pos[0], p->name);
	if (x < 0)
		return;
	const Value *v = &g->vals[x];
	int d = -1;
	Expr *dx = kwarg(ca, "dim", 1);
	if (dx && !dim_arg(e, sc, dx, v->rank, &d))
		return;
	double keep = num_arg(e, sc, ca, "keepdim", 2, 0);
	if (e->failed)
		return;
	long long n = d >= 0 ? v->dim[d] : value_elems(g, x);
	int y;
	if (d < 0 && keep != 0) { /* every dim kept as size 1 */
		long long dim[MAX_DIMS];
		for (int i = 0; i < v->rank; i++)
			dim[i] = 1;
		y = graph_add_value(g, v->dtype, v->rank, dim, NULL);
	} else if (d < 0) {
		y = graph_add_value(g, v->dtype, 0, NULL, NULL);
	} else {
		y = reshaped_like(e, x, d, 1, keep == 0, v->dtype);
	}
	int o;
	if (p->op == OP_MAX_DIM) {
		int arg = new_value_like(e, y, DT_I32);
		g->vals[arg].role = ROLE_INDEX;
		o = emit(e, OP_MAX_DIM, 1, &x, 2, (int[]){y, arg}, ca->loc);
	} else {
		o = emit(e, OP_SUM_DIM, 1, &x, 1, &y, ca->loc);
	}
	g->ops[o].dim = d;
	g->ops[o].f = p->code == 1 ? 1.0 / (double)n : 1.0;
	*out = tensor_val(y);
}

/* mse_loss(x, target) and l1_loss(x, target): the mean over every element */
static void prim_regression_loss(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = float_tensor(e, sc, ca->pos[0], p->name);
	int t = x < 0 ? -1 : float_tensor(e, sc, ca->pos[1], p->name);
	if (t < 0)
		return;
	const Value *vx = &g->vals[x], *vt = &g->vals[t];
	bool same = vx->rank == vt->rank;
	for (int i = 0; same && i < vx->rank; i++)
		same = vx->dim[i] == vt->dim[i];
	if (!same) {
		char s1[128], s2[128];
		shape_text(g, x, s1, sizeof s1);
		shape_text(g, t, s2, sizeof s2);
		elab_error(e, ca->loc, "%s needs an input and a target of one shape, got %s and %s", p->name, s1, s2);
		return;
	}
	int loss = graph_add_value(g, DT_F32, 0, NULL, NULL);
	g->vals[loss].role = ROLE_LOSS;
	int o = emit(e, OP_MSE_LOSS, 2, (int[]){x, t}, 1, &loss, ca->loc);
	g->ops[o].n = p->code;
	g->ops[o].f = 1.0 / (double)value_elems(g, x);
	*out = tensor_val(loss);
}

/* select's and slice's first three arguments: the tensor, its dim, the start (slice: it may be
 * the dim's size) */
static bool narrow_args(Elab *e, Scope *sc, CallArgs *ca, bool slice, int *x, int *d, long long *start)
{
	*x = eval_tensor(e, sc, ca->pos[0]);
	if (*x < 0 || !dim_arg(e, sc, ca->pos[1], e->g->vals[*x].rank, d))
		return false;
	return position_arg(e, sc, ca->pos[2], e->g->vals[*x].dim[*d], slice, start);
}

/* select(x, dim, i): torch.select, the dim dropped */
static void prim_select(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	int x, d;
	long long start;
	if (narrow_args(e, sc, ca, false, &x, &d, &start))
		*out = tensor_val(narrow(e, x, d, start, 1, true, ca->loc));
}

/* slice(x, dim, start, end): rows [start, end) of dim */
static void prim_slice(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	int x, d;
	long long start, end;
	if (!narrow_args(e, sc, ca, true, &x, &d, &start))
		return;
	long long n = e->g->vals[x].dim[d];
	if (!position_arg(e, sc, ca->pos[3], n, true, &end))
		return;
	if (end <= start) {
		elab_error(e, ca->loc, "slice [%lld, %lld) of a dimension of size %lld is empty", start, end, n);
		return;
	}
	*out = tensor_val(narrow(e, x, d, start, end - start, false, ca->loc));
}

/* concat([a, b, ..], dim): 2 to 6 tensors equal in every dim but dim (default: the last) */
static void prim_concat(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	Expr *items[6];
	int n = list_items(e, ca->pos[0], items, 6, p->name), xs[6];
	if (n < 0)
		return;
	if (n < 2) {
		elab_error(e, ca->pos[0]->loc, "concat needs a list of 2 to 6 tensors: concat([a, b], dim)");
		return;
	}
	for (int i = 0; i < n; i++)
		if ((xs[i] = float_tensor(e, sc, items[i], p->name)) < 0)
			return;
	int d = -1;
	Expr *dx = kwarg(ca, "dim", 1);
	if (dx && !dim_arg(e, sc, dx, g->vals[xs[0]].rank, &d))
		return;
	if (!dx)
		d = g->vals[xs[0]].rank - 1;
	long long total = 0;
	for (int i = 0; i < n; i++) {
		const Value *a = &g->vals[xs[0]], *b = &g->vals[xs[i]];
		bool ok = a->rank == b->rank && a->dtype == b->dtype;
		for (int k = 0; ok && k < a->rank; k++)
			ok = k == d || a->dim[k] == b->dim[k];
		if (!ok) {
			char s1[128], s2[128];
			shape_text(g, xs[0], s1, sizeof s1);
			shape_text(g, xs[i], s2, sizeof s2);
			elab_error(e, items[i]->loc, "concat along dim %d needs tensors equal in every other dim, got %s and %s", d,
				   s1, s2);
			return;
		}
		total += b->dim[d];
	}
	int y = reshaped_like(e, xs[0], d, total, false, g->vals[xs[0]].dtype);
	int o = emit(e, OP_CONCAT, n, xs, 1, &y, ca->loc);
	g->ops[o].dim = d;
	*out = tensor_val(y);
}

/* reshape(x, [d0, d1, ..]): one dim may be -1 (inferred) */
static void prim_reshape(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = eval_tensor(e, sc, ca->pos[0]);
	Expr *items[MAX_DIMS];
	int n = x < 0 ? -1 : list_items(e, ca->pos[1], items, MAX_DIMS, p->name);
	if (n < 0)
		return;
	long long dim[MAX_DIMS], known = 1;
	const char *names[MAX_DIMS];
	int infer = -1;
	for (int i = 0; i < n; i++) {
		if (!eval_int(e, sc, items[i], &dim[i], &names[i]))
			return;
		if (dim[i] == -1 && infer < 0) {
			infer = i;
			continue;
		}
		if (dim[i] <= 0) {
			elab_error(e, items[i]->loc, "a reshape dimension is positive (or one -1), not %lld", dim[i]);
			return;
		}
		known *= dim[i];
	}
	long long elems = value_elems(g, x);
	if (infer >= 0 && elems % known == 0) {
		dim[infer] = elems / known;
		names[infer] = NULL;
		known = elems;
	}
	if (known != elems) {
		char s[128];
		shape_text(g, x, s, sizeof s);
		elab_error(e, ca->pos[1]->loc, "cannot reshape %s (%lld elements) to this shape (%lld elements)", s, elems,
			   known);
		return;
	}
	int y = graph_add_value(g, g->vals[x].dtype, n, dim, names);
	emit(e, OP_RESHAPE, 1, &x, 1, &y, ca->loc);
	*out = tensor_val(y);
}

/* transpose(x, d0, d1): the last two as x.T (a view matmuls fold), any other pair swapped */
static void prim_transpose(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = float_tensor(e, sc, ca->pos[0], p->name), d0, d1;
	if (x < 0 || !dim_arg(e, sc, ca->pos[1], g->vals[x].rank, &d0) || !dim_arg(e, sc, ca->pos[2], g->vals[x].rank, &d1))
		return;
	int r = g->vals[x].rank;
	if (d0 == d1) {
		*out = tensor_val(x);
		return;
	}
	if ((d0 == r - 1 && d1 == r - 2) || (d0 == r - 2 && d1 == r - 1)) { /* as x.T: matmuls fold it */
		int y = transpose(e, x, ca->loc);
		if (y >= 0)
			*out = tensor_val(y);
		return;
	}
	int y = new_value_like(e, x, g->vals[x].dtype);
	Value *vy = &g->vals[y];
	const Value *vx = &g->vals[x];
	vy->dim[d0] = vx->dim[d1];
	vy->dim[d1] = vx->dim[d0];
	vy->dim_name[d0] = vx->dim_name[d1];
	vy->dim_name[d1] = vx->dim_name[d0];
	int o = emit(e, OP_SWAP_DIMS, 1, &x, 1, &y, ca->loc);
	g->ops[o].dim = d0;
	g->ops[o].dim2 = d1;
	*out = tensor_val(y);
}

/* repeat_kv(x [.., Hkv, S, Dh], n_rep, dim): each head n_rep times (grouped-query attention) */
static void prim_repeat_kv(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	int x = float_tensor(e, sc, ca->pos[0], p->name);
	long long rep;
	if (x < 0 || !eval_int(e, sc, ca->pos[1], &rep, NULL))
		return;
	int r = g->vals[x].rank, d = r - 3;
	Expr *dx = kwarg(ca, "dim", 2);
	if (dx && !dim_arg(e, sc, dx, r, &d))
		return;
	if (d < 0) {
		elab_error(e, ca->loc, "repeat_kv needs heads [.., Hkv, S, Dh] (after split_heads) or a dim");
		return;
	}
	if (rep < 1) {
		elab_error(e, ca->pos[1]->loc, "repeat_kv needs n_rep >= 1, not %lld", rep);
		return;
	}
	int y = reshaped_like(e, x, d, g->vals[x].dim[d] * rep, false, g->vals[x].dtype);
	int o = emit(e, OP_REPEAT_KV, 1, &x, 1, &y, ca->loc);
	g->ops[o].dim = d;
	g->ops[o].n = rep;
	*out = tensor_val(y);
}

/* rope(x [B, H, S, Dh], theta, pos, rot_dim, heads_first): rotary position embedding */
static void prim_rope(Elab *e, Scope *sc, CallArgs *ca, const Primitive *p, EnvVal *out)
{
	Graph *g = e->g;
	Loc loc = ca->loc;
	int x = float_tensor(e, sc, ca->pos[0], p->name);
	if (x < 0)
		return;
	const Value *v = &g->vals[x];
	if (v->rank != 4) {
		char s[128];
		shape_text(g, x, s, sizeof s);
		elab_error(e, loc, "rope needs heads [B, H, S, Dh] (after split_heads), or [B, S, H, Dh] with heads_first = 0; got %s", s);
		return;
	}
	double theta = num_arg(e, sc, ca, "theta", -1, 10000.0);
	double first = num_arg(e, sc, ca, "heads_first", -1, 1);
	double rot = num_arg(e, sc, ca, "rot_dim", -1, (double)v->dim[3]);
	if (e->failed)
		return;
	if (theta <= 0) {
		elab_error(e, loc, "rope needs theta > 0, not %g", theta);
		return;
	}
	if (rot != floor(rot) || rot < 2 || rot > (double)v->dim[3] || (long long)rot % 2) {
		elab_error(e, loc, "rope's rot_dim = %g must be even and between 2 and the head dim %lld", rot, v->dim[3]);
		return;
	}
	int seq = first != 0 ? 2 : 1;
	int in[2] = {x, -1}, nin = 1;
	Expr *px = kwarg(ca, "pos", -1);
	if (px) {
		int pos = eval_tensor(e, sc, px);
		if (pos < 0)
			return;
		const Value *vp = &g->vals[pos];
		bool ok = vp->dtype == DT_I32 && ((vp->rank == 1 && vp->dim[0] == v->dim[seq]) ||
						   (vp->rank == 2 && vp->dim[0] == v->dim[0] && vp->dim[1] == v->dim[seq]));
		if (!ok) {
			char s[128];
			shape_text(g, pos, s, sizeof s);
			elab_error(e, px->loc, "rope's positions are i32 [S] or [B, S] (S = %lld), not %s %s", v->dim[seq],
				   dtype_name(vp->dtype), s);
			return;
		}
		in[nin++] = pos;
	}
	int y = new_value_like(e, x, v->dtype);
	int o = emit(e, OP_ROPE, nin, in, 1, &y, loc);
	g->ops[o].f = theta;
	g->ops[o].n = (long long)rot;
	g->ops[o].dim = seq;
	g->ops[o].dim2 = first != 0;
	*out = tensor_val(y);
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
static const char *const no_keys[] = {NULL};

/* torch.nn.functional's namesakes; docs/language.md lists them with their signatures */
static const Primitive primitives[] = {
	/* numbers */
	{"dim", prim_dim, 2, 2, no_keys, OP_COUNT, 0},
	{"sqrt", prim_sqrt, 1, 1, no_keys, OP_COUNT, 0},
	/* layers */
	{"embed", prim_embed, 2, 2, no_keys, OP_EMBED, 0},
	{"layer_norm", prim_norm, 3, 3, KEYS("eps"), OP_LAYER_NORM, 0},
	{"rms_norm", prim_norm, 2, 2, KEYS("eps"), OP_RMS_NORM, 0},
	{"dropout", prim_dropout, 1, 2, KEYS("p"), OP_DROPOUT, 0},
	/* activations and element-wise functions */
	{"relu", prim_activation, 1, 1, no_keys, OP_RELU, 0},
	{"silu", prim_activation, 1, 1, no_keys, OP_SILU, 0},
	{"softmax", prim_activation, 1, 1, no_keys, OP_SOFTMAX, 0},
	{"causal_mask", prim_activation, 1, 1, no_keys, OP_CAUSAL_MASK, 0},
	{"gelu", prim_gelu, 1, 1, KEYS("approximate"), OP_GELU, 0},
	{"sin", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_SIN},
	{"cos", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_COS},
	{"exp", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_EXP},
	{"log", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_LOG},
	{"tanh", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_TANH},
	{"sigmoid", prim_unary_fn, 1, 1, no_keys, OP_UNARY_FN, UNARY_SIGMOID},
	/* attention */
	{"split_heads", prim_split_heads, 1, 2, KEYS("heads"), OP_SPLIT_HEADS, 0},
	{"merge_heads", prim_merge_heads, 1, 1, no_keys, OP_MERGE_HEADS, 0},
	{"repeat_kv", prim_repeat_kv, 2, 3, KEYS("dim"), OP_REPEAT_KV, 0},
	{"rope", prim_rope, 1, 1, KEYS("theta", "pos", "rot_dim", "heads_first"), OP_ROPE, 0},
	/* reductions and losses */
	{"sum", prim_reduce, 1, 3, KEYS("dim", "keepdim"), OP_SUM_DIM, 0},
	{"mean", prim_reduce, 1, 3, KEYS("dim", "keepdim"), OP_SUM_DIM, 1},
	{"max", prim_reduce, 1, 3, KEYS("dim", "keepdim"), OP_MAX_DIM, 0},
	{"cross_entropy", prim_cross_entropy, 2, 2, no_keys, OP_CROSS_ENTROPY, 0},
	{"mse_loss", prim_regression_loss, 2, 2, no_keys, OP_MSE_LOSS, 0},
	{"l1_loss", prim_regression_loss, 2, 2, no_keys, OP_MSE_LOSS, 1},
	/* tensor manipulation */
	{"select", prim_select, 3, 3, no_keys, OP_NARROW, 0},
	{"slice", prim_slice, 4, 4, no_keys, OP_NARROW, 0},
	{"concat", prim_concat, 1, 2, KEYS("dim"), OP_CONCAT, 0},
	{"reshape", prim_reshape, 2, 2, no_keys, OP_RESHAPE, 0},
	{"transpose", prim_transpose, 3, 3, no_keys, OP_SWAP_DIMS, 0},
	/* mixture of experts */
	{"moe_router", prim_moe_router, 1, 1, KEYS("top_k", "capacity_factor", "normalize", "dropless"), OP_MOE_ROUTER, 0},
	{"moe_dispatch", prim_moe_route, 2, 2, no_keys, OP_MOE_DISPATCH, 0},
	{"moe_combine", prim_moe_route, 2, 2, no_keys, OP_MOE_COMBINE, 0},
	{"moe_aux_loss", prim_moe_loss, 1, 2, KEYS("weight"), OP_MOE_AUX_LOSS, 0},
	{"moe_z_loss", prim_moe_loss, 1, 2, KEYS("weight"), OP_MOE_Z_LOSS, 0},
};
#undef KEYS

/* name -> its row of primitives[], for the elaborator's lookups */
static SymTab *primitive_index(Arena *a)
{
	SymTab *t = symtab_new(a);
	for (size_t i = 0; i < sizeof primitives / sizeof primitives[0]; i++)
		symtab_put(t, primitives[i].name, (void *)&primitives[i]);
	return t;
}

/* A call of a primitive op. Returns true if name is a primitive (its result, if any, in *out). */
static bool call_primitive(Elab *e, Scope *sc, const char *name, CallArgs *ca, EnvVal *out)
{
	const Primitive *p = symtab_get(e->primitives, name);
	if (!p)
		return false;
	if (check_arity(e, ca, p->name, p->min_args, p->max_args, p->keys))
		p->build(e, sc, ca, p, out);
	return true;
}

static EnvVal call_fn(Elab *e, Scope *caller, Item *fn, Expr *call);

static void gather_args(Elab *e, Expr *call, CallArgs *ca)
{
	memset(ca, 0, sizeof *ca);
	ca->loc = call->loc;
	for (Arg *a = call->args; a; a = a->next) {
		if (a->key) {
			if (ca->nkw == 8) {
				elab_error(e, a->loc, "too many arguments");
				return;
			}
			ca->kw[ca->nkw++] = a;
		} else {
			if (ca->npos == 8) {
				elab_error(e, a->loc, "too many arguments");
				return;
			}
			ca->pos[ca->npos++] = a->value;
		}
	}
}

/* Finds a fn by name from a module: local items first, then `alias.name` through imports. */
static Item *resolve_fn(Elab *e, const Module *from, Expr *callee, const char **display)
{
	if (callee->kind == E_NAME) {
		*display = callee->text;
		for (Item *it = from->items; it; it = it->next)
			if (it->kind == I_FN && !strcmp(it->name, callee->text))
				return it;
		return NULL;
	}
	if (callee->kind == E_MEMBER && callee->lhs && callee->lhs->kind == E_NAME && callee->text) {
		*display = arena_printf(e->a, "%s.%s", callee->lhs->text, callee->text);
		for (Item *it = from->items; it; it = it->next) {
			if (it->kind != I_IMPORT || !it->alias || strcmp(it->alias, callee->lhs->text))
				continue;
			for (Module *m = e->ps->prog->modules; m; m = m->next)
				if (m->import_name && !strcmp(m->import_name, it->name))
					return find_item(e->ps->prog, I_FN, callee->text, m);
		}
	}
	*display = "?";
	return NULL;
}

static EnvVal eval_call(Elab *e, Scope *sc, Expr *x)
{
	EnvVal none = {0};
	Expr *callee = x->lhs;
	if (callee->kind == E_NAME) {
		/* a local fn shadows nothing primitive: primitives are reserved names */
		CallArgs ca;
		gather_args(e, x, &ca);
		if (e->failed)
			return none;
		EnvVal out = {0};
		if (call_primitive(e, sc, callee->text, &ca, &out))
			return out;
	}
	const char *display;
	Item *fn = resolve_fn(e, sc->module, callee, &display);
	if (!fn) {
		elab_error(e, callee->loc, "unknown function '%s'", display);
		return none;
	}
	return call_fn(e, sc, fn, x);
}

static EnvVal operands_error(Elab *e, const Expr *x)
{
	elab_error(e, x->loc, "operator '%c' cannot combine these operands", x->op == 'A' ? '>' : x->op);
	return (EnvVal){0};
}

/* a op b on two integers (+ - * / %): exact, or an error */
static EnvVal int_binary(Elab *e, const Expr *x, long long a, long long b)
{
	EnvVal none = {0};
	long long r;
	bool inexact;
	if ((x->op == '/' || x->op == '%') && b == 0) {
		elab_error(e, x->loc, x->op == '/' ? "division by zero" : "'%%' needs a non-zero integer divisor");
		return none;
	}
	if (!int_arith(x->op, a, b, &r, &inexact)) {
		elab_error(e, x->loc, "integer overflow: %lld %c %lld is beyond 2^63 - 1", a, x->op, b);
		return none;
	}
	if (inexact) {
		elab_error(e, x->loc, "%lld is not divisible by %lld", a, b);
		return none;
	}
	return int_val(r, NULL);
}

/* a op b on two numbers, one of them a float */
static EnvVal num_binary(Elab *e, const Expr *x, double a, double b)
{
	EnvVal none = {0};
	switch (x->op) {
	case '+':
		return num_val(a + b, false, NULL);
	case '-':
		return num_val(a - b, false, NULL);
	case '*':
		return num_val(a * b, false, NULL);
	case '/':
		if (b == 0) {
			elab_error(e, x->loc, "division by zero");
			return none;
		}
		return num_val(a / b, false, NULL);
	case '%':
		elab_error(e, x->loc, "'%%' needs a non-zero integer divisor");
		return none;
	case '@':
		elab_error(e, x->loc, "'@' needs tensors, not numbers");
		return none;
	}
	return operands_error(e, x);
}

/* a @ b, or a op b element-wise with broadcasting */
static EnvVal tensor_binary(Elab *e, const Expr *x, int a, int b)
{
	int y = -1;
	switch (x->op) {
	case '@':
		y = matmul(e, a, b, x->loc);
		break;
	case '+':
		y = binary(e, OP_ADD, a, b, x->loc, "+");
		break;
	case '-':
		y = binary(e, OP_SUB, a, b, x->loc, "-");
		break;
	case '*':
		y = binary(e, OP_MUL, a, b, x->loc, "*");
		break;
	case '/':
		y = binary(e, OP_DIV, a, b, x->loc, "/");
		break;
	default:
		elab_error(e, x->loc, "'%%' is not defined on tensors");
		break;
	}
	return y < 0 ? (EnvVal){0} : tensor_val(y);
}

/* tensor * number, number * tensor, tensor / number: the tensor scaled */
static EnvVal scale_tensor(Elab *e, const Expr *x, int t, double f)
{
	if (x->op == '/') {
		if (f == 0) {
			elab_error(e, x->loc, "division by zero");
			return (EnvVal){0};
		}
		f = 1 / f;
	}
	if (f == 1) { /* x * 1 is x, bit for bit (signed zeros, infinities and NaNs too): no copy loop */
		e->folded++;
		return tensor_val(t);
	}
	int y = unary(e, OP_SCALE, t, x->loc);
	e->g->ops[e->g->vals[y].def].f = f;
	return tensor_val(y);
}

static EnvVal eval_binary(Elab *e, Scope *sc, Expr *x)
{
	EnvVal none = {0};
	if (x->op == ':' || x->op == 'A' || x->op == 'R') {
		elab_error(e, x->loc, "this expression is only valid in plan statements");
		return none;
	}
	EnvVal a = eval(e, sc, x->lhs);
	EnvVal b = eval(e, sc, x->rhs);
	if (e->failed)
		return none;
	if (a.kind == EV_NUM && b.kind == EV_NUM && a.is_int && b.is_int && x->op != '@')
		return int_binary(e, x, a.inum, b.inum);
	if (a.kind == EV_NUM && b.kind == EV_NUM)
		return num_binary(e, x, a.num, b.num);
	if (a.kind == EV_TENSOR && b.kind == EV_TENSOR)
		return tensor_binary(e, x, a.tensor, b.tensor);
	if ((a.kind == EV_TENSOR && b.kind == EV_NUM && (x->op == '*' || x->op == '/')) ||
	    (a.kind == EV_NUM && b.kind == EV_TENSOR && x->op == '*'))
		return scale_tensor(e, x, a.kind == EV_TENSOR ? a.tensor : b.tensor, a.kind == EV_NUM ? a.num : b.num);
	if (a.kind == EV_TENSOR && b.kind == EV_NUM && x->op == '-') {
		elab_error(e, x->loc, "adding a number to a tensor is not supported; use a parameter");
		return none;
	}
	return operands_error(e, x);
}

static EnvVal eval_neg(Elab *e, Scope *sc, Expr *x)
{
	EnvVal none = {0};
	EnvVal v = eval(e, sc, x->lhs);
	if (e->failed)
		return none;
	if (v.kind == EV_NUM && v.is_int) {
		if (v.inum == LLONG_MIN) {
			elab_error(e, x->loc, "integer overflow: -(%lld) is beyond 2^63 - 1", v.inum);
			return none;
		}
		return int_val(-v.inum, NULL);
	}
	if (v.kind == EV_NUM)
		return num_val(-v.num, false, NULL);
	if (v.kind == EV_TENSOR)
		return tensor_val(unary(e, OP_NEG, v.tensor, x->loc));
	elab_error(e, x->loc, "cannot negate this");
	return none;
}

/* x.T; other members (module.fn) are only called */
static EnvVal eval_member(Elab *e, Scope *sc, Expr *x)
{
	EnvVal none = {0};
	if (x->text && !strcmp(x->text, "T")) {
		EnvVal v = eval(e, sc, x->lhs);
		if (e->failed)
			return none;
		if (v.kind != EV_TENSOR) {
			elab_error(e, x->loc, "'.T' needs a tensor");
			return none;
		}
		int y = transpose(e, v.tensor, x->loc);
		return y < 0 ? none : tensor_val(y);
	}
	elab_error(e, x->loc, "a module member can only be called");
	return none;
}

static EnvVal eval(Elab *e, Scope *sc, Expr *x)
{
	EnvVal none = {0};
	if (e->failed)
		return none;
	switch (x->kind) {
	case E_INT:
		return int_val(x->ival, NULL);
	case E_FLOAT:
	case E_SIZE:
		return num_val(x->fval, false, NULL);
	case E_STRING: {
		EnvVal v = {.kind = EV_STR, .str = x->text};
		return v;
	}
	case E_NAME: {
		Binding *b = lookup(sc, x->text);
		if (!b) {
			elab_error(e, x->loc, "unknown name '%s'", x->text);
			return none;
		}
		return b->val;
	}
	case E_NEG:
		return eval_neg(e, sc, x);
	case E_BINARY:
		return eval_binary(e, sc, x);
	case E_MEMBER:
		return eval_member(e, sc, x);
	case E_CALL:
		return eval_call(e, sc, x);
	case E_INDEX: {
		int y = index_tensor(e, sc, x);
		return y < 0 ? none : tensor_val(y);
	}
	default:
		elab_error(e, x->loc, "this %s cannot be used in a model body", expr_kind_name(x->kind));
		return none;
	}
}

static bool dtype_from_name(const char *s, DType *t)
{
	static const struct {
		const char *n;
		DType t;
	} names[] = {{"f32", DT_F32}, {"bf16", DT_BF16}, {"f16", DT_F16}, {"i32", DT_I32}};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(s, names[i].n)) {
			*t = names[i].t;
			return true;
		}
	return false;
}

static bool eval_dims(Elab *e, Scope *sc, Stmt *s, int *rank, long long *dim, const char **names)
{
	int r = 0;
	for (Expr *d = s->dims; d; d = d->next) {
		if (r == MAX_DIMS) {
			elab_error(e, d->loc, "at most %d dimensions", MAX_DIMS);
			return false;
		}
		long long n;
		const char *nm;
		if (!eval_int(e, sc, d, &n, &nm))
			return false;
		if (n <= 0) {
			elab_error(e, d->loc, "dimension must be positive, got %lld", n);
			return false;
		}
		dim[r] = n;
		names[r] = nm;
		if (!nm && d->kind == E_NAME)
			names[r] = d->text;
		r++;
	}
	*rank = r;
	return true;
}

static const char *scope_join(Elab *e, const char *path, const char *name)
{
	return *path ? arena_printf(e->a, "%s.%s", path, name) : name;
}

static void exec_body(Elab *e, Scope *sc, Stmt *body, bool top_level);

static void exec_stmt(Elab *e, Scope *sc, Stmt *s, bool top_level)
{
	Graph *g = e->g;
	switch (s->kind) {
	case S_INPUT:
	case S_PARAM: {
		DType t;
		if (!dtype_from_name(s->dtype, &t)) {
			elab_error(e, s->dtype_loc, "unknown dtype '%s'", s->dtype);
			return;
		}
		int rank;
		long long dim[MAX_DIMS];
		const char *names[MAX_DIMS];
		if (!eval_dims(e, sc, s, &rank, dim, names))
			return;
		if (s->kind == S_INPUT) {
			if (is_float(t))
				t = e->act_dtype;
			int v = graph_add_value(g, t, rank, dim, names);
			g->vals[v].role = ROLE_INPUT;
			g->vals[v].name = s->name;
			emit(e, OP_INPUT, 0, NULL, 1, &v, s->loc);
		} else {
			if (!is_float(t)) {
				elab_error(e, s->dtype_loc, "parameters must be floating point, not %s", s->dtype);
				return;
			}
			int v = graph_add_value(g, e->ps->param_dtype, rank, dim, names);
			Value *pv = &g->vals[v];
			pv->role = ROLE_PARAM;
			pv->buffer = pv->frozen = s->buffer;
			pv->name = scope_join(e, sc->path, s->name);
			pv->init_kind = INIT_NORMAL;
			pv->init_a = 0;
			pv->init_b = 0.02;
			if (s->init) {
				Expr *in = s->init;
				const char *iname = in->kind == E_NAME ? in->text : in->kind == E_CALL && in->lhs->kind == E_NAME ? in->lhs->text : NULL;
				double args[2] = {0, 0};
				int nargs = 0;
				if (in->kind == E_CALL)
					for (Arg *a = in->args; a && nargs < 2; a = a->next) {
						EnvVal av = eval(e, sc, a->value);
						if (e->failed)
							return;
						if (av.kind != EV_NUM) {
							elab_error(e, a->value->loc, "initializer arguments must be numbers");
							return;
						}
						args[nargs++] = av.num;
					}
				static const struct {
					const char *name;
					int nargs;
					bool buffer_only;
				} inits[] = {[INIT_NORMAL] = {"normal", 2, false},    [INIT_UNIFORM] = {"uniform", 2, false},
					     [INIT_ZEROS] = {"zeros", 0, false},      [INIT_ONES] = {"ones", 0, false},
					     [INIT_ARANGE] = {"arange", 0, true},     [INIT_ROPE_COS] = {"rope_cos", 1, true},
					     [INIT_ROPE_SIN] = {"rope_sin", 1, true}, [INIT_LOAD] = {"load", 0, true}};
				int kind = -1;
				for (int i = 0; i < (int)(sizeof inits / sizeof inits[0]); i++)
					if (iname && !strcmp(iname, inits[i].name) && nargs == inits[i].nargs &&
					    (s->buffer || !inits[i].buffer_only))
						kind = i;
				if (kind == INIT_ROPE_COS || kind == INIT_ROPE_SIN) { /* tables [.., Dh]: Dh even, theta positive */
					if (pv->dim[pv->rank - 1] % 2 || args[0] <= 0) {
						elab_error(e, in->loc, "%s needs an even last dim and theta > 0", iname);
						return;
					}
				}
				if (kind >= 0) {
					pv->init_kind = (InitKind)kind;
				} else {
					elab_error(e, in->loc, "unknown initializer; use normal(mean, std), uniform(lo, hi), zeros or ones");
					return;
				}
				pv->init_a = args[0];
				pv->init_b = args[1];
			}
			emit(e, OP_PARAM, 0, NULL, 1, &v, s->loc);
		}
		bind(e, sc, s->name, tensor_val(g->nvals - 1));
		return;
	}
	case S_ASSIGN: {
		EnvVal v = eval(e, sc, s->value);
		if (e->failed)
			return;
		if (v.kind == EV_TENSOR && !g->vals[v.tensor].name)
			g->vals[v.tensor].name = s->name;
		bind(e, sc, s->name, v);
		return;
	}
	case S_RETURN:
		sc->ret = eval(e, sc, s->value);
		sc->returned = true;
		return;
	case S_REPEAT: {
		long long n;
		if (!eval_int(e, sc, s->value, &n, NULL))
			return;
		if (n < 1 || n > graph_max_repeat) {
			elab_error(e, s->value->loc, "repeat count must be between 1 and %lld, got %lld", graph_max_repeat, n);
			return;
		}
		bool outer = e->repeat_depth == 0 && top_level;
		if (outer) {
			if (g->nlayers) {
				elab_error(e, s->loc, "a model may have only one top-level repeat (its layers)");
				return;
			}
			g->nlayers = (int)n;
		}
		e->repeat_depth++;
		const char *saved_path = sc->path;
		const char *saved_scope = e->op_scope;
		CallCounter *saved_counters = sc->counters;
		for (long long i = 0; i < n && !e->failed; i++) {
			if (outer)
				e->layer = (int)i;
			sc->path = arena_printf(e->a, "%s%slayers.%lld", saved_path, *saved_path ? "." : "", i);
			e->op_scope = sc->path;
			sc->counters = NULL;
			exec_body(e, sc, s->body, false);
		}
		sc->path = saved_path;
		sc->counters = saved_counters;
		e->op_scope = saved_scope;
		if (outer)
			e->layer = -1;
		e->repeat_depth--;
		return;
	}
	}
}

static void exec_body(Elab *e, Scope *sc, Stmt *body, bool top_level)
{
	for (Stmt *s = body; s && !e->failed && !sc->returned; s = s->next) {
		const Source *saved = e->src;
		exec_stmt(e, sc, s, top_level);
		e->src = saved;
	}
}

static EnvVal call_fn(Elab *e, Scope *caller, Item *fn, Expr *call)
{
	EnvVal none = {0};
	if (e->depth >= 64) {
		elab_error(e, call->loc, "calls nested more than 64 deep (recursion?)");
		return none;
	}
	Scope sc = {0};
	sc.module = fn->module;
	/* bind arguments: positional in order, then keywords, then defaults */
	int npar = 0;
	for (Param *p = fn->params; p; p = p->next)
		npar++;
	int pi = 0;
	for (Arg *a = call->args; a; a = a->next) {
		Param *target = NULL;
		if (a->key) {
			for (Param *p = fn->params; p; p = p->next)
				if (!strcmp(p->name, a->key))
					target = p;
			if (!target) {
				elab_error(e, a->key_loc, "'%s' has no parameter '%s'", fn->name, a->key);
				return none;
			}
		} else {
			int k = 0;
			for (Param *p = fn->params; p; p = p->next, k++)
				if (k == pi)
					target = p;
			pi++;
			if (!target) {
				elab_error(e, a->loc, "too many arguments to '%s' (it takes %d)", fn->name, npar);
				return none;
			}
		}
		EnvVal v = eval(e, caller, a->value);
		if (e->failed)
			return none;
		bind(e, &sc, target->name, v);
	}
	for (Param *p = fn->params; p; p = p->next) {
		if (lookup(&sc, p->name))
			continue;
		if (!p->def) {
			elab_error(e, call->loc, "missing argument '%s' in call to '%s'", p->name, fn->name);
			return none;
		}
		const Source *saved = e->src;
		e->src = &fn->module->src;
		EnvVal v = eval(e, &sc, p->def);
		e->src = saved;
		if (e->failed)
			return none;
		bind(e, &sc, p->name, v);
	}
	/* name the call's scope: the fn name, with _k for the k-th repeated call in the caller */
	int count = 0;
	CallCounter *c;
	for (c = caller->counters; c; c = c->next)
		if (!strcmp(c->fn, fn->name))
			break;
	if (!c) {
		c = arena_alloc(e->a, sizeof *c);
		c->fn = fn->name;
		c->next = caller->counters;
		caller->counters = c;
	}
	count = c->count++;
	const char *seg = count ? arena_printf(e->a, "%s_%d", fn->name, count) : fn->name;
	sc.path = scope_join(e, caller->path, seg);

	e->stack[e->depth].src = e->src;
	e->stack[e->depth].loc = call->loc;
	e->stack[e->depth].fn = fn->name;
	e->depth++;
	bool saved_rc = e->in_recompute;
	for (Decorator *d = fn->decorators; d; d = d->next)
		if (!strcmp(d->name, "recompute"))
			e->in_recompute = true;
	const char *saved_scope = e->op_scope;
	const Source *saved_src = e->src;
	e->op_scope = sc.path;
	e->src = &fn->module->src;
	exec_body(e, &sc, fn->body, false);
	e->src = saved_src;
	e->op_scope = saved_scope;
	e->in_recompute = saved_rc;
	e->depth--;
	if (e->failed)
		return none;
	if (!sc.returned) {
		elab_error(e, fn->name_loc, "fn '%s' ends without 'return'", fn->name);
		return none;
	}
	return sc.ret;
}

Graph *graph_build(PlanSpec *ps)
{
	Arena *a = ps->prog->arena;
	Graph *g = arena_alloc(a, sizeof *g);
	g->arena = a;
	g->ps = ps;
	g->loss = -1;
	g->zero = (ZeroSharding){.stage = 0, .axis = -1, .size = 1};
	g->sync.axis = -1;
	g->logits = -1;
	g->position = -1;
	Elab e = {0};
	e.g = g;
	e.ps = ps;
	e.a = a;
	e.layer = -1;
	e.src = &ps->model->module->src;
	e.act_dtype = ps->param_dtype;
	e.op_scope = "";
	e.primitives = primitive_index(a);
	Scope sc = {0};
	sc.path = "";
	sc.module = ps->model->module;
	for (int i = 0; i < ps->nhypers; i++)
		bind(&e, &sc, ps->hypers[i].name,
		     ps->hypers[i].is_int ? int_val(ps->hypers[i].ival, ps->hypers[i].name)
					  : num_val(ps->hypers[i].value, false, ps->hypers[i].name));
	if (ps->batch_dim) {
		long long mb = ps->batch / (ps->micro_batches ? ps->micro_batches : 1);
		bind(&e, &sc, ps->batch_dim, int_val(mb, ps->batch_dim));
	}
	exec_body(&e, &sc, ps->model->body, true);
	if (e.failed)
		return NULL;
	Binding *loss = lookup(&sc, "loss");
	if (!loss || loss->val.kind != EV_TENSOR || g->vals[loss->val.tensor].rank != 0) {
		/* at the (last top-level) assignment of loss, where the fix goes */
		const Stmt *at = NULL;
		for (const Stmt *s = ps->model->body; s; s = s->next)
			if (s->kind == S_ASSIGN && !strcmp(s->name, "loss"))
				at = s;
		if (at && loss && loss->val.kind == EV_TENSOR) {
			char shape[128];
			shape_text(g, loss->val.tensor, shape, sizeof shape);
			diag_error(&ps->model->module->src, at->value->loc, "'loss' must be a scalar, not a tensor of shape %s",
				   shape);
			diag_note_plain("reduce it: mean(x), sum(x), or a loss such as cross_entropy or mse_loss");
		} else if (at) {
			diag_error(&ps->model->module->src, at->value->loc, "'loss' must be a scalar tensor, not a number");
		} else {
			diag_error(&ps->model->module->src, ps->model->name_loc, "model '%s' must assign a scalar 'loss'",
				   ps->model->name);
		}
		return NULL;
	}
	g->loss = loss->val.tensor;
	/* `freeze` in the plan: those parameters do not train */
	for (int r = 0; r < ps->nfreeze; r++) {
		FreezeRule *f = &ps->freeze[r];
		for (int i = 0; i < g->nops; i++) {
			Value *v = &g->vals[g->ops[i].out[0]];
			if (g->ops[i].kind == OP_PARAM && param_pattern_match(f->pattern, v->name)) {
				v->frozen = true;
				f->used = true;
			}
		}
		if (!f->used) {
			unmatched_pattern(g, "freeze pattern", f->pattern, f->src, f->loc, NULL);
			return NULL;
		}
	}
	/* sums of sizes fit too: one step's tensors, every micro-batch's, stay below 2^60 bytes
	 * (backward values, gradients and optimizer states are a few times that at most) */
	long long held = 0, m = ps->micro_batches > 0 ? ps->micro_batches : 1;
	for (int v = 0; v < g->nvals; v++) {
		long long b;
		if (!shape_bytes(&g->vals[v], &b) || __builtin_add_overflow(held, b, &held) || held > MAX_TENSOR_BYTES / m) {
			diag_error(&ps->model->module->src, ps->model->name_loc,
				   "model '%s' holds more than 2^60 bytes (1 EiB) of tensors in one step of plan '%s'", ps->model->name,
				   ps->plan->name);
			diag_note_plain("planc computes sizes as exact 64-bit integers; make the model smaller");
			return NULL;
		}
	}
	/* MoE auxiliary losses (moe_aux_loss, moe_z_loss: already times their weight, which the model
	 * sets) join the model's loss: a fn returns one value, so they are not threaded through it. */
	int nops = g->nops;
	for (int i = 0; i < nops; i++) {
		if (g->ops[i].kind != OP_MOE_AUX_LOSS && g->ops[i].kind != OP_MOE_Z_LOSS)
			continue;
		for (int j = 0; j < nops; j++) /* used in an expression (or as the loss), it would count twice */
			for (int k = 0; k < g->ops[j].nin + (j == i); k++)
				if ((k == g->ops[j].nin ? g->loss : g->ops[j].in[k]) == g->ops[i].out[0] && g->ops[j].src) {
					const char *what = g->ops[i].kind == OP_MOE_AUX_LOSS ? "moe_aux_loss" : "moe_z_loss";
					diag_error(g->ops[j].src, g->ops[j].loc, "%s's value is used in an expression", what);
					diag_note_plain("the compiler adds every %s (times its weight) to the model's loss by itself: "
							"write aux = %s(route, weight = ..) and leave the value unused", what, what);
					return NULL;
				}
		int total = graph_add_value(g, DT_F32, 0, NULL, NULL);
		int in[2] = {g->loss, g->ops[i].out[0]};
		int o = graph_add_op(g, OP_ADD, 2, in, 1, &total);
		g->ops[o].loc = g->ops[i].loc;
		g->ops[o].src = g->ops[i].src;
		g->ops[o].scope = g->ops[i].scope;
		g->vals[total].role = ROLE_LOSS;
		g->loss = total;
	}
	return g;
}
