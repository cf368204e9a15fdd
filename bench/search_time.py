#!/usr/bin/env python3
"""Search time of planc search (issue 20): for each case, the candidates enumerated, compiled,
refused by the checks, over memory, skipped by the time and the memory bounds, the CPU seconds of
the whole search and per compiled candidate (planc prints them; this collects them into a table),
and the best plan's estimated step time. --large adds the 7B GPT on 64 ranks and the 1T GPT on
3072 GPUs (about 40 s of CPU for the 1T search; docs/search.md).
usage: bench/search_time.py [PLANC] [--large]"""
import os
import re
import subprocess
import sys

SMALL = [("examples/gpt.plan", "gpt", 4, 16, "cpu", []),
         ("examples/gpt.plan", "gpt", 8, 16, "cpu", []),
         ("examples/gpt.plan", "gpt", 8, 16, "cpu", ["--exhaustive"]),
         ("examples/llama.plan", "llama", 4, 8, "cpu", []),
         ("examples/mlp.plan", "mlp", 8, 32, "cpu", []),
         ("examples/gpt7b.plan", "gpt7b", 8, 16, "h100", [])]
LARGE = [("examples/gpt7b.plan", "gpt7b", 64, 512, "h100", []),
         ("tests/scale/gpt1t.plan", "gpt1t", 3072, 3072, "h100", [])]


def main():
    planc = next((a for a in sys.argv[1:] if not a.startswith("--")), "build/planc")
    cases = SMALL + (LARGE if "--large" in sys.argv else [])
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    print("%-34s %6s %6s %6s %8s %6s %6s %6s %9s %8s %11s" % ("model, ranks, batch, device", "cands", "built", "refused",
                                                              "over mem", "t-prun", "m-prun", "tensor", "CPU s", "ms/cand",
                                                              "best step s"))
    for path, model, world, batch, device, extra in cases:
        r = subprocess.run([planc, "search", path, "--model", model, "--world", str(world), "--batch", str(batch),
                            "--device=" + device, "--top", "1"] + extra, capture_output=True, text=True)
        m = re.search(r"# (\d+) candidates: (\d+) compiled \((\d+) refused by the checks, (\d+) over memory\), (\d+) "
                      r"pruned by the time bound, (\d+) by the memory bound, (\d+) by their tensor-only plan; "
                      r"([0-9.]+) s CPU, ([0-9.]+) ms", r.stdout)
        best = re.search(r"# 1: estimated step ([0-9.e+-]+) s", r.stdout)
        name = "%s %d %d %s%s" % (model, world, batch, device, " exh." if extra else "")
        if not m:
            print("%-34s failed: %s" % (name, r.stderr.strip().splitlines()[:1]))
            continue
        print("%-34s %6s %6s %6s %8s %6s %6s %6s %9s %8s %11s" % ((name,) + m.groups() + (best.group(1) if best else "-",)))
        sys.stdout.flush()
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
