#!/usr/bin/env python3
"""bench/gpu/count_step.py: what one training step of a CUDA program launches and moves, read off
the program planc emits (no GPU needed): the device calls per step (fused loops, planrt_cu_*
kernels, cuBLAS GEMMs; stream waits and event records not counted), the GEMMs, and the casts with
the elements and bytes they move, grouped by the kernel each cast serves (a widening before it, a
narrowing after it). The predictions in bench/gpu/NOTES.md come from it.

usage: count_step.py PLANC PLAN_FILE PLAN [PLAN_FILE PLAN ...]
A step is step_begin, then forward and backward once per micro-batch (each model chunk's), then
step; the micro-batch count is planc explain's. A run of layers printed as a loop (`for (int l =
A; l < B; l++) {` ... `}`, docs/ir.md "Layers as loops") counts its body once a layer; a loop whose
bounds are not numbers (a function several stages share) is an error, not a guess.
usage: count_step.py [--no-layer-loops] PLANC PLAN_FILE PLAN [PLAN_FILE PLAN ...]
  --no-layer-loops  count the program printed with every layer in full (what the loops must equal:
                    tests/cuda/check_count_step.py)
"""
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py: c_functions)

# calls that order streams or touch the host, not device work
NOT_LAUNCHES = {"planrt_cu_record", "planrt_cu_wait", "planrt_cu_record_entry", "planrt_cu_wait_entry",
                "planrt_cu_synchronize", "planrt_cu_host_state", "planrt_cu_event_t"}
CALL = re.compile(r"^\s*(planrt_cu_[a-z0-9_]+|loop[0-9]+_launch)\(")
CAST = re.compile(r"planrt_cu_cast\(([^;]*)\);")
LOOP = re.compile(r"^(\s*)for \(int l = (-?[0-9]+); l < (-?[0-9]+); l\+\+\) \{$")
PHASE = re.compile(r"^static void (step_begin|forward_c[0-9]+|backward_c[0-9]+|step)\(planrt_ctx_t \*ctx\)$")
DTYPE_BYTES = {"planrt_f32": 4, "planrt_bf16": 2, "planrt_f16": 2, "planrt_f64": 8}


def phases(prog):
    """{phase name: [lines of its body]}"""
    return harness.c_functions(prog, PHASE)


def count(lines, times, launches, gemms, casts):
    pending = []  # widenings waiting for the kernel they serve
    last = "start"
    loops = []  # (indentation, the enclosing count) of the layer loops the line is in
    outer = times
    for line in lines:
        loop = LOOP.match(line)
        if loop:
            loops.append((loop.group(1), times))
            times *= int(loop.group(3)) - int(loop.group(2))
            continue
        if loops and line == loops[-1][0] + "}":
            times = loops.pop()[1]
            continue
        if re.match(r"^\s*for \(", line):
            sys.exit(f"count_step.py: a loop it cannot count: {line.strip()}")
        m = CALL.match(line)
        if not m or m.group(1) in NOT_LAUNCHES:
            continue
        fn = re.sub(r"loop[0-9]+_launch", "fused loop", m.group(1))
        launches[fn] += times
        c = CAST.search(line)
        if c:
            a = [x.strip() for x in c.group(1).split(",")]
            n = int(a[4]) * times
            moved = n * (DTYPE_BYTES[a[1]] + DTYPE_BYTES[a[3]])
            if "master weights" in line:
                casts[("master weights to parameters", "")] += [n, moved, times]
            elif a[1] in ("planrt_bf16", "planrt_f16") and a[3] == "planrt_f32":
                pending.append((n, moved))
            else:
                casts[("narrow after", last)] += [n, moved, times]
            continue
        last = fn.replace("planrt_cu_", "")
        if "matmul" in fn:
            gemms[last] += times
        for n, moved in pending:
            casts[("widen for", last)] += [n, moved, times]
        pending = []
    if loops or times != outer:
        sys.exit(f"count_step.py: a layer loop without its closing brace ({len(loops)} open)")


class Acc(list):
    def __iadd__(self, other):
        for i, x in enumerate(other):
            self[i] += x
        return self


def report(planc, plan_file, plan, emit_flags=()):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([planc, "emit", "cuda", plan_file, "--plan", plan, "-o", d, *emit_flags], check=True,
                       stdout=subprocess.DEVNULL)
        prog = open(os.path.join(d, "prog.c")).read()
    ex = json.loads(subprocess.run([planc, "explain", plan_file, "--plan", plan, "--json"], check=True,
                                   capture_output=True, text=True).stdout)
    micro = ex["micro_batches"]
    launches, gemms = collections.Counter(), collections.Counter()
    casts = collections.defaultdict(lambda: Acc([0, 0, 0]))
    for name, lines in phases(prog).items():
        count(lines, micro if name.startswith(("forward", "backward")) else 1, launches, gemms, casts)
    print(f"# {plan_file} {plan}: {micro} micro-batch(es), model FLOPs per step {ex['model_flops_per_step']:.4g},"
          f" program arena {ex['roles'][0]['program']['arena']} B, state {ex['roles'][0]['program']['state']} B")
    print(f"{'device calls per step':>40s} {sum(launches.values()):>10d}")
    for fn, n in launches.most_common(12):
        print(f"{fn:>40s} {n:>10d}")
    print(f"{'GEMM calls per step':>40s} {sum(gemms.values()):>10d}")
    total_n = sum(v[0] for v in casts.values())
    total_b = sum(v[1] for v in casts.values())
    print(f"{'casts per step':>40s} {sum(v[2] for v in casts.values()):>10d} calls {total_n / 1e9:>9.3f} G elements"
          f" {total_b / 1e9:>9.2f} GB moved ({total_b / 4.3e12 * 1e3:.1f} ms at 4.3 TB/s)")
    for (what, fn), (n, moved, calls) in sorted(casts.items(), key=lambda kv: -kv[1][1]):
        print(f"{what + ' ' + fn:>40s} {calls:>10d} calls {n / 1e9:>9.3f} G elements {moved / 1e9:>9.2f} GB")


def main():
    args = sys.argv[1:]
    flags = [a for a in args if a == "--no-layer-loops"]
    args = [a for a in args if a != "--no-layer-loops"]
    if len(args) < 3 or len(args) % 2 == 0:
        sys.exit(__doc__)
    for i in range(1, len(args), 2):
        report(args[0], args[i], args[i + 1], flags)


if __name__ == "__main__":
    main()
