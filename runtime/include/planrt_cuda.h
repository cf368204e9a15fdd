/* planrt_cuda.h: the CUDA target's runtime (planrt_cuda), what programs built with
 * `planc build --target cuda` call.
 *
 * Streams and events. A program's kernels run on the streams planc's schedule gave them (streams.c):
 * compute, comm (collectives), copy (inputs and offload copies), host (the CPU thread itself, in
 * program order) and one per pipeline channel and direction (PLANRT_STREAM_P2P + 2 * channel, + 1
 * for receives; the ring attention's K/V receives, PLANRT_STREAM_RING_RECV, which is above every
 * pipeline channel's). planrt_cu_record(&ev, s) records the event after the work enqueued on s so far;
 * planrt_cu_wait(s, &ev) makes s wait for it (on the host stream: the CPU waits). A phase call
 * records the compute stream's entry (planrt_cu_record_entry) and a side stream's first kernel
 * waits for it (planrt_cu_wait_entry). Events are created on first use.
 *
 * Kernels. For every kernel kind the CUDA target runs on the device, planrt_cu_NAME takes the C
 * target's arguments (planrt_NAME, runtime/planrt_exec.h, planrt_kernels.h, planrt_program.h) and
 * the stream last: the same operation on device memory, enqueued on that stream. A buffer argument
 * read as a scalar on the CPU (a loss gradient) is passed as its device pointer and factor.
 * Arrays passed as host pointers (dims, offsets, buffer lists) are read before the call returns.
 * GEMMs go through cuBLAS in f32 (TF32 off, as the CPU computes) or, for bf16 operands
 * (planrt_cu_k_matmul_bf16), on the tensor cores with f32 accumulation. Collectives go
 * through NCCL (comm_nccl.c): one communicator per mesh axis and per tied-parameter pair, split
 * from a world communicator whose id MPI broadcasts.
 *
 * planrt_cuda_main runs planrt_main on the CUDA device layer: persistent state and the arena are
 * device memory (the arena one cudaMalloc of exactly the planned bytes), the metric scalars and
 * offloaded state pinned host memory. Started where there is no GPU it prints one line saying so
 * and exits with status 1. The program links the CUDA runtime statically and never libcuda. */
#ifndef PLANRT_CUDA_H
#define PLANRT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "planrt_optim_math.h"

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_program.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { PLANRT_STREAM_COMPUTE = 0, PLANRT_STREAM_COMM, PLANRT_STREAM_COPY, PLANRT_STREAM_HOST, PLANRT_STREAM_P2P };
enum { PLANRT_STREAM_RING_RECV = 63 }; /* device_cuda.cu has 64 streams; pipeline channels use at most P2P + 33 */
enum { PLANRT_CU_BLOCK = 256 };

typedef struct planrt_cu_event *planrt_cu_event_t;

int planrt_cuda_main(int argc, char **argv, const planrt_program_t *program);
/* The program's offloaded state pointers (NULL-terminated): allocated in pinned host memory. */
void planrt_cu_host_state(void **const *ptrs);

void planrt_cu_record(planrt_cu_event_t *ev, int stream);
void planrt_cu_wait(int stream, planrt_cu_event_t *ev);
void planrt_cu_record_entry(void);
void planrt_cu_wait_entry(int stream);
void planrt_cu_synchronize(void); /* every stream done; reports an asynchronous error */

/* for the fused loops' launchers (kernels.cu) */
unsigned planrt_cu_grid(int64_t n);
void planrt_cu_check_launch(const char *what);
#ifdef __CUDACC__
cudaStream_t planrt_cu_stream(int stream);
#endif

/* ------------------------------------------------------------------ compute (kernels_cuda.cu) */
void planrt_cu_k_matmul_f32(int64_t batch, int64_t M, int64_t N, int64_t K, const float *A, int trans_a, int64_t stride_a,
			    const float *B, int trans_b, int64_t stride_b, float *C, int64_t stride_c, int accumulate,
			    int stream);
void planrt_cu_k_matmul_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			     int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			     int64_t stride_c, int accumulate, int stream);
void planrt_cu_k_matmul_f16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			    int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			    int64_t stride_c, int accumulate, int stream);
/* D [rows, N] = op(A) op(B) + R + bias over the rows (R, bias: NULL where absent), 16-bit A, B, D
 * and R of type t, bias of type t or f32, rounded once (cuBLASLt's epilogue; PLANRT_EPILOGUE=0: the
 * GEMM, then an add kernel): what the CUDA printer calls for a matmul whose only reader adds a bias
 * and a residual to it (compiler/target/cuda/epilogues.c; runtime/cuda/gemm_epilogue_cuda.cu) */
void planrt_cu_k_matmul_epilogue_16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
				    int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, planrt_dtype_t t,
				    void *D, int64_t stride_c, const void *R, const void *bias, planrt_dtype_t bias_type,
				    int stream);
/* layer_norm_grad_16 / rms_norm_grad_16 whose dx is add + dx, rounded once: what the CUDA printer
 * calls for a norm's gradient whose only reader adds the residual's gradient to it (epilogues.c) */
void planrt_cu_k_layer_norm_grad_add_16(const void *x, const void *w, const float *mean, const float *rstd,
					const void *dy, const void *add, void *dx, void *dw, void *db, int64_t rows,
					int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage, int stream);
void planrt_cu_k_rms_norm_grad_add_16(const void *x, const void *w, const float *rstd, const void *dy, const void *add,
				      void *dx, void *dw, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage, int stream);
/* dropout_16 whose y is add + the dropped x, rounded once: the residual add after a dropout
 * (epilogues.c) */
void planrt_cu_k_dropout_add_16(const void *x, const void *add, void *y, uint8_t *mask, double p, uint64_t seed,
				uint64_t key, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
				planrt_dtype_t storage, int stream);
void planrt_cu_k_permute_f32(int rank, const int64_t *in_dims, const int *perm, const float *in, float *out, int stream);
void planrt_cu_k_permute_16(int rank, const int64_t *in_dims, const int *perm, const void *in, void *out, int stream);
void planrt_cu_k_sum_to_f32(int rank, const int64_t *dims, const float *in, const int64_t *out_strides, float *out,
			    int64_t out_elems, int stream);
void planrt_cu_k_sum_to_acc_f32(int rank, const int64_t *dims, const float *in, const int64_t *out_strides, float *out,
				int64_t out_elems, int stream);
void planrt_cu_k_dropout_f32(const float *x, float *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			     const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int stream);
void planrt_cu_k_dropout_16(const void *x, void *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			    const int64_t *gdims, const int64_t *ldims, const int64_t *offs, planrt_dtype_t storage,
			    int stream);
void planrt_cu_causal_mask_block_f32(const float *x, float *y, int64_t batch, int64_t rows, int64_t cols,
				     const int64_t *offs, int rank, int gradient, int stream);
void planrt_cu_k_softmax_f32(const float *x, float *y, int64_t rows, int64_t cols, int stream);
/* fused attention (attention_cuda.cu), as planrt_k_attention_f32 / _grad_f32 (planrt_kernels.h) */
void planrt_cu_k_attention_f32(const float *q, const float *k, const float *v, const float *mask,
			       const int64_t *mask_strides, float *out, float *lse, int rank, const int64_t *ldims,
			       int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
			       uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch, int stream);
void planrt_cu_k_attention_grad_f32(const float *q, const float *k, const float *v, const float *mask,
				    const int64_t *mask_strides, const float *out, const float *lse, const float *dout,
				    float *dq, float *dk, float *dv, int rank, const int64_t *ldims, int64_t kv_heads,
				    int64_t sk, double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				    const int64_t *gdims, const int64_t *offs, void *scratch, int stream);
/* the same on 16-bit q, k, v, out, dout, dq, dk, dv stored as `storage` (lse and the mask f32) */
void planrt_cu_k_attention_16(const void *q, const void *k, const void *v, const float *mask,
			      const int64_t *mask_strides, void *out, float *lse, int rank, const int64_t *ldims,
			      int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
			      uint64_t key, const int64_t *gdims, const int64_t *offs, uint8_t *scratch,
			      planrt_dtype_t storage, int stream);
void planrt_cu_k_attention_grad_16(const void *q, const void *k, const void *v, const float *mask,
				   const int64_t *mask_strides, const void *out, const float *lse, const void *dout,
				   void *dq, void *dk, void *dv, int rank, const int64_t *ldims, int64_t kv_heads,
				   int64_t sk, double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				   const int64_t *gdims, const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage,
				   int stream);
/* the ring's steps (context parallelism): the block of keys held at step `step` of a ring of `size`
 * (mirrored: two chunks, causal load balancing), merged into out and lse / added to dq after step 0 */
void planrt_cu_k_ring_attention_f32(const float *q, const float *k, const float *v, const float *mask,
				    const int64_t *mask_strides, float *out, float *lse, int rank, const int64_t *ldims,
				    int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
				    uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord,
				    int step, int size, int mirrored, int stream);
void planrt_cu_k_ring_attention_grad_f32(const float *q, const float *k, const float *v, const float *mask,
					 const int64_t *mask_strides, const float *out, const float *lse,
					 const float *dout, float *dq, float *dk, float *dv, int rank, const int64_t *ldims,
					 int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
					 uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch,
					 int64_t coord, int step, int size, int mirrored, int stream);
void planrt_cu_k_softmax_grad_f32(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, int stream);
void planrt_cu_k_layer_norm_f32(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
				int64_t rows, int64_t cols, double eps, int stream);
void planrt_cu_k_layer_norm_grad_f32(const float *x, const float *w, const float *mean, const float *rstd,
				     const float *dy, float *dx, float *dw, float *db, int64_t rows, int64_t cols,
				     int stream);
void planrt_cu_k_rms_norm_f32(const float *x, const float *w, float *y, float *rstd, int64_t rows, int64_t cols,
			      double eps, int stream);
void planrt_cu_k_rms_norm_grad_f32(const float *x, const float *w, const float *rstd, const float *dy, float *dx,
				   float *dw, int64_t rows, int64_t cols, int stream);
/* the 16-bit variants (planrt_kernels.h): void buffers stored as `storage`, float ones f32 */
void planrt_cu_k_sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			   int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int stream);
void planrt_cu_k_sum_to_acc_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			       int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage, int stream);
void planrt_cu_k_layer_norm_16(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd,
			       int64_t rows, int64_t cols, double eps, planrt_dtype_t storage, int stream);
void planrt_cu_k_layer_norm_grad_16(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
				    void *dx, void *dw, void *db, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage,
				    int stream);
void planrt_cu_k_rms_norm_16(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols,
			     double eps, planrt_dtype_t storage, int stream);
void planrt_cu_k_rms_norm_grad_16(const void *x, const void *w, const float *rstd, const void *dy, void *dx,
				  void *dw, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage, int stream);
void planrt_cu_k_embed_f32(const float *table, const int32_t *ids, float *out, int64_t ntok, int64_t dim,
			   int64_t vocab_lo, int64_t vocab_local, int stream);
void planrt_cu_k_embed_16(const void *table, const int32_t *ids, void *out, int64_t ntok, int64_t dim,
			  int64_t vocab_lo, int64_t vocab_local, planrt_dtype_t storage, int stream);
void planrt_cu_k_embed_grad_f32(const int32_t *ids, const float *dy, float *dtable, int64_t ntok, int64_t dim,
				int64_t vocab_lo, int64_t vocab_local, int stream);
void planrt_cu_cross_entropy_f32(const float *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
				 int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
				 void *scratch, int stream);
void planrt_cu_check_labels(const int32_t *labels, int rank, const int64_t *ldims, const int64_t *offs,
			    int64_t classes, const char *what, int64_t step, int stream);
void planrt_cu_k_ce_grad_f32(const float *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			     int64_t vocab_lo, const float *dscale, double factor, float *dlogits, int stream);
/* the cross-entropy and its gradient on logits (and dlogits) stored as `storage` (bf16, f16) */
void planrt_cu_cross_entropy_16(const void *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
				int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
				uint8_t *scratch, planrt_dtype_t storage, int stream);
void planrt_cu_k_ce_grad_16(const void *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			    int64_t vocab_lo, const float *dscale, double factor, void *dlogits, planrt_dtype_t storage,
			    int stream);
void planrt_cu_k_slice_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, int64_t start,
			   int64_t len, int stream);
void planrt_cu_k_slice_grad_f32(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner, int64_t start,
				int64_t len, int accumulate, int stream);
void planrt_cu_narrow_i32(const int32_t *x, int32_t *y, int64_t outer, int64_t n, int64_t inner, int64_t start,
			  int64_t len, int stream);
void planrt_cu_k_rope_f32(const float *x, float *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			  int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			  int64_t pos_off2, double theta, int stream);
void planrt_cu_k_rope_grad_f32(const float *dy, float *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			       int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride,
			       int64_t pos_off, int64_t pos_off2, double theta, int stream);
void planrt_cu_k_rope_16(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			 int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			 int64_t pos_off2, double theta, planrt_dtype_t storage, int stream);
void planrt_cu_k_rope_grad_16(const void *dy, void *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			      int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			      int64_t pos_off2, double theta, planrt_dtype_t storage, int stream);
void planrt_cu_k_unary_f32(int op, const float *x, float *y, int64_t n, int stream);
void planrt_cu_k_unary_grad_f32(int op, const float *x, const float *dy, float *dx, int64_t n, int stream);
void planrt_cu_k_repeat_kv_f32(const float *x, float *y, int64_t outer, int64_t heads, int64_t n_rep, int64_t inner,
			       int64_t y_heads, int64_t y_head_lo, int stream);
void planrt_cu_k_repeat_kv_grad_f32(const float *dy, float *dx, int64_t outer, int64_t heads, int64_t n_rep,
				    int64_t inner, int64_t y_heads, int64_t y_head_lo, int stream);
void planrt_cu_slice_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
			 planrt_comm_t c, int stream);
void planrt_cu_fill(void *dst, int64_t n, planrt_dtype_t t, double value, int stream);
void planrt_cu_cast(const void *src, planrt_dtype_t from, void *dst, planrt_dtype_t to, int64_t n, int stream);
void planrt_cu_accumulate(void *dst, const void *src, int64_t n, planrt_dtype_t t, int stream);
void planrt_cu_sum_squares_acc(double *acc, const void *x, int64_t n, planrt_dtype_t t, double weight, int stream);
void planrt_cu_sum_squares_shard(double *acc, const void *shard, planrt_dtype_t t, int64_t lo, int64_t n, int nseg,
				 const int64_t *seg_off, const int64_t *seg_len, const int64_t *replicas, int stream);
void planrt_cu_clip_coef(const double *sumsq, double *norm, double *coef, double max_norm, int stream);
void planrt_cu_optimizer_step(int kind, double lr, double beta1, double beta2, double eps, double weight_decay,
			      double momentum, int64_t warmup, int64_t total, double min_lr, int64_t step, float *param,
			      const void *grad, planrt_dtype_t gt, float *m, float *v, int64_t n, const double *coef,
			      int stream);
/* A multi-tensor launch's table: the call site's (static, zeroed); the device copy of its entries
 * and of each entry's first block (the prefix sums of the per-tensor launches' block counts),
 * built at the first call and rebuilt only if the entries change. */
typedef struct planrt_cu_table {
	void *host; /* the entries the device copy holds */
	void *entries;
	int64_t *prefix; /* [count + 1] */
	int count;
	int64_t blocks;
} planrt_cu_table_t;
/* The optimizer over a table of tensors in one launch (planrt_optim_math.h): the update of
 * planrt_cu_optimizer_step on every entry, and, where an entry has one, the cast to its
 * lower-precision parameter that follows it: their numbers bit for bit. */
void planrt_cu_optimizer_multi(planrt_cu_table_t *table, const planrt_om_entry_t *entries, int count, int kind,
			       double lr, double beta1, double beta2, double eps, double weight_decay, double momentum,
			       int64_t warmup, int64_t total, double min_lr, int64_t step, const double *coef, int stream);
/* planrt_cu_sum_squares_acc over a table of tensors (the gradient norm's): two launches, the
 * numbers of one call per tensor in the table's order, bit for bit */
void planrt_cu_sum_squares_multi(planrt_cu_table_t *table, const planrt_om_sq_entry_t *entries, int count,
				 double *acc, int stream);
void planrt_cu_loss_accumulate(double *acc, const float *loss, double scale, int stream);
void planrt_cu_scale_metric(double *x, double f, int stream);

/* ------------------------------------------------------------------ mixture of experts (moe_cuda.cu)
 * planrt_k_moe_* (planrt_kernels.h) and moe.c's on the device; the routing exactly the CPU's
 * (top_k at most PLANRT_MOE_MAX_TOP_K, planrt_moe_math.h). planrt_cu_moe_metrics and
 * planrt_cu_moe_exchange synchronise their stream: the host reads the metrics, and the dropless
 * counts size the rows' exchange. */
void planrt_cu_k_moe_route_f32(const float *logits, int64_t tokens, int64_t experts, int64_t top_k, int64_t group,
			       int64_t capacity, int normalize, float *gates, int32_t *idx, int32_t *counts, double *stats,
			       int stream);
void planrt_cu_k_moe_route_grad_f32(const float *logits, const float *dgates, int64_t tokens, int64_t experts,
				    int64_t top_k, int normalize, float *dlogits, int stream);
void planrt_cu_k_moe_dispatch_f32(const float *x, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
				  int64_t slots, float *buf, int stream);
void planrt_cu_k_moe_dispatch_grad_f32(const float *dbuf, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
				       float *dx, int stream);
void planrt_cu_k_moe_combine_f32(const float *buf, const float *gates, const int32_t *idx, int64_t tokens, int64_t top_k,
				 int64_t dim, float *out, int stream);
void planrt_cu_k_moe_combine_grad_f32(const float *dout, const float *buf, const float *gates, const int32_t *idx,
				      int64_t tokens, int64_t top_k, int64_t dim, int64_t slots, float *dbuf, float *dgates,
				      int stream);
void planrt_cu_moe_aux_loss_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group, double scale,
				float *loss, int stream);
void planrt_cu_k_moe_aux_loss_grad_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group,
				       const float *dloss, double factor, float *dlogits, int stream);
void planrt_cu_moe_z_loss_f32(const float *logits, int64_t tokens, int64_t experts, double scale, float *loss, int stream);
void planrt_cu_k_moe_z_loss_grad_f32(const float *logits, int64_t tokens, int64_t experts, const float *dloss,
				     double factor, float *dlogits, int stream);
void planrt_cu_moe_metrics(const double *stats, int layers, const int64_t *experts, int stream);
void planrt_cu_moe_exchange(const void *in, void *out, int to_experts, const int32_t *idx, int64_t pairs,
			    int64_t experts, int64_t slots, int64_t dim, planrt_dtype_t t, planrt_comm_t c, void *scratch,
			    int stream);

/* ------------------------------------------------------------------ I/O through the host (io_cuda.cu) */
void planrt_cu_load_data(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
			 const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes, int stream);
void planrt_cu_init_param(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
			  int stream);
void planrt_cu_save_param(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
			  int shard_axis, int stream);
void planrt_cu_ckpt_write(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int kind, int64_t lo,
			  int64_t n, int shard_axis, int stream);
void planrt_cu_ckpt_read(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int kind, int64_t lo, int64_t n,
			 int stream);
void planrt_cu_ckpt_write_local(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id, int stream);
void planrt_cu_ckpt_read_local(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int64_t n, int id, int stream);
void planrt_cu_copy(void *dst, const void *src, int64_t bytes, int stream); /* offload copies, either way */

/* ------------------------------------------------------------------ communication (exec_cuda.cu, comm_nccl.c) */
void planrt_cu_make_pair_comm(int axis, int a, int b, int index, int stream);
void planrt_cu_allreduce_dim(const void *in, void *out, int64_t n, planrt_dtype_t t, planrt_comm_t c, int stream);
void planrt_cu_reduce_scatter_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
				  planrt_comm_t c, void *scratch, int stream);
void planrt_cu_allgather_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
			     planrt_comm_t c, void *scratch, int stream);
void planrt_cu_alltoall_dim(const void *in, void *out, int rank, const int64_t *dims, int from_dim, int to_dim,
			    planrt_dtype_t t, planrt_comm_t c, void *scratch, int stream);
void planrt_cu_allreduce_inplace(void *buf, int64_t n, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				 int stream);
void planrt_cu_reduce_scatter_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				      int stream);
void planrt_cu_allgather_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				 int stream);
void planrt_cu_allgather_flat(const void *shard, void *full, int64_t n, planrt_dtype_t t, planrt_comm_t c, void *scratch,
			      int stream);
void planrt_cu_allgather_flat_start(planrt_request_t *req, const void *shard, void *full, int64_t n, planrt_dtype_t t,
				    planrt_comm_t c, int stream);
void planrt_cu_bucket_allreduce(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t, planrt_comm_t c,
				void *scratch, int stream);
void planrt_cu_bucket_reduce_scatter(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t,
				     void *const *shards, planrt_dtype_t shard_t, int accumulate, int zero_source,
				     planrt_comm_t c, void *scratch, int stream);
void planrt_cu_bucket_reduce_scatter_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
					   planrt_dtype_t t, int zero_source, planrt_comm_t c, void *buf, int stream);
void planrt_cu_bucket_reduce_scatter_finish(planrt_bucket_t *b, int n, const int64_t *counts, void *const *shards,
					    planrt_dtype_t shard_t, int accumulate, planrt_comm_t c, void *buf, int stream);
void planrt_cu_p2p_send_start(const void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req,
			      int stream);
void planrt_cu_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req,
			      int stream);
void planrt_cu_p2p_finish(planrt_ctx_t *ctx, planrt_request_t *req, int stream);
/* the ring attention's shift (planrt_ring_shift_start): the send on stream, the receive on
 * PLANRT_STREAM_RING_RECV after the point stream has reached, and stream then waits for the receive */
void planrt_cu_ring_shift_start(const void *send, void *recv, int64_t n, planrt_dtype_t t, planrt_comm_t c, int tag,
				planrt_request_t *send_req, planrt_request_t *recv_req, int stream);
void planrt_cu_request_finish(planrt_request_t *req, int stream);

/* ------------------------------------------------------------------ sync strategies (sync_cuda.cu) */
void planrt_cu_compress_cast(float *grad, int64_t n, planrt_dtype_t wire, float *residual, void *scratch, int64_t chunk,
			     planrt_comm_t c, int stream);
void planrt_cu_compress_topk(float *grad, int nseg, const int64_t *off, const int64_t *len, const int64_t *k,
			     float *residual, void *scratch, planrt_comm_t c, int stream);
void planrt_cu_compress_powersgd(float *grad, int nseg, const int64_t *off, const int64_t *rows, const int64_t *cols,
				 int r, float *q, float *residual, float *scratch, planrt_comm_t c, int stream);
void planrt_cu_powersgd_init(planrt_ctx_t *ctx, float *q, int64_t n, int stream);
void planrt_cu_local_average(planrt_ctx_t *ctx, int every, void *flat, int64_t n, planrt_dtype_t t, void *params,
			     planrt_dtype_t pt, const double *loss, double *history, planrt_comm_t c, int outer,
			     double outer_lr, double outer_momentum, float *anchor, float *momentum, int stream);
void planrt_cu_async_pull(planrt_ctx_t *ctx, int staleness, void *params, void *inbox, int64_t n, planrt_dtype_t t,
			  planrt_comm_t c, int stream);
void planrt_cu_async_push(planrt_ctx_t *ctx, int staleness, const void *grads, int64_t n, planrt_dtype_t t, void *ring,
			  const double *loss, planrt_comm_t c, int stream);
void planrt_cu_async_drain(planrt_ctx_t *ctx, void *params, void *inbox, int64_t n, planrt_dtype_t t, planrt_comm_t c,
			   int stream);
void planrt_cu_async_post(planrt_ctx_t *ctx, void *inbox, int64_t msg, planrt_dtype_t t, int nworkers, planrt_comm_t c,
			  int stream);
void planrt_cu_async_gather(planrt_ctx_t *ctx, int staleness, void *grads, int64_t n, planrt_dtype_t t,
			    const void *inbox, int nworkers, double *loss, double *versions, int stream);
void planrt_cu_async_publish(planrt_ctx_t *ctx, int staleness, const void *params, int64_t n, planrt_dtype_t t,
			     void *ring, int nworkers, planrt_comm_t c, int stream);
void planrt_cu_loss_seed(planrt_ctx_t *ctx, float *dl, double per_micro, int stream);
void planrt_cu_unscale_clip_coef(planrt_ctx_t *ctx, const double *sumsq, double *norm, double *coef, double max_norm,
				 int stream);

#ifdef __cplusplus
}
#endif
#endif
