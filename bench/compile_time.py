#!/usr/bin/env python3
"""Compile time of planc (issue 20): CPU seconds (user + system) and peak resident memory of
`planc explain` (which runs every check first) on every plan of examples/*.plan, the 1T-parameter
GPTs of tests/scale/gpt1t.plan (Narayanan's t8 p64 dp6, tensor x pipe, ZeRO 0-3 at data = 1024
and 64, GPT-3 175B at data = 2) and the million-rank meshes of tests/scale/mesh.plan.

Figures, not a test: tests/scale/run_compile_time.py holds the limits (and imports plan_files,
plans_of and measure from here). CPU time, not wall time, so that a
loaded machine changes the figures little; the load average is printed with them.
usage: bench/compile_time.py [PLANC] [--runs N] [--only SUBSTRING]"""
import argparse
import glob
import os
import re
import subprocess
import sys


def plans_of(path):
    with open(path) as f:
        return re.findall(r"^plan\s+(\w+)", f.read(), re.M)


def plan_files(root="."):
    """every examples/*.plan, then the 1T GPTs and the million-rank meshes"""
    return sorted(glob.glob(os.path.join(root, "examples/*.plan"))) + [
        os.path.join(root, "tests/scale/gpt1t.plan"), os.path.join(root, "tests/scale/mesh.plan")]


def measure(planc, path, plan, command="explain"):
    """(CPU seconds, peak RSS in MiB, exit status) of one planc explain, from wait4's rusage."""
    proc = subprocess.Popen([planc, command, path, "--plan", plan], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, use = os.wait4(proc.pid, 0)
    return use.ru_utime + use.ru_stime, use.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("planc", nargs="?", default="build/planc")
    ap.add_argument("--runs", type=int, default=3, help="runs per plan; the median is printed")
    ap.add_argument("--only", default="", help="only plans whose file:plan contains this")
    args = ap.parse_args()
    files = plan_files()
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    print("%-44s %10s %10s" % ("file:plan (planc explain)", "CPU s", "peak MiB"))
    worst = (0, "")
    for path in files:
        for plan in plans_of(path):
            name = "%s:%s" % (os.path.basename(path), plan)
            if args.only not in name:
                continue
            runs = sorted(measure(args.planc, path, plan) for _ in range(args.runs))
            cpu, rss, rc = runs[len(runs) // 2]
            print("%-44s %10.3f %10.1f%s" % (name, cpu, rss, "" if rc == 0 else "   exit %d" % rc))
            sys.stdout.flush()
            worst = max(worst, (cpu, name))
    print("slowest: %s %.3f s CPU" % (worst[1], worst[0]))
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
