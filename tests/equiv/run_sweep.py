#!/usr/bin/env python3
"""Combinations the hand-written plans do not cover: a fixed pseudo-random sample of plans for the
GPT example over data (1, 2) x tensor (1, 2) x sequence parallel x pipeline (none, or 2 stages
under gpipe, 1f1b or interleaved) x ZeRO 0-3 (0-1 with a pipeline) x micro-batches (1, 2; 2, 4
with a pipeline) x recompute (none, selective, full) x bucket overlap x precision (f32, bf16),
each trained for 6 steps and compared with the single-rank run (f32: 1e-5 relative on every loss;
bf16: 2e-2). Each plan and its reference train at the smallest of SIZES at which the plan does what
it does at the example's size (harness.smaller_size: the same collectives, stages and layers), as
run_equiv.py trains the GPT plans.
usage: run_sweep.py PLANC REPO_ROOT [COUNT]
"""
import itertools
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 16
work = harness.workdir("sweep")
random.seed(7)
SIZES = [("D=64", "S=32"), ("S=32",)]  # --model-arg sizes, the smallest first (run_equiv.py's for gpt)
combos = [c for c in itertools.product([1, 2], [1, 2], [0, 1], [None, "gpipe", "1f1b", "interleaved"], [0, 1, 2, 3],
                                       [1, 2], ["none", "selective", "full"], [0, 1], ["f32", "bf16"])
          if not (c[1] == 1 and c[2]) and not (c[0] == 1 and c[4]) and not (c[3] and c[4] >= 2)]
random.shuffle(combos)
text = open(f"{root}/examples/gpt.plan").read()
plans = []
for i, (dp, tp, sp, pp, zero, mb, rc, ov, prec) in enumerate(combos[:count]):
    mb = mb * 2 if pp else mb
    mesh = ", ".join(x for x in [f"data = {dp}" if dp > 1 else "", "pipe = 2" if pp else "",
                                 f"tensor = {tp}" if tp > 1 else ""] if x)
    body = [f"mesh {mesh or 'data = 1'}", f"batch B = 16, micro_batches = {mb}"]
    body += ["shard B -> data"] if dp > 1 else []
    body += ["use nn.megatron(tensor)"] if tp > 1 else []
    body += ["use nn.sequence_parallel(tensor)"] if sp else []
    body += [f"pipeline pipe: {'interleaved, chunks = 2' if pp == 'interleaved' else pp}"] if pp else []
    body += [f"zero {zero} over data"] if zero else []
    body += [f"recompute {rc}"] if rc != "none" else []
    body += ["precision bf16, master = f32"] if prec == "bf16" else []
    body += ["optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0",
             "sync strict, bucket = 1MiB" + (", overlap" if ov else "")]
    text += f"\nplan sweep{i} for gpt {{\n  " + "\n  ".join(body) + "\n}\n"
    plans.append((f"sweep{i}", dp * tp * (2 if pp else 1), prec, "; ".join(body[:-2] + body[-1:])))
src = f"{work}/sweep.plan"
open(src, "w").write(text)


def train(plan, n, size):
    prog = f"{work}/{plan}{''.join('_' + a.replace('=', '') for a in size)}"
    err = harness.build(planc, src, plan, prog, "--verify-ir", "--native", *harness.model_args(size))
    if err:
        return None, err
    r = harness.mpirun(n, [prog, "--steps", "6", "--data", f"{root}/data/corpus.txt", "--log", f"{prog}.jsonl"],
                       timeout=600)
    if r.returncode:
        return None, r.stderr.strip()[-300:]
    return [x["loss"] for x in harness.read_log(f"{prog}.jsonl")], None


text += "\nplan sweep_single for gpt {\n  mesh data = 1\n  batch B = 16\n" \
        "  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0\n}\n"
open(src, "w").write(text)
refs = {}  # the single-rank run at each size a plan needs
tally = harness.Tally("equiv sweep")
for plan, n, prec, desc in plans:
    size = harness.smaller_size(planc, src, plan, SIZES)
    if size not in refs:
        refs[size] = train("sweep_single", 1, size)
    ref, err = refs[size]
    got, err = train(plan, n, size) if ref else (None, err)
    tol = 2e-2 if prec == "bf16" else 1e-5
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got)) if got else float("inf")
    ok = got is not None and len(got) == len(ref) and worst <= tol
    desc += f" ({', '.join(size)})" if size else ""
    tally.check(desc, ok, err or f"worst relative loss difference {worst:.2e} (tolerance {tol:g})")
tally.finish()
