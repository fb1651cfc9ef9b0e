// cxlkv/orchestrator/state.h — what the orchestrator knows and must not forget: hosts
// (membership, incarnations, liveness on the orchestrator's clock) and extents (capacity
// leases on the pooled region). Pure logic with an injected clock; not thread-safe (the
// daemon holds one mutex around it). Every change that must survive a kill -9 is written
// to the state file before the reply that reveals it (Save: temp file, fsync, rename,
// fsync of the directory; a CRC32C over the contents).
#ifndef CXLKV_ORCHESTRATOR_STATE_H_
#define CXLKV_ORCHESTRATOR_STATE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/config.h"

namespace cxlkv::orchestrator {

enum class HostState : std::uint8_t { kAbsent, kLive, kFenced, kDraining, kLeft };
const char* HostStateName(HostState s);

struct HostInfo {
  HostState state = HostState::kAbsent;
  std::uint64_t incarnation = 0;
  std::int64_t last_heartbeat_ms = 0;  // orchestrator clock
  std::uint64_t used_bytes = 0;
  std::string hostname;
  // What a busy or stopped machine cost its leases, as its last heartbeat said (kept in
  // memory only: a restart of the orchestrator hears them again at the next heartbeat).
  coherence::PrefixHost::Stats lease{};
  // The operator drained this host id: it stands while the host is fenced, across its rejoins
  // (a join comes back kDraining, not kLive) and the orchestrator's restarts, until the host
  // leaves. Without it a busy machine that missed host_ttl_ms once would rejoin live and grow
  // again after its operator drained it.
  bool drain = false;
};

// An extent is free, assigned (held by host/incarnation under a capacity lease), or
// quarantined: its holder lost or gave it back, but it may still hold an arena whose blocks
// published prefix entries name, or a zombie holder may still write until its old lease
// term. A quarantined extent is lent again only once expires_ms has passed and the
// orchestrator has seen the prefix index drop every entry naming its arena.
struct ExtentInfo {
  std::uint32_t host = kNoHost;  // the holder; kNoHost: free or quarantined
  std::uint64_t incarnation = 0;
  std::int64_t expires_ms = 0;  // orchestrator clock; renewed by the holder's heartbeats
  bool quarantined = false;
  std::uint32_t former_host = kNoHost;  // quarantined: who held it
  std::string arena;           // quarantined: the arena found in it (32 hex digits), "" if none yet
  bool arena_checked = false;  // quarantined: the extent's header has been read
  static constexpr std::uint32_t kNoHost = ~0u;
  bool free() const { return host == kNoHost && !quarantined; }
  const char* state_name() const {
    return quarantined ? "quarantined" : host == kNoHost ? "free" : "assigned";
  }
};

class DomainState {
 public:
  DomainState(const Config& c, std::uint64_t pool_bytes);

  // Loads the state file (timers restart at now: conservative). kNotFound naming the file if
  // it does not exist: whether that is a new domain or a lost file is the caller's call
  // (Orchestrator::Open, --new-domain). kDataLoss if it is corrupt or does not match the
  // pool (never silently discarded).
  absl::Status Load(std::int64_t now_ms);
  // Writes the state file (base::ReplaceFile: temp file, fdatasync, rename, fsync of the
  // directory). Any failure, the directory's open and fsync included, is kInternal naming the
  // path and the step; the caller must then not reveal the change.
  absl::Status Save() const;
  // A new domain on a prefix domain that was already in use: every extent starts quarantined
  // for a full capacity lease, as if a host had held it (its arena is revoked at the owner
  // and the extent is free once no entry names it).
  void QuarantineAll(std::int64_t now_ms);

  // kPermissionDenied: host id not allowed by the config. kAlreadyExists: the id is live (its
  // last heartbeat within host_ttl_ms) and held by another machine — two machines configured
  // with the same host id (hostname is "MACHINE pid N", as HostClient sends it; a join from the
  // same machine is a restart and takes the row over, as does any join once the holder's
  // heartbeat is older than host_ttl_ms, or when either side's machine is unknown). The message
  // names both machines and the fix.
  absl::StatusOr<std::uint64_t> Join(std::uint32_t host, const std::string& hostname,
                                     std::int64_t now_ms);
  // kFailedPrecondition: not the current incarnation, or fenced (rejoin).
  absl::Status Heartbeat(std::uint32_t host, std::uint64_t incarnation, std::uint64_t used_bytes,
                         std::int64_t now_ms);
  // The lease counters a heartbeat of the current incarnation carried (HostInfo::lease).
  void NoteLeaseCounters(std::uint32_t host, const coherence::PrefixHost::Stats& lease) {
    if (host < hosts_.size()) hosts_[host].lease = lease;
  }
  // The host leaves: its extents are quarantined until their lease term ends (the process
  // may write them until it exits), like a lost lease's; also for a fenced incarnation.
  absl::Status Leave(std::uint32_t host, std::uint64_t incarnation, std::int64_t now_ms);
  // Grants up to n free extents within the host's share. kResourceExhausted when none.
  absl::StatusOr<std::vector<std::uint32_t>> Grow(std::uint32_t host, std::uint64_t incarnation,
                                                  std::uint32_t n, std::int64_t now_ms);
  // Gives extents back: they go into quarantine (published blocks may still live there).
  absl::Status Shrink(std::uint32_t host, std::uint64_t incarnation,
                      const std::vector<std::uint32_t>& extents, std::int64_t now_ms);
  // Marks the host drained (HostInfo::drain): a live one becomes kDraining, a fenced one comes
  // back draining when it rejoins; again on a drained host is no error. kFailedPrecondition for
  // an id that is absent or has left.
  absl::Status Drain(std::uint32_t host);
  // Fences hosts silent for host_ttl and quarantines extents whose lease ended. Returns
  // whether anything changed (the caller saves).
  bool Expire(std::int64_t now_ms);
  // Quarantine bookkeeping (the orchestrator reads the extents' arena headers and asks the
  // prefix owner): the arena found in extent i ("" if none), and the end of its quarantine.
  void SetQuarantineArena(std::uint32_t i, const std::string& arena_hex);
  void ReleaseQuarantine(std::uint32_t i);

  const std::vector<HostInfo>& hosts() const { return hosts_; }
  const std::vector<ExtentInfo>& extents() const { return extents_; }
  std::uint64_t extent_offset(std::uint32_t i) const { return std::uint64_t{i} * c_.extent_bytes; }
  std::uint32_t ExtentsOf(std::uint32_t host) const;
  std::uint32_t recovered_extents() const { return recovered_; }
  // How many times this state was saved (HA: bumped before each write to etcd; 0 in states
  // written before it existed). The domain's fence line records the generation its leader
  // last saved, so a state older than the domain (etcd restored from a backup or rebuilt, a
  // stale state-file cache, a wrong etcd.cluster) is told apart (docs/ha.md).
  std::uint64_t generation() const { return generation_; }
  void set_generation(std::uint64_t g) { generation_ = g; }
  const Config& config() const { return c_; }

  // The state file's contents, and parsing them (exposed for tests and the fuzzer).
  std::string Serialize() const;
  absl::Status Deserialize(const std::string& text, std::int64_t now_ms);

 private:
  absl::Status CheckCurrent(std::uint32_t host, std::uint64_t incarnation) const;
  // Takes every extent of `host` away from it into quarantine until its lease term ends.
  void RevokeExtentsOf(std::uint32_t host);
  void Revoke(std::uint32_t i, std::int64_t reuse_ms);

  Config c_;
  std::uint64_t pool_bytes_;
  std::vector<HostInfo> hosts_;
  std::vector<ExtentInfo> extents_;
  std::uint32_t recovered_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_STATE_H_
