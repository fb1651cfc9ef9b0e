// cxlkv/tier/tier_manager.h — moves KV blocks between a CXL arena and the NVMe tier.
//
// TierManager owns a BlockAllocator (one size class of a CXL arena) and an NvmeStore. It
// tracks every block handed to it by key and knows where each one lives:
//   Place(key, block, target)  a new block: keep it in CXL, write it to NVMe, or drop it
//   Demote(keys)               CXL -> NVMe: write, then free the CXL block (only on success:
//                              on any NVMe failure the block stays in CXL, nothing is lost)
//   Prefetch(keys) / Promote   NVMe -> CXL: allocate CXL blocks and read into them, one
//                              io_uring submit per batch, completion by callback or Wait
//   Acquire / Release          pin a CXL block for use (marks it recently used; no demotion)
//   Read(keys)                 NVMe -> the caller's buffers, no promotion (one batch)
// Where a block should go is not decided here: the placement rule (placement.h, through a
// Placer, placer.h) picks a Tier (tier.h) and the caller calls Place/Move; the rule may
// re-decide watermark victims (TierOptions::victim_tier). The manager has one CXL arena:
// kCxlExpanded and kCxlPooled both mean that arena.
// The only policy in this class is mechanical: capacity watermarks with hysteresis (above the
// high watermark, the least recently used unpinned blocks leave CXL until at most the low
// watermark remain), an NVMe capacity with LRU eviction, and an anti-thrash cool-down (a block
// demoted less than cooldown_ms ago is not promoted; CheckPromote and the error say why).
// A CXL block that other readers can reach (published in a shared prefix index) is handed to
// TierOptions::release_cxl when it leaves CXL, so its owner frees it only once they are gone.
//
// Thread-safety: every method may be called from any thread. The manager's lock is never held
// across NVMe I/O. Prefetch callbacks run on the thread that reaps the NVMe completion.
// Ownership: the manager owns the store, every block placed in it and (unless created over a
// borrowed one) the allocator; CXL addresses from Acquire stay valid until the matching Release.
#ifndef CXLKV_TIER_TIER_MANAGER_H_
#define CXLKV_TIER_TIER_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/nvme/nvme_store.h"
#include "cxlkv/tier/tier.h"

namespace cxlkv::tier {

// The NVMe medium (nvme/) as the manager uses it.
using nvme::NvmeBatch;
using nvme::NvmeKey;
using nvme::NvmeKeyHash;
using nvme::NvmeStore;
using Key = NvmeKey;

// Where a tracked block is now. kDemoting / kPromoting: NVMe I/O in flight.
enum class Residence : std::uint8_t { kCxl, kNvme, kDemoting, kPromoting };
const char* ResidenceName(Residence r) noexcept;

struct TierOptions {
  // The arena size class whose blocks this manager handles; its block size must fit the
  // store's payload_bytes.
  std::uint32_t size_class = 0;
  // Watermarks in CXL-resident blocks of this manager; high 0 disables them. low <= high.
  std::uint64_t high_watermark_blocks = 0;
  std::uint64_t low_watermark_blocks = 0;
  // Run the watermarks at the end of Place and Promote (else only on EnforceWatermarks()).
  bool auto_enforce = true;
  // A block demoted less than this long ago is not promoted (anti-thrash).
  std::int64_t cooldown_ms = 1000;
  // Time source in milliseconds (monotonic); empty: CLOCK_MONOTONIC.
  std::function<std::int64_t()> now_ms;
  // Where a watermark victim goes: kNvme (demoted) or kDrop (forgotten). A placement rule
  // re-decides each victim here. A CXL tier counts as kNvme: the watermark needs the room. Empty:
  // every victim is demoted. Called without the manager's lock held.
  std::function<Tier(const Key&)> victim_tier;
  // Called, without the lock, for every CXL block the manager lets go of that was resident
  // under a key (demoted, dropped, evicted; not a promotion that failed, whose block nobody
  // saw): the callee owns the block and frees it when no reader can still hold it — e.g.
  // after retiring it from a shared prefix index. Empty: the manager frees it at once.
  std::function<void(const Key&, allocator::BlockHandle)> release_cxl;
  // At most this many blocks only on NVMe; past it, the least recently used (demoted or read
  // longest ago) are deleted from the store. 0: bounded only by the store's capacity.
  std::uint64_t nvme_capacity_blocks = 0;
};

enum class PromoteVerdict : std::uint8_t {
  kAllowed,
  kNotTracked,   // no block under this key
  kAlreadyInCxl,
  kInFlight,     // being demoted or promoted now
  kCoolingDown,  // demoted less than cooldown_ms ago: retry_after_ms says when
};
const char* PromoteVerdictName(PromoteVerdict v) noexcept;

struct PromoteCheck {
  PromoteVerdict verdict = PromoteVerdict::kNotTracked;
  std::int64_t demoted_ms_ago = 0;
  std::int64_t retry_after_ms = 0;
  bool allowed() const noexcept { return verdict == PromoteVerdict::kAllowed; }
};

struct TierStats {
  std::uint64_t cxl_blocks = 0;   // resident in CXL (including blocks being demoted)
  std::uint64_t nvme_blocks = 0;  // only on NVMe (including blocks being promoted)
  std::uint64_t demotions = 0;           // CXL -> NVMe moves (not placements)
  std::uint64_t placed_nvme = 0;         // new blocks Place wrote straight to NVMe
  std::uint64_t demotion_failures = 0;
  std::uint64_t promotions = 0;
  std::uint64_t promotion_failures = 0;
  std::uint64_t promotions_refused = 0;  // cool-down
  std::uint64_t watermark_runs = 0;      // times the high watermark was crossed
  std::uint64_t dropped = 0;             // Tier::kDrop, and blocks lost to NVMe data loss
  std::uint64_t victims_dropped = 0;     // watermark victims victim_tier sent to kDrop
  std::uint64_t nvme_evicted = 0;        // deleted past nvme_capacity_blocks
  std::uint64_t nvme_reads = 0;          // blocks read by Read (no promotion)
};

// The state of one asynchronous promotion batch; owned by the caller, alive until done().
class PromotionBatch {
 public:
  PromotionBatch() = default;
  PromotionBatch(const PromotionBatch&) = delete;
  PromotionBatch& operator=(const PromotionBatch&) = delete;

  bool done() const noexcept { return io_.done(); }
  std::size_t size() const noexcept { return keys_.size(); }
  const Key& key(std::size_t i) const { return keys_[i]; }
  // Per key, once done(): OK (now in CXL), kFailedPrecondition (cooling down, already in CXL,
  // in flight — the message says which), kNotFound, kResourceExhausted (no free CXL block),
  // kDataLoss (the NVMe copy failed its checks: the block is gone, recompute it).
  const absl::Status& status(std::size_t i) const { return status_[i]; }
  absl::Status first_error() const;

 private:
  friend class TierManager;
  NvmeBatch io_;
  std::vector<Key> keys_;
  std::vector<absl::Status> status_;
  std::vector<std::size_t> io_op_;  // per key: index in io_, or kNoOp
  std::vector<allocator::BlockHandle> blocks_;
  absl::AnyInvocable<void(PromotionBatch&)> callback_;
};

class TierManager {
 public:
  // Takes ownership of both tiers. Blocks already in the store (after a restart) are
  // adopted as NVMe-resident, with no cool-down. kInvalidArgument for a size class out of
  // range, a block size larger than the store's payload_bytes, or bad watermarks.
  static absl::StatusOr<std::unique_ptr<TierManager>> Create(
      std::unique_ptr<allocator::BlockAllocator> cxl, std::unique_ptr<NvmeStore> nvme,
      TierOptions options);
  // The same over an allocator the caller keeps and may go on using for other blocks (the C
  // API's tier shares its arena handle's allocator): it must outlive the manager. The
  // manager owns only the blocks handed to it.
  static absl::StatusOr<std::unique_ptr<TierManager>> Create(allocator::BlockAllocator& cxl,
                                                             std::unique_ptr<NvmeStore> nvme,
                                                             TierOptions options);
  // Waits for NVMe I/O in flight; CXL blocks still tracked are freed.
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // A new block under key: `block` was allocated from allocator() (size class of the
  // options) and filled by the caller; the manager owns it from now on. kCxlExpanded or
  // kCxlPooled (both: this manager's one arena): tracked in CXL as most recently used. kNvme:
  // written to NVMe, then its CXL block freed; if the write fails the block stays tracked in CXL
  // and the error is returned. kDrop: freed. kAlreadyExists if key is tracked (the block is then
  // left to the caller).
  absl::Status Place(const Key& key, allocator::BlockHandle block, Tier target);
  // Place for many blocks to one tier; kNvme writes them in one NVMe batch. Per-key results
  // go to *results when given; returns the first error.
  absl::Status Place(std::span<const Key> keys, std::span<const allocator::BlockHandle> blocks,
                     Tier target, std::vector<absl::Status>* results = nullptr);
  // Moves a tracked block: a CXL tier promotes (synchronously), kNvme demotes, kDrop forgets
  // it and frees its CXL block or NVMe copy.
  absl::Status Move(const Key& key, Tier target);

  // CXL -> NVMe for these keys, one NVMe batch. Each key must be in CXL and unpinned. On
  // success a block's CXL copy is freed; on failure it stays in CXL. Returns the first error;
  // per-key results go to *results when given.
  absl::Status Demote(std::span<const Key> keys, std::vector<absl::Status>* results = nullptr);
  absl::Status Demote(const Key& key) { return Demote(std::span<const Key>(&key, 1)); }

  // NVMe -> CXL ahead of use: for each key that CheckPromote allows, allocates a CXL block and
  // reads the NVMe copy into it; the reads go in one submit. `done` runs once all complete.
  // Keys refused up front get their status at once. kFailedPrecondition if batch is in flight.
  absl::Status Prefetch(std::span<const Key> keys, PromotionBatch& batch,
                        absl::AnyInvocable<void(PromotionBatch&)> done = nullptr);
  void Wait(PromotionBatch& batch);
  // Prefetch + Wait for one key.
  absl::Status Promote(const Key& key);
  // Whether Promote(key) would be allowed now, and if not, why.
  PromoteCheck CheckPromote(const Key& key) const;

  // Reads NVMe-resident blocks into the caller's buffers (dest_bytes each) without promoting
  // them, one NVMe batch; marks them recently used on NVMe. Per key in *results: OK,
  // kFailedPrecondition (not on NVMe: the message says where), kNotFound, kDataLoss (the copy
  // failed its checks: the block is dropped, recompute it). Returns the first error.
  absl::Status Read(std::span<const Key> keys, std::span<void* const> dests,
                    std::uint64_t dest_bytes, std::vector<absl::Status>* results = nullptr);

  // Pins key's CXL block and marks it most recently used; the address stays valid until
  // Release. kFailedPrecondition when the block is not in CXL (the message says where it is),
  // kNotFound when untracked.
  absl::StatusOr<std::byte*> Acquire(const Key& key);
  void Release(const Key& key);
  // Marks the tracked keys most recently used in their tier, the first one most: pass a
  // prefix chain root first and its tail is evicted before its head (a chain is useful only
  // up to its first missing block, so losing the head wastes every block after it). Keys not
  // tracked, or in flight, are skipped. Returns how many were marked.
  std::size_t Touch(std::span<const Key> keys);

  // If more than high_watermark_blocks are in CXL, demotes (or drops, as victim_tier says) the
  // least recently used unpinned blocks until at most low_watermark_blocks remain (or no
  // candidate is left). Returns how many left CXL, or the first demotion error when none
  // could (blocks whose demotion failed stay in CXL).
  absl::StatusOr<std::size_t> EnforceWatermarks();

  // How long a block left unused lasts in CXL before the watermarks evict it (Che's
  // characteristic time, the input the placement rule prices CXL pressure by): an EWMA over
  // watermark runs of the idle time of the youngest block each run evicted, or the time since
  // the last run when that is longer (a tier that stopped evicting keeps blocks longer and
  // longer). +inf until the first run evicts a block. Seconds.
  double RetentionS() const;

  std::optional<Residence> Where(const Key& key) const;
  // The CXL block of a key resident in CXL (to publish it, or to check an index against it).
  std::optional<allocator::BlockHandle> CxlBlock(const Key& key) const;
  TierStats Stats() const;
  allocator::BlockAllocator& allocator() const noexcept { return *cxl_; }
  NvmeStore& store() const noexcept { return *nvme_; }
  std::uint64_t block_bytes() const noexcept { return block_bytes_; }

 private:
  struct Entry {
    Residence where = Residence::kCxl;
    allocator::BlockHandle block;
    std::int64_t demoted_at_ms = 0;
    std::int64_t used_at_ms = 0;  // entered CXL, or was last acquired or touched there
    bool cooldown = false;  // demoted_at_ms applies
    std::uint32_t pins = 0;
    std::list<Key>::iterator lru;  // valid while the block occupies CXL
    std::list<Key>::iterator nvme_lru;  // valid while where == kNvme
  };
  TierManager() = default;
  std::int64_t Now() const;
  absl::Status DemoteKeys(std::span<const Key> keys, std::vector<absl::Status>* results,
                          bool cooldown);
  PromoteCheck CheckLocked(const Key& key, std::int64_t now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RefusalStatus(const Key& key, const PromoteCheck& c) const;
  void FinishPromotion(PromotionBatch& batch);
  void MaybeEnforce();
  // The key's entry becomes NVMe-resident / stops being: keeps nvme_lru_ in step.
  void EnterNvmeLocked(const Key& key, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaveNvmeLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the least recently used NVMe-only blocks past nvme_capacity_blocks.
  void EvictNvmeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands a CXL block that was resident under key to release_cxl, or frees it.
  void ReleaseCxl(const Key& key, allocator::BlockHandle h);

  static absl::StatusOr<std::unique_ptr<TierManager>> Make(
      allocator::BlockAllocator* cxl, std::unique_ptr<allocator::BlockAllocator> owned,
      std::unique_ptr<NvmeStore> nvme, TierOptions options);

  std::unique_ptr<allocator::BlockAllocator> owned_cxl_;  // null when the caller keeps it
  allocator::BlockAllocator* cxl_ = nullptr;
  std::unique_ptr<NvmeStore> nvme_;
  TierOptions options_;
  std::uint32_t cls_ = 0;
  std::uint64_t block_bytes_ = 0;

  // Guards everything below (base::Mutex, a std::mutex that ThreadSanitizer understands with
  // the annotations clang checks; docs/architecture.md). FinishPromotion takes it.
  mutable base::Mutex mu_;
  absl::flat_hash_map<Key, Entry, NvmeKeyHash> entries_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // front: most recently used
  // NVMe-only blocks, front: most recently demoted or read.
  std::list<Key> nvme_lru_ ABSL_GUARDED_BY(mu_);
  std::uint64_t cxl_resident_ ABSL_GUARDED_BY(mu_) = 0;
  TierStats stats_ ABSL_GUARDED_BY(mu_);
  // RetentionS(): EWMA of the youngest victim's idle ms per watermark run (< 0: no run yet).
  double retention_ewma_ms_ ABSL_GUARDED_BY(mu_) = -1;
  std::int64_t last_eviction_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cxlkv::tier

#endif  // CXLKV_TIER_TIER_MANAGER_H_
