#!/bin/bash
# run_build.sh: every plan of every example (examples/*.plan) builds for the CUDA target: planc build
# --target cuda, i.e. nvcc for sm_80 and sm_90 SASS and compute_80 PTX, linked with planrt_cuda,
# cuBLAS, NCCL and the static CUDA runtime. Each program must not link libcuda, and, started here
# without a GPU, must exit with status 1 and one line that says so (started once per kind of start:
# one_plan says why). The plans the CUDA target
# cannot execute yet are listed below with the kernel they stop at: each must fail with that
# error, and a plan that fails otherwise (or a listed one that starts building) fails the test, so
# the list cannot grow or go stale silently. Identical kernels.cu files (most plans of a model) are
# compiled once (nvcc_cache.sh); CUDA_BUILD_JOBS plans (default 2) build at a time.
# The host code is compiled at -O0 (cc_quick.sh): the programs only run to refuse.
#   run_build.sh PLANC NVCC CC   (CC: planc build's C compiler; exit 77, skipped, without the CUDA target)
set -u
PLANC=$1
NVCC=$2
export REAL_CC=$3
ROOT=$(pwd)
if ! "$PLANC" build --help 2>&1 | grep -q "target=cpu|cuda" || [ ! -x "$NVCC" ]; then
	echo "skip: no nvcc"; exit 77
fi
# "file plan: the kernel it stops at" (the reason: planrt_cuda has no device version of it yet)
UNSUPPORTED="
"
. "$(dirname "$0")/../lib/harness.sh"
mkdir -p "$tmp/cache" "$tmp/started"
export NVCC_CACHE_DIR=$tmp/cache REAL_NVCC=$NVCC PLANC_NVCC=$ROOT/tests/cuda/nvcc_cache.sh \
	PLANC_MPICC=$ROOT/tests/cuda/cc_quick.sh
# the host code only runs to refuse: clang compiles the 7B and 175B models' 7-10 MB prog.c at -O0
# in less than half gcc's time (2.7 s against 6.2 s), through Open MPI's mpicc
if command -v clang-14 >/dev/null 2>&1; then
	export OMPI_CC=clang-14
fi
start=$(date +%s)
# one plan: prints "PASS: ..." (built, or refused as listed) or "FAIL: ..." lines
one_plan() {
	local f=$1 p=$2 d="$tmp/$3" want out rc run rrc secs t0 why
	mkdir -p "$d"
	want=$(printf '%s\n' "$UNSUPPORTED" | grep -F "$f $p:" | sed 's/.*: //')
	t0=$(date +%s.%N)
	out=$(TMPDIR=$d "$PLANC" build --target cuda "$f" --plan "$p" -o "$d/prog" 2>&1)
	rc=$?
	secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
	if [ -n "$want" ]; then
		if [ $rc = 0 ]; then
			echo "FAIL: $f $p builds for cuda now: take it off the list in tests/cuda/run_build.sh"
		elif echo "$out" | grep -q "error: planc build --target cuda cannot execute kernel '$want' yet"; then
			echo "PASS: refused as listed: $f $p ($want)"
		else
			echo "FAIL: $f $p: expected the error naming '$want', got: $(echo "$out" | head -3)"
		fi
		rm -rf "$d"
		return
	fi
	if [ $rc != 0 ]; then
		echo "FAIL: $f $p does not build for cuda: $(echo "$out" | tail -5)"
		rm -rf "$d"
		return
	fi
	why=
	if ldd "$d/prog" | grep -q 'libcuda\.so'; then why="links libcuda"; fi
	if ! nm "$d/prog" | grep -q ' planrt_cuda_main$'; then why="$why${why:+; }no planrt_cuda_main in the program"; fi
	# The refusal without a GPU: what runs before it is the same in every program with the same
	# libraries (the loader, their constructors: 0.6 s of CPU, cuBLAS's) and the same number of host
	# state tables (main and cuda_main are fixed text of the CUDA printer: one planrt_cu_host_state
	# per table, then planrt_cuda_main, whose first step is the GPU check). So the first program of
	# each such kind is started, and each other plan names the plan whose start covers it.
	local kind started
	kind=$( (readelf -d "$d/prog" | grep -E 'NEEDED|RUNPATH|RPATH' | sed 's/.*(//'; nm "$d/prog" | grep -cE ' [rRdD] [A-Za-z0-9_]*host_state$') |
		sha256sum | cut -c1-16)
	if mkdir "$tmp/started/$kind" 2>/dev/null; then
		echo "$f $p" >"$tmp/started/$kind/plan"
		run=$("$d/prog" --steps 1 --data data/corpus.txt 2>&1)
		rrc=$?
		if [ -e /dev/nvidia0 ]; then
			: # a GPU is here: the program may run; the one-line refusal is for machines without one
		elif [ $rrc != 1 ] || [ "$(printf '%s\n' "$run" | wc -l)" != 1 ] || ! echo "$run" | grep -q "no CUDA GPU"; then
			why="$why${why:+; }without a GPU: status $rrc, output: $(echo "$run" | head -3)"
		fi
		started="started: refuses"
	else
		started="its start is the one of $(cat "$tmp/started/$kind/plan" 2>/dev/null || echo "a plan beside it")"
	fi
	if [ -n "$why" ]; then echo "FAIL: $f $p: $why"; else echo "PASS: $f $p ($secs s; $started)"; fi
	rm -rf "$d"
}
export -f one_plan
export PLANC UNSUPPORTED tmp
n=0
for f in examples/*.plan; do
	for p in $(grep -oE '^plan +[A-Za-z0-9_]+' "$f" | awk '{print $2}'); do
		n=$((n + 1))
		echo "$f $p $n"
	done
done | xargs -P "${CUDA_BUILD_JOBS:-2}" -L 1 bash -c 'one_plan "$@"' _ > "$tmp/results"
cat "$tmp/results"
pass=$(grep -c '^PASS:' "$tmp/results")
fail=$(grep -c '^FAIL:' "$tmp/results")
refused=$(grep -c '^PASS: refused' "$tmp/results")
echo "$((pass - refused)) plans built for cuda, $refused refused as listed; nvcc: $(grep -c miss "$tmp/cache/stats" 2>/dev/null || echo 0) compiled, $(grep -c hit "$tmp/cache/stats" 2>/dev/null || echo 0) reused; $(( $(date +%s) - start )) s"
finish "cuda build"
