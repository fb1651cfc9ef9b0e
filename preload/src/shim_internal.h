// The private seam between the files of libcxlkv_preload.so (the shared object; its
// unit-tested parts are cxlkv_preload_core). docs/preload.md is the design; policy.h the
// decisions; cxl_heap.h the CXL memory. One concern per file:
//
//   interpose.cc   the exported malloc-family and mmap-family entry points, with their
//                  pass-through and ownership paths                    -fno-sanitize=all
//   bootstrap.cc   the process's own functions (dlsym RTLD_NEXT) and the buffer that serves
//                  dlsym's allocations while they are looked up        -fno-sanitize=all
//   operators.cc   C++ new/delete, routed through the entry points      -fno-sanitize=all
//   shim_state.cc  what every call reads (Hot), the heap, the thread guard, statistics
//   cxl_alloc.cc   allocation from the CXL heap, growth of a pooled heap (its own thread)
//   mmap_table.cc  anonymous mmaps served from CXL: the table, munmap and mremap of them
//   cuda_host.cc   cuda host allocations and registrations: entry points, heap registration,
//                  block table, chunked cudaHostRegister
//   shm_map.cc     shared-memory files backed by the pool (CXLKV_SHM): mmap, munmap, unlink
//   startup.cc     start-up (constructor), fork handlers, exit statistics (destructor)
//
// Three rules keep the shim safe inside any process:
//   1. Ownership is by address (policy.h OwnerOf): free/realloc/usable_size never trust who
//      "should" own a pointer, so memory from before start-up, from the shim's own internal
//      allocations or from another allocator always goes back to the process allocator.
//   2. A thread-local guard (Guard) marks the shim's own work (start-up, calls into jemalloc
//      and the pool): allocations made under it pass through, so nothing recurses into the heap.
//   3. A failure to use CXL is logged once and the request passes through; nothing aborts.
//
// Sanitizer builds (ASan+UBSan, TSan). The entry points run before the sanitizer runtime is
// initialized: the loader, libc and libstdc++ allocate while they start, and the runtime
// itself calls calloc through dlsym while it initializes. Instrumented code run then reads
// shadow memory that is not mapped yet and crashes. So the three files marked above, whose
// code can run before the shim's constructor (startup.cc Start), are compiled with
// -fno-sanitize=all (preload/CMakeLists.txt). The other files are instrumented: their code
// runs only after Start, and Start runs after the runtime's initializer (the runtime is a
// DT_NEEDED of the shim, and of an instrumented program, so the loader initializes it first).
// What keeps that true:
//   - A function reachable while the heap is inactive (hot.active false, empty CXL range,
//     statistics off: the state before Start) is defined in an uninstrumented file.
//     Instrumented files may call it; an uninstrumented file calls into an instrumented one
//     only behind one of those three conditions.
//   - The inline helpers here are always_inline, so each caller compiles them with its own
//     file's flags and the linker never picks an instrumented out-of-line copy for an
//     uninstrumented caller. (policy.h's constexpr one-liners are inlined the same way in the
//     sanitizer presets, which are optimized builds.)
//
// Everything here is hidden: the version script (exports.map) exports the entry points only.
#ifndef CXLKV_PRELOAD_SRC_SHIM_INTERNAL_H_
#define CXLKV_PRELOAD_SRC_SHIM_INTERNAL_H_

#include <pthread.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cxlkv/preload/cxl_heap.h"
#include "cxlkv/preload/policy.h"
#include "cxlkv/preload/settings.h"
#include "cxlkv/preload/stats.h"

#define CXLKV_EXPORT extern "C" __attribute__((visibility("default")))
#define CXLKV_IE __attribute__((tls_model("initial-exec")))
#define CXLKV_SHIM_INLINE inline __attribute__((always_inline))

#pragma GCC visibility push(hidden)

namespace cxlkv::preload {
class DomainSource;
class ShmBacking;
}  // namespace cxlkv::preload

namespace cxlkv::preload::shim {

constexpr std::size_t kPage = 4096;
constexpr std::uint64_t kNever = ~std::uint64_t{0};

// ---- bootstrap.cc: the process's own functions --------------------------------------------

// noexcept so that the fast paths can tail-call them.
struct RealFns {
  void* (*malloc)(std::size_t) noexcept;
  void (*free)(void*) noexcept;
  void* (*calloc)(std::size_t, std::size_t) noexcept;
  void* (*realloc)(void*, std::size_t) noexcept;
  int (*posix_memalign)(void**, std::size_t, std::size_t) noexcept;
  void* (*aligned_alloc)(std::size_t, std::size_t) noexcept;
  void* (*memalign)(std::size_t, std::size_t) noexcept;
  void* (*valloc)(std::size_t) noexcept;
  void* (*pvalloc)(std::size_t) noexcept;
  std::size_t (*malloc_usable_size)(void*) noexcept;
  void* (*mmap)(void*, std::size_t, int, int, int, off_t) noexcept;
  int (*munmap)(void*, std::size_t) noexcept;
  void* (*mremap)(void*, std::size_t, std::size_t, int, ...) noexcept;
  int (*madvise)(void*, std::size_t, int) noexcept;
  int (*unlink)(const char*) noexcept;
  int (*unlinkat)(int, const char*, int) noexcept;
  int (*shm_unlink)(const char*);
};
extern RealFns real;  // null members until ResolveReal has run
// True while this thread runs ResolveReal: dlsym's own allocations go to the boot buffer.
extern constinit thread_local bool tls_resolving CXLKV_IE;

// Looks the real functions up once (any thread; others wait for the first).
void ResolveReal() noexcept;
// mmap/munmap before they are resolved: the raw system calls.
void* RealMmap(void* a, std::size_t n, int prot, int flags, int fd, off_t off) noexcept;
int RealMunmap(void* a, std::size_t n) noexcept;

// The bootstrap buffer: serves dlsym's allocations while ResolveReal runs. Blocks carry
// their size in a 16-byte header and are never reused (they are zero, as calloc needs).
constexpr std::size_t kBootBytes = 256 << 10;
extern unsigned char boot_buf[kBootBytes];
CXLKV_SHIM_INLINE AddressRange BootRange() noexcept {
  return AddressRange{reinterpret_cast<std::uintptr_t>(boot_buf), kBootBytes};
}
void* BootAlloc(std::size_t n, std::size_t align) noexcept;
std::size_t BootSize(const void* p) noexcept;

// ---- shim_state.cc: what every call reads ---------------------------------------------------

// > 0 while this thread does the shim's own work (rule 2 above).
extern constinit thread_local int tls_guard CXLKV_IE;

struct Guard {
  CXLKV_SHIM_INLINE Guard() noexcept { ++tls_guard; }
  CXLKV_SHIM_INLINE ~Guard() { --tls_guard; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// What every call reads, on one cache line. Written at start-up (before `active`) and at fork.
struct alignas(64) Hot {
  // malloc's fast path: below this, straight to the process allocator (a tail call). 0
  // before start-up and while statistics are on (every call then takes the counted path).
  std::atomic<std::uint64_t> fast_min_bytes{0};
  std::atomic<std::uint64_t> min_bytes{0};
  std::atomic<std::uint64_t> mmap_min_bytes{kNever};
  std::atomic<std::uintptr_t> cxl_lo{0};
  std::atomic<std::uintptr_t> cxl_bytes{0};
  std::atomic<bool> active{false};
  std::atomic<bool> slow_owner{false};  // the heap has no single range: ask it on every free
  std::atomic<bool> stats_on{false};
  // free's fast path (a tail call to the process allocator) is allowed: started, no
  // statistics, ownership decided by the range alone.
  std::atomic<bool> free_fast{false};
  // CXLKV_SHM is set and its backing exists: shared file mappings and unlinks are looked at.
  std::atomic<bool> shm_on{false};
};
extern Hot hot;

extern CxlHeap* heap;  // set once at start-up, never freed (other threads may still use it)
extern Settings* settings;
extern char state_reason[512];  // what backs the heap, or why the shim passes everything through

CXLKV_SHIM_INLINE AddressRange CxlRange() noexcept {
  return AddressRange{hot.cxl_lo.load(std::memory_order_relaxed),
                      hot.cxl_bytes.load(std::memory_order_relaxed)};
}
CXLKV_SHIM_INLINE bool Active() noexcept { return hot.active.load(std::memory_order_acquire); }
CXLKV_SHIM_INLINE bool InShim() noexcept { return tls_guard > 0; }

// Statistics (CXLKV_STATS): per-thread counters linked into one registry.
extern StatsRegistry registry;
extern constinit thread_local ThreadStats tls_stats CXLKV_IE;
// Counts of threads whose own counters were retired (see shim_state.cc).
extern ThreadStats late_stats;
extern pthread_key_t stats_key;  // its destructor retires a thread's counters
void RetireThreadStats(void* p);
ThreadStats& MyStats() noexcept;  // after start-up only (stats_on)
CXLKV_SHIM_INLINE void CountAlloc(AllocClass c, Route r, std::size_t n) noexcept {
  if (hot.stats_on.load(std::memory_order_relaxed)) MyStats().CountAlloc(c, r, n);
}
CXLKV_SHIM_INLINE void CountFree(AllocClass c, Route r) noexcept {
  if (hot.stats_on.load(std::memory_order_relaxed)) MyStats().CountFree(c, r);
}

// A CXL-routed request the heap could not serve: counted, logged once.
void Fallback(AllocClass c, std::size_t n) noexcept;

// ---- cxl_alloc.cc: allocation from the CXL heap (after start-up only) ----------------------

// heap->Alloc, growing a pooled heap when it is full. Under the guard.
void* HeapAlloc(std::size_t n, std::size_t align, bool zero) noexcept;
// A counted allocation from the heap; nullptr (counted as a fallback) when it cannot serve.
void* CxlAlloc(AllocClass c, std::size_t n, std::size_t align, bool zero) noexcept;
// Frees a malloc-family block of the heap.
void FreeCxl(void* p) noexcept;
// Starts the thread that grows a pooled heap (CXLKV_POOL=orchestrator:...). domain_source is
// the pooled heap's extent source (left at exit), or nullptr.
extern DomainSource* domain_source;
bool StartGrower() noexcept;

// ---- interpose.cc: the policy and ownership every path shares -----------------------------

Route RouteFor(AllocClass c, std::size_t n) noexcept;
// Owner of p: the CXL range, the bootstrap buffer, a heap without a range, or the process.
Owner OwnerOfPtr(const void* p) noexcept;
// munmap: the parts outside the heap's range to the kernel, the parts inside to UnmapCxl.
int Munmap(void* addr, std::size_t len) noexcept;

// ---- mmap_table.cc: anonymous mmaps served from CXL (after start-up only) ------------------

extern pthread_mutex_t mmap_mu;  // guards the table; held across fork
// A page-rounded, zeroed block for an eligible anonymous mmap of len bytes, or nullptr.
void* MmapCxl(std::size_t len) noexcept;
// munmap of [a, a + len) inside the heap's range (page-aligned, page-rounded): unmaps the
// CXL mappings it overlaps.
void UnmapCxl(std::uintptr_t a, std::size_t len) noexcept;
// mremap of a block the shim served (old inside the heap's range): emulated.
void* MremapCxl(void* old, std::size_t old_len, std::size_t new_len, int flags,
                void* new_addr) noexcept;

// ---- cuda_host.cc ---------------------------------------------------------------------------

extern pthread_mutex_t cuda_mu;  // guards the cuda block table; held across fork
// cudaHostRegister calls larger than this are split (CXLKV_REGISTER_CHUNK).
extern std::atomic<std::uint64_t> register_chunk_bytes;

// ---- shm_map.cc (after start-up only: behind hot.shm_on) -----------------------------------

extern ShmBacking* shm;  // set once at start-up when CXLKV_SHM is, never freed
// A MAP_SHARED mmap of fd: *handled says whether the result is the answer (a mapping, or
// MAP_FAILED with errno set); otherwise the caller maps as asked.
void* ShmMmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off,
              bool* handled) noexcept;
// The length munmap(addr, len) must unmap (a device-DAX extent's rounding included).
std::size_t ShmUnmapLength(void* addr, std::size_t len) noexcept;
// After a successful munmap of [addr, addr + len).
void ShmMunmapped(void* addr, std::size_t len) noexcept;
// After a successful unlink of path (relative to dirfd); st: its lstat from before.
void ShmUnlinked(int dirfd, const char* path, const struct stat& st) noexcept;

}  // namespace cxlkv::preload::shim

#pragma GCC visibility pop

#endif  // CXLKV_PRELOAD_SRC_SHIM_INTERNAL_H_
