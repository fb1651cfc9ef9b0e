// bench/peers/loopback_server.h — a peer server (redis-server, etcd) started for one benchmark
// run: on 127.0.0.1, on free ports, with its files in a fresh temporary directory, and gone
// again when the run ends however it ends.
//
// Start() looks the binary up in PATH (kNotFound when it is not installed, naming the Debian
// package), forks and execs it in a process group of its own with a minimal environment,
// stdout/stderr going to <dir>/server.log, and polls a caller-supplied readiness probe until
// the server answers. A port taken between the probe for a free port and the server's bind
// makes the server exit; Start then tries again on other ports (3 attempts).
//
// Teardown, normal: the destructor sends SIGTERM to the process group, waits (SIGKILL after
// 10 s), then removes the directory. Abnormal (the benchmark aborts, crashes or is killed):
// next to each server runs a small guard process that blocks reading a pipe only this
// process holds the write end of; the kernel closes it when this process dies, and the guard
// then SIGKILLs the server's process group and removes the directory. The guard uses only
// async-signal-safe calls (it is forked from a multi-threaded process) and execs /bin/rm.
//
// Not thread-safe: start and destroy servers from one thread (the benchmark's main thread or
// a Setup() callback).
#ifndef CXLKV_BENCH_PEERS_LOOPBACK_SERVER_H_
#define CXLKV_BENCH_PEERS_LOOPBACK_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cxlkv::bench {

struct ServerSpec {
  std::string name;            // for messages and the temp dir name: "redis", "etcd"
  std::string binary;          // looked up in PATH: "redis-server", "etcd"
  std::string debian_package;  // named in the kNotFound message
  int ports = 1;               // free loopback ports to reserve (etcd: client + peer)
  // The command line after argv[0], given the temp dir and the reserved ports.
  std::function<std::vector<std::string>(const std::string& dir, const std::vector<int>& ports)>
      args;
  // OK once the server answers on ports[0]; called repeatedly until it does or time runs out.
  // kFailedPrecondition means it never will (no client built in): Start gives up at once.
  std::function<absl::Status(int port)> ready;
  absl::Duration start_timeout = absl::Seconds(30);
};

class LoopbackServer {
 public:
  static absl::StatusOr<std::unique_ptr<LoopbackServer>> Start(const ServerSpec& spec);
  ~LoopbackServer();
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  int port() const { return ports_[0]; }
  const std::vector<int>& ports() const { return ports_; }
  const std::string& dir() const { return dir_; }
  const std::string& binary_path() const { return binary_path_; }
  pid_t pid() const { return pid_; }

 private:
  LoopbackServer() = default;
  absl::Status Launch(const ServerSpec& spec);
  void Stop();
  std::string LogTail() const;

  std::string name_;
  std::string binary_path_;
  std::string dir_;
  std::vector<int> ports_;
  pid_t pid_ = -1;
  pid_t guard_pid_ = -1;
  int guard_fd_ = -1;  // write end of the guard's pipe
};

// The absolute path of `binary` found in PATH, or kNotFound.
absl::StatusOr<std::string> FindInPath(const std::string& binary);

}  // namespace cxlkv::bench

#endif  // CXLKV_BENCH_PEERS_LOOPBACK_SERVER_H_
