/* test_collectives.c (mpirun -np 4): the mesh and its communicators, and every collective of
 * planrt (f32, bf16, i32, f64; sum and max; blocking, nonblocking and in place) against the same
 * operation done with plain MPI calls, on the world, on a mesh axis and on a pair group; p2p,
 * planrt_test, and the bytes_sent convention. On the two-member axis a reduce-scatter of f32, bf16
 * or f64 is planrt's own pair exchange (comm_mpi.c pair_exchange), held to MPI's bits in every
 * mode. Mismatches are counted on each rank and summed over the world at the end of each test, so
 * that every rank reaches the same assertions and a failure on one rank never leaves the others
 * waiting. */
#define PLANRT_INTERNAL /* half-precision conversions for the reference */
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_kernels.h"

#include "mpi_expect.h"

static void test_mesh(void **state)
{
	/* a mesh that does not fit the world */
	int three = 3;
	const char *pipe[] = {"pipe"};
	assert_int_equal(planrt_mesh_init(1, &three, pipe), planrt_invalid_argument);
	EXPECT(strstr(planrt_last_error(), "mpirun -np 3") && strstr(planrt_last_error(), "pipe = 3"),
	       "mesh error: %s", planrt_last_error());

	/* one axis of 4: the pair group {0, 3} (tied embeddings on the first and last stage) */
	int four = 4;
	assert_int_equal(planrt_mesh_init(1, &four, pipe), planrt_success);
	EXPECT(planrt_mesh_coord(0) == rank, "pipe coord %d", planrt_mesh_coord(0));
	planrt_comm_t pair;
	assert_int_equal(planrt_pair_comm(0, 0, 3, &pair), planrt_success);
	if (rank == 0 || rank == 3) {
		EXPECT(pair && planrt_comm_size(pair) == 2 && planrt_comm_rank(pair) == (rank == 3), "pair membership");
		float x[3] = {(float)rank, 1, (float)rank * 2}, y[3];
		assert_int_equal(planrt_allreduce(x, y, 3, planrt_f32, planrt_sum, pair, NULL, NULL), planrt_success);
		EXPECT(y[0] == 3 && y[1] == 2 && y[2] == 6, "pair allreduce %g %g %g", y[0], y[1], y[2]);
	} else {
		EXPECT(pair == NULL, "rank %d is not in the pair", rank);
		float x = 0;
		assert_int_equal(planrt_allreduce(&x, &x, 1, planrt_f32, planrt_sum, pair, NULL, NULL), planrt_invalid_usage);
	}
	assert_int_equal(planrt_pair_comm(0, 2, 2, &pair), planrt_invalid_argument);

	/* data = 2 x tensor = 2, row-major, the first axis slowest */
	int sizes[2] = {2, 2};
	const char *names[2] = {"data", "tensor"};
	assert_int_equal(planrt_mesh_init(2, sizes, names), planrt_success);
	EXPECT(planrt_mesh_coord(0) == rank / 2 && planrt_mesh_coord(1) == rank % 2, "coords of %d", rank);
	for (int a = 0; a < 2; a++) {
		planrt_comm_t c = planrt_axis_comm(a);
		EXPECT(planrt_comm_size(c) == 2 && planrt_comm_rank(c) == planrt_mesh_coord(a), "axis %d comm", a);
		int32_t r = rank, sum;
		assert_int_equal(planrt_allreduce(&r, &sum, 1, planrt_i32, planrt_sum, c, NULL, NULL), planrt_success);
		/* along data: r and r +- 2; along tensor: r and r ^ 1 */
		int want = a == 0 ? 2 * (rank % 2) + 2 : 2 * (rank / 2 * 2) + 1;
		EXPECT(sum == want, "axis %d sum %d, want %d", a, sum, want);
	}
	EXPECT(planrt_axis_comm(2) == NULL && planrt_mesh_coord(5) == -1, "no axis 2");
	EXPECT(planrt_comm_size(planrt_world_comm()) == world, "world size");
	assert_all_ranks_clean();
}

/* ------------------------------------------------------------------ collectives vs MPI */

static const planrt_dtype_t dtypes[] = {planrt_f32, planrt_bf16, planrt_i32, planrt_f64};
enum { NDTYPES = sizeof dtypes / sizeof dtypes[0] };
static const char *const dtype_names[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};

/* Values whose sums are exact in every dtype, so any reduction order gives the same bits. */
static void fill(void *buf, size_t n, planrt_dtype_t t, int salt)
{
	for (size_t i = 0; i < n; i++) {
		int v = (int)((rank * 7 + (int)i * 3 + salt * 5) % 29) - 14;
		if (t == planrt_f32)
			((float *)buf)[i] = (float)v * 0.25f;
		else if (t == planrt_f64)
			((double *)buf)[i] = (double)v * 0.125;
		else if (t == planrt_bf16)
			((uint16_t *)buf)[i] = planrt_f32_to_half_((float)v * 0.25f, planrt_bf16);
		else
			((int32_t *)buf)[i] = v * 100003 + rank;
	}
}

static MPI_Datatype mpi_of(planrt_dtype_t t)
{
	return t == planrt_f32 ? MPI_FLOAT : t == planrt_f64 ? MPI_DOUBLE : t == planrt_i32 ? MPI_INT32_T : MPI_UINT16_T;
}

/* plain MPI reference: f32 / i32 directly; bf16 through f32 and one rounding (the documented
 * semantics of a bf16 reduction) */
enum { AR, RS, AG, A2A, BC };

static void reference(int kind, const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_op_t op, int root,
		      MPI_Comm comm, int n)
{
	MPI_Op mop = op == planrt_sum ? MPI_SUM : MPI_MAX;
	MPI_Datatype dt = mpi_of(t);
	int c = (int)count;
	size_t es = planrt_dtype_size(t);
	if (t == planrt_bf16 && (kind == AR || kind == RS)) {
		size_t nin = kind == AR ? count : count * (size_t)n;
		float *a = malloc(nin * 4 + 4), *b = malloc(nin * 4 + 4);
		for (size_t i = 0; i < nin; i++)
			a[i] = planrt_half_to_f32_(((const uint16_t *)send)[i], t);
		if (kind == AR)
			MPI_Allreduce(a, b, c, MPI_FLOAT, mop, comm);
		else
			MPI_Reduce_scatter_block(a, b, c, MPI_FLOAT, mop, comm);
		for (size_t i = 0; i < count; i++)
			((uint16_t *)recv)[i] = planrt_f32_to_half_(b[i], t);
		free(a);
		free(b);
		return;
	}
	switch (kind) {
	case AR: MPI_Allreduce(send, recv, c, dt, mop, comm); break;
	case RS: MPI_Reduce_scatter_block(send, recv, c, dt, mop, comm); break;
	case AG: MPI_Allgather(send, c, dt, recv, c, dt, comm); break;
	case A2A: MPI_Alltoall(send, c, dt, recv, c, dt, comm); break;
	case BC:
		memcpy(recv, send, count * es);
		MPI_Bcast(recv, c, dt, root, comm);
		break;
	}
}

static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast"};
enum { OUT_OF_PLACE, NONBLOCKING, IN_PLACE, IN_PLACE_NCCL, IN_PLACE_NONBLOCKING, NMODES };
static const char *const mode_names[] = {"blocking", "nonblocking", "in place", "in place (NCCL)",
					 "in place nonblocking"};

static planrt_result_t call(int kind, const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_op_t op,
			    int root, planrt_comm_t c, planrt_request_t *req)
{
	switch (kind) {
	case AR: return planrt_allreduce(send, recv, count, t, op, c, NULL, req);
	case RS: return planrt_reduce_scatter(send, recv, count, t, op, c, NULL, req);
	case AG: return planrt_allgather(send, recv, count, t, c, NULL, req);
	case A2A: return planrt_alltoall(send, recv, count, t, c, NULL, req);
	default: return planrt_broadcast(recv, count, t, root, c, NULL, req);
	}
}

/* Runs one collective in one mode with planrt and compares with the reference. */
static void check(int kind, planrt_dtype_t t, planrt_op_t op, int mode, planrt_comm_t c, size_t count, int salt)
{
	int n = planrt_comm_size(c), me = planrt_comm_rank(c);
	size_t es = planrt_dtype_size(t);
	size_t nsend = kind == AR || kind == BC || kind == AG ? count : count * (size_t)n;
	size_t nrecv = kind == AR || kind == RS || kind == BC ? count : count * (size_t)n;
	size_t big = (nsend > nrecv ? nsend : nrecv) + 1;
	char *send = malloc(big * es), *want = malloc(big * es), *buf = malloc(big * es), *got = NULL;
	fill(send, nsend, t, salt);
	int root = n - 1;
	reference(kind, send, want, count, t, op, root, c->comm, n);
	memset(buf, 0x5a, big * es);
	planrt_request_t req = NULL, *rp = mode == NONBLOCKING || mode == IN_PLACE_NONBLOCKING ? &req : NULL;
	int in_place = mode == IN_PLACE || mode == IN_PLACE_NCCL || mode == IN_PLACE_NONBLOCKING;
	planrt_result_t r;
	if (kind == BC) {
		memcpy(buf, send, count * es);
		r = call(kind, buf, buf, count, t, op, root, c, rp);
		got = buf;
	} else if (!in_place) {
		r = call(kind, send, buf, count, t, op, root, c, rp);
		got = buf;
	} else if (kind == AR || kind == A2A || (kind == RS && mode != IN_PLACE_NCCL)) {
		/* send == recv: the input in the buffer, the result at its start */
		memcpy(buf, send, nsend * es);
		r = call(kind, buf, buf, count, t, op, root, c, rp);
		got = buf;
	} else if (kind == RS) {
		/* NCCL: recv = send + rank * recvcount */
		memcpy(buf, send, nsend * es);
		r = call(kind, buf, buf + (size_t)me * count * es, count, t, op, root, c, rp);
		got = buf + (size_t)me * count * es;
	} else if (mode == IN_PLACE_NCCL) {
		/* allgather, NCCL: send = recv + rank * sendcount */
		memcpy(buf + (size_t)me * count * es, send, count * es);
		r = call(kind, buf + (size_t)me * count * es, buf, count, t, op, root, c, rp);
		got = buf;
	} else {
		/* allgather, send == recv: this rank's block at the start */
		memcpy(buf, send, count * es);
		r = call(kind, buf, buf, count, t, op, root, c, rp);
		got = buf;
	}
	EXPECT(r == planrt_success, "%s start: %s", kind_names[kind], planrt_last_error());
	if (rp && r == planrt_success) {
		int done = 0;
		/* polled for up to a minute (a count of polls ran out on a loaded machine: the other ranks
		 * may not be scheduled for a while) */
		for (double t0 = planrt_now(); !done && planrt_now() - t0 < 60;)
			EXPECT(planrt_test(req, &done) == planrt_success, "planrt_test");
		EXPECT(done, "planrt_test never reported done in 60 s");
		EXPECT(planrt_wait(req) == planrt_success, "planrt_wait: %s", planrt_last_error());
	}
	if (memcmp(got, want, nrecv * es)) {
		size_t i = 0;
		while (i < nrecv * es && got[i] == want[i])
			i++;
		EXPECT(0, "%s %s %s %s on %s, count %zu: differs from MPI at byte %zu", kind_names[kind],
		       dtype_names[t], op == planrt_sum ? "sum" : "max", mode_names[mode], c->name, count, i);
	}
	free(send);
	free(want);
	free(buf);
}

static void sweep(int kind)
{
	planrt_comm_t comms[2] = {planrt_world_comm(), planrt_axis_comm(1)};
	static const size_t counts[] = {1, 7, 1031};
	int salt = 0;
	for (int ci = 0; ci < 2; ci++)
		for (size_t di = 0; di < NDTYPES; di++)
			for (int op = 0; op < (kind == AR || kind == RS ? 2 : 1); op++)
				for (int mode = 0; mode < NMODES; mode++)
					for (size_t k = 0; k < 3; k++) {
						if (mode == IN_PLACE_NCCL && kind != RS && kind != AG)
							continue;
						check(kind, dtypes[di], (planrt_op_t)op, mode, comms[ci], counts[k], salt++);
					}
	assert_all_ranks_clean();
}

static void test_allreduce(void **state) { sweep(AR); }
static void test_reduce_scatter(void **state) { sweep(RS); }
static void test_allgather(void **state) { sweep(AG); }
static void test_alltoall(void **state) { sweep(A2A); }
static void test_broadcast(void **state) { sweep(BC); }

/* Half-precision sums accumulate in f32 and round once. bf16: rank 0 gives 1, the others 2^-9
 * each (below half an ulp of 1): the f32 sum 1 + 3 * 2^-9 rounds to 1 + 2^-7, while adding in
 * bf16 would round every partial sum back to 1. f16: 1024 + 3 * 0.5 = 1025.5 rounds (to even) to
 * 1026; pairwise f16 sums give 1024 or 1025. */
static void test_half_sums_accumulate_in_f32(void **state)
{
	uint16_t b = planrt_f32_to_half_(rank == 0 ? 1.0f : 0x1p-9f, planrt_bf16), bs;
	assert_int_equal(planrt_allreduce(&b, &bs, 1, planrt_bf16, planrt_sum, planrt_world_comm(), NULL, NULL), planrt_success);
	EXPECT(planrt_half_to_f32_(bs, planrt_bf16) == 1.0078125f, "bf16 sum %g", planrt_half_to_f32_(bs, planrt_bf16));
	uint16_t h = planrt_f32_to_half_(rank == 0 ? 1024.0f : 0.5f, planrt_f16), hs;
	assert_int_equal(planrt_allreduce(&h, &hs, 1, planrt_f16, planrt_sum, planrt_world_comm(), NULL, NULL), planrt_success);
	EXPECT(planrt_half_to_f32_(hs, planrt_f16) == 1026.0f, "f16 sum %g", planrt_half_to_f32_(hs, planrt_f16));
	assert_all_ranks_clean();
}

static void test_p2p_and_requests(void **state)
{
	planrt_comm_t w = planrt_world_comm();
	int next = (rank + 1) % world, prev = (rank + world - 1) % world;
	float out[100], in[100];
	for (int i = 0; i < 100; i++)
		out[i] = (float)(rank * 1000 + i);
	/* nonblocking both ways, completed in either order */
	planrt_request_t rs, rr;
	assert_int_equal(planrt_recv(in, 100, planrt_f32, prev, w, NULL, &rr), planrt_success);
	assert_int_equal(planrt_send(out, 100, planrt_f32, next, w, NULL, &rs), planrt_success);
	assert_int_equal(planrt_wait(rr), planrt_success);
	assert_int_equal(planrt_wait(rs), planrt_success);
	for (int i = 0; i < 100; i++)
		EXPECT(in[i] == (float)(prev * 1000 + i), "recv[%d] = %g", i, in[i]);
	/* blocking: even ranks send first */
	int32_t v = rank, got = -1;
	if (rank % 2 == 0) {
		assert_int_equal(planrt_send(&v, 1, planrt_i32, next, w, NULL, NULL), planrt_success);
		assert_int_equal(planrt_recv(&got, 1, planrt_i32, prev, w, NULL, NULL), planrt_success);
	} else {
		assert_int_equal(planrt_recv(&got, 1, planrt_i32, prev, w, NULL, NULL), planrt_success);
		assert_int_equal(planrt_send(&v, 1, planrt_i32, next, w, NULL, NULL), planrt_success);
	}
	EXPECT(got == prev, "blocking recv %d", got);
	/* several collectives in flight at once, waited in reverse order (each on buffers of its own: the
	 * allgather reading b while the in-place allreduce writes it would be a race, which MPI forbids and
	 * the node-local MPI lost whenever the allreduce finished first) */
	float a[64], b[64], g[64], c[256];
	planrt_request_t q[3];
	for (int i = 0; i < 64; i++)
		a[i] = b[i] = g[i] = (float)rank;
	assert_int_equal(planrt_allreduce(a, a, 64, planrt_f32, planrt_sum, w, NULL, &q[0]), planrt_success);
	assert_int_equal(planrt_allreduce(b, b, 64, planrt_f32, planrt_max, w, NULL, &q[1]), planrt_success);
	assert_int_equal(planrt_allgather(g, c, 64, planrt_f32, w, NULL, &q[2]), planrt_success);
	for (int k = 2; k >= 0; k--)
		assert_int_equal(planrt_wait(q[k]), planrt_success);
	EXPECT(a[5] == 6 && b[7] == 3, "overlapped results %g %g", a[5], b[7]);
	for (int r = 0; r < world; r++)
		EXPECT(c[r * 64] == (float)r, "overlapped allgather");
	/* bad arguments come back as results */
	EXPECT(planrt_send(out, 1, planrt_f32, world, w, NULL, NULL) == planrt_invalid_argument, "peer out of range");
	EXPECT(planrt_wait(NULL) == planrt_invalid_argument, "wait NULL");
	assert_all_ranks_clean();
}

/* A started send moves while its rank only computes (planrt_comm_poke_, planrt.h): rank 0 starts
 * a 1 MiB send to rank 1, whose receive is posted and waiting, and then runs nothing but GEMMs.
 * 1 MiB is past the shared-memory transport's eager size, so the data moves only while the
 * sender's MPI library runs: without the GEMMs' poke the send stays in flight until rank 0's next
 * MPI call, and the loop below ends at its 20 s bound with the send pending. */
static void test_send_moves_while_computing(void **state)
{
	planrt_comm_t w = planrt_world_comm();
	size_t n = (size_t)1 << 18;
	float *buf = malloc(n * sizeof(float));
	assert_non_null(buf);
	for (size_t i = 0; i < n; i++)
		buf[i] = rank == 0 ? (float)(i % 1000) : -1.0f;
	planrt_request_t req = NULL;
	if (rank == 1)
		assert_int_equal(planrt_recv(buf, n, planrt_f32, 0, w, NULL, &req), planrt_success);
	float one = 1;
	assert_int_equal(planrt_allreduce(&one, &one, 1, planrt_f32, planrt_sum, w, NULL, NULL), planrt_success);
	if (rank == 0) {
		static float a[64 * 64], c[64 * 64];
		assert_int_equal(planrt_send(buf, n, planrt_f32, 1, w, NULL, &req), planrt_success);
		EXPECT(planrt_comm_pending_ == 1, "%d operations in flight after the send's start", planrt_comm_pending_);
		long gemms = 0;
		double t0 = planrt_now();
		while (planrt_comm_pending_ > 0 && planrt_now() - t0 < 20) {
			planrt_k_matmul_f32(1, 64, 64, 64, a, 0, 0, a, 0, 0, c, 0, 0);
			gemms++;
		}
		EXPECT(planrt_comm_pending_ == 0, "the send still in flight after %ld GEMMs and %.1f s", gemms,
		       planrt_now() - t0);
	}
	if (req)
		assert_int_equal(planrt_wait(req), planrt_success);
	if (rank == 1)
		for (size_t i = 0; i < n; i += 997)
			EXPECT(buf[i] == (float)(i % 1000), "received[%zu] = %g", i, buf[i]);
	free(buf);
	assert_all_ranks_clean();
}

/* bytes_sent: ring algorithm bytes in the call's dtype (comm_mpi.c) */
static void test_bytes_sent(void **state)
{
	planrt_comm_t w = planrt_world_comm(), t = planrt_axis_comm(1);
	static float x[4096], y[4096];
	uint64_t b0 = planrt_bytes_sent();
	planrt_allreduce(x, y, 1000, planrt_f32, planrt_sum, w, NULL, NULL); /* 2 * 3/4 * 4000 = 6000 */
	uint64_t b1 = planrt_bytes_sent();
	EXPECT(b1 - b0 == 6000, "allreduce counted %llu", (unsigned long long)(b1 - b0));
	planrt_allreduce(x, y, 1000, planrt_bf16, planrt_sum, w, NULL, NULL); /* 3000: bf16 bytes */
	uint64_t b2 = planrt_bytes_sent();
	EXPECT(b2 - b1 == 3000, "bf16 allreduce counted %llu", (unsigned long long)(b2 - b1));
	planrt_allgather(x, y, 100, planrt_f32, w, NULL, NULL);      /* 3 * 400 */
	planrt_reduce_scatter(x, y, 100, planrt_f32, planrt_sum, w, NULL, NULL); /* 3 * 400 */
	planrt_alltoall(x, y, 10, planrt_i32, w, NULL, NULL);        /* 3 * 40 */
	planrt_allreduce(x, y, 10, planrt_f32, planrt_sum, t, NULL, NULL); /* 2 * 1/2 * 40 */
	uint64_t b3 = planrt_bytes_sent();
	EXPECT(b3 - b2 == 1200 + 1200 + 120 + 40, "collectives counted %llu", (unsigned long long)(b3 - b2));
	int next = (rank + 1) % world, prev = (rank + world - 1) % world;
	planrt_request_t r;
	planrt_recv(y, 25, planrt_f32, prev, w, NULL, &r);
	planrt_send(x, 25, planrt_f32, next, w, NULL, NULL); /* 100; receiving counts nothing */
	planrt_wait(r);
	EXPECT(planrt_bytes_sent() - b3 == 100, "p2p counted %llu", (unsigned long long)(planrt_bytes_sent() - b3));
	assert_all_ranks_clean();
}

int main(int argc, char **argv)
{
	PLANRT_CHECK(planrt_init(&argc, &argv, &rank, &world));
	if (world != 4) {
		if (rank == 0)
			fprintf(stderr, "test_collectives runs on 4 ranks (mpirun -np 4), not %d\n", world);
		planrt_finalize();
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mesh),           cmocka_unit_test(test_allreduce),
		cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_allgather),
		cmocka_unit_test(test_alltoall),       cmocka_unit_test(test_broadcast),
		cmocka_unit_test(test_half_sums_accumulate_in_f32), cmocka_unit_test(test_p2p_and_requests),
		cmocka_unit_test(test_send_moves_while_computing),
		cmocka_unit_test(test_bytes_sent),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	int any = 0;
	MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	planrt_finalize();
	return any ? 1 : 0;
}
