/* options.c: the program's command line. Every option is checked here, before any work: a value
 * that looks like an option is a missing value, numbers are plain decimal digits in a stated range
 * (never clamped), and the first error is kept to be reported after planrt_init (so that every
 * rank agrees and --help anywhere is answered before MPI starts). --help prints the plan the
 * program trains, its mesh and every option. */
#include "driver.h"
#include "planrt_cpu.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char planrt_usage_line_[] =
	"--steps K --data FILE [--eval-data FILE] [--sampling epochs|random] [--init W.safetensors] [--save W.safetensors] [--map NAMES.map] [--log run.jsonl] "
	"[--seed S] [--save-every N DIR [--keep K]] [--resume DIR] [--trace T.json] [--eval-every N [--eval-batches B]] "
	"[--max-skips K] [--loss-scale-init S]";

void planrt_option_error_(options_t *o, const char *fmt, ...)
{
	if (o->error[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->error, sizeof o->error, fmt, ap);
	va_end(ap);
}

/* strtoll / strtoull accept leading spaces and signs and wrap negatives for unsigned: only plain
 * decimal digits are numbers here */
static int all_digits(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* An integer option's value: plain decimal digits in [lo, hi] (an empty value, a sign, spaces or
 * a number out of range is an error naming the range, never clamped). */
static int parse_count(options_t *o, const char *opt, const char *v, long long lo, long long hi, int64_t *out)
{
	const char *what = lo > 0 ? "a positive integer" : "a non-negative integer";
	if (!*v) {
		planrt_option_error_(o, "%s needs %s, not an empty value", opt, what);
		return 0;
	}
	errno = 0;
	unsigned long long k = all_digits(v) ? strtoull(v, NULL, 10) : 0;
	if (!all_digits(v)) {
		planrt_option_error_(o, "%s needs %s, not %s", opt, what, v);
		return 0;
	}
	if (errno == ERANGE || k < (unsigned long long)lo || k > (unsigned long long)hi) {
		planrt_option_error_(o, "%s needs %s from %lld to %lld, not %s", opt, what, lo, hi, v);
		return 0;
	}
	*out = (int64_t)k;
	return 1;
}

/* An option given a second time is an error (never "the last one wins", which hides a typo in a
 * long job script): returns 1 the second time argv names opt. */
static int given_twice(options_t *o, char **argv, int at, const char *opt)
{
	for (int k = 1; k < at; k++)
		if (!strcmp(argv[k], opt)) {
			planrt_option_error_(o, "%s is given twice; give it once", opt);
			return 1;
		}
	return 0;
}

/* --data FILE, or a blend --data W1 FILE1 W2 FILE2 ... (Megatron's --data-path): the values up to
 * the next option; returns the index of the last one taken. */
static int parse_files(options_t *o, const char *opt, int argc, char **argv, int i, int *n, const char **files,
		       double *weights, int *blend)
{
	int last = i;
	while (last + 1 < argc && strncmp(argv[last + 1], "--", 2) && strcmp(argv[last + 1], "-h"))
		last++;
	int count = last - i;
	if (count == 0) {
		planrt_option_error_(o, "missing value after %s", opt);
		return i;
	}
	if (count == 1) {
		files[0] = argv[i + 1];
		*n = 1;
		if (!*files[0])
			planrt_option_error_(o, "%s needs a path, not an empty value", opt);
		return last;
	}
	if (count % 2 || count / 2 > PLANRT_MAX_FILES) {
		planrt_option_error_(o, "%s takes FILE or WEIGHT FILE pairs (a blend of at most %d files: %s 0.7 a.bin 0.3 "
				     "b.bin), not %d values",
				     opt, PLANRT_MAX_FILES, opt, count);
		return last;
	}
	*blend = 1;
	*n = count / 2;
	for (int k = 0; k < *n; k++) {
		const char *w = argv[i + 1 + 2 * k];
		char *end;
		errno = 0;
		double x = strtod(w, &end);
		if (end == w || *end || errno == ERANGE || !isfinite(x) || x <= 0)
			planrt_option_error_(o, "%s: '%s' is not a weight; a blend is WEIGHT FILE pairs with positive weights (%s "
					     "0.7 a.bin 0.3 b.bin)",
					     opt, w, opt);
		weights[k] = x;
		files[k] = argv[i + 2 + 2 * k];
	}
	return last;
}

/* Parses argv without failing: the first error is kept for after planrt_init, so that --help
 * anywhere is still answered before MPI starts. A value that looks like an option ("--x") is a
 * missing value; an empty value is an error; so is an option given twice. */
void planrt_parse_options_(int argc, char **argv, options_t *o)
{
	memset(o, 0, sizeof *o);
	o->steps = -1;
	o->seed = PLANRT_DEFAULT_SEED;
	o->eval_batches = 4;
	o->max_skips = 20;
	o->sampling = -1;
	const long long most = 1ll << 62;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			o->help = 1;
			continue;
		}
		const char **text = !strcmp(a, "--init")   ? &o->init
				    : !strcmp(a, "--save")   ? &o->save
				    : !strcmp(a, "--log")    ? &o->log
				    : !strcmp(a, "--resume") ? &o->resume
				    : !strcmp(a, "--trace")  ? &o->trace
				    : !strcmp(a, "--map")    ? &o->map
							     : NULL;
		int numeric = !strcmp(a, "--steps") || !strcmp(a, "--seed") || !strcmp(a, "--keep") ||
			      !strcmp(a, "--eval-every") || !strcmp(a, "--eval-batches") || !strcmp(a, "--max-skips") ||
			      !strcmp(a, "--loss-scale-init");
		int pair = !strcmp(a, "--save-every"); /* N DIR */
		int reshard = !strcmp(a, "--reshard"); /* SRC OUT */
		if (!reshard)
			o->nother++;
		if (!strcmp(a, "--data") || !strcmp(a, "--eval-data")) {
			int eval = a[2] == 'e';
			given_twice(o, argv, i, a);
			i = parse_files(o, a, argc, argv, i, eval ? &o->neval : &o->ndata, eval ? o->eval_files : o->data_files,
					eval ? o->eval_weights : o->data_weights, eval ? &o->eval_blend : &o->blend);
			if (!eval && o->ndata)
				o->data = o->data_files[0];
			continue;
		}
		if (!strcmp(a, "--sampling")) {
			given_twice(o, argv, i, a);
			const char *v = i + 1 < argc ? argv[++i] : "";
			if (!strcmp(v, "epochs") || !strcmp(v, "random"))
				o->sampling = !strcmp(v, "epochs") ? PLANRT_SAMPLE_EPOCHS : PLANRT_SAMPLE_RANDOM;
			else
				planrt_option_error_(o, "--sampling takes epochs (without replacement, the default) or random (with "
						     "replacement), not '%s'",
						     v);
			continue;
		}
		if (reshard) {
			given_twice(o, argv, i, a);
			if (i + 2 >= argc || !strncmp(argv[i + 1], "--", 2) || !strncmp(argv[i + 2], "--", 2)) {
				planrt_option_error_(o, "missing values after --reshard (--reshard CHECKPOINT OUT_DIR)");
				i = argc;
				continue;
			}
			o->reshard_from = argv[++i];
			o->reshard_to = argv[++i];
			for (size_t n = strlen(argv[i]); n > 1 && argv[i][n - 1] == '/'; n--)
				argv[i][n - 1] = 0; /* "OUT/" is OUT: no "OUT//step-N" in messages */
			if (!*o->reshard_from || !*o->reshard_to)
				planrt_option_error_(o, "--reshard needs a checkpoint and an output directory, not an empty value");
			continue;
		}
		if (!text && !numeric && !pair) {
			planrt_option_error_(o, "unknown option %s", a);
			continue;
		}
		given_twice(o, argv, i, a);
		int values = pair ? 2 : 1;
		int missing = 0;
		for (int k = 1; k <= values; k++)
			missing |= i + k >= argc || !strncmp(argv[i + k], "--", 2) || !strcmp(argv[i + k], "-h");
		if (missing) {
			planrt_option_error_(o, pair ? "missing values after %s (--save-every N DIR)" : "missing value after %s", a);
			continue;
		}
		const char *v = argv[++i];
		if (text) {
			if (!*v)
				planrt_option_error_(o, "%s needs a path, not an empty value", a);
			*text = v;
		} else if (pair) {
			parse_count(o, "--save-every", v, 1, most, &o->save_every);
			o->save_every_dir = argv[++i];
			if (!*o->save_every_dir)
				planrt_option_error_(o, "--save-every needs a directory after its step count, not an empty value");
		} else if (!strcmp(a, "--steps")) {
			parse_count(o, "--steps", v, 0, most, &o->steps);
		} else if (!strcmp(a, "--keep")) {
			parse_count(o, "--keep", v, 1, 1000000, &o->keep);
		} else if (!strcmp(a, "--eval-every")) {
			parse_count(o, "--eval-every", v, 1, most, &o->eval_every);
		} else if (!strcmp(a, "--eval-batches")) {
			parse_count(o, "--eval-batches", v, 1, 1000000, &o->eval_batches);
		} else if (!strcmp(a, "--max-skips")) {
			parse_count(o, "--max-skips", v, 1, 1000000, &o->max_skips);
			o->max_skips_given = 1;
		} else if (!strcmp(a, "--loss-scale-init")) {
			char *end;
			errno = 0;
			double x = strtod(v, &end);
			if (*end || errno == ERANGE || !isfinite(x) || x <= 0)
				planrt_option_error_(o, "--loss-scale-init needs a positive finite number (e.g. 65536), not %s", v);
			else
				o->loss_scale_init = x;
		} else {
			errno = 0;
			unsigned long long s = all_digits(v) ? strtoull(v, NULL, 10) : 0;
			if (!all_digits(v) || errno == ERANGE)
				planrt_option_error_(o, "--seed needs an unsigned integer (0 to 18446744073709551615), not %s", v);
			else
				o->seed = s;
			o->seed_given = 1;
		}
	}
	if (!o->help && !o->error[0] && o->reshard_from && o->nother)
		planrt_option_error_(o, "--reshard CHECKPOINT OUT_DIR takes no other option (it trains nothing)");
	if (!o->help && !o->error[0] && !o->reshard_from && (o->steps < 0 || !o->data))
		planrt_option_error_(o, "--steps and --data are required");
	if (!o->help && !o->error[0] && o->keep && !o->save_every_dir)
		planrt_option_error_(o, "--keep needs --save-every N DIR (it keeps the newest K checkpoints there)");
	if (!o->help && !o->error[0] && o->neval && !o->eval_every)
		planrt_option_error_(o, "--eval-data needs --eval-every N (it says when to evaluate on it)");
	if (!o->help && !o->error[0] && o->resume && o->init)
		planrt_option_error_(o, "--resume and --init both set the weights; pass one of them");
}

static void mesh_text(const planrt_program_t *p, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	for (int a = 0; a < p->naxes && len < n; a++)
		len += (size_t)snprintf(buf + len, n - len, "%s%s = %d", a ? ", " : "",
					p->axis_names && p->axis_names[a] ? p->axis_names[a] : "?", p->axis_sizes[a]);
	if (!p->naxes)
		snprintf(buf, n, "no axes");
}

/* Under mpirun every rank would print the help; only the first does (the launchers' rank
 * variables; no MPI call is made for --help). */
int planrt_launcher_rank0_(void)
{
	const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return !strcmp(v, "0");
	}
	return 1;
}

void planrt_print_help_(const char *prog_name, const planrt_program_t *p)
{
	char mesh[512];
	mesh_text(p, mesh, sizeof mesh);
	printf("usage: %s %s\n\n", prog_name, planrt_usage_line_);
	printf("Trains plan %s of model %s%s%s%s.\n", p->plan ? p->plan : "?", p->model ? p->model : "?",
	       p->source ? " (" : "", p->source ? p->source : "", p->source ? ")" : "");
	printf("  mesh: %s; world %d ranks: launch with mpirun -np %d %s ...\n", mesh, p->world, p->world, prog_name);
	if (p->pipe_axis >= 0 && p->pipe_axis < p->naxes)
		printf("  pipeline: %d stages on axis %s, %d micro-batches\n", p->nstages,
		       p->axis_names && p->axis_names[p->pipe_axis] ? p->axis_names[p->pipe_axis] : "?", p->micro_batches);
	else
		printf("  no pipeline; %d micro-batch%s per step\n", p->micro_batches, p->micro_batches == 1 ? "" : "es");
	printf("  step: %lld samples of %lld tokens (vocabulary %lld)\n", (long long)p->batch, (long long)p->seq,
	       (long long)p->vocab);
	char cpu[512];
	if (planrt_cpu_select() == planrt_success)
		planrt_cpu_describe(cpu, sizeof cpu);
	else
		snprintf(cpu, sizeof cpu, "%s", planrt_last_error());
	printf("  cpu: %s\n", cpu);
	planrt_threads_describe(cpu, sizeof cpu);
	printf("  threads: %s\n\n", cpu);
	printf("options:\n"
	       "  --steps K             optimizer steps to train (required; 0 initialises, loads and saves)\n"
	       "  --data FILE           the training data (required; docs/data.md): a text file (bytes), a token\n"
	       "                        file (nanoGPT .bin, an llm.c shard or a glob of shards 'dir/train_*.bin', a\n"
	       "                        Megatron PREFIX with PREFIX.bin/.idx), or a data set of named tensors\n"
	       "                        (.safetensors, a directory of NAME.npy); W1 FILE1 W2 FILE2 ...: a blend\n"
	       "  --eval-data FILE      what --eval-every evaluates on (the same forms); default: the last tenth\n"
	       "                        of --data, which training then never sees\n"
	       "  --sampling RULE       epochs (default: every sample once per epoch, shuffled per epoch from the\n"
	       "                        seed) or random (with replacement: the rule of runs before epochs existed)\n"
	       "  --init W.safetensors  initial weights (default: drawn from the seed)\n"
	       "  --save W.safetensors  write the trained weights there (temporary file, fsync, rename)\n"
	       "  --map NAMES.map       --init and --save under another framework's names and layouts\n"
	       "                        (stdlib/maps/hf_llama.map: Hugging Face's Llama)\n"
	       "  --log run.jsonl       rank 0 writes one JSON line of metrics per step (appended to with --resume)\n"
	       "  --seed S              seed of initialisation, data order and dropout (default %d)\n"
	       "  --save-every N DIR    every N steps and after the last, a sharded checkpoint in DIR/step-K (each\n"
	       "                        rank its pieces of the parameters, optimizer state and master weights, and\n"
	       "                        a manifest written last; atomic, checksummed)\n"
	       "  --keep K              keep the newest K checkpoints in DIR (default: all)\n"
	       "  --resume DIR          continue from the newest complete checkpoint in DIR (or DIR/step-K): bit\n"
	       "                        for bit under the plan that wrote it, resharded under another plan\n"
	       "  --reshard CKPT OUT    no training: the checkpoint CKPT (a --save-every directory or a step-N\n"
	       "                        of any plan of this model) rewritten into OUT/step-N as this plan holds it;\n"
	       "                        one process, without mpirun; then --resume OUT (planc reshard does the same)\n"
	       "  --trace T.json        a Chrome-trace / Perfetto timeline of every rank (compute, collectives,\n"
	       "                        transfers, waits)\n"
	       "  --eval-every N        every N steps, the loss (and a cross-entropy's accuracy) on held-out data\n"
	       "                        (of --data, or --eval-data) over --eval-batches B batches (default 4)\n"
	       "  --max-skips K         fp16 loss scaling: stop after K consecutive skipped steps (default 20)\n"
	       "  --loss-scale-init S   fp16 loss scaling: the first step's scale (default: the plan's, 65536 for\n"
	       "                        dynamic)\n"
	       "  --help, -h            this text\n"
	       "generation (built with planc build --generate; docs/generate.md):\n"
	       "  --generate TEXT       continue TEXT (bytes as tokens) instead of training, from --init W or\n"
	       "                        --resume CKPT: [--max-tokens N (32)] [--temperature T (0: greedy)]\n"
	       "                        [--top-k K (0: all)] [--seed S] [--print-ids] [--logits FILE]%s\n"
	       "environment: PLANRT_WATCHDOG=SECONDS (stall limit, 0 off), PLANRT_REPORT_MEMORY, "
	       "PLANRT_REPORT_TIMING, PLANRT_REPORT_COMM, PLANRT_REPORT_ATTENTION (one stderr line per rank),\n"
	       "  PLANRT_STRAGGLER=RANK:MS or random:MS (that rank, or one drawn per step, sleeps MS ms at each "
	       "step's start),\n"
	       "  PLANRT_ISA=LEVEL (the instruction-set level of the fused loops and kernels, one of the cpu line's;\n"
	       "  default: the best this CPU runs)\n",
	       PLANRT_DEFAULT_SEED, p->decode ? "" : "\n                        (this program was built without it)");
	fflush(stdout);
}
