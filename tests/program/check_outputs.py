#!/usr/bin/env python3
"""tests/program/check_outputs.py: outputs never replace what is not theirs (issue 23).

Every output of a program (--save, --trace, --log, --save-every) and of planc (explain --svg,
build -o, fmt -w, reshard -o) against targets that are not regular files: a symbolic link (to a
file whose bytes must stay as they were), a FIFO (must not hang), a directory, and character
devices: a null device is written in place (exit 0) and a full one fails with the cause (exit 1);
both stay devices. The devices are private nodes made with mknod in the test's directory when
the test may (root), so a regression can never turn the machine's /dev/null into a file; else
/dev/null and /dev/full, which an unprivileged process cannot replace anyway.
Also: a --log or --trace that cannot be written exits 1; `planc build` killed by SIGTERM, SIGINT
or SIGHUP at any point leaves no planc-build-* directory and no temporary program; an option
given twice is an error (the program's and planc's); --map with an unknown flag, a FIFO or a
directory is refused with the cause (once exit 139, a hang and an empty map).
Prints PASS/FAIL per check and 'N passed, M failed'.
usage: check_outputs.py PLANC REPO_ROOT
"""
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from harness import Tally, mpi_env  # noqa: E402

planc, root = sys.argv[1], sys.argv[2]
env = mpi_env(PLANRT_WATCHDOG="60")
data = f"{root}/data/corpus.txt"
mlp = f"{root}/examples/mlp.plan"
work = tempfile.mkdtemp(prefix="planc-outputs-")
T = Tally()


def device(name, minor, fallback):
    path = f"{work}/{name}"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        return path
    except OSError:
        return fallback


NULL, FULL = device("null", 3, "/dev/null"), device("full", 7, "/dev/full")
prog = f"{work}/mlp_dp2"
r = subprocess.run([planc, "build", mlp, "--plan", "dp2", "-o", prog, "--native"], capture_output=True, text=True,
                   env=env)
if r.returncode:
    raise SystemExit(f"FAIL: planc build: {r.stderr[-400:]}")


def first(err):
    lines = [x for x in err.splitlines() if x.startswith(("planrt", "planc"))]
    return lines[0][:200] if lines else err.strip()[:200]


def targets(tag):
    """name -> a fresh target of that kind; the symlink's file holds b'precious'"""
    d = f"{work}/{tag}"
    os.makedirs(d)
    open(f"{d}/precious", "wb").write(b"precious")
    os.symlink(f"{d}/precious", f"{d}/link")
    os.mkfifo(f"{d}/fifo")
    os.makedirs(f"{d}/dir")
    return {"symlink": f"{d}/link", "FIFO": f"{d}/fifo", "directory": f"{d}/dir", "null device": NULL,
            "full device": FULL}


def intact(kind, path):
    """the target is what it was"""
    st = os.lstat(path)
    return {"symlink": stat.S_ISLNK(st.st_mode) and open(path, "rb").read() == b"precious",
            "FIFO": stat.S_ISFIFO(st.st_mode), "directory": stat.S_ISDIR(st.st_mode) and not os.listdir(path),
            "null device": stat.S_ISCHR(st.st_mode), "full device": stat.S_ISCHR(st.st_mode)}[kind]


def expect(name, kind, path, rc, err, seconds):
    if kind == "null device":
        ok, why = rc == 0 and intact(kind, path), f"exit {rc}, written in place in {seconds:.1f} s"
    elif kind == "full device":
        ok, why = rc != 0 and intact(kind, path) and "No space left" in err, first(err)
    else:
        ok, why = rc != 0 and intact(kind, path) and ("symbolic link" in err or "FIFO" in err or "directory" in err), \
            first(err)
    T.check(f"{name} to a {kind}", ok and seconds < 60, why if ok else f"exit {rc}, target intact "
            f"{intact(kind, path)}: {first(err)}")


def timed(args, timeout=120, **kw):
    t0 = time.time()
    try:
        kw.setdefault("stdout", subprocess.PIPE)
        r = subprocess.run(args, stderr=subprocess.PIPE, text=True, env=env, timeout=timeout, **kw)
        return r.returncode, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return -1, "timed out (a hang)", time.time() - t0


# ---------------------------------------------------------------- the program's outputs
for flag in ["--save", "--trace", "--log"]:
    for kind, path in targets(flag.strip("-")).items():
        rc, err, s = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "2", flag, path])
        expect(f"program {flag}", kind, path, rc, err, s)
for kind, path in targets("save_every").items():
    if kind in ("symlink", "FIFO"):  # a directory output: a link to a directory is followed, a file refused
        rc, err, s = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "2", "--save-every", "1", path])
        T.check(f"program --save-every to a {kind}", rc != 0 and intact(kind, path) and "not a directory" in err,
                first(err))
rc, err, _ = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "2", "--save", f"{work}/w.st", "--log",
                    f"{work}/l.jsonl", "--trace", f"{work}/t.json"])
T.check("program outputs to regular files are written", rc == 0 and all(os.path.getsize(f"{work}/{f}") > 0 for f in
                                                                        ("w.st", "l.jsonl", "t.json")), first(err))

# ---------------------------------------------------------------- planc's outputs
for kind, path in targets("svg").items():
    rc, err, s = timed([planc, "explain", mlp, "--plan", "dp2", "--svg", path], stdout=subprocess.DEVNULL)
    expect("planc explain --svg", kind, path, rc, err, s)
for kind, path in targets("build").items():
    if kind == "directory":
        continue  # a directory as -o is refused by its own message (tests/run_cli.sh)
    rc, err, s = timed([planc, "build", mlp, "--plan", "single", "-o", path, "--native"], timeout=300)
    expect("planc build -o", kind, path, rc, err, s)
plan_copy = f"{work}/fmt_target.plan"
open(plan_copy, "w").write(open(mlp).read())
os.symlink(plan_copy, f"{work}/fmt_link.plan")
rc, err, _ = timed([planc, "fmt", f"{work}/fmt_link.plan", "-w"])
T.check("planc fmt -w of a symbolic link refused", rc != 0 and os.path.islink(f"{work}/fmt_link.plan") and
        "symbolic link" in err, first(err))
for kind in ("FIFO", "null device"):
    path = targets(f"reshard_{kind.split()[0]}")[kind]
    rc, err, _ = timed([planc, "reshard", mlp, "--plan", "dp2", f"{work}/nockpt", "-o", path])
    T.check(f"planc reshard -o a {kind} refused", rc != 0 and intact(kind, path) and "not a directory" in err, first(err))

# ---------------------------------------------------------------- planc build killed
# the three signals at once (a build each, in its own scratch directory), at each delay: the checks
# are the same as one build at a time, in a third of the sleeping
real_cc = {k: v for k, v in env.items() if k != "PLANC_MPICC"}  # no cached compile: the build must be under way
for delay in (0.3, 1.5, 4.0):
    builds = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        scratch, out = f"{work}/scratch_{sig.name}", f"{work}/killed_{sig.name}"
        os.makedirs(scratch)
        builds.append((sig, scratch, out, subprocess.Popen(
            [planc, "build", f"{root}/examples/gpt.plan", "--plan", "dp2", "-o", out], env=dict(real_cc, TMPDIR=scratch),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    time.sleep(delay)
    for sig, _, _, p in builds:
        if p.poll() is None:
            p.send_signal(sig)
    for _, _, _, p in builds:
        p.wait()
    time.sleep(0.2)
    for sig, scratch, out, p in builds:
        finished = p.returncode == 0  # a quiet machine may finish the build before the signal
        name = os.path.basename(out)
        left = os.listdir(scratch) + [f for f in os.listdir(work) if f.startswith(name)]
        if finished:  # then its program is its output, and its scratch directory must be gone
            T.check(f"planc build finished before {sig.name} at {delay} s leaves only its program",
                    left == [name], f"exit {p.returncode}, left {left}")
        else:
            T.check(f"planc build killed by {sig.name} after {delay} s leaves nothing", not left and p.returncode != 0,
                    f"exit {p.returncode}" if not left else f"left {left}")
        subprocess.run(["rm", "-rf", scratch, out])

# ---------------------------------------------------------------- options given twice
rc, err, _ = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "1", "--steps", "2"])
T.check("program: --steps given twice refused", rc != 0 and "--steps is given twice" in err, first(err))
rc, err, _ = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "1", "--data", data])
T.check("program: --data given twice refused", rc != 0 and "--data is given twice" in err, first(err))
rc, err, _ = timed([planc, "check", mlp, "--plan", "single", "--plan=dp2"])
T.check("planc: --plan given twice refused", rc == 2 and "--plan is given twice" in err, first(err))

# ---------------------------------------------------------------- --map
bad_map = f"{work}/bad.map"
open(bad_map, "w").write("linear.weight  fc.weight  t\n")
map_fifo, map_dir = f"{work}/map_fifo", f"{work}/map_dir"
os.mkfifo(map_fifo)
os.makedirs(map_dir)
for name, path, pattern in [("an unknown flag", bad_map, "unknown flag 't'"), ("a FIFO", map_fifo, "not a regular file"),
                            ("a directory", map_dir, "a directory")]:
    rc, err, s = timed(["mpirun", "-np", "2", prog, "--data", data, "--steps", "1", "--save", f"{work}/m.st", "--map",
                        path], timeout=60)
    T.check(f"--map {name} refused with the cause", rc not in (0, -1) and rc != 139 and pattern in err and
            "signal" not in err.lower(), f"exit {rc} in {s:.1f} s: {first(err)}")

subprocess.run(["rm", "-rf", work])
T.finish()
