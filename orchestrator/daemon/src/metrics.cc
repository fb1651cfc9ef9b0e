// The daemon's Prometheus endpoint (metrics.h).
#include "metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "ha.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

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
  return MetricsListenRefused(listen, absl::StrCat("bind: ", base::ErrnoText(err)));
}

struct Metrics::Ha {
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
        latency_hist(prometheus::BuildHistogram()
                         .Name("cxlkv_ha_etcd_request_seconds")
                         .Help("etcd request latency (keep-alives, campaigns, state reads and "
                               "writes)")
                         .Register(r)
                         .Add({}, prometheus::Histogram::BucketBoundaries{5e-4, 1e-3, 2.5e-3, 5e-3,
                                                                          1e-2, 2.5e-2, 5e-2, 0.1,
                                                                          0.25, 0.5, 1, 2.5})),
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

Metrics::Metrics(const std::string& listen)
    : listen_(listen),
      exposer_(listen),
      registry_(std::make_shared<prometheus::Registry>()),
      extents_(prometheus::BuildGauge()
                   .Name("cxlkv_extents")
                   .Help("Extents of the pooled region by state")
                   .Register(*registry_)),
      capacity_(prometheus::BuildGauge()
                    .Name("cxlkv_capacity_bytes")
                    .Help("Pooled capacity by state")
                    .Register(*registry_)),
      hosts_(
          prometheus::BuildGauge().Name("cxlkv_hosts").Help("Hosts by state").Register(*registry_)),
      host_used_(prometheus::BuildGauge()
                     .Name("cxlkv_host_used_bytes")
                     .Help("Bytes each host reports in use")
                     .Register(*registry_)),
      host_extents_(prometheus::BuildGauge()
                        .Name("cxlkv_host_extents")
                        .Help("Extents each host holds")
                        .Register(*registry_)),
      host_lease_events_(prometheus::BuildGauge()
                             .Name("cxlkv_host_lease_events")
                             .Help("What a busy or stopped machine cost each host's leases, "
                                   "as the host counts them since its process joined: "
                                   "leases_refused_late, copies_discarded, copies_retried, "
                                   "leases_retaken, pauses_detected, rejoins_after_fence")
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
      step_hist_(step_.Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 5e-5, 1e-4, 5e-4, 1e-3,
                                                                       5e-3, 1e-2, 5e-2})),
      hits_(traffic_.Add({{"result", "hit"}})),
      misses_(traffic_.Add({{"result", "miss"}})) {
  exposer_.RegisterCollectable(registry_);
}

Metrics::~Metrics() {
  const std::vector<int> ports = exposer_.GetListeningPorts();
  if (!ports.empty()) wake_.emplace(listen_.substr(0, listen_.rfind(':')), ports.front());
}

void Metrics::Update(const DomainState& s, const co::PrefixOwner& o, std::uint64_t extent_bytes) {
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
    const std::pair<const char*, std::uint64_t> lease[] = {
        {"leases_refused_late", hi.lease.leases_refused_late},
        {"copies_discarded", hi.lease.copies_discarded},
        {"copies_retried", hi.lease.copies_retried},
        {"leases_retaken", hi.lease.leases_retaken},
        {"pauses_detected", hi.lease.pauses_detected},
        {"rejoins_after_fence", hi.lease.rejoins_after_fence}};
    for (const auto& [event, n] : lease) {
      host_lease_events_.Add({{"host", std::to_string(h)}, {"event", event}})
          .Set(static_cast<double>(n));
    }
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

void Metrics::UpdateHa(const HaStats& h, const HaView& v) {
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

void Metrics::Traffic(std::uint64_t hits, std::uint64_t misses) {
  hits_.Increment(static_cast<double>(hits));
  misses_.Increment(static_cast<double>(misses));
}

}  // namespace cxlkv::orchestrator
