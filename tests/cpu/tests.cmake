# Instruction-set levels (runtime/include/planrt_cpu.h): a program forced to each level this CPU
# runs trains like the baseline level within docs/cpu.md's tolerance; the C and LLVM back ends and
# planc run agree bit for bit at each level; unknown and missing levels are one-line errors.
add_test(NAME cpu_levels COMMAND python3 ${ROOT}/tests/cpu/run_levels.py ${PLANC} ${ROOT} 20 WORKING_DIRECTORY ${ROOT})
set_tests_properties(cpu_levels PROPERTIES TIMEOUT 900 ENVIRONMENT "${CC_CACHE_ENV}")
