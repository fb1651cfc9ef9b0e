// cxlkv/coherence/cache.h — making stores visible to, and loads fresh from, memory that other
// hosts share without hardware coherence (CXL 2.0 pooled DRAM), and streaming copies into it.
//
// The instruction used is chosen once per process from CPUID:
//   Flush:      clwb > clflushopt > clflush   (write back dirty lines; clwb may keep them cached)
//   Invalidate: clflushopt > clflush          (write back and drop lines, so the next load
//                                              misses and fetches what memory holds now)
//   Fence:      sfence (orders stores, NT stores, clwb and clflushopt before later stores)
//   CopyNt:     movdir64b > AVX-512 streaming stores > SSE2 streaming stores; ends with sfence,
//               so no Flush pass is needed afterwards.
// All functions are thread-safe and noexcept; they never fail. Ranges need no alignment.
//
// Publishing protocol on a shared line: write; Flush(); Fence(); then the store that makes
// the write reachable (also Flush()ed and Fence()d). Reading: Invalidate() then load.
// Flush without Fence is not a barrier: Flush only starts the write-back.
#ifndef CXLKV_COHERENCE_CACHE_H_
#define CXLKV_COHERENCE_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace cxlkv::coherence {

inline constexpr std::size_t kCacheLineBytes = 64;

// Which instruction each primitive uses in this process.
enum class FlushKind : std::uint8_t { kClwb, kClflushopt, kClflush };
enum class CopyKind : std::uint8_t { kMovdir64b, kAvx512Nt, kSse2Nt };

struct CpuFeatures {
  bool clwb = false;
  bool clflushopt = false;
  bool clflush = false;
  bool movdir64b = false;
  bool avx512f = false;
  bool sse42 = false;
};

// Features from CPUID (cached after the first call), less those $CXLKV_CPU_DISABLE names.
const CpuFeatures& DetectedCpuFeatures() noexcept;

// CXLKV_CPU_DISABLE=<feature>[,<feature>...] makes the process behave as on a CPU without
// them (read once, at the first use of this header's primitives): the flush, invalidate and
// streaming-copy instructions and the CRC then fall back as they would there. For operators (a
// platform where an instruction misbehaves on the CXL device) and for running the whole suite
// as a machine without movdir64b or AVX-512 would (docs/coherence.md). Names: clwb,
// clflushopt, movdir64b, avx512f, sse42 (clflush is every x86-64's and cannot be disabled).
// MaskCpuFeatures applies such a list; an unknown name is left out and reported in *unknown
// (the process prints it once on stderr, naming the accepted ones).
CpuFeatures MaskCpuFeatures(CpuFeatures f, absl::string_view disable, std::string* unknown);

FlushKind ActiveFlushKind() noexcept;
FlushKind ActiveInvalidateKind() noexcept;
CopyKind ActiveCopyKind() noexcept;
absl::string_view FlushKindName(FlushKind kind) noexcept;
absl::string_view CopyKindName(CopyKind kind) noexcept;

// Writes back every cache line overlapping [addr, addr+len). Does not order anything: call
// Fence() before the store that publishes the data.
void Flush(const void* addr, std::size_t len) noexcept;

// Writes back and evicts every line overlapping [addr, addr+len), then issues mfence so that
// later loads of the range come from memory. Use before reading a record another host wrote.
void Invalidate(const void* addr, std::size_t len) noexcept;

// Invalidate without the fence: writes back and evicts the lines, ordering nothing. Evict
// several records, then one _mm_mfence() (or Invalidate of the last), then read them all:
// the evictions overlap instead of each waiting for the one before.
void Evict(const void* addr, std::size_t len) noexcept;

// Store fence: flushes and non-temporal stores issued before it complete before any store
// after it becomes visible.
void Fence() noexcept;

// Copies len bytes to dst with non-temporal stores and fences. dst must be 64-byte aligned
// (every arena block is); src may be unaligned; len may be any size (a tail shorter than a
// line is written with ordinary stores and flushed). The data is in memory on return.
void CopyNt(void* dst, const void* src, std::size_t len) noexcept;

// Variants with an explicit instruction, for tests and benchmarks. A kind the CPU lacks
// falls back to the next weaker one.
void FlushWith(FlushKind kind, const void* addr, std::size_t len) noexcept;
void CopyNtWith(CopyKind kind, void* dst, const void* src, std::size_t len) noexcept;

// ---- Observing the primitives (tests) ----------------------------------------------------
//
// On one machine caches are coherent, so no test can see a missing write-back or
// invalidation by its effect. A test can see it structurally instead: a CacheObserver,
// installed by a ScopedCacheObserver for the test's duration, is told about every Flush,
// FlushWith, Invalidate, Evict and Fence of the process, on whichever thread issues them,
// just before the instruction runs (the range is still mapped and readable then, so the
// observer may read it). CopyNt's own streaming stores and fence are not reported (its
// ordinary-store head and tail are, as Flushes). Without an observer each primitive pays
// one load of a null pointer.
enum class CacheOp : std::uint8_t { kFlush, kInvalidate, kEvict, kFence };

class CacheObserver {
 public:
  virtual ~CacheObserver() = default;
  // Called concurrently from any thread; must not call the primitives itself. addr/len are
  // the caller's range (0 for kFence).
  virtual void OnCacheOp(CacheOp op, const void* addr, std::size_t len) noexcept = 0;
};

// Installs `observer` for the lifetime of this object (one at a time in a process: a second
// one while another is installed aborts). The destructor uninstalls it and waits until no
// thread is still inside a callback, so the observer may be destroyed right after.
class ScopedCacheObserver {
 public:
  explicit ScopedCacheObserver(CacheObserver& observer) noexcept;
  ~ScopedCacheObserver();
  ScopedCacheObserver(const ScopedCacheObserver&) = delete;
  ScopedCacheObserver& operator=(const ScopedCacheObserver&) = delete;
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_CACHE_H_
