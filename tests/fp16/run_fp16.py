#!/usr/bin/env python3
"""tests/fp16: fp16 training with dynamic loss scaling, run by a generated program (examples/gpt.plan
at S 32, the GPT size tests/equiv falls back to: what loss scaling does is the same on a shorter
context, on half the arithmetic).

  trains      the fp16 plan's loss falls, no step is skipped at the initial scale 65536, and every
              step's loss is within 2e-3 relative of the f32 run's (plan single)
  overflow    a scale that overflows skips every step: the log says skipped and the scale halves
              each time, and the weights after the skipped steps are byte for byte the initial ones
  recovery    a too-large first scale (1e6): skipped steps halve it until steps update (most of
              them), and the loss falls
  resume      --resume after skipped steps continues bit for bit (the scale, the run of good steps
              and the skips that Adam's step count leaves out are in the checkpoint)
  max-skips   --max-skips 2 stops at the second skipped step in a row, naming it, with no --save
  refused     a bad --loss-scale-init
  data = 2    fp16_dp2 gives the single rank's fp16 losses within 1e-3
(tests/equiv compares fp16 and fp16_dp2 with the f32 run over 20 steps; this is the policy.)
Prints PASS/FAIL per check and a closing 'fp16: N passed, M failed' line.
usage: run_fp16.py PLANC REPO_ROOT
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

runner = harness.Runner("fp16")
data, work, check, build, run = runner.data, runner.work, runner.check, runner.programs.build, runner.programs.run
losses, read_st = harness.losses, harness.read_safetensors

SIZE = ("S=32",)  # --model-arg: the example at a 32-token context
fp16, f32 = build("gpt", "fp16", size=SIZE), build("gpt", "single", size=SIZE)
rc1, e1 = run(fp16, "--steps", "12", "--data", data, "--log", f"{work}/fp16.jsonl")
rc2, e2 = run(f32, "--steps", "12", "--data", data, "--log", f"{work}/f32.jsonl")
rows = harness.read_log(f"{work}/fp16.jsonl") if rc1 == 0 else []
a, b = (losses(f"{work}/fp16.jsonl"), losses(f"{work}/f32.jsonl")) if rc1 == 0 and rc2 == 0 else ({}, {})
dev = max((abs(a[k] - b[k]) / abs(b[k]) for k in b), default=1.0) if len(a) == len(b) == 12 else 1.0
check("fp16 trains: its loss falls, no step skipped at 65536, within 2e-3 of the f32 run", rc1 == 0 and
      len(a) == 12 and a[11] < a[0] - 0.5 and dev < 2e-3 and all(r["loss_scale"] == 65536 and not r["skipped"]
                                                                   for r in rows),
      f"loss {a.get(0)} -> {a.get(11)}, largest relative deviation from f32 {dev:.2e}; {e1[-200:] if rc1 else ''}")
rc0, _ = run(fp16, "--steps", "0", "--data", data, "--save", f"{work}/fp16_w0.st")
rc1, e1 = run(fp16, "--steps", "3", "--data", data, "--loss-scale-init", "1e30", "--log", f"{work}/over.jsonl",
              "--save", f"{work}/fp16_w3.st")
rows = harness.read_log(f"{work}/over.jsonl") if rc1 == 0 else []
check("an overflowing scale skips each step and halves, the weights stay as they were",
      rc0 == 0 and rc1 == 0 and [r["skipped"] for r in rows] == [True] * 3 and
      [r["loss_scale"] for r in rows] == [1e30, 5e29, 2.5e29] and
      read_st(f"{work}/fp16_w0.st") == read_st(f"{work}/fp16_w3.st"),
      f"{[(r['loss_scale'], r['skipped']) for r in rows]} {e1[-200:] if rc1 else ''}")
rc1, e1 = run(fp16, "--steps", "14", "--data", data, "--loss-scale-init", "1e6", "--log", f"{work}/rec.jsonl")
rows = harness.read_log(f"{work}/rec.jsonl") if rc1 == 0 else []
skips = [r["skipped"] for r in rows]
first = skips.index(False) if False in skips else len(skips)
rule = all(rows[i]["loss_scale"] == rows[i - 1]["loss_scale"] / (2 if skips[i - 1] else 1) for i in range(1, len(rows)))
check("a too-large first scale recovers: skipped steps halve it until steps update (most of them), the loss falls",
      rc1 == 0 and len(rows) == 14 and rows[0]["loss_scale"] == 1e6 and skips[0] and rule and
      skips.count(False) >= 8 and rows[13]["loss"] < rows[first]["loss"] - 0.2,
      f"{[(r['loss_scale'], r['skipped']) for r in rows]}; {e1[-200:] if rc1 else ''}")
# resume carries the loss scaling state (the scale, the good-step run, the skips Adam's t leaves out)
for d in ("fp16_ck_a", "fp16_ck_b"):
    shutil.rmtree(f"{work}/{d}", ignore_errors=True)
rc1, e1 = run(fp16, "--steps", "8", "--data", data, "--loss-scale-init", "1e6", "--log", f"{work}/full.jsonl",
              "--save", f"{work}/full.st")
rc2, e2 = run(fp16, "--steps", "4", "--data", data, "--loss-scale-init", "1e6", "--save-every", "4",
              f"{work}/fp16_ck_a")
rc3, e3 = run(fp16, "--steps", "8", "--data", data, "--resume", f"{work}/fp16_ck_a", "--log",
              f"{work}/resumed.jsonl", "--save", f"{work}/resumed.st")
full = {r["step"]: (r["loss"], r["loss_scale"], r["skipped"]) for r in harness.read_log(f"{work}/full.jsonl")} \
    if rc1 == 0 else {}
again = {r["step"]: (r["loss"], r["loss_scale"], r["skipped"]) for r in harness.read_log(f"{work}/resumed.jsonl")} \
    if rc3 == 0 else {}
check("fp16 --resume continues bit for bit after skipped steps (scale, skips, Adam's t restored)",
      rc1 == 0 and rc2 == 0 and rc3 == 0 and full[0][2] and sorted(again) == [4, 5, 6, 7] and
      all(again[k] == full[k] for k in again) and read_st(f"{work}/full.st") == read_st(f"{work}/resumed.st"),
      f"uninterrupted {[full.get(k) for k in range(4, 8)]} resumed {[again.get(k) for k in range(4, 8)]} "
      f"{(e1 + e2 + e3)[-300:]}")
if os.path.exists(f"{work}/stop.st"):
    os.remove(f"{work}/stop.st")
rc1, e1 = run(fp16, "--steps", "6", "--data", data, "--loss-scale-init", "1e30", "--max-skips", "2",
              "--save", f"{work}/stop.st")
check("--max-skips 2 stops at the second skipped step, with no --save written",
      rc1 != 0 and "step 1: 2 steps in a row skipped by loss scaling" in e1 and not os.path.exists(f"{work}/stop.st"),
      e1.strip().splitlines()[-1][:200] if e1.strip() else "")
rc1, e1 = run(fp16, "--steps", "1", "--data", data, "--loss-scale-init", "-4")
check("refused: --loss-scale-init -4", rc1 != 0 and "--loss-scale-init needs a positive finite number" in e1,
      e1.strip().splitlines()[0][:160] if e1.strip() else "")
dp2 = build("gpt", "fp16_dp2", size=SIZE)
rc1, e1 = run(dp2, "--steps", "8", "--data", data, "--log", f"{work}/fp16dp2.jsonl")
c = losses(f"{work}/fp16dp2.jsonl") if rc1 == 0 else {}
dev = max((abs(c[k] - a[k]) / abs(a[k]) for k in c), default=1.0) if len(c) == 8 and len(a) == 12 else 1.0
check("fp16 over data = 2 gives the single rank's fp16 losses within 1e-3", rc1 == 0 and dev < 1e-3,
      f"largest relative deviation {dev:.2e}; {e1[-200:] if rc1 else ''}")

runner.finish()
