// libcxlkv_preload.so: the interposed entry points (malloc family, anonymous mmap, cuda host
// allocations), start-up, fork handling and the exit statistics. docs/preload.md is the
// design; policy.h the decisions; cxl_heap.h the CXL memory.
//
// Three rules keep this safe inside any process:
//   1. Ownership is by address (policy.h OwnerOf): free/realloc/usable_size never trust who
//      "should" own a pointer, so memory from before start-up, from the shim's own internal
//      allocations or from another allocator always goes back to the process allocator.
//   2. A thread-local guard marks the shim's own work (start-up, calls into jemalloc and
//      the pool): allocations made under it pass through, so nothing recurses into the heap.
//   3. A failure to use CXL is logged once and the request passes through; nothing aborts.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cxlkv/gpu/plan.h"
#include "cxlkv/pool/spec.h"
#include "cxlkv/preload/cxl_heap.h"
#include "cxlkv/preload/mapping_table.h"
#include "cxlkv/preload/policy.h"
#include "cxlkv/preload/settings.h"
#include "cxlkv/preload/stats.h"
#include "domain_source.h"
#include "log.h"

extern char** environ;

#define CXLKV_EXPORT extern "C" __attribute__((visibility("default")))
#define CXLKV_IE __attribute__((tls_model("initial-exec")))

namespace cxlkv::preload {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::uint64_t kNever = ~std::uint64_t{0};

// ---- the process's own functions --------------------------------------------------------------

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
};
RealFns real{};
std::atomic<int> resolve_state{0};  // 0: not yet, 1: in progress, 2: done

constinit thread_local int tls_guard CXLKV_IE = 0;
constinit thread_local bool tls_resolving CXLKV_IE = false;

struct Guard {
  Guard() noexcept { ++tls_guard; }
  ~Guard() { --tls_guard; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
};

// ---- bootstrap buffer: serves dlsym's own allocations while the real functions are looked up

constexpr std::size_t kBootBytes = 256 << 10;
alignas(64) unsigned char boot_buf[kBootBytes];
std::atomic<std::size_t> boot_used{0};
AddressRange BootRange() noexcept {
  return AddressRange{reinterpret_cast<std::uintptr_t>(boot_buf), kBootBytes};
}

// Each block has a 16-byte header holding its size; memory is never reused (it is zero, as
// calloc needs).
void* BootAlloc(std::size_t n, std::size_t align) noexcept {
  if (align < 16) align = 16;
  for (;;) {
    std::size_t used = boot_used.load(std::memory_order_relaxed);
    std::size_t start = (used + 16 + align - 1) & ~(align - 1);
    if (start + n > kBootBytes || n > kBootBytes) return nullptr;
    if (boot_used.compare_exchange_weak(used, start + n, std::memory_order_relaxed)) {
      std::memcpy(boot_buf + start - 16, &n, sizeof(n));
      return boot_buf + start;
    }
  }
}
std::size_t BootSize(const void* p) noexcept {
  std::size_t n;
  std::memcpy(&n, static_cast<const unsigned char*>(p) - 16, sizeof(n));
  return n;
}

template <typename F>
void Lookup(F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(::dlsym(RTLD_NEXT, name));
}

void ResolveReal() noexcept {
  if (resolve_state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (!resolve_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    while (resolve_state.load(std::memory_order_acquire) != 2) {
    }
    return;
  }
  tls_resolving = true;
  Lookup(real.malloc, "malloc");
  Lookup(real.free, "free");
  Lookup(real.calloc, "calloc");
  Lookup(real.realloc, "realloc");
  Lookup(real.posix_memalign, "posix_memalign");
  Lookup(real.aligned_alloc, "aligned_alloc");
  Lookup(real.memalign, "memalign");
  Lookup(real.valloc, "valloc");
  Lookup(real.pvalloc, "pvalloc");
  Lookup(real.malloc_usable_size, "malloc_usable_size");
  Lookup(real.mmap, "mmap");
  Lookup(real.munmap, "munmap");
  Lookup(real.mremap, "mremap");
  Lookup(real.madvise, "madvise");
  tls_resolving = false;
  resolve_state.store(2, std::memory_order_release);
}

void* RealMmap(void* a, std::size_t n, int prot, int flags, int fd, off_t off) noexcept {
  if (real.mmap == nullptr) {
    return reinterpret_cast<void*>(::syscall(SYS_mmap, a, n, prot, flags, fd, off));
  }
  return real.mmap(a, n, prot, flags, fd, off);
}
int RealMunmap(void* a, std::size_t n) noexcept {
  if (real.munmap == nullptr) return static_cast<int>(::syscall(SYS_munmap, a, n));
  return real.munmap(a, n);
}

// ---- state ----------------------------------------------------------------------------------

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
};
Hot hot;

CxlHeap* heap = nullptr;  // set once at start-up, never freed (other threads may still use it)
Settings* settings = nullptr;
char state_reason[512] = "not started";

AddressRange CxlRange() noexcept {
  return AddressRange{hot.cxl_lo.load(std::memory_order_relaxed),
                      hot.cxl_bytes.load(std::memory_order_relaxed)};
}
bool Active() noexcept { return hot.active.load(std::memory_order_acquire); }

// ---- statistics -------------------------------------------------------------------------------

StatsRegistry registry;
constinit thread_local ThreadStats tls_stats CXLKV_IE{};
pthread_key_t stats_key;

// A thread's destructors may allocate after its statistics were retired: those counts go to
// one shared block (linked for the process's life; increments may race and be lost, never
// touch freed memory).
constinit thread_local bool tls_stats_retired CXLKV_IE = false;
ThreadStats late_stats{};

void RetireThreadStats(void* p) {
  registry.Retire(static_cast<ThreadStats*>(p));
  tls_stats_retired = true;
}

ThreadStats& MyStats() noexcept {
  if (!tls_stats.linked) [[unlikely]] {
    if (tls_stats_retired) return late_stats;
    registry.Link(&tls_stats);
    (void)pthread_setspecific(stats_key, &tls_stats);
  }
  return tls_stats;
}
void CountAlloc(AllocClass c, Route r, std::size_t n) noexcept {
  if (hot.stats_on.load(std::memory_order_relaxed)) MyStats().CountAlloc(c, r, n);
}
void CountFree(AllocClass c, Route r) noexcept {
  if (hot.stats_on.load(std::memory_order_relaxed)) MyStats().CountFree(c, r);
}

std::atomic<bool> once_full{false}, once_mmap_table{false}, once_cuda_table{false};

void Fallback(AllocClass c, std::size_t n) noexcept {
  registry.fallbacks.fetch_add(1, std::memory_order_relaxed);
  if (FirstTime(once_full)) {
    Guard g;
    Logf(LogLevel::kWarn,
         "%s: the CXL pool cannot serve a %s request of %zu bytes (full, or alignment beyond "
         "it); this and later such requests pass through to the process allocator",
         settings != nullptr ? settings->pool.c_str() : "?", AllocClassName(c), n);
  }
}

// ---- the malloc family ------------------------------------------------------------------------

bool InShim() noexcept { return tls_guard > 0; }

Route RouteFor(AllocClass c, std::size_t n) noexcept {
  return Decide(c, n, hot.min_bytes.load(std::memory_order_relaxed), Active(), InShim());
}

// ---- growth of a pooled heap -----------------------------------------------------------------
// A heap in a pooled domain (CXLKV_POOL=orchestrator:...) gets its extents from a thread of
// the shim's own, never from inside an allocation: the RPC allocates and starts threads, and
// the allocating thread may hold locks (jemalloc's, the loader's) that those need. An
// allocation the heap cannot serve asks that thread for one more extent and waits for it at
// most kGrowWait; after a failed growth, requests pass through for kGrowRetry.

constexpr auto kGrowWait = std::chrono::seconds(1);
constexpr std::int64_t kGrowRetryMs = 1000;
pthread_mutex_t grow_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t grow_cv;  // CLOCK_MONOTONIC, set up in StartGrower
std::uint64_t grow_requested = 0, grow_done = 0;  // grow_mu
std::int64_t grow_retry_at_ms = 0;                // grow_mu
DomainSource* domain_source = nullptr;            // the pooled heap's, or nullptr

std::int64_t MonotonicMs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

void LeaveDomainAtExit() {
  Guard g;
  if (domain_source != nullptr) domain_source->Leave();
}

void* GrowerThread(void*) {
  ++tls_guard;  // this thread's allocations (the RPC's) go to the process allocator
  bool joined = false, warned = false;
  for (;;) {
    pthread_mutex_lock(&grow_mu);
    while (grow_done == grow_requested) pthread_cond_wait(&grow_cv, &grow_mu);
    const std::uint64_t target = grow_requested;
    pthread_mutex_unlock(&grow_mu);
    const absl::Status st = heap->Grow();
    if (st.ok() && !joined) {
      joined = true;
      // After libcxlkv was loaded: runs before its static destructors (docs/preload.md).
      (void)std::atexit(&LeaveDomainAtExit);
    }
    if (st.ok()) {
      Logf(LogLevel::kInfo, "CXL heap grew: %s", heap->Describe().c_str());
    } else {
      Logf(warned ? LogLevel::kInfo : LogLevel::kWarn,
           "%s; CXL-eligible requests pass through to the process allocator until an extent "
           "is lent (retried in %lld ms)",
           std::string(st.message()).c_str(), static_cast<long long>(kGrowRetryMs));
      warned = true;
    }
    pthread_mutex_lock(&grow_mu);
    grow_done = target;
    grow_retry_at_ms = st.ok() ? 0 : MonotonicMs() + kGrowRetryMs;
    pthread_cond_broadcast(&grow_cv);
    pthread_mutex_unlock(&grow_mu);
  }
  return nullptr;
}

bool StartGrower() noexcept {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&grow_cv, &a);
  pthread_condattr_destroy(&a);
  // The domain is joined at the first allocation that wants CXL: processes of the tree that
  // never make one (launchers, shells, `timeout`) never join.
  pthread_t t;
  if (pthread_create(&t, nullptr, &GrowerThread, nullptr) != 0) return false;
  pthread_detach(t);
  return true;
}

// Asks the grower for one more extent than it has finished and waits for it (bounded).
// True when the heap may have room now.
bool WaitForGrowth() noexcept {
  pthread_mutex_lock(&grow_mu);
  const std::int64_t now = MonotonicMs();
  if (now < grow_retry_at_ms) {
    pthread_mutex_unlock(&grow_mu);
    return false;
  }
  const std::uint64_t want = grow_done + 1;
  if (grow_requested < want) {
    grow_requested = want;
    pthread_cond_broadcast(&grow_cv);
  }
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += std::chrono::duration_cast<std::chrono::seconds>(kGrowWait).count();
  while (grow_done < want) {
    if (pthread_cond_timedwait(&grow_cv, &grow_mu, &deadline) == ETIMEDOUT) break;
  }
  const bool grown = grow_done >= want && grow_retry_at_ms == 0;
  pthread_mutex_unlock(&grow_mu);
  return grown;
}

// heap->Alloc, growing a pooled heap when it is full. Under the guard.
void* HeapAlloc(std::size_t n, std::size_t align, bool zero) noexcept {
  void* p = heap->Alloc(n, align, zero);
  if (p == nullptr && heap->CanGrow() && WaitForGrowth()) p = heap->Alloc(n, align, zero);
  return p;
}

void* CxlAlloc(AllocClass c, std::size_t n, std::size_t align, bool zero) noexcept {
  void* p;
  {
    Guard g;
    p = HeapAlloc(n, align, zero);
  }
  if (p != nullptr) {
    CountAlloc(c, Route::kCxl, n);
  } else {
    Fallback(c, n);
  }
  return p;
}

void* PassMalloc(std::size_t n) noexcept {
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  return real.malloc(n);
}

__attribute__((noinline)) void* MallocSlow(std::size_t n) noexcept {
  if (tls_resolving) return BootAlloc(n, 16);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, 0, false)) return p;
  }
  return PassMalloc(n);
}

// Owner of p: the CXL range, the bootstrap buffer, a heap without a range, or the process.
Owner OwnerOfPtr(const void* p) noexcept {
  const Owner o = OwnerOf(p, BootRange(), CxlRange());
  if (o == Owner::kProcess && hot.slow_owner.load(std::memory_order_relaxed) && heap->Owns(p)) {
    return Owner::kCxl;
  }
  return o;
}

void FreeCxl(void* p) noexcept {
  CountFree(AllocClass::kMalloc, Route::kCxl);
  Guard g;
  heap->Free(p);
}

__attribute__((noinline)) void FreeSlow(void* p) noexcept {
  switch (OwnerOfPtr(p)) {
    case Owner::kNull:
    case Owner::kBootstrap:
      return;
    case Owner::kCxl:
      FreeCxl(p);
      return;
    case Owner::kProcess:
      break;
  }
  ResolveReal();
  CountFree(AllocClass::kMalloc, Route::kPass);
  real.free(p);
}

std::size_t UsableSize(void* p) noexcept {
  switch (OwnerOfPtr(p)) {
    case Owner::kNull:
      return 0;
    case Owner::kBootstrap:
      return BootSize(p);
    case Owner::kCxl: {
      Guard g;
      return heap->UsableSize(p);
    }
    case Owner::kProcess:
      break;
  }
  ResolveReal();
  return real.malloc_usable_size != nullptr ? real.malloc_usable_size(p) : 0;
}

void* AlignedAlloc(std::size_t align, std::size_t n) noexcept {
  // align is a power of two here.
  if (tls_resolving) return BootAlloc(n, align);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, align, false)) return p;
  }
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  void* p = nullptr;
  if (real.posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, n) != 0) {
    errno = ENOMEM;
    return nullptr;
  }
  return p;
}

void* Realloc(void* p, std::size_t n) noexcept {
  if (tls_resolving && p == nullptr) return BootAlloc(n, 16);
  ResolveReal();
  const Owner owner = OwnerOfPtr(p);
  switch (PlanRealloc(owner, n, RouteFor(AllocClass::kMalloc, n))) {
    case ReallocPlan::kMalloc:
      return ::malloc(n);
    case ReallocPlan::kFree:
      ::free(p);
      return nullptr;
    case ReallocPlan::kFromBootstrap: {
      void* q = ::malloc(n);
      if (q != nullptr) std::memcpy(q, p, std::min(n, BootSize(p)));
      return q;
    }
    case ReallocPlan::kResizePass:
      return real.realloc(p, n);
    case ReallocPlan::kResizeCxl: {
      void* q;
      {
        Guard g;
        q = heap->Realloc(p, n);
      }
      if (q != nullptr) return q;
      Fallback(AllocClass::kMalloc, n);
      // The pool cannot hold the larger block: move it to the process allocator.
      q = PassMalloc(n);
      if (q == nullptr) return nullptr;
      std::size_t old;
      {
        Guard g;
        old = heap->UsableSize(p);
      }
      std::memcpy(q, p, std::min(n, old));
      FreeCxl(p);
      registry.reallocs_to_pass.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
    case ReallocPlan::kCxlToPass: {
      void* q = PassMalloc(n);
      if (q == nullptr) return nullptr;
      std::size_t old;
      {
        Guard g;
        old = heap->UsableSize(p);
      }
      std::memcpy(q, p, std::min(n, old));
      FreeCxl(p);
      registry.reallocs_to_pass.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
    case ReallocPlan::kPassToCxl: {
      void* q = CxlAlloc(AllocClass::kMalloc, n, 0, false);
      if (q == nullptr) return real.realloc(p, n);
      const std::size_t old = real.malloc_usable_size != nullptr ? real.malloc_usable_size(p) : n;
      std::memcpy(q, p, std::min(n, old));
      CountFree(AllocClass::kMalloc, Route::kPass);
      real.free(p);
      registry.reallocs_to_cxl.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
  }
  return nullptr;
}

// ---- anonymous mmap ----------------------------------------------------------------------------

pthread_mutex_t mmap_mu = PTHREAD_MUTEX_INITIALIZER;
MappingTable<16384> mappings;

void* MmapCxl(std::size_t len) noexcept {
  const std::size_t bytes = (len + kPage - 1) & ~(kPage - 1);
  void* p;
  {
    Guard g;
    p = HeapAlloc(bytes, kPage, /*zero=*/true);
    if (p != nullptr) {
      pthread_mutex_lock(&mmap_mu);
      const bool ok = mappings.Insert(reinterpret_cast<std::uintptr_t>(p), bytes);
      pthread_mutex_unlock(&mmap_mu);
      if (!ok) {
        heap->Free(p);
        p = nullptr;
        if (FirstTime(once_mmap_table)) {
          Logf(LogLevel::kWarn, "more than 16384 CXL mmaps at once; further ones pass through");
        }
      }
    }
  }
  if (p != nullptr) {
    CountAlloc(AllocClass::kMmap, Route::kCxl, len);
  } else {
    Fallback(AllocClass::kMmap, len);
  }
  return p;
}

// Unmaps [a, a + len) where it overlaps CXL mappings; mmap_mu held.
void UnmapCxlLocked(std::uintptr_t a, std::size_t len) noexcept {
  // Each overlapping mapping once, in address order.
  for (std::uintptr_t cur = a; cur < a + len;) {
    Mapping* m = mappings.FirstOverlap(cur, a + len);
    if (m == nullptr) return;
    const std::uintptr_t m_end = m->base + m->bytes;
    const UnmapEffect e = ApplyUnmap(*m, a, len);
    if (e.release) {
      void* base = reinterpret_cast<void*>(m->base);
      // The program may have unmapped pieces, changed protections or advised the pages:
      // map the pool's pages back over the whole block before the heap reuses it.
      (void)heap->RestoreMapping(base, m->bytes);
      mappings.Erase(m);
      CountFree(AllocClass::kMmap, Route::kCxl);
      heap->Free(base);
    } else if (e.hole_hi > e.hole_lo) {
      // An inaccessible placeholder: the hole faults like unmapped memory, and nothing else
      // can be mapped into the heap's address range.
      (void)RealMmap(reinterpret_cast<void*>(e.hole_lo), e.hole_hi - e.hole_lo, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    cur = m_end;
  }
}

int Munmap(void* addr, std::size_t len) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const AddressRange r = CxlRange();
  if (r.bytes == 0 || a + len <= r.lo || a >= r.lo + r.bytes) return RealMunmap(addr, len);
  if (a % kPage != 0 || len == 0) {
    errno = EINVAL;
    return -1;
  }
  len = (len + kPage - 1) & ~(kPage - 1);
  // Parts outside the heap's range are the process's own mappings.
  if (a < r.lo) (void)RealMunmap(addr, r.lo - a);
  if (a + len > r.lo + r.bytes) {
    (void)RealMunmap(reinterpret_cast<void*>(r.lo + r.bytes), a + len - (r.lo + r.bytes));
  }
  Guard g;
  pthread_mutex_lock(&mmap_mu);
  UnmapCxlLocked(a, len);
  pthread_mutex_unlock(&mmap_mu);
  return 0;
}

// ---- CUDA host allocations ---------------------------------------------------------------------

using cudaError_t = int;
constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorInvalidValue = 1;
constexpr cudaError_t kCudaErrorInitialization = 3;
constexpr cudaError_t kCudaErrorNoDevice = 100;
constexpr unsigned kRegisterPortable = 1, kRegisterMapped = 2;

struct CudaFns {
  cudaError_t (*HostAlloc)(void**, std::size_t, unsigned);
  cudaError_t (*MallocHost)(void**, std::size_t);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*HostGetDevicePointer)(void**, void*, unsigned);
  cudaError_t (*HostRegister)(void*, std::size_t, unsigned);
  cudaError_t (*HostUnregister)(void*);
  cudaError_t (*GetDeviceCount)(int*);
  const char* (*GetErrorString)(cudaError_t);
};
CudaFns cuda{};
pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
bool cuda_can_register = false;
cudaError_t cuda_no_register_error = kCudaErrorNoDevice;
char cuda_reason[256] = "";

template <typename F>
void CudaLookup(void* handle, F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(handle != nullptr ? ::dlsym(handle, name) : ::dlsym(RTLD_NEXT, name));
}

void ResolveCuda() noexcept {
  Guard g;
  // The runtime the program already uses (the next definition after ours); when the program
  // reached us without one loaded, the runtime on the library path.
  void* handle = nullptr;
  if (::dlsym(RTLD_NEXT, "cudaHostRegister") == nullptr) {
    for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      handle = ::dlopen(so, RTLD_NOW | RTLD_NOLOAD);
      if (handle == nullptr) handle = ::dlopen(so, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
    }
  }
  CudaLookup(handle, cuda.HostAlloc, "cudaHostAlloc");
  CudaLookup(handle, cuda.MallocHost, "cudaMallocHost");
  CudaLookup(handle, cuda.FreeHost, "cudaFreeHost");
  CudaLookup(handle, cuda.HostGetDevicePointer, "cudaHostGetDevicePointer");
  CudaLookup(handle, cuda.HostRegister, "cudaHostRegister");
  CudaLookup(handle, cuda.HostUnregister, "cudaHostUnregister");
  CudaLookup(handle, cuda.GetDeviceCount, "cudaGetDeviceCount");
  CudaLookup(handle, cuda.GetErrorString, "cudaGetErrorString");
  if (cuda.HostRegister == nullptr || cuda.GetDeviceCount == nullptr) {
    std::snprintf(cuda_reason, sizeof(cuda_reason),
                  "no CUDA runtime (libcudart) in the process or on the library path");
    return;
  }
  int devices = 0;
  const cudaError_t err = cuda.GetDeviceCount(&devices);
  if (err != kCudaSuccess || devices == 0) {
    cuda_no_register_error = err != kCudaSuccess ? err : kCudaErrorNoDevice;
    std::snprintf(cuda_reason, sizeof(cuda_reason), "cudaGetDeviceCount: %s (error %d)",
                  cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "no device", err);
    return;
  }
  cuda_can_register = true;
  std::snprintf(cuda_reason, sizeof(cuda_reason), "%d CUDA device(s)", devices);
}

struct CudaBlock {
  std::uintptr_t addr;
  std::size_t bytes;
  bool registered;  // pinned: by the whole-heap registration, or by its own call
  bool own_registration;  // registered alone (the heap has no fixed range or refused)
};

// The whole heap is registered once, at the first cuda host allocation served from CXL, in
// chunks of at most 64 GiB (gpu::PlanChunks) — never per block: per-block registration pays
// the driver's pinning cost on every allocation and fragments the GPU's mappings. Not at
// start-up: the shim is loaded into every process of a serving stack (tokenizers, workers
// without a GPU), and registering would create a CUDA context in each of them.
enum class HeapPin : std::uint8_t { kNo, kYes, kFailed };
pthread_once_t heap_pin_once = PTHREAD_ONCE_INIT;
HeapPin heap_pin = HeapPin::kNo;

void PinHeap() noexcept {
  Guard g;
  const AddressRange r = heap->range();
  if (r.bytes == 0) {
    Logf(LogLevel::kInfo, "the CXL heap has no fixed range (%s); cuda host blocks are "
         "registered one by one", state_reason);
    heap_pin = HeapPin::kFailed;
    return;
  }
  auto plan = gpu::PlanChunks(r.bytes, kPage);
  if (!plan.ok()) {
    Logf(LogLevel::kWarn, "cannot plan the heap's registration: %s; cuda host blocks are "
         "registered one by one", std::string(plan.status().message()).c_str());
    heap_pin = HeapPin::kFailed;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t done = 0;
  for (; done < plan->size(); ++done) {
    const gpu::ChunkPlan& c = (*plan)[done];
    const cudaError_t err = cuda.HostRegister(reinterpret_cast<void*>(r.lo + c.offset), c.bytes,
                                              kRegisterPortable | kRegisterMapped);
    if (err != kCudaSuccess) {
      Logf(LogLevel::kWarn,
           "cudaHostRegister of heap chunk %zu (%llu bytes at offset %llu) failed: %s (error %d); "
           "cuda host blocks are registered one by one",
           done, static_cast<unsigned long long>(c.bytes), static_cast<unsigned long long>(c.offset),
           cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "?", err);
      for (std::size_t k = 0; k < done; ++k) {
        cuda.HostUnregister(reinterpret_cast<void*>(r.lo + (*plan)[k].offset));
      }
      heap_pin = HeapPin::kFailed;
      return;
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Logf(LogLevel::kInfo, "registered the CXL heap for CUDA: %llu bytes in %zu chunk(s), %.1f ms",
       static_cast<unsigned long long>(r.bytes), plan->size(), ms);
  heap_pin = HeapPin::kYes;
}
constexpr std::size_t kMaxCudaBlocks = 4096;
pthread_mutex_t cuda_mu = PTHREAD_MUTEX_INITIALIZER;
CudaBlock cuda_blocks[kMaxCudaBlocks];
std::size_t cuda_nblocks = 0;

// Finds the block containing p; cuda_mu held.
CudaBlock* FindCudaBlock(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t i = 0; i < cuda_nblocks; ++i) {
    if (a - cuda_blocks[i].addr < cuda_blocks[i].bytes) return &cuda_blocks[i];
  }
  return nullptr;
}

std::atomic<bool> once_cuda_skip{false}, once_cuda_reg_fail{false};

// Serves a cuda host allocation from CXL. Returns false to let the real runtime serve it.
bool CudaHostAllocCxl(void** out, std::size_t size) noexcept {
  if (RouteFor(AllocClass::kCuda, size) != Route::kCxl) return false;
  pthread_once(&cuda_once, &ResolveCuda);
  const std::size_t bytes = ((size == 0 ? 1 : size) + kPage - 1) & ~(kPage - 1);
  void* p = CxlAlloc(AllocClass::kCuda, bytes, kPage, false);
  if (p == nullptr) return false;
  bool registered = false, own = false;
  Guard g;
  if (cuda_can_register) pthread_once(&heap_pin_once, &PinHeap);
  if (cuda_can_register && heap_pin == HeapPin::kYes) {
    registered = true;
  } else if (cuda_can_register) {
    const cudaError_t err = cuda.HostRegister(p, bytes, kRegisterPortable | kRegisterMapped);
    if (err != kCudaSuccess) {
      if (FirstTime(once_cuda_reg_fail)) {
        Logf(LogLevel::kWarn,
             "cudaHostRegister of %zu CXL bytes failed: %s (error %d); cuda host allocations "
             "that cannot be registered are served by the CUDA runtime instead",
             bytes, cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "?", err);
      }
      heap->Free(p);
      registry.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    registered = own = true;
  } else if (FirstTime(once_cuda_skip)) {
    Logf(LogLevel::kWarn,
         "cuda host allocations are served from CXL without registration (not pinned): %s",
         cuda_reason);
  }
  pthread_mutex_lock(&cuda_mu);
  const bool room = cuda_nblocks < kMaxCudaBlocks;
  if (room)
    cuda_blocks[cuda_nblocks++] =
        CudaBlock{reinterpret_cast<std::uintptr_t>(p), bytes, registered, own};
  pthread_mutex_unlock(&cuda_mu);
  if (!room) {
    if (own) cuda.HostUnregister(p);
    heap->Free(p);
    if (FirstTime(once_cuda_table)) {
      Logf(LogLevel::kWarn,
           "more than %zu CXL cuda host blocks at once; further ones are served "
           "by the CUDA runtime",
           kMaxCudaBlocks);
    }
    return false;
  }
  (registered ? registry.cuda_registered : registry.cuda_unregistered)
      .fetch_add(1, std::memory_order_relaxed);
  Logf(LogLevel::kDebug, "cuda host block %p (%zu bytes) in CXL, %s", p, bytes,
       registered ? "registered" : "not registered");
  *out = p;
  return true;
}

// ---- start-up, fork, exit
// ------------------------------------------------------------------------

// Registered before the heap exists (see Start), so each checks for it.
void PrepareFork() {
  ++tls_guard;
  pthread_mutex_lock(&cuda_mu);
  pthread_mutex_lock(&mmap_mu);
  if (heap != nullptr) heap->PrepareFork();
}
void ParentAfterFork() {
  if (heap != nullptr) heap->ParentAfterFork();
  pthread_mutex_unlock(&mmap_mu);
  pthread_mutex_unlock(&cuda_mu);
  --tls_guard;
}
void ChildAfterFork() {
  if (heap != nullptr) heap->ChildAfterFork();
  pthread_mutex_unlock(&mmap_mu);
  pthread_mutex_unlock(&cuda_mu);
  registry.AfterForkChild();
  tls_stats.Reset();  // counts start over in the child (linked again on first use)
  late_stats.Reset();
  if (hot.stats_on.load(std::memory_order_relaxed)) registry.Link(&late_stats);
  --tls_guard;
}

// The fast paths, once start-up has decided (min_bytes and the heap are set).
void EnableFastPaths() noexcept {
  const bool stats = hot.stats_on.load(std::memory_order_relaxed);
  hot.fast_min_bytes.store(stats ? 0 : hot.min_bytes.load(std::memory_order_relaxed),
                           std::memory_order_release);
  hot.free_fast.store(!stats && !hot.slow_owner.load(std::memory_order_relaxed),
                      std::memory_order_release);
}

void SetPassThrough(const char* why) noexcept {
  std::snprintf(state_reason, sizeof(state_reason), "%s", why);
  hot.mmap_min_bytes.store(kNever, std::memory_order_relaxed);
  hot.min_bytes.store(kNever, std::memory_order_release);
  EnableFastPaths();
}

__attribute__((constructor)) void Start() {
  ResolveReal();
  Guard g;
  std::vector<std::string> errors;
  settings = new Settings(LoadSettings(environ, &errors));
  int log_fd = 2;
  if (!settings->log_path.empty()) {
    const std::string path = ExpandPid(settings->log_path, static_cast<int>(::getpid()));
    log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      errors.push_back("CXLKV_LOG: cannot open " + path + ": " + std::strerror(errno) +
                       "; logging to stderr");
      log_fd = 2;
    }
  }
  LogSetup(settings->log_level, log_fd);
  for (const std::string& e : errors) {  // configuration errors: always, once, on stderr
    char line[1024];
    const int n = std::snprintf(line, sizeof(line), "cxlkv-preload[%d] error: %s\n",
                                static_cast<int>(::getpid()), e.c_str());
    if (n > 0)
      (void)!::write(2, line, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof(line) - 1));
  }
  if (!settings->stats_path.empty()) {
    if (pthread_key_create(&stats_key, &RetireThreadStats) == 0) {
      registry.Link(&late_stats);
      hot.stats_on.store(true, std::memory_order_relaxed);
    }
  }
  if (settings->pool.empty()) {
    SetPassThrough(errors.empty() ? "CXLKV_POOL is not set"
                                  : "configuration errors (reported on stderr at start-up)");
    Logf(LogLevel::kInfo, "pass-through: %s", state_reason);
    return;
  }
  // Registered before the heap's first jemalloc call, so jemalloc's own fork handlers
  // (registered when it initializes) lock its arenas before PrepareFork copies the heap.
  static bool atfork = pthread_atfork(&PrepareFork, &ParentAfterFork, &ChildAfterFork) == 0;
  absl::StatusOr<std::unique_ptr<CxlHeap>> opened = absl::UnknownError("");
  const bool pooled = absl::StartsWith(settings->pool, kOrchestratorPrefix);
  DomainSource* source = nullptr;
  if (pooled) {
    auto loaded = DomainSource::Load(settings->library,
                                     settings->pool.substr(kOrchestratorPrefix.size()),
                                     settings->host_id);
    if (loaded.ok()) {
      source = loaded->get();
      opened = CxlHeap::OpenPooled(*std::move(loaded), kPooledReserveBytes);
    } else {
      opened = loaded.status();
    }
  } else {
    auto spec = pool::ParseSourceSpec(settings->pool);
    opened = spec.ok() ? CxlHeap::Open(*spec) : absl::StatusOr<std::unique_ptr<CxlHeap>>(spec.status());
  }
  if (opened.ok() && pooled) {
    heap = opened->get();  // the grower thread uses it from its first instruction
    domain_source = source;
    if (!StartGrower()) opened = absl::InternalError("cannot start the heap's grower thread");
  }
  if (!opened.ok() || !atfork) {
    heap = nullptr;
    domain_source = nullptr;
    const std::string why = !opened.ok() ? std::string(opened.status().message())
                                         : std::string("pthread_atfork failed");
    Logf(LogLevel::kError, "%s; every allocation passes through to the process allocator",
         why.c_str());
    SetPassThrough(why.c_str());
    return;
  }
  heap = opened->release();
  const AddressRange r = heap->range();
  hot.cxl_lo.store(r.lo, std::memory_order_relaxed);
  hot.cxl_bytes.store(r.bytes, std::memory_order_relaxed);
  hot.slow_owner.store(r.bytes == 0, std::memory_order_relaxed);
  hot.mmap_min_bytes.store(r.bytes != 0 ? std::max<std::uint64_t>(settings->min_bytes, 1) : kNever,
                           std::memory_order_relaxed);
  const std::string what = heap->Describe();
  std::snprintf(state_reason, sizeof(state_reason), "%s", what.c_str());
  hot.active.store(true, std::memory_order_release);
  hot.min_bytes.store(settings->min_bytes, std::memory_order_release);
  EnableFastPaths();
  Logf(LogLevel::kInfo, "CXL heap: %s; min_bytes %llu", state_reason,
       static_cast<unsigned long long>(settings->min_bytes));
}

__attribute__((destructor)) void Stop() {
  if (settings == nullptr || settings->stats_path.empty()) return;
  Guard g;
  StatsContext ctx;
  ctx.pid = static_cast<int>(::getpid());
  ctx.pool = settings->pool;
  ctx.state = Active() ? "cxl" : "pass-through";
  ctx.reason = heap != nullptr ? heap->Describe() : std::string(state_reason);
  ctx.min_bytes = settings->min_bytes;
  ctx.heap_bytes = heap != nullptr ? heap->held_bytes() : 0;
  const std::string json = RenderStatsJson(registry.Snapshot(), ctx);
  const std::string path = ExpandPid(settings->stats_path, ctx.pid);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    Logf(LogLevel::kError, "CXLKV_STATS: cannot write %s: %s", path.c_str(), std::strerror(errno));
    return;
  }
  (void)!::write(fd, json.data(), json.size());
  ::close(fd);
}

}  // namespace
}  // namespace cxlkv::preload

// ---- exported symbols
// ------------------------------------------------------------------------------

using namespace cxlkv::preload;  // NOLINT: the entry points below are the C ABI

CXLKV_EXPORT void* malloc(std::size_t n) noexcept {
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed)) [[likely]]
    return real.malloc(n);
  return MallocSlow(n);
}

CXLKV_EXPORT void free(void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a - hot.cxl_lo.load(std::memory_order_relaxed) <
      hot.cxl_bytes.load(std::memory_order_relaxed)) [[unlikely]] {
    FreeCxl(p);
    return;
  }
  if (hot.free_fast.load(std::memory_order_relaxed) && !BootRange().Contains(p)) [[likely]] {
    real.free(p);  // free(NULL) included: the process allocator ignores it
    return;
  }
  FreeSlow(p);
}

CXLKV_EXPORT void* calloc(std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed)) [[likely]] {
    return real.calloc(count, size);
  }
  if (tls_resolving) return BootAlloc(n, 16);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, 0, true)) return p;
  }
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  return real.calloc(count, size);
}

CXLKV_EXPORT void* realloc(void* p, std::size_t n) noexcept {
  // Fast path: a process-owned (or NULL) block that stays below the threshold.
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed) &&
      a - hot.cxl_lo.load(std::memory_order_relaxed) >=
          hot.cxl_bytes.load(std::memory_order_relaxed) &&
      hot.free_fast.load(std::memory_order_relaxed) && !BootRange().Contains(p)) [[likely]] {
    return real.realloc(p, n);
  }
  return Realloc(p, n);
}

CXLKV_EXPORT void* reallocarray(void* p, std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  return Realloc(p, n);
}

CXLKV_EXPORT int posix_memalign(void** out, std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0 || align % sizeof(void*) != 0) return EINVAL;
  const int saved = errno;
  void* p = AlignedAlloc(align, n);
  errno = saved;
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

CXLKV_EXPORT void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return AlignedAlloc(align, n);
}

CXLKV_EXPORT void* memalign(std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {  // glibc rounds up to a power of two
    std::size_t a = 1;
    while (a < align && a != 0) a <<= 1;
    if (a == 0) {
      errno = EINVAL;
      return nullptr;
    }
    align = a;
  }
  return AlignedAlloc(align, n);
}

CXLKV_EXPORT void* valloc(std::size_t n) noexcept { return AlignedAlloc(kPage, n); }

CXLKV_EXPORT void* pvalloc(std::size_t n) noexcept {
  std::size_t rounded;
  if (__builtin_add_overflow(n, kPage - 1, &rounded)) {
    errno = ENOMEM;
    return nullptr;
  }
  return AlignedAlloc(kPage, (rounded & ~(kPage - 1)) == 0 ? kPage : rounded & ~(kPage - 1));
}

CXLKV_EXPORT std::size_t malloc_usable_size(void* p) noexcept { return UsableSize(p); }

CXLKV_EXPORT void* mmap(void* addr, std::size_t len, int prot, int flags, int fd,
                        off_t off) noexcept {
  if (len >= hot.mmap_min_bytes.load(std::memory_order_relaxed) && !InShim() &&
      MmapEligible(addr, prot, flags, fd, off) && Active()) {
    if (void* p = MmapCxl(len)) return p;
  }
  if (len != 0 && !InShim() && Active() && MmapEligible(addr, prot, flags, fd, off)) {
    CountAlloc(AllocClass::kMmap, Route::kPass, len);
  }
  return RealMmap(addr, len, prot, flags, fd, off);
}

CXLKV_EXPORT void* mmap64(void* addr, std::size_t len, int prot, int flags, int fd,
                          off_t off) noexcept {
  return mmap(addr, len, prot, flags, fd, off);
}

CXLKV_EXPORT int munmap(void* addr, std::size_t len) noexcept { return Munmap(addr, len); }

CXLKV_EXPORT void* mremap(void* old, std::size_t old_len, std::size_t new_len, int flags,
                          ...) noexcept {
  void* new_addr = nullptr;
  if ((flags & MREMAP_FIXED) != 0) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (!CxlRange().Contains(old)) {
    ResolveReal();
    if (real.mremap == nullptr) {
      return reinterpret_cast<void*>(::syscall(SYS_mremap, old, old_len, new_len, flags, new_addr));
    }
    return real.mremap(old, old_len, new_len, flags, new_addr);
  }
  // A block of the CXL heap (an mmap the shim served): emulate the resize.
  const auto a = reinterpret_cast<std::uintptr_t>(old);
  if (a % kPage != 0 || new_len == 0 || (flags & MREMAP_DONTUNMAP) != 0) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  old_len = (old_len + kPage - 1) & ~(kPage - 1);
  new_len = (new_len + kPage - 1) & ~(kPage - 1);
  if (new_len <= old_len && (flags & MREMAP_FIXED) == 0) {
    if (new_len < old_len) (void)Munmap(reinterpret_cast<void*>(a + new_len), old_len - new_len);
    return old;
  }
  if ((flags & MREMAP_MAYMOVE) == 0) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  void* q = (flags & MREMAP_FIXED) != 0 ? RealMmap(new_addr, new_len, PROT_READ | PROT_WRITE,
                                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                                        : ::mmap(nullptr, new_len, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q == MAP_FAILED) return MAP_FAILED;
  std::memcpy(q, old, std::min(old_len, new_len));
  (void)Munmap(old, old_len);
  return q;
}

CXLKV_EXPORT int madvise(void* addr, std::size_t len, int advice) noexcept {
  if (CxlRange().Contains(addr) && (advice == MADV_DONTNEED || advice == MADV_FREE)) {
    // Private anonymous semantics on shared pool pages: DONTNEED reads back zeros, FREE may
    // keep or drop the contents (keeping them is allowed). Nothing is given back to the pool.
    if (advice == MADV_DONTNEED) std::memset(addr, 0, len);
    return 0;
  }
  ResolveReal();
  if (real.madvise == nullptr) return static_cast<int>(::syscall(SYS_madvise, addr, len, advice));
  return real.madvise(addr, len, advice);
}

CXLKV_EXPORT int cudaHostAlloc(void** ptr, std::size_t size, unsigned flags) {
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  ResolveReal();
  if (CudaHostAllocCxl(ptr, size)) return kCudaSuccess;
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.HostAlloc == nullptr) return kCudaErrorInitialization;
  const cudaError_t err = cuda.HostAlloc(ptr, size, flags);
  if (err == kCudaSuccess) CountAlloc(AllocClass::kCuda, Route::kPass, size);
  return err;
}

CXLKV_EXPORT int cudaMallocHost(void** ptr, std::size_t size) {
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  ResolveReal();
  if (CudaHostAllocCxl(ptr, size)) return kCudaSuccess;
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.MallocHost == nullptr) return kCudaErrorInitialization;
  const cudaError_t err = cuda.MallocHost(ptr, size);
  if (err == kCudaSuccess) CountAlloc(AllocClass::kCuda, Route::kPass, size);
  return err;
}

CXLKV_EXPORT int cudaFreeHost(void* p) {
  if (p != nullptr && OwnerOfPtr(p) == Owner::kCxl) {
    pthread_mutex_lock(&cuda_mu);
    CudaBlock* b = FindCudaBlock(p);
    CudaBlock found{};
    const bool ok = b != nullptr && b->addr == reinterpret_cast<std::uintptr_t>(p);
    if (ok) {
      found = *b;
      *b = cuda_blocks[--cuda_nblocks];
    }
    pthread_mutex_unlock(&cuda_mu);
    if (!ok) return kCudaErrorInvalidValue;  // not a cuda host block (malloc'ed, or interior)
    Guard g;
    if (found.own_registration) cuda.HostUnregister(p);
    CountFree(AllocClass::kCuda, Route::kCxl);
    heap->Free(p);
    return kCudaSuccess;
  }
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.FreeHost == nullptr) return kCudaErrorInitialization;
  if (p != nullptr) CountFree(AllocClass::kCuda, Route::kPass);
  return cuda.FreeHost(p);
}

CXLKV_EXPORT int cudaHostGetDevicePointer(void** dev, void* host, unsigned flags) {
  pthread_once(&cuda_once, &ResolveCuda);
  if (host != nullptr && OwnerOfPtr(host) == Owner::kCxl) {
    pthread_mutex_lock(&cuda_mu);
    const CudaBlock* b = FindCudaBlock(host);
    const bool known = b != nullptr, registered = known && b->registered;
    pthread_mutex_unlock(&cuda_mu);
    if (!known) return kCudaErrorInvalidValue;
    if (!registered) return cuda_no_register_error;
  }
  if (cuda.HostGetDevicePointer == nullptr) return kCudaErrorInitialization;
  return cuda.HostGetDevicePointer(dev, host, flags);
}
