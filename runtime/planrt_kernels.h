/* planrt_kernels.h: the compute kernels generated programs call for every op that is not a fused
 * element-wise loop (those planc emits inline). Semantics follow torch.nn.functional.
 *
 * Every kernel exists for T = float (suffix _f32, used by programs) and T = double (suffix _f64,
 * used by the finite-difference tests), declared by PLANRT_KERNELS(T, SUFFIX) below. Tensors are
 * contiguous and row-major unless strides are given. "Accumulate" outputs are added to, never
 * overwritten (gradients of shared values). Shapes are int64_t. */
#ifndef PLANRT_KERNELS_H
#define PLANRT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { PLANRT_ADD = 0, PLANRT_SUB, PLANRT_MUL, PLANRT_DIV };
enum { PLANRT_GELU_ERF = 0, PLANRT_GELU_TANH };

#define PLANRT_KERNELS(T, S)                                                                                   \
	/* C[b] = op(A[b]) @ op(B[b]) (+ C[b] when accumulate), b < batch. A is [M, K] ([K, M] when              \
	 * trans_a), B is [K, N] ([N, K] when trans_b); stride_a / stride_b / stride_c are the element          \
	 * distances between batch entries (stride_b = 0: one B for every batch entry). OpenBLAS gemm. */        \
	void planrt_k_matmul_##S(int64_t batch, int64_t M, int64_t N, int64_t K, const T *A, int trans_a,          \
				 int64_t stride_a, const T *B, int trans_b, int64_t stride_b, T *C, int64_t stride_c,  \
				 int accumulate);                                                               \
	/* out = a OP b with numpy broadcasting: out has rank dims; a_strides / b_strides give each            \
	 * operand's element stride per out dim (0 where it broadcasts). */                                    \
	void planrt_k_binary_##S(int op, int rank, const int64_t *dims, const T *a, const int64_t *a_strides,      \
				 const T *b, const int64_t *b_strides, T *out);                                 \
	/* out (shape with reduced dims, out_strides 0 on dims summed over) = sum of in [rank dims];              \
	 * out is overwritten. */                                                                              \
	void planrt_k_sum_to_##S(int rank, const int64_t *dims, const T *in, const int64_t *out_strides, T *out,    \
				 int64_t out_elems);                                                            \
	/* the same, added to out (a gradient accumulator) */                                                    \
	void planrt_k_sum_to_acc_##S(int rank, const int64_t *dims, const T *in, const int64_t *out_strides, T *out, \
				     int64_t out_elems);                                                        \
	void planrt_k_scale_##S(const T *x, T *y, int64_t n, double alpha); /* y = alpha x (in place ok) */   \
	void planrt_k_gelu_##S(const T *x, T *y, int64_t n, int approx);                                        \
	void planrt_k_gelu_grad_##S(const T *x, const T *dy, T *dx, int64_t n, int approx);                      \
	void planrt_k_relu_##S(const T *x, T *y, int64_t n);                                                    \
	void planrt_k_relu_grad_##S(const T *y, const T *dy, T *dx, int64_t n); /* from the output */          \
	void planrt_k_silu_##S(const T *x, T *y, int64_t n);                                                    \
	void planrt_k_silu_grad_##S(const T *x, const T *dy, T *dx, int64_t n);                                  \
	/* Dropout whose mask depends only on (seed, key, global element index): the local block of a          \
	 * tensor with global shape gdims starting at offs with shape ldims. Kept elements are scaled by         \
	 * 1 / (1 - p); mask[i] = 1 if kept. */                                                                \
	void planrt_k_dropout_##S(const T *x, T *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank, \
				  const int64_t *gdims, const int64_t *ldims, const int64_t *offs);              \
	void planrt_k_dropout_grad_##S(const uint8_t *mask, const T *dy, T *dx, int64_t n, double p);            \
	/* x: batch x [rows, cols] blocks of a [R, C] score matrix starting at (row_off, col_off); entries      \
	 * with global col > global row become fill (-inf forward, 0 for the gradient). In place ok. */        \
	void planrt_k_causal_mask_##S(const T *x, T *y, int64_t batch, int64_t rows, int64_t cols, int64_t row_off, \
				      int64_t col_off, T fill);                                                 \
	void planrt_k_softmax_##S(const T *x, T *y, int64_t rows, int64_t cols);                                 \
	void planrt_k_softmax_grad_##S(const T *y, const T *dy, T *dx, int64_t rows, int64_t cols);              \
	/* mean and rstd: [rows], saved for the backward. dw, db accumulate. */                                \
	void planrt_k_layer_norm_##S(const T *x, const T *w, const T *b, T *y, float *mean, float *rstd,         \
				     int64_t rows, int64_t cols, double eps);                                   \
	void planrt_k_layer_norm_grad_##S(const T *x, const T *w, const float *mean, const float *rstd, const T *dy, \
					  T *dx, T *dw, T *db, int64_t rows, int64_t cols);                    \
	void planrt_k_rms_norm_##S(const T *x, const T *w, T *y, float *rstd, int64_t rows, int64_t cols, double eps); \
	void planrt_k_rms_norm_grad_##S(const T *x, const T *w, const float *rstd, const T *dy, T *dx, T *dw,      \
					int64_t rows, int64_t cols);                                           \
	/* Rows [vocab_lo, vocab_lo + vocab_local) of the table live here (vocab parallel); other ids give      \
	 * zero rows. dtable accumulates. */                                                                   \
	void planrt_k_embed_##S(const T *table, const int32_t *ids, T *out, int64_t ntok, int64_t dim,           \
				int64_t vocab_lo, int64_t vocab_local);                                         \
	void planrt_k_embed_grad_##S(const int32_t *ids, const T *dy, T *dtable, int64_t ntok, int64_t dim,      \
				     int64_t vocab_lo, int64_t vocab_local);                                    \
	/* Cross-entropy in pieces so that a vocab-parallel program can all-reduce between them: row max,        \
	 * sum of exp(x - max), the target's logit (0 where the target is not in this rank's range);            \
	 * then per-row lse = max + log(sumexp) and the loss sum of (lse - target logit), times scale. */       \
	void planrt_k_ce_max_##S(const T *logits, int64_t rows, int64_t cols, float *rowmax);                    \
	void planrt_k_ce_sumexp_##S(const T *logits, const float *rowmax, int64_t rows, int64_t cols, float *sumexp); \
	void planrt_k_ce_target_##S(const T *logits, const int32_t *targets, int64_t rows, int64_t cols,         \
				    int64_t vocab_lo, float *tlogit);                                           \
	double planrt_k_ce_loss_##S(const float *rowmax, const float *sumexp, const float *tlogit, int64_t rows,  \
				    float *lse, double scale);                                                 \
	/* dlogits = (softmax(logits) - onehot(target)) * dscale, this rank's vocab columns. */                \
	void planrt_k_ce_grad_##S(const T *logits, const int32_t *targets, const float *lse, int64_t rows,         \
				  int64_t cols, int64_t vocab_lo, double dscale, T *dlogits);                   \
	/* out = in permuted: out dim i is in dim perm[i]. */                                                  \
	void planrt_k_permute_##S(int rank, const int64_t *in_dims, const int *perm, const T *in, T *out);       \
	/* Mixture of experts (Switch / GShard): probs = softmax(logits [T, E]); each token's top_k            \
	 * experts in order, gate = prob; slot = the count of earlier (token, k) pairs routed to the same       \
	 * expert; pairs whose slot >= capacity are dropped (idx -1), else idx = expert * capacity + slot. */    \
	void planrt_k_moe_route_##S(const T *logits, int64_t tokens, int64_t experts, int64_t top_k,              \
				    int64_t capacity, T *gates, int32_t *idx);                                 \
	void planrt_k_moe_dispatch_##S(const T *x, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim, \
				       int64_t slots, T *buf);             /* buf [slots, dim] overwritten */   \
	void planrt_k_moe_dispatch_grad_##S(const T *dbuf, const int32_t *idx, int64_t tokens, int64_t top_k,      \
					    int64_t dim, T *dx);                   /* dx overwritten */           \
	void planrt_k_moe_combine_##S(const T *buf, const T *gates, const int32_t *idx, int64_t tokens,           \
				      int64_t top_k, int64_t dim, T *out);                                     \
	void planrt_k_moe_combine_grad_##S(const T *dout, const T *buf, const T *gates, const int32_t *idx,        \
					   int64_t tokens, int64_t top_k, int64_t dim, int64_t slots, T *dbuf,    \
					   T *dgates);                                                         \
	/* d(gates)/d(logits) through the softmax, for the chosen experts. dlogits overwritten. */              \
	void planrt_k_moe_route_grad_##S(const T *logits, const int32_t *idx, const T *dgates, int64_t tokens,     \
					 int64_t experts, int64_t top_k, int64_t capacity, T *dlogits);          \
	/* Switch load-balancing loss E * sum_e f_e P_e (f_e: fraction of tokens whose first choice is e,       \
	 * P_e: mean router probability), and its gradient (accumulated into dlogits) times dscale. */          \
	double planrt_k_moe_aux_loss_##S(const T *logits, const int32_t *idx, int64_t tokens, int64_t experts,     \
					 int64_t top_k, int64_t capacity);                                     \
	void planrt_k_moe_aux_loss_grad_##S(const T *logits, const int32_t *idx, int64_t tokens, int64_t experts,   \
					    int64_t top_k, int64_t capacity, double dscale, T *dlogits);

PLANRT_KERNELS(float, f32)
PLANRT_KERNELS(double, f64)

/* The statistics the norm and cross-entropy kernels save (mean, rstd, rowmax, sumexp, tlogit, lse)
 * are float in both instantiations above, which leaves those _f64 kernels at float precision: a
 * cross-entropy loss assembled from float pieces is too coarse for finite differences (its rounding
 * noise over h ~ 1e-6 swamps the derivative). The _f64d set is the same code with double
 * statistics; the finite-difference tests use it. */
#define PLANRT_STAT_KERNELS(T, ST, S)                                                                          \
	void planrt_k_layer_norm_##S(const T *x, const T *w, const T *b, T *y, ST *mean, ST *rstd, int64_t rows, \
				     int64_t cols, double eps);                                                 \
	void planrt_k_layer_norm_grad_##S(const T *x, const T *w, const ST *mean, const ST *rstd, const T *dy,   \
					  T *dx, T *dw, T *db, int64_t rows, int64_t cols);                    \
	void planrt_k_rms_norm_##S(const T *x, const T *w, T *y, ST *rstd, int64_t rows, int64_t cols, double eps); \
	void planrt_k_rms_norm_grad_##S(const T *x, const T *w, const ST *rstd, const T *dy, T *dx, T *dw,       \
					int64_t rows, int64_t cols);                                           \
	void planrt_k_ce_max_##S(const T *logits, int64_t rows, int64_t cols, ST *rowmax);                       \
	void planrt_k_ce_sumexp_##S(const T *logits, const ST *rowmax, int64_t rows, int64_t cols, ST *sumexp);   \
	void planrt_k_ce_target_##S(const T *logits, const int32_t *targets, int64_t rows, int64_t cols,         \
				    int64_t vocab_lo, ST *tlogit);                                              \
	double planrt_k_ce_loss_##S(const ST *rowmax, const ST *sumexp, const ST *tlogit, int64_t rows, ST *lse,  \
				    double scale);                                                             \
	void planrt_k_ce_grad_##S(const T *logits, const int32_t *targets, const ST *lse, int64_t rows,           \
				  int64_t cols, int64_t vocab_lo, double dscale, T *dlogits);

PLANRT_STAT_KERNELS(double, double, f64d)

/* bf16 storage: round to nearest even; conversions in both directions. */
void planrt_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n);
void planrt_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n);
/* Copies a block between a tensor and a contiguous buffer: dst = src[offs : offs + ldims] of a
 * tensor with dims gdims (gather = 1) or the reverse (gather = 0). For packing split dims around
 * collectives. */
void planrt_k_block_copy(size_t elem, int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
			 void *tensor, void *block, int gather);

#ifdef __cplusplus
}
#endif
#endif
