# Kernel tests: finite differences of every gradient kernel (f64) and f32/f64 agreement
# (test_fd), and fixed-input semantics against PyTorch reference values checked in as
# reference.txt, written once by make_reference.py (test_semantics). Neither needs torch or MPI.
if(NOT TARGET planrt)
  message(FATAL_ERROR "kernel tests need the planrt library, which runtime/CMakeLists.txt did not define")
endif()
foreach(t fd semantics matmul_bf16 kernels16 decode)
  add_executable(kernels_test_${t} ${ROOT}/tests/kernels/test_${t}.c)
  target_compile_options(kernels_test_${t} PRIVATE ${PLANC_WARNINGS} -O2)
  target_link_libraries(kernels_test_${t} PRIVATE planrt)
endforeach()
add_test(NAME kernels_fd COMMAND kernels_test_fd WORKING_DIRECTORY ${ROOT})
# the GEMM of bf16 operands (precision bf16) against the widened f32 GEMM and a double product
add_test(NAME kernels_matmul_bf16 COMMAND kernels_test_matmul_bf16 WORKING_DIRECTORY ${ROOT})
# the 16-bit variants of sum_to and the norms (bf16 / f16 storage) against the casts and the f32 kernels
add_test(NAME kernels_16 COMMAND kernels_test_kernels16 WORKING_DIRECTORY ${ROOT})
# generation's kernels: decode attention with a key/value cache against the causal forward, the sampler
add_test(NAME kernels_decode COMMAND kernels_test_decode WORKING_DIRECTORY ${ROOT})
add_test(NAME kernels_semantics COMMAND kernels_test_semantics ${ROOT}/tests/kernels/reference.txt
         WORKING_DIRECTORY ${ROOT})
# the same at each instruction-set level planrt builds its kernels for (planrt_cpu.h; the test
# above runs this CPU's best), skipped on a CPU without it
if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(PLANRT_TEST_LEVELS baseline sve)
else()
  set(PLANRT_TEST_LEVELS baseline avx2 avx512)
endif()
foreach(level ${PLANRT_TEST_LEVELS})
  add_test(NAME kernels_semantics_${level} COMMAND kernels_test_semantics ${ROOT}/tests/kernels/reference.txt
           WORKING_DIRECTORY ${ROOT})
  set_tests_properties(kernels_semantics_${level} PROPERTIES ENVIRONMENT PLANRT_ISA=${level} SKIP_RETURN_CODE 77)
endforeach()
