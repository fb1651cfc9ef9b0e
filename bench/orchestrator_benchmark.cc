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
//   BM_ReclaimStep          one owner step that reclaims 1,024 retired entries while 64 hosts
//                           × 256 lease rows are scanned
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/pool/region.h"
#include "orchestrator.h"

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
    auto opened = orch::Orchestrator::Open(c);
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

double RssMib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

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
    co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
    co::SteadyClock clock;
    auto host = co::PrefixHost::Join(mem, clock, 0);
    const co::Namespace ns = co::MakeNamespace("bench", "m", "l");
    absl::MutexLock l(&r.o->mu_);
    for (std::uint32_t i = 0; i < entries / 10 * 6; ++i) {
      const std::uint32_t t[] = {i};
      co::BlockRef ref{};
      ref.arena[0] = 1;
      ref.index = i;
      ref.generation = 1;
      if (!(*host)->Publish(ns, co::ChainKey(ns, co::PrefixKey{}, t), co::PrefixKey{}, ref).ok()) {
        published += r.o->owner_->ApplyRequests();
        --i;
      }
    }
    published += r.o->owner_->ApplyRequests();
    for (std::uint32_t h = 0; h < 64; ++h) {
      auto inc = r.o->state_.Join(h, "bench", 0);
      (void)r.o->state_.Grow(h, *inc, 1, 0);
    }
    if (!r.o->SaveLocked().ok()) std::abort();
    r.config.pool.clear();  // keep the files for the restarts below
    r.config.prefix_domain.clear();
    r.config.state_file.clear();
  }
  double rss = 0;
  for (auto _ : state) {
    auto o = orch::Orchestrator::Open(c);
    if (!o.ok()) {
      state.SkipWithError(std::string(o.status().message()).c_str());
      break;
    }
    rss = RssMib();
  }
  state.counters["published"] = static_cast<double>(published);
  state.counters["rss_mib"] = rss;
  co::DomainGeometry g;
  g.max_hosts = 64;
  g.index_entries = entries;
  g.lease_rows = 16;
  state.counters["domain_mib"] = static_cast<double>(co::DomainBytes(g)) / (1 << 20);
  Cleanup(c);
}

}  // namespace

BENCHMARK(BM_Join)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Heartbeat)->Setup(StartHb)->Teardown(StopHb)->Threads(1)->Threads(8)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PublishToVisible)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Recover)->ArgName("entries")->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24)
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
