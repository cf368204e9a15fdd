#!/usr/bin/env python3
"""tests/checkpoint: a generated program's checkpoints (issue 12, the runtime side; docs/operability.md).

  resume      --save-every N DIR then --resume DIR continues bit for bit: every step's loss and the
              final weights (--save) equal the uninterrupted run's, and the final checkpoint's
              tensors (parameters, optimizer moments, master weights) are byte for byte the same
              (data parallel, ZeRO-1 with bf16 master weights, a pipeline, compression's rank-local
              error feedback, local SGD's replicas)
  kill -9     a job killed inside a checkpoint's save (PLANRT_TEST_PAUSE holds it after its files,
              before its manifest) leaves the checkpoint before it whole; --resume skips the
              unfinished one and continues bit for bit; the next run cleans up what was left; a
              --save killed before its rename leaves W.tmp.PID, which the next run removes
  reshard     a checkpoint of plan A resumed under plan B: B's losses equal A's uninterrupted run
              within 1e-5 relative (mesh, ZeRO stage, tensor and pipeline splits, bf16); offline,
              planc reshard and PROG --reshard write B's layout, which resumes like A's checkpoint
  keep        --keep K leaves the newest K checkpoints; one command line starts a run and resumes it
(fp16's loss-scaling state across a resume: tests/fp16; refused arguments and failures: tests/program.)
Prints PASS/FAIL per check and a closing 'checkpoint: N passed, M failed' line.
usage: run_checkpoint.py PLANC REPO_ROOT
"""
import json
from math import prod
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

runner = harness.Runner("checkpoint")
planc, root, data, work, check = runner.planc, runner.root, runner.data, runner.work, runner.check
run, env, WORLD = runner.programs.run, runner.programs.env, runner.programs.world
losses = harness.losses
# The GPT plans train at the first of these --model-arg sizes at which every one of them keeps its
# schedule (harness.common_size: the same collectives, buckets, stages and layers as at the
# example's size; one size for all, as checkpoints move between them): what a checkpoint holds and
# how a resume or a reshard reads it depends on the plan's layout, not on the model's width.
# The bf16 pair (bf16_zero2_dp4, resharded onto bf16) stays at the example's size: its losses agree
# with the uninterrupted run's within 1e-5 there (8.4e-7 measured) and not at S 32 (1.3e-5: bf16's
# rounding of a smaller batch's sums).
GPT_PLANS = ["zero1_dp4", "pp2", "dp4_topk_zero1", "dp4_local_sgd", "dp2_tp2"]
GPT_SIZE = harness.common_size(planc, f"{root}/examples/gpt.plan", GPT_PLANS, [("D=64", "S=32"), ("S=32",)])
print(f"note: the GPT plans but the bf16 pair train at {', '.join(GPT_SIZE) or 'the example size'}", flush=True)


def size_of(model, plan):
    return GPT_SIZE if model == "gpt" and plan in GPT_PLANS else ()


def build(model, plan):
    return runner.programs.build(model, plan, size=size_of(model, plan))


def read_st(path):
    return {name: raw for name, (_, _, raw) in harness.read_safetensors(path).items()}


def ckpt_tensors(stepdir):
    """every piece of the checkpoint by (tensor, offsets, range) -> its bytes, and the local buffers"""
    m = json.load(open(f"{stepdir}/manifest.json"))
    files = [read_st(f"{stepdir}/{f['name']}") for f in m["files"]]
    out = {}
    for name, t in m["tensors"].items():
        for p in t["pieces"]:
            out[(name, tuple(p["offsets"]), tuple(p["range"]))] = files[p["file"]][p["key"]]
    for loc in m["local"]:
        for b in loc["buffers"]:
            out[("local", loc["rank"], b["id"])] = files[loc["file"]][b["key"]]
    return out


def steps_of(d):
    return sorted(int(x[5:]) for x in os.listdir(d) if x.startswith("step-"))


# ------------------------------------------------------------------ resume, bit for bit

full, ckdirs = {}, {}
for model, plan, n, every in [("mlp", "dp2", 6, 2), ("gpt", "zero1_dp4", 4, 2), ("gpt", "pp2", 4, 2),
                              ("gpt", "bf16_zero2_dp4", 4, 2), ("gpt", "dp4_topk_zero1", 4, 2),
                              ("gpt", "dp4_local_sgd", 4, 2)]:
    prog = build(model, plan)
    tag = f"{work}/{model}_{plan}"
    # uninterrupted, with checkpoints too (their final one is compared below)
    rc, err = run(prog, "--data", data, "--steps", str(n), "--log", f"{tag}_full.jsonl", "--save", f"{tag}_full.st",
                  "--save-every", str(every), f"{tag}_fullck")
    check(f"{model} {plan} uninterrupted run", rc == 0, err[-300:] if rc else "")
    full[(model, plan)] = losses(f"{tag}_full.jsonl")
    # resumed from that run's first checkpoint (as if it had stopped there; a run that ends after
    # `every` steps is another run under local SGD, whose replicas average after the last step)
    os.makedirs(f"{tag}_ck")
    shutil.copytree(f"{tag}_fullck/step-{every:08d}", f"{tag}_ck/step-{every:08d}")
    rc2, err2 = run(prog, "--data", data, "--steps", str(n), "--resume", f"{tag}_ck", "--log", f"{tag}_res.jsonl",
                    "--save", f"{tag}_res.st", "--save-every", str(every), f"{tag}_ck")
    ok = rc2 == 0 and "resumed at step %d" % every in err2
    ckdirs[(model, plan)] = f"{tag}_ck"
    if not check(f"{model} {plan} resumed", ok, err2[-400:] if not ok else ""):
        continue
    a, b = full[(model, plan)], losses(f"{tag}_res.jsonl")
    a = {k: v for k, v in a.items() if k >= every}
    check(f"{model} {plan} resume losses", a == b, f"steps {sorted(b)} equal bit for bit" if a == b else f"{a} vs {b}")
    same = open(f"{tag}_full.st", "rb").read() == open(f"{tag}_res.st", "rb").read()
    check(f"{model} {plan} resume weights", same, "--save files byte for byte equal" if same else "differ")
    x, y = ckpt_tensors(f"{tag}_fullck/step-{n:08d}"), ckpt_tensors(f"{tag}_ck/step-{n:08d}")
    kinds = sorted({k[0].split(".")[0] for k in x if k[0] in ("master", "optim", "local") or "." in k[0]})
    check(f"{model} {plan} resume state", x == y and len(x) > 0,
          f"{len(x)} pieces ({', '.join(k for k in ('master', 'optim', 'local') if any(str(t[0]).startswith(k) for t in x))} "
          f"included) byte for byte equal" if x == y else f"{len(x)} vs {len(y)} pieces, "
          f"{sum(1 for k in x if x.get(k) != y.get(k))} differ")

# ------------------------------------------------------------------ kill -9 inside a save

prog = build("mlp", "dp2")
ck = f"{work}/kill_ck"
p = subprocess.Popen(["mpirun", "-np", "2", prog, "--data", data, "--steps", "6", "--save-every", "2", ck],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=dict(env, PLANRT_TEST_PAUSE="checkpoint:4"),
                     start_new_session=True)
deadline, paused = time.time() + 60, False
while time.time() < deadline and not paused:
    line = p.stderr.readline()
    if not line:
        break
    paused = "PLANRT_TEST_PAUSE: paused" in line
harness.kill_job(p)  # the whole job dies at once, as when a node fails
p.wait()
check("kill -9 in a checkpoint: the job was killed inside the save of step 4", paused)
left = os.listdir(f"{ck}/step-00000004") if os.path.isdir(f"{ck}/step-00000004") else []
check("kill -9: step 2 complete, step 4 without a manifest", os.path.exists(f"{ck}/step-00000002/manifest.json") and
      "manifest.json" not in left and any(f.startswith("rank-") for f in left), f"step-4 holds {left}")
rc, err = run(prog, "--data", data, "--steps", "6", "--resume", ck, "--log", f"{work}/kill.jsonl", "--save",
              f"{work}/kill.st", "--save-every", "2", ck)
check("kill -9: --resume leaves out the unfinished save and uses step 2",
      rc == 0 and "resumed at step 2" in err and re.search(r"removed '.*step-00000004', a checkpoint whose save did not finish", err),
      err[-300:])
base = full[("mlp", "dp2")]
got = losses(f"{work}/kill.jsonl")
check("kill -9: the resumed run equals the uninterrupted one", all(got.get(s) == base[s] for s in range(2, 6)) and
      open(f"{work}/kill.st", "rb").read() == open(f"{work}/mlp_dp2_full.st", "rb").read(),
      "losses of steps 2-5 and the final weights bit for bit")
files4 = os.listdir(f"{ck}/step-00000004")
m4 = json.load(open(f"{ck}/step-00000004/manifest.json"))
check("kill -9: the killed save's files were removed", sorted(files4) == sorted(["manifest.json"] + [f["name"] for f in m4["files"]]),
      f"step-4 holds {sorted(files4)}")
# --save killed between its data and its rename
save = f"{work}/w.safetensors"
shutil.copy(f"{work}/kill.st", save)
good = open(save, "rb").read()
p = subprocess.Popen(["mpirun", "-np", "2", prog, "--data", data, "--steps", "1", "--save", save],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=dict(env, PLANRT_TEST_PAUSE="save"),
                     start_new_session=True)
while True:
    line = p.stderr.readline()
    if not line or "PLANRT_TEST_PAUSE: paused" in line:
        break
harness.kill_job(p)
p.wait()
tmps = [f for f in os.listdir(work) if f.startswith("w.safetensors.tmp.")]
check("kill -9 in --save: the target is intact and a temporary file was left", open(save, "rb").read() == good and tmps,
      f"left {tmps}")
rc, err = run(prog, "--data", data, "--steps", "1", "--save", save)
tmps = [f for f in os.listdir(work) if f.startswith("w.safetensors.tmp.")]
check("the next run removes the stale temporary file", rc == 0 and not tmps and "removed" in err,
      f"rc {rc}, left {tmps}: {err[:300]}")

# ------------------------------------------------------------------ resharding

for (model, a, b) in [("mlp", "dp2", "tp2"), ("mlp", "dp2", "zero3_dp4"), ("gpt", "pp2", "dp2_tp2"),
                      ("gpt", "zero1_dp4", "pp2"), ("gpt", "bf16_zero2_dp4", "bf16")]:
    progb = build(model, b)
    n = max(full[(model, a)]) + 1
    log = f"{work}/reshard_{model}_{a}_{b}.jsonl"
    rc, err = run(progb, "--data", data, "--steps", str(n), "--resume", f"{ckdirs[(model, a)]}/step-00000002",
                  "--log", log)
    ref, got = full[(model, a)], losses(log) if rc == 0 else {}
    worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in got), default=1.0) if got else 1.0
    check(f"reshard {model} {a} -> {b}", rc == 0 and "resharding" in err and sorted(got) == list(range(2, n)) and worst <= 1e-5,
          f"steps 2-{n - 1}, worst relative loss difference {worst:.2e}" if rc == 0 else err[-300:])

# ------------------------------------------------------------------ resharding offline
# planc reshard (and PROG --reshard) rewrite A's checkpoint as B lays it out: one file per rank of
# B holding exactly that rank's pieces, no rank-local state; B resumed from it equals B resumed from
# A's checkpoint bit for bit (losses and final weights), so it equals A continuing within 1e-5.

def reshard_offline(model, a, b, how, lossy=False):
    progb = build(model, b)
    n = max(full[(model, a)]) + 1
    src, out = f"{ckdirs[(model, a)]}/step-00000002", f"{work}/offline_{model}_{a}_{b}"
    if how == "planc":
        r = subprocess.run([planc, "reshard", f"{root}/examples/{model}.plan", "--plan", b,
                            *harness.model_args(size_of(model, b)), src, "-o", out],
                           capture_output=True, text=True, env=env, timeout=300)
    else:  # the built program itself, one process, no mpirun
        r = subprocess.run([progb, "--reshard", src, out], capture_output=True, text=True, env=env, timeout=300)
    tag = f"reshard offline ({how}) {model} {a} -> {b}"
    if not check(f"{tag}: written", r.returncode == 0 and os.path.exists(f"{out}/step-00000002/manifest.json") and
                 "resharded" in r.stderr, r.stderr[-300:]):
        return
    m = json.load(open(f"{out}/step-00000002/manifest.json"))
    world = WORLD[progb]
    # every element of every tensor in exactly one piece (replicas write once, ZeRO padding clipped)
    own = all(sum(p["range"][1] - p["range"][0] for p in t["pieces"]) == prod(t["shape"]) and
              len({(tuple(p["offsets"]), tuple(p["range"])) for p in t["pieces"]}) == len(t["pieces"])
              for t in m["tensors"].values())
    layout_ok = (m["plan"] == b and m["world"] == world and m["resharded_from"]["plan"] == a and not m["local"] and
                 len(m["files"]) <= world and len({f["rank"] for f in m["files"]}) == len(m["files"]) and own and
                 m["step"] == 2)
    check(f"{tag}: one file per rank of {b}, the run's position kept", layout_ok,
          f"{len(m['files'])} files for {world} ranks, step {m['step']}, from {m['resharded_from']['plan']}")
    runs = {}
    for name, path in (("offline", out), ("direct", src)):
        log, st = f"{out}_{name}.jsonl", f"{out}_{name}.st"
        rc, err = run(progb, "--data", data, "--steps", str(n), "--resume", path, "--log", log, "--save", st)
        runs[name] = (rc, losses(log) if rc == 0 else {}, open(st, "rb").read() if rc == 0 else b"", err)
    a_run, b_run = runs["offline"], runs["direct"]
    same = a_run[0] == 0 and a_run[1] == b_run[1] and a_run[2] == b_run[2] and sorted(a_run[1]) == list(range(2, n))
    check(f"{tag}: {b} resumed from it equals {b} resumed from {a}'s checkpoint", same,
          f"steps 2-{n - 1} and the final weights bit for bit" if same else a_run[3][-300:])
    if lossy:  # A's top-k compression is part of its training: B (uncompressed) continues otherwise
        return
    ref = full[(model, a)]
    worst = max((abs(a_run[1][s] - ref[s]) / abs(ref[s]) for s in a_run[1]), default=1.0) if a_run[1] else 1.0
    check(f"{tag}: equals {a} continuing", worst <= 1e-5, f"worst relative loss difference {worst:.2e}")


reshard_offline("mlp", "dp2", "tp2", "program")
reshard_offline("mlp", "dp2", "zero3_dp4", "planc")
reshard_offline("gpt", "pp2", "dp2_tp2", "planc")
reshard_offline("gpt", "zero1_dp4", "pp2", "program")
reshard_offline("gpt", "bf16_zero2_dp4", "bf16", "planc")
reshard_offline("gpt", "dp4_topk_zero1", "dp2_tp2", "planc", lossy=True)
src = f"{ckdirs[('mlp', 'dp2')]}/step-00000002"
for name, args, pattern in [
        ("another model", [planc, "reshard", f"{root}/examples/gpt.plan", "--plan", "dp2", src, "-o", f"{work}/rx"],
         "is a checkpoint of model 'mlp'"),
        ("into the checkpoint's own directory", [planc, "reshard", f"{root}/examples/mlp.plan", "--plan", "tp2", src, "-o",
                                                 ckdirs[("mlp", "dp2")]], "is where the checkpoint is read from"),
        ("over a resharded checkpoint", [planc, "reshard", f"{root}/examples/mlp.plan", "--plan", "tp2", src, "-o",
                                         f"{work}/offline_mlp_dp2_tp2"], "already holds a checkpoint of step 2"),
        ("local SGD's checkpoint", [planc, "reshard", f"{root}/examples/gpt.plan", "--plan", "dp2",
                                    *harness.model_args(size_of("gpt", "dp4_local_sgd")), f"{ckdirs[('gpt', 'dp4_local_sgd')]}/step-00000002",
                                    "-o", f"{work}/rx"],
         "holds each replica's own state"),
        ("no checkpoint", [planc, "reshard", f"{root}/examples/mlp.plan", "--plan", "tp2", f"{work}/none", "-o",
                           f"{work}/rx"], "No such file or directory"),
        ("with training options", [build("mlp", "tp2"), "--reshard", src, f"{work}/rx", "--steps", "3"],
         "takes no other option")]:
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    check(f"reshard refused: {name}", r.returncode != 0 and pattern in r.stderr,
          r.stderr.strip().splitlines()[0][:160] if r.stderr.strip() else "")

# ------------------------------------------------------------------ --keep

rc, err = run(prog, "--data", data, "--steps", "5", "--save-every", "1", f"{work}/keep", "--keep", "2")
check("--keep 2 leaves the newest two", rc == 0 and steps_of(f"{work}/keep") == [4, 5], str(steps_of(f"{work}/keep")))

# one job script for the first run and every restart: --resume DIR --save-every N DIR
fresh = f"{work}/fresh"
rc, err = run(prog, "--data", data, "--steps", "4", "--resume", fresh, "--save-every", "2", fresh, "--log",
              f"{work}/fresh.jsonl")
check("--resume DIR --save-every N DIR starts a first run", rc == 0 and "holds no checkpoint yet; starting at step 0"
      in err and steps_of(fresh) == [2, 4], err[-300:] if rc else str(steps_of(fresh)))
rc, err = run(prog, "--data", data, "--steps", "6", "--resume", fresh, "--save-every", "2", fresh, "--log",
              f"{work}/fresh.jsonl")
got = losses(f"{work}/fresh.jsonl")
check("... and the same command line continues it", rc == 0 and "resumed at step 4" in err and
      all(got.get(s) == base[s] for s in range(6)), err[-300:] if rc else f"{got} vs {base}")
os.makedirs(f"{work}/not_every")
rc, err = run(prog, "--data", data, "--steps", "2", "--resume", f"{work}/not_every")
check("--resume of a directory without checkpoints (not the --save-every one) is refused",
      rc != 0 and "holds no complete checkpoint" in err, err.strip().splitlines()[0][:160] if err.strip() else "")

runner.finish()
