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
 * Pruning (sound): before compiling, a candidate's step time is bounded below from the seconds
 * the estimate gives the compute kernels of the one-rank plan of the same model, batch and
 * recompute mode: W for the forward and backward phases (every micro-batch) and U for the update
 * phase. Every plan runs the same kernels over its ranks: data splits their rows, tensor their
 * columns or inner dims, pipe and micro-batches split the layers and rows, so the ranks' seconds
 * sum to W or more (a replicated kernel only adds), and the busiest rank holds at least the
 * average. A pipeline adds its bubble: with p stages of per-micro-batch costs X_0..X_{p-1}, stage
 * s cannot start before the first micro-batch has passed stages 0..s-1, and its last backward
 * must still pass them back, so the step takes at least X_0 + .. + X_{s-1} + m X_s for every s.
 * Weighting stage s by (1 - 1/m)^(p-1-s) / m shows the largest of these is at least
 * X / (1 - (1 - 1/m)^p), X the sum of the X_s, here at least W / (d s t m) (the whole pipeline's
 * share of W, one micro-batch); with p = 1 that is W / world, and for a balanced pipeline it is
 * the familiar (m + p - 1) X / p. The interleaved schedule keeps the plain W / world. The update
 * phase, which the estimate adds after the pipeline, runs each rank's optimizer over its shard:
 * at least U / (t p), or U / (t p d) when ZeRO shards it over data (not bounded when the base plan
 * offloads or trains asynchronously, whose updates run elsewhere). Candidates are taken in the
 * order of that bound, and once k plans are known and the bound reaches the k-th best estimate,
 * no later candidate can enter the top k: the rest are skipped. --exhaustive compiles every
 * candidate (tests/search checks that both give the same top k).
 *
 * Memory is pruned alike: the one-rank plan's parameters, gradients and optimizer state (bytes
 * P, G, O) are split at most by tensor x pipe (x seq: replicated) and by data where the ZeRO stage
 * shards them (3: P, 2: G, 1: O); what a plan replicates only adds, so the average rank, and so
 * the largest peak, holds at least P / (t p [d]) + G / (t p [d]) + O / (t p [d]). A candidate
 * whose bound exceeds --memory is not compiled.
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
	int zero;
	Recompute rec;
	SearchSchedule sched;
	bool sp;
	double bound; /* seconds: no plan of this recompute mode on this world is faster */
} Candidate;

typedef struct Result {
	Candidate c;
	ExplainSummary sum;
} Result;

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
	bool exhaustive, seq;
	double ref_compute[3]; /* W per recompute mode (0: unknown, bound 0) */
	double ref_update;     /* U (0: unknown or not a bound, see update_bounded) */
	bool update_bounded;   /* the base plan updates every rank's own shard in its step */
	double ref_params, ref_grads, ref_optim; /* the one-rank plan's model states (0: unknown) */
	long long compiled, refused, over_memory, pruned, pruned_memory;
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
	const char *names[] = {"data", "pipe", "seq", "tensor"};
	long long deg[] = {c->d, c->p, c->s, c->t};
	bool any = false;
	for (int i = 0; i < 4; i++)
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
	if (c->d > 1)
		append(&b, &len, &cap, "  shard %s -> data\n", S->batch_name);
	if (c->t > 1)
		append(&b, &len, &cap, "  use nn.megatron(tensor)\n");
	if (c->sp)
		append(&b, &len, &cap, "  use nn.sequence_parallel(tensor)\n");
	if (c->s > 1)
		append(&b, &len, &cap, "  use nn.ulysses(seq)\n");
	if (c->sched != SCH_NONE)
		append(&b, &len, &cap, "  pipeline pipe: %s\n", c->sched == SCH_1F1B ? "1f1b" : "interleaved");
	if (c->zero > 0)
		append(&b, &len, &cap, "  zero %d over data\n", c->zero);
	if (c->rec != REC_NONE)
		append(&b, &len, &cap, "  recompute %s\n", rec_names[c->rec]);
	append(&b, &len, &cap, "%s}\n", S->base);
	return b;
}

/* ---------------------------------------------------------------- compiling one candidate */

/* Compiles the file with `text` appended (every diagnostic silenced: a refused candidate is
 * counted, not reported); fills *sum and, when matmul is given, the matmul seconds. */
static bool evaluate(Search *S, const char *text, ExplainSummary *sum, double *compute, double *update)
{
	Arena *saved = plan_arena_begin(S->prog);
	Arena *a = S->prog->arena;
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
		if (ok && compute)
			explain_compute_seconds(low, compute, update);
	}
	diag_reset();
	plan_arena_end(S->prog, saved);
	return ok;
}

/* W for each recompute mode and U: the one-rank plan of the whole batch (0 if it does not
 * compile: then the bound is 0 and prunes nothing). */
static void reference_bounds(Search *S)
{
	for (int r = 0; r < 3; r++) {
		Candidate c = {.d = 1, .p = 1, .s = 1, .t = 1, .m = 1, .rec = (Recompute)r};
		char *text = plan_text(S, &c, "search_reference");
		ExplainSummary sum;
		double w = 0, u = 0;
		if (!evaluate(S, text, &sum, &w, &u))
			w = u = 0;
		S->ref_compute[r] = w;
		if (r == REC_NONE)
			S->ref_update = S->update_bounded ? u : 0;
		if (r == REC_NONE && w > 0) {
			S->ref_params = sum.params;
			S->ref_grads = sum.grads;
			S->ref_optim = sum.optim;
		}
		free(text);
	}
}

/* ---------------------------------------------------------------- enumeration */

static int divisors(long long n, long long *out, int cap)
{
	int k = 0;
	for (long long i = 1; i <= n && k < cap; i++)
		if (n % i == 0)
			out[k++] = i;
	return k;
}

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

/* The least step time the estimate can give the candidate (the comment at the top says why). */
static double time_bound(const Search *S, const Candidate *c)
{
	double w = S->ref_compute[c->rec], m = (double)c->m, world = (double)S->world;
	double pipeline = w / world;
	if (c->sched != SCH_INTERLEAVED) {
		double x = w / ((double)c->d * (double)c->s * (double)c->t * m);
		pipeline = x / (1 - pow(1 - 1 / m, (double)c->p));
	}
	double shards = (double)c->t * (double)c->p * (c->zero >= 1 ? (double)c->d : 1);
	return pipeline + S->ref_update / shards;
}

/* Every schedule, ZeRO stage, recompute mode and sequence-parallel choice of one mesh and
 * micro-batch count. */
static void push_variants(const Search *S, CandList *l, Candidate c)
{
	for (int sch = c.p > 1 ? SCH_1F1B : SCH_NONE; sch <= (c.p > 1 ? SCH_INTERLEAVED : SCH_NONE); sch++)
		for (int z = 0; z <= (c.d > 1 ? 3 : 0); z++)
			for (int r = 0; r < 3; r++)
				for (int sp = 0; sp <= (c.t > 1 ? 1 : 0); sp++) {
					c.sched = (SearchSchedule)sch;
					c.zero = z;
					c.rec = (Recompute)r;
					c.sp = sp;
					c.bound = time_bound(S, &c);
					push(l, &c);
				}
}

static void enumerate(const Search *S, CandList *l)
{
	long long dt[256], ds[256], dp[256], dm[256];
	int nt = divisors(S->world, dt, 256);
	for (int i = 0; i < nt; i++) {
		long long rest = S->world / dt[i];
		int ns = S->seq ? divisors(rest, ds, 256) : (ds[0] = 1, 1);
		for (int j = 0; j < ns; j++) {
			int np = divisors(rest / ds[j], dp, 256);
			for (int k = 0; k < np; k++) {
				long long d = rest / ds[j] / dp[k];
				if (S->batch % d)
					continue;
				int nm = divisors(S->batch / d, dm, 256);
				for (int q = 0; q < nm; q++) {
					Candidate c = {.d = d, .p = dp[k], .s = ds[j], .t = dt[i], .m = dm[q]};
					push_variants(S, l, c);
				}
			}
		}
	}
}

static int by_bound(const void *a, const void *b)
{
	double x = ((const Candidate *)a)->bound, y = ((const Candidate *)b)->bound;
	return x < y ? -1 : x > y;
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

/* The least model state a rank of the candidate holds (the comment at the top says why). */
static double memory_bound(const Search *S, const Candidate *c)
{
	double split = (double)c->t * (double)c->p, d = (double)c->d;
	return S->ref_params / (split * (c->zero >= 3 ? d : 1)) + S->ref_grads / (split * (c->zero >= 2 ? d : 1)) +
	       S->ref_optim / (split * (c->zero >= 1 ? d : 1));
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
		if (!S->exhaustive && memory_bound(S, c) > S->memory) {
			S->pruned_memory++;
			continue;
		}
		char *text = plan_text(S, c, "search_candidate");
		ExplainSummary sum;
		bool ok = evaluate(S, text, &sum, NULL, NULL);
		free(text);
		S->compiled++;
		if (!ok)
			S->refused++;
		else if (sum.peak > S->memory)
			S->over_memory++;
		else
			keep(S, c, &sum);
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
	"  enumerates data x pipe x tensor (x seq) degrees, micro-batches, schedule, ZeRO 0-3, recompute\n"
	"  and sequence parallelism for model M on N ranks; keeps the plans that pass every check and fit\n"
	"  in memory; prints the fastest by explain's estimated step time as plan text (docs/search.md)\n"
	"options:\n"
	"  --device=NAME|FILE  the device the estimate assumes (h200, h100, a100, cpu, a device file)\n"
	"  --nodes K           world = K x the device's ranks per node\n"
	"  --memory SIZE       per-rank memory limit (80GiB; default: the device's capacity)\n"
	"  --top K             how many plans to print (default 3)\n"
	"  --plan BASE         the plan whose other statements (precision, optimizer, sync) the candidates\n"
	"                      keep (default: the file's first plan for M)\n"
	"  --seq               also split the sequence (Ulysses) over a seq axis\n"
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
	Search S = {0};
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
	S.best = calloc((size_t)S.top, sizeof *S.best);
	FILE *devnull = fopen("/dev/null", "w");
	if (!S.best || !devnull)
		ICE("out of memory");
	diag_set_stream(devnull);
	reference_bounds(&S);
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
	       "bound, %lld by the memory bound; %.2f s CPU, %.1f ms per compiled candidate\n",
	       l.n, S.compiled, S.refused, S.over_memory, S.pruned, S.pruned_memory, secs,
	       S.compiled ? 1e3 * secs / (double)S.compiled : 0.0);
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
	arena_free(arena);
	return rc;
}
