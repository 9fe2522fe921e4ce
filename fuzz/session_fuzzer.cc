// fuzz/session_fuzzer.cc
//
// libFuzzer entry point for the session-file reader: Inspect, Verify and a lazy Restore
// whose every block is then paged in (record header, content key and checksum checks).
// Built like gguf_fuzzer (fuzz/CMakeLists.txt: a plain main() replays files; clang's
// libFuzzer fuzzes, by hand: docs/testing.md).
//
// Every input must give an error Status of one line or a session whose blocks page in
// verified or are refused as corrupt; nothing may read outside what it allocated (ASan)
// or allocate more than the header's geometry allows (bounded below: the fuzzer only
// restores geometries of at most 1 MiB a block).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "kvcache/kv_cache.h"
#include "kvcache/session_file.h"
#include "memory/memory_manager.h"

namespace {

void CheckOneLine(const tierkv::Status& st) {
  if (st.ok()) return;
  if (st.message().empty() || st.message().find('\n') != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader takes a path: the input as an anonymous file, named through /proc.
  const int fd = memfd_create("tierkv-session-fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      close(fd);
      return 0;
    }
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  auto summary = tierkv::SessionFile::Inspect(path);
  CheckOneLine(summary.status());
  CheckOneLine(tierkv::SessionFile::Verify(path));
  if (summary.ok() && summary->block_bytes <= (1u << 20) && summary->n_records <= 4096) {
    tierkv::MemoryOptions mo;
    mo.frame_bytes = 64 * 1024;
    while (mo.frame_bytes < summary->block_bytes) mo.frame_bytes *= 2;
    mo.host_bytes = 8 * mo.frame_bytes;
    mo.mlock = tierkv::MlockMode::kOff;
    mo.warmup = false;
    auto mm = tierkv::MemoryManager::Create(mo);
    if (mm.ok()) {
      auto cache = tierkv::KvCache::Create(mm->get(), summary->geometry);
      if (cache.ok()) {
        auto restored = tierkv::SessionFile::Restore(**cache, path, summary->model);
        CheckOneLine(restored.status());
        if (restored.ok()) {
          const tierkv::KvGeometry& g = (*cache)->geometry();
          for (int l = 0; l < g.n_layers; ++l) {
            for (int b = 0; b < (*cache)->NumBlocks(restored->seq); ++b) {
              auto pin = (*mm)->Acquire((*cache)->BlockPage(restored->seq, l, b), tierkv::Tier::kHost);
              if (!pin.ok()) {
                CheckOneLine(pin.status());
                // A block that fails is refused as corrupt, never handed out.
                if (pin.status().code() != tierkv::StatusCode::kCorruption &&
                    pin.status().code() != tierkv::StatusCode::kExhausted) {
                  std::abort();
                }
              }
            }
          }
        }
      }
    }
  }
  close(fd);
  return 0;
}
