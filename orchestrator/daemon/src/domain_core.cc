// The domain's core (domain_core.h): its operations, each behind the lock and its gate, the
// owner's batch with the capacity quarantine, and the views. Who owns the domain (the mark,
// the takeover, the fence and the release) is leader.cc's.
#include "domain_core.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/orchestrator/lmcache/service.h"
#include "cxlkv/pool/arena.h"
#include "ha.h"
#include "metrics.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

namespace {

const char* EntryStateName(std::uint8_t s) {
  switch (static_cast<co::EntryState>(s)) {
    case co::EntryState::kEmpty:
      return "empty";
    case co::EntryState::kPublished:
      return "published";
    case co::EntryState::kRetired:
      return "retired";
    case co::EntryState::kTombstone:
      return "tombstone";
  }
  return "?";
}

std::string HexOf(const std::uint8_t* b, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) absl::StrAppend(&s, absl::Hex(b[i], absl::kZeroPad2));
  return s;
}
co::PrefixOwner::ArenaId IdOf(const std::string& hex) {
  co::PrefixOwner::ArenaId id{};
  for (std::size_t i = 0; i < id.size() && 2 * i + 1 < hex.size(); ++i) {
    id[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return id;
}
}  // namespace

DomainCore::DomainCore(const DomainParts& p)
    // [lmcache]: the pool's last extents are the coordinator's, never lent to hosts.
    : state_(*p.config, coordinator::HostPoolBytes(p.config->lmcache, p.pool->size_bytes(),
                                                   p.config->extent_bytes)),
      config_(*p.config),
      clock_(p.clock),
      pool_(p.pool),
      domain_mem_(p.domain_mem),
      domain_bytes_(p.domain_bytes),
      ha_(p.ha),
      fenced_mem_(p.fenced_mem),
      agent_(p.agent),
      stop_(*p.stop),
      new_domain_(p.new_domain) {}

absl::Status DomainCore::CreateState(bool formatted, std::int64_t now) {
  absl::MutexLock l(&mu_);
  // A domain whose prefix domain was in use: its extents may hold arenas that index entries
  // name and that hosts of the old run still write.
  if (formatted) state_.QuarantineAll(now);
  // The state file exists from now on, before anything is formatted: a restart without
  // --new-domain reads it.
  return SaveLocked();
}

absl::Status DomainCore::OpenOwner(bool new_domain, std::int64_t now) {
  absl::MutexLock l(&mu_);
  auto owner = co::PrefixOwner::Open(*domain_mem_, *clock_);
  if (!owner.ok()) return owner.status();
  owner_ = *std::move(owner);
  for (const NamespaceConfig& n : config_.namespaces) {
    owner_->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
  if (!new_domain) {
    if (auto st = state_.Load(now); !st.ok()) return st;
  }
  return KeyTheDomainLocked(*domain_mem_);
}

absl::Status DomainCore::KeyTheDomainLocked(co::Mem& mem) {
  if (config_.keys.unkeyed || !config_.keys.publish_secret.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> key = co::ReadDomainKey(mem);
  if ((key.ok() && key->empty()) || absl::IsDataLoss(key.status())) {
    key = co::CreateDomainKey(mem, clock_->NowMs());
    if (key.ok()) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: domain '%s' has a new publish key: chain keys leave it "
                   "keyed (routers that match them need it: cxlkvctl publish-key; "
                   "docs/kv_events.md)\n",
                   config_.name.c_str());
    }
  }
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat("domain.prefix_domain '", config_.prefix_domain,
                                     "': its publish key: ", key.status().message()));
  }
  domain_secret_ = *std::move(key);
  return absl::OkStatus();
}

std::string DomainCore::PublishSecret() {
  if (config_.keys.unkeyed) return "";
  if (!config_.keys.publish_secret.empty()) return config_.keys.publish_secret;
  {
    absl::MutexLock l(&mu_);
    if (!domain_secret_.empty()) return domain_secret_;
  }
  // A standby, or an owner not open yet: what the domain holds now (created once, never
  // changed, so reading it without the lock is as good as with it).
  absl::StatusOr<std::string> key = co::ReadDomainKey(*domain_mem_);
  if (!key.ok() || key->empty()) return "";
  absl::MutexLock l(&mu_);
  domain_secret_ = *key;
  return *key;
}

void DomainCore::FillExtent(std::uint32_t i, std::int64_t now, v1::Extent* e) const {
  const DomainState& s = state_;
  const ExtentInfo& x = s.extents()[i];
  e->set_index(i);
  e->set_offset(s.extent_offset(i));
  e->set_length(s.config().extent_bytes);
  const std::uint32_t holder = x.quarantined ? x.former_host : x.host;
  e->set_host_id(holder == ExtentInfo::kNoHost ? 0 : holder);
  e->set_incarnation(x.incarnation);
  e->set_expires_in_ms(x.free() ? 0 : std::max<std::int64_t>(0, x.expires_ms - now));
  e->set_state(x.state_name());
  e->set_arena(x.arena);
}

absl::Status DomainCore::Join(const v1::JoinRequest& req, v1::JoinReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  auto inc = state_.Join(req.host_id(), req.hostname(), NowMs());
  if (!inc.ok()) return inc.status();
  if (auto st = SaveLocked(); !st.ok()) return st;
  const Config& c = config_;
  rep->set_incarnation(*inc);
  rep->set_epoch(epoch_locked());
  rep->set_heartbeat_period_ms(c.heartbeat_period_ms);
  rep->set_host_ttl_ms(c.host_ttl_ms);
  rep->set_domain_spec(c.prefix_domain);
  rep->set_pool_spec(c.pool);
  rep->set_extent_bytes(c.extent_bytes);
  return absl::OkStatus();
}

absl::Status DomainCore::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ReadableLocked(); !st.ok()) return st;
  rep->set_epoch(epoch_locked());
  const std::int64_t now = NowMs();
  absl::Status st = state_.Heartbeat(req.host_id(), req.incarnation(), req.used_bytes(), now);
  if (absl::IsFailedPrecondition(st)) {
    rep->set_fenced(true);
    return absl::OkStatus();
  }
  if (!st.ok()) return st;
  coherence::PrefixHost::Stats lease;
  lease.leases_refused_late = req.lease().leases_refused_late();
  lease.copies_discarded = req.lease().copies_discarded();
  lease.copies_retried = req.lease().copies_retried();
  lease.leases_retaken = req.lease().leases_retaken();
  lease.pauses_detected = req.lease().pauses_detected();
  lease.rejoins_after_fence = req.lease().rejoins_after_fence();
  state_.NoteLeaseCounters(req.host_id(), lease);
  rep->set_draining(state_.hosts()[req.host_id()].state == HostState::kDraining);
  for (std::uint32_t i = 0; i < state_.extents().size(); ++i) {
    const ExtentInfo& e = state_.extents()[i];
    if (e.host == req.host_id() && e.incarnation == req.incarnation()) {
      FillExtent(i, now, rep->add_extents());
    }
  }
  return absl::OkStatus();
}

absl::Status DomainCore::Leave(const v1::LeaveRequest& req, v1::LeaveReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  if (auto st = state_.Leave(req.host_id(), req.incarnation(), NowMs()); !st.ok()) {
    return st;
  }
  rep->set_epoch(epoch_locked());
  return SaveLocked();
}

absl::Status DomainCore::Grow(const v1::GrowRequest& req, v1::GrowReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  const std::int64_t now = NowMs();
  auto got = state_.Grow(req.host_id(), req.incarnation(), req.extents(), now);
  if (!got.ok()) return got.status();
  // Durable before the host may write into them.
  if (auto st = SaveLocked(); !st.ok()) {
    // Never revealed to the host: straight back to free.
    (void)state_.Shrink(req.host_id(), req.incarnation(), *got, now);
    for (std::uint32_t i : *got) state_.ReleaseQuarantine(i);
    return st;
  }
  for (std::uint32_t i : *got) FillExtent(i, now, rep->add_granted());
  rep->set_epoch(epoch_locked());
  return absl::OkStatus();
}

absl::Status DomainCore::Shrink(const v1::ShrinkRequest& req, v1::ShrinkReply* rep) {
  std::vector<std::uint32_t> ext(req.extents().begin(), req.extents().end());
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  if (auto st = state_.Shrink(req.host_id(), req.incarnation(), ext, NowMs()); !st.ok()) {
    return st;
  }
  rep->set_epoch(epoch_locked());
  return SaveLocked();
}

void DomainCore::Status(const std::vector<std::string>& candidates, std::int64_t started_ms,
                        v1::StatusReply* rep) {
  absl::MutexLock l(&mu_);
  const Config& c = config_;
  rep->set_domain_spec(c.prefix_domain);
  rep->set_pool_spec(c.pool);
  rep->set_pool_bytes(pool_->size_bytes());
  rep->set_extent_bytes(c.extent_bytes);
  rep->set_role(RoleLocked());
  // This one's epoch while it leads (or serves read-only); a standby's: the leader's.
  rep->set_epoch(epoch_locked() != 0 ? epoch_locked() : LeaderEpochLocked());
  rep->set_leader(LeaderLocked());
  rep->set_uptime_ms(NowMs() - started_ms);
  rep->set_read_only_since(ReadOnlySinceLocked());
  for (std::string& n : UnmatchedNamespacesLocked()) rep->add_unmatched_namespaces(std::move(n));
  for (const std::string& cand : candidates) {
    if (cand != rep->leader()) rep->add_standbys(cand);
  }
  // A standby knows the configuration and who leads; the domain's state is the leader's.
  if (!ReadableLocked().ok()) return;
  std::uint32_t free = 0, assigned = 0, quarantined = 0;
  for (const ExtentInfo& e : state_.extents()) {
    (e.free() ? free : e.quarantined ? quarantined : assigned)++;
  }
  rep->set_extents_total(free + assigned + quarantined);
  rep->set_extents_free(free);
  rep->set_extents_assigned(assigned);
  rep->set_extents_quarantined(quarantined);
  std::uint32_t live = 0, fenced = 0;
  for (const HostInfo& h : state_.hosts()) {
    live += h.state == HostState::kLive || h.state == HostState::kDraining;
    fenced += h.state == HostState::kFenced;
  }
  rep->set_hosts_live(live);
  rep->set_hosts_fenced(fenced);
  const auto& st = owner_->stats();
  rep->set_prefixes_published(owner_->published_entries());
  rep->set_prefix_duplicates(st.duplicates);
  rep->set_prefixes_reclaimed(st.reclaimed);
  rep->set_prefixes_evicted(st.evicted);
  rep->set_recovered_at_start(state_.recovered_extents());
}

absl::Status DomainCore::Hosts(v1::HostsReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ReadableLocked(); !st.ok()) return st;
  const std::int64_t now = NowMs();
  for (std::uint32_t i = 0; i < state_.hosts().size(); ++i) {
    const HostInfo& h = state_.hosts()[i];
    if (h.state == HostState::kAbsent) continue;
    v1::Host* x = rep->add_hosts();
    x->set_host_id(i);
    x->set_incarnation(h.incarnation);
    x->set_state(HostStateName(h.state));
    x->set_last_heartbeat_ms_ago(now - h.last_heartbeat_ms);
    x->set_extents(state_.ExtentsOf(i));
    x->set_used_bytes(h.used_bytes);
    x->set_hostname(h.hostname);
    v1::LeaseCounters* lc = x->mutable_lease();
    lc->set_leases_refused_late(h.lease.leases_refused_late);
    lc->set_copies_discarded(h.lease.copies_discarded);
    lc->set_copies_retried(h.lease.copies_retried);
    lc->set_leases_retaken(h.lease.leases_retaken);
    lc->set_pauses_detected(h.lease.pauses_detected);
    lc->set_rejoins_after_fence(h.lease.rejoins_after_fence);
  }
  return absl::OkStatus();
}

absl::Status DomainCore::Extents(v1::ExtentsReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ReadableLocked(); !st.ok()) return st;
  const std::int64_t now = NowMs();
  for (std::uint32_t i = 0; i < state_.extents().size(); ++i) {
    FillExtent(i, now, rep->add_extents());
  }
  return absl::OkStatus();
}

absl::Status DomainCore::Prefixes(const v1::PrefixesRequest& req, v1::PrefixesReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ReadableLocked(); !st.ok()) return st;
  const co::PrefixOwner& owner = *owner_;
  std::uint32_t published = 0, retired = 0;
  for (std::uint32_t i = 0; i < owner.header().index_entries; ++i) {
    const co::EntryState s = owner.entry_state(i);
    if (s != co::EntryState::kPublished && s != co::EntryState::kRetired) continue;
    (s == co::EntryState::kPublished ? published : retired)++;
    if (req.limit() != 0 && static_cast<std::uint32_t>(rep->prefixes_size()) >= req.limit())
      continue;
    const co::IndexEntry e = owner.entry(i);
    v1::Prefix* p = rep->add_prefixes();
    p->set_entry(i);
    p->set_state(EntryStateName(e.state));
    p->set_ns(e.ns);
    p->set_key(co::FormatKey({e.key[0], e.key[1]}));
    p->set_publisher(e.publisher);
    p->set_block_index(e.ref.index);
  }
  rep->set_published(published);
  rep->set_retired(retired);
  return absl::OkStatus();
}

absl::Status DomainCore::Drain(const v1::DrainRequest& req) {
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  if (auto st = state_.Drain(req.host_id()); !st.ok()) return st;
  return SaveLocked();
}

absl::Status DomainCore::Evict(const NamespaceConfig& ns, v1::EvictReply* rep) {
  absl::MutexLock l(&mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  // An owner write outside the owner loop: the same fence check as a batch.
  if (!OwnerBatchMayRunLocked()) {
    return absl::UnavailableError(
        "this orchestrator stopped leading the domain: retry against the leader");
  }
  rep->set_retired(owner_->RetireNamespace(co::MakeNamespace(ns.tenant, ns.model, ns.layout)));
  EndBatchLocked();
  return absl::OkStatus();
}

bool DomainCore::LookAtOwner(
    absl::FunctionRef<void(const co::PrefixOwner& owner, std::int64_t epoch, std::int64_t revision)>
        look) {
  absl::MutexLock l(&mu_);
  if (owner_ == nullptr || !ServingLocked().ok()) return false;
  look(*owner_, epoch_, revision_);
  return true;
}

void DomainCore::OwnerStep(coordinator::Service* lmcache, Metrics* metrics) {
  absl::MutexLock l(&mu_);
  // A standby (or a leader whose fence closed) writes nothing.
  if (owner_ != nullptr && OwnerBatchMayRunLocked()) {
    const auto t0 = std::chrono::steady_clock::now();
    owner_->Step();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::int64_t now = clock_->NowMs();
    // Both run every step (no short-circuit): expiry first, then the quarantine it feeds.
    // The LMCache coordinator's objects in the index (its publishes, retires, releases).
    if (lmcache != nullptr) lmcache->TendIndex(*owner_);
    const bool expired = state_.Expire(now);
    const bool tended = TendQuarantineLocked(now);
    if (expired || tended) {
      if (auto st = SaveLocked(); !st.ok()) {
        std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(st.message()).c_str());
      }
    }
    EndBatchLocked();
    // A [[namespace]] no publication matches while others fill: said once, with the fix.
    if (now - last_namespaces_ >= 1000 && !config_.namespaces.empty()) {
      last_namespaces_ = now;
      for (const std::string& n : UnmatchedNamespacesLocked()) {
        if (!unmatched_logged_.insert(n).second) continue;
        std::fprintf(stderr,
                     "cxlkv-orchestrator: [[namespace]] '%s' has matched none of the blocks "
                     "published since start, while %llu were published under namespaces no "
                     "[[namespace]] names: check its tenant, model and layout against the "
                     "names the hosts' adapters build (cxlkvctl status lists it until a "
                     "block matches)\n",
                     n.c_str(), static_cast<unsigned long long>(owner_->published_under_others()));
      }
    }
    if (metrics) {
      metrics->ObserveStep(secs);
      if (now - last_metrics_ >= 200 && owner_ != nullptr) {
        metrics->Update(state_, *owner_, config_.extent_bytes);
        last_metrics_ = now;
      }
    }
  }
  // HA metrics in every role (a standby's and a read-only leader's count too).
  if (metrics && ha_ != nullptr && clock_->NowMs() - last_ha_metrics_ >= 200) {
    Metrics::HaView v;
    v.leading = leading_;
    v.read_only = read_only_;
    v.epoch = epoch_;
    v.last_takeover_unix_s = last_takeover_unix_s_;
    v.last_takeover_s = last_takeover_s_;
    metrics->UpdateHa(ha_->DrainStats(), v);
    last_ha_metrics_ = clock_->NowMs();
  }
}

std::vector<std::string> DomainCore::UnmatchedNamespacesLocked() const {
  std::vector<std::string> out;
  if (owner_ == nullptr || owner_->published_under_others() == 0) return out;
  for (const NamespaceConfig& n : config_.namespaces) {
    if (owner_->published_under(co::MakeNamespace(n.tenant, n.model, n.layout)) == 0) {
      out.push_back(absl::StrCat(n.tenant, "/", n.model, "/", n.layout));
    }
  }
  return out;
}

std::string DomainCore::ArenaInExtent(std::uint32_t i) const {
  const std::uint64_t off = state_.extent_offset(i);
  const std::byte* base = pool_->addr() + off;
  // Written by another host: drop stale lines of ours before reading.
  co::Invalidate(base, sizeof(pool::ArenaHeader));
  pool::ArenaHeader h{};
  if (!pool::ValidateHeaderBytes(base, config_.extent_bytes, "extent", &h).ok()) return "";
  return HexOf(h.uuid, sizeof(h.uuid));
}

bool DomainCore::TendQuarantineLocked(std::int64_t now) {
  bool changed = false;
  for (std::uint32_t i = 0; i < state_.extents().size(); ++i) {
    const ExtentInfo& e = state_.extents()[i];
    if (!e.quarantined) continue;
    if (!e.arena_checked) {
      // The arena its holder formatted in it (none: nothing of it can be named).
      state_.SetQuarantineArena(i, ArenaInExtent(i));
      changed = true;
    }
    if (!e.arena.empty() && told_owner_.insert(e.arena).second) {
      owner_->RevokeArena(IdOf(e.arena));
    }
    if (now < e.expires_ms) continue;
    if (!e.arena.empty() && owner_->EntriesNaming(IdOf(e.arena)) != 0) continue;
    // A zombie holder may have formatted again before its lease term ended: start over on
    // whatever arena the extent holds now.
    const std::string now_there = ArenaInExtent(i);
    if (!now_there.empty() && now_there != e.arena) {
      state_.SetQuarantineArena(i, now_there);
      changed = true;
      continue;
    }
    state_.ReleaseQuarantine(i);
    ++quarantines_released_;
    changed = true;
  }
  return changed;
}

std::vector<co::PrefixOwner::OwnEntry> DomainCore::OwnIndexEntries() {
  absl::MutexLock l(&mu_);
  return owner_ != nullptr ? owner_->OwnEntries() : std::vector<co::PrefixOwner::OwnEntry>{};
}

Orchestrator::StatusView DomainCore::View() {
  absl::MutexLock l(&mu_);
  Orchestrator::StatusView v;
  v.role = RoleLocked();
  v.epoch = epoch_locked();
  v.leader_epoch = LeaderEpochLocked();
  v.leader = LeaderLocked();
  v.serving = ServingLocked();
  v.extents = state_.extents();
  v.recovered_extents = state_.recovered_extents();
  return v;
}

absl::StatusOr<std::vector<std::string>> DomainCore::CandidatesInEtcd() {
  if (ha_ == nullptr) return std::vector<std::string>();
  return ha_->Candidates();
}

absl::Status DomainCore::fatal() {
  absl::MutexLock l(&mu_);
  return fatal_;
}

}  // namespace cxlkv::orchestrator
