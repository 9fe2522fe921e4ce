// bench/tools/fragbench_heaps.h
//
// The real allocators fragbench replays into, behind one small interface: glibc malloc,
// measured with mallinfo2(), and mimalloc, loaded with dlopen(RTLD_LOCAL) and measured
// with mi_process_info(). mimalloc is never linked: linking it would replace malloc for
// the whole process and leave no glibc malloc to compare against.
//
// Thread-safety: none. The measurements are process-wide, so a replay is only exact
// while no other thread allocates from the same heap.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memory/status.h"

namespace tierkv::fragbench {

class Heap {
 public:
  virtual ~Heap() = default;
  // Ok when this heap can be replayed and measured in this process; otherwise why not
  // (library missing, malloc replaced by a sanitizer).
  virtual Status Probe() = 0;
  virtual std::string Describe() const = 0;  // "glibc 2.36 malloc, footprint from mallinfo2()"
  // REQUIRES: Probe() is ok.
  virtual void* Allocate(uint64_t bytes) = 0;  // nullptr when the heap is out of memory
  virtual void Deallocate(void* p) = 0;
  virtual uint64_t UsableSize(void* p) = 0;
  virtual void TakeBaseline() = 0;
  // Bytes the heap holds for allocations made since TakeBaseline(): in-use bytes plus
  // free bytes it keeps beyond those it kept at the baseline. Allocates nothing.
  virtual uint64_t HeldSinceBaseline() = 0;
  // Hands cached free memory back to the OS (after a replay, so the next starts clean).
  virtual void ReturnMemory() = 0;
};

std::unique_ptr<Heap> NewGlibcHeap();
std::unique_ptr<Heap> NewMimallocHeap();

}  // namespace tierkv::fragbench
