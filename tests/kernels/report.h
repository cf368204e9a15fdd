/* report.h: the PASS/FAIL line and tally shared by the kernel tests (each test program includes
 * it once; they close with `N passed, N failed`). */
#ifndef KERNEL_TESTS_REPORT_H
#define KERNEL_TESTS_REPORT_H

#include <stdarg.h>
#include <stdio.h>

static int npass, nfail;

__attribute__((format(printf, 2, 3))) static int report(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s ", ok ? "PASS" : "FAIL");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	if (ok)
		npass++;
	else
		nfail++;
	return ok;
}

#endif
