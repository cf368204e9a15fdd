#!/bin/sh
# Benchmark (figures, not a test): wall time of `planc check` and `planc explain` on the
# 96-layer, 175B-parameter GPT-3 plan with t = 8, p = 8 (examples/gpt175b.plan), the whole process
# each time (load, parse, sema, every pass, the collective check over all 64 ranks, the report).
# Target: well under 100 ms. usage: bench/explain_175b.sh [PLANC] [RUNS]
planc=${1:-build/planc}
runs=${2:-20}
file=examples/gpt175b.plan
for plan in t8_p8 t8_p8_interleaved t8_p8_dp16; do
	for cmd in check explain; do
		times=""
		i=0
		while [ $i -lt "$runs" ]; do
			start=$(date +%s%N)
			"$planc" $cmd $file --plan $plan >/dev/null || exit 1
			end=$(date +%s%N)
			times="$times $(((end - start) / 1000))"
			i=$((i + 1))
		done
		echo "$times" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk -v name="$cmd $plan" -v runs="$runs" '
			{ t[NR] = $1 }
			END { printf "%-32s runs %3d   min %7.1f ms   median %7.1f ms   max %7.1f ms\n",
			      name, runs, t[1] / 1000, t[int((NR + 1) / 2)] / 1000, t[NR] / 1000 }'
	done
done
"$planc" explain $file --plan t8_p8 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("model: %.1fB parameters, %d ranks, pipeline bubble %.3f" % (d["parameters"] / 1e9, d["world"], d["pipeline"]["bubble_fraction"]))'
