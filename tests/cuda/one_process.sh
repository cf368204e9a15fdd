#!/bin/bash
# one_process.sh: the build half of scripts/gpu-check.sh, on a machine without a GPU (CI).
# scripts/gpu-build.sh compiles planrt for one process (runtime/standalone: MPI for a world of one,
# a plain GEMM) with planrt_cuda, then a CUDA program from `planc emit cuda`: it must build without
# MPI and OpenBLAS (neither may be linked), never link libcuda, and, started here, exit with one
# line that says there is no GPU. The one-process planrt is then held against the real one: the
# CPU program of examples/mlp.plan `single` linked with it trains 5 steps with the losses of the
# same program built by planc build (MPI, OpenBLAS), within 1e-5 relative (the GEMM sums in another
# order), started without mpirun.
#   one_process.sh PLANC NVCC      (exit 77, skipped, without nvcc)
set -u
PLANC=$1
NVCC=$2
[ -x "$NVCC" ] || { echo "skip: no nvcc"; exit 77; }
. "$(dirname "$0")/../lib/harness.sh"
"$PLANC" emit cuda examples/mlp.plan --plan single -o "$tmp/cu" || exit 1
"$PLANC" emit c examples/mlp.plan --plan single -o "$tmp/c" || exit 1
# one target keeps the test short; gpu-check.sh builds sm_80 + sm_90 + PTX
if ! GPU_ARCHS="arch=compute_90,code=sm_90" NVCC=$NVCC scripts/gpu-build.sh runtime "$tmp/lib" "$tmp/cu" "$tmp/prog"; then
	bad "scripts/gpu-build.sh"; finish "cuda one process"
fi
libs=$(ldd "$tmp/prog")
for l in libmpi libopenblas libcuda.so libjansson; do
	if echo "$libs" | grep -q "$l"; then bad "the one-process CUDA program links $l"; else ok; fi
done
out=$("$tmp/prog" --steps 1 --data data/corpus.txt 2>&1)
rc=$?
if [ -e /dev/nvidia0 ]; then
	echo "a GPU is here: not checking the refusal"
elif [ $rc != 1 ] || [ "$(printf '%s\n' "$out" | wc -l)" != 1 ] || ! echo "$out" | grep -q "no CUDA GPU"; then
	bad "without a GPU: status $rc, output: $out"
else
	ok "without a GPU: $out"
fi
# the CPU program against the one-process planrt
cc -std=gnu11 -O1 -Iruntime/standalone -Iruntime/include "$tmp/c/prog.c" -o "$tmp/cpu_one" "$tmp/lib/libplanrt_one.a" \
	/usr/lib/x86_64-linux-gnu/libjansson.a -lpthread -lm || exit 1
if ldd "$tmp/cpu_one" | grep -q -E "libmpi|libopenblas"; then bad "the one-process CPU program links MPI or OpenBLAS"; else ok; fi
"$PLANC" build examples/mlp.plan --plan single -o "$tmp/cpu_mpi" || exit 1
env -u OMPI_COMM_WORLD_RANK "$tmp/cpu_one" --steps 5 --data data/corpus.txt --log "$tmp/one.jsonl" >/dev/null || bad "the one-process program failed"
"$tmp/cpu_mpi" --steps 5 --data data/corpus.txt --log "$tmp/mpi.jsonl" >/dev/null || bad "the MPI program failed"
if python3 - "$tmp/mpi.jsonl" "$tmp/one.jsonl" <<'PY'; then ok; else fail=$((fail + 1)); fi
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=1.0)
ok = len(a) == len(b) == 5 and worst <= 1e-5
print(f"{'PASS' if ok else 'FAIL'}: one process vs MPI + OpenBLAS: {len(b)} of {len(a)} steps, worst relative difference {worst:.2e}")
sys.exit(0 if ok else 1)
PY
finish "cuda one process"
