/* explain.c: what a plan costs, read off the compiled program (never from closed-form formulas).
 *
 * For every distinct rank role (pipeline stage x async role) it reports:
 *   parameters, gradients, optimizer states  for a plan planc build runs: the persistent buffers
 *                   the program allocates, by kind (state.c): exactly what runs. For a plan it
 *                   cannot run yet: the PARAM values, their gradients and the optimizer's state at
 *                   their local sizes after tensor sharding and ZeRO, from the graph;
 *   activations     runnable: the activation slots (memplan.c), one per micro-batch the schedule
 *                   keeps in flight; otherwise the forward values a backward op reads, per
 *                   micro-batch, times the micro-batches in flight. The per-layer figures are
 *                   always the graph's (what the backward reads), for comparison with papers;
 *   working memory  runnable: the rest of the arena; otherwise the largest set of other values
 *                   alive at once in one micro-batch's forward and backward;
 *   communication   every communication kernel of the program with its calls per step, buffer
 *                   bytes and the bytes a rank puts on the wire (ring algorithms), rounded per
 *                   call exactly as planrt counts them;
 *   FLOPs           2 M N K for every matmul (recomputed ones included), and fused attention's
 *                   (attention_flops), per step;
 *   bubble          the schedule table simulated with each stage's FLOPs as its time.
 * docs/explain.md says which published formula each figure agrees with. */
#include "explain/explain.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct CommRow {
	OpKind kind;
	int axis;       /* mesh axis */
	bool pair;      /* tied-parameter group of two stages */
	bool bound;     /* bytes are a bound (an all_to_all_v, whose sizes depend on the data) */
	const char *phase; /* forward, backward, step, recompute */
	double calls;
	/* bytes and wire bytes per step, exactly: num / den (den > 1 when a collective runs every K
	 * steps); 128 bits: micro-batches times calls times B < 2^60 can pass 2^63 */
	__int128 bytes, wire;
	long long den;
} CommRow;

/* Byte counts are exact integers (long long: graph.c keeps every tensor and their sums below 2^60
 * bytes), never doubles, which lose the last bits above 2^53 (explain --json prints them). */
typedef struct Role {
	int stage, role;
	int nranks, first_rank;
	long long params, grads, optim, act, act_micro, work, peak;
	long long host, disk;
	int inflight;
	long long *act_layer; /* per layer (global layer index), this stage's layers */
	double flops;         /* per step, this rank */
	long long prog_arena, prog_state; /* the executable program's memory (0 if not executable yet) */
	long long prog_metric;            /* its metric scalars and named runtime buffers */
	const LProg *lp;               /* this role's program */
	CommRow *comm;
	int ncomm, capcomm;
} Role;

typedef struct Report {
	Graph *g;
	PlanSpec *ps;
	const Lowered *low;
	bool runnable;     /* planc build runs it: memory comes from the program */
	Role *roles;
	int nroles;
	double model_flops;
	long long params_total; /* exact: graph.c keeps every tensor and their sum below 2^60 bytes */
	long long params_frozen, params_buffers; /* of which `freeze` and `buffer`: no gradients, no optimizer state */
	double bubble;
	/* the estimated step time on the reference device (seconds) */
	double est_pipeline, est_update, est_step;
} Report;

static long long bytes_of(const Graph *g, int v)
{
	return value_local_elems(g, v) * dtype_bytes(g->vals[v].dtype);
}

/* Elements of v's local block: its dims split by the mesh axes that split them (a ZeRO-flat
 * gradient is still computed whole, so flat layouts do not count). */
static double block_elems(const Graph *g, int v)
{
	const Value *val = &g->vals[v];
	double n = 1;
	for (int d = 0; d < val->rank; d++) {
		double k = (double)val->dim[d];
		for (int a = 0; a < g->ps->naxes; a++)
			if (val->lay.on[a] == d)
				k /= g->ps->axes[a].size;
		n *= k;
	}
	return n;
}

/* Fused attention's products (graph/attention.c): q k^T and P v forward, 2 Sq Sk Dh each per head;
 * the gradient's dV, dP, dQ and dK, and (not in the model's count) the scores recomputed. */
static double attention_flops(const Graph *g, const Op *op, bool local, bool model)
{
	int q = op->in[0], k = op->in[1], r = g->vals[q].rank;
	double sk = (double)g->vals[k].dim[r - 2];
	if (local) /* a ring (context parallelism) brings every key block to each rank in turn */
		for (int ax = 0; ax < g->ps->naxes; ax++)
			if (g->vals[k].lay.on[ax] == r - 2 && ax != g->ps->ring_axis)
				sk /= g->ps->axes[ax].size;
	double qe = local ? block_elems(g, q) : (double)value_elems(g, q);
	return 2.0 * qe * sk * (op->kind == OP_ATTENTION ? 2 : model ? 4 : 5);
}

static double matmul_flops(const Graph *g, const Op *op, bool local)
{
	if (op_classes[op->kind] == OPK_ATTENTION)
		return attention_flops(g, op, local, !local);
	if (op->kind != OP_MATMUL && op->kind != OP_MATMUL_WGRAD)
		return 0;
	const Value *a = &g->vals[op->in[0]];
	double out = local ? block_elems(g, op->out[0]) : (double)value_elems(g, op->out[0]);
	double k;
	if (op->kind == OP_MATMUL) {
		k = (double)a->dim[a->rank - 1];
		if (local && a->lay.on[0] != 99) {
			for (int ax = 0; ax < g->ps->naxes; ax++)
				if (a->lay.on[ax] == a->rank - 1)
					k /= g->ps->axes[ax].size;
		}
	} else { /* contracted over every leading dim of a */
		double all = local ? block_elems(g, op->in[0]) : (double)value_elems(g, op->in[0]);
		double last = (double)a->dim[a->rank - 1];
		if (local)
			for (int ax = 0; ax < g->ps->naxes; ax++)
				if (a->lay.on[ax] == a->rank - 1)
					last /= g->ps->axes[ax].size;
		k = all / last;
	}
	return 2.0 * out * k;
}

/* Bytes a rank puts on the wire for one call, rounded as planrt counts them (comm_mpi.c): the
 * exact fraction k (n - 1) B / n to the nearest byte, halves up, in integers. */
static long long wire_bytes(OpKind kind, long long n, long long B)
{
	if (n <= 1 || kind == OP_RECV)
		return 0;
	if (kind == OP_SEND)
		return B;
	/* 128-bit: B < 2^60 (graph.c) times 4 (n - 1) < 2^26 does not fit 64 bits */
	__int128 k = kind == OP_ALL_REDUCE ? 2 : 1;
	return (long long)((2 * k * (n - 1) * B + n) / (2 * n));
}

static long long gcd(long long a, long long b)
{
	while (b) {
		long long t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* row's bytes and wire bytes plus count calls of B and wire bytes every `every` steps, exactly */
static void add_per_step(CommRow *row, long long count, long long every, long long B, long long wire)
{
	long long den = row->den / gcd(row->den, every) * every; /* lcm: every is small (a plan's every = K) */
	__int128 up = den / row->den, x = (__int128)count * (den / every);
	row->bytes = row->bytes * up + x * B;
	row->wire = row->wire * up + x * wire;
	row->den = den;
}

/* a per-step byte count: an integer when it is one (exact to the byte), else its decimal value */
static double per_step_value(__int128 num, long long den)
{
	return (double)num / (double)den;
}

static void json_per_step(FILE *out, __int128 num, long long den)
{
	if (num % den == 0 && num / den <= (__int128)LLONG_MAX)
		fprintf(out, "%lld", (long long)(num / den));
	else
		fprintf(out, "%.17g", per_step_value(num, den));
}

static void add_comm(Report *rep, Role *r, const Kernel *k, const Comm *c)
{
	const Graph *g = rep->g;
	const PlanSpec *ps = rep->ps;
	int m = ps->micro_batches > 0 ? ps->micro_batches : 1;
	long long count; /* calls every `every` steps */
	switch (k->phase) {
	case PH_PREPARE_F:
	case PH_FORWARD:
	case PH_PREPARE_B:
	case PH_BACKWARD:
		count = k->only_last_micro ? 1 : m;
		break;
	case PH_STEP_BEGIN:
	case PH_STEP:
		count = 1;
		break;
	default:
		return; /* once per run, not per step */
	}
	long long every = c->every > 0 ? c->every : 1;
	double calls = (double)count / (double)every;
	long long B = c->elems * dtype_bytes(c->dtype);
	long long n = c->pair >= 0 || c->coll == OP_SEND || c->coll == OP_RECV ? 2 : c->axis >= 0 ? ps->axes[c->axis].size : 1;
	long long wire = c->bound ? B : wire_bytes(c->coll, n, B); /* a bound: what leaves this rank */
	bool recompute = k->op >= 0 && g->ops[k->op].recompute;
	bool transfer = (c->coll == OP_SEND || c->coll == OP_RECV) && c->peer >= 0; /* a pipeline transfer, not a ring's */
	int nchunks = g->sched && g->sched->chunks > 0 ? g->sched->chunks : 1;
	/* a transfer belongs to the pass it serves: a gradient's receive is posted during the forward */
	bool backward = transfer ? c->channel >= nchunks : k->phase == PH_BACKWARD || k->phase == PH_PREPARE_B;
	const char *phase = k->phase == PH_STEP || k->phase == PH_STEP_BEGIN ? "step"
			    : recompute ? "recompute"
			    : backward ? "backward" : "forward";
	bool pair = c->pair >= 0;
	for (int i = 0; i < r->ncomm; i++) {
		CommRow *row = &r->comm[i];
		if (row->kind == c->coll && row->axis == c->axis && row->pair == pair && row->bound == c->bound &&
		    !strcmp(row->phase, phase)) {
			row->calls += calls;
			add_per_step(row, count, every, B, wire);
			return;
		}
	}
	if (r->ncomm == r->capcomm) {
		r->capcomm = r->capcomm ? r->capcomm * 2 : 16;
		CommRow *nc = realloc(r->comm, sizeof(CommRow) * (size_t)r->capcomm);
		if (!nc)
			ICE("out of memory");
		r->comm = nc;
	}
	r->comm[r->ncomm] = (CommRow){c->coll, c->axis, pair, c->bound, phase, calls, 0, 0, 1};
	add_per_step(&r->comm[r->ncomm++], count, every, B, wire);
}

static bool op_on(const Op *op, int stage, int role)
{
	if (op->role != RANKROLE_ANY && op->role != role)
		return false;
	return op->stage == stage;
}

static long long optimizer_state_bytes(const PlanSpec *ps)
{
	long long b = ps->master_dtype != ps->param_dtype ? dtype_bytes(ps->master_dtype) : 0;
	switch (ps->optimizer) {
	case OPT_ADAM:
	case OPT_ADAMW:
		return b + 8;
	case OPT_MOMENTUM:
		return b + 4;
	case OPT_SGD:
		return b;
	}
	return b;
}

/* The bytes of one optimizer step's parameter, gradient and optimizer state on a rank (out[0..2]). */
static void step_states(Graph *g, const StateRecord *st, const Op *op, bool worker_only, long long *out)
{
	int p = op->in[0], gr = op->in[1], zn = st->zero.size;
	out[0] = bytes_of(g, p);
	out[1] = bytes_of(g, gr);
	/* the optimizer works on the tensor-parallel shard, split again over the ZeRO axis */
	Layout saved = g->vals[p].lay;
	if (st->zero.axis >= 0)
		g->vals[p].lay.on[st->zero.axis] = LAYOUT_R;
	long long local = value_local_elems(g, p);
	g->vals[p].lay = saved;
	if (zn > 1)
		local = (local + zn - 1) / zn;
	out[2] = worker_only ? 0 : local * optimizer_state_bytes(g->ps);
	if (st->error_feedback)
		out[2] += value_local_elems(g, gr) * 4; /* error-feedback residual, f32 */
}

static void model_states(Report *rep, Role *r)
{
	Graph *g = rep->g;
	const StateRecord *st = &rep->low->state; /* ZeRO and sync as state.c laid them out */
	bool worker_only = st->async && r->role == RANKROLE_WORKER;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->kind != OP_OPTIMIZER_STEP || op->stage != r->stage)
			continue;
		long long b[3];
		step_states(g, st, op, worker_only, b);
		r->params += b[0];
		r->grads += b[1];
		r->optim += b[2];
	}
	if (st->offload_optimizer == PLACE_HOST) {
		r->host += r->optim;
		r->optim = 0;
	} else if (st->offload_optimizer == PLACE_DISK) {
		r->disk += r->optim;
		r->optim = 0;
	}
	if (st->offload_params == PLACE_HOST) {
		r->host += r->params;
		r->params = 0;
	} else if (st->offload_params == PLACE_DISK) {
		r->disk += r->params;
		r->params = 0;
	}
}

/* bytes / chunks to the nearest byte, halves to even (as "%.0f" printed the quotient) */
static long long per_chunk(long long bytes, int chunks)
{
	long long v = chunks > 0 ? chunks : 1, q = bytes / v, twice = 2 * (bytes % v);
	return q + (twice > v || (twice == v && q % 2));
}

/* Forward values read by the backward: the activations a micro-batch keeps. */
static void activations(Report *rep, Role *r)
{
	Graph *g = rep->g;
	char *seen = calloc((size_t)g->nvals, 1);
	if (!seen)
		ICE("out of memory");
	r->act_layer = calloc((size_t)(g->nlayers + 1), sizeof(long long));
	if (!r->act_layer)
		ICE("out of memory");
	long long total = 0;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (!op->backward || op->stage != r->stage || op->per_step)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k];
			int def = g->vals[v].def;
			if (def < 0)
				continue;
			const Op *prod = &g->ops[def];
			if (prod->backward || prod->per_step || prod->kind == OP_PARAM)
				continue;
			if (g->vals[v].role == ROLE_PARAM)
				continue;
			int root = value_root(g, v);
			const Op *rdef = g->vals[root].def >= 0 ? &g->ops[g->vals[root].def] : NULL;
			if (rdef && rdef->kind == OP_PARAM)
				continue; /* a view of a parameter (w.T) */
			if (rdef && rdef->kind == OP_ALL_GATHER && g->vals[rdef->in[0]].role == ROLE_PARAM)
				continue; /* a gathered ZeRO-3 parameter: working memory, not an activation */
			if (seen[root])
				continue;
			seen[root] = 1;
			long long b = bytes_of(g, root);
			total += b;
			int layer = op->layer;
			if (layer >= 0 && layer < g->nlayers)
				r->act_layer[layer] += b;
		}
	}
	free(seen);
	int v = g->sched ? g->sched->chunks : 1;
	r->inflight = g->sched ? g->sched->inflight[r->stage] : 1;
	r->act_micro = total;
	r->act = per_chunk(total * r->inflight, v);
	if (rep->low->state.offload_activations == PLACE_HOST) {
		r->host += r->act - per_chunk(total, v);
		r->act = per_chunk(total, v);
	}
}

/* Largest live set of values other than model states and saved activations, one micro-batch. */
static void working_memory(Report *rep, Role *r)
{
	Graph *g = rep->g;
	int *last = malloc(sizeof(int) * (size_t)g->nvals);
	char *saved = calloc((size_t)g->nvals, 1);
	if (!last || !saved)
		ICE("out of memory");
	for (int v = 0; v < g->nvals; v++)
		last[v] = -1;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != r->stage || op->per_step)
			continue;
		for (int k = 0; k < op->nin; k++) {
			last[op->in[k]] = i;
			int def = g->vals[op->in[k]].def;
			if (op->backward && def >= 0 && !g->ops[def].backward)
				saved[value_root(g, op->in[k])] = 1;
		}
	}
	long long live = 0, most = 0;
	long long *free_at = calloc((size_t)g->nops + 1, sizeof(long long));
	if (!free_at)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->stage != r->stage || op->per_step)
			continue;
		for (int k = 0; k < op->nout; k++) {
			int v = op->out[k];
			const Value *val = &g->vals[v];
			if (val->alias_of >= 0 || saved[v] || val->role == ROLE_PARAM || val->grad_of >= 0 || last[v] < 0)
				continue;
			if (op->kind == OP_PARAM)
				continue;
			long long b = bytes_of(g, v);
			live += b;
			free_at[last[v]] += b;
		}
		if (live > most)
			most = live;
		live -= free_at[i];
	}
	r->work = most;
	free(free_at);
	free(last);
	free(saved);
}

static void flops_and_comm(Report *rep, Role *r)
{
	Graph *g = rep->g;
	int m = rep->ps->micro_batches > 0 ? rep->ps->micro_batches : 1;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op_on(op, r->stage, r->role))
			r->flops += matmul_flops(g, op, true) * (op->per_step ? 1 : m);
	}
	const LProg *p = r->lp;
	for (int i = 0; p && i < p->nk; i++)
		for (int c = 0; c < p->k[i].ncomm; c++)
			add_comm(rep, r, &p->k[i], &p->k[i].comm[c]);
}

static void bubble(Report *rep)
{
	Graph *g = rep->g;
	if (!g->sched || g->nstages <= 1)
		return;
	int p = g->nstages, v = g->sched->chunks;
	double *fc = calloc((size_t)(p * v), sizeof(double)), *bc = calloc((size_t)(p * v), sizeof(double));
	if (!fc || !bc)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->per_step)
			continue;
		int chunk = op->layer >= 0 ? g->layer_chunk[op->layer] : (op->stage == 0 && i < g->nfwd / 2 ? 0 : v - 1);
		double f = matmul_flops(g, op, true);
		(op->backward ? bc : fc)[op->stage * v + chunk] += f;
	}
	for (int i = 0; i < p * v; i++) {
		if (fc[i] == 0)
			fc[i] = 1;
		if (bc[i] == 0)
			bc[i] = 2;
	}
	rep->bubble = pipeline_bubble(g, fc, bc);
	free(fc);
	free(bc);
}

/* ---------------------------------------------------------------- estimated step time
 * Each kernel of the program costs what a roofline of the reference device gives it: a matmul
 * its FLOPs at the device's rate for the plan's precision (plus its operands' bytes at matmul_bw,
 * where the device has one: a CPU's packing), any other compute kernel the bytes of
 * its buffers at memory bandwidth, a collective its wire bytes at the per-rank network bandwidth
 * plus a latency per call. A forward or backward of a micro-batch and chunk costs the sum of its
 * kernels (a transfer between stages delays the receiving action by its own time); the schedule
 * table is simulated with those costs, and the step's update phase (gradient buckets, clipping,
 * the optimizer) is added once. The device is a nominal figure for comparing plans, not a
 * promise: explain says which one it assumed. */
/* Ranks are numbered row-major with the last mesh axis fastest, so the innermost axes whose sizes
 * multiply to at most a node's ranks run inside one node. */
static bool inside_node(const PlanSpec *ps, int axis)
{
	long long span = 1;
	for (int a = axis; a < ps->naxes; a++)
		span *= ps->axes[a].size;
	return span <= device_current()->node_ranks;
}

/* A collective's group size (<= 1: it costs nothing), link, ring steps and wire bytes per rank. */
static long long comm_shape(const PlanSpec *ps, const Comm *c, const Link **link, double *steps, double *wire)
{
	if (c->coll == OP_RECV)
		return 0;
	long long n = c->pair >= 0 || c->coll == OP_SEND ? 2 : c->axis >= 0 ? ps->axes[c->axis].size : 1;
	if (n <= 1)
		return n;
	*wire = wire_bytes(c->coll, n, c->elems * dtype_bytes(c->dtype));
	bool near = c->axis >= 0 && c->pair < 0 && inside_node(ps, c->axis);
	const Device *d = device_current();
	*link = near ? &d->node : &d->net;
	*steps = c->coll == OP_SEND ? 1 : c->coll == OP_ALL_REDUCE ? 2.0 * (double)(n - 1) : (double)(n - 1);
	return n;
}

static double comm_seconds(const PlanSpec *ps, const Comm *c)
{
	const Link *l = NULL;
	double steps = 0, wire = 0;
	long long n = comm_shape(ps, c, &l, &steps, &wire);
	return n > 1 ? device_collective_seconds(l, c->coll == OP_ALL_REDUCE, n, steps, wire) : 0;
}

/* The least of comm_seconds over any split of the collective into calls: its bandwidth term
 * (planc search's bounds). */
static double comm_floor(const PlanSpec *ps, const Comm *c)
{
	const Link *l = NULL;
	double steps = 0, wire = 0;
	long long n = comm_shape(ps, c, &l, &steps, &wire);
	return n > 1 && c->coll != OP_SEND ? device_wire_floor(l, c->coll == OP_ALL_REDUCE, wire) : 0;
}

/* The share of a causal self-attention's s x s scores a kernel of query and key tiles of `tile`
 * computes: each query tile runs every key tile up to its last row's, whole ((n + 1) / 2n of them
 * for n tiles; all of them when s fits one tile), where the unmasked scores are about half. */
static double causal_tiles_computed(long long s, int tile)
{
	if (s <= 0 || tile <= 0)
		return 0.5;
	double computed = 0;
	for (long long r0 = 0; r0 < s; r0 += tile) {
		long long rows = s - r0 < tile ? s - r0 : tile, keys = r0 + tile < s ? r0 + tile : s;
		computed += (double)rows * (double)keys;
	}
	return computed / ((double)s * (double)s);
}

static double kernel_seconds(const PlanSpec *ps, const LProg *p, const Kernel *k)
{
	const Device *d = device_current();
	int dt = ps->param_dtype == DT_BF16 ? 1 : ps->param_dtype == DT_F16 ? 2 : 0;
	double t = 0;
	if (kernel_is_gemm(k)) {
		t = kernel_gemm_flops(k) / d->matmul[dt];
		if (d->matmul_bw[dt] > 0)
			t += kernel_gemm_operand_bytes(k) / d->matmul_bw[dt];
	} else if (k->kind == K_ATTENTION || k->kind == K_ATTENTION_GRAD || k->kind == K_RING_ATTENTION ||
		   k->kind == K_RING_ATTENTION_GRAD || k->kind == K_ATTENTION_16 || k->kind == K_ATTENTION_GRAD_16) {
		/* its products (attention_flops); a ring's: one block's. The ring kernels' and the 16-bit
		 * variants' arguments start as the plain ones' (ring.c copies them; lower.c appends) */
		KernelKind kind = k->kind == K_RING_ATTENTION || k->kind == K_ATTENTION_16 ? K_ATTENTION
				  : k->kind == K_RING_ATTENTION_GRAD || k->kind == K_ATTENTION_GRAD_16 ? K_ATTENTION_GRAD
				  : k->kind;
		bool fwd = kind == K_ATTENTION;
		const KArg *ld = &k->args[fwd ? KARG_INDEX(ATTENTION, ldims) : KARG_INDEX(ATTENTION_GRAD, ldims)];
		double q = 1;
		for (int i = 0; i < ld->n; i++)
			q *= (double)ld->ints[i];
		double sk = (double)k->args[fwd ? KARG_INDEX(ATTENTION, sk) : KARG_INDEX(ATTENTION_GRAD, sk)].i;
		long long causal = k->args[fwd ? KARG_INDEX(ATTENTION, mask_kind) : KARG_INDEX(ATTENTION_GRAD, mask_kind)].i == 1;
		/* causal: half the key tiles are skipped, and on a ring's every step under causal load
		 * balancing (each rank's two mirrored chunks meet half of every block). A contiguous ring
		 * costs the busiest rank's, the last coordinate's: every block after its own is whole. */
		bool ring = k->kind == K_RING_ATTENTION || k->kind == K_RING_ATTENTION_GRAD;
		int step = ring ? (int)k->args[fwd ? KARG_INDEX(RING_ATTENTION, step) : KARG_INDEX(RING_ATTENTION_GRAD, step)].i : 0;
		double unmasked = !causal ? 1 : ring && !p->low->g->ring_mirrored && step > 0 ? 1 : 0.5;
		double rows = ld->n > 0 ? q / (double)ld->ints[ld->n - 1] : 0; /* q counts the head dim's elements */
		if (causal && !ring && d->attention_tile > 0 && ld->n >= 2 && (double)ld->ints[ld->n - 2] == sk)
			unmasked = causal_tiles_computed((long long)sk, d->attention_tile);
		double flops = 2.0 * q * sk * (fwd ? 2 : 5) * unmasked, scores = rows * sk * unmasked;
		t = flops / (d->attention[dt] > 0 ? d->attention[dt] : d->matmul[dt]) + scores * d->attention_score[fwd ? 0 : 1];
		/* dropout on the probabilities: a mask element per score it computes, forward and again in
		 * the backward */
		double drop = k->args[fwd ? KARG_INDEX(ATTENTION, p) : KARG_INDEX(ATTENTION_GRAD, p)].f;
		if (drop > 0 && d->dropout > 0)
			t += scores / d->dropout;
	} else if (k->kind == K_LOOP) {
		double elems = 1;
		for (int i = 0; i < k->rank; i++)
			elems *= (double)k->dims[i];
		/* every buffer it reads or writes at its own element size (a bf16 loop moves half an
		 * f32 one's bytes); a broadcast operand is counted whole, as the nest reads it */
		double bytes = 0;
		for (int u = 0; u < k->nuses; u++)
			bytes += elems * dtype_bytes(p->buf[k->uses[u]].dtype);
		for (int w = 0; w < k->ndefs; w++)
			bytes += elems * dtype_bytes(p->buf[k->defs[w]].dtype);
		t = bytes / d->memory_bw[dt];
	} else if (kernel_classes[k->kind] == KC_COMPUTE) {
		double bytes = 0;
		for (int a = 0; a < k->nargs; a++)
			if (k->args[a].kind == KA_BUF)
				bytes += (double)p->buf[k->args[a].buf].bytes;
		t = bytes / d->memory_bw[dt];
		if ((k->kind == K_DROPOUT || k->kind == K_DROPOUT_16) && d->dropout > 0) {
			/* its mask draws beyond its bytes (the two kinds' arguments agree up to ldims) */
			_Static_assert(KARG_INDEX(DROPOUT, ldims) == KARG_INDEX(DROPOUT_16, ldims), "dropout's ldims");
			_Static_assert(KARG_INDEX(DROPOUT, p) == KARG_INDEX(DROPOUT_16, p), "dropout's p");
			const KArg *ld = &k->args[KARG_INDEX(DROPOUT, ldims)];
			double elems = 1;
			for (int i = 0; i < ld->n; i++)
				elems *= (double)ld->ints[i];
			if (k->args[KARG_INDEX(DROPOUT, p)].f > 0)
				t += elems / d->dropout;
		}
	}
	if (kernel_classes[k->kind] == KC_COMPUTE || kernel_classes[k->kind] == KC_LOOP)
		t += d->launch; /* the kernel's fixed cost (a collective's is its link's latency) */
	for (int c = 0; c < k->ncomm; c++)
		if (k->comm[c].coll != OP_SEND)
			t += comm_seconds(ps, &k->comm[c]);
	return t;
}

/* A node's ranks sharing fewer cores than they are (a CPU run with more ranks than cores): the
 * device's rates are a rank's while all of the calibration's node.ranks ranks compute (calibrate
 * measures them so), and a rank gets min(1, cores / computing) of a core. A plan puts
 * min(world, node.ranks) ranks on a node: fewer than the calibration had (2 ranks priced on a
 * 4-rank calibration of 2 cores) compute that much faster throughout, and a pipeline whose other
 * stages wait runs its busy ones faster still: k of p stages busy is k / p of the node's ranks
 * (spread evenly). */
static double core_share(double computing)
{
	const Device *d = device_current();
	return d->node_cores > 0 && computing > d->node_cores ? d->node_cores / computing : 1;
}

static bool stages_share_cores(long long world, int stages)
{
	const Device *d = device_current();
	return stages > 1 && d->node_cores > 0 && d->node_cores < (world < d->node_ranks ? world : d->node_ranks);
}

double explain_stage_speed(long long world, int stages, int busy)
{
	const Device *d = device_current();
	if (d->node_cores <= 0 || busy <= 0)
		return 1;
	double ranks = (double)(world < d->node_ranks ? world : d->node_ranks);
	return core_share(ranks * busy / stages) / core_share(d->node_ranks);
}

const double *explain_stage_speeds(long long world, int stages, double *buf)
{
	if (!stages_share_cores(world, stages))
		return NULL;
	for (int k = 0; k <= stages; k++)
		buf[k] = explain_stage_speed(world, stages, k);
	return buf;
}

const char *explain_device_name(void)
{
	return device_current()->name;
}

/* each kernel's roofline seconds on the device, by phase (explain_step_costs scales them) */
static void explain_costs(const Graph *g, const Lowered *low, int role, double *fc, double *bc, double *xfer,
			  double *update)
{
	int p = g->nstages, v = g->sched ? g->sched->chunks : 1, m = g->sched ? g->sched->micro : 1;
	*xfer = 0;
	for (int s = 0; s < p; s++) {
		const LProg *lp = lowered_prog(low, s, role);
		double step = 0;
		for (int c = 0; c < v; c++)
			fc[s * v + c] = bc[s * v + c] = 0;
		for (int i = 0; lp && i < lp->nk; i++) {
			const Kernel *k = &lp->k[i];
			double t = kernel_seconds(g->ps, lp, k);
			for (int c = 0; c < k->ncomm; c++)
				if (k->comm[c].coll == OP_SEND && k->comm[c].peer >= 0 && comm_seconds(g->ps, &k->comm[c]) > *xfer)
					*xfer = comm_seconds(g->ps, &k->comm[c]);
			if (k->only_last_micro)
				t /= m; /* once per step: spread over the micro-batches */
			switch (k->phase) {
			case PH_PREPARE_F:
			case PH_FORWARD:
				fc[s * v + k->chunk] += t;
				break;
			case PH_PREPARE_B:
			case PH_BACKWARD:
				bc[s * v + k->chunk] += t;
				break;
			case PH_STEP_BEGIN:
			case PH_STEP:
				step += t;
				break;
			default:
				break;
			}
		}
		update[s] = step;
	}
}

const double *explain_step_costs(const Graph *g, const Lowered *low, int role, double *fc, double *bc, double *xfer,
				 double *update, double *speed_buf)
{
	int p = g->nstages, v = g->sched ? g->sched->chunks : 1;
	explain_costs(g, low, role, fc, bc, xfer, update);
	/* every stage computing: the whole step's speed (1 but where the plan puts fewer ranks on a
	 * node than the calibration shared its cores among); the pipeline's own sharing, where its
	 * stages share cores, is the simulation's (the speeds returned) */
	double all = explain_stage_speed(g->ps->world, p, p);
	const double *speeds = explain_stage_speeds(g->ps->world, p, speed_buf);
	if (!speeds && all != 1)
		for (int i = 0; i < p * v; i++) {
			fc[i] /= all;
			bc[i] /= all;
		}
	for (int s = 0; s < p; s++)
		update[s] /= all;
	return speeds;
}

static void estimate(Report *rep)
{
	Graph *g = rep->g;
	const Lowered *low = rep->low;
	if (!low || !g->sched)
		return;
	int p = g->nstages, v = g->sched->chunks;
	double *fc = calloc((size_t)(p * v), sizeof(double)), *bc = calloc((size_t)(p * v), sizeof(double));
	double *upd = calloc((size_t)p, sizeof(double)), *speed_buf = malloc(sizeof(double) * (size_t)(p + 1));
	if (!fc || !bc || !upd || !speed_buf)
		ICE("out of memory");
	double xfer = 0, update = 0, makespan = 0;
	const double *speeds = explain_step_costs(g, low, low->nroles > 1 ? RANKROLE_WORKER : RANKROLE_ANY, fc, bc, &xfer,
						  upd, speed_buf);
	for (int s = 0; s < p; s++)
		if (upd[s] > update)
			update = upd[s];
	pipeline_simulate(g, fc, bc, xfer, speeds, &makespan, NULL);
	free(speed_buf);
	rep->est_pipeline = makespan;
	rep->est_update = update;
	rep->est_step = makespan + update;
	free(fc);
	free(bc);
	free(upd);
}

static const char *human_time(double s, char *buf, size_t n)
{
	if (s >= 1)
		snprintf(buf, n, "%.3f s", s);
	else if (s >= 1e-3)
		snprintf(buf, n, "%.3f ms", s * 1e3);
	else
		snprintf(buf, n, "%.3f us", s * 1e6);
	return buf;
}

/* A plan planc build runs: its memory lines are what the program allocates. The persistent state
 * by kind; the arena as the activation slots (and inboxes) plus the rest, the working memory.
 * A stage that runs one micro-batch at a time keeps its forward and backward together in one
 * slot over the transient region (memplan.c): then the slot is the activations line and the
 * working memory is what the arena has beyond it. */
static void program_memory(Report *rep, Role *r)
{
	const LProg *p = r->lp;
	if (!rep->runnable || !p)
		return;
	long long dev[SC_COUNT]; /* device memory by kind: what is not offloaded to the host */
	r->host = 0;
	for (int k = 0; k < SC_COUNT; k++) {
		dev[k] = (long long)(p->state_bytes[k] - p->host_state_bytes[k]);
		r->host += (long long)p->host_state_bytes[k];
	}
	r->disk = (long long)p->disk_bytes;
	r->params = dev[SC_PARAM];
	r->grads = dev[SC_GRAD];
	r->optim = dev[SC_OPTIM] + dev[SC_MASTER];
	r->prog_metric = dev[SC_METRIC] + dev[SC_BUFFER];
	long long slots = (long long)p->nslots * (long long)p->slot_bytes + (long long)p->ninbox * (long long)p->inbox_bytes;
	r->act = slots;
	r->work = (long long)p->arena_bytes - slots;
	r->inflight = p->nslots;
	r->prog_arena = (long long)p->arena_bytes;
	r->prog_state = 0;
	for (int k = 0; k < SC_COUNT; k++)
		r->prog_state += dev[k];
}

/* How many ranks hold a role, and the first of them, from the mesh's shape alone (ranks are
 * row-major over the axes, axis 0 slowest): a role is one coordinate on the pipe axis, and the
 * master (coordinate 0) or the workers (the others) on the async axis. Never a walk over the
 * ranks: a million-rank mesh costs what an eight-rank one does. */
static void role_ranks(const PlanSpec *ps, bool async, int async_axis, Role *r)
{
	long long n = ps->world;
	int coord[MAX_AXES] = {0};
	if (ps->pipe_axis >= 0) {
		n /= ps->axes[ps->pipe_axis].size;
		coord[ps->pipe_axis] = r->stage;
	}
	if (async && async_axis < 0) {
		n = 0; /* no axis splits the batch: every rank is of no async role */
	} else if (async) {
		int k = ps->axes[async_axis].size;
		n = r->role == RANKROLE_MASTER ? n / k : n / k * (k - 1);
		coord[async_axis] = r->role == RANKROLE_MASTER ? 0 : 1;
	}
	r->nranks = (int)n;
	r->first_rank = -1;
	if (n > 0) {
		long long rank = 0;
		for (int a = 0; a < ps->naxes; a++)
			rank = rank * ps->axes[a].size + coord[a];
		r->first_rank = (int)rank;
	}
}

static Report *build_report(Graph *g, const Lowered *low)
{
	PlanSpec *ps = g->ps;
	Report *rep = calloc(1, sizeof *rep);
	if (!rep)
		ICE("out of memory");
	rep->g = g;
	rep->ps = ps;
	rep->low = low;
	/* one program for both targets: its allocations are explain's figures when either runs it */
	rep->runnable = low && (lowered_executable(low, false) || cuda_executable(low, false));
	bool async = low->nroles > 1; /* async masters and workers */
	int nr = g->nstages * (async ? 2 : 1);
	rep->roles = calloc((size_t)nr, sizeof(Role));
	if (!rep->roles)
		ICE("out of memory");
	int async_axis = async ? low->state.sync_axis : -1;
	for (int s = 0; s < g->nstages; s++)
		for (int k = 0; k < (async ? 2 : 1); k++) {
			Role *r = &rep->roles[rep->nroles++];
			r->stage = s;
			r->role = async ? (k == 0 ? RANKROLE_MASTER : RANKROLE_WORKER) : RANKROLE_ANY;
			role_ranks(ps, async, async_axis, r);
			r->lp = lowered_prog(rep->low, s, r->role);
			model_states(rep, r);
			activations(rep, r);
			working_memory(rep, r);
			flops_and_comm(rep, r);
			program_memory(rep, r);
			r->peak = r->params + r->grads + r->optim + r->prog_metric + r->act + r->work;
		}
	int m = ps->micro_batches > 0 ? ps->micro_batches : 1;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		rep->model_flops += matmul_flops(g, op, false) * (op->per_step ? 1 : m);
		if (op->kind == OP_PARAM && g->vals[op->out[0]].tied_to < 0) {
			const Value *v = &g->vals[op->out[0]];
			rep->params_total += value_elems(g, op->out[0]);
			if (v->buffer)
				rep->params_buffers += value_elems(g, op->out[0]);
			else if (v->frozen)
				rep->params_frozen += value_elems(g, op->out[0]);
		}
	}
	bubble(rep);
	estimate(rep);
	return rep;
}

static void free_report(Report *rep)
{
	for (int i = 0; i < rep->nroles; i++) {
		free(rep->roles[i].act_layer);
		free(rep->roles[i].comm);
	}
	free(rep->roles);
	free(rep);
}

bool explain_summary(Graph *g, const Lowered *low, ExplainSummary *out)
{
	Report *rep = build_report(g, low);
	memset(out, 0, sizeof *out);
	for (int i = 0; i < rep->nroles; i++)
		if (rep->roles[i].peak > out->peak) {
			const Role *r = &rep->roles[i];
			out->peak = r->peak;
			out->params = r->params;
			out->grads = r->grads;
			out->optim = r->optim;
		}
	out->step = rep->est_step;
	out->pipeline = rep->est_pipeline;
	out->update = rep->est_update;
	out->bubble = rep->bubble;
	for (int i = 0; i < rep->nroles; i++)
		if (rep->roles[i].peak == out->peak)
			out->act_micro = (double)rep->roles[i].act_micro;
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].kind == OP_ATTENTION && g->ops[i].n == ATTN_CAUSAL)
			out->causal = true;
	out->runnable = rep->runnable;
	bool ok = low && g->sched;
	free_report(rep);
	return ok;
}

/* The seconds explain_costs gives every program's kernels, summed by kind and phase (planc
 * search's bounds; search.c says why they bound every plan): compute kernels (no communication)
 * of the forward and backward phases (all micro-batches) and of the update phase, and the least
 * seconds of the collectives (comm_floor; sends between stages left out) of the same phases. */
void explain_totals(const Lowered *low, ExplainTotals *out)
{
	int m = low->g->sched ? low->g->sched->micro : 1;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < low->nprogs; i++) {
		const LProg *lp = low->progs[i];
		for (int j = 0; j < lp->nk; j++) {
			const Kernel *k = &lp->k[j];
			Phase ph = k->phase;
			bool step = ph == PH_STEP_BEGIN || ph == PH_STEP;
			bool counted = step || ph == PH_PREPARE_F || ph == PH_FORWARD || ph == PH_PREPARE_B || ph == PH_BACKWARD;
			if (!counted)
				continue;
			double times = step || k->only_last_micro ? 1 : m;
			if (kernel_classes[k->kind] == KC_COMPUTE && !k->ncomm)
				*(step ? &out->update : &out->compute) += kernel_seconds(low->g->ps, lp, k) * times;
			for (int c = 0; c < k->ncomm; c++)
				*(step ? &out->comm_step : &out->comm_micro) += comm_floor(low->g->ps, &k->comm[c]) * times;
		}
	}
}

/* The part of the model an op works for (explain_parts): 1 + its layer; before the first layer 0,
 * after the last nlayers + 1, by the rule lower.c's chunk_of places ops outside the layers with
 * (a backward op follows the forward op it differentiates); -1 where that is not certain (a
 * recomputed clone or a backward op outside the layers with no forward op). */
static int op_part(const Graph *g, int i, int first_layer_op)
{
	for (int hops = 0; hops < 16; hops++) {
		const Op *op = &g->ops[i];
		if (op->layer >= 0)
			return 1 + op->layer;
		if (op->recompute)
			return -1;
		if (op->fwd_op >= 0 && op->fwd_op != i) {
			i = op->fwd_op;
			continue;
		}
		if (op->backward || op->per_step)
			return -1;
		return i < first_layer_op ? 0 : g->nlayers + 1;
	}
	return -1;
}

/* Whether a fused loop may hold an op of another part than its own: an op without a kernel of its
 * own (lowered into its consumer's loop, or a view) that produces one of its inputs, followed up
 * the chain as far as the loop fused ops. lower.c fuses within a phase and chunk, so at one stage
 * a chain may cross from one layer into the next, which a pipeline would cut. */
static bool fused_across(const Graph *g, const Kernel *k, const char *own_kernel, int part, int first_layer_op)
{
	enum { CHAIN_MAX = 64 }; /* a longer chain counts as crossing: that only lowers a bound */
	int chain[CHAIN_MAX], n = 0;
	chain[n++] = k->op;
	for (int seen = 0; seen < n && seen < k->nfused; seen++) {
		const Op *op = &g->ops[chain[seen]];
		for (int i = 0; i < op->nin; i++) {
			int d = g->vals[op->in[i]].def;
			if (d < 0 || own_kernel[d] || g->ops[d].kind == OP_PARAM || g->ops[d].kind == OP_INPUT)
				continue;
			if (op_part(g, d, first_layer_op) != part || n == CHAIN_MAX)
				return true;
			chain[n++] = d;
		}
	}
	return false;
}

/* The part of a kernel: its op's (-1 for a fused loop that may reach into another part); for a
 * kernel without an op (state.c's optimizer, gradient and state kernels) the one layer every
 * buffer and parameter it names belongs to, else -1. */
static int kernel_part(const LProg *lp, const Kernel *k, const char *own_kernel, int first_layer_op)
{
	const Graph *g = lp->g;
	if (k->op >= 0) {
		int part = op_part(g, k->op, first_layer_op);
		return part >= 0 && k->kind == K_LOOP && k->nfused > 1 && fused_across(g, k, own_kernel, part, first_layer_op)
			? -1 : part;
	}
	int layer = -1;
	for (int a = 0; a < k->nargs; a++) {
		const KArg *arg = &k->args[a];
		int n = arg->kind == KA_BUF ? 1 : arg->kind == KA_BUFS ? arg->n : arg->kind == KA_PARAM ? 1 : 0;
		for (int j = 0; j < n; j++) {
			int l = -1;
			if (arg->kind == KA_PARAM) {
				if (arg->i >= 0 && arg->i < lp->low->nparams)
					l = g->vals[lp->low->params[arg->i].value].layer;
			} else {
				int b = arg->kind == KA_BUF ? arg->buf : arg->bufs[j];
				while (b >= 0 && lp->buf[b].cls == BUF_VIEW && lp->buf[b].value < 0)
					b = lp->buf[b].view_of;
				l = b >= 0 && lp->buf[b].value >= 0 ? g->vals[lp->buf[b].value].layer : -1;
			}
			if (l >= 0 && layer >= 0 && l != layer)
				return -1;
			if (l >= 0)
				layer = l;
		}
	}
	return layer >= 0 ? 1 + layer : -1;
}

/* Saved activations (as activations() counts them) and model states by part. */
static void part_memory(Graph *g, const Lowered *low, int first_layer_op, ExplainPart *out)
{
	char *seen = calloc((size_t)g->nvals, 1);
	if (!seen)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		int part = op_part(g, i, first_layer_op);
		if (op->kind == OP_OPTIMIZER_STEP) {
			int def = g->vals[op->in[0]].def, at = def >= 0 ? op_part(g, def, first_layer_op) : -1;
			long long b[3];
			step_states(g, &low->state, op, false, b);
			if (at >= 0) {
				out[at].params += (double)b[0];
				out[at].grads += (double)b[1];
				out[at].optim += (double)b[2];
			}
		}
		if (!op->backward || op->per_step)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k], def = g->vals[v].def;
			if (def < 0 || g->ops[def].backward || g->ops[def].per_step || g->ops[def].kind == OP_PARAM ||
			    g->vals[v].role == ROLE_PARAM)
				continue;
			int root = value_root(g, v);
			const Op *rdef = g->vals[root].def >= 0 ? &g->ops[g->vals[root].def] : NULL;
			if (rdef && (rdef->kind == OP_PARAM ||
				     (rdef->kind == OP_ALL_GATHER && g->vals[rdef->in[0]].role == ROLE_PARAM)))
				continue;
			if (seen[root])
				continue;
			seen[root] = 1;
			if (part >= 0)
				out[part].act += (double)bytes_of(g, root);
		}
	}
	free(seen);
}

bool explain_parts(Graph *g, const Lowered *low, ExplainPart *out)
{
	if (g->nstages != 1 || low->nprogs != 1)
		return false;
	int nparts = g->nlayers + 2, first_layer_op = g->nops, m = g->sched ? g->sched->micro : 1;
	memset(out, 0, sizeof *out * (size_t)nparts);
	for (int i = 0; i < g->nops && first_layer_op == g->nops; i++)
		if (g->ops[i].layer >= 0 && !g->ops[i].backward)
			first_layer_op = i;
	const LProg *lp = low->progs[0];
	char *own_kernel = calloc((size_t)g->nops, 1); /* ops lowered to a kernel of their own */
	if (!own_kernel)
		ICE("out of memory");
	for (int j = 0; j < lp->nk; j++)
		if (lp->k[j].op >= 0)
			own_kernel[lp->k[j].op] = 1;
	for (int j = 0; j < lp->nk; j++) {
		const Kernel *k = &lp->k[j];
		Phase ph = k->phase;
		bool step = ph == PH_STEP_BEGIN || ph == PH_STEP, fwd = ph == PH_PREPARE_F || ph == PH_FORWARD;
		if (!step && !fwd && ph != PH_PREPARE_B && ph != PH_BACKWARD)
			continue;
		int part = kernel_part(lp, k, own_kernel, first_layer_op);
		if (part < 0)
			continue;
		double times = step || k->only_last_micro ? 1 : m;
		ExplainPart *o = &out[part];
		if (kernel_classes[k->kind] == KC_COMPUTE && !k->ncomm)
			*(step ? &o->update : fwd ? &o->fwd : &o->bwd) += kernel_seconds(g->ps, lp, k) * times;
		for (int c = 0; c < k->ncomm && !step; c++)
			*(fwd ? &o->fwd_comm : &o->bwd_comm) += comm_floor(g->ps, &k->comm[c]) * times;
	}
	free(own_kernel);
	part_memory(g, low, first_layer_op, out);
	return true;
}

/* ---------------------------------------------------------------- printing */

static const char *human(double b, char *buf, size_t n)
{
	const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int u = 0;
	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
	return buf;
}

const char *explain_bytes(double b, char *buf, size_t n)
{
	return human(b, buf, n);
}

static const char *human_count(double x, char *buf, size_t n)
{
	const char *units[] = {"", " K", " M", " G", " T", " P", " E"};
	int u = 0;
	while (fabs(x) >= 1000 && u < 6) {
		x /= 1000;
		u++;
	}
	snprintf(buf, n, u ? "%.2f%s" : "%.0f%s", x, units[u]);
	return buf;
}

static const char *const compressor_names[] = {"none", "bf16", "fp16", "topk", "powersgd"};

/* The sync strategy, for plans other than plain strict sync (docs/sync.md). */
static void sync_line(FILE *out, const PlanSpec *ps, const StateRecord *st)
{
	int a = st->sync_axis;
	const char *axis = a >= 0 ? ps->axes[a].name : "?";
	if (st->sync == SYNC_ASYNC)
		fprintf(out, "  sync async, staleness %d: the master is coordinate 0 of '%s' and computes too; workers compute on "
			     "parameters at most %d update%s old\n",
			ps->staleness, axis, ps->staleness, ps->staleness == 1 ? "" : "s");
	else if (st->sync == SYNC_LOCAL_SGD && ps->outer != OUTER_NONE)
		fprintf(out, "  sync local_sgd: replicas on '%s' average every %d step%s through outer %s(lr = %g, momentum = %g)\n",
			axis, ps->every, ps->every == 1 ? "" : "s", ps->outer == OUTER_NESTEROV ? "nesterov" : "sgd", ps->outer_lr,
			ps->outer_momentum);
	else if (st->sync == SYNC_LOCAL_SGD)
		fprintf(out, "  sync local_sgd: replicas on '%s' average their parameters every %d step%s\n", axis, ps->every,
			ps->every == 1 ? "" : "s");
	else if (ps->compress == COMPRESS_TOPK)
		fprintf(out, "  sync strict, compress = topk(%g) on '%s'%s\n", ps->topk_ratio, axis,
			ps->error_feedback ? ", error feedback" : "");
	else if (ps->compress == COMPRESS_POWERSGD)
		fprintf(out, "  sync strict, compress = powersgd(rank = %d) on '%s'%s\n", ps->powersgd_rank, axis,
			ps->error_feedback ? ", error feedback" : "");
	else if (ps->compress != COMPRESS_NONE)
		fprintf(out, "  sync strict, compress = %s on '%s'%s\n", compressor_names[ps->compress], axis,
			ps->error_feedback ? ", error feedback" : "");
}

static const char *role_name(const Report *rep, const Role *r, char *buf, size_t n)
{
	const char *who = r->role == RANKROLE_MASTER ? "master, " : r->role == RANKROLE_WORKER ? "workers, " : "";
	if (rep->g->nstages > 1)
		snprintf(buf, n, "stage %d (%s%d rank%s from %d)", r->stage, who, r->nranks, r->nranks == 1 ? "" : "s",
			 r->first_rank);
	else
		snprintf(buf, n, "%s%d rank%s%s", who, r->nranks, r->nranks == 1 ? "" : "s",
			 r->role == RANKROLE_ANY ? " alike" : "");
	return buf;
}

static const char *schedule_name(PipeSchedule s)
{
	return s == SCHED_GPIPE ? "gpipe" : s == SCHED_1F1B ? "1f1b" : s == SCHED_INTERLEAVED ? "interleaved" : "none";
}

static void moe_text(FILE *out, const Report *rep);
static void moe_json(FILE *out, const Report *rep);

static void print_text(FILE *out, const Report *rep)
{
	const PlanSpec *ps = rep->ps;
	const Graph *g = rep->g;
	char b1[64], b2[64], b3[64];
	fprintf(out, "plan %s for %s: %d rank%s (", ps->plan->name, ps->model->name, ps->world, ps->world == 1 ? "" : "s");
	for (int a = 0; a < ps->naxes; a++)
		fprintf(out, "%s%s = %d", a ? " x " : "", ps->axes[a].name, ps->axes[a].size);
	fprintf(out, ")\n");
	fprintf(out, "  batch %lld in %d micro-batch%s, %s, zero %d, recompute %s\n", ps->batch,
		ps->micro_batches, ps->micro_batches == 1 ? "" : "es",
		ps->param_dtype == ps->master_dtype ? dtype_name(ps->param_dtype) : arena_printf(g->arena, "%s with %s master weights", dtype_name(ps->param_dtype), dtype_name(ps->master_dtype)),
		ps->zero_stage, ps->recompute == RECOMPUTE_FULL ? "full" : ps->recompute == RECOMPUTE_SELECTIVE ? "selective" : "none");
	const StateRecord *st = &rep->low->state;
	sync_line(out, ps, st);
	fprintf(out, "  parameters %s (%s)\n", human_count((double)rep->params_total, b1, sizeof b1),
		human((double)rep->params_total * dtype_bytes(ps->param_dtype), b2, sizeof b2));
	if (rep->params_frozen || rep->params_buffers) { /* they have no gradients and no optimizer state */
		char c1[32], c2[32], c3[32];
		fprintf(out, "    of which frozen %s, buffers %s: no gradients, no optimizer state; trained %s\n",
			human_count((double)rep->params_frozen, c1, sizeof c1), human_count((double)rep->params_buffers, c2, sizeof c2),
			human_count((double)(rep->params_total - rep->params_frozen - rep->params_buffers), c3, sizeof c3));
	}
	fputc('\n', out);
	for (int i = 0; i < rep->nroles; i++) {
		const Role *r = &rep->roles[i];
		char name[128];
		fprintf(out, "%s\n", role_name(rep, r, name, sizeof name));
		fprintf(out, "  %-22s %12s\n", "parameters", human((double)r->params, b1, sizeof b1));
		fprintf(out, "  %-22s %12s\n", "gradients", human((double)r->grads, b1, sizeof b1));
		fprintf(out, "  %-22s %12s\n", "optimizer states", human((double)r->optim, b1, sizeof b1));
		if (rep->runnable) {
			const LProg *p = r->lp;
			double buffers = (double)p->state_bytes[SC_BUFFER];
			fprintf(out, "  %-22s %12s   (loss, gradient norm, clipping)\n", "metrics",
				human((double)r->prog_metric - buffers, b1, sizeof b1));
			if (buffers > 0) /* what the sync strategies keep (docs/sync.md) */
				fprintf(out, "  %-22s %12s   (%s)\n", "sync buffers", human(buffers, b1, sizeof b1),
					st->sync == SYNC_ASYNC ? "messages in flight, staleness + 1 or + 2 of them"
								: "error feedback, PowerSGD's Q factors");
			if (p->nslots == 1 && p->ninbox == 0)
				fprintf(out, "  %-22s %12s   (one micro-batch's forward and backward)\n", "activations",
					human((double)r->act, b1, sizeof b1));
			else
				fprintf(out, "  %-22s %12s   (%d slot%s of %s for the micro-batches in flight%s)\n", "activations",
					human((double)r->act, b1, sizeof b1), p->nslots, p->nslots == 1 ? "" : "s",
					human((double)p->slot_bytes, b2, sizeof b2),
					p->ninbox ? arena_printf(g->arena, ", %d receive inbox%s of %s", p->ninbox,
								 p->ninbox == 1 ? "" : "es", human((double)p->inbox_bytes, b3, sizeof b3))
						  : "");
			fprintf(out, "  %-22s %12s\n", "working memory", human((double)r->work, b1, sizeof b1));
			fprintf(out, "  %-22s %12s   (what the program allocates: state %s + arena %s)\n", "peak",
				human((double)r->peak, b1, sizeof b1), human((double)r->prog_state, b2, sizeof b2), human((double)r->prog_arena, b3, sizeof b3));
		} else {
			fprintf(out, "  %-22s %12s   (%d micro-batch%s in flight, %s each)\n", "activations",
				human((double)r->act, b1, sizeof b1), r->inflight, r->inflight == 1 ? "" : "es",
				human((double)r->act_micro / (g->sched ? g->sched->chunks : 1), b2, sizeof b2));
			fprintf(out, "  %-22s %12s\n", "working memory", human((double)r->work, b1, sizeof b1));
			fprintf(out, "  %-22s %12s\n", "peak", human((double)r->peak, b1, sizeof b1));
		}
		if (r->host > 0 && rep->runnable)
			fprintf(out, "  %-22s %12s   (%s%s%s%s%s; pinned on a GPU)\n", "host memory", human((double)r->host, b1, sizeof b1),
				st->offload_optimizer == PLACE_DISK   ? "the optimizer's staging: two records, gradient and parameter copies"
				: st->offload_optimizer == PLACE_HOST ? "the optimizer state, gradient and parameter copies"
								      : "",
				st->offload_optimizer && st->offload_params == PLACE_HOST ? ", " : "",
				st->offload_params == PLACE_HOST ? "the parameter chunks" : "",
				(st->offload_optimizer || st->offload_params == PLACE_HOST) && st->offload_activations == PLACE_HOST ? ", " : "",
				st->offload_activations == PLACE_HOST ? "the saved activations of the micro-batches in flight" : "");
		else if (r->host > 0)
			fprintf(out, "  %-22s %12s\n", "offloaded to host", human((double)r->host, b1, sizeof b1));
		if (r->disk > 0)
			fprintf(out, "  %-22s %12s%s\n", "offloaded to disk", human((double)r->disk, b1, sizeof b1),
				rep->runnable ? "   (the optimizer state file of each rank)" : "");
		fprintf(out, "  %-22s %12s\n", "FLOPs per step", human_count(r->flops, b1, sizeof b1));
		if (r->ncomm) {
			fprintf(out, "  communication per step:\n");
			fprintf(out, "    %-15s %-10s %-10s %10s %12s %12s\n", "collective", "axis", "phase", "calls", "bytes",
				"wire bytes");
			for (int k = 0; k < r->ncomm; k++) {
				const CommRow *c = &r->comm[k];
				const char *axis = c->pair ? "tied pair" : c->axis >= 0 ? ps->axes[c->axis].name : "?";
				fprintf(out, "    %-15s %-10s %-10s %10.4g %12s %12s\n", c->bound ? "all_to_all_v" : op_names[c->kind],
					axis, c->phase, c->calls,
					human(per_step_value(c->bytes, c->den), b1, sizeof b1),
					human(per_step_value(c->wire, c->den), b2, sizeof b2));
			}
			for (int k = 0; k < r->ncomm; k++)
				if (r->comm[k].bound) {
					fprintf(out, "    (all_to_all_v: at most; dropless experts exchange the row counts, then "
						     "only the rows their routing makes)\n");
					break;
				}
		}
		fputc('\n', out);
	}
	if (g->nstages > 1)
		fprintf(out, "pipeline: %s, %d stages%s, bubble %.1f%% of compute time\n", schedule_name(ps->schedule),
			g->nstages, g->sched && g->sched->chunks > 1 ? arena_printf(g->arena, " x %d chunks", g->sched->chunks) : "",
			100 * rep->bubble);
	fprintf(out, "model FLOPs per step: %s\n", human_count(rep->model_flops, b3, sizeof b3));
	fprintf(out, "estimated step time: %s (micro-batches %s, update %s) on %s\n",
		human_time(rep->est_step, b1, sizeof b1), human_time(rep->est_pipeline, b2, sizeof b2),
		human_time(rep->est_update, b3, sizeof b3), device_current()->name);
	if (g->has_moe)
		moe_text(out, rep);
}

static void json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c < 32)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

static void print_json(FILE *out, const Report *rep)
{
	const PlanSpec *ps = rep->ps;
	const Graph *g = rep->g;
	fprintf(out, "{\n  \"plan\": ");
	json_str(out, ps->plan->name);
	fprintf(out, ",\n  \"model\": ");
	json_str(out, ps->model->name);
	fprintf(out, ",\n  \"world\": %d,\n  \"mesh\": {", ps->world);
	for (int a = 0; a < ps->naxes; a++) {
		fprintf(out, "%s", a ? ", " : "");
		json_str(out, ps->axes[a].name);
		fprintf(out, ": %d", ps->axes[a].size);
	}
	fprintf(out, "},\n  \"batch\": %lld,\n  \"micro_batches\": %d,\n  \"zero\": %d,\n", ps->batch, ps->micro_batches,
		ps->zero_stage);
	fprintf(out, "  \"parameters\": %lld,\n  \"model_flops_per_step\": %.6g,\n", rep->params_total, rep->model_flops);
	if (rep->params_frozen || rep->params_buffers)
		fprintf(out, "  \"frozen_parameters\": %lld,\n  \"buffer_parameters\": %lld,\n", rep->params_frozen,
			rep->params_buffers);
	fprintf(out, "  \"estimated_step_s\": {\"step\": %.6g, \"micro_batches\": %.6g, \"update\": %.6g},\n", rep->est_step,
		rep->est_pipeline, rep->est_update);
	fprintf(out, "  \"pipeline\": {\"axis\": ");
	json_str(out, ps->pipe_axis >= 0 ? ps->axes[ps->pipe_axis].name : "");
	fprintf(out, ", \"schedule\": \"%s\", \"stages\": %d, \"chunks\": %d, \"bubble_fraction\": %.6f},\n",
		schedule_name(ps->schedule), g->nstages, g->sched ? g->sched->chunks : 1, rep->bubble);
	static const char *const modes[] = {"strict", "local_sgd", "async"};
	static const char *const outers[] = {"none", "sgd", "nesterov"};
	const StateRecord *st = &rep->low->state;
	fprintf(out, "  \"sync\": {\"mode\": \"%s\", \"axis\": ", modes[st->sync]);
	json_str(out, st->sync_axis >= 0 ? ps->axes[st->sync_axis].name : "");
	fprintf(out, ", \"compress\": \"%s\", \"error_feedback\": %s, \"every\": %d, \"outer\": \"%s\", \"staleness\": %d},\n",
		compressor_names[ps->compress], ps->error_feedback ? "true" : "false", ps->every, outers[ps->outer],
		ps->staleness);
	if (g->has_moe)
		moe_json(out, rep);
	fprintf(out, "  \"roles\": [\n");
	for (int i = 0; i < rep->nroles; i++) {
		const Role *r = &rep->roles[i];
		fprintf(out, "    {\"stage\": %d, \"role\": \"%s\", \"ranks\": %d, \"first_rank\": %d,\n", r->stage,
			r->role == RANKROLE_MASTER ? "master" : r->role == RANKROLE_WORKER ? "worker" : "all", r->nranks,
			r->first_rank);
		fprintf(out,
			"     \"bytes\": {\"parameters\": %lld, \"gradients\": %lld, \"optimizer\": %lld, \"model_states\": %lld, "
			"\"activations\": %lld, \"activations_per_micro_batch\": %lld, \"working\": %lld, \"peak\": %lld, "
			"\"host\": %lld, \"disk\": %lld},\n",
			r->params, r->grads, r->optim, r->params + r->grads + r->optim, r->act, r->act_micro, r->work, r->peak,
			r->host, r->disk);
		fprintf(out, "     \"inflight_micro_batches\": %d, \"flops_per_step\": %.6g,\n", r->inflight, r->flops);
		if (rep->runnable) {
			const LProg *p = r->lp;
			fprintf(out, "     \"program\": {\"arena\": %lld, \"state\": %lld, \"peak\": %lld, \"slots\": %d, "
				"\"slot_bytes\": %zu, \"inboxes\": %d, \"inbox_bytes\": %zu, \"transient_bytes\": %zu, \"state_by_kind\": {",
				r->prog_arena, r->prog_state, r->prog_arena + r->prog_state, p->nslots, p->slot_bytes, p->ninbox,
				p->inbox_bytes, p->transient_bytes);
			static const char *const kind_keys[SC_COUNT] = {"param", "grad", "optim", "master", "buffer", "metric", "offload"};
			for (int k = 0; k < SC_COUNT; k++)
				fprintf(out, "%s\"%s\": %zu", k ? ", " : "", kind_keys[k], p->state_bytes[k]);
			fprintf(out, "}, \"host\": %lld, \"disk\": %zu},\n", r->host, p->disk_bytes);
		}
		fprintf(out, "     \"activation_bytes_per_layer\": {");
		bool first = true;
		for (int l = 0; l < g->nlayers; l++) {
			if (g->layer_stage && g->layer_stage[l] != r->stage)
				continue;
			fprintf(out, "%s\"%d\": %lld", first ? "" : ", ", l, r->act_layer ? r->act_layer[l] : 0);
			first = false;
		}
		fprintf(out, "},\n     \"communication\": [");
		for (int k = 0; k < r->ncomm; k++) {
			const CommRow *c = &r->comm[k];
			fprintf(out, "%s\n       {\"collective\": \"%s\", \"axis\": ", k ? "," : "",
				c->bound ? "all_to_all_v" : op_names[c->kind]);
			json_str(out, c->pair ? "tied_pair" : c->axis >= 0 ? ps->axes[c->axis].name : "");
			fprintf(out, ", \"phase\": \"%s\", \"calls\": %.6g, \"bytes\": ", c->phase, c->calls);
			json_per_step(out, c->bytes, c->den);
			fprintf(out, ", \"wire_bytes\": ");
			json_per_step(out, c->wire, c->den);
			fputc('}', out);
		}
		fprintf(out, "%s]}%s\n", r->ncomm ? "\n     " : "", i + 1 < rep->nroles ? "," : "");
	}
	fprintf(out, "  ]\n}\n");
}

/* ------------------------------------------------------------------ mixture of experts */

/* One MoE layer as explain reports it (docs/moe.md): the routing the model asks for, the
 * dispatched buffer per micro-batch, and how the plan splits its experts: the axes that split the
 * expert dim of its expert weights (whose dispatch and combine move tokens there) and those that
 * split their hidden dim. */
typedef struct MoeLayer {
	const Op *router;
	long long experts, top_k, group, capacity, slots, dim, tokens;
	double aux, z;
	unsigned expert_axes, hidden_axes;
} MoeLayer;

static int moe_layers(const Graph *g, MoeLayer *out)
{
	int n = 0;
	char *in_layer = calloc((size_t)g->nvals + 1, 1);
	if (!in_layer)
		ICE("out of memory");
	for (int i = 0; i < g->nops; i++) {
		const Op *r = &g->ops[i];
		if (r->kind != OP_MOE_ROUTER || r->recompute || r->backward)
			continue;
		MoeLayer *m = &out[n++];
		memset(m, 0, sizeof *m);
		const Value *l = &g->vals[r->in[0]];
		m->router = r;
		m->experts = l->dim[l->rank - 1];
		m->top_k = r->n;
		m->group = r->moe_group;
		m->capacity = r->moe_capacity;
		m->tokens = value_elems(g, r->in[0]) / m->experts;
		memset(in_layer, 0, (size_t)g->nvals + 1);
		for (int j = i + 1; j < g->nops; j++) {
			const Op *op = &g->ops[j];
			if (op->backward)
				break;
			bool reads_route = op->nin > 1 && (op->in[op->nin - 1] == r->out[1] || op->in[1] == r->out[1]);
			if ((op->kind == OP_MOE_AUX_LOSS || op->kind == OP_MOE_Z_LOSS) && reads_route)
				*(op->kind == OP_MOE_AUX_LOSS ? &m->aux : &m->z) = op->f;
			if (op->kind == OP_MOE_DISPATCH && op->in[2] == r->out[1] && !m->slots) {
				m->slots = g->vals[op->out[0]].dim[1];
				m->dim = g->vals[op->out[0]].dim[2];
				in_layer[op->out[0]] = 1;
			} else if (op->nin && in_layer[op->in[0]] && op->nout &&
				   (op_classes[op->kind] == OPK_COLLECTIVE || op->kind == OP_SLICE)) {
				in_layer[op->out[0]] = 1;
			} else if (op->kind == OP_MATMUL && in_layer[op->in[0]]) {
				const Value *w = &g->vals[op->in[1]];
				for (int a = 0; a < g->ps->naxes; a++) {
					if (w->lay.on[a] == 0)
						m->expert_axes |= 1u << a;
					else if (w->lay.on[a] > 0)
						m->hidden_axes |= 1u << a;
				}
			}
		}
	}
	free(in_layer);
	return n;
}

static void moe_text(FILE *out, const Report *rep)
{
	const Graph *g = rep->g;
	const PlanSpec *ps = rep->ps;
	MoeLayer *ms = calloc((size_t)g->nops + 1, sizeof *ms);
	if (!ms)
		ICE("out of memory");
	int n = moe_layers(g, ms);
	fprintf(out, "mixture of experts: %d layer%s\n", n, n == 1 ? "" : "s");
	for (int i = 0; i < n; i++) {
		const MoeLayer *m = &ms[i];
		fprintf(out, "  %s: %lld experts, top %lld%s, ", m->router->scope && *m->router->scope ? m->router->scope : "(model)", m->experts,
			m->top_k, m->router->moe_normalize ? " (gates normalised)" : "");
		if (m->capacity)
			fprintf(out, "capacity %lld pairs per expert and sample of %lld tokens (dropped pairs pass through), ",
				m->capacity, m->group);
		else
			fprintf(out, "dropless, ");
		fprintf(out, "buffer [%lld, %lld, %lld] per micro-batch", m->experts, m->slots, m->dim);
		if (!m->capacity)
			fprintf(out, " (bound: an expert can take every token of the micro-batch)");
		fprintf(out, "; losses: load balancing x %g, z x %g\n", m->aux, m->z);
		fprintf(out, "    experts split over");
		bool any = false;
		for (int a = 0; a < ps->naxes; a++)
			if (m->expert_axes >> a & 1) {
				fprintf(out, "%s '%s'", any ? " and" : "", ps->axes[a].name);
				any = true;
			}
		if (!any)
			fprintf(out, " no axis (every rank holds every expert)");
		for (int a = 0; a < ps->naxes; a++)
			if (m->hidden_axes >> a & 1)
				fprintf(out, ", hidden units over '%s'", ps->axes[a].name);
		fprintf(out, "\n");
	}
	free(ms);
}

static void moe_json(FILE *out, const Report *rep)
{
	const Graph *g = rep->g;
	const PlanSpec *ps = rep->ps;
	MoeLayer *ms = calloc((size_t)g->nops + 1, sizeof *ms);
	if (!ms)
		ICE("out of memory");
	int n = moe_layers(g, ms);
	fprintf(out, "  \"moe\": [");
	for (int i = 0; i < n; i++) {
		const MoeLayer *m = &ms[i];
		fprintf(out, "%s\n    {\"scope\": ", i ? "," : "");
		json_str(out, m->router->scope ? m->router->scope : "");
		fprintf(out, ", \"experts\": %lld, \"top_k\": %lld, \"normalize\": %s, \"dropless\": %s, \"group\": %lld, "
			     "\"capacity\": %lld, \"buffer\": [%lld, %lld, %lld], \"aux_loss\": %g, \"z_loss\": %g, \"expert_axes\": [",
			m->experts, m->top_k, m->router->moe_normalize ? "true" : "false", m->capacity ? "false" : "true", m->group,
			m->capacity, m->experts, m->slots, m->dim, m->aux, m->z);
		bool any = false;
		for (int a = 0; a < ps->naxes; a++)
			if (m->expert_axes >> a & 1) {
				fprintf(out, "%s", any ? ", " : "");
				json_str(out, ps->axes[a].name);
				any = true;
			}
		fprintf(out, "], \"hidden_axes\": [");
		any = false;
		for (int a = 0; a < ps->naxes; a++)
			if (m->hidden_axes >> a & 1) {
				fprintf(out, "%s", any ? ", " : "");
				json_str(out, ps->axes[a].name);
				any = true;
			}
		fprintf(out, "]}");
	}
	fprintf(out, "%s],\n", n ? "\n  " : "");
	free(ms);
}

void explain(FILE *out, Graph *g, bool json, const Lowered *low)
{
	Report *rep = build_report(g, low);
	if (json)
		print_json(out, rep);
	else
		print_text(out, rep);
	free_report(rep);
}
