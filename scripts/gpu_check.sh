#!/usr/bin/env bash
# scripts/gpu_check.sh [--quick]: the GPU check, run on a GPU machine from the repository
# root with .gpu/ (scripts/gpu_pack.sh) beside it. Each phase runs under its own timeout
# and appends its line to the summary as it ends, so a phase that hangs still leaves
# what the others found. Results go to $OUT (the device runner's folder) or ./gpu-out:
# summary.md and one log per phase. --quick: phases 0-3 (under 4 minutes on an H100);
# without it, also the decode benchmark and compute-sanitizer (under 8 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
G=$PWD/.gpu
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
gpu_line=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The machine's own libstdc++ / libgcc_s unless they are too old for the binaries.
if ! "$G/bin/tierkv" --version > /dev/null 2>&1; then export LD_LIBRARY_PATH=$G/lib-compat:$LD_LIBRARY_PATH; fi
export TIERKV_REFERENCE_DIR=$G/reference
unset TIERKV_REQUIRE_REFERENCE
tierkv=$G/bin/tierkv
S=$OUT/summary.md
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), tierkv $(cat "$G/commit" 2>/dev/null)"
  echo
  echo "GPU: $gpu_line"
  echo "libraries: $LD_LIBRARY_PATH"
  echo
  echo "| phase | result | seconds | notes |"
  echo "|---|---|---:|---|"
} > "$S"

# phase NAME LIMIT_S 'COMMAND': runs the command (bash, may call the exported functions)
# under a timeout, its output in $OUT/NAME.log, and adds the phase's row.
phase() {
  local name=$1 limit=$2 cmd=$3
  local t0=$SECONDS rc
  timeout -k 10 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  local result=pass
  [ $rc -ne 0 ] && result="FAIL (rc $rc)"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && result="TIMEOUT after ${limit}s"
  local note
  note=$(grep -E '^\[==========\] [0-9]+ tests? from|^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$OUT/$name.log" |
         sed -E 's/\[=+\] //; s/\[ +([A-Z]+) +\] /\1 /; s/, listed below:|\.$//; s/ from [0-9]+ test suites? ran//' |
         tr '\n' ';' | sed 's/;$//')
  echo "| $name | $result | $((SECONDS - t0)) | ${note} |" >> "$S"
  return 0
}

gtest() {  # binary filter: brief output, failures kept
  "$G/bin/$1" --gtest_filter="$2" --gtest_brief=1
}
export G OUT tierkv
export -f gtest

phase 0-probe 60 '"$tierkv" probe --size 256MiB'
phase 1-kernels 150 "gtest kernels_tests '*Cuda*:*cuda*:QuantHd*:KvLayoutHd*'"
phase 2-models 120 "gtest runtime_tests 'Reference/*_cuda:RunCommandTest.Cuda*'"
phase 3-invariance 120 "gtest runtime_tests 'ModelDeviceTest.*'"

if [ $quick -eq 0 ]; then
  # Decode and prefill speed, CPU vs GPU, builtin:tiny-moe at depth 0 and ~16K tokens
  # (a prompt of repeated text), and the reference MoE: the run's --json lines.
  bench() {
    local long
    long=$(mktemp)
    for model in builtin:tiny-moe "$G/reference/models/ref-qwen3moe-q8_0.gguf"; do
      # About 16K tokens: tiny-moe reads bytes, the reference model's BPE ~4 bytes a token.
      local reps=250
      [ "$model" = builtin:tiny-moe ] || reps=1000
      for _ in $(seq 1 $reps); do echo -n "The quick brown fox jumps over the lazy dog near the river bank. "; done > "$long"
      for dev in none cuda; do
        for p in short long; do
          local args=(run -m "$model" -n 64 --temp 0 --json --device "$dev")
          [ "$dev" = cuda ] && args+=(--vram 8GiB)
          if [ $p = short ]; then args+=(-p "Once upon a time"); else args+=(-f "$long"); fi
          echo "== $(basename "$model") --device $dev, $p prompt"
          "$tierkv" "${args[@]}" 2> "$OUT/bench-stderr.txt" |
            grep -o -E '"(prompt_tokens|generated_tokens)":\[[0-9,]{0,80}|"(decode_tok_s|prefill_tok_s)":[0-9.e+-]+' |
            sed 's/"prompt_tokens":\[\([0-9]*\).*/first prompt token \1/'
          grep -m 2 error "$OUT/bench-stderr.txt"
        done
      done
    done
    rm -f "$long"
  }
  export -f bench
  phase 4-bench 180 bench
  if command -v compute-sanitizer > /dev/null; then
    phase 5-memcheck 90 "compute-sanitizer --tool memcheck --error-exitcode 3 \"\$G/bin/kernels_tests\" \
      --gtest_filter='CudaExecutorTest.Rope*:Executors/*cuda' --gtest_brief=1"
    phase 6-racecheck 90 "compute-sanitizer --tool racecheck --error-exitcode 3 \"\$G/bin/kernels_tests\" \
      --gtest_filter='CudaExecutorTest.Rope*:Executors/ExecutorConformance.Attention*cuda' --gtest_brief=1"
  else
    echo "| 5-sanitizer | skipped: no compute-sanitizer on PATH | 0 | |" >> "$S"
  fi
fi
{
  echo
  echo "Failures (first lines of each failing log):"
  for f in "$OUT"/*.log; do
    grep -m 5 -E '(Failure|FAILED  \]|error:)' "$f" | sed "s|^|$(basename "$f"): |"
  done
} >> "$S"
cat "$S"
