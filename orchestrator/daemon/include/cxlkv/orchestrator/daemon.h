// cxlkv/orchestrator/daemon.h — the orchestrator of one CXL domain (what cxlkv-orchestrator
// runs): the owner role of the shared prefix protocol, the membership and capacity state,
// the gRPC control plane on a Unix socket (and TCP), and metrics.
//
// Open() takes the pool, the prefix domain and the state file; Start() runs the owner
// thread, the RPC server and the metrics endpoint on threads of their own; Stop() ends them.
//
// With an [etcd] section (orchestrator HA, docs/ha.md) several orchestrators of one domain
// start alike, as standbys: Open maps the regions and checks the domain's state in etcd, and
// Start also campaigns. The one elected takes the domain over (its epoch into the domain's
// fence line, then the prefix owner, then the state from etcd) and serves; the others answer
// every call but Status with UNAVAILABLE naming the leader. The leader's state changes are
// written to etcd under its leadership before they are revealed; the state file is then a
// cache. Without [etcd], one orchestrator as before.
// The domain's state, the prefix owner and the lock they share are the core's (private to the
// daemon: src/domain_core.h); this header shows a status view. Serving processes never link
// this; they talk to the daemon through client.h.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_H_
#define CXLKV_ORCHESTRATOR_DAEMON_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/base/stop.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/state.h"
#include "cxlkv/pool/region.h"

namespace grpc {
class Server;
class Service;
}

namespace cxlkv::coordinator {
class Service;
}

namespace cxlkv::orchestrator {

class Announcer;
class DomainCore;
class DomainLock;
class FencedMem;
class HaSession;
class Metrics;
class WriteBackAgent;

struct OpenOptions {
  // The operator says this is a new domain (cxlkv-orchestrator --new-domain): no state file
  // exists yet. Open writes one at once (later opens read it), and if the prefix domain was
  // already formatted every extent starts quarantined for a full capacity lease. Refused
  // when the state file exists. Without it, a missing state file fails Open: kDataLoss when
  // the prefix domain is formatted (the domain ran before; its assignments are lost),
  // kFailedPrecondition otherwise.
  bool new_domain = false;
  // The orchestrator's clock (a seam for tests); null: CLOCK_MONOTONIC. Must outlive the
  // orchestrator.
  coherence::Clock* clock = nullptr;
  // HA: fork the write-back agent (docs/ha.md "Release") that releases this orchestrator's
  // term when it dies or is stopped past its write deadline. Off only for in-process tests,
  // where the agent would watch (and could end) the test process.
  bool write_back_agent = true;
  // Locks the pool's and the prefix domain's bytes for the orchestrator's life
  // (docs/orchestrator.md "One orchestrator per domain"). Off only for in-process tests that
  // play orchestrators on two machines sharing the memory, which cannot see each other's
  // locks: only what the domain itself records can keep them apart there.
  bool lock_regions = true;
};

// One per process.
class Orchestrator {
 public:
  // Takes the domain's lock first (kFailedPrecondition naming the running daemon when another
  // one holds it; docs/orchestrator.md "One orchestrator per domain"), then opens (creating
  // when absent) the pool and the prefix domain and loads the state file (see
  // OpenOptions::new_domain for a missing one).
  static absl::StatusOr<std::unique_ptr<Orchestrator>> Open(const Config& c,
                                                            const OpenOptions& options = {});
  ~Orchestrator();

  // Starts the owner thread, the RPC server and the metrics endpoint. rpc.socket is replaced
  // only when it is a socket nothing answers on; anything else there is refused and left.
  absl::Status Start();
  void Stop();
  // Not OK once this orchestrator found it must not own its domain: HA, a wrong
  // etcd.cluster/etcd.domain (the domain's fence line names other etcd keys; it campaigns no
  // more); single, another owner wrote the domain's fence line or its single-owner mark (it
  // stopped owning: docs/orchestrator.md "One orchestrator per domain"). The process exits
  // with this error (main.cc).
  absl::Status fatal();

  const Config& config() const { return config_; }
  int tcp_port() const { return tcp_port_; }  // rpc.tcp's port once started (0: none)
  std::uint64_t pool_bytes() const;
  // Unix-socket peers refused at accept since Start (their uid is neither the daemon's nor
  // in rpc.allowed_uids): closed before gRPC saw them.
  std::uint64_t peers_refused() const { return refused_.load(); }

  // What this orchestrator is to its domain now, and the domain's extents as it holds them (a
  // standby's: what it held last, if anything; the leader's state is the leader's).
  struct StatusView {
    std::string role;               // "single", "leader", "read-only" or "standby"
    std::int64_t epoch = 0;         // the epoch it leads (or serves read-only) at; 0: none
    std::int64_t leader_epoch = 0;  // the leader's term as etcd numbers it (0: none known)
    std::string leader;             // the leader as etcd names it ("" : none known)
    absl::Status serving;           // OK while it may change the domain's state
    std::vector<ExtentInfo> extents;
    std::uint32_t recovered_extents = 0;  // held by hosts when the state was loaded
  };
  StatusView status() const;
  // For tests: while a Hold lives, the domain's lock is held (no owner batch runs and no call
  // is answered).
  class Hold {
   public:
    explicit Hold(Orchestrator& o);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    std::string Role();
    absl::Status Serving();

   private:
    DomainCore& core_;
  };

 private:
  explicit Orchestrator(const Config& c);
  void OwnerLoop();
  void AcceptLoop();
  bool UidAllowed(uid_t uid) const;
  // [lmcache] with [etcd]: the coordinator serves from etcd's state while this one leads.
  void LeadLmcache(std::int64_t revision);

  std::unique_ptr<HaSession> ha_;          // null without [etcd]
  std::unique_ptr<FencedMem> fenced_mem_;  // HA: the owner's view of the domain
  std::unique_ptr<WriteBackAgent> agent_;  // HA: releases this one's term if it dies
  // Held for the daemon's life, released after the regions and the server below: the state
  // file's lock and the pool's and the prefix domain's (domain_lock.h: exclusive without
  // [etcd], shared with it).
  std::unique_ptr<DomainLock> lock_;
  Config config_;
  coherence::SteadyClock steady_;
  coherence::Clock* clock_ = &steady_;
  std::unique_ptr<pool::Region> pool_;
  std::unique_ptr<pool::Region> domain_region_;
  std::unique_ptr<coherence::DirectMem> domain_mem_;
  // Raised by Stop(); its waits (the owner loop's period) end at once (base/stop.h).
  base::StopSignal stop_;
  // The lock, the domain's state, the prefix owner, the fence line (domain_core.h); after the
  // parts above it works on, before the server below that calls it.
  std::unique_ptr<DomainCore> core_;
  std::unique_ptr<Announcer> announcer_;              // directory summary and KV events
  std::unique_ptr<grpc::Service> service_;            // the Orchestrator RPC (service.h)
  std::unique_ptr<grpc::Service> directory_service_;  // the Directory RPC (directory.proto)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<coordinator::Service> lmcache_;  // [lmcache] (orchestrator/lmcache/)
  int listen_fd_ = -1;
  int tcp_port_ = 0;
  std::thread owner_thread_, accept_thread_;
  std::int64_t started_ms_ = 0;
  std::atomic<std::uint64_t> refused_{0};
  std::chrono::steady_clock::time_point last_refusal_log_{};  // the accept thread's
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_H_
