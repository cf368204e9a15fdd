/* planrt_program.h: the one entry point of a generated program, and the descriptor it passes.
 *
 * A program planc generates holds only tables, stage functions and the schedule; everything that
 * is the same for every program (argument parsing and --help, the world-size check, allocation of
 * the persistent state and of the arena, --init / --save orchestration, the data file, the step
 * loop that walks the schedule table, progress, metrics, the memory canary) lives here, behind
 * planrt_main(argc, argv, &PROGRAM).
 *
 * A rank runs the stage its pipeline coordinate names (stage 0 without a pipeline). Each stage has
 * phase functions, each the printed loop-level IR of one phase:
 *   init        once, before the first step: parameters (drawn or read from --init), master
 *               weights, the ZeRO gathers that make full parameters
 *   step_begin  at the start of every step: zero gradient accumulators and metrics
 *   prepare_forward[c], prepare_backward[c]
 *               post the nonblocking receives a forward / backward of chunk c needs (called one
 *               action ahead, so transfers overlap the previous action's compute)
 *   forward[c], backward[c]
 *               one micro-batch of model chunk c (c = 0 unless the schedule is interleaved)
 *   step_end    gradient synchronisation, clipping, the optimizer, master-weight casts, ZeRO
 *               gathers, and the loss / gradient-norm reductions into the metric buffers
 *   save        writes this rank's pieces of every parameter into --save
 * The stage's action table (F / B of a micro-batch and chunk, and the activation slot it uses) is
 * the compiler's schedule; the walker calls prepare for action i + 1, then runs action i.
 *
 * Under `sync async` a stage has two programs, one per role (stages[stage * nroles + role]): role
 * 0, the master, runs on the rank with coordinate 0 on role_axis, role 1 on the workers. */
#ifndef PLANRT_PROGRAM_H
#define PLANRT_PROGRAM_H

#include <stddef.h>

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one call of a phase function sees. Buffers of the generated program are named views of
 * these bases (#define x ((float *)(ctx->slot + 4096))) or of the persistent state pointers. */
typedef struct planrt_ctx {
	int64_t step;            /* 0-based step being trained */
	uint64_t seed;           /* --seed (initialisation, data order, dropout) */
	uint64_t step_seed;      /* this step's dropout key: seed * 0x9E3779B97F4A7C15 + step */
	int micro;               /* micro-batch of the running action (0 in init / step phases) */
	int chunk;               /* model chunk of the running action */
	unsigned char *arena;    /* the transient region (base of the whole arena) */
	unsigned char *slot;     /* the activation slot of the running action */
	unsigned char *inbox;    /* its receive inbox (forward inputs from the previous stage) */
	planrt_request_t *reqs;  /* its slot's p2p requests (nreqs of them) */
	planrt_data_t data;      /* --data */
	planrt_st_t init_file;   /* --init, or NULL: draw parameters from the seed */
	struct planrt_save *save_file; /* during save: the checkpoint being written */
	double wait_s;           /* seconds this rank spent waiting for p2p receives (bubble bench) */
	int64_t steps;           /* --steps: the run's last step is steps - 1 */
	struct planrt_ckpt *ckpt;/* during checkpoint and resume: the sharded checkpoint written or read */
	int64_t eval_batch;      /* during an evaluation: the held-out batch (-1: training) */
	double loss_scale;       /* fp16 loss scaling: the backward starts from loss * loss_scale (else 1) */
	int step_skipped;        /* set when this step's unscaled gradients are not finite: no update */
	int64_t slot_index;      /* the running action's slot (offload activations: its host copies) */
	const struct planrt_program *program; /* the program being run (its parameter table, sizes) */
	/* generation (--generate, driver/generate.c): the token and position the decode step reads,
	 * and where it leaves the next token's logits (decode_vocab of them) */
	int32_t decode_token, decode_position;
	float *decode_logits;
	int64_t decode_vocab;
	struct planrt_namemap *name_map;      /* --map: --init and --save under another framework's names */
} planrt_ctx_t;

typedef void (*planrt_phase_fn)(planrt_ctx_t *ctx);

typedef enum { PLANRT_FORWARD = 0, PLANRT_BACKWARD = 1 } planrt_act_kind_t;
enum { PLANRT_NO_INBOX = 0xffff };
typedef struct planrt_action {
	uint8_t kind;    /* planrt_act_kind_t */
	uint8_t chunk;
	uint16_t slot;   /* activation slot (and request set) of this micro-batch and chunk */
	uint16_t inbox;  /* receive inbox, or PLANRT_NO_INBOX when the action receives nothing ahead */
	uint32_t micro;
} planrt_action_t;
/* A row of a stage's schedule as the generated tables print it, one a line:
 * PLANRT_F(chunk, slot, inbox, micro) runs a forward, PLANRT_B(...) a backward. */
#define PLANRT_F(c, s, i, m) {.kind = PLANRT_FORWARD, .chunk = (c), .slot = (s), .inbox = (i), .micro = (m)}
#define PLANRT_B(c, s, i, m) {.kind = PLANRT_BACKWARD, .chunk = (c), .slot = (s), .inbox = (i), .micro = (m)}
/* "no mesh axis" wherever an axis is asked for (a parameter dim no axis splits, a piece no ZeRO
 * axis shards) */
enum { PLANRT_NO_AXIS = -1 };

/* Persistent state: each buffer is allocated once (zeroed, 64-byte aligned), counted by kind; planc
 * explain's category lines are the sums of these. */
typedef enum {
	planrt_state_param = 0,  /* parameters (full, or this rank's ZeRO shard) */
	planrt_state_grad,       /* gradient accumulators or ZeRO gradient shards */
	planrt_state_optim,      /* optimizer moments */
	planrt_state_master,     /* f32 master weights of lower-precision parameters */
	planrt_state_buffer,     /* named runtime buffers explain lists (e.g. an overlapped bucket) */
	planrt_state_metric,     /* per-step scalars (loss, gradient norm, clip coefficient) */
	planrt_state_offload,    /* an offloaded optimizer's host staging (grad and parameter copies, disk records) */
	planrt_state_kinds
} planrt_state_kind_t;
typedef struct planrt_state_buf {
	const char *name;
	uint8_t kind;            /* planrt_state_kind_t */
	size_t bytes;
	void **ptr;              /* the generated program's pointer to set */
} planrt_state_buf_t;
/* A state family: one buffer a layer of one kind and size (a parameter, its gradient, moments or
 * master weights in every layer of a run), whose pointers are the program's first[m * stride] for
 * m in 0 .. count: first is ptrs, or where ptrs is NULL the pointer at byte offset in the stage's
 * per-layer array (planrt_stage_t.layers: the C target's families are the fields of a per-layer
 * struct, stride pointers apart, so that stages whose families are alike share one table).
 * stride 0 or 1: a packed array of pointers. planrt allocates each member as a state buffer of its
 * own. */
typedef struct planrt_state_family {
	const char *name;
	uint8_t kind;            /* planrt_state_kind_t */
	size_t bytes;            /* of each member */
	void **ptrs;
	int count;
	int stride;
	size_t offset;
} planrt_state_family_t;

/* A parameter of the model, for --init, --save and initialisation: global and local (this rank's
 * tensor-parallel block) shapes and the mesh axis that splits each dim (-1: not split). Element
 * index i of the local block is its row-major index. Tied copies on a second pipeline stage have
 * saved = 0 (the original is written). */
/* How a parameter starts: drawn normal(a = mean, b = std) or uniform(a, b), zeros, ones; buffers
 * also arange, rope_cos(a = theta), rope_sin(a) (computed, never read from --init) and load
 * (--init only). */
typedef enum {
	PLANRT_INIT_NORMAL = 0, PLANRT_INIT_UNIFORM, PLANRT_INIT_ZEROS, PLANRT_INIT_ONES, PLANRT_INIT_ARANGE,
	PLANRT_INIT_ROPE_COS, PLANRT_INIT_ROPE_SIN, PLANRT_INIT_LOAD
} planrt_init_kind_t;
typedef struct planrt_param {
	const char *name;
	int rank;
	int64_t gdims[8], ldims[8];
	int8_t split_axis[8];
	uint8_t init_kind;       /* planrt_init_kind_t */
	uint8_t saved;
	double a, b;
} planrt_param_t;

typedef struct planrt_stage {
	planrt_phase_fn init, step_begin, step_end, save;
	int nchunks;
	const planrt_phase_fn *forward, *backward;                 /* [nchunks] */
	const planrt_phase_fn *prepare_forward, *prepare_backward; /* [nchunks] */
	const planrt_action_t *actions;
	int nactions;
	/* the arena: one allocation of arena_bytes = transient region, then nslots slots of
	 * slot_bytes at slot_offset, then ninbox inboxes of inbox_bytes at inbox_offset */
	size_t arena_bytes, slot_offset, slot_bytes, inbox_offset, inbox_bytes;
	int nslots, ninbox, nreqs;
	const planrt_state_buf_t *state;
	int nstate;
	/* metric buffers (doubles in the state): set by step_end on every rank of the stage */
	double *const *loss;      /* the step's mean loss (every stage, after the pipe reduction) */
	double *const *grad_norm; /* the global gradient norm before clipping */
	/* local SGD: loss holds loss_window steps, step s at s % loss_window, known once the step that
	 * averages (every loss_window-th, and the last) has run; 0: the step's loss, known at once */
	int loss_window;
	/* the async master: the parameter version every rank of the role axis computed the step on */
	double *const *versions;
	int nversions;
	/* sharded checkpoints (--save-every, --resume): checkpoint writes this rank's pieces of every
	 * parameter, optimizer state and master weight (and its rank-local state) into ctx->ckpt;
	 * resume reads them back, from a checkpoint of this plan or of another plan of the model */
	planrt_phase_fn checkpoint, resume;
	/* evaluation (--eval-every): eval_begin clears the loss metric, the walker runs the forward
	 * actions on a held-out batch, eval_end reduces the loss into *eval_loss on every rank (NULL
	 * functions: the stage cannot evaluate, an async plan), and, where the loss is a
	 * cross-entropy, the fraction of the batch's rows whose target class has the largest logit
	 * into *eval_accuracy (NULL: the loss is not a classification) */
	planrt_phase_fn eval_begin, eval_end;
	double *const *eval_loss;
	double *const *eval_accuracy;
	/* the state families, beside state (a loop over layers indexes their arrays), and the array
	 * of per-layer structs those without ptrs are fields of */
	const planrt_state_family_t *families;
	int nfamilies;
	void *layers;
} planrt_stage_t;

typedef struct planrt_program {
	const char *plan, *model, *source; /* for messages and --help */
	int world, naxes, pipe_axis;       /* pipe_axis -1: no pipeline */
	const int *axis_sizes;
	const char *const *axis_names;
	int nstages;
	const planrt_stage_t *stages;
	const planrt_param_t *params;
	int nparams;
	int micro_batches;
	int64_t batch, seq, vocab;         /* data: step batch, window length, vocabulary */
	/* the learning-rate schedule, for the log's lr column (the optimizer kernels take it too) */
	double lr, min_lr;
	int64_t warmup, total_steps;
	int nroles;                        /* 0 or 1: one program per stage; 2: async master and workers */
	int role_axis;                     /* the axis whose coordinate 0 is the master */
	/* a hash of the whole lowered program (planc): a checkpoint resumes bit for bit under a
	 * program with the same fingerprint; under another it is resharded */
	const char *fingerprint;
	const char *sync;                  /* "strict", "local_sgd" or "async" (checkpoints) */
	double loss_scale;                 /* fp16 loss scaling: 0 none, -1 dynamic, > 0 static */
	/* the optimizer and its settings, "adamw(lr = 0.0003, betas = (0.9, 0.95), ...)": a checkpoint
	 * records it, and resuming under another kind of optimizer is refused */
	const char *optimizer;
	/* the model's decode program (planc build --generate; NULL without): one token per step with a
	 * key/value cache, run by --generate (docs/generate.md) */
	const struct planrt_program *decode;
	/* bit a set: ring attention shifts its K/V blocks around axis a (context parallelism); the CUDA
	 * target gives those point-to-point messages channels of their own, as the pipeline's (0: none,
	 * so a descriptor that leaves it out has no ring) */
	unsigned ring_axes;
} planrt_program_t;

/* Runs the program: parses argv (--steps K --data FILE [--init W] [--save W] [--log F] [--seed S]
 * [--help]), checks the world size against the plan, trains, and returns the process exit status
 * (after planrt_finalize). Every failure is a one-line cause on every rank and a non-zero exit. */
int planrt_main(int argc, char **argv, const planrt_program_t *program);

/* ------------------------------------------------------------------ kernels the IR calls
 * Initialisation and checkpoints address a parameter's local block by element: the buffer's
 * element j holds local element lo + j, for j in [0, n); positions whose lo + j falls outside
 * [0, local elements) are padding or belong to another parameter of the same shard (init
 * leaves them as they are, save skips them). lo and n may depend on the rank's coordinate on a
 * ZeRO axis (shards). */
void planrt_init_param(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int64_t lo, int64_t n);
/* Writes this rank's piece into the open checkpoint. shard_axis >= 0: the piece is this rank's
 * ZeRO shard over that axis (every coordinate writes its own); otherwise only the rank with
 * coordinate 0 on every axis that does not split the parameter writes. */
/* fp16 loss scaling. planrt_loss_seed writes d loss / d loss = ctx->loss_scale * per_micro (the
 * backward's seed). planrt_unscale_clip_coef is planrt_clip_coef on gradients scaled by
 * ctx->loss_scale: *norm is the unscaled norm and *coef folds 1 / loss_scale into the clipping
 * coefficient; a norm that is not finite (some gradient overflowed on some rank: sumsq is reduced
 * over every axis) sets ctx->step_skipped and *coef to NaN, and planrt_optimizer_step then leaves
 * parameters and moments alone. planrt_steps_skipped_ (kept by the run) is subtracted from the
 * step for the optimizer's t, so a skipped step does not advance Adam's bias correction. */
void planrt_loss_seed(planrt_ctx_t *ctx, float *dl, double per_micro);
/* Generation's kernels (a decode program's step): the token (position = 0) or its position
 * (position = 1) into dst; the next token's logits into ctx->decode_logits; decode attention as
 * planrt_k_decode_attention_f32, a position outside the cache a run-time error. */
void planrt_decode_input(planrt_ctx_t *ctx, int32_t *dst, int position);
void planrt_decode_logits(planrt_ctx_t *ctx, const float *logits, int64_t vocab);
void planrt_decode_attention_f32(const float *q, const float *k, const float *v, float *kcache, float *vcache,
				 float *out, const int32_t *pos, int64_t batch, int64_t heads, int64_t kv_heads,
				 int64_t head_dim, int64_t tmax, double scale);
/* f16 elements of the fused loops (both back ends call these, as planrt_cast converts): exact
 * widening; narrowing rounds to nearest even, NaN stays NaN */
float planrt_f16_to_f32(uint16_t h);
uint16_t planrt_f32_to_f16(float x);
void planrt_unscale_clip_coef(planrt_ctx_t *ctx, const double *sumsq, double *norm, double *coef, double max_norm);
extern int64_t planrt_steps_skipped_;

void planrt_save_param(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
		       int shard_axis);
/* Sharded checkpoints (checkpoint.c; the checkpoint and resume phases). A piece is the part of a
 * logical tensor this rank holds: elements [lo, lo + n) of the parameter's local block as in
 * planrt_init_param, clipped the same way. kind names the tensor: PLANRT_CKPT_PARAM the
 * parameter (in its storage dtype), _MASTER its f32 master weights, _EXP_AVG / _EXP_AVG_SQ Adam's
 * moments, _MOMENTUM SGD's momentum buffer. Writes follow planrt_save_param's rule (replicas
 * skip; shard_axis >= 0: every coordinate writes its own shard); reads gather the piece from
 * whichever pieces of the checkpoint hold its elements, so any plan of the model reads any
 * plan's checkpoint. A rank-local buffer (error-feedback residuals, local SGD's per-replica
 * state) is written and read whole by its id, and only resumed under the same plan. */
enum { PLANRT_CKPT_PARAM = 0, PLANRT_CKPT_MASTER, PLANRT_CKPT_EXP_AVG, PLANRT_CKPT_EXP_AVG_SQ, PLANRT_CKPT_MOMENTUM,
       PLANRT_CKPT_KINDS };
/* or'ed into planrt_ckpt_write's kind: src is transient (a record slot of the offloaded optimizer,
 * a host copy of device memory), so the piece's bytes are copied now rather than read when the
 * checkpoint is written out at the end of the phase */
enum { PLANRT_CKPT_COPY = 0x100 };
void planrt_ckpt_write(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int kind, int64_t lo,
		       int64_t n, int shard_axis);
void planrt_ckpt_read(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int kind, int64_t lo, int64_t n);
void planrt_ckpt_write_local(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id);
/* the same with src transient: its bytes are copied now (the CUDA target's host copies) */
void planrt_ckpt_write_local_copy_(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id);
void planrt_ckpt_read_local(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int64_t n, int id);
/* tokens (stream 0: window[0, S)) or targets (stream 1: window[1, S]) of samples
 * [row_lo, row_lo + rows) of this step, positions [s_lo, s_lo + s_n) of each window */
void planrt_load_input(planrt_ctx_t *ctx, int32_t *dst, int stream, int64_t row_lo, int64_t rows, int64_t s_lo,
		       int64_t s_n);
/* input.c: frees what loading kept for the run (planrt_main, at the end) */
void planrt_input_release_(void);
/* Pipeline transfers on the pipe axis to / from the rank with pipe coordinate peer, on channel
 * (0: forward activations, 1: backward gradients; messages match in order within a channel). The
 * request is completed by planrt_p2p_finish, or by the walker before the slot is reused. */
void planrt_p2p_send_start(const void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req);
void planrt_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req);
void planrt_p2p_finish(planrt_ctx_t *ctx, planrt_request_t *req); /* waits (time counted in ctx->wait_s) */

/* ------------------------------------------------------------------ sync strategies (sync.c)
 * docs/sync.md describes the strategies. Every kernel is called on every step; those that act
 * less often decide from ctx->step and ctx->steps. */
/* *x *= f (a replica's clipping coefficient times the batch axis's size: its own mean gradient) */
void planrt_scale_metric(double *x, double f);
/* Local SGD, after the step's update: history[step % every] = *loss; then, when step + 1 is a
 * multiple of every or the step is the last, the sum over c of history (every f64) and the
 * average over c of flat (n elements of t, f32: the parameters or the master weights). With an
 * outer optimizer (1 SGD, 2 SGD with Nesterov momentum; anchor: the flat values at the last
 * average) the outer gradient anchor - average takes one step of it from anchor, which becomes the
 * new flat. params (dtype pt, or NULL): the parameters, cast from flat after an average. */
void planrt_local_average(planrt_ctx_t *ctx, int every, void *flat, int64_t n, planrt_dtype_t t, void *params,
			  planrt_dtype_t pt, const double *loss, double *history, planrt_comm_t c, int outer, double outer_lr,
			  double outer_momentum, float *anchor, float *momentum);
/* Async, on a worker (coordinate > 0 on c's axis; the master is coordinate 0): at step_begin,
 * receives the parameter versions that have arrived (each into inbox, then copied to params),
 * waiting while the newest is older than step - staleness; version v is the parameters after v
 * updates, and every version up to --steps is received once, in order. */
void planrt_async_pull(planrt_ctx_t *ctx, int staleness, void *params, void *inbox, int64_t n, planrt_dtype_t t,
		       planrt_comm_t c);
/* The worker's step end: grads (n of t), then *loss and the version it computed on (two f64),
 * sent to the master from slot step % (staleness + 1) of ring (each slot n + 16 / size(t) elements). */
void planrt_async_push(planrt_ctx_t *ctx, int staleness, const void *grads, int64_t n, planrt_dtype_t t, void *ring,
		       const double *loss, planrt_comm_t c);
/* After the worker's last step: completes its sends and receives the remaining versions. */
void planrt_async_drain(planrt_ctx_t *ctx, void *params, void *inbox, int64_t n, planrt_dtype_t t, planrt_comm_t c);
/* The master's step_begin: receives of this step's messages from workers 1..nworkers into inbox. */
void planrt_async_post(planrt_ctx_t *ctx, void *inbox, int64_t msg, planrt_dtype_t t, int nworkers, planrt_comm_t c);
/* The master, after its backward: adds each worker's gradient into grads (worker order, dtype t
 * rounded per addition) and its loss into *loss; versions[0] = step, versions[w] = worker w's
 * version, which must be at most staleness updates old (otherwise the run stops). */
void planrt_async_gather(planrt_ctx_t *ctx, int staleness, void *grads, int64_t n, planrt_dtype_t t,
			 const void *inbox, int nworkers, double *loss, double *versions);
/* The master, after its update: version step + 1 copied into slot (step + 1) % (staleness + 2) of
 * ring and sent to every worker; completes every send after the last step. */
void planrt_async_publish(planrt_ctx_t *ctx, int staleness, const void *params, int64_t n, planrt_dtype_t t, void *ring,
			  int nworkers, planrt_comm_t c);

/* ------------------------------------------------------------------ gradient compression (compress.c)
 * Each reduces a flat f32 gradient bucket over c and leaves there what the optimizer sees: the
 * sum over the ranks of what each sent, decompressed. residual (or NULL: no error feedback) holds
 * what compression dropped, added to the next step's gradient before compressing. */
/* Rounded to wire (bf16 or f16) and all-reduced (chunk 0; the f32 sum of the rounded values,
 * rounded once), or reduce-scattered (chunk > 0: this rank's chunk of n = size * chunk elements is
 * summed, the rest is unspecified). scratch: n elements of wire. */
void planrt_compress_cast(float *grad, int64_t n, planrt_dtype_t wire, float *residual, void *scratch, int64_t chunk,
			  planrt_comm_t c);
/* Top-k per segment (nseg tensors at off[i], len[i] elements, k[i] kept): the largest |values|
 * (ties: lower index first) as (f32 bits, index) i32 pairs, all-gathered; the bucket becomes the
 * sum of every rank's kept entries. scratch: 4 * (2 K (size + 1) + the segments' elements) bytes,
 * K the sum of k. */
void planrt_compress_topk(float *grad, int nseg, const int64_t *off, const int64_t *len, const int64_t *k,
			  float *residual, void *scratch, planrt_comm_t c);
/* PowerSGD (Vogels et al. 2019), one power iteration with the previous step's Q: a segment with
 * cols[i] > 0 is the matrix rows[i] x cols[i] M, P = M Q summed over c and orthonormalised,
 * Q = M^T P summed, M becomes P Q^T; segments with cols[i] == 0 are summed whole. The three
 * all-reduces run in that order (all P, all Q, the whole segments). q: every factored segment's Q
 * (cols x r, in order); scratch: the P factors and the whole segments, floats. */
void planrt_compress_powersgd(float *grad, int nseg, const int64_t *off, const int64_t *rows, const int64_t *cols,
			      int r, float *q, float *residual, float *scratch, planrt_comm_t c);
/* PowerSGD's first Q: n standard normal values from the seed, the same on every rank. */
void planrt_powersgd_init(planrt_ctx_t *ctx, float *q, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
