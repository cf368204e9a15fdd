/* fuzz_frontend.c: libFuzzer harness for the front end. Any byte sequence goes through
 * parse_module; whatever parses is formatted, and the formatted text must parse again to the
 * same AST and format to the same text (fmt is a fixed point). Diagnostics go to /dev/null.
 * A crash, a sanitizer report, a leak or an abort() here is a bug in planc. plan_mutator.c (linked
 * in) mutates inputs through the grammar; at exit the share of inputs that parsed is printed.
 *
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DPLANC_FUZZ=ON && make -C build-fuzz fuzz_frontend
 *   build-fuzz/tests/fuzz/fuzz_frontend -max_total_time=60 tests/fuzz/corpus */
#include "front/front.h"

#include <stdlib.h>
#include <string.h>

static bool same_expr(const Expr *a, const Expr *b);

static bool same_str(const char *a, const char *b)
{
	return a == b || (a && b && !strcmp(a, b));
}

static bool same_args(const Arg *a, const Arg *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (!same_str(a->key, b->key) || !same_expr(a->value, b->value))
			return false;
	return !a && !b;
}

static bool same_exprs(const Expr *a, const Expr *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (!same_expr(a, b))
			return false;
	return !a && !b;
}

static bool same_expr(const Expr *a, const Expr *b)
{
	if (!a || !b)
		return a == b;
	if (a->kind != b->kind || a->op != b->op || a->ival != b->ival || !same_str(a->text, b->text))
		return false;
	if (a->fval != b->fval && !(a->fval != a->fval && b->fval != b->fval))
		return false;
	return same_expr(a->lhs, b->lhs) && same_expr(a->rhs, b->rhs) && same_args(a->args, b->args) &&
	       same_exprs(a->items, b->items);
}

static bool same_stmts(const Stmt *a, const Stmt *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (a->kind != b->kind || !same_str(a->name, b->name) || !same_str(a->dtype, b->dtype) ||
		    !same_exprs(a->dims, b->dims) || !same_expr(a->init, b->init) ||
		    !same_expr(a->value, b->value) || !same_stmts(a->body, b->body))
			return false;
	return !a && !b;
}

static bool same_pstmts(const PlanStmt *a, const PlanStmt *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (!same_str(a->word, b->word) || !same_args(a->args, b->args) || !same_pstmts(a->body, b->body))
			return false;
	return !a && !b;
}

static bool same_params(const Param *a, const Param *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (!same_str(a->name, b->name) || !same_expr(a->def, b->def))
			return false;
	return !a && !b;
}

static bool same_decorators(const Decorator *a, const Decorator *b)
{
	for (; a && b; a = a->next, b = b->next)
		if (!same_str(a->name, b->name))
			return false;
	return !a && !b;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* Same items and the same comment texts, locations aside. */
static bool same_module(const Module *a, const Module *b)
{
	const Item *x = a->items, *y = b->items;
	for (; x && y; x = x->next, y = y->next)
		if (x->kind != y->kind || !same_str(x->name, y->name) || !same_str(x->alias, y->alias) ||
		    !same_decorators(x->decorators, y->decorators) || !same_params(x->params, y->params) ||
		    !same_stmts(x->body, y->body) || !same_pstmts(x->rules, y->rules) ||
		    !same_str(x->for_model, y->for_model) || !same_args(x->model_args, y->model_args))
			return false;
	if (x || y)
		return false;
	const Comment *c = a->comments, *d = b->comments;
	for (; c && d; c = c->next, d = d->next) {
		int lc = c->loc.len, ld = d->loc.len;
		const char *tc = a->src.text + c->loc.off, *td = b->src.text + d->loc.off;
		while (lc > 1 && is_blank(tc[lc - 1])) /* fmt drops trailing blanks */
			lc--;
		while (ld > 1 && is_blank(td[ld - 1]))
			ld--;
		if (lc != ld || memcmp(tc, td, (size_t)lc))
			return false;
	}
	return !c && !d;
}

/* fmt m into a malloc'd buffer */
static char *format(const Module *m, size_t *len)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (!f)
		abort();
	fmt_module(f, m);
	fclose(f);
	return buf;
}

static long long inputs, parsed; /* how many inputs came, how many of them parsed */

static void report_parsed(void)
{
	if (inputs)
		fprintf(stderr, "fuzz: inputs that parse: %lld of %lld (%.0f%%)\n", parsed, inputs, 100.0 * parsed / inputs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static FILE *devnull;
	if (!devnull) {
		devnull = fopen("/dev/null", "w");
		if (!devnull)
			abort();
		diag_set_stream(devnull);
		atexit(report_parsed);
	}
	if (size > 1 << 20)
		return 0;
	diag_reset();
	Arena *a = arena_new();
	Module *m = parse_module(a, "fuzz.plan", (const char *)data, (int)size);
	inputs++;
	parsed += m != NULL;
	if (m) {
		size_t n1, n2;
		char *once = format(m, &n1);
		Module *m2 = parse_module(a, "fmt.plan", once, (int)n1);
		if (!m2) {
			fprintf(stderr, "formatted text does not parse:\n%s", once);
			abort();
		}
		if (!same_module(m, m2)) {
			fprintf(stderr, "formatted text parses to a different AST:\n%s", once);
			abort();
		}
		char *twice = format(m2, &n2);
		if (n1 != n2 || memcmp(once, twice, n1)) {
			fprintf(stderr, "fmt is not idempotent:\n--- once\n%s--- twice\n%s", once, twice);
			abort();
		}
		free(once);
		free(twice);
	}
	arena_free(a);
	return 0;
}
