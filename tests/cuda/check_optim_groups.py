"""check_optim_groups.py: the CUDA target's multi-tensor optimizer (compiler/target/cuda/optim_groups.c)
against the C target's per-tensor calls, from the programs planc emits (no GPU needed).

For each plan, in each step phase:
  update   the CUDA program's planrt_cu_optimizer_multi entries and its remaining per-tensor
           planrt_cu_optimizer_step calls are, in order, the C program's planrt_optimizer_step
           calls (parameter, gradient, moments, elements, gradient dtype, the same scalars), and
           every C planrt_cast of master weights that follows an update is an entry's copy (its
           destination and dtype), or a remaining planrt_cu_cast;
  norm     the planrt_cu_sum_squares_multi entries and remaining planrt_cu_sum_squares_acc calls
           are the C program's planrt_sum_squares_acc calls in order, into the same accumulator;
  launches the plans where every update can run in one launch do: gpt `bf16` and `single`, whose
           step phase has one optimizer launch, one sum-of-squares launch and no cast left.
Both programs are compared unrolled (--no-layer-loops); the CUDA program with layer loops (its
default) must make the same launches with the same entries but for the names of the buffers
(a layer's state is its family's entry there).
usage: check_optim_groups.py PLANC ROOT"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

PLANC, ROOT = sys.argv[1], sys.argv[2]
tally = harness.Tally("cuda optimizer groups")
check = tally.check
PLANS = [("examples/gpt.plan", "single"), ("examples/gpt.plan", "bf16"), ("examples/gpt.plan", "fp16"),
         ("examples/gpt.plan", "bf16_zero2_dp4"), ("examples/gpt.plan", "pp2_1f1b"),
         ("examples/gpt.plan", "zero1_dp4"),
         ("examples/mlp.plan", "single")]
STEP = re.compile(r"^static void (\w*step)\(planrt_ctx_t \*ctx\)$")


def step_bodies(path):
    """{step function name: its lines}"""
    with open(path) as f:
        return harness.c_functions(f.read(), STEP)


def args_of(line, fn):
    m = re.search(re.escape(fn) + r"\((.*)\);", line)
    return [a.strip() for a in m.group(1).split(",")] if m else None


def c_calls(lines):
    """the C step's updates [(param, grad, gt, m, v, n, scalars, cast)], and norms [(acc, x, n, t, w)]"""
    updates, norms = [], []
    for line in lines:
        a = args_of(line, "planrt_optimizer_step")
        if a:
            updates.append([a[11], a[12], a[13], a[14], a[15], a[16], tuple(a[:11] + a[17:]), None])
        a = args_of(line, "planrt_cast")
        if a and "master weights" in line and updates and updates[-1][0] == a[0]:
            updates[-1][7] = (a[2], a[3])
        a = args_of(line, "planrt_sum_squares_acc")
        if a:
            norms.append(tuple(a))
    return [tuple(u) for u in updates], norms


def cuda_calls(lines):
    """the same from the CUDA step: multi-tensor entries and the per-tensor calls left, in order"""
    updates, norms, entries, launches = [], [], [], {"opt": 0, "sumsq": 0, "cast": 0}
    for line in lines:
        e = re.match(r"^\s*\{(.*)\},( /\*.*\*/)?$", line)
        if e:
            entries.append([a.strip() for a in e.group(1).split(",")])
            continue
        a = args_of(line, "planrt_cu_optimizer_multi")
        if a:
            launches["opt"] += 1
            scalars = tuple(a[3:-1])
            for x in entries:
                cast = None if x[4] == "NULL" else (x[4], x[7])
                updates.append((x[0], x[1], x[6], x[2], x[3], x[5], scalars, cast))
            entries = []
        a = args_of(line, "planrt_cu_sum_squares_multi")
        if a:
            launches["sumsq"] += 1
            norms += [(a[3], x[0], x[1], x[3], x[2]) for x in entries]
            entries = []
        a = args_of(line, "planrt_cu_optimizer_step")
        if a:
            launches["opt"] += 1
            updates.append((a[11], a[12], a[13], a[14], a[15], a[16], tuple(a[:11] + a[17:18]), None))
        a = args_of(line, "planrt_cu_cast")
        if a and "master weights" in line:
            launches["cast"] += 1
            if updates and updates[-1][0] == a[0]:
                updates[-1] = updates[-1][:7] + ((a[2], a[3]),)
        a = args_of(line, "planrt_cu_sum_squares_acc")
        if a:
            launches["sumsq"] += 1
            norms.append(tuple(a[:5]))
    return updates, norms, launches


def emit(target, plan_file, plan, out, unrolled=True):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # unrolled (--no-layer-loops): the C step's calls are one per tensor, and both name each layer's
    # state by its own name (with layer loops, by its family's entry)
    loops = ["--no-layer-loops"] if unrolled else []
    r = subprocess.run([PLANC, "emit", target, os.path.join(ROOT, plan_file), "--plan", plan, *loops, "-o", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"planc emit {target} {plan_file} {plan} failed: {r.stderr}")
    return step_bodies(os.path.join(out, "prog.c"))


def main():
    tmp = harness.workdir("optim-groups")
    for plan_file, plan in PLANS:
        name = f"{os.path.basename(plan_file)} {plan}"
        c = emit("c", plan_file, plan, os.path.join(tmp, plan, "c"))
        cu = emit("cuda", plan_file, plan, os.path.join(tmp, plan, "cu"))
        cu_loops = emit("cuda", plan_file, plan, os.path.join(tmp, plan, "cu_loops"), unrolled=False)
        check(f"{name}: the same step functions", sorted(c) == sorted(cu), f"{sorted(c)} against {sorted(cu)}")
        for fn in sorted(c):
            cu_updates, cu_norms, launches = cuda_calls(cu.get(fn, []))
            c_updates, c_norms = c_calls(c[fn])
            check(f"{name} {fn}: update entries are the C program's updates", cu_updates == c_updates,
                  f"{len(cu_updates)} against {len(c_updates)}")
            check(f"{name} {fn}: norm entries are the C program's sums of squares", cu_norms == c_norms,
                  f"{len(cu_norms)} against {len(c_norms)}")
            u, n, launches_loops = cuda_calls(cu_loops.get(fn, []))  # compared: gradient dtype, elements, scalars
            check(f"{name} {fn}: with layer loops, the same launches and entries",
                  launches_loops == launches and [x[2:3] + x[5:7] for x in u] == [x[2:3] + x[5:7] for x in cu_updates] and
                  len(n) == len(cu_norms), f"{launches_loops}, {len(u)} updates, {len(n)} norms")
            if (plan_file, plan) in [("examples/gpt.plan", "bf16"), ("examples/gpt.plan", "single")]:
                check(f"{name} {fn}: one optimizer and one norm launch, no cast, for {len(c_updates)} tensors",
                      launches == {"opt": 1, "sumsq": 1, "cast": 0} and len(c_updates) > 10, str(launches))
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
