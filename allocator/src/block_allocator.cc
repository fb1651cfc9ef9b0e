// Slow paths, per-thread cache lifetime, fork handling and stats of the block allocator.
#include "cxlkv/allocator/block_allocator.h"

#include <pthread.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/mutex.h"

#ifdef CXLKV_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace cxlkv::allocator {
namespace internal {
// "= {}": the zero state spelled out, which clang needs to see constinit's constant
// initializer (gcc accepts the implicit zero-initialization of a thread_local).
constinit thread_local TlsSlot tls_slots[kMaxAllocators] CXLKV_ALLOCATOR_TLS = {};
}  // namespace internal

using internal::Magazine;
using internal::ThreadCache;

// Process-wide table of live allocators, so that thread exit and fork can find them.
struct AllocatorRegistry {
  base::Mutex mu;  // also guards each allocator's uid_, caches_ and retired_
  BlockAllocator* by_id[internal::kMaxAllocators] ABSL_GUARDED_BY(mu) = {};
  std::uint64_t next_uid ABSL_GUARDED_BY(mu) = 1;

  static AllocatorRegistry& Get() {
    static auto* r = new AllocatorRegistry();  // leaked: used by thread exits after main
    return *r;
  }

  // fork(): the child keeps only the forking thread and must not touch blocks its parent
  // owns, so every allocator gets a new uid (inherited TLS caches no longer match) and no
  // owner until its next slow path reattaches it.
  // Held from Prepare to Parent or Child (pthread_atfork's pairs): not a scope the analysis
  // can follow.
  static void Prepare() ABSL_NO_THREAD_SAFETY_ANALYSIS { Get().mu.Lock(); }
  static void Parent() ABSL_NO_THREAD_SAFETY_ANALYSIS { Get().mu.Unlock(); }
  static void Child() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    AllocatorRegistry& r = Get();
    for (BlockAllocator* a : r.by_id) {
      if (a == nullptr) continue;
      a->uid_ = r.next_uid++;
      a->owner_bits_.store(internal::kNeverOwner, std::memory_order_relaxed);
      a->caches_.clear();  // the parent's threads own those caches
    }
    r.mu.Unlock();
  }
};

// Returns a thread's cached blocks when it exits.
struct ThreadReaper {
  ~ThreadReaper() {
    AllocatorRegistry& r = AllocatorRegistry::Get();
    base::MutexLock lock(r.mu);
    for (std::uint32_t id = 0; id < internal::kMaxAllocators; ++id) {
      internal::TlsSlot& t = internal::tls_slots[id];
      BlockAllocator* a = r.by_id[id];
      if (t.cache != nullptr && a != nullptr && t.uid == a->uid_) a->RetireCache(t.cache);
      t = internal::TlsSlot{0, nullptr};
    }
  }
};
namespace {
thread_local ThreadReaper reaper;
}  // namespace

const char* FreeResultName(FreeResult r) noexcept {
  switch (r) {
    case FreeResult::kOk:
      return "ok";
    case FreeResult::kDoubleFree:
      return "double free";
    case FreeResult::kStaleGeneration:
      return "stale generation";
    case FreeResult::kForeign:
      return "foreign block";
  }
  return "?";
}

BlockAllocator::BlockAllocator(std::unique_ptr<pool::Arena> arena)
    : arena_(std::move(arena)),
      words_(arena_->words()),
      total_blocks_(arena_->total_blocks()),
      class_count_(arena_->class_count()) {}

absl::StatusOr<std::unique_ptr<BlockAllocator>> BlockAllocator::Create(
    std::unique_ptr<pool::Arena> arena) {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] {
    ::pthread_atfork(&AllocatorRegistry::Prepare, &AllocatorRegistry::Parent,
                     &AllocatorRegistry::Child);
  });
  if (arena->read_only()) {
    return absl::FailedPreconditionError(
        absl::StrCat(arena->region().name(), ": cannot allocate from an arena opened read-only"));
  }
  std::unique_ptr<BlockAllocator> a(new BlockAllocator(std::move(arena)));
  AllocatorRegistry& r = AllocatorRegistry::Get();
  base::MutexLock lock(r.mu);
  for (std::uint32_t id = 0; id < internal::kMaxAllocators; ++id) {
    if (r.by_id[id] != nullptr) continue;
    a->id_ = id;
    a->uid_ = r.next_uid++;
    a->owner_bits_.store(std::uint64_t{a->arena_->owner_id()} << pool::kOwnerShift,
                         std::memory_order_relaxed);
    r.by_id[id] = a.get();
    return a;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "this process already has ", internal::kMaxAllocators, " block allocators open; close one"));
}

BlockAllocator::~BlockAllocator() {
  AllocatorRegistry& r = AllocatorRegistry::Get();
  base::MutexLock lock(r.mu);
  while (!caches_.empty()) RetireCache(caches_.back());
  r.by_id[id_] = nullptr;
  // arena_ goes next: its Detach returns whatever this process still owns.
}

void BlockAllocator::RetireCache(ThreadCache* c) noexcept {
  for (std::uint32_t cls = 0; cls < class_count_; ++cls) {
    Drain(c->mags[cls], cls, 0);
    retired_[cls].allocs += c->allocs[cls].v.load(std::memory_order_relaxed);
    retired_[cls].frees += c->frees[cls].v.load(std::memory_order_relaxed);
  }
  caches_.erase(std::remove(caches_.begin(), caches_.end(), c), caches_.end());
  delete c;
}

ThreadCache* BlockAllocator::EnsureCache() noexcept {
  internal::TlsSlot& t = internal::tls_slots[id_];
  if (t.uid == uid_) return t.cache;
  if (!arena_->EnsureAttached().ok()) return nullptr;  // reattaches a forked child
  (void)&reaper;  // instantiate the thread-exit hook for this thread
  auto* c = new (std::nothrow) ThreadCache();
  if (c == nullptr) return nullptr;
  for (std::uint32_t cls = 0; cls < class_count_; ++cls) {
    // Cache at most 1/32 of a class per thread, so threads cannot strand a small arena.
    c->mags[cls].cap = std::clamp<std::uint32_t>(arena_->class_record(cls).block_count / 32, 1,
                                                 internal::kMagazineMax);
  }
  AllocatorRegistry& r = AllocatorRegistry::Get();
  base::MutexLock lock(r.mu);
  owner_bits_.store(std::uint64_t{arena_->owner_id()} << pool::kOwnerShift,
                    std::memory_order_relaxed);
  caches_.push_back(c);
  t = internal::TlsSlot{uid_, c};
  return c;
}

bool BlockAllocator::Refill(ThreadCache* c, std::uint32_t cls) noexcept {
  Magazine& m = c->mags[cls];
  const std::uint32_t want = std::max<std::uint32_t>(1, m.cap / 2);
  std::size_t got = arena_->ClaimBatch(cls, m.items + m.count, want);
  if (got == 0) {
    arena_->MaybeRecover();  // dead owners' blocks and lost hints come back
    got = arena_->ClaimBatch(cls, m.items + m.count, want);
  }
  for (std::size_t i = 0; i < got; ++i) Poison(m.items[m.count + i]);
  m.count += static_cast<std::uint32_t>(got);
  refills_[cls].fetch_add(1, std::memory_order_relaxed);
  return got != 0;
}

void BlockAllocator::Drain(Magazine& m, std::uint32_t cls, std::uint32_t keep) noexcept {
  if (m.count <= keep) return;
  const std::uint32_t n = m.count - keep;
  for (std::uint32_t i = 0; i < n; ++i) Unpoison(m.items[i]);
  arena_->ReleaseCached(m.items, n);
  std::copy(m.items + n, m.items + m.count, m.items);
  m.count = keep;
  drains_[cls].fetch_add(1, std::memory_order_relaxed);
}

BlockHandle BlockAllocator::AllocSlow(std::uint32_t cls) noexcept {
  if (cls >= class_count_) return BlockHandle{};
  ThreadCache* c = EnsureCache();
  if (c == nullptr || (c->mags[cls].count == 0 && !Refill(c, cls))) {
    failed_allocs_[cls].fetch_add(1, std::memory_order_relaxed);
    return BlockHandle{};
  }
  return Alloc(cls);
}

FreeResult BlockAllocator::FreeSlow(BlockHandle h) noexcept {
  if (h.index >= total_blocks_) {
    bad_frees_.fetch_add(1, std::memory_order_relaxed);
    return FreeResult::kForeign;
  }
  const std::uint64_t v = words_[h.index].load(std::memory_order_acquire);
  const pool::BlockState state = pool::WordState(v);
  const std::uint32_t gen = pool::WordGen(v);
  if (state != pool::kAllocated || gen != h.generation) {
    bad_frees_.fetch_add(1, std::memory_order_relaxed);
    return (state != pool::kAllocated && gen == h.generation + 1) ? FreeResult::kDoubleFree
                                                                  : FreeResult::kStaleGeneration;
  }
  const std::uint32_t owner = pool::WordOwner(v);
  ThreadCache* c = EnsureCache();
  if (c != nullptr && owner != 0 && owner == arena_->owner_id()) {
    const std::uint32_t cls = pool::WordClass(v);
    Magazine& m = c->mags[cls];
    if (m.count >= m.cap) Drain(m, cls, m.cap / 2);
    words_[h.index].store(internal::CachedAfterFree(v), std::memory_order_relaxed);
    m.items[m.count++] = h.index;
    c->frees[cls].Inc();
    Poison(h.index);
    return FreeResult::kOk;
  }
  // Persisted, or owned by another process: hand it straight back to the pool.
  if (arena_->FreeShared(h.index, h.generation)) return FreeResult::kOk;
  bad_frees_.fetch_add(1, std::memory_order_relaxed);
  return FreeResult::kDoubleFree;  // lost a race with another free of the same generation
}

bool BlockAllocator::AllocBulk(std::uint32_t cls, std::size_t n, BlockHandle* out) noexcept {
  if (cls >= class_count_) return false;
  ThreadCache* c = EnsureCache();
  if (c == nullptr) return false;
  Magazine& m = c->mags[cls];
  const std::size_t from_mag = std::min<std::size_t>(m.count, n);
  // Reused per thread: a bulk allocation does not go to the heap.
  thread_local std::vector<std::uint32_t> scratch;
  scratch.resize(n - from_mag);
  std::vector<std::uint32_t>& claimed = scratch;
  std::size_t got = claimed.empty() ? 0 : arena_->ClaimBatch(cls, claimed.data(), claimed.size());
  if (got < claimed.size()) {
    arena_->MaybeRecover();
    got += arena_->ClaimBatch(cls, claimed.data() + got, claimed.size() - got);
  }
  if (got < claimed.size()) {  // all or nothing
    arena_->ReleaseCached(claimed.data(), got);
    failed_allocs_[cls].fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::size_t k = 0;
  for (; k < from_mag; ++k) {
    const std::uint32_t index = m.items[--m.count];
    const std::uint64_t v = words_[index].load(std::memory_order_relaxed);
    words_[index].store(v + internal::kCachedToAllocated, std::memory_order_relaxed);
    out[k] = BlockHandle{index, pool::WordGen(v)};
    Unpoison(index);
  }
  for (std::uint32_t index : claimed) {
    const std::uint64_t v = words_[index].load(std::memory_order_relaxed);
    words_[index].store(v + internal::kCachedToAllocated, std::memory_order_relaxed);
    out[k++] = BlockHandle{index, pool::WordGen(v)};
  }
  for (std::size_t i = 0; i < n; ++i) c->allocs[cls].Inc();
  return true;
}

std::size_t BlockAllocator::FreeBulk(const BlockHandle* handles, std::size_t n) noexcept {
  ThreadCache* c = EnsureCache();
  if (c == nullptr) {
    std::size_t ok = 0;
    for (std::size_t i = 0; i < n; ++i) ok += FreeSlow(handles[i]) == FreeResult::kOk;
    return ok;
  }
  // Our own blocks go to the magazine while it has room and back to the arena in one
  // batch after that (one hint update per hint word); anything else takes FreeSlow.
  thread_local std::vector<std::uint32_t> overflow;
  overflow.clear();
  std::size_t ok = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const BlockHandle h = handles[i];
    const std::uint64_t v =
        h.index < total_blocks_ ? words_[h.index].load(std::memory_order_relaxed) : 0;
    const std::uint64_t expect = owner_bits_.load(std::memory_order_relaxed) |
                                 (std::uint64_t{pool::kAllocated} << pool::kStateShift) |
                                 h.generation;
    if (h.index >= total_blocks_ || (v & ~internal::kClassMask) != expect) {
      ok += FreeSlow(h) == FreeResult::kOk;
      continue;
    }
    const std::uint32_t cls = pool::WordClass(v);
    words_[h.index].store(internal::CachedAfterFree(v), std::memory_order_relaxed);
    c->frees[cls].Inc();
    Magazine& m = c->mags[cls];
    if (m.count < m.cap) {
      m.items[m.count++] = h.index;
      Poison(h.index);
    } else {
      overflow.push_back(h.index);
    }
    ++ok;
  }
  if (!overflow.empty()) arena_->ReleaseCached(overflow.data(), overflow.size());
  return ok;
}

absl::StatusOr<std::byte*> BlockAllocator::Resolve(const BlockRef& ref) const {
  return arena_->Resolve(ref.arena, ref.index, ref.generation);
}

absl::StatusOr<BlockRef> BlockAllocator::RefOf(const void* addr) const {
  const std::int64_t index = arena_->IndexOfAddr(addr);
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("address ", absl::Hex(reinterpret_cast<std::uintptr_t>(addr)),
                     " is not the start of a block of arena ", pool::UuidToString(arena_->uuid())));
  }
  const auto i = static_cast<std::uint32_t>(index);
  const std::uint64_t v = words_[i].load(std::memory_order_acquire);
  if (pool::WordState(v) != pool::kAllocated) {
    return absl::FailedPreconditionError(absl::StrCat("block ", i, " is not allocated"));
  }
  return BlockRef{arena_->uuid(), i, pool::WordGen(v)};
}

absl::Status BlockAllocator::Persist(BlockHandle h) {
  if (arena_->Persist(h.index, h.generation)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("block ", h.index, " generation ", h.generation,
                   " is not an allocated block of this process; only the owner can persist it"));
}

void BlockAllocator::FlushThreadCache() noexcept {
  internal::TlsSlot& t = internal::tls_slots[id_];
  if (t.uid != uid_) return;
  for (std::uint32_t cls = 0; cls < class_count_; ++cls) Drain(t.cache->mags[cls], cls, 0);
}

absl::Status BlockAllocator::ExplainAllocFailure(std::uint32_t cls) const {
  if (cls >= class_count_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size class ", cls, " does not exist; this arena has ", class_count_, " classes"));
  }
  const pool::ArenaUsage u = arena_->Usage();
  const pool::ClassUsage& c = u.classes[cls];
  return absl::ResourceExhaustedError(absl::StrCat(
      arena_->region().name(), ": size class ", cls, " (", base::FormatBytes(c.block_bytes),
      " blocks) is full: ", c.allocated, " allocated, ", c.persisted, " persisted, ", c.cached,
      " held in per-thread caches, ", c.free, " free of ", c.total,
      "; free blocks, or format a larger region"));
}

AllocatorStats BlockAllocator::Stats() const {
  AllocatorStats s;
  s.classes.resize(class_count_);
  {
    AllocatorRegistry& r = AllocatorRegistry::Get();
    base::MutexLock lock(r.mu);
    for (std::uint32_t cls = 0; cls < class_count_; ++cls) {
      ClassStats& cs = s.classes[cls];
      cs = retired_[cls];
      for (const ThreadCache* c : caches_) {
        cs.allocs += c->allocs[cls].v.load(std::memory_order_relaxed);
        cs.frees += c->frees[cls].v.load(std::memory_order_relaxed);
      }
      cs.failed_allocs = failed_allocs_[cls].load(std::memory_order_relaxed);
      cs.refills = refills_[cls].load(std::memory_order_relaxed);
      cs.drains = drains_[cls].load(std::memory_order_relaxed);
    }
  }
  s.bad_frees = bad_frees_.load(std::memory_order_relaxed);
  s.usage = arena_->Usage();
  return s;
}

#ifdef CXLKV_ASAN
void BlockAllocator::Poison(std::uint32_t index) const noexcept {
  ASAN_POISON_MEMORY_REGION(
      arena_->BlockAddr(index),
      arena_->class_record(pool::WordClass(words_[index].load(std::memory_order_relaxed)))
          .block_bytes);
}
void BlockAllocator::Unpoison(std::uint32_t index) const noexcept {
  ASAN_UNPOISON_MEMORY_REGION(
      arena_->BlockAddr(index),
      arena_->class_record(pool::WordClass(words_[index].load(std::memory_order_relaxed)))
          .block_bytes);
}
#endif

}  // namespace cxlkv::allocator
