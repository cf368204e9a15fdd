# Several ranks on GPUs (issue 19), tested on the CPU; included by tests/tests.cmake.
#   cuda_comm_staged          the MPI device backend (runtime/comm/staged.c) with host threads as
#                             streams, 4 ranks under Open MPI: every collective kind against the MPI
#                             layer, the ordering edges under random delays, staging reuse, p2p lanes
#   cuda_comm_staged_watchdog a stalled collective on the backend is reported by its watchdog
#   cuda_comm_staged_local    the same checks on planrt's node-local MPI under planrt-run
#   cuda_local_mpi            the node-local MPI and planrt-run against Open MPI (tests/cuda/local_mpi.sh)
#   cuda_gpu_binding          the GPU binding and backend rules (runtime/comm/binding.c)
add_executable(cuda_test_comm_staged ${ROOT}/tests/cuda/test_comm_staged.c)
target_compile_options(cuda_test_comm_staged PRIVATE ${PLANC_WARNINGS})
target_link_libraries(cuda_test_comm_staged PRIVATE planrt)
add_test(NAME cuda_comm_staged
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:cuda_test_comm_staged> ${MPIEXEC_POSTFLAGS} 150)
set_tests_properties(cuda_comm_staged PROPERTIES TIMEOUT 300 ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=120"
                     FAIL_REGULAR_EXPRESSION "FAIL:")
add_test(NAME cuda_comm_staged_watchdog
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:cuda_test_comm_staged> ${MPIEXEC_POSTFLAGS} watchdog)
# ranks 0, 2 and 3 wait in the allreduce rank 1 skips: whichever's watchdog fires first ends the
# job (mpirun aborts the others, so rank 0's line is not always printed)
set_tests_properties(cuda_comm_staged_watchdog PROPERTIES TIMEOUT 60 ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=2"
  PASS_REGULAR_EXPRESSION "planrt: rank [023]: watchdog: allreduce #1 of 4 f32 on world \\(member [023] of 4, MPI device backend\\) still pending after 2 s, in the MPI call")

add_executable(cuda_test_comm_staged_local ${ROOT}/tests/cuda/test_comm_staged.c)
target_compile_options(cuda_test_comm_staged_local PRIVATE ${PLANC_WARNINGS})
target_link_libraries(cuda_test_comm_staged_local PRIVATE planrt_local)
add_test(NAME cuda_comm_staged_local COMMAND $<TARGET_FILE:planrt-run> -n 4 $<TARGET_FILE:cuda_test_comm_staged_local> 150)
set_tests_properties(cuda_comm_staged_local PROPERTIES TIMEOUT 300 ENVIRONMENT "PLANRT_WATCHDOG=120"
                     FAIL_REGULAR_EXPRESSION "FAIL:")

foreach(t collectives step_kernels watchdog)
  add_executable(cuda_local_test_${t} ${ROOT}/tests/runtime/test_${t}.c)
  target_compile_options(cuda_local_test_${t} PRIVATE ${PLANC_WARNINGS})
  target_link_libraries(cuda_local_test_${t} PRIVATE planrt_local ${CMOCKA_LIB})
endforeach()
add_test(NAME cuda_local_mpi
         COMMAND bash ${ROOT}/tests/cuda/local_mpi.sh ${PLANC} $<TARGET_FILE:planrt-run> $<TARGET_FILE:planrt_local>
                 ${OPENBLAS_CBLAS_INCLUDE} $<TARGET_FILE:cuda_local_test_collectives>
                 $<TARGET_FILE:cuda_local_test_step_kernels> $<TARGET_FILE:cuda_local_test_watchdog>
         WORKING_DIRECTORY ${ROOT})
set_tests_properties(cuda_local_mpi PROPERTIES TIMEOUT 900 ENVIRONMENT "${CC_CACHE_ENV}")

# cuda_gpu_binding: runtime/comm/binding.c's rules (local rank, device, backend) on plain data
add_executable(cuda_test_gpu_binding ${ROOT}/tests/cuda/test_gpu_binding.c)
target_compile_options(cuda_test_gpu_binding PRIVATE ${PLANC_WARNINGS})
target_link_libraries(cuda_test_gpu_binding PRIVATE planrt)
add_test(NAME cuda_gpu_binding COMMAND cuda_test_gpu_binding)
set_tests_properties(cuda_gpu_binding PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION "^PASS: ")
