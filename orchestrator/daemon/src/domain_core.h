// The domain's core (private to the daemon): the one lock (mu_), and under it the domain's
// state, the prefix owner, the fence line (HA) or the single orchestrator's mark, and who this
// orchestrator is to the domain (single, leader, read-only, standby). Every operation takes
// the lock and the gate it needs itself (ServingLocked for a change, ReadableLocked for a
// heartbeat or a read, OwnerBatchMayRunLocked before owner writes); the gRPC service
// (service.cc), the announcer (announce.cc) and the lifecycle (daemon.cc) call its public
// methods and never see the lock or the state.
//
// domain_core.cc holds the operations and the owner's batch with the capacity quarantine;
// leader.cc who owns the domain (the single orchestrator's mark; orchestrator HA's leader
// side: the takeover, the fence and the release, read-only mode, the step-down).
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_CORE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "cxlkv/orchestrator/state.h"
#include "cxlkv/pool/region.h"
#include "orchestrator.pb.h"

namespace cxlkv::coordinator {
class Service;
}

namespace cxlkv::orchestrator {

class FencedMem;
class HaSession;
class Metrics;
class WriteBackAgent;
struct LeaderTerm;

// What the core works on, owned by the Orchestrator and outliving the core.
struct DomainParts {
  const Config* config = nullptr;
  coherence::Clock* clock = nullptr;
  pool::Region* pool = nullptr;
  coherence::DirectMem* domain_mem = nullptr;  // the domain as this machine maps it
  std::uint64_t domain_bytes = 0;
  HaSession* ha = nullptr;                  // null without [etcd]
  FencedMem* fenced_mem = nullptr;          // HA: the owner's view of the domain
  WriteBackAgent* agent = nullptr;          // HA: releases this one's term if it dies
  const std::atomic<bool>* stop = nullptr;  // the Orchestrator's Stop
  bool new_domain = false;                  // --new-domain (HA: used by the first leader)
};

// One per Orchestrator. Its padding follows Config's size modulo the 64-byte fence line
// (fence_): not worth a reorder.
class DomainCore {  // NOLINT(clang-analyzer-optin.performance.Padding)
 public:
  explicit DomainCore(const DomainParts& parts);

  // ---- Open (single orchestrator) ----
  // In Open, before its first store to a formatted domain (or right after formatting one):
  // refuses a domain whose mark shows another single orchestrator at work (it moves), writes
  // this run's mark, then reads the fence line and refuses (its mark released again) if an
  // elected leader claimed the domain meanwhile. `holds_locks`: this process holds the region
  // locks, so a serving mark of this host's name is a dead run's.
  absl::Status MarkSingleOwner(bool holds_locks) ABSL_LOCKS_EXCLUDED(mu_);
  // --new-domain: a new state (every extent quarantined when the prefix domain was in use),
  // saved at once.
  absl::Status CreateState(bool formatted, std::int64_t now) ABSL_LOCKS_EXCLUDED(mu_);
  // The prefix owner on the domain, and (unless `new_domain`) the state file's state.
  absl::Status OpenOwner(bool new_domain, std::int64_t now) ABSL_LOCKS_EXCLUDED(mu_);
  // At Stop: writes the domain back from this machine and marks it released.
  void ReleaseSingle() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the election's hooks (HA, on its thread) ----
  // Takes the domain over for term `t`; a refusal is recorded for the hosts that call this
  // standby (ServingLocked).
  absl::Status Elected(const LeaderTerm& t) ABSL_LOCKS_EXCLUDED(mu_);
  void StepDown(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the owner loop ----
  // One owner batch (when this orchestrator may write the domain now) with the expiry and
  // the capacity quarantine, then the metrics. `lmcache`, `metrics`: null when off.
  void OwnerStep(coordinator::Service* lmcache, Metrics* metrics) ABSL_LOCKS_EXCLUDED(mu_);
  // The owner's own entries in the prefix index now (the LMCache coordinator's objects), which
  // the coordinator reconciles with before it serves; none before the owner is open.
  std::vector<coherence::PrefixOwner::OwnEntry> OwnIndexEntries() ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the operations of the gRPC service (each takes the lock and its gate) ----
  absl::Status Join(const v1::JoinRequest& req, v1::JoinReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatReply* rep)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Leave(const v1::LeaveRequest& req, v1::LeaveReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Grow(const v1::GrowRequest& req, v1::GrowReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Shrink(const v1::ShrinkRequest& req, v1::ShrinkReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  // Status: what every role knows (the configuration, who leads; `candidates` read from etcd
  // before), and the domain's state where this one answers reads. `started_ms`: when the
  // daemon started (on this core's clock).
  void Status(const std::vector<std::string>& candidates, std::int64_t started_ms,
              v1::StatusReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  // HA: the candidates registered in etcd (their JSON), read now without the lock; none
  // without [etcd].
  absl::StatusOr<std::vector<std::string>> CandidatesInEtcd();
  const Config& config() const { return config_; }
  absl::Status Hosts(v1::HostsReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Extents(v1::ExtentsReply* rep) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Prefixes(const v1::PrefixesRequest& req, v1::PrefixesReply* rep)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Drain(const v1::DrainRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  // Retires the namespace's blocks: an owner write outside the owner loop, behind the same
  // fence check as a batch.
  absl::Status Evict(const NamespaceConfig& ns, v1::EvictReply* rep) ABSL_LOCKS_EXCLUDED(mu_);

  // The announcer's look (announce.cc): while this orchestrator serves with an owner, calls
  // `look` with the owner, the epoch and the term's revision under the lock; false otherwise.
  bool LookAtOwner(absl::FunctionRef<void(const coherence::PrefixOwner& owner, std::int64_t epoch,
                                          std::int64_t revision)>
                       look) ABSL_LOCKS_EXCLUDED(mu_);

  // The secret the chain keys leaving the domain are keyed with (events, the directory
  // summary): keys.publish_file's, or else the domain's own (coherence::DomainKeyLine, which its
  // owner created; a standby reads it from the domain). "" with keys.unkeyed, or while the
  // domain has no key yet (no owner of this build opened it).
  std::string PublishSecret() ABSL_LOCKS_EXCLUDED(mu_);
  // ---- views ----
  Orchestrator::StatusView View() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status fatal() ABSL_LOCKS_EXCLUDED(mu_);
  // For the Orchestrator's Hold (tests): the lock, held across calls.
  void LockForHold() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_) { mu_.Lock(); }
  void UnlockForHold() ABSL_UNLOCK_FUNCTION(mu_) { mu_.Unlock(); }
  std::string RoleHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return RoleLocked(); }
  absl::Status ServingHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ServingLocked(); }

 private:
  std::int64_t NowMs() { return clock_->NowMs(); }
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
  // [[namespace]] tables ("tenant/model/layout") that matched none of the blocks this owner
  // published, while blocks of namespaces no table names were published (docs/orchestrator.md
  // "Namespaces"). Empty without an owner (a standby).
  std::vector<std::string> UnmatchedNamespacesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillExtent(std::uint32_t i, std::int64_t now, v1::Extent* e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Quarantined extents: finds the arena each holds, revokes it at the prefix owner, and
  // frees the extent once its reuse time passed and no index entry names the arena.
  // Returns whether the state changed (the caller saves).
  bool TendQuarantineLocked(std::int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ArenaInExtent(std::uint32_t i) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HA: the election's hook (on its thread).
  absl::Status TakeOver(const LeaderTerm& t) ABSL_LOCKS_EXCLUDED(mu_);
  // The owner, once it may write the domain (single: OpenOwner; HA: the takeover), through its
  // view `mem`: reads the domain's publish key, and creates it when there is none (or a torn
  // one), unless the keys leave unkeyed or under keys.publish_file.
  absl::Status KeyTheDomainLocked(coherence::Mem& mem) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndReadOnlyLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HA, before the takeover's first store: waits until the term the domain's fence line names
  // was released (by its leader, its agent, or an operator through etcd), or the write
  // deadline passes (kAborted), or Stop.
  absl::Status AwaitRelease(const LeaderTerm& t) ABSL_LOCKS_EXCLUDED(mu_);
  // HA, after AwaitRelease: the epoch of the term etcd numbered t: above t's revision and
  // above every epoch the domain's fence and release lines record.
  absl::StatusOr<std::int64_t> DomainEpoch(const LeaderTerm& t);
  // HA: the fence line's `keys`: CRC32C of the etcd keys this orchestrator is elected under.
  std::uint32_t KeysHash() const;
  // HA, once this orchestrator stopped storing to the domain for its term: writes the domain
  // back from this machine and writes the release line (ReleaseTerm), once per term.
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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

  // First: a 64-byte-aligned line anywhere else pads the object (clang-tidy optin.Padding).
  coherence::OwnerFenceLine fence_ ABSL_GUARDED_BY(mu_){};
  // Single: this run's mark in the domain as it last wrote it (coherence::SingleOwnerLine).
  coherence::SingleOwnerLine mark_ ABSL_GUARDED_BY(mu_){};
  absl::Mutex mu_;
  DomainState state_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<coherence::PrefixOwner> owner_ ABSL_GUARDED_BY(mu_);

  const Config& config_;
  coherence::SteadyClock steady_;
  coherence::Clock* clock_;
  pool::Region* pool_;
  coherence::DirectMem* domain_mem_;
  std::uint64_t domain_bytes_;
  HaSession* ha_;
  FencedMem* fenced_mem_;
  WriteBackAgent* agent_;
  const std::atomic<bool>& stop_;
  bool new_domain_;  // --new-domain (HA: used by the first leader)

  // The domain's publish key as the owner found or created it, or a standby read it ("" :
  // not known yet; PublishSecret).
  std::string domain_secret_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> told_owner_ ABSL_GUARDED_BY(mu_);  // arenas revoked at the owner
  std::uint64_t quarantines_released_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> unmatched_logged_ ABSL_GUARDED_BY(mu_);  // said once each in the log
  // The owner loop's clocks (its thread only; under mu_ as the rest of the batch).
  std::int64_t last_metrics_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t last_ha_metrics_ ABSL_GUARDED_BY(mu_) = 0;
  std::int64_t last_namespaces_ ABSL_GUARDED_BY(mu_) = 0;
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
  std::int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;  // etcd's id of the term
  std::uint64_t fence_violations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // fatal()
  // HA: why the last election this orchestrator won ended in a refused takeover ("" : it did
  // not), told to hosts that call this standby.
  std::string takeover_refused_ ABSL_GUARDED_BY(mu_);
  // Single: why it stopped owning the domain ("" : it owns it), told to every caller.
  std::string stopped_owning_ ABSL_GUARDED_BY(mu_);
  // Single: this run's mark is in the domain as serving (written by Open, not yet released).
  bool marked_ ABSL_GUARDED_BY(mu_) = false;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_only_ ABSL_GUARDED_BY(mu_) = false;
  bool cache_failure_logged_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_DOMAIN_CORE_H_
