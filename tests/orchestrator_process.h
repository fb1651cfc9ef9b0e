// A cxlkv-orchestrator run as a child process on a fresh emulated domain, for the
// integration and soak tests: config written to a temp dir, start / SIGTERM / kill -9, and
// helpers to run host bodies in forked processes. No gRPC here (orchestrator_harness.h adds
// the control-plane stub), so tests of libcxlkv.so alone can use it.
#ifndef CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_
#define CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "eventually.h"
#include "gtest/gtest.h"

namespace cxlkv::testing {

inline bool WaitFor(const std::function<bool()>& cond,
                    std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  return Eventually(cond, limit);
}

class OrchestratorProcess {
 public:
  // `timing` is the [timing] table's body.
  // `rpc_extra`: more lines for the [rpc] table (tcp, token_file, tls_*).
  explicit OrchestratorProcess(const std::string& timing, const std::string& rpc_extra = "") {
    char tmpl[] = "/tmp/cxlkv-orch-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    const std::string tag = std::to_string(getpid());
    pool = "/dev/shm/cxlkv-orch-pool-" + tag;
    domain = "/dev/shm/cxlkv-orch-domain-" + tag;
    socket = dir + "/o.sock";
    config = dir + "/domain.toml";
    std::ofstream(config) << "[domain]\nname = \"itest\"\n"
                          << "pool = \"file:" << pool << "?size=256M\"\n"
                          << "prefix_domain = \"file:" << domain << "?size=4M\"\n"
                          << "extent_size = \"16M\"\nstate_file = \"" << dir << "/d.state\"\n"
                          << "index_entries = 1024\nmax_hosts = 4\n"
                          << "[rpc]\nsocket = \"" << socket << "\"\n" << rpc_extra
                          << "[metrics]\nlisten = \"\"\n"
                          << "[timing]\n" << timing
                          << "[capacity]\ndefault_share = 0.5\n"
                          << "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"l\"\n";
  }
  ~OrchestratorProcess() {
    Stop(SIGTERM);
    unlink(pool.c_str());
    unlink(domain.c_str());
    const std::string cmd = "rm -rf " + dir;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  // The first start creates the domain (--new-domain); later ones (a restart after Stop)
  // read the state file it wrote.
  void Start() {
    const bool first = !started_;
    started_ = true;
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      execl(CXLKV_ORCHESTRATOR_BIN, CXLKV_ORCHESTRATOR_BIN, "--config", config.c_str(),
            first ? "--new-domain" : nullptr, nullptr);
      _exit(127);
    }
    ASSERT_TRUE(WaitFor([&] { return AcceptsConnections(socket); }))
        << "the orchestrator did not come up";
  }
  void Stop(int sig) {
    if (pid <= 0) return;
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    pid = -1;
  }

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

  std::string dir, pool, domain, socket, config;
  pid_t pid = -1;

 private:
  bool started_ = false;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_ORCHESTRATOR_PROCESS_H_
