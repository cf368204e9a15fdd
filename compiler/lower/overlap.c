/* overlap.c: communication that runs while the rank computes.
 *
 *   buckets     With `sync strict, overlap`, a gradient bucket reduced in place (state.c's flat
 *               buckets) starts as a nonblocking collective right after the backward kernel that
 *               writes the last of its members (in the last micro-batch when it is reduced once
 *               per step, as PyTorch DDP does), and finishes where the blocking call was. A ZeRO-3
 *               packed bucket does the same within each micro-batch's backward. A bucket whose
 *               members something else still touches first (a tied-parameter sum, another axis's
 *               bucket, a conversion at the step) stays blocking.
 *   prefetch    ZeRO 3: each parameter gather of a forward or backward starts as soon as the
 *               previous gather of that phase has finished, so it travels while the previous
 *               parameter is used; the first starts with the phase.
 *   progress    After every matmul that runs while a request is in flight, a progress call lets
 *               MPI move it (MPI makes progress only inside its calls).
 * Each start, finish and progress is a kernel with a request handle of the stage program. */
#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

static bool touches(const Kernel *k, const bool *member)
{
	for (int i = 0; i < k->nuses; i++)
		if (member[k->uses[i]])
			return true;
	for (int i = 0; i < k->ndefs; i++)
		if (member[k->defs[i]])
			return true;
	return false;
}

/* A fresh kernel built with the shared helpers, then taken off the program's list. */
static Kernel detached(LProg *p, KernelKind kind, Phase ph, int chunk, int op, bool last_micro)
{
	(void)kernel_new(p, kind, ph, chunk, op);
	Kernel k = p->k[--p->nk];
	k.only_last_micro = last_micro;
	return k;
}

static Kernel finish_kernel(LProg *p, const Kernel *of, int h)
{
	Kernel f = detached(p, K_REQUEST_FINISH, of->phase, of->chunk, of->op, false);
	f.note = of->note;
	karg(p, &f, KA_REQ, h);
	for (int i = 0; i < of->ndefs; i++) /* the collective's results are complete from here on */
		kernel_def(p, &f, of->defs[i]);
	return f;
}

/* ------------------------------------------------------------------ gradient buckets */

static void overlap_buckets(LProg *p)
{
	if (!p->low->state.overlap)
		return;
	Inserts ins = {0};
	bool *member = calloc((size_t)p->nbuf, sizeof(bool));
	if (!member)
		ICE("out of memory");
	int nk = p->nk;
	for (int i = 0; i < nk; i++) {
		Kernel *k = &p->k[i];
		bool inplace = k->kind == K_ALLREDUCE_INPLACE || k->kind == K_REDUCE_SCATTER_INPLACE;
		bool packed = k->kind == K_BUCKET_RS;
		if ((!inplace && !packed) || k->bucket < 0)
			continue;
		if (k->phase != PH_STEP && k->phase != PH_BACKWARD)
			continue;
		/* the bucket's storage and member views */
		memset(member, 0, sizeof(bool) * (size_t)p->nbuf);
		if (inplace) {
			int root = k->kind == K_ALLREDUCE_INPLACE ? KARG(k, ALLREDUCE_INPLACE, buf)->buf
								  : KARG(k, REDUCE_SCATTER_INPLACE, buf)->buf;
			for (int b = 0; b < p->nbuf; b++)
				if (buffer_root(p, b) == root)
					member[b] = true;
		} else {
			const KArg *bufs = KARG(k, BUCKET_RS, bufs);
			for (int m = 0; m < bufs->n; m++)
				member[bufs->bufs[m]] = true;
		}
		int last = -1;
		bool early = true;
		for (int j = 0; j < i && early; j++) {
			const Kernel *kj = &p->k[j];
			if (!touches(kj, member))
				continue;
			if (kj->phase == PH_BACKWARD)
				last = j;
			else if (kj->phase == PH_STEP || kj->phase == PH_STEP_BEGIN)
				early = kj->phase == PH_STEP_BEGIN; /* zeroing at the step's start is fine */
		}
		/* nothing else may touch the members between the start and the finish */
		for (int j = last + 1; j < i && early && last >= 0; j++)
			if (touches(&p->k[j], member) && p->k[j].phase != PH_STEP_BEGIN)
				early = false;
		if (last < 0 || !early)
			continue;
		bool per_step = k->phase == PH_STEP;
		Kernel start = *k;
		start.phase = PH_BACKWARD;
		start.chunk = p->k[last].chunk;
		start.only_last_micro = per_step;
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
		start.bucket = fin.bucket = k->bucket; /* both halves reduce state.c's bucket */
		inserts_add(&ins, start, last + 1);
		/* progress calls after the matmuls of the same phase and chunk that follow the start */
		for (int j = last + 1; j < nk; j++) {
			const Kernel *kj = &p->k[j];
			if (kj->kind != K_MATMUL || kj->phase != PH_BACKWARD || kj->chunk != start.chunk)
				continue;
			if (!per_step && j >= i)
				break;
			Kernel pr = detached(p, start.kind == K_BUCKET_RS_START ? K_BUCKET_PROGRESS : K_REQUEST_PROGRESS,
					     PH_BACKWARD, kj->chunk, k->op, per_step);
			pr.note = "let the bucket move";
			karg(p, &pr, KA_REQ, h);
			inserts_add(&ins, pr, j + 1);
		}
		p->k[i] = fin; /* the finish takes the blocking call's place */
	}
	inserts_apply(p, &ins);
	free(member);
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
