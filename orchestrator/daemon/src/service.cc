// The daemon's gRPC service (service.h).
#include "service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/token.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;

namespace {

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

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

class Service final : public pb::Orchestrator::Service {
 public:
  explicit Service(Orchestrator& o) : o_(o) {}

  // Every call: a TCP peer must carry the token; a Unix-socket peer was let in by the
  // accept loop, which checked its uid before gRPC saw the connection.
  grpc::Status Check(grpc::ServerContext* ctx) {
    // Whatever the answer, the caller learns it came from an orchestrator (token.h).
    ctx->AddTrailingMetadata(kAnsweredByOrchestrator, "1");
    const std::string peer = ctx->peer();
    if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
      // A TCP peer (rpc.tcp): the token decides.
      const auto& md = ctx->client_metadata();
      const auto it = md.find("authorization");
      if (it == md.end() || !TokenMatches(absl::string_view(it->second.data(), it->second.size()),
                                          o_.config().token)) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                            absl::StrCat("peer ", peer,
                                         ": missing or wrong token (the client "
                                         "reads it from CXLKV_RPC_TOKEN_FILE; the daemon from "
                                         "rpc.token_file)"));
      }
      return grpc::Status::OK;
    }
    // Channels made from an accepted descriptor are named "fd:N"; the server listens on
    // nothing else, so anything else is a transport this check does not know.
    if (!absl::StartsWith(peer, "fd:")) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("peer ", peer, ": not a connection this daemon accepted"));
    }
    return grpc::Status::OK;
  }

  void FillExtent(const DomainState& s, std::uint32_t i, std::int64_t now, pb::Extent* e) {
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

  grpc::Status Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                    pb::JoinReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    auto inc = o_.state_.Join(req->host_id(), req->hostname(), o_.NowMs());
    if (!inc.ok()) return ToGrpc(inc.status());
    if (auto st = o_.SaveLocked(); !st.ok()) return ToGrpc(st);
    const Config& c = o_.config();
    rep->set_incarnation(*inc);
    rep->set_epoch(o_.epoch_locked());
    rep->set_heartbeat_period_ms(c.heartbeat_period_ms);
    rep->set_host_ttl_ms(c.host_ttl_ms);
    rep->set_domain_spec(c.prefix_domain);
    rep->set_pool_spec(c.pool);
    rep->set_extent_bytes(c.extent_bytes);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    o_.CountPrefixTraffic(req->prefix_hits(), req->prefix_misses());
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ReadableLocked(); !st.ok()) return ToGrpc(st);
    rep->set_epoch(o_.epoch_locked());
    const std::int64_t now = o_.NowMs();
    const absl::Status st =
        o_.state_.Heartbeat(req->host_id(), req->incarnation(), req->used_bytes(), now);
    if (absl::IsFailedPrecondition(st)) {
      rep->set_fenced(true);
      return grpc::Status::OK;
    }
    if (!st.ok()) return ToGrpc(st);
    coherence::PrefixHost::Stats lease;
    lease.leases_refused_late = req->lease().leases_refused_late();
    lease.copies_discarded = req->lease().copies_discarded();
    lease.copies_retried = req->lease().copies_retried();
    lease.leases_retaken = req->lease().leases_retaken();
    lease.pauses_detected = req->lease().pauses_detected();
    lease.rejoins_after_fence = req->lease().rejoins_after_fence();
    o_.state_.NoteLeaseCounters(req->host_id(), lease);
    rep->set_draining(o_.state_.hosts()[req->host_id()].state == HostState::kDraining);
    for (std::uint32_t i = 0; i < o_.state_.extents().size(); ++i) {
      const ExtentInfo& e = o_.state_.extents()[i];
      if (e.host == req->host_id() && e.incarnation == req->incarnation()) {
        FillExtent(o_.state_, i, now, rep->add_extents());
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const pb::LeaveRequest* req,
                     pb::LeaveReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    if (auto st = o_.state_.Leave(req->host_id(), req->incarnation(), o_.NowMs()); !st.ok()) {
      return ToGrpc(st);
    }
    rep->set_epoch(o_.epoch_locked());
    return ToGrpc(o_.SaveLocked());
  }

  grpc::Status Grow(grpc::ServerContext* ctx, const pb::GrowRequest* req,
                    pb::GrowReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    if (req->extents() > 1024) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "grow by at most 1024 extents a call");
    }
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    const std::int64_t now = o_.NowMs();
    auto got = o_.state_.Grow(req->host_id(), req->incarnation(), req->extents(), now);
    if (!got.ok()) return ToGrpc(got.status());
    // Durable before the host may write into them.
    if (auto st = o_.SaveLocked(); !st.ok()) {
      // Never revealed to the host: straight back to free.
      (void)o_.state_.Shrink(req->host_id(), req->incarnation(), *got, now);
      for (std::uint32_t i : *got) o_.state_.ReleaseQuarantine(i);
      return ToGrpc(st);
    }
    for (std::uint32_t i : *got) FillExtent(o_.state_, i, now, rep->add_granted());
    rep->set_epoch(o_.epoch_locked());
    return grpc::Status::OK;
  }

  grpc::Status Shrink(grpc::ServerContext* ctx, const pb::ShrinkRequest* req,
                      pb::ShrinkReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    std::vector<std::uint32_t> ext(req->extents().begin(), req->extents().end());
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    if (auto st = o_.state_.Shrink(req->host_id(), req->incarnation(), ext, o_.NowMs()); !st.ok()) {
      return ToGrpc(st);
    }
    rep->set_epoch(o_.epoch_locked());
    return ToGrpc(o_.SaveLocked());
  }

  grpc::Status Status(grpc::ServerContext* ctx, const pb::StatusRequest*,
                      pb::StatusReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    // The candidates from etcd, before the lock (etcd may be slow or away; then none listed).
    std::vector<std::string> candidates;
    if (o_.ha()) {
      if (auto c = o_.CandidatesInEtcd(); c.ok()) candidates = *std::move(c);
    }
    absl::MutexLock l(&o_.mu_);
    const Config& c = o_.config();
    rep->set_domain_spec(c.prefix_domain);
    rep->set_pool_spec(c.pool);
    rep->set_pool_bytes(o_.pool_bytes());
    rep->set_extent_bytes(c.extent_bytes);
    rep->set_role(o_.RoleLocked());
    // This one's epoch while it leads (or serves read-only); a standby's: the leader's.
    rep->set_epoch(o_.epoch_locked() != 0 ? o_.epoch_locked() : o_.LeaderEpochLocked());
    rep->set_leader(o_.LeaderLocked());
    rep->set_uptime_ms(o_.NowMs() - o_.started_ms());
    rep->set_read_only_since(o_.ReadOnlySinceLocked());
    for (std::string& n : o_.UnmatchedNamespacesLocked())
      rep->add_unmatched_namespaces(std::move(n));
    for (std::string& cand : candidates) {
      if (cand != rep->leader()) rep->add_standbys(std::move(cand));
    }
    // A standby knows the configuration and who leads; the domain's state is the leader's.
    if (!o_.ReadableLocked().ok()) return grpc::Status::OK;
    std::uint32_t free = 0, assigned = 0, quarantined = 0;
    for (const ExtentInfo& e : o_.state_.extents()) {
      (e.free() ? free : e.quarantined ? quarantined : assigned)++;
    }
    rep->set_extents_total(free + assigned + quarantined);
    rep->set_extents_free(free);
    rep->set_extents_assigned(assigned);
    rep->set_extents_quarantined(quarantined);
    std::uint32_t live = 0, fenced = 0;
    for (const HostInfo& h : o_.state_.hosts()) {
      live += h.state == HostState::kLive || h.state == HostState::kDraining;
      fenced += h.state == HostState::kFenced;
    }
    rep->set_hosts_live(live);
    rep->set_hosts_fenced(fenced);
    const auto& st = o_.owner_->stats();
    rep->set_prefixes_published(o_.owner_->published_entries());
    rep->set_prefix_duplicates(st.duplicates);
    rep->set_prefixes_reclaimed(st.reclaimed);
    rep->set_prefixes_evicted(st.evicted);
    rep->set_recovered_at_start(o_.state_.recovered_extents());
    return grpc::Status::OK;
  }

  grpc::Status Hosts(grpc::ServerContext* ctx, const pb::HostsRequest*,
                     pb::HostsReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ReadableLocked(); !st.ok()) return ToGrpc(st);
    const std::int64_t now = o_.NowMs();
    for (std::uint32_t i = 0; i < o_.state_.hosts().size(); ++i) {
      const HostInfo& h = o_.state_.hosts()[i];
      if (h.state == HostState::kAbsent) continue;
      pb::Host* x = rep->add_hosts();
      x->set_host_id(i);
      x->set_incarnation(h.incarnation);
      x->set_state(HostStateName(h.state));
      x->set_last_heartbeat_ms_ago(now - h.last_heartbeat_ms);
      x->set_extents(o_.state_.ExtentsOf(i));
      x->set_used_bytes(h.used_bytes);
      x->set_hostname(h.hostname);
      pb::LeaseCounters* lc = x->mutable_lease();
      lc->set_leases_refused_late(h.lease.leases_refused_late);
      lc->set_copies_discarded(h.lease.copies_discarded);
      lc->set_copies_retried(h.lease.copies_retried);
      lc->set_leases_retaken(h.lease.leases_retaken);
      lc->set_pauses_detected(h.lease.pauses_detected);
      lc->set_rejoins_after_fence(h.lease.rejoins_after_fence);
    }
    return grpc::Status::OK;
  }

  grpc::Status Extents(grpc::ServerContext* ctx, const pb::ExtentsRequest*,
                       pb::ExtentsReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ReadableLocked(); !st.ok()) return ToGrpc(st);
    const std::int64_t now = o_.NowMs();
    for (std::uint32_t i = 0; i < o_.state_.extents().size(); ++i) {
      FillExtent(o_.state_, i, now, rep->add_extents());
    }
    return grpc::Status::OK;
  }

  grpc::Status Prefixes(grpc::ServerContext* ctx, const pb::PrefixesRequest* req,
                        pb::PrefixesReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ReadableLocked(); !st.ok()) return ToGrpc(st);
    const co::PrefixOwner& owner = *o_.owner_;
    std::uint32_t published = 0, retired = 0;
    for (std::uint32_t i = 0; i < owner.header().index_entries; ++i) {
      const co::EntryState s = owner.entry_state(i);
      if (s != co::EntryState::kPublished && s != co::EntryState::kRetired) continue;
      (s == co::EntryState::kPublished ? published : retired)++;
      if (req->limit() != 0 && static_cast<std::uint32_t>(rep->prefixes_size()) >= req->limit())
        continue;
      const co::IndexEntry e = owner.entry(i);
      pb::Prefix* p = rep->add_prefixes();
      p->set_entry(i);
      p->set_state(EntryStateName(e.state));
      p->set_ns(e.ns);
      p->set_key(co::FormatKey({e.key[0], e.key[1]}));
      p->set_publisher(e.publisher);
      p->set_block_index(e.ref.index);
    }
    rep->set_published(published);
    rep->set_retired(retired);
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const pb::DrainRequest* req,
                     pb::DrainReply*) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    if (auto st = o_.state_.Drain(req->host_id()); !st.ok()) return ToGrpc(st);
    return ToGrpc(o_.SaveLocked());
  }

  grpc::Status Evict(grpc::ServerContext* ctx, const pb::EvictRequest* req,
                     pb::EvictReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    const NamespaceConfig* found = nullptr;
    for (const NamespaceConfig& n : o_.config().namespaces) {
      if (n.Name() == req->ns()) found = &n;
    }
    if (found == nullptr) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no [[namespace]] '", req->ns(),
                                       "' in the config (name it tenant/model/layout)"));
    }
    absl::MutexLock l(&o_.mu_);
    if (auto st = o_.ServingLocked(); !st.ok()) return ToGrpc(st);
    // An owner write outside the owner loop: the same fence check as a batch.
    if (!o_.OwnerBatchMayRunLocked()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "this orchestrator stopped leading the domain: retry against the leader");
    }
    rep->set_retired(
        o_.owner_->RetireNamespace(co::MakeNamespace(found->tenant, found->model, found->layout)));
    o_.EndBatchLocked();
    return grpc::Status::OK;
  }

 private:
  Orchestrator& o_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeOrchestratorService(Orchestrator& o) {
  return std::make_unique<Service>(o);
}

}  // namespace cxlkv::orchestrator
