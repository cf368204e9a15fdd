/* resume.c: a checkpoint's run against this one. The manifest's run (planrt_run_info_ writes it)
 * must be of the same model and data (the data file identified by its content: a hash of sampled
 * blocks, not its name or size), the same held-out split and seed, and a step within --steps; a
 * checkpoint of another plan is resharded (equal up to float rounding, said once), unless either
 * plan's sync mode keeps per-replica state (policy.c), which is refused before any step. */
#include "driver.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The data file's identity: FNV-1a of its size and of 64 blocks of 4 KiB spread evenly over it
 * (the first at its start, the last at its end; a file of at most 256 KiB is read whole), so that
 * another corpus of the same size (the same text reversed, another shard) is told apart by
 * reading 256 KiB at most. Computed once per process. */
static const char *data_content(const char *path)
{
	static char id[48];
	enum { BLOCKS = 64, BLOCK = 4096 };
	if (id[0])
		return id;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		if (fd >= 0)
			close(fd);
		return "?";
	}
	uint64_t h = 0xcbf29ce484222325ull, size = (uint64_t)st.st_size;
	unsigned char buf[BLOCK];
	for (int i = 0; i < 8; i++)
		h = (h ^ (unsigned char)(size >> (8 * i))) * 0x100000001b3ull;
	uint64_t span = size > (uint64_t)BLOCKS * BLOCK ? size - BLOCK : 0;
	for (int b = 0; b < BLOCKS; b++) {
		uint64_t at = span ? span * (uint64_t)b / (BLOCKS - 1) : (uint64_t)b * BLOCK;
		if (at >= size)
			break;
		ssize_t got = pread(fd, buf, BLOCK, (off_t)at);
		for (ssize_t k = 0; k < got; k++)
			h = (h ^ buf[k]) * 0x100000001b3ull;
	}
	close(fd);
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
	json_t *run = json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:I, s:I, s:I, s:I, s:I}}",
				"step", (json_int_t)step, "plan", p->plan ? p->plan : "?", "model", p->model ? p->model : "?",
				"source", p->source ? p->source : "?", "fingerprint", p->fingerprint ? p->fingerprint : "?",
				"sync", p->sync ? p->sync : "strict", "world", p->world, "mesh", mesh, "rng", "seed", s,
				"generator", "philox4x32-10: init (seed, name, element), data (seed, step, sample)",
				"next_dropout_key", key, "data", "path", o->data, "content", data_content(o->data), "tokens",
				(json_int_t)planrt_data_tokens(data),
				"train_tokens", (json_int_t)train_tokens, "next_step", (json_int_t)step, "samples_per_step",
				(json_int_t)p->batch, "sequence", (json_int_t)p->seq);
	if (!run)
		planrt_fatal("out of memory describing a checkpoint");
	return run;
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
	if (content && strcmp(content, data_content(o->data)))
		planrt_fatal("--resume: the checkpoint was trained on other data: '%s' (content %s) is not the file it was "
			     "trained on ('%s', content %s; the same size, other bytes); resume on the same data",
			     o->data, data_content(o->data), json_string_value(json_object_get(d, "path")) ?: "?", content);
	if (!content && rank == 0)
		fprintf(stderr, "planrt: note: the checkpoint predates data content hashes: its data file was checked by size "
				"only\n");
	if (json_integer_value(json_object_get(d, "train_tokens")) != train_tokens)
		planrt_fatal("--resume: the checkpoint's run trained on the first %lld tokens, this one on %lld (--eval-every "
			     "holds out the last tenth); resume with the same --eval-every setting",
			     (long long)json_integer_value(json_object_get(d, "train_tokens")), (long long)train_tokens);
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
	if (!exact && !planrt_sync_reshardable_(sync))
		planrt_fatal("--resume: the checkpoint of plan %s (sync %s) holds each replica's own state, which "
			     "only the same plan can read; resume it with plan %s",
			     plan, sync, plan);
	const char *into = p->sync ? p->sync : "strict";
	if (!exact && !planrt_sync_reshardable_(into)) /* its state would start afresh: a silent restart */
		planrt_fatal("--resume: plan %s (sync %s) keeps each replica's own weights and optimizer state, which it "
			     "reads only from its own checkpoints; this checkpoint is of plan %s (sync %s), which would leave "
			     "them at their initial values; resume it with plan %s or another %s plan",
			     p->plan, into, plan, sync, plan, planrt_sync_reshardable_(sync) ? "strict" : sync);
	const char *from = json_string_value(json_object_get(json_object_get(m, "resharded_from"), "plan"));
	if (rank == 0 && !exact && from && !strcmp(plan, p->plan ? p->plan : "?"))
		fprintf(stderr, "planrt: note: the checkpoint was resharded offline from plan %s into this plan %s; the run "
				"continues as resuming plan %s's checkpoint here would, equal up to float rounding to plan %s "
				"continuing\n",
			from, plan, from, from);
	else if (rank == 0 && !exact)
		fprintf(stderr, "planrt: note: resharding the checkpoint of plan %s (%s) into plan %s; the run continues "
				"equal up to float rounding, not bit for bit\n",
			plan, json_string_value(json_object_get(m, "fingerprint")) ?: "?", p->plan);
	if (rank == 0 && !exact) {
		if (json_array_size(json_object_get(m, "local")))
			fprintf(stderr, "planrt: note: the rank-local state of plan %s (gradient compression's error feedback) "
					"restarts from zero under plan %s\n",
				plan, p->plan);
	}
	*seed = s;
	return step;
}
