/* sema.c: name resolution and plan validation on the AST, before any shape is known.
 *
 * Names (sema_check, per module). Item names are unique in their file. A model or fn body uses
 * only names that exist at that point: hyperparameters, fn parameters, inputs, params, variables
 * assigned earlier, the dims that inputs introduce (B), primitive ops, and fns of the same module
 * or of an imported one (`nn.block`). Calls to fns match their parameter lists; dtypes, inits and
 * decorators are known words; a model assigns `loss`; a fn ends with `return`. Strategies are
 * checked for shape only (their axes are bound when a plan uses them).
 *
 * Plans (sema_plan). A plan's statements are validated word by word and resolved into a
 * PlanSpec, in a fixed order whatever the order in the file: the mesh first (every other
 * statement names its axes), then the model's hyperparameters with the plan's overrides, the
 * batch, the pipeline, the shard rules (with `use`d strategies expanded and their parameters
 * bound), ZeRO, offload, recompute, precision, optimizer, sync and experts; then the checks that
 * span statements (an axis with two roles, divisibility of the batch, feature combinations that
 * cannot work). docs/checks.md lists every check with its message and its reason.
 *
 * Errors never stop the pass: each one is reported at the offending expression and checking goes
 * on, so one run shows them all. Checks that need shapes (a split parameter dim not divisible by
 * its axis, matmul inner dims) belong to graph.c and shard.c. */
#include "front/front.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------ word tables */

static const char *const prim_ops[] = {
	"embed", "layer_norm", "rms_norm", "gelu", "relu", "silu", "dropout", "softmax",
	"split_heads", "merge_heads", "causal_mask", "cross_entropy", "moe_router", "moe_dispatch",
	"moe_combine", "moe_aux_loss", "moe_z_loss", "dim", "sqrt", "normal", "uniform", "zeros", "ones",
	"sin", "cos", "exp", "log", "tanh", "sigmoid", "sum", "mean", "max", "mse_loss", "l1_loss", "select",
	"slice", "concat", "reshape", "transpose", "repeat_kv", "rope", "arange", "rope_cos", "rope_sin", "load",
};
static const char *const model_dtypes[] = {"f32", "bf16", "f16", "i32"};
/* param and buffer initializers; the last four make buffers only (graph.c's init kinds, in order) */
static const char *const init_names[] = {"normal", "uniform", "zeros", "ones", "arange", "rope_cos", "rope_sin", "load"};
enum { PARAM_INITS = 4 };
static const char *const decorators[] = {"recompute"};
static const char *const plan_words[] = {
	"mesh", "batch", "shard", "use", "pipeline", "stage", "zero", "offload", "recompute",
	"precision", "optimizer", "sync", "experts", "replicate", "freeze", "attention",
};
enum {
	W_MESH, W_BATCH, W_SHARD, W_USE, W_PIPELINE, W_STAGE, W_ZERO, W_OFFLOAD, W_RECOMPUTE,
	W_PRECISION, W_OPTIMIZER, W_SYNC, W_EXPERTS, W_REPLICATE, W_FREEZE, W_ATTENTION, NWORDS
};
static const char *const schedules[] = {"gpipe", "1f1b", "interleaved"};
static const char *const balances[] = {"uniform", "params", "flops"};
static const char *const pipeline_keys[] = {"stages", "balance", "chunks", "schedule"};
static const char *const offload_whats[] = {"optimizer", "params", "activations"};
static const char *const offload_places[] = {"host", "disk"};
static const char *const recompute_modes[] = {"none", "selective", "full"};
static const char *const attention_modes[] = {"fused", "unfused"};
static const char *const precisions[] = {"f32", "bf16", "fp16"};
static const char *const precision_keys[] = {"master", "loss_scale"};
static const char *const optimizers[] = {"sgd", "momentum", "adam", "adamw"};
static const char *const optimizer_keys[] = {"schedule", "clip"};
static const char *const lr_schedules[] = {"cosine", "constant"};
static const char *const cosine_keys[] = {"warmup", "total", "min_lr"};
static const char *const sync_modes[] = {"strict", "local_sgd", "async"};
static const char *const sync_keys[] = {"bucket", "overlap", "every", "staleness", "compress", "error_feedback", "outer"};
static const char *const outer_optimizers[] = {"sgd", "nesterov"};
static const char *const outer_keys[] = {"lr", "momentum"};
static const char *const sync_flags[] = {"overlap", "error_feedback"};
static const char *const compressors[] = {"none", "bf16", "fp16", "topk", "powersgd"};
static const char *const expert_keys[] = {"count", "top_k", "capacity_factor", "aux_loss"};
static const char *const zero_keys[] = {"over"};
static const char *const batch_keys[] = {"micro_batches"};

/* Per optimizer: the hyper-parameter keys in PyTorch's positional order. */
static const char *const sgd_keys[] = {"lr", "momentum", "weight_decay"};
static const char *const adam_keys[] = {"lr", "betas", "eps", "weight_decay"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int word_index(const char *w, const char *const *words, int n)
{
	for (int i = 0; i < n; i++)
		if (w && !strcmp(w, words[i]))
			return i;
	return -1;
}

static bool is_prim(const char *name) { return word_index(name, prim_ops, COUNT(prim_ops)) >= 0; }

/* The did-you-mean candidate for name, or NULL. One-letter names get none: every other
 * one-letter name is as close, so the guess would be noise. */
static const char *best_guess(const char *name, const char *const *cands, int n)
{
	if (!name || strlen(name) < 2)
		return NULL;
	return closest_name(name, cands, n);
}

static void suggest(const char *name, const char *const *cands, int n)
{
	const char *c = best_guess(name, cands, n);
	if (c)
		diag_note_plain("did you mean '%s'?", c);
}

/* "a, b and c" for a note listing the choices. */
static const char *word_list(Arena *a, const char *const *words, int n, const char *conj)
{
	char buf[512];
	size_t len = 0;
	buf[0] = 0;
	for (int i = 0; i < n && len < sizeof buf - 64; i++) {
		const char *sep = i == 0 ? "" : i == n - 1 ? conj : ", ";
		len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", sep, words[i]);
	}
	return arena_strdup(a, buf);
}

/* A growable list of names, for did-you-mean candidates. */
typedef struct Names {
	const char **v;
	int n, cap;
} Names;

static void names_add(Arena *a, Names *ns, const char *s)
{
	if (!s)
		return;
	if (ns->n == ns->cap) {
		int cap = ns->cap ? ns->cap * 2 : 32;
		const char **v = arena_alloc(a, sizeof *v * (size_t)cap);
		if (ns->n)
			memcpy(v, ns->v, sizeof *v * (size_t)ns->n);
		ns->v = v;
		ns->cap = cap;
	}
	ns->v[ns->n++] = s;
}

static void names_add_all(Arena *a, Names *ns, const char *const *words, int n)
{
	for (int i = 0; i < n; i++)
		names_add(a, ns, words[i]);
}

/* ------------------------------------------------------------------ modules and items */

static Module *module_by_import(Program *p, const char *import_name)
{
	for (Module *m = p->modules; m; m = m->next)
		if (m->import_name && !strcmp(m->import_name, import_name))
			return m;
	return NULL;
}

static Item *import_of(const Module *m, const char *alias)
{
	if (m->imports_by_alias)
		return symtab_get(m->imports_by_alias, alias);
	for (Item *it = m->items; it; it = it->next)
		if (it->kind == I_IMPORT && it->alias && !strcmp(it->alias, alias))
			return it;
	return NULL;
}

static Item *module_item(const Module *m, const char *name, int kind)
{
	if (!m || !name)
		return NULL;
	if (m->items_by_name) { /* load.c indexed it */
		for (const ItemChain *c = symtab_get(m->items_by_name, name); c; c = c->next)
			if (kind < 0 || (int)c->item->kind == kind)
				return c->item;
		return NULL;
	}
	for (Item *it = m->items; it; it = it->next)
		if (it->kind != I_IMPORT && (kind < 0 || (int)it->kind == kind) && it->name && !strcmp(it->name, name))
			return it;
	return NULL;
}

static const char *item_kind_name(ItemKind k)
{
	switch (k) {
	case I_IMPORT: return "import";
	case I_MODEL: return "model";
	case I_FN: return "fn";
	case I_STRATEGY: return "strategy";
	case I_PLAN: return "plan";
	}
	return "item";
}

Item *find_item(Program *p, ItemKind kind, const char *name, const Module *from)
{
	if (!p || !name)
		return NULL;
	if (!from)
		from = p->main;
	const char *dot = strchr(name, '.');
	if (dot) {
		char alias[128];
		size_t n = (size_t)(dot - name);
		if (n >= sizeof alias)
			return NULL;
		memcpy(alias, name, n);
		alias[n] = 0;
		Item *imp = import_of(from, alias);
		if (!imp)
			return NULL;
		Module *m = module_by_import(p, imp->name);
		return m ? module_item(m, dot + 1, (int)kind) : NULL;
	}
	return module_item(from, name, (int)kind);
}

/* The names of a module's items of one kind, prefixed with "alias." when alias is given. */
static void item_names(Arena *a, Names *ns, const Module *m, int kind, const char *alias)
{
	if (!m)
		return;
	for (Item *it = m->items; it; it = it->next)
		if (it->kind != I_IMPORT && (kind < 0 || (int)it->kind == kind) && it->name)
			names_add(a, ns, alias ? arena_printf(a, "%s.%s", alias, it->name) : it->name);
}

/* ------------------------------------------------------------------ constant expressions */

bool int_arith(int op, long long a, long long b, long long *r, bool *inexact)
{
	*r = 0;
	*inexact = false;
	switch (op) {
	case '+': return !__builtin_add_overflow(a, b, r);
	case '-': return !__builtin_sub_overflow(a, b, r);
	case '*': return !__builtin_mul_overflow(a, b, r);
	case '/':
	case '%':
		if (b == 0)
			ICE("int_arith: division by zero reached it");
		if (a == LLONG_MIN && b == -1)
			return false;
		*inexact = op == '/' && a % b != 0;
		*r = op == '/' ? a / b : a % b;
		return true;
	}
	ICE("int_arith: operator '%c'", op);
}

/* Hyperparameters, plan values and repeat counts are constant expressions: numbers, sizes,
 * + - * / % and unary minus, sqrt(), and names of earlier hyperparameters. Integer arithmetic
 * stays integral while exact (8 / 2 = 4); an inexact division gives a float. Integers are exact
 * 64-bit values (i), never rounded through a double: a result beyond 2^63 - 1 is an error at the
 * expression. */
typedef struct Num {
	double v;
	bool is_int;
	long long i; /* is_int: the exact value (v is its nearest double) */
} Num;

typedef struct Eval {
	Arena *a;
	const Source *src;
	const HyperValue *env;
	int nenv;
	const char *const *later; /* hyperparameters defined after the one being evaluated */
	int nlater;
	bool report;
} Eval;

static bool eval_num(const Eval *ev, const Expr *e, Num *out)
{
	switch (e->kind) {
	case E_INT:
		out->v = (double)e->ival;
		out->is_int = true;
		out->i = e->ival;
		return true;
	case E_FLOAT:
		out->v = e->fval;
		out->is_int = false;
		out->i = 0;
		return true;
	case E_SIZE:
		out->v = e->fval;
		out->is_int = e->fval == floor(e->fval) && fabs(e->fval) < 9223372036854775808.0; /* 2^63 */
		out->i = out->is_int ? (long long)e->fval : 0;
		return true;
	case E_NAME:
		for (int i = ev->nenv - 1; i >= 0; i--)
			if (!strcmp(ev->env[i].name, e->text)) {
				out->v = ev->env[i].value;
				out->is_int = ev->env[i].is_int;
				out->i = ev->env[i].ival;
				return true;
			}
		if (ev->report) {
			if (word_index(e->text, ev->later, ev->nlater) >= 0) {
				diag_error(ev->src, e->loc, "hyperparameter '%s' is used before it is defined", e->text);
				diag_note_plain("a hyperparameter's default can use only the ones before it");
			} else {
				diag_error(ev->src, e->loc, "unknown name '%s'", e->text);
				Names ns = {0};
				for (int i = 0; i < ev->nenv; i++)
					names_add(ev->a, &ns, ev->env[i].name);
				suggest(e->text, ns.v, ns.n);
			}
		}
		return false;
	case E_NEG: {
		if (!eval_num(ev, e->lhs, out))
			return false;
		if (out->is_int && out->i == LLONG_MIN) {
			if (ev->report)
				diag_error(ev->src, e->loc, "integer overflow: -(%lld) is beyond 2^63 - 1", out->i);
			return false;
		}
		out->v = -out->v;
		out->i = -out->i;
		return true;
	}
	case E_BINARY: {
		Num l, r;
		if (e->op != '+' && e->op != '-' && e->op != '*' && e->op != '/' && e->op != '%')
			break;
		bool okl = eval_num(ev, e->lhs, &l);
		bool okr = eval_num(ev, e->rhs, &r);
		if (!okl || !okr)
			return false;
		if ((e->op == '/' || e->op == '%') && r.v == 0) {
			if (ev->report)
				diag_error(ev->src, e->loc, "division by zero");
			return false;
		}
		if (e->op == '%' && (!l.is_int || !r.is_int)) {
			if (ev->report)
				diag_error(ev->src, e->loc, "'%%' needs integer operands");
			return false;
		}
		if (l.is_int && r.is_int) {
			long long x;
			bool inexact;
			if (!int_arith(e->op, l.i, r.i, &x, &inexact)) {
				if (ev->report) {
					diag_error(ev->src, e->loc, "integer overflow: %lld %c %lld is beyond 2^63 - 1", l.i, e->op, r.i);
					diag_note_plain("integers are exact 64-bit values; write a smaller value");
				}
				return false;
			}
			if (!inexact) { /* an inexact division gives a float, below */
				out->v = (double)x;
				out->is_int = true;
				out->i = x;
				return true;
			}
		}
		double v = 0;
		switch (e->op) {
		case '+': v = l.v + r.v; break;
		case '-': v = l.v - r.v; break;
		case '*': v = l.v * r.v; break;
		case '/': v = l.v / r.v; break;
		case '%': v = fmod(l.v, r.v); break;
		}
		out->v = v;
		out->is_int = false;
		out->i = 0;
		return true;
	}
	case E_CALL:
		if (e->lhs->kind == E_NAME && !strcmp(e->lhs->text, "sqrt") && e->args && !e->args->next && !e->args->key) {
			Num x;
			if (!eval_num(ev, e->args->value, &x))
				return false;
			if (x.v < 0) {
				if (ev->report)
					diag_error(ev->src, e->loc, "sqrt of a negative number");
				return false;
			}
			out->v = sqrt(x.v);
			out->is_int = false;
			out->i = 0;
			return true;
		}
		break;
	default:
		break;
	}
	if (ev->report)
		diag_error(ev->src, e->loc, "expected a number");
	return false;
}

/* ------------------------------------------------------------------ model and fn bodies */

typedef enum { B_HYPER, B_FNPARAM, B_INPUT, B_PARAM, B_VAR, B_DIM } BindKind;

typedef struct Bind {
	const char *name;
	BindKind kind;
	Loc loc;
} Bind;

typedef struct Body {
	Program *prog;
	Arena *a;
	Item *item;
	const Module *mod;
	const Source *src;
	bool in_fn;
	Bind *b;
	int n, cap;
	bool assigned_loss;
	SymTab *index; /* name -> 1 + its latest index in b */
} Body;

static const char *bind_kind_name(BindKind k)
{
	switch (k) {
	case B_HYPER: return "hyperparameter";
	case B_FNPARAM: return "fn parameter";
	case B_INPUT: return "input";
	case B_PARAM: return "param";
	case B_VAR: return "variable";
	case B_DIM: return "dimension";
	}
	return "name";
}

static Bind *body_find(Body *bd, const char *name)
{
	intptr_t i = (intptr_t)symtab_get(bd->index, name);
	return i ? &bd->b[i - 1] : NULL;
}

static void body_bind(Body *bd, const char *name, BindKind k, Loc loc)
{
	if (bd->n == bd->cap) {
		int cap = bd->cap ? bd->cap * 2 : 32;
		Bind *b = arena_alloc(bd->a, sizeof *b * (size_t)cap);
		if (bd->n)
			memcpy(b, bd->b, sizeof *b * (size_t)bd->n);
		bd->b = b;
		bd->cap = cap;
	}
	bd->b[bd->n++] = (Bind){name, k, loc};
	symtab_put(bd->index, name, (void *)(intptr_t)bd->n);
}

static const Stmt *later_assignment(const Stmt *s, const char *name, int after)
{
	for (; s; s = s->next) {
		if (s->kind == S_ASSIGN && s->loc.off > after && !strcmp(s->name, name))
			return s;
		const Stmt *in = later_assignment(s->body, name, after);
		if (in)
			return in;
	}
	return NULL;
}

/* a stdlib module's name used without its import (`nn.block` with no `import std.nn`) */
static bool stdlib_module(Arena *a, const char *name)
{
	struct stat st;
	return stat(arena_printf(a, "%s/%s.plan", stdlib_dir(), name), &st) == 0;
}

static void unknown_name(Body *bd, Loc loc, const char *name)
{
	diag_error(bd->src, loc, "unknown name '%s'", name);
	if (stdlib_module(bd->a, name)) {
		diag_note_plain("'%s' is a module of the standard library: add `import std.%s` at the top of the file", name,
				name);
		return;
	}
	const Stmt *later = later_assignment(bd->item->body, name, loc.off);
	if (later) {
		diag_note(bd->src, later->name_loc, "'%s' is assigned only later, here", name);
		return;
	}
	Names ns = {0};
	for (int i = 0; i < bd->n; i++)
		names_add(bd->a, &ns, bd->b[i].name);
	names_add_all(bd->a, &ns, prim_ops, COUNT(prim_ops));
	item_names(bd->a, &ns, bd->mod, I_FN, NULL);
	for (Item *it = bd->mod->items; it; it = it->next)
		if (it->kind == I_IMPORT)
			names_add(bd->a, &ns, it->alias);
	suggest(name, ns.v, ns.n);
}

static void check_expr(Body *bd, Expr *e);

/* `alias.name` where alias is an import (and not shadowed by a local): resolves name to a fn
 * of the imported module. Returns 1 with *fn set, 0 when e is an ordinary member access, -1
 * after an error (or silently when the module itself failed to load). */
static int resolve_alias_fn(Body *bd, Expr *e, Item **fn)
{
	if (e->kind != E_MEMBER || !e->lhs || e->lhs->kind != E_NAME || body_find(bd, e->lhs->text))
		return 0;
	Item *imp = import_of(bd->mod, e->lhs->text);
	if (!imp)
		return 0;
	Module *m = module_by_import(bd->prog, imp->name);
	if (!m)
		return -1;
	const char *name = e->text;
	Item *it = name ? module_item(m, name, I_FN) : NULL;
	if (it) {
		*fn = it;
		return 1;
	}
	Item *other = name ? module_item(m, name, -1) : NULL;
	if (other) {
		diag_error(bd->src, e->loc, "'%s.%s' is a %s, not a fn", imp->alias, name, item_kind_name(other->kind));
		return -1;
	}
	diag_error(bd->src, e->loc, "unknown name '%s.%s'", imp->alias, name ? name : "?");
	Names ns = {0};
	item_names(bd->a, &ns, m, I_FN, imp->alias);
	suggest(arena_printf(bd->a, "%s.%s", imp->alias, name ? name : ""), ns.v, ns.n);
	return -1;
}

/* Arguments of a call to a fn: positionals fill parameters in order, keywords by name. */
static void check_fn_args(Body *bd, Expr *call, Item *fn, const char *shown)
{
	int nparams = 0;
	for (Param *p = fn->params; p; p = p->next)
		nparams++;
	const Arg **given = arena_alloc(bd->a, sizeof *given * (size_t)(nparams + 1));
	int pos = 0;
	bool too_many = false, unknown_kw = false;
	for (Arg *a = call->args; a; a = a->next) {
		if (!a->key) {
			if (pos >= nparams) {
				if (!too_many) {
					diag_error(bd->src, a->loc, "too many arguments to '%s': it takes %d", shown, nparams);
					diag_note(&fn->module->src, fn->name_loc, "'%s' is defined here", fn->name);
				}
				too_many = true;
				continue;
			}
			given[pos++] = a;
			continue;
		}
		int i = 0;
		Param *p = fn->params;
		while (p && strcmp(p->name, a->key)) {
			p = p->next;
			i++;
		}
		if (!p) {
			diag_error(bd->src, a->key_loc, "'%s' has no parameter '%s'", shown, a->key);
			unknown_kw = true;
			Names ns = {0};
			for (Param *q = fn->params; q; q = q->next)
				names_add(bd->a, &ns, q->name);
			suggest(a->key, ns.v, ns.n);
			continue;
		}
		if (given[i]) {
			diag_error(bd->src, a->key_loc, "argument '%s' is given twice", a->key);
			diag_note(bd->src, given[i]->loc, "first given here");
			continue;
		}
		given[i] = a;
	}
	int i = 0;
	for (Param *p = fn->params; p; p = p->next, i++) {
		if (!given[i] && !p->def && !unknown_kw) {
			diag_error(bd->src, call->loc, "missing argument '%s' in call to '%s'", p->name, shown);
			diag_note(&fn->module->src, p->loc, "'%s' has no default", p->name);
		}
	}
}

static void check_call(Body *bd, Expr *e)
{
	Expr *callee = e->lhs;
	if (callee->kind == E_NAME) {
		const char *name = callee->text;
		Bind *b = body_find(bd, name);
		Item *it;
		if (b) {
			if (b->kind != B_FNPARAM && b->kind != B_VAR)
				diag_error(bd->src, callee->loc, "'%s' is a %s, not a fn", name, bind_kind_name(b->kind));
		} else if (is_prim(name)) {
			/* primitive ops: arguments are checked by graph.c, which knows their shapes */
		} else if ((it = module_item(bd->mod, name, I_FN))) {
			check_fn_args(bd, e, it, name);
		} else if ((it = module_item(bd->mod, name, -1))) {
			diag_error(bd->src, callee->loc, "'%s' is a %s, not a fn", name, item_kind_name(it->kind));
		} else {
			unknown_name(bd, callee->loc, name);
		}
	} else if (callee->kind == E_MEMBER) {
		Item *fn = NULL;
		int r = resolve_alias_fn(bd, callee, &fn);
		if (r == 1)
			check_fn_args(bd, e, fn, arena_printf(bd->a, "%s.%s", callee->lhs->text, fn->name));
		else if (r == 0)
			check_expr(bd, callee);
	} else {
		check_expr(bd, callee);
	}
	for (Arg *a = e->args; a; a = a->next) {
		check_expr(bd, a->value);
		if (a->key)
			for (Arg *b = e->args; b != a; b = b->next)
				if (b->key && !strcmp(b->key, a->key)) {
					/* reported by check_fn_args for fns; here for primitive ops */
					if (callee->kind == E_NAME && is_prim(callee->text) && !body_find(bd, callee->text)) {
						diag_error(bd->src, a->key_loc, "argument '%s' is given twice", a->key);
						diag_note(bd->src, b->loc, "first given here");
					}
					break;
				}
	}
}

static const char *binop_name(int op)
{
	switch (op) {
	case 'A': return "->";
	case 'R': return "..";
	case ':': return ":";
	}
	return "?";
}

static void check_expr(Body *bd, Expr *e)
{
	if (!e)
		return;
	switch (e->kind) {
	case E_INT:
	case E_FLOAT:
	case E_SIZE:
	case E_STRING:
		return;
	case E_NAME: {
		const char *name = e->text;
		Item *it;
		if (!strcmp(name, "_")) {
			diag_error(bd->src, e->loc, "'_' is only allowed in a shard layout");
			return;
		}
		if (body_find(bd, name) || is_prim(name) || module_item(bd->mod, name, I_FN))
			return;
		if (import_of(bd->mod, name)) {
			diag_error(bd->src, e->loc, "'%s' is a module; use its members as %s.NAME", name, name);
			return;
		}
		if ((it = module_item(bd->mod, name, -1))) {
			diag_error(bd->src, e->loc, "'%s' is a %s, not a value", name, item_kind_name(it->kind));
			return;
		}
		unknown_name(bd, e->loc, name);
		return;
	}
	case E_STAR:
		diag_error(bd->src, e->loc, "'*' is only allowed in a shard pattern");
		return;
	case E_BINARY:
		if (e->op == 'A' || e->op == 'R' || e->op == ':')
			diag_error(bd->src, e->loc, "'%s' is only allowed in plan statements", binop_name(e->op));
		check_expr(bd, e->lhs);
		check_expr(bd, e->rhs);
		return;
	case E_NEG:
		check_expr(bd, e->lhs);
		return;
	case E_CALL:
		check_call(bd, e);
		return;
	case E_MEMBER: {
		Item *fn = NULL;
		if (e->rhs && e->rhs->kind == E_STAR) {
			diag_error(bd->src, e->loc, "'.*' is only allowed in a shard pattern");
			return;
		}
		if (resolve_alias_fn(bd, e, &fn) == 0)
			check_expr(bd, e->lhs);
		return;
	}
	case E_INDEX:
		check_expr(bd, e->lhs);
		for (Expr *i = e->rhs; i; i = i->next)
			if (i->kind != E_NAME || strcmp(i->text, "_")) /* '_': the whole dim */
				check_expr(bd, i);
		return;
	case E_TUPLE:
	case E_LIST:
		for (Expr *x = e->items; x; x = x->next)
			check_expr(bd, x);
		return;
	}
}

static void check_dtype(Body *bd, Stmt *s, bool is_param)
{
	if (!s->dtype)
		return;
	if (word_index(s->dtype, model_dtypes, COUNT(model_dtypes)) < 0) {
		diag_error(bd->src, s->dtype_loc, "unknown dtype '%s'", s->dtype);
		if (!best_guess(s->dtype, model_dtypes, COUNT(model_dtypes)))
			diag_note_plain("dtypes are f32, bf16, f16 and i32");
		suggest(s->dtype, model_dtypes, COUNT(model_dtypes));
	} else if (is_param && !strcmp(s->dtype, "i32")) {
		diag_error(bd->src, s->dtype_loc, "%s '%s' has integer dtype i32", s->buffer ? "buffer" : "param", s->name);
		diag_note_plain(s->buffer ? "buffers hold floating-point values: use f32, bf16 or f16"
		                          : "params are trained by gradient descent: use f32, bf16 or f16");
	}
}

static void check_init(Body *bd, Stmt *s)
{
	Expr *init = s->init;
	if (!init) {
		if (s->buffer) {
			diag_error(bd->src, s->loc, "buffer '%s' needs an initializer", s->name);
			diag_note_plain("a buffer is computed at init (~ zeros, ones, normal(mean, std), uniform(lo, hi), arange, "
			                "rope_cos(theta), rope_sin(theta)) or loaded from --init (~ load)");
		}
		return;
	}
	Expr *callee = init->kind == E_CALL ? init->lhs : init;
	if (callee->kind != E_NAME) {
		diag_error(bd->src, init->loc, "expected an initializer: normal(mean, std), uniform(lo, hi), zeros or ones");
		return;
	}
	int n_inits = s->buffer ? (int)COUNT(init_names) : PARAM_INITS;
	int k = word_index(callee->text, init_names, n_inits);
	if (k < 0 && word_index(callee->text, init_names, COUNT(init_names)) >= 0) {
		diag_error(bd->src, callee->loc, "'%s' initializes buffers only", callee->text);
		diag_note_plain("declare it 'buffer %s : ...' (a tensor that does not train), or use normal, uniform, zeros or "
		                "ones", s->name);
		return;
	}
	if (k < 0) {
		diag_error(bd->src, callee->loc, "unknown initializer '%s'", callee->text);
		if (!best_guess(callee->text, init_names, n_inits))
			diag_note_plain(s->buffer ? "buffer initializers are normal(mean, std), uniform(lo, hi), zeros, ones, arange, "
			                            "rope_cos(theta), rope_sin(theta) and load"
			                          : "initializers are normal(mean, std), uniform(lo, hi), zeros and ones");
		suggest(callee->text, init_names, n_inits);
		return;
	}
	int nargs = 0;
	for (Arg *a = init->kind == E_CALL ? init->args : NULL; a; a = a->next) {
		nargs++;
		check_expr(bd, a->value);
	}
	int want = k <= 1 ? 2 : k == 5 || k == 6 ? 1 : 0;
	if (nargs != want) {
		static const char *const forms[] = {"normal(mean, std)", "uniform(lo, hi)", "zeros", "ones", "arange",
		                                    "rope_cos(theta)", "rope_sin(theta)", "load"};
		diag_error(bd->src, init->loc, "'%s' takes %d argument%s, not %d", init_names[k], want, want == 1 ? "" : "s", nargs);
		diag_note_plain("write it as %s", forms[k]);
	}
}

static void declare(Body *bd, const char *name, Loc loc, BindKind kind)
{
	Bind *b = body_find(bd, name);
	if (b && !(b->kind == B_DIM && kind == B_DIM)) {
		diag_error(bd->src, loc, "'%s' is already defined", name);
		diag_note(bd->src, b->loc, "'%s' is the %s defined here", name, bind_kind_name(b->kind));
		return;
	}
	if (!b)
		body_bind(bd, name, kind, loc);
}

static void check_stmts(Body *bd, Stmt *s, int depth, bool *returned)
{
	bool after_return_reported = false;
	for (; s && !diag_stopped(); s = s->next) {
		if (*returned && !after_return_reported) {
			diag_error(bd->src, s->loc, "statement after return");
			diag_note_plain("return ends a fn: it must be the last statement");
			after_return_reported = true;
		}
		switch (s->kind) {
		case S_INPUT:
			if (bd->in_fn || depth > 0)
				diag_error(bd->src, s->loc, "input is only allowed at the top level of a model");
			check_dtype(bd, s, false);
			for (Expr *d = s->dims; d; d = d->next) {
				/* a plain unknown name in an input's shape introduces a dim (the batch dim B) */
				if (d->kind == E_NAME && strcmp(d->text, "_") && !body_find(bd, d->text) && !is_prim(d->text) &&
				    !module_item(bd->mod, d->text, -1) && !import_of(bd->mod, d->text))
					body_bind(bd, d->text, B_DIM, d->loc);
				else
					check_expr(bd, d);
			}
			declare(bd, s->name, s->name_loc, B_INPUT);
			break;
		case S_PARAM:
			check_dtype(bd, s, true);
			for (Expr *d = s->dims; d; d = d->next)
				check_expr(bd, d);
			check_init(bd, s);
			declare(bd, s->name, s->name_loc, B_PARAM);
			break;
		case S_ASSIGN: {
			check_expr(bd, s->value);
			Bind *b = body_find(bd, s->name);
			if (b) {
				if (b->kind != B_VAR && b->kind != B_FNPARAM) {
					diag_error(bd->src, s->name_loc, "cannot assign to %s '%s'", bind_kind_name(b->kind), s->name);
					diag_note(bd->src, b->loc, "'%s' is defined here", s->name);
				}
			} else if (is_prim(s->name)) {
				diag_error(bd->src, s->name_loc, "cannot assign to '%s': it names a primitive op", s->name);
			} else if (module_item(bd->mod, s->name, I_FN) || import_of(bd->mod, s->name)) {
				diag_error(bd->src, s->name_loc, "cannot assign to '%s': it names a %s", s->name,
				           import_of(bd->mod, s->name) ? "module" : "fn");
			} else {
				body_bind(bd, s->name, B_VAR, s->name_loc);
			}
			if (!bd->in_fn && !strcmp(s->name, "loss"))
				bd->assigned_loss = true;
			break;
		}
		case S_REPEAT:
			check_expr(bd, s->value);
			check_stmts(bd, s->body, depth + 1, returned);
			break;
		case S_RETURN:
			if (!bd->in_fn) {
				diag_error(bd->src, s->loc, "return is only allowed in a fn");
				diag_note_plain("a model's result is the variable 'loss'");
			} else if (depth > 0) {
				diag_error(bd->src, s->loc, "return inside repeat");
				diag_note_plain("return must be the last statement of the fn");
			}
			check_expr(bd, s->value);
			if (depth == 0)
				*returned = true;
			break;
		}
	}
}

static void check_params_unique(Arena *a, const Source *src, Param *params, const char *what)
{
	SymTab *first = symtab_new(a);
	for (Param *p = params; p; p = p->next) {
		Param *q = symtab_get(first, p->name);
		if (!q) {
			symtab_put(first, p->name, p);
			continue;
		}
		diag_error(src, p->loc, "%s '%s' is declared twice", what, p->name);
		diag_note(src, q->loc, "first declared here");
	}
}

/* A model's hyperparameter defaults are constant expressions over the earlier ones. Returns
 * false if any default is not. */
static bool check_model_hypers(Program *p, Item *model)
{
	bool ok = true;
	int n = 0;
	for (Param *q = model->params; q; q = q->next)
		n++;
	HyperValue *env = arena_alloc(p->arena, sizeof *env * (size_t)(n + 1));
	const char **names = arena_alloc(p->arena, sizeof *names * (size_t)(n + 1));
	int i = 0;
	for (Param *q = model->params; q; q = q->next)
		names[i++] = q->name;
	i = 0;
	for (Param *q = model->params; q; q = q->next, i++) {
		Num v = {0, true, 0};
		if (q->def) {
			Eval ev = {p->arena, &model->module->src, env, i, names + i + 1, n - i - 1, true};
			if (!eval_num(&ev, q->def, &v))
				ok = false;
		}
		env[i] = (HyperValue){q->name, v.v, v.is_int, q->loc, &model->module->src, v.i};
	}
	return ok;
}

static void check_body_item(Program *p, Item *it)
{
	Body bd = {p, p->arena, it, it->module, &it->module->src, it->kind == I_FN, NULL, 0, 0, false, symtab_new(p->arena)};
	if (it->kind == I_MODEL) {
		check_params_unique(p->arena, bd.src, it->params, "hyperparameter");
		for (Param *q = it->params; q; q = q->next)
			if (!body_find(&bd, q->name))
				body_bind(&bd, q->name, B_HYPER, q->loc);
	} else {
		check_params_unique(p->arena, bd.src, it->params, "parameter");
		for (Decorator *d = it->decorators; d; d = d->next)
			if (word_index(d->name, decorators, COUNT(decorators)) < 0) {
				diag_error(bd.src, d->loc, "unknown decorator '@%s'", d->name);
				if (best_guess(d->name, decorators, COUNT(decorators)))
					diag_note_plain("did you mean '@recompute'?");
				else
					diag_note_plain("the only decorator is @recompute");
			}
		/* defaults may use earlier parameters */
		for (Param *q = it->params; q; q = q->next) {
			check_expr(&bd, q->def);
			if (!body_find(&bd, q->name))
				body_bind(&bd, q->name, B_FNPARAM, q->loc);
		}
	}
	bool returned = false;
	check_stmts(&bd, it->body, 0, &returned);
	if (it->kind == I_FN && !returned) {
		diag_error(bd.src, it->name_loc, "fn '%s' does not end with return", it->name);
		diag_note_plain("a fn returns one value: end it with 'return EXPR'");
	}
	if (it->kind == I_MODEL && !bd.assigned_loss) {
		diag_error(bd.src, it->name_loc, "model '%s' does not assign 'loss'", it->name);
		diag_note_plain("training minimises the variable 'loss', e.g. loss = cross_entropy(logits, targets)");
	}
}

/* ------------------------------------------------------------------ model facts for plans */

typedef struct ModelInfo {
	Names hypers;       /* hyperparameter names, in order */
	Names free_dims;    /* input dims that are not hyperparameters (the batch dim B) */
	Expr *repeat_count; /* the first top-level repeat, or NULL */
	bool uses_moe;
	bool uses_recompute_fn;
	bool has_expert_hyper; /* a hyperparameter named E */
} ModelInfo;

typedef struct Visit {
	Item *seen[256];
	int n;
} Visit;

static void scan_calls_expr(Program *p, const Module *mod, Expr *e, ModelInfo *mi, Visit *vs);

static void scan_calls_item(Program *p, Item *fn, ModelInfo *mi, Visit *vs);

static void scan_calls_stmts(Program *p, const Module *mod, Stmt *s, ModelInfo *mi, Visit *vs)
{
	for (; s; s = s->next) {
		scan_calls_expr(p, mod, s->value, mi, vs);
		scan_calls_stmts(p, mod, s->body, mi, vs);
	}
}

static void scan_calls_item(Program *p, Item *fn, ModelInfo *mi, Visit *vs)
{
	for (int i = 0; i < vs->n; i++)
		if (vs->seen[i] == fn)
			return;
	if (vs->n == COUNT(vs->seen))
		return;
	vs->seen[vs->n++] = fn;
	for (Decorator *d = fn->decorators; d; d = d->next)
		if (!strcmp(d->name, "recompute"))
			mi->uses_recompute_fn = true;
	scan_calls_stmts(p, fn->module, fn->body, mi, vs);
}

static void scan_calls_expr(Program *p, const Module *mod, Expr *e, ModelInfo *mi, Visit *vs)
{
	if (!e)
		return;
	if (e->kind == E_CALL) {
		Expr *c = e->lhs;
		Item *fn = NULL;
		if (c->kind == E_NAME) {
			if (!strncmp(c->text, "moe_", 4) && is_prim(c->text))
				mi->uses_moe = true;
			fn = module_item(mod, c->text, I_FN);
		} else if (c->kind == E_MEMBER && c->lhs->kind == E_NAME && c->text) {
			Item *imp = import_of(mod, c->lhs->text);
			Module *m = imp ? module_by_import(p, imp->name) : NULL;
			fn = m ? module_item(m, c->text, I_FN) : NULL;
		}
		if (fn)
			scan_calls_item(p, fn, mi, vs);
		for (Arg *a = e->args; a; a = a->next)
			scan_calls_expr(p, mod, a->value, mi, vs);
	}
	scan_calls_expr(p, mod, e->lhs, mi, vs);
	scan_calls_expr(p, mod, e->rhs, mi, vs);
	for (Expr *x = e->items; x; x = x->next)
		scan_calls_expr(p, mod, x, mi, vs);
}

static void model_info(Program *p, Item *model, ModelInfo *mi)
{
	memset(mi, 0, sizeof *mi);
	for (Param *q = model->params; q; q = q->next) {
		names_add(p->arena, &mi->hypers, q->name);
		if (!strcmp(q->name, "E"))
			mi->has_expert_hyper = true;
	}
	for (Stmt *s = model->body; s; s = s->next) {
		if (s->kind == S_INPUT)
			for (Expr *d = s->dims; d; d = d->next)
				if (d->kind == E_NAME && word_index(d->text, mi->hypers.v, mi->hypers.n) < 0 &&
				    word_index(d->text, mi->free_dims.v, mi->free_dims.n) < 0)
					names_add(p->arena, &mi->free_dims, d->text);
		if (s->kind == S_REPEAT && !mi->repeat_count)
			mi->repeat_count = s->value;
	}
	Visit vs = {.n = 0};
	vs.seen[vs.n++] = model;
	scan_calls_stmts(p, model->module, model->body, mi, &vs);
}

/* Two named dims of one model tensor (an input or a param with plain-name dims): splitting
 * both over the same mesh axis would split that tensor twice over one axis. */
static bool dims_share_tensor(const Item *model, const char *a, const char *b)
{
	for (Stmt *s = model->body; s; s = s->next) {
		if (s->kind != S_INPUT && s->kind != S_PARAM)
			continue;
		bool ha = false, hb = false;
		for (Expr *d = s->dims; d; d = d->next)
			if (d->kind == E_NAME) {
				ha = ha || !strcmp(d->text, a);
				hb = hb || !strcmp(d->text, b);
			}
		if (ha && hb)
			return true;
	}
	return false;
}

/* ------------------------------------------------------------------ plans */

/* A strategy parameter bound to the expression the `use` passed (with that expression's file). */
typedef struct Frame Frame;

typedef struct ArgBind {
	const char *name;
	Expr *e;
	const Source *src;
	const Frame *frame; /* the frame whose text holds e (for the "used here" notes) */
	bool reported;      /* an error was reported at this argument: do not repeat it per rule */
} ArgBind;

/* Where the statements being processed come from: the plan itself (strategy NULL) or a strategy
 * expanded by a `use` (with its parameters bound), possibly inside another strategy. */
struct Frame {
	const Item *strategy;
	const Module *mod;
	const Source *src;
	const Source *use_src;
	Loc use_loc;
	ArgBind *binds;
	int nbinds;
	const Frame *up;
	int depth;
};

/* Extra facts about each rule, parallel to PlanSpec.rules, for cross-rule diagnostics. */
typedef struct RuleNote {
	const Source *src; /* where the rule is written */
	Loc loc;
	const char *strategy; /* the strategy it comes from, NULL for the plan's own rules */
	const Source *use_src;
	Loc use_loc;
} RuleNote;

typedef struct PlanCtx {
	Program *prog;
	Arena *a;
	PlanSpec *ps;
	const Source *src;
	Item *model;
	ModelInfo mi;
	bool hypers_ok;
	long long layers; /* the model's first repeat count; 0 if none or unknown */
	bool layers_known;
	PlanStmt *first[NWORDS];
	bool axis_used[MAX_AXES];
	bool replicated[MAX_AXES]; /* `replicate AXIS` */
	RuleNote *notes;
	int capnotes;
	Expr *batch_value; /* the B = N expression */
	Expr *mb_value;
	bool explicit_pipe_stages;
	bool warn; /* report warnings (sema_check does; sema_plan leaves them to it) */
} PlanCtx;

static void pwarn(PlanCtx *pc, const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void pwarn(PlanCtx *pc, const Source *src, Loc loc, const char *fmt, ...)
{
	if (!pc->warn)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	diag_warning(src, loc, "%s", buf);
}

/* Reports an error at (src, loc), a place in the text of frame fr, and then, for every strategy
 * expansion that fr is inside of, where that strategy was used. */
static void perr(const Frame *fr, const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void perr(const Frame *fr, const Source *src, Loc loc, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	diag_error(src, loc, "%s", buf);
	for (const Frame *f = fr; f && f->strategy; f = f->up)
		diag_note(f->use_src, f->use_loc, "in strategy '%s' used here", f->strategy->name);
}

static void rule_notes(const RuleNote *rn)
{
	if (rn->strategy)
		diag_note(rn->use_src, rn->use_loc, "rule of strategy '%s' used here", rn->strategy);
}

static HyperValue *find_hyper(PlanCtx *pc, const char *name)
{
	for (int i = 0; i < pc->ps->nhypers; i++)
		if (!strcmp(pc->ps->hypers[i].name, name))
			return &pc->ps->hypers[i];
	return NULL;
}

static bool plan_num(PlanCtx *pc, const Source *src, Expr *e, Num *out)
{
	Eval ev = {pc->a, src, pc->ps->hypers, pc->hypers_ok ? pc->ps->nhypers : 0, NULL, 0, true};
	return eval_num(&ev, e, out);
}

/* An integer-valued constant; reports "WHAT must be an integer" otherwise. */
static bool plan_int(PlanCtx *pc, const Source *src, Expr *e, const char *what, long long *out)
{
	Num v;
	if (!plan_num(pc, src, e, &v))
		return false;
	if (!v.is_int) {
		diag_error(src, e->loc, "%s must be an integer, not %g", what, v.v);
		return false;
	}
	*out = v.i;
	return true;
}

static void unknown_key(PlanCtx *pc, Arg *a, const char *word, const char *const *keys, int n)
{
	diag_error(pc->src, a->key_loc, "unknown key '%s' in %s", a->key, word);
	if (best_guess(a->key, keys, n))
		suggest(a->key, keys, n);
	else
		diag_note_plain("%s takes %s", word, word_list(pc->a, keys, n, " and "));
}

static void unknown_word(PlanCtx *pc, const Source *src, Expr *e, const char *what, const char *const *words, int n)
{
	diag_error(src, e->loc, "unknown %s '%s'", what, e->kind == E_NAME ? e->text : "?");
	if (e->kind == E_NAME && best_guess(e->text, words, n))
		suggest(e->text, words, n);
	else
		diag_note_plain("expected %s", word_list(pc->a, words, n, " or "));
}

/* The word an expression spells (a name), or NULL. */
static const char *word_of(Expr *e) { return e && e->kind == E_NAME ? e->text : NULL; }

static void axes_note(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	if (ps->naxes == 0) {
		diag_note_plain("the plan has no mesh statement; declare the axes with e.g. 'mesh data = 2'");
		return;
	}
	const char *names[MAX_AXES];
	for (int i = 0; i < ps->naxes; i++)
		names[i] = ps->axes[i].name;
	diag_note_plain("the mesh axes are %s", word_list(pc->a, names, ps->naxes, " and "));
}

/* A mesh axis named by e, with strategy parameters substituted. -1 after reporting. */
/* Only the innermost frame binds: a `use` inside a strategy resolves its arguments when binding. */
static ArgBind *frame_bind(const Frame *fr, const char *name)
{
	for (int i = 0; i < fr->nbinds; i++)
		if (!strcmp(fr->binds[i].name, name))
			return &fr->binds[i];
	return NULL;
}

/* e with the strategy parameter it names replaced by its binding; *src and *where: the file and
 * the frame whose text holds the result. */
static Expr *resolve_bound(const Frame *fr, Expr *e, const Source **src, ArgBind **bind, const Frame **where)
{
	*src = fr->src;
	*bind = NULL;
	if (where)
		*where = fr;
	if (e && e->kind == E_NAME) {
		ArgBind *b = frame_bind(fr, e->text);
		if (b) {
			*src = b->src;
			*bind = b;
			if (where)
				*where = b->frame;
			return b->e;
		}
	}
	return e;
}

static int resolve_axis(PlanCtx *pc, const Frame *fr, Expr *raw)
{
	const Source *src;
	ArgBind *b;
	const Frame *where;
	Expr *e = resolve_bound(fr, raw, &src, &b, &where);
	if (b && b->reported)
		return -1;
	if (e->kind != E_NAME) {
		perr(where, src, e->loc, "expected a mesh axis name");
		if (b)
			b->reported = true;
		return -1;
	}
	int i = axis_index(pc->ps, e->text);
	if (i >= 0) {
		pc->axis_used[i] = true;
		return i;
	}
	perr(where, src, e->loc, "unknown mesh axis '%s'", e->text);
	const char *names[MAX_AXES];
	for (int k = 0; k < pc->ps->naxes; k++)
		names[k] = pc->ps->axes[k].name;
	if (best_guess(e->text, names, pc->ps->naxes))
		suggest(e->text, names, pc->ps->naxes);
	else
		axes_note(pc);
	if (b)
		b->reported = true;
	return -1;
}

static ShardRule *add_rule(PlanCtx *pc, const Frame *fr, const Source *src, Loc loc)
{
	PlanSpec *ps = pc->ps;
	if (ps->nrules == pc->capnotes) {
		int cap = pc->capnotes ? pc->capnotes * 2 : 32;
		ShardRule *r = arena_alloc(pc->a, sizeof *r * (size_t)cap);
		RuleNote *n = arena_alloc(pc->a, sizeof *n * (size_t)cap);
		if (ps->nrules) {
			memcpy(r, ps->rules, sizeof *r * (size_t)ps->nrules);
			memcpy(n, pc->notes, sizeof *n * (size_t)ps->nrules);
		}
		ps->rules = r;
		pc->notes = n;
		pc->capnotes = cap;
	}
	ShardRule *r = &ps->rules[ps->nrules];
	RuleNote *n = &pc->notes[ps->nrules];
	ps->nrules++;
	memset(r, 0, sizeof *r);
	memset(n, 0, sizeof *n);
	/* rules from strategies are located at the outermost `use` in the plan, where the user can
	 * change them; the note keeps the rule's own place */
	if (fr->strategy) {
		const Frame *f = fr;
		while (f->up && f->up->strategy)
			f = f->up;
		r->loc = f->use_loc;
		r->src = f->use_src;
		n->strategy = fr->strategy->name;
		r->strategy = fr->strategy->name;
		n->use_src = fr->use_src;
		n->use_loc = fr->use_loc;
	} else {
		r->loc = loc;
		r->src = src;
	}
	n->src = src;
	n->loc = loc;
	r->stage = -1;
	return r;
}

/* Builds the dotted pattern of a parameter rule: names, `*` and integer segments. */
static bool pattern_text(Expr *e, char *buf, size_t cap, size_t *len)
{
	const char *seg = NULL;
	char num[32];
	if (e->kind == E_NAME) {
		seg = e->text;
	} else if (e->kind == E_STAR) {
		seg = "*";
	} else if (e->kind == E_INT) {
		snprintf(num, sizeof num, "%lld", e->ival);
		seg = num;
	} else if (e->kind == E_MEMBER) {
		if (!pattern_text(e->lhs, buf, cap, len))
			return false;
		if (e->rhs && e->rhs->kind == E_STAR)
			seg = "*";
		else if (e->rhs && e->rhs->kind == E_INT) {
			snprintf(num, sizeof num, "%lld", e->rhs->ival);
			seg = num;
		} else
			seg = e->text;
		if (!seg)
			return false;
		if (*len + 1 >= cap)
			return false;
		buf[(*len)++] = '.';
		buf[*len] = 0;
	} else {
		return false;
	}
	size_t n = strlen(seg);
	if (*len + n + 1 >= cap)
		return false;
	memcpy(buf + *len, seg, n + 1);
	*len += n;
	return true;
}

static bool is_dim_name(PlanCtx *pc, const char *name)
{
	return word_index(name, pc->mi.hypers.v, pc->mi.hypers.n) >= 0 ||
	       word_index(name, pc->mi.free_dims.v, pc->mi.free_dims.n) >= 0;
}

static int moe_rule_target(Expr *lhs, Expr **pattern);
static void moe_rule(PlanCtx *pc, const Frame *fr, Expr *e, int kind, Expr *pat, int stage);
static void ring_rule(PlanCtx *pc, const Frame *fr, Expr *e, int stage);

/* `DIM -> AXIS`: the model's dim DIM split over mesh axis AXIS. */
static void dim_rule(PlanCtx *pc, const Frame *fr, Expr *e, int stage)
{
	const Source *fsrc = fr->src;
	bool quiet = fr->strategy != NULL;
	const Source *dsrc;
	ArgBind *db;
	const Frame *dwhere;
	Expr *d = resolve_bound(fr, e->lhs, &dsrc, &db, &dwhere);
	if (d->kind != E_NAME) {
		if (!quiet || db) {
			perr(dwhere, dsrc, d->loc, "expected a dimension name before '->'");
			diag_note_plain("a parameter layout is written 'PATTERN : [LAYOUT]'");
		}
		return;
	}
	if (pc->model && !is_dim_name(pc, d->text)) {
		if (db && db->reported)
			return;
		perr(dwhere, dsrc, d->loc, "'%s' is not a dimension of model '%s'", d->text, pc->model->name);
		Names ns = {0};
		for (int i = 0; i < pc->mi.hypers.n; i++)
			names_add(pc->a, &ns, pc->mi.hypers.v[i]);
		for (int i = 0; i < pc->mi.free_dims.n; i++)
			names_add(pc->a, &ns, pc->mi.free_dims.v[i]);
		if (best_guess(d->text, ns.v, ns.n))
			suggest(d->text, ns.v, ns.n);
		else
			diag_note_plain("a dim rule names a hyperparameter or a batch dim of the model's inputs: %s",
			                word_list(pc->a, ns.v, ns.n, " or "));
		if (db)
			db->reported = true;
		return;
	}
	int ax = resolve_axis(pc, fr, e->rhs);
	if (ax < 0)
		return;
	/* the same dim over the same axis twice */
	for (int i = 0; i < pc->ps->nrules; i++) {
		ShardRule *o = &pc->ps->rules[i];
		if (o->dim_name && !strcmp(o->dim_name, d->text) && o->axis == ax && o->stage == stage) {
			perr(fr, fsrc, e->loc, "dimension %s is already split over mesh axis '%s'", d->text,
			     pc->ps->axes[ax].name);
			diag_note(pc->notes[i].src, pc->notes[i].loc, "by this rule");
			rule_notes(&pc->notes[i]);
			return;
		}
	}
	ShardRule *r = add_rule(pc, fr, fsrc, e->loc);
	r->dim_name = d->text;
	r->axis = ax;
	r->stage = stage;
}

enum { MAX_RULE_PATTERNS = 64, MAX_PATTERN_TEXT = 256 };

/* A parameter rule's patterns as text: bound (its left side, resolved where and from src; bind:
 * the strategy parameter it came through, or NULL) is a pattern or a list of them. Returns their
 * count, or -1 after an error. */
static int pattern_texts(const Frame *where, const Source *src, const ArgBind *bind, bool quiet, Expr *bound,
			 Expr **pats, char (*texts)[MAX_PATTERN_TEXT])
{
	int npats = 0;
	if (bound->kind == E_LIST) {
		for (Expr *x = bound->items; x; x = x->next) {
			if (npats == MAX_RULE_PATTERNS) {
				perr(where, src, x->loc, "at most 64 patterns in one list");
				return -1;
			}
			pats[npats++] = x;
		}
	} else {
		pats[npats++] = bound;
	}
	for (int i = 0; i < npats; i++) {
		size_t len = 0;
		texts[i][0] = 0;
		if (!pattern_text(pats[i], texts[i], MAX_PATTERN_TEXT, &len)) {
			if (!quiet || bind) {
				perr(where, src, pats[i]->loc, "expected a parameter pattern%s", bind ? "" : " before ':'");
				diag_note_plain("a pattern is a dotted parameter path where '*' matches one segment: layers.*.mlp.w1");
			}
			return -1;
		}
	}
	return npats;
}

/* A layout `[_, AXIS, ...]`: per entry the mesh axis, or -1 for '_'. Returns the entry count, or
 * -1 after an error. */
static int layout_axes(PlanCtx *pc, const Frame *fr, Expr *layout, int *axes)
{
	const Source *fsrc = fr->src;
	bool quiet = fr->strategy != NULL;
	if (layout->kind != E_LIST) {
		if (!quiet) {
			diag_error(fsrc, layout->loc, "expected a layout: [_, AXIS, ...] with one entry per dimension");
		}
		return -1;
	}
	Expr *ents[MAX_DIMS];
	int n = 0;
	bool ok = true;
	for (Expr *x = layout->items; x; x = x->next) {
		if (n == MAX_DIMS) {
			if (!quiet)
				diag_error(fsrc, x->loc, "a layout has at most %d entries", MAX_DIMS);
			return -1;
		}
		const Source *xsrc;
		ArgBind *xb;
		const Frame *xwhere;
		Expr *v = resolve_bound(fr, x, &xsrc, &xb, &xwhere);
		if (v->kind == E_NAME && !strcmp(v->text, "_")) {
			axes[n] = -1;
		} else if (v->kind == E_NAME) {
			axes[n] = resolve_axis(pc, fr, x);
			if (axes[n] < 0)
				ok = false;
		} else {
			if (!quiet || xb)
				perr(xwhere, xsrc, v->loc, "a layout entry is '_' or a mesh axis");
			axes[n] = -1;
			ok = false;
		}
		ents[n] = x;
		n++;
	}
	if (!ok)
		return -1;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < i; j++)
			if (axes[i] >= 0 && axes[i] == axes[j]) {
				perr(fr, fsrc, ents[i]->loc, "mesh axis '%s' used twice in one layout", pc->ps->axes[axes[i]].name);
				diag_note_plain("a dimension can be split over an axis only once per tensor; use '_' for one of them");
				return -1;
			}
	return n;
}

/* `PATTERN : [LAYOUT]`. The pattern may be a strategy parameter bound to a pattern or to a list
 * of them (`shard column : [_, axis]`, used with `column = [layers.*.attn.wq, layers.*.mlp.w1]`):
 * one rule per pattern, located at the pattern where the plan wrote it. */
static void param_rule(PlanCtx *pc, const Frame *fr, Expr *e, int stage)
{
	const Source *psrc;
	ArgBind *pb;
	const Frame *pwhere;
	Expr *bound = resolve_bound(fr, e->lhs, &psrc, &pb, &pwhere);
	Expr *pats[MAX_RULE_PATTERNS];
	char texts[MAX_RULE_PATTERNS][MAX_PATTERN_TEXT];
	int npats = pattern_texts(pwhere, psrc, pb, fr->strategy != NULL, bound, pats, texts);
	if (npats < 0)
		return;
	int axes[MAX_DIMS];
	int n = layout_axes(pc, fr, e->rhs, axes);
	if (n < 0)
		return;
	for (int k = 0; k < npats; k++) {
		ShardRule *r = add_rule(pc, fr, fr->src, e->loc);
		if (pb && pwhere && !pwhere->strategy) { /* a pattern the plan passed: errors point at it */
			r->loc = pats[k]->loc;
			r->src = psrc;
		}
		r->pattern = arena_strdup(pc->a, texts[k]);
		r->ndims = n;
		for (int i = 0; i < n; i++)
			r->axes[i] = axes[i];
		r->stage = stage;
	}
}

/* One `shard` argument: `DIM -> AXIS` or `PATTERN : [LAYOUT]`. quiet: the rule's form was
 * already checked (strategies are checked once in sema_check). */
static void shard_rule(PlanCtx *pc, const Frame *fr, Arg *arg, int stage)
{
	bool quiet = fr->strategy != NULL;
	Expr *e = arg->value;
	if (arg->key || !e || e->kind != E_BINARY || (e->op != 'A' && e->op != ':')) {
		if (!quiet) {
			diag_error(fr->src, arg->loc, "expected a shard rule");
			diag_note_plain("write 'shard DIM -> AXIS' (e.g. B -> data) or 'shard PATTERN : [LAYOUT]' (e.g. layers.*.mlp.w1 : [_, tensor])");
		}
		return;
	}
	if (e->op != 'A') {
		param_rule(pc, fr, e, stage);
		return;
	}
	Expr *moe_pat;
	int moe = moe_rule_target(e->lhs, &moe_pat);
	Expr *ring_name = e->lhs && e->lhs->kind == E_CALL ? e->lhs->lhs : e->lhs;
	if (ring_name && ring_name->kind == E_NAME && !strcmp(ring_name->text, "ring_attention"))
		ring_rule(pc, fr, e, stage);
	else if (moe)
		moe_rule(pc, fr, e, moe, moe_pat, stage);
	else
		dim_rule(pc, fr, e, stage);
}

static void plan_stmts(PlanCtx *pc, const Frame *fr, PlanStmt *st, int stage);

/* The layout argument of `shard ring_attention(LAYOUT) -> AXIS`: balanced (the default: under a
 * causal mask each rank holds two mirrored chunks) or contiguous; false after an error. */
static bool ring_layout(const Frame *fr, const Expr *lhs, bool *contiguous)
{
	*contiguous = false;
	if (lhs->kind != E_CALL)
		return true;
	const Expr *v = lhs->args && !lhs->args->next && !lhs->args->key ? lhs->args->value : NULL;
	if (v && v->kind == E_NAME && (!strcmp(v->text, "contiguous") || !strcmp(v->text, "balanced"))) {
		*contiguous = !strcmp(v->text, "contiguous");
		return true;
	}
	perr(fr, fr->src, lhs->loc, "'ring_attention' takes one layout: balanced or contiguous");
	diag_note_plain("balanced (the default) gives each rank two mirrored chunks of the sequence, so a causal mask "
			"leaves every rank the same work; contiguous gives each rank one block");
	return false;
}

/* `shard ring_attention[(LAYOUT)] -> AXIS` (nn.context_parallel, docs/attention.md): attention over
 * a sequence split on AXIS passes K/V around a ring instead of gathering them. One axis per plan,
 * for every stage. */
static void ring_rule(PlanCtx *pc, const Frame *fr, Expr *e, int stage)
{
	bool contiguous;
	if (!ring_layout(fr, e->lhs, &contiguous))
		return;
	int ax = resolve_axis(pc, fr, e->rhs);
	if (ax < 0)
		return;
	PlanSpec *ps = pc->ps;
	if (stage >= 0) {
		perr(fr, fr->src, e->loc, "ring attention applies to every stage, not to one stage block");
		diag_note_plain("move 'shard ring_attention -> %s' (or 'use nn.context_parallel(%s)') out of the stage block",
				ps->axes[ax].name, ps->axes[ax].name);
		return;
	}
	if (ps->ring_axis >= 0 && ps->ring_axis != ax) {
		perr(fr, fr->src, e->loc, "attention already passes K/V around a ring over mesh axis '%s'",
		     ps->axes[ps->ring_axis].name);
		diag_note(ps->ring_src, ps->ring_loc, "the ring is set here");
		return;
	}
	ps->ring_axis = ax;
	ps->ring_contiguous = contiguous;
	ps->ring_loc = e->loc;
	ps->ring_src = fr->src;
	if (fr->strategy) { /* located at the outermost `use` in the plan, as other strategy rules */
		const Frame *f = fr;
		while (f->up && f->up->strategy)
			f = f->up;
		ps->ring_loc = f->use_loc;
		ps->ring_src = f->use_src;
	}
}

/* The target of an expert rule: `experts` or `expert_hidden`, bare or with a parameter pattern
 * (`experts(layers.*.ffn.*)`); *pattern is that argument or NULL. */
static int moe_rule_target(Expr *lhs, Expr **pattern)
{
	*pattern = NULL;
	Expr *name = lhs && lhs->kind == E_CALL ? lhs->lhs : lhs;
	if (!name || name->kind != E_NAME)
		return MOE_RULE_NONE;
	int kind = !strcmp(name->text, "experts") ? MOE_RULE_EXPERTS
		   : !strcmp(name->text, "expert_hidden") ? MOE_RULE_HIDDEN : MOE_RULE_NONE;
	if (kind && lhs->kind == E_CALL) {
		if (!lhs->args || lhs->args->next || lhs->args->key)
			return -kind; /* malformed: one positional pattern */
		*pattern = lhs->args->value;
	}
	return kind;
}

/* `shard experts[(PATTERN)] -> AXIS`, `shard expert_hidden[(PATTERN)] -> AXIS` (docs/moe.md) */
static void moe_rule(PlanCtx *pc, const Frame *fr, Expr *e, int kind, Expr *pat, int stage)
{
	const char *what = kind == MOE_RULE_EXPERTS ? "experts" : "expert_hidden";
	if (kind < 0) {
		perr(fr, fr->src, e->lhs->loc, "'%s' takes one parameter pattern", kind == -MOE_RULE_EXPERTS ? "experts" : "expert_hidden");
		diag_note_plain("e.g. shard experts(layers.*.ffn.*) -> data, or shard experts -> data for every expert");
		return;
	}
	char buf[256] = "";
	size_t len = 0;
	if (pat) {
		const Source *psrc;
		ArgBind *pb;
		const Frame *pwhere;
		Expr *x = resolve_bound(fr, pat, &psrc, &pb, &pwhere);
		if (!pattern_text(x, buf, sizeof buf, &len)) {
			if (!pb || !pb->reported) {
				perr(pwhere, psrc, x->loc, "expected a parameter pattern in %s(...)", what);
				diag_note_plain("a pattern is a dotted parameter path where '*' matches whole segments: layers.*.moe.*");
			}
			if (pb)
				pb->reported = true;
			return;
		}
	}
	int ax = resolve_axis(pc, fr, e->rhs);
	if (ax < 0)
		return;
	ShardRule *r = add_rule(pc, fr, fr->src, e->loc);
	r->moe = kind;
	r->moe_pattern = pat && strcmp(buf, "*") ? arena_strdup(pc->a, buf) : NULL;
	r->axis = ax;
	r->stage = stage;
}

/* `use STRATEGY(args)`: binds the strategy's parameters and expands its rules. */
static void use_strategy(PlanCtx *pc, const Frame *fr, Arg *arg, int stage)
{
	const Source *src = fr->src;
	bool quiet = fr->strategy != NULL;
	Expr *e = arg->value;
	Expr *callee = e && e->kind == E_CALL ? e->lhs : e;
	Arg *args = e && e->kind == E_CALL ? e->args : NULL;
	const Module *m = fr->mod;
	const char *name = NULL, *alias = NULL;
	if (arg->key || !callee) {
		if (!quiet)
			diag_error(src, arg->loc, "expected a strategy: use NAME(args)");
		return;
	}
	if (callee->kind == E_NAME) {
		name = callee->text;
	} else if (callee->kind == E_MEMBER && callee->lhs->kind == E_NAME && callee->text) {
		alias = callee->lhs->text;
		name = callee->text;
		Item *imp = import_of(fr->mod, alias);
		if (!imp) {
			if (!quiet) {
				diag_error(src, callee->lhs->loc, "unknown module '%s'", alias);
				Names ns = {0};
				for (Item *it = fr->mod->items; it; it = it->next)
					if (it->kind == I_IMPORT)
						names_add(pc->a, &ns, it->alias);
				if (best_guess(alias, ns.v, ns.n))
					suggest(alias, ns.v, ns.n);
				else
					diag_note_plain("import it first: import std.%s", alias);
			}
			return;
		}
		m = module_by_import(pc->prog, imp->name);
		if (!m)
			return; /* load.c reported the missing module */
	} else {
		if (!quiet)
			diag_error(src, callee->loc, "expected a strategy name");
		return;
	}
	Item *strat = module_item(m, name, I_STRATEGY);
	const char *shown = alias ? arena_printf(pc->a, "%s.%s", alias, name) : name;
	if (!strat) {
		if (quiet)
			return;
		Item *other = module_item(m, name, -1);
		if (other) {
			diag_error(src, callee->loc, "'%s' is a %s, not a strategy", shown, item_kind_name(other->kind));
			return;
		}
		diag_error(src, callee->loc, "unknown strategy '%s'", shown);
		Names ns = {0};
		item_names(pc->a, &ns, m, I_STRATEGY, alias);
		suggest(shown, ns.v, ns.n);
		return;
	}
	if (fr->depth >= 8) {
		perr(fr, src, callee->loc, "strategy '%s' is used inside itself", shown);
		return;
	}
	int nparams = 0;
	for (Param *p = strat->params; p; p = p->next)
		nparams++;
	ArgBind *binds = arena_alloc(pc->a, sizeof *binds * (size_t)(nparams + 1));
	bool ok = true;
	int pos = 0;
	for (Param *p = strat->params; p; p = p->next)
		binds[pos++].name = p->name;
	pos = 0;
	for (Arg *a = args; a; a = a->next) {
		int i;
		if (!a->key) {
			if (pos >= nparams) {
				if (!quiet) {
					diag_error(src, a->loc, "too many arguments to strategy '%s': it takes %d", shown, nparams);
					diag_note(&strat->module->src, strat->name_loc, "'%s' is defined here", strat->name);
				}
				ok = false;
				break;
			}
			i = pos++;
		} else {
			i = 0;
			while (i < nparams && strcmp(binds[i].name, a->key))
				i++;
			if (i == nparams) {
				if (!quiet) {
					diag_error(src, a->key_loc, "strategy '%s' has no parameter '%s'", shown, a->key);
					Names ns = {0};
					for (int k = 0; k < nparams; k++)
						names_add(pc->a, &ns, binds[k].name);
					suggest(a->key, ns.v, ns.n);
				}
				ok = false;
				continue;
			}
			if (binds[i].e) {
				if (!quiet)
					diag_error(src, a->key_loc, "argument '%s' is given twice", a->key);
				ok = false;
				continue;
			}
		}
		/* an argument that names a parameter of the enclosing strategy passes its binding on */
		const Source *vsrc;
		ArgBind *vb;
		const Frame *vwhere;
		binds[i].e = resolve_bound(fr, a->value, &vsrc, &vb, &vwhere);
		binds[i].src = vsrc;
		binds[i].frame = vwhere;
	}
	pos = 0;
	for (Param *p = strat->params; p; p = p->next, pos++) {
		if (binds[pos].e)
			continue;
		if (p->def) {
			binds[pos].e = p->def;
			binds[pos].src = &strat->module->src;
			binds[pos].frame = NULL;
			continue;
		}
		if (!quiet) {
			diag_error(src, e->loc, "missing argument '%s' of strategy '%s'", p->name, shown);
			diag_note(&strat->module->src, p->loc, "'%s' has no default", p->name);
		}
		ok = false;
	}
	if (!ok)
		return;
	Frame sub = {strat, strat->module, &strat->module->src, src, arg->loc, binds, nparams, fr, fr->depth + 1};
	pos = 0;
	for (Param *p = strat->params; p; p = p->next, pos++)
		if (!binds[pos].frame)
			binds[pos].frame = &sub; /* a default, written in the strategy itself */
	plan_stmts(pc, &sub, strat->rules, stage);
}

/* The rule statements of a plan, a strategy or a stage block: shard, use, stage. Other words
 * are handled by sema_plan (plans) or rejected by check_strategy (strategies). */
static void plan_stmts(PlanCtx *pc, const Frame *fr, PlanStmt *st, int stage)
{
	for (; st; st = st->next) {
		int w = word_index(st->word, plan_words, NWORDS);
		if (w == W_SHARD) {
			for (Arg *a = st->args; a; a = a->next)
				shard_rule(pc, fr, a, stage);
		} else if (w == W_USE) {
			if (!st->args && !fr->strategy)
				diag_error(fr->src, st->word_loc, "use needs a strategy: use NAME(args)");
			for (Arg *a = st->args; a; a = a->next)
				use_strategy(pc, fr, a, stage);
		} else if (w == W_STAGE) {
			bool quiet = fr->strategy != NULL;
			if (stage >= 0) {
				if (!quiet)
					diag_error(fr->src, st->word_loc, "stage blocks cannot be nested");
				continue;
			}
			long long n = -1;
			if (!st->args || st->args->key || st->args->next) {
				if (!quiet)
					diag_error(fr->src, st->word_loc, "expected a stage number: stage N { rules }");
				continue;
			}
			if (!plan_int(pc, fr->src, st->args->value, "a stage number", &n))
				continue;
			if (pc->ps->pipe_axis < 0) {
				perr(fr, fr->src, st->loc, "stage rules need a pipeline statement");
				diag_note_plain("stages are the pipeline's: add e.g. 'pipeline pipe: 1f1b'");
				continue;
			}
			if (n < 0 || n >= pc->ps->stages) {
				perr(fr, fr->src, st->args->value->loc, "stage %lld does not exist: the pipeline has stages 0..%d", n,
				     pc->ps->stages - 1);
				continue;
			}
			for (PlanStmt *b = st->body; b; b = b->next) {
				int bw = word_index(b->word, plan_words, NWORDS);
				if (bw != W_SHARD && bw != W_USE) {
					if (!quiet)
						diag_error(fr->src, b->word_loc, "only shard and use rules may appear in a stage block");
					continue;
				}
				PlanStmt one = *b;
				one.next = NULL;
				plan_stmts(pc, fr, &one, (int)n);
			}
		}
	}
}

/* ------------------------------------------------------------------ plan statements */

static void plan_mesh(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	long long world = 1;
	if (!st->args)
		diag_error(pc->src, st->word_loc, "mesh needs at least one axis: mesh data = 2");
	for (Arg *a = st->args; a; a = a->next) {
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected AXIS = SIZE");
			diag_note_plain("e.g. mesh data = 2, tensor = 4");
			continue;
		}
		if (!strcmp(a->key, "_") || !strcmp(a->key, "over")) {
			diag_error(pc->src, a->key_loc, "'%s' cannot name a mesh axis", a->key);
			continue;
		}
		int prev = axis_index(ps, a->key);
		if (prev >= 0) {
			diag_error(pc->src, a->key_loc, "mesh axis '%s' is declared twice", a->key);
			diag_note(pc->src, ps->axes[prev].loc, "first declared here");
			continue;
		}
		long long size;
		if (!plan_int(pc, pc->src, a->value, "a mesh axis size", &size))
			continue;
		if (size < 1) {
			diag_error(pc->src, a->value->loc, "mesh axis '%s' has size %lld; sizes are at least 1", a->key, size);
			continue;
		}
		if (ps->naxes == MAX_AXES) {
			diag_error(pc->src, a->key_loc, "too many mesh axes: at most %d", MAX_AXES);
			continue;
		}
		if (size > (1 << 24) || world * size > (1 << 24)) {
			diag_error(pc->src, a->value->loc, "a mesh of more than %d ranks is not supported", 1 << 24);
			continue;
		}
		world *= size;
		ps->axes[ps->naxes++] = (MeshAxis){a->key, (int)size, a->key_loc};
	}
	ps->world = (int)world;
}

/* the index of the model's hyperparameter named by override a (from src), or -1 after saying
 * that the model has none of that name */
static int hyper_index(PlanCtx *pc, const Source *src, const Arg *a)
{
	int n = pc->mi.hypers.n, i = word_index(a->key, pc->mi.hypers.v, n);
	if (i < 0) {
		diag_error(src, a->key_loc, "model '%s' has no hyperparameter '%s'", pc->model->name, a->key);
		if (best_guess(a->key, pc->mi.hypers.v, n))
			suggest(a->key, pc->mi.hypers.v, n);
		else if (n)
			diag_note_plain("its hyperparameters are %s", word_list(pc->a, pc->mi.hypers.v, n, " and "));
	}
	return i;
}

/* The model's hyperparameters: its defaults, the plan's `for model(...)` overrides, then the
 * command line's --model-arg ones (load_model_args), which win over both: a test or a user can
 * run a plan at other sizes without editing the file. */
static bool plan_hypers(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	Item *model = pc->model, *plan = pc->ps->plan;
	int n = pc->mi.hypers.n;
	bool ok = true;
	Arg **over = arena_alloc(pc->a, sizeof *over * (size_t)(n + 1));
	const Source **from = arena_alloc(pc->a, sizeof *from * (size_t)(n + 1)); /* each override's source */
	int pos = 0;
	for (Arg *a = plan->model_args; a; a = a->next) {
		int i;
		if (!a->key) {
			if (pos >= n) {
				diag_error(pc->src, a->loc, "too many arguments for model '%s': it has %d hyperparameters", model->name, n);
				ok = false;
				continue;
			}
			i = pos++;
		} else if ((i = hyper_index(pc, pc->src, a)) < 0) {
			ok = false;
			continue;
		}
		if (over[i]) {
			diag_error(pc->src, a->key ? a->key_loc : a->loc, "hyperparameter '%s' is given twice", pc->mi.hypers.v[i]);
			diag_note(pc->src, over[i]->loc, "first given here");
			ok = false;
			continue;
		}
		over[i] = a;
		from[i] = pc->src;
	}
	for (Arg *a = pc->prog->model_args; a; a = a->next) {
		int i = hyper_index(pc, pc->prog->model_args_src, a);
		if (i < 0) {
			ok = false;
			continue;
		}
		over[i] = a;
		from[i] = pc->prog->model_args_src;
	}
	ps->hypers = arena_alloc(pc->a, sizeof *ps->hypers * (size_t)(n + 1));
	int i = 0;
	for (Param *q = model->params; q; q = q->next, i++) {
		Expr *e = over[i] ? over[i]->value : q->def;
		const Source *src = over[i] ? from[i] : &model->module->src;
		Num v = {0, true, 0};
		if (!e) {
			diag_error(pc->src, plan->for_loc, "hyperparameter '%s' of model '%s' has no value", q->name, model->name);
			diag_note_plain("give it one: plan %s for %s(%s = ...)", plan->name, model->name, q->name);
			ok = false;
		} else {
			Eval ev = {pc->a, src, ps->hypers, i, pc->mi.hypers.v + i + 1, n - i - 1, true};
			if (!eval_num(&ev, e, &v))
				ok = false;
		}
		ps->hypers[i] = (HyperValue){q->name, v.v, v.is_int, e ? e->loc : q->loc, src, v.i};
	}
	ps->nhypers = n;
	return ok;
}

static void plan_batch(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	for (Arg *a = st->args; a; a = a->next) {
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected DIM = SIZE");
			diag_note_plain("e.g. batch B = 32, micro_batches = 4");
			continue;
		}
		if (!strcmp(a->key, "micro_batches")) {
			long long mb;
			if (pc->mb_value) {
				diag_error(pc->src, a->key_loc, "micro_batches is given twice");
				continue;
			}
			pc->mb_value = a->value;
			if (!plan_int(pc, pc->src, a->value, "micro_batches", &mb))
				continue;
			if (mb < 1 || mb > INT_MAX) {
				diag_error(pc->src, a->value->loc, "micro_batches must be at least 1, not %lld", mb);
				continue;
			}
			ps->micro_batches = (int)mb;
			continue;
		}
		if (pc->batch_value) {
			if (word_index(a->key, pc->mi.free_dims.v, pc->mi.free_dims.n) >= 0 || !best_guess(a->key, batch_keys, 1))
				diag_error(pc->src, a->key_loc, "batch sets one batch dim; '%s' is a second one", a->key);
			else
				unknown_key(pc, a, "batch", batch_keys, 1);
			continue;
		}
		if (pc->model && word_index(a->key, pc->mi.free_dims.v, pc->mi.free_dims.n) < 0) {
			if (best_guess(a->key, batch_keys, 1) && !best_guess(a->key, pc->mi.free_dims.v, pc->mi.free_dims.n)) {
				unknown_key(pc, a, "batch", batch_keys, 1);
				continue;
			}
			if (word_index(a->key, pc->mi.hypers.v, pc->mi.hypers.n) >= 0)
				diag_error(pc->src, a->key_loc, "'%s' is a hyperparameter of model '%s', not its batch dimension", a->key,
				           pc->model->name);
			else
				diag_error(pc->src, a->key_loc, "'%s' is not a batch dimension of model '%s'", a->key, pc->model->name);
			if (best_guess(a->key, pc->mi.free_dims.v, pc->mi.free_dims.n))
				suggest(a->key, pc->mi.free_dims.v, pc->mi.free_dims.n);
			else if (pc->mi.free_dims.n)
				diag_note_plain("the batch dim is a dim of the model's inputs that is not a hyperparameter: %s",
				                word_list(pc->a, pc->mi.free_dims.v, pc->mi.free_dims.n, " or "));
			else
				diag_note_plain("the model's inputs have no dim besides its hyperparameters");
			pc->batch_value = a->value;
			continue;
		}
		pc->batch_value = a->value;
		long long b;
		if (!plan_int(pc, pc->src, a->value, "the batch size", &b))
			continue;
		if (b < 1) {
			diag_error(pc->src, a->value->loc, "batch size must be at least 1, not %lld", b);
			continue;
		}
		ps->batch_dim = a->key;
		ps->batch = b;
		ps->batch_loc = a->loc;
	}
	if (!pc->batch_value)
		diag_error(pc->src, st->word_loc, "batch needs the batch size: batch %s = 32",
		           pc->mi.free_dims.n ? pc->mi.free_dims.v[0] : "B");
}

/* `stages = [0..5, 6..11]`: contiguous ranges covering 0..L-1, one per (virtual) stage. */
static void pipeline_ranges(PlanCtx *pc, Expr *list, int want)
{
	PlanSpec *ps = pc->ps;
	int n = 0;
	long long next = 0;
	Expr *last = NULL;
	for (Expr *x = list->items; x; x = x->next) {
		long long lo, hi;
		if (x->kind == E_BINARY && x->op == 'R') {
			if (!plan_int(pc, pc->src, x->lhs, "a layer index", &lo) || !plan_int(pc, pc->src, x->rhs, "a layer index", &hi))
				return;
		} else {
			if (!plan_int(pc, pc->src, x, "a layer index", &lo))
				return;
			hi = lo;
		}
		if (hi < lo) {
			diag_error(pc->src, x->loc, "empty layer range %lld..%lld", lo, hi);
			diag_note_plain("ranges are inclusive and ascending: %lld..%lld", hi, lo);
			return;
		}
		if (n == MAX_STAGES) {
			diag_error(pc->src, x->loc, "more than %d stage ranges", MAX_STAGES);
			return;
		}
		if (lo != next) {
			if (n == 0)
				diag_error(pc->src, x->loc, "the first stage starts at layer %lld; it must start at layer 0", lo);
			else if (lo > next)
				diag_error(pc->src, x->loc, "layers %lld..%lld are in no stage", next, lo - 1);
			else
				diag_error(pc->src, x->loc, "layer %lld is in two stages", lo);
			diag_note_plain("stage ranges must be contiguous: each starts where the one before it ends");
			return;
		}
		ps->range_lo[n] = (int)lo;
		ps->range_hi[n] = (int)hi;
		n++;
		next = hi + 1;
		last = x;
	}
	if (n == 0) {
		diag_error(pc->src, list->loc, "stages = [] lists no layer ranges");
		return;
	}
	if (pc->layers_known && next != pc->layers) {
		if (next < pc->layers)
			diag_error(pc->src, last->loc, "layers %lld..%lld are in no stage", next, pc->layers - 1);
		else
			diag_error(pc->src, last->loc, "the ranges end at layer %lld but model '%s' has layers 0..%lld", next - 1,
			           pc->model->name, pc->layers - 1);
		diag_note_plain("the last range must end at layer %lld", pc->layers - 1);
		return;
	}
	if (n != want) {
		diag_error(pc->src, list->loc, "%d layer ranges for %d pipeline stages", n, want);
		if (ps->schedule == SCHED_INTERLEAVED)
			diag_note_plain("interleaved needs one range per model chunk: stages x chunks = %d", want);
		else
			diag_note_plain("give one range per stage of mesh axis '%s'", ps->axes[ps->pipe_axis].name);
		return;
	}
	ps->nranges = n;
}

static void plan_pipeline(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	Expr *axis_e = NULL, *sched_e = NULL, *stages_e = NULL, *chunks_e = NULL, *balance_e = NULL;
	Arg *first = st->args;
	if (first && !first->key) {
		Expr *e = first->value;
		if (e->kind == E_BINARY && e->op == ':') {
			axis_e = e->lhs;
			sched_e = e->rhs;
		} else {
			axis_e = e;
		}
	}
	if (!axis_e) {
		diag_error(pc->src, st->word_loc, "pipeline needs a mesh axis: pipeline AXIS: SCHEDULE");
		diag_note_plain("e.g. pipeline pipe: 1f1b, stages = 4");
		return;
	}
	for (Arg *a = first->next; a; a = a->next) {
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected KEY = VALUE");
			diag_note_plain("pipeline takes %s", word_list(pc->a, pipeline_keys, COUNT(pipeline_keys), " and "));
			continue;
		}
		Expr **slot = !strcmp(a->key, "stages") ? &stages_e : !strcmp(a->key, "chunks") ? &chunks_e
		            : !strcmp(a->key, "balance") ? &balance_e : !strcmp(a->key, "schedule") ? &sched_e : NULL;
		if (!slot) {
			unknown_key(pc, a, "pipeline", pipeline_keys, COUNT(pipeline_keys));
			continue;
		}
		if (*slot) {
			diag_error(pc->src, a->key_loc, "%s is given twice", a->key);
			continue;
		}
		*slot = a->value;
	}
	Frame top = {NULL, pc->ps->plan->module, pc->src, NULL, {0, 0}, NULL, 0, NULL, 0};
	int ax = resolve_axis(pc, &top, axis_e);
	ps->schedule = SCHED_1F1B;
	if (sched_e) {
		int s = word_index(word_of(sched_e), schedules, COUNT(schedules));
		if (s < 0)
			unknown_word(pc, pc->src, sched_e, "pipeline schedule", schedules, COUNT(schedules));
		else
			ps->schedule = (PipeSchedule)(SCHED_GPIPE + s);
	}
	if (balance_e) {
		int b = word_index(word_of(balance_e), balances, COUNT(balances));
		if (b < 0)
			unknown_word(pc, pc->src, balance_e, "balance", balances, COUNT(balances));
		else
			ps->balance = (PipeBalance)b;
	}
	long long chunks = ps->schedule == SCHED_INTERLEAVED ? 2 : 1;
	bool chunks_ok = true;
	if (chunks_e) {
		chunks_ok = plan_int(pc, pc->src, chunks_e, "chunks", &chunks);
		if (chunks_ok && ps->schedule != SCHED_INTERLEAVED && chunks != 1) {
			diag_error(pc->src, chunks_e->loc, "chunks = %lld needs the interleaved schedule", chunks);
			diag_note_plain("chunks is the number of model chunks per rank of pipeline pipe: interleaved");
			chunks_ok = false;
		} else if (chunks_ok && ps->schedule == SCHED_INTERLEAVED && chunks < 2) {
			diag_error(pc->src, chunks_e->loc, "the interleaved schedule needs chunks >= 2, not %lld", chunks);
			diag_note_plain("with one chunk per rank it is 1f1b: write pipeline %s: 1f1b", word_of(axis_e) ? word_of(axis_e) : "pipe");
			chunks_ok = false;
		} else if (chunks_ok && chunks > MAX_STAGES) {
			diag_error(pc->src, chunks_e->loc, "chunks = %lld is more than %d", chunks, MAX_STAGES);
			chunks_ok = false;
		}
	}
	ps->chunks = chunks_ok ? (int)chunks : 1;
	if (ax < 0)
		return;
	ps->pipe_axis = ax;
	ps->pipeline_loc = st->loc;
	int size = ps->axes[ax].size;
	ps->stages = size;
	if (stages_e && stages_e->kind == E_LIST) {
		pc->explicit_pipe_stages = true;
		if (balance_e) {
			diag_error(pc->src, balance_e->loc, "balance cannot be used with explicit stage ranges");
			diag_note_plain("stages = [...] already says which layers each stage holds");
		}
		if (chunks_ok && size * ps->chunks <= MAX_STAGES)
			pipeline_ranges(pc, stages_e, size * ps->chunks);
	} else if (stages_e) {
		long long n;
		if (plan_int(pc, pc->src, stages_e, "stages", &n) && n != size) {
			diag_error(pc->src, stages_e->loc, "stages = %lld but mesh axis '%s' has size %d", n, ps->axes[ax].name, size);
			diag_note_plain("a pipeline has one stage per rank of its axis: write stages = %d or mesh %s = %lld", size,
			                ps->axes[ax].name, n);
		}
	}
	if (!pc->layers_known)
		return;
	Expr *rc = pc->mi.repeat_count;
	const char *lname = rc && rc->kind == E_NAME ? rc->text : "L";
	if (pc->layers == 0) {
		diag_error(pc->src, st->word_loc, "model '%s' has no repeat block to split into pipeline stages", pc->model->name);
		diag_note_plain("a pipeline splits the layers of the model's first top-level repeat");
		return;
	}
	if (pc->layers < size) {
		diag_error(pc->src, axis_e->loc, "model '%s' has %s = %lld layers, fewer than the %d pipeline stages", pc->model->name,
		           lname, pc->layers, size);
		diag_note_plain("every stage needs at least one layer: use at most %lld stages", pc->layers);
		return;
	}
	if (ps->schedule == SCHED_INTERLEAVED && chunks_ok && pc->layers % ((long long)size * ps->chunks) != 0) {
		diag_error(pc->src, chunks_e ? chunks_e->loc : sched_e->loc,
		           "%s = %lld layers cannot be split into %d stages x %d chunks = %d equal model chunks", lname, pc->layers,
		           size, ps->chunks, size * ps->chunks);
		diag_note_plain("the interleaved schedule gives every model chunk the same number of layers");
	}
}

static void plan_zero(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	Expr *stage_e = NULL, *over_e = NULL;
	for (Arg *a = st->args; a; a = a->next) {
		if (!a->key && !stage_e) {
			stage_e = a->value;
		} else if (a->key && !strcmp(a->key, "over") && !over_e) {
			over_e = a->value;
		} else if (a->key && strcmp(a->key, "over")) {
			unknown_key(pc, a, "zero", zero_keys, 1);
		} else {
			diag_error(pc->src, a->loc, "expected zero STAGE over AXIS");
		}
	}
	ps->zero_loc = st->loc;
	if (!stage_e) {
		diag_error(pc->src, st->word_loc, "zero needs a stage: zero 1 over data");
		return;
	}
	long long z;
	if (!plan_int(pc, pc->src, stage_e, "the ZeRO stage", &z))
		return;
	if (z < 0 || z > 3) {
		diag_error(pc->src, stage_e->loc, "ZeRO stage must be 0, 1, 2 or 3, not %lld", z);
		diag_note_plain("1 shards optimizer state, 2 also gradients, 3 also parameters");
		return;
	}
	int ax = -1;
	if (over_e) {
		Frame top = {NULL, pc->ps->plan->module, pc->src, NULL, {0, 0}, NULL, 0, NULL, 0};
		ax = resolve_axis(pc, &top, over_e);
		if (ax < 0)
			return;
	} else if (z > 0) {
		ax = axis_index(ps, "data");
		if (ax < 0) {
			diag_error(pc->src, stage_e->loc, "zero %lld shards over mesh axis 'data', which does not exist", z);
			diag_note_plain("name the data-parallel axis: zero %lld over AXIS", z);
			return;
		}
		pc->axis_used[ax] = true;
	}
	ps->zero_stage = (int)z;
	ps->zero_axis = z > 0 ? ax : -1;
	if (z > 0 && ps->axes[ax].size == 1) {
		pwarn(pc, pc->src, over_e ? over_e->loc : stage_e->loc, "zero %lld over mesh axis '%s' of size 1 shards nothing", z,
		             ps->axes[ax].name);
	}
}

static void plan_offload(PlanCtx *pc, PlanStmt *st, Loc seen[3])
{
	PlanSpec *ps = pc->ps;
	if (!st->args)
		diag_error(pc->src, st->word_loc, "offload needs WHAT -> WHERE: offload optimizer -> host");
	ps->offload_loc = st->loc;
	for (Arg *a = st->args; a; a = a->next) {
		Expr *e = a->value;
		if (a->key || e->kind != E_BINARY || e->op != 'A') {
			diag_error(pc->src, a->loc, "expected WHAT -> WHERE");
			diag_note_plain("e.g. offload optimizer -> host, params -> disk");
			continue;
		}
		int w = word_index(word_of(e->lhs), offload_whats, COUNT(offload_whats));
		int p = word_index(word_of(e->rhs), offload_places, COUNT(offload_places));
		if (w < 0)
			unknown_word(pc, pc->src, e->lhs, "offload target", offload_whats, COUNT(offload_whats));
		if (p < 0)
			unknown_word(pc, pc->src, e->rhs, "offload place", offload_places, COUNT(offload_places));
		if (w < 0 || p < 0)
			continue;
		if (seen[w].len) {
			diag_error(pc->src, e->lhs->loc, "%s is offloaded twice", offload_whats[w]);
			diag_note(pc->src, seen[w], "first offloaded here");
			continue;
		}
		seen[w] = e->loc;
		OffloadPlace place = p == 0 ? PLACE_HOST : PLACE_DISK;
		if (w == 0)
			ps->offload_optimizer = place;
		else if (w == 1)
			ps->offload_params = place;
		else
			ps->offload_activations = place;
	}
}

/* A statement of one mode word (recompute selective, attention unfused): its index in modes, or
 * -1 after the error (expected: the statement's forms, for the message). */
static int plan_mode(PlanCtx *pc, PlanStmt *st, const char *const *modes, int n, const char *what,
		     const char *expected)
{
	Arg *a = st->args;
	if (!a || a->key || a->next) {
		diag_error(pc->src, a && a->next ? a->next->loc : st->word_loc, "expected %s", expected);
		return -1;
	}
	int m = word_index(word_of(a->value), modes, n);
	if (m < 0)
		unknown_word(pc, pc->src, a->value, what, modes, n);
	return m;
}

static void plan_recompute(PlanCtx *pc, PlanStmt *st)
{
	int m = plan_mode(pc, st, recompute_modes, COUNT(recompute_modes), "recompute mode",
			  "recompute none, selective or full");
	if (m < 0)
		return;
	pc->ps->recompute = (RecomputeMode)m;
	if (m == RECOMPUTE_SELECTIVE && pc->model && !pc->mi.uses_recompute_fn) {
		pwarn(pc, pc->src, st->args->value->loc, "recompute selective has nothing to recompute in model '%s'",
		      pc->model->name);
		if (pc->warn)
			diag_note_plain("selective recomputes the fns marked @recompute, and the model calls none");
	}
}

/* attention fused | unfused: whether attention chains become one fused op (graph/attention.c) */
static void plan_attention(PlanCtx *pc, PlanStmt *st)
{
	int m = plan_mode(pc, st, attention_modes, COUNT(attention_modes), "attention mode", "attention fused or unfused");
	if (m >= 0)
		pc->ps->attention_unfused = m == 1;
}

static bool precision_dtype(const char *w, DType *t)
{
	if (!w)
		return false;
	if (!strcmp(w, "f32"))
		*t = DT_F32;
	else if (!strcmp(w, "bf16"))
		*t = DT_BF16;
	else if (!strcmp(w, "fp16") || !strcmp(w, "f16"))
		*t = DT_F16;
	else
		return false;
	return true;
}

static void plan_precision(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	Arg *first = st->args;
	if (!first || first->key) {
		diag_error(pc->src, st->word_loc, "precision needs a dtype: precision bf16, master = f32");
		return;
	}
	DType t;
	if (!precision_dtype(word_of(first->value), &t)) {
		unknown_word(pc, pc->src, first->value, "precision", precisions, COUNT(precisions));
		return;
	}
	Expr *master_e = NULL, *scale_e = NULL;
	for (Arg *a = first->next; a; a = a->next) {
		Expr **slot = !a->key ? NULL : !strcmp(a->key, "master") ? &master_e : !strcmp(a->key, "loss_scale") ? &scale_e : NULL;
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected KEY = VALUE after the dtype");
			diag_note_plain("precision takes master and loss_scale");
			continue;
		}
		if (!slot) {
			unknown_key(pc, a, "precision", precision_keys, COUNT(precision_keys));
			continue;
		}
		if (*slot) {
			diag_error(pc->src, a->key_loc, "%s is given twice", a->key);
			continue;
		}
		*slot = a->value;
	}
	ps->param_dtype = t;
	ps->master_dtype = DT_F32;
	if (master_e) {
		DType m;
		if (!precision_dtype(word_of(master_e), &m)) {
			unknown_word(pc, pc->src, master_e, "master dtype", precisions, COUNT(precisions));
		} else if (m != DT_F32 && m != t) {
			diag_error(pc->src, master_e->loc, "master weights in %s with %s compute", word_of(master_e), word_of(first->value));
			diag_note_plain("master weights are f32 (or the compute dtype itself): write master = f32");
		} else {
			ps->master_dtype = m;
		}
	}
	if (scale_e) {
		Num v;
		if (word_of(scale_e) && !strcmp(word_of(scale_e), "dynamic")) {
			ps->loss_scale = -1;
		} else if (word_of(scale_e)) {
			diag_error(pc->src, scale_e->loc, "loss_scale must be a number or dynamic");
			suggest(word_of(scale_e), (const char *const[]){"dynamic"}, 1);
		} else if (plan_num(pc, pc->src, scale_e, &v)) {
			if (v.v <= 0)
				diag_error(pc->src, scale_e->loc, "loss_scale must be positive, not %g", v.v);
			else
				ps->loss_scale = v.v;
		}
		if (t != DT_F16) {
			pwarn(pc, pc->src, scale_e->loc, "loss_scale has no effect with %s", word_of(first->value));
			ps->loss_scale = 0;
		}
	} else if (t == DT_F16) {
		diag_error(pc->src, first->value->loc, "fp16 training needs loss scaling");
		diag_note_plain("fp16 gradients underflow without it: add loss_scale = dynamic (or use bf16)");
	}
}

/* Parses `betas = (0.9, 0.999)`. */
static bool parse_betas(PlanCtx *pc, Expr *e, double *b1, double *b2)
{
	if (e->kind != E_TUPLE || !e->items || !e->items->next || e->items->next->next) {
		diag_error(pc->src, e->loc, "betas must be a pair: betas = (0.9, 0.999)");
		return false;
	}
	Num v[2];
	Expr *x[2] = {e->items, e->items->next};
	bool ok = true;
	for (int i = 0; i < 2; i++) {
		if (!plan_num(pc, pc->src, x[i], &v[i])) {
			ok = false;
			continue;
		}
		if (v[i].v < 0 || v[i].v >= 1) {
			diag_error(pc->src, x[i]->loc, "beta%d = %g is outside [0, 1)", i + 1, v[i].v);
			ok = false;
		}
	}
	if (ok) {
		*b1 = v[0].v;
		*b2 = v[1].v;
	}
	return ok;
}

static void plan_lr_schedule(PlanCtx *pc, Expr *e)
{
	PlanSpec *ps = pc->ps;
	Expr *callee = e->kind == E_CALL ? e->lhs : e;
	int k = word_index(word_of(callee), lr_schedules, COUNT(lr_schedules));
	if (k < 0) {
		unknown_word(pc, pc->src, callee, "learning-rate schedule", lr_schedules, COUNT(lr_schedules));
		return;
	}
	if (k == 1) {
		if (e->kind == E_CALL && e->args)
			diag_error(pc->src, e->args->loc, "constant takes no arguments");
		return;
	}
	Expr *vals[3] = {NULL, NULL, NULL};
	int pos = 0;
	for (Arg *a = e->kind == E_CALL ? e->args : NULL; a; a = a->next) {
		int i = a->key ? word_index(a->key, cosine_keys, 3) : pos++;
		if (a->key && i < 0) {
			unknown_key(pc, a, "cosine", cosine_keys, 3);
			continue;
		}
		if (i >= 3) {
			diag_error(pc->src, a->loc, "too many arguments to cosine: it takes warmup, total and min_lr");
			continue;
		}
		if (vals[i]) {
			diag_error(pc->src, a->loc, "%s is given twice", cosine_keys[i]);
			continue;
		}
		vals[i] = a->value;
	}
	long long warmup = 0, total = 0;
	if (vals[0] && plan_int(pc, pc->src, vals[0], "warmup", &warmup) && warmup < 0) {
		diag_error(pc->src, vals[0]->loc, "warmup must be at least 0, not %lld", warmup);
		warmup = 0;
	}
	if (!vals[1]) {
		diag_error(pc->src, e->loc, "cosine needs total, the number of steps of the schedule");
		diag_note_plain("e.g. schedule = cosine(warmup = 100, total = 10000, min_lr = 3e-5)");
	} else if (plan_int(pc, pc->src, vals[1], "total", &total) && total < 1) {
		diag_error(pc->src, vals[1]->loc, "total must be at least 1, not %lld", total);
		total = 0;
	}
	if (total > 0 && warmup > total) {
		diag_error(pc->src, vals[0]->loc, "warmup = %lld is longer than the schedule (total = %lld)", warmup, total);
	}
	if (total > INT_MAX || warmup > INT_MAX) {
		diag_error(pc->src, e->loc, "schedule lengths are limited to %d steps", INT_MAX);
		return;
	}
	ps->warmup = (int)warmup;
	ps->total_steps = (int)total;
	if (vals[2]) {
		Num v;
		if (plan_num(pc, pc->src, vals[2], &v)) {
			if (v.v < 0 || v.v > ps->lr)
				diag_error(pc->src, vals[2]->loc, "min_lr = %g must be between 0 and lr = %g", v.v, ps->lr);
			else
				ps->min_lr = v.v;
		}
	}
}

static void plan_optimizer(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	Arg *first = st->args;
	if (!first || first->key) {
		diag_error(pc->src, st->word_loc, "optimizer needs a kind: optimizer adamw(lr = 3e-4)");
		return;
	}
	Expr *e = first->value;
	Expr *callee = e->kind == E_CALL ? e->lhs : e;
	int k = word_index(word_of(callee), optimizers, COUNT(optimizers));
	if (k < 0) {
		unknown_word(pc, pc->src, callee, "optimizer", optimizers, COUNT(optimizers));
		return;
	}
	ps->optimizer = (OptimizerKind)k;
	/* PyTorch's defaults (torch.optim): SGD lr 1e-3; Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8,
	 * weight_decay 0; AdamW the same with weight_decay 1e-2. momentum() is SGD with momentum 0.9. */
	ps->lr = 1e-3;
	ps->beta1 = 0.9;
	ps->beta2 = 0.999;
	ps->eps = 1e-8;
	ps->weight_decay = k == OPT_ADAMW ? 1e-2 : 0;
	ps->momentum = k == OPT_MOMENTUM ? 0.9 : 0;
	const char *const *keys = k <= OPT_MOMENTUM ? sgd_keys : adam_keys;
	int nkeys = k <= OPT_MOMENTUM ? COUNT(sgd_keys) : COUNT(adam_keys);
	const char *oname = optimizers[k];
	int pos = 0;
	Expr *seen[4] = {NULL, NULL, NULL, NULL};
	for (Arg *a = e->kind == E_CALL ? e->args : NULL; a; a = a->next) {
		int i = a->key ? word_index(a->key, keys, nkeys) : pos++;
		if (a->key && i < 0) {
			unknown_key(pc, a, oname, keys, nkeys);
			continue;
		}
		if (i >= nkeys) {
			diag_error(pc->src, a->loc, "too many arguments to %s: it takes %s", oname, word_list(pc->a, keys, nkeys, " and "));
			continue;
		}
		if (seen[i]) {
			diag_error(pc->src, a->loc, "%s is given twice", keys[i]);
			continue;
		}
		seen[i] = a->value;
		const char *key = keys[i];
		Num v;
		if (!strcmp(key, "betas")) {
			parse_betas(pc, a->value, &ps->beta1, &ps->beta2);
			continue;
		}
		if (!plan_num(pc, pc->src, a->value, &v))
			continue;
		if (!strcmp(key, "lr")) {
			if (v.v <= 0)
				diag_error(pc->src, a->value->loc, "learning rate must be positive, not %g", v.v);
			else
				ps->lr = v.v;
		} else if (!strcmp(key, "eps")) {
			if (v.v <= 0)
				diag_error(pc->src, a->value->loc, "eps must be positive, not %g", v.v);
			else
				ps->eps = v.v;
		} else if (!strcmp(key, "weight_decay")) {
			if (v.v < 0)
				diag_error(pc->src, a->value->loc, "weight_decay must be at least 0, not %g", v.v);
			else
				ps->weight_decay = v.v;
		} else if (!strcmp(key, "momentum")) {
			if (v.v < 0 || v.v >= 1)
				diag_error(pc->src, a->value->loc, "momentum = %g is outside [0, 1)", v.v);
			else
				ps->momentum = v.v;
		}
	}
	if (k == OPT_SGD && ps->momentum > 0)
		ps->optimizer = OPT_MOMENTUM;
	Expr *sched = NULL, *clip = NULL;
	for (Arg *a = first->next; a; a = a->next) {
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected KEY = VALUE after the optimizer");
			diag_note_plain("optimizer takes schedule and clip");
			continue;
		}
		Expr **slot = !strcmp(a->key, "schedule") ? &sched : !strcmp(a->key, "clip") ? &clip : NULL;
		if (!slot) {
			unknown_key(pc, a, "optimizer", optimizer_keys, COUNT(optimizer_keys));
			continue;
		}
		if (*slot) {
			diag_error(pc->src, a->key_loc, "%s is given twice", a->key);
			continue;
		}
		*slot = a->value;
	}
	if (sched)
		plan_lr_schedule(pc, sched);
	if (clip) {
		Num v;
		if (plan_num(pc, pc->src, clip, &v)) {
			if (v.v < 0)
				diag_error(pc->src, clip->loc, "clip must be at least 0 (0 turns clipping off), not %g", v.v);
			else
				ps->clip = v.v;
		}
	}
}

static void plan_compress(PlanCtx *pc, Expr *e)
{
	PlanSpec *ps = pc->ps;
	Expr *callee = e->kind == E_CALL ? e->lhs : e;
	int k = word_index(word_of(callee), compressors, COUNT(compressors));
	if (k < 0) {
		unknown_word(pc, pc->src, callee, "compression", compressors, COUNT(compressors));
		return;
	}
	Arg *args = e->kind == E_CALL ? e->args : NULL;
	if (k <= 2) {
		if (args)
			diag_error(pc->src, args->loc, "%s compression takes no arguments", compressors[k]);
		ps->compress = (CompressKind)k;
		return;
	}
	const char *key = k == 3 ? "ratio" : "rank";
	if (!args || args->next || (args->key && strcmp(args->key, key))) {
		Loc l = args && args->key ? args->key_loc : e->loc;
		diag_error(pc->src, l, "%s takes one argument, %s", compressors[k], key);
		diag_note_plain(k == 3 ? "e.g. compress = topk(0.01): keep the largest 1%% of each gradient"
		                       : "e.g. compress = powersgd(rank = 4)");
		return;
	}
	Num v;
	if (!plan_num(pc, pc->src, args->value, &v))
		return;
	if (k == 3) {
		if (v.v <= 0 || v.v > 1) {
			diag_error(pc->src, args->value->loc, "topk ratio = %g is outside (0, 1]", v.v);
			diag_note_plain("the ratio is the fraction of gradient entries sent, e.g. topk(0.01)");
			return;
		}
		ps->topk_ratio = v.v;
	} else {
		if (!v.is_int || v.v < 1 || v.v > 1024) {
			diag_error(pc->src, args->value->loc, "powersgd rank must be an integer from 1 to 1024, not %g", v.v);
			return;
		}
		ps->powersgd_rank = (int)v.v;
	}
	ps->compress = (CompressKind)k;
}

/* outer = nesterov(lr = 0.7, momentum = 0.9) | sgd(lr = 1.0): local SGD's outer optimizer on the
 * outer gradient (the replicas' start point minus their average), DiLoCo's defaults. */
static void plan_outer(PlanCtx *pc, Expr *e)
{
	PlanSpec *ps = pc->ps;
	Expr *callee = e->kind == E_CALL ? e->lhs : e;
	int k = word_index(word_of(callee), outer_optimizers, COUNT(outer_optimizers));
	if (k < 0) {
		unknown_word(pc, pc->src, callee, "outer optimizer", outer_optimizers, COUNT(outer_optimizers));
		return;
	}
	ps->outer = k == 0 ? OUTER_SGD : OUTER_NESTEROV;
	ps->outer_loc = e->loc;
	ps->outer_lr = k == 0 ? 1.0 : 0.7;
	ps->outer_momentum = k == 0 ? 0.0 : 0.9;
	int nkeys = k == 0 ? 1 : 2;
	int pos = 0;
	for (Arg *a = e->kind == E_CALL ? e->args : NULL; a; a = a->next) {
		int i = a->key ? word_index(a->key, outer_keys, nkeys) : pos++;
		if (a->key && i < 0) {
			unknown_key(pc, a, outer_optimizers[k], outer_keys, nkeys);
			continue;
		}
		if (i >= nkeys) {
			diag_error(pc->src, a->loc, "too many arguments to %s: it takes %s", outer_optimizers[k],
				   word_list(pc->a, outer_keys, nkeys, " and "));
			continue;
		}
		Num v;
		if (!plan_num(pc, pc->src, a->value, &v))
			continue;
		if (i == 0 && v.v <= 0)
			diag_error(pc->src, a->value->loc, "outer learning rate must be positive, not %g", v.v);
		else if (i == 1 && (v.v < 0 || v.v >= 1))
			diag_error(pc->src, a->value->loc, "outer momentum must be in [0, 1), not %g", v.v);
		else if (i == 0)
			ps->outer_lr = v.v;
		else
			ps->outer_momentum = v.v;
	}
}

static void plan_sync(PlanCtx *pc, PlanStmt *st, Expr **every_e, Expr **stale_e, Expr **overlap_e, Expr **ef_e,
                      Expr **compress_e)
{
	PlanSpec *ps = pc->ps;
	ps->sync_loc = st->loc;
	bool mode_seen = false;
	for (Arg *a = st->args; a; a = a->next) {
		if (!a->key) {
			const char *w = word_of(a->value);
			int m = word_index(w, sync_modes, COUNT(sync_modes));
			int f = word_index(w, sync_flags, COUNT(sync_flags));
			if (m >= 0 && a == st->args) {
				ps->sync = (SyncMode)m;
				mode_seen = true;
			} else if (m >= 0) {
				diag_error(pc->src, a->loc, mode_seen ? "sync has one mode" : "the sync mode comes first");
			} else if (f == 0) {
				*overlap_e = a->value;
				ps->overlap = true;
			} else if (f == 1) {
				*ef_e = a->value;
				ps->error_feedback = true;
			} else {
				Names ns = {0};
				names_add_all(pc->a, &ns, sync_modes, COUNT(sync_modes));
				names_add_all(pc->a, &ns, sync_flags, COUNT(sync_flags));
				unknown_word(pc, pc->src, a->value, "sync setting", ns.v, ns.n);
			}
			continue;
		}
		int k = word_index(a->key, sync_keys, COUNT(sync_keys));
		if (k < 0) {
			unknown_key(pc, a, "sync", sync_keys, COUNT(sync_keys));
			continue;
		}
		Num v;
		switch (k) {
		case 0: /* bucket */
			if (plan_num(pc, pc->src, a->value, &v)) {
				if (v.v <= 0)
					diag_error(pc->src, a->value->loc, "bucket size must be positive, not %g", v.v);
				else
					ps->bucket_bytes = v.v;
			}
			break;
		case 1: /* overlap = true/false */
		case 5: { /* error_feedback = true/false */
			const char *w = word_of(a->value);
			bool on;
			if (w && !strcmp(w, "true"))
				on = true;
			else if (w && !strcmp(w, "false"))
				on = false;
			else {
				diag_error(pc->src, a->value->loc, "%s must be true or false", a->key);
				break;
			}
			if (k == 1) {
				ps->overlap = on;
				*overlap_e = on ? a->value : NULL;
			} else {
				ps->error_feedback = on;
				*ef_e = on ? a->value : NULL;
			}
			break;
		}
		case 2: { /* every */
			long long n;
			*every_e = a->value;
			if (plan_int(pc, pc->src, a->value, "every", &n)) {
				if (n < 1 || n > INT_MAX)
					diag_error(pc->src, a->value->loc, "every must be at least 1, not %lld", n);
				else
					ps->every = (int)n;
			}
			break;
		}
		case 3: { /* staleness */
			long long n;
			*stale_e = a->value;
			if (plan_int(pc, pc->src, a->value, "staleness", &n)) {
				if (n < 0 || n > INT_MAX)
					diag_error(pc->src, a->value->loc, "staleness must be at least 0, not %lld", n);
				else
					ps->staleness = (int)n;
			}
			break;
		}
		case 4: /* compress */
			*compress_e = a->value;
			plan_compress(pc, a->value);
			break;
		case 6: /* outer */
			plan_outer(pc, a->value);
			break;
		}
	}
	if (ps->outer != OUTER_NONE && ps->sync != SYNC_LOCAL_SGD) {
		diag_error(pc->src, ps->outer_loc, "an outer optimizer applies only to sync local_sgd");
		diag_note_plain("the outer optimizer steps on the replicas' average every K steps (DiLoCo): sync local_sgd, every = 16, "
				"outer = nesterov(lr = 0.7, momentum = 0.9)");
		ps->outer = OUTER_NONE;
	}
	if (*every_e && ps->sync != SYNC_LOCAL_SGD) {
		diag_error(pc->src, (*every_e)->loc, "every applies only to sync local_sgd");
		*every_e = NULL;
	}
	if (*stale_e && ps->sync != SYNC_ASYNC) {
		diag_error(pc->src, (*stale_e)->loc, "staleness applies only to sync async");
		*stale_e = NULL;
	}
	if (ps->sync == SYNC_LOCAL_SGD && !*every_e) {
		diag_error(pc->src, st->args->loc, "local_sgd needs every = K, the steps between averaging");
		diag_note_plain("e.g. sync local_sgd, every = 4");
	}
	if (ps->sync == SYNC_ASYNC && !*stale_e) {
		diag_error(pc->src, st->args->loc, "async needs staleness = S, the most steps a worker may lag");
		diag_note_plain("e.g. sync async, staleness = 2");
	}
}

static void plan_experts(PlanCtx *pc, PlanStmt *st, Expr **count_e, Expr **topk_e)
{
	PlanSpec *ps = pc->ps;
	ps->has_experts = true;
	ps->experts_loc = st->loc;
	for (Arg *a = st->args; a; a = a->next) {
		if (!a->key) {
			diag_error(pc->src, a->loc, "expected KEY = VALUE");
			diag_note_plain("e.g. experts count = 8, top_k = 2, capacity_factor = 1.25");
			continue;
		}
		int k = word_index(a->key, expert_keys, COUNT(expert_keys));
		if (k < 0) {
			unknown_key(pc, a, "experts", expert_keys, COUNT(expert_keys));
			continue;
		}
		Num v;
		long long n;
		switch (k) {
		case 0:
			*count_e = a->value;
			if (plan_int(pc, pc->src, a->value, "count", &n)) {
				if (n < 1 || n > 1 << 20)
					diag_error(pc->src, a->value->loc, "count must be at least 1, not %lld", n);
				else {
					ps->expert_count = (int)n;
					ps->expert_count_loc = a->value->loc;
				}
			}
			break;
		case 1:
			*topk_e = a->value;
			if (plan_int(pc, pc->src, a->value, "top_k", &n)) {
				if (n < 1 || n > 1 << 20)
					diag_error(pc->src, a->value->loc, "top_k must be at least 1, not %lld", n);
				else
					ps->top_k = (int)n;
			}
			break;
		case 2:
			if (plan_num(pc, pc->src, a->value, &v)) {
				if (v.v <= 0)
					diag_error(pc->src, a->value->loc, "capacity_factor must be positive, not %g", v.v);
				else
					ps->capacity_factor = v.v;
			}
			break;
		case 3:
			diag_error(pc->src, a->key_loc, "the auxiliary losses' weights are the model's, not the plan's");
			diag_note_plain("set them where the route is made: moe_aux_loss(route, weight = 0.01), "
					"moe_z_loss(route, weight = 0.001) (nn.moe's aux_loss and z_loss)");
			break;
		}
	}
}

/* ------------------------------------------------------------------ cross-statement checks */

static long long dim_axes_product(PlanCtx *pc, const char *dim, char *names, size_t cap)
{
	long long prod = 1;
	size_t len = 0;
	names[0] = 0;
	for (int i = 0; i < pc->ps->nrules; i++) {
		ShardRule *r = &pc->ps->rules[i];
		if (!r->dim_name || strcmp(r->dim_name, dim) || r->stage >= 0)
			continue;
		prod *= pc->ps->axes[r->axis].size;
		len += (size_t)snprintf(names + len, len < cap ? cap - len : 0, "%s%s (%d)", len ? " x " : "",
		                        pc->ps->axes[r->axis].name, pc->ps->axes[r->axis].size);
		if (len >= cap)
			len = cap - 1;
	}
	return prod;
}

static void check_dim_rules(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	for (int i = 0; i < ps->nrules; i++) {
		ShardRule *r = &ps->rules[i];
		if (!r->dim_name)
			continue;
		/* a hyperparameter dim must divide by the product of its axes so far */
		HyperValue *h = find_hyper(pc, r->dim_name);
		if (h && pc->hypers_ok && h->is_int) {
			long long prod = 1;
			int nax = 0;
			for (int j = 0; j <= i; j++) {
				ShardRule *o = &ps->rules[j];
				if (o->dim_name && !strcmp(o->dim_name, r->dim_name) && (o->stage < 0 || o->stage == r->stage)) {
					prod *= ps->axes[o->axis].size;
					nax++;
				}
			}
			long long v = h->ival;
			if (prod > 1 && v % prod != 0) {
				if (nax == 1)
					diag_error(pc->notes[i].src, pc->notes[i].loc, "dimension %s = %lld is not divisible by mesh axis '%s' of size %d",
					           r->dim_name, v, ps->axes[r->axis].name, ps->axes[r->axis].size);
				else
					diag_error(pc->notes[i].src, pc->notes[i].loc, "dimension %s = %lld is not divisible by its mesh axes (%lld ranks)",
					           r->dim_name, v, prod);
				rule_notes(&pc->notes[i]);
				diag_note(h->src, h->loc, "%s is set here", r->dim_name);
			}
		}
		/* one axis splitting two dims of one tensor */
		for (int j = 0; j < i; j++) {
			ShardRule *o = &ps->rules[j];
			if (!o->dim_name || o->axis != r->axis || !strcmp(o->dim_name, r->dim_name))
				continue;
			if (o->stage >= 0 && r->stage >= 0 && o->stage != r->stage)
				continue;
			if (!pc->model || !dims_share_tensor(pc->model, o->dim_name, r->dim_name))
				continue;
			diag_error(pc->notes[i].src, pc->notes[i].loc, "mesh axis '%s' splits both %s and %s", ps->axes[r->axis].name,
			           o->dim_name, r->dim_name);
			rule_notes(&pc->notes[i]);
			diag_note(pc->notes[j].src, pc->notes[j].loc, "%s is split over '%s' here", o->dim_name, ps->axes[r->axis].name);
			diag_note_plain("a tensor holding both dims cannot be split twice over one axis; use another mesh axis for %s",
			                r->dim_name);
			break;
		}
	}
}

static void check_batch(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	if (!ps->batch_dim || ps->batch <= 0)
		return;
	char names[256];
	long long dp = dim_axes_product(pc, ps->batch_dim, names, sizeof names), k;
	Loc l = pc->batch_value->loc;
	if (__builtin_mul_overflow(dp, (long long)ps->micro_batches, &k)) {
		diag_error(pc->src, l, "batch %s: %s x micro_batches (%d) is past 2^63", ps->batch_dim, names,
			   ps->micro_batches);
		return;
	}
	if (ps->batch % k == 0)
		return;
	if (dp > 1 && ps->micro_batches > 1)
		diag_error(pc->src, l, "batch %s = %lld is not divisible by %s x micro_batches (%d) = %lld", ps->batch_dim, ps->batch,
		           names, ps->micro_batches, k);
	else if (dp > 1)
		diag_error(pc->src, l, "batch %s = %lld is not divisible by %s", ps->batch_dim, ps->batch, names);
	else
		diag_error(pc->src, l, "batch %s = %lld is not divisible by micro_batches = %d", ps->batch_dim, ps->batch,
		           ps->micro_batches);
	if (dp > 1 && ps->micro_batches > 1)
		diag_note_plain("%s is split evenly over %lld data-parallel ranks and each rank's share into %d micro-batches",
		                ps->batch_dim, dp, ps->micro_batches);
	else if (dp > 1)
		diag_note_plain("%s is split evenly over %lld data-parallel ranks", ps->batch_dim, dp);
	long long lo = ps->batch / k * k, hi;
	if (__builtin_add_overflow(lo, k, &hi)) /* batch near 2^63: no larger multiple to suggest */
		diag_note_plain("use a multiple of %lld: %s = %lld", k, ps->batch_dim, lo);
	else if (lo > 0)
		diag_note_plain("use a multiple of %lld: %s = %lld or %s = %lld", k, ps->batch_dim, lo, ps->batch_dim, hi);
	else
		diag_note_plain("use a multiple of %lld: %s = %lld", k, ps->batch_dim, hi);
}

static bool axis_splits_batch(PlanCtx *pc, int ax)
{
	for (int i = 0; i < pc->ps->nrules; i++) {
		ShardRule *r = &pc->ps->rules[i];
		if (r->dim_name && r->axis == ax && pc->ps->batch_dim && !strcmp(r->dim_name, pc->ps->batch_dim))
			return true;
	}
	return false;
}

static void check_roles(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	int pa = ps->pipe_axis;
	if (pa >= 0) {
		for (int i = 0; i < ps->nrules; i++) {
			ShardRule *r = &ps->rules[i];
			bool uses = r->dim_name ? r->axis == pa : false;
			for (int d = 0; !r->dim_name && d < r->ndims; d++)
				uses = uses || r->axes[d] == pa;
			if (!uses)
				continue;
			if (r->dim_name)
				diag_error(pc->notes[i].src, pc->notes[i].loc, "mesh axis '%s' is the pipeline axis; it cannot also split %s",
				           ps->axes[pa].name, r->dim_name);
			else
				diag_error(pc->notes[i].src, pc->notes[i].loc, "mesh axis '%s' is the pipeline axis; it cannot also split %s",
				           ps->axes[pa].name, r->pattern);
			rule_notes(&pc->notes[i]);
			diag_note(pc->src, ps->pipeline_loc, "the pipeline runs over '%s' here", ps->axes[pa].name);
		}
		if (ps->zero_axis == pa) {
			diag_error(pc->src, ps->zero_loc, "mesh axis '%s' is the pipeline axis; ZeRO cannot shard over it", ps->axes[pa].name);
			diag_note(pc->src, ps->pipeline_loc, "the pipeline runs over '%s' here", ps->axes[pa].name);
			return;
		}
		/* As DeepSpeed's pipeline engine and Megatron-LM decide: ZeRO-2 would reduce-scatter every
		 * micro-batch's gradients (micro-batches times the data-parallel traffic), ZeRO-3 would
		 * gather every layer's weights again for each micro-batch's forward and backward. */
		if (ps->zero_stage >= 2 && ps->axes[pa].size > 1) {
			diag_error(pc->src, ps->zero_loc, "zero %d cannot be used with a pipeline", ps->zero_stage);
			diag_note(pc->src, ps->pipeline_loc, "the pipeline is set here");
			diag_note_plain("with micro-batches in flight, ZeRO %d would %s for every micro-batch; use zero 1 "
			                "(optimizer states sharded), as DeepSpeed and Megatron-LM do with pipelines",
			                ps->zero_stage,
			                ps->zero_stage == 2 ? "reduce-scatter the gradients" : "gather every layer's weights again");
			return;
		}
	}
	if (ps->zero_stage > 0 && ps->zero_axis >= 0 && ps->axes[ps->zero_axis].size > 1 && !axis_splits_batch(pc, ps->zero_axis)) {
		const char *an = ps->axes[ps->zero_axis].name;
		diag_error(pc->src, ps->zero_loc, "zero %d shards over mesh axis '%s', which does not split the batch", ps->zero_stage, an);
		int dpax = -1;
		for (int i = 0; i < ps->naxes && dpax < 0; i++)
			if (ps->axes[i].size > 1 && axis_splits_batch(pc, i))
				dpax = i;
		if (dpax >= 0)
			diag_note_plain("ZeRO partitions state over data-parallel replicas, the ranks that split %s: zero %d over %s",
			                ps->batch_dim, ps->zero_stage, ps->axes[dpax].name);
		else
			diag_note_plain("ZeRO partitions state over data-parallel replicas: split the batch over it (shard %s -> %s)",
			                ps->batch_dim ? ps->batch_dim : "B", an);
	}
}

static void check_offload(PlanCtx *pc, const Loc seen[3])
{
	PlanSpec *ps = pc->ps;
	if (ps->offload_params && ps->zero_stage != 3) {
		diag_error(pc->src, seen[1], "offloading params needs zero 3");
		diag_note_plain("only ZeRO-3 partitions the parameters, so that a rank fetches each layer's parameters from %s when "
		                "it needs them (ZeRO-Infinity); add 'zero 3 over data'",
		                ps->offload_params == PLACE_HOST ? "host memory" : "disk");
	}
	if (ps->offload_optimizer && ps->zero_stage < 1) {
		diag_error(pc->src, seen[0], "offloading the optimizer needs zero 1 or higher");
		diag_note_plain("ZeRO-Offload runs the optimizer step for the rank's partition of the optimizer state; add 'zero 1 over data'");
	}
}

static void check_sync(PlanCtx *pc, Expr *overlap_e, Expr *ef_e, Expr *compress_e)
{
	PlanSpec *ps = pc->ps;
	const char *mode = sync_modes[ps->sync];
	if (ps->sync != SYNC_STRICT && ps->zero_stage >= 1) {
		diag_error(pc->src, ps->sync_loc, "sync %s cannot be used with zero %d", mode, ps->zero_stage);
		diag_note(pc->src, ps->zero_loc, "ZeRO is set here");
		if (ps->sync == SYNC_ASYNC)
			diag_note_plain("ZeRO shards optimizer state%s across the data-parallel ranks, but an async master steps the "
					"optimizer alone and every worker computes on whole parameters; use zero 0 or sync strict",
					ps->zero_stage >= 3 ? ", gradients and parameters" : ps->zero_stage == 2 ? " and gradients" : "");
		else
			diag_note_plain("ZeRO shards optimizer state%s across the data-parallel ranks, so no rank can step its replica "
					"on its own between synchronizations; use zero 0 or sync strict",
					ps->zero_stage >= 3 ? ", gradients and parameters" : ps->zero_stage == 2 ? " and gradients" : "");
	}
	if (ps->sync == SYNC_ASYNC && ps->pipe_axis >= 0) {
		diag_error(pc->src, ps->sync_loc, "sync async cannot be used with a pipeline");
		diag_note(pc->src, ps->pipeline_loc, "the pipeline is set here");
		diag_note_plain("the stages of one replica would run different weight versions of one step; use sync strict or local_sgd");
	}
	if (ps->sync != SYNC_STRICT) {
		bool dp = false;
		for (int i = 0; i < ps->naxes; i++)
			dp = dp || (ps->axes[i].size > 1 && axis_splits_batch(pc, i));
		if (!dp && ps->sync == SYNC_ASYNC) {
			diag_error(pc->src, ps->sync_loc, "sync async needs a data-parallel axis: the workers are its ranks");
			diag_note_plain("split the batch over an axis of two or more ranks (shard B -> data); the rank with "
					"coordinate 0 on it is the master");
		} else if (!dp) {
			pwarn(pc, pc->src, ps->sync_loc, "sync %s has no data-parallel replicas to synchronize", mode);
		}
		if (overlap_e)
			pwarn(pc, pc->src, overlap_e->loc, "overlap has no effect with sync %s", mode);
	}
	if (ps->compress != COMPRESS_NONE && ps->sync != SYNC_STRICT) {
		diag_error(pc->src, compress_e->loc, "gradient compression cannot be used with sync %s", mode);
		diag_note_plain(ps->sync == SYNC_LOCAL_SGD
				? "local_sgd exchanges parameters every K steps, not gradients, and cuts the traffic K-fold "
				  "already; compression applies to sync strict's gradient all-reduce"
				: "async workers push whole gradients to the master, which applies them as they are; "
				  "compression applies to sync strict's gradient all-reduce");
	} else if (ps->compress != COMPRESS_NONE && ps->zero_stage >= 2 &&
		   (ps->compress == COMPRESS_BF16 || ps->compress == COMPRESS_FP16)) {
		diag_error(pc->src, compress_e->loc, "%s compression cannot be used with zero %d", compressors[ps->compress],
			   ps->zero_stage);
		diag_note(pc->src, ps->zero_loc, "ZeRO is set here");
		diag_note_plain("ZeRO %d reduce-scatters every micro-batch's gradients during the backward, while compression and "
				"its error feedback work on the step's whole gradient; use zero 1",
				ps->zero_stage);
	} else if (ps->compress != COMPRESS_NONE && overlap_e) {
		pwarn(pc, pc->src, overlap_e->loc, "overlap has no effect with compression: compressed buckets are reduced "
						    "after the backward");
	}
	if ((ps->compress == COMPRESS_TOPK || ps->compress == COMPRESS_POWERSGD) && ps->zero_stage >= 2) {
		diag_error(pc->src, compress_e->loc, "%s compression cannot be used with zero %d", compressors[ps->compress],
		           ps->zero_stage);
		diag_note(pc->src, ps->zero_loc, "ZeRO is set here");
		diag_note_plain("ZeRO %d reduce-scatters gradients, but %s needs every rank's whole gradient to compress; use zero 1 or "
		                "compress = bf16",
		                ps->zero_stage, compressors[ps->compress]);
	}
	if (ps->compress == COMPRESS_POWERSGD && ps->param_dtype == DT_F16) {
		diag_error(pc->src, compress_e->loc, "powersgd compression cannot be used with fp16 precision");
		diag_note_plain("PowerSGD's orthogonalization overflows and loses rank in fp16; use bf16 precision or compress = topk");
	}
	if ((ps->compress == COMPRESS_BF16 && ps->param_dtype == DT_BF16) ||
	    (ps->compress == COMPRESS_FP16 && ps->param_dtype == DT_F16))
		pwarn(pc, pc->src, compress_e->loc, "compress = %s has no effect: gradients are already %s", compressors[ps->compress],
		             compressors[ps->compress]);
	if (ps->error_feedback && ps->compress == COMPRESS_NONE && !compress_e) {
		diag_error(pc->src, ef_e->loc, "error_feedback needs compression");
		diag_note_plain("error feedback adds back what compression dropped: add e.g. compress = topk(0.01)");
	}
	if (ps->compress == COMPRESS_TOPK && !ps->error_feedback)
		pwarn(pc, pc->src, compress_e->loc, "topk without error_feedback drops most of every gradient for good");
}

static void check_experts(PlanCtx *pc, Expr *count_e, Expr *topk_e)
{
	PlanSpec *ps = pc->ps;
	if (!pc->model)
		return;
	if (ps->has_experts && !pc->mi.uses_moe) {
		diag_error(pc->src, ps->experts_loc, "model '%s' has no mixture-of-experts layer", pc->model->name);
		diag_note_plain("experts configures moe_router / moe_dispatch / moe_combine (e.g. nn.moe_block); remove it");
		return;
	}
	/* the count against the model's routers: graph.c, which knows their expert dims whatever the
	 * model calls its hyperparameters */
	(void)count_e;
	long long count = ps->expert_count;
	if (topk_e && count > 0 && ps->top_k > count) {
		diag_error(pc->src, topk_e->loc, "top_k = %d is more than the %lld experts", ps->top_k, count);
	}
	if (!topk_e && count > 0 && ps->top_k > count)
		ps->top_k = (int)count;
}

/* `replicate AXIS, ...`: the axis's ranks are meant to hold replicas computing the same thing
 * (a redundant run, a test); without it an axis of size > 1 that nothing uses is an error. */
static void plan_replicate(PlanCtx *pc, PlanStmt *st)
{
	if (!st->args)
		diag_error(pc->src, st->word_loc, "replicate needs a mesh axis: replicate data");
	Frame top = {NULL, pc->ps->plan->module, pc->src, NULL, {0, 0}, NULL, 0, NULL, 0};
	for (Arg *a = st->args; a; a = a->next) {
		if (a->key) {
			diag_error(pc->src, a->loc, "replicate takes mesh axes, not '%s ='", a->key);
			continue;
		}
		int ax = resolve_axis(pc, &top, a->value);
		if (ax >= 0)
			pc->replicated[ax] = true;
	}
}

/* `freeze PATTERN, ...`: the matching parameters do not train (fine-tuning): no gradients, no
 * optimizer state. Patterns as in shard rules; one that matches no parameter is an error
 * (graph.c, which knows the names). */
static void plan_freeze(PlanCtx *pc, PlanStmt *st)
{
	PlanSpec *ps = pc->ps;
	if (!st->args)
		diag_error(pc->src, st->word_loc, "freeze needs parameter patterns: freeze wte, layers.*.attention.*");
	for (Arg *a = st->args; a; a = a->next) {
		char buf[256];
		size_t len = 0;
		buf[0] = 0;
		if (a->key || !pattern_text(a->value, buf, sizeof buf, &len)) {
			diag_error(pc->src, a->loc, "expected a parameter pattern");
			diag_note_plain("a pattern is a dotted parameter path where '*' matches segments: layers.*.attention.wq");
			continue;
		}
		if (ps->nfreeze == MAX_FREEZE) {
			diag_error(pc->src, a->loc, "at most %d freeze patterns", MAX_FREEZE);
			return;
		}
		FreezeRule *f = &ps->freeze[ps->nfreeze++];
		f->pattern = arena_strdup(pc->a, buf);
		f->loc = a->value->loc;
		f->src = pc->src;
	}
}

static void check_unused_axes(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	for (int i = 0; i < ps->naxes; i++)
		if (!pc->axis_used[i] && !pc->replicated[i] && ps->axes[i].size > 1) {
			diag_error(pc->src, ps->axes[i].loc, "mesh axis '%s' of size %d is not used by any rule", ps->axes[i].name,
			           ps->axes[i].size);
			if (ps->batch_dim)
				diag_note_plain("its %d ranks would compute the same thing: add 'shard %s -> %s' to split the batch "
				                "over them, or 'replicate %s' if replicas are meant",
				                ps->axes[i].size, ps->batch_dim, ps->axes[i].name, ps->axes[i].name);
			else
				diag_note_plain("its %d ranks would compute the same thing: split a dim or a parameter over it, "
				                "or say 'replicate %s' if replicas are meant",
				                ps->axes[i].size, ps->axes[i].name);
		}
}

static void check_pipeline_batches(PlanCtx *pc)
{
	PlanSpec *ps = pc->ps;
	if (ps->pipe_axis < 0 || ps->stages <= 1)
		return;
	if (ps->schedule == SCHED_INTERLEAVED && ps->micro_batches % ps->stages != 0) {
		diag_error(pc->src, pc->mb_value ? pc->mb_value->loc : ps->batch_loc,
		           "the interleaved schedule needs micro_batches to be a multiple of the %d stages, not %d", ps->stages,
		           ps->micro_batches);
		diag_note(pc->src, ps->pipeline_loc, "the pipeline is set here");
		return;
	}
	if (ps->micro_batches < ps->stages) {
		int p = ps->stages, m = ps->micro_batches;
		pwarn(pc, pc->src, pc->mb_value ? pc->mb_value->loc : ps->batch_loc,
		             "%d micro-batch%s for %d pipeline stages leaves each stage idle %d%% of the step", m, m == 1 ? "" : "es", p,
		             (int)(100.0 * (p - 1) / (m + p - 1) + 0.5));
		if (pc->warn)
			diag_note_plain("the pipeline bubble is (stages - 1) / (micro_batches + stages - 1); use micro_batches >= %d", 4 * p);
	}
}

/* ------------------------------------------------------------------ sema_plan */

/* A plan's settings before its statements: torch.optim.AdamW's, DDP's bucket and GShard's routing
 * defaults. */
static void plan_defaults(PlanSpec *ps)
{
	ps->world = 1;
	ps->micro_batches = 1;
	ps->pipe_axis = -1;
	ps->ring_axis = -1;
	ps->stages = 1;
	ps->chunks = 1;
	ps->zero_axis = -1;
	ps->param_dtype = DT_F32;
	ps->master_dtype = DT_F32;
	ps->optimizer = OPT_ADAMW;
	ps->lr = 1e-3;
	ps->beta1 = 0.9;
	ps->beta2 = 0.999;
	ps->eps = 1e-8;
	ps->weight_decay = 1e-2;
	ps->sync = SYNC_STRICT;
	ps->bucket_bytes = 25.0 * 1024 * 1024;
	ps->overlap = true;
	ps->top_k = 2;
	ps->capacity_factor = 1.25;
}

/* The model the plan is `for`, its hyperparameters as the plan sets them, and its layer count
 * where the hyperparameters fix it. */
static Item *plan_model(PlanCtx *pc, Item *plan, bool model_checked_ok)
{
	Program *p = pc->prog;
	PlanSpec *ps = pc->ps;
	Item *model = plan->for_model ? find_item(p, I_MODEL, plan->for_model, plan->module) : NULL;
	if (!model && plan->for_model) {
		Item *other = NULL;
		for (int k = I_FN; !other && k <= I_PLAN; k++)
			other = find_item(p, (ItemKind)k, plan->for_model, plan->module);
		if (other && other->kind != I_IMPORT) {
			diag_error(pc->src, plan->for_loc, "'%s' is a %s, not a model", plan->for_model, item_kind_name(other->kind));
		} else {
			diag_error(pc->src, plan->for_loc, "unknown model '%s'", plan->for_model);
			Names ns = {0};
			item_names(pc->a, &ns, plan->module, I_MODEL, NULL);
			suggest(plan->for_model, ns.v, ns.n);
		}
	}
	pc->model = model;
	ps->model = model;
	if (model) {
		model_info(p, model, &pc->mi);
		pc->hypers_ok = model_checked_ok && plan_hypers(pc);
		if (pc->hypers_ok && pc->mi.repeat_count) {
			Eval ev = {pc->a, &model->module->src, ps->hypers, ps->nhypers, NULL, 0, false};
			Num v;
			if (eval_num(&ev, pc->mi.repeat_count, &v) && v.is_int && v.v >= 0 && v.v <= 1e6) {
				pc->layers = (long long)v.v;
				pc->layers_known = true;
			}
		} else if (pc->hypers_ok) {
			pc->layers = 0;
			pc->layers_known = true;
		}
	}
	return model;
}

/* Each statement's word known (a misspelled one is taken as its guess) and written once (but
 * the statements that add rules): pc->first[word] is its statement. */
static void plan_statement_words(PlanCtx *pc, Item *plan)
{
	for (PlanStmt *st = plan->rules; st; st = st->next) {
		int w = word_index(st->word, plan_words, NWORDS);
		if (w < 0) {
			diag_error(pc->src, st->word_loc, "unknown plan statement '%s'", st->word);
			const char *guess = best_guess(st->word, plan_words, NWORDS);
			if (guess)
				suggest(st->word, plan_words, NWORDS);
			else
				diag_note_plain("plan statements are %s", word_list(pc->a, plan_words, NWORDS, " and "));
			if (!guess)
				continue;
			/* go on as if the guess had been written, so its axes and settings do not cause
			 * errors of their own */
			st->word = guess;
			w = word_index(guess, plan_words, NWORDS);
		}
		if (st->body && w != W_STAGE)
			diag_error(pc->src, st->word_loc, "only stage takes a { block }");
		if (w == W_SHARD || w == W_USE || w == W_STAGE || w == W_OFFLOAD || w == W_REPLICATE || w == W_FREEZE)
			continue;
		if (pc->first[w]) {
			diag_error(pc->src, st->word_loc, "second %s statement", plan_words[w]);
			diag_note(pc->src, pc->first[w]->word_loc, "the first %s statement is here", plan_words[w]);
			diag_note_plain("a plan has one %s statement; merge them", plan_words[w]);
			continue;
		}
		pc->first[w] = st;
	}
}

static PlanSpec *build_plan(Program *p, Item *plan, bool model_checked_ok, bool warn)
{
	PlanSpec *ps = arena_alloc(p->arena, sizeof *ps);
	PlanCtx pcv;
	PlanCtx *pc = &pcv;
	memset(pc, 0, sizeof *pc);
	pc->prog = p;
	pc->a = p->arena;
	pc->ps = ps;
	pc->src = &plan->module->src;
	pc->warn = warn;
	int errors_before = diag_error_count();

	ps->prog = p;
	ps->plan = plan;
	ps->src = pc->src;
	plan_defaults(ps);

	Item *model = plan_model(pc, plan, model_checked_ok);
	plan_statement_words(pc, plan);

	if (pc->first[W_MESH])
		plan_mesh(pc, pc->first[W_MESH]);
	if (pc->first[W_BATCH])
		plan_batch(pc, pc->first[W_BATCH]);
	else if (model && pc->mi.free_dims.n) {
		diag_error(pc->src, plan->name_loc, "plan '%s' does not set the batch size", plan->name);
		diag_note_plain("add: batch %s = 32", pc->mi.free_dims.v[0]);
	}
	if (pc->first[W_PIPELINE])
		plan_pipeline(pc, pc->first[W_PIPELINE]);
	Frame top = {NULL, plan->module, pc->src, NULL, {0, 0}, NULL, 0, NULL, 0};
	plan_stmts(pc, &top, plan->rules, -1);
	if (pc->first[W_ZERO])
		plan_zero(pc, pc->first[W_ZERO]);
	Loc offload_seen[3] = {{0, 0}, {0, 0}, {0, 0}};
	for (PlanStmt *st = plan->rules; st; st = st->next)
		if (word_index(st->word, plan_words, NWORDS) == W_OFFLOAD)
			plan_offload(pc, st, offload_seen);
	if (pc->first[W_RECOMPUTE])
		plan_recompute(pc, pc->first[W_RECOMPUTE]);
	if (pc->first[W_ATTENTION])
		plan_attention(pc, pc->first[W_ATTENTION]);
	if (pc->first[W_PRECISION])
		plan_precision(pc, pc->first[W_PRECISION]);
	if (pc->first[W_OPTIMIZER])
		plan_optimizer(pc, pc->first[W_OPTIMIZER]);
	Expr *every_e = NULL, *stale_e = NULL, *overlap_e = NULL, *ef_e = NULL, *compress_e = NULL;
	if (pc->first[W_SYNC])
		plan_sync(pc, pc->first[W_SYNC], &every_e, &stale_e, &overlap_e, &ef_e, &compress_e);
	Expr *count_e = NULL, *topk_e = NULL;
	if (pc->first[W_EXPERTS])
		plan_experts(pc, pc->first[W_EXPERTS], &count_e, &topk_e);
	for (PlanStmt *st = plan->rules; st; st = st->next) {
		int w = word_index(st->word, plan_words, NWORDS);
		if (w == W_REPLICATE)
			plan_replicate(pc, st);
		else if (w == W_FREEZE)
			plan_freeze(pc, st);
	}

	/* checks across statements */
	check_dim_rules(pc);
	check_batch(pc);
	check_pipeline_batches(pc);
	check_roles(pc);
	check_offload(pc, offload_seen);
	check_sync(pc, overlap_e, ef_e, compress_e);
	check_experts(pc, count_e, topk_e);
	if (diag_error_count() == errors_before)
		check_unused_axes(pc);

	if (!model || diag_error_count() != errors_before)
		return NULL;
	return ps;
}

PlanSpec *sema_plan(Program *p, Item *plan)
{
	if (!p || !plan || plan->kind != I_PLAN)
		return NULL;
	return build_plan(p, plan, true, false);
}

/* ------------------------------------------------------------------ sema_check */

/* A strategy's statements, checked for form once (their axes are bound per use). */
static void check_strategy(Program *p, Item *st)
{
	const Source *src = &st->module->src;
	check_params_unique(p->arena, src, st->params, "parameter");
	/* A plan-less context: no mesh, no model. Rules are checked for form only, so axis and dim
	 * lookups are skipped by binding every name. */
	for (PlanStmt *s = st->rules; s; s = s->next) {
		int w = word_index(s->word, plan_words, NWORDS);
		if (w == W_SHARD || w == W_USE || w == W_STAGE) {
			if (s->body && w != W_STAGE)
				diag_error(src, s->word_loc, "only stage takes a { block }");
			for (PlanStmt *b = s->body; b; b = b->next) {
				int bw = word_index(b->word, plan_words, NWORDS);
				if (bw != W_SHARD && bw != W_USE)
					diag_error(src, b->word_loc, "only shard and use rules may appear in a stage block");
			}
			PlanStmt *list[2] = {s, NULL};
			for (int i = 0; list[i]; i++) {
				PlanStmt *x = list[i];
				if (word_index(x->word, plan_words, NWORDS) == W_SHARD) {
					for (Arg *a = x->args; a; a = a->next) {
						Expr *e = a->value;
						char buf[256];
						size_t len = 0;
						if (a->key || !e || e->kind != E_BINARY || (e->op != 'A' && e->op != ':')) {
							diag_error(src, a->loc, "expected a shard rule");
							diag_note_plain("write 'shard DIM -> AXIS' or 'shard PATTERN : [LAYOUT]'");
						} else if (e->op == ':' && !pattern_text(e->lhs, buf, sizeof buf, &len)) {
							diag_error(src, e->lhs->loc, "expected a parameter pattern before ':'");
						} else if (e->op == ':' && e->rhs->kind != E_LIST) {
							diag_error(src, e->rhs->loc, "expected a layout: [_, AXIS, ...] with one entry per dimension");
						} else if (e->op == 'A' && e->lhs->kind != E_NAME &&
							   moe_rule_target(e->lhs, &(Expr *){NULL}) <= 0) {
							diag_error(src, e->lhs->loc, "expected a dimension name before '->'");
						} else if (e->op == ':') {
							int n = 0;
							for (Expr *y = e->rhs->items; y; y = y->next, n++)
								if (y->kind != E_NAME)
									diag_error(src, y->loc, "a layout entry is '_' or a mesh axis");
							if (n > MAX_DIMS)
								diag_error(src, e->rhs->loc, "a layout has at most %d entries", MAX_DIMS);
						}
					}
				}
			}
			if (w == W_USE) {
				for (Arg *a = s->args; a; a = a->next) {
					Expr *e = a->value;
					Expr *c = e && e->kind == E_CALL ? e->lhs : e;
					const Module *m = st->module;
					const char *name = NULL;
					if (c && c->kind == E_NAME) {
						name = c->text;
					} else if (c && c->kind == E_MEMBER && c->lhs->kind == E_NAME) {
						Item *imp = import_of(st->module, c->lhs->text);
						m = imp ? module_by_import(p, imp->name) : NULL;
						name = c->text;
						if (!imp) {
							diag_error(src, c->lhs->loc, "unknown module '%s'", c->lhs->text);
							continue;
						}
					}
					if (!name) {
						diag_error(src, a->loc, "expected a strategy: use NAME(args)");
						continue;
					}
					if (m && !module_item(m, name, I_STRATEGY)) {
						diag_error(src, c->loc, "unknown strategy '%s'", name);
						Names ns = {0};
						item_names(p->arena, &ns, m, I_STRATEGY, NULL);
						suggest(name, ns.v, ns.n);
					}
				}
			}
			continue;
		}
		if (w >= 0) {
			diag_error(src, s->word_loc, "'%s' is not allowed in a strategy", s->word);
			diag_note_plain("a strategy holds shard rules, use and stage; %s belongs in the plan", s->word);
		} else {
			diag_error(src, s->word_loc, "unknown strategy statement '%s'", s->word);
			const char *const rule_words[] = {"shard", "use", "stage"};
			if (best_guess(s->word, rule_words, 3))
				suggest(s->word, rule_words, 3);
			else
				diag_note_plain("a strategy holds shard rules, use and stage");
		}
	}
}

/* root: the file being checked, whose fns nothing can call qualified (an imported module's
 * `fn dropout` is reachable as nn.dropout, so the stdlib may wrap a primitive under its name) */
static void check_module_names(Arena *a, Module *m, bool root)
{
	SymTab *aliases = symtab_new(a), *names = symtab_new(a); /* the first of each */
	for (Item *it = m->items; it && !diag_stopped(); it = it->next) {
		if (it->kind == I_IMPORT && it->alias) {
			Item *o = symtab_get(aliases, it->alias);
			if (!o) {
				symtab_put(aliases, it->alias, it);
				continue;
			}
			diag_error(&m->src, it->name_loc, "import name '%s' is already used", it->alias);
			diag_note(&m->src, o->name_loc, "by this import");
			diag_note_plain("rename one: import %s as NAME", it->name);
		} else if (it->kind != I_IMPORT && it->name) {
			if (root && it->kind == I_FN && is_prim(it->name)) { /* every call reaches the primitive */
				diag_error(&m->src, it->name_loc, "fn '%s' has the name of a primitive op, which every call to "
					   "'%s' in this file reaches; rename the fn",
					   it->name, it->name);
				diag_note_plain("unqualified, a primitive's name means the primitive (docs/language.md); a module "
						"imported by another may wrap it as M.%s",
						it->name);
				continue;
			}
			Item *o = symtab_get(names, it->name);
			if (!o) {
				symtab_put(names, it->name, it);
				continue;
			}
			diag_error(&m->src, it->name_loc, "'%s' is already defined", it->name);
			diag_note(&m->src, o->name_loc, "%s '%s' is defined here", item_kind_name(o->kind), o->name);
		}
	}
}

bool sema_check(Program *p)
{
	return sema_check_plan(p, NULL);
}

bool sema_check_plan(Program *p, const Item *only)
{
	if (!p)
		return false;
	int errors_before = diag_error_count();
	for (Module *m = p->modules; m; m = m->next)
		check_module_names(p->arena, m, m == p->main);
	/* models whose hyperparameter defaults are broken are reported once here, not per plan */
	int nmodels = 0;
	for (Module *m = p->modules; m; m = m->next)
		for (Item *it = m->items; it; it = it->next)
			nmodels += it->kind == I_MODEL;
	Item **models = arena_alloc(p->arena, sizeof *models * (size_t)(nmodels + 1));
	bool *models_ok = arena_alloc(p->arena, sizeof *models_ok * (size_t)(nmodels + 1));
	int k = 0;
	/* only: that plan's model (the other models and plans do not block it); fns and strategies
	 * always (a plan may use any) */
	const Item *only_model = only && only->for_model ? find_item(p, I_MODEL, only->for_model, only->module) : NULL;
	for (Module *m = p->modules; m; m = m->next)
		for (Item *it = m->items; it && !diag_stopped(); it = it->next) {
			if (it->kind == I_MODEL && only && it != only_model)
				continue;
			if (it->kind == I_MODEL) {
				models[k] = it;
				models_ok[k++] = check_model_hypers(p, it);
			}
			if (it->kind == I_MODEL || it->kind == I_FN)
				check_body_item(p, it);
			else if (it->kind == I_STRATEGY)
				check_strategy(p, it);
		}
	for (Module *m = p->modules; m; m = m->next)
		for (Item *it = m->items; it && !diag_stopped(); it = it->next) {
			if (it->kind != I_PLAN || (only && it != only))
				continue;
			Item *model = it->for_model ? find_item(p, I_MODEL, it->for_model, it->module) : NULL;
			bool ok = true;
			for (int i = 0; i < k; i++) /* few models: a file holds one, its imports none */
				if (models[i] == model)
					ok = models_ok[i];
			Arena *program_arena = plan_arena_begin(p); /* nothing of a checked plan is kept */
			build_plan(p, it, ok, true);
			plan_arena_end(p, program_arena);
		}
	return diag_error_count() == errors_before;
}

/* The plan `--plan NAME` names, or the main file's first plan; NULL if there is none (the
 * caller reports it). */
Item *default_plan(Program *p, const char *name)
{
	if (!p || !p->main)
		return NULL;
	for (Item *it = p->main->items; it; it = it->next)
		if (it->kind == I_PLAN && (!name || !strcmp(it->name, name)))
			return it;
	return NULL;
}

int axis_index(const PlanSpec *ps, const char *name)
{
	if (!ps || !name)
		return -1;
	for (int i = 0; i < ps->naxes; i++)
		if (!strcmp(ps->axes[i].name, name))
			return i;
	return -1;
}

const char *dtype_name(DType t)
{
	switch (t) {
	case DT_F32: return "f32";
	case DT_BF16: return "bf16";
	case DT_F16: return "f16";
	case DT_I32: return "i32";
	case DT_U8: return "u8";
	case DT_F64: return "f64";
	}
	return "?";
}

int dtype_bytes(DType t)
{
	switch (t) {
	case DT_F32: return 4;
	case DT_BF16: return 2;
	case DT_F16: return 2;
	case DT_I32: return 4;
	case DT_U8: return 1;
	case DT_F64: return 8;
	}
	return 0;
}
