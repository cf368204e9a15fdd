#!/bin/sh
# A generated program facing bad input: a wrong world size, missing / empty / malformed data,
# a missing, truncated or malformed --init file, a tensor of the wrong shape or dtype, an unusable
# --save path, unknown options, a bad --map (name map) or an --init file it does not fit (a tensor
# stored transposed: "add T on that line"). Each
# must end every rank with a non-zero exit and a one-line cause (no hang: every run has a time limit) and must not leave a partial output file.
# usage: tests/program/run_program_errors.sh PLANC (from the repository root)
planc=$1
. "$(dirname "$0")/../lib/harness.sh"
# Every refusal here comes before the first step, on every rank. When the first rank to refuse
# aborts the job, Open MPI's daemon sends SIGTERM to the ranks still running and then waits
# odls_base_sigkill_timeout seconds (default 1) before SIGKILL unless they are gone already: about
# half of these runs waited that second (15 s of the test's 29). No output or checkpoint is in
# flight to clean up before step 1, so the wait is spent on nothing this test checks.
export OMPI_MCA_odls_base_sigkill_timeout=0

# The programs are built as tests/equiv and check_outputs.py build them (the plan by its absolute
# path, --native), so the compile cache (tests/lib/cc_cache.sh) compiles each once for all of them;
# what is checked here (the refusals) is the same at every instruction-set level.
# expect_fail runs $PROG: the MLP's first
"$planc" build "$PWD/examples/mlp.plan" --plan dp2 -o "$tmp/prog" --native || { echo "FAIL: build"; exit 1; }
PROG=$tmp/prog

data=data/corpus.txt
expect_fail "world size" "built for 2 ranks" 3 --steps 1 --data $data
expect_fail "missing --steps" "--steps and --data are required" 2 --data $data
expect_fail "bad --steps" "--steps needs a non-negative integer" 2 --steps ten --data $data
expect_fail "unknown option" "unknown option --lr" 2 --steps 1 --data $data --lr 3
expect_fail "missing data" "no/such/file" 2 --steps 1 --data no/such/file
: >"$tmp/empty.txt"
expect_fail "empty data" "empty.txt" 2 --steps 1 --data "$tmp/empty.txt"
expect_fail "data is a directory" "directory" 2 --steps 1 --data data
printf '\001\002\003' >"$tmp/odd.bin"
expect_fail "truncated token file" "odd.bin" 2 --steps 1 --data "$tmp/odd.bin"
expect_fail "missing --init" "no/such.safetensors" 2 --steps 1 --data $data --init no/such.safetensors
head -c 5000 /dev/urandom >"$tmp/random.safetensors"
expect_fail "malformed --init" "random.safetensors" 2 --steps 1 --data $data --init "$tmp/random.safetensors"
# a good checkpoint, then damaged copies of it
timeout 60 mpirun -np 2 "$tmp/prog" --steps 0 --data $data --save "$tmp/good.safetensors" >/dev/null 2>&1
head -c 3000 "$tmp/good.safetensors" >"$tmp/truncated.safetensors"
expect_fail "truncated --init" "truncated.safetensors" 2 --steps 1 --data $data --init "$tmp/truncated.safetensors"
python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
def write(path, tensors):
    header, blobs, at = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs += raw
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blobs)
blob = open(f"{d}/good.safetensors", "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
tensors = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    lo, hi = info["data_offsets"]
    tensors[name] = (info["dtype"], info["shape"], blob[8 + n + lo:8 + n + hi])
shape = dict(tensors)
name = sorted(shape)[0]
dt, sh, raw = shape[name]
shape[name] = (dt, [sh[0] * 2] + sh[1:], raw + raw)
write(f"{d}/shape.safetensors", shape)
dtype = dict(tensors)
dtype[name] = ("I32", sh, raw)
write(f"{d}/dtype.safetensors", dtype)
missing = dict(tensors)
del missing[name]
write(f"{d}/missing.safetensors", missing)
open(f"{d}/first_name", "w").write(name)
PY
tensor=$(cat "$tmp/first_name")
expect_fail "wrong shape in --init" "$tensor" 2 --steps 1 --data $data --init "$tmp/shape.safetensors"
expect_fail "wrong dtype in --init" "I32" 2 --steps 1 --data $data --init "$tmp/dtype.safetensors"
expect_fail "missing tensor in --init" "$tensor" 2 --steps 1 --data $data --init "$tmp/missing.safetensors"
expect_fail "unwritable --save" "no/such/dir" 2 --steps 1 --data $data --save no/such/dir/out.safetensors
if ls no/such/dir 2>/dev/null || ls "$tmp"/*.tmp* 2>/dev/null; then
	bad "a partial output file was left behind"
else
	ok
fi
# and the good checkpoint loads back: --init then --save gives the same bytes
timeout 60 mpirun -np 2 "$tmp/prog" --steps 0 --data $data --init "$tmp/good.safetensors" --save "$tmp/again.safetensors" >/dev/null 2>&1
if cmp -s "$tmp/good.safetensors" "$tmp/again.safetensors"; then ok; else bad "--init/--save round trip"; fi
# data sets of named tensors (examples/bert.plan: tokens i32 [B, 32], labels i32 [B] over 4 classes)
"$planc" build "$PWD/examples/bert.plan" --plan single -o "$tmp/bert" --native || { echo "FAIL: build bert"; exit 1; }
PROG=$tmp/bert
python3 scripts/classify_data.py $data "$tmp/five.safetensors" 64 32 5
expect_fail "label outside the classes" "label 4 of 'labels' at \\[" 1 --steps 1 --data "$tmp/five.safetensors"
python3 scripts/classify_data.py $data "$tmp/short.safetensors" 64 16
expect_fail "data set sample shape" "tensor 'tokens' has shape \\[64, 16\\] but input 'tokens' needs \\[64, 32\\]" 1 \
	--steps 1 --data "$tmp/short.safetensors"
python3 scripts/classify_data.py $data "$tmp/npy" 64 32
rm "$tmp/npy/labels.npy"
expect_fail "data set without an input" "has no tensor 'labels'" 1 --steps 1 --data "$tmp/npy"
expect_fail "one .npy file" "one .npy file" 1 --steps 1 --data "$tmp/npy/tokens.npy"
python3 scripts/regress_data.py "$tmp/floats" 48 32
mv "$tmp/floats/x.npy" "$tmp/npy/labels.npy"
expect_fail "data set sample counts" "samples but" 1 --steps 1 --data "$tmp/npy"
python3 scripts/regress_data.py "$tmp/floats" 64 32
mv "$tmp/floats/x.npy" "$tmp/npy/tokens.npy"
python3 scripts/classify_data.py $data "$tmp/ints" 64 32
mv "$tmp/ints/labels.npy" "$tmp/npy/labels.npy"
expect_fail "float data for an i32 input" "holds <f8 but input 'tokens' is i32" 1 --steps 1 --data "$tmp/npy"
expect_fail "token file for named inputs" "but input 'labels' is i32 \\[16\\]" 1 --steps 1 --data $data
# hostile .npy headers: a shape whose byte count overflows 64 bits (2^62 samples of 32 i32 tokens:
# the product wrapped to 0 bytes, the files were taken and the first batch read past the mapping),
# and an unknown version (its error read the header after unmapping it): one-line errors
python3 - "$tmp/wrap" "$tmp/version" <<'PY'
import os
import sys


def npy(path, descr, shape, data=b"", version=1):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * (-(len(h) + 11) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY" + bytes([version, 0]) + len(h).to_bytes(2, "little") + h.encode() + data)


wrap, version = sys.argv[1:3]
for d in (wrap, version):
    os.makedirs(d, exist_ok=True)
npy(f"{wrap}/tokens.npy", "<i4", "(%d, 32)" % (1 << 62))
npy(f"{wrap}/labels.npy", "<i4", "(%d,)" % (1 << 62))
npy(f"{version}/tokens.npy", "<i4", "(64, 32)", bytes(64 * 32 * 4), version=4)
npy(f"{version}/labels.npy", "<i4", "(64,)", bytes(64 * 4))
PY
expect_fail "a .npy shape whose bytes overflow" "needs more data than the file's 0 bytes" 1 --steps 1 --data "$tmp/wrap"
expect_fail "a .npy of an unknown version" ".npy version 4 is not known" 1 --steps 1 --data "$tmp/version"
# a 4-class token classifier on byte tokens: never trains silently on targets in 0..255
printf '%s\n' 'model tok4(V = 256, S = 16, D = 32, C = 4) {' '  input tokens : i32[B, S]' \
	'  input targets : i32[B, S]' '  param wte : f32[V, D] ~ normal(0, 0.02)' '  param w : f32[D, C] ~ normal(0, 0.02)' \
	'  loss = cross_entropy(embed(wte, tokens) @ w, targets)' '}' 'plan single for tok4 {' '  mesh data = 1' \
	'  batch B = 8' '}' >"$tmp/tok4.plan"
"$planc" build "$tmp/tok4.plan" -o "$tmp/tok4" --native || { echo "FAIL: build tok4"; exit 1; }
PROG=$tmp/tok4
expect_fail "token targets outside the classes" "a label of a cross_entropy over 4 classes, outside \\[0, 4)" 1 \
	--steps 1 --data $data
# --map: checkpoints under Hugging Face's Llama names (examples/llama.plan, stdlib/maps)
"$planc" build "$PWD/examples/llama.plan" --plan single -o "$tmp/llama" --native || { echo "FAIL: build llama"; exit 1; }
PROG=$tmp/llama
timeout 60 "$PROG" --steps 0 --data $data --save "$tmp/hf.safetensors" --map stdlib/maps/hf_llama.map >/dev/null 2>&1
expect_fail "Hugging Face file without --map" "pass --map NAMES.map, e.g. stdlib/maps/hf_llama.map" 1 --steps 1 \
	--data $data --init "$tmp/hf.safetensors"
expect_fail "missing --map" "cannot open --map 'no/such.map'" 1 --steps 1 --data $data --init "$tmp/hf.safetensors" \
	--map no/such.map
expect_fail "--map alone" "--map applies to --init and --save" 1 --steps 1 --data $data --map stdlib/maps/hf_llama.map
printf 'wte model.embed_tokens.weight T cat extra\n' >"$tmp/long.map"
expect_fail "malformed --map line" "line 1: expected 'PLANC_NAME FILE_NAME \[T\] \[cat\]'" 1 --steps 1 --data $data \
	--init "$tmp/hf.safetensors" --map "$tmp/long.map"
printf '# norms\nlayers.{i}.llama_block.rmsnorm.weight model.layers.{i}.input_layernorm.weight T\n' >"$tmp/t1d.map"
expect_fail "--map transposes a 1-D tensor" "line 2 transposes 'layers.0.llama_block.rmsnorm.weight', which has 1 dims" \
	1 --steps 1 --data $data --init "$tmp/hf.safetensors" --map "$tmp/t1d.map"
printf 'wte embed\nlm_head embed T\n' >"$tmp/twice.map"
expect_fail "--map gives two parameters one name" "parameters 'wte' and 'lm_head' both map to 'embed'" 1 --steps 1 \
	--data $data --init "$tmp/hf.safetensors" --map "$tmp/twice.map"
sed 's/\(self_attn.k_proj.weight *\)T/\1/' stdlib/maps/hf_llama.map >"$tmp/no_t.map"
expect_fail "--map without a needed T" "'model.layers.0.self_attn.k_proj.weight' is \[32, 64\], the transpose of the \[64, 32\] that line 10 of --map '.*' reads for 'layers.0.llama_block.gqa_attention.wk'; add T on that line" 1 \
	--steps 1 --data $data --init "$tmp/hf.safetensors" --map "$tmp/no_t.map"
python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
blob = open(f"{d}/hf.safetensors", "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
tensors = {k: (v["dtype"], v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
           for k, v in header.items() if k != "__metadata__"}
def write(path, extra):
    header, blobs, at = {}, b"", 0
    for name, (dtype, shape, raw) in {**tensors, **extra}.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        blobs += raw
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blobs)
write(f"{d}/bias.safetensors", {"model.layers.1.self_attn.q_proj.bias": ("F32", [64], b"\0" * 256)})
write(f"{d}/inv_freq.safetensors", {"model.layers.1.self_attn.rotary_emb.inv_freq": ("F32", [8], b"\0" * 32)})
PY
expect_fail "--init tensor no parameter reads" "holds 'model.layers.1.self_attn.q_proj.bias', which no parameter" 1 \
	--steps 1 --data $data --init "$tmp/bias.safetensors" --map stdlib/maps/hf_llama.map
# and a good one loads (the map's '- ...inv_freq' line leaves that tensor unread) and saves back the same bytes
timeout 60 "$PROG" --steps 0 --data $data --init "$tmp/inv_freq.safetensors" --map stdlib/maps/hf_llama.map \
	--save "$tmp/hf_again.safetensors" >"$tmp/out" 2>&1
if cmp -s "$tmp/hf.safetensors" "$tmp/hf_again.safetensors"; then ok; else
	bad "--init/--save round trip under --map hf_llama.map"; show_output; fi
finish "program errors"
