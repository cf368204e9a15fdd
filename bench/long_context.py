#!/usr/bin/env python3
"""bench/long_context: long sequences on the CPU with the fused attention (docs/attention.md).

A one-layer GPT (byte vocabulary, D = 64, one head of 64, no dropout, batch 1, AdamW) at
S = 4k, 8k, 16k, 32k tokens, one rank. For each S it prints:
  - planc's fused attention: explain's peak, the run's measured peak RSS and arena, tokens/s (the
    mean of steps 2.., `planc build --native`, one thread);
  - planc with `attention unfused`: explain's peak (the S^2 scores, softmax and their gradients of
    the attention as written); run only where it fits under the memory cap;
  - PyTorch eager (the same model, bench/torch_gpt.py, one thread): tokens/s and peak RSS, under the
    same cap, or "out of memory";
  - context parallelism (`use nn.context_parallel(ctx)`, ring attention) on 2 and 4 ranks (--ranks):
    tokens/s of the whole job, the largest rank's measured peak RSS and arena, explain's arena per
    rank, and explain's ring bytes per step (sends on ctx), one thread per rank.
The cap (--cap-gib, default 6) is an address-space limit on each run, so that a run that would not
fit fails instead of swapping a shared machine.
usage: bench/long_context.py PLANC [--sizes 4096,8192,...] [--steps 3] [--cap-gib 6] [--ranks 2,4]
       [--no-torch]
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
planc = sys.argv[1]
args = sys.argv[2:]


def opt(name, default):
    return args[args.index(name) + 1] if name in args else default


sizes = [int(s) for s in opt("--sizes", "4096,8192,16384,32768").split(",")]
steps = int(opt("--steps", "3"))
cap = int(float(opt("--cap-gib", "6")) * 2**30)
ranks = [int(r) for r in opt("--ranks", "2,4").split(",") if r]
D, H = 64, 1
work = tempfile.mkdtemp(prefix="planc-long-context-")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_plm="isolated",
           OMPI_MCA_btl="self,vader", OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1", PLANRT_REPORT_MEMORY="1")
PLAN = """import std.nn
model lc(V = 256, S = {S}, D = {D}, H = {H}) {{
  input tokens : i32[B, S]
  input targets : i32[B, S]
  param wte : f32[V, D] ~ normal(0, 0.02)
  param wpe : f32[S, D] ~ normal(0, 0.02)
  x = embed(wte, tokens) + wpe
  repeat 1 {{ x = nn.block(x, heads = H, ffn = 4 * D, p = 0.0) }}
  loss = cross_entropy(nn.layernorm(x) @ wte.T, targets)
}}
plan fused for lc {{
  mesh data = 1
  batch B = 1
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}}
plan unfused for lc {{
  mesh data = 1
  batch B = 1
  attention unfused
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}}
"""
# context parallelism over N ranks (the ring), one plan per --ranks entry
CP_PLAN = """plan cp{N} for lc {{
  mesh ctx = {N}
  batch B = 1
  use nn.context_parallel(ctx)
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}}
"""


def capped():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def explained(src, plan):
    return json.loads(subprocess.run([planc, "explain", src, "--plan", plan, "--json"], capture_output=True,
                                     text=True, check=True).stdout)


def planc_run(src, plan, S, world=1):
    peak = explained(src, plan)["roles"][0]["program"]["peak"]
    if peak > cap:
        return peak, None
    prog, log = f"{work}/{plan}{S}", f"{work}/{plan}{S}.jsonl"
    subprocess.run([planc, "build", src, "--plan", plan, "-o", prog, "--native"], check=True, env=env)
    r = subprocess.run(["mpirun", "-np", str(world), prog, "--steps", str(steps), "--data",
                        f"{root}/data/corpus.txt", "--log", log], capture_output=True, text=True, env=env,
                       preexec_fn=capped)
    if r.returncode != 0:
        return peak, "failed: " + r.stderr.strip()[-200:]
    rss = max(int(x) for x in re.findall(r"peak_rss=(\d+)", r.stderr))  # the largest rank's
    arena = max(int(x) for x in re.findall(r"arena_planned=(\d+)", r.stderr))
    rates = [x["tokens_per_s"] for x in map(json.loads, open(log)) if "tokens_per_s" in x]
    rates = rates[1:] or rates  # the first step warms up, when there are others
    return peak, (sum(rates) / len(rates), rss, arena)


def torch_run(S):
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss=%M", "/usr/bin/python3", f"{root}/bench/torch_gpt.py",
                        str(steps), "1", "--size", f"S={S},D={D},H={H},L=1,B=1,P=0"],
                       capture_output=True, text=True, env=env, preexec_fn=capped)
    rss = int(re.search(r"maxrss=(\d+)", r.stderr).group(1)) * 1024
    if r.returncode != 0:
        return "out of memory" if "memory" in r.stderr.lower() or "alloc" in r.stderr.lower() else \
            "failed: " + r.stderr.strip()[-200:], rss
    return float(re.findall(r"[\d.e+]+", r.stdout.strip().splitlines()[-1])[0]), rss


print(f"one-layer GPT, D = {D}, {H} head, batch 1, one CPU thread, cap {gib(cap)} per run")
for S in sizes:
    src = f"{work}/lc{S}.plan"
    open(src, "w").write(PLAN.format(S=S, D=D, H=H) + "".join(CP_PLAN.format(N=n) for n in ranks))
    fpeak, fused = planc_run(src, "fused", S)
    upeak = json.loads(subprocess.run([planc, "explain", src, "--plan", "unfused", "--json"], capture_output=True,
                                      text=True, check=True).stdout)["roles"][0]["program"]["peak"]
    line = f"S {S:6d}  planc fused: "
    if isinstance(fused, tuple):
        line += f"{fused[0]:8.1f} tok/s, peak RSS {gib(fused[1])} (arena {gib(fused[2])}, explain peak {gib(fpeak)})"
    else:
        line += f"{fused or 'over the cap'} (explain peak {gib(fpeak)})"
    line += f"  | unfused: explain peak {gib(upeak)}"
    if "--no-torch" not in args:
        rate, rss = torch_run(S)
        line += f"  | torch eager: {rate:8.1f} tok/s, peak RSS {gib(rss)}" if isinstance(rate, float) else \
            f"  | torch eager: {rate} (peak RSS {gib(rss)})"
    print(line, flush=True)
    for n in ranks:
        d = explained(src, f"cp{n}")
        ring = sum(r["wire_bytes"] for r in d["roles"][0]["communication"] if r["collective"] == "send")
        peak, run = planc_run(src, f"cp{n}", S, n)
        line = f"S {S:6d}  cp{n}: "
        if isinstance(run, tuple):
            line += (f"{run[0]:8.1f} tok/s, largest rank's peak RSS {gib(run[1])} (arena {gib(run[2])}, "
                     f"explain arena {gib(d['roles'][0]['program']['arena'])}), ring {ring / 2**20:.2f} MiB/step")
        else:
            line += f"{run or 'over the cap'} (explain peak {gib(peak)})"
        print(line, flush=True)
