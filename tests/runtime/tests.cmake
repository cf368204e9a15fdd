# planrt unit tests (cmocka), included by tests/tests.cmake. Every test is named runtime_*.
# The MPI tests run under mpirun with TEST_MPI_ENV (tests/tests.cmake: root, more ranks than cores,
# shared-memory transport); the watchdog test must abort with its message, not hang.
# A missing dependency fails the configuration: these tests never silently drop out of the suite.
find_library(CMOCKA_LIB NAMES cmocka)
if(NOT CMOCKA_LIB)
  message(FATAL_ERROR "runtime tests need cmocka: install Debian's libcmocka-dev (scripts/deps.sh does)")
endif()
if(NOT TARGET planrt)
  message(FATAL_ERROR "runtime tests need the planrt library, which runtime/CMakeLists.txt did not define")
endif()
if(NOT MPIEXEC_EXECUTABLE)
  message(FATAL_ERROR "runtime tests need mpirun: install Debian's openmpi-bin (scripts/deps.sh does)")
endif()

set(RUNTIME_TEST_DIR ${CMAKE_SOURCE_DIR}/tests/runtime)
foreach(t rng data optim safetensors log memory collectives watchdog step_kernels)
  add_executable(runtime_test_${t} ${RUNTIME_TEST_DIR}/test_${t}.c)
  target_compile_options(runtime_test_${t} PRIVATE ${PLANC_WARNINGS})
  target_compile_definitions(runtime_test_${t} PRIVATE RUNTIME_TEST_DIR="${RUNTIME_TEST_DIR}")
  target_link_libraries(runtime_test_${t} PRIVATE planrt ${CMOCKA_LIB})
endforeach()

foreach(t rng data optim safetensors log memory)
  add_test(NAME runtime_${t} COMMAND runtime_test_${t})
  set_tests_properties(runtime_${t} PROPERTIES TIMEOUT 120 ENVIRONMENT "PLANRT_WATCHDOG=60")
endforeach()

add_test(NAME runtime_collectives
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_collectives> ${MPIEXEC_POSTFLAGS})
# A failed assertion on one rank leaves the others in a collective: the watchdog ends that.
set_tests_properties(runtime_collectives PROPERTIES TIMEOUT 180
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")

# the step kernels of the IR: values, in-place collectives on a mesh, counters, tagged p2p
add_test(NAME runtime_step_kernels
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_step_kernels> ${MPIEXEC_POSTFLAGS})
set_tests_properties(runtime_step_kernels PROPERTIES TIMEOUT 180
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")

add_test(NAME runtime_watchdog
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_watchdog> ${MPIEXEC_POSTFLAGS})
set_tests_properties(runtime_watchdog PROPERTIES TIMEOUT 60
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=2"
                     PASS_REGULAR_EXPRESSION "planrt: rank [0-9]+: watchdog: recv #1 of 4 f32 from member [0-9] on world \\(member [0-9] of 2\\) still pending after 2 s")

# a rank alone in planrt_world_sum (once a raw MPI_Allreduce the watchdog could not see)
add_test(NAME runtime_watchdog_world_sum
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_watchdog> world_sum ${MPIEXEC_POSTFLAGS})
set_tests_properties(runtime_watchdog_world_sum PROPERTIES TIMEOUT 60
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=2"
                     PASS_REGULAR_EXPRESSION "planrt: rank 0: watchdog: allreduce #1 of 1 f64 \\(sum\\) on world \\(member 0 of 2\\) still pending after 2 s")

# the same checks with the watchdog off, where blocking calls are MPI's blocking collectives
add_test(NAME runtime_collectives_no_watchdog
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_collectives> ${MPIEXEC_POSTFLAGS})
set_tests_properties(runtime_collectives_no_watchdog PROPERTIES TIMEOUT 180
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=0")

# planrt_main and the kernels of planrt_program.h, driven by hand-written program descriptors: a
# 2-stage pipeline run whose checks run inside its phase functions and on the checkpoint it saves,
# then (test_program.sh) --help, argument and path errors, a failing save, ZeRO shards, the
# --init / --save round trip and the PLANRT_REPORT_* lines
add_executable(runtime_test_program ${RUNTIME_TEST_DIR}/test_program.c)
target_compile_options(runtime_test_program PRIVATE ${PLANC_WARNINGS})
target_link_libraries(runtime_test_program PRIVATE planrt)
add_test(NAME runtime_program
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                 $<TARGET_FILE:runtime_test_program> ${MPIEXEC_POSTFLAGS} pipe --steps 3 --seed 7
                 --data ${CMAKE_SOURCE_DIR}/data/corpus.txt
                 --save ${CMAKE_CURRENT_BINARY_DIR}/runtime_program.safetensors)
set_tests_properties(runtime_program PROPERTIES TIMEOUT 120
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")
add_test(NAME runtime_program_cli
         COMMAND sh ${RUNTIME_TEST_DIR}/test_program.sh $<TARGET_FILE:runtime_test_program>
                 ${CMAKE_SOURCE_DIR}/data/corpus.txt)
set_tests_properties(runtime_program_cli PROPERTIES TIMEOUT 600
                     ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")
