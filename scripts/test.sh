#!/usr/bin/env bash
# The whole test suite: installs what is missing, then builds and runs every test in
# Release and again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
for kind in release asan; do
  echo "== $kind build ==" >&2
  scripts/build.sh "$kind"
  echo "== $kind tests ==" >&2
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "build/$kind" --output-on-failure -j"$(nproc)" --timeout 900
done
echo "all tests passed (release and asan+ubsan)" >&2
