# scripts/llama_xcheck/setup.sh: sourced by run.sh and make_model_check.sh, in $XC:
# node-llama-cpp's prebuilt libllama and its llama.cpp source bundle (llama.h, gguf-py)
# from the npm registry, once; llama_ref, llama_tok and quant built against them.
# Writes $XC/prompts.json. Sets PY (a python3 with numpy), GGUF_PY, B (the libraries) and CPU (the ggml CPU
# backend: zen4, the reference's).
ver=3.22.1
mkdir -p "$XC/models" "$XC/vectors" "$XC/tok"
cd "$XC"
if [ ! -d pkg ]; then
  npm pack "@node-llama-cpp/linux-x64@$ver" "node-llama-cpp@$ver" >/dev/null
  mkdir -p pkg src && tar xzf node-llama-cpp-linux-x64-$ver.tgz -C pkg && tar xzf node-llama-cpp-$ver.tgz -C src
  git clone -q src/package/llama/gitRelease.bundle llama.cpp
fi
# A python3 with numpy (gguf-py needs it): the one on PATH, else Debian's.
PY=python3
$PY -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3
$PY -c 'import numpy' 2>/dev/null || { echo "error: python3-numpy is missing (apt-get install python3-numpy)" >&2; exit 1; }
export GGUF_PY=$XC/llama.cpp/gguf-py
B=$XC/pkg/package/bins/linux-x64
CPU=$B/libggml-cpu-zen4.so
for t in llama_ref llama_tok quant llama_decode; do
  [ $t -nt "$here/$t.cc" ] || g++ -O2 -std=c++17 -I llama.cpp/include -I llama.cpp/ggml/include "$here/$t.cc" -o $t \
      -L$B -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,$B
done
# The reference prompts (P1, P2, P3 of ../shared/reference), as llama_ref reads them.
[ -f prompts.json ] || python3 - "$SHARED" > prompts.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + '/reference/vectors/ref-llama-f16.json'))
print(json.dumps([{"id": c["id"], "prompt": c["prompt"]} for c in d["cases"]]))
PY
