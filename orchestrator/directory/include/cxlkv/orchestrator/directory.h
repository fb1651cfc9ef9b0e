// cxlkv/orchestrator/directory.h — the cross-domain prefix directory's summary of one domain
// (docs/ha.md, "Cross-domain prefix directory"): a Bloom filter over the domain's published
// chain keys, with the few facts a reader needs to judge it, in one binary record that the
// domain's leader keeps in etcd under its session lease.
//
// What goes into the filter (the "anchors"): a published block's chain key (prefix.h's
// ChainKey: namespace, parent key and tokens) names the whole prefix up to that block, so a
// router holding the chain key of the last block of a prompt prefix asks "may this domain hold
// the prefix ending here". With anchor_every = 1 (the default) every published key is an
// anchor. With anchor_every = N > 1 only keys whose mixed value is 0 modulo N are, chosen by
// the key alone, so the leader (which knows neither a block's depth nor its parent) and a
// router agree on them; the filter is then about N times smaller, and a router asks with the
// deepest anchor of its chain (IsAnchor) — a key that is no anchor gets no answer.
//
// Sizing: m bits and k hash functions for n keys give a false-positive rate of about
// (1 - e^(-k n / m))^k. SizeFor picks m and k for an expected count and a target rate
// (9.6 bits and 7 hashes per key at 1%). A Bloom filter has no false negatives: a key added
// is always reported.
//
// Plain values; thread-compatible (const methods may run concurrently).
#ifndef CXLKV_ORCHESTRATOR_DIRECTORY_H_
#define CXLKV_ORCHESTRATOR_DIRECTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/orchestrator/published_key.h"

namespace cxlkv::orchestrator::directory {

// The most a filter may take: etcd refuses requests above 1.5 MiB.
inline constexpr std::uint64_t kMaxFilterBytes = 1u << 20;

struct FilterSize {
  std::uint64_t bits = 0;  // a multiple of 64
  std::uint32_t hashes = 0;
};

// m and k for `expected_keys` at `fp_rate` (0 < fp_rate < 1), at most kMaxFilterBytes (then
// the rate is what that size gives). expected_keys 0 counts as 1.
FilterSize SizeFor(std::uint64_t expected_keys, double fp_rate);
// A filter of `bytes` (rounded down to whole 64-bit words, at most kMaxFilterBytes) with the
// hash count best for `expected_keys`.
FilterSize SizeForBytes(std::uint64_t bytes, std::uint64_t expected_keys);
// The false-positive rate of a filter of this size holding `keys`.
double FalsePositiveRate(const FilterSize& size, std::uint64_t keys);

// Whether `key` is an anchor when one key in about `anchor_every` is (0 and 1: all are).
bool IsAnchor(const coherence::PrefixKey& key, std::uint32_t anchor_every);

class BloomFilter {
 public:
  BloomFilter() = default;
  explicit BloomFilter(const FilterSize& size);
  void Add(const coherence::PrefixKey& key);
  bool MayContain(const coherence::PrefixKey& key) const;
  FilterSize size() const { return FilterSize{bits_, hashes_}; }
  std::uint64_t bytes() const { return bits_ / 8; }
  const std::vector<std::uint64_t>& words() const { return words_; }
  // For decoding: the words must be bits / 64 long.
  static BloomFilter FromWords(std::uint32_t hashes, std::vector<std::uint64_t> words);

 private:
  std::uint64_t bits_ = 0;
  std::uint32_t hashes_ = 0;
  std::vector<std::uint64_t> words_;
};

// One domain's entry in the directory.
struct Summary {
  std::string domain;
  std::int64_t epoch = 0;          // the leader's epoch that wrote it
  std::uint64_t published = 0;     // published index entries when it was built
  std::uint64_t anchors = 0;       // keys added to the filter
  std::int64_t built_unix_ms = 0;  // wall clock of the leader when built
  std::uint32_t anchor_every = 1;
  // Keyed with a publish secret (published_key.h): the filter holds K' = the keyed chain keys,
  // and anchors are chosen by K'. key_id names the secret; a reader without it cannot match.
  bool keyed = false;
  std::uint64_t key_id = 0;
  BloomFilter filter;
};

// The record: magic "CXDS", version 1 (unkeyed) or 2 (keyed: the key id follows
// built_unix_ms), then fixed-width little-endian fields, the domain's name, the filter's words,
// and a CRC32C over everything before it.
std::string EncodeSummary(const Summary& s);
// kDataLoss for a record that is torn, of another version, or whose CRC does not match.
absl::StatusOr<Summary> DecodeSummary(absl::string_view bytes);

// What a reader answers for one domain (DirectoryReader::Where, the Directory RPC).
struct DomainAnswer {
  std::string domain;
  bool may_hold = false;
  bool anchor = true;  // the key is an anchor under this domain's anchor_every
  bool keyed = false;  // the summary holds keyed keys (published_key.h)
  bool key_held = true;  // keyed: the reader holds its secret (else may_hold is false: unknown)
  std::uint64_t published = 0;
  double fp_rate = 0;  // of its filter at its anchor count
  std::int64_t epoch = 0;
  std::int64_t age_ms = 0;  // now − built, on the reader's wall clock (clock skew included)
  std::uint64_t filter_bytes = 0;
};

// The answer of one summary for the chain key `key`: for a keyed summary the key is first keyed
// with the secret in `keyers` whose id matches (none: keyed, key_held = false, may_hold =
// false). `now_unix_ms` gives age_ms.
DomainAnswer AnswerFor(const Summary& s, const coherence::PrefixKey& key,
                       const std::vector<PublishedKeyer>& keyers, std::int64_t now_unix_ms);

// The etcd key of a domain's summary: /cxlkv/v1/<cluster>/directory/<domain>; a reader
// ranges over DirectoryPrefix(cluster).
std::string DirectoryPrefix(const std::string& cluster);
std::string SummaryKey(const std::string& cluster, const std::string& domain);

}  // namespace cxlkv::orchestrator::directory

#endif  // CXLKV_ORCHESTRATOR_DIRECTORY_H_
