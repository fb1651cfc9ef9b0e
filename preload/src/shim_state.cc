// The shim's state: what every call reads (Hot), the heap and settings start-up sets, the
// thread guard, and the statistics (CXLKV_STATS).
//
// Instrumented in sanitizer builds: the variables here are read before start-up by the
// uninstrumented entry points (plain loads, no code of this file runs), and the functions
// run only after start-up (statistics are off and nothing is routed to CXL before it).
#include <pthread.h>

#include <atomic>

#include "log.h"
#include "shim_internal.h"

namespace cxlkv::preload::shim {

constinit thread_local int tls_guard CXLKV_IE = 0;
constinit Hot hot;
CxlHeap* heap = nullptr;
Settings* settings = nullptr;
char state_reason[512] = "not started";

constinit StatsRegistry registry;
constinit thread_local ThreadStats tls_stats CXLKV_IE{};
pthread_key_t stats_key;

// A thread's destructors may allocate after its statistics were retired: those counts go to
// one shared block (linked for the process's life; increments may race and be lost, never
// touch freed memory).
constinit ThreadStats late_stats{};

namespace {
constinit thread_local bool tls_stats_retired CXLKV_IE = false;
std::atomic<bool> once_full{false};
}  // namespace

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

}  // namespace cxlkv::preload::shim
