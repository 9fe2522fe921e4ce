// fuzz/gguf_fuzzer.cc
//
// libFuzzer entry point for the GGUF reader and for everything sized by a GGUF header:
// the model config, the tokenizer and Model::Load. The CMake build compiles it with a
// plain main() (fuzz/standalone_main.cc: `build/<kind>/fuzz/gguf_fuzzer FILE...` replays
// inputs); fuzzing needs clang's libFuzzer: fuzz/build_libfuzzer.sh builds it
// (docs/gguf.md, "Tests and fuzzing").
//
// Every input must give an error Status or a file whose tensors lie inside the input;
// reading back every value must stay inside it too (ASan checks the reads). A file that
// parses then goes through ReadModelConfig, Tokenizer::FromGguf and Model::Load: each
// succeeds or gives a one-line error, and none allocates more than a small multiple of
// the input (ASan's allocation-size-too-big, libFuzzer's -rss_limit_mb and -malloc_limit_mb).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/tokenizer.h"

namespace {

void CheckOneLine(const tierkv::Status& st) {
  if (st.ok()) return;
  const std::string& message = st.message();
  if (message.empty() || message.find('\n') != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = tierkv::GgufFile::Parse(data, size);
  if (!parsed.ok()) {
    const std::string message = parsed.status().message();
    if (message.rfind("gguf: ", 0) != 0 || message.find('\n') != std::string::npos) std::abort();
    return 0;
  }
  const std::shared_ptr<const tierkv::GgufFile> shared = std::move(parsed).value();
  const tierkv::GgufFile& file = *shared;
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
  // The header sizes: whatever the metadata says, only values the tensors bear out size
  // anything.
  CheckOneLine(tierkv::Tokenizer::FromGguf(file).status());
  auto config = tierkv::ReadModelConfig(file);
  CheckOneLine(config.status());
  if (!config.ok()) return 0;
  tierkv::ModelOptions model_options;
  model_options.threads = 1;
  auto model = tierkv::Model::Load(shared, model_options);
  CheckOneLine(model.status());
  if (model.ok() && (*model)->config().n_vocab != config->n_vocab) std::abort();
  return 0;
}
