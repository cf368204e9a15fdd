/* test_nccl_one.cu: the device comm backends on one GPU, a world of one rank (scripts/gpu-check.sh
 * builds it with gpu-build.sh and runs it first; CI builds it and sees it refuse without a GPU).
 *
 *   NCCL       comm_nccl.c's every collective kind (allreduce sum and max, reduce-scatter,
 *              allgather, all-to-all, broadcast) in every dtype planrt has, out of place and in
 *              NCCL's in-place forms, a send and a receive to itself on a channel communicator (in
 *              one NCCL group) and all-to-all-v, on an NCCL communicator of one member made from a
 *              unique id (planrt_nccl_open_): each result equals what the definition gives for one
 *              member;
 *   MPI        the MPI device backend (comm/staged.c) on stage_cuda.cu's CUDA interface: the same
 *              kinds through pinned staging buffers and the gate (cuStreamWaitValue32, or the
 *              polling kernel), and the ordering on the device: a kernel writes the input on the
 *              compute stream, the comm stream waits for it, the allreduce runs with a request,
 *              planrt_wait makes the compute stream wait, a kernel checks the result (300 times);
 *   cost       a 64 MiB f32 allreduce on each backend, timed (on one rank the MPI backend's time is
 *              its two copies through pinned host memory: the figure docs/gpu.md's estimate uses).
 * Prints PASS/FAIL lines; exit status 0 when all passed, 77 without a GPU. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_staged.h"
#include "tally.h"


#define CUDA(call) planrt_cu_check_((call), #call)

static const char *const dtype_text[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

typedef planrt_result_t (*run_fn)(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				  planrt_op_t op, int peer, int tag, planrt_comm_t c, cudaStream_t s);

static planrt_result_t staged_run(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				  planrt_op_t op, int peer, int tag, planrt_comm_t c, cudaStream_t s)
{
	return planrt_staged_run_(kind, send, recv, count, t, op, peer, tag, c, (planrt_stream_t)s, NULL);
}

static void fill(unsigned char *p, size_t bytes, int seed)
{
	for (size_t i = 0; i < bytes; i++)
		p[i] = (unsigned char)((i * 131 + (size_t)seed * 7) >> 2);
}

/* one kind on a group of one: every kind's result is its input; in place as NCCL has it */
static void one_kind(const char *backend, run_fn run, planrt_comm_t c, planrt_coll_t kind, planrt_dtype_t t,
		     planrt_op_t op, size_t count, int in_place)
{
	size_t bytes = count * planrt_dtype_size(t);
	unsigned char *in = (unsigned char *)malloc(bytes + 64), *out = (unsigned char *)malloc(bytes + 64);
	fill(in, bytes + 64, (int)kind * 10 + (int)t);
	void *d_in, *d_out;
	CUDA(cudaMalloc(&d_in, bytes + 64));
	CUDA(cudaMalloc(&d_out, bytes + 64));
	CUDA(cudaMemcpy(d_in, in, bytes + 64, cudaMemcpyHostToDevice));
	CUDA(cudaMemset(d_out, 0x5a, bytes + 64));
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMM);
	const void *send = d_in;
	void *recv = in_place || kind == planrt_coll_broadcast ? d_in : d_out;
	planrt_result_t r = run(kind, send, recv, count, t, op, 0, 0, c, s);
	CUDA(cudaStreamSynchronize(s));
	CUDA(cudaMemcpy(out, recv, bytes, cudaMemcpyDeviceToHost));
	CHECK(r == planrt_success && !memcmp(out, in, bytes), "%s: %s of %zu %s (%s, %s): %s", backend,
	      planrt_coll_name(kind), count, dtype_text[t], op == planrt_max ? "max" : "sum", in_place ? "in place" : "out of place",
	      r == planrt_success ? "the result is not the input" : planrt_last_error());
	CUDA(cudaFree(d_in));
	CUDA(cudaFree(d_out));
	free(in);
	free(out);
}

static void every_kind(const char *backend, run_fn run, planrt_comm_t c)
{
	const planrt_dtype_t all[] = {planrt_f32, planrt_bf16, planrt_f16, planrt_i32, planrt_u8, planrt_f64};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
		planrt_dtype_t t = all[i];
		for (int in_place = 0; in_place < 2; in_place++) {
			one_kind(backend, run, c, planrt_coll_allreduce, t, planrt_sum, 1000 + 17 * i, in_place);
			one_kind(backend, run, c, planrt_coll_reduce_scatter, t, planrt_sum, 777, in_place);
			one_kind(backend, run, c, planrt_coll_allgather, t, planrt_sum, 513, in_place);
		}
		one_kind(backend, run, c, planrt_coll_allreduce, t, planrt_max, 4097, 0);
		one_kind(backend, run, c, planrt_coll_alltoall, t, planrt_sum, 300, 0);
		one_kind(backend, run, c, planrt_coll_broadcast, t, planrt_sum, 99, 1);
	}
	one_kind(backend, run, c, planrt_coll_allreduce, planrt_f32, planrt_sum, (size_t)3 << 20, 1);
}

/* a send and a receive to itself on NCCL channel tag: one NCCL group (NCCL needs both in one) */
static void nccl_p2p(planrt_comm_t c)
{
	size_t n = 12345;
	float *h = (float *)malloc(n * 4), *back = (float *)malloc(n * 4), *d_send, *d_recv;
	for (size_t i = 0; i < n; i++)
		h[i] = (float)i * 0.5f;
	CUDA(cudaMalloc(&d_send, n * 4));
	CUDA(cudaMalloc(&d_recv, n * 4));
	CUDA(cudaMemcpy(d_send, h, n * 4, cudaMemcpyHostToDevice));
	CUDA(cudaMemset(d_recv, 0, n * 4));
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_P2P);
	for (int tag = 0; tag < 3; tag++) { /* two channels, and a tag outside them (the group's own) */
		CUDA(cudaMemset(d_recv, 0, n * 4));
		ncclGroupStart();
		planrt_result_t r1 = planrt_nccl_run_(planrt_coll_send, d_send, NULL, n, planrt_f32, planrt_sum, 0, tag, c, s);
		planrt_result_t r2 = planrt_nccl_run_(planrt_coll_recv, NULL, d_recv, n, planrt_f32, planrt_sum, 0, tag, c, s);
		ncclResult_t g = ncclGroupEnd();
		CUDA(cudaStreamSynchronize(s));
		CUDA(cudaMemcpy(back, d_recv, n * 4, cudaMemcpyDeviceToHost));
		CHECK(r1 == planrt_success && r2 == planrt_success && g == ncclSuccess && !memcmp(back, h, n * 4),
		      "NCCL: a send and a receive to itself on tag %d: %s", tag, planrt_last_error());
	}
	CUDA(cudaFree(d_send));
	CUDA(cudaFree(d_recv));
	free(h);
	free(back);
}

/* all-to-all-v on one member: the block to itself, the gaps untouched */
static void alltoallv_one(const char *backend, planrt_comm_t c, int staged)
{
	int64_t sc[1] = {700}, sd[1] = {30}, rc[1] = {700}, rd[1] = {50};
	size_t n = 1000;
	float *h = (float *)malloc(n * 4), *back = (float *)malloc(n * 4), *d_in, *d_out;
	for (size_t i = 0; i < n; i++)
		h[i] = (float)i;
	CUDA(cudaMalloc(&d_in, n * 4));
	CUDA(cudaMalloc(&d_out, n * 4));
	CUDA(cudaMemcpy(d_in, h, n * 4, cudaMemcpyHostToDevice));
	CUDA(cudaMemset(d_out, 0, n * 4));
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMM);
	planrt_result_t r = staged ? planrt_staged_alltoallv_(d_in, sc, sd, d_out, rc, rd, planrt_f32, c, (planrt_stream_t)s)
				   : planrt_nccl_alltoallv_(d_in, sc, sd, d_out, rc, rd, planrt_f32, c, s);
	CUDA(cudaStreamSynchronize(s));
	CUDA(cudaMemcpy(back, d_out, n * 4, cudaMemcpyDeviceToHost));
	int good = r == planrt_success;
	for (size_t i = 0; i < n && good; i++)
		good = back[i] == (i >= 50 && i < 750 ? h[i - 20] : 0.0f);
	CHECK(good, "%s: alltoallv of one member: %s", backend, r == planrt_success ? "wrong data" : planrt_last_error());
	CUDA(cudaFree(d_in));
	CUDA(cudaFree(d_out));
	free(h);
	free(back);
}

__global__ static void write_kernel(float *x, size_t n, int k)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		x[i] = (float)((k * 31 + (int)(i % 97)) % 64);
}

__global__ static void check_kernel(const float *y, size_t n, int k, unsigned *bad)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		if (y[i] != (float)((k * 31 + (int)(i % 97)) % 64))
			atomicAdd(bad, 1u);
}

/* the MPI device backend's ordering on the device: write on compute, allreduce on comm with a
 * request, planrt_wait (compute waits), check on compute */
static void staged_ordering(planrt_comm_t c, int iterations)
{
	size_t n = 1 << 18;
	float *x, *y;
	unsigned *bad, bad_host = 0;
	CUDA(cudaMalloc(&x, n * 4));
	CUDA(cudaMalloc(&y, n * 4));
	CUDA(cudaMalloc(&bad, 4));
	CUDA(cudaMemset(bad, 0, 4));
	cudaStream_t compute = planrt_cu_stream(PLANRT_STREAM_COMPUTE), comm = planrt_cu_stream(PLANRT_STREAM_COMM);
	cudaEvent_t written;
	CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
	for (int k = 0; k < iterations; k++) {
		write_kernel<<<256, 256, 0, compute>>>(x, n, k);
		CUDA(cudaEventRecord(written, compute));
		CUDA(cudaStreamWaitEvent(comm, written, 0));
		planrt_request_t q = NULL;
		planrt_result_t r = planrt_staged_run_(planrt_coll_allreduce, x, y, n, planrt_f32, planrt_sum, 0, 0, c,
						       (planrt_stream_t)comm, &q);
		if (r != planrt_success) {
			CHECK(0, "MPI backend ordering: %s", planrt_last_error());
			break;
		}
		planrt_wait(q);
		check_kernel<<<256, 256, 0, compute>>>(y, n, k, bad);
	}
	CUDA(cudaDeviceSynchronize());
	CUDA(cudaMemcpy(&bad_host, bad, 4, cudaMemcpyDeviceToHost));
	CHECK(bad_host == 0, "MPI backend ordering: %u elements read before their allreduce landed (%d iterations)",
	      bad_host, iterations);
	printf("%s: MPI backend ordering on the device: %d iterations of write, allreduce with a request, planrt_wait, "
	       "check: %u wrong elements\n",
	       bad_host ? "FAIL" : "ok", iterations, bad_host);
	cudaEventDestroy(written);
	CUDA(cudaFree(x));
	CUDA(cudaFree(y));
	CUDA(cudaFree(bad));
}

static double time_allreduce(run_fn run, planrt_comm_t c, size_t n)
{
	float *x;
	CUDA(cudaMalloc(&x, n * 4));
	CUDA(cudaMemset(x, 0, n * 4));
	cudaStream_t s = planrt_cu_stream(PLANRT_STREAM_COMM);
	run(planrt_coll_allreduce, x, x, n, planrt_f32, planrt_sum, 0, 0, c, s); /* warm: buffers, first calls */
	CUDA(cudaStreamSynchronize(s));
	int reps = 10;
	double t0 = planrt_now();
	for (int i = 0; i < reps; i++)
		run(planrt_coll_allreduce, x, x, n, planrt_f32, planrt_sum, 0, 0, c, s);
	CUDA(cudaStreamSynchronize(s));
	double t = (planrt_now() - t0) / reps;
	CUDA(cudaFree(x));
	return t;
}

int main(int argc, char **argv)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		printf("skip: no CUDA GPU here (this test runs on the GPU machine: scripts/gpu-check.sh)\n");
		return 77;
	}
	planrt_want_threads_();
	int rank, world;
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	const int sizes[1] = {1};
	const char *names[1] = {"one"};
	PLANRT_CHECK(planrt_mesh_init(1, sizes, names));
	CUDA(cudaSetDevice(0));
	planrt_comm_t c = planrt_axis_comm(0);

	PLANRT_CHECK(planrt_nccl_open_(c, 2, 2));
	every_kind("NCCL", planrt_nccl_run_, c);
	nccl_p2p(c);
	alltoallv_one("NCCL", c, 0);
	int nccl_fail = failures;
	printf("%s: NCCL (a communicator of one from a unique id): every collective kind in every dtype, in place and "
	       "not, p2p on channel communicators, alltoallv\n",
	       nccl_fail ? "FAIL" : "ok");

	PLANRT_CHECK(planrt_staged_start_(planrt_cu_stage_ops_()));
	PLANRT_CHECK(planrt_staged_add_(c, 0, 0));
	every_kind("MPI device backend", staged_run, c);
	alltoallv_one("MPI device backend", c, 1);
	printf("%s: the MPI device backend on the GPU (pinned staging, the gate): every collective kind in every dtype\n",
	       failures > nccl_fail ? "FAIL" : "ok");
	staged_ordering(c, 300);

	size_t n = (size_t)16 << 20; /* 64 MiB of f32 */
	double t_nccl = time_allreduce(planrt_nccl_run_, c, n), t_mpi = time_allreduce(staged_run, c, n);
	printf("cost: allreduce of 64 MiB on one rank: NCCL %.3f ms, MPI device backend %.3f ms (its two copies through "
	       "pinned host memory: %.1f GB/s each way)\n",
	       t_nccl * 1e3, t_mpi * 1e3, 2 * (double)n * 4 / t_mpi / 1e9);
	planrt_staged_stop_();
	planrt_finalize();
	return tally_report("the device comm backends on one GPU");
}
