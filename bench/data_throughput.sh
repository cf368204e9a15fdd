#!/bin/sh
# The data pipeline's throughput (tokens/s read) for each format against the training step's on
# examples/gpt.plan (plan single, B = 16, S = 64, one rank): issue 22's figure. The corpus is
# data/corpus.txt repeated to about 8 MB of text, tokenized with data/tok into each format.
# The same batches made by PyTorch users' loaders (nanoGPT's get_batch, Megatron's indexed data
# set read with numpy) come from bench/data_torch.py, beside them.
# usage: sh bench/data_throughput.sh [BUILD_DIR]   (from the repository root; prints, asserts nothing)
set -eu
build=${1:-build}
planc=$build/planc
read_bin=$build/bench/bench_data_read
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
while [ $i -lt 200 ]; do cat data/corpus.txt; i=$((i + 1)); done >"$tmp/big.txt"
"$planc" data tokenize "$tmp/big.txt" --split-paragraphs --vocab data/tok -o "$tmp/meg" 2>/dev/null
"$planc" data tokenize "$tmp/big.txt" --vocab data/tok -o "$tmp/nano.bin" --format nanogpt 2>/dev/null
"$planc" data tokenize "$tmp/big.txt" --vocab data/tok -o "$tmp/shard_000.bin" --format llmc 2>/dev/null
cp "$tmp/shard_000.bin" "$tmp/shard_001.bin"
echo "data pipeline (one rank, B = 16, S = 64, 2000 batches, epochs sampling):"
"$read_bin" 256 64 16 2000 "$tmp/big.txt"
"$read_bin" 512 64 16 2000 "$tmp/nano.bin"
"$read_bin" 512 64 16 2000 "$tmp/shard_*.bin"
"$read_bin" 512 64 16 2000 "$tmp/meg"
"$read_bin" 512 64 16 2000 0.7 "$tmp/meg" 0.3 "$tmp/nano.bin"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	echo "the same batches by PyTorch's loaders (bench/data_torch.py, one thread):"
	/usr/bin/python3 bench/data_torch.py 64 16 2000 "$tmp/nano.bin" "$tmp/meg"
else
	echo "(no PyTorch at /usr/bin/python3: the loaders' comparison is left out)"
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
echo "training step (examples/gpt.plan, plan single, 20 steps on the text):"
"$planc" build examples/gpt.plan --plan single -o "$tmp/gpt" >/dev/null
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PLANRT_REPORT_TIMING=1 "$tmp/gpt" --steps 20 --data "$tmp/big.txt" 2>&1 |
	awk '/timing/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "gpt single: %.4f s/step, %.3e tokens/s (16 x 64 tokens a step)\n", v["step_s"] / v["steps"], 1024 * v["steps"] / v["step_s"] }'
