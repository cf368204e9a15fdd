# The sync strategies (docs/sync.md), included by tests/tests.cmake:
#   sync_check      the collective check on async, local SGD and compressed traffic (C, planc_core)
#   sync_kernels    local SGD's average and outer step, and the compressors, against a reference
#                   (mpirun -np 4)
#   sync_runs       async (staleness bound, masters per tensor coordinate), local SGD (every K, DiLoCo,
#                   through a pipeline in bf16) and compression (with ZeRO 1, tensor parallelism and a
#                   pipeline): planrt's bytes equal explain's; compression's convergence margins
add_executable(sync_test_check ${ROOT}/tests/sync/test_check.c)
target_compile_options(sync_test_check PRIVATE ${PLANC_WARNINGS})
target_link_libraries(sync_test_check PRIVATE planc_core)
add_test(NAME sync_check COMMAND sync_test_check WORKING_DIRECTORY ${ROOT})

add_executable(sync_test_kernels ${ROOT}/tests/sync/test_sync_kernels.c)
target_compile_options(sync_test_kernels PRIVATE ${PLANC_WARNINGS})
target_link_libraries(sync_test_kernels PRIVATE planrt)
add_test(NAME sync_kernels
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:sync_test_kernels> ${MPIEXEC_POSTFLAGS})
set_tests_properties(sync_kernels PROPERTIES TIMEOUT 120
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")

add_test(NAME sync_runs COMMAND ${PYTHON3_EXE} ${ROOT}/tests/sync/run_sync.py ${PLANC} ${ROOT} WORKING_DIRECTORY ${ROOT})
set_tests_properties(sync_runs PROPERTIES TIMEOUT 600 ENVIRONMENT "${CC_CACHE_ENV}")
