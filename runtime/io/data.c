/* data.c: a run's --data (and --eval-data): which sample each row of a step's global batch is, and
 * its tokens. docs/data.md is this file's specification.
 *
 * The data is token files or a data set of named tensors (dataset.c). Token data is one source or
 * a blend of several, each a token file (token_file.c) or llm.c shards named by a glob pattern
 * (concatenated in name order). A source's samples are windows of seq + 1 tokens; which window a
 * row reads is decided by the sampling rule:
 *   - epochs (the default): window k is tokens [k seq, k seq + seq] (N = (tokens - 1) / seq of
 *     them, each token a target once); global sample g = step * batch + row is the source's sample
 *     k (g itself, or Megatron's blending rule over the sources: sampling.c), and sample k is
 *     window planrt_shuffle_(seed_s, k / N, k mod N, N): epochs without replacement, each in its
 *     own order;
 *   - random (every run before epochs existed; their checkpoints resume with it): row i of step t
 *     is the window starting at Philox(seed, t, i) mod (tokens - seq - 1), with replacement.
 * A data set's samples are its rows, under the same two rules. With --eval-every the last tenth
 * of every source's samples is held out (training never draws them) and evaluation batch b reads
 * held-out samples b * batch + row in order (blended by the same weights); --eval-data names
 * separate data for it instead, all of it held out. Everything depends on (files, seed, step)
 * only, so every plan and every resumed run draws the same batches. */
#include "planrt_tokens.h"
#include "planrt_dataset.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct planrt_source {
	char *spec;               /* as given: a path or a glob pattern */
	int nshards;
	planrt_tokens_t **shard;  /* concatenated */
	int64_t *first;           /* [nshards + 1]: the first token of each shard */
	int64_t ntok, windows, train; /* epochs: windows [0, train) train, [train, windows) are held out */
	double weight;
} source_t;

struct planrt_data {
	int sampling;
	int64_t seq, vocab, batch;
	int nsrc;
	source_t src[PLANRT_MAX_BLEND];
	planrt_blend_t blend, eval_blend;
	int held_out;            /* evaluation reads this data's held-out samples */
	struct planrt_data *eval; /* --eval-data */
	/* random sampling of one token source: windows start in tokens [0, train_tokens) */
	int64_t train_tokens;
	/* a data set: samples [0, set_train) train, the rest are held out */
	planrt_dataset_t set;
	int64_t set_train;
};

/* ------------------------------------------------------------------ sources */

static void source_close(source_t *s)
{
	for (int i = 0; i < s->nshards; i++)
		planrt_tokens_close_(s->shard[i]);
	free(s->shard);
	free(s->first);
	free(s->spec);
	memset(s, 0, sizeof *s);
}

/* a path, or a glob pattern naming llm.c's shards (in name order) */
static planrt_result_t source_open(source_t *s, const char *spec, int64_t vocab)
{
	glob_t g = {0};
	int pattern = strpbrk(spec, "*?[") != NULL;
	if (pattern && glob(spec, 0, NULL, &g) != 0)
		return planrt_error_(planrt_io_error, "data '%s' matches no file; check the pattern (llm.c shards: "
				     "'dir/name_train_*.bin')",
				     spec);
	int n = pattern ? (int)g.gl_pathc : 1;
	s->spec = strdup(spec);
	s->shard = calloc((size_t)n, sizeof *s->shard);
	s->first = calloc((size_t)n + 1, sizeof *s->first);
	planrt_result_t r = s->spec && s->shard && s->first ? planrt_success
							     : planrt_error_(planrt_system_error, "out of memory opening '%s'", spec);
	for (int i = 0; i < n && r == planrt_success; i++) {
		r = planrt_tokens_open_(pattern ? g.gl_pathv[i] : spec, vocab, &s->shard[i]);
		if (r == planrt_success) {
			s->nshards++;
			s->first[i + 1] = s->first[i] + planrt_tokens_count_(s->shard[i]);
		}
	}
	if (pattern)
		globfree(&g);
	s->ntok = s->first[s->nshards];
	if (r != planrt_success)
		source_close(s);
	return r;
}

/* tokens [at, at + n) of the source, across shards */
static void source_read(const source_t *s, int64_t at, int64_t n, int32_t *dst)
{
	int lo = 0, hi = s->nshards - 1;
	while (lo < hi) { /* the shard holding at */
		int mid = (lo + hi + 1) / 2;
		if (s->first[mid] <= at)
			lo = mid;
		else
			hi = mid - 1;
	}
	while (n > 0) {
		int64_t in = at - s->first[lo], take = s->first[lo + 1] - at < n ? s->first[lo + 1] - at : n;
		planrt_tokens_read_(s->shard[lo], in, take, dst);
		dst += take;
		at += take;
		n -= take;
		lo++;
	}
}

/* the first token of the document holding token at (shard boundaries are document boundaries) */
static int64_t source_doc_start(const source_t *s, int64_t at)
{
	int sh = 0;
	while (sh + 1 < s->nshards && s->first[sh + 1] <= at)
		sh++;
	return s->first[sh] + planrt_tokens_doc_start_(s->shard[sh], at - s->first[sh]);
}

/* ------------------------------------------------------------------ opening */

static const char *sampling_name(int sampling)
{
	return sampling == PLANRT_SAMPLE_EPOCHS ? "epochs" : "random";
}

/* The samples each source trains on and holds out. */
static planrt_result_t split(planrt_data_t d, int all_held)
{
	const char *what = d->set ? "samples" : "windows";
	for (int i = 0; i < d->nsrc || (d->set && i == 0); i++) {
		source_t *s = d->set ? NULL : &d->src[i];
		const char *name = s ? s->spec : "the data set";
		int64_t n = s ? s->windows : planrt_dataset_samples(d->set);
		int64_t held = all_held ? n : d->held_out ? (n / 10 > 1 ? n / 10 : 1) : 0;
		if (!all_held && n - held < 1)
			return planrt_error_(planrt_format_error,
					     "data '%s' has %lld %s, too few to hold out %lld for evaluation and train on the rest; "
					     "use more data, --eval-data FILE or drop --eval-every",
					     name, (long long)n, what, (long long)held);
		if (s)
			s->train = n - held;
		else
			d->set_train = n - held;
	}
	return planrt_success;
}

/* Every source opened and split; the step's batch against the training samples. */
static planrt_result_t open_sources(planrt_data_t d, int n, const char *const *paths, const double *weights,
				    int all_held)
{
	if (n < 1 || n > PLANRT_MAX_BLEND)
		return planrt_error_(planrt_invalid_argument, "--data names %d files; a blend has 1 to %d", n, PLANRT_MAX_BLEND);
	double w[PLANRT_MAX_BLEND];
	for (int i = 0; i < n; i++) {
		w[i] = weights ? weights[i] : 1.0;
		if (!(w[i] > 0))
			return planrt_error_(planrt_invalid_argument, "--data: the weight of '%s' is %g; weights are positive",
					     paths[i], w[i]);
		if (planrt_dataset_path(paths[i]) && n > 1)
			return planrt_error_(planrt_invalid_usage, "--data: '%s' is a data set of named tensors; a blend mixes "
					     "token files only",
					     paths[i]);
	}
	if (planrt_dataset_path(paths[0])) {
		planrt_result_t r = planrt_dataset_open(paths[0], &d->set);
		return r != planrt_success ? r : split(d, all_held);
	}
	if (d->seq < 1 || d->vocab < 1)
		return planrt_error_(planrt_invalid_argument, "data '%s': sequence length %lld and vocabulary %lld must be >= 1",
				     paths[0], (long long)d->seq, (long long)d->vocab);
	if (n > 1 && d->sampling != PLANRT_SAMPLE_EPOCHS)
		return planrt_error_(planrt_invalid_usage, "--data: a blend of several files samples by epochs; drop "
				     "--sampling random");
	for (int i = 0; i < n; i++) {
		planrt_result_t r = source_open(&d->src[i], paths[i], d->vocab);
		if (r != planrt_success)
			return r;
		d->nsrc++;
		source_t *s = &d->src[i];
		s->weight = w[i];
		if (s->ntok < d->seq + 2)
			return planrt_error_(planrt_format_error,
					     "data '%s' has %lld tokens, too few for a sample of %lld + 1 tokens; use a file of at "
					     "least %lld tokens or a shorter sequence",
					     s->spec, (long long)s->ntok, (long long)d->seq, (long long)(d->seq + 2));
		s->windows = (s->ntok - 1) / d->seq;
	}
	planrt_blend_init_(&d->blend, n, w);
	planrt_blend_init_(&d->eval_blend, n, w);
	return split(d, all_held);
}

/* random sampling's held-out split (tokens): the last tenth, at least one window */
static planrt_result_t hold_out_tokens(planrt_data_t d)
{
	int64_t ntok = d->src[0].ntok;
	int64_t held = ntok / 10 > d->seq + 2 ? ntok / 10 : d->seq + 2;
	if (ntok - held < d->seq + 2)
		return planrt_error_(planrt_format_error,
				     "the data has %lld tokens, too few to hold out %lld for evaluation and train on the rest "
				     "(windows of %lld + 1 tokens); use more data, --eval-data FILE or drop --eval-every",
				     (long long)ntok, (long long)held, (long long)d->seq);
	d->train_tokens = ntok - held;
	return planrt_success;
}

/* the distinct samples training draws from, against the batch of one step */
static planrt_result_t check_batch(planrt_data_t d, const char *path)
{
	int64_t distinct = 0;
	const char *what = "windows of";
	if (d->set) {
		distinct = d->set_train;
		what = NULL;
	} else if (d->sampling == PLANRT_SAMPLE_RANDOM) {
		distinct = d->train_tokens - d->seq - 1;
	} else {
		for (int i = 0; i < d->nsrc; i++)
			distinct += d->src[i].train;
	}
	if (d->batch > 0 && distinct < d->batch && what)
		return planrt_error_(planrt_format_error,
				     "data '%s' has %lld distinct training samples (%s %lld + 1 tokens), fewer than a step's batch of "
				     "%lld: every step would repeat samples; use more data or a smaller batch B",
				     path, (long long)distinct, what, (long long)d->seq, (long long)d->batch);
	if (d->batch > 0 && distinct < d->batch)
		return planrt_error_(planrt_format_error,
				     "data '%s' has %lld training samples, fewer than a step's batch of %lld: every step would "
				     "repeat samples; use more data or a smaller batch B",
				     path, (long long)distinct, (long long)d->batch);
	return planrt_success;
}

static planrt_result_t open_one(const planrt_data_config_t *c, int n, const char *const *paths, const double *weights,
				int all_held, planrt_data_t *out)
{
	planrt_data_t d = calloc(1, sizeof *d);
	if (!d)
		return planrt_error_(planrt_system_error, "out of memory");
	d->sampling = c->sampling;
	d->seq = c->seq;
	d->vocab = c->vocab;
	d->batch = c->batch;
	d->held_out = c->evaluate && !c->neval && !all_held;
	planrt_result_t r = open_sources(d, n, paths, weights, all_held);
	if (r == planrt_success && !d->set) {
		d->train_tokens = d->src[0].ntok;
		if (d->held_out && d->sampling == PLANRT_SAMPLE_RANDOM)
			r = hold_out_tokens(d);
	}
	if (r == planrt_success && !all_held)
		r = check_batch(d, paths[0]);
	if (r != planrt_success) {
		planrt_data_close(d);
		return r;
	}
	*out = d;
	return planrt_success;
}

planrt_result_t planrt_data_open_run_(const planrt_data_config_t *c, planrt_data_t *out)
{
	*out = NULL;
	planrt_data_t d;
	planrt_result_t r = open_one(c, c->nfiles, c->files, c->weights, 0, &d);
	if (r != planrt_success)
		return r;
	if (c->neval) {
		r = open_one(c, c->neval, c->eval_files, c->eval_weights, 1, &d->eval);
		if (r == planrt_success && !d->eval->set != !d->set)
			r = planrt_error_(planrt_invalid_usage, "--eval-data '%s' is %s but --data '%s' is %s; give both of one kind",
					  c->eval_files[0], d->eval->set ? "a data set" : "token data", c->files[0],
					  d->set ? "a data set" : "token data");
		if (r != planrt_success) {
			planrt_data_close(d);
			return r;
		}
	}
	*out = d;
	return planrt_success;
}

planrt_result_t planrt_data_open(const char *path, int64_t vocab, int64_t seq, planrt_data_t *out)
{
	planrt_data_config_t c = {.nfiles = 1, .files = &path, .vocab = vocab, .seq = seq,
				  .sampling = PLANRT_SAMPLE_RANDOM};
	return planrt_data_open_run_(&c, out);
}

void planrt_data_close(planrt_data_t d)
{
	if (!d)
		return;
	planrt_data_close(d->eval);
	planrt_dataset_close(d->set);
	for (int i = 0; i < d->nsrc; i++)
		source_close(&d->src[i]);
	free(d);
}

/* ------------------------------------------------------------------ rows */

/* the source's own seed in a blend (source 0: the run's) */
static uint64_t source_seed(uint64_t seed, int s)
{
	return seed + (uint64_t)s * 0x9E3779B97F4A7C15ull;
}

/* training sample g (epochs): source and window (or data set sample) */
static void epoch_row(planrt_data_t d, int64_t g, uint64_t seed, planrt_row_t *row)
{
	int s = 0;
	int64_t k = g;
	if (d->nsrc > 1)
		planrt_blend_pick_(&d->blend, g, &s, &k);
	int64_t n = d->set ? d->set_train : d->src[s].train;
	uint64_t w = planrt_shuffle_(source_seed(seed, s), (uint64_t)(k / n), (uint64_t)(k % n), (uint64_t)n);
	row->set = d->set;
	row->src = d->set ? NULL : &d->src[s];
	row->at = d->set ? (int64_t)w : (int64_t)w * d->seq;
}

/* held-out sample g of d (in order, blended by the same weights) */
static void held_row(planrt_data_t d, int64_t g, planrt_row_t *row)
{
	int s = 0;
	int64_t k = g;
	if (d->nsrc > 1)
		planrt_blend_pick_(&d->eval_blend, g, &s, &k);
	row->set = d->set;
	if (d->set) {
		int64_t n = planrt_dataset_samples(d->set);
		row->src = NULL;
		row->at = d->set_train + k % (n - d->set_train);
		return;
	}
	const source_t *src = &d->src[s];
	row->src = src;
	row->at = (src->train + k % (src->windows - src->train)) * d->seq;
}

/* random sampling (with replacement): training row i of step t, or of held-out batch -1 - t */
static void random_row(planrt_data_t d, int64_t step, int64_t i, uint64_t seed, planrt_row_t *row)
{
	row->set = d->set;
	row->src = d->set ? NULL : &d->src[0];
	uint32_t x[4];
	if (d->set) {
		planrt_philox(seed, (uint64_t)step, (uint64_t)i, x);
		row->at = (int64_t)(((uint64_t)x[0] | (uint64_t)x[1] << 32) % (uint64_t)d->set_train);
		return;
	}
	uint64_t npos = (uint64_t)(d->train_tokens - d->seq - 1), first = 0;
	if (step < 0) {
		npos = (uint64_t)(d->src[0].ntok - d->train_tokens - d->seq - 1);
		first = (uint64_t)d->train_tokens;
		seed ^= 0x6576616c756174ull; /* "evaluat": a stream of its own */
	}
	planrt_philox(seed, (uint64_t)step, (uint64_t)i, x);
	row->at = (int64_t)(first + ((uint64_t)x[0] | (uint64_t)x[1] << 32) % npos);
}

planrt_result_t planrt_data_rows_(planrt_data_t d, int64_t step, int64_t eval_batch, int64_t lo, int64_t hi,
				  uint64_t seed, planrt_row_t *rows)
{
	if (!d)
		return planrt_error_(planrt_invalid_usage, "planrt_data_rows_ on a NULL data set");
	if (lo < 0 || hi < lo)
		return planrt_error_(planrt_invalid_argument, "planrt_data_rows_: bad sample range [%lld, %lld)", (long long)lo,
				     (long long)hi);
	if (eval_batch >= 0 && !d->eval && !d->held_out)
		return planrt_error_(planrt_invalid_usage, "an evaluation batch without held-out data");
	if (eval_batch < 0 && step < 0)
		return planrt_error_(planrt_invalid_argument, "planrt_data_rows_: step %lld", (long long)step);
	int64_t batch = d->batch > 0 ? d->batch : hi;
	for (int64_t i = lo; i < hi; i++) {
		planrt_row_t *row = &rows[i - lo];
		if (eval_batch >= 0 && d->eval)
			held_row(d->eval, eval_batch * batch + i, row);
		else if (eval_batch >= 0 && d->sampling == PLANRT_SAMPLE_RANDOM && !d->set)
			random_row(d, -1 - eval_batch, i, seed, row);
		else if (eval_batch >= 0)
			held_row(d, eval_batch * batch + i, row);
		else if (d->sampling == PLANRT_SAMPLE_RANDOM)
			random_row(d, step, i, seed, row);
		else
			epoch_row(d, step * batch + i, seed, row);
	}
	return planrt_success;
}

void planrt_data_window_(const planrt_row_t *row, int64_t seq, int32_t *tokens)
{
	source_read(row->src, row->at, seq + 1, tokens);
}

int64_t planrt_data_doc_start_(const planrt_row_t *row, int64_t pos)
{
	int64_t start = source_doc_start(row->src, row->at + pos) - row->at;
	return start > 0 ? start : 0;
}

int planrt_data_has_documents_(planrt_data_t d)
{
	for (int i = 0; d && i < d->nsrc; i++)
		for (int s = 0; s < d->src[i].nshards; s++)
			if (planrt_tokens_documents_(d->src[i].shard[s]) > 1 || d->src[i].nshards > 1)
				return 1;
	return d && d->eval ? planrt_data_has_documents_(d->eval) : 0;
}

/* ------------------------------------------------------------------ token windows */

static planrt_result_t windows(planrt_data_t d, int64_t step, int64_t eval_batch, int64_t lo, int64_t hi, uint64_t seed,
			       int32_t *tokens, int32_t *targets)
{
	if (d && d->set)
		return planrt_error_(planrt_invalid_usage, "the data is a data set of named tensors, not token windows");
	planrt_row_t row;
	int32_t *w = malloc(sizeof(int32_t) * (size_t)(d ? d->seq + 1 : 1));
	if (!w)
		return planrt_error_(planrt_system_error, "out of memory");
	for (int64_t i = lo; i < hi; i++) {
		planrt_result_t r = planrt_data_rows_(d, step, eval_batch, i, i + 1, seed, &row);
		if (r != planrt_success) {
			free(w);
			return r;
		}
		planrt_data_window_(&row, d->seq, w);
		memcpy(tokens + (i - lo) * d->seq, w, sizeof(int32_t) * (size_t)d->seq);
		memcpy(targets + (i - lo) * d->seq, w + 1, sizeof(int32_t) * (size_t)d->seq);
	}
	free(w);
	return planrt_success;
}

planrt_result_t planrt_data_batch(planrt_data_t d, int64_t step, int64_t lo, int64_t hi, uint64_t seed,
				  int32_t *tokens, int32_t *targets)
{
	return windows(d, step, -1, lo, hi, seed, tokens, targets);
}

planrt_result_t planrt_data_eval_batch_(planrt_data_t d, int64_t batch, int64_t lo, int64_t hi, uint64_t seed,
					int32_t *tokens, int32_t *targets)
{
	return windows(d, -1, batch, lo, hi, seed, tokens, targets);
}

planrt_result_t planrt_data_hold_out_(planrt_data_t d, int64_t *train)
{
	if (!d->set && d->nsrc == 1 && d->sampling == PLANRT_SAMPLE_RANDOM) {
		d->held_out = 1;
		planrt_result_t r = hold_out_tokens(d);
		*train = d->train_tokens;
		return r;
	}
	d->held_out = 1;
	planrt_result_t r = split(d, 0);
	*train = planrt_data_train_samples_(d);
	return r;
}

/* ------------------------------------------------------------------ what the run records */

int64_t planrt_data_tokens(planrt_data_t d)
{
	int64_t n = 0;
	for (int i = 0; d && i < d->nsrc; i++)
		n += d->src[i].ntok;
	return n;
}

int64_t planrt_data_train_samples_(planrt_data_t d)
{
	if (!d)
		return 0;
	if (d->set)
		return d->set_train;
	if (d->sampling == PLANRT_SAMPLE_RANDOM)
		return d->train_tokens;
	int64_t n = 0;
	for (int i = 0; i < d->nsrc; i++)
		n += d->src[i].train;
	return n;
}

const char *planrt_data_sampling_(planrt_data_t d)
{
	return sampling_name(d ? d->sampling : PLANRT_SAMPLE_EPOCHS);
}

/* "0.7 a.bin 0.3 b.bin" or "a.bin" (with the formats), for a checkpoint's manifest and messages */
void planrt_data_describe_(planrt_data_t d, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	if (d && d->set) {
		snprintf(buf, n, "a data set of %lld samples", (long long)planrt_dataset_samples(d->set));
		return;
	}
	for (int i = 0; d && i < d->nsrc && len < n; i++) {
		const source_t *s = &d->src[i];
		if (d->nsrc > 1)
			len += (size_t)snprintf(buf + len, n - len, "%s%g ", i ? " " : "", s->weight);
		if (len < n)
			len += (size_t)snprintf(buf + len, n - len, "%s (%s, %lld tokens%s%s)", s->spec,
						s->nshards ? planrt_tokens_format_(s->shard[0]) : "?", (long long)s->ntok,
						s->nshards > 1 ? ", shards" : "",
						s->nshards == 1 && planrt_tokens_documents_(s->shard[0]) > 1 ? ", documents" : "");
	}
}

int planrt_data_files_(planrt_data_t d, const char **paths, int max)
{
	int n = 0;
	for (int i = 0; d && !d->set && i < d->nsrc; i++)
		for (int k = 0; k < d->src[i].nshards && n < max; k++)
			paths[n++] = planrt_tokens_path_(d->src[i].shard[k]);
	return n;
}

planrt_dataset_t planrt_data_set(planrt_data_t d)
{
	return d ? d->set : NULL;
}

int planrt_data_check_tokens_(planrt_data_t d, int64_t classes, int64_t *pos, int32_t *bad)
{
	for (int i = 0; d && i < d->nsrc; i++) {
		const source_t *s = &d->src[i];
		int32_t buf[4096];
		for (int64_t at = 0; at < s->ntok; at += 4096) {
			int64_t n = s->ntok - at < 4096 ? s->ntok - at : 4096;
			source_read(s, at, n, buf);
			for (int64_t j = 0; j < n; j++)
				if (at + j > 0 && buf[j] >= classes) { /* token 0 is never a target */
					*pos = at + j;
					*bad = buf[j];
					return 1;
				}
		}
	}
	return d && d->eval ? planrt_data_check_tokens_(d->eval, classes, pos, bad) : 0;
}
