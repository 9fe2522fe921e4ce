#!/usr/bin/env bash
# The main job: installs what is missing, builds tierkv, probes this machine's tiers and
# replays the default fragmentation workload (chart in out/fragbench.svg).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh release tierkv
mkdir -p out
./build/release/runtime/tierkv probe --disk-dir "${TIERKV_DISK_DIR:-/tmp}"
./build/release/runtime/tierkv fragbench --csv out/fragbench.csv --svg out/fragbench.svg "$@"
echo "wrote out/fragbench.csv and out/fragbench.svg" >&2
