#include "cxlkv/pool/spec.h"

#include <charconv>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/bytes.h"

namespace cxlkv::pool {
namespace {

constexpr absl::string_view kForms =
    "accepted forms: devdax:/dev/daxX.Y, kmem:node=N[?size=BYTES], "
    "file:PATH?size=BYTES, memfd:?size=BYTES (sizes take K/M/G/T); devdax and file take "
    "offset=BYTES&length=BYTES for a window";

absl::Status SpecError(absl::string_view spec, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("source spec '", spec, "': ", problem, "; ", kForms));
}

absl::StatusOr<bool> ParseBool(absl::string_view spec, absl::string_view key,
                               absl::string_view value) {
  if (value == "1" || value == "true" || value == "yes") return true;
  if (value == "0" || value == "false" || value == "no") return false;
  return SpecError(spec, absl::StrCat("parameter ", key, "=", value, " is not 0 or 1"));
}

}  // namespace

absl::string_view SourceKindName(SourceKind kind) noexcept {
  switch (kind) {
    case SourceKind::kDevdax:
      return "devdax";
    case SourceKind::kKmem:
      return "kmem";
    case SourceKind::kFile:
      return "file";
    case SourceKind::kMemfd:
      return "memfd";
  }
  return "?";
}

absl::StatusOr<SourceSpec> ParseSourceSpec(absl::string_view spec) {
  const auto colon = spec.find(':');
  if (colon == absl::string_view::npos) return SpecError(spec, "missing '<kind>:'");
  const absl::string_view kind = spec.substr(0, colon);
  absl::string_view rest = spec.substr(colon + 1);
  absl::string_view params;
  if (const auto q = rest.find('?'); q != absl::string_view::npos) {
    params = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }

  SourceSpec out;
  if (kind == "devdax") {
    out.kind = SourceKind::kDevdax;
    if (rest.empty() || rest[0] != '/') return SpecError(spec, "devdax needs a device path");
    out.path = std::string(rest);
  } else if (kind == "kmem") {
    out.kind = SourceKind::kKmem;
    if (!absl::ConsumePrefix(&rest, "node=")) return SpecError(spec, "kmem needs node=N");
    int node = -1;
    if (!absl::SimpleAtoi(rest, &node) || node < 0) {
      return SpecError(spec, absl::StrCat("node '", rest, "' is not a non-negative integer"));
    }
    out.numa_node = node;
  } else if (kind == "file") {
    out.kind = SourceKind::kFile;
    if (rest.empty()) return SpecError(spec, "file needs a path");
    out.path = std::string(rest);
  } else if (kind == "memfd") {
    out.kind = SourceKind::kMemfd;
    out.path = rest.empty() ? "cxlkv" : std::string(rest);
  } else {
    return SpecError(spec, absl::StrCat("unknown source kind '", kind, "'"));
  }

  if (!params.empty()) {
    for (absl::string_view kv : absl::StrSplit(params, '&')) {
      const auto eq = kv.find('=');
      if (eq == absl::string_view::npos) {
        return SpecError(spec, absl::StrCat("parameter '", kv, "' is not key=value"));
      }
      const absl::string_view key = kv.substr(0, eq), value = kv.substr(eq + 1);
      if (key == "size") {
        auto size = base::ParseSize(value);
        if (!size.ok()) return SpecError(spec, size.status().message());
        if (*size == 0) return SpecError(spec, "size=0 is not a usable size");
        out.size_bytes = *size;
      } else if (key == "reserve" && out.kind == SourceKind::kFile) {
        auto b = ParseBool(spec, key, value);
        if (!b.ok()) return b.status();
        out.reserve = *b;
      } else if ((key == "offset" || key == "length") &&
                 (out.kind == SourceKind::kDevdax || out.kind == SourceKind::kFile)) {
        auto v = base::ParseSize(value);
        if (!v.ok()) return SpecError(spec, absl::StrCat(key, ": ", v.status().message()));
        (key == "offset" ? out.offset : out.length) = *v;
        if (key == "length" && *v == 0) return SpecError(spec, "length=0 is not a usable window");
      } else if (key == "shared") {
        auto b = ParseBool(spec, key, value);
        if (!b.ok()) return b.status();
        out.shared = *b;
      } else {
        return SpecError(
            spec, absl::StrCat("unknown parameter '", key, "' for ", SourceKindName(out.kind)));
      }
    }
  }
  if (out.offset != 0 && out.length == 0) {
    return SpecError(spec, "offset= needs length= (the window's size)");
  }
  if (out.kind == SourceKind::kMemfd && out.size_bytes == 0) {
    return SpecError(spec, "memfd needs ?size=BYTES");
  }
  if (out.kind == SourceKind::kDevdax && out.size_bytes != 0) {
    return SpecError(spec, "devdax takes its size from the device; drop size=");
  }
  return out;
}

std::string SourceSpec::ToString() const {
  std::string s;
  switch (kind) {
    case SourceKind::kDevdax:
      s = absl::StrCat("devdax:", path);
      break;
    case SourceKind::kKmem:
      s = absl::StrCat("kmem:node=", numa_node);
      break;
    case SourceKind::kFile:
      s = absl::StrCat("file:", path);
      break;
    case SourceKind::kMemfd:
      s = absl::StrCat("memfd:", path == "cxlkv" ? "" : path);
      break;
  }
  std::string params;
  auto add = [&params](absl::string_view p) {
    absl::StrAppend(&params, params.empty() ? "?" : "&", p);
  };
  if (size_bytes != 0) add(absl::StrCat("size=", size_bytes));
  if (kind == SourceKind::kFile && !reserve) add("reserve=0");
  if (length != 0) add(absl::StrCat("offset=", offset, "&length=", length));
  if (shared) add("shared=1");
  return s + params;
}

}  // namespace cxlkv::pool
