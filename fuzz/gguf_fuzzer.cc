// fuzz/gguf_fuzzer.cc
//
// libFuzzer entry point for the GGUF reader. The CMake build compiles it with a plain
// main() (fuzz/standalone_main.cc: `build/<kind>/fuzz/gguf_fuzzer FILE...` replays
// inputs); fuzzing needs clang's libFuzzer, by hand (docs/gguf.md, "Fuzzing"):
//
//   src="fuzz/gguf_fuzzer.cc runtime/gguf.cc runtime/ggml_types.cc runtime/unicode.cc memory/status.cc"
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. $src -o /tmp/gguf_fuzzer
//   /tmp/gguf_fuzzer -max_len=65536 corpus_dir/
//
// Every input must give an error Status or a file whose tensors lie inside the input;
// reading back every value must stay inside it too (ASan checks the reads).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = tierkv::GgufFile::Parse(data, size);
  if (!parsed.ok()) {
    const std::string message = parsed.status().message();
    if (message.rfind("gguf: ", 0) != 0 || message.find('\n') != std::string::npos) std::abort();
    return 0;
  }
  const tierkv::GgufFile& file = *parsed.value();
  tierkv::GgufFormatOptions options;
  options.max_array_items = 16;
  options.max_string_bytes = 256;
  for (const tierkv::GgufKv& kv : file.metadata()) {
    (void)tierkv::FormatGgufValue(kv.value, options);
    if (kv.value.is_array() && kv.value.size() > 0 &&
        kv.value.element_type() != tierkv::GgufValueType::kString) {
      (void)kv.value.ElementAs<double>(kv.value.size() - 1);
    }
  }
  for (const tierkv::GgufTensor& t : file.tensors()) {
    if (t.file_offset > size || t.n_bytes > size - t.file_offset) std::abort();
    if (t.n_bytes > 0) {
      volatile uint8_t last = t.data[t.n_bytes - 1];  // inside the input
      (void)last;
    }
  }
  return 0;
}
