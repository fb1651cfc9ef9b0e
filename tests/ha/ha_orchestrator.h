// The HA tests' orchestrators: real cxlkv-orchestrator processes of one domain with [etcd] in
// their config (tests/orchestrator_process.h), the host-side calls the tests make through their
// stubs, and what several tests check or start with them.
#ifndef CXLKV_TESTS_HA_HA_ORCHESTRATOR_H_
#define CXLKV_TESTS_HA_HA_ORCHESTRATOR_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/namespaces.h"
#include "orchestrator.grpc.pb.h"
#include "orchestrator_process.h"

namespace cxlkv::testing {

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
inline int Sh(const std::string& cmd, std::string* out = nullptr) {
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
    const std::string text = SlurpFile(log);
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
    std::string text = SlurpFile(config);
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

// `cxlkvctl ARGS`: its standard output.
inline std::string Ctl(const std::string& args) {
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

// No extent is held by two hosts, and every extent a host was granted is still its own.
inline void ExpectNoExtentLentTwice(
    const HaOrchestrator& leader, const std::map<std::uint32_t, std::set<std::uint32_t>>& granted) {
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
inline ::testing::AssertionResult StartLeaderAndStandbys(
    HaOrchestrator& first, std::initializer_list<HaOrchestrator*> standbys) {
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
inline HaOrchestrator* FirstToGrant(const std::vector<HaOrchestrator*>& all, std::uint32_t host,
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

// The config of an orchestrator the test runs in its own process (Orchestrator::Open): domain
// `name`, a 64 MiB pool file and a 4 MiB domain file in `dir`, 16 MiB extents, 1024 index
// entries, 4 hosts, its socket and state in `dir`, no metrics; then `extra` (whole sections);
// then, with `etcd`, an [etcd] section for node "solo" with a 3 s session TTL.
inline std::string InProcessToml(const std::string& dir, const std::string& name,
                                 const EtcdCluster* etcd, const std::string& extra = "") {
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

// The spec of a host that finds the domain's leader in etcd: etcd://EP,EP,EP/`path`.
inline std::string EtcdSpec(const EtcdCluster& etcd, const std::string& path) {
  std::string spec = "etcd://";
  for (const std::string& e : etcd.endpoints()) absl::StrAppend(&spec, e, ",");
  spec.back() = '/';
  return spec + path;
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_HA_ORCHESTRATOR_H_
