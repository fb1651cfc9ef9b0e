// One owner per domain, the single orchestrator's side (docs/orchestrator.md "One orchestrator
// per domain"): the mark a single orchestrator writes before its first store, its re-reading of
// the fence line and the mark in every batch, the stop when another owner wrote them, and a
// candidate's refusal of a domain a single orchestrator marks. The elected leader's side is
// leader.cc; both are the domain core's (domain_core.h), under its lock.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlkv/coherence/domain_layout.h"
#include "domain_core.h"
#include "fence.h"
#include "leader.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

// docs/orchestrator.md "One orchestrator per domain": on one machine the region locks keep a
// single orchestrator and candidates apart; across machines the domain's own lines do. A
// single orchestrator marks the domain (coherence::SingleOwnerLine) before its first store and
// then reads the fence line; a candidate writes the fence line and then reads the mark. Each
// stops at the other's line.

namespace {
void ThisHost(char (&out)[sizeof(co::SingleOwnerLine::host)]) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::memset(out, 0, sizeof(out));
  std::memcpy(out, host, std::min(sizeof(out), std::strlen(host)));
}
}  // namespace

absl::Status DomainCore::MarkSingleOwner(bool holds_locks) {
  absl::MutexLock l(&mu_);
  co::SingleOwnerLine me{};
  ThisHost(me.host);
  co::SingleOwnerLine prev{};
  const bool valid = ReadSingleOwnerLine(*domain_mem_, &prev);
  // A run on this machine that did not release its mark (kill -9) is gone for sure: this one
  // holds the region locks it held.
  const bool dead_here =
      valid && holds_locks && std::memcmp(prev.host, me.host, sizeof(me.host)) == 0;
  if ((!valid || prev.state == co::kSingleServing) && !dead_here) {
    const std::int64_t wait_ms = SingleOwnerStillAfterMs(prev);
    co::SingleOwnerLine now{};
    if (SingleOwnerAdvances(*domain_mem_, prev, wait_ms, &now)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain.prefix_domain '", config_.prefix_domain, "' is owned by ",
          DescribeSingleOwner(now),
          " (its mark in the domain moved while this one watched it): a domain has one owner. "
          "Nothing was started or changed. Use that one, or stop it first"));
    }
    std::fprintf(stderr,
                 "cxlkv-orchestrator: the domain's single-owner mark %s did not move in %lld ms: "
                 "taken as ended without releasing the domain (killed, or its machine gone); "
                 "this orchestrator owns the domain from now on\n",
                 valid ? absl::StrCat("names ", DescribeSingleOwner(prev), ", which").c_str()
                       : "does not validate and",
                 static_cast<long long>(wait_ms));
  }
  me.started_ms = clock_->NowMs();
  me.at_ms = me.started_ms;
  me.state = co::kSingleServing;
  me.pid = static_cast<std::uint32_t>(::getpid());
  me.period_ms = config_.owner_period_ms;
  mark_ = me;
  WriteSingleOwnerLine(*domain_mem_, mark_);
  // The mark's store before the fence line's load (ReadFenceLine's invalidate fences fully
  // too): a candidate that wrote its fence line before reading this mark, or this one sees
  // the other.
  domain_mem_->FullFence();
  co::OwnerFenceLine f{};
  const bool fence_valid = ReadFenceLine(*domain_mem_, &f);
  if (!fence_valid || f.epoch != 0) {
    // Nothing else of this run was stored: released again at once.
    mark_.state = co::kSingleReleased;
    WriteSingleOwnerLine(*domain_mem_, mark_);
    return absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain,
        "' was claimed by an orchestrator elected through etcd while this one started (its fence "
        "line ",
        fence_valid ? absl::StrCat("names epoch ", f.epoch) : std::string("is being written"),
        "). Nothing was started; this one's mark in the domain is released again. Give this "
        "orchestrator the same [etcd] section (docs/ha.md) instead of running it as the "
        "domain's only one"));
  }
  marked_ = true;
  return absl::OkStatus();
}

void DomainCore::StopOwningLocked(const std::string& why) {
  stopped_owning_ = absl::StrCat(
      "domain '", config_.name,
      "': this single orchestrator (no [etcd]) stopped owning the domain: ", why,
      ". It makes no owner batch, extent grant, heartbeat answer or membership change any more "
      "and exits; hosts keep the extents they hold until their capacity leases end. A domain has "
      "one owner: either one orchestrator without [etcd], or orchestrators elected through etcd "
      "(docs/ha.md), the first of which imports this one's state file ",
      config_.state_file);
  fatal_ = absl::FailedPreconditionError(stopped_owning_);
  std::fprintf(stderr, "cxlkv-orchestrator: %s\n", stopped_owning_.c_str());
  // The mark is released only while it is still this run's: another single orchestrator's
  // is left as it is.
  co::SingleOwnerLine m{};
  if (marked_ && ReadSingleOwnerLine(*domain_mem_, &m) && m.started_ms == mark_.started_ms &&
      m.pid == mark_.pid && std::memcmp(m.host, mark_.host, sizeof(m.host)) == 0) {
    ReleaseSingleLocked();
  }
  marked_ = false;
}

void DomainCore::ReleaseSingle() {
  absl::MutexLock l(&mu_);
  ReleaseSingleLocked();
}

void DomainCore::ReleaseSingleLocked() {
  if (stopped_owning_.empty()) stopped_owning_ = "this orchestrator is stopping";
  if (!marked_) return;
  // Every store of this run reaches memory before the mark says released: a candidate on
  // another machine that then takes the domain over reads what this one wrote, and no late
  // write-back of this machine lands over its stores.
  WriteBackDomain(*domain_mem_, domain_bytes_);
  mark_.state = co::kSingleReleased;
  mark_.at_ms = clock_->NowMs();
  WriteSingleOwnerLine(*domain_mem_, mark_);
  marked_ = false;
}

absl::Status DomainCore::RefuseASingleOwner() {
  if (!co::ReadDomainHeader(*domain_mem_).ok()) return absl::OkStatus();  // never formatted
  co::SingleOwnerLine m{};
  const bool valid = ReadSingleOwnerLine(*domain_mem_, &m);
  if (valid && m.state != co::kSingleServing) return absl::OkStatus();  // never marked, released
  const std::int64_t wait_ms = SingleOwnerStillAfterMs(m);
  co::SingleOwnerLine now{};
  const bool live = SingleOwnerAdvances(*domain_mem_, m, wait_ms, &now);
  const std::string who = valid ? DescribeSingleOwner(m) : "a single cxlkv-orchestrator";
  const std::string host(m.host, strnlen(m.host, sizeof(m.host)));
  if (live) {
    return absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain, "' is owned by ", who,
        ": its mark in the domain moves. A domain has one owner, so this candidate does not "
        "take it over (nothing was written) until that one stopped: it marks the domain "
        "released when it stops (systemctl stop, or kill -TERM ",
        m.pid, " on host '", host,
        "'). To move the domain to etcd, stop it and give the first candidate its state file "
        "(docs/ha.md \"The first leader\"); if it is meant to keep the domain, stop this "
        "candidate"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "domain.prefix_domain '", config_.prefix_domain, "' is marked as owned by ", who,
      valid ? absl::StrCat(", whose mark did not move in ", wait_ms, " ms")
            : std::string(" (the mark does not validate: its writer died writing it)"),
      ": it ended without releasing the domain (killed, stopped, or its machine gone), and "
      "stores of it may still sit in its machine's caches. This candidate does not take the "
      "domain over (nothing was written). Start that orchestrator again on its machine and "
      "stop it (systemctl stop): it writes the domain back and marks it released; then this "
      "candidate takes over (give it that one's state file: docs/ha.md \"The first leader\"). "
      "If that machine is gone for good, start a single orchestrator of this domain once on a "
      "machine that maps it (with its state file, or --new-domain if that is lost too) and "
      "stop it"));
}

}  // namespace cxlkv::orchestrator
