/* stage_cuda.cu: the GPU as the MPI device backend (comm/staged.c) sees it: planrt_stage_ops_t with
 * CUDA. Staging buffers and the lanes' flags are pinned, mapped host memory (cudaHostAlloc), so the
 * copies between them and device memory are asynchronous DMA on the operation's stream and the GPU
 * can read a flag; events are CUDA events (timing off).
 *
 * The gate, which holds a stream until a lane thread has finished its MPI call, is
 * cuStreamWaitValue32 on the lane's flag (GEQ: a wrap-safe comparison), found through the CUDA
 * runtime's driver entry points so that the program still never links libcuda. The stream waits in
 * the GPU's front end: no thread, no SM, no host callback (host callbacks may be serialised across
 * streams by the driver, and a callback blocked in MPI could hold up another stream's). Where the
 * driver has no stream memory operations (the entry point is missing, or the first wait fails) a
 * one-thread kernel polls the flag instead, sleeping between reads. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_staged.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

struct planrt_stage_event {
	cudaEvent_t e;
};

typedef CUresult (*wait_value_fn)(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
static wait_value_fn wait_value;
static int gate_checked;

static void *host_alloc(size_t bytes)
{
	void *p = NULL;
	return cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess ? p : NULL;
}

static void host_free(void *p)
{
	cudaFreeHost(p);
}

static void to_host(void *host, const void *dev, size_t bytes, planrt_stream_t s)
{
	planrt_cu_check_(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)s),
			 "cudaMemcpyAsync to a staging buffer");
}

static void to_device(void *dev, const void *host, size_t bytes, planrt_stream_t s)
{
	planrt_cu_check_(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s),
			 "cudaMemcpyAsync from a staging buffer");
}

static planrt_stage_event_t event_new(void)
{
	planrt_stage_event_t e = (planrt_stage_event_t)calloc(1, sizeof *e);
	if (!e)
		planrt_fatal("out of memory for an event");
	planrt_cu_check_(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming), "cudaEventCreate");
	return e;
}

static void event_free(planrt_stage_event_t e)
{
	cudaEventDestroy(e->e); /* released once it has completed, if a stream still waits for it */
	free(e);
}

static void record(planrt_stage_event_t e, planrt_stream_t s)
{
	planrt_cu_check_(cudaEventRecord(e->e, (cudaStream_t)s), "cudaEventRecord");
}

static int query(planrt_stage_event_t e)
{
	cudaError_t r = cudaEventQuery(e->e);
	if (r != cudaSuccess && r != cudaErrorNotReady)
		planrt_cu_check_(r, "cudaEventQuery (an operation of the MPI device backend)");
	return r == cudaSuccess;
}

/* a lane thread waits for a staging copy: polled, yielding the core and then sleeping briefly (with
 * several ranks on one GPU and a lane thread per communicator, spinning in cudaEventSynchronize
 * would take the cores the ranks' own threads need) */
static void host_wait(planrt_stage_event_t e)
{
	for (unsigned spins = 0; !query(e);)
		planrt_poll_backoff_(&spins);
}

/* (a request's planrt_wait: the compute stream's wait, timed when measured) */
static void stream_wait(planrt_stream_t s, planrt_stage_event_t e)
{
	planrt_cu_wait_comm_((cudaStream_t)s, e->e, "a started operation (MPI device backend)");
}

__global__ static void gate_kernel(const volatile uint32_t *flag, uint32_t value)
{
	while ((int32_t)(*flag - value) < 0)
		__nanosleep(1000);
}

static void find_wait_value(void)
{
	gate_checked = 1;
	void *fn = NULL;
	cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
	if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
	    found == cudaDriverEntryPointSuccess)
		wait_value = (wait_value_fn)fn;
	cudaGetLastError();
}

static void gate(planrt_stream_t s, volatile uint32_t *flag, uint32_t value)
{
	if (!gate_checked)
		find_wait_value();
	void *dflag = NULL;
	planrt_cu_check_(cudaHostGetDevicePointer(&dflag, (void *)flag, 0), "cudaHostGetDevicePointer (a lane's flag)");
	if (wait_value) {
		CUresult r = wait_value((CUstream)s, (CUdeviceptr)dflag, value, CU_STREAM_WAIT_VALUE_GEQ);
		if (r == CUDA_SUCCESS)
			return;
		wait_value = NULL; /* no stream memory operations here: the kernel from now on */
		if (planrt_world_rank_() <= 0)
			fprintf(stderr, "planrt: rank %d: cuStreamWaitValue32 failed (CUresult %d); the MPI device backend's "
					"streams wait with a polling kernel\n",
				planrt_world_rank_(), (int)r);
	}
	gate_kernel<<<1, 1, 0, (cudaStream_t)s>>>((const volatile uint32_t *)dflag, value);
	planrt_cu_check_launch("the MPI device backend's gate");
}

static planrt_stream_t compute(void)
{
	return (planrt_stream_t)planrt_cu_stream(PLANRT_STREAM_COMPUTE);
}

static int device = -1; /* the rank's GPU, made current in each lane thread */

static void thread_start(void)
{
	if (device >= 0)
		planrt_cu_check_(cudaSetDevice(device), "cudaSetDevice (a lane of the MPI device backend)");
}

static const planrt_stage_ops_t cuda_stage_ops = {"CUDA (pinned host memory)", host_alloc, host_free, to_host,
						  to_device, event_new, event_free, record, query, host_wait,
						  stream_wait, gate, compute, thread_start};

const planrt_stage_ops_t *planrt_cu_stage_ops_(void)
{
	if (device < 0)
		planrt_cu_check_(cudaGetDevice(&device), "cudaGetDevice");
	return &cuda_stage_ops;
}
