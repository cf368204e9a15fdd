/* tally.h: the PASS/FAIL tally the single-process CUDA-side tests share (test_gpu_binding.c on the
 * CPU, test_nccl_one.cu on a GPU): CHECK(cond, fmt, ...) counts a check and prints "FAIL: ..." when
 * cond is false; tally_report(what) prints the verdict line and returns the exit status. */
#ifndef TESTS_CUDA_TALLY_H
#define TESTS_CUDA_TALLY_H

#include <stdio.h>

static int checks, failures;

#define CHECK(cond, ...)                                                                                           \
	do {                                                                                                       \
		checks++;                                                                                          \
		if (!(cond)) {                                                                                     \
			failures++;                                                                                \
			printf("FAIL: ");                                                                          \
			printf(__VA_ARGS__);                                                                       \
			printf("\n");                                                                              \
		}                                                                                                  \
	} while (0)

static inline int tally_report(const char *what)
{
	printf("%s: %d of %d checks of %s passed\n", failures ? "FAIL" : "PASS", checks - failures, checks, what);
	return failures != 0;
}

#endif
