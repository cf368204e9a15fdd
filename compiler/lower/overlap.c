/* overlap.c: communication that runs while the rank computes.
 *
 *   buckets     With `sync strict, overlap`, a gradient bucket reduced in place (state.c's flat
 *               buckets) starts as a nonblocking collective right after the backward kernel that
 *               writes the last of its members, or after the element-wise loops that end that
 *               kernel's layer block (bucket_start_after), in the last micro-batch when it is
 *               reduced once per step, as PyTorch DDP does, and finishes where the blocking call
 *               was. A ZeRO-3 packed bucket does the same within each micro-batch's backward. A
 *               bucket whose members something else still touches first (a tied-parameter sum,
 *               another axis's bucket, a conversion at the step) stays blocking.
 *   prefetch    ZeRO 3: each parameter gather of a forward or backward starts as soon as the
 *               previous gather of that phase has finished, so it travels while the previous
 *               parameter is used; the first starts with the phase.
 * Each start and finish is a kernel with a request handle of the stage program. MPI moves a
 * started operation only inside its calls; the runtime's GEMMs and attention run its progress
 * engine while any is in flight (planrt_comm_progress_, planrt.h), so no kernel here asks for it. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

/* A fresh kernel built with the shared helpers, then taken off the program's list. */
static Kernel detached(LProg *p, KernelKind kind, Phase ph, int chunk, int op, bool last_micro)
{
	(void)kernel_new(p, kind, ph, chunk, op);
	Kernel k = p->k[--p->nk];
	k.only_last_micro = last_micro;
	return k;
}

/* of may point into p->k, which making the new kernel can move: it is copied first */
static Kernel finish_kernel(LProg *p, const Kernel *of, int h)
{
	Kernel collective = *of;
	Kernel f = detached(p, K_REQUEST_FINISH, collective.phase, collective.chunk, collective.op, false);
	f.note = collective.note;
	karg(p, &f, KA_REQ, h);
	for (int i = 0; i < collective.ndefs; i++) /* the collective's results are complete from here on */
		kernel_def(p, &f, collective.defs[i]);
	return f;
}

/* ------------------------------------------------------------------ gradient buckets
 * One walk over the kernels decides every bucket: each buffer lists the buckets it is a member of
 * (a packed bucket's member buffers; every view of an in-place bucket's storage), so a kernel
 * updates only the buckets it touches, and a program of n kernels and b buckets costs n + b, not
 * n * b. A bucket starts early when, among the kernels before it that touch its members, the last
 * one of the backward is followed by nothing but the step's zeroing, and no step kernel comes
 * first. */

typedef struct Candidates {
	int n;
	int *kernel;            /* the bucket collective's kernel index */
	int *by_buf, *buf_list; /* packed members: buffer b's buckets are buf_list[by_buf[b] .. by_buf[b + 1]) */
	int *by_root, *root_list; /* in-place buckets by their storage, alike */
	int *root;              /* each buffer's storage */
	int *last;              /* the last backward kernel touching a member, or -1 */
	bool *dead;             /* a step kernel touched a member first */
	bool *after;            /* a kernel other than step_begin's touched a member after last */
	int *seen;              /* the last kernel that touched it (a kernel counts once) */
} Candidates;

static bool bucket_candidate(const LProg *p, const Kernel *k, bool *inplace)
{
	*inplace = k->kind == K_ALLREDUCE_INPLACE || k->kind == K_REDUCE_SCATTER_INPLACE;
	if ((!*inplace && k->kind != K_BUCKET_RS) || k->bucket < 0)
		return false;
	return k->phase == PH_STEP || k->phase == PH_BACKWARD;
}

/* A CSR table from (key, candidate) pairs: keys[i] belongs to cands[i]; n pairs, nkeys keys. */
static void csr(int nkeys, const int *keys, const int *cands, int n, int **first, int **list)
{
	*first = calloc((size_t)nkeys + 2, sizeof(int));
	*list = malloc(sizeof(int) * (size_t)(n + 1));
	if (!*first || !*list)
		ICE("out of memory");
	for (int i = 0; i < n; i++)
		(*first)[keys[i] + 2]++;
	for (int b = 0; b < nkeys; b++)
		(*first)[b + 2] += (*first)[b + 1];
	for (int i = 0; i < n; i++)
		(*list)[(*first)[keys[i] + 1]++] = cands[i];
}

static void *zalloc(size_t n, size_t size)
{
	void *q = calloc(n ? n : 1, size);
	if (!q)
		ICE("out of memory");
	return q;
}

static void candidates_find(LProg *p, Candidates *C)
{
	memset(C, 0, sizeof *C);
	C->kernel = zalloc((size_t)p->nk, sizeof(int));
	C->root = zalloc((size_t)p->nbuf, sizeof(int));
	for (int b = 0; b < p->nbuf; b++)
		C->root[b] = buffer_root(p, b);
	int npacked = 0, ninplace = 0, cap = 64;
	int *pk = zalloc((size_t)cap, sizeof(int)), *pc = zalloc((size_t)cap, sizeof(int));
	int *rk = zalloc((size_t)p->nk, sizeof(int)), *rc = zalloc((size_t)p->nk, sizeof(int));
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		bool inplace;
		if (!bucket_candidate(p, k, &inplace))
			continue;
		int c = C->n++;
		C->kernel[c] = i;
		if (inplace) {
			rk[ninplace] = k->kind == K_ALLREDUCE_INPLACE ? KARG(k, ALLREDUCE_INPLACE, buf)->buf
							      : KARG(k, REDUCE_SCATTER_INPLACE, buf)->buf;
			rc[ninplace++] = c;
			continue;
		}
		const KArg *bufs = KARG(k, BUCKET_RS, bufs);
		for (int m = 0; m < bufs->n; m++) {
			if (npacked == cap) {
				cap *= 2;
				pk = realloc(pk, sizeof(int) * (size_t)cap);
				pc = realloc(pc, sizeof(int) * (size_t)cap);
				if (!pk || !pc)
					ICE("out of memory");
			}
			pk[npacked] = bufs->bufs[m];
			pc[npacked++] = c;
		}
	}
	csr(p->nbuf, pk, pc, npacked, &C->by_buf, &C->buf_list);
	csr(p->nbuf, rk, rc, ninplace, &C->by_root, &C->root_list);
	free(pk);
	free(pc);
	free(rk);
	free(rc);
	C->last = zalloc((size_t)C->n, sizeof(int));
	C->seen = zalloc((size_t)C->n, sizeof(int));
	C->dead = zalloc((size_t)C->n, sizeof(bool));
	C->after = zalloc((size_t)C->n, sizeof(bool));
	for (int c = 0; c < C->n; c++)
		C->last[c] = C->seen[c] = -1;
}

static void candidates_free(Candidates *C)
{
	free(C->kernel);
	free(C->root);
	free(C->by_buf);
	free(C->buf_list);
	free(C->by_root);
	free(C->root_list);
	free(C->last);
	free(C->seen);
	free(C->dead);
	free(C->after);
}

static void touch_list(const Candidates *C, const int *list, int from, int to, int j, Phase ph)
{
	for (int e = from; e < to; e++) {
		int c = list[e];
		if (C->seen[c] == j || C->kernel[c] <= j)
			continue; /* counted already, or not before the bucket */
		C->seen[c] = j;
		if (C->dead[c])
			continue;
		if (ph == PH_BACKWARD) {
			C->last[c] = j;
			C->after[c] = false;
		} else if (ph == PH_STEP) {
			C->dead[c] = true;
		} else if (ph != PH_STEP_BEGIN) {
			C->after[c] = true; /* zeroing at the step's start is fine; anything else is not */
		}
	}
}

/* Kernel j's reads and writes, on the buckets whose members they are. */
static void touch_buckets(const Candidates *C, const Kernel *k, int j)
{
	for (int side = 0; side < 2; side++) {
		const int *bs = side ? k->defs : k->uses;
		for (int i = 0, n = side ? k->ndefs : k->nuses; i < n; i++) {
			int b = bs[i], r = C->root[b];
			touch_list(C, C->buf_list, C->by_buf[b], C->by_buf[b + 1], j, k->phase);
			touch_list(C, C->root_list, C->by_root[r], C->by_root[r + 1], j, k->phase);
		}
	}
}

/* The bucket collective at kernel i starts after kernel last: its start is inserted there and its
 * finish takes the blocking call's place. */
static void start_bucket(LProg *p, Inserts *ins, int i, int last)
{
	Kernel *k = &p->k[i];
	bool inplace = k->kind != K_BUCKET_RS;
	Kernel start = *k;
	start.phase = PH_BACKWARD;
	start.chunk = p->k[last].chunk;
	start.only_last_micro = k->phase == PH_STEP;
	Kernel fin;
	int h;
	if (inplace) {
		h = handle_new(p, HANDLE_REQUEST, "bucket");
		int req = k->kind == K_ALLREDUCE_INPLACE ? KARG_INDEX(ALLREDUCE_INPLACE, req)
							 : KARG_INDEX(REDUCE_SCATTER_INPLACE, req);
		internal_assert(start.args[req].kind == KA_NULL);
		/* a copy of the argument array: the original kernel keeps its own */
		KArg *args = arena_alloc(p->g->arena, sizeof(KArg) * (size_t)start.nargs);
		memcpy(args, start.args, sizeof(KArg) * (size_t)start.nargs);
		args[req].kind = KA_REQ;
		args[req].i = h;
		start.args = args;
		start.capargs = start.nargs;
		fin = finish_kernel(p, k, h);
	} else {
		/* planrt_bucket_reduce_scatter(n, bufs, counts, t, shards, shard_t, accumulate,
		 * zero_source, comm, scratch) splits into start(b, n, bufs, counts, t,
		 * zero_source, comm, buf) and finish(b, n, counts, shards, shard_t, accumulate,
		 * comm, buf) */
		h = handle_new(p, HANDLE_BUCKET, "bucket");
		Kernel s = detached(p, K_BUCKET_RS_START, PH_BACKWARD, p->k[last].chunk, k->op, false);
		k = &p->k[i];
		const KArg *bufs = KARG(k, BUCKET_RS, bufs), *counts = KARG(k, BUCKET_RS, counts);
		s.note = k->note;
		karg(p, &s, KA_REQ, h);
		karg_int(p, &s, KARG(k, BUCKET_RS, n)->i);
		karg_bufs(p, &s, bufs->bufs, bufs->n, true, false);
		karg_ints(p, &s, counts->ints, counts->n, false);
		karg(p, &s, KA_DTYPE, KARG(k, BUCKET_RS, t)->i);
		karg_int(p, &s, KARG(k, BUCKET_RS, zero_source)->i);
		karg(p, &s, KA_AXIS, KARG(k, BUCKET_RS, c)->i);
		karg_buf(p, &s, KARG(k, BUCKET_RS, scratch)->buf, false, true);
		s.comm = k->comm;
		s.ncomm = k->ncomm;
		Kernel f = detached(p, K_BUCKET_RS_FINISH, k->phase, k->chunk, k->op, false);
		k = &p->k[i];
		const KArg *shards = KARG(k, BUCKET_RS, shards);
		f.note = k->note;
		karg(p, &f, KA_REQ, h);
		karg_int(p, &f, KARG(k, BUCKET_RS, n)->i);
		karg_ints(p, &f, counts->ints, counts->n, false);
		karg_bufs(p, &f, shards->bufs, shards->n, true, true);
		karg(p, &f, KA_DTYPE, KARG(k, BUCKET_RS, shard_t)->i);
		karg_int(p, &f, KARG(k, BUCKET_RS, accumulate)->i);
		karg(p, &f, KA_AXIS, KARG(k, BUCKET_RS, c)->i);
		karg_buf(p, &f, KARG(k, BUCKET_RS, scratch)->buf, true, false);
		start = s;
		fin = f;
	}
	start.bucket = fin.bucket = p->k[i].bucket; /* both halves reduce state.c's bucket */
	inserts_add(ins, start, last + 1);
	p->k[i] = fin; /* the finish takes the blocking call's place */
}

/* Where a bucket whose last member kernel is `last` starts: after the fused element-wise loops
 * that end that kernel's layer block, when nothing but such loops follows it in the block (the
 * residual add after a layer norm's gradient). They take a small part of a layer's time, and
 * starting after them leaves the block the same kernels as every other layer's, so a loop target
 * runs it inside the layers' loop (layer_runs.c). Anything else of the layer after it (a matmul,
 * a collective): right after `last`, as before. */
static int bucket_start_after(const LProg *p, int last, int bucket_kernel)
{
	const Kernel *k = &p->k[last];
	if (k->op < 0)
		return last;
	int layer = p->g->ops[k->op].layer, at = last;
	for (int j = last + 1; j < bucket_kernel; j++) {
		const Kernel *n = &p->k[j];
		if (n->phase != k->phase || n->chunk != k->chunk)
			continue; /* another phase's kernel in between: not run here */
		if (n->op < 0 || p->g->ops[n->op].layer != layer)
			return at; /* the layer's block ends */
		if (n->kind != K_LOOP)
			return last;
		at = j;
	}
	return at;
}

static void overlap_buckets(LProg *p)
{
	if (!p->low->state.overlap)
		return;
	Candidates C;
	candidates_find(p, &C);
	Inserts ins = {0};
	int next = 0, nk = p->nk;
	for (int j = 0; j < nk; j++) {
		if (next < C.n && C.kernel[next] == j) {
			int c = next++;
			if (!C.dead[c] && C.last[c] >= 0 && !C.after[c])
				start_bucket(p, &ins, j, bucket_start_after(p, C.last[c], j));
		}
		touch_buckets(&C, &p->k[j], j);
	}
	inserts_apply(p, &ins);
	candidates_free(&C);
}

/* ------------------------------------------------------------------ ZeRO-3 prefetch */

static void prefetch_gathers(LProg *p)
{
	Inserts ins = {0};
	int nk = p->nk;
	for (int ph = PH_FORWARD; ph <= PH_BACKWARD; ph++) {
		for (int c = 0; c < p->nchunks; c++) {
			int first = -1, prev_finish = -1;
			for (int i = 0; i < nk; i++) {
				Kernel *k = &p->k[i];
				if (k->phase != (Phase)ph || k->chunk != c)
					continue;
				if (first < 0)
					first = i;
				if (k->kind != K_ALLGATHER_FLAT)
					continue;
				/* planrt_allgather_flat(shard, full, n, t, comm, scratch) ->
				 * start(req, shard, full, n, t, comm) ... finish(req) */
				int h = handle_new(p, HANDLE_REQUEST, "gather");
				k = &p->k[i];
				Kernel s = detached(p, K_ALLGATHER_FLAT_START, k->phase, k->chunk, k->op, false);
				k = &p->k[i];
				s.note = k->note;
				karg(p, &s, KA_REQ, h);
				karg_buf(p, &s, KARG(k, ALLGATHER_FLAT, shard)->buf, true, false);
				karg_buf(p, &s, KARG(k, ALLGATHER_FLAT, full)->buf, false, true);
				karg_int(p, &s, KARG(k, ALLGATHER_FLAT, n)->i);
				karg(p, &s, KA_DTYPE, KARG(k, ALLGATHER_FLAT, t)->i);
				karg(p, &s, KA_AXIS, KARG(k, ALLGATHER_FLAT, c)->i);
				s.comm = k->comm;
				s.ncomm = k->ncomm;
				inserts_add(&ins, s, prev_finish < 0 ? first : prev_finish + 1);
				Kernel f = finish_kernel(p, k, h);
				k = &p->k[i]; /* making f can move p->k */
				f.ndefs = 0;
				kernel_def(p, &f, KARG(k, ALLGATHER_FLAT, full)->buf);
				p->k[i] = f;
				prev_finish = i;
			}
		}
	}
	inserts_apply(p, &ins);
}

bool plan_overlap(Lowered *low)
{
	for (int i = 0; i < low->nprogs; i++) {
		overlap_buckets(low->progs[i]);
		prefetch_gathers(low->progs[i]);
	}
	return true;
}
