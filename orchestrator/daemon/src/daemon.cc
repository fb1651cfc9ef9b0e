// cxlkv-orchestrator: the owner role, membership and capacity, gRPC on a Unix socket whose
// peers' credentials are checked, and a Prometheus endpoint.
#include "cxlkv/orchestrator/daemon.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent.h"
#include "announce.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coordinator/service.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "directory_service.h"
#include "domain_lock.h"
#include "fence.h"
#include "ha.h"
#include "nlohmann/json.hpp"
#include "orchestrator.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;

namespace {

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

co::DomainGeometry GeometryOf(const Config& c) {
  co::DomainGeometry g;
  g.max_hosts = c.max_hosts;
  g.index_entries = c.index_entries;
  g.lease_rows = c.lease_rows;
  g.ring_slots = c.ring_slots;
  g.lease_ttl_ms = c.lease_ttl_ms;
  g.host_ttl_ms = c.host_ttl_ms;
  g.grace_ms = c.grace_ms;
  return g;
}

// Formats the prefix domain (all tables empty) after checking that it fits.
absl::Status Format(co::Mem& mem, const Config& c, std::uint64_t region_bytes) {
  const co::DomainGeometry g = GeometryOf(c);
  if (co::DomainBytes(g) > region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain.prefix_domain '", c.prefix_domain, "' holds ", region_bytes,
                     " bytes; this geometry needs ", co::DomainBytes(g),
                     " (give it ?size= or fewer index_entries)"));
  }
  return co::FormatDomain(mem, g);
}

// This orchestrator as the leader key names it (orchestrator HA). Hosts that find the leader
// through etcd (docs/ha.md "Endpoint discovery") use `socket` on the same host and
// `endpoint` (rpc.tcp with the port it listens on; a wildcard address becomes the host name)
// from others. tcp_port: 0 before the daemon listens.
std::string SelfDescription(const Config& c, int tcp_port = 0) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json j;
  j["node"] = c.etcd.node.empty() ? absl::StrCat(host, ":", ::getpid()) : c.etcd.node;
  j["host"] = host;
  j["pid"] = ::getpid();
  j["socket"] = c.socket;
  j["tcp"] = c.tcp;
  if (!c.tcp.empty() && tcp_port > 0) {
    std::string addr = c.tcp.substr(0, c.tcp.rfind(':'));
    if (addr.empty() || addr == "0.0.0.0" || addr == "[::]" || addr == "::") addr = host;
    j["endpoint"] = absl::StrCat(addr, ":", tcp_port);
  }
  // Sealed with the domain's token (rpc.token_file), so a host that holds the token calls
  // only a leader the domain's own orchestrators advertised (docs/ha.md).
  if (c.etcd.enabled() && !c.token.empty()) {
    j["mac"] = LeaderRecordMac(
        c.token, absl::StrCat("/cxlkv/v1/", c.etcd.cluster, "/domains/", c.etcd.domain, "/leader"),
        j.dump());
  }
  return j.dump();
}

// Whether `path` may be bound: absent (false), or a socket nothing answers on, a killed
// daemon's (true: remove it first). Anything else is refused, naming it and the fix; nothing
// is changed here.
absl::StatusOr<bool> SocketIsStale(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return absl::UnavailableError(
        absl::StrCat("rpc.socket '", path, "': ", pool::ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rpc.socket '", path, "' exists and is not a socket (",
                     S_ISDIR(st.st_mode)   ? "a directory"
                     : S_ISREG(st.st_mode) ? "a regular file"
                                           : "not a socket",
                     "); it was left as it is: move it away, or set rpc.socket to another path"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", pool::ErrnoText(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0 || err == EAGAIN) {
    // Someone listens there: another domain's daemon, or another program.
    return absl::FailedPreconditionError(absl::StrCat(
        "rpc.socket '", path,
        "' is in use: a running process answers on it (another domain's orchestrator? `cxlkvctl "
        "status --socket ",
        path, "` tells). It was left as it is: set rpc.socket to a path of this domain's own"));
  }
  if (err != ECONNREFUSED && err != ENOENT) {
    return absl::UnavailableError(absl::StrCat("rpc.socket '", path,
                                               "': cannot tell whether it is "
                                               "in use (connect: ",
                                               pool::ErrnoText(err), ")"));
  }
  return true;
}

// Makes `path` free for bind: a stale socket is removed, anything else refused (SocketIsStale).
absl::Status ClearStaleSocket(const std::string& path) {
  auto stale = SocketIsStale(path);
  if (!stale.ok()) return stale.status();
  if (*stale && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat(
        "rpc.socket '", path, "': cannot remove the stale socket: ", pool::ErrnoText(errno)));
  }
  return absl::OkStatus();
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

}  // namespace

// ---- metrics ---------------------------------------------------------------------------------

class Metrics {
 public:
  explicit Metrics(const std::string& listen)
      : exposer_(listen),
        registry_(std::make_shared<prometheus::Registry>()),
        extents_(prometheus::BuildGauge()
                     .Name("cxlkv_extents")
                     .Help("Extents of the pooled region by state")
                     .Register(*registry_)),
        capacity_(prometheus::BuildGauge()
                      .Name("cxlkv_capacity_bytes")
                      .Help("Pooled capacity by state")
                      .Register(*registry_)),
        hosts_(prometheus::BuildGauge()
                   .Name("cxlkv_hosts")
                   .Help("Hosts by state")
                   .Register(*registry_)),
        host_used_(prometheus::BuildGauge()
                       .Name("cxlkv_host_used_bytes")
                       .Help("Bytes each host reports in use")
                       .Register(*registry_)),
        host_extents_(prometheus::BuildGauge()
                          .Name("cxlkv_host_extents")
                          .Help("Extents each host holds")
                          .Register(*registry_)),
        entries_(prometheus::BuildGauge()
                     .Name("cxlkv_prefix_entries")
                     .Help("Shared prefix index entries by state")
                     .Register(*registry_)),
        events_(prometheus::BuildGauge()
                    .Name("cxlkv_prefix_events")
                    .Help("Owner counters since start (published, duplicates, retired, reclaimed, "
                          "evicted, fenced, leases_expired, returns_waiting)")
                    .Register(*registry_)),
        traffic_(prometheus::BuildCounter()
                     .Name("cxlkv_prefix_lookups_total")
                     .Help("Prefix lookups hosts reported, by result")
                     .Register(*registry_)),
        step_(prometheus::BuildHistogram()
                  .Name("cxlkv_owner_step_seconds")
                  .Help("Owner step (apply, fence, evict, reclaim) latency")
                  .Register(*registry_)),
        step_hist_(step_.Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 5e-5, 1e-4, 5e-4,
                                                                         1e-3, 5e-3, 1e-2, 5e-2})),
        hits_(traffic_.Add({{"result", "hit"}})),
        misses_(traffic_.Add({{"result", "miss"}})) {
    exposer_.RegisterCollectable(registry_);
  }
  void Update(const DomainState& s, const co::PrefixOwner& o, std::uint64_t extent_bytes) {
    std::map<std::string, std::uint64_t> by_extent_state{
        {"free", 0}, {"assigned", 0}, {"quarantined", 0}};
    for (const ExtentInfo& e : s.extents()) ++by_extent_state[e.state_name()];
    for (const auto& [name, n] : by_extent_state) {
      extents_.Add({{"state", name}}).Set(static_cast<double>(n));
      capacity_.Add({{"state", name}}).Set(static_cast<double>(n * extent_bytes));
    }
    std::map<std::string, int> by_state;
    for (std::uint32_t h = 0; h < s.hosts().size(); ++h) {
      const HostInfo& hi = s.hosts()[h];
      if (hi.state == HostState::kAbsent) continue;
      ++by_state[HostStateName(hi.state)];
      host_used_.Add({{"host", std::to_string(h)}}).Set(static_cast<double>(hi.used_bytes));
      host_extents_.Add({{"host", std::to_string(h)}}).Set(s.ExtentsOf(h));
    }
    for (const char* st : {"live", "fenced", "draining", "left"}) {
      hosts_.Add({{"state", st}}).Set(by_state[st]);
    }
    entries_.Add({{"state", "published"}}).Set(o.published_entries());
    entries_.Add({{"state", "retired"}}).Set(o.retired_entries());
    const auto& st = o.stats();
    events_.Add({{"event", "published"}}).Set(static_cast<double>(st.published));
    events_.Add({{"event", "duplicates"}}).Set(static_cast<double>(st.duplicates));
    events_.Add({{"event", "retired"}}).Set(static_cast<double>(st.retired));
    events_.Add({{"event", "reclaimed"}}).Set(static_cast<double>(st.reclaimed));
    events_.Add({{"event", "evicted"}}).Set(static_cast<double>(st.evicted));
    events_.Add({{"event", "hosts_fenced"}}).Set(static_cast<double>(st.hosts_fenced));
    events_.Add({{"event", "leases_expired"}}).Set(static_cast<double>(st.leases_expired));
    events_.Add({{"event", "returns_waiting"}}).Set(static_cast<double>(st.returns_waiting));
  }
  void ObserveStep(double seconds) { step_hist_.Observe(seconds); }

  // Orchestrator HA ([etcd]; docs/ha.md "Metrics"). Counters advance by what the election
  // counted since the last update; the latencies are the ones drained since then.
  struct HaView {
    bool leading = false, read_only = false;
    std::int64_t epoch = 0;
    double last_takeover_unix_s = 0, last_takeover_s = 0;
  };
  void UpdateHa(const HaStats& h, const HaView& v) {
    if (ha_ == nullptr) ha_ = std::make_unique<Ha>(*registry_);
    Ha& m = *ha_;
    auto advance = [](prometheus::Counter& c, std::uint64_t now, std::uint64_t& seen) {
      if (now > seen) c.Increment(static_cast<double>(now - seen));
      seen = now;
    };
    advance(m.won, h.elections_won, m.won_seen);
    advance(m.step_downs, h.step_downs, m.step_downs_seen);
    advance(m.state_writes, h.state_writes, m.state_writes_seen);
    advance(m.state_write_failures, h.state_write_failures, m.state_write_failures_seen);
    advance(m.keepalive_failures, h.keepalive_failures, m.keepalive_failures_seen);
    for (double ms : h.etcd_call_ms) m.latency_hist.Observe(ms / 1000.0);
    m.role.Add({{"role", "leader"}}).Set(v.leading ? 1 : 0);
    m.role.Add({{"role", "read-only"}}).Set(v.read_only ? 1 : 0);
    m.role.Add({{"role", "standby"}}).Set(v.leading || v.read_only ? 0 : 1);
    m.read_only.Set(v.read_only ? 1 : 0);
    m.epoch.Set(static_cast<double>(v.epoch));
    if (v.last_takeover_unix_s > 0) {
      m.last_takeover.Set(v.last_takeover_unix_s);
      m.takeover_seconds.Set(v.last_takeover_s);
    }
  }
  void Traffic(std::uint64_t hits, std::uint64_t misses) {
    hits_.Increment(static_cast<double>(hits));
    misses_.Increment(static_cast<double>(misses));
  }

 private:
  prometheus::Exposer exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& extents_;
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Family<prometheus::Gauge>& hosts_;
  prometheus::Family<prometheus::Gauge>& host_used_;
  prometheus::Family<prometheus::Gauge>& host_extents_;
  prometheus::Family<prometheus::Gauge>& entries_;
  prometheus::Family<prometheus::Gauge>& events_;
  prometheus::Family<prometheus::Counter>& traffic_;
  prometheus::Family<prometheus::Histogram>& step_;
  prometheus::Histogram& step_hist_;
  prometheus::Counter& hits_;
  prometheus::Counter& misses_;

  struct Ha {
    explicit Ha(prometheus::Registry& r)
        : won(prometheus::BuildCounter()
                  .Name("cxlkv_ha_elections_won_total")
                  .Help("Elections this orchestrator won (terms it led)")
                  .Register(r)
                  .Add({})),
          step_downs(prometheus::BuildCounter()
                         .Name("cxlkv_ha_step_downs_total")
                         .Help("Leaderships that ended (deadline passed, lease lost, resigned)")
                         .Register(r)
                         .Add({})),
          state_writes(prometheus::BuildCounter()
                           .Name("cxlkv_ha_state_writes_total")
                           .Help("Guarded transactions writing the domain's state to etcd")
                           .Register(r)
                           .Add({})),
          state_write_failures(prometheus::BuildCounter()
                                   .Name("cxlkv_ha_state_write_failures_total")
                                   .Help("State writes refused by their guard or unanswered")
                                   .Register(r)
                                   .Add({})),
          keepalive_failures(prometheus::BuildCounter()
                                 .Name("cxlkv_ha_keepalive_failures_total")
                                 .Help("Session keep-alives etcd did not answer")
                                 .Register(r)
                                 .Add({})),
          latency_hist(
              prometheus::BuildHistogram()
                  .Name("cxlkv_ha_etcd_request_seconds")
                  .Help("etcd request latency (keep-alives, campaigns, state reads and "
                        "writes)")
                  .Register(r)
                  .Add({},
                       prometheus::Histogram::BucketBoundaries{
                           5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5})),
          role(prometheus::BuildGauge()
                   .Name("cxlkv_ha_role")
                   .Help("1 for this orchestrator's role: leader, read-only or standby")
                   .Register(r)),
          read_only(prometheus::BuildGauge()
                        .Name("cxlkv_ha_read_only")
                        .Help("1 while the leader serves read-only (etcd unreachable)")
                        .Register(r)
                        .Add({})),
          epoch(prometheus::BuildGauge()
                    .Name("cxlkv_ha_epoch")
                    .Help("The epoch this orchestrator leads at (0: it does not)")
                    .Register(r)
                    .Add({})),
          last_takeover(prometheus::BuildGauge()
                            .Name("cxlkv_ha_last_takeover_timestamp_seconds")
                            .Help("When this orchestrator last took the domain over (Unix time)")
                            .Register(r)
                            .Add({})),
          takeover_seconds(prometheus::BuildGauge()
                               .Name("cxlkv_ha_last_takeover_seconds")
                               .Help("The last takeover, from winning the election to serving")
                               .Register(r)
                               .Add({})) {}
    prometheus::Counter& won;
    prometheus::Counter& step_downs;
    prometheus::Counter& state_writes;
    prometheus::Counter& state_write_failures;
    prometheus::Counter& keepalive_failures;
    prometheus::Histogram& latency_hist;
    prometheus::Family<prometheus::Gauge>& role;
    prometheus::Gauge& read_only;
    prometheus::Gauge& epoch;
    prometheus::Gauge& last_takeover;
    prometheus::Gauge& takeover_seconds;
    std::uint64_t won_seen = 0, step_downs_seen = 0, state_writes_seen = 0;
    std::uint64_t state_write_failures_seen = 0, keepalive_failures_seen = 0;
  };
  std::unique_ptr<Ha> ha_;  // created on the first UpdateHa (only with [etcd])
};

// ---- RPC service ------------------------------------------------------------------------------

class Service final : public pb::Orchestrator::Service {
 public:
  explicit Service(Orchestrator& o) : o_(o) {}

  // Every call: a TCP peer must carry the token; a Unix-socket peer was let in by the
  // accept loop, which checked its uid before gRPC saw the connection.
  grpc::Status Check(grpc::ServerContext* ctx) {
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

// ---- the daemon -------------------------------------------------------------------------------

Orchestrator::Orchestrator(const Config& c, std::uint64_t pool_bytes)
    // [lmcache]: the pool's last extents are the coordinator's, never lent to hosts.
    : state_(c, coordinator::HostPoolBytes(c.lmcache, pool_bytes, c.extent_bytes)), config_(c) {}

Orchestrator::~Orchestrator() { Stop(); }

namespace {

// The message for a metrics.listen this daemon cannot listen on (Open probes it before anything
// is written; Start, which binds it for real, says the same if it was taken in between).
absl::Status MetricsListenRefused(const std::string& listen, absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat("metrics.listen '", listen,
                   "': cannot listen there (the address is in use or not this machine's; ", why,
                   "): choose another HOST:PORT, or \"\" to turn metrics off"));
}

// Whether HOST:PORT can be bound now (SO_REUSEADDR, as the HTTP server binds it).
absl::Status ProbeListen(const std::string& listen) {
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return MetricsListenRefused(listen, "no :PORT");
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
      rc != 0) {
    return MetricsListenRefused(listen, absl::StrCat("getaddrinfo: ", ::gai_strerror(rc)));
  }
  int err = 0;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) err = errno;
    ::close(fd);
    if (bound) {
      ::freeaddrinfo(res);
      return absl::OkStatus();
    }
  }
  ::freeaddrinfo(res);
  return MetricsListenRefused(listen, absl::StrCat("bind: ", pool::ErrnoText(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Orchestrator>> Orchestrator::Open(const Config& c,
                                                                 const OpenOptions& options) {
  // Nothing is touched before this daemon holds its domain: a second start of the same
  // domain.toml (or a unit started twice) stops here, naming the running one.
  if (auto st = CheckConfigOnHost(c); !st.ok()) return st;
  auto lock = DomainLock::Acquire(c);
  if (!lock.ok()) return lock.status();
  // The socket path is checked now too (Start checks it again and replaces a stale socket):
  // something in the way refuses the start before a state file is written or a domain
  // formatted.
  if (auto stale = SocketIsStale(c.socket); !stale.ok()) return stale.status();
  if (!c.metrics_listen.empty()) {
    if (auto st = ProbeListen(c.metrics_listen); !st.ok()) return st;
  }
  auto pool = pool::OpenRegion(c.pool);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrCat("domain.pool '", c.pool, "': ", pool.status().message()));
  }
  // With [etcd] every candidate maps the same pool and prefix domain (the election decides who
  // writes); without it, this daemon is their only owner on this host.
  if (!c.etcd.enabled()) {
    if (auto st = (*lock)->LockRegion("domain.pool", c.pool); !st.ok()) return st;
  }
  if ((*pool)->size_bytes() < c.extent_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain.pool '", c.pool, "' (", (*pool)->size_bytes(),
                     " bytes) is smaller than one extent (domain.extent_size)"));
  }
  std::unique_ptr<Orchestrator> o(new Orchestrator(c, (*pool)->size_bytes()));
  if (options.clock != nullptr) o->clock_ = options.clock;
  o->pool_ = *std::move(pool);
  auto dom = pool::OpenRegion(c.prefix_domain);
  if (!dom.ok()) {
    return absl::Status(dom.status().code(), absl::StrCat("domain.prefix_domain '", c.prefix_domain,
                                                          "': ", dom.status().message()));
  }
  if (!c.etcd.enabled()) {
    if (auto st = (*lock)->LockRegion("domain.prefix_domain", c.prefix_domain); !st.ok()) {
      return st;
    }
  }
  o->lock_ = *std::move(lock);
  o->domain_region_ = *std::move(dom);
  o->domain_mem_ =
      std::make_unique<co::DirectMem>(o->domain_region_->addr(), o->domain_region_->size_bytes());
  auto header = co::ReadDomainHeader(*o->domain_mem_);
  if (!header.ok() && !absl::IsNotFound(header.status())) {
    return absl::Status(
        header.status().code(),
        absl::StrCat("domain.prefix_domain '", c.prefix_domain, "': ", header.status().message(),
                     ". Nothing was changed. Check that domain.prefix_domain names this domain's "
                     "own file or device (not domain.pool or another domain's, nor an arena); "
                     "if it is, restore it from a backup"));
  }
  const bool formatted = header.ok();
  o->new_domain_ = options.new_domain;
  if (c.etcd.enabled()) {
    // Orchestrator HA: nothing is written to the domain until this one is elected. The agent
    // first, while this process has no thread of its own yet.
    if (options.write_back_agent) {
      auto agent = WriteBackAgent::Start(o->domain_region_->addr(), o->domain_region_->size_bytes(),
                                         std::int64_t{c.etcd.ttl_s} * 1000);
      if (!agent.ok()) return agent.status();
      o->agent_ = *std::move(agent);
    }
    auto ha = HaSession::Create(c, SelfDescription(c), o->clock_);
    if (!ha.ok()) return ha.status();
    o->ha_ = *std::move(ha);
    o->fenced_mem_ = std::make_unique<FencedMem>(*o->domain_mem_, *o->ha_);
    auto stored = o->ha_->LoadState();
    if (!stored.ok()) {
      return absl::Status(stored.status().code(),
                          absl::StrCat(stored.status().message(),
                                       " (etcd.endpoints must be reachable when an orchestrator "
                                       "starts; it keeps running through an etcd outage later)"));
    }
    struct stat hb {};
    const bool have_file = ::stat(c.state_file.c_str(), &hb) == 0;
    // --new-domain over existing state only when all of it is older than the domain's own
    // record (etcd restored from a backup, a stale cache): the takeover then quarantines every
    // extent instead of adopting it (docs/ha.md "Durable state in etcd").
    co::OwnerFenceLine record{};
    const bool recorded = formatted && ReadFenceLine(*o->domain_mem_, &record) && record.epoch != 0;
    bool all_older = recorded;
    if (all_older && stored->has_value()) {
      DomainState s(c, o->pool_->size_bytes());
      all_older = s.Deserialize((*stored)->text, 0).ok() && s.generation() < record.state_gen;
    }
    if (all_older && have_file) {
      DomainState s(c, o->pool_->size_bytes());
      all_older = s.Load(0).ok() && s.generation() < record.state_gen;
    }
    if (options.new_domain && (stored->has_value() || have_file) && !all_older) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--new-domain: domain '", c.etcd.domain, "' is not new: ",
          stored->has_value() ? absl::StrCat("its state is in etcd at ", o->ha_->where(), "/state")
                              : absl::StrCat("the state file ", c.state_file, " exists"),
          recorded ? absl::StrCat(" and is not older than the domain's own record (state "
                                  "generation ",
                                  record.state_gen, ")")
                   : std::string(),
          "; start without --new-domain"));
    }
    if (!options.new_domain && !stored->has_value() && !have_file) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain '", c.etcd.domain, "' has no state in etcd (", o->ha_->where(),
          "/state) and no state file ", c.state_file, ": ",
          formatted ? "its prefix domain is formatted, so it ran before and its extent "
                      "assignments are lost; restore them, or start one orchestrator once with "
                      "--new-domain (every extent then stays quarantined for a full capacity lease)"
                    : "to create it, start one orchestrator once with --new-domain"));
    }
    o->started_ms_ = o->clock_->NowMs();
    return o;
  }
  if (formatted) {
    // A domain that elected orchestrators owned: a single one beside them would be a second
    // owner of the same lines.
    co::OwnerFenceLine f{};
    if (ReadFenceLine(*o->domain_mem_, &f) && f.epoch != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain.prefix_domain '", c.prefix_domain,
          "' is owned by orchestrators elected through etcd (its fence line names epoch ", f.epoch,
          "): give this orchestrator the same [etcd] section (docs/ha.md) instead of "
          "running it as the domain's only one"));
    }
  }
  // Only the state file says which extents are lent. Without it this is a new domain only
  // when the operator says so (--new-domain): a lost or mis-pathed file must not free every
  // extent that live hosts still write (docs/orchestrator.md "A new domain").
  struct stat sb {};
  const bool have_state = ::stat(c.state_file.c_str(), &sb) == 0;
  if (!have_state && errno != ENOENT) {
    return absl::PermissionDeniedError(
        absl::StrCat("domain.state_file ", c.state_file, ": ", pool::ErrnoText(errno)));
  }
  if (options.new_domain && have_state) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--new-domain: the state file ", c.state_file, " exists, so domain '", c.name,
        "' is not new; start without --new-domain (move the file away only if the pool and "
        "every host using it were re-created)"));
  }
  if (!options.new_domain && !have_state) {
    if (formatted) {
      return absl::DataLossError(absl::StrCat(
          "the state file ", c.state_file, " does not exist, but the prefix domain '",
          c.prefix_domain,
          "' is formatted: this domain ran before and its extent assignments "
          "are lost, while hosts may still write the extents they hold. Restore the file or fix "
          "domain.state_file; only if that is impossible, start once with --new-domain (every "
          "extent then stays quarantined for a full capacity lease)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the state file ", c.state_file, " does not exist: to create domain '", c.name,
                     "', start once with --new-domain (later starts read the state file)"));
  }
  o->started_ms_ = o->clock_->NowMs();
  if (options.new_domain) {
    absl::MutexLock l(&o->mu_);
    // A domain whose prefix domain was in use: its extents may hold arenas that index entries
    // name and that hosts of the old run still write.
    if (formatted) o->state_.QuarantineAll(o->started_ms_);
    // The state file exists from now on, before anything is formatted: a restart without
    // --new-domain reads it.
    if (auto st = o->SaveLocked(); !st.ok()) return st;
  }
  if (!formatted) {
    if (auto st = Format(*o->domain_mem_, c, o->domain_region_->size_bytes()); !st.ok()) return st;
  }
  absl::MutexLock l(&o->mu_);
  auto owner = co::PrefixOwner::Open(*o->domain_mem_, *o->clock_);
  if (!owner.ok()) return owner.status();
  o->owner_ = *std::move(owner);
  for (const NamespaceConfig& n : c.namespaces) {
    o->owner_->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
  if (!options.new_domain) {
    if (auto st = o->state_.Load(o->started_ms_); !st.ok()) return st;
  }
  return o;
}

bool Orchestrator::UidAllowed(uid_t uid) const {
  if (uid == ::geteuid()) return true;
  for (std::uint32_t a : config_.allowed_uids) {
    if (a == uid) return true;
  }
  return false;
}

void Orchestrator::CountPrefixTraffic(std::uint64_t hits, std::uint64_t misses) {
  if (metrics_) metrics_->Traffic(hits, misses);
}

absl::Status Orchestrator::Start() {
  if (!config_.metrics_listen.empty()) {
    try {
      metrics_ = std::make_unique<Metrics>(config_.metrics_listen);
    } catch (const std::exception& e) {
      return MetricsListenRefused(config_.metrics_listen,
                                  absl::StrCat("the HTTP server said: ", e.what()));
    }
  }
  // [lmcache]: LMCache's coordinator API, up before the socket listens (launchers wait on it).
  if (config_.lmcache.enabled()) {
    // With [etcd]: standing by until elected (its state is in etcd, docs/lmcache.md).
    auto lmcache = coordinator::Service::Start(config_.lmcache, pool_->size_bytes(),
                                               config_.extent_bytes, ha_ != nullptr);
    if (!lmcache.ok()) return lmcache.status();
    lmcache_ = *std::move(lmcache);
  }
  sockaddr_un addr{};
  if (config_.socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc.socket '", config_.socket, "' is ", config_.socket.size(),
                     " bytes; a Unix socket path holds at most ", sizeof(addr.sun_path) - 1,
                     ": choose a shorter path"));
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(config_.socket).parent_path(), ec);
  // The socket: a stale one (a killed daemon's) is replaced, and nothing else is: this daemon
  // holds its domain (Open), so a socket at the path that answers belongs to someone else.
  if (auto st = ClearStaleSocket(config_.socket); !st.ok()) return st;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, config_.socket.c_str(), config_.socket.size());
  // Bound now, listening only once every endpoint is up: a connect to the socket succeeds
  // exactly when the daemon (TCP included) is ready, which is what launchers wait for.
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "rpc.socket '", config_.socket, "': ", pool::ErrnoText(err),
        err == EADDRINUSE ? " (another process bound it just now: choose another rpc.socket)"
                          : ""));
  }
  listen_fd_ = fd;
  ::chmod(config_.socket.c_str(), 0666);  // access is decided by peer credentials
  service_ = std::make_unique<Service>(*this);
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  directory_service_ = MakeDirectoryService(config_);
  builder.RegisterService(directory_service_.get());
  builder.SetMaxReceiveMessageSize(1 << 20);
  int tcp_port = 0;
  if (!config_.tcp.empty()) {
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (!config_.tls_cert.empty()) {
      auto cert = ReadSmallFile(config_.tls_cert, "rpc.tls_cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadSmallFile(config_.tls_key, "rpc.tls_key");
      if (!key.ok()) return key.status();
      grpc::SslServerCredentialsOptions o;
      o.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
      creds = grpc::SslServerCredentials(o);
    }
    builder.AddListeningPort(config_.tcp, creds, &tcp_port);
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        config_.tcp.empty() ? std::string("gRPC server did not start")
                            : absl::StrCat("rpc.tcp '", config_.tcp,
                                           "': cannot listen there (address in use, or not "
                                           "this machine's; or a bad rpc.tls_cert/tls_key)"));
  }
  if (!config_.tcp.empty() && tcp_port == 0) {
    return absl::UnavailableError(absl::StrCat("rpc.tcp '", config_.tcp, "': cannot listen there"));
  }
  tcp_port_ = tcp_port;
  if (::listen(listen_fd_, 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("rpc.socket '", config_.socket, "': listen: ", pool::ErrnoText(errno)));
  }
  owner_thread_ = std::thread([this] { OwnerLoop(); });
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  // The directory summary and KV events: the leader's (or the single orchestrator's) news.
  auto announcer = Announcer::Start(*this, ha_.get());
  if (!announcer.ok()) return announcer.status();
  announcer_ = *std::move(announcer);
  if (ha_ != nullptr) {
    // Campaigning starts once every endpoint is up: an elected orchestrator serves at once.
    HaSession::Hooks hooks;
    hooks.take_over = [this](const LeaderTerm& t) {
      absl::Status st = TakeOver(t);
      if (st.ok() && lmcache_ != nullptr) LeadLmcache(t.revision);
      return st;
    };
    hooks.step_down = [this](const std::string& why) {
      StepDown(why);
      if (lmcache_ != nullptr) lmcache_->StandBy(why);
    };
    ha_->Advertise(SelfDescription(config_, tcp_port_));
    if (auto st = ha_->Start(std::move(hooks)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void Orchestrator::AcceptLoop() {
  while (!stop_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stop_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // The peer's credentials as the kernel recorded them at connect(). A uid that is not
    // allowed is refused here: the connection is closed before gRPC sees it, and nothing of
    // it is kept (per-call checks keyed by a reusable descriptor number would be fragile).
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !UidAllowed(cred.uid)) {
      const bool known = len == sizeof(cred);
      ::close(fd);
      const std::uint64_t n = refused_.fetch_add(1) + 1;
      // Logged at most once a second: a local user cannot flood the log by connecting.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_refusal_log_ >= std::chrono::seconds(1)) {
        last_refusal_log_ = now;
        std::fprintf(stderr,
                     "cxlkv-orchestrator: refused a connection on %s from %s: not the daemon's "
                     "uid and not in rpc.allowed_uids (%llu refused so far)\n",
                     config_.socket.c_str(),
                     known ? absl::StrCat("uid ", cred.uid, " pid ", cred.pid).c_str()
                           : "a peer without credentials",
                     static_cast<unsigned long long>(n));
      }
      continue;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // gRPC drives it with epoll
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
  }
}

std::vector<std::string> Orchestrator::UnmatchedNamespacesLocked() const {
  std::vector<std::string> out;
  if (owner_ == nullptr || owner_->published_under_others() == 0) return out;
  for (const NamespaceConfig& n : config_.namespaces) {
    if (owner_->published_under(co::MakeNamespace(n.tenant, n.model, n.layout)) == 0) {
      out.push_back(absl::StrCat(n.tenant, "/", n.model, "/", n.layout));
    }
  }
  return out;
}

void Orchestrator::OwnerLoop() {
  std::int64_t last_metrics = 0, last_ha_metrics = 0, last_namespaces = 0;
  while (!stop_.load()) {
    if (agent_ != nullptr) {
      // The agent's view of this term's write deadline, on CLOCK_BOOTTIME (its clock).
      const std::int64_t deadline = ha_->write_deadline_ms();
      if (deadline != 0) agent_->Deadline(steady_.NowMs() + (deadline - clock_->NowMs()));
    }
    {
      absl::MutexLock l(&mu_);
      // A standby (or a leader whose fence closed) writes nothing.
      if (owner_ != nullptr && OwnerBatchMayRunLocked()) {
        const auto t0 = std::chrono::steady_clock::now();
        owner_->Step();
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::int64_t now = clock_->NowMs();
        // Both run every step (no short-circuit): expiry first, then the quarantine it feeds.
        const bool expired = state_.Expire(now);
        const bool tended = TendQuarantineLocked(now);
        if (expired || tended) {
          if (auto st = SaveLocked(); !st.ok()) {
            std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(st.message()).c_str());
          }
        }
        EndBatchLocked();
        // A [[namespace]] no publication matches while others fill: said once, with the fix.
        if (now - last_namespaces >= 1000 && !config_.namespaces.empty()) {
          last_namespaces = now;
          for (const std::string& n : UnmatchedNamespacesLocked()) {
            if (!unmatched_logged_.insert(n).second) continue;
            std::fprintf(stderr,
                         "cxlkv-orchestrator: [[namespace]] '%s' has matched none of the blocks "
                         "published since start, while %llu were published under namespaces no "
                         "[[namespace]] names: check its tenant, model and layout against the "
                         "names the hosts' adapters build (cxlkvctl status lists it until a "
                         "block matches)\n",
                         n.c_str(),
                         static_cast<unsigned long long>(owner_->published_under_others()));
          }
        }
        if (metrics_) {
          metrics_->ObserveStep(secs);
          if (now - last_metrics >= 200 && owner_ != nullptr) {
            metrics_->Update(state_, *owner_, config_.extent_bytes);
            last_metrics = now;
          }
        }
      }
      // HA metrics in every role (a standby's and a read-only leader's count too).
      if (metrics_ && ha_ != nullptr && clock_->NowMs() - last_ha_metrics >= 200) {
        Metrics::HaView v;
        v.leading = leading_;
        v.read_only = read_only_;
        v.epoch = epoch_;
        v.last_takeover_unix_s = last_takeover_unix_s_;
        v.last_takeover_s = last_takeover_s_;
        metrics_->UpdateHa(ha_->DrainStats(), v);
        last_ha_metrics = clock_->NowMs();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(config_.owner_period_ms));
  }
}

namespace {
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

std::string Orchestrator::ArenaInExtent(std::uint32_t i) const {
  const std::uint64_t off = state_.extent_offset(i);
  const std::byte* base = pool_->addr() + off;
  // Written by another host: drop stale lines of ours before reading.
  co::Invalidate(base, sizeof(pool::ArenaHeader));
  pool::ArenaHeader h{};
  if (!pool::ValidateHeaderBytes(base, config_.extent_bytes, "extent", &h).ok()) return "";
  return HexOf(h.uuid, sizeof(h.uuid));
}

bool Orchestrator::TendQuarantineLocked(std::int64_t now) {
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

// ---- orchestrator HA --------------------------------------------------------------------------

absl::Status Orchestrator::SaveLocked() {
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

absl::Status Orchestrator::ServingLocked() {
  // A leader whose write deadline passed (it was stopped, or etcd went silent) changes
  // nothing more: a successor may be serving from a newer state by now.
  if (ha_ == nullptr || (leading_ && owner_ != nullptr && ha_->WriteAllowed())) {
    return absl::OkStatus();
  }
  if (ReadOnlyLocked()) {
    return absl::UnavailableError(absl::StrCat(
        "domain '", config_.etcd.domain, "': etcd unreachable since ", ReadOnlySinceLocked(),
        "; the domain is read-only until it is back (heartbeats, lookups and the extents already "
        "lent keep working; no new extents, publications or membership changes, and no prefix "
        "leases once the owner's last heartbeat acknowledgement is host_ttl old)"));
  }
  const HaStats h = ha_->stats();
  return absl::UnavailableError(
      absl::StrCat("this orchestrator is a standby of domain '", config_.etcd.domain, "'",
                   h.leader.empty() ? std::string("; no leader is elected right now: retry shortly")
                                    : absl::StrCat("; the leader is ", h.leader)));
}

absl::Status Orchestrator::ReadableLocked() {
  if (ha_ == nullptr || (leading_ && owner_ != nullptr && ha_->WriteAllowed())) {
    return absl::OkStatus();
  }
  if (ReadOnlyLocked()) return absl::OkStatus();
  return ServingLocked();
}

bool Orchestrator::ReadOnlyLocked() {
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

void Orchestrator::EndReadOnlyLocked(const std::string& why) {
  if (!read_only_) return;
  read_only_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  std::fprintf(stderr, "cxlkv-orchestrator: read-only mode of domain '%s' ended: %s\n",
               config_.etcd.domain.c_str(), why.c_str());
}

std::string Orchestrator::ReadOnlySinceLocked() const {
  if (!read_only_) return "";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(read_only_since_unix_ms_),
                          absl::UTCTimeZone());
}

std::string Orchestrator::RoleLocked() {
  if (ha_ == nullptr) return "single";
  if (ServingLocked().ok()) return "leader";
  return read_only_ ? "read-only" : "standby";
}

absl::StatusOr<std::vector<std::string>> Orchestrator::CandidatesInEtcd() {
  if (ha_ == nullptr) return std::vector<std::string>();
  return ha_->Candidates();
}

std::int64_t Orchestrator::LeaderEpochLocked() const {
  return ha_ == nullptr ? 0 : ha_->stats().leader_epoch;
}

std::string Orchestrator::LeaderLocked() const {
  if (ha_ == nullptr) return "";
  return ha_->stats().leader;
}

bool Orchestrator::OwnerBatchMayRunLocked() {
  if (ha_ == nullptr) return true;
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

void Orchestrator::EndBatchLocked() {
  if (ha_ == nullptr || !leading_) return;
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

absl::Status Orchestrator::AwaitRelease(const LeaderTerm& t) {
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

absl::Status Orchestrator::fatal() {
  absl::MutexLock l(&mu_);
  return fatal_;
}

void Orchestrator::ReleaseLocked() {
  if (claimed_epoch_ == 0 || claimed_epoch_ == released_epoch_) return;
  co::OwnerReleaseLine r{};
  r.epoch = static_cast<std::uint64_t>(claimed_epoch_);
  r.cluster_id = claimed_cluster_;
  r.at_ms = clock_->NowMs();
  r.by = co::kReleasedByLeader;
  r.node = co::Crc32c(config_.etcd.node.data(), config_.etcd.node.size());
  // The unfenced view: the gate is closed by now, and this is the one store a deposed leader
  // must still make.
  ReleaseTerm(*domain_mem_, domain_region_->size_bytes(), r);
  released_epoch_ = claimed_epoch_;
  if (agent_ != nullptr) agent_->Released(claimed_epoch_);
}

std::string Orchestrator::StateOlderThanTheDomain(const std::string& source,
                                                  const DomainState& state,
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

std::uint32_t Orchestrator::KeysHash() const {
  const std::string where = ha_->where();
  return std::max<std::uint32_t>(1, co::Crc32c(where.data(), where.size()));
}

absl::StatusOr<std::int64_t> Orchestrator::DomainEpoch(const LeaderTerm& t) {
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

absl::Status Orchestrator::TakeOver(const LeaderTerm& t) {
  const absl::Time elected = absl::Now();
  // 0. Every store of the previous term is in memory and none follows (docs/ha.md "Release").
  if (auto st = AwaitRelease(t); !st.ok()) return st;
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
  } else if (auto st = Format(*fenced_mem_, config_, domain_region_->size_bytes()); !st.ok()) {
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
  // 3. The prefix owner, on the fenced view of the domain, and the state.
  auto owner = co::PrefixOwner::Open(*fenced_mem_, *clock_);
  if (!owner.ok()) return owner.status();
  for (const NamespaceConfig& n : config_.namespaces) {
    (*owner)->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
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

void Orchestrator::LeadLmcache(std::int64_t revision) {
  // The coordinator's state is in etcd beside the domain's (orchestrator/lmcache/); an error
  // leaves it answering 503 with the reason while the domain is led as usual.
  coordinator::EtcdPlace place;
  place.endpoints = config_.etcd.endpoints;
  place.domain_key = ha_->where();
  place.call_timeout_ms = config_.etcd.call_timeout_ms;
  place.user = config_.etcd.user;
  place.password = config_.etcd.password;
  place.ca_pem = config_.etcd.ca_pem;
  place.cert_pem = config_.etcd.cert_pem;
  place.key_pem = config_.etcd.key_pem;
  auto store = coordinator::EtcdStateStore(place, revision);
  if (!store.ok()) {
    std::fprintf(stderr, "cxlkv-orchestrator: lmcache: %s\n",
                 std::string(store.status().message()).c_str());
    return;
  }
  (void)lmcache_->Lead(*std::move(store), [this] { return ha_->WriteAllowed(); });
}

void Orchestrator::StepDown(const std::string& why) {
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
  read_only_ = false;
  leading_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  std::fprintf(stderr, "cxlkv-orchestrator: no longer the leader of domain '%s': %s\n",
               config_.etcd.domain.c_str(), why.c_str());
  ReleaseLocked();
}

void Orchestrator::Stop() {
  if (stop_.exchange(true)) return;
  if (announcer_ != nullptr) announcer_->Stop();
  // First: a leader steps down and revokes its lease, so a standby takes over at once.
  if (ha_ != nullptr) ha_->Stop();
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (owner_thread_.joinable()) owner_thread_.join();
  // Only a socket nothing answers on (this daemon's, now closed): one another process bound
  // there since is left alone.
  if (listen_fd_ >= 0) {
    auto stale = SocketIsStale(config_.socket);
    if (stale.ok() && *stale) ::unlink(config_.socket.c_str());
  }
  lmcache_.reset();
}

}  // namespace cxlkv::orchestrator
