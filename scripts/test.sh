#!/bin/sh
# README command 2: installs what is missing, builds planc with warnings as errors, runs the whole
# suite with ctest, then builds the libFuzzer harnesses with clang and fuzzes each (the front end,
# check, explain, the emitters) for its share of a bounded time (PLANC_FUZZ_SECONDS, default 60).
# Exits non-zero if anything fails.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPLANC_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure)

# the libFuzzer harnesses (tests/fuzz: the front end, check, explain, the emitters), each for its
# share of PLANC_FUZZ_SECONDS (default 60; 0 skips them), built with clang-14 (scripts/fuzz.sh)
seconds=${PLANC_FUZZ_SECONDS:-60}
if [ "$seconds" -gt 0 ]; then
	sh scripts/fuzz.sh "$seconds"
fi
