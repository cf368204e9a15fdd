"""torch_bench.py: bench/gpu's two models in PyTorch, timed on the GPU beside planc's programs
(scripts/gpu-check.sh, issue 17's table), and the arithmetic they time held to planc's program on
the CPU (tests/torch/torch_reference.py, model "bench": each model's `f32` plan at a small size,
trained from the same weights on the same batches, every loss within 1e-5).

  gpt350m  bench/gpu/gpt350m.plan: pre-LN GPT blocks (q, k, v, o projections with biases, causal
           softmax attention, GELU (erf) MLP), learned positions, tied head, no dropout
  llama1b  bench/gpu/llama1b.plan: RMS norm, rotary embeddings (rotate_half, theta 10000),
           grouped-query attention, SwiGLU, no biases, untied head
Both take planc's parameter names and layouts (a matrix is [in, out], used as x @ w), so that a
program's --save loads as it is. Each is trained as its plan says: AdamW (lr 3e-4, betas 0.9 0.95,
weight decay 0.1), gradient norm clipped at 1.0, f32 parameters; on the GPU under bf16 autocast
(PyTorch's mixed precision: the plans' `precision bf16, master = f32`), TF32 off.

Modes (what issue 17 compares planc with):
  eager    the attention written out as planc's program computes it: scores, causal mask, softmax
           in f32, @ v
  sdpa     F.scaled_dot_product_attention (flash attention: a fused kernel planc's CUDA program
           does not have yet)
  compile  torch.compile of the sdpa loss (inductor's fused kernels; the optimizer step stays
           eager, as torch.compile users run it); its compilation happens in the warm-up steps
Prints one line a mode:
  torch MODEL MODE: STEP_MS ms/step, TOKENS tokens/s, peak PEAK GiB, loss LOSS
usage: torch_bench.py MODEL [STEPS [WARMUP]] [--modes eager,sdpa,compile] [--device cuda|cpu]
                      [--size NAME=VALUE,...]   (cpu: a run to see that it works, not a figure)
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

# the plans' sizes and batch (bench/gpu/*.plan)
CONFIGS = {"gpt350m": dict(V=50304, S=1024, D=1024, H=16, L=24, B=8),
           "llama1b": dict(V=32000, S=1024, D=2048, H=16, K=4, F=5632, L=20, B=8)}
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)


def gpt_shapes(c):
    """{name: (shape, init)} of bench/gpu/gpt350m.plan's parameters; init "normal" is N(0, 0.02)"""
    V, S, D, L = c["V"], c["S"], c["D"], c["L"]
    out = {"wte": ([V, D], "normal"), "wpe": ([S, D], "normal"), "layernorm.weight": ([D], "ones"),
           "layernorm.bias": ([D], "zeros")}
    for i in range(L):
        p = f"layers.{i}.block."
        for n in ("wq", "wk", "wv", "wo"):
            out[p + "attention." + n] = ([D, D], "normal")
        for n in ("bq", "bk", "bv", "bo"):
            out[p + "attention." + n] = ([D], "zeros")
        for n in ("layernorm", "layernorm_1"):
            out[p + n + ".weight"], out[p + n + ".bias"] = ([D], "ones"), ([D], "zeros")
        out[p + "mlp.w1"], out[p + "mlp.b1"] = ([D, 4 * D], "normal"), ([4 * D], "zeros")
        out[p + "mlp.w2"], out[p + "mlp.b2"] = ([4 * D, D], "normal"), ([D], "zeros")
    return out


def llama_shapes(c):
    """{name: (shape, init)} of bench/gpu/llama1b.plan's parameters"""
    V, D, H, K, F_, L = c["V"], c["D"], c["H"], c["K"], c["F"], c["L"]
    Dkv = K * (D // H)
    out = {"wte": ([V, D], "normal"), "lm_head": ([D, V], "normal"), "rmsnorm.weight": ([D], "ones")}
    for i in range(L):
        p = f"layers.{i}.llama_block."
        for n, shape in (("wq", [D, D]), ("wk", [D, Dkv]), ("wv", [D, Dkv]), ("wo", [D, D])):
            out[p + "gqa_attention." + n] = (shape, "normal")
        for n, shape in (("w_gate", [D, F_]), ("w_up", [D, F_]), ("w_down", [F_, D])):
            out[p + "swiglu." + n] = (shape, "normal")
        out[p + "rmsnorm.weight"], out[p + "rmsnorm_1.weight"] = ([D], "ones"), ([D], "ones")
    return out


def attention(q, k, v, sdpa):
    """causal attention of q, k, v [B, heads, S, Dh]: planc's arithmetic, or the fused kernel"""
    if sdpa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    S = q.shape[-2]
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool, device=q.device), diagonal=1)
    scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(scores.masked_fill(mask, float("-inf")).float(), dim=-1).to(v.dtype) @ v


def gpt_loss(w, tokens, targets, c, sdpa):
    B, S, D, H = tokens.shape[0], tokens.shape[1], c["D"], c["H"]
    split = lambda t: t.view(B, S, H, D // H).transpose(1, 2)
    x = F.embedding(tokens, w["wte"]) + w["wpe"]
    for i in range(c["L"]):
        p = f"layers.{i}.block."
        a = p + "attention."
        h = F.layer_norm(x, (D,), w[p + "layernorm.weight"], w[p + "layernorm.bias"], eps=1e-5)
        q, k, v = (split(h @ w[a + "w" + n] + w[a + "b" + n]) for n in "qkv")
        y = attention(q, k, v, sdpa).transpose(1, 2).reshape(B, S, D)
        x = x + (y @ w[a + "wo"] + w[a + "bo"])
        h = F.layer_norm(x, (D,), w[p + "layernorm_1.weight"], w[p + "layernorm_1.bias"], eps=1e-5)
        x = x + (F.gelu(h @ w[p + "mlp.w1"] + w[p + "mlp.b1"]) @ w[p + "mlp.w2"] + w[p + "mlp.b2"])
    x = F.layer_norm(x, (D,), w["layernorm.weight"], w["layernorm.bias"], eps=1e-5)
    return F.cross_entropy((x @ w["wte"].T).float().reshape(-1, c["V"]), targets.reshape(-1))


def rms_norm(x, weight, eps=1e-6):
    return weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype))


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def llama_loss(w, tokens, targets, c, sdpa):
    B, S, D, H, K = tokens.shape[0], tokens.shape[1], c["D"], c["H"], c["K"]
    Dh = D // H
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2, dtype=torch.int64, device=tokens.device).float() / Dh))
    angles = torch.arange(S, dtype=torch.int64, device=tokens.device).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    x = F.embedding(tokens, w["wte"])
    for i in range(c["L"]):
        p = f"layers.{i}.llama_block."
        a = p + "gqa_attention."
        h = rms_norm(x, w[p + "rmsnorm.weight"])
        q = rope((h @ w[a + "wq"]).view(B, S, H, Dh).transpose(1, 2), cos, sin)
        k = rope((h @ w[a + "wk"]).view(B, S, K, Dh).transpose(1, 2), cos, sin).repeat_interleave(H // K, dim=1)
        v = (h @ w[a + "wv"]).view(B, S, K, Dh).transpose(1, 2).repeat_interleave(H // K, dim=1)
        x = x + attention(q, k, v, sdpa).transpose(1, 2).reshape(B, S, D) @ w[a + "wo"]
        h = rms_norm(x, w[p + "rmsnorm_1.weight"])
        x = x + (F.silu(h @ w[p + "swiglu.w_gate"]) * (h @ w[p + "swiglu.w_up"])) @ w[p + "swiglu.w_down"]
    logits = rms_norm(x, w["rmsnorm.weight"]) @ w["lm_head"]
    return F.cross_entropy(logits.float().reshape(-1, c["V"]), targets.reshape(-1))


MODELS = {"gpt350m": (gpt_shapes, gpt_loss), "llama1b": (llama_shapes, llama_loss)}


def init(name, c, device):
    """the model's parameters drawn as its plan draws them (not the same numbers: a timing run)"""
    g = torch.Generator(device="cpu").manual_seed(1234)
    w = {}
    for n, (shape, how) in MODELS[name][0](c).items():
        t = torch.randn(shape, generator=g) * 0.02 if how == "normal" else torch.full(shape, 1.0 if how == "ones" else 0.0)
        w[n] = t.to(device).requires_grad_()
    return w


def run(name, c, mode, steps, warmup, device):
    """trains the model warmup + steps steps in a mode on random tokens; prints the line"""
    cuda = device == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    w = init(name, c, device)
    opt = torch.optim.AdamW(list(w.values()), **ADAMW)
    loss_fn = MODELS[name][1]
    step_loss = lambda tokens: loss_fn(w, tokens[:, :-1], tokens[:, 1:], c, mode != "eager")
    if mode == "compile":
        step_loss = torch.compile(step_loss)
    g = torch.Generator(device="cpu").manual_seed(1)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):
        tokens = torch.randint(0, 256, (c["B"], c["S"] + 1), generator=g).to(device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            loss = step_loss(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    print(f"torch {name} {mode}: {step_s * 1e3:.1f} ms/step, {c['B'] * c['S'] / step_s:.0f} tokens/s, "
          f"peak {peak:.2f} GiB, loss {loss.item():.4f}", flush=True)
    del w, opt
    if cuda:
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("steps", type=int, nargs="?", default=10)
    ap.add_argument("warmup", type=int, nargs="?", default=3)
    ap.add_argument("--modes", default="eager,sdpa,compile")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="", help="NAME=VALUE,... over the model's sizes (e.g. L=2,D=64)")
    a = ap.parse_args()
    c = dict(CONFIGS[a.model])
    for kv in filter(None, a.size.split(",")):
        k, v = kv.split("=")
        if k not in c:
            ap.error(f"{a.model} has no size {k}: {sorted(c)}")
        c[k] = int(v)
    where = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}; {a.model} {c}", flush=True)
    for mode in a.modes.split(","):
        run(a.model, c, mode, a.steps, a.warmup, a.device)


if __name__ == "__main__":
    main()
