#!/usr/bin/python3
"""An independent reference: models of examples/ written in PyTorch (torch.nn.functional
semantics, docs/architecture.md contract 6), trained from the same initial weights on the same
batches as the programs planc builds, must give the same loss at every step (1e-5 relative) and
the same final weights:
  gpt    examples/gpt.plan, plan single_nodropout (GPT-2 blocks, tied embedding)
  bert   examples/bert.plan, plan single_nodropout: a BERT encoder ([CLS] pooler, classifier over 4
         classes) on the data set data/classify.safetensors (tokens i32 [N, 32], labels i32 [N]),
         against Hugging Face's BertForSequenceClassification arithmetic, trained with the last
         tenth held out; planc's held-out loss and accuracy after the last step equal PyTorch's
         on planc's final weights
  finetune tests/equiv/finetune.plan, plan finetune: buffers (RoPE tables computed at init, a
         buffer of ones) and a frozen parameter; the frozen and buffer tensors must end exactly as
         they began
  ops    tests/equiv/ops.plan, plan single: every op of issue 9 (element-wise functions, slices,
         concat, reshape, transposes, a broadcasting batched matmul, reductions, a transposed
         activation's weight gradient, cross-entropy over classes, mse and l1 losses)
  llama  examples/llama.plan, plan single (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied
         head) against HFLlama, a torch module laid out like Hugging Face's LlamaForCausalLM: the
         program starts from its state_dict() under Hugging Face's names (--init with --map
         stdlib/maps/hf_llama.map), and its --save under the map loads back with
         load_state_dict(strict=True); the fused layout (hf_llama_fused.map) must train bit for bit
         the same, and plans tp2 (fused), dp2_tp2_sp and zero3_dp4 must match the single rank
         from and to the same files
  moe    examples/moe.plan: plan single_nodropout (GELU experts, top-2, capacity factor 1.25 per
         sample: tokens are dropped), plan switch_nodropout (top-1, capacity factor 1.0) and plan
         mixtral_single (SwiGLU experts, top-2 gates normalised, dropless), against a mixture of
         experts written here from docs/moe.md (every first choice before any second choice, per
         sample), with the Switch load-balancing loss and the router z-loss; and every step's
         routing metrics in the log (moe_dropped, moe_load per layer) equal to the reference's
  bench  bench/gpu/gpt350m.plan and bench/gpu/llama1b.plan, plan f32, at a small size (--model-arg),
         against bench/gpu/torch_bench.py's functional models in their `eager` mode (what
         scripts/gpu-check.sh times beside planc's CUDA program): the benchmark's PyTorch side
         computes what planc's program computes

The initial weights are drawn by PyTorch and written as a safetensors file the way the safetensors
library lays one out (8-byte header length, JSON header with __metadata__ and data offsets,
little-endian data); the program starts from it with --init, and its final --save is read back
here: both directions of safetensors interoperability. The batches are drawn with the same counter-based sampler as planrt's data
loader (Philox-4x32-10 keyed by the seed, counter (sample, step)), reimplemented here; the
optimizer is torch.optim.AdamW with clip_grad_norm_, as the plan says. Needs python3-torch
(Debian's 1.13, run with /usr/bin/python3); when torch cannot be imported it prints a SKIP line and
exits 77, which tests/tests.cmake registers as ctest's SKIP_RETURN_CODE (reported as skipped).
usage: torch_reference.py PLANC REPO_ROOT [STEPS [MODEL...]]
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch ({e}): install Debian's python3-torch "
          "(apt-get install python3-torch, or scripts/deps.sh) and run this with /usr/bin/python3")
    sys.exit(77)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
models = sys.argv[4:] or ["gpt", "llama", "bert", "ops", "moe", "finetune", "bench"]
SEED = 1234
env = harness.mpi_env()
torch.set_num_threads(1)
work = harness.workdir("torch")


def philox(seed, key, counter):
    M = 0xFFFFFFFF
    k0, k1 = seed & M, (seed >> 32) & M
    c0, c1, c2, c3 = counter & M, (counter >> 32) & M, key & M, (key >> 32) & M
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M, p1 & M, ((p0 >> 32) ^ c3 ^ k1) & M, p0 & M
        k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
    return c0, c1, c2, c3


def shuffle(seed, epoch, j, n):
    """docs/data.md's permutation, read from the page: a 4-round Feistel network on 2h bits
    (the fewest with 4^h >= n), round r keyed by Philox(seed, 0x7368756666000000 + 4 epoch + r,
    right half), cycle-walked into [0, n)."""
    if n <= 1:
        return 0
    h = 1
    while h < 32 and (1 << (2 * h)) < n:
        h += 1
    mask = (1 << h) - 1
    x = j
    while True:
        left, right = x >> h, x & mask
        for r in range(4):
            f = philox(seed, 0x7368756666000000 + 4 * epoch + r, right)[0]
            left, right = right, left ^ (f & mask)
        x = (left << h) | right
        if x < n:
            return x


def epoch_sample(step, i, B, n):
    """the sample row i of step t reads (sampling by epochs, one source of n samples)"""
    g = step * B + i
    return shuffle(SEED, g // n, g % n, n)


def batch(data, step, B, S):
    # planrt's default sampling (epochs): window k is tokens [k S, k S + S], N = (len - 1) // S
    n = (len(data) - 1) // S
    toks, tgts = [], []
    for i in range(B):
        pos = epoch_sample(step, i, B, n) * S
        toks.append(data[pos:pos + S])
        tgts.append(data[pos + 1:pos + S + 1])
    return torch.tensor(toks, dtype=torch.long), torch.tensor(tgts, dtype=torch.long)


def read_safetensors(path):
    """a safetensors file's F32 and I32 tensors as torch tensors"""
    out = {}
    for name, (dtype, shape, raw) in harness.read_safetensors(path).items():
        kind = {"F32": ("f", torch.float32), "I32": ("i", torch.long)}[dtype]
        out[name] = torch.tensor(struct.unpack(f"<{len(raw) // 4}{kind[0]}", raw), dtype=kind[1]).reshape(shape)
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


def init_like(shapes, ones):
    """torch's draws for every tensor of the program's checkpoint: N(1, 0.1) for norm weights (ones
    at init, so that their gradients matter), N(0, 0.02) for the rest."""
    torch.manual_seed(0)
    out = {}
    for name, t in sorted(shapes.items()):
        one = name.endswith(ones)
        out[name] = (1.0 if one else 0.0) + (0.1 if one else 0.02) * torch.randn(t.shape)
    return out


def program_shapes(prog, extra=(), data=None):
    """The parameter names and shapes of a built program, from its --save at step 0."""
    out = f"{work}/shapes-{os.path.basename(prog)}.safetensors"
    subprocess.run([prog, "--steps", "0", "--data", data or corpus, "--save", out, *extra], check=True, env=env,
                   capture_output=True)
    return read_safetensors(out)


def train_program(prog, init, extra=(), data=None, np=1):
    """Trains the program from init for `steps` steps (on np ranks): its losses and final weights."""
    write_safetensors(f"{work}/init.safetensors", init)
    log, final = f"{work}/{os.path.basename(prog)}.jsonl", f"{work}/{os.path.basename(prog)}-final.safetensors"
    if os.path.exists(log):
        os.unlink(log)
    launch = ["mpirun", "-np", str(np)] if np > 1 else []
    subprocess.run([*launch, prog, "--steps", str(steps), "--data", data or corpus, "--init", f"{work}/init.safetensors",
                    "--log", log, "--save", final, *extra], check=True, env=env, capture_output=True)
    global last_log
    last_log = harness.read_log(log)
    return [x["loss"] for x in last_log], read_safetensors(final)


def train_torch(init, step_loss, adamw, clip=1.0, trained=None):
    """The same training in torch: AdamW (torch.optim) and clip_grad_norm_, as the plans say;
    trained: the tensors that train (default all), the others are frozen or buffers."""
    w = {k: v.clone().requires_grad_(trained is None or k in trained) for k, v in init.items()}
    opt = torch.optim.AdamW([v for v in w.values() if v.requires_grad], **adamw)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = step_loss(w, step)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_([v for v in w.values() if v.requires_grad], clip)
        opt.step()
        losses.append(loss.item())
    return losses, w


def report(what, planc_losses, torch_losses, final, w):
    worst = max(abs(a - b) / abs(b) for a, b in zip(planc_losses, torch_losses))
    wworst = max((final[k] - w[k].detach()).abs().max().item() for k in w)
    ok = len(planc_losses) == steps and worst <= 1e-5 and wworst <= 1e-4
    check(f"{what} trained by planc vs PyTorch {torch.__version__} from PyTorch's weights", ok,
          f"{steps} steps, losses {planc_losses[0]:.6f} -> {planc_losses[-1]:.6f}, worst relative difference "
          f"{worst:.2e} (tolerance 1e-5); final weights differ by at most {wworst:.2e} (tolerance 1e-4)")


tally = harness.Tally("torch reference")
check = tally.check


corpus = f"{root}/data/corpus.txt"
data = list(open(corpus, "rb").read())


def build(plan_file, plan, size=()):
    """the program of plan_file's plan, at size (--model-arg NAME=VALUE ..., the model's own size when empty)"""
    prog = f"{work}/{os.path.basename(plan_file)[:-5]}_{plan}" + "".join(f"_{a.replace('=', '')}" for a in size)
    err = harness.build(planc, plan_file, plan, prog, *harness.model_args(size))
    if err:
        raise SystemExit(f"FAIL: {err}")
    return prog


def run_gpt():
    V, S, D, H, L, B = 256, 64, 128, 4, 4, 16
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)

    def loss_of(w, step):
        tokens, targets = batch(data, step, B, S)
        x = F.embedding(tokens, w["wte"]) + w["wpe"]
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

    prog = build(f"{root}/examples/gpt.plan", "single_nodropout")
    init = init_like(program_shapes(prog), ("layernorm.weight", "layernorm_1.weight"))
    planc_losses, final = train_program(prog, init)
    torch_losses, w = train_torch(init, loss_of, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8))
    report("GPT (examples/gpt.plan)", planc_losses, torch_losses, final, w)


def rope_tables(S, Dh, theta):
    """Hugging Face's LlamaRotaryEmbedding, in float: inv_freq, the angles, cos and sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, Dh, 2, dtype=torch.int64).float() / Dh))
    freqs = torch.arange(S, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, weight, eps):
    """Hugging Face's LlamaRMSNorm"""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class HFLlama(torch.nn.Module):
    """A decoder laid out module for module like Hugging Face's LlamaForCausalLM (transformers'
    modeling_llama.py), so that state_dict() gives its names and layouts (torch.nn.Linear
    [out, in]): model.embed_tokens, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head; its forward is
    LlamaForCausalLM's arithmetic (RMSNorm eps 1e-6, rotary tables in float, rotate_half,
    repeat_kv, causal softmax attention, SwiGLU)."""

    def __init__(self, V, S, D, H, K, F_, L):
        super().__init__()
        nn = torch.nn
        self.H, self.K, self.Dh = H, K, D // H
        self.cos, self.sin = rope_tables(S, D // H, 10000.0)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(V, D)
        self.model.layers = nn.ModuleList()
        for _ in range(L):
            layer = nn.Module()
            layer.input_layernorm, layer.post_attention_layernorm = nn.Module(), nn.Module()
            layer.input_layernorm.weight = nn.Parameter(torch.ones(D))
            layer.post_attention_layernorm.weight = nn.Parameter(torch.ones(D))
            layer.self_attn, layer.mlp = nn.Module(), nn.Module()
            layer.self_attn.q_proj = nn.Linear(D, H * self.Dh, bias=False)
            layer.self_attn.k_proj = nn.Linear(D, K * self.Dh, bias=False)
            layer.self_attn.v_proj = nn.Linear(D, K * self.Dh, bias=False)
            layer.self_attn.o_proj = nn.Linear(H * self.Dh, D, bias=False)
            layer.mlp.gate_proj = nn.Linear(D, F_, bias=False)
            layer.mlp.up_proj = nn.Linear(D, F_, bias=False)
            layer.mlp.down_proj = nn.Linear(F_, D, bias=False)
            self.model.layers.append(layer)
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(D))
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        B, S = tokens.shape
        mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            a = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, 1e-6)
            q = a.q_proj(h).view(B, S, self.H, self.Dh).transpose(1, 2)
            k = a.k_proj(h).view(B, S, self.K, self.Dh).transpose(1, 2)
            v = a.v_proj(h).view(B, S, self.K, self.Dh).transpose(1, 2)
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
            k = k.repeat_interleave(self.H // self.K, dim=1)  # Hugging Face's repeat_kv
            v = v.repeat_interleave(self.H // self.K, dim=1)
            scores = q @ k.transpose(-1, -2) * (1.0 / self.Dh ** 0.5)
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            x = x + a.o_proj((probs @ v).transpose(1, 2).reshape(B, S, self.H * self.Dh))
            h = rms_norm(x, layer.post_attention_layernorm.weight, 1e-6)
            x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
        return self.lm_head(rms_norm(x, self.model.norm.weight, 1e-6))


def fuse(hf):
    """The same weights with fused projections (Phi-3's layout): qkv_proj = cat(q, k, v),
    gate_up_proj = cat(gate, up) along the output dim."""
    out = {}
    for name, t in hf.items():
        for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")):
            if f".{parts[0]}." in name:
                out[name.replace(parts[0], fused)] = torch.cat([hf[name.replace(parts[0], p)] for p in parts], 0)
            if any(f".{p}." in name for p in parts):
                break
        else:
            out[name] = t
    return out


def run_llama():
    """examples/llama.plan from and to checkpoints under Hugging Face's Llama names, against
    HFLlama trained by torch: the initial weights are HFLlama's state_dict() (written as
    safetensors), the program loads them with --map stdlib/maps/hf_llama.map, and its --save
    under the same map must load into a fresh HFLlama with load_state_dict(strict=True)."""
    V, S, D, H, K, F_, L, B = 256, 32, 64, 4, 2, 176, 2, 8
    ref = HFLlama(V, S, D, H, K, F_, L)
    torch.manual_seed(0)
    with torch.no_grad():  # N(1, 0.1) for the norm weights (so that their gradients matter), N(0, 0.02) else
        for name, p in sorted(ref.named_parameters()):
            one = name.endswith("norm.weight")
            p.copy_((1.0 if one else 0.0) + (0.1 if one else 0.02) * torch.randn(p.shape))
    init = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    hf_map, fused_map = f"{root}/stdlib/maps/hf_llama.map", f"{root}/stdlib/maps/hf_llama_fused.map"
    prog = build(f"{root}/examples/llama.plan", "single")
    planc_losses, final = train_program(prog, init, extra=["--map", hf_map])

    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    torch_losses = []
    for step in range(steps):
        tokens, targets = batch(data, step, B, S)
        opt.zero_grad()
        loss = F.cross_entropy(ref(tokens).reshape(-1, V), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 1.0)
        opt.step()
        torch_losses.append(loss.item())
    loaded = HFLlama(V, S, D, H, K, F_, L)
    try:
        loaded.load_state_dict(final, strict=True)
        load_error = ""
    except RuntimeError as e:
        load_error = str(e).splitlines()[0]
    report("Llama (examples/llama.plan: RoPE, GQA, SwiGLU, RMSNorm) from a Hugging Face LlamaForCausalLM state_dict "
           "(--init with --map stdlib/maps/hf_llama.map)", planc_losses, torch_losses, loaded.state_dict(),
           ref.state_dict())
    check("planc's --save under --map hf_llama.map loads into the Hugging Face-layout module with "
          "load_state_dict(strict=True): every name and [out, in] shape as torch.nn.Linear has it",
          not load_error, load_error)

    # fused q/k/v and gate/up (Phi-3's layout): the same run bit for bit, saved fused
    fused_losses, fused_final = train_program(prog, fuse(init), extra=["--map", fused_map])
    want = fuse(final)
    same = fused_losses == planc_losses and set(fused_final) == set(want) and all(
        torch.equal(fused_final[k], want[k]) for k in want)
    check("a checkpoint with fused qkv_proj and gate_up_proj (--map hf_llama_fused.map) trains bit for bit like the "
          "unfused one, and --save writes them fused again", same, f"{len(want)} tensors compared")

    # sharded plans read their blocks of the transposed and fused tensors straight from the file
    for plan, mapping, start in (("tp2", fused_map, fuse(init)), ("dp2_tp2_sp", hf_map, init),
                                 ("zero3_dp4", hf_map, init)):
        sharded = build(f"{root}/examples/llama.plan", plan)
        world = 4 if plan != "tp2" else 2
        losses, saved = train_program(sharded, start, extra=["--map", mapping], np=world)
        want = fuse(final) if mapping == fused_map else final
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, planc_losses))
        wworst = max((saved[k] - want[k]).abs().max().item() for k in want) if set(saved) == set(want) else 1e9
        check(f"Llama {plan} (-np {world}) from and to the Hugging Face checkpoint (--map "
              f"{os.path.basename(mapping)}) against the single rank",
              len(losses) == steps and worst <= 1e-5 and wworst <= 1e-4,
              f"worst loss difference {worst:.2e} relative (1e-5), final weights {wworst:.2e} (1e-4)")


def run_ops():
    V, S, D, H, B = 256, 16, 32, 4, 8

    def loss_of(w, step):
        tokens, targets = batch(data, step, B, S)
        x = F.embedding(tokens, w["wte"]) * w["scale"]
        e = torch.sin(x) + torch.cos(x) * torch.tanh(x) + torch.log(torch.sigmoid(x)) * 0.5 + torch.exp(x * 0.1)
        h = torch.cat([e, x], dim=-1)
        h = h[..., 0:D] * h[:, :, D:2 * D]
        t = h.reshape(B, S, H, D // H).transpose(1, 2)
        u = (t @ w["wb"]).transpose(1, 2).reshape(B, S, D)
        u = u - torch.max(u, -1, keepdim=True).values
        g = u.transpose(-1, -2) @ w["wp"]
        pooled = torch.mean(g, 1) + torch.sum(u, 1) * 0.1 + u[:, 0]
        labels = targets[:, 0]
        return (F.cross_entropy(pooled @ w["head"], labels) + 0.5 * F.mse_loss(u @ w["wr"], x)
                + 0.25 * F.l1_loss(pooled, torch.mean(x, 1)))

    prog = build(f"{root}/tests/equiv/ops.plan", "single")
    shapes = program_shapes(prog)
    init = init_like(shapes, ("scale",))
    init["wb"], init["wp"], init["wr"] = init["wb"] * 15, init["wp"] * 5, init["wr"] * 5
    planc_losses, final = train_program(prog, init)
    torch_losses, w = train_torch(init, loss_of, dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01, eps=1e-8),
                                  clip=0)
    report("every new op (tests/equiv/ops.plan)", planc_losses, torch_losses, final, w)


def moe(h, w, p, E, K, capacity_factor, normalize, dropless, swiglu, drops):
    """A mixture-of-experts layer as docs/moe.md defines it: softmax router, each token's top K,
    per sample (group) an expert takes at most ceil(K S cf / E) pairs, every first choice before any
    second choice; dropped pairs add nothing. Returns the output and the two auxiliary losses, and
    appends to drops the pairs dropped and the pairs routed to each expert (before any drop)."""
    B, S, D = h.shape
    logits = h @ w[p + "router"]
    probs = torch.softmax(logits, dim=-1)
    top_p, top_e = probs.topk(K, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True) if normalize else top_p
    onehot = F.one_hot(top_e, E)  # [B, S, K, E]
    if dropless:
        keep = torch.ones_like(top_e, dtype=torch.bool)
    else:
        cap = -(-K * S * capacity_factor // E)
        order = onehot.permute(0, 2, 1, 3).reshape(B, K * S, E)  # k-major within the sample
        before = (torch.cumsum(order, dim=1) - order).reshape(B, K, S, E).permute(0, 2, 1, 3)
        keep = (before * onehot).sum(-1) < cap
    drops.append((int((~keep).sum()), onehot.sum((0, 1, 2)).tolist()))
    out = torch.zeros_like(h)
    for e in range(E):
        chosen = (top_e == e) & keep
        rows = chosen.any(-1)
        x = h[rows]
        if swiglu:
            y = (F.silu(x @ w[p + "w1"][e]) * (x @ w[p + "w3"][e])) @ w[p + "w2"][e]
        else:
            y = F.gelu(x @ w[p + "w1"][e]) @ w[p + "w2"][e]
        out[rows] += (gates * chosen)[rows].sum(-1, keepdim=True) * y
    f = F.one_hot(top_e[..., 0], E).float().mean(1)  # first choices, per sample
    aux = (E * (f * probs.mean(1)).sum(-1)).mean()
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return out, aux, z


def run_moe():
    V, S, D, H, L, B, E = 256, 64, 128, 4, 2, 16, 4
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)

    def attention(x, w, p):
        q = x @ w[p + "attention.wq"] + w[p + "attention.bq"]
        k = x @ w[p + "attention.wk"] + w[p + "attention.bk"]
        v = x @ w[p + "attention.wv"] + w[p + "attention.bv"]
        split = lambda t: t.view(B, S, H, D // H).transpose(1, 2)
        scores = split(q) @ split(k).transpose(-1, -2) * (1.0 / (D // H) ** 0.5)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        a = (probs @ split(v)).transpose(1, 2).reshape(B, S, D)
        return a @ w[p + "attention.wo"] + w[p + "attention.bo"]

    # (plan, Mixtral-style, top k, capacity factor)
    for plan, mixtral, K, CF in (("single_nodropout", False, 2, 1.25), ("switch_nodropout", False, 1, 1.0),
                                 ("mixtral_single", True, 2, 1.25)):
        drops = []

        def loss_of(w, step):
            tokens, targets = batch(data, step, B, S)
            x = F.embedding(tokens, w["wte"]) + w["wpe"]
            extra = 0
            for i in range(L):
                if mixtral:
                    p = f"layers.{i}.moe_swiglu_block."
                    x = x + attention(rms_norm(x, w[p + "rmsnorm.weight"], 1e-6), w, p)
                    y, aux, z = moe(rms_norm(x, w[p + "rmsnorm_1.weight"], 1e-6), w, p + "moe_swiglu.", E, K, CF,
                                    True, True, True, drops)
                else:
                    p = f"layers.{i}.moe_block."
                    h = F.layer_norm(x, (D,), w[p + "layernorm.weight"], w[p + "layernorm.bias"], eps=1e-5)
                    x = x + attention(h, w, p)
                    h = F.layer_norm(x, (D,), w[p + "layernorm_1.weight"], w[p + "layernorm_1.bias"], eps=1e-5)
                    y, aux, z = moe(h, w, p + "moe.", E, K, CF, False, False, False, drops)
                x = x + y
                extra = extra + 0.01 * aux + 0.001 * z
            x = rms_norm(x, w["rmsnorm.weight"], 1e-6) if mixtral else \
                F.layer_norm(x, (D,), w["layernorm.weight"], w["layernorm.bias"], eps=1e-5)
            return F.cross_entropy((x @ w["wte"].T).reshape(-1, V), targets.reshape(-1)) + extra

        prog = build(f"{root}/examples/moe.plan", plan)
        norms = ("rmsnorm.weight", "rmsnorm_1.weight") if mixtral else ("layernorm.weight", "layernorm_1.weight")
        init = init_like(program_shapes(prog), norms)
        for name in init:  # a router that is not uniform, so that some experts are overloaded
            if name.endswith("router"):
                init[name] = init[name] * 25
        planc_losses, final = train_program(prog, init)
        planc_routing = [(x["moe_dropped"], x["moe_load"]) for x in last_log]
        torch_losses, w = train_torch(init, loss_of, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8))
        what = ("Mixtral-style MoE (examples/moe.plan mixtral_single: SwiGLU experts, normalised top-2, dropless)"
                if mixtral else f"MoE GPT (examples/moe.plan {plan}: top-{K}, capacity factor {CF})")
        dropped = sum(d for d, _ in drops)
        report(f"{what}, {dropped} pairs dropped in torch", planc_losses, torch_losses, final, w)
        # the routing metrics of every step's log line: per layer, the pairs dropped and the pairs
        # routed to each expert, equal to the reference's count (the forward of each step, in order)
        torch_routing = [([d for d, _ in drops[t * L:(t + 1) * L]], [ld for _, ld in drops[t * L:(t + 1) * L]])
                         for t in range(steps)]
        bad = [t for t in range(steps) if planc_routing[t] != torch_routing[t]]
        check_routing = not bad and (mixtral or dropped > 0)
        check(f"{plan} routing metrics (moe_dropped, moe_load) of {steps} log lines", check_routing,
              (f"equal to torch's: {dropped} pairs dropped, loads of step 0 {torch_routing[0][1]}" if not bad else
               f"differ from step {bad[0]}: planc {planc_routing[bad[0]]}, torch {torch_routing[bad[0]]}") +
              ("" if mixtral or dropped else "; the capacity case dropped no pair: it tests nothing"))


def run_bert():
    V, S, D, H, F_, L, C, B = 256, 32, 64, 4, 256, 2, 4, 16
    Dh = D // H
    dataset = f"{root}/data/classify.safetensors"
    ds = read_safetensors(dataset)
    n = ds["tokens"].shape[0]

    def logits_of(w, tokens):
        B = tokens.shape[0]
        x = F.layer_norm(F.embedding(tokens, w["wte"]) + w["wpe"], (D,), w["layernorm.weight"], w["layernorm.bias"],
                         eps=1e-12)
        for i in range(L):
            p = f"layers.{i}.bert_block."
            heads = lambda t: t.view(B, S, H, Dh).transpose(1, 2)
            q = heads(x @ w[p + "self_attention.wq"] + w[p + "self_attention.bq"])
            k = heads(x @ w[p + "self_attention.wk"] + w[p + "self_attention.bk"])
            v = heads(x @ w[p + "self_attention.wv"] + w[p + "self_attention.bv"])
            a = (torch.softmax(q @ k.transpose(-1, -2) / Dh ** 0.5, dim=-1) @ v).transpose(1, 2).reshape(B, S, D)
            x = F.layer_norm(x + a @ w[p + "self_attention.wo"] + w[p + "self_attention.bo"], (D,),
                             w[p + "layernorm.weight"], w[p + "layernorm.bias"], eps=1e-12)
            h = F.gelu(x @ w[p + "mlp.w1"] + w[p + "mlp.b1"]) @ w[p + "mlp.w2"] + w[p + "mlp.b2"]
            x = F.layer_norm(x + h, (D,), w[p + "layernorm_1.weight"], w[p + "layernorm_1.bias"], eps=1e-12)
        pooled = torch.tanh(x[:, 0] @ w["classifier.w_pool"] + w["classifier.b_pool"])
        return pooled @ w["classifier.w"] + w["classifier.b"]

    held = max(1, n // 10)  # --eval-every holds out the last tenth: training samples the first n - held

    def loss_of(w, step):
        # planrt's sampler for data sets (epochs): row i of step t is sample shuffle(seed, g // T, g % T, T)
        idx = [epoch_sample(step, i, B, n - held) for i in range(B)]
        return F.cross_entropy(logits_of(w, ds["tokens"][idx]), ds["labels"][idx])

    prog = build(f"{root}/examples/bert.plan", "single_nodropout")
    init = init_like(program_shapes(prog, data=dataset), ("layernorm.weight", "layernorm_1.weight"))
    # evaluated after the last step, on the held-out last tenth (docs/data.md): the final weights'
    planc_losses, final = train_program(prog, init, data=dataset, extra=("--eval-every", str(steps), "--eval-batches", "3"))
    torch_losses, w = train_torch(init, loss_of, dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01, eps=1e-8),
                                  clip=0)
    report("BERT classifier (examples/bert.plan, data/classify.safetensors)", planc_losses, torch_losses, final, w)
    # the held-out accuracy: row i of evaluation batch b is held-out sample (b B + i) mod held
    idx = [n - held + (g % held) for g in range(3 * B)]
    with torch.no_grad():
        logits = logits_of(final, ds["tokens"][idx])
    labels = ds["labels"][idx]
    want_acc = (logits.argmax(-1) == labels).double().mean().item()
    want_loss = sum(F.cross_entropy(logits[b * B:(b + 1) * B], labels[b * B:(b + 1) * B]).item() for b in range(3)) / 3
    got = last_log[-1]
    check("BERT's held-out accuracy and loss: planc's evaluation vs PyTorch on planc's final weights",
          got.get("eval_accuracy") == want_acc and abs(got.get("eval_loss", 0) - want_loss) <= 1e-5 * want_loss,
          f"accuracy {got.get('eval_accuracy')} vs {want_acc} over {3 * B} rows, loss {got.get('eval_loss')} vs "
          f"{want_loss:.7f}")


def run_finetune():
    V, S, D, H, B = 256, 16, 32, 4, 8
    cos, sin = rope_tables(S, D // H, 10000.0)

    def loss_of(w, step):
        tokens, targets = batch(data, step, B, S)
        x = F.embedding(tokens, w["wte"]) * w["scale"]
        q = (x @ w["wq"]).view(B, S, H, D // H).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        return F.cross_entropy((q.transpose(1, 2).reshape(B, S, D) @ w["head"]).reshape(-1, V), targets.reshape(-1))

    prog = build(f"{root}/tests/equiv/finetune.plan", "finetune")
    shapes = program_shapes(prog)
    if set(shapes) != {"wte", "scale", "wq", "head"}:  # the computed tables are not saved
        raise SystemExit(f"FAIL: the checkpoint holds {sorted(shapes)}")
    init = init_like(shapes, ("scale",))
    planc_losses, final = train_program(prog, init)
    trained = {k for k in init if k in ("wq", "head")}  # wte frozen, scale a buffer
    torch_losses, w = train_torch(init, loss_of, dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, eps=1e-8),
                                  clip=0, trained=trained)
    report("fine-tuning with buffers (tests/equiv/finetune.plan: RoPE tables computed at init, wte frozen)",
           planc_losses, torch_losses, final, w)
    same = all(torch.equal(final[k], init[k]) for k in ("wte", "scale"))
    check("the frozen wte and the buffer scale end bit for bit as they began", same)


def run_bench():
    """bench/gpu's two models, small, against the PyTorch models scripts/gpu-check.sh times"""
    sys.path.insert(0, f"{root}/bench/gpu")
    import torch_bench  # noqa: E402  (bench/gpu/torch_bench.py)
    small = {"gpt350m": dict(V=256, S=32, D=64, H=4, L=2), "llama1b": dict(V=256, S=32, D=64, H=4, K=2, F=176, L=2)}
    for name, size in small.items():
        c = dict(torch_bench.CONFIGS[name], **size)
        prog = build(f"{root}/bench/gpu/{name}.plan", "f32", tuple(f"{k}={v}" for k, v in size.items()))
        shapes = program_shapes(prog)
        want = {n: s for n, (s, _) in torch_bench.MODELS[name][0](c).items()}
        if {n: list(t.shape) for n, t in shapes.items()} != want:
            check(f"bench/gpu/torch_bench.py {name}: the program's parameters", False,
                  f"names or shapes differ: {sorted(set(shapes) ^ set(want))[:4]}")
            continue
        init = init_like(shapes, ("norm.weight", "norm_1.weight"))
        planc_losses, final = train_program(prog, init)

        def loss_of(w, step):
            tokens, targets = batch(data, step, c["B"], c["S"])
            return torch_bench.MODELS[name][1](w, tokens, targets, c, False)
        torch_losses, w = train_torch(init, loss_of, dict(torch_bench.ADAMW, eps=1e-8))
        report(f"bench/gpu/{name}.plan f32 at {size} (bench/gpu/torch_bench.py's eager model, which "
               f"scripts/gpu-check.sh times)", planc_losses, torch_losses, final, w)


for m in models:
    {"gpt": run_gpt, "llama": run_llama, "ops": run_ops, "bert": run_bert, "moe": run_moe, "finetune": run_finetune,
     "bench": run_bench}[m]()
tally.finish()
