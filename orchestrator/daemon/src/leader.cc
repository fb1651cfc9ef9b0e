// Who owns the domain, the elected leader's side (docs/ha.md): orchestrator HA's takeover with
// its wait for the previous term's release and its epoch, the fence line's checks before each
// batch and each answer, read-only mode, the step-down and the release. The single
// orchestrator's mark is single_owner.cc. Both are the domain core's (domain_core.h), under its
// lock; the lifecycle is daemon.cc's.
#include "leader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/domain_layout.h"
#include "domain_core.h"
#include "fence.h"
#include "ha.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

// ---- orchestrator HA --------------------------------------------------------------------------

absl::Status DomainCore::SaveLocked() {
  if (ha_ == nullptr) return state_.Save();
  if (!leading_) {
    return absl::UnavailableError("this orchestrator stopped leading the domain: retry");
  }
  // A new generation each write, recorded in the fence line once etcd has it: a successor
  // refuses any state older than the domain's record (docs/ha.md "Durable state in etcd").
  state_.set_generation(state_.generation() + 1);
  absl::Status st = ha_->SaveState(state_.Serialize(), revision_);
  if (absl::IsAborted(st)) {
    // Another leader, or another writer of the state: this one's view is stale.
    leading_ = false;
    ha_->Resign(std::string(st.message()));
    return absl::UnavailableError(
        absl::StrCat(st.message(), ": stepping down; retry against the new leader"));
  }
  if (!st.ok()) return st;
  fence_.state_gen = state_.generation();
  EndBatchLocked();
  // The state file is a cache now (etcd holds the state): a failure is logged, never fatal.
  if (auto cache = state_.Save(); !cache.ok() && !cache_failure_logged_) {
    cache_failure_logged_ = true;
    std::fprintf(stderr, "cxlkv-orchestrator: the state file cache: %s (logged once)\n",
                 std::string(cache.message()).c_str());
  }
  return absl::OkStatus();
}

absl::Status DomainCore::ServingLocked() {
  // A single orchestrator that found another owner answers nothing more (StopOwningLocked).
  if (ha_ == nullptr) {
    return stopped_owning_.empty() ? absl::OkStatus() : absl::UnavailableError(stopped_owning_);
  }
  // A leader whose write deadline passed (it was stopped, or etcd went silent) changes
  // nothing more: a successor may be serving from a newer state by now.
  if (leading_ && owner_ != nullptr && ha_->WriteAllowed()) return absl::OkStatus();
  if (ReadOnlyLocked()) {
    return absl::UnavailableError(absl::StrCat(
        "domain '", config_.etcd.domain, "': etcd unreachable since ", ReadOnlySinceLocked(),
        "; the domain is read-only until it is back (heartbeats, lookups and the extents already "
        "lent keep working; no new extents, publications or membership changes, and no prefix "
        "leases once the owner's last heartbeat acknowledgement is host_ttl old)"));
  }
  const HaStats h = ha_->stats();
  return absl::UnavailableError(absl::StrCat(
      "this orchestrator is a standby of domain '", config_.etcd.domain, "'",
      h.leader.empty() ? std::string("; no leader is elected right now: retry shortly")
                       : absl::StrCat("; the leader is ", h.leader),
      takeover_refused_.empty() ? std::string() : absl::StrCat("; ", takeover_refused_)));
}

absl::Status DomainCore::ReadableLocked() {
  if (ha_ == nullptr) return ServingLocked();
  if (leading_ && owner_ != nullptr && ha_->WriteAllowed()) return absl::OkStatus();
  if (ReadOnlyLocked()) return absl::OkStatus();
  return ServingLocked();
}

bool DomainCore::ReadOnlyLocked() {
  if (!read_only_) return false;
  // A successor writes its epoch into the fence line before it serves anything: once it is
  // there (or etcd names another leader), this orchestrator's answers may contradict the
  // successor's, so it answers nothing more.
  const HaStats h = ha_->stats();
  std::string why;
  co::OwnerFenceLine line{};
  if (!h.leader.empty() && h.leader_epoch != revision_) {
    why = absl::StrCat("etcd names another leader (its key's revision ", h.leader_epoch,
                       ", this term's ", revision_, ")");
  } else if (!ReadFenceLine(*domain_mem_, &line)) {
    why = "the domain's fence line does not validate (a successor is writing it)";
  } else if (line.epoch != fence_.epoch || line.cluster_id != fence_.cluster_id) {
    why = absl::StrCat("the domain's fence line names epoch ", line.epoch,
                       ": a successor took the domain over");
  }
  if (why.empty()) return true;
  EndReadOnlyLocked(why);
  return false;
}

void DomainCore::EndReadOnlyLocked(const std::string& why) {
  if (!read_only_) return;
  read_only_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  std::fprintf(stderr, "cxlkv-orchestrator: read-only mode of domain '%s' ended: %s\n",
               config_.etcd.domain.c_str(), why.c_str());
}

std::string DomainCore::ReadOnlySinceLocked() const {
  if (!read_only_) return "";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(read_only_since_unix_ms_),
                          absl::UTCTimeZone());
}

std::string DomainCore::RoleLocked() {
  if (ha_ == nullptr) return "single";
  if (ServingLocked().ok()) return "leader";
  return read_only_ ? "read-only" : "standby";
}

std::int64_t DomainCore::LeaderEpochLocked() const {
  return ha_ == nullptr ? 0 : ha_->stats().leader_epoch;
}

std::string DomainCore::LeaderLocked() const {
  if (ha_ == nullptr) return "";
  return ha_->stats().leader;
}

bool DomainCore::OwnerBatchMayRunLocked() {
  if (ha_ == nullptr) {
    if (!stopped_owning_.empty()) return false;
    // Another owner leaves its line before its first store to the domain (an elected leader
    // its fence line, another single orchestrator its mark): once either is there, the next
    // store of this one could land beside or over that owner's.
    co::OwnerFenceLine f{};
    co::SingleOwnerLine m{};
    std::string why;
    if (!ReadFenceLine(*domain_mem_, &f)) {
      why =
          "the domain's fence line does not validate: an orchestrator elected through etcd is "
          "writing it";
    } else if (f.epoch != 0) {
      why = absl::StrCat("the domain's fence line names epoch ", f.epoch, " (cluster ",
                         absl::Hex(f.cluster_id),
                         "): an orchestrator elected through etcd claimed the domain");
    } else if (!ReadSingleOwnerLine(*domain_mem_, &m)) {
      why = "the domain's single-owner mark does not validate: another orchestrator is writing it";
    } else if (m.state != co::kSingleServing || m.started_ms != mark_.started_ms ||
               m.pid != mark_.pid || std::memcmp(m.host, mark_.host, sizeof(m.host)) != 0) {
      why = absl::StrCat("the domain's single-owner mark now names ", DescribeSingleOwner(m),
                         ", not this one: that orchestrator took the domain over");
    }
    if (why.empty()) return true;
    StopOwningLocked(why);
    return false;
  }
  if (!leading_ || owner_ == nullptr) return false;
  // The write deadline: the election steps down shortly; nothing more from this term.
  if (!ha_->WriteAllowed()) return false;
  co::OwnerFenceLine now{};
  const bool read = ReadFenceLine(*domain_mem_, &now);
  if (read && now.epoch == fence_.epoch && now.cluster_id == fence_.cluster_id) return true;
  ++fence_violations_;
  const std::string why =
      read ? absl::StrCat("the domain's fence line names epoch ", now.epoch, " (cluster ",
                          absl::Hex(now.cluster_id), "), not this leader's ", fence_.epoch,
                          ": another leader took the domain over (if `cxlkvctl status` shows "
                          "none, something else writes domain.prefix_domain: stop it, then "
                          "release that epoch as docs/ha.md says)")
           : std::string("the domain's fence line does not validate (torn or overwritten)");
  std::fprintf(stderr, "cxlkv-orchestrator: %s; stepping down\n", why.c_str());
  leading_ = false;
  ha_->Resign(why);
  return false;
}

void DomainCore::EndBatchLocked() {
  if (ha_ == nullptr) {
    // The mark moves with every batch: a reader on another machine tells a live owner from
    // one that ended without releasing the domain (SingleOwnerAdvances).
    if (!marked_) return;
    ++mark_.seq;
    mark_.at_ms = clock_->NowMs();
    WriteSingleOwnerLine(*domain_mem_, mark_);
    return;
  }
  if (!leading_) return;
  // Read before written: a line that names another term is never overwritten (audit-ha #1:
  // a leader resumed after a stop put its old epoch back over its successor's, and the
  // successor resigned). The successor waits for this term's release before it writes the
  // line, so a foreign line here means an operator released this term by hand.
  co::OwnerFenceLine now{};
  if (!ReadFenceLine(*domain_mem_, &now) || now.epoch != fence_.epoch ||
      now.cluster_id != fence_.cluster_id) {
    (void)OwnerBatchMayRunLocked();  // says why, resigns
    return;
  }
  // Through the fenced view: after the write deadline this store is dropped like the others.
  ++fence_.batches;
  WriteFenceLine(*fenced_mem_, fence_);
}

absl::Status DomainCore::AwaitRelease(const LeaderTerm& t) {
  auto header = co::ReadDomainHeader(*domain_mem_);
  if (!header.ok()) return absl::OkStatus();  // never formatted: no term ever owned it
  // Whatever epoch the line names, even one above etcd's revisions (etcd restored or
  // replaced): that term is waited for like any other, and this one's epoch is derived above
  // it (DomainEpoch).
  co::OwnerFenceLine fence{};
  const bool fence_valid = ReadFenceLine(*domain_mem_, &fence);
  // The domain belongs to the etcd keys its leaders were elected under: a candidate elected
  // under other keys (a wrong etcd.cluster/etcd.domain) would be a second owner beside them.
  if (fence_valid && fence.keys != 0 && fence.keys != KeysHash()) {
    absl::Status wrong = absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain,
        "' belongs to orchestrators elected under other etcd keys (its fence line names keys "
        "hashing to ",
        absl::Hex(fence.keys), ", epoch ", fence.epoch, "), not this one's ", ha_->where(), " (",
        absl::Hex(KeysHash()),
        "): etcd.cluster or etcd.domain is wrong in this orchestrator's config; give it the "
        "same [etcd] section as the domain's other orchestrators and start it again. Nothing "
        "was written; this orchestrator campaigns no more and exits"));
    // A wrong config does not heal: every election would be refused the same way.
    {
      absl::MutexLock l(&mu_);
      fatal_ = wrong;
    }
    ha_->StopCampaigning();
    return wrong;
  }
  co::OwnerReleaseLine at_start{};
  if (!ReadReleaseLine(*domain_mem_, &at_start)) at_start = co::OwnerReleaseLine{};
  const std::int64_t t0 = steady_.NowMs();
  std::int64_t next_log = t0 + 2000, next_operator = t0;
  while (true) {
    co::OwnerReleaseLine r{};
    const bool valid = ReadReleaseLine(*domain_mem_, &r);
    if (TermReleased(fence_valid, fence, valid, r, at_start)) break;
    if (stop_.load()) return absl::AbortedError("stopping");
    if (!ha_->WriteAllowed()) {
      return absl::AbortedError(absl::StrCat("the write deadline passed while waiting for epoch ",
                                             fence.epoch, " to be released"));
    }
    const std::int64_t now = steady_.NowMs();
    if (now >= next_operator) {
      next_operator = now + 500;
      auto op = ha_->ReleasedByOperator();
      if (op.ok() && *op != 0 && fence_valid && static_cast<std::uint64_t>(*op) == fence.epoch) {
        std::fprintf(stderr,
                     "cxlkv-orchestrator: epoch %llu released by an operator (%s/released): "
                     "taking the domain over\n",
                     static_cast<unsigned long long>(fence.epoch), ha_->where().c_str());
        break;
      }
      if (!op.ok() && now >= next_log) {
        std::fprintf(stderr, "cxlkv-orchestrator: %s\n",
                     std::string(op.status().message()).c_str());
      }
    }
    if (now >= next_log) {
      next_log = now + 5000;
      std::fprintf(
          stderr,
          "cxlkv-orchestrator: elected at epoch %lld, waiting %lld ms so far for %s to be released "
          "by its leader or that node's write-back agent (its stores must all be in memory "
          "before this leader's first; docs/ha.md \"Release\"). If that machine was powered "
          "off or reset, say so: etcdctl put %s/released %llu\n",
          static_cast<long long>(t.revision), static_cast<long long>(now - t0),
          fence_valid
              ? absl::StrCat("epoch ", fence.epoch, " (cluster ", absl::Hex(fence.cluster_id), ")")
                    .c_str()
              : "the term of the torn fence line",
          ha_->where().c_str(), static_cast<unsigned long long>(fence.epoch));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::int64_t waited = steady_.NowMs() - t0;
  if (waited >= 100) {
    std::fprintf(stderr, "cxlkv-orchestrator: epoch %llu was released after %lld ms\n",
                 static_cast<unsigned long long>(fence.epoch), static_cast<long long>(waited));
  }
  return absl::OkStatus();
}

void DomainCore::ReleaseLocked() {
  if (claimed_epoch_ == 0 || claimed_epoch_ == released_epoch_) return;
  co::OwnerReleaseLine r{};
  r.epoch = static_cast<std::uint64_t>(claimed_epoch_);
  r.cluster_id = claimed_cluster_;
  r.at_ms = clock_->NowMs();
  r.by = co::kReleasedByLeader;
  r.node = co::Crc32c(config_.etcd.node.data(), config_.etcd.node.size());
  // The unfenced view: the gate is closed by now, and this is the one store a deposed leader
  // must still make.
  ReleaseTerm(*domain_mem_, domain_bytes_, r);
  released_epoch_ = claimed_epoch_;
  if (agent_ != nullptr) agent_->Released(claimed_epoch_);
}

std::string DomainCore::StateOlderThanTheDomain(const std::string& source, const DomainState& state,
                                                const co::OwnerFenceLine& seen) const {
  return absl::StrCat(
      "domain '", config_.etcd.domain, "': the state from ", source, " is generation ",
      state.generation(), ", older than the domain's own record (generation ", seen.state_gen,
      ", saved at epoch ", seen.epoch, " of etcd cluster ", absl::Hex(seen.cluster_id),
      "): etcd was restored from a backup or rebuilt, etcd.cluster/etcd.domain names another "
      "place, or the state file is a stale cache. Taking it over would lend again extents that "
      "hosts hold. Point etcd.cluster/etcd.domain at the domain's keys or put its newest state "
      "back into ",
      ha_->where(),
      "/state; if that state is lost, stop the domain's orchestrators and start "
      "one with --new-domain: it replaces every state older than the record (etcd's, and the "
      "state file ",
      config_.state_file,
      " as a cache) by a new one in which every extent is quarantined for a full capacity "
      "lease");
}

std::uint32_t DomainCore::KeysHash() const {
  const std::string where = ha_->where();
  return std::max<std::uint32_t>(1, co::Crc32c(where.data(), where.size()));
}

absl::StatusOr<std::int64_t> DomainCore::DomainEpoch(const LeaderTerm& t) {
  std::uint64_t floor = 0;  // the highest epoch the domain records
  co::OwnerFenceLine fence{};
  if (ReadFenceLine(*domain_mem_, &fence)) floor = std::max(floor, fence.epoch);
  co::OwnerReleaseLine released{};
  if (ReadReleaseLine(*domain_mem_, &released)) floor = std::max(floor, released.epoch);
  // Room for 2^62 more terms: a line naming more was not written by a leader of this domain.
  constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 62;
  if (floor >= kMaxEpoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the domain's fence or release line names epoch ", floor, " (cluster ",
        absl::Hex(fence.cluster_id),
        "), beyond any term this domain can have had: a foreign writer put it there (another "
        "domain's orchestrator given this prefix_domain, or a corrupted line). Stop whatever "
        "else writes domain.prefix_domain '",
        config_.prefix_domain, "', then restore the domain or re-create it with --new-domain"));
  }
  return std::max<std::int64_t>(t.revision, static_cast<std::int64_t>(floor) + 1);
}

absl::Status DomainCore::Elected(const LeaderTerm& t) {
  absl::Status st = TakeOver(t);
  // What a host calling this standby is told until the next takeover (ServingLocked).
  absl::MutexLock l(&mu_);
  takeover_refused_ = st.ok()
                          ? std::string()
                          : absl::StrCat("it was elected (etcd revision ", t.revision,
                                         ") and refused to take the domain over: ", st.message());
  return st;
}

absl::Status DomainCore::TakeOver(const LeaderTerm& t) {
  const absl::Time elected = absl::Now();
  // 0. Every store of the previous term is in memory and none follows (docs/ha.md "Release"),
  // and no single orchestrator owns the domain (on another machine: this one's region locks
  // keep one off this machine).
  if (auto st = AwaitRelease(t); !st.ok()) return st;
  if (auto st = RefuseASingleOwner(); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  // Elected again (etcd is back): the read-only term's view gives way to etcd's state.
  EndReadOnlyLocked(absl::StrCat("elected again (etcd revision ", t.revision, ")"));
  const std::int64_t now = clock_->NowMs();
  // 1. The domain's state: etcd's, or for the first leader a new one or the state file's.
  auto stored = ha_->LoadState();
  if (!stored.ok()) return stored.status();
  auto header = co::ReadDomainHeader(*domain_mem_);
  if (!header.ok() && !absl::IsNotFound(header.status())) return header.status();
  const bool formatted = header.ok();
  DomainState fresh(config_, pool_->size_bytes());
  bool save_now = true;
  std::string source;
  struct stat sb {};
  co::OwnerFenceLine record{};
  const bool recorded = formatted && ReadFenceLine(*domain_mem_, &record) && record.epoch != 0;
  if (stored->has_value()) {
    if (auto st = fresh.Deserialize((*stored)->text, now); !st.ok()) {
      return absl::DataLossError(absl::StrCat(ha_->where(), "/state: ", st.message()));
    }
    save_now = false;
    source = absl::StrCat("etcd (revision ", (*stored)->revision, ")");
    if (new_domain_ && recorded && fresh.generation() < record.state_gen) {
      // The operator's answer to a state older than the domain: nothing of it is trusted.
      std::fprintf(stderr,
                   "cxlkv-orchestrator: --new-domain: %s/state (generation %llu) is older than "
                   "the domain's record (generation %llu): replaced by a new state, every "
                   "extent quarantined for a full capacity lease\n",
                   ha_->where().c_str(), static_cast<unsigned long long>(fresh.generation()),
                   static_cast<unsigned long long>(record.state_gen));
      fresh = DomainState(config_, pool_->size_bytes());
      fresh.QuarantineAll(now);
      fresh.set_generation(record.state_gen);
      save_now = true;
      source = "a new domain (--new-domain over an older state)";
    }
  } else if (new_domain_) {
    if (formatted) {
      fresh.QuarantineAll(now);
      // Generations go on above the domain's record (the check below then passes).
      if (recorded) fresh.set_generation(record.state_gen);
    }
    source = "a new domain";
  } else if (::stat(config_.state_file.c_str(), &sb) == 0) {
    if (auto st = fresh.Load(now); !st.ok()) return st;
    source = absl::StrCat("the state file ", config_.state_file, " (the first leader in etcd)");
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("domain '", config_.etcd.domain,
                     "' has no state in etcd and no state file here: "
                     "start one orchestrator once with --new-domain"));
  }
  // 2. The term's epoch: above etcd's revision and above every epoch the domain records
  // (the fence line's, and the release line's for a fence line torn by its writer), so an
  // epoch never names two terms, whatever etcd was restored from or replaced by, and hosts
  // that saw the old terms accept this one (docs/ha.md "Election and epoch").
  std::int64_t epoch = t.revision;
  if (formatted) {
    auto derived = DomainEpoch(t);
    if (!derived.ok()) return derived.status();
    epoch = *derived;
  }
  // 3. The fence: this epoch into the domain before anything else of this leader is written
  // there (a domain never formatted is formatted first; that clears the line).
  if (formatted) {
    co::OwnerFenceLine seen{};
    if (!ReadFenceLine(*domain_mem_, &seen)) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: the domain's fence line does not validate (a leader died "
                   "writing it); epoch %lld overwrites it\n",
                   static_cast<long long>(epoch));
    } else if (seen.epoch != 0 && fresh.generation() < seen.state_gen) {
      return absl::FailedPreconditionError(StateOlderThanTheDomain(source, fresh, seen));
    } else if (seen.epoch != 0 && seen.cluster_id != t.cluster_id) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: the domain was last owned under etcd cluster %llx (epoch "
                   "%llu), now %llx: the etcd cluster was replaced or restored; taking the domain "
                   "over at epoch %lld\n",
                   static_cast<unsigned long long>(seen.cluster_id),
                   static_cast<unsigned long long>(seen.epoch),
                   static_cast<unsigned long long>(t.cluster_id), static_cast<long long>(epoch));
    }
  } else if (auto st = FormatPrefixDomain(*fenced_mem_, config_, domain_bytes_); !st.ok()) {
    return st;
  }
  co::OwnerFenceLine line{};
  line.epoch = static_cast<std::uint64_t>(epoch);
  line.cluster_id = t.cluster_id;
  line.state_gen = fresh.generation();
  line.keys = KeysHash();
  line.took_over_ms = now;
  line.node = co::Crc32c(config_.etcd.node.data(), config_.etcd.node.size());
  // From the claim on, this term is released when it ends: by StepDown, or by the agent.
  claimed_epoch_ = epoch;
  claimed_cluster_ = t.cluster_id;
  if (agent_ != nullptr) agent_->Claimed(epoch, t.cluster_id, line.node);
  WriteFenceLine(*fenced_mem_, line);
  co::OwnerFenceLine back{};
  if (!ReadFenceLine(*domain_mem_, &back) || back.epoch != line.epoch) {
    return absl::AbortedError("the fence line did not take: the write deadline passed meanwhile");
  }
  // A single orchestrator that marked the domain since RefuseASingleOwner read it: it reads
  // the fence line after its mark (and every batch), so it refuses or stops owning once it
  // sees this epoch; this term stores nothing more and is released, and a later election
  // finds the mark released. The read follows the fence line's store (ReadFenceLine's
  // invalidate fences fully): of the two, at least one sees the other's line.
  co::SingleOwnerLine mark{};
  if (!ReadSingleOwnerLine(*domain_mem_, &mark) || mark.state == co::kSingleServing) {
    return absl::AbortedError(absl::StrCat(
        DescribeSingleOwner(mark), " marked domain.prefix_domain '", config_.prefix_domain,
        "' as its own while this candidate claimed it: it stops owning once it reads this "
        "epoch in the fence line and marks the domain released; this candidate steps down and "
        "campaigns again"));
  }
  // 3. The prefix owner, on the fenced view of the domain, and the state.
  auto owner = co::PrefixOwner::Open(*fenced_mem_, *clock_);
  if (!owner.ok()) return owner.status();
  for (const NamespaceConfig& n : config_.namespaces) {
    (*owner)->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
  // The domain's publish key, created by the first owner (single or elected) that opens it.
  if (auto st = KeyTheDomainLocked(*fenced_mem_); !st.ok()) return st;
  state_ = std::move(fresh);
  told_owner_.clear();
  owner_ = *std::move(owner);
  fence_ = line;
  epoch_ = epoch;
  revision_ = t.revision;
  leading_ = true;
  if (save_now) {
    if (auto st = SaveLocked(); !st.ok()) {
      leading_ = false;
      owner_.reset();
      return st;
    }
  }
  // --new-domain applies to the first term only: a later etcd restore is refused again.
  new_domain_ = false;
  last_takeover_unix_s_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  last_takeover_s_ = absl::ToDoubleSeconds(absl::Now() - elected);
  std::fprintf(stderr,
               "cxlkv-orchestrator: leader of domain '%s' at epoch %lld (etcd revision %lld): %u "
               "extents held by hosts, state from %s\n",
               config_.etcd.domain.c_str(), static_cast<long long>(epoch),
               static_cast<long long>(t.revision), state_.recovered_extents(), source.c_str());
  return absl::OkStatus();
}

void DomainCore::StepDown(const std::string& why) {
  absl::MutexLock l(&mu_);
  const HaStats h = ha_->stats();
  if (h.lost_contact && leading_ && owner_ != nullptr && !stop_.load()) {
    // etcd stopped answering: read-only until it is back or a successor shows (docs/ha.md).
    // Nothing is written to the domain or to etcd; the state, the owner and the epoch stay.
    leading_ = false;
    read_only_ = true;
    read_only_since_unix_ms_ =
        h.last_contact_unix_ms != 0 ? h.last_contact_unix_ms : absl::ToUnixMillis(absl::Now());
    std::fprintf(stderr,
                 "cxlkv-orchestrator: no longer the leader of domain '%s': %s; etcd unreachable "
                 "since %s: serving read-only (heartbeats and reads) at epoch %lld until etcd is "
                 "back or a successor takes over\n",
                 config_.etcd.domain.c_str(), why.c_str(), ReadOnlySinceLocked().c_str(),
                 static_cast<long long>(epoch_));
    ReleaseLocked();  // a read-only leader stores nothing more to the domain
    return;
  }
  // A takeover that was refused never led: the election says why (once per reason).
  const bool led = leading_ || read_only_ || owner_ != nullptr;
  read_only_ = false;
  leading_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  if (led) {
    std::fprintf(stderr, "cxlkv-orchestrator: no longer the leader of domain '%s': %s\n",
                 config_.etcd.domain.c_str(), why.c_str());
  }
  ReleaseLocked();
}

}  // namespace cxlkv::orchestrator
