#!/usr/bin/env python3
"""jsonl_to_tensorboard.py: a planrt --log (JSON lines) as a TensorBoard event file.

A generated program logs one JSON object per step ({"step", "loss", "lr", "grad_norm",
"tokens_per_s", "eval_loss", ...}); this script writes them as TensorBoard scalars, so
`tensorboard --logdir DIR` plots a run without the program linking TensorFlow's protobufs (why the
runtime writes JSON lines and not event files: docs/operability.md). It needs nothing beyond
Python's standard library: the event file is TFRecord framing (length, masked CRC-32C of the
length, the record, masked CRC-32C of the record) around tensorflow.Event protocol buffers encoded
by hand (wall_time = 1, step = 2, file_version = 3, summary = 5; Summary.value = 1; Value.tag = 1,
Value.simple_value = 2).

Scalars: train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/samples_per_s, eval/loss and eval/accuracy (a step's eval_loss, eval_accuracy),
and every other number of a row as train/NAME, at the row's step (0-based, as the log); the facts
of the run the first row carries (cpu, blas, threads) are not scalars and are left out. Run it again
after a resumed run appended to the log: it rewrites the event file whole.

usage: jsonl_to_tensorboard.py RUN.jsonl LOGDIR   (writes LOGDIR/events.out.tfevents.TIME.HOST)
"""
import json
import os
import socket
import struct
import sys
import time


def crc32c(data, table=[]):
    if not table:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
            table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire_type, payload):
    key = varint(num << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def event(wall_time, step=None, file_version=None, scalars=None):
    body = field(1, 1, struct.pack("<d", wall_time))
    if step is not None:
        body += field(2, 0, varint(step))
    if file_version is not None:
        body += field(3, 2, file_version.encode())
    if scalars:
        summary = b"".join(field(1, 2, field(1, 2, tag.encode()) + field(2, 5, struct.pack("<f", value)))
                           for tag, value in scalars)
        body += field(5, 2, summary)
    return body


def record(body):
    header = struct.pack("<Q", len(body))
    return header + struct.pack("<I", masked_crc(header)) + body + struct.pack("<I", masked_crc(body))


def tag_of(key):
    return f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: jsonl_to_tensorboard.py RUN.jsonl LOGDIR")
    src, logdir = argv[1], argv[2]
    try:
        lines = open(src).read().splitlines()
    except OSError as e:
        sys.exit(f"jsonl_to_tensorboard: cannot read '{src}': {e.strerror}")
    records = [record(event(time.time(), file_version="brain.Event:2"))]
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"jsonl_to_tensorboard: {src}:{number}: not a JSON object ({e.msg}); is it a planrt --log?")
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] < 0:
            continue  # not a step's row (none are written today; tolerated for later kinds)
        scalars = [(tag_of(k), float(v)) for k, v in row.items()
                   if k not in ("step", "tokens", "samples", "step_ms", "threads") and isinstance(v, (int, float)) and not isinstance(v, bool)]
        if scalars:
            records.append(record(event(time.time(), step=row["step"], scalars=scalars)))
    try:
        os.makedirs(logdir, exist_ok=True)
        for old in os.listdir(logdir):  # one event file per log: a rerun replaces the last
            if old.startswith("events.out.tfevents.") and old.endswith(".planrt"):
                os.unlink(os.path.join(logdir, old))
        path = os.path.join(logdir, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.planrt")
        with open(path + ".tmp", "wb") as f:
            f.write(b"".join(records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
    except OSError as e:
        sys.exit(f"jsonl_to_tensorboard: cannot write into '{logdir}': {e.strerror}")
    print(f"{path}: {len(records) - 1} steps; view with: tensorboard --logdir {logdir}")


if __name__ == "__main__":
    main(sys.argv)
