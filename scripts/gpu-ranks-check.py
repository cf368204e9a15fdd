#!/usr/bin/env python3
"""gpu-ranks-check.py: one multi-rank run of scripts/gpu-check.sh held against the CPU program and
planc explain (the bundle's ranks/NAME/ holds cpu.jsonl, explain.json, world, kind; gpu-prepare.sh
made them). Prints what it found and appends a row of the per-plan table to ROWS (JSON lines).

    gpu-ranks-check.py RANKS_DIR GPU_LOG STDERR TRACE ROWS

  losses      every step's loss against the CPU program's (which ran on planrt's node-local MPI,
              the same reductions the GPU run's MPI device backend makes): f32 within 1e-6
              relative (TF32 off), fp16 within 1e-4 with the loss scale and the skipped steps
              exactly; a MoE model's routing metrics (moe_dropped, moe_load) exactly; async
              (bounded staleness: which version a worker computes on depends on timing) on the
              steps up to the first whose versions differ from the CPU run's, and staleness within
              the plan's bound on every step;
  memory      on every rank, the device memory and pinned host memory the program allocated equal
              explain's arena + state + host state for that rank's stage and role, and its arena is
              explain's (the MPI device backend's staging buffers, host_staging, are not the plan's
              and are reported beside);
  step time   the mean step_ms of steps 3..20 (rank 0's log);
  comm wait   from the trace: on each rank, the time its GPU's compute stream stood still for
              communication ("comm wait" events, measured on the device) within its "step"
              events, over the steps' time (the first step left out); the mean and the largest
              over the ranks. The timing report's wait_s / step_s is printed beside as a cross-check.
Exit status 0 when the losses, the metrics and the memory pass."""
import json
import re
import sys

d, log_path, err_path, trace_path, rows_path = sys.argv[1:6]
kind = open(f"{d}/kind").read().strip()
world = int(open(f"{d}/world").read())
what = open(f"{d}/what").read().strip()
ex = json.load(open(f"{d}/explain.json"))
cpu = [json.loads(line) for line in open(f"{d}/cpu.jsonl")]
try:
    gpu = [json.loads(line) for line in open(log_path)]
except (OSError, ValueError):
    gpu = []
err = open(err_path, errors="replace").read()
ok = True


def say(line):
    print(f"  {line}", flush=True)


# ---- losses and metrics ----------------------------------------------------------------------
compared = min(len(cpu), len(gpu))
if kind == "async":
    for i in range(compared):
        if cpu[i].get("versions") != gpu[i].get("versions"):
            compared = i
            break
    bound = ex["sync"]["staleness"]
    stale = [x.get("staleness", 0) for x in gpu]
    ok_stale = len(gpu) == len(cpu) and all(s <= bound for s in stale)
    say(f"staleness on the GPU: {max(stale, default=0)} at most (bound {bound}), a stale worker on "
        f"{sum(1 for s in stale if s)} of {len(gpu)} steps; the versions equal the CPU run's on the first "
        f"{compared} steps")
    ok = ok and ok_stale
tol = {"f32": 1e-6, "fp16": 1e-4, "async": 1e-6}[kind]
rel = [abs(g["loss"] - c["loss"]) / abs(c["loss"]) for c, g in zip(cpu[:compared], gpu[:compared])]
worst = max(rel, default=0.0)
for i in range(compared):
    if i % 5 == 0 or i == compared - 1:
        say(f"step {i:2d}  cpu {cpu[i]['loss']:.7f}  gpu {gpu[i]['loss']:.7f}  rel {rel[i]:.2e}")
steps_ok = len(gpu) == len(cpu) == 20 and (kind == "async" or compared == 20) and worst <= tol
say(f"{len(gpu)} of {len(cpu)} steps, {compared} compared, worst relative difference {worst:.2e} (tolerance {tol:g})")
ok = ok and steps_ok
for keys, label in ((("moe_dropped", "moe_load"), "routing metrics"), (("loss_scale", "skipped"), "loss scale and skips")):
    if cpu and keys[0] in cpu[0]:
        differ = [i for i, (c, g) in enumerate(zip(cpu, gpu)) if tuple(c.get(k) for k in keys) != tuple(g.get(k) for k in keys)]
        same = not differ and len(gpu) == len(cpu)
        say(f"{label} equal the CPU's on {len(gpu) - len(differ)} of {len(cpu)} steps" +
            (f"; first difference at step {differ[0]}" if differ else ""))
        ok = ok and same

# ---- memory, per rank ------------------------------------------------------------------------
mem = {}
for m in re.finditer(r"planrt: rank (\d+): memory (.*)", err):
    mem[int(m.group(1))] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
roles = ex["roles"]
mem_bad = []
for rank in range(world):
    m = mem.get(rank)
    if not m:
        mem_bad.append(f"rank {rank}: no memory report")
        continue
    cands = [r for r in roles if r["stage"] == m["stage"]]
    role = cands[0]
    if len(cands) > 1:  # async: the master is its role's first rank, the others are workers
        role = next((r for r in cands if r["role"] == "master" and r["first_rank"] == rank), None) or \
            next(r for r in cands if r["role"] != "master")
    prog = role["program"]
    want = prog["arena"] + prog["state"] + prog["host"]
    have = m.get("device_allocated", -1) + m.get("host_pinned", 0)
    if m.get("arena_planned") != prog["arena"] or have != want:
        mem_bad.append(f"rank {rank}: device {m.get('device_allocated')} + pinned {m.get('host_pinned')} = {have}, "
                       f"arena {m.get('arena_planned')}; explain: arena {prog['arena']} + state {prog['state']} + host "
                       f"{prog['host']} = {want}")
staging = max((m.get("host_staging", 0) for m in mem.values()), default=0)
if mem_bad:
    for line in mem_bad[:4]:
        say(f"memory: {line}")
else:
    say(f"memory: every rank's device + pinned host bytes equal explain's (arena + state + host state) exactly; the "
        f"MPI device backend's staging buffers: {staging / 2**20:.2f} MiB at most per rank (not the plan's)")
ok = ok and not mem_bad

# ---- step time, and the share waiting on communication ----------------------------------------
steady = gpu[2:] if len(gpu) > 4 else gpu
step_ms = sum(x["step_ms"] for x in steady) / len(steady) if steady else float("nan")
shares = []
try:
    events = json.load(open(trace_path))["traceEvents"]
except (OSError, ValueError, KeyError):
    events = []
for rank in range(world):
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("pid") == rank and e.get("name") == "step" and e.get("cat") == "run" and e.get("ph") == "X")[1:]
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("pid") == rank and e.get("name") == "comm wait"]
    total = sum(b - a for a, b in steps)
    waited = sum(max(0.0, min(b, s1) - max(a, s0)) for s0, s1 in steps for a, b in waits)
    if total > 0:
        shares.append(waited / total)
report = [float(w) / float(s) for s, w in re.findall(r"timing stage=\d+ steps=\d+ step_s=([\d.]+) busy_s=[\d.]+ wait_s=([\d.]+)", err)
          if float(s) > 0]
share_text = (f"{sum(shares) / len(shares):.0%} (max {max(shares):.0%})" if shares else "no trace")
report_text = f"{sum(report) / len(report):.0%}" if report else "none"
say(f"step {step_ms:.1f} ms (mean of steps 3..20); waiting on communication: {share_text} of the step on the "
    f"compute stream (trace, {len(shares)} ranks); the timing report's wait_s/step_s: {report_text}")
backend = re.search(r"rank 0's device communicators \(PLANRT_COMM=\w+\): (.*)", err)
with open(rows_path, "a") as f:
    f.write(json.dumps({"plan": what, "ranks": world, "losses": f"{worst:.1e} ({compared} steps)",
                        "memory": "= explain" if not mem_bad else "DIFFERS", "step_ms": round(step_ms, 1),
                        "comm_wait": share_text, "backend": backend.group(1) if backend else "?",
                        "ok": ok}) + "\n")
sys.exit(0 if ok else 1)
