#include "peers/etcd_client.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"

#if CXLKV_BENCH_HAVE_ETCD_GRPC
#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#endif

namespace cxlkv::bench {

#if CXLKV_BENCH_HAVE_ETCD_GRPC

namespace {

constexpr auto kRpcDeadline = std::chrono::seconds(5);

absl::Status FromGrpc(absl::string_view what, const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd ", what, ": ", s.error_message()));
}

// Every unary call gets a deadline.
void SetDeadline(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
}

using KeepAliveStream = grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                                 etcdserverpb::LeaseKeepAliveResponse>;

}  // namespace

struct EtcdLeaseClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<grpc::ClientContext> stream_context;
  std::unique_ptr<KeepAliveStream> stream;

  ~Impl() {
    if (stream != nullptr) {
      stream_context->TryCancel();
      stream->Finish().ok();  // CANCELLED: expected
    }
  }
};

EtcdLeaseClient::EtcdLeaseClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdLeaseClient::~EtcdLeaseClient() = default;

absl::StatusOr<std::unique_ptr<EtcdLeaseClient>> EtcdLeaseClient::Connect(int port) {
  grpc::ChannelArguments args;
  // Channels with equal arguments would share one connection through the global subchannel
  // pool; each client (each benchmark thread) is meant to be a separate etcd client.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto impl = std::make_unique<Impl>();
  impl->channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                            grpc::InsecureChannelCredentials(), args);
  if (!impl->channel->WaitForConnected(std::chrono::system_clock::now() + kRpcDeadline)) {
    return absl::UnavailableError(absl::StrCat("etcd: no gRPC connection to 127.0.0.1:", port));
  }
  impl->lease = etcdserverpb::Lease::NewStub(impl->channel);
  impl->maintenance = etcdserverpb::Maintenance::NewStub(impl->channel);
  return std::unique_ptr<EtcdLeaseClient>(new EtcdLeaseClient(std::move(impl)));
}

absl::StatusOr<std::string> EtcdLeaseClient::ServerVersion() {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  etcdserverpb::StatusResponse resp;
  const grpc::Status s = impl_->maintenance->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
  if (!s.ok()) return FromGrpc("Status", s);
  if (resp.leader() == 0) return absl::UnavailableError("etcd Status: no leader yet");
  return resp.version();
}

absl::StatusOr<std::int64_t> EtcdLeaseClient::Grant(std::int64_t ttl_s) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  const grpc::Status s = impl_->lease->LeaseGrant(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc("LeaseGrant", s);
  if (!resp.error().empty()) return absl::InternalError("etcd LeaseGrant: " + resp.error());
  return resp.id();
}

absl::Status EtcdLeaseClient::KeepAliveOnce(std::int64_t id) {
  if (impl_->stream == nullptr) {
    // No deadline: the stream lives as long as the client, as clientv3's does.
    impl_->stream_context = std::make_unique<grpc::ClientContext>();
    impl_->stream = impl_->lease->LeaseKeepAlive(impl_->stream_context.get());
  }
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  if (!impl_->stream->Write(req) || !impl_->stream->Read(&resp)) {
    const grpc::Status s = impl_->stream->Finish();
    impl_->stream.reset();
    return FromGrpc("LeaseKeepAlive stream", s);
  }
  if (resp.id() != id || resp.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd LeaseKeepAlive: lease ", id, " answered id ",
                                            resp.id(), " ttl ", resp.ttl()));
  }
  return absl::OkStatus();
}

absl::Status EtcdLeaseClient::Revoke(std::int64_t id) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  const grpc::Status s = impl_->lease->LeaseRevoke(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc("LeaseRevoke", s);
  return absl::OkStatus();
}

std::string EtcdLeaseClient::Version() {
  return absl::StrCat("gRPC ", grpc::Version(), ", protobuf ",
                      google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION));
}

#else  // !CXLKV_BENCH_HAVE_ETCD_GRPC

struct EtcdLeaseClient::Impl {};
constexpr char kNoGrpc[] =
    "lease_benchmark was built without the etcd gRPC client (needs libgrpc++-dev, "
    "protobuf-compiler-grpc, libprotobuf-dev, protobuf-compiler and golang-etcd-server-dev "
    "for etcd's .proto files; install them and reconfigure)";

EtcdLeaseClient::EtcdLeaseClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdLeaseClient::~EtcdLeaseClient() = default;
absl::StatusOr<std::unique_ptr<EtcdLeaseClient>> EtcdLeaseClient::Connect(int) {
  return absl::FailedPreconditionError(kNoGrpc);
}
absl::StatusOr<std::string> EtcdLeaseClient::ServerVersion() {
  return absl::FailedPreconditionError(kNoGrpc);
}
absl::StatusOr<std::int64_t> EtcdLeaseClient::Grant(std::int64_t) {
  return absl::FailedPreconditionError(kNoGrpc);
}
absl::Status EtcdLeaseClient::KeepAliveOnce(std::int64_t) {
  return absl::FailedPreconditionError(kNoGrpc);
}
absl::Status EtcdLeaseClient::Revoke(std::int64_t) {
  return absl::FailedPreconditionError(kNoGrpc);
}
std::string EtcdLeaseClient::Version() { return kNoGrpc; }

#endif  // CXLKV_BENCH_HAVE_ETCD_GRPC

}  // namespace cxlkv::bench
