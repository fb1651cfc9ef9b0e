// The C API's key constructors beyond the token chain (cxlkv.h: cxlkv_prefix_key_from_digest):
// a block key from a digest an engine computed itself — coherence::DigestKey (key.h), whose
// input layout and seed are a frozen format.
#include "cxlkv/coherence/key.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/strings/string_view.h"
#include "capi_internal.h"
#include "cxlkv/cxlkv.h"

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
