#!/usr/bin/env python3
"""Benchmark (figures, not a test): what a rank does while it waits, when a node runs more ranks
than it has cores (runtime/comm/comm_mpi.c, PLANRT_WAIT).

examples/gpt.plan's GPT at S = 128, D = 256 under four 4-rank plans (data = 4; data = 2 x pipe = 2,
one micro-batch; tensor = 4; data = 2 x tensor = 2 with sequence parallelism and ZeRO 1), each
run with PLANRT_WAIT=yield (poll, yielding the core), sleep (sleep between polls, up to 256 us)
and auto (the default: sleep up to 32 us while another rank of the node computes, yield once all
of them wait). Rounds interleave every plan and policy, so that a change of the machine's load
falls on each alike. Prints each pair's median step (ms; the median step_ms of a run after two
warm-up steps) and the median CPU seconds of the whole job over the rounds. On a machine with as
many cores as ranks every policy but sleep is the same.
usage: bench/oversubscribed_wait.py [PLANC] [--steps N] [--rounds R]   (from the repository root)"""
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from harness import mpi_env  # noqa: E402

PLANS = {
    "data = 4": "mesh data = 4\n  shard B -> data",
    "data = 2, pipe = 2 (1f1b, 1 micro-batch)": "mesh data = 2, pipe = 2\n  shard B -> data\n  pipeline pipe: 1f1b",
    "tensor = 4": "mesh tensor = 4\n  use nn.megatron(tensor)",
    "data = 2, tensor = 2 (sp, zero 1)": "mesh data = 2, tensor = 2\n  shard B -> data\n  use nn.megatron(tensor)\n"
                                         "  use nn.sequence_parallel(tensor)\n  zero 1 over data",
}
POLICIES = ["yield", "sleep", "auto"]


def main():
    planc = next((a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()), "build/planc")
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 12
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    source = open("examples/gpt.plan").read()
    model = source[:source.index("# ---- one rank")]
    work = tempfile.mkdtemp(prefix="planc-wait-")
    progs = {}
    for i, (label, body) in enumerate(PLANS.items()):
        name = "p%d" % i
        src = os.path.join(work, name + ".plan")
        with open(src, "w") as f:
            f.write(model + "plan %s for gpt(S = 128, D = 256) {\n  batch B = 16\n  %s\n  optimizer adamw(lr = 3e-4, "
                    "betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0\n}\n" % (name, body))
        progs[label] = os.path.join(work, name)
        subprocess.run([planc, "build", src, "--plan", name, "-o", progs[label]], check=True, capture_output=True)
    print("load average at start: %.2f %.2f %.2f; %d cores, 4 ranks, %d steps, %d rounds"
          % (os.getloadavg() + (os.cpu_count(), steps, rounds)), flush=True)
    step_ms = {(p, w): [] for p in PLANS for w in POLICIES}
    cpu_s = {(p, w): [] for p in PLANS for w in POLICIES}
    log = os.path.join(work, "run.jsonl")
    for _ in range(rounds):
        for label, prog in progs.items():
            for wait in POLICIES:
                env = dict(mpi_env(), PLANRT_WAIT=wait)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(["mpirun", "-np", "4", prog, "--steps", str(steps), "--data", "data/corpus.txt",
                                "--log", log], check=True, capture_output=True, env=env, timeout=1800)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_s[label, wait].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                ms = [json.loads(line)["step_ms"] for line in open(log) if '"step_ms"' in line]
                step_ms[label, wait].append(statistics.median(ms[2:]))
    print("%-42s" % "plan" + "".join("%18s" % ("%s ms (CPU s)" % w) for w in POLICIES))
    for label in PLANS:
        print("%-42s" % label + "".join("%18s" % ("%.1f (%.1f)" % (statistics.median(step_ms[label, w]),
                                                                    statistics.median(cpu_s[label, w])))
                                        for w in POLICIES))
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
