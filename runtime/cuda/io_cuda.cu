/* io_cuda.cu: the CUDA target's I/O kernels, through the host. Input batches, parameter
 * initialisation, --save and the sharded checkpoints are planrt's CPU code (program.c,
 * checkpoint.c, dataset.c) on a host copy of the device buffer: init reads the device block first
 * (positions outside the parameter's elements keep their values) and writes it back, save and
 * checkpoint writes read it, checkpoint reads write it. Every path waits for the stream, so the
 * host never sees a buffer a kernel is still writing. Input batches are loaded into host memory
 * and copied to the device on the copy stream (the copy returns once the host buffer is staged).
 * planrt_cu_copy moves offloaded state between pinned host memory and the device on its stream. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"

#include <stdlib.h>
#include <string.h>

static void *host_block(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);
	if (!p)
		planrt_fatal("out of memory for a host copy of %zu bytes", bytes);
	return p;
}

static void to_host(void *dst, const void *src, size_t bytes, int stream)
{
	cudaStream_t s = planrt_cu_stream(stream);
	planrt_cu_check_(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to the host");
	planrt_cu_check_(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

static void to_device(void *dst, const void *src, size_t bytes, int stream)
{
	cudaStream_t s = planrt_cu_stream(stream);
	planrt_cu_check_(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to the device");
	planrt_cu_check_(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void planrt_cu_load_data(planrt_ctx_t *ctx, void *dst, int input, const char *name, planrt_dtype_t t, int rank,
			 const int64_t *gdims, const int64_t *ldims, const int64_t *offs, int64_t classes, int stream)
{
	size_t bytes = planrt_dtype_size(t);
	for (int d = 0; d < rank; d++)
		bytes *= (size_t)(ldims[d] > 0 ? ldims[d] : 0);
	void *host = host_block(bytes);
	planrt_load_data(ctx, host, input, name, t, rank, gdims, ldims, offs, classes);
	/* from pageable memory the copy returns once the bytes are staged: host may go */
	planrt_cu_check_(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, planrt_cu_stream(stream)),
			 "cudaMemcpyAsync of an input batch");
	free(host);
}

void planrt_cu_init_param(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
			  int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	to_host(host, dst, bytes, stream);
	planrt_init_param(ctx, host, dtype, param, lo, n);
	to_device(dst, host, bytes, stream);
	free(host);
}

void planrt_cu_save_param(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int64_t lo, int64_t n,
			  int shard_axis, int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	to_host(host, src, bytes, stream);
	planrt_save_param(ctx, host, dtype, param, lo, n, shard_axis);
	free(host);
}

void planrt_cu_ckpt_write(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int param, int kind, int64_t lo,
			  int64_t n, int shard_axis, int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	to_host(host, src, bytes, stream);
	planrt_ckpt_write(ctx, host, dtype, param, kind | PLANRT_CKPT_COPY, lo, n, shard_axis); /* host goes now */
	free(host);
}

void planrt_cu_ckpt_read(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int param, int kind, int64_t lo, int64_t n,
			 int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	to_host(host, dst, bytes, stream);
	planrt_ckpt_read(ctx, host, dtype, param, kind, lo, n);
	to_device(dst, host, bytes, stream);
	free(host);
}

void planrt_cu_ckpt_write_local(planrt_ctx_t *ctx, const void *src, planrt_dtype_t dtype, int64_t n, int id, int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	to_host(host, src, bytes, stream);
	planrt_ckpt_write_local_copy_(ctx, host, dtype, n, id); /* host goes now */
	free(host);
}

void planrt_cu_ckpt_read_local(planrt_ctx_t *ctx, void *dst, planrt_dtype_t dtype, int64_t n, int id, int stream)
{
	size_t bytes = planrt_dtype_size(dtype) * (size_t)(n > 0 ? n : 0);
	void *host = host_block(bytes);
	planrt_ckpt_read_local(ctx, host, dtype, n, id);
	to_device(dst, host, bytes, stream);
	free(host);
}

void planrt_cu_copy(void *dst, const void *src, int64_t bytes, int stream)
{
	if (bytes > 0)
		planrt_cu_check_(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, planrt_cu_stream(stream)),
				 "cudaMemcpyAsync (offload copy)");
}
