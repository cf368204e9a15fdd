/* graph.h: the model graph IR (graph.c elaborates the model into it) and the graph passes that
 * transform it, one per file, run in order by passes.c: pipeline, autodiff, shard, recompute,
 * zero and sync. The graph never learns about kernels or buffers (that is lower.h). */
#ifndef PLANC_GRAPH_H
#define PLANC_GRAPH_H

#include "front/front.h"

/* ---------------------------------------------------------------- graph.c */
/* The largest `repeat` count (100000). Only a fuzzing harness lowers it (tests/fuzz: a case must
 * stay fast); planc never changes it. */
extern long long graph_max_repeat;
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
	X(UNARY_FN, "unary", OPK_UNARY)                 /* n: the UnaryFn */ \
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
	X(ROPE_GRAD, "rope_grad", OPK_SHAPE) \
	X(ATTENTION, "attention", OPK_ATTENTION)        /* attention.c: f scale, n AttnMask, dropout_p */ \
	X(ATTENTION_GRAD, "attention_grad", OPK_ATTENTION) \
	X(KV_CACHE, "kv_cache", OPK_SOURCE)             /* decode.c: a layer's key or value cache */ \
	X(DECODE_ATTENTION, "decode_attention", OPK_ATTENTION) /* decode.c: q, k, v, position, caches; f scale, n rows */

typedef enum {
#define X(name, text, kind) OP_##name,
	OP_TABLE(X)
#undef X
	OP_COUNT
} OpKind;

typedef enum { OPK_SOURCE, OPK_MATMUL, OPK_VIEW, OPK_BINARY, OPK_LINEAR, OPK_UNARY, OPK_ROWWISE, OPK_EMBED,
	OPK_LOSS, OPK_MOE, OPK_UNARY_GRAD, OPK_OPTIMIZER, OPK_COLLECTIVE, OPK_P2P,
	OPK_REDUCE, /* reductions over a dim and the regression losses (shard.c's rule_reduce) */
	OPK_SHAPE,  /* slices, concat, reshape, transposes, repeat_kv, RoPE (shard.c's rule_shape) */
	OPK_ATTENTION /* the fused attention and its gradient (attention.c; shard.c's rule_attention) */
} OpClass;

/* The mask of a fused attention op (its n): none, causal (key j > query i gets no weight), or an
 * additive mask tensor, its last input, broadcast to the scores [.., H, Sq, Sk]. */
typedef enum { ATTN_NO_MASK, ATTN_CAUSAL, ATTN_ADDITIVE } AttnMask;

extern const char *const op_names[OP_COUNT];
extern const OpClass op_classes[OP_COUNT];

/* A value's layout on one mesh axis: replicated, partial sum, or split along a dimension. */
#define LAYOUT_R (-1)
#define LAYOUT_P (-2)
#define LAYOUT_FLAT (-3) /* ZeRO: flattened, padded and split evenly over the axis */
typedef struct Layout {
	signed char on[MAX_AXES]; /* LAYOUT_R, LAYOUT_P or the split dim */
} Layout;

/* How a parameter starts (planrt_init_kind_t): drawn normal(a = mean, b = std) or uniform(a, b),
 * zeros, ones; buffers also arange, rope_cos(a = theta) and rope_sin(a) (computed at init, never
 * read from --init nor saved) and load (--init only). */
typedef enum { INIT_NORMAL, INIT_UNIFORM, INIT_ZEROS, INIT_ONES, INIT_ARANGE, INIT_ROPE_COS, INIT_ROPE_SIN, INIT_LOAD } InitKind;
/* The element-wise functions of OP_UNARY_FN (its n; planrt_k_unary's PLANRT_SIN ..) */
typedef enum { UNARY_SIN, UNARY_COS, UNARY_EXP, UNARY_LOG, UNARY_TANH, UNARY_SIGMOID } UnaryFn;

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
	InitKind init_kind; /* ROLE_PARAM */
	double init_a, init_b;
	bool frozen;       /* ROLE_PARAM that does not train (a buffer, or `freeze` in the plan): no gradient */
	bool buffer;       /* declared `buffer` */
} Value;

typedef struct Op {
	OpKind kind;
	int nin, nout;
	int in[7];
	int out[3];
	double f;          /* scalar attribute: scale, dropout p, eps, capacity factor */
	double dropout_p;  /* attention: the dropout probability on its probabilities (0: none) */
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
	int peer;          /* p2p and async: the peer's coordinate on `axis`; -1 none */
	int role;          /* ROLE_ANY, or an async role that alone runs the op */
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

/* What the ZeRO and sync passes decided, as annotations of the graph (they insert no ops that a
 * later pass would have to recognise and drop): state.c lays out the state and writes every
 * kernel of it from these, and records what it ran in the Lowered program.
 *
 * zero.c: the ZeRO sharding in effect (Rajbhandari et al.'s stages): stage 0 when the plan asks
 * for none or its axis has one rank (then axis -1, size 1). */
typedef struct ZeroSharding {
	int stage;
	int axis, size;
} ZeroSharding;

/* sync.c: one gradient bucket, the member gradients (values) reduced together over a mesh axis. */
typedef struct GradBucket {
	OpKind coll;       /* OP_ALL_REDUCE, or OP_REDUCE_SCATTER over the ZeRO axis */
	int axis, stage;
	DType dtype;
	long long elems;   /* the members' local elements */
	bool per_step;     /* once per step; else after every micro-batch's backward (ZeRO 2 and 3) */
	const char *what;  /* "gradient bucket (7 tensors)" */
	int *members;
	int nmembers;
} GradBucket;

/* sync.c: a parameter copied to two pipeline stages (tied weights): the gradients of the original
 * (stage[0], grad[0]) and of the copy are summed over the pipe axis (Megatron's embedding group). */
typedef struct TiedGrads {
	int stage[2];
	int grad[2];
	int param;         /* the copy */
} TiedGrads;

/* sync.c: how data-parallel replicas agree (docs/sync.md). */
typedef struct GradSync {
	SyncMode mode;     /* the plan's strategy */
	int axis;          /* the axis the batch is split over (local SGD averages and async masters
			    * serve there), or -1 */
	bool replicas;     /* that axis has more than one rank: local SGD and async are in effect */
	bool compress;     /* strict sync whose batch-axis buckets are compressed (f32 gradients) */
	bool overlap;      /* buckets started during the backward (overlap.c) */
	GradBucket *buckets; /* in the order their gradients complete, per axis */
	int nbuckets;
	TiedGrads *tied;
	int ntied;
} GradSync;

typedef struct Graph {
	Arena *arena;
	PlanSpec *ps;
	Value *vals;
	int nvals, capvals;
	Op *ops;
	int nops, capops;
	Op *spare_ops;   /* the op list before the last rewrite: the next rewrite's (graph_set_ops) */
	int capspare;
	int loss;        /* value id of the scalar loss */
	int nlayers;     /* iterations of the model's top-level repeat */
	int nfwd;        /* ops [0, nfwd) are the forward pass (set by autodiff) */
	bool has_moe;
	int nstages;     /* pipeline stages (1 without pipeline) */
	int *layer_stage; /* layer -> stage */
	int *layer_chunk; /* layer -> virtual chunk on its stage */
	Schedule *sched;
	ZeroSharding zero; /* zero.c */
	GradSync sync;     /* sync.c */
	/* shard.c: the ring axis's blocks are causally load-balanced (a causal ring attention, not
	 * `ring_attention(contiguous)`): every dim split over the ring axis holds two chunks of 2 |axis|,
	 * rank c the chunks c and 2 |axis| - 1 - c (Megatron-Core's layout; lower.c's block_mirrored) */
	bool ring_mirrored;
	/* the decode graph (decode.c): the next token's logits, the position input, the cache rows */
	bool decode;
	int logits, position;
	long long context;
} Graph;

Graph *graph_build(PlanSpec *ps); /* elaborate the model; NULL after reporting errors */
int graph_add_value(Graph *g, DType t, int rank, const long long *dim, const char *const *names);
int graph_add_op(Graph *g, OpKind k, int nin, const int *in, int nout, const int *out);
void op_clear(Op *op); /* zero an op outside the graph, with every "none" index set to -1 */
/* An op a pass inserts for another (a collective before its consumer) takes over where and when
 * that one runs: layer, stage, phase, the op it differentiates, and its source location. */
void op_inherit(Op *op, const Op *from);
/* A pass that rewrites the op list builds a new one and installs it with graph_set_ops, which
 * renumbers every value's producing op. Two lists take turns: the one a rewrite replaces holds
 * the next rewrite, so the passes do not each leave a copy of the model's ops behind. */
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
/* attention.c: scaled scores, mask, softmax, dropout and `@ v` (GQA's repeat_kv folded in) become
 * one OP_ATTENTION, unless the plan says `attention unfused` */
bool fuse_attention(Graph *g);
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
 * bubble, and the makespan and the busiest stage's own time when asked. speed (NULL: every stage
 * runs at its cost): speed[k] is how much faster than its cost an action runs while k stages
 * compute (ranks sharing cores: explain_stage_speeds). */
double pipeline_simulate(const Graph *g, const double *fcost, const double *bcost, double xfer, const double *speed,
			 double *makespan, double *busiest);
/* The same simulation's timeline: start and end[s * 2n + k] are when stage s starts and finishes
 * action k of its schedule table (n = micro-batches x chunks). */
void pipeline_timeline(const Graph *g, const double *fcost, const double *bcost, double xfer, const double *speed,
		       double *start, double *end);
/* decode.c: the model's decode graph for generation, one token per step with a key/value cache
 * (NULL after reporting why the model cannot generate) */
Graph *decode_graph(PlanSpec *ps, const Graph *train);
bool zero(Graph *g);         /* zero.c: ZeRO state sharding and offload placement */
bool sync_grads(Graph *g);   /* sync.c: gradient buckets, compression, local SGD, async */
/* sync.c: what compression sends for a gradient block of rows x cols elements (cols: the last dim,
 * 1 for a vector): top-k's entries kept, and whether PowerSGD factors it (then P is rows x r and
 * Q is cols x r) */
long long topk_entries(const PlanSpec *ps, long long elems);
bool powersgd_factors(const PlanSpec *ps, long long rows, long long cols);

#endif
