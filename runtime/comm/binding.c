/* binding.c: a rank's GPU and its communicators' backend, decided from plain data (planrt_binding.h):
 * the launcher's local rank, the GPUs the process sees, PLANRT_DEVICE and PLANRT_COMM, and the
 * device ids of a communicator's members. The CUDA layer gathers that data; nothing here touches a
 * device or MPI, so every rule is tested on the CPU.
 *
 * The decisions follow what a PyTorch or Megatron user expects: one rank per GPU by local rank,
 * the launcher's binding respected (a rank that sees one GPU uses it), NCCL wherever it can run, and
 * where it cannot (two ranks on one GPU, which NCCL refuses) the MPI device backend, unless the user
 * asked for NCCL, in which case the error says how to launch instead. */
#define PLANRT_INTERNAL
#include "planrt_binding.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

planrt_result_t planrt_comm_mode_parse_(const char *text, planrt_comm_mode_t *mode)
{
	*mode = PLANRT_COMM_AUTO;
	if (!text || !*text || !strcmp(text, "auto"))
		return planrt_success;
	if (!strcmp(text, "nccl")) {
		*mode = PLANRT_COMM_NCCL;
		return planrt_success;
	}
	if (!strcmp(text, "mpi")) {
		*mode = PLANRT_COMM_MPI;
		return planrt_success;
	}
	return planrt_error_(planrt_invalid_argument,
			     "PLANRT_COMM='%s' is not a device communication backend; use auto (NCCL where each rank has "
			     "its own GPU, MPI through host memory where ranks share one), nccl or mpi",
			     text);
}

const char *planrt_comm_mode_name_(planrt_comm_mode_t mode)
{
	return mode == PLANRT_COMM_NCCL ? "nccl" : mode == PLANRT_COMM_MPI ? "mpi" : "auto";
}

const char *planrt_backend_name_(planrt_backend_t b)
{
	return b == PLANRT_BACKEND_NCCL ? "NCCL" : b == PLANRT_BACKEND_MPI ? "MPI through host memory" : "copies (one member)";
}

/* a whole number >= 0 (and <= INT_MAX), or -1 */
static int count_of(const char *text)
{
	if (!text || !*text)
		return -1;
	char *end;
	long v = strtol(text, &end, 10);
	return *end || v < 0 || v > INT_MAX ? -1 : (int)v;
}

planrt_result_t planrt_local_rank_(const char *(*get)(const char *name), int *rank, int *size, const char **source)
{
	static const char *const vars[][2] = {
		{"PLANRT_LOCAL_RANK", "PLANRT_LOCAL_SIZE"},
		{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
		{"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
		{"SLURM_LOCALID", NULL},
		{"PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"},
		{"PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"},
		{"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
		{"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	};
	*rank = 0;
	*size = 0;
	*source = NULL;
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = get(vars[i][0]);
		if (!v || !*v)
			continue;
		*rank = count_of(v);
		if (*rank < 0) {
			*rank = 0;
			return planrt_error_(planrt_invalid_argument, "%s='%s' is not a local rank (a number >= 0)", vars[i][0], v);
		}
		*source = vars[i][0];
		int n = vars[i][1] ? count_of(get(vars[i][1])) : -1;
		*size = n > *rank ? n : 0;
		return planrt_success;
	}
	return planrt_success;
}

/* PLANRT_DEVICE's index for this local rank: the value, or the list's entry */
static planrt_result_t override_device(const char *text, int local_rank, int visible, int *device)
{
	int n = 0, pick = -1;
	const char *p = text;
	for (;;) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p || v < 0 || v > INT_MAX || (*end && *end != ','))
			return planrt_error_(planrt_invalid_argument,
					     "PLANRT_DEVICE='%s' is not a GPU index or a comma-separated list of them (one per "
					     "local rank)",
					     text);
		if (n == local_rank || (n == 0 && !strchr(text, ',')))
			pick = (int)v;
		n++;
		if (!*end)
			break;
		p = end + 1;
	}
	if (pick < 0)
		return planrt_error_(planrt_invalid_argument,
				     "PLANRT_DEVICE='%s' lists %d GPUs but this rank is local rank %d; give one per local rank",
				     text, n, local_rank);
	if (pick >= visible)
		return planrt_error_(planrt_invalid_argument,
				     "PLANRT_DEVICE='%s' names GPU %d but this process sees %d (0 to %d; CUDA_VISIBLE_DEVICES "
				     "renumbers them from 0)",
				     text, pick, visible, visible - 1);
	*device = pick;
	return planrt_success;
}

planrt_result_t planrt_choose_device_(int local_rank, int local_size, int visible, const char *override,
				      planrt_comm_mode_t mode, int *device)
{
	*device = 0;
	if (visible < 1)
		return planrt_error_(planrt_invalid_argument, "no GPU visible");
	if (override && *override)
		return override_device(override, local_rank, visible, device);
	if (local_rank < visible) {
		*device = local_rank;
		return planrt_success;
	}
	if (visible == 1)
		return planrt_success; /* bound by the launcher, or one GPU for all: the device ids tell */
	if (mode == PLANRT_COMM_NCCL) {
		char ranks[48] = "";
		if (local_size > 0)
			snprintf(ranks, sizeof ranks, " of %d", local_size);
		return planrt_error_(planrt_invalid_argument,
				     "local rank %d%s on a node with %d GPUs: NCCL needs a GPU per rank; launch %d ranks per "
				     "node (mpirun --map-by ppr:%d:node, srun --ntasks-per-node=%d), or set PLANRT_COMM=mpi "
				     "(or auto) to share the GPUs over MPI through host memory",
				     local_rank, ranks, visible, visible, visible, visible);
	}
	*device = local_rank % visible;
	return planrt_success;
}

planrt_result_t planrt_choose_backend_(planrt_comm_mode_t mode, int n, const planrt_device_id_t *ids,
				       const char *comm_name, planrt_backend_t *backend, int *shared)
{
	int dup = -1, first = -1;
	for (int i = 1; i < n && dup < 0; i++)
		for (int j = 0; j < i; j++)
			if (!memcmp(ids[i].uuid, ids[j].uuid, sizeof ids[i].uuid)) {
				dup = i;
				first = j;
				break;
			}
	if (shared)
		*shared = dup;
	if (n <= 1) {
		*backend = PLANRT_BACKEND_COPY;
		return planrt_success;
	}
	if (mode == PLANRT_COMM_MPI || (mode == PLANRT_COMM_AUTO && dup >= 0)) {
		*backend = PLANRT_BACKEND_MPI;
		return planrt_success;
	}
	if (dup >= 0) {
		*backend = PLANRT_BACKEND_COPY;
		return planrt_error_(planrt_invalid_argument,
				     "ranks %d and %d of %s share the GPU %s: NCCL refuses two ranks on one GPU; launch one "
				     "rank per GPU, or set PLANRT_COMM=mpi (or auto) to run their communication over MPI "
				     "through host memory",
				     ids[first].world_rank, ids[dup].world_rank, comm_name, ids[dup].bus);
	}
	*backend = PLANRT_BACKEND_NCCL;
	return planrt_success;
}
