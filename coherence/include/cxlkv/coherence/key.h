// cxlkv/coherence/key.h — the 128-bit key of a KV block, and the namespace it lives in.
//
// A PrefixKey names one block of a token sequence: prefix.h's ChainKey() derives it from the
// namespace, the parent block's key and the block's token ids, so equal keys mean equal
// prefixes (within a namespace). The lease protocol (prefix.h) indexes blocks by it; the
// tiers (tier/: NVMe store, reuse tracker, TierManager) name blocks by it too, and include
// only this header, not the protocol's.
//
// Plain values: no state, safe to copy and compare from any thread.
#ifndef CXLKV_COHERENCE_KEY_H_
#define CXLKV_COHERENCE_KEY_H_

#include <cstddef>
#include <cstdint>

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

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_KEY_H_
