/* cpu_level.c: picks the instruction-set level a run uses (planrt_cpu.h), once, at start.
 *
 * The CPU says what it runs (x86-64: cpuid and the OS's saved vector state, through gcc's
 * __builtin_cpu_supports; AArch64: the kernel's hwcaps); PLANRT_ISA=LEVEL overrides the choice,
 * within what the CPU runs. The level sets planrt_cpu_level_ (which the fused loops of a program
 * are called at) and planrt_cpu_table_ (planrt's own kernels, when this build of planrt compiled
 * them for the level: CMake defines PLANRT_CPU_HAVE_<LEVEL>; a planrt built with -march=native
 * has no per-level copies and runs its native build at every level).
 *
 * OpenBLAS (DYNAMIC_ARCH) picks its own kernels when it loads (OPENBLAS_CORETYPE overrides it);
 * --help and the log name them beside the level. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_cpu.h"

#include "cpu_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* OpenBLAS's; a weak reference, NULL with another BLAS */
extern char *openblas_get_corename(void) __attribute__((weak));

int planrt_cpu_level_ = PLANRT_CPU_BASELINE;
const planrt_cpu_table_t *planrt_cpu_table_;

typedef struct {
	const char *name;     /* PLANRT_ISA's value */
	const char *features; /* what the level needs, for messages */
	const planrt_cpu_table_t *table; /* planrt's kernels built for it (NULL: the baseline's) */
} level_t;

static const level_t levels[PLANRT_CPU_LEVELS] = {
#if defined(__x86_64__)
	{"baseline", "x86-64, SSE2", NULL},
#ifdef PLANRT_CPU_HAVE_AVX2
	{"avx2", "x86-64-v3: AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE", &planrt_cpu_table_avx2},
#else
	{"avx2", "x86-64-v3: AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE", NULL},
#endif
#ifdef PLANRT_CPU_HAVE_AVX512
	{"avx512", "x86-64-v4: AVX-512 F, BW, CD, DQ, VL", &planrt_cpu_table_avx512},
#else
	{"avx512", "x86-64-v4: AVX-512 F, BW, CD, DQ, VL", NULL},
#endif
#elif defined(__aarch64__)
	{"baseline", "Armv8-A, NEON", NULL},
#ifdef PLANRT_CPU_HAVE_SVE
	{"sve", "SVE", &planrt_cpu_table_sve},
#else
	{"sve", "SVE", NULL},
#endif
#else
	{"baseline", "this architecture's baseline", NULL},
#endif
};

/* Whether the CPU (and the OS, for the vector registers' state) runs a level. */
static int cpu_runs(int level)
{
	if (level == PLANRT_CPU_BASELINE)
		return 1;
#if defined(__x86_64__)
	__builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
	return level == PLANRT_CPU_AVX2 ? __builtin_cpu_supports("x86-64-v3") : __builtin_cpu_supports("x86-64-v4");
#else
	int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
		 __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
	if (level == PLANRT_CPU_AVX2)
		return v3;
	return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
	       __builtin_cpu_supports("avx512vl");
#endif
#elif defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
	return (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
#else
	return 0;
#endif
}

/* PLANRT_TEST_CPU_BEST=LEVEL (tests/cpu): the CPU is taken to run nothing above LEVEL, so that the
 * refusal of a level it lacks is tested on machines that have every level. */
static int test_ceiling(void)
{
	const char *s = getenv("PLANRT_TEST_CPU_BEST");
	for (int l = 0; s && l < PLANRT_CPU_LEVELS; l++)
		if (!strcmp(s, levels[l].name))
			return l;
	return PLANRT_CPU_LEVELS - 1;
}

int planrt_cpu_best(void)
{
	int best = PLANRT_CPU_BASELINE, ceiling = test_ceiling();
	for (int l = 1; l <= ceiling; l++)
		if (cpu_runs(l))
			best = l;
	return best;
}

const char *planrt_cpu_name(int level)
{
	return level >= 0 && level < PLANRT_CPU_LEVELS ? levels[level].name : "?";
}

/* the levels from the baseline up to best, as "baseline, avx2" */
static void level_list(int best, char *buf, size_t n)
{
	size_t len = 0;
	buf[0] = 0;
	for (int l = 0; l <= best && len < n; l++)
		len += (size_t)snprintf(buf + len, n - len, "%s%s", l ? ", " : "", levels[l].name);
}

/* The level PLANRT_ISA names (the best when unset, empty or "best"), or -1 with the cause in err. */
static int requested_level(char *err, size_t n)
{
	const char *want = getenv("PLANRT_ISA");
	int best = planrt_cpu_best();
	if (!want || !*want || !strcmp(want, "best"))
		return best;
	char have[128];
	level_list(best, have, sizeof have);
	for (int l = 0; l < PLANRT_CPU_LEVELS; l++)
		if (!strcmp(want, levels[l].name)) {
			if (l <= best)
				return l;
			snprintf(err, n,
				 "PLANRT_ISA=%s: this CPU lacks %s (%s); it runs %s: set PLANRT_ISA to one of them, or unset it to "
				 "use the best",
				 want, levels[l].name, levels[l].features, have);
			return -1;
		}
	char all[128];
	level_list(PLANRT_CPU_LEVELS - 1, all, sizeof all);
	snprintf(err, n, "PLANRT_ISA=%s: unknown instruction-set level; this architecture's are %s (and best)", want, all);
	return -1;
}

/* OpenBLAS's kernels: "?" without OpenBLAS */
static const char *blas_core(void)
{
	const char *core = openblas_get_corename ? openblas_get_corename() : NULL;
	return core ? core : "?";
}

planrt_result_t planrt_cpu_select(void)
{
	char err[512];
	int level = requested_level(err, sizeof err);
	if (level < 0)
		return planrt_error_(planrt_invalid_argument, "%s", err);
	planrt_cpu_level_ = level;
	planrt_cpu_table_ = levels[level].table;
	return planrt_success;
}

void planrt_cpu_log_members(char *buf, size_t n)
{
	snprintf(buf, n, "\"cpu\":\"%s\",\"blas\":\"%s\",\"threads\":%d", planrt_cpu_name(planrt_cpu_level_),
		 blas_core(), planrt_threads());
}

void planrt_cpu_describe(char *buf, size_t n)
{
	char have[128];
	int best = planrt_cpu_best();
	level_list(best, have, sizeof have);
	const char *forced = getenv("PLANRT_ISA");
	snprintf(buf, n, "%s (this CPU runs %s%s%s%s; PLANRT_ISA=LEVEL forces one); OpenBLAS kernels: %s",
		 planrt_cpu_name(planrt_cpu_level_), have, forced && *forced ? "; PLANRT_ISA=" : "",
		 forced && *forced ? forced : "", forced && *forced ? " set" : "", blas_core());
}
