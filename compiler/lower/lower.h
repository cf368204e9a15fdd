/* lower.h: the loop-level IR, the whole per-rank program as kernels over buffers, and the
 * back-end passes on it (lower, state, overlap, offload, memplan, streams), its verifier and the
 * collective-sequence check (schedule.c). Targets print it; explain reads it. */
#ifndef PLANC_LOWER_H
#define PLANC_LOWER_H

#include "graph/graph.h"

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

/* The program of one pipeline stage and rank role. Its buffers [0, nvalbufs) hold graph values,
 * in increasing value order (lprog_value_buffer finds one); lowering and the later passes append
 * the buffers they make. */
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
	int nvalbufs;           /* buffers [0, nvalbufs) hold graph values (Buffer.value), by value */
	int arg_hint[K_COUNT];  /* the most arguments a kernel of each kind has had (lower.c's next_arg) */
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
	int *stage_first, *stage_op; /* the ops on stage s: stage_op[stage_first[s] .. stage_first[s + 1]) */
};

/* lower.c: the program of every stage and role, complete for the check and explain. */
Lowered *lower(Graph *g);
LProg *lowered_prog(const Lowered *low, int stage, int role); /* role: RANKROLE_* */
/* The graph ops on a stage in order: op->stage == stage, or a tied pair's op on either of its two
 * stages. A pass on one stage's program walks these (a superset of what it keeps), not the model's. */
const int *lowered_stage_ops(const Lowered *low, int stage, int *n);
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
int lprog_value_buffer(const LProg *p, int v); /* graph value v's buffer, or -1: not on this program */
/* the buffers a kernel names (arguments, reads, writes, a loop's output and loads): marked in seen,
 * or each replaced by f(ctx, buffer) (lists and expressions copied first) */
void kernel_buffers(const Kernel *k, bool *seen);
void kernel_map_buffers(LProg *p, Kernel *k, int (*f)(void *, int), void *ctx);
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

/* schedule.c: the collective-sequence check, on the kernels of every stage program */
bool check_collectives(const Lowered *low);

#endif
