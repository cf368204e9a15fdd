/* exec_cuda.cu: the CUDA target's communication kernels (planrt_cuda.h): exec.c's and step.c's
 * layout conversions, in-place collectives, ZeRO gathers, gradient buckets and pipeline transfers
 * on device memory, and the ring attention's K/V shift. The collectives are planrt's own (planrt_allreduce ... on a device stream: the
 * NCCL layer), so they are checked and counted as on the CPU; packing a split dim into [peer][block]
 * order is a kernel on the same stream. A started operation (a request argument) gets a device
 * request: its finish makes the compute stream wait for it, as the CPU's waits for MPI. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_layout_math.h"

#include <string.h>

static planrt_stream_t on(int stream)
{
	return (planrt_stream_t)planrt_cu_stream(stream);
}

/* ------------------------------------------------------------------ packing */

/* packed [p][o][piece][rows * inner] <-> the tensor [outer, dims[dim], inner] split in n blocks
 * along dim, contiguous or mirrored (planrt_layout_math.h's map, which the CPU's packing shares and
 * tests/cuda/test_layout_math.c checks), for elements of E; packed element first + q for q < count */
template <typename E>
__global__ static void pack_kernel(const E *src, E *dst, planrt_split_layout_t l, int64_t first, int to_packed,
				   int64_t count)
{
	for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < count; q += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = planrt_lm_source(l, first + q);
		if (to_packed)
			dst[q] = src[t];
		else
			dst[t] = src[q];
	}
}

static planrt_split_layout_t split_layout(int rank, const int64_t *dims, int dim, int n, int mirrored)
{
	planrt_split_layout_t l = {1, dims[dim], 1, n, mirrored};
	for (int d = 0; d < dim; d++)
		l.outer *= dims[d];
	for (int d = dim + 1; d < rank; d++)
		l.inner *= dims[d];
	return l;
}

/* packed[0, count) <-> the packed elements [first, first + count) of the tensor */
static void pack_range(const void *tensor, void *packed, planrt_split_layout_t l, int64_t first, int64_t count,
		       size_t elem, int to_packed, int stream)
{
	if (count <= 0)
		return;
	const void *src = to_packed ? tensor : packed;
	void *dst = to_packed ? packed : (void *)tensor;
	dim3 grid(planrt_cu_grid(count));
	cudaStream_t s = planrt_cu_stream(stream);
	switch (elem) {
	case 1:
		pack_kernel<uint8_t><<<grid, PLANRT_CU_BLOCK, 0, s>>>((const uint8_t *)src, (uint8_t *)dst, l, first, to_packed,
								     count);
		break;
	case 2:
		pack_kernel<uint16_t><<<grid, PLANRT_CU_BLOCK, 0, s>>>((const uint16_t *)src, (uint16_t *)dst, l, first,
								      to_packed, count);
		break;
	case 4:
		pack_kernel<uint32_t><<<grid, PLANRT_CU_BLOCK, 0, s>>>((const uint32_t *)src, (uint32_t *)dst, l, first,
								      to_packed, count);
		break;
	default:
		pack_kernel<uint64_t><<<grid, PLANRT_CU_BLOCK, 0, s>>>((const uint64_t *)src, (uint64_t *)dst, l, first,
								      to_packed, count);
		break;
	}
	planrt_cu_check_launch("pack_blocks");
}

static void pack_blocks(const void *tensor, void *packed, int rank, const int64_t *dims, int dim, int n, size_t elem,
			int to_packed, int mirrored, int stream)
{
	planrt_split_layout_t l = split_layout(rank, dims, dim, n, mirrored);
	pack_range(tensor, packed, l, 0, planrt_lm_block(l) * n, elem, to_packed, stream);
}

static int64_t count_of(int rank, const int64_t *dims)
{
	int64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= dims[d];
	return n;
}

/* ------------------------------------------------------------------ layout conversions */

void planrt_cu_allreduce_dim(const void *in, void *out, int64_t n, planrt_dtype_t t, planrt_comm_t c, int stream)
{
	PLANRT_CHECK(planrt_allreduce(in, out, (size_t)n, t, planrt_sum, c, on(stream), NULL));
}

void planrt_cu_reduce_scatter_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
				  planrt_comm_t c, void *scratch, int stream)
{
	int n = planrt_comm_size(c);
	const void *src = in;
	if (dim > 0 || mirrored) {
		pack_blocks(in, scratch, rank, dims, dim, n, planrt_dtype_size(t), 1, mirrored, stream);
		src = scratch;
	}
	PLANRT_CHECK(planrt_reduce_scatter(src, out, (size_t)(count_of(rank, dims) / n), t, planrt_sum, c, on(stream), NULL));
}

void planrt_cu_allgather_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
			     planrt_comm_t c, void *scratch, int stream)
{
	int n = planrt_comm_size(c);
	int64_t full[8] = {0};
	for (int d = 0; d < rank; d++)
		full[d] = dims[d];
	full[dim] *= n;
	size_t count = (size_t)count_of(rank, dims);
	if (dim == 0 && !mirrored) {
		PLANRT_CHECK(planrt_allgather(in, out, count, t, c, on(stream), NULL));
		return;
	}
	PLANRT_CHECK(planrt_allgather(in, scratch, count, t, c, on(stream), NULL));
	pack_blocks(out, scratch, rank, full, dim, n, planrt_dtype_size(t), 0, mirrored, stream);
}

void planrt_cu_alltoall_dim(const void *in, void *out, int rank, const int64_t *dims, int from_dim, int to_dim,
			    planrt_dtype_t t, planrt_comm_t c, void *scratch, int stream)
{
	int n = planrt_comm_size(c);
	size_t elem = planrt_dtype_size(t);
	int64_t outd[8] = {0};
	for (int d = 0; d < rank; d++)
		outd[d] = dims[d];
	outd[from_dim] *= n;
	outd[to_dim] /= n;
	int64_t count = count_of(rank, dims);
	char *send = (char *)scratch, *recv = (char *)scratch + (size_t)count * elem;
	pack_blocks(in, send, rank, dims, to_dim, n, elem, 1, 0, stream);
	PLANRT_CHECK(planrt_alltoall(send, recv, (size_t)(count / n), t, c, on(stream), NULL));
	pack_blocks(out, recv, rank, outd, from_dim, n, elem, 0, 0, stream);
}

/* this rank's block of dim (exec.c's planrt_slice_dim): a copy of rows, no communication; a
 * mirrored block (two chunks) is gathered by planrt_layout_math.h's map */
void planrt_cu_slice_dim(const void *in, void *out, int rank, const int64_t *dims, int dim, int mirrored, planrt_dtype_t t,
			 planrt_comm_t c, int stream)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	size_t elem = planrt_dtype_size(t);
	planrt_split_layout_t l = split_layout(rank, dims, dim, n, mirrored);
	if (mirrored) {
		int64_t block = planrt_lm_block(l);
		pack_range(in, out, l, (int64_t)me * block, block, elem, 1, stream);
		return;
	}
	int64_t bd = dims[dim] / n;
	size_t chunk = (size_t)(bd * l.inner) * elem;
	if (!chunk || !l.outer)
		return;
	planrt_cu_check_(cudaMemcpy2DAsync(out, chunk, (const char *)in + (size_t)(me * bd * l.inner) * elem,
					   (size_t)(dims[dim] * l.inner) * elem, chunk, (size_t)l.outer, cudaMemcpyDeviceToDevice,
					   planrt_cu_stream(stream)),
			 "cudaMemcpy2DAsync");
}

/* ------------------------------------------------------------------ in-place collectives */

static void check_idle(const char *what, const planrt_request_t *req)
{
	if (req && *req)
		planrt_fatal("internal error: %s started on a request slot whose previous request was not finished", what);
}

void planrt_cu_allreduce_inplace(void *buf, int64_t n, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				 int stream)
{
	check_idle("planrt_allreduce_inplace", req);
	PLANRT_CHECK(planrt_allreduce(buf, buf, (size_t)n, t, planrt_sum, c, on(stream), req));
}

void planrt_cu_reduce_scatter_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				      int stream)
{
	check_idle("planrt_reduce_scatter_inplace", req);
	size_t at = (size_t)(planrt_comm_rank(c) > 0 ? planrt_comm_rank(c) : 0) * (size_t)chunk * planrt_dtype_size(t);
	PLANRT_CHECK(planrt_reduce_scatter(buf, (char *)buf + at, (size_t)chunk, t, planrt_sum, c, on(stream), req));
}

void planrt_cu_allgather_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req,
				 int stream)
{
	check_idle("planrt_allgather_inplace", req);
	size_t at = (size_t)(planrt_comm_rank(c) > 0 ? planrt_comm_rank(c) : 0) * (size_t)chunk * planrt_dtype_size(t);
	PLANRT_CHECK(planrt_allgather((char *)buf + at, buf, (size_t)chunk, t, c, on(stream), req));
}

void planrt_cu_request_finish(planrt_request_t *req, int stream)
{
	(void)stream;
	planrt_request_t q = *req;
	if (!q)
		return;
	*req = NULL;
	PLANRT_CHECK(planrt_wait(q)); /* a device request: the compute stream waits for it */
}

/* ------------------------------------------------------------------ ZeRO gathers */

void planrt_cu_allgather_flat(const void *shard, void *full, int64_t n, planrt_dtype_t t, planrt_comm_t c, void *scratch,
			      int stream)
{
	int64_t chunk = planrt_flat_chunk(n, c);
	PLANRT_CHECK(planrt_allgather(shard, scratch, (size_t)chunk, t, c, on(stream), NULL));
	planrt_cu_check_(cudaMemcpyAsync(full, scratch, planrt_dtype_size(t) * (size_t)n, cudaMemcpyDeviceToDevice,
					 planrt_cu_stream(stream)),
			 "cudaMemcpyAsync");
}

void planrt_cu_allgather_flat_start(planrt_request_t *req, const void *shard, void *full, int64_t n, planrt_dtype_t t,
				    planrt_comm_t c, int stream)
{
	int64_t chunk = planrt_flat_chunk(n, c);
	PLANRT_CHECK(planrt_allgather(shard, full, (size_t)chunk, t, c, on(stream), req));
}

/* ------------------------------------------------------------------ gradient buckets */

static void copy_d2d(void *dst, const void *src, size_t bytes, int stream)
{
	if (bytes)
		planrt_cu_check_(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, planrt_cu_stream(stream)),
				 "cudaMemcpyAsync");
}

void planrt_cu_bucket_allreduce(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t, planrt_comm_t c,
				void *scratch, int stream)
{
	size_t elem = planrt_dtype_size(t), at = 0;
	for (int i = 0; i < n; i++) {
		copy_d2d((char *)scratch + at, bufs[i], elem * (size_t)counts[i], stream);
		at += elem * (size_t)counts[i];
	}
	PLANRT_CHECK(planrt_allreduce(scratch, scratch, at / elem, t, planrt_sum, c, on(stream), NULL));
	at = 0;
	for (int i = 0; i < n; i++) {
		copy_d2d(bufs[i], (char *)scratch + at, elem * (size_t)counts[i], stream);
		at += elem * (size_t)counts[i];
	}
}

/* dst[0, have) = src widened to f32 (bf16) or copied; dst[have, chunk) = 0 */
__global__ static void widen_kernel(const void *src, int bf16, float *dst, int64_t have, int64_t chunk)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < chunk; i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = i >= have ? 0.0f
			 : bf16	   ? __uint_as_float((uint32_t)((const uint16_t *)src)[i] << 16)
				   : ((const float *)src)[i];
}

void planrt_cu_bucket_reduce_scatter_start(planrt_bucket_t *b, int n, void *const *bufs, const int64_t *counts,
					   planrt_dtype_t t, int zero_source, planrt_comm_t c, void *buf, int stream)
{
	int size = planrt_comm_size(c);
	int64_t total = 0;
	for (int i = 0; i < n; i++)
		total += planrt_flat_chunk(counts[i], c);
	float *send = (float *)buf, *recv = send + (size_t)size * (size_t)total;
	cudaStream_t s = planrt_cu_stream(stream);
	for (int q = 0; q < size; q++) {
		float *at = send + (size_t)q * (size_t)total;
		for (int i = 0; i < n; i++) {
			int64_t chunk = planrt_flat_chunk(counts[i], c), lo = q * chunk, have = counts[i] - lo;
			have = have > chunk ? chunk : have < 0 ? 0 : have;
			if (chunk > 0) {
				const char *from = (const char *)bufs[i] + (size_t)(have > 0 ? lo : 0) * planrt_dtype_size(t);
				widen_kernel<<<planrt_cu_grid(chunk), PLANRT_CU_BLOCK, 0, s>>>(from, t == planrt_bf16, at, have,
											      chunk);
				planrt_cu_check_launch("bucket packing");
			}
			at += chunk;
		}
	}
	if (zero_source)
		for (int i = 0; i < n; i++)
			planrt_cu_check_(cudaMemsetAsync(bufs[i], 0, planrt_dtype_size(t) * (size_t)counts[i], s),
					 "cudaMemsetAsync");
	PLANRT_CHECK(planrt_reduce_scatter(send, recv, (size_t)total, planrt_f32, planrt_sum, c, on(stream), &b->req));
	b->active = 1;
}

void planrt_cu_bucket_reduce_scatter_finish(planrt_bucket_t *b, int n, const int64_t *counts, void *const *shards,
					    planrt_dtype_t shard_t, int accumulate, planrt_comm_t c, void *buf, int stream)
{
	if (!b->active)
		planrt_fatal("internal error: a gradient bucket finished before it started");
	PLANRT_CHECK(planrt_wait(b->req)); /* the compute stream waits for the reduce-scatter */
	b->req = NULL;
	b->active = 0;
	int size = planrt_comm_size(c);
	int64_t total = 0;
	for (int i = 0; i < n; i++)
		total += planrt_flat_chunk(counts[i], c);
	const float *at = (const float *)buf + (size_t)size * (size_t)total;
	for (int i = 0; i < n; i++) {
		int64_t chunk = planrt_flat_chunk(counts[i], c);
		if (accumulate)
			planrt_cu_accumulate_f32_(shards[i], shard_t, at, chunk, stream);
		else
			planrt_cu_cast(at, planrt_f32, shards[i], shard_t, chunk, stream);
		at += chunk;
	}
}

void planrt_cu_bucket_reduce_scatter(int n, void *const *bufs, const int64_t *counts, planrt_dtype_t t,
				     void *const *shards, planrt_dtype_t shard_t, int accumulate, int zero_source,
				     planrt_comm_t c, void *scratch, int stream)
{
	planrt_bucket_t b = {NULL, 0};
	planrt_cu_bucket_reduce_scatter_start(&b, n, bufs, counts, t, zero_source, c, scratch, stream);
	planrt_cu_bucket_reduce_scatter_finish(&b, n, counts, shards, shard_t, accumulate, c, scratch, stream);
}

/* ------------------------------------------------------------------ pipeline transfers and pairs */

static planrt_comm_t pipe_comm(const char *what)
{
	const planrt_program_t *p = planrt_cu_program_();
	planrt_comm_t c = p && p->pipe_axis >= 0 ? planrt_axis_comm(p->pipe_axis) : NULL;
	if (!c)
		planrt_fatal("internal error: %s in a program without a pipeline axis", what);
	return c;
}

void planrt_cu_p2p_send_start(const void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req,
			      int stream)
{
	PLANRT_CHECK(planrt_send_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline send"), on(stream), req));
}

void planrt_cu_p2p_recv_start(void *buf, int64_t n, planrt_dtype_t t, int peer, int channel, planrt_request_t *req,
			      int stream)
{
	PLANRT_CHECK(planrt_recv_tagged(buf, (size_t)n, t, peer, channel, pipe_comm("a pipeline receive"), on(stream), req));
}

void planrt_cu_p2p_finish(planrt_ctx_t *ctx, planrt_request_t *req, int stream)
{
	(void)ctx;
	planrt_cu_request_finish(req, stream);
}

/* The ring attention's shift (compiler/lower/ring.c): the block held goes to the next member of c,
 * the previous member's comes in. A receive and a send on one stream run one after the other, and
 * around a ring every member's receive would wait for a send queued behind its neighbour's receive;
 * so the receive goes on a stream of its own (PLANRT_STREAM_RING_RECV), which first waits for the
 * point stream has reached (what wrote into recv before is done), the send goes on stream, and stream
 * then waits for the receive, so whatever the schedule puts on stream after the shift (the next
 * shift sends the block received) sees it. The messages of the ring axis have their own channel
 * communicators (comm_cuda.c's channels: by tag and the sender's parity), as the pipeline's, so
 * neither backend (NCCL, or MPI staged through host memory) orders a send behind a receive. */
void planrt_cu_ring_shift_start(const void *send, void *recv, int64_t n, planrt_dtype_t t, planrt_comm_t c, int tag,
				planrt_request_t *send_req, planrt_request_t *recv_req, int stream)
{
	static cudaEvent_t ready, received;
	check_idle("planrt_ring_shift_start", send_req);
	check_idle("planrt_ring_shift_start", recv_req);
	int size = planrt_comm_size(c), rank = planrt_comm_rank(c);
	if (size < 2 || rank < 0)
		planrt_fatal("internal error: a ring shift on a communicator of %d member(s)", size);
	if (n <= 0)
		planrt_fatal("internal error: a ring shift of %lld elements", (long long)n);
	if (!ready) {
		planrt_cu_check_(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
		planrt_cu_check_(cudaEventCreateWithFlags(&received, cudaEventDisableTiming), "cudaEventCreate");
	}
	cudaStream_t s = planrt_cu_stream(stream), r = planrt_cu_stream(PLANRT_STREAM_RING_RECV);
	planrt_cu_check_(cudaEventRecord(ready, s), "cudaEventRecord");
	planrt_cu_check_(cudaStreamWaitEvent(r, ready, 0), "cudaStreamWaitEvent");
	PLANRT_CHECK(planrt_recv_tagged(recv, (size_t)n, t, (rank + size - 1) % size, tag, c, (planrt_stream_t)r, recv_req));
	PLANRT_CHECK(planrt_send_tagged(send, (size_t)n, t, (rank + 1) % size, tag, c, on(stream), send_req));
	planrt_cu_check_(cudaEventRecord(received, r), "cudaEventRecord");
	planrt_cu_check_(cudaStreamWaitEvent(s, received, 0), "cudaStreamWaitEvent");
}

void planrt_cu_make_pair_comm(int axis, int a, int b, int index, int stream)
{
	(void)stream;
	planrt_make_pair_comm(axis, a, b, index);
	int me = planrt_mesh_coord(axis);
	planrt_cu_comm_pair_(me == a || me == b ? planrt_pair(index) : NULL);
}
