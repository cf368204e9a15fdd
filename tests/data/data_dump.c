/* data_dump.c: prints the rows planrt's data layer gives, for tests/data/check_data.py to hold
 * against its own reading of docs/data.md.
 * usage: data_dump VOCAB SEQ BATCH STEPS EVAL_BATCHES epochs|random FILE | W1 FILE1 W2 FILE2 ...
 * prints, per training step (then per evaluation batch when EVAL_BATCHES > 0: the last tenth held
 * out), one line per row: "t|e STEP ROW: the window's SEQ + 1 tokens / each position's offset in
 * its document". A failure prints "error: MESSAGE" and exits 1. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h"

#include <stdio.h>
#include <stdlib.h>

static void print_rows(planrt_data_t d, int64_t step, int64_t eval, int64_t batch, int64_t seq)
{
	planrt_row_t *rows = calloc((size_t)batch, sizeof *rows);
	int32_t *w = calloc((size_t)seq + 1, sizeof *w);
	if (planrt_data_rows_(d, step, eval, 0, batch, 1234, rows) != planrt_success) {
		printf("error: %s\n", planrt_last_error());
		exit(1);
	}
	for (int64_t i = 0; i < batch; i++) {
		printf("%c %lld %lld:", eval >= 0 ? 'e' : 't', (long long)(eval >= 0 ? eval : step), (long long)i);
		planrt_data_window_(&rows[i], seq, w);
		for (int64_t j = 0; j <= seq; j++)
			printf(" %d", w[j]);
		printf(" /");
		for (int64_t j = 0; j < seq; j++)
			printf(" %lld", (long long)(j - planrt_data_doc_start_(&rows[i], j)));
		printf("\n");
	}
	free(rows);
	free(w);
}

int main(int argc, char **argv)
{
	if (argc < 8)
		return fprintf(stderr, "usage: data_dump VOCAB SEQ BATCH STEPS EVAL_BATCHES epochs|random FILE...\n"), 2;
	int64_t vocab = atoll(argv[1]), seq = atoll(argv[2]), batch = atoll(argv[3]), steps = atoll(argv[4]),
		evals = atoll(argv[5]);
	int n = argc - 7, blend = n > 1;
	const char *files[64];
	double weights[64];
	for (int i = 0; i < (blend ? n / 2 : 1); i++) {
		files[i] = argv[7 + (blend ? 2 * i + 1 : 0)];
		weights[i] = blend ? atof(argv[7 + 2 * i]) : 1;
	}
	planrt_data_config_t c = {.nfiles = blend ? n / 2 : 1, .files = files, .weights = blend ? weights : NULL,
				  .vocab = vocab, .seq = seq, .batch = batch, .evaluate = evals > 0,
				  .sampling = argv[6][0] == 'e' ? PLANRT_SAMPLE_EPOCHS : PLANRT_SAMPLE_RANDOM};
	planrt_data_t d;
	if (planrt_data_open_run_(&c, &d) != planrt_success) {
		printf("error: %s\n", planrt_last_error());
		return 1;
	}
	for (int64_t t = 0; t < steps; t++)
		print_rows(d, t, -1, batch, seq);
	for (int64_t b = 0; b < evals; b++)
		print_rows(d, 0, b, batch, seq);
	planrt_data_close(d);
	return 0;
}
