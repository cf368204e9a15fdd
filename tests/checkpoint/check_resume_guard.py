#!/usr/bin/env python3
"""tests/checkpoint/check_resume_guard.py: a resume either continues the checkpoint's run or is refused
before step 1 (issue 23); never a silent restart.

  pairs      a checkpoint of plan A resumed by plan B, across sync modes, ZeRO stages, offload and
             precisions: B continues A's run (each of B's losses within the tolerance of B's
             precision of A's uninterrupted run: 1e-5 relative between f32 plans, 3e-3 where bf16
             or fp16 is involved; a restart from the initial weights is off by 5% and more), or
             B refuses with the cause before any step (no log line, nothing written):
               zero1_dp4 -> dp4_local_sgd, dp4_local_sgd -> zero1_dp4   refused (per-replica state)
               single -> bf16, single -> fp16, bf16 -> single, fp16 -> bf16, zero1_dp4 -> fp16,
               zero1_dp4 -> zero1_offload_disk, bf16_zero2_dp4 -> bf16_zero3_offload_disk   continue
  reshard    `planc reshard ... --plan dp4_local_sgd` refused, no step directory written; f32 ->
             bf16 resharded offline resumes exactly as resuming the f32 checkpoint directly
  data       a corpus of the same size and other bytes (the same text reversed) is refused, and so is a
             blend whose second file is (every file of a blend is hashed); the same blend resumes
  manifest   a hand-edited manifest (the seed; a piece moved; the step) with its checksum
             recomputed is refused as disagreeing with its files; the unedited copy resumes; a
             piece's block edited outside its tensor in its rank file and the manifest alike (an
             empty dimension; past the tensor's end) is refused with the cause, not a crash
  rebuilt    a checkpoint of the same plan compiled differently (another fingerprint: what a program
             built by another planc version, which numbers buffers otherwise, finds; here the plan is
             edited: zero1_dp4 with 64 KiB gradient buckets, dp4_local_sgd averaging every 2 steps):
             zero1_dp4's is read as another plan's (a note names both fingerprints) and continues the
             run; dp4_local_sgd's is refused, naming the fingerprints, not telling the user to resume
             with the plan they used
The plans train at the first of (D 64, S 32) and (S 32) at which every one of them keeps its schedule
(harness.common_size: the same collectives, buckets, stages and layers as at the example's size; one
size, as checkpoints move between them): what a resume accepts or refuses is the plan's layout,
state and data, not the model's width. (At that size a restart from the initial weights is still
off by more than the tolerances: the runner prints the margin, "restart margin".)
Prints PASS/FAIL per check and 'N passed, M failed'.
usage: check_resume_guard.py PLANC REPO_ROOT
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Tally, common_size, explain, model_args, mpi_env  # noqa: E402

planc, root = sys.argv[1], sys.argv[2]
env = mpi_env(PLANRT_WATCHDOG="60")
data = f"{root}/data/corpus.txt"
gpt = f"{root}/examples/gpt.plan"
work = tempfile.mkdtemp(prefix="planc-resume-guard-")
T = Tally()
WORLD = {}
STEPS, AT = 5, 2  # the runs take 5 steps; checkpoints at step 2 are resumed
PLANS = ["single", "bf16", "fp16", "zero1_dp4", "dp4_local_sgd", "bf16_zero2_dp4", "zero1_offload_disk",
         "bf16_zero3_offload_disk"]
SIZE = model_args(common_size(planc, gpt, PLANS, [("D=64", "S=32"), ("S=32",)]))
print(f"note: the plans train at {' '.join(SIZE) or 'the example size'}", flush=True)


def build(plan):
    prog = f"{work}/{plan}"
    if plan not in WORLD:
        r = subprocess.run([planc, "build", gpt, "--plan", plan, "-o", prog, "--native", *SIZE], capture_output=True,
                           text=True, env=env)
        if r.returncode:
            raise SystemExit(f"FAIL: planc build {plan}: {r.stderr[-400:]}")
        WORLD[plan] = explain(planc, gpt, plan, env, SIZE)["world"]
    return prog


def run(plan, *args, timeout=300):
    prog = build(plan)
    r = subprocess.run(["mpirun", "-np", str(WORLD[plan]), prog, *args], capture_output=True, text=True,
                       env=env, timeout=timeout)
    return r.returncode, r.stderr


def losses(log):
    return {x["step"]: x["loss"] for x in map(json.loads, open(log)) if "loss" in x} if os.path.exists(log) else {}


# every source: its uninterrupted run, checkpointed at step AT
full = {}
for plan in ["single", "bf16", "fp16", "zero1_dp4", "dp4_local_sgd", "bf16_zero2_dp4"]:
    build(plan)
    rc, err = run(plan, "--data", data, "--steps", str(STEPS), "--log", f"{work}/{plan}.jsonl", "--save-every",
                  str(AT), f"{work}/{plan}_ck")
    full[plan] = losses(f"{work}/{plan}.jsonl")
    if rc or sorted(full[plan]) != list(range(STEPS)):
        raise SystemExit(f"FAIL: the uninterrupted run of {plan}: {err[-400:]}")
# what a restart would look like: steps AT.. at the initial weights' loss (about step 0's)
margin = min(abs(full["single"][s] - full["single"][0]) / full["single"][0] for s in range(AT, STEPS))
print(f"note: restart margin: the single run's losses of steps {AT}-{STEPS - 1} are {margin:.1%} and more below "
      f"step 0's (the tolerances are 1e-5 and 3e-3)", flush=True)


def first_line(err):
    """the cause: the first planrt line that is not a note or another rank's SIGTERM report"""
    lines = [x for x in err.splitlines() if x.startswith("planrt") and "note:" not in x and "stopped by SIG" not in x]
    return lines[0][:220] if lines else err.strip()[:220]


def resumed(a, b, tol):
    """B resumed from A's step-AT checkpoint continues A's run within tol"""
    log = f"{work}/{a}_to_{b}.jsonl"
    rc, err = run(b, "--data", data, "--steps", str(STEPS), "--resume", f"{work}/{a}_ck/step-{AT:08d}", "--log", log)
    got, ref = losses(log), full[a]
    worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in got), default=1.0)
    ok = rc == 0 and f"resumed at step {AT}" in err and sorted(got) == list(range(AT, STEPS)) and worst <= tol
    T.check(f"{a} -> {b} continues {a}'s run", ok,
            f"steps {AT}-{STEPS - 1}, worst relative loss difference {worst:.2e} (tolerance {tol:g})" if rc == 0
            else first_line(err))
    return got


def refused(a, b, pattern):
    """B refuses A's checkpoint before any step: the cause named, no log line, no checkpoint written"""
    log, ck = f"{work}/{a}_to_{b}.jsonl", f"{work}/{a}_to_{b}_ck"
    rc, err = run(b, "--data", data, "--steps", str(STEPS), "--resume", f"{work}/{a}_ck/step-{AT:08d}", "--log", log,
                  "--save-every", "1", ck)
    steps = [d for d in os.listdir(ck) if d.startswith("step-")] if os.path.isdir(ck) else []
    ok = rc != 0 and pattern in err and not losses(log) and not steps and "resumed at step" not in err
    T.check(f"{a} -> {b} refused before step 1", ok, first_line(err) if ok else
            f"rc {rc}, {len(losses(log))} steps logged, checkpoints {steps}: {first_line(err)}")


# ---------------------------------------------------------------- pairs
refused("zero1_dp4", "dp4_local_sgd", "keeps each replica's own weights and optimizer state")
refused("dp4_local_sgd", "zero1_dp4", "holds each replica's own state")
resumed("single", "bf16", 3e-3)
resumed("single", "fp16", 3e-3)
resumed("bf16", "single", 3e-3)
resumed("fp16", "bf16", 3e-3)
resumed("zero1_dp4", "fp16", 3e-3)
resumed("zero1_dp4", "zero1_offload_disk", 1e-5)
resumed("bf16_zero2_dp4", "bf16_zero3_offload_disk", 1e-5)

# ---------------------------------------------------------------- offline resharding
out = f"{work}/rx_local_sgd"
r = subprocess.run([planc, "reshard", gpt, "--plan", "dp4_local_sgd", *SIZE, f"{work}/zero1_dp4_ck", "-o", out],
                   capture_output=True, text=True, env=env, timeout=300)
written = os.listdir(out) if os.path.isdir(out) else []
T.check("planc reshard into dp4_local_sgd refused, nothing written",
        r.returncode != 0 and "no checkpoint can be resharded into it" in r.stderr and not written,
        first_line(r.stderr) if r.returncode else f"exit 0, wrote {written}")
out = f"{work}/rx_bf16"
r = subprocess.run([planc, "reshard", gpt, "--plan", "bf16", *SIZE, f"{work}/single_ck/step-{AT:08d}", "-o", out],
                   capture_output=True, text=True, env=env, timeout=300)
T.check("planc reshard single -> bf16 written", r.returncode == 0, first_line(r.stderr))
if r.returncode == 0:
    direct = losses(f"{work}/single_to_bf16.jsonl")
    rc, err = run("bf16", "--data", data, "--steps", str(STEPS), "--resume", out, "--log", f"{work}/rx_bf16.jsonl")
    offline = losses(f"{work}/rx_bf16.jsonl")
    T.check("bf16 resumed from the resharded checkpoint equals bf16 resumed from single's", rc == 0 and offline == direct
            and sorted(offline) == list(range(AT, STEPS)), "losses bit for bit" if rc == 0 else first_line(err))

# ---------------------------------------------------------------- the data file by content
rev = f"{work}/reversed.txt"
open(rev, "wb").write(open(data, "rb").read()[::-1])
rc, err = run("single", "--data", rev, "--steps", str(STEPS), "--resume", f"{work}/single_ck", "--log",
              f"{work}/rev.jsonl")
T.check("a corpus of the same size and other bytes is refused", rc != 0 and "trained on other data" in err and
        not losses(f"{work}/rev.jsonl"), first_line(err))
# a blend: every file of it is identified, not only the first
copy = f"{work}/copy.txt"
shutil.copyfile(data, copy)
rc, err = run("single", "--data", "0.5", data, "0.5", copy, "--steps", str(AT), "--save-every", str(AT),
              f"{work}/blend_ck", "--log", f"{work}/blend.jsonl")
if rc:
    T.check("a blend's run checkpoints", False, first_line(err))
else:
    rc, err = run("single", "--data", "0.5", data, "0.5", rev, "--steps", str(STEPS), "--resume", f"{work}/blend_ck",
                  "--log", f"{work}/blend_rev.jsonl")
    T.check("a blend whose second file has the same size and other bytes is refused",
            rc != 0 and "trained on other data" in err and not losses(f"{work}/blend_rev.jsonl"), first_line(err))
    rc, err = run("single", "--data", "0.5", data, "0.5", copy, "--steps", str(STEPS), "--resume", f"{work}/blend_ck",
                  "--log", f"{work}/blend_same.jsonl")
    T.check("the same blend resumes", rc == 0 and sorted(losses(f"{work}/blend_same.jsonl")) == list(range(AT, STEPS)),
            first_line(err))

# ---------------------------------------------------------------- hand-edited manifests


def fnv1a(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"fnv1a64:{h:016x}"


def edited(name, edit):
    """a copy of single's step-AT checkpoint whose manifest edit() changed, its checksum recomputed"""
    d = f"{work}/edit_{name}/step-{AT:08d}"
    shutil.copytree(f"{work}/single_ck/step-{AT:08d}", d)
    m = json.load(open(f"{d}/manifest.json"))
    edit(m)
    m.pop("manifest_checksum")
    m["manifest_checksum"] = fnv1a(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    json.dump(m, open(f"{d}/manifest.json", "w"), indent=1, sort_keys=True)
    return d


def move_piece(m):
    p = m["tensors"]["wte"]["pieces"][0]
    p["range"] = [p["range"][0] + 1, p["range"][1] + 1]


for name, edit in [("unedited", lambda m: None), ("seed", lambda m: m["rng"].update(seed="99")),
                   ("step", lambda m: m.update(step=4)), ("piece", move_piece)]:
    d = edited(name, edit)
    rc, err = run("single", "--data", data, "--steps", str(STEPS), "--resume", d, "--log", f"{work}/edit_{name}.jsonl")
    if name == "unedited":
        T.check("a manifest rewritten without a change (checksum recomputed) resumes", rc == 0 and
                losses(f"{work}/edit_{name}.jsonl") == {s: v for s, v in full["single"].items() if s >= AT},
                "losses bit for bit" if rc == 0 else first_line(err))
    else:
        T.check(f"a manifest with its {name} edited and its checksum recomputed is refused",
                rc != 0 and ("disagree" in err or "is not the one its file" in err), first_line(err))


def edit_rank_file(d, tensor, edit):
    """d's rank file holding tensor's first piece, with edit(piece) applied to its header's part
    (which the data checksum does not cover) and to the manifest, whose file size and checksum
    are recomputed: a consistent, hostile checkpoint"""
    m = json.load(open(f"{d}/manifest.json"))
    piece = m["tensors"][tensor]["pieces"][0]
    entry = m["files"][piece["file"]]
    path = f"{d}/{entry['name']}"
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    part = json.loads(header["__metadata__"]["planrt_checkpoint"])
    edit(next(q for q in part["pieces"] if q["tensor"] == tensor and q["key"] == piece["key"]))
    edit(piece)
    header["__metadata__"]["planrt_checkpoint"] = json.dumps(part, sort_keys=True, separators=(",", ":"))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out = len(text).to_bytes(8, "little") + text + raw[8 + n:]
    open(path, "wb").write(out)
    entry["bytes"] = len(out)
    m.pop("manifest_checksum")
    m["manifest_checksum"] = fnv1a(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    json.dump(m, open(f"{d}/manifest.json", "w"), indent=1, sort_keys=True)


# a piece whose block lies outside its tensor, edited alike in its rank file and the manifest (an
# empty last dimension past the first column: the reader divided by it, SIGFPE, before it was
# checked; a block past the tensor's end): refused with the cause, nothing trained
for name, edit in [("empty", lambda q: q.update(offsets=[0, 1], block=[q["block"][0], 0])),
                   ("past", lambda q: q.update(offsets=[1, 0]))]:
    d = edited(f"block_{name}", lambda m: None)
    edit_rank_file(d, "wte", edit)
    rc, err = run("single", "--data", data, "--steps", str(STEPS), "--resume", d, "--log", f"{work}/block_{name}.jsonl")
    T.check(f"a piece whose block lies outside its tensor ({name}), in its rank file and the manifest alike, is refused",
            rc != 0 and "do not lie inside the tensor" in err and not losses(f"{work}/block_{name}.jsonl"),
            first_line(err))

# ---------------------------------------------------------------- another build of the same plan
def rebuilt(plan, edit):
    """plan compiled from an edited copy of its text (same name, another fingerprint): the program"""
    text = open(gpt).read()
    at = text.index(f"plan {plan} for gpt {{")
    end = text.index("\n}", at)
    edited_gpt = f"{work}/rebuilt_{plan}.plan"
    open(edited_gpt, "w").write(text[:at] + edit(text[at:end]) + text[end:])
    prog = f"{work}/rebuilt_{plan}"
    r = subprocess.run([planc, "build", edited_gpt, "--plan", plan, "-o", prog, "--native", *SIZE],
                       capture_output=True, text=True, env=env)
    return prog if r.returncode == 0 else None


def resume_rebuilt(plan, prog):
    log = f"{work}/rebuilt_{plan}.jsonl"
    r = subprocess.run(["mpirun", "-np", str(WORLD[plan]), prog, "--data", data, "--steps", str(STEPS), "--resume",
                        f"{work}/{plan}_ck/step-{AT:08d}", "--log", log], capture_output=True, text=True, env=env,
                       timeout=300)
    return r.returncode, r.stderr, losses(log)


prog = rebuilt("zero1_dp4", lambda t: t + "\n  sync strict, bucket = 64KiB")
if not prog:
    T.check("zero1_dp4 with 64 KiB buckets builds", False, "planc build failed")
else:
    rc, err, got = resume_rebuilt("zero1_dp4", prog)
    ref = full["zero1_dp4"]
    worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in got), default=1.0)
    T.check("zero1_dp4's checkpoint resumed by zero1_dp4 compiled differently continues the run, the note naming it",
            rc == 0 and "compiled differently" in err and sorted(got) == list(range(AT, STEPS)) and worst <= 1e-5,
            f"worst relative loss difference {worst:.2e}" if rc == 0 else first_line(err))
prog = rebuilt("dp4_local_sgd", lambda t: t.replace("every = 4", "every = 2"))
if not prog:
    T.check("dp4_local_sgd averaging every 2 steps builds", False, "planc build failed")
else:
    rc, err, got = resume_rebuilt("dp4_local_sgd", prog)
    T.check("dp4_local_sgd's checkpoint resumed by dp4_local_sgd compiled differently is refused, naming the cause",
            rc != 0 and "compiled differently" in err and "resume it with plan" not in err and not got,
            first_line(err))

shutil.rmtree(work, ignore_errors=True)
T.finish()
