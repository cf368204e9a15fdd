#!/usr/bin/env python3
"""planc search (issue 20, docs/search.md).
  - pruning drops no plan that belongs in the top k: on small spaces (the small GPT on 4 and 8
    ranks, Llama on 4, the MLP on 8; k = 1, 3 or 5) the pruned search prints exactly the plans and
    estimates that compiling every candidate (--exhaustive, brute force) ranks first, and at least
    one of those searches prunes something (so the comparison is not vacuous);
  - soundness: every candidate --exhaustive compiles checks that the time bound is at most its
    estimate, the memory bound at most its peak, and that no candidate whose tensor-only plan the
    checks refuse compiles ("bounds violated 0"); a medium space (the small GPT on 16 ranks, 1040
    candidates) gives the same top 3 pruned and exhaustive, and so does the small GPT on 12 ranks,
    whose 3-stage pipelines hold the 4 layers unevenly (2-1-1: the bounds per stage);
  - the axes beyond data x pipe x tensor, each against brute force: expert parallelism on the
    small MoE GPT (4 ranks: an expert = 4 plan is best), context parallelism (--ctx) on a GPT with a
    4096-token context (tests/search/long_context.plan: nothing fits in 16 MiB per rank without a
    ctx axis, a ctx plan is best with it), optimizer offload (--offload: an offload plan ranks in
    the top 3 of the small GPT on 4 ranks);
  - ranks sharing cores (a device file with node.cores = 2 under node.ranks = 4, and matmul_bw,
    the GEMMs' operand bytes, as calibrate writes them here): pruned = brute
    force on 2, 4 and 8 ranks, with a pipeline in the top 3 on 4 and 8 (its stages run faster while
    others wait; 2 ranks compute twice as fast as the calibration's 4), and for the MLP at batch 2
    on 2 ranks, whose update weighs as much as its compute (the bounds divide it as the estimate
    does: without that 6 of its bounds exceed their estimates);
  - the memory bound: at 8 MiB per rank it skips candidates and the answer is brute force's;
  - memory: with --memory just under the unconstrained best's peak that plan is not printed, every
    printed plan's peak is within the limit, and a limit nothing fits is an error (exit 1);
  - the printed plan is plan text a user pastes: --write appends it, explain of the written plan
    gives the estimate and peak search printed, and a name the file already has is refused;
  - `recompute selective` of the small GPT is not enumerated: its fused attention leaves no op but
    views in the @recompute region, and emit c of the two plans differs only in the name; with
    `attention unfused` in the base plan it is enumerated again;
  - usage errors exit 2.
usage: tests/search/run_search.py PLANC ROOT"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402


VIOLATIONS = []


def search(planc, path, model, world, batch, *extra, device="cpu"):
    r = subprocess.run([planc, "search", path, "--model", model, "--world", str(world), "--batch", str(batch),
                        "--device=" + device] + list(extra), capture_output=True, text=True)
    plans = re.findall(r"^# (\d+): estimated step ([0-9.e+-]+) s .*?peak ([0-9.]+ \w+) per rank.*?\n(plan .*?^})",
                       r.stdout, re.M | re.S)
    counts = re.search(r"# (\d+) candidates: (\d+) compiled .*?, (\d+) pruned", r.stdout)
    violated = re.search(r"bounds violated (\d+)", r.stdout)
    if violated is None or violated.group(1) != "0":
        VIOLATIONS.append("%s %s on %d: %s" % (os.path.basename(path), model, world,
                                               violated.group(1) if violated else r.stdout.strip()[-200:]))
    return r, [(float(step), peak, re.sub(r"^plan search_\d+", "plan", text)) for _, step, peak, text in plans], counts


def selective_same(planc, gpt, tmp, tally):
    """`recompute selective` of the small GPT (fused attention takes its @recompute region) is not
    enumerated: it compiles to recompute none's program, which emit c shows (the two differ only in
    the plan's name); with `attention unfused` in the base plan the region is back and it is."""
    r, plans, _ = search(planc, gpt, "gpt", 4, 16, "--top", "4")
    note = "recompute selective: model gpt has no op but views" in r.stdout
    tally.check("selective = none for fused attention: not enumerated, not in the top 4",
                r.returncode == 0 and note and not any("recompute selective" in t for _, _, t in plans),
                "%d plans" % len(plans))
    both = os.path.join(tmp, "selective.plan")
    text = plans[0][2] if plans else ""
    with open(both, "w") as f:
        f.write(open(gpt).read() + "\n" + text.replace("plan ", "plan as_none ", 1) + "\n")
        f.write(re.sub(r"\n}$", "\n  recompute selective\n}", text.replace("plan ", "plan as_selective ", 1)) + "\n")
    progs = []
    for name in ("as_none", "as_selective"):
        out = os.path.join(tmp, name)
        e = subprocess.run([planc, "emit", "c", both, "--plan", name, "-o", out], capture_output=True, text=True)
        progs.append(open(os.path.join(out, "prog.c")).read().replace(name, "P") if e.returncode == 0 else e.stderr)
    tally.check("selective's program is none's (emit c differs only in the plan's name)",
                plans and progs[0] == progs[1] and "recompute selective" in open(both).read(),
                "%d and %d bytes" % (len(progs[0]), len(progs[1])))
    unfused = os.path.join(tmp, "unfused.plan")
    with open(unfused, "w") as f:
        f.write(open(gpt).read() + "\nplan unfused_base for gpt {\n  batch B = 16\n  attention unfused\n}\n")
    r, _, c = search(planc, unfused, "gpt", 4, 16, "--top", "1", "--plan", "unfused_base")
    tally.check("with attention unfused, selective is enumerated", r.returncode == 0 and c and
                "recompute selective:" not in r.stdout and int(c.group(1)) == 348,
                c.group(0) if c else r.stderr.strip()[-200:])


def main():
    planc, root = sys.argv[1], sys.argv[2]
    tally = harness.Tally("search")
    tmp = harness.workdir("search")
    ex = lambda name: os.path.join(root, "examples", name)  # noqa: E731
    pruned_any = 0
    for path, model, world, batch, tops in ((ex("gpt.plan"), "gpt", 4, 16, (1, 3)), (ex("gpt.plan"), "gpt", 8, 16, (1,)),
                                            (ex("llama.plan"), "llama", 4, 8, (1, 5)), (ex("mlp.plan"), "mlp", 8, 32, (1,)),
                                            (ex("gpt.plan"), "gpt", 16, 32, (3,)),
                                            # pipe 3 splits the 4 layers 2-1-1: the bounds per stage, uneven
                                            (ex("gpt.plan"), "gpt", 12, 24, (3,))):
        for top in tops:
            r1, pruned, c1 = search(planc, path, model, world, batch, "--top", str(top))
            r2, brute, c2 = search(planc, path, model, world, batch, "--top", str(top), "--exhaustive")
            name = "%s %s on %d, top %d" % (os.path.basename(path), model, world, top)
            tally.check(name + ": pruned = brute force", r1.returncode == 0 and r2.returncode == 0 and len(brute) == top
                        and pruned == brute, "%s of %s candidates compiled, %s pruned; best %s" % (
                            c1.group(2) if c1 else "?", c1.group(1) if c1 else "?", c1.group(3) if c1 else "?",
                            pruned[0][0] if pruned else r1.stderr.strip()))
            pruned_any += int(c1.group(3)) if c1 else 0
    # the memory bound: at 8 MiB per rank some candidates are not compiled, the answer is the same
    r1, pruned, c1 = search(planc, ex("gpt.plan"), "gpt", 4, 16, "--top", "3", "--memory", "8MiB")
    r2, brute, _ = search(planc, ex("gpt.plan"), "gpt", 4, 16, "--top", "3", "--memory", "8MiB", "--exhaustive")
    skipped = re.search(r"(\d+) by the memory bound", r1.stdout)
    tally.check("8 MiB per rank: pruned by memory = brute force", pruned == brute and len(brute) == 3 and skipped
                and int(skipped.group(1)) > 0, "%s skipped by the memory bound" % (skipped.group(1) if skipped else "?"))
    # (since fused attention lowered the small models' compute estimates, their time bound prunes
    # nothing at these sizes; the memory bound's skips above keep the comparison from being vacuous)
    pruned_any += int(skipped.group(1)) if skipped else 0
    tally.check("the bounds prune some candidates", pruned_any > 0, "%d pruned in all" % pruned_any)
    # expert parallelism, context parallelism, offload: pruned = brute force, and each is chosen
    long = os.path.join(root, "tests", "search", "long_context.plan")
    for path, model, world, batch, extra, want in (
            (ex("moe.plan"), "moe_gpt", 4, 16, [], "use nn.expert_parallel(expert)"),
            (long, "longgpt", 4, 1, ["--ctx"], "use nn.context_parallel(ctx)"),
            (long, "longgpt", 4, 1, ["--ctx", "--memory", "16MiB"], "use nn.context_parallel(ctx)"),
            (ex("gpt.plan"), "gpt", 4, 16, ["--offload"], "offload optimizer -> host")):
        r1, pruned, c1 = search(planc, path, model, world, batch, "--top", "3", *extra)
        r2, brute, _ = search(planc, path, model, world, batch, "--top", "3", "--exhaustive", *extra)
        name = "%s %s on %d %s" % (os.path.basename(path), model, world, " ".join(extra))
        tally.check(name + ": pruned = brute force, and it uses '%s'" % want,
                    r1.returncode == 0 and pruned == brute and len(brute) == 3 and any(want in t for _, _, t in brute),
                    "best %s: %s" % (brute[0][0] if brute else r2.stderr.strip()[-200:],
                                     brute[0][2].splitlines()[1].strip() if brute else "-"))
    # ranks sharing cores (node.cores under node.ranks, as calibrate writes on this machine): a
    # pipeline's stages run faster while others wait, and the bounds divide by the most they can;
    # the GEMMs' operand bytes priced too (matmul_bw, as calibrate fits it here), which make a
    # plan's compute grow with its micro-batches
    shared = os.path.join(tmp, "shared.device")
    with open(shared, "w") as f:
        f.write("base = cpu\nnode.ranks = 4\nnode.cores = 2\n" + "".join("matmul_bw.%s = 20G\n" % t for t in ("f32", "bf16", "f16")))
    for world, batch in ((2, 16), (4, 16), (8, 16)):  # 2: fewer ranks than the calibration's, faster
        r1, pruned, c1 = search(planc, ex("gpt.plan"), "gpt", world, batch, "--top", "3", device=shared)
        r2, brute, _ = search(planc, ex("gpt.plan"), "gpt", world, batch, "--top", "3", "--exhaustive", device=shared)
        tally.check("4 ranks on 2 cores, gpt on %d: pruned = brute force%s" % (
                        world, ", and a pipeline in the top 3" if world > 2 else ""),
                    r1.returncode == 0 and pruned == brute and len(brute) == 3 and
                    (world == 2 or any("pipeline pipe" in t for _, _, t in brute)),
                    "best %s: %s" % (brute[0][0] if brute else r2.stderr.strip()[-200:],
                                     brute[0][2].splitlines()[1].strip() if brute else "-"))
    # an update as dear as the compute (the MLP at batch 2: its Adam steps over every parameter
    # weigh as much as its forward and backward): on 2 ranks of that device the estimate divides the
    # update by the step's speed, and so must the bounds, or a bound exceeds the estimate it bounds
    # (6 of the MLP's candidates, which "bounds violated" below counts)
    r1, pruned, _ = search(planc, ex("mlp.plan"), "mlp", 2, 2, "--top", "3", device=shared)
    r2, brute, _ = search(planc, ex("mlp.plan"), "mlp", 2, 2, "--top", "3", "--exhaustive", device=shared)
    tally.check("4 ranks on 2 cores, the MLP at batch 2 on 2: pruned = brute force",
                r1.returncode == 0 and pruned == brute and len(brute) == 3,
                "best %s: %s" % (brute[0][0] if brute else r2.stderr.strip()[-200:],
                                 brute[0][2].splitlines()[1].strip() if brute else "-"))
    r, none, _ = search(planc, long, "longgpt", 4, 1, "--memory", "16MiB", "--exhaustive")
    tally.check("long context without --ctx: nothing fits in 16 MiB", r.returncode == 1 and not none,
                r.stderr.strip().splitlines()[0] if r.stderr.strip() else "exit %d" % r.returncode)
    tally.check("no bound exceeds what it bounds (every compiled candidate checked)", not VIOLATIONS,
                "; ".join(VIOLATIONS) or "bounds violated 0 in every search")

    gpt = ex("gpt.plan")
    _, free, _ = search(planc, gpt, "gpt", 4, 16, "--top", "1")
    peak = free[0][1]
    num, unit = peak.split()
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    limit = int(float(num) * scale * 0.95)
    r, tight, _ = search(planc, gpt, "gpt", 4, 16, "--top", "5", "--memory", str(limit))
    within = all(float(p.split()[0]) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[p.split()[1]] <= limit
                 for _, p, _ in tight)
    tally.check("--memory drops the best plan, keeps the rest within it",
                r.returncode == 0 and tight and tight[0][2] != free[0][2] and within,
                "limit %d B: best now %s at %s" % (limit, tight[0][0] if tight else "-", tight[0][1] if tight else "-"))
    r, none, _ = search(planc, gpt, "gpt", 4, 16, "--memory", "1MiB")
    tally.check("nothing fits: an error", r.returncode == 1 and not none and "no plan of model gpt" in r.stderr,
                r.stderr.strip())

    copy = os.path.join(tmp, "gpt.plan")
    shutil.copy(gpt, copy)
    r, best, _ = search(planc, copy, "gpt", 4, 16, "--top", "1", "--write", "searched")
    out = subprocess.run([planc, "explain", copy, "--plan", "searched", "--device=cpu", "--json"],
                         capture_output=True, text=True)
    m = re.search(r'"estimated_step_s": \{"step": ([0-9.e+-]+)', out.stdout)
    tally.check("--write: the plan explains to the estimate printed",
                r.returncode == 0 and m and abs(float(m.group(1)) - best[0][0]) <= 1e-6 * best[0][0],
                "%s vs %s" % (m.group(1) if m else out.stderr.strip(), best[0][0] if best else "-"))
    r, _, _ = search(planc, copy, "gpt", 4, 16, "--write", "searched")
    tally.check("--write refuses a name the file has", r.returncode == 1 and "already has a plan named" in r.stderr,
                r.stderr.strip())
    for args, want in ((["search", gpt, "--world", "4", "--batch", "16"], "needs FILE, --model"),
                       (["search", gpt, "--model", "gpt", "--world", "x", "--batch", "16"], "positive whole number"),
                       (["search", gpt, "--model", "gpt", "--world", "4", "--batch", "16", "--bogus"], "unknown option")):
        r = subprocess.run([planc] + args, capture_output=True, text=True)
        tally.check("usage: " + want, r.returncode == 2 and want in r.stderr, r.stderr.strip().splitlines()[0])
    selective_same(planc, gpt, tmp, tally)
    r = subprocess.run([planc, "search", gpt, "--model", "nope", "--world", "4", "--batch", "16"],
                       capture_output=True, text=True)
    tally.check("unknown model: no base plan", r.returncode == 1 and "no plan for model 'nope'" in r.stderr,
                r.stderr.strip().splitlines()[0])
    tally.finish()


if __name__ == "__main__":
    main()
