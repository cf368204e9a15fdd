#!/usr/bin/env python3
"""suite_acct.py: where the whole suite's CPU goes, by test and by kind of process (tests/README.md,
"Time").

bench/suite_times.py gives each test's CPU seconds; this says what inside a test spends them: the
C compiler (cc1: planc build's mpicc of prog.c), planc itself (emit, explain, the LLVM back end),
the generated programs' ranks, mpirun, clang (the fuzz harnesses' build), the fuzzers, nvcc's
parts, the linker and python. It runs `ctest -jN` (with the arguments given after --) under
Linux process accounting (accton, Debian's acct package; root), which records every process that
exits with its CPU time and parent, then charges each process to the test whose process tree it
ran in (the child of ctest it descends from; tests are matched to ctest's "Start" lines by their
start time) and to a category by its command name (the first 15 characters, as the kernel keeps
them). Processes whose parent had already exited (a daemon, an orphan) are charged to ORPHAN.
Accounting has the kernel's tick resolution (10 ms) per process; the sums are close to
/usr/bin/time's user + system for the same ctest (845 against 907 s on 2026-12-03).

  suite_acct.py BUILD_DIR [-j N] [--clear-cache] [-- CTEST-ARGS...]
     -j N           ctest -jN (default 2, the CI machine)
     --clear-cache  empty BUILD_DIR/cc-cache and BUILD_DIR/fuzz first, as on a clean clone
Prints a line per test (CPU seconds, largest categories first) and the totals by category.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CATEGORIES = {
    "cc1": "cc1", "planc": "planc", "mpirun": "mpirun", "prted": "mpirun", "orted": "mpirun",
    "python3": "python", "clang-14": "clang", "clang": "clang", "ld.gold": "ld", "ld": "ld", "ld.lld": "ld",
    "collect2": "ld", "as": "as", "cc1plus": "nvcc", "cicc": "nvcc", "cudafe++": "nvcc", "ptxas": "nvcc",
    "nvcc": "nvcc", "fatbinary": "nvcc", "nvlink": "nvcc", "sh": "shell", "bash": "shell",
    "sha256sum": "shell", "cat": "shell",
}


def category(comm):
    if comm in CATEGORIES:
        return CATEGORIES[comm]
    return "fuzz" if comm.startswith("fuzz_") else "programs"


def read_accounting(path):
    """[(command, cpu seconds, parent index or None, start time, pid)] from dump-acct's v3 records, in
    the order the processes exited. Pids are reused over a suite (tens of thousands of processes),
    so a parent is found by exit order: the first process after the child with the child's ppid as
    its pid (a parent exits after its children; one that exited first leaves them orphans)."""
    out = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    records = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        start = time.mktime(time.strptime(f[14], "%a %b %d %H:%M:%S %Y"))
        records.append((f[0], (float(f[2]) + float(f[3])) / 100, int(f[9]), int(f[10]), start))
    procs, next_with_pid = [None] * len(records), {}
    for i in range(len(records) - 1, -1, -1):
        comm, cpu, pid, ppid, start = records[i]
        procs[i] = (comm, cpu, next_with_pid.get(ppid), start, pid)
        next_with_pid[pid] = i
    return procs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--clear-cache", action="store_true")
    argv = sys.argv[1:]
    ctest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    for tool in ("accton", "dump-acct"):
        if not shutil.which(tool):
            sys.exit(f"suite_acct.py: no {tool}: apt-get install acct (and run as root)")
    if a.clear_cache:  # as a clean clone runs: the compile cache and the fuzz harnesses' build empty
        for d in ("cc-cache", "fuzz"):
            shutil.rmtree(os.path.join(a.build, d), ignore_errors=True)
    acct = tempfile.NamedTemporaryFile(prefix="suite-acct-", delete=False).name
    subprocess.run(["accton", acct], check=True, capture_output=True)
    try:
        r = subprocess.run(["ctest", f"-j{a.j}", *ctest_args], cwd=a.build, capture_output=True, text=True)
    finally:
        subprocess.run(["accton", "off"], capture_output=True)
    procs = read_accounting(acct)
    os.unlink(acct)
    ctest = [i for i, p in enumerate(procs) if p[0] == "ctest"]
    if not ctest:
        sys.exit("suite_acct.py: no ctest process in the accounting file")
    ctest = ctest[-1]
    tests = sorted((i for i, p in enumerate(procs) if p[2] == ctest), key=lambda i: (procs[i][3], procs[i][4]))
    names = re.findall(r"Start +\d+: (\S+)", r.stdout)
    name_of = dict(zip(tests, names)) if len(names) == len(tests) else {}
    if not name_of:
        print(f"(ctest started {len(names)} tests, the accounting shows {len(tests)} children: tests unnamed)")

    def test_of(i):
        while i is not None and procs[i][2] != ctest:
            i = procs[i][2]
        return i

    per = collections.defaultdict(collections.Counter)
    for i, (comm, cpu, *_) in enumerate(procs):
        if i != ctest:
            per[test_of(i)][category(comm)] += cpu
    total = collections.Counter()
    for t, c in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        total.update(c)
        name = name_of.get(t, procs[t][0]) if t is not None else "ORPHAN"
        print(f"{sum(c.values()):7.1f}  {name:28s} " + " ".join(f"{k} {v:.1f}" for k, v in c.most_common(6)))
    print(f"\n{sum(total.values()):.0f} CPU s in all: " + ", ".join(f"{k} {v:.0f}" for k, v in total.most_common()))
    print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
