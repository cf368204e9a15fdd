#!/usr/bin/env python3
"""Benchmark (figures, not a test): sync strategies under a straggler.

examples/gpt.plan's GPT at data = 4 (AdamW, batch 16) is trained with strict sync, async with
staleness 1 and 4, and local SGD every 4 and 16 steps, while one rank is slowed on purpose by
PLANRT_STRAGGLER (planrt sleeps that long at the start of each of that rank's steps):
  fixed    rank FIXED_RANK sleeps DELAY ms every step (a persistently slow worker);
  random   one rank drawn per step from the seed sleeps DELAY ms (transient stragglers).
From rank 0's log (step times and losses; under async rank 0 is the master, whose steps are the
updates) it prints, per scenario and strategy: tokens/s over the run (every rank trains the same
tokens per step), the loss at equal steps (the mean of the last 5 steps) and at equal wall time
(the loss of the last step every strategy had finished by the time the fastest run ended), and
draws the loss against wall time, one line per strategy, into an SVG per scenario.
usage: bench/straggler.py [PLANC] [STEPS] [DELAY_MS] [OUT_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile

planc = sys.argv[1] if len(sys.argv) > 1 else "build/planc"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 48
delay = int(sys.argv[3]) if len(sys.argv) > 3 else 150
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out_dir = sys.argv[4] if len(sys.argv) > 4 else f"{root}/bench"
FIXED_RANK = 3
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
work = tempfile.mkdtemp(prefix="planc-straggler-")

HEAD = """  mesh data = 4
  batch B = 16
  shard B -> data
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
"""
STRATEGIES = [("strict", "sync strict, bucket = 1MiB, overlap"), ("async S=1", "sync async, staleness = 1"),
              ("async S=4", "sync async, staleness = 4"), ("local SGD K=4", "sync local_sgd, every = 4"),
              ("local SGD K=16", "sync local_sgd, every = 16")]
COLORS = ["#222222", "#1f77b4", "#17becf", "#d62728", "#ff7f0e"]


def build():
    gpt = open(f"{root}/examples/gpt.plan").read()
    text = gpt[:gpt.index("# ---- one rank")]
    for i, (_, sync) in enumerate(STRATEGIES):
        text += f"plan s{i} for gpt {{\n{HEAD}  {sync}\n}}\n\n"
    path = f"{work}/straggler.plan"
    open(path, "w").write(text)
    for i in range(len(STRATEGIES)):
        subprocess.run([planc, "build", path, "--plan", f"s{i}", "-o", f"{work}/s{i}"], check=True)


def train(i, straggler):
    log = f"{work}/s{i}_{straggler.replace(':', '_')}.jsonl"
    subprocess.run(["mpirun", "-np", "4", f"{work}/s{i}", "--steps", str(steps), "--data", f"{root}/data/corpus.txt",
                    "--log", log], check=True, capture_output=True, env=dict(env, PLANRT_STRAGGLER=straggler))
    lines = [json.loads(x) for x in open(log)]
    t, curve = 0.0, []
    for x in lines:
        t += x["step_ms"] / 1e3
        curve.append((t, x["loss"]))
    return {"curve": curve, "tokens": sum(x["tokens"] for x in lines)}


def svg(path, title, runs):
    w, h, left, right, top, bottom = 720, 420, 60, 170, 40, 50
    tmax = max(r["curve"][-1][0] for r in runs.values())
    losses = [loss for r in runs.values() for _, loss in r["curve"]]
    lo, hi = min(losses), max(losses)
    sx = lambda t: left + (w - left - right) * t / tmax  # noqa: E731
    sy = lambda v: top + (h - top - bottom) * (hi - v) / (hi - lo)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
             f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
             f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">wall time (s)</text>',
             f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" '
             f'text-anchor="middle">training loss</text>']
    for k in range(6):
        t, v = tmax * k / 5, lo + (hi - lo) * k / 5
        parts.append(f'<text x="{sx(t):.1f}" y="{h - bottom + 16}" text-anchor="middle">{t:.0f}</text>')
        parts.append(f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        parts.append(f'<line x1="{left}" y1="{sy(v):.1f}" x2="{w - right}" y2="{sy(v):.1f}" stroke="#eeeeee"/>')
    for n, (name, r) in enumerate(runs.items()):
        pts = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in r["curve"])
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS[n]}" stroke-width="1.6"/>')
        y = top + 18 * n
        parts.append(f'<line x1="{w - right + 12}" y1="{y}" x2="{w - right + 36}" y2="{y}" stroke="{COLORS[n]}" '
                     f'stroke-width="2"/>')
        parts.append(f'<text x="{w - right + 42}" y="{y + 4}">{name}</text>')
    parts.append("</svg>\n")
    open(path, "w").write("\n".join(parts))


def table(title, runs):
    t_eq = min(r["curve"][-1][0] for r in runs.values())
    print(f"\n{title} (equal wall time: {t_eq:.1f} s, the fastest run's)")
    print(f"{'strategy':16s} {'wall s':>8s} {'tokens/s':>10s} {'vs strict':>10s} {'loss @ step ' + str(steps):>16s} "
          f"{'loss @ equal time':>18s} {'steps by then':>14s}")
    base = None
    for name, r in runs.items():
        wall = r["curve"][-1][0]
        rate = r["tokens"] / wall
        base = base or rate
        end = sum(v for _, v in r["curve"][-5:]) / 5
        done = [v for t, v in r["curve"] if t <= t_eq + 1e-9]
        print(f"{name:16s} {wall:8.1f} {rate:10.0f} {rate / base:9.2f}x {end:16.4f} {done[-1]:18.4f} {len(done):14d}")


build()
for scenario, straggler, title in [("fixed", f"{FIXED_RANK}:{delay}", f"rank {FIXED_RANK} sleeps {delay} ms every step"),
                                   ("random", f"random:{delay}", f"one rank drawn per step sleeps {delay} ms")]:
    runs = {name: train(i, straggler) for i, (name, _) in enumerate(STRATEGIES)}
    table(f"GPT, data = 4, {steps} steps; {title}", runs)
    path = f"{out_dir}/straggler_{scenario}.svg"
    svg(path, f"GPT on 4 ranks, {title}: loss against wall time", runs)
    print(f"plot: {path}")
