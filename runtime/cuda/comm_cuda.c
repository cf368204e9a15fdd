/* comm_cuda.c: the device comm layer of a CUDA program: which backend carries each communicator, and
 * the layer planrt's collectives on a device stream go through (planrt_comm_layer_t).
 *
 * When the mesh exists (the device layer's start) every mesh axis group through this rank, and
 * later every tied-parameter pair it is in, gets a backend from its members' GPUs: the members
 * all-gather their GPU's UUID and PCI bus id over the group's own MPI communicator (the group's
 * size, not the world's), and binding.c decides under PLANRT_COMM (auto, nccl, mpi):
 *   NCCL (comm_nccl.c)                  every member on its own GPU;
 *   the MPI device backend (staged.c)   two members on one GPU (auto), or PLANRT_COMM=mpi; its
 *                                       device side is stage_cuda.cu;
 *   copies                              a group of one member.
 * PLANRT_COMM=nccl with two members on one GPU stops the run with one line naming them. Both
 * backends get the same channels: the pipe axis one per direction and model chunk (colours by
 * sender parity, 3 when the stage count is odd), async's role axis one per tag. Every member of a
 * group decides from the same ids, so a group never mixes backends.
 *
 * A started operation on NCCL or copies gets a device request here (an event after it on its
 * stream; planrt_wait makes the compute stream wait for it); the MPI device backend makes its own. */
#define PLANRT_INTERNAL
#include <mpi.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planrt.h"
#include "planrt_binding.h"
#include "planrt_cuda_internal.h"
#include "planrt_program.h"
#include "planrt_staged.h"

enum { MAX_GROUPS = 96 };

static struct {
	planrt_comm_t comm;
	planrt_backend_t backend;
} groups[MAX_GROUPS];
static int ngroups;
static planrt_comm_mode_t mode;
static int staged_started;
static const char *const kind_text[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
					 "broadcast", "send", "recv", "alltoallv"};

void planrt_cu_comm_mode_(planrt_comm_mode_t m)
{
	mode = m;
}

static planrt_backend_t backend_of(planrt_comm_t c, int *known)
{
	for (int i = 0; i < ngroups; i++)
		if (groups[i].comm == c) {
			*known = 1;
			return groups[i].backend;
		}
	*known = 0;
	return PLANRT_BACKEND_COPY;
}

/* this rank's GPU, as its groups' members exchange it */
static planrt_device_id_t my_device(void)
{
	planrt_device_id_t id;
	memset(&id, 0, sizeof id);
	int dev = 0;
	struct cudaDeviceProp prop;
	planrt_cu_check_(cudaGetDevice(&dev), "cudaGetDevice");
	planrt_cu_check_(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
	memcpy(id.uuid, prop.uuid.bytes, sizeof id.uuid);
	if (cudaDeviceGetPCIBusId(id.bus, (int)sizeof id.bus, dev) != cudaSuccess)
		snprintf(id.bus, sizeof id.bus, "%d", dev);
	id.world_rank = planrt_world_rank_();
	return id;
}

/* a group's backend from its members' GPUs, and the backend's communicator (collective over c) */
static planrt_backend_t open_group(planrt_comm_t c, int nchan, int ncolors, int *shared_with)
{
	int n = planrt_comm_size(c);
	planrt_device_id_t mine = my_device(), *ids = calloc((size_t)n, sizeof *ids);
	if (!ids)
		planrt_fatal("out of memory for the device ids of %s", c->name);
	if (MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, ids, (int)sizeof mine, MPI_BYTE, c->comm) != MPI_SUCCESS)
		planrt_fatal("exchanging the GPU ids of %s over MPI failed", c->name);
	planrt_backend_t b;
	int shared = -1;
	if (planrt_choose_backend_(mode, n, ids, c->name, &b, &shared) != planrt_success)
		planrt_fatal("%s", planrt_last_error());
	*shared_with = shared >= 0 ? ids[shared].world_rank : -1;
	free(ids);
	if (b == PLANRT_BACKEND_NCCL) {
		PLANRT_CHECK(planrt_nccl_open_(c, nchan, ncolors));
	} else if (b == PLANRT_BACKEND_MPI) {
		if (!staged_started) {
			PLANRT_CHECK(planrt_staged_start_(planrt_cu_stage_ops_()));
			staged_started = 1;
		}
		PLANRT_CHECK(planrt_staged_add_(c, nchan, ncolors));
	}
	if (ngroups == MAX_GROUPS)
		planrt_fatal("internal error: more than %d device communicators", MAX_GROUPS);
	groups[ngroups].comm = c;
	groups[ngroups].backend = b;
	ngroups++;
	return b;
}

/* the channels of axis `axis` of the running program (none: 0) */
static void channels(const planrt_program_t *prog, int axis, int *nchan, int *ncolors)
{
	*nchan = *ncolors = 0;
	if (!prog)
		return;
	int size = planrt_comm_size(planrt_axis_comm(axis));
	if (axis == prog->pipe_axis) { /* 2 directions x the most model chunks of a stage */
		int chunks = 1, nroles = prog->nroles > 1 ? prog->nroles : 1;
		for (int i = 0; i < prog->nstages * nroles; i++)
			chunks = prog->stages[i].nchunks > chunks ? prog->stages[i].nchunks : chunks;
		*nchan = 2 * chunks;
		*ncolors = size % 2 ? 3 : 2;
	} else if (prog->nroles == 2 && axis == prog->role_axis) { /* async: sync.c's TAG_PARAMS and TAG_GRADS */
		*nchan = 2;
		*ncolors = 1;
	} else if (prog->ring_axes >> axis & 1) { /* ring.c's tags 1 (K/V) and 2 (their gradient sums), by the sender's parity */
		*nchan = 3;
		*ncolors = size % 2 ? 3 : 2;
	}
	if (*nchan > 16) /* more than 8 model chunks a stage: the transfers share the group's communicator */
		*nchan = *ncolors = 0;
}

static const planrt_comm_layer_t device_layer;

void planrt_cu_comm_start_(void)
{
	const planrt_program_t *prog = planrt_cu_program_();
	planrt_comm_layer_set_(&device_layer);
	char picked[512] = "";
	size_t len = 0;
	for (int a = 0; prog && a < prog->naxes; a++) {
		planrt_comm_t c = planrt_axis_comm(a);
		int nchan, ncolors, shared;
		channels(prog, a, &nchan, &ncolors);
		planrt_backend_t b = open_group(c, nchan, ncolors, &shared);
		if (b != PLANRT_BACKEND_COPY && len < sizeof picked)
			len += (size_t)snprintf(picked + len, sizeof picked - len, "%s%s: %s%s", len ? "; " : "", c->name,
						planrt_backend_name_(b),
						shared >= 0 ? " (ranks share a GPU)" : "");
	}
	if (planrt_world_rank_() == 0 && picked[0] && (staged_started || getenv("PLANRT_REPORT_COMM")))
		fprintf(stderr, "planrt: rank 0's device communicators (PLANRT_COMM=%s): %s\n", planrt_comm_mode_name_(mode),
			picked);
}

void planrt_cu_comm_pair_(planrt_comm_t pair)
{
	int shared;
	if (pair)
		open_group(pair, 0, 0, &shared);
}

/* ------------------------------------------------------------------ the layer */

typedef struct device_req {
	cudaEvent_t ev;
} device_req_t;

static planrt_result_t req_wait(void *impl)
{
	device_req_t *r = impl;
	planrt_cu_wait_comm_(planrt_cu_stream_(0), r->ev, "a started operation");
	cudaEventDestroy(r->ev);
	free(r);
	return planrt_success;
}

static planrt_result_t req_test(void *impl, int *done)
{
	device_req_t *r = impl;
	cudaError_t e = cudaEventQuery(r->ev);
	*done = e == cudaSuccess;
	return e == cudaSuccess || e == cudaErrorNotReady
		       ? planrt_success
		       : planrt_error_(planrt_system_error, "testing a device request: %s", cudaGetErrorString(e));
}

static const planrt_request_ops_t req_ops = {req_wait, req_test};

/* a request for what stream has been given so far */
static planrt_request_t device_request(cudaStream_t stream)
{
	device_req_t *r = calloc(1, sizeof *r);
	if (!r)
		planrt_fatal("out of memory for a device request");
	planrt_cu_check_(cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming), "cudaEventCreate");
	planrt_cu_check_(cudaEventRecord(r->ev, stream), "cudaEventRecord");
	return planrt_request_external_(r, &req_ops);
}

static planrt_result_t layer_run(planrt_coll_t kind, const void *send, void *recv, size_t count, planrt_dtype_t t,
				 planrt_op_t op, int peer, int tag, planrt_comm_t c, planrt_stream_t stream,
				 planrt_request_t *req)
{
	int known;
	planrt_backend_t b = backend_of(c, &known);
	if (!known)
		return planrt_error_(planrt_invalid_usage, "%s on %s, a communicator the device comm layer has not opened",
				     kind_text[kind], c->name);
	cudaStream_t s = (cudaStream_t)stream;
	if (b == PLANRT_BACKEND_MPI) { /* on the compute stream itself, compute waits all along */
		int span = planrt_cu_span_begin_(s, kind_text[kind]);
		planrt_result_t r = planrt_staged_run_(kind, send, recv, count, t, op, peer, tag, c, stream, req);
		planrt_cu_span_end_(span, s);
		return r;
	}
	if (b == PLANRT_BACKEND_NCCL) {
		int span = planrt_cu_span_begin_(s, kind_text[kind]);
		planrt_result_t r = planrt_nccl_run_(kind, send, recv, count, t, op, peer, tag, c, s);
		planrt_cu_span_end_(span, s);
		if (r != planrt_success)
			return r;
	} else { /* one member: the result is the input */
		if (kind == planrt_coll_send || kind == planrt_coll_recv)
			return planrt_error_(planrt_invalid_argument, "%s to itself on %s", kind_text[kind], c->name);
		if (recv != send && count)
			planrt_cu_check_(cudaMemcpyAsync(recv, send, count * planrt_dtype_size(t), cudaMemcpyDeviceToDevice, s),
					 "cudaMemcpyAsync");
	}
	if (req)
		*req = device_request(s);
	return planrt_success;
}

static planrt_result_t layer_alltoallv(const void *send, const int64_t *sc, const int64_t *sd, void *recv,
				       const int64_t *rc, const int64_t *rd, planrt_dtype_t t, planrt_comm_t c,
				       planrt_stream_t stream)
{
	int known;
	planrt_backend_t b = backend_of(c, &known);
	if (!known)
		return planrt_error_(planrt_invalid_usage, "alltoallv on %s, a communicator the device comm layer has not opened",
				     c->name);
	if (b == PLANRT_BACKEND_MPI)
		return planrt_staged_alltoallv_(send, sc, sd, recv, rc, rd, t, c, stream);
	if (b == PLANRT_BACKEND_NCCL)
		return planrt_nccl_alltoallv_(send, sc, sd, recv, rc, rd, t, c, (cudaStream_t)stream);
	size_t es = planrt_dtype_size(t);
	if (sc[0] != rc[0])
		return planrt_error_(planrt_invalid_argument, "alltoallv on %s: sends itself %lld elements but receives %lld",
				     c->name, (long long)sc[0], (long long)rc[0]);
	if (sc[0])
		planrt_cu_check_(cudaMemcpyAsync((char *)recv + (size_t)rd[0] * es, (const char *)send + (size_t)sd[0] * es,
						 (size_t)sc[0] * es, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
				 "cudaMemcpyAsync");
	return planrt_success;
}

static const planrt_comm_layer_t device_layer = {"cuda", layer_run, layer_alltoallv};

/* ------------------------------------------------------------------ the NCCL-shaped shorthands
 * planrt's collectives on a CUDA stream, carried by whichever backend carries c */

planrt_result_t planrt_nccl_allreduce(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_op_t op,
				      planrt_comm_t c, cudaStream_t stream)
{
	return planrt_allreduce(send, recv, count, t, op, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_reduce_scatter(const void *send, void *recv, size_t recvcount, planrt_dtype_t t,
					   planrt_op_t op, planrt_comm_t c, cudaStream_t stream)
{
	return planrt_reduce_scatter(send, recv, recvcount, t, op, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_allgather(const void *send, void *recv, size_t sendcount, planrt_dtype_t t, planrt_comm_t c,
				      cudaStream_t stream)
{
	return planrt_allgather(send, recv, sendcount, t, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_alltoall(const void *send, void *recv, size_t count, planrt_dtype_t t, planrt_comm_t c,
				     cudaStream_t stream)
{
	return planrt_alltoall(send, recv, count, t, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_send(const void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream)
{
	return planrt_send(buf, count, t, peer, c, (planrt_stream_t)stream, NULL);
}

planrt_result_t planrt_nccl_recv(void *buf, size_t count, planrt_dtype_t t, int peer, planrt_comm_t c,
				 cudaStream_t stream)
{
	return planrt_recv(buf, count, t, peer, c, (planrt_stream_t)stream, NULL);
}
