#!/usr/bin/env python3
"""tests/attention: planrt's fused CPU attention against PyTorch's attention (1.13, eager, float64):
softmax(q k^T / sqrt(Dh) + mask) v with k and v repeat_interleave'd for GQA, its logsumexp, and the
gradients of (out * dout).sum() by autograd. Odd sizes (S not a multiple of the kernel's 64-row
tiles), head dims 64, 80 and 128, GQA ratios 1, 4 and 8, causal, padding ([B, 1, 1, S], the last
keys of each sample masked) and no mask. Every result within 1e-5 of its largest magnitude.
usage: check_torch.py ATTENTION_IO   (tests/attention/attention_io.c; exit 77 without torch)
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

tool = sys.argv[1]
work = harness.workdir("attention-torch")
tally = harness.Tally("attention vs torch")
CASES = [(2, 4, 4, 67, 64, 1), (2, 8, 2, 130, 80, 2), (1, 8, 1, 97, 128, 0), (2, 4, 1, 200, 64, 1),
         (1, 8, 8, 65, 128, 2), (2, 8, 1, 129, 80, 0)]
MASKS = ["none", "causal", "padding"]


def reference(q, k, v, dout, mask, kind):
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5
    if kind == 1:
        S = s.shape[-1]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    elif kind == 2:
        s = s + mask.double()[:, None, None, :]
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ vr
    (out * dout.double()).sum().backward()
    return [out.detach(), lse.detach(), q.grad, k.grad, v.grad]


for i, (B, H, Hk, S, Dh, kind) in enumerate(CASES):
    g = torch.Generator().manual_seed(i)
    q, dout = (torch.randn(B, H, S, Dh, generator=g) for _ in range(2))
    k, v = (torch.randn(B, Hk, S, Dh, generator=g) for _ in range(2))
    mask = torch.zeros(B, S)
    for b in range(B):
        mask[b, S - 1 - b * (S // 3):] = -1e9
    path_in, path_out = f"{work}/in{i}", f"{work}/out{i}"
    with open(path_in, "wb") as f:
        f.write(struct.pack("<6q", B, H, Hk, S, Dh, kind))
        for t in (q, k, v, dout) + ((mask,) if kind == 2 else ()):
            f.write(t.contiguous().numpy().astype("<f4").tobytes())
    r = subprocess.run([tool, path_in, path_out], capture_output=True, text=True)
    name = f"S {S}, head dim {Dh}, heads {H} / kv {Hk} (GQA {H // Hk}), mask {MASKS[kind]}"
    if r.returncode != 0:
        tally.check(name, False, r.stderr.strip()[-300:])
        continue
    raw = open(path_out, "rb").read()
    got, at = [], 0
    for shape in ((B, H, S, Dh), (B, H, S), (B, H, S, Dh), (B, Hk, S, Dh), (B, Hk, S, Dh)):
        n = 1
        for d in shape:
            n *= d
        got.append(torch.frombuffer(bytearray(raw[at:at + 4 * n]), dtype=torch.float32).reshape(shape).double())
        at += 4 * n
    want = reference(q, k, v, dout, mask, kind)
    errs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want)]
    tally.check(name, max(errs) <= 1e-5, "worst relative difference " + ", ".join(
        f"{n} {e:.1e}" for n, e in zip(["out", "lse", "dq", "dk", "dv"], errs)))
tally.finish()
