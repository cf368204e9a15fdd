#!/bin/sh
# The PTX path: `planc emit ptx` writes every fused element-wise kernel of a plan as sm_80 PTX
# (LLVM's NVPTX target), and ptxas from the CUDA toolkit assembles it for sm_90 (the H200), for
# plans that between them have every kind of fused loop (f32 and bf16, broadcasts, accumulation,
# GELU and dropout gradients). The PTX is written and checked (sm_80, one .entry per fused loop of
# the plan's C) first; without ptxas the test then exits 77, which ctest reports as skipped: it
# never passes without assembling.
# usage: tests/llvm/ptxas.sh PLANC (from the repository root)
planc=$1
ptxas=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
. "$(dirname "$0")/../lib/harness.sh"
kernels=0
# one plan per kind of loop: f32, bf16, tensor and sequence parallel, Ulysses, recompute, 3D
cases="mlp:single mlp:bf16 mlp:tp2_sp gpt:single gpt:bf16 gpt:ulysses2 gpt:dp2_full_recompute gpt:gpt_3d"
for case in $cases; do
	model=${case%%:*} plan=${case#*:} out="$tmp/${case%%:*}-${case#*:}"
	if ! "$planc" emit ptx examples/$model.plan --plan "$plan" -o "$out" >"$tmp/log" 2>&1 ||
		! "$planc" emit c examples/$model.plan --plan "$plan" --no-layer-loops -o "$out" >>"$tmp/log" 2>&1; then
		bad "$model $plan: planc emit failed"; head -5 "$tmp/log"
		continue
	fi
	n=$(grep -c '^\.visible \.entry' "$out/kernels.ptx")
	loops=$(grep -c '^PLANRT_LOOP void [a-z0-9_]*loop[0-9]*(' "$out/prog.c") # each fused loop's function
	if ! grep -q '^\.target sm_80' "$out/kernels.ptx" || [ "$n" -eq 0 ] || [ "$n" -ne "$loops" ]; then
		bad "$model $plan: $n kernels in kernels.ptx for $loops fused loops in prog.c (or not sm_80)"
	fi
	kernels=$((kernels + n))
done
if [ ! -x "$ptxas" ]; then
	echo "ptxas not found (CUDA toolkit at /usr/local/cuda): $kernels kernels written, $fail failed; skipped"
	[ "$fail" -eq 0 ] && exit 77
	exit 1
fi
for case in $cases; do
	out="$tmp/${case%%:*}-${case#*:}"
	[ -f "$out/kernels.ptx" ] || continue
	if "$ptxas" -arch=sm_90 "$out/kernels.ptx" -o "$out/kernels.cubin" >"$tmp/log" 2>&1; then
		ok "${case%%:*} ${case#*:}: $(grep -c '^\.visible \.entry' "$out/kernels.ptx") kernels assembled for sm_90"
	else
		bad "${case%%:*} ${case#*:}: ptxas -arch=sm_90 failed"; head -5 "$tmp/log"
	fi
done
[ "$pass" -gt 0 ] || bad "no plan assembled"
finish "ptxas ($kernels kernels)"
