#!/bin/sh
# run_fuzz.sh: the libFuzzer harnesses (the front end, check, explain, the emitters) as two ctest tests, so that `ctest -j` packs
# them beside the rest of the suite (scripts/test.sh ran them after it, one core idle):
#   run_fuzz.sh build DIR   configures DIR with clang and -DPLANC_FUZZ=ON and builds the five
#                           harnesses: fuzz_frontend, fuzz_compile (fuzz_check, fuzz_explain
#                           and fuzz_emit are links to it) and fuzz_inputs (the readers of weights,
#                           token files, data sets, name maps and vocabularies) (ctest fuzz_build,
#                           the fixture fuzz needs)
#   run_fuzz.sh run DIR     scripts/fuzz.sh: each harness for its share of PLANC_FUZZ_SECONDS
#                           (default 60) from tests/fuzz/corpus, the example, stdlib and error plans
#                           as seeds; a crash, leak, sanitizer report or slow input fails it (ctest fuzz)
# Both exit 77 (ctest: skipped) when PLANC_FUZZ_SECONDS is 0 or there is no clang; scripts/deps.sh
# installs clang-14, so CI fuzzes.
set -u
mode=$1
dir=$2
seconds=${PLANC_FUZZ_SECONDS:-60}
clang=$(command -v clang-14 || command -v clang || true)
if [ "$seconds" -eq 0 ] || [ -z "$clang" ]; then
	[ -n "$clang" ] || echo "skip: no clang (scripts/deps.sh installs clang-14)"
	[ "$seconds" -ne 0 ] || echo "skip: PLANC_FUZZ_SECONDS=0"
	exit 77
fi
case $mode in
build)
	mkdir -p "$dir"
	if ! { cmake -S . -B "$dir" -DCMAKE_C_COMPILER="$clang" -DPLANC_FUZZ=ON -DPLANC_WERROR=ON -DPLANC_CUDA=OFF &&
		cmake --build "$dir" --target fuzz_frontend fuzz_compile fuzz_inputs; } >"$dir/build.log" 2>&1; then
		tail -20 "$dir/build.log"
		echo "fuzz build: 0 passed, 1 failed"
		exit 1
	fi
	echo "fuzz build: 1 passed, 0 failed"
	;;
run)
	FUZZ_BUILD=$dir sh scripts/fuzz.sh "$seconds" || {
		echo "fuzz: 0 passed, 1 failed"
		exit 1
	}
	echo "fuzz: 1 passed, 0 failed"
	;;
*)
	echo "usage: run_fuzz.sh build|run DIR" >&2
	exit 2
	;;
esac
