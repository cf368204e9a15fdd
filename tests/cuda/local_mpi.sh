#!/bin/bash
# local_mpi.sh: planrt's node-local MPI (runtime/standalone/mpi_local.c) and its launcher planrt-run,
# which scripts/gpu-build.sh builds on the GPU machine (no MPI there) to run several ranks, held
# against Open MPI here:
#   1. planrt's collective tests (tests/runtime/test_collectives.c, test_step_kernels.c) linked with
#      planrt_local pass under planrt-run -n 4;
#   2. a stall is reported by planrt's watchdog and planrt-run stops the job with the failed rank
#      named and its status; a rank that fails stops the others;
#   3. CPU programs of three plans (ZeRO-3 with tensor and sequence parallelism: nonblocking
#      gathers and reduce-scatters on two axes; an interleaved pipeline: tagged transfers on
#      channels; dropless MoE: all-to-all-v) linked with planrt_local and run by planrt-run train
#      with the losses of the same plans built by planc build (Open MPI) under mpirun, within 1e-5
#      relative (the reductions sum in another order) over 8 steps.
#   local_mpi.sh PLANC PLANRT_RUN LIBPLANRT_LOCAL CBLAS_INCLUDE TEST_COLLECTIVES TEST_STEP_KERNELS TEST_WATCHDOG
set -u
PLANC=$1 RUN=$2 LIB=$3 CBLAS_INC=$4 T_COLL=$5 T_STEP=$6 T_WD=$7
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# 1. the collective tests
for t in "$T_COLL" "$T_STEP"; do
	if PLANRT_WATCHDOG=60 timeout 300 "$RUN" -n 4 "$t" >"$tmp/out" 2>&1 && grep -q "PASSED" "$tmp/out"; then
		ok "$(basename "$t") under planrt-run -n 4: $(grep -c '\[       OK \]' "$tmp/out") checks passed on rank 0's count"
	else
		bad "$(basename "$t") under planrt-run -n 4:"; tail -20 "$tmp/out"
	fi
done

# 2. a stall, and a failing rank
PLANRT_WATCHDOG=2 timeout 60 "$RUN" -n 2 "$T_WD" >"$tmp/wd" 2>&1
rc=$?
if [ $rc != 0 ] && grep -q "watchdog: recv #1 of 4 f32 from member [01] on world (member [01] of 2) still pending after 2 s" "$tmp/wd" &&
	grep -q "planrt-run: rank [01] (pid [0-9]*) exited with status 1; stopping the other ranks" "$tmp/wd"; then
	ok "a stall: the watchdog names the receive, planrt-run the rank, status $rc"
else
	bad "a stall: status $rc"; cat "$tmp/wd"
fi
t0=$(date +%s)
"$RUN" -n 3 sh -c 'if [ "$PLANRT_RUN_RANK" = 1 ]; then exit 3; fi; exec sleep 60' >"$tmp/fail" 2>&1
rc=$?
if [ $rc = 3 ] && [ $(( $(date +%s) - t0 )) -lt 30 ] && grep -q "planrt-run: rank 1 (pid [0-9]*) exited with status 3" "$tmp/fail"; then
	ok "a failing rank: the others stopped, planrt-run exits with its status 3"
else
	bad "a failing rank: status $rc after $(( $(date +%s) - t0 )) s"; cat "$tmp/fail"
fi
"$RUN" -n 2 /nonexistent/program >"$tmp/none" 2>&1
rc=$?
if [ $rc = 127 ] && grep -q "planrt-run: cannot start /nonexistent/program" "$tmp/none"; then
	ok "a program that cannot start: one line, status 127"
else
	bad "a program that cannot start: status $rc"; cat "$tmp/none"
fi

# 3. CPU programs against Open MPI
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
	OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
while read -r file plan ranks <&3; do
	d=$tmp/$plan
	if ! "$PLANC" emit c "$file" --plan "$plan" -o "$d" >/dev/null ||
		! cc -std=gnu11 -O1 -I"$CBLAS_INC" -Iruntime/standalone -Iruntime/include -I"$d" "$d/prog.c" -o "$d/local" \
			"$LIB" -ljansson -lopenblas -lpthread -lm ||
		! "$PLANC" build "$file" --plan "$plan" -o "$d/ompi" >/dev/null; then
		bad "$file $plan: building"; continue
	fi
	PLANRT_WATCHDOG=120 "$RUN" -n "$ranks" "$d/local" --steps 8 --data data/corpus.txt --log "$d/local.jsonl" >/dev/null 2>"$d/err" ||
		{ bad "$file $plan under planrt-run"; tail -5 "$d/err"; continue; }
	mpirun -np "$ranks" "$d/ompi" --steps 8 --data data/corpus.txt --log "$d/ompi.jsonl" >/dev/null 2>&1 ||
		{ bad "$file $plan under mpirun"; continue; }
	python3 - "$d/ompi.jsonl" "$d/local.jsonl" "$file $plan ($ranks ranks)" <<'PY' || fail=1
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=1.0)
good = len(a) == len(b) == 8 and worst <= 1e-5
print(f"{'ok' if good else 'FAIL'}: {sys.argv[3]}: node-local MPI against Open MPI, {len(b)} of {len(a)} steps, "
      f"worst relative difference {worst:.1e}")
sys.exit(0 if good else 1)
PY
done 3<<'LIST'
examples/gpt.plan dp2_tp2_sp_zero3 4
examples/gpt.plan pp2_interleaved 2
examples/moe.plan mixtral_ep2 2
LIST
exit $fail
