#!/bin/bash
# profile.sh: where bench/gpu/gpt350m.plan's step goes on the GPU, by kernel name, from Nsight
# Compute's per-kernel duration (gpu__time_duration) over a window of consecutive launches inside
# the second step (ncu --launch-skip / --launch-count). Run in a bundle of scripts/gpu-prepare.sh
# after gpu-check.sh built the programs (GPU_CHECK_WORK, default /tmp/gpu-check):
#   bash BUNDLE/profile.sh [SKIP] [COUNT]
set -uo pipefail
DIR=$(cd "$(dirname "$0")" && pwd)
W=${GPU_CHECK_WORK:-/tmp/gpu-check}
SKIP=${1:-9000}
COUNT=${2:-1500}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "profile: no ncu"; exit 1; }
[ -x "$W/gpt350m" ] || NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)} JANSSON_DIR=$DIR/jansson bash "$DIR/gpu-build.sh" "$DIR/runtime" "$W/lib" \
	"$DIR/gpt350m" "$W/gpt350m" || exit 1
timeout 300 "$NCU" --clock-control none --metrics gpu__time_duration.sum --launch-skip "$SKIP" --launch-count "$COUNT" \
	--csv --log-file "$W/ncu.csv" "$W/gpt350m" --steps 2 --data "$DIR/corpus.txt" >/dev/null 2>"$W/ncu.err"
echo "ncu: status $?, $(wc -l < "$W/ncu.csv") lines"
tail -3 "$W/ncu.err"
python3 - "$W/ncu.csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no kernels profiled")
head = rows[0]
name_i, unit_i, val_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    v = float(r[val_i].replace(",", ""))
    v *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(r[unit_i], 1.0)
    name = r[name_i].split("(")[0].split("<")[0][:60]
    by[name][0] += 1
    by[name][1] += v
total = sum(t for _, t in by.values())
print(f"{len(rows) - 1} kernels, {total / 1e3:.1f} ms of GPU time")
for name, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])[:25]:
    print(f"  {t / total * 100:5.1f}%  {t / 1e3:8.2f} ms  {n:5d}x  {name}")
PY
