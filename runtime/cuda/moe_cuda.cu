/* moe_cuda.cu: the CUDA target's mixture-of-experts kernels (planrt_cuda.h): the CPU's routing,
 * dispatch, combine, routing losses and their gradients (kernels_impl.h), the routing metrics and
 * the dropless expert exchange (moe.c) on device memory, each enqueued on the stream it is given.
 *
 * What a thread computes is planrt_moe_math.h's: a token's routing, an expert's slots, an element of
 * a dispatched or combined row, a token's gradient row. Those functions do the CPU kernels'
 * arithmetic in the CPU's order, and tests/cuda/test_moe_math.c runs them on the host against the
 * CPU kernels. The sums over tokens or experts that the CPU takes in order (the losses) are taken
 * here in the same order by one thread over values the block computed in parallel; integer counts
 * (pairs routed and dropped) are exact in any order. So the routing (idx, counts, metrics) is the
 * CPU's exactly and the values are the CPU's up to the device's kexpf and logf (within 1 ulp).
 *
 * moe_route runs a thread per token (probabilities, top_k, gates; each choice left in idx as a
 * code), then one block whose threads each walk one expert's pairs in the drop order (docs/moe.md)
 * and give them slots: the drop order is a sequential rule per expert, and experts are independent.
 * The block walks the order piece by piece out of shared memory (a piece's codes are read by all,
 * then each expert writes only its own pairs' slots back), so each expert's serial walk reads
 * shared memory, not global memory.
 *
 * The dropless exchange needs a host-side decision: the counts exchanged first size the rows'
 * all-to-all. planrt_cu_moe_exchange therefore synchronises its stream (the comm stream) after the
 * counts' all-to-all and reads them to the host, then packs the rows, sends them with ncclSend /
 * ncclRecv in one group (planrt_alltoallv_on) and unpacks them, all on that stream. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_moe_math.h"

#include <stdlib.h>
#include <string.h>

/* MOE_THREADS: the blocks that sum in order; ROUTE_THREADS, ROUTE_PIECE: the routing's expert pass
 * (at most that many experts walk at once; a piece of the drop order in shared memory) */
enum { MOE_THREADS = 256, ROUTE_THREADS = 1024, ROUTE_PIECE = 2048 };

static void zero(void *p, size_t bytes, int stream)
{
	if (bytes)
		planrt_cu_check_(cudaMemsetAsync(p, 0, bytes, planrt_cu_stream(stream)), "cudaMemsetAsync");
}

static void check_groups(const char *what, int64_t tokens, int64_t group)
{
	if (group <= 0 || tokens % group)
		planrt_fatal("%s: tokens are not a whole number of groups", what);
}

static void check_top_k(const char *what, int64_t top_k, int64_t experts)
{
	if (top_k < 1 || top_k > experts || top_k > PLANRT_MOE_MAX_TOP_K)
		planrt_fatal("%s: top_k = %lld is outside 1 to min(experts = %lld, %d), what the CUDA target takes", what,
			     (long long)top_k, (long long)experts, (int)PLANRT_MOE_MAX_TOP_K);
}

/* ------------------------------------------------------------------ routing */

__global__ static void route_tokens_kernel(const float *logits, int64_t tokens, int64_t experts, int64_t top_k,
					   int normalize, float *gates, int32_t *idx)
{
	GRID_STRIDE(t, tokens)
	planrt_moe_route_token(logits, t, experts, top_k, normalize, gates, idx);
}

/* One block, a thread per expert (experts beyond blockDim.x in further rounds): the drop order's
 * pieces are copied to shared memory one at a time, then every thread walks the piece for its
 * expert; the pairs dropped are summed over the block. */
__global__ static void __launch_bounds__(ROUTE_THREADS) route_experts_kernel(int32_t *idx, int64_t tokens, int64_t experts, int64_t top_k, int64_t group,
					    int64_t capacity, int32_t *counts, double *stats)
{
	__shared__ int32_t codes[ROUTE_PIECE];
	__shared__ long long dropped[ROUTE_THREADS];
	long long mine = 0;
	int64_t pieces = top_k * ((group + ROUTE_PIECE - 1) / ROUTE_PIECE); /* per group */
	for (int64_t base = 0; base < experts; base += blockDim.x) {
		int64_t e = base + threadIdx.x, c = 0, routed = 0, kept = 0;
		for (int64_t g0 = 0; g0 < tokens; g0 += group) {
			if (capacity > 0)
				c = 0;
			for (int64_t i = 0; i < pieces; i++) {
				int64_t t0, k, n = planrt_moe_drop_order(g0, group, ROUTE_PIECE, i, &t0, &k);
				__syncthreads(); /* the previous piece is walked */
				for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
					codes[j] = idx[(t0 + j) * top_k + k];
				__syncthreads();
				if (e < experts)
					planrt_moe_assign_piece(codes, n, t0, k, tokens, top_k, group, capacity, e, &c, &routed,
								&kept, idx);
			}
		}
		if (e < experts) {
			if (counts)
				counts[e] = (int32_t)kept;
			if (stats)
				stats[1 + e] += (double)routed;
			mine += routed - kept;
		}
	}
	dropped[threadIdx.x] = mine;
	__syncthreads();
	if (threadIdx.x == 0 && stats) {
		long long sum = 0;
		for (unsigned i = 0; i < blockDim.x; i++)
			sum += dropped[i];
		stats[0] += (double)sum;
	}
}

void planrt_cu_k_moe_route_f32(const float *logits, int64_t tokens, int64_t experts, int64_t top_k, int64_t group,
			       int64_t capacity, int normalize, float *gates, int32_t *idx, int32_t *counts, double *stats,
			       int stream)
{
	check_groups("moe_route", tokens, group);
	check_top_k("moe_route", top_k, experts);
	if (tokens <= 0)
		return;
	LAUNCH(route_tokens_kernel, tokens, stream, logits, tokens, experts, top_k, normalize, gates, idx);
	int64_t threads = (experts + 31) / 32 * 32; /* a thread per expert, whole warps */
	threads = threads < ROUTE_THREADS ? threads : ROUTE_THREADS;
	route_experts_kernel<<<1, (unsigned)threads, 0, planrt_cu_stream(stream)>>>(idx, tokens, experts, top_k, group,
										     capacity, counts, stats);
	planrt_cu_check_launch("route_experts_kernel");
}

__global__ static void route_grad_kernel(const float *logits, const float *dgates, int64_t tokens, int64_t experts,
					 int64_t top_k, int normalize, float *dlogits)
{
	GRID_STRIDE(t, tokens)
	planrt_moe_route_grad_token(logits, dgates, t, experts, top_k, normalize, dlogits);
}

void planrt_cu_k_moe_route_grad_f32(const float *logits, const float *dgates, int64_t tokens, int64_t experts,
				    int64_t top_k, int normalize, float *dlogits, int stream)
{
	check_top_k("moe_route_grad", top_k, experts);
	LAUNCH(route_grad_kernel, tokens, stream, logits, dgates, tokens, experts, top_k, normalize, dlogits);
}

/* ------------------------------------------------------------------ dispatch and combine */

__global__ static void dispatch_kernel(const float *x, const int32_t *idx, int64_t top_k, int64_t dim, int64_t n,
				       float *buf)
{
	GRID_STRIDE(q, n)
	planrt_moe_dispatch_elem(x, idx, top_k, dim, q, buf);
}

void planrt_cu_k_moe_dispatch_f32(const float *x, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
				  int64_t slots, float *buf, int stream)
{
	zero(buf, sizeof(float) * (size_t)(slots * dim), stream);
	int64_t n = tokens * top_k * dim;
	LAUNCH(dispatch_kernel, n, stream, x, idx, top_k, dim, n, buf);
}

__global__ static void dispatch_grad_kernel(const float *dbuf, const int32_t *idx, int64_t top_k, int64_t dim, int64_t n,
					    float *dx)
{
	GRID_STRIDE(q, n)
	dx[q] = planrt_moe_dispatch_grad_elem(dbuf, idx, top_k, dim, q);
}

void planrt_cu_k_moe_dispatch_grad_f32(const float *dbuf, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
				       float *dx, int stream)
{
	int64_t n = tokens * dim;
	LAUNCH(dispatch_grad_kernel, n, stream, dbuf, idx, top_k, dim, n, dx);
}

__global__ static void combine_kernel(const float *buf, const float *gates, const int32_t *idx, int64_t top_k,
				      int64_t dim, int64_t n, float *out)
{
	GRID_STRIDE(q, n)
	out[q] = planrt_moe_combine_elem(buf, gates, idx, top_k, dim, q);
}

void planrt_cu_k_moe_combine_f32(const float *buf, const float *gates, const int32_t *idx, int64_t tokens, int64_t top_k,
				 int64_t dim, float *out, int stream)
{
	int64_t n = tokens * dim;
	LAUNCH(combine_kernel, n, stream, buf, gates, idx, top_k, dim, n, out);
}

__global__ static void combine_grad_rows_kernel(const float *dout, const float *gates, const int32_t *idx, int64_t top_k,
						int64_t dim, int64_t n, float *dbuf)
{
	GRID_STRIDE(q, n)
	planrt_moe_combine_grad_elem(dout, gates, idx, top_k, dim, q, dbuf);
}

__global__ static void combine_grad_gates_kernel(const float *dout, const float *buf, const int32_t *idx, int64_t top_k,
						 int64_t dim, int64_t pairs, float *dgates)
{
	GRID_STRIDE(i, pairs)
	dgates[i] = planrt_moe_combine_dgate(dout, buf, idx, top_k, dim, i);
}

void planrt_cu_k_moe_combine_grad_f32(const float *dout, const float *buf, const float *gates, const int32_t *idx,
				      int64_t tokens, int64_t top_k, int64_t dim, int64_t slots, float *dbuf, float *dgates,
				      int stream)
{
	zero(dbuf, sizeof(float) * (size_t)(slots * dim), stream);
	int64_t pairs = tokens * top_k, n = pairs * dim;
	LAUNCH(combine_grad_rows_kernel, n, stream, dout, gates, idx, top_k, dim, n, dbuf);
	LAUNCH(combine_grad_gates_kernel, pairs, stream, dout, buf, idx, top_k, dim, pairs, dgates);
}

/* ------------------------------------------------------------------ routing losses */

/* One block: per group, the threads compute f_e P_e for a chunk of experts and thread 0 adds them in
 * expert order, as the CPU does; *loss = (float)(scale * the sum over groups of E * l). */
__global__ static void aux_loss_kernel(const float *logits, int64_t tokens, int64_t experts, int64_t group, double scale,
				       float *loss)
{
	__shared__ double prod[MOE_THREADS];
	double total = 0, l = 0;
	for (int64_t g0 = 0; g0 < tokens; g0 += group) {
		l = 0;
		for (int64_t base = 0; base < experts; base += blockDim.x) {
			int64_t e = base + threadIdx.x;
			if (e < experts) {
				double f, P;
				planrt_moe_group_fp(logits + g0 * experts, group, experts, e, &f, &P);
				prod[threadIdx.x] = MOE_DMUL(f, P);
			}
			__syncthreads();
			if (threadIdx.x == 0)
				for (int64_t i = 0; i < blockDim.x && base + i < experts; i++)
					l += prod[i];
			__syncthreads();
		}
		if (threadIdx.x == 0)
			total += MOE_DMUL((double)experts, l);
	}
	if (threadIdx.x == 0)
		*loss = (float)(scale * total);
}

void planrt_cu_moe_aux_loss_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group, double scale,
				float *loss, int stream)
{
	if (tokens <= 0 || experts <= 0)
		planrt_fatal("moe_aux_loss: tokens are not a whole number of groups");
	check_groups("moe_aux_loss", tokens, group);
	aux_loss_kernel<<<1, MOE_THREADS, 0, planrt_cu_stream(stream)>>>(logits, tokens, experts, group, scale, loss);
	planrt_cu_check_launch("aux_loss_kernel");
}

/* A block per group (grid-stride over groups): the group's fractions f into shared memory, then a
 * thread per token. */
__global__ static void aux_loss_grad_kernel(const float *logits, int64_t tokens, int64_t experts, int64_t group,
					    const float *dloss, double factor, float *dlogits)
{
	extern __shared__ double f[];
	double dscale = (double)dloss[0] * factor;
	double c = MOE_DMUL(dscale, (double)experts) / (double)group;
	for (int64_t g0 = (int64_t)blockIdx.x * group; g0 < tokens; g0 += (int64_t)gridDim.x * group) {
		for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
			double P;
			planrt_moe_group_fp(logits + g0 * experts, group, experts, e, &f[e], &P);
		}
		__syncthreads();
		for (int64_t t = g0 + threadIdx.x; t < g0 + group; t += blockDim.x)
			planrt_moe_aux_grad_token(logits, f, t, experts, c, dlogits);
		__syncthreads();
	}
}

void planrt_cu_k_moe_aux_loss_grad_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group,
				       const float *dloss, double factor, float *dlogits, int stream)
{
	if (tokens <= 0 || experts <= 0)
		planrt_fatal("moe_aux_loss_grad: tokens are not a whole number of groups");
	check_groups("moe_aux_loss_grad", tokens, group);
	size_t shared = sizeof(double) * (size_t)experts;
	if (shared > 48 * 1024)
		planrt_fatal("moe_aux_loss_grad: %lld experts are more than the CUDA target's %d (the group's fractions "
			     "live in a block's shared memory)",
			     (long long)experts, 48 * 1024 / (int)sizeof(double));
	int64_t groups = tokens / group;
	unsigned grid = (unsigned)(groups < 65535 ? groups : 65535);
	aux_loss_grad_kernel<<<grid, MOE_THREADS, shared, planrt_cu_stream(stream)>>>(logits, tokens, experts, group, dloss,
										       factor, dlogits);
	planrt_cu_check_launch("aux_loss_grad_kernel");
}

/* One block: the threads compute z^2 for a chunk of tokens, thread 0 adds them in token order. */
__global__ static void z_loss_kernel(const float *logits, int64_t tokens, int64_t experts, double scale, float *loss)
{
	__shared__ double zz[MOE_THREADS];
	double total = 0;
	for (int64_t base = 0; base < tokens; base += blockDim.x) {
		int64_t t = base + threadIdx.x;
		if (t < tokens) {
			double z = (double)planrt_moe_lse(logits + t * experts, experts);
			zz[threadIdx.x] = MOE_DMUL(z, z);
		}
		__syncthreads();
		if (threadIdx.x == 0)
			for (int64_t i = 0; i < blockDim.x && base + i < tokens; i++)
				total += zz[i];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		*loss = (float)(scale * total);
}

void planrt_cu_moe_z_loss_f32(const float *logits, int64_t tokens, int64_t experts, double scale, float *loss, int stream)
{
	z_loss_kernel<<<1, MOE_THREADS, 0, planrt_cu_stream(stream)>>>(logits, tokens, experts, scale, loss);
	planrt_cu_check_launch("z_loss_kernel");
}

__global__ static void z_loss_grad_kernel(const float *logits, int64_t tokens, int64_t experts, const float *dloss,
					  double factor, float *dlogits)
{
	double dscale = (double)dloss[0] * factor;
	GRID_STRIDE(t, tokens)
	planrt_moe_z_grad_token(logits, t, experts, dscale, dlogits);
}

void planrt_cu_k_moe_z_loss_grad_f32(const float *logits, int64_t tokens, int64_t experts, const float *dloss,
				     double factor, float *dlogits, int stream)
{
	LAUNCH(z_loss_grad_kernel, tokens, stream, logits, tokens, experts, dloss, factor, dlogits);
}

/* ------------------------------------------------------------------ metrics and the exchange */

/* The step's routing metrics are pinned host memory (a metric state buffer) that the routing
 * kernels added to: the host writes them into the log once the stream is done with them. */
void planrt_cu_moe_metrics(const double *stats, int layers, const int64_t *experts, int stream)
{
	planrt_cu_check_(cudaStreamSynchronize(planrt_cu_stream(stream)), "the routing metrics (cudaStreamSynchronize)");
	planrt_moe_metrics(stats, layers, experts);
}

__global__ static void count_rows_kernel(const int32_t *idx, int64_t pairs, int64_t slots, int32_t *mine)
{
	GRID_STRIDE(i, pairs)
	{
		int64_t e = planrt_moe_row_expert(idx, slots, i);
		if (e >= 0)
			atomicAdd(&mine[e], 1);
	}
}

static void copy_rows(void *dst, const void *src, int64_t bytes, int stream)
{
	if (bytes > 0)
		planrt_cu_check_(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, planrt_cu_stream(stream)),
				 "cudaMemcpyAsync");
}

/* moe.c's planrt_moe_exchange on the device; scratch as there (the send and receive buffers, then the
 * counts, 8-byte aligned: mine [E] and theirs [E] int32 on the device). */
void planrt_cu_moe_exchange(const void *in, void *out, int to_experts, const int32_t *idx, int64_t pairs,
			    int64_t experts, int64_t slots, int64_t dim, planrt_dtype_t t, planrt_comm_t c, void *scratch,
			    int stream)
{
	int n = planrt_comm_size(c);
	int64_t el = experts / n, row = dim * (int64_t)planrt_dtype_size(t);
	int64_t rows = experts * slots; /* the buffer's rows, on either side */
	char *send = (char *)scratch, *recv = send + rows * row;
	uintptr_t counts_at = ((uintptr_t)(recv + rows * row) + 7) & ~(uintptr_t)7; /* within scratch's 8 (4 n + E) */
	int32_t *mine = (int32_t *)counts_at, *theirs = mine + experts;
	cudaStream_t s = planrt_cu_stream(stream);
	zero(mine, sizeof(int32_t) * (size_t)experts, stream);
	LAUNCH(count_rows_kernel, pairs, stream, idx, pairs, slots, mine);
	PLANRT_CHECK(planrt_alltoall(mine, theirs, (size_t)el, planrt_i32, c, (planrt_stream_t)s, NULL));
	/* the host decides the rows' sizes: it waits for the counts */
	size_t nh = 2 * (size_t)experts * sizeof(int32_t) + 4 * (size_t)n * sizeof(int64_t);
	char *host = (char *)malloc(nh);
	if (!host)
		planrt_fatal("moe_exchange: out of memory for %zu bytes of counts", nh);
	int32_t *hmine = (int32_t *)host, *htheirs = hmine + experts;
	int64_t *sc = (int64_t *)(htheirs + experts), *sd = sc + n, *rc = sd + n, *rd = rc + n;
	planrt_cu_check_(cudaMemcpyAsync(hmine, mine, 2 * sizeof(int32_t) * (size_t)experts, cudaMemcpyDeviceToHost, s),
			 "cudaMemcpyAsync (the expert row counts)");
	planrt_cu_check_(cudaStreamSynchronize(s), "the expert row counts (cudaStreamSynchronize)");
	planrt_moe_exchange_counts(hmine, htheirs, n, el, to_experts, dim, sc, sd, rc, rd);
	char *p = send;
	for (int r = 0; r < n; r++)
		for (int64_t e = 0; e < el; e++) {
			int64_t at, k = planrt_moe_exchange_block(hmine, htheirs, n, el, slots, to_experts, 1, r, e, &at);
			copy_rows(p, (const char *)in + at * row, k * row, stream);
			p += k * row;
		}
	PLANRT_CHECK(planrt_alltoallv_on(send, sc, sd, recv, rc, rd, t, c, (planrt_stream_t)s));
	zero(out, (size_t)(rows * row), stream);
	p = recv;
	for (int r = 0; r < n; r++)
		for (int64_t e = 0; e < el; e++) {
			int64_t at, k = planrt_moe_exchange_block(hmine, htheirs, n, el, slots, to_experts, 0, r, e, &at);
			copy_rows((char *)out + at * row, p, k * row, stream);
			p += k * row;
		}
	free(host);
}
