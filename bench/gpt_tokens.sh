#!/bin/sh
# Benchmark (figures, not a test): tokens per second of examples/gpt.plan's GPT trained by the
# programs planc builds, beside the same model in PyTorch eager (bench/torch_gpt.py, Debian's
# python3-torch at /usr/bin/python3; DDP with gloo for 2 ranks), side by side in one run:
#   default    planc build: the portable program (every instruction-set level, the best one run;
#              docs/cpu.md)
#   native     planc build --native: compiled for this machine's CPU only
#   pytorch    PyTorch eager, the same sizes, batch, dropout, AdamW and clipping
# Each round runs every case's three programs in turn (interleaved, so that load from other work
# falls on all of them alike) and the table gives each one's median over the rounds of tokens/s
# over the steps after the warm-up, with the load average before and after (this machine is
# shared: take figures when it is lowest).
#   small GPT (default): D 128, S 64, 4 heads, 4 layers, batch 16; plans single (1 rank) and dp2
#   --large: D 512, S 256, 8 heads, 4 layers, batch 8; single, dp2, and 1 rank with 2 threads
#            (planrt's and OpenBLAS's threads, launched with mpirun --bind-to none; PyTorch's
#            intra-op threads)
# One thread per rank otherwise. Also times `planc build` for the examples (not with --large).
# usage: bench/gpt_tokens.sh [PLANC] [STEPS] [--large] [--rounds R]   (from the repository root)
planc=build/planc
steps=
rounds=3
large=0
n=0
while [ $# -gt 0 ]; do
	case $1 in
	--large) large=1 ;;
	--rounds) rounds=$2; shift ;;
	*) n=$((n + 1)); if [ $n -eq 1 ]; then planc=$1; else steps=$1; fi ;;
	esac
	shift
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader
unset PLANRT_ISA

if [ $large -eq 1 ]; then
	steps=${steps:-10}
	warmup=2
	plans=$tmp/gpt_large.plan
	# examples/gpt.plan's model (its import and model block), then the larger GPT's plans
	sed -n '1,/^}/p' examples/gpt.plan >"$plans"
	cat >>"$plans" <<-'EOF'

	plan single for gpt(S = 256, D = 512, H = 8, L = 4) {
	  mesh data = 1
	  batch B = 8
	  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
	}

	plan dp2 for gpt(S = 256, D = 512, H = 8, L = 4) {
	  mesh data = 2
	  batch B = 8
	  shard B -> data
	  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
	  sync strict, bucket = 1MiB, overlap
	}
	EOF
	size="--size S=256,D=512,H=8,L=4,B=8"
	model="GPT D512 S256 H8 L4 B8"
	cases="single:single:1:1 dp2:dp2:2:1 1x2threads:single:1:2"
else
	steps=${steps:-30}
	warmup=3
	plans=examples/gpt.plan
	size=
	model="GPT D128 S64 H4 L4 B16 (examples/gpt.plan)"
	cases="single:single:1:1 dp2:dp2:2:1"
fi

if /usr/bin/python3 -c "import torch" 2>/dev/null; then
	have_torch=1
else
	echo "PyTorch not installed (apt-get install python3-torch): planc figures only"
	have_torch=0
fi

for plan in $(echo "$cases" | tr ' ' '\n' | cut -d: -f2 | sort -u); do
	"$planc" build "$plans" --plan "$plan" -o "$tmp/prog.$plan.default" || exit 1
	"$planc" build "$plans" --plan "$plan" -o "$tmp/prog.$plan.native" --native || exit 1
done

planc_rate() { # PROGRAM RANKS THREADS -> tokens/s over the steps after the warm-up
	# mpirun binds each rank to one core when it starts 2 ranks or fewer: a threaded rank's threads
	# would share that core (docs/cpu.md, "Threads")
	bind=
	[ "$3" -gt 1 ] && bind="--bind-to none"
	OMP_NUM_THREADS=$3 OPENBLAS_NUM_THREADS=$3 mpirun $bind -np "$2" "$1" --steps $((steps + warmup)) --data data/corpus.txt \
		--log "$tmp/run.jsonl" >"$tmp/run.out" 2>&1 || { tail -12 "$tmp/run.out" >&2; echo "$1 failed" >&2; exit 1; }
	python3 -c "
import json
r = [json.loads(l) for l in open('$tmp/run.jsonl')][$warmup:]
print('%.0f' % (sum(x['tokens'] for x in r) / sum(x['step_ms'] for x in r) * 1e3))"
}

torch_rate() { # RANKS THREADS
	if [ "$1" -eq 1 ]; then
		OMP_NUM_THREADS=$2 /usr/bin/python3 bench/torch_gpt.py "$steps" "$warmup" $size
		return
	fi
	pids=""
	for r in $(seq 0 $(($1 - 1))); do
		OMP_NUM_THREADS=$2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=$r WORLD_SIZE=$1 \
			/usr/bin/python3 bench/torch_gpt.py "$steps" "$warmup" --dp $size >"$tmp/torch$r.out" 2>"$tmp/torch$r.err" &
		pids="$pids $!"
	done
	for p in $pids; do wait "$p"; done
	cat "$tmp/torch0.out"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
	for c in $cases; do
		label=$(echo "$c" | cut -d: -f1); plan=$(echo "$c" | cut -d: -f2)
		np=$(echo "$c" | cut -d: -f3); threads=$(echo "$c" | cut -d: -f4)
		planc_rate "$tmp/prog.$plan.default" "$np" "$threads" >>"$tmp/rate.$label.default"
		planc_rate "$tmp/prog.$plan.native" "$np" "$threads" >>"$tmp/rate.$label.native"
		[ $have_torch -eq 1 ] && torch_rate "$np" "$threads" >>"$tmp/rate.$label.torch"
	done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

echo "$model: tokens/s, median of $rounds interleaved rounds of $steps steps after $warmup warm-up"
echo "load average before: $load_before, after: $load_after"
printf "%-11s %6s %8s %9s %9s %9s %9s %9s %9s\n" plan ranks threads default native pytorch "def/torch" "nat/torch" "def/nat"
for c in $cases; do
	label=$(echo "$c" | cut -d: -f1); np=$(echo "$c" | cut -d: -f3); threads=$(echo "$c" | cut -d: -f4)
	python3 - "$tmp/rate.$label" "$label" "$np" "$threads" <<-'EOF'
	import statistics, sys, os
	stem, label, np, threads = sys.argv[1:]
	med = {k: statistics.median(float(x) for x in open(f"{stem}.{k}")) if os.path.exists(f"{stem}.{k}") else None
	       for k in ("default", "native", "torch")}
	ratio = lambda a, b: f"{med[a] / med[b]:.2f}" if med[a] and med[b] else "-"
	cell = lambda k: f"{med[k]:.0f}" if med[k] else "-"
	print(f"{label:<11} {np:>6} {threads:>8} {cell('default'):>9} {cell('native'):>9} {cell('torch'):>9} "
	      f"{ratio('default', 'torch'):>9} {ratio('native', 'torch'):>9} {ratio('default', 'native'):>9}")
	EOF
done
echo "(each run's tokens/s: default, native, pytorch per round)"
for c in $cases; do
	label=$(echo "$c" | cut -d: -f1)
	echo "  $label: $(tr '\n' ' ' <"$tmp/rate.$label.default")| $(tr '\n' ' ' <"$tmp/rate.$label.native")| $(cat "$tmp/rate.$label.torch" 2>/dev/null | tr '\n' ' ')"
done

[ $large -eq 1 ] && exit 0
echo
echo "planc build time (emit C, compile with mpicc -O3 for every instruction-set level, link planrt):"
for spec in "mlp single" "mlp dp2_tp2_zero2" "gpt single" "gpt dp2_tp2" "gpt tp2_sp"; do
	set -- $spec
	start=$(date +%s%N)
	"$planc" build examples/$1.plan --plan "$2" -o "$tmp/b" || exit 1
	end=$(date +%s%N)
	printf "  %-22s %8.2f s\n" "$1 $2" "$(echo "($end - $start) / 1000000000" | bc -l)"
done
