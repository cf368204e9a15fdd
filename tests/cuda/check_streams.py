"""check_streams.py: the CUDA target's stream/event schedule, checked as data on a CPU.

planc check --dump-after=streams prints, per stage program, every kernel with its phase, stream,
the kernels it waits for (events) and whether it records one (streams.c). From that data:
  buckets    examples/gpt.plan dp2: the gradient all-reduces run on the comm stream during the
             backward, and compute kernels of the same backward after each one (but the last, the
             first layer's bucket, with which the backward ends) do not wait for it
             (the reduction overlaps the rest of the backward); nothing in the backward waits for it.
  prefetch   zero3_dp4: every ZeRO-3 parameter gather starts on the comm stream, its finish on the
             compute stream waits for it; for most gathers compute kernels run between the start and
             the finish (the gather is prefetched: issued ahead of the compute that needs it).
  pipeline   pp2_1f1b: sends and receives run on their channel's streams, never compute; after each
             send, compute kernels follow that do not wait for it.
  order      every wait names an earlier kernel of the same program, on another stream.
  offload    zero2_offload_host, zero3_offload: the optimizer runs on the host, the gradient and
             parameter copies on the copy stream, each piece's gradients copied while the piece
             before it is updated; with params -> host every gather reads a chunk copied before it;
             dp2_offload_activations: saved activations go out in the forward and come back in the
             backward on the copy stream, most of them while compute runs before their first use.
  arena      the CUDA program's stage table (its arena bytes) is the C program's, and explain's
             program arena is that number: the arena the device layer allocates is the planned one.
             Unrolled (--no-layer-loops) the tables are equal; with layer loops equal but for the
             state lists (the CUDA target folds fewer runs: see STATE_FIELDS), and the state
             buffers allocated are the unrolled program's.
  loops      single, zero3_dp4, pp2_1f1b, dp2, tp2_sp (its events in loops): the CUDA host program prints runs of layers as loops
             (smaller than unrolled), and each phase function, its loops expanded layer by layer,
             makes the unrolled program's calls in the same order with the same events.
usage: check_streams.py PLANC ROOT"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

PLANC, ROOT = sys.argv[1], sys.argv[2]
tally = harness.Tally("cuda streams")
check = tally.check


def schedule(plan_file, plan):
    out = subprocess.run([PLANC, "check", plan_file, "--plan", plan, "--dump-after=streams"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    stages, cur = [], None
    for line in out.splitlines():
        if line.startswith("# stage"):
            cur = {}
            stages.append(cur)
            continue
        m = re.match(r"\s*(\d+) (\S+)\s+c(\d+) (\S+)\s+(\S+)(.*)$", line)
        if not m or cur is None:
            continue
        i, phase, chunk, kind, stream, rest = m.groups()
        waits = [int(w) for w in re.findall(r"wait (\d+)", rest)]
        cur[int(i)] = dict(i=int(i), phase=phase, chunk=int(chunk), kind=kind, stream=stream, waits=waits,
                           entry="wait entry" in rest, event=" event" in rest, join=" join" in rest)
    return stages


def waits_on(prog, j, i):
    """kernel j waits for kernel i, directly or through the waits of kernels on its stream before it"""
    seen, frontier = set(), [j]
    while frontier:
        k = frontier.pop()
        if k in seen:
            continue
        seen.add(k)
        if i in prog[k]["waits"]:
            return True
        frontier += [w for w in prog[k]["waits"]]
        frontier += [x for x in prog if x < k and prog[x]["stream"] == prog[k]["stream"] and x >= i]
    return False


def check_order(name, stages):
    bad = [(s, k["i"], w) for s, prog in enumerate(stages) for k in prog.values() for w in k["waits"]
           if w >= k["i"] or prog[w]["stream"] == k["stream"]]
    check(f"{name}: every wait is for an earlier kernel on another stream", not bad, str(bad[:3]))


# ---- gradient buckets reduce while the backward runs
stages = schedule("examples/gpt.plan", "dp2")
check_order("dp2", stages)
prog = stages[0]
reduces = [k for k in prog.values() if k["phase"] == "backward" and k["stream"] == "comm"]
check("dp2: gradient reductions start on the comm stream during the backward", len(reduces) >= 2,
      f"{len(reduces)} of them")
overlapped = 0
for r in reduces[:-1]:  # the last bucket holds the first layer's gradients: the backward ends with it
    after = [k for k in prog.values() if k["phase"] == "backward" and k["i"] > r["i"] and k["stream"] == "compute"]
    if after and not any(r["i"] in k["waits"] for k in after):
        overlapped += 1
check("dp2: compute kernels of the backward follow each reduction but the last without waiting for it",
      len(reduces) >= 2 and overlapped == len(reduces) - 1, f"{overlapped} of {len(reduces) - 1}")

# ---- ZeRO-3 gathers are prefetched
stages = schedule("examples/gpt.plan", "zero3_dp4")
check_order("zero3_dp4", stages)
prog = stages[0]
starts = [k for k in prog.values() if k["kind"] == "allgather_flat_start" and k["phase"] in ("forward", "backward")]
check("zero3_dp4: the parameter gathers start on the comm stream", starts and all(k["stream"] == "comm" for k in starts),
      f"{len(starts)} gathers")
ahead = 0
for s in starts:
    fin = [k for k in prog.values() if k["kind"] == "finish" and s["i"] in k["waits"]]
    if len(fin) != 1:
        check(f"zero3_dp4: gather {s['i']} has one finish waiting for it", False, f"{len(fin)}")
        continue
    between = [k for k in prog.values() if s["i"] < k["i"] < fin[0]["i"] and k["stream"] == "compute"
               and k["kind"] != "finish" and k["phase"] == s["phase"]]
    ahead += bool(between)
check("zero3_dp4: most gathers are issued ahead of compute that runs before their finish",
      starts and ahead * 2 >= len(starts), f"{ahead} of {len(starts)}")

# ---- offload: the optimizer on the host, its copies on the copy stream ahead of it
for plan in ("zero2_offload_host", "zero3_offload"):
    stages = schedule("examples/gpt.plan", plan)
    check_order(plan, stages)
    prog = stages[0]
    step = sorted((k for k in prog.values() if k["phase"] == "step"), key=lambda k: k["i"])
    opts = [k for k in step if k["kind"] == "optimizer"]
    copies = [k for k in step if k["kind"] == "offload_copy"]
    check(f"{plan}: every optimizer call runs on the host, every offload copy on the copy stream",
          opts and copies and all(k["stream"] == "host" for k in opts) and all(k["stream"] == "copy" for k in copies),
          f"{len(opts)} optimizer calls, {len(copies)} copies")
    # the next piece's gradient copy is issued before this piece's update: it travels during it
    # (the copy an update waits for was issued before the previous piece's update)
    ahead = sum(1 for j in range(1, len(opts))
                if any(prog[w]["kind"] == "offload_copy" and w < opts[j - 1]["i"] for w in opts[j]["waits"]))
    check(f"{plan}: each piece's gradients are copied while the piece before it is updated",
          len(opts) > 1 and ahead == len(opts) - 1, f"{ahead} of {len(opts) - 1}")
    if plan == "zero3_offload":  # parameter chunks on the host: each gather reads a copy made just before it
        gathers = [k for k in prog.values() if k["kind"] == "allgather_flat_start" and k["phase"] in ("forward", "backward")]
        fed = sum(1 for g in gathers if prog.get(g["i"] - 1, {}).get("kind") == "offload_copy"
                  and prog[g["i"] - 1]["stream"] == "copy" and waits_on(prog, g["i"], g["i"] - 1))
        check("zero3_offload: every parameter gather reads a chunk copied from the host on the copy stream before it",
              gathers and fed == len(gathers), f"{fed} of {len(gathers)}")

# ---- offload activations: to the host in the forward, back in the backward ahead of their use
stages = schedule("examples/gpt.plan", "dp2_offload_activations")
check_order("dp2_offload_activations", stages)
prog = stages[0]
outs = [k for k in prog.values() if k["kind"] == "offload_copy" and k["phase"] == "forward"]
backs = [k for k in prog.values() if k["kind"] == "offload_copy" and k["phase"] == "backward"]
check("dp2_offload_activations: saved activations go to the host in the forward and come back in the backward, "
      "on the copy stream", outs and len(outs) == len(backs) and all(k["stream"] == "copy" for k in outs + backs),
      f"{len(outs)} out, {len(backs)} back")
ahead = 0
for c in backs:  # compute runs between a copy back and the first kernel waiting for it
    waiters = [k["i"] for k in prog.values() if c["i"] in k["waits"]]
    if waiters and any(c["i"] < k["i"] < min(waiters) and k["stream"] == "compute" for k in prog.values()):
        ahead += 1
check("dp2_offload_activations: most copies back travel while compute runs before their first use",
      backs and ahead * 2 >= len(backs), f"{ahead} of {len(backs)}")

# ---- pipeline sends and receives overlap compute
stages = schedule("examples/gpt.plan", "pp2_1f1b")
check_order("pp2_1f1b", stages)
p2p = [(s, k) for s, prog in enumerate(stages) for k in prog.values() if k["kind"] in ("send", "recv")]
check("pp2_1f1b: sends and receives run on channel streams", p2p and all(k["stream"].startswith("p2p") for _, k in p2p),
      f"{len(p2p)} transfers on {sorted({k['stream'] for _, k in p2p})}")
sends = [(s, k) for s, k in p2p if k["kind"] == "send"]
free = sum(1 for s, k in sends
           if any(x["stream"] == "compute" and x["i"] > k["i"] and k["i"] not in x["waits"] for x in stages[s].values()))
check("pp2_1f1b: compute follows every send without waiting for it", sends and free == len(sends),
      f"{free} of {len(sends)}")

# ---- the arena the device allocates is the planned one; layers as loops run the unrolled calls
STAGES = re.compile(r"static const planrt_stage_t stages\[\] = \{(.*?)\n\};", re.S)
# the fields that list state buffers: a family is one entry for its layers' buffers, and the CUDA
# target folds fewer runs than the C one (a multi-tensor optimizer launch is not in a loop), so
# fewer of its buffers are in families
STATE_FIELDS = re.compile(r"\t\t\.(nstate|families|nfamilies|layers) = .*\n")


def emit(target, plan, out, *flags):
    subprocess.run([PLANC, "emit", target, "examples/gpt.plan", "--plan", plan, "-o", out, *flags], cwd=ROOT, check=True)
    return open(f"{out}/prog.c").read()


def state_allocated(text):
    """the state buffers planrt allocates, as sorted (kind, bytes): each state entry, and each entry of
    a stage's families table once a member (stages whose families print alike share one table)"""
    out = [(k, int(b)) for k, b in re.findall(r'\t\{"[^"]*", (planrt_state_\w+), (\d+), \(void \*\*\)&', text)]
    tables = {name: re.findall(r"\tLAYER_FAMILY\(\w+, \w+, (planrt_state_\w+), (\d+), (\d+)\),", body)
              for name, body in re.findall(r"static const planrt_state_family_t (\w+)\[\] = \{(.*?)\n\};", text, re.S)}
    for name in re.findall(r"\t\t\.families = (\w+),", text):
        for k, b, n in tables[name]:
            out += [(k, int(b))] * int(n)
    return sorted(out)


def calls(text):
    """{phase function: [(callee, (event slots named))...]} in the order they run, a loop over layers
    expanded: its per-layer tables and l's integer steps evaluated for each layer"""
    out, fn, lines = {}, None, text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"static void (\w+)\(planrt_ctx_t \*ctx\)$", lines[i])
        if m:
            fn = out.setdefault(m.group(1), [])
        elif lines[i] == "}":
            fn = None
        elif fn is not None and lines[i].startswith("\t{ /* layers "):
            tables, i = {}, i + 1
            while not lines[i].startswith("\t\tfor (int l = 0; l < "):
                t = re.search(r"(\w+)\[\d+\] = \{(.*)\};", lines[i])
                tables[t.group(1)] = [v.strip() for v in t.group(2).split(",")]
                i += 1
            n = int(re.match(r"\t\tfor \(int l = 0; l < (\d+);", lines[i]).group(1))
            body = []
            while lines[i + 1] != "\t\t}":
                i += 1
                body.append(lines[i])
            for layer in range(n):
                for line in body:
                    line = re.sub(r"\b(\w+)\[l\]", lambda t: tables[t.group(1)][layer] if t.group(1) in tables
                                  else t.group(0), line)
                    line = re.sub(r"\((-?\d+) \+ (?:\(int64_t\))?l \* (-?\d+)\)",
                                  lambda t: str(int(t.group(1)) + layer * int(t.group(2))), line)
                    fn += call_of(line)
            i += 1  # the loop's closing line
        elif fn is not None:
            fn += call_of(lines[i])
        i += 1
    return out


def call_of(line):
    m = re.match(r"\s*(\w+)\(", line)
    if not m or m.group(1) in ("for", "if"):
        return []
    return [(m.group(1), tuple(int(e) for e in re.findall(r"&\w*events\[(\d+)\]", line)))]


tmp = harness.workdir("streams")
for plan in ("single", "zero3_dp4", "pp2_1f1b", "dp2", "tp2_sp"):
    unrolled = {t: emit(t, plan, f"{tmp}/{t}_unrolled", "--no-layer-loops") for t in ("c", "cuda")}
    looped = {t: emit(t, plan, f"{tmp}/{t}_loops") for t in ("c", "cuda")}
    cu, c = STAGES.search(unrolled["cuda"]).group(1), STAGES.search(unrolled["c"]).group(1)
    ex = harness.explain(PLANC, f"{ROOT}/examples/gpt.plan", plan)
    arenas = {r["program"]["arena"] for r in ex["roles"]}
    numbers = {int(n) for n in re.findall(r"\b\d+\b", cu)}
    check(f"{plan}: unrolled (--no-layer-loops), the CUDA program's stage table is the C program's, and holds "
          "explain's arena bytes", cu == c and arenas <= numbers, f"explain: {sorted(arenas)}")
    lcu, lc = (STATE_FIELDS.sub("", STAGES.search(looped[t]).group(1)) for t in ("cuda", "c"))
    check(f"{plan}: with layer loops, the CUDA stage table is the C one but for its state lists, and the CUDA "
          "program allocates the unrolled program's state buffers",
          lcu == lc and lcu == STATE_FIELDS.sub("", cu) and state_allocated(looped["cuda"]) == state_allocated(unrolled["c"]),
          f"{len(state_allocated(looped['cuda']))} state buffers")
    loops = looped["cuda"].count("one loop, ")
    check(f"{plan}: the CUDA host program prints runs of layers as loops, and is smaller for it",
          loops and not unrolled["cuda"].count("one loop, ") and len(looped["cuda"]) < len(unrolled["cuda"]),
          f"{loops} loops, {len(unrolled['cuda'])} -> {len(looped['cuda'])} bytes")
    lcalls, ucalls = calls(looped["cuda"]), calls(unrolled["cuda"])
    same = [f for f in ucalls if lcalls.get(f) == ucalls[f]]
    check(f"{plan}: each CUDA phase function's loops run the unrolled calls in order, with the same events",
          len(same) == len(ucalls) == len(lcalls) and sum(len(v) for v in ucalls.values()) > 0,
          f"{len(same)} of {len(ucalls)} functions, {sum(len(v) for v in ucalls.values())} calls")

tally.finish()
