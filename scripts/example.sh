#!/bin/sh
# README command 1: installs what is missing, builds planc and planrt, checks every plan of
# examples/gpt.plan, explains the README's headline plan gpt_3d (data x pipeline x tensor on 8
# ranks: Megatron tensor and sequence parallelism, a 1F1B pipeline, ZeRO-1, selective
# recomputation), then compiles it and trains it under mpirun on data/corpus.txt (a text file in
# the repository), printing the progress line; the loss falls from ln(256) = 5.55.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/planc check examples/gpt.plan
echo "examples/gpt.plan: every plan checks"
./build/planc explain examples/gpt.plan --plan gpt_3d
./build/planc build examples/gpt.plan --plan gpt_3d -o build/gpt_3d
echo "training examples/gpt.plan, plan gpt_3d, on 8 MPI ranks (data 2 x pipe 2 x tensor 2):"
# OpenMPI as root and with more ranks than cores (the environment tests/lib/harness.sh sets)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpirun -np 8 build/gpt_3d --steps ${PLANC_EXAMPLE_STEPS:-60} --data data/corpus.txt --log build/gpt_3d.jsonl \
	--save build/gpt_3d.safetensors
echo "metrics: build/gpt_3d.jsonl, weights: build/gpt_3d.safetensors"
