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

/* The CPU fused attention's query and key tile (cpu/attention_impl.h's ATTN_BQ and ATTN_BK): under
 * a causal mask every tile holding an unmasked score is computed whole (planc calibrate reports it) */
#define PLANRT_ATTN_TILE 64

enum { PLANRT_ADD = 0, PLANRT_SUB, PLANRT_MUL, PLANRT_DIV };
enum { PLANRT_GELU_ERF = 0, PLANRT_GELU_TANH };
/* a matmul operand's trans flag, and whether a kernel's output is overwritten or added to */
enum { PLANRT_NO_TRANS = 0, PLANRT_TRANS = 1 };
enum { PLANRT_OVERWRITE = 0, PLANRT_ACCUMULATE = 1 };
/* the element-wise functions of planrt_k_unary: torch.sin, cos, exp, log, tanh, sigmoid */
enum { PLANRT_SIN = 0, PLANRT_COS, PLANRT_EXP, PLANRT_LOG, PLANRT_TANH, PLANRT_SIGMOID };
/* A block offset list (the offs of a kernel that works on a block of a global tensor) has 2 x rank
 * entries: offs[d] is where the block's first half on dim d (local rows [0, ldims[d] / 2)) starts in
 * the global tensor, offs[rank + d] where its second half starts. They are adjacent except on a
 * dim split over a causally balanced context-parallel ring, where a rank holds the chunks c and
 * 2n - 1 - c of 2n (docs/attention.md). planrt_block_split_dim: that dim, or -1;
 * planrt_block_pos: the global index of local row l on dim d. */
static inline int planrt_block_split_dim(int rank, const int64_t *ldims, const int64_t *offs)
{
	for (int d = 0; d < rank; d++)
		if (offs[rank + d] != offs[d] + ldims[d] / 2)
			return d;
	return -1;
}
static inline int64_t planrt_block_pos(int rank, const int64_t *ldims, const int64_t *offs, int d, int64_t l)
{
	int64_t half = ldims[d] / 2;
	return l < half ? offs[d] + l : offs[rank + d] + (l - half);
}
/* Half h of a block split on dim m as a block of its own: its local dims and offset list (the
 * other dims as they were), and its first local row on dim m. */
static inline int64_t planrt_block_half(int rank, const int64_t *ldims, const int64_t *offs, int m, int h,
					int64_t *half_ldims, int64_t *half_offs)
{
	int64_t first = h ? ldims[m] / 2 : 0;
	for (int d = 0; d < rank; d++) {
		half_ldims[d] = d == m ? (h ? ldims[d] - first : ldims[d] / 2) : ldims[d];
		half_offs[d] = d == m ? offs[h ? rank + d : d] : offs[d];
	}
	for (int d = 0; d < rank; d++)
		half_offs[rank + d] = d == m ? half_offs[d] + half_ldims[d] / 2 : offs[rank + d];
	return first;
}

/* torch.nn.functional.cross_entropy's default ignore_index */
#define PLANRT_IGNORE_INDEX (-100)

/* Cross-entropy over classes (torch.nn.functional.cross_entropy with class-index targets and its
 * ignore_index; PLANRT_IGNORE_INDEX is torch's default). *loss = scale * the sum over the rows whose
 * label counts (in [0, classes), not ignore_index) of lse - logits[r, label], with lse = logsumexp of
 * the row, saved [rows] for the backward. torch's mean reduction: scale = 1 / the number of rows that
 * count, over the whole batch (planrt_k_check_labels counts them; no row counts gives NaN, as torch).
 * Labels outside [0, classes) that are not ignore_index are bad. A kernel never aborts on data: it
 * returns the number of bad labels, with the first one's row and value in *bad_row, *bad_value (left
 * alone when there are none); bad rows, like ignored ones, add nothing to the loss and get a zero
 * gradient. The program reports bad labels to the user (the value and its position) and stops.
 * The gradient, (softmax - onehot(label)) * dscale on rows that count and 0 on the others, overwrites
 * dlogits. */
#define PLANRT_CE_CLASSES(T, ST, S)                                                                            \
	int64_t planrt_k_cross_entropy_##S(const T *logits, const int32_t *labels, int64_t rows, int64_t classes,   \
					   int32_t ignore_index, double scale, ST *lse, double *loss, int64_t *bad_row, \
					   int32_t *bad_value);                                                  \
	void planrt_k_cross_entropy_grad_##S(const T *logits, const int32_t *labels, const ST *lse, int64_t rows,  \
					     int64_t classes, int32_t ignore_index, double dscale, T *dlogits);

#define PLANRT_KERNELS(T, S)                                                                                   \
	/* C[b] = op(A[b]) @ op(B[b]) (+ C[b] when accumulate), b < batch. A is [M, K] ([K, M] when              \
	 * trans_a), B is [K, N] ([N, K] when trans_b); stride_a / stride_b / stride_c are the element          \
	 * distances between batch entries (stride_b = 0: one B for every batch entry). OpenBLAS gemm. */        \
	void planrt_k_matmul_##S(int64_t batch, int64_t M, int64_t N, int64_t K, const T *A, int trans_a,          \
				 int64_t stride_a, const T *B, int trans_b, int64_t stride_b, T *C, int64_t stride_c,  \
				 int accumulate);                                                               \
	/* torch.matmul with broadcast batch dims (numpy rules): for every index i of the batch_rank dims     \
	 * batch_dims, C_i (+)= op(A_i) @ op(B_i) with M, N, K and the flags as in planrt_k_matmul, where A_i   \
	 * starts at sum_d i[d] a_strides[d] (0 on a dim A broadcasts along), B_i and C_i likewise. Where       \
	 * c_strides is 0 on a dim, the products along it add into one C block: the gradient of an operand     \
	 * that was broadcast along that dim. That covers the weight gradient of a transposed activation: for   \
	 * a = s^T (s stored [.., K, M]) used as a @ W, dW [K, N] = sum over the leading dims of s_i @ dy_i,     \
	 * i.e. A = s (trans_a 0), B = dy, c_strides all 0. accumulate = 0: each C block is overwritten by its  \
	 * sum; 1: the sum is added. batch_rank 0 is one product. */                                           \
	void planrt_k_bmm_##S(int batch_rank, const int64_t *batch_dims, int64_t M, int64_t N, int64_t K, const T *A, \
			      int trans_a, const int64_t *a_strides, const T *B, int trans_b, const int64_t *b_strides,  \
			      T *C, const int64_t *c_strides, int accumulate);                                  \
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
	/* y = f(x), f one of PLANRT_SIN .. PLANRT_SIGMOID; dx = dy f'(x), from the input. In place ok. The     \
	 * _f32 kernels compute what planrt_math.h's planrt_sin .. planrt_sigmoid(_grad) compute. */            \
	void planrt_k_unary_##S(int op, const T *x, T *y, int64_t n);                                           \
	void planrt_k_unary_grad_##S(int op, const T *x, const T *dy, T *dx, int64_t n);                         \
	/* Reductions over one dim of x viewed as [outer, n, inner] (outer: the product of the dims before the   \
	 * reduced one, inner: of those after it). y is [outer, inner], which is also the layout of the          \
	 * keepdim = True result [outer, 1, inner]. sum_dim: y = scale * the sum (torch.sum: scale 1;            \
	 * torch.mean: scale 1 / n, or 1 / the global n when the dim is split and the program all-reduces y).   \
	 * The gradient, dx = scale * dy broadcast over the dim, overwrites dx. */                               \
	void planrt_k_sum_dim_##S(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, double scale);      \
	void planrt_k_sum_dim_grad_##S(const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner, double scale); \
	/* torch.max(x, dim): y the largest entry, argmax its index in [0, n), the first one on ties; a NaN     \
	 * counts as the largest (the first NaN). n >= 1. The gradient goes to the argmax entry only, as torch's \
	 * (dx overwritten, zero elsewhere). */                                                                \
	void planrt_k_max_dim_##S(const T *x, T *y, int32_t *argmax, int64_t outer, int64_t n, int64_t inner);   \
	void planrt_k_max_dim_grad_##S(const int32_t *argmax, const T *dy, T *dx, int64_t outer, int64_t n,       \
				       int64_t inner);                                                           \
	/* Slicing along one dim of x viewed as [outer, n, inner]: y = x[.., start : start + len, ..], step 1,  \
	 * 0 <= start <= start + len <= n. len = 1 indexes a fixed position (x[:, 0], the [CLS] token;           \
	 * torch.select): dropping the dim leaves the layout as it is. slice_grad puts dy in rows                \
	 * [start, start + len) of dx and zeros the other rows (accumulate = 0), or adds dy to those rows and     \
	 * leaves the others alone (accumulate = 1: the slices of one tensor, such as a fused q/k/v, each add    \
	 * their part). */                                                                                      \
	void planrt_k_slice_##S(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len); \
	void planrt_k_slice_grad_##S(const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner, int64_t start,  \
				     int64_t len, int accumulate);                                               \
	/* torch.cat(xs, dim): count inputs, xs[i] viewed as [outer, ns[i], inner], into y [outer, sum ns,       \
	 * inner]. The gradient splits dy back into dxs[i] (overwritten). */                                     \
	void planrt_k_concat_##S(int count, const T *const *xs, const int64_t *ns, T *y, int64_t outer, int64_t inner); \
	void planrt_k_concat_grad_##S(int count, const T *dy, T *const *dxs, const int64_t *ns, int64_t outer,      \
				      int64_t inner);                                                           \
	/* repeat_kv of Hugging Face's Llama (grouped-query attention), torch.repeat_interleave(x, n_rep, dim):  \
	 * x viewed as [outer, heads, inner] gives y [outer, heads * n_rep, inner] whose head h is x's head      \
	 * h / n_rep. [B, S, Hkv, Dh]: outer = B S, inner = Dh; [B, Hkv, S, Dh]: outer = B, inner = S Dh. A block \
	 * of kv heads gives the matching block of query heads (tensor parallel). y holds y_heads of the heads  \
	 * from y_head_lo on (0 and heads * n_rep: all; key/value heads replicated over tensor ranks: each rank  \
	 * its query heads' block of x's whole heads). The gradient sums the copies into dx [outer, heads,      \
	 * inner] (overwritten; the heads no copy comes from are zero). */                                      \
	void planrt_k_repeat_kv_##S(const T *x, T *y, int64_t outer, int64_t heads, int64_t n_rep, int64_t inner,  \
				    int64_t y_heads, int64_t y_head_lo);                                        \
	void planrt_k_repeat_kv_grad_##S(const T *dy, T *dx, int64_t outer, int64_t heads, int64_t n_rep,         \
					 int64_t inner, int64_t y_heads, int64_t y_head_lo);                     \
	/* Rotary position embeddings, the Llama / GPT-NeoX form (rotate_half on the two halves). x is           \
	 * [batch, seq, heads, head_dim] (heads_first = 0) or [batch, heads, seq, head_dim] (heads_first = 1):   \
	 * any block of heads (tensor parallel) and of sequence rows (sequence parallel). Row (b, s) is at       \
	 * position p = pos[b * pos_stride + s] (pos points at this block's first id; pos_stride is the length   \
	 * of a row of the ids tensor, 0 when one row serves every sample), or, when pos is NULL, its position   \
	 * in the whole sequence 0, 1, ..: p = pos_off + s for the rows s < seq / 2 and pos_off2 + s - seq / 2   \
	 * for the others (the block's two halves start at pos_off and pos_off2: pos_off + seq / 2 unless the   \
	 * block is a balanced context-parallel ring's two mirrored chunks). The first rot_dim (even)           \
	 * entries of each head rotate, the rest pass through (GPT-NeoX rotary_pct; Llama: rot_dim = head_dim): \
	 * with h = rot_dim / 2, a_i = p theta^(-2i / rot_dim), i < h,                                          \
	 *   y[i] = x[i] cos a_i - x[i + h] sin a_i,   y[i + h] = x[i + h] cos a_i + x[i] sin a_i.               \
	 * The angles are computed here: _f32 exactly as transformers' LlamaRotaryEmbedding does, in float       \
	 * (inv_freq = 1 / powf(theta, (float)2i / rot_dim), a = (float)p * inv_freq, cosf, sinf), _f64 in       \
	 * double. The gradient is the rotation by -a (dx overwritten). In place ok. */                          \
	void planrt_k_rope_##S(const T *x, T *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,     \
			       int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off, \
			       int64_t pos_off2, double theta);                                                 \
	void planrt_k_rope_grad_##S(const T *dy, T *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, \
				    int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride,     \
				    int64_t pos_off, int64_t pos_off2, double theta);                           \
	/* torch.nn.functional.mse_loss / l1_loss: return scale * the sum of (x - target)^2 (|x - target|).      \
	 * torch's default mean reduction is scale = 1 / the number of elements of the whole batch (the program  \
	 * all-reduces the partial losses of a split batch). The gradients: dx = dscale * 2 (x - target)        \
	 * (dscale * sign(x - target), 0 where they are equal, as torch), dtarget = -dx (NULL: not wanted), both \
	 * overwritten. */                                                                                      \
	double planrt_k_mse_loss_##S(const T *x, const T *target, int64_t n, double scale);                      \
	void planrt_k_mse_loss_grad_##S(const T *x, const T *target, int64_t n, double dscale, T *dx, T *dtarget);  \
	double planrt_k_l1_loss_##S(const T *x, const T *target, int64_t n, double scale);                       \
	void planrt_k_l1_loss_grad_##S(const T *x, const T *target, int64_t n, double dscale, T *dx, T *dtarget);   \
	/* torch.nn.functional.cross_entropy over classes with class-index labels: logits [rows, classes],       \
	 * labels int32[rows] (rows = samples), see PLANRT_CE_CLASSES above. */                                  \
	PLANRT_CE_CLASSES(T, float, S)                                                                          \
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
	/* Fused attention (cpu/attention_impl.h, FlashAttention-2's tiling): q [.., H, Sq, Dh] (ldims, rank \
	 * dims), k and v [.., kv_heads, sk, Dh] -> out [.., H, Sq, Dh] and lse [.., H, Sq], the scores never \
	 * stored. mask_kind 0 none, 1 causal (offs[rank - 2]: the query rows' global offset), 2 additive   \
	 * mask (mask_strides: per dim of the local scores, 0 to broadcast). Dropout p on the probabilities \
	 * as planrt_k_dropout on the scores' global shape gdims at block offsets offs. The gradient        \
	 * overwrites dq, dk and dv. scratch: see attention_impl.h. */                                     \
	void planrt_k_attention_##S(const T *q, const T *k, const T *v, const T *mask, const int64_t *mask_strides, \
				    T *out, T *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk, \
				    double scale, int mask_kind, double p, uint64_t seed, uint64_t key,         \
				    const int64_t *gdims, const int64_t *offs, void *scratch);                  \
	void planrt_k_attention_grad_##S(const T *q, const T *k, const T *v, const T *mask,                      \
					 const int64_t *mask_strides, const T *out, const T *lse, const T *dout, \
					 T *dq, T *dk, T *dv, int rank, const int64_t *ldims, int64_t kv_heads,   \
					 int64_t sk, double scale, int mask_kind, double p, uint64_t seed,        \
					 uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch); \
	/* Ring attention (context parallelism): the call above on the K/V block of ring step `step` of  \
	 * `size`, the block of coordinate s = (coord - step) mod size: keys from global s * sk, or, when  \
	 * mirrored (causal load balancing), the chunks s and 2 size - 1 - s of 2 size; the forward merges \
	 * into out and lse after step 0, the gradient accumulates dq after step 0 and writes the block's  \
	 * dk, dv. */                                                                                       \
	void planrt_k_ring_attention_##S(const T *q, const T *k, const T *v, const T *mask,                     \
					 const int64_t *mask_strides, T *out, T *lse, int rank, const int64_t *ldims, \
					 int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p,     \
					 uint64_t seed, uint64_t key, const int64_t *gdims, const int64_t *offs,  \
					 void *scratch, int64_t coord, int step, int size, int mirrored);            \
	void planrt_k_ring_attention_grad_##S(const T *q, const T *k, const T *v, const T *mask,                \
					      const int64_t *mask_strides, const T *out, const T *lse,           \
					      const T *dout, T *dq, T *dk, T *dv, int rank, const int64_t *ldims, \
					      int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, \
					      uint64_t seed, uint64_t key, const int64_t *gdims,                 \
					      const int64_t *offs, void *scratch, int64_t coord, int step, int size, \
					      int mirrored);                                                      \
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
	/* out = in permuted: out dim i is in dim perm[i]. The gradient is the inverse permutation of dy. A      \
	 * transpose of dims i and j (torch.transpose) is the identity perm with i and j swapped, its own        \
	 * inverse. */                                                                                          \
	void planrt_k_permute_##S(int rank, const int64_t *in_dims, const int *perm, const T *in, T *out);       \
	/* Mixture of experts (Switch / GShard; docs/moe.md). probs = softmax(logits [T, E]); each token's     \
	 * top_k experts by descending probability (ties: the lower index); gate_j = probs[e_j], or with       \
	 * normalize probs[e_j] / the sum of the token's top_k probs (GShard top-2, Mixtral). Tokens come in    \
	 * groups of `group` consecutive rows (one sample). capacity > 0: each expert takes at most capacity    \
	 * (token, choice) pairs per group, in the order every token's first choice in token order, then every  \
	 * second choice, ... (GShard); a later pair is dropped (idx -1), else idx = e * slots + g * capacity + \
	 * slot, slots = groups * capacity. capacity = 0 (dropless): every pair is kept, packed per expert in   \
	 * the same order over all tokens, idx = e * tokens + position. counts [E] (NULL: not wanted): pairs   \
	 * kept per expert; stats (NULL: not wanted): stats[0] += pairs dropped, stats[1 + e] += pairs routed  \
	 * to e before any drop. */                                                                            \
	void planrt_k_moe_route_##S(const T *logits, int64_t tokens, int64_t experts, int64_t top_k, int64_t group, \
				    int64_t capacity, int normalize, T *gates, int32_t *idx, int32_t *counts,       \
				    double *stats);                                                            \
	void planrt_k_moe_dispatch_##S(const T *x, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim, \
				       int64_t slots, T *buf);             /* buf [slots, dim] overwritten */   \
	void planrt_k_moe_dispatch_grad_##S(const T *dbuf, const int32_t *idx, int64_t tokens, int64_t top_k,      \
					    int64_t dim, T *dx);                   /* dx overwritten */           \
	void planrt_k_moe_combine_##S(const T *buf, const T *gates, const int32_t *idx, int64_t tokens,           \
				      int64_t top_k, int64_t dim, T *out);                                     \
	void planrt_k_moe_combine_grad_##S(const T *dout, const T *buf, const T *gates, const int32_t *idx,        \
					   int64_t tokens, int64_t top_k, int64_t dim, int64_t slots, T *dbuf,    \
					   T *dgates);                                                         \
	/* d(gates)/d(logits) through the normalisation and the softmax, for the chosen experts (recomputed    \
	 * from the logits). dlogits overwritten. */                                                            \
	void planrt_k_moe_route_grad_##S(const T *logits, const T *dgates, int64_t tokens, int64_t experts,       \
					 int64_t top_k, int normalize, T *dlogits);                              \
	/* Switch load-balancing loss per group: E * sum_e f_e P_e (f_e: fraction of the group's tokens whose  \
	 * first choice is e, before any drop; P_e: the group's mean router probability); returns scale times   \
	 * the sum over the groups. The gradient times dscale overwrites dlogits. */                           \
	double planrt_k_moe_aux_loss_##S(const T *logits, int64_t tokens, int64_t experts, int64_t group,         \
					 double scale);                                                        \
	void planrt_k_moe_aux_loss_grad_##S(const T *logits, int64_t tokens, int64_t experts, int64_t group,       \
					    double dscale, T *dlogits);                                        \
	/* Router z-loss (ST-MoE): scale * the sum over tokens of logsumexp(logits)^2; the gradient times       \
	 * dscale overwrites dlogits. */                                                                        \
	double planrt_k_moe_z_loss_##S(const T *logits, int64_t tokens, int64_t experts, double scale);          \
	void planrt_k_moe_z_loss_grad_##S(const T *logits, int64_t tokens, int64_t experts, double dscale,        \
					  T *dlogits);

PLANRT_KERNELS(float, f32)
PLANRT_KERNELS(double, f64)
/* permute of 2-byte elements (bf16, f16) as they are stored: a bf16 or f16 program's split and merge
 * of heads move values without widening them (the bits of widening, permuting and narrowing, but
 * for a NaN's payload, which it keeps) */
void planrt_k_permute_16(int rank, const int64_t *in_dims, const int *perm, const void *in, void *out);

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
PLANRT_CE_CLASSES(double, double, f64d)

/* Class-index labels against [0, classes): returns the number of bad ones (outside the range and not
 * ignore_index), the first one's index and value in *bad_index, *bad_value (left alone when there are
 * none), and in *valid (NULL: not wanted) the number that count, in range and not ignore_index: what
 * torch's mean cross-entropy divides by. planrt_k_cross_entropy checks its labels itself; the
 * vocab-parallel pieces (planrt_k_ce_*) do not, so a program calls this on their targets. */
int64_t planrt_k_check_labels(const int32_t *labels, int64_t n, int64_t classes, int32_t ignore_index, int64_t *valid,
			      int64_t *bad_index, int32_t *bad_value);

/* Generation (cpu/decode.c, docs/generate.md). Decode attention with a key/value cache: q [batch,
 * heads, 1, head_dim], k and v [batch, kv_heads, 1, head_dim] of the token at position pos[b]; the
 * caches [batch, kv_heads, tmax, head_dim]. Writes k and v into row pos[b] of the caches, then
 * out[b, h] = softmax(scale * q . kcache[0 .. pos[b]]) @ vcache[0 .. pos[b]] (causal by
 * construction; query head h reads kv head h / (heads / kv_heads), grouped-query attention). O(t)
 * per token: the earlier positions' keys and values are read from the caches, never recomputed.
 * Returns the first b whose position is outside [0, tmax), or -1. */
int64_t planrt_k_decode_attention_f32(const float *q, const float *k, const float *v, float *kcache, float *vcache,
				      float *out, const int32_t *pos, int64_t batch, int64_t heads, int64_t kv_heads,
				      int64_t head_dim, int64_t tmax, double scale);
/* The next token from one row of logits [vocab]: temperature <= 0 is greedy (the first largest
 * logit, torch.argmax); otherwise softmax(logits / temperature) over the top_k largest (top_k <= 0
 * or >= vocab: all of them; exactly k, ties at the k-th taken in index order), drawn with
 * Philox(seed, key "generate", counter = draw): the same token for the same (seed, draw) on every
 * rank and plan. */
int32_t planrt_sample_token(const float *logits, int64_t vocab, double temperature, int64_t top_k, uint64_t seed,
			    uint64_t draw);

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
