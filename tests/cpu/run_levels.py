#!/usr/bin/env python3
"""tests/cpu: instruction-set levels (runtime/include/planrt_cpu.h, docs/cpu.md).

A program planc builds carries its fused loops and planrt's kernels for every level of its
architecture and runs the best its CPU has, unless PLANRT_ISA forces one. For plans that
together use GELU, dropout, layer and RMS norm, SiLU, RoPE, bf16 and f16 storage and data parallelism,
the program (the C back end's default build) trains STEPS steps at every level this CPU runs
(its --help names them), and each level's losses and gradient norms must agree with the
baseline level's within the tolerance docs/cpu.md documents (FMA contraction from avx2 up changes
last bits): relative 1e-5 per step for f32 plans, 2e-3 for bf16 and f16. At every level, the LLVM
back end's program (--backend llvm: per-level loop functions) gives the C program's bytes, for every
plan (the same level on both, so their bitwise comparison stays meaningful: an f16 plan's GELU
gradient once fused a different product of two on each back end from avx2 up). Also:
  - the log's first line names the level that ran; without PLANRT_ISA it is the best level, and
    the run is bit for bit the forced best level's;
  - the avx2 level differs from the baseline in the last bits (its FMAs): the level took effect;
  - planc run (the JIT, for the forced level) gives the C program's bytes at every level;
  - an unknown level, and a level the CPU lacks (PLANRT_TEST_CPU_BEST makes this machine lack
    it), stop the program and planc run with a one-line error naming the levels it has;
  - a --native build trains within the tolerance of the baseline.
The GPT plans train at the first of SIZES at which they keep their schedule (harness.smaller_size,
as tests/equiv and tests/llvm train them): the levels differ per kernel, and a kernel runs the same
instructions at D 64 as at D 128, on less arithmetic; the check names say the size.
Prints PASS/FAIL per check and a closing 'N passed, M failed' line.
usage: run_levels.py PLANC REPO_ROOT [STEPS]
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Tally, model_args, mpi_env, smaller_size, workdir  # noqa: E402

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
TOL = {"f32": 1e-5, "bf16": 2e-3, "f16": 2e-3}
# (model, plan, ranks, precision)
PLANS = [("gpt", "single", 1, "f32"), ("llama", "single", 1, "f32"), ("gpt", "bf16", 1, "bf16"),
         ("gpt", "fp16", 1, "f16"), ("gpt", "dp2", 2, "f32")]
SIZES = {"gpt": [("D=64", "S=32"), ("S=32",)]}  # --model-arg sizes, the smallest first
work = workdir("cpu-levels")
data = f"{root}/data/corpus.txt"
t = Tally("cpu levels")


def plan_file(model):
    return f"{root}/examples/{model}.plan"


def build(model, plan, size, *flags):
    out = f"{work}/{model}_{plan}{''.join(f.replace('-', '_') for f in flags)}"
    r = subprocess.run([planc, "build", plan_file(model), "--plan", plan, "-o", out, *flags, *model_args(size)],
                       capture_output=True, text=True, env=mpi_env())
    return out if r.returncode == 0 else None, r.stderr.strip()[-400:]


def run(command, ranks, tag, level=None, **extra):
    """(log rows, saved bytes) or (None, stderr) of STEPS steps under PLANRT_ISA=level"""
    env = mpi_env(**extra)
    env.pop("PLANRT_ISA", None)
    if level:
        env["PLANRT_ISA"] = level
    log, save = f"{work}/{tag}.jsonl", f"{work}/{tag}.safetensors"
    for f in (log, save):
        if os.path.exists(f):
            os.remove(f)
    r = subprocess.run(["mpirun", "-np", str(ranks)] + command +
                       ["--steps", str(steps), "--data", data, "--log", log, "--save", save],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return None, r.stderr
    return ([json.loads(line) for line in open(log)], open(save, "rb").read()), None


def levels_of(prog):
    """the levels this CPU runs, from the program's --help cpu line"""
    out = subprocess.run([prog, "--help"], capture_output=True, text=True, env=mpi_env()).stdout
    m = re.search(r"^  cpu: (\w+) \(this CPU runs ([\w, ]+);", out, re.M)
    return m.group(2).split(", ") if m else None


def worst(a, b):
    if len(a) != len(b):
        return float("inf")
    return max(abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b) for k in ("loss", "grad_norm"))


def same(r1, r2):
    (l1, w1), (l2, w2) = r1, r2
    return [(x["loss"], x["grad_norm"]) for x in l1] == [(x["loss"], x["grad_norm"]) for x in l2] and w1 == w2


levels = None
for model, plan, ranks, precision in PLANS:
    size = smaller_size(planc, plan_file(model), plan, SIZES.get(model, []))
    name = f"{model} {plan}" + (f" ({', '.join(size)})" if size else "")
    jit = [planc, "run", plan_file(model), "--plan", plan, *model_args(size)]
    prog, err = build(model, plan, size)
    if not prog:
        t.check(f"{name} build", False, err)
        continue
    levels = levels or levels_of(prog)
    if not levels:
        t.check(f"{name} --help", False, "no 'cpu: LEVEL (this CPU runs ...;' line")
        continue
    res = {}
    for level in levels:
        res[level], err = run([prog], ranks, f"{model}_{plan}_{level}", level)
        if err:
            t.check(f"{name} at {level}", False, err.strip()[-400:])
            continue
        cpu = res[level][0][0].get("cpu")
        t.check(f"{name} at {level}: the log names it", cpu == level, f"first line's cpu: {cpu}")
        if level != "baseline" and "baseline" in res and res["baseline"]:
            w = worst(res["baseline"][0], res[level][0])
            t.check(f"{name} at {level} against baseline", w <= TOL[precision],
                    f"{steps} steps, worst relative difference of loss and gradient norm {w:.2e} (tolerance "
                    f"{TOL[precision]:g}){'; bitwise identical' if same(res['baseline'], res[level]) else ''}")
    if any(res.get(lv) is None for lv in levels):
        continue
    # the same level on both back ends
    lprog, err = build(model, plan, size, "--backend", "llvm")
    if not lprog:
        t.check(f"{name} --backend llvm build", False, err)
        continue
    for level in levels:
        got, err = run([lprog], ranks, f"{model}_{plan}_llvm_{level}", level)
        t.check(f"{name} --backend llvm at {level}", not err and same(got, res[level]),
                err.strip()[-300:] if err else "bit for bit the C program's" if same(got, res[level]) else
                f"differs from the C program (worst {worst(res[level][0], got[0]):.2e})")
    if (model, plan) != ("gpt", "single"):
        continue
    best = levels[-1]
    got, err = run([prog], ranks, f"{model}_{plan}_default")
    t.check(f"{name} without PLANRT_ISA", not err and got[0][0].get("cpu") == best and same(got, res[best]),
            err.strip()[-300:] if err else f"ran {got[0][0].get('cpu')}, the best level {best}; "
            f"{'bit for bit' if same(got, res[best]) else 'NOT bit for bit'} the forced {best} run")
    if "avx2" in levels:
        t.check(f"{name} avx2 took effect", not same(res["baseline"], res["avx2"]),
                "avx2's FMAs change the last bits of the weights (identical bytes: the level did not run)")
    # the same level in the JIT
    for level in levels:
        got, err = run(jit, ranks, f"{model}_{plan}_jit_{level}", level)
        t.check(f"{name} planc run at {level}", not err and same(got, res[level]),
                err.strip()[-300:] if err else "bit for bit the C program's" if same(got, res[level]) else
                f"differs from the C program (worst {worst(res[level][0], got[0]):.2e})")
    # refusals: one line naming the levels this CPU has
    cases = [("PLANRT_ISA=avx1024", [prog], {}, "avx1024", r"unknown instruction-set level; this architecture's are"),
             ("PLANRT_ISA=avx1024 under planc run", jit, {}, "avx1024",
              r"unknown instruction-set level"),
             (f"PLANRT_ISA={levels[-1]} where the CPU lacks it", [prog], {"PLANRT_TEST_CPU_BEST": "baseline"},
              levels[-1], rf"PLANRT_ISA={levels[-1]}: this CPU lacks {levels[-1]} \(.*\); it runs baseline:")]
    for what, command, extra, level, want in cases if len(levels) > 1 else cases[:2]:
        got, err = run(command, ranks, f"{model}_{plan}_refused", level, **extra)
        lines = [ln for ln in (err or "").splitlines() if ln.startswith("planrt: ")]
        t.check(f"{name} {what}", got is None and len(lines) == 1 and re.search(want, lines[0]) is not None,
                lines[0] if lines else "ran" if got else (err or "").strip()[-300:])
    nprog, err = build(model, plan, size, "--native")
    got, err = run([nprog], ranks, f"{model}_{plan}_native") if nprog else (None, err)
    t.check(f"{name} --native", not err and worst(res["baseline"][0], got[0]) <= TOL[precision],
            err.strip()[-300:] if err else f"worst relative difference from baseline "
            f"{worst(res['baseline'][0], got[0]):.2e}; {'bit for bit' if same(got, res[best]) else 'not bit for bit'} "
            f"the {best} level")
t.finish()
