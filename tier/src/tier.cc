// Tier names (tier.h).
#include "cxlkv/tier/tier.h"

#include "absl/strings/str_cat.h"

namespace cxlkv::tier {

absl::string_view TierName(Tier tier) noexcept {
  switch (tier) {
    case Tier::kCxlExpanded:
      return "cxl-expanded";
    case Tier::kCxlPooled:
      return "cxl-pooled";
    case Tier::kNvme:
      return "nvme";
    case Tier::kDrop:
      return "drop";
  }
  return "?";
}

absl::StatusOr<Tier> ParseCxlTier(absl::string_view name) {
  if (name == "expanded" || name == "cxl-expanded") return Tier::kCxlExpanded;
  if (name == "pooled" || name == "cxl-pooled") return Tier::kCxlPooled;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CXL tier '", name, "' (use \"expanded\" or \"pooled\")"));
}

}  // namespace cxlkv::tier
