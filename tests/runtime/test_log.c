/* test_log.c: JSON-lines metrics, the progress line and the monotonic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planrt.h"

static void test_json_lines(void **state)
{
	char path[] = "/tmp/planrt_log_XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	assert_int_equal(planrt_log_open(path), planrt_success);
	planrt_log_step(1, 5.5, 3e-4, 1.25, 4096, 200);
	planrt_log_step(2, NAN, 3e-4, INFINITY, 4096, 0);
	planrt_log_close();
	FILE *fp = fopen(path, "r");
	char line[512];
	assert_non_null(fgets(line, sizeof line, fp));
	assert_string_equal(line, "{\"step\":1,\"loss\":5.5,\"lr\":0.0003,\"grad_norm\":1.25,\"tokens\":4096,\"step_ms\":200,"
				  "\"tokens_per_s\":20480}\n");
	assert_non_null(fgets(line, sizeof line, fp));
	assert_string_equal(line, "{\"step\":2,\"loss\":null,\"lr\":0.0003,\"grad_norm\":null,\"tokens\":4096,\"step_ms\":0,"
				  "\"tokens_per_s\":0}\n");
	assert_null(fgets(line, sizeof line, fp));
	fclose(fp);
	unlink(path);
	assert_int_equal(planrt_log_open("/nonexistent/dir/run.jsonl"), planrt_io_error);
	assert_non_null(strstr(planrt_last_error(), "/nonexistent/dir/run.jsonl"));
}

static void test_progress_line(void **state)
{
	char path[] = "/tmp/planrt_progress_XXXXXX";
	int fd = mkstemp(path);
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	planrt_progress(12, 200, 3.45123, 12345, 4.0);  /* ETA 4 / 12 * 188 = 62.7 s */
	planrt_progress(1, 10000, 10.0, 1e6, 2.0);      /* 19998 s */
	planrt_progress(200, 200, 1.0, 5, 100.0);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fd);
	FILE *fp = fopen(path, "r");
	char line[256];
	assert_non_null(fgets(line, sizeof line, fp));
	assert_string_equal(line, "step 12/200  loss 3.4512  1.23e+04 tok/s  ETA 1m03s\n");
	assert_non_null(fgets(line, sizeof line, fp));
	assert_string_equal(line, "step 1/10000  loss 10.0000  1.00e+06 tok/s  ETA 5h33m18s\n");
	assert_non_null(fgets(line, sizeof line, fp));
	assert_string_equal(line, "step 200/200  loss 1.0000  5.00e+00 tok/s  ETA 0s\n");
	fclose(fp);
	unlink(path);
}

static void test_clock(void **state)
{
	double a = planrt_now();
	usleep(20000);
	double b = planrt_now();
	assert_true(b - a >= 0.019 && b - a < 1.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_lines),
		cmocka_unit_test(test_progress_line),
		cmocka_unit_test(test_clock),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
