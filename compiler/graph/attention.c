/* attention.c: the fused-attention pass. Attention as a model writes it (the stdlib's
 * core_attention, masked_core_attention, full_attention and rope_attention, or the same ops written
 * by a user) is
 *
 *     probs = dropout(softmax(MASK(q @ k.T * scale)), p)      MASK: causal_mask, + mask, or none
 *     out   = probs @ v                                       k, v maybe repeat_kv'd (GQA)
 *
 * five to seven kernels, each with an [.., H, Sq, Sk] result in memory (Korthikanti's 5as/h term).
 * This pass, run on the elaborated graph before anything else, rewrites each such chain into one
 * OP_ATTENTION (q, k, v[, mask]) -> (out, lse): an online softmax over key tiles keeps only the
 * output and each row's logsumexp (FlashAttention), and its gradient (autodiff.c) recomputes the
 * scores tile by tile. GQA's repeat_kv is folded in: the op reads the kv_heads heads of k and v and
 * gives each group of H / kv_heads query heads its head. The dropout keeps its op's RNG key (the
 * fused op's orig), so the fused kernel draws the mask the unfused dropout would.
 *
 * A chain is fused only when every intermediate value has no other use, q, k and v have the same
 * leading dims and head dim, and an additive mask is data (an input: it gets no gradient; f32, or
 * bf16 / f16 under mixed precision, whose 0 / -inf padding and document masks are exact there and
 * which lowering casts into the f32 copy the kernel reads, like q, k and v). Anything else stays as
 * written. `attention unfused` in a plan keeps every chain unfused (for comparison). */
#include "graph/graph.h"

#include <stdlib.h>

typedef struct Chain {
	int remove[8]; /* the ops the fused op replaces */
	int nremove;
	int q, k, v, mask;
	AttnMask kind;
	double scale, p;
	int key; /* the dropout's RNG key (its orig), else the final matmul's */
} Chain;

static int def_of(const Graph *g, int v, OpKind kind)
{
	int d = v >= 0 ? g->vals[v].def : -1;
	return d >= 0 && g->ops[d].kind == kind ? d : -1;
}

/* A mask tensor the fused op may read as data: a model input, seen through no op. */
static bool mask_is_data(const Graph *g, int m)
{
	int d = g->vals[m].def;
	DType t = g->vals[m].dtype;
	return d >= 0 && g->ops[d].kind == OP_INPUT && (t == DT_F32 || t == DT_BF16 || t == DT_F16);
}

/* k and v repeated for GQA by repeat_kv on their heads dim with the same factor: their inputs */
static void fold_repeat_kv(const Graph *g, const int *uses, Chain *c)
{
	int rk = def_of(g, c->k, OP_REPEAT_KV), rv = def_of(g, c->v, OP_REPEAT_KV);
	int r = g->vals[c->k].rank;
	if (rk < 0 || rv < 0 || g->ops[rk].n != g->ops[rv].n || g->ops[rk].dim != r - 3 || g->ops[rv].dim != r - 3)
		return;
	if (uses[c->k] == 1)
		c->remove[c->nremove++] = rk;
	if (uses[c->v] == 1)
		c->remove[c->nremove++] = rv;
	c->k = g->ops[rk].in[0];
	c->v = g->ops[rv].in[0];
}

/* q, k, v [.., H, S, Dh] with k and v of kv heads dividing H, equal leading dims and head dims */
static bool shapes_fit(const Graph *g, const Chain *c)
{
	const Value *q = &g->vals[c->q], *k = &g->vals[c->k], *v = &g->vals[c->v];
	int r = q->rank;
	if (r < 3 || k->rank != r || v->rank != r || q->dtype != k->dtype || q->dtype != v->dtype)
		return false;
	for (int d = 0; d < r - 3; d++)
		if (k->dim[d] != q->dim[d] || v->dim[d] != q->dim[d])
			return false;
	long long h = q->dim[r - 3], hk = k->dim[r - 3];
	if (hk <= 0 || h % hk || v->dim[r - 3] != hk || k->dim[r - 2] != v->dim[r - 2])
		return false;
	if (k->dim[r - 1] != q->dim[r - 1] || v->dim[r - 1] != q->dim[r - 1])
		return false;
	return c->kind != ATTN_CAUSAL || q->dim[r - 2] == k->dim[r - 2];
}

/* The scores' chain above the softmax's input x: mask, scale, q @ k.T. */
static bool match_scores(const Graph *g, const int *uses, int x, Chain *c)
{
	int d = def_of(g, x, OP_CAUSAL_MASK);
	int y = x;
	if (d >= 0 && g->ops[d].n == 0) {
		c->kind = ATTN_CAUSAL;
		y = g->ops[d].in[0];
		c->remove[c->nremove++] = d;
	} else if ((d = def_of(g, x, OP_ADD)) >= 0) {
		const Op *add = &g->ops[d];
		int side = mask_is_data(g, add->in[1]) ? 0 : mask_is_data(g, add->in[0]) ? 1 : -1;
		if (side < 0 || g->vals[add->in[side]].rank != g->vals[x].rank)
			return false;
		c->kind = ATTN_ADDITIVE;
		c->mask = add->in[1 - side];
		y = add->in[side];
		c->remove[c->nremove++] = d;
	}
	if (y != x && uses[y] != 1)
		return false;
	int z = y;
	c->scale = 1;
	if ((d = def_of(g, y, OP_SCALE)) >= 0) {
		c->scale = g->ops[d].f;
		z = g->ops[d].in[0];
		c->remove[c->nremove++] = d;
		if (uses[z] != 1)
			return false;
	}
	int mm = def_of(g, z, OP_MATMUL);
	if (mm < 0 || matmul_broadcasts(g, &g->ops[mm]))
		return false;
	int kt = g->ops[mm].in[1], t = def_of(g, kt, OP_TRANSPOSE);
	if (t < 0 || uses[kt] != 1)
		return false;
	c->remove[c->nremove++] = mm;
	c->remove[c->nremove++] = t;
	c->q = g->ops[mm].in[0];
	c->k = g->ops[t].in[0];
	return true;
}

/* The chain ending in the matmul pv (probs @ v), or false. */
static bool match_chain(const Graph *g, const int *uses, const Op *pv, Chain *c)
{
	*c = (Chain){.mask = -1, .kind = ATTN_NO_MASK, .key = pv->orig};
	if (pv->kind != OP_MATMUL || matmul_broadcasts(g, pv))
		return false;
	int probs = pv->in[0];
	int d = def_of(g, probs, OP_DROPOUT);
	if (d >= 0) {
		if (uses[probs] != 1)
			return false;
		c->p = g->ops[d].f;
		c->key = g->ops[d].orig;
		c->remove[c->nremove++] = d;
		probs = g->ops[d].in[0];
	}
	int sm = def_of(g, probs, OP_SOFTMAX);
	if (sm < 0 || uses[probs] != 1 || uses[g->ops[sm].in[0]] != 1)
		return false;
	c->remove[c->nremove++] = sm;
	if (!match_scores(g, uses, g->ops[sm].in[0], c))
		return false;
	c->v = pv->in[1];
	fold_repeat_kv(g, uses, c);
	if (c->mask >= 0 && g->vals[c->mask].rank != g->vals[c->q].rank)
		return false;
	return shapes_fit(g, c);
}

/* OP_ATTENTION in place of the chain's last matmul: its output is the matmul's, plus lse. */
static void fused_op(Graph *g, const Op *pv, const Chain *c, Op *op)
{
	Value q = g->vals[c->q]; /* a copy: adding a value may move the array */
	int lse = graph_add_value(g, DT_F32, q.rank - 1, q.dim, (const char *const *)q.dim_name);
	g->vals[lse].role = ROLE_STAT;
	g->vals[lse].layer = g->vals[pv->out[0]].layer;
	*op = *pv;
	op->kind = OP_ATTENTION;
	op->nin = c->mask >= 0 ? 4 : 3;
	op->in[0] = c->q;
	op->in[1] = c->k;
	op->in[2] = c->v;
	op->in[3] = c->mask;
	op->nout = 2;
	op->out[1] = lse;
	op->f = c->scale;
	op->n = c->kind;
	op->dropout_p = c->p;
	op->orig = c->key;
	/* what is left to save is O(S) per head: recomputing the fused op in the backward would run
	 * the whole forward again to save less than its inputs (docs/explain.md) */
	op->in_recompute_fn = false;
}

bool fuse_attention(Graph *g)
{
	if (g->ps->attention_unfused)
		return true;
	int *uses = calloc((size_t)g->nvals + 1, sizeof(int));
	bool *gone = calloc((size_t)g->nops + 1, sizeof(bool));
	int *fused_at = malloc(sizeof(int) * ((size_t)g->nops + 1));
	Chain *chains = malloc(sizeof(Chain) * ((size_t)g->nops + 1));
	if (!uses || !gone || !fused_at || !chains)
		ICE("out of memory");
	for (int o = 0; o < g->nops; o++) {
		fused_at[o] = -1;
		for (int i = 0; i < g->ops[o].nin; i++)
			if (g->ops[o].in[i] >= 0)
				uses[g->ops[o].in[i]]++;
	}
	int nchains = 0;
	for (int o = 0; o < g->nops; o++) {
		Chain *c = &chains[nchains];
		if (g->ops[o].kind != OP_MATMUL || !match_chain(g, uses, &g->ops[o], c))
			continue;
		for (int i = 0; i < c->nremove; i++)
			gone[c->remove[i]] = true;
		fused_at[o] = nchains++;
	}
	if (nchains) {
		OpList l = {0};
		for (int o = 0; o < g->nops; o++) {
			const Op *op = &g->ops[o];
			if (gone[o]) {
				for (int i = 0; i < op->nout; i++)
					g->vals[op->out[i]].def = -1;
				continue;
			}
			if (fused_at[o] < 0) {
				oplist_add(g, &l, op);
				continue;
			}
			Op fused;
			fused_op(g, op, &chains[fused_at[o]], &fused);
			oplist_add(g, &l, &fused);
		}
		graph_set_ops(g, &l);
	}
	free(uses);
	free(gone);
	free(fused_at);
	free(chains);
	return true;
}
