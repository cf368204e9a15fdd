#!/bin/sh
# The PTX path: `planc emit ptx` writes every fused element-wise kernel of a plan as sm_80 PTX
# (LLVM's NVPTX target), and ptxas from the CUDA toolkit assembles it for sm_90 (the H200), for
# plans that between them have every kind of fused loop (f32 and bf16, broadcasts, accumulation,
# GELU and dropout gradients). Without ptxas this exits 77, which ctest reports as skipped;
# it never passes without assembling.
# usage: tests/llvm/ptxas.sh PLANC (from the repository root)
planc=$1
ptxas=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
if [ ! -x "$ptxas" ]; then
	echo "ptxas not found (CUDA toolkit at /usr/local/cuda): skipped"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 kernels=0
# one plan per kind of loop: f32, bf16, tensor and sequence parallel, Ulysses, recompute, 3D
for case in mlp:single mlp:bf16 mlp:tp2_sp gpt:single gpt:bf16 gpt:ulysses2 gpt:dp2_full_recompute gpt:gpt_3d; do
	model=${case%%:*} plan=${case#*:} out="$tmp/${case%%:*}-${case#*:}"
	if ! "$planc" emit ptx examples/$model.plan --plan "$plan" -o "$out" >"$tmp/log" 2>&1; then
		echo "FAIL: $model $plan: planc emit ptx failed"; head -5 "$tmp/log"
		fail=$((fail + 1))
		continue
	fi
	n=$(grep -c '^\.visible \.entry' "$out/kernels.ptx")
	if grep -q '^\.target sm_80' "$out/kernels.ptx" && [ "$n" -gt 0 ] &&
		"$ptxas" -arch=sm_90 "$out/kernels.ptx" -o "$out/kernels.cubin" >"$tmp/log" 2>&1; then
		pass=$((pass + 1))
		kernels=$((kernels + n))
	else
		echo "FAIL: $model $plan: $n kernels, ptxas -arch=sm_90 failed"; head -5 "$tmp/log"
		fail=$((fail + 1))
	fi
done
echo "ptxas: $pass plans ($kernels kernels) assembled for sm_90, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
