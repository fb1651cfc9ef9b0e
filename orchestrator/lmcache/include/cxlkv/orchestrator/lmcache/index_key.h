// cxlkv/orchestrator/lmcache/index_key.h — an LMCache object's key (LMCache's
// EncodedObjectKey), LMCache's rules for it, and the name and key it has in a domain's prefix
// index (docs/lmcache.md "Keys in the domain's index"). The one home of that key: the
// coordinator publishes under it, and the C API (cxlkv_lmcache_index_key, _name) and through
// it Python compute it, so a reader on any host derives the key the owner published.
//
// A target of its own (cxlkv::lmcache_key, over coherence only) so that libcxlkv.so can link
// it without the coordinator, which is daemon-side (docs/architecture.md: the C API uses of
// the orchestrator only the client and this key). Pure functions: any thread, no state.
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_INDEX_KEY_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_INDEX_KEY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/key.h"

namespace cxlkv::coordinator {

// LMCache's EncodedObjectKey: chunk_hash_hex is lower-case hex of an even length.
struct ObjectKey {
  std::string chunk_hash_hex;
  std::string model_name;
  std::int64_t kv_rank = 0;
  std::int64_t object_group_id = 0;
  std::string cache_salt;
  bool operator==(const ObjectKey&) const = default;
};

// kInvalidArgument, in LMCache's words and naming the field, for a key LMCache refuses
// (docs/lmcache.md "Keys"): chunk_hash_hex not lower-case hex of even length, '@' in
// model_name, a negative object_group_id, '@', '/', '\\' or NUL in cache_salt, or a salt of
// more than kMaxCacheSaltChars characters. The coordinator refuses such a key on every route,
// so no object under it is ever in the index.
inline constexpr std::size_t kMaxCacheSaltChars = 128;
absl::Status CheckKey(const ObjectKey& k);

// The key's name in the index: chunk_hash_hex, model_name, kv_rank, object_group_id and
// cache_salt, the integers in decimal, joined by the byte 0x1F. A frozen format (readers on
// other hosts and other versions derive the same key; tests/key_test.cc and
// tests/capi_lmcache_key_test.cc pin it). Does not check the key (CheckKey does).
std::string IndexName(const ObjectKey& k);
// The namespace of a tenant's objects in the index: coherence::MakeNamespace(tenant,
// "lmcache", layout_id), layout_id being [lmcache] layout_id (LMCache's
// --l1-shared-layout-id).
coherence::Namespace IndexNamespace(absl::string_view tenant, absl::string_view layout_id);
// The object's key in namespace ns: coherence::NameKey(ns, IndexName(k)).
coherence::PrefixKey IndexKey(coherence::Namespace ns, const ObjectKey& k);

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_INDEX_KEY_H_
