// cxlkv/pool/arena.h — a formatted region: header, owner table, allocation map, blocks.
//
// Format() writes a new arena; Open() validates an existing one (header checksum, geometry,
// every map word) and attaches this process as an owner. Blocks are claimed into an owner's
// cache in batches (ClaimBatch) and released in batches (ReleaseCached); the allocator in
// allocator/ builds its per-thread fast path on top of the map words exposed here.
//
// Lifetime: a block belongs to the process that claimed it until it frees it, persists it
// (owner 0, survives the process) or dies. Closing the Arena or dying has the same effect:
// everything the process still owns returns to the free pool, by itself on close, by the
// next process that runs Recover() after a crash. So after kill -9 at any instant the map is
// consistent: a block is free, owned by a live process, or persisted — never two of these.
// The death of the whole host, on a pool device that keeps its memory, loses what the host's
// cache held: Persist and FreeShared write their word back before returning, so persisted
// blocks and shared frees survive it; other map changes may revert to an earlier state of
// the same dead owners, which Recover then returns.
//
// Thread-safety: all methods may be called from any thread. Several processes on one host
// may open the same arena at once. After fork() the child must not use blocks its parent
// owned; slow-path calls reattach the child under a new owner slot automatically.
#ifndef CXLKV_POOL_ARENA_H_
#define CXLKV_POOL_ARENA_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/kv_layout.h"
#include "cxlkv/pool/layout.h"
#include "cxlkv/pool/region.h"

namespace cxlkv::pool {

using Uuid = std::array<std::uint8_t, 16>;
std::string UuidToString(const Uuid& uuid);

// One size class at format time: a block of `tokens_per_block` tokens of the arena's layout,
// or of explicit `block_bytes`. `weight` shares the data area between classes.
struct ClassSpec {
  std::uint32_t tokens_per_block = 0;
  std::uint64_t block_bytes = 0;
  std::uint32_t weight = 1;
};

struct FormatOptions {
  KvLayout layout = Llama3_70B();
  std::vector<ClassSpec> classes;  // empty: one class of layout.tokens_per_block tokens
  std::uint32_t owner_slots = 256;
  // Overwrite an existing arena or foreign data. Even with force, an arena with live owners
  // is never overwritten.
  bool force = false;
  // With force: the caller holds the region exclusively (an extent under a capacity lease
  // from the orchestrator), so the owners recorded in an old arena there are gone whatever
  // their slots say (they may belong to another machine, whose processes we cannot see).
  bool exclusive = false;
};

// The cache-line operations the arena applies to map words that must reach memory (or be
// fetched from it) on a pool shared without hardware coherence: coherence/cache.h by
// default. Tests substitute recording ones to check which words are flushed or fetched.
struct CacheOps {
  void (*flush)(const void* addr, std::size_t len) noexcept = &coherence::Flush;
  void (*fence)() noexcept = &coherence::Fence;
  void (*invalidate)(const void* addr, std::size_t len) noexcept = &coherence::Invalidate;
};

struct OpenOptions {
  // When set, an arena formatted for a different layout is refused.
  std::optional<KvLayout> expect_layout;
  // Validate and map, but neither attach as an owner nor recover: the arena is not written.
  // For readers that only resolve refs (inspection, another host of a pooled region).
  // ClaimBatch and Persist then fail.
  bool read_only = false;
  CacheOps cache_ops{};
};

struct ClassUsage {
  std::uint64_t block_bytes = 0;
  std::uint64_t stride_bytes = 0;
  std::uint32_t total = 0;
  std::uint32_t free = 0;
  std::uint32_t cached = 0;     // reserved in some owner's cache
  std::uint32_t allocated = 0;  // handed out, owned by a process
  std::uint32_t persisted = 0;  // handed out, owned by nobody
  std::uint32_t largest_free_run = 0;
};

struct ArenaUsage {
  std::vector<ClassUsage> classes;
  std::uint32_t owners_active = 0;
  std::uint64_t region_bytes = 0;
  std::uint64_t metadata_bytes = 0;
};

struct RecoveryReport {
  std::uint32_t owners_reclaimed = 0;
  std::uint32_t blocks_reclaimed = 0;
  std::uint32_t hints_repaired = 0;
};

class Arena {
 public:
  static absl::StatusOr<std::unique_ptr<Arena>> Format(std::unique_ptr<Region> region,
                                                       const FormatOptions& options);
  static absl::StatusOr<std::unique_ptr<Arena>> Open(std::unique_ptr<Region> region,
                                                     const OpenOptions& options = {});
  // Releases this process's owner slot and every block it still owns.
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  const Region& region() const noexcept { return *region_; }
  const ArenaHeader& header() const noexcept { return header_; }
  const Uuid& uuid() const noexcept { return uuid_; }
  KvLayout layout() const noexcept { return KvLayout::FromRecord(header_.layout); }
  std::uint32_t class_count() const noexcept { return header_.class_count; }
  const ClassRecord& class_record(std::uint32_t cls) const noexcept { return header_.classes[cls]; }
  std::uint32_t total_blocks() const noexcept { return header_.total_blocks; }

  // Map word of block `index` (global index, < total_blocks()).
  BlockWord& word(std::uint32_t index) const noexcept { return words_[index]; }
  BlockWord* words() const noexcept { return words_; }
  // Address of block `index` in this process. Inline: one map-word load for the class.
  std::byte* BlockAddr(std::uint32_t index) const noexcept {
    const std::uint32_t cls = WordClass(words_[index].load(std::memory_order_relaxed));
    return reinterpret_cast<std::byte*>(block_bias_[cls] +
                                        std::uint64_t{index} * header_.classes[cls].stride_bytes);
  }
  // Global index of the block containing addr, or -1 if addr is not inside a block start.
  std::int64_t IndexOfAddr(const void* addr) const noexcept;
  // Address of the block a ref names, after checking that the ref's arena is this one, the
  // index is in range, and the block is allocated with that generation. A reader that copies
  // data out must check again afterwards (the block may be freed meanwhile). A read-only
  // view (another host's) fetches the map word from memory first (invalidate + load): its
  // cached copy may be older than the publisher's Persist.
  absl::StatusOr<std::byte*> Resolve(const Uuid& arena, std::uint32_t index,
                                     std::uint32_t generation) const;
  bool read_only() const noexcept { return read_only_; }

  // This process's owner id as stored in map words (slot + 1); 0 before attach.
  std::uint32_t owner_id() const noexcept { return owner_id_.load(std::memory_order_relaxed); }

  // Moves up to n free blocks of class cls into this owner's cache (kFree -> kCached) and
  // writes their indexes to out. Returns how many; 0 means the class has no free block.
  std::size_t ClaimBatch(std::uint32_t cls, std::uint32_t* out, std::size_t n) noexcept;
  // Claims n blocks of class cls with consecutive indexes, hence one contiguous address
  // range of n * stride bytes, whose first block address is a multiple of align_bytes (a
  // power of two; 0 or 1: no constraint), into this owner's cache (kFree -> kCached).
  // Returns the first index, or -1 when no such run is free. All or nothing: blocks claimed
  // before a conflicting claimer won a word are given back. For callers that carve their
  // own allocations out of whole runs (the preload shim's extent source). O(blocks of cls).
  std::int64_t ClaimRun(std::uint32_t cls, std::uint32_t n, std::uint64_t align_bytes) noexcept;
  // Returns blocks this owner holds in kCached to the free pool.
  void ReleaseCached(const std::uint32_t* indexes, std::size_t n) noexcept;
  // Frees a block owned by nobody or by another live process (CAS), or persisted, and writes
  // the word back to memory (flush + fence). Returns false when the word does not match
  // (stale generation, not allocated).
  bool FreeShared(std::uint32_t index, std::uint32_t gen) noexcept;
  // Hands an allocated block of this owner to nobody: it survives this process and must be
  // freed explicitly (by any process). The word is in memory when this returns (flush +
  // fence), so the block survives this host's death too. False if the word is not
  // ours/allocated/this gen. One line write-back: not on the allocation fast path.
  bool Persist(std::uint32_t index, std::uint32_t gen) noexcept;

  // Reclaims the blocks of dead owners on this host and repairs lost free hints. Safe to
  // run concurrently with allocation in this and other processes.
  RecoveryReport Recover();
  // Recover() unless this process ran one in the last millisecond: for allocation failure
  // paths, so a full pool does not turn every failed allocation into a map scan.
  RecoveryReport MaybeRecover();
  // Ensures this process holds an owner slot (reattaches after fork()).
  absl::Status EnsureAttached();

  // Scans the map. O(total_blocks); for tools, stats and tests.
  ArenaUsage Usage() const;

 private:
  Arena() = default;
  // Take this process's owner slot / give it back; attach_mu_ held.
  absl::Status Attach() ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu_);
  void Detach() ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu_);
  std::uint32_t ReclaimOwners(const std::vector<std::uint32_t>& slots);

  std::unique_ptr<Region> region_;
  ArenaHeader header_{};  // validated copy; the on-media header is immutable after format
  Uuid uuid_{};
  BlockWord* words_ = nullptr;
  OwnerSlot* slots_ = nullptr;
  // Attaching and detaching this process (base::Mutex: docs/architecture.md). owner_id_ and
  // attached_fork_epoch_ are written under it and read without it by the claim paths' fast
  // check (atomics, relaxed: a stale value only sends a caller to the locked slow path).
  base::Mutex attach_mu_;
  std::atomic<std::uint32_t> owner_id_{0};
  std::uint32_t attached_pid_ ABSL_GUARDED_BY(attach_mu_) = 0;
  std::atomic<std::uint64_t> attached_fork_epoch_{0};  // see ForkEpoch() in arena.cc
  // Per class: address of region base + data_offset - first_index * stride, as an integer
  // (it may lie before the region), so a block's address is bias + index * stride.
  std::array<std::uintptr_t, kMaxClasses> block_bias_{};
  std::array<std::atomic<std::uint32_t>, kMaxClasses> cursor_{};  // hint word to try first
  std::atomic<std::int64_t> last_recover_ns_{0};
  bool read_only_ = false;
  CacheOps cache_ops_;
};

// Validation used by Open() and by the fuzzer: bounds, alignment and overlap of every
// offset in a header already known to be sealed (kDataLoss / kFailedPrecondition).
absl::Status ValidateGeometry(const ArenaHeader& h, std::uint64_t region_bytes,
                              absl::string_view what);
// Checks every owner slot state and map word of a region image whose header passed
// ValidateGeometry. Names the first bad block or slot.
absl::Status ValidateMap(const ArenaHeader& h, const std::byte* base, absl::string_view what);
// Counts blocks by state from a validated image, without attaching (read-only).
ArenaUsage ScanUsage(const ArenaHeader& h, const std::byte* base);
// Header checks that need no map: record seal, magic states, geometry.
absl::Status ValidateHeaderBytes(const std::byte* base, std::uint64_t region_bytes,
                                 absl::string_view what, ArenaHeader* out);

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_ARENA_H_
