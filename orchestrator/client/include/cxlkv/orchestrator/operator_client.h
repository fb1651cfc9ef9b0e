// cxlkv/orchestrator/operator_client.h — the operator's side of the orchestrator's control
// plane (what `cxlkvctl status|hosts|extents|prefixes|drain|evict` shows and does), as plain
// structs: the domain at a glance, its hosts, its extents, the shared prefix index, and the
// two operator actions (drain a host, evict a namespace's prefixes).
//
// Unlike HostClient, an OperatorClient joins nothing and holds no lease: each call is one
// RPC with a deadline, and a call fails at once (kUnavailable) when no orchestrator listens
// on the endpoint, instead of waiting for one to come up.
//
// Errors: Connect() fails with the endpoint's error (endpoint.h: a malformed tcp: address,
// a missing or unsafe token file, an unreadable CA). A call fails with the orchestrator's
// own status, code and message unchanged (e.g. kFailedPrecondition "host 3 is not live",
// kUnauthenticated for a wrong token); kUnavailable or kDeadlineExceeded when no
// orchestrator answers in time, and kUnavailable for a uid outside rpc.allowed_uids (the
// daemon closes such a connection at accept and logs the uid).
//
// Thread-safety: calls may be made from several threads at once.
#ifndef CXLKV_ORCHESTRATOR_OPERATOR_CLIENT_H_
#define CXLKV_ORCHESTRATOR_OPERATOR_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlkv/orchestrator/client.h"

namespace cxlkv::orchestrator {

// The domain at a glance (Status RPC).
struct DomainStatus {
  std::string domain_spec;  // the shared prefix domain's source
  std::string pool_spec;    // the pooled region extents are carved from
  std::uint64_t pool_bytes = 0;
  std::uint64_t extent_bytes = 0;
  std::uint32_t extents_total = 0;
  std::uint32_t extents_free = 0;
  std::uint32_t extents_assigned = 0;
  std::uint32_t hosts_live = 0;
  std::uint32_t hosts_fenced = 0;
  std::uint64_t prefixes_published = 0;
  std::uint64_t prefix_duplicates = 0;
  std::uint64_t prefixes_reclaimed = 0;
  std::uint64_t prefixes_evicted = 0;
  std::int64_t uptime_ms = 0;
  std::uint64_t recovered_at_start = 0;  // extent assignments restored from the state file
  std::uint32_t extents_quarantined = 0;
  // Orchestrator HA (docs/ha.md): "single" without etcd, else "leader", "read-only" (the
  // leader lost etcd; read_only_since says since when) or "standby"; the leader's epoch, the
  // leader and the standbys as etcd names them (JSON each).
  std::string role;
  std::int64_t epoch = 0;
  std::string leader;
  std::vector<std::string> standbys;
  std::string read_only_since;
  // [[namespace]] tables no published block matched while others did (a name typo, most
  // likely): "tenant/model/layout" each.
  std::vector<std::string> unmatched_namespaces;
};

// An extent as the operator sees it (Extents RPC): what HostClient::ListExtents gives, plus
// its holder's incarnation and the lease or quarantine details.
struct ExtentDetail : ExtentView {
  std::uint64_t incarnation = 0;  // the holder's (quarantined: the former holder's)
  // Time left on the orchestrator's clock when it answered: of the holder's lease, or of a
  // quarantine before the extent may be lent again at the earliest; 0 when free.
  std::int64_t expires_in_ms = 0;
  // Quarantined: the arena found in it (32 hex digits) whose published blocks must be
  // reclaimed before the extent is lent again; "" otherwise.
  std::string arena;
};

// One host of the domain (Hosts RPC).
struct HostView {
  std::uint32_t host_id = 0;
  std::uint64_t incarnation = 0;
  std::string state;                       // live | fenced | draining | left
  std::int64_t last_heartbeat_ms_ago = 0;  // on the orchestrator's clock
  std::uint32_t extents = 0;
  std::uint64_t used_bytes = 0;  // as the host reports it
  std::string hostname;          // as the host gave it; for operators, not trusted
  // What a busy or stopped machine cost its leases, as it last reported (HostCounters::lease).
  coherence::PrefixHost::Stats lease{};
};

// One entry of the shared prefix index (Prefixes RPC).
struct PrefixView {
  std::uint32_t entry = 0;
  std::string state;     // published | retired
  std::uint64_t ns = 0;  // the namespace's hash
  std::string key;       // the prefix key, hex
  std::uint32_t publisher = 0;
  std::uint32_t block_index = 0;
};
struct PrefixList {
  std::vector<PrefixView> prefixes;          // up to the limit asked for
  std::uint32_t published = 0, retired = 0;  // in the whole index
};

class OperatorClient {
 public:
  // Resolves `where` (endpoint.h: a Unix socket path, unix:PATH or tcp:HOST:PORT) and opens
  // a channel; no RPC yet. Each later call waits at most `deadline`.
  static absl::StatusOr<std::unique_ptr<OperatorClient>> Connect(
      const std::string& where, std::chrono::milliseconds deadline = std::chrono::seconds(5));
  ~OperatorClient();
  OperatorClient(const OperatorClient&) = delete;
  OperatorClient& operator=(const OperatorClient&) = delete;

  absl::StatusOr<DomainStatus> Status();
  absl::StatusOr<std::vector<HostView>> Hosts();
  // Every extent of the pooled region, by index.
  absl::StatusOr<std::vector<ExtentDetail>> Extents();
  // The first `limit` entries in use (0: all) and the index's totals.
  absl::StatusOr<PrefixList> Prefixes(std::uint32_t limit);
  // Stops host_id growing and asks it to give its extents back (kFailedPrecondition: the
  // host is not live).
  absl::Status Drain(std::uint32_t host_id);
  // Retires every shared prefix of `ns` ("tenant/model/layout", a [[namespace]] of the
  // daemon's config; kNotFound otherwise); returns how many entries it retired.
  absl::StatusOr<std::uint32_t> Evict(const std::string& ns);

 private:
  struct Rpc;
  explicit OperatorClient(std::unique_ptr<Rpc> rpc);
  std::unique_ptr<Rpc> rpc_;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_OPERATOR_CLIENT_H_
