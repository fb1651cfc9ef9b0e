#include "cxlkv/coherence/key.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "xxhash.h"

namespace cxlkv::coherence {
namespace {

// "cxlkvdg1" read as a big-endian word: the digest keys' hash seed (the token chain's
// ChainKey hashes with seed 0).
constexpr XXH64_hash_t kDigestSeed = 0x63786c6b76646731ull;
// "cxlkvnm1": NameKey's.
constexpr XXH64_hash_t kNameSeed = 0x63786c6b766e6d31ull;

// Little-endian bytes of v, whatever the host's byte order.
void PutLe64(unsigned char* dst, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<unsigned char>(v >> (8 * i));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string FormatKey(const PrefixKey& key) {
  return absl::StrFormat("%016x%016x", key.hi, key.lo);
}

absl::StatusOr<PrefixKey> ParseKey(absl::string_view text) {
  absl::string_view t = text;
  if (t.size() >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) t.remove_prefix(2);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", text, "': ", why,
        "; a key is 32 hex digits, the high word first (as cxlkvctl and the logs print it)"));
  };
  if (t.size() != 32) return bad(absl::StrCat("has ", t.size(), " hex digits"));
  PrefixKey k;
  for (std::size_t i = 0; i < 32; ++i) {
    const int d = HexDigit(t[i]);
    if (d < 0) return bad(absl::StrCat("character ", i + 1, " is not a hex digit"));
    std::uint64_t& w = i < 16 ? k.hi : k.lo;
    w = (w << 4) | static_cast<std::uint64_t>(d);
  }
  return k;
}

PrefixKey NameKey(Namespace ns, absl::string_view name) {
  std::string in(8, '\0');
  PutLe64(reinterpret_cast<unsigned char*>(in.data()), ns);
  in.append(name.data(), name.size());
  const XXH128_hash_t h = XXH3_128bits_withSeed(in.data(), in.size(), kNameSeed);
  PrefixKey k{h.low64, h.high64};
  if (k.lo == 0 && k.hi == 0) k.lo = 1;  // the zero key is the root, never an object
  return k;
}

absl::StatusOr<PrefixKey> DigestKey(Namespace ns, const PrefixKey& parent,
                                    std::span<const std::byte> digest) {
  if (digest.size() != 16 && digest.size() != kMaxDigestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the digest is ", digest.size(),
        " bytes; pass a 128-bit (16-byte) or 256-bit (32-byte) digest — the raw bytes of the "
        "engine's block hash, not its hex text"));
  }
  // ns | parent.lo | parent.hi | digest length | digest.
  unsigned char in[8 + 16 + 1 + kMaxDigestBytes];
  PutLe64(in, ns);
  PutLe64(in + 8, parent.lo);
  PutLe64(in + 16, parent.hi);
  in[24] = static_cast<unsigned char>(digest.size());
  std::memcpy(in + 25, digest.data(), digest.size());
  const XXH128_hash_t h = XXH3_128bits_withSeed(in, 25 + digest.size(), kDigestSeed);
  PrefixKey k{h.low64, h.high64};
  if (k.lo == 0 && k.hi == 0) k.lo = 1;  // the zero key is the root, never a block
  return k;
}

}  // namespace cxlkv::coherence
