/* pipeline.c: pipeline parallelism: stage partition, point-to-point transfers and the schedule.
 *
 * Runs on the forward graph, before autodiff, so that the backward of every transfer is itself a
 * transfer and every stage's copy of a shared parameter gets its own gradient:
 *   1. Layers are assigned to stages: explicit `stages = [0..5, 6..11]` ranges, or the exact
 *      contiguous partition minimising the largest stage's cost (pipeline_partition), where a
 *      layer costs its parameters, its matmul FLOPs or 1 (balance = params, flops, uniform); with
 *      params or flops, half the cost outside the layers counts on the first stage and half on
 *      the last. Interleaved 1F1B splits the layers into stages x chunks pieces and gives piece c
 *      to stage c mod p (Narayanan et al. 2021). Ops before the first layer go to stage 0, ops
 *      after the last to the last stage.
 *   2. A parameter used on several stages (tied input/output embeddings) is copied to each of
 *      them; the copies' gradients are summed over the pipe axis by sync.c (Megatron's
 *      embedding group). An input used on several stages is loaded on each.
 *   3. A value consumed on another stage is sent there: a SEND on the producing stage and a RECV
 *      on the consuming one.
 *   4. The schedule table (GPipe, 1F1B, interleaved 1F1B) is built and walked to find the
 *      micro-batches each stage holds in flight; pipeline_bubble simulates it. */
#include "graph/graph.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static double layer_cost(const Graph *g, int layer, PipeBalance balance)
{
	double c = 0;
	for (int i = 0; i < g->nops; i++) {
		const Op *op = &g->ops[i];
		if (op->layer != layer)
			continue;
		if (balance == BALANCE_PARAMS && op->kind == OP_PARAM)
			c += (double)value_elems(g, op->out[0]);
		if (balance == BALANCE_FLOPS && op->kind == OP_MATMUL) {
			const Value *a = &g->vals[op->in[0]], *b = &g->vals[op->in[1]];
			c += 2.0 * (double)value_elems(g, op->in[0]) * (double)b->dim[b->rank - 1] * (a->rank ? 1 : 1);
		}
	}
	return c;
}

/* ---------------------------------------------------------------- stage partition */

/* The exact linear partition (the bottleneck problem; Pinar & Aykanat 2004), with end costs.
 *
 * A bound B is feasible when costs[0..n) splits into k contiguous non-empty parts of cost <= B,
 * part 0 carrying `first` and part k - 1 `last`. It is monotone in B, and exactly decided by a
 * greedy pass from the right: parts 1..k-1 each reach as far left as fits (galloping over the
 * prefix sums, never taking item 0), which leaves part 0 the shortest prefix any partition can,
 * and B is feasible iff that prefix fits. cover[m] records where m such parts reach. Part costs
 * are always computed by part_cost, so the test is monotone in floating point too, and a binary
 * search over the bit patterns of non-negative doubles (ordered like their values) finds the
 * least feasible double B* in at most 64 tests of O(k log(n / k)) each. Every partition within
 * B* has its largest part exactly B*.
 *
 * The cuts are then chosen left to right: the end of each part may be anything from cover[]
 * of the parts still to come (so that they can hold the rest) to as far as the part fits within
 * B* (leaving an item for each part to come); of those, the one whose part is nearest an even
 * share of what remains. So the largest part is optimal and the others are balanced too:
 * 100 equal layers on 8 stages give 12 and 13 layers, not six 13s, a 9 and a 13. */

typedef struct Partition {
	const double *sum; /* sum[i] = costs[0] + ... + costs[i - 1] */
	int n, k;
	double first, last;
	int *cover; /* cover[m]: where m parts (not part 0) reach from the right, at the last bound */
} Partition;

static double part_cost(const Partition *pt, int a, int b)
{
	double c = pt->sum[b] - pt->sum[a];
	if (a == 0)
		c += pt->first;
	if (b == pt->n)
		c += pt->last;
	return c;
}

/* The largest b in [a, lim] with part_cost(a, b) <= bound (a when item a alone does not fit). */
static int reach_right(const Partition *pt, int a, int lim, double bound)
{
	int lo = a, hi = lim + 1;
	for (int step = 1; a + step <= lim; step *= 2) {
		if (part_cost(pt, a, a + step) > bound) {
			hi = a + step;
			break;
		}
		lo = a + step;
	}
	while (hi - lo > 1) {
		int mid = lo + (hi - lo) / 2;
		if (part_cost(pt, a, mid) <= bound)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The least a in [lim, b] with part_cost(a, b) <= bound (b when item b - 1 alone does not fit). */
static int reach_left(const Partition *pt, int b, int lim, double bound)
{
	int hi = b, lo = lim - 1;
	for (int step = 1; b - step >= lim; step *= 2) {
		if (part_cost(pt, b - step, b) > bound) {
			lo = b - step;
			break;
		}
		hi = b - step;
	}
	while (hi - lo > 1) {
		int mid = lo + (hi - lo) / 2;
		if (part_cost(pt, mid, b) <= bound)
			hi = mid;
		else
			lo = mid;
	}
	return hi;
}

static bool partition_fits(Partition *pt, double bound)
{
	int e = pt->n;
	pt->cover[0] = e;
	for (int m = 1; m < pt->k; m++) {
		if (e > 1)
			e = reach_left(pt, e, 1, bound);
		pt->cover[m] = e;
	}
	return part_cost(pt, 0, e) <= bound;
}

static uint64_t double_bits(double x)
{
	uint64_t u;
	memcpy(&u, &x, sizeof u);
	return u;
}

static double bits_double(uint64_t u)
{
	double x;
	memcpy(&x, &u, sizeof x);
	return x;
}

void pipeline_partition(const double *costs, int n, int k, double first, double last, int *part_of)
{
	internal_assert(k >= 1 && k <= n);
	internal_assert(first >= 0 && last >= 0 && isfinite(first) && isfinite(last));
	double *sum = malloc(sizeof(double) * (size_t)(n + 1));
	int *cover = malloc(sizeof(int) * (size_t)k);
	if (!sum || !cover)
		ICE("out of memory");
	sum[0] = 0;
	for (int i = 0; i < n; i++) {
		internal_assert(costs[i] >= 0 && isfinite(costs[i]));
		sum[i + 1] = sum[i] + costs[i];
	}
	Partition pt = {sum, n, k, first, last, cover};

	/* B* lies between the costliest item alone in its part and everything in one part */
	double lower = part_cost(&pt, 0, 1);
	for (int i = 1; i < n; i++) {
		double c = part_cost(&pt, i, i + 1);
		if (c > lower)
			lower = c;
	}
	double upper = part_cost(&pt, 0, n);
	if (upper < lower)
		upper = lower;
	if (!partition_fits(&pt, upper))
		ICE("pipeline partition: everything in one part is not a feasible bound");
	uint64_t lo = double_bits(lower), hi = double_bits(upper);
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (partition_fits(&pt, bits_double(mid)))
			hi = mid;
		else
			lo = mid + 1;
	}
	double bound = bits_double(hi);
	if (!partition_fits(&pt, bound))
		ICE("pipeline partition: the least feasible bound does not fit");

	int a = 0; /* start of part j - 1 */
	for (int j = 1; j < k; j++) {
		int left = k - j; /* parts after part j - 1 */
		int lo_b = cover[left] > a + 1 ? cover[left] : a + 1;
		int hi_b = reach_right(&pt, a, n - left, bound);
		internal_assert(lo_b <= hi_b);
		double share = part_cost(&pt, a, n) / (left + 1);
		int b = lo_b, top = hi_b; /* the least end in [lo_b, hi_b] reaching the share, else hi_b */
		while (b < top) {
			int mid = b + (top - b) / 2;
			if (part_cost(&pt, a, mid) >= share)
				top = mid;
			else
				b = mid + 1;
		}
		if (b > lo_b && share - part_cost(&pt, a, b - 1) <= part_cost(&pt, a, b) - share)
			b--;
		for (int i = a; i < b; i++)
			part_of[i] = j - 1;
		a = b;
	}
	internal_assert(part_cost(&pt, a, n) <= bound);
	for (int i = a; i < n; i++)
		part_of[i] = k - 1;
	free(sum);
	free(cover);
}

static bool assign_layers(Graph *g)
{
	PlanSpec *ps = g->ps;
	int L = g->nlayers, p = g->nstages, v = ps->chunks > 1 ? ps->chunks : 1;
	g->layer_stage = arena_alloc(g->arena, sizeof(int) * (size_t)(L + 1));
	g->layer_chunk = arena_alloc(g->arena, sizeof(int) * (size_t)(L + 1));
	if (L < p * v) {
		diag_error(ps->src, ps->pipeline_loc, "%d layers cannot fill %d pipeline stages%s", L, p * v,
			   v > 1 ? " x chunks" : "");
		diag_note_plain("use fewer stages or more layers");
		return false;
	}
	if (ps->nranges) {
		for (int s = 0; s < ps->nranges; s++)
			for (int l = ps->range_lo[s]; l <= ps->range_hi[s] && l < L; l++)
				g->layer_stage[l] = s;
		return true;
	}
	if (v > 1) {
		if (L % (p * v)) {
			diag_error(ps->src, ps->pipeline_loc,
				   "interleaved schedule needs the %d layers divisible by stages x chunks = %d", L, p * v);
			return false;
		}
		int per = L / (p * v);
		for (int l = 0; l < L; l++) {
			int c = l / per;
			g->layer_stage[l] = c % p;
			g->layer_chunk[l] = c / p;
		}
		return true;
	}
	double *costs = calloc((size_t)L, sizeof(double));
	if (!costs)
		ICE("out of memory");
	double first = 0, last = 0;
	if (ps->balance == BALANCE_UNIFORM) {
		for (int l = 0; l < L; l++)
			costs[l] = 1;
	} else {
		for (int l = 0; l < L; l++)
			costs[l] = layer_cost(g, l, ps->balance);
		first = layer_cost(g, -1, ps->balance) / 2;
		last = first;
	}
	pipeline_partition(costs, L, p, first, last, g->layer_stage);
	free(costs);
	return true;
}

static int first_layer_op(const Graph *g)
{
	for (int i = 0; i < g->nops; i++)
		if (g->ops[i].layer >= 0)
			return i;
	return g->nops;
}

/* ---------------------------------------------------------------- schedule tables */

static void build_schedule(Graph *g)
{
	PlanSpec *ps = g->ps;
	int p = g->nstages, m = ps->micro_batches > 0 ? ps->micro_batches : 1;
	int v = ps->schedule == SCHED_INTERLEAVED && ps->chunks > 1 ? ps->chunks : 1;
	Schedule *sc = arena_alloc(g->arena, sizeof *sc);
	sc->stages = p;
	sc->chunks = v;
	sc->micro = m;
	sc->table = arena_alloc(g->arena, sizeof(Action *) * (size_t)p);
	sc->inflight = arena_alloc(g->arena, sizeof(int) * (size_t)p);
	int n = m * v; /* forward units per stage */
	for (int s = 0; s < p; s++) {
		Action *t = arena_alloc(g->arena, sizeof(Action) * (size_t)(2 * n));
		sc->table[s] = t;
		int k = 0;
		if (ps->schedule == SCHED_GPIPE && p > 1) {
			for (int i = 0; i < m; i++)
				t[k++] = (Action){ACT_FORWARD, i, 0};
			for (int i = 0; i < m; i++)
				t[k++] = (Action){ACT_BACKWARD, i, 0};
		} else {
			/* unit u of the forward (or backward) sequence: Megatron's interleaved order, which for
			 * v = 1 is plain 1F1B */
			int warmup;
			if (v == 1)
				warmup = p - s - 1;
			else
				warmup = (p - s - 1) * 2 + (v - 1) * p;
			if (warmup > n)
				warmup = n;
			int f = 0, b = 0;
#define FWD_ACTION(u) (Action){ACT_FORWARD, ((u) / (p * v)) * p + (u) % p, ((u) / p) % v}
#define BWD_ACTION(u) (Action){ACT_BACKWARD, ((u) / (p * v)) * p + (u) % p, v - 1 - ((u) / p) % v}
			if (v == 1) {
				for (; f < warmup; f++)
					t[k++] = (Action){ACT_FORWARD, f, 0};
				while (f < n) {
					t[k++] = (Action){ACT_FORWARD, f++, 0};
					t[k++] = (Action){ACT_BACKWARD, b++, 0};
				}
				while (b < n)
					t[k++] = (Action){ACT_BACKWARD, b++, 0};
			} else {
				for (; f < warmup; f++)
					t[k++] = FWD_ACTION(f);
				while (f < n) {
					t[k++] = FWD_ACTION(f);
					f++;
					t[k++] = BWD_ACTION(b);
					b++;
				}
				while (b < n) {
					t[k++] = BWD_ACTION(b);
					b++;
				}
			}
#undef FWD_ACTION
#undef BWD_ACTION
		}
		int live = 0, most = 0;
		for (int i = 0; i < 2 * n; i++) {
			live += t[i].kind == ACT_FORWARD ? 1 : -1;
			if (live > most)
				most = live;
		}
		sc->inflight[s] = most;
	}
	g->sched = sc;
}

/* When action `next` of stage s can start: its value's arrival (a transfer later from another
 * stage), or -1 while the action it depends on has not finished. */
static double ready_at(const Schedule *sc, int s, int next, const double *fdone, const double *bdone, double xfer)
{
	int p = sc->stages, m = sc->micro, nvs = p * sc->chunks;
	Action a = sc->table[s][next];
	int vs = a.chunk * p + s;
	double dep = a.kind == ACT_FORWARD ? (vs == 0 ? 0 : fdone[(vs - 1) * m + a.micro])
					   : (vs == nvs - 1 ? fdone[vs * m + a.micro] : bdone[(vs + 1) * m + a.micro]);
	if (dep < 0)
		return -1;
	bool remote = a.kind == ACT_FORWARD ? vs > 0 : vs < nvs - 1;
	return remote && p > 1 ? dep + xfer : dep;
}

static double action_cost(const Schedule *sc, int s, int next, const double *fcost, const double *bcost)
{
	Action a = sc->table[s][next];
	return (a.kind == ACT_FORWARD ? fcost : bcost)[s * sc->chunks + a.chunk];
}

/* Each stage runs its table in order, an action starting when the stage is free and its value has
 * arrived and taking its cost (list scheduling). */
static void run_listed(const Schedule *sc, const double *fcost, const double *bcost, double xfer, double *fdone,
		       double *bdone, double *clock, double *start_out, double *end_out)
{
	int p = sc->stages, n = sc->micro * sc->chunks;
	int *next = calloc((size_t)p, sizeof(int));
	if (!next)
		ICE("out of memory");
	int remaining = p * 2 * n;
	while (remaining > 0) {
		bool progress = false;
		for (int s = 0; s < p; s++) {
			while (next[s] < 2 * n) {
				double dep = ready_at(sc, s, next[s], fdone, bdone, xfer);
				if (dep < 0)
					break;
				Action a = sc->table[s][next[s]];
				double start = clock[s] > dep ? clock[s] : dep;
				clock[s] = start + action_cost(sc, s, next[s], fcost, bcost);
				(a.kind == ACT_FORWARD ? fdone : bdone)[(a.chunk * p + s) * sc->micro + a.micro] = clock[s];
				if (start_out)
					start_out[s * 2 * n + next[s]] = start;
				if (end_out)
					end_out[s * 2 * n + next[s]] = clock[s];
				next[s]++;
				remaining--;
				progress = true;
			}
		}
		if (!progress)
			ICE("pipeline schedule deadlocks");
	}
	free(next);
}

/* The same schedule where the stages' ranks share cores (speed[k]: how much faster than its cost
 * an action runs while k stages compute). Time goes from event to event, an action ending or a
 * value arriving, and every running action progresses at speed[k] in between (processor sharing);
 * with every speed 1 it is run_listed's schedule. */
static void run_shared(const Schedule *sc, const double *fcost, const double *bcost, double xfer, const double *speed,
		       double *fdone, double *bdone, double *clock, double *start_out, double *end_out)
{
	int p = sc->stages, n = sc->micro * sc->chunks;
	int *next = calloc((size_t)p, sizeof(int));
	bool *running = calloc((size_t)p, sizeof(bool));
	double *left = calloc((size_t)p, sizeof(double)), *began = calloc((size_t)p, sizeof(double));
	if (!next || !running || !left || !began)
		ICE("out of memory");
	int remaining = p * 2 * n;
	double now = 0;
	while (remaining > 0) {
		int busy = 0;
		for (int s = 0; s < p; s++) {
			if (!running[s] && next[s] < 2 * n) {
				double r = ready_at(sc, s, next[s], fdone, bdone, xfer);
				if (r >= 0 && r <= now) {
					running[s] = true;
					left[s] = action_cost(sc, s, next[s], fcost, bcost);
					began[s] = now;
				}
			}
			busy += running[s];
		}
		double rate = busy ? speed[busy] : 1, dt = INFINITY;
		int first = -1; /* the running action that ends first */
		for (int s = 0; s < p; s++) {
			if (running[s] && left[s] / rate < dt) {
				dt = left[s] / rate;
				first = s;
			} else if (!running[s] && next[s] < 2 * n) {
				double r = ready_at(sc, s, next[s], fdone, bdone, xfer);
				if (r > now && r - now < dt) {
					dt = r - now;
					first = -1;
				}
			}
		}
		if (dt == INFINITY)
			ICE("pipeline schedule deadlocks");
		now += dt;
		for (int s = 0; s < p; s++) {
			if (!running[s])
				continue;
			left[s] = s == first ? 0 : left[s] - dt * rate;
			if (left[s] > 1e-12 * action_cost(sc, s, next[s], fcost, bcost))
				continue;
			Action a = sc->table[s][next[s]];
			clock[s] = now;
			(a.kind == ACT_FORWARD ? fdone : bdone)[(a.chunk * p + s) * sc->micro + a.micro] = now;
			if (start_out)
				start_out[s * 2 * n + next[s]] = began[s];
			if (end_out)
				end_out[s * 2 * n + next[s]] = now;
			running[s] = false;
			next[s]++;
			remaining--;
		}
	}
	free(next);
	free(running);
	free(left);
	free(began);
}

static double simulate(const Graph *g, const double *fcost, const double *bcost, double xfer, const double *speed,
		       double *makespan_out, double *busiest_out, double *start_out, double *end_out)
{
	const Schedule *sc = g->sched;
	int p = sc ? sc->stages : 1, v = sc ? sc->chunks : 1, m = sc ? sc->micro : 1;
	int nvs = p * v; /* virtual stages: chunk c of stage s is virtual stage c * p + s */
	double *fdone = malloc(sizeof(double) * (size_t)(nvs * m));
	double *bdone = malloc(sizeof(double) * (size_t)(nvs * m));
	double *clock = calloc((size_t)p, sizeof(double));
	if (!fdone || !bdone || !clock)
		ICE("out of memory");
	for (int i = 0; i < nvs * m; i++)
		fdone[i] = bdone[i] = -1;
	if (sc && speed)
		run_shared(sc, fcost, bcost, xfer, speed, fdone, bdone, clock, start_out, end_out);
	else if (sc)
		run_listed(sc, fcost, bcost, xfer, fdone, bdone, clock, start_out, end_out);
	double makespan = 0, ideal = 0;
	for (int s = 0; s < p; s++) {
		if (clock[s] > makespan)
			makespan = clock[s];
		double busy = 0;
		for (int c = 0; c < v; c++)
			busy += m * (fcost[s * v + c] + bcost[s * v + c]);
		if (busy > ideal)
			ideal = busy;
	}
	free(fdone);
	free(bdone);
	free(clock);
	if (makespan_out)
		*makespan_out = makespan;
	if (busiest_out)
		*busiest_out = ideal;
	return ideal > 0 ? makespan / ideal - 1 : 0;
}

double pipeline_simulate(const Graph *g, const double *fcost, const double *bcost, double xfer, const double *speed,
			 double *makespan_out, double *busiest_out)
{
	return simulate(g, fcost, bcost, xfer, speed, makespan_out, busiest_out, NULL, NULL);
}

void pipeline_timeline(const Graph *g, const double *fcost, const double *bcost, double xfer, const double *speed,
		       double *start, double *end)
{
	simulate(g, fcost, bcost, xfer, speed, NULL, NULL, start, end);
}

double pipeline_bubble(const Graph *g, const double *fcost, const double *bcost)
{
	if (!g->sched || g->sched->stages <= 1)
		return 0;
	return pipeline_simulate(g, fcost, bcost, 0, NULL, NULL, NULL);
}

/* ---------------------------------------------------------------- the pass */

bool pipeline(Graph *g)
{
	PlanSpec *ps = g->ps;
	g->nstages = ps->pipe_axis >= 0 ? ps->axes[ps->pipe_axis].size : 1;
	if (g->nstages <= 1) {
		g->nstages = 1;
		g->layer_stage = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nlayers + 1));
		g->layer_chunk = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nlayers + 1));
		build_schedule(g);
		return true;
	}
	if (g->nlayers == 0) {
		diag_error(ps->src, ps->pipeline_loc, "pipeline needs a model with a top-level 'repeat' of layers");
		return false;
	}
	if (!assign_layers(g))
		return false;
	int p = g->nstages;
	int first = first_layer_op(g);
	/* stages of compute ops */
	for (int i = 0; i < g->nops; i++) {
		Op *op = &g->ops[i];
		if (op->kind == OP_PARAM || op->kind == OP_INPUT)
			continue;
		op->stage = op->layer >= 0 ? g->layer_stage[op->layer] : i < first ? 0 : p - 1;
	}
	/* sources go where they are used; a source used on several stages is copied per stage */
	int nv0 = g->nvals;
	int *copy_on = malloc(sizeof(int) * (size_t)nv0 * (size_t)p);
	int *home = malloc(sizeof(int) * (size_t)nv0);
	if (!copy_on || !home)
		ICE("out of memory");
	for (int i = 0; i < nv0 * p; i++)
		copy_on[i] = -1;
	for (int i = 0; i < nv0; i++)
		home[i] = -1;
	for (int i = 0; i < g->nops; i++) {
		Op *op = &g->ops[i];
		if (op->kind == OP_PARAM || op->kind == OP_INPUT)
			continue;
		for (int k = 0; k < op->nin; k++) {
			int v = op->in[k];
			int def = g->vals[v].def;
			if (def < 0 || (g->ops[def].kind != OP_PARAM && g->ops[def].kind != OP_INPUT))
				continue;
			if (home[v] < 0) {
				home[v] = op->stage;
				g->ops[def].stage = op->stage;
				copy_on[v * p + op->stage] = v;
			}
		}
	}
	/* rebuild the op list: source copies first, then SEND/RECV before consumers */
	OpList list = {0};
	int *sent = malloc(sizeof(int) * (size_t)nv0 * (size_t)p);
	if (!sent)
		ICE("out of memory");
	for (int i = 0; i < nv0 * p; i++)
		sent[i] = -1;
	for (int i = 0; i < g->nops; i++) {
		Op op = g->ops[i];
		if (op.kind == OP_PARAM || op.kind == OP_INPUT) {
			if (home[op.out[0]] < 0)
				op.stage = 0;
			oplist_add(g, &list, &op);
			continue;
		}
		for (int k = 0; k < op.nin; k++) {
			int v = op.in[k];
			if (v >= nv0)
				continue;
			int def = g->vals[v].def;
			const Op *prod = def >= 0 ? &g->ops[def] : NULL;
			bool source = prod && (prod->kind == OP_PARAM || prod->kind == OP_INPUT);
			int from = source ? home[v] : prod ? prod->stage : op.stage;
			if (from == op.stage)
				continue;
			if (source) {
				int c = copy_on[v * p + op.stage];
				if (c < 0) {
					/* a copy of the parameter (tied weights) or input on this stage */
					const Value *orig = &g->vals[v];
					c = graph_add_value(g, orig->dtype, orig->rank, orig->dim, (const char *const *)orig->dim_name);
					Value *cv = &g->vals[c];
					orig = &g->vals[v];
					cv->role = orig->role;
					cv->name = orig->name;
					cv->init_kind = orig->init_kind;
					cv->init_a = orig->init_a;
					cv->init_b = orig->init_b;
					cv->tied_to = v;
					Op sop = *prod;
					sop.out[0] = c;
					sop.stage = op.stage;
					oplist_add(g, &list, &sop);
					copy_on[v * p + op.stage] = c;
				}
				op.in[k] = c;
				continue;
			}
			int r = sent[v * p + op.stage];
			if (r < 0) {
				Op send;
				op_clear(&send);
				send.kind = OP_SEND;
				send.nin = 1;
				send.in[0] = v;
				send.stage = from;
				send.layer = prod->layer;
				send.axis = ps->pipe_axis;
				send.n = op.stage; /* destination stage */
				send.fwd_op = -1;
				send.loc = prod->loc;
				send.src = prod->src;
				send.coll_dim = send.coll_dim2 = -1;
				oplist_add(g, &list, &send);
				const Value *vv = &g->vals[v];
				r = graph_add_value(g, vv->dtype, vv->rank, vv->dim, (const char *const *)vv->dim_name);
				g->vals[r].role = g->vals[v].role;
				g->vals[r].name = g->vals[v].name;
				g->vals[r].layer = g->vals[v].layer;
				Op recv = send;
				recv.kind = OP_RECV;
				recv.nout = 1;
				recv.out[0] = r;
				recv.stage = op.stage;
				recv.n = from; /* source stage */
				oplist_add(g, &list, &recv);
				sent[v * p + op.stage] = r;
			}
			op.in[k] = r;
		}
		oplist_add(g, &list, &op);
	}
	free(copy_on);
	free(home);
	free(sent);
	graph_set_ops(g, &list);
	if (ps->schedule == SCHED_INTERLEAVED && ps->micro_batches % p) {
		diag_error(ps->src, ps->pipeline_loc,
			   "interleaved 1F1B needs micro_batches (%d) divisible by the %d pipeline stages", ps->micro_batches, p);
		return false;
	}
	build_schedule(g);
	return true;
}
