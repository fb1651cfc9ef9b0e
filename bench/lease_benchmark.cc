// lease_benchmark — taking a lease on a shared prefix block: cxlkv's PrefixHost on shared
// memory against the way a KV-cache index built on Redis or etcd does the same, all in one
// run. Each figure is wall time per operation (UseRealTime); with N threads Google Benchmark
// divides the wall time by the operations of all N threads, so a thread's own latency is
// N times the figure.
//
//   BM_Cxlkv_LookupAcquireRelease/published:P   Lookup + Acquire + Release of a published
//       block, flushes and fences included (coherence/prefix.h on a DirectMem over a memfd
//       mapping). P blocks are published in a 4,096-entry index (64: a sparse index, one
//       probe per lookup; 2867: 70 % load, just under the owner's eviction threshold, so
//       linear probing takes longer chains). Iterations rotate over all P blocks. Each thread
//       is its own host (own PrefixHost, host id 1 + thread index, own DirectMem). The owner
//       (PrefixOwner::Step every 10 ms) runs on a thread of its own throughout, as the
//       domain's reclaimer would: it acknowledges heartbeats, without which no lease is
//       granted. Each host heartbeats every host_ttl / 8 from its benchmark loop (one thread
//       drives a PrefixHost), so that cost is in the figure, amortized.
//   BM_Redis_GetExpire/round_trips:R   GET key (the lookup) + EXPIRE key 10 (the lease) on
//       one of 64 pre-set keys with a 64-byte value, through hiredis over TCP on loopback;
//       R=2: each command waits for its reply, R=1: both pipelined in one round trip. One
//       connection per thread.
//   BM_Etcd_LeaseGrantKeepAliveRevoke   LeaseGrant(TTL 10) + one keep-alive on the client's
//       long-lived LeaseKeepAlive stream + LeaseRevoke, over gRPC (stubs generated from
//       etcd's own .proto files). One channel (HTTP/2 connection) per thread.
//
// The servers are Debian's redis-server and etcd, started by this binary on 127.0.0.1 on
// free ports with their files in a fresh directory under $TMPDIR (default /tmp), the first
// time a benchmark of theirs runs (a Setup callback), and stopped at exit; see
// peers/loopback_server.h, which also removes them if this process dies. A server that is
// not installed skips its benchmarks with the package to install. The JSON context records
// the versions of the servers and client libraries and the filesystem of etcd's data
// directory (etcd fsyncs its WAL for every grant and revoke).
#include <sys/vfs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/pool/region.h"
#include "peers/etcd_client.h"
#include "peers/loopback_server.h"
#include "peers/redis_client.h"

namespace {

using cxlkv::bench::EtcdLeaseClient;
using cxlkv::bench::LoopbackServer;
using cxlkv::bench::RedisClient;
using cxlkv::bench::ServerSpec;
using cxlkv::coherence::BlockRef;
using cxlkv::coherence::DirectMem;
using cxlkv::coherence::DomainGeometry;
using cxlkv::coherence::Hit;
using cxlkv::coherence::Lease;
using cxlkv::coherence::Namespace;
using cxlkv::coherence::PrefixHost;
using cxlkv::coherence::PrefixKey;
using cxlkv::coherence::PrefixOwner;
using cxlkv::coherence::SteadyClock;

constexpr std::uint32_t kIndexEntries = 4096;
constexpr std::int64_t kPublished[] = {64, 2867};  // index load ~1.6 % and 70 %
constexpr std::uint32_t kBlocksPerSequence = 32;   // a 512-token prompt in 16-token blocks
constexpr std::uint32_t kTokensPerBlock = 16;
constexpr auto kOwnerPeriod = std::chrono::milliseconds(10);
constexpr int kLeaseTtlS = 10;  // Redis EXPIRE and etcd LeaseGrant
constexpr int kRedisKeys = 64;
constexpr std::size_t kRedisValueBytes = 64;  // about what an index entry holds

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "lease_benchmark: %s\n", msg.c_str());
  std::abort();
}

// ---- cxlkv ----------------------------------------------------------------------------------

// One domain: a memfd mapping formatted as a 4,096-entry index, `published` blocks in it.
struct CxlkvDomain {
  std::unique_ptr<cxlkv::pool::Region> region;
  std::unique_ptr<DirectMem> owner_mem;
  SteadyClock owner_clock;
  std::unique_ptr<PrefixOwner> owner;  // stepped by the owner thread only, once set up
  Namespace ns = 0;
  std::vector<PrefixKey> keys;  // the published blocks' keys, in publish order
};
std::vector<std::unique_ptr<CxlkvDomain>> g_domains;  // one per kPublished entry
std::atomic<bool> g_owner_stop{false};
std::thread g_owner_thread;

std::unique_ptr<CxlkvDomain> MakeDomain(std::uint32_t published) {
  auto d = std::make_unique<CxlkvDomain>();
  DomainGeometry g;
  g.index_entries = kIndexEntries;
  const std::uint64_t bytes = (cxlkv::coherence::DomainBytes(g) + 4095) / 4096 * 4096;
  auto region =
      cxlkv::pool::OpenRegion(absl::StrCat("memfd:cxlkv-bench-lease-", published, "?size=", bytes));
  if (!region.ok()) Die(region.status().ToString());
  d->region = *std::move(region);
  d->owner_mem = std::make_unique<DirectMem>(d->region->addr(), d->region->size_bytes());
  if (absl::Status s = cxlkv::coherence::FormatDomain(*d->owner_mem, g); !s.ok()) {
    Die(s.ToString());
  }
  auto owner = PrefixOwner::Open(*d->owner_mem, d->owner_clock);
  if (!owner.ok()) Die(owner.status().ToString());
  d->owner = *std::move(owner);

  // Host 0 publishes (the benchmark threads are hosts 1 and 2): chains of 32 blocks, each key
  // chained from its parent's as a prompt's blocks are. The refs are distinct made-up
  // blocks: the protocol only stores and compares them.
  DirectMem pub_mem(d->region->addr(), d->region->size_bytes());
  SteadyClock pub_clock;
  auto publisher = PrefixHost::Join(pub_mem, pub_clock, 0);
  if (!publisher.ok()) Die(publisher.status().ToString());
  d->ns = cxlkv::coherence::MakeNamespace("bench-tenant", "bench-model", "fp16-l32-h8-d128");
  PrefixKey parent{};
  std::uint32_t tokens[kTokensPerBlock];
  for (std::uint32_t i = 0; i < published; ++i) {
    if (i % kBlocksPerSequence == 0) parent = PrefixKey{};
    for (std::uint32_t t = 0; t < kTokensPerBlock; ++t) tokens[t] = i * kTokensPerBlock + t;
    const PrefixKey key = cxlkv::coherence::ChainKey(d->ns, parent, tokens);
    BlockRef ref{};
    static constexpr char kArena[] = "lease-bench";
    static_assert(sizeof(kArena) <= sizeof(ref.arena));
    std::memcpy(ref.arena, kArena, sizeof(kArena));
    ref.index = i;
    ref.generation = 1;
    for (int tries = 0;; ++tries) {
      const absl::Status s = (*publisher)->Publish(d->ns, key, parent, ref);
      if (s.ok()) break;
      if (!absl::IsUnavailable(s) || tries > 100) Die(s.ToString());
      d->owner->ApplyRequests();  // ring full: let the owner catch up
    }
    d->keys.push_back(key);
    parent = key;
  }
  for (int round = 0; round < 100 && d->owner->published_entries() < published; ++round) {
    d->owner->ApplyRequests();
  }
  if (d->owner->published_entries() != published) {
    Die(absl::StrCat("owner published ", d->owner->published_entries(), " of ", published,
                     " blocks (duplicates ", d->owner->stats().duplicates, ", rejected ",
                     d->owner->stats().rejected, ")"));
  }
  for (const PrefixKey& key : d->keys) {
    if (!(*publisher)->Lookup(d->ns, key)) Die("a published block is not found by Lookup");
  }
  return d;
}

void SetUpCxlkv() {
  for (std::int64_t published : kPublished) {
    g_domains.push_back(MakeDomain(static_cast<std::uint32_t>(published)));
  }
  // The reclaimer: applies requests, acknowledges heartbeats, fences silent hosts (the
  // benchmark threads of finished runs, and the publisher), scans leases.
  g_owner_thread = std::thread([] {
    while (!g_owner_stop.load(std::memory_order_relaxed)) {
      for (auto& d : g_domains) d->owner->Step();
      std::this_thread::sleep_for(kOwnerPeriod);
    }
  });
  benchmark::AddCustomContext(
      "cxlkv_domain",
      absl::StrCat("memfd, ", kIndexEntries,
                   " index entries, default geometry otherwise; "
                   "flush ",
                   cxlkv::coherence::FlushKindName(cxlkv::coherence::ActiveFlushKind()),
                   ", invalidate ",
                   cxlkv::coherence::FlushKindName(cxlkv::coherence::ActiveInvalidateKind()),
                   "; owner Step() every ",
                   std::chrono::duration_cast<std::chrono::milliseconds>(kOwnerPeriod).count(),
                   " ms on its own thread"));
}

void TearDownCxlkv() {
  g_owner_stop = true;
  if (g_owner_thread.joinable()) g_owner_thread.join();
  g_domains.clear();
}

CxlkvDomain& DomainFor(std::int64_t published) {
  for (std::size_t i = 0; i < std::size(kPublished); ++i) {
    if (kPublished[i] == published) return *g_domains[i];
  }
  Die(absl::StrCat("no domain with ", published, " published blocks"));
}

// A freshly joined host may take leases once the owner has acknowledged one of its
// heartbeats (within one owner period).
absl::Status WaitUntilLive(PrefixHost& host, const CxlkvDomain& d) {
  for (int i = 0; i < 1000; ++i) {
    if (absl::Status s = host.Heartbeat(nullptr); !s.ok() && !absl::IsAborted(s)) return s;
    absl::StatusOr<Lease> lease = host.LookupAndAcquire(d.ns, d.keys[0]);
    if (lease.ok()) {
      host.Release(*lease);
      return absl::OkStatus();
    }
    if (!absl::IsUnavailable(lease.status())) return lease.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return absl::DeadlineExceededError("the owner did not acknowledge this host's heartbeat");
}

// One benchmark thread's host: joined, live, heartbeating every host_ttl / 8.
struct BenchHost {
  BenchHost(CxlkvDomain& d, benchmark::State& state)
      : mem(d.region->addr(), d.region->size_bytes()) {
    auto joined =
        PrefixHost::Join(mem, clock, 1 + static_cast<std::uint32_t>(state.thread_index()));
    if (!joined.ok()) {
      state.SkipWithError(joined.status().ToString().c_str());
      return;
    }
    host = *std::move(joined);
    if (absl::Status s = WaitUntilLive(*host, d); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      host.reset();
      return;
    }
    beat_ms = host->header().host_ttl_ms / 8;
    last_beat_ms = clock.NowMs();
  }
  // Heartbeat when due; a clock read per 256 calls decides. False (and the error set) if the
  // heartbeat failed.
  bool MaybeBeat(benchmark::State& state) {
    if ((++calls & 255) != 0) [[likely]] return true;
    const std::int64_t now = clock.NowMs();
    if (now - last_beat_ms < beat_ms) return true;
    if (absl::Status s = host->Heartbeat(nullptr); !s.ok()) {
      state.SkipWithError(absl::StrCat("cxlkv: Heartbeat: ", s.ToString()).c_str());
      return false;
    }
    last_beat_ms = now;
    return true;
  }
  DirectMem mem;
  SteadyClock clock;
  std::unique_ptr<PrefixHost> host;
  std::int64_t beat_ms = 0;
  std::int64_t last_beat_ms = 0;
  std::uint32_t calls = 0;
};

void BM_Cxlkv_LookupAcquireRelease(benchmark::State& state) {
  CxlkvDomain& d = DomainFor(state.range(0));
  BenchHost bh(d, state);
  if (bh.host == nullptr) return;
  PrefixHost& host = *bh.host;
  // Threads start half the key list apart.
  std::size_t k =
      (d.keys.size() / 2) * static_cast<std::size_t>(state.thread_index()) % d.keys.size();
  for (auto _ : state) {
    const PrefixKey& key = d.keys[k];
    if (++k == d.keys.size()) k = 0;
    const std::optional<Hit> hit = host.Lookup(d.ns, key);
    if (!hit) [[unlikely]] {
      state.SkipWithError("cxlkv: Lookup missed a published block");
      break;
    }
    absl::StatusOr<Lease> lease = host.Acquire(*hit);
    if (!lease.ok()) [[unlikely]] {
      state.SkipWithError(absl::StrCat("cxlkv: Acquire: ", lease.status().ToString()).c_str());
      break;
    }
    benchmark::DoNotOptimize(lease->ref);
    host.Release(*lease);
    if (!bh.MaybeBeat(state)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

// A request's prefix at once: AcquireChain over the first `chain` blocks of one published
// 32-block sequence (lookups, lease rows and re-validations each under one fence), then
// ReleaseAll. Reported per block: items are blocks.
void BM_Cxlkv_ChainLookupAcquireRelease(benchmark::State& state) {
  CxlkvDomain& d = DomainFor(state.range(0));
  const auto chain = static_cast<std::size_t>(state.range(1));
  BenchHost bh(d, state);
  if (bh.host == nullptr) return;
  PrefixHost& host = *bh.host;
  const std::size_t sequences = d.keys.size() / kBlocksPerSequence;
  std::size_t seq = sequences / 2 * static_cast<std::size_t>(state.thread_index()) % sequences;
  std::vector<Lease> leases;
  leases.reserve(chain);
  for (auto _ : state) {
    const std::span<const PrefixKey> keys(d.keys.data() + seq * kBlocksPerSequence, chain);
    if (++seq == sequences) seq = 0;
    leases.clear();
    absl::StatusOr<std::size_t> n = host.AcquireChain(d.ns, keys, &leases);
    if (!n.ok() || *n != chain) [[unlikely]] {
      state.SkipWithError(
          absl::StrCat("cxlkv: AcquireChain: ", n.ok() ? "short run" : n.status().ToString())
              .c_str());
      break;
    }
    benchmark::DoNotOptimize(leases.data());
    host.ReleaseAll(leases);
    if (!bh.MaybeBeat(state)) break;
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(chain));
  state.counters["s_per_block"] = benchmark::Counter(
      static_cast<double>(state.iterations() * static_cast<std::int64_t>(chain)),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// ---- peer servers ---------------------------------------------------------------------------

struct Peer {
  explicit Peer(const char* n) : name(n) {}
  const char* name;
  std::unique_ptr<LoopbackServer> server;
  absl::Status status = absl::UnknownError("not started");
  bool tried = false;
};
Peer g_redis{"redis"};
Peer g_etcd{"etcd"};

// Starts the peer once (later calls return at once); on failure `status` says why and its
// benchmarks skip with that message.
void StartPeer(Peer& peer, const ServerSpec& spec,
               absl::Status (*seed)(const LoopbackServer&) = nullptr) {
  if (peer.tried) return;
  peer.tried = true;
  auto server = LoopbackServer::Start(spec);
  if (!server.ok()) {
    peer.status = server.status();
    std::fprintf(stderr, "lease_benchmark: %s not started: %s\n", peer.name,
                 peer.status.ToString().c_str());
    return;
  }
  peer.server = *std::move(server);
  peer.status = seed != nullptr ? seed(*peer.server) : absl::OkStatus();
  std::fprintf(stderr, "lease_benchmark: %s (%s) pid %d on 127.0.0.1:%d, files in %s%s\n",
               peer.name, peer.server->binary_path().c_str(), peer.server->pid(),
               peer.server->port(), peer.server->dir().c_str(),
               peer.status.ok() ? "" : absl::StrCat(": ", peer.status.ToString()).c_str());
}

// The first line `binary --version` prints, or why there is none.
std::string VersionOf(const std::string& binary) {
  auto path = cxlkv::bench::FindInPath(binary);
  if (!path.ok()) return path.status().ToString();
  FILE* p = ::popen(absl::StrCat(*path, " --version 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  char line[256] = {};
  if (std::fgets(line, sizeof(line), p) == nullptr) line[0] = '\0';
  ::pclose(p);
  std::string v = line;
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  return absl::StrCat(*path, ": ", v);
}

// {{"--flag", "value"}, ...} -> {"--flag", "value", ...}
std::vector<std::string> FlagArgs(
    std::initializer_list<std::pair<std::string, std::string>> flags) {
  std::vector<std::string> args;
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    args.push_back(value);
  }
  return args;
}

std::string RedisKey(int i) { return absl::StrCat("cxlkv:prefix:", i); }

ServerSpec RedisSpec() {
  ServerSpec s;
  s.name = "redis";
  s.binary = "redis-server";
  s.debian_package = "redis-server";
  s.args = [](const std::string& dir, const std::vector<int>& ports) {
    return FlagArgs({{"--port", std::to_string(ports[0])},
                     {"--bind", "127.0.0.1"},
                     {"--save", ""},  // no RDB snapshots
                     {"--appendonly", "no"},
                     {"--dir", dir},
                     {"--daemonize", "no"},
                     {"--logfile", ""}});  // stdout: the launcher's server.log
  };
  s.ready = [](int port) -> absl::Status {
    auto c = RedisClient::Connect(port);
    if (!c.ok()) return c.status();
    return (*c)->Ping();
  };
  return s;
}

absl::Status SeedRedis(const LoopbackServer& server) {
  auto c = RedisClient::Connect(server.port());
  if (!c.ok()) return c.status();
  for (int i = 0; i < kRedisKeys; ++i) {
    if (absl::Status s = (*c)->Set(RedisKey(i), std::string(kRedisValueBytes, 'v')); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

void StartRedis(const benchmark::State&) { StartPeer(g_redis, RedisSpec(), &SeedRedis); }

ServerSpec EtcdSpec() {
  ServerSpec s;
  s.name = "etcd";
  s.binary = "etcd";
  s.debian_package = "etcd-server";
  s.ports = 2;  // client, peer
  s.args = [](const std::string& dir, const std::vector<int>& ports) {
    const std::string client = absl::StrCat("http://127.0.0.1:", ports[0]);
    const std::string peer = absl::StrCat("http://127.0.0.1:", ports[1]);
    return FlagArgs({{"--name", "cxlkv-bench"},
                     {"--data-dir", dir + "/data"},
                     {"--listen-client-urls", client},
                     {"--advertise-client-urls", client},
                     {"--listen-peer-urls", peer},
                     {"--initial-advertise-peer-urls", peer},
                     {"--initial-cluster", "cxlkv-bench=" + peer},
                     {"--initial-cluster-state", "new"},
                     {"--logger", "zap"},
                     {"--log-outputs", "stderr"},
                     {"--log-level", "warn"}});
  };
  s.ready = [](int port) -> absl::Status {
    auto c = EtcdLeaseClient::Connect(port);
    if (!c.ok()) return c.status();
    return (*c)->ServerVersion().status();
  };
  return s;
}

void StartEtcd(const benchmark::State&) { StartPeer(g_etcd, EtcdSpec()); }

void BM_Redis_GetExpire(benchmark::State& state) {
  if (!g_redis.status.ok()) {
    state.SkipWithError(absl::StrCat("redis: ", g_redis.status.ToString()).c_str());
    return;
  }
  auto client = RedisClient::Connect(g_redis.server->port());
  if (!client.ok()) {
    state.SkipWithError(client.status().ToString().c_str());
    return;
  }
  std::vector<std::string> keys;
  for (int i = 0; i < kRedisKeys; ++i) keys.push_back(RedisKey(i));
  const bool pipelined = state.range(0) == 1;
  std::size_t k = (keys.size() / 2) * static_cast<std::size_t>(state.thread_index());
  for (auto _ : state) {
    const std::string& key = keys[k % keys.size()];
    ++k;
    absl::StatusOr<std::size_t> bytes = pipelined ? (*client)->GetExpirePipelined(key, kLeaseTtlS)
                                                  : (*client)->GetExpire(key, kLeaseTtlS);
    if (!bytes.ok()) [[unlikely]] {
      state.SkipWithError(bytes.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(*bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Etcd_LeaseGrantKeepAliveRevoke(benchmark::State& state) {
  if (!g_etcd.status.ok()) {
    state.SkipWithError(absl::StrCat("etcd: ", g_etcd.status.ToString()).c_str());
    return;
  }
  auto client = EtcdLeaseClient::Connect(g_etcd.server->port());
  if (!client.ok()) {
    state.SkipWithError(client.status().ToString().c_str());
    return;
  }
  EtcdLeaseClient& c = **client;
  // Opens the keep-alive stream before timing starts, as a long-running client has it open.
  if (auto id = c.Grant(kLeaseTtlS);
      !id.ok() || !c.KeepAliveOnce(*id).ok() || !c.Revoke(*id).ok()) {
    state.SkipWithError("etcd: the warm-up lease grant/keep-alive/revoke failed");
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<std::int64_t> id = c.Grant(kLeaseTtlS);
    if (!id.ok()) [[unlikely]] {
      state.SkipWithError(id.status().ToString().c_str());
      break;
    }
    absl::Status s = c.KeepAliveOnce(*id);
    if (s.ok()) s = c.Revoke(*id);
    if (!s.ok()) [[unlikely]] {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// "<dir> (<filesystem>)" for the directory the servers' files go to.
std::string TempDirDescription() {
  const std::string dir = std::filesystem::temp_directory_path().string();
  struct statfs fs {};
  std::string type = "?";
  if (::statfs(dir.c_str(), &fs) == 0) {
    switch (static_cast<unsigned long>(fs.f_type)) {
      case 0xEF53:
        type = "ext2/3/4";
        break;
      case 0x01021994:
        type = "tmpfs";
        break;
      case 0x58465342:
        type = "xfs";
        break;
      case 0x9123683E:
        type = "btrfs";
        break;
      case 0x794C7630:
        type = "overlayfs";
        break;
      default:
        type = absl::StrCat("f_type 0x", absl::Hex(fs.f_type));
    }
  }
  return absl::StrCat(dir, " (", type, ")");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("redis_server", VersionOf("redis-server"));
  benchmark::AddCustomContext("etcd_server", VersionOf("etcd"));
  benchmark::AddCustomContext("redis_client", RedisClient::Version());
  benchmark::AddCustomContext("etcd_client", EtcdLeaseClient::Version());
  benchmark::AddCustomContext("server_files", TempDirDescription());
  SetUpCxlkv();

  benchmark::RegisterBenchmark("BM_Cxlkv_LookupAcquireRelease", &BM_Cxlkv_LookupAcquireRelease)
      ->ArgName("published")
      ->Arg(kPublished[0])
      ->Arg(kPublished[1])
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Cxlkv_ChainLookupAcquireRelease",
                               &BM_Cxlkv_ChainLookupAcquireRelease)
      ->ArgNames({"published", "chain"})
      ->Args({kPublished[0], 32})
      ->Args({kPublished[1], 1})
      ->Args({kPublished[1], 8})
      ->Args({kPublished[1], 32})
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Redis_GetExpire", &BM_Redis_GetExpire)
      ->ArgName("round_trips")
      ->Arg(2)
      ->Arg(1)
      ->Setup(&StartRedis)
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_Etcd_LeaseGrantKeepAliveRevoke",
                               &BM_Etcd_LeaseGrantKeepAliveRevoke)
      ->Setup(&StartEtcd)
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  TearDownCxlkv();
  g_redis.server.reset();
  g_etcd.server.reset();
  return 0;
}
