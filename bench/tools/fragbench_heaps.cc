// bench/tools/fragbench_heaps.cc
#include "bench/tools/fragbench_heaps.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TIERKV_FRAGBENCH_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define TIERKV_FRAGBENCH_SANITIZED 1
#endif
#endif

namespace tierkv::fragbench {
namespace {

uint64_t PositivePart(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

class GlibcHeap : public Heap {
 public:
  Status Probe() override {
#ifdef TIERKV_FRAGBENCH_SANITIZED
    return Status::Unsupported("malloc is the sanitizer's allocator in this build, not glibc's");
#else
    // mallinfo2() must see a 4 MiB allocation; it does not when another allocator
    // replaced malloc (LD_PRELOAD, a sanitizer).
    const struct mallinfo2 before = mallinfo2();
    void* volatile p = std::malloc(4 << 20);  // volatile: the pair must not be elided
    const struct mallinfo2 after = mallinfo2();
    std::free(p);
    if (p == nullptr) return Status::Unsupported("malloc(4 MiB) failed");
    if (after.uordblks + after.hblkhd < before.uordblks + before.hblkhd + (4 << 20)) {
      return Status::Unsupported("mallinfo2() does not see malloc (is another allocator preloaded?)");
    }
    return Status::Ok();
#endif
  }
  std::string Describe() const override {
    return std::string("glibc ") + gnu_get_libc_version() + " malloc, footprint from mallinfo2()";
  }
  void* Allocate(uint64_t bytes) override { return std::malloc(bytes); }
  void Deallocate(void* p) override { std::free(p); }
  uint64_t UsableSize(void* p) override { return malloc_usable_size(p); }
  void TakeBaseline() override { base_ = mallinfo2(); }
  uint64_t HeldSinceBaseline() override {
    // In use (heap chunks with their headers, and mmapped chunks) beyond the baseline,
    // plus free bytes in the arenas (bins and top chunk) beyond the baseline's. Free
    // memory that existed before the baseline and was reused is not counted twice.
    const struct mallinfo2 now = mallinfo2();
    const auto in_use =
        static_cast<int64_t>(now.uordblks + now.hblkhd) - static_cast<int64_t>(base_.uordblks + base_.hblkhd);
    const auto free = static_cast<int64_t>(now.fordblks) - static_cast<int64_t>(base_.fordblks);
    return PositivePart(in_use) + PositivePart(free);
  }
  void ReturnMemory() override { malloc_trim(0); }

 private:
  struct mallinfo2 base_ {};
};

// mimalloc's entry points, resolved once. The library stays loaded for the life of the
// process: it registers thread-exit hooks, so unloading it is not safe.
struct MimallocLib {
  void* (*malloc)(size_t) = nullptr;
  void (*free)(void*) = nullptr;
  size_t (*usable_size)(const void*) = nullptr;
  void (*process_info)(size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*) = nullptr;
  void (*collect)(bool) = nullptr;
  int (*version)() = nullptr;
  std::string error;  // empty when loaded
};

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr && error->empty()) *error = std::string("libmimalloc.so.2 has no ") + name;
  return *fn != nullptr;
}

const MimallocLib& LoadMimalloc() {
  static const MimallocLib lib = [] {
    MimallocLib l;
    // RTLD_LOCAL: its malloc/free must not interpose on the rest of the process.
    void* handle = dlopen("libmimalloc.so.2", RTLD_LOCAL | RTLD_NOW);
    if (handle == nullptr) {
      const char* why = dlerror();
      l.error = std::string("libmimalloc.so.2 cannot be loaded: ") + (why ? why : "unknown error");
      return l;
    }
    Resolve(handle, "mi_malloc", &l.malloc, &l.error);
    Resolve(handle, "mi_free", &l.free, &l.error);
    Resolve(handle, "mi_usable_size", &l.usable_size, &l.error);
    Resolve(handle, "mi_process_info", &l.process_info, &l.error);
    Resolve(handle, "mi_collect", &l.collect, &l.error);
    Resolve(handle, "mi_version", &l.version, &l.error);
    return l;
  }();
  return lib;
}

class MimallocHeap : public Heap {
 public:
  MimallocHeap() : lib_(LoadMimalloc()) {}
  Status Probe() override {
    if (!lib_.error.empty()) return Status::Unsupported(lib_.error);
    return Status::Ok();
  }
  std::string Describe() const override {
    const int v = lib_.version();
    return "mimalloc " + std::to_string(v / 100) + "." + std::to_string(v / 10 % 10) + "." + std::to_string(v % 10) +
           " (dlopen), footprint = committed bytes from mi_process_info()";
  }
  void* Allocate(uint64_t bytes) override { return lib_.malloc(bytes); }
  void Deallocate(void* p) override { lib_.free(p); }
  uint64_t UsableSize(void* p) override { return lib_.usable_size(p); }
  void TakeBaseline() override { base_commit_ = Committed(); }
  uint64_t HeldSinceBaseline() override {
    return PositivePart(static_cast<int64_t>(Committed()) - static_cast<int64_t>(base_commit_));
  }
  void ReturnMemory() override { lib_.collect(true); }

 private:
  uint64_t Committed() {
    size_t elapsed, user, system, rss, peak_rss, commit = 0, peak_commit, faults;
    lib_.process_info(&elapsed, &user, &system, &rss, &peak_rss, &commit, &peak_commit, &faults);
    return commit;
  }
  const MimallocLib& lib_;
  uint64_t base_commit_ = 0;
};

}  // namespace

std::unique_ptr<Heap> NewGlibcHeap() { return std::make_unique<GlibcHeap>(); }
std::unique_ptr<Heap> NewMimallocHeap() { return std::make_unique<MimallocHeap>(); }

}  // namespace tierkv::fragbench
