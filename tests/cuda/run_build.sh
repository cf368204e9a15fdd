#!/bin/bash
# run_build.sh: every plan of every example (examples/*.plan) builds for the CUDA target: planc build
# --target cuda, i.e. nvcc for sm_80 and sm_90 SASS and compute_80 PTX, linked with planrt_cuda,
# cuBLAS, NCCL and the static CUDA runtime. Each program must not link libcuda, and, started here
# without a GPU, must exit with status 1 and one line that says so. The plans the CUDA target
# cannot execute yet are listed below with the kernel they stop at: each must fail with that
# error, and a plan that fails otherwise (or a listed one that starts building) fails the test, so
# the list cannot grow or go stale silently. Identical kernels.cu files (most plans of a model) are
# compiled once (nvcc_cache.sh).
#   run_build.sh PLANC NVCC     (exit 77, skipped, when planc was built without the CUDA target)
set -u
PLANC=$1
NVCC=$2
ROOT=$(pwd)
if ! "$PLANC" build --help 2>&1 | grep -q "target=cpu|cuda" || [ ! -x "$NVCC" ]; then
	echo "skip: no nvcc"; exit 77
fi
# "file plan: the kernel it stops at" (the reason: planrt_cuda has no device version of it yet)
UNSUPPORTED="
examples/bert.plan single: narrow
examples/bert.plan single_nodropout: narrow
examples/bert.plan dp2: narrow
examples/bert.plan tp2: narrow
examples/bert.plan dp2_tp2_zero1: narrow
examples/gpt.plan zero3_offload: offload
examples/gpt.plan dp4_async: async_post
examples/gpt.plan dp4_async_s0: async_post
examples/gpt.plan dp2_tp2_async: async_post
examples/gpt.plan dp4_local_sgd: local_average
examples/gpt.plan dp4_diloco: local_average
examples/gpt.plan pp2_dp2_local_sgd: local_average
examples/gpt.plan dp2_local_sgd_k1: local_average
examples/gpt.plan dp4_bf16_grads: compress_cast
examples/gpt.plan dp4_powersgd: powersgd_init
examples/gpt.plan dp4_topk_zero1: compress_topk
examples/gpt.plan dp4_fp16_grads: compress_cast
examples/gpt.plan dp2_tp2_sp_topk: compress_topk
examples/gpt.plan pp2_dp2_powersgd: powersgd_init
examples/llama.plan single: rope
examples/llama.plan tp2: rope
examples/llama.plan tp2_patterns: rope
examples/llama.plan dp2_tp2_sp: rope
examples/llama.plan zero3_dp4: rope
examples/mlp.plan zero3_offload: offload
examples/moe.plan single: moe_route
examples/moe.plan ep2: moe_route
examples/moe.plan ep4: moe_route
examples/moe.plan ep2_tp2: moe_route
examples/moe.plan ep2_dp2: moe_route
examples/moe.plan ep2_dp2_zero1: moe_route
examples/moe.plan single_nodropout: moe_route
examples/moe.plan mixtral_single: moe_route
"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cache"
export NVCC_CACHE_DIR=$tmp/cache REAL_NVCC=$NVCC PLANC_NVCC=$ROOT/tests/cuda/nvcc_cache.sh TMPDIR=$tmp
fail=0 built=0 refused=0
bad() { echo "FAIL: $*"; fail=1; }
start=$(date +%s)
for f in examples/*.plan; do
	for p in $(grep -oE '^plan +[A-Za-z0-9_]+' "$f" | awk '{print $2}'); do
		want=$(printf '%s\n' "$UNSUPPORTED" | grep -F "$f $p:" | sed 's/.*: //')
		t0=$(date +%s.%N)
		out=$("$PLANC" build --target cuda "$f" --plan "$p" -o "$tmp/prog" 2>&1)
		rc=$?
		secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
		if [ -n "$want" ]; then
			if [ $rc = 0 ]; then
				bad "$f $p builds for cuda now: take it off the list in tests/cuda/run_build.sh"
			elif [ "$want" = offload ] && echo "$out" | grep -q "error: planc build does not execute offload yet"; then
				refused=$((refused + 1))
			elif echo "$out" | grep -q "error: planc build --target cuda cannot execute kernel '$want' yet"; then
				refused=$((refused + 1))
			else
				bad "$f $p: expected the error naming '$want', got:"; echo "$out" | head -5
			fi
			continue
		fi
		if [ $rc != 0 ]; then
			bad "$f $p does not build for cuda:"; echo "$out" | tail -8
			continue
		fi
		built=$((built + 1))
		if ldd "$tmp/prog" | grep -q 'libcuda\.so'; then bad "$f $p links libcuda"; fi
		if ! nm "$tmp/prog" | grep -q ' planrt_cuda_main$'; then bad "$f $p: no planrt_cuda_main in the program"; fi
		run=$("$tmp/prog" --steps 1 --data data/corpus.txt 2>&1)
		rrc=$?
		if [ -e /dev/nvidia0 ]; then
			: # a GPU is here: the program may run; the one-line refusal is for machines without one
		elif [ $rrc != 1 ] || [ "$(printf '%s\n' "$run" | wc -l)" != 1 ] || ! echo "$run" | grep -q "no CUDA GPU"; then
			bad "$f $p without a GPU: status $rrc, output:"; echo "$run" | head -5
		fi
		echo "ok: $f $p ($secs s)"
	done
done
echo "$built plans built for cuda, $refused refused as listed; nvcc: $(grep -c miss "$tmp/cache/stats" 2>/dev/null || echo 0) compiled, $(grep -c hit "$tmp/cache/stats" 2>/dev/null || echo 0) reused; $(( $(date +%s) - start )) s"
exit $fail
