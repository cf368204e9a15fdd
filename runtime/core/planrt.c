/* planrt.c: results and error text, the world, the mesh and its communicators.
 *
 * Errors: every fallible call returns a planrt_result_t and leaves a one-line detail (cause and
 * fix) in a thread-local buffer that planrt_last_error() returns. A failure a program cannot
 * recover from goes through planrt_fatal, which aborts every rank (MPI_Abort) so that no rank
 * waits forever in a collective for a peer that has died.
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

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_AXES = PLANRT_MAX_AXES_, MAX_COMMS = 64 };

static _Thread_local char last_error[1024];

static int world_rank = -1, world_size = 0;
static int we_initialised_mpi;
static struct planrt_comm world, control;
static int world_ready;
static int offline; /* planrt_mesh_offline_: one process plays the ranks, without MPI */

static int mesh_naxes;
static int mesh_sizes[MAX_AXES], mesh_coords[MAX_AXES];
static planrt_comm_t axis_comms[MAX_AXES];
/* Pair communicators, freed by planrt_finalize (and a new mesh). */
static planrt_comm_t pair_comms[MAX_COMMS];
static int npair_comms;

const char *planrt_error_string(planrt_result_t r)
{
	switch (r) {
	case planrt_success: return "success";
	case planrt_system_error: return "system error (the OS or MPI failed)";
	case planrt_invalid_argument: return "invalid argument";
	case planrt_invalid_usage: return "invalid usage (a call out of order)";
	case planrt_io_error: return "I/O error";
	case planrt_format_error: return "malformed file";
	case planrt_timeout: return "timeout (the watchdog fired)";
	case planrt_internal_error: return "internal error in planrt";
	}
	return "unknown planrt result";
}

const char *planrt_last_error(void)
{
	return last_error;
}

planrt_result_t planrt_error_(planrt_result_t r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof last_error, fmt, ap);
	va_end(ap);
	return r;
}

int planrt_world_rank_(void)
{
	return world_rank;
}

static int mpi_live(void)
{
	int init = 0, fin = 0;
	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	return init && !fin;
}

void planrt_fatal(const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fflush(stdout);
	/* One write so that lines from several ranks do not interleave mid-line. */
	if (world_rank >= 0 && !offline)
		fprintf(stderr, "planrt: rank %d: %s\n", world_rank, msg);
	else /* before MPI, or one process playing every rank (--reshard) */
		fprintf(stderr, "planrt: %s\n", msg);
	fflush(stderr);
	if (mpi_live())
		MPI_Abort(MPI_COMM_WORLD, 1);
	exit(1);
}

void planrt_check_(planrt_result_t r, const char *what, const char *file, int line)
{
	if (r == planrt_success)
		return;
	/* users see the cause and the fix; PLANRT_DEBUG adds where in the program it happened */
	if (getenv("PLANRT_DEBUG"))
		planrt_fatal("%s:%d: %s: %s%s%s", file, line, what, planrt_error_string(r), last_error[0] ? ": " : "",
			     last_error);
	planrt_fatal("%s%s%s", planrt_error_string(r), last_error[0] ? ": " : "", last_error);
}

/* ------------------------------------------------------------------ world */

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
	MPI_Initialized(&init);
	if (!init) {
		int provided;
		rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
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
	planrt_comm_init_();
	if (rank)
		*rank = world_rank;
	if (world_out)
		*world_out = world_size;
	last_error[0] = 0;
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
	if (mpi_live() && control.comm != MPI_COMM_NULL) {
		MPI_Comm_free(&control.comm);
		control.comm = MPI_COMM_NULL;
	}
	if (we_initialised_mpi && mpi_live()) {
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
	offline = 1;
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

/* ------------------------------------------------------------------ dtypes */

size_t planrt_dtype_size(planrt_dtype_t t)
{
	switch (t) {
	case planrt_f32: return 4;
	case planrt_bf16: return 2;
	case planrt_f16: return 2;
	case planrt_i32: return 4;
	case planrt_u8: return 1;
	case planrt_f64: return 8;
	}
	return 0;
}

static uint32_t f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float x;
	memcpy(&x, &u, 4);
	return x;
}

float planrt_half_to_f32_(uint16_t h, planrt_dtype_t t)
{
	if (t == planrt_bf16)
		return bits_f32((uint32_t)h << 16);
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
	if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
		float f = (float)mant * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t planrt_f32_to_half_(float x, planrt_dtype_t t)
{
	uint32_t u = f32_bits(x);
	if (t == planrt_bf16) {
		if ((u & 0x7fffffffu) > 0x7f800000u)
			return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
		return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
	}
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	u &= 0x7fffffffu;
	if (u >= 0x7f800000u)
		return sign | 0x7c00 | (u > 0x7f800000u ? 0x200 : 0);
	if (u >= 0x477ff000u) /* at least 65520: rounds to infinity */
		return sign | 0x7c00;
	if (u < 0x38800000u) { /* below 2^-14: an f16 subnormal, mantissa = x * 2^24 rounded to even */
		float f = bits_f32(u) * 0x1p24f;
		float r = f - (float)(uint32_t)f; /* f < 1024: exact */
		uint32_t m = (uint32_t)f;
		if (r > 0.5f || (r == 0.5f && (m & 1)))
			m++;
		return (uint16_t)(sign | m);
	}
	u += 0xfffu + ((u >> 13) & 1);
	return (uint16_t)(sign | ((u - 0x38000000u) >> 13));
}
