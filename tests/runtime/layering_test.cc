// tests/runtime/layering_test.cc
//
// The layers' rules (docs/architecture.md), checked on the source tree itself so that a
// change that breaks them fails CI: memory/ includes nothing above it; kernels/ nothing
// but memory/; kvcache/ only kernels' codec and CPU-feature headers; the runtime
// libraries never bench/ (only the tierkv executable's main.cc ties the tools in); and
// the model code computes only through the executor: its `kernels::` calls are type and
// format queries at load, and making the CPU executor.
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tierkv {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = TIERKV_SOURCE_DIR;

std::vector<fs::path> Sources(const std::string& dir, bool recursive = false) {
  std::vector<fs::path> out;
  const auto add = [&](const fs::directory_entry& e) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".h" || ext == ".cc" || ext == ".cu")) out.push_back(e.path());
  };
  if (recursive) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) add(e);
  } else {
    for (const auto& e : fs::directory_iterator(kRoot / dir)) add(e);
  }
  return out;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The project headers a file includes ("dir/name.h").
std::vector<std::string> Includes(const fs::path& p) {
  static const std::regex kInclude(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<std::string> out;
  std::istringstream lines(Read(p));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, kInclude)) out.push_back(m[1]);
  }
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(LayeringTest, EachLayerIncludesOnlyTheLayersBelowIt) {
  ASSERT_TRUE(fs::is_directory(kRoot / "memory")) << kRoot;
  int files = 0;
  for (const fs::path& f : Sources("memory")) {
    ++files;
    for (const std::string& inc : Includes(f)) {
      EXPECT_TRUE(StartsWith(inc, "memory/")) << f.filename() << " includes " << inc;
    }
  }
  for (const fs::path& f : Sources("kernels")) {
    ++files;
    for (const std::string& inc : Includes(f)) {
      EXPECT_TRUE(StartsWith(inc, "memory/") || StartsWith(inc, "kernels/")) << f.filename() << " includes " << inc;
    }
  }
  const std::set<std::string> kKernelsForKvcache = {"kernels/cpu_features.h", "kernels/kv_codec_simd.h",
                                                     "kernels/kv_dot_tree.h", "kernels/kv_gather.h",
                                                     "kernels/kv_vector_kernels.h"};
  for (const fs::path& f : Sources("kvcache")) {
    ++files;
    for (const std::string& inc : Includes(f)) {
      EXPECT_TRUE(StartsWith(inc, "memory/") || StartsWith(inc, "kvcache/") || kKernelsForKvcache.count(inc))
          << f.filename() << " includes " << inc;
    }
  }
  for (const fs::path& f : Sources("runtime", /*recursive=*/true)) {
    if (f.filename() == "main.cc") continue;  // the executable ties the bench tools in
    ++files;
    for (const std::string& inc : Includes(f)) {
      EXPECT_FALSE(StartsWith(inc, "bench/")) << f << " includes " << inc;
    }
  }
  EXPECT_GT(files, 60);
}

TEST(LayeringTest, TheModelComputesOnlyThroughTheExecutor) {
  static const std::regex kCall(R"(kernels::([A-Z][A-Za-z0-9_]*)\s*\()");
  // Type and format queries at load, and the default executor: no compute.
  const std::set<std::string> kAllowed = {"FindWeightType", "IsActivationOnly", "RowBytes", "DequantizeRow",
                                          "GetWeightTypeInfo", "WeightTypeName", "MakeCpuExecutor"};
  int files = 0;
  for (const fs::path& f : Sources("runtime")) {
    if (!StartsWith(f.filename().string(), "model")) continue;
    ++files;
    const std::string text = Read(f);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kCall); it != std::sregex_iterator(); ++it) {
      EXPECT_TRUE(kAllowed.count((*it)[1])) << f.filename() << " calls kernels::" << (*it)[1]
                                            << " directly: compute goes through the executor (kernels/executor.h)";
    }
  }
  EXPECT_GE(files, 4);  // model.cc, model_forward.cc, model_paging.cc, model_config.cc, ...
}

}  // namespace
}  // namespace tierkv
