// cxlkv/orchestrator/election.h — one leader among several candidates, through etcd, with a
// write fence the leader closes on its own clock (docs/ha.md).
//
// Each candidate holds a session lease (TTL ttl_s) that a keep-alive thread renews every
// ttl/3, registers itself under `candidate_prefix` + its lease id (hex), and campaigns:
//
//   Txn(If CreateRevision(leader_key) == 0, Then Put(leader_key, value, lease), Else Get)
//
// The winner's epoch is the leader key's create revision: etcd's revisions only grow, so a
// later leader always has a higher epoch. The key lives under the winner's lease, so it
// vanishes when the lease expires or is revoked, and a standby (watching the key, and
// re-campaigning every ttl/3 in case its watch hangs on a dead member) wins next.
//
// A leader key deleted by hand (etcdctl del) while its lease lives: the winner of the next
// campaign revokes that lease and waits a TTL before leading, so the old leader's deadline has
// passed first.
//
// The fence: the leader may write shared state only while WriteAllowed(). Every keep-alive
// answered with a live lease moves the write deadline to (its send time + the TTL etcd
// restarted - margin) on this candidate's clock (CLOCK_BOOTTIME by default, which counts
// time suspended and time stopped by SIGSTOP alike). etcd restarted the lease no earlier than
// that send time, so the lease cannot expire — and no successor can be elected — before the
// deadline; the margin covers clock-rate differences and the length of one write batch. A
// keep-alive answered only after the deadline passed does not reopen it: leadership ended
// there (the lease is revoked and the candidate campaigns again for a new epoch).
//
// Thread-safety: every method may be called from any thread. The callbacks run on the
// election thread, one at a time; they must not call Stop().
#ifndef CXLKV_ORCHESTRATOR_ELECTION_H_
#define CXLKV_ORCHESTRATOR_ELECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/orchestrator/etcd.h"
#include "cxlkv/orchestrator/write_deadline.h"

namespace cxlkv::orchestrator::etcd {

struct ElectionOptions {
  std::string leader_key;             // e.g. /cxlkv/v1/C/domains/D/leader
  std::string candidate_prefix;       // e.g. /cxlkv/v1/C/domains/D/election/ ("" : not registered)
  std::string value;                  // who and where this candidate is (written in both keys)
  std::int64_t ttl_s = 3;             // the session lease's TTL
  std::int64_t margin_ms = 0;         // 0: ttl / 4
  std::uint32_t retry_ms = 500;       // pause after an etcd error or a refused takeover
  // Refused takeovers in a row double the pause from retry_ms up to this; a takeover that
  // succeeds starts over at retry_ms.
  std::uint32_t max_retry_ms = 8000;
  coherence::Clock* clock = nullptr;  // null: CLOCK_BOOTTIME; must outlive the election
  // Logs one line (no newline); null: stderr. Called from the election threads.
  std::function<void(const std::string&)> log;
};

// One leadership: what the elected callback is told.
struct Term {
  std::int64_t epoch = 0;        // the leader key's create revision
  std::uint64_t cluster_id = 0;  // the etcd cluster's id (epochs compare within one cluster)
  std::int64_t lease = 0;
};

struct ElectionStats {
  std::uint64_t won = 0;   // elections won
  std::uint64_t lost = 0;  // leaderships ended (any reason but Stop)
  std::uint64_t keepalive_failures = 0;
  std::uint64_t campaigns = 0;    // campaign transactions sent
  std::int64_t epoch = 0;         // current epoch (0: not leading)
  std::string leader_value;       // the leader key's value as last seen ("" : none)
  std::int64_t leader_epoch = 0;  // its create revision
  // Wall time (Unix ms) of the last keep-alive etcd answered with a live lease (0: none yet).
  std::int64_t last_contact_unix_ms = 0;
  // The last leadership ended because etcd stopped answering in time (the write deadline
  // passed, or the lease was found expired): not a resign, a lost leader key, or Stop.
  bool lost_contact = false;
  // Wall-clock latency (ms) of etcd calls made by the election (keep-alives and campaigns),
  // since the last stats() call: what a metrics exporter drains.
  std::vector<double> call_ms;
};

class LeaderElection {
 public:
  struct Callbacks {
    // This candidate won. Run the takeover here (writes are allowed from now on); an error
    // (a refused takeover) resigns and campaigns again after a pause that doubles with each
    // refusal in a row (retry_ms to max_retry_ms). The refusal is logged when its message
    // differs from the previous refusal's, so keep the message the same while the reason is.
    std::function<absl::Status(const Term&)> elected;
    // Leadership ended (lease lost, fence deadline passed, leader key gone, Resign, Stop).
    // WriteAllowed() is already false when this runs.
    std::function<void(const Term&, const std::string& why)> lost;
  };

  // Starts the election threads. `client` must outlive the election.
  static absl::StatusOr<std::unique_ptr<LeaderElection>> Start(Client& client,
                                                               const ElectionOptions& options,
                                                               Callbacks callbacks);
  ~LeaderElection();  // Stop()

  // Steps down if leading (the lease is revoked, so a successor may start at once) and ends
  // the threads. Idempotent.
  void Stop();
  // Campaigns no more: the election thread ends its current term (if any) and its session
  // (the lease is revoked) and exits; the threads are joined by Stop. Unlike Stop, a
  // callback may call it (a candidate that must never lead, found so in its takeover).
  void StopCampaigning();

  // Whether this candidate leads and its write deadline has not passed. Once it answered
  // false for a passed deadline it stays false for the rest of the session (a late keep-alive
  // does not reopen it). Cheap (three atomic loads and a clock read): call it before every
  // write to shared state.
  bool WriteAllowed() const;
  // The write deadline on the election's clock (0: not leading).
  std::int64_t write_deadline_ms() const;
  std::int64_t epoch() const { return epoch_.load(); }  // 0: not leading
  // Steps down now (the fence closes before this returns); the election thread then revokes
  // the lease and campaigns again after retry_ms.
  void Resign(const std::string& why);
  ElectionStats stats() const;
  // stats(), and drains call_ms (the latencies recorded since the last drain).
  ElectionStats DrainStats();
  coherence::Clock& clock() const { return *clock_; }

 private:
  LeaderElection(Client& client, const ElectionOptions& options, Callbacks callbacks);
  void ElectionLoop();
  void KeepAliveLoop();
  // Grants a session lease and registers the candidate. False on an etcd error.
  bool NewSession();
  // Ends the session: revokes its lease (best effort) so its keys vanish now.
  void EndSession();
  // Leads until the fence closes, the lease or key is lost, Resign or Stop. Returns why.
  // *lost_contact: it ended because etcd did not answer in time (deadline, lost session).
  std::string Lead(const Term& term, bool* lost_contact);
  // Waits as a standby until the leader key may be free (deleted, or ttl/3 passed).
  void Follow(std::int64_t seen_revision);
  void Log(const std::string& line) const;
  // Sleeps up to ms unless stopped or woken (a resign, a lost session).
  void Pause(std::int64_t ms);

  Client& client_;
  ElectionOptions o_;
  Callbacks cb_;
  coherence::SteadyClock steady_;
  coherence::Clock* clock_;

  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> epoch_{0};        // leading: the epoch, else 0
  // The session's write deadline and its sticky gate (write_deadline.h): moved by each
  // keep-alive answered in time, closed for the session once found passed.
  WriteDeadline gate_;

  mutable absl::Mutex mu_;
  std::int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  bool session_lost_ ABSL_GUARDED_BY(mu_) = false;  // the keep-alive found the lease gone/late
  std::string resign_why_ ABSL_GUARDED_BY(mu_);     // non-empty: Resign was called
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;  // Stop is joining (or joined) the threads
  ElectionStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread election_thread_, keepalive_thread_;
};

}  // namespace cxlkv::orchestrator::etcd

#endif  // CXLKV_ORCHESTRATOR_ELECTION_H_
