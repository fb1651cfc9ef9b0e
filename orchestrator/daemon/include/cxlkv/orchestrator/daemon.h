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
// The state and the owner are public for the RPC service and for in-process benchmarks:
// touch them only with mu_ held. Serving processes never link this; they talk to the daemon
// through client.h.
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
class DomainLock;
class FencedMem;
class HaSession;
class Metrics;
class WriteBackAgent;
struct LeaderTerm;

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

// One per process. Its padding follows Config's size modulo the 64-byte fence line (fence_),
// so any new configuration field can move it past the analyzer's limit: not worth a reorder.
class Orchestrator {  // NOLINT(clang-analyzer-optin.performance.Padding)
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

  // Everything below is called with mu_ held by the service.
  // First: a 64-byte-aligned line anywhere else pads the object (clang-tidy optin.Padding).
  coherence::OwnerFenceLine fence_ ABSL_GUARDED_BY(mu_){};
  // Single: this run's mark in the domain as it last wrote it (coherence::SingleOwnerLine).
  coherence::SingleOwnerLine mark_ ABSL_GUARDED_BY(mu_){};
  absl::Mutex mu_;
  DomainState state_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<coherence::PrefixOwner> owner_ ABSL_GUARDED_BY(mu_);
  std::int64_t NowMs() { return clock_->NowMs(); }
  const Config& config() const { return config_; }
  int tcp_port() const { return tcp_port_; }  // rpc.tcp's port once started (0: none)
  std::uint64_t pool_bytes() const { return pool_->size_bytes(); }
  std::int64_t started_ms() const { return started_ms_; }
  // Unix-socket peers refused at accept since Start (their uid is neither the daemon's nor
  // in rpc.allowed_uids): closed before gRPC saw them.
  std::uint64_t peers_refused() const { return refused_.load(); }
  void CountPrefixTraffic(std::uint64_t hits, std::uint64_t misses);
  // Makes the state durable: the state file, or with [etcd] the domain's state in etcd (a
  // transaction guarded by this leadership; the file is then a cache). On failure the change
  // must not be revealed (the caller fails). With [etcd], a refused guard steps down.
  absl::Status SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- orchestrator HA ([etcd]; docs/ha.md) ----
  // OK when this orchestrator may change the domain's state now (without [etcd], until it
  // stopped owning the domain; with it, while it leads); kUnavailable naming the leader
  // otherwise (and why this one's last election ended in a refused takeover), or while
  // read-only saying since when etcd is unreachable, or why a single one stopped owning.
  absl::Status ServingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when this orchestrator answers heartbeats and reads now: as ServingLocked, and also
  // while read-only (docs/ha.md "Read-only while etcd is unreachable").
  absl::Status ReadableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Read-only: this orchestrator led the domain, lost etcd (its write deadline passed), and no
  // successor is known (etcd names no other leader, the domain's fence line still names this
  // one's epoch). Checks both now, and ends read-only when either fails.
  bool ReadOnlyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Read-only: since when etcd has not answered (UTC, RFC 3339); "" otherwise.
  std::string ReadOnlySinceLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "single", "leader", "read-only" or "standby".
  std::string RoleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The epoch this orchestrator leads (or serves read-only) at: the domain's epoch, which
  // hosts compare and the fence line records (docs/ha.md "Election and epoch"); 0: none.
  std::int64_t epoch_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_; }
  // The term's id in etcd (the leader key's create revision), which guards its etcd writes.
  std::int64_t revision_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return revision_; }
  // The leader as etcd names it ("" : none known, or no [etcd]).
  std::string LeaderLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The leader's term as etcd numbers it: its leader key's create revision (0: none known, or
  // no [etcd]). Not the domain's epoch (epoch_locked), which may be higher.
  std::int64_t LeaderEpochLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a batch of owner writes. Without [etcd]: while the domain's fence line is still
  // zero and its single-owner mark still this run's (else it stops owning for good:
  // StopOwningLocked). With it: only while this orchestrator leads, its write deadline has not
  // passed, and the domain's fence line still names its epoch (else it resigns).
  // EndBatchLocked after the batch records it in the line (single: in the mark).
  bool OwnerBatchMayRunLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ha() const { return ha_ != nullptr; }
  // [[namespace]] tables ("tenant/model/layout") that matched none of the blocks this owner
  // published, while blocks of namespaces no table names were published (docs/orchestrator.md
  // "Namespaces"). Empty without an owner (a standby).
  std::vector<std::string> UnmatchedNamespacesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HA: the candidates registered in etcd (their JSON), read now; mu_ need not be held.
  absl::StatusOr<std::vector<std::string>> CandidatesInEtcd();

 private:
  Orchestrator(const Config& c, std::uint64_t pool_bytes);
  void OwnerLoop();
  // Quarantined extents: finds the arena each holds, revokes it at the prefix owner, and
  // frees the extent once its reuse time passed and no index entry names the arena.
  // Returns whether the state changed (the caller saves).
  bool TendQuarantineLocked(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ArenaInExtent(std::uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::set<std::string> told_owner_ ABSL_GUARDED_BY(mu_);  // arenas revoked at the owner
  std::uint64_t quarantines_released_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> unmatched_logged_ ABSL_GUARDED_BY(mu_);  // said once each in the log
  void AcceptLoop();
  bool UidAllowed(uid_t uid) const;
  // HA: the election's hooks (on its thread).
  absl::Status TakeOver(const LeaderTerm& t);
  void StepDown(const std::string& why);
  // [lmcache] with [etcd]: the coordinator serves from etcd's state while this one leads.
  void LeadLmcache(std::int64_t revision);
  // The owner's own entries in the prefix index now (the LMCache coordinator's objects), which
  // the coordinator reconciles with before it serves; none before the owner is open.
  std::vector<coherence::PrefixOwner::OwnEntry> OwnIndexEntries() ABSL_LOCKS_EXCLUDED(mu_);
  void EndReadOnlyLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HA, before the takeover's first store: waits until the term the domain's fence line names
  // was released (by its leader, its agent, or an operator through etcd), or the write
  // deadline passes (kAborted), or Stop.
  absl::Status AwaitRelease(const LeaderTerm& t);
  // HA, after AwaitRelease: the epoch of the term etcd numbered t: above t's revision and
  // above every epoch the domain's fence and release lines record.
  absl::StatusOr<std::int64_t> DomainEpoch(const LeaderTerm& t);
  // HA: the fence line's `keys`: CRC32C of the etcd keys this orchestrator is elected under.
  std::uint32_t KeysHash() const;
  // HA, once this orchestrator stopped storing to the domain for its term: writes the domain
  // back from this machine and writes the release line (ReleaseTerm), once per term.
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Single, in Open, before its first store to a formatted domain (or right after formatting
  // one): refuses a domain whose mark shows another single orchestrator at work (it moves),
  // writes this run's mark, then reads the fence line and refuses (its mark released again) if
  // an elected leader claimed the domain meanwhile. `holds_locks`: this process holds the
  // region locks, so a serving mark of this host's name is a dead run's.
  absl::Status MarkSingleOwner(bool holds_locks);
  // Single: stops owning the domain for good (`why`: who else owns it): no batch, grant,
  // heartbeat answer or membership change from now on; the domain written back and the mark
  // released (when it is still this run's); fatal() says why.
  void StopOwningLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Single, at Stop: writes the domain back from this machine and marks it released.
  void ReleaseSingleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HA, before the takeover's first store: kFailedPrecondition (nothing written) when the
  // domain's single-owner mark says a single orchestrator serves it (live: the mark moves; or
  // ended without releasing it: killed, stopped, its machine gone), saying what to do.
  absl::Status RefuseASingleOwner();
  // The refusal of a state older than the domain's fence line records (kFailedPrecondition's
  // message: what happened and what the operator should do).
  std::string StateOlderThanTheDomain(const std::string& source, const DomainState& state,
                                      const coherence::OwnerFenceLine& seen) const;

  std::unique_ptr<HaSession> ha_;          // null without [etcd]
  std::unique_ptr<Announcer> announcer_;   // directory summary and KV events (announce.h)
  std::unique_ptr<FencedMem> fenced_mem_;  // HA: the owner's view of the domain
  std::unique_ptr<WriteBackAgent> agent_;  // HA: releases this one's term if it dies
  // HA: the term this orchestrator claimed in the fence line last, and the last it released.
  std::int64_t claimed_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t claimed_cluster_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t released_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Read-only while etcd is unreachable: the last term's state, owner (no batch runs) and
  // epoch are kept; see ReadOnlyLocked.
  std::int64_t read_only_since_unix_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double last_takeover_unix_s_ ABSL_GUARDED_BY(mu_) = 0;  // metrics: the last takeover
  double last_takeover_s_ ABSL_GUARDED_BY(mu_) = 0;       // its length (elected -> serving)
  std::int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;  // etcd's id of the term (revision_locked)
  // The fence line as this leader last wrote it.
  std::uint64_t fence_violations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // fatal()
  // HA: why the last election this orchestrator won ended in a refused takeover ("" : it did
  // not), told to hosts that call this standby.
  std::string takeover_refused_ ABSL_GUARDED_BY(mu_);
  // Single: why it stopped owning the domain ("" : it owns it), told to every caller.
  std::string stopped_owning_ ABSL_GUARDED_BY(mu_);
  // Single: this run's mark is in the domain as serving (written by Open, not yet released).
  bool marked_ ABSL_GUARDED_BY(mu_) = false;

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
  std::unique_ptr<grpc::Service> service_;            // the Orchestrator RPC (service.h)
  std::unique_ptr<grpc::Service> directory_service_;  // the Directory RPC (directory.proto)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<coordinator::Service> lmcache_;  // [lmcache] (orchestrator/lmcache/)
  int listen_fd_ = -1;
  int tcp_port_ = 0;
  std::atomic<bool> stop_{false};
  bool new_domain_ = false;  // --new-domain (HA: used by the first leader)
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_only_ ABSL_GUARDED_BY(mu_) = false;
  // Beside stop_ (the hole before the threads): the class keeps its size with lock_.
  bool cache_failure_logged_ ABSL_GUARDED_BY(mu_) = false;
  std::thread owner_thread_, accept_thread_;
  std::int64_t started_ms_ = 0;
  std::atomic<std::uint64_t> refused_{0};
  std::chrono::steady_clock::time_point last_refusal_log_{};  // the accept thread's
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_H_
