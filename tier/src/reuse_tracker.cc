// ReuseTracker: a fixed table of 4-way buckets, EWMA per prefix key, and its stats file.
#include "cxlkv/tier/reuse_tracker.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlkv/base/file.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/record.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/tier/placement.h"

namespace cxlkv::tier {

static_assert(std::endian::native == std::endian::little, "the stats file is little-endian");

struct ReuseTracker::Entry {
  std::uint64_t key_lo;
  std::uint64_t key_hi;
  std::uint64_t last_seen_ns;
  std::uint64_t size_bytes;
  float ewma_interval_s;  // +inf until the second use
  std::uint32_t uses;     // 0: empty slot
  std::uint32_t tokens;
  std::uint32_t reserved;
};

inline constexpr int kWays = 4;
struct alignas(64) ReuseTracker::Bucket {
  Entry way[kWays];
};

namespace {

constexpr std::uint64_t kStatsMagic = coherence::MakeMagic("CXLKVRUS");
constexpr std::uint32_t kStatsVersion = 1;

struct StatsHeader {
  coherence::RecordHead head;
  std::uint64_t saved_at_ns;
  std::uint64_t capacity;
  std::uint64_t entry_count;
  std::uint32_t entry_bytes;
  std::uint32_t entries_crc;
  double alpha;
  std::uint64_t reserved;
};
static_assert(sizeof(StatsHeader) == 80);
static_assert(offsetof(StatsHeader, saved_at_ns) == 32);

inline std::uint64_t Mix(const coherence::PrefixKey& k) noexcept {
  // Keys are already XXH3 outputs; the multiply only guards against structured test keys.
  return ((k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull) >> 17;
}

}  // namespace

ReuseTracker::ReuseTracker(std::uint32_t buckets, double alpha)
    : buckets_(new Bucket[buckets]()), bucket_mask_(buckets - 1), alpha_(alpha) {
  // The stats file stores entries as they are in memory.
  static_assert(sizeof(Entry) == 48 && offsetof(Entry, ewma_interval_s) == 32);
  static_assert(sizeof(Bucket) == 192 && alignof(Bucket) == 64);
}
ReuseTracker::ReuseTracker(ReuseTracker&&) noexcept = default;
ReuseTracker& ReuseTracker::operator=(ReuseTracker&&) noexcept = default;
ReuseTracker::~ReuseTracker() = default;

absl::StatusOr<ReuseTracker> ReuseTracker::Create(const ReuseTrackerOptions& o) {
  if (o.entries < 64 || o.entries > (1u << 26)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.tracker_entries: ", o.entries, " is out of range [64, 67108864]"));
  }
  if (!(o.alpha > 0 && o.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.reuse_ewma_alpha: ", o.alpha, " is out of range (0, 1]"));
  }
  const std::uint32_t entries = std::bit_ceil(o.entries);
  return ReuseTracker(entries / kWays, o.alpha);
}

std::size_t ReuseTracker::capacity() const noexcept {
  return (static_cast<std::size_t>(bucket_mask_) + 1) * kWays;
}

std::size_t ReuseTracker::memory_bytes() const noexcept {
  return (static_cast<std::size_t>(bucket_mask_) + 1) * sizeof(Bucket);
}

ReuseTracker::Bucket& ReuseTracker::BucketOf(const coherence::PrefixKey& key) const noexcept {
  return buckets_[Mix(key) & bucket_mask_];
}

const ReuseTracker::Entry* ReuseTracker::FindEntry(const coherence::PrefixKey& key) const noexcept {
  const Bucket& b = BucketOf(key);
  for (const Entry& e : b.way) {
    if (e.uses != 0 && e.key_lo == key.lo && e.key_hi == key.hi) return &e;
  }
  return nullptr;
}

RecordOutcome ReuseTracker::Record(const coherence::PrefixKey& key, std::uint64_t now_ns,
                                   std::uint64_t size_bytes, std::uint32_t tokens) noexcept {
  Bucket& b = BucketOf(key);
  Entry* victim = &b.way[0];
  for (Entry& e : b.way) {
    if (e.uses != 0 && e.key_lo == key.lo && e.key_hi == key.hi) {
      const double interval =
          now_ns > e.last_seen_ns ? static_cast<double>(now_ns - e.last_seen_ns) * 1e-9 : 0.0;
      const double ewma =
          e.uses == 1 ? interval : alpha_ * interval + (1 - alpha_) * e.ewma_interval_s;
      e.ewma_interval_s = static_cast<float>(ewma);
      if (e.uses != std::numeric_limits<std::uint32_t>::max()) ++e.uses;
      if (now_ns > e.last_seen_ns) e.last_seen_ns = now_ns;
      if (size_bytes != 0) e.size_bytes = size_bytes;
      if (tokens != 0) e.tokens = tokens;
      return RecordOutcome{e.uses, interval};
    }
    // Prefer an empty way, else the one used least recently.
    if (victim->uses != 0 && (e.uses == 0 || e.last_seen_ns < victim->last_seen_ns)) victim = &e;
  }
  if (victim->uses == 0) ++size_;
  *victim = Entry{key.lo, key.hi, now_ns, size_bytes, std::numeric_limits<float>::infinity(),
                  1,      tokens, 0};
  return RecordOutcome{1, kNoReuse};
}

std::optional<ReuseStats> ReuseTracker::Find(const coherence::PrefixKey& key) const noexcept {
  const Entry* e = FindEntry(key);
  if (e == nullptr) return std::nullopt;
  return ReuseStats{{e->key_lo, e->key_hi},
                    e->last_seen_ns,
                    e->size_bytes,
                    static_cast<double>(e->ewma_interval_s),
                    e->uses,
                    e->tokens};
}

double ReuseTracker::ExpectedIntervalS(const coherence::PrefixKey& key,
                                       std::uint64_t now_ns) const noexcept {
  const Entry* e = FindEntry(key);
  if (e == nullptr || e->uses < 2) return kNoReuse;
  const double idle =
      now_ns > e->last_seen_ns ? static_cast<double>(now_ns - e->last_seen_ns) * 1e-9 : 0.0;
  return std::max(static_cast<double>(e->ewma_interval_s), idle);
}

std::vector<ReuseStats> ReuseTracker::Entries() const {
  std::vector<ReuseStats> out;
  out.reserve(size_);
  for (std::uint32_t i = 0; i <= bucket_mask_; ++i) {
    for (const Entry& e : buckets_[i].way) {
      if (e.uses == 0) continue;
      out.push_back({{e.key_lo, e.key_hi},
                     e.last_seen_ns,
                     e.size_bytes,
                     static_cast<double>(e.ewma_interval_s),
                     e.uses,
                     e.tokens});
    }
  }
  return out;
}

absl::Status ReuseTracker::Save(const std::string& path, std::uint64_t now_ns) const {
  std::vector<Entry> entries;
  entries.reserve(size_);
  for (std::uint32_t i = 0; i <= bucket_mask_; ++i) {
    for (const Entry& e : buckets_[i].way) {
      if (e.uses != 0) entries.push_back(e);
    }
  }
  StatsHeader h{};
  h.saved_at_ns = now_ns;
  h.capacity = capacity();
  h.entry_count = entries.size();
  h.entry_bytes = sizeof(Entry);
  h.entries_crc = coherence::Crc32c(entries.data(), entries.size() * sizeof(Entry));
  h.alpha = alpha_;
  coherence::Seal(h, kStatsMagic, kStatsVersion, 0);

  return base::ReplaceFile(path,
                           {absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h)),
                            absl::string_view(reinterpret_cast<const char*>(entries.data()),
                                              entries.size() * sizeof(Entry))},
                           0644);
}

absl::StatusOr<ReuseTracker::Loaded> ReuseTracker::Load(const std::string& path) {
  absl::StatusOr<std::string> bytes = base::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return Parse(*bytes, path);
}

absl::StatusOr<ReuseTracker::Loaded> ReuseTracker::Parse(absl::string_view bytes,
                                                         absl::string_view source) {
  const std::string path(source);
  const std::string what = absl::StrCat(path, ": reuse stats header");
  if (bytes.size() < sizeof(StatsHeader)) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", bytes.size(), " bytes is shorter than a reuse stats header (80)"));
  }
  StatsHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (auto st = coherence::Check(h, kStatsMagic, kStatsVersion, kStatsVersion, what); !st.ok()) {
    return st;
  }
  if (h.entry_bytes != sizeof(Entry)) {
    return absl::DataLossError(
        absl::StrCat(path, ": entry size ", h.entry_bytes, " is not ", sizeof(Entry)));
  }
  if (h.capacity < 64 || h.capacity > (1u << 26) || !std::has_single_bit(h.capacity) ||
      h.entry_count > h.capacity) {
    return absl::DataLossError(absl::StrCat(path, ": capacity ", h.capacity, " / entry count ",
                                            h.entry_count, " are not a valid table"));
  }
  const std::uint64_t want = sizeof(StatsHeader) + h.entry_count * sizeof(Entry);
  if (bytes.size() != want) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(), " bytes, the header says ",
                                            want, " (truncated or appended to)"));
  }
  const char* data = bytes.data() + sizeof(StatsHeader);
  const std::size_t data_len = static_cast<std::size_t>(h.entry_count) * sizeof(Entry);
  if (coherence::Crc32c(data, data_len) != h.entries_crc) {
    return absl::DataLossError(absl::StrCat(path, ": entries fail their CRC32C (corrupt)"));
  }
  auto tracker = Create({static_cast<std::uint32_t>(h.capacity), h.alpha});
  if (!tracker.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", tracker.status().message()));
  }
  for (std::uint64_t i = 0; i < h.entry_count; ++i) {
    Entry e;
    std::memcpy(&e, data + i * sizeof(Entry), sizeof(Entry));
    Bucket& b = tracker->BucketOf({e.key_lo, e.key_hi});
    Entry* slot = nullptr;
    for (Entry& w : b.way) {
      if (w.uses != 0 && w.key_lo == e.key_lo && w.key_hi == e.key_hi) {
        return absl::DataLossError(absl::StrCat(
            path, ": key ", coherence::FormatKey({e.key_lo, e.key_hi}), " appears twice"));
      }
      if (slot == nullptr && w.uses == 0) slot = &w;
    }
    if (e.uses == 0 || slot == nullptr) {
      return absl::DataLossError(absl::StrCat(
          path, ": entry ", i, e.uses == 0 ? " has no uses" : " overfills its bucket"));
    }
    *slot = e;
    ++tracker->size_;
  }
  return Loaded{std::move(*tracker), h.saved_at_ns};
}

// ---- NamespaceReuse ---------------------------------------------------------------------------

absl::StatusOr<NamespaceReuse> NamespaceReuse::Create(const NamespaceReuseOptions& o) {
  if (!(o.window_blocks >= 1 && o.window_blocks <= 1e12)) {
    return absl::InvalidArgumentError(absl::StrCat("NamespaceReuse: window_blocks ",
                                                   o.window_blocks, " is out of range [1, 1e12]"));
  }
  if (!(o.alpha > 0 && o.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NamespaceReuse: alpha ", o.alpha, " is out of range (0, 1]"));
  }
  if (o.max_namespaces == 0) {
    return absl::InvalidArgumentError("NamespaceReuse: max_namespaces must be at least 1");
  }
  return NamespaceReuse(o);
}

void NamespaceReuse::Observe(coherence::Namespace ns, const RecordOutcome& outcome) {
  if (outcome.uses != 1 && outcome.uses != 2) return;
  auto it = stats_.find(ns);
  if (it == stats_.end()) {
    if (stats_.size() >= o_.max_namespaces || outcome.uses != 1) return;
    it = stats_.emplace(ns, NamespaceReuseStats{}).first;
  }
  NamespaceReuseStats& s = it->second;
  if (outcome.uses == 1) {
    const double keep = 1.0 - 1.0 / o_.window_blocks;
    s.new_blocks = s.new_blocks * keep + 1;
    s.reused *= keep;
    ++s.new_total;
    return;
  }
  const double iv = std::isfinite(outcome.interval_s) ? outcome.interval_s : 0.0;
  s.first_interval_s =
      s.reused_total == 0 ? iv : o_.alpha * iv + (1 - o_.alpha) * s.first_interval_s;
  s.reused = std::min(s.reused + 1, s.new_blocks);  // a block seen before the window opened
  ++s.reused_total;
}

double NamespaceReuse::ExpectedIntervalS(coherence::Namespace ns) const {
  auto it = stats_.find(ns);
  if (it == stats_.end()) return kNoReuse;
  const NamespaceReuseStats& s = it->second;
  if (s.new_total < o_.min_new || s.reused_total < o_.min_reused) return kNoReuse;
  const double p = s.reuse_probability();
  if (!(p > 0)) return kNoReuse;
  return s.first_interval_s / p;
}

std::optional<NamespaceReuseStats> NamespaceReuse::Find(coherence::Namespace ns) const {
  auto it = stats_.find(ns);
  if (it == stats_.end()) return std::nullopt;
  return it->second;
}

}  // namespace cxlkv::tier
