#!/usr/bin/env bash
# fuzz/build_libfuzzer.sh [gguf|session] [out]: builds fuzz/<entry>_fuzzer.cc (default gguf)
# with clang's libFuzzer, ASan and UBSan into build/libfuzzer/<entry>_fuzzer (or `out`),
# compiling the sources it needs
# (the GGUF reader, model, tokenizer, kernels, kvcache, memory) with the same flags;
# objects are kept and rebuilt when their source is newer. Then, e.g.:
#   mkdir -p /tmp/corpus && cp SMALL.gguf /tmp/corpus/
#   build/libfuzzer/gguf_fuzzer -max_total_time=90 -max_len=32768 -malloc_limit_mb=512 /tmp/corpus
# or, for the session reader, a corpus of small session files (docs/testing.md):
#   build/libfuzzer/session_fuzzer -max_total_time=150 -max_len=20000 -malloc_limit_mb=512 /tmp/sessions
# clang 14 does not know the "avxvnni" and "f16c" CPU features kernels/cpu_features.cc (the one
# place tierkv asks the CPU) checks: that
# file is compiled with __builtin_cpu_supports() = 0 (scalar kernels; fuzzing needs no SIMD).
set -euo pipefail
cd "$(dirname "$0")/.."
entry=${1:-gguf}
case "$entry" in gguf|session) ;; *) echo "error: unknown fuzzer '$entry' (gguf, session)" >&2; exit 2 ;; esac
out=${2:-build/libfuzzer/${entry}_fuzzer}
obj=build/libfuzzer/obj
mkdir -p "$obj" "$(dirname "$out")"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -I. -DSPDLOG_COMPILED_LIB
       -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -DFMT_SHARED)
srcs=(runtime/gguf.cc runtime/unicode.cc runtime/model.cc runtime/model_config.cc
      runtime/model_forward.cc runtime/model_paging.cc runtime/tokenizer.cc runtime/tokenizer_bpe.cc
      runtime/tokenizer_spm.cc kernels/*.cc kvcache/*.cc memory/status.cc memory/size.cc memory/meminfo.cc
      memory/frame_allocator.cc memory/host_backend.cc memory/disk_backend.cc memory/sim_device_backend.cc
      memory/faulty_backend.cc memory/stream.cc memory/policy.cc memory/page_table.cc memory/memory_manager.cc
      memory/stats.cc memory/simd_env.cc memory/cuda_device_backend_stub.cc)
objs=()
for s in "${srcs[@]}"; do
  o="$obj/${s//\//_}.o"
  objs+=("$o")
  [[ -s "$o" && "$o" -nt "$s" ]] && continue
  extra=()
  [[ "$s" == kernels/cpu_features.cc ]] && extra=("-D__builtin_cpu_supports(x)=0")
  [[ "$s" == kvcache/checksum_avx2.cc ]] && extra=(-mavx2)
  echo "clang++ $s" >&2
  clang++ "${flags[@]}" "${extra[@]}" -c "$s" -o "$o"
done
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. "fuzz/${entry}_fuzzer.cc" "${objs[@]}" \
  -lspdlog -lfmt -lxxhash -lpthread -o "$out"
echo "$out"
