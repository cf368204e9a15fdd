#!/usr/bin/env python3
"""Benchmark (figures, not a test): the pipeline bubble measured from per-rank timings beside
planc explain's prediction, and what a lopsided stage split costs.

An 8-layer version of examples/gpt.plan's GPT is trained on 2 pipeline ranks (one per core on a
2-core machine) with 1F1B at several micro-batch counts, GPipe and interleaved 1F1B, and with an
even and a lopsided (6:2) layer split. Each program reports, per rank, its wall time over the
steps after the first, the time it waited for pipeline receives, and the time of the update phase
(PLANRT_REPORT_TIMING). The measured bubble is, as explain defines it, the time the micro-batches
take (the longest walk of the action table over the ranks) over the busiest stage's own work in
them, minus one:
    max over ranks (step - update) / max over ranks (step - wait - update) - 1
(a rank's update phase includes its wait for the others at the step's reductions, so it is taken
per rank).
Explain's bubble simulates the schedule with matmul FLOPs as each action's time; its estimated step
time (asked for with --device=cpu, a nominal x86-64 core) uses every kernel's cost, so it and the
measured step time can be held side by side, and their lopsided / even ratios compared.
usage: bench/pipeline_bubble.py [PLANC] [STEPS]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

planc = sys.argv[1] if len(sys.argv) > 1 else "build/planc"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PLANRT_REPORT_TIMING="1")
work = tempfile.mkdtemp(prefix="planc-bubble-")
gpt = open(f"{root}/examples/gpt.plan").read()
text = gpt[:gpt.index("# ---- one rank")]
PLANS = []


def plan(name, schedule, m, stages=None):
    global text
    split = f", stages = {stages}" if stages else ""
    sched = "interleaved, chunks = 2" if schedule == "interleaved" else f"{schedule}{split}"
    text += (f"\nplan {name} for gpt(L = 8, P = 0.0) {{\n  mesh pipe = 2\n  batch B = 32, micro_batches = {m}\n"
             f"  pipeline pipe: {sched}\n"
             "  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0\n}\n")
    PLANS.append(name)


for m in (2, 4, 8, 16):
    plan(f"f1b1_m{m}", "1f1b", m)
plan("gpipe_m8", "gpipe", 8)
plan("interleaved_m8", "interleaved", 8)
plan("even_m8", "1f1b", 8, "[0..3, 4..7]")
plan("lopsided_m8", "1f1b", 8, "[0..5, 6..7]")
src = f"{work}/bubble.plan"
open(src, "w").write(text)
TIMING = re.compile(r"timing stage=(\d+) steps=(\d+) step_s=([\d.]+) busy_s=([-\d.]+) wait_s=([\d.]+) update_s=([\d.]+)")

print(f"pipeline bubble, GPT 8 layers on 2 pipeline ranks, batch 32, {steps} steps (the first not timed)\n")
print(f"{'plan':<16} {'micro':>5} {'explain bubble':>15} {'measured bubble':>16} {'step ms':>9} {'explain ms':>11}")
results = {}
for name in PLANS:
    d = json.loads(subprocess.run([planc, "explain", src, "--plan", name, "--json", "--device=cpu"],
                                  capture_output=True, text=True, check=True).stdout)
    prog = f"{work}/{name}"
    subprocess.run([planc, "build", src, "--plan", name, "-o", prog, "--native"], check=True)
    r = subprocess.run(["mpirun", "-np", "2", prog, "--steps", str(steps), "--data", f"{root}/data/corpus.txt"],
                       capture_output=True, text=True, env=env, timeout=900)
    rows = [tuple(float(x) for x in m.groups()) for m in TIMING.finditer(r.stderr)]
    if r.returncode or len(rows) != 2:
        print(f"{name}: run failed: {r.stderr[-300:]}")
        continue
    n = rows[0][1]
    step = max(x[2] for x in rows) / n
    walk = max(x[2] - x[5] for x in rows) / n
    busiest = max(x[2] - x[4] - x[5] for x in rows) / n
    measured = walk / busiest - 1
    est = d["estimated_step_s"]["step"]
    results[name] = (step, est)
    print(f"{name:<16} {d['micro_batches']:>5} {100 * d['pipeline']['bubble_fraction']:>14.1f}% "
          f"{100 * measured:>15.1f}% {step * 1e3:>9.2f} {est * 1e3:>11.2f}")

if "even_m8" in results and "lopsided_m8" in results:
    (se, ee), (sl, el) = results["even_m8"], results["lopsided_m8"]
    print(f"\nlopsided 6:2 split against the even 4:4 split: measured step time x{sl / se:.3f}, "
          f"explain's estimated step time x{el / ee:.3f}")
