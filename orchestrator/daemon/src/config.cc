// domain.toml parsing with toml++: every key is known, typed and range-checked.
#include "cxlkv/orchestrator/config.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/spec.h"
#include "cxlkv/pool/toml_reader.h"

namespace cxlkv::orchestrator {
namespace {

// domain.toml's readers, and two more the orchestrator's sections use.
class Parser : public pool::TomlReader {
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
  absl::StatusOr<toml::table> parsed = pool::ParseToml(text, source_name);
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
                                {"grace_ms", H([&](auto& v, auto& kk) {
                                   return p.U32(v, kk, &c.grace_ms, 0, 600000);
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
                     {"data_parallel_rank", H([&](auto& v, auto& kk) {
                        return p.U32(v, kk, &e.data_parallel_rank, 0, 1 << 20);
                      })},
                     {"interval_ms",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &e.interval_ms, 1, 60000); })},
                     {"hwm",
                      H([&](auto& v, auto& kk) { return p.U32(v, kk, &e.hwm, 1, 1 << 24); })},
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
    if (c.tcp.rfind(':') == std::string::npos || c.tcp.back() == ':') {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": key 'rpc.tcp': '", c.tcp,
                                                     "' is not HOST:PORT (e.g. \"0.0.0.0:7443\")"));
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
    if (c.etcd.margin_ms == 0) c.etcd.margin_ms = c.etcd.ttl_s * 1000 / 4;
    if (c.etcd.margin_ms >= c.etcd.ttl_s * 1000 * 2 / 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_name, ": key 'etcd.margin_ms': ", c.etcd.margin_ms,
          " ms must be below 2/3 of etcd.ttl_s (keep-alives go every ttl/3; the leader writes "
          "until ttl - margin after each)"));
    }
  } else if (!c.etcd.node.empty() || !c.etcd.domain.empty() || c.etcd.ttl_s != 3 ||
             c.etcd.margin_ms != 0 || c.etcd.cluster != "default") {
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
  if (c.lmcache.enabled()) {
    if (c.etcd.enabled()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name,
                       ": [lmcache] with [etcd] is not supported yet: the coordinator's state is "
                       "a local file, not in etcd (docs/lmcache.md \"Not done here\"); run the "
                       "coordinator's domain without [etcd]"));
    }
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

absl::StatusOr<Config> LoadConfig(const std::string& path) {
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
