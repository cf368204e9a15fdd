#!/bin/bash
# gpu-prepare.sh: the bundle scripts/gpu-check.sh runs from on a GPU machine, made on the build
# machine (which has planc, MPI, OpenBLAS and the CUDA toolkit; the GPU machine has only the toolkit
# and PyTorch).
#
#   scripts/gpu-prepare.sh PLANC BUNDLE      (e.g. build/planc .gpu; then: bash .gpu/gpu-check.sh)
#
# BUNDLE gets: planrt's sources (runtime/, with standalone/: one-process MPI and a plain GEMM),
# gpu-build.sh and gpu-check.sh, the CUDA sources of examples/gpt.plan `single` and
# bench/gpu/gpt350m.plan `bf16` (planc emit cuda), the CPU program's 20 losses of `single` to compare
# with (trained here), planc explain --json of the 355M plan, the GEMM benchmark, the PyTorch model,
# data/corpus.txt, jansson's header and static archive (the one C library planrt needs that a CUDA
# image lacks), and prebuilt/: the same programs built here by gpu-build.sh, used only if the build
# there fails. It ends by building the bundle here (gpu-check.sh --build-only), so a bundle that
# does not build is never shipped.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 PLANC BUNDLE" >&2; exit 2; }
PLANC=$(readlink -f "$1")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$2
rm -rf "$B"
mkdir -p "$B/runtime/standalone" "$B/jansson/include" "$B/jansson/lib" "$B/prebuilt"
B=$(cd "$B" && pwd)
cp "$ROOT"/runtime/*.c "$ROOT"/runtime/*.cu "$ROOT"/runtime/*.h "$B/runtime/"
cp "$ROOT"/runtime/standalone/*.h "$B/runtime/standalone/"
cp "$ROOT/scripts/gpu-build.sh" "$ROOT/scripts/gpu-check.sh" "$ROOT/bench/gpu/gemm_rate.cu" "$ROOT/bench/gpu/torch_gpt.py" \
	"$ROOT/data/corpus.txt" "$B/"
cp /usr/include/jansson.h /usr/include/jansson_config.h "$B/jansson/include/"
cp /usr/lib/x86_64-linux-gnu/libjansson.a "$B/jansson/lib/"
cd "$ROOT"
"$PLANC" emit cuda examples/gpt.plan --plan single -o "$B/gpt_single"
"$PLANC" emit cuda bench/gpu/gpt350m.plan --plan bf16 -o "$B/gpt350m"
"$PLANC" explain bench/gpu/gpt350m.plan --plan bf16 --json > "$B/gpt350m_explain.json"
"$PLANC" explain bench/gpu/gpt350m.plan --plan bf16 > "$B/gpt350m_explain.txt"
# the reference: the CPU program of `single`, 20 steps, on this machine
tmp=$(mktemp -d)
"$PLANC" build examples/gpt.plan --plan single -o "$tmp/cpu_single"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$tmp/cpu_single" --steps 20 --data data/corpus.txt --log "$B/cpu_single.jsonl" >/dev/null
rm -rf "$tmp"
# the fallback programs, and the proof that the bundle builds
JANSSON_DIR=$B/jansson GPU_CHECK_WORK=$B/.work bash "$B/gpu-check.sh" --build-only
cp "$B/.work/gpt_single" "$B/.work/gpt350m" "$B/.work/gemm_rate" "$B/prebuilt/"
rm -rf "$B/.work"
du -sh "$B"
