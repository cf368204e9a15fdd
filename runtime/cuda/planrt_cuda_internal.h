/* planrt_cuda_internal.h: what planrt_cuda's own sources share (device_cuda.cu, main_cuda.cu, kernels_cuda.cu,
 * io_cuda.cu, exec_cuda.cu, sync_cuda.cu, moe_cuda.cu, comm_cuda.c, comm_nccl.c, stage_cuda.cu). Not for
 * generated programs. */
#ifndef PLANRT_CUDA_INTERNAL_H
#define PLANRT_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "planrt.h"
#include "planrt_binding.h"

#ifdef __cplusplus
extern "C" {
#endif

/* planrt_fatal with the CUDA error's text when e is not cudaSuccess */
void planrt_cu_check_(cudaError_t e, const char *what);
cudaStream_t planrt_cu_stream_(int stream); /* planrt_cu_stream, for C sources */
void planrt_cu_blas_destroy_(void);
void planrt_cu_epilogue_destroy_(void); /* gemm_epilogue_cuda.cu: cuBLASLt's plans and workspaces */
/* whether the epilogue calls fold their adds in (1) or compute them as the printed loops did
 * (PLANRT_EPILOGUE=0: bit for bit the unfused program's, to tell a fusion's numbers from the rest) */
int planrt_cu_epilogue_fused_(void);
/* dst (of dtype t: f32, bf16, f16) += src (f32), each element rounded once (step.c's planrt_accumulate_f32) */
void planrt_cu_accumulate_f32_(void *dst, planrt_dtype_t t, const float *src, int64_t n, int stream);
/* after the device is done (sync_cuda.cu): the fp16 loss-scale verdict of the step into
 * ctx->step_skipped; an async staleness violation stops the run */
void planrt_cu_settle_sync_(void);
/* the program planrt_cuda_main runs (its mesh and stages, for the communicators) */
struct planrt_program;
const struct planrt_program *planrt_cu_program_(void);
/* device_cuda.cu, for main_cuda.cu: the device layer on GPU dev for program (start: what runs once
 * the mesh exists), and closed; the peak of device memory in use sampled */
void planrt_cu_device_open_(int dev, const struct planrt_program *program, void (*start)(void));
void planrt_cu_device_close_(void);
void planrt_cu_sample_memory_(void);
/* device_cuda.cu: the compute stream's stalls for communication, measured with --trace or
 * PLANRT_REPORT_TIMING: s waits for ev (timed when s is the compute stream), or a span around work
 * enqueued on s (begin returns -1 when not measured); settle, after a device synchronisation, adds
 * the spans to the device's comm_wait_s and the trace */
void planrt_cu_wait_comm_(cudaStream_t s, cudaEvent_t ev, const char *what);
int planrt_cu_span_begin_(cudaStream_t s, const char *what);
void planrt_cu_span_end_(int span, cudaStream_t s);
void planrt_cu_settle_spans_(void);

/* ------------------------------------------------------------------ the device comm layer
 * comm_cuda.c: each device communicator's backend, chosen from its members' GPUs under PLANRT_COMM
 * (planrt_binding.h): NCCL, the MPI device backend (comm/staged.c over stage_cuda.cu) or copies
 * for a group of one; the layer planrt's collectives on a device stream go through. The mode is set
 * before the device opens; start runs when the mesh exists (every axis group), pair when the
 * program makes a tied-parameter pair (collective over the world; pair NULL off it). The
 * NCCL-shaped shorthands below take (send, recv, count, dtype, op, comm, stream) and go through it.
 * In place as NCCL: recv == send for allreduce, recv == send + rank * recvcount for reduce-scatter,
 * send == recv + rank * sendcount for allgather. The counters of planrt_bytes_sent_by count these
 * calls as planc explain predicts them, whichever backend runs them. */
void planrt_cu_comm_mode_(planrt_comm_mode_t mode);
void planrt_cu_comm_start_(void);
void planrt_cu_comm_pair_(planrt_comm_t pair);
planrt_result_t planrt_nccl_allreduce(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_op_t op,
				      planrt_comm_t c, cudaStream_t stream);
planrt_result_t planrt_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, planrt_dtype_t t,
					   planrt_op_t op, planrt_comm_t c, cudaStream_t stream);
planrt_result_t planrt_nccl_allgather(const void *send, void *recv, size_t sendcount, planrt_dtype_t t, planrt_comm_t c,
				      cudaStream_t stream);
planrt_result_t planrt_nccl_alltoall(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_comm_t c,
				     cudaStream_t stream);
planrt_result_t planrt_nccl_send(const void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream);
planrt_result_t planrt_nccl_recv(void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream);

/* comm_nccl.c: the NCCL backend. open makes c's NCCL communicator from one unique id (member 0's,
 * broadcast over c's MPI communicator) and nchan x ncolors channel communicators split from it
 * (planrt_channel_lane_); collective over c; also for a group of one (the unit test). run and
 * alltoallv enqueue on stream; every call is recorded for the watchdog, which aborts the
 * communicators and the process with the pending operation named when one waits longer than
 * PLANRT_WATCHDOG seconds or NCCL reports an asynchronous error. */
planrt_result_t planrt_nccl_open_(planrt_comm_t c, int nchan, int ncolors);
int planrt_nccl_has_(planrt_comm_t c);
planrt_result_t planrt_nccl_run_(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				 planrt_op_t op, int peer, int tag, planrt_comm_t c, cudaStream_t stream);
planrt_result_t planrt_nccl_alltoallv_(const void *send, const int64_t *sc, const int64_t *sd, void *recv,
				       const int64_t *rc, const int64_t *rd, planrt_dtype_t t, planrt_comm_t c,
				       cudaStream_t stream);

/* stage_cuda.cu: the MPI device backend's interface to the GPU (planrt_stage_ops_t): pinned mapped
 * host memory, async copies, events, and a gate (cuStreamWaitValue32 on a host flag, or a waiting
 * kernel where the driver has no stream memory operations) */
struct planrt_stage_ops;
const struct planrt_stage_ops *planrt_cu_stage_ops_(void);

#ifdef __CUDACC__
/* A kernel over n elements with planrt's grid and block, on a stream, checked (nothing when n is 0);
 * and the grid-stride loop its body walks them with. */
#define LAUNCH(kernel, n, stream, ...)                                                                          \
	do {                                                                                                    \
		if ((n) > 0) {                                                                                  \
			kernel<<<planrt_cu_grid(n), PLANRT_CU_BLOCK, 0, planrt_cu_stream(stream)>>>(__VA_ARGS__);  \
			planrt_cu_check_launch(#kernel);                                                        \
		}                                                                                               \
	} while (0)
#define GRID_STRIDE(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
#endif

#ifdef __cplusplus
}
#endif
#endif
