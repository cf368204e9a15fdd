#!/usr/bin/env python3
"""Compares what two planc binaries make of the same plans, for a refactoring that must not change
behaviour: `planc explain` output must be identical, and the generated programs (C, CUDA host and
kernels) equal once buffer numbers are normalised.

Buffers are named NAME_N in generated code (a view NAME_M_N, M the number of the buffer it views),
N the buffer's number in its program; a change that adds or drops a buffer early renumbers every
later one without changing what the program does. Normalising renames each distinct NAME_N (or
NAME_M_N) token, in order of first appearance, to NAME_#k, so two
programs compare equal exactly when they are the same up to a one-to-one renaming of buffers. The
program descriptor's fingerprint (a hash over buffer names and checkpoint records) is blanked:
it changes with the numbering, and the report says how many fingerprints differ.

usage: scripts/compare_planc.py OLD_PLANC NEW_PLANC [--targets c,cuda] [--keep DIR] FILE.plan...
       (every plan in each FILE; prints one line per plan and target, exits 1 on any difference)
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

BUFFER = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*?)((?:_[0-9]+)+)\b")
FINGERPRINT = re.compile(r'(\.fingerprint\s*=\s*)("[^"]*")')
PLAN = re.compile(r"^\s*plan\s+([A-Za-z_][A-Za-z0-9_]*)\s+for\b", re.M)


def plans_of(path):
    with open(path) as f:
        return PLAN.findall(f.read())


def normalise(text):
    """(text with buffers renamed in order of first appearance and fingerprints blanked, fingerprints)"""
    names = {}

    def rename(m):
        token = m.group(0)
        if token not in names:
            names[token] = "%s_#%d" % (m.group(1), len(names))
        return names[token]

    prints = [m.group(2) for m in FINGERPRINT.finditer(text)]
    text = FINGERPRINT.sub(lambda m: m.group(1) + "FINGERPRINT", text)
    return BUFFER.sub(rename, text), prints


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def emit(planc, target, path, plan, out):
    rc, text = run([planc, "emit", target, path, "--plan", plan, "-o", out])
    files = {}
    if rc == 0:
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                files[name] = f.read()
    return rc, text, files


def first_difference(a, b, label):
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "old/" + label, "new/" + label, n=1, lineterm="")
    return "\n".join(list(diff)[:24])


def compare_plan(args, path, plan, work):
    """Returns (problems, fingerprints that differ) for one plan."""
    problems, reprinted = [], 0
    old = run([args.old, "explain", path, "--plan", plan])
    new = run([args.new, "explain", path, "--plan", plan])
    if old != new:
        problems.append("explain differs:\n" + first_difference(old[1], new[1], "explain"))
    for target in args.targets:
        dirs = [os.path.join(work, side, os.path.basename(path), plan, target) for side in ("old", "new")]
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        o = emit(args.old, target, path, plan, dirs[0])
        n = emit(args.new, target, path, plan, dirs[1])
        if o[0] != n[0] or (o[0] and o[1] != n[1]):
            problems.append("%s: exit %d vs %d\n%s\n%s" % (target, o[0], n[0], o[1][-400:], n[1][-400:]))
            continue
        if sorted(o[2]) != sorted(n[2]):
            problems.append("%s: files %s vs %s" % (target, sorted(o[2]), sorted(n[2])))
            continue
        for name in o[2]:
            a, pa = normalise(o[2][name])
            b, pb = normalise(n[2][name])
            reprinted += pa != pb
            if a != b:
                problems.append("%s %s differs beyond buffer numbers:\n%s" % (target, name, first_difference(a, b, name)))
    return problems, reprinted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--targets", default="c", help="comma-separated emit targets (c, cuda, llvm)")
    ap.add_argument("--keep", help="write the programs under this directory (default: a temporary one)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    args.targets = [t for t in args.targets.split(",") if t]
    work = args.keep or tempfile.mkdtemp(prefix="compare_planc.")
    failed = total = reprinted = 0
    for path in args.files:
        for plan in plans_of(path):
            total += 1
            problems, fp = compare_plan(args, path, plan, work)
            reprinted += fp
            print("%s %s %s%s" % ("FAIL" if problems else "PASS", path, plan, " (fingerprint differs)" if fp else ""))
            for p in problems:
                print("  " + p.replace("\n", "\n  "))
            failed += bool(problems)
            sys.stdout.flush()
    print("%d plans, %d differ, %d with a different fingerprint" % (total, failed, reprinted))
    if not args.keep:
        subprocess.run(["rm", "-rf", work])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
