// cxlkv/coherence/key.h — the 128-bit key of a KV block, and the namespace it lives in.
//
// A PrefixKey names one block of a token sequence: prefix.h's ChainKey() derives it from the
// namespace, the parent block's key and the block's token ids, so equal keys mean equal
// prefixes (within a namespace). The lease protocol (prefix.h) indexes blocks by it; the
// tiers (tier/: NVMe store, reuse tracker, TierManager) name blocks by it too, and include
// only this header, not the protocol's.
//
// The key's one text form (FormatKey / ParseKey) and keys from an engine's own digest
// (DigestKey) live here too, so every tool, log and binding agrees on them.
//
// Plain values: no state, safe to copy and compare from any thread.
#ifndef CXLKV_COHERENCE_KEY_H_
#define CXLKV_COHERENCE_KEY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::coherence {

// A namespace binds tenant, model and KV layout: a trust boundary no hit crosses.
// prefix.h's MakeNamespace() derives one from its three names.
using Namespace = std::uint64_t;

struct PrefixKey {
  std::uint64_t lo = 0, hi = 0;
  bool operator==(const PrefixKey&) const = default;
};

// A hash for in-process maps keyed by PrefixKey (absl::flat_hash_map, std::unordered_map).
// Keys are already XXH3 output, so mixing the two words is enough. Not stable across
// versions: never store it.
struct PrefixKeyHash {
  std::size_t operator()(const PrefixKey& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

// ---- The one text form of a key --------------------------------------------------------
//
// 32 lowercase hex digits, the high word first ("0123456789abcdef0011223344556677" is
// {hi = 0x0123456789abcdef, lo = 0x0011223344556677}): what every log line, error message,
// `cxlkvctl` listing, the orchestrator's RPC answers and Python's `str(PrefixKey)` print.
std::string FormatKey(const PrefixKey& key);
// The inverse: exactly 32 hex digits (either case; an optional "0x" prefix). kInvalidArgument
// names the text and the form expected.
absl::StatusOr<PrefixKey> ParseKey(absl::string_view text);

// ---- Keys from an engine's own block digest ---------------------------------------------
//
// A block key from a digest an engine computed itself (vLLM's block hash, SGLang's page
// hash): XXH3-128 (seed "cxlkvdg1") of ns | parent.lo | parent.hi (little-endian words) |
// the digest's length (one byte) | the digest. A frozen format: keys derived here must match
// across processes, hosts and versions (tests pin golden values). The digest is 16 or 32
// bytes — the raw bytes of the engine's hash, never its hex text; anything else is
// kInvalidArgument naming the length. The zero key (the root) is never returned.
inline constexpr std::size_t kMaxDigestBytes = 32;
absl::StatusOr<PrefixKey> DigestKey(Namespace ns, const PrefixKey& parent,
                                    std::span<const std::byte> digest);

// ---- Keys of named objects ---------------------------------------------------------------
//
// The key of an object that is not a block of a token chain but has a name of its own (an
// LMCache object: its EncodedObjectKey's fields in their text form, docs/lmcache.md): XXH3-128
// (seed "cxlkvnm1") of ns (a little-endian word) | the name's bytes. A frozen format, like
// DigestKey's (tests pin golden values); the zero key is never returned.
PrefixKey NameKey(Namespace ns, absl::string_view name);

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_KEY_H_
