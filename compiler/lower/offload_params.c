/* offload_params.c: `offload params -> host` under ZeRO 3 (ZeRO-Infinity's parameter offload), the
 * pass after overlap.c.
 *
 * state.c places every parameter chunk (the rank's ZeRO-3 part of each parameter) in pinned host
 * memory. What makes a parameter whole for the forward and the backward is a gather of its
 * chunks (zero.c), which overlap.c's prefetch starts while the previous parameter is in use. A
 * collective reads device memory, so each gather here reads a device copy instead: a copy of the
 * chunk into a transient device buffer goes right before the gather (its start, when prefetched:
 * the copy is prefetched with it), and the buffer lives until the gather's finish. The CUDA
 * target runs the copy on the copy stream (streams.c); the update reads and writes the chunks on
 * the host (state.c's optimizer offload) or, without it, through mapped memory. The CPU target
 * refuses `-> host` (emit_c.c): it has no device memory to free. */
#include "lower/lower.h"

#include <stdlib.h>

static bool host_param(const LProg *p, int b)
{
	const Buffer *x = &p->buf[buffer_root(p, b)];
	return x->cls == BUF_STATE && x->state == SC_PARAM && x->place == PLACE_HOST;
}

/* finish[h]: the kernel that finishes request handle h (overlap.c gives each start its own) */
static int *finishes(const LProg *p)
{
	int *finish = malloc(sizeof(int) * (size_t)(p->nhandles + 1));
	if (!finish)
		ICE("out of memory");
	for (int h = 0; h < p->nhandles; h++)
		finish[h] = -1;
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		const KArg *req = k->kind == K_REQUEST_FINISH ? KARG(k, REQUEST_FINISH, req) : NULL;
		if (req && req->kind == KA_REQ && req->i >= 0 && req->i < p->nhandles)
			finish[req->i] = i;
	}
	return finish;
}

/* the shard a ZeRO-3 gather (or its start) reads, or NULL for another kernel */
static KArg *gather_shard(const Kernel *k)
{
	if (k->kind == K_ALLGATHER_FLAT)
		return KARG(k, ALLGATHER_FLAT, shard);
	return k->kind == K_ALLGATHER_FLAT_START ? KARG(k, ALLGATHER_FLAT_START, shard) : NULL;
}

static void offload_params_prog(LProg *p)
{
	Inserts ins = {0};
	int nk = p->nk;
	int *finish = finishes(p);
	for (int i = 0; i < nk; i++) {
		Kernel *k = &p->k[i];
		const KArg *shard = gather_shard(k);
		if (!shard || shard->kind != KA_BUF || !host_param(p, shard->buf))
			continue;
		int chunk = shard->buf;
		const Buffer *c = &p->buf[chunk];
		int dev = buffer_new(p, BUF_ARENA, c->dtype, c->elems, "param_chunk_device",
				     arena_printf(p->g->arena, "a device copy of %s", c->what ? c->what : c->name));
		Kernel *copy = kernel_copy(p, k->phase, k->chunk, k->op, dev, chunk, c->elems,
					   "a parameter chunk from the host, for its gather");
		k = &p->k[i];
		copy->only_last_micro = k->only_last_micro;
		inserts_add(&ins, p->k[--p->nk], i);
		k = &p->k[i];
		gather_shard(k)->buf = dev;
		for (int u = 0; u < k->nuses; u++)
			if (k->uses[u] == chunk)
				k->uses[u] = dev;
		if (k->kind == K_ALLGATHER_FLAT_START) { /* the collective reads it until it finishes */
			const KArg *req = KARG(k, ALLGATHER_FLAT_START, req);
			int h = req->kind == KA_REQ ? (int)req->i : -1;
			if (h < 0 || h >= p->nhandles || finish[h] < 0)
				ICE("a parameter gather's start has no finish");
			kernel_use(p, &p->k[finish[h]], dev);
		}
	}
	free(finish);
	inserts_apply(p, &ins);
}

bool plan_offload_params(Lowered *low)
{
	if (low->state.offload_params != PLACE_HOST)
		return true;
	for (int i = 0; i < low->nprogs; i++)
		offload_params_prog(low->progs[i]);
	return true;
}
