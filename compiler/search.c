/* search.c: `planc search` (issue 20): the fastest plan that fits, found before launch.
 *
 * It enumerates plans for a model and a number of ranks: data x pipe x (seq) x tensor degrees
 * whose product is the world, micro-batches dividing the local batch, the schedule (1f1b,
 * interleaved), ZeRO 0-3 over data, recompute none / selective / full, sequence parallelism on
 * the tensor axis. Each candidate is plan text: the file's source with the plan appended, parsed
 * and compiled in an arena of its own (the compiler's every static check, then explain's exact
 * per-rank memory and estimated step time on the chosen device). A candidate the checks refuse,
 * or whose peak memory exceeds --memory, is dropped; the rest are ranked by the estimate.
 *
 * Pruning (sound; docs/search.md proves each bound). Before the candidates it compiles reference
 * plans of the whole batch, once each: the one-rank plan per recompute mode (W: compute seconds of
 * the forward and backward phases, U: of the update, A: saved activations, P, G, O: model-state
 * bytes) and, for every tensor degree t, the tensor-only plan with and without sequence
 * parallelism (whether the checks pass it; W_t, C_t: its compute and its collectives' least
 * seconds; A_t). A candidate's ranks run the same kernels split d s ways by rows and sequence, p
 * ways by layers, m ways by micro-batches; anything a plan adds only adds. So its estimate is at
 * least the average stage's work ((T + C) / (d s p), T = max(W / t, W_t + (W - W_none) / t)) plus
 * its update (U / (t p), / d under ZeRO) plus the data-parallel gradients' least traffic; and for
 * 1f1b at least the pipeline's bubble bound X / (1 - (1 - 1/m)^p), X one micro-batch's work over
 * all stages (it holds for any stage balance). Its peak is at least the average rank's model
 * states plus its saved activations, and at least the activations of the micro-batches a stage
 * holds at once (min(p - s, m) under 1f1b). The same references read by part of the model
 * (explain_parts: the embedding, each layer, the head) give bounds per stage, since the layers of
 * each stage are known before compiling (uniform 1f1b partition, interleaved pieces): a stage's
 * time is at least micro-batch 0 reaching it, all its forwards and backwards, the last backward
 * leaving it, its update and its gradients' traffic; its memory at least its parts' states and the
 * chunks it holds in flight. Candidates are taken in the order of the time bound
 * and once k plans are known and the bound reaches the k-th best estimate, no later candidate can
 * enter the top k: the rest are skipped; one over --memory by the memory bound, or whose tensor-only
 * plan the checks refuse, is not compiled. --exhaustive compiles every candidate, and every
 * compiled candidate checks its bounds against its estimate and peak ("bounds violated N";
 * tests/search requires 0 and the same top k both ways).
 *
 * The candidates keep the statements of a base plan (--plan, or the file's first plan for the
 * model) other than the parallel ones: its precision, optimizer, sync options, data. */
#include "search.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { REC_NONE, REC_SELECTIVE, REC_FULL } Recompute;
typedef enum { SCH_NONE, SCH_1F1B, SCH_INTERLEAVED } SearchSchedule;

typedef struct Candidate {
	long long d, p, s, t, m;
	long long c, e; /* context-parallel degree (ctx axis); expert-parallel degree (e divides d) */
	bool offload;   /* the optimizer state offloaded to the host */
	int zero;
	Recompute rec;
	SearchSchedule sched;
	bool sp;
	double bound;     /* seconds: no plan of this recompute mode on this world is faster */
	double mem_bound; /* bytes: its busiest rank holds at least this much */
	long long index;  /* order of enumeration: ties in the bound keep it */
} Candidate;

typedef struct Result {
	Candidate c;
	ExplainSummary sum;
} Result;

/* The plan that splits the whole batch over `tensor = t` alone (no recompute): whether the checks
 * pass it, its compute seconds (W_t), its collectives' least seconds (C_t) and its saved
 * activations (A_t). */
typedef struct TensorPlan {
	bool known, ok;
	double compute, comm, comm_micro, act;
} TensorPlan;

/* What one rank of a tensor group costs over the whole batch for the parts of the model [0, j)
 * (part 0 before the layers, 1 + l layer l, L + 1 after them: explain_parts), as prefix sums
 * [nparts + 1], for one tensor degree, sequence parallelism and recompute mode: the larger of the
 * one-rank plan's figure split t ways and the tensor-only plan's (compute plus what recomputation
 * adds; its collectives' least seconds added). */
typedef struct PartSums {
	double *fwd, *bwd, *update, *act, *params, *grads, *optim;
} PartSums;

typedef struct Search {
	const char *path, *model, *name;
	char *src; /* the file's text */
	int srclen;
	Program *prog;
	Module *imports;
	char *base;        /* the base plan's statements kept, one per line */
	const char *batch_name, *for_clause;
	long long world, batch;
	double memory;
	int top;
	bool exhaustive, seq, ctx, offload; /* --seq, --ctx, --offload: enumerate those too */
	bool base_offloads;                 /* the base plan writes offload: candidates keep it */
	bool causal;                        /* the model has a fused causal attention (--ctx needs one) */
	bool ctx_ok[256], expert_ok[256];   /* per divisor of the world: the ctx-only, expert-only plan passes */
	double ref_compute[3]; /* W per recompute mode (0: unknown, bound 0) */
	double ref_update;     /* U (0: unknown or not a bound, see update_bounded) */
	double ref_act[3];     /* A per recompute mode: saved activations of the whole batch (0: unknown) */
	bool update_bounded;   /* the base plan updates every rank's own shard in its step */
	bool plain_sync;       /* the base plan writes no sync or offload: gradients reduced every step */
	double ref_params, ref_grads, ref_optim; /* the one-rank plan's model states (0: unknown) */
	long long tensor_degrees[256]; /* the divisors of the world */
	TensorPlan tensor[256][2];     /* the tensor-only plan of each, without and with sequence parallelism */
	int ntensor;
	int nlayers;                      /* the model's layers (-1: the one-rank plan did not compile) */
	ExplainPart *ref_parts[3];        /* the one-rank plan's costs by part, per recompute mode (or NULL) */
	ExplainPart *tensor_parts[256][2]; /* the tensor-only plans' (or NULL) */
	PartSums *sums[256][2][3];        /* built when first asked */
	int *split[256];                  /* per pipe degree: the first layer of each 1f1b stage, and L */
	Arena *scratch;                   /* each compile's arena, emptied after it (arena_reset) */
	long long region_ops;             /* forward ops in @recompute regions, in any reference (-1: none compiled) */
	bool selective_copied;            /* selective's one-rank figures are none's (reference_bounds) */
	long long compiled, refused, over_memory, pruned, pruned_memory, violations;
	long long refused_tensor; /* not compiled: the checks refuse their tensor-only plan */
	Result *best;
	int nbest;
} Search;

static double cpu_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- plan text */

static const char *const rec_names[] = {"none", "selective", "full"};

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
		va_end(ap);
		if (n < 0)
			ICE("vsnprintf failed");
		if (*len + (size_t)n < *cap) {
			*len += (size_t)n;
			return;
		}
		*cap = (*cap + (size_t)n) * 2;
		*buf = realloc(*buf, *cap);
		if (!*buf)
			ICE("out of memory");
	}
}

/* The plan text of a candidate (malloc'd). Axes of degree 1 are left out; tensor is innermost,
 * as Megatron-LM places it, so it stays within a node. */
static char *plan_text(const Search *S, const Candidate *c, const char *name)
{
	size_t len = 0, cap = 512;
	char *b = malloc(cap);
	if (!b)
		ICE("out of memory");
	b[0] = 0;
	append(&b, &len, &cap, "plan %s for %s {\n  mesh ", name, S->for_clause);
	const char *names[] = {"data", "expert", "pipe", "ctx", "seq", "tensor"};
	long long deg[] = {c->d / c->e, c->e, c->p, c->c, c->s, c->t};
	bool any = false;
	for (int i = 0; i < 6; i++)
		if (deg[i] > 1) {
			append(&b, &len, &cap, "%s%s = %lld", any ? ", " : "", names[i], deg[i]);
			any = true;
		}
	if (!any)
		append(&b, &len, &cap, "data = 1");
	append(&b, &len, &cap, "\n  batch %s = %lld", S->batch_name, S->batch);
	if (c->m > 1)
		append(&b, &len, &cap, ", micro_batches = %lld", c->m);
	append(&b, &len, &cap, "\n");
	if (c->d / c->e > 1)
		append(&b, &len, &cap, "  shard %s -> data\n", S->batch_name);
	if (c->e > 1)
		append(&b, &len, &cap, "  shard %s -> expert\n  use nn.expert_parallel(expert)\n", S->batch_name);
	if (c->t > 1)
		append(&b, &len, &cap, "  use nn.megatron(tensor)\n");
	if (c->sp)
		append(&b, &len, &cap, "  use nn.sequence_parallel(tensor)\n");
	if (c->c > 1)
		append(&b, &len, &cap, "  use nn.context_parallel(ctx)\n");
	if (c->s > 1)
		append(&b, &len, &cap, "  use nn.ulysses(seq)\n");
	if (c->sched != SCH_NONE)
		append(&b, &len, &cap, "  pipeline pipe: %s\n", c->sched == SCH_1F1B ? "1f1b" : "interleaved");
	if (c->zero > 0)
		append(&b, &len, &cap, "  zero %d over data\n", c->zero);
	if (c->offload)
		append(&b, &len, &cap, "  offload optimizer -> host\n");
	if (c->rec != REC_NONE)
		append(&b, &len, &cap, "  recompute %s\n", rec_names[c->rec]);
	append(&b, &len, &cap, "%s}\n", S->base);
	return b;
}

/* ---------------------------------------------------------------- compiling one candidate */

static int divisors(long long n, long long *out, int cap)
{
	int k = 0;
	for (long long i = 1; i <= n && k < cap; i++)
		if (n % i == 0)
			out[k++] = i;
	return k;
}


/* Compiles the file with `text` appended (every diagnostic silenced: a refused candidate is
 * counted, not reported); fills *sum and, when given, *totals. */
static bool evaluate(Search *S, const char *text, ExplainSummary *sum, ExplainTotals *totals, ExplainPart **parts)
{
	Arena *saved = S->prog->arena, *a = S->scratch; /* plan_arena_begin's, with the memory kept */
	S->prog->arena = a;
	size_t tl = strlen(text), n = (size_t)S->srclen + tl + 2;
	char *buf = arena_alloc(a, n);
	memcpy(buf, S->src, (size_t)S->srclen);
	buf[S->srclen] = '\n';
	memcpy(buf + S->srclen + 1, text, tl + 1);
	bool ok = false;
	Module *m = parse_module(a, S->path, buf, (int)(n - 1));
	if (m) {
		diag_index_lines(a, &m->src);
		module_index(a, m);
		m->next = S->imports;
		Program view = *S->prog;
		view.main = view.modules = m;
		Item *plan = NULL;
		for (Item *it = m->items; it; it = it->next)
			if (it->kind == I_PLAN)
				plan = it;
		PlanSpec *ps = plan && sema_check_plan(&view, plan) ? sema_plan(&view, plan) : NULL;
		Graph *g = ps ? run_passes(ps, NULL, NULL) : NULL;
		Lowered *low = g ? run_backend(g, NULL, NULL, false) : NULL;
		ok = low && diag_error_count() == 0 && explain_summary(g, low, sum);
		if (ok && totals) {
			explain_totals(low, totals);
			long long marked = 0;
			for (int i = 0; i < g->nops; i++)
				marked += g->ops[i].in_recompute_fn && !g->ops[i].backward && op_classes[g->ops[i].kind] != OPK_VIEW;
			S->region_ops = S->region_ops > marked ? S->region_ops : marked;
		}
		if (ok && parts && (S->nlayers < 0 || S->nlayers == g->nlayers)) {
			*parts = calloc((size_t)g->nlayers + 2, sizeof **parts);
			if (!*parts)
				ICE("out of memory");
			if (explain_parts(g, low, *parts)) {
				S->nlayers = g->nlayers;
			} else {
				free(*parts);
				*parts = NULL;
			}
		}
	}
	diag_reset();
	arena_reset(a);
	S->prog->arena = saved;
	return ok;
}

/* Whether `recompute selective` compiles to recompute none's program for this model: it recomputes
 * the ops of @recompute regions (recompute.c), only elaboration marks an op as in one, every later
 * pass's op that carries the mark is a copy of a marked op, and fused attention takes the stdlib's
 * region into its kernel but for the views around it (split and merge heads), whose clones are
 * views again: no kernel, no memory. So when no reference plan has a marked op other than a view,
 * no plan of the model has one, and selective's candidates are not enumerated: each would repeat
 * none's program (`planc emit c` of the two differs only in the plan's name). */
static bool selective_is_none(const Search *S)
{
	return S->region_ops == 0;
}

/* W and A of one recompute mode, with U and the model states from the mode none: the one-rank plan
 * of the whole batch (0 if it does not compile: then the bounds are 0 and prune nothing). */
static void reference_mode(Search *S, Recompute r)
{
	Candidate c = {.d = 1, .p = 1, .s = 1, .t = 1, .m = 1, .c = 1, .e = 1, .rec = r};
	char *text = plan_text(S, &c, "search_reference");
	ExplainSummary sum;
	ExplainTotals tot = {0};
	free(S->ref_parts[r]);
	S->ref_parts[r] = NULL;
	if (!evaluate(S, text, &sum, &tot, S->plain_sync ? &S->ref_parts[r] : NULL))
		memset(&sum, 0, sizeof sum);
	S->ref_compute[r] = tot.compute;
	S->ref_act[r] = S->plain_sync ? sum.act_micro : 0;
	if (r == REC_NONE) {
		S->causal = sum.causal;
		S->ref_update = S->update_bounded ? tot.update : 0;
		S->ref_params = sum.params;
		S->ref_grads = sum.grads;
		S->ref_optim = sum.optim;
	}
	free(text);
}

/* Every recompute mode's one-rank plan; selective's is none's when it compiles to none's program
 * (selective_is_none; reference_recheck compiles it after all, should a later reference say
 * otherwise). */
static void reference_bounds(Search *S)
{
	for (int r = 0; r < 3; r++) {
		if (r != REC_SELECTIVE || !selective_is_none(S)) {
			reference_mode(S, (Recompute)r);
			continue;
		}
		S->selective_copied = true;
		S->ref_compute[r] = S->ref_compute[REC_NONE];
		S->ref_act[r] = S->ref_act[REC_NONE];
		if (S->ref_parts[REC_NONE]) {
			size_t bytes = sizeof(ExplainPart) * (size_t)(S->nlayers + 2);
			S->ref_parts[r] = malloc(bytes);
			if (!S->ref_parts[r])
				ICE("out of memory");
			memcpy(S->ref_parts[r], S->ref_parts[REC_NONE], bytes);
		}
	}
}

static void reference_recheck(Search *S)
{
	if (S->selective_copied && !selective_is_none(S))
		reference_mode(S, REC_SELECTIVE);
}

/* The tensor-only plan of every tensor degree of the world, with and without sequence parallelism
 * (unknown when the base plan writes sync or offload). */
static void tensor_bounds(Search *S)
{
	S->ntensor = divisors(S->world, S->tensor_degrees, 256);
	for (int i = 0; i < S->ntensor; i++)
		for (int sp = 0; sp < 2; sp++) {
			TensorPlan *tp = &S->tensor[i][sp];
			memset(tp, 0, sizeof *tp);
			if (S->tensor_degrees[i] == 1 || !S->plain_sync)
				continue;
			Candidate c = {.d = 1, .p = 1, .s = 1, .t = S->tensor_degrees[i], .m = 1, .c = 1, .e = 1, .sp = sp};
			char *text = plan_text(S, &c, "search_reference");
			ExplainSummary sum;
			ExplainTotals tot = {0};
			tp->known = true;
			tp->ok = evaluate(S, text, &sum, &tot, &S->tensor_parts[i][sp]);
			if (tp->ok) {
				tp->compute = tot.compute;
				tp->comm = tot.comm_micro + tot.comm_step;
				tp->comm_micro = tot.comm_micro;
				tp->act = sum.act_micro;
			}
			free(text);
		}
}

/* Which context-parallel and expert-parallel degrees the checks allow: the plan that splits the
 * whole batch over that axis alone (`use nn.context_parallel(ctx)`, only with --ctx and a causal
 * fused attention; `use nn.expert_parallel(expert)`, which needs MoE layers whose expert count it
 * divides). A degree whose plan is refused is not enumerated. */
static void axis_bounds(Search *S)
{
	for (int i = 0; i < S->ntensor; i++) {
		long long k = S->tensor_degrees[i];
		S->ctx_ok[i] = S->expert_ok[i] = k == 1;
		if (k == 1)
			continue;
		Candidate c = {.d = 1, .p = 1, .s = 1, .t = 1, .m = 1, .c = k, .e = 1};
		if (S->ctx && S->causal) {
			char *text = plan_text(S, &c, "search_reference");
			ExplainSummary sum;
			S->ctx_ok[i] = evaluate(S, text, &sum, NULL, NULL);
			free(text);
		}
		if (S->batch % k == 0) {
			c.c = 1;
			c.d = c.e = k;
			char *text = plan_text(S, &c, "search_reference");
			ExplainSummary sum;
			S->expert_ok[i] = evaluate(S, text, &sum, NULL, NULL);
			free(text);
		}
	}
}

static bool degree_ok(const Search *S, const bool *ok, long long k)
{
	for (int i = 0; i < S->ntensor; i++)
		if (S->tensor_degrees[i] == k)
			return ok[i];
	return false;
}

static const TensorPlan *tensor_plan(const Search *S, const Candidate *c)
{
	for (int i = 0; i < S->ntensor; i++)
		if (S->tensor_degrees[i] == c->t)
			return S->tensor[i][c->sp].known ? &S->tensor[i][c->sp] : NULL;
	return NULL;
}

/* ---------------------------------------------------------------- enumeration */

typedef struct CandList {
	Candidate *c;
	long long n, cap;
} CandList;

static void push(CandList *l, const Candidate *c)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 1024;
		l->c = realloc(l->c, sizeof *l->c * (size_t)l->cap);
		if (!l->c)
			ICE("out of memory");
	}
	l->c[l->n++] = *c;
}

/* The least seconds the collectives over data take a rank of an average stage: every plain data-
 * parallel step reduces each rank's gradients (G / (t p) bytes) over the d ranks of its data
 * group, an all-reduce without ZeRO; under ZeRO a reduce-scatter, and the updated shards of the
 * parameters (P / (t p)) come back by an all-gather (ZeRO 3: before each use). */

/* ---------------------------------------------------------------- bounds per stage */

static double larger(double a, double b)
{
	return a > b ? a : b;
}

static int tensor_index(const Search *S, long long t)
{
	for (int i = 0; i < S->ntensor; i++)
		if (S->tensor_degrees[i] == t)
			return i;
	return -1;
}

/* The prefix sums of the candidate's tensor degree, sequence parallelism and recompute mode (NULL
 * when the one-rank plans gave no parts); docs/search.md says why each term is a lower bound. */
static const PartSums *part_sums(Search *S, const Candidate *c)
{
	int ti = tensor_index(S, c->t);
	const ExplainPart *one = S->ref_parts[c->rec], *none = S->ref_parts[REC_NONE];
	if (ti < 0 || !one || !none || S->nlayers < 0)
		return NULL;
	PartSums **slot = &S->sums[ti][c->sp][c->rec];
	if (*slot)
		return *slot;
	const TensorPlan *tp = tensor_plan(S, c);
	const ExplainPart *tens = tp && tp->ok ? S->tensor_parts[ti][c->sp] : NULL;
	int n = S->nlayers + 2;
	PartSums *ps = malloc(sizeof *ps);
	double *mem = calloc((size_t)(7 * (n + 1)), sizeof(double));
	if (!ps || !mem)
		ICE("out of memory");
	double **cols[] = {&ps->fwd, &ps->bwd, &ps->update, &ps->act, &ps->params, &ps->grads, &ps->optim};
	for (int k = 0; k < 7; k++)
		*cols[k] = mem + k * (n + 1);
	double t = (double)c->t;
	for (int j = 0; j < n; j++) {
		const ExplainPart *o = &one[j];
		double f = o->fwd / t, b = o->bwd / t, a = o->act / t, u = o->update / t;
		double st[3] = {o->params / t, o->grads / t, o->optim / t};
		if (tens) {
			const ExplainPart *x = &tens[j];
			f = larger(f, x->fwd + larger(0, o->fwd - none[j].fwd) / t) + x->fwd_comm;
			b = larger(b, x->bwd + larger(0, o->bwd - none[j].bwd) / t) + x->bwd_comm;
			if (c->rec == REC_NONE)
				a = larger(a, x->act);
			u = larger(u, x->update);
			st[0] = larger(st[0], x->params);
			st[1] = larger(st[1], x->grads);
			st[2] = larger(st[2], x->optim);
		}
		double row[] = {f, b, u, a, st[0], st[1], st[2]};
		for (int k = 0; k < 7; k++)
			(*cols[k])[j + 1] = (*cols[k])[j] + row[k];
	}
	*slot = ps;
	return ps;
}

/* The layers of virtual stage vs (chunk * p + stage) as parts [*lo, *hi): the interleaved
 * schedule's pieces of L / (p v) layers, or 1f1b's stages as pipeline.c partitions uniform layers;
 * the embedding on the first, the head on the last. False when the checks refuse the layout. */
static bool stage_parts(Search *S, const Candidate *c, int vs, int *lo, int *hi)
{
	int L = S->nlayers, p = (int)c->p, v = c->sched == SCH_INTERLEAVED ? 2 : 1, nvs = p * v;
	if (L < nvs || (v > 1 && L % nvs))
		return false;
	int first, end;
	if (v > 1) {
		first = vs * (L / nvs);
		end = first + L / nvs;
	} else {
		int pi = tensor_index(S, c->p);
		if (pi < 0)
			return false;
		if (!S->split[pi]) {
			double *ones = malloc(sizeof(double) * (size_t)L);
			int *part_of = malloc(sizeof(int) * (size_t)L), *split = malloc(sizeof(int) * (size_t)(p + 1));
			if (!ones || !part_of || !split)
				ICE("out of memory");
			for (int l = 0; l < L; l++)
				ones[l] = 1;
			pipeline_partition(ones, L, p, 0, 0, part_of); /* balance = uniform, as candidates have it */
			for (int l = L - 1; l >= 0; l--)
				split[part_of[l]] = l;
			split[p] = L;
			free(ones);
			free(part_of);
			S->split[pi] = split;
		}
		first = S->split[pi][vs];
		end = S->split[pi][vs + 1];
	}
	*lo = vs == 0 ? 0 : 1 + first;
	*hi = vs == nvs - 1 ? L + 2 : 1 + end;
	return true;
}

/* The least data-parallel seconds for a rank holding `grads` and `params` bytes (data_floor's). */
static double data_floor_of(const Search *S, const Candidate *c, double grads, double params)
{
	if (c->d <= 1 || !S->plain_sync || c->offload)
		return 0;
	double d = (double)(c->d / c->e), ring = (d - 1) / d;
	const Device *dev = device_current();
	const Link *link = S->world <= dev->node_ranks ? &dev->node : &dev->net; /* data is the outermost axis */
	if (c->zero == 0)
		return device_wire_floor(link, true, 2 * ring * grads);
	return device_wire_floor(link, false, ring * (grads + params));
}

/* Micro-batch chunks stage s holds at once: pipeline.c's schedule table keeps warm-up + 1. */
static double held_chunks(const Candidate *c, long long s)
{
	double m = (double)c->m, p = (double)c->p, v = c->sched == SCH_INTERLEAVED ? 2 : 1;
	double warm = v > 1 ? 2 * (p - (double)s - 1) + (v - 1) * p : p - (double)s - 1;
	return warm + 1 < m * v ? warm + 1 : m * v;
}

/* The most a stage's actions can run faster than their costs: where a node's ranks share fewer
 * cores than they are, a pipeline stage computing alone (explain_stage_speed of one busy stage);
 * the bounds' forward and backward terms are divided by it (1 elsewhere). */
static double fastest_stages(const Search *S, const Candidate *c)
{
	return explain_stage_speed(S->world, (int)c->p, 1);
}

/* The speed of the candidate's update (explain's estimate divides it by the speed of every stage
 * computing: above 1 where the world puts fewer ranks on a node than the calibration shared its
 * cores among), so the bounds' update terms are the estimate's. */
static double update_speed(const Search *S, const Candidate *c)
{
	return explain_stage_speed(S->world, (int)c->p, (int)c->p);
}

/* The time and memory bounds of every stage of the candidate from the per-part costs, the largest
 * of each (docs/search.md, "per stage"); false when the parts are not known. */
static bool stage_bounds(Search *S, const Candidate *c, double *time, double *memory)
{
	const PartSums *ps = part_sums(S, c);
	if (!ps || !S->plain_sync)
		return false;
	int p = (int)c->p, v = c->sched == SCH_INTERLEAVED ? 2 : 1, nvs = p * v;
	double *fwd = malloc(sizeof(double) * (size_t)(2 * nvs + 2)), *bwd = fwd + nvs + 1;
	int *range = malloc(sizeof(int) * (size_t)(2 * nvs));
	if (!fwd || !range)
		ICE("out of memory");
	double m = (double)c->m, rows = (double)c->d * (double)c->s * (double)c->c * m; /* one micro-batch's share */
	double e = (double)c->e, z = (double)(c->d / c->e);
	bool ok = true;
	fwd[0] = bwd[0] = 0; /* prefix sums over the virtual stages of one micro-batch's seconds */
	for (int vs = 0; vs < nvs && ok; vs++) {
		ok = stage_parts(S, c, vs, &range[2 * vs], &range[2 * vs + 1]);
		int lo = range[2 * vs], hi = range[2 * vs + 1];
		fwd[vs + 1] = fwd[vs] + (ok ? (ps->fwd[hi] - ps->fwd[lo]) / rows : 0);
		bwd[vs + 1] = bwd[vs] + (ok ? (ps->bwd[hi] - ps->bwd[lo]) / rows : 0);
	}
	*time = *memory = 0;
	double fastest = fastest_stages(S, c);
	long long n = c->m * v; /* the last action of a stage: the backward of unit n - 1 */
	int last_chunk = v == 1 ? 0 : v - 1 - (int)(((n - 1) / p) % v);
	for (int s = 0; s < p && ok; s++) {
		double busy = 0, upd = 0, act = 0, st[3] = {0, 0, 0};
		for (int ch = 0; ch < v; ch++) {
			int vs = ch * p + s, lo = range[2 * vs], hi = range[2 * vs + 1];
			busy += m * (fwd[vs + 1] - fwd[vs] + bwd[vs + 1] - bwd[vs]);
			upd += ps->update[hi] - ps->update[lo];
			act += (ps->act[hi] - ps->act[lo]) / rows;
			st[0] += (ps->params[hi] - ps->params[lo]) / e;
			st[1] += (ps->grads[hi] - ps->grads[lo]) / e;
			st[2] += (ps->optim[hi] - ps->optim[lo]) / e;
		}
		double head = fwd[s], tail = bwd[last_chunk * p + s]; /* micro-batch 0 reaching s, the last leaving */
		double update = c->offload ? 0 : upd / (e * (c->zero >= 1 ? z : 1)) / update_speed(S, c);
		double t = (head + busy + tail + data_floor_of(S, c, st[1], st[0])) / fastest + update;
		double states = st[0] / (c->zero >= 3 ? z : 1) + st[1] / (c->zero >= 2 ? z : 1) +
				(c->offload ? 0 : st[2] / (c->zero >= 1 ? z : 1));
		double mem = states + held_chunks(c, s) * act / v;
		*time = larger(*time, t);
		*memory = larger(*memory, mem);
	}
	free(fwd);
	free(range);
	return ok;
}

/* The least step time the estimate can give the candidate (the comment at the top says why). */
static double time_bound(const Search *S, const Candidate *c)
{
	double w = S->ref_compute[c->rec], m = (double)c->m, p = (double)c->p, t = (double)c->t;
	double shards = t * p * (double)c->e * (c->zero >= 1 ? (double)(c->d / c->e) : 1);
	double update = c->offload ? 0 : S->ref_update / shards / update_speed(S, c); /* offloaded: the host updates */
	double group = w / t, comm = 0, comm_micro = 0; /* one tensor group's seconds over the whole batch */
	const TensorPlan *tp = tensor_plan(S, c);
	if (tp && tp->ok) {
		double again = w - S->ref_compute[REC_NONE]; /* what recomputation adds */
		if (tp->compute + (again > 0 ? again : 0) / t > group)
			group = tp->compute + (again > 0 ? again : 0) / t;
		comm = tp->comm;
		comm_micro = tp->comm_micro;
	}
	double rows = (double)c->d * (double)c->s * (double)c->c; /* a rank's share of the rows and the sequence */
	/* experts are split e ways more; the data axis alone (d / e ranks) is the smallest group */
	double split = t * p * (double)c->e;
	double fastest = fastest_stages(S, c);
	double flat = ((group + comm) / (rows * p) + data_floor_of(S, c, S->ref_grads / split, S->ref_params / split)) / fastest +
		      update;
	if (c->sched == SCH_INTERLEAVED)
		return flat;
	double x = (group + comm_micro) / (rows * m);
	double bubble = x / (1 - pow(1 - 1 / m, p)) / fastest + update;
	return bubble > flat ? bubble : flat;
}

/* The least peak memory of the candidate's busiest rank (the comment at the top says why). */
static double memory_bound(const Search *S, const Candidate *c)
{
	/* experts may be split e ways more; ZeRO shards over the data axis (d / e ranks) */
	double split = (double)c->t * (double)c->p * (double)c->e, d = (double)c->d, z = (double)(c->d / c->e);
	double m = (double)c->m;
	double states = S->ref_params / (split * (c->zero >= 3 ? z : 1)) + S->ref_grads / (split * (c->zero >= 2 ? z : 1)) +
			(c->offload ? 0 : S->ref_optim / (split * (c->zero >= 1 ? z : 1)));
	double group = S->ref_act[c->rec] / (double)c->t; /* one tensor group, the whole batch */
	const TensorPlan *tp = tensor_plan(S, c);
	if (tp && tp->ok && c->rec == REC_NONE && tp->act > group)
		group = tp->act;
	double micro = group / (d * m * (double)c->s * (double)c->c); /* one micro-batch, every stage */
	double flat = states + micro / (double)c->p;
	double spread = 0; /* stage s holds `held` of its micro-batch activations at once */
	for (long long s = 0; s < c->p; s++)
		spread += (c->sched == SCH_INTERLEAVED ? 2 : 1) / held_chunks(c, s);
	return micro / spread > flat ? micro / spread : flat;
}


/* Every schedule, ZeRO stage, recompute mode and sequence-parallel choice of one mesh and
 * micro-batch count. */
static void push_variants(Search *S, CandList *l, Candidate c)
{
	long long data = c.d / c.e; /* the data axis ZeRO shards over */
	for (int sch = c.p > 1 ? SCH_1F1B : SCH_NONE; sch <= (c.p > 1 ? SCH_INTERLEAVED : SCH_NONE); sch++)
		for (int z = 0; z <= (data > 1 ? 3 : 0); z++)
			for (int r = 0; r < 3; r++)
				for (int sp = 0; sp <= (c.t > 1 ? 1 : 0) && !(r == REC_SELECTIVE && selective_is_none(S)); sp++)
					for (int off = 0; off <= (S->offload && !S->base_offloads ? 1 : 0); off++) {
						c.sched = (SearchSchedule)sch;
						c.zero = z;
						c.rec = (Recompute)r;
						c.sp = sp;
						c.offload = off;
						c.bound = time_bound(S, &c);
						c.mem_bound = memory_bound(S, &c);
						double t, mem;
						if (stage_bounds(S, &c, &t, &mem)) {
							c.bound = larger(c.bound, t);
							c.mem_bound = larger(c.mem_bound, mem);
						}
						c.index = l->n;
						push(l, &c);
					}
}

/* The data degree is what the other degrees leave; the expert degree divides it; then every
 * micro-batch count of the local batch. */
static void enumerate_data(Search *S, CandList *l, Candidate c)
{
	long long de[256], dm[256];
	c.d = S->world / (c.t * c.s * c.c * c.p);
	if (S->batch % c.d)
		return;
	int ne = divisors(c.d, de, 256), nm = divisors(S->batch / c.d, dm, 256);
	for (int i = 0; i < ne; i++) {
		if (!degree_ok(S, S->expert_ok, de[i]))
			continue;
		for (int q = 0; q < nm; q++) {
			c.e = de[i];
			c.m = dm[q];
			push_variants(S, l, c);
		}
	}
}

/* Every tensor x seq x ctx x pipe degree whose product divides the world. */
static void enumerate(Search *S, CandList *l)
{
	long long dt[256], ds[256], dc[256], dp[256];
	int nt = divisors(S->world, dt, 256);
	for (int i = 0; i < nt; i++) {
		long long rest = S->world / dt[i];
		int ns = S->seq ? divisors(rest, ds, 256) : (ds[0] = 1, 1);
		for (int j = 0; j < ns; j++) {
			int nc = divisors(rest / ds[j], dc, 256);
			for (int k = 0; k < nc; k++) {
				if (!degree_ok(S, S->ctx_ok, dc[k]))
					continue;
				int np = divisors(rest / ds[j] / dc[k], dp, 256);
				for (int q = 0; q < np; q++) {
					Candidate c = {.t = dt[i], .s = ds[j], .c = dc[k], .p = dp[q]};
					enumerate_data(S, l, c);
				}
			}
		}
	}
}

static int by_bound(const void *a, const void *b)
{
	const Candidate *p = a, *q = b;
	if (p->bound != q->bound)
		return p->bound < q->bound ? -1 : 1;
	return p->index < q->index ? -1 : p->index > q->index;
}

/* Keeps the top k feasible results, fastest first (ties: the earlier candidate). */
static void keep(Search *S, const Candidate *c, const ExplainSummary *sum)
{
	int i = S->nbest;
	if (i == S->top && sum->step >= S->best[i - 1].sum.step)
		return;
	if (i == S->top)
		i--;
	else
		S->nbest++;
	while (i > 0 && S->best[i - 1].sum.step > sum->step) {
		S->best[i] = S->best[i - 1];
		i--;
	}
	S->best[i].c = *c;
	S->best[i].sum = *sum;
}


static void run_search(Search *S, CandList *l)
{
	qsort(l->c, (size_t)l->n, sizeof *l->c, by_bound);
	for (long long i = 0; i < l->n; i++) {
		const Candidate *c = &l->c[i];
		if (!S->exhaustive && S->nbest == S->top && c->bound >= S->best[S->top - 1].sum.step) {
			S->pruned = l->n - i; /* sorted: every later bound is as large */
			break;
		}
		const TensorPlan *tp = tensor_plan(S, c);
		if (tp && !tp->ok && !S->exhaustive) {
			S->refused_tensor++;
			continue;
		}
		if (!S->exhaustive && c->mem_bound > S->memory) {
			S->pruned_memory++;
			continue;
		}
		char *text = plan_text(S, c, "search_candidate");
		ExplainSummary sum;
		bool ok = evaluate(S, text, &sum, NULL, NULL);
		free(text);
		S->compiled++;
		bool violated = ok && (c->bound > sum.step * (1 + 1e-9) || c->mem_bound > sum.peak * (1 + 1e-9) ||
				       (tp && !tp->ok));
		S->violations += violated; /* a bound above what it bounds: a bug (tests/search checks there is none) */
		if (violated || getenv("PLANC_SEARCH_TRACE"))
			fprintf(stderr, "%s %.2f s: d%lld e%lld p%lld c%lld s%lld t%lld m%lld z%d r%d sch%d sp%d off%d ok%d: "
				"time bound %.6g, estimate %.6g; memory bound %.6g, peak %.6g\n",
				violated ? "planc search: bound violated" : "trace", cpu_seconds(), c->d, c->e, c->p, c->c, c->s,
				c->t, c->m, c->zero, c->rec, c->sched, c->sp, c->offload, ok, c->bound, ok ? sum.step : 0,
				c->mem_bound, ok ? sum.peak : 0);
		if (!ok)
			S->refused++;
		else if (sum.peak > S->memory)
			S->over_memory++;
		else
			keep(S, c, &sum);
	}
}

static void free_bounds(Search *S)
{
	for (int r = 0; r < 3; r++)
		free(S->ref_parts[r]);
	for (int i = 0; i < 256; i++) {
		free(S->split[i]);
		for (int sp = 0; sp < 2; sp++) {
			free(S->tensor_parts[i][sp]);
			for (int r = 0; r < 3; r++)
				if (S->sums[i][sp][r]) {
					free(S->sums[i][sp][r]->fwd);
					free(S->sums[i][sp][r]);
				}
		}
	}
}

/* ---------------------------------------------------------------- the base plan */

/* Whether the text [s, s + len) contains the word w. */
static bool mentions(const char *s, int len, const char *w)
{
	size_t n = strlen(w);
	for (int i = 0; i + (int)n <= len; i++)
		if (!strncmp(s + i, w, n))
			return true;
	return false;
}

/* The base plan's batch name, its `for` clause and the statements the candidates keep. */
static bool take_base(Search *S, const char *plan_name)
{
	const Item *base = NULL;
	for (const Item *it = S->prog->main->items; it; it = it->next)
		if (it->kind == I_PLAN && !strcmp(it->for_model, S->model) && (!plan_name || !strcmp(it->name, plan_name))) {
			base = it;
			break;
		}
	if (!base) {
		if (plan_name)
			fprintf(stderr, "planc: error: no plan named '%s' for model '%s' in %s\n", plan_name, S->model, S->path);
		else
			fprintf(stderr, "planc: error: %s has no plan for model '%s' to start from\n", S->path, S->model);
		diag_note_plain("search keeps a base plan's precision, optimizer and sync options: write one, e.g. "
				"'plan base for %s { batch B = 16 }'", S->model);
		return false;
	}
	const char *src = S->prog->main->src.text;
	S->for_clause = S->model;
	if (base->model_args) { /* `for gpt(P = 0.0)`: the text from the model's name to the ')' */
		const char *from = src + base->for_loc.off, *close = strchr(from, ')');
		if (close)
			S->for_clause = strndup(from, (size_t)(close - from + 1));
	}
	static const char *const parallel[] = {"mesh", "batch", "shard", "use", "pipeline", "zero", "recompute", "stage", NULL};
	size_t len = 0, cap = 256;
	S->base = malloc(cap);
	if (!S->base)
		ICE("out of memory");
	S->base[0] = 0;
	S->update_bounded = true;
	S->plain_sync = true;
	for (const PlanStmt *st = base->rules; st; st = st->next) {
		bool skip = false;
		for (int i = 0; parallel[i]; i++)
			skip |= !strcmp(st->word, parallel[i]);
		if (!strcmp(st->word, "batch"))
			for (const Arg *a = st->args; a; a = a->next)
				if (a->key && strcmp(a->key, "micro_batches"))
					S->batch_name = a->key;
		if (!skip)
			append(&S->base, &len, &cap, "  %.*s\n", st->loc.len, src + st->loc.off);
		if (!strcmp(st->word, "offload") ||
		    (!strcmp(st->word, "sync") && mentions(src + st->loc.off, st->loc.len, "async")))
			S->update_bounded = false;
		if (!strcmp(st->word, "offload") || !strcmp(st->word, "sync"))
			S->plain_sync = false;
		if (!strcmp(st->word, "offload"))
			S->base_offloads = true;
	}
	if (!S->batch_name) {
		fprintf(stderr, "planc: error: plan '%s' has no 'batch NAME = N' to take the batch dimension's name from\n",
			base->name);
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------- the command */

static const char search_usage[] =
	"usage: planc search FILE --model M (--world N | --nodes K) --batch B [options]\n"
	"  enumerates data x expert x pipe x tensor (x seq, x ctx) degrees, micro-batches, schedule, ZeRO 0-3,\n"
	"  recompute, sequence parallelism (and optimizer offload) for model M on N ranks; keeps the plans\n"
	"  that pass every check and fit in memory; prints the fastest by explain's estimated step time as\n"
	"  plan text (docs/search.md)\n"
	"options:\n"
	"  --device=NAME|FILE  the device the estimate assumes (h200, h100, a100, cpu, a device file)\n"
	"  --nodes K           world = K x the device's ranks per node\n"
	"  --memory SIZE       per-rank memory limit (80GiB; default: the device's capacity)\n"
	"  --top K             how many plans to print (default 3)\n"
	"  --plan BASE         the plan whose other statements (precision, optimizer, sync) the candidates\n"
	"                      keep (default: the file's first plan for M)\n"
	"  --seq               also split the sequence (Ulysses) over a seq axis\n"
	"  --ctx               also split the sequence over a ctx axis (context parallelism: ring attention;\n"
	"                      only for a model with a fused causal attention)\n"
	"  --offload           also try the optimizer state offloaded to the host (unless the base plan offloads)\n"
	"  --exhaustive        compile every candidate (no pruning by the time bound)\n"
	"  --write NAME        append the best plan to FILE as plan NAME\n";

static int search_usage_error(const char *msg, const char *arg)
{
	fprintf(stderr, "planc search: ");
	fprintf(stderr, msg, arg);
	fprintf(stderr, "\n%s", search_usage);
	return 2;
}

static bool parse_count(const char *s, long long *out)
{
	char *end;
	long long v = strtoll(s, &end, 10);
	*out = v;
	return s && *s && !*end && v > 0 && v <= 1LL << 40;
}

typedef struct SearchArgs {
	const char *file, *model, *plan, *write, *world, *nodes, *batch, *memory, *top;
} SearchArgs;

/* the value of option `name` at argv[*i] (--name=V or --name V), or NULL if argv[*i] is not it */
static const char *option_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
	size_t n = strlen(name);
	if (strncmp(argv[*i], name, n))
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n])
		return NULL;
	if (*i + 1 < argc)
		return argv[++*i];
	*missing = true;
	return NULL;
}

static int parse_search_args(int argc, char **argv, SearchArgs *a, Search *S)
{
	for (int i = 1; i < argc; i++) {
		bool missing = false;
		const char **slots[] = {&a->model, &a->plan, &a->write, &a->world, &a->nodes, &a->batch, &a->memory, &a->top};
		static const char *const names[] = {"--model", "--plan", "--write", "--world", "--nodes", "--batch", "--memory", "--top"};
		bool taken = false;
		for (int k = 0; k < 8 && !taken && !missing; k++) {
			const char *v = option_value(argc, argv, &i, names[k], &missing);
			if (v) {
				*slots[k] = v;
				taken = true;
			}
			if (missing)
				return search_usage_error("%s needs a value", names[k]);
		}
		if (taken)
			continue;
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(search_usage, stdout);
			exit(0);
		} else if (!strncmp(argv[i], "--device=", 9)) {
			if (!device_select(argv[i] + 9))
				return 2;
		} else if (!strcmp(argv[i], "--exhaustive")) {
			S->exhaustive = true;
		} else if (!strcmp(argv[i], "--seq")) {
			S->seq = true;
		} else if (!strcmp(argv[i], "--ctx")) {
			S->ctx = true;
		} else if (!strcmp(argv[i], "--offload")) {
			S->offload = true;
		} else if (argv[i][0] == '-') {
			return search_usage_error("unknown option '%s'", argv[i]);
		} else if (!a->file) {
			a->file = argv[i];
		} else {
			return search_usage_error("unexpected argument '%s'", argv[i]);
		}
	}
	if (!a->file || !a->model || !a->batch || (!a->world == !a->nodes))
		return search_usage_error("needs FILE, --model, --batch and one of --world or --nodes%s", "");
	long long nodes = 0, top = 3;
	if ((a->world && !parse_count(a->world, &S->world)) || (a->nodes && !parse_count(a->nodes, &nodes)))
		return search_usage_error("--world and --nodes take a positive whole number, not '%s'", a->world ? a->world : a->nodes);
	if (a->nodes && __builtin_mul_overflow(nodes, (long long)device_current()->node_ranks, &S->world))
		return search_usage_error("--nodes %s times the device's ranks per node overflows", a->nodes);
	if (!parse_count(a->batch, &S->batch))
		return search_usage_error("--batch takes a positive whole number, not '%s'", a->batch);
	if (a->top && (!parse_count(a->top, &top) || top > 10000))
		return search_usage_error("--top takes 1 to 10000, not '%s'", a->top);
	S->top = (int)top;
	S->memory = device_current()->capacity;
	if (a->memory && (!device_parse_number(a->memory, &S->memory) || S->memory <= 0))
		return search_usage_error("--memory takes a size (80GiB, 16e9), not '%s'", a->memory);
	if (S->world > 1 << 24)
		return search_usage_error("--world %s: search enumerates up to 16,777,216 ranks", a->world ? a->world : a->nodes);
	return 0;
}

static void print_result(const Search *S, int rank, const Result *r)
{
	char b1[64], b2[64];
	printf("# %d: estimated step %.6g s (micro-batches %.6g s, update %.6g s), peak %s per rank%s, bubble %.1f%%\n", rank,
	       r->sum.step, r->sum.pipeline, r->sum.update, explain_bytes(r->sum.peak, b1, sizeof b1),
	       r->sum.runnable ? " (what the program allocates)" : "", 100 * r->sum.bubble);
	snprintf(b2, sizeof b2, "search_%d", rank);
	char *text = plan_text(S, &r->c, b2);
	fputs(text, stdout);
	putchar('\n');
	free(text);
}

/* --write NAME: the best plan appended to the file, refused if the file has a plan of that name */
static bool write_best(const Search *S, const char *name)
{
	for (const Item *it = S->prog->main->items; it; it = it->next)
		if (it->kind == I_PLAN && !strcmp(it->name, name)) {
			fprintf(stderr, "planc: error: %s already has a plan named '%s'; --write appends a new one\n", S->path, name);
			return false;
		}
	char *text = plan_text(S, &S->best[0].c, name);
	FILE *f = fopen(S->path, "a");
	bool ok = f && fprintf(f, "\n# planc search --model %s --world %lld --batch %lld: estimated step %.6g s on %s\n%s",
			       S->model, S->world, S->batch, S->best[0].sum.step, device_current()->key, text) > 0;
	if (f && fclose(f) != 0)
		ok = false;
	free(text);
	if (!ok)
		fprintf(stderr, "planc: error: cannot append to %s\n", S->path);
	else
		printf("wrote plan %s to %s\n", name, S->path);
	return ok;
}

int search_main(int argc, char **argv)
{
	Search S = {.nlayers = -1, .region_ops = -1};
	SearchArgs a = {0};
	int rc = parse_search_args(argc, argv, &a, &S);
	if (rc)
		return rc;
	S.path = a.file;
	S.model = a.model;
	double start = cpu_seconds();
	Arena *arena = arena_new();
	S.prog = load_program(arena, a.file);
	if (!S.prog || !take_base(&S, a.plan)) {
		arena_free(arena);
		return 1;
	}
	S.src = (char *)S.prog->main->src.text;
	S.srclen = S.prog->main->src.len;
	S.imports = S.prog->main->next;
	S.scratch = arena_new();
	S.best = calloc((size_t)S.top, sizeof *S.best);
	FILE *devnull = fopen("/dev/null", "w");
	if (!S.best || !devnull)
		ICE("out of memory");
	diag_set_stream(devnull);
	reference_bounds(&S);
	tensor_bounds(&S);
	axis_bounds(&S);
	reference_recheck(&S);
	if (getenv("PLANC_SEARCH_TRACE")) {
		fprintf(stderr, "ref W %g %g %g U %g A %g %g %g P %g G %g O %g\n", S.ref_compute[0], S.ref_compute[1],
			S.ref_compute[2], S.ref_update, S.ref_act[0], S.ref_act[1], S.ref_act[2], S.ref_params, S.ref_grads,
			S.ref_optim);
		for (int r = 0; r < 3 && S.ref_parts[r]; r++) { /* what the parts leave out of the totals */
			double w = 0, act = 0;
			for (int j = 0; j < S.nlayers + 2; j++) {
				w += S.ref_parts[r][j].fwd + S.ref_parts[r][j].bwd;
				act += S.ref_parts[r][j].act;
			}
			fprintf(stderr, "parts %s: W %g of %g, A %g of %g, %d layers\n", rec_names[r], w, S.ref_compute[r], act,
				S.ref_act[r], S.nlayers);
		}
		for (int i = 0; i < S.ntensor; i++)
			for (int sp = 0; sp < 2; sp++)
				fprintf(stderr, "tensor %lld sp%d: ok %d W %g C %g A %g\n", S.tensor_degrees[i], sp, S.tensor[i][sp].ok,
					S.tensor[i][sp].compute, S.tensor[i][sp].comm, S.tensor[i][sp].act);
	}
	CandList l = {0};
	enumerate(&S, &l);
	run_search(&S, &l);
	diag_set_stream(NULL);
	fclose(devnull);
	double secs = cpu_seconds() - start;
	char b1[64];
	printf("# planc search: model %s, %lld ranks, batch %lld, at most %s per rank, on %s\n", S.model, S.world, S.batch,
	       explain_bytes(S.memory, b1, sizeof b1), device_current()->name);
	printf("# %lld candidates: %lld compiled (%lld refused by the checks, %lld over memory), %lld pruned by the time "
	       "bound, %lld by the memory bound, %lld by their tensor-only plan; %.2f s CPU, %.1f ms per compiled candidate; "
	       "bounds violated %lld\n",
	       l.n, S.compiled, S.refused, S.over_memory, S.pruned, S.pruned_memory, S.refused_tensor, secs,
	       S.compiled ? 1e3 * secs / (double)S.compiled : 0.0, S.violations);
	if (selective_is_none(&S))
		printf("# recompute selective: model %s has no op but views in an @recompute region once attention is "
		       "fused, so it compiles to recompute none's program; not enumerated\n", S.model);
	int nctx = 0;
	for (int i = 0; i < S.ntensor; i++)
		nctx += S.tensor_degrees[i] > 1 && S.ctx_ok[i];
	if (S.ctx && !nctx)
		printf("# --ctx: no context-parallel degree applies (%s)\n",
		       S.causal ? "the checks refuse a ctx axis alone at every degree: the ring attention needs f32 "
				  "storage and a degree dividing the sequence"
				: "the model has no fused causal attention");
	if (S.nbest == 0) {
		fprintf(stderr, "planc: error: no plan of model %s on %lld ranks passes the checks and fits in %s\n", S.model,
			S.world, b1);
		diag_note_plain("more ranks, a larger --memory, or a smaller --batch");
		rc = 1;
	}
	for (int i = 0; i < S.nbest; i++)
		print_result(&S, i + 1, &S.best[i]);
	if (!rc && a.write && !write_best(&S, a.write))
		rc = 1;
	free(l.c);
	free(S.best);
	free(S.base);
	arena_free(S.scratch);
	free_bounds(&S);
	arena_free(arena);
	return rc;
}
