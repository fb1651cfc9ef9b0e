// lookup_scaling_benchmark — how the shared-prefix index's costs grow with the work (issue #21):
// lookups against index load and churn, lease acquires against load, and the owner's step
// against load and hosts. All in one process on a memfd domain (DirectMem: the real
// clflushopt / mfence / streaming-store instructions), one thread; CPU time is the figure to
// read on a shared machine.
//
//   BM_LookupAfterChurn/cycles:C/hit:K   A 4,096-entry index kept at 70 % load (2,867 keys)
//       through C publish/retire/reclaim cycles (the oldest key retired for each new one, in
//       batches of 32, the grace passing between batches), then Lookup from another host:
//       K=1 keys that are published, K=0 keys that never were. Counters: probes (index lines
//       read per lookup, counted through a Mem wrapper on a second reader), tombstones and
//       empties left in the index, miss_over_hit (the hit's time from the same run; set on
//       the K=0 rows).
//   BM_AcquireVsLoad/load:L/chain:N       N published keys (unrelated, so spread over the
//       index) leased with AcquireChain and released with ReleaseAll (N=1: Lookup + Acquire +
//       Release); index L % full. Items are blocks.
//   BM_AcquireVsHosts/hosts:H/chain:N     As BM_AcquireVsLoad at 70 % load, with H hosts that
//       really work between the timed acquires: every 256 blocks (untimed) each host other
//       than the reader beats and trades one of its 64 standing leases for another, host 0
//       publishes one key and retires one, and the owner Steps (applying both, reclaiming
//       the key retired a round earlier after a scan of every host's lease rows).
//   BM_OwnerStepVsHosts/load:L/hosts:H    PrefixOwner::Step with H hosts joined (max_hosts =
//       H), each step applying one publish and one retire request of host 0 and reclaiming
//       the entry retired a step earlier (so every step scans every live host's lease rows).
//
// The clock is a manual one (the owner's grace passes when the benchmark says so); hosts'
// TTLs are long enough that nobody is fenced during a run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/pool/region.h"

namespace {

namespace co = cxlkv::coherence;

constexpr std::uint32_t kEntries = 4096;
constexpr std::uint32_t kGraceMs = 100;
constexpr std::uint32_t kBatch = 32;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "lookup_scaling_benchmark: %s\n", msg.c_str());
  std::abort();
}
void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

class ManualClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return now_ms; }
  std::int64_t now_ms = 1000;
};

// Counts the index lines read.
class CountingMem final : public co::Mem {
 public:
  CountingMem(co::Mem& inner, std::uint64_t lo, std::uint64_t hi)
      : inner_(inner), lo_(lo), hi_(hi) {}
  std::uint64_t size_bytes() const override { return inner_.size_bytes(); }
  void Read(std::uint64_t o, void* d, std::size_t n) override {
    if (o >= lo_ && o < hi_) reads += (n + 63) / 64;  // index lines, not calls
    inner_.Read(o, d, n);
  }
  void Write(std::uint64_t o, const void* s, std::size_t n) override { inner_.Write(o, s, n); }
  void WriteNt(std::uint64_t o, const void* s, std::size_t n) override { inner_.WriteNt(o, s, n); }
  void Flush(std::uint64_t o, std::size_t n) override { inner_.Flush(o, n); }
  void Invalidate(std::uint64_t o, std::size_t n) override { inner_.Invalidate(o, n); }
  void Evict(std::uint64_t o, std::size_t n) override { inner_.Evict(o, n); }
  void Fence() override { inner_.Fence(); }
  void FullFence() override { inner_.FullFence(); }
  std::uint64_t reads = 0;

 private:
  co::Mem& inner_;
  std::uint64_t lo_, hi_;
};

co::PrefixKey KeyOf(std::uint64_t i) {
  // Spread like ChainKey's hashes (the probe start comes from the low word).
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return co::PrefixKey{x, i + 1};
}

co::BlockRef RefOf(std::uint64_t i) {
  co::BlockRef r{};
  static constexpr char kArena[] = "scaling-bench";
  std::memcpy(r.arena, kArena, sizeof(kArena));
  r.index = static_cast<std::uint32_t>(i);
  r.generation = static_cast<std::uint32_t>(i >> 32) + 1;
  return r;
}

// One domain, its owner, a publishing host 0 and a reading host 1 (live), on a manual clock.
struct World {
  std::unique_ptr<cxlkv::pool::Region> region;
  ManualClock clock;
  std::unique_ptr<co::DirectMem> owner_mem, pub_mem, read_mem;
  std::unique_ptr<co::PrefixOwner> owner;
  std::unique_ptr<co::PrefixHost> pub, reader;
  std::vector<std::unique_ptr<co::DirectMem>> extra_mems;
  std::vector<std::unique_ptr<co::PrefixHost>> extra;  // hosts 2.. (joined, idle)
  co::Namespace ns = 0;
  std::deque<std::uint64_t> live;  // published key numbers, oldest first
  std::uint64_t next_key = 0;

  World(std::uint32_t hosts, std::uint32_t published) {
    co::DomainGeometry g;
    g.max_hosts = hosts;
    g.index_entries = kEntries;
    g.lease_ttl_ms = 1u << 30;
    g.host_ttl_ms = 1u << 30;
    g.grace_ms = kGraceMs;
    const std::uint64_t bytes = (co::DomainBytes(g) + 4095) / 4096 * 4096;
    auto r = cxlkv::pool::OpenRegion(absl::StrCat("memfd:cxlkv-bench-scaling?size=", bytes));
    if (!r.ok()) Die(r.status().ToString());
    region = *std::move(r);
    auto mem = [&] {
      return std::make_unique<co::DirectMem>(region->addr(), region->size_bytes());
    };
    owner_mem = mem();
    pub_mem = mem();
    read_mem = mem();
    Check(co::FormatDomain(*owner_mem, g), "FormatDomain");
    co::PrefixOwner::Options o;
    o.max_load = 0.95;
    auto ow = co::PrefixOwner::Open(*owner_mem, clock, o);
    if (!ow.ok()) Die(ow.status().ToString());
    owner = *std::move(ow);
    pub = Join(*pub_mem, 0);
    reader = Join(*read_mem, 1);
    for (std::uint32_t h = 2; h < hosts; ++h) {
      extra_mems.push_back(mem());
      extra.push_back(Join(*extra_mems.back(), h));
    }
    ns = co::MakeNamespace("bench", "scaling", "v1");
    owner->Step();  // acknowledges every host's first beat
    Check(pub->Heartbeat(nullptr), "Heartbeat");
    Check(reader->Heartbeat(nullptr), "Heartbeat");
    for (auto& h : extra) Check(h->Heartbeat(nullptr), "Heartbeat");
    owner->Step();
    for (std::uint32_t i = 0; i < published; ++i) PublishOne();
    Apply();
    if (owner->published_entries() != published) Die("publications did not all apply");
  }
  std::unique_ptr<co::PrefixHost> Join(co::Mem& m, std::uint32_t id) {
    auto h = co::PrefixHost::Join(m, clock, id);
    if (!h.ok()) Die(h.status().ToString());
    return *std::move(h);
  }
  void PublishOne() {
    const std::uint64_t k = next_key++;
    for (int tries = 0;; ++tries) {
      const absl::Status s = pub->Publish(ns, KeyOf(k), co::PrefixKey{}, RefOf(k));
      if (s.ok()) break;
      if (!absl::IsUnavailable(s) || tries > 4) Die(s.ToString());
      owner->ApplyRequests();
    }
    live.push_back(k);
  }
  void Apply() {
    for (int i = 0; i < 4; ++i) owner->ApplyRequests();
  }
  // `n` new keys published, the `n` oldest retired, the grace passed, reclaimed, returns taken.
  void Churn(std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) PublishOne();
    Apply();
    for (std::uint32_t i = 0; i < n; ++i) {
      Check(owner->RetireKey(ns, KeyOf(live.front())), "RetireKey");
      live.pop_front();
    }
    clock.now_ms += kGraceMs + 1;
    owner->Reclaim();
    std::vector<co::BlockRef> back;
    Check(pub->Heartbeat(&back), "Heartbeat");
  }
  std::uint32_t CountState(co::EntryState s) const {
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < owner->header().index_entries; ++i)
      n += owner->entry_state(i) == s;
    return n;
  }
};

// ---- lookups after churn ---------------------------------------------------------------------

std::map<std::int64_t, std::unique_ptr<World>> g_churned;
std::map<std::int64_t, double> g_hit_ns;  // cycles -> hit time (CPU ns), for miss_over_hit

World& Churned(std::int64_t cycles) {
  auto& w = g_churned[cycles];
  if (!w) {
    w = std::make_unique<World>(8, 2867);
    for (std::int64_t c = 0; c < cycles; c += kBatch) w->Churn(kBatch);
  }
  return *w;
}

void BM_LookupAfterChurn(benchmark::State& state) {
  const std::int64_t cycles = state.range(0);
  const bool hit = state.range(1) != 0;
  World& w = Churned(cycles);
  std::vector<co::PrefixKey> keys;
  if (hit) {
    for (std::uint64_t k : w.live) keys.push_back(KeyOf(k));
  } else {
    for (std::uint64_t k = 0; k < 4096; ++k) keys.push_back(KeyOf((1ull << 40) + k));
  }
  // Probes per lookup, counted on a second reader over a counting Mem.
  const co::DomainHeader& h = w.owner->header();
  CountingMem counting(*w.read_mem, h.index_offset, h.index_offset + h.index_entries * 64ull);
  {
    auto counter = co::PrefixHost::Join(counting, w.clock, 2);
    if (!counter.ok()) Die(counter.status().ToString());
    for (const co::PrefixKey& k : keys) {
      if ((*counter)->Lookup(w.ns, k).has_value() != hit) Die("lookup answered wrong");
    }
  }
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(w.reader->Lookup(w.ns, keys[i]));
    if (++i == keys.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["probes"] = static_cast<double>(counting.reads) / static_cast<double>(keys.size());
  state.counters["tombstones"] = w.CountState(co::EntryState::kTombstone);
  state.counters["empty"] = w.CountState(co::EntryState::kEmpty);
  state.counters["published"] = w.owner->published_entries();
}

// ---- acquire against load --------------------------------------------------------------------

std::map<std::int64_t, std::unique_ptr<World>> g_loaded;
World& Loaded(std::int64_t load_pct) {
  auto& w = g_loaded[load_pct];
  if (!w) w = std::make_unique<World>(8, static_cast<std::uint32_t>(kEntries * load_pct / 100));
  return *w;
}

// The timed unit of the acquire benchmarks: a run of 1 is a Lookup + Acquire + Release, a
// longer run one AcquireChain + ReleaseAll.
void AcquireAndRelease(co::PrefixHost& reader, co::Namespace ns, std::span<const co::PrefixKey> run,
                       std::vector<co::Lease>& leases) {
  if (run.size() == 1) {
    const auto hit = reader.Lookup(ns, run[0]);
    if (!hit) Die("a published key missed");
    auto lease = reader.Acquire(*hit);
    if (!lease.ok()) Die(lease.status().ToString());
    reader.Release(*lease);
    return;
  }
  leases.clear();
  auto n = reader.AcquireChain(ns, run, &leases);
  if (!n.ok() || *n != run.size()) Die("AcquireChain: short run");
  reader.ReleaseAll(leases);
}

void BM_AcquireVsLoad(benchmark::State& state) {
  World& w = Loaded(state.range(0));
  const auto chain = static_cast<std::size_t>(state.range(1));
  std::vector<co::PrefixKey> keys;
  for (std::uint64_t k : w.live) keys.push_back(KeyOf(k));
  const std::size_t runs = keys.size() / chain;
  std::vector<co::Lease> leases;
  leases.reserve(chain);
  std::size_t r = 0;
  for (auto _ : state) {
    const std::span<const co::PrefixKey> run(keys.data() + r * chain, chain);
    if (++r == runs) r = 0;
    AcquireAndRelease(*w.reader, w.ns, run, leases);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(chain));
}

// ---- acquire against hosts ---------------------------------------------------------------------

// Every kRoundBlocks blocks acquired, untimed: the clock moves past the grace, host 0
// publishes a fresh key and retires the one it published a round before, every host but the
// reader beats and trades its oldest lease for a new one, the reader beats, and the owner
// Steps (the publish and retire applied, the key retired a round before reclaimed after a
// scan of every live host's lease rows). So H hosts really are there between the timed
// acquires: their rows held and rewritten, their heartbeats acknowledged, and the owner's
// per-host work done (and its lines in this cache) as often as it would be.
constexpr std::size_t kRoundBlocks = 256;
constexpr std::size_t kStanding = 64;  // leases each other host keeps (of its 256 rows)

void BM_AcquireVsHosts(benchmark::State& state) {
  const auto hosts = static_cast<std::uint32_t>(state.range(0));
  const auto chain = static_cast<std::size_t>(state.range(1));
  World w(hosts, kEntries * 70 / 100);
  std::vector<co::PrefixKey> keys;
  for (std::uint64_t k : w.live) keys.push_back(KeyOf(k));
  // The other hosts' standing leases, spread over the published keys.
  std::vector<co::PrefixHost*> others{w.pub.get()};
  for (auto& h : w.extra) others.push_back(h.get());
  std::vector<std::deque<co::Lease>> standing(others.size());
  std::vector<std::size_t> next(others.size());
  auto take = [&](std::size_t o) {
    auto lease = others[o]->LookupAndAcquire(w.ns, keys[next[o]]);
    if (!lease.ok())
      Die(absl::StrCat("host ", others[o]->host_id(), ": ", lease.status().ToString()));
    standing[o].push_back(*lease);
    next[o] = (next[o] + 1) % keys.size();
  };
  for (std::size_t o = 0; o < others.size(); ++o) {
    next[o] = (o * 997) % keys.size();
    for (std::size_t j = 0; j < kStanding; ++j) take(o);
  }
  std::optional<std::uint64_t> churned;  // host 0's key from the round before
  std::vector<co::BlockRef> back;
  const std::uint64_t reclaimed0 = w.owner->stats().reclaimed;
  std::uint64_t rounds = 0;
  auto round = [&] {
    w.clock.now_ms += kGraceMs + 1;
    const std::uint64_t k = w.next_key++;
    Check(w.pub->Publish(w.ns, KeyOf(k), co::PrefixKey{}, RefOf(k)), "Publish");
    if (churned) Check(w.pub->Retire(w.ns, KeyOf(*churned)), "Retire");
    churned = k;
    for (std::size_t o = 0; o < others.size(); ++o) {
      back.clear();
      Check(others[o]->Heartbeat(&back), "Heartbeat");
      others[o]->Release(standing[o].front());
      standing[o].pop_front();
      take(o);
    }
    Check(w.reader->Heartbeat(nullptr), "Heartbeat");
    w.owner->Step();
    ++rounds;
  };
  round();
  const std::size_t runs = keys.size() / chain;
  const std::size_t per_round = std::max<std::size_t>(1, kRoundBlocks / chain);
  std::vector<co::Lease> leases;
  leases.reserve(chain);
  std::size_t r = 0, in_round = 0;
  for (auto _ : state) {
    if (in_round == per_round) {
      state.PauseTiming();
      round();
      in_round = 0;
      state.ResumeTiming();
    }
    ++in_round;
    const std::span<const co::PrefixKey> run(keys.data() + r * chain, chain);
    if (++r == runs) r = 0;
    AcquireAndRelease(*w.reader, w.ns, run, leases);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(chain));
  // Owner rounds run and entries they reclaimed (one a round once the first retire is due):
  // evidence the scans ran.
  state.counters["rounds"] = static_cast<double>(rounds);
  state.counters["reclaimed"] = static_cast<double>(w.owner->stats().reclaimed - reclaimed0);
  state.counters["leases_held"] = static_cast<double>(others.size() * kStanding);
}

// ---- the owner's step against load and hosts ---------------------------------------------------

void BM_OwnerStepVsHosts(benchmark::State& state) {
  const auto load = state.range(0);
  const auto hosts = static_cast<std::uint32_t>(state.range(1));
  World w(hosts, static_cast<std::uint32_t>(kEntries * load / 100));
  for (auto _ : state) {
    state.PauseTiming();
    w.PublishOne();
    Check(w.pub->Retire(w.ns, KeyOf(w.live.front())), "Retire");
    w.live.pop_front();
    w.clock.now_ms += kGraceMs + 1;
    std::vector<co::BlockRef> back;
    Check(w.pub->Heartbeat(&back), "Heartbeat");
    state.ResumeTiming();
    w.owner->Step();
  }
  state.counters["reclaimed"] = static_cast<double>(w.owner->stats().reclaimed);
}

}  // namespace

BENCHMARK(BM_LookupAfterChurn)
    ->ArgNames({"cycles", "hit"})
    ->Args({0, 1})
    ->Args({0, 0})
    ->Args({1000000, 1})
    ->Args({1000000, 0});
BENCHMARK(BM_AcquireVsLoad)
    ->ArgNames({"load", "chain"})
    ->ArgsProduct({{10, 30, 50, 70, 80, 90}, {1, 8, 32}});
BENCHMARK(BM_AcquireVsHosts)->ArgNames({"hosts", "chain"})->ArgsProduct({{2, 8, 64}, {1, 8, 32}});
BENCHMARK(BM_OwnerStepVsHosts)
    ->ArgNames({"load", "hosts"})
    ->ArgsProduct({{10, 50, 70, 90}, {2, 8, 64}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
