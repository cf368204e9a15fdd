/* attention_cuda.cu: the CUDA target's fused attention (graph/attention.c's op), forward and
 * backward, in two forms.
 *
 * The tiles (planrt_attention_tiles.h, tested on the host by tests/cuda/test_attention_tiles.c): a
 * block of 128 threads per 64 query rows (forward, dq) or 64 key rows of a kv head (dk, dv), the
 * products on the tensor cores, the softmax on the tile in shared memory. attention_16 and
 * attention_grad_16 take them when the head dim is a multiple of 16 up to 128 and the device has
 * the shared memory a block needs; PLANRT_ATTENTION=exact turns them off (docs/gpu.md).
 *
 * The exact kernels, with the per-row arithmetic of planrt_attention_math.h (which the host test
 * tests/cuda/test_attention_math.c checks against the CPU kernels): one thread per query row
 * (forward, dq) or per key row of a kv head (dk, dv), every key or query walked with an online
 * softmax in f32 FMA. They take f32 storage, the ring's steps and what the tiles do not.
 * Either way the scores are never stored, so memory is the CPU kernel's (the output and each row's
 * logsumexp).
 *
 * The ring's kernels (context parallelism, compiler/lower/ring.c) are the same kernels over the
 * block of keys the ring holds at a step (attn_ring_keys: its global key positions): the forward
 * merges its rows into out and lse after the first step, the backward adds to dq and writes the
 * block's dk, dv partial. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_kernels.h"
#include "planrt_attention_math.h"
#include "planrt_attention_tiles.h"

#include <stdlib.h>
#include <string.h>

__global__ static void attention_forward_kernel(AttnParams a, const void *q, const void *k, const void *v,
						const float *mask, int merge, void *out, float *lse, int64_t rows)
{
	GRID_STRIDE(r, rows)
	{
		int64_t i = r % a.sq, bh = r / a.sq;
		attn_forward_row(&a, q, k, v, mask, bh / a.heads, bh % a.heads, i, merge, out, lse);
	}
}

struct AttnInputs {
	const void *t[6]; /* q, k, v, out, lse (f32), dout */
};

__global__ static void attention_dq_kernel(AttnParams a, AttnInputs in, const float *mask, int accumulate, void *dq,
					   int64_t rows)
{
	GRID_STRIDE(r, rows)
	{
		int64_t i = r % a.sq, bh = r / a.sq;
		attn_dq_row(&a, in.t, mask, bh / a.heads, bh % a.heads, i, accumulate, dq);
	}
}

__global__ static void attention_dkdv_kernel(AttnParams a, AttnInputs in, const float *mask, void *dk, void *dv,
					     int64_t rows)
{
	GRID_STRIDE(r, rows)
	{
		int64_t j = r % a.sk, bh = r / a.sk;
		attn_dkdv_row(&a, in.t, mask, bh / a.kv_heads, bh % a.kv_heads, j, dk, dv);
	}
}

static AttnParams attention_params(int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk, double scale,
				   int mask_kind, const int64_t *mask_strides, double p, uint64_t seed, uint64_t key,
				   const int64_t *gdims, const int64_t *offs)
{
	AttnParams a;
	if (planrt_evaluating_)
		p = 0;
	if (!attn_params(&a, rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims, offs))
		planrt_fatal("attention: rank %d, head dim %lld or heads not a multiple of kv_heads %lld is outside what "
			     "the CUDA kernel takes (rank <= %d, head dim <= %d)",
			     rank, (long long)ldims[rank - 1], (long long)kv_heads, ATTN_MAX_RANK, ATTN_MAX_DH);
	return a;
}

/* the forward over a call's parameters (a ring step: merge after the first) */
static void attention_forward(const AttnParams *a, const void *q, const void *k, const void *v, const float *mask,
			      int merge, void *out, float *lse, int stream)
{
	int64_t rows = a->nlead * a->heads * a->sq;
	LAUNCH(attention_forward_kernel, rows, stream, *a, q, k, v, mask, merge, out, lse, rows);
}

/* the backward over a call's parameters (a ring step: dq accumulated after the first) */
static void attention_backward(const AttnParams *a, const void *const *t, const float *mask, int accumulate, void *dq,
			       void *dk, void *dv, int stream)
{
	AttnInputs in = {{t[0], t[1], t[2], t[3], t[4], t[5]}};
	int64_t qrows = a->nlead * a->heads * a->sq, krows = a->nlead * a->kv_heads * a->sk;
	LAUNCH(attention_dq_kernel, qrows, stream, *a, in, mask, accumulate, dq, qrows);
	LAUNCH(attention_dkdv_kernel, krows, stream, *a, in, mask, dk, dv, krows);
}

static void ring_keys(AttnParams *a, int64_t coord, int step, int size, int mirrored)
{
	if (!attn_ring_keys(a, coord, step, size, mirrored))
		planrt_fatal("ring attention: step %d or coordinate %lld out of range for a ring of %d", step,
			     (long long)coord, size);
}

void planrt_cu_k_attention_f32(const float *q, const float *k, const float *v, const float *mask,
			       const int64_t *mask_strides, float *out, float *lse, int rank, const int64_t *ldims,
			       int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
			       uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch, int stream)
{
	(void)scratch;
	AttnParams a = attention_params(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					offs);
	attention_forward(&a, q, k, v, mask, 0, out, lse, stream);
}

void planrt_cu_k_attention_grad_f32(const float *q, const float *k, const float *v, const float *mask,
				    const int64_t *mask_strides, const float *out, const float *lse, const float *dout,
				    float *dq, float *dk, float *dv, int rank, const int64_t *ldims, int64_t kv_heads,
				    int64_t sk, double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				    const int64_t *gdims, const int64_t *offs, void *scratch, int stream)
{
	(void)scratch;
	AttnParams a = attention_params(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					offs);
	const void *t[6] = {q, k, v, out, lse, dout};
	attention_backward(&a, t, mask, 0, dq, dk, dv, stream);
}

void planrt_cu_k_ring_attention_f32(const float *q, const float *k, const float *v, const float *mask,
				    const int64_t *mask_strides, float *out, float *lse, int rank, const int64_t *ldims,
				    int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
				    uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord,
				    int step, int size, int mirrored, int stream)
{
	(void)scratch;
	AttnParams a = attention_params(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					offs);
	ring_keys(&a, coord, step, size, mirrored);
	attention_forward(&a, q, k, v, mask, step > 0, out, lse, stream);
}

void planrt_cu_k_ring_attention_grad_f32(const float *q, const float *k, const float *v, const float *mask,
					 const int64_t *mask_strides, const float *out, const float *lse,
					 const float *dout, float *dq, float *dk, float *dv, int rank, const int64_t *ldims,
					 int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
					 uint64_t key, const int64_t *gdims, const int64_t *offs, void *scratch,
					 int64_t coord, int step, int size, int mirrored, int stream)
{
	(void)scratch;
	AttnParams a = attention_params(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					offs);
	ring_keys(&a, coord, step, size, mirrored);
	const void *t[6] = {q, k, v, out, lse, dout};
	attention_backward(&a, t, mask, step > 0, dq, dk, dv, stream);
}

/* The tiled kernels (planrt_attention_tiles.h): one block of ATTN_TILE_THREADS per tile, its shared
 * memory dynamic (attn_tiles_carve's bytes). */
extern __shared__ __align__(128) unsigned char attn_tile_smem[];

__global__ static void __launch_bounds__(ATTN_TILE_THREADS)
	attention_tile_forward_kernel(AttnParams a, const void *q, const void *k, const void *v, const float *mask,
				      void *out, float *lse)
{
	attn_tile_forward_block(&a, q, k, v, mask, out, lse, blockIdx.x, (int)threadIdx.x, attn_tile_smem);
}

__global__ static void __launch_bounds__(ATTN_TILE_THREADS)
	attention_tile_dq_kernel(AttnParams a, AttnInputs in, const float *mask, void *dq)
{
	attn_tile_dq_block(&a, in.t, mask, dq, blockIdx.x, (int)threadIdx.x, attn_tile_smem);
}

__global__ static void __launch_bounds__(ATTN_TILE_THREADS)
	attention_tile_dkdv_kernel(AttnParams a, AttnInputs in, const float *mask, void *dk, void *dv)
{
	attn_tile_dkdv_block(&a, in.t, mask, dk, dv, blockIdx.x, (int)threadIdx.x, attn_tile_smem);
}

/* Whether the tiles take a 16-bit call: PLANRT_ATTENTION (unset or "tiles": yes; "exact": no),
 * attn_tiles_take, every block's shared memory within the device's opt-in limit and the grid
 * within one dimension. Sets a->tile_vec when every operand is 16-byte aligned. */
static int tiles_take(AttnParams *a, const void *const *operands, int n)
{
	static int mode = -1, smem_limit = 0;
	if (mode < 0) {
		const char *e = getenv("PLANRT_ATTENTION");
		if (e && *e && strcmp(e, "exact") && strcmp(e, "tiles"))
			planrt_fatal("PLANRT_ATTENTION=%s: expected exact (the exact kernels) or tiles (the default)", e);
		int dev = 0;
		planrt_cu_check_(cudaGetDevice(&dev), "cudaGetDevice");
		planrt_cu_check_(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
				 "cudaDeviceGetAttribute");
		mode = !(e && !strcmp(e, "exact"));
	}
	AttnTiles t;
	int64_t tiles = (a->sq > a->sk ? a->sq : a->sk) / ATTN_TILE + 1;
	if (!mode || !attn_tiles_take(a) || (int64_t)attn_tiles_carve(&t, NULL, a->dh, ATTN_TILES_DKDV) > smem_limit ||
	    tiles * a->nlead * a->heads > INT32_MAX)
		return 0;
	a->tile_vec = 1;
	for (int i = 0; i < n; i++)
		if ((uintptr_t)operands[i] % 16)
			a->tile_vec = 0;
	return 1;
}

/* launches a tile kernel over `blocks` blocks of the kind's shared memory (raising the kernel's
 * dynamic shared-memory limit the first time it needs more) */
#define TILE_LAUNCH(kernel, which, blocks, a, stream, ...)                                                      \
	do {                                                                                                    \
		static int kernel##_smem = 0;                                                                   \
		AttnTiles t_;                                                                                   \
		int bytes_ = (int)attn_tiles_carve(&t_, NULL, (a)->dh, which);                                  \
		if (bytes_ > kernel##_smem) {                                                                   \
			planrt_cu_check_(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, \
							      bytes_),                                          \
					 "cudaFuncSetAttribute");                                               \
			kernel##_smem = bytes_;                                                                 \
		}                                                                                               \
		if ((blocks) > 0) {                                                                             \
			kernel<<<(unsigned)(blocks), ATTN_TILE_THREADS, (size_t)bytes_, planrt_cu_stream(stream)>>>(  \
				__VA_ARGS__);                                                                   \
			planrt_cu_check_launch(#kernel);                                                        \
		}                                                                                               \
	} while (0)

static void tiles_forward(const AttnParams *a, const void *q, const void *k, const void *v, const float *mask,
			  void *out, float *lse, int stream)
{
	int64_t blocks = (a->sq + ATTN_TILE - 1) / ATTN_TILE * a->nlead * a->heads;
	TILE_LAUNCH(attention_tile_forward_kernel, ATTN_TILES_FORWARD, blocks, a, stream, *a, q, k, v, mask, out, lse);
}

static void tiles_backward(const AttnParams *a, const void *const *t, const float *mask, void *dq, void *dk, void *dv,
			   int stream)
{
	AttnInputs in = {{t[0], t[1], t[2], t[3], t[4], t[5]}};
	int64_t qblocks = (a->sq + ATTN_TILE - 1) / ATTN_TILE * a->nlead * a->heads;
	int64_t kblocks = (a->sk + ATTN_TILE - 1) / ATTN_TILE * a->nlead * a->kv_heads;
	TILE_LAUNCH(attention_tile_dq_kernel, ATTN_TILES_DQ, qblocks, a, stream, *a, in, mask, dq);
	TILE_LAUNCH(attention_tile_dkdv_kernel, ATTN_TILES_DKDV, kblocks, a, stream, *a, in, mask, dk, dv);
}

/* the 16-bit variants: q, k, v, out, dout, dq, dk, dv stored as `storage`; the tiles where they take
 * the call, else each element widened as it is read and rounded once as it is written
 * (planrt_attention_math.h's attn_ld / attn_st) */
static AttnParams attention_params_16(int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk, double scale,
				      int mask_kind, const int64_t *mask_strides, double p, uint64_t seed, uint64_t key,
				      const int64_t *gdims, const int64_t *offs, planrt_dtype_t storage)
{
	if (storage != planrt_bf16 && storage != planrt_f16)
		planrt_fatal("attention_16: storage type %d is not bf16 or f16", (int)storage);
	AttnParams a = attention_params(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					offs);
	a.storage = storage == planrt_bf16 ? ATTN_BF16 : ATTN_F16;
	return a;
}

void planrt_cu_k_attention_16(const void *q, const void *k, const void *v, const float *mask,
			      const int64_t *mask_strides, void *out, float *lse, int rank, const int64_t *ldims,
			      int64_t kv_heads, int64_t sk, double scale, int mask_kind, double p, uint64_t seed,
			      uint64_t key, const int64_t *gdims, const int64_t *offs, uint8_t *scratch,
			      planrt_dtype_t storage, int stream)
{
	(void)scratch;
	AttnParams a = attention_params_16(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					   offs, storage);
	const void *operands[4] = {q, k, v, out};
	if (tiles_take(&a, operands, 4))
		tiles_forward(&a, q, k, v, mask, out, lse, stream);
	else
		attention_forward(&a, q, k, v, mask, 0, out, lse, stream);
}

void planrt_cu_k_attention_grad_16(const void *q, const void *k, const void *v, const float *mask,
				   const int64_t *mask_strides, const void *out, const float *lse, const void *dout,
				   void *dq, void *dk, void *dv, int rank, const int64_t *ldims, int64_t kv_heads,
				   int64_t sk, double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				   const int64_t *gdims, const int64_t *offs, uint8_t *scratch, planrt_dtype_t storage,
				   int stream)
{
	(void)scratch;
	AttnParams a = attention_params_16(rank, ldims, kv_heads, sk, scale, mask_kind, mask_strides, p, seed, key, gdims,
					   offs, storage);
	const void *t[6] = {q, k, v, out, lse, dout};
	const void *operands[8] = {q, k, v, out, dout, dq, dk, dv};
	if (tiles_take(&a, operands, 8))
		tiles_backward(&a, t, mask, dq, dk, dv, stream);
	else
		attention_backward(&a, t, mask, 0, dq, dk, dv, stream);
}
