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
 * The kernel table (kernel_table.h) says what each kind is: its name, class, planrt functions and
 * ordered, named, typed parameters. */
#include "lower/kernel_table.h"

typedef enum {
#define X(kind, text, cls, fn, dev, params) K_##kind,
#define Y(kind, text, cls) K_##kind,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
	K_COUNT
} KernelKind;

/* KC_COMM kernels start communication (their Comm list says what); KC_WAIT kernels complete or
 * progress it; KC_OPAQUE is a graph op the C target has no kernel for yet (MoE routing, async
 * transfers): it keeps the program complete for the check and explain, and planc build refuses it. */
typedef enum { KC_LOOP, KC_COMPUTE, KC_COMM, KC_WAIT, KC_IO, KC_SETUP, KC_OPAQUE } KernelClass;
extern const char *const kernel_names[K_COUNT];
extern const char *const kernel_functions[K_COUNT]; /* the CPU function (NULL: none) */
extern const KernelClass kernel_classes[K_COUNT];

/* A kernel parameter's type (kernel_table.h's KPARAM_TYPES). */
typedef enum {
#define T(type, abi) KPT_##type,
	KPARAM_TYPES(T)
#undef T
	KPT_COUNT
} KParamType;
extern const char *const kparam_type_names[KPT_COUNT];
/* how a parameter of each type is passed (the LLVM back end's call types) */
typedef enum { KABI_I32, KABI_I64, KABI_F64, KABI_PTR } KParamAbi;
extern const KParamAbi kparam_abis[KPT_COUNT];
typedef struct KernelParam {
	KParamType type;
	const char *name;
} KernelParam;
/* kernel_params[kind][0 .. kernel_nparams[kind]): the planrt function's parameters in order;
 * OPAQUE kernels take their op's buffers, any number (kernel_nparams -1) */
extern const KernelParam *const kernel_params[K_COUNT];
extern const int kernel_nparams[K_COUNT];
/* What the CUDA target does with a kind: call its device function, nothing (NCCL progresses its
 * operations on their own stream), or run it on the host only. */
typedef enum { KDEV_CALL, KDEV_NO_OP, KDEV_HOST_ONLY } DeviceMode;
typedef struct DeviceCall {
	DeviceMode mode;
	const char *function; /* KDEV_CALL: the planrt_cuda function */
} DeviceCall;
extern const DeviceCall kernel_device[K_COUNT];

/* Named argument access: KARG(k, MATMUL, A) is kernel k's argument A (k must be a K_MATMUL with
 * its arguments built); KARG_INDEX(MATMUL, A) its position. Each kind's parameters are the char
 * fields of struct kernel_args_<KIND>, so a field's offset is its position. */
#define X(kind, text, cls, fn, dev, params) struct kernel_args_##kind { params char count_; };
#define Y(kind, text, cls) struct kernel_args_##kind { char count_; };
#define KP(type, name) char name;
KERNEL_TABLE(X, Y)
#undef X
#undef Y
#undef KP
#define KARG_INDEX(KIND, name) ((int)offsetof(struct kernel_args_##KIND, name))
#define KARG(k, KIND, name) kernel_arg((k), K_##KIND, KARG_INDEX(KIND, name))

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
/* a transient place (arena, slot or inbox: memplan places it at an offset of its region) */
static inline bool buf_class_transient(BufClass c)
{
	return c == BUF_ARENA || c == BUF_SLOT || c == BUF_INBOX;
}
/* SC_OFFLOAD: the host staging of an offloaded optimizer (state.c: gradient and parameter copies,
 * the disk records' read slots) */
typedef enum { SC_PARAM, SC_GRAD, SC_OPTIM, SC_MASTER, SC_BUFFER, SC_METRIC, SC_OFFLOAD, SC_COUNT } StateKind;
extern const char *const state_kind_names[SC_COUNT];
/* The tensors a checkpoint piece can be (planrt_ckpt_write's kind, PLANRT_CKPT_*): a parameter in
 * its storage dtype, its f32 master weights, Adam's moments, SGD's momentum; CKPT_COPY or'ed in
 * when the source is transient (its bytes are copied at the call). */
typedef enum { CKPT_PARAM, CKPT_MASTER, CKPT_EXP_AVG, CKPT_EXP_AVG_SQ, CKPT_MOMENTUM } CkptKind;
enum { CKPT_COPY = 0x100 };

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
	int peer;           /* p2p: the peer's coordinate on axis; PEER_RING_NEXT / PEER_RING_PREV: a ring
			     * shift's (ring.c), the next / previous coordinate on axis, wrapping around */
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

enum { PEER_RING_NEXT = -2, PEER_RING_PREV = -3 };

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
	KA_OFFSET,   /* a buffer's block offset on dim `dim` (i = 1: where its second half starts, the list's
		      * entry rank + dim); all dims as a list when dim < 0 */
	KA_SCALAR,   /* f times the first element of a buffer */
	KA_PARAM,    /* i: index in the program's parameter table */
	KA_CTX,      /* the phase's context */
	KA_STEP,     /* the step being trained (0-based) */
	KA_STEP_SEED,/* this step's dropout key */
	KA_STR,      /* str: a string constant (for messages) */
} KArgKind;
/* A kernel's argument: what it is (kind) and the fields that kind reads. The three pointers are
 * one (a kind reads at most one of them) and the fields are ordered to pack: 56 bytes, not 80. A
 * 1T-parameter program has half a million arguments, and their memory was the largest share of
 * the arena, whose first touch is most of what compiling such a plan costs. */
typedef struct KArg {
	KArgKind kind;
	int buf;              /* KA_BUF, KA_OFFSET, KA_SCALAR */
	long long i;          /* KA_INT, KA_DTYPE, KA_AXIS, KA_PAIR, KA_REQ, KA_SLOTREQ, KA_PARAM; KA_COORD base;
			       * KA_OFFSET on one dim: 1 for its second half */
	double f;             /* KA_F64, KA_SCALAR factor */
	long long stride;     /* KA_COORD */
	int axis;             /* KA_COORD */
	int dim;              /* KA_OFFSET */
	union {
		const long long *ints; /* KA_INTS */
		const int *bufs;       /* KA_BUFS */
		const char *str;       /* KA_STR */
	};
	int n;                /* KA_INTS, KA_BUFS: length */
	bool i32;             /* KA_INTS: an int array */
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
	int bucket;             /* state.c: the gradient bucket it reduces (g->sync.buckets), or -1 */
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
	int name_base;          /* added to a new buffer's index in its name: compaction renumbers the
				 * buffers, and a name must not repeat one a value buffer has */
	int arg_hint[K_COUNT];  /* the most arguments a kernel of each kind has had (lower.c's next_arg) */
	Handle *handles;
	int nhandles, caphandles;
	int nslotreqs;          /* p2p requests one slot's actions use */
	int loss_metric;        /* buffer: the step's mean loss (f64) */
	/* where the loss is a cross-entropy's (a classification): the buffer counting the rows whose
	 * target has the largest logit (f64; -1: none), and the rows of a batch (accuracy_rows) */
	int accuracy_metric;
	long long accuracy_rows;
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
	InitKind init_kind;
	double init_a, init_b;
	bool saved;             /* false for a tied copy (the original is written) and a computed buffer */
} ParamEntry;

/* state.c: ZeRO, gradient synchronisation and offload as the programs run them (from zero.c's and
 * sync.c's annotations of the graph). The passes after state, the targets and explain read these,
 * never the plan's settings. */
typedef struct StateRecord {
	ZeroSharding zero;      /* the sharding the state is laid out by (stage 0: none) */
	SyncMode sync;          /* the plan's strategy (the program descriptor's) */
	int sync_axis;          /* the axis the batch is split over, or -1 */
	bool local_sgd, async;  /* in effect: the batch axis has replicas */
	bool compress;          /* the batch axis's buckets are compressed */
	bool error_feedback;    /* ... with residuals (optimizer-side state) */
	bool overlap;           /* buckets start during the backward (overlap.c) */
	OffloadPlace offload_optimizer, offload_params, offload_activations;
} StateRecord;

struct Lowered {
	Graph *g;
	PlanSpec *ps;
	StateRecord state;      /* state.c */
	LProg **progs;          /* [stage * nroles + role index] */
	int nprogs, nroles;
	ParamEntry *params;
	int nparams;
	int npairs;             /* tied-parameter pair groups on the pipe axis */
	int pair_a[64], pair_b[64];
	long long seq, vocab;   /* the token data: window length and vocabulary */
	int *stage_first, *stage_op; /* the ops on stage s: stage_op[stage_first[s] .. stage_first[s + 1]) */
	/* generation (planc build --generate): the training program's decode program, printed beside
	 * it (decode.c) and run by --generate; NULL without */
	const Lowered *decode;
};

/* lower.c: whether buffer b's block on dim d is two mirrored chunks of the causally balanced ring
 * (Graph.ring_mirrored): the chunks coord and 2 |axis| - 1 - coord of 2 |axis|. A block offset list
 * (KA_OFFSET, dim < 0) has 2 x rank entries: where each dim's first half starts, then where its
 * second half (local rows ldims / 2 on) starts; they differ from one block only on such a dim. */
bool block_mirrored(const Lowered *low, const Buffer *b, int d);
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
void karg_copy(LProg *p, Kernel *k, const KArg *a); /* another kernel's argument (not a buffer's: no use or def) */
void kernel_use(LProg *p, Kernel *k, int b);
void kernel_def(LProg *p, Kernel *k, int b);
Comm *kernel_comm(LProg *p, Kernel *k);
/* kernels.c: argument index of kernel k, which must be of this kind (KARG names it) */
/* a GEMM (K_MATMUL, K_MATMUL_BF16) and its floating-point operations, 2 x batch x M x N x K (0 for
 * any other kernel) */
bool kernel_is_gemm(const Kernel *k);
double kernel_gemm_flops(const Kernel *k);
/* a GEMM kernel's operands' bytes, A (M x K), B (K x N) and C (M x N) once each per product, at
 * the kernel's storage size (f32: 4 bytes; the 16-bit kinds: 2); 0 for any other kernel */
double kernel_gemm_operand_bytes(const Kernel *k);
KArg *kernel_arg(const Kernel *k, KernelKind kind, int index);
/* kernels.c: whether argument a may fill parameter index of kind (the builders and verify.c ask) */
bool karg_fits(KernelKind kind, int index, const KArg *a);
const char *karg_kind_name(KArgKind kind); /* for messages */
/* kernels.c: the position of a kind's `storage` parameter, the 16-bit type in which its IN and OUT
 * buffers are stored (the 16-bit variants: lower.c's lower_conversions), or -1 */
int kernel_storage_param(KernelKind kind);
/* kernels.c: the position of a 16-bit variant's `acc` parameter, the type its ACC buffers (gradients
 * summed over rows) are stored in: f32, or the storage type (read, summed in f32, rounded once), or -1 */
int kernel_acc_param(KernelKind kind);
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

/* ring.c, right after lower: every fused attention kernel (and gradient) whose K/V are split over
 * the plan's ring axis like its queries (context parallelism) replaced by the ring over that axis */
bool plan_ring(Lowered *low);
/* state.c, overlap.c, memplan.c: the back-end passes after lower, on every program */
bool plan_state(Lowered *low);
/* descriptor.c: the program descriptor's scalar fields (planrt_program_t, in its field order),
 * computed once for every target to print */
typedef struct ProgramDesc {
	const char *plan, *model, *source;
	int world, naxes, pipe_axis; /* pipe_axis, role_axis: -1 none */
	int nstages, nparams;
	int micro_batches;
	long long batch, seq, vocab;
	double lr, min_lr;
	int warmup, total_steps;
	int nroles, role_axis;      /* async: masters and workers on the batch axis */
	unsigned ring_axes;         /* bit a: ring attention's shifts run on axis a (ring.c) */
	const char *fingerprint;    /* "fnv1a64:<16 hex digits>", a hash of the whole lowered program */
	const char *sync;           /* "strict", "local_sgd", "async" */
	double loss_scale;
	const char *optimizer;      /* "adamw(lr = 0.0003, ...)", as the checkpoint records it */
} ProgramDesc;
ProgramDesc program_desc(const Lowered *low, const char *source_path);
bool plan_overlap(Lowered *low);
/* offload_params.c: under `offload params -> host`, each ZeRO-3 gather reads a device copy of its
 * host-placed chunk */
bool plan_offload_params(Lowered *low);
/* offload_activations.c: under `offload activations -> host`, saved activations go to the host in
 * the forward and come back in the backward */
bool plan_offload_activations(Lowered *low);
/* inplace.c: an elementwise kernel's output over an input that dies at it (the cross-entropy's
 * gradient over its logits) */
bool plan_inplace(Lowered *low);
bool memplan(Lowered *low);
int memplan_slots(LProg *p);   /* memplan.c: the slots the stage's schedule needs (micro-batches in flight) */
/* streams.c: the device schedule, after memplan: each kernel's stream (compute, communication,
 * copy, host, a pipeline channel's), the events it waits for within its phase call, and the joins
 * that end the call. stream_dump prints it (--dump-after=streams). */
typedef enum { STREAM_COMPUTE, STREAM_COMM, STREAM_COPY, STREAM_HOST, STREAM_P2P } StreamKind;
bool plan_streams(Lowered *low);
const char *stream_name(int stream, char *buf, size_t n);
void streams_dump(FILE *out, const LProg *p);
/* layer_runs.c: the runs of identical layers in a finished program, which a loop target would
 * print once each (issue 21; an analysis: it changes nothing). --dump-after=layers prints them. */
typedef struct LayerRun {
	Phase phase;
	int chunk;
	int first;       /* the first layer's first kernel */
	int body;        /* kernels per layer */
	int first_layer; /* the first layer's number, then first_layer + step, ... */
	int step;        /* 1: ascending (forward), -1: descending (backward) */
	int nlayers;
	int tables;      /* arguments that differ by layer only in a parameter index or a message */
} LayerRun;
int layer_runs(const LProg *p, LayerRun *runs, int cap); /* the count; at most cap written */
/* run r's kernels in order, layer after layer: its phase's kernels from r->first on */
int *layer_run_kernels(const LProg *p, const LayerRun *r, Arena *a);
void layer_runs_dump(FILE *out, const Lowered *low);
/* layer_values.c: what a value that may differ by layer is in a run (its n layers' values, each a
 * buffer of the stage, an integer or a text; equal texts, else equal buffers and integers, are
 * the same value), computed once per value by each loop target; and a stage's state families
 * (arrays of per-layer state pointers that loops index as at + dir * l). */
typedef enum { LV_SAME, LV_PLACE, LV_VIEW, LV_INT_STEP, LV_STATE, LV_TABLE } LayerValueKind;
typedef struct LayerValue {
	int buf;          /* the buffer, or -1 */
	bool integer;     /* an integer: value */
	long long value;
	const char *text; /* how the target names it (NULL: by buf and value) */
} LayerValue;
typedef struct LayerClass {
	LayerValueKind kind;
	long long step; /* LV_PLACE, LV_VIEW: bytes a layer (LV_PLACE 0: one place); LV_INT_STEP: added a layer */
} LayerClass;
LayerClass layer_value_class(const LProg *p, const LayerValue *v, int n);
typedef struct LayerFamilies {
	int n, cap;
	int **members;           /* [family]: its buffers in layer order */
	int *size;               /* [family] */
	int *family_of, *family_at; /* [buffer]: its family and place there, or -1 */
	bool fixed;              /* no more families are made */
} LayerFamilies;
void layer_families_init(LayerFamilies *fs, const LProg *p);
void layer_families_free(LayerFamilies *fs);
/* The family whose entries at + dir * t are bufs[t] (a run's n layers' LV_STATE buffers; down: the
 * run walks the layers downwards), made if none of them is in one and fs is not fixed; -1: none. */
int layer_family(LayerFamilies *fs, const int *bufs, int n, bool down, int *at, int *dir);
/* verify.c: checks the IR's invariants (arguments, buffers, phases, liveness and placement after
 * memplan); reports and returns false on the first broken one (an internal error in planc). */
bool verify_ir(const Lowered *low, const char *after_pass);
/* Whether planc build can run it; reports the first reason when report. */
bool lowered_executable(const Lowered *low, bool report);
bool lowered_executable_on(const Lowered *low, bool report, bool device); /* device: the CUDA target's rules */

/* schedule.c: the collective-sequence check, on the kernels of every stage program */
bool check_collectives(const Lowered *low);

#endif
