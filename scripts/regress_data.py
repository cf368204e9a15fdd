#!/usr/bin/env python3
"""Writes the regression data set tests/equiv/regress.plan trains on, as a directory of .npy files
(numpy's format, written here without numpy): x float64 [N, F] (uniform in [-2, 2) from a 64-bit
LCG, so the file is a function of the arguments alone; planrt converts it to the model's f32) and
y float32 [N, 1] = sum_i sin(x_i) / (i + 1).
usage: regress_data.py OUTDIR [N [F]]
"""
import math
import os
import struct
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 256
f = int(sys.argv[3]) if len(sys.argv) > 3 else 16
state = 0x9E3779B97F4A7C15


def uniform():
    global state
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    return (state >> 11) / 2**53 * 4 - 2


x = [[uniform() for _ in range(f)] for _ in range(n)]
y = [[sum(math.sin(v) / (i + 1) for i, v in enumerate(row))] for row in x]


def save(path, descr, shape, fmt, values):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join(f"{k}, " for k in shape))
    d += " " * (-(len(d) + 11) % 64) + "\n"
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + struct.pack(f"<{len(values)}{fmt}", *values))


os.makedirs(out, exist_ok=True)
save(f"{out}/x.npy", "<f8", [n, f], "d", [v for row in x for v in row])
save(f"{out}/y.npy", "<f4", [n, 1], "f", [v for row in y for v in row])
