/* planrt_cuda_internal.h: what planrt_cuda's own sources share (device_cuda.cu, main_cuda.cu, kernels_cuda.cu,
 * io_cuda.cu, exec_cuda.cu, sync_cuda.cu, moe_cuda.cu, comm_nccl.c). Not for generated programs. */
#ifndef PLANRT_CUDA_INTERNAL_H
#define PLANRT_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* planrt_fatal with the CUDA error's text when e is not cudaSuccess */
void planrt_cu_check_(cudaError_t e, const char *what);
cudaStream_t planrt_cu_stream_(int stream); /* planrt_cu_stream, for C sources */
void planrt_cu_blas_destroy_(void);
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

/* ------------------------------------------------------------------ comm_nccl.c: the NCCL layer
 * NCCL-shaped: (send, recv, count, dtype, op, comm, stream), enqueued on stream. comm is a planrt
 * communicator (a mesh axis, a tied pair or the world); its NCCL communicator was made when the
 * mesh started (planrt_nccl_start_) or with the pair (planrt_nccl_pair_). A communicator of one
 * member copies (or does nothing in place). In place as NCCL: recv == send for allreduce,
 * recv == send + rank * recvcount for reduce-scatter, send == recv + rank * sendcount for
 * allgather. The counters of planrt_bytes_sent_by count these calls as planc explain predicts
 * them. Every call is recorded for the watchdog, which aborts the communicators and the process
 * with the pending operation named when one waits longer than PLANRT_WATCHDOG seconds or NCCL
 * reports an asynchronous error. */
void planrt_nccl_start_(void);
void planrt_nccl_pair_(int axis, int a, int b, planrt_comm_t mpi_pair);
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

/* A device request: an event recorded on the stream after the operation; planrt_wait on it makes
 * the compute stream wait for it (device side), planrt_test queries it. */
planrt_request_t planrt_cu_request_(cudaStream_t stream, const char *what);

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
