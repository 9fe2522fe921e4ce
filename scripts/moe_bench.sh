#!/usr/bin/env bash
# scripts/moe_bench.sh [DIR]: a Qwen3-30B-A3B-shaped Q4_K_M file (17.3 GiB, made once in
# DIR, default /tmp/tierkv-moe-bench) decoded by tierkv under a host budget and by
# llama.cpp through mmap, each inside a memory cgroup (v1) limited to the same B, the page
# cache dropped before every run (issue 36; docs/benchmarks.md, "Real scale"). Not in CI:
# it needs root, ~18 GB of disk, the npm registry once (libllama, as
# scripts/llama_xcheck), and about 15 minutes.
#
# Per B in $BUDGETS (GiB; default "6 10 14"): tierkv run --host (B - 1)GiB --weights paged
# (the rest of the cgroup for its overhead and the page cache its reads go through) and
# llama_decode (llama.cpp's defaults: mmap, no mlock); the same prompt, N greedy tokens.
# Reported: prefill and decode tokens/s, peak RSS and the cgroup's peak (RSS + page
# cache), bytes read from storage (getrusage's block inputs) per token processed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/tmp/tierkv-moe-bench}
budgets=${BUDGETS:-"6 10 14"}
n=${TOKENS:-16}
prompt="The keeper of the lighthouse wrote in his log"
# PROMPT_FILE=FILE: the prompt's text from FILE instead (the depth-8K rows: ~28 KB of
# docs/ text, 8,1xx tokens of the Qwen vocabulary); both engines read the same file.
ours_prompt=(-p "$prompt") theirs_prompt=$prompt
if [ -n "${PROMPT_FILE:-}" ]; then ours_prompt=(-f "$PROMPT_FILE"); theirs_prompt=@$PROMPT_FILE; fi
shared=${TIERKV_SHARED_DIR:-$(cd "$repo/.." && pwd)/shared}
mkdir -p "$dir"
tierkv=$repo/build/release/runtime/tierkv
[ -x "$tierkv" ] || (cd "$repo" && scripts/build.sh release tierkv)
model=$dir/qwen3-30b-a3b-q4_k_m.gguf
[ -f "$model" ] || "$tierkv" make-model --like qwen3-30b-a3b --type q4_k_m \
    --vocab-from "$shared/reference/models/ref-qwen3moe-f16.gguf" --seed 1 -o "$model" >&2
# libllama and llama_decode (scripts/llama_xcheck/setup.sh, in its work directory).
here=$repo/scripts/llama_xcheck
export XC=${XC:-/tmp/tierkv-xcheck} SHARED=$shared
(. "$here/setup.sh" >&2)
B=$XC/pkg/package/bins/linux-x64
llama="$XC/llama_decode $B/libggml-cpu-zen4.so"
cg=/sys/fs/cgroup/memory/tierkv-moe-bench
mkdir -p "$cg"
trap 'cat "$cg/cgroup.procs" 2>/dev/null | while read -r p; do echo "$p" > /sys/fs/cgroup/memory/cgroup.procs; done; rmdir "$cg" 2>/dev/null || true' EXIT

# run NAME GIB CMD...: drops the page cache, runs CMD in the cgroup under /usr/bin/time,
# prints "NAME<TAB>B<TAB>stdout's last line<TAB>max RSS KiB<TAB>block inputs<TAB>cgroup peak".
run() {
  local name=$1 gib=$2; shift 2
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo $((gib << 30)) > "$cg/memory.limit_in_bytes"
  echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
  local out; out=$(mktemp)
  /usr/bin/time -f '%M %I' -o "$out.time" bash -c 'echo $$ > '"$cg"'/cgroup.procs; exec "$@"' _ "$@" > "$out" 2> "$out.err" || {
    echo "$name B=$gib failed:" >&2; tail -3 "$out.err" >&2; }
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$gib" "$(tail -1 "$out")" "$(tail -1 "$out.time")" "$(cat "$cg/memory.max_usage_in_bytes")"
  rm -f "$out" "$out.time" "$out.err"
}

for gib in $budgets; do
  run tierkv "$gib" "$tierkv" run -m "$model" "${ours_prompt[@]}" -n "$n" --host "$((gib - 1))GiB" --weights paged \
      --mlock off --no-display-prompt --json
  run llama.cpp "$gib" $llama "$model" "$theirs_prompt" "$n" 2
done | tee "$dir/raw-$(date +%Y%m%d-%H%M).tsv" | python3 -c '
import json, sys
print("| engine | B | prompt tokens | prefill tok/s | decode tok/s | peak RSS | cgroup peak (RSS + cache) | read from storage / token |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for line in sys.stdin:
    name, b, js, tm, cg = line.rstrip("\n").split("\t")
    rss_kib, blocks = map(int, tm.split())
    try: j = json.loads(js)
    except Exception: print(f"| {name} | {b} | | failed | | | | |"); continue
    if name == "tierkv":
        t = j["timings"]; pre, dec, nprompt = t["prefill_tok_s"], t["decode_tok_s"], len(j["prompt_tokens"])
        toks = nprompt + len(j["generated_tokens"])
    else:
        pre, dec, nprompt = j["prefill_tok_s"], j["decode_tok_s"], j["prompt_tokens"]
        toks = nprompt + j["generated"]
    gib = lambda x: f"{x / 2**30:.2f} GiB"
    print(f"| {name} | {b} GiB | {nprompt} | {pre:.2f} | {dec:.2f} | {gib(rss_kib * 1024)} | {gib(int(cg))} | {blocks * 512 / toks / 2**20:.0f} MiB |")
'
