#!/usr/bin/env python3
"""tests/llvm: the differential test of the two back ends (docs/architecture.md, section 5: a free oracle).

Each plan of DIFF_PLANS is built twice, with `planc build --native` (the C back end: emit_c.c,
mpicc -O3 -march=native) and `planc build --native --backend llvm` (the LLVM back end: emit_llvm.c,
default<O3> for the host CPU, an object linked with planrt; --verify-ir also verifies the optimised
module), and each program trains STEPS steps under `mpirun -np WORLD`. Every step's loss and
gradient norm must agree within 1e-6 relative. A plan is reported bitwise when the logs are
identical and the weights saved with --save are the same bytes. For RUN_PLANS, `planc run` (the
JIT, for this CPU) must give the built LLVM program's bytes exactly (the same module, compiled
in-process).

One instruction-set level. The back ends differ per kernel, and a --native build compiles each
fused loop once, for this CPU (FMA where it has it: both back ends fuse a multiply into its add
alike), as the default build's best level does. The default build (every level in one binary,
the level chosen at start) is tests/cpu's (ctest cpu_levels): there both back ends train at every
level this CPU runs, bit for bit, and planc run at every forced level, on plans with GELU,
dropout, layer and RMS norm, SiLU, RoPE, bf16, f16 and data parallelism; the per-level tables
(loop<k>_at) are the same code for every kernel kind. Building every level here made each build
about a third dearer for no kernel those runs do not reach (the test carried every level and
compared only the best one).

Size. Each plan trains at the smallest of SIZES at which it keeps its schedule (harness.smaller_size:
the same collectives, stages and layers as at its model's size; tests/equiv trains the same way),
else at its model's size; both back ends build and train it at that size (--model-arg), so the
comparison is of the same program: what differs between the back ends is per kernel, and a kernel
does the same at D 64 as at D 128, on less arithmetic. The check names say the size.

Coverage. The back ends differ per kernel, not per plan, so DIFF_PLANS is a set of plans that
together use everything any plan uses, rather than every plan (training all of tests/equiv's
plans twice was the slowest test of the suite). The test computes, for every plan of examples/
and every plan tests/equiv/run_equiv.py lists, its features:
  kernel PHASE:KIND   each kernel kind of the loop-level IR per phase (planc check
                      --dump-after=memplan; not the checkpoint, resume and eval phases, which a
                      training run without --save-every or --eval-every does not enter)
  op KIND DTYPE       each graph op with its result's dtype (--dump-after=sync): what the fused
                      element-wise loops compute, in which precision
  pipeline / sync / zero   the pipeline schedule, the sync mode with its compressor and outer
                      optimizer, the ZeRO stage (planc explain --json; an example plan's from
                      tests/explain/golden, which explain_goldens holds equal to planc's output)
The dumps come from one `planc check FILE --dump-after=PASS` per file (every plan of it, in order)
rather than one compilation per plan and pass. The test fails, naming a plan that has it, if a
feature of any of them (at its model's size) is in no plan of DIFF_PLANS as trained (at the size it
trains at: a feature a smaller size loses counts as not covered). EXTRA_PLANS, written here on the GPT example, cover what only the
7B / 175B examples use (too large to train here): bf16 tensor-parallel all-reduces and slices,
an overlapped ZeRO-3 bucket, and the attention as written in bf16 (gpt7b's
`attention unfused` plans), the bf16 layer norms a full recomputation runs in the backward
(gpt175b's t8_p8_full: bf16_zero3_overlap recomputes); and DiLoCo's outer step, which dp4_diloco takes after 16 steps.
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_diff.py PLANC REPO_ROOT [STEPS]
"""
import ast
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
env = harness.mpi_env()
# the data each model trains on (data/corpus.txt: token windows; the others are data sets of named
# tensors)
DATA = {"bert": "data/classify.safetensors", "tests/equiv/regress": "data/regress"}


def data_of(model):
    return f"{root}/{DATA.get(model, 'data/corpus.txt')}"
def plan_file(model):
    """a model of examples/ by name, a plan file of the repository by its path without .plan, or
    "extra" (EXTRA_PLANS)"""
    if model == "extra":
        return extra_plan_file
    return f"{root}/{model}.plan" if "/" in model else f"{root}/examples/{model}.plan"


work = harness.workdir("llvm-diff")
env["PLANRT_OFFLOAD_DIR"] = work  # (the optimizer state files of offload -> disk)
TOL = 1e-6
# planc run against the built LLVM program too (the JIT; an MLP, and GELU, dropout and a pipeline)
RUN_PLANS = [("mlp", "dp2"), ("gpt", "pp2")]
# the plans trained on both back ends: together they have every feature of every plan of examples/
# and tests/equiv (checked below)
DIFF_PLANS = [
    ("tests/equiv/ops", "dp2_tp2"), ("tests/equiv/regress", "tp2"), ("bert", "dp2_tp2_zero1"),
    ("tests/equiv/finetune", "finetune_zero3"), ("moe", "ep2_dp2_tp2_zero2"), ("moe", "mixtral_ep2"),
    ("llama", "dp2_tp2_sp"), ("gpt", "gpt_3d"), ("gpt", "pp2"), ("gpt", "pp2_interleaved"),
    ("gpt", "dp2_full_recompute"), ("gpt", "bf16_zero2_dp4"), ("gpt", "fp16_dp2"), ("gpt", "dp4_async_s0"),
    ("gpt", "dp2_local_sgd_k1"), ("extra", "dp2_diloco_every2"), ("gpt", "dp4_bf16_grads"), ("gpt", "dp4_fp16_grads"),
    ("gpt", "dp4_topk_zero1"), ("gpt", "dp4_powersgd"), ("gpt", "bf16_zero3_offload_disk"),
    ("gpt", "zero3_offload"), ("gpt", "bf16_pp2"), ("mlp", "bf16"), ("extra", "bf16_tp2_sp_zero3"),
    ("extra", "bf16_zero3_overlap"), ("extra", "bf16_unfused_attention"),
    ("tests/context/cp", "cp2_dp2_zero1_recompute"),  # the ring (context parallelism, tests/context)
    ("tests/context/cp", "llama_single_bf16"),  # RoPE and RMS norm on bf16 storage (rope_16, rms_norm_16)
    ("tests/equiv/mqa", "dp2_tp2_sp"),  # key/value heads replicated over tensor ranks (repeat_kv)
    ("mlp", "dp2")]
# --model-arg sizes to train each model's plans at, the smallest first (tests/equiv/run_equiv.py's
# for the GPT and MoE examples): a plan trains at the first at which it keeps its schedule
# (harness.smaller_size: the same collectives, stages and layers), else at its model's own size;
# the coverage below is of the plans as trained, at that size
SIZES = {"gpt": [("D=64", "S=32"), ("S=32",)], "extra": [("D=64", "S=32"), ("S=32",)],
         "moe": [("D=64", "S=32"), ("S=32",)], "tests/context/cp": [("S=64",)]}
# plans on the GPT example for features only the large examples have
EXTRA_PLANS = """
plan bf16_tp2_sp_zero3 for gpt {
  mesh data = 2, tensor = 2
  batch B = 16
  shard B -> data
  use nn.megatron(tensor)
  use nn.sequence_parallel(tensor)
  zero 3 over data
  precision bf16, master = f32
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
  sync strict, bucket = 1MiB, overlap
}

plan bf16_zero3_overlap for gpt {
  mesh data = 2
  batch B = 16
  shard B -> data
  zero 3 over data
  recompute full
  precision bf16, master = f32
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
  sync strict, bucket = 1MiB, overlap
}

# examples/gpt.plan's dp4_diloco takes its outer step every 16 steps, after the STEPS trained
# here: the same on two ranks every 2 steps (the outer Nesterov step at steps 2 and 4)
plan dp2_diloco_every2 for gpt {
  mesh data = 2
  batch B = 16
  shard B -> data
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
  sync local_sgd, every = 2, outer = nesterov(lr = 0.7, momentum = 0.9)
}

plan bf16_unfused_attention for gpt {
  mesh data = 1
  batch B = 16
  attention unfused
  precision bf16, master = f32
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}
"""
gpt_text = open(f"{root}/examples/gpt.plan").read()
extra_plan_file = f"{work}/extra.plan"
open(extra_plan_file, "w").write(gpt_text[:gpt_text.index("# ---- one rank")] + EXTRA_PLANS)


def equiv_plans():
    """PLANS from tests/equiv/run_equiv.py (read, not imported: importing it runs the suite)."""
    tree = ast.parse(open(f"{root}/tests/equiv/run_equiv.py").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PLANS" for t in node.targets):
            plans = ast.literal_eval(node.value)
            out = []
            for model, entries in plans.items():
                # each entry's reference (after a colon, else "single") and the plan itself
                names = [n for e in entries for n in ((e + ":single").split(":")[1], e.split(":")[0])]
                out += [(model, n) for n in dict.fromkeys(names)]
            return out
    raise SystemExit("tests/equiv/run_equiv.py has no PLANS dict")


def example_plans():
    out = []
    for path in sorted(glob.glob(f"{root}/examples/*.plan")):
        model = os.path.basename(path)[:-5]
        out += [(model, p) for p in re.findall(r"^plan\s+(\w+)", open(path).read(), re.M)]
    return out


KERNEL = re.compile(r"^\s*\d+ (\w+)\s+c\d+ (\w+)\(", re.M)  # "12 forward  c0 permute(...)"
OP = re.compile(r"^\s*\d+ [A-Z] %\d+:(\w+)\[[^\n]*? = (\w+)", re.M)  # "4 F %4:f32[...] = embed %2, %0"
# sync.c's annotations (collectives state.c writes; not graph ops): "bucket 0: all_reduce axis=data
# stage=0 per step, 264192 f32 elements of ...", "tied: %423 (stage 0) + %424 (stage 1) over pipe"
BUCKET = re.compile(r"^bucket \d+: (\w+) axis=\S+ [^\n]*?, \d+ (\w+) elements", re.M)
TIED = re.compile(r"^tied: %(\d+) ", re.M)
UNTRAINED_PHASES = {"checkpoint", "resume", "eval_begin", "eval_end"}


DUMP_HEADER = {"memplan": re.compile(r"^# loop-level IR after memplan\n", re.M),
               "sync": re.compile(r"^# IR after sync: .*\n", re.M)}


def file_dumps(src, what, plan=None, size=()):
    """{plan: its IR after pass WHAT} for every plan of SRC, from one `planc check SRC
    --dump-after=WHAT` (which compiles the file's plans in their order), or a string saying what
    failed. One compilation per file instead of one per plan and pass. With PLAN: that plan alone
    at SIZE (--model-arg NAME=VALUE ...), as it is trained here."""
    which = ["--plan", plan, *harness.model_args(size)] if plan else []
    r = subprocess.run([planc, "check", src, *which, f"--dump-after={what}"], capture_output=True, text=True)
    if r.returncode:
        return f"planc check {src} {' '.join(which)} --dump-after={what} failed: {r.stderr.strip()[:300]}"
    dumps = DUMP_HEADER[what].split(r.stdout)[1:]
    names = [plan] if plan else re.findall(r"^plan\s+(\w+)", open(src).read(), re.M)
    if len(dumps) != len(names):
        return f"planc check {src} --dump-after={what}: {len(dumps)} dumps for the file's {len(names)} plans"
    return dict(zip(names, dumps))


def plan_json(model, plan, size=()):
    """explain --json of a plan (at SIZE): an example's at its own size from tests/explain/golden
    (explain_goldens holds those equal to planc's output), the others' from planc"""
    golden = f"{root}/tests/explain/golden/{model}.{plan}.json"
    if not size and "/" not in model and model != "extra" and os.path.exists(golden):
        return json.load(open(golden))
    return harness.explain(planc, plan_file(model), plan, args=harness.model_args(size))


def features(model, plan, dumps, size=()):
    """the set of features of one plan (see the top of the file) at SIZE, or a string saying what
    failed; dumps: file_dumps of its file (or of the plan at SIZE) by pass"""
    for what in ("memplan", "sync"):
        if isinstance(dumps[what], str):
            return dumps[what]
    memplan, sync = dumps["memplan"][plan], dumps["sync"][plan]
    f = {f"kernel {ph}:{kind}" for ph, kind in KERNEL.findall(memplan) if ph not in UNTRAINED_PHASES}
    if not f:
        return "no kernels found in the --dump-after=memplan output (its format changed?)"
    f |= {f"op {op} {dtype}" for dtype, op in OP.findall(sync)}
    f |= {f"op {coll} {dtype}" for coll, dtype in BUCKET.findall(sync)}
    for v in TIED.findall(sync):  # the pair's gradients are summed in the parameter's dtype
        dtype = re.search(rf"%{v}:(\w+)\[", sync)
        f.add(f"op all_reduce {dtype.group(1) if dtype else '?'}")
    try:
        d = plan_json(model, plan, size)
    except subprocess.CalledProcessError as e:
        return f"planc explain {plan_file(model)} --plan {plan} --json failed: {e.stderr.strip()[:300]}"
    if d.get("pipeline"):
        f.add(f"pipeline {d['pipeline']['schedule']}")
    s = d.get("sync") or {}
    f.add(f"sync {s.get('mode')}, compress {s.get('compress')}, outer {s.get('outer')}")
    f.add(f"zero {d.get('zero')}")
    return f


def train(model, plan, world, tag, command):
    """command: the program's argv before the run options; returns (log lines, saved bytes) or an error."""
    stem = f"{work}/{model.replace('/', '_')}_{plan}_{tag}"
    log, save = f"{stem}.jsonl", f"{stem}.safetensors"
    r = harness.mpirun(world, command + ["--steps", str(steps), "--data", data_of(model), "--log", log, "--save", save],
                       env, timeout=600)
    if r.returncode != 0:
        return None, f"{tag}: mpirun failed: {r.stderr.strip()[-400:]}"
    return (harness.read_log(log), open(save, "rb").read()), None


def host_offload(model, plan):
    """-> host offload is the CUDA target's; the tests run its program on the CPU (emit_c.c)"""
    body = re.search(r"^plan " + plan + r" for .*?^}", open(plan_file(model)).read(), re.S | re.M)
    return bool(body and re.search(r"^\s*offload .*-> host", body.group(0), re.M))


def build(model, plan, size, backend):
    prog = f"{work}/{model.replace('/', '_')}_{plan}_{backend}"
    e = dict(env, PLANC_TEST_HOST_OFFLOAD_ON_CPU="1") if host_offload(model, plan) else env
    err = harness.build(planc, plan_file(model), plan, prog, "--backend", backend, "--verify-ir", "--native",
                        *harness.model_args(size), env=e)
    return (None, err) if err else (prog, "")


def verdict(bitwise, worst):
    return ("bitwise identical (losses, gradient norms, saved weights)" if bitwise else
            f"worst relative difference {worst:.2e} (tolerance {TOL:g})")


def compare(c, l):
    """(bitwise, worst relative difference of loss and grad norm over the steps)"""
    (lc, wc), (ll, wl) = c, l
    if len(lc) != len(ll):
        return False, float("inf")
    worst = 0.0
    for a, b in zip(lc, ll):
        for key in ("loss", "grad_norm"):
            worst = max(worst, abs(a[key] - b[key]) / max(abs(a[key]), 1e-30))
    same = [(a["loss"], a["grad_norm"]) for a in lc] == [(b["loss"], b["grad_norm"]) for b in ll]
    return same and wc == wl, worst


def one(model, plan):
    res = {}
    size = sizes[model, plan]
    world = harness.explain(planc, plan_file(model), plan)["world"]  # (asked already by smaller_size)
    name = f"{model} {plan}" + (f" ({', '.join(size)})" if size else "")
    for backend in ("c", "llvm"):
        prog, err = build(model, plan, size, backend)
        if not prog:
            return [(name, False, f"--backend {backend}: {err}")]
        res[backend], err = train(model, plan, world, backend, [prog])
        if err:
            return [(name, False, err)]
    bitwise, worst = compare(res["c"], res["llvm"])
    checks = [(f"{name} c vs llvm", bitwise or worst <= TOL, f"{steps} steps, " + verdict(bitwise, worst))]
    if (model, plan) in RUN_PLANS:
        got, err = train(model, plan, world, "run",
                         [planc, "run", plan_file(model), "--plan", plan, *harness.model_args(size)])
        if err:
            checks.append((f"{name} planc run", False, err))
        else:
            same, worst = compare(res["llvm"], got)
            checks.append((f"{name} planc run", same,
                           "bitwise identical to the built LLVM program" if same else
                           f"differs from the built LLVM program (worst {worst:.2e})"))
    return checks


tally = harness.Tally("llvm diff")
report = tally.check


# coverage: every feature of every plan (at its model's size) is in some plan as trained here (at
# its size)
plans = list(dict.fromkeys(DIFF_PLANS))
sizes = {(m, p): harness.smaller_size(planc, plan_file(m), p, SIZES.get(m, [])) for m, p in plans}
everything = list(dict.fromkeys(example_plans() + equiv_plans() + plans))
models = list(dict.fromkeys(m for m, _ in everything))
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    jobs = {(m, what): pool.submit(file_dumps, plan_file(m), what) for m in models for what in ("memplan", "sync")}
    jobs.update({(m, p, what): pool.submit(file_dumps, plan_file(m), what, p, sizes[m, p])
                 for m, p in plans if sizes[m, p] for what in ("memplan", "sync")})
    dumps = {key: job.result() for key, job in jobs.items()}
feats = {(m, p): features(m, p, {what: dumps[m, what] for what in ("memplan", "sync")}) for m, p in everything}
trained = {(m, p): features(m, p, {what: dumps[m, p, what] for what in ("memplan", "sync")}, sizes[m, p])
           if sizes[m, p] else feats[m, p] for m, p in plans}
for (model, plan), f in list(feats.items()) + [((m, f"{p} at {', '.join(sizes[m, p])}"), f)
                                               for (m, p), f in trained.items() if sizes[m, p]]:
    if isinstance(f, str):
        report(f"{model} {plan} features", False, f)
covered = set().union(*(f for f in trained.values() if not isinstance(f, str)))
missing = {}
for mp, f in feats.items():
    for x in (set() if isinstance(f, str) else f - covered):
        missing.setdefault(x, mp)
report("coverage", not missing,
       f"the {len(plans)} plans trained here have all {len(covered)} features of the {len(everything)} plans of "
       "examples/ and tests/equiv" if not missing else
       "; ".join(f"'{x}' (in {m} {p})" for x, (m, p) in sorted(missing.items())[:8]) +
       f"{' ...' if len(missing) > 8 else ''}: in no plan of DIFF_PLANS (add one that has it)")

bitwise = []
# two plans at a time: planc build and mpicc are single-threaded (the machine has 2 cores)
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for checks in pool.map(lambda mp: one(*mp), plans):
        for name, ok, detail in checks:
            report(name, ok, detail)
            if ok and "bitwise identical (" in detail:
                bitwise.append(name)
print(f"bitwise: {len(bitwise)} of {len(plans)} comparisons")
tally.finish()
