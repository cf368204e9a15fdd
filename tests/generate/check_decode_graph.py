"""check_decode_graph.py: the decode lowering of a model for generation (compiler/graph/decode.c,
docs/generate.md), read from `planc check --generate --dump-after=decode`.

  check_decode_graph.py PLANC REPO_ROOT

For examples/gpt.plan's model (learned positions, tied head, dropout) and examples/llama.plan's
(RoPE, grouped-query attention, untied head): one token per step (tokens i32[1, 1]), no backward,
no loss, no dropout; every fused attention a decode_attention reading the position input and its
layer's key and value caches, which hold the key/value heads only ([1, kv_heads, S, Dh]: GQA's
cache is kv_heads / heads of a multi-head one); the position table read at the position, RoPE
rotating by it; the parameters at their training shapes, so --init and checkpoints load as they
are; the same decode graph under every plan of the model. And the refusals, each a located error
with its fix: an encoder (not causal), a mixture of experts, an input other than the tokens,
attention left unfused, a loss other than next-token cross-entropy; and what planc emit writes
(decode.c beside prog.c; the LLVM back end refused).
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402

r = harness.Runner("generate_graph")
ex = f"{r.root}/examples"

OP = re.compile(r"^\s*(\d+) ([FBU]) (R )?(.*?) = (\w+)(.*)$")
VAL = re.compile(r"%(\d+):(\w+)\[([^\]]*)\]")


def decode_dump(src, plan):
    p = subprocess.run([r.planc, "check", src, "--plan", plan, "--dump-after=decode"], capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr
    ops, tail = [], None
    for line in p.stdout.splitlines():
        m = OP.match(line)
        if m:
            outs = {int(v): (t, [d.split("=")[-1] for d in dims.split(",")]) for v, t, dims in VAL.findall(m.group(4))}
            ins = [int(x) for x in re.findall(r"%(\d+)", m.group(6))]
            ops.append(dict(phase=m.group(2), kind=m.group(5), outs=outs, ins=ins, text=line))
        elif line.startswith("# decode:"):
            tail = [int(x) for x in re.findall(r"%(\d+)", line)] + [int(line.split(" of ")[1].split()[0])]
    return (ops, tail), p.stdout.split("\n# decode:")[0]


def shape_of(ops, v):
    for o in ops:
        if v in o["outs"]:
            return o["outs"][v][1]
    return None


def check_model(name, src, plans, layers, heads, kv_heads, head_dim, context, vocab, rope):
    (ops, tail), text = decode_dump(src, plans[0])
    if not r.check(f"{name}: planc check --dump-after=decode prints the decode graph", ops and tail, text[-300:]):
        return
    logits, position, rows = tail
    kinds = [o["kind"] for o in ops]
    r.check(f"{name}: forward only (no backward, optimizer, loss, dropout or targets)",
            all(o["phase"] == "F" for o in ops) and not {"cross_entropy", "dropout", "optimizer_step"} & set(kinds)
            and not any(o["kind"] == "input" and o["text"].endswith(" targets") for o in ops))
    tok = [o for o in ops if o["kind"] == "input" and o["text"].endswith(" tokens")]
    r.check(f"{name}: one token of one sequence per step", tok and list(tok[0]["outs"].values())[0][1] == ["1", "1"])
    r.check(f"{name}: the logits of the next token [1, 1, {vocab}] are the output",
            shape_of(ops, logits) == ["1", "1", str(vocab)], shape_of(ops, logits))
    r.check(f"{name}: the caches have the training context's {context} rows", rows == context, rows)
    att = [o for o in ops if o["kind"] == "decode_attention"]
    caches = [o for o in ops if o["kind"] == "kv_cache"]
    cache_shape = ["1", str(kv_heads), str(context), str(head_dim)]
    r.check(f"{name}: {layers} decode_attention, each reading the position and its layer's own k and v caches",
            len(att) == layers and not [o for o in ops if o["kind"] == "attention"]
            and all(a["ins"][3] == position for a in att)
            and len({v for a in att for v in a["ins"][4:6]}) == 2 * layers
            and {v for a in att for v in a["ins"][4:6]} == {v for c in caches for v in c["outs"]},
            [a["text"] for a in att][:2])
    r.check(f"{name}: each cache is [1, kv_heads={kv_heads}, {context}, {head_dim}] (kv heads only, {heads} query heads)",
            all(list(c["outs"].values())[0][1] == cache_shape for c in caches), caches[0]["text"] if caches else "")
    ropes = [o for o in ops if o["kind"] == "rope"]
    if rope:
        r.check(f"{name}: every rope rotates by the position input", ropes and all(o["ins"][1:] == [position] for o in ropes))
    else:
        pos_rows = [o for o in ops if o["kind"] == "embed" and o["ins"][1:] == [position]]
        wpe = [o for o in ops if o["kind"] == "param" and o["text"].endswith(" wpe")]
        r.check(f"{name}: the position table keeps its training shape [{context}, D] and is read at the position",
                pos_rows and wpe and list(wpe[0]["outs"].values())[0][1][0] == str(context)
                and pos_rows[0]["ins"][0] in wpe[0]["outs"])
    for plan in plans[1:]:
        other = decode_dump(src, plan)[1]
        r.check(f"{name}: plan {plan} gives the same decode graph as {plans[0]}", other == text)


check_model("gpt", f"{ex}/gpt.plan", ["single", "tp2", "dp2"], 4, 4, 4, 32, 64, 256, rope=False)
check_model("llama", f"{ex}/llama.plan", ["single", "tp2"], 2, 4, 2, 16, 32, 256, rope=True)

work = r.work


def refused(name, src, plan, want, fix):
    args = [r.planc, "check", src, "--generate"] + (["--plan", plan] if plan else [])
    p = subprocess.run(args, capture_output=True, text=True)
    first = p.stderr.splitlines()[0] if p.stderr else ""
    r.check(f"refused: {name}", p.returncode == 1 and re.search(r":\d+:\d+: error: ", first) and want in first
            and fix in p.stderr, p.stderr.strip()[:400])


refused("an encoder", f"{ex}/bert.plan", None, "attention is not causal", "note: generation continues a decoder")
refused("a mixture of experts", f"{ex}/moe.plan", None, "mixture of experts, which generation does not route",
        "note: generate with a dense model")
refused("an input besides the tokens", f"{ex}/gpt_docs.plan", None, "model input 'positions' has no value",
        "note: generation feeds the token input alone")
gpt = open(f"{ex}/gpt.plan").read().split("# ---- one rank")[0]
with open(f"{work}/unfused.plan", "w") as f:
    f.write(gpt + "plan u for gpt {\n  mesh data = 1\n  batch B = 16\n  attention unfused\n"
            "  optimizer adamw(lr = 3e-4)\n}\n")
refused("attention unfused", f"{work}/unfused.plan", "u", "cannot read a key/value cache",
        "note: remove `attention unfused`")
with open(f"{work}/mse.plan", "w") as f:
    f.write("import std.nn\nmodel m(V = 16, S = 8, D = 4) {\n  input tokens : i32[B, S]\n"
            "  input y : f32[B, S, D]\n  param wte : f32[V, D] ~ normal(0, 0.02)\n"
            "  loss = mse_loss(embed(wte, tokens), y)\n}\nplan p for m {\n  mesh data = 1\n  batch B = 2\n"
            "  optimizer sgd(lr = 0.1)\n}\n")
refused("a loss other than next-token cross_entropy", f"{work}/mse.plan", "p", "loss is not the cross_entropy",
        "note: generation samples from next-token logits")
p = subprocess.run([r.planc, "emit", "llvm", f"{ex}/gpt.plan", "--plan", "single", "--generate", "-o", f"{work}/ll"],
                   capture_output=True, text=True)
r.check("planc emit llvm --generate is refused: the decode program has the C back end only (exit 2)",
        p.returncode == 2 and "docs/generate.md" in p.stderr and not os.path.exists(f"{work}/ll"), p.stderr.strip())
p = subprocess.run([r.planc, "emit", "c", f"{ex}/llama.plan", "--plan", "tp2", "--generate", "-o", f"{work}/c"],
                   capture_output=True, text=True)
decode_c = open(f"{work}/c/decode.c").read() if os.path.exists(f"{work}/c/decode.c") else ""
prog_c = open(f"{work}/c/prog.c").read() if os.path.exists(f"{work}/c/prog.c") else ""
r.check("planc emit c --generate writes decode.c (the decode program) beside prog.c, which points at it",
        p.returncode == 0 and decode_c.count("planrt_decode_attention_f32(") == 2 and "planrt_decode_logits(" in decode_c
        and "int main(" not in decode_c and ".decode = &planrt_decode_program" in prog_c, p.stderr.strip())
r.finish()
