#!/usr/bin/env python3
"""tests/data/check_runs.py: what a user of the data features sees in a run (issue 22). Each check
fails without the fix it names:
  - evaluation on a data set (BERT on data/classify.safetensors): a held-out loss in the log, the
    same under dp2 as under one rank, and --eval-data; samples/s (not "tokens":0) for it; the
    classifier's accuracy in the log's JSON and the human line, equal under dp2 (rows summed over
    the data ranks) and tp2 (a class-split cross-entropy: counted once, not per rank) to one rank's
    (tests/torch/torch_reference.py checks it against PyTorch on the same weights); none for a
    regression;
  - token ids outside the embedding table in a data set (100000, -5) stop the run; a 3-sample
    data set with batch 16 is refused;
  - padding masks: with padding_mask from `lengths`, what the pad positions hold does not change
    the losses (it does without the mask, which shows the mask reaches the attention);
  - documents: gpt_docs on data/corpus_tok (Megatron, paragraphs as documents) trains differently
    from the same tokens without boundaries (nanoGPT), and identically when every window is one
    document;
  - resuming: the log keeps each step once (a dead run's rows are cut), another optimizer kind or
    another batch size is refused, a new learning rate continues with a note;
  - planc reshard -o DIR/ creates DIR, and no message has a double slash.
Prints PASS/FAIL per check and 'N passed, N failed'.
usage: check_runs.py PLANC ROOT
"""
import json
import os
import struct
import subprocess
import sys

planc, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

work = harness.workdir("data-runs")
env = harness.mpi_env()
tally = harness.Tally("data runs")
check = tally.check


def build(plan_file, plan, name):
    out = f"{work}/{name}"
    subprocess.run([planc, "build", plan_file, "--plan", plan, "-o", out], check=True, env=env, capture_output=True)
    return out


def run(prog, *args, np=1):
    cmd = (["mpirun", "-np", str(np)] if np > 1 else []) + [prog, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def log_rows(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, flat values)"""
    fmt = {"I32": "i", "I64": "q", "F32": "f"}
    header, blobs, at = {}, [], 0
    for name, (dt, shape, vals) in tensors.items():
        raw = struct.pack(f"<{len(vals)}{fmt[dt]}", *vals)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        k = {"I32": "i", "I64": "q", "F32": "f"}[info["dtype"]]
        out[name] = list(struct.unpack(f"<{(hi - lo) // struct.calcsize(k)}{k}", blob[8 + n + lo:8 + n + hi]))
    return out


def evaluation():
    data = f"{root}/data/classify.safetensors"
    single, dp2 = build(f"{root}/examples/bert.plan", "single_nodropout", "bert1"), None
    r = run(single, "--steps", "4", "--data", data, "--eval-every", "2", "--log", f"{work}/b1.jsonl")
    rows = log_rows(f"{work}/b1.jsonl")
    evals = [x["eval_loss"] for x in rows if "eval_loss" in x]
    check("--eval-every on a data set: held-out loss logged", r.returncode == 0 and len(evals) == 2, r.stderr[-300:])
    check("a data set's throughput is samples/s, no tokens field",
          rows and all("samples_per_s" in x and "tokens" not in x for x in rows) and "samples/s" in r.stderr,
          rows[:1])
    dp2 = build(f"{root}/examples/bert.plan", "dp2", "bert2")
    r2 = run(dp2, "--steps", "4", "--data", data, "--eval-every", "2", "--log", f"{work}/b2.jsonl", np=2)
    evals2 = [x["eval_loss"] for x in log_rows(f"{work}/b2.jsonl") if "eval_loss" in x]
    # bert.plan's dp2 has dropout on (training differs from single_nodropout): compare dp2 with itself
    # under one rank through its own single-rank twin instead
    single_drop = build(f"{root}/examples/bert.plan", "single", "bert1d")
    r3 = run(single_drop, "--steps", "4", "--data", data, "--eval-every", "2", "--log", f"{work}/b3.jsonl")
    evals3 = [x["eval_loss"] for x in log_rows(f"{work}/b3.jsonl") if "eval_loss" in x]
    check("the held-out loss of a data set is the same under dp2 and one rank",
          r2.returncode == 0 and len(evals2) == 2 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(evals2, evals3)),
          f"{evals2} vs {evals3} {r2.stderr[-200:]}")
    accuracy(data, r3, f"{work}/b3.jsonl", f"{work}/b2.jsonl")
    reg = build(f"{root}/tests/equiv/regress.plan", "single", "regress")
    r = run(reg, "--steps", "4", "--data", f"{root}/data/regress", "--eval-every", "2", "--log", f"{work}/r.jsonl")
    rows = [x for x in log_rows(f"{work}/r.jsonl") if "eval_loss" in x]
    check("--eval-every on regression targets (a directory of .npy); no accuracy for a regression",
          r.returncode == 0 and len(rows) == 2 and not any("eval_accuracy" in x for x in rows) and
          "accuracy" not in r.stderr, r.stderr[-300:])
    r = run(single, "--steps", "2", "--data", data, "--eval-every", "1", "--eval-data", data, "--log",
            f"{work}/b4.jsonl")
    check("--eval-data: evaluation on another file, training on all of --data",
          r.returncode == 0 and len([x for x in log_rows(f"{work}/b4.jsonl") if "eval_loss" in x]) == 2, r.stderr[-300:])


def accuracy(data, single_run, single_log, dp2_log):
    """A classifier's held-out accuracy: logged beside the loss (JSON and the human line), a
    fraction of the batches' rows, and the same under dp2 and tp2 as under one rank: the counts
    are summed over the data ranks and taken once over the class-split ranks."""
    acc1 = [x.get("eval_accuracy") for x in log_rows(single_log) if "eval_loss" in x]
    shown = [l for l in single_run.stderr.splitlines() if l.startswith("eval after step")]
    check("a classifier's evaluation logs its accuracy (JSON eval_accuracy, 'accuracy N%' on the line)",
          len(acc1) == 2 and all(a is not None and 0 <= a <= 1 for a in acc1) and len(shown) == 2 and
          all(f"accuracy {100 * a:.2f}%" in l for a, l in zip(acc1, shown)), f"{acc1} {shown}")
    rows = 4 * 16  # --eval-batches 4 (the default) of B = 16 rows: the accuracy is a count over them
    check("the accuracy counts rows (a multiple of 1/64 over 4 batches of 16)",
          acc1 and all(a is not None and abs(a * rows - round(a * rows)) < 1e-9 for a in acc1), acc1)
    acc2 = [x.get("eval_accuracy") for x in log_rows(dp2_log) if "eval_loss" in x]
    check("the held-out accuracy under dp2 equals one rank's (rows summed over the data ranks)",
          len(acc2) == 2 and acc2 == acc1, f"dp2 {acc2} vs single {acc1}")
    tp2 = build(f"{root}/examples/bert.plan", "tp2", "bert_tp2")
    r = run(tp2, "--steps", "4", "--data", data, "--eval-every", "2", "--log", f"{work}/bt.jsonl", np=2)
    acct = [x.get("eval_accuracy") for x in log_rows(f"{work}/bt.jsonl") if "eval_loss" in x]
    check("the held-out accuracy under tp2 (classes split over the ranks) equals one rank's",
          r.returncode == 0 and acct == acc1, f"tp2 {acct} vs single {acc1} {r.stderr[-200:]}")


def refusals():
    bert = f"{work}/bert1"
    ds = read_safetensors(f"{root}/data/classify.safetensors")
    n = len(ds["labels"])
    for bad in (100000, -5):
        toks = list(ds["tokens"])
        toks[5 * 32 + 3] = bad
        path = f"{work}/bad{bad}.safetensors"
        write_safetensors(path, {"tokens": ("I32", [n, 32], toks), "labels": ("I32", [n], ds["labels"])})
        r = run(bert, "--steps", "1", "--data", path)
        check(f"token id {bad} in a data set stops the run", r.returncode != 0 and
              f"token id {bad} of 'tokens' at [5, 3]" in r.stderr and "embedding table" in r.stderr, r.stderr[-300:])
    path = f"{work}/three.safetensors"
    write_safetensors(path, {"tokens": ("I32", [3, 32], ds["tokens"][:96]), "labels": ("I32", [3], ds["labels"][:3])})
    r = run(bert, "--steps", "1", "--data", path)
    check("a 3-sample data set with batch 16 is refused", r.returncode != 0 and "fewer than a step's batch of 16" in r.stderr,
          r.stderr[-300:])


def padding():
    ds = read_safetensors(f"{root}/data/classify.safetensors")
    n, S = len(ds["labels"]), 32
    lengths = [4 + (i * 7) % 28 for i in range(n)]
    losses = []
    for fill in (0, 1):
        toks = [t if j % S < lengths[j // S] else (fill * (j * 31 % 256)) for j, t in enumerate(ds["tokens"])]
        path = f"{work}/padded{fill}.safetensors"
        write_safetensors(path, {"tokens": ("I32", [n, S], toks), "labels": ("I32", [n], ds["labels"]),
                                 "lengths": ("I32", [n], lengths)})
        for plan in ("single", "nomask"):
            prog = padded if plan == "single" else nomask
            r = run(prog, "--steps", "3", "--data", path, "--log", f"{work}/p{fill}{plan}.jsonl")
            losses.append([x["loss"] for x in log_rows(f"{work}/p{fill}{plan}.jsonl")])
    check("padding_mask: pad tokens do not change the losses", losses[0] and losses[0] == losses[2], losses)
    check("without the mask they do (the mask is what hides them)", losses[1] and losses[1] != losses[3], losses)


def documents():
    docs = build(f"{root}/examples/gpt_docs.plan", "single", "docs")
    meg = run(docs, "--steps", "3", "--data", f"{root}/data/corpus_tok", "--log", f"{work}/d1.jsonl")
    # the same tokens without boundaries: a nanoGPT file
    raw = open(f"{root}/data/corpus_tok.bin", "rb").read()
    open(f"{work}/flat.bin", "wb").write(raw)
    flat = run(docs, "--steps", "3", "--data", f"{work}/flat.bin", "--log", f"{work}/d2.jsonl")
    l1 = [x["loss"] for x in log_rows(f"{work}/d1.jsonl")]
    l2 = [x["loss"] for x in log_rows(f"{work}/d2.jsonl")]
    check("document boundaries reach the model (Megatron documents vs the same tokens as one)",
          meg.returncode == 0 and flat.returncode == 0 and len(l1) == 3 and l1 != l2, f"{l1} {l2} {meg.stderr[-200:]}")
    check("data without boundaries says so once", flat.stderr.count("no document boundaries") == 1, flat.stderr[-300:])


def resume():
    gpt = build(f"{root}/examples/gpt.plan", "single", "gpt")
    data = f"{root}/data/corpus.txt"
    ck, log = f"{work}/ck", f"{work}/g.jsonl"
    run(gpt, "--steps", "6", "--data", data, "--save-every", "2", ck, "--log", log)
    r = run(gpt, "--steps", "6", "--data", data, "--resume", f"{ck}/step-00000004", "--log", log)
    steps = [x["step"] for x in log_rows(log)]
    check("a resumed run's log has every step once (the dead run's rows cut)", r.returncode == 0 and steps == list(range(6)),
          f"{steps} {r.stderr[-200:]}")
    mom = build(f"{root}/examples/gpt.plan", "single_momentum", "gptm")
    r = run(mom, "--steps", "8", "--data", data, "--resume", ck)
    check("resuming under another optimizer is refused", r.returncode != 0 and "another optimizer" in r.stderr,
          r.stderr[-300:])
    text = open(f"{root}/examples/gpt.plan").read()
    extra = """
plan single_b32 for gpt {
  mesh data = 1
  batch B = 32
  optimizer adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}

plan single_lr for gpt {
  mesh data = 1
  batch B = 16
  optimizer adamw(lr = 1e-4, betas = (0.9, 0.95), weight_decay = 0.1), clip = 1.0
}
"""
    open(f"{work}/gpt2.plan", "w").write(text.replace("import std.nn", f"import std.nn") + extra)
    b32 = build(f"{work}/gpt2.plan", "single_b32", "gpt32")
    r = run(b32, "--steps", "8", "--data", data, "--resume", ck)
    check("resuming with another batch size is refused", r.returncode != 0 and "takes 32" in r.stderr, r.stderr[-300:])
    lr = build(f"{work}/gpt2.plan", "single_lr", "gptlr")
    r = run(lr, "--steps", "8", "--data", data, "--resume", ck)
    check("a new learning rate continues, with a note saying what changed",
          r.returncode == 0 and "settings changed" in r.stderr and "lr = 0.0001" in r.stderr, r.stderr[-300:])
    r = subprocess.run([planc, "reshard", f"{root}/examples/gpt.plan", "--plan", "dp2", ck, "-o", f"{work}/new/"],
                       capture_output=True, text=True)
    check("planc reshard -o DIR/ creates DIR, no double slash",
          r.returncode == 0 and os.path.isdir(f"{work}/new") and "//" not in r.stderr, r.stderr[-300:])


def name_maps():
    llama = build(f"{root}/examples/llama.plan", "single", "llama")
    hf = f"{work}/hf.safetensors"
    r = run(llama, "--steps", "0", "--data", f"{root}/data/corpus.txt", "--map", f"{root}/stdlib/maps/hf_llama.map",
            "--save", hf)
    t = read_safetensors(hf)
    header_len = struct.unpack("<Q", open(hf, "rb").read(8))[0]
    header = json.loads(open(hf, "rb").read()[8:8 + header_len])
    name = "model.layers.0.mlp.gate_proj.weight"
    F_, D = header[name]["shape"]
    rows = [t[name][i * D:(i + 1) * D] for i in range(F_)]
    tensors = {k: ("F32", header[k]["shape"], v) for k, v in t.items()}
    tensors[name] = ("F32", [D, F_], [rows[i][j] for j in range(D) for i in range(F_)])
    write_safetensors(f"{work}/hf_t.safetensors", tensors)
    r = run(llama, "--steps", "0", "--data", f"{root}/data/corpus.txt", "--map", f"{root}/stdlib/maps/hf_llama.map",
            "--init", f"{work}/hf_t.safetensors")
    check("--map: an exactly transposed tensor says which line's T to change",
          r.returncode != 0 and "the transpose of the" in r.stderr and "T on that line" in r.stderr, r.stderr[-300:])
    renamed = open(f"{root}/stdlib/maps/hf_llama.map").read().replace("wte ", "tok_embeddings ")
    open(f"{work}/renamed.map", "w").write(renamed)
    r = run(llama, "--steps", "0", "--data", f"{root}/data/corpus.txt", "--map", f"{work}/renamed.map",
            "--init", hf)
    check("--map: a line whose planc name the model lacks is named (not 'drop the tensor')",
          r.returncode != 0 and "tok_embeddings" in r.stderr and "put the model's name for it on that line" in r.stderr,
          r.stderr[-300:])


padded = build(f"{root}/examples/bert_padded.plan", "single", "padded")
nomask_plan = open(f"{root}/examples/bert_padded.plan").read().replace(
    "nn.masked_bert_block(x, padding_mask, heads = H, ffn = F, p = P)", "nn.bert_block(x, heads = H, ffn = F, p = P)"
).replace("  input padding_mask : f32[B, 1, 1, S]\n", "")
open(f"{work}/nomask.plan", "w").write(nomask_plan)
nomask = build(f"{work}/nomask.plan", "single", "nomask")
evaluation()
refusals()
padding()
documents()
resume()
name_maps()
tally.finish()
