"""torch_gpt.py: bench/gpu/gpt350m.plan's model in PyTorch eager, timed on the same GPU (for
scripts/gpu-check.sh). The same computation as the planc program: pre-LN GPT blocks (q, k, v, o
projections with biases, causal softmax attention written out as the program computes it, GELU erf
MLP), tied head, cross-entropy; f32 parameters and AdamW (lr 3e-4, betas 0.9 0.95, weight decay 0.1,
clip 1.0), bf16 autocast for the matrix products (torch's mixed precision, as the plan's bf16 with
f32 master weights). Also timed with F.scaled_dot_product_attention (flash attention: an algorithm
the planc program does not use), for reference. Prints one line per variant:
  torch eager (MODE): STEP_MS ms/step, TOKENS tokens/s, peak PEAK GiB
Usage: torch_gpt.py [STEPS] [WARMUP]"""
import math
import sys
import time

import torch
import torch.nn.functional as F

V, S, D, H, L, B = 50304, 1024, 1024, 16, 24, 8


def params(device):
    g = torch.Generator(device="cpu").manual_seed(1234)
    w = {"wte": torch.randn(V, D, generator=g) * 0.02, "wpe": torch.randn(S, D, generator=g) * 0.02,
         "layernorm.weight": torch.ones(D), "layernorm.bias": torch.zeros(D)}
    for i in range(L):
        p = f"layers.{i}."
        for n in ("wq", "wk", "wv", "wo"):
            w[p + n] = torch.randn(D, D, generator=g) * 0.02
        for n in ("bq", "bk", "bv", "bo", "b2", "ln1.bias", "ln2.bias"):
            w[p + n] = torch.zeros(D)
        w[p + "ln1.weight"] = torch.ones(D)
        w[p + "ln2.weight"] = torch.ones(D)
        w[p + "w1"] = torch.randn(D, 4 * D, generator=g) * 0.02
        w[p + "b1"] = torch.zeros(4 * D)
        w[p + "w2"] = torch.randn(4 * D, D, generator=g) * 0.02
    return {k: v.to(device).requires_grad_() for k, v in w.items()}


def loss_of(w, tokens, targets, sdpa, mask):
    x = F.embedding(tokens, w["wte"]) + w["wpe"]
    split = lambda t: t.view(B, S, H, D // H).transpose(1, 2)
    for i in range(L):
        p = f"layers.{i}."
        h = F.layer_norm(x, (D,), w[p + "ln1.weight"], w[p + "ln1.bias"], eps=1e-5)
        q, k, v = (split(h @ w[p + n] + w[p + b]) for n, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(D // H))
            a = torch.softmax(scores.masked_fill(mask, float("-inf")).float(), dim=-1).to(v.dtype) @ v
        x = x + (a.transpose(1, 2).reshape(B, S, D) @ w[p + "wo"] + w[p + "bo"])
        h = F.layer_norm(x, (D,), w[p + "ln2.weight"], w[p + "ln2.bias"], eps=1e-5)
        x = x + (F.gelu(h @ w[p + "w1"] + w[p + "b1"]) @ w[p + "w2"] + w[p + "b2"])
    x = F.layer_norm(x, (D,), w["layernorm.weight"], w["layernorm.bias"], eps=1e-5)
    return F.cross_entropy((x @ w["wte"].T).float().reshape(-1, V), targets.reshape(-1))


def run(sdpa, steps, warmup):
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    w = params(dev)
    opt = torch.optim.AdamW(list(w.values()), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool, device=dev), diagonal=1)
    g = torch.Generator(device="cpu").manual_seed(1)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):
        tokens = torch.randint(0, 256, (B, S + 1), generator=g).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(w, tokens[:, :-1], tokens[:, 1:], sdpa, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    mode = "flash attention (F.scaled_dot_product_attention)" if sdpa else "same attention math"
    print(f"torch eager ({mode}): {step_s * 1e3:.1f} ms/step, {B * S / step_s:.0f} tokens/s, peak {peak:.2f} GiB, "
          f"loss {loss.item():.4f}", flush=True)
    del w, opt
    torch.cuda.empty_cache()


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}; GPT {V} {S} {D} {H} {L}, batch {B}", flush=True)
    run(False, steps, warmup)
    run(True, steps, warmup)
