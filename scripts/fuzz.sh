#!/bin/sh
# fuzz.sh: the libFuzzer harnesses of tests/fuzz, each for its share of SECONDS (default
# $PLANC_FUZZ_SECONDS, else 60), the compiler's from a corpus of tests/fuzz/corpus (regression
# inputs of every bug the fuzzers found), examples/, stdlib/ and tests/front/errors/, the
# readers of the files users hand planc (fuzz_inputs) from tests/fuzz/inputs. Prints, per harness, the
# executions, the executions per second (of wall time, and of the CPU time it got: this machine is
# shared), the corpus it grew and the share of its inputs that parse; with --coverage, also the
# share of compiler/'s lines and functions the corpus reached (the compiler's harnesses; a build with
# clang's coverage instrumentation runs every corpus input once; llvm-cov reports). A crash, a
# sanitizer report, a leak or an input slower than 10 s fails it, with the input kept in
# the build directory's artifacts/ and the report's tail printed.
#   usage: scripts/fuzz.sh [SECONDS] [--coverage]     (FUZZ_BUILD: the build directory, build-fuzz)
set -e
cd "$(dirname "$0")/.."
B=${FUZZ_BUILD:-build-fuzz}
seconds=${1:-${PLANC_FUZZ_SECONDS:-60}}
coverage=0
[ "${2:-}" = --coverage ] && coverage=1
harnesses="frontend check explain emit inputs"
jobs=$(nproc)
# configured once (ctest's fuzz_build did it for the fuzz test): the build below reconfigures by
# itself when a CMakeLists.txt changed
[ -f "$B/CMakeCache.txt" ] ||
	cmake -S . -B "$B" -DCMAKE_C_COMPILER=clang-14 -DPLANC_FUZZ=ON -DPLANC_WERROR=ON -DPLANC_CUDA=OFF >/dev/null
targets="fuzz_frontend fuzz_compile fuzz_inputs" # fuzz_check, fuzz_explain and fuzz_emit are links to fuzz_compile
[ $coverage = 1 ] && targets="$targets fuzz_cov_frontend fuzz_cov_compile"
# shellcheck disable=SC2086
cmake --build "$B" --target $targets -j"$jobs" >/dev/null

seeds=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$seeds" "$work"' EXIT
cp tests/fuzz/corpus/* "$seeds"/
for f in examples/*.plan stdlib/*.plan; do cp "$f" "$seeds/seed_$(basename "$f")"; done
for f in tests/front/errors/*.plan; do cp "$f" "$seeds/error_$(basename "$f")"; done
mkdir -p "$B/artifacts"
# the frontend is fast and shallow: a sixth of the time, and the runtime's readers a sixth; the
# three compiler harnesses share the rest
share_front=$((seconds / 6 > 0 ? seconds / 6 : 1))
share=$(((seconds - 2 * share_front) / 3 > 0 ? (seconds - 2 * share_front) / 3 : 1))
failed=0
for h in $harnesses; do
	t=$share
	from=$seeds
	[ "$h" = frontend ] && t=$share_front
	[ "$h" = inputs ] && t=$share_front && from=tests/fuzz/inputs
	mkdir -p "$work/$h"
	log="$B"/fuzz_$h.log
	if ! ASAN_OPTIONS=detect_leaks=1 /usr/bin/time -f "%U %S" -o "$work/$h.cpu" "$B"/tests/fuzz/fuzz_$h \
		-max_total_time="$t" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
		-artifact_prefix="$B"/artifacts/ "$work/$h" "$from" >"$log" 2>&1; then
		tail -40 "$log"
		echo "fuzz_$h: FAILED (the input is in $B/artifacts/)"
		failed=$((failed + 1))
		continue
	fi
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
	parsed=$(sed -n 's/^fuzz: inputs that parse: //p' "$log" | tail -1)
	cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$work/$h.cpu")
	per_cpu=$(awk -v n="$runs" '{ printf "%.0f", n / ($1 + $2 > 0 ? $1 + $2 : 1) }' "$work/$h.cpu")
	echo "fuzz_$h: $runs executions in ${t}s ($rate/s; $per_cpu per CPU second, $cpu CPU s), corpus $(ls "$work/$h" | wc -l) new inputs, ${parsed:-?} of the inputs parse"
	if [ $coverage = 1 ] && [ "$h" != inputs ]; then
		rm -f "$work"/*.profraw
		LLVM_PROFILE_FILE="$work/cov-%p.profraw" "$B"/tests/fuzz/fuzz_cov_$h -runs=0 "$work/$h" "$seeds" >/dev/null 2>&1 || true
		llvm-profdata-14 merge -sparse "$work"/*.profraw -o "$work/$h.profdata"
		llvm-cov-14 report "$B"/tests/fuzz/fuzz_cov_$h -instr-profile="$work/$h.profdata" \
			"$PWD/compiler" >"$work/$h.cov" 2>/dev/null
		awk -v h="$h" '/^TOTAL/ { printf "fuzz_%s coverage of the compiler/ files it links: lines %s of %s, functions %s of %s, regions %s\n", h, $10, $8, $7, $5, $4 }' \
			"$work/$h.cov"
	fi
done
[ $failed = 0 ] && echo "fuzz: $(echo $harnesses | wc -w) passed, 0 failed" && exit 0
echo "fuzz: $(($(echo $harnesses | wc -w) - failed)) passed, $failed failed"
exit 1
