#!/bin/sh
# run_fuzz.sh: the libFuzzer harness of the front end as two ctest tests, so that `ctest -j` packs
# them beside the rest of the suite (scripts/test.sh ran them after it, one core idle):
#   run_fuzz.sh build DIR   configures DIR with clang and -DPLANC_FUZZ=ON and builds fuzz_frontend
#                           (ctest fuzz_build, the fixture fuzz needs)
#   run_fuzz.sh run DIR     fuzzes for PLANC_FUZZ_SECONDS (default 60) from tests/fuzz/corpus and
#                           every example and stdlib plan as seeds; a crash, leak or sanitizer
#                           report fails it (ctest fuzz)
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
	if ! { cmake -S . -B "$dir" -DCMAKE_C_COMPILER="$clang" -DPLANC_FUZZ=ON -DPLANC_WERROR=ON &&
		cmake --build "$dir" --target fuzz_frontend; } >"$dir/build.log" 2>&1; then
		tail -20 "$dir/build.log"
		echo "fuzz build: 0 passed, 1 failed"
		exit 1
	fi
	echo "fuzz build: 1 passed, 0 failed"
	;;
run)
	corpus=$(mktemp -d)
	trap 'rm -rf "$corpus"' EXIT
	cp tests/fuzz/corpus/* "$corpus"/
	for f in examples/*.plan stdlib/*.plan; do
		cp "$f" "$corpus/seed_$(basename "$f")"
	done
	echo "fuzzing the front end for ${seconds}s"
	if ! ASAN_OPTIONS=detect_leaks=1 "$dir/tests/fuzz/fuzz_frontend" -max_total_time="$seconds" \
		-print_final_stats=1 "$corpus" 2>"$dir/fuzz.log"; then
		tail -40 "$dir/fuzz.log"
		echo "fuzz: 0 passed, 1 failed"
		exit 1
	fi
	grep -E "stat::number_of_executed_units" "$dir/fuzz.log" || true
	echo "fuzz: 1 passed, 0 failed"
	;;
*)
	echo "usage: run_fuzz.sh build|run DIR" >&2
	exit 2
	;;
esac
