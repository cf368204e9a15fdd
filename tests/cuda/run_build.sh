#!/bin/bash
# run_build.sh: every plan of every example (examples/*.plan) builds for the CUDA target: planc build
# --target cuda, i.e. nvcc for sm_80 and sm_90 SASS and compute_80 PTX, linked with planrt_cuda,
# cuBLAS, NCCL and the static CUDA runtime. No program may link libcuda, and, started here without
# a GPU, a program must exit with status 1 and one line that says so. The plans the CUDA target
# cannot execute yet are listed below with the kernel they stop at: each must fail with that
# error, and a plan that fails otherwise (or a listed one that starts building) fails the test, so
# the list cannot grow or go stale silently.
#
# What is slow is fixed cost, so the work is shared; each check still covers every plan:
#   1. planc build runs for every plan (CUDA_BUILD_JOBS at a time, default 2) and compiles its host
#      code (cc_quick.sh: -O0, as the programs only run to refuse). Its nvcc and link commands are
#      kept, not run (nvcc_defer.sh, cc_quick.sh with PLAN_REC).
#   2. The distinct kernels.cu files (most plans of a model print the same fused loops) are
#      compiled in one nvcc run (kernels_batch.sh: nvcc's time is the CUDA headers, not the
#      kernels). When it fails, each file is compiled alone to name the plans it fails for.
#   3. Plans whose link commands, host state tables (one planrt_cu_host_state call each before
#      planrt_cuda_main, whose first step is the GPU check) and global definitions are the same are
#      one kind: what the linker and the loader do with them differs only in which symbols they
#      ask for. One plan of each kind is built for real: its kernels.cu compiled alone by nvcc, the
#      program linked, checked for libcuda (ldd) and planrt_cuda_main (nm), and started.
#   4. Every plan's symbols: each launcher prog.o calls is defined by its kernels.cu, prog.o calls
#      planrt_cuda_main, and every other symbol that prog.o or the kernels need is resolved by one
#      link, with the kind's command, of a program that refers to all of them (a symbol it cannot
#      resolve fails the plans that need it); that program must not link libcuda either.
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
mkdir -p "$tmp/store" "$tmp/kinds" "$tmp/batch"
export NVCC_STORE=$tmp/store REAL_NVCC=$NVCC PLANC_NVCC=$ROOT/tests/cuda/nvcc_defer.sh \
	PLANC_MPICC=$ROOT/tests/cuda/cc_quick.sh
start=$(date +%s)

# 1. one plan: planc build. Prints FAIL lines (or the refusal's PASS line); a plan that built is left
# in its directory for the steps below. What its object needs and defines, its kind and its link
# command are read for all plans at once after the builds (plans_pass.py index: one nm, no process
# start a plan).
one_plan() {
	local f=$1 p=$2 d="$tmp/p$3" want out rc secs t0
	mkdir -p "$d"
	want=
	[[ $UNSUPPORTED == *"$f $p:"* ]] && want=$(printf '%s\n' "$UNSUPPORTED" | grep -F "$f $p:" | sed 's/.*: //')
	t0=${EPOCHREALTIME/./}
	out=$(PLAN_REC=$d TMPDIR=$d "$PLANC" build --target cuda "$f" --plan "$p" -o "$d/prog" 2>&1)
	rc=$?
	t0=$((${EPOCHREALTIME/./} - t0 + 50000))
	secs=$((t0 / 1000000)).$((t0 % 1000000 / 100000))
	rm -f "$d/prog"
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
	if [ $rc != 0 ] || [ ! -f "$d/prog.o" ] || [ ! -f "$d/kernels.hash" ]; then
		echo "FAIL: $f $p does not build for cuda: $(echo "$out" | tail -5)"
		rm -rf "$d"
		return
	fi
	echo "$f $p" >"$d/plan"
	echo "$secs" >"$d/secs"
}
export -f one_plan
export PLANC UNSUPPORTED tmp
n=0
for f in examples/*.plan; do
	for p in $(grep -oE '^plan +[A-Za-z0-9_]+' "$f" | awk '{print $2}'); do
		n=$((n + 1))
		echo "$f $p $n"
	done
done | xargs -P "${CUDA_BUILD_JOBS:-2}" -L 1 bash -c 'one_plan "$@"' _ >"$tmp/results"
built=$(ls -d "$tmp"/p*/plan 2>/dev/null | sed 's|/plan$||')
PASS_PY=$ROOT/tests/cuda/plans_pass.py
python3 "$PASS_PY" index "$tmp" || echo "FAIL: plans_pass.py index failed" >>"$tmp/results"
t_build=$(date +%s)

# 2. every distinct kernels.cu in one nvcc run (a group per nvcc command: planc has one)
for s in "$tmp"/store/*/; do echo "$(sha256sum <"$s/nvcc.flags" | cut -c1-16) ${s%/}"; done >"$tmp/store_flags"
for flags in $(cut -d' ' -f1 "$tmp/store_flags" | sort -u); do
	group=$(awk -v f="$flags" '$1 == f { print $2 }' "$tmp/store_flags")
	mkdir -p "$tmp/batch/$flags"
	if ! tests/cuda/kernels_batch.sh "$tmp/batch/$flags" $group; then
		echo "the kernels of $(echo "$group" | wc -l) plans' kernels.cu failed in one nvcc run: each alone now"
		for s in $group; do
			mapfile -t fl <"$s/nvcc.flags"
			if "$NVCC" "${fl[@]}" -c "$s/kernels.cu" -o "$s/kernels.o" >"$s/nvcc.err" 2>&1; then
				nm -g --defined-only "$s/kernels.o" | sed -n 's/^[0-9a-f]* T \(loop[0-9]*_launch\)$/\1/p' | sort >"$s/launchers"
			else
				touch "$s/failed"
			fi
		done
	fi
done
t_nvcc=$(date +%s)

# what each plan's own files show: its kernels compile, define the launchers prog.o calls, and
# prog.o calls planrt_cuda_main (PLAN/own: why not)
python3 "$PASS_PY" own "$tmp" || echo "FAIL: plans_pass.py own failed" >>"$tmp/results"

# 3. one program of each kind, built for real and started. The plan chosen is one that passed the
# checks above whose kernels.cu the most kinds share (fewer nvcc runs).
awk '{ if (!seen[$1 " " $2]++) n[$2]++ } END { for (h in n) print n[h], h }' "$tmp/plans" | sort -rn >"$tmp/hash_rank"
for kind in $(awk '{print $1}' "$tmp/plans" | sort -u); do
	rep=$(awk -v k="$kind" 'NR == FNR { rank[$2] = NR; next } $1 == k { print rank[$2], $3 }' "$tmp/hash_rank" "$tmp/plans" |
		sort -n | head -1 | cut -d' ' -f2)
	k=$tmp/kinds/$kind
	mkdir -p "$k"
	echo "$rep" >"$k/rep"
	s=$tmp/store/$(cat "$rep/kernels.hash")
	[ -f "$s/failed" ] && { echo "the kernels of $(cat "$rep/plan") fail" >"$k/why"; continue; }
	if [ ! -f "$s/kernels.o" ]; then
		mapfile -t fl <"$s/nvcc.flags"
		"$NVCC" "${fl[@]}" -c "$s/kernels.cu" -o "$s/kernels.o" >"$s/nvcc.err" 2>&1 ||
			{ echo "nvcc of its kernels.cu alone: $(tail -3 "$s/nvcc.err" | tr '\n' ' ')" >"$k/why"; continue; }
	fi
	mapfile -t cmd < <(sed -e "s|^PROG_O\$|$rep/prog.o|" -e "s|^KERNELS_O\$|$s/kernels.o|" -e "s|^OUT\$|$k/prog|" "$rep/link.norm")
	if ! env -u PLAN_REC "${cmd[@]}" >"$k/link.err" 2>&1; then
		echo "the link: $(grep -m3 -E 'error|undefined' "$k/link.err" | tr '\n' ' ')" >"$k/why"; continue
	fi
	why=
	if ldd "$k/prog" | grep -q 'libcuda\.so'; then why="links libcuda"; fi
	if ! nm "$k/prog" | grep -q ' planrt_cuda_main$'; then why="$why${why:+; }no planrt_cuda_main in the program"; fi
	run=$("$k/prog" --steps 1 --data data/corpus.txt 2>&1)
	rrc=$?
	if [ -e /dev/nvidia0 ]; then
		: # a GPU is here: the program may run; the one-line refusal is for machines without one
	elif [ $rrc != 1 ] || [ "$(printf '%s\n' "$run" | wc -l)" != 1 ] || ! echo "$run" | grep -q "no CUDA GPU"; then
		why="$why${why:+; }without a GPU: status $rrc, output: $(echo "$run" | head -3)"
	fi
	[ -n "$why" ] && echo "$why" >"$k/why"
done
t_kinds=$(date +%s)

# 4. the symbols of every plan: one link per link command of a program that refers to every symbol
# the plans' objects and the kernels need (but the launchers, which kernels.cu defines)
cat "$tmp"/batch/*/batch.syms 2>/dev/null | awk '{print $NF}' | sort -u >"$tmp/batch_defined"
for line in $(cat "$tmp"/p*/linkline 2>/dev/null | sort -u); do
	u=$tmp/union_$line
	{
		cat "$u/needs"
		for b in "$tmp"/batch/*/batch.o; do [ -f "$b" ] && nm -u "$b" | awk '{print $2}'; done
	} | sort -u | grep -vxF -f "$tmp/batch_defined" >"$u/symbols"
	{
		echo "/* every symbol the plans' programs need (tests/cuda/run_build.sh) */"
		sed 's/.*/extern char &;/' "$u/symbols"
		echo "void *const planc_refs[] = {"
		sed 's/.*/\t\&&,/' "$u/symbols"
		echo "};"
		echo "int main(void) { return planc_refs[0] == 0; }"
	} >"$u/refs.c"
	rep=$(head -1 "$u/plans")
	mapfile -t cmd < <(sed -e "s|^PROG_O\$|$u/refs.o|" -e "/^KERNELS_O\$/d" -e "s|^OUT\$|$u/prog|" "$rep/link.norm")
	if ! cc -fPIC -c -w "$u/refs.c" -o "$u/refs.o" 2>"$u/err" || ! env -u PLAN_REC "${cmd[@]}" >"$u/err" 2>&1; then
		touch "$u/failed"
	elif ldd "$u/prog" | grep -q 'libcuda\.so'; then
		echo "links libcuda" >"$u/why"
	fi
done

# the verdict of each plan
python3 "$PASS_PY" verdict "$tmp" >>"$tmp/results" || echo "FAIL: plans_pass.py verdict failed" >>"$tmp/results"
cat "$tmp/results"
pass=$(grep -c '^PASS:' "$tmp/results")
fail=$(grep -c '^FAIL:' "$tmp/results")
refused=$(grep -c '^PASS: refused' "$tmp/results")
echo "$((pass - refused)) plans built for cuda, $refused refused as listed; $(ls -d "$tmp"/store/*/ | wc -l) distinct kernels.cu in one nvcc run," \
	"$(ls "$tmp"/store/*/kernels.o 2>/dev/null | wc -l) alone; $(ls "$tmp/kinds" | wc -l) kinds linked and started;" \
	"planc build $((t_build - start)) s, nvcc $((t_nvcc - t_build)) s, kinds $((t_kinds - t_nvcc)) s, all $(($(date +%s) - start)) s"
finish "cuda build"
