/* device_copy.h: the device-memory helpers the GPU unit tests share (test_attention_tiles_gpu.cu,
 * test_index_gpu.cu, test_epilogue_gpu.cu): a host buffer copied into a new device allocation, and
 * a device buffer copied back; a CUDA error ends the test with a FAIL line. */
#ifndef TESTS_CUDA_DEVICE_COPY_H
#define TESTS_CUDA_DEVICE_COPY_H

#include <stdio.h>
#include <stdlib.h>

/* a device allocation of room bytes holding h's bytes at offset (room >= offset + bytes) */
static inline void *to_device_at(const void *h, size_t bytes, size_t room, size_t offset)
{
	char *d = NULL;
	if (cudaMalloc(&d, room) != cudaSuccess || cudaMemcpy(d + offset, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
		printf("FAIL: cudaMalloc / cudaMemcpy of %zu bytes (%s)\n", bytes, cudaGetErrorString(cudaGetLastError()));
		exit(1);
	}
	return d;
}

static inline void *to_device(const void *h, size_t bytes)
{
	return to_device_at(h, bytes, bytes, 0);
}

/* d's bytes into h */
static inline void from_device(void *h, const void *d, size_t bytes)
{
	if (cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
		printf("FAIL: cudaMemcpy back (%s)\n", cudaGetErrorString(cudaGetLastError()));
		exit(1);
	}
}

/* d's bytes in a new host buffer */
static inline void *to_host(const void *d, size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);
	from_device(h, d, bytes);
	return h;
}

#endif
