#!/usr/bin/env python3
"""Benchmark (figures, not a test): planc's two back ends side by side in one run.

For examples/gpt.plan's small GPT (plan single: D 128, 4 layers) and a GPT whose GEMMs dominate
(D 1024, 16 heads, 2 layers, the same 16 x 64 tokens per step), each built as users build it, the
portable program that runs the best instruction-set level of its CPU (docs/cpu.md), with the C
back end (`planc build`: emit C, mpicc -O3, the fused loops per level) and the LLVM back end
(`planc build --backend llvm`: default<O3>, per-level loop functions in an object linked with
planrt; `planc run` compiles for the host CPU), and with the C back end for this CPU only
(`planc build --native`, the row "c native"):
  build s     wall time of planc build
  run s       `planc run`'s in-process compile: wall of `planc run FILE --plan P --help` (which
              compiles, then prints the program's help) minus the built LLVM program's --help,
              each the fastest of three
  cpu ms      CPU time per step, one rank, one thread: the CPU time (user + system, the process
              and its children) of a run of 1 + STEPS steps minus that of a 1-step run, over STEPS;
              the least of three such measurements, the programs taken in turns (c, llvm, c, ...).
              CPU time, not wall time: on a machine busy with other work it is what a run costs
  wall ms     the median wall step time of those runs (from --log; each run's first step left out)
  GFLOP/s     the step's matmul FLOPs (planc explain's model_flops_per_step) over its CPU time
  of sgemm    that rate over the one-thread OpenBLAS sgemm rate on the large GPT's GEMM shapes,
              measured in the same run (bench_sgemm, OPENBLAS_NUM_THREADS=1, its CPU time, the best
              of three; the same OpenBLAS kernels as the programs', whatever OPENBLAS_CORETYPE says)
usage: bench/backends.py [PLANC] [STEPS]   (from the repository root; PLANC's build directory
       holds bench/bench_sgemm)
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

planc = sys.argv[1] if len(sys.argv) > 1 else "build/planc"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
sgemm = os.path.join(os.path.dirname(os.path.abspath(planc)), "bench", "bench_sgemm")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
data = "data/corpus.txt"
tmp = tempfile.mkdtemp(prefix="planc-backends-")

# the large GPT: examples/gpt.plan's model with D = 1024 (its import and model, then one plan)
text = open("examples/gpt.plan").read()
model_end = re.search(r"^model gpt\(.*?^}\n", text, re.S | re.M).end()
big = f"{tmp}/gpt_large.plan"
T, D, F = 16 * 64, 1024, 4096
with open(big, "w") as f:
    f.write(text[:model_end] + """
plan large for gpt(D = 1024, H = 16, L = 2) {
  mesh data = 1
  batch B = 16
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}
""")
cases = [("small GPT", "examples/gpt.plan", "single"), ("GPT D=1024", big, "large")]


def run(argv, **kw):
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        sys.exit(f"backends.py: {' '.join(argv[:6])} ... failed:\n{r.stderr[-800:]}")
    return time.perf_counter() - t0, r.stdout


def cpu_s(argv):
    """CPU seconds (user + system) argv and its children took"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run(argv)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def step_times(prog, tag):
    """(CPU ms per step, wall ms of each step after the first)"""
    log = f"{tmp}/{tag}.jsonl"
    base = ["mpirun", "-np", "1", prog, "--data", data]
    one = cpu_s(base + ["--steps", "1"])
    more = cpu_s(base + ["--steps", str(steps + 1), "--log", log])
    return (more - one) / steps * 1e3, [json.loads(line)["step_ms"] for line in open(log)][1:]


def sgemm_roof():
    """(the one-thread sgemm rate on the large GPT's GEMM shapes, bench_sgemm's table), the best of three"""
    runs = [run([sgemm, f"{T},{D},{D}", f"{T},{F},{D}", f"{T},{D},{F}"])[1] for _ in range(3)]
    rates = [float(re.search(r"sgemm_gflops (\S+)", out).group(1)) for out in runs]
    return max(rates), runs[rates.index(max(rates))]


sgemm_rate, out = sgemm_roof()
print(f"one-thread OpenBLAS sgemm on the large GPT's GEMM shapes (M N K; CPU time, best of 3):\n{out}")
print(f"{'model':12} {'back end':9} {'build s':>8} {'run s':>7} {'cpu ms':>8} {'wall ms':>8} {'GFLOP/s':>8} "
      f"{'of sgemm':>8}")
for name, path, plan in cases:
    flops = json.loads(run([planc, "explain", path, "--plan", plan, "--json"])[1])["model_flops_per_step"]
    builds = {"c": ["--backend", "c"], "llvm": ["--backend", "llvm"], "c native": ["--backend", "c", "--native"]}
    progs, build_s, cpu, wall = {}, {}, {b: [] for b in builds}, {b: [] for b in builds}
    for backend, flags in builds.items():
        progs[backend] = f"{tmp}/{plan}_{backend.replace(' ', '_')}"
        build_s[backend], _ = run([planc, "build", path, "--plan", plan, "-o", progs[backend]] + flags)
    built_s = min(run([progs["llvm"], "--help"])[0] for _ in range(3))
    jit_s = min(run([planc, "run", path, "--plan", plan, "--help"])[0] for _ in range(3))
    for turn in range(3):
        for backend in builds:
            c, w = step_times(progs[backend], f"{plan}_{backend.replace(' ', '_')}_{turn}")
            cpu[backend].append(c)
            wall[backend] += w
    for backend in builds:
        ms, wall_ms = min(cpu[backend]), sorted(wall[backend])[len(wall[backend]) // 2]
        rate = flops / (ms * 1e-3) * 1e-9
        run_s = f"{jit_s - built_s:.2f}" if backend == "llvm" else ""
        print(f"{name:12} {backend:9} {build_s[backend]:8.2f} {run_s:>7} {ms:8.1f} {wall_ms:8.1f} {rate:8.1f} "
              f"{100 * rate / sgemm_rate:7.1f}%", flush=True)
