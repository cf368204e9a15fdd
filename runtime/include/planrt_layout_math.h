/* planrt_layout_math.h: which rows of a tensor split along one dim each block holds, contiguous or
 * as the causally balanced context-parallel ring's two mirrored chunks, as functions that compile
 * for the device (runtime/cuda/exec_cuda.cu's slice, all-gather and reduce-scatter along a dim) and
 * for the host (runtime/cpu/exec.c's, which take the chunk order from here;
 * tests/cuda/test_layout_math.c checks the device's element map against the CPU's conversions
 * over MPI).
 *
 * A tensor [outer, dim, inner] split into n blocks along dim is packed [n][outer][pieces][rows x
 * inner]: block p holds, for each outer index, its rows of dim. Contiguous (pieces = 1): block p is
 * the rows [p rows, (p + 1) rows), rows = dim / n. Mirrored (pieces = 2; docs/attention.md, "Causal
 * load balancing"): dim is cut into 2n chunks of rows = dim / 2n and block p is the chunks p and
 * 2n - 1 - p, in that order, so every rank of a causal ring meets the same number of unmasked keys
 * (Megatron-Core's layout). */
#ifndef PLANRT_LAYOUT_MATH_H
#define PLANRT_LAYOUT_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define PLANRT_LM static inline __host__ __device__
#else
#define PLANRT_LM static inline
#endif

typedef struct planrt_split_layout {
	int64_t outer, dim, inner; /* the whole tensor, as [outer, dim, inner] around the split dim */
	int64_t n;                 /* blocks */
	int mirrored;              /* two mirrored chunks a block */
} planrt_split_layout_t;

/* the chunk of the dim (in units of the block's piece rows) that piece h (0, or 1 when mirrored) of
 * block p holds */
PLANRT_LM int64_t planrt_lm_chunk(int64_t n, int mirrored, int64_t p, int h)
{
	return mirrored && h ? 2 * n - 1 - p : p;
}

/* the rows of one piece */
PLANRT_LM int64_t planrt_lm_piece_rows(planrt_split_layout_t l)
{
	return l.dim / l.n / (l.mirrored ? 2 : 1);
}

/* the elements of one block */
PLANRT_LM int64_t planrt_lm_block(planrt_split_layout_t l)
{
	return l.outer * (l.dim / l.n) * l.inner;
}

/* the element of the whole tensor that packed element q (block q / planrt_lm_block, then outer
 * index, piece, row, inner) holds */
PLANRT_LM int64_t planrt_lm_source(planrt_split_layout_t l, int64_t q)
{
	int pieces = l.mirrored ? 2 : 1;
	int64_t rows = planrt_lm_piece_rows(l), chunk = rows * l.inner, per_outer = chunk * pieces;
	int64_t block = per_outer * l.outer;
	int64_t p = q / block, r = q % block, o = r / per_outer, h = r % per_outer / chunk, k = r % chunk;
	return (o * l.dim + planrt_lm_chunk(l.n, l.mirrored, p, (int)h) * rows) * l.inner + k;
}

#endif
