/* test_gpu_binding.c: the GPU binding and backend rules of runtime/comm/binding.c on the CPU:
 * PLANRT_COMM's values; the local rank from each launcher's variables (planrt-run, Open MPI,
 * MPICH, Slurm, PMI, Cray, MVAPICH, torchrun) and their precedence; the device a rank gets (one per
 * rank, the launcher's binding of one GPU, PLANRT_DEVICE as an index or a per-rank list, fewer
 * GPUs than ranks: shared under auto and mpi, a one-line error under nccl); a communicator's
 * backend from its members' device ids (copies, NCCL, the MPI device backend, the error naming the
 * two ranks and the GPU under nccl). Prints a PASS/FAIL tally; exit status 0 when all passed. */
#define PLANRT_INTERNAL
#include "planrt_binding.h"
#include "tally.h"

#include <stdio.h>
#include <string.h>


/* an environment of NAME=VALUE strings, NULL-terminated, read through get */
static const char *const *env;

static const char *get(const char *name)
{
	size_t n = strlen(name);
	for (const char *const *e = env; e && *e; e++)
		if (!strncmp(*e, name, n) && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

static void local_rank_is(const char *const *e, planrt_result_t want_r, int want_rank, int want_size,
			  const char *want_source)
{
	env = e;
	int rank = -7, size = -7;
	const char *source = "?";
	planrt_result_t r = planrt_local_rank_(get, &rank, &size, &source);
	CHECK(r == want_r && rank == want_rank && size == want_size &&
		      (want_source ? source && !strcmp(source, want_source) : !source),
	      "local rank from %s...: result %d rank %d size %d source %s (%s)", e[0] ? e[0] : "(nothing)", (int)r, rank,
	      size, source ? source : "NULL", planrt_last_error());
}

static void test_local_rank(void)
{
	local_rank_is((const char *[]){NULL}, planrt_success, 0, 0, NULL);
	local_rank_is((const char *[]){"OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=8", NULL}, planrt_success,
		      3, 8, "OMPI_COMM_WORLD_LOCAL_RANK");
	local_rank_is((const char *[]){"SLURM_LOCALID=5", "SLURM_PROCID=13", NULL}, planrt_success, 5, 0, "SLURM_LOCALID");
	local_rank_is((const char *[]){"MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", NULL}, planrt_success, 1, 2,
		      "MPI_LOCALRANKID");
	local_rank_is((const char *[]){"PMI_LOCAL_RANK=2", "PMI_LOCAL_SIZE=4", NULL}, planrt_success, 2, 4, "PMI_LOCAL_RANK");
	local_rank_is((const char *[]){"PALS_LOCAL_RANKID=6", NULL}, planrt_success, 6, 0, "PALS_LOCAL_RANKID");
	local_rank_is((const char *[]){"MV2_COMM_WORLD_LOCAL_RANK=0", NULL}, planrt_success, 0, 0, "MV2_COMM_WORLD_LOCAL_RANK");
	local_rank_is((const char *[]){"LOCAL_RANK=7", "LOCAL_WORLD_SIZE=8", NULL}, planrt_success, 7, 8, "LOCAL_RANK");
	/* planrt-run's (or the user's) before the launcher's; Open MPI's before Slurm's (mpirun in an allocation) */
	local_rank_is((const char *[]){"OMPI_COMM_WORLD_LOCAL_RANK=3", "PLANRT_LOCAL_RANK=1", "PLANRT_LOCAL_SIZE=4", NULL},
		      planrt_success, 1, 4, "PLANRT_LOCAL_RANK");
	local_rank_is((const char *[]){"SLURM_LOCALID=0", "OMPI_COMM_WORLD_LOCAL_RANK=2", NULL}, planrt_success, 2, 0,
		      "OMPI_COMM_WORLD_LOCAL_RANK");
	/* a size not above the rank is no size */
	local_rank_is((const char *[]){"OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL}, planrt_success,
		      3, 0, "OMPI_COMM_WORLD_LOCAL_RANK");
	local_rank_is((const char *[]){"SLURM_LOCALID=x", NULL}, planrt_invalid_argument, 0, 0, NULL);
	CHECK(strstr(planrt_last_error(), "SLURM_LOCALID='x' is not a local rank"), "message: %s", planrt_last_error());
	local_rank_is((const char *[]){"LOCAL_RANK=-1", NULL}, planrt_invalid_argument, 0, 0, NULL);
}

static void device_is(int local_rank, int local_size, int visible, const char *override, planrt_comm_mode_t mode,
		      planrt_result_t want_r, int want_device, const char *want_text)
{
	int dev = -7;
	planrt_result_t r = planrt_choose_device_(local_rank, local_size, visible, override, mode, &dev);
	CHECK(r == want_r && (r != planrt_success || dev == want_device) &&
		      (!want_text || strstr(planrt_last_error(), want_text)),
	      "device of local rank %d/%d, %d visible, PLANRT_DEVICE=%s, %s: result %d device %d (%s)", local_rank,
	      local_size, visible, override ? override : "-", planrt_comm_mode_name_(mode), (int)r, dev,
	      planrt_last_error());
}

static void test_device(void)
{
	for (int l = 0; l < 8; l++)
		device_is(l, 8, 8, NULL, PLANRT_COMM_AUTO, planrt_success, l, NULL);
	device_is(2, 4, 8, NULL, PLANRT_COMM_NCCL, planrt_success, 2, NULL);
	/* the launcher bound each rank to one GPU (CUDA_VISIBLE_DEVICES): it is GPU 0 of what it sees */
	for (planrt_comm_mode_t m = PLANRT_COMM_AUTO; m <= PLANRT_COMM_MPI; m++)
		device_is(5, 8, 1, NULL, m, planrt_success, 0, NULL);
	/* fewer GPUs than local ranks */
	device_is(3, 4, 2, NULL, PLANRT_COMM_AUTO, planrt_success, 1, NULL);
	device_is(2, 4, 2, NULL, PLANRT_COMM_MPI, planrt_success, 0, NULL);
	device_is(3, 4, 2, NULL, PLANRT_COMM_NCCL, planrt_invalid_argument, 0,
		  "local rank 3 of 4 on a node with 2 GPUs: NCCL needs a GPU per rank; launch 2 ranks per node "
		  "(mpirun --map-by ppr:2:node, srun --ntasks-per-node=2), or set PLANRT_COMM=mpi");
	device_is(6, 0, 4, NULL, PLANRT_COMM_NCCL, planrt_invalid_argument, 0, "local rank 6 on a node with 4 GPUs");
	/* PLANRT_DEVICE */
	device_is(3, 4, 4, "1", PLANRT_COMM_AUTO, planrt_success, 1, NULL);
	device_is(2, 4, 2, "0,0,1,1", PLANRT_COMM_NCCL, planrt_success, 1, NULL);
	device_is(1, 4, 2, "0,0,1,1", PLANRT_COMM_AUTO, planrt_success, 0, NULL);
	device_is(3, 4, 4, "0,1", PLANRT_COMM_AUTO, planrt_invalid_argument, 0,
		  "PLANRT_DEVICE='0,1' lists 2 GPUs but this rank is local rank 3");
	device_is(0, 1, 4, "4", PLANRT_COMM_AUTO, planrt_invalid_argument, 0,
		  "PLANRT_DEVICE='4' names GPU 4 but this process sees 4 (0 to 3");
	device_is(0, 1, 4, "gpu1", PLANRT_COMM_AUTO, planrt_invalid_argument, 0, "is not a GPU index");
	device_is(0, 1, 4, "1,", PLANRT_COMM_AUTO, planrt_invalid_argument, 0, "is not a GPU index");
}

static planrt_device_id_t gpu(int physical, int world_rank)
{
	planrt_device_id_t id;
	memset(&id, 0, sizeof id);
	id.uuid[0] = (unsigned char)physical;
	id.uuid[15] = 0xa5;
	snprintf(id.bus, sizeof id.bus, "0000:%02x:00.0", 0x10 + physical);
	id.world_rank = world_rank;
	return id;
}

static void backend_is(planrt_comm_mode_t mode, int n, const planrt_device_id_t *ids, planrt_result_t want_r,
		       planrt_backend_t want_b, int want_shared, const char *want_text)
{
	planrt_backend_t b = (planrt_backend_t)-1;
	int shared = -7;
	planrt_result_t r = planrt_choose_backend_(mode, n, ids, "axis tensor", &b, &shared);
	CHECK(r == want_r && (r != planrt_success || b == want_b) && shared == want_shared &&
		      (!want_text || strstr(planrt_last_error(), want_text)),
	      "backend of %d members under %s: result %d backend %d shared %d (%s)", n, planrt_comm_mode_name_(mode), (int)r,
	      (int)b, shared, planrt_last_error());
}

static void test_backend(void)
{
	planrt_device_id_t one[1] = {gpu(0, 0)};
	planrt_device_id_t apart[4] = {gpu(0, 0), gpu(1, 1), gpu(2, 2), gpu(3, 3)};
	planrt_device_id_t together[4] = {gpu(0, 4), gpu(1, 5), gpu(0, 6), gpu(1, 7)};
	for (planrt_comm_mode_t m = PLANRT_COMM_AUTO; m <= PLANRT_COMM_MPI; m++)
		backend_is(m, 1, one, planrt_success, PLANRT_BACKEND_COPY, -1, NULL);
	backend_is(PLANRT_COMM_AUTO, 4, apart, planrt_success, PLANRT_BACKEND_NCCL, -1, NULL);
	backend_is(PLANRT_COMM_NCCL, 4, apart, planrt_success, PLANRT_BACKEND_NCCL, -1, NULL);
	backend_is(PLANRT_COMM_MPI, 4, apart, planrt_success, PLANRT_BACKEND_MPI, -1, NULL);
	backend_is(PLANRT_COMM_AUTO, 4, together, planrt_success, PLANRT_BACKEND_MPI, 2, NULL);
	backend_is(PLANRT_COMM_MPI, 4, together, planrt_success, PLANRT_BACKEND_MPI, 2, NULL);
	backend_is(PLANRT_COMM_NCCL, 4, together, planrt_invalid_argument, PLANRT_BACKEND_COPY, 2,
		   "ranks 4 and 6 of axis tensor share the GPU 0000:10:00.0: NCCL refuses two ranks on one GPU; launch one "
		   "rank per GPU, or set PLANRT_COMM=mpi (or auto)");
	/* 8 ranks on one GPU (the check machine) */
	planrt_device_id_t eight[8];
	for (int i = 0; i < 8; i++)
		eight[i] = gpu(0, i);
	backend_is(PLANRT_COMM_AUTO, 8, eight, planrt_success, PLANRT_BACKEND_MPI, 1, NULL);
}

static void test_mode(void)
{
	const char *texts[] = {NULL, "", "auto", "nccl", "mpi"};
	const planrt_comm_mode_t want[] = {PLANRT_COMM_AUTO, PLANRT_COMM_AUTO, PLANRT_COMM_AUTO, PLANRT_COMM_NCCL,
					   PLANRT_COMM_MPI};
	for (int i = 0; i < 5; i++) {
		planrt_comm_mode_t m = (planrt_comm_mode_t)-1;
		CHECK(planrt_comm_mode_parse_(texts[i], &m) == planrt_success && m == want[i], "PLANRT_COMM=%s",
		      texts[i] ? texts[i] : "(unset)");
	}
	planrt_comm_mode_t m;
	CHECK(planrt_comm_mode_parse_("NCCL", &m) == planrt_invalid_argument &&
		      strstr(planrt_last_error(), "PLANRT_COMM='NCCL' is not a device communication backend; use auto"),
	      "PLANRT_COMM=NCCL: %s", planrt_last_error());
	CHECK(planrt_comm_mode_parse_("gloo", &m) == planrt_invalid_argument, "PLANRT_COMM=gloo");
}

int main(void)
{
	test_mode();
	test_local_rank();
	test_device();
	test_backend();
	return tally_report("the GPU binding and backend rules");
}
