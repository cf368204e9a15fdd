/* planrt_staged.h: the MPI device backend (comm/staged.c): planrt's collectives and point-to-point
 * transfers on device streams, carried out by MPI on host copies of the device buffers, for ranks
 * that share a GPU (NCCL refuses two ranks on one device) or a machine without NCCL, as PyTorch's
 * gloo serves CUDA tensors. Runtime internals: the CUDA layer (cuda/) and the tests use it, never a
 * generated program.
 *
 * The layer is written against a small interface to the device (planrt_stage_ops_t): copies
 * between device and host memory enqueued on a stream, events, a gate that holds a stream until a
 * host thread raises a flag, and the compute stream. runtime/cuda/stage_cuda.cu implements it with
 * CUDA; tests/cuda/test_comm_staged.c with host threads as streams, so that the staging and the
 * ordering run and are checked on a machine without a GPU. */
#ifndef PLANRT_STAGED_H
#define PLANRT_STAGED_H

#include <stddef.h>
#include <stdint.h>

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct planrt_stage_event *planrt_stage_event_t; /* the device's event */

typedef struct planrt_stage_ops {
	const char *name;
	/* host memory the device copies to and from (pinned and device-mapped on a GPU; the gates'
	 * flags live there too); NULL when there is none left */
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *p);
	/* enqueued on stream s: bytes from device memory to host memory, and back */
	void (*to_host)(void *host, const void *dev, size_t bytes, planrt_stream_t s);
	void (*to_device)(void *dev, const void *host, size_t bytes, planrt_stream_t s);
	/* events: recorded on s (done when s has run everything enqueued before it), queried (1: done;
	 * from any thread), waited for by the calling host thread, waited for by stream s */
	planrt_stage_event_t (*event_new)(void);
	void (*event_free)(planrt_stage_event_t e); /* safe while a stream still waits for it */
	void (*record)(planrt_stage_event_t e, planrt_stream_t s);
	int (*query)(planrt_stage_event_t e);
	void (*host_wait)(planrt_stage_event_t e);
	void (*stream_wait)(planrt_stream_t s, planrt_stage_event_t e);
	/* enqueued on s: s runs nothing after this until (int32_t)(*flag - value) >= 0; flag is in
	 * host_alloc memory and raised by a host thread */
	void (*gate)(planrt_stream_t s, volatile uint32_t *flag, uint32_t value);
	/* the stream a request's planrt_wait holds back (the device's compute stream) */
	planrt_stream_t (*compute)(void);
	/* run first by each lane thread (the GPU made current there); NULL: nothing */
	void (*thread_start)(void);
} planrt_stage_ops_t;

/* Starts the layer on ops (once per process, after planrt_init with MPI_THREAD_MULTIPLE: its
 * threads make MPI calls beside the program's). Its watchdog reads PLANRT_WATCHDOG. */
planrt_result_t planrt_staged_start_(const planrt_stage_ops_t *ops);
/* From now on c's device operations can go through the layer (collective over c): a duplicate of
 * c's MPI communicator and its lanes, each a host thread that runs its operations in the order
 * they were enqueued (as NCCL runs a communicator's): one for the collectives, and nchan x ncolors
 * for point-to-point (the NCCL layer's channel communicators, planrt_channel_lane_), so that a
 * receive posted ahead on one channel never holds up a send on another. */
planrt_result_t planrt_staged_add_(planrt_comm_t c, int nchan, int ncolors);
int planrt_staged_has_(planrt_comm_t c);
/* The comm layer (planrt_comm_layer_t's run and alltoallv) for communicators added here. */
planrt_result_t planrt_staged_run_(planrt_coll_t kind, const void *sendbuf, void *recvbuf, size_t count,
				   planrt_dtype_t t, planrt_op_t op, int peer, int tag, planrt_comm_t c,
				   planrt_stream_t stream, planrt_request_t *req);
planrt_result_t planrt_staged_alltoallv_(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
					 void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, planrt_dtype_t t,
					 planrt_comm_t c, planrt_stream_t stream);
extern const planrt_comm_layer_t planrt_staged_layer_;
/* Waits until every operation enqueued has finished, then ends the lanes' threads and frees the
 * staging memory (the layer can be started again). */
void planrt_staged_stop_(void);
/* Host staging memory the layer holds now and at most (bytes), for the memory report. */
size_t planrt_staged_host_bytes_(void);
size_t planrt_staged_host_peak_(void);

/* How a thread that polls (a lane waiting for MPI or for a staging copy) waits between polls: a
 * short spin, then sched_yield, then sleeps of 20 to 50 us, spins counting the polls so far; so
 * that ranks and their lanes that outnumber the cores still let each other run. */
void planrt_poll_backoff_(unsigned *spins);

/* The lane of a point-to-point message on a communicator with nchan channels of ncolors colours
 * (the NCCL layer's channel communicators; the staged layer's point-to-point lanes): -1 for the
 * communicator itself (no channels, or a tag outside them), else channel * ncolors + colour. The
 * colour is the sender's parity, and 2 for the last member wrapping to member 0 when the size is
 * odd; with one colour (async's tags) every message of a tag shares its lane. */
int planrt_channel_lane_(int nchan, int ncolors, int size, int tag, int sender);

#ifdef __cplusplus
}
#endif
#endif
