#!/usr/bin/env python3
"""The CUDA target's host program (prog.c of `planc emit cuda`) with runs of identical layers as
loops against --no-layer-loops (every layer in full: the CUDA target's output before the loops,
byte for byte): its bytes, and the CPU seconds (user + system, from wait4's rusage) of compiling
it with `planc build --target cuda`'s command (mpicc -std=gnu11 -O1 -Wall -Wextra -Werror -c) and
with tests/cuda/run_build.sh's (-O0, clang-14 when installed). The two flavours of a plan are
compiled one after the other, so that a loaded machine changes their ratio little; the load
average is printed with the figures.
usage: bench/cuda_host_size.py [PLANC] [--runs N] [FILE:PLAN ...]
(default: examples/gpt175b.plan:t8_p8 examples/gpt7b.plan:tp8 examples/gpt.plan:single)"""
import argparse
import os
import shutil
import subprocess
import tempfile

DEFAULT = ["examples/gpt175b.plan:t8_p8", "examples/gpt7b.plan:tp8", "examples/gpt.plan:single"]


def cpu_of(argv, env=None):
    """CPU seconds of one command (which must succeed)"""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    _, status, use = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed: {' '.join(argv)}")
    return use.ru_utime + use.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("planc", nargs="?", default="build/planc")
    ap.add_argument("--runs", type=int, default=1, help="compiles per flavour; the median is printed")
    ap.add_argument("plans", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="planc-cuda-host-")
    quick = dict(os.environ)
    if shutil.which("clang-14"):
        quick["OMPI_CC"] = "clang-14"
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    print("%-34s %-9s %11s %12s %12s" % ("file:plan", "flavour", "prog.c B", "-O1 CPU s", "-O0 CPU s"))
    for spec in args.plans:
        path, plan = spec.split(":")
        for flavour, flags in (("unrolled", ["--no-layer-loops"]), ("loops", [])):
            out = os.path.join(tmp, flavour)
            subprocess.run([args.planc, "emit", "cuda", path, "--plan", plan, "-o", out, *flags], check=True)
            prog = os.path.join(out, "prog.c")
            compile_ = ["mpicc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Iruntime/include", "-c", prog, "-o",
                        os.path.join(out, "prog.o")]
            o1 = sorted(cpu_of(compile_ + ["-O1"]) for _ in range(args.runs))[args.runs // 2]
            o0 = sorted(cpu_of(compile_ + ["-O0"], quick) for _ in range(args.runs))[args.runs // 2]
            print("%-34s %-9s %11d %12.2f %12.2f" % (f"{os.path.basename(path)}:{plan}", flavour,
                                                      os.path.getsize(prog), o1, o0), flush=True)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
