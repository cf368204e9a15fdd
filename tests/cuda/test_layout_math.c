/* test_layout_math.c (mpirun -np 4): the CUDA target's layout conversions along a split dim
 * (runtime/cuda/exec_cuda.cu's slice, all-gather and reduce-scatter, whose packing kernel runs
 * planrt_layout_math.h's element map) emulated here on the CPU, composed as exec_cuda.cu composes
 * them (the same flat collectives, the same packed order), against runtime/cpu/exec.c's
 * planrt_slice_dim, planrt_allgather_dim and planrt_reduce_scatter_dim over MPI, bit for bit:
 * contiguous blocks and the causally balanced ring's two mirrored chunks (context parallelism),
 * rings of 2 (an axis of a 2 x 2 mesh) and 4 (the world), tensors of rank 1-4 split along each of
 * their dims, 4-byte and 2-byte elements. The gathered tensor must also be the whole one the slices
 * came from. As a check that the test can fail, the mirrored cases are run once more with the
 * contiguous chunk order, and must mismatch. Mismatches are summed over the world; exit 1 when any. */
#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_layout_math.h"

static int rank_, world_;

/* element i of a buffer of 2- or 4-byte elements, as an integer */
static uint32_t get(const void *b, size_t elem, int64_t i)
{
	return elem == 2 ? ((const uint16_t *)b)[i] : ((const uint32_t *)b)[i];
}

static void put(void *b, size_t elem, int64_t i, uint32_t v)
{
	if (elem == 2)
		((uint16_t *)b)[i] = (uint16_t)v;
	else
		((uint32_t *)b)[i] = v;
}

static long differ(const void *a, const void *b, size_t elem, int64_t n)
{
	long bad = 0;
	for (int64_t i = 0; i < n; i++)
		bad += get(a, elem, i) != get(b, elem, i);
	return bad;
}

/* One shape, split dim and layout on communicator c: the mismatches between the device's composition
 * (the map of `device_mirrored`) and the CPU's conversions of `mirrored`. */
static long one_case(planrt_comm_t c, int rank, const int64_t *full, int dim, int mirrored, int device_mirrored,
		     planrt_dtype_t t)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	size_t elem = planrt_dtype_size(t);
	int64_t total = 1, local[4];
	for (int d = 0; d < rank; d++) {
		total *= full[d];
		local[d] = full[d];
	}
	local[dim] /= n;
	int64_t block = total / n;
	char *whole = malloc(elem * (size_t)total), *cpu = malloc(elem * (size_t)total), *dev = malloc(elem * (size_t)total);
	char *scratch = malloc(elem * (size_t)total), *packed = malloc(elem * (size_t)total);
	char *slice_cpu = malloc(elem * (size_t)block), *slice_dev = malloc(elem * (size_t)block);
	for (int64_t i = 0; i < total; i++) /* f32: small integers, whose sums are exact in any order */
		if (elem == 4)
			((float *)whole)[i] = (float)(i % 113);
		else
			put(whole, elem, i, (uint32_t)(i * 7 + 3) & 0xffff);
	long bad = 0;
	planrt_split_layout_t l = {1, full[dim], 1, n, device_mirrored};
	for (int d = 0; d < dim; d++)
		l.outer *= full[d];
	for (int d = dim + 1; d < rank; d++)
		l.inner *= full[d];

	/* slice: this rank's block */
	planrt_slice_dim(whole, slice_cpu, rank, full, dim, mirrored, t, c);
	for (int64_t j = 0; j < block; j++)
		put(slice_dev, elem, j, get(whole, elem, planrt_lm_source(l, (int64_t)me * block + j)));
	bad += differ(slice_cpu, slice_dev, elem, block);

	/* all-gather of the slices: flat blocks in rank order, then unpacked by the map */
	planrt_allgather_dim(slice_cpu, cpu, rank, local, dim, mirrored, t, c, scratch);
	bad += differ(cpu, whole, elem, total) != 0;
	PLANRT_CHECK(planrt_allgather(slice_cpu, packed, (size_t)block, t, c, NULL, NULL));
	for (int64_t q = 0; q < total; q++)
		put(dev, elem, planrt_lm_source(l, q), get(packed, elem, q));
	bad += differ(cpu, dev, elem, total);

	/* reduce-scatter (f32 sums) of rank-scaled copies: packed by the map, then flat */
	if (t == planrt_f32) {
		float *x = (float *)dev;
		for (int64_t i = 0; i < total; i++)
			x[i] = ((float *)whole)[i] * (float)(planrt_comm_rank(c) + 1);
		planrt_reduce_scatter_dim(x, slice_cpu, rank, full, dim, mirrored, t, c, scratch);
		for (int64_t q = 0; q < total; q++)
			((float *)packed)[q] = x[planrt_lm_source(l, q)];
		PLANRT_CHECK(planrt_reduce_scatter(packed, slice_dev, (size_t)block, t, planrt_sum, c, NULL, NULL));
		bad += differ(slice_cpu, slice_dev, elem, block);
	}
	free(whole);
	free(cpu);
	free(dev);
	free(scratch);
	free(packed);
	free(slice_cpu);
	free(slice_dev);
	return bad;
}

/* every shape and split dim on c (ring of n): the summed mismatches */
static long cases(planrt_comm_t c, int mirrored, int device_mirrored, planrt_dtype_t t)
{
	static const int64_t shapes[][4] = {{24, 0, 0, 0}, {3, 16, 0, 0}, {2, 8, 5, 0}, {2, 3, 16, 4}, {8, 2, 3, 8}};
	static const int ranks[] = {1, 2, 3, 4, 4};
	int n = planrt_comm_size(c);
	long bad = 0;
	for (int s = 0; s < 5; s++)
		for (int dim = 0; dim < ranks[s]; dim++)
			if (shapes[s][dim] % (2 * n) == 0) /* mirrored: 2n chunks */
				bad += one_case(c, ranks[s], shapes[s], dim, mirrored, device_mirrored, t);
	return bad;
}

static int report(const char *what, long bad, int want_mismatch)
{
	long total = 0;
	MPI_Allreduce(&bad, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	int ok = want_mismatch ? total > 0 : total == 0;
	if (rank_ == 0)
		printf("%s: %s (%ld mismatches over %d ranks)\n", ok ? "PASS" : "FAIL", what, total, world_);
	return !ok;
}

int main(int argc, char **argv)
{
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank_, &world_));
	if (world_ != 4) {
		if (rank_ == 0)
			fprintf(stderr, "test_layout_math runs on 4 ranks (mpirun -np 4), not %d\n", world_);
		planrt_finalize();
		return 1;
	}
	int sizes[2] = {2, 2};
	const char *names[2] = {"data", "ctx"};
	PLANRT_CHECK(planrt_mesh_init(2, sizes, names));
	planrt_comm_t rings[2] = {planrt_axis_comm(1), planrt_world_comm()};
	int failed = 0;
	char what[160];
	for (int r = 0; r < 2; r++) {
		int n = planrt_comm_size(rings[r]);
		for (int mirrored = 0; mirrored < 2; mirrored++) {
			snprintf(what, sizeof what, "ring of %d, %s, f32", n, mirrored ? "mirrored" : "contiguous");
			failed |= report(what, cases(rings[r], mirrored, mirrored, planrt_f32), 0);
			snprintf(what, sizeof what, "ring of %d, %s, bf16", n, mirrored ? "mirrored" : "contiguous");
			failed |= report(what, cases(rings[r], mirrored, mirrored, planrt_bf16), 0);
		}
		snprintf(what, sizeof what, "ring of %d, mirrored, with the contiguous chunk order: must mismatch", n);
		failed |= report(what, cases(rings[r], 1, 0, planrt_f32), 1);
	}
	planrt_finalize();
	return failed;
}
