// cxlkv/preload/stats.h — what the shim did: counts and bytes per allocation class
// (malloc family, cuda host, anonymous mmap), CXL vs pass-through.
//
// Counting is per thread (no shared cache line on the pass-through path): each thread's
// ThreadStats lives in its TLS, is linked into a global list on first use and folded into
// the retired totals when the thread exits. Snapshot() sums retired + live threads (a
// racy but monotone read: counters are relaxed atomics written by their thread only).
#ifndef CXLKV_PRELOAD_STATS_H_
#define CXLKV_PRELOAD_STATS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "cxlkv/preload/policy.h"

namespace cxlkv::preload {

struct StatsSnapshot {
  std::uint64_t allocs[kAllocClasses][kRoutes] = {};
  std::uint64_t bytes[kAllocClasses][kRoutes] = {};  // requested bytes
  std::uint64_t frees[kAllocClasses][kRoutes] = {};
  std::uint64_t by_size[kRoutes][kSizeBuckets] = {};  // allocations per size bucket
  std::uint64_t reallocs_to_cxl = 0;    // realloc moved a block into CXL (grew to threshold)
  std::uint64_t reallocs_to_pass = 0;   // realloc moved a block out of CXL (shrank below)
  std::uint64_t fallbacks = 0;          // CXL was chosen but could not serve: passed through
  std::uint64_t cuda_registered = 0;    // CXL cuda host allocations pinned with cudaHostRegister
  std::uint64_t cuda_unregistered = 0;  // ... served without registration (no device)
  std::uint64_t cuda_split_registrations = 0;  // cudaHostRegister calls split into chunks
  std::uint64_t cuda_split_chunks = 0;         // ... and the chunks registered for them
  std::uint64_t shm_bound = 0;                 // CXLKV_SHM mappings backed by the pool
  std::uint64_t shm_bound_bytes = 0;           // ... their bytes
  std::uint64_t shm_passed = 0;                // matching mappings left to the file (reason logged)
};

struct ThreadStats {
  std::atomic<std::uint64_t> allocs[kAllocClasses][kRoutes];
  std::atomic<std::uint64_t> bytes[kAllocClasses][kRoutes];
  std::atomic<std::uint64_t> frees[kAllocClasses][kRoutes];
  std::atomic<std::uint64_t> by_size[kRoutes][kSizeBuckets];
  ThreadStats* next;
  ThreadStats* prev;
  bool linked;

  static void Add(std::atomic<std::uint64_t>& c, std::uint64_t v) noexcept {
    c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  void CountAlloc(AllocClass cls, Route r, std::uint64_t n) noexcept {
    const int c = static_cast<int>(cls), ri = static_cast<int>(r);
    Add(allocs[c][ri], 1);
    Add(bytes[c][ri], n);
    Add(by_size[ri][SizeBucket(n)], 1);
  }
  void CountFree(AllocClass cls, Route r) noexcept {
    Add(frees[static_cast<int>(cls)][static_cast<int>(r)], 1);
  }
  void AddTo(StatsSnapshot* s) const noexcept;
  void Reset() noexcept;  // zero counters, unlinked (a forked child's copy)
};

// Process-wide pieces: the list of live threads, retired totals and the rare counters.
class StatsRegistry {
 public:
  void Link(ThreadStats* t) noexcept;    // first use in a thread
  void Retire(ThreadStats* t) noexcept;  // thread exit: fold and unlink
  StatsSnapshot Snapshot() const noexcept;
  void AfterForkChild() noexcept;  // only the forking thread survives a fork

  std::atomic<std::uint64_t> reallocs_to_cxl{0};
  std::atomic<std::uint64_t> reallocs_to_pass{0};
  std::atomic<std::uint64_t> fallbacks{0};
  std::atomic<std::uint64_t> cuda_registered{0};
  std::atomic<std::uint64_t> cuda_unregistered{0};
  std::atomic<std::uint64_t> cuda_split_registrations{0};
  std::atomic<std::uint64_t> cuda_split_chunks{0};
  std::atomic<std::uint64_t> shm_bound{0};
  std::atomic<std::uint64_t> shm_bound_bytes{0};
  std::atomic<std::uint64_t> shm_passed{0};

 private:
  mutable std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  ThreadStats* head_ = nullptr;
  StatsSnapshot retired_;
};

struct StatsContext {
  int pid = 0;
  std::string pool;    // the spec, or empty
  std::string state;   // "cxl" or "pass-through"
  std::string reason;  // why pass-through, or what backs the heap
  std::uint64_t min_bytes = 0;
  std::uint64_t heap_bytes = 0;  // bytes of the pool this process holds for its heap
};

// JSON rendering of the stats file.
std::string RenderStatsJson(const StatsSnapshot& s, const StatsContext& ctx);
const char* AllocClassName(AllocClass c) noexcept;

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_STATS_H_
