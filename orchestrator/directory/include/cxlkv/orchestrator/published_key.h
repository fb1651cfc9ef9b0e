// cxlkv/orchestrator/published_key.h — chain keys keyed with a domain's secret before they
// leave the domain (KV events, the cross-domain directory's summary; docs/kv_events.md, "What
// a subscriber can learn").
//
// A chain key is an unkeyed XXH3 of public names and token ids, so anyone who sees one can
// test a guessed prompt against it. Keys that leave the domain are therefore replaced by
//
//   K' = the first 16 bytes of HMAC-SHA256(secret, "cxlkv published key v1\0" || hi || lo)
//
// (hi and lo the key's words, 8 bytes big-endian each; K'.hi the first 8 bytes, big-endian,
// K'.lo the next 8). Whoever holds the secret (a router configured with it) computes K' from
// its own chain key and matches; without the secret K' is indistinguishable from random and
// a guessed prompt cannot be tested. A secret has an id, the first 8 bytes (big-endian) of
// HMAC-SHA256(secret, "cxlkv key id v1\0"), which a directory summary carries so a reader
// picks the right secret; the id reveals nothing about the secret.
//
// HMAC-SHA256 from OpenSSL's libcrypto (already linked through gRPC): a keyed hash with a
// security proof, maintained and audited, and the same function Python's standard `hmac`
// module computes, so routers need no cxlkv code to match (python/cxlkv/keys.py).
//
// Thread-safety: a PublishedKeyer is immutable after Create; every method is const and may
// run concurrently.
#ifndef CXLKV_ORCHESTRATOR_PUBLISHED_KEY_H_
#define CXLKV_ORCHESTRATOR_PUBLISHED_KEY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"

namespace cxlkv::orchestrator {

// The shortest secret accepted, in bytes.
inline constexpr std::size_t kMinPublishSecret = 16;

class PublishedKeyer {
 public:
  // kInvalidArgument for a secret shorter than kMinPublishSecret bytes; kInternal when
  // libcrypto refuses HMAC-SHA256 (a FIPS build without it), with its message.
  static absl::StatusOr<PublishedKeyer> Create(const std::string& secret);

  // K' for `key` (above). Never fails once Create succeeded.
  coherence::PrefixKey Apply(const coherence::PrefixKey& key) const;
  // The secret's id (above).
  std::uint64_t id() const { return id_; }

 private:
  explicit PublishedKeyer(std::string secret) : secret_(std::move(secret)) {}
  std::string secret_;
  std::uint64_t id_ = 0;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_PUBLISHED_KEY_H_
