// cxlkv/tier/tiered_store.h — a tiered KV store: one size class of a CXL arena and an NVMe
// store, with a placement strategy deciding where every block lives.
//
// TieredStore is what the C API's tier (cxlkv_tier_*) and the trace replay (bench/replay) both
// drive; they only translate. It holds a TierManager (moves, batched NVMe writes, watermarks,
// cool-down, promotion, reads) and, for the placement rule, a Placer (rule, reuse tracker,
// namespace prior, chain inheritance, retention pressure), and drives them per request:
//   Use       one use of each block of a request's chain (the rule's reuse history)
//   Place     new blocks (copied in from the caller's bytes, or the caller's arena blocks
//             adopted): each decided with its request's chain and the CXL occupancy it adds;
//             NVMe-bound ones staged in CXL and written in batches of kNvmeBatch; after it the
//             chain is marked used root first (LRU evicts a chain's tail before its head)
//   Lookup / Acquire / Read   where a block is; pin a CXL block; copy blocks out of either tier
//   Prefetch  NVMe blocks back into CXL where the strategy wants them there (the rule, and the
//             cool-down); a ticket, collected by Poll or Wait
//   Demote / Drop   on the caller's command
//   Explain   why a key is where it is (a report; the facades render it)
//   Stats
// Watermark victims are re-decided by the strategy (the rule: NVMe, or drop when recomputing
// beats a fetch). The strategy is an option so the replay measures the rule against its
// baselines on the same code:
//   kRule      the placement rule; watermarks and cool-down from its parameters
//   kCxlLru    every block to CXL; above capacity the LRU block is dropped
//   kNvmeLru   every block to NVMe (LRU at nvme_blocks); CXL only stages writes
//   kLruSpill  every block to CXL; its LRU victims demoted to NVMe, NVMe hits promoted back
//
// The store names blocks by key.h alone; a caller that publishes CXL blocks in a shared
// index does so through two hooks (on_cxl when a block enters CXL, release_cxl when it
// leaves). Thread-safety: every method may be called from any thread. Locks, in the order
// they may be taken: the store's (the Placer, what it remembers per key, its counters) > the
// TierManager's; the store's is never held across a manager call that can run the
// watermarks (their victims come back through victim_tier, which takes it). NVMe completions
// are reaped by whichever thread waits for them (Read, Poll, Wait).
#ifndef CXLKV_TIER_TIERED_STORE_H_
#define CXLKV_TIER_TIERED_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/nvme/nvme_store.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/placement_config.h"
#include "cxlkv/tier/placer.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "cxlkv/tier/tier.h"
#include "cxlkv/tier/tier_manager.h"

namespace cxlkv::tier {

// An arena block, as the hooks name it.
using allocator::BlockHandle;

enum class Strategy : std::uint8_t { kRule = 0, kCxlLru, kNvmeLru, kLruSpill };
// "rule", "cxl-lru", "nvme-lru", "lru-spill".
const char* StrategyName(Strategy s) noexcept;

// New NVMe-bound blocks written per batch.
inline constexpr std::size_t kNvmeBatch = 128;

// The [placement] table of a domain.toml, with its calibration applied.
struct LoadedPlacement {
  PlacementConfig config;
  std::string source = "defaults";       // the path, or "defaults"
  std::vector<std::string> calibration;  // what the calibration replaced
};
// Reads `path` (nullptr: the defaults). Errors name the file and the fix: kNotFound,
// kPermissionDenied or kInvalidArgument when it cannot be read; kInvalidArgument
// "<path>:<line>: key 'placement.<key>': ..." for a bad key; the calibration file's own code
// with "<path>: placement.calibration: ..." when that fails.
absl::StatusOr<LoadedPlacement> LoadPlacement(const char* path);

// Room in an NVMe store for `blocks` blocks of `block_bytes`, with slack for slots being
// retired in the background.
std::uint64_t NvmeBytesFor(std::uint64_t blocks, std::uint64_t block_bytes) noexcept;

// A block entering CXL (TieredStoreOptions::on_cxl).
struct CxlEntry {
  Key key;
  coherence::Namespace ns = 0;
  Key parent;           // the block before it in its request's chain; zero: none
  std::size_t pos = 0;  // its place in that chain
  allocator::BlockHandle block;
  std::byte* addr = nullptr;
  bool promoted = false;  // read back from NVMe (else a new block, filled by the caller)
};

struct TieredStoreOptions {
  std::string name = "tiered store";  // names it in messages
  Strategy strategy = Strategy::kRule;
  std::uint32_t size_class = 0;        // the arena's class the store keeps blocks of
  Tier cxl_tier = Tier::kCxlExpanded;  // which CXL tier the arena is, as the rule prices it
  std::uint64_t cxl_blocks = 0;        // CXL capacity (occupancy, watermarks); 0: the class
  std::uint64_t nvme_blocks = 0;       // NVMe capacity, LRU past it; 0: the store's bytes
  // The rule (kRule): its parameters (with watermarks and cool-down), tracker and sources.
  PlacerOptions placer;
  // The NVMe store: dir and the caller's choices; payload_bytes is the class's block size;
  // capacity_bytes 0 with nvme_blocks set: NvmeBytesFor(nvme_blocks).
  nvme::NvmeStoreOptions nvme;
  // What the rule is told a block weighs (0: the class's block bytes). The replay moves a
  // scaled-down block and prices the model's real one.
  std::uint64_t rule_block_bytes = 0;
  std::uint32_t tokens_per_block = 0;  // a request's default tokens (0: the class's)
  // The rule is told a hit saves the whole prefix up to the block (tokens × (pos + 1)).
  bool prefix_tokens = false;
  // The rule prices CXL pressure by the tier's retention once it evicts (else occupancy).
  bool retention_pressure = true;
  // Place marks the request's chain most recently used, root first.
  bool chain_recency = true;
  // An NVMe write that fails keeps the block in CXL (nothing lost; the watermarks may demote
  // it later); false: it is dropped (a caller whose index never saw the staging block).
  bool keep_failed_nvme_writes = true;
  // The clock in nanoseconds (empty: CLOCK_MONOTONIC); a replay passes the trace's.
  std::function<std::int64_t()> now_ns;
  // Called, without the store's lock, before a new block is handed to the manager in CXL and
  // after a promoted block arrived (publish it in an index). An error fails that key: a new
  // block is freed; a promoted one stays.
  std::function<absl::Status(const CxlEntry&)> on_cxl;
  // TierOptions::release_cxl: a block leaving CXL (empty: freed at once).
  std::function<void(const Key&, allocator::BlockHandle)> release_cxl;
  // Called when the arena has no free block for a new one: true if blocks may have come back
  // (the allocation is retried, up to 1000 times), false to give up.
  std::function<bool()> reclaim;
};

// One request: its chain of keys, root first; a call acts on chain[first..].
struct StoreRequest {
  coherence::Namespace ns = 0;
  std::span<const Key> chain;
  std::size_t first = 0;
  std::uint32_t tokens = 0;       // prefill tokens a block saves (0: the store's default)
  std::uint32_t queue_depth = 0;  // the GPU's prefill queue
  std::int32_t pin = 0;           // the namespace's pin level, 0..3
  // Place: blocks at or after this position are recorded as used (produced now).
  std::size_t record_use_from = std::numeric_limits<std::size_t>::max();
  // Prefetch: every NVMe block, not only those the strategy wants in CXL.
  bool force = false;
};

// Per key of a call: where it is (or went), or why not.
enum class Outcome : std::uint8_t { kMissing, kCxl, kNvme, kDemoting, kPromoting, kDropped };
Outcome OutcomeOf(std::optional<Residence> r) noexcept;
struct KeyResult {
  Outcome outcome = Outcome::kMissing;
  absl::Status status;        // not ok: the key failed (outcome is where it is now)
  bool already_held = false;  // Place: the key was held already, nothing was placed
};

// A key's residence and, in CXL, its block.
struct StoreLocation {
  std::optional<Residence> where;
  std::optional<allocator::BlockHandle> block;
  std::byte* addr = nullptr;
};

// The store's last move of a key.
enum class MoveEvent : std::uint8_t {
  kPlaced,           // a new block, where the strategy sent it
  kNvmeWriteFailed,  // sent to NVMe, the write failed: kept in CXL
  kVictim,           // left CXL above the high watermark, re-decided
  kDemoted,          // Demote
  kPromoted,         // a prefetch read it back into CXL
  kPromoteFailed,
  kPrefetchKept,  // a prefetch left it on NVMe (the rule, or the cool-down)
  kDropped,       // Drop
};
// "placed", "nvme-write-failed", "watermark-victim", "demoted-by-caller", "promoted",
// "promotion-failed", "prefetch-kept-on-nvme", "dropped-by-caller".
const char* MoveEventName(MoveEvent e) noexcept;
// "own", "namespace-prior", "ancestor", "none".
const char* ReuseSourceName(ReuseSource s) noexcept;

struct LastMove {
  MoveEvent event = MoveEvent::kPlaced;
  bool by_rule = false;  // inputs, decision and source are the rule's
  ReuseSource source = ReuseSource::kNone;
  std::int64_t at_ns = 0;
  BlockInputs inputs;
  Decision decision;
  std::string note;  // a failure's message; empty otherwise
};

// Why a key is where it is.
struct ExplainReport {
  Key key;
  std::string store;   // the store's name
  std::string config;  // where its rule came from (TieredStore::Open's `config`)
  std::int64_t now_ns = 0;
  std::optional<Residence> where;
  std::optional<allocator::BlockHandle> cxl_block;  // in CXL
  std::optional<nvme::NvmeStore::Location> nvme;    // on NVMe
  std::optional<PromoteCheck> promotion;            // held
  std::optional<ReuseStats> reuse;                  // its history (the rule's tracker)
  double idle_s = 0;                                // since its last recorded use
  // The last move, when remembered (with what it was placed under).
  bool has_last = false;
  LastMove last;
  double last_s_ago = 0;
  coherence::Namespace ns = 0;
  std::uint32_t tokens = 0;
  std::int32_t pin = 0;
  Explanation last_why;  // by_rule: the rule's account of it
  // What the rule says now (has_last and kRule), with the ancestors the store remembers.
  bool has_now = false;
  ReuseEstimate now_reuse;
  Decision now;
  Explanation now_why;
  double now_occupancy = 0;
};

struct TieredStoreStats {
  std::uint64_t block_bytes = 0;
  std::uint64_t cxl_capacity_blocks = 0;
  std::uint64_t high_watermark_blocks = 0, low_watermark_blocks = 0;
  TierStats tiers;  // the manager's
  nvme::NvmeStats nvme;
  std::uint64_t nvme_file_bytes = 0;
  double retention_s = 0;
  std::uint64_t placed_cxl = 0, placed_nvme = 0, placed_dropped = 0, already_held = 0;
  std::uint64_t nvme_write_failures = 0;
  std::uint64_t prefetch_kept = 0;   // NVMe blocks a prefetch left there
  std::uint64_t cooldown_holds = 0;  // of them, those the rule wanted in CXL but cooling down
  std::uint64_t promoted = 0;        // blocks a prefetch brought into CXL
  std::uint64_t cxl_reads = 0, nvme_reads = 0, uses = 0;
  PlacerStats placer;       // kRule
  double break_even_s = 0;  // kRule: at the occupancy now
};

class TieredStore {
 public:
  // Opens over one size class of `alloc` (borrowed: it must outlive the store; other blocks
  // of it stay the caller's) and an NVMe store in options.nvme.dir. `config` names where the
  // rule came from in Explain. kInvalidArgument for a class out of range, cxl_blocks above
  // the class, a CXL tier the parameters lack, bad parameters; the store's own errors.
  static absl::StatusOr<std::unique_ptr<TieredStore>> Open(allocator::BlockAllocator& alloc,
                                                           TieredStoreOptions options,
                                                           std::string config = "defaults");
  // The same over a whole arena the store owns (an allocator over it is made here): a driver
  // that formats its own arena, like the replay.
  static absl::StatusOr<std::unique_ptr<TieredStore>> Open(std::unique_ptr<pool::Arena> arena,
                                                           TieredStoreOptions options,
                                                           std::string config = "defaults");
  // Drains NVMe I/O (prefetch callbacks run); CXL blocks are freed, NVMe blocks stay.
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // One use of chain[first..] each (the rule's reuse history); no move.
  void Use(const StoreRequest& r);
  // Marks the tracked keys most recently used, the first most (TierManager::Touch).
  std::size_t Touch(std::span<const Key> keys);

  // New blocks chain[first..]: data(i) gives the bytes of chain[first + i] (block_bytes()),
  // asked only for blocks that are placed. Per key: where it went (kCxl, kNvme, kDropped),
  // already_held, or an error (kResourceExhausted: no free block; on_cxl's error). Returns
  // the first error.
  absl::Status Place(const StoreRequest& r, absl::FunctionRef<const void*(std::size_t)> data,
                     std::vector<KeyResult>* results);
  // The same, adopting blocks[i] (of this size class, filled by the caller) for chain[first +
  // i]: the store owns them now (frees those it does not keep).
  absl::Status PlaceBlocks(const StoreRequest& r, std::span<const allocator::BlockHandle> blocks,
                           std::vector<KeyResult>* results);

  // A block release_cxl handed over, given back once no reader can hold it: freed in the
  // arena. kFailedPrecondition naming the free's failure (stale, double free).
  absl::Status ReturnBlock(allocator::BlockHandle h);

  StoreLocation Lookup(const Key& key) const;
  absl::StatusOr<std::byte*> Acquire(const Key& key);
  void Release(const Key& key);
  // Copies each block into dsts[i] (len == block_bytes()) from wherever it is: CXL (a pinned
  // copy) or NVMe (one batched read, no promotion); waits up to 10 s for I/O in flight. Per
  // key: kCxl or kNvme, or kNotFound, kDataLoss (dropped), kFailedPrecondition (I/O did not
  // finish). Returns the first error.
  absl::Status Read(std::span<const Key> keys, std::span<void* const> dsts, std::size_t len,
                    std::vector<KeyResult>* results);

  // Starts reading chain[first..]'s NVMe blocks back into CXL where the strategy wants them
  // (kRule: the rule decides each as a new block, and the cool-down allows; kLruSpill: all;
  // r.force: all), one NVMe submission. Returns a ticket for Poll / Wait.
  absl::StatusOr<std::uint64_t> Prefetch(const StoreRequest& r);
  // Collects a ticket: per key of the request, kCxl (promoted or there already), kNvme (kept),
  // kMissing, or an error (kResourceExhausted: no free CXL block; kDataLoss). Poll:
  // kUnavailable while reads run (the ticket stays). kNotFound for an unknown ticket.
  absl::Status Poll(std::uint64_t ticket, std::vector<KeyResult>* results);
  absl::Status Wait(std::uint64_t ticket, std::vector<KeyResult>* results);

  // CXL -> NVMe; keys on NVMe already are left. Per key: kNvme or an error
  // (kFailedPrecondition: in flight or pinned).
  absl::Status Demote(std::span<const Key> keys, std::vector<KeyResult>* results);
  // Forgets blocks (CXL and NVMe). Per key: kMissing or an error.
  absl::Status Drop(std::span<const Key> keys, std::vector<KeyResult>* results);

  ExplainReport Explain(const Key& key);
  TieredStoreStats Stats();

  std::uint64_t block_bytes() const noexcept { return block_bytes_; }
  std::uint64_t capacity() const noexcept { return capacity_; }
  const TieredStoreOptions& options() const noexcept { return o_; }

  // What a driver (the C API, the replay) needs of the store's parts, as the store's own
  // operations: the store is the only door to its allocator, manager and NVMe store (the
  // include-rule test, tests/architecture_test.py, keeps it so).
  // The arena's identity, for the refs (cxlkv_block_ref) a driver hands out.
  const pool::Uuid& arena_uuid() const noexcept;
  // Whether `index` names a block of this store's size class of its arena (the C API's check
  // of a caller's ref before it takes the block).
  bool HoldsBlockIndex(std::uint64_t index) const noexcept;
  // OK when `ref` names a live block (that generation) of this store's arena; else why not.
  absl::Status CheckRef(const allocator::BlockRef& ref) const;
  // Makes a CXL block's bytes durable in the arena before it is published (write-back).
  absl::Status Persist(const allocator::BlockHandle& block);
  // The arena's usage (every process), and the tiers' occupancy as the manager counts it.
  pool::ArenaUsage ArenaUsage() const;
  TierStats ManagerStats() const;
  // Waits until every NVMe write queued so far has completed.
  void DrainNvme();

 private:
  struct KeyMeta {
    Key parent;
    coherence::Namespace ns = 0;
    std::uint32_t tokens = 0;
    std::int32_t pin = 0;
    LastMove last;
  };
  struct Ticket;

  explicit TieredStore(TieredStoreOptions options) : o_(std::move(options)) {}
  std::int64_t NowNs() const;
  std::uint32_t BlockTokens(const StoreRequest& r) const;  // a block's own (a use records it)
  std::uint32_t TokensOf(const StoreRequest& r, std::size_t pos) const;
  PlacementQuery Query(coherence::Namespace ns, const Key& key, std::uint32_t tokens,
                       std::int32_t pin) const;
  TierState State(double add, std::uint32_t queue_depth) const;
  LastMove DecideLocked(const StoreRequest& r, std::size_t pos, MoveEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberLocked(const StoreRequest& r, std::size_t pos, LastMove mv)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Tier VictimTier(const Key& key);
  absl::Status PlaceImpl(const StoreRequest& r,
                         const absl::FunctionRef<const void*(std::size_t)>* data,
                         std::span<const allocator::BlockHandle> blocks,
                         std::vector<KeyResult>* results);
  absl::Status Collect(std::uint64_t ticket, bool block, std::vector<KeyResult>* results);
  absl::StatusOr<allocator::BlockHandle> AllocBlock(bool for_nvme);

  TieredStoreOptions o_;
  std::string config_;
  std::unique_ptr<allocator::BlockAllocator> owned_alloc_;  // Open over an arena; outlives m_
  std::unique_ptr<TierManager> m_;
  std::uint64_t capacity_ = 0, high_ = 0, low_ = 0, block_bytes_ = 0, rule_bytes_ = 0;
  std::uint32_t class_tokens_ = 0;
  int slot_ = 0;  // the rule's index of this CXL tier

  mutable base::Mutex mu_;
  std::optional<Placer> placer_ ABSL_GUARDED_BY(mu_);  // kRule
  absl::flat_hash_map<Key, KeyMeta, NvmeKeyHash> meta_ ABSL_GUARDED_BY(mu_);
  std::uint32_t queue_depth_ ABSL_GUARDED_BY(mu_) = 0;  // the latest request's, for victims
  TieredStoreStats counts_ ABSL_GUARDED_BY(mu_);  // the store's own counters (placed_*, reads)

  base::Mutex tickets_mu_;
  std::uint64_t next_ticket_ ABSL_GUARDED_BY(tickets_mu_) = 1;
  absl::flat_hash_map<std::uint64_t, std::shared_ptr<Ticket>> tickets_ ABSL_GUARDED_BY(tickets_mu_);
};

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_TIERED_STORE_H_
