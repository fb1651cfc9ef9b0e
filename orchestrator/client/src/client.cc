// HostClient: join, heartbeats, capacity, rejoin after fencing.
#include "cxlkv/orchestrator/client.h"

#include <grpcpp/grpcpp.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/endpoint.h"
#include "cxlkv/orchestrator/token.h"
#include "etcd_wire.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "nlohmann/json.hpp"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {

namespace pb = ::cxlkv::orchestrator::v1;
namespace ew = ::cxlkv::orchestrator::etcdwire;

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

// Endpoint discovery through etcd (docs/ha.md): the domain's leader key, read with one range
// request per lookup. Only etcd's KV Range method, through gRPC's generic stub on messages
// with etcd's field numbers (etcd_wire.proto): a serving process needs no etcd client.
class LeaderFinder {
 public:
  // spec: the part after etcd:// — EP[,EP...]/DOMAIN or EP[,EP...]/CLUSTER/DOMAIN.
  static absl::StatusOr<std::unique_ptr<LeaderFinder>> Parse(absl::string_view spec) {
    const std::size_t slash = spec.find('/');
    if (slash == absl::string_view::npos || slash == 0 || slash + 1 >= spec.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd://", spec,
          ": give etcd://HOST:PORT[,HOST:PORT...]/DOMAIN or .../CLUSTER/DOMAIN (the domain's "
          "[etcd] endpoints, cluster and domain)"));
    }
    auto f = std::make_unique<LeaderFinder>();
    std::vector<std::string> path = absl::StrSplit(spec.substr(slash + 1), '/');
    if (path.size() > 2 || path.back().empty() || path.front().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd://", spec, ": the path is DOMAIN or CLUSTER/DOMAIN"));
    }
    const std::string cluster = path.size() == 2 ? path[0] : "default";
    f->key_ = absl::StrCat("/cxlkv/v1/", cluster, "/domains/", path.back(), "/leader");
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    // etcd over TLS (CXLKV_ETCD_CA: the CA that signs the members' certificates) and with
    // authentication (CXLKV_ETCD_USER, CXLKV_ETCD_PASSWORD_FILE): docs/ha.md.
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    auto etcd_creds = EtcdCredentialsFromEnv();
    if (!etcd_creds.ok()) return etcd_creds.status();
    if (!etcd_creds->ca_pem.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = etcd_creds->ca_pem;
      creds = grpc::SslCredentials(ssl);
    }
    f->user_ = etcd_creds->user;
    f->password_ = etcd_creds->password;
    for (absl::string_view ep : absl::StrSplit(spec.substr(0, slash), ',', absl::SkipEmpty())) {
      std::string target(absl::StripAsciiWhitespace(ep));
      if (absl::ConsumePrefix(&ep, "http://")) target = std::string(ep);
      f->endpoints_.push_back(target);
      f->channels_.push_back(grpc::CreateCustomChannel(target, creds, args));
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    f->hostname_ = host;
    // With the domain's token, only a leader record sealed with it is called (the token is
    // sent to TCP endpoints: never to one a forged record names).
    if (const char* t = std::getenv("CXLKV_RPC_TOKEN_FILE"); t != nullptr && *t != '\0') {
      auto token = ReadTokenFile(t, "CXLKV_RPC_TOKEN_FILE");
      if (!token.ok()) return token.status();
      f->token_ = *std::move(token);
    }
    return f;
  }

  const std::string& key() const { return key_; }

  // The leader's endpoint as this host can reach it: its Unix socket when it runs on this host
  // (its advertised host name is ours), else its TCP endpoint. Tries each etcd member in turn
  // within timeout_ms.
  absl::StatusOr<std::string> Find(int timeout_ms) ABSL_LOCKS_EXCLUDED(find_mu_) {
    absl::MutexLock find_lock(&find_mu_);  // one lookup at a time: they share etcd's token
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string errors;
    const std::size_t n = channels_.size();
    const std::size_t start = next_.load();
    for (std::size_t attempt = 0; attempt < n; ++attempt) {
      const std::size_t i = (start + attempt) % n;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      const auto attempt_deadline =
          std::chrono::system_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(
                                                 left / static_cast<std::int64_t>(n - attempt), 1));
      ew::RangeRequest req;
      req.set_key(key_);
      ew::RangeResponse rep;
      grpc::Status st;
      // With etcd authentication: a token first, and a new one when etcd refuses it.
      for (int auth_try = 0; auth_try < 2; ++auth_try) {
        if (!user_.empty() && (auth_try > 0 || etcd_token_.empty())) {
          st = Authenticate(i, attempt_deadline);
          if (!st.ok()) break;
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(attempt_deadline);
        if (!etcd_token_.empty()) ctx.AddMetadata("token", etcd_token_);
        st = Unary(channels_[i], "/etcdserverpb.KV/Range", &ctx, req, &rep);
        const bool refused = st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                             absl::StrContains(st.error_message(), "invalid auth token");
        if (user_.empty() || !refused) break;
      }
      if (!st.ok()) {
        absl::StrAppend(&errors, errors.empty() ? "" : "; ", endpoints_[i], ": ",
                        st.error_message());
        if (user_.empty() && absl::StrContains(st.error_message(), "user name is empty")) {
          absl::StrAppend(&errors,
                          " (etcd requires authentication: set CXLKV_ETCD_USER and "
                          "CXLKV_ETCD_PASSWORD_FILE)");
        }
        continue;
      }
      next_.store(i);
      if (rep.kvs_size() == 0) {
        return absl::UnavailableError(absl::StrCat("etcd has no leader for ", key_,
                                                   " right now (an election is under way, or no "
                                                   "orchestrator of the domain runs)"));
      }
      return EndpointOf(rep.kvs(0).value());
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot read ", key_, " from etcd: ", errors.empty() ? "no time left" : errors));
  }

 private:
  absl::StatusOr<std::string> EndpointOf(const std::string& value) const {
    const nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::DataLossError(absl::StrCat(key_, ": not the JSON a leader writes: ", value));
    }
    auto field = [&](const char* name) {
      const auto it = j.find(name);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (!token_.empty()) {
      const std::string mac = field("mac");
      nlohmann::json record = j;
      record.erase("mac");
      const std::string want = LeaderRecordMac(token_, key_, record.dump());
      if (mac.size() != want.size() || !TokenMatches(absl::StrCat("Bearer ", mac), want)) {
        return absl::PermissionDeniedError(absl::StrCat(
            key_, ": the leader record (", value, ") is ",
            mac.empty() ? "not sealed at all" : "sealed with another key",
            ": it is not sealed with this host's domain token (CXLKV_RPC_TOKEN_FILE). A forged "
            "record, or the domain's orchestrators have another rpc.token_file (or none). "
            "Nothing was sent to it. Give the orchestrators and the hosts the same token, and "
            "check who can write etcd (etcd authentication: docs/ha.md)"));
      }
    }
    const std::string socket = field("socket"), endpoint = field("endpoint");
    if (field("host") == hostname_ && !socket.empty()) return socket;
    if (!endpoint.empty()) return absl::StrCat("tcp:", endpoint);
    return absl::FailedPreconditionError(
        absl::StrCat(key_, ": the leader (", value,
                     ") runs on another host and has no TCP endpoint; give "
                     "the orchestrators rpc.tcp"));
  }

  // One unary call through the generic stub, waited for.
  template <class Req, class Rep>
  static grpc::Status Unary(const std::shared_ptr<grpc::Channel>& channel, const char* method,
                            grpc::ClientContext* ctx, const Req& req, Rep* rep) {
    grpc::TemplatedGenericStub<Req, Rep> stub(channel);
    absl::Mutex mu;
    bool done = false;
    grpc::Status st;
    stub.UnaryCall(ctx, method, grpc::StubOptions(), &req, rep, [&](grpc::Status s) {
      absl::MutexLock l(&mu);
      st = std::move(s);
      done = true;
    });
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&done));
    return st;
  }

  // etcd's Auth/Authenticate on member i: the token for the calls that follow.
  grpc::Status Authenticate(std::size_t i, std::chrono::system_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(find_mu_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    ew::AuthenticateRequest req;
    req.set_name(user_);
    req.set_password(password_);
    ew::AuthenticateResponse rep;
    grpc::Status st = Unary(channels_[i], "/etcdserverpb.Auth/Authenticate", &ctx, req, &rep);
    if (!st.ok()) {
      return grpc::Status(
          st.error_code(),
          absl::StrCat("Authenticate as etcd user '", user_, "': ", st.error_message(),
                       " (check CXLKV_ETCD_USER and CXLKV_ETCD_PASSWORD_FILE)"));
    }
    etcd_token_ = rep.token();
    return st;
  }

  std::string key_, hostname_;
  std::string token_;            // the domain's token (CXLKV_RPC_TOKEN_FILE); "" : none given
  std::string user_, password_;  // etcd authentication (CXLKV_ETCD_USER); "" : none
  absl::Mutex find_mu_;
  std::string etcd_token_ ABSL_GUARDED_BY(find_mu_);  // etcd's token for user_, once authenticated
  std::vector<std::string> endpoints_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::atomic<std::size_t> next_{0};  // the etcd member that answered last
};

// The orchestrators the client may call: one, or the candidates of an HA domain
// (docs/ha.md), of which one leads; or, found through etcd, the domain's leader.
struct HostClient::Rpc {
  struct Member {
    Endpoint endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::Orchestrator::Stub> stub;
  };
  std::vector<Member> members;  // the endpoint list (empty with a finder)
  // Discovery through etcd: the leader as last found, replaced when it stops answering.
  std::unique_ptr<LeaderFinder> finder;
  absl::Mutex found_mu;
  std::shared_ptr<Member> found ABSL_GUARDED_BY(found_mu);
  std::string found_where ABSL_GUARDED_BY(found_mu);
  std::atomic<std::uint64_t> leader_changes{0};
  grpc::ChannelArguments args;
  std::atomic<std::size_t> current{0};  // the member that answered last
  // The highest leader epoch a reply carried (HA; 0 without [etcd]). Only grows.
  std::atomic<std::int64_t> seen_epoch{0};

  // A reply's epoch against the highest seen: an error naming both when it is older (a
  // deposed leader answered), else records it.
  absl::Status Accept(std::int64_t epoch, absl::string_view what) {
    std::int64_t seen = seen_epoch.load();
    while (epoch > seen && !seen_epoch.compare_exchange_weak(seen, epoch)) {
    }
    if (epoch >= seen) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        what, ": refused a reply from leader epoch ", epoch, ", older than epoch ", seen,
        " this host has already seen (a deposed orchestrator answered); retry "
        "against the current leader"));
  }

  const Endpoint& endpoint() const { return members[current.load()].endpoint; }

  static absl::StatusOr<std::unique_ptr<Member>> MakeMember(const std::string& where,
                                                            const grpc::ChannelArguments& a) {
    auto endpoint = ResolveEndpoint(where);
    if (!endpoint.ok()) return endpoint.status();
    auto m = std::make_unique<Member>();
    m->endpoint = *std::move(endpoint);
    m->channel = grpc::CreateCustomChannel(m->endpoint.target, m->endpoint.credentials, a);
    m->stub = pb::Orchestrator::NewStub(m->channel);
    return m;
  }

  // Asks etcd for the leader; a new one replaces the member called. Returns whether it
  // changed.
  absl::StatusOr<bool> Rediscover(int timeout_ms) {
    auto where = finder->Find(timeout_ms);
    if (!where.ok()) return where.status();
    {
      absl::MutexLock l(&found_mu);
      if (found != nullptr && *where == found_where) return false;
    }
    auto m = MakeMember(*where, args);
    if (!m.ok()) return m.status();
    absl::MutexLock l(&found_mu);
    found = std::shared_ptr<Member>(*std::move(m));
    found_where = *where;
    leader_changes.fetch_add(1);
    return true;
  }

  // A call to the leader found through etcd: when it does not answer (down, a standby, a
  // deposed leader's older epoch, silent), etcd is asked again and a new leader is called with
  // the time left.
  template <typename Fn, typename EpochFn>
  grpc::Status CallFound(int timeout_ms, Fn fn, EpochFn epoch) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    auto left_ms = [&] {
      return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - std::chrono::steady_clock::now())
                                  .count());
    };
    grpc::Status last(grpc::StatusCode::DEADLINE_EXCEEDED, "no orchestrator answered in time");
    for (int round = 0; round < 2 && left_ms() > 0; ++round) {
      std::shared_ptr<Member> m;
      {
        absl::MutexLock l(&found_mu);
        m = found;
      }
      if (m == nullptr) {
        auto changed = Rediscover(std::max(left_ms() / 2, 1));
        if (!changed.ok()) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              std::string(changed.status().message()));
        }
        continue;
      }
      // The first attempt gets half the time: the rest is for asking etcd and the new leader.
      auto ctx = Ctx(m->endpoint, std::max(round == 0 ? left_ms() / 2 : left_ms(), 1));
      grpc::Status st = fn(*m->stub, ctx.get());
      if (st.ok()) {
        if (auto acc = Accept(epoch(), m->endpoint.Describe()); !acc.ok()) {
          st = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(acc.message()));
        }
      }
      if (st.ok() || (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
                      st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)) {
        return st;
      }
      last = grpc::Status(st.error_code(),
                          absl::StrCat(m->endpoint.Describe(), ": ", st.error_message()));
      if (left_ms() <= 0) break;
      auto changed = Rediscover(std::max(left_ms() / 2, 1));
      if (!changed.ok()) {
        return grpc::Status(last.error_code(),
                            absl::StrCat(last.error_message(), "; ", changed.status().message()));
      }
      if (!*changed) break;  // etcd still names the same leader: its successor is not elected
    }
    return last;
  }

  // One call within timeout_ms. With one member, as always: it waits for the connection up to
  // the deadline. With several, it starts at the member that answered last and moves on to the
  // next when one is down or a standby (UNAVAILABLE) or silent (DEADLINE_EXCEEDED), each
  // attempt getting an even share of the time left; the member that answers becomes current.
  // A reply whose epoch (`epoch()` reads it from the reply) is older than one seen counts as
  // no answer: the call moves on, and with one member it fails naming both epochs.
  template <typename Fn, typename EpochFn>
  grpc::Status Call(int timeout_ms, Fn fn, EpochFn epoch) {
    if (finder != nullptr) return CallFound(timeout_ms, fn, epoch);
    if (members.size() == 1) {
      auto ctx = Ctx(members[0].endpoint, timeout_ms);
      grpc::Status st = fn(*members[0].stub, ctx.get());
      if (st.ok()) {
        if (auto acc = Accept(epoch(), members[0].endpoint.Describe()); !acc.ok()) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(acc.message()));
        }
      }
      return st;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    const std::size_t n = members.size();
    const std::size_t start = current.load();
    grpc::Status last(grpc::StatusCode::DEADLINE_EXCEEDED, "no orchestrator answered in time");
    for (std::size_t attempt = 0; attempt < n; ++attempt) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) break;
      const std::size_t idx = (start + attempt) % n;
      auto ctx = Ctx(members[idx].endpoint, static_cast<int>(std::max<std::int64_t>(
                                                left / static_cast<std::int64_t>(n - attempt), 1)));
      grpc::Status st = fn(*members[idx].stub, ctx.get());
      if (st.ok()) {
        if (auto acc = Accept(epoch(), members[idx].endpoint.Describe()); !acc.ok()) {
          st = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(acc.message()));
        }
      }
      if (st.ok() || (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
                      st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)) {
        current.store(idx);
        return st;
      }
      last = grpc::Status(st.error_code(),
                          absl::StrCat(members[idx].endpoint.Describe(), ": ", st.error_message()));
    }
    return last;
  }
};

HostClient::HostClient(std::unique_ptr<Rpc> rpc, std::uint32_t host, HostClientOptions options)
    : rpc_(std::move(rpc)), host_(host), options_(std::move(options)) {}

namespace {
std::int64_t ClockMs(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}
// The lease a reply states for an extent, as this host may count it from the request's send
// time: ¾ of it, the rest is the margin for clock drift and the reply's delay.
std::int64_t Usable(std::int64_t expires_in_ms) { return expires_in_ms * 3 / 4; }
}  // namespace

HostClockReading HostClient::ReadClocks() const {
  if (options_.clock) return options_.clock();
  HostClockReading r;
  r.mono_ms = ClockMs(CLOCK_MONOTONIC);
  r.boot_ms = ClockMs(CLOCK_BOOTTIME);
  r.real_ms = ClockMs(CLOCK_REALTIME);
  return r;
}

void HostClient::AcknowledgedLocked(const HostClockReading& sent) {
  if (sent.boot_ms >= acked_.boot_ms) acked_ = sent;
}

bool HostClient::PausedLocked(const HostClockReading& now) const {
  const std::int64_t boot = now.boot_ms - acked_.boot_ms;
  const std::int64_t real = now.real_ms - acked_.real_ms;
  const std::int64_t mono = now.mono_ms - acked_.mono_ms;
  // Wall time went on while the boot clock stood (a VM stop, the wall clock stepped on
  // resume), or was stepped at all; or the monotonic clock stood while the boot clock went
  // on (a suspend). Slewing (at most 0.05 %) stays far below the margin.
  return real - boot > margin_ms_ || boot - real > margin_ms_ || boot - mono > margin_ms_;
}

bool HostClient::ValidLocked(const Held& h, const HostClockReading& now) const {
  return now.boot_ms <= h.valid_until_ms && !PausedLocked(now);
}

absl::StatusOr<std::unique_ptr<HostClient>> HostClient::Connect(const std::string& socket,
                                                                std::uint32_t host_id,
                                                                HostClientOptions options) {
  auto rpc = std::make_unique<Rpc>();
  // Reconnect fast: gRPC's default backoff (1 s and growing) after an orchestrator restart
  // would outlast host_ttl, and the host would be fenced for the orchestrator's absence.
  grpc::ChannelArguments& args = rpc->args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  if (absl::string_view spec = socket; absl::ConsumePrefix(&spec, "etcd://")) {
    auto finder = LeaderFinder::Parse(spec);
    if (!finder.ok()) return finder.status();
    rpc->finder = *std::move(finder);
    std::unique_ptr<HostClient> c(new HostClient(std::move(rpc), host_id, std::move(options)));
    if (auto st = c->Join(); !st.ok()) return st;
    return c;
  }
  for (absl::string_view where : absl::StrSplit(socket, ',', absl::SkipWhitespace())) {
    auto endpoint = ResolveEndpoint(std::string(absl::StripAsciiWhitespace(where)));
    if (!endpoint.ok()) return endpoint.status();
    Rpc::Member m;
    m.endpoint = *std::move(endpoint);
    m.channel = grpc::CreateCustomChannel(m.endpoint.target, m.endpoint.credentials, args);
    m.stub = pb::Orchestrator::NewStub(m.channel);
    rpc->members.push_back(std::move(m));
  }
  if (rpc->members.empty()) {
    return absl::InvalidArgumentError(
        "no orchestrator endpoint given (a socket path, tcp:HOST:PORT, or several of them "
        "separated by commas for the orchestrators of an HA domain)");
  }
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.join_budget_ms);
  std::unique_ptr<HostClient> c(new HostClient(std::move(rpc), host_id, std::move(options)));
  // A join that no orchestrator answered in time is tried again until the budget ends (a new
  // incarnation each time: one that was created but whose reply was lost holds nothing, and
  // the next join of this machine takes its row over). Nothing listening (UNAVAILABLE: no
  // socket, connection refused) fails at once: the orchestrator is not running there.
  for (int tries = 1;; ++tries) {
    absl::Status st = c->Join();
    if (st.ok()) return c;
    const bool unanswered = absl::IsDeadlineExceeded(st);
    if (!unanswered || std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= until) {
      if (tries == 1 || !unanswered) return st;
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", tries, " tries in ",
                                                  c->options_.join_budget_ms,
                                                  " ms: HostClientOptions::join_budget_ms)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::Status HostClient::Join() {
  pb::JoinRequest req;
  req.set_host_id(host_);
  char name[64] = {};
  ::gethostname(name, sizeof(name) - 1);
  req.set_hostname(absl::StrCat(name, " pid ", ::getpid()));
  pb::JoinReply rep;
  const HostClockReading sent = ReadClocks();
  bool answered = false;  // by an orchestrator, refusals included (kAnsweredByOrchestrator)
  const grpc::Status called = rpc_->Call(
      2000,
      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
        grpc::Status st = stub.Join(ctx, req, &rep);
        answered = ctx->GetServerTrailingMetadata().count(kAnsweredByOrchestrator) > 0;
        return st;
      },
      [&] { return rep.epoch(); });
  if (auto st = FromGrpc(called, "join"); !st.ok()) {
    if ((absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) && !answered &&
        rpc_->finder == nullptr && rpc_->members.size() == 1 &&
        absl::StartsWith(rpc_->endpoint().target, "unix:")) {
      // A daemon closes a connection from a uid it does not allow before answering anything.
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", rpc_->endpoint().target,
                                                  ": no orchestrator answered; if one runs, "
                                                  "check that it allows uid ",
                                                  ::geteuid(), " in rpc.allowed_uids)"));
    }
    return st;
  }
  if (auto st = rpc_->Accept(rep.epoch(), "join"); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  incarnation_ = rep.incarnation();
  held_.clear();  // nothing held yet
  grants_ = 0;
  acked_ = sent;
  period_ms_ = rep.heartbeat_period_ms();
  host_ttl_ms_ = rep.host_ttl_ms();
  margin_ms_ = host_ttl_ms_ / 4;  // until a reply states a lease
  domain_spec_ = rep.domain_spec();
  pool_spec_ = rep.pool_spec();
  extent_bytes_ = rep.extent_bytes();
  draining_ = false;
  return absl::OkStatus();
}

absl::Status HostClient::HeartbeatOnce() {
  pb::HeartbeatRequest req;
  req.set_host_id(host_);
  std::uint64_t inc = 0, grants_before = 0, changes_before = 0;
  bool quiet_at_send = false;
  {
    absl::MutexLock l(&mu_);
    inc = incarnation_;
    grants_before = grants_;  // extents granted up to here are in the reply if still held
    changes_before = changes_started_;
    quiet_at_send = changes_in_flight_ == 0;
  }
  req.set_incarnation(inc);
  if (counters_) {
    const HostCounters hc = counters_();
    req.set_used_bytes(hc.used_bytes);
    req.set_prefix_hits(hc.prefix_hits);
    req.set_prefix_misses(hc.prefix_misses);
    pb::LeaseCounters* l = req.mutable_lease();
    l->set_leases_refused_late(hc.lease.leases_refused_late);
    l->set_copies_discarded(hc.lease.copies_discarded);
    l->set_copies_retried(hc.lease.copies_retried);
    l->set_leases_retaken(hc.lease.leases_retaken);
    l->set_pauses_detected(hc.lease.pauses_detected);
    l->set_rejoins_after_fence(hc.lease.rejoins_after_fence);
  }
  pb::HeartbeatReply rep;
  const HostClockReading sent = ReadClocks();
  const grpc::Status called = rpc_->Call(
      static_cast<int>(period_ms_ * 2),
      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
        return stub.Heartbeat(ctx, req, &rep);
      },
      [&] { return rep.epoch(); });
  if (auto st = FromGrpc(called, "heartbeat"); !st.ok()) {
    return st;  // the orchestrator is down: extents stay valid until their lease ends
  }
  if (options_.before_heartbeat_applied) options_.before_heartbeat_applied();
  // Again when applying: a newer leader may have answered another call while this reply
  // travelled (a failover between the two).
  if (auto st = rpc_->Accept(rep.epoch(), "heartbeat"); !st.ok()) return st;
  if (rep.fenced()) {
    ++rejoins_;
    return Join();
  }
  absl::ReleasableMutexLock l(&mu_);
  if (incarnation_ != inc) return absl::OkStatus();  // rejoined meanwhile: not about us
  draining_ = rep.draining();
  // Merged, never replaced: the reply may predate a Grow that completed while it travelled
  // (audit #14), and a Shrink that completed meanwhile must not be undone.
  std::map<std::uint32_t, std::int64_t> listed;  // extent -> lease left at the reply
  for (const pb::Extent& e : rep.extents()) listed[e.index()] = e.expires_in_ms();
  std::erase_if(held_, [&](const Held& h) {
    return listed.count(h.extent.index) == 0 && h.grant <= grants_before;
  });
  for (Held& h : held_) {
    const auto it = listed.find(h.extent.index);
    if (it == listed.end()) continue;  // granted after this heartbeat was sent
    h.valid_until_ms = std::max(h.valid_until_ms, sent.boot_ms + Usable(it->second));
    margin_ms_ = it->second / 4;
  }
  AcknowledgedLocked(sent);
  // Listed for this incarnation but never granted to this client as far as it knows, with no
  // Grow or Shrink under way from before the send until now: a grant whose reply was lost
  // (audit-ha #8). Given back, so it is not lent and unused until this host leaves.
  std::vector<std::uint32_t> unknown;
  if (quiet_at_send && changes_in_flight_ == 0 && changes_started_ == changes_before) {
    for (const auto& listed_extent : listed) {
      const std::uint32_t index = listed_extent.first;
      const bool held = std::any_of(held_.begin(), held_.end(),
                                    [&](const Held& h) { return h.extent.index == index; });
      if (!held) unknown.push_back(index);
    }
  }
  l.Release();
  if (!unknown.empty()) {
    if (auto st = Shrink(unknown); st.ok()) unknown_returned_ += unknown.size();
  }
  return absl::OkStatus();
}

void HostClient::StartHeartbeats(std::function<HostCounters()> counters) {
  counters_ = std::move(counters);
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      (void)HeartbeatOnce();
      for (std::uint32_t t = 0; t < period_ms_ && !stop_.load(); t += 10) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min<std::uint32_t>(10, period_ms_)));
      }
    }
  });
}

// Counts a Grow or Shrink under way (HeartbeatOnce: a listed extent not held is unknown only
// while none is).
class HostClient::ChangeInFlight {
 public:
  explicit ChangeInFlight(HostClient& c) : c_(c) {
    absl::MutexLock l(&c_.mu_);
    ++c_.changes_started_;
    ++c_.changes_in_flight_;
  }
  ~ChangeInFlight() {
    absl::MutexLock l(&c_.mu_);
    --c_.changes_in_flight_;
  }
  ChangeInFlight(const ChangeInFlight&) = delete;
  ChangeInFlight& operator=(const ChangeInFlight&) = delete;

 private:
  HostClient& c_;
};

absl::StatusOr<std::vector<GrantedExtent>> HostClient::Grow(std::uint32_t n) {
  const ChangeInFlight change(*this);
  pb::GrowRequest req;
  req.set_host_id(host_);
  const std::uint64_t inc = incarnation();
  req.set_incarnation(inc);
  req.set_extents(n);
  pb::GrowReply rep;
  const HostClockReading sent = ReadClocks();
  const grpc::Status called = rpc_->Call(
      2000,
      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
        return stub.Grow(ctx, req, &rep);
      },
      [&] { return rep.epoch(); });
  if (auto st = FromGrpc(called, "grow"); !st.ok()) return st;
  if (auto st = rpc_->Accept(rep.epoch(), "grow"); !st.ok()) return st;
  std::vector<GrantedExtent> got;
  absl::MutexLock l(&mu_);
  if (incarnation_ != inc) {
    // Granted to the incarnation this host had when it asked; it has been fenced and
    // rejoined since, so the grant is the old incarnation's (the orchestrator takes it back).
    return absl::FailedPreconditionError(
        absl::StrCat("grow: granted to incarnation ", inc, ", but host ", host_,
                     " rejoined as incarnation ", incarnation_, " meanwhile: grow again"));
  }
  ++grants_;
  for (const pb::Extent& e : rep.granted()) {
    got.push_back(GrantedExtent{e.index(), e.offset(), e.length()});
    // Only the extents granted here get this deadline: the orchestrator renewed no other
    // (audit #11).
    held_.push_back(Held{got.back(), sent.boot_ms + Usable(e.expires_in_ms()), grants_});
    margin_ms_ = e.expires_in_ms() / 4;
  }
  AcknowledgedLocked(sent);
  return got;
}

absl::Status HostClient::Shrink(const std::vector<std::uint32_t>& ext) {
  const ChangeInFlight change(*this);
  pb::ShrinkRequest req;
  req.set_host_id(host_);
  req.set_incarnation(incarnation());
  for (std::uint32_t i : ext) req.add_extents(i);
  pb::ShrinkReply rep;
  const grpc::Status called = rpc_->Call(
      2000,
      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
        return stub.Shrink(ctx, req, &rep);
      },
      [&] { return rep.epoch(); });
  if (auto st = FromGrpc(called, "shrink"); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  std::erase_if(held_, [&](const Held& h) {
    return std::find(ext.begin(), ext.end(), h.extent.index) != ext.end();
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
  return FromGrpc(rpc_->Call(
                      2000,
                      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
                        return stub.Leave(ctx, req, &rep);
                      },
                      [&] { return rep.epoch(); }),
                  "leave");
}

absl::StatusOr<std::vector<ExtentView>> HostClient::ListExtents() {
  pb::ExtentsRequest req;
  pb::ExtentsReply rep;
  const grpc::Status called = rpc_->Call(
      2000,
      [&](pb::Orchestrator::Stub& stub, grpc::ClientContext* ctx) {
        return stub.Extents(ctx, req, &rep);
      },
      [&] { return rpc_->seen_epoch.load(); });  // a listing carries no epoch
  if (auto st = FromGrpc(called, "extents"); !st.ok()) return st;
  std::vector<ExtentView> out;
  out.reserve(static_cast<std::size_t>(rep.extents_size()));
  for (const pb::Extent& e : rep.extents()) {
    out.push_back(ExtentView{e.index(), e.offset(), e.length(), e.host_id(), e.state()});
  }
  return out;
}

bool HostClient::Holds(std::uint32_t extent) const {
  absl::MutexLock l(&mu_);
  for (const Held& h : held_) {
    if (h.extent.index == extent) return true;
  }
  return false;
}

HostClient::~HostClient() { (void)Leave(); }

std::int64_t HostClient::leader_epoch() const { return rpc_->seen_epoch.load(); }

std::uint64_t HostClient::leaders_found() const { return rpc_->leader_changes.load(); }

std::uint64_t HostClient::incarnation() const {
  absl::MutexLock l(&mu_);
  return incarnation_;
}

std::vector<GrantedExtent> HostClient::extents() const {
  absl::MutexLock l(&mu_);
  std::vector<GrantedExtent> out;
  out.reserve(held_.size());
  for (const Held& h : held_) out.push_back(h.extent);
  return out;
}

bool HostClient::ExtentValid(std::uint32_t extent) const {
  const HostClockReading now = ReadClocks();
  absl::MutexLock l(&mu_);
  for (const Held& h : held_) {
    if (h.extent.index == extent) return ValidLocked(h, now);
  }
  return false;
}

bool HostClient::ExtentsValid() const {
  const HostClockReading now = ReadClocks();
  absl::MutexLock l(&mu_);
  if (held_.empty()) return false;
  for (const Held& h : held_) {
    if (!ValidLocked(h, now)) return false;
  }
  return true;
}

}  // namespace cxlkv::orchestrator
