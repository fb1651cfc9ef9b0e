// Reading domain.toml with toml++: the parse and the typed, range-checked reads of one key,
// shared by every parser of its sections (the orchestrator's config, tier's [placement]) so
// that all of them word their errors alike: "<source>:<line>: key '<table.key>': <what>".
//
// Header-only, so base itself neither parses TOML nor links toml++: a target that includes
// this header links toml++ (PkgConfig::TOMLPP) itself. toml++ is used with exceptions on
// (TOML_EXCEPTIONS=1); ParseToml turns its parse error into a Status.
//
// Thread-safety: a TomlReader holds only the source's name; its methods are const.
#ifndef CXLKV_BASE_TOML_READER_H_
#define CXLKV_BASE_TOML_READER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/bytes.h"

#ifndef TOML_EXCEPTIONS
#define TOML_EXCEPTIONS 1
#endif
#include "toml++/toml.h"

static_assert(TOML_EXCEPTIONS, "cxlkv/pool/toml_reader.h catches toml++'s parse errors");

namespace cxlkv::base {

// Parses `text`, named `source_name` in errors: the root table, or kInvalidArgument with the
// line and toml++'s description.
inline absl::StatusOr<toml::table> ParseToml(absl::string_view text,
                                             absl::string_view source_name) {
  try {
    return toml::parse(std::string_view(text.data(), text.size()),
                       std::string_view(source_name.data(), source_name.size()));
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", static_cast<std::uint64_t>(e.source().begin.line), ": ",
                     std::string(e.description())));
  }
}

// Reads keys of a document named `source` (its file name, in every error).
class TomlReader {
 public:
  explicit TomlReader(absl::string_view source) : source_(source) {}

  // kInvalidArgument: "<source>:<line of n>: key '<key>': <what>".
  absl::Status Error(const toml::node& n, absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", static_cast<std::uint64_t>(n.source().begin.line), ": key '",
                     key, "': ", what));
  }

  absl::Status Str(const toml::node& n, absl::string_view key, std::string* out) const {
    if (!n.is_string()) return Error(n, key, "expected a string");
    *out = std::string(*n.value<std::string_view>());
    return absl::OkStatus();
  }

  absl::Status Bool(const toml::node& n, absl::string_view key, bool* out) const {
    if (!n.is_boolean()) return Error(n, key, "expected true or false");
    *out = *n.value<bool>();
    return absl::OkStatus();
  }

  // An integer in [lo, hi].
  absl::Status U32(const toml::node& n, absl::string_view key, std::uint32_t* out, std::int64_t lo,
                   std::int64_t hi) const {
    if (!n.is_integer()) return Error(n, key, "expected an integer");
    const std::int64_t v = *n.value<std::int64_t>();
    if (v < lo || v > hi) {
      return Error(n, key, absl::StrCat(v, " is out of range [", lo, ", ", hi, "]"));
    }
    *out = static_cast<std::uint32_t>(v);
    return absl::OkStatus();
  }

  // A number (integer or float) in [lo, hi].
  absl::Status Real(const toml::node& n, absl::string_view key, double* out, double lo,
                    double hi) const {
    if (!n.is_number()) return Error(n, key, "expected a number");
    const double v =
        n.is_integer() ? static_cast<double>(*n.value<std::int64_t>()) : *n.value<double>();
    if (!(v >= lo && v <= hi)) {
      return Error(n, key, absl::StrCat(v, " is out of range [", lo, ", ", hi, "]"));
    }
    *out = v;
    return absl::OkStatus();
  }

  // A positive byte count: an integer, or a string with a unit as ParseSize reads it ("256M").
  absl::Status Size(const toml::node& n, absl::string_view key, std::uint64_t* out) const {
    if (n.is_integer()) {
      if (*n.value<std::int64_t>() <= 0) return Error(n, key, "must be positive");
      *out = static_cast<std::uint64_t>(*n.value<std::int64_t>());
      return absl::OkStatus();
    }
    std::string s;
    if (auto st = Str(n, key, &s); !st.ok()) return Error(n, key, "expected a size like \"256M\"");
    auto v = ParseSize(s);
    if (!v.ok()) return Error(n, key, v.status().message());
    *out = *v;
    return absl::OkStatus();
  }

  // Reads one key's value; `key` is its full name ("table.key").
  using Handler = std::function<absl::Status(const toml::node&, const std::string& key)>;
  // Applies handlers to every key of the table `n` named `name` ("" for the root); a key
  // without one is an error that lists the known ones. Stops at the first error.
  absl::Status Table(const toml::node& n, const std::string& name,
                     const std::map<std::string, Handler>& handlers) const {
    const toml::table* t = n.as_table();
    if (t == nullptr) return Error(n, name, "expected a table");
    for (auto&& [k, v] : *t) {
      const std::string key(k.str());
      const std::string full = name.empty() ? key : absl::StrCat(name, ".", key);
      auto it = handlers.find(key);
      if (it == handlers.end()) {
        std::string known;
        for (const auto& [hk, _] : handlers) absl::StrAppend(&known, known.empty() ? "" : ", ", hk);
        return Error(v, full, absl::StrCat("unknown key (known here: ", known, ")"));
      }
      if (auto st = it->second(v, full); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_TOML_READER_H_
