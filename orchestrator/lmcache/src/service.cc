// LMCache's coordinator wire (docs/lmcache.md "The coordinator") over civetweb.
#include "cxlkv/orchestrator/lmcache/service.h"

#include <civetweb.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "wire.h"

namespace cxlkv::coordinator {
namespace {

using json = nlohmann::json;
constexpr long long kMaxBodyBytes = 64ll << 20;

// A request that breaks the wire's rules: 422 with `detail`.
struct Reject {
  std::string detail;
};

// Strict reading of a JSON object: every field known, each of its type.
class Fields {
 public:
  Fields(const json& j, std::string where, const std::set<std::string>& known)
      : j_(j), where_(std::move(where)) {
    if (!j.is_object()) throw Reject{absl::StrCat(where_, ": expected an object")};
    for (const auto& [k, v] : j.items()) {
      if (known.count(k) == 0) {
        throw Reject{
            absl::StrCat(where_, ": unknown field '", k, "' (extra fields are forbidden)")};
      }
    }
  }
  const json* Get(const std::string& k, bool required) const {
    auto it = j_.find(k);
    if (it == j_.end()) {
      if (required) throw Reject{absl::StrCat(where_, ".", k, ": field required")};
      return nullptr;
    }
    return &*it;
  }
  std::string Str(const std::string& k, bool required = true, std::string def = "") const {
    const json* v = Get(k, required);
    if (v == nullptr) return def;
    if (!v->is_string()) throw Reject{absl::StrCat(where_, ".", k, ": expected a string")};
    return v->get<std::string>();
  }
  std::int64_t Int(const std::string& k, bool required = true, std::int64_t def = 0) const {
    const json* v = Get(k, required);
    if (v == nullptr) return def;
    if (!v->is_number_integer())
      throw Reject{absl::StrCat(where_, ".", k, ": expected an integer")};
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX) {
      throw Reject{absl::StrCat(where_, ".", k, ": out of range")};
    }
    return v->get<std::int64_t>();
  }
  // An int field of LMCache's key (EncodedObjectKey's kv_rank, object_group_id), read as its
  // pydantic models read an `int` in lax mode: an integer; a number with no fractional part
  // (0.0); a string of decimal digits, optionally after '-' ("0", "-3"). Anything else is
  // refused: fractions (pydantic too), and forms pydantic may take that were not verified
  // (whitespace, '+', "1.0", true; docs/lmcache.md "Keys"). Layout dimensions stay strict
  // (LMCache's StrictInt).
  std::int64_t LaxInt(const std::string& k, bool required = true, std::int64_t def = 0) const {
    const json* v = Get(k, required);
    if (v == nullptr) return def;
    if (v->is_number_integer()) return Int(k, required, def);
    const std::string what = absl::StrCat(where_, ".", k);
    if (v->is_number_float()) {
      const double d = v->get<double>();
      // 2^63 is exact in a double; every double below it with no fraction fits int64.
      if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 &&
          d < 9223372036854775808.0) {
        return static_cast<std::int64_t>(d);
      }
      throw Reject{absl::StrCat(what, ": expected an integer (a number with no fractional part)")};
    }
    if (v->is_string()) {
      const std::string& t = v->get_ref<const std::string&>();
      std::int64_t n = 0;
      const std::size_t digits = t.size() - (!t.empty() && t[0] == '-' ? 1 : 0);
      if (digits > 0 && t.find_first_not_of("0123456789", t.size() - digits) == std::string::npos &&
          absl::SimpleAtoi(t, &n)) {
        return n;
      }
      throw Reject{absl::StrCat(what, ": expected an integer (a string of decimal digits)")};
    }
    throw Reject{absl::StrCat(what, ": expected an integer")};
  }
  const json& Array(const std::string& k) const {
    const json* v = Get(k, true);
    if (!v->is_array()) throw Reject{absl::StrCat(where_, ".", k, ": expected an array")};
    return *v;
  }

 private:
  const json& j_;
  std::string where_;
};

ObjectKey KeyOf(const json& j, const std::string& where) {
  Fields f(j, where, {"chunk_hash_hex", "model_name", "kv_rank", "object_group_id", "cache_salt"});
  ObjectKey k;
  k.chunk_hash_hex = f.Str("chunk_hash_hex");
  k.model_name = f.Str("model_name");
  k.kv_rank = f.LaxInt("kv_rank");
  k.object_group_id = f.LaxInt("object_group_id", false, 0);
  k.cache_salt = f.Str("cache_salt", false, "");
  return k;
}

Layout LayoutOf(const json& j, const std::string& where) {
  Fields f(j, where, {"shapes", "dtypes"});
  Layout l;
  const json& shapes = f.Array("shapes");
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const json& s = shapes[i];
    if (!s.is_array()) throw Reject{absl::StrCat(where, ".shapes[", i, "]: expected an array")};
    std::vector<std::int64_t> dims;
    for (const json& d : s) {
      if (!d.is_number_integer()) {
        throw Reject{absl::StrCat(where, ".shapes[", i, "]: dimensions are integers")};
      }
      dims.push_back(d.get<std::int64_t>());
    }
    l.shapes.push_back(std::move(dims));
  }
  const json& dtypes = f.Array("dtypes");
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    if (!dtypes[i].is_string())
      throw Reject{absl::StrCat(where, ".dtypes[", i, "]: expected a string")};
    l.dtypes.push_back(dtypes[i].get<std::string>());
  }
  return l;
}

json LayoutJson(const Layout& l) { return json{{"shapes", l.shapes}, {"dtypes", l.dtypes}}; }
json HandleJson(const std::string& region_id, const Handle& h) {
  return json{{"region_id", region_id},
              {"offset", h.offset},
              {"length", h.length},
              {"generation", h.generation}};
}

// A reserve's items or a finish's / abort's reservations: at most max_batch, when it is not 0.
void CheckBatch(const json& a, const char* what, std::size_t max_batch) {
  if (max_batch != 0 && a.size() > max_batch) {
    throw Reject{absl::StrCat(what, ": ", a.size(), " ", what, ", more than lmcache.max_batch (",
                              max_batch, "): send smaller batches, or raise max_batch (0: none)")};
  }
}

std::vector<ReservationRef> RefsOf(const Fields& f, std::size_t max_batch) {
  const json& a = f.Array("reservations");
  CheckBatch(a, "reservations", max_batch);
  std::vector<ReservationRef> refs;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string w = absl::StrCat("reservations[", i, "]");
    Fields r(a[i], w, {"key", "token"});
    refs.push_back(ReservationRef{KeyOf(*r.Get("key", true), w + ".key"), r.Str("token")});
  }
  return refs;
}

// A reply: the status and the JSON body.
using Reply = std::pair<int, json>;

Reply FromStatus(const absl::Status& st) {
  const std::string msg(st.message());
  auto named = [&](int code, const char* name) {
    const std::string prefix = absl::StrCat(name, ": ");
    std::string detail = absl::StartsWith(msg, prefix) ? msg.substr(prefix.size()) : msg;
    return Reply{code, json{{"error", name}, {"detail", detail}}};
  };
  switch (st.code()) {
    case absl::StatusCode::kFailedPrecondition:
      return named(409, "stale_epoch");
    case absl::StatusCode::kAborted:
      return named(409, "invalid_reservation");
    case absl::StatusCode::kResourceExhausted:
      return named(507, "out_of_space");
    case absl::StatusCode::kInvalidArgument:
      return Reply{422, json{{"detail", msg}}};
    default:
      return Reply{500, json{{"detail", msg}}};
  }
}

// The GET routes past authentication: the region's contract, the status, cxlkv's statistics.
// Each route's reply is built in a function of its own, so that the request's frame on a
// civetweb worker's stack (a fixed size chosen when civetweb was built: service.h) stays small.
json RegionBody(const Coordinator& co, const CoordinatorConfig& c, const std::string& path,
                const std::string& tenant, const RegionInfo& region) {
  json contract{{"region_id", region.region_id},
                {"capacity_bytes", region.capacity_bytes},
                {"alignment_bytes", region.alignment_bytes},
                {"layout_id", region.layout_id},
                {"region_epoch", region.region_epoch}};
  if (path == "/v1/region") return contract;
  const Stats s = co.stats();
  if (path == "/v1/status") {
    return json{
        {"region", contract}, {"used_bytes", s.used_bytes}, {"object_count", s.object_count}};
  }
  auto q = c.quotas.find(tenant);
  return json{
      {"region", contract},
      {"region_offset", region.region_offset},
      {"tenant", tenant},
      {"namespace", co.NamespaceOf(tenant)},
      {"pin_level", co.PinOf(tenant)},
      {"tenant_used_bytes",
       s.tenant_used_bytes.count(tenant) != 0 ? s.tenant_used_bytes.at(tenant) : 0},
      {"tenant_quota_bytes", q == c.quotas.end() ? json(nullptr) : json(q->second)},
      {"used_bytes", s.used_bytes},
      {"object_count", s.object_count},
      {"writing", s.writing},
      {"reserved", s.reserved},
      {"finished", s.finished},
      {"aborted", s.aborted},
      {"expired", s.expired},
      {"evicted", s.evicted},
      {"evicted_bytes", s.evicted_bytes},
      {"out_of_space", s.out_of_space},
      {"journal_records", s.journal_records},
      {"syncs", s.syncs},
      {"index", c.index},
      {"index_namespace", absl::StrCat(absl::Hex(co.IndexNamespace(tenant), absl::kZeroPad16))},
      {"region_tag", co.RegionTag()},
      {"indexed", s.indexed},
      {"held_bytes", s.held_bytes},
      {"index_skipped", s.index_skipped},
      {"index_waits", s.index_waits},
      {"reservation_ttl_ms", c.reservation_ttl_ms},
      {"read_lease_ms", c.read_lease_ms},
      {"restored", co.restored()}};
}

// A POST's body, read into `body` (grown in place: no buffer on the worker's stack); false
// when it is larger than kMaxBodyBytes.
bool ReadBody(mg_connection* conn, std::string* body) {
  constexpr std::size_t kChunk = 16384;
  while (true) {
    const std::size_t had = body->size();
    body->resize(had + kChunk);
    const int n = mg_read(conn, body->data() + had, kChunk);
    body->resize(had + static_cast<std::size_t>(std::max(n, 0)));
    if (n <= 0) return true;
    if (static_cast<long long>(body->size()) > kMaxBodyBytes) return false;
  }
}

// The POST routes: reserve, finish, abort, lookup.
Reply PostReply(Coordinator& co, const std::string& path, const std::string& tenant,
                const RegionInfo& region, const std::string& body, std::uint32_t max_batch,
                std::int64_t now) {
  absl::StatusOr<WireRequest> req = ParseBody(path, body, max_batch);
  if (!req.ok()) return {422, json{{"detail", std::string(req.status().message())}}};
  const std::string& epoch = req->region_epoch;
  if (path == "/v1/writes/reserve") {
    auto grants = co.Reserve(tenant, epoch, req->items, now);
    if (!grants.ok()) return FromStatus(grants.status());
    json out = json::array();
    for (const auto& g : *grants) {
      if (!g) {
        out.push_back(nullptr);
        continue;
      }
      out.push_back(json{{"key", KeyJson(g->key)},
                         {"token", g->token},
                         {"handle", HandleJson(region.region_id, g->handle)},
                         {"layout", LayoutJson(g->layout)}});
    }
    return {200, json{{"region_epoch", epoch}, {"grants", out}}};
  }
  if (path == "/v1/writes/finish" || path == "/v1/writes/abort") {
    const absl::Status st = path == "/v1/writes/finish" ? co.Finish(tenant, epoch, req->refs, now)
                                                        : co.Abort(tenant, epoch, req->refs, now);
    if (!st.ok()) return FromStatus(st);
    return {200, json{{"region_epoch", epoch}}};
  }
  auto hits = co.Lookup(tenant, epoch, req->keys, now);
  if (!hits.ok()) return FromStatus(hits.status());
  json out = json::array();
  for (const auto& h : *hits) {
    if (!h) {
      out.push_back(nullptr);
      continue;
    }
    out.push_back(json{{"key", KeyJson(h->key)},
                       {"handle", HandleJson(region.region_id, h->handle)},
                       {"layout", LayoutJson(h->layout)}});
  }
  return {200, json{{"region_epoch", epoch}, {"hits", out}}};
}

}  // namespace

std::int64_t Service::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::unique_ptr<Service>> Service::Start(const CoordinatorConfig& c,
                                                        std::uint64_t pool_bytes,
                                                        std::uint64_t extent_bytes, bool standby,
                                                        const OwnEntries& own) {
  const std::uint64_t region_offset = HostPoolBytes(c, pool_bytes, extent_bytes);
  if (region_offset == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lmcache.region_size: ", c.region_bytes,
                     " bytes leaves the hosts no extent of the pool (", pool_bytes / extent_bytes,
                     " extents of ", extent_bytes, " bytes); make it smaller or the pool larger"));
  }
  std::unique_ptr<Service> s(new Service());
  s->c_ = c;
  s->region_offset_ = region_offset;
  std::string token_warning;
  auto tokens = LoadTenantTokens(
      c.token_file, {.accept_readable = c.token_file_readable, .min_length = c.token_min_length},
      &token_warning);
  if (!tokens.ok()) return tokens.status();
  if (!token_warning.empty()) {
    std::fprintf(stderr, "cxlkv-orchestrator: lmcache: warning: %s\n", token_warning.c_str());
  }
  s->tokens_ = *std::move(tokens);
  if (standby) {
    base::MutexLock l(s->mu_);
    s->standby_why_ = "not elected yet";
  } else {
    auto co = Coordinator::Open(c, region_offset, NowMs());
    if (!co.ok()) return co.status();
    (*co)->AttachIndex(own);
    base::MutexLock l(s->mu_);
    s->co_ = *std::move(co);
  }
  mg_init_library(0);
  const std::string threads = absl::StrCat(c.threads);
  // tcp_nodelay: a reply is written as headers then body; without it the body waits for the
  // client's delayed ACK of the headers (tens of ms per request).
  const char* options[] = {"listening_ports",
                           c.listen.c_str(),
                           "num_threads",
                           threads.c_str(),
                           "enable_keep_alive",
                           "yes",
                           "tcp_nodelay",
                           "1",
                           "request_timeout_ms",
                           "30000",
                           nullptr};
  mg_callbacks cb{};
  s->ctx_ = mg_start(&cb, s.get(), options);
  if (s->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("lmcache.listen ", c.listen, ": cannot listen (in use, or not HOST:PORT)"));
  }
  mg_set_request_handler(s->ctx_, "/", &Service::Handle, s.get());
  mg_server_port ports[4]{};
  if (mg_get_server_ports(s->ctx_, 4, ports) > 0) s->port_ = ports[0].port;
  const std::uint32_t period =
      std::max<std::uint32_t>(5, std::min<std::uint32_t>(1000, c.reservation_ttl_ms / 4));
  if (standby) {
    std::fprintf(stderr,
                 "cxlkv-orchestrator: lmcache coordinator on http://%s:%d: standing by (the "
                 "domain's leader serves it; state in etcd), region at pool offset %llu, %zu "
                 "tokens\n",
                 c.listen.substr(0, c.listen.rfind(':')).c_str(), s->port_,
                 static_cast<unsigned long long>(region_offset), s->tokens_.size());
  } else {
    std::string unused;
    s->LogServing(*s->Serving(&unused), c.state_file);
  }
  Service* self = s.get();
  s->reaper_ = std::thread([self, period] {
    while (!self->stop_.SleepFor(std::chrono::milliseconds(period))) {
      std::string why;
      std::shared_ptr<Coordinator> co = self->Serving(&why);
      if (co == nullptr) continue;
      auto n = co->Expire(NowMs());
      if (!n.ok()) {
        std::fprintf(stderr, "cxlkv-orchestrator: lmcache: reclaiming reservations: %s\n",
                     std::string(n.status().message()).c_str());
      }
    }
  });
  return s;
}

void Service::LogServing(const Coordinator& co, const std::string& from) const {
  const RegionInfo r = co.region();
  const Stats st = co.stats();
  std::fprintf(stderr,
               "cxlkv-orchestrator: lmcache coordinator on http://%s:%d: region '%s' layout '%s' "
               "at pool offset %llu, %llu bytes, epoch %s, %llu objects %s %s, %zu tokens\n",
               c_.listen.substr(0, c_.listen.rfind(':')).c_str(), port_, r.region_id.c_str(),
               r.layout_id.c_str(), static_cast<unsigned long long>(r.region_offset),
               static_cast<unsigned long long>(r.capacity_bytes), r.region_epoch.c_str(),
               static_cast<unsigned long long>(st.object_count),
               co.restored() ? "restored from" : "(new) in", from.c_str(), tokens_.size());
}

std::shared_ptr<Coordinator> Service::Serving(std::string* why) {
  base::MutexLock l(mu_);
  if (co_ != nullptr && (!may_serve_ || may_serve_())) return co_;
  *why = co_ != nullptr ? "its leadership's write deadline passed (it was paused, or etcd is "
                          "unreachable)"
                        : standby_why_;
  return nullptr;
}

absl::Status Service::Lead(std::unique_ptr<StateStore> store, std::function<bool()> may_serve,
                           const OwnEntries& own) {
  const std::string from = store->where();
  auto co = Coordinator::Open(c_, region_offset_, NowMs(), std::move(store));
  if (co.ok()) (*co)->AttachIndex(own);
  base::MutexLock l(mu_);
  if (!co.ok()) {
    co_.reset();
    standby_why_ =
        absl::StrCat("elected, but the coordinator's state did not load: ", co.status().message());
    std::fprintf(stderr, "cxlkv-orchestrator: lmcache: %s\n", standby_why_.c_str());
    return co.status();
  }
  co_ = *std::move(co);
  may_serve_ = std::move(may_serve);
  LogServing(*co_, from);
  return absl::OkStatus();
}

void Service::TendIndex(coherence::PrefixOwner& owner) {
  std::shared_ptr<Coordinator> co;
  {
    base::MutexLock l(mu_);
    co = co_;
  }
  if (co == nullptr) return;
  std::vector<coherence::BlockRef> gone;
  for (const Coordinator::IndexOp& op : co->TakeIndexOps()) {
    if (!op.publish) {
      (void)owner.RetireKey(op.ns, op.key);  // kNotFound: the index evicted it already
      continue;
    }
    if (auto st = owner.PublishOwn(op.ns, op.key, op.ref); !st.ok()) {
      // Served over HTTP only; its range is the coordinator's alone again.
      gone.push_back(op.ref);
      if (index_refusals_++ == 0) {
        std::fprintf(stderr,
                     "cxlkv-orchestrator: lmcache: the domain's prefix index refused an object "
                     "(%s); such objects are served over HTTP only (counted in /cxlkv/v1/stats "
                     "index_skipped; a larger index_entries in domain.toml makes room)\n",
                     std::string(st.message()).c_str());
      }
    }
  }
  for (const coherence::BlockRef& r : owner.TakeReclaimedOwn()) gone.push_back(r);
  co->IndexReleased(gone);
}

void Service::StandBy(const std::string& why) {
  base::MutexLock l(mu_);
  if (co_ == nullptr) return;
  co_.reset();
  may_serve_ = nullptr;
  standby_why_ = absl::StrCat("no longer the leader: ", why);
  std::fprintf(stderr, "cxlkv-orchestrator: lmcache coordinator standing by: %s\n", why.c_str());
}

Service::~Service() {
  stop_.Stop();
  if (reaper_.joinable()) reaper_.join();
  if (ctx_ != nullptr) {
    // civetweb's stop waits up to 2 s for its listener's poll without this (base/stop.h).
    base::ListenerWake wake(c_.listen.substr(0, c_.listen.rfind(':')), port_);
    mg_stop(ctx_);
  }
}

int Service::Handle(mg_connection* conn, void* self) {
  return static_cast<Service*>(self)->Serve(conn);
}

int Service::Serve(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  const std::string method = ri->request_method != nullptr ? ri->request_method : "";
  const std::string path = ri->local_uri != nullptr ? ri->local_uri : "";
  std::string tenant = "-";
  bool standby = false;
  auto send = [&](const Reply& reply) {
    const std::string text = reply.second.dump();
    mg_response_header_start(conn, reply.first);
    mg_response_header_add(conn, "Content-Type", "application/json", -1);
    if (standby) mg_response_header_add(conn, "Retry-After", "1", -1);
    const std::string len = absl::StrCat(text.size());
    mg_response_header_add(conn, "Content-Length", len.c_str(), -1);
    mg_response_header_send(conn);
    mg_write(conn, text.data(), text.size());
    if (reply.first >= 400 && !standby) {
      const std::string detail =
          reply.second.contains("detail") && reply.second["detail"].is_string()
              ? reply.second["detail"].get<std::string>()
              : reply.second.dump();
      std::fprintf(stderr, "cxlkv-orchestrator: lmcache: %d for %s %s from %s:%d (tenant %s): %s\n",
                   reply.first, method.c_str(), path.c_str(), ri->remote_addr, ri->remote_port,
                   tenant.c_str(), detail.c_str());
    }
    return reply.first;
  };
  static const std::set<std::string> kGets = {"/healthz", "/readyz", "/v1/region", "/v1/status",
                                              "/cxlkv/v1/stats"};
  static const std::set<std::string> kPosts = {"/v1/writes/reserve", "/v1/writes/finish",
                                               "/v1/writes/abort", "/v1/lookup"};
  const bool get = kGets.count(path) != 0, post = kPosts.count(path) != 0;
  if (!get && !post) return send({404, json{{"detail", "Not Found"}}});
  if ((get && method != "GET") || (post && method != "POST")) {
    return send({405, json{{"detail", "Method Not Allowed"}}});
  }
  if (path == "/healthz") return send({200, json{{"status", "ok"}}});
  // A standby of a domain with [etcd]: 503 (LMCache's client raises on it; a lookup leaves
  // the client usable, a mutating POST fences it as an ambiguous write). A load balancer in
  // front of the domain's orchestrators routes to the one whose /readyz answers 200.
  std::string why;
  const std::shared_ptr<Coordinator> co = Serving(&why);
  if (co == nullptr) {
    standby = true;
    return send({503, json{{"detail", absl::StrCat("this orchestrator does not serve the LMCache "
                                                   "coordinator now: ",
                                                   why, "; the domain's leader does")}}});
  }
  if (path == "/readyz") return send({200, json{{"status", "ready"}}});
  // Bearer authentication: 401 without one, 403 for a token the file does not list.
  const char* auth = mg_get_header(conn, "Authorization");
  const std::string authz = auth != nullptr ? auth : "";
  const std::size_t sp = authz.find(' ');
  if (sp == std::string::npos || !absl::EqualsIgnoreCase(authz.substr(0, sp), "bearer") ||
      sp + 1 >= authz.size()) {
    return send({401, json{{"detail", "bearer token required"}}});
  }
  const std::string presented = authz.substr(sp + 1);
  bool found = false;
  for (const auto& [token, t] : tokens_) {
    // Constant time in the token's contents (every listed token is compared).
    std::size_t diff = token.size() ^ presented.size();
    for (std::size_t i = 0; i < token.size(); ++i) {
      diff |= static_cast<unsigned char>(token[i]) ^
              static_cast<unsigned char>(i < presented.size() ? presented[i] : 0);
    }
    if (diff == 0 && !found) {
      found = true;
      tenant = t;
    }
  }
  if (!found) return send({403, json{{"detail", "invalid bearer token"}}});
  const RegionInfo region = co->region();
  if (path == "/v1/region" || path == "/v1/status" || path == "/cxlkv/v1/stats") {
    return send({200, RegionBody(*co, c_, path, tenant, region)});
  }
  // POST: the body.
  if (ri->content_length > kMaxBodyBytes) {
    return send(
        {413, json{{"detail", absl::StrCat("body larger than ", kMaxBodyBytes, " bytes")}}});
  }
  std::string body;
  if (!ReadBody(conn, &body)) return send({413, json{{"detail", "body too large"}}});
  return send(PostReply(*co, path, tenant, region, body, c_.max_batch, NowMs()));
}

absl::StatusOr<WireRequest> ParseBody(absl::string_view route, absl::string_view body,
                                      std::uint32_t max_batch) {
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("body: malformed JSON");
  WireRequest req;
  try {
    if (route == "/v1/writes/reserve") {
      Fields f(j, "body", {"region_epoch", "items"});
      req.region_epoch = f.Str("region_epoch");
      const json& a = f.Array("items");
      CheckBatch(a, "items", max_batch);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string w = absl::StrCat("items[", i, "]");
        Fields it(a[i], w, {"key", "layout"});
        req.items.push_back(ReserveItem{KeyOf(*it.Get("key", true), w + ".key"),
                                        LayoutOf(*it.Get("layout", true), w + ".layout")});
      }
    } else if (route == "/v1/writes/finish" || route == "/v1/writes/abort") {
      Fields f(j, "body", {"region_epoch", "reservations"});
      req.region_epoch = f.Str("region_epoch");
      req.refs = RefsOf(f, max_batch);
    } else if (route == "/v1/lookup") {
      Fields f(j, "body", {"region_epoch", "keys"});
      req.region_epoch = f.Str("region_epoch");
      // No max_batch: LMCache serves a lookup of any size, and so does the coordinator
      // (Coordinator::Lookup takes its lock max_batch keys at a time).
      const json& a = f.Array("keys");
      for (std::size_t i = 0; i < a.size(); ++i) {
        req.keys.push_back(KeyOf(a[i], absl::StrCat("keys[", i, "]")));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("no request body on route ", route));
    }
  } catch (const Reject& rej) {
    return absl::InvalidArgumentError(rej.detail);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("body: ", e.what()));
  }
  return req;
}

}  // namespace cxlkv::coordinator
