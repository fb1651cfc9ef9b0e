// cxlkv/tier/reuse_tracker.h — per-prefix reuse statistics for the placement rule.
//
// ReuseTracker keeps, per 128-bit prefix key (coherence::PrefixKey), an exponentially
// weighted moving average of the interval between uses, the use count, the last use time and
// the block's size and token count. Memory is fixed at Create(): a table of 4-way buckets of
// 48-byte entries; a key is hashed to one bucket and, when the bucket is full, replaces the
// entry used least recently in it, so a hot prefix survives a flood of one-shot ones.
// Record() and Find() are O(1) (one bucket, 192 bytes) and allocation-free.
//
// Times are nanoseconds of a clock the caller chooses (CLOCK_MONOTONIC in a server); the
// tracker never reads a clock itself, so tests and replays are deterministic.
//
// Save()/Load() write and read the stats file `cxlkvctl explain PREFIX` reads; its format
// (little-endian, versioned, CRC32C-checked) is in docs/placement.md:
//   header (80 B): RecordHead{magic "CXLKVRUS", version 1, bytes 80, seq 0, crc},
//                  saved_at_ns, capacity, entry_count, entry_bytes (48), entries_crc,
//                  alpha (f64), reserved
//   entry_count × entry (48 B): key_lo, key_hi, last_seen_ns, size_bytes (u64),
//                  ewma_interval_s (f32, +inf until a second use), uses, tokens, reserved (u32)
//
// NamespaceReuse (below) is the prior for blocks without a history of their own: per
// namespace, how many of its new blocks were used again and after how long.
//
// Thread-safety: none; one thread (or the caller's lock) per tracker. Shard by key for more.
#ifndef CXLKV_TIER_REUSE_TRACKER_H_
#define CXLKV_TIER_REUSE_TRACKER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/tier/placement.h"

namespace cxlkv::tier {

struct ReuseTrackerOptions {
  std::uint32_t entries = 65536;  // rounded up to a power of two; [64, 2^26]
  double alpha = 0.25;            // EWMA weight of the newest interval, (0, 1]
};

struct ReuseStats {
  coherence::PrefixKey key;
  std::uint64_t last_seen_ns = 0;
  std::uint64_t size_bytes = 0;
  double ewma_interval_s = 0;  // +inf until the second use
  std::uint32_t uses = 0;
  std::uint32_t tokens = 0;
};

// What one ReuseTracker::Record() saw.
struct RecordOutcome {
  std::uint32_t uses = 0;        // uses of the key including this one (1: first seen)
  double interval_s = kNoReuse;  // time since the previous use; kNoReuse on the first
};

class ReuseTracker {
 public:
  // kInvalidArgument names the option and its range.
  static absl::StatusOr<ReuseTracker> Create(const ReuseTrackerOptions& options);

  ReuseTracker(ReuseTracker&&) noexcept;
  ReuseTracker& operator=(ReuseTracker&&) noexcept;
  ~ReuseTracker();

  // Records a use of `key` at `now_ns`. The first use stores the time; each later one folds
  // the interval since the previous use into the EWMA (the second use sets it). A time
  // before the last use counts as a zero interval. Non-zero size/tokens replace the stored
  // ones. O(1), noexcept.
  RecordOutcome Record(const coherence::PrefixKey& key, std::uint64_t now_ns,
                       std::uint64_t size_bytes = 0, std::uint32_t tokens = 0) noexcept;

  std::optional<ReuseStats> Find(const coherence::PrefixKey& key) const noexcept;

  // The reuse interval the placement rule should assume at `now_ns`: the EWMA, or the time
  // since the last use when that is longer (an idle prefix drifts towards colder tiers);
  // kNoReuse (+inf) for a key unknown or used once.
  double ExpectedIntervalS(const coherence::PrefixKey& key, std::uint64_t now_ns) const noexcept;

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept;
  // Bytes held, fixed at Create(): capacity() × 48.
  std::size_t memory_bytes() const noexcept;
  double alpha() const noexcept { return alpha_; }
  // Every entry (unordered), for tools and tests.
  std::vector<ReuseStats> Entries() const;

  // Writes the stats file with base::ReplaceFile's guarantee (old or new, never torn; durable
  // on OK, the directory's fsync included: its failure fails the save). `now_ns` is stored as
  // saved_at_ns, on the same clock as the entries.
  absl::Status Save(const std::string& path, std::uint64_t now_ns) const;

  struct Loaded;
  // Reads a stats file. kNotFound (no file), kDataLoss (truncated, checksum), kUnimplemented
  // (version), kFailedPrecondition (not a stats file); messages name the file.
  static absl::StatusOr<Loaded> Load(const std::string& path);
  // The same checks on a stats file's bytes already read; `source` names them in errors.
  static absl::StatusOr<Loaded> Parse(absl::string_view bytes, absl::string_view source);

 private:
  struct Entry;
  struct Bucket;
  ReuseTracker(std::uint32_t buckets, double alpha);
  Bucket& BucketOf(const coherence::PrefixKey& key) const noexcept;
  const Entry* FindEntry(const coherence::PrefixKey& key) const noexcept;

  std::unique_ptr<Bucket[]> buckets_;
  std::uint32_t bucket_mask_ = 0;
  std::size_t size_ = 0;
  double alpha_ = 0.25;
};

struct ReuseTracker::Loaded {
  ReuseTracker tracker;
  std::uint64_t saved_at_ns = 0;
};

// The expected reuse interval of a block that has no history of its own (new, or seen once),
// learned per namespace from the blocks before it. A new block is not "never reused": in a
// coding assistant's namespace nearly every new block comes back with the next turn, in an
// API's namespace a user message almost never does. Per namespace this keeps
//   new      blocks seen for the first time (decayed: each new block weighs 1, older ones
//            fade by 1 − 1/window_blocks per new block, so the figures follow a change of mix)
//   reused   of those, blocks seen a second time (decayed alike)
//   first    the EWMA of the interval between a block's first and second use
// and returns first / (reused / new): the expected interval per reuse when a new block is
// reused with probability p after `first` seconds — equivalently, its expected reuse rate
// p / first, which is what the break-even interval is compared with. kNoReuse until the
// namespace has min_new new and min_reused reused blocks, and when none was reused.
// (reused/new lags: blocks created within the last `first` seconds have not had their chance
// yet, which biases p low — towards colder tiers — by about first × new-block rate / window.)
struct NamespaceReuseOptions {
  double window_blocks = 4096;          // decay horizon in new blocks, >= 1
  double alpha = 0.05;                  // EWMA weight of the newest first-reuse interval, (0, 1]
  std::uint32_t min_new = 32;           // new blocks seen before the prior is used
  std::uint32_t min_reused = 8;         // of them, reused at least this many times
  std::uint32_t max_namespaces = 4096;  // namespaces past this are not learned (kNoReuse)
};

struct NamespaceReuseStats {
  double new_blocks = 0;  // decayed count
  double reused = 0;      // decayed count
  double first_interval_s = 0;
  std::uint64_t new_total = 0, reused_total = 0;  // undecayed, for reports
  double reuse_probability() const { return new_blocks > 0 ? reused / new_blocks : 0; }
};

class NamespaceReuse {
 public:
  // kInvalidArgument names the option and its range.
  static absl::StatusOr<NamespaceReuse> Create(const NamespaceReuseOptions& options = {});

  // Folds in what ReuseTracker::Record returned for a block of `ns`: a first use counts a
  // new block, a second use a reuse after outcome.interval_s; later uses change nothing.
  void Observe(coherence::Namespace ns, const RecordOutcome& outcome);
  // first / p, or kNoReuse (see above).
  double ExpectedIntervalS(coherence::Namespace ns) const;
  std::optional<NamespaceReuseStats> Find(coherence::Namespace ns) const;
  std::size_t size() const noexcept { return stats_.size(); }
  const NamespaceReuseOptions& options() const noexcept { return o_; }

 private:
  explicit NamespaceReuse(const NamespaceReuseOptions& o) : o_(o) {}
  NamespaceReuseOptions o_;
  absl::flat_hash_map<coherence::Namespace, NamespaceReuseStats> stats_;
};

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_REUSE_TRACKER_H_
