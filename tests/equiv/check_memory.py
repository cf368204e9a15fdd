#!/usr/bin/env python3
"""Peak memory per rank measured by a generated program against planc explain's prediction.

The program fills its arena with a canary, trains, and reports the highest arena word that
changed (its measured high-water mark) and the bytes of persistent state it allocated; explain
reports the planned arena plus state plus the runtime's fixed buffers. They must agree within 10%.
usage: check_memory.py PLANC REPO_ROOT
"""
import json
import os
import re
import subprocess
import sys
import tempfile

planc, root = sys.argv[1], sys.argv[2]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PLANRT_REPORT_MEMORY="1")
work = tempfile.mkdtemp(prefix="planc-memory-")
passed = failed = 0
CASES = [("gpt", "single"), ("gpt", "dp2"), ("gpt", "tp2_sp"), ("gpt", "zero3_dp4"), ("gpt", "bf16"), ("gpt", "bf16_zero2_dp4"), ("mlp", "dp2_tp2_zero2")]
for model, plan in CASES:
    src = f"{root}/examples/{model}.plan"
    d = json.loads(subprocess.run([planc, "explain", src, "--plan", plan, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    want = d["roles"][0]["program"]["peak"]
    prog = f"{work}/{model}_{plan}"
    subprocess.run([planc, "build", src, "--plan", plan, "-o", prog], check=True)
    r = subprocess.run(["mpirun", "-np", str(d["world"]), prog, "--steps", "3", "--data", f"{root}/data/corpus.txt"],
                       capture_output=True, text=True, env=env, timeout=600)
    got = [int(m.group(1)) + int(m.group(2))
           for m in re.finditer(r"arena_high_water=(\d+) arena_planned=\d+ state=(\d+)", r.stderr)]
    ok = r.returncode == 0 and len(got) == d["world"] and all(abs(g - want) <= 0.10 * want for g in got)
    worst = max((abs(g - want) / want for g in got), default=float("nan"))
    print(f"{'PASS' if ok else 'FAIL'}: {model} {plan}: measured {max(got, default=0) / 2**20:.2f} MiB per rank "
          f"(arena high-water + state) vs explain {want / 2**20:.2f} MiB, worst {100 * worst:.2f}% off", flush=True)
    passed, failed = passed + ok, failed + (not ok)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
