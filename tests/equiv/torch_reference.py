#!/usr/bin/python3
"""An independent reference: examples/gpt.plan's model written in PyTorch (torch.nn.functional
semantics, DESIGN 1.6), trained from the same initial weights on the same batches as the program
planc builds for plan `single_nodropout`, must give the same loss at every step.

The initial weights are drawn by PyTorch and written as a safetensors file the way the safetensors
library lays one out (8-byte header length, JSON header with __metadata__ and data offsets,
little-endian data); the program starts from it with --init, and its final --save is read back
here: both directions of safetensors interoperability. The batches are drawn with the same counter-based sampler as planrt's data
loader (Philox-4x32-10 keyed by the seed, counter (sample, step)), reimplemented here; the
optimizer is torch.optim.AdamW with clip_grad_norm_, as the plan says. Needs python3-torch
(Debian's 1.13, run with /usr/bin/python3); when torch cannot be imported it prints a SKIP line and
exits 77, which tests/tests.cmake registers as ctest's SKIP_RETURN_CODE (reported as skipped).
usage: torch_reference.py PLANC REPO_ROOT [STEPS]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch ({e}): install Debian's python3-torch "
          "(apt-get install python3-torch, or scripts/deps.sh) and run this with /usr/bin/python3")
    sys.exit(77)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
V, S, D, H, L, B = 256, 64, 128, 4, 4, 16
SEED = 1234
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
torch.set_num_threads(1)
work = tempfile.mkdtemp(prefix="planc-torch-")


def philox(seed, key, counter):
    M = 0xFFFFFFFF
    k0, k1 = seed & M, (seed >> 32) & M
    c0, c1, c2, c3 = counter & M, (counter >> 32) & M, key & M, (key >> 32) & M
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M, p1 & M, ((p0 >> 32) ^ c3 ^ k1) & M, p0 & M
        k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
    return c0, c1, c2, c3


def batch(data, step):
    npos = len(data) - S - 1
    toks, tgts = [], []
    for i in range(B):
        x = philox(SEED, step, i)
        pos = (x[0] | (x[1] << 32)) % npos
        toks.append(data[pos:pos + S])
        tgts.append(data[pos + 1:pos + S + 1])
    return torch.tensor(toks, dtype=torch.long), torch.tensor(tgts, dtype=torch.long)


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        vals = struct.unpack(f"<{(hi - lo) // 4}f", blob[8 + n + lo:8 + n + hi])
        out[name] = torch.tensor(vals, dtype=torch.float32).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        raw = struct.pack(f"<{tensors[name].numel()}f", *tensors[name].detach().reshape(-1).tolist())
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def forward(w, tokens, targets):
    x = F.embedding(tokens, w["wte"]) + w["wpe"]
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    for i in range(L):
        p = f"layers.{i}.block."
        h = F.layer_norm(x, (D,), w[p + "layernorm.weight"], w[p + "layernorm.bias"], eps=1e-5)
        q = h @ w[p + "attention.wq"] + w[p + "attention.bq"]
        k = h @ w[p + "attention.wk"] + w[p + "attention.bk"]
        v = h @ w[p + "attention.wv"] + w[p + "attention.bv"]
        split = lambda t: t.view(B, S, H, D // H).transpose(1, 2)
        scores = split(q) @ split(k).transpose(-1, -2) * (1.0 / (D // H) ** 0.5)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        a = (probs @ split(v)).transpose(1, 2).reshape(B, S, D)
        x = x + (a @ w[p + "attention.wo"] + w[p + "attention.bo"])
        h = F.layer_norm(x, (D,), w[p + "layernorm_1.weight"], w[p + "layernorm_1.bias"], eps=1e-5)
        h = F.gelu(h @ w[p + "mlp.w1"] + w[p + "mlp.b1"])
        x = x + (h @ w[p + "mlp.w2"] + w[p + "mlp.b2"])
    x = F.layer_norm(x, (D,), w["layernorm.weight"], w["layernorm.bias"], eps=1e-5)
    return F.cross_entropy((x @ w["wte"].T).reshape(-1, V), targets.reshape(-1))


prog = f"{work}/gpt"
subprocess.run([planc, "build", f"{root}/examples/gpt.plan", "--plan", "single_nodropout", "-o", prog], check=True)
corpus = f"{root}/data/corpus.txt"
# the model's parameter names and shapes, from the program itself
subprocess.run([prog, "--steps", "0", "--data", corpus, "--save", f"{work}/shapes.safetensors"], check=True, env=env,
               capture_output=True)
torch.manual_seed(0)
init = {}
for name, t in read_safetensors(f"{work}/shapes.safetensors").items():
    scale_one = name.endswith(("layernorm.weight", "layernorm_1.weight"))
    init[name] = (1.0 if scale_one else 0.0) + (0.1 if scale_one else 0.02) * torch.randn(t.shape)
write_safetensors(f"{work}/init.safetensors", init)
subprocess.run([prog, "--steps", str(steps), "--data", corpus, "--init", f"{work}/init.safetensors",
                "--log", f"{work}/run.jsonl", "--save", f"{work}/final.safetensors"], check=True, env=env,
               capture_output=True)
planc_losses = [json.loads(line)["loss"] for line in open(f"{work}/run.jsonl")]

w = {k: v.clone().requires_grad_() for k, v in init.items()}
opt = torch.optim.AdamW(list(w.values()), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
data = list(open(corpus, "rb").read())
torch_losses = []
for step in range(steps):
    tokens, targets = batch(data, step)
    opt.zero_grad()
    loss = forward(w, tokens, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
    opt.step()
    torch_losses.append(loss.item())
final = read_safetensors(f"{work}/final.safetensors")
wworst = max((final[k] - w[k].detach()).abs().max().item() for k in w)

worst = max(abs(a - b) / abs(b) for a, b in zip(planc_losses, torch_losses))
ok = len(planc_losses) == steps and worst <= 1e-5 and wworst <= 1e-4
print(f"{'PASS' if ok else 'FAIL'}: GPT trained by planc vs PyTorch {torch.__version__} from PyTorch's weights: "
      f"{steps} steps, losses {planc_losses[0]:.6f} -> {planc_losses[-1]:.6f}, worst relative difference {worst:.2e} "
      f"(tolerance 1e-5); final weights differ by at most {wworst:.2e} (tolerance 1e-4)")
print(f"{int(ok)} passed, {int(not ok)} failed")
sys.exit(0 if ok else 1)
