/* test_data.c: token files and the global batch. A step's batch is the same whatever slices
 * [lo, hi) the ranks ask for; windows follow the documented sampling; malformed files are
 * refused with a one-line cause. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planrt.h"

static char dir[64];

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/planrt_data_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd);
}

static const char *write_file(const char *name, const void *data, size_t n)
{
	static char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	assert_int_equal(fwrite(data, 1, n, fp), n);
	fclose(fp);
	return path;
}

/* one line, and it says what to do */
static void assert_message(const char *needle)
{
	const char *m = planrt_last_error();
	if (!strstr(m, needle))
		fail_msg("error '%s' does not mention '%s'", m, needle);
	assert_null(strchr(m, '\n'));
}

static void test_text_batches(void **state)
{
	enum { N = 5000, SEQ = 16, B = 8 };
	unsigned char text[N];
	for (int i = 0; i < N; i++)
		text[i] = (unsigned char)(' ' + (i * 7919) % 95);
	const char *path = write_file("corpus.txt", text, N);
	planrt_data_t d;
	assert_int_equal(planrt_data_open(path, 256, SEQ, &d), planrt_success);
	assert_int_equal(planrt_data_tokens(d), N);
	int32_t tok[B * SEQ], tgt[B * SEQ], t2[B * SEQ], y2[B * SEQ];
	for (int64_t step = 0; step < 5; step++) {
		assert_int_equal(planrt_data_batch(d, step, 0, B, 1234, tok, tgt), planrt_success);
		/* the documented window: sample i starts at philox(seed, step, i) mod (N - SEQ - 1) */
		for (int i = 0; i < B; i++) {
			uint32_t x[4];
			planrt_philox(1234, (uint64_t)step, (uint64_t)i, x);
			uint64_t pos = ((uint64_t)x[0] | (uint64_t)x[1] << 32) % (N - SEQ - 1);
			for (int j = 0; j < SEQ; j++) {
				assert_int_equal(tok[i * SEQ + j], text[pos + j]);
				assert_int_equal(tgt[i * SEQ + j], text[pos + j + 1]);
			}
		}
		/* any slicing gives the same rows */
		static const int cuts[][3] = {{0, 4, 8}, {0, 1, 8}, {0, 7, 8}, {0, 3, 5}};
		for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
			int a = cuts[c][1];
			assert_int_equal(planrt_data_batch(d, step, 0, a, 1234, t2, y2), planrt_success);
			assert_int_equal(planrt_data_batch(d, step, a, cuts[c][2], 1234, t2 + a * SEQ, y2 + a * SEQ),
					 planrt_success);
			assert_memory_equal(tok, t2, sizeof(int32_t) * SEQ * (size_t)cuts[c][2]);
			assert_memory_equal(tgt, y2, sizeof(int32_t) * SEQ * (size_t)cuts[c][2]);
		}
	}
	/* steps and seeds differ */
	assert_int_equal(planrt_data_batch(d, 1, 0, B, 1234, t2, y2), planrt_success);
	assert_int_equal(planrt_data_batch(d, 2, 0, B, 1234, tok, tgt), planrt_success);
	assert_memory_not_equal(tok, t2, sizeof tok);
	assert_int_equal(planrt_data_batch(d, 2, 0, B, 99, t2, y2), planrt_success);
	assert_memory_not_equal(tok, t2, sizeof tok);
	planrt_data_close(d);
}

static void test_bin_tokens(void **state)
{
	enum { N = 3000, SEQ = 32 };
	unsigned char raw[2 * N];
	for (int i = 0; i < N; i++) {
		unsigned v = (unsigned)(i * 2654435761u) % 50257;
		raw[2 * i] = (unsigned char)(v & 0xff);
		raw[2 * i + 1] = (unsigned char)(v >> 8);
	}
	const char *path = write_file("train.bin", raw, sizeof raw);
	planrt_data_t d;
	assert_int_equal(planrt_data_open(path, 50304, SEQ, &d), planrt_success);
	assert_int_equal(planrt_data_tokens(d), N);
	int32_t tok[4 * SEQ], tgt[4 * SEQ];
	assert_int_equal(planrt_data_batch(d, 7, 0, 4, 5, tok, tgt), planrt_success);
	for (int i = 0; i < 4; i++) {
		uint32_t x[4];
		planrt_philox(5, 7, (uint64_t)i, x);
		uint64_t pos = ((uint64_t)x[0] | (uint64_t)x[1] << 32) % (N - SEQ - 1);
		for (int j = 0; j < SEQ; j++) {
			assert_int_equal(tok[i * SEQ + j], (int32_t)((uint32_t)(pos + j) * 2654435761u % 50257));
			assert_int_equal(tgt[i * SEQ + j], (int32_t)((uint32_t)(pos + j + 1) * 2654435761u % 50257));
		}
	}
	planrt_data_close(d);
	/* a token outside the vocabulary */
	assert_int_equal(planrt_data_open(path, 50000, SEQ, &d), planrt_format_error);
	assert_null(d);
	assert_message("vocabulary");
	/* an odd-sized .bin */
	path = write_file("odd.bin", raw, 2 * 100 + 1);
	assert_int_equal(planrt_data_open(path, 50304, SEQ, &d), planrt_format_error);
	assert_message("odd size");
}

static void test_malformed(void **state)
{
	planrt_data_t d;
	const char *path = write_file("empty.txt", "", 0);
	assert_int_equal(planrt_data_open(path, 256, 8, &d), planrt_format_error);
	assert_null(d);
	assert_message("0 tokens");
	/* seq + 1 tokens: no room for a second start position; seq + 2 is the least accepted */
	path = write_file("short.txt", "abcdefghi", 9);
	assert_int_equal(planrt_data_open(path, 256, 8, &d), planrt_format_error);
	assert_message("at least 10 tokens");
	path = write_file("ok.txt", "abcdefghij", 10);
	assert_int_equal(planrt_data_open(path, 256, 8, &d), planrt_success);
	int32_t t[8], y[8];
	for (int s = 0; s < 20; s++) {
		assert_int_equal(planrt_data_batch(d, s, 0, 1, 3, t, y), planrt_success);
		assert_int_equal(t[0], 'a');
		assert_int_equal(y[7], 'i');
	}
	planrt_data_close(d);
	/* a text byte outside a small vocabulary */
	path = write_file("high.txt", "abc\xff" "defghijklmnop", 17);
	assert_int_equal(planrt_data_open(path, 128, 4, &d), planrt_format_error);
	assert_message("vocabulary");
	/* not there, a directory, unreadable */
	assert_int_equal(planrt_data_open("/nonexistent/corpus.txt", 256, 8, &d), planrt_io_error);
	assert_message("/nonexistent/corpus.txt");
	assert_int_equal(planrt_data_open(dir, 256, 8, &d), planrt_io_error);
	assert_message("is a directory");
	if (geteuid() != 0) { /* root reads anything */
		path = write_file("locked.txt", "abcdefghijklmnop", 16);
		chmod(path, 0);
		assert_int_equal(planrt_data_open(path, 256, 8, &d), planrt_io_error);
		assert_message("cannot open");
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_batches),
		cmocka_unit_test(test_bin_tokens),
		cmocka_unit_test(test_malformed),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
