// The etcd v3 client: unary KV and lease calls with endpoint failover.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "channels.h"

namespace cxlkv::orchestrator::etcd {

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

pb::Compare ToPb(const Compare& c) {
  pb::Compare out;
  out.set_key(c.key);
  switch (c.result) {
    case Compare::Result::kEqual:
      out.set_result(pb::Compare::EQUAL);
      break;
    case Compare::Result::kGreater:
      out.set_result(pb::Compare::GREATER);
      break;
    case Compare::Result::kLess:
      out.set_result(pb::Compare::LESS);
      break;
    case Compare::Result::kNotEqual:
      out.set_result(pb::Compare::NOT_EQUAL);
      break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out.set_target(pb::Compare::VERSION);
      out.set_version(c.number);
      break;
    case Compare::Target::kCreateRevision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out.set_target(pb::Compare::VALUE);
      out.set_value(c.value);
      break;
    case Compare::Target::kLease:
      out.set_target(pb::Compare::LEASE);
      out.set_lease(c.number);
      break;
  }
  return out;
}

pb::RequestOp ToPb(const Op& op) {
  pb::RequestOp out;
  switch (op.kind) {
    case Op::Kind::kGet: {
      pb::RangeRequest* r = out.mutable_request_range();
      r->set_key(op.key);
      r->set_range_end(op.range_end);
      break;
    }
    case Op::Kind::kPut: {
      pb::PutRequest* r = out.mutable_request_put();
      r->set_key(op.key);
      r->set_value(op.value);
      r->set_lease(op.lease);
      break;
    }
    case Op::Kind::kDelete: {
      pb::DeleteRangeRequest* r = out.mutable_request_delete_range();
      r->set_key(op.key);
      r->set_range_end(op.range_end);
      break;
    }
  }
  return out;
}

OpResult OpFromPb(const pb::ResponseOp& r) {
  OpResult out;
  if (r.has_response_range()) {
    out.kind = Op::Kind::kGet;
    out.header = FromPb(r.response_range().header());
    for (const auto& kv : r.response_range().kvs()) out.kvs.push_back(FromPb(kv));
  } else if (r.has_response_put()) {
    out.kind = Op::Kind::kPut;
    out.header = FromPb(r.response_put().header());
  } else if (r.has_response_delete_range()) {
    out.kind = Op::Kind::kDelete;
    out.header = FromPb(r.response_delete_range().header());
    out.deleted = r.response_delete_range().deleted();
  }
  return out;
}

absl::Status ValidateEndpoint(const std::string& e) {
  const std::size_t colon = e.rfind(':');
  std::uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(e).substr(colon + 1), &port) || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", e, "' is not host:port (for example \"127.0.0.1:2379\")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key: etcd reads "\0" as "to the end"
}

Client::Client(const ClientOptions& options)
    : options_(options), ch_(std::make_unique<Channels>()) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoints (give at least one host:port)");
  }
  for (const std::string& e : options.endpoints) {
    if (auto st = ValidateEndpoint(e); !st.ok()) return st;
  }
  if (options.ca_pem.empty() && (!options.cert_pem.empty() || !options.key_pem.empty())) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate without the CA that signs the members' certificates: give "
        "the CA too (TLS)");
  }
  if (options.cert_pem.empty() != options.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate needs both the certificate and its key");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.ca_pem;
    ssl.pem_cert_chain = options.cert_pem;
    ssl.pem_private_key = options.key_pem;
    creds = grpc::SslCredentials(ssl);
  }
  auto auth = std::make_shared<AuthState>();
  auth->user = options.user;
  auth->password = options.password;
  std::unique_ptr<Client> c(new Client(options));
  for (const std::string& e : options.endpoints) {
    grpc::ChannelArguments args;
    // A member that comes back is tried again soon: gRPC's default backoff grows to two
    // minutes, longer than any session TTL here. The minimum is also the time one connection
    // attempt (TCP and HTTP/2 handshakes) may take: not so short that a busy machine never
    // completes one.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // etcd's state may be up to 1.5 MiB a request; replies of a range scan can be larger.
    args.SetMaxReceiveMessageSize(64 << 20);
    Channels::Member m;
    m.endpoint = e;
    m.channel = grpc::CreateCustomChannel(e, creds, args);
    m.kv = pb::KV::NewStub(m.channel);
    m.lease = pb::Lease::NewStub(m.channel);
    m.watch = pb::Watch::NewStub(m.channel);
    m.maintenance = pb::Maintenance::NewStub(m.channel);
    m.auth = pb::Auth::NewStub(m.channel);
    m.auth_state = auth;
    c->ch_->members.push_back(std::move(m));
  }
  return c;
}

absl::Status Authenticate(const Client::Channels::Member& m,
                          std::chrono::system_clock::time_point deadline) {
  if (m.auth_state == nullptr || m.auth_state->user.empty()) return absl::OkStatus();
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  ctx.set_wait_for_ready(true);
  pb::AuthenticateRequest req;
  req.set_name(m.auth_state->user);
  req.set_password(m.auth_state->password);
  pb::AuthenticateResponse rep;
  const grpc::Status st = m.auth->Authenticate(&ctx, req, &rep);
  if (!st.ok()) {
    absl::Status out = FromGrpc(st, m.endpoint, "Authenticate");
    if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return absl::PermissionDeniedError(
          absl::StrCat(out.message(), " (as etcd user '", m.auth_state->user,
                       "': check etcd.user and etcd.password_file, and that etcd has this user)"));
    }
    return out;
  }
  absl::MutexLock l(&m.auth_state->mu);
  m.auth_state->token = rep.token();
  return absl::OkStatus();
}

namespace {

// One call over the members, starting at `*current`: each attempt bounded by the attempt
// timeout and the call's deadline. An endpoint failure moves *current on; `retry` tries the
// next members too (idempotent calls only).
absl::Status CallMembers(
    const Client::Channels& ch, std::atomic<std::size_t>* current, const ClientOptions& o,
    std::uint32_t timeout_ms, bool retry, const char* what,
    const std::function<grpc::Status(const Client::Channels::Member&, grpc::ClientContext*)>& fn) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(timeout_ms == 0 ? o.call_timeout_ms : timeout_ms);
  const std::size_t n = ch.members.size();
  const std::size_t start = current->load();
  absl::Status last = absl::DeadlineExceededError(
      absl::StrCat("etcd: ", what, ": no time left to try any endpoint"));
  for (std::size_t attempt = 0; attempt < (retry ? n : 1); ++attempt) {
    const std::size_t idx = (start + attempt) % n;
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) break;
    const auto attempt_deadline =
        std::min(deadline, now + std::chrono::milliseconds(o.attempt_timeout_ms));
    const Client::Channels::Member& m = ch.members[idx];
    grpc::Status st;
    // With etcd authentication: a token first, and a new one when etcd refuses it.
    for (int auth_try = 0; auth_try < 2; ++auth_try) {
      if (!o.user.empty()) {
        bool need = auth_try > 0;
        {
          absl::MutexLock l(&m.auth_state->mu);
          need = need || m.auth_state->token.empty();
        }
        if (need) {
          if (absl::Status a = Authenticate(m, attempt_deadline); !a.ok()) {
            st = grpc::Status(static_cast<grpc::StatusCode>(a.code()), std::string(a.message()));
            break;
          }
        }
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(attempt_deadline);
      // Waits through a connection being (re)made instead of failing at once, and keeps this
      // thread polling gRPC meanwhile: with the synchronous API a connection's handshake makes
      // progress only while some call waits on it. The attempt's deadline bounds the wait.
      ctx.set_wait_for_ready(true);
      m.Authorize(&ctx);
      st = fn(m, &ctx);
      if (o.user.empty() || !AuthFailure(st)) break;
    }
    if (st.ok()) {
      current->store(idx);
      return absl::OkStatus();
    }
    last = FromGrpc(st, ch.members[idx].endpoint, what);
    if (!EndpointFailure(st)) return last;
    // The next call starts at the next member (unless another thread moved on already).
    std::size_t expected = idx;
    current->compare_exchange_strong(expected, (idx + 1) % n);
  }
  return last;
}

}  // namespace

absl::StatusOr<RangeResult> Client::Get(const std::string& key, const std::string& range_end) {
  pb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  pb::RangeResponse rep;
  const absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/true, "Range",
                                      [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                        rep.Clear();
                                        return m.kv->Range(ctx, req, &rep);
                                      });
  if (!st.ok()) return st;
  RangeResult out;
  out.header = FromPb(rep.header());
  out.more = rep.more();
  out.count = rep.count();
  for (const auto& kv : rep.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

absl::StatusOr<Header> Client::Put(const std::string& key, const std::string& value,
                                   std::int64_t lease) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse rep;
  const absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/false, "Put",
                                      [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                        return m.kv->Put(ctx, req, &rep);
                                      });
  if (!st.ok()) return st;
  return FromPb(rep.header());
}

absl::StatusOr<std::int64_t> Client::Delete(const std::string& key, const std::string& range_end) {
  pb::DeleteRangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  pb::DeleteRangeResponse rep;
  const absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/false, "DeleteRange",
                                      [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                        return m.kv->DeleteRange(ctx, req, &rep);
                                      });
  if (!st.ok()) return st;
  return rep.deleted();
}

absl::StatusOr<TxnResult> Client::Txn(const std::vector<Compare>& compares,
                                      const std::vector<Op>& success,
                                      const std::vector<Op>& failure) {
  pb::TxnRequest req;
  for (const Compare& c : compares) *req.add_compare() = ToPb(c);
  for (const Op& op : success) *req.add_success() = ToPb(op);
  for (const Op& op : failure) *req.add_failure() = ToPb(op);
  pb::TxnResponse rep;
  const absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/false, "Txn",
                                      [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                        return m.kv->Txn(ctx, req, &rep);
                                      });
  if (!st.ok()) return st;
  TxnResult out;
  out.header = FromPb(rep.header());
  out.succeeded = rep.succeeded();
  for (const auto& r : rep.responses()) out.results.push_back(OpFromPb(r));
  return out;
}

absl::StatusOr<Lease> Client::GrantLease(std::int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse rep;
  const absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/false, "LeaseGrant",
                                      [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                        return m.lease->LeaseGrant(ctx, req, &rep);
                                      });
  if (!st.ok()) return st;
  if (!rep.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd: LeaseGrant: ", rep.error()));
  }
  return Lease{rep.id(), rep.ttl()};
}

absl::StatusOr<std::int64_t> Client::KeepAliveOnce(std::int64_t lease, std::uint32_t timeout_ms) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  pb::LeaseKeepAliveResponse rep;
  // A stream per round trip: one request, one answer, then the stream is closed. etcd's own
  // client keeps one stream open; at one keep-alive a second the difference does not matter,
  // and a fresh stream per call gets a deadline per call and fails over like any other call.
  const absl::Status st =
      CallMembers(*ch_, &current_, options_, timeout_ms, /*retry=*/true, "LeaseKeepAlive",
                  [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                    auto stream = m.lease->LeaseKeepAlive(ctx);
                    if (!stream->Write(req) || !stream->Read(&rep)) {
                      const grpc::Status fin = stream->Finish();
                      return fin.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                     "keep-alive stream closed without an answer")
                                      : fin;
                    }
                    stream->WritesDone();
                    const grpc::Status fin = stream->Finish();
                    // The answer arrived; how the stream ended after it does not matter.
                    (void)fin;
                    return grpc::Status::OK;
                  });
  if (!st.ok()) return st;
  if (rep.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd: lease ", absl::Hex(lease), " is gone (expired or revoked)"));
  }
  return rep.ttl();
}

absl::Status Client::RevokeLease(std::int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse rep;
  absl::Status st = CallMembers(*ch_, &current_, options_, 0, /*retry=*/true, "LeaseRevoke",
                                [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                                  return m.lease->LeaseRevoke(ctx, req, &rep);
                                });
  if (absl::IsNotFound(st)) return absl::OkStatus();  // already gone: what was wanted
  return st;
}

absl::StatusOr<std::int64_t> Client::LeaseTimeToLive(std::int64_t lease) {
  pb::LeaseTimeToLiveRequest req;
  req.set_id(lease);
  pb::LeaseTimeToLiveResponse rep;
  const absl::Status st =
      CallMembers(*ch_, &current_, options_, 0, /*retry=*/true, "LeaseTimeToLive",
                  [&](const Channels::Member& m, grpc::ClientContext* ctx) {
                    return m.lease->LeaseTimeToLive(ctx, req, &rep);
                  });
  if (!st.ok()) return st;
  if (rep.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd: lease ", absl::Hex(lease), " is gone (expired or revoked)"));
  }
  return rep.ttl();
}

absl::StatusOr<std::unique_ptr<Watch>> Client::NewWatch(const std::string& key,
                                                        const std::string& range_end,
                                                        std::int64_t start_revision, bool prev_kv) {
  pb::WatchCreateRequest create;
  create.set_key(key);
  create.set_range_end(range_end);
  create.set_start_revision(start_revision);
  create.set_prev_kv(prev_kv);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.call_timeout_ms);
  const std::size_t n = ch_->members.size();
  const std::size_t start = current_.load();
  absl::Status last = absl::DeadlineExceededError("etcd: Watch: no time left to try any endpoint");
  for (std::size_t attempt = 0; attempt < n; ++attempt) {
    const std::size_t idx = (start + attempt) % n;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (!options_.user.empty()) {
      bool need = false;
      {
        absl::MutexLock l(&ch_->members[idx].auth_state->mu);
        need = ch_->members[idx].auth_state->token.empty();
      }
      if (need) {
        last = Authenticate(ch_->members[idx], std::chrono::system_clock::now() + left);
        if (!last.ok()) {
          if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last)) return last;
          continue;
        }
      }
    }
    auto w = OpenWatch(ch_->members[idx], create,
                       std::min(left, std::chrono::milliseconds(options_.attempt_timeout_ms)));
    if (w.ok()) {
      current_.store(idx);
      return w;
    }
    last = w.status();
    if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last)) return last;
    std::size_t expected = idx;
    current_.compare_exchange_strong(expected, (idx + 1) % n);
  }
  return last;
}

absl::StatusOr<MemberStatus> Client::Status(std::size_t endpoint_index) {
  if (endpoint_index >= ch_->members.size()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd: no endpoint #", endpoint_index));
  }
  const Channels::Member& m = ch_->members[endpoint_index];
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(options_.attempt_timeout_ms));
  ctx.set_wait_for_ready(true);  // as in CallMembers
  m.Authorize(&ctx);
  pb::StatusRequest req;
  pb::StatusResponse rep;
  const grpc::Status st = m.maintenance->Status(&ctx, req, &rep);
  if (!st.ok()) return FromGrpc(st, m.endpoint, "Status");
  MemberStatus out;
  out.header = FromPb(rep.header());
  out.version = rep.version();
  out.leader = rep.leader();
  out.raft_term = rep.raftterm();
  out.raft_index = rep.raftindex();
  return out;
}

}  // namespace cxlkv::orchestrator::etcd
