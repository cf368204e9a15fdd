#!/bin/sh
# nvcc_defer.sh: planc build's nvcc (PLANC_NVCC) for tests/cuda/run_build.sh, which compiles the
# kernels of all plans after they are built. nvcc's time is almost all fixed cost (its host and
# device front ends parse the CUDA headers: 3.4 of a plan's 3.8 CPU s), so run_build.sh compiles
# every distinct kernels.cu in one nvcc run (kernels_batch.sh) and each program it starts alone.
# This wrapper keeps what planc build asked for: the plan's kernels.cu and loops.h in
# NVCC_STORE/HASH/ (HASH: the flags, paths left out, and both files without their first comment,
# which names the plan) with nvcc's flags (nvcc.flags, one a line, -c and -o and their files left
# out), and the hash in PLAN_REC/kernels.hash. It writes no object: the link that would
# read it is kept by cc_quick.sh and done, or checked, by run_build.sh. A call that is not a
# compile of one kernels.cu goes to REAL_NVCC unchanged.
set -eu
src= out= flags=
prev=
for a in "$@"; do
	case "$prev" in -o) out=$a ;; -c) src=$a ;; *) case "$a" in -o | -c) ;; *) flags="$flags$a
" ;; esac ;; esac
	prev=$a
done
if [ -z "$src" ] || [ -z "$out" ] || [ -z "${PLAN_REC:-}" ]; then
	exec "$REAL_NVCC" "$@"
fi
dir=$(dirname "$src")
hash=$( (printf '%s' "$flags"; sed "1,/\*\//d" "$src"; sed "1,/\*\//d" "$dir/loops.h") | sha256sum | cut -c1-32)
if [ ! -d "$NVCC_STORE/$hash" ]; then # the first plan with these kernels stores them
	mkdir "$NVCC_STORE/$hash.$$"
	cp "$src" "$dir/loops.h" "$NVCC_STORE/$hash.$$/"
	printf '%s' "$flags" >"$NVCC_STORE/$hash.$$/nvcc.flags"
	mv -T "$NVCC_STORE/$hash.$$" "$NVCC_STORE/$hash" 2>/dev/null || rm -rf "$NVCC_STORE/$hash.$$"
fi
echo "$hash" >"$PLAN_REC/kernels.hash"
