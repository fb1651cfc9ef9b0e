// Start-up (the shim's constructor: settings, logging, the heap, the fast paths), the fork
// handlers, and the exit statistics (the destructor).
//
// Instrumented in sanitizer builds: the constructor runs after the sanitizer runtime's
// initializer (the runtime is a dependency of the shim, so the loader initializes it first),
// and the fork handlers and the destructor later still. Start calls ResolveReal first, as
// every entry point does.
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/pool/spec.h"
#include "cxlkv/preload/shm_backing.h"
#include "domain_source.h"
#include "log.h"
#include "shim_internal.h"

extern char** environ;

namespace cxlkv::preload::shim {
namespace {

// Registered before the heap exists (see Start), so each checks for it.
void PrepareFork() {
  ++tls_guard;
  pthread_mutex_lock(&cuda_mu);
  pthread_mutex_lock(&mmap_mu);
  if (shm != nullptr) shm->LockForFork();
  if (heap != nullptr) heap->PrepareFork();
}
void ParentAfterFork() {
  if (heap != nullptr) heap->ParentAfterFork();
  if (shm != nullptr) shm->UnlockAfterFork();
  pthread_mutex_unlock(&mmap_mu);
  pthread_mutex_unlock(&cuda_mu);
  --tls_guard;
}
void ChildAfterFork() {
  if (heap != nullptr) heap->ChildAfterFork();
  if (shm != nullptr) shm->UnlockAfterFork();
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
      errors.push_back("CXLKV_LOG: cannot open " + path + ": " + base::ErrnoText(errno) +
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
  register_chunk_bytes.store(settings->register_chunk_bytes, std::memory_order_relaxed);
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
  // Shared-memory files (CXLKV_SHM) do not need the heap: a kmem node binds them even where
  // memkind finds no dax-kmem node, and a devdax/file pool opens its arena at the first one.
  if (!settings->shm_glob.empty() && atfork) {
    auto spec = pool::ParseSourceSpec(settings->pool);
    auto backing = spec.ok() ? ShmBacking::Create(*spec, settings->shm_glob)
                             : absl::StatusOr<std::unique_ptr<ShmBacking>>(spec.status());
    if (backing.ok()) {
      shm = backing->release();
      hot.shm_on.store(true, std::memory_order_release);
      Logf(LogLevel::kInfo, "%s", shm->Describe().c_str());
    } else {
      Logf(LogLevel::kError, "CXLKV_SHM=%s: %s; shared-memory files are mapped as they are",
           settings->shm_glob.c_str(), std::string(backing.status().message()).c_str());
    }
  }
  absl::StatusOr<std::unique_ptr<CxlHeap>> opened = absl::UnknownError("");
  const bool pooled = absl::StartsWith(settings->pool, kOrchestratorPrefix);
  DomainSource* source = nullptr;
  if (pooled) {
    auto loaded = DomainSource::Load(
        settings->library, settings->pool.substr(kOrchestratorPrefix.size()), settings->host_id);
    if (loaded.ok()) {
      source = loaded->get();
      opened = CxlHeap::OpenPooled(*std::move(loaded), kPooledReserveBytes);
    } else {
      opened = loaded.status();
    }
  } else {
    auto spec = pool::ParseSourceSpec(settings->pool);
    opened =
        spec.ok() ? CxlHeap::Open(*spec) : absl::StatusOr<std::unique_ptr<CxlHeap>>(spec.status());
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
    Logf(LogLevel::kError, "CXLKV_STATS: cannot write %s: %s", path.c_str(),
         base::ErrnoText(errno).c_str());
    return;
  }
  (void)!::write(fd, json.data(), json.size());
  ::close(fd);
}

}  // namespace
}  // namespace cxlkv::preload::shim
