// Allocation from the CXL heap, and the growth of a pooled heap.
//
// A heap in a pooled domain (CXLKV_POOL=orchestrator:...) gets its extents from a thread of
// the shim's own, never from inside an allocation: the RPC allocates and starts threads, and
// the allocating thread may hold locks (jemalloc's, the loader's) that those need. An
// allocation the heap cannot serve asks that thread for one more extent and waits for it at
// most kGrowWait; after a failed growth, requests pass through for kGrowRetryMs.
//
// Instrumented in sanitizer builds: everything here runs after start-up (a request reaches
// the heap only once it is active, a pointer only once the heap's range is published).
#include <pthread.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "domain_source.h"
#include "log.h"
#include "shim_internal.h"

namespace cxlkv::preload::shim {

DomainSource* domain_source = nullptr;  // the pooled heap's, or nullptr

namespace {

constexpr auto kGrowWait = std::chrono::seconds(1);
constexpr std::int64_t kGrowRetryMs = 1000;
pthread_mutex_t grow_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t grow_cv;                           // CLOCK_MONOTONIC, set up in StartGrower
std::uint64_t grow_requested = 0, grow_done = 0;  // grow_mu
std::int64_t grow_retry_at_ms = 0;                // grow_mu

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

}  // namespace

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

void FreeCxl(void* p) noexcept {
  CountFree(AllocClass::kMalloc, Route::kCxl);
  Guard g;
  heap->Free(p);
}

}  // namespace cxlkv::preload::shim
