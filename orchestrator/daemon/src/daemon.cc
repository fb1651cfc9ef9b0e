// cxlkv-orchestrator's lifecycle (Open, Start, Stop, the accept loop) and the owner loop's
// thread. The lock, the domain's state, the prefix owner and the fence line are the core's
// (domain_core.h: its operations in domain_core.cc, who owns the domain in leader.cc); the gRPC
// service is service.cc's, the Prometheus endpoint metrics.cc's.
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
#include "cxlkv/orchestrator/lmcache/service.h"
#include "cxlkv/orchestrator/token.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "directory_service.h"
#include "domain_core.h"
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

Orchestrator::Orchestrator(const Config& c) : config_(c) {}

namespace {
// The core on the parts Open made (domain_core.h).
std::unique_ptr<DomainCore> MakeCore(const Config& config, co::Clock* clock, pool::Region* pool,
                                     co::DirectMem* domain_mem, std::uint64_t domain_bytes,
                                     HaSession* ha, FencedMem* fenced_mem, WriteBackAgent* agent,
                                     const std::atomic<bool>* stop, bool new_domain) {
  DomainParts p;
  p.config = &config;
  p.clock = clock;
  p.pool = pool;
  p.domain_mem = domain_mem;
  p.domain_bytes = domain_bytes;
  p.ha = ha;
  p.fenced_mem = fenced_mem;
  p.agent = agent;
  p.stop = stop;
  p.new_domain = new_domain;
  return std::make_unique<DomainCore>(p);
}
}  // namespace

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
  std::unique_ptr<Orchestrator> o(new Orchestrator(c));
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
    o->core_ = MakeCore(o->config_, o->clock_, o->pool_.get(), o->domain_mem_.get(),
                        o->domain_region_->size_bytes(), o->ha_.get(), o->fenced_mem_.get(),
                        o->agent_.get(), &o->stop_.flag(), options.new_domain);
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
  o->core_ = MakeCore(o->config_, o->clock_, o->pool_.get(), o->domain_mem_.get(),
                      o->domain_region_->size_bytes(), nullptr, nullptr, nullptr, &o->stop_.flag(),
                      options.new_domain);
  o->started_ms_ = o->clock_->NowMs();
  // The domain is this orchestrator's from its mark on (a candidate on another machine reads
  // it); before the state file is written, so a refusal here changes nothing else.
  if (formatted) {
    if (auto st = o->core_->MarkSingleOwner(options.lock_regions); !st.ok()) return st;
  }
  if (options.new_domain) {
    if (auto st = o->core_->CreateState(formatted, o->started_ms_); !st.ok()) return st;
  }
  if (!formatted) {
    if (auto st = FormatPrefixDomain(*o->domain_mem_, c, o->domain_region_->size_bytes());
        !st.ok()) {
      return st;
    }
    // Formatting cleared the header page: the mark goes in now.
    if (auto st = o->core_->MarkSingleOwner(options.lock_regions); !st.ok()) return st;
  }
  if (auto st = o->core_->OpenOwner(options.new_domain, o->started_ms_); !st.ok()) return st;
  return o;
}

bool Orchestrator::UidAllowed(uid_t uid) const {
  if (uid == ::geteuid()) return true;
  for (std::uint32_t a : config_.allowed_uids) {
    if (a == uid) return true;
  }
  return false;
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
                                    ha_ != nullptr, core_->OwnIndexEntries());
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
  service_ = MakeOrchestratorService(*core_, metrics_.get(), started_ms_);
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  directory_service_ =
      MakeDirectoryService(config_, [core = core_.get()] { return core->PublishSecret(); });
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
  auto announcer = Announcer::Start(*core_, config_, ha_.get());
  if (!announcer.ok()) return announcer.status();
  announcer_ = *std::move(announcer);
  if (ha_ != nullptr) {
    // Campaigning starts once every endpoint is up: an elected orchestrator serves at once.
    HaSession::Hooks hooks;
    hooks.take_over = [this](const LeaderTerm& t) {
      absl::Status st = core_->Elected(t);
      if (st.ok() && lmcache_ != nullptr) LeadLmcache(t.revision);
      return st;
    };
    hooks.step_down = [this](const std::string& why) {
      core_->StepDown(why);
      if (lmcache_ != nullptr) lmcache_->StandBy(why);
    };
    ha_->Advertise(SelfDescription(config_, tcp_port_));
    if (auto st = ha_->Start(std::move(hooks)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void Orchestrator::AcceptLoop() {
  while (!stop_.stopped()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stop_.stopped()) return;
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

void Orchestrator::OwnerLoop() {
  while (!stop_.stopped()) {
    if (agent_ != nullptr) {
      // The agent's view of this term's write deadline, on CLOCK_BOOTTIME (its clock).
      const std::int64_t deadline = ha_->write_deadline_ms();
      if (deadline != 0) agent_->Deadline(steady_.NowMs() + (deadline - clock_->NowMs()));
    }
    core_->OwnerStep(lmcache_.get(), metrics_.get());
    stop_.SleepFor(std::chrono::milliseconds(config_.owner_period_ms));  // Stop() ends it
  }
}

absl::Status Orchestrator::fatal() { return core_->fatal(); }

std::uint64_t Orchestrator::pool_bytes() const { return pool_->size_bytes(); }

Orchestrator::StatusView Orchestrator::status() const { return core_->View(); }

// The core's lock across the Hold's life: the analysis cannot follow a lock held by an object.
Orchestrator::Hold::Hold(Orchestrator& o) ABSL_NO_THREAD_SAFETY_ANALYSIS : core_(*o.core_) {
  core_.LockForHold();
}
Orchestrator::Hold::~Hold() ABSL_NO_THREAD_SAFETY_ANALYSIS { core_.UnlockForHold(); }
std::string Orchestrator::Hold::Role() ABSL_NO_THREAD_SAFETY_ANALYSIS { return core_.RoleHeld(); }
absl::Status Orchestrator::Hold::Serving() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return core_.ServingHeld();
}

// Each step ends its waits at once instead of letting them run out (issue #42 item 5: the
// process exits within 200 ms of SIGTERM; bench/orchestrator_stop_bench.py measures it): the
// loops wait on stop_, the accept loop's socket is shut down, the gRPC server cancels what is
// still running after 100 ms, and the HTTP servers' listeners are woken (base::ListenerWake).
void Orchestrator::Stop() {
  if (!stop_.Stop()) return;
  if (announcer_ != nullptr) announcer_->Stop();
  // First: a leader steps down and revokes its lease, so a standby takes over at once.
  if (ha_ != nullptr) ha_->Stop();
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  // Calls still running after the deadline are cancelled (their clients see CANCELLED and
  // retry); Shutdown still waits for their handlers to return, so no handler is cut short
  // in the middle of a state change.
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }
  if (owner_thread_.joinable()) owner_thread_.join();
  if (ha_ == nullptr && core_ != nullptr) {
    // No batch runs and no call is answered any more: the domain is released for the next
    // owner (a candidate on another machine waits for this).
    core_->ReleaseSingle();
  }
  // Only a socket nothing answers on (this daemon's, now closed): one another process bound
  // there since is left alone.
  if (listen_fd_ >= 0) {
    auto stale = SocketIsStale(config_.socket);
    if (stale.ok() && *stale) ::unlink(config_.socket.c_str());
  }
  // Every reserve and finish it acknowledged is in its journal already (it syncs before it
  // answers); stopping it lets the requests in flight finish.
  lmcache_.reset();
  metrics_.reset();  // after the owner loop and the RPC service, which feed it
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
      *std::move(store), [this] { return ha_->WriteAllowed(); }, core_->OwnIndexEntries());
}

}  // namespace cxlkv::orchestrator
