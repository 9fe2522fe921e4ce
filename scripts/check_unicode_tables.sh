#!/usr/bin/env bash
# scripts/check_unicode_tables.sh: builds scripts/gen_unicode_tables.cc (needs Debian's
# libicu-dev) and checks that its output is the letter and number tables in
# runtime/unicode.cc, byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
gen=$(mktemp)
trap 'rm -f "$gen"' EXIT
g++ -std=c++20 scripts/gen_unicode_tables.cc $(pkg-config --cflags --libs icu-uc) -o "$gen"
diff <("$gen" | grep -v '^$') \
     <(sed -n '/^constexpr CodepointRange kLetterRanges/,/^};/p;/^constexpr CodepointRange kNumberRanges/,/^};/p' runtime/unicode.cc)
echo "runtime/unicode.cc's tables are what scripts/gen_unicode_tables.cc prints"
