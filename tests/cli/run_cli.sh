#!/bin/sh
# Command-line behaviour: every example checks clean, --help / --version work,
# usage errors exit 2, hostile inputs (a directory, a missing file, NUL bytes, random bytes) are
# refused with a one-line cause and exit 1, --dump-after prints the IR after every pass (and the
# generated C after emit), --verify-ir checks the loop-level IR of every example plan, and
# features that planc build does not execute yet are refused by name instead of ignored.
# usage: tests/cli/run_cli.sh PLANC (from the repository root)
planc=$1
. "$(dirname "$0")/../lib/harness.sh"

# (gpt7b and gpt175b are left to explain_goldens_large, which explains, and so checks, each of
# their plans: checking them here too was a third of this test's time)
for f in examples/*.plan; do
	case $f in examples/gpt7b.plan | examples/gpt175b.plan) continue ;; esac
	expect "check $f" 0 "" -- "$planc" check "$f"
done
expect "help" 0 "usage: planc" -- "$planc" --help
expect "version" 0 "planc 0" -- "$planc" --version
expect "no command" 2 "usage" -- "$planc"
expect "unknown command" 2 "unknown command 'frobnicate'" -- "$planc" frobnicate x.plan
expect "unknown option" 2 "unknown option '--bogus'" -- "$planc" check examples/gpt.plan --bogus
expect "unknown pass" 2 "unknown pass 'nope'" -- "$planc" check examples/gpt.plan --dump-after=nope
expect "missing file" 1 "cannot open 'no/such.plan'" -- "$planc" check no/such.plan
expect "directory" 1 "is a directory" -- "$planc" check examples
printf 'model m() {\0}\n' >"$tmp/nul.plan"
expect "NUL bytes" 1 "holds NUL bytes" -- "$planc" check "$tmp/nul.plan"
head -c 4096 /dev/urandom | tr -d '\000' >"$tmp/random.plan"
expect "random bytes" 1 "error" -- "$planc" check "$tmp/random.plan"
expect "unknown plan" 1 "no plan named 'nope'" -- "$planc" explain examples/gpt.plan --plan nope
expect "build needs -o" 2 "'build' needs -o PATH" -- "$planc" build examples/gpt.plan
expect "build refuses offload to host" 1 "the CPU target has none to free" -- "$planc" build examples/gpt.plan --plan zero3_offload -o "$tmp/off"
expect "build experts" 0 "" -- "$planc" build examples/moe.plan --plan ep2 -o "$tmp/ep2"
expect "emit cuda moe" 0 "" -- "$planc" emit cuda examples/moe.plan --plan mixtral_ep2 -o "$tmp/moe_cuda_src"
if grep -q "planrt_cu_moe_exchange(" "$tmp/moe_cuda_src/prog.c" && grep -q "planrt_cu_k_moe_route_f32(" "$tmp/moe_cuda_src/prog.c"; then ok; else bad "the CUDA mixtral_ep2 program does not route and exchange on the device"; fi
expect "emit cuda top_k 32" 0 "" -- "$planc" emit cuda tests/cuda/moe_top_k.plan --plan top32 -o "$tmp/top32"
expect "emit cuda refuses top_k 33" 1 "moe_top_k.plan:9:11: error: planc build --target cuda routes a token to at most 32 experts (top_k = 33)" -- "$planc" emit cuda tests/cuda/moe_top_k.plan --plan top33 -o "$tmp/top33"
expect "expert_parallel finds experts by any name" 0 "layers.1.sparse_ffn: 4 experts, top 1" -- "$planc" explain tests/equiv/moe_names.plan --plan ep2
expect "expert_parallel splits them" 0 "experts split over 'data'" -- "$planc" explain tests/equiv/moe_names.plan --plan ep2
expect "build local sgd" 0 "" -- "$planc" build examples/gpt.plan --plan dp4_local_sgd -o "$tmp/ls"
# a plan without a mesh is one rank: the C back end printed an empty enum for its axes, which no C
# compiler takes; both back ends build it, and it trains
cp examples/mlp.plan "$tmp/nomesh.plan"
printf '\nplan nomesh for mlp {\n  batch B = 32\n  optimizer adamw(lr = 1e-3)\n}\n' >>"$tmp/nomesh.plan"
expect "build a plan without a mesh" 0 "" -- "$planc" build "$tmp/nomesh.plan" --plan nomesh -o "$tmp/nomesh"
expect "it trains on one rank" 0 "step 2/2" -- env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	"$tmp/nomesh" --steps 2 --data data/corpus.txt
expect "build it through LLVM" 0 "" -- "$planc" build "$tmp/nomesh.plan" --plan nomesh --backend llvm -o "$tmp/nomesh_llvm"
expect "run help" 0 "Trains plan dp2 of model gpt" -- "$planc" run examples/gpt.plan --plan dp2 --help
expect "run needs a file" 2 "'run' needs a FILE" -- "$planc" run
expect "run refuses offload to host" 1 "the CPU target has none to free" -- "$planc" run examples/gpt.plan --plan zero3_offload --steps 1 --data data/corpus.txt
expect "build llvm refuses offload to host" 1 "the CPU target has none to free" -- "$planc" build examples/gpt.plan --plan zero3_offload --backend llvm -o "$tmp/off"
expect "bad backend" 2 "--backend takes 'c' or 'llvm'" -- "$planc" build examples/gpt.plan --backend gcc -o "$tmp/x"
expect "backend is for build" 2 "--backend applies to 'build'" -- "$planc" check examples/gpt.plan --backend llvm
expect "emit llvm" 0 "" -- "$planc" emit llvm examples/mlp.plan --plan dp2 -o "$tmp/emit_ll"
if grep -q "call void @planrt_allreduce_inplace(i8\* %grad_bucket" "$tmp/emit_ll/prog.ll"; then ok; else bad "emitted LLVM dp2 program has no gradient bucket"; fi
expect "dump-after=emit llvm" 0 "define i32 @main(i32 %0, i8\*\* %1)" -- "$planc" emit llvm examples/mlp.plan --plan dp2 -o "$tmp/emit_ll2" --dump-after=emit
expect "emit c" 0 "" -- "$planc" emit c examples/mlp.plan --plan dp2 -o "$tmp/emit"
if grep -q "planrt_allreduce_inplace(grad_bucket" "$tmp/emit/prog.c"; then ok; else bad "emitted dp2 program has no gradient bucket"; fi
expect "emit unknown target" 2 "emit supports the targets c, llvm, ptx and cuda" -- "$planc" emit wasm examples/mlp.plan --plan dp2 -o "$tmp/x"
for pass_name in graph pipeline autodiff shard recompute zero sync lower state overlap offload_params offload_activations memplan check streams; do
	expect "dump-after=$pass_name" 0 "IR after $pass_name" -- "$planc" check examples/gpt.plan --plan gpt_3d --dump-after=$pass_name
done
expect "dump-after=emit" 0 "planrt_main(argc, argv, &program)" -- "$planc" emit c examples/mlp.plan --plan dp2 -o "$tmp/emit2" --dump-after=emit
expect "verify-ir" 0 "" -- "$planc" check examples/gpt.plan --verify-ir
expect "explain text" 0 "communication per step" -- "$planc" explain examples/gpt.plan --plan dp2_tp2
expect "explain json" 0 '"model_flops_per_step"' -- "$planc" explain examples/gpt.plan --plan dp2_tp2 --json
cp examples/mlp.plan "$tmp/w.plan"
"$planc" fmt "$tmp/w.plan" >"$tmp/expected"
expect "fmt -w" 0 "" -- "$planc" fmt -w "$tmp/w.plan"
if cmp -s "$tmp/w.plan" "$tmp/expected"; then ok; else bad "fmt -w result"; fi

# ---- hostile inputs and outputs (issue 12): refused before any work, nothing left behind
: >"$tmp/empty.plan"
expect "empty plan file" 1 "is empty: it defines no model and no plan" -- "$planc" check "$tmp/empty.plan"
printf '# only a comment\nimport std.nn\n' >"$tmp/nothing.plan"
expect "plan file defining nothing" 1 "defines no model and no plan" -- "$planc" check "$tmp/nothing.plan"
mkfifo "$tmp/fifo.plan"
expect "FIFO as the plan" 1 "is a FIFO, not a regular file" -- timeout 10 "$planc" check "$tmp/fifo.plan"
cp examples/mlp.plan "$tmp/src.plan"
expect "build -o the plan itself" 1 "is the plan file" -- "$planc" build "$tmp/src.plan" --plan dp2 -o "$tmp/src.plan"
if cmp -s "$tmp/src.plan" examples/mlp.plan; then ok; else bad "build -o overwrote the plan"; fi
ln "$tmp/src.plan" "$tmp/hardlink"
expect "build -o a hard link to the plan" 1 "is the plan file" -- "$planc" build "$tmp/src.plan" --plan dp2 -o "$tmp/hardlink"
ln -s "$PWD/stdlib/nn.plan" "$tmp/nn-link"
expect "build -o a link to an imported module" 1 "is the imported module" -- "$planc" build examples/mlp.plan --plan dp2 -o "$tmp/nn-link"
expect "build -o another .plan" 1 "names a .plan source" -- "$planc" build examples/mlp.plan --plan dp2 -o "$tmp/other.plan"
expect "build -o a directory" 1 "is a directory" -- "$planc" build examples/mlp.plan --plan dp2 -o "$tmp"
expect "build -o in a missing directory" 1 "does not exist" -- "$planc" build examples/mlp.plan --plan dp2 -o "$tmp/no/such/prog"
expect "emit -o the plan file" 1 "is the plan file" -- "$planc" emit c "$tmp/src.plan" --plan dp2 -o "$tmp/src.plan"
expect "explain --svg the plan file" 1 "is the plan file" -- "$planc" explain "$tmp/src.plan" --svg "$tmp/src.plan"
expect "--native outside build" 2 "--native applies to 'build'" -- "$planc" check examples/mlp.plan --native
mkdir "$tmp/tmpdir"
printf '#!/bin/sh\necho "$@" >"%s/cc-args"\nexit 3\n' "$tmp" >"$tmp/failing-cc"
chmod +x "$tmp/failing-cc"
expect "failed build" 1 "compiling the generated program failed" -- env TMPDIR="$tmp/tmpdir" PLANC_MPICC="$tmp/failing-cc" "$planc" build examples/mlp.plan --plan dp2 -o "$tmp/prog"
if [ -z "$(ls -A "$tmp/tmpdir")" ]; then ok; else bad "a failed build left $(ls "$tmp/tmpdir")"; fi
if ! grep -q -- "-march=native" "$tmp/cc-args"; then ok; else bad "build compiles for the build CPU by default: $(cat "$tmp/cc-args")"; fi
expect "failed --native build" 1 "compiling the generated program failed" -- env TMPDIR="$tmp/tmpdir" PLANC_MPICC="$tmp/failing-cc" "$planc" build examples/mlp.plan --plan dp2 -o "$tmp/prog" --native
if grep -q -- "-march=native" "$tmp/cc-args"; then ok; else bad "--native does not compile for the build CPU: $(cat "$tmp/cc-args")"; fi
# integers are exact 64-bit values: 2^53 + 1 is not rounded to 2^53
sed 's/^model mlp(V = 256,/model mlp(V = 256, N = 9007199254740993,/; s/^  input tokens : i32\[B, S\]/  param big : f32[N] ~ zeros\n&/' examples/mlp.plan >"$tmp/exact.plan"
expect "integer literal above 2^53 stays exact" 0 "f32\[N=9007199254740993\]" -- "$planc" check "$tmp/exact.plan" --plan single --dump-after=graph
# check says it worked in one line; --plan checks that plan only; an error in the model that
# every plan elaborates is printed once
expect "check success line" 0 "examples/llama.plan: 6 plans checked: no errors" -- "$planc" check examples/llama.plan
expect "check one plan line" 0 "examples/llama.plan: plan tp2 checked: no errors" -- "$planc" check examples/llama.plan --plan tp2
printf '%s\n' 'model m(V = 64, S = 8, D = 16) {' '  input tokens : i32[B, S]' '  input targets : i32[B, S]' \
	'  param wte : f32[V, D] ~ normal(0, 0.02)' '  loss = cross_entropy(embed(wte, tokens) @ wte.T, targets)' '}' \
	'plan good for m {' '  mesh data = 2' '  batch B = 8' '  shard B -> data' '}' \
	'plan broken for m {' '  mesh data = 2' '  batch B = 8' '  zero 4' '}' >"$tmp/two.plan"
expect "check --plan skips the other plans" 0 "plan good checked: no errors" -- "$planc" check "$tmp/two.plan" --plan good
expect "check reports the broken plan" 1 "ZeRO stage must be 0, 1, 2 or 3" -- "$planc" check "$tmp/two.plan"
expect "build a plan beside a broken one" 0 "" -- "$planc" build "$tmp/two.plan" --plan good -o "$tmp/good"
printf '%s\n' 'model m(V = 64, S = 8, D = 16) {' '  input tokens : i32[B, S]' '  input targets : i32[B, S]' \
	'  param wte : f32[V, D] ~ normal(0, 0.02)' '  param w : f32[D + 1, V] ~ normal(0, 0.02)' \
	'  loss = cross_entropy(embed(wte, tokens) @ w, targets)' '}' 'plan a for m {' '  mesh data = 1' '  batch B = 4' '}' \
	'plan b for m {' '  mesh data = 1' '  batch B = 8' '}' 'plan c for m {' '  mesh data = 1' '  batch B = 16' '}' \
	>"$tmp/model_error.plan"
"$planc" check "$tmp/model_error.plan" >"$tmp/out" 2>&1
if [ "$(grep -c 'error:' "$tmp/out")" -eq 1 ]; then ok; else
	bad "a model error shared by 3 plans is printed $(grep -c 'error:' "$tmp/out") times, want once"
fi
# --model-arg NAME=VALUE (tests/equiv trains the GPT plans at D 64, S 32 with it): the same plan as
# the override written in the file, the command line over the plan's own override, in build and
# run too; a name the model lacks, a value that is no number, a name given twice, no NAME=, fmt
sed 's/^plan dp2 for gpt {/plan dp2 for gpt(D = 64, S = 32) {/' examples/gpt.plan >"$tmp/small.plan"
"$planc" explain "$tmp/small.plan" --plan dp2 --json >"$tmp/in_file.json"
expect "--model-arg explain" 0 "" -- "$planc" explain examples/gpt.plan --plan dp2 --json --model-arg D=64 --model-arg=S=32
if cmp -s "$tmp/out" "$tmp/in_file.json"; then ok; else bad "explain --model-arg D=64 --model-arg=S=32 differs from the plan's own (D = 64, S = 32)"; fi
"$planc" explain examples/gpt.plan --plan single --json >"$tmp/single.json"
"$planc" explain examples/gpt.plan --plan single_l8 --json --model-arg L=4 >"$tmp/l8_as_l4.json"
if grep -q "$(grep -o '"parameters": *[0-9]*' "$tmp/single.json")" "$tmp/l8_as_l4.json"; then ok; else
	bad "single_l8 for gpt(L = 8) with --model-arg L=4 does not have single's parameters"; fi
expect "--model-arg build" 0 "" -- "$planc" build examples/gpt.plan --plan single --model-arg D=32 -o "$tmp/gpt_d32"
expect "--model-arg program" 0 "" -- "$tmp/gpt_d32" --steps 1 --data data/corpus.txt
expect "--model-arg run" 0 "Trains plan single of model gpt" -- "$planc" run examples/gpt.plan --plan single --model-arg D=32 --help
expect "--model-arg unknown name" 1 "<command line>:1:7: error: model 'gpt' has no hyperparameter 'X'" -- "$planc" check examples/gpt.plan --plan dp2 --model-arg D=64 --model-arg X=1
expect "--model-arg names the model's hyperparameters" 1 "note: its hyperparameters are V, S, D, H, L and P" -- "$planc" check examples/gpt.plan --plan dp2 --model-arg X=1
expect "--model-arg value not a number" 1 "<command line>:1:3: error: the value of 'S' is not a number" -- "$planc" check examples/gpt.plan --model-arg S=3x2
expect "--model-arg given twice" 1 "<command line>:1:7: error: hyperparameter 'S' is given twice" -- "$planc" check examples/gpt.plan --model-arg S=32 --model-arg S=16
expect "--model-arg without NAME=" 1 "<command line>:1:1: error: --model-arg takes NAME=VALUE" -- "$planc" check examples/gpt.plan --model-arg 64
expect "--model-arg without a value" 2 "--model-arg needs NAME=VALUE" -- "$planc" check examples/gpt.plan --model-arg
expect "--model-arg checked like the file's" 1 "hidden size 128 is not divisible by 3 heads" -- "$planc" check examples/gpt.plan --plan tp4 --model-arg H=3
expect "--model-arg not for fmt" 2 "--model-arg applies to the commands that compile a plan" -- "$planc" fmt examples/gpt.plan --model-arg D=64
finish cli
