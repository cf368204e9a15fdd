/* fmt.c: `planc fmt`, the canonical layout of a module.
 *
 * One statement per line, 2-space indentation, a blank line between items, single spaces
 * around binary operators except `.` and `..`, `key = value` in arguments, parentheses only
 * where precedence needs them, numbers spelled as in the source. Blank lines between
 * statements are kept (at most one). Comments stay where they were: a comment on the line
 * where the previous statement (or block header, or closing brace) ends is kept at the end of
 * that line; any other comment goes on its own line before whatever follows it.
 *
 * The printer walks the AST and the comment list together, by source offset: before it starts
 * a line for a node it flushes the comments that come before the node. The output is a fixed
 * point: fmt(fmt(x)) == fmt(x), and it parses to the same AST as x. */
#include "front/front.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct Fmt {
	FILE *out;
	const Source *src; /* with a line table (diag_index_lines) */
	const Comment *c; /* next comment to print */
	bool open;        /* the current output line is not finished */
	bool trailing;    /* ... and already ends with a comment */
	bool any;         /* something was printed */
	bool allow_blank; /* keep a source blank line before the next line */
	bool force_blank; /* a blank line before the next line (between items) */
	int last_line;    /* source line where the last printed thing ends */
	int last_end;     /* source offset where the construct on the current line ends */
} Fmt;

static void expr(Fmt *f, const Expr *e, int min_prec);

static int line_of(const Fmt *f, int off)
{
	int line, col;
	diag_line_col(f->src, off, &line, &col);
	return line;
}

static int end_of(Loc l)
{
	return l.off + l.len;
}

/* Finish the current line and start one at `indent` for something at source line src_line. */
static void start_line(Fmt *f, int indent, int src_line)
{
	if (f->open)
		fputc('\n', f->out);
	if (f->any && (f->force_blank || (f->allow_blank && src_line > f->last_line + 1)))
		fputc('\n', f->out);
	for (int i = 0; i < indent; i++)
		fputs("  ", f->out);
	f->force_blank = false;
	f->allow_blank = true;
	f->open = true;
	f->trailing = false;
	f->any = true;
	f->last_line = src_line;
	f->last_end = 0;
}

static void print_comment_text(Fmt *f, const Comment *c)
{
	int len = c->loc.len;
	const char *s = f->src->text + c->loc.off;
	while (len > 1 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\r'))
		len--;
	fwrite(s, 1, (size_t)len, f->out);
}

/* Print the comments that start before off: at the end of the current line when they are on
 * the source line where it ends or inside what it printed, else on lines of their own. */
static void comments_before(Fmt *f, int off, int indent)
{
	while (f->c && f->c->loc.off < off) {
		int line = line_of(f, f->c->loc.off);
		if (f->open && !f->trailing && (line == f->last_line || f->c->loc.off < f->last_end)) {
			fputs("  ", f->out);
			print_comment_text(f, f->c);
			f->trailing = true;
		} else {
			start_line(f, indent, line);
			print_comment_text(f, f->c);
			f->trailing = true;
			f->last_end = end_of(f->c->loc);
		}
		f->c = f->c->next;
	}
}

/* The '{' that opens the block after a header whose last part ends at off. */
static int brace_after(const Fmt *f, int off)
{
	const char *t = f->src->text;
	int n = f->src->len;
	while (off < n && t[off] != '{') {
		if (t[off] == '#')
			while (off < n && t[off] != '\n')
				off++;
		else
			off++;
	}
	return off;
}

/* ---- expressions */

enum { P_ARG, P_RANGE, P_ADD, P_MUL, P_UNARY, P_POSTFIX, P_PRIMARY };

static int prec(const Expr *e)
{
	switch (e->kind) {
	case E_BINARY:
		switch (e->op) {
		case 'A':
		case ':': return P_ARG;
		case 'R': return P_RANGE;
		case '+':
		case '-': return P_ADD;
		default: return P_MUL;
		}
	case E_NEG: return P_UNARY;
	case E_CALL:
	case E_MEMBER:
	case E_INDEX: return P_POSTFIX;
	default: return P_PRIMARY;
	}
}

static void string_lit(Fmt *f, const char *s)
{
	fputc('"', f->out);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f->out);
		fputc(*s, f->out);
	}
	fputc('"', f->out);
}

static void args(Fmt *f, const Arg *a)
{
	for (; a; a = a->next) {
		if (a->key)
			fprintf(f->out, "%s = ", a->key);
		expr(f, a->value, a->key ? P_RANGE : P_ARG);
		if (a->next)
			fputs(", ", f->out);
	}
}

static void expr_list(Fmt *f, const Expr *e)
{
	for (; e; e = e->next) {
		expr(f, e, P_RANGE);
		if (e->next)
			fputs(", ", f->out);
	}
}

static bool is_number(const Expr *e)
{
	return e->kind == E_INT || e->kind == E_FLOAT || e->kind == E_SIZE;
}

static void expr(Fmt *f, const Expr *e, int min_prec)
{
	if (!e)
		return;
	int p = prec(e);
	bool paren = p < min_prec;
	if (paren)
		fputc('(', f->out);
	switch (e->kind) {
	case E_INT: fprintf(f->out, "%lld", e->ival); break;
	case E_FLOAT:
	case E_SIZE:
		if (e->text)
			fputs(e->text, f->out);
		else
			fprintf(f->out, "%.17g", e->fval);
		break;
	case E_STRING: string_lit(f, e->text ? e->text : ""); break;
	case E_NAME: fputs(e->text, f->out); break;
	case E_STAR: fputc('*', f->out); break;
	case E_BINARY:
		if (e->op == 'R') { /* non-associative, no spaces */
			expr(f, e->lhs, P_ADD);
			fputs("..", f->out);
			expr(f, e->rhs, P_ADD);
		} else {
			expr(f, e->lhs, p == P_ARG ? P_RANGE : p);
			if (e->op == 'A')
				fputs(" -> ", f->out);
			else
				fprintf(f->out, " %c ", e->op);
			expr(f, e->rhs, p == P_ARG ? P_RANGE : p + 1);
		}
		break;
	case E_NEG: /* -(-a), not --a */
		fputc('-', f->out);
		expr(f, e->lhs, e->lhs && e->lhs->kind == E_NEG ? P_POSTFIX : P_UNARY);
		break;
	case E_CALL:
		expr(f, e->lhs, P_POSTFIX);
		fputc('(', f->out);
		args(f, e->args);
		fputc(')', f->out);
		break;
	case E_MEMBER:
		/* (3).x: 3.x would read as a number */
		if (is_number(e->lhs)) {
			fputc('(', f->out);
			expr(f, e->lhs, P_ARG);
			fputc(')', f->out);
		} else {
			expr(f, e->lhs, P_POSTFIX);
		}
		fputc('.', f->out);
		if (e->text)
			fputs(e->text, f->out);
		else if (e->rhs && e->rhs->kind == E_INT)
			fprintf(f->out, "%lld", e->rhs->ival);
		else
			fputc('*', f->out);
		break;
	case E_INDEX:
		expr(f, e->lhs, P_POSTFIX);
		fputc('[', f->out);
		for (const Expr *i = e->rhs; i; i = i->next) {
			if (i != e->rhs)
				fputs(", ", f->out);
			expr(f, i, P_RANGE);
		}
		fputc(']', f->out);
		break;
	case E_TUPLE:
		fputc('(', f->out);
		expr_list(f, e->items);
		fputc(')', f->out);
		break;
	case E_LIST:
		fputc('[', f->out);
		expr_list(f, e->items);
		fputc(']', f->out);
		break;
	}
	if (paren)
		fputc(')', f->out);
}

/* ---- statements */

/* Open a block: " {" ends the header line; comments inside the header (before the '{') follow
 * it. Returns false for an empty block with no comments, printed as "{}". */
static bool open_block(Fmt *f, int header_end, Loc whole, bool empty, int indent)
{
	int brace = brace_after(f, header_end);
	int close = end_of(whole) - 1;
	if (empty && !(f->c && f->c->loc.off < close)) {
		fputs(" {}", f->out);
		f->last_line = line_of(f, close);
		f->last_end = close + 1;
		return false;
	}
	fputs(" {", f->out);
	f->last_line = line_of(f, brace);
	f->last_end = brace + 1;
	f->allow_blank = false;
	comments_before(f, brace, indent + 1);
	return true;
}

static void close_block(Fmt *f, Loc whole, int indent)
{
	int close = end_of(whole) - 1;
	comments_before(f, close, indent + 1);
	f->allow_blank = false;
	start_line(f, indent, line_of(f, close));
	fputc('}', f->out);
	f->last_end = close + 1;
}

static void model_stmts(Fmt *f, const Stmt *s, int indent);
static void plan_stmts(Fmt *f, const PlanStmt *s, int indent);

static void tensor_type(Fmt *f, const Stmt *s)
{
	fputs(s->dtype, f->out);
	if (s->dims) {
		fputc('[', f->out);
		expr_list(f, s->dims);
		fputc(']', f->out);
	}
}

static void model_stmt(Fmt *f, const Stmt *s, int indent)
{
	comments_before(f, s->loc.off, indent);
	start_line(f, indent, line_of(f, s->loc.off));
	switch (s->kind) {
	case S_INPUT:
		fprintf(f->out, "input %s : ", s->name);
		tensor_type(f, s);
		break;
	case S_PARAM:
		fprintf(f->out, "%s %s : ", s->buffer ? "buffer" : "param", s->name);
		tensor_type(f, s);
		if (s->init) {
			fputs(" ~ ", f->out);
			expr(f, s->init, P_RANGE);
		}
		break;
	case S_ASSIGN:
		fprintf(f->out, "%s = ", s->name);
		expr(f, s->value, P_RANGE);
		break;
	case S_RETURN:
		fputs("return ", f->out);
		expr(f, s->value, P_RANGE);
		break;
	case S_REPEAT:
		fputs("repeat ", f->out);
		expr(f, s->value, P_RANGE);
		if (open_block(f, end_of(s->value->loc), s->loc, !s->body, indent)) {
			model_stmts(f, s->body, indent + 1);
			close_block(f, s->loc, indent);
		}
		return;
	}
	f->last_line = line_of(f, end_of(s->loc) - (s->loc.len > 0));
	f->last_end = end_of(s->loc);
}

static void model_stmts(Fmt *f, const Stmt *s, int indent)
{
	for (; s; s = s->next)
		model_stmt(f, s, indent);
}

enum { FMT_WIDTH = 100 }; /* a `use` longer than this wraps its arguments */

/* The printed width of a call expression on one line. */
static size_t call_width(Fmt *f, const Expr *e)
{
	char *text = NULL;
	size_t n = 0;
	FILE *mem = open_memstream(&text, &n), *out = f->out;
	if (!mem)
		return 0;
	f->out = mem;
	expr(f, e, P_ARG);
	f->out = out;
	fclose(mem);
	free(text);
	return n;
}

/* `use nn.tensor_parallel(tensor, column = [...], row = [...])` over FMT_WIDTH columns: the
 * first argument on the statement's line, each other on a line of its own, 4 spaces deeper */
static bool use_wrapped(Fmt *f, const PlanStmt *s, int indent)
{
	const Expr *call = s->args && !s->args->next && !s->args->key ? s->args->value : NULL;
	if (strcmp(s->word, "use") || !call || call->kind != E_CALL || !call->args || !call->args->next ||
	    (size_t)(2 * indent) + 4 + call_width(f, call) <= FMT_WIDTH)
		return false;
	fputs(" ", f->out);
	expr(f, call->lhs, P_POSTFIX);
	fputc('(', f->out);
	for (const Arg *a = call->args; a; a = a->next) {
		if (a != call->args)
			fprintf(f->out, ",\n%*s", 2 * indent + 4, "");
		args(f, &(Arg){.key = a->key, .value = a->value});
	}
	fputc(')', f->out);
	return true;
}

static void plan_stmt(Fmt *f, const PlanStmt *s, int indent)
{
	comments_before(f, s->loc.off, indent);
	start_line(f, indent, line_of(f, s->loc.off));
	fputs(s->word, f->out);
	int header_end = end_of(s->word_loc);
	bool wrapped = use_wrapped(f, s, indent);
	for (const Arg *a = wrapped ? NULL : s->args; a; a = a->next) {
		bool over = a->key && !strcmp(a->key, "over") && a->value && a->value->kind == E_NAME;
		if (over)
			fprintf(f->out, " over %s", a->value->text);
		else {
			fputs(a == s->args ? " " : ", ", f->out);
			args(f, &(Arg){.key = a->key, .value = a->value});
		}
		header_end = end_of(a->loc);
	}
	if (wrapped)
		header_end = end_of(s->args->loc);
	if (s->body || end_of(s->loc) > header_end) { /* `stage 0 { ... }` */
		if (open_block(f, header_end, s->loc, !s->body, indent)) {
			plan_stmts(f, s->body, indent + 1);
			close_block(f, s->loc, indent);
		}
		return;
	}
	f->last_line = line_of(f, end_of(s->loc) - (s->loc.len > 0));
	f->last_end = end_of(s->loc);
}

static void plan_stmts(Fmt *f, const PlanStmt *s, int indent)
{
	for (; s; s = s->next)
		plan_stmt(f, s, indent);
}

/* "(a, b = 1)", nothing when there are none (`model m {`); returns where the last one ends */
static int params(Fmt *f, const Param *p, int end)
{
	if (!p)
		return end;
	fputc('(', f->out);
	for (; p; p = p->next) {
		fputs(p->name, f->out);
		if (p->def) {
			fputs(" = ", f->out);
			expr(f, p->def, P_RANGE);
		}
		if (p->next)
			fputs(", ", f->out);
		end = end_of(p->loc);
	}
	fputc(')', f->out);
	return end;
}

static void item(Fmt *f, const Item *it)
{
	comments_before(f, it->loc.off, 0);
	start_line(f, 0, line_of(f, it->loc.off));
	int header_end = end_of(it->name_loc);
	switch (it->kind) {
	case I_IMPORT: {
		fprintf(f->out, "import %s", it->name);
		const char *dot = strrchr(it->name, '.');
		const char *last = dot ? dot + 1 : it->name;
		if (it->alias && strcmp(it->alias, last))
			fprintf(f->out, " as %s", it->alias);
		f->last_line = line_of(f, end_of(it->loc) - (it->loc.len > 0));
		f->last_end = end_of(it->loc);
		return;
	}
	case I_MODEL:
	case I_FN:
		for (const Decorator *d = it->decorators; d; d = d->next)
			fprintf(f->out, "@%s ", d->name);
		fprintf(f->out, "%s %s", it->kind == I_MODEL ? "model" : "fn", it->name);
		header_end = params(f, it->params, header_end);
		if (it->kind == I_FN && !it->params)
			fputs("()", f->out);
		if (open_block(f, header_end, it->loc, !it->body, 0)) {
			model_stmts(f, it->body, 1);
			close_block(f, it->loc, 0);
		}
		return;
	case I_STRATEGY:
	case I_PLAN:
		if (it->kind == I_STRATEGY) {
			fprintf(f->out, "strategy %s", it->name);
			header_end = params(f, it->params, header_end);
		} else {
			fprintf(f->out, "plan %s for %s", it->name, it->for_model);
			header_end = end_of(it->for_loc);
			if (it->model_args) {
				fputc('(', f->out);
				args(f, it->model_args);
				fputc(')', f->out);
				for (const Arg *a = it->model_args; a; a = a->next)
					header_end = end_of(a->loc);
			}
		}
		if (open_block(f, header_end, it->loc, !it->rules, 0)) {
			plan_stmts(f, it->rules, 1);
			close_block(f, it->loc, 0);
		}
		return;
	}
}

void fmt_module(FILE *out, const Module *m)
{
	Fmt f = {0};
	Arena *a = arena_new();
	Source src = m->src;
	diag_index_lines(a, &src);
	f.out = out;
	f.src = &src;
	f.c = m->comments;

	for (const Item *it = m->items, *prev = NULL; it; prev = it, it = it->next) {
		/* a blank line between items, but a run of imports stays together */
		if (prev && !(prev->kind == I_IMPORT && it->kind == I_IMPORT))
			f.force_blank = true;
		item(&f, it);
	}
	comments_before(&f, INT_MAX, 0);
	if (f.open)
		fputc('\n', out);
	arena_free(a);
}
