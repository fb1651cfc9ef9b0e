// Orchestrator HA's seam in the daemon (docs/ha.md; private to the daemon): leadership of the
// domain through etcd, and the domain's control state (membership, extents, quarantine) kept
// in etcd under transactions guarded by that leadership. ha_etcd.cc implements it on
// orchestrator/etcd; ha_off.cc, built when the etcd client is not, refuses an [etcd] section.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_HA_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_HA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/orchestrator/config.h"
#include "fence.h"

namespace cxlkv::coordinator {
class StateStore;
}

namespace cxlkv::orchestrator {

// A term as etcd numbers it. The domain's epoch of the term (what hosts compare and the fence
// line records) derives from this and from the domain's record: Orchestrator::TakeOver.
struct LeaderTerm {
  std::int64_t revision = 0;     // the leader key's create revision (guards etcd writes)
  std::uint64_t cluster_id = 0;  // the etcd cluster's id
};

struct StoredState {
  std::string text;           // DomainState::Serialize()'s output
  std::int64_t revision = 0;  // its mod revision in etcd
};

struct HaStats {
  std::int64_t epoch = 0;  // this orchestrator's, while it leads
  std::string leader;      // the leader key's value as last seen (JSON), "" : none known
  std::int64_t leader_epoch = 0;
  std::uint64_t elections_won = 0, step_downs = 0, keepalive_failures = 0;
  std::uint64_t state_writes = 0, state_write_failures = 0;
  // The last leadership ended because etcd stopped answering in time (read-only mode).
  bool lost_contact = false;
  std::int64_t last_contact_unix_ms = 0;  // the last keep-alive etcd answered (wall clock)
  // Latencies (ms) of etcd requests (keep-alives, campaigns, state reads and writes) since the
  // last DrainStats().
  std::vector<double> etcd_call_ms;
};

class HaSession : public WriteGate {
 public:
  struct Hooks {
    // Elected: take the domain over (writes are allowed from now on). An error resigns.
    std::function<absl::Status(const LeaderTerm&)> take_over;
    // Leadership ended; WriteAllowed() is already false.
    std::function<void(const std::string& why)> step_down;
  };

  // Makes the etcd client for c.etcd (no I/O). `self` describes this orchestrator (JSON: node,
  // endpoints, pid); it is the leader key's value while this one leads. `clock` is the one the
  // write deadline is kept on (the orchestrator's; it must outlive the session).
  // kFailedPrecondition in a build without the etcd client.
  static absl::StatusOr<std::unique_ptr<HaSession>> Create(const Config& c, const std::string& self,
                                                           coherence::Clock* clock);
  ~HaSession() override = default;

  // Replaces `self` before Start (the daemon knows its TCP port only once it listens).
  virtual void Advertise(const std::string& self) = 0;
  // Starts campaigning. The hooks run on the election's thread.
  virtual absl::Status Start(Hooks hooks) = 0;
  // Steps down if leading (the lease is revoked: a standby takes over at once) and stops.
  virtual void Stop() = 0;
  // Steps down now; campaigns again after a pause.
  virtual void Resign(const std::string& why) = 0;
  // Steps down now and never campaigns again (the session ends): a candidate that must not
  // lead this domain. May be called from a hook.
  virtual void StopCampaigning() = 0;

  // The domain's state as etcd holds it (nullopt: none yet). Remembers its revision for the
  // guard of SaveState.
  virtual absl::StatusOr<std::optional<StoredState>> LoadState() = 0;
  // Writes the state only if this orchestrator still leads in the term etcd numbered
  // `revision` (LeaderTerm) and nobody wrote the state since it was last loaded or saved here.
  // kAborted when a guard fails (this one must step down). When etcd does not answer in time,
  // the state is read back: the write landed (OK), did not (kUnavailable / kDeadlineExceeded),
  // or someone else wrote (kAborted); when the read fails too, the outcome stays unknown
  // (kUnavailable / kDeadlineExceeded: the next save's guard tells).
  virtual absl::Status SaveState(const std::string& text, std::int64_t revision) = 0;

  // The cross-domain directory (docs/ha.md): writes this domain's summary under the leader's
  // session lease, so it vanishes with the lease, and only while this orchestrator still
  // leads in the term `revision` (a guarded transaction). kAborted when it no longer leads.
  virtual absl::Status PutDirectory(const std::string& value, std::int64_t revision) = 0;

  // The write deadline of the current term on the session's clock (0: not leading).
  virtual std::int64_t write_deadline_ms() const = 0;
  // The epoch an operator declared released in etcd (P/released: a decimal epoch, written
  // with etcdctl after the old leader's machine was powered off or reset, so that no cache
  // of it can write the domain back any more). 0: none. Read now.
  virtual absl::StatusOr<std::int64_t> ReleasedByOperator() = 0;

  virtual HaStats stats() const = 0;
  // stats(), and drains etcd_call_ms (for the metrics exporter).
  virtual HaStats DrainStats() = 0;
  // The candidates registered in etcd (their JSON, the leader's included), read now.
  virtual absl::StatusOr<std::vector<std::string>> Candidates() = 0;
  // Where the domain lives in etcd, for messages: "/cxlkv/v1/C/domains/D".
  virtual std::string where() const = 0;

  // [lmcache] (orchestrator/lmcache/): the coordinator's state in etcd beside the domain's
  // (where()/lmcache/), written only while the term etcd numbered `revision` leads. On a client
  // of its own, made from the same [etcd] options as the session's (no I/O here).
  virtual absl::StatusOr<std::unique_ptr<coordinator::StateStore>> CoordinatorStore(
      std::int64_t revision) = 0;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_HA_H_
