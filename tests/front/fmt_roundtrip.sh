#!/bin/sh
# fmt_roundtrip.sh PLANC FILE...: for each file, `planc fmt` must succeed, its output must parse
# (formatting it again succeeds) and formatting must be a fixed point (the second output is the
# first). Prints PASS/FAIL per file and a tally; exits non-zero on any failure.
if [ $# -lt 1 ]; then
	echo "usage: $0 PLANC FILE..." >&2
	exit 2
fi
planc=$1
shift
. "$(dirname "$0")/../lib/harness.sh"
for f in "$@"; do
	why=
	if ! "$planc" fmt "$f" >"$tmp/once.plan" 2>"$tmp/err"; then
		why="planc fmt failed: $(head -n 1 "$tmp/err")"
	elif ! "$planc" fmt "$tmp/once.plan" >"$tmp/twice.plan" 2>"$tmp/err"; then
		why="formatted text does not parse: $(head -n 1 "$tmp/err")"
	elif ! cmp -s "$tmp/once.plan" "$tmp/twice.plan"; then
		why="not idempotent: $(diff "$tmp/once.plan" "$tmp/twice.plan" | head -n 3 | tr '\n' ' ')"
	fi
	if [ -z "$why" ]; then
		ok "$f"
	else
		bad "$f: $why"
	fi
done
finish "fmt round trip"
