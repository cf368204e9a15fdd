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

/* ---------------------------------------------------------------- symtab.c */
/* String-keyed hash tables (open addressing) in an arena, for every name lookup: expected O(1).
 * symtab_put adds or replaces; keys are not copied. */
typedef struct SymTab SymTab;
SymTab *symtab_new(Arena *a);
void *symtab_get(const SymTab *t, const char *key); /* NULL if absent (or t is NULL) */
void symtab_put(SymTab *t, const char *key, void *value);

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
	const int *line_starts; /* byte offset of each line (diag_index_lines), or NULL: scanned */
	int nlines;
};

Loc loc_span(Loc a, Loc b); /* from the start of a to the end of b */
void diag_error(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note(const Source *src, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_note_plain(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* "note: ..." with no location */
int diag_error_count(void);
/* After 20 errors one note says so and later diagnostics are dropped: the lexer, sema and the
 * driver stop when diag_stopped() (compilers' -fmax-errors). diag_reset starts counting again. */
bool diag_stopped(void);
void diag_reset(void);
void diag_index_lines(Arena *a, Source *src); /* a line table for src, so line:col is a lookup */
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
} Program;
bool load_file(const char *path, char **text, int *len); /* reports its own errors */
Program *load_program(Arena *a, const char *path);
void module_index(Arena *a, Module *m); /* fills items_by_name and imports_by_alias */
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


/* ---------------------------------------------------------------- graph.c */
/* The model graph IR: SSA values over concrete shapes, produced by elaborating the model (fns
 * inlined, repeats unrolled with layer tags) and then extended by every pass: autodiff appends
 * backward and optimizer ops, shard.c inserts collectives, recompute.c clones forward ops into
 * the backward, pipeline.c assigns stages. Ops are kept in program order in one array. The op
 * table is an X-macro: name, printed name, kind of op. */
#define OP_TABLE(X) \
	X(INPUT, "input", OPK_SOURCE) \
	X(FILL, "fill", OPK_SOURCE) \
	X(PARAM, "param", OPK_SOURCE) \
	X(MATMUL, "matmul", OPK_MATMUL) \
	X(MATMUL_WGRAD, "matmul_wgrad", OPK_MATMUL) \
	X(TRANSPOSE, "transpose", OPK_VIEW) \
	X(SPLIT_HEADS, "split_heads", OPK_VIEW) \
	X(MERGE_HEADS, "merge_heads", OPK_VIEW) \
	X(ADD, "add", OPK_BINARY) \
	X(SUB, "sub", OPK_BINARY) \
	X(MUL, "mul", OPK_BINARY) \
	X(DIV, "div", OPK_BINARY) \
	X(SCALE, "scale", OPK_LINEAR) \
	X(NEG, "neg", OPK_LINEAR) \
	X(SUM_TO, "sum_to", OPK_LINEAR) \
	X(GELU, "gelu", OPK_UNARY) \
	X(RELU, "relu", OPK_UNARY) \
	X(SILU, "silu", OPK_UNARY) \
	X(DROPOUT, "dropout", OPK_UNARY) \
	X(CAUSAL_MASK, "causal_mask", OPK_UNARY) \
	X(SOFTMAX, "softmax", OPK_ROWWISE) \
	X(LAYER_NORM, "layer_norm", OPK_ROWWISE) \
	X(RMS_NORM, "rms_norm", OPK_ROWWISE) \
	X(EMBED, "embed", OPK_EMBED) \
	X(CROSS_ENTROPY, "cross_entropy", OPK_LOSS) \
	X(MOE_ROUTER, "moe_router", OPK_MOE) \
	X(MOE_DISPATCH, "moe_dispatch", OPK_MOE) \
	X(MOE_COMBINE, "moe_combine", OPK_MOE) \
	X(MOE_AUX_LOSS, "moe_aux_loss", OPK_MOE) \
	X(MOE_Z_LOSS, "moe_z_loss", OPK_MOE) \
	X(GELU_GRAD, "gelu_grad", OPK_UNARY_GRAD) \
	X(RELU_GRAD, "relu_grad", OPK_UNARY_GRAD) \
	X(SILU_GRAD, "silu_grad", OPK_UNARY_GRAD) \
	X(DROPOUT_GRAD, "dropout_grad", OPK_UNARY_GRAD) \
	X(SOFTMAX_GRAD, "softmax_grad", OPK_ROWWISE) \
	X(LAYER_NORM_GRAD, "layer_norm_grad", OPK_ROWWISE) \
	X(RMS_NORM_GRAD, "rms_norm_grad", OPK_ROWWISE) \
	X(EMBED_GRAD, "embed_grad", OPK_EMBED) \
	X(CROSS_ENTROPY_GRAD, "cross_entropy_grad", OPK_LOSS) \
	X(MOE_ROUTER_GRAD, "moe_router_grad", OPK_MOE) \
	X(MOE_DISPATCH_GRAD, "moe_dispatch_grad", OPK_MOE) \
	X(MOE_COMBINE_GRAD, "moe_combine_grad", OPK_MOE) \
	X(MOE_AUX_LOSS_GRAD, "moe_aux_loss_grad", OPK_MOE) \
	X(MOE_Z_LOSS_GRAD, "moe_z_loss_grad", OPK_MOE) \
	X(OPTIMIZER_STEP, "optimizer_step", OPK_OPTIMIZER) \
	X(ALL_REDUCE, "all_reduce", OPK_COLLECTIVE) \
	X(REDUCE_SCATTER, "reduce_scatter", OPK_COLLECTIVE) \
	X(ALL_GATHER, "all_gather", OPK_COLLECTIVE) \
	X(ALL_TO_ALL, "all_to_all", OPK_COLLECTIVE) \
	X(SLICE, "slice", OPK_VIEW) \
	X(SEND, "send", OPK_P2P) \
	X(RECV, "recv", OPK_P2P) \
	X(UNARY_FN, "unary", OPK_UNARY)                 /* n: PLANRT_SIN .. PLANRT_SIGMOID */ \
	X(UNARY_FN_GRAD, "unary_grad", OPK_UNARY_GRAD) \
	X(SUM_DIM, "sum_dim", OPK_REDUCE)               /* dim (-1: every dim), f: scale (mean 1 / n) */ \
	X(SUM_DIM_GRAD, "sum_dim_grad", OPK_REDUCE) \
	X(MAX_DIM, "max_dim", OPK_REDUCE)               /* outputs: max, argmax */ \
	X(MAX_DIM_GRAD, "max_dim_grad", OPK_REDUCE) \
	X(MSE_LOSS, "mse_loss", OPK_REDUCE)             /* n: 1 for l1_loss; f: 1 / the elements */ \
	X(MSE_LOSS_GRAD, "mse_loss_grad", OPK_REDUCE) \
	X(NARROW, "narrow", OPK_SHAPE)                  /* dim, start, length; dim2 = 1: the dim dropped */ \
	X(NARROW_GRAD, "narrow_grad", OPK_SHAPE) \
	X(CONCAT, "concat", OPK_SHAPE)                  /* dim */ \
	X(RESHAPE, "reshape", OPK_SHAPE) \
	X(SWAP_DIMS, "swap_dims", OPK_SHAPE)            /* dim, dim2 */ \
	X(REPEAT_KV, "repeat_kv", OPK_SHAPE)            /* dim: the heads dim, n: n_rep */ \
	X(REPEAT_KV_GRAD, "repeat_kv_grad", OPK_SHAPE) \
	X(ROPE, "rope", OPK_SHAPE)                      /* f: theta, n: rot_dim, dim: seq dim, dim2: heads first */ \
	X(ROPE_GRAD, "rope_grad", OPK_SHAPE)

typedef enum {
#define X(name, text, kind) OP_##name,
	OP_TABLE(X)
#undef X
	OP_COUNT
} OpKind;

typedef enum { OPK_SOURCE, OPK_MATMUL, OPK_VIEW, OPK_BINARY, OPK_LINEAR, OPK_UNARY, OPK_ROWWISE, OPK_EMBED,
	OPK_LOSS, OPK_MOE, OPK_UNARY_GRAD, OPK_OPTIMIZER, OPK_COLLECTIVE, OPK_P2P,
	OPK_REDUCE, /* reductions over a dim and the regression losses (shard.c's rule_reduce) */
	OPK_SHAPE   /* slices, concat, reshape, transposes, repeat_kv, RoPE (shard.c's rule_shape) */
} OpClass;

extern const char *const op_names[OP_COUNT];
extern const OpClass op_classes[OP_COUNT];

/* A value's layout on one mesh axis: replicated, partial sum, or split along a dimension. */
#define LAYOUT_R (-1)
#define LAYOUT_P (-2)
#define LAYOUT_FLAT (-3) /* ZeRO: flattened, padded and split evenly over the axis */
typedef struct Layout {
	signed char on[MAX_AXES]; /* LAYOUT_R, LAYOUT_P or the split dim */
} Layout;

typedef enum { ROLE_ACT, ROLE_PARAM, ROLE_INPUT, ROLE_GRAD, ROLE_MASK, ROLE_STAT, ROLE_INDEX, ROLE_LOSS } ValueRole;

typedef struct Value {
	int id;
	DType dtype;
	int rank;
	long long dim[MAX_DIMS];
	const char *dim_name[MAX_DIMS]; /* the model's name for a dim (B, S, D, H, V, E) or NULL */
	int def;           /* index of the producing op */
	ValueRole role;
	const char *name;  /* parameter path, input name or variable name; may be NULL */
	int layer;         /* repeat iteration that produced it, -1 outside any repeat */
	int grad_of;       /* ROLE_GRAD of a parameter: that parameter's value id, else -1 */
	int grad;          /* ROLE_PARAM: the value id of its (synced) gradient, -1 before autodiff */
	int alias_of;      /* views: the value whose storage this is, else -1 */
	int tied_to;       /* a parameter copy on another pipeline stage: the original, else -1 */
	Layout lay;        /* filled by shard.c */
	int init_kind;     /* ROLE_PARAM: 0 normal, 1 uniform, 2 zeros, 3 ones; buffers also 4 arange, 5 rope_cos,
			    * 6 rope_sin (computed at init, never read from --init nor saved), 7 load (--init) */
	double init_a, init_b;
	bool frozen;       /* ROLE_PARAM that does not train (a buffer, or `freeze` in the plan): no gradient */
	bool buffer;       /* declared `buffer` */
} Value;

typedef struct Op {
	OpKind kind;
	int nin, nout;
	int in[6];
	int out[3];
	double f;          /* scalar attribute: scale, dropout p, eps, capacity factor */
	long long n;       /* integer attribute: heads, top_k, split dim, group stage */
	const char *s;     /* string attribute: gelu approximation */
	/* MoE ops (the router and every op reading its route): tokens per routing group (one sample),
	 * pairs an expert takes per group (0: dropless), gates normalised over the top k */
	long long moe_group, moe_capacity;
	bool moe_normalize;
	int dim, dim2;     /* OPK_REDUCE / OPK_SHAPE: the dims they act on (see OP_TABLE) */
	long long start, length; /* narrow: the rows [start, start + length) of dim */
	int axis;          /* collectives: mesh axis index; p2p: peer stage offset */
	int coll_dim;      /* collectives: the gathered / scattered dim (or -1) */
	int coll_dim2;     /* all_to_all: the dim split afterwards */
	int layer;         /* -1 outside repeat */
	bool backward;     /* part of the backward pass */
	bool recompute;    /* a forward op cloned into the backward by recompute.c */
	bool in_recompute_fn; /* forward op from inside an @recompute fn */
	bool per_step;     /* runs once per step (optimizer, gradient sync), not per micro-batch */
	bool internal;     /* communication done inside the preceding op's kernel (vocab-parallel
			    * cross-entropy's reductions): counted and checked, not lowered on its own */
	double every;      /* collectives: runs once per this many steps (local SGD), 0 = every step */
	int peer;          /* p2p and async: the peer's coordinate on `axis`; -1 none */
	int stage_group[2]; /* pipe-axis collectives between two stages (tied weights), else -1 */
	int role;          /* ROLE_ANY, or an async role that alone runs the op */
	int *members;      /* gradient buckets (sync.c): the gradient values packed into the buffer */
	int nmembers;
	int stage;         /* pipeline stage (0 without pipeline) */
	int fwd_op;        /* backward ops: the forward op they differentiate, else -1 */
	const char *scope; /* dotted fn path the op came from */
	Loc loc;
	const Source *src;
	int orig;          /* index at elaboration (stable across plans of a model): RNG keys */
	const Source *call_src; /* ops from a fn: the outermost call in the model, for notes */
	Loc call_loc;
	const char *call_fn;
} Op;

/* A pipeline schedule: for each stage the ordered actions of one step (Megatron's tables). */
typedef enum { ACT_FORWARD, ACT_BACKWARD } ActionKind;
typedef struct Action {
	ActionKind kind;
	int micro;  /* micro-batch */
	int chunk;  /* virtual stage on this rank (interleaved), else 0 */
} Action;
typedef struct Schedule {
	int stages, chunks, micro;
	Action **table; /* table[stage][0 .. 2 * micro * chunks) */
	int *inflight;  /* per stage: most micro-batch chunks forwarded but not yet backwarded */
} Schedule;

enum { RANKROLE_ANY = 0, RANKROLE_WORKER = 1, RANKROLE_MASTER = 2 };

typedef struct Graph {
	Arena *arena;
	PlanSpec *ps;
	Value *vals;
	int nvals, capvals;
	Op *ops;
	int nops, capops;
	int loss;        /* value id of the scalar loss */
	int nlayers;     /* iterations of the model's top-level repeat */
	int nfwd;        /* ops [0, nfwd) are the forward pass (set by autodiff) */
	bool has_moe;
	int nstages;     /* pipeline stages (1 without pipeline) */
	int *layer_stage; /* layer -> stage */
	int *layer_chunk; /* layer -> virtual chunk on its stage */
	Schedule *sched;
} Graph;

Graph *graph_build(PlanSpec *ps); /* elaborate the model; NULL after reporting errors */
int graph_add_value(Graph *g, DType t, int rank, const long long *dim, const char *const *names);
int graph_add_op(Graph *g, OpKind k, int nin, const int *in, int nout, const int *out);
void op_clear(Op *op); /* zero an op outside the graph, with every "none" index set to -1 */
/* An op a pass inserts for another (a collective before its consumer) takes over where and when
 * that one runs: layer, stage, phase, the op it differentiates, and its source location. */
void op_inherit(Op *op, const Op *from);
/* A pass that rewrites the op list builds a new one and installs it with graph_set_ops, which
 * renumbers every value's producing op. */
typedef struct OpList {
	Op *ops;
	int n, cap;
} OpList;
Op *oplist_add(Graph *g, OpList *l, const Op *op); /* appends a copy of op (cleared if NULL) */
void graph_set_ops(Graph *g, OpList *l);
long long value_elems(const Graph *g, int v);
long long value_local_elems(const Graph *g, int v); /* under its Layout */
int value_root(const Graph *g, int v);              /* follows alias_of through views */
/* whether a matmul's batch dims broadcast (torch.matmul): operands of different ranks other than a
 * rank-2 weight, or batch dims that differ among the operands and the output */
bool matmul_broadcasts(const Graph *g, const Op *op);
/* A parameter path against a shard or freeze pattern: '*' matches one or more whole segments. */
bool param_pattern_match(const char *pat, const char *name);
/* A pattern that matched no parameter: the error at it, with the parameter it most likely meant
 * (what: "shard rule", "freeze pattern"). */
void unmatched_pattern(const Graph *g, const char *what, const char *pattern, const Source *src, Loc loc,
		       const char *strategy);
void graph_dump(FILE *out, const Graph *g);
const char *layout_string(const Graph *g, int v, char *buf, size_t n);

/* ---------------------------------------------------------------- passes */
/* Each pass is one file; passes.c runs them in order and prints the IR after any of them when
 * asked (`planc --dump-after=PASS`). */
bool autodiff(Graph *g);     /* autodiff.c: backward graph and optimizer update */
bool shard(Graph *g);        /* shard.c: layouts per mesh axis, collectives inserted */
bool recompute(Graph *g);    /* recompute.c: selective / full activation recomputation */
bool pipeline(Graph *g);     /* pipeline.c: stage partition, p2p, schedule tables */
/* pipeline.c: contiguous partition of costs[0..n) into k non-empty parts (n >= k) minimising the
 * largest part's cost, where part 0 also carries `first` and part k - 1 also carries `last`
 * (embedding and head); part_of[i] = the part of item i. */
void pipeline_partition(const double *costs, int n, int k, double first, double last, int *part_of);
/* pipeline.c: simulated step time / ideal time - 1 for per-(stage, chunk) forward and backward
 * costs (fcost[stage * chunks + chunk]); (p - 1) / m for equal stages (Narayanan et al.). */
double pipeline_bubble(const Graph *g, const double *fcost, const double *bcost);
/* The same simulation with xfer seconds added on every dependency between two stages; returns the
 * bubble, and the makespan and the busiest stage's own time when asked. */
double pipeline_simulate(const Graph *g, const double *fcost, const double *bcost, double xfer, double *makespan,
			 double *busiest);
/* The same simulation's timeline: start and end[s * 2n + k] are when stage s starts and finishes
 * action k of its schedule table (n = micro-batches x chunks). */
void pipeline_timeline(const Graph *g, const double *fcost, const double *bcost, double xfer, double *start, double *end);
bool zero(Graph *g);         /* zero.c: ZeRO state sharding and offload placement */
bool sync_grads(Graph *g);   /* sync.c: gradient buckets, compression, local SGD, async */
/* sync.c: the axis the batch is split over, where local SGD averages and async masters serve
 * (-1: none) */
int sync_axis(const PlanSpec *ps);
/* sync.c: what compression sends for a gradient block of rows x cols elements (cols: the last dim,
 * 1 for a vector): top-k's entries kept, and whether PowerSGD factors it (then P is rows x r and
 * Q is cols x r) */
long long topk_entries(const PlanSpec *ps, long long elems);
bool powersgd_factors(const PlanSpec *ps, long long rows, long long cols);
typedef struct Lowered Lowered;
/* schedule.c: the collective-sequence check, on the kernels of every stage program */
bool check_collectives(const Lowered *low);
Graph *run_passes(PlanSpec *ps, const char *dump_after, FILE *dump_out);
/* explain.c: the cost report, text or JSON, read off the lowered program: its state and arena
 * give the memory lines when planc build can run it, its kernels the communication. */
void explain(FILE *out, Graph *g, bool json, const Lowered *low);
/* svg.c: `planc explain --svg FILE`: each rank role's pipeline schedule (forward, backward, sends,
 * idle time) and memory over one step, from the same estimate as explain's step time. False after
 * reporting an I/O error. */
bool explain_svg(const char *path, Graph *g, const Lowered *low);
bool explain_device(const char *name); /* the device the estimated step time assumes: h200, cpu */
const char *explain_device_name(void);  /* its description */
const char *explain_bytes(double b, char *buf, size_t n); /* "1.50 MiB", as the report prints sizes */
/* The estimate's costs in seconds for the programs of one rank role (RANKROLE_ANY, or an async
 * role): one micro-batch's forward and backward per stage and chunk (fc, bc: [stages * chunks]),
 * the longest transfer between stages, and each stage's update phase (update: [stages]). */
void explain_costs(const Graph *g, const Lowered *low, int role, double *fc, double *bc, double *xfer, double *update);
extern const char *const pass_names[];

/* ---------------------------------------------------------------- the loop-level IR */
/* The loop-level IR is the whole per-rank program. Lowering turns the scheduled, sharded graph
 * into one program per pipeline stage (and per async role): a list of kernels in phases, each a
 * call into planrt or a fused element-wise loop, with typed arguments. Everything a rank does is a
 * kernel: parameter initialisation, the forward and backward of a micro-batch, pipeline sends and
 * receives, loss and metric reductions, gradient buckets, clipping, the optimizer, master-weight
 * casts, ZeRO scatters and gathers, checkpoint writes. Emitters (emit_c.c; later CUDA and LLVM)
 * print it and add nothing; the collective check (schedule.c) and explain read the same kernels.
 *
 *   lower.c    graph ops -> kernels over buffers (one per value), phases and chunks
 *   state.c    persistent state: flat gradient buckets, ZeRO shards, optimizer state, master
 *              weights; the init, step_begin, step and save phases
 *   overlap.c  buckets started during the backward, ZeRO-3 prefetch, progress calls
 *   memplan.c  activation slots for the pipeline schedule, liveness, arena offsets
 *   verify.c   the IR verifier (between passes in the tests)
 *   emit_c.c   the C printer
 * The kernel table: name, planrt function the C target calls, class. */
#define KERNEL_TABLE(X) \
	X(LOOP, "loop", NULL, KC_LOOP) \
	X(MATMUL, "matmul", "planrt_k_matmul_f32", KC_COMPUTE) \
	X(PERMUTE, "permute", "planrt_k_permute_f32", KC_COMPUTE) \
	X(SUM_TO, "sum_to", "planrt_k_sum_to_f32", KC_COMPUTE) \
	X(SUM_TO_ACC, "sum_to_acc", "planrt_k_sum_to_acc_f32", KC_COMPUTE) \
	X(DROPOUT, "dropout", "planrt_k_dropout_f32", KC_COMPUTE) \
	X(CAUSAL_MASK, "causal_mask", "planrt_causal_mask_block_f32", KC_COMPUTE) \
	X(SOFTMAX, "softmax", "planrt_k_softmax_f32", KC_COMPUTE) \
	X(SOFTMAX_GRAD, "softmax_grad", "planrt_k_softmax_grad_f32", KC_COMPUTE) \
	X(LAYER_NORM, "layer_norm", "planrt_k_layer_norm_f32", KC_COMPUTE) \
	X(LAYER_NORM_GRAD, "layer_norm_grad", "planrt_k_layer_norm_grad_f32", KC_COMPUTE) \
	X(RMS_NORM, "rms_norm", "planrt_k_rms_norm_f32", KC_COMPUTE) \
	X(RMS_NORM_GRAD, "rms_norm_grad", "planrt_k_rms_norm_grad_f32", KC_COMPUTE) \
	X(EMBED, "embed", "planrt_k_embed_f32", KC_COMPUTE) \
	X(EMBED_GRAD, "embed_grad", "planrt_k_embed_grad_f32", KC_COMPUTE) \
	X(CROSS_ENTROPY, "cross_entropy", "planrt_cross_entropy_f32", KC_COMPUTE) \
	X(CE_GRAD, "cross_entropy_grad", "planrt_k_ce_grad_f32", KC_COMPUTE) \
	X(MOE_ROUTE, "moe_route", "planrt_k_moe_route_f32", KC_COMPUTE) \
	X(MOE_ROUTE_GRAD, "moe_route_grad", "planrt_k_moe_route_grad_f32", KC_COMPUTE) \
	X(MOE_DISPATCH, "moe_dispatch", "planrt_k_moe_dispatch_f32", KC_COMPUTE) \
	X(MOE_DISPATCH_GRAD, "moe_dispatch_grad", "planrt_k_moe_dispatch_grad_f32", KC_COMPUTE) \
	X(MOE_COMBINE, "moe_combine", "planrt_k_moe_combine_f32", KC_COMPUTE) \
	X(MOE_COMBINE_GRAD, "moe_combine_grad", "planrt_k_moe_combine_grad_f32", KC_COMPUTE) \
	X(MOE_AUX_LOSS, "moe_aux_loss", "planrt_moe_aux_loss_f32", KC_COMPUTE) \
	X(MOE_AUX_LOSS_GRAD, "moe_aux_loss_grad", "planrt_k_moe_aux_loss_grad_f32", KC_COMPUTE) \
	X(MOE_Z_LOSS, "moe_z_loss", "planrt_moe_z_loss_f32", KC_COMPUTE) \
	X(MOE_Z_LOSS_GRAD, "moe_z_loss_grad", "planrt_k_moe_z_loss_grad_f32", KC_COMPUTE) \
	X(MOE_METRICS, "moe_metrics", "planrt_moe_metrics", KC_IO) \
	X(MOE_EXCHANGE, "moe_exchange", "planrt_moe_exchange", KC_COMM) \
	X(SLICE_DIM, "slice", "planrt_slice_dim", KC_COMPUTE) \
	X(FILL, "fill", "planrt_fill", KC_COMPUTE) \
	X(CAST, "cast", "planrt_cast", KC_COMPUTE) \
	X(ACCUMULATE, "accumulate", "planrt_accumulate", KC_COMPUTE) \
	X(LOAD_INPUT, "load_input", "planrt_load_data", KC_IO) \
	X(INIT_PARAM, "init_param", "planrt_init_param", KC_IO) \
	X(SAVE_PARAM, "save_param", "planrt_save_param", KC_IO) \
	X(CKPT_WRITE, "checkpoint_write", "planrt_ckpt_write", KC_IO) \
	X(CKPT_READ, "checkpoint_read", "planrt_ckpt_read", KC_IO) \
	X(CKPT_WRITE_LOCAL, "checkpoint_write_local", "planrt_ckpt_write_local", KC_IO) \
	X(CKPT_READ_LOCAL, "checkpoint_read_local", "planrt_ckpt_read_local", KC_IO) \
	X(PAIR_COMM, "pair_comm", "planrt_make_pair_comm", KC_SETUP) \
	X(OFFLOAD_OPEN, "offload_open", "planrt_offload_open", KC_IO) \
	X(OFFLOAD_READ, "offload_read", "planrt_offload_read", KC_IO) \
	X(OFFLOAD_WRITE, "offload_write", "planrt_offload_write", KC_IO) \
	X(OFFLOAD_WAIT, "offload_wait", "planrt_offload_wait", KC_IO) \
	X(OFFLOAD_COPY, "offload_copy", "planrt_copy", KC_IO) \
	X(SUM_SQUARES, "sum_squares", "planrt_sum_squares_acc", KC_COMPUTE) \
	X(SUM_SQUARES_SHARD, "sum_squares_shard", "planrt_sum_squares_shard", KC_COMPUTE) \
	X(CLIP_COEF, "clip_coef", "planrt_clip_coef", KC_COMPUTE) \
	X(LOSS_SEED, "loss_seed", "planrt_loss_seed", KC_COMPUTE) \
	X(UNSCALE_CLIP, "unscale_clip", "planrt_unscale_clip_coef", KC_COMPUTE) \
	X(OPTIMIZER, "optimizer", "planrt_optimizer_step", KC_COMPUTE) \
	X(LOSS_ACCUMULATE, "loss_accumulate", "planrt_loss_accumulate", KC_COMPUTE) \
	X(ALLREDUCE_DIM, "allreduce", "planrt_allreduce_dim", KC_COMM) \
	X(REDUCE_SCATTER_DIM, "reduce_scatter", "planrt_reduce_scatter_dim", KC_COMM) \
	X(ALLGATHER_DIM, "allgather", "planrt_allgather_dim", KC_COMM) \
	X(ALLTOALL_DIM, "alltoall", "planrt_alltoall_dim", KC_COMM) \
	X(ALLREDUCE_INPLACE, "allreduce_inplace", "planrt_allreduce_inplace", KC_COMM) \
	X(REDUCE_SCATTER_INPLACE, "reduce_scatter_inplace", "planrt_reduce_scatter_inplace", KC_COMM) \
	X(ALLGATHER_INPLACE, "allgather_inplace", "planrt_allgather_inplace", KC_COMM) \
	X(ALLGATHER_FLAT, "allgather_flat", "planrt_allgather_flat", KC_COMM) \
	X(ALLGATHER_FLAT_START, "allgather_flat_start", "planrt_allgather_flat_start", KC_COMM) \
	X(BUCKET_ALLREDUCE, "bucket_allreduce", "planrt_bucket_allreduce", KC_COMM) \
	X(BUCKET_RS, "bucket_reduce_scatter", "planrt_bucket_reduce_scatter", KC_COMM) \
	X(BUCKET_RS_START, "bucket_reduce_scatter_start", "planrt_bucket_reduce_scatter_start", KC_COMM) \
	X(BUCKET_RS_FINISH, "bucket_reduce_scatter_finish", "planrt_bucket_reduce_scatter_finish", KC_WAIT) \
	X(SEND_START, "send", "planrt_p2p_send_start", KC_COMM) \
	X(RECV_START, "recv", "planrt_p2p_recv_start", KC_COMM) \
	X(P2P_FINISH, "p2p_finish", "planrt_p2p_finish", KC_WAIT) \
	X(REQUEST_FINISH, "finish", "planrt_request_finish", KC_WAIT) \
	X(REQUEST_PROGRESS, "progress", "planrt_request_progress", KC_WAIT) \
	X(BUCKET_PROGRESS, "bucket_progress", "planrt_bucket_progress", KC_WAIT) \
	X(SCALE_METRIC, "scale_metric", "planrt_scale_metric", KC_COMPUTE) \
	X(LOCAL_AVERAGE, "local_average", "planrt_local_average", KC_COMM) \
	X(ASYNC_PULL, "async_pull", "planrt_async_pull", KC_COMM) \
	X(ASYNC_PUSH, "async_push", "planrt_async_push", KC_COMM) \
	X(ASYNC_DRAIN, "async_drain", "planrt_async_drain", KC_WAIT) \
	X(ASYNC_POST, "async_post", "planrt_async_post", KC_COMM) \
	X(ASYNC_GATHER, "async_gather", "planrt_async_gather", KC_WAIT) \
	X(ASYNC_PUBLISH, "async_publish", "planrt_async_publish", KC_COMM) \
	X(COMPRESS_CAST, "compress_cast", "planrt_compress_cast", KC_COMM) \
	X(COMPRESS_TOPK, "compress_topk", "planrt_compress_topk", KC_COMM) \
	X(COMPRESS_POWERSGD, "compress_powersgd", "planrt_compress_powersgd", KC_COMM) \
	X(POWERSGD_INIT, "powersgd_init", "planrt_powersgd_init", KC_COMPUTE) \
	X(BMM, "bmm", "planrt_k_bmm_f32", KC_COMPUTE) \
	X(UNARY, "unary", "planrt_k_unary_f32", KC_COMPUTE) \
	X(UNARY_GRAD, "unary_grad", "planrt_k_unary_grad_f32", KC_COMPUTE) \
	X(SUM_DIM, "sum_dim", "planrt_k_sum_dim_f32", KC_COMPUTE) \
	X(SUM_DIM_GRAD, "sum_dim_grad", "planrt_k_sum_dim_grad_f32", KC_COMPUTE) \
	X(MAX_DIM, "max_dim", "planrt_k_max_dim_f32", KC_COMPUTE) \
	X(MAX_DIM_GRAD, "max_dim_grad", "planrt_k_max_dim_grad_f32", KC_COMPUTE) \
	X(NARROW, "narrow", "planrt_k_slice_f32", KC_COMPUTE) \
	X(NARROW_GRAD, "narrow_grad", "planrt_k_slice_grad_f32", KC_COMPUTE) \
	X(REPEAT_KV, "repeat_kv", "planrt_k_repeat_kv_f32", KC_COMPUTE) \
	X(REPEAT_KV_GRAD, "repeat_kv_grad", "planrt_k_repeat_kv_grad_f32", KC_COMPUTE) \
	X(ROPE, "rope", "planrt_k_rope_f32", KC_COMPUTE) \
	X(ROPE_GRAD, "rope_grad", "planrt_k_rope_grad_f32", KC_COMPUTE) \
	X(REGRESSION_LOSS, "regression_loss", "planrt_regression_loss_f32", KC_COMPUTE) \
	X(REGRESSION_LOSS_GRAD, "regression_loss_grad", "planrt_regression_loss_grad_f32", KC_COMPUTE) \
	X(CHECK_LABELS, "check_labels", "planrt_check_labels", KC_COMPUTE) \
	X(NARROW_I32, "narrow_i32", "planrt_narrow_i32", KC_COMPUTE) \
	X(OPAQUE, "op", NULL, KC_OPAQUE)

typedef enum {
#define X(name, text, fn, cls) K_##name,
	KERNEL_TABLE(X)
#undef X
	K_COUNT
} KernelKind;

/* KC_COMM kernels start communication (their Comm list says what); KC_WAIT kernels complete or
 * progress it; KC_OPAQUE is a graph op the C target has no kernel for yet (MoE routing, async
 * transfers): it keeps the program complete for the check and explain, and planc build refuses it. */
typedef enum { KC_LOOP, KC_COMPUTE, KC_COMM, KC_WAIT, KC_IO, KC_SETUP, KC_OPAQUE } KernelClass;
extern const char *const kernel_names[K_COUNT];
extern const char *const kernel_functions[K_COUNT];
extern const KernelClass kernel_classes[K_COUNT];

/* Phases: how often a kernel runs. Forward, backward and the prepares run once per micro-batch
 * per model chunk; step_begin and step once per step; init once before training, save once after.
 * checkpoint runs at each sharded checkpoint (--save-every), resume once after init when a run
 * resumes (--resume); eval_begin and eval_end around the forwards of each held-out batch
 * (--eval-every). */
typedef enum { PH_INIT, PH_STEP_BEGIN, PH_PREPARE_F, PH_FORWARD, PH_PREPARE_B, PH_BACKWARD, PH_STEP, PH_SAVE,
	       PH_CHECKPOINT, PH_RESUME, PH_EVAL_BEGIN, PH_EVAL_END, PH_COUNT } Phase;
extern const char *const phase_names[PH_COUNT];

typedef enum {
	BUF_NONE,   /* not on this stage */
	BUF_STATE,  /* persistent, allocated once (parameters, gradients, optimizer state, metrics) */
	BUF_ARENA,  /* the transient region: alive within one phase call */
	BUF_SLOT,   /* an activation slot: one micro-batch's values kept from its forward to its backward */
	BUF_INBOX,  /* a receive inbox: a forward input posted one action ahead */
	BUF_VIEW,   /* elements of another buffer */
} BufClass;
/* SC_OFFLOAD: the host staging of an offloaded optimizer (state.c: gradient and parameter copies,
 * the disk records' read slots) */
typedef enum { SC_PARAM, SC_GRAD, SC_OPTIM, SC_MASTER, SC_BUFFER, SC_METRIC, SC_OFFLOAD, SC_COUNT } StateKind;
extern const char *const state_kind_names[SC_COUNT];

typedef struct Buffer {
	const char *name;   /* a C identifier, unique in the program */
	const char *what;   /* a description for comments (the tensor's name) */
	BufClass cls;
	StateKind state;    /* BUF_STATE */
	DType dtype;
	long long elems;
	size_t bytes;       /* elems * dtype size; BUF_STATE: what is allocated */
	int value;          /* the graph value it holds, or -1 */
	/* BUF_VIEW: elements [view_off + coord(view_axis) * view_stride, ...) of view_of; view_axis -1:
	 * none, VIEW_SLOT: the running action's slot index for the coordinate (offload_activations.c's
	 * host copies, one per micro-batch in flight) */
	int view_of;
	long long view_off;
	int view_axis;
	long long view_stride;
	/* shape of the local block and how it sits in the global tensor (for block offsets) */
	int rank;
	long long ldims[MAX_DIMS];
	signed char split_axis[MAX_DIMS]; /* mesh axis splitting dim d, or -1 */
	signed char split_outer[MAX_DIMS]; /* a second axis splitting dim d, before split_axis in the mesh, or
					    * -1: the block offset is (coord(outer) size(split_axis) + coord(split_axis)) ldim */
	int micro_dim;      /* the batch dim (moves with the micro-batch), or -1 */
	long long micro_rows; /* global rows of one micro-batch */
	/* memory plan */
	int first, last;    /* liveness: kernel indices of the first and last access */
	size_t offset;      /* BUF_ARENA / BUF_SLOT / BUF_INBOX: bytes from the region's base */
	int chunk;          /* BUF_SLOT / BUF_INBOX: the model chunk whose layout holds it */
	int group;          /* the planning group (one phase call, or one chunk's slot) it was placed in */
	OffloadPlace place; /* BUF_STATE: device memory (PLACE_NONE) or pinned host memory (PLACE_HOST);
			     * offloaded optimizer state on disk is a file planrt_offload_open makes */
} Buffer;

/* What a communication kernel puts on the wire, for the collective check and explain. */
typedef struct Comm {
	OpKind coll;        /* OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_ALL_TO_ALL, OP_SEND, OP_RECV */
	int axis;           /* the group's mesh axis (the pipe axis for tied pairs and pipeline transfers) */
	int pair;           /* >= 0: the tied-parameter pair group Lowered.pair_a/b[pair] on the pipe axis */
	int peer;           /* p2p: the peer's coordinate on axis */
	int channel;        /* p2p: direction (0 activations, 1 gradients) * chunks + the receiving chunk */
	int micro;          /* p2p, filled by the check's walk: the micro-batch it carries */
	long long elems;    /* the call's buffer B of the wire formula, in elements of dtype */
	DType dtype;
	int rank;           /* the local block (the check compares shapes, not only counts) */
	long long shape[MAX_DIMS];
	double every;       /* runs once per this many steps (local SGD averages), 0: every time */
	bool bound;         /* elems is a bound, in elements this rank sends to the others: a call whose
			     * sizes depend on the data (dropless MoE's rows, an all_to_all_v) */
	int op;             /* graph op, for messages, or -1 */
	const char *what;   /* the tensor, for messages */
} Comm;

typedef enum {
	KA_BUF,      /* a buffer's address */
	KA_NULL,     /* no buffer / no request */
	KA_BUFS,     /* a list of buffer addresses */
	KA_INT,
	KA_INTS,     /* a constant int64 list (int32 when i32) */
	KA_F64,
	KA_DTYPE,    /* i: a DType */
	KA_AXIS,     /* i: a mesh axis (its communicator) */
	KA_PAIR,     /* i: a tied-parameter pair group (its communicator) */
	KA_REQ,      /* i: one of the stage's request handles */
	KA_SLOTREQ,  /* i: one of the running action's slot requests */
	KA_COORD,    /* the integer f_base + coord(axis) * stride: i = base, axis, stride */
	KA_OFFSET,   /* a buffer's block offset on dim `dim` (all dims as a list when dim < 0) */
	KA_SCALAR,   /* f times the first element of a buffer */
	KA_PARAM,    /* i: index in the program's parameter table */
	KA_CTX,      /* the phase's context */
	KA_STEP,     /* the step being trained (0-based) */
	KA_STEP_SEED,/* this step's dropout key */
	KA_STR,      /* str: a string constant (for messages) */
} KArgKind;
typedef struct KArg {
	KArgKind kind;
	int buf;              /* KA_BUF, KA_OFFSET, KA_SCALAR */
	long long i;          /* KA_INT, KA_DTYPE, KA_AXIS, KA_PAIR, KA_REQ, KA_SLOTREQ, KA_PARAM; KA_COORD base */
	double f;             /* KA_F64, KA_SCALAR factor */
	int axis;             /* KA_COORD */
	long long stride;     /* KA_COORD */
	int dim;              /* KA_OFFSET */
	const long long *ints;/* KA_INTS */
	const int *bufs;      /* KA_BUFS */
	int n;                /* KA_INTS, KA_BUFS: length */
	bool i32;             /* KA_INTS: an int array */
	const char *str;      /* KA_STR */
} KArg;

typedef enum { LX_LOAD, LX_CONST, LX_UNARY, LX_BINARY } LExprKind;
typedef struct LExpr {
	LExprKind kind;
	OpKind op;                   /* LX_UNARY / LX_BINARY: the graph op it computes */
	int buf;                     /* LX_LOAD */
	long long stride[MAX_DIMS];  /* LX_LOAD: element stride per loop dim (0 = broadcast) */
	double f;                    /* LX_CONST, SCALE factor, dropout p */
	const char *s;               /* gelu approximation */
	struct LExpr *a, *b;
} LExpr;

typedef struct Kernel {
	KernelKind kind;
	Phase phase;
	int chunk;              /* model chunk (prepare, forward, backward) */
	int op;                 /* the graph op it came from, or -1 */
	const char *note;       /* for the generated file's comment */
	KArg *args;
	int nargs, capargs;
	int *uses, nuses, capuses; /* buffers read (liveness) */
	int *defs, ndefs, capdefs; /* buffers written */
	Comm *comm;             /* KC_COMM, KC_OPAQUE: what it sends */
	int ncomm, capcomm;
	bool only_last_micro;   /* forward / backward: runs in the last micro-batch only */
	/* K_LOOP: out (+)= expr over a rank-dims nest */
	int out;
	bool accumulate;
	int rank;
	long long dims[MAX_DIMS];
	LExpr *expr;
	int nfused;
	/* streams.c: where a device target runs it. The C and LLVM targets run every kernel in
	 * program order on the host and ignore these. */
	int stream;             /* StreamKind, or STREAM_P2P + 2 * channel (+ 1 for a receive) */
	int *waits, nwaits;     /* kernels of its phase call on other streams it waits for (their
				 * events); -1: the compute stream at the phase call's entry */
	bool event;             /* records an event when done (a kernel or the call's end waits for it) */
	bool join;              /* the phase call ends with the compute stream waiting for it */
	bool tensor_cores;      /* K_MATMUL: both operands are bf16 values widened to f32 (casts of
				 * bf16 buffers), so bf16 tensor-core math computes the same products */
} Kernel;

typedef enum { HANDLE_REQUEST, HANDLE_BUCKET } HandleType; /* planrt_request_t, planrt_bucket_t */
typedef struct Handle {
	HandleType type;
	const char *name;
} Handle;

/* One action of the stage's schedule, with the activation slot and inbox memplan.c gave it. */
typedef struct SlotAction {
	ActionKind kind;
	int micro, chunk;
	int slot;   /* activation slot */
	int inbox;  /* receive inbox, or -1 */
} SlotAction;

typedef struct Lowered Lowered;

/* The program of one pipeline stage and rank role. Buffer i < g->nvals is graph value i (BUF_NONE
 * when the value is not on this stage); lowering appends the buffers it makes. */
typedef struct LProg {
	Lowered *low;
	Graph *g;
	PlanSpec *ps;
	int stage, role;
	int nchunks;
	Kernel *k;
	int nk, capk;
	Buffer *buf;
	int nbuf, capbuf;
	Handle *handles;
	int nhandles, caphandles;
	int nslotreqs;          /* p2p requests one slot's actions use */
	int loss_metric;        /* buffer: the step's mean loss (f64) */
	int norm_metric;        /* buffer: the gradient norm (f64) */
	/* memplan.c */
	SlotAction *actions;
	int nactions;
	int nslots, ninbox;
	size_t transient_bytes, slot_bytes, inbox_bytes;
	size_t slot_offset, inbox_offset, arena_bytes;
	size_t state_bytes[SC_COUNT]; /* every state buffer, by kind */
	size_t host_state_bytes[SC_COUNT]; /* of which in (pinned) host memory (PLACE_HOST): offloaded
					    * state and its staging; the rest is device memory */
	size_t disk_bytes;      /* the offloaded optimizer's state file (state.c) */
	/* why the C target cannot run it (NULL: it can): the first opaque kernel's op */
	int opaque_op;
	/* sync strategies (state.c): the loss metric holds loss_window steps (local SGD logs a step's
	 * loss when its replicas average; 0: one, logged every step), and the async master's
	 * versions metric (one per rank of the async axis, -1: none) */
	int loss_window;
	int loss_history;       /* the buffer planrt logs the loss from (local SGD), else loss_metric */
	int versions_metric;
} LProg;

/* A model parameter as the program's table lists it (init, --init, --save). */
typedef struct ParamEntry {
	const char *name;
	int value, stage;       /* the parameter on its stage (a tied copy has its own entry) */
	int rank;
	long long gdims[MAX_DIMS], ldims[MAX_DIMS];
	signed char split_axis[MAX_DIMS];
	int init_kind;
	double init_a, init_b;
	bool saved;             /* false for a tied copy (the original is written) and a computed buffer */
} ParamEntry;

struct Lowered {
	Graph *g;
	PlanSpec *ps;
	LProg **progs;          /* [stage * nroles + role index] */
	int nprogs, nroles;
	ParamEntry *params;
	int nparams;
	int npairs;             /* tied-parameter pair groups on the pipe axis */
	int pair_a[64], pair_b[64];
	long long seq, vocab;   /* the token data: window length and vocabulary */
};

/* lower.c: the program of every stage and role, complete for the check and explain. */
Lowered *lower(Graph *g);
LProg *lowered_prog(const Lowered *low, int stage, int role); /* role: RANKROLE_* */
/* The helpers every back-end pass shares (lower.c). */
Kernel *kernel_new(LProg *p, KernelKind kind, Phase ph, int chunk, int op);
/* K_OFFLOAD_COPY of src's first n elements into dst, appended (offload: host <-> device) */
Kernel *kernel_copy(LProg *p, Phase ph, int chunk, int op, int dst, int src, long long n, const char *note);
int buffer_new(LProg *p, BufClass cls, DType t, long long elems, const char *name, const char *what);
void karg_buf(LProg *p, Kernel *k, int b, bool reads, bool writes);
void karg_int(LProg *p, Kernel *k, long long i);
void karg_f64(LProg *p, Kernel *k, double f);
void karg(LProg *p, Kernel *k, KArgKind kind, long long i);
void karg_ints(LProg *p, Kernel *k, const long long *v, int n, bool i32);
void karg_bufs(LProg *p, Kernel *k, const int *bufs, int n, bool reads, bool writes);
void karg_coord(LProg *p, Kernel *k, long long base, int axis, long long stride);
void kernel_use(LProg *p, Kernel *k, int b);
void kernel_def(LProg *p, Kernel *k, int b);
Comm *kernel_comm(LProg *p, Kernel *k);
/* An opaque kernel for graph op oi (with its communication, if any), appended in phase ph. */
Kernel *kernel_opaque(LProg *p, int oi, Phase ph, int chunk);
int handle_new(LProg *p, HandleType t, const char *name);
int buffer_root(const LProg *p, int b); /* follows views to the storage */
/* Inserts kernels: new_k[i] goes right before old kernel before[i] (before[i] == p->nk: at the
 * end); several before the same kernel keep their order. */
void kernels_insert(LProg *p, Kernel *new_k, const int *before, int n);
/* The same, collected as a pass goes: inserts_add(list, k, before) ... inserts_apply(p, list). */
typedef struct Inserts {
	Kernel *k;
	int *before;
	int n, cap;
} Inserts;
void inserts_add(Inserts *ins, Kernel k, int before);
void inserts_apply(LProg *p, Inserts *ins);
void lprog_dump(FILE *out, const LProg *p);

/* state.c, overlap.c, memplan.c: the back-end passes after lower, on every program */
bool plan_state(Lowered *low);
/* state.c: a hash of the whole lowered program ("fnv1a64:<16 hex digits>"), which planrt records in
 * every checkpoint: a checkpoint resumes bit for bit under the same, and is resharded otherwise */
const char *plan_fingerprint(const Lowered *low);
const char *sync_mode_name(SyncMode m); /* "strict", "local_sgd", "async" (the program descriptor's) */
bool plan_overlap(Lowered *low);
/* offload_params.c: under `offload params -> host`, each ZeRO-3 gather reads a device copy of its
 * host-placed chunk */
bool plan_offload_params(Lowered *low);
/* offload_activations.c: under `offload activations -> host`, saved activations go to the host in
 * the forward and come back in the backward */
bool plan_offload_activations(Lowered *low);
bool memplan(Lowered *low);
int memplan_slots(LProg *p);   /* memplan.c: the slots the stage's schedule needs (micro-batches in flight) */
/* streams.c: the device schedule, after memplan: each kernel's stream (compute, communication,
 * copy, host, a pipeline channel's), the events it waits for within its phase call, and the joins
 * that end the call; GEMMs whose operands are bf16 values take tensor cores. stream_dump prints it
 * (--dump-after=streams). */
typedef enum { STREAM_COMPUTE, STREAM_COMM, STREAM_COPY, STREAM_HOST, STREAM_P2P } StreamKind;
bool plan_streams(Lowered *low);
const char *stream_name(int stream, char *buf, size_t n);
void streams_dump(FILE *out, const LProg *p);
/* verify.c: checks the IR's invariants (arguments, buffers, phases, liveness and placement after
 * memplan); reports and returns false on the first broken one (an internal error in planc). */
bool verify_ir(const Lowered *low, const char *after_pass);
/* Whether planc build can run it; reports the first reason when report. */
bool lowered_executable(const Lowered *low, bool report);
bool lowered_executable_on(const Lowered *low, bool report, bool device); /* device: the CUDA target's rules */

/* ---------------------------------------------------------------- emit_c.c */
/* Writes the program as C into dir/prog.c; false on I/O errors. */
bool emit_c(const Lowered *low, const char *dir, const char *source_path);
/* The same file for another target (the CUDA target: emit_cuda.c): emit_c.c prints the program's
 * structure (buffers, phase functions, tables, descriptor) and the target prints every kernel, its
 * declarations per stage, what begins and ends a phase function, and its includes; main() calls
 * main_fn. */
typedef struct Emit Emit;
typedef struct EmitTarget {
	void (*prelude)(Emit *e);
	void (*stage_decls)(Emit *e);
	void (*phase_begin)(Emit *e, Phase ph, int chunk);
	void (*kernel)(Emit *e, const Kernel *k);
	void (*phase_end)(Emit *e, Phase ph, int chunk);
	void (*epilogue)(Emit *e); /* after main() */
	const char *main_fn;
	void *data;
} EmitTarget;
bool emit_c_with(const Lowered *low, const char *dir, const char *source_path, const EmitTarget *target);
FILE *emit_file(const Emit *e);
const LProg *emit_prog(const Emit *e);      /* the stage program being printed */
const char *emit_prefix(const Emit *e);     /* its names' prefix */
const EmitTarget *emit_target(const Emit *e);
void emit_arg(Emit *e, const KArg *a);      /* an argument as the C target prints it */
void emit_c_kernel(Emit *e, const Kernel *k); /* a kernel as the C target prints it (a call or a loop nest) */
const char *emit_ctype(DType t);            /* the C type of an element */
/* A fused loop: the buffers it reads in order of first read (returns how many), whether every load
 * walks the output's index (flat), and its expression with the load of buffer b printed as
 * v<load_slot[b]>. emit_c_loop_to prints the C target's loop nest for it (the tests compare it). */
int emit_loop_loads(const Kernel *k, int *loads, int cap);
bool emit_loop_flat(const Kernel *k);
void emit_loop_expr_to(FILE *f, const LProg *p, const Kernel *k, bool flat, const int *load_slot);
void emit_c_loop_to(FILE *f, const Lowered *low, const LProg *p, const Kernel *k);

/* ---------------------------------------------------------------- emit_cuda.c */
/* The CUDA target: DIR/prog.c (the host program: emit_c.c's structure, each kernel a call into
 * planrt_cuda on its stream with the events streams.c planned, or a launch of a fused loop),
 * DIR/kernels.cu (every distinct fused loop as a __global__ function and its launcher) and
 * DIR/loops.h (the loops' element functions, C that compiles for the host and the device). */
bool emit_cuda(const Lowered *low, const char *dir, const char *source_path);
/* Whether the CUDA target can run the program; reports the first reason when report. */
bool cuda_executable(const Lowered *low, bool report);
/* A fused loop's element function as loops.h prints it (static, named fname), for the tests. */
void emit_cuda_loop_body(FILE *f, const LProg *p, const Kernel *k, const char *fname);

/* The back end's driver (passes.c): lower, state, overlap, memplan, with --dump-after after each
 * and the IR verifier between passes when verify. NULL after reporting errors. */
Lowered *run_backend(Graph *g, const char *dump_after, FILE *dump_out, bool verify);
/* The emit pass: DIR/prog.c, printed after it when dump_after is "emit". */
bool run_emit(const Lowered *low, const char *dir, const char *source_path, const char *dump_after, FILE *dump_out);
bool dump_after_emit(const char *path, FILE *out);

/* ---------------------------------------------------------------- emit_llvm.c */
/* The LLVM back end (LLVM 14 C API): the program emit_c.c prints, built as LLVM IR and optimised
 * with default<O3> for the host CPU; the fused loops also as NVPTX kernels. LLVM's errors (a
 * verifier failure, a missing target, an unresolved symbol) are reported as planc diagnostics. */
struct LLVMOpaqueContext;
struct LLVMOpaqueModule;
struct LLVMOpaqueTargetMachine;
/* DIR/prog.ll: the verified module before optimisation (also printed to dump when not NULL) */
bool emit_llvm_ir(const Lowered *low, const char *dir, const char *source_path, FILE *dump);
/* PATH: a native object of the optimised module, whose main() calls planrt_main (planc build
 * --backend llvm links it with planrt); verify: also verify the optimised module; native: for
 * this machine's CPU, else for its triple's baseline */
bool emit_llvm_object(const Lowered *low, const char *path, const char *source_path, bool verify, bool native);
/* planc run: compiles the program with ORC LLJIT in this process for this machine's CPU (planrt
 * resolved from planc itself) and runs main(argc, argv); the program's exit status, or -1 after
 * a diagnostic */
int llvm_run(const Lowered *low, const char *source_path, int argc, char **argv, bool verify);
/* DIR/kernels.ptx: every fused loop as an sm_80 NVPTX kernel, named as in the CPU module
 * (s<stage>_loop<kernel index>), a grid-stride loop over its output's elements */
bool emit_ptx(const Lowered *low, const char *dir, FILE *dump);
/* For tests: the unoptimised module in context c for target machine tm (gpu: the NVPTX kernels
 * only), and LLVMVerifyModule reported as a planc diagnostic (false if broken). */
struct LLVMOpaqueModule *llvm_build_module(const Lowered *low, struct LLVMOpaqueContext *c,
					   struct LLVMOpaqueTargetMachine *tm, bool gpu, const char *source_path);
bool llvm_verify(struct LLVMOpaqueModule *m, const char *what);
/* whether the LLVM back end can call kernels of this kind (K_LOOP: it builds them) */
bool llvm_kernel_known(KernelKind kind);

#endif
