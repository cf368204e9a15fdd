#!/bin/sh
# README command 1: installs what is missing, builds planc, and runs the main example: checks every
# plan of examples/gpt.plan and explains the 3-D plan (data x pipe x tensor = 8 ranks).
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/planc check examples/gpt.plan
echo "examples/gpt.plan: every plan checks"
./build/planc explain examples/gpt.plan --plan gpt_3d
