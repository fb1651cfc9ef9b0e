// The election's write gate as a rule on one clock, apart from etcd (docs/ha.md "The fence",
// layer 1): LeaderElection keeps one per session and feeds it its keep-alives; the
// non-coherence simulator (tests/prefix_sim.h) feeds it simulated ones, so the gate that
// guards the simulated owner's stores is this code, not a copy of its rule.
//
// The deadline is a keep-alive's send time + the TTL etcd restarted the lease with − the
// margin, on the candidate's clock: etcd restarted the lease no earlier than the send, so the
// lease cannot expire (and no successor be elected) before the deadline. Once a caller found
// the deadline passed the gate stays closed for the rest of the session (audit-ha #5): the
// stores it drops are a suffix of the term's, what a crash leaves, never a gap.
//
// Thread-safety: Allowed and until may be called from any thread at any time; Start, Renew,
// End and Close from one thread at a time (the election holds its mutex).
#ifndef CXLKV_ORCHESTRATOR_WRITE_DEADLINE_H_
#define CXLKV_ORCHESTRATOR_WRITE_DEADLINE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace cxlkv::orchestrator {

class WriteDeadline {
 public:
  // A new session whose lease of `ttl_ms` was granted no earlier than `sent_ms`: the gate
  // reopens, until sent + ttl − margin.
  void Start(std::int64_t sent_ms, std::int64_t ttl_ms, std::int64_t margin_ms) {
    closed_.store(false, std::memory_order_release);
    until_.store(sent_ms + ttl_ms - margin_ms, std::memory_order_release);
  }
  // A keep-alive sent at `sent_ms` came back at `now_ms` with the lease restarted for
  // `ttl_ms`: the deadline moves on, unless the gate closed or the deadline passed by `now_ms`
  // (false: too late; the session is over, and a closed gate is never reopened).
  bool Renew(std::int64_t sent_ms, std::int64_t ttl_ms, std::int64_t margin_ms,
             std::int64_t now_ms) {
    if (closed_.load(std::memory_order_acquire) || now_ms >= until()) return false;
    until_.store(std::max(until(), sent_ms + ttl_ms - margin_ms), std::memory_order_release);
    return true;
  }
  // The gate at `now_ms`: open before the deadline; once found passed, closed for the session.
  bool Allowed(std::int64_t now_ms) const {
    if (closed_.load(std::memory_order_acquire)) return false;
    if (now_ms < until()) return true;
    closed_.store(true, std::memory_order_release);
    return false;
  }
  // Closed now, for the rest of the session (it ended some other way: its lease was lost).
  void Close() { closed_.store(true, std::memory_order_release); }
  // No session: no deadline.
  void End() { until_.store(0, std::memory_order_release); }

  std::int64_t until() const { return until_.load(std::memory_order_acquire); }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::int64_t> until_{0};
  mutable std::atomic<bool> closed_{false};
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_WRITE_DEADLINE_H_
