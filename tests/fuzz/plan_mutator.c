/* plan_mutator.c: libFuzzer's custom mutator for the plan language, linked into every harness, so
 * that most inputs get past the parser and reach sema and the passes behind it.
 *
 * An input that parses is mutated as a syntax tree and printed back with fmt (whose output
 * always parses to the same tree: fuzz_frontend checks that). The mutations follow the grammar of
 * grammar/parser.y: an expression (`expr`: numbers, sizes, strings, names, binary operators, calls,
 * members, indexing, tuples, lists, ranges) is replaced by one derived from the grammar, by another
 * subtree of the input, or by an interesting number (0, 1, a power of two, one past it, a huge
 * value); a number is nudged; a statement (`model_stmt`, `plan_stmt`) is deleted, duplicated,
 * moved or derived afresh; a name, a plan statement's word or an argument's key is swapped for
 * another name of the input or of the language's vocabulary (plan words, ops, initialisers, sync
 * modes); an argument is dropped, duplicated or derived. Crossover splices an item or a plan
 * statement of one input into another. An input that does not parse is replaced, one time in two,
 * by a module derived from the grammar alone (a model and a plan of derived statements), else it
 * goes to libFuzzer's own byte mutations (so the lexer's and parser's error paths stay covered),
 * as one input in eight that does parse also goes. */
#include "front/front.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomCrossOver(const uint8_t *data1, size_t size1, const uint8_t *data2, size_t size2, uint8_t *out,
				 size_t max_out_size, unsigned int seed);

/* ---------------------------------------------------------------- randomness */

typedef struct Rng {
	uint64_t s;
} Rng;

static uint64_t rnd(Rng *r) /* splitmix64 */
{
	uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static int below(Rng *r, int n)
{
	return n > 0 ? (int)(rnd(r) % (uint64_t)n) : 0;
}

/* ---------------------------------------------------------------- the vocabulary */

/* words the plan language gives meaning to (sema.c, graph.c's op table, stdlib/nn.plan), none a
 * keyword of the lexer, so each is an IDENT */
static const char *const vocabulary[] = {
	"mesh", "batch", "shard", "use", "pipeline", "stage", "zero", "offload", "recompute", "precision", "optimizer",
	"sync", "freeze", "data", "tensor", "pipe", "expert", "B", "S", "D", "H", "L", "V", "F", "micro_batches",
	"stages", "chunks", "balance", "schedule", "gpipe", "1f1b", "interleaved", "flops", "params", "selective",
	"full", "bf16", "fp16", "f32", "f16", "i32", "master", "loss_scale", "dynamic", "adamw", "adam", "sgd",
	"momentum", "lr", "betas", "weight_decay", "clip", "warmup", "cosine", "min_lr", "total", "strict",
	"local_sgd", "async", "every", "staleness", "outer", "nesterov", "bucket", "overlap", "compress", "topk",
	"powersgd", "rank", "error_feedback", "host", "disk", "activations", "normal", "uniform", "zeros", "ones",
	"constant", "arange", "embed", "relu", "gelu", "silu", "softmax", "sigmoid", "tanh", "exp", "log", "sqrt",
	"mean", "sum", "max", "cross_entropy", "mse_loss", "dropout", "layer_norm", "rms_norm", "rope", "concat",
	"slice", "reshape", "transpose", "split_heads", "merge_heads", "repeat_kv", "causal_mask", "moe_router",
	"moe_dispatch", "moe_combine", "moe_aux_loss", "moe_z_loss", "experts", "top_k", "capacity_factor", "nn",
	"std", "linear", "mlp", "attention", "block", "layernorm", "megatron", "sequence_parallel", "ulysses",
	"llama_block", "moe", "T", "p", "eps", "heads", "ffn", "dim", "true", "false", "none", "_",
};
enum { NVOCAB = sizeof vocabulary / sizeof vocabulary[0] };

static const long long interesting[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 32, 64, 100, 127, 128, 255, 256,
					1000, 1024, 4096, 65535, 65536, 1 << 20, 2147483647LL, 2147483648LL,
					4294967296LL, 1LL << 40, 1LL << 53, 1LL << 62, 9223372036854775807LL};
static const char *const floats[] = {"0.0", "0.5", "1.0", "0.02", "3e-4", "1e-5", "1e30", "1e308", "2.5e-8", "0.999"};
static const char *const sizes[] = {"0B", "1B", "1KiB", "1MiB", "25MiB", "1GiB", "1TiB", "1.5GB", "3MB"};

/* ---------------------------------------------------------------- the tree's pieces */

typedef struct Pools {
	Arena *a;
	Rng *r;
	const char **names; /* identifiers of the input, then the vocabulary */
	int nnames, capnames;
	Expr **exprs; /* every expression (donors) */
	int nexprs, capexprs;
	Expr ***eslots; /* the places an expression hangs from */
	int neslots, capeslots;
	Stmt ***slists; /* the heads of statement lists */
	int nslists, capslists;
	PlanStmt ***plists; /* the heads of plan statement lists */
	int nplists, capplists;
	Arg ***alists; /* the heads of argument lists */
	int nalists, capalists;
	const char **nameslots[64]; /* names that can be renamed (a sample) */
	int nnameslots;
} Pools;

#define PUSH(arr, n, cap, x)                                                                  \
	do {                                                                                  \
		if ((n) == (cap)) {                                                           \
			int c2_ = (cap) ? 2 * (cap) : 32;                                     \
			void *g_ = realloc((arr), sizeof *(arr) * (size_t)c2_);                \
			if (!g_)                                                              \
				abort();                                                      \
			(arr) = g_;                                                           \
			(cap) = c2_;                                                          \
		}                                                                             \
		(arr)[(n)++] = (x);                                                           \
	} while (0)

static void add_name(Pools *P, const char *s)
{
	if (s && *s)
		PUSH(P->names, P->nnames, P->capnames, s);
}

static void name_slot(Pools *P, const char **slot)
{
	if (!*slot)
		return;
	if (P->nnameslots < 64)
		P->nameslots[P->nnameslots++] = slot;
	else
		P->nameslots[below(P->r, 64)] = slot; /* a sample of them all */
}

static void walk_args(Pools *P, Arg **head);

static void walk_expr(Pools *P, Expr **slot)
{
	Expr *e = *slot;
	if (!e)
		return;
	PUSH(P->eslots, P->neslots, P->capeslots, slot);
	PUSH(P->exprs, P->nexprs, P->capexprs, e);
	if (e->kind == E_NAME) {
		add_name(P, e->text);
		name_slot(P, &e->text);
	}
	if (e->kind == E_MEMBER && e->text)
		add_name(P, e->text);
	if (e->lhs)
		walk_expr(P, &e->lhs);
	if (e->rhs && e->kind != E_MEMBER)
		for (Expr **i = &e->rhs; *i; i = &(*i)->next)
			walk_expr(P, i);
	if (e->kind == E_CALL)
		walk_args(P, &e->args);
	for (Expr **i = &e->items; *i; i = &(*i)->next)
		walk_expr(P, i);
}

static void walk_args(Pools *P, Arg **head)
{
	PUSH(P->alists, P->nalists, P->capalists, head);
	for (Arg *a = *head; a; a = a->next) {
		if (a->key && strcmp(a->key, "over")) {
			add_name(P, a->key);
			name_slot(P, &a->key);
		}
		walk_expr(P, &a->value);
	}
}

static void walk_stmts(Pools *P, Stmt **head)
{
	PUSH(P->slists, P->nslists, P->capslists, head);
	for (Stmt *s = *head; s; s = s->next) {
		add_name(P, s->name);
		if (s->kind == S_ASSIGN)
			name_slot(P, &s->name);
		for (Expr **d = &s->dims; *d; d = &(*d)->next)
			walk_expr(P, d);
		walk_expr(P, &s->init);
		walk_expr(P, &s->value);
		if (s->kind == S_REPEAT)
			walk_stmts(P, &s->body);
	}
}

static void walk_pstmts(Pools *P, PlanStmt **head)
{
	PUSH(P->plists, P->nplists, P->capplists, head);
	for (PlanStmt *s = *head; s; s = s->next) {
		add_name(P, s->word);
		name_slot(P, &s->word);
		walk_args(P, &s->args);
		if (s->body)
			walk_pstmts(P, &s->body);
	}
}

static void walk_module(Pools *P, Module *m)
{
	for (Item *it = m->items; it; it = it->next) {
		add_name(P, it->kind == I_IMPORT ? it->alias : it->name); /* "std.nn" is no identifier */
		add_name(P, it->for_model);
		for (Param *p = it->params; p; p = p->next) {
			add_name(P, p->name);
			walk_expr(P, &p->def);
		}
		if (it->kind == I_MODEL || it->kind == I_FN)
			walk_stmts(P, &it->body);
		if (it->kind == I_PLAN || it->kind == I_STRATEGY)
			walk_pstmts(P, &it->rules);
		if (it->kind == I_PLAN)
			walk_args(P, &it->model_args);
	}
	for (int i = 0; i < NVOCAB; i++)
		add_name(P, vocabulary[i]);
}

static void pools_free(Pools *P)
{
	free(P->names);
	free(P->exprs);
	free(P->eslots);
	free(P->slists);
	free(P->plists);
	free(P->alists);
}

/* ---------------------------------------------------------------- deriving from the grammar */

static const char *any_name(Pools *P)
{
	return P->nnames ? P->names[below(P->r, P->nnames)] : "x";
}

static Expr *node(Pools *P, ExprKind k)
{
	Expr *e = expr_new(P->a, k, (Loc){0, 0});
	return e;
}

static Expr *number(Pools *P)
{
	Expr *e;
	switch (below(P->r, 6)) {
	case 0:
		e = node(P, E_FLOAT);
		e->text = floats[below(P->r, (int)(sizeof floats / sizeof *floats))];
		e->fval = strtod(e->text, NULL);
		return e;
	case 1:
		e = node(P, E_SIZE);
		e->text = sizes[below(P->r, (int)(sizeof sizes / sizeof *sizes))];
		return e;
	default:
		e = node(P, E_INT);
		e->ival = interesting[below(P->r, (int)(sizeof interesting / sizeof *interesting))];
		return e;
	}
}

static Expr *derive_expr(Pools *P, int depth);

static Arg *copy_args(Pools *P, const Arg *a, int depth);

/* a copy of a subtree of the input (a shared one could become its own ancestor), cut at depth 8 */
static Expr *copy_expr(Pools *P, const Expr *e, int depth)
{
	if (!e)
		return NULL;
	if (depth > 8)
		return number(P);
	Expr *c = arena_alloc(P->a, sizeof *c);
	*c = *e;
	c->next = NULL;
	c->lhs = copy_expr(P, e->lhs, depth + 1);
	if (e->kind == E_INDEX) {
		Expr **tail = &c->rhs;
		for (const Expr *i = e->rhs; i; i = i->next, tail = &(*tail)->next)
			*tail = copy_expr(P, i, depth + 1);
	} else {
		c->rhs = copy_expr(P, e->rhs, depth + 1);
	}
	c->args = copy_args(P, e->args, depth + 1);
	Expr **tail = &c->items;
	for (const Expr *i = e->items; i; i = i->next, tail = &(*tail)->next)
		*tail = copy_expr(P, i, depth + 1);
	return c;
}

static Arg *copy_args(Pools *P, const Arg *a, int depth)
{
	Arg *head = NULL, **tail = &head;
	for (; a; a = a->next, tail = &(*tail)->next) {
		*tail = arg_new(P->a, a->key, a->key_loc, copy_expr(P, a->value, depth), a->loc);
	}
	return head;
}

static Arg *derive_args(Pools *P, int depth, bool plan)
{
	Arg *head = NULL, **tail = &head;
	int n = below(P->r, plan ? 3 : 4) + (plan ? 1 : 0);
	for (int i = 0; i < n; i++) {
		const char *key = below(P->r, 2) ? any_name(P) : NULL;
		Expr *v = derive_expr(P, depth + 1);
		if (plan && !key && below(P->r, 3) == 0) { /* `a -> b` or `a : b` */
			Expr *b = node(P, E_BINARY);
			b->op = below(P->r, 2) ? 'A' : ':';
			b->lhs = v;
			b->rhs = derive_expr(P, depth + 1);
			v = b;
		}
		if (plan && !key && below(P->r, 8) == 0) { /* `over AXIS` */
			key = "over";
			v = node(P, E_NAME);
			v->text = any_name(P);
		}
		*tail = arg_new(P->a, key, (Loc){0, 0}, v, (Loc){0, 0});
		tail = &(*tail)->next;
	}
	return head;
}

static Expr *derive_list(Pools *P, int depth, int most)
{
	Expr *head = NULL, **tail = &head;
	for (int i = 0, n = below(P->r, most + 1); i < n; i++) {
		*tail = derive_expr(P, depth + 1);
		tail = &(*tail)->next;
	}
	return head;
}

/* expr: one derivation of the grammar's `expr`, at most about 4 levels deep */
static Expr *derive_expr(Pools *P, int depth)
{
	int pick = depth >= 3 ? below(P->r, 3) : below(P->r, 13);
	Expr *e;
	switch (pick) {
	case 0: return number(P);
	case 1:
		e = node(P, E_NAME);
		e->text = any_name(P);
		return e;
	case 2:
		if (P->nexprs) /* a subtree of the input */
			return copy_expr(P, P->exprs[below(P->r, P->nexprs)], depth);
		return number(P);
	case 3:
	case 4: {
		static const int ops[] = {'+', '-', '*', '/', '%', '@', 'R'};
		e = node(P, E_BINARY);
		e->op = ops[below(P->r, 7)];
		e->lhs = derive_expr(P, depth + 1);
		e->rhs = derive_expr(P, depth + 1);
		if (e->op == 'R' && (e->lhs->kind == E_BINARY || e->rhs->kind == E_BINARY))
			e->op = '+'; /* `..` takes additions, not ranges or argument arrows */
		return e;
	}
	case 5:
		e = node(P, E_NEG);
		e->lhs = derive_expr(P, depth + 1);
		return e;
	case 6:
	case 7:
		e = node(P, E_CALL);
		e->lhs = node(P, E_NAME);
		e->lhs->text = any_name(P);
		if (below(P->r, 3) == 0) { /* nn.linear(...) */
			Expr *m = node(P, E_MEMBER);
			m->lhs = e->lhs;
			m->text = any_name(P);
			e->lhs = m;
		}
		e->args = derive_args(P, depth, false);
		return e;
	case 8:
		e = node(P, E_MEMBER);
		e->lhs = derive_expr(P, depth + 1);
		if (e->lhs->kind == E_BINARY || e->lhs->kind == E_NEG)
			e->lhs = number(P);
		e->text = below(P->r, 3) ? any_name(P) : "T";
		return e;
	case 9:
		e = node(P, E_INDEX);
		e->lhs = node(P, E_NAME);
		e->lhs->text = any_name(P);
		e->rhs = derive_list(P, depth, 3);
		if (!e->rhs)
			e->rhs = number(P);
		return e;
	case 10:
		e = node(P, E_TUPLE);
		e->items = derive_expr(P, depth + 1);
		e->items->next = derive_expr(P, depth + 1);
		return e;
	case 11:
		e = node(P, E_LIST);
		e->items = derive_list(P, depth, 3);
		return e;
	default:
		e = node(P, E_STRING);
		e->text = any_name(P);
		return e;
	}
}

/* a `type[dims]` list of dims */
static Expr *derive_dims(Pools *P)
{
	Expr *head = NULL, **tail = &head;
	for (int i = 0, n = 1 + below(P->r, 3); i < n; i++) {
		*tail = below(P->r, 2) ? number(P) : node(P, E_NAME);
		if ((*tail)->kind == E_NAME)
			(*tail)->text = any_name(P);
		tail = &(*tail)->next;
	}
	return head;
}

/* model_stmt */
static Stmt *derive_stmt(Pools *P, int depth)
{
	Stmt *s = arena_alloc(P->a, sizeof *s);
	memset(s, 0, sizeof *s);
	static const char *const dtypes[] = {"f32", "i32", "bf16", "f16"};
	switch (depth > 1 ? 2 : below(P->r, 6)) {
	case 0:
		s->kind = S_INPUT;
		s->name = any_name(P);
		s->dtype = dtypes[below(P->r, 4)];
		s->dims = derive_dims(P);
		break;
	case 1:
		s->kind = S_PARAM;
		s->name = any_name(P);
		s->dtype = dtypes[below(P->r, 4)];
		s->dims = derive_dims(P);
		s->buffer = below(P->r, 4) == 0;
		s->init = below(P->r, 2) ? derive_expr(P, 1) : NULL;
		break;
	case 4:
		s->kind = S_REPEAT;
		s->value = number(P);
		s->body = derive_stmt(P, depth + 1);
		break;
	case 5:
		s->kind = S_RETURN;
		s->value = derive_expr(P, 0);
		break;
	default:
		s->kind = S_ASSIGN;
		s->name = any_name(P);
		s->value = derive_expr(P, 0);
		break;
	}
	return s;
}

/* plan_stmt */
static PlanStmt *derive_pstmt(Pools *P)
{
	PlanStmt *s = arena_alloc(P->a, sizeof *s);
	memset(s, 0, sizeof *s);
	s->word = below(P->r, 4) ? vocabulary[below(P->r, 16)] : any_name(P);
	s->args = derive_args(P, 1, true);
	return s;
}

/* ---------------------------------------------------------------- mutations */

static void replace_expr(Pools *P)
{
	if (!P->neslots)
		return;
	Expr **slot = P->eslots[below(P->r, P->neslots)];
	Expr *old = *slot, *e;
	if (old->kind == E_INT && below(P->r, 2)) { /* nudge a number */
		static const long long d[] = {1, -1, 2, -2};
		long long v = below(P->r, 3) ? (old->ival == LLONG_MAX ? old->ival : old->ival + d[below(P->r, 4)])
				  : old->ival > LLONG_MAX / 2 ? LLONG_MAX : old->ival * 2;
		old->ival = v < 0 ? 0 : v;
		return;
	}
	e = below(P->r, 3) == 0 ? number(P) : derive_expr(P, 1);
	e->next = old->next; /* a list keeps its tail */
	*slot = e;
}

static int stmt_count(Stmt *s)
{
	int n = 0;
	for (; s; s = s->next)
		n++;
	return n;
}

static void mutate_stmts(Pools *P)
{
	if (!P->nslists)
		return;
	Stmt **head = P->slists[below(P->r, P->nslists)];
	int n = stmt_count(*head), k = below(P->r, n + 1);
	Stmt **at = head;
	for (int i = 0; i < k && *at; i++)
		at = &(*at)->next;
	switch (below(P->r, 4)) {
	case 0: /* delete */
		if (*at)
			*at = (*at)->next;
		break;
	case 1: /* duplicate */
		if (*at) {
			Stmt *c = arena_alloc(P->a, sizeof *c);
			*c = **at;
			c->next = *at;
			*at = c;
		}
		break;
	case 2: /* move one to the front */
		if (*at && at != head) {
			Stmt *s = *at;
			*at = s->next;
			s->next = *head;
			*head = s;
		}
		break;
	default: { /* derive a new one */
		Stmt *s = derive_stmt(P, 0);
		s->next = *at;
		*at = s;
	}
	}
}

static void mutate_pstmts(Pools *P)
{
	if (!P->nplists)
		return;
	PlanStmt **head = P->plists[below(P->r, P->nplists)];
	int n = 0;
	for (PlanStmt *s = *head; s; s = s->next)
		n++;
	PlanStmt **at = head;
	for (int i = 0, k = below(P->r, n + 1); i < k && *at; i++)
		at = &(*at)->next;
	switch (below(P->r, 4)) {
	case 0:
		if (*at)
			*at = (*at)->next;
		break;
	case 1:
		if (*at) {
			PlanStmt *c = arena_alloc(P->a, sizeof *c);
			*c = **at;
			c->next = *at;
			*at = c;
		}
		break;
	default: {
		PlanStmt *s = derive_pstmt(P);
		s->next = *at;
		*at = s;
	}
	}
}

static void mutate_args(Pools *P)
{
	if (!P->nalists)
		return;
	Arg **head = P->alists[below(P->r, P->nalists)];
	int n = 0;
	for (Arg *a = *head; a; a = a->next)
		n++;
	Arg **at = head;
	for (int i = 0, k = below(P->r, n + 1); i < k && *at; i++)
		at = &(*at)->next;
	if (*at && below(P->r, 2)) { /* drop it */
		*at = (*at)->next;
		return;
	}
	Arg *fresh = derive_args(P, 1, true);
	if (fresh) {
		fresh->next = *at;
		*at = fresh;
	}
}

static void rename_one(Pools *P)
{
	if (P->nnameslots)
		*P->nameslots[below(P->r, P->nnameslots)] = any_name(P);
}

static void mutate_tree(Pools *P)
{
	for (int i = 0, n = 1 + below(P->r, 3); i < n; i++)
		switch (below(P->r, 10)) {
		case 0:
		case 1:
		case 2: replace_expr(P); break;
		case 3:
		case 4: mutate_stmts(P); break;
		case 5:
		case 6: mutate_pstmts(P); break;
		case 7: mutate_args(P); break;
		default: rename_one(P); break;
		}
}

/* A module derived from the grammar alone (for an input that does not parse): `import std.nn`, a
 * model of derived hyperparameters and statements, and a plan for it of derived statements. */
static Module *derive_module(Pools *P)
{
	Module *m = arena_alloc(P->a, sizeof *m);
	memset(m, 0, sizeof *m);
	m->src.path = "derived.plan";
	m->src.text = "";
	Item *imp = arena_alloc(P->a, sizeof *imp), *model = arena_alloc(P->a, sizeof *model),
	     *plan = arena_alloc(P->a, sizeof *plan);
	memset(imp, 0, sizeof *imp);
	memset(model, 0, sizeof *model);
	memset(plan, 0, sizeof *plan);
	imp->kind = I_IMPORT;
	imp->name = "std.nn";
	imp->alias = "nn";
	model->kind = I_MODEL;
	model->name = "m";
	Param **pt = &model->params;
	for (int i = 0, n = below(P->r, 4); i < n; i++, pt = &(*pt)->next) {
		*pt = arena_alloc(P->a, sizeof **pt);
		memset(*pt, 0, sizeof **pt);
		static const char *const hyper[] = {"V", "S", "D", "L"};
		(*pt)->name = hyper[i];
		(*pt)->def = number(P);
	}
	Stmt **st = &model->body;
	for (int i = 0, n = 1 + below(P->r, 6); i < n; i++, st = &(*st)->next)
		*st = derive_stmt(P, 0);
	plan->kind = I_PLAN;
	plan->name = "p";
	plan->for_model = "m";
	PlanStmt **ps = &plan->rules;
	for (int i = 0, n = 1 + below(P->r, 6); i < n; i++, ps = &(*ps)->next)
		*ps = derive_pstmt(P);
	imp->next = model;
	model->next = plan;
	m->items = below(P->r, 2) ? imp : model;
	return m;
}

/* fmt's text of m into out (at most max bytes): its length, or 0 when it does not fit */
static size_t print(Module *m, uint8_t *out, size_t max)
{
	m->comments = NULL; /* the new nodes have no places among the comments */
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return 0;
	fmt_module(f, m);
	fclose(f);
	size_t n = len <= max ? len : 0;
	if (n)
		memcpy(out, buf, n);
	free(buf);
	return n;
}

static Module *parse(Arena *a, const uint8_t *data, size_t size)
{
	static FILE *quiet;
	if (!quiet && !(quiet = fopen("/dev/null", "w")))
		abort();
	diag_set_stream(quiet);
	diag_reset();
	if (size > (1 << 20))
		return NULL;
	char *copy = arena_alloc(a, size + 1);
	memcpy(copy, data, size);
	copy[size] = 0;
	Module *m = parse_module(a, "mutator.plan", copy, (int)size);
	if (m)
		diag_index_lines(a, &m->src);
	return m;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
	Rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
	Arena *a = arena_new();
	bool bytes = below(&r, 8) == 0; /* one in eight: libFuzzer's byte mutations */
	Module *m = bytes ? NULL : parse(a, data, size);
	size_t n = 0;
	if (m || (!bytes && below(&r, 2))) { /* a tree mutated, or (no tree) one derived afresh */
		Pools P = {.a = a, .r = &r};
		if (m) {
			walk_module(&P, m);
			mutate_tree(&P);
		} else {
			walk_module(&P, &(Module){0});
			m = derive_module(&P);
		}
		n = print(m, data, max_size);
		pools_free(&P);
	}
	arena_free(a);
	return n ? n : LLVMFuzzerMutate(data, size, max_size);
}

/* an item of the second input appended to the first, or one of its plan statements inserted */
size_t LLVMFuzzerCustomCrossOver(const uint8_t *data1, size_t size1, const uint8_t *data2, size_t size2, uint8_t *out,
				 size_t max_out_size, unsigned int seed)
{
	Rng r = {seed * 0x9E3779B97F4A7C15ull + 7};
	Arena *a = arena_new();
	Module *m1 = parse(a, data1, size1), *m2 = m1 ? parse(a, data2, size2) : NULL;
	size_t n = 0;
	if (m1 && m2 && m2->items) {
		int count = 0;
		for (Item *it = m2->items; it; it = it->next)
			count++;
		Item *pick = m2->items;
		for (int k = below(&r, count); k > 0; k--)
			pick = pick->next;
		Item *plan = NULL;
		for (Item *it = m1->items; it; it = it->next)
			if (it->kind == I_PLAN && (!plan || below(&r, 2)))
				plan = it;
		if (pick->kind == I_PLAN && pick->rules && plan && below(&r, 2)) {
			PlanStmt *s = pick->rules;
			for (int k = below(&r, 4); k > 0 && s->next; k--)
				s = s->next;
			PlanStmt *c = arena_alloc(a, sizeof *c);
			*c = *s;
			c->next = plan->rules;
			plan->rules = c;
		} else {
			Item *c = arena_alloc(a, sizeof *c);
			*c = *pick;
			c->next = NULL;
			Item **tail = &m1->items;
			while (*tail)
				tail = &(*tail)->next;
			*tail = c;
		}
		n = print(m1, out, max_out_size);
	}
	arena_free(a);
	if (n)
		return n;
	size_t k = size1 < max_out_size ? size1 : max_out_size;
	memcpy(out, data1, k);
	return k;
}
