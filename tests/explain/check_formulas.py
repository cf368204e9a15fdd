#!/usr/bin/env python3
"""Checks planc explain's figures against the published formulas they must agree with.

The figures come from walking the compiled IR (compiler/explain/explain.c); the formulas here are typed in
from the papers, so each check is an independent reference:
  ZeRO model states      Rajbhandari et al. 2020, section 5 (K = 12 for mixed-precision Adam)
  activations per layer  Korthikanti et al. 2022, table 2 (bf16 activations, 1-byte dropout masks)
  FLOPs per step         Narayanan et al. 2021, section 5.1 (no recomputation: 72 B s l h^2 (...))
  pipeline bubble        Narayanan et al. 2021: (p - 1) / m for 1F1B with equal stages
  Megatron collectives   Shoeybi et al. 2019: 2 all-reduces forward and 2 backward per layer
Prints one PASS/FAIL line per check and a closing 'N passed, N failed' line.
usage: check_formulas.py PLANC REPO_ROOT
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
tally = harness.Tally("explain formulas")
check = tally.check


def explain(path, plan):
    return harness.explain(planc, f"{root}/{path}", plan)


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b)


# ---- ZeRO (the paper: Psi = 7.5e9, N_d = 64: 120, 31.4, 16.6, 1.9 GB) -------------------------
N = 64
expect = {"zero0": 16, "zero1": 4 + 12 / N, "zero2": 2 + 14 / N, "zero3": 16 / N}
paper_gb = {"zero0": 120, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}
for plan, k in expect.items():
    d = explain("examples/gpt7b.plan", plan)
    psi = d["parameters"]
    states = d["roles"][0]["bytes"]["model_states"]
    per_psi = states / psi
    at_paper = per_psi * 7.5e9 / 1e9
    check(f"ZeRO {plan} model states", close(per_psi, k, 1e-3) and close(at_paper, paper_gb[plan], 0.02),
          f"{per_psi:.4f} Psi (want {k:.4f} Psi); {at_paper:.1f} GB at Psi = 7.5e9 (paper {paper_gb[plan]})")

# ---- activations per layer (Korthikanti et al. 2022, table 2) -------------------------------------
# s b h (34 + 5 a s / h) and its variants, b = micro-batch size per model replica, bf16. The 5 a s / h
# term is the attention's [a, s, s] scores, softmax and dropout (plans `attention unfused`); the fused
# attention (graph/attention.c, as FlashAttention) keeps only the row logsumexps, f32 [a, s] per
# sample: the figure of selective recompute plus 4 a s b bytes (over t with tensor parallelism).
s, h, a, t = 2048, 4096, 32, 8
b = 1
sbh = s * b * h
lse = 4 * a * s * b
variants = {
    "zero0_unfused": ("no parallelism, attention unfused", sbh * (34 + 5 * a * s / h)),
    "tp8_unfused": ("tensor parallel, attention unfused", sbh * (10 + 24 / t + 5 * a * s / (h * t))),
    "tp8_sp_unfused": ("tensor + sequence parallel, attention unfused", sbh * (34 / t + 5 * a * s / (h * t))),
    "zero0": ("no parallelism, fused attention", sbh * 34 + lse),
    "tp8": ("tensor parallel, fused attention", sbh * (10 + 24 / t) + lse / t),
    "tp8_sp": ("tensor + sequence parallel, fused attention", sbh * 34 / t + lse / t),
    "tp8_selective": ("tensor parallel + selective recompute", sbh * (10 + 24 / t)),
    "selective": ("tensor + sequence parallel + selective recompute", sbh * (34 / t)),
    "full": ("full recompute", 2 * sbh),
}
for plan, (what, want) in variants.items():
    d = explain("examples/gpt7b.plan", plan)
    per_layer = d["roles"][0]["activation_bytes_per_layer"]
    got = [per_layer[k] for k in sorted(per_layer, key=int)]
    worst = max(abs(x - want) / want for x in got)
    check(f"activations per layer, {what}", worst <= 0.02,
          f"{got[0]:.0f} bytes vs formula {want:.0f} (worst layer off by {100 * worst:.3f}%)")

# ---- FLOPs per step (Narayanan et al. 2021, no recomputation) -------------------------------------
d = explain("examples/gpt7b.plan", "zero0")
B, l, V = d["batch"], 36, 51200
want = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
got = d["model_flops_per_step"]
check("FLOPs per step", close(got, want, 0.01), f"{got:.4g} vs 72 B s l h^2 (1 + s/6h + V/12lh) = {want:.4g}")

# ---- pipeline bubble (1F1B, p = 8, m = 64) ---------------------------------------------------------
d = explain("examples/gpt175b.plan", "t8_p8")
p, m = d["pipeline"]["stages"], d["micro_batches"]
got = d["pipeline"]["bubble_fraction"]
want = (p - 1) / m
check("pipeline bubble", close(got, want, 0.05), f"{got:.4f} vs (p - 1) / m = {want:.4f} (stages differ by the embedding and head)")
d = explain("examples/gpt175b.plan", "t8_p8_interleaved")
p, m, v = d["pipeline"]["stages"], d["micro_batches"], d["pipeline"]["chunks"]
got = d["pipeline"]["bubble_fraction"]
want = (p - 1) / (m * v)
check("interleaved pipeline bubble", close(got, want, 0.10), f"{got:.4f} vs (p - 1) / (v m) = {want:.4f}")

# ---- Megatron tensor parallelism: 2 all-reduces forward and 2 backward per layer -----------------
dump = subprocess.run([planc, "check", f"{root}/examples/gpt.plan", "--plan", "tp2", "--dump-after=sync"],
                      capture_output=True, text=True, check=True).stdout
for layer in (0, 2):
    fwd = sum(1 for line in dump.splitlines()
              if " all_reduce " in line and f" layer={layer} " in line + " " and line.split()[1] == "F")
    bwd = sum(1 for line in dump.splitlines()
              if " all_reduce " in line and f" layer={layer} " in line + " " and line.split()[1] == "B")
    check(f"Megatron TP collectives, layer {layer}", fwd == 2 and bwd == 2,
          f"{fwd} all-reduces forward, {bwd} backward (want 2 and 2)")

tally.finish()
