#!/bin/sh
# README command 2: installs what is missing, builds planc with warnings as errors, runs the whole
# suite with ctest (one test per core at a time, the longest first), then fuzzes with the libFuzzer
# harnesses (the front end, check, explain, the emitters: scripts/fuzz.sh), each for its share of a
# bounded time (PLANC_FUZZ_SECONDS, default 60; 0 skips them). The harnesses are built with clang
# while the suite runs. Exits non-zero if anything fails.
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
		cmake --build build-fuzz --target fuzz_frontend fuzz_check fuzz_explain fuzz_emit) >build-fuzz/build.log 2>&1 &
	fuzz_build=$!
fi
status=0
(cd build && ctest --output-on-failure -j"$jobs") || status=$?
if [ -n "$fuzz_build" ] && ! wait "$fuzz_build"; then
	tail -20 build-fuzz/build.log
	echo "fuzz: building the harnesses failed"
	exit 1
fi
[ "$status" -eq 0 ] || exit "$status"

# the libFuzzer harnesses, each for its share of PLANC_FUZZ_SECONDS (scripts/fuzz.sh: executions,
# executions per CPU second, the share of inputs that parse)
if [ "$seconds" -gt 0 ]; then
	sh scripts/fuzz.sh "$seconds"
fi
