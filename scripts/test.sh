#!/bin/sh
# README command 2: installs what is missing, builds planc with warnings as errors, runs the whole
# suite with ctest, then builds the libFuzzer harness with clang and fuzzes the front end for a
# bounded time (PLANC_FUZZ_SECONDS, default 60). Exits non-zero if anything fails.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPLANC_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure)

seconds=${PLANC_FUZZ_SECONDS:-60}
if [ "$seconds" -gt 0 ]; then
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DPLANC_FUZZ=ON -DPLANC_WERROR=ON >/dev/null
	cmake --build build-fuzz --target fuzz_frontend -j"$jobs" >/dev/null
	corpus=$(mktemp -d)
	cp tests/fuzz/corpus/* "$corpus"/
	for f in examples/*.plan stdlib/*.plan; do
		cp "$f" "$corpus/seed_$(basename "$f")"
	done
	echo "fuzzing the front end for ${seconds}s"
	ASAN_OPTIONS=detect_leaks=1 ./build-fuzz/tests/fuzz/fuzz_frontend -max_total_time="$seconds" \
		-print_final_stats=1 "$corpus" 2>build-fuzz/fuzz.log || {
		tail -40 build-fuzz/fuzz.log
		echo "fuzz: 0 passed, 1 failed"
		exit 1
	}
	grep -E "stat::number_of_executed_units" build-fuzz/fuzz.log || true
	rm -rf "$corpus"
	echo "fuzz: 1 passed, 0 failed"
fi
