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
  - memory-bound kernels at their element size: with free products and no launch cost, the bf16
    GPT's micro-batches move about half the f32 one's bytes;
  - ranks sharing cores (node.cores): one micro-batch through 4 stages on 4 ranks of 2 cores at
    twice the rate, plans without a pipeline unchanged;
  - dropout.rate: the GPT's dropout masks (its dropout kernels and its attention's) add their
    elements at that rate, half as much at twice the rate; Llama, without dropout, unchanged;
  - matmul_bw: a GEMM's operand bytes at that rate add to the step, half as much at twice the
    rate; what it is for: one rank accumulating 8 micro-batches, whose GEMMs read each weight 8
    times, pays more for it than with one micro-batch (FLOPs alone price them alike);
  - bad files: an unknown key, a non-number or a kernel.latency over 1m is an error naming
    file:line, exit 2.
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
    # --json prints 6 significant digits, each value within 5e-6 of itself: the difference below
    # can be off by 5e-6 x (two + none + 2 one), about 1e-5 x two, from the printing alone
    tally.check("kernel.latency: added in proportion", none < one < two and abs((two - none) - 2 * (one - none))
                < 1e-5 * two, "%g %g %g" % (none, one, two))
    tally.check("kernel.latency: hundreds of kernels per step of the small GPT", 100 < (one - none) / 5e-4 < 10000,
                (one - none) / 5e-4)
    tally.check("h100's default kernel.latency is a few microseconds", none < named["h100"]
                and abs((named["h100"] - none) / ((one - none) / 5e-4) - 3e-6) < 1e-9, named["h100"] - none)
    # memory-bound kernels at their element size: with the products free and no launch cost, what
    # is left of a micro-batch is bytes moved, and a bf16 plan's activations are half an f32 one's
    # (the f32 exceptions: norm statistics, the loss; 0.51 measured). Fused loops priced every
    # buffer at 4 bytes an element until 2026-12-04, which made the same ratio 0.82.
    free = dev("free_compute", "base = h100\nkernel.latency = 0\n" + "".join(
        "%s.%s = 1e30\n" % (k, t) for k in ("matmul", "attention") for t in ("f32", "bf16", "f16")))

    def micro(plan):
        out = subprocess.run([planc, "explain", gpt, "--plan", plan, "--json", "--device=" + free],
                             capture_output=True, text=True, check=True).stdout
        return float(re.search(r'"estimated_step_s": \{"step": [0-9.e+-]+, "micro_batches": ([0-9.e+-]+)', out).group(1))
    ratio = micro("bf16") / micro("single")
    tally.check("memory-bound kernels priced at their element size: bf16's micro-batch bytes about half f32's",
                0.4 < ratio < 0.6, "bf16 / f32 = %.3f" % ratio)
    # ranks sharing cores (node.cores under node.ranks: 4 ranks on 2 cores, as calibrate writes on
    # such a machine): a rank computes at the device's rate while all of them do, twice that when
    # only half do. One micro-batch through 4 stages (one stage computes at a time) with free links
    # takes exactly half as long; a plan of 4 ranks without a pipeline (every rank always busy) is
    # unchanged; a world of 1 or 2 ranks (a core each, where the calibration's 4 shared 2) computes
    # twice as fast throughout, update too; node.cores must be a whole number.
    pipe4 = os.path.join(tmp, "pipe4.plan")
    with open(pipe4, "w") as f:
        f.write(open(gpt).read() + "\nplan pipe4 for gpt {\n  mesh pipe = 4\n  batch B = 16, micro_batches = 1\n"
                "  pipeline pipe: 1f1b, stages = 4\n}\n")
    links = "node.ranks = 4\nnode.latency = 0\nnode.bandwidth = 1e30\nnet.latency = 0\nnet.bandwidth = 1e30\n"
    alone, shared = dev("alone", "base = cpu\n" + links), dev("shared", "base = cpu\n" + links + "node.cores = 2\n")

    def micro_of(path, plan, device):
        out = subprocess.run([planc, "explain", path, "--plan", plan, "--json", "--device=" + device],
                             capture_output=True, text=True, check=True).stdout
        return float(re.search(r'"estimated_step_s": \{"step": [0-9.e+-]+, "micro_batches": ([0-9.e+-]+)', out).group(1))
    a, b = micro_of(pipe4, "pipe4", alone), micro_of(pipe4, "pipe4", shared)
    tally.check("4 ranks on 2 cores: one micro-batch through 4 stages at twice the rate", abs(b - a / 2) < 1e-5 * a,
                "%g s alone, %g s sharing" % (a, b))
    same = (micro_of(gpt, "dp2_tp2", alone), micro_of(gpt, "dp2_tp2", shared))
    tally.check("4 ranks on 2 cores: 4 ranks without a pipeline unchanged", same[0] == same[1], same)
    fewer = [(plan, step(planc, gpt, plan, alone), step(planc, gpt, plan, shared)) for plan in ("single", "pp2_1f1b")]
    tally.check("a calibration of 4 ranks on 2 cores: 1 or 2 ranks compute twice as fast (the step half)",
                all(abs(y - x / 2) < 1e-5 * x for _, x, y in fewer), fewer)
    llama = os.path.join(root, "examples/llama.plan")
    plain = [step(planc, path, "single", dev("cpu", "base = cpu\n")) for path in (gpt, llama)]
    once = [step(planc, path, "single", dev("drop1", "base = cpu\ndropout.rate = 1G\n")) for path in (gpt, llama)]
    twice = [step(planc, path, "single", dev("drop2", "base = cpu\ndropout.rate = 2G\n")) for path in (gpt, llama)]
    tally.check("dropout.rate: the GPT's masks add to its step, half as much at twice the rate",
                once[0] > plain[0] and abs((once[0] - plain[0]) - 2 * (twice[0] - plain[0])) < 1e-5 * once[0],
                (plain[0], once[0], twice[0]))
    tally.check("dropout.rate: a model without dropout unchanged", plain[1] == once[1] == twice[1],
                (plain[1], once[1], twice[1]))
    # matmul_bw (a CPU GEMM's packing of its operands, planc calibrate fits it): each GEMM adds its
    # A, B and C bytes at that rate. Micro-batches split the GEMMs' rows, not their weights: one
    # rank accumulating 8 micro-batches reads every weight (B) 8 times where 1 reads it once, so it
    # pays more, though the FLOPs are the same (and alike on a device without matmul_bw, up to the
    # kernels' fixed costs)
    accumulate = os.path.join(tmp, "accumulate.plan")
    with open(accumulate, "w") as f:
        f.write(open(gpt).read() + "".join("\nplan m%d for gpt {\n  mesh data = 1\n  batch B = 16, micro_batches = %d\n}\n"
                                           % (m, m) for m in (1, 8)))
    gemm = [dev("gemm%d" % i, "base = cpu\n" + "".join("matmul_bw.%s = %dG\n" % (t, 10 * i) for t in ("f32", "bf16", "f16"))
                if i else "base = cpu\n") for i in range(3)]
    plain_g, once_g, twice_g = (step(planc, gpt, "single", d) for d in gemm)
    tally.check("matmul_bw: a GEMM's operand bytes add to the step, half as much at twice the rate",
                once_g > plain_g and abs((once_g - plain_g) - 2 * (twice_g - plain_g)) < 1e-5 * once_g,
                (plain_g, once_g, twice_g))
    added = [step(planc, accumulate, "m%d" % m, gemm[1]) - step(planc, accumulate, "m%d" % m, gemm[0]) for m in (1, 8)]
    tally.check("matmul_bw: 8 micro-batches pay more for their GEMMs' operands than 1", added[1] > 1.5 * added[0] > 0,
                "added %g s (1 micro-batch), %g s (8)" % tuple(added))
    r = subprocess.run([planc, "explain", gpt, "--device=" + dev("half", "base = cpu\nnode.cores = 1.5\n")],
                       capture_output=True, text=True)
    tally.check("bad device file: node.cores not whole", r.returncode == 2 and "node.cores is a whole number" in r.stderr,
                r.stderr.strip())
    for name, text, want in (("unknown", "base = h100\nflops = 3\n", ":2: error: unknown key 'flops'"),
                             ("launch", "base = h100\nkernel.latency = 5\n", ":2: error: kernel.latency is seconds"),
                             ("nan", "base = h100\nnode.latency = fast\n", ":2: error: 'fast' is not"),
                             ("tile", "base = cpu\nattention.tile = 6.4\n", ":2: error: attention.tile is a whole number"),
                             ("score", "base = cpu\nattention.score_forward = 0.8\n",
                              ":2: error: attention.score_forward and score_backward are seconds per score"),
                             ("empty", "# nothing\n", "the device has no matmul.f32")):
        r = subprocess.run([planc, "explain", gpt, "--device=" + dev(name, text)], capture_output=True, text=True)
        tally.check("bad device file: " + name, r.returncode == 2 and want in r.stderr, r.stderr.strip())
    r = subprocess.run([planc, "explain", gpt, "--device=h300"], capture_output=True, text=True)
    tally.check("unknown device name", r.returncode == 2 and "unknown device 'h300'" in r.stderr, r.stderr.strip())
    tally.finish()


if __name__ == "__main__":
    main()
