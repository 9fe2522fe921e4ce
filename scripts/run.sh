#!/usr/bin/env bash
# The main job: installs what is missing, builds tierkv, probes this machine's tiers,
# replays the default fragmentation workload (chart in out/fragbench.svg), and runs a
# reference model from ../shared (when present) with a session file, twice: the second
# run restores the session and reuses the common prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release tierkv
mkdir -p out
tierkv=./build/release/runtime/tierkv
$tierkv probe --disk-dir "${TIERKV_DISK_DIR:-/tmp}"
$tierkv fragbench --csv out/fragbench.csv --svg out/fragbench.svg --json > out/fragbench.json
echo "wrote out/fragbench.{csv,svg,json}" >&2
model=../shared/reference/models/ref-qwen3moe-q8_0.gguf
if [ -f "$model" ]; then
  rm -f out/session.tkv
  $tierkv run -m "$model" -p "The lighthouse keeper climbed the stairs" -n 16 \
      --session out/session.tkv --disk 64MiB --disk-dir "${TIERKV_DISK_DIR:-/tmp}" --json > out/run1.json
  $tierkv run -m "$model" -p "The lighthouse keeper climbed the stairs and looked at the sea" -n 16 \
      --session out/session.tkv --disk 64MiB --disk-dir "${TIERKV_DISK_DIR:-/tmp}" --json > out/run2.json
  $tierkv session verify out/session.tkv
  echo "wrote out/run1.json, out/run2.json (second run reuses the session's prefix)" >&2
else
  echo "no reference models at ../shared/reference: skipping the model run" >&2
fi
