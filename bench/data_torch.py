#!/usr/bin/env python3
"""data_torch.py: the PyTorch side of bench/data_throughput.sh: how fast the data loaders a
PyTorch user runs make the same batches from the same files, so the figures of bench_data_read
have a reference on the same machine at the same load.

  nanoGPT's get_batch (train.py): np.memmap of the uint16 tokens reopened per batch, B random
  offsets, each window copied into an int64 tensor, stacked (x and y), with replacement;
  the same over an epoch permutation (torch.randperm of the windows, as a DataLoader's
  RandomSampler does), the order planc's default sampling gives;
  Megatron's indexed data set (.bin/.idx): the index read with numpy (as Megatron's
  IndexedDataset does: np.frombuffer over a memmap), each window of S + 1 tokens taken from the
  packed documents by np.concatenate of the sequences it spans (GPTDataset's rule).

usage: python3 bench/data_torch.py SEQ BATCH STEPS NANOGPT.bin MEGATRON_PREFIX (prints, asserts
nothing). One thread, as the C bench."""
import struct
import sys
import time

import numpy as np
import torch

torch.set_num_threads(1)


def nanogpt_batches(path, seq, batch, steps, epochs):
    gen = torch.Generator().manual_seed(1234)
    n_windows = (np.memmap(path, dtype=np.uint16, mode="r").shape[0] - 1) // seq
    order = torch.randperm(n_windows, generator=gen) if epochs else None
    total = 0
    t0 = time.perf_counter()
    for t in range(steps):
        data = np.memmap(path, dtype=np.uint16, mode="r")  # nanoGPT reopens it every batch
        if epochs:
            ix = [int(order[(t * batch + i) % n_windows]) * seq for i in range(batch)]
        else:
            ix = torch.randint(len(data) - seq - 1, (batch,), generator=gen).tolist()
        x = torch.stack([torch.from_numpy(data[i:i + seq].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + seq].astype(np.int64)) for i in ix])
        total += int(x[0, 0]) + int(y[0, 0])
    return time.perf_counter() - t0, total


def read_index(prefix):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(9 + 8 + 1 + 8 + 8)
    magic, version, code, n, m = struct.unpack("<9sQBQQ", head)
    assert magic == b"MMIDIDX\x00\x00" and version == 1, "not a Megatron index"
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}[code]
    buf = np.memmap(prefix + ".idx", mode="r", order="C")
    off = len(head)
    lengths = np.frombuffer(buf, dtype=np.int32, count=n, offset=off)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=off + 4 * n)
    return dtype, lengths, pointers


def megatron_batches(prefix, seq, batch, steps):
    dtype, lengths, pointers = read_index(prefix)
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])  # token offset of each sequence
    n_windows = (int(starts[-1]) - 1) // seq
    order = torch.randperm(n_windows, generator=torch.Generator().manual_seed(1234))
    total = 0
    t0 = time.perf_counter()
    for t in range(steps):
        rows = []
        for i in range(batch):
            lo = int(order[(t * batch + i) % n_windows]) * seq
            hi = lo + seq + 1
            first = int(np.searchsorted(starts, lo, side="right")) - 1  # the sequences the window spans
            last = int(np.searchsorted(starts, hi, side="left"))
            parts = []
            for d in range(first, last):
                a, b = max(lo, int(starts[d])), min(hi, int(starts[d + 1]))
                base = int(pointers[d]) // np.dtype(dtype).itemsize
                parts.append(tokens[base + a - int(starts[d]):base + b - int(starts[d])])
            rows.append(torch.from_numpy(np.concatenate(parts).astype(np.int64)))
        sample = torch.stack(rows)
        x, y = sample[:, :-1], sample[:, 1:]
        total += int(x[0, 0]) + int(y[0, 0])
    return time.perf_counter() - t0, total


def main():
    seq, batch, steps = (int(a) for a in sys.argv[1:4])
    nano, meg = sys.argv[4], sys.argv[5]
    tokens = steps * batch * seq
    for what, (s, check) in (("nanoGPT get_batch (random)", nanogpt_batches(nano, seq, batch, steps, False)),
                             ("nanoGPT get_batch (epochs)", nanogpt_batches(nano, seq, batch, steps, True)),
                             ("Megatron .bin/.idx windows", megatron_batches(meg, seq, batch, steps))):
        print(f"{what:28s} tokens {tokens:9d}  read {tokens / s:8.3e} tokens/s  (checksum {check})")


if __name__ == "__main__":
    main()
