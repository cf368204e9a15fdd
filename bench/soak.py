#!/usr/bin/env python3
"""bench/soak.py: a long run under random failures (issue 23).

Trains plan gpt_3d of examples/gpt.plan (data 2 x pipe 2 x tensor 2: 8 ranks) for --steps steps
with --save-every, and every --kill-every steps (give or take half of it, at random) SIGKILLs a
random rank; mpirun then ends the job, and the same command line (--resume DIR --save-every N
DIR) starts it again, until a run finishes. A kill may land anywhere: in a step, in a pipeline
transfer, in a checkpoint's save (a step directory without its manifest, which the next run
removes). The weights the last run saves (--save) must equal those of one uninterrupted run bit
for bit, and so must every step's loss in the log (each step's row as its last run wrote it).

Prints the kills (step, rank, when), the restarts, the steps trained again, the wall time and the
verdict; exits 1 if the weights or a loss differ, or a run fails otherwise than by the kill.

  python3 bench/soak.py PLANC ROOT [--steps 2000] [--save-every 50] [--kill-every 100] [--seed 1]
  python3 bench/soak.py PLANC ROOT --short      # the CI form: 12 steps, checkpoints every 2, kills every 3,
                                                # at the smallest size keeping the plan's schedule (D 64, S 32)
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("planc")
ap.add_argument("root")
ap.add_argument("--plan", default="gpt_3d")
ap.add_argument("--steps", type=int, default=2000)
ap.add_argument("--save-every", type=int, default=50)
ap.add_argument("--kill-every", type=int, default=100)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--short", action="store_true", help="12 steps, checkpoints every 2 steps, a kill every 3")
ap.add_argument("--keep", action="store_true", help="keep the work directory")
a = ap.parse_args()
if a.short:
    a.steps, a.save_every, a.kill_every = 12, 2, 3

sys.path.insert(0, os.path.join(a.root, "tests", "lib"))
from harness import model_args, mpi_env, smaller_size  # noqa: E402

env = mpi_env(OMPI_MCA_btl_vader_single_copy_mechanism="none", PLANRT_WATCHDOG="120")
data = f"{a.root}/data/corpus.txt"
work = tempfile.mkdtemp(prefix="planc-soak-")
rng = random.Random(a.seed)
prog = f"{work}/{a.plan}"
src = f"{a.root}/examples/gpt.plan"
# what a kill and a resume do does not depend on the layers' width: the CI form trains on less arithmetic
size = model_args(smaller_size(a.planc, src, a.plan, [("D=64", "S=32")])) if a.short else []
r = subprocess.run([a.planc, "build", src, "--plan", a.plan, "-o", prog, "--native", *size],
                   capture_output=True, text=True, env=env)
if r.returncode:
    sys.exit(f"soak: planc build failed: {r.stderr[-400:]}")
world = json.loads(subprocess.run([a.planc, "explain", src, "--plan", a.plan, "--json", *size],
                                  capture_output=True, text=True, check=True).stdout)["world"]


def rows(log):
    """step -> loss (a resumed run cut the rows past its checkpoint: each step as the run that kept it)"""
    out = {}
    if os.path.exists(log):
        for line in open(log):
            try:
                x = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            if "loss" in x:
                out[x["step"]] = x["loss"]
    return out


def checkpointed(ck):
    """the newest step with a complete checkpoint in ck (its manifest written last), 0: none"""
    steps = [int(d[5:]) for d in os.listdir(ck) if d.startswith("step-") and d[5:].isdigit()
             and os.path.exists(f"{ck}/{d}/manifest.json")] if os.path.isdir(ck) else []
    return max(steps, default=0)


def lines(log):
    try:
        with open(log) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


t0 = time.time()
ref_log, ref_st = f"{work}/ref.jsonl", f"{work}/ref.safetensors"
r = subprocess.run(["mpirun", "-np", str(world), prog, "--data", data, "--steps", str(a.steps), "--log", ref_log,
                    "--save", ref_st], capture_output=True, text=True, env=env)
if r.returncode:
    sys.exit(f"soak: the uninterrupted run failed: {r.stderr[-400:]}")
ref_s = time.time() - t0
print(f"soak: {a.plan}{' at ' + ' '.join(size[1::2]) if size else ''} on {world} ranks, {a.steps} steps "
      f"uninterrupted: {ref_s:.1f} s", flush=True)

ck, log, st = f"{work}/ckpt", f"{work}/soak.jsonl", f"{work}/soak.safetensors"
cmd = ["mpirun", "-np", str(world), prog, "--data", data, "--steps", str(a.steps), "--resume", ck, "--save-every",
       str(a.save_every), ck, "--log", log, "--save", st]
kills, runs, failures, again, t1 = [], 0, [], 0, time.time()
while True:
    runs += 1
    start_lines = lines(log)
    # a resumed run cuts the log back to its checkpoint's step: the rows past it are trained again
    again += max(0, start_lines - checkpointed(ck))
    target = start_lines + max(1, int(a.kill_every * rng.uniform(0.5, 1.5)))  # the log row to kill after
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    killed = None
    while p.poll() is None:
        time.sleep(0.05)
        if killed is None and lines(log) >= target:
            time.sleep(rng.uniform(0, 0.5))  # somewhere inside the next step (or its checkpoint)
            ranks = [int(x) for x in subprocess.run(["ps", "-o", "pid=", "--ppid", str(p.pid)], capture_output=True,
                                                    text=True).stdout.split()]
            if ranks and p.poll() is None:
                victim = rng.randrange(len(ranks))
                try:
                    os.kill(ranks[victim], signal.SIGKILL)
                    killed = (lines(log), victim)
                except ProcessLookupError:
                    pass
    err = p.stderr.read()
    if killed:
        kills.append(killed)
        print(f"soak: run {runs}: killed a rank (process {killed[1]} of {world}) after {killed[0]} logged steps; "
              f"exit {p.returncode}", flush=True)
        continue
    if p.returncode != 0:
        failures.append(err[-600:])
        print(f"soak: run {runs} failed without a kill (exit {p.returncode}):\n{err[-600:]}", flush=True)
        if len(failures) > 3:
            break
        continue
    break
soak_s = time.time() - t1

got, ref = rows(log), rows(ref_log)
same_losses = got == ref
same_weights = os.path.exists(st) and open(st, "rb").read() == open(ref_st, "rb").read()
print(f"soak: {len(kills)} kills, {runs} runs, {again} steps trained again, {soak_s:.1f} s "
      f"({soak_s / max(ref_s, 1e-9):.2f}x the uninterrupted run)")
print(f"soak: losses of all {len(ref)} steps {'equal' if same_losses else 'DIFFER'}; final weights "
      f"{'equal bit for bit' if same_weights else 'DIFFER'} ({os.path.getsize(ref_st)} bytes)")
ok = same_losses and same_weights and not failures and len(kills) > 0
print(f"soak: {'PASS' if ok else 'FAIL'}")
if a.keep or not ok:
    print(f"soak: work directory {work}")
else:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(0 if ok else 1)
