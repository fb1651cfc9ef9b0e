// directory_benchmark: lookup latency of the cross-domain prefix directory (docs/ha.md).
//
//   BM_FilterMayContain/bytes:B     one domain's Bloom filter, in memory
//   BM_ReaderWhere/domains:D        DirectoryReader::Where over D domains' summaries, from the
//                                   reader's watch-fed cache (what an orchestrator answers from)
//   BM_ReaderRefresh/domains:D      one range read of every summary from etcd and their decode
//                                   (what cxlkvctl where --etcd does per call, channel aside)
//   BM_CApiWhere/domains:D          cxlkv_directory_where through a real cxlkv-orchestrator's
//                                   Directory RPC on its Unix socket (what C and Python see;
//                                   D domains plus the orchestrator's own)
//
// The binary starts a one-member etcd 3.4 (Debian's etcd-server) on loopback in a temporary
// directory and, for BM_CApiWhere, one cxlkv-orchestrator with [etcd] on /dev/shm files. Each
// domain's summary is written as its leader would: a filter sized for 65,536 keys at 1%
// holding 50,000 published keys (78 KiB). Without /usr/bin/etcd every benchmark skips.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/directory.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/etcd.h"

extern char** environ;

namespace {

namespace dir = ::cxlkv::orchestrator::directory;
namespace ed = ::cxlkv::orchestrator::etcd;
using Key = ::cxlkv::coherence::PrefixKey;

constexpr std::uint64_t kPublished = 50000;
constexpr std::uint64_t kSizedFor = 65536;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (std::string& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, a[0].c_str(), &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

struct World {
  std::string tmp, endpoint, why;
  pid_t etcd = -1, orch = -1;
  std::string socket;
  std::unique_ptr<ed::Client> client;
  std::map<std::string, int> domains;  // per cluster name

  bool Up() const { return why.empty(); }

  World() {
    if (::access("/usr/bin/etcd", X_OK) != 0) {
      why = "no /usr/bin/etcd (apt-get install etcd-server)";
      return;
    }
    char t[] = "/tmp/cxlkv-dirbench-XXXXXX";
    tmp = ::mkdtemp(t);
    const int cport = FreePort(), pport = FreePort();
    endpoint = absl::StrCat("127.0.0.1:", cport);
    const std::string c = absl::StrCat("http://", endpoint);
    const std::string p = absl::StrCat("http://127.0.0.1:", pport);
    etcd = Spawn(
        {"/usr/bin/etcd", "--name", "b", "--data-dir", tmp + "/etcd", "--listen-client-urls", c,
         "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
         "--initial-cluster", "b=" + p, "--log-level", "warn"},
        tmp + "/etcd.log");
    ed::ClientOptions o;
    o.endpoints = {endpoint};
    client = *ed::Client::Create(o);
    for (int i = 0; i < 300; ++i) {
      if (client->Get("/x").ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    why = "etcd did not come up (log in " + tmp + "/etcd.log)";
  }
  ~World() {
    for (pid_t p : {orch, etcd}) {
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
    ::unlink(("/dev/shm/cxlkv-dirbench-pool" + std::to_string(::getpid())).c_str());
    ::unlink(("/dev/shm/cxlkv-dirbench-dom" + std::to_string(::getpid())).c_str());
    if (!tmp.empty()) std::system(("rm -rf " + tmp).c_str());
  }

  // n domains' summaries in cluster "c<n>", as their leaders would write them (no lease here).
  std::string EnsureDomains(int n) {
    const std::string cluster = absl::StrCat("c", n);
    std::mt19937_64 rng(7);
    for (int& have = domains[cluster]; have < n; ++have) {
      dir::Summary s;
      s.domain = absl::StrCat("rack-", have);
      s.epoch = 1;
      s.published = kPublished;
      s.anchors = kPublished;
      s.built_unix_ms = 1;
      s.filter = dir::BloomFilter(dir::SizeFor(kSizedFor, 0.01));
      for (std::uint64_t i = 0; i < kPublished; ++i) s.filter.Add(Key{rng(), rng()});
      (void)client->Put(dir::SummaryKey(cluster, s.domain), dir::EncodeSummary(s));
    }
    return cluster;
  }

  // One orchestrator with [etcd] (domain "bench-orch" in `cluster`), for the C API's RPC path.
  bool EnsureOrchestrator(const std::string& cluster) {
    if (orch > 0) return true;
    const std::string pid = std::to_string(::getpid());
    socket = tmp + "/o.sock";
    const std::string config = tmp + "/domain.toml";
    std::ofstream(config) << "[domain]\nname = \"bench-orch\"\n"
                          << "pool = \"file:/dev/shm/cxlkv-dirbench-pool" << pid
                          << "?size=64M&reserve=0\"\n"
                          << "prefix_domain = \"file:/dev/shm/cxlkv-dirbench-dom" << pid
                          << "?size=4M\"\nextent_size = \"8M\"\nstate_file = \"" << tmp
                          << "/d.state\"\n[rpc]\nsocket = \"" << socket << "\"\n"
                          << "[metrics]\nlisten = \"\"\n[etcd]\nendpoints = [\"" << endpoint
                          << "\"]\ncluster = \"" << cluster << "\"\n";
    orch = Spawn({CXLKV_ORCHESTRATOR_BIN, "--config", config, "--new-domain"}, tmp + "/orch.log");
    for (int i = 0; i < 200; ++i) {
      Key k{1, 2};
      cxlkv_prefix_key ck{k.lo, k.hi};
      if (cxlkv_directory_where(socket.c_str(), &ck, nullptr, 0, nullptr) == CXLKV_OK) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

World& TheWorld() {
  static World w;
  return w;
}

std::vector<Key> Probes() {
  std::mt19937_64 rng(99);
  std::vector<Key> v(4096);
  for (auto& k : v) k = Key{rng(), rng()};
  return v;
}

void BM_FilterMayContain(benchmark::State& state) {
  dir::BloomFilter f(dir::SizeFor(kSizedFor, 0.01));
  std::mt19937_64 rng(7);
  for (std::uint64_t i = 0; i < kPublished; ++i) f.Add(Key{rng(), rng()});
  const auto probes = Probes();
  std::size_t i = 0, hits = 0;
  for (auto _ : state) {
    hits += f.MayContain(probes[i++ & 4095]) ? 1 : 0;
  }
  benchmark::DoNotOptimize(hits);
  state.counters["filter_bytes"] = static_cast<double>(f.bytes());
}
BENCHMARK(BM_FilterMayContain);

void BM_ReaderWhere(benchmark::State& state) {
  World& w = TheWorld();
  if (!w.Up()) return state.SkipWithError(w.why.c_str());
  dir::ReaderOptions o;
  o.cluster = w.EnsureDomains(static_cast<int>(state.range(0)));
  o.client.endpoints = {w.endpoint};
  auto r = dir::DirectoryReader::Open(o);
  if (!r.ok()) return state.SkipWithError(std::string(r.status().message()).c_str());
  const auto probes = Probes();
  std::size_t i = 0;
  for (auto _ : state) {
    auto a = (*r)->Where(probes[i++ & 4095]);
    benchmark::DoNotOptimize(a);
  }
  state.counters["domains"] = static_cast<double>((*r)->Domains().size());
}
BENCHMARK(BM_ReaderWhere)->ArgName("domains")->Arg(2)->Arg(8)->Arg(32);

void BM_ReaderRefresh(benchmark::State& state) {
  World& w = TheWorld();
  if (!w.Up()) return state.SkipWithError(w.why.c_str());
  dir::ReaderOptions o;
  o.cluster = w.EnsureDomains(static_cast<int>(state.range(0)));
  o.client.endpoints = {w.endpoint};
  o.follow = false;
  auto r = dir::DirectoryReader::Open(o);
  if (!r.ok()) return state.SkipWithError(std::string(r.status().message()).c_str());
  for (auto _ : state) {
    if (!(*r)->Refresh().ok()) return state.SkipWithError("range read failed");
  }
  state.counters["domains"] = static_cast<double>((*r)->Domains().size());
}
BENCHMARK(BM_ReaderRefresh)->ArgName("domains")->Arg(2)->Arg(8)->Arg(32)->UseRealTime();

void BM_CApiWhere(benchmark::State& state) {
  World& w = TheWorld();
  if (!w.Up()) return state.SkipWithError(w.why.c_str());
  if (!w.EnsureOrchestrator(w.EnsureDomains(static_cast<int>(state.range(0))))) {
    return state.SkipWithError(("the orchestrator did not answer; log in " + w.tmp).c_str());
  }
  const auto probes = Probes();
  std::vector<char> buf(1 << 16);
  std::size_t i = 0;
  for (auto _ : state) {
    const Key k = probes[i++ & 4095];
    cxlkv_prefix_key ck{k.lo, k.hi};
    if (cxlkv_directory_where(w.socket.c_str(), &ck, buf.data(), buf.size(), nullptr) != CXLKV_OK) {
      return state.SkipWithError(cxlkv_last_error());
    }
  }
}
// One orchestrator per run (the first cluster asked for): the summaries of 32 domains.
BENCHMARK(BM_CApiWhere)->ArgName("domains")->Arg(32)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
