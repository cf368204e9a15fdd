#!/bin/bash
# one_process.sh: the build half of scripts/gpu-check.sh, on a machine without a GPU (CI).
# scripts/gpu-build.sh compiles planrt with its node-local MPI (runtime/standalone: shared memory
# between the ranks planrt-run starts, a world of one without it; a plain GEMM) with planrt_cuda and
# planrt-run, then a CUDA program from `planc emit cuda` and the device comm backends' unit test
# (tests/cuda/test_nccl_one.cu), the tiled attention's device test (test_attention_tiles_gpu.cu), the
# permute and sum_to device test (test_index_gpu.cu) and the GEMM epilogue's (test_epilogue_gpu.cu):
# they must build without MPI and OpenBLAS (neither may be linked), never link libcuda, and,
# started here, the program exits with one line that says there is no GPU and the four tests with
# status 77
# (skipped). The bundle's planrt is then held against the real
# one: the CPU program of examples/mlp.plan `single` linked with it trains 5 steps with the losses
# of the same program built by planc build (MPI, OpenBLAS), within 1e-5 relative (the GEMM sums in
# another order), started without a launcher; and `dp2_tp2_zero2` under the bundle's planrt-run -n 4
# with the losses of planc build's under mpirun -np 4.
#   one_process.sh PLANC NVCC      (exit 77, skipped, without nvcc)
set -u
PLANC=$1
NVCC=$2
[ -x "$NVCC" ] || { echo "skip: no nvcc"; exit 77; }
. "$(dirname "$0")/../lib/harness.sh"
# same_losses REFERENCE.jsonl RUN.jsonl STEPS LABEL: every step's loss within 1e-5 relative
same_losses() {
	python3 - "$@" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
steps = int(sys.argv[3])
worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=1.0)
ok = len(a) == len(b) == steps and worst <= 1e-5
print(f"{'PASS' if ok else 'FAIL'}: {sys.argv[4]}: {len(b)} of {len(a)} steps, worst relative difference {worst:.2e}")
sys.exit(0 if ok else 1)
PY
}
"$PLANC" emit cuda examples/mlp.plan --plan single -o "$tmp/cu" || exit 1
"$PLANC" emit c examples/mlp.plan --plan single -o "$tmp/c" || exit 1
# compute_90 PTX only (no ptxas) and the host code at -O0 keep the test short (116 -> 83 CPU s):
# ptxas and -O2 of the runtime are the CMake build's planrt_cuda, and of every plan's kernels.cu
# cuda_build's; the test's programs only start here (a GPU would JIT the PTX). gpu-check.sh builds
# sm_80 + sm_90 + PTX at -O2
if ! GPU_ARCHS="arch=compute_90,code=compute_90" GPU_BUILD_OPT=-O0 NVCC=$NVCC scripts/gpu-build.sh runtime "$tmp/lib" "$tmp/cu" "$tmp/prog" \
	tests/cuda/test_nccl_one.cu "$tmp/nccl_one" tests/cuda/test_attention_tiles_gpu.cu "$tmp/attention_tiles_gpu" \
	tests/cuda/test_index_gpu.cu "$tmp/index_gpu" tests/cuda/test_epilogue_gpu.cu "$tmp/epilogue_gpu"; then
	bad "scripts/gpu-build.sh"; finish "cuda one process"
fi
for p in prog nccl_one attention_tiles_gpu index_gpu epilogue_gpu lib/planrt-run; do
	libs=$(ldd "$tmp/$p")
	for l in libmpi libopenblas libcuda.so libjansson; do
		if echo "$libs" | grep -q "$l"; then bad "the bundle's $p links $l"; else ok; fi
	done
done
# skips PROG WHAT: a unit test for the GPU machine ran there, or skips (status 77) without a GPU
skips() {
	out=$("$tmp/$1" 2>&1)
	rc=$?
	if [ -e /dev/nvidia0 ]; then
		echo "a GPU is here: $2 ran: $(echo "$out" | tail -1)"
		if [ $rc = 0 ]; then ok; else bad "$1 on this GPU: $out"; fi
	elif [ $rc = 77 ] && echo "$out" | grep -q "skip: no CUDA GPU"; then
		ok "$2 built and skips without a GPU"
	else
		bad "$1 without a GPU: status $rc, output: $out"
	fi
}
skips nccl_one "the device comm backends' unit test"
skips attention_tiles_gpu "the tiled attention's device test"
skips index_gpu "the permute and sum_to device test"
skips epilogue_gpu "the GEMM epilogue's device test"
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
cc -std=gnu11 -O1 -Iruntime/standalone -Iruntime/include "$tmp/c/prog.c" -o "$tmp/cpu_one" "$tmp/lib/libplanrt_local.a" \
	/usr/lib/x86_64-linux-gnu/libjansson.a -lpthread -lm || exit 1
if ldd "$tmp/cpu_one" | grep -q -E "libmpi|libopenblas"; then bad "the one-process CPU program links MPI or OpenBLAS"; else ok; fi
"$PLANC" build examples/mlp.plan --plan single -o "$tmp/cpu_mpi" || exit 1
env -u OMPI_COMM_WORLD_RANK "$tmp/cpu_one" --steps 5 --data data/corpus.txt --log "$tmp/one.jsonl" >/dev/null || bad "the one-process program failed"
"$tmp/cpu_mpi" --steps 5 --data data/corpus.txt --log "$tmp/mpi.jsonl" >/dev/null || bad "the MPI program failed"
if same_losses "$tmp/mpi.jsonl" "$tmp/one.jsonl" 5 "one process (no launcher) vs MPI + OpenBLAS"; then ok; else bad "one process vs MPI"; fi
# several ranks: the bundle's planrt-run and node-local MPI against Open MPI
"$PLANC" emit c examples/mlp.plan --plan dp2_tp2_zero2 -o "$tmp/c4" || exit 1
cc -std=gnu11 -O1 -Iruntime/standalone -Iruntime/include "$tmp/c4/prog.c" -o "$tmp/cpu_local4" "$tmp/lib/libplanrt_local.a" \
	/usr/lib/x86_64-linux-gnu/libjansson.a -lpthread -lm || exit 1
"$PLANC" build examples/mlp.plan --plan dp2_tp2_zero2 -o "$tmp/cpu_mpi4" || exit 1
PLANRT_WATCHDOG=60 "$tmp/lib/planrt-run" -n 4 "$tmp/cpu_local4" --steps 5 --data data/corpus.txt --log "$tmp/local4.jsonl" \
	>/dev/null </dev/null || bad "the node-local program under planrt-run -n 4 failed"
mpirun -np 4 "$tmp/cpu_mpi4" --steps 5 --data data/corpus.txt --log "$tmp/mpi4.jsonl" >/dev/null </dev/null || bad "mpirun -np 4 failed"
if same_losses "$tmp/mpi4.jsonl" "$tmp/local4.jsonl" 5 "mlp dp2_tp2_zero2, 4 ranks, planrt-run vs mpirun"; then ok; else bad "planrt-run vs mpirun"; fi
finish "cuda one process"
