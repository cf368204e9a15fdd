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
/* sema_check: names of every module and the statements of every plan, with warnings; false if
 * any error. sema_plan: one plan's PlanSpec, NULL after reporting errors; it reports errors but
 * not warnings (run sema_check first: it reports each plan's warnings once). */
bool sema_check(Program *p);
PlanSpec *sema_plan(Program *p, Item *plan);
Item *default_plan(Program *p, const char *name); /* `--plan NAME`, or the file's first plan */
int axis_index(const PlanSpec *ps, const char *name); /* -1 if not a mesh axis */
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
	X(OPTIMIZER_STEP, "optimizer_step", OPK_OPTIMIZER) \
	X(ALL_REDUCE, "all_reduce", OPK_COLLECTIVE) \
	X(REDUCE_SCATTER, "reduce_scatter", OPK_COLLECTIVE) \
	X(ALL_GATHER, "all_gather", OPK_COLLECTIVE) \
	X(ALL_TO_ALL, "all_to_all", OPK_COLLECTIVE) \
	X(SLICE, "slice", OPK_VIEW) \
	X(SEND, "send", OPK_P2P) \
	X(RECV, "recv", OPK_P2P)

typedef enum {
#define X(name, text, kind) OP_##name,
	OP_TABLE(X)
#undef X
	OP_COUNT
} OpKind;

typedef enum { OPK_SOURCE, OPK_MATMUL, OPK_VIEW, OPK_BINARY, OPK_LINEAR, OPK_UNARY, OPK_ROWWISE, OPK_EMBED,
	OPK_LOSS, OPK_MOE, OPK_UNARY_GRAD, OPK_OPTIMIZER, OPK_COLLECTIVE, OPK_P2P } OpClass;

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
	int init_kind;     /* ROLE_PARAM: 0 normal, 1 uniform, 2 zeros, 3 ones */
	double init_a, init_b;
} Value;

typedef struct Op {
	OpKind kind;
	int nin, nout;
	int in[6];
	int out[3];
	double f;          /* scalar attribute: scale, dropout p, eps, capacity factor */
	long long n;       /* integer attribute: heads, top_k, split dim, group stage */
	const char *s;     /* string attribute: gelu approximation */
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
	double aux_loss_weight;
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
bool zero(Graph *g);         /* zero.c: ZeRO state sharding and offload placement */
bool sync_grads(Graph *g);   /* sync.c: gradient buckets, compression, local SGD, async */
bool check_collectives(Graph *g); /* schedule.c: the collective-sequence check over all ranks */
Graph *run_passes(PlanSpec *ps, const char *dump_after, FILE *dump_out);
/* explain.c: the cost report, text or JSON; planned (may be NULL) is the lowered, memory-planned
 * program when planc build can execute the plan: its arena and state give the peak. */
typedef struct LProg LProg;
void explain(FILE *out, Graph *g, bool json, const LProg *planned);
extern const char *const pass_names[];

/* ---------------------------------------------------------------- lower.c */
/* The loop-level IR: what one rank of one role runs, as a list of kernels in three phases (the
 * forward of a micro-batch, its backward, and the once-per-step update). A kernel is a call into
 * planrt (a compute kernel, a collective, a data or optimizer routine) or a fused element-wise
 * loop nest whose body is a small expression tree. emit_c.c prints it as C; the LLVM and CUDA
 * backends are printers over the same structure. Buffers are values: where each lives (the
 * persistent state block or the per-micro-batch arena) and at which offset is memplan.c's job. */
typedef enum { PH_FORWARD, PH_BACKWARD, PH_STEP, PH_COUNT } Phase;
typedef enum { BUF_NONE, BUF_STATE, BUF_ARENA, BUF_VIEW } BufClass;

typedef struct Buffer {
	BufClass cls;
	int view_of;      /* BUF_VIEW: the value whose storage this is */
	long long elems;  /* local elements */
	DType dtype;
	size_t bytes;
	size_t offset;    /* in the arena */
	size_t alloc_bytes; /* BUF_STATE that this rank allocates (memplan.c): its size, else 0 */
	int first, last;  /* kernel indices of definition and last use (arena liveness) */
	long long ldims[MAX_DIMS]; /* local shape */
	long long offs_stride[MAX_DIMS]; /* unused: reserved */
} Buffer;

typedef enum {
	KA_VALUE,   /* a buffer's address */
	KA_INT,
	KA_F64,
	KA_INTS,    /* a constant int64_t array */
	KA_TEXT,    /* a C expression printed as is (enum names, the communicator of an axis) */
	KA_SCRATCH, /* the kernel's arena scratch */
	KA_SCALAR,  /* the float stored in a one-element buffer, as a double */
	KA_OFFS,    /* the global offsets of this rank's block of a value (computed at start-up; the
		     * batch dim also moves with the micro-batch) */
	KA_GDIMS,   /* a value's global dims, with the batch dim the whole step's batch */
} KArgKind;
typedef struct KArg {
	KArgKind kind;
	int value;              /* KA_VALUE: a buffer; KA_SCRATCH: bytes in scratch index */
	long long i;
	double f;
	const long long *ints;  /* KA_INTS */
	int nints;
	const char *text;       /* KA_TEXT: a C expression the emitter prints as is (enum names) */
} KArg;

typedef enum { LX_LOAD, LX_CONST, LX_UNARY, LX_BINARY } LExprKind;
typedef struct LExpr {
	LExprKind kind;
	OpKind op;                   /* LX_UNARY / LX_BINARY: the graph op it computes */
	int value;                   /* LX_LOAD */
	long long stride[MAX_DIMS];  /* LX_LOAD: element stride per loop dim (0 = broadcast) */
	double f;                    /* LX_CONST, SCALE factor, dropout p */
	const char *s;               /* gelu approximation */
	struct LExpr *a, *b;
} LExpr;

typedef enum { KER_CALL, KER_LOOP } KernelKind;
typedef struct Kernel {
	KernelKind kind;
	Phase phase;
	int op;                 /* the graph op it came from (first of a fused chain) */
	const char *fn;         /* KER_CALL */
	KArg args[28];
	int nargs;
	int out;                /* KER_LOOP: output value */
	bool accumulate;        /* KER_LOOP: out += expr */
	int rank;
	long long dims[MAX_DIMS];
	LExpr *expr;
	int nfused;             /* ops fused into this loop */
	int uses[16];           /* buffers the kernel reads (for liveness) */
	int nuses;
	int defs[4];            /* buffers it writes */
	int ndefs;
	size_t scratch;         /* bytes of arena scratch the call needs (collective packing) */
	size_t scratch_offset;
	/* bf16 storage: the f32 copies a call computes on (converted before, and back after) */
	int nconv;
	int conv_arg[8];        /* index into args */
	bool conv_in[8], conv_out[8];
	size_t conv_offset[8];  /* from scratch_offset + scratch */
	size_t conv_bytes;
	bool only_last_micro;   /* runs in the last micro-batch's backward only (an overlapped bucket) */
	bool typed;             /* the call takes its buffers' dtype (collectives): bf16 passes as it is */
} Kernel;

typedef struct LProg {
	Graph *g;
	PlanSpec *ps;
	int stage;
	Kernel *k;
	int nk, capk;
	Buffer *buf;            /* per value id */
	size_t state_bytes;     /* parameters, gradient accumulators, optimizer states */
	size_t arena_bytes;     /* one micro-batch's activations and temporaries (memplan) */
	int *params;            /* parameter values on this stage, in update order */
	int nparams;
	int *inputs;            /* input values (tokens, targets) */
	int ninputs;
	int loss;               /* the loss value on this stage, or -1 */
	/* persistent state per parameter (index as params), sized by memplan.c: the emitter
	 * allocates exactly these and explain reports their sum */
	long long *owned;       /* elements this rank updates: the ZeRO chunk, or the local block */
	size_t *moment_bytes;   /* each of the optimizer's moments (0: none) */
	size_t *master_bytes;   /* f32 master weights (lower precision), else 0 */
	size_t *gchunk_bytes;   /* ZeRO: this rank's f32 gradient chunk, else 0 */
	size_t zero_scratch_bytes; /* ZeRO 1/2: the gather of updated chunks */
	size_t widened_bytes;   /* lower precision: one parameter's gradient in f32 */
	int nprefetch;          /* ZeRO-3 parameter gathers started one parameter ahead */
	int nbuckets;           /* gradient buckets overlapped with the backward (sync ... overlap) */
	size_t *bucket_bytes;   /* each one's static buffer */
} LProg;

/* Lowers the graph for one pipeline stage; NULL after reporting what cannot be executed yet. */
LProg *lower(Graph *g, int stage);
void lprog_dump(FILE *out, const LProg *p);

/* ---------------------------------------------------------------- memplan.c */
/* Liveness over one micro-batch's kernels and first-fit offsets into one arena per rank. */
void memplan(LProg *p);

/* ---------------------------------------------------------------- emit_c.c */
/* Writes the program for every role of the plan as C into dir (prog.c); false on I/O errors. */
bool emit_c(Graph *g, LProg **roles, int nroles, const char *dir, const char *source_path);

#endif
