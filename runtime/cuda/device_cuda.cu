/* device_cuda.cu: the CUDA device layer and the streams and events of planrt_cuda.h (main_cuda.cu
 * chooses the GPU and runs planrt_cuda_main).
 *
 * Memory. Persistent state and the arena are cudaMalloc'd, each state buffer on its own and the arena
 * as one allocation of exactly the planned bytes, all zero-filled. The metric scalars (the loss,
 * the gradient norm, the clipping coefficient: what the host reads every step) and the state the
 * program marks offloaded (planrt_cu_host_state) are pinned, mapped host memory: kernels reach
 * them through unified addressing and the host reads them after the phase's synchronisation.
 * PLANRT_REPORT_MEMORY adds what was allocated on the device and in pinned host memory for the
 * plan, the pinned staging buffers of the MPI device backend (host_staging, its peak; not the
 * plan's), and the peak of the device memory in use (cudaMemGetInfo sampled at each
 * synchronisation, less what was in use before the first allocation: the CUDA context), which
 * includes cuBLAS's and NCCL's own buffers (and, with several ranks on one GPU, the others').
 *
 * Streams are created non-blocking on first use; the host "stream" is the calling thread. Events
 * are created on first record; waiting for one never recorded waits for nothing.
 *
 * Waiting for communication. With --trace or PLANRT_REPORT_TIMING the compute stream's stalls for
 * communication are measured on the device: around each wait of the compute stream for an event of
 * a communication stream (comm, the pipeline channels; a request's planrt_wait) a timing event is
 * recorded right before and right after the wait, so the time between them is how long compute
 * stood still (a wait for something already done costs nothing); a collective enqueued on the
 * compute stream itself counts whole. At each synchronisation the spans are read, added to the
 * device's comm_wait_s (PLANRT_REPORT_TIMING's wait_s) and, with --trace, written as "wait" events
 * on a track of the rank's own (the device times mapped to the host's clock through an event
 * recorded at the synchronisation).
 */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_device.h"
#include "planrt_staged.h"

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
	int stream; /* where it was last recorded */
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
	(*ev)->stream = stream;
}

void planrt_cu_wait(int stream, planrt_cu_event_t *ev)
{
	if (!*ev)
		return; /* never recorded: nothing to wait for */
	int from = (*ev)->stream;
	if (stream == PLANRT_STREAM_HOST)
		planrt_cu_check_(cudaEventSynchronize((*ev)->e), "cudaEventSynchronize");
	else if (stream == PLANRT_STREAM_COMPUTE && (from == PLANRT_STREAM_COMM || from >= PLANRT_STREAM_P2P))
		planrt_cu_wait_comm_(planrt_cu_stream(stream), (*ev)->e,
				     from == PLANRT_STREAM_COMM ? "the comm stream" : "a pipeline channel");
	else
		planrt_cu_check_(cudaStreamWaitEvent(planrt_cu_stream(stream), (*ev)->e, 0), "cudaStreamWaitEvent");
}

/* ------------------------------------------------------------------ waiting for communication */

typedef struct span {
	cudaEvent_t before, after;
	const char *what;
} span_t;

static span_t *spans;
static int nspans, capspans;
static cudaEvent_t *spare; /* timing events to reuse */
static int nspare, capspare;
static double comm_wait_total;
static int report_timing = -1;

static int measuring(void)
{
	if (report_timing < 0) {
		const char *v = getenv("PLANRT_REPORT_TIMING");
		report_timing = v && *v && strcmp(v, "0");
	}
	return report_timing || planrt_tracing_;
}

static cudaEvent_t timing_event(void)
{
	if (nspare)
		return spare[--nspare];
	cudaEvent_t e;
	planrt_cu_check_(cudaEventCreate(&e), "cudaEventCreate (timing)");
	return e;
}

static void spare_event(cudaEvent_t e)
{
	if (nspare == capspare) {
		int cap = capspare ? 2 * capspare : 64;
		cudaEvent_t *grown = (cudaEvent_t *)realloc(spare, sizeof *spare * (size_t)cap);
		if (!grown) {
			cudaEventDestroy(e);
			return;
		}
		spare = grown;
		capspare = cap;
	}
	spare[nspare++] = e;
}

int planrt_cu_span_begin_(cudaStream_t s, const char *what)
{
	if (s != planrt_cu_stream(PLANRT_STREAM_COMPUTE) || !measuring())
		return -1;
	if (nspans == capspans) {
		int cap = capspans ? 2 * capspans : 256;
		span_t *grown = (span_t *)realloc(spans, sizeof *spans * (size_t)cap);
		if (!grown)
			return -1;
		spans = grown;
		capspans = cap;
	}
	span_t *sp = &spans[nspans];
	sp->before = timing_event();
	sp->after = timing_event();
	sp->what = what;
	planrt_cu_check_(cudaEventRecord(sp->before, s), "cudaEventRecord (timing)");
	return nspans++;
}

void planrt_cu_span_end_(int span, cudaStream_t s)
{
	if (span >= 0)
		planrt_cu_check_(cudaEventRecord(spans[span].after, s), "cudaEventRecord (timing)");
}

void planrt_cu_wait_comm_(cudaStream_t s, cudaEvent_t ev, const char *what)
{
	int span = planrt_cu_span_begin_(s, what);
	planrt_cu_check_(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent");
	planrt_cu_span_end_(span, s);
}

/* the spans since the last synchronisation into comm_wait_total and the trace (the device is idle) */
void planrt_cu_settle_spans_(void)
{
	if (!nspans)
		return;
	cudaStream_t compute = planrt_cu_stream(PLANRT_STREAM_COMPUTE);
	cudaEvent_t now_ev = timing_event();
	planrt_cu_check_(cudaEventRecord(now_ev, compute), "cudaEventRecord (timing)");
	planrt_cu_check_(cudaEventSynchronize(now_ev), "cudaEventSynchronize (timing)");
	double now = planrt_now();
	for (int i = 0; i < nspans; i++) {
		float waited = 0, ago = 0;
		if (cudaEventElapsedTime(&waited, spans[i].before, spans[i].after) == cudaSuccess &&
		    cudaEventElapsedTime(&ago, spans[i].before, now_ev) == cudaSuccess) {
			comm_wait_total += waited * 1e-3;
			if (planrt_tracing_ && waited > 0) {
				char args[96];
				snprintf(args, sizeof args, "\"on\":\"%s\",\"stream\":\"compute\"", spans[i].what);
				planrt_trace_complete_("comm wait", "wait", 1, now - ago * 1e-3, waited * 1e-3, args);
			}
		}
		spare_event(spans[i].before);
		spare_event(spans[i].after);
	}
	spare_event(now_ev);
	nspans = 0;
}

static double cuda_comm_wait_s(void)
{
	return comm_wait_total;
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

void planrt_cu_sample_memory_(void)
{
	size_t free_b = 0, total = 0;
	if (cudaMemGetInfo(&free_b, &total) == cudaSuccess && total - free_b > peak_used)
		peak_used = total - free_b;
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
	planrt_cu_sample_memory_();
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
	planrt_cu_sample_memory_();
	snprintf(buf, n, " device=cuda device_allocated=%zu device_peak_used=%zu host_pinned=%zu host_staging=%zu",
		 device_bytes, peak_used > baseline_used ? peak_used - baseline_used : 0, pinned_bytes,
		 planrt_staged_host_peak_());
}

/* the device layer (planrt_device.h) once the GPU is chosen; start: what runs when the mesh exists */
static planrt_device_t cuda_device = {"GPU", cuda_alloc, cuda_release, cuda_fill64, cuda_to_host, cuda_report, NULL,
				      cuda_comm_wait_s};

void planrt_cu_device_open_(int dev, const planrt_program_t *program, void (*start)(void))
{
	planrt_cu_check_(cudaSetDevice(dev), "cudaSetDevice");
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
		sm_count = prop.multiProcessorCount;
	planrt_cu_check_(cudaFree(0), "creating the CUDA context");
	size_t free_b = 0, total = 0;
	if (cudaMemGetInfo(&free_b, &total) == cudaSuccess)
		baseline_used = peak_used = total - free_b;
	cuda_device.start = start;
	planrt_device_set(&cuda_device);
	running = program;
}

void planrt_cu_device_close_(void)
{
	running = NULL;
	planrt_device_set(NULL);
}
