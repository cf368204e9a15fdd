#!/usr/bin/python3
"""Benchmark (figures, not a test): what offload costs in time and saves in memory, each plan
side by side with the same plan without its offload line, in one run on this machine's CPU.
  tests/offload/offload.plan zero1_disk, bf16_zero2_disk   offload optimizer -> disk (2 ranks)
  examples/gpt.plan dp2_offload_activations              offload activations -> host, the CUDA
                                                          target's program run on the CPU
Per plan: step time (PLANRT_REPORT_TIMING: mean over the steps after the first) and the part in
the update, peak RSS of rank 0, and explain's device peak, host memory and state file. On a CPU
`-> host` frees nothing (host and device memory are one); its row shows the copies' cost.
usage: bench/offload.py [PLANC] [STEPS]     (run from the repository root)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

PLANC = sys.argv[1] if len(sys.argv) > 1 else "build/planc"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PLANRT_REPORT_TIMING="1", PLANRT_REPORT_MEMORY="1",
           PLANC_TEST_HOST_OFFLOAD_ON_CPU="1")
work = tempfile.mkdtemp(prefix="planc-bench-offload-")
ENV["PLANRT_OFFLOAD_DIR"] = work
TIMING = re.compile(r"rank 0: timing stage=\d+ steps=\d+ step_s=([\d.]+) busy_s=[-\d.]+ wait_s=[\d.]+ update_s=([\d.]+)")
RSS = re.compile(r"rank 0: memory .* peak_rss=(\d+)")


def measure(src, plan):
    ex = json.loads(subprocess.run([PLANC, "explain", src, "--plan", plan, "--json"], capture_output=True, text=True,
                                   check=True, env=ENV).stdout)["roles"][0]["program"]
    prog = f"{work}/{os.path.basename(src)}_{plan}"
    subprocess.run([PLANC, "build", src, "--plan", plan, "-o", prog], check=True, env=ENV)
    world = json.loads(subprocess.run([PLANC, "explain", src, "--plan", plan, "--json"], capture_output=True, text=True,
                                      check=True, env=ENV).stdout)["world"]
    r = subprocess.run(["mpirun", "-np", str(world), prog, "--steps", str(STEPS), "--data", "data/corpus.txt"],
                       capture_output=True, text=True, env=ENV, check=True)
    t, rss = TIMING.search(r.stderr), RSS.search(r.stderr)
    return {"step": float(t.group(1)), "update": float(t.group(2)), "rss": int(rss.group(1)),
            "device": ex["arena"] + ex["state"], "host": ex["host"], "disk": ex["disk"]}


def mib(x):
    return f"{x / 2**20:8.1f}"


print(f"{'plan':42} {'step ms':>8} {'update':>8} {'RSS MiB':>8} {'device':>8} {'host':>8} {'disk':>8}")
for src, plan in (("tests/offload/offload.plan", "zero1_disk"), ("tests/offload/offload.plan", "bf16_zero2_disk"),
                  ("examples/gpt.plan", "dp2_offload_activations")):
    text = open(src).read()
    body = re.search(r"^plan " + plan + r" for .*?^}", text, re.S | re.M).group(0)
    plain = f"{work}/{plan}_plain.plan"
    open(plain, "w").write(text.replace(body, re.sub(r"^\s*offload .*\n", "", body, flags=re.M)))
    for name, s in (("offload", src), ("plain", plain)):
        m = measure(s, plan)
        print(f"{plan + ' (' + name + ')':42} {m['step'] * 1e3:8.1f} {m['update'] * 1e3:8.1f} {mib(m['rss'])} "
              f"{mib(m['device'])} {mib(m['host'])} {mib(m['disk'])}", flush=True)
subprocess.run(["rm", "-rf", work])
