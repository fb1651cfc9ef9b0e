// cxlkv-orchestrator's lifecycle (Open, Start, Stop, the accept loop), the owner loop with the
// capacity quarantine, and orchestrator HA's leader side (the takeover, the fence and the
// release, read-only mode). The gRPC service is service.cc's, the Prometheus endpoint
// metrics.cc's.
#include "cxlkv/orchestrator/daemon.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent.h"
#include "announce.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coordinator/service.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "directory_service.h"
#include "domain_lock.h"
#include "fence.h"
#include "ha.h"
#include "metrics.h"
#include "nlohmann/json.hpp"
#include "service.h"

namespace cxlkv::orchestrator {

namespace co = ::cxlkv::coherence;

namespace {

co::DomainGeometry GeometryOf(const Config& c) {
  co::DomainGeometry g;
  g.max_hosts = c.max_hosts;
  g.index_entries = c.index_entries;
  g.lease_rows = c.lease_rows;
  g.ring_slots = c.ring_slots;
  g.lease_ttl_ms = c.lease_ttl_ms;
  g.host_ttl_ms = c.host_ttl_ms;
  g.grace_ms = c.grace_ms;
  return g;
}

// Formats the prefix domain (all tables empty) after checking that it fits.
absl::Status Format(co::Mem& mem, const Config& c, std::uint64_t region_bytes) {
  const co::DomainGeometry g = GeometryOf(c);
  if (co::DomainBytes(g) > region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain.prefix_domain '", c.prefix_domain, "' holds ", region_bytes,
                     " bytes; this geometry needs ", co::DomainBytes(g),
                     " (give it ?size= or fewer index_entries)"));
  }
  return co::FormatDomain(mem, g);
}

// This orchestrator as the leader key names it (orchestrator HA). Hosts that find the leader
// through etcd (docs/ha.md "Endpoint discovery") use `socket` on the same host and
// `endpoint` (rpc.tcp with the port it listens on; a wildcard address becomes the host name)
// from others. tcp_port: 0 before the daemon listens.
std::string SelfDescription(const Config& c, int tcp_port = 0) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json j;
  j["node"] = c.etcd.node.empty() ? absl::StrCat(host, ":", ::getpid()) : c.etcd.node;
  j["host"] = host;
  j["pid"] = ::getpid();
  j["socket"] = c.socket;
  j["tcp"] = c.tcp;
  if (!c.tcp.empty() && tcp_port > 0) {
    std::string addr = c.tcp.substr(0, c.tcp.rfind(':'));
    if (addr.empty() || addr == "0.0.0.0" || addr == "[::]" || addr == "::") addr = host;
    j["endpoint"] = absl::StrCat(addr, ":", tcp_port);
  }
  // Sealed with the domain's token (rpc.token_file), so a host that holds the token calls
  // only a leader the domain's own orchestrators advertised (docs/ha.md).
  if (c.etcd.enabled() && !c.token.empty()) {
    j["mac"] = LeaderRecordMac(
        c.token, absl::StrCat("/cxlkv/v1/", c.etcd.cluster, "/domains/", c.etcd.domain, "/leader"),
        j.dump());
  }
  return j.dump();
}

// Whether `path` may be bound: absent (false), or a socket nothing answers on, a killed
// daemon's (true: remove it first). Anything else is refused, naming it and the fix; nothing
// is changed here.
absl::StatusOr<bool> SocketIsStale(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return absl::UnavailableError(
        absl::StrCat("rpc.socket '", path, "': ", base::ErrnoText(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rpc.socket '", path, "' exists and is not a socket (",
                     S_ISDIR(st.st_mode)   ? "a directory"
                     : S_ISREG(st.st_mode) ? "a regular file"
                                           : "not a socket",
                     "); it was left as it is: move it away, or set rpc.socket to another path"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", base::ErrnoText(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  if (rc == 0 || err == EAGAIN) {
    // Someone listens there: another domain's daemon, or another program.
    return absl::FailedPreconditionError(absl::StrCat(
        "rpc.socket '", path,
        "' is in use: a running process answers on it (another domain's orchestrator? `cxlkvctl "
        "status --socket ",
        path, "` tells). It was left as it is: set rpc.socket to a path of this domain's own"));
  }
  if (err != ECONNREFUSED && err != ENOENT) {
    return absl::UnavailableError(absl::StrCat("rpc.socket '", path,
                                               "': cannot tell whether it is "
                                               "in use (connect: ",
                                               base::ErrnoText(err), ")"));
  }
  return true;
}

// Makes `path` free for bind: a stale socket is removed, anything else refused (SocketIsStale).
absl::Status ClearStaleSocket(const std::string& path) {
  auto stale = SocketIsStale(path);
  if (!stale.ok()) return stale.status();
  if (*stale && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat(
        "rpc.socket '", path, "': cannot remove the stale socket: ", base::ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

Orchestrator::Orchestrator(const Config& c, std::uint64_t pool_bytes)
    // [lmcache]: the pool's last extents are the coordinator's, never lent to hosts.
    : state_(c, coordinator::HostPoolBytes(c.lmcache, pool_bytes, c.extent_bytes)), config_(c) {}

Orchestrator::~Orchestrator() { Stop(); }

absl::StatusOr<std::unique_ptr<Orchestrator>> Orchestrator::Open(const Config& c,
                                                                 const OpenOptions& options) {
  // Nothing is touched before this daemon holds its domain: a second start of the same
  // domain.toml (or a unit started twice) stops here, naming the running one.
  if (auto st = CheckConfigOnHost(c); !st.ok()) return st;
  auto lock = DomainLock::Acquire(c);
  if (!lock.ok()) return lock.status();
  // The socket path is checked now too (Start checks it again and replaces a stale socket):
  // something in the way refuses the start before a state file is written or a domain
  // formatted.
  if (auto stale = SocketIsStale(c.socket); !stale.ok()) return stale.status();
  if (!c.metrics_listen.empty()) {
    if (auto st = ProbeListen(c.metrics_listen); !st.ok()) return st;
  }
  auto pool = pool::OpenRegion(c.pool);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrCat("domain.pool '", c.pool, "': ", pool.status().message()));
  }
  // With [etcd] every candidate maps the same pool and prefix domain (the election decides who
  // writes): they share the locks. Without it, this daemon is their only owner: it holds them
  // alone. So a single orchestrator and candidates on this host refuse each other, whichever
  // started first.
  if (options.lock_regions) {
    if (auto st = (*lock)->LockRegion("domain.pool", c.pool, c.etcd.enabled()); !st.ok()) {
      return st;
    }
  }
  if ((*pool)->size_bytes() < c.extent_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain.pool '", c.pool, "' (", (*pool)->size_bytes(),
                     " bytes) is smaller than one extent (domain.extent_size)"));
  }
  std::unique_ptr<Orchestrator> o(new Orchestrator(c, (*pool)->size_bytes()));
  if (options.clock != nullptr) o->clock_ = options.clock;
  o->pool_ = *std::move(pool);
  auto dom = pool::OpenRegion(c.prefix_domain);
  if (!dom.ok()) {
    return absl::Status(dom.status().code(), absl::StrCat("domain.prefix_domain '", c.prefix_domain,
                                                          "': ", dom.status().message()));
  }
  if (options.lock_regions) {
    if (auto st = (*lock)->LockRegion("domain.prefix_domain", c.prefix_domain, c.etcd.enabled());
        !st.ok()) {
      return st;
    }
  }
  o->lock_ = *std::move(lock);
  o->domain_region_ = *std::move(dom);
  o->domain_mem_ =
      std::make_unique<co::DirectMem>(o->domain_region_->addr(), o->domain_region_->size_bytes());
  auto header = co::ReadDomainHeader(*o->domain_mem_);
  if (!header.ok() && !absl::IsNotFound(header.status())) {
    return absl::Status(
        header.status().code(),
        absl::StrCat("domain.prefix_domain '", c.prefix_domain, "': ", header.status().message(),
                     ". Nothing was changed. Check that domain.prefix_domain names this domain's "
                     "own file or device (not domain.pool or another domain's, nor an arena); "
                     "if it is, restore it from a backup"));
  }
  const bool formatted = header.ok();
  o->new_domain_ = options.new_domain;
  if (c.etcd.enabled()) {
    // Orchestrator HA: nothing is written to the domain until this one is elected. The agent
    // first, while this process has no thread of its own yet.
    if (options.write_back_agent) {
      auto agent = WriteBackAgent::Start(o->domain_region_->addr(), o->domain_region_->size_bytes(),
                                         std::int64_t{c.etcd.ttl_s} * 1000);
      if (!agent.ok()) return agent.status();
      o->agent_ = *std::move(agent);
    }
    auto ha = HaSession::Create(c, SelfDescription(c), o->clock_);
    if (!ha.ok()) return ha.status();
    o->ha_ = *std::move(ha);
    o->fenced_mem_ = std::make_unique<FencedMem>(*o->domain_mem_, *o->ha_);
    auto stored = o->ha_->LoadState();
    if (!stored.ok()) {
      return absl::Status(stored.status().code(),
                          absl::StrCat(stored.status().message(),
                                       " (etcd.endpoints must be reachable when an orchestrator "
                                       "starts; it keeps running through an etcd outage later)"));
    }
    struct stat hb {};
    const bool have_file = ::stat(c.state_file.c_str(), &hb) == 0;
    // --new-domain over existing state only when all of it is older than the domain's own
    // record (etcd restored from a backup, a stale cache): the takeover then quarantines every
    // extent instead of adopting it (docs/ha.md "Durable state in etcd").
    co::OwnerFenceLine record{};
    const bool recorded = formatted && ReadFenceLine(*o->domain_mem_, &record) && record.epoch != 0;
    bool all_older = recorded;
    if (all_older && stored->has_value()) {
      DomainState s(c, o->pool_->size_bytes());
      all_older = s.Deserialize((*stored)->text, 0).ok() && s.generation() < record.state_gen;
    }
    if (all_older && have_file) {
      DomainState s(c, o->pool_->size_bytes());
      all_older = s.Load(0).ok() && s.generation() < record.state_gen;
    }
    if (options.new_domain && (stored->has_value() || have_file) && !all_older) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--new-domain: domain '", c.etcd.domain, "' is not new: ",
          stored->has_value() ? absl::StrCat("its state is in etcd at ", o->ha_->where(), "/state")
                              : absl::StrCat("the state file ", c.state_file, " exists"),
          recorded ? absl::StrCat(" and is not older than the domain's own record (state "
                                  "generation ",
                                  record.state_gen, ")")
                   : std::string(),
          "; start without --new-domain"));
    }
    if (!options.new_domain && !stored->has_value() && !have_file) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain '", c.etcd.domain, "' has no state in etcd (", o->ha_->where(),
          "/state) and no state file ", c.state_file, ": ",
          formatted ? "its prefix domain is formatted, so it ran before and its extent "
                      "assignments are lost; restore them, or start one orchestrator once with "
                      "--new-domain (every extent then stays quarantined for a full capacity lease)"
                    : "to create it, start one orchestrator once with --new-domain"));
    }
    o->started_ms_ = o->clock_->NowMs();
    return o;
  }
  if (formatted) {
    // A domain that elected orchestrators owned: a single one beside them would be a second
    // owner of the same lines.
    co::OwnerFenceLine f{};
    if (ReadFenceLine(*o->domain_mem_, &f) && f.epoch != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain.prefix_domain '", c.prefix_domain,
          "' is owned by orchestrators elected through etcd (its fence line names epoch ", f.epoch,
          "): give this orchestrator the same [etcd] section (docs/ha.md) instead of "
          "running it as the domain's only one"));
    }
  }
  // Only the state file says which extents are lent. Without it this is a new domain only
  // when the operator says so (--new-domain): a lost or mis-pathed file must not free every
  // extent that live hosts still write (docs/orchestrator.md "A new domain").
  struct stat sb {};
  const bool have_state = ::stat(c.state_file.c_str(), &sb) == 0;
  if (!have_state && errno != ENOENT) {
    return absl::PermissionDeniedError(
        absl::StrCat("domain.state_file ", c.state_file, ": ", base::ErrnoText(errno)));
  }
  if (options.new_domain && have_state) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--new-domain: the state file ", c.state_file, " exists, so domain '", c.name,
        "' is not new; start without --new-domain (move the file away only if the pool and "
        "every host using it were re-created)"));
  }
  if (!options.new_domain && !have_state) {
    if (formatted) {
      return absl::DataLossError(absl::StrCat(
          "the state file ", c.state_file, " does not exist, but the prefix domain '",
          c.prefix_domain,
          "' is formatted: this domain ran before and its extent assignments "
          "are lost, while hosts may still write the extents they hold. Restore the file or fix "
          "domain.state_file; only if that is impossible, start once with --new-domain (every "
          "extent then stays quarantined for a full capacity lease)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("the state file ", c.state_file, " does not exist: to create domain '", c.name,
                     "', start once with --new-domain (later starts read the state file)"));
  }
  o->started_ms_ = o->clock_->NowMs();
  // The domain is this orchestrator's from its mark on (a candidate on another machine reads
  // it); before the state file is written, so a refusal here changes nothing else.
  if (formatted) {
    if (auto st = o->MarkSingleOwner(options.lock_regions); !st.ok()) return st;
  }
  if (options.new_domain) {
    absl::MutexLock l(&o->mu_);
    // A domain whose prefix domain was in use: its extents may hold arenas that index entries
    // name and that hosts of the old run still write.
    if (formatted) o->state_.QuarantineAll(o->started_ms_);
    // The state file exists from now on, before anything is formatted: a restart without
    // --new-domain reads it.
    if (auto st = o->SaveLocked(); !st.ok()) return st;
  }
  if (!formatted) {
    if (auto st = Format(*o->domain_mem_, c, o->domain_region_->size_bytes()); !st.ok()) return st;
    // Formatting cleared the header page: the mark goes in now.
    if (auto st = o->MarkSingleOwner(options.lock_regions); !st.ok()) return st;
  }
  absl::MutexLock l(&o->mu_);
  auto owner = co::PrefixOwner::Open(*o->domain_mem_, *o->clock_);
  if (!owner.ok()) return owner.status();
  o->owner_ = *std::move(owner);
  for (const NamespaceConfig& n : c.namespaces) {
    o->owner_->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
  if (!options.new_domain) {
    if (auto st = o->state_.Load(o->started_ms_); !st.ok()) return st;
  }
  return o;
}

bool Orchestrator::UidAllowed(uid_t uid) const {
  if (uid == ::geteuid()) return true;
  for (std::uint32_t a : config_.allowed_uids) {
    if (a == uid) return true;
  }
  return false;
}

void Orchestrator::CountPrefixTraffic(std::uint64_t hits, std::uint64_t misses) {
  if (metrics_) metrics_->Traffic(hits, misses);
}

absl::Status Orchestrator::Start() {
  if (!config_.metrics_listen.empty()) {
    try {
      metrics_ = std::make_unique<Metrics>(config_.metrics_listen);
    } catch (const std::exception& e) {
      return MetricsListenRefused(config_.metrics_listen,
                                  absl::StrCat("the HTTP server said: ", e.what()));
    }
  }
  // [lmcache]: LMCache's coordinator API, up before the socket listens (launchers wait on it).
  if (config_.lmcache.enabled()) {
    // With [etcd]: standing by until elected (its state is in etcd, docs/lmcache.md).
    // Its objects are published in the prefix index as the owner's own entries: what the index
    // holds of them now is reconciled before the first request (docs/lmcache.md).
    auto lmcache =
        coordinator::Service::Start(config_.lmcache, pool_->size_bytes(), config_.extent_bytes,
                                    ha_ != nullptr, OwnIndexEntries());
    if (!lmcache.ok()) return lmcache.status();
    lmcache_ = *std::move(lmcache);
  }
  sockaddr_un addr{};
  if (config_.socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc.socket '", config_.socket, "' is ", config_.socket.size(),
                     " bytes; a Unix socket path holds at most ", sizeof(addr.sun_path) - 1,
                     ": choose a shorter path"));
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(config_.socket).parent_path(), ec);
  // The socket: a stale one (a killed daemon's) is replaced, and nothing else is: this daemon
  // holds its domain (Open), so a socket at the path that answers belongs to someone else.
  if (auto st = ClearStaleSocket(config_.socket); !st.ok()) return st;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, config_.socket.c_str(), config_.socket.size());
  // Bound now, listening only once every endpoint is up: a connect to the socket succeeds
  // exactly when the daemon (TCP included) is ready, which is what launchers wait for.
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "rpc.socket '", config_.socket, "': ", base::ErrnoText(err),
        err == EADDRINUSE ? " (another process bound it just now: choose another rpc.socket)"
                          : ""));
  }
  listen_fd_ = fd;
  ::chmod(config_.socket.c_str(), 0666);  // access is decided by peer credentials
  service_ = MakeOrchestratorService(*this);
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  directory_service_ = MakeDirectoryService(config_);
  builder.RegisterService(directory_service_.get());
  builder.SetMaxReceiveMessageSize(1 << 20);
  int tcp_port = 0;
  if (!config_.tcp.empty()) {
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (!config_.tls_cert.empty()) {
      auto cert = ReadSmallFile(config_.tls_cert, "rpc.tls_cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadSmallFile(config_.tls_key, "rpc.tls_key");
      if (!key.ok()) return key.status();
      grpc::SslServerCredentialsOptions o;
      o.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
      creds = grpc::SslServerCredentials(o);
    }
    builder.AddListeningPort(config_.tcp, creds, &tcp_port);
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        config_.tcp.empty() ? std::string("gRPC server did not start")
                            : absl::StrCat("rpc.tcp '", config_.tcp,
                                           "': cannot listen there (address in use, or not "
                                           "this machine's; or a bad rpc.tls_cert/tls_key)"));
  }
  if (!config_.tcp.empty() && tcp_port == 0) {
    return absl::UnavailableError(absl::StrCat("rpc.tcp '", config_.tcp, "': cannot listen there"));
  }
  tcp_port_ = tcp_port;
  if (::listen(listen_fd_, 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("rpc.socket '", config_.socket, "': listen: ", base::ErrnoText(errno)));
  }
  owner_thread_ = std::thread([this] { OwnerLoop(); });
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  // The directory summary and KV events: the leader's (or the single orchestrator's) news.
  auto announcer = Announcer::Start(*this, ha_.get());
  if (!announcer.ok()) return announcer.status();
  announcer_ = *std::move(announcer);
  if (ha_ != nullptr) {
    // Campaigning starts once every endpoint is up: an elected orchestrator serves at once.
    HaSession::Hooks hooks;
    hooks.take_over = [this](const LeaderTerm& t) {
      absl::Status st = TakeOver(t);
      {
        // What a host calling this standby is told until the next takeover (ServingLocked).
        absl::MutexLock l(&mu_);
        takeover_refused_ =
            st.ok() ? std::string()
                    : absl::StrCat("it was elected (etcd revision ", t.revision,
                                   ") and refused to take the domain over: ", st.message());
      }
      if (st.ok() && lmcache_ != nullptr) LeadLmcache(t.revision);
      return st;
    };
    hooks.step_down = [this](const std::string& why) {
      StepDown(why);
      if (lmcache_ != nullptr) lmcache_->StandBy(why);
    };
    ha_->Advertise(SelfDescription(config_, tcp_port_));
    if (auto st = ha_->Start(std::move(hooks)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void Orchestrator::AcceptLoop() {
  while (!stop_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stop_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    // The peer's credentials as the kernel recorded them at connect(). A uid that is not
    // allowed is refused here: the connection is closed before gRPC sees it, and nothing of
    // it is kept (per-call checks keyed by a reusable descriptor number would be fragile).
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !UidAllowed(cred.uid)) {
      const bool known = len == sizeof(cred);
      ::close(fd);
      const std::uint64_t n = refused_.fetch_add(1) + 1;
      // Logged at most once a second: a local user cannot flood the log by connecting.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_refusal_log_ >= std::chrono::seconds(1)) {
        last_refusal_log_ = now;
        std::fprintf(stderr,
                     "cxlkv-orchestrator: refused a connection on %s from %s: not the daemon's "
                     "uid and not in rpc.allowed_uids (%llu refused so far)\n",
                     config_.socket.c_str(),
                     known ? absl::StrCat("uid ", cred.uid, " pid ", cred.pid).c_str()
                           : "a peer without credentials",
                     static_cast<unsigned long long>(n));
      }
      continue;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // gRPC drives it with epoll
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
  }
}

std::vector<std::string> Orchestrator::UnmatchedNamespacesLocked() const {
  std::vector<std::string> out;
  if (owner_ == nullptr || owner_->published_under_others() == 0) return out;
  for (const NamespaceConfig& n : config_.namespaces) {
    if (owner_->published_under(co::MakeNamespace(n.tenant, n.model, n.layout)) == 0) {
      out.push_back(absl::StrCat(n.tenant, "/", n.model, "/", n.layout));
    }
  }
  return out;
}

void Orchestrator::OwnerLoop() {
  std::int64_t last_metrics = 0, last_ha_metrics = 0, last_namespaces = 0;
  while (!stop_.load()) {
    if (agent_ != nullptr) {
      // The agent's view of this term's write deadline, on CLOCK_BOOTTIME (its clock).
      const std::int64_t deadline = ha_->write_deadline_ms();
      if (deadline != 0) agent_->Deadline(steady_.NowMs() + (deadline - clock_->NowMs()));
    }
    {
      absl::MutexLock l(&mu_);
      // A standby (or a leader whose fence closed) writes nothing.
      if (owner_ != nullptr && OwnerBatchMayRunLocked()) {
        const auto t0 = std::chrono::steady_clock::now();
        owner_->Step();
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::int64_t now = clock_->NowMs();
        // Both run every step (no short-circuit): expiry first, then the quarantine it feeds.
        // The LMCache coordinator's objects in the index (its publishes, retires, releases).
        if (lmcache_ != nullptr) lmcache_->TendIndex(*owner_);
        const bool expired = state_.Expire(now);
        const bool tended = TendQuarantineLocked(now);
        if (expired || tended) {
          if (auto st = SaveLocked(); !st.ok()) {
            std::fprintf(stderr, "cxlkv-orchestrator: %s\n", std::string(st.message()).c_str());
          }
        }
        EndBatchLocked();
        // A [[namespace]] no publication matches while others fill: said once, with the fix.
        if (now - last_namespaces >= 1000 && !config_.namespaces.empty()) {
          last_namespaces = now;
          for (const std::string& n : UnmatchedNamespacesLocked()) {
            if (!unmatched_logged_.insert(n).second) continue;
            std::fprintf(stderr,
                         "cxlkv-orchestrator: [[namespace]] '%s' has matched none of the blocks "
                         "published since start, while %llu were published under namespaces no "
                         "[[namespace]] names: check its tenant, model and layout against the "
                         "names the hosts' adapters build (cxlkvctl status lists it until a "
                         "block matches)\n",
                         n.c_str(),
                         static_cast<unsigned long long>(owner_->published_under_others()));
          }
        }
        if (metrics_) {
          metrics_->ObserveStep(secs);
          if (now - last_metrics >= 200 && owner_ != nullptr) {
            metrics_->Update(state_, *owner_, config_.extent_bytes);
            last_metrics = now;
          }
        }
      }
      // HA metrics in every role (a standby's and a read-only leader's count too).
      if (metrics_ && ha_ != nullptr && clock_->NowMs() - last_ha_metrics >= 200) {
        Metrics::HaView v;
        v.leading = leading_;
        v.read_only = read_only_;
        v.epoch = epoch_;
        v.last_takeover_unix_s = last_takeover_unix_s_;
        v.last_takeover_s = last_takeover_s_;
        metrics_->UpdateHa(ha_->DrainStats(), v);
        last_ha_metrics = clock_->NowMs();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(config_.owner_period_ms));
  }
}

namespace {
std::string HexOf(const std::uint8_t* b, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) absl::StrAppend(&s, absl::Hex(b[i], absl::kZeroPad2));
  return s;
}
co::PrefixOwner::ArenaId IdOf(const std::string& hex) {
  co::PrefixOwner::ArenaId id{};
  for (std::size_t i = 0; i < id.size() && 2 * i + 1 < hex.size(); ++i) {
    id[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return id;
}
}  // namespace

std::string Orchestrator::ArenaInExtent(std::uint32_t i) const {
  const std::uint64_t off = state_.extent_offset(i);
  const std::byte* base = pool_->addr() + off;
  // Written by another host: drop stale lines of ours before reading.
  co::Invalidate(base, sizeof(pool::ArenaHeader));
  pool::ArenaHeader h{};
  if (!pool::ValidateHeaderBytes(base, config_.extent_bytes, "extent", &h).ok()) return "";
  return HexOf(h.uuid, sizeof(h.uuid));
}

bool Orchestrator::TendQuarantineLocked(std::int64_t now) {
  bool changed = false;
  for (std::uint32_t i = 0; i < state_.extents().size(); ++i) {
    const ExtentInfo& e = state_.extents()[i];
    if (!e.quarantined) continue;
    if (!e.arena_checked) {
      // The arena its holder formatted in it (none: nothing of it can be named).
      state_.SetQuarantineArena(i, ArenaInExtent(i));
      changed = true;
    }
    if (!e.arena.empty() && told_owner_.insert(e.arena).second) {
      owner_->RevokeArena(IdOf(e.arena));
    }
    if (now < e.expires_ms) continue;
    if (!e.arena.empty() && owner_->EntriesNaming(IdOf(e.arena)) != 0) continue;
    // A zombie holder may have formatted again before its lease term ended: start over on
    // whatever arena the extent holds now.
    const std::string now_there = ArenaInExtent(i);
    if (!now_there.empty() && now_there != e.arena) {
      state_.SetQuarantineArena(i, now_there);
      changed = true;
      continue;
    }
    state_.ReleaseQuarantine(i);
    ++quarantines_released_;
    changed = true;
  }
  return changed;
}

// ---- one owner per domain: the single orchestrator's mark ------------------------------------
// docs/orchestrator.md "One orchestrator per domain": on one machine the region locks keep a
// single orchestrator and candidates apart; across machines the domain's own lines do. A
// single orchestrator marks the domain (coherence::SingleOwnerLine) before its first store and
// then reads the fence line; a candidate writes the fence line and then reads the mark. Each
// stops at the other's line.

namespace {
void ThisHost(char (&out)[sizeof(co::SingleOwnerLine::host)]) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::memset(out, 0, sizeof(out));
  std::memcpy(out, host, std::min(sizeof(out), std::strlen(host)));
}
}  // namespace

absl::Status Orchestrator::MarkSingleOwner(bool holds_locks) {
  absl::MutexLock l(&mu_);
  co::SingleOwnerLine me{};
  ThisHost(me.host);
  co::SingleOwnerLine prev{};
  const bool valid = ReadSingleOwnerLine(*domain_mem_, &prev);
  // A run on this machine that did not release its mark (kill -9) is gone for sure: this one
  // holds the region locks it held.
  const bool dead_here =
      valid && holds_locks && std::memcmp(prev.host, me.host, sizeof(me.host)) == 0;
  if ((!valid || prev.state == co::kSingleServing) && !dead_here) {
    const std::int64_t wait_ms = SingleOwnerStillAfterMs(prev);
    co::SingleOwnerLine now{};
    if (SingleOwnerAdvances(*domain_mem_, prev, wait_ms, &now)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "domain.prefix_domain '", config_.prefix_domain, "' is owned by ",
          DescribeSingleOwner(now),
          " (its mark in the domain moved while this one watched it): a domain has one owner. "
          "Nothing was started or changed. Use that one, or stop it first"));
    }
    std::fprintf(stderr,
                 "cxlkv-orchestrator: the domain's single-owner mark %s did not move in %lld ms: "
                 "taken as ended without releasing the domain (killed, or its machine gone); "
                 "this orchestrator owns the domain from now on\n",
                 valid ? absl::StrCat("names ", DescribeSingleOwner(prev), ", which").c_str()
                       : "does not validate and",
                 static_cast<long long>(wait_ms));
  }
  me.started_ms = clock_->NowMs();
  me.at_ms = me.started_ms;
  me.state = co::kSingleServing;
  me.pid = static_cast<std::uint32_t>(::getpid());
  me.period_ms = config_.owner_period_ms;
  mark_ = me;
  WriteSingleOwnerLine(*domain_mem_, mark_);
  // The mark's store before the fence line's load (ReadFenceLine's invalidate fences fully
  // too): a candidate that wrote its fence line before reading this mark, or this one sees
  // the other.
  domain_mem_->FullFence();
  co::OwnerFenceLine f{};
  const bool fence_valid = ReadFenceLine(*domain_mem_, &f);
  if (!fence_valid || f.epoch != 0) {
    // Nothing else of this run was stored: released again at once.
    mark_.state = co::kSingleReleased;
    WriteSingleOwnerLine(*domain_mem_, mark_);
    return absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain,
        "' was claimed by an orchestrator elected through etcd while this one started (its fence "
        "line ",
        fence_valid ? absl::StrCat("names epoch ", f.epoch) : std::string("is being written"),
        "). Nothing was started; this one's mark in the domain is released again. Give this "
        "orchestrator the same [etcd] section (docs/ha.md) instead of running it as the "
        "domain's only one"));
  }
  marked_ = true;
  return absl::OkStatus();
}

void Orchestrator::StopOwningLocked(const std::string& why) {
  stopped_owning_ = absl::StrCat(
      "domain '", config_.name,
      "': this single orchestrator (no [etcd]) stopped owning the domain: ", why,
      ". It makes no owner batch, extent grant, heartbeat answer or membership change any more "
      "and exits; hosts keep the extents they hold until their capacity leases end. A domain has "
      "one owner: either one orchestrator without [etcd], or orchestrators elected through etcd "
      "(docs/ha.md), the first of which imports this one's state file ",
      config_.state_file);
  fatal_ = absl::FailedPreconditionError(stopped_owning_);
  std::fprintf(stderr, "cxlkv-orchestrator: %s\n", stopped_owning_.c_str());
  // The mark is released only while it is still this run's: another single orchestrator's
  // is left as it is.
  co::SingleOwnerLine m{};
  if (marked_ && ReadSingleOwnerLine(*domain_mem_, &m) && m.started_ms == mark_.started_ms &&
      m.pid == mark_.pid && std::memcmp(m.host, mark_.host, sizeof(m.host)) == 0) {
    ReleaseSingleLocked();
  }
  marked_ = false;
}

void Orchestrator::ReleaseSingleLocked() {
  if (stopped_owning_.empty()) stopped_owning_ = "this orchestrator is stopping";
  if (!marked_) return;
  // Every store of this run reaches memory before the mark says released: a candidate on
  // another machine that then takes the domain over reads what this one wrote, and no late
  // write-back of this machine lands over its stores.
  WriteBackDomain(*domain_mem_, domain_region_->size_bytes());
  mark_.state = co::kSingleReleased;
  mark_.at_ms = clock_->NowMs();
  WriteSingleOwnerLine(*domain_mem_, mark_);
  marked_ = false;
}

absl::Status Orchestrator::RefuseASingleOwner() {
  if (!co::ReadDomainHeader(*domain_mem_).ok()) return absl::OkStatus();  // never formatted
  co::SingleOwnerLine m{};
  const bool valid = ReadSingleOwnerLine(*domain_mem_, &m);
  if (valid && m.state != co::kSingleServing) return absl::OkStatus();  // never marked, released
  const std::int64_t wait_ms = SingleOwnerStillAfterMs(m);
  co::SingleOwnerLine now{};
  const bool live = SingleOwnerAdvances(*domain_mem_, m, wait_ms, &now);
  const std::string who = valid ? DescribeSingleOwner(m) : "a single cxlkv-orchestrator";
  const std::string host(m.host, strnlen(m.host, sizeof(m.host)));
  if (live) {
    return absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain, "' is owned by ", who,
        ": its mark in the domain moves. A domain has one owner, so this candidate does not "
        "take it over (nothing was written) until that one stopped: it marks the domain "
        "released when it stops (systemctl stop, or kill -TERM ",
        m.pid, " on host '", host,
        "'). To move the domain to etcd, stop it and give the first candidate its state file "
        "(docs/ha.md \"The first leader\"); if it is meant to keep the domain, stop this "
        "candidate"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "domain.prefix_domain '", config_.prefix_domain, "' is marked as owned by ", who,
      valid ? absl::StrCat(", whose mark did not move in ", wait_ms, " ms")
            : std::string(" (the mark does not validate: its writer died writing it)"),
      ": it ended without releasing the domain (killed, stopped, or its machine gone), and "
      "stores of it may still sit in its machine's caches. This candidate does not take the "
      "domain over (nothing was written). Start that orchestrator again on its machine and "
      "stop it (systemctl stop): it writes the domain back and marks it released; then this "
      "candidate takes over (give it that one's state file: docs/ha.md \"The first leader\"). "
      "If that machine is gone for good, start a single orchestrator of this domain once on a "
      "machine that maps it (with its state file, or --new-domain if that is lost too) and "
      "stop it"));
}

// ---- orchestrator HA --------------------------------------------------------------------------

absl::Status Orchestrator::SaveLocked() {
  if (ha_ == nullptr) return state_.Save();
  if (!leading_) {
    return absl::UnavailableError("this orchestrator stopped leading the domain: retry");
  }
  // A new generation each write, recorded in the fence line once etcd has it: a successor
  // refuses any state older than the domain's record (docs/ha.md "Durable state in etcd").
  state_.set_generation(state_.generation() + 1);
  absl::Status st = ha_->SaveState(state_.Serialize(), revision_);
  if (absl::IsAborted(st)) {
    // Another leader, or another writer of the state: this one's view is stale.
    leading_ = false;
    ha_->Resign(std::string(st.message()));
    return absl::UnavailableError(
        absl::StrCat(st.message(), ": stepping down; retry against the new leader"));
  }
  if (!st.ok()) return st;
  fence_.state_gen = state_.generation();
  EndBatchLocked();
  // The state file is a cache now (etcd holds the state): a failure is logged, never fatal.
  if (auto cache = state_.Save(); !cache.ok() && !cache_failure_logged_) {
    cache_failure_logged_ = true;
    std::fprintf(stderr, "cxlkv-orchestrator: the state file cache: %s (logged once)\n",
                 std::string(cache.message()).c_str());
  }
  return absl::OkStatus();
}

absl::Status Orchestrator::ServingLocked() {
  // A single orchestrator that found another owner answers nothing more (StopOwningLocked).
  if (ha_ == nullptr) {
    return stopped_owning_.empty() ? absl::OkStatus() : absl::UnavailableError(stopped_owning_);
  }
  // A leader whose write deadline passed (it was stopped, or etcd went silent) changes
  // nothing more: a successor may be serving from a newer state by now.
  if (leading_ && owner_ != nullptr && ha_->WriteAllowed()) return absl::OkStatus();
  if (ReadOnlyLocked()) {
    return absl::UnavailableError(absl::StrCat(
        "domain '", config_.etcd.domain, "': etcd unreachable since ", ReadOnlySinceLocked(),
        "; the domain is read-only until it is back (heartbeats, lookups and the extents already "
        "lent keep working; no new extents, publications or membership changes, and no prefix "
        "leases once the owner's last heartbeat acknowledgement is host_ttl old)"));
  }
  const HaStats h = ha_->stats();
  return absl::UnavailableError(absl::StrCat(
      "this orchestrator is a standby of domain '", config_.etcd.domain, "'",
      h.leader.empty() ? std::string("; no leader is elected right now: retry shortly")
                       : absl::StrCat("; the leader is ", h.leader),
      takeover_refused_.empty() ? std::string() : absl::StrCat("; ", takeover_refused_)));
}

absl::Status Orchestrator::ReadableLocked() {
  if (ha_ == nullptr) return ServingLocked();
  if (leading_ && owner_ != nullptr && ha_->WriteAllowed()) return absl::OkStatus();
  if (ReadOnlyLocked()) return absl::OkStatus();
  return ServingLocked();
}

bool Orchestrator::ReadOnlyLocked() {
  if (!read_only_) return false;
  // A successor writes its epoch into the fence line before it serves anything: once it is
  // there (or etcd names another leader), this orchestrator's answers may contradict the
  // successor's, so it answers nothing more.
  const HaStats h = ha_->stats();
  std::string why;
  co::OwnerFenceLine line{};
  if (!h.leader.empty() && h.leader_epoch != revision_) {
    why = absl::StrCat("etcd names another leader (its key's revision ", h.leader_epoch,
                       ", this term's ", revision_, ")");
  } else if (!ReadFenceLine(*domain_mem_, &line)) {
    why = "the domain's fence line does not validate (a successor is writing it)";
  } else if (line.epoch != fence_.epoch || line.cluster_id != fence_.cluster_id) {
    why = absl::StrCat("the domain's fence line names epoch ", line.epoch,
                       ": a successor took the domain over");
  }
  if (why.empty()) return true;
  EndReadOnlyLocked(why);
  return false;
}

void Orchestrator::EndReadOnlyLocked(const std::string& why) {
  if (!read_only_) return;
  read_only_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  std::fprintf(stderr, "cxlkv-orchestrator: read-only mode of domain '%s' ended: %s\n",
               config_.etcd.domain.c_str(), why.c_str());
}

std::string Orchestrator::ReadOnlySinceLocked() const {
  if (!read_only_) return "";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(read_only_since_unix_ms_),
                          absl::UTCTimeZone());
}

std::string Orchestrator::RoleLocked() {
  if (ha_ == nullptr) return "single";
  if (ServingLocked().ok()) return "leader";
  return read_only_ ? "read-only" : "standby";
}

absl::StatusOr<std::vector<std::string>> Orchestrator::CandidatesInEtcd() {
  if (ha_ == nullptr) return std::vector<std::string>();
  return ha_->Candidates();
}

std::int64_t Orchestrator::LeaderEpochLocked() const {
  return ha_ == nullptr ? 0 : ha_->stats().leader_epoch;
}

std::string Orchestrator::LeaderLocked() const {
  if (ha_ == nullptr) return "";
  return ha_->stats().leader;
}

bool Orchestrator::OwnerBatchMayRunLocked() {
  if (ha_ == nullptr) {
    if (!stopped_owning_.empty()) return false;
    // Another owner leaves its line before its first store to the domain (an elected leader
    // its fence line, another single orchestrator its mark): once either is there, the next
    // store of this one could land beside or over that owner's.
    co::OwnerFenceLine f{};
    co::SingleOwnerLine m{};
    std::string why;
    if (!ReadFenceLine(*domain_mem_, &f)) {
      why =
          "the domain's fence line does not validate: an orchestrator elected through etcd is "
          "writing it";
    } else if (f.epoch != 0) {
      why = absl::StrCat("the domain's fence line names epoch ", f.epoch, " (cluster ",
                         absl::Hex(f.cluster_id),
                         "): an orchestrator elected through etcd claimed the domain");
    } else if (!ReadSingleOwnerLine(*domain_mem_, &m)) {
      why = "the domain's single-owner mark does not validate: another orchestrator is writing it";
    } else if (m.state != co::kSingleServing || m.started_ms != mark_.started_ms ||
               m.pid != mark_.pid || std::memcmp(m.host, mark_.host, sizeof(m.host)) != 0) {
      why = absl::StrCat("the domain's single-owner mark now names ", DescribeSingleOwner(m),
                         ", not this one: that orchestrator took the domain over");
    }
    if (why.empty()) return true;
    StopOwningLocked(why);
    return false;
  }
  if (!leading_ || owner_ == nullptr) return false;
  // The write deadline: the election steps down shortly; nothing more from this term.
  if (!ha_->WriteAllowed()) return false;
  co::OwnerFenceLine now{};
  const bool read = ReadFenceLine(*domain_mem_, &now);
  if (read && now.epoch == fence_.epoch && now.cluster_id == fence_.cluster_id) return true;
  ++fence_violations_;
  const std::string why =
      read ? absl::StrCat("the domain's fence line names epoch ", now.epoch, " (cluster ",
                          absl::Hex(now.cluster_id), "), not this leader's ", fence_.epoch,
                          ": another leader took the domain over (if `cxlkvctl status` shows "
                          "none, something else writes domain.prefix_domain: stop it, then "
                          "release that epoch as docs/ha.md says)")
           : std::string("the domain's fence line does not validate (torn or overwritten)");
  std::fprintf(stderr, "cxlkv-orchestrator: %s; stepping down\n", why.c_str());
  leading_ = false;
  ha_->Resign(why);
  return false;
}

void Orchestrator::EndBatchLocked() {
  if (ha_ == nullptr) {
    // The mark moves with every batch: a reader on another machine tells a live owner from
    // one that ended without releasing the domain (SingleOwnerAdvances).
    if (!marked_) return;
    ++mark_.seq;
    mark_.at_ms = clock_->NowMs();
    WriteSingleOwnerLine(*domain_mem_, mark_);
    return;
  }
  if (!leading_) return;
  // Read before written: a line that names another term is never overwritten (audit-ha #1:
  // a leader resumed after a stop put its old epoch back over its successor's, and the
  // successor resigned). The successor waits for this term's release before it writes the
  // line, so a foreign line here means an operator released this term by hand.
  co::OwnerFenceLine now{};
  if (!ReadFenceLine(*domain_mem_, &now) || now.epoch != fence_.epoch ||
      now.cluster_id != fence_.cluster_id) {
    (void)OwnerBatchMayRunLocked();  // says why, resigns
    return;
  }
  // Through the fenced view: after the write deadline this store is dropped like the others.
  ++fence_.batches;
  WriteFenceLine(*fenced_mem_, fence_);
}

absl::Status Orchestrator::AwaitRelease(const LeaderTerm& t) {
  auto header = co::ReadDomainHeader(*domain_mem_);
  if (!header.ok()) return absl::OkStatus();  // never formatted: no term ever owned it
  // Whatever epoch the line names, even one above etcd's revisions (etcd restored or
  // replaced): that term is waited for like any other, and this one's epoch is derived above
  // it (DomainEpoch).
  co::OwnerFenceLine fence{};
  const bool fence_valid = ReadFenceLine(*domain_mem_, &fence);
  // The domain belongs to the etcd keys its leaders were elected under: a candidate elected
  // under other keys (a wrong etcd.cluster/etcd.domain) would be a second owner beside them.
  if (fence_valid && fence.keys != 0 && fence.keys != KeysHash()) {
    absl::Status wrong = absl::FailedPreconditionError(absl::StrCat(
        "domain.prefix_domain '", config_.prefix_domain,
        "' belongs to orchestrators elected under other etcd keys (its fence line names keys "
        "hashing to ",
        absl::Hex(fence.keys), ", epoch ", fence.epoch, "), not this one's ", ha_->where(), " (",
        absl::Hex(KeysHash()),
        "): etcd.cluster or etcd.domain is wrong in this orchestrator's config; give it the "
        "same [etcd] section as the domain's other orchestrators and start it again. Nothing "
        "was written; this orchestrator campaigns no more and exits"));
    // A wrong config does not heal: every election would be refused the same way.
    {
      absl::MutexLock l(&mu_);
      fatal_ = wrong;
    }
    ha_->StopCampaigning();
    return wrong;
  }
  co::OwnerReleaseLine at_start{};
  if (!ReadReleaseLine(*domain_mem_, &at_start)) at_start = co::OwnerReleaseLine{};
  const std::int64_t t0 = steady_.NowMs();
  std::int64_t next_log = t0 + 2000, next_operator = t0;
  while (true) {
    co::OwnerReleaseLine r{};
    const bool valid = ReadReleaseLine(*domain_mem_, &r);
    if (TermReleased(fence_valid, fence, valid, r, at_start)) break;
    if (stop_.load()) return absl::AbortedError("stopping");
    if (!ha_->WriteAllowed()) {
      return absl::AbortedError(absl::StrCat("the write deadline passed while waiting for epoch ",
                                             fence.epoch, " to be released"));
    }
    const std::int64_t now = steady_.NowMs();
    if (now >= next_operator) {
      next_operator = now + 500;
      auto op = ha_->ReleasedByOperator();
      if (op.ok() && *op != 0 && fence_valid && static_cast<std::uint64_t>(*op) == fence.epoch) {
        std::fprintf(stderr,
                     "cxlkv-orchestrator: epoch %llu released by an operator (%s/released): "
                     "taking the domain over\n",
                     static_cast<unsigned long long>(fence.epoch), ha_->where().c_str());
        break;
      }
      if (!op.ok() && now >= next_log) {
        std::fprintf(stderr, "cxlkv-orchestrator: %s\n",
                     std::string(op.status().message()).c_str());
      }
    }
    if (now >= next_log) {
      next_log = now + 5000;
      std::fprintf(
          stderr,
          "cxlkv-orchestrator: elected at epoch %lld, waiting %lld ms so far for %s to be released "
          "by its leader or that node's write-back agent (its stores must all be in memory "
          "before this leader's first; docs/ha.md \"Release\"). If that machine was powered "
          "off or reset, say so: etcdctl put %s/released %llu\n",
          static_cast<long long>(t.revision), static_cast<long long>(now - t0),
          fence_valid
              ? absl::StrCat("epoch ", fence.epoch, " (cluster ", absl::Hex(fence.cluster_id), ")")
                    .c_str()
              : "the term of the torn fence line",
          ha_->where().c_str(), static_cast<unsigned long long>(fence.epoch));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::int64_t waited = steady_.NowMs() - t0;
  if (waited >= 100) {
    std::fprintf(stderr, "cxlkv-orchestrator: epoch %llu was released after %lld ms\n",
                 static_cast<unsigned long long>(fence.epoch), static_cast<long long>(waited));
  }
  return absl::OkStatus();
}

absl::Status Orchestrator::fatal() {
  absl::MutexLock l(&mu_);
  return fatal_;
}

void Orchestrator::ReleaseLocked() {
  if (claimed_epoch_ == 0 || claimed_epoch_ == released_epoch_) return;
  co::OwnerReleaseLine r{};
  r.epoch = static_cast<std::uint64_t>(claimed_epoch_);
  r.cluster_id = claimed_cluster_;
  r.at_ms = clock_->NowMs();
  r.by = co::kReleasedByLeader;
  r.node = co::Crc32c(config_.etcd.node.data(), config_.etcd.node.size());
  // The unfenced view: the gate is closed by now, and this is the one store a deposed leader
  // must still make.
  ReleaseTerm(*domain_mem_, domain_region_->size_bytes(), r);
  released_epoch_ = claimed_epoch_;
  if (agent_ != nullptr) agent_->Released(claimed_epoch_);
}

std::string Orchestrator::StateOlderThanTheDomain(const std::string& source,
                                                  const DomainState& state,
                                                  const co::OwnerFenceLine& seen) const {
  return absl::StrCat(
      "domain '", config_.etcd.domain, "': the state from ", source, " is generation ",
      state.generation(), ", older than the domain's own record (generation ", seen.state_gen,
      ", saved at epoch ", seen.epoch, " of etcd cluster ", absl::Hex(seen.cluster_id),
      "): etcd was restored from a backup or rebuilt, etcd.cluster/etcd.domain names another "
      "place, or the state file is a stale cache. Taking it over would lend again extents that "
      "hosts hold. Point etcd.cluster/etcd.domain at the domain's keys or put its newest state "
      "back into ",
      ha_->where(),
      "/state; if that state is lost, stop the domain's orchestrators and start "
      "one with --new-domain: it replaces every state older than the record (etcd's, and the "
      "state file ",
      config_.state_file,
      " as a cache) by a new one in which every extent is quarantined for a full capacity "
      "lease");
}

std::uint32_t Orchestrator::KeysHash() const {
  const std::string where = ha_->where();
  return std::max<std::uint32_t>(1, co::Crc32c(where.data(), where.size()));
}

absl::StatusOr<std::int64_t> Orchestrator::DomainEpoch(const LeaderTerm& t) {
  std::uint64_t floor = 0;  // the highest epoch the domain records
  co::OwnerFenceLine fence{};
  if (ReadFenceLine(*domain_mem_, &fence)) floor = std::max(floor, fence.epoch);
  co::OwnerReleaseLine released{};
  if (ReadReleaseLine(*domain_mem_, &released)) floor = std::max(floor, released.epoch);
  // Room for 2^62 more terms: a line naming more was not written by a leader of this domain.
  constexpr std::uint64_t kMaxEpoch = std::uint64_t{1} << 62;
  if (floor >= kMaxEpoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the domain's fence or release line names epoch ", floor, " (cluster ",
        absl::Hex(fence.cluster_id),
        "), beyond any term this domain can have had: a foreign writer put it there (another "
        "domain's orchestrator given this prefix_domain, or a corrupted line). Stop whatever "
        "else writes domain.prefix_domain '",
        config_.prefix_domain, "', then restore the domain or re-create it with --new-domain"));
  }
  return std::max<std::int64_t>(t.revision, static_cast<std::int64_t>(floor) + 1);
}

absl::Status Orchestrator::TakeOver(const LeaderTerm& t) {
  const absl::Time elected = absl::Now();
  // 0. Every store of the previous term is in memory and none follows (docs/ha.md "Release"),
  // and no single orchestrator owns the domain (on another machine: this one's region locks
  // keep one off this machine).
  if (auto st = AwaitRelease(t); !st.ok()) return st;
  if (auto st = RefuseASingleOwner(); !st.ok()) return st;
  absl::MutexLock l(&mu_);
  // Elected again (etcd is back): the read-only term's view gives way to etcd's state.
  EndReadOnlyLocked(absl::StrCat("elected again (etcd revision ", t.revision, ")"));
  const std::int64_t now = clock_->NowMs();
  // 1. The domain's state: etcd's, or for the first leader a new one or the state file's.
  auto stored = ha_->LoadState();
  if (!stored.ok()) return stored.status();
  auto header = co::ReadDomainHeader(*domain_mem_);
  if (!header.ok() && !absl::IsNotFound(header.status())) return header.status();
  const bool formatted = header.ok();
  DomainState fresh(config_, pool_->size_bytes());
  bool save_now = true;
  std::string source;
  struct stat sb {};
  co::OwnerFenceLine record{};
  const bool recorded = formatted && ReadFenceLine(*domain_mem_, &record) && record.epoch != 0;
  if (stored->has_value()) {
    if (auto st = fresh.Deserialize((*stored)->text, now); !st.ok()) {
      return absl::DataLossError(absl::StrCat(ha_->where(), "/state: ", st.message()));
    }
    save_now = false;
    source = absl::StrCat("etcd (revision ", (*stored)->revision, ")");
    if (new_domain_ && recorded && fresh.generation() < record.state_gen) {
      // The operator's answer to a state older than the domain: nothing of it is trusted.
      std::fprintf(stderr,
                   "cxlkv-orchestrator: --new-domain: %s/state (generation %llu) is older than "
                   "the domain's record (generation %llu): replaced by a new state, every "
                   "extent quarantined for a full capacity lease\n",
                   ha_->where().c_str(), static_cast<unsigned long long>(fresh.generation()),
                   static_cast<unsigned long long>(record.state_gen));
      fresh = DomainState(config_, pool_->size_bytes());
      fresh.QuarantineAll(now);
      fresh.set_generation(record.state_gen);
      save_now = true;
      source = "a new domain (--new-domain over an older state)";
    }
  } else if (new_domain_) {
    if (formatted) {
      fresh.QuarantineAll(now);
      // Generations go on above the domain's record (the check below then passes).
      if (recorded) fresh.set_generation(record.state_gen);
    }
    source = "a new domain";
  } else if (::stat(config_.state_file.c_str(), &sb) == 0) {
    if (auto st = fresh.Load(now); !st.ok()) return st;
    source = absl::StrCat("the state file ", config_.state_file, " (the first leader in etcd)");
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("domain '", config_.etcd.domain,
                     "' has no state in etcd and no state file here: "
                     "start one orchestrator once with --new-domain"));
  }
  // 2. The term's epoch: above etcd's revision and above every epoch the domain records
  // (the fence line's, and the release line's for a fence line torn by its writer), so an
  // epoch never names two terms, whatever etcd was restored from or replaced by, and hosts
  // that saw the old terms accept this one (docs/ha.md "Election and epoch").
  std::int64_t epoch = t.revision;
  if (formatted) {
    auto derived = DomainEpoch(t);
    if (!derived.ok()) return derived.status();
    epoch = *derived;
  }
  // 3. The fence: this epoch into the domain before anything else of this leader is written
  // there (a domain never formatted is formatted first; that clears the line).
  if (formatted) {
    co::OwnerFenceLine seen{};
    if (!ReadFenceLine(*domain_mem_, &seen)) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: the domain's fence line does not validate (a leader died "
                   "writing it); epoch %lld overwrites it\n",
                   static_cast<long long>(epoch));
    } else if (seen.epoch != 0 && fresh.generation() < seen.state_gen) {
      return absl::FailedPreconditionError(StateOlderThanTheDomain(source, fresh, seen));
    } else if (seen.epoch != 0 && seen.cluster_id != t.cluster_id) {
      std::fprintf(stderr,
                   "cxlkv-orchestrator: the domain was last owned under etcd cluster %llx (epoch "
                   "%llu), now %llx: the etcd cluster was replaced or restored; taking the domain "
                   "over at epoch %lld\n",
                   static_cast<unsigned long long>(seen.cluster_id),
                   static_cast<unsigned long long>(seen.epoch),
                   static_cast<unsigned long long>(t.cluster_id), static_cast<long long>(epoch));
    }
  } else if (auto st = Format(*fenced_mem_, config_, domain_region_->size_bytes()); !st.ok()) {
    return st;
  }
  co::OwnerFenceLine line{};
  line.epoch = static_cast<std::uint64_t>(epoch);
  line.cluster_id = t.cluster_id;
  line.state_gen = fresh.generation();
  line.keys = KeysHash();
  line.took_over_ms = now;
  line.node = co::Crc32c(config_.etcd.node.data(), config_.etcd.node.size());
  // From the claim on, this term is released when it ends: by StepDown, or by the agent.
  claimed_epoch_ = epoch;
  claimed_cluster_ = t.cluster_id;
  if (agent_ != nullptr) agent_->Claimed(epoch, t.cluster_id, line.node);
  WriteFenceLine(*fenced_mem_, line);
  co::OwnerFenceLine back{};
  if (!ReadFenceLine(*domain_mem_, &back) || back.epoch != line.epoch) {
    return absl::AbortedError("the fence line did not take: the write deadline passed meanwhile");
  }
  // A single orchestrator that marked the domain since RefuseASingleOwner read it: it reads
  // the fence line after its mark (and every batch), so it refuses or stops owning once it
  // sees this epoch; this term stores nothing more and is released, and a later election
  // finds the mark released. The read follows the fence line's store (ReadFenceLine's
  // invalidate fences fully): of the two, at least one sees the other's line.
  co::SingleOwnerLine mark{};
  if (!ReadSingleOwnerLine(*domain_mem_, &mark) || mark.state == co::kSingleServing) {
    return absl::AbortedError(absl::StrCat(
        DescribeSingleOwner(mark), " marked domain.prefix_domain '", config_.prefix_domain,
        "' as its own while this candidate claimed it: it stops owning once it reads this "
        "epoch in the fence line and marks the domain released; this candidate steps down and "
        "campaigns again"));
  }
  // 3. The prefix owner, on the fenced view of the domain, and the state.
  auto owner = co::PrefixOwner::Open(*fenced_mem_, *clock_);
  if (!owner.ok()) return owner.status();
  for (const NamespaceConfig& n : config_.namespaces) {
    (*owner)->SetPinLevel(co::MakeNamespace(n.tenant, n.model, n.layout), n.pin);
  }
  state_ = std::move(fresh);
  told_owner_.clear();
  owner_ = *std::move(owner);
  fence_ = line;
  epoch_ = epoch;
  revision_ = t.revision;
  leading_ = true;
  if (save_now) {
    if (auto st = SaveLocked(); !st.ok()) {
      leading_ = false;
      owner_.reset();
      return st;
    }
  }
  // --new-domain applies to the first term only: a later etcd restore is refused again.
  new_domain_ = false;
  last_takeover_unix_s_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  last_takeover_s_ = absl::ToDoubleSeconds(absl::Now() - elected);
  std::fprintf(stderr,
               "cxlkv-orchestrator: leader of domain '%s' at epoch %lld (etcd revision %lld): %u "
               "extents held by hosts, state from %s\n",
               config_.etcd.domain.c_str(), static_cast<long long>(epoch),
               static_cast<long long>(t.revision), state_.recovered_extents(), source.c_str());
  return absl::OkStatus();
}

void Orchestrator::LeadLmcache(std::int64_t revision) {
  // The coordinator's state is in etcd beside the domain's (orchestrator/lmcache/); an error
  // leaves it answering 503 with the reason while the domain is led as usual.
  // On the [etcd] section's client options, as the HA session's own clients (ha_etcd.cc).
  auto store = ha_->CoordinatorStore(revision);
  if (!store.ok()) {
    std::fprintf(stderr, "cxlkv-orchestrator: lmcache: %s\n",
                 std::string(store.status().message()).c_str());
    return;
  }
  (void)lmcache_->Lead(
      *std::move(store), [this] { return ha_->WriteAllowed(); }, OwnIndexEntries());
}

std::vector<co::PrefixOwner::OwnEntry> Orchestrator::OwnIndexEntries() {
  absl::MutexLock l(&mu_);
  return owner_ != nullptr ? owner_->OwnEntries() : std::vector<co::PrefixOwner::OwnEntry>{};
}

void Orchestrator::StepDown(const std::string& why) {
  absl::MutexLock l(&mu_);
  const HaStats h = ha_->stats();
  if (h.lost_contact && leading_ && owner_ != nullptr && !stop_.load()) {
    // etcd stopped answering: read-only until it is back or a successor shows (docs/ha.md).
    // Nothing is written to the domain or to etcd; the state, the owner and the epoch stay.
    leading_ = false;
    read_only_ = true;
    read_only_since_unix_ms_ =
        h.last_contact_unix_ms != 0 ? h.last_contact_unix_ms : absl::ToUnixMillis(absl::Now());
    std::fprintf(stderr,
                 "cxlkv-orchestrator: no longer the leader of domain '%s': %s; etcd unreachable "
                 "since %s: serving read-only (heartbeats and reads) at epoch %lld until etcd is "
                 "back or a successor takes over\n",
                 config_.etcd.domain.c_str(), why.c_str(), ReadOnlySinceLocked().c_str(),
                 static_cast<long long>(epoch_));
    ReleaseLocked();  // a read-only leader stores nothing more to the domain
    return;
  }
  // A takeover that was refused never led: the election says why (once per reason).
  const bool led = leading_ || read_only_ || owner_ != nullptr;
  read_only_ = false;
  leading_ = false;
  owner_.reset();
  epoch_ = 0;
  revision_ = 0;
  if (led) {
    std::fprintf(stderr, "cxlkv-orchestrator: no longer the leader of domain '%s': %s\n",
                 config_.etcd.domain.c_str(), why.c_str());
  }
  ReleaseLocked();
}

void Orchestrator::Stop() {
  if (stop_.exchange(true)) return;
  if (announcer_ != nullptr) announcer_->Stop();
  // First: a leader steps down and revokes its lease, so a standby takes over at once.
  if (ha_ != nullptr) ha_->Stop();
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (owner_thread_.joinable()) owner_thread_.join();
  if (ha_ == nullptr) {
    // No batch runs and no call is answered any more: the domain is released for the next
    // owner (a candidate on another machine waits for this).
    absl::MutexLock l(&mu_);
    ReleaseSingleLocked();
  }
  // Only a socket nothing answers on (this daemon's, now closed): one another process bound
  // there since is left alone.
  if (listen_fd_ >= 0) {
    auto stale = SocketIsStale(config_.socket);
    if (stale.ok() && *stale) ::unlink(config_.socket.c_str());
  }
  lmcache_.reset();
}

}  // namespace cxlkv::orchestrator
