/* mpi.h (runtime/standalone): planrt's node-local MPI, for planrt built where no MPI library is
 * installed (the GPU check machine: scripts/gpu-build.sh). Its implementation is mpi_local.c.
 *
 * Started by `planrt-run -n N PROG ...` (planrt_run.c), the N processes are one world on one node
 * and move their messages through shared memory the launcher created; started alone, a program is
 * its own world of one rank and runs without a launcher. It provides MPI_THREAD_MULTIPLE (one lock
 * around the progress engine), which the MPI device backend (comm/staged.c) needs.
 *
 * Only the subset planrt, its tests and its benchmarks use is here: the world and split / dup
 * communicators, the blocking and nonblocking collectives planrt runs (allreduce, reduce-scatter,
 * allgather, all-to-all(v), broadcast, barrier), tagged point-to-point without wildcards, wait and
 * test. Collectives are deterministic: a reduction sums each block in member order on the block's
 * owner, so every member gets the same bits whatever the timing. A program that needs more is
 * built with a real MPI. */
#ifndef PLANRT_STANDALONE_MPI_H
#define PLANRT_STANDALONE_MPI_H

#ifdef __cplusplus
extern "C" {
#endif

#define MPI_VERSION 3
#define MPI_SUBVERSION 1
#define PLANRT_LOCAL_MPI 1

typedef int MPI_Comm;
typedef int MPI_Datatype; /* (type code << 8) | the element's size in bytes */
typedef int MPI_Op;
typedef int MPI_Errhandler;
typedef int MPI_Info;
typedef struct planrt_lmpi_req *MPI_Request;
typedef struct MPI_Status {
	int MPI_SOURCE, MPI_TAG, MPI_ERROR;
} MPI_Status;

enum { MPI_SUCCESS = 0, MPI_ERR_COMM = 5, MPI_ERR_RANK = 6, MPI_ERR_ARG = 12, MPI_ERR_TRUNCATE = 14,
       MPI_ERR_OTHER = 15, MPI_ERR_TYPE = 3, MPI_ERR_OP = 9 };
enum { MPI_COMM_NULL = 0, MPI_COMM_WORLD = 1 };
enum { MPI_DATATYPE_NULL = 0, MPI_BYTE = 0x101, MPI_UINT8_T = 0x201, MPI_UINT16_T = 0x302, MPI_INT = 0x404,
       MPI_INT32_T = 0x404, MPI_FLOAT = 0x504, MPI_DOUBLE = 0x608, MPI_LONG = 0x708, MPI_INT64_T = 0x708,
       MPI_UINT64_T = 0x808, MPI_UNSIGNED = 0x904 };
enum { MPI_SUM = 1, MPI_MAX = 2, MPI_MIN = 3 };
enum { MPI_UNDEFINED = -32766, MPI_THREAD_SINGLE = 0, MPI_THREAD_FUNNELED = 1, MPI_THREAD_SERIALIZED = 2,
       MPI_THREAD_MULTIPLE = 3, MPI_TAG_UB = 1, MPI_MAX_ERROR_STRING = 256, MPI_ERRORS_RETURN = 1,
       MPI_COMM_TYPE_SHARED = 1, MPI_INFO_NULL = 0 };
#define MPI_IN_PLACE ((void *)1)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)
#define MPI_REQUEST_NULL ((MPI_Request)0)

int MPI_Init(int *argc, char ***argv);
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
int MPI_Query_thread(int *provided);
int MPI_Initialized(int *flag);
int MPI_Finalized(int *flag);
int MPI_Finalize(void);
int MPI_Abort(MPI_Comm c, int code);
int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler h);
int MPI_Comm_rank(MPI_Comm c, int *rank);
int MPI_Comm_size(MPI_Comm c, int *size);
int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out);
int MPI_Comm_free(MPI_Comm *c);
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out);
int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out);
int MPI_Comm_get_attr(MPI_Comm c, int key, void *value, int *flag);
int MPI_Error_string(int code, char *text, int *len);

int MPI_Barrier(MPI_Comm c);
int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c);
int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c);
int MPI_Allgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c);
int MPI_Alltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c);
int MPI_Alltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc, const int *rd,
		  MPI_Datatype rt, MPI_Comm c);
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c);
int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q);
int MPI_Ireduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q);
int MPI_Iallgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c, MPI_Request *q);
int MPI_Ialltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c, MPI_Request *q);
int MPI_Ialltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc, const int *rd,
		   MPI_Datatype rt, MPI_Comm c, MPI_Request *q);
int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *q);

int MPI_Send(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c);
int MPI_Recv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Status *st);
int MPI_Isend(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q);
int MPI_Irecv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q);
int MPI_Wait(MPI_Request *q, MPI_Status *st);
int MPI_Test(MPI_Request *q, int *flag, MPI_Status *st);

#ifdef __cplusplus
}
#endif
#endif
