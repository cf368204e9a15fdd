#!/usr/bin/env python3
"""tests/cpu: planrt's threads (runtime/cpu/threads.c, docs/cpu.md "Threads").

A rank runs planrt's kernels on PLANRT_NUM_THREADS threads (else OpenBLAS's setting), each kernel
split over independent outputs only, so a run gives the same bits at every thread count. For plans
that together use the fused attention with dropout (causal, grouped-query heads), layer and RMS
norm, and data parallelism, the program (C back end) trains STEPS steps with 1, 2 and 3 planrt
threads (3: chunks of unequal size) and the LLVM back end's program with 2; each run's losses,
gradient norms and saved weights must be the 1-thread C run's bytes. OpenBLAS keeps one thread in
these runs: its own thread count changes its GEMMs' last bits, as in any program that uses it;
a run with OpenBLAS at 2 threads is compared across planrt's 1 and 2 threads as well. Also:
  - the log's first line says how many threads ran;
  - a rank whose affinity mask has fewer CPUs than the threads asked for (here: taskset -c 0 around
    mpirun --bind-to none) gets one warning line from rank 0 naming the fix (mpirun --bind-to
    none), and none when the threads fit;
  - a thread count that is not a whole number from 1 to 256 stops the run with one line.
The GPT plans train at the first of SIZES at which they keep their schedule (harness.smaller_size, as
tests/cpu/run_levels.py builds them, whose programs the compile cache shares): planrt_parallel_for
splits by a fixed rule with no minimum chunk, so at D 64, S 32 every split kernel still runs on each
thread (3 threads: chunks of unequal size, 4 heads and 512 rows over 3).
Prints PASS/FAIL per check and a closing 'N passed, M failed' line.
usage: run_threads.py PLANC REPO_ROOT [STEPS]
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Tally, model_args, mpi_env, smaller_size, workdir  # noqa: E402

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
# (model, plan, ranks): gpt single has dropout on the attention's probabilities, llama single has
# grouped-query heads (kv heads shared by query heads: their dk and dv sum over the group)
PLANS = [("gpt", "single", 1), ("llama", "single", 1), ("gpt", "dp2", 2)]
SIZES = {"gpt": [("D=64", "S=32"), ("S=32",)]}  # --model-arg sizes, the smallest first (run_levels.py's)
work = workdir("cpu-threads")
data = f"{root}/data/corpus.txt"
t = Tally("cpu threads")


def build(model, plan, size, *flags):
    out = f"{work}/{model}_{plan}{''.join(f.replace('-', '_') for f in flags)}"
    r = subprocess.run([planc, "build", f"{root}/examples/{model}.plan", "--plan", plan, "-o", out, *flags,
                        *model_args(size)], capture_output=True, text=True, env=mpi_env())
    return out if r.returncode == 0 else None, r.stderr.strip()[-400:]


def run(prog, ranks, tag, threads, blas="1", launch=(), steps_=None):
    """((log rows, saved bytes) or None, stderr) of a run with PLANRT_NUM_THREADS=threads"""
    env = mpi_env(PLANRT_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=blas, OMP_NUM_THREADS=blas, PLANRT_ISA=None)
    log, save = f"{work}/{tag}.jsonl", f"{work}/{tag}.safetensors"
    for f in (log, save):
        if os.path.exists(f):
            os.remove(f)
    r = subprocess.run([*launch, "mpirun", "--bind-to", "none", "-np", str(ranks), prog, "--steps",
                        str(steps if steps_ is None else steps_), "--data", data, "--log", log, "--save", save],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return None, r.stderr
    return ([json.loads(line) for line in open(log)], open(save, "rb").read()), r.stderr


def same(r1, r2):
    (l1, w1), (l2, w2) = r1, r2
    return [(x["loss"], x["grad_norm"]) for x in l1] == [(x["loss"], x["grad_norm"]) for x in l2] and w1 == w2


def compare(name, ref, got, err):
    if got is None:
        return t.check(name, False, err.strip()[-300:])
    return t.check(name, same(ref, got), "the same losses, gradient norms and weights, bit for bit"
                   if same(ref, got) else "differs from the 1-thread C run")


for model, plan, ranks in PLANS:
    size = smaller_size(planc, f"{root}/examples/{model}.plan", plan, SIZES.get(model, []))
    name = f"{model} {plan}" + (f" ({', '.join(size)})" if size else "")
    prog, err = build(model, plan, size)
    lprog, lerr = build(model, plan, size, "--backend", "llvm")
    if not prog or not lprog:
        t.check(f"{name} build", False, err or lerr)
        continue
    ref, err = run(prog, ranks, f"{model}_{plan}_t1", "1")
    if not t.check(f"{name} with 1 thread", ref is not None, "" if ref else err.strip()[-300:]):
        continue
    t.check(f"{name} log names 1 thread", ref[0][0].get("threads") == 1, f"first line's threads: "
            f"{ref[0][0].get('threads')}")
    for threads in ("2", "3"):
        got, err = run(prog, ranks, f"{model}_{plan}_t{threads}", threads)
        if compare(f"{name} with {threads} threads against 1", ref, got, err):
            t.check(f"{name} log names {threads} threads", got[0][0].get("threads") == int(threads),
                    f"first line's threads: {got[0][0].get('threads')}")
    got, err = run(lprog, ranks, f"{model}_{plan}_llvm_t2", "2")
    compare(f"{name} --backend llvm with 2 threads against C with 1", ref, got, err)
    if (model, plan) == ("gpt", "single"):
        b1, err1 = run(prog, ranks, f"{model}_{plan}_blas2_t1", "1", blas="2")
        b2, err2 = run(prog, ranks, f"{model}_{plan}_blas2_t2", "2", blas="2")
        if t.check(f"{name} with OpenBLAS at 2 threads", b1 is not None, "" if b1 else err1.strip()[-300:]):
            compare(f"{name} with OpenBLAS at 2 threads: planrt's 2 threads against 1", b1, b2, err2)

# the affinity check: threads beyond the rank's CPUs warn once, with the fix
prog = f"{work}/gpt_single"
if os.path.exists(prog):
    warn = r"^planrt: warning: PLANRT_NUM_THREADS=2 asks for 2 threads per rank but rank 0 may run on 1 CPU only.*" \
           r"mpirun --bind-to none"
    got, err = run(prog, 1, "bound_t2", "2", launch=("taskset", "-c", "0"), steps_=1)
    lines = [ln for ln in (err or "").splitlines() if ln.startswith("planrt: warning:")]
    t.check("2 threads on a rank bound to 1 CPU warn once", got is not None and len(lines) == 1 and
            re.search(warn, lines[0]) is not None, lines[0] if lines else (err or "").strip()[-300:])
    got, err = run(prog, 1, "bound_t1", "1", launch=("taskset", "-c", "0"), steps_=1)
    t.check("1 thread on a rank bound to 1 CPU does not warn", got is not None and "planrt: warning:" not in err,
            (err or "").strip()[-300:])
    if len(os.sched_getaffinity(0)) >= 2:
        got, err = run(prog, 1, "free_t2", "2", steps_=1)
        t.check("2 threads on a rank with 2 CPUs do not warn", got is not None and "planrt: warning:" not in err,
                (err or "").strip()[-300:])
    for bad in ("0", "two", "100000"):
        got, err = run(prog, 1, "bad", bad, steps_=1)
        lines = [ln for ln in (err or "").splitlines() if ln.startswith("planrt: ")]
        t.check(f"PLANRT_NUM_THREADS={bad} is refused", got is None and len(lines) == 1 and
                f"PLANRT_NUM_THREADS={bad}: not a thread count" in lines[0],
                lines[0] if lines else (err or "").strip()[-300:])
t.finish()
