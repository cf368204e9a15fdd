/* parser.y: the grammar of the plan language (docs/language.md), a pure bison parser that builds
 * the AST of planc.h in the compilation's arena.
 *
 * There is no newline token: a statement ends where the next one starts, because no statement
 * starts with a token that could continue an expression (statements start with a keyword or a
 * word, and a word never follows an expression). `;` is accepted between statements.
 *
 * Errors: yyreport_syntax_error names the unexpected token and what was expected, or, when a
 * closing bracket is what is missing, the bracket that is still open ('}' expected (to close
 * 'plan' at line 3)). Each statement list and the item list have an `error` alternative; when
 * it is reduced, recover() puts the lexer in skip mode, which drops the rest of the line that
 * failed (and any block opened on it), so parsing resumes at the next statement and later
 * errors in the same file are reported too. */

%code requires {
#include "front/front.h"

#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif

#define PARSE_MAX_OPEN 256       /* brackets open at once */
#define PARSE_MAX_EXPR_DEPTH 200 /* expression nesting, so later recursive passes stay shallow */
#define PARSE_MAX_ERRORS 50      /* diagnostics per file before the parser gives up */

typedef struct OpenBracket {
	int ch;
	int off;
	const char *word; /* the statement that opened a '{' */
	int word_off;
} OpenBracket;

/* State shared by the lexer (grammar/lexer.l), the parser and parse_module (compiler/ast.c). */
typedef struct ParseCtx {
	Arena *arena;
	Module *mod;
	const Source *src;
	Item **item_tail;
	Comment **comment_tail;
	int errors;          /* diagnostics reported for this file */
	bool depth_reported; /* "nested too deeply" was reported */

	/* lexer state */
	int off;        /* byte offset of the next character */
	bool nl_seen;   /* a newline was seen since the last token */
	bool tok_bol;   /* the last token is the first on its line */
	int raw_prev;   /* the last token the scanner produced (skipped ones included) */
	int last_tok;   /* the last token handed to the parser */
	const char *stmt_word; /* first word of the current statement, for hints */
	int stmt_word_off;

	/* error recovery: drop the rest of the failed line, and blocks opened on it */
	bool skip;
	int skip_depth;

	/* brackets open at the parser's position, innermost last */
	OpenBracket open[PARSE_MAX_OPEN];
	int nopen;
	int open_overflow;
	OpenBracket mismatch; /* the last token closed over this unclosed bracket */
	bool mismatch_valid;
} ParseCtx;
}

%code provides {
int yylex(YYSTYPE *lval, YYLTYPE *lloc, yyscan_t scanner);
int yyparse(yyscan_t scanner, ParseCtx *pc);
/* parse_expr_new: like expr_new, and records the node's depth for the nesting limit */
Expr *parse_expr_new(ParseCtx *pc, ExprKind k, Loc loc);
void parse_error(ParseCtx *pc, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
}

%define api.pure full
%define api.location.type {Loc}
%locations
%define parse.error custom
%define parse.lac full
%expect 0
%param {yyscan_t scanner}
%parse-param {ParseCtx *pc}

%initial-action {
	@$.off = 0;
	@$.len = 0;
}

%union {
	const char *str;
	Expr *expr;
	struct { Expr *head, *tail; } exprs;
	Arg *arg;
	struct { Arg *head, *tail; } args;
	Param *param;
	struct { Param *head, *tail; } params;
	Stmt *stmt;
	struct { Stmt *head, *tail; } stmts;
	PlanStmt *pstmt;
	struct { PlanStmt *head, *tail; } pstmts;
	Item *item;
	struct { Decorator *head, *tail; } decos;
	struct { const char *name; Loc loc; Expr *dims; } ttype;
}

%code {
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Locations are byte ranges; a node spans its first non-empty part to its last part. */
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                                           \
	do {                                                                                      \
		if (N) {                                                                          \
			int i_ = 1;                                                               \
			while (i_ < (N) && YYRHSLOC(Rhs, i_).len == 0)                            \
				i_++;                                                             \
			(Cur).off = YYRHSLOC(Rhs, i_).off;                                        \
			int e_ = YYRHSLOC(Rhs, N).off + YYRHSLOC(Rhs, N).len;                     \
			(Cur).len = e_ > (Cur).off ? e_ - (Cur).off : 0;                          \
		} else {                                                                          \
			(Cur).off = YYRHSLOC(Rhs, 0).off + YYRHSLOC(Rhs, 0).len;                  \
			(Cur).len = 0;                                                            \
		}                                                                                 \
	} while (0)

static void yyerror(Loc *loc, yyscan_t scanner, ParseCtx *pc, const char *msg);
static void recover(ParseCtx *pc, int lookahead);
static Expr *mk_binary(ParseCtx *pc, int op, Expr *l, Expr *r, Loc loc);
static Expr *mk_unary(ParseCtx *pc, ExprKind k, Expr *l, Loc loc);
static Expr *mk_index(ParseCtx *pc, Expr *l, Expr *r, Loc loc);
static Expr *mk_call(ParseCtx *pc, Expr *fn, Arg *args, Loc loc);
static Expr *mk_member(ParseCtx *pc, Expr *l, const char *name, Expr *rhs, Loc loc);
static Expr *mk_items(ParseCtx *pc, ExprKind k, Expr *items, Loc loc);
static Expr *mk_name(ParseCtx *pc, const char *name, Loc loc);
static Item *mk_item(ParseCtx *pc, ItemKind k, Loc loc);
static Stmt *mk_stmt(ParseCtx *pc, StmtKind k, Loc loc);
static PlanStmt *mk_pstmt(ParseCtx *pc, const char *word, Loc word_loc, Arg *args, PlanStmt *body, Loc loc);
static const char *join_path(ParseCtx *pc, Expr *segs);

#define APPEND(dst, src, x)            \
	do {                           \
		(dst) = (src);         \
		if ((dst).tail)        \
			(dst).tail->next = (x); \
		else                   \
			(dst).head = (x);  \
		(dst).tail = (x);      \
	} while (0)
#define SINGLE(dst, x) ((dst).head = (dst).tail = (x))
}

%token END 0 "end of file"
%token <str> IDENT "identifier"
%token <expr> INT "integer"
%token <expr> FLOAT "number"
%token <expr> SIZE "size"
%token <expr> STRING "string"
%token IMPORT "import" AS "as" MODEL "model" FN "fn" STRATEGY "strategy" PLAN "plan"
%token FOR "for" INPUT "input" PARAM "param" BUFFER "buffer" REPEAT "repeat" RETURN "return" OVER "over"
%token DOTDOT ".." ARROW "->"

%type <item> item import model fn strategy plan
%type <exprs> dotted exprs
%type <decos> decorators
%type <params> opt_params params
%type <param> param
%type <args> opt_args args plan_args
%type <arg> arg plan_arg
%type <stmts> model_stmts
%type <stmt> model_stmt
%type <pstmts> plan_stmts
%type <pstmt> plan_stmt
%type <ttype> ttype
%type <expr> expr add mul unary postfix primary

%%

module
	: items
	;

items
	: %empty
	| items item         { *pc->item_tail = $2; pc->item_tail = &$2->next; }
	| items ';'
	| items error        { recover(pc, yychar); }
	;

item
	: import
	| model
	| fn
	| strategy
	| plan
	;

/* import std.nn [as NAME] */
import
	: "import" dotted {
		$$ = mk_item(pc, I_IMPORT, @$);
		$$->name = join_path(pc, $2.head);
		$$->name_loc = @2;
		$$->alias = $2.tail->text;
	}
	| "import" dotted "as" IDENT {
		$$ = mk_item(pc, I_IMPORT, @$);
		$$->name = join_path(pc, $2.head);
		$$->name_loc = @2;
		$$->alias = $4;
	}
	;

dotted
	: IDENT              { Expr *e = mk_name(pc, $1, @1); SINGLE($$, e); }
	| dotted '.' IDENT   { Expr *e = mk_name(pc, $3, @3); APPEND($$, $1, e); }
	;

/* model NAME(HYPER = expr, ...) { model-stmt* } */
model
	: "model" IDENT opt_params '{' model_stmts '}' {
		$$ = mk_item(pc, I_MODEL, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->params = $3.head;
		$$->body = $5.head;
	}
	;

/* @deco ... fn NAME(arg, arg = default) { model-stmt* } */
fn
	: decorators "fn" IDENT opt_params '{' model_stmts '}' {
		$$ = mk_item(pc, I_FN, @$);
		$$->name = $3;
		$$->name_loc = @3;
		$$->decorators = $1.head;
		$$->params = $4.head;
		$$->body = $6.head;
	}
	;

decorators
	: %empty             { $$.head = $$.tail = NULL; }
	| decorators '@' IDENT {
		Decorator *d = arena_alloc(pc->arena, sizeof *d);
		d->name = $3;
		d->loc = loc_span(@2, @3);
		APPEND($$, $1, d);
	}
	;

/* strategy NAME(arg, ...) { plan-stmt* } */
strategy
	: "strategy" IDENT opt_params '{' plan_stmts '}' {
		$$ = mk_item(pc, I_STRATEGY, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->params = $3.head;
		$$->rules = $5.head;
	}
	;

/* plan NAME for MODEL[(HYPER = expr, ...)] { plan-stmt* } */
plan
	: "plan" IDENT "for" IDENT opt_args '{' plan_stmts '}' {
		$$ = mk_item(pc, I_PLAN, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->for_model = $4;
		$$->for_loc = @4;
		$$->model_args = $5.head;
		$$->rules = $7.head;
	}
	;

opt_params
	: %empty             { $$.head = $$.tail = NULL; }
	| '(' ')'            { $$.head = $$.tail = NULL; }
	| '(' params ')'     { $$ = $2; }
	;

params
	: param              { SINGLE($$, $1); }
	| params ',' param   { APPEND($$, $1, $3); }
	;

param
	: IDENT {
		$$ = arena_alloc(pc->arena, sizeof *$$);
		$$->name = $1;
		$$->loc = @1;
	}
	| IDENT '=' expr {
		$$ = arena_alloc(pc->arena, sizeof *$$);
		$$->name = $1;
		$$->loc = @$;
		$$->def = $3;
	}
	;

opt_args
	: %empty             { $$.head = $$.tail = NULL; }
	| '(' ')'            { $$.head = $$.tail = NULL; }
	| '(' args ')'       { $$ = $2; }
	;

/* ---- model statements */

model_stmts
	: %empty             { $$.head = $$.tail = NULL; }
	| model_stmts model_stmt { APPEND($$, $1, $2); }
	| model_stmts ';'    { $$ = $1; }
	| model_stmts error  { $$ = $1; recover(pc, yychar); }
	;

model_stmt
	: "input" IDENT ':' ttype {
		$$ = mk_stmt(pc, S_INPUT, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->dtype = $4.name;
		$$->dtype_loc = $4.loc;
		$$->dims = $4.dims;
	}
	| "param" IDENT ':' ttype {
		$$ = mk_stmt(pc, S_PARAM, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->dtype = $4.name;
		$$->dtype_loc = $4.loc;
		$$->dims = $4.dims;
	}
	| "param" IDENT ':' ttype '~' expr {
		$$ = mk_stmt(pc, S_PARAM, @$);
		$$->name = $2;
		$$->name_loc = @2;
		$$->dtype = $4.name;
		$$->dtype_loc = $4.loc;
		$$->dims = $4.dims;
		$$->init = $6;
	}
	| "buffer" IDENT ':' ttype {
		$$ = mk_stmt(pc, S_PARAM, @$);
		$$->buffer = true;
		$$->name = $2;
		$$->name_loc = @2;
		$$->dtype = $4.name;
		$$->dtype_loc = $4.loc;
		$$->dims = $4.dims;
	}
	| "buffer" IDENT ':' ttype '~' expr {
		$$ = mk_stmt(pc, S_PARAM, @$);
		$$->buffer = true;
		$$->name = $2;
		$$->name_loc = @2;
		$$->dtype = $4.name;
		$$->dtype_loc = $4.loc;
		$$->dims = $4.dims;
		$$->init = $6;
	}
	| IDENT '=' expr {
		$$ = mk_stmt(pc, S_ASSIGN, @$);
		$$->name = $1;
		$$->name_loc = @1;
		$$->value = $3;
	}
	| "repeat" expr '{' model_stmts '}' {
		$$ = mk_stmt(pc, S_REPEAT, @$);
		$$->value = $2;
		$$->body = $4.head;
	}
	| "return" expr {
		$$ = mk_stmt(pc, S_RETURN, @$);
		$$->value = $2;
	}
	;

/* DTYPE[dim, ...]; `f32` and `f32[]` are scalars (no dims) */
ttype
	: IDENT              { $$.name = $1; $$.loc = @1; $$.dims = NULL; }
	| IDENT '[' ']'      { $$.name = $1; $$.loc = @1; $$.dims = NULL; }
	| IDENT '[' exprs ']' { $$.name = $1; $$.loc = @1; $$.dims = $3.head; }
	;

/* ---- plan statements: WORD arg, arg, ... [{ plan-stmt* }] */

plan_stmts
	: %empty             { $$.head = $$.tail = NULL; }
	| plan_stmts plan_stmt { APPEND($$, $1, $2); }
	| plan_stmts ';'     { $$ = $1; }
	| plan_stmts error   { $$ = $1; recover(pc, yychar); }
	;

plan_stmt
	: IDENT plan_args    { $$ = mk_pstmt(pc, $1, @1, $2.head, NULL, @$); }
	| IDENT plan_args '{' plan_stmts '}' { $$ = mk_pstmt(pc, $1, @1, $2.head, $4.head, @$); }
	;

/* `over AXIS` may follow the previous argument without a comma: `zero 2 over data` */
plan_args
	: plan_arg           { SINGLE($$, $1); }
	| plan_args ',' plan_arg { APPEND($$, $1, $3); }
	| plan_args "over" IDENT {
		Arg *a = arg_new(pc->arena, "over", @2, mk_name(pc, $3, @3), loc_span(@2, @3));
		APPEND($$, $1, a);
	}
	;

plan_arg
	: expr               { $$ = arg_new(pc->arena, NULL, @1, $1, @1); }
	| IDENT '=' expr     { $$ = arg_new(pc->arena, $1, @1, $3, @$); }
	| "over" IDENT       { $$ = arg_new(pc->arena, "over", @1, mk_name(pc, $2, @2), @$); }
	| expr "->" expr     { $$ = arg_new(pc->arena, NULL, @1, mk_binary(pc, 'A', $1, $3, @$), @$); }
	| expr ':' expr      { $$ = arg_new(pc->arena, NULL, @1, mk_binary(pc, ':', $1, $3, @$), @$); }
	;

/* ---- expressions, loosest first: range, additive, multiplicative, unary, postfix, primary */

expr
	: add
	| add ".." add       { $$ = mk_binary(pc, 'R', $1, $3, @$); }
	;

add
	: mul
	| add '+' mul        { $$ = mk_binary(pc, '+', $1, $3, @$); }
	| add '-' mul        { $$ = mk_binary(pc, '-', $1, $3, @$); }
	;

mul
	: unary
	| mul '*' unary      { $$ = mk_binary(pc, '*', $1, $3, @$); }
	| mul '/' unary      { $$ = mk_binary(pc, '/', $1, $3, @$); }
	| mul '%' unary      { $$ = mk_binary(pc, '%', $1, $3, @$); }
	| mul '@' unary      { $$ = mk_binary(pc, '@', $1, $3, @$); }
	;

unary
	: postfix
	| '-' unary          { $$ = mk_unary(pc, E_NEG, $2, @$); }
	;

postfix
	: primary
	| postfix '(' ')'    { $$ = mk_call(pc, $1, NULL, @$); }
	| postfix '(' args ')' { $$ = mk_call(pc, $1, $3.head, @$); }
	| postfix '.' IDENT  { $$ = mk_member(pc, $1, $3, NULL, @$); }
	| postfix '.' INT    { $$ = mk_member(pc, $1, $3->text, $3, @$); }
	| postfix '.' '*'    { $$ = mk_member(pc, $1, "*", parse_expr_new(pc, E_STAR, @3), @$); }
	| postfix '[' exprs ']' { $$ = mk_index(pc, $1, $3.head, @$); } /* x[i, _, j]: the indices linked through next */
	;

primary
	: INT
	| FLOAT
	| SIZE
	| STRING
	| IDENT              { $$ = mk_name(pc, $1, @1); }
	| '*'                { $$ = parse_expr_new(pc, E_STAR, @1); }
	| '(' expr ')'       { $$ = $2; }
	| '(' expr ',' exprs ')' { $2->next = $4.head; $$ = mk_items(pc, E_TUPLE, $2, @$); }
	| '[' ']'            { $$ = mk_items(pc, E_LIST, NULL, @$); }
	| '[' exprs ']'      { $$ = mk_items(pc, E_LIST, $2.head, @$); }
	;

exprs
	: expr               { SINGLE($$, $1); }
	| exprs ',' expr     { APPEND($$, $1, $3); }
	;

args
	: arg                { SINGLE($$, $1); }
	| args ',' arg       { APPEND($$, $1, $3); }
	;

arg
	: expr               { $$ = arg_new(pc->arena, NULL, @1, $1, @1); }
	| IDENT '=' expr     { $$ = arg_new(pc->arena, $1, @1, $3, @$); }
	;

%%

/* ---- nodes */

/* Every expression the parser builds sits in a box that remembers its depth, so that the
 * nesting limit costs O(1) per node. */
typedef struct ExprBox {
	int depth;
	Expr e;
} ExprBox;

static ExprBox *box_of(const Expr *e)
{
	return (ExprBox *)((char *)(uintptr_t)e - offsetof(ExprBox, e));
}

Expr *parse_expr_new(ParseCtx *pc, ExprKind k, Loc loc)
{
	ExprBox *b = arena_alloc(pc->arena, sizeof *b);
	b->depth = 1;
	b->e.kind = k;
	b->e.loc = loc;
	return &b->e;
}

static int depth(const Expr *e)
{
	return e ? box_of(e)->depth : 0;
}

static void set_depth(ParseCtx *pc, Expr *e, int d)
{
	box_of(e)->depth = d;
	if (d > PARSE_MAX_EXPR_DEPTH && !pc->depth_reported) {
		pc->depth_reported = true;
		parse_error(pc, e->loc, "expression nested too deeply (more than %d levels)", PARSE_MAX_EXPR_DEPTH);
	}
}

static int max_int(int a, int b)
{
	return a > b ? a : b;
}

static Expr *mk_pair(ParseCtx *pc, ExprKind k, int op, Expr *l, Expr *r, Loc loc)
{
	Expr *e = parse_expr_new(pc, k, loc);
	e->op = op;
	e->lhs = l;
	e->rhs = r;
	set_depth(pc, e, 1 + max_int(depth(l), depth(r)));
	return e;
}

static Expr *mk_binary(ParseCtx *pc, int op, Expr *l, Expr *r, Loc loc)
{
	return mk_pair(pc, E_BINARY, op, l, r, loc);
}

static Expr *mk_index(ParseCtx *pc, Expr *l, Expr *r, Loc loc)
{
	return mk_pair(pc, E_INDEX, 0, l, r, loc);
}

static Expr *mk_unary(ParseCtx *pc, ExprKind k, Expr *l, Loc loc)
{
	Expr *e = parse_expr_new(pc, k, loc);
	e->lhs = l;
	set_depth(pc, e, 1 + depth(l));
	return e;
}

static Expr *mk_call(ParseCtx *pc, Expr *fn, Arg *args, Loc loc)
{
	Expr *e = parse_expr_new(pc, E_CALL, loc);
	e->lhs = fn;
	e->args = args;
	int d = depth(fn);
	for (Arg *a = args; a; a = a->next)
		d = max_int(d, depth(a->value));
	set_depth(pc, e, 1 + d);
	return e;
}

/* a.name (rhs NULL), a.3 (rhs E_INT) or a.* (rhs E_STAR); text is the field as written */
static Expr *mk_member(ParseCtx *pc, Expr *l, const char *name, Expr *rhs, Loc loc)
{
	Expr *e = parse_expr_new(pc, E_MEMBER, loc);
	e->lhs = l;
	e->text = name;
	e->rhs = rhs;
	set_depth(pc, e, 1 + depth(l));
	return e;
}

static Expr *mk_items(ParseCtx *pc, ExprKind k, Expr *items, Loc loc)
{
	Expr *e = parse_expr_new(pc, k, loc);
	e->items = items;
	int d = 0;
	for (Expr *i = items; i; i = i->next)
		d = max_int(d, depth(i));
	set_depth(pc, e, 1 + d);
	return e;
}

static Expr *mk_name(ParseCtx *pc, const char *name, Loc loc)
{
	Expr *e = parse_expr_new(pc, E_NAME, loc);
	e->text = name;
	return e;
}

static Item *mk_item(ParseCtx *pc, ItemKind k, Loc loc)
{
	Item *it = arena_alloc(pc->arena, sizeof *it);
	it->kind = k;
	it->loc = loc;
	it->module = pc->mod;
	return it;
}

static Stmt *mk_stmt(ParseCtx *pc, StmtKind k, Loc loc)
{
	Stmt *s = arena_alloc(pc->arena, sizeof *s);
	s->kind = k;
	s->loc = loc;
	return s;
}

static PlanStmt *mk_pstmt(ParseCtx *pc, const char *word, Loc word_loc, Arg *args, PlanStmt *body, Loc loc)
{
	PlanStmt *p = arena_alloc(pc->arena, sizeof *p);
	p->word = word;
	p->word_loc = word_loc;
	p->args = args;
	p->body = body;
	p->loc = loc;
	return p;
}

/* std . nn -> "std.nn", in one allocation however long the path */
static const char *join_path(ParseCtx *pc, Expr *segs)
{
	size_t n = 0;
	for (Expr *s = segs; s; s = s->next)
		n += strlen(s->text) + 1;
	char *p = arena_alloc(pc->arena, n + 1), *q = p;
	for (Expr *s = segs; s; s = s->next) {
		if (s != segs)
			*q++ = '.';
		size_t l = strlen(s->text);
		memcpy(q, s->text, l);
		q += l;
	}
	*q = 0;
	return p;
}

/* ---- errors */

void parse_error(ParseCtx *pc, Loc loc, const char *fmt, ...)
{
	pc->errors++;
	if (pc->errors > PARSE_MAX_ERRORS)
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	diag_error(pc->src, loc, "%s", buf);
	if (pc->errors == PARSE_MAX_ERRORS)
		diag_note_plain("too many errors in %s; stopping", pc->src->path);
}

static void yyerror(Loc *loc, yyscan_t scanner, ParseCtx *pc, const char *msg)
{
	(void)scanner;
	if (!strcmp(msg, "memory exhausted")) /* the parser's stack, i.e. nesting */
		parse_error(pc, *loc, "input nested too deeply");
	else
		parse_error(pc, *loc, "%s", msg);
}

static int line_of(const ParseCtx *pc, int off)
{
	int line, col;
	diag_line_col(pc->src, off, &line, &col);
	return line;
}

/* `'x'`, `identifier 'foo'`, `end of file`: the token at loc as the user wrote it */
static void describe(const ParseCtx *pc, yysymbol_kind_t sym, Loc loc, char *buf, size_t size)
{
	if (sym == YYSYMBOL_YYEOF) {
		snprintf(buf, size, "end of file");
		return;
	}
	char text[40];
	int n = 0;
	for (int i = 0; i < loc.len && loc.off + i < pc->src->len && n < 32; i++) {
		unsigned char c = (unsigned char)pc->src->text[loc.off + i];
		text[n++] = (c < 32 || c == 127) ? '?' : (char)c;
	}
	if (loc.len > 32)
		text[n++] = '.', text[n++] = '.', text[n++] = '.';
	text[n] = 0;
	const char *kind = NULL;
	switch (sym) {
	case YYSYMBOL_IDENT: kind = "identifier"; break;
	case YYSYMBOL_INT: kind = "integer"; break;
	case YYSYMBOL_FLOAT: kind = "number"; break;
	case YYSYMBOL_SIZE: kind = "size"; break;
	case YYSYMBOL_STRING: kind = "string"; break;
	default: break;
	}
	if (kind)
		snprintf(buf, size, "%s '%s'", kind, text);
	else
		snprintf(buf, size, "'%s'", text);
}

/* the name of an expected token: 'for', '}', identifier, ... */
static const char *sym_name(yysymbol_kind_t sym, char *buf, size_t size)
{
	const char *n = yysymbol_name(sym);
	bool word = sym == YYSYMBOL_IDENT || sym == YYSYMBOL_INT || sym == YYSYMBOL_FLOAT || sym == YYSYMBOL_SIZE ||
	            sym == YYSYMBOL_STRING || sym == YYSYMBOL_YYEOF;
	if (word || n[0] == '\'')
		return n;
	snprintf(buf, size, "'%s'", n);
	return buf;
}

static bool is_item_keyword(yysymbol_kind_t s)
{
	return s == YYSYMBOL_IMPORT || s == YYSYMBOL_MODEL || s == YYSYMBOL_FN || s == YYSYMBOL_STRATEGY ||
	       s == YYSYMBOL_PLAN;
}

static bool is_closer(yysymbol_kind_t s)
{
	return s == YYTRANSLATE(')') || s == YYTRANSLATE(']') || s == YYTRANSLATE('}');
}

static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, ParseCtx *pc)
{
	(void)scanner;
	yysymbol_kind_t la = yypcontext_token(ctx);
	Loc loc = *yypcontext_location(ctx);
	yysymbol_kind_t exp[YYNTOKENS];
	int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
	if (n < 0)
		return n;
	bool expected[YYNTOKENS];
	memset(expected, 0, sizeof expected);
	for (int i = 0; i < n; i++)
		expected[exp[i]] = true;

	char found[80];
	describe(pc, la, loc, found, sizeof found);

	/* A missing closing bracket: name the one that is still open (for a closer that did not
	 * match, the one it closed over). */
	const OpenBracket *top = NULL;
	if (is_closer(la) && pc->mismatch_valid)
		top = &pc->mismatch;
	else if (pc->nopen > 0 && !pc->open_overflow)
		top = &pc->open[pc->nopen - 1];
	if (top) {
		const int closer = top->ch == '{' ? '}' : top->ch == '(' ? ')' : ']';
		if (expected[YYTRANSLATE(closer)] &&
		    (la == YYSYMBOL_YYEOF || is_item_keyword(la) || is_closer(la) || pc->tok_bol)) {
			if (top->ch == '{' && top->word)
				parse_error(pc, loc, "'}' expected (to close '%s' at line %d)", top->word,
				            line_of(pc, top->word_off));
			else
				parse_error(pc, loc, "'%c' expected (to close '%c' at line %d)", closer, top->ch,
				            line_of(pc, top->off));
			return 0;
		}
	}

	/* Otherwise list what could come, folding the tokens that start an expression. */
	const yysymbol_kind_t expr_start[] = {YYSYMBOL_IDENT, YYSYMBOL_INT, YYSYMBOL_FLOAT, YYSYMBOL_SIZE,
	                                      YYSYMBOL_STRING, YYTRANSLATE('('), YYTRANSLATE('['),
	                                      YYTRANSLATE('-'), YYTRANSLATE('*')};
	bool has_expr = expected[YYSYMBOL_INT] && expected[YYSYMBOL_IDENT];
	if (has_expr)
		for (size_t i = 0; i < sizeof expr_start / sizeof expr_start[0]; i++)
			expected[expr_start[i]] = false;
	const char *names[8];
	char bufs[8][32];
	int nn = 0;
	bool too_many = false;
	if (has_expr)
		names[nn++] = "expression";
	for (int s = 0; s < YYNTOKENS; s++) {
		if (!expected[s] || s == YYSYMBOL_YYerror || s == YYSYMBOL_YYUNDEF)
			continue;
		if (nn == 5) {
			too_many = true;
			break;
		}
		names[nn] = sym_name((yysymbol_kind_t)s, bufs[nn], sizeof bufs[nn]);
		nn++;
	}
	if (expected[YYSYMBOL_MODEL] && expected[YYSYMBOL_PLAN]) {
		parse_error(pc, loc, "unexpected %s, expected 'import', 'model', 'fn', 'strategy' or 'plan'", found);
	} else if (too_many || nn == 0) {
		parse_error(pc, loc, "unexpected %s", found);
	} else {
		char msg[256];
		int m = snprintf(msg, sizeof msg, "unexpected %s, expected ", found);
		for (int i = 0; i < nn && m > 0 && (size_t)m < sizeof msg; i++)
			m += snprintf(msg + m, sizeof msg - (size_t)m, "%s%s", i == 0 ? "" : i == nn - 1 ? " or " : ", ",
			              names[i]);
		parse_error(pc, loc, "%s", msg);
	}
	return 0;
}

/* Called when an `error` alternative is reduced, with the lookahead token (YYEMPTY when the
 * token that failed was already dropped). Skips the rest of the failed line, unless the
 * lookahead starts a line of its own (it may be a good statement) or closes the block. */
static void recover(ParseCtx *pc, int lookahead)
{
	int skip_tok;
	if (lookahead == YYEMPTY) {
		if (pc->skip)
			return;
		skip_tok = pc->last_tok;
	} else if (lookahead == '}' || lookahead == END || pc->tok_bol) {
		return;
	} else {
		skip_tok = lookahead;
	}
	pc->skip = true;
	pc->skip_depth = 0;
	if (skip_tok == '{') {
		/* the block it opens goes too; it was counted as open when it was read */
		pc->skip_depth = 1;
		if (pc->open_overflow)
			pc->open_overflow--;
		else if (pc->nopen)
			pc->nopen--;
	}
	/* the parser is back in a statement list: brackets of the failed statement are gone */
	if (!pc->open_overflow)
		while (pc->nopen && pc->open[pc->nopen - 1].ch != '{')
			pc->nopen--;
}
