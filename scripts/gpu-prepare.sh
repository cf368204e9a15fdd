#!/bin/bash
# gpu-prepare.sh: the bundle scripts/gpu-check.sh runs from on a GPU machine, made on the build
# machine (which has planc, MPI, OpenBLAS and the CUDA toolkit; the GPU machine has only the toolkit
# and PyTorch).
#
#   scripts/gpu-prepare.sh PLANC BUNDLE      (e.g. build/planc .gpu; then: bash .gpu/gpu-check.sh)
#
# BUNDLE gets: planrt's sources (runtime/, with standalone/: one-process MPI and a plain GEMM),
# gpu-build.sh and gpu-check.sh, compare/NAME/: the CUDA sources (planc emit cuda) of the plans
# the GPU's losses are compared with, and the CPU program's 20 losses of each (trained here), the
# CUDA sources of bench/gpu/gpt350m.plan `bf16`, planc explain --json of the 355M plan, the GEMM benchmark, the PyTorch model,
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
mkdir -p "$B/runtime" "$B/jansson/include" "$B/jansson/lib" "$B/prebuilt"
B=$(cd "$B" && pwd)
cp -r "$ROOT"/runtime/. "$B/runtime/" # a folder per concern (runtime/README.md), include/, standalone/
cp "$ROOT/scripts/gpu-build.sh" "$ROOT/scripts/gpu-check.sh" "$ROOT/bench/gpu/gemm_rate.cu" "$ROOT/bench/gpu/torch_gpt.py" \
	"$ROOT/bench/gpu/profile.sh" \
	"$ROOT/data/corpus.txt" "$B/"
cp /usr/include/jansson.h /usr/include/jansson_config.h "$B/jansson/include/"
cp /usr/lib/x86_64-linux-gnu/libjansson.a "$B/jansson/lib/"
cd "$ROOT"
"$PLANC" emit cuda bench/gpu/gpt350m.plan --plan bf16 -o "$B/gpt350m"
"$PLANC" explain bench/gpu/gpt350m.plan --plan bf16 --json > "$B/gpt350m_explain.json"
"$PLANC" explain bench/gpu/gpt350m.plan --plan bf16 > "$B/gpt350m_explain.txt"
# the programs compared with the CPU: their CUDA sources, and the CPU program's 20 losses here
tmp=$(mktemp -d)
while read -r name file plan data what; do
	mkdir -p "$B/compare/$name"
	# the run's options, the same on both machines: fp16 starts its loss scale at 2^20, where the
	# first steps overflow (3 skipped, the scale halved each time), so the found-inf path runs
	args=()
	[ "$name" = fp16_single ] && args=(--loss-scale-init 1048576)
	echo "${args[@]}" > "$B/compare/$name/args"
	"$PLANC" emit cuda "$file" --plan "$plan" -o "$B/compare/$name"
	"$PLANC" build "$file" --plan "$plan" -o "$tmp/$name"
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$tmp/$name" --steps 20 --data "$data" "${args[@]}" \
		--log "$B/compare/$name/cpu.jsonl" >/dev/null 2>&1
	mkdir -p "$B/$(dirname "$data")"
	cp -r "$data" "$B/$data"
	echo "$data" > "$B/compare/$name/data"
	echo "$file $plan ($what)" > "$B/compare/$name/what"
done <<'LIST'
gpt_single examples/gpt.plan single data/corpus.txt f32, dropout 0.1
llama_single examples/llama.plan single data/corpus.txt RoPE, RMS norm, SwiGLU
bert_single examples/bert.plan single_nodropout data/classify.safetensors a data set, the [CLS] narrow
moe_single examples/moe.plan single data/corpus.txt MoE top-2 with drops, dropout 0.1
mixtral_single examples/moe.plan mixtral_single data/corpus.txt MoE dropless, normalised top-2, SwiGLU
fp16_single examples/gpt.plan fp16 data/corpus.txt f16 storage, dynamic loss scaling
LIST
rm -rf "$tmp"
# the fallback programs, and the proof that the bundle builds
JANSSON_DIR=$B/jansson GPU_CHECK_WORK=$B/.work bash "$B/gpu-check.sh" --build-only
cp "$B"/.work/*_single "$B/.work/gpt350m" "$B/.work/gemm_rate" "$B/prebuilt/"
rm -rf "$B/.work"
du -sh "$B"
