#!/bin/sh
# README command 2: installs what is missing, builds planc with warnings as errors, runs the whole
# suite with ctest (one test per core at a time, the longest first), then fuzzes the front end with
# the libFuzzer harness for a bounded time (PLANC_FUZZ_SECONDS, default 60; 0 skips it). The
# harness is built with clang while the suite runs. Exits non-zero if anything fails.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
jobs=$(nproc)
seconds=${PLANC_FUZZ_SECONDS:-60}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPLANC_WERROR=ON >/dev/null
cmake --build build -j"$jobs"

fuzz_build=
if [ "$seconds" -gt 0 ]; then
	mkdir -p build-fuzz
	(cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DPLANC_FUZZ=ON -DPLANC_WERROR=ON &&
		cmake --build build-fuzz --target fuzz_frontend) >build-fuzz/build.log 2>&1 &
	fuzz_build=$!
fi
status=0
(cd build && ctest --output-on-failure -j"$jobs") || status=$?
if [ -n "$fuzz_build" ] && ! wait "$fuzz_build"; then
	tail -20 build-fuzz/build.log
	echo "fuzz: building the harness failed"
	exit 1
fi
[ "$status" -eq 0 ] || exit "$status"

if [ "$seconds" -gt 0 ]; then
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
