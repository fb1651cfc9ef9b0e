// The write-back agent of an elected orchestrator (orchestrator HA, docs/ha.md "Release";
// private to the daemon). A child process forked before the orchestrator starts any thread,
// sharing the domain's mapping and one page with it. It makes sure the term its orchestrator
// owned is released even when the orchestrator cannot release it itself:
//   - the orchestrator died (kill -9, a crash) with its machine alive: the agent writes the
//     domain range back from this machine's caches (the dead process's stores that never
//     reached memory land now) and writes the release line;
//   - the orchestrator is stopped (SIGSTOP, a freezer) past its write deadline: the agent
//     ends it (SIGKILL), so it cannot resume in the middle of a store, then releases as above.
// A stopped VM stops the agent too; that term is released by the orchestrator itself when it
// resumes and steps down, and its successor waits for that (docs/ha.md).
//
// Thread-safety: the methods may be called from any thread of the orchestrator.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_AGENT_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_AGENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace cxlkv::orchestrator {

class WriteBackAgent {
 public:
  // Forks the agent. `domain` is the mapping of the domain region (len bytes), shared with the
  // child. The agent ends a stopped orchestrator once its write deadline passed, and any
  // orchestrator still holding its term `kill_after_ms` past the deadline. Call it before
  // the process starts threads (the child runs no allocator, no lock, no stdio).
  static absl::StatusOr<std::unique_ptr<WriteBackAgent>> Start(std::byte* domain, std::uint64_t len,
                                                               std::int64_t kill_after_ms);
  ~WriteBackAgent();  // the agent exits without releasing anything (its parent did)

  // The orchestrator is about to write its claim of `epoch` into the fence line: from now on
  // the agent releases that term if the orchestrator dies before Released(epoch).
  void Claimed(std::int64_t epoch, std::uint64_t cluster_id, std::uint32_t node);
  // The write deadline of the claimed term, on CLOCK_BOOTTIME (ms).
  void Deadline(std::int64_t boot_ms);
  // The orchestrator released `epoch` itself.
  void Released(std::int64_t epoch);
  pid_t pid() const { return pid_; }

  // Shared with the child.
  struct Page {
    std::atomic<std::int64_t> claimed{0}, released{0}, deadline_boot_ms{0};
    std::atomic<std::uint64_t> cluster_id{0};
    std::atomic<std::uint32_t> node{0};
    std::atomic<std::uint32_t> stop{0};
  };

 private:
  WriteBackAgent() = default;
  Page* page_ = nullptr;
  pid_t pid_ = -1;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_AGENT_H_
