/* bench/sgemm.c: the sgemm rate of the OpenBLAS planrt links, for bench/backends.py to hold the
 * back ends' step times against (run it with OPENBLAS_NUM_THREADS=1 for the one-thread rate).
 * Times are the process's CPU time, as backends.py's step times are: on a machine busy with
 * other work, wall time would charge the GEMMs for others' turns.
 * For each M,N,K given: C[M, N] = A[M, K] B[K, N] (row-major, no transposes, as planrt's matmul
 * calls it for a forward linear layer), repeated for at least 0.3 s after one untimed call.
 * Prints one line per shape (M N K, ms per call, GFLOP/s) and the rate over all of them (total
 * FLOPs over total time, each shape weighted by one call).
 * usage: bench_sgemm M,N,K [M,N,K ...] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_sgemm M,N,K [M,N,K ...]\n");
		return 2;
	}
	double flops_all = 0, s_all = 0;
	printf("%8s %8s %8s %12s %10s\n", "M", "N", "K", "ms/call", "GFLOP/s");
	for (int i = 1; i < argc; i++) {
		long m, n, k;
		if (sscanf(argv[i], "%ld,%ld,%ld", &m, &n, &k) != 3 || m <= 0 || n <= 0 || k <= 0) {
			fprintf(stderr, "bench_sgemm: '%s' is not M,N,K\n", argv[i]);
			return 2;
		}
		float *a = malloc(sizeof *a * (size_t)(m * k)), *b = malloc(sizeof *b * (size_t)(k * n));
		float *c = malloc(sizeof *c * (size_t)(m * n));
		if (!a || !b || !c) {
			fprintf(stderr, "bench_sgemm: out of memory for %s\n", argv[i]);
			return 1;
		}
		for (long j = 0; j < m * k; j++)
			a[j] = (float)(j % 7) * 0.125f;
		for (long j = 0; j < k * n; j++)
			b[j] = (float)(j % 5) * 0.25f;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b, (int)n, 0.0f,
			    c, (int)n);
		long calls = 0;
		double t0 = now(), t;
		do {
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b, (int)n,
				    0.0f, c, (int)n);
			calls++;
			t = now() - t0;
		} while (t < 0.3);
		double flops = 2.0 * (double)m * (double)n * (double)k;
		printf("%8ld %8ld %8ld %12.3f %10.1f\n", m, n, k, 1e3 * t / (double)calls, flops * (double)calls / t * 1e-9);
		flops_all += flops;
		s_all += t / (double)calls;
		free(a);
		free(b);
		free(c);
	}
	printf("sgemm_gflops %.1f\n", flops_all / s_all * 1e-9);
	return 0;
}
