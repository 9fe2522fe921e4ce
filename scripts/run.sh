#!/usr/bin/env bash
# The main job: installs what is missing, builds tierkv, probes this machine's tiers,
# replays the default fragmentation workload (chart in out/fragbench.svg), and runs
# builtin:tiny-moe (nothing to download) through the paged decoder with a session file,
# twice: the second run restores the session and reuses the common prefix; then once on
# a 16.8K-token prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release tierkv
mkdir -p out
tierkv=./build/release/runtime/tierkv
$tierkv probe --disk-dir "${TIERKV_DISK_DIR:-/tmp}"
$tierkv fragbench --csv out/fragbench.csv --svg out/fragbench.svg --json > out/fragbench.json
echo "wrote out/fragbench.{csv,svg,json}" >&2
# A real session on the builtin model: a 16 MiB (simulated, 8 GB/s) device tier over
# 256 MiB of host and a disk tier, weights and KV paged under those budgets, prefetch on.
# The second run restores the session and reuses the common prefix.
dir="${TIERKV_DISK_DIR:-/tmp}"
tiers=(--device sim --vram 16MiB --sim-gbps 8 --host 256MiB --disk 256MiB --disk-dir "$dir")
prompt="The lighthouse keeper climbed the stairs, counted the steps and looked at the sea."
rm -f out/session.tkv
$tierkv run -m builtin:tiny-moe -p "$prompt" -n 128 "${tiers[@]}" --session out/session.tkv --json > out/run1.json
$tierkv run -m builtin:tiny-moe -p "$prompt The ships were late tonight." -n 128 "${tiers[@]}" \
    --session out/session.tkv --json > out/run2.json
$tierkv session verify out/session.tkv
echo "wrote out/run1.json, out/run2.json (the second run reuses the session's prefix)" >&2
# A long context through the same tiers: about 16.8K prompt tokens (the text repeated),
# prefilled 64 tokens a chunk (-b 64, the default); its KV (33 MiB of f16) lives mostly
# below the 16 MiB device tier.
for i in $(seq 1 200); do printf '%s ' "$prompt"; done > out/long_prompt.txt
$tierkv run -m builtin:tiny-moe -f out/long_prompt.txt -n 32 "${tiers[@]}" --json > out/run3.json
echo "wrote out/run3.json (a 16.8K-token prompt)" >&2
