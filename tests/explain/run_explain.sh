#!/bin/sh
# Golden tests for `planc explain`: every plan of every example (or of the examples named), text
# and JSON, against tests/explain/golden/FILE.PLAN.{txt,json}. Run from the repository root.
# ctest runs it twice: the small examples in the quick tier, gpt7b and gpt175b (most of the
# time: their 36 and 96 layers) in the slow one.
# usage: tests/explain/run_explain.sh PLANC [--update] [examples/NAME.plan...]
planc=$1
shift
update=
if [ "$1" = --update ]; then
	update=--update
	shift
fi
[ $# -gt 0 ] || set -- examples/*.plan
. "$(dirname "$0")/../lib/harness.sh"
dir=tests/explain/golden
mkdir -p "$dir"
for file in "$@"; do
	base=$(basename "$file" .plan)
	for plan in $(sed -n 's/^plan \([A-Za-z0-9_]*\) .*/\1/p' "$file"); do
		for kind in txt json; do
			want="$dir/$base.$plan.$kind"
			got=$tmp/got
			if [ "$kind" = json ]; then
				"$planc" explain "$file" --plan "$plan" --json >"$got" 2>&1
			else
				"$planc" explain "$file" --plan "$plan" >"$got" 2>&1
			fi
			rc=$?
			if [ "$update" = --update ]; then
				cp "$got" "$want"
			fi
			if [ $rc -eq 0 ] && [ -f "$want" ] && cmp -s "$got" "$want"; then
				ok
			else
				bad "$file --plan $plan ($kind, exit $rc)"
				[ -f "$want" ] && diff "$want" "$got" | head -20
			fi
		done
	done
done
finish "explain goldens"
