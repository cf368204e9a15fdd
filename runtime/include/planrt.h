/* planrt.h: the planc runtime's public API, used by the C programs planc generates.
 *
 * Shaped like NCCL (docs/architecture.md, section 6): prefix planrt_, opaque handles, every fallible call returns
 * planrt_result_t and planrt_error_string() turns it into text; collectives take
 * (sendbuf, recvbuf, count, dtype, op, comm, stream, request) with one signature for every comm
 * layer (MPI on the host: stream NULL; NCCL on a device stream: the CUDA target's planrt_cuda) and
 * work in place when sendbuf == recvbuf. Settings come from PLANRT_* environment variables.
 *
 * Sections: results; world, mesh and communicators; collectives; arena; kernels (planrt_kernels.h);
 * initialisation RNG; data; optimizers; checkpoints (safetensors); metrics and progress. */
#ifndef PLANRT_H
#define PLANRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ results */
typedef enum {
	planrt_success = 0,
	planrt_system_error,     /* the OS or MPI failed */
	planrt_invalid_argument, /* a bad value passed by the caller */
	planrt_invalid_usage,    /* a call out of order (e.g. before planrt_init) */
	planrt_io_error,         /* a file could not be read or written */
	planrt_format_error,     /* a file is malformed (safetensors, token data) */
	planrt_timeout,          /* the watchdog fired */
	planrt_internal_error,
} planrt_result_t;

const char *planrt_error_string(planrt_result_t r);
/* The most recent error's detail (one line: cause and fix), thread-local; "" if none. */
const char *planrt_last_error(void);

/* Prints "planrt: rank R: <message>" on stderr and exits with status 1 on every rank
 * (MPI_Abort), so a failure on one rank never leaves the others hanging. */
void planrt_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Checks a result; on failure calls planrt_fatal with what and planrt_last_error(). */
#define PLANRT_CHECK(call) planrt_check_((call), #call, __FILE__, __LINE__)
void planrt_check_(planrt_result_t r, const char *what, const char *file, int line);

/* ------------------------------------------------------------------ world, mesh, communicators */
typedef enum { planrt_f32 = 0, planrt_bf16, planrt_f16, planrt_i32, planrt_u8, planrt_f64 } planrt_dtype_t;
typedef enum { planrt_sum = 0, planrt_max } planrt_op_t;
typedef struct planrt_comm *planrt_comm_t;
typedef struct planrt_request *planrt_request_t;
/* Where an operation is ordered: NULL, the calling host thread (the MPI layer); or a device stream
 * (the CUDA device layer's, a cudaStream_t), on which the NCCL layer enqueues it. */
typedef struct planrt_stream *planrt_stream_t;

size_t planrt_dtype_size(planrt_dtype_t t);

/* MPI_Init (thread level funneled), rank and world size. */
planrt_result_t planrt_init(int *argc, char ***argv, int *rank, int *world);
planrt_result_t planrt_finalize(void);

/* Declares the mesh (row-major over axes, the first axis slowest, as planc numbers ranks). Fails
 * with a one-line cause if the product differs from the world size. Creates one communicator per
 * axis from this rank's coordinates (MPI_Comm_split). */
planrt_result_t planrt_mesh_init(int naxes, const int *sizes, const char *const *names);
int planrt_mesh_coord(int axis);            /* this rank's coordinate on axis */
planrt_comm_t planrt_axis_comm(int axis);   /* the group along axis through this rank */
/* The two-member group {a, b} along axis through this rank's other coordinates (tied
 * parameters on two pipeline stages); NULL if this rank's coordinate is neither a nor b.
 * Collective over the whole world communicator: every rank calls it with the same a, b. */
planrt_result_t planrt_pair_comm(int axis, int a, int b, planrt_comm_t *out);
int planrt_comm_size(planrt_comm_t c);
int planrt_comm_rank(planrt_comm_t c);
/* Every rank (MPI_COMM_WORLD), valid between planrt_init and planrt_finalize. */
planrt_comm_t planrt_world_comm(void);

/* ------------------------------------------------------------------ collectives
 * NCCL's shape: every collective and point-to-point call takes a stream. With stream NULL the MPI
 * layer runs it on the host: blocking when req is NULL; otherwise started and completed by
 * planrt_wait (progress is made by planrt_test and planrt_wait, so gradient buckets overlap the
 * backward pass). With a device stream the device's comm layer (NCCL, registered by the CUDA
 * device layer) enqueues it there: done when the stream reaches it; *req, when given, is a request
 * whose planrt_wait makes the device's compute stream wait for it. bf16 / f16 sums accumulate in
 * f32 on the MPI layer. Counts are elements; both layers count wire bytes alike. */
planrt_result_t planrt_allreduce(const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t,
				 planrt_op_t op, planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req);
/* recvcount elements per rank; sendbuf holds size * recvcount, rank r keeps block r. */
planrt_result_t planrt_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, planrt_dtype_t t,
				      planrt_op_t op, planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req);
/* sendcount elements per rank; recvbuf gets size * sendcount, block r from rank r. */
planrt_result_t planrt_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, planrt_dtype_t t,
				 planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req);
/* count elements to and from each peer: block p of sendbuf goes to rank p. */
planrt_result_t planrt_alltoall(const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t,
				planrt_comm_t c, planrt_stream_t stream, planrt_request_t *req);
/* A variable all-to-all (MPI_Alltoallv), blocking: sendcounts[r] elements of t from sendbuf +
 * sdispls[r] to member r, recvcounts[r] from member r into recvbuf + rdispls[r]. Counted as
 * alltoallv: the bytes sent to the other members, exactly. */
planrt_result_t planrt_alltoallv(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls, void *recvbuf,
				 const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t, planrt_comm_t c);
/* The same on a device stream (stream NULL: planrt_alltoallv): enqueued there by the device's comm
 * layer (NCCL: a group of ncclSend / ncclRecv), done when the stream reaches it; counted alike. */
planrt_result_t planrt_alltoallv_on(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
				    void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t,
				    planrt_comm_t c, planrt_stream_t stream);
planrt_result_t planrt_broadcast(void *buf, size_t count, planrt_dtype_t t, int root, planrt_comm_t c,
				 planrt_stream_t stream, planrt_request_t *req);
planrt_result_t planrt_send(const void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
			    planrt_stream_t stream, planrt_request_t *req);
planrt_result_t planrt_recv(void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
			    planrt_stream_t stream, planrt_request_t *req);
/* Point-to-point with a tag (0 to MPI's MPI_TAG_UB, at least 32767; planrt_send and planrt_recv
 * use tag 0): messages between two ranks match in order within one tag (pipeline activations and
 * gradients travel on different tags). */
planrt_result_t planrt_send_tagged(const void *buf, size_t count, planrt_dtype_t t, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req);
planrt_result_t planrt_recv_tagged(void *buf, size_t count, planrt_dtype_t t, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req);
/* planrt_wait completes a request and frees it: call it exactly once per request, also after
 * planrt_test reported it done (*done = 1 means the results are in place). */
planrt_result_t planrt_wait(planrt_request_t req);
planrt_result_t planrt_test(planrt_request_t req, int *done);
/* Bytes this rank has sent through collectives and p2p since planrt_init (for tests and logs):
 * the sum of planrt_bytes_sent_by over every kind and group. */
uint64_t planrt_bytes_sent(void);
/* The same, per kind of operation and per group: a mesh axis index (the communicators of
 * planrt_mesh_init), PLANRT_GROUP_PAIR (the two-stage groups of planrt_pair_comm) or
 * PLANRT_GROUP_WORLD (every other communicator). Wire bytes as planc explain predicts them (the
 * formula is at the top of comm_mpi.c), rounded to whole bytes per call; calls counts the
 * operations started (a call refused for a bad argument counts nothing). 0 for a kind or group
 * out of range. */
typedef enum {
	planrt_coll_allreduce = 0, planrt_coll_reduce_scatter, planrt_coll_allgather, planrt_coll_alltoall,
	planrt_coll_broadcast, planrt_coll_send, planrt_coll_recv, planrt_coll_alltoallv, planrt_coll_kinds
} planrt_coll_t;
enum { PLANRT_GROUP_WORLD = -1, PLANRT_GROUP_PAIR = -2 };
uint64_t planrt_bytes_sent_by(planrt_coll_t kind, int group);
uint64_t planrt_calls_by(planrt_coll_t kind, int group);
const char *planrt_coll_name(planrt_coll_t kind); /* "allreduce", "reduce_scatter", ...; "?" if unknown */
/* Turns a stall into an error: if a blocking call or wait takes longer than seconds
 * (PLANRT_WATCHDOG, default 300; 0 = off), prints the pending operation on that rank and aborts. */
void planrt_watchdog_set(double seconds);

/* ------------------------------------------------------------------ arena
 * One allocation per rank holds every activation, gradient and temporary of the step at the
 * offsets planc planned; the high-water mark of touched bytes is reported for tests. */
planrt_result_t planrt_arena_create(size_t bytes, void **base);
void planrt_arena_destroy(void);
size_t planrt_peak_rss_bytes(void); /* getrusage maxrss */

/* ------------------------------------------------------------------ initialisation RNG (docs/architecture.md, contract 2)
 * A parameter element's initial value is a function of (seed, parameter name, global element
 * index) only: Philox-4x32-10 keyed by (seed, FNV-1a of the name), counter = the global index.
 * Fills a local block of a tensor whose global shape is gdims; the block starts at offs and has
 * shape ldims (row-major). kind: 0 normal(a = mean, b = std), 1 uniform(a, b), 2 zeros, 3 ones.
 * planrt_init_range fills elements [first, first + count) of that block (row-major) into dst[0..count):
 * a piece of a parameter (an offloaded record's, a bucket shard's) costs its own size, not the block's. */
void planrt_philox(uint64_t seed, uint64_t key, uint64_t counter, uint32_t out[4]);
uint64_t planrt_name_key(const char *name);
void planrt_init_block(float *dst, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
		       int kind, double a, double b, uint64_t seed, const char *name);
void planrt_init_range(float *dst, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
		       int64_t first, int64_t count, int kind, double a, double b, uint64_t seed, const char *name);

/* ------------------------------------------------------------------ data
 * Token data (docs/data.md: text, nanoGPT, llm.c, Megatron). planrt_data_open samples with
 * replacement (sample i of step t is the window of seq + 1 tokens starting at a position drawn
 * from (seed, t, i)); a run opens its data with planrt_data_open_run_ (epochs, blends, held-out
 * data). Step t's global batch is the same for every plan; a rank asks for its samples [lo, hi). */
typedef struct planrt_data *planrt_data_t;
planrt_result_t planrt_data_open(const char *path, int64_t vocab, int64_t seq, planrt_data_t *out);
planrt_result_t planrt_data_batch(planrt_data_t d, int64_t step, int64_t lo, int64_t hi, uint64_t seed,
				  int32_t *tokens, int32_t *targets); /* each [hi - lo, seq] */
int64_t planrt_data_tokens(planrt_data_t d);
void planrt_data_close(planrt_data_t d);

/* ------------------------------------------------------------------ optimizers (f32 state)
 * PyTorch semantics: SGD, SGD with momentum (dampening 0), Adam, AdamW (decoupled decay), both
 * with bias correction; step counts from 1. */
typedef enum { planrt_opt_sgd = 0, planrt_opt_momentum, planrt_opt_adam, planrt_opt_adamw } planrt_opt_kind_t;
typedef struct planrt_opt {
	planrt_opt_kind_t kind;
	double lr, beta1, beta2, eps, weight_decay, momentum;
} planrt_opt_t;
/* param and grad: n elements; m, v: state (NULL where the kind has none). lr is this step's. */
void planrt_opt_step(const planrt_opt_t *o, double lr, int64_t step, float *param, const float *grad, float *m,
		     float *v, size_t n);
/* Linear warmup then cosine decay to min_lr at total (total 0: constant lr). */
double planrt_lr_at(double lr, int64_t step, int64_t warmup, int64_t total, double min_lr);
double planrt_sum_squares(const float *x, size_t n);

/* ------------------------------------------------------------------ checkpoints (safetensors)
 * Interoperable with PyTorch's safetensors files: 8-byte little-endian header length, a JSON
 * header {name: {dtype, shape, data_offsets}} and the raw little-endian data. Writes are atomic
 * (temporary file, fsync, rename). Reads validate every offset against the file size. */
typedef struct planrt_st *planrt_st_t;
planrt_result_t planrt_st_open(const char *path, planrt_st_t *out);
/* Finds name; checks dtype (F32, BF16 or F16 converted to f32) and shape against what the plan
 * expects (a one-line cause naming both shapes if not), copies the block [offs, offs + ldims) as
 * f32 into dst. */
planrt_result_t planrt_st_read_block(planrt_st_t f, const char *name, int rank, const int64_t *gdims,
				     const int64_t *ldims, const int64_t *offs, float *dst);
void planrt_st_close(planrt_st_t f);
/* A tensor's bytes in another file (the offloaded optimizer's state file), read when written out. */
typedef struct planrt_st_source {
	int fd;
	int64_t offset;
} planrt_st_source_t;
typedef struct planrt_st_tensor {
	const char *name;
	planrt_dtype_t dtype; /* of data: f32 or bf16 */
	int rank;
	int64_t dims[8];
	const void *data;
	const planrt_st_source_t *source; /* data == NULL: the bytes are in this file (pread) */
} planrt_st_tensor_t;
planrt_result_t planrt_st_write(const char *path, const planrt_st_tensor_t *tensors, int n);

/* ------------------------------------------------------------------ metrics and progress */
/* JSON lines: {"step":, "loss":, "lr":, "grad_norm":, "tokens":, "step_ms":, "tokens_per_s":} */
planrt_result_t planrt_log_open(const char *path);
void planrt_log_step(int64_t step, double loss, double lr, double grad_norm, int64_t tokens, double step_ms);
/* More members for the next planrt_log_step line, as JSON text ("versions":[3,2],"staleness":1),
 * added to those given since the last line; NULL or "" adds none. */
void planrt_log_fields(const char *members);
/* Closes the log: 0, or -1 when a line could not be written (the first failure was reported on
 * stderr when it happened; this reports the count): the run's exit status is then 1. */
int planrt_log_close(void);
/* Rank 0's progress line on stderr: step k/K, loss, tokens/s, ETA. */
void planrt_progress(int64_t step, int64_t total, double loss, double tokens_per_s, double elapsed_s);
double planrt_now(void); /* seconds, monotonic */

/* ------------------------------------------------------------------ runtime internals
 * For the runtime's own sources (they define PLANRT_INTERNAL before including this header);
 * generated programs never use these. */
#ifdef PLANRT_INTERNAL
#include <stdio.h>
/* Records the one-line detail planrt_last_error() returns and passes r through:
 * return planrt_error_(planrt_io_error, "cannot open '%s': %s; check the path", path, ...); */
planrt_result_t planrt_error_(planrt_result_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int planrt_world_rank_(void); /* -1 before planrt_init */
/* core/result.c learns who this process is from comm/world.c: the rank its messages name, and
 * whether one process plays every rank without MPI (then planrt_fatal does not name a rank) */
void planrt_set_world_rank_(int rank, int offline);
int planrt_mpi_live_(void); /* MPI is initialised and not finalised */
/* world.c: before planrt_init, from a device layer whose threads will call MPI (the MPI device
 * backend): planrt_init asks MPI for MPI_THREAD_MULTIPLE instead of funneled */
void planrt_want_threads_(void);
/* planc reshard: the mesh coordinates of world rank `rank` in a process without MPI (no comms) */
void planrt_mesh_offline_(int naxes, const int *sizes, int rank);
/* bf16 and f16 (t) to and from f32; f32 -> half rounds to nearest even, NaN stays NaN. */
float planrt_half_to_f32_(uint16_t h, planrt_dtype_t t);
uint16_t planrt_f32_to_half_(float x, planrt_dtype_t t);
/* the same over n elements (h and f do not overlap) */
void planrt_halves_to_f32_(const uint16_t *h, float *f, size_t n, planrt_dtype_t t);
void planrt_f32_to_halves_(const float *f, uint16_t *h, size_t n, planrt_dtype_t t);
/* The most mesh axes planrt_mesh_init accepts; the per-group counters have one slot per axis. */
enum { PLANRT_MAX_AXES_ = 8 };
/* comm_mpi.c: reads PLANRT_WATCHDOG and MPI's largest tag; called by planrt_init. */
void planrt_comm_init_(void);
/* comm_mpi.c, the monitor thread (watchdog, signals, the record of recent operations): started by
 * planrt_init before MPI starts its threads (SIGTERM, SIGINT and SIGHUP are blocked in every other
 * thread and reported by it with what the rank was doing). planrt_where_ tells it where the
 * program is (step -1: not in a step; micro -1: not in a micro-batch); planrt_on_signal_ sets
 * what runs before the process ends by such a signal (a checkpoint's temporary files removed). */
void planrt_monitor_start_(void);
void planrt_heap_keep_(void); /* memory.c: freed allocations stay in the heap for the next step */
void planrt_where_(int64_t step, const char *phase, int micro, int chunk);
void planrt_on_signal_(void (*cleanup)(void));
/* planrt's own control messages (a checkpoint's agreement, the trace's gather): a copy of the
 * world whose traffic planrt_bytes_sent_by does not count (it is not the plan's), under the
 * watchdog like every other call. NULL before planrt_init. */
enum { PLANRT_GROUP_CONTROL_ = -3 };
planrt_comm_t planrt_control_comm_(void);
/* data.c: a run's data (docs/data.md). files: one path (a token file, a glob of llm.c shards, a
 * Megatron prefix, a data set) or a blend of several token files with weights (NULL: equal);
 * eval_files (neval > 0): --eval-data, of the same kind, all of it held out; evaluate without
 * eval_files holds out the last tenth of every source. sampling: PLANRT_SAMPLE_EPOCHS (without
 * replacement, the default) or _RANDOM (with replacement, the rule of runs made before epochs).
 * batch: the step's global batch (fewer distinct training samples is an error). */
typedef enum { PLANRT_SAMPLE_RANDOM = 0, PLANRT_SAMPLE_EPOCHS = 1 } planrt_sampling_t;
typedef struct planrt_data_config {
	int nfiles, neval;
	const char *const *files, *const *eval_files;
	const double *weights, *eval_weights;
	int64_t vocab, seq, batch;
	int sampling, evaluate;
} planrt_data_config_t;
planrt_result_t planrt_data_open_run_(const planrt_data_config_t *c, planrt_data_t *out);
/* the training samples (random sampling of tokens: the tokens windows start in), the rule's name */
int64_t planrt_data_train_samples_(planrt_data_t d);
const char *planrt_data_sampling_(planrt_data_t d);
/* "0.7 a.bin (megatron, 1000 tokens, documents) 0.3 b.bin (...)": the sources, for messages */
void planrt_data_describe_(planrt_data_t d, char *buf, size_t n);
/* the token files the training data reads (every source of a blend, every shard of a glob, in
 * order) into paths (at most max): their number; 0 for a data set */
int planrt_data_files_(planrt_data_t d, const char **paths, int max);
/* whether any source has document boundaries (a Megatron index, or shards) */
int planrt_data_has_documents_(planrt_data_t d);
/* data.c: holds out the last tenth of the samples (random token sampling: of the tokens, at least
 * one window) for evaluation; training then draws from the rest only (*train: what
 * planrt_data_train_samples_ says). A held-out batch: samples [lo, hi) of evaluation batch
 * `batch` (random token sampling: from its own stream of (seed, batch, sample)). */
planrt_result_t planrt_data_hold_out_(planrt_data_t d, int64_t *train);
planrt_result_t planrt_data_eval_batch_(planrt_data_t d, int64_t batch, int64_t lo, int64_t hi, uint64_t seed,
					int32_t *tokens, int32_t *targets);
/* log.c: planrt_log_open, appending to an existing log when append (a resumed run); a resumed run
 * then cuts the rows of steps >= first_step (a dead run's, and a torn last line) */
planrt_result_t planrt_log_open_(const char *path, int append);
planrt_result_t planrt_log_truncate_(int64_t first_step);
/* planrt_log_step with the samples of the step too ("samples", "samples_per_s"; tokens <= 0: no
 * "tokens" fields, a model that does not read token windows) */
void planrt_log_step_(int64_t step, double loss, double lr, double grad_norm, int64_t tokens, int64_t samples,
		      double step_ms);
/* planrt_progress with the rate's unit ("tok/s", "samples/s") */
void planrt_progress_(int64_t step, int64_t total, double loss, double rate, const char *unit, double elapsed_s);
/* comm_mpi.c: MPI moves a nonblocking operation only inside MPI calls (Open MPI's shared-memory
 * transport without a single-copy mechanism, TCP between nodes): a pipeline's activation sent
 * while its stage computes the next micro-batch would wait for the stage's next MPI call. While
 * any started operation of planrt's MPI layer is in flight (planrt_comm_pending_ > 0), the CPU
 * kernels that run long (GEMMs, the fused attention's heads) call planrt_comm_progress_, whose
 * planrt_comm_poke_ tests the oldest of them and so runs MPI's progress engine once, at most once
 * a millisecond (only on the thread that makes the rank's MPI calls; on a kernel's pool threads it
 * returns). */
extern int planrt_comm_pending_;
void planrt_comm_poke_(void);
static inline void planrt_comm_progress_(void)
{
	if (__atomic_load_n(&planrt_comm_pending_, __ATOMIC_RELAXED)) /* read by pool threads too */
		planrt_comm_poke_();
}
/* trace.c: --trace FILE, a Chrome-trace timeline of every rank. planrt_trace_open_ starts recording
 * (collective: every rank calls it); begin/end open and close nested events (end's args, when not
 * NULL, are the event's JSON arguments); planrt_trace_args_ sets the innermost open event's; close
 * joins every rank's events into FILE (collective) under process_name: 0, or -1 on every rank
 * when the file could not be written (rank 0 printed why). */
extern int planrt_tracing_;
void planrt_trace_open_(const char *path);
void planrt_trace_begin_(const char *name, const char *cat);
void planrt_trace_end_(const char *args);
void planrt_trace_args_(const char *args);
/* a finished event measured elsewhere (start_s in planrt_now() seconds, dur_s seconds) on track tid
 * (1: the GPU's compute stream's waits for communication) */
void planrt_trace_complete_(const char *name, const char *cat, int tid, double start_s, double dur_s, const char *args);
int planrt_trace_close_(const char *process_name);
/* core/trace.c's half for comm/trace_file.c: start recording for path (origin now), the path,
 * this rank's part of the file, and forgetting every event */
void planrt_trace_start_(const char *path);
const char *planrt_trace_path_(void);
void planrt_trace_write_part_(FILE *f, int rank, const char *process_name);
void planrt_trace_reset_(void);
/* kernels.c: while set (planrt_main's evaluation of held-out batches), dropout is the identity */
extern int planrt_evaluating_;
/* kernels.c: the fused attention's tile products so far on this rank (a query tile times a key tile
 * not skipped by the causal mask) and the scores they computed: [0] forward, [1] backward, and the
 * seconds its kernels took; PLANRT_REPORT_ATTENTION prints them */
extern long long planrt_attention_tiles_[2], planrt_attention_scores_[2];
extern double planrt_attention_s_;
/* safetensors.c: planrt_st_write, with one more string in __metadata__ (meta_key NULL: none),
 * also returning the data's checksum ("fnv1a64:..."); and a tensor's raw data as stored (dtype a
 * planrt_dtype_t, or -1 for one planrt has no type for); and a file's __metadata__ string */
planrt_result_t planrt_st_write_(const char *path, const planrt_st_tensor_t *tensors, int n, const char *meta_key,
				 const char *meta_value, char *checksum, size_t checksum_n);
const char *planrt_st_metadata_(planrt_st_t f, const char *key);
planrt_result_t planrt_st_find_(planrt_st_t f, const char *name, int *dtype, int64_t *n, const void **data);
/* safetensors.c: the name of the file's i-th tensor (file order), NULL past the last */
const char *planrt_st_name_(planrt_st_t f, int i);
/* comm_mpi.c: the comm layer for operations on device streams (comm_nccl.c's NCCL layer, registered
 * by the CUDA device layer; NULL: none), and requests it completes itself (planrt_wait and
 * planrt_test call ops on impl; planrt_wait frees the request). */
typedef struct planrt_comm_layer {
	const char *name;
	planrt_result_t (*run)(planrt_coll_t kind, const void *sendbuf, void *recvbuf, size_t count, planrt_dtype_t t,
			       planrt_op_t op, int peer, int tag, planrt_comm_t c, planrt_stream_t stream,
			       planrt_request_t *req);
	/* planrt_alltoallv_on on a device stream (counts and displacements in elements) */
	planrt_result_t (*alltoallv)(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
				     void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t,
				     planrt_comm_t c, planrt_stream_t stream);
} planrt_comm_layer_t;
void planrt_comm_layer_set_(const planrt_comm_layer_t *layer);
typedef struct planrt_request_ops {
	planrt_result_t (*wait)(void *impl);
	planrt_result_t (*test)(void *impl, int *done);
} planrt_request_ops_t;
planrt_request_t planrt_request_external_(void *impl, const planrt_request_ops_t *ops);
#ifdef MPI_VERSION /* the communicator as the MPI backend sees it (runtime sources that include mpi.h) */
struct planrt_comm {
	MPI_Comm comm;
	int size, rank;
	int group;       /* what planrt_bytes_sent_by files its traffic under: the mesh axis index,
			  * PLANRT_GROUP_PAIR or PLANRT_GROUP_WORLD; set where the communicator is made */
	char name[48];   /* for messages: "world", "axis data", "pair axis 1 {0,3}" */
	uint64_t ncalls; /* operations started on it, numbered in watchdog messages */
};
/* comm_mpi.c: the MPI datatype that carries t (bf16 and f16 as 16-bit words: reduce them in f32) */
MPI_Datatype planrt_mpi_type_(planrt_dtype_t t);
#endif
#endif

#ifdef __cplusplus
}
#endif
#endif
