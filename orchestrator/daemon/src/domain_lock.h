// The daemon's hold on what makes its domain: one orchestrator per CXL domain, enforced
// (docs/orchestrator.md "One orchestrator per domain").
//
// Acquire() takes an exclusive lock on `<domain.state_file>.lock` and writes this daemon's
// pid, socket and configuration into it; LockRegion() takes an open-file-description lock
// (F_OFD_SETLK) on the bytes of a file or device-DAX region the domain owns (the prefix domain
// and the pool): exclusive for a single orchestrator, shared for the candidates of an HA
// domain (which all map the same memory; the election decides who writes), so that a single
// orchestrator and candidates on one host refuse each other in either order. Both are
// advisory kernel locks: they end with the last descriptor, that is when the daemon exits
// however it exits (kill -9 included), so a stale lock cannot outlive its holder. They hold on
// one host only: daemons on two hosts sharing the memory do not see each other's (there the
// domain's own lines tell: the fence line and the single owner's mark, docs/orchestrator.md).
// Not thread-safe; the daemon's Open uses it before any thread starts.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_LOCK_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_LOCK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/orchestrator/config.h"

namespace cxlkv::orchestrator {

class DomainLock {
 public:
  // Locks `<c.state_file>.lock` (created 0644 when absent; the only file created before the
  // lock is held) and records this process in it. kFailedPrecondition when another daemon
  // holds it, naming that one (pid, socket, config) and the fix; other errors name the file.
  static absl::StatusOr<std::unique_ptr<DomainLock>> Acquire(const Config& c);
  ~DomainLock();
  DomainLock(const DomainLock&) = delete;
  DomainLock& operator=(const DomainLock&) = delete;

  // Locks the bytes `spec` names ([offset, offset + length), or the whole source) for this
  // daemon's life: shared (`shared`: a candidate of an HA domain) or exclusive (a single
  // orchestrator). `key` names the configuration key in messages. Sources private to one
  // process (memfd, kmem) have nothing to lock: OK. kFailedPrecondition when another
  // orchestrator holds them against this one (any lock against an exclusive one, an
  // exclusive one against a shared one), saying which kind holds them (a single orchestrator,
  // or candidates with [etcd]) and naming it where /proc tells (pid and command line).
  absl::Status LockRegion(absl::string_view key, const std::string& spec, bool shared = false);

  // The lock file's path (the state file's, with ".lock").
  const std::string& path() const { return path_; }

 private:
  DomainLock() = default;
  std::string path_;
  std::vector<int> fds_;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_LOCK_H_
