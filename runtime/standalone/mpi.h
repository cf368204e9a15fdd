/* mpi.h (runtime/standalone): MPI for one process, for planrt built where there is no MPI (the GPU
 * check machine: scripts/gpu-check.sh). A program built with it is its own world of one rank and
 * runs without mpirun. Every collective over a group of one is what MPI defines it to be there: the
 * result is the input (a copy unless MPI_IN_PLACE), started operations complete at once. Point to
 * point has no partner in a world of one: it returns an error whose text says so. Only the subset
 * planrt uses is here; a program that needs more ranks is built with a real MPI. */
#ifndef PLANRT_STANDALONE_MPI_H
#define PLANRT_STANDALONE_MPI_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPI_VERSION 3
#define MPI_SUBVERSION 1
#define PLANRT_ONE_PROCESS_MPI 1

typedef int MPI_Comm;
typedef int MPI_Datatype; /* the element's size in bytes */
typedef int MPI_Op;
typedef int MPI_Request;
typedef int MPI_Errhandler;
typedef struct MPI_Status {
	int MPI_SOURCE, MPI_TAG, MPI_ERROR;
} MPI_Status;

enum { MPI_SUCCESS = 0, MPI_ERR_OTHER = 15, MPI_ERR_RANK = 6 };
enum { MPI_COMM_NULL = 0, MPI_COMM_WORLD = 1, MPI_COMM_SELF_ONE = 2 };
enum { MPI_DATATYPE_NULL = 0, MPI_BYTE = 1, MPI_UINT8_T = 1, MPI_UINT16_T = 2, MPI_INT = 4, MPI_INT32_T = 4,
       MPI_FLOAT = 4, MPI_DOUBLE = 8 };
enum { MPI_SUM = 1, MPI_MAX = 2, MPI_MIN = 3 };
enum { MPI_REQUEST_NULL = 0, MPI_UNDEFINED = -32766, MPI_THREAD_FUNNELED = 1, MPI_TAG_UB = 1,
       MPI_MAX_ERROR_STRING = 256, MPI_ERRORS_RETURN = 1 };
#define MPI_IN_PLACE ((void *)1)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)

static int planrt_one_init_, planrt_one_fin_;

static inline int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	(void)argc, (void)argv;
	planrt_one_init_ = 1;
	*provided = required;
	return MPI_SUCCESS;
}
static inline int MPI_Init(int *argc, char ***argv)
{
	int p;
	return MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &p);
}
static inline int MPI_Initialized(int *flag) { *flag = planrt_one_init_; return MPI_SUCCESS; }
static inline int MPI_Finalized(int *flag) { *flag = planrt_one_fin_; return MPI_SUCCESS; }
static inline int MPI_Finalize(void) { planrt_one_fin_ = 1; return MPI_SUCCESS; }
static inline int MPI_Abort(MPI_Comm c, int code) { (void)c; exit(code ? code : 1); }
static inline int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler h) { (void)c, (void)h; return MPI_SUCCESS; }
static inline int MPI_Comm_rank(MPI_Comm c, int *rank) { (void)c; *rank = 0; return MPI_SUCCESS; }
static inline int MPI_Comm_size(MPI_Comm c, int *size) { (void)c; *size = 1; return MPI_SUCCESS; }
static inline int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out) { (void)c; *out = MPI_COMM_SELF_ONE; return MPI_SUCCESS; }
static inline int MPI_Comm_free(MPI_Comm *c) { *c = MPI_COMM_NULL; return MPI_SUCCESS; }
static inline int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out)
{
	(void)c, (void)key;
	*out = color == MPI_UNDEFINED ? MPI_COMM_NULL : MPI_COMM_SELF_ONE;
	return MPI_SUCCESS;
}
static inline int MPI_Comm_get_attr(MPI_Comm c, int key, void *value, int *flag)
{
	static int tag_ub = 2147483647;
	(void)c, (void)key;
	*(int **)value = &tag_ub;
	*flag = 1;
	return MPI_SUCCESS;
}
static inline int MPI_Error_string(int code, char *text, int *len)
{
	*len = snprintf(text, MPI_MAX_ERROR_STRING, code == MPI_ERR_RANK
			? "no partner: this planrt was built without MPI (one process), so it cannot send or receive; "
			  "build it with MPI to run more ranks"
			: "error %d of the one-process MPI", code);
	return MPI_SUCCESS;
}

/* a group of one: the result is the input */
static inline void planrt_one_copy_(const void *send, void *recv, long long bytes)
{
	if (send != MPI_IN_PLACE && send != recv && bytes > 0)
		memmove(recv, send, (size_t)bytes);
}
static inline int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	(void)op, (void)c;
	planrt_one_copy_(s, r, (long long)n * t);
	return MPI_SUCCESS;
}
static inline int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
	return MPI_Allreduce(s, r, n, t, op, c);
}
static inline int MPI_Allgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
	(void)rn, (void)rt, (void)c;
	planrt_one_copy_(s, r, (long long)n * t);
	return MPI_SUCCESS;
}
static inline int MPI_Alltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c)
{
	return MPI_Allgather(s, n, t, r, rn, rt, c);
}
static inline int MPI_Alltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc,
				const int *rd, MPI_Datatype rt, MPI_Comm c)
{
	(void)rc, (void)rt, (void)c;
	if (s != MPI_IN_PLACE)
		memmove((char *)r + (long long)rd[0] * t, (const char *)s + (long long)sd[0] * t, (size_t)sc[0] * (size_t)t);
	return MPI_SUCCESS;
}
static inline int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
	(void)b, (void)n, (void)t, (void)c;
	return root == 0 ? MPI_SUCCESS : MPI_ERR_RANK;
}
static inline int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Allreduce(s, r, n, t, op, c);
}
static inline int MPI_Ireduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
					    MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Reduce_scatter_block(s, r, n, t, op, c);
}
static inline int MPI_Iallgather(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c,
				 MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Allgather(s, n, t, r, rn, rt, c);
}
static inline int MPI_Ialltoall(const void *s, int n, MPI_Datatype t, void *r, int rn, MPI_Datatype rt, MPI_Comm c,
				MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Alltoall(s, n, t, r, rn, rt, c);
}
static inline int MPI_Ialltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype t, void *r, const int *rc,
				 const int *rd, MPI_Datatype rt, MPI_Comm c, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Alltoallv(s, sc, sd, t, r, rc, rd, rt, c);
}
static inline int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Bcast(b, n, t, root, c);
}
/* point to point: no partner in a world of one */
static inline int MPI_Send(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c)
{
	(void)b, (void)n, (void)t, (void)peer, (void)tag, (void)c;
	return MPI_ERR_RANK;
}
static inline int MPI_Recv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Status *st)
{
	(void)b, (void)n, (void)t, (void)peer, (void)tag, (void)c, (void)st;
	return MPI_ERR_RANK;
}
static inline int MPI_Isend(const void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Send(b, n, t, peer, tag, c);
}
static inline int MPI_Irecv(void *b, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *q)
{
	*q = MPI_REQUEST_NULL;
	return MPI_Recv(b, n, t, peer, tag, c, MPI_STATUS_IGNORE);
}
static inline int MPI_Wait(MPI_Request *q, MPI_Status *st) { (void)st; *q = MPI_REQUEST_NULL; return MPI_SUCCESS; }
static inline int MPI_Test(MPI_Request *q, int *flag, MPI_Status *st)
{
	(void)st;
	*q = MPI_REQUEST_NULL;
	*flag = 1;
	return MPI_SUCCESS;
}
#endif
