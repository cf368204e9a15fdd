/* test_memory.c: the arena (one aligned, zeroed allocation; one at a time; resident once written,
 * as planrt_main's canary writes it) and the peak resident-set figure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "planrt.h"
#include "planrt_device.h"

static void test_arena(void **state)
{
	enum { MB = 1 << 20 };
	size_t before = planrt_peak_rss_bytes();
	assert_true(before > 0);
	void *base = NULL, *again = (void *)1;
	assert_int_equal(planrt_arena_create(64 * MB, &base), planrt_success);
	assert_non_null(base);
	assert_int_equal((uintptr_t)base % 4096, 0);
	const unsigned char *p = base;
	for (size_t i = 0; i < 64 * MB; i += 4093)
		assert_int_equal(p[i], 0);
	/* every word written (planrt_main's canary): every planned byte is resident */
	planrt_arena_fill64(0x5A17C0DE5A17C0DEull);
	for (size_t i = 0; i < 64 * MB; i += 4093)
		assert_int_equal(p[i], (0x5A17C0DEu >> (8 * (i % 4))) & 0xff); /* little-endian */
	assert_true(planrt_peak_rss_bytes() >= before + 60 * (size_t)MB);
	assert_int_equal(planrt_arena_create(MB, &again), planrt_invalid_usage);
	assert_null(again);
	assert_non_null(strstr(planrt_last_error(), "planrt_arena_destroy"));
	planrt_arena_destroy();
	assert_int_equal(planrt_arena_create(0, &base), planrt_success);
	planrt_arena_destroy();
	planrt_arena_destroy(); /* harmless */
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_arena)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
