#!/usr/bin/env python3
"""tests/data: planrt's data layer and `planc data` against independent Python (docs/data.md).

1. Token files written here as each project writes them (Megatron-LM's _IndexWriter layout,
   llm.c's write_datafile header, nanoGPT's raw uint16, text) are read by planrt (data_dump) and
   every row of several steps and held-out batches is compared with this file's own reading of
   docs/data.md: windows, the epoch permutation (the Feistel network over Philox), Megatron's
   blending rule, held-out batches, random sampling, and each position's offset in its document.
2. Malformed files and too-small data are refused with a one-line cause.
3. `planc data tokenize` against a GPT-2 encoder written here from OpenAI's encoder.py (its
   pattern run by Python's re with the letter / number / White_Space classes spelled out from
   unicodedata, its byte encoder, its bpe()), on data/corpus.txt with the shipped vocabulary
   data/tok and on text with every character class the pattern distinguishes, invalid UTF-8
   included; `planc data vocab` against a BPE trainer written here; decode round trips.
Prints PASS/FAIL per check and 'N passed, N failed'.
usage: check_data.py PLANC DATA_DUMP ROOT
"""
import json
import os
import re
import struct
import subprocess
import sys
import unicodedata

planc, dump, root = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import harness  # noqa: E402  (tests/lib/harness.py)

work = harness.workdir("data")
SEED = 1234
tally = harness.Tally("data")
check = tally.check


# ---------------------------------------------------------------------------- docs/data.md, read

def philox(seed, key, counter):
    M = 0xFFFFFFFF
    k0, k1 = seed & M, (seed >> 32) & M
    c0, c1, c2, c3 = counter & M, (counter >> 32) & M, key & M, (key >> 32) & M
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M, p1 & M, ((p0 >> 32) ^ c3 ^ k1) & M, p0 & M
        k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
    return c0, c1, c2, c3


def shuffle(seed, e, j, n):
    if n <= 1:
        return 0
    h = 1
    while (1 << (2 * h)) < n:
        h += 1
    mask, x = (1 << h) - 1, j
    while True:
        L, R = x >> h, x & mask
        for r in range(4):
            L, R = R, L ^ (philox(seed, 0x7368756666000000 + 4 * e + r, R)[0] & mask)
        x = (L << h) | R
        if x < n:
            return x


def blend_pick(weights, g):
    w = [x / sum(weights) for x in weights]
    counts = [0] * len(w)
    for i in range(g + 1):
        xi = max(i, 1)
        errors = [w[d] * xi - counts[d] for d in range(len(w))]
        d = errors.index(max(errors))
        k = counts[d]
        counts[d] += 1
    return d, k


class Source:
    """tokens (the shards/documents concatenated) and the first token of every document"""
    def __init__(self, tokens, doc_starts, S, held_out):
        self.tokens, self.starts = tokens, doc_starts
        n = (len(tokens) - 1) // S
        held = max(1, n // 10) if held_out else 0
        self.windows, self.train = n, n - held

    def row(self, at, S):
        window = self.tokens[at:at + S + 1]
        offs = []
        for j in range(S):
            start = max([s for s in self.starts if s <= at + j])
            offs.append(at + j - max(start, at))
        return window, offs


def expected_rows(sources, weights, S, B, steps, evals, sampling="epochs"):
    out = []
    for t in range(steps):
        for i in range(B):
            if sampling == "random":
                src = sources[0]
                x = philox(SEED, t, i)
                at = (x[0] | x[1] << 32) % (len(src.tokens) - S - 1)
            else:
                g = t * B + i
                d, k = blend_pick(weights, g) if len(sources) > 1 else (0, g)
                src = sources[d]
                seed_d = (SEED + d * 0x9E3779B97F4A7C15) % (1 << 64)
                at = shuffle(seed_d, k // src.train, k % src.train, src.train) * S
            out.append(("t", t, i) + src.row(at, S))
    for b in range(evals):
        for i in range(B):
            g = b * B + i
            d, k = blend_pick(weights, g) if len(sources) > 1 else (0, g)
            src = sources[d]
            at = (src.train + k % (src.windows - src.train)) * S
            out.append(("e", b, i) + src.row(at, S))
    return out


def planrt_rows(vocab, S, B, steps, evals, files, sampling="epochs"):
    r = subprocess.run([dump, str(vocab), str(S), str(B), str(steps), str(evals), sampling, *files],
                       capture_output=True, text=True)
    rows = []
    for line in r.stdout.splitlines():
        if line.startswith("error:"):
            return line
        head, rest = line.split(":", 1)
        kind, a, i = head.split()
        toks, offs = rest.split("/")
        rows.append((kind, int(a), int(i), [int(x) for x in toks.split()], [int(x) for x in offs.split()]))
    return rows


# ---------------------------------------------------------------------------- writers (each project's layout)

def write_megatron(prefix, docs, dtype_code=8):
    fmt = {8: "<H", 4: "<i"}[dtype_code]
    size = struct.calcsize(fmt)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(b"".join(struct.pack(fmt, t) for t in d))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(b"".join(struct.pack("<i", len(d)) for d in docs))
        ptr = 0
        for d in docs:
            f.write(struct.pack("<q", ptr))
            ptr += len(d) * size
        f.write(b"".join(struct.pack("<q", i) for i in range(len(docs) + 1)))


def write_llmc(path, toks, u32=False):
    header = [20240801 if u32 else 20240520, 7 if u32 else 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(b"".join(struct.pack("<I" if u32 else "<H", t) for t in toks))


def lcg_tokens(n, vocab, seed):
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % vocab)
    return out


def compare(what, got, want):
    if isinstance(got, str):
        check(what, False, got)
        return
    bad = [(g, w) for g, w in zip(got, want) if (g[0], g[1], g[2], g[3], g[4]) != (w[0], w[1], w[2], list(w[3]), w[4])]
    check(what, len(got) == len(want) and not bad,
          f"{len(got)} rows against {len(want)}; first difference {bad[0] if bad else ''}")


def data_formats():
    V, S, B = 1000, 16, 8
    # Megatron: documents of uneven lengths, uint16 and int32
    docs = [lcg_tokens(n, V, 7 + n) for n in (5, 40, 3, 90, 17, 1, 60, 33, 120, 8, 44)]
    flat = [t for d in docs for t in d]
    starts = [sum(len(d) for d in docs[:i]) for i in range(len(docs))]
    write_megatron(f"{work}/meg", docs)
    write_megatron(f"{work}/meg32", docs, dtype_code=4)
    want = expected_rows([Source(flat, starts, S, False)], [1], S, B, 6, 0)
    compare("megatron uint16: epochs, windows, document offsets", planrt_rows(V, S, B, 6, 0, [f"{work}/meg"]), want)
    compare("megatron int32 (PREFIX.idx named)", planrt_rows(V, S, B, 6, 0, [f"{work}/meg32.idx"]), want)
    want = expected_rows([Source(flat, starts, S, True)], [1], S, B, 4, 3)
    compare("megatron: held-out split and evaluation batches", planrt_rows(V, S, B, 4, 3, [f"{work}/meg.bin"]), want)
    # every sample once per epoch: 2 epochs of a 21-window source in batches of 7
    small = lcg_tokens(21 * 4 + 1, V, 3)
    with open(f"{work}/small.bin", "wb") as f:
        f.write(b"".join(struct.pack("<H", t) for t in small))
    rows = planrt_rows(V, 4, 7, 6, 0, [f"{work}/small.bin"])
    starts_seen = [tuple(r[3]) for r in rows] if not isinstance(rows, str) else []
    epoch1, epoch2 = starts_seen[:21], starts_seen[21:]
    check("epochs: each of 21 windows once per epoch, another order in the next",
          len(set(epoch1)) == 21 and set(epoch1) == set(epoch2) and epoch1 != epoch2, f"{len(set(epoch1))} distinct")
    # llm.c shards by glob (uint16 and uint32), nanoGPT, text
    shards = [lcg_tokens(n, V, 11 + n) for n in (70, 55, 90)]
    for i, s in enumerate(shards):
        write_llmc(f"{work}/fw_train_{i:06d}.bin", s, u32=(i == 1))
    flat = [t for s in shards for t in s]
    want = expected_rows([Source(flat, [0, 70, 125], S, False)], [1], S, B, 5, 0)
    compare("llm.c shards (a glob, uint16 and uint32): shard boundaries are documents",
            planrt_rows(V, S, B, 5, 0, [f"{work}/fw_train_*.bin"]), want)
    nano = lcg_tokens(300, V, 5)
    with open(f"{work}/nano.bin", "wb") as f:
        f.write(b"".join(struct.pack("<H", t) for t in nano))
    compare("nanoGPT .bin", planrt_rows(V, S, B, 5, 0, [f"{work}/nano.bin"]),
            expected_rows([Source(nano, [0], S, False)], [1], S, B, 5, 0))
    text = open(f"{root}/data/corpus.txt", "rb").read()
    compare("text, random sampling (the rule before epochs)",
            planrt_rows(256, 64, 16, 3, 0, [f"{root}/data/corpus.txt"], "random"),
            expected_rows([Source(list(text), [0], 64, False)], [1], 64, 16, 3, 0, "random"))
    # a blend of three sources by Megatron's rule
    srcs = [Source(flat_of(docs), starts, S, True), Source(nano, [0], S, True), Source(flat, [0, 70, 125], S, True)]
    files = ["0.5", f"{work}/meg", "0.2", f"{work}/nano.bin", "0.3", f"{work}/fw_train_*.bin"]
    compare("a blend (0.5 / 0.2 / 0.3): Megatron's rule, each source's epochs, held-out batches",
            planrt_rows(V, S, B, 8, 2, files), expected_rows(srcs, [0.5, 0.2, 0.3], S, B, 8, 2))


def flat_of(docs):
    return [t for d in docs for t in d]


def refusals():
    V, S = 1000, 16
    cases = []
    with open(f"{work}/bad.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<QQ", 5, 6))
    open(f"{work}/bad.bin", "wb").write(b"\0" * 10)
    cases.append(("a truncated Megatron index", [f"{work}/bad"], "do not fit the index"))
    write_megatron(f"{work}/pair", [[1, 2, 3] * 20])
    open(f"{work}/pair.bin", "ab").write(b"\0\0")
    cases.append(("a .bin that is not its index's pair", [f"{work}/pair"], "are not a pair"))
    write_llmc(f"{work}/short.bin", list(range(100)))
    with open(f"{work}/short.bin", "r+b") as f:
        f.truncate(1024 + 150)
    cases.append(("a truncated llm.c shard", [f"{work}/short.bin"], "the shard is truncated"))
    write_megatron(f"{work}/big", [[5, 2000, 7] * 20])
    cases.append(("a token outside the vocabulary", [f"{work}/big"], "token 2000 at position 1"))
    write_megatron(f"{work}/tiny", [list(range(40))])
    cases.append(("fewer windows than the batch", [f"{work}/tiny"], "fewer than a step's batch of 8"))
    cases.append(("a glob that matches nothing", [f"{work}/none_*.bin"], "matches no file"))
    for what, files, needle in cases:
        r = planrt_rows(V, S, 8, 1, 0, files)
        check(f"refused: {what}", isinstance(r, str) and needle in r and "\n" not in r, r)


# ---------------------------------------------------------------------------- GPT-2's encoder, independently

def class_of(prefix):
    ranges, start = [], None
    for cp in range(0x110001):
        inside = cp < 0x110000 and unicodedata.category(chr(cp)).startswith(prefix)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append((start, cp - 1))
            start = None
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


L, N = class_of("L"), class_of("N")
WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
PAT = re.compile(f"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{WS}{L}{N}]+|[{WS}]+(?![^{WS}])|[{WS}]+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE = bytes_to_unicode()


def bpe(token, ranks):
    word = list(token)
    while len(word) > 1:
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                new.append(first + second)
                i += 2
            else:
                new.append(word[i])
                i += 1
        word = new
    return word


def pieces(raw):
    text = raw.decode("utf-8", errors="surrogateescape")
    return [p.encode("utf-8", errors="surrogateescape") for p in PAT.findall(text)]


def encode(raw, vocab, ranks):
    ids = []
    for p in pieces(raw):
        ids += [vocab[t] for t in bpe("".join(BYTE[b] for b in p), ranks)]
    return ids


def load_vocab(d):
    vocab = json.load(open(f"{d}/vocab.json", encoding="utf-8"))
    lines = open(f"{d}/merges.txt", encoding="utf-8").read().split("\n")[1:]
    ranks = {tuple(l.split(" ")): i for i, l in enumerate(x for x in lines if x)}
    return vocab, ranks


def train_reference(raw, size):
    counts = {}
    for p in pieces(raw):
        counts[p] = counts.get(p, 0) + 1
    order = sorted(range(256), key=lambda b: list(BYTE).index(b))
    tok = [BYTE[b] for b in order]
    idof = {b: i for i, b in enumerate(order)}
    words = {p: [idof[b] for b in p] for p in counts}
    merges = []
    while len(tok) < size - 1:
        pc = {}
        for p, w in words.items():
            for a, b in zip(w, w[1:]):
                pc[(a, b)] = pc.get((a, b), 0) + counts[p]
        if not pc:
            break
        best = min(pc, key=lambda ab: (-pc[ab], ab))
        new = len(tok)
        tok.append(tok[best[0]] + tok[best[1]])
        merges.append(best)
        for p, w in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[p] = out
    return tok + ["<|endoftext|>"], [(tok[a], tok[b]) for a, b in merges]


def read_u16(path):
    raw = open(path, "rb").read()
    return list(struct.unpack(f"<{len(raw) // 2}H", raw))


TORTURE = ("Don't you're we've I'm he'll she'd it's 'S 'RE O'Neil\n\n  spaces\t\ttabs\u00a0nbsp\u3000ideographic\u2028line\n"
           "Ünïcödé naïve café ΑΒΓ αβγ Кириллица 中文字符 日本語のテキスト 한국어 العربية हिन्दी\n"
           "digits 123 ٣٤٥ ⅷ ² ½ 1st 2nd x2y 3.14 -5 +7 #hash @at $4.99\n"
           "combining e\u0301 marks a\u0308 emoji 😀👍🏽 punctuation!!! ... --- ''' \"quotes\" (parens) [brackets]\n"
           "   leading and trailing   \n\n\n").encode() + b"invalid \xff\xfe bytes \xe2\x82 cut \xed\xa0\x80 surrogate\n"


def tokenizer():
    tok = f"{root}/data/tok"
    vocab, ranks = load_vocab(tok)
    corpus = open(f"{root}/data/corpus.txt", "rb").read()
    eot = vocab["<|endoftext|>"]
    for name, raw, extra in (("corpus", corpus, []), ("torture", TORTURE, [])):
        src = f"{work}/{name}.txt"
        open(src, "wb").write(raw)
        out = f"{work}/{name}_tok.bin"
        r = subprocess.run([planc, "data", "tokenize", src, "--vocab", tok, "-o", out, "--format", "nanogpt", *extra],
                           capture_output=True, text=True)
        got = read_u16(out) if r.returncode == 0 else r.stderr
        want = encode(raw, vocab, ranks) + [eot]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        check(f"planc data tokenize = GPT-2's encoder on {name} ({len(want)} tokens)", got == want,
              f"first difference at {first}: {got[first:first + 5] if first is not None else got} vs "
              f"{want[first:first + 5] if first is not None else len(want)}")
        r = subprocess.run([planc, "data", "decode", out, "--vocab", tok], capture_output=True)
        check(f"planc data decode gives {name} back", r.stdout == raw + b"<|endoftext|>", r.stderr)
    # the shipped vocabulary is what the trainer makes of data/corpus.txt (and the trainer = ours)
    r = subprocess.run([planc, "data", "vocab", f"{root}/data/corpus.txt", "--vocab-size", "512", "-o", f"{work}/v512"],
                       capture_output=True, text=True)
    same = all(open(f"{work}/v512/{f}", "rb").read() == open(f"{tok}/{f}", "rb").read()
               for f in ("vocab.json", "merges.txt")) if r.returncode == 0 else False
    check("data/tok is planc data vocab's 512 tokens of data/corpus.txt", same, r.stderr)
    toks, merges = train_reference(corpus + b"\n", 400)
    r = subprocess.run([planc, "data", "vocab", f"{root}/data/corpus.txt", "--vocab-size", "400", "-o", f"{work}/v400"],
                       capture_output=True, text=True)
    got_vocab, got_ranks = load_vocab(f"{work}/v400") if r.returncode == 0 else ({}, {})
    want_ranks = {m: i for i, m in enumerate(merges)}
    check("planc data vocab = a BPE trainer written here (400 tokens)",
          got_vocab == {t: i for i, t in enumerate(toks)} and got_ranks == want_ranks, r.stderr)
    # documents: --split-paragraphs and .jsonl give one sequence per document, each ending in <|endoftext|>
    with open(f"{work}/docs.jsonl", "w") as f:
        for t in ("first document", "second, longer document.", "third"):
            f.write(json.dumps({"text": t}) + "\n")
    r = subprocess.run([planc, "data", "tokenize", f"{work}/docs.jsonl", "--vocab", tok, "-o", f"{work}/docs"],
                       capture_output=True, text=True)
    idx = open(f"{work}/docs.idx", "rb").read() if r.returncode == 0 else b""
    lengths = list(struct.unpack("<3i", idx[34:46])) if len(idx) >= 46 else []
    want = [len(encode(t.encode(), vocab, ranks)) + 1 for t in ("first document", "second, longer document.", "third")]
    check("planc data tokenize .jsonl -> Megatron: one sequence per document", lengths == want, f"{lengths} vs {want}")
    r = subprocess.run([planc, "data", "tokenize", f"{work}/docs.jsonl", "--vocab", tok, "-o", f"{work}/docs"],
                       capture_output=True, text=True)
    check("planc data never overwrites an output", r.returncode != 0 and "exists" in r.stderr, r.stderr)


data_formats()
refusals()
tokenizer()
tally.finish()
