// Shared prefix blocks (coherence/prefix.h) on a real mapping:
//   PublishBlock/<method>/<bytes>: copying a block in and making it reachable. cxlkv =
//     streaming-store copy (CopyNt) + a publish request through the ring (+ the owner
//     applying it), against memcpy + clwb over the block + sfence (the same bytes made
//     durable the usual way, without any publication).
//   ReclaimScan/hosts:H/rows:R/held:K: one reclaim pass of the owner over every lease row of
//     H live hosts (invalidate + read + check of H x R rows; 64 x 4096 = 262,144); K=1: every
//     one of those rows holds a lease; K=2: and they turn over between passes.
//   PublishSustained/...: end-to-end publish throughput against CopyNt in the same run (below).
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
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
// The block sizes of the tables: 64 KiB, 2 MiB and 5 MiB.
void BlockSizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes")->Arg(64 << 10)->Arg(2 << 20)->Arg(5 << 20);
}
BENCHMARK_CAPTURE(BM_PublishBlock, cxlkv_copynt_publish, true)->Apply(BlockSizes)->UseRealTime();
BENCHMARK_CAPTURE(BM_PublishBlock, memcpy_clwb, false)->Apply(BlockSizes)->UseRealTime();

// ReclaimScan/hosts:H/rows:R/held:K. H live hosts with R lease rows each, a 4,096-entry
// index, and one published entry retired while host 1 leases it: every Reclaim() finds it
// due, scans every row of every live host and keeps it (the lease holds), so one iteration
// is one full scan and frees nothing. K=0: that lease is the only row held. K=1: every row
// of every host is held (each host leases the same R published entries, as hosts sharing
// one set of prefixes would), so the scan also collects, sorts and searches H x R leases;
// the rows do not change between passes. K=2: as K=1, and between passes (untimed) every
// host releases its leases but the retired entry's and takes them again in a new random
// order, so each pass finds other entries in each row, as rows turning over would show it.
void BM_ReclaimScan(benchmark::State& state) {
  const auto hosts = static_cast<std::uint32_t>(state.range(0));
  const auto rows = static_cast<std::uint32_t>(state.range(1));
  const bool all_held = state.range(2) != 0;
  const bool turn_over = state.range(2) == 2;
  Bed bed(DomainGeometry{hosts, 4096, rows, 16, 1 << 30, 1 << 30, 1}, hosts);
  const Namespace ns = MakeNamespace("bench", "model", "layout");
  // R published entries (distinct blocks: the owner refuses a block named twice).
  const std::uint32_t published = all_held ? rows : 1;
  std::vector<PrefixKey> keys;
  for (std::uint32_t t = 1; t <= published; ++t) {
    keys.push_back(ChainKey(ns, PrefixKey{}, std::span(&t, 1)));
    BlockRef ref{};
    std::memcpy(ref.arena, "reclaim-bench", 14);
    ref.index = t;
    ref.generation = 1;
    for (int tries = 0;; ++tries) {
      const absl::Status s = bed.hosts[0]->Publish(ns, keys.back(), PrefixKey{}, ref);
      if (s.ok()) break;
      if (!absl::IsUnavailable(s) || tries > 4) {
        state.SkipWithError("publish failed");
        return;
      }
      bed.owner->ApplyRequests();  // the ring was full
    }
  }
  bed.owner->Step();
  if (bed.owner->published_entries() != published) {
    state.SkipWithError("publications did not all apply");
    return;
  }
  // Every host beats and is acknowledged, so it may take leases.
  for (auto& h : bed.hosts) (void)h->Heartbeat(nullptr);
  bed.owner->Step();
  // Each host's leases but the one on keys[0] (the entry retired below), by host.
  std::vector<std::vector<Lease>> rest(hosts);
  std::size_t held = 0;
  for (std::uint32_t h = 0; h < hosts; ++h) {
    if (!all_held && h != 1 % hosts) continue;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto lease = bed.hosts[h]->LookupAndAcquire(ns, keys[i]);
      if (!lease.ok()) {
        state.SkipWithError(std::string(lease.status().message()).c_str());
        return;
      }
      if (i != 0) rest[h].push_back(*lease);
      ++held;
    }
  }
  if (!bed.owner->RetireKey(ns, keys[0]).ok()) {
    state.SkipWithError("RetireKey failed");
    return;
  }
  bed.clock.now += 10;  // past the grace: the entry is due every pass
  std::vector<PrefixKey> order(keys.begin() + 1, keys.end());
  std::mt19937_64 rng(21);
  for (auto _ : state) {
    if (turn_over) {
      state.PauseTiming();
      for (std::uint32_t h = 0; h < hosts; ++h) {
        bed.hosts[h]->ReleaseAll(rest[h]);
        rest[h].clear();
        std::shuffle(order.begin(), order.end(), rng);
        auto n = bed.hosts[h]->AcquireChain(ns, order, &rest[h]);
        if (!n.ok() || *n != order.size()) {
          state.SkipWithError("the leases could not be taken again");
          return;
        }
      }
      state.ResumeTiming();
    }
    if (bed.owner->Reclaim() != 0) {
      state.SkipWithError("the leased entry was reclaimed");
      break;
    }
  }
  state.counters["rows"] = static_cast<double>(hosts) * rows;
  state.counters["held"] = static_cast<double>(held);
  state.counters["ns_per_row"] = benchmark::Counter(
      static_cast<double>(hosts) * rows,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
// hosts x lease rows, for the scaling table (issue #21). held:0 also at 16 and 4096 rows
// (one lease: the cost of reading rows); held:1 and held:2 at 64-1024 (every row held).
BENCHMARK(BM_ReclaimScan)
    ->ArgNames({"hosts", "rows", "held"})
    ->ArgsProduct({{2, 8, 64}, {16, 64, 256, 1024, 4096}, {0}})
    ->ArgsProduct({{2, 8, 64}, {64, 256, 1024}, {1, 2}})
    ->Unit(benchmark::kMicrosecond);

// ---- sustained publish against the copy limit (issue #21) ------------------------------------
//
// PublishSustained/<mode>/bytes:<n>: a prefill host fills blocks with streaming stores (CopyNt)
// and publishes them while an owner thread runs PrefixOwner::Step() in a loop beside it (the
// orchestrator's owner on another core). One iteration is one round of `chunk` blocks, timed
// end to end: copy in + publish requests (ring-room waits included) + the owner applying them,
// until host 1 finds the round's last block with Lookup. Each round is paired with a round of
// CopyNt alone into the same blocks, timed the same way: the limit, measured in the same run
// and under the same load. Counters: publish_GBps and copynt_GBps (medians over the rounds),
// ratio = publish / copy. The destination rotates through 1 GiB of a memfd region (far
// larger than the last-level cache), so every copy lands in cold lines, as in copy_benchmark.
//   mode block: one Publish per block; mode chain<n>: PublishChain of n blocks.

class AtomicClock final : public Clock {
 public:
  std::int64_t NowMs() override { return now.load(std::memory_order_relaxed); }
  std::atomic<std::int64_t> now{1000};
};

// CPU time of the calling thread, in seconds: what a round cost this thread, whatever else
// the machine ran meanwhile (the development VM has 2 vCPUs shared with other jobs, where wall
// time mostly measures when the scheduler let each thread run).
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct OwnerThread {
  std::atomic<bool> stop{false};
  std::thread t;
  // CPU seconds the owner thread spent in Step() rounds that applied something, and the
  // requests they applied (rounds that found nothing are the idle spin of a dedicated owner).
  std::atomic<double> busy_cpu_s{0};
  std::atomic<std::uint64_t> applied{0};
  void Start(PrefixOwner* owner) {
    stop = false;
    t = std::thread([this, owner] {
      while (!stop.load(std::memory_order_relaxed)) {
        const std::uint64_t before = owner->stats().requests_applied;
        const double c0 = ThreadCpuSeconds();
        owner->Step();
        const std::uint64_t n = owner->stats().requests_applied - before;
        if (n != 0) {
          busy_cpu_s.store(busy_cpu_s.load() + ThreadCpuSeconds() - c0);
          applied.store(applied.load() + n);
        }
      }
    });
  }
  void Stop() {
    stop = true;
    if (t.joinable()) t.join();
  }
};

// Waits until the ring has room for `slots` requests (the owner running on another thread).
void WaitRoom(PrefixHost& host, std::uint32_t slots) { (void)host.WaitForRingRoom(slots, 1000); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_PublishSustained(benchmark::State& state, std::uint32_t chain, bool owner_thread) {
  const auto block = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kDestBytes = 1024ull << 20;
  const std::size_t nblocks = kDestBytes / block;
  const std::size_t chunk = std::max<std::size_t>(16, (32ull << 20) / block);
  auto dst = std::move(
      *cxlkv::pool::OpenRegion("memfd:bench-publish?size=" + std::to_string(nblocks * block)));
  std::memset(dst->addr(), 0x11, dst->size_bytes());  // prefault
  std::vector<std::byte> src(block);
  std::memset(src.data(), 0x5A, src.size());
  const DomainGeometry g{2, 1 << 16, 16, 64, 2000, 2000, 100};
  const std::uint64_t dbytes = (DomainBytes(g) + 4095) / 4096 * 4096;
  auto region = std::move(
      *cxlkv::pool::OpenRegion("memfd:bench-publish-domain?size=" + std::to_string(dbytes)));
  DirectMem mem(region->addr(), region->size_bytes());
  AtomicClock clock;
  std::unique_ptr<PrefixOwner> owner;
  std::unique_ptr<PrefixHost> host, reader;
  OwnerThread ot;
  double owner_cpu_s = 0;
  std::uint64_t owner_applied = 0;
  auto fresh = [&] {
    ot.Stop();
    owner_cpu_s += ot.busy_cpu_s.exchange(0);
    owner_applied += ot.applied.exchange(0);
    host.reset();
    reader.reset();
    owner.reset();
    std::memset(region->addr(), 0, region->size_bytes());
    if (!FormatDomain(mem, g).ok()) std::abort();
    owner = std::move(*PrefixOwner::Open(mem, clock));
    host = std::move(*PrefixHost::Join(mem, clock, 0));
    reader = std::move(*PrefixHost::Join(mem, clock, 1));
    owner->Step();
    if (owner_thread) ot.Start(owner.get());
  };
  fresh();
  const Namespace ns = MakeNamespace("bench", "model", "layout");
  std::uint32_t token = 0;
  std::size_t di = 0;
  std::vector<double> pub_gbps, copy_gbps, pub_cpu_gbps, copy_cpu_gbps;
  std::vector<PublishItem> all;
  using SteadyNs = std::chrono::steady_clock;
  for (auto _ : state) {
    if (owner->published_entries() + chunk > 40000) {
      state.PauseTiming();
      fresh();
      state.ResumeTiming();
    }
    // The limit: CopyNt alone into the next `chunk` blocks; the publish round then fills the
    // `chunk` after them (equally cold: no page or line of either was touched for 1 GiB).
    double cpu0 = ThreadCpuSeconds();
    auto t0 = SteadyNs::now();
    for (std::size_t k = 0; k < chunk; ++k) {
      CopyNt(dst->addr() + ((di + k) % nblocks) * block, src.data(), block);
    }
    di = (di + chunk) % nblocks;
    auto t1 = SteadyNs::now();
    copy_gbps.push_back(static_cast<double>(chunk * block) /
                        static_cast<double>((t1 - t0).count()));
    copy_cpu_gbps.push_back(static_cast<double>(chunk * block) / (ThreadCpuSeconds() - cpu0) / 1e9);
    // Publish: copy in + request, the same blocks; then until another host sees the last one.
    // The round's keys are the caller's (hashed from its tokens before): made untimed.
    all.clear();
    PrefixKey last{};
    for (std::size_t k = 0; k < chunk; ++k) {
      BlockRef ref{};
      ref.index = ++token;
      const PrefixKey key = ChainKey(ns, PrefixKey{}, std::span(&token, 1));
      all.push_back(PublishItem{key, last, ref});
      last = key;
    }
    cpu0 = ThreadCpuSeconds();
    t0 = SteadyNs::now();
    for (std::size_t k = 0; k < chunk;) {
      const std::size_t n = chain == 0 ? 1 : std::min<std::size_t>(chain, chunk - k);
      for (std::size_t j = 0; j < n; ++j) {
        CopyNt(dst->addr() + ((di + k + j) % nblocks) * block, src.data(), block);
      }
      const std::span<const PublishItem> items(all.data() + k, n);
      for (;;) {
        const absl::Status st = chain == 0
                                    ? host->Publish(ns, items[0].key, items[0].parent, items[0].ref)
                                    : host->PublishChain(ns, items);
        if (st.ok()) break;
        if (!absl::IsUnavailable(st)) {
          state.SkipWithError(std::string(st.message()).c_str());
          ot.Stop();
          return;
        }
        if (owner_thread) {
          WaitRoom(*host, static_cast<std::uint32_t>(n));
        } else {
          owner->Step();
        }
      }
      k += n;
    }
    while (!reader->Lookup(ns, last)) {
      if (owner_thread) {
        std::this_thread::yield();
      } else {
        owner->Step();
      }
    }
    t1 = SteadyNs::now();
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(secs);
    pub_gbps.push_back(static_cast<double>(chunk * block) / secs / 1e9);
    pub_cpu_gbps.push_back(static_cast<double>(chunk * block) / (ThreadCpuSeconds() - cpu0) / 1e9);
    di = (di + chunk) % nblocks;
  }
  ot.Stop();
  owner_cpu_s += ot.busy_cpu_s.exchange(0);
  owner_applied += ot.applied.exchange(0);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * chunk * block));
  const double p = Median(pub_gbps), c = Median(copy_gbps);
  state.counters["publish_GBps"] = p;
  state.counters["copynt_GBps"] = c;
  state.counters["ratio"] = c > 0 ? p / c : 0;
  state.counters["blocks_per_round"] = static_cast<double>(chunk);
  // The same rounds by the host thread's CPU time (waits included, as polls and yields).
  const double pc = Median(pub_cpu_gbps), cc = Median(copy_cpu_gbps);
  state.counters["publish_cpu_GBps"] = pc;
  state.counters["copynt_cpu_GBps"] = cc;
  state.counters["cpu_ratio"] = cc > 0 ? pc / cc : 0;
  if (owner_applied != 0) {
    state.counters["owner_us_per_req"] = owner_cpu_s * 1e6 / static_cast<double>(owner_applied);
  }
}
// Each round times itself (SetIterationTime), in milliseconds: at the tables' block sizes, or
// over the sweep 16 KiB, 64 KiB, ..., 4 MiB and 8 MiB.
void SustainedAtBlockSizes(benchmark::internal::Benchmark* b) {
  BlockSizes(b);
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}
void SustainedBlockSweep(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes")->RangeMultiplier(4)->Range(16 << 10, 4 << 20)->Arg(8 << 20);
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_PublishSustained, block, 0, true)->Apply(SustainedAtBlockSizes);
BENCHMARK_CAPTURE(BM_PublishSustained, chain16, 16, true)->Apply(SustainedAtBlockSizes);
// The owner's work on the host's own thread (Step() when the ring is full and at the end of a
// round): the protocol's whole CPU cost on one core, free of the scheduling of a second
// thread on a loaded machine.
BENCHMARK_CAPTURE(BM_PublishSustained, block_inline_owner, 0, false)->Apply(SustainedAtBlockSizes);
BENCHMARK_CAPTURE(BM_PublishSustained, chain16_inline_owner, 16, false)
    ->Apply(SustainedAtBlockSizes);
// The block-size sweep of the scaling table.
BENCHMARK_CAPTURE(BM_PublishSustained, sweep_block, 0, true)->Apply(SustainedBlockSweep);
BENCHMARK_CAPTURE(BM_PublishSustained, sweep_block_inline_owner, 0, false)
    ->Apply(SustainedBlockSweep);

}  // namespace

BENCHMARK_MAIN();
