/* test_watchdog.c: a stall that no rank ever resolves must end the job with a message naming the
 * pending operation and the rank, not hang. Run with PLANRT_WATCHDOG=2 on 2 ranks; the test
 * passes when the output has the watchdog's message (tests.cmake).
 *   (no argument)  a receive that nobody sends to
 *   world_sum      rank 0 alone in planrt_world_sum, the gradient norm's old raw MPI_Allreduce,
 *                  which the watchdog could not see */
#include <stdio.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"

int main(int argc, char **argv)
{
	int rank, world;
	int world_sum = argc > 1 && !strcmp(argv[1], "world_sum");
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world_sum) {
		if (rank == 0)
			printf("rank 0: the sum returned %g\n", planrt_world_sum(1.0));
		else
			for (;;) /* never joins the sum (and never finalizes) */
				planrt_now();
		planrt_finalize();
		return 0;
	}
	float x[4];
	planrt_comm_t w = planrt_world_comm();
	/* nobody sends: every rank stalls here */
	PLANRT_CHECK(planrt_recv(x, 4, planrt_f32, (rank + 1) % world, w, NULL, NULL));
	printf("rank %d: the stalled receive returned\n", rank);
	planrt_finalize();
	return 0;
}
