/* front.h: the front end: the AST the bison parser builds (ast.c, grammar/), the canonical
 * formatter (fmt.c), reading a file and its imports (load.c), and sema.c's checks that turn one
 * `plan` item into the PlanSpec every later pass reads. */
#ifndef PLANC_FRONT_H
#define PLANC_FRONT_H

#include "base/base.h"

typedef struct Expr Expr;
typedef struct Arg Arg;
typedef struct Stmt Stmt;
typedef struct PlanStmt PlanStmt;
typedef struct Param Param;
typedef struct Item Item;
typedef struct Comment Comment;
typedef struct Module Module;

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
	E_INDEX,    /* lhs[rhs, ...]: the indices linked through rhs->next */
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
	bool buffer; /* S_PARAM written `buffer`: a tensor that does not train (computed at init or loaded) */
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

/* The items of a module with one name, in source order (a name defined twice is an error, but
 * lookups still find the first of the kind asked for). */
typedef struct ItemChain {
	Item *item;
	struct ItemChain *next;
} ItemChain;

/* One parsed file. */
struct Module {
	Source src;
	const char *import_name; /* "std.nn" for stdlib files, NULL for the main file */
	Item *items;
	Comment *comments; /* in source order, for planc fmt */
	Module *next;      /* all modules of a compilation */
	/* module_index (load.c): name -> ItemChain of the items other than imports, and import alias
	 * -> its first import; NULL when not indexed (lookups then scan the items) */
	SymTab *items_by_name, *imports_by_alias;
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
	/* --model-arg NAME=VALUE: hyperparameter overrides from the command line, applied to every
	 * plan after its own `for model(...)` ones (load_model_args; NULL when none) */
	Arg *model_args;
	const Source *model_args_src;
} Program;
bool load_file(const char *path, char **text, int *len); /* reports its own errors */
Program *load_program(Arena *a, const char *path);
void module_index(Arena *a, Module *m); /* fills items_by_name and imports_by_alias */
/* the command line's `--model-arg NAME=VALUE` (VALUE a number) as p->model_args, in one Source
 * named "<command line>"; false after reporting a malformed one */
bool load_model_args(Program *p, char *const *args, int n);
/* sema_plan and every pass after it allocate from p->arena. A driver compiling many plans gives
 * each an arena of its own, freed when the plan is done, so that a file of 20,000 plans needs the
 * memory of one: saved = plan_arena_begin(p); ...; plan_arena_end(p, saved). */
Arena *plan_arena_begin(Program *p);
void plan_arena_end(Program *p, Arena *program_arena);
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
	long long ival; /* is_int: the exact value (value is its nearest double) */
} HyperValue;

typedef struct ShardRule {
	/* Either a dim rule (`shard B -> data`: dim_name set, axis) or a parameter rule
	 * (`shard layers.*.mlp.w1 : [_, tensor]`: pattern set, ndims/axes). */
	const char *dim_name;
	int axis;                 /* dim rule: mesh axis index */
	const char *pattern;      /* parameter rule: dotted path, '*' matches one segment */
	int ndims;
	int axes[MAX_DIMS];       /* parameter rule: axis index per dim, -1 = not split */
	/* an expert rule (`shard experts -> axis`, `shard expert_hidden(PATTERN) -> axis`: MOE_RULE_*,
	 * axis), found from the graph (shard.c); moe_pattern NULL: every expert parameter */
	int moe;
	const char *moe_pattern;
	int stage;                /* -1: every stage; else only this pipeline stage */
	bool used;                /* set by the middle end when the rule matched something */
	Loc loc;
	const Source *src;
	const char *strategy;     /* the strategy it came from, or NULL */
} ShardRule;

enum { MOE_RULE_NONE, MOE_RULE_EXPERTS, MOE_RULE_HIDDEN };
/* `freeze PATTERN`: parameters that do not train (graph.c marks them; used: one matched) */
typedef struct FreezeRule {
	const char *pattern;
	bool used;
	Loc loc;
	const Source *src;
} FreezeRule;
#define MAX_FREEZE 64

typedef enum { SCHED_NONE, SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } PipeSchedule;
typedef enum { BALANCE_UNIFORM, BALANCE_PARAMS, BALANCE_FLOPS } PipeBalance;
typedef enum { PLACE_NONE, PLACE_HOST, PLACE_DISK } OffloadPlace;
enum { VIEW_SLOT = -2 }; /* Buffer.view_axis */
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
	FreezeRule freeze[MAX_FREEZE]; /* `freeze` patterns */
	int nfreeze;

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
	bool attention_unfused; /* `attention unfused`: attention chains stay as written (graph/attention.c) */
	/* `shard ring_attention -> AXIS` (nn.context_parallel): fused attention whose query rows are split
	 * over AXIS keeps K/V split too and passes them around a ring (lower/ring.c); -1: none */
	int ring_axis;
	bool ring_contiguous; /* `shard ring_attention(contiguous) -> AXIS`: one contiguous block per rank
			       * even under a causal mask (default: causal load balancing, two mirrored chunks) */
	Loc ring_loc;
	const Source *ring_src;

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
	/* local_sgd's outer optimizer (DiLoCo): none (the replicas' average is the new model), sgd or
	 * nesterov (SGD with Nesterov momentum on the outer gradient, the start point minus the average) */
	enum { OUTER_NONE, OUTER_SGD, OUTER_NESTEROV } outer;
	double outer_lr, outer_momentum;
	Loc outer_loc;

	bool has_experts;
	int expert_count; /* 0 = take the model's */
	int top_k;
	double capacity_factor;
	Loc experts_loc, expert_count_loc; /* the statement; its count value (graph.c checks it) */
} PlanSpec;

Item *find_item(Program *p, ItemKind kind, const char *name, const Module *from);
/* sema_check: names of every module and the statements of every plan, with warnings; false if
 * any error. sema_plan: one plan's PlanSpec, NULL after reporting errors; it reports errors but
 * not warnings (run sema_check first: it reports each plan's warnings once). */
bool sema_check(Program *p);
/* The same for one plan (NULL: every plan): its model, every fn and strategy, and the plan. */
bool sema_check_plan(Program *p, const Item *only);
PlanSpec *sema_plan(Program *p, Item *plan);
Item *default_plan(Program *p, const char *name); /* `--plan NAME`, or the file's first plan */
int axis_index(const PlanSpec *ps, const char *name); /* -1 if not a mesh axis */
/* Exact 64-bit integer arithmetic for + - * / % (b != 0 for / and %): false on overflow;
 * *inexact when a / b leaves a remainder (*r is then the truncated quotient). */
bool int_arith(int op, long long a, long long b, long long *r, bool *inexact);
const char *dtype_name(DType t);
int dtype_bytes(DType t);

#endif
