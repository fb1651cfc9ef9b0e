// The daemon's gRPC service (service.h).
#include "service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/token.h"
#include "domain_core.h"
#include "metrics.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;

namespace {

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

class Service final : public pb::Orchestrator::Service {
 public:
  Service(DomainCore& core, Metrics* metrics, std::int64_t started_ms)
      : core_(core), metrics_(metrics), started_ms_(started_ms) {}

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
                                          core_.config().token)) {
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

  grpc::Status Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                    pb::JoinReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Join(*req, rep));
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    if (metrics_ != nullptr) metrics_->Traffic(req->prefix_hits(), req->prefix_misses());
    return ToGrpc(core_.Heartbeat(*req, rep));
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const pb::LeaveRequest* req,
                     pb::LeaveReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Leave(*req, rep));
  }

  grpc::Status Grow(grpc::ServerContext* ctx, const pb::GrowRequest* req,
                    pb::GrowReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    if (req->extents() > 1024) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "grow by at most 1024 extents a call");
    }
    return ToGrpc(core_.Grow(*req, rep));
  }

  grpc::Status Shrink(grpc::ServerContext* ctx, const pb::ShrinkRequest* req,
                      pb::ShrinkReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Shrink(*req, rep));
  }

  grpc::Status Status(grpc::ServerContext* ctx, const pb::StatusRequest*,
                      pb::StatusReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    // The candidates from etcd, before the lock (etcd may be slow or away; then none listed).
    std::vector<std::string> candidates;
    if (auto c = core_.CandidatesInEtcd(); c.ok()) candidates = *std::move(c);
    core_.Status(candidates, started_ms_, rep);
    return grpc::Status::OK;
  }

  grpc::Status Hosts(grpc::ServerContext* ctx, const pb::HostsRequest*,
                     pb::HostsReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Hosts(rep));
  }

  grpc::Status Extents(grpc::ServerContext* ctx, const pb::ExtentsRequest*,
                       pb::ExtentsReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Extents(rep));
  }

  grpc::Status Prefixes(grpc::ServerContext* ctx, const pb::PrefixesRequest* req,
                        pb::PrefixesReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Prefixes(*req, rep));
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const pb::DrainRequest* req,
                     pb::DrainReply*) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    return ToGrpc(core_.Drain(*req));
  }

  grpc::Status Evict(grpc::ServerContext* ctx, const pb::EvictRequest* req,
                     pb::EvictReply* rep) override {
    if (auto st = Check(ctx); !st.ok()) return st;
    const NamespaceConfig* found = nullptr;
    for (const NamespaceConfig& n : core_.config().namespaces) {
      if (n.Name() == req->ns()) found = &n;
    }
    if (found == nullptr) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no [[namespace]] '", req->ns(),
                                       "' in the config (name it tenant/model/layout)"));
    }
    return ToGrpc(core_.Evict(*found, rep));
  }

 private:
  DomainCore& core_;
  Metrics* metrics_;  // null: no metrics endpoint
  std::int64_t started_ms_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeOrchestratorService(DomainCore& core, Metrics* metrics,
                                                       std::int64_t started_ms) {
  return std::make_unique<Service>(core, metrics, started_ms);
}

}  // namespace cxlkv::orchestrator
