#!/bin/sh
# Benchmark (figures, not a test): tokens per second of examples/gpt.plan's GPT trained by the
# program planc builds, on 1 rank (plan single) and 2 data-parallel ranks (plan dp2), side by side
# in one run with the same model in PyTorch eager (bench/torch_gpt.py, Debian's python3-torch,
# /usr/bin/python3; DDP with gloo for 2 ranks): same batch (16), sequence (64), one thread per rank.
# Also times `planc build` for the examples. usage: bench/gpt_tokens.sh [PLANC] [STEPS]
# PLANC_BUILD_FLAGS=--native builds the programs for this machine's CPU (the default is portable);
# configure with -DPLANRT_NATIVE=ON to build planrt for it too.
planc=${1:-build/planc}
steps=${2:-30}
warmup=3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

planc_rate() { # PLAN NP -> tokens/s over the steps after the warmup
	"$planc" build examples/gpt.plan --plan "$1" -o "$tmp/$1" ${PLANC_BUILD_FLAGS:-} || exit 1
	mpirun -np "$2" "$tmp/$1" --steps $((steps + warmup)) --data data/corpus.txt --log "$tmp/$1.jsonl" >/dev/null 2>&1 || exit 1
	python3 -c "
import json, sys
r = [json.loads(l) for l in open('$tmp/$1.jsonl')][$warmup:]
print('%.0f' % (sum(x['tokens'] for x in r) / sum(x['step_ms'] for x in r) * 1e3))"
}

torch_rate() { # NP
	if [ "$1" -eq 1 ]; then
		/usr/bin/python3 bench/torch_gpt.py "$steps" "$warmup"
	else
		pids=""
		for r in $(seq 0 $(($1 - 1))); do
			MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=$r WORLD_SIZE=$1 \
				/usr/bin/python3 bench/torch_gpt.py "$steps" "$warmup" --dp >"$tmp/torch$r.out" 2>"$tmp/torch$r.err" &
			pids="$pids $!"
		done
		for p in $pids; do wait "$p"; done
		cat "$tmp/torch0.out"
	fi
}

if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
	echo "PyTorch not installed (apt-get install python3-torch): planc figures only"
	have_torch=0
else
	have_torch=1
fi
printf "%-10s %6s %16s %16s %8s\n" "plan" "ranks" "planc tok/s" "pytorch tok/s" "ratio"
for case in "single 1" "dp2 2"; do
	set -- $case
	p=$(planc_rate "$1" "$2")
	if [ $have_torch -eq 1 ]; then
		t=$(torch_rate "$2")
		ratio=$(python3 -c "print('%.2f' % ($p / $t))")
	else
		t="-"
		ratio="-"
	fi
	printf "%-10s %6s %16s %16s %8s\n" "$1" "$2" "$p" "$t" "$ratio"
done
echo
echo "planc build time (emit C, compile with mpicc -O3, link planrt):"
for spec in "mlp single" "mlp dp2_tp2_zero2" "gpt single" "gpt dp2_tp2" "gpt tp2_sp"; do
	set -- $spec
	start=$(date +%s%N)
	"$planc" build examples/$1.plan --plan "$2" -o "$tmp/b" || exit 1
	end=$(date +%s%N)
	printf "  %-22s %8.2f s\n" "$1 $2" "$(echo "($end - $start) / 1000000000" | bc -l)"
done
