/* mpi_expect.h: the mismatch tally the MPI runtime tests share (each includes it once, after
 * mpi.h and cmocka.h). EXPECT records a failed condition with the rank and line (the first 20);
 * assert_all_ranks_clean() then fails the cmocka test on every rank if any rank saw one, so that
 * all ranks leave a test together instead of one waiting in a collective. */
#ifndef RUNTIME_TESTS_MPI_EXPECT_H
#define RUNTIME_TESTS_MPI_EXPECT_H

static int rank, world;
static long mismatches;

#define EXPECT(cond, ...)                                                                                          \
	do {                                                                                                       \
		if (!(cond) && mismatches++ < 20) {                                                                \
			char msg_[512];                                                                            \
			snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                  \
			fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, msg_);                   \
		}                                                                                                  \
	} while (0)

static void assert_all_ranks_clean(void)
{
	long total = 0;
	MPI_Allreduce(&mismatches, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	mismatches = 0;
	assert_int_equal(total, 0);
}

#endif
