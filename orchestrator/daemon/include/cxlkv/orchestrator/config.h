// cxlkv/orchestrator/config.h — the orchestrator's configuration (domain.toml).
//
// One file per CXL domain; see orchestrator/domain.example.toml for every key. Parsing is
// strict: an unknown key, a wrong type or an out-of-range value is an error naming the key
// and its line, so a typo never silently falls back to a default.
#ifndef CXLKV_ORCHESTRATOR_CONFIG_H_
#define CXLKV_ORCHESTRATOR_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/orchestrator/lmcache/config.h"
#include "cxlkv/tier/placement_config.h"

namespace cxlkv::orchestrator {

struct NamespaceConfig {
  std::string tenant, model, layout;
  int pin = 0;  // 0..3: higher levels are evicted later
  std::string Name() const { return tenant + "/" + model + "/" + layout; }
};

// [etcd]: orchestrator HA (docs/ha.md). Without endpoints, the single orchestrator of today.
struct EtcdConfig {
  std::vector<std::string> endpoints;    // host:port of the etcd members; empty: no HA
  std::string cluster = "default";       // keys live under /cxlkv/v1/<cluster>/
  std::string domain;                    // the domain's name in etcd; "" : domain.name
  std::uint32_t ttl_s = 3;               // the session lease: a dead leader's successor waits this
  std::uint32_t margin_ms = 0;           // 0: ttl / 4; the leader stops writing this long before
                                         // its lease can expire
  std::string node;                      // this orchestrator's name; "" : hostname:pid
  std::uint32_t call_timeout_ms = 1000;  // one etcd call, failover to other members included
  // etcd authentication: the user, and the file holding its password (read at load time into
  // `password`). "" : none.
  std::string user, password_file, password;
  // TLS to etcd: the CA (PEM file) that signs the members' certificates, and optionally this
  // orchestrator's client certificate and key; their contents are read at load time.
  std::string ca_file, cert_file, key_file;
  std::string ca_pem, cert_pem, key_pem;
  bool enabled() const { return !endpoints.empty(); }
};

// [directory]: this domain's entry in the cross-domain prefix directory (docs/ha.md), kept in
// etcd by the leader; only with [etcd].
struct DirectoryConfig {
  bool enabled = true;
  std::uint64_t expected_keys = 0;       // the count the filter is sized for; 0: index_entries
  double fp_rate = 0.01;                 // the false-positive rate at expected_keys
  std::uint32_t bytes = 0;               // the filter's size; 0: from expected_keys and fp_rate
  std::uint32_t anchor_every = 1;        // one key in N goes into the filter (1: every key)
  std::uint32_t min_interval_ms = 1000;  // at most one write per this, on change
  std::uint32_t refresh_ms = 30000;      // rewritten this often even without a change
};

// [events]: KV events for routers in vLLM's wire format (docs/kv_events.md); off without an
// endpoint.
struct EventsConfig {
  std::string endpoint;              // ZMQ: "tcp://*:5557" binds, "tcp://host:port" connects
  std::string topic;                 // "" : "cxlkv/<domain>" (the domain id travels here)
  std::string format = "array";      // "array" (positional, tagged) or "map" (vLLM >= #42892)
  std::string block_hash = "bytes";  // "bytes" (16, high word first) or "uint64" (low word)
  std::uint32_t block_size = 16;     // tokens per block, as the engines using the domain have it
  std::uint32_t data_parallel_rank = 0;
  // The tier routers see: Dynamo's StorageTier::from_kv_medium reads "SHARED" (also
  // "EXTERNAL", "REMOTE", "NETWORK") as its External tier; llm-d v0.8.1 lowercases the medium
  // and weighs a tier its backendConfigs do not list at 1.0, as GPU. docs/kv_events.md.
  std::string medium = "SHARED";
  std::uint32_t interval_ms = 100;  // how often the index is compared with the last events
  std::uint32_t hwm = 100000;       // ZMQ send high-water mark
  bool enabled() const { return !endpoint.empty(); }
};

// [keys]: the secret that keys the chain keys leaving the domain (KV events and the directory
// summary; cxlkv/orchestrator/published_key.h, docs/kv_events.md "What a subscriber can
// learn"), and the other domains' secrets with which the Directory RPC answers for them.
// Files follow the token file's rules (mode 600, 16 to 4096 printable characters). By default
// the keys leave keyed with the domain's own secret, which its first owner creates in the
// domain (coherence::DomainKeyLine; `cxlkvctl publish-key` writes it out for routers).
struct KeysConfig {
  std::string publish_file;                  // a secret of the operator's instead of the domain's
  std::string publish_secret;                // its contents, read when the config is loaded
  bool unkeyed = false;                      // opt-out: chain keys leave the domain as they are
  std::vector<std::string> directory_files;  // other domains' publish secrets
  std::vector<std::string> directory_secrets;
};

struct Config {
  // [domain]
  std::string name;
  std::string pool;           // source spec of the pooled region extents are carved from
  std::string prefix_domain;  // source spec of the shared prefix index (formatted if blank)
  std::uint64_t extent_bytes = 256ull << 20;
  std::string state_file;
  std::uint32_t max_hosts = 8;
  std::uint32_t index_entries = 4096;
  std::uint32_t lease_rows = 256;
  std::uint32_t ring_slots = 64;
  // [rpc]
  std::string socket;
  std::vector<std::uint32_t> allowed_uids;  // besides the daemon's own uid
  std::string tcp;                          // HOST:PORT; empty: Unix socket only
  std::string token_file;                   // required with tcp: every TCP call carries this token
  std::string token;                        // its contents, read when the config is loaded
  std::string tls_cert, tls_key;            // PEM files: TCP with TLS (both or neither)
  // [metrics]
  std::string metrics_listen;  // host:port; empty: no endpoint
  // [timing]
  std::uint32_t lease_ttl_ms = 2000;
  std::uint32_t host_ttl_ms = 2000;
  std::uint32_t heartbeat_period_ms = 250;
  std::uint32_t grace_ms = 100;
  std::uint32_t capacity_lease_ms = 10000;
  std::uint32_t owner_period_ms = 5;
  // [hosts]
  std::vector<std::uint32_t> allowed_hosts;  // empty: every id below max_hosts
  // [capacity]
  double default_share = 1.0;              // fraction of the extents one host may hold
  std::map<std::uint32_t, double> shares;  // per host id
  // [[namespace]]
  std::vector<NamespaceConfig> namespaces;
  // [etcd]
  EtcdConfig etcd;
  // [directory], [events]
  DirectoryConfig directory;
  EventsConfig events;
  // [keys]
  KeysConfig keys;
  // [placement], parsed by tier/ (tier/placement_config.h): the CXL-vs-NVMe rule's parameters
  // in SI units, the reuse tracker's size, and an optional calibration file whose figures
  // replace the configured ones.
  tier::PlacementConfig placement;
  // [lmcache]: LMCache's memory coordinator API (orchestrator/lmcache/, docs/lmcache.md), off
  // without the section; it owns the pool's last extents, enough for lmcache.region_size.
  coordinator::CoordinatorConfig lmcache;

  // The pin level of a namespace named "tenant/model/layout"; kNotFound lists the known ones.
  absl::StatusOr<int> PinLevelOf(absl::string_view ns) const;

  bool HostAllowed(std::uint32_t host) const;
  double ShareOf(std::uint32_t host) const;
};

// Parses a configuration. Errors are kInvalidArgument: "<source>:<line>: key '<k>': <what>".
// Beyond single keys it checks what needs no device: the pool and the prefix domain against
// each other (the same file or device with overlapping windows names both keys), page
// multiples, the extent against the pool's size=, the prefix domain's geometry against its
// size=, the socket path's length, HOST:PORT values and [capacity.shares] host ids.
absl::StatusOr<Config> ParseConfig(absl::string_view toml, absl::string_view source_name);
// Errors naming the file and the fix, kInvalidArgument for a path that is not a regular file.
absl::StatusOr<Config> LoadConfig(const std::string& path);
// The checks of a parsed configuration against this host that need no device and change
// nothing: domain.state_file is not a directory; an existing pool or prefix-domain file has
// the size its size= asks for. `cxlkv-orchestrator --validate` and Orchestrator::Open run it.
// kInvalidArgument naming the key and the fix.
absl::Status CheckConfigOnHost(const Config& c);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_CONFIG_H_
