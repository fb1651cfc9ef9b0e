// The C API's key constructors beyond the token chain (cxlkv.h: cxlkv_prefix_key_from_digest):
// a block key from a digest an engine computed itself — coherence::DigestKey (key.h), whose
// input layout and seed are a frozen format — a key from a name, and an LMCache object's name
// and key in the domain's index, computed by the coordinator's own functions
// (cxlkv/orchestrator/lmcache/index_key.h), never written out again here.
#include "cxlkv/coherence/key.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "capi_internal.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/lmcache/index_key.h"

CXLKV_API int cxlkv_prefix_key_from_name(uint64_t ns, const void* name, size_t name_len,
                                         cxlkv_prefix_key* out) {
  using cxlkv::capi::Fail;
  if (out == nullptr || (name == nullptr && name_len != 0)) {
    return Fail(CXLKV_E_INVALID, "cxlkv_prefix_key_from_name: name and out must be set");
  }
  const auto k =
      cxlkv::coherence::NameKey(ns, absl::string_view(static_cast<const char*>(name), name_len));
  *out = cxlkv_prefix_key{k.lo, k.hi};
  return CXLKV_OK;
}

CXLKV_API int cxlkv_prefix_key_from_digest(uint64_t ns, const cxlkv_prefix_key* parent,
                                           const void* digest, size_t digest_len,
                                           cxlkv_prefix_key* out) {
  using cxlkv::capi::Fail;
  if (out == nullptr || digest == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_prefix_key_from_digest: digest and out must be set");
  }
  const cxlkv::coherence::PrefixKey p = parent != nullptr
                                            ? cxlkv::coherence::PrefixKey{parent->lo, parent->hi}
                                            : cxlkv::coherence::PrefixKey{};
  auto k = cxlkv::coherence::DigestKey(
      ns, p, std::span<const std::byte>(static_cast<const std::byte*>(digest), digest_len));
  if (!k.ok()) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_prefix_key_from_digest: " + std::string(k.status().message()));
  }
  *out = cxlkv_prefix_key{k->lo, k->hi};
  return CXLKV_OK;
}

namespace {

// The C key as the coordinator's ObjectKey, checked by the coordinator's own CheckKey: the
// one place the fields' rules live (index_key.h). `fn` names the call in the error.
absl::StatusOr<cxlkv::coordinator::ObjectKey> LmcacheKey(const char* fn,
                                                         const cxlkv_lmcache_key* key) {
  if (key == nullptr) return absl::InvalidArgumentError(absl::StrCat(fn, ": key must be set"));
  if (key->chunk_hash_hex == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": key->chunk_hash_hex must be set (the chunk's hash, hex)"));
  }
  if (key->model_name == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": key->model_name must be set"));
  }
  cxlkv::coordinator::ObjectKey k{key->chunk_hash_hex, key->model_name, key->kv_rank,
                                  key->object_group_id,
                                  key->cache_salt != nullptr ? key->cache_salt : ""};
  if (auto st = cxlkv::coordinator::CheckKey(k); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": ", st.message()));
  }
  return k;
}

}  // namespace

CXLKV_API int cxlkv_lmcache_index_key(const char* tenant, const char* layout_id,
                                      const cxlkv_lmcache_key* key, uint64_t* ns,
                                      cxlkv_prefix_key* out) {
  using cxlkv::capi::Fail;
  if (tenant == nullptr || layout_id == nullptr || out == nullptr) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_lmcache_index_key: tenant, layout_id and out must be set (layout_id: "
                "the domain's [lmcache] layout_id)");
  }
  auto k = LmcacheKey("cxlkv_lmcache_index_key", key);
  if (!k.ok()) return Fail(CXLKV_E_INVALID, std::string(k.status().message()));
  const cxlkv::coherence::Namespace n = cxlkv::coordinator::IndexNamespace(tenant, layout_id);
  const cxlkv::coherence::PrefixKey p = cxlkv::coordinator::IndexKey(n, *k);
  if (ns != nullptr) *ns = n;
  *out = cxlkv_prefix_key{p.lo, p.hi};
  return CXLKV_OK;
}

CXLKV_API int cxlkv_lmcache_index_name(const cxlkv_lmcache_key* key, char* buf, size_t len,
                                       size_t* needed) {
  using cxlkv::capi::Fail;
  if (buf == nullptr && len != 0) {
    return Fail(CXLKV_E_INVALID, "cxlkv_lmcache_index_name: buf is NULL but len is not 0");
  }
  auto k = LmcacheKey("cxlkv_lmcache_index_name", key);
  if (!k.ok()) return Fail(CXLKV_E_INVALID, std::string(k.status().message()));
  const std::string name = cxlkv::coordinator::IndexName(*k);
  if (needed != nullptr) *needed = name.size() + 1;
  if (buf == nullptr) return CXLKV_OK;
  if (len < name.size() + 1) {
    return Fail(CXLKV_E_INVALID,
                absl::StrCat("cxlkv_lmcache_index_name: the name needs ", name.size() + 1,
                             " bytes with its NUL, buf has ", len, "; pass a larger buffer"));
  }
  std::memcpy(buf, name.c_str(), name.size() + 1);
  return CXLKV_OK;
}
