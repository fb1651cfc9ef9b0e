// cxlkv/pool/reuse_tracker.h — per-prefix reuse statistics for the placement rule.
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
// Thread-safety: none; one thread (or the caller's lock) per tracker. Shard by key for more.
#ifndef CXLKV_POOL_REUSE_TRACKER_H_
#define CXLKV_POOL_REUSE_TRACKER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::pool {

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

// 128-bit keys as 32 hex digits, high word first (as `cxlkvctl prefixes` prints them).
std::string FormatPrefixKey(const coherence::PrefixKey& key);
// Accepts 1..32 hex digits (an optional 0x); kInvalidArgument says what is wrong.
absl::StatusOr<coherence::PrefixKey> ParsePrefixKey(absl::string_view hex);

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
  void Record(const coherence::PrefixKey& key, std::uint64_t now_ns, std::uint64_t size_bytes = 0,
              std::uint32_t tokens = 0) noexcept;

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

  // Writes the stats file atomically (temporary file, fsync, rename, fsync of the
  // directory). `now_ns` is stored as saved_at_ns, on the same clock as the entries.
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

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_REUSE_TRACKER_H_
