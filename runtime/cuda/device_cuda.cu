/* device_cuda.cu: the CUDA device layer, the streams and events of planrt_cuda.h, and
 * planrt_cuda_main.
 *
 * Memory. Persistent state and the arena are cudaMalloc'd, each state buffer on its own and the arena
 * as one allocation of exactly the planned bytes, all zero-filled. The metric scalars (the loss,
 * the gradient norm, the clipping coefficient: what the host reads every step) and the state the
 * program marks offloaded (planrt_cu_host_state) are pinned, mapped host memory: kernels reach
 * them through unified addressing and the host reads them after the phase's synchronisation.
 * PLANRT_REPORT_MEMORY adds what was allocated on the device and in pinned host memory, and the
 * peak of the device memory in use (cudaMemGetInfo sampled at each synchronisation, less what was
 * in use before the first allocation: the CUDA context), which includes cuBLAS's and NCCL's own
 * buffers.
 *
 * Streams are created non-blocking on first use; the host "stream" is the calling thread. Events
 * are created on first record; waiting for one never recorded waits for nothing.
 *
 * planrt_cuda_main answers --help without a GPU; otherwise it checks that a device exists before
 * MPI starts, and if none does prints one line (the CUDA runtime's reason) and exits with status 1.
 * The program links the CUDA runtime statically, which loads the driver itself: it never links
 * libcuda, so it starts anywhere. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_STREAMS = 64, MAX_HOST_STATE = 4096 };

static cudaStream_t streams[MAX_STREAMS];
static cudaEvent_t entry_event;
static int sm_count = 132;
static size_t device_bytes, pinned_bytes, baseline_used, peak_used;
static void **host_state[MAX_HOST_STATE];
static int nhost_state;

void planrt_cu_check_(cudaError_t e, const char *what)
{
	if (e != cudaSuccess)
		planrt_fatal("CUDA %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static const planrt_program_t *running;

const planrt_program_t *planrt_cu_program_(void)
{
	return running;
}

cudaStream_t planrt_cu_stream_(int stream)
{
	return planrt_cu_stream(stream);
}

cudaStream_t planrt_cu_stream(int stream)
{
	if (stream == PLANRT_STREAM_HOST)
		stream = PLANRT_STREAM_COMPUTE; /* work the host enqueues itself goes in compute order */
	if (stream < 0 || stream >= MAX_STREAMS)
		planrt_fatal("internal error: stream %d (at most %d)", stream, MAX_STREAMS);
	if (!streams[stream])
		planrt_cu_check_(cudaStreamCreateWithFlags(&streams[stream], cudaStreamNonBlocking), "cudaStreamCreate");
	return streams[stream];
}

struct planrt_cu_event {
	cudaEvent_t e;
};

void planrt_cu_record(planrt_cu_event_t *ev, int stream)
{
	if (!*ev) {
		*ev = (planrt_cu_event_t)calloc(1, sizeof **ev);
		if (!*ev)
			planrt_fatal("out of memory for an event");
		planrt_cu_check_(cudaEventCreateWithFlags(&(*ev)->e, cudaEventDisableTiming), "cudaEventCreate");
	}
	planrt_cu_check_(cudaEventRecord((*ev)->e, planrt_cu_stream(stream)), "cudaEventRecord");
}

void planrt_cu_wait(int stream, planrt_cu_event_t *ev)
{
	if (!*ev)
		return; /* never recorded: nothing to wait for */
	if (stream == PLANRT_STREAM_HOST)
		planrt_cu_check_(cudaEventSynchronize((*ev)->e), "cudaEventSynchronize");
	else
		planrt_cu_check_(cudaStreamWaitEvent(planrt_cu_stream(stream), (*ev)->e, 0), "cudaStreamWaitEvent");
}

void planrt_cu_record_entry(void)
{
	if (!entry_event)
		planrt_cu_check_(cudaEventCreateWithFlags(&entry_event, cudaEventDisableTiming), "cudaEventCreate");
	planrt_cu_check_(cudaEventRecord(entry_event, planrt_cu_stream(PLANRT_STREAM_COMPUTE)), "cudaEventRecord");
}

void planrt_cu_wait_entry(int stream)
{
	if (!entry_event)
		return;
	if (stream == PLANRT_STREAM_HOST)
		planrt_cu_check_(cudaEventSynchronize(entry_event), "cudaEventSynchronize");
	else
		planrt_cu_check_(cudaStreamWaitEvent(planrt_cu_stream(stream), entry_event, 0), "cudaStreamWaitEvent");
}

static void sample_memory(void)
{
	size_t free_b = 0, total = 0;
	if (cudaMemGetInfo(&free_b, &total) == cudaSuccess && total - free_b > peak_used)
		peak_used = total - free_b;
}

void planrt_cu_synchronize(void)
{
	planrt_cu_check_(cudaDeviceSynchronize(), "a kernel (cudaDeviceSynchronize)");
	planrt_cu_settle_sync_();
	sample_memory();
}

unsigned planrt_cu_grid(int64_t n)
{
	int64_t blocks = (n + PLANRT_CU_BLOCK - 1) / PLANRT_CU_BLOCK, most = (int64_t)sm_count * 16;
	return (unsigned)(blocks < 1 ? 1 : blocks > most ? most : blocks);
}

void planrt_cu_check_launch(const char *what)
{
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		planrt_fatal("CUDA launch of %s failed: %s", what, cudaGetErrorString(e));
}

void planrt_cu_host_state(void **const *ptrs)
{
	for (; ptrs && *ptrs; ptrs++) {
		if (nhost_state == MAX_HOST_STATE)
			planrt_fatal("internal error: more than %d offloaded state buffers", MAX_HOST_STATE);
		host_state[nhost_state++] = *ptrs;
	}
}

/* ------------------------------------------------------------------ the device layer */

static int in_host_memory(const planrt_state_buf_t *b)
{
	if (!b)
		return 0;
	if (b->kind == planrt_state_metric)
		return 1;
	for (int i = 0; i < nhost_state; i++)
		if (host_state[i] == b->ptr)
			return 1;
	return 0;
}

static __global__ void fill64_kernel(uint64_t *p, size_t words, uint64_t value)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
		p[i] = value;
}

static planrt_result_t cuda_alloc(size_t bytes, const planrt_state_buf_t *b, void **out)
{
	void *p = NULL;
	*out = NULL;
	if (!bytes)
		bytes = 64;
	if (in_host_memory(b)) {
		cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
		if (e != cudaSuccess)
			return planrt_error_(planrt_system_error, "cudaHostAlloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
		memset(p, 0, bytes);
		pinned_bytes += bytes;
	} else {
		cudaError_t e = cudaMalloc(&p, bytes);
		if (e != cudaSuccess)
			return planrt_error_(planrt_system_error, "cudaMalloc of %zu bytes on the GPU: %s", bytes,
					     cudaGetErrorString(e));
		planrt_cu_check_(cudaMemset(p, 0, bytes), "cudaMemset");
		device_bytes += bytes;
	}
	sample_memory();
	*out = p;
	return planrt_success;
}

static void cuda_release(void *p, const planrt_state_buf_t *b)
{
	if (in_host_memory(b))
		cudaFreeHost(p);
	else
		cudaFree(p);
}

static void cuda_fill64(void *p, size_t words, uint64_t value)
{
	if (!words)
		return;
	fill64_kernel<<<planrt_cu_grid((int64_t)words), PLANRT_CU_BLOCK>>>((uint64_t *)p, words, value);
	planrt_cu_check_launch("fill64");
	planrt_cu_check_(cudaDeviceSynchronize(), "filling the arena");
}

static void cuda_to_host(void *dst, const void *src, size_t bytes)
{
	planrt_cu_check_(cudaDeviceSynchronize(), "a kernel (cudaDeviceSynchronize)");
	planrt_cu_check_(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

static void cuda_report(char *buf, size_t n)
{
	sample_memory();
	snprintf(buf, n, " device=cuda device_allocated=%zu device_peak_used=%zu host_pinned=%zu", device_bytes,
		 peak_used > baseline_used ? peak_used - baseline_used : 0, pinned_bytes);
}

static void cuda_start(void)
{
	planrt_nccl_start_();
}

static const planrt_device_t cuda_device = {"GPU", cuda_alloc, cuda_release, cuda_fill64, cuda_to_host, cuda_report,
					    cuda_start};

/* ------------------------------------------------------------------ the entry point */

/* the rank on this node, from the launcher (the GPU it uses), before MPI starts */
static int local_rank(void)
{
	const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "PMI_LOCAL_RANK",
			      "LOCAL_RANK"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return atoi(v);
	}
	return 0;
}

static int world_rank_env(void)
{
	const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return atoi(v);
	}
	return 0;
}

int planrt_cuda_main(int argc, char **argv, const planrt_program_t *program)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return planrt_main(argc, argv, program); /* no device needed to answer */
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count < 1) {
		fprintf(stderr,
			"planrt: rank %d: no CUDA GPU: %s%s; this program was built with --target cuda and needs an NVIDIA "
			"GPU and driver (build for the CPU without --target)\n",
			world_rank_env(), e != cudaSuccess ? cudaGetErrorString(e) : "no device found",
			e == cudaErrorInsufficientDriver ? " (no NVIDIA driver here, or one older than this CUDA runtime)" : "");
		return 1;
	}
	int dev = local_rank() % count;
	planrt_cu_check_(cudaSetDevice(dev), "cudaSetDevice");
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
		sm_count = prop.multiProcessorCount;
	planrt_cu_check_(cudaFree(0), "creating the CUDA context");
	size_t free_b = 0, total = 0;
	if (cudaMemGetInfo(&free_b, &total) == cudaSuccess)
		baseline_used = peak_used = total - free_b;
	planrt_device_set(&cuda_device);
	running = program;
	int rc = planrt_main(argc, argv, program);
	running = NULL;
	planrt_cu_blas_destroy_();
	planrt_device_set(NULL);
	return rc;
}
