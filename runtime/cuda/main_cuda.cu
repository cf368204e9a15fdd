/* main_cuda.cu: planrt_cuda_main, a CUDA program's entry point, and the phase-end synchronisation.
 *
 * planrt_cuda_main answers --help without a GPU (adding the GPU settings); otherwise it checks that
 * a device exists before MPI starts, and if none does prints one line (the CUDA runtime's reason)
 * and exits with status 1. It binds the rank to its GPU (binding.c's rules: PLANRT_DEVICE, else the
 * launcher's local rank; fewer GPUs than local ranks is one line under PLANRT_COMM=nccl), opens the
 * device layer (device_cuda.cu) with the device communicators made once the mesh exists
 * (comm_cuda.c: NCCL, or MPI through host memory where ranks share a GPU), and runs planrt_main.
 * Unless PLANRT_COMM=nccl, MPI starts with MPI_THREAD_MULTIPLE, which the MPI device backend needs.
 * The program links the CUDA runtime statically, which loads the driver itself: it never links
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
	planrt_cu_settle_spans_();
	planrt_cu_settle_sync_();
	planrt_cu_sample_memory_();
}

static const char *env(const char *name)
{
	return getenv(name);
}

static int world_rank_env(void)
{
	const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "PLANRT_RUN_RANK"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return atoi(v);
	}
	return 0;
}

/* one line on stderr before MPI starts, status 1 */
static int refuse(const char *why)
{
	fprintf(stderr, "planrt: rank %d: %s\n", world_rank_env(), why);
	return 1;
}

static void print_gpu_help(void)
{
	printf("GPU (built with --target cuda):\n"
	       "  PLANRT_DEVICE=N or N0,N1,...  the GPU of each rank, among those CUDA_VISIBLE_DEVICES shows (default:\n"
	       "                                the rank's local rank on its node, from the launcher)\n"
	       "  PLANRT_COMM=auto|nccl|mpi     communication between ranks' GPUs: NCCL, or MPI through pinned host\n"
	       "                                memory; auto (default): NCCL where each rank has its own GPU, MPI for\n"
	       "                                groups whose ranks share one (NCCL refuses two ranks on a GPU)\n"
	       "  PLANRT_TF32=1                 TF32 for the f32 GEMMs\n");
	fflush(stdout);
}

int planrt_cuda_main(int argc, char **argv, const planrt_program_t *program)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { /* no device needed to answer */
			int rc = planrt_main(argc, argv, program);
			if (world_rank_env() == 0)
				print_gpu_help();
			return rc;
		}
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
	planrt_comm_mode_t mode;
	int local_rank, local_size, dev;
	const char *source;
	if (planrt_comm_mode_parse_(getenv("PLANRT_COMM"), &mode) != planrt_success ||
	    planrt_local_rank_(env, &local_rank, &local_size, &source) != planrt_success ||
	    planrt_choose_device_(local_rank, local_size, count, getenv("PLANRT_DEVICE"), mode, &dev) != planrt_success)
		return refuse(planrt_last_error());
	planrt_cu_comm_mode_(mode);
	if (mode != PLANRT_COMM_NCCL)
		planrt_want_threads_();
	planrt_cu_device_open_(dev, program, planrt_cu_comm_start_);
	int rc = planrt_main(argc, argv, program);
	planrt_cu_blas_destroy_();
	planrt_cu_epilogue_destroy_();
	planrt_cu_device_close_();
	return rc;
}
