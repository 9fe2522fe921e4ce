#!/usr/bin/env bash
# scripts/llama_xcheck/make_model_check.sh: do llama.cpp and tierkv read `tierkv
# make-model`'s files alike? (issue 36, docs/make-model.md.) A developer's tool, not
# part of CI (it needs the npm registry, like run.sh, and ~5 GB of disk).
#
#   scripts/llama_xcheck/make_model_check.sh [WORKDIR]   (default /tmp/tierkv-xcheck)
#
# Slices of real models' shapes with the Qwen vocabulary of ref-qwen3moe-f16.gguf:
# Qwen3-30B-A3B Q4_K_M (2 of 48 layers), Qwen3-8B Q8_0 (2 of 36), Qwen3-235B-A22B
# Q4_K_M (1 of 94). llama.cpp loads each and computes the reference prompts
# (llama_ref.cc: tokens, logits, greedy steps, in the reference schema); tierkv's
# reference test then reads the same files and must match its tokens and logits.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export XC=${1:-/tmp/tierkv-xcheck}
export SHARED=${TIERKV_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
. "$here/setup.sh"
MM=$XC/make-model
mkdir -p "$MM/models" "$MM/vectors"
[ -x "$repo/build/release/runtime/tierkv" ] || (cd "$repo" && scripts/build.sh release tierkv runtime_tests)
for spec in qwen3-30b-a3b:q4_k_m:2 qwen3-8b:q8_0:2 qwen3-235b-a22b:q4_k_m:1; do
  IFS=: read -r like type layers <<<"$spec"
  f=$MM/models/mm-$like-$type-l$layers.gguf
  [ -f "$f" ] || "$repo/build/release/runtime/tierkv" make-model --like "$like" --type "$type" --layers "$layers" \
      --vocab-from "$SHARED/reference/models/ref-qwen3moe-f16.gguf" --seed 1 -o "$f"
done
for f in "$MM"/models/*.gguf; do
  n=$(basename "$f" .gguf)
  [ -f "$MM/vectors/$n.json" ] || ./llama_ref "$CPU" "$f" "$XC/prompts.json" "$MM/vectors/$n.json"
done
XC=$MM $PY "$here/finish.py" >/dev/null
cd "$repo"
TIERKV_REFERENCE_DIR=$MM build/release/tests/runtime_tests --gtest_filter='Reference/ModelReferenceTest.*' \
  | tee "$MM/reference.log" | grep -E '^\[reference\]|OK|FAILED'
