/* planrt_cpu.h: instruction-set levels, so that one program binary runs on every CPU of its
 * architecture and runs fast on each.
 *
 * The fused loops of a program (planc's C and LLVM back ends) and planrt's own kernels are compiled
 * once per level, and planrt_cpu_select picks one level at start from the CPU, as ATen's
 * CPU_CAPABILITY dispatch and OpenBLAS's DYNAMIC_ARCH do:
 *   x86-64   baseline  x86-64 (SSE2: every x86-64 CPU)
 *            avx2      x86-64-v3 (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE: Haswell, Zen and later)
 *            avx512    x86-64-v4 (AVX-512 F, BW, CD, DQ, VL: Skylake-SP, Ice Lake, Zen 4 and later)
 *   AArch64  baseline  Armv8-A (NEON)
 *            sve       Armv8-A + SVE (Neoverse V1, Graviton 3, A64FX)
 * PLANRT_ISA=LEVEL forces a level (the same level on every node of a heterogeneous cluster, or a
 * test of each level); one the CPU lacks stops the run with a one-line error. docs/cpu.md says
 * where the levels' numbers differ (FMA contraction, from avx2 up) and by how much. */
#ifndef PLANRT_CPU_H
#define PLANRT_CPU_H

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the levels of this architecture (a macro: the loop tables below count on it) */
#if defined(__x86_64__)
enum { PLANRT_CPU_BASELINE = 0, PLANRT_CPU_AVX2, PLANRT_CPU_AVX512 };
#define PLANRT_CPU_LEVELS 3
#elif defined(__aarch64__)
enum { PLANRT_CPU_BASELINE = 0, PLANRT_CPU_SVE };
#define PLANRT_CPU_LEVELS 2
#else
enum { PLANRT_CPU_BASELINE = 0 };
#define PLANRT_CPU_LEVELS 1
#endif

/* The running level, below PLANRT_CPU_LEVELS (PLANRT_CPU_BASELINE until planrt_cpu_select). The
 * fused loops of a program are called through NAME_at[planrt_cpu_level_]. */
extern int planrt_cpu_level_;

/* Picks the level (PLANRT_ISA when set, else the best this CPU runs), sets planrt_cpu_level_ and
 * planrt's kernels to it. Fails with a one-line cause on an unknown name or a level the CPU lacks.
 * planrt_main calls it first; calling it again is harmless. */
planrt_result_t planrt_cpu_select(void);
int planrt_cpu_best(void);               /* the best level this CPU runs */
const char *planrt_cpu_name(int level);  /* "baseline", "avx2", ... */
/* One line for --help: the running level, the levels the CPU runs, the override, and OpenBLAS's
 * kernels (its own choice, or OPENBLAS_CORETYPE's). */
void planrt_cpu_describe(char *buf, size_t n);
/* The log's members for the level, OpenBLAS's kernels and the threads: "cpu":"avx512","blas":"SkylakeX","threads":1 */
void planrt_cpu_log_members(char *buf, size_t n);

/* ------------------------------------------------------------------ threads (cpu/threads.c)
 * A rank runs planrt's kernels on as many threads as OpenBLAS's setting asks for
 * (OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else OMP_NUM_THREADS; 1 when unset).
 * planrt_threads_start reads it and starts the workers (once; rank 0 warns when the rank's
 * affinity mask has fewer CPUs than threads, with the mpirun option that fixes it); a bad value is
 * a one-line error. planrt_parallel_for(n, fn, ctx) calls fn(ctx, lo, hi, thread) on contiguous
 * chunks covering [0, n), one per thread, by a rule that depends only on n and the thread count,
 * and returns when every chunk is done; split only over independent outputs, so that the results
 * are the same bits for any thread count. Nested calls, and a call from another thread while one
 * holds the pool, run inline on the calling thread. planrt_thread_scratch gives
 * thread t (t > 0) a buffer of at least bytes that it keeps (thread 0 uses the kernel's own). */
typedef void (*planrt_chunk_fn)(void *ctx, int64_t lo, int64_t hi, int thread);
planrt_result_t planrt_threads_start(int rank);
int planrt_threads(void);
void planrt_threads_describe(char *buf, size_t n); /* the --help line */
void planrt_parallel_for(int64_t n, planrt_chunk_fn fn, void *ctx);
void *planrt_thread_scratch(int thread, size_t bytes);

/* ------------------------------------------------------------------ fused loops of the C target
 * planc prints each fused loop as an always-inline function NAME(out, v...) and then
 * PLANRT_CPU_LOOP(NAME, (parameters), (arguments)), which defines NAME_l<level>, the loop compiled
 * for each level (target attributes: the level's instruction set, inherited by the inlined body),
 * and the table NAME_at[PLANRT_CPU_LEVELS]. A build for one machine (planc build --native:
 * -march=native -DPLANRT_CPU_NATIVE) compiles the loop once and points every entry at it. */
#define PLANRT_LOOP static inline __attribute__((always_inline))

#if defined(PLANRT_CPU_NATIVE) || PLANRT_CPU_LEVELS == 1
#if PLANRT_CPU_LEVELS == 3
#define PLANRT_CPU_EACH_(f) f, f, f
#elif PLANRT_CPU_LEVELS == 2
#define PLANRT_CPU_EACH_(f) f, f
#else
#define PLANRT_CPU_EACH_(f) f
#endif
#define PLANRT_CPU_LOOP(name, params, args)                                                                    \
	static void name##_l0 params { name args; }                                                            \
	static void (*const name##_at[PLANRT_CPU_LEVELS]) params = {PLANRT_CPU_EACH_(name##_l0)};
#elif defined(__x86_64__)
/* feature lists rather than arch=: gcc inlines a function into one whose instruction set is a
 * superset only when both have the same -march */
#define PLANRT_CPU_TARGET_AVX2_ "avx2,fma,bmi,bmi2,f16c,lzcnt,movbe,popcnt"
#define PLANRT_CPU_LOOP(name, params, args)                                                                    \
	static void name##_l0 params { name args; }                                                            \
	__attribute__((target(PLANRT_CPU_TARGET_AVX2_))) static void name##_l1 params { name args; }            \
	__attribute__((target(PLANRT_CPU_TARGET_AVX2_ ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl")))         \
	static void name##_l2 params { name args; }                                                            \
	static void (*const name##_at[PLANRT_CPU_LEVELS]) params = {name##_l0, name##_l1, name##_l2};
#elif defined(__aarch64__)
#define PLANRT_CPU_LOOP(name, params, args)                                                                    \
	static void name##_l0 params { name args; }                                                            \
	__attribute__((target("+sve"))) static void name##_l1 params { name args; }                              \
	static void (*const name##_at[PLANRT_CPU_LEVELS]) params = {name##_l0, name##_l1};
#endif

#ifdef __cplusplus
}
#endif
#endif
