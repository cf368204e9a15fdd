#!/usr/bin/env python3
"""The LLVM back end's module (prog.ll of `planc emit llvm`, before optimisation) with runs of
identical layers as loops: its bytes, its kernel calls (`call void`: one per kernel it builds; a
fused loop's call too) and the CPU seconds (user + system, from wait4's rusage: planc, LLVM's
default<O3> and code generation, and the link by mpicc) of `planc build --backend llvm`. Given
several planc executables (for example one whose LLVM module builds every layer in full), each
plan is measured with each, one after the other, so that a loaded machine changes their ratio
little; the load average is printed with the figures.
usage: bench/llvm_size.py [--planc PLANC ...] [--runs N] [FILE:PLAN ...]
(default: build/planc; examples/gpt175b.plan:t8_p8 examples/gpt7b.plan:tp8 examples/gpt.plan:single)"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_host_size import cpu_of  # noqa: E402  (CPU seconds of one command, from wait4)

DEFAULT = ["examples/gpt175b.plan:t8_p8", "examples/gpt7b.plan:tp8", "examples/gpt.plan:single"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--planc", action="append", help="a planc executable (repeatable; default build/planc)")
    ap.add_argument("--runs", type=int, default=1, help="builds per planc; the median is printed")
    ap.add_argument("plans", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    plancs = args.planc or ["build/planc"]
    tmp = tempfile.mkdtemp(prefix="planc-llvm-size-")
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    print("%-30s %-28s %11s %7s %12s" % ("file:plan", "planc", "prog.ll B", "calls", "build CPU s"))
    for spec in args.plans:
        path, plan = spec.split(":")
        for i, planc in enumerate(plancs):
            out = f"{tmp}/{plan}_{i}"
            subprocess.run([planc, "emit", "llvm", path, "--plan", plan, "-o", out], check=True,
                           stdout=subprocess.DEVNULL)
            text = open(f"{out}/prog.ll").read()
            cpu = statistics.median(cpu_of([planc, "build", path, "--plan", plan, "--backend", "llvm", "-o",
                                            f"{out}/prog"]) for _ in range(args.runs))
            print("%-30s %-28s %11d %7d %12.2f" % (spec, planc[-28:], len(text.encode()), text.count("call void"), cpu),
                  flush=True)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
