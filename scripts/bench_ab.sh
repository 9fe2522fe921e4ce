#!/usr/bin/env bash
# scripts/bench_ab.sh OLD_TREE NEW_TREE [ROUNDS]
#
# A/B of two built trees (each a checkout with build/release made by scripts/build.sh):
# decode_bench, prefill_bench and codec_bench run alternately, old then new, ROUNDS times
# (default 3) in one sitting, each binary from its own tree (so ../shared resolves for
# both); prints the medians and new/old per cell as markdown (docs/benchmarks.md, "The
# compute seam"). Takes the build lock for each run, so no build runs in between.
set -euo pipefail
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); rounds=${3:-3}
out=$(mktemp -d /tmp/tierkv-ab-XXXXXX)
declare -A filter=(
  [decode]='decode/.*/depth:(0|4096|16384)/'
  [prefill]='prefill/(synthetic-llama|synthetic-moe|builtin:tiny-moe)/depth:(0|4096|8192)/'
  [codec]='BM_(Dot|Accumulate)/.*/generic:0'
)
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    tree=$old; [[ $v == new ]] && tree=$new
    for b in decode prefill codec; do
      (cd "$tree" && flock /tmp/tierkv-build.lock "build/release/bench/${b}_bench" --benchmark_filter="${filter[$b]}" \
         --benchmark_out="$out/${b}_${v}_$r.json" --benchmark_out_format=json >/dev/null 2>&1)
    done
    echo "round $r: $v done" >&2
  done
done
python3 - "$out" <<'PY'
import collections, glob, json, statistics, sys
out = sys.argv[1]
def load(kind, v):
    d = collections.defaultdict(list)
    for f in sorted(glob.glob(f"{out}/{kind}_{v}_*.json")):
        for b in json.load(open(f))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            key = b["name"].replace("/min_time:0.300", "").replace("/manual_time", "").replace("/iterations:2", "")
            val = {"decode": lambda: b["tok_s"], "prefill": lambda: b["chunk_tok_s"]}.get(kind, lambda: 1.0 / b["real_time"])()
            d[key].append(val)
    return d
for kind, unit in (("decode", "tok/s"), ("prefill", "chunk tok/s"), ("codec", "1/time")):
    o, n = load(kind, "old"), load(kind, "new")
    rows = [(k, statistics.median(o[k]), statistics.median(n[k])) for k in o if k in n]
    rs = [b / a for _, a, b in rows]
    print(f"\n{kind}: {len(rs)} cells, new/old median {statistics.median(rs):.3f}, range {min(rs):.3f} - {max(rs):.3f}\n")
    print(f"| {kind} | old {unit} | new {unit} | new/old |\n|---|---:|---:|---:|")
    for k, a, b in rows:
        print(f"| {k} | {a:.4g} | {b:.4g} | {b / a:.3f} |")
PY
