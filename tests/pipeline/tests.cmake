# Pipeline stage partition: pipeline_partition against a brute-force optimum and a dynamic
# program (test_partition.c), and planc's stages for 105 equal layers on 35 stages under every
# balance (run_stages.sh).
add_executable(pipeline_test_partition ${ROOT}/tests/pipeline/test_partition.c)
target_compile_options(pipeline_test_partition PRIVATE ${PLANC_WARNINGS} -O2)
target_link_libraries(pipeline_test_partition PRIVATE planc_core)
add_test(NAME pipeline_partition COMMAND pipeline_test_partition WORKING_DIRECTORY ${ROOT})
add_test(NAME pipeline_stages COMMAND sh ${ROOT}/tests/pipeline/run_stages.sh ${PLANC} WORKING_DIRECTORY ${ROOT})
