/* test_watchdog.c: a receive that no rank ever matches must end the job with a message naming
 * the pending operation and the rank, not hang. Run with PLANRT_WATCHDOG=2 on 2 ranks; the test
 * passes when the output has the watchdog's message (tests.cmake). */
#include <stdio.h>

#include "planrt.h"

int main(int argc, char **argv)
{
	int rank, world;
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	float x[4];
	planrt_comm_t w = planrt_world_comm();
	/* nobody sends: every rank stalls here */
	PLANRT_CHECK(planrt_recv(x, 4, planrt_f32, (rank + 1) % world, w, NULL, NULL));
	printf("rank %d: the stalled receive returned\n", rank);
	planrt_finalize();
	return 0;
}
