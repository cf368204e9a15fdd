/* sync_cuda.cu: the CUDA target's kernels of the sync strategies other than plain strict
 * (docs/sync.md, docs/gpu.md): gradient compression (compress.c) and local SGD / DiLoCo averaging
 * (sync.c), on device memory, with the collectives through planrt's NCCL layer on the stream the
 * schedule gave the kernel (the comm stream). The per-element logic is planrt_sync_math.h's, which
 * tests/cuda/test_sync_math.c runs on the CPU against compress.c's and sync.c's kernels.
 *
 *   compress_cast (bf16, fp16)  halves on the wire, the sum formed in f32 and rounded once, as
 *       comm_mpi.c's half reduction defines it. NCCL's own half all-reduce rounds every partial sum
 *       to the half type, so it is not used: an all-to-all of the halves in blocks of n / ranks
 *       (each rank sums its block in f32 in rank order and rounds it), then an all-gather of the
 *       rounded blocks: the ring all-reduce's bytes, 2 (N - 1) / N halves per element; the last
 *       n mod N elements go by one small all-gather. The receive side of the all-to-all is the f32
 *       bucket itself (4 n bytes, free once narrowed), so no memory beyond the plan's is used.
 *       With ZeRO 1 (chunk > 0) the all-to-all and this rank's block only (a reduce-scatter); the
 *       rest of the bucket is scratch afterwards (the program reads the shard only).
 *   compress_topk  a block of threads per tensor: the residual added, the k-th largest magnitude
 *       found bit by bit (32 counting passes over the tensor), the kept (value, index) pairs
 *       written in index order (block scans), as compress.c writes them; all-gathered with NCCL
 *       and added into the zeroed bucket rank by rank (a launch per rank: one rank's indices are
 *       distinct), so every sum is formed in compress.c's order.
 *   compress_powersgd  the GEMMs are cuBLAS (f32, TF32 off), the sums NCCL's; the
 *       orthonormalisation runs on one device thread per matrix with compress.c's sequential
 *       double sums. planrt_powersgd_init draws Q on the host (planrt_init_block) and copies it.
 *   local_average  the parameters' sum by NCCL on the stream, the average and the outer step a
 *       kernel. The loss history (K doubles of pinned host memory, a metric) is written by a
 *       one-thread kernel at every step and, on an averaging step, summed by the host through MPI
 *       after a stream synchronise: the host must have the losses to log them anyway.
 *
 * Bitwise: compress_cast equals the CPU on 2 ranks; on more, the CPU's f32 sum is in MPI's
 * reduction order and this one in rank order, which can differ by an f32 rounding before the one
 * rounding to the half type. top-k and the orthonormalisation are the CPU's order exactly; NCCL's
 * f32 all-reduce (PowerSGD's P and Q, local SGD's parameters) and cuBLAS's GEMMs sum in their own
 * order, as MPI's and OpenBLAS's do on the CPU, so those agree to f32 rounding. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_sync_math.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <stdlib.h>
#include <string.h>

static planrt_stream_t on(int stream)
{
	return (planrt_stream_t)planrt_cu_stream(stream);
}

/* ------------------------------------------------------------------ compress_cast */

__global__ static void feedback_narrow_kernel(float *grad, float *residual, uint16_t *wire, int t, int64_t n)
{
	GRID_STRIDE(i, n)
	wire[i] = sm_feedback_narrow(&grad[i], residual ? &residual[i] : NULL, t);
}

/* out[i] = the ranks' parts[r * stride + i] summed in f32 in rank order, rounded once */
__global__ static void sum_halves_kernel(const uint16_t *parts, int64_t stride, int nparts, uint16_t *out, int t,
					 int64_t n)
{
	GRID_STRIDE(i, n)
	out[i] = sm_sum_halves(parts + i, stride, nparts, t);
}

__global__ static void widen_kernel(const uint16_t *h, float *x, int t, int64_t n)
{
	GRID_STRIDE(i, n)
	x[i] = sm_widen(h[i], t);
}

void planrt_cu_compress_cast(float *grad, int64_t n, planrt_dtype_t wire, float *residual, void *scratch, int64_t chunk,
			     planrt_comm_t c, int stream)
{
	if (wire != planrt_bf16 && wire != planrt_f16)
		planrt_fatal("internal error: planrt_compress_cast to dtype %d (bf16 or f16)", (int)wire);
	int t = (int)wire, size = planrt_comm_size(c), rank = planrt_comm_rank(c);
	uint16_t *q = (uint16_t *)scratch, *recv = (uint16_t *)grad; /* the bucket's bytes, free once narrowed */
	LAUNCH(feedback_narrow_kernel, n, stream, grad, residual, q, t, n);
	int64_t block = chunk ? chunk : n / size;
	if (chunk && chunk * size != n)
		planrt_fatal("internal error: planrt_compress_cast of %lld elements in chunks of %lld on %d ranks",
			     (long long)n, (long long)chunk, size);
	if (block) { /* each rank's block summed by its owner */
		PLANRT_CHECK(planrt_alltoall(q, recv, (size_t)block, wire, c, on(stream), NULL));
		LAUNCH(sum_halves_kernel, block, stream, recv, block, size, q + (size_t)rank * (size_t)block, t, block);
	}
	if (chunk) {
		size_t at = (size_t)rank * (size_t)chunk;
		LAUNCH(widen_kernel, chunk, stream, q + at, grad + at, t, chunk);
		return;
	}
	int64_t whole = block * size, tail = n - whole;
	if (tail) { /* fewer than `size` elements: every rank sums them all */
		PLANRT_CHECK(planrt_allgather(q + whole, recv, (size_t)tail, wire, c, on(stream), NULL));
		LAUNCH(sum_halves_kernel, tail, stream, recv, tail, size, q + whole, t, tail);
	}
	if (block) /* in place: this rank's block is at q + rank * block */
		PLANRT_CHECK(planrt_allgather(q + (size_t)rank * (size_t)block, q, (size_t)block, wire, c, on(stream), NULL));
	LAUNCH(widen_kernel, n, stream, q, grad, t, n);
}

/* ------------------------------------------------------------------ compress_topk */

enum { TOPK_THREADS = 256, SEG_BATCH = 32 };

/* up to SEG_BATCH tensors of a bucket, passed by value: their offsets, lengths, k, and where their
 * pairs start in the message */
struct SegBatch {
	int64_t off[SEG_BATCH], len[SEG_BATCH], k[SEG_BATCH], out[SEG_BATCH];
};

__global__ static void __launch_bounds__(TOPK_THREADS) topk_kernel(float *grad, float *residual, int32_t *pairs, SegBatch b)
{
	typedef cub::BlockReduce<long long, TOPK_THREADS> Reduce;
	typedef cub::BlockScan<int, TOPK_THREADS> Scan;
	__shared__ union {
		typename Reduce::TempStorage reduce;
		typename Scan::TempStorage scan;
	} tmp;
	__shared__ uint32_t shared_thr;
	__shared__ long long shared_count;
	int s = blockIdx.x;
	float *v = grad + b.off[s];
	float *res = residual ? residual + b.off[s] : NULL;
	int64_t len = b.len[s], k = b.k[s];
	if (res)
		for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
			v[i] = sm_add(v[i], res[i]);
	__syncthreads();
	uint32_t thr = 0;
	for (int bit = 31; bit >= 0; bit--) {
		uint32_t cand = sm_kth_candidate(thr, bit);
		long long count = 0;
		for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
			count += sm_magnitude_bits(v[i]) >= cand;
		count = Reduce(tmp.reduce).Sum(count);
		if (threadIdx.x == 0)
			shared_thr = sm_kth_step(thr, bit, count, k);
		__syncthreads();
		thr = shared_thr;
		__syncthreads();
	}
	long long above = 0;
	for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
		above += sm_magnitude_bits(v[i]) > thr;
	above = Reduce(tmp.reduce).Sum(above);
	if (threadIdx.x == 0)
		shared_count = above;
	__syncthreads();
	int64_t ties = k - shared_count, ties_before = 0, kept_before = 0;
	int32_t *out = pairs + 2 * b.out[s];
	for (int64_t base = 0; base < len; base += blockDim.x) {
		int64_t i = base + threadIdx.x;
		uint32_t a = i < len ? sm_magnitude_bits(v[i]) : 0;
		int tie = i < len && a == thr, tie_prefix, tie_total;
		Scan(tmp.scan).ExclusiveSum(tie, tie_prefix, tie_total);
		__syncthreads();
		int keep = i < len && sm_topk_keep(a, thr, ties_before + tie_prefix, ties), at, kept_total;
		Scan(tmp.scan).ExclusiveSum(keep, at, kept_total);
		__syncthreads();
		if (keep) {
			out[2 * (kept_before + at)] = (int32_t)sm_bits(v[i]);
			out[2 * (kept_before + at) + 1] = (int32_t)(b.off[s] + i);
			if (res)
				res[i] = 0;
		} else if (i < len && res) {
			res[i] = v[i];
		}
		ties_before += tie_total;
		kept_before += kept_total;
	}
}

__global__ static void zero_kernel(float *grad, SegBatch b, int nseg)
{
	for (int s = 0; s < nseg; s++)
		for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < b.len[s]; i += (int64_t)gridDim.x * blockDim.x)
			grad[b.off[s] + i] = 0;
}

/* one rank's pairs added into the bucket: its indices are distinct, so the threads never meet */
__global__ static void scatter_add_kernel(float *grad, const int32_t *pairs, int64_t count)
{
	GRID_STRIDE(e, count)
	grad[pairs[2 * e + 1]] = sm_add(grad[pairs[2 * e + 1]], sm_float((uint32_t)pairs[2 * e]));
}

void planrt_cu_compress_topk(float *grad, int nseg, const int64_t *off, const int64_t *len, const int64_t *k,
			     float *residual, void *scratch, planrt_comm_t c, int stream)
{
	int64_t kept = 0, longest = 0;
	for (int s = 0; s < nseg; s++) {
		if (k[s] < 1 || k[s] > len[s] || off[s] + len[s] > INT32_MAX)
			planrt_fatal("internal error: top-k of %lld of %lld entries at %lld", (long long)k[s], (long long)len[s],
				     (long long)off[s]);
		kept += k[s];
		longest = len[s] > longest ? len[s] : longest;
	}
	int size = planrt_comm_size(c);
	int32_t *out = (int32_t *)scratch, *all = out + 2 * kept;
	cudaStream_t st = planrt_cu_stream(stream);
	int64_t at = 0;
	for (int first = 0; first < nseg; first += SEG_BATCH) {
		SegBatch b;
		int nb = nseg - first < SEG_BATCH ? nseg - first : SEG_BATCH;
		for (int j = 0; j < nb; j++) {
			b.off[j] = off[first + j];
			b.len[j] = len[first + j];
			b.k[j] = k[first + j];
			b.out[j] = at;
			at += k[first + j];
		}
		topk_kernel<<<nb, TOPK_THREADS, 0, st>>>(grad, residual, out, b);
		planrt_cu_check_launch("topk_kernel");
	}
	PLANRT_CHECK(planrt_allgather(out, all, (size_t)(2 * kept), planrt_i32, c, on(stream), NULL));
	for (int first = 0; first < nseg; first += SEG_BATCH) {
		SegBatch b;
		int nb = nseg - first < SEG_BATCH ? nseg - first : SEG_BATCH;
		for (int j = 0; j < nb; j++) {
			b.off[j] = off[first + j];
			b.len[j] = len[first + j];
		}
		zero_kernel<<<planrt_cu_grid(longest), PLANRT_CU_BLOCK, 0, st>>>(grad, b, nb);
		planrt_cu_check_launch("zero_kernel");
	}
	for (int r = 0; r < size; r++) /* rank by rank: compress.c's order of every sum */
		LAUNCH(scatter_add_kernel, kept, stream, grad, all + 2 * (size_t)r * (size_t)kept, kept);
}

/* ------------------------------------------------------------------ compress_powersgd */

__global__ static void add_kernel(float *x, const float *y, int64_t n)
{
	GRID_STRIDE(i, n)
	x[i] = sm_add(x[i], y[i]);
}

__global__ static void orthonormalise_kernel(float *p, int64_t rows, int r)
{
	sm_orthonormalise(p, rows, r);
}

__global__ static void powersgd_residual_kernel(float *residual, const float *m, float share, int64_t n)
{
	GRID_STRIDE(i, n)
	residual[i] = sm_powersgd_residual(residual[i], m[i], share);
}

void planrt_cu_compress_powersgd(float *grad, int nseg, const int64_t *off, const int64_t *rows, const int64_t *cols,
				 int r, float *q, float *residual, float *scratch, planrt_comm_t c, int stream)
{
	int64_t np = 0, nq = 0, nd = 0;
	for (int s = 0; s < nseg; s++) {
		np += cols[s] ? rows[s] * r : 0;
		nq += cols[s] * r;
		nd += cols[s] ? 0 : rows[s];
	}
	cudaStream_t st = planrt_cu_stream(stream);
	float *P = scratch, *D = scratch + np;
	int64_t pp = 0, qq = 0, dd = 0;
	for (int s = 0; s < nseg; s++) { /* P = M Q; the whole segments packed */
		float *m = grad + off[s];
		if (!cols[s]) {
			planrt_cu_check_(cudaMemcpyAsync(D + dd, m, sizeof(float) * (size_t)rows[s], cudaMemcpyDeviceToDevice, st),
					 "cudaMemcpyAsync");
			dd += rows[s];
			continue;
		}
		if (residual)
			LAUNCH(add_kernel, rows[s] * cols[s], stream, m, residual + off[s], rows[s] * cols[s]);
		planrt_cu_k_matmul_f32(1, rows[s], r, cols[s], m, 0, 0, q + qq, 0, 0, P + pp, 0, 0, stream);
		pp += rows[s] * r;
		qq += cols[s] * r;
	}
	if (np) {
		PLANRT_CHECK(planrt_allreduce(P, P, (size_t)np, planrt_f32, planrt_sum, c, on(stream), NULL));
		pp = qq = 0;
		for (int s = 0; s < nseg; s++) /* Q = M^T P, from the orthonormal P */
			if (cols[s]) {
				orthonormalise_kernel<<<1, 1, 0, st>>>(P + pp, rows[s], r);
				planrt_cu_check_launch("orthonormalise_kernel");
				planrt_cu_k_matmul_f32(1, cols[s], r, rows[s], grad + off[s], 1, 0, P + pp, 0, 0, q + qq, 0, 0, stream);
				pp += rows[s] * r;
				qq += cols[s] * r;
			}
		PLANRT_CHECK(planrt_allreduce(q, q, (size_t)nq, planrt_f32, planrt_sum, c, on(stream), NULL));
		float share = 1.0f / (float)planrt_comm_size(c);
		pp = qq = 0;
		for (int s = 0; s < nseg; s++)
			if (cols[s]) { /* M ~ P Q^T; the residual keeps M minus this rank's share of it */
				int64_t n = rows[s] * cols[s];
				float *m = grad + off[s];
				if (residual)
					planrt_cu_check_(cudaMemcpyAsync(residual + off[s], m, sizeof(float) * (size_t)n,
									 cudaMemcpyDeviceToDevice, st),
							 "cudaMemcpyAsync");
				planrt_cu_k_matmul_f32(1, rows[s], cols[s], r, P + pp, 0, 0, q + qq, 1, 0, m, 0, 0, stream);
				if (residual)
					LAUNCH(powersgd_residual_kernel, n, stream, residual + off[s], m, share, n);
				pp += rows[s] * r;
				qq += cols[s] * r;
			}
	}
	if (nd) {
		PLANRT_CHECK(planrt_allreduce(D, D, (size_t)nd, planrt_f32, planrt_sum, c, on(stream), NULL));
		dd = 0;
		for (int s = 0; s < nseg; s++)
			if (!cols[s]) {
				planrt_cu_check_(cudaMemcpyAsync(grad + off[s], D + dd, sizeof(float) * (size_t)rows[s],
								 cudaMemcpyDeviceToDevice, st),
						 "cudaMemcpyAsync");
				dd += rows[s];
			}
	}
}

void planrt_cu_powersgd_init(planrt_ctx_t *ctx, float *q, int64_t n, int stream)
{
	if (n <= 0)
		return;
	float *host = (float *)malloc(sizeof(float) * (size_t)n);
	if (!host)
		planrt_fatal("out of memory for PowerSGD's initial Q (%lld floats)", (long long)n);
	int64_t dims[1] = {n}, offs[1] = {0};
	planrt_init_block(host, 1, dims, dims, offs, 0, 0.0, 1.0, ctx->seed, "powersgd_q");
	cudaStream_t st = planrt_cu_stream(stream);
	planrt_cu_check_(cudaMemcpyAsync(q, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
	planrt_cu_check_(cudaStreamSynchronize(st), "cudaStreamSynchronize"); /* before host is freed */
	free(host);
}

/* ------------------------------------------------------------------ local_average */

__global__ static void record_loss_kernel(double *slot, const double *loss)
{
	*slot = *loss;
}

__global__ static void average_kernel(float *x, float replicas, int outer, float lr, float mu, float *anchor,
				      float *momentum, int64_t n)
{
	GRID_STRIDE(i, n)
	x[i] = sm_local_average(x[i], replicas, outer, lr, mu, anchor ? &anchor[i] : NULL, momentum ? &momentum[i] : NULL);
}

void planrt_cu_local_average(planrt_ctx_t *ctx, int every, void *flat, int64_t n, planrt_dtype_t t, void *params,
			     planrt_dtype_t pt, const double *loss, double *history, planrt_comm_t c, int outer,
			     double outer_lr, double outer_momentum, float *anchor, float *momentum, int stream)
{
	if (every < 1 || t != planrt_f32)
		planrt_fatal("internal error: planrt_local_average every %d, dtype %d (f32 averages)", every, (int)t);
	cudaStream_t st = planrt_cu_stream(stream);
	/* the loss and the history are metrics: pinned, mapped host memory the device writes directly */
	record_loss_kernel<<<1, 1, 0, st>>>(history + ctx->step % every, loss);
	planrt_cu_check_launch("record_loss_kernel");
	if ((ctx->step + 1) % every && ctx->step != ctx->steps - 1)
		return;
	/* host-driven: the K losses are summed over MPI once the stream has written them */
	planrt_cu_check_(cudaStreamSynchronize(st), "cudaStreamSynchronize");
	PLANRT_CHECK(planrt_allreduce(history, history, (size_t)every, planrt_f64, planrt_sum, c, NULL, NULL));
	PLANRT_CHECK(planrt_allreduce(flat, flat, (size_t)n, planrt_f32, planrt_sum, c, on(stream), NULL));
	LAUNCH(average_kernel, n, stream, (float *)flat, (float)planrt_comm_size(c), outer, (float)outer_lr,
	       (float)outer_momentum, outer ? anchor : NULL, outer ? momentum : NULL, n);
	if (params)
		planrt_cu_cast(flat, planrt_f32, params, pt, n, stream);
}

/* ------------------------------------------------------------------ fp16 dynamic loss scaling
 * The backward starts from loss * scale (planrt_cu_loss_seed: the scale is the host's for this
 * step, passed by value). planrt_cu_unscale_clip_coef runs step.c's rule on the device: the norm
 * of the scaled gradients (sumsq all-reduced over every axis, so every rank finds the same) is
 * unscaled; not finite, the step is skipped: *coef is NaN, which optimizer_kernel reads as "change
 * nothing", and a flag in pinned host memory says so. The host learns the verdict when it next
 * waits for the device (planrt_cu_synchronize, at the end of the step phase), which sets
 * ctx->step_skipped; the run then halves the scale or, after its interval, doubles it, as on the
 * CPU (program.c), and the next step's seed and unscaling use the new one. */

__global__ static void loss_seed_kernel(float *dl, float value)
{
	*dl = value;
}

void planrt_cu_loss_seed(planrt_ctx_t *ctx, float *dl, double per_micro, int stream)
{
	loss_seed_kernel<<<1, 1, 0, planrt_cu_stream(stream)>>>(dl, (float)(ctx->loss_scale * per_micro));
	planrt_cu_check_launch("loss_seed_kernel");
}

__global__ static void unscale_clip_kernel(const double *sumsq, double *norm, double *coef, double scale,
					   double max_norm, int *skipped)
{
	*skipped = sm_unscale_clip(*sumsq, scale, max_norm, norm, coef);
}

static struct {
	int *skipped;        /* pinned, mapped: the device's verdict */
	planrt_ctx_t *ctx;   /* the step waiting for it, or NULL */
} verdict;

void planrt_cu_unscale_clip_coef(planrt_ctx_t *ctx, const double *sumsq, double *norm, double *coef, double max_norm,
				 int stream)
{
	if (!verdict.skipped) {
		planrt_cu_check_(cudaHostAlloc((void **)&verdict.skipped, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
				 "cudaHostAlloc of the loss-scale verdict");
		*verdict.skipped = 0;
	}
	unscale_clip_kernel<<<1, 1, 0, planrt_cu_stream(stream)>>>(sumsq, norm, coef, ctx->loss_scale, max_norm,
								     verdict.skipped);
	planrt_cu_check_launch("unscale_clip_kernel");
	verdict.ctx = ctx;
}


/* ------------------------------------------------------------------ async: host-driven
 * sync.c's bounded-staleness protocol (its comment has the messages, the rings and why neither
 * side waits for the other in a cycle), kept as it is with device buffers and NCCL. Which version
 * a worker computes a step on depends on what has arrived when the step starts: that is decided
 * by the host (cudaEventQuery on the receive), so this part is host-driven by nature; nothing
 * blocks the host, though: a version the worker must have is waited for by the stream
 * (cudaStreamWaitEvent), not by the CPU.
 *   streams   the NCCL sends and receives run on two streams of their own (a posted receive must
 *             not hold up the call's stream, nor a send wait behind a receive); the copies into
 *             the rings and out of the inbox, and the gradient sums, on the stream the schedule
 *             gave the kernel, handed over by events;
 *   channels  comm_nccl.c gives the role axis one NCCL communicator per tag (versions, gradients),
 *             on which a rank only sends or only receives, as MPI's tags keep the two apart;
 *   rings     a slot is rewritten after its previous sends completed (an event per slot), as
 *             sync.c's requests do;
 *   staleness the master's check of the version each worker used runs on the device; a violation
 *             stops the run at the end of the step (planrt_cu_settle_sync_), with sync.c's message.
 * The master's gradient sum is in worker order as on the CPU (planrt_cu_accumulate). */

enum { TAG_PARAMS = 0, TAG_GRADS = 1, TAIL_BYTES = 16 };

/* the master's staleness violation (pinned, mapped: the device writes it, the host reads it) */
struct Stale {
	int worker; /* 0: none */
	double version;
	int64_t step;
	int staleness;
};

static struct {
	cudaStream_t send, recv;      /* the NCCL streams */
	cudaEvent_t handoff;          /* one stream waits for another's work so far */
	int64_t version, received;    /* worker: version in use; versions received */
	cudaEvent_t pull;             /* worker: after the receive of version received + 1 */
	int pulling;                  /* worker: that receive is posted */
	cudaEvent_t *recv_done;       /* master: [nworkers] after this step's receives */
	cudaEvent_t *slot_sent;       /* either: [slots] after a ring slot's sends */
	int nslots;
	Stale *stale;
} AD;

static cudaEvent_t new_event(void)
{
	cudaEvent_t e;
	planrt_cu_check_(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
	return e;
}

static void async_start(void)
{
	if (AD.send)
		return;
	planrt_cu_check_(cudaStreamCreateWithFlags(&AD.send, cudaStreamNonBlocking), "cudaStreamCreate");
	planrt_cu_check_(cudaStreamCreateWithFlags(&AD.recv, cudaStreamNonBlocking), "cudaStreamCreate");
	AD.handoff = new_event();
	AD.pull = new_event();
	planrt_cu_check_(cudaHostAlloc((void **)&AD.stale, sizeof *AD.stale, cudaHostAllocMapped | cudaHostAllocPortable),
			 "cudaHostAlloc");
	memset(AD.stale, 0, sizeof *AD.stale);
}

/* `to` waits for the work enqueued on `from` so far */
static void follow(cudaStream_t to, cudaStream_t from)
{
	planrt_cu_check_(cudaEventRecord(AD.handoff, from), "cudaEventRecord");
	planrt_cu_check_(cudaStreamWaitEvent(to, AD.handoff, 0), "cudaStreamWaitEvent");
}

/* the event after ring slot `slot`'s sends (of nslots) */
static cudaEvent_t *slot_event(int slot, int nslots)
{
	if (!AD.slot_sent) {
		AD.nslots = nslots;
		AD.slot_sent = (cudaEvent_t *)calloc((size_t)nslots, sizeof *AD.slot_sent);
		if (!AD.slot_sent)
			planrt_fatal("out of memory for %d async ring events", nslots);
		for (int i = 0; i < nslots; i++)
			AD.slot_sent[i] = new_event(); /* recorded on no stream yet: waiting for it is a no-op */
	}
	return &AD.slot_sent[slot];
}

/* Worker: takes the versions that have arrived, in order, until the newest is at least need. */
static void pull_until(planrt_ctx_t *ctx, int64_t need, void *params, void *inbox, int64_t n, planrt_dtype_t t,
		       planrt_comm_t c, int stream)
{
	cudaStream_t s = planrt_cu_stream(stream);
	for (;;) {
		if (!AD.pulling && AD.received < ctx->steps) {
			follow(AD.recv, s); /* the inbox has been copied out */
			PLANRT_CHECK(planrt_recv_tagged(inbox, (size_t)n, t, 0, TAG_PARAMS, c, (planrt_stream_t)AD.recv, NULL));
			planrt_cu_check_(cudaEventRecord(AD.pull, AD.recv), "cudaEventRecord");
			AD.pulling = 1;
		}
		if (!AD.pulling)
			break;
		if (AD.version >= need) { /* take what has arrived, wait for nothing */
			cudaError_t e = cudaEventQuery(AD.pull);
			if (e == cudaErrorNotReady)
				break;
			planrt_cu_check_(e, "an async parameter receive");
		}
		/* arrived, or needed: the stream waits for it */
		planrt_cu_check_(cudaStreamWaitEvent(s, AD.pull, 0), "cudaStreamWaitEvent");
		planrt_cu_check_(cudaMemcpyAsync(params, inbox, (size_t)n * planrt_dtype_size(t), cudaMemcpyDeviceToDevice, s),
				 "cudaMemcpyAsync");
		AD.pulling = 0;
		AD.version = ++AD.received;
	}
	if (AD.version < need)
		planrt_fatal("internal error: async worker needs parameter version %lld but the master sends %lld",
			     (long long)need, (long long)ctx->steps);
}

void planrt_cu_async_pull(planrt_ctx_t *ctx, int staleness, void *params, void *inbox, int64_t n, planrt_dtype_t t,
			  planrt_comm_t c, int stream)
{
	async_start();
	if (ctx->step == 0)
		AD.version = AD.received = 0; /* every rank starts from the same initial parameters */
	pull_until(ctx, ctx->step - staleness, params, inbox, n, t, c, stream);
}

/* the message's tail: the loss (a metric: pinned host memory) and the version, as two f64, byte
 * by byte (the tail follows n elements: it need not be 8-byte aligned) */
__global__ static void push_tail_kernel(unsigned char *tail, const double *loss, double version)
{
	double v[2] = {*loss, version};
	const unsigned char *b = (const unsigned char *)v;
	for (int i = 0; i < TAIL_BYTES; i++)
		tail[i] = b[i];
}

void planrt_cu_async_push(planrt_ctx_t *ctx, int staleness, const void *grads, int64_t n, planrt_dtype_t t, void *ring,
			  const double *loss, planrt_comm_t c, int stream)
{
	async_start();
	cudaStream_t s = planrt_cu_stream(stream);
	size_t es = planrt_dtype_size(t), bytes = (size_t)n * es + TAIL_BYTES;
	int slot = (int)(ctx->step % (staleness + 1));
	unsigned char *msg = (unsigned char *)ring + (size_t)slot * bytes;
	cudaEvent_t *sent = slot_event(slot, staleness + 1);
	planrt_cu_check_(cudaStreamWaitEvent(s, *sent, 0), "cudaStreamWaitEvent"); /* the slot's last message left */
	planrt_cu_check_(cudaMemcpyAsync(msg, grads, (size_t)n * es, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
	push_tail_kernel<<<1, 1, 0, s>>>(msg + (size_t)n * es, loss, (double)AD.version);
	planrt_cu_check_launch("push_tail_kernel");
	follow(AD.send, s);
	PLANRT_CHECK(planrt_send_tagged(msg, bytes / es, t, 0, TAG_GRADS, c, (planrt_stream_t)AD.send, NULL));
	planrt_cu_check_(cudaEventRecord(*sent, AD.send), "cudaEventRecord");
}

void planrt_cu_async_drain(planrt_ctx_t *ctx, void *params, void *inbox, int64_t n, planrt_dtype_t t, planrt_comm_t c,
			   int stream)
{
	if (ctx->step != ctx->steps - 1)
		return;
	async_start();
	pull_until(ctx, ctx->steps, params, inbox, n, t, c, stream);
	follow(planrt_cu_stream(stream), AD.send); /* every gradient has left */
}

void planrt_cu_async_post(planrt_ctx_t *ctx, void *inbox, int64_t msg, planrt_dtype_t t, int nworkers, planrt_comm_t c,
			  int stream)
{
	async_start();
	if (!AD.recv_done) {
		AD.recv_done = (cudaEvent_t *)calloc((size_t)(nworkers > 0 ? nworkers : 1), sizeof *AD.recv_done);
		if (!AD.recv_done)
			planrt_fatal("out of memory for %d async receive events", nworkers);
		for (int w = 0; w < nworkers; w++)
			AD.recv_done[w] = new_event();
	}
	follow(AD.recv, planrt_cu_stream(stream)); /* the inbox has been summed out of */
	for (int w = 0; w < nworkers; w++) {
		PLANRT_CHECK(planrt_recv_tagged((unsigned char *)inbox + (size_t)w * (size_t)msg * planrt_dtype_size(t),
						(size_t)msg, t, w + 1, TAG_GRADS, c, (planrt_stream_t)AD.recv, NULL));
		planrt_cu_check_(cudaEventRecord(AD.recv_done[w], AD.recv), "cudaEventRecord");
	}
	(void)ctx;
}

__global__ static void gather_tail_kernel(const unsigned char *tail, double *loss, double *versions, int worker,
					  int64_t step, int staleness, Stale *stale)
{
	double v[2];
	unsigned char *b = (unsigned char *)v;
	for (int i = 0; i < TAIL_BYTES; i++)
		b[i] = tail[i];
	if (sm_async_too_stale(v[1], step, staleness) && !stale->worker) {
		stale->version = v[1];
		stale->step = step;
		stale->staleness = staleness;
		stale->worker = worker;
	}
	*loss += v[0];
	versions[worker] = v[1];
}

void planrt_cu_async_gather(planrt_ctx_t *ctx, int staleness, void *grads, int64_t n, planrt_dtype_t t,
			    const void *inbox, int nworkers, double *loss, double *versions, int stream)
{
	async_start();
	cudaStream_t s = planrt_cu_stream(stream);
	size_t es = planrt_dtype_size(t), bytes = (size_t)n * es + TAIL_BYTES;
	versions[0] = (double)ctx->step; /* a metric: pinned host memory */
	for (int w = 0; w < nworkers; w++) {
		planrt_cu_check_(cudaStreamWaitEvent(s, AD.recv_done[w], 0), "cudaStreamWaitEvent");
		const unsigned char *msg = (const unsigned char *)inbox + (size_t)w * bytes;
		planrt_cu_accumulate(grads, msg, n, t, stream);
		gather_tail_kernel<<<1, 1, 0, s>>>(msg + (size_t)n * es, loss, versions, w + 1, ctx->step, staleness, AD.stale);
		planrt_cu_check_launch("gather_tail_kernel");
	}
}

void planrt_cu_async_publish(planrt_ctx_t *ctx, int staleness, const void *params, int64_t n, planrt_dtype_t t,
			     void *ring, int nworkers, planrt_comm_t c, int stream)
{
	async_start();
	cudaStream_t s = planrt_cu_stream(stream);
	int slots = staleness + 2, slot = (int)((ctx->step + 1) % slots);
	size_t bytes = (size_t)n * planrt_dtype_size(t);
	unsigned char *copy = (unsigned char *)ring + (size_t)slot * bytes;
	cudaEvent_t *sent = slot_event(slot, slots);
	planrt_cu_check_(cudaStreamWaitEvent(s, *sent, 0), "cudaStreamWaitEvent"); /* the slot's last version left */
	planrt_cu_check_(cudaMemcpyAsync(copy, params, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
	follow(AD.send, s);
	for (int w = 0; w < nworkers; w++)
		PLANRT_CHECK(planrt_send_tagged(copy, (size_t)n, t, w + 1, TAG_PARAMS, c, (planrt_stream_t)AD.send, NULL));
	planrt_cu_check_(cudaEventRecord(*sent, AD.send), "cudaEventRecord");
	if (ctx->step == ctx->steps - 1)
		follow(s, AD.send); /* every version has left */
}

/* ------------------------------------------------------------------ after the device is done */

void planrt_cu_settle_sync_(void)
{
	if (verdict.ctx) {
		if (*verdict.skipped)
			verdict.ctx->step_skipped = 1;
		verdict.ctx = NULL;
	}
	if (AD.stale && AD.stale->worker)
		planrt_fatal("async: worker %d computed step %lld on parameter version %.0f, %.0f updates old; the plan's "
			     "bound is staleness = %d",
			     AD.stale->worker, (long long)AD.stale->step, AD.stale->version,
			     (double)AD.stale->step - AD.stale->version, AD.stale->staleness);
}
