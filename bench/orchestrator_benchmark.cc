// orchestrator_benchmark — cxlkv-orchestrator's control plane and owner role, measured in
// one process: the daemon (Orchestrator, gRPC on a Unix socket with peer credentials) runs
// on its own threads, clients are HostClients as host processes use them.
//
//   BM_Join                 connect + join + leave of one host (a fresh channel each time)
//   BM_Heartbeat/threads:N  heartbeat RPCs per second, N hosts beating at once
//   BM_PublishToVisible     a host posts a PUBLISH to its ring; time until another host's
//                           Lookup finds it (owner step period 1 ms)
//   BM_Recover/entries:N    restart: Orchestrator::Open of a domain with N published entries
//                           and a state file of 64 hosts holding extents; the owner's RSS
//                           after the open is reported (rss_mib), and index bytes
//   BM_ReclaimLatency       64 hosts × 256 lease rows: a RETIRE request until the block is
//                           back in its publisher's return ring, through the daemon
//   BM_OwnerIdleStep/entries:N   the owner alone (no daemon), N index entries 60 % published:
//                           one Step with nothing to do (what every 1 ms period costs)
//   BM_OwnerChurn/entries:N the same owner: publish + apply + retire of a new block, and every
//                           64 blocks a Reclaim (index and lease scan) and the returns taken
//   BM_FenceLineCheck       HA (docs/ha.md): one read of the fence line (invalidate, read,
//                           CRC), what EndBatchLocked added to every owner batch (issue #29)
//   BM_ReleaseTerm/MiB:N    HA: the release at a step-down or by the agent: the domain range
//                           written back (clwb), then the release line
//   BM_HaOwnerBatch/checks:C/publishes:P   one owner batch applying P publishes (2^20
//                           entries, 60 % full), with the HA checks as the leader runs them
//                           (C = 1: every store through FencedMem asking the election's gate
//                           — an epoch load, the sticky bit, a CLOCK_BOOTTIME reading against
//                           the deadline — and the fence line read and rewritten per batch)
//                           or without any (C = 0: the owner alone), in one run
//   BM_HostAcquire/checks:C a host's lookup + lease + release of a published block on the
//                           same domain, the owner with (C = 1) or without (C = 0) the checks:
//                           the host's path has none (the control)
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "cxlkv/orchestrator/write_deadline.h"
#include "cxlkv/pool/region.h"
#include "fence.h"

namespace {

namespace co = cxlkv::coherence;
namespace orch = cxlkv::orchestrator;

std::string Tmp() {
  static const std::string dir = [] {
    char t[] = "/tmp/cxlkv-orch-bench-XXXXXX";
    if (mkdtemp(t) == nullptr) std::abort();
    return std::string(t);
  }();
  return dir;
}

orch::Config MakeConfig(const std::string& tag, std::uint32_t index_entries, std::uint32_t max_hosts,
                        std::uint32_t lease_rows) {
  auto c = orch::ParseConfig(R"(
[domain]
pool = "memfd:?size=1G"
prefix_domain = "memfd:?size=1M"
state_file = "/dev/null"
[rpc]
socket = "/dev/null"
)", "bench");
  if (!c.ok()) std::abort();
  c->pool = "file:/dev/shm/cxlkv-orch-bench-pool-" + tag + "?size=16G&reserve=0";
  co::DomainGeometry g;
  g.max_hosts = max_hosts;
  g.index_entries = index_entries;
  g.lease_rows = lease_rows;
  c->prefix_domain = "file:/dev/shm/cxlkv-orch-bench-domain-" + tag + "?size=" +
                     std::to_string((co::DomainBytes(g) + 4095) / 4096 * 4096);
  c->max_hosts = max_hosts;
  c->index_entries = index_entries;
  c->lease_rows = lease_rows;
  c->extent_bytes = 256ull << 20;
  c->state_file = Tmp() + "/" + tag + ".state";
  c->socket = Tmp() + "/" + tag + ".sock";
  c->owner_period_ms = 1;
  c->metrics_listen = "";
  return *c;
}

void Cleanup(const orch::Config& c) {
  for (const std::string& spec : {c.pool, c.prefix_domain}) {
    if (spec.size() <= 5) continue;
    const std::string path = spec.substr(5, spec.find('?') - 5);
    unlink(path.c_str());
  }
  if (!c.state_file.empty()) unlink(c.state_file.c_str());
}

struct Running {
  orch::Config config;
  std::unique_ptr<orch::Orchestrator> o;
  explicit Running(const orch::Config& c) : config(c) {
    orch::OpenOptions fresh;
    fresh.new_domain = true;  // each run makes its own files
    auto opened = orch::Orchestrator::Open(c, fresh);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", std::string(opened.status().message()).c_str());
      std::abort();
    }
    o = *std::move(opened);
    if (!o->Start().ok()) std::abort();
  }
  ~Running() {
    o->Stop();
    o.reset();
    Cleanup(config);
  }
};

// A field of /proc/self/status in MiB ("VmRSS", "RssAnon", "RssFile", "RssShmem"): RssAnon is
// the process's private memory; the emulated pool and domain are files in /dev/shm, so what
// of them this process touched counts in RssShmem, not RssAnon.
double StatusMib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = field + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(prefix.size())) / 1024.0;
  }
  return 0;
}
double RssMib() { return StatusMib("VmRSS"); }

void BM_Join(benchmark::State& state) {
  Running r(MakeConfig("join", 4096, 8, 256));
  for (auto _ : state) {
    auto c = orch::HostClient::Connect(r.config.socket, 1);
    if (!c.ok()) {
      state.SkipWithError(std::string(c.status().message()).c_str());
      break;
    }
    (void)(*c)->Leave();
  }
}

std::unique_ptr<Running> g_hb;
void StartHb(const benchmark::State&) { g_hb = std::make_unique<Running>(MakeConfig("hb", 4096, 64, 16)); }
void StopHb(const benchmark::State&) { g_hb.reset(); }
void BM_Heartbeat(benchmark::State& state) {
  auto c = orch::HostClient::Connect(g_hb->config.socket, static_cast<std::uint32_t>(state.thread_index()));
  if (!c.ok()) {
    state.SkipWithError(std::string(c.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    if (!(*c)->HeartbeatOnce().ok()) {
      state.SkipWithError("heartbeat failed");
      break;
    }
  }
  (void)(*c)->Leave();
  state.SetItemsProcessed(state.iterations());
}

void BM_PublishToVisible(benchmark::State& state) {
  Running r(MakeConfig("pub", 1 << 16, 8, 256));
  auto dom = cxlkv::pool::OpenRegion(r.config.prefix_domain);
  co::DirectMem mem_a((*dom)->addr(), (*dom)->size_bytes()), mem_b((*dom)->addr(), (*dom)->size_bytes());
  co::SteadyClock clock;
  auto a = co::PrefixHost::Join(mem_a, clock, 0);
  auto b = co::PrefixHost::Join(mem_b, clock, 1);
  const co::Namespace ns = co::MakeNamespace("bench", "m", "l");
  std::uint32_t i = 0;
  for (auto _ : state) {
    const std::uint32_t t[] = {i};
    const co::PrefixKey key = co::ChainKey(ns, co::PrefixKey{}, t);
    co::BlockRef ref{};
    ref.arena[0] = 1;
    ref.index = i++;
    ref.generation = 1;
    if (!(*a)->Publish(ns, key, co::PrefixKey{}, ref).ok()) {
      state.SkipWithError("publish refused");
      break;
    }
    while (!(*b)->Lookup(ns, key)) {
    }
    if (i % 4096 == 0) {  // keep the index below the eviction threshold
      state.PauseTiming();
      for (std::uint32_t k = i - 4096; k < i; ++k) {
        const std::uint32_t tk[] = {k};
        (void)(*a)->Retire(ns, co::ChainKey(ns, co::PrefixKey{}, tk));
      }
      (void)(*a)->Heartbeat(nullptr);
      state.ResumeTiming();
    }
  }
}

void BM_Recover(benchmark::State& state) {
  const auto entries = static_cast<std::uint32_t>(state.range(0));
  orch::Config c = MakeConfig("recover", entries, 64, 16);
  std::uint64_t published = 0;
  {
    Running r(c);
    r.o->Stop();
    // Fill the index to 60 % through the owner directly (as applied publications would).
    auto dom = cxlkv::pool::OpenRegion(c.prefix_domain);
    co::SteadyClock clock;
    // 64 hosts post PUBLISH requests round-robin; the owner applies a full round of rings
    // at a time (as its step would), so filling 10^7 entries takes seconds, not minutes.
    std::vector<std::unique_ptr<co::DirectMem>> mems;
    std::vector<std::unique_ptr<co::PrefixHost>> hosts;
    for (std::uint32_t h = 0; h < 64; ++h) {
      mems.push_back(std::make_unique<co::DirectMem>((*dom)->addr(), (*dom)->size_bytes()));
      auto joined = co::PrefixHost::Join(*mems.back(), clock, h);
      if (!joined.ok()) std::abort();
      hosts.push_back(*std::move(joined));
    }
    const co::Namespace ns = co::MakeNamespace("bench", "m", "l");
    // The stopped orchestrator's owner and state are its core's: the fill opens its own on
    // the same domain and state file (as the orchestrator's batches and grants would leave
    // them).
    co::DirectMem owner_mem((*dom)->addr(), (*dom)->size_bytes());
    auto owner = co::PrefixOwner::Open(owner_mem, clock);
    if (!owner.ok()) std::abort();
    const std::uint32_t target = entries / 10 * 6;
    std::uint32_t next = 0;
    while (next < target) {
      for (std::uint32_t h = 0; h < 64 && next < target; ++h) {
        for (; next < target; ++next) {
          const std::uint32_t t[] = {next};
          co::BlockRef ref{};
          ref.arena[0] = static_cast<std::uint8_t>(1 + h);
          ref.index = next;
          ref.generation = 1;
          if (!hosts[h]->Publish(ns, co::ChainKey(ns, co::PrefixKey{}, t), co::PrefixKey{}, ref)
                   .ok()) {
            break;  // this host's ring is full: the next host
          }
        }
      }
      published += (*owner)->ApplyRequests();
    }
    published += (*owner)->ApplyRequests();
    orch::DomainState domain_state(c, r.o->pool_bytes());
    if (!domain_state.Load(0).ok()) std::abort();
    for (std::uint32_t h = 0; h < 64; ++h) {
      auto inc = domain_state.Join(h, "bench", 0);
      (void)domain_state.Grow(h, *inc, 1, 0);
    }
    if (!domain_state.Save().ok()) std::abort();
    r.config.pool.clear();  // keep the files for the restarts below
    r.config.prefix_domain.clear();
    r.config.state_file.clear();
  }
  double rss = 0, anon = 0, shmem = 0, file = 0, open_s = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto o = orch::Orchestrator::Open(c);
    open_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o.ok()) {
      state.SkipWithError(std::string(o.status().message()).c_str());
      break;
    }
    rss = RssMib();
    anon = StatusMib("RssAnon");
    shmem = StatusMib("RssShmem");
    file = StatusMib("RssFile");
  }
  state.counters["published"] = static_cast<double>(published);
  state.counters["rss_mib"] = rss;
  state.counters["rss_anon_mib"] = anon;  // private: what the target bounds
  state.counters["rss_shmem_mib"] = shmem;
  state.counters["rss_file_mib"] = file;
  state.counters["open_s"] = open_s;  // the last Open alone
  co::DomainGeometry g;
  g.max_hosts = 64;
  g.index_entries = entries;
  g.lease_rows = 16;
  state.counters["domain_mib"] = static_cast<double>(co::DomainBytes(g)) / (1 << 20);
  Cleanup(c);
}

// Reclaim latency through the daemon with 64 hosts: 63 simulated hosts (PrefixHosts on the
// daemon's domain, in this process) hold 256 lease rows each — the rows the owner scans
// before it may free anything — and a thread keeps them beating; host 0 publishes a block,
// retires it, and beats until the block is back in its return ring. The time per
// iteration runs from the RETIRE request to the block's return (grace_ms included).
void BM_ReclaimLatency(benchmark::State& state) {
  constexpr std::uint32_t kHosts = 64, kRows = 256;
  orch::Config c = MakeConfig("reclaim", 1 << 20, kHosts, kRows);
  Running r(c);
  auto dom = cxlkv::pool::OpenRegion(c.prefix_domain);
  co::SteadyClock clock;
  std::vector<std::unique_ptr<co::DirectMem>> mems;
  std::vector<std::unique_ptr<co::PrefixHost>> hosts;
  for (std::uint32_t h = 0; h < kHosts; ++h) {
    mems.push_back(std::make_unique<co::DirectMem>((*dom)->addr(), (*dom)->size_bytes()));
    auto joined = co::PrefixHost::Join(*mems.back(), clock, h);
    if (!joined.ok()) {
      state.SkipWithError(std::string(joined.status().message()).c_str());
      return;
    }
    hosts.push_back(*std::move(joined));
  }
  const co::Namespace ns = co::MakeNamespace("bench", "m", "l");
  auto key_of = [&](std::uint32_t i) {
    const std::uint32_t t[] = {i};
    return co::ChainKey(ns, co::PrefixKey{}, t);
  };
  auto beat_all = [&](std::uint32_t from) {
    for (std::uint32_t h = from; h < kHosts; ++h) (void)hosts[h]->Heartbeat(nullptr);
  };
  // 16,128 published blocks (hosts 1..63, 256 each), then 256 leases per host on them.
  constexpr std::uint32_t kFill = (kHosts - 1) * kRows;
  for (std::uint32_t i = 0; i < kFill;) {
    co::BlockRef ref{};
    const std::uint32_t h = 1 + i % (kHosts - 1);
    ref.arena[0] = static_cast<std::uint8_t>(h);
    ref.index = i;
    ref.generation = 1;
    if (hosts[h]->Publish(ns, key_of(i), co::PrefixKey{}, ref).ok()) {
      ++i;
    } else {
      beat_all(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // ring full: the owner applies
    }
  }
  while (!hosts[1]->Lookup(ns, key_of(kFill - 1))) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::uint64_t held = 0;
  for (std::uint32_t h = 1; h < kHosts; ++h) {
    for (std::uint32_t k = 0; k < kRows; ++k) {
      const std::uint32_t i = (h * 7919u + k * 104729u) % kFill;
      for (int attempt = 0; attempt < 100; ++attempt) {
        auto lease = hosts[h]->LookupAndAcquire(ns, key_of(i));
        if (lease.ok()) {
          ++held;
          break;
        }
        if (!absl::IsUnavailable(lease.status())) break;  // not acked yet: beat and retry
        beat_all(0);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  std::atomic<bool> stop{false};
  std::thread beater([&] {
    while (!stop.load()) {
      beat_all(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  co::PrefixHost& h0 = *hosts[0];
  std::uint32_t i = kFill;
  double total_ms = 0;
  for (auto _ : state) {
    co::BlockRef ref{};
    ref.arena[0] = 0xEE;
    ref.index = i;
    ref.generation = 1;
    const co::PrefixKey key = key_of(i++);
    while (!h0.Publish(ns, key, co::PrefixKey{}, ref).ok()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    while (!h0.Lookup(ns, key)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    (void)h0.Heartbeat(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    if (!h0.Retire(ns, key).ok()) {
      state.SkipWithError("retire refused");
      break;
    }
    bool back = false;
    while (!back) {
      std::vector<co::BlockRef> returned;
      (void)h0.Heartbeat(&returned);
      for (const co::BlockRef& b : returned) back |= b == ref;
      if (!back) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    total_ms += s * 1e3;
  }
  stop.store(true);
  beater.join();
  state.counters["grace_ms"] = c.grace_ms;
  state.counters["lease_rows_held"] = static_cast<double>(held);
  state.counters["beyond_grace_ms"] =
      state.iterations() ? total_ms / static_cast<double>(state.iterations()) - c.grace_ms : 0;
}

// The owner alone at scale, on a memfd domain: 8 hosts fill the index to 60 % through their
// rings (as BM_Recover does); the clock is the benchmark's, and TTLs are long enough that
// nobody is fenced while it moves.
class BenchClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return now; }
  std::int64_t now = 1000;
};

struct OwnerBed {
  static constexpr std::uint32_t kHosts = 8;
  std::unique_ptr<cxlkv::pool::Region> region;
  std::vector<std::unique_ptr<co::DirectMem>> mems;  // [0]: the owner's, then one per host
  BenchClock clock;
  std::unique_ptr<co::PrefixOwner> owner;
  std::vector<std::unique_ptr<co::PrefixHost>> hosts;
  const co::Namespace ns = co::MakeNamespace("bench", "m", "l");
  std::uint32_t next = 0;  // tokens (keys) used so far

  co::PrefixKey Key(std::uint32_t token) const {
    const std::uint32_t t[] = {token};
    return co::ChainKey(ns, co::PrefixKey{}, t);
  }
  static co::BlockRef Ref(std::uint32_t host, std::uint32_t index) {
    co::BlockRef ref{};
    ref.arena[0] = static_cast<std::uint8_t>(1 + host);
    ref.index = index;
    ref.generation = 1;
    return ref;
  }
  explicit OwnerBed(std::uint32_t entries) {
    co::DomainGeometry g{kHosts, entries, 16, 64, 1u << 30, 1u << 30, 10};
    const std::uint64_t bytes = (co::DomainBytes(g) + 4095) / 4096 * 4096;
    auto r = cxlkv::pool::OpenRegion("memfd:owner-bench?size=" + std::to_string(bytes));
    if (!r.ok()) std::abort();
    region = *std::move(r);
    for (std::uint32_t m = 0; m <= kHosts; ++m) {
      mems.push_back(std::make_unique<co::DirectMem>(region->addr(), region->size_bytes()));
    }
    if (!co::FormatDomain(*mems[0], g).ok()) std::abort();
    owner = std::move(*co::PrefixOwner::Open(*mems[0], clock));
    for (std::uint32_t h = 0; h < kHosts; ++h) {
      auto joined = co::PrefixHost::Join(*mems[1 + h], clock, h);
      if (!joined.ok()) std::abort();
      hosts.push_back(*std::move(joined));
    }
    owner->Step();  // acknowledges every host
    const std::uint32_t target = entries / 10 * 6;
    while (next < target) {
      for (std::uint32_t h = 0; h < kHosts && next < target; ++h) {
        for (; next < target; ++next) {
          if (!hosts[h]->Publish(ns, Key(next), co::PrefixKey{}, Ref(h, next)).ok()) break;
        }
      }
      owner->ApplyRequests();
    }
    owner->ApplyRequests();
    if (owner->published_entries() != target) std::abort();
  }
};

void BM_OwnerIdleStep(benchmark::State& state) {
  OwnerBed bed(static_cast<std::uint32_t>(state.range(0)));
  for (auto _ : state) bed.owner->Step();
  state.counters["published"] = bed.owner->published_entries();
}

void BM_OwnerChurn(benchmark::State& state) {
  OwnerBed bed(static_cast<std::uint32_t>(state.range(0)));
  co::PrefixHost& host = *bed.hosts[0];
  std::uint32_t done = 0;
  std::vector<co::BlockRef> back;
  for (auto _ : state) {
    const std::uint32_t token = bed.next++;
    const co::PrefixKey key = bed.Key(token);
    if (!host.Publish(bed.ns, key, co::PrefixKey{}, OwnerBed::Ref(0, token)).ok()) {
      state.SkipWithError("publish refused (ring full)");
      break;
    }
    bed.owner->ApplyRequests();
    if (!bed.owner->RetireKey(bed.ns, key).ok()) {
      state.SkipWithError("the block was not published");
      break;
    }
    if (++done % 64 == 0) {  // past grace: reclaim, and take (then acknowledge) the returns
      bed.clock.now += 20;
      bed.owner->Reclaim();
      back.clear();
      (void)host.Heartbeat(&back);
      (void)host.Heartbeat(nullptr);
    }
  }
  state.counters["published"] = bed.owner->published_entries();
  state.counters["reclaimed"] = static_cast<double>(bed.owner->stats().reclaimed);
}

void BM_FenceLineCheck(benchmark::State& state) {
  std::vector<std::byte> dom(4096);
  co::DirectMem mem(dom.data(), dom.size());
  co::OwnerFenceLine line{};
  line.epoch = 7;
  orch::WriteFenceLine(mem, line);
  for (auto _ : state) {
    co::OwnerFenceLine now{};
    if (!orch::ReadFenceLine(mem, &now) || now.epoch != 7) std::abort();
    benchmark::DoNotOptimize(now);
  }
}

void BM_ReleaseTerm(benchmark::State& state) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) << 20;
  std::vector<std::byte> dom(bytes);
  co::DirectMem mem(dom.data(), dom.size());
  co::OwnerReleaseLine r{};
  r.epoch = 7;
  for (auto _ : state) {
    state.PauseTiming();
    // Every line dirty, as after an owner that wrote them all and flushed none.
    for (std::uint64_t off = 0; off < bytes; off += 64) dom[off] = std::byte{1};
    state.ResumeTiming();
    orch::ReleaseTerm(mem, bytes, r);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// The election's gate as LeaderElection::WriteAllowed asks it (election.cc): a term (epoch),
// the sticky closed bit, the deadline on CLOCK_BOOTTIME. Always open here (a far deadline).
class BenchGate final : public orch::WriteGate {
 public:
  // A session whose deadline never comes: the gate's cost, never its closing.
  BenchGate() { deadline_.Start(0, std::int64_t{1} << 62, 0); }
  // As LeaderElection::WriteAllowed: an epoch, and the election's own deadline rule.
  bool WriteAllowed() const override {
    if (epoch_.load(std::memory_order_acquire) == 0) return false;
    return deadline_.Allowed(clock_.NowMs());
  }

 private:
  mutable co::SteadyClock clock_;
  std::atomic<std::int64_t> epoch_{7};
  orch::WriteDeadline deadline_;
};

// OwnerBed with its owner reopened over the HA path (checks) or left bare.
struct HaBed {
  HaBed(std::uint32_t entries, bool with_checks) : bed(entries), checks(with_checks) {
    if (!checks) return;
    fenced = std::make_unique<orch::FencedMem>(*bed.mems[0], gate);
    bed.owner.reset();
    bed.owner = std::move(*co::PrefixOwner::Open(*fenced, bed.clock));
    line.epoch = 7;
    orch::WriteFenceLine(*fenced, line);
  }
  ~HaBed() { bed.owner.reset(); }  // before the fenced Mem it stores through
  // One batch as Orchestrator's owner loop runs it: with the checks, the gate and the fence
  // line before (OwnerBatchMayRunLocked) and the line read then rewritten after
  // (EndBatchLocked).
  void Batch() {
    if (checks) {
      co::OwnerFenceLine now{};
      if (!gate.WriteAllowed() || !orch::ReadFenceLine(*fenced, &now) || now.epoch != 7) {
        std::abort();
      }
    }
    bed.owner->Step();
    if (checks) {
      co::OwnerFenceLine now{};
      if (!orch::ReadFenceLine(*fenced, &now) || now.epoch != 7) std::abort();
      ++line.batches;
      orch::WriteFenceLine(*fenced, line);
    }
  }
  OwnerBed bed;
  const bool checks;
  BenchGate gate;
  std::unique_ptr<orch::FencedMem> fenced;
  co::OwnerFenceLine line{};
};

void BM_HaOwnerBatch(benchmark::State& state) {
  HaBed ha(1u << 20, state.range(0) != 0);
  const auto publishes = static_cast<std::uint32_t>(state.range(1));
  co::PrefixHost& host = *ha.bed.hosts[0];
  std::vector<co::BlockRef> back;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<co::PrefixKey> keys;
    for (std::uint32_t p = 0; p < publishes; ++p) {
      const std::uint32_t token = ha.bed.next++;
      keys.push_back(ha.bed.Key(token));
      if (!host.Publish(ha.bed.ns, keys.back(), co::PrefixKey{}, OwnerBed::Ref(0, token)).ok()) {
        state.SkipWithError("publish refused (ring full)");
        return;
      }
    }
    state.ResumeTiming();
    ha.Batch();
    state.PauseTiming();
    for (const co::PrefixKey& k : keys) (void)ha.bed.owner->RetireKey(ha.bed.ns, k);
    if (publishes != 0) {  // keep the index at its fill: reclaim, take the returns
      ha.bed.clock.now += 20;
      ha.bed.owner->Reclaim();
      back.clear();
      (void)host.Heartbeat(&back);
      (void)host.Heartbeat(nullptr);
    }
    state.ResumeTiming();
  }
  state.counters["stores_dropped"] =
      ha.fenced != nullptr ? static_cast<double>(ha.fenced->dropped()) : 0.0;
}

void BM_HostAcquire(benchmark::State& state) {
  HaBed ha(1u << 20, state.range(0) != 0);
  co::PrefixHost& host = *ha.bed.hosts[1];
  const co::PrefixKey key = ha.bed.Key(0);  // published by OwnerBed
  for (auto _ : state) {
    auto lease = host.LookupAndAcquire(ha.bed.ns, key);
    if (!lease.ok()) {
      state.SkipWithError("no lease");
      break;
    }
    host.Release(*lease);
  }
}

}  // namespace

BENCHMARK(BM_FenceLineCheck)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_HaOwnerBatch)
    ->ArgNames({"checks", "publishes"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 16})
    ->Args({1, 16})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HostAcquire)->ArgName("checks")->Arg(0)->Arg(1)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_ReleaseTerm)->ArgName("MiB")->Arg(4)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReclaimLatency)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(20);
BENCHMARK(BM_Join)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Heartbeat)->Setup(StartHb)->Teardown(StopHb)->Threads(1)->Threads(8)->Threads(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PublishToVisible)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_OwnerIdleStep)
    ->ArgName("entries")
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OwnerChurn)
    ->ArgName("entries")
    ->Arg(1 << 20)
    ->Arg(1 << 22)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Recover)->ArgName("entries")->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24)
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
