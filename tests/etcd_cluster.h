// A real etcd cluster on loopback for the HA tests: N members (3 by default) of Debian's
// etcd-server, on free ports, with data directories under a temporary directory, each
// member's log in <dir>/mN.log. Killed (SIGKILL) and removed at teardown. Members can be
// killed, stopped (SIGSTOP), continued and restarted to inject failures.
//
// Tests skip when the binary is missing: CXLKV_SKIP_WITHOUT_ETCD() names the package. The
// binary is $CXLKV_ETCD_BIN if set, else etcd on PATH. EtcdClusterTest is the fixture that
// starts a cluster for each test.
#ifndef CXLKV_TESTS_ETCD_CLUSTER_H_
#define CXLKV_TESTS_ETCD_CLUSTER_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/orchestrator/etcd.h"
#include "gtest/gtest.h"

namespace cxlkv::testing {

inline std::string EtcdBinary() {
  if (const char* e = std::getenv("CXLKV_ETCD_BIN"); e != nullptr && *e != '\0') {
    return ::access(e, X_OK) == 0 ? e : "";
  }
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const std::string p = std::string(dir) + "/etcd";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

#define CXLKV_SKIP_WITHOUT_ETCD()                                                           \
  do {                                                                                      \
    if (::cxlkv::testing::EtcdBinary().empty()) {                                           \
      GTEST_SKIP() << "no etcd binary (apt-get install etcd-server; scripts/deps installs " \
                      "it; or set CXLKV_ETCD_BIN)";                                         \
    }                                                                                       \
  } while (0)

// etcdctl (Debian's etcd-client), for snapshot save and restore: "" when missing.
inline std::string EtcdctlBinary() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    const std::string p = std::string(dir) + "/etcdctl";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

#define CXLKV_SKIP_WITHOUT_ETCDCTL()                                                        \
  do {                                                                                      \
    if (::cxlkv::testing::EtcdctlBinary().empty()) {                                        \
      GTEST_SKIP() << "no etcdctl (apt-get install etcd-client; scripts/deps installs it)"; \
    }                                                                                       \
  } while (0)

// Ports the kernel says are free now (all held open together, so they differ).
inline std::vector<int> FreeLoopbackPorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot find a free loopback port";
      ports.push_back(0);
    } else {
      ports.push_back(ntohs(a.sin_port));
    }
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

class EtcdCluster {
 public:
  // `host`: the address every member listens on (loopback by default; the partition test uses
  // an address of a veth pair that a network namespace reaches).
  explicit EtcdCluster(int members = 3, std::string host = "127.0.0.1")
      : n_(members), host_(std::move(host)) {
    char tmpl[] = "/tmp/cxlkv-etcd-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::vector<int> ports = FreeLoopbackPorts(2 * n_);
    for (int i = 0; i < n_; ++i) {
      client_ports_.push_back(ports[2 * i]);
      peer_ports_.push_back(ports[2 * i + 1]);
    }
    for (int i = 0; i < n_; ++i) {
      initial_ +=
          (i ? "," : "") + Name(i) + "=http://" + host_ + ":" + std::to_string(peer_ports_[i]);
    }
    pids_.assign(n_, -1);
    token_ = "cxlkv-test-" + std::to_string(getpid());
  }
  ~EtcdCluster() {
    for (int i = 0; i < n_; ++i) Kill(i);
    const std::string cmd = "rm -rf " + dir_;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  // Starts every member and waits until the cluster has a leader and answers a read on every
  // member. False (with why) if it does not within 30 s.
  bool Start(std::string* why) {
    SpawnMembers();
    return WaitHealthy(std::chrono::seconds(30), why);
  }
  // Starts every member's process and returns at once (Start without the wait).
  void SpawnMembers() {
    for (int i = 0; i < n_; ++i) Spawn(i, /*fresh=*/true);
  }

  bool WaitHealthy(std::chrono::milliseconds limit, std::string* why) {
    auto c = NewClient();
    const auto end = std::chrono::steady_clock::now() + limit;
    std::string last;
    while (std::chrono::steady_clock::now() < end) {
      bool all = true;
      for (int i = 0; i < n_ && all; ++i) {
        if (pids_[i] <= 0) continue;
        auto st = c->Status(i);
        if (!st.ok() || st->leader == 0) {
          all = false;
          last = st.ok() ? "member " + std::to_string(i) + " has no leader"
                         : std::string(st.status().message());
        }
      }
      if (all && c->Get("/cxlkv-health").ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (why != nullptr) *why = "etcd cluster not healthy: " + last + " (logs in " + dir_ + ")";
    return false;
  }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> e;
    for (int p : client_ports_) e.push_back(host_ + ":" + std::to_string(p));
    return e;
  }
  // For domain.toml: ["127.0.0.1:a", "127.0.0.1:b", ...]
  std::string EndpointsToml() const {
    std::string s = "[";
    for (const std::string& e : endpoints()) s += (s.size() > 1 ? ", \"" : "\"") + e + "\"";
    return s + "]";
  }
  std::unique_ptr<orchestrator::etcd::Client> NewClient(
      std::uint32_t call_timeout_ms = 2000) const {
    orchestrator::etcd::ClientOptions o;
    o.endpoints = endpoints();
    o.ca_pem = ca_pem_;
    o.call_timeout_ms = call_timeout_ms;
    auto c = orchestrator::etcd::Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // The member that leads raft now (-1: none found).
  int LeaderIndex() const {
    auto c = NewClient();
    for (int i = 0; i < n_; ++i) {
      if (pids_[i] <= 0) continue;
      auto st = c->Status(i);
      if (st.ok() && st->leader != 0 && st->leader == st->header.member_id) return i;
    }
    return -1;
  }

  void Kill(int i) {
    if (pids_[i] <= 0) return;
    ::kill(pids_[i], SIGKILL);
    ::waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }
  // Returns once every thread of the member has stopped: kill() only queues the signal, and a
  // thread inside a system call (a reply being written) finishes it first.
  void Pause(int i) {
    ::kill(pids_[i], SIGSTOP);
    int status = 0;
    ::waitpid(pids_[i], &status, WUNTRACED);
  }
  void Resume(int i) { ::kill(pids_[i], SIGCONT); }
  // Starts a killed member again on its data directory.
  void Restart(int i) { Spawn(i, /*fresh=*/false); }
  // etcdctl snapshot save of member 0's data into `file` (an operator's backup). False (with
  // why) when etcdctl fails; its output is in <dir>/etcdctl.log.
  bool SnapshotSave(const std::string& file, std::string* why) {
    return RunEtcdctl("--endpoints=" + endpoints()[0] + " snapshot save " + file, why);
  }
  // An etcd disaster recovery: every member killed, its data directory replaced by `file`
  // restored (etcdctl snapshot restore) as a cluster with token `token`, and started again;
  // waits until it is healthy. The revisions go back to the snapshot's.
  bool RestoreSnapshot(const std::string& file, const std::string& token, std::string* why) {
    for (int i = 0; i < n_; ++i) Kill(i);
    token_ = token;
    for (int i = 0; i < n_; ++i) {
      const std::string data = dir_ + "/" + Name(i);
      if (std::system(("rm -rf " + data).c_str()) != 0) return false;
      const std::string peer = "http://" + host_ + ":" + std::to_string(peer_ports_[i]);
      if (!RunEtcdctl("snapshot restore " + file + " --name=" + Name(i) + " --data-dir=" + data +
                          " --initial-cluster=" + initial_ + " --initial-cluster-token=" + token_ +
                          " --initial-advertise-peer-urls=" + peer,
                      why)) {
        return false;
      }
    }
    for (int i = 0; i < n_; ++i) Spawn(i, /*fresh=*/true);
    return WaitHealthy(std::chrono::seconds(30), why);
  }
  // etcd rebuilt empty: every member killed and started on an empty data directory, as a
  // cluster with token `token`.
  bool RebuildEmpty(const std::string& token, std::string* why) {
    for (int i = 0; i < n_; ++i) Kill(i);
    token_ = token;
    for (int i = 0; i < n_; ++i) {
      if (std::system(("rm -rf " + dir_ + "/" + Name(i)).c_str()) != 0) return false;
    }
    for (int i = 0; i < n_; ++i) Spawn(i, /*fresh=*/true);
    return WaitHealthy(std::chrono::seconds(30), why);
  }
  // etcdctl `args` against the members (e.g. "user add root:pw", "auth enable"); output in
  // <dir>/etcdctl.log.
  bool Ctl(const std::string& args, std::string* why) {
    std::string eps;
    for (const std::string& e : endpoints()) eps += (eps.empty() ? "" : ",") + e;
    return RunEtcdctl("--endpoints=" + eps + " " + args, why);
  }
  // Before Start: the members serve clients over TLS with this certificate and key (PEM
  // files); NewClient trusts `ca_pem`.
  void UseTls(const std::string& cert_file, const std::string& key_file,
              const std::string& ca_pem) {
    tls_cert_ = cert_file;
    tls_key_ = key_file;
    ca_pem_ = ca_pem;
  }
  // Before Start: more flags for every member (e.g. "--max-request-bytes=32768").
  void AddArgs(std::vector<std::string> args) {
    extra_args_.insert(extra_args_.end(), args.begin(), args.end());
  }
  pid_t pid(int i) const { return pids_[i]; }
  int size() const { return n_; }
  const std::string& dir() const { return dir_; }

 private:
  static std::string Name(int i) { return "m" + std::to_string(i); }

  void Spawn(int i, bool fresh) {
    const std::string name = Name(i);
    const std::string data = dir_ + "/" + name;
    const std::string client = (tls_cert_.empty() ? "http://" : "https://") + host_ + ":" +
                               std::to_string(client_ports_[i]);
    const std::string peer = "http://" + host_ + ":" + std::to_string(peer_ports_[i]);
    const std::string log = dir_ + "/" + name + ".log";
    const std::string bin = EtcdBinary();
    std::vector<std::string> args = {
        bin, "--name=" + name, "--data-dir=" + data, "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client, "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer, "--initial-cluster=" + initial_,
        "--initial-cluster-token=" + token_,
        std::string("--initial-cluster-state=") + (fresh ? "new" : "existing"), "--logger=zap",
        "--log-level=warn",
        // tmpfs under /tmp or not, fsync costs little at this size
        "--snapshot-count=10000"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    if (!tls_cert_.empty()) {
      args.push_back("--cert-file=" + tls_cert_);
      args.push_back("--key-file=" + tls_key_);
    }
    const pid_t parent = ::getpid();
    const pid_t p = ::fork();
    if (p == 0) {
      // A member dies with the test process, however it ends: a test aborted by a sanitizer
      // or killed by ctest's timeout runs no destructor, and an etcd left behind holds its
      // ports and data directory for good. (The signal follows the forking thread: members are
      // started from the test's own thread.) The check after prctl covers a parent that died
      // before it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      // Its own process group: a test's signals to it never reach the test itself.
      ::setpgid(0, 0);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    pids_[i] = p;
  }

  bool RunEtcdctl(const std::string& args, std::string* why) {
    const std::string log = dir_ + "/etcdctl.log";
    const std::string cmd = "ETCDCTL_API=3 " + EtcdctlBinary() + " " + args + " >>" + log + " 2>&1";
    if (std::system(cmd.c_str()) == 0) return true;
    if (why != nullptr) *why = "etcdctl " + args + " failed (output in " + log + ")";
    return false;
  }

  int n_;
  std::string host_, token_;
  std::string tls_cert_, tls_key_, ca_pem_;  // UseTls
  std::vector<std::string> extra_args_;      // AddArgs
  std::string dir_, initial_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
};

// A fixture with a fresh cluster of three members for each test: skipped without the etcd
// binary, failed when the cluster does not become healthy.
class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CXLKV_SKIP_WITHOUT_ETCD();
    etcd_ = std::make_unique<EtcdCluster>(3);
    std::string why;
    ASSERT_TRUE(etcd_->Start(&why)) << why;
  }
  std::unique_ptr<EtcdCluster> etcd_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_ETCD_CLUSTER_H_
