#!/usr/bin/env python3
"""runtime_oversubscribed: ranks that outnumber their cores sleep while they wait (runtime/comm/comm_mpi.c).

When a node runs more ranks than there are cores in the union of their affinity masks, a rank
waiting for a collective sleeps between polls while another rank of the node computes (here the
straggler), instead of yielding, so that the ranks it waits for get the cores; once all of them
wait they poll again (that a data-parallel step is not slowed by sleeping is a timing, which
bench/oversubscribed_wait.py prints and no test asserts). The test confines a 4-rank job to two cores (taskset -c 0,1, whatever the machine
has) and makes rank 0 a straggler (PLANRT_STRAGGLER=0:MS: it sleeps MS ms at the start of every
step), so that the other three ranks wait about MS ms a step in the gradient all-reduce. It holds the
job's CPU seconds (every rank's, from the children's rusage) below the straggler's total delay:
ranks that poll and yield through the wait spend about 2 cores x the delay (measured: 4-5 CPU s for
4 steps of 500 ms), ranks that sleep spend their start and their arithmetic (about 1 CPU s). The same
job with rank 0 not straggling gives the losses, which must equal the straggling run's: the sleep
changes when a rank looks, never what it computes.
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: check_oversubscribed.py PLANC REPO_ROOT
"""
import json
import os
import resource
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

runner = harness.Runner("oversubscribed")
STEPS, DELAY_MS = 4, 500
if not shutil.which("taskset"):
    print("skip: no taskset (util-linux)")
    sys.exit(77)
if len(os.sched_getaffinity(0) & {0, 1}) < 2:
    print("skip: cores 0 and 1 are not both available to this process")
    sys.exit(77)
prog = runner.programs.build("gpt", "dp4", size=("D=64", "S=32"))


def run(tag, straggler):
    """(CPU seconds of the job, its losses) for 4 ranks on cores 0 and 1"""
    log = f"{runner.work}/{tag}.jsonl"
    env = harness.mpi_env(PLANRT_STRAGGLER=straggler)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(["taskset", "-c", "0,1", "mpirun", "-np", "4", prog, "--steps", str(STEPS), "--data",
                        runner.data, "--log", log], capture_output=True, text=True, env=env, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"FAIL: {tag}: mpirun failed: {r.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, [json.loads(line)["loss"] for line in open(log)]


cpu, losses = run("straggler", f"0:{DELAY_MS}")
_, reference = run("reference", None)
delay = STEPS * DELAY_MS / 1000
runner.check("waiting ranks sleep", cpu < delay,
             f"4 ranks on 2 cores, rank 0 sleeping {DELAY_MS} ms a step for {STEPS} steps: the job used "
             f"{cpu:.2f} CPU s against {delay:.1f} s of waiting (ranks that poll through it: about {2 * delay:.0f})")
runner.check("the same losses", losses == reference and len(losses) == STEPS,
             f"{STEPS} steps, straggling or not" if losses == reference else f"{losses} vs {reference}")
runner.finish()
