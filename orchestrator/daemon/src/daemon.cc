// cxlkv-orchestrator's lifecycle (Open, Start, Stop, the accept loop) and the owner loop with
// the capacity quarantine. Who owns the domain (the single orchestrator's mark, orchestrator
// HA's leader side: the takeover, the fence and the release, read-only mode) is leader.cc's,
// the gRPC service service.cc's, the Prometheus endpoint metrics.cc's.
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
#include "agent.h"
#include "announce.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coordinator/service.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "directory_service.h"
#include "domain_lock.h"
#include "fence.h"
#include "ha.h"
#include "leader.h"
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
}  // namespace

absl::Status FormatPrefixDomain(co::Mem& mem, const Config& c, std::uint64_t region_bytes) {
  const co::DomainGeometry g = GeometryOf(c);
  if (co::DomainBytes(g) > region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain.prefix_domain '", c.prefix_domain, "' holds ", region_bytes,
                     " bytes; this geometry needs ", co::DomainBytes(g),
                     " (give it ?size= or fewer index_entries)"));
  }
  return co::FormatDomain(mem, g);
}

namespace {

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
    if (auto st = FormatPrefixDomain(*o->domain_mem_, c, o->domain_region_->size_bytes());
        !st.ok()) {
      return st;
    }
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

absl::Status Orchestrator::fatal() {
  absl::MutexLock l(&mu_);
  return fatal_;
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
