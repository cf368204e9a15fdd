#!/bin/sh
# planrt_main from the outside (test_program.c's scenarios under mpirun -np 2): --help without
# mpirun, every argument error as one line on a non-zero exit, unusable --save / --log paths
# refused before training without leaving a file, a failing save on one rank ending every rank
# with no partial file, --log lines, the --init / --save round trip, and the PLANRT_REPORT_* lines.
# usage: tests/runtime/test_program.sh TEST_PROGRAM DATA
bin=$1
data=$2
. "$(dirname "$0")/../lib/harness.sh"
PROG=$bin # (expect_fail's program)

# bad WHAT with the output of the run that failed
bad_run() { bad "$@"; show_output; }

# expect_ok NAME ARGS...: mpirun -np 2 succeeds (the scenario's own checks pass on every rank)
expect_ok() {
	name=$1
	shift
	timeout 60 mpirun -np 2 "$bin" "$@" >"$tmp/out" 2>&1
	rc=$?
	if [ $rc -eq 0 ] && [ "$(grep -c ': ok$' "$tmp/out")" -eq 2 ]; then ok; else bad_run "$name (exit $rc)"; fi
}

no_leftovers() { # NAME DIR: nothing but what was there before (*.tmp*, probes)
	if ls "$2" | grep -q 'tmp'; then bad "$1: left $(ls "$2" | tr '\n' ' ')"; else ok; fi
}

# --help: a single process without mpirun, stdout, exit 0
timeout 30 "$bin" pipe --help >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && grep -q 'plan pipe2 of model toy' "$tmp/out" && grep -q 'mesh: pipe = 2; world 2 ranks' "$tmp/out" &&
	grep -q -- '--steps K' "$tmp/out" && [ ! -s "$tmp/err" ]; then ok; else bad_run "--help (exit $rc)"; cat "$tmp/err"; fi
timeout 30 "$bin" zero --bogus -h >"$tmp/out" 2>&1
if [ $? -eq 0 ] && grep -q 'mesh: data = 2' "$tmp/out"; then ok; else bad_run "-h after an unknown option"; fi

# argument errors: one line each
expect_fail "world size" "this program was built for 2 ranks (plan pipe2) but runs on 1; launch it with mpirun -np 2" 1 pipe --steps 1 --data "$data"
expect_fail "world size (3)" "built for 2 ranks (plan pipe2) but runs on 3" 3 pipe --steps 1 --data "$data"
expect_fail "missing --steps" "--steps and --data are required" 2 pipe --data "$data"
expect_fail "missing --data" "--steps and --data are required" 2 pipe --steps 1
expect_fail "bad --steps" "--steps needs a non-negative integer, not ten" 2 pipe --steps ten --data "$data"
expect_fail "negative --steps" "--steps needs a non-negative integer, not -3" 2 pipe --steps -3 --data "$data"
expect_fail "negative --seed" "--seed needs an unsigned integer (0 to 18446744073709551615), not -1" 2 pipe --steps 1 --data "$data" --seed -1
expect_fail "bad --seed" "--seed needs an unsigned integer.*not 12abc" 2 pipe --steps 1 --data "$data" --seed 12abc
expect_fail "huge --seed" "--seed needs an unsigned integer.*not 18446744073709551616" 2 pipe --steps 1 --data "$data" --seed 18446744073709551616
expect_fail "unknown option" "unknown option --lr" 2 pipe --steps 1 --data "$data" --lr 3
# the cause, the usage and the pointer to --help on one line
if grep 'unknown option --lr' "$tmp/out" | grep -q '^planrt: rank [01]: unknown option --lr; usage: .* --steps K --data FILE .*(--help explains)$'; then ok; else bad_run "usage error line"; fi
expect_fail "missing value at the end" "missing value after --data" 2 pipe --steps 1 --data
expect_fail "option as a value" "missing value after --save" 2 pipe --steps 1 --save --log x --data "$data"
expect_fail "missing data" "no/such/file" 2 pipe --steps 1 --data no/such/file

# paths that cannot be written: refused before training, nothing left behind
mkdir "$tmp/w"
expect_fail "--save in a missing directory" "no/such/dir" 2 pipe --steps 1 --data "$data" --save "$tmp/w/no/such/dir/out.safetensors"
expect_fail "--save is a directory" "is a directory" 2 pipe --steps 1 --data "$data" --save "$tmp/w"
expect_fail "--log in a missing directory" "no/such/log.jsonl" 2 pipe --steps 1 --data "$data" --log "$tmp/w/no/such/log.jsonl"
if [ -e "$tmp/w/no" ]; then bad "a directory was created"; else ok; fi
no_leftovers "unwritable paths" "$tmp/w"

# a save that fails on one rank: every rank ends, no file, no temporary file
expect_fail "failing save" "saved from dtype" 2 badsave --steps 1 --data "$data" --save "$tmp/w/bad.safetensors"
if [ -e "$tmp/w/bad.safetensors" ]; then bad "the failed checkpoint exists"; else ok; fi
no_leftovers "failing save" "$tmp/w"

# runs: the pipeline, its log, the --init / --save round trip
expect_ok "pipe" pipe --steps 3 --seed 5 --data "$data" --save "$tmp/w/a.safetensors" --log "$tmp/w/a.jsonl"
if [ "$(wc -l <"$tmp/w/a.jsonl")" -eq 3 ] &&
	grep -q '^{"step":2,"loss":3.5,"lr":0.001,"grad_norm":0.5,"tokens":32,"step_ms":' "$tmp/w/a.jsonl"; then ok; else bad_run "log lines"; cat "$tmp/w/a.jsonl"; fi
if grep -q '^step 3/3  loss 3.5000' "$tmp/out"; then ok; else bad_run "progress line"; fi
expect_ok "pipe --init" pipe --steps 0 --data "$data" --init "$tmp/w/a.safetensors" --save "$tmp/w/b.safetensors"
if cmp -s "$tmp/w/a.safetensors" "$tmp/w/b.safetensors"; then ok; else bad_run "--init then --save changed the bytes"; fi
expect_ok "pipe --init, trained" pipe --steps 2 --data "$data" --init "$tmp/w/a.safetensors" --save "$tmp/w/c.safetensors"
expect_ok "zero" zero --steps 2 --seed 9 --data "$data" --save "$tmp/w/z.safetensors"
expect_ok "zero --init" zero --steps 0 --data "$data" --init "$tmp/w/z.safetensors" --save "$tmp/w/z2.safetensors"
if cmp -s "$tmp/w/z.safetensors" "$tmp/w/z2.safetensors"; then ok; else bad_run "zero: --init then --save changed the bytes"; fi
expect_ok "zero, one step" zero --steps 1 --data "$data"
no_leftovers "runs" "$tmp/w"

# reports
PLANRT_REPORT_MEMORY=1 PLANRT_REPORT_TIMING=1 PLANRT_REPORT_COMM=1 timeout 60 mpirun -np 2 "$bin" pipe --steps 3 --data "$data" >"$tmp/out" 2>&1
# stage 0 holds three state families (test_program.c): layer_w (3 members of 40 bytes, a packed array),
# layer_a (3 of 24, parameters) and layer_b (3 of 8, optimizer state), the last two fields of a per-layer struct
# (stride 2): their 120 + 72 bytes count in param=, their 24 in optim=, all 216 in state=
for want in \
	'planrt: rank 0: memory arena_high_water=2880 arena_planned=4096 state=634 peak_rss=[1-9][0-9]* stage=0 param=326 grad=120 optim=144 master=28 buffer=0 metric=16 offload=0 disk=0$' \
	'planrt: rank 1: memory arena_high_water=3392 arena_planned=4096 state=256 peak_rss=[1-9][0-9]* stage=1 param=240 grad=0 optim=0 master=0 buffer=0 metric=16 offload=0 disk=0$' \
	'planrt: rank 0: timing stage=0 steps=2 step_s=[0-9.]* busy_s=[0-9.-]* wait_s=[0-9.]* update_s=[0-9.]*$' \
	'planrt: rank 1: timing stage=1 steps=2 step_s=[0-9.]* busy_s=[0-9.-]* wait_s=[0-9.]* update_s=[0-9.]*$' \
	'planrt: rank 0: comm kind=send group=pipe calls=24 bytes=1536$' \
	'planrt: rank 0: comm kind=recv group=pipe calls=12 bytes=0$' \
	'planrt: rank 1: comm kind=send group=pipe calls=12 bytes=768$' \
	'planrt: rank 1: comm kind=recv group=pipe calls=24 bytes=0$'; do
	if grep -q -- "$want" "$tmp/out"; then ok; else bad_run "report line '$want'"; fi
done
if [ "$(grep -c 'comm kind=' "$tmp/out")" -eq 4 ]; then ok; else bad_run "comm lines: only the pipeline's sends and receives"; fi
PLANRT_REPORT_TIMING=1 timeout 60 mpirun -np 2 "$bin" zero --steps 1 --data "$data" >"$tmp/out" 2>&1
if grep -q 'planrt: rank 0: timing stage=0 steps=1 ' "$tmp/out"; then ok; else bad_run "timing of a single step"; fi

finish test_program
