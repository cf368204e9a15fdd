#!/usr/bin/env python3
"""planc calibrate (issue 20, docs/search.md): a device file measured on this machine.
  - `mpirun -np 2 planc calibrate --quick -o F` writes F (and nothing beside it), which explain
    reads: the estimate names the calibrated device and differs from the nominal cpu's;
  - the figures are measurements, not the base device's: every rate positive and within what a
    CPU core can do, node.ranks the launch's 2 ranks, the link's figures measured (the file says
    the link between nodes was not, on one machine); the tables: each GEMM shape's rate by its FLOPs
    (the best is matmul.*), the all-reduce's seconds by size over the 2 ranks (which price the
    collectives: ten times the seconds, a longer step), the GEMM rate by busy ranks where the 2
    ranks share cores (and only there); kernel.latency (a tiny kernel's time) measured, and
    node.bandwidth the all-reduce's bus bandwidth at its best size (recomputed from the table);
  - the attention rate is used: the same file with attention.* ten times lower lengthens the
    fused-attention GPT's estimate, and without attention.* the matmul rate prices attention;
  - one process without mpirun is a world of one: no link measured, the base's links kept;
  - errors before any measuring: -o a directory (exit 1, nothing written), an unknown --device,
    no -o, -o twice (exit 2).
usage: tests/explain/check_calibrate.py PLANC ROOT"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402
from check_devices import step  # noqa: E402  (explain's estimated step on a device)


TABLES = ("node.allreduce", "net.allreduce", "gemm", "busy")


def fields(path):
    """key -> value, and the tables (keys given once a point) as key -> [(x, y), ...]"""
    out, tables = {}, {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            if k in TABLES:
                tables.setdefault(k, []).append(tuple(float(x) for x in v.split()))
            else:
                out[k] = v
    return out, tables


def main():
    planc, root = sys.argv[1], sys.argv[2]
    tally = harness.Tally("calibrate")
    tmp = harness.workdir("calibrate")
    gpt = os.path.join(root, "examples/gpt.plan")
    dev = os.path.join(tmp, "two.device")
    r = harness.mpirun(2, [planc, "calibrate", "--quick", "-o", dev], timeout=600)
    if not tally.check("calibrate on 2 ranks", r.returncode == 0 and os.path.isfile(dev), r.stderr.strip()[-400:]):
        tally.finish()
    tally.check("nothing left beside the file", os.listdir(tmp) == ["two.device"], os.listdir(tmp))
    f, tables = fields(dev)
    text = open(dev).read()
    num = {k: float(v) for k, v in f.items() if k != "name"}
    tally.check("named as calibrated", f.get("name", "").startswith("calibrated on "), f.get("name"))
    tally.check("rates of a CPU core", 1e8 < num["matmul.f32"] < 1e13 and 1e7 < num["memory.f32"] < 1e12
                and 1e6 < num["attention.f32"] <= 2 * num["matmul.f32"], {k: num[k] for k in
                                                                         ("matmul.f32", "memory.f32", "attention.f32")})
    tally.check("every element type measured", all(num[k + ".bf16"] == num[k + ".f32"] == num[k + ".f16"]
                                                   for k in ("matmul", "memory", "attention")))
    tally.check("node.ranks is the launch's", num["node.ranks"] == 2, num["node.ranks"])
    tally.check("the link measured", num["node.bandwidth"] > 0 and num["node.latency"] > 0
                and num["node.bandwidth"] != 5e9, (num["node.bandwidth"], num["node.latency"]))
    tally.check("comments: GEMM shapes, all-reduce by size, what was not measured",
                "GEMM FLOP/s by shape" in text and "all-reduce seconds by size" in text
                and "between nodes: not measured (one node)" in text)
    gemm = tables.get("gemm", [])
    tally.check("the gemm table: every shape measured, by FLOPs, its best the matmul rate", len(gemm) == 3
                and all(a[0] < b[0] for a, b in zip(gemm, gemm[1:]))
                and abs(max(r for _, r in gemm) / num["matmul.f32"] - 1) < 1e-5, gemm)
    cores = os.cpu_count() or 1
    busy = tables.get("busy", [])
    tally.check("busy table only where the 2 ranks share cores (%d cores)" % cores,
                (busy == []) == (2 <= cores) and (busy == [] or (busy[-1] == (2.0, 1.0) and busy[0][0] == 1)), busy)
    tally.check("memory per rank", num["memory.capacity"] > 1e8, num["memory.capacity"])
    tally.check("a kernel's fixed cost measured", 1e-9 < num["kernel.latency"] < 1e-3, num["kernel.latency"])
    sizes = tables.get("node.allreduce", [])
    busbw = [b / t for b, t in sizes] or [0]  # 2 ranks: 2 (n-1)/n = 1
    tally.check("the all-reduce table: 4 KiB to 1 MiB by 4x over the 2 ranks", [b for b, _ in sizes]
                == [4096.0 * 4 ** i for i in range(5)] and f.get("node.allreduce_ranks") == "2", sizes)
    tally.check("node.bandwidth: the best size's all-reduce bus bandwidth", abs(num["node.bandwidth"] / max(busbw) - 1)
                < 0.01, (num["node.bandwidth"], busbw))
    slower = os.path.join(tmp, "slow_links.device")
    with open(slower, "w") as out:
        out.write(re.sub(r"(?m)^(n\w+\.allreduce) = (\S+) (\S+)",
                         lambda m: "%s = %s %g" % (m.group(1), m.group(2), 10 * float(m.group(3))), text))
    tally.check("the table prices the collectives", step(planc, gpt, "dp2_tp2", slower) > step(planc, gpt, "dp2_tp2", dev))

    measured, nominal = step(planc, gpt, "single", dev), step(planc, gpt, "single", "cpu")
    tally.check("explain uses the measured figures", measured != nominal, "%g vs nominal %g" % (measured, nominal))
    r = subprocess.run([planc, "explain", gpt, "--plan", "single", "--device=" + dev], capture_output=True, text=True)
    tally.check("explain names the device", "on calibrated on " in r.stdout, r.stdout[-300:])
    slow = os.path.join(tmp, "slow_attention.device")
    with open(slow, "w") as out:
        out.write(re.sub(r"(?m)^(attention\.\w+) = (\S+)", lambda m: "%s = %g" % (m.group(1), float(m.group(2)) / 10),
                         text))
    slower = step(planc, gpt, "single", slow)
    tally.check("attention.* prices the fused attention", slower > measured, "%g vs %g" % (slower, measured))
    plain = os.path.join(tmp, "no_attention.device")
    with open(plain, "w") as out:
        out.write(re.sub(r"(?m)^attention\..*\n", "", text))
    same_rate = os.path.join(tmp, "matmul_rate.device")
    with open(same_rate, "w") as out:
        out.write(re.sub(r"(?m)^(attention\.\w+) = \S+", lambda m: "%s = %s" % (m.group(1), f["matmul.f32"]), text))
    tally.check("without attention.*: the matmul rate", step(planc, gpt, "single", plain)
                == step(planc, gpt, "single", same_rate))

    one = os.path.join(tmp, "one.device")
    r = subprocess.run([planc, "calibrate", "--quick", "-o", one], capture_output=True, text=True,
                       env=harness.mpi_env(), timeout=600)
    g = fields(one)[0] if os.path.isfile(one) else {}
    tally.check("one process: a world of one, the base's links", r.returncode == 0 and g.get("node.ranks") == "1"
                and float(g.get("node.bandwidth", 0)) == 5e9 and "not measured" in open(one).read(),
                r.stderr.strip()[-300:] or g)

    for name, argv, code, want in (
            ("-o a directory", ["-o", tmp], 1, "directory"),
            ("unknown base", ["--device", "h300", "-o", os.path.join(tmp, "x")], 2, "unknown device 'h300'"),
            ("no -o", ["--quick"], 2, "-o FILE is required"),
            ("-o twice", ["-o", os.path.join(tmp, "a"), "-o", os.path.join(tmp, "b")], 2, "-o given twice")):
        r = subprocess.run([planc, "calibrate", "--quick", *argv], capture_output=True, text=True,
                           env=harness.mpi_env(), timeout=600)
        tally.check("error: " + name, r.returncode == code and want in r.stderr, (r.returncode, r.stderr.strip()))
    tally.check("errors wrote nothing", sorted(os.listdir(tmp)) == sorted(
        ["two.device", "slow_links.device", "slow_attention.device", "no_attention.device", "matmul_rate.device",
         "one.device"]),
        os.listdir(tmp))
    tally.finish()


if __name__ == "__main__":
    main()
