#!/usr/bin/env python3
"""tests/emit: `repeat` printed as loops (issue 21; docs/ir.md, "Layers as loops").

The C target prints each run of identical layers (compiler/lower/layer_runs.c) as one loop over
the layer, with per-layer tables of what differs by layer; `--no-layer-loops` prints every layer
in full, as before. For each plan of PLANS (one rank, data + tensor parallel, a 1F1B pipeline of
four layers a stage with tensor and sequence parallelism, one with data parallelism and ZeRO-1,
full recompute) the test
  - emits both and checks what the loops are for: the looped prog.c has loops, the unrolled none,
    and the looped file is smaller (its size and the unrolled one's are printed);
  - for the pipelines, that each stage's forward is one loop over all the stage's layers, and its
    backward too but in the first stage (`planc check --dump-after=layers`); for every plan, that
    no per-layer table of pointers lists views of one buffer at evenly spaced offsets (ZeRO's flat
    parameters, a gradient bucket): the loop reads the first layer's pointer plus l strides;
  - builds both with planc build, trains each STEPS steps under mpirun on the plan's world size,
    and requires every step's loss and gradient norm and the weights saved with --save to be the
    same bits.
The LLVM back end builds the same runs as loops (a counted loop over the layer in the phase
function): for each plan of PLANS its module (planc emit llvm) must make one call a kernel it
builds (`call void`), as many as `planc check --dump-after=layers` counts for a loop target (every
kernel outside a run, one body per run), fewer than the program's kernels (what an unrolled module
calls).
GPT-3 175B on 64 ranks (examples/gpt175b.plan, t8_p8: eight pipeline stages) must print in under
300 KB (issue 21's target), with every loop over layers a function the stages share: no stage
prints a layer loop of its own (the first and last stage hold their layers' places otherwise
than the middle ones, which the shapes must not tell apart; docs/ir.md).
Then every plan of examples/*.plan is emitted with loops and must compile (mpicc -fsyntax-only with
planc build's warnings as errors): the four trained plans do not hold every shape a loop takes
(ZeRO shards of flat buckets in the init, save and checkpoint loops, state families indexed from
local tables).
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_layer_loops.py PLANC REPO_ROOT [STEPS]
"""
import concurrent.futures
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
env = harness.mpi_env()
work = harness.workdir("layer-loops")
PLANS = [("gpt", "single"), ("gpt", "dp2_tp2"), ("extra", "pp2_tp2_sp_l8"), ("extra", "dp2_pp2_zero1_l8"),
         ("gpt", "dp2_full_recompute")]
# examples/gpt.plan's pipelines have one or two layers a stage: a run of two layers prints about as
# long as a loop as unrolled, so the pipelines here have four
EXTRA_PLANS = """
plan pp2_tp2_sp_l8 for gpt(L = 8) {
  mesh pipe = 2, tensor = 2
  batch B = 16, micro_batches = 4
  use nn.megatron(tensor)
  use nn.sequence_parallel(tensor)
  pipeline pipe: 1f1b, stages = 2
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
  sync strict, overlap
}

plan dp2_pp2_zero1_l8 for gpt(L = 8) {
  mesh data = 2, pipe = 2
  batch B = 16, micro_batches = 4
  shard B -> data
  pipeline pipe: 1f1b, stages = 2
  zero 1 over data
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}
"""
# the pipelines' layers a stage (each stage's forward is one loop over all of them, and so is the
# backward of every stage but the first, whose layer 0 the embedding's gradient follows)
STAGE_LAYERS = {"pp2_tp2_sp_l8": 4, "dp2_pp2_zero1_l8": 4}
gpt_text = open(f"{root}/examples/gpt.plan").read()
extra_plan_file = f"{work}/extra.plan"
open(extra_plan_file, "w").write(gpt_text[:gpt_text.index("# ---- one rank")] + EXTRA_PLANS)


def plan_file(model):
    return extra_plan_file if model == "extra" else f"{root}/examples/{model}.plan"
FLAVOURS = {"loops": [], "unrolled": ["--no-layer-loops"]}
LOOP_MARK = "one loop, "  # the comment that opens each folded run in prog.c


def emitted(model, plan, flags):
    """(prog.c's text, None) from planc emit c, or (None, the error)"""
    out = f"{work}/{model}_{plan}_emit{'_'.join(flags)}"
    r = subprocess.run([planc, "emit", "c", plan_file(model), "--plan", plan, "-o", out, *flags],
                       capture_output=True, text=True)
    if r.returncode:
        return None, f"planc emit c failed: {r.stderr.strip()[:300]}"
    return open(f"{out}/prog.c").read(), None


def llvm_loops(model, plan):
    """(ok, detail): the LLVM module of the plan calls each run's body once, not once a layer"""
    out = f"{work}/{model}_{plan}_llvm"
    r = subprocess.run([planc, "emit", "llvm", plan_file(model), "--plan", plan, "-o", out],
                       capture_output=True, text=True)
    if r.returncode:
        return False, f"planc emit llvm failed: {r.stderr.strip()[:300]}"
    calls = open(f"{out}/prog.ll").read().count("call void")
    r = subprocess.run([planc, "check", plan_file(model), "--plan", plan, "--dump-after=layers"],
                       capture_output=True, text=True)
    last = [x for x in r.stdout.splitlines() if x.startswith("all programs: ")]
    if r.returncode or not last:
        return False, f"planc check --dump-after=layers failed: {r.stderr.strip()[:300]}"
    kernels, looped = (int(x.split()[0]) for x in last[0][len("all programs: "):].split(", "))
    return calls == looped < kernels, (f"prog.ll makes {calls} kernel calls: {looped} as loops, "
                                       f"{kernels} unrolled (planc check --dump-after=layers)")


def stage_runs(model, plan):
    """(ok, detail): every stage's forward is one run over all its layers: the stage's first layer
    (which reads the inbox the pipeline received into) and its last (whose output is sent) are in
    the loop like the rest (compiler/lower/layer_runs.c); so is the backward of every stage after
    the first (a gradient bucket that its first layer completes starts after that layer's block:
    compiler/lower/overlap.c)"""
    r = subprocess.run([planc, "check", plan_file(model), "--plan", plan, "--dump-after=layers"],
                       capture_output=True, text=True)
    fwd = re.findall(r"^  forward chunk 0: layers (\d+)\.\.(\d+) \((\d+) x", r.stdout, re.M)
    bwd = re.findall(r"^  backward chunk 0: layers (\d+)\.\.(\d+) \((\d+) x", r.stdout, re.M)
    stages = r.stdout.count("program stage ")
    ok = r.returncode == 0 and stages > 1 and len(fwd) == len(bwd) == stages and \
        all(int(n) == STAGE_LAYERS[plan] for _, _, n in fwd + bwd[1:])
    return ok, (f"{stages} stages, forward runs: " + ", ".join(f"layers {a}..{b}" for a, b, _ in fwd) +
                "; backward runs: " + ", ".join(f"layers {a}..{b}" for a, b, _ in bwd))


def view_tables(text):
    """the per-layer pointer tables of prog.c whose entries are views of one buffer at evenly
    stepping offsets (`#define NAME (ROOT + OFFSET)`): what a loop prints as the first layer's
    pointer plus l strides instead (layer_values.c's LV_VIEW)"""
    views = {m[0]: (m[1], int(m[2])) for m in re.findall(r"^#define (\w+) \((\w+) \+ (-?\d+)\)$", text, re.M)}
    found = []
    for name, body in re.findall(r"\*const (\w+)\[\d+\] = \{([^}]*)\}", text):
        entries = [views.get(x.strip()) for x in body.split(",")]
        if len(entries) > 2 and all(entries) and len({root for root, _ in entries}) == 1:
            steps = {b[1] - a[1] for a, b in zip(entries, entries[1:])}
            if len(steps) == 1 and 0 not in steps:
                found.append(name)
    return found


def trained(model, plan, flavour, world):
    """((loss, grad_norm) per step, the saved weights' bytes), or an error string"""
    stem = f"{work}/{model}_{plan}_{flavour}"
    err = harness.build(planc, plan_file(model), plan, stem, *FLAVOURS[flavour])
    if err:
        return err
    log, save = f"{stem}.jsonl", f"{stem}.safetensors"
    r = harness.mpirun(world, [stem, "--steps", str(steps), "--data", f"{root}/data/corpus.txt", "--log", log,
                               "--save", save], env, timeout=600)
    if r.returncode:
        return f"mpirun failed: {r.stderr.strip()[-300:]}"
    return [(x["loss"], x["grad_norm"]) for x in harness.read_log(log)], open(save, "rb").read()


def one(model, plan):
    checks = []
    texts = {}
    for flavour, flags in FLAVOURS.items():
        texts[flavour], err = emitted(model, plan, flags)
        if err:
            return [(f"{model} {plan} emit ({flavour})", False, err)]
    loops, unrolled = texts["loops"].count(LOOP_MARK), texts["unrolled"].count(LOOP_MARK)
    small = len(texts["loops"]) < len(texts["unrolled"])
    checks.append((f"{model} {plan} prints its layers as loops", loops > 0 and unrolled == 0 and small,
                   f"{loops} loops, prog.c {len(texts['loops'])} bytes; --no-layer-loops: {unrolled} loops, "
                   f"{len(texts['unrolled'])} bytes"))
    ok, detail = llvm_loops(model, plan)
    checks.append((f"{model} {plan}: the LLVM module builds its layers as loops", ok, detail))
    if plan in STAGE_LAYERS:
        ok, detail = stage_runs(model, plan)
        checks.append((f"{model} {plan}: each stage's forward and backward is one loop over its layers", ok,
                       detail))
    tables = view_tables(texts["loops"])
    checks.append((f"{model} {plan}: no per-layer table of evenly spaced views", not tables,
                   f"{len(tables)} such tables{': ' + ', '.join(tables[:3]) if tables else ''}"))
    world = harness.explain(planc, plan_file(model), plan)["world"]
    runs = {flavour: trained(model, plan, flavour, world) for flavour in FLAVOURS}
    for flavour, got in runs.items():
        if isinstance(got, str):
            return checks + [(f"{model} {plan} trains ({flavour})", False, got)]
    (la, wa), (lb, wb) = runs["loops"], runs["unrolled"]
    same = la == lb and len(la) == steps and wa == wb
    checks.append((f"{model} {plan} loops = unrolled, bit for bit", same,
                   f"{steps} steps on {world} ranks: losses, gradient norms and saved weights identical" if same else
                   f"losses {la} vs {lb}; weights {'equal' if wa == wb else 'differ'}"))
    return checks


def compiles(plan_path, plan):
    """None when the looped prog.c of the plan compiles (or planc refuses to build the plan), else the error"""
    out = f"{work}/syntax_{os.path.basename(plan_path)}_{plan}"
    r = subprocess.run([planc, "emit", "c", plan_path, "--plan", plan, "-o", out], capture_output=True, text=True)
    if r.returncode:
        return None  # a plan the C target does not execute: planc build says so (tests/front/errors)
    r = subprocess.run(["mpicc", "-std=gnu11", "-fsyntax-only", "-fno-trapping-math", "-Wall", "-Wextra", "-Werror",
                        f"-I{root}/runtime/include", f"{out}/prog.c"], capture_output=True, text=True)
    return r.stderr.strip()[:400] if r.returncode else None


def example_plans():
    for name in sorted(os.listdir(f"{root}/examples")):
        if name.endswith(".plan"):
            path = f"{root}/examples/{name}"
            for line in open(path):
                if line.startswith("plan "):
                    yield path, line.split()[1]


def shared_175b():
    """(ok, detail): gpt175b t8_p8's prog.c is under 300 KB and its stages print no layer loop of
    their own (every `for (int l` is in a shared layers_loopN function)"""
    text, err = emitted("gpt175b", "t8_p8", [])
    if err:
        return False, err
    in_place, fn = 0, None
    for line in text.split("\n"):
        m = re.match(r"static void (\w+)\(", line)
        if m:
            fn = m.group(1)
        elif line.startswith("}"):
            fn = None
        elif "for (int l = 0; l < " in line and fn and not fn.startswith("layers_loop"):
            in_place += 1
    shared = len(re.findall(r"^static void layers_loop\d+\(", text, re.M))
    return len(text) < 300_000 and in_place == 0 and shared > 0, \
        f"{len(text):,} B, {shared} shared loop functions, {in_place} loops a stage prints in place"


tally = harness.Tally("layer loops")
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for checks in pool.map(lambda mp: one(*mp), PLANS):
        for name, ok, detail in checks:
            tally.check(name, ok, detail)
    tally.check("gpt175b t8_p8: prog.c under 300 KB, every layer loop one function the stages share",
                *shared_175b())
    examples = list(example_plans())
    errors = [(path, plan, err) for (path, plan), err in
              zip(examples, pool.map(lambda pp: compiles(*pp), examples)) if err]
    tally.check(f"every example plan's looped prog.c compiles ({len(examples)} plans)", not errors,
                "; ".join(f"{os.path.basename(p)} {q}: {e}" for p, q, e in errors[:3]))
tally.finish()
