/* data_read.c: how fast planrt's data layer makes batches (bench/data_throughput.sh runs it).
 * usage: bench_data_read VOCAB SEQ BATCH STEPS FILE...  (a blend: W1 FILE1 W2 FILE2 ...)
 * Makes STEPS training batches of BATCH windows (epochs sampling), as the load_input kernel
 * does on one rank (rows, then each window's tokens), and prints the tokens per second read,
 * like nccl-tests: the data, tokens, seconds, tokens/s; then the same with each token's position
 * in its document (the `positions` input of a model of packed documents). */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc < 6)
		return fprintf(stderr, "usage: bench_data_read VOCAB SEQ BATCH STEPS FILE...\n"), 2;
	int64_t vocab = atoll(argv[1]), seq = atoll(argv[2]), batch = atoll(argv[3]), steps = atoll(argv[4]);
	int n = argc - 5, blend = n > 1;
	const char *files[64];
	double weights[64];
	for (int i = 0; i < (blend ? n / 2 : 1) && i < 64; i++) {
		files[i] = argv[5 + (blend ? 2 * i + 1 : 0)];
		weights[i] = blend ? atof(argv[5 + 2 * i]) : 1;
	}
	planrt_data_config_t c = {.nfiles = blend ? n / 2 : 1, .files = files, .weights = blend ? weights : NULL,
				  .vocab = vocab, .seq = seq, .batch = batch, .sampling = PLANRT_SAMPLE_EPOCHS};
	planrt_data_t d;
	double t0 = planrt_now();
	if (planrt_data_open_run_(&c, &d) != planrt_success)
		return fprintf(stderr, "%s\n", planrt_last_error()), 1;
	double open_s = planrt_now() - t0;
	planrt_row_t *rows = calloc((size_t)batch, sizeof *rows);
	int32_t *w = calloc((size_t)(seq + 1), sizeof *w);
	int64_t sum = 0;
	t0 = planrt_now();
	for (int64_t t = 0; t < steps; t++) {
		if (planrt_data_rows_(d, t, -1, 0, batch, 1234, rows) != planrt_success)
			return fprintf(stderr, "%s\n", planrt_last_error()), 1;
		for (int64_t i = 0; i < batch; i++) {
			planrt_data_window_(&rows[i], seq, w);
			sum += w[0];
		}
	}
	double s = planrt_now() - t0;
	t0 = planrt_now();
	for (int64_t t = 0; t < steps; t++) {
		if (planrt_data_rows_(d, t, -1, 0, batch, 1234, rows) != planrt_success)
			return fprintf(stderr, "%s\n", planrt_last_error()), 1;
		for (int64_t i = 0; i < batch; i++) {
			planrt_data_window_(&rows[i], seq, w);
			for (int64_t j = 0; j < seq; j++)
				sum += j - planrt_data_doc_start_(&rows[i], j);
		}
	}
	double s_pos = planrt_now() - t0;
	double tokens = (double)steps * (double)batch * (double)seq;
	char what[96];
	const char *base = strrchr(files[0], '/');
	snprintf(what, sizeof what, "%s%s", blend ? "blend of " : "", base ? base + 1 : files[0]);
	printf("%-28s tokens %9.0f  open %7.4f s  read %8.3e tokens/s  with positions %8.3e tokens/s  (checksum %lld)\n",
	       what, tokens, open_s, tokens / s, tokens / s_pos, (long long)sum);
	planrt_data_close(d);
	free(rows);
	free(w);
	return 0;
}
