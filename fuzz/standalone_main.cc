// fuzz/standalone_main.cc
//
// main() for a libFuzzer entry built without libFuzzer (fuzz/CMakeLists.txt): runs
// LLVMFuzzerTestOneInput once on the bytes of each file named on the command line, in
// order, and says so on stderr. Exit status 0 when every input ran (an entry aborts on a
// finding), 1 when a file cannot be read.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    std::ifstream in;
    if (std::filesystem::is_regular_file(argv[i], ec)) in.open(argv[i], std::ios::binary);
    if (!in.is_open()) {
      std::fprintf(stderr, "error: cannot read %s (not a readable file)\n", argv[i]);
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // A buffer of exactly the input's size, as libFuzzer passes: ASan sees a read past it.
    const auto data = std::make_unique<uint8_t[]>(bytes.size());
    std::copy(bytes.begin(), bytes.end(), data.get());
    LLVMFuzzerTestOneInput(data.get(), bytes.size());
    std::fprintf(stderr, "%s: %zu bytes, ok\n", argv[i], bytes.size());
  }
  return 0;
}
