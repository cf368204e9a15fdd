#!/usr/bin/env python3
"""tests/equiv: the contract that a plan never changes the result (docs/architecture.md, contract 1).

For the GPT, MLP, Llama and BERT examples, tests/equiv/ops.plan (every op of issue 9) and
tests/equiv/regress.plan (float inputs from a data set), every plan listed for the model in PLANS
is built with `planc build`, trained for STEPS steps under `mpirun -np WORLD` on data/corpus.txt
(or the model's data set, DATA), and compared with the single-rank plan of the same model: every step's loss within 1e-5 relative and the final weights
(saved with --save, read back here from the safetensors file) within 1e-4. dp2 is run twice and
must give bitwise identical losses. The GPT and MoE examples' plans train at a smaller size where
that keeps what the plan does (SIZES: the same collectives and pipeline as at the example's size;
tests/README.md, "equiv at a smaller size"). bf16 plans (named bf16*) are compared with the f32 run at bf16
tolerance. A listed plan that the model's file does not have is a failure, never a skip.
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_equiv.py PLANC REPO_ROOT [STEPS [MODEL... | -MODEL...]]
  MODEL: only these models (a key of PLANS); -MODEL: every model but these (tests/tests.cmake runs
  the models in groups, the last one as every model the others do not name)
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import comm_bytes  # noqa: E402  (tests/lib/comm_bytes.py)
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
env = harness.mpi_env(PLANRT_REPORT_COMM="1")
# the data each model trains on (data/corpus.txt: token windows; the others are data sets of named
# tensors)
DATA = {"bert": "data/classify.safetensors", "tests/equiv/regress": "data/regress", "gpt_docs": "data/corpus_tok"}


# Smaller sizes a model's plans may train at (planc --model-arg, over a plan's own `for gpt(L = 8)`),
# the smallest first. A plan (and its reference, at the same size) trains at the first size at which
# planc explain reports the same schedule as at the example's size (harness.schedule: every rank
# role's stage, ranks, micro-batches in flight and layers, every collective's kind, axis, phase and
# number of calls): the same sharding, collectives, buckets and pipeline, on less arithmetic. The
# GPT example at D 64 packs its gradients into fewer 1 MiB buckets than at D 128 (dp2: 1 all-reduce
# in the backward instead of 4), so its bucketed plans fall back to S 32 alone, which keeps them.
SIZES = {"gpt": [("D=64", "S=32"), ("S=32",)], "moe": [("D=64", "S=32"), ("S=32",)]}
FULL = ()  # the example's own size
model_args = harness.model_args
sizes = {}


def size_of(model, plan):
    """the smallest of SIZES[model] at which plan keeps its schedule, else FULL"""
    if (model, plan) not in sizes:
        sizes[model, plan] = harness.smaller_size(planc, plan_file(model), plan, SIZES.get(model, []))
    return sizes[model, plan]


def common_size(model, plans):
    """the size every one of plans keeps its schedule at (the least reduced of theirs)"""
    order = SIZES.get(model, []) + [FULL]
    return max((size_of(model, p) for p in plans), key=order.index)


def data_of(model):
    return f"{root}/{DATA.get(model, 'data/corpus.txt')}"
def plan_file(model):
    """a model of examples/ by name, or a plan file of the repository by its path without .plan"""
    return f"{root}/{model}.plan" if "/" in model else f"{root}/examples/{model}.plan"


work = harness.workdir("equiv")
tally = harness.Tally("equiv")
check = tally.check

# The plans checked for each model (examples/MODEL.plan) against its reference plan: "single", or
# the plan named after a colon (the same model with other hyperparameters, e.g. 8 layers).
PLANS = {
    "mlp": ["dp2", "dp4", "tp2", "tp4", "dp2_tp2", "tp2_sp", "zero1_dp4", "zero2_dp4", "zero3_dp4", "dp2_tp2_zero2",
            "bf16"],
    "gpt": ["dp2", "dp4", "tp2", "tp4", "dp2_tp2", "tp2_sp", "zero1_dp4", "zero2_dp4", "zero3_dp4", "dp2_tp2_zero2",
            "ulysses2", "tp2_sp_selective", "dp2_full_recompute", "dp2_tp2_sp", "dp2_tp2_sp_zero3",
            "pp2", "pp2_1f1b", "pp2_interleaved", "pp4", "pp4_1f1b", "pp2_dp2", "pp2_tp2_sp", "gpt_3d",
            "pp4_l8:single_l8", "pp4_1f1b_l8:single_l8", "pp4_interleaved_l8:single_l8",
            "dp4_async_s0", "dp2_local_sgd_k1:single_momentum",
            "bf16", "bf16_zero2_dp4", "bf16_pp2", "fp16", "fp16_dp2"],
    "llama": ["tp2", "tp2_patterns", "dp2_tp2_sp", "zero3_dp4"],
    "tests/equiv/mqa": ["tp2", "tp2_megatron", "tp4", "dp2_tp2", "dp2_tp2_sp"],
    "gpt_docs": ["dp2", "tp2", "tp2_sp"],
    "tests/equiv/ops": ["dp2", "tp2", "sp2", "dp2_tp2"],
    "tests/equiv/moe_names": ["ep2", "ep2_pattern"],
    "moe": ["ep2", "ep4", "ep2_tp2", "ep2_dp2", "ep2_dp2_zero1", "ep2_dp2_tp2_zero2", "switch_ep2:switch_single",
            "mixtral_ep2:mixtral_single", "mixtral_ep2_tp2:mixtral_single"],
    "bert": ["dp2", "tp2", "dp2_tp2_zero1"],
    "tests/equiv/regress": ["dp4", "tp2"],
    "tests/equiv/finetune": ["finetune_dp2:finetune", "finetune_zero3:finetune"],
}
# Plans that run the same step in a different order must give bitwise identical losses.
IDENTICAL = {"gpt": [["pp2", "pp2_1f1b", "pp2_interleaved"], ["pp4_l8", "pp4_1f1b_l8", "pp4_interleaved_l8"]]}
# bf16 plans: against the f32 run at bf16 tolerance, and against the single-rank bf16 plan (the
# same arithmetic in another order) more closely, on the loss and on the gradient norm.
BF16_LOSS_VS_F32, BF16_VS_BF16 = 2e-2, 2e-3
# fp16 plans (dynamic loss scaling, f32 masters): f16 keeps 3 more mantissa bits than bf16.
FP16_LOSS_VS_F32 = 2e-3


def explained(model, plan, size):
    return harness.explain(planc, plan_file(model), plan, args=model_args(size))


def label(model, plan, size):
    """a check's name: the model, the plan and the size it trains at when not the example's"""
    return f"{model} {plan}" + (f" ({', '.join(size)})" if size else "")


def check_bytes(model, plan, size, stderr):
    """planrt's per-kind, per-axis counters against explain's table (times the steps), every rank."""
    d = explained(model, plan, size)
    bad, total = comm_bytes.mismatches(d, stderr, steps)
    check(f"{label(model, plan, size)} bytes", not bad, "; ".join(bad[:2]) if bad else
          f"{total} bytes over {d['world']} rank(s) in {steps} steps, per kind and axis equal to explain's")


def read_weights(path):
    """{name: (shape, values)} of a --save file"""
    return {name: (shape, harness.as_floats(dtype, raw))
            for name, (dtype, shape, raw) in harness.read_safetensors(path).items()}


norms, runs = {}, {}


def run(model, plan, tag, size):
    """(losses, weights) of plan trained at size, or (None, the error); each (plan, size, tag) once"""
    if (model, plan, tag, size) in runs:
        return runs[model, plan, tag, size]
    name = f"{model.replace('/', '_')}_{plan}{''.join('_' + a.replace('=', '') for a in size)}"
    prog = f"{work}/{name}"
    err = harness.build(planc, plan_file(model), plan, prog, "--verify-ir", "--native", *model_args(size))
    if err:
        return None, err
    stem = f"{work}/{name}_{tag}"
    log, save = f"{stem}.jsonl", f"{stem}.safetensors"
    n = explained(model, plan, size)["world"]
    r = harness.mpirun(n, [prog, "--steps", str(steps), "--data", data_of(model), "--log", log, "--save", save], env)
    if r.returncode != 0:
        return None, f"mpirun -np {n} failed: {r.stderr.strip()[-400:]}"
    check_bytes(model, plan, size, r.stderr)
    lines = harness.read_log(log)
    norms[(model, plan, tag, size)] = [x["grad_norm"] for x in lines]
    runs[model, plan, tag, size] = ([x["loss"] for x in lines], read_weights(save)), None
    return runs[model, plan, tag, size]


def compare(name, ref, got, loss_tol, weight_tol):
    (l0, w0), (l1, w1) = ref, got
    if len(l1) != len(l0):
        check(f"{name} losses", False, f"{len(l1)} steps logged, want {len(l0)}")
        return
    worst = max(abs(a - b) / abs(a) for a, b in zip(l0, l1))
    check(f"{name} losses", worst <= loss_tol,
          f"{len(l1)} steps, worst relative difference {worst:.2e} (tolerance {loss_tol:g})")
    if set(w0) != set(w1):
        check(f"{name} weights", False, f"tensor names differ: {sorted(set(w0) ^ set(w1))[:5]}")
        return
    wworst, where = 0.0, ""
    for tensor in w0:
        s0, v0 = w0[tensor]
        s1, v1 = w1[tensor]
        if s0 != s1:
            check(f"{name} weights", False, f"{tensor}: shape {s1} vs {s0}")
            return
        d = max(abs(a - b) for a, b in zip(v0, v1))
        if d > wworst:
            wworst, where = d, tensor
    check(f"{name} weights", wworst <= weight_tol,
          f"{len(w0)} tensors, worst absolute difference {wworst:.2e} in {where} (tolerance {weight_tol:g})")


def relative(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


# the models to run: those named, or all but those named with a leading '-'
named = [m.lstrip("-") for m in sys.argv[4:]]
for m in sorted(set(named) - set(PLANS)):
    check(f"model {m}", False, f"run_equiv.py has no model '{m}' in PLANS: {sorted(PLANS)}")
excluding = [m.startswith("-") for m in sys.argv[4:]]
if any(excluding) and not all(excluding):
    check("arguments", False, f"either models or -models, not both: {sys.argv[4:]}")
if excluding and all(excluding):
    selected = [m for m in PLANS if m not in named]
else:
    selected = named or list(PLANS)

for model, entries in PLANS.items():
    if model not in selected:
        continue
    plans_here = {m.group(1) for m in re.finditer(r"^\s*plan\s+(\w+)", open(plan_file(model)).read(),
                                                  re.MULTILINE)}
    pairs = [(e.split(":")[0], e.split(":")[1] if ":" in e else "single") for e in entries]
    missing = sorted({p for pair in pairs for p in pair if p not in plans_here})
    for plan in missing:
        check(f"{model} {plan}", False, f"listed in run_equiv.py but {plan_file(model)} has no plan '{plan}'")
    pairs = [(p, r) for p, r in pairs if p not in missing and r not in missing]
    # the size each plan trains at; the plans whose losses must be bitwise identical at one size
    size = {p: size_of(model, p) for p, _ in pairs}
    for group in IDENTICAL.get(model, []):
        if all(p in size for p in group):
            size.update({p: common_size(model, group) for p in group})
    listed = {p for p, _ in pairs}
    refs = {}

    def reference(ref_plan, sz):
        """the reference plan's run at size sz (None if it failed), trained and checked once"""
        if (ref_plan, sz) not in refs:
            ref, err = run(model, ref_plan, "a", sz)
            if err:
                check(label(model, ref_plan, sz), False, err)
            else:
                check(f"{label(model, ref_plan, sz)} trains", ref[0][-1] < ref[0][0],
                      f"loss {ref[0][0]:.4f} -> {ref[0][-1]:.4f} over {steps} steps")
            refs[ref_plan, sz] = ref
        return refs[ref_plan, sz]

    results = {}
    for plan, ref_plan in pairs:
        if plan.startswith(("bf16", "fp16")) or not reference(ref_plan, size[plan]):
            continue
        got, err = run(model, plan, "a", size[plan])
        if err:
            check(label(model, plan, size[plan]), False, err)
            continue
        results[plan] = got
        compare(label(model, plan, size[plan]), reference(ref_plan, size[plan]), got, 1e-5, 1e-4)
    for group in IDENTICAL.get(model, []):
        have = [p for p in group if p in results]
        same = all(results[p][0] == results[have[0]][0] for p in have)
        check(f"{model} {' = '.join(group)}", same and len(have) == len(group),
              "bitwise identical losses" if same and len(have) == len(group) else
              f"losses differ or runs missing: {[results[p][0][:2] for p in have]}")
    if "dp2" in results:  # models with a dp2 plan: run it again
        again, err = run(model, "dp2", "b", size["dp2"])
        first = results["dp2"]
        if err:
            check(f"{model} dp2 repeatable", False, err)
        else:
            check(f"{model} dp2 repeatable", again[0] == first[0], "two runs give bitwise identical losses"
                  if again[0] == first[0] else f"losses differ: {again[0][:3]} vs {first[0][:3]}")
    # bf16 and fp16 plans: against the f32 reference at their tolerance, and against the single-rank
    # plan of their precision (bf16, fp16: listed first) at the same size more closely
    for kind, tolerance in (("bf16", BF16_LOSS_VS_F32), ("fp16", FP16_LOSS_VS_F32)):
        for plan, ref_plan in pairs:
            sz = size.get(plan)
            if not plan.startswith(kind) or not reference(ref_plan, sz):
                continue
            ref = reference(ref_plan, sz)
            got, err = run(model, plan, "a", sz)
            if err:
                check(label(model, plan, sz), False, err)
                continue
            worst = relative(ref[0], got[0]) if len(got[0]) == len(ref[0]) else float("inf")
            check(f"{label(model, plan, sz)} losses", worst <= tolerance,
                  f"{len(got[0])} steps, worst relative difference from f32 {worst:.2e} ({kind} tolerance {tolerance:g})")
            if plan == kind or kind not in listed:
                continue
            same, err = run(model, kind, "a", sz)
            if err:
                check(f"{label(model, plan, sz)} vs {kind}", False, f"the single-rank {kind} run: {err}")
                continue
            wl = relative(same[0], got[0])
            wn = relative(norms[(model, kind, "a", sz)], norms[(model, plan, "a", sz)])
            wn = wn if kind == "bf16" else 0.0  # fp16: the losses only
            check(f"{label(model, plan, sz)} vs {kind}", wl <= BF16_VS_BF16 and wn <= BF16_VS_BF16,
                  f"worst relative difference from the single-rank {kind} run: loss {wl:.2e}"
                  + (f", gradient norm {wn:.2e}" if kind == "bf16" else "") + f" (tolerance {BF16_VS_BF16:g})")

tally.finish()
