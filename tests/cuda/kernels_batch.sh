#!/bin/bash
# kernels_batch.sh: compiles the kernels.cu files nvcc_defer.sh kept (NVCC_STORE/HASH/, all with
# the same nvcc flags) in one nvcc run, for tests/cuda/run_build.sh. nvcc's cost is nearly all
# fixed (its front ends parse the CUDA headers: 3.4 of a plan's 3.8 CPU s), so one translation unit
# that includes every file is a little more than one file: each file's own code (its fused loops,
# kernels and launchers, and loops.h) goes through the same front ends, cicc and both ptxas runs
# (sm_80, sm_90) and into the PTX, as it would alone. So that the files cannot clash, each is
# included inside `namespace kHASH` with its launchers (extern "C", so outside any namespace's
# reach) renamed kHASH_loopN_launch by macros around the #include, and loops.h's guard undefined
# first; the headers both files include come first, once (each has its guard, so the files' own
# #includes of them are empty). The files' text is not changed.
#   kernels_batch.sh OUT_DIR HASH_DIR...
# writes OUT_DIR/batch.cu and batch.o, and HASH_DIR/launchers (the launchers the file defines, as
# nm reads them from batch.o); exits 1 when nvcc fails, with its output in OUT_DIR/batch.err.
set -u
out=$1
shift
mapfile -t flags <"$1/nvcc.flags"
{
	echo "/* every kernels.cu of tests/cuda/run_build.sh, each in a namespace of its own (kernels_batch.sh) */"
	echo "#include <stdint.h>"
	echo "#include <string.h>"
	echo "#include <math.h>"
	echo "#include \"planrt_math.h\""
	echo "#include \"planrt_sync_math.h\""
	echo "#include \"planrt_cuda.h\""
	for d in "$@"; do
		h=k$(basename "$d")
		names=$(grep -oE '\bloop[0-9]+_launch\b' "$d/kernels.cu" | sort -u)
		echo "#undef PLANC_LOOPS_H"
		for n in $names; do echo "#define $n ${h}_$n"; done
		echo "namespace $h {"
		echo "#include \"$d/kernels.cu\""
		echo "}"
		for n in $names; do echo "#undef $n"; done
	done
} >"$out/batch.cu"
if ! "$REAL_NVCC" "${flags[@]}" -c "$out/batch.cu" -o "$out/batch.o" >"$out/batch.err" 2>&1; then
	exit 1
fi
nm -g --defined-only "$out/batch.o" >"$out/batch.syms"
for d in "$@"; do
	h=k$(basename "$d")
	sed -n "s/^[0-9a-f]* T ${h}_\(loop[0-9]*_launch\)\$/\1/p" "$out/batch.syms" | sort >"$d/launchers"
done
