/* decode.c: the decode lowering of a model for generation (docs/generate.md). Training runs the
 * model over whole windows of S tokens with a loss; generation runs it one token at a time, each
 * new token attending over the keys and values of every earlier one. This pass builds that
 * program's graph, a second graph beside the training one:
 *
 *   - the model is elaborated again with the token input's sequence dim S bound to 1 and the batch
 *     to 1 (one sequence is continued), so every activation is one token's; the parameters keep
 *     their training shapes (the same names, the same --init and checkpoint tensors);
 *   - an input `decode_position` i32[1] carries the token's position t (the runtime sets it); a
 *     parameter with the sequence dim first (a learned position table wpe [S, D]) is read at t
 *     through an embed, and RoPE rotates by angle t (its positions input);
 *   - each fused causal `attention` (attention.c) becomes a `decode_attention` that appends the
 *     token's k and v at row t of its layer's cache ([B, kv_heads, S, Dh], a `kv_cache` source,
 *     persistent across the steps of one generation) and attends over rows 0 .. t: a token costs
 *     O(t), never the O(t^2) of re-running the prefix;
 *   - dropout is the identity (evaluation), the loss and the targets input are dropped, and the
 *     logits of the next token ([1, 1, V]) are the graph's output (g->logits).
 *
 * What cannot decode is refused here with the fix: a model whose attention is not causal (an
 * encoder), whose loss is not the next-token cross_entropy of the logits, with a mixture of
 * experts, with inputs other than its tokens, or attention left unfused. The back end lowers
 * this graph as it lowers the training graph (planc build --generate: decode.c beside prog.c);
 * every value is replicated, so a tensor-parallel plan's ranks each run the whole decode step
 * (docs/generate.md). */
#include "graph/graph.h"

#include <stdlib.h>
#include <string.h>

typedef struct Decode {
	Graph *g;          /* the decode graph being rewritten */
	const char *seq;   /* the name of the token input's sequence dim */
	long long context; /* its size in training: the cache's rows */
	int position;      /* decode_position */
	int targets;       /* the loss's targets input (dropped with the loss), or -1 */
	int *subst;        /* value -> the value that replaces it (itself by default) */
	OpList out;
	bool failed;
} Decode;

static void refuse(Decode *d, const Op *at, const char *fix, const char *fmt, const char *what)
{
	const PlanSpec *ps = d->g->ps;
	const Source *src = at && at->src ? at->src : &ps->model->module->src;
	diag_error(src, at ? at->loc : ps->model->name_loc, fmt, what);
	diag_note_plain("%s", fix);
	d->failed = true;
}

/* The token input: the ids of the first embed whose ids are an i32 [B, S] model input. */
static int token_input(const Graph *g)
{
	for (int o = 0; o < g->nops; o++) {
		const Op *op = &g->ops[o];
		if (op->kind != OP_EMBED || op->backward)
			continue;
		const Value *ids = &g->vals[op->in[1]];
		if (ids->def >= 0 && g->ops[ids->def].kind == OP_INPUT && ids->rank == 2 && ids->dim_name[1])
			return op->in[1];
	}
	return -1;
}

/* The plan's spec with the sequence hyperparameter bound to 1 and a batch of one sequence. */
static PlanSpec *decode_spec(const PlanSpec *ps, const char *seq)
{
	Arena *a = ps->prog->arena;
	PlanSpec *d = arena_alloc(a, sizeof *d);
	*d = *ps;
	d->hypers = arena_alloc(a, sizeof *d->hypers * (size_t)(ps->nhypers ? ps->nhypers : 1));
	memcpy(d->hypers, ps->hypers, sizeof *d->hypers * (size_t)ps->nhypers);
	for (int i = 0; i < d->nhypers; i++)
		if (!strcmp(d->hypers[i].name, seq)) {
			d->hypers[i].ival = 1;
			d->hypers[i].value = 1;
		}
	d->batch = 1;
	d->micro_batches = 1;
	/* the decode program trains nothing and splits nothing yet: one stage, every value replicated */
	d->pipe_axis = -1;
	d->stages = 1;
	d->chunks = 1;
	d->zero_stage = 0;
	d->zero_axis = -1;
	d->offload_optimizer = d->offload_params = d->offload_activations = PLACE_NONE;
	d->recompute = RECOMPUTE_NONE;
	d->sync = SYNC_STRICT;
	d->compress = ps->compress;
	return d;
}

static int sub(const Decode *d, int v)
{
	return v >= 0 ? d->subst[v] : v;
}

static Op *emit_like(Decode *d, const Op *from, OpKind kind, int nin, const int *in, int nout, const int *out)
{
	Op *op = oplist_add(d->g, &d->out, NULL);
	op_inherit(op, from);
	op->orig = from->orig;
	op->kind = kind;
	op->nin = nin;
	op->nout = nout;
	memcpy(op->in, in, sizeof(int) * (size_t)nin);
	memcpy(op->out, out, sizeof(int) * (size_t)nout);
	return op;
}

/* A parameter whose first dim is the sequence (elaborated as 1): its training shape back, and its
 * uses read row t through an embed. */
static void position_table(Decode *d, const Op *op)
{
	Graph *g = d->g;
	int p = op->out[0];
	oplist_add(g, &d->out, op);
	Value *v = &g->vals[p];
	bool seq_dim = false;
	for (int i = 0; i < v->rank; i++)
		seq_dim |= v->dim_name[i] && !strcmp(v->dim_name[i], d->seq);
	if (!seq_dim)
		return;
	if (v->rank != 2 || !v->dim_name[0] || strcmp(v->dim_name[0], d->seq)) {
		refuse(d, op, "a parameter over positions must be a table [S, D] the model adds to its embeddings",
		       "parameter '%s' has the sequence dim where generation cannot read one position of it", v->name);
		return;
	}
	v->dim[0] = d->context;
	long long dim[2] = {1, v->dim[1]};
	const char *names[2] = {d->seq, v->dim_name[1]};
	int row = graph_add_value(g, g->vals[p].dtype, 2, dim, names);
	g->vals[row].layer = -1;
	emit_like(d, op, OP_EMBED, 2, (int[]){p, d->position}, 1, &row);
	d->subst[p] = row;
}

/* A fused causal attention (q, k, v) -> decode_attention (q, k, v, position, kcache, vcache). */
static void decode_attention(Decode *d, const Op *op)
{
	Graph *g = d->g;
	if (op->n != ATTN_CAUSAL || op->nin != 3) {
		refuse(d, op, "generation continues a decoder: a model with causal attention (causal_mask, "
			      "nn.block, nn.llama_block)",
		       "this model's attention is not causal (%s): an encoder cannot generate",
		       op->n == ATTN_NO_MASK ? "no mask" : "an additive mask");
		return;
	}
	Value k = g->vals[sub(d, op->in[1])];
	long long dim[MAX_DIMS];
	const char *names[MAX_DIMS];
	for (int i = 0; i < k.rank; i++) {
		dim[i] = k.dim[i];
		names[i] = k.dim_name[i];
	}
	dim[k.rank - 2] = d->context;
	names[k.rank - 2] = d->seq;
	int cache[2];
	for (int c = 0; c < 2; c++) {
		cache[c] = graph_add_value(g, k.dtype, k.rank, dim, names);
		g->vals[cache[c]].role = ROLE_STAT;
		g->vals[cache[c]].layer = op->layer;
		g->vals[cache[c]].name = arena_printf(g->arena, "kv_cache.%d.%s", op->layer, c ? "v" : "k");
		emit_like(d, op, OP_KV_CACHE, 0, NULL, 1, &cache[c]);
	}
	int in[6] = {sub(d, op->in[0]), sub(d, op->in[1]), sub(d, op->in[2]), d->position, cache[0], cache[1]};
	Op *da = emit_like(d, op, OP_DECODE_ATTENTION, 6, in, 1, op->out);
	da->f = op->f;
	da->n = d->context;
}

/* The loss (decode_graph checked it is a cross_entropy): its logits become the output. */
static void drop_loss(Decode *d, const Op *op, int loss)
{
	Graph *g = d->g;
	if (op->out[0] != loss) {
		refuse(d, op, "generation samples from next-token logits: one loss = cross_entropy(logits, targets)",
		       "a second %s besides the loss", "cross_entropy");
		return;
	}
	g->logits = sub(d, op->in[0]);
	const Value *t = &g->vals[op->in[1]];
	if (t->def < 0 || g->ops[t->def].kind != OP_INPUT)
		refuse(d, op, "the targets of the loss must be a model input (the next tokens)",
		       "the targets of '%s' are computed, not an input", "cross_entropy");
}

/* One op of the elaborated graph into the decode graph. */
static void rewrite(Decode *d, const Op *op, int tokens, const int *uses)
{
	Graph *g = d->g;
	switch (op->kind) {
	case OP_INPUT:
		if (op->out[0] == tokens)
			oplist_add(g, &d->out, op);
		else if (uses[op->out[0]] > 0 && op->out[0] != d->targets)
			refuse(d, op, "generation feeds the token input alone: a model with inputs tokens and targets",
			       "model input '%s' has no value when generating", g->vals[op->out[0]].name);
		return;
	case OP_PARAM:
		position_table(d, op);
		return;
	case OP_DROPOUT:
		d->subst[op->out[0]] = sub(d, op->in[0]);
		return;
	case OP_ATTENTION:
		decode_attention(d, op);
		return;
	case OP_CROSS_ENTROPY:
		drop_loss(d, op, g->loss);
		return;
	case OP_CAUSAL_MASK:
	case OP_SOFTMAX:
		refuse(d, op, "remove `attention unfused` from the plan: generation's cache is the fused attention's",
		       "attention written out (%s) cannot read a key/value cache", op_names[op->kind]);
		return;
	default:
		break;
	}
	Op *c = oplist_add(g, &d->out, op);
	for (int i = 0; i < c->nin; i++)
		c->in[i] = sub(d, c->in[i]);
	if (c->kind == OP_ROPE && c->nin == 1) {
		c->in[c->nin++] = d->position;
	} else if (c->kind == OP_ROPE) {
		refuse(d, op, "generation numbers the positions itself: use rope(x) without pos",
		       "rope's positions come from %s", "a model input");
	}
}

/* The decode graph of the plan's model (NULL after reporting why it cannot generate). */
Graph *decode_graph(PlanSpec *ps, const Graph *train)
{
	int tokens_train = token_input(train);
	if (tokens_train < 0 || train->loss < 0) {
		diag_error(&ps->model->module->src, ps->model->name_loc,
			   "model '%s' has no token input to continue: generation needs an embed of i32 [B, S] tokens",
			   ps->model->name);
		return NULL;
	}
	if (train->has_moe) {
		diag_error(&ps->model->module->src, ps->model->name_loc,
			   "model '%s' has a mixture of experts, which generation does not route yet", ps->model->name);
		diag_note_plain("generate with a dense model (nn.block, nn.llama_block); docs/generate.md lists what decodes");
		return NULL;
	}
	Decode d = {0};
	d.seq = train->vals[tokens_train].dim_name[1];
	d.context = train->vals[tokens_train].dim[1];
	Graph *g = graph_build(decode_spec(ps, d.seq));
	if (!g || !fuse_attention(g))
		return NULL;
	d.g = g;
	int tokens = token_input(g);
	int ld = g->loss >= 0 ? g->vals[g->loss].def : -1;
	if (ld < 0 || g->ops[ld].kind != OP_CROSS_ENTROPY) {
		refuse(&d, ld >= 0 ? &g->ops[ld] : NULL, "generation samples from next-token logits: loss = "
			   "cross_entropy(logits, targets)", "this model's loss is not the cross_entropy of %s",
		       "next-token logits");
		return NULL;
	}
	d.targets = g->ops[ld].in[1];
	long long one = 1;
	const char *seq_name = d.seq;
	d.position = graph_add_value(g, DT_I32, 1, &one, &seq_name);
	g->vals[d.position].role = ROLE_INPUT;
	g->vals[d.position].name = "decode_position";
	int nvals = g->nvals;
	d.subst = malloc(sizeof(int) * (size_t)(nvals + 1));
	int *uses = calloc((size_t)nvals + 1, sizeof(int));
	if (!d.subst || !uses)
		ICE("out of memory");
	for (int v = 0; v < nvals; v++)
		d.subst[v] = v;
	for (int o = 0; o < g->nops; o++)
		for (int i = 0; i < g->ops[o].nin; i++)
			if (g->ops[o].in[i] >= 0)
				uses[g->ops[o].in[i]]++;
	Op position;
	op_clear(&position);
	position.kind = OP_INPUT;
	position.nout = 1;
	position.out[0] = d.position;
	position.src = &ps->model->module->src;
	position.loc = ps->model->name_loc;
	oplist_add(g, &d.out, &position);
	g->logits = -1;
	int nops = g->nops;
	for (int o = 0; o < nops && !d.failed; o++)
		rewrite(&d, &g->ops[o], tokens, uses);
	free(d.subst);
	free(uses);
	if (d.failed)
		return NULL;
	graph_set_ops(g, &d.out);
	g->loss = -1;
	g->context = d.context;
	g->position = d.position;
	g->decode = true;
	/* the decode program splits nothing yet: every value whole on every rank, one stage, all forward */
	for (int v = 0; v < g->nvals; v++)
		for (int a = 0; a < MAX_AXES; a++)
			g->vals[v].lay.on[a] = LAYOUT_R;
	if (!pipeline(g))
		return NULL;
	g->nfwd = g->nops;
	return g;
}
