/* collectives.c: all-reduce, all-gather and reduce-scatter size sweeps, planrt beside the same
 * plain MPI calls, printed like nccl-tests (size, count, type, redop, time, algbw, busbw,
 * #wrong for each side).
 *
 *   mpirun -np 4 ./bench_collectives [-b 8] [-e 16M] [-f 4] [-n iters] [-w warmup] [-d float|int32|bfloat16]
 *                                    [-o all_reduce,all_gather,reduce_scatter]
 *
 * Build: add_subdirectory(bench) in the top-level CMakeLists.txt gives the target
 * bench_collectives (bench/CMakeLists.txt). PLANRT_WATCHDOG=0 makes planrt's blocking calls use
 * MPI's blocking collectives; otherwise they are MPI's nonblocking ones plus the watchdog's
 * polling wait.
 *
 * As in nccl-tests (doc/PERFORMANCE.md): size is the larger buffer in bytes (all-gather: the
 * gathered output; reduce-scatter: the input), time is the slowest rank's mean per call,
 * algbw = size / time, busbw = algbw * 2 (n - 1) / n for all-reduce and (n - 1) / n for the
 * others. The data are small integers (exact sums in every type), and #wrong counts the elements
 * of the last call's result that differ from the exact answer. For bfloat16 the plain MPI side
 * sums with a user-defined MPI_Op that adds in bf16 pair by pair (planrt converts to f32). */
#define PLANRT_INTERNAL
#include <mpi.h>

#include "planrt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER };
static const char *const op_names[] = {"all_reduce", "all_gather", "reduce_scatter"};

static int rank, world;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	uint16_t *a = in, *b = inout;
	(void)dt;
	for (int i = 0; i < *len; i++)
		b[i] = planrt_f32_to_half_(planrt_half_to_f32_(a[i], planrt_bf16) + planrt_half_to_f32_(b[i], planrt_bf16),
					   planrt_bf16);
}

/* Element i of rank r's input: (r + i) % 8 - 3, exact in every type; sums are exact too. */
static double value(int r, size_t i)
{
	return (double)((r + (int)(i % 1024)) % 8) - 3;
}

static void fill(void *buf, size_t n, planrt_dtype_t t, int r, size_t first)
{
	for (size_t i = 0; i < n; i++) {
		double v = value(r, first + i);
		if (t == planrt_f32)
			((float *)buf)[i] = (float)v;
		else if (t == planrt_i32)
			((int32_t *)buf)[i] = (int32_t)v;
		else
			((uint16_t *)buf)[i] = planrt_f32_to_half_((float)v, planrt_bf16);
	}
}

static double get(const void *buf, size_t i, planrt_dtype_t t)
{
	if (t == planrt_f32)
		return ((const float *)buf)[i];
	if (t == planrt_i32)
		return ((const int32_t *)buf)[i];
	return planrt_half_to_f32_(((const uint16_t *)buf)[i], planrt_bf16);
}

/* Elements of the result that differ from the exact answer (count: the op's per-rank count). */
static long wrong(int op, const void *recv, size_t count, planrt_dtype_t t)
{
	long bad = 0;
	if (op == ALL_GATHER) {
		for (int r = 0; r < world; r++)
			for (size_t i = 0; i < count; i++)
				bad += get(recv, (size_t)r * count + i, t) != value(r, i);
		return bad;
	}
	size_t first = op == REDUCE_SCATTER ? (size_t)rank * count : 0;
	for (size_t i = 0; i < count; i++) {
		double want = 0;
		for (int r = 0; r < world; r++)
			want += value(r, first + i);
		bad += get(recv, i, t) != want;
	}
	return bad;
}

static MPI_Op bf16_op;

static void run_mpi(int op, const void *send, void *recv, size_t count, planrt_dtype_t t)
{
	MPI_Datatype dt = t == planrt_f32 ? MPI_FLOAT : t == planrt_i32 ? MPI_INT32_T : MPI_UINT16_T;
	MPI_Op sum = t == planrt_bf16 ? bf16_op : MPI_SUM;
	int c = (int)count;
	if (op == ALL_REDUCE)
		MPI_Allreduce(send, recv, c, dt, sum, MPI_COMM_WORLD);
	else if (op == ALL_GATHER)
		MPI_Allgather(send, c, dt, recv, c, dt, MPI_COMM_WORLD);
	else
		MPI_Reduce_scatter_block(send, recv, c, dt, sum, MPI_COMM_WORLD);
}

static void run_planrt(int op, const void *send, void *recv, size_t count, planrt_dtype_t t)
{
	planrt_comm_t w = planrt_world_comm();
	if (op == ALL_REDUCE)
		PLANRT_CHECK(planrt_allreduce(send, recv, count, t, planrt_sum, w, NULL, NULL));
	else if (op == ALL_GATHER)
		PLANRT_CHECK(planrt_allgather(send, recv, count, t, w, NULL, NULL));
	else
		PLANRT_CHECK(planrt_reduce_scatter(send, recv, count, t, planrt_sum, w, NULL, NULL));
}

/* Mean seconds per call on the slowest rank, and the wrong elements summed over ranks. */
static double timed(int use_planrt, int op, const void *send, void *recv, size_t count, planrt_dtype_t t, int iters,
		    int warmup, long *nwrong)
{
	size_t out = op == ALL_GATHER ? count * (size_t)world : count;
	memset(recv, 0, out * planrt_dtype_size(t));
	for (int i = 0; i < warmup; i++)
		(use_planrt ? run_planrt : run_mpi)(op, send, recv, count, t);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = planrt_now();
	for (int i = 0; i < iters; i++)
		(use_planrt ? run_planrt : run_mpi)(op, send, recv, count, t);
	double dt = (planrt_now() - t0) / iters, slowest;
	MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	long bad = wrong(op, recv, count, t);
	MPI_Allreduce(&bad, nwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	return slowest;
}

static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (*end == 'K' || *end == 'k')
		v *= 1024;
	else if (*end == 'M' || *end == 'm')
		v *= 1024 * 1024;
	else if (*end == 'G' || *end == 'g')
		v *= 1024.0 * 1024 * 1024;
	return (size_t)v;
}

int main(int argc, char **argv)
{
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	size_t minb = 8, maxb = 16 << 20, factor = 4;
	int iters = 0, warmup = 3;
	planrt_dtype_t t = planrt_f32;
	int ops[3] = {1, 1, 1};
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *o = argv[i], *v = argv[i + 1];
		if (!strcmp(o, "-b"))
			minb = parse_size(v);
		else if (!strcmp(o, "-e"))
			maxb = parse_size(v);
		else if (!strcmp(o, "-f"))
			factor = (size_t)atoi(v);
		else if (!strcmp(o, "-n"))
			iters = atoi(v);
		else if (!strcmp(o, "-w"))
			warmup = atoi(v);
		else if (!strcmp(o, "-d"))
			t = !strcmp(v, "int32") ? planrt_i32 : !strcmp(v, "bfloat16") ? planrt_bf16 : planrt_f32;
		else if (!strcmp(o, "-o"))
			for (int k = 0; k < 3; k++)
				ops[k] = strstr(v, op_names[k]) != NULL;
		else
			planrt_fatal("unknown option %s; see the comment at the top of bench/collectives.c", o);
	}
	if (factor < 2)
		factor = 2;
	MPI_Op_create(bf16_sum, 1, &bf16_op);
	const char *tname = t == planrt_f32 ? "float" : t == planrt_i32 ? "int32" : "bfloat16";
	size_t es = planrt_dtype_size(t), unit = es * (size_t)world;
	char *send = malloc(maxb + unit), *recv = malloc(maxb + unit);
	if (rank == 0) {
		const char *wd = getenv("PLANRT_WATCHDOG");
		printf("# planrt collectives vs plain MPI, %d ranks, PLANRT_WATCHDOG=%s\n", world, wd ? wd : "(default 300)");
	}
	for (int op = 0; op < 3; op++) {
		if (!ops[op])
			continue;
		if (rank == 0) {
			printf("#\n# %s\n", op_names[op]);
			printf("#                                                    planrt                             plain MPI\n");
			printf("# %10s %12s %8s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type", "redop", "time",
			       "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
			printf("# %10s %12s %8s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "(us)",
			       "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
		}
		double factor_bus = op == ALL_REDUCE ? 2.0 * (world - 1) / world : (double)(world - 1) / world;
		for (size_t size = minb; size <= maxb; size *= factor) {
			/* count per rank: all-reduce the whole buffer, the others a 1/n block of it */
			size_t count = op == ALL_REDUCE ? size / es : size / unit;
			if (count == 0)
				continue;
			size_t bytes = op == ALL_REDUCE ? count * es : count * unit;
			size_t nin = op == REDUCE_SCATTER ? count * (size_t)world : count;
			fill(send, nin, t, rank, 0);
			int n = iters > 0 ? iters : (int)(bytes < (1 << 16) ? 200 : bytes < (4 << 20) ? 40 : 8);
			long bad_p, bad_m;
			double tp = timed(1, op, send, recv, count, t, n, warmup, &bad_p);
			double tm = timed(0, op, send, recv, count, t, n, warmup, &bad_m);
			if (rank == 0) {
				double ap = (double)bytes / tp * 1e-9, am = (double)bytes / tm * 1e-9;
				printf("  %10zu %12zu %8s %6s %9.1f %7.2f %7.2f %6ld %9.1f %7.2f %7.2f %6ld\n", bytes,
				       bytes / es, tname, op == ALL_GATHER ? "none" : "sum", tp * 1e6, ap, ap * factor_bus,
				       bad_p, tm * 1e6, am, am * factor_bus, bad_m);
				fflush(stdout);
			}
		}
	}
	free(send);
	free(recv);
	MPI_Op_free(&bf16_op);
	planrt_finalize();
	return 0;
}
