// OperatorClient: the operator's queries and actions, one RPC each, as plain structs.
#include "cxlkv/orchestrator/operator_client.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "cxlkv/orchestrator/endpoint.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;

struct OperatorClient::Rpc {
  Endpoint endpoint;
  std::chrono::milliseconds deadline{0};
  std::unique_ptr<pb::Orchestrator::Stub> stub;

  // One call: the endpoint's token, the deadline, and no wait_for_ready (an operator asking
  // a domain whose orchestrator is down hears so at once). The daemon's status is passed
  // on unchanged: its message already names the object.
  template <typename Req, typename Rep, typename Call>
  absl::Status Invoke(const Req& req, Rep* rep, Call call) {
    grpc::ClientContext ctx;
    endpoint.Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    const grpc::Status st = call(*stub, &ctx, req, rep);
    if (st.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  }
};

OperatorClient::OperatorClient(std::unique_ptr<Rpc> rpc) : rpc_(std::move(rpc)) {}
OperatorClient::~OperatorClient() = default;

absl::StatusOr<std::unique_ptr<OperatorClient>> OperatorClient::Connect(
    const std::string& where, std::chrono::milliseconds deadline) {
  auto endpoint = ResolveEndpoint(where);
  if (!endpoint.ok()) return endpoint.status();
  auto rpc = std::make_unique<Rpc>();
  rpc->endpoint = *std::move(endpoint);
  rpc->deadline = deadline;
  rpc->stub = pb::Orchestrator::NewStub(
      grpc::CreateChannel(rpc->endpoint.target, rpc->endpoint.credentials));
  return std::unique_ptr<OperatorClient>(new OperatorClient(std::move(rpc)));
}

absl::StatusOr<DomainStatus> OperatorClient::Status() {
  pb::StatusReply r;
  if (auto st = rpc_->Invoke(pb::StatusRequest{}, &r,
                             [](auto& s, auto* c, auto& q, auto* p) { return s.Status(c, q, p); });
      !st.ok()) {
    return st;
  }
  DomainStatus d;
  d.domain_spec = r.domain_spec();
  d.pool_spec = r.pool_spec();
  d.pool_bytes = r.pool_bytes();
  d.extent_bytes = r.extent_bytes();
  d.extents_total = r.extents_total();
  d.extents_free = r.extents_free();
  d.extents_assigned = r.extents_assigned();
  d.hosts_live = r.hosts_live();
  d.hosts_fenced = r.hosts_fenced();
  d.prefixes_published = r.prefixes_published();
  d.prefix_duplicates = r.prefix_duplicates();
  d.prefixes_reclaimed = r.prefixes_reclaimed();
  d.prefixes_evicted = r.prefixes_evicted();
  d.uptime_ms = r.uptime_ms();
  d.recovered_at_start = r.recovered_at_start();
  d.extents_quarantined = r.extents_quarantined();
  d.role = r.role();
  d.epoch = r.epoch();
  d.leader = r.leader();
  d.standbys.assign(r.standbys().begin(), r.standbys().end());
  d.read_only_since = r.read_only_since();
  d.unmatched_namespaces.assign(r.unmatched_namespaces().begin(), r.unmatched_namespaces().end());
  return d;
}

absl::StatusOr<std::vector<HostView>> OperatorClient::Hosts() {
  pb::HostsReply r;
  if (auto st = rpc_->Invoke(pb::HostsRequest{}, &r,
                             [](auto& s, auto* c, auto& q, auto* p) { return s.Hosts(c, q, p); });
      !st.ok()) {
    return st;
  }
  std::vector<HostView> out;
  out.reserve(static_cast<std::size_t>(r.hosts_size()));
  for (const pb::Host& h : r.hosts()) {
    HostView v{h.host_id(), h.incarnation(), h.state(),   h.last_heartbeat_ms_ago(),
               h.extents(), h.used_bytes(),  h.hostname()};
    v.lease.leases_refused_late = h.lease().leases_refused_late();
    v.lease.copies_discarded = h.lease().copies_discarded();
    v.lease.copies_retried = h.lease().copies_retried();
    v.lease.leases_retaken = h.lease().leases_retaken();
    v.lease.pauses_detected = h.lease().pauses_detected();
    v.lease.rejoins_after_fence = h.lease().rejoins_after_fence();
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<ExtentDetail>> OperatorClient::Extents() {
  pb::ExtentsReply r;
  if (auto st = rpc_->Invoke(pb::ExtentsRequest{}, &r,
                             [](auto& s, auto* c, auto& q, auto* p) { return s.Extents(c, q, p); });
      !st.ok()) {
    return st;
  }
  std::vector<ExtentDetail> out;
  out.reserve(static_cast<std::size_t>(r.extents_size()));
  for (const pb::Extent& e : r.extents()) {
    ExtentDetail d;
    d.index = e.index();
    d.offset = e.offset();
    d.length = e.length();
    d.host = e.host_id();
    d.state = e.state();
    d.incarnation = e.incarnation();
    d.expires_in_ms = e.expires_in_ms();
    d.arena = e.arena();
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<PrefixList> OperatorClient::Prefixes(std::uint32_t limit) {
  pb::PrefixesRequest q;
  q.set_limit(limit);
  pb::PrefixesReply r;
  if (auto st = rpc_->Invoke(
          q, &r, [](auto& s, auto* c, auto& qq, auto* p) { return s.Prefixes(c, qq, p); });
      !st.ok()) {
    return st;
  }
  PrefixList out;
  out.published = r.published();
  out.retired = r.retired();
  out.prefixes.reserve(static_cast<std::size_t>(r.prefixes_size()));
  for (const pb::Prefix& p : r.prefixes()) {
    out.prefixes.push_back(
        PrefixView{p.entry(), p.state(), p.ns(), p.key(), p.publisher(), p.block_index()});
  }
  return out;
}

absl::Status OperatorClient::Drain(std::uint32_t host_id) {
  pb::DrainRequest q;
  q.set_host_id(host_id);
  pb::DrainReply r;
  return rpc_->Invoke(q, &r, [](auto& s, auto* c, auto& qq, auto* p) { return s.Drain(c, qq, p); });
}

absl::StatusOr<std::uint32_t> OperatorClient::Evict(const std::string& ns) {
  pb::EvictRequest q;
  q.set_ns(ns);
  pb::EvictReply r;
  if (auto st = rpc_->Invoke(q, &r,
                             [](auto& s, auto* c, auto& qq, auto* p) { return s.Evict(c, qq, p); });
      !st.ok()) {
    return st;
  }
  return r.retired();
}

}  // namespace cxlkv::orchestrator
