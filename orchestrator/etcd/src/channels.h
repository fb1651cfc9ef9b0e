// The gRPC side of the etcd client (private to orchestrator/etcd): one channel and its stubs
// per endpoint, and conversions from etcd's messages.
#ifndef CXLKV_ORCHESTRATOR_ETCD_SRC_CHANNELS_H_
#define CXLKV_ORCHESTRATOR_ETCD_SRC_CHANNELS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/etcd.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace cxlkv::orchestrator::etcd {

namespace pb = ::etcdserverpb;

// etcd authentication: the user's token, shared by every member's calls.
struct AuthState {
  std::string user, password;  // "" user: no authentication
  absl::Mutex mu;
  std::string token ABSL_GUARDED_BY(mu);
};

struct Client::Channels {
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Maintenance::Stub> maintenance;
    std::unique_ptr<pb::Auth::Stub> auth;
    std::shared_ptr<AuthState> auth_state;
    // Adds the user's token to a call (nothing without authentication).
    void Authorize(grpc::ClientContext* ctx) const {
      if (auth_state == nullptr || auth_state->user.empty()) return;
      absl::MutexLock l(&auth_state->mu);
      if (!auth_state->token.empty()) ctx->AddMetadata("token", auth_state->token);
    }
  };
  std::vector<Member> members;
};

// Gets a new token for the user from `m` (Auth.Authenticate) by `deadline`. OK without
// authentication.
absl::Status Authenticate(const Client::Channels::Member& m,
                          std::chrono::system_clock::time_point deadline);

// etcd says the call's token is missing or no longer valid (expired, or etcd restarted with
// simple tokens): worth authenticating again.
inline bool AuthFailure(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         st.error_message().find("invalid auth token") != std::string::npos ||
         st.error_message().find("user name is empty") != std::string::npos;
}

inline Header FromPb(const pb::ResponseHeader& h) {
  return Header{h.cluster_id(), h.member_id(), h.revision(), h.raft_term()};
}

inline KeyValue FromPb(const ::mvccpb::KeyValue& kv) {
  return KeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                  kv.mod_revision(), kv.version(), kv.lease()};
}

// A gRPC status as an absl one (the codes are the same numbers), naming the endpoint and call.
inline absl::Status FromGrpc(const grpc::Status& st, const std::string& endpoint,
                             const char* what) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat("etcd ", endpoint, ": ", what, ": ", st.error_message()));
}

// A failure that says nothing about the request, only that this endpoint did not answer in
// time or cannot be reached (or has no raft leader now): worth trying another member.
inline bool EndpointFailure(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Opens a watch stream on one member and waits up to `wait` for etcd to confirm it (watch.cc).
absl::StatusOr<std::unique_ptr<Watch>> OpenWatch(const Client::Channels::Member& member,
                                                 const pb::WatchCreateRequest& create,
                                                 std::chrono::milliseconds wait);

}  // namespace cxlkv::orchestrator::etcd

#endif  // CXLKV_ORCHESTRATOR_ETCD_SRC_CHANNELS_H_
