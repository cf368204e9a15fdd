#!/usr/bin/env python3
"""tests/attention: the fused attention (compiler/graph/attention.c) trains like the attention as
written. Each model's plan is built twice, as is and with `attention unfused` added (a copy of the
plan file), trained for STEPS steps on the model's data, and compared: every step's loss within 1e-5
relative and the final weights within 1e-4 (dropout on the probabilities draws the same Philox
mask in both). The fused build must hold a fused attention kernel and the unfused one none, and
explain must show what fusing is for: the fused plan's activations below the unfused plan's by at
least the [B, H, S, S] scores of every layer.
Models: GPT (causal, dropout; also under tensor parallelism and Ulysses), Llama (GQA, RoPE, no
dropout), BERT (no mask, dropout), GPT on documents (an additive [B, 1, S, S] mask).
usage: run_fused.py PLANC REPO_ROOT [STEPS]
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
env = harness.mpi_env()
work = harness.workdir("attention")
tally = harness.Tally("fused attention")
check = tally.check
# --model-arg sizes for examples/gpt.plan, the smallest first (tests/equiv's): each GPT case trains at
# the first at which it keeps its schedule (harness.smaller_size), fused and unfused alike; the
# fused kernel's tiles are 64 rows (runtime/cpu/attention_impl.h), so S 32 and S 64 are both one tile
GPT_SIZES = [("D=64", "S=32"), ("S=32",)]
CASES = [("gpt", "single", "data/corpus.txt"), ("gpt", "tp2", "data/corpus.txt"), ("gpt", "ulysses2", "data/corpus.txt"),
         ("llama", "single", "data/corpus.txt"), ("bert", "single", "data/classify.safetensors"),
         ("gpt_docs", "single", "data/corpus_tok")]


def unfused_copy(model):
    """examples/MODEL.plan with `attention unfused` as the first statement of every plan"""
    text = open(f"{root}/examples/{model}.plan").read()
    path = f"{work}/{model}_unfused.plan"
    open(path, "w").write(re.sub(r"^(plan \w+ for [^{]*\{)\n", r"\1\n  attention unfused\n", text, flags=re.M))
    return path


def train(src, plan, data, tag, size):
    prog = f"{work}/{os.path.basename(src)}_{plan}_{tag}"
    err = harness.build(planc, src, plan, prog, "--verify-ir", "--native", *harness.model_args(size))
    if err:
        return None, err
    kernels = open(f"{prog}.c").read() if os.path.exists(f"{prog}.c") else ""
    log, save = f"{prog}.jsonl", f"{prog}.safetensors"
    world = harness.explain(planc, src, plan, args=harness.model_args(size))["world"]
    r = harness.mpirun(world, [prog, "--steps", str(steps), "--data", f"{root}/{data}", "--log", log, "--save", save],
                       env)
    if r.returncode != 0:
        return None, f"run failed: {r.stderr.strip()[-300:]}"
    weights = {n: harness.as_floats(d, raw) for n, (d, _, raw) in harness.read_safetensors(save).items()}
    return ([x["loss"] for x in harness.read_log(log) if "loss" in x], weights, kernels), None


def fused_kernels(src, plan):
    dump = subprocess.run([planc, "check", src, "--plan", plan, "--dump-after=lower"], capture_output=True,
                          text=True).stdout
    return len(re.findall(r" (?:c\d+ )?attention\(", dump))


for model, plan, data in CASES:
    src, usrc = f"{root}/examples/{model}.plan", unfused_copy(model)
    size = harness.smaller_size(planc, src, plan, GPT_SIZES) if model == "gpt" else ()
    name = f"{model} {plan}" + (f" ({', '.join(size)})" if size else "")
    nf, nu = fused_kernels(src, plan), fused_kernels(usrc, plan)
    check(f"{name} fused", nf > 0 and nu == 0, f"{nf} fused attention kernels as written, {nu} unfused")
    a, err = train(src, plan, data, "fused", size)
    b, err2 = train(usrc, plan, data, "unfused", size)
    if err or err2:
        check(f"{name} trains", False, err or err2)
        continue
    (l0, w0, _), (l1, w1, _) = b, a
    worst = max(abs(x - y) / abs(x) for x, y in zip(l0, l1)) if len(l0) == len(l1) == steps else 1.0
    check(f"{name} losses", worst <= 1e-5, f"{len(l1)} steps, worst relative difference {worst:.2e} (tolerance 1e-5)")
    wworst = max(max(abs(x - y) for x, y in zip(w0[n], w1[n])) for n in w0) if set(w0) == set(w1) else 1.0
    check(f"{name} weights", wworst <= 1e-4, f"worst difference {wworst:.2e} (tolerance 1e-4)")
    ef, eu = (harness.explain(planc, f, plan, args=harness.model_args(size)) for f in (src, usrc))
    act_f = ef["roles"][0]["bytes"]["activations"]
    act_u = eu["roles"][0]["bytes"]["activations"]
    check(f"{name} memory", act_f < act_u, f"activations {act_f} bytes fused, {act_u} unfused")

tally.finish()
