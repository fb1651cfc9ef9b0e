// An LMCache object's key and its name and key in the domain's prefix index (index_key.h):
// the one place they are computed, for the coordinator and the C API alike.
#include "cxlkv/orchestrator/lmcache/index_key.h"

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::coordinator {

absl::Status CheckKey(const ObjectKey& k) {
  const std::string& h = k.chunk_hash_hex;
  bool ok = h.size() % 2 == 0;
  for (char ch : h) ok = ok && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
  if (!ok) {
    return absl::InvalidArgumentError(
        "encoded object key must use its canonical representation (chunk_hash_hex: lower-case "
        "hex of even length)");
  }
  // LMCache's ObjectKey invariants, in its order and words (docs/lmcache.md "Keys"): its L2
  // adapters use '@' as a field separator and put the salt in file names.
  if (k.model_name.find('@') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_name must not contain '@' (got '", k.model_name, "')"));
  }
  if (k.object_group_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("object_group_id must be >= 0 (got ", k.object_group_id, ")"));
  }
  if (k.cache_salt.find_first_of("@/\\\0", 0, 4) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache_salt must not contain '@', '/', '\\' or NUL (got '", k.cache_salt, "')"));
  }
  // Python counts characters: UTF-8 bytes that do not continue a character.
  std::size_t chars = 0;
  for (char ch : k.cache_salt) {
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++chars;
  }
  if (chars > kMaxCacheSaltChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt exceeds max length ", kMaxCacheSaltChars, " (got ", chars, ")"));
  }
  return absl::OkStatus();
}

std::string IndexName(const ObjectKey& k) {
  return absl::StrCat(k.chunk_hash_hex, "\x1f", k.model_name, "\x1f", k.kv_rank, "\x1f",
                      k.object_group_id, "\x1f", k.cache_salt);
}

coherence::Namespace IndexNamespace(absl::string_view tenant, absl::string_view layout_id) {
  return coherence::MakeNamespace(tenant, "lmcache", layout_id);
}

coherence::PrefixKey IndexKey(coherence::Namespace ns, const ObjectKey& k) {
  return coherence::NameKey(ns, IndexName(k));
}

}  // namespace cxlkv::coordinator
