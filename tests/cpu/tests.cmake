# Instruction-set levels (runtime/include/planrt_cpu.h): a program forced to each level this CPU
# runs trains like the baseline level within docs/cpu.md's tolerance; the C and LLVM back ends and
# planc run agree bit for bit at each level; unknown and missing levels are one-line errors. 8 steps:
# a difference between the back ends shows from the first step.
runner_test(cpu_levels 900 python3 ${ROOT}/tests/cpu/run_levels.py ${PLANC} ${ROOT} 8)
# planrt's threads (runtime/cpu/threads.c): a plan trains to the same bytes with 1, 2 and 3 planrt
# threads on the C and LLVM back ends (fused attention with dropout, grouped-query heads, norms,
# data parallelism); a rank bound to fewer CPUs than its threads warns once with the fix; a bad
# thread count is a one-line error.
runner_test(cpu_threads 600 python3 ${ROOT}/tests/cpu/run_threads.py ${PLANC} ${ROOT} 6)
