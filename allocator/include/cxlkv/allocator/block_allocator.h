// cxlkv/allocator/block_allocator.h — the KV block allocator over one arena.
//
// Alloc/Free are the fast path: a per-thread magazine of block indexes per size class in
// front of the arena's shared allocation map. A pair touches only this thread's magazine and
// the block's map word (plain stores: the owning process is the word's only writer while it
// owns the block). Magazines refill and drain in batches through pool::Arena::ClaimBatch /
// ReleaseCached, so crash consistency is kept at the granularity of what the process owns:
// after kill -9 every block the process held returns to the free pool (Arena::Recover).
//
// Handles and refs: BlockHandle {index, generation} is what the fast path returns; BlockRef
// adds the arena uuid and is valid in every process mapping the arena. Freeing bumps the
// generation, so a stale ref or a second free is detected, never silently accepted.
//
// Thread-safety: Alloc/Free/AllocBulk/FreeBulk/Resolve may be called concurrently from any
// threads. A block may be freed by another thread or another process (the latter through
// a CAS on the map word). Destroying the allocator while other threads still call it is a
// bug. After fork() the child gets a new owner slot and an empty cache on its first call.
// Freed blocks are poisoned for AddressSanitizer in this process.
#ifndef CXLKV_ALLOCATOR_BLOCK_ALLOCATOR_H_
#define CXLKV_ALLOCATOR_BLOCK_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/pool/arena.h"

namespace cxlkv::allocator {

inline constexpr std::uint32_t kInvalidIndex = 0xFFFFFFFFu;

struct BlockHandle {
  std::uint32_t index = kInvalidIndex;
  std::uint32_t generation = 0;
  bool valid() const noexcept { return index != kInvalidIndex; }
  bool operator==(const BlockHandle&) const = default;
};

struct BlockRef {
  pool::Uuid arena{};
  std::uint32_t index = kInvalidIndex;
  std::uint32_t generation = 0;
  bool operator==(const BlockRef&) const = default;
};

enum class FreeResult : std::uint8_t {
  kOk = 0,
  kDoubleFree,       // the block is already free (this generation was freed before)
  kStaleGeneration,  // the block was freed and reused since this handle was taken
  kForeign,          // not a block of this arena
};
const char* FreeResultName(FreeResult r) noexcept;

struct ClassStats {
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t failed_allocs = 0;
  std::uint64_t refills = 0;
  std::uint64_t drains = 0;
};

struct AllocatorStats {
  std::vector<ClassStats> classes;  // this process, all threads
  std::uint64_t bad_frees = 0;      // double, stale and foreign frees detected
  pool::ArenaUsage usage;           // the whole arena, all processes (a map scan)
};

namespace internal {
inline constexpr std::uint32_t kMaxAllocators = 64;
inline constexpr std::uint32_t kMagazineMax = 64;

struct Magazine {
  std::uint32_t count = 0;
  std::uint32_t cap = 0;
  std::uint32_t items[kMagazineMax];
};

// Counters are written by the owning thread only and read racily by Stats().
struct Counter {
  std::atomic<std::uint64_t> v{0};
  void Inc() noexcept { v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
};

struct ThreadCache {
  Magazine mags[pool::kMaxClasses];
  Counter allocs[pool::kMaxClasses];
  Counter frees[pool::kMaxClasses];
};

struct TlsSlot {
  std::uint64_t uid;
  ThreadCache* cache;
};
// Initial-exec (one %fs-relative load) except in libcxlkv.so, which the preload shim also
// dlopen()s and so may not use it: there, TLS descriptors (allocator/CMakeLists.txt,
// cxlkv_allocator_dso).
#if CXLKV_ALLOCATOR_DYNAMIC_TLS
#define CXLKV_ALLOCATOR_TLS
#else
#define CXLKV_ALLOCATOR_TLS __attribute__((tls_model("initial-exec")))
#endif
extern constinit thread_local TlsSlot tls_slots[kMaxAllocators] CXLKV_ALLOCATOR_TLS;

inline constexpr std::uint64_t kCachedToAllocated = 1ull << pool::kStateShift;
inline constexpr std::uint64_t kStateMask = 3ull << pool::kStateShift;
inline constexpr std::uint64_t kClassMask = 7ull << pool::kClassShift;
inline constexpr std::uint64_t kNeverOwner = 1ull << 63;  // matches no valid map word

// The map word of an allocated block after its owner frees it into a cache: kCached, same
// owner and class, next generation (refs to the freed use stop resolving).
constexpr std::uint64_t CachedAfterFree(std::uint64_t v) {
  return (v & ~(pool::kGenMask | kStateMask)) |
         (std::uint64_t{pool::kCached} << pool::kStateShift) | ((v + 1) & pool::kGenMask);
}
}  // namespace internal

class BlockAllocator {
 public:
  // Takes ownership of an opened arena. kResourceExhausted if the process already has 64
  // allocators open.
  static absl::StatusOr<std::unique_ptr<BlockAllocator>> Create(std::unique_ptr<pool::Arena> arena);
  ~BlockAllocator();
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // Allocates one block of size class cls. O(1): a magazine pop, refilled in batches.
  // Returns an invalid handle when the class is full or cls is out of range;
  // ExplainAllocFailure(cls) then says which.
  BlockHandle Alloc(std::uint32_t cls) noexcept;
  // Frees a block. O(1). Detects double free, stale generation and foreign handles.
  FreeResult Free(BlockHandle h) noexcept;

  // Allocates exactly n blocks of class cls into out, or none (returns false).
  bool AllocBulk(std::uint32_t cls, std::size_t n, BlockHandle* out) noexcept;
  // Frees n blocks; returns how many were freed (the others are reported in stats).
  std::size_t FreeBulk(const BlockHandle* handles, std::size_t n) noexcept;

  // Address of an allocated block in this process (no validation).
  std::byte* Addr(BlockHandle h) const noexcept { return arena_->BlockAddr(h.index); }
  BlockRef Ref(BlockHandle h) const noexcept {
    return BlockRef{arena_->uuid(), h.index, h.generation};
  }
  // Validates a ref from any process: arena uuid, index, allocated state and generation.
  absl::StatusOr<std::byte*> Resolve(const BlockRef& ref) const;
  // The ref of the allocated block that starts at addr.
  absl::StatusOr<BlockRef> RefOf(const void* addr) const;
  // Makes an allocated block of this process survive it (see pool::Arena::Persist).
  absl::Status Persist(BlockHandle h);

  // Returns this thread's cached blocks to the arena.
  void FlushThreadCache() noexcept;
  // Why Alloc(cls) just failed, as a Status (cold).
  absl::Status ExplainAllocFailure(std::uint32_t cls) const;
  AllocatorStats Stats() const;

  pool::Arena& arena() const noexcept { return *arena_; }
  std::uint32_t class_count() const noexcept { return class_count_; }
  std::uint64_t block_bytes(std::uint32_t cls) const noexcept {
    return arena_->class_record(cls).block_bytes;
  }

 private:
  explicit BlockAllocator(std::unique_ptr<pool::Arena> arena);
  BlockHandle AllocSlow(std::uint32_t cls) noexcept;
  FreeResult FreeSlow(BlockHandle h) noexcept;
  internal::ThreadCache* EnsureCache() noexcept;
  bool Refill(internal::ThreadCache* c, std::uint32_t cls) noexcept;
  void Drain(internal::Magazine& m, std::uint32_t cls, std::uint32_t keep) noexcept;
  void RetireCache(internal::ThreadCache* c) noexcept;  // registry lock held
  void Poison(std::uint32_t index) const noexcept;
  void Unpoison(std::uint32_t index) const noexcept;
  friend struct AllocatorRegistry;
  friend struct ThreadReaper;

  std::unique_ptr<pool::Arena> arena_;
  pool::BlockWord* words_ = nullptr;
  std::uint32_t total_blocks_ = 0;
  std::uint32_t class_count_ = 0;
  std::uint32_t id_ = 0;
  std::uint64_t uid_ = 0;  // changes on fork in the child, invalidating TLS caches
  // Owner id << kOwnerShift. Read by every Free; written when a thread cache is created
  // after (re)attach, by one thread at a time under the registry mutex.
  std::atomic<std::uint64_t> owner_bits_{internal::kNeverOwner};
  std::vector<internal::ThreadCache*> caches_;  // guarded by the registry mutex
  ClassStats retired_[pool::kMaxClasses];       // counters of exited threads (registry mutex)
  std::atomic<std::uint64_t> failed_allocs_[pool::kMaxClasses] = {};
  std::atomic<std::uint64_t> refills_[pool::kMaxClasses] = {};
  std::atomic<std::uint64_t> drains_[pool::kMaxClasses] = {};
  mutable std::atomic<std::uint64_t> bad_frees_{0};
};

// ---- fast paths -----------------------------------------------------------------------------

inline BlockHandle BlockAllocator::Alloc(std::uint32_t cls) noexcept {
  internal::TlsSlot& t = internal::tls_slots[id_];
  if (t.uid == uid_ && cls < class_count_) [[likely]] {
    internal::Magazine& m = t.cache->mags[cls];
    if (m.count != 0) [[likely]] {
      const std::uint32_t index = m.items[--m.count];
      pool::BlockWord& w = words_[index];
      const std::uint64_t v = w.load(std::memory_order_relaxed);
      // kCached -> kAllocated. Only this process writes a word it owns.
      w.store(v + internal::kCachedToAllocated, std::memory_order_relaxed);
      t.cache->allocs[cls].Inc();
      Unpoison(index);
      return BlockHandle{index, pool::WordGen(v)};
    }
  }
  return AllocSlow(cls);
}

inline FreeResult BlockAllocator::Free(BlockHandle h) noexcept {
  if (h.index < total_blocks_) [[likely]] {
    pool::BlockWord& w = words_[h.index];
    const std::uint64_t v = w.load(std::memory_order_relaxed);
    const std::uint64_t expect = owner_bits_.load(std::memory_order_relaxed) |
                                 (std::uint64_t{pool::kAllocated} << pool::kStateShift) |
                                 h.generation;
    internal::TlsSlot& t = internal::tls_slots[id_];
    if ((v & ~internal::kClassMask) == expect && t.uid == uid_) [[likely]] {
      const std::uint32_t cls = pool::WordClass(v);
      internal::Magazine& m = t.cache->mags[cls];
      if (m.count < m.cap) [[likely]] {
        w.store(internal::CachedAfterFree(v), std::memory_order_relaxed);
        m.items[m.count++] = h.index;
        t.cache->frees[cls].Inc();
        Poison(h.index);
        return FreeResult::kOk;
      }
    }
  }
  return FreeSlow(h);
}

#if defined(__SANITIZE_ADDRESS__)
#define CXLKV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CXLKV_ASAN 1
#endif
#endif

#ifndef CXLKV_ASAN
inline void BlockAllocator::Poison(std::uint32_t) const noexcept {}
inline void BlockAllocator::Unpoison(std::uint32_t) const noexcept {}
#endif

}  // namespace cxlkv::allocator

#endif  // CXLKV_ALLOCATOR_BLOCK_ALLOCATOR_H_
