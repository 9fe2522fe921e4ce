#!/usr/bin/env bash
# scripts/build.sh <release|asan> [targets...]: configures and builds into build/<kind>.
# asan = AddressSanitizer + UBSan with assertions on (no -DNDEBUG), CPU-only, no
# micro-benchmarks; -O2 with line tables only (-g1: a fifth less compile time than -g, and stack traces keep file:line). Not
# -O1: GCC contracts a * b + c into an FMA only from -O2 on, and the multi-row kernels
# are written to give the bits of the one-row kernels as -O2 compiles them (tested).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-release}; shift || true
case "$kind" in
  release) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan)    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1"
                 -DTIERKV_SANITIZE=ON -DTIERKV_WITH_CUDA=OFF -DTIERKV_BUILD_BENCH=OFF) ;;
  *) echo "error: unknown build kind '$kind' (release, asan)" >&2; exit 2 ;;
esac
cmake -S . -B "build/$kind" -G Ninja "${flags[@]}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "build/$kind" -j"$(nproc)" "${targets[@]}"
