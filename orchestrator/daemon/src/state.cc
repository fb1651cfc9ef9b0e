// DomainState: membership and capacity leases, and their state file.
#include "cxlkv/orchestrator/state.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/file.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/pool/region.h"
#include "nlohmann/json.hpp"

namespace cxlkv::orchestrator {
namespace {

// The machine part of a Join's hostname ("MACHINE pid N", HostClient::Join); "" when unknown.
std::string MachineOf(const std::string& hostname) {
  const std::size_t pid = hostname.find(" pid ");
  return pid == std::string::npos ? hostname : hostname.substr(0, pid);
}

}  // namespace

const char* HostStateName(HostState s) {
  switch (s) {
    case HostState::kAbsent:
      return "absent";
    case HostState::kLive:
      return "live";
    case HostState::kFenced:
      return "fenced";
    case HostState::kDraining:
      return "draining";
    case HostState::kLeft:
      return "left";
  }
  return "?";
}

DomainState::DomainState(const Config& c, std::uint64_t pool_bytes)
    : c_(c),
      pool_bytes_(pool_bytes),
      hosts_(c.max_hosts),
      extents_(static_cast<std::size_t>(pool_bytes / c.extent_bytes)) {}

absl::Status DomainState::CheckCurrent(std::uint32_t host, std::uint64_t incarnation) const {
  if (host >= hosts_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host id ", host, " is not below max_hosts ", hosts_.size()));
  }
  const HostInfo& h = hosts_[host];
  if (h.state == HostState::kFenced) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", host, " incarnation ", incarnation, " was fenced: join again"));
  }
  if (h.incarnation != incarnation || h.state == HostState::kAbsent ||
      h.state == HostState::kLeft) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", host, " incarnation ", incarnation, " is not current (current ",
                     h.incarnation, ", ", HostStateName(h.state), "): join again"));
  }
  return absl::OkStatus();
}

void DomainState::Revoke(std::uint32_t i, std::int64_t reuse_ms) {
  ExtentInfo& e = extents_[i];
  ExtentInfo q;
  q.incarnation = e.incarnation;
  q.expires_ms = reuse_ms;
  q.quarantined = true;
  q.former_host = e.host;
  e = q;
}

void DomainState::RevokeExtentsOf(std::uint32_t host) {
  for (std::uint32_t i = 0; i < extents_.size(); ++i) {
    if (extents_[i].host == host) Revoke(i, extents_[i].expires_ms);
  }
}

void DomainState::SetQuarantineArena(std::uint32_t i, const std::string& arena_hex) {
  if (i >= extents_.size() || !extents_[i].quarantined) return;
  extents_[i].arena = arena_hex;
  extents_[i].arena_checked = true;
}

void DomainState::ReleaseQuarantine(std::uint32_t i) {
  if (i < extents_.size() && extents_[i].quarantined) extents_[i] = ExtentInfo{};
}

void DomainState::QuarantineAll(std::int64_t now_ms) {
  for (ExtentInfo& e : extents_) {
    e = ExtentInfo{};
    e.quarantined = true;
    e.expires_ms = now_ms + c_.capacity_lease_ms;
  }
}

std::uint32_t DomainState::ExtentsOf(std::uint32_t host) const {
  std::uint32_t n = 0;
  for (const ExtentInfo& e : extents_) n += e.host == host;
  return n;
}

absl::StatusOr<std::uint64_t> DomainState::Join(std::uint32_t host, const std::string& hostname,
                                                std::int64_t now_ms) {
  if (!c_.HostAllowed(host)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "host id ", host, " is not allowed in this domain (hosts.allowed / domain.max_hosts)"));
  }
  HostInfo& h = hosts_[host];
  const std::string holder = MachineOf(h.hostname), joiner = MachineOf(hostname.substr(0, 64));
  if ((h.state == HostState::kLive || h.state == HostState::kDraining) &&
      now_ms - h.last_heartbeat_ms <= c_.host_ttl_ms && !holder.empty() && !joiner.empty() &&
      holder != joiner) {
    return absl::AlreadyExistsError(absl::StrCat(
        "host id ", host, " is live on machine '", holder, "' ('", h.hostname,
        "', last heartbeat ", now_ms - h.last_heartbeat_ms, " ms ago) and machine '", joiner,
        "' ('", hostname,
        "') asks for it too: two machines are configured with the same host id; give each "
        "machine its own host_id range (for SGLang: a host_id per engine that leaves room for "
        "its dp*pp*cp*tp ranks), or, if '",
        holder, "' is gone, join again after host_ttl_ms (", c_.host_ttl_ms, " ms)"));
  }
  // A new incarnation: what the old one held goes into quarantine until its old lease term
  // ends (the old incarnation may be a zombie that still writes) and no published entry
  // names a block in it.
  RevokeExtentsOf(host);
  h.incarnation += 1;
  h.state = h.drain ? HostState::kDraining : HostState::kLive;
  h.last_heartbeat_ms = now_ms;
  h.used_bytes = 0;
  h.lease = {};  // a new process: its counters start again
  h.hostname = hostname.substr(0, 64);
  return h.incarnation;
}

absl::Status DomainState::Heartbeat(std::uint32_t host, std::uint64_t incarnation,
                                    std::uint64_t used_bytes, std::int64_t now_ms) {
  if (auto st = CheckCurrent(host, incarnation); !st.ok()) return st;
  HostInfo& h = hosts_[host];
  h.last_heartbeat_ms = now_ms;
  h.used_bytes = used_bytes;
  for (ExtentInfo& e : extents_) {
    if (e.host == host && e.incarnation == incarnation)
      e.expires_ms = now_ms + c_.capacity_lease_ms;
  }
  return absl::OkStatus();
}

absl::Status DomainState::Leave(std::uint32_t host, std::uint64_t incarnation,
                                std::int64_t /*now_ms*/) {
  // A fenced host may still say goodbye (its host state becomes "left").
  const bool fenced_self = host < hosts_.size() && hosts_[host].state == HostState::kFenced &&
                           hosts_[host].incarnation == incarnation;
  if (!fenced_self) {
    if (auto st = CheckCurrent(host, incarnation); !st.ok()) return st;
  }
  // Quarantined until their lease term ends, not from now: a leaving process may still write
  // its extents until it is gone (the preload's exit Leave runs before static destructors
  // and while other threads still run; docs/preload.md "Exit"), and its published blocks
  // still hold them. The term is what a zombie holder of a lost lease may use too.
  RevokeExtentsOf(host);
  hosts_[host].state = HostState::kLeft;
  hosts_[host].drain = false;  // drained and gone: the next process on this id starts live
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::uint32_t>> DomainState::Grow(std::uint32_t host,
                                                             std::uint64_t incarnation,
                                                             std::uint32_t n, std::int64_t now_ms) {
  if (auto st = CheckCurrent(host, incarnation); !st.ok()) return st;
  if (hosts_[host].state == HostState::kDraining) {
    return absl::FailedPreconditionError(absl::StrCat("host ", host, " is being drained"));
  }
  if (n == 0) return absl::InvalidArgumentError("grow by at least one extent");
  const auto cap = static_cast<std::uint32_t>(
      std::floor(c_.ShareOf(host) * static_cast<double>(extents_.size()) + 1e-9));
  const std::uint32_t held = ExtentsOf(host);
  if (held >= cap) {
    return absl::ResourceExhaustedError(absl::StrCat("host ", host, " holds ", held,
                                                     " extents, its share (", c_.ShareOf(host),
                                                     " of ", extents_.size(), ") allows ", cap));
  }
  n = std::min(n, cap - held);
  std::vector<std::uint32_t> granted;
  for (std::uint32_t i = 0; i < extents_.size() && granted.size() < n; ++i) {
    if (!extents_[i].free()) continue;
    extents_[i] = ExtentInfo{};
    extents_[i].host = host;
    extents_[i].incarnation = incarnation;
    extents_[i].expires_ms = now_ms + c_.capacity_lease_ms;
    granted.push_back(i);
  }
  if (granted.empty()) {
    std::uint32_t quarantined = 0;
    for (const ExtentInfo& e : extents_) quarantined += e.quarantined;
    return absl::ResourceExhaustedError(
        absl::StrCat("the pool has no free extent (", extents_.size(), " in all, ", quarantined,
                     " quarantined until the prefix blocks in them are reclaimed)"));
  }
  return granted;
}

absl::Status DomainState::Shrink(std::uint32_t host, std::uint64_t incarnation,
                                 const std::vector<std::uint32_t>& extents, std::int64_t now_ms) {
  if (auto st = CheckCurrent(host, incarnation); !st.ok()) return st;
  for (std::uint32_t i : extents) {
    if (i >= extents_.size() || extents_[i].host != host) {
      return absl::InvalidArgumentError(absl::StrCat("extent ", i, " is not held by host ", host));
    }
  }
  for (std::uint32_t i : extents) Revoke(i, now_ms);
  return absl::OkStatus();
}

absl::Status DomainState::Drain(std::uint32_t host) {
  if (host >= hosts_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", host, " is not below max_hosts ", hosts_.size()));
  }
  HostInfo& h = hosts_[host];
  if (h.state == HostState::kAbsent || h.state == HostState::kLeft) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", host, " is ", HostStateName(h.state), ": nothing to drain"));
  }
  h.drain = true;
  if (h.state == HostState::kLive) h.state = HostState::kDraining;
  return absl::OkStatus();
}

bool DomainState::Expire(std::int64_t now_ms) {
  bool changed = false;
  for (HostInfo& h : hosts_) {
    if ((h.state == HostState::kLive || h.state == HostState::kDraining) &&
        now_ms - h.last_heartbeat_ms > c_.host_ttl_ms) {
      h.state = HostState::kFenced;
      changed = true;
    }
  }
  for (std::uint32_t i = 0; i < extents_.size(); ++i) {
    if (extents_[i].host != ExtentInfo::kNoHost && now_ms > extents_[i].expires_ms) {
      Revoke(i, now_ms);
      changed = true;
    }
  }
  return changed;
}

std::string DomainState::Serialize() const {
  nlohmann::json j;
  j["version"] = 1;
  j["pool_bytes"] = pool_bytes_;
  j["extent_bytes"] = c_.extent_bytes;
  j["generation"] = generation_;
  j["hosts"] = nlohmann::json::array();
  for (std::uint32_t i = 0; i < hosts_.size(); ++i) {
    const HostInfo& h = hosts_[i];
    if (h.state == HostState::kAbsent) continue;
    j["hosts"].push_back({{"id", i},
                          {"incarnation", h.incarnation},
                          {"state", static_cast<int>(h.state)},
                          {"drain", h.drain},
                          {"hostname", h.hostname}});
  }
  j["extents"] = nlohmann::json::array();
  for (std::uint32_t i = 0; i < extents_.size(); ++i) {
    const ExtentInfo& e = extents_[i];
    if (e.free()) continue;
    if (e.quarantined) {
      // The reuse time is not saved: after a restart every quarantine waits a full capacity
      // lease again (conservative, like every other timer).
      j["extents"].push_back({{"index", i},
                              {"quarantined", true},
                              {"former_host", e.former_host},
                              {"incarnation", e.incarnation},
                              {"arena", e.arena},
                              {"arena_checked", e.arena_checked}});
      continue;
    }
    j["extents"].push_back({{"index", i}, {"host", e.host}, {"incarnation", e.incarnation}});
  }
  const std::string body = j.dump();
  return absl::StrCat(body, "\n", coherence::Crc32c(body.data(), body.size()), "\n");
}

absl::Status DomainState::Deserialize(const std::string& text, std::int64_t now_ms) {
  const std::size_t nl = text.find('\n');
  if (nl == std::string::npos) return absl::DataLossError("state file: no checksum line");
  const std::string body = text.substr(0, nl);
  const std::string crc = text.substr(nl + 1);
  if (crc.empty() || crc.back() != '\n' ||
      crc.substr(0, crc.size() - 1) !=
          std::to_string(coherence::Crc32c(body.data(), body.size()))) {
    return absl::DataLossError("state file: checksum mismatch (torn or edited)");
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("state file: not JSON");
  try {
    if (j.at("version").get<int>() != 1) return absl::DataLossError("state file: unknown version");
    if (j.at("pool_bytes").get<std::uint64_t>() != pool_bytes_ ||
        j.at("extent_bytes").get<std::uint64_t>() != c_.extent_bytes) {
      return absl::DataLossError(
          "state file: written for another pool size or extent size; move it away only if the "
          "pool was re-created (its extent assignments would be lost)");
    }
    std::vector<HostInfo> hosts(hosts_.size());
    std::vector<ExtentInfo> extents(extents_.size());
    std::uint32_t recovered = 0;
    for (const auto& h : j.at("hosts")) {
      const auto id = h.at("id").get<std::uint32_t>();
      const int state = h.at("state").get<int>();
      if (id >= hosts.size() || state < 0 || state > static_cast<int>(HostState::kLeft)) {
        return absl::DataLossError(absl::StrCat("state file: bad host record ", h.dump()));
      }
      hosts[id] = HostInfo{static_cast<HostState>(state), h.at("incarnation").get<std::uint64_t>(),
                           now_ms, 0, h.at("hostname").get<std::string>()};
      // Files written before the drain stood on its own say only the state.
      hosts[id].drain =
          h.contains("drain") ? h.at("drain").get<bool>() : hosts[id].state == HostState::kDraining;
    }
    for (const auto& e : j.at("extents")) {
      const auto i = e.at("index").get<std::uint32_t>();
      if (i >= extents.size() || !extents[i].free()) {
        return absl::DataLossError(absl::StrCat("state file: bad extent record ", e.dump()));
      }
      ExtentInfo x;
      x.incarnation = e.at("incarnation").get<std::uint64_t>();
      x.expires_ms = now_ms + c_.capacity_lease_ms;
      if (e.contains("quarantined")) {
        x.quarantined = e.at("quarantined").get<bool>();
        x.former_host = e.at("former_host").get<std::uint32_t>();
        x.arena = e.at("arena").get<std::string>();
        x.arena_checked = e.at("arena_checked").get<bool>();
        if (!x.quarantined ||
            (x.former_host >= hosts.size() && x.former_host != ExtentInfo::kNoHost) ||
            (!x.arena.empty() &&
             (x.arena.size() != 32 ||
              x.arena.find_first_not_of("0123456789abcdef") != std::string::npos))) {
          return absl::DataLossError(absl::StrCat("state file: bad extent record ", e.dump()));
        }
      } else {
        x.host = e.at("host").get<std::uint32_t>();
        if (x.host >= hosts.size()) {
          return absl::DataLossError(absl::StrCat("state file: bad extent record ", e.dump()));
        }
        ++recovered;
      }
      extents[i] = x;
    }
    hosts_ = std::move(hosts);
    extents_ = std::move(extents);
    recovered_ = recovered;
    generation_ = j.contains("generation") ? j.at("generation").get<std::uint64_t>() : 0;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("state file: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status DomainState::Load(std::int64_t now_ms) {
  std::ifstream in(c_.state_file);
  if (!in) {
    if (errno == ENOENT) {
      // Never read as "a new domain" here: the caller knows whether one was asked for.
      return absl::NotFoundError(absl::StrCat("state file ", c_.state_file, " does not exist"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read state file ", c_.state_file, ": ", base::ErrnoText(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Every corrupt file gets the same fix: the daemon stopped before changing anything.
  const char* fix =
      ". Nothing was changed: restore the file from a backup (it holds which host holds which "
      "extent); only if there is none, move it away and start once with --new-domain (every "
      "extent then stays quarantined for a full capacity lease)";
  if (text.empty()) {
    return absl::DataLossError(absl::StrCat("state file ", c_.state_file, " is empty", fix));
  }
  if (auto st = Deserialize(text, now_ms); !st.ok()) {
    return absl::DataLossError(
        absl::StrCat(c_.state_file, ": the state file is corrupt: ", st.message(), fix));
  }
  return absl::OkStatus();
}

absl::Status DomainState::Save() const {
  // A change this reply reveals must not be undone by a power loss: a directory that cannot
  // be synced fails the save too (base/file.h).
  absl::Status st = base::ReplaceFile(c_.state_file, Serialize(), 0600);
  if (st.ok()) return st;
  return absl::InternalError(absl::StrCat("domain.state_file: ", st.message()));
}

}  // namespace cxlkv::orchestrator
