#!/bin/sh
# Pipeline stages end to end: planc check --dump-after=pipeline on models of identical layers,
# counting the layers each stage's ops belong to. 105 layers on 35 stages give 3 each under
# balance = uniform, flops and params (the issue's 53, 19, 33 x 1 must not come back), 128 on
# 64 give 2 each, and a parameter-heavy embedding (half counted on the first stage, half on the
# last) leaves those stages fewer layers: 2, 4, 4, 2. Send and receive ops carry the layer of
# the value they move, so they are not counted.
# usage: tests/pipeline/run_stages.sh PLANC (from the repository root)
planc=$1
. "$(dirname "$0")/../lib/harness.sh"

# model NAME V L: embedding of V tokens into 16 dims, L layers of nn.linear(16), the loss on the
# 16 outputs directly (no matmul outside the layers)
model() {
	cat <<EOM
model $1(V = $2, L = $3, S = 4) {
  input tokens : i32[B, S]
  input targets : i32[B, S]
  param wte : f32[V, 16] ~ normal(0, 0.02)
  x = embed(wte, tokens)
  repeat L { x = nn.linear(x, 16) }
  loss = cross_entropy(x, targets)
}
EOM
}

# plan NAME MODEL STAGES BALANCE
plan() {
	cat <<EOM
plan $1 for $2 {
  mesh pipe = $3
  batch B = $3, micro_batches = $3
  pipeline pipe: 1f1b, stages = $3, balance = $4
  optimizer sgd(lr = 0.1)
}
EOM
}

{
	echo 'import std.nn'
	model deep105 16 105
	model deep128 16 128
	model wide12 68 12
	for b in uniform flops params; do
		plan p105_$b deep105 35 $b
	done
	plan p128 deep128 64 uniform
	plan wide_params wide12 4 params
	plan wide_flops wide12 4 flops
} >"$tmp/stages.plan"

# the layers on each stage, in stage order ("3 3 3 ..."); "split" when a layer's ops are on two
# stages, "order" when a later layer is on an earlier stage
stage_sizes() {
	awk '!/= (send|recv) / {
		l = ""; s = ""
		for (i = 1; i <= NF; i++) {
			if ($i ~ /^layer=/) l = substr($i, 7) + 0
			if ($i ~ /^stage=/) s = substr($i, 7) + 0
		}
		if (l == "" || s == "") next
		if ((l in st) && st[l] != s) bad = "split"
		st[l] = s
		if (l > maxl) maxl = l
	}
	END {
		if (bad != "") { print bad; exit }
		for (l = 0; l <= maxl; l++) {
			if (l > 0 && st[l] < st[l - 1]) { print "order"; exit }
			n[st[l]]++
			if (st[l] > maxs) maxs = st[l]
		}
		out = ""
		for (s = 0; s <= maxs; s++) out = out (s ? " " : "") (n[s] + 0)
		print out
	}' "$1"
}

repeat() { # repeat WORD COUNT
	i=0 out=""
	while [ $i -lt "$2" ]; do
		out="$out${out:+ }$1"
		i=$((i + 1))
	done
	echo "$out"
}

expect() { # expect PLAN SIZES
	if ! "$planc" check "$tmp/stages.plan" --plan "$1" --dump-after=pipeline >"$tmp/out" 2>&1; then
		bad "$1 (planc check failed)"
		head -5 "$tmp/out"
		return
	fi
	got=$(stage_sizes "$tmp/out")
	if [ "$got" = "$2" ]; then
		ok "$1: $got"
	else
		bad "$1: layers per stage $got, want $2"
	fi
}

three=$(repeat 3 35)
expect p105_uniform "$three"
expect p105_flops "$three"
expect p105_params "$three"
expect p128 "$(repeat 2 64)"
expect wide_params "2 4 4 2"
expect wide_flops "3 3 3 3"
finish "pipeline stages"
