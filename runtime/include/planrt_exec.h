/* planrt_exec.h: the pieces of a training step that generated programs call between the compute
 * kernels: layout conversions along one mesh axis for a tensor split on any dim (packing around
 * the flat MPI collectives), gradient buckets, the composed (optionally vocab-parallel)
 * cross-entropy, input loading, gradient clipping and the global loss. Implemented in exec.c;
 * the step kernels of the IR (the last section) in step.c. */
#ifndef PLANRT_EXEC_H
#define PLANRT_EXEC_H

#include "planrt.h"
#include "planrt_offload.h"

#ifdef __cplusplus
extern "C" {
#endif

void planrt_fill_f32(float *x, int64_t n, double value);
/* causal mask of a block whose global offsets are offs[rank - 2] (rows) and offs[rank - 1]. */
void planrt_causal_mask_block_f32(const float *x, float *y, int64_t batch, int64_t rows, int64_t cols,
				  const int64_t *offs, int rank, int gradient);

/* Layout conversions on the communicator of one axis; dims are the input's local dims. mirrored: the
 * split is the causally balanced ring's (block p is the chunks p and 2n - 1 - p of 2n). */
void planrt_allreduce_dim(const void *in, void *out, int64_t n, planrt_dtype_t t, planrt_comm_t c);
void planrt_reduce_scatter_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
			       planrt_dtype_t t, planrt_comm_t c, void *scratch);
void planrt_allgather_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
			  planrt_dtype_t t, planrt_comm_t c, void *scratch);
void planrt_alltoall_dim(const void *in, void *out, int rank, const int64_t *dims, int from_dim, int to_dim,
			 planrt_dtype_t t, planrt_comm_t c, void *scratch);
void planrt_slice_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored,
		      planrt_dtype_t t, planrt_comm_t c);

/* ------------------------------------------------------------------ mixture of experts (moe.c)
 * The routing losses into a scalar: *loss = planrt_k_moe_aux_loss_f32 / planrt_k_moe_z_loss_f32
 * (planrt_kernels.h) of this rank's tokens, scale making it its share of the mean over the step's
 * micro-batch. */
void planrt_moe_aux_loss_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group, double scale,
			     float *loss);
void planrt_moe_z_loss_f32(const float *logits, int64_t tokens, int64_t experts, double scale, float *loss);
/* The step's routing metrics into the next log line: stats holds, for each of the layers MoE
 * layers, the (token, choice) pairs dropped and then the pairs routed to each of its experts[l]
 * experts (summed over the step's tokens): "moe_dropped":[..],"moe_load":[[..],..]. */
void planrt_moe_metrics(const double *stats, int layers, const int64_t *experts);
/* Dropless expert parallelism over c (n members): a dispatched buffer's rows from the token side
 * (in [E, slots, dim], expert e's rows packed from its first; idx, pairs entries, names them as
 * e * slots + row) to the expert side (out [E / n, n * slots, dim], each expert's rows from every
 * member packed in member order), to_experts = 1; the reverse, 0. The counts go first (an all-to-all
 * of E int32), then only the rows that exist (an alltoallv); the written side is zero past its
 * rows. scratch: 2 E slots dim elements of t and 8 (4 n + E) bytes. */
void planrt_moe_exchange(const void *in, void *out, int to_experts, const int32_t *idx, int64_t pairs, int64_t experts,
			 int64_t slots, int64_t dim, planrt_dtype_t t, planrt_comm_t c, void *scratch);

/* ZeRO: a tensor of n elements split evenly over the communicator's ranks, rank r holding
 * elements [r * c, r * c + c) with c = ceil(n / size) (zero padding past n). */
int64_t planrt_flat_chunk(int64_t n, planrt_comm_t c);
/* full[0..n) = the concatenation of every rank's chunk, elements of dtype t; scratch: size * c
 * elements. shard may point into full. */
void planrt_allgather_flat(const void *shard, void *full, int64_t n, planrt_dtype_t t, planrt_comm_t c, void *scratch);
/* The same, nonblocking, for prefetching (ZeRO-3 gathers the next parameter while the current one
 * is used): full must hold size * c floats (the tail past n is padding). */
void planrt_allgather_flat_start(planrt_request_t *req, const void *shard, void *full, int64_t n, planrt_dtype_t t,
				 planrt_comm_t c);
void planrt_allgather_flat_finish(planrt_request_t *req);
/* Reduce-scatters n gradient buffers (dtype t: f32, or bf16 widened to f32 while packing) into
 * their per-rank f32 chunks: shards[i] (c_i floats) gets the sum over ranks of chunk r of bufs[i]
 * (added to it when accumulate). With zero_source the
 * buffers are cleared after packing (ZeRO 2 and 3 keep no whole gradient across micro-batches).
 * scratch: (size + 1) * sum of c_i floats. */
void planrt_bucket_reduce_scatter(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t,
				  void *const *shards, planrt_dtype_t shard_t, int accumulate, int zero_source,
				  planrt_comm_t c, void *scratch);

/* Packs n gradient buffers of dtype t into scratch, all-reduces (sum), unpacks. */
void planrt_bucket_allreduce(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t, planrt_comm_t c,
			     void *scratch);

/* A gradient bucket whose reduction overlaps the backward pass: start packs the (final) member
 * gradients into the bucket's own buffer and starts a nonblocking all-reduce or, for ZeRO,
 * reduce-scatter (the GEMMs move it while it is in flight: planrt_comm_progress_); finish waits and
 * unpacks (all-reduce) or adds / copies this rank's chunks into shards (reduce-scatter, with the
 * same accumulate / zero_source meaning as planrt_bucket_reduce_scatter). buf: the bucket's
 * static buffer, the bytes the blocking version takes as scratch. */
typedef struct planrt_bucket {
	planrt_request_t req;
	int active;
} planrt_bucket_t;
void planrt_bucket_allreduce_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
				   planrt_dtype_t t, planrt_comm_t c, void *buf);
void planrt_bucket_allreduce_finish(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
				    planrt_dtype_t t, void *buf);
void planrt_bucket_reduce_scatter_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
					planrt_dtype_t t, int zero_source, planrt_comm_t c, void *buf);
void planrt_bucket_reduce_scatter_finish(planrt_bucket_t *b, int n, const int64_t *counts, void *const *shards,
					 planrt_dtype_t shard_t, int accumulate, planrt_comm_t c, void *buf);

/* loss = sum over rows of (lse - target logit) * scale; lse saved for the backward. With a
 * vocabulary split over vocab_comm (non-NULL), the max, sum of exp and target logit are
 * all-reduced between the pieces. correct (non-NULL): adds the count of rows whose target's
 * logit is the row's largest (the accuracy's numerator). scratch: 3 * rows floats. */
void planrt_cross_entropy_f32(const float *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
			      int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
			      void *scratch);
/* the same on logits stored as `storage` (bf16, f16), widened a block of rows at a time (at most
 * 1 MiB): the f32 loss's arithmetic on the widened values, bit for bit */
void planrt_cross_entropy_16(const void *logits, const int32_t *targets, float *loss, float *lse, int64_t rows,
			     int64_t cols, int64_t vocab_lo, double scale, double *correct, planrt_comm_t vocab_comm,
			     uint8_t *scratch, planrt_dtype_t storage);

/* ------------------------------------------------------------------ step kernels of the IR
 * In-place collectives on flat buffers (gradient buckets viewed in place, ZeRO shards), sums
 * (bf16 / f16 in f32): blocking when req is NULL, otherwise started into *req (which must hold
 * no request still in flight: NULL) and completed by planrt_request_finish. Failures end every
 * rank through planrt_fatal with a one-line cause. Results in bf16 / f16 are rounded once, to
 * nearest even. */
void planrt_allreduce_inplace(void *buf, int64_t n, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req);
/* buf holds size * chunk elements; afterwards rank r's chunk (at buf + r * chunk) is the sum of
 * every rank's chunk r (the other chunks' contents are unspecified) */
void planrt_reduce_scatter_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req);
/* buf holds size * chunk elements; rank r contributes its chunk at buf + r * chunk */
void planrt_allgather_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req);
void planrt_request_finish(planrt_request_t *req);   /* waits for *req (if any) and clears it */
/* One shift of context parallelism's ring (compiler/lower/ring.c): send's n elements go to the next
 * member of c ((rank + 1) mod size) and recv takes the previous member's, both started into
 * *send_req and *recv_req (which must be idle) and completed by planrt_p2p_finish; tag keeps the
 * K/V ring apart from the ring of their gradients. Counted as one send and one receive on c. */
void planrt_ring_shift_start(const void *send, void *recv, int64_t n, planrt_dtype_t t, planrt_comm_t c, int tag,
			     planrt_request_t *send_req, planrt_request_t *recv_req);
/* f32, bf16, f16, f64, i32, u8 (an integer dtype takes an integral value in its range) */
void planrt_fill(void *dst, int64_t n, planrt_dtype_t t, double value);
/* dst += src: f32, f64, or bf16 / f16 widened, added in f32 and rounded once */
void planrt_accumulate(void *dst, const void *src, int64_t n, planrt_dtype_t t);
/* dst (of dtype t: f32, bf16, f16) += src (f32), each element rounded once */
void planrt_accumulate_f32(void *dst, planrt_dtype_t t, const float *src, int64_t n);
/* any pair among f32, bf16, f16, f64 (same dtype: a copy, of any dtype); dst does not overlap
 * src unless the dtypes are the same */
void planrt_cast(const void *src, planrt_dtype_t from, void *dst, planrt_dtype_t to, int64_t n);
/* C (+)= op(A) op(B) of bf16 A and B, batch entries at the given element strides (planrt_k_matmul's
 * arguments), every product and sum in f32; C is f32 or bf16 (c_type), a bf16 C rounded once, to
 * nearest even, after the products are added (to its old value when accumulate). The operands are
 * widened a tile at a time (rows of op(A), columns of op(B), all of K), never as a whole. */
void planrt_k_matmul_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			  int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			  int64_t stride_c, int accumulate);
/* the same of f16 A and B (precision fp16), C f32 or f16 */
void planrt_k_matmul_f16(int64_t batch, int64_t M, int64_t N, int64_t K, const uint16_t *A, int trans_a,
			 int64_t stride_a, const uint16_t *B, int trans_b, int64_t stride_b, void *C, planrt_dtype_t c_type,
			 int64_t stride_c, int accumulate);
/* The 16-bit variants of sum_to and the norms: the buffers typed void are stored as `storage` (bf16
 * or f16), widened to f32 as they are read and rounded once as they are written; the float ones
 * (the statistics) are f32. The sums over rows (the out of sum_to, dw / db of the norms) are stored
 * as `acc`: f32, or `storage` (widened once, summed in f32, rounded once). The numbers are those of
 * casting the 16-bit buffers to f32, calling the _f32 kernel and casting its outputs back, bit for
 * bit, without the f32 copies (runtime/cpu/kernels16.c: blocks of rows are widened into a scratch
 * of at most 1 MiB an operand, allocated by the call). */
void planrt_k_sum_to_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage);
void planrt_k_sum_to_acc_16(int rank, const int64_t *dims, const void *in, const int64_t *out_strides, void *out,
			    int64_t out_elems, planrt_dtype_t acc, planrt_dtype_t storage);
void planrt_k_layer_norm_16(const void *x, const void *w, const void *b, void *y, float *mean, float *rstd,
			    int64_t rows, int64_t cols, double eps, planrt_dtype_t storage);
void planrt_k_layer_norm_grad_16(const void *x, const void *w, const float *mean, const float *rstd, const void *dy,
				 void *dx, void *dw, void *db, int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage);
void planrt_k_rms_norm_16(const void *x, const void *w, void *y, float *rstd, int64_t rows, int64_t cols, double eps,
			  planrt_dtype_t storage);
void planrt_k_rms_norm_grad_16(const void *x, const void *w, const float *rstd, const void *dy, void *dx, void *dw,
			       int64_t rows, int64_t cols, planrt_dtype_t acc, planrt_dtype_t storage);
/* the cross-entropy's gradient (planrt_k_ce_grad_f32) on logits and dlogits stored as `storage` */
void planrt_k_ce_grad_16(const void *logits, const int32_t *targets, const float *lse, int64_t rows, int64_t cols,
			 int64_t vocab_lo, double dscale, void *dlogits, planrt_dtype_t storage);
/* the embedding (planrt_k_embed_f32) of a table stored as `storage` into out stored alike: the rows
 * moved as stored, zeros for the tokens outside this rank's vocab rows */
void planrt_k_embed_16(const void *table, const int32_t *ids, void *out, int64_t ntok, int64_t dim, int64_t vocab_lo,
		       int64_t vocab_local, planrt_dtype_t storage);
/* dropout (planrt_k_dropout_f32) on x, y stored as `storage`; the mask as the f32 kernel draws it */
void planrt_k_dropout_16(const void *x, void *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			 const int64_t *gdims, const int64_t *ldims, const int64_t *offs, planrt_dtype_t storage);
/* RoPE and its gradient (planrt_k_rope_f32, _grad_f32) on x, y (dy, dx) stored as `storage` */
void planrt_k_rope_16(const void *x, void *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
		      int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
		      int64_t pos_off2, double theta, planrt_dtype_t storage);
void planrt_k_rope_grad_16(const void *dy, void *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			   int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			   int64_t pos_off2, double theta, planrt_dtype_t storage);
/* the fused attention on 16-bit q, k, v, out, dout, dq, dk, dv (lse and the additive mask f32), as
 * planrt_k_attention_f32 / _grad_f32 (planrt_kernels.h) on their widened copies, a block of heads
 * at a time (at most 16 MiB of widened operands a block, or one kv head's rows of one sample) */
extern int64_t planrt_k16_attention_block_; /* the bound on a block's widened floats (tests lower it) */
void planrt_k_attention_16(const void *q, const void *k, const void *v, const float *mask, const int64_t *mask_strides,
			   void *out, float *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
			   double scale, int mask_kind, double p, uint64_t seed, uint64_t key, const int64_t *gdims,
			   const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage);
void planrt_k_attention_grad_16(const void *q, const void *k, const void *v, const float *mask,
				const int64_t *mask_strides, const void *out, const float *lse, const void *dout, void *dq,
				void *dk, void *dv, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				double scale, int mask_kind, double p, uint64_t seed, uint64_t key, const int64_t *gdims,
				const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage);
/* *acc += weight * sum of x[i]^2 (x of dtype t: f32, bf16, f16; summed in double in order) */
void planrt_sum_squares_acc(double *acc, const void *x, int64_t n, planrt_dtype_t t, double weight);
/* The squared norm of a ZeRO bucket shard: the shard holds elements [lo, lo + n) of the bucket,
 * whose tensors (segments) sit at seg_off[i] with seg_len[i] elements, each a gradient with
 * replicas[i] identical copies across the mesh (its sum of squares is divided by that; 0: not
 * counted at all, a tied copy). */
void planrt_sum_squares_shard(double *acc, const void *shard, planrt_dtype_t t, int64_t lo, int64_t n, int nseg,
			      const int64_t *seg_off, const int64_t *seg_len, const int64_t *replicas);
/* *norm = sqrt(*sumsq); *coef = max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1 */
void planrt_clip_coef(const double *sumsq, double *norm, double *coef, double max_norm);
/* One optimizer step on n elements (PyTorch semantics, see planrt_opt_step): the learning rate is
 * planrt_lr_at(lr, step, warmup, total, min_lr) with the 0-based step, and planrt_opt_step runs
 * with step + 1; the gradient (dtype gt: f32, bf16 or f16, widened to f32 in blocks) is
 * multiplied by *coef (the clipping coefficient; not when it is 1 or coef is NULL) first, as
 * planrt_k_scale_f32 does. grad is only read. m, v: the moments (NULL if the kind has none). */
void planrt_optimizer_step(int kind, double lr, double beta1, double beta2, double eps, double weight_decay,
			   double momentum, int64_t warmup, int64_t total, double min_lr, int64_t step, float *param,
			   const void *grad, planrt_dtype_t gt, float *m, float *v, int64_t n, const double *coef);
/* *acc += scale * *loss */
void planrt_loss_accumulate(double *acc, const float *loss, double scale);

/* The tied-parameter pair groups of a program, made once at init (collective over the world:
 * every rank calls it with the same arguments, in the same order): planrt_pair(index) is the
 * group of stages a and b along axis through this rank, or NULL when this rank is in neither. */
void planrt_make_pair_comm(int axis, int a, int b, int index);
planrt_comm_t planrt_pair(int index);

/* Sums x over every rank of the world. */
double planrt_world_sum(double x);
/* Sums x over the axes whose bit is set in axes_mask. */
double planrt_axes_sum(double x, unsigned axes_mask);

/* ------------------------------------------------------------------ language ops (ops.c)
 * *loss = scale * the sum of (x - target)^2 (l1: |x - target|), torch's mse_loss / l1_loss with
 * scale = 1 / the elements of the whole batch; the gradient dx = dscale * 2 (x - target) (l1:
 * dscale * sign), overwritten. */
void planrt_regression_loss_f32(int l1, const float *x, const float *target, int64_t n, double scale, float *loss);
void planrt_regression_loss_grad_f32(int l1, const float *x, const float *target, int64_t n, double dscale, float *dx);
/* Loads the block of input `input` (the model's input named name, of dtype t, global dims gdims
 * (gdims[0]: the step's batch), the local block ldims at offsets offs; classes > 0: its values are
 * labels of a cross-entropy over that many classes, checked when the input is first loaded) for
 * the running step into dst. Token data serves the token models' two i32 [B, S] inputs (input 0:
 * tokens, 1: targets); a data set (planrt_dataset.h) serves its tensor `name`. dataset.c. */
struct planrt_ctx;
void planrt_load_data(struct planrt_ctx *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
		      const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes);
/* y = x[.., start : start + len, ..] of x viewed as [outer, n, inner] (planrt_k_slice for i32) */
void planrt_narrow_i32(const int32_t *x, int32_t *y, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len);
/* Class labels (the local block ldims at offsets offs of the step's batch, rank dims) against
 * [0, classes): the first bad one ends the run with its value, its position in the step's batch
 * and what (the input it came from). */
void planrt_check_labels(const int32_t *labels, int rank, const int64_t *ldims, const int64_t *offs, int64_t classes,
			 const char *what, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
