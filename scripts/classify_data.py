#!/usr/bin/env python3
"""Writes the byte-classification data set examples/bert.plan trains on: N windows of S bytes of a
text file (tokens, i32 [N, S]) and a class per window (labels, i32 [N]): the first byte modulo
CLASSES, which the model must read off its first ([CLS]) position. The windows start at evenly
spaced offsets, so the file is a function of the text alone. Written as a .safetensors file, or as
a directory of tokens.npy and labels.npy when OUT does not end in .safetensors (the two data set
formats planrt reads, docs/execution.md).
usage: classify_data.py TEXT OUT [N [S [CLASSES]]]
"""
import json
import os
import struct
import sys

text, out = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 384
s = int(sys.argv[4]) if len(sys.argv) > 4 else 32
classes = int(sys.argv[5]) if len(sys.argv) > 5 else 4
data = open(text, "rb").read()
step = (len(data) - s) // n
tokens = [list(data[i * step:i * step + s]) for i in range(n)]
labels = [w[0] % classes for w in tokens]
raw = {"tokens": (struct.pack(f"<{n * s}i", *[t for w in tokens for t in w]), [n, s]),
       "labels": (struct.pack(f"<{n}i", *labels), [n])}
if out.endswith(".safetensors"):
    header, at = {}, 0
    for name in sorted(raw):
        header[name] = {"dtype": "I32", "shape": raw[name][1], "data_offsets": [at, at + len(raw[name][0])]}
        at += len(raw[name][0])
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(raw[name][0] for name in sorted(raw)))
else:
    os.makedirs(out, exist_ok=True)
    for name, (blob, shape) in raw.items():
        d = "{'descr': '<i4', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{x}, " for x in shape)
        d += " " * (-(len(d) + 11) % 64) + "\n"
        with open(f"{out}/{name}.npy", "wb") as f:
            f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + blob)
