#!/usr/bin/env bash
# scripts/llama_xcheck/run.sh: cross-checks tierkv against llama.cpp itself on models,
# weight types and texts outside ../shared/reference (docs/testing.md, "Cross-check with
# llama.cpp"). A developer's tool, not part of CI: it downloads ~65 MB from the npm
# registry (node-llama-cpp's prebuilt libllama and its llama.cpp source bundle, for
# llama.h and gguf-py), needs python3-numpy, and takes about 15 minutes on 2 cores.
#
#   scripts/llama_xcheck/run.sh [WORKDIR]     (default /tmp/tierkv-xcheck)
#
# 1. random-weight F32 models (gen_models.py): llama (untied), qwen2 (Q/K/V biases,
#    untied), qwen3 (head_dim 64 != n_embd / n_head), qwen3 with YaRN x4, qwen3moe
#    (n_embd 256), with the reference files' tokenizers;
# 2. llama.cpp's own quantizer (quant.cc) makes F16 BF16 Q8_0 Q4_0 Q4_K_S/M Q5_K_S/M Q6_K
#    of each, and Q4_0 / Q4_K_M / Q5_K_M / Q6_K of ref-qwen3moe-f16 (n_embd 64: the
#    K-quants fall back to Q5_0 / Q5_1 / Q8_0);
# 3. llama_ref.cc writes vectors in the reference schema (one-batch prompt, greedy steps;
#    tolerances from llama.cpp's own one-token-per-decode variation, as the reference
#    README describes), on the ggml CPU backend chosen explicitly: zen4, the reference's;
# 4. llama_tok.cc tokenizes gen_texts.py's texts with both reference vocabularies;
# 5. runtime_tests runs the reference test and the tokenizer cross-check on them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export XC=${1:-/tmp/tierkv-xcheck}
export SHARED=${TIERKV_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
. "$here/setup.sh"  # libllama from npm, llama.cpp's source, llama_ref / llama_tok / quant built
ls models/*-f32.gguf >/dev/null 2>&1 || $PY "$here/gen_models.py"
for m in xll xq2 xq3 xq3y xmoe; do
  for t in f16:1 bf16:32 q8_0:7 q4_0:2 q4_k_m:15 q5_k_m:17 q6_k:18 q4_k_s:14 q5_k_s:16; do
    [ -f models/$m-${t%%:*}.gguf ] || ./quant $CPU models/$m-f32.gguf models/$m-${t%%:*}.gguf ${t##*:} >/dev/null 2>&1
  done
done
for t in q4_0:2 q4_k_m:15 q5_k_m:17 q6_k:18; do
  [ -f models/rmoe-${t%%:*}.gguf ] || ./quant $CPU "$SHARED/reference/models/ref-qwen3moe-f16.gguf" models/rmoe-${t%%:*}.gguf ${t##*:} >/dev/null 2>&1
done
for f in models/*.gguf; do
  n=$(basename $f .gguf)
  [ -f vectors/$n.json ] || ./llama_ref $CPU $f prompts.json vectors/$n.json
done
$PY "$here/finish.py" >/dev/null
python3 "$here/gen_texts.py" >/dev/null
./llama_tok $CPU "$SHARED/reference/models/ref-llama-f16.gguf" texts.json tok/tok-spm.json
./llama_tok $CPU "$SHARED/reference/models/ref-qwen3moe-f16.gguf" texts.json tok/tok-qwen.json
cd "$repo"
[ -x build/release/tests/runtime_tests ] || scripts/build.sh release runtime_tests
TIERKV_TOKENIZER_XCHECK=$XC/tok build/release/tests/runtime_tests --gtest_filter='TokenizerXcheck*' | grep -E '^\[xcheck\]|OK|FAILED'
TIERKV_REFERENCE_DIR=$XC build/release/tests/runtime_tests --gtest_filter='Reference/ModelReferenceTest.*' \
  | tee "$XC/reference.log" | grep -E '^\[reference\]|FAILED' || true
