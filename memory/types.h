// memory/types.h
//
// Distinct id types so pages, frames and tiers cannot be mixed up, and the tier order.
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tierkv {

// A strongly typed integer id. Tag makes PageId and FrameId different types.
template <typename Tag, typename Rep = uint32_t>
struct StrongId {
  static constexpr Rep kInvalid = static_cast<Rep>(-1);
  Rep value = kInvalid;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : value(v) {}
  constexpr bool valid() const { return value != kInvalid; }
  friend constexpr bool operator==(StrongId a, StrongId b) = default;
  friend constexpr auto operator<=>(StrongId a, StrongId b) = default;
};

struct PageIdTag {};
struct FrameIdTag {};
using PageId = StrongId<PageIdTag>;    // logical page (KV block, expert slice)
using FrameId = StrongId<FrameIdTag>;  // slot index within one tier's arena

// Tiers, fastest first. Eviction demotes to the next tier down (larger index).
enum class Tier : uint8_t { kDevice = 0, kHost = 1, kDisk = 2 };
inline constexpr int kNumTiers = 3;
inline constexpr int TierIndex(Tier t) { return static_cast<int>(t); }
inline constexpr Tier TierAt(int i) { return static_cast<Tier>(i); }
const char* TierName(Tier t);  // "device", "host", "disk"

inline constexpr size_t kKiB = 1024;
inline constexpr size_t kMiB = 1024 * kKiB;
inline constexpr size_t kGiB = 1024 * kMiB;

}  // namespace tierkv

template <typename Tag, typename Rep>
struct std::hash<tierkv::StrongId<Tag, Rep>> {
  size_t operator()(tierkv::StrongId<Tag, Rep> id) const noexcept { return std::hash<Rep>()(id.value); }
};
