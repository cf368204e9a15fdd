#!/usr/bin/python3
"""Writes tests/kernels/reference.txt, the PyTorch reference values test_semantics.c checks the
kernels against, so that CI needs no torch. Run once, with Debian's python3-torch:

    /usr/bin/python3 tests/kernels/make_reference.py > tests/kernels/reference.txt

Each line is `name count v0 v1 ...` (%.17g). Inputs are stored too, so the C test does not have to
reproduce Python's random numbers. Everything is computed in float64 by torch.nn.functional; the
Philox lines come from a plain-Python Philox-4x32-10 checked against the Random123 known answers.
"""
import math
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(20240601)
out = []


def emit(name, values):
    values = [float(v) for v in values]
    out.append(name + " " + str(len(values)) + " " + " ".join("%.17g" % v for v in values))


def t(x):
    return torch.tensor(x, dtype=torch.float64)


# gelu, both forms, and silu
x = torch.cat([torch.linspace(-6, 6, 25, dtype=torch.float64), t([-0.0, 1e-3, -1e-3, 0.5, 10.0, -10.0])])
emit("act_x", x)
emit("gelu_erf", F.gelu(x))
emit("gelu_tanh", F.gelu(x, approximate="tanh"))
emit("silu", F.silu(x))
emit("relu", F.relu(x))

# layer_norm [3, 10] with an offset mean; eps 1e-5
x = torch.randn(3, 10, dtype=torch.float64) * 2 + 3
w = torch.rand(10, dtype=torch.float64) + 0.5
b = torch.randn(10, dtype=torch.float64)
emit("ln_x", x.flatten())
emit("ln_w", w)
emit("ln_b", b)
emit("ln_y", F.layer_norm(x, (10,), w, b, eps=1e-5).flatten())
emit("ln_y_noaffine", F.layer_norm(x, (10,), eps=1e-5).flatten())
# rms_norm (torch 1.13 has no F.rms_norm; this is its definition in later versions)
emit("rms_y", (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w).flatten())

# softmax [3, 9]: ordinary, huge (stability), and with -inf entries (a causal row)
x = torch.randn(3, 9, dtype=torch.float64)
x[1] += 1000.0
x[2, 4:] = -math.inf
emit("sm_x", x.flatten())
emit("sm_y", F.softmax(x, dim=-1).flatten())

# cross_entropy [5, 13], mean over tokens
x = torch.randn(5, 13, dtype=torch.float64) * 3
tg = torch.tensor([0, 12, 5, 7, 5])
emit("ce_logits", x.flatten())
emit("ce_targets", tg)
loss = F.cross_entropy(x, tg)
emit("ce_loss", [loss])
xg = x.clone().requires_grad_(True)
F.cross_entropy(xg, tg).backward()
emit("ce_dlogits", xg.grad.flatten())


# Philox-4x32-10, Random123 reference
def philox(ctr, key):
    M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
    c = list(ctr)
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
    return c


KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
for ctr, key, want in KAT:
    if tuple(philox(ctr, key)) != want:
        sys.exit("make_reference.py: Philox known-answer test failed")

# dropout: first Philox words for 64 consecutive global indices starting past 2^32 (so the high
# counter word matters), seed and key both using their high halves
seed, key, start = 0x0123456789ABCDEF, 0xFEDCBA9876543210, (1 << 32) + 1000
emit("philox_seed_key_start", [seed >> 32, seed & 0xFFFFFFFF, key >> 32, key & 0xFFFFFFFF, start])
emit("philox_u", [philox((i & 0xFFFFFFFF, i >> 32, key & 0xFFFFFFFF, key >> 32),
                         (seed & 0xFFFFFFFF, seed >> 32))[0] for i in range(start, start + 64)])

print("\n".join(out))
