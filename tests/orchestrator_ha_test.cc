// Orchestrator HA (docs/ha.md) with real processes: a 3-member etcd cluster on loopback
// (tests/etcd_cluster.h) and several cxlkv-orchestrator processes of one domain, each with its
// own socket and state-file cache, sharing the pool and the prefix domain. Hosts are played by
// the test through the control-plane stub (join, grow, heartbeat).
//
// Checks after each failure: one leader serves grants, the state (membership, extents)
// survived, no extent is lent twice, and an audit of the domain's fence line (sampled every
// millisecond from the shared file) shows no epoch writing after a newer one started.
//
// Skipped without Debian's etcd-server. CXLKV_HA_TRIALS sets the failover trials of the
// measurement (default 3; the stress label runs 20 and prints the median and worst).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/coherence/sim.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "cxlkv/orchestrator/directory_client.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/operator_client.h"
#include "cxlkv/orchestrator/token.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "fence.h"
#include "gtest/gtest.h"
#include "ha/extent_audit.h"
#include "ha/fence_file.h"
#include "nlohmann/json.hpp"
#include "orchestrator.grpc.pb.h"
#include "orchestrator_process.h"
#include "state_write.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;
namespace orch = ::cxlkv::orchestrator;
using std::chrono::milliseconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The domain's files, shared by every orchestrator of a test.
struct SharedDomain {
  SharedDomain() {
    const std::string tag = absl::StrCat(::getpid(), "-", NowMs());
    pool = "/dev/shm/cxlkv-ha-pool-" + tag;
    domain = "/dev/shm/cxlkv-ha-domain-" + tag;
  }
  ~SharedDomain() {
    ::unlink(pool.c_str());
    ::unlink(domain.c_str());
  }
  std::string pool, domain;
};

// Runs a shell command; its exit status, and its output in *out.
int Sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[1024];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  const int rc = ::pclose(p);
  if (out != nullptr) *out = text;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// One cxlkv-orchestrator process of the domain (tests/orchestrator_process.h) with [etcd] in
// its config: a directory of its own, stdout and stderr in <dir>/log, kill -9 at teardown.
class HaOrchestrator : public OrchestratorProcess {
 public:
  HaOrchestrator(const SharedDomain& d, const EtcdCluster& etcd, const std::string& name,
                 std::uint32_t ttl_s = 3, std::uint32_t capacity_lease_ms = 60000,
                 int metrics_port = 0, std::uint32_t max_hosts = 4,
                 const std::string& tcp_token_file = "")
      : OrchestratorProcess(Config(d, etcd, name, ttl_s, capacity_lease_ms, metrics_port, max_hosts,
                                   tcp_token_file)) {}

  // Starts the process and waits until its socket accepts connections (it is up, as a
  // candidate). False if it exited (its log says why; exit_status has its wait status).
  bool Start(bool new_domain = false) {
    command_prefix.clear();
    // Under another host name (a UTS namespace): what an orchestrator on another host looks
    // like to a host that finds it in etcd.
    if (!hostname.empty()) {
      const std::string rename = "hostname \"$0\" && exec \"$@\"";
      command_prefix = {"/usr/bin/unshare", "--uts", "--", "/bin/sh", "-c", rename, hostname};
    }
    // In a network namespace: `ip netns exec` joins it and execs the orchestrator (same pid).
    if (!netns.empty()) {
      command_prefix.insert(command_prefix.end(), {"/usr/sbin/ip", "netns", "exec", netns});
    }
    return Launch(new_domain) == Launched::kUp;
  }
  // Sends `sig`; SIGKILL and SIGTERM also reap the process (whatever its exit status).
  void Kill(int sig) {
    if (sig == SIGKILL || sig == SIGTERM) {
      (void)Reap(sig);
    } else {
      Signal(sig);
    }
  }

  // The port of its LMCache coordinator, from its start-up line (0: not in the log).
  int LmcachePort() const {
    const std::string text = ReadFile(log);
    const std::string mark = "lmcache coordinator on http://127.0.0.1:";
    const std::size_t at = text.find(mark);
    return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + mark.size());
  }

  // Status with a short deadline ("" role if it does not answer).
  pb::StatusReply Status() const {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(500));
    pb::StatusReply r;
    if (!Stub()->Status(&ctx, pb::StatusRequest{}, &r).ok()) r.set_role("");
    return r;
  }
  std::string Role() const { return Status().role(); }
  // Replaces the config's etcd.endpoints (a TOML list), before Start.
  void SetEtcdEndpoints(const std::string& list) {
    std::string text = ReadFile(config);
    const auto at = text.find("\nendpoints = ");
    const auto end = text.find('\n', at + 1);
    text.replace(at + 1, end - at - 1, "endpoints = " + list);
    std::ofstream(config, std::ios::trunc) << text;
  }
  // Adds a line to the config's last section ([etcd]), before Start.
  void AppendToEtcdSection(const std::string& line) { AppendConfig(line + "\n"); }

  const std::string& config_path() const { return config; }

  std::string netns;     // run in this network namespace ("" : the test's)
  std::string hostname;  // run under this host name (a UTS namespace; "" : the test's)

 private:
  static OrchestratorConfig Config(const SharedDomain& d, const EtcdCluster& etcd,
                                   const std::string& name, std::uint32_t ttl_s,
                                   std::uint32_t capacity_lease_ms, int metrics_port,
                                   std::uint32_t max_hosts, const std::string& tcp_token_file) {
    // More hosts: smaller extents (the pool stays 256 MiB) and room for their rings.
    const bool many = max_hosts > 4;
    OrchestratorConfig c;
    c.name = "hatest";
    c.pool_file = d.pool;
    c.domain_file = d.domain;
    c.pool_params = "size=256M&reserve=0";
    c.domain_params = many ? "size=32M" : "size=4M";
    c.extent_size = many ? "2M" : "8M";
    c.max_hosts = max_hosts;
    if (!tcp_token_file.empty()) {
      c.rpc_extra = "tcp = \"127.0.0.1:0\"\ntoken_file = \"" + tcp_token_file + "\"\n";
    }
    if (metrics_port > 0) c.metrics_listen = "127.0.0.1:" + std::to_string(metrics_port);
    // Hosts (the test) do not heartbeat between calls: long TTLs.
    c.timing = absl::StrCat(
        "lease_ttl_ms = 500\nhost_ttl_ms = ", std::min<std::uint32_t>(60000, capacity_lease_ms),
        "\nheartbeat_period_ms = 100\ngrace_ms = 50\n", "capacity_lease_ms = ", capacity_lease_ms,
        "\n");
    // [etcd] last: AppendToEtcdSection adds to it.
    c.sections =
        absl::StrCat("[capacity]\ndefault_share = 1.0\n[etcd]\nendpoints = ", etcd.EndpointsToml(),
                     "\nnode = \"", name, "\"\nttl_s = ", ttl_s, "\n");
    c.teardown_signal = SIGKILL;
    return c;
  }
};

// GET http://127.0.0.1:port/metrics ("" when nothing answers).
std::string Metrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// One HTTP/1.0 request to 127.0.0.1:port with a bearer token ("" : none): the status (0: no
// answer) and the body.
std::pair<int, std::string> Http(int port, const std::string& method, const std::string& path,
                                 const std::string& token, const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    std::string req = absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    if (!token.empty()) absl::StrAppend(&req, "Authorization: Bearer ", token, "\r\n");
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n\r\n", body);
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const std::size_t sp = out.find(' '), end = out.find("\r\n\r\n");
  if (sp == std::string::npos || end == std::string::npos) return {0, ""};
  return {std::atoi(out.c_str() + sp + 1), out.substr(end + 4)};
}

// The value of a metric line that starts with `name` followed by a space (-1: absent).
double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return -1;
}

// `cxlkvctl ARGS`: its standard output.
std::string Ctl(const std::string& args) {
  std::string out;
  FILE* p = ::popen((std::string(CXLKV_CTL_BIN) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// Host-side calls through a stub, with a deadline.
struct HostCalls {
  static grpc::Status Join(const HaOrchestrator& o, std::uint32_t host, std::uint64_t* inc) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(2000));
    pb::JoinRequest req;
    req.set_host_id(host);
    req.set_hostname("h" + std::to_string(host));
    pb::JoinReply rep;
    const grpc::Status st = o.Stub()->Join(&ctx, req, &rep);
    if (st.ok()) *inc = rep.incarnation();
    return st;
  }
  static grpc::Status Grow(const HaOrchestrator& o, std::uint32_t host, std::uint64_t inc,
                           std::uint32_t n, std::vector<std::uint32_t>* got) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(2000));
    pb::GrowRequest req;
    req.set_host_id(host);
    req.set_incarnation(inc);
    req.set_extents(n);
    pb::GrowReply rep;
    const grpc::Status st = o.Stub()->Grow(&ctx, req, &rep);
    for (const auto& e : rep.granted()) got->push_back(e.index());
    return st;
  }
  static grpc::Status Heartbeat(const HaOrchestrator& o, std::uint32_t host, std::uint64_t inc,
                                pb::HeartbeatReply* rep) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(2000));
    pb::HeartbeatRequest req;
    req.set_host_id(host);
    req.set_incarnation(inc);
    return o.Stub()->Heartbeat(&ctx, req, rep);
  }
  // Joins `host` at `o` and grows it by `n` extents: its incarnation in *inc, the extents
  // added to *granted.
  static ::testing::AssertionResult JoinAndGrow(const HaOrchestrator& o, std::uint32_t host,
                                                std::uint32_t n, std::uint64_t* inc,
                                                std::set<std::uint32_t>* granted) {
    if (const grpc::Status st = Join(o, host, inc); !st.ok()) {
      return ::testing::AssertionFailure()
             << "host " << host << " could not join " << o.socket << ": " << st.error_message();
    }
    std::vector<std::uint32_t> got;
    if (const grpc::Status st = Grow(o, host, *inc, n, &got); !st.ok()) {
      return ::testing::AssertionFailure()
             << "host " << host << " could not grow at " << o.socket << ": " << st.error_message();
    }
    granted->insert(got.begin(), got.end());
    return ::testing::AssertionSuccess();
  }
  static std::vector<pb::Extent> Extents(const HaOrchestrator& o) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(2000));
    pb::ExtentsReply rep;
    EXPECT_TRUE(o.Stub()->Extents(&ctx, pb::ExtentsRequest{}, &rep).ok());
    return {rep.extents().begin(), rep.extents().end()};
  }
};

// Samples the domain's fence line from the shared file every millisecond: the audit of which
// epoch wrote the domain when.
class FenceAudit {
 public:
  explicit FenceAudit(const std::string& domain_file) {
    fd_ = ::open(domain_file.c_str(), O_RDONLY);
    EXPECT_GE(fd_, 0) << domain_file;
    base_ = static_cast<const std::byte*>(::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd_, 0));
    EXPECT_NE(base_, MAP_FAILED);
    thread_ = std::thread([this] { Run(); });
  }
  ~FenceAudit() {
    stop_ = true;
    thread_.join();
    ::munmap(const_cast<std::byte*>(base_), 4096);
    ::close(fd_);
  }

  struct Sample {
    std::int64_t at_ms;
    std::uint64_t epoch, batches;
    std::uint64_t released;  // the release line's epoch (0: none)
    std::int64_t took_over_ms = 0;
  };
  // Every change seen (epoch or batch count), in time order.
  std::vector<Sample> samples() {
    absl::MutexLock l(&mu_);
    return samples_;
  }
  // The first epoch that wrote after a newer one had written: 0 when none did.
  std::uint64_t Regression() {
    std::uint64_t newest = 0;
    for (const Sample& s : samples()) {
      if (s.epoch < newest) return s.epoch;
      newest = std::max(newest, s.epoch);
    }
    return 0;
  }
  // An epoch that named two terms (two takeovers): 0 when none did.
  std::uint64_t EpochOfTwoTerms() {
    std::map<std::uint64_t, std::int64_t> took_over;
    for (const Sample& s : samples()) {
      auto [it, fresh] = took_over.emplace(s.epoch, s.took_over_ms);
      if (!fresh && it->second != s.took_over_ms) return s.epoch;
    }
    return 0;
  }
  std::uint64_t LastEpoch() {
    absl::MutexLock l(&mu_);
    return samples_.empty() ? 0 : samples_.back().epoch;
  }
  // Batches written by `epoch` after time t (ms).
  std::uint64_t BatchesAfter(std::uint64_t epoch, std::int64_t t) {
    std::uint64_t first = 0, last = 0;
    bool any = false;
    for (const Sample& s : samples()) {
      if (s.epoch != epoch || s.at_ms < t) continue;
      if (!any) first = s.batches;
      last = s.batches;
      any = true;
    }
    return any ? last - first + 1 : 0;
  }
  // When the fence line first named `epoch`, and when the release line first named it (-1:
  // never).
  std::int64_t FirstWrittenMs(std::uint64_t epoch) {
    for (const Sample& s : samples()) {
      if (s.epoch == epoch) return s.at_ms;
    }
    return -1;
  }
  std::int64_t FirstReleasedMs(std::uint64_t epoch) {
    for (const Sample& s : samples()) {
      if (s.released == epoch) return s.at_ms;
    }
    return -1;
  }

 private:
  void Run() {
    co::OwnerFenceLine prev{};
    std::uint64_t prev_released = 0;
    while (!stop_.load()) {
      co::OwnerFenceLine l;
      std::memcpy(&l, base_ + co::kOwnerFenceOffset, sizeof(l));
      co::OwnerReleaseLine r;
      std::memcpy(&r, base_ + co::kOwnerReleaseOffset, sizeof(r));
      const std::uint64_t released = co::LineValid(r) ? r.epoch : prev_released;
      if (co::LineValid(l) &&
          (l.epoch != prev.epoch || l.batches != prev.batches || released != prev_released)) {
        absl::MutexLock lock(&mu_);
        samples_.push_back(Sample{NowMs(), l.epoch, l.batches, released, l.took_over_ms});
        prev = l;
        prev_released = released;
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

  int fd_ = -1;
  const std::byte* base_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
};

// No extent is held by two hosts, and every extent a host was granted is still its own.
void ExpectNoExtentLentTwice(const HaOrchestrator& leader,
                             const std::map<std::uint32_t, std::set<std::uint32_t>>& granted) {
  std::map<std::uint32_t, std::uint32_t> holder;
  for (const auto& [host, extents] : granted) {
    for (std::uint32_t e : extents) {
      EXPECT_TRUE(holder.emplace(e, host).second)
          << "extent " << e << " was granted to host " << holder[e] << " and to host " << host;
    }
  }
  for (const pb::Extent& e : HostCalls::Extents(leader)) {
    auto it = holder.find(e.index());
    if (it == holder.end()) continue;
    EXPECT_EQ(e.state(), "assigned") << "extent " << e.index();
    EXPECT_EQ(e.host_id(), it->second) << "extent " << e.index();
  }
}

// Starts `first` on a new domain and waits until it leads (10 s), then starts each of
// `standbys` on the same domain: candidates, standing by while `first` leads.
::testing::AssertionResult StartLeaderAndStandbys(HaOrchestrator& first,
                                                  std::initializer_list<HaOrchestrator*> standbys) {
  if (!first.Start(/*new_domain=*/true)) {
    return ::testing::AssertionFailure()
           << "the orchestrator in " << first.dir << " did not start on a new domain";
  }
  if (!Eventually([&] { return first.Role() == "leader"; }, milliseconds(10000))) {
    return ::testing::AssertionFailure()
           << "the orchestrator in " << first.dir << " did not become the leader within 10 s";
  }
  for (HaOrchestrator* o : standbys) {
    if (!o->Start()) {
      return ::testing::AssertionFailure() << "the standby in " << o->dir << " did not start";
    }
  }
  return ::testing::AssertionSuccess();
}

// Asks each live orchestrator of `all` in turn to grow `host` (incarnation `inc`) by one
// extent until one serves it, within `limit`: that one, or nullptr; what it granted in *got.
HaOrchestrator* FirstToGrant(const std::vector<HaOrchestrator*>& all, std::uint32_t host,
                             std::uint64_t inc, milliseconds limit,
                             std::vector<std::uint32_t>* got) {
  HaOrchestrator* served = nullptr;
  Eventually(
      [&] {
        for (HaOrchestrator* o : all) {
          if (o->pid <= 0) continue;
          got->clear();
          if (HostCalls::Grow(*o, host, inc, 1, got).ok()) {
            served = o;
            return true;
          }
        }
        return false;
      },
      limit);
  return served;
}

// A host riding out a failover: heartbeats until one is acknowledged (only a leader answers)
// within 15 s, expecting its extents valid at every try.
bool Reattached(orch::HostClient& host) {
  return Eventually(
      [&] {
        EXPECT_TRUE(host.ExtentsValid()) << "extents invalid during the failover";
        return host.HeartbeatOnce().ok();
      },
      milliseconds(15000));
}

// The spec of a host that finds the domain's leader in etcd: etcd://EP,EP,EP/`path`.
// The config of an orchestrator the test runs in its own process (Orchestrator::Open): domain
// `name`, a 64 MiB pool file and a 4 MiB domain file in `dir`, 16 MiB extents, 1024 index
// entries, 4 hosts, its socket and state in `dir`, no metrics; then `extra` (whole sections);
// then, with `etcd`, an [etcd] section for node "solo" with a 3 s session TTL.
std::string InProcessToml(const std::string& dir, const std::string& name, const EtcdCluster* etcd,
                          const std::string& extra = "") {
  std::string t = "[domain]\nname = \"" + name + "\"\npool = \"file:" + dir +
                  "/pool?size=64M\"\nprefix_domain = \"file:" + dir +
                  "/domain?size=4M\"\nextent_size = \"16M\"\nstate_file = \"" + dir +
                  "/d.state\"\nindex_entries = 1024\nmax_hosts = 4\n[rpc]\nsocket = \"" + dir +
                  "/o.sock\"\n[metrics]\nlisten = \"\"\n" + extra;
  if (etcd != nullptr) {
    t += "[etcd]\nendpoints = " + etcd->EndpointsToml() + "\nnode = \"solo\"\nttl_s = 3\n";
  }
  return t;
}

std::string EtcdSpec(const EtcdCluster& etcd, const std::string& path) {
  std::string spec = "etcd://";
  for (const std::string& e : etcd.endpoints()) absl::StrAppend(&spec, e, ",");
  spec.back() = '/';
  return spec + path;
}

// A reference to block `index` of the arena whose id starts with `arena0`, generation 1.
co::BlockRef TestRef(std::uint8_t arena0, std::uint32_t index) {
  co::BlockRef ref{};
  ref.arena[0] = arena0;
  ref.index = index;
  ref.generation = 1;
  return ref;
}

// A host of the domain (host id 2) in this process, on the shared domain file: it publishes
// and looks blocks up through CXL alone, as a serving host does, in one namespace. ok() is
// false (and the reason a test failure) when the file cannot be mapped or the host not joined.
class CxlHost {
 public:
  static constexpr std::size_t kDomainBytes = 4 << 20;  // SharedDomain's prefix domain

  explicit CxlHost(const std::string& domain_file) {
    fd_ = ::open(domain_file.c_str(), O_RDWR);
    EXPECT_GE(fd_, 0) << domain_file;
    if (fd_ < 0) return;
    void* map = ::mmap(nullptr, kDomainBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(map, MAP_FAILED) << domain_file;
    if (map == MAP_FAILED) return;
    map_ = map;
    mem_ = std::make_unique<co::DirectMem>(static_cast<std::byte*>(map_), kDomainBytes);
    auto h = co::PrefixHost::Join(*mem_, clock_, 2);
    EXPECT_TRUE(h.ok()) << h.status();
    if (h.ok()) host_ = *std::move(h);
  }
  ~CxlHost() {
    host_.reset();
    if (map_ != nullptr) ::munmap(map_, kDomainBytes);
    if (fd_ >= 0) ::close(fd_);
  }
  CxlHost(const CxlHost&) = delete;
  CxlHost& operator=(const CxlHost&) = delete;

  bool ok() const { return host_ != nullptr; }
  co::PrefixHost* operator->() const { return host_.get(); }

  // The key of `tokens` chained on no parent.
  co::PrefixKey Key(std::initializer_list<std::uint32_t> tokens) const {
    return co::ChainKey(ns_, co::PrefixKey{},
                        std::span<const std::uint32_t>(tokens.begin(), tokens.size()));
  }
  absl::Status Publish(const co::PrefixKey& key, const co::BlockRef& ref) {
    return host_->Publish(ns_, key, co::PrefixKey{}, ref);
  }
  std::optional<co::Hit> Lookup(const co::PrefixKey& key) { return host_->Lookup(ns_, key); }
  // A prefix lease on the block `key` names, released at once: OK, or why it was refused.
  absl::Status AcquireAndRelease(const co::PrefixKey& key) {
    auto lease = host_->LookupAndAcquire(ns_, key);
    if (!lease.ok()) return lease.status();
    host_->Release(*lease);
    return absl::OkStatus();
  }
  // Publishes and waits (3 s) until the owner applied it: the host finds the block. False
  // also when the host did not join.
  bool PublishAndWait(const co::PrefixKey& key, const co::BlockRef& ref) {
    return ok() && Publish(key, ref).ok() &&
           Eventually([&] { return Lookup(key).has_value(); }, milliseconds(3000));
  }

 private:
  const co::Namespace ns_ = co::MakeNamespace("t", "m", "l");
  int fd_ = -1;
  void* map_ = nullptr;
  co::SteadyClock clock_;
  std::unique_ptr<co::DirectMem> mem_;
  std::unique_ptr<co::PrefixHost> host_;
};

class HaTest : public EtcdClusterTest {
 protected:
  // The one orchestrator that serves now (nullptr: none, or more than one).
  HaOrchestrator* Leader(const std::vector<HaOrchestrator*>& all) {
    HaOrchestrator* found = nullptr;
    for (HaOrchestrator* o : all) {
      if (o->pid > 0 && o->Role() == "leader") {
        if (found != nullptr) return nullptr;
        found = o;
      }
    }
    return found;
  }
  // The re-attach measurements' setup: orchestrators a (the leader), b and c (standbys), each
  // with `env` on top of the test's environment when given one, and `n_hosts` hosts that
  // joined, grew one extent each and heartbeat every 100 ms, the even ones through the
  // endpoint list, the odd ones through etcd discovery.
  struct ReattachBed {
    std::vector<std::unique_ptr<HaOrchestrator>> orch;
    std::vector<std::unique_ptr<orch::HostClient>> hosts;
    std::map<std::uint32_t, std::set<std::uint32_t>> granted;
    std::vector<std::uint64_t> incs;
    // Waits (20 s) until every host follows a leader of an epoch above `old_epoch`; (*at)[h]
    // is the ms from `t0` at which host h was first seen doing so.
    bool WaitForEveryHost(std::int64_t old_epoch, std::int64_t t0,
                          std::vector<std::int64_t>* at) const {
      at->assign(hosts.size(), -1);
      return Eventually(
          [&] {
            bool every = true;
            for (std::size_t h = 0; h < hosts.size(); ++h) {
              if ((*at)[h] < 0 && hosts[h]->leader_epoch() > old_epoch) (*at)[h] = NowMs() - t0;
              every = every && (*at)[h] >= 0;
            }
            return every;
          },
          std::chrono::milliseconds(20000));
    }
    std::vector<HaOrchestrator*> all() const {
      std::vector<HaOrchestrator*> v;
      for (const auto& o : orch) v.push_back(o.get());
      return v;
    }
  };
  ::testing::AssertionResult StartReattachBed(std::uint32_t n_hosts,
                                              const std::vector<std::vector<std::string>>& env,
                                              ReattachBed* bed) {
    const char* names[] = {"a", "b", "c"};
    for (std::size_t i = 0; i < 3; ++i) {
      bed->orch.push_back(
          std::make_unique<HaOrchestrator>(d_, *etcd_, names[i], 3, 60000, 0, n_hosts));
      if (i < env.size()) bed->orch.back()->env = env[i];
    }
    if (auto started =
            StartLeaderAndStandbys(*bed->orch[0], {bed->orch[1].get(), bed->orch[2].get()});
        !started) {
      return started;
    }
    std::string list;
    for (auto& o : bed->orch) absl::StrAppend(&list, list.empty() ? "" : ",", o->socket);
    const std::string spec = EtcdSpec(*etcd_, "hatest");
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      auto c = orch::HostClient::Connect(h % 2 == 0 ? list : spec, h);
      if (!c.ok()) return ::testing::AssertionFailure() << "host " << h << ": " << c.status();
      auto g = (*c)->Grow(1);
      if (!g.ok()) return ::testing::AssertionFailure() << "host " << h << ": " << g.status();
      for (const auto& e : *g) bed->granted[h].insert(e.index);
      (*c)->StartHeartbeats();
      bed->incs.push_back((*c)->incarnation());
      bed->hosts.push_back(*std::move(c));
    }
    return ::testing::AssertionSuccess();
  }
  // After the trials: no host rejoined, each holds what it was granted, the leader lends
  // nothing twice; then the hosts leave.
  void ExpectReattachBedIntact(ReattachBed& bed) {
    for (std::uint32_t h = 0; h < bed.hosts.size(); ++h) {
      EXPECT_EQ(bed.hosts[h]->rejoins(), 0u) << "host " << h;
      std::set<std::uint32_t> held;
      for (const auto& e : bed.hosts[h]->extents()) held.insert(e.index);
      EXPECT_EQ(held, bed.granted[h]) << "host " << h;
    }
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(Eventually([&] { return (leader = Leader(bed.all())) != nullptr; },
                           std::chrono::milliseconds(10000)));
    ExpectNoExtentLentTwice(*leader, bed.granted);
    for (auto& h : bed.hosts) EXPECT_TRUE(h->Leave().ok());
  }
  SharedDomain d_;
};

TEST_F(HaTest, StandbysRefuseAndNameTheLeader) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  std::this_thread::sleep_for(milliseconds(500));
  const pb::StatusReply sb = b.Status();
  EXPECT_EQ(sb.role(), "standby");
  EXPECT_NE(sb.leader().find("\"node\":\"a\""), std::string::npos) << sb.leader();
  const pb::StatusReply sa = a.Status();
  EXPECT_EQ(sa.role(), "leader");
  EXPECT_GT(sa.epoch(), 0);
  EXPECT_EQ(sa.extents_total(), 32u);
  std::uint64_t inc = 0;
  const grpc::Status refused = HostCalls::Join(b, 0, &inc);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find("standby"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(HostCalls::Join(a, 0, &inc).ok());
  // The fence line carries the leader's epoch.
  FenceAudit audit(d_.domain);
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() != 0; }, milliseconds(2000)));
  EXPECT_EQ(audit.LastEpoch(), static_cast<std::uint64_t>(sa.epoch()));
  // A second --new-domain is refused: the domain's state is in etcd.
  HaOrchestrator c(d_, *etcd_, "c");
  EXPECT_FALSE(c.Start(/*new_domain=*/true));
  EXPECT_NE(ReadFile(c.log).find("not new"), std::string::npos) << ReadFile(c.log);
}

// kill -9 of the leader: a standby takes over from etcd's state and the index in CXL, and
// serves grants; the first leader's grants are still its hosts', and none is lent twice.
TEST_F(HaTest, KillNineOfTheLeaderAStandbyServesGrants) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b"), c(d_, *etcd_, "c");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b, &c}));
  FenceAudit audit(d_.domain);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 3, &inc0, &granted[0]));
  ASSERT_EQ(granted[0].size(), 3u);
  const std::int64_t epoch_a = a.Status().epoch();
  // A block published through the first leader's owner: the prefix index lives in CXL.
  CxlHost host(d_.domain);
  const co::PrefixKey key = host.Key({1, 2, 3});
  const co::BlockRef ref = TestRef(9, 1);
  ASSERT_TRUE(host.PublishAndWait(key, ref));

  a.Kill(SIGKILL);
  const std::int64_t t0 = NowMs();
  HaOrchestrator* next = nullptr;
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        for (HaOrchestrator* o : {&b, &c}) {
          if (HostCalls::Join(*o, 1, &inc1).ok()) {
            next = o;
            return true;
          }
        }
        return false;
      },
      milliseconds(15000)))
      << "no standby took over";
  const std::int64_t failover_ms = NowMs() - t0;
  std::printf("failover after kill -9: %lld ms to a served Join\n",
              static_cast<long long>(failover_ms));
  EXPECT_LT(failover_ms, 8000);
  std::vector<std::uint32_t> g1;
  ASSERT_TRUE(HostCalls::Grow(*next, 1, inc1, 3, &g1).ok());
  EXPECT_EQ(g1.size(), 3u);
  granted[1].insert(g1.begin(), g1.end());
  // Host 0 re-attaches to the new leader with the incarnation the old one gave it: its
  // extents are still its own.
  pb::HeartbeatReply hb;
  ASSERT_TRUE(HostCalls::Heartbeat(*next, 0, inc0, &hb).ok());
  EXPECT_FALSE(hb.fenced());
  std::set<std::uint32_t> still;
  for (const auto& e : hb.extents()) still.insert(e.index());
  EXPECT_EQ(still, granted[0]);
  ExpectNoExtentLentTwice(*next, granted);
  const pb::StatusReply s = next->Status();
  EXPECT_GT(s.epoch(), epoch_a);
  EXPECT_EQ(s.recovered_at_start(), 3u);
  HaOrchestrator* other = next == &b ? &c : &b;
  EXPECT_EQ(other->Role(), "standby");
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.LastEpoch(), static_cast<std::uint64_t>(s.epoch()));
  // The new leader's owner took the index over as it was: the block is still published.
  EXPECT_EQ(s.prefixes_published(), 1u);
  const auto hit = host.Lookup(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(hit->ref == ref);
}

// SIGSTOP of the leader long past its TTL: a standby takes over; then SIGCONT: the old leader
// writes nothing more to the domain (the fence line never shows its epoch again, the new
// leader never sees a foreign epoch), serves nothing, and no extent is lent twice.
TEST_F(HaTest, StoppedLeaderDoesNotWriteAfterItsSuccessorStarted) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 2, &inc0, &granted[0]));
  const auto epoch_a = static_cast<std::uint64_t>(a.Status().epoch());
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == epoch_a; }, milliseconds(2000)));

  a.Kill(SIGSTOP);
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(Eventually([&] { return HostCalls::Join(b, 1, &inc1).ok(); }, milliseconds(15000)))
      << "the standby did not take over from a stopped leader";
  const auto epoch_b = static_cast<std::uint64_t>(b.Status().epoch());
  EXPECT_GT(epoch_b, epoch_a);
  std::vector<std::uint32_t> g1;
  ASSERT_TRUE(HostCalls::Grow(b, 1, inc1, 2, &g1).ok());
  granted[1].insert(g1.begin(), g1.end());
  std::this_thread::sleep_for(milliseconds(1000));  // long past a's TTL

  const std::int64_t resumed = NowMs();
  // a was stopped past its write deadline: its write-back agent ended it (so that it cannot
  // resume inside a store), wrote the domain back and released its epoch, before b wrote.
  a.Kill(SIGCONT);
  int status = 0;
  const bool ended =
      Eventually([&] { return ::waitpid(a.pid, &status, WNOHANG) == a.pid; }, milliseconds(5000));
  ASSERT_TRUE(ended) << "the stopped leader was not ended by its agent:\n" << ReadFile(a.log);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << ReadFile(a.log);
  a.pid = -1;
  EXPECT_GE(audit.FirstReleasedMs(epoch_a), 0) << "a's epoch was never released";
  EXPECT_LE(audit.FirstReleasedMs(epoch_a), audit.FirstWrittenMs(epoch_b))
      << "b wrote the domain before a's epoch was released";
  std::this_thread::sleep_for(milliseconds(1500));
  // Grants keep working at b, and no extent went to two hosts.
  std::vector<std::uint32_t> g1b;
  ASSERT_TRUE(HostCalls::Grow(b, 1, inc1, 1, &g1b).ok());
  granted[1].insert(g1b.begin(), g1b.end());
  ExpectNoExtentLentTwice(b, granted);
  EXPECT_EQ(b.Role(), "leader");

  // The audit: a's epoch never wrote after b's appeared, and b kept writing after a resumed.
  EXPECT_EQ(audit.Regression(), 0u) << "an older epoch wrote the domain after a newer one";
  EXPECT_EQ(audit.BatchesAfter(epoch_a, resumed), 0u);
  EXPECT_GT(audit.BatchesAfter(epoch_b, resumed), 10u);
  EXPECT_EQ(audit.LastEpoch(), epoch_b);
  const std::string alog = ReadFile(a.log), blog = ReadFile(b.log);
  EXPECT_NE(alog.find("stopped past its write deadline"), std::string::npos) << alog;
  EXPECT_NE(alog.find(absl::StrCat("epoch ", epoch_a, " released")), std::string::npos) << alog;
  EXPECT_EQ(blog.find("not this leader's"), std::string::npos) << "b saw a foreign epoch:\n"
                                                               << blog;
}

// Audit-ha #8: a Grow whose reply never reached the host (its state write timed out but
// landed; here: the same Grow sent by another caller with the host's incarnation). The
// orchestrator lends the extent to the host's incarnation and renews it with every heartbeat;
// the host, seeing it listed while no Grow or Shrink of its own is under way, gives it back.
// (Before: lent and unused until the host left; checked.)
TEST_F(HaTest, AnExtentGrantedByALostGrowReplyIsGivenBack) {
  HaOrchestrator a(d_, *etcd_, "a");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {}));
  auto host = orch::HostClient::Connect(a.socket, 0);
  ASSERT_TRUE(host.ok()) << host.status();
  auto mine = (*host)->Grow(1);
  ASSERT_TRUE(mine.ok()) << mine.status();
  std::vector<std::uint32_t> lost;
  ASSERT_TRUE(HostCalls::Grow(a, 0, (*host)->incarnation(), 1, &lost).ok());
  ASSERT_EQ(lost.size(), 1u);
  (*host)->StartHeartbeats();
  auto state_of = [&](std::uint32_t index) {
    for (const pb::Extent& e : HostCalls::Extents(a)) {
      if (e.index() == index) return e.state() + "/" + std::to_string(e.host_id());
    }
    return std::string("?");
  };
  EXPECT_TRUE(Eventually([&] { return state_of(lost[0]) != "assigned/0"; }, milliseconds(3000)))
      << "extent " << lost[0] << " is still lent to host 0, which never learned of it";
  // The host counts the give-back once its Shrink's reply is back, after the orchestrator
  // changed the extent's state: wait for it (seen failing once under load, at 606 ms).
  EXPECT_TRUE(
      Eventually([&] { return (*host)->unknown_extents_returned() >= 1; }, milliseconds(2000)));
  EXPECT_EQ((*host)->unknown_extents_returned(), 1u);
  EXPECT_EQ(state_of((*mine)[0].index), "assigned/0") << "the host's own extent was given back";
  EXPECT_TRUE((*host)->ExtentsValid());
}

// A TCP forwarder the test owns, in front of one etcd member: with replies held, what a client
// sends still reaches etcd (and is executed there) while nothing etcd answers comes back: a
// request that lands and whose reply is lost.
class ReplyHoldingProxy {
 public:
  explicit ReplyHoldingProxy(const std::string& target) {
    const auto colon = target.rfind(':');
    target_port_ = std::atoi(target.substr(colon + 1).c_str());
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    EXPECT_EQ(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { Accept(); });
  }
  ~ReplyHoldingProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_.join();
    ::close(listen_fd_);
    absl::MutexLock l(&mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) ::close(fd);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  void HoldReplies(bool hold) { hold_ = hold; }
  // Bytes sent to etcd while replies were held.
  std::uint64_t sent_while_held() const { return sent_while_held_.load(); }

 private:
  void Accept() {
    while (!stop_.load()) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      const int e = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(target_port_));
      if (::connect(e, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(c);
        ::close(e);
        continue;
      }
      absl::MutexLock l(&mu_);
      fds_.push_back(c);
      fds_.push_back(e);
      pumps_.emplace_back([this, c, e] { Pump(c, e, /*reply=*/false); });
      pumps_.emplace_back([this, c, e] { Pump(e, c, /*reply=*/true); });
    }
  }
  void Pump(int from, int to, bool reply) {
    char buf[16384];
    while (true) {
      while (reply && hold_.load() && !stop_.load()) {
        std::this_thread::sleep_for(milliseconds(1));
      }
      const ssize_t n = ::read(from, buf, sizeof(buf));
      if (n <= 0) break;
      if (!reply && hold_.load()) sent_while_held_ += static_cast<std::uint64_t>(n);
      if (::send(to, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  int listen_fd_ = -1, port_ = 0, target_port_ = 0;
  std::atomic<bool> stop_{false}, hold_{false};
  std::atomic<std::uint64_t> sent_while_held_{0};
  std::thread accept_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

// Audit-ha #8 at the leader: a Grow whose state write lands in etcd while its reply is lost
// (the leader's etcd member answers nothing for a while). The leader reads the state back
// (from another member), finds its write, and answers the Grow: the host holds the extent, the
// leader keeps leading at the same epoch, nothing is lent twice or leaked. (Before: the Grow
// failed, the leader's next write failed its guard and it resigned, and the extent stayed lent
// to a host that never learned of it: checked.)
TEST_F(HaTest, AGrowWhoseStateWriteLandsButItsReplyIsLostIsAnswered) {
  ReplyHoldingProxy proxy(etcd_->endpoints()[0]);
  HaOrchestrator a(d_, *etcd_, "a");
  a.SetEtcdEndpoints("[\"" + proxy.endpoint() + "\", \"" + etcd_->endpoints()[1] + "\", \"" +
                     etcd_->endpoints()[2] + "\"]");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {}));
  auto host = orch::HostClient::Connect(a.socket, 0);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE((*host)->Grow(1).ok());
  const std::int64_t epoch = a.Status().epoch();
  const std::string landed = "the write's reply was lost";
  // The Grow's state write goes to the proxy, whose replies are held (if a keep-alive held
  // there moved the leader to another member first, the next Grow is tried: up to 5).
  std::vector<orch::GrantedExtent> got;
  for (int attempt = 0; attempt < 5 && ReadFile(a.log).find(landed) == std::string::npos;
       ++attempt) {
    proxy.HoldReplies(true);
    auto g = (*host)->Grow(1);
    proxy.HoldReplies(false);
    ASSERT_TRUE(g.ok()) << g.status() << "\n" << ReadFile(a.log);
    got.insert(got.end(), g->begin(), g->end());
  }
  ASSERT_NE(ReadFile(a.log).find(landed), std::string::npos)
      << "no state write went through the held proxy:\n"
      << ReadFile(a.log);
  EXPECT_EQ(a.Role(), "leader");
  EXPECT_EQ(a.Status().epoch(), epoch) << "the leader resigned";
  // The extents etcd says host 0 holds are exactly the host's.
  std::set<std::uint32_t> mine, listed;
  for (const orch::GrantedExtent& e : (*host)->extents()) mine.insert(e.index);
  for (const pb::Extent& e : HostCalls::Extents(a)) {
    if (e.state() == "assigned") {
      EXPECT_EQ(e.host_id(), 0u);
      listed.insert(e.index());
    }
  }
  EXPECT_EQ(mine, listed);
  EXPECT_EQ(mine.size(), 1 + got.size());
  EXPECT_EQ((*host)->unknown_extents_returned(), 0u);
}

// Audit-ha #3: etcd restored from a backup (here: P/state put back as it was before a Grow).
// The domain's fence line records the state's generation at every save, so a successor finds
// etcd's state older than the domain and refuses it, naming the key and what to do, instead
// of lending again the extents granted since. No orchestrator serves; no extent is lent to
// two hosts. (Before the generation check: b took over from the old state and granted host
// 1 the extents host 0 holds: checked.)
TEST_F(HaTest, AStateOlderThanTheDomainIsRefused) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  auto etcd = etcd_->NewClient();
  const std::string key = "/cxlkv/v1/default/domains/hatest/state";
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 1, &inc0, &granted[0]));
  auto backup = etcd->Get(key);
  ASSERT_TRUE(backup.ok() && !backup->kvs.empty()) << backup.status();
  std::vector<std::uint32_t> more;
  ASSERT_TRUE(HostCalls::Grow(a, 0, inc0, 4, &more).ok());
  ASSERT_EQ(more.size(), 4u);
  granted[0].insert(more.begin(), more.end());
  std::this_thread::sleep_for(milliseconds(100));  // a batch or two: the fence line has it
  // The "restore", then the leader dies: b must take over from etcd.
  ASSERT_TRUE(etcd->Put(key, backup->kvs[0].value).ok());
  // Every election b wins from here on puts the leader key (a is dead).
  auto leader_watch = etcd->NewWatch("/cxlkv/v1/default/domains/hatest/leader");
  ASSERT_TRUE(leader_watch.ok()) << leader_watch.status();
  a.Kill(SIGKILL);
  const std::int64_t t0 = NowMs();
  bool refused_logged = false;
  int elections = 0;
  while (NowMs() - t0 < 8000) {
    std::uint64_t inc1 = 0;
    if (HostCalls::Join(b, 1, &inc1).ok()) {
      std::vector<std::uint32_t> got;
      if (HostCalls::Grow(b, 1, inc1, 8, &got).ok()) granted[1].insert(got.begin(), got.end());
    }
    refused_logged =
        ReadFile(b.log).find("older than the domain's own record") != std::string::npos;
    auto ev = (*leader_watch)->Next(milliseconds(200));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const orch::etcd::Event& e : *ev) {
      if (e.type == orch::etcd::Event::Type::kPut) ++elections;
    }
  }
  EXPECT_TRUE(refused_logged) << ReadFile(b.log);
  // A host is told the refusal by the orchestrator that answered (before: "no orchestrator
  // answered; if one runs, check that it allows uid ..."), with what the operator must do.
  auto host = orch::HostClient::Connect(b.socket, 2);
  ASSERT_FALSE(host.ok());
  const std::string told(host.status().message());
  EXPECT_NE(told.find("older than the domain's own record"), std::string::npos) << told;
  EXPECT_NE(told.find("--new-domain"), std::string::npos) << told;
  EXPECT_EQ(told.find("no orchestrator answered"), std::string::npos) << told;
  // The refused candidate backs off (500 ms, doubling, capped) instead of campaigning every
  // 500 ms, and logs the reason once while it does not change (before: three long lines at
  // every election).
  EXPECT_GE(elections, 2);
  EXPECT_LE(elections, 5) << "b was elected " << elections << " times in 8 s";
  std::size_t logged = 0;
  const std::string blog_now = ReadFile(b.log);
  for (std::size_t at = blog_now.find("older than the domain's own record");
       at != std::string::npos; at = blog_now.find("older than the domain's own record", at + 1)) {
    ++logged;
  }
  EXPECT_EQ(logged, 1u) << blog_now;
  EXPECT_NE(b.Role(), "leader");
  EXPECT_TRUE(granted[1].empty()) << "b served from the restored (older) state";
  for (const std::uint32_t e : granted[1]) {
    EXPECT_EQ(granted[0].count(e), 0u) << "extent " << e << " lent to host 0 and host 1";
  }
  const std::string blog = ReadFile(b.log);
  EXPECT_NE(blog.find(key), std::string::npos) << "the refusal names the state's key:\n" << blog;
  EXPECT_NE(blog.find("--new-domain"), std::string::npos) << blog;
}

// etcd's own restores (issue #29), with real etcdctl; under the `stress` label
// (orchestrator_ha_etcd_restore: about 20 s each).
class HaRestoreTest : public HaTest {
 protected:
  void SetUp() override {
    CXLKV_SKIP_WITHOUT_ETCDCTL();
    HaTest::SetUp();
    snapshot_ = etcd_->dir() + "/backup.db";
  }
  std::string snapshot_;
};

// etcd restored from a snapshot (a new cluster id, revisions back to the snapshot's), then
// rebuilt empty; an orchestrator given the wrong etcd.domain meanwhile. Epochs derive from the
// domain's record as well as etcd's revision, so each new leader's epoch is above every one
// the domain saw: no epoch names two terms, and a host that heard the old terms accepts the
// new leader without a restart, keeping its incarnation and extents. The wrong-domain
// orchestrator refuses the domain (its fence line names other etcd keys), also after the
// leader's kill -9 released its term. Sampled: no extent valid on two hosts at any instant.
// (Before: the leader after the restore served at an epoch below the hosts' and they refused
// it until restarted; checked.)
TEST_F(HaRestoreTest, RestoredOrRebuiltEtcdEpochsStayUniqueAndHostsFollow) {
  HaOrchestrator a(d_, *etcd_, "a", /*ttl_s=*/2), b(d_, *etcd_, "b", /*ttl_s=*/2);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  const std::string list = a.socket + "," + b.socket;
  auto h0 = orch::HostClient::Connect(list, 0);
  ASSERT_TRUE(h0.ok()) << h0.status();
  // Declared before the audit, which samples them until it is destroyed.
  absl::StatusOr<std::unique_ptr<orch::HostClient>> h1 = absl::UnavailableError("not yet");
  ExtentAudit extents;
  ASSERT_TRUE((*h0)->Grow(2).ok());
  extents.Watch(h0->get());
  (*h0)->StartHeartbeats();
  // A wrong etcd.domain (operator error), started as a new domain there: elected under its
  // own keys, it must refuse the domain, whose fence line names other keys, even once the
  // leader's term is released.
  HaOrchestrator c(d_, *etcd_, "c", /*ttl_s=*/2);
  c.AppendToEtcdSection("domain = \"wrong\"");
  (void)c.Start(/*new_domain=*/true);  // refused at its first election: it may be gone already

  std::string why;
  ASSERT_TRUE(etcd_->SnapshotSave(snapshot_, &why)) << why;
  // Other users of the same etcd move its revision on after the backup.
  auto kv = etcd_->NewClient();
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(kv->Put("/another-app/key", std::to_string(i)).ok());
  const std::int64_t epoch_a = a.Status().epoch();
  a.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_a; }, milliseconds(15000)))
      << "the host did not follow b";
  const std::int64_t epoch_b = (*h0)->leader_epoch();
  ASSERT_TRUE(a.Start());  // a standby again
  EXPECT_NE(c.Role(), "leader");

  // The restore: revisions back to the snapshot's, under a new cluster token.
  ASSERT_TRUE(etcd_->RestoreSnapshot(snapshot_, "cxlkv-restored", &why)) << why;
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_b; }, milliseconds(20000)))
      << "the host did not accept the leader elected after the restore (epoch " << audit.LastEpoch()
      << ", the host's " << (*h0)->leader_epoch() << ")";
  const std::int64_t epoch_r = (*h0)->leader_epoch();
  EXPECT_EQ(audit.LastEpoch(), static_cast<std::uint64_t>(epoch_r));
  EXPECT_EQ((*h0)->extents().size(), 2u);
  EXPECT_EQ((*h0)->rejoins(), 0u);

  // etcd rebuilt empty: the leader's state file (a cache, current) is imported.
  ASSERT_TRUE(etcd_->RebuildEmpty("cxlkv-rebuilt", &why)) << why;
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_r; }, milliseconds(20000)))
      << "the host did not accept the leader elected after the rebuild";
  EXPECT_EQ((*h0)->extents().size(), 2u);
  EXPECT_EQ((*h0)->rejoins(), 0u);
  h1 = orch::HostClient::Connect(list, 1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  extents.Watch(h1->get());
  ASSERT_TRUE((*h1)->Grow(2).ok());
  std::this_thread::sleep_for(milliseconds(300));

  EXPECT_EQ(extents.FirstDoubleHolding(), "");
  EXPECT_GT(extents.samples(), 1000u);
  EXPECT_EQ(audit.Regression(), 0u) << "an older epoch wrote after a newer one";
  EXPECT_EQ(audit.EpochOfTwoTerms(), 0u) << "one epoch named two terms";
  EXPECT_NE(c.Role(), "leader");
  const std::string clog = ReadFile(c.log);
  EXPECT_NE(clog.find("belongs to orchestrators elected under other etcd keys"), std::string::npos)
      << clog;
  EXPECT_EQ(clog.find("cxlkv-orchestrator: leader of domain"), std::string::npos) << clog;
  // It gave up at once (campaigns no more) and exited saying why.
  ASSERT_TRUE(c.Exited(milliseconds(1000))) << clog;
  EXPECT_TRUE(WIFEXITED(c.exit_status) && WEXITSTATUS(c.exit_status) == 1) << c.exit_status;
}

// etcd restored from a snapshot taken before a Grow: its state is older than the domain's
// record, so every takeover refuses it, naming the key and the fix; the operator's fix is
// one orchestrator started with --new-domain, which replaces the state with one that
// quarantines every extent: the host that held extents loses them (it must rejoin) before
// anyone else can be lent them. Sampled: no extent valid on two hosts at any instant.
TEST_F(HaRestoreTest, AStateOlderThanTheDomainTakesNewDomainWhichQuarantinesEverything) {
  HaOrchestrator a(d_, *etcd_, "a", /*ttl_s=*/2, /*capacity_lease_ms=*/3000),
      b(d_, *etcd_, "b", /*ttl_s=*/2, /*capacity_lease_ms=*/3000);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  const std::string list = a.socket + "," + b.socket;
  auto h0 = orch::HostClient::Connect(list, 0);
  ASSERT_TRUE(h0.ok()) << h0.status();
  // Declared before the audit, which samples them until it is destroyed.
  absl::StatusOr<std::unique_ptr<orch::HostClient>> h1 = absl::UnavailableError("not yet");
  ExtentAudit extents;
  ASSERT_TRUE((*h0)->Grow(1).ok());
  extents.Watch(h0->get());
  (*h0)->StartHeartbeats();
  std::string why;
  ASSERT_TRUE(etcd_->SnapshotSave(snapshot_, &why)) << why;
  ASSERT_TRUE((*h0)->Grow(3).ok());  // after the backup
  ASSERT_EQ((*h0)->extents().size(), 4u);
  const std::uint64_t epoch_a = audit.LastEpoch();

  ASSERT_TRUE(etcd_->RestoreSnapshot(snapshot_, "cxlkv-restored", &why)) << why;
  // The snapshot holds the leader's session lease: the leader may lead on from its memory (a
  // newer state than etcd's) until its next state write, whose guard then fails (P/state is
  // not at the revision it wrote last): it resigns. A Grow makes that write now.
  auto refused = (*h0)->Grow(1);
  EXPECT_FALSE(refused.ok()) << "a Grow was served from the state etcd lost";
  const std::string key = "/cxlkv/v1/default/domains/hatest/state";
  ASSERT_TRUE(Eventually(
      [&] {
        return ReadFile(a.log).find("older than the domain's own record") != std::string::npos ||
               ReadFile(b.log).find("older than the domain's own record") != std::string::npos;
      },
      milliseconds(15000)))
      << "no takeover refused the restored state";
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "a leader took the restored (older) state over";
  const std::string refusal = ReadFile(a.log) + ReadFile(b.log);
  EXPECT_NE(refusal.find(key), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--new-domain"), std::string::npos) << refusal;

  // The operator's fix: stop them, start one with --new-domain.
  a.Kill(SIGTERM);
  b.Kill(SIGTERM);
  ASSERT_TRUE(b.Start(/*new_domain=*/true));
  ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(15000)))
      << ReadFile(b.log);
  EXPECT_GT(audit.LastEpoch(), epoch_a);
  EXPECT_NE(ReadFile(b.log).find("every extent quarantined"), std::string::npos) << ReadFile(b.log);
  h1 = orch::HostClient::Connect(b.socket, 1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  extents.Watch(h1->get());
  // Nothing is lent until the quarantine (a full capacity lease) ends; then h1 gets extents
  // h0 held, which h0 no longer uses.
  std::vector<orch::GrantedExtent> got;
  ASSERT_TRUE(Eventually(
      [&] {
        auto g = (*h1)->Grow(4);
        if (g.ok()) got.insert(got.end(), g->begin(), g->end());
        return got.size() >= 4;
      },
      milliseconds(15000)))
      << "the quarantine never ended";
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(extents.FirstDoubleHolding(), "");
  EXPECT_GT(extents.samples(), 1000u);
  EXPECT_FALSE((*h0)->ExtentsValid() && !(*h0)->extents().empty())
      << "the host of the forgotten state still uses its extents";
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.EpochOfTwoTerms(), 0u);
}

// A host given every orchestrator of the domain (comma-separated) follows the leader: after
// kill -9 of the leader its heartbeats reach the new one with the same incarnation, it keeps
// its extents (valid throughout: their deadlines count from the last acknowledged request),
// and it grows at the new leader. Times "leader killed -> this host re-attached".
TEST_F(HaTest, HostFollowsTheLeaderThroughItsEndpointList) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b"), c(d_, *etcd_, "c");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b, &c}));
  // The leader last in the list: the client finds it past two standbys from the start.
  auto host = orch::HostClient::Connect(b.socket + "," + c.socket + "," + a.socket, 0);
  ASSERT_TRUE(host.ok()) << host.status();
  (*host)->StartHeartbeats();
  auto got = (*host)->Grow(2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  const std::uint64_t inc = (*host)->incarnation();
  std::set<std::uint32_t> mine;
  for (const auto& e : *got) mine.insert(e.index);

  a.Kill(SIGKILL);
  const std::int64_t t0 = NowMs();
  HaOrchestrator* next = nullptr;
  // Re-attached: a heartbeat of this incarnation is acknowledged again (only a leader answers
  // one; the client finds it in its list).
  ASSERT_TRUE(Reattached(**host)) << "the host did not re-attach to a new leader";
  const std::int64_t reattached_ms = NowMs() - t0;
  for (HaOrchestrator* o : {&b, &c}) {
    if (o->Role() == "leader") next = o;
  }
  ASSERT_NE(next, nullptr);
  std::printf("host re-attached to the new leader %lld ms after kill -9 of the old one\n",
              static_cast<long long>(reattached_ms));
  EXPECT_EQ((*host)->incarnation(), inc);
  EXPECT_EQ((*host)->rejoins(), 0u);
  EXPECT_TRUE((*host)->ExtentsValid());
  std::set<std::uint32_t> held;
  for (const auto& e : (*host)->extents()) held.insert(e.index);
  EXPECT_EQ(held, mine);
  auto more = (*host)->Grow(1);
  ASSERT_TRUE(more.ok()) << more.status();
  ASSERT_EQ(more->size(), 1u);
  EXPECT_EQ(mine.count((*more)[0].index), 0u);
  mine.insert((*more)[0].index);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted{{0, mine}};
  ExpectNoExtentLentTwice(*next, granted);
  const absl::Status left = (*host)->Leave();
  EXPECT_TRUE(left.ok()) << left;
}

// Endpoint discovery through etcd: a host given only etcd and the domain's name
// (etcd://EP,EP,EP/hatest) finds the leader in its leader key, and after kill -9 of the leader
// reads the key again and follows the new leader with the same incarnation and its extents.
TEST_F(HaTest, HostFindsTheLeaderThroughEtcd) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b"), c(d_, *etcd_, "c");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b, &c}));
  const std::string spec = EtcdSpec(*etcd_, "hatest");
  auto host = orch::HostClient::Connect(spec, 0);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*host)->leaders_found(), 1u);
  (*host)->StartHeartbeats();
  auto got = (*host)->Grow(2);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::uint64_t inc = (*host)->incarnation();
  std::set<std::uint32_t> mine;
  for (const auto& e : *got) mine.insert(e.index);
  for (int round = 0; round < 2; ++round) {
    HaOrchestrator* old = Leader({&a, &b, &c});
    ASSERT_NE(old, nullptr);
    old->Kill(SIGKILL);
    const std::int64_t t0 = NowMs();
    ASSERT_TRUE(Reattached(**host)) << "the host did not find the new leader in etcd";
    std::printf("round %d: host re-attached through etcd %lld ms after kill -9 of the leader\n",
                round, static_cast<long long>(NowMs() - t0));
    EXPECT_EQ((*host)->leaders_found(), 2u + static_cast<std::uint64_t>(round));
    EXPECT_EQ((*host)->incarnation(), inc);
    auto more = (*host)->Grow(1);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_EQ(more->size(), 1u);
    EXPECT_TRUE(mine.insert((*more)[0].index).second);
    ASSERT_TRUE(old->Start());  // back as a standby
  }
  EXPECT_EQ((*host)->rejoins(), 0u);
  std::set<std::uint32_t> held;
  for (const auto& e : (*host)->extents()) held.insert(e.index);
  EXPECT_EQ(held, mine);
  HaOrchestrator* leader = Leader({&a, &b, &c});
  ASSERT_NE(leader, nullptr);
  ExpectNoExtentLentTwice(*leader, {{0, mine}});
  EXPECT_TRUE((*host)->Leave().ok());
  // A domain nobody leads: a clear error, not a hang.
  auto none = orch::HostClient::Connect(spec + "-none", 1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no leader"), std::string::npos) << none.status();
}

// Endpoint discovery of a leader on another host: the orchestrators run under another host
// name (a UTS namespace; root only) with rpc.tcp on an ephemeral port, so the leader key's
// `endpoint` (the port it listens on) is what the host must use, with the domain's token. The
// host finds the leader there and follows the successor after kill -9, over TCP.
TEST_F(HaTest, HostFindsALeaderOnAnotherHostThroughItsTcpEndpoint) {
  if (::geteuid() != 0 || ::access("/usr/bin/unshare", X_OK) != 0) {
    GTEST_SKIP() << "needs root and unshare(1) to run the orchestrators under another host name";
  }
  const cxlkv::testing::TempDir scratch("ha-token", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string token = std::string(tmpl) + "/token";
  std::ofstream(token) << "0123456789abcdef0123456789abcdef\n";
  ASSERT_EQ(::chmod(token.c_str(), 0600), 0);
  ASSERT_EQ(::setenv("CXLKV_RPC_TOKEN_FILE", token.c_str(), 1), 0);
  HaOrchestrator a(d_, *etcd_, "a", 3, 60000, 0, 4, token),
      b(d_, *etcd_, "b", 3, 60000, 0, 4, token);
  a.hostname = "cxlkv-ha-other-a";
  b.hostname = "cxlkv-ha-other-b";
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  auto etcd = etcd_->NewClient();
  auto key = etcd->Get("/cxlkv/v1/default/domains/hatest/leader");
  ASSERT_TRUE(key.ok() && !key->kvs.empty()) << key.status();
  const std::string value = key->kvs[0].value;
  EXPECT_NE(value.find("\"host\":\"cxlkv-ha-other-a\""), std::string::npos) << value;
  EXPECT_NE(value.find("\"endpoint\":\"127.0.0.1:"), std::string::npos) << value;
  EXPECT_EQ(value.find("\"endpoint\":\"127.0.0.1:0\""), std::string::npos) << value;
  EXPECT_NE(value.find("\"mac\":\""), std::string::npos) << "not sealed: " << value;
  auto host = orch::HostClient::Connect(EtcdSpec(*etcd_, "default/hatest"), 0);
  ASSERT_TRUE(host.ok()) << host.status();
  auto got = (*host)->Grow(1);
  ASSERT_TRUE(got.ok()) << got.status();
  a.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return (*host)->HeartbeatOnce().ok(); }, milliseconds(15000)))
      << "the host did not follow the leader to b over TCP";
  EXPECT_EQ((*host)->leaders_found(), 2u);
  EXPECT_EQ((*host)->rejoins(), 0u);
  auto more = (*host)->Grow(1);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ((*host)->extents().size(), 2u);
  EXPECT_TRUE((*host)->Leave().ok());
  ::unsetenv("CXLKV_RPC_TOKEN_FILE");
}

// Audit-ha #7, discovery: a leader record put into etcd by someone who is not an orchestrator
// of the domain (not sealed with the domain's token, or sealed with another key) names an
// endpoint the test listens on. A host holding the token refuses the record, naming the key
// and the fix, and never connects there (so never sends the token). A record the domain's
// orchestrator wrote (sealed) is called as before. (Before: the host connected to the forged
// endpoint and sent the token: checked.)
TEST_F(HaTest, AForgedLeaderRecordGetsNoConnectionAndNoToken) {
  const cxlkv::testing::TempDir scratch("ha-forged", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string token = std::string(tmpl) + "/token";
  std::ofstream(token) << "0123456789abcdef0123456789abcdef\n";
  ASSERT_EQ(::chmod(token.c_str(), 0600), 0);
  ASSERT_EQ(::setenv("CXLKV_RPC_TOKEN_FILE", token.c_str(), 1), 0);
  // The listener a forger would run.
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string forged_ep = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::atomic<int> connections{0};
  std::atomic<bool> stop{false};
  std::thread listener([&] {
    while (!stop.load()) {
      const int c = ::accept(lfd, nullptr, nullptr);
      if (c >= 0) {
        ++connections;
        ::close(c);
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  auto etcd = etcd_->NewClient();
  const std::string key = "/cxlkv/v1/default/domains/hatest/leader";
  const std::string record = "{\"endpoint\":\"" + forged_ep +
                             "\",\"host\":\"elsewhere\",\"node\":\"evil\",\"pid\":1,\"socket\":"
                             "\"\",\"tcp\":\"" +
                             forged_ep + "\"}";
  const std::string other_mac =
      orch::LeaderRecordMac("another-token-of-another-domain!", key, record);
  // The right token, but sealed under another domain's key (that domain's record copied
  // here): the key's name is part of the seal.
  const std::string other_domain_mac = orch::LeaderRecordMac(
      "0123456789abcdef0123456789abcdef", "/cxlkv/v1/default/domains/other/leader", record);
  auto sealed_with = [&](const std::string& mac) {
    return record.substr(0, record.size() - 1) + ",\"mac\":\"" + mac + "\"}";
  };
  for (const std::string& value : {record, sealed_with(other_mac), sealed_with(other_domain_mac)}) {
    ASSERT_TRUE(etcd->Put(key, value).ok());
    auto host = orch::HostClient::Connect(EtcdSpec(*etcd_, "hatest"), 0);
    ASSERT_FALSE(host.ok()) << "a host called a forged leader";
    EXPECT_NE(host.status().message().find("is not sealed with this host's domain token"),
              std::string::npos)
        << host.status();
    EXPECT_NE(host.status().message().find(key), std::string::npos) << host.status();
    EXPECT_NE(host.status().message().find("CXLKV_RPC_TOKEN_FILE"), std::string::npos)
        << host.status();
  }
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(connections.load(), 0) << "the host connected to the forged leader's endpoint";
  stop = true;
  listener.join();
  ::close(lfd);
  // The domain's own orchestrator seals its record: the host calls it.
  ASSERT_TRUE(etcd->Delete(key).ok());
  HaOrchestrator a(d_, *etcd_, "a", 3, 60000, 0, 4, token);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {}));
  auto sealed = etcd->Get(key);
  ASSERT_TRUE(sealed.ok() && !sealed->kvs.empty()) << sealed.status();
  EXPECT_NE(sealed->kvs[0].value.find("\"mac\":\""), std::string::npos) << sealed->kvs[0].value;
  auto host = orch::HostClient::Connect(EtcdSpec(*etcd_, "hatest"), 0);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE((*host)->Grow(1).ok());
  ::unsetenv("CXLKV_RPC_TOKEN_FILE");
}

// Orchestrators on an etcd with authentication (etcd.user, etcd.password_file): elected and
// serving, with a standby; a host finds the leader through etcd with CXLKV_ETCD_USER and
// CXLKV_ETCD_PASSWORD_FILE (without them it is told to set them); an orchestrator with a wrong
// password is refused at start, naming the user and the keys to fix; the leader's LMCache
// coordinator loads its state from etcd as that user, and so does the Directory RPC's reader
// (every etcd client of the daemon starts from the [etcd] section's options, etcd_options.h).
// (Keep-alives, watches and guarded writes under authentication: etcd_client_test's EtcdAuth.)
TEST_F(HaTest, OrchestratorsUseEtcdAuthentication) {
  CXLKV_SKIP_WITHOUT_ETCDCTL();
  std::string why;
  ASSERT_TRUE(etcd_->Ctl("user add root:rootpw --interactive=false", &why)) << why;
  ASSERT_TRUE(etcd_->Ctl("auth enable", &why)) << why;
  HaOrchestrator a(d_, *etcd_, "a", /*ttl_s=*/2), b(d_, *etcd_, "b", /*ttl_s=*/2),
      c(d_, *etcd_, "c", /*ttl_s=*/2);
  const std::string pw = a.dir + "/etcd-password";
  std::ofstream(pw) << "rootpw\n";
  const std::string bad = a.dir + "/wrong-password";
  std::ofstream(bad) << "not-it\n";
  a.AppendToEtcdSection("user = \"root\"\npassword_file = \"" + pw + "\"");
  b.AppendToEtcdSection("user = \"root\"\npassword_file = \"" + pw + "\"");
  c.AppendToEtcdSection("user = \"root\"\npassword_file = \"" + bad + "\"");
  // [lmcache]: the coordinator's state store in etcd is made from the same [etcd] options
  // (authentication included) as the election's client.
  const std::string tokens = a.dir + "/lmcache-tokens";
  std::ofstream(tokens) << "ha-test-lmcache-token-0123456789\n";
  ::chmod(tokens.c_str(), 0600);
  for (HaOrchestrator* o : {&a, &b}) {
    o->AppendConfig(absl::StrCat("[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"", tokens,
                                 "\"\nlayout_id = \"ha-test\"\nregion_size = \"16M\"\n"
                                 "alignment = \"4K\"\n"));
  }
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  // The leader's coordinator loaded its state from etcd as user root: it serves.
  const int lmcache_port = a.LmcachePort();
  ASSERT_GT(lmcache_port, 0) << ReadFile(a.log);
  EXPECT_TRUE(Eventually([&] { return Http(lmcache_port, "GET", "/readyz", "").first == 200; },
                         milliseconds(10000)))
      << ReadFile(a.log);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 2, &inc, &granted[0]));
  ExpectNoExtentLentTwice(a, granted);
  EXPECT_EQ(b.Role(), "standby");
  // Discovery on an etcd with authentication: without a user the host is told what to set;
  // with CXLKV_ETCD_USER and CXLKV_ETCD_PASSWORD_FILE it finds the leader.
  auto anonymous = orch::HostClient::Connect(EtcdSpec(*etcd_, "hatest"), 1);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_NE(anonymous.status().message().find("CXLKV_ETCD_USER"), std::string::npos)
      << anonymous.status();
  ASSERT_EQ(::setenv("CXLKV_ETCD_USER", "root", 1), 0);
  ASSERT_EQ(::setenv("CXLKV_ETCD_PASSWORD_FILE", pw.c_str(), 1), 0);
  auto host = orch::HostClient::Connect(EtcdSpec(*etcd_, "hatest"), 1);
  ::unsetenv("CXLKV_ETCD_USER");
  ::unsetenv("CXLKV_ETCD_PASSWORD_FILE");
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE((*host)->Grow(1).ok());
  EXPECT_FALSE(c.Start());
  const std::string clog = ReadFile(c.log);
  EXPECT_NE(clog.find("etcd user 'root'"), std::string::npos) << clog;

  // The prefix directory on the same etcd: the reader with the user reads it, without one it
  // is told etcd wants authentication; the orchestrators' Directory RPC reads with their
  // [etcd] user; cxlkvctl where --etcd with CXLKV_ETCD_USER and CXLKV_ETCD_PASSWORD_FILE.
  namespace dir = ::cxlkv::orchestrator::directory;
  dir::ReaderOptions ro;
  ro.client.endpoints = etcd_->endpoints();
  ro.follow = false;
  auto refused = dir::DirectoryReader::Open(ro);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("etcd requires authentication"), std::string::npos)
      << refused.status();
  ro.client.user = "root";
  ro.client.password = "rootpw";
  auto reader = dir::DirectoryReader::Open(ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (HaOrchestrator* o : {&a, &b}) {
    auto dc = orch::DirectoryClient::Connect(o->socket);
    ASSERT_TRUE(dc.ok()) << dc.status();
    auto answer = (*dc)->Where(co::PrefixKey{1, 2});
    EXPECT_TRUE(answer.ok()) << o->socket << ": " << answer.status();
  }
  std::string endpoints;
  for (const std::string& e : etcd_->endpoints()) {
    absl::StrAppend(&endpoints, endpoints.empty() ? "" : ",", e);
  }
  const std::string where = std::string(CXLKV_CTL_BIN) + " where 0000000000000002" +
                            "0000000000000001 --etcd " + endpoints + " --json 2>&1";
  std::string out;
  EXPECT_NE(Sh(where, &out), 0) << out;
  EXPECT_NE(out.find("CXLKV_ETCD_USER"), std::string::npos) << out;
  EXPECT_EQ(Sh("CXLKV_ETCD_USER=root CXLKV_ETCD_PASSWORD_FILE=" + pw + " " + where, &out), 0)
      << out;
  EXPECT_NE(out.find("\"domains\""), std::string::npos) << out;
}

// `cxlkvctl status` names the role, the leader, its epoch and the standbys; the Prometheus
// endpoint exports elections won, step-downs, etcd request latency, the epoch, the read-only
// state and the last takeover, on the leader and on the standby that takes over.
TEST_F(HaTest, StatusAndMetricsShowTheLeadership) {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  HaOrchestrator a(d_, *etcd_, "a", 3, 60000, ports[0]), b(d_, *etcd_, "b", 3, 60000, ports[1]);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  const std::int64_t epoch = a.Status().epoch();
  std::string out;
  ASSERT_TRUE(Eventually(
      [&] {
        out = Ctl("status --socket " + a.socket);
        return out.find("standbys   1:") != std::string::npos;
      },
      milliseconds(5000)))
      << out;
  EXPECT_NE(out.find("role       leader\n"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("epoch      ", epoch, "\n")), std::string::npos) << out;
  EXPECT_NE(out.find("\"node\":\"a\""), std::string::npos) << out;  // the leader line
  EXPECT_NE(out.find("\"node\":\"b\""), std::string::npos) << out;  // the standby
  const std::string json = Ctl("status --json --socket " + b.socket);
  EXPECT_NE(json.find("\"role\": \"standby\""), std::string::npos) << json;
  EXPECT_NE(json.find(absl::StrCat("\"epoch\": \"", epoch, "\"")), std::string::npos) << json;
  std::string m;
  ASSERT_TRUE(Eventually(
      [&] {
        m = Metrics(ports[0]);
        return MetricValue(m, "cxlkv_ha_elections_won_total") == 1 &&
               MetricValue(m, "cxlkv_ha_etcd_request_seconds_count") > 0;
      },
      milliseconds(5000)))
      << m;
  EXPECT_EQ(MetricValue(m, "cxlkv_ha_epoch"), static_cast<double>(epoch)) << m;
  EXPECT_EQ(MetricValue(m, "cxlkv_ha_read_only"), 0) << m;
  EXPECT_EQ(MetricValue(m, "cxlkv_ha_step_downs_total"), 0) << m;
  EXPECT_GT(MetricValue(m, "cxlkv_ha_last_takeover_timestamp_seconds"), 1.6e9) << m;
  EXPECT_GE(MetricValue(m, "cxlkv_ha_last_takeover_seconds"), 0) << m;
  EXPECT_NE(m.find("cxlkv_ha_role{role=\"leader\"} 1"), std::string::npos) << m;
  EXPECT_NE(Metrics(ports[1]).find("cxlkv_ha_role{role=\"standby\"} 1"), std::string::npos);
  a.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(15000)));
  ASSERT_TRUE(Eventually(
      [&] {
        m = Metrics(ports[1]);
        return MetricValue(m, "cxlkv_ha_elections_won_total") == 1;
      },
      milliseconds(5000)))
      << m;
  EXPECT_GT(MetricValue(m, "cxlkv_ha_epoch"), static_cast<double>(epoch)) << m;
  EXPECT_GT(MetricValue(m, "cxlkv_ha_last_takeover_timestamp_seconds"), 1.6e9) << m;
  out = Ctl("status --socket " + b.socket);
  EXPECT_NE(out.find("role       leader\n"), std::string::npos) << out;
  EXPECT_NE(out.find("standbys   0\n"), std::string::npos) << out;
}

// A reply that travelled across a failover: the host's heartbeat to the old leader (epoch E)
// is answered, and before it is applied the old leader dies, the standby takes over (epoch
// E' > E) and grants this host an extent. The old leader's reply must then be refused, naming
// both epochs (it renews leases on a deposed leader's word); the next heartbeat reaches the
// new leader. Without the host's epoch check the stale reply is applied and returns OK.
TEST_F(HaTest, AReplyFromAnOlderEpochIsRefused) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  std::atomic<bool> armed{false};
  std::function<void()> in_flight;
  orch::HostClientOptions opt;
  opt.before_heartbeat_applied = [&] {
    if (armed.exchange(false)) in_flight();
  };
  auto host = orch::HostClient::Connect(a.socket + "," + b.socket, 0, opt);
  ASSERT_TRUE(host.ok()) << host.status();
  auto first = (*host)->Grow(1);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::int64_t old_epoch = (*host)->leader_epoch();
  ASSERT_GT(old_epoch, 0);
  std::int64_t new_epoch = 0;
  in_flight = [&] {
    a.Kill(SIGKILL);
    ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(15000)));
    auto more = (*host)->Grow(1);  // answered by b
    ASSERT_TRUE(more.ok()) << more.status();
    new_epoch = (*host)->leader_epoch();
  };
  armed = true;
  const absl::Status stale = (*host)->HeartbeatOnce();
  ASSERT_GT(new_epoch, old_epoch);
  EXPECT_TRUE(absl::IsUnavailable(stale)) << stale;
  EXPECT_NE(stale.message().find(absl::StrCat("epoch ", old_epoch)), std::string::npos) << stale;
  EXPECT_NE(stale.message().find(absl::StrCat("epoch ", new_epoch)), std::string::npos) << stale;
  // The next heartbeat reaches the new leader, same incarnation, both extents held.
  ASSERT_TRUE((*host)->HeartbeatOnce().ok());
  EXPECT_EQ((*host)->rejoins(), 0u);
  EXPECT_EQ((*host)->extents().size(), 2u);
  EXPECT_TRUE((*host)->ExtentsValid());
}

// SIGSTOP of the etcd raft leader (Mooncake #2253's case): etcd elects another raft leader
// and extends every lease; the orchestrator leader either rides it out or fences itself and a
// new term starts. Either way grants are served again soon, no epoch writes after a newer one,
// and nothing is lent twice.
TEST_F(HaTest, EtcdLeaderStoppedGrantsResume) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 2, &inc, &granted[0]));
  const int raft_leader = etcd_->LeaderIndex();
  ASSERT_GE(raft_leader, 0);
  etcd_->Pause(raft_leader);
  const std::int64_t t0 = NowMs();
  std::vector<std::uint32_t> more;
  HaOrchestrator* served = FirstToGrant({&a, &b}, 0, inc, milliseconds(20000), &more);
  ASSERT_NE(served, nullptr) << "no grant served while the etcd leader is stopped";
  std::printf("etcd raft leader stopped: a grant served again after %lld ms, by %s (%s)\n",
              static_cast<long long>(NowMs() - t0), served == &a ? "a" : "b",
              served == &a ? "the same leader" : "a new leader");
  for (std::uint32_t e : more) EXPECT_TRUE(granted[0].insert(e).second) << "extent " << e;
  etcd_->Resume(raft_leader);
  std::string why;
  ASSERT_TRUE(etcd_->WaitHealthy(milliseconds(15000), &why)) << why;
  std::this_thread::sleep_for(milliseconds(500));
  HaOrchestrator* leader = nullptr;
  ASSERT_TRUE(Eventually(
      [&] {
        return (leader = Leader({&a, &b})) != nullptr;
      },
      milliseconds(10000)));
  ExpectNoExtentLentTwice(*leader, granted);
  EXPECT_EQ(audit.Regression(), 0u);
}

// etcd loses quorum for longer than the session TTL: the leader turns read-only (docs/ha.md):
// it keeps answering heartbeats, so a host's lent extents stay valid through an outage longer
// than ¾ of their capacity lease (4 s here, outage 6 s), and reads; it refuses new extents and
// membership changes naming since when etcd is unreachable, and applies no publication (the
// owner writes nothing to the domain). Hosts keep finding published blocks in CXL. It never
// exits. When quorum is back a leader serves again with the state intact, the publication
// made during the outage is applied, and nothing was lent twice.
TEST_F(HaTest, QuorumLostLongerThanTheTtl) {
  const std::vector<int> ports = FreeLoopbackPorts(1);
  HaOrchestrator a(d_, *etcd_, "a", 3, 4000, ports[0]), b(d_, *etcd_, "b", 3, 4000);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  auto client = orch::HostClient::Connect(a.socket + "," + b.socket, 0);
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->StartHeartbeats();
  auto g = (*client)->Grow(2);
  ASSERT_TRUE(g.ok()) << g.status();
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  for (const auto& e : *g) granted[0].insert(e.index);
  const std::int64_t epoch = a.Status().epoch();
  // A published block, looked up by a host through CXL alone.
  CxlHost host(d_.domain);
  const co::PrefixKey key = host.Key({4, 5, 6});
  const co::BlockRef ref = TestRef(7, 3);
  ASSERT_TRUE(host.PublishAndWait(key, ref));

  // Two of three members stopped: no quorum.
  const int l = etcd_->LeaderIndex();
  ASSERT_GE(l, 0);
  const int f = (l + 1) % 3;
  etcd_->Pause(l);
  etcd_->Pause(f);
  const std::int64_t t0 = NowMs();
  ASSERT_TRUE(Eventually([&] { return a.Role() == "read-only"; }, milliseconds(5000)))
      << "the leader did not turn read-only";
  // The deadline is at most TTL - margin (2.25 s) after the stop; the rest is slack for a
  // loaded machine (the test sees the role through an RPC to the orchestrator).
  EXPECT_LE(NowMs() - t0, 3500) << "later than the TTL";
  const pb::StatusReply st = a.Status();
  EXPECT_EQ(st.epoch(), epoch);
  EXPECT_FALSE(st.read_only_since().empty());
  std::uint64_t inc9 = 0;
  const grpc::Status join = HostCalls::Join(a, 3, &inc9);
  EXPECT_EQ(join.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(join.error_message().find("etcd unreachable since " + st.read_only_since()),
            std::string::npos)
      << join.error_message();
  EXPECT_NE(join.error_message().find("read-only until it is back"), std::string::npos);
  const std::uint64_t inc = (*client)->incarnation();
  std::vector<std::uint32_t> refused;
  const grpc::Status grow = HostCalls::Grow(a, 0, inc, 1, &refused);
  EXPECT_EQ(grow.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(grow.error_message().find("read-only until it is back"), std::string::npos)
      << grow.error_message();
  EXPECT_TRUE(refused.empty());
  // A publication during the outage: posted to the host's ring, not applied while read-only.
  const co::PrefixKey key2 = host.Key({7, 8, 9});
  ASSERT_TRUE(host.Publish(key2, TestRef(7, 4)).ok());
  // Long past the TTL and past ¾ of the capacity lease: heartbeats answered, extents valid,
  // lookups keep working. Prefix leases do not (audit-ha #4): a lease needs a heartbeat the
  // owner acknowledged in the domain, and the read-only leader released its term (it stores
  // nothing more to the domain), so leases stop host_ttl - margin after the last
  // acknowledgement (which the owner wrote until its write deadline). docs/ha.md says so.
  std::uint64_t heartbeats = 0, leases_early = 0;
  absl::Status late_lease, first_lease = absl::UnknownError("none tried");
  const std::int64_t loop_start = NowMs() - t0;
  while (NowMs() - t0 < 8000) {
    (void)host->Heartbeat(nullptr);  // the CXL host's own liveness (host_ttl 4 s here)
    const absl::Status lease = host.AcquireAndRelease(key);
    if (absl::IsUnknown(first_lease)) first_lease = lease;
    if (NowMs() - t0 < 4000) leases_early += lease.ok();
    if (NowMs() - t0 > 7500) late_lease = lease;
    const auto hit = host.Lookup(key);
    ASSERT_TRUE(hit.has_value()) << "a lookup failed during the etcd outage";
    EXPECT_TRUE(hit->ref == ref);
    EXPECT_FALSE(host.Lookup(key2).has_value()) << "a publication applied read-only";
    pb::HeartbeatReply hb;
    const grpc::Status hs = HostCalls::Heartbeat(a, 0, inc, &hb);
    EXPECT_TRUE(hs.ok()) << hs.error_message();
    heartbeats += hs.ok();
    EXPECT_EQ(hb.epoch(), epoch);
    EXPECT_TRUE((*client)->ExtentsValid()) << "extents invalid " << NowMs() - t0 << " ms into "
                                           << "the outage";
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_GT(heartbeats, 10u);
  EXPECT_GT(leases_early, 0u) << "no prefix lease in the outage's first 4 s (tried from "
                              << loop_start << " ms): " << first_lease;
  EXPECT_FALSE(late_lease.ok()) << "a prefix lease host_ttl after the last acknowledgement";
  EXPECT_NE(late_lease.message().find("acknowledged"), std::string::npos) << late_lease;
  const std::string m = Metrics(ports[0]);
  EXPECT_EQ(MetricValue(m, "cxlkv_ha_read_only"), 1) << m;
  EXPECT_EQ(MetricValue(m, "cxlkv_ha_step_downs_total"), 1) << m;
  EXPECT_GE(MetricValue(m, "cxlkv_ha_keepalive_failures_total"), 1) << m;
  EXPECT_NE(
      Ctl("status --socket " + a.socket).find("role       read-only since " + st.read_only_since()),
      std::string::npos);
  EXPECT_EQ(Leader({&a, &b}), nullptr) << "someone changed the domain without etcd";
  EXPECT_EQ(b.Role(), "standby");
  EXPECT_EQ(::waitpid(a.pid, nullptr, WNOHANG), 0) << "the read-only leader exited";
  etcd_->Resume(l);
  etcd_->Resume(f);
  std::string why;
  ASSERT_TRUE(etcd_->WaitHealthy(milliseconds(15000), &why)) << why;
  HaOrchestrator* leader = nullptr;
  ASSERT_TRUE(Eventually(
      [&] {
        return (leader = Leader({&a, &b})) != nullptr;
      },
      milliseconds(15000)));
  EXPECT_GT(leader->Status().epoch(), epoch);
  ASSERT_TRUE(Eventually([&] { return (*client)->HeartbeatOnce().ok(); }, milliseconds(5000)));
  EXPECT_EQ((*client)->incarnation(), inc);
  EXPECT_EQ((*client)->rejoins(), 0u);
  EXPECT_TRUE((*client)->ExtentsValid());
  auto g2 = (*client)->Grow(1);
  ASSERT_TRUE(g2.ok()) << g2.status();
  for (const auto& e : *g2) EXPECT_TRUE(granted[0].insert(e.index).second) << "extent " << e.index;
  std::set<std::uint32_t> held;
  for (const auto& e : (*client)->extents()) held.insert(e.index);
  EXPECT_EQ(held, granted[0]);
  ExpectNoExtentLentTwice(*leader, granted);
  ASSERT_TRUE(Eventually(
      [&] {
        (void)host->Heartbeat(nullptr);
        return host.Lookup(key2).has_value();
      },
      milliseconds(5000)))
      << "the publication made during the outage was lost";
  ASSERT_TRUE(Eventually(
      [&] {
        (void)host->Heartbeat(nullptr);
        return host.AcquireAndRelease(key).ok();
      },
      milliseconds(5000)))
      << "prefix leases did not resume under the new leader";
  EXPECT_EQ(leader->Status().prefixes_published(), 2u);
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_TRUE((*client)->Leave().ok());
}

// Failover time after kill -9 of the leader (to a Grow served by the new leader), over
// CXLKV_HA_TRIALS trials (default 3): median and worst, printed.
TEST_F(HaTest, FailoverTimeAfterKillNine) {
  int trials = 3;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::vector<std::unique_ptr<HaOrchestrator>> orch;
  for (const char* n : {"a", "b", "c"})
    orch.push_back(std::make_unique<HaOrchestrator>(d_, *etcd_, n));
  ASSERT_TRUE(StartLeaderAndStandbys(*orch[0], {orch[1].get(), orch[2].get()}));
  FenceAudit audit(d_.domain);
  std::uint64_t inc = 0;
  ASSERT_TRUE(HostCalls::Join(*orch[0], 0, &inc).ok());
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::vector<std::int64_t> times;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<HaOrchestrator*> all;
    for (auto& o : orch) all.push_back(o.get());
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(Eventually([&] { return (leader = Leader(all)) != nullptr; }, milliseconds(10000)));
    leader->Kill(SIGKILL);
    const std::int64_t t0 = NowMs();
    std::vector<std::uint32_t> got;
    // The old leader is not asked: killed, its pid is gone.
    HaOrchestrator* next = FirstToGrant(all, 0, inc, milliseconds(20000), &got);
    ASSERT_NE(next, nullptr) << "trial " << trial << ": no standby served a grant";
    times.push_back(NowMs() - t0);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(granted[0].insert(got[0]).second)
        << "trial " << trial << ": extent " << got[0] << " lent twice";
    // Every extent granted so far is still host 0's at the new leader.
    ExpectNoExtentLentTwice(*next, granted);
    ASSERT_TRUE(leader->Start());  // back as a standby
  }
  EXPECT_EQ(audit.Regression(), 0u);
  std::vector<std::int64_t> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const std::int64_t median = sorted[sorted.size() / 2];
  const std::int64_t worst = sorted.back();
  std::string all_times;
  for (std::int64_t t : times) absl::StrAppend(&all_times, all_times.empty() ? "" : " ", t);
  std::printf(
      "failover (kill -9 of the leader -> a grant served), ttl 3 s, %d trials: median %lld "
      "ms, worst %lld ms [%s]\n",
      trials, static_cast<long long>(median), static_cast<long long>(worst), all_times.c_str());
  EXPECT_LT(median, 5000);
}

// Failover with several hosts following the leader: kill -9 of the leader, then the time until
// every host's heartbeat thread has been answered by the new leader (its leader epoch grew),
// over CXLKV_HA_TRIALS trials (default 1; 20 under the stress label as
// orchestrator_ha_reattach_20) with CXLKV_HA_HOSTS hosts (default 8): half follow through
// their endpoint list, half find the leader in etcd. Median and worst, printed; every host
// keeps its incarnation and extents, nothing is lent twice.
TEST_F(HaTest, EveryHostReattachedAfterKillNine) {
  int trials = 1;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  ReattachBed bed;
  ASSERT_TRUE(StartReattachBed(n_hosts, {}, &bed));
  auto& hosts = bed.hosts;
  const auto& incs = bed.incs;
  FenceAudit audit(d_.domain);
  std::vector<std::int64_t> all, by_list, by_etcd;
  for (int trial = 0; trial < trials; ++trial) {
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(
        Eventually([&] { return (leader = Leader(bed.all())) != nullptr; }, milliseconds(10000)));
    std::int64_t old_epoch = 0;
    for (auto& h : hosts) old_epoch = std::max(old_epoch, h->leader_epoch());
    leader->Kill(SIGKILL);
    const std::int64_t t0 = NowMs();
    std::vector<std::int64_t> at;
    ASSERT_TRUE(bed.WaitForEveryHost(old_epoch, t0, &at))
        << "trial " << trial << ": not every host re-attached";
    std::int64_t worst_list = 0, worst_etcd = 0;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      (h % 2 == 0 ? worst_list : worst_etcd) =
          std::max(h % 2 == 0 ? worst_list : worst_etcd, at[h]);
      EXPECT_EQ(hosts[h]->incarnation(), incs[h]) << "trial " << trial << " host " << h;
      EXPECT_TRUE(hosts[h]->ExtentsValid()) << "trial " << trial << " host " << h;
    }
    all.push_back(std::max(worst_list, worst_etcd));
    by_list.push_back(worst_list);
    by_etcd.push_back(worst_etcd);
    ASSERT_TRUE(leader->Start());  // back as a standby
  }
  ExpectReattachBedIntact(bed);
  EXPECT_EQ(audit.Regression(), 0u);
  auto summary = [](std::vector<std::int64_t> v) {
    std::sort(v.begin(), v.end());
    return absl::StrCat("median ", v[v.size() / 2], " ms, worst ", v.back(), " ms");
  };
  std::string times;
  for (std::int64_t t : all) absl::StrAppend(&times, times.empty() ? "" : " ", t);
  std::printf(
      "kill -9 of the leader -> all %u hosts re-attached (heartbeat 100 ms, ttl 3 s), %d trials: "
      "%s [%s]; endpoint-list hosts %s; etcd-discovery hosts %s\n",
      n_hosts, trials, summary(all).c_str(), times.c_str(), summary(by_list).c_str(),
      summary(by_etcd).c_str());
}

// etcd writes at CXLKV_HA_HOSTS hosts (default 8; 64 under the stress label as
// orchestrator_ha_etcd_writes_64): the hosts join, heartbeat (every 100 ms) for a while, then
// each grows and shrinks one extent in a loop for CXLKV_HA_CHURN_S seconds (default 1). etcd's
// own counters (mvcc txns and puts, raft proposals committed, from its /metrics) and the
// leader's guarded state writes give the writes per second of each phase; printed.
TEST_F(HaTest, EtcdWritesPerSecondWithManyHosts) {
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  double churn_s = 1;
  if (const char* c = std::getenv("CXLKV_HA_CHURN_S")) churn_s = std::max(1.0, std::atof(c));
  const std::vector<int> ports = FreeLoopbackPorts(1);
  HaOrchestrator a(d_, *etcd_, "a", 3, 60000, ports[0], n_hosts),
      b(d_, *etcd_, "b", 3, 60000, 0, n_hosts);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  // One member's counters: every member applies the same writes.
  const int etcd_port = std::atoi(etcd_->endpoints()[0].substr(10).c_str());
  struct Counts {
    double txn = 0, put = 0, proposals = 0, state_writes = 0, etcd_s = 0, etcd_n = 0;
    std::int64_t at_ms = 0;
  };
  auto sample = [&] {
    Counts c;
    const std::string e = Metrics(etcd_port);
    c.txn = MetricValue(e, "etcd_mvcc_txn_total");
    c.put = MetricValue(e, "etcd_mvcc_put_total");
    c.proposals = MetricValue(e, "etcd_server_proposals_committed_total");
    const std::string m = Metrics(ports[0]);
    c.state_writes = MetricValue(m, "cxlkv_ha_state_writes_total");
    c.etcd_s = MetricValue(m, "cxlkv_ha_etcd_request_seconds_sum");
    c.etcd_n = MetricValue(m, "cxlkv_ha_etcd_request_seconds_count");
    c.at_ms = NowMs();
    return c;
  };
  auto report = [&](const char* phase, const Counts& x, const Counts& y) {
    const double s = static_cast<double>(y.at_ms - x.at_ms) / 1000.0;
    std::printf(
        "%u hosts, %s (%.1f s): etcd txn %.1f/s, put %.1f/s, raft proposals %.1f/s; leader's "
        "state writes %.1f/s, its etcd requests %.2f ms on average\n",
        n_hosts, phase, s, (y.txn - x.txn) / s, (y.put - x.put) / s,
        (y.proposals - x.proposals) / s, (y.state_writes - x.state_writes) / s,
        y.etcd_n > x.etcd_n ? 1000 * (y.etcd_s - x.etcd_s) / (y.etcd_n - x.etcd_n) : 0.0);
    return (y.state_writes - x.state_writes) / s;
  };
  ASSERT_TRUE(Eventually([&] { return sample().state_writes >= 0; }, milliseconds(5000)));
  Counts c0 = sample();
  std::vector<std::unique_ptr<orch::HostClient>> hosts(n_hosts);
  {
    std::vector<std::thread> joins;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      joins.emplace_back([&, h] {
        auto c = orch::HostClient::Connect(a.socket, h);
        ASSERT_TRUE(c.ok()) << "host " << h << ": " << c.status();
        (*c)->StartHeartbeats();
        hosts[h] = *std::move(c);
      });
    }
    for (auto& t : joins) t.join();
  }
  for (auto& h : hosts) ASSERT_NE(h, nullptr);
  // The leader's metrics are refreshed every 200 ms: let them catch up with the joins.
  std::this_thread::sleep_for(milliseconds(400));
  Counts c1 = sample();
  report("joining", c0, c1);
  std::this_thread::sleep_for(milliseconds(static_cast<std::int64_t>(churn_s * 1000)));
  Counts c2 = sample();
  report("heartbeats only", c1, c2);
  EXPECT_EQ(c2.txn, c1.txn) << "heartbeats should not write etcd";
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> grows{0}, failures{0};
  absl::Mutex first_mu;
  std::string first_failure;
  auto failed = [&](const absl::Status& st) {
    ++failures;
    absl::MutexLock l(&first_mu);
    if (first_failure.empty()) first_failure = st.ToString();
  };
  std::vector<std::thread> churn;
  for (std::uint32_t h = 0; h < n_hosts; ++h) {
    churn.emplace_back([&, h] {
      while (!stop.load()) {
        auto g = hosts[h]->Grow(1);
        if (!g.ok() || g->empty()) {
          failed(g.ok() ? absl::ResourceExhaustedError("granted none") : g.status());
          std::this_thread::sleep_for(milliseconds(20));
          continue;
        }
        ++grows;
        std::vector<std::uint32_t> back;
        for (const auto& e : *g) back.push_back(e.index);
        if (auto st = hosts[h]->Shrink(back); !st.ok()) failed(st);
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(static_cast<std::int64_t>(churn_s * 1000)));
  Counts c3 = sample();
  stop = true;
  for (auto& t : churn) t.join();
  const double busy = report("every host growing and shrinking in a loop", c2, c3);
  struct stat sb {};
  const long long state_bytes =
      ::stat((a.dir + "/d.state").c_str(), &sb) == 0 ? static_cast<long long>(sb.st_size) : -1;
  std::printf(
      "%u hosts churning: %llu grows (each followed by a shrink), %llu refused or failed%s%s; "
      "the state each write carries: %lld bytes\n",
      n_hosts, static_cast<unsigned long long>(grows.load()),
      static_cast<unsigned long long>(failures.load()),
      first_failure.empty() ? "" : ", first: ", first_failure.c_str(), state_bytes);
  EXPECT_GT(busy, 1.0);
  EXPECT_GT(grows.load(), 0u);
  for (auto& h : hosts) EXPECT_TRUE(h->Leave().ok());
}

// ---- the fence, without etcd ------------------------------------------------------------------

class Gate final : public orch::WriteGate {
 public:
  bool WriteAllowed() const override { return open.load(); }
  std::atomic<bool> open{true};
};

TEST(Fence, FencedMemDropsStoresOnceTheGateCloses) {
  std::vector<std::byte> buf(8192);
  co::DirectMem direct(buf.data(), buf.size());
  Gate gate;
  orch::FencedMem mem(direct, gate);
  const std::uint64_t one = 1, two = 2;
  mem.Write(64, &one, sizeof(one));
  mem.Flush(64, sizeof(one));
  gate.open = false;
  mem.Write(64, &two, sizeof(two));
  mem.WriteNt(128, &two, sizeof(two));
  mem.Fence();
  std::uint64_t at64 = 0, at128 = 0;
  mem.Read(64, &at64, sizeof(at64));
  mem.Read(128, &at128, sizeof(at128));
  EXPECT_EQ(at64, 1u);
  EXPECT_EQ(at128, 0u);
  EXPECT_EQ(mem.dropped(), 2u);
  gate.open = true;  // (an election never reopens a closed gate; the Mem does not care)
  mem.Write(64, &two, sizeof(two));
  mem.Read(64, &at64, sizeof(at64));
  EXPECT_EQ(at64, 2u);
}

// The release (docs/ha.md "Release") on the non-coherence simulator: a store the old machine
// made but never wrote back (its process stopped or killed between the store and the clwb)
// reaches memory before the release line does, so a successor on another machine that sees
// the release finds it. Without the write-back of the domain range, the store would still sit
// in the old machine's cache, to land over the successor's lines at any later time (audit-ha
// #2).
TEST(Fence, ReleaseWritesTheOldMachinesCacheBackBeforeTheReleaseLine) {
  co::SimMemory media(64 * 1024, 1, co::SimOptions{});
  auto old_machine = media.NewView(0);
  auto successor = media.NewView(0);
  const std::uint64_t entry = 8192, value = 0xAB;
  old_machine->Write(entry, &value, sizeof(value));  // dirty in its cache, never flushed
  std::uint64_t seen = 0;
  successor->Invalidate(entry, sizeof(seen));
  successor->Read(entry, &seen, sizeof(seen));
  ASSERT_EQ(seen, 0u) << "the simulator lost its non-coherence";
  co::OwnerReleaseLine r{};
  ASSERT_TRUE(orch::ReadReleaseLine(*successor, &r));  // all zero: nothing released yet
  EXPECT_EQ(r.epoch, 0u);
  co::OwnerReleaseLine w{};
  w.epoch = 5;
  w.cluster_id = 9;
  w.by = co::kReleasedByAgent;
  orch::ReleaseTerm(*old_machine, media.size_bytes(), w);
  ASSERT_TRUE(orch::ReadReleaseLine(*successor, &r));
  EXPECT_EQ(r.epoch, 5u);
  EXPECT_EQ(r.cluster_id, 9u);
  EXPECT_EQ(r.version, co::kOwnerReleaseVersion);
  successor->Invalidate(entry, sizeof(seen));
  successor->Read(entry, &seen, sizeof(seen));
  EXPECT_EQ(seen, value) << "the release line was visible before the old machine's store";
  // Lies in the header page, before the fence line, clear of the header.
  EXPECT_EQ(co::kOwnerReleaseOffset + 64, co::kOwnerFenceOffset);
}

// The fence and release lines between machines without coherence: a reader on another
// machine that read the line before (its cache holds the old copy) sees the latest once the
// writer's call returned. Write-backs here complete only at a fence, and an Evict only at the
// next full fence, so a missing flush, fence or invalidate on either side shows.
TEST(Fence, LinesCrossMachinesWithoutCoherence) {
  co::SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  co::SimMemory media(64 * 1024, 2, o);
  auto writer = media.NewView(0);
  auto reader = media.NewView(0);
  // Each line is read (and so cached) right before the writer writes it, and read again right
  // after with nothing in between: only the read's own invalidate can drop the stale copy.
  co::OwnerFenceLine f{};
  co::OwnerReleaseLine r{};
  ASSERT_TRUE(orch::ReadFenceLine(*reader, &f));  // cached now: all zero
  co::OwnerFenceLine w{};
  w.epoch = 12;
  w.cluster_id = 5;
  orch::WriteFenceLine(*writer, w);
  ASSERT_TRUE(orch::ReadFenceLine(*reader, &f));
  EXPECT_EQ(f.epoch, 12u);
  ASSERT_TRUE(orch::ReadReleaseLine(*reader, &r));  // cached now: all zero
  co::OwnerReleaseLine rl{};
  rl.epoch = 12;
  rl.cluster_id = 5;
  orch::ReleaseTerm(*writer, media.size_bytes(), rl);
  ASSERT_TRUE(orch::ReadReleaseLine(*reader, &r));
  EXPECT_EQ(r.epoch, 12u);
}

// The fenced view passes every flush, invalidate, eviction and fence through (only stores are
// gated): a leader's write-backs and a successor's fresh reads go through it.
TEST(Fence, FencedMemPassesCacheOperationsThrough) {
  co::SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  co::SimMemory media(64 * 1024, 3, o);
  auto va = media.NewView(0);
  auto vb = media.NewView(0);
  Gate gate;
  orch::FencedMem a(*va, gate), b(*vb, gate);
  const std::uint64_t x = 4096 * 2, y = 4096 * 3, one = 1, two = 2;
  std::uint64_t got = 0;
  b.Read(x, &got, sizeof(got));  // cached by b
  b.Read(y, &got, sizeof(got));
  a.Write(x, &one, sizeof(one));
  a.Flush(x, sizeof(one));
  a.Fence();
  b.Invalidate(x, sizeof(got));
  b.Read(x, &got, sizeof(got));
  EXPECT_EQ(got, 1u) << "a's flush or fence, or b's invalidate, did not pass";
  a.Write(y, &two, sizeof(two));
  a.Flush(y, sizeof(two));
  a.FullFence();
  b.Evict(y, sizeof(got));
  b.FullFence();
  b.Read(y, &got, sizeof(got));
  EXPECT_EQ(got, 2u) << "a's full fence, or b's eviction or full fence, did not pass";
}

// What a successor waits for: the release of exactly the term the fence line names.
TEST(Fence, ASuccessorWaitsForTheReleaseOfTheTermTheFenceLineNames) {
  co::OwnerFenceLine f{};
  co::OwnerReleaseLine none{}, r{};
  EXPECT_TRUE(orch::TermReleased(true, f, true, none, none)) << "never elected: nothing to wait";
  f.epoch = 10;
  f.cluster_id = 3;
  EXPECT_FALSE(orch::TermReleased(true, f, true, none, none));
  EXPECT_FALSE(orch::TermReleased(true, f, false, r, none)) << "a torn release line";
  r.epoch = 9;
  r.cluster_id = 3;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "an older term's release";
  r.epoch = 11;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "another term's release";
  r.epoch = 10;
  r.cluster_id = 4;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "a foreign cluster's epoch 10";
  r.cluster_id = 3;
  EXPECT_TRUE(orch::TermReleased(true, f, true, r, none));
  // A torn fence line: its term is unknown; only a release written after the wait began.
  EXPECT_FALSE(orch::TermReleased(false, f, true, r, r));
  co::OwnerReleaseLine later = r;
  later.at_ms = 1;
  EXPECT_TRUE(orch::TermReleased(false, f, true, later, r));
}

TEST(Fence, LineRoundTripsAndATornLineDoesNotValidate) {
  std::vector<std::byte> buf(8192);
  co::DirectMem mem(buf.data(), buf.size());
  co::OwnerFenceLine l{};
  ASSERT_TRUE(orch::ReadFenceLine(mem, &l));  // all zero: never elected, valid
  EXPECT_EQ(l.epoch, 0u);
  co::OwnerFenceLine w{};
  w.epoch = 42;
  w.cluster_id = 7;
  w.batches = 3;
  orch::WriteFenceLine(mem, w);
  ASSERT_TRUE(orch::ReadFenceLine(mem, &l));
  EXPECT_EQ(l.epoch, 42u);
  EXPECT_EQ(l.cluster_id, 7u);
  EXPECT_EQ(l.batches, 3u);
  EXPECT_EQ(l.version, co::kOwnerFenceVersion);
  // Lies where the header page says, beside the owner's clock line and clear of the header.
  EXPECT_EQ(co::kOwnerFenceOffset + 64, co::kOwnerClockOffset);
  EXPECT_GE(co::kOwnerFenceOffset, sizeof(co::DomainHeader));
  buf[co::kOwnerFenceOffset + 8] ^= std::byte{1};  // a torn write: half old, half new
  EXPECT_FALSE(orch::ReadFenceLine(mem, &l));
}

// A single orchestrator (no [etcd]) refuses a domain that elected orchestrators owned.
TEST(Fence, ASingleOrchestratorRefusesAnElectedDomain) {
  const cxlkv::testing::TempDir scratch("ha-single", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "s", nullptr), "single.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  {
    auto first = orch::Orchestrator::Open(*c, orch::OpenOptions{.new_domain = true});
    ASSERT_TRUE(first.ok()) << first.status();
  }
  // Reopens fine as long as no elected leader wrote the fence line.
  ASSERT_TRUE(orch::Orchestrator::Open(*c).ok());
  ASSERT_NO_FATAL_FAILURE(WriteFenceLineInFile(dir + "/domain", 9, 1));
  auto refused = orch::Orchestrator::Open(*c);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("[etcd]"), std::string::npos) << refused.status();
}

// ---- the fence on the leader's own clock, in process --------------------------------------------

// CLOCK_BOOTTIME plus an offset the test moves forward: from the inside, a process stopped for
// a while sees exactly this (its clock jumped; etcd's lease may have lived on or not).
class JumpingClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return base_.NowMs() + offset_.load(); }
  void Jump(std::int64_t ms) { offset_ += ms; }

 private:
  co::SteadyClock base_;
  std::atomic<std::int64_t> offset_{0};
};

std::string ReadAll(const std::string& path) { return ReadFile(path); }

// Once the write deadline passed on the leader's clock, not one more byte of the domain
// changes, even though the process runs on and etcd still holds its lease: the owner's
// batches stop at the deadline (before the election notices and steps down). Then it steps
// down and, alone, is elected again at a higher epoch. (With the owner's checks and the fenced
// Mem removed, the next owner batch writes within a few milliseconds and this test fails.)
TEST_F(HaTest, WritesStopAtTheDeadlineOnTheLeadersOwnClock) {
  const cxlkv::testing::TempDir scratch("ha-inproc", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "inproc", etcd_.get()), "inproc.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  JumpingClock clock;
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .clock = &clock, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  auto epoch = [&] { return (*o)->status().epoch; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  const std::int64_t first = epoch();
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().batches > 5;
      },
      milliseconds(3000)));

  std::string before;
  {
    // No owner batch runs while the test holds the lock: none is half done at the jump.
    orch::Orchestrator::Hold l(**o);
    clock.Jump(10'000);
    before = ReadAll(dir + "/domain");
    EXPECT_EQ(l.Role(), "standby");
    EXPECT_TRUE(absl::IsUnavailable(l.Serving()));
  }
  // Well before a re-election could write (it pauses 500 ms after stepping down). The one
  // store a deposed leader still makes is its release (docs/ha.md "The fence", layer 4):
  // every other byte stays as it was.
  std::this_thread::sleep_for(milliseconds(300));
  std::string after = ReadAll(dir + "/domain");
  ASSERT_EQ(after.size(), before.size());
  co::OwnerReleaseLine released{};
  std::memcpy(&released, after.data() + co::kOwnerReleaseOffset, sizeof(released));
  EXPECT_TRUE(co::LineValid(released));
  EXPECT_EQ(released.epoch, static_cast<std::uint64_t>(first));
  EXPECT_EQ(released.by, co::kReleasedByLeader);
  std::memcpy(after.data() + co::kOwnerReleaseOffset, before.data() + co::kOwnerReleaseOffset,
              sizeof(released));
  EXPECT_TRUE(after == before) << "the domain changed after the leader's write deadline passed";

  // Stepped down, campaigned again, and leads at a higher epoch (it is the only candidate).
  ASSERT_TRUE(
      Eventually([&] { return role() == "leader" && epoch() > first; }, milliseconds(10000)));
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == static_cast<std::uint64_t>(epoch()); },
                         milliseconds(2000)));
  EXPECT_EQ(audit.Regression(), 0u);
  (*o)->Stop();
  o->reset();
}

// The LMCache coordinator of a leader past its write deadline answers nothing (503), already
// before the election's step-down stands it by (held back here: the step-down waits for the
// orchestrator's lock, which the test holds): a deposed coordinator must not answer beside its
// successor's (docs/lmcache.md "Fail-over"). The gate is the one the daemon hands it
// (Orchestrator::LeadLmcache); forced open, /readyz answers 200 after the jump.
TEST_F(HaTest, LmcacheCoordinatorStopsServingAtTheWriteDeadline) {
  const cxlkv::testing::TempDir scratch("ha-lmcgate", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  const std::string token = "ha-test-lmcache-token-0123456789";
  std::ofstream(dir + "/tokens") << token << "\n";
  ::chmod((dir + "/tokens").c_str(), 0600);
  // A free port for the coordinator (lmcache.listen; the in-process daemon logs it only).
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(probe);
  auto c = orch::ParseConfig(
      InProcessToml(dir, "lmcgate", etcd_.get(),
                    "[lmcache]\nlisten = \"127.0.0.1:" + std::to_string(port) +
                        "\"\ntoken_file = \"" + dir +
                        "/tokens\"\nlayout_id = \"ha-test\"\nregion_size = \"16M\"\n"
                        "alignment = \"4K\"\n"),
      "lmcgate.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  JumpingClock clock;
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .clock = &clock, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  ASSERT_TRUE(Eventually([&] { return Http(port, "GET", "/readyz", "").first == 200; },
                         milliseconds(10000)))
      << "the leader's coordinator never served";
  {
    orch::Orchestrator::Hold l(**o);
    clock.Jump(10'000);
    EXPECT_EQ(Http(port, "GET", "/readyz", "").first, 503)
        << "the coordinator answers past the leader's write deadline";
    const auto lookup = Http(port, "POST", "/v1/lookup", token, "{}");
    EXPECT_EQ(lookup.first, 503) << lookup.second;
    EXPECT_NE(lookup.second.find("write deadline passed"), std::string::npos) << lookup.second;
  }
  (*o)->Stop();
  o->reset();
}

// Bad input: a fence line this leader did not write (a forged or foreign one: another
// cluster's leader, an operator's mistake) appears while it leads. Its next owner batch reads
// the line first and stops: not one byte of the domain changes after the line appeared, but
// the release (this leader's write-back and release line, written as it steps down). Its next
// election is refused while the line names an epoch not older than etcd's, saying why.
TEST_F(HaTest, AForeignFenceLineStopsTheLeaderBeforeItsNextStore) {
  const cxlkv::testing::TempDir scratch("ha-foreign", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "foreign", etcd_.get()), "foreign.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().batches > 5;
      },
      milliseconds(3000)));
  std::string before;
  co::OwnerFenceLine forged{};
  {
    // No batch is half done while the test holds the lock.
    orch::Orchestrator::Hold l(**o);
    before = ReadAll(dir + "/domain");
    std::memcpy(&forged, before.data() + co::kOwnerFenceOffset, sizeof(forged));
    forged.epoch += 1000;
    forged.batches = 0;
    co::SealLine(forged);
    std::memcpy(before.data() + co::kOwnerFenceOffset, &forged, sizeof(forged));
    std::ofstream(dir + "/domain", std::ios::in | std::ios::out | std::ios::binary)
        .seekp(static_cast<std::streamoff>(co::kOwnerFenceOffset))
        .write(reinterpret_cast<const char*>(&forged), sizeof(forged));
  }
  ASSERT_TRUE(Eventually([&] { return role() != "leader"; }, milliseconds(2000)))
      << "the leader kept leading under a foreign fence line";
  std::this_thread::sleep_for(milliseconds(300));
  std::string after = ReadAll(dir + "/domain");
  ASSERT_EQ(after.size(), before.size());
  co::OwnerFenceLine now{};
  std::memcpy(&now, after.data() + co::kOwnerFenceOffset, sizeof(now));
  EXPECT_EQ(now.epoch, forged.epoch) << "the foreign fence line was overwritten";
  // It stepped down (the election too, not only the owner): its term is released.
  co::OwnerReleaseLine released{};
  std::memcpy(&released, after.data() + co::kOwnerReleaseOffset, sizeof(released));
  EXPECT_TRUE(co::LineValid(released));
  EXPECT_EQ(released.epoch, forged.epoch - 1000) << "the deposed leader did not step down";
  // The release line is the one store a deposed leader still makes.
  std::memcpy(after.data() + co::kOwnerReleaseOffset, before.data() + co::kOwnerReleaseOffset,
              sizeof(co::OwnerReleaseLine));
  EXPECT_TRUE(after == before) << "the domain changed after a foreign fence line appeared";
  EXPECT_NE(role(), "leader") << "elected again over a fence line naming a newer epoch";
  (*o)->Stop();
  o->reset();
}

// Owner writes outside the owner loop, and the state's generation in the domain's record
// (audit-ha #3), with the loop asleep (owner_period_ms 10 s: after the takeover no batch runs
// during the test). Each state write records its generation in the fence line at once (not
// only at the next batch: an etcd restored in between would go unnoticed); an operator's Evict
// checks the fence line first and records itself in it; under a foreign fence line the Evict
// is refused and the leader steps down.
TEST_F(HaTest, OwnerWritesOutsideTheLoopCheckAndRecordTheFenceLine) {
  const cxlkv::testing::TempDir scratch("ha-outside", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(
      InProcessToml(dir, "outside", etcd_.get(),
                    "[timing]\nowner_period_ms = 10000\n"
                    "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"l\"\n"),
      "outside.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  auto fence = [&] {
    const std::string dom = ReadAll(dir + "/domain");
    co::OwnerFenceLine f{};
    std::memcpy(&f, dom.data() + co::kOwnerFenceOffset, sizeof(f));
    EXPECT_TRUE(co::LineValid(f));
    return f;
  };
  auto host = orch::HostClient::Connect(dir + "/o.sock", 0);
  ASSERT_TRUE(host.ok()) << host.status();
  auto grown = (*host)->Grow(1);
  ASSERT_TRUE(grown.ok()) << grown.status();
  // etcd's generation is the one the domain records.
  auto etcd = etcd_->NewClient();
  auto state = etcd->Get("/cxlkv/v1/default/domains/outside/state");
  ASSERT_TRUE(state.ok() && !state->kvs.empty()) << state.status();
  const std::string& text = state->kvs[0].value;
  const std::size_t at = text.find("\"generation\":");
  ASSERT_NE(at, std::string::npos) << text;
  const std::uint64_t gen = std::strtoull(text.c_str() + at + 13, nullptr, 10);
  EXPECT_GE(gen, 3u) << "takeover, join, grow: three writes";
  EXPECT_EQ(fence().state_gen, gen) << "the domain does not record the state's generation";
  // An operator's evict: checked and recorded.
  auto op = orch::OperatorClient::Connect(dir + "/o.sock");
  ASSERT_TRUE(op.ok()) << op.status();
  const std::uint64_t batches = fence().batches;
  auto evicted = (*op)->Evict("t/m/l");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(fence().batches, batches + 1) << "the evict did not record itself in the line";
  // A foreign fence line: the next evict is refused, the leader steps down.
  co::OwnerFenceLine forged = fence();
  forged.epoch += 1000;
  co::SealLine(forged);
  std::ofstream(dir + "/domain", std::ios::in | std::ios::out | std::ios::binary)
      .seekp(static_cast<std::streamoff>(co::kOwnerFenceOffset))
      .write(reinterpret_cast<const char*>(&forged), sizeof(forged));
  auto refused = (*op)->Evict("t/m/l");
  EXPECT_FALSE(refused.ok()) << "an owner write under a foreign fence line";
  EXPECT_TRUE(Eventually([&] { return role() != "leader"; }, milliseconds(2000)));
  EXPECT_EQ(fence().epoch, forged.epoch);
  // The election stepped down too (its term released), not only the owner.
  EXPECT_TRUE(Eventually(
      [&] {
        const std::string dom = ReadAll(dir + "/domain");
        co::OwnerReleaseLine r{};
        std::memcpy(&r, dom.data() + co::kOwnerReleaseOffset, sizeof(r));
        return co::LineValid(r) && r.epoch == forged.epoch - 1000;
      },
      milliseconds(2000)))
      << "the leader did not step down under a foreign fence line";
  host->reset();
  (*o)->Stop();
  o->reset();
}

// Another writer of the domain's state in etcd (here: the state put back as it is, which
// moves its revision): the leader's next state write fails its guard, and it steps down, so a
// new term reloads the state and serves. (A leader that only stopped serving but kept its
// leader key would leave the domain without a leader.)
TEST_F(HaTest, AnotherWriterOfTheStateDeposesTheLeader) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  auto etcd = etcd_->NewClient();
  const std::string key = "/cxlkv/v1/default/domains/hatest/state";
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 1, &inc0, &granted[0]));
  const std::int64_t epoch = a.Status().epoch();
  auto now = etcd->Get(key);
  ASSERT_TRUE(now.ok() && !now->kvs.empty()) << now.status();
  ASSERT_TRUE(etcd->Put(key, now->kvs[0].value).ok());
  std::vector<std::uint32_t> got;
  EXPECT_FALSE(HostCalls::Grow(a, 0, inc0, 1, &got).ok()) << "a write over another writer's";
  HaOrchestrator* leader = nullptr;
  ASSERT_TRUE(Eventually(
      [&] {
        leader = Leader({&a, &b});
        return leader != nullptr && leader->Status().epoch() > epoch;
      },
      milliseconds(10000)))
      << "nobody leads after the guard failed:\n"
      << ReadFile(a.log);
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(*leader, 1, 2, &inc1, &granted[1]));
  ExpectNoExtentLentTwice(*leader, granted);
}

// ---- the domain's record at a takeover: epochs and etcd keys (issue #29) --------------------

// The domain file's fence and release lines, read and written by the test while no
// orchestrator of the domain runs.
struct DomainLines {
  explicit DomainLines(std::string file) : path(std::move(file)) {}
  co::OwnerFenceLine Fence() const {
    const std::string dom = ReadFile(path);
    co::OwnerFenceLine f{};
    std::memcpy(&f, dom.data() + co::kOwnerFenceOffset, sizeof(f));
    return f;
  }
  co::OwnerReleaseLine Release() const {
    const std::string dom = ReadFile(path);
    co::OwnerReleaseLine r{};
    std::memcpy(&r, dom.data() + co::kOwnerReleaseOffset, sizeof(r));
    return r;
  }
  template <class Line>
  void Write(std::size_t offset, const Line& line) const {
    std::ofstream(path, std::ios::in | std::ios::out | std::ios::binary)
        .seekp(static_cast<std::streamoff>(offset))
        .write(reinterpret_cast<const char*>(&line), sizeof(line));
  }
  std::string path;
};

// Epochs derive from the domain's record as well as etcd's revision (docs/ha.md "Election and
// epoch"): a new leader's epoch is one above the highest epoch the fence or release line
// names when that is above etcd's revision (an etcd restored or replaced issues revisions
// again), so no epoch names two terms and hosts accept the new leader. Three records, each
// above etcd's revision: fence and release line alike (the last term released); the fence
// line alone (its term released by an operator through etcd); the release line alone (the
// fence line torn by a writer that died writing it, released after the wait began). Each
// fails when its line is left out of the derivation, and the first without the "+ 1" or with
// the revision as the epoch.
TEST_F(HaTest, ANewLeadersEpochIsAboveEveryEpochTheDomainRecords) {
  const cxlkv::testing::TempDir scratch("ha-epochs", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "epochs", etcd_.get()), "epochs.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  DomainLines lines(dir + "/domain");
  auto etcd = etcd_->NewClient();
  const std::string where = "/cxlkv/v1/default/domains/epochs";
  // Opens the domain, waits until this one leads (after `meanwhile`, run once it was elected),
  // and returns the epoch it leads at; stopped on return (its term released).
  auto lead = [&](bool new_domain, const std::function<void()>& meanwhile) -> std::int64_t {
    auto o = orch::Orchestrator::Open(
        *c, orch::OpenOptions{.new_domain = new_domain, .write_back_agent = false});
    EXPECT_TRUE(o.ok()) << o.status();
    if (!o.ok()) return 0;
    EXPECT_TRUE((*o)->Start().ok());
    auto role = [&] { return (*o)->status().role; };
    if (meanwhile) {
      EXPECT_TRUE(Eventually(
          [&] {
            auto r = etcd->Get(where + "/leader");
            return r.ok() && !r->kvs.empty();
          },
          milliseconds(10000)));
      meanwhile();
    }
    EXPECT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
    std::int64_t epoch = 0;
    { epoch = (*o)->status().epoch; }
    (*o)->Stop();
    o->reset();
    return epoch;
  };
  const std::int64_t first = lead(/*new_domain=*/true, nullptr);
  ASSERT_GT(first, 0);
  auto revision = [&] {
    auto r = etcd->Get(where + "/leader");
    return r.ok() ? r->header.revision : 0;
  };

  // 1. Both lines name X, far above etcd's revision: the next epoch is X + 1.
  const std::uint64_t x = static_cast<std::uint64_t>(first) + 1000;
  co::OwnerFenceLine f = lines.Fence();
  co::OwnerReleaseLine r = lines.Release();
  ASSERT_TRUE(co::LineValid(f) && co::LineValid(r));
  ASSERT_EQ(r.epoch, static_cast<std::uint64_t>(first)) << "the first term was not released";
  f.epoch = x;
  r.epoch = x;
  co::SealLine(f);
  co::SealLine(r);
  lines.Write(co::kOwnerFenceOffset, f);
  lines.Write(co::kOwnerReleaseOffset, r);
  const std::int64_t second = lead(false, nullptr);
  EXPECT_EQ(second, static_cast<std::int64_t>(x) + 1)
      << "the epoch is not one above the domain's record (etcd revision " << revision() << ")";

  // 2. The fence line names Y, above the release line's epoch; an operator releases Y.
  const std::uint64_t y = x + 1000;
  f = lines.Fence();
  ASSERT_TRUE(co::LineValid(f));
  f.epoch = y;
  co::SealLine(f);
  lines.Write(co::kOwnerFenceOffset, f);
  ASSERT_LT(lines.Release().epoch, y);
  ASSERT_TRUE(etcd->Put(where + "/released", std::to_string(y)).ok());
  const std::int64_t third = lead(false, nullptr);
  EXPECT_EQ(third, static_cast<std::int64_t>(y) + 1)
      << "the fence line's epoch was left out of the derivation";
  ASSERT_TRUE(etcd->Delete(where + "/released").ok());

  // 3. The fence line torn, the release line names Z, written after the wait began.
  const std::uint64_t z = y + 1000;
  f = lines.Fence();
  f.crc ^= 1;  // torn: its writer died writing it
  lines.Write(co::kOwnerFenceOffset, f);
  const std::int64_t fourth = lead(false, [&] {
    std::this_thread::sleep_for(milliseconds(300));  // waiting for a release now
    co::OwnerReleaseLine rel = lines.Release();
    rel.epoch = z;
    rel.at_ms += 1;
    co::SealLine(rel);
    lines.Write(co::kOwnerReleaseOffset, rel);
  });
  EXPECT_EQ(fourth, static_cast<std::int64_t>(z) + 1)
      << "the release line's epoch was left out of the derivation";
}

// A candidate with a wrong etcd.cluster/etcd.domain (elected under its own keys at once) is
// refused by the domain's fence line, which names the keys of the domain's leaders. That
// does not heal: it campaigns no more (its session ends, nothing of it stays in etcd) and
// exits with the error naming the setting. In process first (fatal(), etcd), then as a
// process (exit status 1, its log). The domain's leader is not disturbed.
TEST_F(HaTest, AWrongKeysCandidateStopsCampaigningAndExits) {
  HaOrchestrator a(d_, *etcd_, "a");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {}));
  FenceAudit audit(d_.domain);
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() != 0; }, milliseconds(2000)));
  const std::uint64_t epoch_a = audit.LastEpoch();
  auto etcd = etcd_->NewClient();
  const std::string wrong = "/cxlkv/v1/default/domains/wrong/";
  auto wrong_keys = [&] {
    auto r = etcd->Get(wrong, orch::etcd::PrefixEnd(wrong));
    return r.ok() ? r->kvs.size() : std::size_t{1000};
  };

  HaOrchestrator b(d_, *etcd_, "b");
  b.AppendToEtcdSection("domain = \"wrong\"");
  auto c = orch::ParseConfig(ReadFile(b.config_path()), b.config_path());
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  ASSERT_TRUE(Eventually([&] { return !(*o)->fatal().ok(); }, milliseconds(10000)))
      << "the wrong-keys candidate did not give up";
  const std::string why(absl::Status((*o)->fatal()).message());
  EXPECT_NE(why.find("etcd.cluster or etcd.domain is wrong"), std::string::npos) << why;
  EXPECT_NE(why.find(wrong.substr(0, wrong.size() - 1)), std::string::npos) << why;
  EXPECT_NE(why.find("campaigns no more"), std::string::npos) << why;
  // Its session ends (the lease revoked: no candidate or leader key of it), and it never
  // campaigns again: well past the election's retry pause (500 ms), not one change under its
  // keys (a watch sees even a campaign refused within milliseconds).
  EXPECT_TRUE(Eventually([&] { return wrong_keys() == 0; }, milliseconds(3000)));
  auto watch = etcd->NewWatch(wrong, orch::etcd::PrefixEnd(wrong));
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::vector<std::string> changed;
  const std::int64_t t0 = NowMs();
  while (NowMs() - t0 < 1500) {
    auto ev = (*watch)->Next(milliseconds(100));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const orch::etcd::Event& e : *ev) changed.push_back(e.kv.key);
  }
  EXPECT_TRUE(changed.empty()) << "the wrong-keys candidate campaigned again: " << changed.size()
                               << " changes, the first " << changed[0];
  { EXPECT_NE((*o)->status().role, "leader"); }
  (*o)->Stop();
  o->reset();

  // As a process: it exits with status 1, saying why.
  (void)b.Start(/*new_domain=*/true);
  ASSERT_TRUE(b.Exited(milliseconds(10000))) << "the wrong-keys orchestrator did not exit:\n"
                                             << ReadFile(b.log);
  EXPECT_TRUE(WIFEXITED(b.exit_status) && WEXITSTATUS(b.exit_status) == 1) << b.exit_status;
  const std::string blog = ReadFile(b.log);
  EXPECT_NE(blog.find("exiting: domain.prefix_domain"), std::string::npos) << blog;
  EXPECT_NE(blog.find("etcd.cluster or etcd.domain is wrong"), std::string::npos) << blog;
  EXPECT_EQ(wrong_keys(), 0u);
  EXPECT_EQ(a.Role(), "leader");
  EXPECT_EQ(audit.LastEpoch(), epoch_a);
  EXPECT_EQ(audit.Regression(), 0u);
}

// A state write of unknown outcome, resolved by what the state key holds when read back
// (docs/ha.md "A write of unknown outcome"): the write's bytes after its guard's revision:
// landed; the guard's revision: it did not land; anything else: another writer. Each branch
// on its own (the process test AGrowWhoseStateWriteLands... meets only the first).
TEST(StateWrite, AWriteOfUnknownOutcomeIsJudgedByWhatIsReadBack) {
  const std::string mine = "{\"generation\":8}", theirs = "{\"generation\":8,\"other\":1}";
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 40, 41, mine), orch::UnknownWrite::kLanded);
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 0, 7, mine), orch::UnknownWrite::kLanded);
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 40, 40, "{\"generation\":7}"),
            orch::UnknownWrite::kDidNotLand);
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 0, 0, ""), orch::UnknownWrite::kDidNotLand);
  // Someone else wrote after the guard's revision: not this write, whatever its revision.
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 40, 41, theirs), orch::UnknownWrite::kAnotherWriter);
  // The key deleted meanwhile (an operator, a restore): not this write either.
  EXPECT_EQ(orch::ResolveUnknownWrite(mine, 40, 0, ""), orch::UnknownWrite::kAnotherWriter);
}

// A stopped VM's clocks (kvmclock): every reading blocks while frozen, and the clock carries
// on from the held value after the thaw, so the stop is never counted. Freeze() stops the
// whole "VM" at each thread's next reading (the owner's inside its batch: the fenced Mem reads
// the clock before every store).
class VmClock final : public co::Clock {
 public:
  std::int64_t NowMs() override {
    absl::MutexLock l(&mu_);
    if (frozen_) {
      ++blocked_;
      mu_.Await(absl::Condition(
          +[](bool* f) { return !*f; }, &frozen_));
    }
    return base_.NowMs() - lost_;
  }
  void Freeze() {
    absl::MutexLock l(&mu_);
    frozen_ = true;
    since_ = base_.NowMs();
  }
  void Thaw() {
    absl::MutexLock l(&mu_);
    lost_ += base_.NowMs() - since_;
    frozen_ = false;
  }
  int blocked() {
    absl::MutexLock l(&mu_);
    return blocked_;
  }

 private:
  co::SteadyClock base_;
  absl::Mutex mu_;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  std::int64_t since_ ABSL_GUARDED_BY(mu_) = 0, lost_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

// Audit-ha #1: the leader's VM stops inside an owner batch, long enough for a successor to be
// elected, and its clocks do not count the stop. On resume its own write gate is open (its
// clock says the deadline is still ahead). The successor must not have written anything by
// then: it waits for the release of the old term, which the old leader writes once it learns
// it was deposed (its next keep-alive finds the lease gone) and stops storing. So every store
// of the old term lands before the successor's first, the fence line never goes back to the
// old epoch, and the successor never resigns over a stale line. (Before the release, the
// successor wrote at once and the resumed leader put its old epoch back: checked.)
TEST_F(HaTest, AResumedLeaderWithFrozenClocksStoresNothingAfterItsSuccessor) {
  const cxlkv::testing::TempDir scratch("ha-frozen", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto config = [&](const std::string& node) {
    return orch::ParseConfig(
        "[domain]\nname = \"frozen\"\npool = \"file:" + dir +
            "/pool?size=64M\"\nprefix_domain = \"file:" + dir +
            "/domain?size=4M\"\nextent_size = \"16M\"\nstate_file = \"" + dir + "/" + node +
            ".state\"\nindex_entries = 1024\nmax_hosts = 4\n[rpc]\nsocket = \"" + dir + "/" + node +
            ".sock\"\n[metrics]\nlisten = \"\"\n[etcd]\nendpoints = " + etcd_->EndpointsToml() +
            "\nnode = \"" + node + "\"\nttl_s = 2\n",
        node + ".toml");
  };
  auto ca = config("a"), cb = config("b");
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_TRUE(cb.ok()) << cb.status();
  VmClock vm;
  auto a = orch::Orchestrator::Open(
      *ca, orch::OpenOptions{.new_domain = true, .clock = &vm, .write_back_agent = false});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Start().ok());
  auto role = [](orch::Orchestrator& o) { return o.status().role; };
  auto epoch = [](orch::Orchestrator& o) { return o.status().epoch; };
  ASSERT_TRUE(Eventually([&] { return role(**a) == "leader"; }, milliseconds(10000)));
  const auto epoch_a = static_cast<std::uint64_t>(epoch(**a));
  auto b = orch::Orchestrator::Open(*cb, orch::OpenOptions{.write_back_agent = false});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->Start().ok());
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().epoch == epoch_a && s.back().batches > 5;
      },
      milliseconds(3000)));

  // The VM stops: the owner thread at its next clock reading (inside a batch), the keep-alive
  // thread too; etcd lets the lease expire and b is elected.
  vm.Freeze();
  auto b_elected = [&] { return (*b)->status().leader_epoch > static_cast<std::int64_t>(epoch_a); };
  ASSERT_TRUE(Eventually(b_elected, milliseconds(15000))) << "b was not elected";
  std::this_thread::sleep_for(milliseconds(700));
  EXPECT_GT(vm.blocked(), 0);
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "b wrote the domain while a's term was not released";
  EXPECT_NE(role(**b), "leader");

  // The VM resumes without counting the stop: a's gate is open by its own clock.
  const std::int64_t thawed = NowMs();
  vm.Thaw();
  ASSERT_TRUE(Eventually([&] { return role(**b) == "leader"; }, milliseconds(10000)))
      << "b did not take over once a released its term";
  const auto epoch_b = static_cast<std::uint64_t>(epoch(**b));
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == epoch_b; }, milliseconds(2000)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_NE(role(**a), "leader");
  EXPECT_EQ(audit.Regression(), 0u) << "the resumed leader wrote its old epoch after b's";
  const std::int64_t released = audit.FirstReleasedMs(epoch_a),
                     b_wrote = audit.FirstWrittenMs(epoch_b);
  EXPECT_GE(released, thawed) << "a's term was released before the VM resumed";
  EXPECT_LE(released, b_wrote) << "b wrote the domain before a's term was released";
  EXPECT_EQ(audit.BatchesAfter(epoch_a, b_wrote), 0u);
  EXPECT_EQ(audit.LastEpoch(), epoch_b);
  std::printf(
      "a released epoch %llu %lld ms after the thaw; b (epoch %llu) wrote %lld ms after "
      "that\n",
      static_cast<unsigned long long>(epoch_a), static_cast<long long>(released - thawed),
      static_cast<unsigned long long>(epoch_b), static_cast<long long>(b_wrote - released));
  // A leader that stops (no agent here) releases its own term on the way out.
  (*b)->Stop();
  {
    const std::string dom = ReadAll(dir + "/domain");
    co::OwnerReleaseLine rl{};
    std::memcpy(&rl, dom.data() + co::kOwnerReleaseOffset, sizeof(rl));
    EXPECT_TRUE(co::LineValid(rl));
    EXPECT_EQ(rl.epoch, epoch_b) << "a leader that stopped did not release its term";
  }
  (*a)->Stop();
  b->reset();
  a->reset();
}

// ---- a network partition of one orchestrator (root only) ----------------------------------------

// Prefix-lease attempts of a CXL host, counted per 100 ms from a start time, by a thread
// that also heartbeats the host through CXL every 100 ms (what a serving host does).
class LeaseProbe {
 public:
  LeaseProbe(CxlHost& host, const co::PrefixKey& key) : host_(host), key_(key) {
    thread_ = std::thread([this] { Run(); });
  }
  ~LeaseProbe() { Stop(); }
  void Stop() {
    if (!stop_.exchange(true)) thread_.join();
  }
  // Attempts and leases granted with times in [from, to) (ms, NowMs()).
  std::pair<std::uint64_t, std::uint64_t> Count(std::int64_t from, std::int64_t to) {
    absl::MutexLock l(&mu_);
    std::uint64_t tried = 0, served = 0;
    for (const auto& [at, ok] : attempts_) {
      if (at < from || at >= to) continue;
      ++tried;
      served += ok ? 1 : 0;
    }
    return {tried, served};
  }
  // The first refused attempt at or after `from`, and the first granted one after that (-1:
  // none).
  std::pair<std::int64_t, std::int64_t> Gap(std::int64_t from) {
    absl::MutexLock l(&mu_);
    std::int64_t refused = -1, back = -1;
    for (const auto& [at, ok] : attempts_) {
      if (at < from) continue;
      if (refused < 0 && !ok) refused = at;
      if (refused >= 0 && ok) {
        back = at;
        break;
      }
    }
    return {refused, back};
  }

 private:
  void Run() {
    std::int64_t next_beat = 0;
    while (!stop_.load()) {
      const std::int64_t now = NowMs();
      if (now >= next_beat) {
        (void)host_->Heartbeat(nullptr);
        next_beat = now + 100;
      }
      const bool ok = host_.AcquireAndRelease(key_).ok();
      {
        absl::MutexLock l(&mu_);
        attempts_.emplace_back(now, ok);
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  CxlHost& host_;
  const co::PrefixKey key_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::pair<std::int64_t, bool>> attempts_ ABSL_GUARDED_BY(mu_);
};

// Issue #29, measured: the fraction of a host's prefix-lease attempts (one every 5 ms, of a
// published block, through CXL alone) served during a kill -9 fail-over of the leader and
// during an etcd outage (two of three members stopped for 6 s). A measurement, not a check
// of a target: DISABLED_, run by hand with --gtest_also_run_disabled_tests (bench/RESULTS.md
// has the command and the figures). Each window runs from the failure until a leader serves
// again (a Join answered) plus 1 s; the gap is from the first refused attempt to the next
// granted one.
TEST_F(HaTest, DISABLED_LeaseAttemptsServedDuringFailoverAndEtcdOutage) {
  // host_ttl 2 s, the daemon's default: a prefix lease needs a heartbeat the owner
  // acknowledged less than host_ttl − margin (1.5 s) ago.
  HaOrchestrator a(d_, *etcd_, "a", 3, 2000), b(d_, *etcd_, "b", 3, 2000);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  CxlHost host(d_.domain);
  const co::PrefixKey key = host.Key({4, 5, 6});
  ASSERT_TRUE(host.PublishAndWait(key, TestRef(7, 3)));
  LeaseProbe probe(host, key);
  std::this_thread::sleep_for(milliseconds(1000));
  const auto before = probe.Count(NowMs() - 1000, NowMs());
  auto report = [&](const char* what, std::int64_t t0, std::int64_t served_again) {
    const auto [tried, served] = probe.Count(t0, served_again + 1000);
    const auto [refused, back] = probe.Gap(t0);
    std::printf(
        "%s: %llu of %llu lease attempts served (%.1f %%) from the failure until 1 s after a "
        "leader served again (%lld ms); first refusal %lld ms in, leases back %lld ms in\n",
        what, static_cast<unsigned long long>(served), static_cast<unsigned long long>(tried),
        tried == 0 ? 0.0 : 100.0 * static_cast<double>(served) / static_cast<double>(tried),
        static_cast<long long>(served_again - t0),
        static_cast<long long>(refused < 0 ? -1 : refused - t0),
        static_cast<long long>(back < 0 ? -1 : back - t0));
  };
  std::printf("before: %llu of %llu attempts served in 1 s\n",
              static_cast<unsigned long long>(before.second),
              static_cast<unsigned long long>(before.first));
  EXPECT_EQ(before.first, before.second);

  // kill -9 of the leader.
  const std::int64_t killed = NowMs();
  a.Kill(SIGKILL);
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(Eventually([&] { return HostCalls::Join(b, 1, &inc1).ok(); }, milliseconds(15000)));
  const std::int64_t b_serves = NowMs();
  std::this_thread::sleep_for(milliseconds(1500));
  report("kill -9 of the leader", killed, b_serves);

  // etcd outage: two of three members stopped for 6 s.
  const int l = etcd_->LeaderIndex();
  ASSERT_GE(l, 0);
  const int f = (l + 1) % 3;
  const std::int64_t paused = NowMs();
  etcd_->Pause(l);
  etcd_->Pause(f);
  std::this_thread::sleep_for(milliseconds(6000));
  etcd_->Resume(l);
  etcd_->Resume(f);
  std::uint64_t inc3 = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        HaOrchestrator* leader = Leader({&b, &a});
        return leader != nullptr && HostCalls::Join(*leader, 3, &inc3).ok();
      },
      milliseconds(20000)));
  const std::int64_t serves_again = NowMs();
  std::this_thread::sleep_for(milliseconds(1500));
  probe.Stop();
  report("etcd outage (6 s, quorum lost)", paused, serves_again);
}

// The process ids whose parent is `parent` (from /proc).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: pid (comm) state ppid ...; comm may hold spaces: parse after ')'.
    const std::string stat = ReadFile("/proc/" + name + "/stat");
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (fields >> state >> ppid && ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

std::int64_t BootNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Audit-ha #1 with real processes (issue #29): the leader's "VM" stops — the orchestrator and
// its write-back agent, SIGSTOP — for longer than the TTL, and on resume their CLOCK_BOOTTIME
// is set back by the length of the stop (tests/ha/clock_shim.c, LD_PRELOAD), as a stopped
// VM's guest reads it. The standby is elected meanwhile and must wait: the resumed leader's
// gate is open by its own clock (its agent sees no deadline passed either), it may run more
// batches, learns from its next keep-alive that its lease is gone, steps down and releases;
// only then does the successor write. The fence line never goes back to the old epoch, no
// batch of the old epoch follows the successor's first store, and no extent is lent twice.
// The in-process AResumedLeaderWithFrozenClocksStoresNothingAfterItsSuccessor checks the
// logic deterministically; this runs the real processes, under the stress label only
// (orchestrator_ha_frozen_processes: DISABLED_ here, so that the rpc label's run does not
// start an etcd cluster for it; --gtest_also_run_disabled_tests runs it).
TEST_F(HaTest, DISABLED_AResumedLeaderProcessWithClocksSetBackStoresNothingAfterItsSuccessor) {
  const cxlkv::testing::TempDir scratch("ha-shift", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string shift_file = std::string(tmpl) + "/shift";
  {
    const std::int64_t zero = 0;
    std::ofstream(shift_file, std::ios::binary).write(reinterpret_cast<const char*>(&zero), 8);
  }
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  a.env = {"LD_PRELOAD=" CXLKV_CLOCK_SHIM_SO, "CXLKV_TEST_CLOCK_SHIFT=" + shift_file};
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 2, &inc0, &granted[0]));
  const auto epoch_a = static_cast<std::uint64_t>(a.Status().epoch());
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().epoch == epoch_a && s.back().batches > 5;
      },
      milliseconds(3000)));
  const std::vector<pid_t> agent = ChildrenOf(a.pid);
  ASSERT_EQ(agent.size(), 1u) << "a's write-back agent not found";

  // The VM stops: the orchestrator and its agent.
  const std::int64_t stopped_ns = BootNs();
  ::kill(a.pid, SIGSTOP);
  ::kill(agent[0], SIGSTOP);
  auto etcd = etcd_->NewClient();
  auto leader_epoch = [&]() -> std::int64_t {
    auto key = etcd->Get("/cxlkv/v1/default/domains/hatest/leader");
    return key.ok() && !key->kvs.empty() ? key->kvs[0].create_revision : 0;
  };
  ASSERT_TRUE(Eventually([&] { return leader_epoch() > static_cast<std::int64_t>(epoch_a); },
                         milliseconds(15000)))
      << "b was not elected while a was stopped";
  const auto epoch_b = static_cast<std::uint64_t>(leader_epoch());
  std::this_thread::sleep_for(milliseconds(700));
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "b wrote the domain while a's term was not released";
  EXPECT_NE(b.Role(), "leader");

  // The VM resumes: its BOOTTIME does not count the stop.
  const std::int64_t stop_ns = BootNs() - stopped_ns;
  {
    const int fd = ::open(shift_file.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &stop_ns, sizeof(stop_ns), 0), static_cast<ssize_t>(sizeof(stop_ns)));
    ::close(fd);
  }
  const std::int64_t resumed = NowMs();
  ::kill(agent[0], SIGCONT);
  ::kill(a.pid, SIGCONT);
  ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(10000)))
      << "b did not take over once a released its term";
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == epoch_b; }, milliseconds(2000)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(audit.Regression(), 0u) << "the resumed leader wrote its old epoch after b's";
  const std::int64_t released = audit.FirstReleasedMs(epoch_a),
                     b_wrote = audit.FirstWrittenMs(epoch_b);
  EXPECT_GE(released, resumed) << "a's term was released before the VM resumed";
  EXPECT_LE(released, b_wrote) << "b wrote the domain before a's term was released";
  EXPECT_EQ(audit.BatchesAfter(epoch_a, b_wrote), 0u) << "a batch of the old epoch after b's";
  EXPECT_EQ(audit.LastEpoch(), epoch_b);
  // a resumed with its gate open by its own clock (the stop was not counted), so it learned
  // of the end of its term from etcd, not from its deadline, and its agent did not end it.
  const std::string alog = ReadFile(a.log);
  EXPECT_NE(
      alog.find(absl::StrCat("stepped down from epoch ", epoch_a, ": the session lease was lost")),
      std::string::npos)
      << "a did not resume with its clocks set back (its gate should have been open):\n"
      << alog;
  EXPECT_EQ(alog.find("stopped past its write deadline"), std::string::npos) << alog;
  EXPECT_EQ(alog.find("fenced on this host's clock"), std::string::npos) << alog;
  std::printf(
      "stopped %lld ms; a released epoch %llu %lld ms after the resume; b (epoch %llu) wrote "
      "%lld ms after that\n",
      static_cast<long long>(stop_ns / 1000000), static_cast<unsigned long long>(epoch_a),
      static_cast<long long>(released - resumed), static_cast<unsigned long long>(epoch_b),
      static_cast<long long>(b_wrote - released));
  // The host follows to b; grants there; nothing lent twice.
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(b, 1, 2, &inc1, &granted[1]));
  ExpectNoExtentLentTwice(b, granted);
}

// Fail-over after a frozen-clock stop of the leader, with hosts heartbeating (issue #29's
// "Measured"; measure label, orchestrator_ha_frozen_reattach_20): each trial stops the
// leader's "VM" — the orchestrator and its write-back agent, SIGSTOP — for CXLKV_HA_STOP_MS
// (default 4000: past the 3 s session TTL, so a standby is elected meanwhile), then resumes it
// with its CLOCK_BOOTTIME set back by the stop (tests/ha/clock_shim.c, a shift file per
// orchestrator that accumulates its stops). The successor may not write until the resumed
// leader released its term, so no host can re-attach during the stop; the figure is the time
// from the resume until every one of CXLKV_HA_HOSTS hosts (default 8; half through the
// endpoint list, half through etcd discovery) follows a newer epoch, with the same checks as
// the kill -9 measurement (incarnations kept, extents valid, nothing lent twice, the fence line
// never back to an older epoch). CXLKV_HA_TRIALS trials (default 1); printed.
TEST_F(HaTest, DISABLED_EveryHostReattachedAfterAFrozenClockStop) {
  int trials = 1;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  int stop_ms = 4000;
  if (const char* s = std::getenv("CXLKV_HA_STOP_MS")) stop_ms = std::max(100, std::atoi(s));
  // Removed however the test ends.
  const cxlkv::testing::TempDir scratch("ha-frozen-reattach", "/tmp");
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  std::vector<std::string> shift_files;
  std::vector<std::int64_t> shift_ns;
  std::vector<std::vector<std::string>> env;
  for (const char* n : {"a", "b", "c"}) {
    shift_files.push_back(absl::StrCat(tmpl, "/shift-", n));
    shift_ns.push_back(0);
    const std::int64_t zero = 0;
    std::ofstream(shift_files.back(), std::ios::binary)
        .write(reinterpret_cast<const char*>(&zero), sizeof(zero));
    env.push_back(
        {"LD_PRELOAD=" CXLKV_CLOCK_SHIM_SO, "CXLKV_TEST_CLOCK_SHIFT=" + shift_files.back()});
  }
  ReattachBed bed;
  ASSERT_TRUE(StartReattachBed(n_hosts, env, &bed));
  auto& orch = bed.orch;
  auto& hosts = bed.hosts;
  const auto& incs = bed.incs;
  FenceAudit audit(d_.domain);
  std::vector<std::int64_t> all, stops;
  for (int trial = 0; trial < trials; ++trial) {
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(
        Eventually([&] { return (leader = Leader(bed.all())) != nullptr; }, milliseconds(10000)));
    std::size_t idx = 0;
    while (orch[idx].get() != leader) ++idx;
    // The leader's agent is the one child it forked; wait for it (it starts with the term).
    std::vector<pid_t> agent;
    ASSERT_TRUE(Eventually([&] { return (agent = ChildrenOf(leader->pid)).size() == 1; },
                           milliseconds(5000)))
        << "trial " << trial << ": the leader's write-back agent not found";
    std::int64_t old_epoch = 0;
    for (auto& h : hosts) old_epoch = std::max(old_epoch, h->leader_epoch());
    const std::int64_t stopped_ns = BootNs();
    ::kill(leader->pid, SIGSTOP);
    ::kill(agent[0], SIGSTOP);
    std::this_thread::sleep_for(milliseconds(stop_ms));
    const std::int64_t stop_ns = BootNs() - stopped_ns;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      EXPECT_LE(hosts[h]->leader_epoch(), old_epoch)
          << "trial " << trial << ": host " << h << " followed a new leader during the stop";
    }
    // The VM resumes: its BOOTTIME does not count the stop.
    shift_ns[idx] += stop_ns;
    {
      const int fd = ::open(shift_files[idx].c_str(), O_WRONLY);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pwrite(fd, &shift_ns[idx], sizeof(std::int64_t), 0),
                static_cast<ssize_t>(sizeof(std::int64_t)));
      ::close(fd);
    }
    const std::int64_t t0 = NowMs();
    ::kill(agent[0], SIGCONT);
    ::kill(leader->pid, SIGCONT);
    std::vector<std::int64_t> at;
    ASSERT_TRUE(bed.WaitForEveryHost(old_epoch, t0, &at))
        << "trial " << trial << ": not every host re-attached after the resume";
    std::int64_t worst = 0;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      worst = std::max(worst, at[h]);
      EXPECT_EQ(hosts[h]->incarnation(), incs[h]) << "trial " << trial << " host " << h;
      EXPECT_TRUE(hosts[h]->ExtentsValid()) << "trial " << trial << " host " << h;
    }
    all.push_back(worst);
    stops.push_back(stop_ns / 1000000);
    // The resumed leader stepped down and stays a standby.
    ASSERT_TRUE(Eventually([&] { return leader->Role() != "leader"; }, milliseconds(5000)));
  }
  ExpectReattachBedIntact(bed);
  EXPECT_EQ(audit.Regression(), 0u);
  std::vector<std::int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::string times, stopped;
  for (std::int64_t t : all) absl::StrAppend(&times, times.empty() ? "" : " ", t);
  for (std::int64_t t : stops) absl::StrAppend(&stopped, stopped.empty() ? "" : " ", t);
  std::printf(
      "frozen-clock stop of the leader (%d ms asked) -> all %u hosts re-attached after the "
      "resume (heartbeat 100 ms, ttl 3 s), %d trials: median %lld ms, worst %lld ms [%s]; "
      "stops (ms) [%s]\n",
      stop_ms, n_hosts, trials, static_cast<long long>(sorted[sorted.size() / 2]),
      static_cast<long long>(sorted.back()), times.c_str(), stopped.c_str());
  orch.clear();
}

// A network namespace joined to the test's by a veth pair: etcd listens on the test's end, an
// orchestrator runs inside. Cut() takes the link down (packets to etcd are lost, connections
// hang as in a real partition); Heal() brings it back. Removed at destruction.
class NetnsLink {
 public:
  bool Create(std::string* why) {
    const int tag = ::getpid() % 10000;
    ns = "cxlkv-ha-" + std::to_string(::getpid());
    host_if = "cxh" + std::to_string(tag);
    ns_if = "cxn" + std::to_string(tag);
    const std::string net = "10.231." + std::to_string(tag % 250) + ".";
    host_ip = net + "1";
    ns_ip = net + "2";
    const std::vector<std::string> steps = {
        "ip netns add " + ns,
        "ip link add " + host_if + " type veth peer name " + ns_if,
        "ip link set " + ns_if + " netns " + ns,
        "ip addr add " + host_ip + "/30 dev " + host_if,
        "ip link set " + host_if + " up",
        "ip netns exec " + ns + " ip addr add " + ns_ip + "/30 dev " + ns_if,
        "ip netns exec " + ns + " ip link set " + ns_if + " up",
        "ip netns exec " + ns + " ip link set lo up",
    };
    for (const std::string& step : steps) {
      std::string out;
      if (Sh(step, &out) != 0) {
        *why = "`" + step + "` failed: " + out;
        return false;
      }
      created_ = true;
    }
    return true;
  }
  ~NetnsLink() {
    if (!created_) return;
    Sh("ip link del " + host_if);
    Sh("ip netns del " + ns);
  }
  void Cut() { EXPECT_EQ(Sh("ip link set " + host_if + " down"), 0); }
  void Heal() { EXPECT_EQ(Sh("ip link set " + host_if + " up"), 0); }

  std::string ns, host_if, ns_if, host_ip, ns_ip;

 private:
  bool created_ = false;
};

// One orchestrator (the leader) loses etcd through a network partition while the standby and
// the hosts keep it: the leader turns read-only and keeps answering heartbeats, the standby is
// elected after the session TTL and writes its epoch into the fence line, the cut-off leader
// stops answering the moment it sees that line, and every host re-attaches to the new leader
// with its incarnation and extents. Checks: no epoch wrote after a newer one (the fence-line
// audit), no extent lent twice, every host on the new leader; after the partition heals the
// old leader is a standby. Needs root (ip netns, veth); skipped with the reason otherwise.
TEST(HaPartition, OneOrchestratorCutOffFromEtcd) {
  CXLKV_SKIP_WITHOUT_ETCD();
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root (CAP_NET_ADMIN) to create a network namespace and a veth pair";
  }
  if (::access("/usr/sbin/ip", X_OK) != 0) GTEST_SKIP() << "no /usr/sbin/ip (iproute2)";
  NetnsLink net;
  std::string why;
  if (!net.Create(&why)) GTEST_SKIP() << "cannot set up a network namespace: " << why;
  EtcdCluster etcd(3, net.host_ip);
  ASSERT_TRUE(etcd.Start(&why)) << why;
  SharedDomain d;
  HaOrchestrator a(d, etcd, "a"), b(d, etcd, "b");
  a.netns = net.ns;
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d.domain);
  constexpr std::uint32_t kHosts = 4;
  std::vector<std::unique_ptr<orch::HostClient>> hosts;
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::vector<std::uint64_t> incs;
  for (std::uint32_t h = 0; h < kHosts; ++h) {
    auto c = orch::HostClient::Connect(a.socket + "," + b.socket, h);
    ASSERT_TRUE(c.ok()) << c.status();
    (*c)->StartHeartbeats();
    auto g = (*c)->Grow(1);
    ASSERT_TRUE(g.ok()) << g.status();
    for (const auto& e : *g) granted[h].insert(e.index);
    incs.push_back((*c)->incarnation());
    hosts.push_back(*std::move(c));
  }
  const std::int64_t old_epoch = a.Status().epoch();
  ASSERT_GT(old_epoch, 0);

  net.Cut();
  const std::int64_t t0 = NowMs();
  // Read-only lasts from a's deadline to b's takeover (about a second): the log shows it
  // (checked below) if the polling here misses it on a loaded machine.
  bool seen_read_only = false;
  ASSERT_TRUE(Eventually(
      [&] {
        seen_read_only = seen_read_only || a.Role() == "read-only";
        return b.Role() == "leader";
      },
      milliseconds(15000)))
      << "the standby was not elected";
  const std::int64_t new_epoch = b.Status().epoch();
  EXPECT_GT(new_epoch, old_epoch);
  ASSERT_TRUE(Eventually([&] { return a.Role() == "standby"; }, milliseconds(3000)))
      << "the cut-off leader kept answering after its successor took over";
  // Every host on the new leader: same incarnation, no rejoin, its extents valid throughout.
  for (std::uint32_t h = 0; h < kHosts; ++h) {
    ASSERT_TRUE(Eventually(
        [&] {
          EXPECT_TRUE(hosts[h]->ExtentsValid()) << "host " << h;
          return hosts[h]->HeartbeatOnce().ok() && hosts[h]->leader_epoch() == new_epoch;
        },
        milliseconds(10000)))
        << "host " << h << " did not re-attach to the new leader";
    EXPECT_EQ(hosts[h]->incarnation(), incs[h]) << "host " << h;
    EXPECT_EQ(hosts[h]->rejoins(), 0u) << "host " << h;
  }
  std::printf(
      "partition of the leader: every host re-attached to epoch %lld after %lld ms (read-only "
      "role %s by the test)\n",
      static_cast<long long>(new_epoch), static_cast<long long>(NowMs() - t0),
      seen_read_only ? "seen" : "not seen");
  for (std::uint32_t h = 0; h < kHosts; ++h) {
    auto g = hosts[h]->Grow(1);
    ASSERT_TRUE(g.ok()) << g.status();
    for (const auto& e : *g) EXPECT_TRUE(granted[h].insert(e.index).second);
  }
  ExpectNoExtentLentTwice(b, granted);
  EXPECT_EQ(audit.Regression(), 0u) << "an older epoch wrote the domain after a newer one";
  EXPECT_GT(audit.BatchesAfter(static_cast<std::uint64_t>(new_epoch), t0), 0u);
  net.Heal();
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_EQ(a.Role(), "standby");
  EXPECT_EQ(b.Role(), "leader");
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.LastEpoch(), static_cast<std::uint64_t>(new_epoch));
  const std::string alog = ReadFile(a.log);
  EXPECT_NE(alog.find("serving read-only"), std::string::npos) << alog;
  EXPECT_NE(alog.find("read-only mode of domain 'hatest' ended"), std::string::npos) << alog;
  for (auto& h : hosts) EXPECT_TRUE(h->Leave().ok());
}

// LMCache's coordinator on a domain with [etcd] (docs/lmcache.md "Fail-over"): only the leader
// serves it (a standby answers 503, /healthz aside); a writer finishes three objects through
// the leader and leaves a fourth reserved; after kill -9 of the leader the standby serves the
// same region epoch, the same handles and the bytes behind them, the open reservation
// finishes with its token, and new grants carry larger generations.
TEST_F(HaTest, LmcacheCoordinatorFailsOverWithItsObjects) {
  using nlohmann::json;
  const std::string token = "ha-test-lmcache-token-0123456789";
  const cxlkv::testing::TempDir scratch("ha-lmc", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string tokens = std::string(tmpl) + "/tokens";
  std::ofstream(tokens) << token << "\n";
  ::chmod(tokens.c_str(), 0600);
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  for (HaOrchestrator* o : {&a, &b}) {
    o->AppendConfig(absl::StrCat("[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"", tokens,
                                 "\"\nlayout_id = \"ha-test\"\nregion_size = \"16M\"\n"
                                 "alignment = \"4K\"\n"));
  }
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  const int pa = a.LmcachePort(), pb = b.LmcachePort();
  ASSERT_GT(pa, 0) << ReadFile(a.log);
  ASSERT_GT(pb, 0) << ReadFile(b.log);
  ASSERT_TRUE(
      Eventually([&] { return Http(pa, "GET", "/readyz", "").first == 200; }, milliseconds(10000)))
      << ReadFile(a.log);
  EXPECT_EQ(Http(pb, "GET", "/readyz", "").first, 503);
  EXPECT_EQ(Http(pb, "GET", "/healthz", "").first, 200);
  const auto refused = Http(pb, "POST", "/v1/lookup", token, "{}");
  EXPECT_EQ(refused.first, 503);
  EXPECT_NE(refused.second.find("the domain's leader does"), std::string::npos) << refused.second;

  auto call = [&](int port, const std::string& method, const std::string& path,
                  const json& body = nullptr) {
    const auto r = Http(port, method, path, token, body.is_null() ? "" : body.dump());
    EXPECT_EQ(r.first, 200) << method << " " << path << ": " << r.second;
    return json::parse(r.second, nullptr, false);
  };
  const json region = call(pa, "GET", "/v1/region");
  const std::string epoch = region.value("region_epoch", "");
  ASSERT_FALSE(epoch.empty()) << region;
  const std::uint64_t region_offset = call(pa, "GET", "/cxlkv/v1/stats").value("region_offset", 0);
  ASSERT_GT(region_offset, 0u);
  auto key = [](int i) {
    return json{
        {"chunk_hash_hex", absl::StrCat("0", i, "ab")}, {"model_name", "m"}, {"kv_rank", 0}};
  };
  json items = json::array();
  for (int i = 0; i < 4; ++i) {
    items.push_back(
        {{"key", key(i)}, {"layout", {{"shapes", {{1000 + 777 * i}}}, {"dtypes", {"uint8"}}}}});
  }
  const json grants =
      call(pa, "POST", "/v1/writes/reserve", {{"region_epoch", epoch}, {"items", items}})["grants"];
  ASSERT_EQ(grants.size(), 4u) << grants;
  // The bytes, written where the handles say in the pool every orchestrator maps.
  const int pool_fd = ::open(d_.pool.c_str(), O_RDWR);
  ASSERT_GE(pool_fd, 0);
  const std::size_t pool_bytes = 256u << 20;
  auto* pool = static_cast<std::uint8_t*>(
      ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pool_fd, 0));
  ::close(pool_fd);
  ASSERT_NE(pool, MAP_FAILED);
  auto byte_of = [](int i, std::uint64_t j, std::uint64_t gen) {
    return static_cast<std::uint8_t>((i * 31 + j * 7 + gen) & 0xff);
  };
  for (int i = 0; i < 4; ++i) {
    const json& h = grants[i]["handle"];
    for (std::uint64_t j = 0; j < h["length"].get<std::uint64_t>(); ++j) {
      pool[region_offset + h["offset"].get<std::uint64_t>() + j] =
          byte_of(i, j, h["generation"].get<std::uint64_t>());
    }
  }
  json done = json::array();
  for (int i = 0; i < 3; ++i) done.push_back({{"key", key(i)}, {"token", grants[i]["token"]}});
  call(pa, "POST", "/v1/writes/finish", {{"region_epoch", epoch}, {"reservations", done}});
  json keys = json::array();
  for (int i = 0; i < 4; ++i) keys.push_back(key(i));
  const json before = call(pa, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", keys}});
  const json used_before = call(pa, "GET", "/v1/status")["used_bytes"];
  // The three finished objects are in the domain's prefix index (the leader's owner loop
  // publishes them as its own entries).
  ASSERT_TRUE(Eventually([&] { return call(pa, "GET", "/cxlkv/v1/stats")["indexed"] == 3; },
                         milliseconds(5000)))
      << call(pa, "GET", "/cxlkv/v1/stats");

  a.Kill(SIGKILL);
  ASSERT_TRUE(
      Eventually([&] { return Http(pb, "GET", "/readyz", "").first == 200; }, milliseconds(15000)))
      << "the standby's coordinator did not take over:\n"
      << ReadFile(b.log);
  EXPECT_EQ(call(pb, "GET", "/v1/region")["region_epoch"], epoch);
  EXPECT_EQ(call(pb, "GET", "/v1/status")["used_bytes"], used_before);
  const json after = call(pb, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", keys}});
  EXPECT_EQ(after["hits"], before["hits"]);
  ASSERT_EQ(after["hits"].size(), 4u) << after;
  EXPECT_TRUE(after["hits"][3].is_null()) << "a WRITING object is not a hit";
  for (int i = 0; i < 3; ++i) {
    const json& h = after["hits"][i]["handle"];
    ASSERT_EQ(h, grants[i]["handle"]) << i;
    std::uint64_t wrong = 0;
    for (std::uint64_t j = 0; j < h["length"].get<std::uint64_t>(); ++j) {
      wrong += pool[region_offset + h["offset"].get<std::uint64_t>() + j] !=
               byte_of(i, j, h["generation"].get<std::uint64_t>());
    }
    EXPECT_EQ(wrong, 0u) << "object " << i;
  }
  // The reservation left open before the failover finishes on the new leader.
  call(pb, "POST", "/v1/writes/finish",
       {{"region_epoch", epoch},
        {"reservations", {{{"key", key(3)}, {"token", grants[3]["token"]}}}}});
  const json hit3 = call(pb, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", {key(3)}}});
  EXPECT_EQ(hit3["hits"][0]["handle"], grants[3]["handle"]);
  // The successor found the three in the index it took over (none published twice), and
  // publishes the fourth.
  EXPECT_TRUE(Eventually([&] { return call(pb, "GET", "/cxlkv/v1/stats")["indexed"] == 4; },
                         milliseconds(5000)))
      << call(pb, "GET", "/cxlkv/v1/stats");
  EXPECT_EQ(call(pb, "GET", "/cxlkv/v1/stats")["index_skipped"], 0) << "a publish was refused";
  const json more = call(
      pb, "POST", "/v1/writes/reserve",
      {{"region_epoch", epoch},
       {"items", {{{"key", key(9)}, {"layout", {{"shapes", {{64}}}, {"dtypes", {"uint8"}}}}}}}});
  EXPECT_GT(more["grants"][0]["handle"]["generation"].get<std::uint64_t>(),
            grants[3]["handle"]["generation"].get<std::uint64_t>());
  EXPECT_NE(ReadFile(b.log).find("restored from etcd"), std::string::npos) << ReadFile(b.log);
  ::munmap(pool, pool_bytes);
}

}  // namespace
}  // namespace cxlkv::testing
