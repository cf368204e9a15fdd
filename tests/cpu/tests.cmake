# Instruction-set levels (runtime/include/planrt_cpu.h): a program forced to each level this CPU
# runs trains like the baseline level within docs/cpu.md's tolerance; the C and LLVM back ends and
# planc run agree bit for bit at each level; unknown and missing levels are one-line errors. 8 steps:
# a difference between the back ends shows from the first step.
runner_test(cpu_levels 900 python3 ${ROOT}/tests/cpu/run_levels.py ${PLANC} ${ROOT} 8)
