#!/usr/bin/env bash
# scripts/llama_xcheck/build_server.sh: llama-server from the llama.cpp source that
# setup.sh fetched into $XC (default /tmp/tierkv-xcheck), CPU only, without its web UI
# (no assets are fetched: the API endpoints are what scripts/serve_restart_bench.py
# compares). The CPU features are named, not -march=native: this VM advertises AMX, whose
# instructions it does not run (GGML_NATIVE built a llama-server that crashed in its
# warm-up, 2026-12-06). About 5 minutes on 2 cores (a unity build); the binary is $XC/llama-server-build/bin/llama-server.
set -euo pipefail
XC=${XC:-/tmp/tierkv-xcheck}
[ -d "$XC/llama.cpp" ] || { echo "error: $XC/llama.cpp is missing: run scripts/llama_xcheck/run.sh (or setup.sh) first" >&2; exit 1; }
cmake -S "$XC/llama.cpp" -B "$XC/llama-server-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
  -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$XC/llama-server-build" --target llama-server -j"$(nproc)" >&2
echo "$XC/llama-server-build/bin/llama-server"
