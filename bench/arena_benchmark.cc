// arena_benchmark — what an arena costs before the first block is handed out.
//
//   RegionCreate/<source>/<size>                 OpenRegion alone (memfd: memfd_create +
//                                                ftruncate + mmap; shmfile: also fallocate)
//   ArenaFormat/<source>/<size>/block:<bytes>    Arena::Format on a fresh, never-touched
//                                                region (Format ends with the Open it implies)
//   ArenaOpen/<source>/<size>/block:<bytes>      Arena::Open of an arena formatted earlier and
//                                                closed, through a new mapping
//   MetadataOverhead/memfd/<size>/block:<bytes>  header().metadata_bytes as % of the region
//
// Times are manual: only the call named is timed. Region creation and teardown around it
// are measured separately and reported as the region_ms / teardown_ms counters.
// Sources: memfd (not prefaulted) and a /dev/shm file created with fallocate (the default
// reserve=1). 16 GiB is memfd only: a fallocated 16 GiB file would take 16 GiB of RAM.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "benchmark/benchmark.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

using cxlkv::pool::Arena;
using cxlkv::pool::Region;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kGiB = 1ull << 30;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "arena_benchmark: %s\n", msg.c_str());
  std::abort();
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

enum class Source { kMemfd, kShmFile };

struct Param {
  Source source;
  std::uint64_t region_bytes;
  std::uint64_t block_bytes;  // 0 for RegionCreate
};

std::string SourceName(Source s) { return s == Source::kMemfd ? "memfd" : "shmfile"; }
std::string SizeName(std::uint64_t bytes) { return absl::StrCat(bytes / kGiB, "GiB"); }

std::string ShmPath(absl::string_view tag) {
  return absl::StrCat("/dev/shm/cxlkv-bench-", ::getpid(), "-", tag);
}

// A fresh region: a new memfd, or a new fallocated file at `path`.
std::unique_ptr<Region> CreateRegion(const Param& p, const std::string& path) {
  const std::string spec = p.source == Source::kMemfd
                               ? absl::StrCat("memfd:cxlkv-bench?size=", p.region_bytes)
                               : absl::StrCat("file:", path, "?size=", p.region_bytes);
  auto r = cxlkv::pool::OpenRegion(spec);
  if (!r.ok()) Die(r.status().ToString());
  return *std::move(r);
}

cxlkv::pool::FormatOptions OptionsFor(const Param& p) {
  cxlkv::pool::FormatOptions o;
  o.classes.push_back(cxlkv::pool::ClassSpec{0, p.block_bytes, 1});
  return o;
}

void BM_RegionCreate(benchmark::State& state, Param p) {
  const std::string path = ShmPath("region");
  double teardown_s = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    std::unique_ptr<Region> r = CreateRegion(p, path);
    const auto t1 = Clock::now();
    state.SetIterationTime(Seconds(t0, t1));
    r.reset();
    if (p.source == Source::kShmFile) ::unlink(path.c_str());
    teardown_s += Seconds(t1, Clock::now());
  }
  state.counters["teardown_ms"] = 1e3 * teardown_s / static_cast<double>(state.iterations());
}

void BM_ArenaFormat(benchmark::State& state, Param p) {
  const std::string path = ShmPath("format");
  double region_s = 0;
  double teardown_s = 0;
  const cxlkv::pool::FormatOptions options = OptionsFor(p);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    std::unique_ptr<Region> r = CreateRegion(p, path);
    const auto t1 = Clock::now();
    auto arena = Arena::Format(std::move(r), options);
    const auto t2 = Clock::now();
    if (!arena.ok()) Die(arena.status().ToString());
    state.SetIterationTime(Seconds(t1, t2));
    arena->reset();  // detaches: a scan of the map, counted in teardown_ms
    if (p.source == Source::kShmFile) ::unlink(path.c_str());
    region_s += Seconds(t0, t1);
    teardown_s += Seconds(t2, Clock::now());
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["region_ms"] = 1e3 * region_s / n;
  state.counters["teardown_ms"] = 1e3 * teardown_s / n;
}

void BM_ArenaOpen(benchmark::State& state, Param p) {
  // Format once and close; keep the memory alive through a second descriptor (memfd) or
  // the file itself, and reopen it through a new mapping each iteration.
  const std::string path = ShmPath("open");
  std::unique_ptr<Region> first = CreateRegion(p, path);
  int keep_fd = -1;
  std::string spec = absl::StrCat("file:", path);
  if (p.source == Source::kMemfd) {
    keep_fd = ::fcntl(first->fd(), F_DUPFD_CLOEXEC, 0);
    if (keep_fd < 0) Die("fcntl(F_DUPFD_CLOEXEC) failed");
    spec = absl::StrCat("file:/proc/self/fd/", keep_fd);
  }
  {
    auto arena = Arena::Format(std::move(first), OptionsFor(p));
    if (!arena.ok()) Die(arena.status().ToString());
  }
  double region_s = 0;
  double teardown_s = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto r = cxlkv::pool::OpenRegion(spec);
    if (!r.ok()) Die(r.status().ToString());
    const auto t1 = Clock::now();
    auto arena = Arena::Open(*std::move(r));
    const auto t2 = Clock::now();
    if (!arena.ok()) Die(arena.status().ToString());
    state.SetIterationTime(Seconds(t1, t2));
    arena->reset();
    region_s += Seconds(t0, t1);
    teardown_s += Seconds(t2, Clock::now());
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["region_ms"] = 1e3 * region_s / n;
  state.counters["teardown_ms"] = 1e3 * teardown_s / n;
  if (keep_fd >= 0) ::close(keep_fd);
  if (p.source == Source::kShmFile) ::unlink(path.c_str());
}

void BM_MetadataOverhead(benchmark::State& state, Param p) {
  std::unique_ptr<Arena> arena;
  for (auto _ : state) {
    arena.reset();
    auto a = Arena::Format(CreateRegion(p, ""), OptionsFor(p));
    if (!a.ok()) Die(a.status().ToString());
    arena = *std::move(a);
  }
  const auto& h = arena->header();
  const std::uint64_t blocks = h.classes[0].block_count;
  const std::uint64_t data = blocks * h.classes[0].block_bytes;
  const auto region = static_cast<double>(h.region_bytes);
  state.counters["metadata_pct"] = 100.0 * static_cast<double>(h.metadata_bytes) / region;
  state.counters["metadata_bytes"] = static_cast<double>(h.metadata_bytes);
  state.counters["blocks"] = static_cast<double>(blocks);
  state.counters["data_pct"] = 100.0 * static_cast<double>(data) / region;
  // Neither metadata nor block: the tail smaller than one block, and alignment padding.
  state.counters["slack_pct"] =
      100.0 * static_cast<double>(h.region_bytes - data - h.metadata_bytes) / region;
}

std::string Name(absl::string_view what, const Param& p) {
  std::string name = absl::StrCat(what, "/", SourceName(p.source), "/", SizeName(p.region_bytes));
  if (p.block_bytes != 0) absl::StrAppend(&name, "/block:", p.block_bytes);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  struct Case {
    Source source;
    std::uint64_t region_bytes;
    std::int64_t iterations;
  };
  // Fixed iteration counts keep the untimed region setup (1 GiB fallocate) bounded.
  const Case cases[] = {
      {Source::kMemfd, 1 * kGiB, 40},
      {Source::kMemfd, 16 * kGiB, 10},
      {Source::kShmFile, 1 * kGiB, 5},
  };
  const std::uint64_t kTimedBlocks[] = {64ull << 10, 5ull << 20};
  const std::uint64_t kOverheadBlocks[] = {64ull << 10, 2ull << 20, 5ull << 20};

  for (const Case& c : cases) {
    const Param p{c.source, c.region_bytes, 0};
    benchmark::RegisterBenchmark(Name("RegionCreate", p).c_str(), BM_RegionCreate, p)
        ->UseManualTime()
        ->Iterations(c.iterations)
        ->Unit(benchmark::kMillisecond);
  }
  for (const Case& c : cases) {
    for (std::uint64_t block : kTimedBlocks) {
      const Param p{c.source, c.region_bytes, block};
      benchmark::RegisterBenchmark(Name("ArenaFormat", p).c_str(), BM_ArenaFormat, p)
          ->UseManualTime()
          ->Iterations(c.iterations)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const Case& c : cases) {
    for (std::uint64_t block : kTimedBlocks) {
      const Param p{c.source, c.region_bytes, block};
      benchmark::RegisterBenchmark(Name("ArenaOpen", p).c_str(), BM_ArenaOpen, p)
          ->UseManualTime()
          ->Iterations(c.iterations)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (std::uint64_t size : {1 * kGiB, 16 * kGiB}) {
    for (std::uint64_t block : kOverheadBlocks) {
      const Param p{Source::kMemfd, size, block};
      benchmark::RegisterBenchmark(Name("MetadataOverhead", p).c_str(), BM_MetadataOverhead, p)
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
