// domain.toml parsing with toml++: every key is known, typed and range-checked.
#include "cxlkv/orchestrator/config.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/toml_reader.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::orchestrator {
namespace {

// domain.toml's readers, and two more the orchestrator's sections use.
class Parser : public base::TomlReader {
 public:
  using TomlReader::TomlReader;

  // A source spec (pool, prefix domain) that parses.
  absl::Status Spec(const toml::node& n, absl::string_view key, std::string* out) const {
    if (auto st = Str(n, key, out); !st.ok()) return st;
    auto spec = pool::ParseSourceSpec(*out);
    if (!spec.ok()) return Error(n, key, spec.status().message());
    return absl::OkStatus();
  }

  absl::Status U32List(const toml::node& n, absl::string_view key, std::vector<std::uint32_t>* out,
                       std::int64_t hi) const {
    const toml::array* a = n.as_array();
    if (a == nullptr) return Error(n, key, "expected an array of integers");
    out->clear();
    for (const toml::node& e : *a) {
      std::uint32_t v;
      if (auto st = U32(e, key, &v, 0, hi); !st.ok()) return st;
      out->push_back(v);
    }
    return absl::OkStatus();
  }
};

constexpr std::uint64_t kPageBytes = 4096;

// "HOST:PORT" (HOST may be empty, a name, an IPv4 address or [IPv6]) with PORT 0..65535; with
// bare_port, "PORT" alone as well.
bool IsHostPort(const std::string& v, bool bare_port) {
  const std::size_t colon = v.rfind(':');
  if (colon == std::string::npos && !bare_port) return false;
  const std::string port = colon == std::string::npos ? v : v.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return false;
  if (std::stoul(port) > 65535) return false;
  if (colon == std::string::npos) return true;
  const std::string host = v.substr(0, colon);
  if (host.find_first_of(" \t/") != std::string::npos) return false;
  // An IPv6 address is bracketed: a colon in the host part is one otherwise.
  if (host.find(':') != std::string::npos) {
    return host.size() > 2 && host.front() == '[' && host.back() == ']';
  }
  return true;
}

// The bytes of a source a spec names, [begin, end); end 0: to the end of the source.
struct Span {
  std::uint64_t begin = 0, end = 0;
};
Span SpanOf(const pool::SourceSpec& s) {
  if (s.length == 0) return {s.offset, 0};
  return {s.offset, s.offset + s.length};
}
bool Overlap(Span a, Span b) {
  const bool a_before_b = a.end != 0 && a.end <= b.begin;
  const bool b_before_a = b.end != 0 && b.end <= a.begin;
  return !a_before_b && !b_before_a;
}
std::string SpanText(Span s) {
  return absl::StrCat("[", s.begin, ", ", s.end == 0 ? std::string("end") : absl::StrCat(s.end),
                      ")");
}

// Whether two specs can name the same memory: a file or a device-DAX path, the same one by
// name or (when both exist) by inode.
bool SameSource(const pool::SourceSpec& a, const pool::SourceSpec& b) {
  const auto shared_kind = [](pool::SourceKind k) {
    return k == pool::SourceKind::kFile || k == pool::SourceKind::kDevdax;
  };
  if (!shared_kind(a.kind) || !shared_kind(b.kind)) return false;  // memfd, kmem: private
  namespace fs = std::filesystem;
  if (fs::path(a.path).lexically_normal() == fs::path(b.path).lexically_normal()) return true;
  struct stat sa {
  }, sb{};
  return ::stat(a.path.c_str(), &sa) == 0 && ::stat(b.path.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// A "kv@" topic is llm-d's (its subscriber's default filter; docs/kv_events.md, "What the
// routers read"), and a released llm-d (llm-d/llm-d-kv-cache v0.8.1) reads the pod and model
// only from "kv@<pod>@<model>" (pkg/kvevents/engineadapter/common.go:39-45) and decodes each
// event only as a positional array (vllm_adapter.go:101-122): a map-form message is dropped
// whole. Refused here rather than published to be dropped.
absl::Status CheckEventsForLlmd(const EventsConfig& e, absl::string_view source_name) {
  if (!e.enabled() || !absl::StartsWith(e.topic, "kv@")) return absl::OkStatus();
  const std::vector<absl::string_view> parts = absl::StrSplit(e.topic, '@');
  if (parts.size() != 3 || parts[1].empty() || parts[2].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": key 'events.topic': '", e.topic,
        "' starts with llm-d's kv@ but is not kv@<pod>@<model> (llm-d v0.8.1 would file every "
        "event under a pod named by the whole topic); write it as kv@<name>@<model>"));
  }
  if (e.format == "map") {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": key 'events.format': \"map\" with the llm-d topic '", e.topic,
        "': llm-d v0.8.1 decodes events only as arrays and drops map-form messages whole; set "
        "format = \"array\""));
  }
  return absl::OkStatus();
}

// What --validate and the start check beyond single keys, needing no device: the regions
// against each other, page multiples, the extent against the pool, the prefix domain's
// geometry against its size, the socket path's length, HOST:PORT values, share keys.
absl::Status CheckAcrossKeys(const Config& c, absl::string_view source_name) {
  const auto bad = [&](absl::string_view key, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": key '", key, "': ", what));
  };
  auto pool_spec = pool::ParseSourceSpec(c.pool);
  auto dom_spec = pool::ParseSourceSpec(c.prefix_domain);
  if (!pool_spec.ok() || !dom_spec.ok()) {
    return absl::InternalError("the region specs were parsed before");  // Spec() checked both
  }
  const struct {
    const char* key;
    const pool::SourceSpec& spec;
  } regions[] = {{"domain.pool", *pool_spec}, {"domain.prefix_domain", *dom_spec}};
  for (const auto& r : regions) {
    const std::uint64_t size = r.spec.length != 0 ? r.spec.length : r.spec.size_bytes;
    if (size % kPageBytes != 0) {
      return bad(r.key,
                 absl::StrCat("size ", size, " is not a multiple of the ", kPageBytes,
                              "-byte page; round it up to ", (size / kPageBytes + 1) * kPageBytes));
    }
  }
  if (SameSource(*pool_spec, *dom_spec) && Overlap(SpanOf(*pool_spec), SpanOf(*dom_spec))) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": keys 'domain.pool' and 'domain.prefix_domain' name the same memory (",
        dom_spec->path, ", bytes ", SpanText(SpanOf(*pool_spec)), " and ",
        SpanText(SpanOf(*dom_spec)),
        "): the first extent's arena would be formatted over the prefix domain. Give the prefix "
        "domain a file or device of its own, or give both windows that do not overlap "
        "(offset=, length=)"));
  }
  const std::uint64_t pool_bytes =
      pool_spec->length != 0 ? pool_spec->length : pool_spec->size_bytes;
  if (pool_bytes != 0 && pool_bytes < c.extent_bytes) {
    return bad("domain.extent_size",
               absl::StrCat(c.extent_bytes, " bytes is larger than domain.pool (", pool_bytes,
                            " bytes): lower extent_size or give the pool a larger size="));
  }
  const std::uint64_t dom_bytes = dom_spec->length != 0 ? dom_spec->length : dom_spec->size_bytes;
  coherence::DomainGeometry g;
  g.max_hosts = c.max_hosts;
  g.index_entries = c.index_entries;
  g.lease_rows = c.lease_rows;
  g.ring_slots = c.ring_slots;
  if (dom_bytes != 0 && coherence::DomainBytes(g) > dom_bytes) {
    return bad("domain.prefix_domain",
               absl::StrCat(dom_bytes, " bytes cannot hold this geometry (max_hosts ", c.max_hosts,
                            ", index_entries ", c.index_entries, ", lease_rows ", c.lease_rows,
                            ", ring_slots ", c.ring_slots, " need ", coherence::DomainBytes(g),
                            " bytes): give it size=", base::FormatBytes(coherence::DomainBytes(g)),
                            " or more, or lower index_entries"));
  }
  sockaddr_un addr{};
  if (c.socket.size() >= sizeof(addr.sun_path)) {
    return bad("rpc.socket", absl::StrCat("'", c.socket, "' is ", c.socket.size(),
                                          " bytes; a Unix socket path holds at most ",
                                          sizeof(addr.sun_path) - 1, ": choose a shorter path"));
  }
  if (!c.metrics_listen.empty() && !IsHostPort(c.metrics_listen, true)) {
    return bad("metrics.listen",
               absl::StrCat("'", c.metrics_listen,
                            "' is not HOST:PORT or PORT with a port of 0..65535 (e.g. "
                            "\"127.0.0.1:9464\"; \"\" turns the endpoint off)"));
  }
  for (const auto& [host, share] : c.shares) {
    if (!c.HostAllowed(host)) {
      return bad(absl::StrCat("capacity.shares.", host),
                 absl::StrCat("host id ", host, " can never join this domain (",
                              host >= c.max_hosts
                                  ? absl::StrCat("not below domain.max_hosts ", c.max_hosts)
                                  : std::string("not in hosts.allowed"),
                              "): fix the id, or drop the share"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool Config::HostAllowed(std::uint32_t host) const {
  if (host >= max_hosts) return false;
  return allowed_hosts.empty() ||
         std::find(allowed_hosts.begin(), allowed_hosts.end(), host) != allowed_hosts.end();
}

double Config::ShareOf(std::uint32_t host) const {
  auto it = shares.find(host);
  return it == shares.end() ? default_share : it->second;
}

absl::StatusOr<Config> ParseConfig(absl::string_view text, absl::string_view source_name) {
  absl::StatusOr<toml::table> parsed = base::ParseToml(text, source_name);
  if (!parsed.ok()) return parsed.status();
  const toml::table& root = *parsed;
  Config c;
  Parser p(source_name);
  using H = Parser::Handler;
  const toml::node& rootn = root;
  absl::Status st = p.Table(
      rootn, "",
      {
          {"domain", H([&](const toml::node& n, const std::string& k) {
             return p.Table(
                 n, k,
                 {
                     {"name", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.name); })},
                     {"pool", H([&](auto& v, auto& kk) { return p.Spec(v, kk, &c.pool); })},
                     {"prefix_domain",
                      H([&](auto& v, auto& kk) { return p.Spec(v, kk, &c.prefix_domain); })},
                     {"extent_size",
                      H([&](auto& v, auto& kk) { return p.Size(v, kk, &c.extent_bytes); })},
                     {"state_file",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.state_file); })},
                     {"max_hosts",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &c.max_hosts, 1, 1024); })},
                     {"index_entries", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &c.index_entries, 64, 1 << 26);
                      })},
                     {"lease_rows",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &c.lease_rows, 1, 65536); })},
                     {"ring_slots",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &c.ring_slots, 4, 65536); })},
                 });
           })},
          {"rpc", H([&](const toml::node& n, const std::string& k) {
             return p.Table(
                 n, k,
                 {
                     {"socket", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.socket); })},
                     {"allowed_uids", H([&](auto& v, auto& kk) {
                        return p.U32List(v, kk, &c.allowed_uids, 0xFFFFFFFE);
                      })},
                     {"tcp", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.tcp); })},
                     {"token_file",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.token_file); })},
                     {"tls_cert", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.tls_cert); })},
                     {"tls_key", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.tls_key); })},
                 });
           })},
          {"metrics", H([&](const toml::node& n, const std::string& k) {
             return p.Table(n, k,
                            {
                                {"listen", H([&](auto& v, auto& kk) {
                                   return p.Str(v, kk, &c.metrics_listen);
                                 })},
                            });
           })},
          {"timing", H([&](const toml::node& n, const std::string& k) {
             return p.Table(n, k,
                            {
                                {"lease_ttl_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.lease_ttl_ms, 10, 3600000);
                                 })},
                                {"host_ttl_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.host_ttl_ms, 10, 3600000);
                                 })},
                                {"heartbeat_period_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.heartbeat_period_ms, 1, 600000);
                                 })},
                                // At least 1 ms: with one mfence per acquire, rule 4
                                // rests on the grace period outlasting the time a lease
                                // row's streaming store takes to become visible (audit-ha
                                // #6; docs/coherence.md "Two results about fences").
                                {"grace_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.grace_ms, 1, 600000);
                                 })},
                                {"capacity_lease_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.capacity_lease_ms, 10, 86400000);
                                 })},
                                {"owner_period_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.owner_period_ms, 1, 10000);
                                 })},
                            });
           })},
          {"hosts", H([&](const toml::node& n, const std::string& k) {
             return p.Table(n, k,
                            {
                                {"allowed", H([&](auto& v, auto& kk) {
                                   return p.U32List(v, kk, &c.allowed_hosts, 1023);
                                 })},
                            });
           })},
          {"capacity", H([&](const toml::node& n, const std::string& k) {
             return p.Table(
                 n, k,
                 {
                     {"default_share",
                      H([&](auto& v, auto& kk) { return p.Real(v, kk, &c.default_share, 0, 1); })},
                     {"shares", H([&](const toml::node& sn, const std::string& sk) {
                        const toml::table* t = sn.as_table();
                        if (t == nullptr)
                          return p.Error(sn, sk, "expected a table of host id = share");
                        for (auto&& [hk, hv] : *t) {
                          std::uint32_t host = 0;
                          const std::string hs(hk.str());
                          if (hs.empty() || hs.size() > 4 ||
                              !std::all_of(hs.begin(), hs.end(),
                                           [](char ch) { return ch >= '0' && ch <= '9'; })) {
                            return p.Error(hv, absl::StrCat(sk, ".", hs),
                                           "keys of [capacity.shares] are host ids (0..1023)");
                          }
                          host = static_cast<std::uint32_t>(std::stoul(hs));
                          double share = 0;
                          if (auto s2 = p.Real(hv, absl::StrCat(sk, ".", hs), &share, 0, 1);
                              !s2.ok())
                            return s2;
                          c.shares[host] = share;
                        }
                        return absl::OkStatus();
                      })},
                 });
           })},
          {"namespace", H([&](const toml::node& n, const std::string& k) {
             const toml::array* a = n.as_array();
             if (a == nullptr || !a->is_array_of_tables()) {
               return p.Error(n, k, "expected [[namespace]] tables");
             }
             for (const toml::node& t : *a) {
               NamespaceConfig ns;
               if (auto s2 = p.Table(
                       t, k,
                       {
                           {"tenant",
                            H([&](auto& v, auto& kk) { return p.Str(v, kk, &ns.tenant); })},
                           {"model", H([&](auto& v, auto& kk) { return p.Str(v, kk, &ns.model); })},
                           {"layout",
                            H([&](auto& v, auto& kk) { return p.Str(v, kk, &ns.layout); })},
                           {"pin", H([&](auto& v, auto& kk) {
                              std::uint32_t pin = 0;
                              auto s3 = p.U32(v, kk, &pin, 0, 3);
                              ns.pin = static_cast<int>(pin);
                              return s3;
                            })},
                       });
                   !s2.ok()) {
                 return s2;
               }
               if (ns.tenant.empty() || ns.model.empty() || ns.layout.empty()) {
                 return p.Error(t, k, "each [[namespace]] needs tenant, model and layout");
               }
               c.namespaces.push_back(ns);
             }
             return absl::OkStatus();
           })},
          {"etcd", H([&](const toml::node& n, const std::string& k) {
             return p.Table(
                 n, k,
                 {
                     {"endpoints", H([&](const toml::node& v, const std::string& kk) {
                        const toml::array* a = v.as_array();
                        if (a == nullptr) {
                          return p.Error(v, kk, "expected an array of \"host:port\" strings");
                        }
                        c.etcd.endpoints.clear();
                        for (const toml::node& e : *a) {
                          std::string ep;
                          if (auto s2 = p.Str(e, kk, &ep); !s2.ok()) return s2;
                          const std::size_t colon = ep.rfind(':');
                          if (colon == std::string::npos || colon == 0 || colon + 1 == ep.size() ||
                              ep.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
                            return p.Error(e, kk,
                                           absl::StrCat("'", ep,
                                                        "' is not host:port (for example "
                                                        "\"10.0.0.5:2379\")"));
                          }
                          c.etcd.endpoints.push_back(ep);
                        }
                        return absl::OkStatus();
                      })},
                     {"cluster",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.cluster); })},
                     {"domain", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.domain); })},
                     {"node", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.node); })},
                     {"ttl_s",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &c.etcd.ttl_s, 2, 60); })},
                     {"margin_ms", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &c.etcd.margin_ms, 0, 40000);
                      })},
                     {"call_timeout_ms", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &c.etcd.call_timeout_ms, 100, 60000);
                      })},
                     {"user", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.user); })},
                     {"password_file",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.password_file); })},
                     {"ca", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.ca_file); })},
                     {"cert",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.cert_file); })},
                     {"key", H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.etcd.key_file); })},
                 });
           })},
          {"directory", H([&](const toml::node& n, const std::string& k) {
             DirectoryConfig& d = c.directory;
             return p.Table(
                 n, k,
                 {
                     {"enabled", H([&](const toml::node& v, const std::string& kk) {
                        if (!v.is_boolean()) return p.Error(v, kk, "expected true or false");
                        d.enabled = *v.value<bool>();
                        return absl::OkStatus();
                      })},
                     {"expected_keys", H([&](auto& v, auto& kk) {
                        std::uint32_t x = 0;
                        auto s2 = p.U32(v, kk, &x, 0, 1 << 30);
                        d.expected_keys = x;
                        return s2;
                      })},
                     {"fp_rate",
                      H([&](auto& v, auto& kk) { return p.Real(v, kk, &d.fp_rate, 1e-6, 0.5); })},
                     {"bytes",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &d.bytes, 0, 1 << 20); })},
                     {"anchor_every", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &d.anchor_every, 1, 1 << 16);
                      })},
                     {"min_interval_ms", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &d.min_interval_ms, 10, 3600000);
                      })},
                     {"refresh_ms", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &d.refresh_ms, 100, 86400000);
                      })},
                 });
           })},
          {"events", H([&](const toml::node& n, const std::string& k) {
             EventsConfig& e = c.events;
             auto one_of = [&](const toml::node& v, const std::string& kk, std::string* out,
                               std::initializer_list<const char*> allowed) {
               if (auto s2 = p.Str(v, kk, out); !s2.ok()) return s2;
               for (const char* a : allowed) {
                 if (*out == a) return absl::OkStatus();
               }
               return p.Error(
                   v, kk,
                   absl::StrCat("'", *out, "' is not one of: ", absl::StrJoin(allowed, ", ")));
             };
             return p.Table(
                 n, k,
                 {
                     {"endpoint", H([&](auto& v, auto& kk) { return p.Str(v, kk, &e.endpoint); })},
                     {"topic", H([&](auto& v, auto& kk) { return p.Str(v, kk, &e.topic); })},
                     {"format", H([&](auto& v, auto& kk) {
                        return one_of(v, kk, &e.format, {"array", "map"});
                      })},
                     {"block_hash", H([&](auto& v, auto& kk) {
                        return one_of(v, kk, &e.block_hash, {"bytes", "uint64"});
                      })},
                     {"block_size", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &e.block_size, 1, 1 << 20);
                      })},
                     {"medium", H([&](auto& v, auto& kk) {
                        if (auto s2 = p.Str(v, kk, &e.medium); !s2.ok()) return s2;
                        return e.medium.empty() ? p.Error(v, kk,
                                                          "an empty medium: routers would read "
                                                          "it as their GPU tier; e.g. \"SHARED\"")
                                                : absl::OkStatus();
                      })},
                     {"data_parallel_rank", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &e.data_parallel_rank, 0, 1 << 20);
                      })},
                     {"interval_ms",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &e.interval_ms, 1, 60000); })},
                     {"hwm",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &e.hwm, 1, 1 << 24); })},
                 });
           })},
          {"keys", H([&](const toml::node& n, const std::string& k) {
             return p.Table(
                 n, k,
                 {
                     {"publish_file",
                      H([&](auto& v, auto& kk) { return p.Str(v, kk, &c.keys.publish_file); })},
                     {"unkeyed",
                      H([&](auto& v, auto& kk) { return p.Bool(v, kk, &c.keys.unkeyed); })},
                     {"directory_files", H([&](const toml::node& v, const std::string& kk) {
                        const toml::array* a = v.as_array();
                        if (a == nullptr) return p.Error(v, kk, "expected an array of file paths");
                        c.keys.directory_files.clear();
                        for (const toml::node& e : *a) {
                          std::string f;
                          if (auto s2 = p.Str(e, kk, &f); !s2.ok()) return s2;
                          c.keys.directory_files.push_back(f);
                        }
                        return absl::OkStatus();
                      })},
                 });
           })},
          {"placement", H([&](const toml::node&, const std::string&) {
             // tier/ owns the section's keys; it reads them from the same text.
             auto placement = tier::ParsePlacementConfig(text, source_name);
             if (!placement.ok()) return placement.status();
             c.placement = *std::move(placement);
             return absl::OkStatus();
           })},
          {"lmcache", H([&](const toml::node&, const std::string&) {
             // orchestrator/lmcache/ owns the section's keys (coordinator/config.h).
             auto lmcache = coordinator::ParseCoordinatorConfig(text, source_name);
             if (!lmcache.ok()) return lmcache.status();
             c.lmcache = *std::move(lmcache);
             return absl::OkStatus();
           })},
      });
  if (!st.ok()) return st;
  // Required keys and cross-key rules.
  auto missing = [&](absl::string_view key, absl::string_view example) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": key '", key, "' is required (for example ", example, ")"));
  };
  if (c.pool.empty()) return missing("domain.pool", "pool = \"file:/dev/shm/cxlkv-pool?size=8G\"");
  if (c.prefix_domain.empty()) {
    return missing("domain.prefix_domain",
                   "prefix_domain = \"file:/dev/shm/cxlkv-domain?size=64M\"");
  }
  if (c.state_file.empty())
    return missing("domain.state_file", "state_file = \"/var/lib/cxlkv/domain.state\"");
  if (c.socket.empty()) return missing("rpc.socket", "socket = \"/run/cxlkv/domain.sock\"");
  if (!c.tcp.empty()) {
    if (!IsHostPort(c.tcp, false)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": key 'rpc.tcp': '", c.tcp,
                       "' is not HOST:PORT with a port of 0..65535 (e.g. \"0.0.0.0:7443\")"));
    }
    if (c.token_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name,
          ": key 'rpc.token_file' is required with rpc.tcp (TCP peers have no "
          "credentials to check; every call must carry the domain's token), e.g. token_file = "
          "\"/etc/cxlkv/rpc.token\""));
    }
    auto token = ReadTokenFile(c.token_file, absl::StrCat(source_name, ": key 'rpc.token_file'"));
    if (!token.ok()) return token.status();
    c.token = *std::move(token);
  } else if (!c.token_file.empty() || !c.tls_cert.empty() || !c.tls_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name,
                     ": rpc.token_file, rpc.tls_cert and rpc.tls_key apply to rpc.tcp, which is "
                     "not set; add tcp = \"HOST:PORT\" or drop them"));
  }
  if (c.keys.unkeyed && !c.keys.publish_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name,
                     ": keys.unkeyed = true and keys.publish_file both set: the keys leave "
                     "either unkeyed or keyed with the file's secret; drop one of them"));
  }
  if (!c.keys.publish_file.empty()) {
    auto secret =
        ReadTokenFile(c.keys.publish_file, absl::StrCat(source_name, ": key 'keys.publish_file'"));
    if (!secret.ok()) return secret.status();
    c.keys.publish_secret = *std::move(secret);
  }
  c.keys.directory_secrets.clear();
  for (const std::string& f : c.keys.directory_files) {
    auto secret = ReadTokenFile(f, absl::StrCat(source_name, ": key 'keys.directory_files'"));
    if (!secret.ok()) return secret.status();
    c.keys.directory_secrets.push_back(*std::move(secret));
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": rpc.tls_cert and rpc.tls_key go together (the certificate and its key)"));
  }
  if (c.extent_bytes % (2u << 20) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": key 'domain.extent_size': ", c.extent_bytes,
        " bytes is not a multiple of 2 MiB (extents are mapped with huge-page alignment)"));
  }
  if (c.heartbeat_period_ms * 4 > c.host_ttl_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": key 'timing.heartbeat_period_ms': ", c.heartbeat_period_ms,
                     " ms must be at most host_ttl_ms / 4 (", c.host_ttl_ms / 4, " ms)"));
  }
  if (c.capacity_lease_ms < c.host_ttl_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": key 'timing.capacity_lease_ms': must be at least host_ttl_ms (",
        c.host_ttl_ms, " ms): a host's extents must outlive its fencing"));
  }
  if (c.etcd.enabled()) {
    if (c.etcd.domain.empty()) c.etcd.domain = c.name;
    auto bad_name = [](const std::string& v) {
      return v.empty() || v.find_first_of("/ \t\n") != std::string::npos;
    };
    if (bad_name(c.etcd.domain)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name,
                       ": [etcd] needs the domain's name for its keys: set domain.name or "
                       "etcd.domain (no '/' or spaces), got '",
                       c.etcd.domain, "'"));
    }
    if (bad_name(c.etcd.cluster)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": key 'etcd.cluster': '", c.etcd.cluster,
                       "' must be a non-empty name without '/' or spaces"));
    }
    if (c.etcd.user.empty() != c.etcd.password_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name,
          ": keys 'etcd.user' and 'etcd.password_file' go together (etcd authentication): "
          "give both or neither"));
    }
    if (!c.etcd.password_file.empty()) {
      auto pw = ReadSmallFile(c.etcd.password_file, "etcd.password_file");
      if (!pw.ok()) return pw.status();
      c.etcd.password = std::string(absl::StripTrailingAsciiWhitespace(*pw));
    }
    if (c.etcd.ca_file.empty() && (!c.etcd.cert_file.empty() || !c.etcd.key_file.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name,
          ": keys 'etcd.cert'/'etcd.key' need 'etcd.ca' (the CA that signs the members' "
          "certificates): TLS to etcd"));
    }
    if (c.etcd.cert_file.empty() != c.etcd.key_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": keys 'etcd.cert' and 'etcd.key' go together: give both or neither"));
    }
    for (auto [file, pem, key] : {std::tuple{&c.etcd.ca_file, &c.etcd.ca_pem, "etcd.ca"},
                                  std::tuple{&c.etcd.cert_file, &c.etcd.cert_pem, "etcd.cert"},
                                  std::tuple{&c.etcd.key_file, &c.etcd.key_pem, "etcd.key"}}) {
      if (file->empty()) continue;
      auto contents = ReadSmallFile(*file, key);
      if (!contents.ok()) return contents.status();
      *pem = *std::move(contents);
    }
    if (c.etcd.margin_ms == 0) c.etcd.margin_ms = c.etcd.ttl_s * 1000 / 4;
    if (c.etcd.margin_ms >= c.etcd.ttl_s * 1000 * 2 / 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": key 'etcd.margin_ms': ", c.etcd.margin_ms,
          " ms must be below 2/3 of etcd.ttl_s (keep-alives go every ttl/3; the leader writes "
          "until ttl - margin after each)"));
    }
  } else if (!c.etcd.node.empty() || !c.etcd.domain.empty() || c.etcd.ttl_s != 3 ||
             c.etcd.margin_ms != 0 || c.etcd.cluster != "default" || !c.etcd.user.empty() ||
             !c.etcd.password_file.empty() || !c.etcd.ca_file.empty() ||
             !c.etcd.cert_file.empty() || !c.etcd.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name,
                     ": the [etcd] section has no endpoints: add endpoints = [\"host:port\", "
                     "...] for orchestrator HA, or drop the section"));
  }
  for (std::uint32_t h : c.allowed_hosts) {
    if (h >= c.max_hosts) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": key 'hosts.allowed': host id ",
                                                     h, " is not below domain.max_hosts (",
                                                     c.max_hosts, ")"));
    }
  }
  if (auto st2 = CheckAcrossKeys(c, source_name); !st2.ok()) return st2;
  if (auto st2 = CheckEventsForLlmd(c.events, source_name); !st2.ok()) return st2;
  if (c.lmcache.enabled()) {
    // The domain's eviction policy for LMCache's tenants: [[namespace]] pin levels, where the
    // namespace is one of the coordinator's ("<tenant>/lmcache/<layout_id>").
    for (const NamespaceConfig& ns : c.namespaces) {
      if (ns.model == "lmcache") c.lmcache.pins[ns.Name()] = ns.pin;
    }
    if (auto lst =
            coordinator::ResolveCoordinatorConfig(&c.lmcache, c.name, c.state_file, c.extent_bytes);
        !lst.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", lst.message()));
    }
  }
  return c;
}

absl::StatusOr<int> Config::PinLevelOf(absl::string_view ns) const {
  std::string known;
  for (const NamespaceConfig& n : namespaces) {
    if (n.Name() == ns) return n.pin;
    absl::StrAppend(&known, known.empty() ? "" : ", ", n.Name());
  }
  return absl::NotFoundError(absl::StrCat(
      "namespace '", ns, "' is not in the configuration (",
      known.empty() ? "it has no [[namespace]] tables" : absl::StrCat("known: ", known), ")"));
}

absl::Status CheckConfigOnHost(const Config& c) {
  struct stat sb {};
  if (::stat(c.state_file.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "domain.state_file ", c.state_file, " is ",
        S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file", ": name a file (e.g. ",
        c.state_file, S_ISDIR(sb.st_mode) ? "/domain.state" : ".state",
        ") where the domain's state is kept"));
  }
  const struct {
    const char* key;
    const std::string& spec;
    const char* holds;
  } regions[] = {{"domain.pool", c.pool, "every host's extents"},
                 {"domain.prefix_domain", c.prefix_domain, "the domain's shared prefix index"}};
  for (const auto& r : regions) {
    auto spec = pool::ParseSourceSpec(r.spec);
    if (!spec.ok() || spec->kind != pool::SourceKind::kFile || spec->size_bytes == 0) continue;
    if (::stat(spec->path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) continue;
    const auto have = static_cast<std::uint64_t>(sb.st_size);
    if (have != spec->size_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.key, " '", r.spec, "': the file is ", have, " bytes (", base::FormatBytes(have),
          ") but size= asks for ", spec->size_bytes, ". The file holds ", r.holds,
          ": set size= back to ", base::FormatBytes(have),
          " (or drop size=); a domain's regions cannot be resized in place, and removing the "
          "file discards what it holds"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config '", path, "' is ", S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file",
        ": pass --config with the domain's TOML file (e.g. ", path,
        S_ISDIR(sb.st_mode) ? "/domain.toml)" : " -> /etc/cxlkv/domain.toml)"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read config '", path,
                                            "' (pass --config with a readable domain.toml)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

}  // namespace cxlkv::orchestrator
