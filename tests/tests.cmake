# The test suite (tests/README.md), run by ctest from the build directory: `ctest -j2` runs it all
# (scripts/test.sh does, with the build and the fuzzing), `ctest -L quick` the edit loop's tier.
# Every test runs from the repository root so diagnostics print repository-relative paths. The
# tiers and labels are at the end of this file.
set(PLANC $<TARGET_FILE:planc>)
set(ROOT ${CMAKE_SOURCE_DIR})
# mpirun as root with more ranks than cores, over shared memory, one thread per rank, a waiting
# rank yielding its core, MPI's start without the probes it does not need here (harness.py's MPI_ENV
# says why): the same as
# tests/lib/harness.py's MPI_ENV and harness.sh (the runners set it themselves; these are for the
# C tests ctest starts under mpirun). Each test adds its PLANRT_WATCHDOG.
set(TEST_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
    OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_pml=ob1 HWLOC_COMPONENTS=-pci,-linuxio
    HWLOC_PLUGINS_BLACKLIST=hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml OMP_NUM_THREADS=1
    OPENBLAS_NUM_THREADS=1)
# planc build's C compiler in the tests that build programs: mpicc with a cache of its outputs in
# the build directory, so a plan built with the same flags by several tests compiles once
# (tests/lib/cc_cache.sh)
set(CC_CACHE_ENV "PLANC_MPICC=${ROOT}/tests/lib/cc_cache.sh" "REAL_CC=${MPI_C_COMPILER}"
    "PLANC_CC_CACHE=${CMAKE_BINARY_DIR}/cc-cache")

# python3 through a version manager's shim (pyenv's: a shell script that runs pyenv, which runs the
# interpreter) took 0.34 s and 9,400 page faults a start here, where the interpreter itself takes
# 0.05 s and 1,900 (tests/README.md, "Time"); every python runner and many shell runners start it.
# The interpreter the shim resolves to is asked for once, here, and the tests run it directly: as
# a runner's command (runner_test), and first on PATH (TEST_PATH_ENV, every test) for the runners
# that start python3 themselves. Where python3 is the interpreter already, nothing changes.
find_program(PYTHON3_ON_PATH python3)
set(PYTHON3_EXE python3)
set(TEST_PATH_ENV)
if(PYTHON3_ON_PATH)
  execute_process(COMMAND ${PYTHON3_ON_PATH} -c "import sys; print(sys.executable)" OUTPUT_VARIABLE resolved
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  get_filename_component(shim_dir ${PYTHON3_ON_PATH} DIRECTORY)
  if(rc EQUAL 0 AND EXISTS "${resolved}")
    get_filename_component(resolved_dir ${resolved} DIRECTORY)
    if(NOT resolved_dir STREQUAL shim_dir)
      set(PYTHON3_EXE ${resolved})
      set(TEST_PATH_ENV "PATH=${resolved_dir}:$ENV{PATH}")
    endif()
  endif()
endif()

# runner_test(NAME TIMEOUT COMMAND...): a runner script's test, from the repository root, with the
# compile cache (a test that builds nothing does not use it); a command python3 is PYTHON3_EXE
function(runner_test name timeout)
  set(command ${ARGN})
  list(GET command 0 first)
  if(first STREQUAL "python3")
    list(REMOVE_AT command 0)
    list(INSERT command 0 ${PYTHON3_EXE})
  endif()
  add_test(NAME ${name} COMMAND ${command} WORKING_DIRECTORY ${ROOT})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} ENVIRONMENT "${CC_CACHE_ENV}")
endfunction()

# cuda_host_mpi_test(NAME): tests/cuda/test_NAME.c, a device kernel's logic run on the host against
# the CPU runtime on 4 ranks, as ctest cuda_NAME
function(cuda_host_mpi_test name)
  add_executable(cuda_test_${name} ${ROOT}/tests/cuda/test_${name}.c)
  target_compile_options(cuda_test_${name} PRIVATE ${PLANC_WARNINGS})
  target_include_directories(cuda_test_${name} PRIVATE ${ROOT}/runtime/include)
  target_link_libraries(cuda_test_${name} PRIVATE planrt m)
  add_test(NAME cuda_${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:cuda_test_${name}> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(cuda_${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "${TEST_MPI_ENV};PLANRT_WATCHDOG=60")
endfunction()

# ---- the front end and the command line (tests/front, tests/cli)
runner_test(errors 300 sh ${ROOT}/tests/front/run_errors.sh ${PLANC})
file(GLOB FMT_FILES ${ROOT}/examples/*.plan ${ROOT}/stdlib/*.plan ${ROOT}/tests/front/parse/*.plan)
runner_test(fmt_roundtrip 300 sh ${ROOT}/tests/front/fmt_roundtrip.sh ${PLANC} ${FMT_FILES})
runner_test(cli 600 sh ${ROOT}/tests/cli/run_cli.sh ${PLANC})

# ---- explain (tests/explain): the goldens of the small examples, of the 7B and 175B ones (most
# of the goldens' time: 36 and 96 layers), the papers' formulas, the picture
runner_test(explain_goldens 300 sh ${ROOT}/tests/explain/run_explain.sh ${PLANC} ${ROOT}/examples/mlp.plan
            ${ROOT}/examples/gpt.plan ${ROOT}/examples/moe.plan ${ROOT}/examples/llama.plan ${ROOT}/examples/bert.plan)
runner_test(explain_goldens_large 600 sh ${ROOT}/tests/explain/run_explain.sh ${PLANC}
            ${ROOT}/examples/gpt7b.plan ${ROOT}/examples/gpt175b.plan)
runner_test(explain_formulas 300 python3 ${ROOT}/tests/explain/check_formulas.py ${PLANC} ${ROOT})
runner_test(explain_svg 300 python3 ${ROOT}/tests/explain/check_svg.py ${PLANC} ${ROOT})
runner_test(explain_devices 300 python3 ${ROOT}/tests/explain/check_devices.py ${PLANC} ${ROOT})
# planc calibrate (issue 20): a measured device file, read back by explain
runner_test(calibrate 600 python3 ${ROOT}/tests/explain/check_calibrate.py ${PLANC} ${ROOT})
# generation's decode graph (compiler/graph/decode.c): one token per step, the caches, the refusals
runner_test(generate_graph 300 python3 ${ROOT}/tests/generate/check_decode_graph.py ${PLANC} ${ROOT})
# PROG --generate against PyTorch's greedy decoding (gpt, llama trained a few steps), tp2 = single, errors
runner_test(generate 600 /usr/bin/python3 ${ROOT}/tests/generate/check_generate.py ${PLANC} ${ROOT})
set_tests_properties(generate PROPERTIES SKIP_RETURN_CODE 77)
# the C printer's output, byte for byte (tests/emit)
runner_test(emit_golden 300 sh ${ROOT}/tests/emit/run_emit_golden.sh ${PLANC})
# runs of identical layers printed as loops train bit for bit like the unrolled program
# (--no-layer-loops) on one rank, dp2/tp2, a pipeline and full recompute; the looped prog.c is smaller
runner_test(emit_layer_loops 600 python3 ${ROOT}/tests/emit/run_layer_loops.py ${PLANC} ${ROOT} 3)

# ---- unit tests (cmocka, MPI) beside their sources' folders
include(${ROOT}/tests/runtime/tests.cmake)
include(${ROOT}/tests/kernels/tests.cmake)
include(${ROOT}/tests/pipeline/tests.cmake)
include(${ROOT}/tests/sync/tests.cmake)
include(${ROOT}/tests/llvm/tests.cmake)
include(${ROOT}/tests/cpu/tests.cmake)

# ---- the heart of the suite: every plan trains like the single-rank run (tests/equiv), one test
# per model group so that they run side by side; equiv_others is every model the others do not
# name (run_equiv.py's -MODEL), so a model added to run_equiv.py's PLANS is never left out
runner_test(equiv_gpt 1800 python3 ${ROOT}/tests/equiv/run_equiv.py ${PLANC} ${ROOT} 20 gpt)
runner_test(equiv_moe 900 python3 ${ROOT}/tests/equiv/run_equiv.py ${PLANC} ${ROOT} 20 moe tests/equiv/moe_names)
runner_test(equiv_mlp 600 python3 ${ROOT}/tests/equiv/run_equiv.py ${PLANC} ${ROOT} 20 mlp)
runner_test(equiv_ops 600 python3 ${ROOT}/tests/equiv/run_equiv.py ${PLANC} ${ROOT} 20 tests/equiv/ops)
runner_test(equiv_others 900 python3 ${ROOT}/tests/equiv/run_equiv.py ${PLANC} ${ROOT} 20
            -gpt -moe -tests/equiv/moe_names -mlp -tests/equiv/ops)
runner_test(equiv_sweep 900 python3 ${ROOT}/tests/equiv/run_sweep.py ${PLANC} ${ROOT} 24)
# PyTorch as an independent reference. Without Debian's python3-torch it exits 77, which ctest
# reports as skipped (scripts/deps.sh installs it, so CI runs it); a skip never reads as a pass.
# the fused attention trains as the attention written out, and saves the S^2 activations (tests/attention)
add_executable(attention_io ${ROOT}/tests/attention/attention_io.c)
target_compile_options(attention_io PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(attention_io PRIVATE planrt)
# the CPU's fused attention against PyTorch's on odd sizes, head dims, GQA ratios and masks
runner_test(attention_torch 300 /usr/bin/python3 ${ROOT}/tests/attention/check_torch.py $<TARGET_FILE:attention_io>)
set_tests_properties(attention_torch PROPERTIES SKIP_RETURN_CODE 77)
runner_test(attention_fused 900 python3 ${ROOT}/tests/attention/run_fused.py ${PLANC} ${ROOT} 5)
# context parallelism (ring attention) against one rank: cp2, cp4, with dp, tp and pp; bytes and
# memory equal explain's; what is refused (tests/context)
runner_test(context_parallel 1500 python3 ${ROOT}/tests/context/run_cp.py ${PLANC} ${ROOT} 20)
runner_test(torch_reference 900 /usr/bin/python3 ${ROOT}/tests/torch/torch_reference.py ${PLANC} ${ROOT} 20)
set_tests_properties(torch_reference PROPERTIES SKIP_RETURN_CODE 77)
# what programs allocate = explain's figure; ZeRO's and expert parallelism's memory (tests/memory)
runner_test(memory 600 python3 ${ROOT}/tests/memory/check_memory.py ${PLANC} ${ROOT})
# offload optimizer -> disk: the same run as without it, and the memory it saves (measured)
runner_test(offload 900 python3 ${ROOT}/tests/offload/check_offload.py ${PLANC} ${ROOT})

# ---- a generated program's operability (issue 12, runtime): sharded checkpoints resumed bit for
# bit, kill -9 inside a save, resharding between plans, --keep (tests/checkpoint); fp16 loss
# scaling (tests/fp16); bad input, NaN stops, refused arguments and paths, every survivor
# explaining a killed rank (tests/program); --trace, --eval-every, TensorBoard, tcp (tests/observe)
runner_test(checkpoint 900 python3 ${ROOT}/tests/checkpoint/run_checkpoint.py ${PLANC} ${ROOT})
runner_test(fp16 600 python3 ${ROOT}/tests/fp16/run_fp16.py ${PLANC} ${ROOT})
runner_test(program_errors 600 sh ${ROOT}/tests/program/run_program_errors.sh ${PLANC})
runner_test(program_failures 600 python3 ${ROOT}/tests/program/run_failures.py ${PLANC} ${ROOT})
runner_test(observe 600 python3 ${ROOT}/tests/observe/run_observe.py ${PLANC} ${ROOT})

# ---- the compiler at scale (issue 12): timings of million-rank plans and hostile input
# (tests/scale), the collective check's mismatches found at a million ranks
runner_test(scale 600 sh ${ROOT}/tests/scale/run_scale.sh ${PLANC})
# planc search (issue 20): pruned = brute force on small spaces, memory limits, --write
runner_test(search 900 python3 ${ROOT}/tests/search/run_search.py ${PLANC} ${ROOT})
# compile time (issue 20): explain of every example, of 1T GPTs under every ZeRO stage and of
# million-rank meshes within a CPU-time limit (bench/compile_time.py prints the figures)
runner_test(scale_compile_time 600 python3 ${ROOT}/tests/scale/run_compile_time.py ${PLANC})
# planc search of the 1T GPT on 3072 GPUs within a CPU-time limit (issue 20)
runner_test(scale_search 600 python3 ${ROOT}/tests/scale/run_search_time.py ${PLANC})
add_executable(scale_test_check ${ROOT}/tests/scale/test_check.c)
target_compile_options(scale_test_check PRIVATE ${PLANC_WARNINGS})
target_link_libraries(scale_test_check PRIVATE planc_core)
add_test(NAME scale_check COMMAND scale_test_check WORKING_DIRECTORY ${ROOT})

# ---- the loop-level IR's contracts (issue 21): kernels typed by the kernel table (named access,
# the verifier refusing a misfit argument), ZeRO and sync annotated by the graph passes and owned
# by state.c (nothing left for lowering to drop; the record explain reads), the runs of identical
# layers a loop would fold (layer_runs.c)
add_executable(lower_test_ir ${ROOT}/tests/lower/test_ir.c)
target_compile_options(lower_test_ir PRIVATE ${PLANC_WARNINGS})
target_link_libraries(lower_test_ir PRIVATE planc_core)
add_test(NAME lower_ir COMMAND lower_test_ir WORKING_DIRECTORY ${ROOT})

# ---- the CUDA target (issue 7). On a CPU: the stream/event schedule as data (its orderings:
# buckets under the backward, ZeRO-3 gathers prefetched, pipeline transfers beside compute) and
# the arena the device allocates; with the CUDA toolkit (planrt_cuda built): every example plan
# built for cuda (or refused as listed, by kernel), each program's one-line refusal without a
# GPU, and the build half of scripts/gpu-check.sh (planrt for one process, without MPI or OpenBLAS).
runner_test(cuda_streams 300 python3 ${ROOT}/tests/cuda/check_streams.py ${PLANC} ${ROOT})
# the multi-tensor optimizer's tables (compiler/target/cuda/optim_groups.c) against the C target's calls
runner_test(cuda_optim_groups 120 python3 ${ROOT}/tests/cuda/check_optim_groups.py ${PLANC} ${ROOT})
# bench/gpu/count_step.py (a CUDA program's device calls per step, from its source) counts a layer
# loop's body once a layer: the looped program's report equals the unrolled one's
runner_test(cuda_count_step 120 python3 ${ROOT}/tests/cuda/check_count_step.py ${PLANC} ${ROOT})
# the sync-strategy device kernels' per-element logic (runtime/include/planrt_sync_math.h) on the CPU,
# composed as runtime/cuda/sync_cuda.cu composes it, against compress.c, sync.c and step.c on 4 ranks
cuda_host_mpi_test(sync_math)
# the MoE kernels' per-token, per-expert and per-element logic (runtime/cuda/planrt_moe_math.h, which
# moe_cuda.cu runs on the device) run on the CPU against the CPU kernels, bit for bit
add_executable(cuda_test_moe_math ${ROOT}/tests/cuda/test_moe_math.c)
target_compile_options(cuda_test_moe_math PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(cuda_test_moe_math PRIVATE planrt)
add_test(NAME cuda_moe_math COMMAND cuda_test_moe_math WORKING_DIRECTORY ${ROOT})
# several ranks on GPUs, tested on the CPU: the MPI device backend, the node-local MPI, GPU binding
include(${ROOT}/tests/cuda/gpu_ranks.cmake)
# the fused attention's per-row logic (runtime/cuda/planrt_attention_math.h, attention_cuda.cu's
# threads) on the host against the CPU's tiled kernels: outputs, lse, gradients, dropout
add_executable(cuda_test_attention_math ${ROOT}/tests/cuda/test_attention_math.c)
target_compile_options(cuda_test_attention_math PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(cuda_test_attention_math PRIVATE planrt)
add_test(NAME cuda_attention_math COMMAND cuda_test_attention_math WORKING_DIRECTORY ${ROOT})
# the tiled attention the CUDA target takes for bf16 / f16 (runtime/cuda/planrt_attention_tiles.h):
# every block's code run on 128 host threads with barriers, the tensor-core products in loops, against
# the CPU's attention_16 / _grad_16
add_executable(cuda_test_attention_tiles ${ROOT}/tests/cuda/test_attention_tiles.c)
target_compile_options(cuda_test_attention_tiles PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(cuda_test_attention_tiles PRIVATE planrt)
add_test(NAME cuda_attention_tiles COMMAND cuda_test_attention_tiles WORKING_DIRECTORY ${ROOT})
# the CUDA permute's and sum_to's index arithmetic (runtime/include/planrt_index_math.h: divisions
# by a multiply-high, merged dims, 16-byte units) on the host against the plain definitions
add_executable(cuda_test_index_math ${ROOT}/tests/cuda/test_index_math.c)
target_compile_options(cuda_test_index_math PRIVATE ${PLANC_WARNINGS} -O2)
target_include_directories(cuda_test_index_math PRIVATE ${ROOT}/runtime/include)
add_test(NAME cuda_index_math COMMAND cuda_test_index_math WORKING_DIRECTORY ${ROOT})
# the layout conversions along a split dim (runtime/include/planrt_layout_math.h's map, which
# exec_cuda.cu's packing runs on the device), contiguous and the balanced ring's mirrored chunks,
# composed on the host against runtime/cpu/exec.c's conversions on rings of 2 and 4
cuda_host_mpi_test(layout_math)
# the multi-tensor optimizer's index math and update (runtime/include/planrt_optim_math.h, which
# kernels_cuda.cu's optimizer kernels run) on the host against the per-tensor launch and the CPU
add_executable(cuda_test_optim_math ${ROOT}/tests/cuda/test_optim_math.c)
target_compile_options(cuda_test_optim_math PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(cuda_test_optim_math PRIVATE planrt m)
add_test(NAME cuda_optim_math COMMAND cuda_test_optim_math WORKING_DIRECTORY ${ROOT})
if(TARGET planrt_cuda)
  add_test(NAME cuda_build COMMAND bash ${ROOT}/tests/cuda/run_build.sh ${PLANC} ${NVCC} ${MPI_C_COMPILER} WORKING_DIRECTORY ${ROOT})
  set_tests_properties(cuda_build PROPERTIES TIMEOUT 1500 SKIP_RETURN_CODE 77)
  add_test(NAME cuda_one_process COMMAND bash ${ROOT}/tests/cuda/one_process.sh ${PLANC} ${NVCC} WORKING_DIRECTORY ${ROOT})
  set_tests_properties(cuda_one_process PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
# the architecture (issue 21): the include and call graphs of compiler/ and runtime/, file by file
# and folder by folder, have no cycles (tests/arch/check_deps.py reads the sources and nm of the
# objects this build made)
add_test(NAME arch COMMAND ${PYTHON3_EXE} ${ROOT}/tests/arch/check_deps.py ${ROOT} ${CMAKE_BINARY_DIR} WORKING_DIRECTORY ${ROOT})
# no function in compiler/, runtime/ or grammar/ over 150 lines (issue 21; tests/arch/check_functions.py
# reads C as a compiler would, and lists with why the few still allowed over it)
add_test(NAME arch_functions COMMAND ${PYTHON3_EXE} ${ROOT}/tests/arch/check_functions.py ${ROOT} WORKING_DIRECTORY ${ROOT})


# ---- data (issue 22, docs/data.md): the token formats (text, nanoGPT, llm.c shards, Megatron's
# indexed data set) written by an independent Python writer, the sampling rules (epochs, blends,
# held-out batches, random) and document boundaries against the page's formulas re-implemented
# in Python, and planc data's tokenizer and trainer against an independent Python GPT-2 encoder;
# data_runs trains on them (evaluation, samples/s, refusals, masks, resume checks)
add_executable(data_dump ${ROOT}/tests/data/data_dump.c)
target_compile_options(data_dump PRIVATE ${PLANC_WARNINGS})
target_include_directories(data_dump PRIVATE ${ROOT}/runtime/io)
target_link_libraries(data_dump PRIVATE planrt)
runner_test(data 600 python3 ${ROOT}/tests/data/check_data.py ${PLANC} $<TARGET_FILE:data_dump> ${ROOT})
runner_test(fmt_golden 300 sh ${ROOT}/tests/front/run_fmt_golden.sh ${PLANC})
runner_test(data_runs 900 python3 ${ROOT}/tests/data/check_runs.py ${PLANC} ${ROOT})

# ---- reliability (issue 23)
# a resume continues the checkpoint's run or is refused before step 1, across sync modes, ZeRO
# stages, offload and precisions; resharding into local SGD refused; the data (every file of a
# blend) identified by content; a hand-edited manifest refused
runner_test(resume_guard 900 python3 ${ROOT}/tests/checkpoint/check_resume_guard.py ${PLANC} ${ROOT})
# outputs never replace what is not theirs: every output of a program and of planc against a
# symlink, a FIFO, a directory and character devices; --log / --trace write errors; planc build
# killed by a signal; options given twice; bad --map files
runner_test(outputs 900 python3 ${ROOT}/tests/program/check_outputs.py ${PLANC} ${ROOT})
# ranks that outnumber their cores sleep while they wait: 4 ranks on 2 cores (taskset) with a
# straggler use less CPU than the wait lasts, and compute the same losses
runner_test(runtime_oversubscribed 300 python3 ${ROOT}/tests/runtime/check_oversubscribed.py ${PLANC} ${ROOT})
set_tests_properties(runtime_oversubscribed PROPERTIES SKIP_RETURN_CODE 77)
# explain --json's byte counts are exact 64-bit integers, above 2^53 too
runner_test(explain_json_exact 300 python3 ${ROOT}/tests/explain/check_json_exact.py ${PLANC} ${ROOT})
# the soak's short form (bench/soak.py --short): gpt_3d on 8 ranks for 12 steps, checkpoints every
# 2, a random rank SIGKILLed every ~3 steps and the job restarted with --resume until it finishes;
# the final weights and every loss equal an uninterrupted run's bit for bit
runner_test(soak 600 python3 ${ROOT}/bench/soak.py ${PLANC} ${ROOT} --short)

# ---- the libFuzzer harnesses (tests/fuzz: the front end, check, explain, the emitters): built with
# clang into the build directory's fuzz/ (fuzz_build, a fixture), then each run for its share of
# PLANC_FUZZ_SECONDS (default 60; 0 skips both) beside the rest of the suite (scripts/fuzz.sh)
add_test(NAME fuzz_build COMMAND sh ${ROOT}/tests/fuzz/run_fuzz.sh build ${CMAKE_BINARY_DIR}/fuzz WORKING_DIRECTORY ${ROOT})
set_tests_properties(fuzz_build PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 FIXTURES_SETUP fuzz_harness)
add_test(NAME fuzz COMMAND sh ${ROOT}/tests/fuzz/run_fuzz.sh run ${CMAKE_BINARY_DIR}/fuzz WORKING_DIRECTORY ${ROOT})
set_tests_properties(fuzz PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 FIXTURES_REQUIRED fuzz_harness)

# ---- tiers and labels (README.md, "Tests"). Every test is in exactly one tier:
#   quick  the edit loop (`ctest -L quick -j2`, under 90 s on 2 cores): diagnostics, goldens,
#          unit tests, the CLI, and the equivalence of the op test model and the MLP's plans
#   slow   the rest: every other plan trained, the back ends against each other, PyTorch,
#          checkpoints, offload, the CUDA builds
# and labelled by what it needs: mpi (programs under mpirun), cuda (the CUDA toolkit: nvcc,
# ptxas), torch (Debian's python3-torch). COST (about the test's seconds on an idle 2-core
# machine) makes `ctest -j` start the long tests first.
set(QUICK_TESTS errors fmt_roundtrip cli explain_goldens explain_formulas explain_svg explain_devices emit_golden
    runtime_rng runtime_data runtime_optim runtime_safetensors runtime_log runtime_memory runtime_collectives
    runtime_step_kernels runtime_watchdog runtime_watchdog_world_sum runtime_collectives_no_watchdog
    runtime_program runtime_program_cli kernels_fd kernels_semantics kernels_matmul_bf16 kernels_16 kernels_decode pipeline_partition pipeline_stages
    sync_check sync_kernels llvm_verify scale_check lower_ir cuda_streams cuda_sync_math cuda_moe_math cuda_attention_math cuda_attention_tiles cuda_index_math cuda_layout_math cuda_optim_math cuda_optim_groups cuda_count_step equiv_ops equiv_mlp arch arch_functions
    fmt_golden data explain_json_exact generate_graph cuda_gpu_binding cuda_comm_staged_watchdog)
set(MPI_TESTS runtime_collectives runtime_step_kernels runtime_watchdog runtime_watchdog_world_sum
    runtime_collectives_no_watchdog runtime_program runtime_program_cli runtime_oversubscribed sync_kernels sync_runs llvm_diff
    equiv_gpt equiv_moe equiv_mlp equiv_ops equiv_others equiv_sweep attention_fused context_parallel torch_reference memory offload checkpoint fp16
    program_errors program_failures observe generate cuda_sync_math cpu_levels cpu_threads data_runs resume_guard outputs
    cuda_comm_staged cuda_comm_staged_watchdog cuda_comm_staged_local cuda_local_mpi soak calibrate emit_layer_loops)
set(CUDA_TESTS llvm_ptxas cuda_build cuda_one_process)
set(TORCH_TESTS torch_reference attention_torch generate)
# COST makes ctest -j start the longest first (a test not listed costs 0 and fills the gaps): each
# test's wall seconds in the last full `sh scripts/test.sh` from a clean clone (main ab559ee,
# 2026-12-03 05:41 UTC, quiet 2-core machine, ctest -j2; tests/README.md "Time"), every test of 5 s
# or more
set(TEST_COSTS equiv_gpt 122 fuzz_build 75 llvm_diff 65 fuzz 64 context_parallel 57 equiv_sweep 54
    equiv_others 52 cuda_build 52 offload 45 sync_runs 36 torch_reference 32 resume_guard 29
    cuda_one_process 28 cpu_levels 28 checkpoint 28 outputs 26 fp16 25 program_errors 24 emit_layer_loops 24
    cuda_local_mpi 24 memory 23 generate 13 data_runs 12 equiv_moe 11 search 9 cpu_threads 9
    program_failures 8 soak 7 runtime_program_cli 7 observe 7 attention_fused 7 cli 6)

get_property(ALL_TESTS DIRECTORY PROPERTY TESTS)
foreach(t ${ALL_TESTS})
  if(t IN_LIST QUICK_TESTS)
    set(labels quick)
  else()
    set(labels slow)
  endif()
  foreach(label mpi cuda torch)
    string(TOUPPER ${label} upper)
    if(t IN_LIST ${upper}_TESTS)
      list(APPEND labels ${label})
    endif()
  endforeach()
  set_tests_properties(${t} PROPERTIES LABELS "${labels}")
  if(TEST_PATH_ENV)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${TEST_PATH_ENV}")
  endif()
endforeach()
foreach(t ${QUICK_TESTS} ${MPI_TESTS} ${CUDA_TESTS} ${TORCH_TESTS})
  if(NOT t IN_LIST ALL_TESTS AND NOT (t MATCHES "^cuda_(build|one_process)$" AND NOT TARGET planrt_cuda))
    message(FATAL_ERROR "tests/tests.cmake labels a test '${t}' that no add_test defines")
  endif()
endforeach()
list(LENGTH TEST_COSTS n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET TEST_COSTS ${i} t)
  list(GET TEST_COSTS ${j} cost)
  if(t IN_LIST ALL_TESTS)
    set_tests_properties(${t} PROPERTIES COST ${cost})
  endif()
endforeach()
