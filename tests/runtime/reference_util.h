// tests/runtime/reference_util.h
//
// The reference data (../shared/reference: GGUF models and what llama.cpp computed for
// them) is outside this repository. A test that needs a file of it is skipped when the
// file is absent, and fails instead when TIERKV_REQUIRE_REFERENCE is set (scripts/test.sh
// sets it wherever ../shared/reference exists), so that a missing or renamed file cannot
// pass as a skip. A file that is there but does not load is a failure, never a skip.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace tierkv::testing {

inline bool ReferenceRequired() {
  const char* v = std::getenv("TIERKV_REQUIRE_REFERENCE");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

}  // namespace tierkv::testing

// Skips (or, with TIERKV_REQUIRE_REFERENCE, fails) the current test when `where` is absent.
#define TIERKV_NEED_REFERENCE(where)                                                              \
  do {                                                                                           \
    const std::filesystem::path tierkv_need_path_ = std::filesystem::path(where);                \
    if (!std::filesystem::exists(tierkv_need_path_)) {                                           \
      if (::tierkv::testing::ReferenceRequired()) {                                              \
        FAIL() << tierkv_need_path_.string() << " is absent and TIERKV_REQUIRE_REFERENCE is set"; \
      }                                                                                          \
      GTEST_SKIP() << tierkv_need_path_.string() << " is absent";                                \
    }                                                                                            \
  } while (0)
