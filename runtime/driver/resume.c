/* resume.c: a checkpoint's run against this one. The manifest's run (planrt_run_info_ writes it)
 * must be of the same model and data (every file of the data, a blend's and a glob's shards
 * included, identified by its content: a hash of sampled blocks, not its name or size), the same
 * sampling rule and held-out split, the same seed, the same samples per step and the same
 * optimizer (its settings may change: a note says which), and a step within --steps; a
 * checkpoint of another plan is resharded (equal up to float rounding, said once), unless either
 * plan's sync mode keeps per-replica state (policy.c), which is refused before any step. A
 * checkpoint written before epochs existed has no "sampling": its run sampled with replacement,
 * and it resumes so. */
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* FNV-1a of one file's size and of 64 blocks of 4 KiB spread evenly over it (the first at its
 * start, the last at its end; a file of at most 256 KiB is read whole) folded into h; 0 when the
 * file cannot be read. */
static int fold_file(uint64_t *h, const char *path)
{
	enum { BLOCKS = 64, BLOCK = 4096 };
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	uint64_t size = (uint64_t)st.st_size;
	unsigned char buf[BLOCK];
	for (int i = 0; i < 8; i++)
		*h = (*h ^ (unsigned char)(size >> (8 * i))) * 0x100000001b3ull;
	uint64_t span = size > (uint64_t)BLOCKS * BLOCK ? size - BLOCK : 0;
	for (int b = 0; b < BLOCKS && S_ISREG(st.st_mode); b++) {
		uint64_t at = span ? span * (uint64_t)b / (BLOCKS - 1) : (uint64_t)b * BLOCK;
		if (at >= size)
			break;
		ssize_t got = pread(fd, buf, BLOCK, (off_t)at);
		for (ssize_t k = 0; k < got; k++)
			*h = (*h ^ buf[k]) * 0x100000001b3ull;
	}
	close(fd);
	return 1;
}

/* The training data's identity: every file it reads (each source of a blend, each shard of a glob,
 * in order; a data set's path) folded by fold_file, so that another corpus of the same size (the
 * same text reversed, another shard) is told apart by reading 256 KiB per file at most. Computed
 * once per process. */
static const char *data_content(planrt_data_t data, const options_t *o)
{
	static char id[48];
	if (id[0])
		return id;
	const char *paths[PLANRT_MAX_FILES * 4];
	int n = planrt_data_files_(data, paths, (int)(sizeof paths / sizeof *paths));
	if (n == 0 && o->data) /* a data set */
		paths[n++] = o->data;
	uint64_t h = 0xcbf29ce484222325ull;
	for (int i = 0; i < n; i++)
		if (!fold_file(&h, paths[i]))
			return "?";
	snprintf(id, sizeof id, "fnv1a64-sampled:%016llx", (unsigned long long)h);
	return id;
}

/* The run's position for a checkpoint's manifest (planrt_ckpt.h). */
json_t *planrt_run_info_(const planrt_program_t *p, const options_t *o, int64_t step, uint64_t seed, planrt_data_t data,
			 int64_t train_tokens)
{
	char s[32], key[32];
	snprintf(s, sizeof s, "%llu", (unsigned long long)seed);
	snprintf(key, sizeof key, "%llu", (unsigned long long)(seed * 0x9E3779B97F4A7C15ull + (uint64_t)step));
	json_t *mesh = json_array();
	for (int a = 0; a < p->naxes; a++)
		json_array_append_new(mesh, json_pack("[s, i]", p->axis_names[a], p->axis_sizes[a]));
	char files[2048];
	planrt_data_describe_(data, files, sizeof files);
	int epochs = !strcmp(planrt_data_sampling_(data), "epochs");
	json_t *run = json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:I, s:I, s:I, s:I, "
				"s:I, s:s, s:s}, s:s}",
				"step", (json_int_t)step, "plan", p->plan ? p->plan : "?", "model", p->model ? p->model : "?",
				"source", p->source ? p->source : "?", "fingerprint", p->fingerprint ? p->fingerprint : "?",
				"sync", p->sync ? p->sync : "strict", "world", p->world, "mesh", mesh, "rng", "seed", s,
				"generator", "philox4x32-10: init (seed, name, element), data (seed, step, sample)",
				"next_dropout_key", key, "data", "path", o->data, "content", data_content(data, o), "tokens",
				(json_int_t)planrt_data_tokens(data),
				epochs ? "train_samples" : "train_tokens", (json_int_t)train_tokens, "next_step", (json_int_t)step,
				"samples_per_step", (json_int_t)p->batch, "sequence", (json_int_t)p->seq, "sampling",
				planrt_data_sampling_(data), "files", files, "optimizer", p->optimizer ? p->optimizer : "?");
	if (!run)
		planrt_fatal("out of memory describing a checkpoint");
	return run;
}

/* The optimizer of the checkpoint's run ("adamw(lr = 0.0003, ...)", NULL from older checkpoints)
 * against this plan's: another kind has other state (Adam's moments are not SGD's momentum), so
 * it is refused; other settings (a new learning rate) continue, and a note says what changed. */
static void check_optimizer(const char *theirs, const char *plan, const planrt_program_t *p, int rank)
{
	const char *ours = p->optimizer;
	if (!theirs || !ours || !strcmp(theirs, ours))
		return;
	size_t a = strcspn(theirs, "("), b = strcspn(ours, "(");
	if (a != b || strncmp(theirs, ours, a))
		planrt_fatal("--resume: the checkpoint's run (plan %s) trained with %s, plan %s with %s; another optimizer "
			     "has other state, so the run cannot continue as it began: resume with a plan whose optimizer is "
			     "%.*s (its settings may differ), or start a new run with --init from the checkpoint's weights",
			     plan, theirs, p->plan, ours, (int)a, theirs);
	if (rank == 0)
		fprintf(stderr, "planrt: note: the optimizer's settings changed: the checkpoint's run used %s, this run %s "
				"(its moments carry over)\n",
			theirs, ours);
}

/* The sampling rule of a resumed run is its checkpoint's (random for one written before epochs
 * existed); --sampling may say it again, not change it. Without a checkpoint: --sampling, or epochs. */
int planrt_resume_sampling_(planrt_ckpt_t *c, const options_t *o)
{
	if (!c)
		return o->sampling >= 0 ? o->sampling : PLANRT_SAMPLE_EPOCHS;
	const char *theirs = json_string_value(json_object_get(json_object_get(planrt_ckpt_manifest(c), "data"), "sampling"));
	int rule = theirs && !strcmp(theirs, "epochs") ? PLANRT_SAMPLE_EPOCHS : PLANRT_SAMPLE_RANDOM;
	if (o->sampling >= 0 && o->sampling != rule)
		planrt_fatal("--resume: the checkpoint's run sampled its data %s; --sampling %s would draw other batches from "
			     "here on: drop --sampling (a resumed run keeps its rule)",
			     rule == PLANRT_SAMPLE_EPOCHS ? "by epochs" : "with replacement (random, the rule before epochs)",
			     o->sampling == PLANRT_SAMPLE_EPOCHS ? "epochs" : "random");
	return rule;
}

/* A checkpoint this program cannot read back as its own (planrt_ckpt_exact: another fingerprint or
 * world) is read as another plan's: its blocks and shards regathered, the run equal up to float
 * rounding. Refused where state would be lost (local SGD's and async's replicas). A checkpoint of
 * the same plan name with another fingerprint was written by a program compiled differently
 * (another planc version renumbers buffers, an edited plan) and is named as such, so that "resume
 * it with plan P" never tells a user to do what they just did. */
static void check_reshard(json_t *m, const char *plan, const char *sync, const planrt_program_t *p, int rank)
{
	const char *fp = json_string_value(json_object_get(m, "fingerprint")) ?: "?";
	const char *from = json_string_value(json_object_get(json_object_get(m, "resharded_from"), "plan"));
	int same_name = !strcmp(plan, p->plan ? p->plan : "?");
	int rebuilt = same_name && !from;
	if (rebuilt && !planrt_sync_reshardable_(sync))
		planrt_fatal("--resume: the checkpoint of plan %s (sync %s) was written by a program compiled differently "
			     "(fingerprint %s, this program's %s: another planc version or an edited plan), and it holds "
			     "each replica's own state, which only the program that wrote it can read; resume with that "
			     "program (built by the planc that wrote it, from the same plan text), or start a new run",
			     plan, sync, fp, p->fingerprint ? p->fingerprint : "?");
	if (!planrt_sync_reshardable_(sync))
		planrt_fatal("--resume: the checkpoint of plan %s (sync %s) holds each replica's own state, which "
			     "only the same plan can read; resume it with plan %s",
			     plan, sync, plan);
	const char *into = p->sync ? p->sync : "strict";
	if (!planrt_sync_reshardable_(into)) /* its state would start afresh: a silent restart */
		planrt_fatal("--resume: plan %s (sync %s) keeps each replica's own weights and optimizer state, which it "
			     "reads only from its own checkpoints; this checkpoint is of plan %s (sync %s), which would leave "
			     "them at their initial values; resume it with plan %s or another %s plan",
			     p->plan, into, plan, sync, plan, planrt_sync_reshardable_(sync) ? "strict" : sync);
	if (rank != 0)
		return;
	if (from && same_name)
		fprintf(stderr, "planrt: note: the checkpoint was resharded offline from plan %s into this plan %s; the run "
				"continues as resuming plan %s's checkpoint here would, equal up to float rounding to plan %s "
				"continuing\n",
			from, plan, from, from);
	else if (rebuilt)
		fprintf(stderr, "planrt: note: the checkpoint of plan %s was written by a program compiled differently "
				"(fingerprint %s, this program's %s: another planc version or an edited plan); it is read as "
				"another plan's checkpoint is, so the run continues equal up to float rounding, not bit for bit\n",
			plan, fp, p->fingerprint ? p->fingerprint : "?");
	else
		fprintf(stderr, "planrt: note: resharding the checkpoint of plan %s (%s) into plan %s; the run continues "
				"equal up to float rounding, not bit for bit\n",
			plan, fp, p->plan);
	if (json_array_size(json_object_get(m, "local")))
		fprintf(stderr, "planrt: note: the rank-local state of plan %s (gradient compression's error feedback) "
				"restarts from zero under plan %s\n",
			plan, p->plan);
}

/* --resume: the checkpoint's run against this one; sets the seed and returns the first step. */
int64_t planrt_check_resume_(planrt_ckpt_t *c, const planrt_program_t *p, const options_t *o, planrt_data_t data,
			     int64_t train_tokens, uint64_t *seed, int rank)
{
	json_t *m = planrt_ckpt_manifest(c);
	const char *model = json_string_value(json_object_get(m, "model")) ?: "?";
	const char *plan = json_string_value(json_object_get(m, "plan")) ?: "?";
	const char *sync = json_string_value(json_object_get(m, "sync")) ?: "strict";
	json_t *d = json_object_get(m, "data");
	int64_t step = json_integer_value(json_object_get(m, "step"));
	unsigned long long s = strtoull(json_string_value(json_object_get(json_object_get(m, "rng"), "seed")) ?: "0", NULL, 10);
	if (strcmp(model, p->model ? p->model : "?"))
		planrt_fatal("--resume: the checkpoint is of model '%s' (plan %s), this program trains model '%s'; resume it "
			     "with a plan of '%s'",
			     model, plan, p->model, model);
	if (json_integer_value(json_object_get(d, "tokens")) != planrt_data_tokens(data))
		planrt_fatal("--resume: the checkpoint was trained on data of %lld tokens ('%s'), --data '%s' has %lld; "
			     "resume on the same data",
			     (long long)json_integer_value(json_object_get(d, "tokens")),
			     json_string_value(json_object_get(d, "path")) ?: "?", o->data, (long long)planrt_data_tokens(data));
	const char *content = json_string_value(json_object_get(d, "content"));
	if (content && strcmp(content, data_content(data, o))) {
		char ours[2048];
		planrt_data_describe_(data, ours, sizeof ours);
		planrt_fatal("--resume: the checkpoint was trained on other data: --data %s (content %s) is not what it was "
			     "trained on (%s, content %s; the same number of tokens, other bytes); resume on the same data",
			     ours, data_content(data, o),
			     json_string_value(json_object_get(d, "files")) ?: json_string_value(json_object_get(d, "path")) ?: "?",
			     content);
	}
	if (!content && rank == 0)
		fprintf(stderr, "planrt: note: the checkpoint predates data content hashes: its data file was checked by size "
				"only\n");
	int epochs = !strcmp(planrt_data_sampling_(data), "epochs");
	json_t *train = json_object_get(d, epochs ? "train_samples" : "train_tokens");
	if (json_integer_value(train) != train_tokens)
		planrt_fatal(epochs ? "--resume: the checkpoint's run trained on %lld samples, this one on %lld (--eval-every "
				      "holds out the last tenth unless --eval-data is given); resume with the same --eval-every "
				      "and --eval-data settings"
				    : "--resume: the checkpoint's run trained on the first %lld tokens, this one on %lld "
				      "(--eval-every holds out the last tenth); resume with the same --eval-every setting",
			     (long long)json_integer_value(train), (long long)train_tokens);
	json_int_t per_step = json_integer_value(json_object_get(d, "samples_per_step"));
	if (json_object_get(d, "samples_per_step") && per_step != p->batch)
		planrt_fatal("--resume: the checkpoint's run (plan %s) took %lld samples per step, plan %s takes %lld; the data "
			     "order, the learning-rate schedule and the optimizer's step count are per step, so the run would "
			     "not continue as it began: resume with a plan of batch B = %lld",
			     plan, (long long)per_step, p->plan, (long long)p->batch, (long long)per_step);
	check_optimizer(json_string_value(json_object_get(m, "optimizer")), plan, p, rank);
	if (o->seed_given && o->seed != s)
		planrt_fatal("--resume: the checkpoint's run has --seed %llu, this one %llu; drop --seed (a resumed run "
			     "keeps its seed)",
			     s, (unsigned long long)o->seed);
	if (step > o->steps)
		planrt_fatal("--resume: the checkpoint is of step %lld, past --steps %lld; pass --steps above it",
			     (long long)step, (long long)o->steps);
	int exact = planrt_ckpt_exact(c);
	if (rank == 0 && json_integer_value(json_object_get(m, "version")) < 2)
		fprintf(stderr, "planrt: note: the checkpoint is of format 1 (an older planrt): its manifest cannot be checked "
				"against its files\n");
	if (!exact)
		check_reshard(m, plan, sync, p, rank);
	*seed = s;
	return step;
}
