// DirectoryClient: the Directory RPC, tried on each endpoint in turn.
#include "cxlkv/orchestrator/directory_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/endpoint.h"
#include "directory.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace dpb = ::cxlkv::orchestrator::directory::v1;

struct DirectoryClient::Rpc {
  Endpoint endpoint;
  std::chrono::milliseconds deadline{0};
  std::unique_ptr<dpb::Directory::Stub> stub;
};

DirectoryClient::DirectoryClient(std::vector<std::unique_ptr<Rpc>> rpcs) : rpcs_(std::move(rpcs)) {}
DirectoryClient::~DirectoryClient() = default;

absl::StatusOr<std::unique_ptr<DirectoryClient>> DirectoryClient::Connect(
    const std::string& where, std::chrono::milliseconds deadline) {
  std::vector<std::unique_ptr<Rpc>> rpcs;
  for (absl::string_view one : absl::StrSplit(where, ',', absl::SkipWhitespace())) {
    auto endpoint = ResolveEndpoint(std::string(one));
    if (!endpoint.ok()) return endpoint.status();
    auto rpc = std::make_unique<Rpc>();
    rpc->endpoint = *std::move(endpoint);
    rpc->deadline = deadline;
    rpc->stub = dpb::Directory::NewStub(
        grpc::CreateChannel(rpc->endpoint.target, rpc->endpoint.credentials));
    rpcs.push_back(std::move(rpc));
  }
  if (rpcs.empty()) {
    return absl::InvalidArgumentError(
        "directory: no orchestrator endpoint given (a socket path, unix:PATH or tcp:HOST:PORT, "
        "several separated by commas)");
  }
  return std::unique_ptr<DirectoryClient>(new DirectoryClient(std::move(rpcs)));
}

absl::StatusOr<WhereResult> DirectoryClient::Where(const coherence::PrefixKey& key) {
  dpb::WhereRequest req;
  req.set_key_lo(key.lo);
  req.set_key_hi(key.hi);
  absl::Status last;
  for (const auto& rpc : rpcs_) {
    grpc::ClientContext ctx;
    rpc->endpoint.Authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + rpc->deadline);
    dpb::WhereReply rep;
    const grpc::Status st = rpc->stub->Where(&ctx, req, &rep);
    if (!st.ok()) {
      last = absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          absl::StrCat(rpc->endpoint.Describe(), ": ", st.error_message()));
      // Only a missing or silent orchestrator sends the call on; its own refusal is final.
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
          st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return last;
      }
      continue;
    }
    WhereResult r;
    r.revision = rep.revision();
    for (const dpb::DomainAnswer& a : rep.domains()) {
      DomainVerdict v;
      v.domain = a.domain();
      v.may_hold = a.may_hold();
      v.anchor = a.anchor();
      v.published = a.published();
      v.fp_rate = a.fp_rate();
      v.epoch = a.epoch();
      v.age_ms = a.age_ms();
      v.filter_bytes = a.filter_bytes();
      v.keyed = a.keyed();
      v.key_held = !a.keyed() || a.key_held();
      r.domains.push_back(std::move(v));
    }
    return r;
  }
  return last;
}

}  // namespace cxlkv::orchestrator
