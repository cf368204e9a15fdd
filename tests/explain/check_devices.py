#!/usr/bin/env python3
"""Device models (issue 20, docs/search.md): explain's estimated step time follows the device it
is told to assume, named or from a device file.
  - the named devices order as their rates do: a100 slower than h100, h100 slower than h200 (more
    memory bandwidth), one CPU core far slower than any GPU;
  - a device file `base = h100` alone gives h100's estimate; doubling its matmul rate shortens a
    compute-bound plan's step, halving its in-node bandwidth lengthens a tensor-parallel one's;
  - the tree all-reduce: at 12,500 data-parallel ranks across nodes a ring's 25,000 steps of
    latency dominate, and the same device without its tree (net.tree = 0) is far slower;
  - kernel.latency: every compute kernel's fixed cost adds to the step in proportion (twice the
    latency, twice the added seconds), a zero latency adds nothing, and hundreds of kernels run
    per step of the small GPT;
  - measured tables (what planc calibrate writes): an all-reduce table whose seconds are a
    constant bus bandwidth's prices every collective as that bandwidth with no latency does (below,
    between and beyond its sizes), and a slower table lengthens the step; a gemm table prices
    small GEMMs below the roof (a longer step), one at the roof changes nothing, and a larger GEMM
    is never priced faster than a smaller (a falling table is the roof); a busy table (ranks
    sharing cores) halves the one-rank plan's step at a speedup of 2 with one rank busy, leaves
    data parallelism's (every rank busy) alone and shortens a 2-stage pipeline's, and one of
    speedup 1 everywhere gives the plain simulation's step (1f1b, interleaved, with data); planc
    search on a device with all three tables reports `bounds violated 0` exhaustively and finds
    the same top 3 with its pruning;
  - bad files: an unknown key, a non-number, a kernel.latency over 1m, a table point that is not
    two positive numbers or out of order, a table without its ranks are errors naming file:line
    (or the file), exit 2.
usage: tests/explain/check_devices.py PLANC ROOT"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402


def step(planc, path, plan, device):
    out = subprocess.run([planc, "explain", path, "--plan", plan, "--json", "--device=" + device],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r'"estimated_step_s": \{"step": ([0-9.e+-]+)', out).group(1))


def tables(planc, gpt, tally, dev):
    """the measured tables of a device file (planc calibrate's), on the nominal cpu"""
    flat = "base = cpu\nnode.latency = 0\nnet.latency = 0\n"
    plain = step(planc, gpt, "dp2_tp2", dev("flat", flat))
    bw = 5e9  # the cpu's bandwidth: a table of that bus bandwidth at every size, over 4 ranks
    table = "".join("%s.allreduce_ranks = 4\n" % k + "".join("%s.allreduce = %d %.17g\n" % (k, b, 1.5 * b / bw)
                                                             for b in (4096, 65536, 1 << 20)) for k in ("node", "net"))
    same = step(planc, gpt, "dp2_tp2", dev("table", flat + table))
    tally.check("an all-reduce table of one bus bandwidth prices as that bandwidth", abs(same / plain - 1) < 1e-9,
                "%.9g vs %.9g" % (same, plain))
    slow = step(planc, gpt, "dp2_tp2", dev("slow_table", flat + table.replace("allreduce = 1048576 ",
                                                                               "allreduce = 1048576 1")))
    tally.check("a slower table: a longer step", slow > plain, "%g vs %g" % (slow, plain))
    roof = step(planc, gpt, "dp2_tp2", "cpu")
    small = step(planc, gpt, "dp2_tp2", dev("gemm", "base = cpu\ngemm = 1M 10G\ngemm = 1G 100G\n"))
    at_roof = step(planc, gpt, "dp2_tp2", dev("gemm_roof", "base = cpu\ngemm = 1M 7G\ngemm = 1G 7G\n"))
    falling = step(planc, gpt, "dp2_tp2", dev("gemm_falling", "base = cpu\ngemm = 1M 100G\ngemm = 1G 10G\n"))
    tally.check("gemm table: small GEMMs below the roof", small > roof and at_roof == roof and falling == roof,
                (small, roof, at_roof, falling))
    busy = dev("busy", "base = cpu\nbusy = 1 2\nbusy = 2 1\n")
    one, one_busy = step(planc, gpt, "single", "cpu"), step(planc, gpt, "single", busy)
    tally.check("busy table: one rank alone at twice the rate", abs(one_busy * 2 / one - 1) < 1e-9, (one, one_busy))
    dp, dp_busy = step(planc, gpt, "dp2", "cpu"), step(planc, gpt, "dp2", busy)
    tally.check("busy table: every rank busy, no change", abs(dp_busy / dp - 1) < 1e-12, (dp, dp_busy))
    pp, pp_busy = step(planc, gpt, "pp2_1f1b", "cpu"), step(planc, gpt, "pp2_1f1b", busy)
    tally.check("busy table: a pipeline's lone stages run faster", pp / 2 < pp_busy < pp, (pp, pp_busy))
    every = dev("every_table", "base = cpu\nnode.latency = 20u\nnet.latency = 20u\n" + table.replace(
        "allreduce = 4096 ", "allreduce = 4096 1e-4 #") + "gemm = 4M 20G\ngemm = 64M 60G\ngemm = 1G 50G\n"
        "busy = 1 2\nbusy = 2 1.9\nbusy = 3 1.3\nbusy = 4 1\n")
    tops = []
    for how in ("--exhaustive", "--top"):
        r = subprocess.run([planc, "search", gpt, "--model", "gpt", "--world", "4", "--batch", "16", "--device=" + every,
                            "--plan", "single", how, "3"][:-1 if how == "--exhaustive" else None],
                           capture_output=True, text=True)
        tops.append(re.findall(r"# \d: estimated step ([0-9.e+-]+)", r.stdout))
        if how == "--exhaustive":
            tally.check("search on every table: its bounds hold (exhaustive)", r.returncode == 0
                        and "bounds violated 0" in r.stdout and "pruned" in r.stdout, r.stdout[-400:] + r.stderr[-400:])
    tally.check("search on every table: the same top 3 pruned", tops[0] == tops[1] and len(tops[0]) == 3, tops)
    flat = dev("busy_flat", "base = cpu\nbusy = 1 1\nbusy = 8 1\n")  # the time-ordered simulation at speedup 1
    same = {p: (step(planc, gpt, p, "cpu"), step(planc, gpt, p, flat)) for p in ("pp4_1f1b", "pp2_interleaved", "pp2_dp2")}
    tally.check("busy table of speedup 1: the plain simulation's step", all(abs(b / a - 1) < 1e-9 for a, b in
                                                                              same.values()), same)


def main():
    planc, root = sys.argv[1], sys.argv[2]
    tally = harness.Tally("devices")
    tmp = harness.workdir("devices")
    gpt = os.path.join(root, "examples/gpt.plan")
    named = {d: step(planc, gpt, "dp2_tp2", d) for d in ("h200", "h100", "a100", "cpu")}
    tally.check("a100 > h100 > h200, cpu slowest", named["a100"] > named["h100"] > named["h200"]
                and named["cpu"] > 10 * named["a100"], named)

    def dev(name, text):
        path = os.path.join(tmp, name + ".device")
        with open(path, "w") as f:
            f.write(text)
        return path

    base = step(planc, gpt, "dp2_tp2", dev("base", "# as h100\nbase = h100\n"))
    tally.check("base = h100 is h100", base == named["h100"], "%g vs %g" % (base, named["h100"]))
    big = os.path.join(root, "examples/gpt175b.plan")
    h100_big = step(planc, big, "t8_p8", "h100")
    fast = step(planc, big, "t8_p8", dev("fast", "base = h100\nmatmul.bf16 = 1978T\nmatmul.f32 = 134T\n"))
    tally.check("twice the matmul rate: a shorter step", fast < h100_big, "%g vs %g" % (fast, h100_big))
    slow = step(planc, gpt, "dp2_tp2", dev("slow", "base = h100\nnode.bandwidth = 180G\n"))
    tally.check("half the in-node bandwidth: a longer step", slow > named["h100"], "%g vs %g" % (slow, named["h100"]))
    mesh = os.path.join(root, "tests/scale/mesh.plan")
    tree = step(planc, mesh, "dp_tp_100k", "h100")
    ring = step(planc, mesh, "dp_tp_100k", dev("ring", "base = h100\nnet.tree = 0\n"))
    tally.check("tree all-reduce at 12,500 ranks", ring > 10 * tree, "ring only %g s, with tree %g s" % (ring, tree))
    none, one, two = (step(planc, gpt, "dp2_tp2", dev("launch%d" % i, "base = h100\nkernel.latency = %du\n" % (500 * i)))
                      for i in range(3))
    tally.check("kernel.latency: added in proportion", none < one < two and abs((two - none) - 2 * (one - none))
                < 1e-6 * two, "%g %g %g" % (none, one, two))
    tally.check("kernel.latency: hundreds of kernels per step of the small GPT", 100 < (one - none) / 5e-4 < 10000,
                (one - none) / 5e-4)
    tally.check("h100's default kernel.latency is a few microseconds", none < named["h100"]
                and abs((named["h100"] - none) / ((one - none) / 5e-4) - 3e-6) < 1e-9, named["h100"] - none)
    tables(planc, gpt, tally, dev)
    for name, text, want in (("unknown", "base = h100\nflops = 3\n", ":2: error: unknown key 'flops'"),
                             ("one number", "base = cpu\nnode.allreduce_ranks = 4\nnode.allreduce = 1Mi\n",
                              ":3: error: allreduce takes two positive numbers"),
                             ("out of order", "base = cpu\nnode.allreduce_ranks = 4\nnode.allreduce = 1Mi 1m\n"
                              "node.allreduce = 4Ki 1u\n", ":4: error: the points of 'node.allreduce' go in increasing"),
                             ("no ranks", "base = cpu\nnet.allreduce = 1Mi 1m\n", "net.allreduce (the table) and "
                              "net.allreduce_ranks"),
                             ("one rank", "base = cpu\nnode.allreduce_ranks = 1\n", ":2: error: allreduce_ranks is"),
                             ("zero FLOPs", "base = cpu\ngemm = 0 5G\n", ":2: error: gemm takes two positive numbers"),
                             ("half a rank", "base = cpu\nbusy = 1.5 2\n", ":2: error: busy is a whole number"),
                             ("launch", "base = h100\nkernel.latency = 5\n", ":2: error: kernel.latency is seconds"),
                             ("nan", "base = h100\nnode.latency = fast\n", ":2: error: 'fast' is not"),
                             ("empty", "# nothing\n", "the device has no matmul.f32")):
        r = subprocess.run([planc, "explain", gpt, "--device=" + dev(name, text)], capture_output=True, text=True)
        tally.check("bad device file: " + name, r.returncode == 2 and want in r.stderr, r.stderr.strip())
    r = subprocess.run([planc, "explain", gpt, "--device=h300"], capture_output=True, text=True)
    tally.check("unknown device name", r.returncode == 2 and "unknown device 'h300'" in r.stderr, r.stderr.strip())
    tally.finish()


if __name__ == "__main__":
    main()
