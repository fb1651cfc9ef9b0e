// One cxlkv-orchestrator process on a domain of its own in /dev/shm, for the directory and KV
// events tests: config written to a temporary directory (extra TOML sections appended), started
// with posix_spawn (no fork in a multithreaded test), killed at teardown; its log is printed
// when the test failed. Also a host of the domain in this process (PrefixHost on the shared
// file) to publish and retire blocks through the real owner.
#ifndef CXLKV_TESTS_SPAWNED_ORCHESTRATOR_H_
#define CXLKV_TESTS_SPAWNED_ORCHESTRATOR_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "eventually.h"
#include "gtest/gtest.h"

extern char** environ;

namespace cxlkv::testing {

// Eventually() under the name these tests use.
inline bool SoonTrue(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  return Eventually(cond, limit);
}

inline std::string SlurpFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline constexpr std::size_t kSpawnedDomainBytes = 4 << 20;

class SpawnedOrchestrator {
 public:
  // `name`: domain.name (and so the domain's name in etcd); `extra`: more TOML sections.
  // `share_with`: another orchestrator of the same domain (HA: same pool and domain files,
  // which that one removes at teardown).
  SpawnedOrchestrator(const std::string& name, const std::string& extra,
                      const SpawnedOrchestrator* share_with = nullptr) {
    char tmpl[] = "/tmp/cxlkv-spawned-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    const std::string tag = dir.substr(dir.rfind('-') + 1);
    owns_files_ = share_with == nullptr;
    pool = share_with != nullptr ? share_with->pool : "/dev/shm/cxlkv-sp-pool-" + tag;
    domain = share_with != nullptr ? share_with->domain : "/dev/shm/cxlkv-sp-domain-" + tag;
    socket = dir + "/o.sock";
    log = dir + "/log";
    config = dir + "/domain.toml";
    std::ofstream(config) << "[domain]\nname = \"" << name << "\"\n"
                          << "pool = \"file:" << pool << "?size=64M&reserve=0\"\n"
                          << "prefix_domain = \"file:" << domain << "?size=4M\"\n"
                          << "extent_size = \"8M\"\nstate_file = \"" << dir << "/d.state\"\n"
                          << "index_entries = 1024\nmax_hosts = 4\n"
                          << "[rpc]\nsocket = \"" << socket << "\"\n"
                          << "[metrics]\nlisten = \"\"\n"
                          << "[timing]\nlease_ttl_ms = 500\nhost_ttl_ms = 60000\n"
                          << "heartbeat_period_ms = 100\ngrace_ms = 50\n"
                          << "capacity_lease_ms = 60000\n"
                          << extra;
  }
  ~SpawnedOrchestrator() {
    host_.reset();
    if (map_ != nullptr) ::munmap(map_, kSpawnedDomainBytes);
    Kill(SIGKILL);
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "---- log of %s ----\n%s", dir.c_str(), SlurpFile(log).c_str());
    }
    if (owns_files_) {
      ::unlink(pool.c_str());
      ::unlink(domain.c_str());
    }
    const std::string cmd = "rm -rf " + dir;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  // Starts the process and waits until its socket accepts connections.
  bool Start(bool new_domain) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<std::string> args = {CXLKV_ORCHESTRATOR_BIN, "--config", config};
    if (new_domain) args.push_back("--new-domain");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid, CXLKV_ORCHESTRATOR_BIN, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return false;
    const bool up = SoonTrue(
        [&] {
          int status = 0;
          if (::waitpid(pid, &status, WNOHANG) == pid) {
            pid = -1;
            return true;
          }
          return AcceptsConnections(socket);
        },
        std::chrono::milliseconds(10000));
    EXPECT_TRUE(up && pid > 0) << "the orchestrator did not come up:\n" << SlurpFile(log);
    return up && pid > 0;
  }

  void Kill(int sig) {
    if (pid <= 0) return;
    ::kill(pid, sig);
    if (sig == SIGKILL) ::kill(pid, SIGCONT);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }

  // A host of this domain (host id 2) in this process, on the shared domain file.
  coherence::PrefixHost& Host() {
    if (host_ == nullptr) {
      const int fd = ::open(domain.c_str(), O_RDWR);
      EXPECT_GE(fd, 0);
      map_ = ::mmap(nullptr, kSpawnedDomainBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      EXPECT_NE(map_, MAP_FAILED);
      mem_ = std::make_unique<coherence::DirectMem>(static_cast<std::byte*>(map_),
                                                    kSpawnedDomainBytes);
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

  std::string dir, pool, domain, socket, log, config;
  pid_t pid = -1;

 private:
  bool owns_files_ = true;
  coherence::SteadyClock clock_;
  void* map_ = nullptr;
  std::unique_ptr<coherence::DirectMem> mem_;
  std::unique_ptr<coherence::PrefixHost> host_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_SPAWNED_ORCHESTRATOR_H_
