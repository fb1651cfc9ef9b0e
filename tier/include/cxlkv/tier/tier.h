// cxlkv/tier/tier.h — where a KV block can live: the one Tier enum of the tier module.
//
// The placement rule (placement.h) and the Placer (placer.h) decide a Tier for a block; the
// TierManager (tier_manager.h) moves blocks to one. Both CXL kinds are kept apart because
// the rule prices them apart (an expander in the host, a switch-attached pool); a
// TierManager has one CXL arena and puts a block decided for either kind there.
//
// Plain values and pure functions: safe from any thread.
#ifndef CXLKV_TIER_TIER_H_
#define CXLKV_TIER_TIER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::tier {

// Fastest first: a "faster" tier has a lower value.
enum class Tier : std::uint8_t { kCxlExpanded = 0, kCxlPooled = 1, kNvme = 2, kDrop = 3 };
inline constexpr int kCxlTierCount = 2;  // kCxlExpanded, kCxlPooled index CXL arrays

constexpr bool IsCxl(Tier tier) noexcept {
  return tier == Tier::kCxlExpanded || tier == Tier::kCxlPooled;
}

// "cxl-expanded", "cxl-pooled", "nvme", "drop" (as cxlkvctl explain and the JSON print them).
absl::string_view TierName(Tier tier) noexcept;
// Parses "expanded"/"cxl-expanded" and "pooled"/"cxl-pooled"; kInvalidArgument names the
// accepted spellings.
absl::StatusOr<Tier> ParseCxlTier(absl::string_view name);

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_TIER_H_
