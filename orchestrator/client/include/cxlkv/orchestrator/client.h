// cxlkv/orchestrator/client.h — the host side of the orchestrator's control plane: join,
// a heartbeat thread, capacity growth, and automatic rejoin after fencing.
//
// Capacity leases follow the prefix protocol's rule, per extent: the host may use an extent
// only until (send time of the last acknowledged request that renewed or granted it) + ¾ of
// the lease the reply states, on its own boot clock (CLOCK_BOOTTIME, which keeps counting
// through a suspend). A Grow reply renews only the extents it grants, as the orchestrator
// does. ExtentValid(i) says whether that still holds for extent i, ExtentsValid() for all.
// After fencing, extents are gone (the client rejoins with a new incarnation and an empty
// extent list).
//
// Pauses the boot clock does not see: a VM stop holds CLOCK_BOOTTIME too (kvmclock). The
// client compares its clocks with their readings when its last acknowledged request was
// sent; if the wall clock moved away from the boot clock (stepped on resume), or the boot
// clock away from the monotonic one (a suspend), by more than the margin (¼ lease), no
// extent is valid until a request sent after the pause is acknowledged. A VM stop whose
// wall clock nothing corrects is caught only by that next reply (fenced), so a zero-copy
// user should re-validate after use.
//
// Replies and concurrent calls: a heartbeat reply replaces nothing wholesale. It renews the
// extents it lists; it drops a held extent it does not list only if the extent was granted
// before the heartbeat was sent (a reply computed before a concurrent Grow must not drop
// that Grow's extent), and it never adds one (a Shrink that completed meanwhile stays done).
//
// Thread-safety: every method may be called from any thread.
#ifndef CXLKV_ORCHESTRATOR_CLIENT_H_
#define CXLKV_ORCHESTRATOR_CLIENT_H_

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
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::orchestrator {

struct GrantedExtent {
  std::uint32_t index = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// An extent as the orchestrator lists it (Extents RPC).
struct ExtentView {
  std::uint32_t index = 0;
  std::uint64_t offset = 0, length = 0;
  std::uint32_t host = 0;
  std::string state;  // free | assigned | quarantined
};

// One reading of the host's clocks (milliseconds). `mono_ms` is CLOCK_MONOTONIC, `boot_ms`
// CLOCK_BOOTTIME (counts a suspend), `real_ms` CLOCK_REALTIME (wall time, stepped by NTP).
struct HostClockReading {
  std::int64_t mono_ms = 0, boot_ms = 0, real_ms = 0;
};

struct HostClientOptions {
  // The host's clocks, read together: a seam for tests (a clock that freezes, a suspend).
  // Empty: clock_gettime of the three clocks.
  std::function<HostClockReading()> clock;
  // Test hook: runs on the heartbeat's thread after its reply arrived and before the reply is
  // applied, so a test can order a concurrent call (a Grow) in between without sleeping.
  std::function<void()> before_heartbeat_applied;
  // How long Connect keeps trying to join when the orchestrator does not answer in time (each
  // try has 2 s): a busy or stopped orchestrator machine, or an etcd write that takes seconds,
  // must not fail an engine's start. A refusal, or nothing listening, ends it at once.
  int join_budget_ms = 10000;
};

struct HostCounters {
  std::uint64_t used_bytes = 0;
  std::uint64_t prefix_hits = 0, prefix_misses = 0;  // since the last heartbeat
  // The host's PrefixHost::stats() (since its process joined): leases refused late, copies
  // discarded or retried, pauses, fences — shown per host by `cxlkvctl hosts` and the metrics.
  coherence::PrefixHost::Stats lease{};
};

class HostClient {
 public:
  // Connects to the orchestrator at `socket` (a path, unix:PATH or tcp:HOST:PORT; see
  // endpoint.h) and joins as host_id. Several endpoints separated by commas are the
  // orchestrators of an HA domain (docs/ha.md), one of which leads: every call goes to the one
  // that answered last and moves on to the next when it is down or a standby, so after a
  // failover the heartbeats reach the new leader with the same incarnation and the host keeps
  // its extents (their deadlines still count from the last acknowledged request).
  //
  // etcd://HOST:PORT[,HOST:PORT...]/DOMAIN (or .../CLUSTER/DOMAIN; cluster "default") finds
  // the leader in etcd instead (the domain's [etcd] endpoints and names): the leader key names
  // its Unix socket (used when it runs on this host) and its TCP endpoint. When the leader stops
  // answering, the client reads the key again and follows the new leader.
  static absl::StatusOr<std::unique_ptr<HostClient>> Connect(const std::string& socket,
                                                             std::uint32_t host_id,
                                                             HostClientOptions options = {});
  ~HostClient();  // stops heartbeats and leaves

  // Starts the heartbeat thread (period from the orchestrator). `counters`, if set, is
  // called for each heartbeat's report.
  void StartHeartbeats(std::function<HostCounters()> counters = {});
  absl::Status HeartbeatOnce();

  absl::StatusOr<std::vector<GrantedExtent>> Grow(std::uint32_t extents);
  absl::Status Shrink(const std::vector<std::uint32_t>& extents);
  absl::Status Leave();
  // Every extent of the pool and its state.
  absl::StatusOr<std::vector<ExtentView>> ListExtents();
  bool Holds(std::uint32_t extent) const;

  std::uint32_t host_id() const { return host_; }
  std::uint64_t incarnation() const;
  std::vector<GrantedExtent> extents() const;
  // Whether this host may still use extent i (held, its own deadline not passed, no pause
  // seen since the last acknowledgement). Cost: one clock reading and a scan of the held
  // extents under the client's mutex.
  bool ExtentValid(std::uint32_t extent) const;
  // Whether every held extent is valid; false when none is held.
  bool ExtentsValid() const;
  bool draining() const { return draining_.load(); }
  std::uint64_t rejoins() const { return rejoins_.load(); }
  // Extents the orchestrator listed for this incarnation that this client never learned of
  // (a Grow whose reply was lost, e.g. a state write that timed out but landed: audit-ha #8)
  // and gave back with a Shrink, since Connect.
  std::uint64_t unknown_extents_returned() const { return unknown_returned_.load(); }
  // The highest leader epoch a reply has carried (orchestrator HA, docs/ha.md; 0 without
  // [etcd]). A reply from an older epoch is refused: the call fails naming both epochs, and
  // with several endpoints it moves on to the next.
  std::int64_t leader_epoch() const;
  // With etcd://: how many leaders the client found in etcd and switched to (1 after Connect).
  std::uint64_t leaders_found() const;
  const std::string& domain_spec() const { return domain_spec_; }
  const std::string& pool_spec() const { return pool_spec_; }
  std::uint64_t extent_bytes() const { return extent_bytes_; }

 private:
  struct Rpc;
  class ChangeInFlight;
  HostClient(std::unique_ptr<Rpc> rpc, std::uint32_t host, HostClientOptions options);
  // An extent held, with its own deadline.
  struct Held {
    GrantedExtent extent;
    std::int64_t valid_until_ms = 0;  // boot clock
    std::uint64_t grant = 0;          // grants_ when it was granted
  };
  absl::Status Join();
  HostClockReading ReadClocks() const;
  // Records the send-time readings of an acknowledged request (the newest one counts).
  void AcknowledgedLocked(const HostClockReading& sent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pause since the last acknowledged request was sent (see the header comment).
  bool PausedLocked(const HostClockReading& now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ValidLocked(const Held& h, const HostClockReading& now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Rpc> rpc_;
  std::uint32_t host_;
  HostClientOptions options_;
  std::string domain_spec_, pool_spec_;
  std::uint64_t extent_bytes_ = 0;
  std::uint32_t period_ms_ = 250, host_ttl_ms_ = 2000;
  mutable absl::Mutex mu_;
  std::uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  std::uint64_t grants_ ABSL_GUARDED_BY(mu_) = 0;    // Grow replies applied, this incarnation
  // Grow and Shrink calls started, and those not finished: a heartbeat reply may list an
  // extent this client does not hold only while one is under way.
  std::uint64_t changes_started_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint32_t changes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<std::uint64_t> unknown_returned_{0};
  HostClockReading acked_ ABSL_GUARDED_BY(mu_);      // send readings of the last acknowledged
  std::int64_t margin_ms_ ABSL_GUARDED_BY(mu_) = 0;  // ¼ of the lease the replies state
  std::atomic<bool> draining_{false};
  std::atomic<std::uint64_t> rejoins_{0};
  std::atomic<bool> stop_{false};
  std::function<HostCounters()> counters_;
  std::thread thread_;
  bool left_ = false;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_CLIENT_H_
