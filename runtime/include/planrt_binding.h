/* planrt_binding.h: which GPU a rank uses and how its communicators reach the other ranks
 * (comm/binding.c). Pure decisions, no device and no MPI calls, so that they are tested on the CPU
 * (tests/cuda/test_gpu_binding.c); the CUDA layer (cuda/main_cuda.cu, cuda/comm_cuda.c) feeds them
 * the environment, the GPUs it sees and the device ids its communicators' members exchange.
 * Runtime internals, never used by a generated program. */
#ifndef PLANRT_BINDING_H
#define PLANRT_BINDING_H

#include <stddef.h>

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PLANRT_COMM: how device communicators are carried. auto (the default): NCCL for a communicator
 * whose members are on distinct GPUs, the MPI device backend (host-staged) for one where two
 * members share a GPU; nccl: NCCL for every communicator (two members on one GPU is an error);
 * mpi: the MPI device backend for every communicator. */
typedef enum { PLANRT_COMM_AUTO = 0, PLANRT_COMM_NCCL, PLANRT_COMM_MPI } planrt_comm_mode_t;
/* text NULL or "" is auto; anything but auto, nccl, mpi is an error whose detail names the choices */
planrt_result_t planrt_comm_mode_parse_(const char *text, planrt_comm_mode_t *mode);
const char *planrt_comm_mode_name_(planrt_comm_mode_t mode);

/* The rank's place on its node, from the launcher's environment read through get (getenv): the
 * first of PLANRT_LOCAL_RANK (planrt-run; or set by hand), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI),
 * MPI_LOCALRANKID (MPICH's Hydra), SLURM_LOCALID (srun), PMI_LOCAL_RANK, PALS_LOCAL_RANKID (Cray),
 * MV2_COMM_WORLD_LOCAL_RANK (MVAPICH), LOCAL_RANK (torchrun) that is set, with the matching local
 * size where the launcher gives one (else *size = 0). *source names the variable, NULL when none is
 * set (then *rank = 0). A value that is not a number >= 0 is an error naming the variable. */
planrt_result_t planrt_local_rank_(const char *(*get)(const char *name), int *rank, int *size, const char **source);

/* The GPU a rank uses, as an index among the `visible` GPUs this process sees (CUDA_VISIBLE_DEVICES
 * already applied by the CUDA runtime):
 *   override (PLANRT_DEVICE) set: one index for every rank, or a comma-separated list indexed by the
 *     local rank ("0,0,1,1"); an index outside [0, visible) is an error;
 *   else the local rank when there are enough GPUs (visible > local_rank);
 *   else 0 when the process sees one GPU (a launcher that binds each rank to its GPU, or a node with
 *     one GPU: the ranks' device ids, exchanged later, tell which);
 *   else, with fewer GPUs than local ranks: under PLANRT_COMM=nccl an error (one line: the counts
 *     and the fixes); otherwise local_rank % visible, shared, and the MPI device backend carries the
 *     communicators whose members share one.
 * The error detail is one line. */
planrt_result_t planrt_choose_device_(int local_rank, int local_size, int visible, const char *override,
				      planrt_comm_mode_t mode, int *device);

/* A member's GPU as the members of a communicator exchange it: the device's UUID (what makes two
 * members "on one GPU"), its PCI bus id and the member's world rank (for messages). */
typedef struct planrt_device_id {
	unsigned char uuid[16];
	char bus[24];
	int world_rank;
} planrt_device_id_t;

typedef enum { PLANRT_BACKEND_COPY = 0, PLANRT_BACKEND_NCCL, PLANRT_BACKEND_MPI } planrt_backend_t;
const char *planrt_backend_name_(planrt_backend_t b);
/* The backend of a communicator of n members (ids[i]: member i's GPU): one member needs none
 * (copies); PLANRT_COMM=mpi the MPI device backend; otherwise NCCL when every member has its own
 * GPU, and when two share one, the MPI device backend under auto and an error under nccl (naming
 * the communicator, the two world ranks and the GPU, and the fixes). *shared, when not NULL, is
 * set to the index of the first member whose GPU an earlier member also has (-1: none). Every
 * member decides from the same ids, so they agree. */
planrt_result_t planrt_choose_backend_(planrt_comm_mode_t mode, int n, const planrt_device_id_t *ids,
				       const char *comm_name, planrt_backend_t *backend, int *shared);

#ifdef __cplusplus
}
#endif
#endif
