#!/usr/bin/python3
"""examples/gpt.plan's model in PyTorch eager (the reference side of bench/gpt_tokens.sh).

The same architecture as the planc program: byte embedding + learned positions, dropout, L
pre-LN blocks with separate q, k, v projections, causal softmax attention with dropout, a GELU
MLP, a final layer norm and the tied head; AdamW and gradient clipping as the plan says. Data
parallel runs use torch.distributed with the gloo backend and DistributedDataParallel.
Prints one line: tokens/s over the timed steps. --size overrides the example's sizes (the larger
GPT of bench/gpt_tokens.sh --large: S=256,D=512,H=8,B=8); OMP_NUM_THREADS threads.
usage: torch_gpt.py STEPS WARMUP [--dp] [--size K=V,...] (under torchrun-like env: RANK, WORLD_SIZE,
       MASTER_ADDR/PORT)
"""
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, S, D, H, L, B, P = 256, 64, 128, 4, 4, 16, 0.1
steps, warmup = int(sys.argv[1]), int(sys.argv[2])
dp = "--dp" in sys.argv
if "--size" in sys.argv:
    sizes = dict(kv.split("=") for kv in sys.argv[sys.argv.index("--size") + 1].split(","))
    V, S, D, H, L, B = (int(sizes.get(k, v)) for k, v in zip("VSDHLB", (V, S, D, H, L, B)))
    P = float(sizes.get("P", P))
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)  # not a buffer: gloo has no bool

    def forward(self, x):
        b = x.shape[0]
        h = self.ln1(x)
        split = lambda t: t.view(b, S, H, D // H).transpose(1, 2)
        scores = split(self.q(h)) @ split(self.k(h)).transpose(-1, -2) * (1.0 / (D // H) ** 0.5)
        probs = F.dropout(torch.softmax(scores.masked_fill(self.mask, float("-inf")), -1), P, self.training)
        a = (probs @ split(self.v(h))).transpose(1, 2).reshape(b, S, D)
        x = x + F.dropout(self.o(a), P, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), P, self.training)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(V, D) * 0.02)
        self.wpe = nn.Parameter(torch.randn(S, D) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln = nn.LayerNorm(D)

    def forward(self, tokens, targets):
        x = F.dropout(F.embedding(tokens, self.wte) + self.wpe, P, self.training)
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy((self.ln(x) @ self.wte.T).reshape(-1, V), targets.reshape(-1))


model = GPT()
world, rank = 1, 0
if dp:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
data = torch.tensor(list(open(os.path.join(os.path.dirname(__file__), "..", "data", "corpus.txt"), "rb").read()))
local = B // world
gen = torch.Generator().manual_seed(rank)
for step in range(warmup + steps):
    if step == warmup:
        start = time.perf_counter()
    pos = torch.randint(0, len(data) - S - 1, (local,), generator=gen)
    window = torch.stack([data[p:p + S + 1] for p in pos.tolist()])
    loss = model(window[:, :S], window[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
elapsed = time.perf_counter() - start
if rank == 0:
    print(f"{B * S * steps / elapsed:.0f}")
