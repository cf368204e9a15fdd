#!/bin/sh
# Golden test of the C printer: the program planc emits for one small plan (examples/mlp.plan,
# plan dp2: data parallel with an overlapped gradient bucket) must equal tests/emit/mlp_dp2.c
# byte for byte, so that every change to what generated programs look like is reviewed.
# usage: tests/emit/run_emit_golden.sh PLANC [--update]   (from the repository root)
planc=$1
. "$(dirname "$0")/../lib/harness.sh"
"$planc" emit c examples/mlp.plan --plan dp2 -o "$tmp" || { echo "FAIL: planc emit c failed"; exit 1; }
if [ "$2" = --update ]; then
	cp "$tmp/prog.c" tests/emit/mlp_dp2.c
fi
if cmp -s "$tmp/prog.c" tests/emit/mlp_dp2.c; then
	ok "planc emit c examples/mlp.plan --plan dp2 is tests/emit/mlp_dp2.c"
else
	diff -u tests/emit/mlp_dp2.c "$tmp/prog.c" | head -40
	bad "planc emit c differs from tests/emit/mlp_dp2.c (rerun with --update after reviewing the diff)"
fi
finish "emit golden"
