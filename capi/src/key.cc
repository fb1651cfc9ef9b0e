// The C API's key constructors beyond the token chain (cxlkv.h: cxlkv_prefix_key_from_digest):
// a block key from a digest an engine computed itself. The input layout and the seed are a
// frozen format: keys derived here must match across processes, hosts and versions.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "capi_internal.h"
#include "cxlkv/cxlkv.h"
#include "xxhash.h"

namespace {

// "cxlkvdg1" read as a big-endian word: the digest keys' hash function (the token chain's
// ChainKey hashes with seed 0).
constexpr XXH64_hash_t kDigestSeed = 0x63786c6b76646731ull;
constexpr std::size_t kMaxDigestBytes = 32;

// Little-endian bytes of v, whatever the host's byte order.
void PutLe64(unsigned char* dst, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

CXLKV_API int cxlkv_prefix_key_from_digest(uint64_t ns, const cxlkv_prefix_key* parent,
                                           const void* digest, size_t digest_len,
                                           cxlkv_prefix_key* out) {
  using cxlkv::capi::Fail;
  if (out == nullptr || digest == nullptr) {
    return Fail(CXLKV_E_INVALID, "cxlkv_prefix_key_from_digest: digest and out must be set");
  }
  if (digest_len != 16 && digest_len != kMaxDigestBytes) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_prefix_key_from_digest: the digest is " + std::to_string(digest_len) +
                    " bytes; pass a 128-bit (16-byte) or 256-bit (32-byte) digest — the raw "
                    "bytes of the engine's block hash, not its hex text");
  }
  // ns | parent.lo | parent.hi (little-endian words) | digest_len (one byte) | digest.
  unsigned char in[8 + 16 + 1 + kMaxDigestBytes];
  PutLe64(in, ns);
  PutLe64(in + 8, parent != nullptr ? parent->lo : 0);
  PutLe64(in + 16, parent != nullptr ? parent->hi : 0);
  in[24] = static_cast<unsigned char>(digest_len);
  std::memcpy(in + 25, digest, digest_len);
  const XXH128_hash_t h = XXH3_128bits_withSeed(in, 25 + digest_len, kDigestSeed);
  cxlkv_prefix_key k{h.low64, h.high64};
  if (k.lo == 0 && k.hi == 0) k.lo = 1;  // the zero key is the root, never a block
  *out = k;
  return CXLKV_OK;
}
