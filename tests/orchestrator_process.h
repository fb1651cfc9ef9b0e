// The one test fixture that runs cxlkv-orchestrator as a child process on a fresh emulated
// domain: its config written to a temporary directory, started with posix_spawn (safe in a
// multithreaded test) with its output in a log file printed when the test failed, stopped with
// any signal (kill -9 included) and started again on the state it wrote. Also helpers to run
// host bodies in forked processes.
//
// Two parts switch on with what the test links, so that tests of libcxlkv.so alone (no gRPC,
// no coherence headers) use the same fixture:
//   - with the orchestrator's generated gRPC header on the include path: Stub(), Hosts(),
//     Status(), HostState() ask the daemon over its control-plane socket;
//   - with cxlkv/coherence/prefix.h: Host(), Publish(), Retire() act as a host of the domain
//     in this process (a PrefixHost on the shared domain file).
//
// The HA tests (tests/ha/ha_orchestrator.h) build their etcd-backed orchestrators on it: the
// domain's files from outside, extra environment, a command prefix (a network or UTS
// namespace), Launch() with an explicit --new-domain and an exit that is the expected outcome.
#ifndef CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_
#define CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "eventually.h"
#include "gtest/gtest.h"

#if __has_include("orchestrator.grpc.pb.h")
#include <grpcpp/grpcpp.h>

#include "orchestrator.grpc.pb.h"
#define CXLKV_TESTS_ORCHESTRATOR_RPC 1
#endif
#if __has_include("cxlkv/coherence/prefix.h")
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#define CXLKV_TESTS_ORCHESTRATOR_HOST 1
#endif

extern char** environ;

namespace cxlkv::testing {

// Eventually() with the limit most of these tests use.
inline bool WaitFor(const std::function<bool()>& cond,
                    std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  return Eventually(cond, limit);
}
// Eventually() under the name the directory and KV-event tests use.
inline bool SoonTrue(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  return Eventually(cond, limit);
}

inline std::string SlurpFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What the fixture writes into domain.toml. The defaults are the integration tests' domain: a
// 256 MiB pool in 16 MiB extents, a capacity share and one namespace, SIGTERM at teardown
// (which must exit cleanly).
struct OrchestratorConfig {
  std::string name = "itest";             // domain.name (the domain's name in etcd)
  std::string pool_params = "size=256M";  // the pool file's spec parameters, after '?'
  std::string extent_size = "16M";
  std::string domain_params = "size=4M";  // the prefix domain file's spec parameters
  std::uint32_t max_hosts = 4;
  // The pool and prefix domain files; empty: the fixture's own, removed at teardown. Given
  // (both): another's (HA: shared by several orchestrators), left in place.
  std::string pool_file, domain_file;
  std::string timing;          // the [timing] table's body
  std::string rpc_extra;       // more lines of [rpc] (tcp, token_file, tls_*)
  std::string metrics_listen;  // [metrics] listen ("" : no endpoint)
  std::string sections =  // TOML after [timing]
      "[capacity]\ndefault_share = 0.5\n"
      "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"l\"\n";
  int teardown_signal = SIGTERM;
};

// The directory and KV-event tests' domain: 64 MiB of pool (not reserved) in 8 MiB extents,
// 500 ms leases, a long host TTL, `extra` sections appended, kill -9 at teardown.
inline OrchestratorConfig SmallDomain(const std::string& name, const std::string& extra) {
  OrchestratorConfig c;
  c.name = name;
  c.pool_params = "size=64M&reserve=0";
  c.extent_size = "8M";
  c.timing =
      "lease_ttl_ms = 500\nhost_ttl_ms = 60000\nheartbeat_period_ms = 100\ngrace_ms = 50\n"
      "capacity_lease_ms = 60000\n";
  c.sections = extra;
  c.teardown_signal = SIGKILL;
  return c;
}

inline constexpr std::size_t kOrchestratorDomainBytes = 4 << 20;  // prefix_domain's size

class OrchestratorProcess {
 public:
  // The integration tests' domain (OrchestratorConfig's defaults) with this [timing] body
  // and more [rpc] lines.
  explicit OrchestratorProcess(const std::string& timing, const std::string& rpc_extra = "")
      : OrchestratorProcess(WithTiming(timing, rpc_extra)) {}
  // `share_with`: another orchestrator of the same domain (HA: the same pool and domain
  // files, which that one removes at teardown); this one's first start is not a new domain.
  // Neither is it when the config names the files.
  explicit OrchestratorProcess(const OrchestratorConfig& c,
                               const OrchestratorProcess* share_with = nullptr)
      : teardown_signal_(c.teardown_signal),
        owns_files_(share_with == nullptr && c.pool_file.empty()),
        started_(!owns_files_) {
    EXPECT_EQ(c.pool_file.empty(), c.domain_file.empty())
        << "OrchestratorConfig: set both pool_file and domain_file, or neither";
    char tmpl[] = "/tmp/cxlkv-orch-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    const std::string tag = dir.substr(dir.rfind('-') + 1);
    if (share_with != nullptr) {
      pool = share_with->pool;
      domain = share_with->domain;
    } else if (!c.pool_file.empty()) {
      pool = c.pool_file;
      domain = c.domain_file;
    } else {
      pool = "/dev/shm/cxlkv-orch-pool-" + tag;
      domain = "/dev/shm/cxlkv-orch-domain-" + tag;
    }
    socket = dir + "/o.sock";
    log = dir + "/log";
    config = dir + "/domain.toml";
    std::ofstream(config) << "[domain]\nname = \"" << c.name << "\"\n"
                          << "pool = \"file:" << pool << "?" << c.pool_params << "\"\n"
                          << "prefix_domain = \"file:" << domain << "?" << c.domain_params << "\"\n"
                          << "extent_size = \"" << c.extent_size << "\"\nstate_file = \"" << dir
                          << "/d.state\"\n"
                          << "index_entries = 1024\nmax_hosts = " << c.max_hosts << "\n"
                          << "[rpc]\nsocket = \"" << socket << "\"\n"
                          << c.rpc_extra << "[metrics]\nlisten = \"" << c.metrics_listen << "\"\n"
                          << "[timing]\n"
                          << c.timing << c.sections;
  }
  ~OrchestratorProcess() {
#ifdef CXLKV_TESTS_ORCHESTRATOR_HOST
    host_.reset();
    mem_.reset();
#endif
    if (map_ != nullptr) ::munmap(map_, kOrchestratorDomainBytes);
    Stop(teardown_signal_);
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "---- log of the orchestrator in %s ----\n%s", dir.c_str(),
                   SlurpFile(log).c_str());
    }
    if (owns_files_) {
      ::unlink(pool.c_str());
      ::unlink(domain.c_str());
    }
    const std::string cmd = "rm -rf " + dir;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  OrchestratorProcess(const OrchestratorProcess&) = delete;
  OrchestratorProcess& operator=(const OrchestratorProcess&) = delete;

  // Starts the process and waits (10 s at most) until its socket accepts connections; false
  // (and a test failure with the log) if it exited or did not come up. The first start
  // creates the domain (--new-domain) unless it shares another's; later ones (a restart after
  // Stop) read the state file it wrote.
  bool Start() {
    const bool new_domain = !started_;
    started_ = true;
    const Launched l = Launch(new_domain);
    EXPECT_NE(l, Launched::kExited) << "the orchestrator did not come up:\n" << SlurpFile(log);
    return l == Launched::kUp;
  }

  enum class Launched { kUp, kExited, kFailed };
  // Spawns the process (posix_spawn: no fork handlers of a multithreaded test run), with
  // --new-domain if `new_domain`, `command_prefix` before it and `env` added to the test's
  // environment, and waits (10 s at most) until its socket accepts connections. kExited when
  // it exited first (its wait status in exit_status, its log says why: for a test that expects
  // a refusal, no failure); kFailed, with a test failure, when it could not be spawned or did
  // not come up.
  Launched Launch(bool new_domain) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<std::string> args = command_prefix;
    args.insert(args.end(), {CXLKV_ORCHESTRATOR_BIN, "--config", config});
    if (new_domain) args.push_back("--new-domain");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = env;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid = -1;
      ADD_FAILURE() << "posix_spawn " << args[0] << ": " << rc;
      return Launched::kFailed;
    }
    const bool up = Eventually(
        [&] {
          int status = 0;
          if (::waitpid(pid, &status, WNOHANG) == pid) {
            pid = -1;
            exit_status = status;
            return true;
          }
          return AcceptsConnections(socket);
        },
        std::chrono::milliseconds(10000));
    if (!up) {
      ADD_FAILURE() << "the orchestrator did not come up:\n" << SlurpFile(log);
      return Launched::kFailed;
    }
    return pid > 0 ? Launched::kUp : Launched::kExited;
  }

  // Sends `sig` and reaps the process. SIGKILL also continues a stopped one; after SIGTERM the
  // process must have exited with status 0.
  void Stop(int sig) {
    const int status = Reap(sig);
    if (status != -1 && sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
  }
  // Sends `sig` and reaps the process, whatever its exit: its wait status (-1: not running).
  // SIGKILL also continues a stopped one.
  int Reap(int sig) {
    if (pid <= 0) return -1;
    ::kill(pid, sig);
    if (sig == SIGKILL) ::kill(pid, SIGCONT);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
  // Sends `sig` (SIGSTOP, SIGCONT) and leaves the process running.
  void Signal(int sig) const {
    if (pid > 0) ::kill(pid, sig);
  }
  // Waits up to `limit` for the process to exit on its own; its wait status then is
  // exit_status.
  bool Exited(std::chrono::milliseconds limit) {
    if (pid <= 0) return exit_status != -1;
    return Eventually(
        [&] {
          int status = 0;
          if (::waitpid(pid, &status, WNOHANG) != pid) return false;
          pid = -1;
          exit_status = status;
          return true;
        },
        limit);
  }
  // Adds text to the config (after the last section), before Start.
  void AppendConfig(const std::string& text) const { std::ofstream(config, std::ios::app) << text; }

  // Runs body in a child process; the child exits 0 if body returns true.
  static pid_t Fork(const std::function<bool()>& body) {
    const pid_t p = fork();
    if (p == 0) _exit(body() ? 0 : 1);
    return p;
  }
  static bool Exited0(pid_t p) {
    int status = 0;
    waitpid(p, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

#ifdef CXLKV_TESTS_ORCHESTRATOR_RPC
  // The control plane, over the daemon's Unix socket.
  std::unique_ptr<::cxlkv::orchestrator::v1::Orchestrator::Stub> Stub() const {
    return ::cxlkv::orchestrator::v1::Orchestrator::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  }
  ::cxlkv::orchestrator::v1::HostsReply Hosts() const {
    grpc::ClientContext ctx;
    ::cxlkv::orchestrator::v1::HostsReply r;
    EXPECT_TRUE(Stub()->Hosts(&ctx, ::cxlkv::orchestrator::v1::HostsRequest{}, &r).ok());
    return r;
  }
  ::cxlkv::orchestrator::v1::StatusReply Status() const {
    grpc::ClientContext ctx;
    ::cxlkv::orchestrator::v1::StatusReply r;
    EXPECT_TRUE(Stub()->Status(&ctx, ::cxlkv::orchestrator::v1::StatusRequest{}, &r).ok());
    return r;
  }
  // A host's state as the daemon reports it, or "absent".
  std::string HostState(std::uint32_t id) const {
    const ::cxlkv::orchestrator::v1::HostsReply r = Hosts();
    for (const auto& h : r.hosts()) {
      if (h.host_id() == id) return h.state();
    }
    return "absent";
  }
#endif

#ifdef CXLKV_TESTS_ORCHESTRATOR_HOST
  // A host of this domain (host id 2) in this process, on the shared domain file.
  coherence::PrefixHost& Host() {
    if (host_ == nullptr) {
      const int fd = ::open(domain.c_str(), O_RDWR);
      EXPECT_GE(fd, 0);
      map_ = ::mmap(nullptr, kOrchestratorDomainBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      EXPECT_NE(map_, MAP_FAILED);
      mem_ = std::make_unique<coherence::DirectMem>(static_cast<std::byte*>(map_),
                                                    kOrchestratorDomainBytes);
      auto h = coherence::PrefixHost::Join(*mem_, clock_, 2);
      EXPECT_TRUE(h.ok()) << h.status();
      host_ = *std::move(h);
    }
    return *host_;
  }
  // Publishes a block under `key` and waits until the owner applied it.
  bool Publish(coherence::Namespace ns, const coherence::PrefixKey& key, std::uint32_t index) {
    coherence::BlockRef ref{};
    ref.arena[0] = 9;
    ref.index = index;
    ref.generation = 1;
    if (!Host().Publish(ns, key, coherence::PrefixKey{}, ref).ok()) return false;
    return SoonTrue([&] { return Host().Lookup(ns, key).has_value(); },
                    std::chrono::milliseconds(3000));
  }
  bool Retire(coherence::Namespace ns, const coherence::PrefixKey& key) {
    if (!Host().Retire(ns, key).ok()) return false;
    return SoonTrue([&] { return !Host().Lookup(ns, key).has_value(); },
                    std::chrono::milliseconds(3000));
  }
#endif

  std::string dir, pool, domain, socket, log, config;
  pid_t pid = -1;
  int exit_status = -1;          // the wait status once it exited on its own (-1: not seen)
  std::vector<std::string> env;  // NAME=VALUE added to the test's environment
  std::vector<std::string> command_prefix;  // a command that execs the rest (a namespace)

 private:
  static OrchestratorConfig WithTiming(const std::string& timing, const std::string& rpc_extra) {
    OrchestratorConfig c;
    c.timing = timing;
    c.rpc_extra = rpc_extra;
    return c;
  }

  int teardown_signal_ = SIGTERM;
  bool owns_files_ = true;
  bool started_ = false;
  void* map_ = nullptr;
#ifdef CXLKV_TESTS_ORCHESTRATOR_HOST
  coherence::SteadyClock clock_;
  std::unique_ptr<coherence::DirectMem> mem_;
  std::unique_ptr<coherence::PrefixHost> host_;
#endif
};

// The standard output of `cmd`, run by the shell ("" when it cannot run).
inline std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The domain's publish secret as a router gets it: `cxlkvctl publish-key` (the program at
// `ctl`) on o's config, which reads it from the domain ("" when it fails; its message goes to
// the test's stderr).
inline std::string DomainPublishKey(const std::string& ctl, const OrchestratorProcess& o) {
  std::string out = RunCapture(ctl + " publish-key --config " + o.config);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_
