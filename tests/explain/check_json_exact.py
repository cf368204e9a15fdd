#!/usr/bin/env python3
"""check_json_exact.py: `planc explain --json` prints byte counts as exact integers (issue 23).

tests/explain/exact_bytes.plan has 18,014,467,363,176,702 parameters (a D x F linear layer with
D F = 2^54 - 1): every byte count of it is above 2^53 and not a multiple of the spacing of doubles
there, so a count that passed through a double prints rounded (72057869452706816 for the
parameters' 72057869452706808 bytes). Each figure is checked against the count computed here from
the model's dimensions, with Python's exact integers.
usage: check_json_exact.py PLANC ROOT
"""
import json
import subprocess
import sys

planc, root = sys.argv[1], sys.argv[2]
plan = f"{root}/tests/explain/exact_bytes.plan"
V, D, F = 256, 134217729, 134217727
P = V * D + D * F + F + F * V + V  # embedding, linear (weight, bias), linear_1 (weight, bias)
passed = failed = 0


def check(name, got, want):
    global passed, failed
    ok = isinstance(got, int) and got == want
    print(f"{'PASS' if ok else 'FAIL'}: {name}: {got!r}" + ("" if ok else f", want {want}"))
    passed, failed = passed + ok, failed + (not ok)


for name, world in (("single", 1), ("dp3", 3)):
    out = subprocess.run([planc, "explain", plan, "--plan", name, "--json"], capture_output=True, text=True)
    if out.returncode:
        print(f"FAIL: explain {name}: {out.stderr[-300:]}")
        failed += 1
        continue
    j = json.loads(out.stdout)
    b = j["roles"][0]["bytes"]
    check(f"{name}: parameters", j["parameters"], P)
    check(f"{name}: parameter bytes", b["parameters"], 4 * P)
    check(f"{name}: gradient bytes", b["gradients"], 4 * P)
    check(f"{name}: AdamW state bytes", b["optimizer"], 8 * P)
    check(f"{name}: model state bytes", b["model_states"], 16 * P)
    prog = j["roles"][0]["program"]["state_by_kind"]
    check(f"{name}: the program's parameter bytes", prog["param"], 4 * P)
    if world > 1:
        grads = [c for c in j["roles"][0]["communication"] if c["phase"] == "backward"]
        check(f"{name}: gradient all-reduce bytes", sum(c["bytes"] for c in grads), 4 * P)
        # ring all-reduce: 2 (n - 1) / n of each call's bytes leave the rank, to the nearest byte per call
        wire, calls = sum(c["wire_bytes"] for c in grads), sum(c["calls"] for c in grads)
        exact = 2 * (world - 1) * 4 * P
        ok = isinstance(wire, int) and abs(wire * world - exact) <= calls * world
        print(f"{'PASS' if ok else 'FAIL'}: {name}: gradient all-reduce wire bytes: {wire!r} "
              f"(2 (n - 1) / n of the bytes, within a byte per call)")
        passed, failed = passed + ok, failed + (not ok)
print(f"explain json exact: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
