// Leader election on etcd: a session lease kept alive on its own thread, a campaign
// transaction, and the write fence that closes on the candidate's own clock.
#include "cxlkv/orchestrator/election.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cxlkv::orchestrator::etcd {

LeaderElection::LeaderElection(Client& client, const ElectionOptions& options, Callbacks callbacks)
    : client_(client), o_(options), cb_(std::move(callbacks)), clock_(&steady_) {
  if (o_.clock != nullptr) clock_ = o_.clock;
  if (o_.margin_ms <= 0) o_.margin_ms = o_.ttl_s * 1000 / 4;
}

absl::StatusOr<std::unique_ptr<LeaderElection>> LeaderElection::Start(
    Client& client, const ElectionOptions& options, Callbacks callbacks) {
  if (options.leader_key.empty()) {
    return absl::InvalidArgumentError("election: no leader key");
  }
  if (options.ttl_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("election: ttl ", options.ttl_s, " s: must be at least 1 s"));
  }
  if (options.margin_ms >= options.ttl_s * 1000 * 2 / 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "election: margin ", options.margin_ms, " ms leaves no time to write within a ",
        options.ttl_s, " s TTL renewed every TTL/3 (keep it below 2/3 of the TTL)"));
  }
  if (!callbacks.elected || !callbacks.lost) {
    return absl::InvalidArgumentError("election: both callbacks are required");
  }
  std::unique_ptr<LeaderElection> e(new LeaderElection(client, options, std::move(callbacks)));
  e->keepalive_thread_ = std::thread([p = e.get()] { p->KeepAliveLoop(); });
  e->election_thread_ = std::thread([p = e.get()] { p->ElectionLoop(); });
  return e;
}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_.store(true);
    wake_ = true;
    // (StopCampaigning may have set stop_: the threads are still to be joined here.)
    if (joined_) return;
    joined_ = true;
  }
  if (election_thread_.joinable()) election_thread_.join();
  if (keepalive_thread_.joinable()) keepalive_thread_.join();
}

void LeaderElection::StopCampaigning() {
  absl::MutexLock l(&mu_);
  stop_.store(true);
  wake_ = true;
}

bool LeaderElection::WriteAllowed() const {
  if (epoch_.load(std::memory_order_acquire) == 0) return false;
  // Sticky within a session (audit-ha #5): once a caller found the deadline passed, a
  // keep-alive answered after that cannot reopen the gate, so the stores dropped here are a
  // suffix of the term's stores (what a crash leaves), never a gap in the middle.
  return gate_.Allowed(clock_->NowMs());
}

std::int64_t LeaderElection::write_deadline_ms() const {
  return epoch_.load() == 0 ? 0 : gate_.until();
}

void LeaderElection::Resign(const std::string& why) {
  absl::MutexLock l(&mu_);
  if (epoch_.load() == 0) return;
  // The fence closes here, before the election thread notices.
  epoch_.store(0, std::memory_order_release);
  resign_why_ = why.empty() ? std::string("resigned") : why;
  wake_ = true;
}

ElectionStats LeaderElection::stats() const {
  absl::MutexLock l(&mu_);
  ElectionStats s = stats_;
  s.epoch = epoch_.load();
  s.call_ms.clear();
  return s;
}

ElectionStats LeaderElection::DrainStats() {
  absl::MutexLock l(&mu_);
  ElectionStats s = stats_;
  s.epoch = epoch_.load();
  stats_.call_ms.clear();
  return s;
}

namespace {
std::int64_t WallMs() { return absl::ToUnixMillis(absl::Now()); }
// Latencies kept between drains: a bound, so an exporter that never drains costs nothing.
constexpr std::size_t kMaxLatencies = 4096;
}  // namespace

void LeaderElection::Log(const std::string& line) const {
  if (o_.log) {
    o_.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void LeaderElection::Pause(std::int64_t ms) {
  absl::MutexLock l(&mu_);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_.load() || wake_; };
  mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(std::max<std::int64_t>(ms, 0)));
  wake_ = false;
}

// ---- the session ------------------------------------------------------------------------------

bool LeaderElection::NewSession() {
  const std::int64_t sent = clock_->NowMs();
  auto g = client_.GrantLease(o_.ttl_s);
  if (!g.ok()) {
    Log(absl::StrCat("etcd: cannot grant a session lease: ", g.status().message()));
    return false;
  }
  {
    absl::MutexLock l(&mu_);
    lease_ = g->id;
    session_lost_ = false;
    // A new session, a new gate: etcd started the lease no earlier than `sent`.
    gate_.Start(sent, g->ttl_s * 1000, o_.margin_ms);
  }
  if (!o_.candidate_prefix.empty()) {
    auto put = client_.Put(absl::StrCat(o_.candidate_prefix, absl::Hex(g->id)), o_.value, g->id);
    if (!put.ok())
      Log(absl::StrCat("etcd: cannot register as a candidate: ", put.status().message()));
  }
  return true;
}

void LeaderElection::EndSession() {
  std::int64_t lease = 0;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    lease_ = 0;
    session_lost_ = false;
    gate_.End();
  }
  if (lease == 0) return;
  // Its keys (the leader key, if it held it, and the candidate key) vanish now instead of at
  // the TTL: a successor need not wait. Best effort: if etcd is unreachable the lease expires.
  if (auto st = client_.RevokeLease(lease); !st.ok()) {
    Log(absl::StrCat("etcd: cannot revoke session lease ", absl::Hex(lease),
                     " (it expires by itself): ", st.message()));
  }
}

void LeaderElection::KeepAliveLoop() {
  const std::int64_t period_ms = std::max<std::int64_t>(o_.ttl_s * 1000 / 3, 100);
  while (!stop_.load()) {
    std::int64_t lease = 0;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_.load() || (lease_ != 0 && !session_lost_);
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(period_ms));
      if (stop_.load()) return;
      if (lease_ == 0 || session_lost_) continue;
      lease = lease_;
    }
    const std::int64_t sent = clock_->NowMs();
    const absl::Time wall_sent = absl::Now();
    auto ttl = client_.KeepAliveOnce(lease, static_cast<std::uint32_t>(period_ms));
    const std::int64_t now = clock_->NowMs();
    std::int64_t next = now + 200;  // after a failure: soon again
    {
      absl::MutexLock l(&mu_);
      if (stats_.call_ms.size() < kMaxLatencies) {
        stats_.call_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - wall_sent));
      }
      if (lease_ != lease) continue;  // the session changed meanwhile
      if (ttl.ok()) {
        stats_.last_contact_unix_ms = WallMs();
        // Extended only while the gate never closed and the deadline has not passed now
        // (not only when the answer arrived: the lock may have been waited for).
        // etcd restarted the lease after `sent`.
        if (gate_.Renew(sent, *ttl * 1000, o_.margin_ms, clock_->NowMs())) {
          next = sent + period_ms;
        } else {
          // Too late: the fence closed already, and leadership with it. Safe to reopen (the
          // lease was alive when etcd renewed it), but a closed fence stays closed: the
          // candidate starts a new session and term instead.
          session_lost_ = true;
          wake_ = true;
        }
      } else {
        ++stats_.keepalive_failures;
        if (absl::IsNotFound(ttl.status()) || now >= gate_.until()) {
          session_lost_ = true;
          wake_ = true;
        }
      }
    }
    // Until the next round (or a change of session, or Stop).
    absl::MutexLock l(&mu_);
    auto changed = [this, lease]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_.load() || lease_ != lease;
    };
    mu_.AwaitWithTimeout(absl::Condition(&changed),
                         absl::Milliseconds(std::max<std::int64_t>(next - clock_->NowMs(), 0)));
  }
}

// ---- campaigning and leading ------------------------------------------------------------------

void LeaderElection::ElectionLoop() {
  std::string last_error;
  // Refused takeovers in a row, and the last one's reason: the pause doubles, the reason is
  // logged when it changes (a candidate refused for minutes logs it once, not every second).
  int refused = 0;
  std::string last_refusal;
  std::int64_t last_leader_lease = 0;  // the lease of the leader this candidate last followed
  auto note_error = [&](const std::string& e) {
    if (e != last_error) Log(e);  // each distinct error once, not once per retry
    last_error = e;
  };
  while (!stop_.load()) {
    bool have = false, lost = false;
    std::int64_t lease = 0;
    {
      absl::MutexLock l(&mu_);
      have = lease_ != 0;
      lost = session_lost_;
      lease = lease_;
    }
    if (lost) {
      EndSession();
      continue;
    }
    if (!have) {
      if (!NewSession()) Pause(o_.retry_ms);
      continue;
    }
    const absl::Time campaign_sent = absl::Now();
    auto r = client_.Txn({Compare::CreateRevision(o_.leader_key, Compare::Result::kEqual, 0)},
                         {Op::Put(o_.leader_key, o_.value, lease)}, {Op::Get(o_.leader_key)});
    {
      absl::MutexLock l(&mu_);
      ++stats_.campaigns;
      if (stats_.call_ms.size() < kMaxLatencies) {
        stats_.call_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - campaign_sent));
      }
    }
    if (!r.ok()) {
      note_error(absl::StrCat("etcd: campaign for ", o_.leader_key, ": ", r.status().message()));
      // A lease etcd no longer knows (it expired while this process was stopped): start over.
      if (absl::IsNotFound(r.status())) EndSession();
      Pause(o_.retry_ms);
      continue;
    }
    last_error.clear();
    Term term{0, r->header.cluster_id, lease};
    if (r->succeeded) {
      term.epoch = r->header.revision;
    } else if (!r->results.empty() && !r->results[0].kvs.empty()) {
      const KeyValue& kv = r->results[0].kvs[0];
      if (kv.lease == lease) {
        term.epoch = kv.create_revision;  // an earlier campaign of ours won; its reply was lost
      } else {
        {
          absl::MutexLock l(&mu_);
          stats_.leader_value = kv.value;
          stats_.leader_epoch = kv.create_revision;
        }
        last_leader_lease = kv.lease;
        Follow(r->header.revision);
        continue;
      }
    } else {
      continue;  // deleted between the compare and the read: campaign again
    }
    // Won. If the previous leader's lease still lives, its key was deleted by hand (an
    // expired or revoked lease takes its key along): that leader may still be writing until
    // its own deadline, which is at most a TTL after its last keep-alive. End its lease (its
    // next keep-alive fails) and wait that TTL out before leading.
    if (last_leader_lease != 0 && last_leader_lease != lease &&
        client_.LeaseTimeToLive(last_leader_lease).ok()) {
      Log(absl::StrCat("etcd: the previous leader's lease ", absl::Hex(last_leader_lease),
                       " is still alive (its key was deleted by hand): revoking it and waiting ",
                       o_.ttl_s, " s before leading"));
      (void)client_.RevokeLease(last_leader_lease);
      const std::int64_t until = clock_->NowMs() + o_.ttl_s * 1000;
      while (!stop_.load() && clock_->NowMs() < until) Pause(until - clock_->NowMs());
      last_leader_lease = 0;
      // Still ours? (The key is under this session's lease; re-check it and the session.)
      auto g = client_.Get(o_.leader_key);
      if (stop_.load() || !g.ok() || g->kvs.empty() || g->kvs[0].create_revision != term.epoch) {
        continue;
      }
    }
    last_leader_lease = 0;
    // A session whose fence already closed cannot lead: start a new one.
    if (gate_.closed() || clock_->NowMs() >= gate_.until()) {
      EndSession();
      continue;
    }
    {
      absl::MutexLock l(&mu_);
      ++stats_.won;
      stats_.lost_contact = false;
      stats_.leader_value = o_.value;
      stats_.leader_epoch = term.epoch;
      resign_why_.clear();
      epoch_.store(term.epoch, std::memory_order_release);
    }
    const std::string elected =
        absl::StrCat("etcd: elected leader of ", o_.leader_key, " at epoch ", term.epoch,
                     " (cluster ", absl::Hex(term.cluster_id), ")");
    if (refused == 0) Log(elected);  // while refused, said with the outcome
    const absl::Status took = cb_.elected(term);
    if (took.ok() && refused > 0) {
      Log(absl::StrCat(elected, ", after ", refused, " refused takeovers"));
      refused = 0;
      last_refusal.clear();
    }
    bool contact = false;
    const std::string why =
        took.ok() ? Lead(term, &contact) : absl::StrCat("takeover failed: ", took.message());
    epoch_.store(0, std::memory_order_release);  // the fence closes before anything else
    {
      absl::MutexLock l(&mu_);
      stats_.lost_contact = contact && !stop_.load();
      if (!stop_.load()) ++stats_.lost;
      stats_.leader_value.clear();
      stats_.leader_epoch = 0;
    }
    cb_.lost(term, why);
    std::int64_t pause = o_.retry_ms;
    if (took.ok()) {
      Log(absl::StrCat("etcd: stepped down from epoch ", term.epoch, ": ", why));
    } else {
      const std::int64_t cap = std::max<std::int64_t>(o_.max_retry_ms, o_.retry_ms);
      pause = std::min<std::int64_t>(std::int64_t{o_.retry_ms} << std::min(refused, 20), cap);
      ++refused;
      const std::string reason(took.message());
      if (reason != last_refusal) {
        Log(absl::StrCat("etcd: elected at epoch ", term.epoch, " (cluster ",
                         absl::Hex(term.cluster_id), "), but the takeover was refused: ", reason,
                         ". Campaigning again in ", pause, " ms, the pause doubling up to ", cap,
                         " ms while refused; this is logged again only if the reason changes"));
      }
      last_refusal = reason;
    }
    EndSession();  // revoked: a successor may campaign now
    if (!stop_.load()) Pause(pause);
  }
  EndSession();
}

std::string LeaderElection::Lead(const Term& term, bool* lost_contact) {
  const std::int64_t check_ms = std::max<std::int64_t>(o_.ttl_s * 1000 / 3, 100);
  std::int64_t next_check = clock_->NowMs() + check_ms;
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stop_.load()) return "stopping";
      if (!resign_why_.empty()) return resign_why_;
      if (session_lost_) {
        *lost_contact = true;
        return "the session lease was lost (expired at etcd, or a keep-alive came back too late)";
      }
    }
    const std::int64_t now = clock_->NowMs();
    if (now >= gate_.until() || gate_.closed()) {
      *lost_contact = true;
      return absl::StrCat("no keep-alive answered within the TTL less the margin (",
                          o_.ttl_s * 1000 - o_.margin_ms, " ms): fenced on this host's clock");
    }
    if (now >= next_check) {
      // The key may be deleted by hand (etcdctl del) while the lease lives on.
      auto g = client_.Get(o_.leader_key);
      if (g.ok() && (g->kvs.empty() || g->kvs[0].create_revision != term.epoch)) {
        return "the leader key was deleted or replaced";
      }
      next_check = now + check_ms;
    }
    Pause(std::min<std::int64_t>(50, gate_.until() - now));
  }
}

void LeaderElection::Follow(std::int64_t seen_revision) {
  const std::int64_t wait_ms = std::max<std::int64_t>(o_.ttl_s * 1000 / 3, 100);
  const std::int64_t until = clock_->NowMs() + wait_ms;
  auto w = client_.NewWatch(o_.leader_key, "", seen_revision + 1);
  while (!stop_.load()) {
    const std::int64_t left = until - clock_->NowMs();
    if (left <= 0) return;
    {
      absl::MutexLock l(&mu_);
      if (session_lost_) return;
    }
    if (!w.ok()) {
      Pause(std::min<std::int64_t>(left, 100));  // no watch: poll by campaigning every ttl/3
      continue;
    }
    auto ev = (*w)->Next(std::chrono::milliseconds(std::min<std::int64_t>(left, 100)));
    if (!ev.ok()) {
      w = ev.status();
      continue;
    }
    for (const Event& e : *ev) {
      if (e.type == Event::Type::kDelete) return;  // the leader key is free: campaign now
    }
  }
}

}  // namespace cxlkv::orchestrator::etcd
