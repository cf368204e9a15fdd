#!/usr/bin/env python3
"""`planc explain --svg FILE`: the picture is well-formed XML (xml.etree) and holds what it
claims for each plan: one schedule row and one memory chart per rank role, every action of every
stage's schedule table as a forward or backward box (micro-batches x chunks of each per stage),
an update box per row, the idle time, one arrow per pipeline transfer, the stacked memory layers
with the allocation line, time axes and legends. The figures in it are explain's: the title
repeats the estimated step time the text report prints, also on a device whose ranks share
cores, where plans of fewer ranks than its calibration compute faster.

usage: tests/explain/check_svg.py PLANC ROOT"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

NS = "{http://www.w3.org/2000/svg}"

# plan -> (rows, stages, micro-batches, chunks); gpt.plan's plans
CASES = {
    "single": (1, 1, 1, 1),
    "dp2": (1, 1, 1, 1),
    "pp2_1f1b": (2, 2, 4, 1),
    "pp4": (4, 4, 8, 1),
    "pp2_interleaved": (2, 2, 4, 2),
    "gpt_3d": (2, 2, 4, 1),
    "dp4_async": (2, 1, 1, 1),
}


def classes(el):
    return set(el.get("class", "").split())


def check(planc, root, plan, want, tmp, fails, device=None):
    rows, stages, micro, chunks = want
    svg = os.path.join(tmp, plan + ("_shared" if device else "") + ".svg")
    r = subprocess.run([planc, "explain", "examples/gpt.plan", "--plan", plan, "--svg", svg] +
                       (["--device=" + device] if device else []), cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        fails.append("%s: explain --svg exit %d: %s" % (plan, r.returncode, r.stderr.strip()))
        return
    try:
        doc = ET.parse(svg).getroot()
    except ET.ParseError as e:
        fails.append("%s: not well-formed XML: %s" % (plan, e))
        return
    if doc.tag != NS + "svg":
        fails.append("%s: root element is %s, not svg" % (plan, doc.tag))
        return
    groups = {}
    for g in doc.iter(NS + "g"):
        for c in classes(g):
            groups.setdefault(c, []).append(g)
    lanes, charts = groups.get("lane", []), groups.get("memory", [])
    if len(lanes) != rows or len(charts) != rows:
        fails.append("%s: %d schedule rows and %d memory charts, want %d of each" % (plan, len(lanes), len(charts), rows))
    per_stage = micro * chunks
    for lane in lanes:
        rects = [classes(x) for x in lane.iter(NS + "rect")]
        fwd = sum("forward" in c for c in rects)
        bwd = sum("backward" in c for c in rects)
        upd = sum("update" in c for c in rects)
        idle = sum("idle" in c for c in rects)
        if (fwd, bwd, upd, idle) != (per_stage, per_stage, 1, 1):
            fails.append("%s: stage %s row has %d forward, %d backward, %d update, %d idle boxes; want %d, %d, 1, 1" %
                         (plan, lane.get("data-stage"), fwd, bwd, upd, idle, per_stage, per_stage))
        for x in lane.iter(NS + "rect"):
            if float(x.get("width")) < 0 or float(x.get("x")) < 0:
                fails.append("%s: a box with negative position or width" % plan)
                break
    # a transfer per action that crosses to another stage: every virtual stage but the last
    # sends each micro-batch's activations, every one but the first its gradients
    sends = sum(1 for g in groups.get("sends", []) for _ in g.iter(NS + "line"))
    want_sends = 2 * micro * (stages * chunks - 1) if stages > 1 else 0
    if sends != want_sends:
        fails.append("%s: %d transfer arrows, want %d" % (plan, sends, want_sends))
    for chart in charts:
        layers = {c for p in chart.iter(NS + "path") for c in classes(p)}
        if not {"state", "transient"} <= layers:
            fails.append("%s: memory chart of stage %s has layers %s" % (plan, chart.get("data-stage"), sorted(layers)))
        if stages > 1 and "slots" not in layers:
            fails.append("%s: a pipeline stage's chart shows no activation slots" % plan)
        if not any("allocated" in classes(x) for x in chart.iter(NS + "line")):
            fails.append("%s: memory chart without the allocation line" % plan)
    if len(groups.get("axis", [])) != 2 or len(groups.get("legend", [])) != 2:
        fails.append("%s: %d time axes and %d legends, want 2 and 2" % (plan, len(groups.get("axis", [])),
                                                                       len(groups.get("legend", []))))
    texts = " ".join("".join(t.itertext()) for t in doc.iter(NS + "text"))
    if "plan %s for gpt" % plan not in texts:
        fails.append("%s: no title naming the plan" % plan)
    # the step time in the title is explain's estimate
    est = re.search(r"estimated step time: ([0-9.]+) (us|ms|s) ", r.stdout)
    title = re.search(r"estimated ([0-9.e+]+) (us|ms|s) ", texts)
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    if not est or not title:
        fails.append("%s: no estimated step time in the report or the picture" % plan)
    else:
        a, b = float(est.group(1)) * scale[est.group(2)], float(title.group(1)) * scale[title.group(2)]
        if abs(a - b) > 1e-3 * a:
            fails.append("%s: the picture's step (%g s) is not explain's (%g s)" % (plan, b, a))


def main():
    planc, root = os.path.abspath(sys.argv[1]), sys.argv[2]
    tmp, tally = harness.workdir("svg"), harness.Tally("explain --svg")
    for plan, want in CASES.items():
        fails = []
        check(planc, root, plan, want, tmp, fails)
        rows, stages, micro, chunks = want
        tally.check(f"explain --svg of gpt {plan}", not fails, "; ".join(fails) if fails else
                    f"{rows} schedule row(s) and memory chart(s), {micro * chunks} forward and backward boxes per "
                    "stage, the transfers, axes, legends and explain's step time")
    # a device whose 4 ranks share 2 cores (as planc calibrate writes on a 2-core machine): plans
    # of fewer ranks compute faster than its rates throughout (explain_step_costs), and the picture
    # simulates the same costs as the estimate (it drew single's step at twice explain's time)
    shared = os.path.join(tmp, "shared.device")
    with open(shared, "w") as f:
        f.write("base = cpu\nnode.ranks = 4\nnode.cores = 2\n")
    for plan in ("single", "dp2", "pp2_1f1b"):
        fails = []
        check(planc, root, plan, CASES[plan], tmp, fails, device=shared)
        tally.check(f"explain --svg of gpt {plan}, 4 ranks on 2 cores", not fails,
                    "; ".join(fails) if fails else "explain's step time, the same boxes")
    tally.finish()


main()
