"""check_count_step.py: bench/gpu/count_step.py (the per-step device calls, GEMMs and casts of a CUDA
program, read off the emitted source; bench/gpu/NOTES.md's predictions come from it) counts a run
of layers printed as a loop once a layer.

For bench/gpu's two models (gpt350m, llama1b: plan bf16) and a pipeline stage's plan
(examples/gpt.plan pp2_interleaved, whose stages share their loops), the report on the program as
planc emits it (its layers as loops) must be the report on the same program printed with every
layer in full (--no-layer-loops) line for line, and the looped program must hold a layer loop (so
that the comparison is of two printings, not of one). A loop whose bounds are not numbers (a loop
function several stages share) must make count_step.py stop with its message, not count it once.
usage: check_count_step.py PLANC ROOT"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

PLANC, ROOT = sys.argv[1], sys.argv[2]
COUNT = os.path.join(ROOT, "bench", "gpu", "count_step.py")
tally = harness.Tally("count_step")
check = tally.check


def report(plan_file, plan, *flags):
    r = subprocess.run([sys.executable, COUNT, *flags, PLANC, plan_file, plan], capture_output=True, text=True,
                       cwd=ROOT)
    return r.returncode, r.stdout, r.stderr.strip()


for plan_file, plan in (("bench/gpu/gpt350m.plan", "bf16"), ("bench/gpu/llama1b.plan", "bf16")):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([PLANC, "emit", "cuda", plan_file, "--plan", plan, "-o", d], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        loops = sum(1 for line in open(os.path.join(d, "prog.c")) if line.lstrip().startswith("for (int l = "))
    rc, looped, err = report(plan_file, plan)
    rc2, unrolled, err2 = report(plan_file, plan, "--no-layer-loops")
    calls = next((line.split()[-1] for line in looped.splitlines() if "device calls per step" in line), "?")
    check(f"{plan_file} {plan}: the looped program's counts are the unrolled one's",
          rc == 0 and rc2 == 0 and loops > 0 and looped == unrolled,
          f"{loops} layer loops, {calls} device calls per step" if rc == 0 and rc2 == 0 and looped == unrolled
          else f"status {rc} / {rc2}, {loops} loops; {err or err2}"[:300])

# a pipeline whose stages share their layer loops: count_step.py reads only the phase functions of
# a single-rank program, and must refuse what it cannot count rather than undercount
rc, out, err = report("examples/gpt.plan", "pp2_interleaved")
rc2, out2, _ = report("examples/gpt.plan", "pp2_interleaved", "--no-layer-loops")
check("examples/gpt.plan pp2_interleaved: counted as unrolled, or refused with the loop it cannot count",
      (rc == 0 and out == out2) or (rc != 0 and "a loop it cannot count" in err),
      "the same counts" if rc == 0 else err[:200])
tally.finish()
