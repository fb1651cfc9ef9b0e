// bench/replay/replay.h — replays a KV-cache trace (trace.h) through the real cxlkv parts.
//
// One RunReplay() call serves every request of a trace under one policy, on fresh
// components it creates under ReplayOptions' directories and removes afterwards:
//   CXL tier   a BlockAllocator on an arena formatted in a /dev/shm file (emulated CXL)
//   index      a PrefixOwner + PrefixHost on a domain formatted in a /dev/shm file; CXL
//              blocks are published under their chained prefix keys and found only through
//              PrefixHost::AcquireChain (leases, copy-out, ValidateAfterCopy, release)
//   NVMe tier  a nvme::NvmeStore (O_DIRECT + io_uring) in a directory, normally under /tmp
//   the store  a tier::TieredStore over the two (the C API's tier is the same class), the
//              policy its strategy: a tier::TierManager moves blocks (placement, batched NVMe
//              writes, watermarks with victims re-decided, NVMe capacity, cool-down,
//              promotion, reads); for the rule, a tier::Placer (placement rule, reuse tracker,
//              namespace prior, chain inheritance, retention pressure) decides new blocks,
//              NVMe hits and victims. CXL blocks entering CXL are published in the index
//              (on_cxl), those leaving it retired (release_cxl). The replay is the store's
//              driver and holds no policy of its own
// Per request: the longest leading run of the prompt's blocks is looked up in the index (CXL
// hits), then on NVMe (NVMe hits, read through the store and checked byte for byte), the rest
// is "recomputed": its blocks (and those of the answer) are generated and placed per policy.
// Nothing is modeled but time: every block moved is really copied, written or read, at
// 1/profile.scale of its modeled size. TTFT is computed from the tier figures in
// options.params (calibrated or configured) and the prefill rate at the queue depth; see
// docs/replay.md.
//
// The clock of the index, the tracker and cool-downs is the trace's own (simulated) time.
// Not thread-safe; one replay per thread, each with its own directories.
#ifndef CXLKV_BENCH_REPLAY_REPLAY_H_
#define CXLKV_BENCH_REPLAY_REPLAY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/tier/placement.h"
#include "trace.h"

namespace cxlkv::replay {

enum class Policy : std::uint8_t {
  kRule = 0,    // the placement rule, with cool-down and watermark hysteresis
  kCxlLru,      // every block to CXL, LRU eviction drops
  kNvmeLru,     // every block to NVMe, LRU at NVMe capacity; CXL unused
  kLruSpill,    // CXL LRU whose victims go to NVMe; NVMe hits promoted back (two-tier LRU)
  kRecompute,   // nothing kept: every prompt is prefilled in full
};
inline constexpr int kPolicyCount = 5;
absl::string_view PolicyName(Policy p) noexcept;  // "rule", "cxl-lru", ...
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);

// Bytes per token of a real model; the replay moves 1/scale of them per block.
struct ModelProfile {
  std::string name = "llama3-70b";
  std::uint64_t bytes_per_token = 327680;  // 2 × 80 layers × 8 KV heads × 128 × fp16
  std::uint32_t tokens_per_block = 16;
  std::uint32_t scale = 256;
  std::uint64_t ModeledBlockBytes() const { return bytes_per_token * tokens_per_block; }
  // Modeled / scale, rounded up to 4 KiB (O_DIRECT and arena stride granularity).
  std::uint64_t MovedBlockBytes() const;
};

struct ReplayOptions {
  Policy policy = Policy::kRule;
  ModelProfile profile;
  // Tier figures (cxl[0] = the emulated CXL arena, nvme), prefill rate, queue-depth weight,
  // watermarks and cool-down. cxl[1] (pooled) should be absent: the replay has one CXL tier.
  tier::PlacementParams params;
  std::uint32_t cxl_blocks = 4096;   // CXL capacity, equal for every policy that uses CXL
  std::uint32_t nvme_blocks = 65536; // NVMe capacity, equal for every policy that uses NVMe
  std::string shm_dir = "/dev/shm";  // arena and domain files go here
  std::string nvme_dir;              // the store's directory (created, emptied, removed)
  std::string tag = "replay";        // names the files
  bool verify = true;                // compare every block read with what was written
  bool keep_files = false;           // leave the arena/domain/store for inspection
  // What the rule is told a hit saves (BlockInputs::tokens): the block's own tokens (the
  // marginal recompute, default), or the whole prefix up to and including it (the chain:
  // with lookups stopping at the first miss, losing block b costs every later block too).
  bool rule_prefix_tokens = false;
  // A block with no reuse history of its own (new, or seen once) takes its nearest
  // ancestor's expected reuse interval in the request's chain — instead of "never reused",
  // which sends every new block to NVMe or drop (--no-inherit-reuse: the bare tracker).
  // tier::PlacerOptions::inherit_from_chain.
  bool inherit_reuse = true;
  // A block with no reuse history of its own takes its namespace's prior first
  // (tier::NamespaceReuse: how often and how soon the namespace's new blocks came back);
  // the ancestor (inherit_reuse) only while the namespace has too little history.
  // tier::PlacerOptions::namespace_prior.
  bool ns_prior = true;
  // Every policy marks a request's chain most recently used root first after serving it, so
  // LRU evicts chain tails before their heads (as vLLM's prefix cache does); false: blocks
  // are marked in the order they are read and placed (root first = evicted first).
  bool chain_recency = true;
  // The rule prices CXL pressure by the tier's retention (TierManager::RetentionS: how long
  // an unused block lasts before eviction) once the tier evicts; false: by occupancy only.
  bool retention_pressure = true;
};

struct Occupancy {
  double t_s = 0;
  std::uint32_t cxl_blocks = 0;
  std::uint32_t nvme_blocks = 0;
};

struct TierBytes {
  std::uint64_t blocks = 0;
  std::uint64_t moved_bytes = 0;    // really copied / written / read
  std::uint64_t modeled_bytes = 0;  // blocks × modeled block bytes
};

struct ReplayResult {
  std::string trace;
  Policy policy = Policy::kRule;
  std::uint64_t requests = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t lookup_blocks = 0;  // full blocks of every prompt
  std::uint64_t cxl_hits = 0, nvme_hits = 0, misses = 0;  // blocks
  std::array<std::uint64_t, kWorkloadCount> wl_blocks{}, wl_hits{};
  TierBytes cxl_read, cxl_write, nvme_read, nvme_write;
  std::uint64_t placed_cxl = 0, placed_nvme = 0, placed_drop = 0;
  std::uint64_t promotions = 0, demotions = 0, evicted_dropped = 0, nvme_evicted = 0;
  std::uint64_t inherited_reuse = 0;  // decisions that took an ancestor's reuse interval
  std::uint64_t prior_reuse = 0;      // decisions that took the namespace prior
  std::uint64_t cooldown_holds = 0;   // moves refused because the block moved recently
  std::uint64_t already_resident = 0; // recomputed blocks already held in a tier
  std::array<std::uint64_t, 6> clauses{};  // Decide() outcomes by tier::Clause
  // Checks: each must stay 0.
  std::uint64_t verify_failures = 0, index_mismatches = 0, nvme_read_errors = 0;
  std::uint64_t copies_discarded = 0;  // ValidateAfterCopy refused a copy (counted as a miss)
  // The components' own counters, for cross-checks.
  std::uint64_t owner_published = 0, owner_reclaimed = 0, blocks_freed = 0;
  std::uint64_t store_puts = 0, store_gets = 0, store_deletes = 0, store_data_loss = 0;
  std::uint64_t arena_persisted_end = 0, store_blocks_end = 0;
  std::uint32_t cxl_resident_end = 0, nvme_resident_end = 0;
  // Per request, in trace order.
  std::vector<double> ttft_s;
  std::vector<std::uint32_t> queue_depth;
  std::vector<Occupancy> occupancy;
  double wall_s = 0;

  double HitRate() const {
    return lookup_blocks ? static_cast<double>(cxl_hits + nvme_hits) /
                               static_cast<double>(lookup_blocks)
                         : 0;
  }
};

// Runs one policy over one trace. Errors name the component that failed.
absl::StatusOr<ReplayResult> RunReplay(const Trace& trace, const ReplayOptions& options);

// A lower bound for every policy, per request: the modeled TTFT when every block any earlier
// request computed is still in CXL (unlimited capacity, every hit at CXL speed) — computed
// from the trace with the same TTFT and queue model, not replayed. No placement at any CXL
// capacity gives a request a shorter TTFT (more hits, each cheaper than its recompute, and no
// deeper queue), so no policy's mean or percentile is below this one's.
std::vector<double> UnlimitedCxlTtft(const Trace& trace, const ReplayOptions& options);

// Mean and percentiles of a sample (p in [0, 100], nearest rank).
double Mean(const std::vector<double>& v);
double Percentile(std::vector<double> v, double p);

}  // namespace cxlkv::replay

#endif  // CXLKV_BENCH_REPLAY_REPLAY_H_
