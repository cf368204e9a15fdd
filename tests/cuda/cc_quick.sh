#!/bin/sh
# cc_quick.sh: the C compiler for tests/cuda/run_build.sh (PLANC_MPICC): planc build's command with
# -O1 made -O0. The test builds every example plan (the 7B and 175B models' prog.c are 7 MB of C)
# and runs each program only to see it refuse without a GPU, so optimising the host code would only
# cost CI time; REAL_CC is the compiler planc build uses.
for a in "$@"; do
	shift
	if [ "$a" = "-O1" ]; then set -- "$@" -O0; else set -- "$@" "$a"; fi
done
exec "$REAL_CC" "$@"
