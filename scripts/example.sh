#!/bin/sh
# README command 1: installs what is missing, builds planc and planrt, checks every plan of
# examples/gpt.plan, explains the 3-D plan, then compiles the 4-rank plan dp2_tp2 (data x tensor)
# and trains it under mpirun on data/corpus.txt (a text file in the repository), printing the
# progress line; the loss falls from ln(256) = 5.55.
set -e
cd "$(dirname "$0")/.."
. scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/planc check examples/gpt.plan
echo "examples/gpt.plan: every plan checks"
./build/planc explain examples/gpt.plan --plan gpt_3d
./build/planc build examples/gpt.plan --plan dp2_tp2 -o build/gpt_dp2_tp2
echo "training examples/gpt.plan, plan dp2_tp2, on 4 MPI ranks:"
# OpenMPI as root and with more ranks than cores (DESIGN section 7)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpirun -np 4 build/gpt_dp2_tp2 --steps ${PLANC_EXAMPLE_STEPS:-60} --data data/corpus.txt --log build/gpt_dp2_tp2.jsonl \
	--save build/gpt_dp2_tp2.safetensors
echo "metrics: build/gpt_dp2_tp2.jsonl, weights: build/gpt_dp2_tp2.safetensors"
