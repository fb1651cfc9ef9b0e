// cxlkvctl status|hosts|extents|prefixes|drain HOST|evict NS: the orchestrator's view of a
// CXL domain, over its control plane (the client library's OperatorClient).
#include <sys/un.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "commands.h"
#include "cxlkv/orchestrator/operator_client.h"
#include "wire_json.h"

namespace cxlkv::ctl {
namespace {

namespace orch = ::cxlkv::orchestrator;

struct DomainOptions {
  std::string socket;
  bool json = false;
};

std::string DefaultSocket() {
  const char* env = std::getenv("CXLKV_ORCHESTRATOR_SOCKET");
  return env != nullptr ? env : "/run/cxlkv/orchestrator.sock";
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& st, const std::string& socket) {
  if (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) {
    std::fprintf(stderr,
                 "cxlkvctl %s: no orchestrator answers on %s (%s); start cxlkv-orchestrator "
                 "or pass --socket / CXLKV_ORCHESTRATOR_SOCKET\n",
                 what.c_str(), socket.c_str(), std::string(st.message()).c_str());
  } else {
    std::fprintf(stderr, "cxlkvctl %s: %s\n", what.c_str(), std::string(st.message()).c_str());
  }
  throw CLI::RuntimeError(kExitError);
}

// Connects to the orchestrator `o` names and makes one call; its result, or the failure
// printed (the endpoint's error as it is, a call's with the hint above) and exit 1.
template <typename Call>
auto Invoke(const DomainOptions& o, const std::string& what, Call call) {
  // A Unix socket path longer than sun_path holds cannot be reached: say so here (gRPC would
  // log twice and fail with "Failed to create secure client channel").
  for (absl::string_view one : absl::StrSplit(o.socket, ',')) {
    if (absl::StartsWith(one, "tcp:")) continue;
    const absl::string_view path = absl::StripPrefix(one, "unix:");
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      std::fprintf(stderr,
                   "cxlkvctl %s: --socket '%.*s' is %zu bytes; a Unix socket path holds at most "
                   "%zu: pass a shorter path (e.g. a symlink to the socket's directory, "
                   "then DIR/SOCKET)\n",
                   what.c_str(), static_cast<int>(path.size()), path.data(), path.size(),
                   sizeof(sockaddr_un::sun_path) - 1);
      throw CLI::RuntimeError(kExitError);
    }
  }
  auto client = orch::OperatorClient::Connect(o.socket);
  if (!client.ok()) {
    std::fprintf(stderr, "cxlkvctl %s: %s\n", what.c_str(),
                 std::string(client.status().message()).c_str());
    throw CLI::RuntimeError(kExitError);
  }
  auto result = call(**client);
  if constexpr (std::is_same_v<decltype(result), absl::Status>) {
    if (!result.ok()) Fail(what, result, o.socket);
  } else {
    if (!result.ok()) Fail(what, result.status(), o.socket);
    return *std::move(result);
  }
}

bool PrintJson(const DomainOptions& o, const WireJson& j) {
  if (!o.json) return false;
  std::printf("%s", j.Dump().c_str());
  return true;
}

WireJson ExtentJson(const orch::ExtentDetail& e) {
  WireJson j;
  j.U32("index", e.index).U64("offset", e.offset).U64("length", e.length);
  j.U32("host_id", e.host).U64("incarnation", e.incarnation).I64("expires_in_ms", e.expires_in_ms);
  j.Str("state", e.state).Str("arena", e.arena);
  return j;
}

CLI::App* Sub(CLI::App& app, const char* name, const char* help,
              const std::shared_ptr<DomainOptions>& o) {
  CLI::App* s = app.add_subcommand(name, help);
  s->add_option("--socket", o->socket,
                "the orchestrator's Unix socket, or tcp:HOST:PORT (token from CXLKV_RPC_TOKEN_FILE, "
                "TLS if CXLKV_RPC_CA names the CA's PEM)")
      ->default_val(DefaultSocket());
  s->add_flag("--json", o->json, "print JSON");
  return s;
}

}  // namespace

void AddDomainCommands(CLI::App& app) {
  auto o = std::make_shared<DomainOptions>();
  Sub(app, "status", "the domain at a glance: capacity, hosts, prefixes", o)->callback([o] {
    const orch::DomainStatus r = Invoke(*o, "status", [](auto& c) { return c.Status(); });
    WireJson j;
    j.Str("domain_spec", r.domain_spec).Str("pool_spec", r.pool_spec);
    j.U64("pool_bytes", r.pool_bytes).U64("extent_bytes", r.extent_bytes);
    j.U32("extents_total", r.extents_total).U32("extents_free", r.extents_free);
    j.U32("extents_assigned", r.extents_assigned);
    j.U32("hosts_live", r.hosts_live).U32("hosts_fenced", r.hosts_fenced);
    j.U64("prefixes_published", r.prefixes_published);
    j.U64("prefix_duplicates", r.prefix_duplicates);
    j.U64("prefixes_reclaimed", r.prefixes_reclaimed);
    j.U64("prefixes_evicted", r.prefixes_evicted);
    j.I64("uptime_ms", r.uptime_ms).U64("recovered_at_start", r.recovered_at_start);
    j.U32("extents_quarantined", r.extents_quarantined);
    j.Str("role", r.role).I64("epoch", r.epoch).Str("leader", r.leader);
    j.StrList("standbys", r.standbys).Str("read_only_since", r.read_only_since);
    j.StrList("unmatched_namespaces", r.unmatched_namespaces);
    // What busy or stopped machines cost the hosts' leases, summed over the hosts (per host:
    // cxlkvctl hosts; docs/coherence.md, "Busy hosts"). A standby answers status but not
    // hosts: then there is nothing to sum (its leader's status has the figures).
    cxlkv::coherence::PrefixHost::Stats lease;
    std::vector<orch::HostView> hosts;
    if (auto client = orch::OperatorClient::Connect(o->socket); client.ok()) {
      if (auto got = (*client)->Hosts(); got.ok()) hosts = *std::move(got);
    }
    for (const orch::HostView& h : hosts) {
      lease.leases_refused_late += h.lease.leases_refused_late;
      lease.copies_discarded += h.lease.copies_discarded;
      lease.copies_retried += h.lease.copies_retried;
      lease.pauses_detected += h.lease.pauses_detected;
      lease.rejoins_after_fence += h.lease.rejoins_after_fence;
    }
    j.U64("leases_refused_late", lease.leases_refused_late)
        .U64("copies_discarded", lease.copies_discarded)
        .U64("copies_retried", lease.copies_retried)
        .U64("pauses_detected", lease.pauses_detected)
        .U64("rejoins_after_fence", lease.rejoins_after_fence);
    if (PrintJson(*o, j)) return;
    if (r.role != "single" && !r.role.empty()) {
      // Orchestrator HA (docs/ha.md): who leads, at which epoch, and who stands by.
      std::printf("role       %s%s\n", r.role.c_str(),
                  r.read_only_since.empty() ? ""
                                            : (" since " + r.read_only_since +
                                               " (etcd unreachable: heartbeats and reads only)")
                                                  .c_str());
      std::printf("leader     %s\n", r.leader.empty() ? "none elected" : r.leader.c_str());
      std::printf("epoch      %lld\n", static_cast<long long>(r.epoch));
      std::printf("standbys   %zu%s\n", r.standbys.size(), r.standbys.empty() ? "" : ":");
      for (const std::string& s : r.standbys) std::printf("           %s\n", s.c_str());
    }
    std::printf("pool       %s (%llu MiB)\n", r.pool_spec.c_str(),
                static_cast<unsigned long long>(r.pool_bytes >> 20));
    std::printf("extents    %u of %llu MiB: %u assigned, %u free, %u quarantined\n",
                r.extents_total, static_cast<unsigned long long>(r.extent_bytes >> 20),
                r.extents_assigned, r.extents_free, r.extents_quarantined);
    std::printf("hosts      %u live, %u fenced\n", r.hosts_live, r.hosts_fenced);
    if (r.role != "standby") {
      std::printf(
          "leases     %llu acquires refused late, %llu copies discarded, %llu retried, %llu "
          "pauses, %llu fences (the hosts' counts; per host: cxlkvctl hosts)\n",
          static_cast<unsigned long long>(lease.leases_refused_late),
          static_cast<unsigned long long>(lease.copies_discarded),
          static_cast<unsigned long long>(lease.copies_retried),
          static_cast<unsigned long long>(lease.pauses_detected),
          static_cast<unsigned long long>(lease.rejoins_after_fence));
    }
    std::printf(
        "prefixes   %llu published (domain %s); %llu duplicates, %llu reclaimed, %llu evicted\n",
        static_cast<unsigned long long>(r.prefixes_published), r.domain_spec.c_str(),
        static_cast<unsigned long long>(r.prefix_duplicates),
        static_cast<unsigned long long>(r.prefixes_reclaimed),
        static_cast<unsigned long long>(r.prefixes_evicted));
    std::printf("uptime     %.1f s; %llu extent assignments restored at start\n",
                static_cast<double>(r.uptime_ms) / 1000.0,
                static_cast<unsigned long long>(r.recovered_at_start));
    for (const std::string& n : r.unmatched_namespaces) {
      std::printf(
          "warning    [[namespace]] %s matched no published block while other namespaces "
          "did: check its tenant, model and layout against the names the hosts build\n",
          n.c_str());
    }
  });
  Sub(app, "hosts", "hosts of the domain: incarnation, state, heartbeat age, extents", o)
      ->callback([o] {
        const auto hosts = Invoke(*o, "hosts", [](auto& c) { return c.Hosts(); });
        std::vector<WireJson> list;
        list.reserve(hosts.size());
        for (const orch::HostView& h : hosts) {
          WireJson j;
          j.U32("host_id", h.host_id).U64("incarnation", h.incarnation).Str("state", h.state);
          j.I64("last_heartbeat_ms_ago", h.last_heartbeat_ms_ago).U32("extents", h.extents);
          j.U64("used_bytes", h.used_bytes).Str("hostname", h.hostname);
          j.U64("leases_refused_late", h.lease.leases_refused_late)
              .U64("copies_discarded", h.lease.copies_discarded)
              .U64("copies_retried", h.lease.copies_retried)
              .U64("leases_retaken", h.lease.leases_retaken)
              .U64("pauses_detected", h.lease.pauses_detected)
              .U64("rejoins_after_fence", h.lease.rejoins_after_fence);
          list.push_back(std::move(j));
        }
        if (PrintJson(*o, WireJson().List("hosts", std::move(list)))) return;
        // LATE: acquires refused for want of an acknowledged heartbeat; DISCARDED / RETRIED:
        // copies that did not validate / were made again under a lease taken again; PAUSES,
        // FENCES: the host's clock stood still / it stopped beating (docs/coherence.md, "Busy
        // hosts"). Counted by each host since its process joined.
        std::printf("%-5s %-11s %-9s %-10s %-8s %-12s %-5s %-9s %-7s %-6s %-6s %s\n", "HOST",
                    "INCARNATION", "STATE", "HEARTBEAT", "EXTENTS", "USED", "LATE", "DISCARDED",
                    "RETRIED", "PAUSES", "FENCES", "NAME");
        for (const orch::HostView& h : hosts) {
          std::printf(
              "%-5u %-11llu %-9s %-10s %-8u %-12llu %-5llu %-9llu %-7llu %-6llu %-6llu %s\n",
              h.host_id, static_cast<unsigned long long>(h.incarnation), h.state.c_str(),
              (std::to_string(h.last_heartbeat_ms_ago) + " ms").c_str(), h.extents,
              static_cast<unsigned long long>(h.used_bytes),
              static_cast<unsigned long long>(h.lease.leases_refused_late),
              static_cast<unsigned long long>(h.lease.copies_discarded),
              static_cast<unsigned long long>(h.lease.copies_retried),
              static_cast<unsigned long long>(h.lease.pauses_detected),
              static_cast<unsigned long long>(h.lease.rejoins_after_fence), h.hostname.c_str());
        }
      });
  Sub(app, "extents", "every extent of the pooled region and who holds it", o)->callback([o] {
    const auto extents = Invoke(*o, "extents", [](auto& c) { return c.Extents(); });
    std::vector<WireJson> list;
    list.reserve(extents.size());
    for (const orch::ExtentDetail& e : extents) list.push_back(ExtentJson(e));
    if (PrintJson(*o, WireJson().List("extents", std::move(list)))) return;
    // Quarantined: HOST is the former holder, LEASE LEFT the time before it may be lent
    // again at the earliest, ARENA the arena whose published blocks still hold it.
    std::printf("%-7s %-14s %-10s %-11s %-5s %-11s %-10s %s\n", "EXTENT", "OFFSET", "LENGTH",
                "STATE", "HOST", "INCARNATION", "LEASE LEFT", "ARENA");
    for (const orch::ExtentDetail& e : extents) {
      const bool free = e.state == "free";
      std::printf("%-7u %-14llu %-10llu %-11s %-5s %-11s %-10s %s\n", e.index,
                  static_cast<unsigned long long>(e.offset),
                  static_cast<unsigned long long>(e.length), e.state.c_str(),
                  free ? "-" : std::to_string(e.host).c_str(),
                  free ? "-" : std::to_string(e.incarnation).c_str(),
                  free ? "-" : (std::to_string(e.expires_in_ms) + " ms").c_str(),
                  e.arena.empty() ? "-" : e.arena.c_str());
    }
  });
  auto limit = std::make_shared<unsigned>(50);
  CLI::App* pre = Sub(app, "prefixes", "shared prefix index entries (published and retired)", o);
  pre->add_option("--limit", *limit, "entries to list (0: all)")->default_val(50);
  pre->callback([o, limit] {
    const orch::PrefixList r = Invoke(*o, "prefixes", [&](auto& c) { return c.Prefixes(*limit); });
    std::vector<WireJson> list;
    list.reserve(r.prefixes.size());
    for (const orch::PrefixView& p : r.prefixes) {
      WireJson j;
      j.U32("entry", p.entry).Str("state", p.state).U64("ns", p.ns).Str("key", p.key);
      j.U32("publisher", p.publisher).U32("block_index", p.block_index);
      list.push_back(std::move(j));
    }
    WireJson j;
    j.List("prefixes", std::move(list)).U32("published", r.published).U32("retired", r.retired);
    if (PrintJson(*o, j)) return;
    std::printf("%u published, %u retired\n", r.published, r.retired);
    std::printf("%-7s %-10s %-18s %-34s %-9s %s\n", "ENTRY", "STATE", "NAMESPACE", "KEY",
                "PUBLISHER", "BLOCK");
    for (const orch::PrefixView& p : r.prefixes) {
      std::printf("%-7u %-10s %016llx   %-34s %-9u %u\n", p.entry, p.state.c_str(),
                  static_cast<unsigned long long>(p.ns), p.key.c_str(), p.publisher, p.block_index);
    }
  });
  auto host = std::make_shared<unsigned>(0);
  CLI::App* drain = Sub(app, "drain", "stop a host growing and ask it to give its extents back", o);
  drain->add_option("HOST", *host, "host id")->required();
  drain->callback([o, host] {
    Invoke(*o, "drain", [&](auto& c) { return c.Drain(*host); });
    if (PrintJson(*o, WireJson())) return;
    std::printf("host %u: draining\n", *host);
  });
  auto ns = std::make_shared<std::string>();
  CLI::App* evict = Sub(app, "evict", "retire every shared prefix of a namespace", o);
  evict->add_option("NS", *ns, "namespace as tenant/model/layout (a [[namespace]] of the config)")
      ->required();
  evict->callback([o, ns] {
    const std::uint32_t retired = Invoke(*o, "evict", [&](auto& c) { return c.Evict(*ns); });
    if (PrintJson(*o, WireJson().U32("retired", retired))) return;
    std::printf("%s: %u prefixes retired\n", ns->c_str(), retired);
  });
}

}  // namespace cxlkv::ctl
