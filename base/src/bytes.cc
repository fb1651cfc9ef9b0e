#include "cxlkv/base/bytes.h"

#include <charconv>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlkv::base {

absl::StatusOr<std::uint64_t> ParseSize(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("size is empty (e.g. 8G, 512M, 4096)");
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr == text.data()) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "' is not a number with an optional K/M/G/T suffix"));
  }
  absl::string_view suffix(ptr, static_cast<std::size_t>(end - ptr));
  if (suffix == "iB" || suffix == "B") suffix = "";
  unsigned shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("size '", text, "' has unknown suffix '", suffix, "' (use K, M, G, T)"));
    }
    const absl::string_view rest = suffix.substr(1);
    if (!(rest.empty() || rest == "iB" || rest == "B")) {
      return absl::InvalidArgumentError(
          absl::StrCat("size '", text, "' has unknown suffix '", suffix, "' (use K, M, G, T)"));
    }
  }
  if (shift != 0 && value > (std::numeric_limits<std::uint64_t>::max() >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' overflows 64 bits"));
  }
  return value << shift;
}

std::string FormatBytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.*f %s", v == static_cast<double>(static_cast<std::uint64_t>(v)) ? 0 : 2,
                         v, kUnits[unit]);
}

}  // namespace cxlkv::base
