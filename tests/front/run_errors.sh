#!/bin/sh
# run_errors.sh: the diagnostic golden tests (cproc's runtests, Halide's test/error).
#
#   tests/front/run_errors.sh [--update] PLANC_BINARY
#
# For every tests/front/errors/NAME.plan, runs `PLANC_BINARY check tests/front/errors/NAME.plan` from the
# repository root and requires exit status 1 and stderr byte-for-byte equal to NAME.expected.
# Prints PASS or FAIL per file (with a diff on failure) and a last line `N passed, N failed`;
# exits 1 if any test failed. With --update, rewrites each .expected from what planc printed
# when it exited with status 1 (review the diff before committing it).
#
# The standard library is taken from the relative path `stdlib`, so a diagnostic that points
# into it reads `stdlib/nn.plan:...` on every machine.
set -u

update=0
if [ "${1:-}" = "--update" ]; then
	update=1
	shift
fi
if [ $# -ne 1 ]; then
	echo "usage: tests/front/run_errors.sh [--update] PLANC_BINARY" >&2
	exit 2
fi

root=$(cd "$(dirname "$0")/../.." && pwd)
case $1 in
/*) planc=$1 ;;
*) planc=$(pwd)/$1 ;;
esac
if [ ! -x "$planc" ]; then
	echo "run_errors.sh: '$1' is not an executable planc" >&2
	exit 2
fi

. "$root/tests/lib/harness.sh"
cd "$root" || exit 2

for plan in tests/front/errors/*.plan; do
	[ -e "$plan" ] || continue
	name=${plan%.plan}
	expected=$name.expected
	PLANC_STDLIB=stdlib "$planc" check "$plan" >"$tmp/stdout" 2>"$tmp/stderr"
	status=$?
	if [ "$update" = 1 ] && [ "$status" -eq 1 ]; then
		cp "$tmp/stderr" "$expected"
	fi
	why=
	if [ "$status" -ne 1 ]; then
		why="exit status $status, expected 1"
	elif [ ! -f "$expected" ]; then
		why="no $expected (create it with --update and review it)"
	elif ! cmp -s "$tmp/stderr" "$expected"; then
		why="diagnostics differ from $expected"
	fi
	if [ -z "$why" ]; then
		ok "$plan"
	else
		bad "$plan: $why"
		if [ -f "$expected" ]; then
			diff -u "$expected" "$tmp/stderr" | sed 's/^/    /'
		else
			sed 's/^/    /' "$tmp/stderr"
		fi
	fi
done
finish errors
