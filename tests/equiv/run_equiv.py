#!/usr/bin/env python3
"""tests/equiv: the contract that a plan never changes the result (DESIGN 1.1).

For the GPT and MLP examples, every plan listed for the model in PLANS is built with `planc build`,
trained for STEPS steps under `mpirun -np WORLD` on data/corpus.txt, and compared with the
single-rank plan of the same model: every step's loss within 1e-5 relative and the final weights
(saved with --save, read back here from the safetensors file) within 1e-4. dp2 is run twice and
must give bitwise identical losses. bf16 plans (named bf16*) are compared with the f32 run at bf16
tolerance. A listed plan that the model's file does not have is a failure, never a skip.
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_equiv.py PLANC REPO_ROOT [STEPS]
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
data = f"{root}/data/corpus.txt"
work = tempfile.mkdtemp(prefix="planc-equiv-")
passed = failed = 0

# The plans checked for each model (examples/MODEL.plan), besides its reference plan "single".
PLANS = {
    "mlp": ["dp2", "dp4", "tp2", "tp4", "dp2_tp2", "tp2_sp", "zero1_dp4", "zero2_dp4", "zero3_dp4", "dp2_tp2_zero2",
            "bf16"],
    "gpt": ["dp2", "dp4", "tp2", "tp4", "dp2_tp2", "tp2_sp", "zero1_dp4", "zero2_dp4", "zero3_dp4", "dp2_tp2_zero2",
            "ulysses2", "tp2_sp_selective", "dp2_full_recompute", "dp2_tp2_sp", "dp2_tp2_sp_zero3",
            "bf16", "bf16_zero2_dp4"],
}


def check(name, ok, detail):
    global passed, failed
    print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)
    if ok:
        passed += 1
    else:
        failed += 1


def world_of(model, plan):
    out = subprocess.run([planc, "explain", f"{root}/examples/{model}.plan", "--plan", plan, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["world"]


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = blob[8 + n + lo:8 + n + hi]
        if info["dtype"] == "F32":
            vals = struct.unpack(f"<{len(raw) // 4}f", raw)
        elif info["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else:
            raise ValueError(f"{path}: unexpected dtype {info['dtype']}")
        tensors[name] = (tuple(info["shape"]), vals)
    return tensors


def run(model, plan, tag):
    prog = f"{work}/{model}_{plan}"
    if not os.path.exists(prog):
        b = subprocess.run([planc, "build", f"{root}/examples/{model}.plan", "--plan", plan, "-o", prog],
                           capture_output=True, text=True)
        if b.returncode != 0:
            return None, f"planc build failed: {b.stderr.strip()[:400]}"
    log, save = f"{work}/{model}_{plan}_{tag}.jsonl", f"{work}/{model}_{plan}_{tag}.safetensors"
    n = world_of(model, plan)
    r = subprocess.run(["mpirun", "-np", str(n), prog, "--steps", str(steps), "--data", data,
                        "--log", log, "--save", save], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        return None, f"mpirun -np {n} failed: {r.stderr.strip()[-400:]}"
    losses = [json.loads(line)["loss"] for line in open(log)]
    return (losses, read_safetensors(save)), None


def compare(model, plan, ref, got, loss_tol, weight_tol):
    (l0, w0), (l1, w1) = ref, got
    if len(l1) != len(l0):
        check(f"{model} {plan} losses", False, f"{len(l1)} steps logged, want {len(l0)}")
        return
    worst = max(abs(a - b) / abs(a) for a, b in zip(l0, l1))
    check(f"{model} {plan} losses", worst <= loss_tol,
          f"{len(l1)} steps, worst relative difference {worst:.2e} (tolerance {loss_tol:g})")
    if set(w0) != set(w1):
        check(f"{model} {plan} weights", False, f"tensor names differ: {sorted(set(w0) ^ set(w1))[:5]}")
        return
    wworst, where = 0.0, ""
    for name in w0:
        s0, v0 = w0[name]
        s1, v1 = w1[name]
        if s0 != s1:
            check(f"{model} {plan} weights", False, f"{name}: shape {s1} vs {s0}")
            return
        d = max(abs(a - b) for a, b in zip(v0, v1))
        if d > wworst:
            wworst, where = d, name
    check(f"{model} {plan} weights", wworst <= weight_tol,
          f"{len(w0)} tensors, worst absolute difference {wworst:.2e} in {where} (tolerance {weight_tol:g})")


for model, listed in PLANS.items():
    plans_here = {m.group(1) for m in re.finditer(r"^\s*plan\s+(\w+)", open(f"{root}/examples/{model}.plan").read(),
                                                  re.MULTILINE)}
    for plan in [p for p in ["single"] + listed if p not in plans_here]:
        check(f"{model} {plan}", False, f"listed in run_equiv.py but examples/{model}.plan has no plan '{plan}'")
    listed = [p for p in listed if p in plans_here]
    ref, err = run(model, "single", "a")
    if err:
        check(f"{model} single", False, err)
        continue
    check(f"{model} single trains", ref[0][-1] < ref[0][0],
          f"loss {ref[0][0]:.4f} -> {ref[0][-1]:.4f} over {steps} steps")
    for plan in [p for p in listed if not p.startswith("bf16")]:
        got, err = run(model, plan, "a")
        if err:
            check(f"{model} {plan}", False, err)
            continue
        compare(model, plan, ref, got, 1e-5, 1e-4)
    again, err = run(model, "dp2", "b")
    first, _ = run(model, "dp2", "a")
    if err or first is None:
        check(f"{model} dp2 repeatable", False, err or "first run missing")
    else:
        check(f"{model} dp2 repeatable", again[0] == first[0], "two runs give bitwise identical losses"
              if again[0] == first[0] else f"losses differ: {again[0][:3]} vs {first[0][:3]}")
    for plan in [p for p in listed if p.startswith("bf16")]:
        bf, err = run(model, plan, "a")
        if err:
            check(f"{model} {plan}", False, err)
            continue
        if len(bf[0]) != len(ref[0]):
            check(f"{model} {plan} losses", False, f"{len(bf[0])} steps logged, want {len(ref[0])}")
            continue
        worst = max(abs(a - b) / abs(a) for a, b in zip(ref[0], bf[0]))
        check(f"{model} {plan} losses", worst <= 2e-2,
              f"worst relative difference from f32 {worst:.2e} (bf16 tolerance 2e-2)")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
