#!/bin/sh
# run_fmt_golden.sh PLANC: `planc fmt` of each tests/front/fmt/NAME.plan must equal NAME.expected (the
# canonical layout's decisions that a round trip cannot see, e.g. wrapping a long `use`).
planc=$1
pass=0
fail=0
for f in tests/front/fmt/*.plan; do
	if "$planc" fmt "$f" | cmp -s - "${f%.plan}.expected"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL: $f"
		"$planc" fmt "$f" | diff -u "${f%.plan}.expected" - | head -20
	fi
done
echo "fmt golden: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
