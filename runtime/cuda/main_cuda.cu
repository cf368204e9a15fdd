/* main_cuda.cu: planrt_cuda_main, a CUDA program's entry point, and the phase-end synchronisation.
 *
 * planrt_cuda_main answers --help without a GPU; otherwise it checks that a device exists before
 * MPI starts, and if none does prints one line (the CUDA runtime's reason) and exits with status 1.
 * It binds the rank to the GPU of its local rank on the node, opens the device layer
 * (device_cuda.cu) with NCCL's communicators made once the mesh exists, and runs planrt_main. The
 * program links the CUDA runtime statically, which loads the driver itself: it never links
 * libcuda, so it starts anywhere. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void planrt_cu_synchronize(void)
{
	planrt_cu_check_(cudaDeviceSynchronize(), "a kernel (cudaDeviceSynchronize)");
	planrt_cu_settle_sync_();
	planrt_cu_sample_memory_();
}

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
	planrt_cu_device_open_(local_rank() % count, program, planrt_nccl_start_);
	int rc = planrt_main(argc, argv, program);
	planrt_cu_blas_destroy_();
	planrt_cu_device_close_();
	return rc;
}
