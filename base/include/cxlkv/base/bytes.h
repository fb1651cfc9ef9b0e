// cxlkv/base/bytes.h — byte counts as people write them: "123", "64K", "8G", "2MiB" (binary
// units K, M, G, T, an optional "B" or "iB" after the unit) and back ("5 MiB"). Used by source
// specs, domain.toml, the preload's settings and every message that names a size. Pure and
// thread-safe.
#ifndef CXLKV_BASE_BYTES_H_
#define CXLKV_BASE_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::base {

// Parses "123", "64K", "8G" (binary units). Rejects overflow, empty and unknown suffixes
// (kInvalidArgument quoting the text).
absl::StatusOr<std::uint64_t> ParseSize(absl::string_view text);

// "5 MiB"-style rendering for messages and summaries.
std::string FormatBytes(std::uint64_t bytes);

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_BYTES_H_
