// HaSession on etcd (orchestrator/etcd): the leader election and the domain's state key.
//
// Keys, with P = /cxlkv/v1/<etcd.cluster> and D = etcd.domain:
//   P/domains/D/leader             the leader (its `self` JSON), under its session lease
//   P/domains/D/election/<lease>   every candidate, under its session lease
//   P/domains/D/state              the domain's state (DomainState::Serialize), durable
//   P/directory/D                  the domain's directory summary, under the leader's lease
#include <atomic>
#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cxlkv/orchestrator/directory.h"
#include "cxlkv/orchestrator/election.h"
#include "cxlkv/orchestrator/etcd.h"
#include "cxlkv/orchestrator/lmcache/etcd_store.h"
#include "etcd_options.h"
#include "ha.h"
#include "state_write.h"

namespace cxlkv::orchestrator {

namespace {

namespace ed = ::cxlkv::orchestrator::etcd;

class EtcdHa final : public HaSession {
 public:
  EtcdHa(const Config& c, std::string self, std::unique_ptr<ed::Client> client,
         std::unique_ptr<ed::Client> quick, coherence::Clock* clock)
      : quick_(std::move(quick)),
        c_(c),
        clock_(clock),
        self_(std::move(self)),
        where_(absl::StrCat("/cxlkv/v1/", c.etcd.cluster, "/domains/", c.etcd.domain)),
        client_(std::move(client)) {}

  ~EtcdHa() override { Stop(); }

  absl::Status Start(Hooks hooks) override {
    hooks_ = std::move(hooks);
    ed::ElectionOptions o;
    o.leader_key = where_ + "/leader";
    o.candidate_prefix = where_ + "/election/";
    o.value = self_;
    o.ttl_s = c_.etcd.ttl_s;
    o.margin_ms = c_.etcd.margin_ms;
    o.retry_ms = 500;
    o.clock = clock_;
    o.log = [](const std::string& line) {
      std::fprintf(stderr, "cxlkv-orchestrator: %s\n", line.c_str());
    };
    ed::LeaderElection::Callbacks cb;
    cb.elected = [this](const ed::Term& t) {
      lease_.store(t.lease);
      return hooks_.take_over(LeaderTerm{.revision = t.epoch, .cluster_id = t.cluster_id});
    };
    cb.lost = [this](const ed::Term&, const std::string& why) { hooks_.step_down(why); };
    auto e = ed::LeaderElection::Start(*client_, o, std::move(cb));
    if (!e.ok()) return e.status();
    election_ = *std::move(e);
    return absl::OkStatus();
  }

  void Advertise(const std::string& self) override { self_ = self; }

  void Stop() override {
    if (election_) election_->Stop();
  }

  void Resign(const std::string& why) override {
    if (election_) election_->Resign(why);
  }

  void StopCampaigning() override {
    if (election_) election_->StopCampaigning();
  }

  bool WriteAllowed() const override { return election_ != nullptr && election_->WriteAllowed(); }

  std::int64_t write_deadline_ms() const override {
    return election_ == nullptr ? 0 : election_->write_deadline_ms();
  }

  absl::StatusOr<std::int64_t> ReleasedByOperator() override {
    auto r = client_->Get(where_ + "/released");
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat(where_, "/released: cannot read: ", r.status().message()));
    }
    if (r->kvs.empty()) return 0;
    std::int64_t epoch = 0;
    if (!absl::SimpleAtoi(r->kvs[0].value, &epoch) || epoch <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where_, "/released: '", r->kvs[0].value,
          "' is not an epoch (a decimal number > 0, the epoch whose machine was reset)"));
    }
    return epoch;
  }

  absl::StatusOr<std::optional<StoredState>> LoadState() override {
    const absl::Time t0 = absl::Now();
    auto r = client_->Get(StateKey());
    absl::MutexLock l(&mu_);
    Latency(t0);
    if (!r.ok()) return Named(r.status(), "read");
    if (r->kvs.empty()) {
      state_revision_ = 0;
      return std::optional<StoredState>();
    }
    state_revision_ = r->kvs[0].mod_revision;
    return std::optional<StoredState>(StoredState{r->kvs[0].value, r->kvs[0].mod_revision});
  }

  absl::Status SaveState(const std::string& text, std::int64_t revision) override {
    using C = ed::Compare;
    const absl::Time t0 = absl::Now();
    std::int64_t seen = 0;
    {
      absl::MutexLock l(&mu_);
      seen = state_revision_;
    }
    auto r = client_->Txn({C::CreateRevision(where_ + "/leader", C::Result::kEqual, revision),
                           C::ModRevision(StateKey(), C::Result::kEqual, seen)},
                          {ed::Op::Put(StateKey(), text)},
                          {ed::Op::Get(where_ + "/leader"), ed::Op::Get(StateKey())});
    if (!r.ok() && (absl::IsDeadlineExceeded(r.status()) || absl::IsUnavailable(r.status()))) {
      // The outcome is unknown (the request may have landed and only its reply been lost,
      // audit-ha #8): read the state back, so a grant that did land is answered, not leaked.
      auto back = client_->Get(StateKey());
      absl::MutexLock l(&mu_);
      Latency(t0);
      return ResolveUnknownWriteLocked(text, seen, r.status(), back);
    }
    absl::MutexLock l(&mu_);
    Latency(t0);
    if (!r.ok()) {
      ++state_write_failures_;
      return Named(r.status(), "write");
    }
    if (!r->succeeded) {
      ++state_write_failures_;
      const bool leads = !r->results.empty() && !r->results[0].kvs.empty() &&
                         r->results[0].kvs[0].create_revision == revision;
      return absl::AbortedError(absl::StrCat(
          where_, "/state: not written: ",
          leads ? absl::StrCat("it changed since revision ", seen, " (another writer)")
                : absl::StrCat("this orchestrator no longer leads (its term's etcd revision ",
                               revision, ")")));
    }
    state_revision_ = r->header.revision;
    ++state_writes_;
    return absl::OkStatus();
  }

  absl::Status PutDirectory(const std::string& value, std::int64_t revision) override {
    using C = ed::Compare;
    const std::string key = directory::SummaryKey(c_.etcd.cluster, c_.etcd.domain);
    auto r = client_->Txn({C::CreateRevision(where_ + "/leader", C::Result::kEqual, revision)},
                          {ed::Op::Put(key, value, lease_.load())}, {});
    if (!r.ok()) {
      return absl::Status(
          r.status().code(),
          absl::StrCat(key, ": cannot write the directory summary: ", r.status().message()));
    }
    if (!r->succeeded) {
      return absl::AbortedError(absl::StrCat(key,
                                             ": not written: this orchestrator no longer "
                                             "leads (its term's etcd revision ",
                                             revision, ")"));
    }
    return absl::OkStatus();
  }

  HaStats stats() const override { return Stats(false); }
  HaStats DrainStats() override { return Stats(true); }

  absl::StatusOr<std::vector<std::string>> Candidates() override {
    // While the last keep-alive is overdue (they go every TTL/3), the list as last read:
    // Status must not wait for an etcd that is away.
    const std::int64_t last = election_ ? election_->stats().last_contact_unix_ms : 0;
    if (absl::ToUnixMillis(absl::Now()) - last > c_.etcd.ttl_s * 1000 / 3 + 500) {
      absl::MutexLock l(&mu_);
      return candidates_;
    }
    auto r = quick_->Get(where_ + "/election/", ed::PrefixEnd(where_ + "/election/"));
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat(where_,
                                                          "/election/: cannot list the "
                                                          "candidates: ",
                                                          r.status().message()));
    }
    std::vector<std::string> out;
    for (const ed::KeyValue& kv : r->kvs) out.push_back(kv.value);
    absl::MutexLock l(&mu_);
    candidates_ = out;
    return out;
  }

  HaStats Stats(bool drain) const {
    HaStats s;
    if (election_) {
      ed::ElectionStats e = drain ? election_->DrainStats() : election_->stats();
      s.lost_contact = e.lost_contact;
      s.last_contact_unix_ms = e.last_contact_unix_ms;
      s.etcd_call_ms = std::move(e.call_ms);
      s.epoch = e.epoch;
      s.leader = e.leader_value;
      s.leader_epoch = e.leader_epoch;
      s.elections_won = e.won;
      s.step_downs = e.lost;
      s.keepalive_failures = e.keepalive_failures;
    }
    absl::MutexLock l(&mu_);
    s.state_writes = state_writes_;
    s.state_write_failures = state_write_failures_;
    s.etcd_call_ms.insert(s.etcd_call_ms.end(), call_ms_.begin(), call_ms_.end());
    if (drain) call_ms_.clear();
    return s;
  }

  std::string where() const override { return where_; }

  absl::StatusOr<std::unique_ptr<coordinator::StateStore>> CoordinatorStore(
      std::int64_t revision) override {
    coordinator::EtcdPlace place;
    place.client = EtcdClientOptions(c_.etcd);
    place.domain_key = where_;
    return coordinator::EtcdStateStore(place, revision);
  }

 private:
  std::string StateKey() const { return where_ + "/state"; }

  // After a state write of unknown outcome (`lost`), with P/state read back (`back`): it holds
  // `text` at a revision after `seen`: the write landed (OK; the next guard is against it). It is
  // still at `seen`: it did not (the error, retryable). Anything else: someone else wrote it
  // (kAborted: this leader's view is stale). The read failing too: the outcome stays unknown (the
  // error; the next write's guard tells).
  absl::Status ResolveUnknownWriteLocked(const std::string& text, std::int64_t seen,
                                         const absl::Status& lost,
                                         const absl::StatusOr<ed::RangeResult>& back)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!back.ok()) {
      ++state_write_failures_;
      return Named(lost, "write (and read back after it)");
    }
    const std::int64_t now = back->kvs.empty() ? 0 : back->kvs[0].mod_revision;
    const UnknownWrite outcome = ResolveUnknownWrite(
        text, seen, now, back->kvs.empty() ? std::string() : back->kvs[0].value);
    if (outcome == UnknownWrite::kLanded) {
      state_revision_ = now;
      ++state_writes_;
      std::fprintf(stderr,
                   "cxlkv-orchestrator: %s/state: the write's reply was lost (%s); read back: it "
                   "landed at revision %lld\n",
                   where_.c_str(), std::string(lost.message()).c_str(),
                   static_cast<long long>(now));
      return absl::OkStatus();
    }
    ++state_write_failures_;
    if (outcome == UnknownWrite::kDidNotLand) {
      return Named(lost, "write (read back: it did not land)");
    }
    return absl::AbortedError(
        absl::StrCat(where_, "/state: not written: it changed since revision ", seen,
                     " (another writer; read back after a write of unknown outcome)"));
  }
  void Latency(absl::Time t0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (call_ms_.size() < 4096) call_ms_.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  absl::Status Named(const absl::Status& st, const char* what) const {
    return absl::Status(st.code(), absl::StrCat(where_, "/state: cannot ", what,
                                                " the domain's "
                                                "state in etcd: ",
                                                st.message()));
  }

  // For Status's candidate list: short timeouts, so Status answers within a few hundred ms
  // while etcd is away.
  std::unique_ptr<ed::Client> quick_;
  Config c_;
  coherence::Clock* clock_;
  std::string self_;
  std::string where_;
  std::unique_ptr<ed::Client> client_;
  std::unique_ptr<ed::LeaderElection> election_;
  Hooks hooks_;
  std::atomic<std::int64_t> lease_{0};  // the session lease of the current term
  mutable absl::Mutex mu_;
  std::int64_t state_revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t state_writes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t state_write_failures_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::vector<double> call_ms_ ABSL_GUARDED_BY(mu_);  // state reads and writes
  std::vector<std::string> candidates_ ABSL_GUARDED_BY(mu_);  // as last read
};

}  // namespace

absl::StatusOr<std::unique_ptr<HaSession>> HaSession::Create(const Config& c,
                                                             const std::string& self,
                                                             coherence::Clock* clock) {
  ed::ClientOptions o = EtcdClientOptions(c.etcd);
  o.attempt_timeout_ms = std::max<std::uint32_t>(c.etcd.call_timeout_ms / 2, 100);
  auto client = ed::Client::Create(o);
  if (!client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd.endpoints: ", client.status().message()));
  }
  o.call_timeout_ms = std::min<std::uint32_t>(c.etcd.call_timeout_ms, 250);
  o.attempt_timeout_ms = std::max<std::uint32_t>(o.call_timeout_ms / 2, 50);
  auto quick = ed::Client::Create(o);
  if (!quick.ok()) return quick.status();
  return std::unique_ptr<HaSession>(
      new EtcdHa(c, self, *std::move(client), *std::move(quick), clock));
}

}  // namespace cxlkv::orchestrator
