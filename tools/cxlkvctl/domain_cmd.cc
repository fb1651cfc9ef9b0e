// cxlkvctl status|hosts|extents|prefixes|drain HOST|evict NS: the orchestrator's view of a
// CXL domain, over its gRPC control plane on a Unix socket.
#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.h"
#include "cxlkv/orchestrator/endpoint.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::ctl {
namespace {

namespace pb = ::cxlkv::orchestrator::v1;

struct DomainOptions {
  std::string socket;
  bool json = false;
};

std::string DefaultSocket() {
  const char* env = std::getenv("CXLKV_ORCHESTRATOR_SOCKET");
  return env != nullptr ? env : "/run/cxlkv/orchestrator.sock";
}

[[noreturn]] void Fail(const std::string& what, const grpc::Status& st, const std::string& socket) {
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
      st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::fprintf(stderr,
                 "cxlkvctl %s: no orchestrator answers on %s (%s); start cxlkv-orchestrator "
                 "or pass --socket / CXLKV_ORCHESTRATOR_SOCKET\n",
                 what.c_str(), socket.c_str(), st.error_message().c_str());
  } else {
    std::fprintf(stderr, "cxlkvctl %s: %s\n", what.c_str(), st.error_message().c_str());
  }
  throw CLI::RuntimeError(kExitError);
}

template <typename Req, typename Rep, typename Call>
Rep Invoke(const DomainOptions& o, const std::string& what, const Req& req, Call call) {
  auto endpoint = cxlkv::orchestrator::ResolveEndpoint(o.socket);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "cxlkvctl %s: %s\n", what.c_str(),
                 std::string(endpoint.status().message()).c_str());
    throw CLI::RuntimeError(kExitError);
  }
  auto channel = grpc::CreateChannel(endpoint->target, endpoint->credentials);
  auto stub = pb::Orchestrator::NewStub(channel);
  grpc::ClientContext ctx;
  endpoint->Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  Rep rep;
  const grpc::Status st = call(*stub, &ctx, req, &rep);
  if (!st.ok()) Fail(what, st, o.socket);
  return rep;
}

bool PrintJson(const DomainOptions& o, const google::protobuf::Message& m) {
  if (!o.json) return false;
  std::string out;
  google::protobuf::util::JsonPrintOptions p;
  p.add_whitespace = true;
  p.always_print_primitive_fields = true;
  p.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, p);
  std::printf("%s", out.c_str());
  return true;
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
    auto r = Invoke<pb::StatusRequest, pb::StatusReply>(
        *o, "status", pb::StatusRequest{},
        [](auto& s, auto* c, auto& q, auto* p) { return s.Status(c, q, p); });
    if (PrintJson(*o, r)) return;
    std::printf("pool       %s (%llu MiB)\n", r.pool_spec().c_str(),
                static_cast<unsigned long long>(r.pool_bytes() >> 20));
    std::printf("extents    %u of %llu MiB: %u assigned, %u free, %u quarantined\n",
                r.extents_total(), static_cast<unsigned long long>(r.extent_bytes() >> 20),
                r.extents_assigned(), r.extents_free(), r.extents_quarantined());
    std::printf("hosts      %u live, %u fenced\n", r.hosts_live(), r.hosts_fenced());
    std::printf("prefixes   %llu published (domain %s); %llu duplicates, %llu reclaimed, %llu evicted\n",
                static_cast<unsigned long long>(r.prefixes_published()), r.domain_spec().c_str(),
                static_cast<unsigned long long>(r.prefix_duplicates()),
                static_cast<unsigned long long>(r.prefixes_reclaimed()),
                static_cast<unsigned long long>(r.prefixes_evicted()));
    std::printf("uptime     %.1f s; %llu extent assignments restored at start\n",
                static_cast<double>(r.uptime_ms()) / 1000.0,
                static_cast<unsigned long long>(r.recovered_at_start()));
  });
  Sub(app, "hosts", "hosts of the domain: incarnation, state, heartbeat age, extents", o)->callback([o] {
    auto r = Invoke<pb::HostsRequest, pb::HostsReply>(
        *o, "hosts", pb::HostsRequest{},
        [](auto& s, auto* c, auto& q, auto* p) { return s.Hosts(c, q, p); });
    if (PrintJson(*o, r)) return;
    std::printf("%-5s %-11s %-9s %-10s %-8s %-12s %s\n", "HOST", "INCARNATION", "STATE",
                "HEARTBEAT", "EXTENTS", "USED", "NAME");
    for (const auto& h : r.hosts()) {
      std::printf("%-5u %-11llu %-9s %-10s %-8u %-12llu %s\n", h.host_id(),
                  static_cast<unsigned long long>(h.incarnation()), h.state().c_str(),
                  (std::to_string(h.last_heartbeat_ms_ago()) + " ms").c_str(), h.extents(),
                  static_cast<unsigned long long>(h.used_bytes()), h.hostname().c_str());
    }
  });
  Sub(app, "extents", "every extent of the pooled region and who holds it", o)->callback([o] {
    auto r = Invoke<pb::ExtentsRequest, pb::ExtentsReply>(
        *o, "extents", pb::ExtentsRequest{},
        [](auto& s, auto* c, auto& q, auto* p) { return s.Extents(c, q, p); });
    if (PrintJson(*o, r)) return;
    // Quarantined: HOST is the former holder, LEASE LEFT the time before it may be lent
    // again at the earliest, ARENA the arena whose published blocks still hold it.
    std::printf("%-7s %-14s %-10s %-11s %-5s %-11s %-10s %s\n", "EXTENT", "OFFSET", "LENGTH",
                "STATE", "HOST", "INCARNATION", "LEASE LEFT", "ARENA");
    for (const auto& e : r.extents()) {
      const bool free = e.state() == "free";
      std::printf("%-7u %-14llu %-10llu %-11s %-5s %-11s %-10s %s\n", e.index(),
                  static_cast<unsigned long long>(e.offset()),
                  static_cast<unsigned long long>(e.length()), e.state().c_str(),
                  free ? "-" : std::to_string(e.host_id()).c_str(),
                  free ? "-" : std::to_string(e.incarnation()).c_str(),
                  free ? "-" : (std::to_string(e.expires_in_ms()) + " ms").c_str(),
                  e.arena().empty() ? "-" : e.arena().c_str());
    }
  });
  auto limit = std::make_shared<unsigned>(50);
  CLI::App* pre = Sub(app, "prefixes", "shared prefix index entries (published and retired)", o);
  pre->add_option("--limit", *limit, "entries to list (0: all)")->default_val(50);
  pre->callback([o, limit] {
    pb::PrefixesRequest q;
    q.set_limit(*limit);
    auto r = Invoke<pb::PrefixesRequest, pb::PrefixesReply>(
        *o, "prefixes", q, [](auto& s, auto* c, auto& qq, auto* p) { return s.Prefixes(c, qq, p); });
    if (PrintJson(*o, r)) return;
    std::printf("%u published, %u retired\n", r.published(), r.retired());
    std::printf("%-7s %-10s %-18s %-34s %-9s %s\n", "ENTRY", "STATE", "NAMESPACE", "KEY",
                "PUBLISHER", "BLOCK");
    for (const auto& p : r.prefixes()) {
      std::printf("%-7u %-10s %016llx   %-34s %-9u %u\n", p.entry(), p.state().c_str(),
                  static_cast<unsigned long long>(p.ns()), p.key().c_str(), p.publisher(),
                  p.block_index());
    }
  });
  auto host = std::make_shared<unsigned>(0);
  CLI::App* drain = Sub(app, "drain", "stop a host growing and ask it to give its extents back", o);
  drain->add_option("HOST", *host, "host id")->required();
  drain->callback([o, host] {
    pb::DrainRequest q;
    q.set_host_id(*host);
    auto r = Invoke<pb::DrainRequest, pb::DrainReply>(
        *o, "drain", q, [](auto& s, auto* c, auto& qq, auto* p) { return s.Drain(c, qq, p); });
    if (PrintJson(*o, r)) return;
    std::printf("host %u: draining\n", *host);
  });
  auto ns = std::make_shared<std::string>();
  CLI::App* evict = Sub(app, "evict", "retire every shared prefix of a namespace", o);
  evict->add_option("NS", *ns, "namespace as tenant/model/layout (a [[namespace]] of the config)")
      ->required();
  evict->callback([o, ns] {
    pb::EvictRequest q;
    q.set_ns(*ns);
    auto r = Invoke<pb::EvictRequest, pb::EvictReply>(
        *o, "evict", q, [](auto& s, auto* c, auto& qq, auto* p) { return s.Evict(c, qq, p); });
    if (PrintJson(*o, r)) return;
    std::printf("%s: %u prefixes retired\n", ns->c_str(), r.retired());
  });
}

}  // namespace cxlkv::ctl
