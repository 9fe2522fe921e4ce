#!/usr/bin/env bash
# The whole test suite: installs what is missing, then builds and runs every test in
# Release and again under AddressSanitizer + UBSan (with assertions on), reruns the
# SIMD-sensitive tests with the kernels capped at AVX2, and builds and checks the .deb.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# With the reference data here, a test that needs a file of it fails when the file is
# missing rather than skipping (tests/runtime/reference_util.h).
if [ -d ../shared/reference ]; then export TIERKV_REQUIRE_REFERENCE=1; fi
for kind in release asan; do
  echo "== $kind build (at ${SECONDS}s) ==" >&2
  if [ "$kind" = asan ]; then
    # What the tests run, not the benchmarks and fuzzers (Release builds every target).
    scripts/build.sh asan memory_tests kvcache_tests kernels_tests runtime_tests bench_tests server_tests tierkv
  else
    scripts/build.sh "$kind"
  fi
  echo "== $kind tests (at ${SECONDS}s) ==" >&2
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "build/$kind" --output-on-failure -j"$(nproc)" --timeout 900
  if [ "$kind" = release ]; then
    # Once more with the kernels and codecs capped at the AVX2 level without AVX-VNNI
    # (docs/kernels.md, TIERKV_SIMD): on a CI machine with AVX-512 this runs the reference
    # models through the code that machines without it run.
    # Only the tests whose results go through the kernels and codecs (the others do not
    # look at TIERKV_SIMD).
    simd='^(AttentionTest|AttentionSumsTest|NormTest|RopeTest|ActivationTest|MoeTest|ExpfTest|MatVecTest|QuantTest|QuantHdTest|KvLayoutHdTest|ModelDeviceTest'
    simd+='|Fp16Test|Executors/|Codec|Tq|HalfTest|KvCacheTest|SimdEnvTest|ModelTest|ModelArchTest|Reference/'
    simd+='|WeightTypesTest|TieringTest|BuiltinModelTest|RunTest)'
    echo "== release tests, SIMD capped at avx2-novnni (at ${SECONDS}s) ==" >&2
    TIERKV_SIMD=avx2-novnni ctest --test-dir build/release --output-on-failure -j"$(nproc)" --timeout 900 -R "$simd"
    echo "== package (at ${SECONDS}s) ==" >&2
    scripts/package.sh >/dev/null
  fi
done
echo "all tests passed (release, release capped at AVX2, asan+ubsan, package) in ${SECONDS}s" >&2
