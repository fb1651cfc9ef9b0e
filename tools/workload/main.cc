// cxlkv-workload: the quickstart's main job. Formats (or opens) a KV arena on a pool and
// drives it from several processes at once the way a serving engine's KV cache does:
// requests arrive with a prompt length, take ceil(tokens / tokens_per_block) blocks in one
// bulk allocation, keep them while "decoding", and free them when done; when the pool is
// full the oldest requests are evicted. Every block carries its owner's tag, checked before
// the block is freed, so a block handed to two processes at once is caught.
// Prints a summary: blocks, bytes, alloc/free rate, arena utilization, fragmentation.
// A pool file it creates (a file: spec with ?size= naming no file yet) is removed when it ends,
// fails or is interrupted (SIGINT, SIGTERM, SIGHUP), unless --keep-pool; one that was there is
// left as it is. After a kill -9 the file stays: the line printed when it was created names it.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "cleanup_on_signal.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/spec.h"
#include "nlohmann/json.hpp"

namespace {

using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string pool = "file:/dev/shm/cxlkv-quickstart?size=2G";
  std::string layout = "llama3-70b";
  int procs = 2;
  double seconds = 5;
  bool format = false;
  bool force = false;
  bool keep_pool = false;
  std::uint64_t seed = 1;
  std::uint32_t fill_bytes = 4096;
  bool json = false;
  int concurrency = 0;  // 0: fill about 90% of this process's share of the pool
};

// What one process reports to the parent through a pipe.
struct WorkerReport {
  std::uint64_t requests = 0;
  std::uint64_t evictions = 0;
  std::uint64_t blocks_allocated = 0;
  std::uint64_t blocks_freed = 0;
  std::uint64_t alloc_ns = 0;
  std::uint64_t free_ns = 0;
  std::uint64_t tokens = 0;
  std::uint64_t token_slots = 0;  // blocks × tokens_per_block
  std::uint64_t tag_errors = 0;
  std::uint64_t failed_allocs = 0;
  std::uint64_t peak_blocks = 0;
  std::uint64_t bytes_written = 0;
  double elapsed_s = 0;
};

struct Request {
  std::vector<BlockHandle> blocks;
};

std::uint64_t Ns(Clock::time_point a, Clock::time_point b) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

WorkerReport RunWorker(BlockAllocator& a, const Options& o, int id) {
  WorkerReport r;
  std::mt19937_64 rng(o.seed * 7919 + static_cast<std::uint64_t>(id));
  // Prompt lengths: a long shared-system-prompt + RAG mix, 256 .. 16K tokens (log-uniform).
  std::uniform_real_distribution<double> log_tokens(std::log(256.0), std::log(16384.0));
  std::uniform_int_distribution<int> decode_us(1000, 20000);
  const std::uint32_t tpb = a.arena().layout().tokens_per_block;
  const std::uint64_t tag = 0xC0FFEE0000000000ull | static_cast<std::uint64_t>(::getpid());
  std::vector<unsigned char> payload(std::max<std::uint32_t>(o.fill_bytes, 8));
  std::memcpy(payload.data(), &tag, sizeof(tag));
  const std::uint32_t share_blocks =
      std::max<std::uint32_t>(1, a.arena().class_record(0).block_count / o.procs);
  const std::uint32_t max_tokens = std::max<std::uint32_t>(1, share_blocks / 4) * tpb;
  log_tokens = std::uniform_real_distribution<double>(std::log(std::min(256.0, max_tokens / 2.0)),
                                                      std::log(static_cast<double>(max_tokens)));
  // Mean of a log-uniform length on [lo, hi] is (hi - lo) / ln(hi / lo).
  const double lo = std::exp(log_tokens.a()), hi = std::exp(log_tokens.b());
  const double mean_blocks = (hi - lo) / std::log(hi / lo) / tpb + 0.5;
  const int concurrency = o.concurrency > 0
                              ? o.concurrency
                              : std::max(1, static_cast<int>(0.9 * share_blocks / mean_blocks));
  // Requests in flight, by completion time: at most `concurrency` (the engine's batch).
  std::multimap<Clock::time_point, Request> live;
  std::uint64_t held = 0;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  auto release = [&](Request& q) {
    for (const BlockHandle& h : q.blocks) {
      std::uint64_t seen;
      std::memcpy(&seen, a.Addr(h), sizeof(seen));
      r.tag_errors += seen != tag;
    }
    const auto t0 = Clock::now();
    r.blocks_freed += a.FreeBulk(q.blocks.data(), q.blocks.size());
    r.free_ns += Ns(t0, Clock::now());
    held -= q.blocks.size();
  };
  auto finish_first = [&] {
    release(live.begin()->second);
    live.erase(live.begin());
  };
  for (auto now = start; now < deadline; now = Clock::now()) {
    while (!live.empty() && live.begin()->first <= now) finish_first();
    if (live.size() >= static_cast<std::size_t>(concurrency)) {
      std::this_thread::sleep_until(std::min(live.begin()->first, deadline));
      continue;
    }
    // A request never needs more than its share of the pool (the engine would split it).
    const auto tokens =
        std::min<std::uint32_t>(static_cast<std::uint32_t>(std::exp(log_tokens(rng))), max_tokens);
    const std::uint32_t n = (tokens + tpb - 1) / tpb;
    Request q;
    q.blocks.resize(n);
    bool ok = false;
    for (;;) {
      const auto t0 = Clock::now();
      ok = a.AllocBulk(0, n, q.blocks.data());
      r.alloc_ns += Ns(t0, Clock::now());
      if (ok) break;
      ++r.failed_allocs;
      if (live.empty()) {  // the other processes hold the pool: wait for them to free
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (Clock::now() >= deadline) break;
        continue;
      }
      finish_first();  // preempt: evict the request closest to completion, as vLLM would
      ++r.evictions;
    }
    if (!ok) break;
    for (const BlockHandle& h : q.blocks) {
      cxlkv::coherence::CopyNt(a.Addr(h), payload.data(), payload.size());
    }
    r.bytes_written += std::uint64_t{n} * payload.size();
    r.blocks_allocated += n;
    r.tokens += tokens;
    r.token_slots += std::uint64_t{n} * tpb;
    ++r.requests;
    held += n;
    r.peak_blocks = std::max(r.peak_blocks, held);
    live.emplace(Clock::now() + std::chrono::microseconds(decode_us(rng)), std::move(q));
  }
  for (auto& [done, q] : live) release(q);
  r.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "cxlkv-workload: %s\n", std::string(st.message()).c_str());
  return 1;
}

// The pool file this run creates, removed when main returns (declared before the region, so
// after it is unmapped) and, through CleanupOnSignal, on an interruption.
class CreatedPool {
 public:
  CreatedPool() = default;
  CreatedPool(const CreatedPool&) = delete;
  CreatedPool& operator=(const CreatedPool&) = delete;
  ~CreatedPool() {
    if (path_.empty()) return;
    ::unlink(path_.c_str());
    cxlkv::tools::CleanupOnSignal::RemoveOnSignal("");
  }
  // Takes `spec`'s file when opening it will create it (a file: spec with a size, no file).
  void TakeIfNew(const cxlkv::pool::SourceSpec& spec) {
    struct stat st {};
    if (spec.kind != cxlkv::pool::SourceKind::kFile || spec.size_bytes == 0 ||
        ::stat(spec.path.c_str(), &st) == 0 || errno != ENOENT) {
      return;
    }
    if (cxlkv::tools::CleanupOnSignal::RemoveOnSignal(spec.path)) path_ = spec.path;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

// An exception escaping main (CLI11, the standard library: a bug or memory exhaustion) ends the
// program through std::terminate, which names it: the wanted end, so nothing catches it here.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Drive a KV arena from several processes like a serving engine's KV cache"};
  app.add_option("--pool", o.pool, "source spec of the pool")->capture_default_str();
  app.add_option("--layout", o.layout, "KV layout preset or L=,H=,D=,B=,T=")->capture_default_str();
  app.add_option("--procs", o.procs, "worker processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--seconds", o.seconds, "run time")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--format", o.format, "format a new arena on the pool first");
  app.add_flag("--force", o.force, "with --format: overwrite an existing arena (never one in use)");
  app.add_flag("--keep-pool", o.keep_pool,
               "keep a pool file this run creates (by default removed when it ends)");
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--fill-bytes", o.fill_bytes, "bytes written into each block (streaming stores)")
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency,
                 "requests in flight per process (0: sized to fill ~90% of the pool)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_flag("--json", o.json, "print the summary as JSON");
  CLI11_PARSE(app, argc, argv);

  auto layout = cxlkv::pool::ParseKvLayout(o.layout);
  if (!layout.ok()) return Fail(layout.status());
  auto spec = cxlkv::pool::ParseSourceSpec(o.pool);
  if (!spec.ok()) return Fail(spec.status());
  cxlkv::tools::CleanupOnSignal::Install();
  CreatedPool created;
  if (!o.keep_pool) created.TakeIfNew(*spec);
  if (!created.path().empty()) {
    std::printf(
        "cxlkv-workload: creates %s, removed when it ends (--keep-pool keeps it; after a "
        "kill -9: rm -f %s)\n",
        created.path().c_str(), created.path().c_str());
    std::fflush(stdout);
  }
  auto region = cxlkv::pool::OpenRegion(*spec);
  if (!region.ok()) return Fail(region.status());
  absl::StatusOr<std::unique_ptr<cxlkv::pool::Arena>> arena;
  if (o.format) {
    cxlkv::pool::FormatOptions fo;
    fo.layout = *layout;
    fo.force = o.force;
    arena = cxlkv::pool::Arena::Format(std::move(*region), fo);
  } else {
    arena = cxlkv::pool::Arena::Open(std::move(*region), cxlkv::pool::OpenOptions{*layout});
  }
  if (!arena.ok()) return Fail(arena.status());
  auto alloc = BlockAllocator::Create(std::move(*arena));
  if (!alloc.ok()) return Fail(alloc.status());
  BlockAllocator& a = **alloc;
  const cxlkv::pool::ClassRecord& cls = a.arena().class_record(0);
  if (o.fill_bytes > cls.block_bytes) o.fill_bytes = static_cast<std::uint32_t>(cls.block_bytes);

  // Workers are forked children: each attaches to the arena as its own owner.
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int p = 0; p < o.procs; ++p) {
    int fd[2];
    if (::pipe(fd) != 0) return Fail(absl::InternalError("pipe failed"));
    // Dies with this process, and is killed when it is interrupted.
    const pid_t pid = cxlkv::tools::CleanupOnSignal::Fork();
    if (pid < 0) return Fail(absl::InternalError("fork failed"));
    if (pid == 0) {
      ::close(fd[0]);
      const WorkerReport rep = RunWorker(a, o, p);
      const bool sent = ::write(fd[1], &rep, sizeof(rep)) == sizeof(rep);
      alloc->reset();  // detach: whatever this worker still owns goes back to the pool
      ::_exit(sent ? 0 : 1);
    }
    ::close(fd[1]);
    pids.push_back(pid);
    fds.push_back(fd[0]);
  }
  // Sample the arena while they run: peak utilization and fragmentation at that moment.
  double peak_util = 0, frag_at_peak = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const cxlkv::pool::ClassUsage u = a.arena().Usage().classes[0];
    const double util = static_cast<double>(u.allocated + u.persisted) / u.total;
    if (util >= peak_util) {
      peak_util = util;
      frag_at_peak = u.free == 0 ? 0.0 : 1.0 - static_cast<double>(u.largest_free_run) / u.free;
    }
  }
  std::vector<WorkerReport> reps(pids.size());
  int worker_failures = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (::read(fds[i], &reps[i], sizeof(WorkerReport)) != sizeof(WorkerReport)) ++worker_failures;
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++worker_failures;
    ::close(fds[i]);
  }
  const cxlkv::pool::RecoveryReport recovered = a.arena().Recover();  // workers that crashed
  const cxlkv::pool::ArenaUsage after = a.arena().Usage();
  WorkerReport t;
  for (const auto& r : reps) {
    t.requests += r.requests;
    t.evictions += r.evictions;
    t.blocks_allocated += r.blocks_allocated;
    t.blocks_freed += r.blocks_freed;
    t.alloc_ns += r.alloc_ns;
    t.free_ns += r.free_ns;
    t.tokens += r.tokens;
    t.token_slots += r.token_slots;
    t.tag_errors += r.tag_errors;
    t.failed_allocs += r.failed_allocs;
    t.bytes_written += r.bytes_written;
    t.elapsed_s = std::max(t.elapsed_s, r.elapsed_s);
  }
  const double secs = t.elapsed_s > 0 ? t.elapsed_s : o.seconds;
  nlohmann::json j = {
      {"pool", spec->ToString()},
      {"layout", layout->ToString()},
      {"block_bytes", cls.block_bytes},
      {"arena_blocks", cls.block_count},
      {"arena_block_bytes", std::uint64_t{cls.block_count} * cls.block_bytes},
      {"metadata_fraction", static_cast<double>(a.arena().header().metadata_bytes) /
                                static_cast<double>(a.arena().region().size_bytes())},
      {"processes", o.procs},
      {"seconds", secs},
      {"requests", t.requests},
      {"evictions", t.evictions},
      {"blocks_allocated", t.blocks_allocated},
      {"blocks_freed", t.blocks_freed},
      {"bytes_allocated", t.blocks_allocated * cls.block_bytes},
      {"allocs_per_s", static_cast<double>(t.blocks_allocated) / secs},
      {"frees_per_s", static_cast<double>(t.blocks_freed) / secs},
      {"ns_per_block_alloc", t.blocks_allocated ? static_cast<double>(t.alloc_ns) /
                                                      static_cast<double>(t.blocks_allocated)
                                                : 0},
      {"ns_per_block_free",
       t.blocks_freed ? static_cast<double>(t.free_ns) / static_cast<double>(t.blocks_freed) : 0},
      {"bytes_written", t.bytes_written},
      {"peak_utilization", peak_util},
      {"external_fragmentation_at_peak", frag_at_peak},
      {"internal_fragmentation",
       t.token_slots ? 1.0 - static_cast<double>(t.tokens) / static_cast<double>(t.token_slots)
                     : 0},
      {"failed_bulk_allocs", t.failed_allocs},
      {"tag_errors", t.tag_errors},
      {"blocks_in_use_after", after.classes[0].allocated + after.classes[0].cached},
      {"worker_failures", worker_failures},
      {"blocks_recovered_from_dead_workers", recovered.blocks_reclaimed},
  };
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    using cxlkv::base::FormatBytes;
    std::printf("cxlkv-workload summary\n");
    std::printf("  pool                 %s\n", spec->ToString().c_str());
    std::printf("  KV layout            %s (%s per block)\n", layout->ToString().c_str(),
                FormatBytes(cls.block_bytes).c_str());
    std::printf("  arena                %u blocks, %s of blocks, metadata %.4f%%\n",
                cls.block_count,
                FormatBytes(std::uint64_t{cls.block_count} * cls.block_bytes).c_str(),
                100.0 * j["metadata_fraction"].get<double>());
    std::printf("  processes            %d for %.1f s\n", o.procs, secs);
    std::printf("  requests             %llu (%llu evicted under pressure)\n",
                static_cast<unsigned long long>(t.requests),
                static_cast<unsigned long long>(t.evictions));
    std::printf("  blocks alloc / free  %llu / %llu (%s allocated)\n",
                static_cast<unsigned long long>(t.blocks_allocated),
                static_cast<unsigned long long>(t.blocks_freed),
                FormatBytes(t.blocks_allocated * cls.block_bytes).c_str());
    std::printf(
        "  rate                 %.0f allocs/s, %.0f frees/s (%.1f ns per block alloc, %.1f ns per "
        "free)\n",
        j["allocs_per_s"].get<double>(), j["frees_per_s"].get<double>(),
        j["ns_per_block_alloc"].get<double>(), j["ns_per_block_free"].get<double>());
    std::printf(
        "  written              %s with streaming stores (%s)\n",
        FormatBytes(t.bytes_written).c_str(),
        std::string(cxlkv::coherence::CopyKindName(cxlkv::coherence::ActiveCopyKind())).c_str());
    std::printf("  utilization          %.1f%% at peak; %llu blocks in use after the run\n",
                100 * peak_util,
                static_cast<unsigned long long>(j["blocks_in_use_after"].get<std::uint64_t>()));
    std::printf(
        "  fragmentation        external %.1f%% at peak (1 - largest free run / free), internal "
        "%.1f%% (unused token slots)\n",
        100 * frag_at_peak, 100 * j["internal_fragmentation"].get<double>());
    std::printf("  ownership checks     %llu tag errors, %d worker failures\n",
                static_cast<unsigned long long>(t.tag_errors), worker_failures);
  }
  return (t.tag_errors == 0 && worker_failures == 0 && j["blocks_in_use_after"] == 0) ? 0 : 2;
}
