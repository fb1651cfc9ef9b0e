// JSON for `cxlkvctl status|hosts|extents|prefixes|drain|evict --json`, written exactly as
// the control plane's messages print in protobuf's JSON mapping (the format these commands
// have always had, which scripts and tests parse): field names as in orchestrator.proto and
// in its field order, every field present even when zero, 64-bit integers as strings, one
// space of indent per level, and strings escaped as protobuf escapes them (besides '"', '\'
// and control characters: '<', '>', DEL, and Unicode's invisible format characters, so the
// output is safe to paste into HTML and shows no hidden text). cxlkvctl speaks to the
// orchestrator through the client library's plain structs; this keeps its output unchanged.
#ifndef CXLKV_TOOLS_CXLKVCTL_WIRE_JSON_H_
#define CXLKV_TOOLS_CXLKVCTL_WIRE_JSON_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cxlkv::ctl {

// Whether protobuf's JSON printer writes code point `cp` as \uXXXX (beyond ASCII).
inline bool WireJsonEscapes(std::uint32_t cp) {
  static constexpr std::pair<std::uint32_t, std::uint32_t> kRanges[] = {
      {0x80, 0x9F},       {0xAD, 0xAD},       {0x600, 0x603},    {0x6DD, 0x6DD},
      {0x70F, 0x70F},     {0x17B4, 0x17B5},   {0x200B, 0x200F},  {0x2028, 0x202E},
      {0x2060, 0x2064},   {0x206A, 0x206F},   {0xFEFF, 0xFEFF},  {0xFFF9, 0xFFFB},
      {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F}};
  for (const auto& [lo, hi] : kRanges) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

// `s` as a JSON string literal, quotes included. `s` is UTF-8 (the wire guarantees it for
// string fields); a byte that starts no valid sequence is copied as it is.
inline std::string WireJsonString(std::string_view s) {
  std::string out = "\"";
  auto hex4 = [&out](std::uint32_t u) {
    char buf[16];  // "\\u" + up to 8 hex digits + NUL: gcc -O2 cannot tell u < 0x10000
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(u));
    out += buf;
  };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\r':
          out += "\\r";
          break;
        default:
          if (c < 0x20 || c == '<' || c == '>' || c == 0x7f) {
            hex4(c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: its length from the lead byte, its code point from the rest.
    const std::size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n == 1 || i + n > s.size()) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::uint32_t cp = c & (0x7Fu >> n);
    for (std::size_t k = 1; k < n; ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
    }
    if (!WireJsonEscapes(cp)) {
      out.append(s.substr(i, n));
    } else if (cp < 0x10000) {
      hex4(cp);
    } else {  // a surrogate pair, as JSON spells code points beyond the BMP
      hex4(0xD800 + ((cp - 0x10000) >> 10));
      hex4(0xDC00 + ((cp - 0x10000) & 0x3FF));
    }
    i += n;
  }
  out += '"';
  return out;
}

// One message: fields in the order added.
class WireJson {
 public:
  WireJson& Str(const char* name, std::string_view v) {
    fields_.emplace_back(name, WireJsonString(v));
    return *this;
  }
  WireJson& U32(const char* name, std::uint32_t v) {
    fields_.emplace_back(name, std::to_string(v));
    return *this;
  }
  WireJson& U64(const char* name, std::uint64_t v) {  // quoted, as protobuf prints 64 bits
    fields_.emplace_back(name, "\"" + std::to_string(v) + "\"");
    return *this;
  }
  WireJson& I64(const char* name, std::int64_t v) {
    fields_.emplace_back(name, "\"" + std::to_string(v) + "\"");
    return *this;
  }
  WireJson& StrList(const char* name, const std::vector<std::string>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      out += (i == 0 ? "" : ", ") + WireJsonString(v[i]);
    }
    fields_.emplace_back(name, out + "]");
    return *this;
  }
  WireJson& List(const char* name, std::vector<WireJson> items) {
    fields_.emplace_back(name, std::move(items));
    return *this;
  }

  // The whole document, newline-terminated.
  std::string Dump() const {
    std::string out;
    Write(out, 0);
    out += '\n';
    return out;
  }

 private:
  void Write(std::string& out, std::size_t depth) const {
    if (fields_.empty()) {
      out += "{}";
      return;
    }
    out += "{\n";
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      out.append(depth + 1, ' ');
      out += '"';
      out += fields_[f].first;
      out += "\": ";
      if (const auto* scalar = std::get_if<std::string>(&fields_[f].second)) {
        out += *scalar;
      } else {
        const auto& items = std::get<std::vector<WireJson>>(fields_[f].second);
        if (items.empty()) {
          out += "[]";
        } else {
          out += "[\n";
          for (std::size_t i = 0; i < items.size(); ++i) {
            out.append(depth + 2, ' ');
            items[i].Write(out, depth + 2);
            out += i + 1 < items.size() ? ",\n" : "\n";
          }
          out.append(depth + 1, ' ');
          out += ']';
        }
      }
      out += f + 1 < fields_.size() ? ",\n" : "\n";
    }
    out.append(depth, ' ');
    out += '}';
  }

  std::vector<std::pair<std::string, std::variant<std::string, std::vector<WireJson>>>> fields_;
};

}  // namespace cxlkv::ctl

#endif  // CXLKV_TOOLS_CXLKVCTL_WIRE_JSON_H_
