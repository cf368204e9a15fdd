#!/usr/bin/env python3
"""tests/context: context parallelism (nn.context_parallel, ring attention; docs/attention.md).

Every plan of tests/context/cp.plan is built (--verify-ir), trained for STEPS steps under
`mpirun -np WORLD` on data/corpus.txt and compared with its model's single-rank plan: every step's
loss within 1e-5 relative and the final weights within 1e-4 (dropout is on: the ring's blocks draw
the single rank's Philox mask at their global key positions; the Llama-style model's rope its rows' global
positions); the bf16 plans (the GPT, the Llama-style model with rope, the padded classifier)
against their bf16 single rank at tests/equiv's bf16-vs-bf16 tolerance, 2e-3 relative on every
step's loss and gradient norm, and the fp16 plans (dynamic loss scaling) against the fp16 single
rank at tests/equiv's fp16 tolerance, 2e-3 relative on every step's loss. For each run:
- the program holds the ring (ring_attention kernels, no plain attention kernel), load-balanced
  (mirrored chunks) exactly where the attention is causal and the plan does not say contiguous;
- planrt's per-kind, per-axis traffic counters equal explain's table (tests/lib/comm_bytes.py),
  and explain's sends on the ring axis are the ring's formula: per layer and step, the K and V
  blocks cp - 1 times forward, and in the backward the K and V blocks cp - 1 times plus their
  gradient sums cp times, each block B x Hkv x S/cp x Dh elements (K and V in their stored type, f32,
  bf16 or f16; the gradient sums f32);
- every rank's persistent state by kind and arena equal explain's (PLANRT_REPORT_MEMORY), and
  explain's activations per rank are the single rank's / cp, its FLOPs per rank the single rank's
  / (cp x data) (each rank attends its queries to every key block the ring brings).
Causal load balancing does what it is for: planrt's count of attention tile products and their
scores (PLANRT_REPORT_ATTENTION) is the same on every rank of the balanced cp4 and not of the
contiguous one, whose busiest rank computes more scores; explain's step estimate follows (the
busiest rank's).
The LLVM back end's llama_cp2 gives the C one's losses bit for bit.
The padded BERT-style model (an additive padding mask from the data set's lengths) gives the same
losses on cp2 whatever tokens the pad positions hold; examples/gpt_docs.plan's cp2 (a document
mask) trains as on one rank, contiguous, its ring bytes explain's, formula's and measured, and its
two ranks do the same attention work.
Then what is refused is refused (a ring that no attention takes, each with its file:line:col
error), and the CUDA target's program (planc emit cuda) calls the device shift.
usage: run_cp.py PLANC REPO_ROOT [STEPS]
"""
import json
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import comm_bytes  # noqa: E402  (tests/lib/comm_bytes.py)
import harness  # noqa: E402  (tests/lib/harness.py)

planc, root = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
env = harness.mpi_env(PLANRT_REPORT_COMM="1", PLANRT_REPORT_MEMORY="1", PLANRT_REPORT_ATTENTION="1")
work = harness.workdir("context")
tally = harness.Tally("context parallelism")
check = tally.check
src = f"{root}/tests/context/cp.plan"
# plan: its ring size, its single-rank reference, whether the ring is load-balanced (mirrored chunks)
PLANS = {"cp2": (2, "single", True), "cp4": (4, "single", True), "cp2_dp2": (2, "single", True),
         "cp2_tp2": (2, "single", True), "cp2_pp2": (2, "single", True),
         "cp2_dp2_zero1_recompute": (2, "single", True), "cp4_contiguous": (4, "single", False),
         "cp2_bf16": (2, "single_bf16", True), "cp4_bf16": (4, "single_bf16", True),
         "bert_cp2": (2, "bert_single", False),
         "llama_cp2": (2, "llama_single", True), "llama_cp4": (4, "llama_single", True),
         "padded_cp2": (2, "padded_single", False), "padded_cp4": (4, "padded_single", False),
         "cp2_fp16": (2, "single_fp16", True), "cp4_fp16": (4, "single_fp16", True),
         "llama_cp2_bf16": (2, "llama_single_bf16", True), "llama_cp4_bf16": (4, "llama_single_bf16", True),
         "padded_cp2_bf16": (2, "padded_single_bf16", False), "padded_cp4_bf16": (4, "padded_single_bf16", False)}
# tests/equiv/run_equiv.py: a bf16 plan against the single-rank bf16 plan (loss and gradient norm),
# an fp16 plan against the single-rank fp16 plan (the loss)
BF16_VS_BF16 = 2e-3
# the models' sizes (cp.plan): batch, heads, sequence, head dim, layers; cpllama's key/value heads;
# cppadded's batch and sequence
B, H, S, DH, L = 4, 4, 256, 16, 2
LLAMA_KV_HEADS = 2
PADDED_B, PADDED_S = 16, 32


def padded_data(fill):
    """data/classify.safetensors with lengths 4..31 (every third sample's keys 16.. all padding, so some
    ring blocks are all masked for it) and its pad positions holding 0 (fill 0) or other tokens (fill 1):
    a data set with lengths gives the input padding_mask (docs/data.md)"""
    path = f"{work}/padded{fill}.safetensors"
    ds = harness.read_safetensors(f"{root}/data/classify.safetensors")
    tokens = struct.unpack(f"<{len(ds['tokens'][2]) // 4}i", ds["tokens"][2])
    n = ds["labels"][1][0]
    lengths = [4 + (i * 7) % 28 for i in range(n)]
    tokens = [t if j % PADDED_S < lengths[j // PADDED_S] else fill * (j * 31 % 256) for j, t in enumerate(tokens)]
    tensors = {"tokens": ([n, PADDED_S], tokens), "labels": ([n], struct.unpack(f"<{n}i", ds["labels"][2])),
               "lengths": ([n], lengths)}
    header, at = {}, 0
    for name, (shape, vals) in tensors.items():
        header[name] = {"dtype": "I32", "shape": shape, "data_offsets": [at, at + 4 * len(vals)]}
        at += 4 * len(vals)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(struct.pack(f"<{len(v)}i", *v) for _, v in tensors.values()))
    return path


def data_of(plan):
    return padded_data(0) if plan.startswith("padded") else f"{root}/data/corpus.txt"


def train(plan, data=None):
    prog = f"{work}/{plan}"
    err = harness.build(planc, src, plan, prog, "--verify-ir", "--native")
    if err:
        return None, err
    d = harness.explain(planc, src, plan)
    log, save = f"{prog}.jsonl", f"{prog}.safetensors"
    r = harness.mpirun(d["world"], [prog, "--steps", str(steps), "--data", data or data_of(plan), "--log", log,
                                    "--save", save], env)
    if r.returncode != 0:
        return None, f"mpirun -np {d['world']} failed: {r.stderr.strip()[-400:]}"
    weights = {n: harness.as_floats(t, raw) for n, (t, _, raw) in harness.read_safetensors(save).items()}
    rows = harness.read_log(log)
    return {"losses": [x["loss"] for x in rows], "grad_norms": [x.get("grad_norm") for x in rows],
            "weights": weights, "stderr": r.stderr, "explain": d}, None


def attention_work(stderr):
    """planrt's attention counters per rank (PLANRT_REPORT_ATTENTION): {rank: (tiles forward, backward,
    scores forward, backward)}"""
    return {int(m.group(1)): tuple(int(m.group(i)) for i in range(2, 6)) for m in re.finditer(
        r"planrt: rank (\d+): attention tiles forward=(\d+) backward=(\d+) scores forward=(\d+) backward=(\d+)",
        stderr)}


def kernels(plan, path=src):
    dump = subprocess.run([planc, "check", path, "--plan", plan, "--dump-after=ring"], capture_output=True,
                          text=True).stdout
    mirrored = set(re.findall(r" (?:c\d+ )?ring_attention(?:_grad)?\(.*, (\d)\)$", dump, re.M))  # its last argument
    return (len(re.findall(r" (?:c\d+ )?ring_attention\(", dump)), len(re.findall(r" (?:c\d+ )?attention\(", dump)),
            mirrored)


def ring_sends(d, axis="ctx"):
    """explain's wire bytes per step of the sends on the ring axis, by phase (stage 0's role)"""
    out = {}
    for row in d["roles"][0]["communication"]:
        if row["collective"] == "send" and row["axis"] == axis:
            out[row["phase"]] = out.get(row["phase"], 0) + row["wire_bytes"]
    return out


def check_memory(plan, run):
    d = run["explain"]
    roles = {r["stage"]: r for r in d["roles"]}
    bad = []
    for rank, m in sorted(harness.memory_reports(run["stderr"]).items()):
        prog = roles[m["stage"]]["program"]
        if m["kinds"] != prog["state_by_kind"] or m["arena"] != prog["arena"]:
            bad.append(f"rank {rank}: state {m['kinds']} arena {m['arena']}, explain {prog['state_by_kind']} "
                       f"{prog['arena']}")
    check(f"{plan} memory = explain", not bad and harness.memory_reports(run["stderr"]),
          "; ".join(bad[:2]) if bad else f"every rank's state and {roles[0]['program']['arena']}-byte arena as explained")


refs, single_act, single_flops = {}, {}, {}
for name in ("single", "single_bf16", "single_fp16", "bert_single", "llama_single", "llama_single_bf16",
             "padded_single", "padded_single_bf16"):
    refs[name], err = train(name)
    check(f"{name} trains", refs[name] is not None, err or f"{steps} steps")
    role = harness.explain(planc, src, name)["roles"][0]
    single_act[name], single_flops[name] = role["bytes"]["activations_per_micro_batch"], role["flops_per_step"]
runs = {}
for plan, (cp, ref_name, balanced) in PLANS.items():
    ref = refs[ref_name]
    nring, nplain, mirrored = kernels(plan)
    check(f"{plan} ring", nring > 0 and nplain == 0 and mirrored == {"1" if balanced else "0"},
          f"{nring} ring attention kernels, {nplain} plain ones, mirrored chunks {sorted(mirrored)} "
          f"(want {'1: causal, balanced' if balanced else '0: contiguous'})")
    run, err = train(plan)
    runs[plan] = run
    if err or ref is None:
        check(f"{plan} trains", False, err or "no reference")
        continue
    l0, l1 = ref["losses"], run["losses"]
    worst = max(abs(a - b) / abs(a) for a, b in zip(l0, l1)) if len(l0) == len(l1) == steps else 1.0
    w0, w1 = ref["weights"], run["weights"]
    wworst = max(max(abs(a - b) for a, b in zip(w0[n], w1[n])) for n in w0) if set(w0) == set(w1) else 1.0
    half = "bf16" if "bf16" in plan else "fp16" if "fp16" in plan else None  # the storage type
    if half:
        g0, g1 = ref["grad_norms"], run["grad_norms"]
        gworst = max(abs(a - b) / abs(a) for a, b in zip(g0, g1)) if None not in g0 + g1 and len(g0) == len(g1) else 1.0
        check(f"{plan} vs {half}", worst <= BF16_VS_BF16 and (half == "fp16" or gworst <= BF16_VS_BF16),
              f"{len(l1)} steps, worst relative difference from the {half} single rank: loss {worst:.2e}, gradient "
              f"norm {gworst:.2e} (tolerance {BF16_VS_BF16:g}{' on the loss' if half == 'fp16' else ''}); "
              f"weights {wworst:.2e} absolute")
    else:
        check(f"{plan} losses", worst <= 1e-5, f"{len(l1)} steps, worst relative difference {worst:.2e} (tolerance 1e-5)")
        check(f"{plan} weights", wworst <= 1e-4, f"worst absolute difference {wworst:.2e} (tolerance 1e-4)")
    bad, total = comm_bytes.mismatches(run["explain"], run["stderr"], steps)
    check(f"{plan} bytes", not bad, "; ".join(bad[:2]) if bad else f"{total} bytes measured, equal to explain's")
    d = run["explain"]
    data = d["mesh"].get("data", 1) if "data" in d["mesh"] else 1
    heads = (LLAMA_KV_HEADS if plan.startswith("llama") else H) // d["mesh"].get("tensor", 1)  # K/V heads
    stages = d["mesh"].get("pipe", 1)
    b, seq = (PADDED_B, PADDED_S) if plan.startswith("padded") else (B, S)
    block = (b // data) * heads * (seq // cp) * DH * 4  # f32 bytes
    kv = block // 2 if half else block  # K and V travel in their stored type
    recompute = 2 * (cp - 1) * kv * L // stages if "recompute" in plan else 0  # the forward again
    want = {"forward": L // stages * 2 * (cp - 1) * kv,
            "backward": L // stages * (2 * (cp - 1) * kv + 2 * cp * block)}
    if recompute:
        want["recompute"] = recompute
    got = ring_sends(d)
    check(f"{plan} ring bytes", got == want, f"explain's sends on ctx per step {got}, the ring's formula {want}")
    check_memory(plan, run)
    # the padded classifier keeps a little whole on every rank (the padding mask, the pooled rows and
    # the classifier head after them): its share is 1/cp within 1%, the token models' exactly
    slack = 1e-2 if plan.startswith("padded") else 0
    if stages == 1 and "tensor" not in d["mesh"] and "recompute" not in plan:
        flops = d["roles"][0]["flops_per_step"]
        # explain's JSON prints FLOPs to 6 significant digits
        want_flops = single_flops[ref_name]
        check(f"{plan} FLOPs 1/(cp x data)", abs(flops * cp * data - want_flops) <= max(1e-5, slack) * want_flops,
              f"{flops:.6g} per rank, the single rank's {want_flops:.6g} / {cp * data} (the ring visits every key block)")
    if stages == 1 and data == 1 and "tensor" not in d["mesh"]:
        act = d["roles"][0]["bytes"]["activations_per_micro_batch"]
        check(f"{plan} activations 1/cp", abs(act * cp - single_act[ref_name]) <= slack * single_act[ref_name],
              f"{act} bytes per rank, the single rank's {single_act[ref_name]} / {cp}" + (" (within 1%)" if slack else ""))

# causal load balancing: every rank of the balanced ring does the same attention tile products (and
# scores: the products' sizes), the contiguous ring's last rank the most; explain's step is the
# busiest rank's
counts = {plan: attention_work(runs[plan]["stderr"]) if runs.get(plan) else {} for plan in ("cp4", "cp4_contiguous")}
bal, con = counts["cp4"], counts["cp4_contiguous"]
check("cp4 balanced: equal attention work per rank", len(bal) == 4 and len(set(bal.values())) == 1,
      f"per rank (tiles forward, backward, scores forward, backward): {dict(sorted(bal.items()))}")
busiest = lambda w, i: max(v[i] for v in w.values()) if w else 0  # noqa: E731
check("cp4 contiguous: unequal, its busiest rank computes more scores",
      len(con) == 4 and len({v[2:] for v in con.values()}) == 4 and busiest(con, 2) > busiest(bal, 2)
      and busiest(con, 3) > busiest(bal, 3),
      f"per rank {dict(sorted(con.items()))}; busiest rank's scores forward {busiest(con, 2)} vs balanced "
      f"{busiest(bal, 2)}, backward {busiest(con, 3)} vs {busiest(bal, 3)}")
if runs.get("cp4") and runs.get("cp4_contiguous"):
    est = {plan: runs[plan]["explain"]["estimated_step_s"]["step"] for plan in ("cp4", "cp4_contiguous")}
    check("explain: the balanced step is shorter", est["cp4"] < est["cp4_contiguous"],
          f"estimated step {est['cp4']:.4g} s balanced, {est['cp4_contiguous']:.4g} s contiguous")

# the padding mask is what hides the pad tokens on the ring too: other tokens there, the same losses
if runs.get("padded_cp2"):
    prog = f"{work}/padded_cp2"
    r = harness.mpirun(2, [prog, "--steps", str(steps), "--data", padded_data(1), "--log", f"{prog}_fill1.jsonl"], env)
    losses = [x["loss"] for x in harness.read_log(f"{prog}_fill1.jsonl")] if r.returncode == 0 else None
    check("padded_cp2: pad tokens do not change the losses", losses == runs["padded_cp2"]["losses"],
          f"{steps} losses equal with other tokens at the pad positions" if losses == runs["padded_cp2"]["losses"]
          else f"{losses} vs {runs['padded_cp2']['losses']}")

# document masks (examples/gpt_docs.plan's cp2: an additive [B, 1, S, S] mask from the data's
# document boundaries, its query rows split like q, its key columns whole) on a cp2 ring against one
# rank. The mask is causal in its data, not in the graph: the attention's mask kind is additive, whose
# tiles the kernel all computes, so the contiguous ring gives both ranks the same work (measured) and
# the compiler keeps it contiguous (docs/attention.md)
docs_src = f"{root}/examples/gpt_docs.plan"
docs_runs = {}
for plan in ("single", "cp2"):
    prog = f"{work}/gpt_docs_{plan}"
    err = harness.build(planc, docs_src, plan, prog, "--native")
    d = harness.explain(planc, docs_src, plan)
    r = None if err else harness.mpirun(d["world"], [prog, "--steps", str(steps), "--data", f"{root}/data/corpus_tok",
                                                    "--log", f"{prog}.jsonl"], env)
    ok = r is not None and r.returncode == 0
    docs_runs[plan] = {"losses": [x["loss"] for x in harness.read_log(f"{prog}.jsonl")] if ok else [],
                       "stderr": r.stderr if r is not None else err, "explain": d}
l0, l1 = docs_runs["single"]["losses"], docs_runs["cp2"]["losses"]
worst = max(abs(a - b) / abs(a) for a, b in zip(l0, l1)) if len(l0) == len(l1) == steps else 1.0
check("gpt_docs cp2 (document mask) losses", worst <= 1e-5,
      f"{len(l1)} steps, worst relative difference {worst:.2e} from one rank (tolerance 1e-5)")
nring, nplain, mirrored = kernels("cp2", docs_src)
check("gpt_docs cp2 ring", nring > 0 and nplain == 0 and mirrored == {"0"},
      f"{nring} ring attention kernels, {nplain} plain ones, mirrored chunks {sorted(mirrored)} (want 0: an additive "
      f"mask keeps the ring contiguous)")
bad, total = comm_bytes.mismatches(docs_runs["cp2"]["explain"], docs_runs["cp2"]["stderr"], steps)
check("gpt_docs cp2 bytes", not bad, "; ".join(bad[:2]) if bad else f"{total} bytes measured, equal to explain's")
docs_block = 16 * H * (64 // 2) * (64 // H) * 4  # examples/gpt_docs.plan: B = 16, S = 64, D = 64, f32
want = {"forward": 2 * 2 * 1 * docs_block, "backward": 2 * (2 * 1 * docs_block + 2 * 2 * docs_block)}
got = ring_sends(docs_runs["cp2"]["explain"])
check("gpt_docs cp2 ring bytes", got == want, f"explain's sends on ctx per step {got}, the ring's formula {want}")
work_docs = attention_work(docs_runs["cp2"]["stderr"])
check("gpt_docs cp2: the contiguous ring's ranks do equal attention work",
      len(work_docs) == 2 and len(set(work_docs.values())) == 1,
      f"per rank (tiles forward, backward, scores forward, backward): {dict(sorted(work_docs.items()))}")

# the LLVM back end runs the same ring (and rope's two chunk offsets) bit for bit as the C one
if runs.get("llama_cp2"):
    prog = f"{work}/llama_cp2_llvm"
    err = harness.build(planc, src, "llama_cp2", prog, "--backend", "llvm", "--native")
    r = None if err else harness.mpirun(2, [prog, "--steps", str(steps), "--data", f"{root}/data/corpus.txt", "--log",
                                            f"{prog}.jsonl"], env)
    losses = [x["loss"] for x in harness.read_log(f"{prog}.jsonl")] if r is not None and r.returncode == 0 else None
    check("llama_cp2 LLVM = C", losses == runs["llama_cp2"]["losses"],
          err or (f"{steps} losses bit for bit" if losses == runs["llama_cp2"]["losses"] else f"LLVM {losses}"))

# what is refused
text = open(src).read()
model = text[:text.index("plan single")]
cases = {
    "unfused": ("plan p for cpgpt {\n  mesh ctx = 2\n  batch B = 4\n  attention unfused\n"
                "  use nn.context_parallel(ctx)\n}\n", "applies to no attention"),
    "layout": ("plan p for cpgpt {\n  mesh ctx = 2\n  batch B = 4\n  shard S -> ctx\n"
               "  shard ring_attention(striped) -> ctx\n}\n", "'ring_attention' takes one layout: balanced or contiguous"),
    "ulysses": ("plan p for cpgpt {\n  mesh ctx = 2\n  batch B = 4\n  use nn.ulysses(ctx)\n"
                "  shard ring_attention -> ctx\n}\n", "applies to no attention"),
}
for name, (plan_text, want) in cases.items():
    path = f"{work}/refuse_{name}.plan"
    open(path, "w").write(model + plan_text)
    r = subprocess.run([planc, "check", path, "--plan", "p"], capture_output=True, text=True)
    located = re.search(r"refuse_%s\.plan:\d+:\d+: error: " % name, r.stderr)
    check(f"refused: {name}", r.returncode != 0 and want in r.stderr and located,
          r.stderr.strip().splitlines()[0] if r.stderr.strip() else "accepted")
# the CUDA target takes the ring (a device shift, device mirrored conversions; tests/cuda builds it):
# its program calls the device shift and names the ring's axis for the device comm layer's channels
r = subprocess.run([planc, "emit", "cuda", src, "--plan", "cp2", "-o", f"{work}/cp2_cuda"], capture_output=True, text=True)
cuda_prog = open(f"{work}/cp2_cuda/prog.c").read() if r.returncode == 0 else ""
check("CUDA target: the ring's device shift", "planrt_cu_ring_shift_start(" in cuda_prog and ".ring_axes = 0x1u" in cuda_prog,
      f"{cuda_prog.count('planrt_cu_ring_shift_start(')} device shifts, ring_axes 0x1" if cuda_prog else r.stderr.strip()[:300])
tally.finish()
