/* result.c: results and error text, and the fatal path.
 *
 * Every fallible call returns a planrt_result_t and leaves a one-line detail (cause and
 * fix) in a thread-local buffer that planrt_last_error() returns. A failure a program cannot
 * recover from goes through planrt_fatal, which aborts every rank (MPI_Abort) so that no rank
 * waits forever in a collective for a peer that has died.
 */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char last_error[1024];

/* who this process is, as comm/world.c tells it: the rank messages name (-1 before MPI starts), and
 * whether one process plays every rank without MPI (planrt_mesh_offline_) */
static int world_rank = -1;
static int offline;

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

void planrt_set_world_rank_(int rank, int playing_offline)
{
	world_rank = rank;
	offline = playing_offline;
}

int planrt_mpi_live_(void)
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
	if (planrt_mpi_live_())
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
