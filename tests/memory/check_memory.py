#!/usr/bin/env python3
"""Memory: what generated programs allocate, against planc explain and against the ZeRO paper.

1. Explain reports the program. Each rank of every listed plan (pipelines included) reports its
   persistent state by kind and its arena (PLANRT_REPORT_MEMORY). For the rank's stage, explain's
   JSON must give exactly the same state per kind and the same arena size; the arena's measured
   high-water mark (the highest word the run changed; the arena is filled with a canary) must reach
   the planned size, short of it by less than the 64-byte alignment of the last buffer at most.
2. ZeRO saves what it promises. A GPT at data = 4 with ZeRO 0, 1, 2 and 3, in bf16 with f32 master
   weights and in f32, trained for 2 steps: the measured model states (parameters, gradients,
   optimizer states and master weights) of every rank must be within 2% of the ZeRO paper's
   formulas for Adam, Psi parameters and N = 4:
       bf16: 16 Psi, 4 Psi + 12 Psi / N, 2 Psi + 14 Psi / N, 16 Psi / N
       f32:  16 Psi, 8 Psi + 8 Psi / N,  4 Psi + 12 Psi / N, 16 Psi / N
3. Expert parallelism saves what it promises: examples/moe.plan's ep2 and ep4 hold 1/2 and 1/4 of
   the experts per rank; measured parameters, gradients and AdamW states equal the single rank's
   less (1 - 1/n) of the experts' bytes (computed here from the model's sizes).
(Part 1 includes multi-query attention over 4 tensor ranks, tests/equiv/mqa.plan: the replicated
key/value projections are counted as the program holds them.)
Size. Memory equal to explain's, and ZeRO's and expert parallelism's savings, hold at any size: the
GPT and MoE plans run at the first of SIZES at which they keep their schedule (harness.smaller_size:
the same collectives, buckets, stages and layers; as tests/equiv runs them, whose programs the
compile cache then shares), the three expert-parallel plans at one size; the check names say it.
Prints PASS/FAIL per check and 'N passed, M failed'.
usage: check_memory.py PLANC REPO_ROOT
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

runner = harness.Runner("memory")
planc, root, work, check = runner.planc, runner.root, runner.work, runner.check
env = harness.mpi_env(PLANRT_REPORT_MEMORY="1")
SIZES = [("D=64", "S=32"), ("S=32",)]  # --model-arg sizes, the smallest first (tests/equiv's for gpt and moe)


def explain(src, plan, size=()):
    return harness.explain(planc, src, plan, args=harness.model_args(size))


def size_of(src, plan):
    """the size plan runs at here: the first of SIZES keeping its schedule (GPT and MoE models)"""
    text = open(src).read()
    model = re.search(r"^plan\s+" + plan + r"\s+for\s+(\w+)", text, re.M).group(1)
    return harness.smaller_size(planc, src, plan, SIZES) if model in ("gpt", "moe_gpt", "mixtral_moe") else ()


def named(plan, size):
    return plan + (f" ({', '.join(size)})" if size else "")


def measure(src, plan, world, steps=2, size=()):
    prog = f"{work}/{os.path.basename(src)}_{plan}" + "".join(f"_{arg.replace('=', '')}" for arg in size)
    err = harness.build(planc, src, plan, prog, "--verify-ir", "--native", *harness.model_args(size))
    if err:
        return None, err
    r = harness.mpirun(world, [prog, "--steps", str(steps), "--data", f"{root}/data/corpus.txt"], env, timeout=600)
    ranks = harness.memory_reports(r.stderr)
    if r.returncode or len(ranks) != world:
        return None, f"run failed or reported {len(ranks)} of {world} ranks: {r.stderr.strip()[-300:]}"
    return ranks, None


# ---- 1. explain reports the program ----------------------------------------------------------
CASES = [("gpt", "single"), ("gpt", "dp2"), ("gpt", "tp2_sp"), ("gpt", "zero3_dp4"), ("gpt", "bf16"),
         ("gpt", "bf16_zero2_dp4"), ("mlp", "dp2_tp2_zero2"), ("gpt", "pp2_1f1b"), ("gpt", "pp2"),
         ("gpt", "pp4_interleaved_l8"), ("gpt", "gpt_3d"), ("moe", "ep2"), ("moe", "ep2_dp2_tp2_zero2"),
         ("moe", "mixtral_ep2"), ("tests/equiv/mqa", "tp4"), ("tests/equiv/mqa", "dp2_tp2_sp")]
for model, plan in CASES:
    src = f"{root}/{model}.plan" if "/" in model else f"{root}/examples/{model}.plan"
    size = size_of(src, plan)
    d = explain(src, plan, size)
    ranks, err = measure(src, plan, d["world"], size=size)
    plan = named(plan, size)
    if err:
        check(f"{model} {plan}", False, err)
        continue
    roles = {r["stage"]: r for r in d["roles"]}
    bad = []
    worst_gap = 0
    for rank, m in sorted(ranks.items()):
        prog = roles[m["stage"]]["program"]
        want = prog["state_by_kind"]
        if m["kinds"] != want:
            bad.append(f"rank {rank} state {m['kinds']} vs explain {want}")
        if m["arena"] != prog["arena"]:
            bad.append(f"rank {rank} arena {m['arena']} vs explain {prog['arena']}")
        gap = m["arena"] - m["high"]
        worst_gap = max(worst_gap, gap)
        if not 0 <= gap < 64:
            bad.append(f"rank {rank} used {m['high']} of its {m['arena']}-byte arena")
    stages = sorted({m["stage"] for m in ranks.values()})
    detail = "; ".join(f"stage {s}: state {roles[s]['program']['state'] / 2**20:.2f} MiB + arena "
                       f"{roles[s]['program']['arena'] / 2**20:.2f} MiB" for s in stages)
    check(f"{model} {plan} memory = explain", not bad,
          "; ".join(bad[:3]) if bad else f"{detail}, every rank exactly; arena high-water within {worst_gap} B of the plan")

# ---- 2. ZeRO's formulas -------------------------------------------------------------------------
gpt = open(f"{root}/examples/gpt.plan").read()
model = gpt[:gpt.index("# ---- one rank")]
N = 4
FORMULAS = {  # (bf16, f32) in units of Psi
    0: (16, 16), 1: (4 + 12 / N, 8 + 8 / N), 2: (2 + 14 / N, 4 + 12 / N), 3: (16 / N, 16 / N)}
text = model
for z in range(4):
    for prec in ("bf16", "f32"):
        text += (f"\nplan z{z}_{prec} for gpt {{\n  mesh data = {N}\n  batch B = 16\n  shard B -> data\n"
                 f"  zero {z} over data\n" + ("  precision bf16, master = f32\n" if prec == "bf16" else "") +
                 "  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0\n"
                 "  sync strict, bucket = 1MiB, overlap\n}\n")
src = f"{work}/zero.plan"
open(src, "w").write(text)
for z in range(4):
    for i, prec in enumerate(("bf16", "f32")):
        plan = f"z{z}_{prec}"
        size = size_of(src, plan)
        psi = explain(src, plan, size)["parameters"]
        ranks, err = measure(src, plan, N, size=size)
        if err:
            check(f"ZeRO {z} {prec}", False, err)
            continue
        want = FORMULAS[z][i] * psi
        got = [sum(m["kinds"][k] for k in ("param", "grad", "optim", "master")) for m in ranks.values()]
        worst = max(abs(g - want) / want for g in got)
        check(f"ZeRO {z} {prec}{named('', size)} state", worst <= 0.02,
              f"measured {max(got) / psi:.4f} Psi per rank ({max(got) / 2**20:.3f} MiB) vs the formula "
              f"{FORMULAS[z][i]:.4f} Psi ({want / 2**20:.3f} MiB), worst {100 * worst:.2f}% off (tolerance 2%)")

# ---- 3. expert parallelism saves what it promises ---------------------------------------------
# examples/moe.plan's moe_gpt: L = 2 layers of E = 4 experts, each w1 [D, 4D] and w2 [4D, D], D = 128
# (or the --model-arg D the three plans run at). Over n ranks each rank holds E / n experts: its
# parameters and gradients are the single rank's less (1 - 1/n) of the experts' bytes, AdamW's two
# states twice that.
src = f"{root}/examples/moe.plan"
size = harness.common_size(planc, src, ["single", "ep2", "ep4"], SIZES)
L, E, D = 2, 4, int(dict(arg.split("=") for arg in size).get("D", 128))
experts = L * E * 2 * D * 4 * D * 4
single, err = measure(src, "single", 1, size=size)
for plan, n in (("ep2", 2), ("ep4", 4)):
    ranks, err2 = measure(src, plan, n, size=size)
    plan = named(plan, size)
    if err or err2:
        check(f"moe {plan} expert state", False, err or err2)
        continue
    base = single[0]["kinds"]
    want = {"param": base["param"] - experts * (1 - 1 / n), "grad": base["grad"] - experts * (1 - 1 / n),
            "optim": base["optim"] - 2 * experts * (1 - 1 / n)}
    bad = [f"rank {r} {k} {m['kinds'][k]} B, want {w:.0f}" for r, m in sorted(ranks.items()) for k, w in want.items()
           if m["kinds"][k] != w]
    check(f"moe {plan} expert state", not bad, "; ".join(bad[:3]) if bad else
          f"every rank holds {E // n} of {E} experts: parameters {ranks[0]['kinds']['param'] / 2**20:.3f} MiB "
          f"(single rank {base['param'] / 2**20:.3f} MiB), gradients and AdamW states alike")

runner.finish()
