# The LLVM back end (compiler/target/llvm/emit_llvm.c): its modules verify (every example plan, host and
# NVPTX), its PTX assembles with ptxas for sm_90 (skipped without the CUDA toolkit), and its
# programs train bit for bit like the C back end's on plans that together use every kernel kind,
# op, dtype, schedule and sync strategy of the example and tests/equiv plans (run_diff.py checks
# that coverage; it also runs `planc run`).
add_executable(llvm_verify_module ${ROOT}/tests/llvm/verify_module.c $<TARGET_OBJECTS:planc_llvm_objects>)
target_compile_options(llvm_verify_module PRIVATE ${PLANC_WARNINGS})
target_include_directories(llvm_verify_module SYSTEM PRIVATE ${LLVM_INCLUDE_DIRS})
target_link_libraries(llvm_verify_module PRIVATE planc_core LLVM)
add_test(NAME llvm_verify COMMAND llvm_verify_module examples/mlp.plan examples/gpt.plan examples/moe.plan
         examples/llama.plan tests/equiv/ops.plan
         WORKING_DIRECTORY ${ROOT})
add_test(NAME llvm_ptxas COMMAND sh ${ROOT}/tests/llvm/ptxas.sh ${PLANC} WORKING_DIRECTORY ${ROOT})
set_tests_properties(llvm_ptxas PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME llvm_diff COMMAND ${PYTHON3_EXE} ${ROOT}/tests/llvm/run_diff.py ${PLANC} ${ROOT} 4 WORKING_DIRECTORY ${ROOT})
set_tests_properties(llvm_diff PROPERTIES TIMEOUT 900 ENVIRONMENT "${CC_CACHE_ENV}")
