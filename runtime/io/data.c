/* data.c: training tokens and the global batch of each step.
 *
 * A file is either text, read as bytes (each byte a token, vocabulary 256), or a nanoGPT token
 * file (name ending in .bin: little-endian uint16 tokens, as nanoGPT's prepare.py writes them).
 * The whole file is read once at open and checked (every token below the vocabulary, enough
 * tokens for one sample), so a bad file fails before training, with a one-line cause and fix.
 *
 * Sample i of step t is the window of seq + 1 tokens starting at
 *     pos = (x[0] + 2^32 x[1]) mod (ntokens - seq - 1),   x = planrt_philox(seed, t, i)
 * tokens = window[0, seq), targets = window[1, seq]. The global batch of a step therefore
 * depends only on (file, seed, step), never on the plan; a data-parallel rank asks for its
 * samples [lo, hi) and gets exactly those rows of the global batch. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct planrt_data {
	uint16_t *tok;
	int64_t ntok, seq, vocab;
	int64_t train; /* training draws its windows from tokens [0, train); the rest is held out */
	planrt_dataset_t set; /* a data set of named tensors (dataset.c) instead of tokens */
};

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && !strcmp(s + n - m, suffix);
}

planrt_result_t planrt_data_open(const char *path, int64_t vocab, int64_t seq, planrt_data_t *out)
{
	*out = NULL;
	if (planrt_dataset_path(path)) { /* named tensors: dataset.c */
		planrt_data_t d = calloc(1, sizeof *d);
		if (!d)
			return planrt_error_(planrt_system_error, "out of memory");
		planrt_result_t r = planrt_dataset_open(path, &d->set);
		if (r != planrt_success) {
			free(d);
			return r;
		}
		*out = d;
		return planrt_success;
	}
	if (seq < 1 || vocab < 1)
		return planrt_error_(planrt_invalid_argument, "data '%s': sequence length %lld and vocabulary %lld must be >= 1",
				     path, (long long)seq, (long long)vocab);
	struct stat st;
	if (stat(path, &st) != 0)
		return planrt_error_(planrt_io_error, "cannot open data '%s': %s; pass an existing file with --data", path,
				     strerror(errno));
	if (S_ISDIR(st.st_mode))
		return planrt_error_(planrt_io_error,
				     "data '%s' is a directory; pass a text file or a nanoGPT .bin token file", path);
	if (!S_ISREG(st.st_mode)) /* a FIFO or a device would block the open or never end */
		return planrt_error_(planrt_io_error,
				     "data '%s' is not a regular file (a FIFO, socket or device); pass a text file or a "
				     "nanoGPT .bin token file",
				     path);
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return planrt_error_(planrt_io_error, "cannot open data '%s': %s; check the path and its permissions", path,
				     strerror(errno));
	size_t size = (size_t)st.st_size;
	unsigned char *bytes = malloc(size ? size : 1);
	if (!bytes) {
		fclose(fp);
		return planrt_error_(planrt_system_error, "out of memory reading data '%s' (%zu bytes)", path, size);
	}
	size_t got = fread(bytes, 1, size, fp);
	int err = ferror(fp);
	fclose(fp);
	if (got != size || err) {
		free(bytes);
		return planrt_error_(planrt_io_error, "cannot read data '%s': %s; check the file", path,
				     err ? strerror(errno) : "it changed size while being read");
	}
	int bin = ends_with(path, ".bin");
	if (bin && size % 2) {
		free(bytes);
		return planrt_error_(planrt_format_error,
				     "data '%s' has an odd size (%zu bytes) but a .bin file holds uint16 tokens; "
				     "regenerate it (nanoGPT prepare.py) or rename it if it is text",
				     path, size);
	}
	int64_t ntok = (int64_t)(bin ? size / 2 : size);
	if (ntok < seq + 2) {
		free(bytes);
		return planrt_error_(planrt_format_error,
				     "data '%s' has %lld tokens, too few for a sample of %lld + 1 tokens; use a file of "
				     "at least %lld tokens or a shorter sequence",
				     path, (long long)ntok, (long long)seq, (long long)(seq + 2));
	}
	uint16_t *tok = malloc((size_t)ntok * sizeof *tok);
	if (!tok) {
		free(bytes);
		return planrt_error_(planrt_system_error, "out of memory reading data '%s'", path);
	}
	for (int64_t i = 0; i < ntok; i++) {
		tok[i] = bin ? (uint16_t)(bytes[2 * i] | bytes[2 * i + 1] << 8) : bytes[i];
		if (tok[i] >= vocab) {
			planrt_result_t r = planrt_error_(
				planrt_format_error,
				bin ? "data '%s': token %u at position %lld is outside the model's vocabulary of %lld; "
				      "tokenize with the model's tokenizer or raise the vocabulary V"
				    : "data '%s': byte %u at offset %lld is outside the model's vocabulary of %lld; a "
				      "text file needs V >= 256",
				path, tok[i], (long long)i, (long long)vocab);
			free(bytes);
			free(tok);
			return r;
		}
	}
	free(bytes);
	planrt_data_t d = calloc(1, sizeof *d);
	if (!d) {
		free(tok);
		return planrt_error_(planrt_system_error, "out of memory");
	}
	d->tok = tok;
	d->ntok = ntok;
	d->train = ntok;
	d->seq = seq;
	d->vocab = vocab;
	*out = d;
	return planrt_success;
}

planrt_result_t planrt_data_batch(planrt_data_t d, int64_t step, int64_t lo, int64_t hi, uint64_t seed,
				  int32_t *tokens, int32_t *targets)
{
	if (!d)
		return planrt_error_(planrt_invalid_usage, "planrt_data_batch on a NULL data set");
	if (lo < 0 || hi < lo)
		return planrt_error_(planrt_invalid_argument, "planrt_data_batch: bad sample range [%lld, %lld)",
				     (long long)lo, (long long)hi);
	if (d->set)
		return planrt_error_(planrt_invalid_usage, "the data is a data set of named tensors, not token windows");
	uint64_t npos = (uint64_t)(d->train - d->seq - 1), first = 0;
	if (step < 0 && d->train == d->ntok)
		return planrt_error_(planrt_invalid_argument, "planrt_data_batch: step %lld (no held-out split)",
				     (long long)step);
	if (step < 0) { /* a held-out batch (planrt_data_eval_batch_) */
		npos = (uint64_t)(d->ntok - d->train - d->seq - 1);
		first = (uint64_t)d->train;
		seed ^= 0x6576616c756174ull; /* "evaluat": a stream of its own */
	}
	for (int64_t i = lo; i < hi; i++) {
		uint32_t x[4];
		planrt_philox(seed, (uint64_t)step, (uint64_t)i, x);
		uint64_t pos = first + ((uint64_t)x[0] | (uint64_t)x[1] << 32) % npos;
		const uint16_t *w = d->tok + pos;
		int32_t *t = tokens + (i - lo) * d->seq, *y = targets + (i - lo) * d->seq;
		for (int64_t j = 0; j < d->seq; j++) {
			t[j] = w[j];
			y[j] = w[j + 1];
		}
	}
	return planrt_success;
}

int64_t planrt_data_tokens(planrt_data_t d)
{
	return d ? d->ntok : 0;
}

planrt_result_t planrt_data_hold_out_(planrt_data_t d, int64_t *train)
{
	int64_t held = d->ntok / 10 > d->seq + 2 ? d->ntok / 10 : d->seq + 2;
	if (d->ntok - held < d->seq + 2)
		return planrt_error_(planrt_format_error,
				     "the data has %lld tokens, too few to hold out %lld for evaluation and train on the rest "
				     "(windows of %lld + 1 tokens); use more data or drop --eval-every",
				     (long long)d->ntok, (long long)held, (long long)d->seq);
	d->train = d->ntok - held;
	*train = d->train;
	return planrt_success;
}

planrt_result_t planrt_data_eval_batch_(planrt_data_t d, int64_t batch, int64_t lo, int64_t hi, uint64_t seed,
					int32_t *tokens, int32_t *targets)
{
	if (!d || d->train == d->ntok)
		return planrt_error_(planrt_invalid_usage, "planrt_data_eval_batch_ without a held-out split");
	return planrt_data_batch(d, -1 - batch, lo, hi, seed, tokens, targets);
}

planrt_dataset_t planrt_data_set(planrt_data_t d)
{
	return d ? d->set : NULL;
}

int planrt_data_check_tokens_(planrt_data_t d, int64_t classes, int64_t *pos, int32_t *bad)
{
	for (int64_t i = 1; d && !d->set && i < d->ntok; i++) /* token 0 is never a target */
		if (d->tok[i] >= classes) {
			*pos = i;
			*bad = d->tok[i];
			return 1;
		}
	return 0;
}

void planrt_data_close(planrt_data_t d)
{
	if (!d)
		return;
	planrt_dataset_close(d->set);
	free(d->tok);
	free(d);
}
