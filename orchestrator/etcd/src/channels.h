// The gRPC side of the etcd client (private to orchestrator/etcd): one channel and its stubs
// per endpoint, and conversions from etcd's messages.
#ifndef CXLKV_ORCHESTRATOR_ETCD_SRC_CHANNELS_H_
#define CXLKV_ORCHESTRATOR_ETCD_SRC_CHANNELS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/etcd.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace cxlkv::orchestrator::etcd {

namespace pb = ::etcdserverpb;

struct Client::Channels {
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Maintenance::Stub> maintenance;
  };
  std::vector<Member> members;
};

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
