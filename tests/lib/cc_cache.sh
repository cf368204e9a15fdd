#!/bin/sh
# cc_cache.sh: planc build's C compiler (PLANC_MPICC) for the test suite, with a cache of what it
# writes. Several tests build the same plan with the same flags (tests/equiv, check_memory, ops,
# torch_reference build the example plans with --native; llvm_diff, run_sync and check_offload
# some of the same plans for the baseline CPU), and compiling the generated C at -O3 is about a
# second, most of a small plan's build. An output is reused only when everything it is made of is
# the same: the compiler, every argument but the output path, the content of every input file
# named (prog.c or prog.o, libplanrt.a; a shared library's size and time), and the runtime
# headers prog.c includes.
# Anything else (no -o, or an argument naming a missing file) goes to the compiler unchanged.
# Environment: REAL_CC the compiler (planc's default, mpicc), PLANC_CC_CACHE the cache directory
# (under the build directory: ctest sets both, tests/tests.cmake). Each use appends "hit" or
# "miss" and the output's name to PLANC_CC_CACHE/stats (bench/suite_times.py counts them).
set -eu
out= prev= key="$REAL_CC"
for a in "$@"; do
	if [ "$prev" = -o ]; then
		out=$a
	elif [ "$a" != -o ]; then
		case "$a" in
		-I*) key="$key
$a $(cat "${a#-I}"/*.h | sha256sum)" ;;
		-*) key="$key
$a" ;;
		*.so | *.so.*) # a system library (no copy of it goes into the program): its name, size and time
			[ -f "$a" ] || exec "$REAL_CC" "$@"
			key="$key
$(ls -lL --time-style=full-iso "$a")" ;;
		*)
			[ -f "$a" ] || exec "$REAL_CC" "$@"
			key="$key
file $(sha256sum <"$a")" ;;
		esac
	fi
	prev=$a
done
[ -n "$out" ] || exec "$REAL_CC" "$@"
mkdir -p "$PLANC_CC_CACHE"
hash=$(printf '%s\n' "$key" | sha256sum | cut -c1-40)
cached=$PLANC_CC_CACHE/$hash
if [ -f "$cached" ]; then
	cp "$cached" "$out"
	echo "hit $out" >>"$PLANC_CC_CACHE/stats"
	exit 0
fi
"$REAL_CC" "$@"
cp "$out" "$cached.tmp.$$" && mv "$cached.tmp.$$" "$cached"
echo "miss $out" >>"$PLANC_CC_CACHE/stats"
