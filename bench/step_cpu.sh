#!/bin/sh
# Benchmark (figures, not a test): the CPU time per training step of one or more built programs,
# side by side in one run, for comparing two builds of one plan on a shared machine, where wall
# time says little and CPU time still says what a step costs. Each program runs 1 + WARM and
# 1 + WARM + STEPS steps (one rank, one thread); its CPU time per step is the difference of the two
# runs' user + system time over STEPS, which leaves out start-up (MPI, the arena, init). Rounds
# interleave the programs (a b c, a b c, ...) so that other load falls on each alike; the table
# gives each program's median and least over the rounds and its ratio to the first program's.
# The name `torch` stands for bench/torch_gpt.py (examples/gpt.plan's GPT in PyTorch eager, one
# thread), measured the same way.
# usage: bench/step_cpu.sh [--steps N] [--rounds R] [--data FILE] PROG|torch...
steps=30
rounds=3
data=data/corpus.txt
while [ $# -gt 0 ]; do
	case $1 in
	--steps) steps=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--data) data=$2; shift 2 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "usage: bench/step_cpu.sh [--steps N] [--rounds R] [--data FILE] PROG..." >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

cpu_s() { # PROGRAM STEPS -> user + system seconds of one run
	if [ "$1" = torch ]; then
		set -- /usr/bin/python3 bench/torch_gpt.py $(($2 - 3)) 3
	else
		set -- "$1" --steps "$2" --data "$data" --log /dev/null
	fi
	/usr/bin/time -f "%U %S" -o "$tmp/time" "$@" >/dev/null 2>"$tmp/err" ||
		{ tail -5 "$tmp/err" >&2; echo "$1 failed" >&2; exit 1; }
	awk '{print $1 + $2}' "$tmp/time"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
	i=0
	for prog in "$@"; do
		i=$((i + 1))
		short=$(cpu_s "$prog" 4) || exit 1
		long=$(cpu_s "$prog" $((4 + steps))) || exit 1
		echo "$short $long" | awk -v n="$steps" '{printf "%.3f\n", ($2 - $1) / n * 1000}' >>"$tmp/ms.$i"
	done
done
echo "CPU ms per step (user + system, one thread; $steps steps after 4, $rounds interleaved rounds)"
echo "load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for prog in "$@"; do
	i=$((i + 1))
	python3 - "$tmp/ms" "$i" "$prog" <<-'EOF'
	import statistics, sys
	stem, i, prog = sys.argv[1], int(sys.argv[2]), sys.argv[3]
	ms = [float(x) for x in open(f"{stem}.{i}")]
	first = statistics.median(float(x) for x in open(f"{stem}.1"))
	med = statistics.median(ms)
	print(f"{prog:<40} median {med:8.2f}  least {min(ms):8.2f}  / first {med / first:5.3f}  "
	      f"(rounds: {' '.join('%.1f' % x for x in ms)})")
	EOF
done
