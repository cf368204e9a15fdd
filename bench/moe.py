#!/usr/bin/python3
"""Benchmark (figures, not a test): tokens per second of examples/moe.plan's MoE GPT (2 layers of
attention + 4 GELU experts, top-2, capacity factor 1.25 per sample, load-balancing and z losses,
dropout 0.1) trained by the program planc builds, against the same model in PyTorch eager, on one
rank and on two, side by side in one run:
  planc   plan single (1 rank) and plan ep2 (2 ranks: experts split, all-to-all dispatch/combine)
  torch   the same model written below (softmax router, each token's top 2, per sample an expert
          takes at most ceil(2 S 1.25 / E) pairs, every first choice before any second, as
          docs/moe.md); 1 process, and 2 processes under DistributedDataParallel (gloo), where every
          rank holds every expert (PyTorch has no expert parallelism of its own)
Same batch (16 sequences of 64 tokens in all), one thread per rank, AdamW and clipping as the plan.
Each figure is tokens / time over the steps after the warmup (planc: from its --log step_ms).
usage: bench/moe.py [PLANC] [STEPS]     (run from the repository root, /usr/bin/python3 for torch)
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

V, S, D, H, L, E, K, CF, P, B = 256, 64, 128, 4, 2, 4, 2, 1.25, 0.1, 16
WARMUP = 3
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def torch_worker(steps, dp):
    """The MoE GPT in PyTorch eager; prints tokens/s (rank 0)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cap = math.ceil(K * S * CF / E)  # 40 pairs per expert and sample

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Parameter(torch.randn(D, E) * 0.02)
            self.w1 = nn.Parameter(torch.randn(E, D, 4 * D) * 0.02)
            self.w2 = nn.Parameter(torch.randn(E, 4 * D, D) * 0.02)

        def forward(self, h):
            b = h.shape[0]
            logits = h @ self.router
            probs = torch.softmax(logits, -1)
            top_p, top_e = probs.topk(K, -1)
            onehot = F.one_hot(top_e, E)  # [b, S, K, E]
            order = onehot.permute(0, 2, 1, 3).reshape(b, K * S, E)  # first choices, then second
            before = (torch.cumsum(order, 1) - order).reshape(b, K, S, E).permute(0, 2, 1, 3)
            keep = (before * onehot).sum(-1) < cap
            flat, out = h.reshape(-1, D), torch.zeros(b * S, D)
            for e in range(E):
                chosen = ((top_e == e) & keep).reshape(b * S, K)
                rows = chosen.any(-1).nonzero().squeeze(1)
                y = F.gelu(flat[rows] @ self.w1[e]) @ self.w2[e]
                gate = (top_p.reshape(b * S, K) * chosen)[rows].sum(-1, keepdim=True)
                out = out.index_add(0, rows, gate * y)
            f = F.one_hot(top_e[..., 0], E).float().mean(1)
            aux = (E * (f * probs.mean(1)).sum(-1)).sum()
            z = torch.logsumexp(logits, -1).pow(2).mean()
            return out.view(b, S, D), 0.01 * aux + 0.001 * z

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
            self.moe = MoE()
            self.mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)

        def forward(self, x):
            b = x.shape[0]
            h = self.ln1(x)
            split = lambda t: t.view(b, S, H, D // H).transpose(1, 2)
            scores = split(self.q(h)) @ split(self.k(h)).transpose(-1, -2) * (1.0 / (D // H) ** 0.5)
            probs = F.dropout(torch.softmax(scores.masked_fill(self.mask, float("-inf")), -1), P, self.training)
            a = (probs @ split(self.v(h))).transpose(1, 2).reshape(b, S, D)
            x = x + F.dropout(self.o(a), P, self.training)
            y, extra = self.moe(self.ln2(x))
            return x + F.dropout(y, P, self.training), extra

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Parameter(torch.randn(V, D) * 0.02)
            self.wpe = nn.Parameter(torch.randn(S, D) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln = nn.LayerNorm(D)

        def forward(self, tokens, targets):
            x = F.dropout(F.embedding(tokens, self.wte) + self.wpe, P, self.training)
            extra = 0
            for blk in self.blocks:
                x, e = blk(x)
                extra = extra + e
            return F.cross_entropy((self.ln(x) @ self.wte.T).reshape(-1, V), targets.reshape(-1)) + extra

    model, world, rank = GPT(), 1, 0
    if dp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.tensor(list(open(os.path.join(ROOT, "data", "corpus.txt"), "rb").read()))
    gen = torch.Generator().manual_seed(rank)
    for step in range(WARMUP + steps):
        if step == WARMUP:
            start = time.perf_counter()
        pos = torch.randint(0, len(data) - S - 1, (B // world,), generator=gen)
        window = torch.stack([data[p:p + S + 1] for p in pos.tolist()])
        loss = model(window[:, :S], window[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    if rank == 0:
        print(f"{B * S * steps / (time.perf_counter() - start):.0f}", flush=True)


def planc_rate(planc, work, plan, ranks, steps):
    prog, log = f"{work}/{plan}", f"{work}/{plan}.jsonl"
    subprocess.run([planc, "build", f"{ROOT}/examples/moe.plan", "--plan", plan, "-o", prog], check=True)
    subprocess.run(["mpirun", "-np", str(ranks), prog, "--steps", str(WARMUP + steps), "--data",
                    f"{ROOT}/data/corpus.txt", "--log", log], check=True, env=ENV, capture_output=True)
    rows = [json.loads(line) for line in open(log)][WARMUP:]
    dropped = sum(sum(r["moe_dropped"]) for r in rows) / len(rows)
    return sum(r["tokens"] for r in rows) / sum(r["step_ms"] for r in rows) * 1e3, dropped


def torch_rate(ranks, steps):
    me = os.path.abspath(__file__)
    if ranks == 1:
        r = subprocess.run(["/usr/bin/python3", me, "--torch-worker", str(steps)], env=ENV, capture_output=True,
                           text=True, check=True)
        return float(r.stdout.split()[-1])
    procs = [subprocess.Popen(["/usr/bin/python3", me, "--torch-worker", str(steps), "--dp"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True,
                              env=dict(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT="29519", RANK=str(r),
                                       WORLD_SIZE=str(ranks)))
             for r in range(ranks)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a torch worker failed")
    return float(outs[0].split()[-1])


def main():
    if sys.argv[1:2] == ["--torch-worker"]:
        torch_worker(int(sys.argv[2]), "--dp" in sys.argv)
        return
    planc = sys.argv[1] if len(sys.argv) > 1 else "build/planc"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    have_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    if not have_torch:
        print("PyTorch not installed (apt-get install python3-torch): planc figures only")
    work = tempfile.mkdtemp(prefix="planc-bench-moe-")
    print(f"MoE GPT: L={L} D={D} E={E} top-{K} capacity factor {CF}, batch {B} x {S} tokens, {steps} timed steps")
    print(f"{'plan':<8} {'ranks':>5} {'planc tok/s':>12} {'pytorch tok/s':>14} {'ratio':>6} {'pairs dropped/step':>19}")
    for plan, ranks in (("single", 1), ("ep2", 2)):
        p, dropped = planc_rate(planc, work, plan, ranks, steps)
        t = torch_rate(ranks, steps) if have_torch else None
        ts, ratio = ("-", "-") if t is None else (f"{t:.0f}", f"{p / t:.2f}")
        print(f"{plan:<8} {ranks:>5} {p:>12.0f} {ts:>14} {ratio:>6} {dropped:>19.0f}", flush=True)
    print("torch 2 ranks: DistributedDataParallel (every rank holds every expert); planc ep2: experts split")


if __name__ == "__main__":
    main()
