#!/bin/sh
# nvcc_cache.sh: nvcc with a cache of objects, for tests/cuda/run_build.sh (PLANC_NVCC). planc build
# --target cuda compiles each plan's kernels.cu; the example plans of one model mostly print the same
# fused loops, so the object of an identical kernels.cu + loops.h under identical flags is reused.
# The key is the flags (paths left out) and both files' text; anything else goes to nvcc unchanged.
# NVCC_CACHE_DIR holds the objects, REAL_NVCC is nvcc.
set -eu
src= out= key=
prev=
for a in "$@"; do
	case "$prev" in -o) out=$a ;; -c) src=$a ;; *) case "$a" in -o | -c) ;; *) key="$key $a" ;; esac ;; esac
	prev=$a
done
if [ -z "$src" ] || [ -z "$out" ]; then
	exec "$REAL_NVCC" "$@"
fi
# the files without their first comment (it names the plan)
hash=$( (echo "$key"; sed "1,/\*\//d" "$src"; sed "1,/\*\//d" "$(dirname "$src")/loops.h") | sha256sum | cut -c1-32)
if [ -f "$NVCC_CACHE_DIR/$hash.o" ]; then
	cp "$NVCC_CACHE_DIR/$hash.o" "$out"
	echo hit >> "$NVCC_CACHE_DIR/stats"
	exit 0
fi
"$REAL_NVCC" "$@"
cp "$out" "$NVCC_CACHE_DIR/$hash.o.tmp.$$" && mv "$NVCC_CACHE_DIR/$hash.o.tmp.$$" "$NVCC_CACHE_DIR/$hash.o"
echo miss >> "$NVCC_CACHE_DIR/stats"
