// Shared prefix blocks (coherence/prefix.h) on a real mapping:
//   PublishBlock/<method>/<bytes>: copying a block in and making it reachable. cxlkv =
//     streaming-store copy (CopyNt) + a publish request through the ring (+ the owner
//     applying it), against memcpy + clwb over the block + sfence (the same bytes made
//     durable the usual way, without any publication).
//   ReclaimScan/hosts:64/rows:4096: one reclaim pass of the owner over every lease row of
//     64 live hosts (invalidate + read + check of 262,144 rows).
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/pool/region.h"

namespace {

using namespace cxlkv::coherence;

class BenchClock final : public Clock {
 public:
  std::int64_t NowMs() override { return now; }
  std::int64_t now = 1000;
};

// Not movable: the owner and hosts keep references to `clock` and `*mem`.
struct Bed {
  Bed(const Bed&) = delete;
  Bed& operator=(const Bed&) = delete;
  std::unique_ptr<cxlkv::pool::Region> region;
  std::unique_ptr<DirectMem> mem;
  BenchClock clock;
  std::unique_ptr<PrefixOwner> owner;
  std::vector<std::unique_ptr<PrefixHost>> hosts;

  explicit Bed(const DomainGeometry& g, std::uint32_t join) {
    const std::uint64_t bytes = (DomainBytes(g) + 4095) / 4096 * 4096;
    region = std::move(*cxlkv::pool::OpenRegion("memfd:bench-domain?size=" + std::to_string(bytes)));
    mem = std::make_unique<DirectMem>(region->addr(), region->size_bytes());
    if (!FormatDomain(*mem, g).ok()) std::abort();
    owner = std::move(*PrefixOwner::Open(*mem, clock));
    for (std::uint32_t h = 0; h < join; ++h) hosts.push_back(std::move(*PrefixHost::Join(*mem, clock, h)));
    owner->Step();  // acknowledges every host
  }
};

void BM_PublishBlock(benchmark::State& state, bool cxlkv) {
  const auto block = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kBlocks = 64;
  auto dst = std::move(*cxlkv::pool::OpenRegion("memfd:bench-blocks?size=" +
                                                 std::to_string(block * kBlocks)));
  std::vector<std::byte> src(block);
  std::memset(src.data(), 0x5A, src.size());
  std::memset(dst->addr(), 0, dst->size_bytes());
  auto bed = std::make_unique<Bed>(DomainGeometry{2, 1 << 16, 16, 64, 2000, 2000, 100}, 1);
  const Namespace ns = MakeNamespace("bench", "model", "layout");
  std::uint32_t n = 0;
  for (auto _ : state) {
    std::byte* d = dst->addr() + (n % kBlocks) * block;
    if (cxlkv) {
      CopyNt(d, src.data(), block);
      BlockRef ref{};
      ref.index = n;
      const std::uint32_t token = n;
      if (!bed->hosts[0]->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&token, 1)), PrefixKey{}, ref).ok()) {
        state.SkipWithError("publish failed");
        break;
      }
      if (n % 32 == 31) bed->owner->ApplyRequests();
    } else {
      std::memcpy(d, src.data(), block);
      Flush(d, block);
      Fence();
    }
    ++n;
    if (bed->owner->published_entries() > 60000) {  // keep the index from filling up
      state.PauseTiming();
      bed.reset();  // a new domain (the region's name is reused)
      bed = std::make_unique<Bed>(DomainGeometry{2, 1 << 16, 16, 64, 2000, 2000, 100}, 1);
      state.ResumeTiming();
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(block));
}
BENCHMARK_CAPTURE(BM_PublishBlock, cxlkv_copynt_publish, true)
    ->ArgName("bytes")->Arg(64 << 10)->Arg(2 << 20)->Arg(5 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_PublishBlock, memcpy_clwb, false)
    ->ArgName("bytes")->Arg(64 << 10)->Arg(2 << 20)->Arg(5 << 20)->UseRealTime();

void BM_ReclaimScan(benchmark::State& state) {
  const auto hosts = static_cast<std::uint32_t>(state.range(0));
  const auto rows = static_cast<std::uint32_t>(state.range(1));
  Bed bed(DomainGeometry{hosts, 1024, rows, 4, 1 << 30, 1 << 30, 1}, hosts);
  // One published entry, leased by host 1 and retired: every Reclaim() scans every row and
  // keeps it (the lease holds).
  const Namespace ns = MakeNamespace("bench", "model", "layout");
  const std::uint32_t token = 1;
  const PrefixKey key = ChainKey(ns, PrefixKey{}, std::span(&token, 1));
  (void)bed.hosts[0]->Publish(ns, key, PrefixKey{}, BlockRef{});
  bed.owner->Step();
  auto lease = bed.hosts[1 % hosts]->LookupAndAcquire(ns, key);
  if (!lease.ok() || !bed.owner->RetireKey(ns, key).ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  bed.clock.now += 10;
  for (auto _ : state) {
    if (bed.owner->Reclaim() != 0) {
      state.SkipWithError("the leased entry was reclaimed");
      break;
    }
  }
  state.counters["rows"] = static_cast<double>(hosts) * rows;
  state.counters["ns_per_row"] = benchmark::Counter(
      static_cast<double>(hosts) * rows, benchmark::Counter::kIsIterationInvariantRate |
                                             benchmark::Counter::kInvert);
}
BENCHMARK(BM_ReclaimScan)->ArgNames({"hosts", "rows"})->Args({64, 4096})->Args({8, 256})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
