/* planc.h: the compiler's one internal header, sectioned by the file that implements each part
 * (QBE's all.h style). The AST is built by grammar/parser.y, checked by sema.c, elaborated into
 * the model graph IR by graph.c, and transformed by the passes listed in passes.c. Nothing here
 * is part of the runtime's public API (that is runtime/planrt.h). */
#ifndef PLANC_H
#define PLANC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PLANC_VERSION "0.1.0"

typedef struct Arena Arena;
typedef struct Source Source;
typedef struct Expr Expr;
typedef struct Arg Arg;
typedef struct Stmt Stmt;
typedef struct PlanStmt PlanStmt;
typedef struct Param Param;
typedef struct Item Item;
typedef struct Comment Comment;
typedef struct Module Module;

/* ---------------------------------------------------------------- arena.c */
/* One arena per compilation: everything the compiler allocates lives until arena_free. */
Arena *arena_new(void);
void *arena_alloc(Arena *a, size_t n); /* zeroed, 16-byte aligned; aborts on OOM */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);

/* ---------------------------------------------------------------- diag.c */
/* Locations are byte offsets into a Source; line and column are computed only when reporting. */
typedef struct Loc {
	int off; /* byte offset of the first character */
	int len; /* length in bytes (>= 0) */
} Loc;

struct Source {
	const char *path; /* as given on the command line, used in messages */
	const char *text; /* NUL-terminated */
	int len;
};

Loc loc_span(Loc a, Loc b); /* from the start of a to the end of b */
void diag_error(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note_plain(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* "note: ..." with no location */
int diag_error_count(void);
void diag_reset(void);
void diag_set_stream(FILE *f); /* default stderr */
void diag_line_col(const Source *src, int off, int *line, int *col); /* 1-based */
/* Internal errors: a bug in planc, never the user's fault. Prints and aborts. */
_Noreturn void internal_error(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define ICE(...) internal_error(__FILE__, __LINE__, __VA_ARGS__)
#define internal_assert(c) ((c) ? (void)0 : ICE("assertion failed: %s", #c))
/* did-you-mean: the closest of candidates[0..n) to name by edit distance, or NULL */
const char *closest_name(const char *name, const char *const *candidates, int n);

/* ---------------------------------------------------------------- ast.c */
typedef enum {
	E_INT,      /* ival */
	E_FLOAT,    /* fval */
	E_SIZE,     /* fval bytes (25MiB -> 26214400), text keeps the spelling */
	E_STRING,   /* text */
	E_NAME,     /* text ("_" is a name; so is "1f1b") */
	E_STAR,     /* '*' as a path segment or whole pattern */
	E_BINARY,   /* op: '+' '-' '*' '/' '%' '@' ':' and 'A' for '->', 'R' for '..'; lhs rhs */
	E_NEG,      /* -lhs */
	E_CALL,     /* lhs(args) */
	E_MEMBER,   /* lhs.text, or lhs.* (rhs = E_STAR) or lhs.3 (rhs = E_INT); .T is member "T" */
	E_INDEX,    /* lhs[rhs] */
	E_TUPLE,    /* (items) */
	E_LIST,     /* [items] */
} ExprKind;

struct Expr {
	ExprKind kind;
	Loc loc;        /* whole expression */
	int op;         /* E_BINARY */
	long long ival; /* E_INT */
	double fval;    /* E_FLOAT, E_SIZE */
	const char *text; /* E_NAME, E_STRING, E_MEMBER field, E_SIZE/E_FLOAT spelling */
	Expr *lhs, *rhs;
	Arg *args;      /* E_CALL */
	Expr *items;    /* E_TUPLE, E_LIST: linked through next */
	Expr *next;     /* next in a list (dims, items) */
};

struct Arg {
	const char *key; /* NULL for positional; "over" for `over AXIS` */
	Loc key_loc;
	Expr *value;
	Loc loc;
	Arg *next;
};

typedef enum { S_INPUT, S_PARAM, S_ASSIGN, S_REPEAT, S_RETURN } StmtKind;

struct Stmt {
	StmtKind kind;
	Loc loc;
	const char *name; /* S_INPUT, S_PARAM, S_ASSIGN */
	Loc name_loc;
	const char *dtype; /* S_INPUT, S_PARAM */
	Loc dtype_loc;
	Expr *dims;  /* S_INPUT, S_PARAM: linked through next */
	Expr *init;  /* S_PARAM: after '~' (may be NULL) */
	Expr *value; /* S_ASSIGN, S_RETURN; S_REPEAT: count */
	Stmt *body;  /* S_REPEAT */
	Stmt *next;
};

struct PlanStmt {
	const char *word; /* mesh, batch, shard, use, pipeline, stage, zero, ... */
	Loc word_loc;
	Loc loc;
	Arg *args;
	PlanStmt *body; /* `stage N { ... }` */
	PlanStmt *next;
};

struct Param {
	const char *name;
	Loc loc;
	Expr *def; /* default value or NULL */
	Param *next;
};

typedef enum { I_IMPORT, I_MODEL, I_FN, I_STRATEGY, I_PLAN } ItemKind;

typedef struct Decorator {
	const char *name;
	Loc loc;
	struct Decorator *next;
} Decorator;

struct Item {
	ItemKind kind;
	Loc loc;
	const char *name; /* model/fn/strategy/plan name; I_IMPORT: dotted path "std.nn" */
	Loc name_loc;
	const char *alias; /* I_IMPORT: `as` name, or the last path segment */
	Decorator *decorators; /* I_FN */
	Param *params;     /* model hyperparameters, fn / strategy parameters */
	Stmt *body;        /* I_MODEL, I_FN */
	PlanStmt *rules;   /* I_PLAN, I_STRATEGY */
	const char *for_model; /* I_PLAN */
	Loc for_loc;
	Arg *model_args;   /* I_PLAN: `for gpt(L = 96)` overrides */
	Module *module;    /* the file this item came from */
	Item *next;
};

struct Comment {
	Loc loc; /* from '#' to the end of the line, newline excluded */
	Comment *next;
};

/* One parsed file. */
struct Module {
	Source src;
	const char *import_name; /* "std.nn" for stdlib files, NULL for the main file */
	Item *items;
	Comment *comments; /* in source order, for planc fmt */
	Module *next;      /* all modules of a compilation */
};

Expr *expr_new(Arena *a, ExprKind k, Loc loc);
Arg *arg_new(Arena *a, const char *key, Loc key_loc, Expr *value, Loc loc);
/* Parse src into a Module; syntax errors go through diag_error. Returns NULL if any error. */
Module *parse_module(Arena *a, const char *path, const char *text, int len);
const char *expr_kind_name(ExprKind k);

/* ---------------------------------------------------------------- fmt.c */
/* Canonical layout of a module, comments kept. Idempotent: fmt(fmt(x)) == fmt(x). */
void fmt_module(FILE *out, const Module *m);

/* ---------------------------------------------------------------- load.c */
/* Reads a file (refusing directories, unreadable, non-text or over-large input), parses it and
 * every module it imports (std.X resolves to STDLIB_DIR/X.plan or $PLANC_STDLIB/X.plan). */
typedef struct Program {
	Arena *arena;
	Module *main;
	Module *modules; /* main first, then imports */
} Program;
bool load_file(const char *path, char **text, int *len); /* reports its own errors */
Program *load_program(Arena *a, const char *path);
const char *stdlib_dir(void);

/* ---------------------------------------------------------------- sema.c */
/* Name resolution and plan validation on the AST: every check that needs no tensor shapes.
 * sema_plan turns one `plan` item (with the strategies it uses expanded) into a PlanSpec, the
 * resolved settings the middle end reads. Checks that need shapes (a split parameter dimension
 * not divisible by its axis, heads by tensor, shape mismatches) happen in graph.c / shard.c. */
#define MAX_AXES 8
#define MAX_DIMS 6
#define MAX_STAGES 256

typedef struct MeshAxis {
	const char *name;
	int size;
	Loc loc;
} MeshAxis;

typedef struct HyperValue { /* a model hyperparameter after plan overrides */
	const char *name;
	double value;
	bool is_int;
	Loc loc; /* where the value came from (model default or plan override) */
	const Source *src;
} HyperValue;

typedef struct ShardRule {
	/* Either a dim rule (`shard B -> data`: dim_name set, axis) or a parameter rule
	 * (`shard layers.*.mlp.w1 : [_, tensor]`: pattern set, ndims/axes). */
	const char *dim_name;
	int axis;                 /* dim rule: mesh axis index */
	const char *pattern;      /* parameter rule: dotted path, '*' matches one segment */
	int ndims;
	int axes[MAX_DIMS];       /* parameter rule: axis index per dim, -1 = not split */
	int stage;                /* -1: every stage; else only this pipeline stage */
	bool used;                /* set by the middle end when the rule matched something */
	Loc loc;
	const Source *src;
} ShardRule;

typedef enum { SCHED_NONE, SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } PipeSchedule;
typedef enum { BALANCE_UNIFORM, BALANCE_PARAMS, BALANCE_FLOPS } PipeBalance;
typedef enum { PLACE_NONE, PLACE_HOST, PLACE_DISK } OffloadPlace;
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } RecomputeMode;
typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_U8, DT_F64 } DType;
typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM, OPT_ADAMW } OptimizerKind;
typedef enum { SYNC_STRICT, SYNC_LOCAL_SGD, SYNC_ASYNC } SyncMode;
typedef enum { COMPRESS_NONE, COMPRESS_BF16, COMPRESS_FP16, COMPRESS_TOPK, COMPRESS_POWERSGD } CompressKind;

typedef struct PlanSpec {
	Program *prog;
	Item *plan, *model;
	const Source *src; /* the plan's file */

	MeshAxis axes[MAX_AXES];
	int naxes;
	int world; /* product of axis sizes */

	HyperValue *hypers; /* model hyperparameters, defaults overridden by `for model(...)` */
	int nhypers;

	const char *batch_dim; /* `batch B = 32` */
	long long batch;
	int micro_batches; /* default 1 */
	Loc batch_loc;

	ShardRule *rules; /* in order: plan rules and expanded strategy rules */
	int nrules;

	int pipe_axis; /* -1: no pipeline */
	PipeSchedule schedule;
	int stages;   /* pipeline stages (= pipe axis size) */
	int chunks;   /* virtual stages per rank for interleaved (default 1; 2 if interleaved) */
	PipeBalance balance;
	int nranges;  /* explicit `stages = [a..b, ...]`: layer ranges, inclusive */
	int range_lo[MAX_STAGES], range_hi[MAX_STAGES];
	Loc pipeline_loc;

	int zero_stage; /* 0..3 */
	int zero_axis;  /* axis index, -1 if zero 0 */
	Loc zero_loc;

	OffloadPlace offload_optimizer, offload_params, offload_activations;
	Loc offload_loc;

	RecomputeMode recompute;

	DType param_dtype;  /* compute/storage precision: f32, bf16 or f16 */
	DType master_dtype; /* f32 master weights when param_dtype is lower, else = param_dtype */
	double loss_scale;  /* 0: none, -1: dynamic, > 0 static */

	OptimizerKind optimizer;
	double lr, beta1, beta2, eps, weight_decay, momentum, clip;
	int warmup, total_steps; /* schedule = cosine(warmup, total, min_lr); total 0 = constant lr */
	double min_lr;

	SyncMode sync;
	double bucket_bytes; /* default 25MiB */
	bool overlap;
	int every;     /* local_sgd */
	int staleness; /* async */
	CompressKind compress;
	double topk_ratio;
	int powersgd_rank;
	bool error_feedback;
	Loc sync_loc;

	bool has_experts;
	int expert_count; /* 0 = take the model's */
	int top_k;
	double capacity_factor, aux_loss;
	Loc experts_loc;
} PlanSpec;

Item *find_item(Program *p, ItemKind kind, const char *name, const Module *from);
bool sema_check(Program *p); /* names and plan statements of every plan; false if any error */
PlanSpec *sema_plan(Program *p, Item *plan); /* NULL after reporting errors */
Item *default_plan(Program *p, const char *name); /* `--plan NAME`, or the file's first plan */
int axis_index(const PlanSpec *ps, const char *name); /* -1 if not a mesh axis */
const char *dtype_name(DType t);
int dtype_bytes(DType t);

#endif
