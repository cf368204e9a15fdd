#!/usr/bin/python3
"""check_generate.py: `PROG --generate TEXT` (planc build --generate; docs/generate.md) against
PyTorch, token for token.

  check_generate.py PLANC REPO_ROOT

For examples/gpt.plan's model (learned positions, tied head) and examples/llama.plan's (RoPE,
grouped-query attention, SwiGLU, untied head), each trained a few steps by its program (--save):
  - greedy generation from the saved weights equals greedy decoding in PyTorch, where PyTorch runs
    the whole forward again over the prefix for every token (no cache): the same tokens, and every
    step's logits within 1e-5 (the program's key/value cache against the full recomputation);
  - the tensor-parallel plan's program (tp2, mpirun -np 2) generates the same tokens from the same
    file; a checkpoint directory tp2 wrote (--resume) gives the logits its --save file gives; sampling (temperature, top-k, seed) gives the same tokens on 1 and 2 ranks and on a
    second run, another sequence under another seed, and stays inside the top k;
and the errors: an empty prompt, --max-tokens past the context, a prompt byte outside a smaller
vocabulary, a program built without --generate, an encoder at planc build --generate, and
--generate with the LLVM back end. Needs Debian's python3-torch (exit 77 without it).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch ({e}): install python3-torch and use /usr/bin/python3")
    sys.exit(77)

r = harness.Runner("generate")
env = harness.mpi_env()
ex = f"{r.root}/examples"
PROMPT = "The king said "
torch.set_default_dtype(torch.float32)


def build(src, plan, *flags):
    prog = f"{r.work}/{os.path.basename(src)[:-5]}_{plan}"
    p = subprocess.run([r.planc, "build", src, "--plan", plan, "--generate", "-o", prog, *flags], capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(f"FAIL: planc build {src} --plan {plan} --generate: {p.stderr}")
    return prog


def run(prog, *args, np=1, check=True):
    launch = ["mpirun", "-np", str(np)] if np > 1 else []
    p = subprocess.run([*launch, prog, *args], capture_output=True, text=True, env=env, timeout=600)
    if check and p.returncode:
        raise SystemExit(f"FAIL: {prog} {' '.join(args)}: {p.stderr[-2000:]}")
    return p


def generate(prog, weights, n, *extra, np=1):
    logits = f"{r.work}/logits-{os.path.basename(prog)}-{np}.f32"
    out = run(prog, "--generate", PROMPT, "--max-tokens", str(n), "--init", weights, "--print-ids", "--logits", logits,
              *extra, np=np).stdout
    raw = open(logits, "rb").read()
    return [int(t) for t in out.split()], torch.frombuffer(bytearray(raw), dtype=torch.float32)


def trained(prog, steps=30):
    w = f"{r.work}/{os.path.basename(prog)}-trained.safetensors"
    run(prog, "--steps", str(steps), "--data", r.data, "--save", w)
    return w


def load(path):
    out = {}
    for name, (dtype, shape, raw) in harness.read_safetensors(path).items():
        out[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
    return out


def gpt_forward(w, tokens, D=128, H=4, L=4):
    """examples/gpt.plan's model (P = 0) in PyTorch: logits of every position, the whole prefix"""
    S = len(tokens)
    t = torch.tensor([tokens])
    x = F.embedding(t, w["wte"]) + w["wpe"][:S]
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    split = lambda a: a.view(1, S, H, D // H).transpose(1, 2)  # noqa: E731
    for i in range(L):
        p = f"layers.{i}.block."
        h = F.layer_norm(x, (D,), w[p + "layernorm.weight"], w[p + "layernorm.bias"], eps=1e-5)
        q, k, v = (split(h @ w[p + f"attention.w{n}"] + w[p + f"attention.b{n}"]) for n in "qkv")
        probs = torch.softmax((q @ k.transpose(-1, -2) / (D // H) ** 0.5).masked_fill(mask, float("-inf")), -1)
        x = x + ((probs @ v).transpose(1, 2).reshape(1, S, D) @ w[p + "attention.wo"] + w[p + "attention.bo"])
        h = F.layer_norm(x, (D,), w[p + "layernorm_1.weight"], w[p + "layernorm_1.bias"], eps=1e-5)
        x = x + (F.gelu(h @ w[p + "mlp.w1"] + w[p + "mlp.b1"]) @ w[p + "mlp.w2"] + w[p + "mlp.b2"])
    return (F.layer_norm(x, (D,), w["layernorm.weight"], w["layernorm.bias"], eps=1e-5) @ w["wte"].T)[0]


def llama_forward(w, tokens, D=64, H=4, K=2, L=2):
    """examples/llama.plan's model in PyTorch (Hugging Face's Llama arithmetic: RMSNorm eps 1e-6,
    rotate_half RoPE with theta 1e4, repeat_kv, SwiGLU), the whole prefix"""
    S, Dh = len(tokens), D // H
    inv = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2).float() / Dh))
    ang = torch.arange(S).float()[:, None] * inv[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    rot = lambda a: a * cos + torch.cat((-a[..., Dh // 2:], a[..., :Dh // 2]), -1) * sin  # noqa: E731
    rms = lambda a, g: g * (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6))  # noqa: E731
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    x = F.embedding(torch.tensor([tokens]), w["wte"])
    for i in range(L):
        p = f"layers.{i}.llama_block."
        h = rms(x, w[p + "rmsnorm.weight"])
        q = rot((h @ w[p + "gqa_attention.wq"]).view(1, S, H, Dh).transpose(1, 2))
        k = rot((h @ w[p + "gqa_attention.wk"]).view(1, S, K, Dh).transpose(1, 2)).repeat_interleave(H // K, 1)
        v = (h @ w[p + "gqa_attention.wv"]).view(1, S, K, Dh).transpose(1, 2).repeat_interleave(H // K, 1)
        probs = torch.softmax((q @ k.transpose(-1, -2) / Dh ** 0.5).masked_fill(mask, float("-inf")), -1)
        x = x + (probs @ v).transpose(1, 2).reshape(1, S, D) @ w[p + "gqa_attention.wo"]
        h = rms(x, w[p + "rmsnorm_1.weight"])
        x = x + (F.silu(h @ w[p + "swiglu.w_gate"]) * (h @ w[p + "swiglu.w_up"])) @ w[p + "swiglu.w_down"]
    return (rms(x, w["rmsnorm.weight"]) @ w["lm_head"])[0]


def torch_greedy(forward, w, n):
    """greedy decoding without a cache: the full forward over the prefix for every new token"""
    tokens, steps = [ord(c) for c in PROMPT], []
    with torch.no_grad():
        for _ in range(n):
            logits = forward(w, tokens)[-1]
            steps.append(logits)
            tokens.append(int(torch.argmax(logits)))
    return tokens[len(PROMPT):], torch.stack(steps)


def check_model(name, src, single, tp, forward, n):
    prog = build(src, single)
    weights = trained(prog)
    ids, logits = generate(prog, weights, n)
    ref, ref_logits = torch_greedy(forward, load(weights), n)
    r.check(f"{name}: greedy tokens = PyTorch's, token for token ({n} tokens)", ids == ref, f"{ids} vs {ref}")
    diff = (logits.view(n, -1) - ref_logits).abs().max().item() if logits.numel() == ref_logits.numel() else 1e9
    r.check(f"{name}: every step's logits (key/value cache) = PyTorch's full forward over the prefix within 1e-5",
            diff <= 1e-5, f"max |diff| {diff:.2e}")
    tp_prog = build(src, tp)
    tp_ids, _ = generate(tp_prog, weights, n, np=2)
    r.check(f"{name}: plan {tp} on 2 ranks generates the same tokens as {single}", tp_ids == ids, f"{tp_ids}")
    sample = ("--temperature", "0.8", "--top-k", "5", "--seed", "7")
    s1 = generate(prog, weights, n, *sample)[0]
    s1b = generate(prog, weights, n, *sample)[0]
    s2 = generate(tp_prog, weights, n, *sample, np=2)[0]
    other = generate(prog, weights, n, "--temperature", "0.8", "--top-k", "5", "--seed", "8")[0]
    r.check(f"{name}: sampling (T 0.8, top-k 5, seed 7) is the same on a second run and on {tp}", s1 == s1b == s2,
            f"{s1} / {s2}")
    r.check(f"{name}: another seed draws another sequence", other != s1, f"{other}")
    return prog, weights


gpt, gpt_w = check_model("gpt", f"{ex}/gpt.plan", "single_nodropout", "tp2", gpt_forward, 24)

# from a checkpoint: tp2 trains with --save-every; the single-rank program generates from the
# checkpoint directory (read as a resharding resume reads it) exactly as from the same run's --save
tp2 = f"{r.work}/gpt_tp2"
ckpt, saved = f"{r.work}/ckpt-tp2", f"{r.work}/tp2-final.safetensors"
run(tp2, "--steps", "10", "--data", r.data, "--save-every", "10", ckpt, "--save", saved, np=2)
logits_path = f"{r.work}/resume.f32"
from_ckpt = run(gpt, "--generate", PROMPT, "--max-tokens", "8", "--resume", ckpt, "--print-ids", "--logits",
                logits_path).stdout.split()
ckpt_logits = open(logits_path, "rb").read()
from_file = run(gpt, "--generate", PROMPT, "--max-tokens", "8", "--init", saved, "--print-ids", "--logits",
                logits_path).stdout.split()
r.check("gpt: generating from tp2's checkpoint directory (--resume) = from its --save file, logits bit for bit",
        from_ckpt == from_file and ckpt_logits == open(logits_path, "rb").read(), f"{from_ckpt} / {from_file}")
check_model("llama", f"{ex}/llama.plan", "single", "tp2", llama_forward, 12)

# a bf16 plan's program (bf16 storage: the decode program's attention and logits take f32 copies, cast
# as every f32 kernel's operands are; it printed bf16 buffers into their f32 calls, and no C compiler
# took it) generates from the f32 weights, its logits within bf16's rounding of the f32 program's
bf16 = build(f"{ex}/gpt.plan", "bf16")
bf16_ids, bf16_logits = generate(bf16, gpt_w, 8)
f32_ids, f32_logits = generate(gpt, gpt_w, 8)
spread = f32_logits.abs().max().item()
diff = (bf16_logits - f32_logits).abs().max().item() if bf16_logits.shape == f32_logits.shape else 1e9
r.check("gpt bf16: planc build --generate builds it, and its 8 steps' logits are within 5% of the largest of the "
        "f32 program's", len(bf16_ids) == 8 and diff <= 0.05 * spread, f"max |diff| {diff:.3g} of {spread:.3g}; "
        f"tokens {bf16_ids} / {f32_ids}")


def fails(what, p, want):
    r.check(f"error: {what}", p.returncode != 0 and want in p.stderr and "Traceback" not in p.stderr,
            p.stderr.strip()[-400:])


fails("an empty prompt", run(gpt, "--generate", "", "--init", gpt_w, check=False), "the prompt is empty")
fails("--max-tokens past the context (64)", run(gpt, "--generate", PROMPT, "--max-tokens", "60", check=False),
      "more than the model's context of 64")
fails("--max-tokens 0", run(gpt, "--generate", PROMPT, "--max-tokens", "0", check=False), "--max-tokens needs")
# the programs that only refuse (a vocabulary, a missing decode program) are one narrow layer: less to compile
small = f"{r.work}/small.plan"
with open(small, "w") as f:
    f.write(open(f"{ex}/gpt.plan").read().split("# ---- one rank")[0]
            + "plan small for gpt(V = 64, P = 0.0, L = 1, D = 32) {\n  mesh data = 1\n  batch B = 4\n  optimizer sgd(lr = 0.1)\n}\n")
fails("a prompt byte outside the vocabulary (V = 64)", run(build(small, "small"), "--generate", "hello", check=False),
      "outside the model's vocabulary of 64")
wide = f"{r.work}/wide.plan"
with open(wide, "w") as f:
    f.write(open(f"{ex}/gpt.plan").read().split("# ---- one rank")[0]
            + "plan wide for gpt(V = 512, P = 0.0, L = 1, D = 32) {\n  mesh data = 1\n  batch B = 4\n  optimizer sgd(lr = 0.1)\n}\n")
fails("a vocabulary of tokenized data (V = 512): bytes are not its ids", run(build(wide, "wide"), "--generate", "hello",
                                                                            check=False),
      "cannot take a text prompt yet")
plain = f"{r.work}/plain"
subprocess.run([r.planc, "build", f"{ex}/gpt.plan", "--plan", "single", "-o", plain, "--model-arg", "L=1"], check=True)
fails("a program built without --generate", run(plain, "--generate", PROMPT, check=False), "rebuild it with planc build")
p = subprocess.run([r.planc, "build", f"{ex}/bert.plan", "--generate", "-o", f"{r.work}/bert"], capture_output=True,
                   text=True)
fails("an encoder at planc build --generate", p, "an encoder cannot generate")
p = subprocess.run([r.planc, "build", f"{ex}/gpt.plan", "--plan", "single", "--generate", "--backend", "llvm", "-o",
                    f"{r.work}/llvm"], capture_output=True, text=True)
fails("--generate with the LLVM back end", p, "--generate builds with the C back end")
r.finish()
