#!/usr/bin/env python3
"""tests/observe: watching a run (issue 12): --trace, --eval-every, the TensorBoard converter, the network transport.

  trace       --trace FILE of a pipeline x data-parallel run (4 ranks) and of a ZeRO-3 run: one JSON
              file, one process per rank named by its mesh coordinates, every kind of event (run
              phases, compute actions, GEMM kernels, collectives, p2p, waits); on every rank the events
              nest (each lies inside its parent or after it, never across its end); every compute,
              kernel and communication event lies inside a run phase; one step event per step; each
              rank's collective and p2p bytes add up to the PLANRT_REPORT_COMM counters of the same
              run (which tests/equiv holds against planc explain); the GEMM FLOPs of a step add up on
              every step alike; the run's losses equal the untraced run's bit for bit
  eval        --eval-every N logs eval_loss on the held-out split after every N steps (and prints it);
              the held-out loss is the same under every plan (single, dp2, tp2, zero3_dp4: within
              1e-6 relative), it falls as the model trains, and evaluating does not touch the
              training: the losses and final weights of --eval-every 2 and --eval-every 3 runs are
              equal bit for bit (the logged loss of an evaluated step was once the held-out one's)
  tensorboard scripts/jsonl_to_tensorboard.py turns a --log into a TensorBoard event file: its
              records' masked CRC-32C checksums hold, every step's loss, eval_loss, lr and grad_norm
              are there as scalars with their step, decoded by this file's own reader; when the
              tensorboard package is installed, its EventAccumulator reads the same values
  tcp         the same plan over the network transport only (OMPI_MCA_btl=self,tcp, as between
              nodes) trains exactly as over shared memory: every loss and the final weights bit for
              bit (a data-parallel and a pipeline plan)
Prints PASS/FAIL per check and a closing 'N passed, N failed' line.
usage: run_observe.py PLANC REPO_ROOT
"""
import collections
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

runner = harness.Runner("observe")
root, data, work, check = runner.root, runner.data, runner.work, runner.check
build, WORLD = runner.programs.build, runner.programs.world
log_rows, losses = harness.read_log, harness.losses


def run(prog, *args, extra_env=None, timeout=180):
    return runner.programs.run(prog, *args, extra_env=extra_env, timeout=timeout)


# ------------------------------------------------------------------ trace

def check_nesting(events):
    """events of one (pid, tid): each inside its parent or after it. Returns (ok, detail, parents)."""
    eps = 0.002  # the file's timestamps are printed to 0.001 us
    order = sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"]))
    stack, parents = [], {}
    for i in order:
        e = events[i]
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and start >= events[stack[-1]]["ts"] + events[stack[-1]]["dur"] - eps:
            stack.pop()
        if stack:
            p = events[stack[-1]]
            if end > p["ts"] + p["dur"] + eps:
                return False, f"'{e['name']}' at {start:.3f}+{e['dur']:.3f} crosses the end of '{p['name']}' " \
                              f"at {p['ts']:.3f}+{p['dur']:.3f}", parents
        parents[i] = stack[:]
        stack.append(i)
    return True, "", parents


def trace_case(model, plan, steps, extra=()):
    prog = build(model, plan)
    world = WORLD[prog]
    trace = f"{work}/{plan}.trace.json"
    rc, err = run(prog, "--steps", str(steps), "--data", data, "--trace", trace, "--log", f"{work}/{plan}.t.jsonl",
                  *extra, extra_env={"PLANRT_REPORT_COMM": "1"})
    if not check(f"trace {plan}: the run with --trace", rc == 0 and os.path.exists(trace), err[-300:] if rc else ""):
        return
    rc, _ = run(prog, "--steps", str(steps), "--data", data, "--log", f"{work}/{plan}.u.jsonl", *extra)
    a, b = losses(f"{work}/{plan}.t.jsonl"), losses(f"{work}/{plan}.u.jsonl")
    check(f"trace {plan}: tracing leaves the run as it was", rc == 0 and a == b and len(a) == steps,
          f"{len(a)} losses bit for bit" if a == b else f"{a} vs {b}")
    left = [f for f in os.listdir(work) if f.startswith(os.path.basename(trace) + ".")]
    check(f"trace {plan}: no part files left", not left, str(left))
    doc = json.load(open(trace))
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    check(f"trace {plan}: one process per rank, named by its mesh coordinates",
          sorted(names) == list(range(world)) and all(f"rank {r} (" in names[r] for r in names), str(names))
    complete = [e for e in events if e.get("ph") == "X"]
    cats = collections.Counter(e["cat"] for e in complete)
    want = {"run", "compute", "kernel", "collective", "wait"} | ({"p2p"} if "pp" in plan else set())
    check(f"trace {plan}: every kind of event", want <= set(cats), str(dict(cats)))
    comm = {}
    for line in err.splitlines():  # planrt: rank R: comm kind=K group=G calls=C bytes=B
        if ": comm kind=" in line:
            r = int(line.split("rank ")[1].split(":")[0])
            comm[r] = comm.get(r, 0) + int(line.rsplit("bytes=", 1)[1])
    nest_ok, within_ok, steps_ok, bytes_ok, flops_ok = True, True, True, True, True
    detail = {}
    for r in range(world):
        mine = [e for e in complete if e["pid"] == r]
        ok, why, parents = check_nesting(mine)
        if not ok:
            nest_ok = False
            detail.setdefault("nest", f"rank {r}: {why}")
        for i, e in enumerate(mine):
            if e["cat"] != "run" and not any(mine[p]["cat"] == "run" for p in parents.get(i, [])):
                within_ok = False
                detail.setdefault("within", f"rank {r}: '{e['name']}' ({e['cat']}) outside every run phase")
        step_events = sorted((e for e in mine if e["cat"] == "run" and e["name"] == "step"), key=lambda e: e["ts"])
        if [e["args"]["step"] for e in step_events] != list(range(steps)):
            steps_ok = False
            detail.setdefault("steps", f"rank {r}: steps {[e['args']['step'] for e in step_events]}")
        sent = sum(e["args"]["bytes"] for e in mine if e["cat"] in ("collective", "p2p"))
        if sent != comm.get(r, 0):
            bytes_ok = False
            detail.setdefault("bytes", f"rank {r}: trace {sent} B, counters {comm.get(r, 0)} B")
        per_step = []
        for s in step_events:
            per_step.append(sum(e["args"]["flops"] for e in mine if e["name"] == "gemm" and
                                s["ts"] <= e["ts"] <= s["ts"] + s["dur"]))
        if not per_step or min(per_step) <= 0 or len(set(per_step)) != 1:
            flops_ok = False
            detail.setdefault("flops", f"rank {r}: GEMM FLOPs per step {per_step}")
    check(f"trace {plan}: events nest on every rank", nest_ok, detail.get("nest", f"{len(complete)} events"))
    check(f"trace {plan}: compute, kernels and messages lie inside run phases", within_ok, detail.get("within", ""))
    check(f"trace {plan}: one step event per step on every rank", steps_ok, detail.get("steps", ""))
    check(f"trace {plan}: collective and p2p bytes equal the comm counters", bytes_ok and len(comm) == world,
          detail.get("bytes", f"{sum(comm.values())} B over {world} ranks"))
    check(f"trace {plan}: every step runs the same GEMM FLOPs", flops_ok, detail.get("flops", ""))


trace_case("gpt", "pp2_dp2", 3)
trace_case("mlp", "zero3_dp4", 3, ("--save-every", "2", f"{work}/zck", "--eval-every", "2"))

# ------------------------------------------------------------------ eval

evals = {}
for plan in ["single", "dp2", "tp2", "zero3_dp4"]:
    prog = build("mlp", plan)
    log = f"{work}/eval_{plan}.jsonl"
    rc, err = run(prog, "--steps", "6", "--data", data, "--eval-every", "3", "--log", log)
    rows = log_rows(log) if rc == 0 else []
    evals[plan] = {x["step"]: x["eval_loss"] for x in rows if "eval_loss" in x}
    check(f"eval {plan}: eval_loss after steps 3 and 6", rc == 0 and sorted(evals[plan]) == [2, 5] and
          "eval after step 3: held-out loss" in err, err[-300:] if rc else str(evals[plan]))
base = evals["single"]
worst = max((abs(evals[p][s] - base[s]) / abs(base[s]) for p in evals for s in base if s in evals[p]), default=1)
check("eval: the held-out loss is the same under every plan", worst <= 1e-6 and all(evals[p].keys() == base.keys()
                                                                                    for p in evals),
      f"worst relative difference {worst:.2e}")
check("eval: the held-out loss falls as the model trains", base.get(5, 1e9) < base.get(2, 0), str(base))
prog = build("mlp", "dp2")
for k in (2, 3):
    run(prog, "--steps", "6", "--data", data, "--eval-every", str(k), "--log", f"{work}/e{k}.jsonl", "--save",
        f"{work}/e{k}.st")
a, b = losses(f"{work}/e2.jsonl"), losses(f"{work}/e3.jsonl")
same_w = open(f"{work}/e2.st", "rb").read() == open(f"{work}/e3.st", "rb").read()
check("eval: evaluating does not touch the training (--eval-every 2 vs 3)", a == b and len(a) == 6 and same_w,
      "6 losses and the final weights bit for bit" if a == b and same_w else f"{a} vs {b}, weights equal: {same_w}")

# ------------------------------------------------------------------ tensorboard


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """protobuf wire format: (field number, wire type, value) of a message"""
    i, out = 0, []
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        out.append((num, wt, v))
    return out


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def read_events(path):
    blob, i, events, crc_ok = open(path, "rb").read(), 0, [], True
    while i < len(blob):
        (n,) = struct.unpack("<Q", blob[i:i + 8])
        (hcrc,) = struct.unpack("<I", blob[i + 8:i + 12])
        body = blob[i + 12:i + 12 + n]
        (bcrc,) = struct.unpack("<I", blob[i + 12 + n:i + 16 + n])
        crc_ok &= hcrc == masked(crc32c(blob[i:i + 8])) and bcrc == masked(crc32c(body))
        i += 16 + n
        ev = {"scalars": {}}
        for num, wt, v in fields(body):
            if num == 2 and wt == 0:
                ev["step"] = v
            elif num == 3:
                ev["file_version"] = v.decode()
            elif num == 5:  # summary: repeated value {tag = 1, simple_value = 2 (float)}
                for vn, _, val in fields(v):
                    if vn == 1:
                        f = dict((a, b) for a, _, b in fields(val))
                        ev["scalars"][f[1].decode()] = struct.unpack("<f", f[2])[0]
        events.append(ev)
    return events, crc_ok


check("tensorboard: this reader's CRC-32C", crc32c(b"123456789") == 0xE3069283)
log = f"{work}/eval_single.jsonl"
tb = f"{work}/tb"
r = subprocess.run([sys.executable, f"{root}/scripts/jsonl_to_tensorboard.py", log, tb], capture_output=True, text=True)
files = os.listdir(tb) if os.path.isdir(tb) else []
if check("tensorboard: the converter writes one event file", r.returncode == 0 and len(files) == 1 and
         files[0].startswith("events.out.tfevents."), r.stderr[-300:] + str(files)):
    events, crc_ok = read_events(f"{tb}/{files[0]}")
    check("tensorboard: every record's checksums hold", crc_ok)
    check("tensorboard: the first record names the format", events[0].get("file_version") == "brain.Event:2")
    got = collections.defaultdict(dict)
    for ev in events[1:]:
        for tag, v in ev["scalars"].items():
            got[tag][ev.get("step", 0)] = v
    rows = log_rows(log)
    want = collections.defaultdict(dict)
    for x in rows:
        for k in ("loss", "eval_loss", "eval_accuracy", "lr", "grad_norm", "tokens_per_s", "samples_per_s"):
            if k in x:
                want[f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"][x["step"]] = struct.unpack(
                    "<f", struct.pack("<f", x[k]))[0]
    check("tensorboard: every logged value is a scalar at its step", dict(got) == dict(want),
          f"{sum(len(v) for v in got.values())} scalars" if dict(got) == dict(want) else f"{dict(got)} vs {dict(want)}")
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("note: the tensorboard package is not installed; its own reader was not tried")
    else:
        acc = EventAccumulator(tb)
        acc.Reload()
        theirs = {t: {s.step: s.value for s in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
        check("tensorboard: TensorBoard's EventAccumulator reads the same", theirs == dict(want))
r = subprocess.run([sys.executable, f"{root}/scripts/jsonl_to_tensorboard.py", f"{work}/no/such.jsonl", tb],
                   capture_output=True, text=True)
check("tensorboard: a missing log is a one-line error", r.returncode != 0 and "no/such.jsonl" in r.stderr and
      len(r.stderr.strip().splitlines()) == 1, r.stderr)

# ------------------------------------------------------------------ tcp

for model, plan in [("mlp", "dp2"), ("gpt", "pp2")]:
    prog = build(model, plan)
    out = {}
    for btl in ["self,vader", "self,tcp"]:
        tag = btl.split(",")[1]
        rc, err = run(prog, "--steps", "4", "--data", data, "--log", f"{work}/{plan}_{tag}.jsonl", "--save",
                      f"{work}/{plan}_{tag}.st", extra_env={"OMPI_MCA_btl": btl})
        out[tag] = (rc, losses(f"{work}/{plan}_{tag}.jsonl") if rc == 0 else {}, err)
    same = out["vader"][1] == out["tcp"][1] and len(out["tcp"][1]) == 4
    check(f"tcp {model} {plan}: trains over the network transport", out["tcp"][0] == 0, out["tcp"][2][-300:])
    check(f"tcp {model} {plan}: every loss equal to the shared-memory run's", same,
          "4 losses bit for bit" if same else f"{out['vader'][1]} vs {out['tcp'][1]}")
    a, b = f"{work}/{plan}_vader.st", f"{work}/{plan}_tcp.st"
    check(f"tcp {model} {plan}: the final weights equal", os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read())

runner.finish()
