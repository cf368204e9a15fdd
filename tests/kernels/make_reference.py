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

# ---- issue 9's ops (a fresh seed, so the values above do not move) --------------------------------
torch.manual_seed(20240917)


def grad_of(f, *xs, dy):
    """The gradients of sum(f(xs) * dy) with respect to each of xs."""
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    (f(*xs) * dy).sum().backward()
    return [x.grad for x in xs]


# element-wise functions and their gradients (log on positive inputs, log(0) = -inf)
x = torch.cat([torch.linspace(-6, 6, 25, dtype=torch.float64),
               t([-0.0, 1e-4, -1e-4, 0.5, 20.0, -20.0, math.pi, 88.0, -88.0])])
dy = torch.randn(x.shape, dtype=torch.float64)
emit("un_x", x)
emit("un_dy", dy)
for name, f in [("sin", torch.sin), ("cos", torch.cos), ("exp", torch.exp), ("tanh", torch.tanh),
                ("sigmoid", torch.sigmoid)]:
    emit("un_" + name, f(x))
    emit("un_d" + name, grad_of(f, x, dy=dy)[0])
x = t([0.0, 1e-30, 1e-4, 0.01, 0.5, 1.0, 2.0, math.e, 10.0, 1000.0, 1e6, 3e38])
dy = torch.randn(x.shape, dtype=torch.float64)
emit("log_x", x)
emit("log_dy", dy)
emit("log_y", torch.log(x))
emit("log_dx", grad_of(torch.log, x[1:], dy=dy[1:])[0])

# sum, mean, max over one dim of [3, 5, 4], with ties for max (first index wins)
x = torch.randn(3, 5, 4, dtype=torch.float64)
x[0, 1, 0] = x[0, 3, 0] = 5.0
x[1, :, 2] = 0.25
dy = torch.randn(3, 4, dtype=torch.float64)
emit("red_x", x.flatten())
emit("red_dy", dy.flatten())
emit("red_sum1", x.sum(1).flatten())
emit("red_mean1", x.mean(1).flatten())
emit("red_sum2", x.sum(2).flatten())
emit("red_mean0", x.mean(0).flatten())
v, i = torch.max(x, 1)
emit("red_max1", v.flatten())
emit("red_argmax1", i.flatten())
emit("red_dmax1", grad_of(lambda a: torch.max(a, 1)[0], x, dy=dy)[0].flatten())

# slicing, indexing, concat, transpose
x = torch.randn(2, 6, 3, dtype=torch.float64)
emit("sl_x", x.flatten())
emit("sl_slice", x[:, 2:5].flatten())
emit("sl_cls", x[:, 0].flatten())
emit("sl_last", x[..., -1].flatten())
y, z = torch.randn(2, 1, 3, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64)
emit("cat_y", y.flatten())
emit("cat_z", z.flatten())
emit("cat_xyz", torch.cat([x, y, z], 1).flatten())
x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
emit("tr_x", x.flatten())
emit("tr_13", x.transpose(1, 3).contiguous().flatten())


# repeat_kv, Hugging Face's (modeling_llama.py), on [B, Hkv, S, Dh]
def repeat_kv(h, n_rep):
    b, nkv, s, d = h.shape
    return h[:, :, None, :, :].expand(b, nkv, n_rep, s, d).reshape(b, nkv * n_rep, s, d)


x = torch.randn(2, 2, 3, 4, dtype=torch.float64)
dy = torch.randn(2, 6, 3, 4, dtype=torch.float64)
emit("rkv_x", x.flatten())
emit("rkv_y", repeat_kv(x, 3).flatten())
emit("rkv_y_bshd", x.transpose(1, 2).repeat_interleave(3, dim=2).flatten())
emit("rkv_dy", dy.flatten())
emit("rkv_dx", grad_of(lambda a: repeat_kv(a, 3), x, dy=dy)[0].flatten())

# torch.matmul with broadcast batch dims: A [2, 1, 3, 4] @ B [3, 4, 5]; A given transposed
a, b = torch.randn(2, 1, 3, 4, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
dy = torch.randn(2, 3, 3, 5, dtype=torch.float64)
emit("mm_a", a.flatten())
emit("mm_b", b.flatten())
emit("mm_dy", dy.flatten())
emit("mm_c", torch.matmul(a, b).flatten())
da, db = grad_of(torch.matmul, a, b, dy=dy)
emit("mm_da", da.flatten())
emit("mm_db", db.flatten())
at = a.transpose(-1, -2).contiguous()  # stored [2, 1, 4, 3]
emit("mm_at", at.flatten())
emit("mm_c_ta", torch.matmul(at.transpose(-1, -2), b).flatten())
dat, _ = grad_of(lambda s, w: torch.matmul(s.transpose(-1, -2), w), at, b, dy=dy)
emit("mm_dat", dat.flatten())
# the weight gradient of a transposed activation: y = s^T @ W, s stored [2, 3, 4, 2], W [4, 5]
s_, w = torch.randn(2, 3, 4, 2, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
dy = torch.randn(2, 3, 2, 5, dtype=torch.float64)
emit("wg_s", s_.flatten())
emit("wg_w", w.flatten())
emit("wg_dy", dy.flatten())
emit("wg_y", torch.matmul(s_.transpose(-1, -2), w).flatten())
ds, dw = grad_of(lambda s, w: torch.matmul(s.transpose(-1, -2), w), s_, w, dy=dy)
emit("wg_ds", ds.flatten())
emit("wg_dw", dw.flatten())


# rotary embeddings on [B, S, H, Dh] (Hugging Face's unsqueeze_dim = 2), position ids [B, S]
def rotate_half(h):
    h1, h2 = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
    return torch.cat((-h2, h1), dim=-1)


def rope64(x, pos, theta, rot):
    inv = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    ang = pos.double()[..., None] * inv
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().unsqueeze(2), emb.sin().unsqueeze(2)
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


def rope_hf32(x, pos, theta):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb, float32 throughout."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_exp = inv_freq[None, :, None].float().expand(pos.shape[0], -1, 1)
    freqs = (inv_exp.float() @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(2), emb.sin().unsqueeze(2)
    x = x.float()
    return (x * cos) + (rotate_half(x) * sin)


B, S, H, D = 2, 5, 3, 8
x = torch.randn(B, S, H, D, dtype=torch.float64)
pos = torch.tensor([[0, 1, 2, 3, 4], [100, 1000, 4095, 7, 65535]])
dy = torch.randn(B, S, H, D, dtype=torch.float64)
emit("rope_x", x.flatten())
emit("rope_pos", pos.flatten())
emit("rope_dy", dy.flatten())
emit("rope_y64", rope64(x, pos, 10000.0, D).flatten())
# theta 500000 (Llama 3): inv_freq is not a round decimal, so float and exact angles round apart
emit("rope_y32", rope_hf32(x, pos, 500000.0).flatten())
emit("rope_y64_5e5", rope64(x, pos, 500000.0, D).flatten())
emit("rope_dx64", grad_of(lambda a: rope64(a, pos, 10000.0, D), x, dy=dy)[0].flatten())
emit("rope_y64_rot4", rope64(x, pos, 500000.0, 4).flatten())
emit("rope_y64_arange", rope64(x, torch.arange(S).expand(B, S), 10000.0, D).flatten())

# mse and l1, mean reduction; one pair equal (l1's gradient is 0 there)
x, tg = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
tg[0, 0] = x[0, 0]
emit("pl_x", x.flatten())
emit("pl_t", tg.flatten())
for name, f in [("mse", F.mse_loss), ("l1", F.l1_loss)]:
    emit("pl_" + name, [f(x, tg)])
    dx, dt = grad_of(f, x, tg, dy=t(1.0))
    emit("pl_" + name + "_dx", dx.flatten())
    emit("pl_" + name + "_dt", dt.flatten())

# cross-entropy over classes with an ignored label (-100): the mean is over the other rows
x = torch.randn(6, 4, dtype=torch.float64) * 3
lab = torch.tensor([0, 3, -100, 2, 1, 3])
emit("cec_logits", x.flatten())
emit("cec_labels", lab)
emit("cec_loss", [F.cross_entropy(x, lab)])
emit("cec_dlogits", grad_of(lambda a: F.cross_entropy(a, lab), x, dy=t(1.0))[0].flatten())

print("\n".join(out))
