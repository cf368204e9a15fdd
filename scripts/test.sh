#!/bin/sh
# README command 2: installs what is missing, builds planc with warnings as errors, and runs the
# whole suite with ctest: one test per core at a time, the longest first (COST in
# tests/tests.cmake), the fuzzing among them (ctest fuzz_build and fuzz: clang's libFuzzer
# harnesses through scripts/fuzz.sh for PLANC_FUZZ_SECONDS, default 60; 0 skips them). Exits
# non-zero if anything fails.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPLANC_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
export PLANC_FUZZ_SECONDS="${PLANC_FUZZ_SECONDS:-60}"
cd build && exec ctest --output-on-failure -j"$jobs"
