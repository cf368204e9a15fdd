/* ast.c: AST constructors and parse_module, which runs the reentrant flex scanner
 * (grammar/lexer.l) and the pure bison parser (grammar/parser.y) over one file held in memory.
 * Every node, string and comment lives in the caller's arena; the scanner's own buffers are
 * freed before returning, whatever the input. */
#include "front/front.h"

#include <limits.h>

#include "parser.h"
#include "lexer.h"

Expr *expr_new(Arena *a, ExprKind k, Loc loc)
{
	Expr *e = arena_alloc(a, sizeof *e);
	e->kind = k;
	e->loc = loc;
	return e;
}

Arg *arg_new(Arena *a, const char *key, Loc key_loc, Expr *value, Loc loc)
{
	Arg *g = arena_alloc(a, sizeof *g);
	g->key = key;
	g->key_loc = key_loc;
	g->value = value;
	g->loc = loc;
	return g;
}

const char *expr_kind_name(ExprKind k)
{
	switch (k) {
	case E_INT: return "integer";
	case E_FLOAT: return "number";
	case E_SIZE: return "size";
	case E_STRING: return "string";
	case E_NAME: return "name";
	case E_STAR: return "'*'";
	case E_BINARY: return "binary expression";
	case E_NEG: return "negation";
	case E_CALL: return "call";
	case E_MEMBER: return "member";
	case E_INDEX: return "index";
	case E_TUPLE: return "tuple";
	case E_LIST: return "list";
	}
	return "expression";
}

Module *parse_module(Arena *a, const char *path, const char *text, int len)
{
	if (!text || len < 0)
		len = 0;
	if (len > INT_MAX / 2) { /* offsets are ints */
		diag_error(NULL, (Loc){0, 0}, "%s: file too large", path ? path : "<input>");
		return NULL;
	}
	Module *m = arena_alloc(a, sizeof *m);
	/* our own NUL-terminated copy: the caller's buffer may be neither terminated nor kept */
	char *copy = arena_strndup(a, text ? text : "", (size_t)len);
	m->src.path = arena_strdup(a, path ? path : "<input>");
	m->src.text = copy;
	m->src.len = len;

	ParseCtx pc = {0};
	pc.arena = a;
	pc.mod = m;
	pc.src = &m->src;
	pc.item_tail = &m->items;
	pc.comment_tail = &m->comments;
	pc.nl_seen = true;

	yyscan_t scanner;
	if (yylex_init_extra(&pc, &scanner))
		ICE("cannot start the scanner");
	YY_BUFFER_STATE buf = yy_scan_bytes(copy, len, scanner);
	int rc = yyparse(scanner, &pc);
	yy_delete_buffer(buf, scanner);
	yylex_destroy(scanner);
	if (rc != 0 || pc.errors > 0)
		return NULL;
	return m;
}
