#!/usr/bin/env python3
"""tests/llvm: the differential test of the two back ends (DESIGN 3: a free oracle).

Every plan tests/equiv/run_equiv.py lists (its PLANS dict, references included) is built twice,
with `planc build` (the C back end: emit_c.c, mpicc -O3) and `planc build --backend llvm` (the
LLVM back end: emit_llvm.c, default<O3>, an object linked with planrt), and each program trains
STEPS steps under `mpirun -np WORLD` on data/corpus.txt. Every step's loss and gradient norm must
agree within 1e-6 relative. A plan is reported bitwise when the logs are identical and the
weights saved with --save are the same bytes. `planc run` (the JIT) is checked on two plans: it
must give the built LLVM program's bytes exactly (the same module, compiled in-process).
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_diff.py PLANC REPO_ROOT [STEPS]
"""
import ast
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
data = f"{root}/data/corpus.txt"
work = tempfile.mkdtemp(prefix="planc-llvm-diff-")
TOL = 1e-6
RUN_PLANS = [("mlp", "dp2"), ("gpt", "pp2_1f1b")]  # planc run against the built LLVM program


def listed_plans():
    """PLANS from tests/equiv/run_equiv.py (read, not imported: importing it runs the suite)."""
    tree = ast.parse(open(f"{root}/tests/equiv/run_equiv.py").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PLANS" for t in node.targets):
            plans = ast.literal_eval(node.value)
            out = []
            for model, entries in plans.items():
                names = ["single"] + [n for e in entries for n in e.split(":")]
                out += [(model, n) for n in dict.fromkeys(names)]
            return out
    raise SystemExit("tests/equiv/run_equiv.py has no PLANS dict")


def world_of(model, plan):
    out = subprocess.run([planc, "explain", f"{root}/examples/{model}.plan", "--plan", plan, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["world"]


def train(model, plan, world, tag, command):
    """command: the program's argv before the run options; returns (log lines, saved bytes) or an error."""
    log, save = f"{work}/{model}_{plan}_{tag}.jsonl", f"{work}/{model}_{plan}_{tag}.safetensors"
    r = subprocess.run(["mpirun", "-np", str(world)] + command +
                       ["--steps", str(steps), "--data", data, "--log", log, "--save", save],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return None, f"{tag}: mpirun failed: {r.stderr.strip()[-400:]}"
    return ([json.loads(line) for line in open(log)], open(save, "rb").read()), None


def build(model, plan, backend):
    prog = f"{work}/{model}_{plan}_{backend}"
    b = subprocess.run([planc, "build", f"{root}/examples/{model}.plan", "--plan", plan, "-o", prog,
                        "--backend", backend, "--verify-ir"], capture_output=True, text=True)
    return prog if b.returncode == 0 else None, b.stderr.strip()[:400]


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
    progs = {}
    for backend in ("c", "llvm"):
        progs[backend], err = build(model, plan, backend)
        if not progs[backend]:
            return [(f"{model} {plan}", False, f"planc build --backend {backend} failed: {err}")]
    res, world = {}, world_of(model, plan)
    for backend in ("c", "llvm"):
        res[backend], err = train(model, plan, world, backend, [progs[backend]])
        if err:
            return [(f"{model} {plan}", False, err)]
    bitwise, worst = compare(res["c"], res["llvm"])
    checks = [(f"{model} {plan} c vs llvm", bitwise or worst <= TOL,
               f"{steps} steps, " + ("bitwise identical (losses, gradient norms, saved weights)" if bitwise else
                                     f"worst relative difference {worst:.2e} (tolerance {TOL:g})"))]
    if (model, plan) in RUN_PLANS:
        got, err = train(model, plan, world, "run", [planc, "run", f"{root}/examples/{model}.plan", "--plan", plan])
        if err:
            checks.append((f"{model} {plan} planc run", False, err))
        else:
            same, worst = compare(res["llvm"], got)
            checks.append((f"{model} {plan} planc run", same,
                           "bitwise identical to the built LLVM program" if same else
                           f"differs from the built LLVM program (worst {worst:.2e})"))
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
                bitwise.append(name.split(" c vs")[0])
print(f"bitwise: {len(bitwise)} of {len(plans)} plans")
print(f"llvm diff: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
