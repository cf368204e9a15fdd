/* world.c: the world, the mesh and its communicators.
 *
 * planrt_init starts MPI (unless the program did; thread level funneled, or multiple when the device
 * layer asked for it: the MPI device backend calls MPI from its own threads) with errors returned
 * as results, and makes the
 * world communicator and planrt's own control group (a duplicate of the world, for the run's
 * bookkeeping collectives: trace origin, checkpoint agreement, metrics).
 *
 * The mesh: planc numbers ranks row-major over the mesh axes, the first axis slowest, so a rank's
 * coordinate on axis k is (rank / stride[k]) % size[k] with stride[k] the product of the sizes of
 * the later axes. The group along axis k through a rank is every rank that agrees with it on all
 * other coordinates; MPI_Comm_split with colour = the rank with coordinate k zeroed and key = the
 * coordinate on k makes a communicator whose rank is the axis coordinate. Pair communicators
 * (tied parameters on two pipeline stages) are made the same way from the ranks whose coordinate
 * on the axis is a or b; member 0 is the rank at a. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"

#include <stdio.h>
#include <stdlib.h>

enum { MAX_AXES = PLANRT_MAX_AXES_, MAX_COMMS = 64 };

static int world_rank = -1, world_size = 0;
static int we_initialised_mpi;
static int thread_level = MPI_THREAD_FUNNELED;

void planrt_want_threads_(void)
{
	thread_level = MPI_THREAD_MULTIPLE;
}
static struct planrt_comm world, control;
static int world_ready;

static int mesh_naxes;
static int mesh_sizes[MAX_AXES], mesh_coords[MAX_AXES];
static planrt_comm_t axis_comms[MAX_AXES];
/* Pair communicators, freed by planrt_finalize (and a new mesh). */
static planrt_comm_t pair_comms[MAX_COMMS];
static int npair_comms;

static planrt_result_t mpi_error(int rc, const char *call)
{
	char text[MPI_MAX_ERROR_STRING];
	int len = 0;
	MPI_Error_string(rc, text, &len);
	return planrt_error_(planrt_system_error, "%s failed: %s", call, text);
}

planrt_result_t planrt_init(int *argc, char ***argv, int *rank, int *world_out)
{
	int init = 0, rc;
	planrt_monitor_start_(); /* before MPI starts threads: they inherit its signal mask */
	planrt_heap_keep_();     /* before MPI allocates */
	MPI_Initialized(&init);
	if (!init) {
		int provided;
		rc = MPI_Init_thread(argc, argv, thread_level, &provided);
		if (rc != MPI_SUCCESS)
			return planrt_error_(planrt_system_error,
					     "MPI_Init_thread failed; launch the program with mpirun or srun");
		we_initialised_mpi = 1;
	}
	/* Errors come back as results (and then planrt_fatal aborts every rank) instead of MPI's
	 * default handler killing the job without saying which call failed. Split communicators
	 * inherit the handler. */
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world_size);
	world.comm = MPI_COMM_WORLD;
	world.rank = world_rank;
	world.size = world_size;
	world.group = PLANRT_GROUP_WORLD;
	snprintf(world.name, sizeof world.name, "world");
	rc = MPI_Comm_dup(MPI_COMM_WORLD, &control.comm);
	if (rc != MPI_SUCCESS)
		return mpi_error(rc, "MPI_Comm_dup");
	control.rank = world_rank;
	control.size = world_size;
	control.group = PLANRT_GROUP_CONTROL_;
	snprintf(control.name, sizeof control.name, "planrt's control group (the world)");
	world_ready = 1;
	planrt_set_world_rank_(world_rank, 0);
	planrt_comm_init_();
	if (rank)
		*rank = world_rank;
	if (world_out)
		*world_out = world_size;
	planrt_error_(planrt_success, "%s", "");
	return planrt_success;
}

static void comm_free(planrt_comm_t c)
{
	if (!c)
		return;
	if (c->comm != MPI_COMM_NULL && c->comm != MPI_COMM_WORLD)
		MPI_Comm_free(&c->comm);
	free(c);
}

static void mesh_free(void)
{
	for (int i = 0; i < mesh_naxes; i++) {
		comm_free(axis_comms[i]);
		axis_comms[i] = NULL;
	}
	for (int i = 0; i < npair_comms; i++)
		comm_free(pair_comms[i]);
	npair_comms = 0;
	mesh_naxes = 0;
}

planrt_result_t planrt_finalize(void)
{
	if (!world_ready)
		return planrt_error_(planrt_invalid_usage, "planrt_finalize called before planrt_init");
	mesh_free();
	world_ready = 0;
	if (planrt_mpi_live_() && control.comm != MPI_COMM_NULL) {
		MPI_Comm_free(&control.comm);
		control.comm = MPI_COMM_NULL;
	}
	if (we_initialised_mpi && planrt_mpi_live_()) {
		int rc = MPI_Finalize();
		if (rc != MPI_SUCCESS)
			return mpi_error(rc, "MPI_Finalize");
	}
	return planrt_success;
}

planrt_comm_t planrt_world_comm(void)
{
	return world_ready ? &world : NULL;
}

planrt_comm_t planrt_control_comm_(void)
{
	return world_ready ? &control : NULL;
}

int planrt_comm_size(planrt_comm_t c)
{
	return c ? c->size : 0;
}

int planrt_comm_rank(planrt_comm_t c)
{
	return c ? c->rank : -1;
}

/* ------------------------------------------------------------------ mesh */

/* Splits the world; colour < 0: this rank takes no part (*out = NULL). group: the counters'
 * group of the new communicator (a mesh axis or PLANRT_GROUP_PAIR). */
static planrt_result_t split(int color, int key, int group, const char *name, planrt_comm_t *out)
{
	MPI_Comm nc;
	int rc = MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &nc);
	*out = NULL;
	if (rc != MPI_SUCCESS)
		return mpi_error(rc, "MPI_Comm_split");
	if (nc == MPI_COMM_NULL)
		return planrt_success;
	planrt_comm_t c = calloc(1, sizeof *c);
	if (!c) {
		MPI_Comm_free(&nc);
		return planrt_error_(planrt_system_error, "out of memory creating communicator '%s'", name);
	}
	c->comm = nc;
	MPI_Comm_size(nc, &c->size);
	MPI_Comm_rank(nc, &c->rank);
	c->group = group;
	snprintf(c->name, sizeof c->name, "%s", name);
	*out = c;
	return planrt_success;
}

static int axis_stride(int axis)
{
	int s = 1;
	for (int k = axis + 1; k < mesh_naxes; k++)
		s *= mesh_sizes[k];
	return s;
}

planrt_result_t planrt_mesh_init(int naxes, const int *sizes, const char *const *names)
{
	if (!world_ready)
		return planrt_error_(planrt_invalid_usage, "planrt_mesh_init called before planrt_init");
	if (naxes < 0 || naxes > MAX_AXES)
		return planrt_error_(planrt_invalid_argument, "a mesh has 0 to %d axes, not %d", MAX_AXES, naxes);
	char shape[256] = "";
	size_t len = 0;
	long product = 1;
	for (int k = 0; k < naxes; k++) {
		if (sizes[k] < 1)
			return planrt_error_(planrt_invalid_argument, "mesh axis %s has size %d; sizes are >= 1",
					     names && names[k] ? names[k] : "?", sizes[k]);
		product *= sizes[k];
		len += (size_t)snprintf(shape + len, len < sizeof shape ? sizeof shape - len : 0, "%s%s = %d",
					k ? ", " : "", names && names[k] ? names[k] : "axis", sizes[k]);
		if (len >= sizeof shape)
			len = sizeof shape - 1;
	}
	if (product != world_size)
		return planrt_error_(planrt_invalid_argument,
				     "the plan's mesh (%s) has %ld ranks but the program runs on %d; launch it with "
				     "mpirun -np %ld",
				     naxes ? shape : "no axes", product, world_size, product);
	mesh_free();
	mesh_naxes = naxes;
	for (int k = 0; k < naxes; k++)
		mesh_sizes[k] = sizes[k];
	for (int k = 0; k < naxes; k++)
		mesh_coords[k] = (world_rank / axis_stride(k)) % sizes[k];
	for (int k = 0; k < naxes; k++) {
		char name[48];
		snprintf(name, sizeof name, "axis %s", names && names[k] ? names[k] : "?");
		int color = world_rank - mesh_coords[k] * axis_stride(k);
		planrt_result_t r = split(color, mesh_coords[k], k, name, &axis_comms[k]);
		if (r != planrt_success) {
			mesh_free();
			return r;
		}
	}
	return planrt_success;
}

/* planc reshard / PROG --reshard: one process plays every rank in turn, without MPI: the mesh's
 * coordinates of world rank `rank`, and no communicators (a collective there fails with its cause). */
void planrt_mesh_offline_(int naxes, const int *sizes, int rank)
{
	if (world_ready || naxes < 0 || naxes > MAX_AXES)
		planrt_fatal("internal error: planrt_mesh_offline_ with MPI running or %d axes", naxes);
	mesh_naxes = naxes;
	world_size = 1;
	for (int k = 0; k < naxes; k++) {
		mesh_sizes[k] = sizes[k];
		world_size *= sizes[k];
		axis_comms[k] = NULL;
	}
	for (int k = 0; k < naxes; k++)
		mesh_coords[k] = (rank / axis_stride(k)) % sizes[k];
	world_rank = rank;
	planrt_set_world_rank_(rank, 1);
}

int planrt_mesh_coord(int axis)
{
	return axis >= 0 && axis < mesh_naxes ? mesh_coords[axis] : -1;
}

planrt_comm_t planrt_axis_comm(int axis)
{
	return axis >= 0 && axis < mesh_naxes ? axis_comms[axis] : NULL;
}

planrt_result_t planrt_pair_comm(int axis, int a, int b, planrt_comm_t *out)
{
	*out = NULL;
	if (axis < 0 || axis >= mesh_naxes)
		return planrt_error_(planrt_invalid_usage, "planrt_pair_comm: axis %d is not a mesh axis (the mesh has %d)",
				     axis, mesh_naxes);
	if (a == b || a < 0 || b < 0 || a >= mesh_sizes[axis] || b >= mesh_sizes[axis])
		return planrt_error_(planrt_invalid_argument,
				     "planrt_pair_comm: coordinates %d and %d must be distinct and below the axis size %d", a,
				     b, mesh_sizes[axis]);
	if (npair_comms == MAX_COMMS)
		return planrt_error_(planrt_invalid_usage, "more than %d pair communicators", MAX_COMMS);
	int c = mesh_coords[axis];
	int member = c == a || c == b;
	char name[48];
	snprintf(name, sizeof name, "pair axis %d {%d,%d}", axis, a, b);
	int color = member ? world_rank - c * axis_stride(axis) : -1;
	planrt_result_t r = split(color, c == a ? 0 : 1, PLANRT_GROUP_PAIR, name, out);
	if (r == planrt_success && *out)
		pair_comms[npair_comms++] = *out;
	return r;
}
