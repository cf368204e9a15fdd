#!/usr/bin/env python3
"""tests/llvm: the differential test of the two back ends (DESIGN 3: a free oracle).

Every plan tests/equiv/run_equiv.py lists (its PLANS dict, references included) is built twice,
with `planc build` (the C back end: emit_c.c, mpicc -O3) and `planc build --backend llvm` (the
LLVM back end: emit_llvm.c, default<O3>, an object linked with planrt; --verify-ir also verifies
the optimised module), both for the baseline CPU, and each program trains STEPS steps under
`mpirun -np WORLD` on data/corpus.txt. Every step's loss and gradient norm must agree within 1e-6
relative. A plan is reported bitwise when the logs are identical and the weights saved with --save
are the same bytes. NATIVE_PLANS are built again with --native (this CPU: FMA, where both back
ends fuse a multiply into its add alike) and compared the same way, and `planc run` (the JIT, for
this CPU) must give the native LLVM program's bytes exactly (the same module, compiled in-process).
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_diff.py PLANC REPO_ROOT [STEPS]
"""
import ast
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
# the data each model trains on (data/corpus.txt: token windows; the others are data sets of named
# tensors)
DATA = {"bert": "data/classify.safetensors", "tests/equiv/regress": "data/regress"}


def data_of(model):
    return f"{root}/{DATA.get(model, 'data/corpus.txt')}"
def plan_file(model):
    """a model of examples/ by name, or a plan file of the repository by its path without .plan"""
    return f"{root}/{model}.plan" if "/" in model else f"{root}/examples/{model}.plan"


work = tempfile.mkdtemp(prefix="planc-llvm-diff-")
TOL = 1e-6
# built with --native too (GELU and its gradient, dropout, bf16 rounding, a pipeline); planc run on
# the last two
NATIVE_PLANS = [("gpt", "bf16"), ("mlp", "dp2"), ("gpt", "pp2_1f1b")]
RUN_PLANS = NATIVE_PLANS[1:]


def listed_plans():
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


def world_of(prog):
    """the world size the built program's --help names (no MPI is started for --help)"""
    out = subprocess.run([prog, "--help"], capture_output=True, text=True, env=env, check=True).stdout
    return int(re.search(r"world (\d+) ranks", out).group(1))


def train(model, plan, world, tag, command):
    """command: the program's argv before the run options; returns (log lines, saved bytes) or an error."""
    stem = f"{work}/{model.replace('/', '_')}_{plan}_{tag}"
    log, save = f"{stem}.jsonl", f"{stem}.safetensors"
    r = subprocess.run(["mpirun", "-np", str(world)] + command +
                       ["--steps", str(steps), "--data", data_of(model), "--log", log, "--save", save],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return None, f"{tag}: mpirun failed: {r.stderr.strip()[-400:]}"
    return ([json.loads(line) for line in open(log)], open(save, "rb").read()), None


def build(model, plan, backend, native=False):
    prog = f"{work}/{model.replace('/', '_')}_{plan}_{backend}{'_native' if native else ''}"
    b = subprocess.run([planc, "build", plan_file(model), "--plan", plan, "-o", prog,
                        "--backend", backend, "--verify-ir"] + (["--native"] if native else []),
                       capture_output=True, text=True)
    return prog if b.returncode == 0 else None, b.stderr.strip()[:400]


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
    checks, res, world = [], {}, None
    for native in ([False, True] if (model, plan) in NATIVE_PLANS else [False]):
        tag = " --native" if native else ""
        for backend in ("c", "llvm"):
            prog, err = build(model, plan, backend, native)
            if not prog:
                return checks + [(f"{model} {plan}{tag}", False, f"planc build --backend {backend} failed: {err}")]
            world = world or world_of(prog)
            res[backend, native], err = train(model, plan, world, backend + tag.replace(" --", "_"), [prog])
            if err:
                return checks + [(f"{model} {plan}{tag}", False, err)]
        bitwise, worst = compare(res["c", native], res["llvm", native])
        checks.append((f"{model} {plan}{tag} c vs llvm", bitwise or worst <= TOL, f"{steps} steps, " + verdict(bitwise, worst)))
    if (model, plan) in RUN_PLANS:
        got, err = train(model, plan, world, "run", [planc, "run", plan_file(model), "--plan", plan])
        if err:
            checks.append((f"{model} {plan} planc run", False, err))
        else:
            same, worst = compare(res["llvm", True], got)
            checks.append((f"{model} {plan} planc run", same,
                           "bitwise identical to the built --native LLVM program" if same else
                           f"differs from the built --native LLVM program (worst {worst:.2e})"))
    return checks


passed = failed = 0
plans = listed_plans()
bitwise = []
# two plans at a time: planc build and mpicc are single-threaded (the machine has 2 cores)
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for checks in pool.map(lambda mp: one(*mp), plans):
        for name, ok, detail in checks:
            print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)
            passed += ok
            failed += not ok
            if ok and "bitwise identical (" in detail:
                bitwise.append(name)
print(f"bitwise: {len(bitwise)} of {len(plans) + len(NATIVE_PLANS)} comparisons ({len(plans)} plans, "
      f"{len(NATIVE_PLANS)} of them also --native)")
print(f"llvm diff: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
