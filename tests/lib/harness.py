"""harness.py: the one harness of the Python test runners (tests/*/*.py import it as `harness`).

What every runner needs and would otherwise write again:
  MPI_ENV, mpi_env()  the environment that runs mpirun as root on a machine with more ranks than
                      cores (Open MPI over shared memory, one thread per rank, a waiting rank
                      yielding its core, the watchdog at 60 s so that a stall becomes an error
                      naming the pending operation, not a hang)
  Tally               one 'PASS: name: detail' / 'FAIL: ...' line per check and the closing
                      'LABEL: N passed, M failed (S s CPU)' line; the runner exits 1 when a check
                      failed
  explain()           planc explain --json, parsed, once per (plan file content, plan, arguments)
  smaller_size()      the smallest --model-arg size at which a plan does what it does at the
                      model's own size (schedule(): the same collectives, stages and layers)
  workdir()           a temporary directory, removed when the runner exits (PLANC_KEEP_TMP=1 keeps
                      it, and prints where it is, to look at a failure)
  build(), mpirun()   planc build of a plan; a program (or any command) under mpirun
  read_log(), losses() a program's --log (JSON lines)
  read_safetensors()  a safetensors file as {name: (dtype, shape, bytes)}; as_floats() decodes F32/BF16
  memory_reports()    each rank's PLANRT_REPORT_MEMORY line
  kill_job()          SIGKILL for mpirun and every rank it started, as when a node fails
  Runner              a runner's start: its arguments (PLANC REPO_ROOT), the corpus, its work
                      directory, its tally and its Programs
A runner's work is the checks it makes; how a program is built and launched is here.
"""
import atexit
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

# OMPI_MCA_mpi_yield_when_idle: a rank polling for a message calls sched_yield between polls. Open
# MPI turns it on by itself only when one job has more ranks than cores; under `ctest -j2` two
# 2-rank jobs share 2 cores, and a rank spinning for its peer holds the core that peer (or the
# other test) needs: a GPT tp2 run of 20 steps took 9.4 CPU s without it, 4.6 with it (the same
# losses bit for bit; tests/README.md, "Time").
# OMPI_MCA_pml=ob1 and HWLOC_COMPONENTS=-pci,-linuxio: a rank's start without two probes that nothing
# here uses. Open MPI tries its cm layer (the interconnect libraries PSM and PSM2, which look for
# their network cards) before ob1, the layer over the btls above: about 0.2 s of waiting per job.
# hwloc reads every PCI device's configuration space to place network cards and GPUs: about 0.13
# CPU s per 4-rank job, a sixth of an empty job's start. The programs and their numbers are the
# same (ob1 is what Open MPI chose anyway).
# HWLOC_PLUGINS_BLACKLIST: mpirun's hwloc no longer loads its plugins (Debian's libhwloc-plugins:
# OpenCL, OpenGL with X11, libxml2 with ICU's 30 MB of data, libpciaccess), which nothing above uses
# (-pci already kept the PCI probe from running, not its library from loading): a 4-rank GPT job of
# one step 0.52-0.55 -> 0.45-0.49 s wall, 0.86-0.92 -> 0.74-0.80 CPU s (tests/README.md, "Time").
MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_plm="isolated", OMPI_MCA_btl="self,vader", OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_pml="ob1", HWLOC_COMPONENTS="-pci,-linuxio",
               HWLOC_PLUGINS_BLACKLIST="hwloc_pci,hwloc_opencl,hwloc_gl,hwloc_xml_libxml",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PLANRT_WATCHDOG="60")


def mpi_env(**extra):
    """os.environ with MPI_ENV and extra (a value of None removes that variable)"""
    env = dict(os.environ, **MPI_ENV)
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


class Tally:
    """check() prints a check's verdict and counts it; finish() prints the tally and exits."""

    def __init__(self, label=None):
        self.label, self.passed, self.failed = label, 0, 0

    def check(self, name, ok, detail=""):
        ok = bool(ok)
        print(f"{'PASS' if ok else 'FAIL'}: {name}{': ' + str(detail) if detail else ''}", flush=True)
        self.passed, self.failed = self.passed + ok, self.failed + (not ok)
        return ok

    def finish(self):
        """prints the closing line (with the CPU time the runner and everything it ran took: a
        figure to read, never a check) and exits 1 when a check failed"""
        t = os.times()
        cpu = t.user + t.system + t.children_user + t.children_system
        print(f"{self.label + ': ' if self.label else ''}{self.passed} passed, {self.failed} failed ({cpu:.1f} s CPU)",
              flush=True)
        sys.exit(1 if self.failed else 0)


def workdir(prefix):
    """a fresh temporary directory, removed at exit unless PLANC_KEEP_TMP is set"""
    path = tempfile.mkdtemp(prefix=f"planc-{prefix.replace(' ', '-')}-")
    if os.environ.get("PLANC_KEEP_TMP"):
        print(f"note: PLANC_KEEP_TMP: the runs' files stay in {path}", flush=True)
    else:
        atexit.register(shutil.rmtree, path, True)
    return path


_explained = {}


def explain(planc, src, plan, env=None, args=()):
    """planc explain SRC --plan PLAN --json ARGS..., parsed; asked once per content of SRC, plan and
    ARGS (e.g. ("--model-arg", "D=64"))"""
    key = (planc, src, plan, hashlib.sha256(open(src, "rb").read()).hexdigest(), tuple(args))
    if key not in _explained:
        out = subprocess.run([planc, "explain", src, "--plan", plan, "--json", *args], capture_output=True, text=True,
                             check=True, env=env)
        _explained[key] = json.loads(out.stdout)
    return _explained[key]


def model_args(size):
    """planc's --model-arg options for a size: a tuple of NAME=VALUE ("D=64", "S=32")"""
    return [x for arg in size for x in ("--model-arg", arg)]


def schedule(explained):
    """what a plan does, from its planc explain --json: the pipeline and, per rank role, its stage,
    ranks, micro-batches in flight, layers and collectives (kind, axis, phase, calls); no sizes"""
    pipe = explained.get("pipeline") or {}
    return ((pipe.get("schedule"), pipe.get("stages"), pipe.get("chunks")),
            [(r["stage"], r["role"], r["ranks"], r["first_rank"], r.get("inflight_micro_batches"),
              sorted(r.get("activation_bytes_per_layer") or {}),
              [(c["collective"], c["axis"], c["phase"], c["calls"]) for c in r["communication"]])
             for r in explained["roles"]])


def smaller_size(planc, src, plan, sizes):
    """the first of sizes (tuples of NAME=VALUE for --model-arg, the smallest first) at which plan
    keeps its schedule() at the model's own size (a size the plan does not compile at is skipped),
    else () (the model's own size): a test of what a
    plan does can train it there, on less arithmetic (tests/README.md, "equiv at a smaller size")"""
    want = schedule(explain(planc, src, plan))
    for size in sizes:
        try:
            if schedule(explain(planc, src, plan, args=model_args(size))) == want:
                return size
        except subprocess.CalledProcessError:  # the plan does not compile at that size
            continue
    return ()


def common_size(planc, src, plans, sizes):
    """the first of sizes at which every plan of plans keeps its schedule() (smaller_size), else ():
    one size for plans whose checkpoints a test moves between them (the tensors' shapes must agree)"""
    for size in sizes:
        if all(smaller_size(planc, src, plan, [size]) == size for plan in plans):
            return size
    return ()


def build(planc, src, plan, out, *flags, env=None):
    """planc build SRC --plan PLAN -o OUT FLAGS...: None when it built, else the error (its first lines).
    An OUT that exists is taken as built (runners name a program by its plan and flags)."""
    if os.path.exists(out):
        return None
    r = subprocess.run([planc, "build", src, "--plan", plan, "-o", out, *flags], capture_output=True, text=True,
                       env=env)
    return None if r.returncode == 0 else f"planc build {os.path.basename(src)} --plan {plan} failed: " \
                                          f"{r.stderr.strip()[:400]}"


def mpirun(world, argv, env=None, timeout=900):
    """argv under mpirun -np WORLD (the MPI environment unless env is given): the CompletedProcess"""
    return subprocess.run(["mpirun", "-np", str(world), *argv], capture_output=True, text=True,
                          env=env if env is not None else mpi_env(), timeout=timeout)


class Programs:
    """Programs built from plans (examples/MODEL.plan, or a file given), each run under mpirun on its
    plan's world size: what the runners that exercise one program's options share."""

    def __init__(self, planc, root, work, flags=("--native",), env=None):
        self.planc, self.root, self.work, self.flags = planc, root, work, flags
        self.env = env if env is not None else mpi_env()
        self.world = {}

    def build(self, model, plan, src=None, size=()):
        """the program of plan PLAN at SIZE (--model-arg NAME=VALUE ..., the model's own size when
        empty), built once; a failed build ends the runner with a FAIL line"""
        src = src or f"{self.root}/examples/{model}.plan"
        prog = f"{self.work}/{model}_{plan}" + "".join(f"_{arg.replace('=', '')}" for arg in size)
        err = build(self.planc, src, plan, prog, *self.flags, *model_args(size))
        if err:
            raise SystemExit(f"FAIL: {err}")
        self.world[prog] = explain(self.planc, src, plan, args=model_args(size))["world"]
        return prog

    def run(self, prog, *args, extra_env=None, timeout=120):
        """(exit status, stderr) of the program with ARGS on its world size"""
        r = mpirun(self.world[prog], [prog, *args], dict(self.env, **(extra_env or {})), timeout)
        return r.returncode, r.stderr


def c_functions(text, pattern):
    """{name: [body lines]} of the generated C functions whose header line matches pattern (a
    compiled regex whose group 1 is the name), each body up to its closing brace at column 0"""
    out, name = {}, None
    for line in text.split("\n"):
        m = pattern.match(line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and line == "}":
            name = None
        elif name:
            out[name].append(line)
    return out


def read_log(path):
    """a --log file: one dict per line"""
    return [json.loads(line) for line in open(path) if line.strip()]


def losses(path):
    """a --log file's losses by step"""
    return {x["step"]: x["loss"] for x in read_log(path) if "loss" in x}


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file (no __metadata__)"""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return {name: (info["dtype"], tuple(info["shape"]), blob[8 + n + info["data_offsets"][0]:8 + n + info["data_offsets"][1]])
            for name, info in header.items() if name != "__metadata__"}


def as_floats(dtype, raw):
    """the values of an F32 or BF16 tensor's bytes"""
    if dtype == "F32":
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    raise ValueError(f"unexpected dtype {dtype}")


MEMORY_KINDS = ("param", "grad", "optim", "master", "buffer", "metric", "offload")
MEMORY_LINE = re.compile(r"planrt: rank (\d+): memory arena_high_water=(\d+) arena_planned=(\d+) state=(\d+) "
                         r"peak_rss=(\d+) stage=(\d+) param=(\d+) grad=(\d+) optim=(\d+) master=(\d+) buffer=(\d+) "
                         r"metric=(\d+) offload=(\d+) disk=(\d+)")


def memory_reports(stderr):
    """{rank: its PLANRT_REPORT_MEMORY line}: arena high-water mark ("high") and planned size
    ("arena"), persistent state ("state"), peak resident set ("rss"), pipeline stage, state bytes
    by kind ("kinds") and the optimizer state file's size ("disk")"""
    out = {}
    for m in MEMORY_LINE.finditer(stderr):
        v = [int(x) for x in m.groups()]
        out[v[0]] = {"high": v[1], "arena": v[2], "state": v[3], "rss": v[4], "stage": v[5],
                     "kinds": dict(zip(MEMORY_KINDS, v[6:13])), "disk": v[13]}
    return out


def kill_job(p):
    """SIGKILL for mpirun (a Popen started with start_new_session) and the ranks it started, at once"""
    ranks = [int(x) for x in subprocess.run(["ps", "-o", "pid=", "--ppid", str(p.pid)], capture_output=True,
                                            text=True).stdout.split()]
    for pid in ranks + [p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return ranks


class Runner:
    """What a runner starts from: planc and the repository root (its first two arguments),
    data/corpus.txt, a work directory and a tally named LABEL (check, finish), and programs (a
    Programs built with --native in the work directory)."""

    def __init__(self, label):
        self.planc, self.root = sys.argv[1], sys.argv[2]
        self.data = f"{self.root}/data/corpus.txt"
        self.work = workdir(label)
        self.tally = Tally(label)
        self.check, self.finish = self.tally.check, self.tally.finish
        self.programs = Programs(self.planc, self.root, self.work)
