// HostClient: join, heartbeats, capacity, rejoin after fencing.
#include "cxlkv/orchestrator/client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/endpoint.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;

namespace {
absl::Status FromGrpc(const grpc::Status& st, absl::string_view what) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat(what, ": ", st.error_message()));
}
// Every call waits (up to its deadline) for the channel to connect: an orchestrator that is
// restarting is expected, and gRPC would otherwise fail at once while it backs off.
std::unique_ptr<grpc::ClientContext> Ctx(const Endpoint& e, int timeout_ms = 2000) {
  auto c = std::make_unique<grpc::ClientContext>();
  e.Authorize(c.get());
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  c->set_wait_for_ready(true);
  return c;
}
}  // namespace

struct HostClient::Rpc {
  Endpoint endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Orchestrator::Stub> stub;
};

HostClient::HostClient(std::unique_ptr<Rpc> rpc, std::uint32_t host, HostClientOptions options)
    : rpc_(std::move(rpc)), host_(host), options_(std::move(options)) {}

std::int64_t HostClient::NowMs() const {
  if (options_.clock) return options_.clock().mono_ms;
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::unique_ptr<HostClient>> HostClient::Connect(const std::string& socket,
                                                                std::uint32_t host_id,
                                                                HostClientOptions options) {
  auto rpc = std::make_unique<Rpc>();
  // Reconnect fast: gRPC's default backoff (1 s and growing) after an orchestrator restart
  // would outlast host_ttl, and the host would be fenced for the orchestrator's absence.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto endpoint = ResolveEndpoint(socket);
  if (!endpoint.ok()) return endpoint.status();
  rpc->endpoint = *std::move(endpoint);
  rpc->channel = grpc::CreateCustomChannel(rpc->endpoint.target, rpc->endpoint.credentials, args);
  rpc->stub = pb::Orchestrator::NewStub(rpc->channel);
  std::unique_ptr<HostClient> c(new HostClient(std::move(rpc), host_id, std::move(options)));
  if (auto st = c->Join(); !st.ok()) return st;
  return c;
}

absl::Status HostClient::Join() {
  pb::JoinRequest req;
  req.set_host_id(host_);
  char name[64] = {};
  ::gethostname(name, sizeof(name) - 1);
  req.set_hostname(absl::StrCat(name, " pid ", ::getpid()));
  pb::JoinReply rep;
  auto ctx = Ctx(rpc_->endpoint);
  ctx->set_wait_for_ready(true);
  const auto sent = NowMs();
  if (auto st = FromGrpc(rpc_->stub->Join(ctx.get(), req, &rep), "join"); !st.ok()) {
    if ((absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) &&
        absl::StartsWith(rpc_->endpoint.target, "unix:")) {
      // A daemon closes a connection from a uid it does not allow before answering anything.
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", rpc_->endpoint.target,
                                                  ": no orchestrator answered; if one runs, "
                                                  "check that it allows uid ", ::geteuid(),
                                                  " in rpc.allowed_uids)"));
    }
    return st;
  }
  absl::MutexLock l(&mu_);
  incarnation_ = rep.incarnation();
  extents_.clear();
  period_ms_ = rep.heartbeat_period_ms();
  host_ttl_ms_ = rep.host_ttl_ms();
  domain_spec_ = rep.domain_spec();
  pool_spec_ = rep.pool_spec();
  extent_bytes_ = rep.extent_bytes();
  valid_until_ms_ = sent;  // nothing held yet
  draining_ = false;
  return absl::OkStatus();
}

absl::Status HostClient::HeartbeatOnce() {
  pb::HeartbeatRequest req;
  req.set_host_id(host_);
  req.set_incarnation(incarnation());
  if (counters_) {
    const HostCounters hc = counters_();
    req.set_used_bytes(hc.used_bytes);
    req.set_prefix_hits(hc.prefix_hits);
    req.set_prefix_misses(hc.prefix_misses);
  }
  pb::HeartbeatReply rep;
  const std::int64_t sent = NowMs();
  auto ctx = Ctx(rpc_->endpoint, static_cast<int>(period_ms_ * 2));
  if (auto st = FromGrpc(rpc_->stub->Heartbeat(ctx.get(), req, &rep), "heartbeat"); !st.ok()) {
    return st;  // the orchestrator is down: extents stay valid until their lease ends
  }
  if (options_.before_heartbeat_applied) options_.before_heartbeat_applied();
  if (rep.fenced()) {
    ++rejoins_;
    return Join();
  }
  absl::MutexLock l(&mu_);
  draining_ = rep.draining();
  extents_.clear();
  std::int64_t min_left = INT64_MAX;
  for (const pb::Extent& e : rep.extents()) {
    extents_.push_back(GrantedExtent{e.index(), e.offset(), e.length()});
    min_left = std::min(min_left, e.expires_in_ms());
  }
  // The lease counts from the send time; a quarter is kept as margin for clock drift.
  if (!extents_.empty()) valid_until_ms_ = sent + min_left * 3 / 4;
  return absl::OkStatus();
}

void HostClient::StartHeartbeats(std::function<HostCounters()> counters) {
  counters_ = std::move(counters);
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      (void)HeartbeatOnce();
      for (std::uint32_t t = 0; t < period_ms_ && !stop_.load(); t += 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::uint32_t>(10, period_ms_)));
      }
    }
  });
}

absl::StatusOr<std::vector<GrantedExtent>> HostClient::Grow(std::uint32_t n) {
  pb::GrowRequest req;
  req.set_host_id(host_);
  req.set_incarnation(incarnation());
  req.set_extents(n);
  pb::GrowReply rep;
  const std::int64_t sent = NowMs();
  auto ctx = Ctx(rpc_->endpoint);
  if (auto st = FromGrpc(rpc_->stub->Grow(ctx.get(), req, &rep), "grow"); !st.ok()) return st;
  std::vector<GrantedExtent> got;
  absl::MutexLock l(&mu_);
  std::int64_t min_left = INT64_MAX;
  for (const pb::Extent& e : rep.granted()) {
    got.push_back(GrantedExtent{e.index(), e.offset(), e.length()});
    extents_.push_back(got.back());
    min_left = std::min(min_left, e.expires_in_ms());
  }
  if (!got.empty()) valid_until_ms_ = std::max(valid_until_ms_, sent + min_left * 3 / 4);
  return got;
}

absl::Status HostClient::Shrink(const std::vector<std::uint32_t>& ext) {
  pb::ShrinkRequest req;
  req.set_host_id(host_);
  req.set_incarnation(incarnation());
  for (std::uint32_t i : ext) req.add_extents(i);
  pb::ShrinkReply rep;
  auto ctx = Ctx(rpc_->endpoint);
  if (auto st = FromGrpc(rpc_->stub->Shrink(ctx.get(), req, &rep), "shrink"); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  std::erase_if(extents_, [&](const GrantedExtent& g) {
    return std::find(ext.begin(), ext.end(), g.index) != ext.end();
  });
  return absl::OkStatus();
}

absl::Status HostClient::Leave() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (left_) return absl::OkStatus();
  left_ = true;
  pb::LeaveRequest req;
  req.set_host_id(host_);
  req.set_incarnation(incarnation());
  pb::LeaveReply rep;
  auto ctx = Ctx(rpc_->endpoint);
  return FromGrpc(rpc_->stub->Leave(ctx.get(), req, &rep), "leave");
}

absl::StatusOr<std::vector<ExtentView>> HostClient::ListExtents() {
  pb::ExtentsRequest req;
  pb::ExtentsReply rep;
  auto ctx = Ctx(rpc_->endpoint);
  if (auto st = FromGrpc(rpc_->stub->Extents(ctx.get(), req, &rep), "extents"); !st.ok()) return st;
  std::vector<ExtentView> out;
  out.reserve(static_cast<std::size_t>(rep.extents_size()));
  for (const pb::Extent& e : rep.extents()) {
    out.push_back(ExtentView{e.index(), e.offset(), e.length(), e.host_id(), e.state()});
  }
  return out;
}

bool HostClient::Holds(std::uint32_t extent) const {
  absl::MutexLock l(&mu_);
  for (const GrantedExtent& g : extents_) {
    if (g.index == extent) return true;
  }
  return false;
}

HostClient::~HostClient() { (void)Leave(); }

std::uint64_t HostClient::incarnation() const {
  absl::MutexLock l(&mu_);
  return incarnation_;
}

std::vector<GrantedExtent> HostClient::extents() const {
  absl::MutexLock l(&mu_);
  return extents_;
}

bool HostClient::ExtentsValid() const {
  absl::MutexLock l(&mu_);
  return NowMs() <= valid_until_ms_;
}

}  // namespace cxlkv::orchestrator
