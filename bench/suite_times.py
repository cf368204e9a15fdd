#!/usr/bin/env python3
"""suite_times.py: each ctest test's wall and CPU seconds, and the suite's wall time on an idle
machine estimated from them, for tests/README.md's table and for COST in tests/tests.cmake.

The tests come from `ctest --show-only=json-v1` (command, working directory, environment; the
same selection -R/-L give ctest); each runs here with no time limit (ctest's TIMEOUT would cut a
run on a loaded machine short), and its CPU seconds are user + system of the test and every
process it waited for (wait4's rusage: mpirun's ranks, compilers, nvcc). On a machine shared with
other work the wall seconds grow with the load and the CPU seconds do not: the estimate reads
the CPU seconds only. It packs the tests longest first onto N cores (ctest -jN with COST, a
test using one core at a time: most runners build and run one thing after another), so it is a
lower bound where a test's own parallelism (mpirun -np 4 on 2 cores) cannot fill a core.

  suite_times.py BUILD_DIR [-j N] [-R REGEX] [-L LABEL] [--cores C] [--clear-cache]
     -j N           N tests at a time (default 1: the CPU seconds are then least disturbed)
     --cores C      the estimate's cores (default 2, the CI machine)
     --clear-cache  empty BUILD_DIR/cc-cache first, as on a clean clone
Prints one line per test as it ends and the table (markdown) at the end.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time


def tests_of(build, regex, label):
    cmd = ["ctest", "--show-only=json-v1"] + (["-R", regex] if regex else []) + (["-L", label] if label else [])
    out = json.loads(subprocess.run(cmd, cwd=build, capture_output=True, text=True, check=True).stdout)
    tests = []
    for t in out["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(os.environ)
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env[k] = v
        tests.append({"name": t["name"], "command": t["command"], "cwd": props.get("WORKING_DIRECTORY", build),
                      "env": env, "cost": float(props.get("COST", 0)),
                      "skip": props.get("SKIP_RETURN_CODE"),
                      "pass_re": props.get("PASS_REGULAR_EXPRESSION", []),
                      "fail_re": props.get("FAIL_REGULAR_EXPRESSION", [])})
    return sorted(tests, key=lambda t: -t["cost"])


def run_one(t):
    start = time.monotonic()
    p = subprocess.Popen(t["command"], cwd=t["cwd"], env=t["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = p.stdout.read().decode(errors="replace")
    tail = output.strip().splitlines()[-1:] or [""]
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    t["wall"] = time.monotonic() - start
    t["cpu"] = usage.ru_utime + usage.ru_stime
    # ctest's verdict: PASS_REGULAR_EXPRESSION decides instead of the exit status (the watchdog tests
    # pass by the message a rank dies with), FAIL_REGULAR_EXPRESSION fails a run whatever its status
    passed = any(re.search(r, output, re.M) for r in t["pass_re"]) if t["pass_re"] else code == 0
    passed = passed and not any(re.search(r, output, re.M) for r in t["fail_re"])
    t["result"] = "skip" if t["skip"] is not None and code == t["skip"] else ("pass" if passed else f"FAIL {code}")
    print(f"{t['name']:34} {t['wall']:8.1f} s wall {t['cpu']:8.1f} s CPU  {t['result']}  {tail[0][:90]}", flush=True)


def estimate(cpus, cores):
    """the idle wall time of ctest -jCORES: longest first, each test on the core free first"""
    free = [0.0] * cores
    for c in sorted(cpus, reverse=True):
        i = free.index(min(free))
        free[i] += c
    return max(free)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("-j", type=int, default=1)
    ap.add_argument("-R")
    ap.add_argument("-L")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--clear-cache", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if a.clear_cache:
        shutil.rmtree(os.path.join(build, "cc-cache"), ignore_errors=True)
    tests = tests_of(build, a.R, a.L)
    queue, lock = list(tests), threading.Lock()

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                t = queue.pop(0)
            run_one(t)

    threads = [threading.Thread(target=worker) for _ in range(a.j)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print("\n| test | wall s | CPU s (user+sys) | result |\n|---|---:|---:|---|")
    for t in sorted(tests, key=lambda t: -t["cpu"]):
        print(f"| {t['name']} | {t['wall']:.1f} | {t['cpu']:.1f} | {t['result']} |")
    cpus = [t["cpu"] for t in tests]
    print(f"\n{len(tests)} tests: {sum(cpus):.0f} CPU s; estimated idle wall on {a.cores} cores "
          f"(longest first): {estimate(cpus, a.cores):.0f} s")
    sys.exit(1 if any(t["result"].startswith("FAIL") for t in tests) else 0)


main()
