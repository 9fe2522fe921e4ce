#!/usr/bin/env bash
# scripts/gpu_pack.sh: packs what the GPU check (scripts/gpu_check.sh) needs into .gpu/
# (ignored by git), for a GPU machine that has no package registries: the tierkv binary
# and the two test binaries with GPU tests (built here in Release, CUDA for sm_86/89/90,
# cudart static), the shared libraries they need that are not glibc's (ldd), and the
# reference models that fit with their vectors. Refuses to leave a folder of 64 MiB or
# more (the carry limit). Usage: scripts/gpu_pack.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-build" ]; then
  scripts/build.sh release tierkv kernels_tests runtime_tests
fi
nm -C build/release/kernels/libtierkv_kernels.a 2>/dev/null | grep "CudaExecutor" > /dev/null ||
  { echo "error: build/release has no CUDA executor (configure with the CUDA toolkit)" >&2; exit 1; }
out=.gpu
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/lib-compat" "$out/reference/models" "$out/reference/vectors"
bins=(build/release/runtime/tierkv build/release/tests/kernels_tests build/release/tests/runtime_tests)
for b in "${bins[@]}"; do
  cp "$b" "$out/bin/"
  strip "$out/bin/$(basename "$b")"
done
# Every library the binaries load but glibc's own (libc, libm, the loader and friends).
# libstdc++ and libgcc_s go to lib-compat: used there only if the GPU machine's are too
# old for the binaries (gpu_check.sh tries without them first: a newer system libstdc++
# must stay in place for the tools it runs, such as compute-sanitizer).
ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so' |
  while read -r lib; do
    case "$(basename "$lib")" in
      libstdc++.so.*|libgcc_s.so.*) cp -L "$lib" "$out/lib-compat/" ;;
      *) cp -L "$lib" "$out/lib/" ;;
    esac
  done
ref=../shared/reference
for m in ref-qwen3moe-q8_0 ref-llama-q4_k_m; do
  if [ -f "$ref/models/$m.gguf" ]; then
    cp "$ref/models/$m.gguf" "$out/reference/models/"
    cp "$ref/vectors/$m.json" "$out/reference/vectors/" 2>/dev/null || true
  else
    echo "note: $ref/models/$m.gguf absent: the reference phase will have fewer models" >&2
  fi
done
git rev-parse --short HEAD > "$out/commit" 2>/dev/null || echo unknown > "$out/commit"
kib=$(du -sk "$out" | cut -f1)
if [ "$kib" -ge $((64 * 1024)) ]; then
  echo "error: $out is $((kib / 1024)) MiB, over the 64 MiB carry limit" >&2
  exit 1
fi
echo "packed $out: $((kib / 1024)) MiB ($(ls "$out/lib" "$out/lib-compat" | grep -c '\.so') libraries, $(ls "$out/reference/models" | wc -l) models)" >&2
