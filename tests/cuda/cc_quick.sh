#!/bin/sh
# cc_quick.sh: the C compiler for tests/cuda/run_build.sh (PLANC_MPICC): planc build's command with
# -O1 made -O0. The test builds every example plan (the 7B and 175B models' prog.c are 1-7 MB of C)
# and runs programs only to see them refuse without a GPU, so optimising the host code would only
# cost CI time; REAL_CC is the compiler planc build uses (Open MPI's mpicc). A prog.c over 1 MB is
# compiled by clang (OMPI_CC=clang-14: 2.7 s against gcc's 6.2 s for a 7 MB one), a smaller one by
# gcc (a third less CPU there: clang's start alone is 0.17 s against 0.07).
# With PLAN_REC set, a link (a command without -c) is not run: its command goes to PLAN_REC/link
# (this script, then the arguments, one a line), the host object to PLAN_REC/prog.o, and the
# output is left empty; run_build.sh links one program of each kind and checks the others' objects
# against the same libraries.
compile=0 src=
for a in "$@"; do
	case "$a" in -c) compile=1 ;; *.c) src=$a ;; esac
done
if [ $compile = 0 ] && [ -n "${PLAN_REC:-}" ]; then
	printf '%s\n' "$0" >"$PLAN_REC/link"
	prev=
	for a in "$@"; do
		case "$a" in */prog.o) cp "$a" "$PLAN_REC/prog.o" ;; esac
		printf '%s\n' "$a" >>"$PLAN_REC/link"
		if [ "$prev" = -o ]; then : >"$a"; fi
		prev=$a
	done
	exit 0
fi
if [ -n "$src" ] && [ "$(stat -c %s "$src")" -gt 1000000 ] && command -v clang-14 >/dev/null 2>&1; then
	export OMPI_CC=clang-14
fi
for a in "$@"; do
	shift
	if [ "$a" = "-O1" ]; then set -- "$@" -O0; else set -- "$@" "$a"; fi
done
exec "$REAL_CC" "$@"
