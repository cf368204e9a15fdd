#!/usr/bin/env python3
"""bench/cp_balance: causal load balancing of context parallelism (docs/attention.md).

A one-layer causal GPT (byte vocabulary, batch 1, no dropout, AdamW) trained on cp ranks with the
ring attention twice: balanced (the default, `use nn.context_parallel(ctx)`: each rank holds the
chunks r and 2cp - 1 - r of 2cp) and contiguous (`shard ring_attention(contiguous) -> ctx`: rank r
holds block r). For each it prints, per rank, what planrt counted (PLANRT_REPORT_ATTENTION): the
scores the fused attention computed (its tile products not skipped by the causal mask, each
query tile x key tile) forward and backward, and the seconds spent in its kernels over the run; then the job's mean step time
(steps 2..) and explain's estimated step. Under a causal mask the contiguous ring's last rank attends
to every key block and its first rank to one, so the step waits for the last; balanced, every rank
does the same tiles.
One thread per rank (OMP_NUM_THREADS=1); on a machine with fewer cores than ranks the ranks share
cores, so compare the two layouts' per-rank attention seconds side by side, from one run.
usage: bench/cp_balance.py PLANC [--seq 4096] [--dim 128] [--heads 2] [--ranks 4] [--steps 3]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
planc = sys.argv[1]
args = sys.argv[2:]


def opt(name, default):
    return args[args.index(name) + 1] if name in args else default


S, D, H = int(opt("--seq", "4096")), int(opt("--dim", "128")), int(opt("--heads", "2"))
N, steps = int(opt("--ranks", "4")), int(opt("--steps", "3"))
work = tempfile.mkdtemp(prefix="planc-cp-balance-")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_plm="isolated",
           OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1", PLANRT_REPORT_ATTENTION="1")
PLAN = f"""import std.nn
model lc(V = 256, S = {S}, D = {D}, H = {H}) {{
  input tokens : i32[B, S]
  input targets : i32[B, S]
  param wte : f32[V, D] ~ normal(0, 0.02)
  param wpe : f32[S, D] ~ normal(0, 0.02)
  x = embed(wte, tokens) + wpe
  repeat 1 {{ x = nn.block(x, heads = H, ffn = 4 * D, p = 0.0) }}
  loss = cross_entropy(nn.layernorm(x) @ wte.T, targets)
}}
plan balanced for lc {{
  mesh ctx = {N}
  batch B = 1
  use nn.context_parallel(ctx)
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}}
plan contiguous for lc {{
  mesh ctx = {N}
  batch B = 1
  shard S -> ctx
  shard ring_attention(contiguous) -> ctx
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}}
"""
src = f"{work}/lc.plan"
open(src, "w").write(PLAN)


def run(plan):
    prog, log = f"{work}/{plan}", f"{work}/{plan}.jsonl"
    subprocess.run([planc, "build", src, "--plan", plan, "-o", prog, "--native"], check=True, env=env)
    r = subprocess.run(["mpirun", "-np", str(N), prog, "--steps", str(steps), "--data", f"{root}/data/corpus.txt",
                        "--log", log], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{plan}: mpirun failed: {r.stderr.strip()[-400:]}")
    ranks = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), float(m.group(4))) for m in re.finditer(
        r"planrt: rank (\d+): attention tiles forward=\d+ backward=\d+ scores forward=(\d+) backward=(\d+) "
        r"seconds=([\d.]+)", r.stderr)}
    rates = [x["tokens_per_s"] for x in map(json.loads, open(log)) if "tokens_per_s" in x]
    rates = rates[1:] or rates
    step_s = S / (sum(rates) / len(rates)) if rates else float("nan")
    est = json.loads(subprocess.run([planc, "explain", src, "--plan", plan, "--json"], capture_output=True, text=True,
                                    check=True).stdout)["estimated_step_s"]["step"]
    return ranks, step_s, est


print(f"causal GPT, one layer, S = {S}, D = {D}, {H} heads, batch 1, ring over {N} ranks, {steps} steps, "
      f"one thread per rank, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
results = {plan: run(plan) for plan in ("contiguous", "balanced")}
print(f"{'layout':<11} {'rank':>4} {'fwd scores':>12} {'bwd scores':>12} {'attention s':>12}")
for plan, (ranks, step_s, est) in results.items():
    for rank, (fwd, bwd, secs) in sorted(ranks.items()):
        print(f"{plan:<11} {rank:>4} {fwd:>12} {bwd:>12} {secs:>12.3f}")
    busiest = max(v[2] for v in ranks.values())
    idlest = min(v[2] for v in ranks.values())
    print(f"{plan:<11} busiest rank {busiest:.3f} s in attention, idlest {idlest:.3f} s (ratio "
          f"{busiest / idlest:.2f}); step {step_s:.3f} s measured (tokens/s of steps 2..), explain {est:.4g} s")
c, b = results["contiguous"], results["balanced"]
print(f"balanced / contiguous: busiest rank's attention seconds "
      f"{max(v[2] for v in b[0].values()) / max(v[2] for v in c[0].values()):.2f}, measured step "
      f"{b[1] / c[1]:.2f}, explain's step {b[2] / c[2]:.2f}")
