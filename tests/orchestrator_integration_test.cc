// cxlkv-orchestrator with several host processes on a shared file pool: join/leave, host
// crash and fencing, orchestrator kill -9 and restart while hosts publish, drain.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/operator_client.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"
#include "orchestrator.grpc.pb.h"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::orchestrator {
namespace {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;
using namespace std::chrono_literals;

using testing::AcceptsConnections;
using testing::OrchestratorProcess;
using testing::WaitFor;

class OrchestratorFixture : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon(); }
  void StartDaemon() { h_.Start(); }
  void StopDaemon(int sig) { h_.Stop(sig); }
  pb::HostsReply Hosts() { return h_.Hosts(); }
  pb::StatusReply Status() { return h_.Status(); }
  std::string HostState(std::uint32_t id) { return h_.HostState(id); }
  std::unique_ptr<pb::Orchestrator::Stub> Stub() { return h_.Stub(); }
  pid_t Host(const std::function<bool()>& body) { return OrchestratorProcess::Fork(body); }
  static bool Exited0(pid_t pid) { return OrchestratorProcess::Exited0(pid); }

  OrchestratorProcess h_{
      "lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
      "grace_ms = 20\ncapacity_lease_ms = 1000\n"};
  const std::string& socket_ = h_.socket;
};

co::BlockRef Ref(std::uint32_t host, std::uint32_t i) {
  co::BlockRef r{};
  r.arena[0] = static_cast<std::uint8_t>(host + 1);
  r.index = i;
  r.generation = 1;
  return r;
}

// Three hosts join, grow, write their extents, share a prefix through the orchestrator's
// owner role, and leave; everything goes back.
TEST_F(OrchestratorFixture, ThreeHostsJoinGrowShareAndLeave) {
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t tokens[] = {1, 2, 3};
  const co::PrefixKey key = co::ChainKey(ns, co::PrefixKey{}, tokens);
  pid_t hosts[3];
  for (std::uint32_t id = 0; id < 3; ++id) {
    hosts[id] = Host([&, id] {
      auto c = HostClient::Connect(socket_, id);
      if (!c.ok()) return false;
      (*c)->StartHeartbeats([] { return HostCounters{1 << 20, 3, 1}; });
      auto got = (*c)->Grow(2);
      if (!got.ok() || got->size() != 2 || !(*c)->ExtentsValid()) return false;
      // Use the extents: map them from the pool and write a per-host pattern.
      auto pool = pool::OpenRegion((*c)->pool_spec());
      if (!pool.ok()) return false;
      for (const GrantedExtent& e : *got) {
        std::memset((*pool)->addr() + e.offset, 0x40 + static_cast<int>(id), e.length);
      }
      auto dom = pool::OpenRegion((*c)->domain_spec());
      if (!dom.ok()) return false;
      co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
      co::SteadyClock clock;
      auto ph = co::PrefixHost::Join(mem, clock, id);
      if (!ph.ok()) return false;
      if (id == 0 && !(*ph)->Publish(ns, key, co::PrefixKey{}, Ref(0, 9)).ok()) return false;
      // Every host finds the prefix once the orchestrator applied it, and leases it.
      if (!WaitFor([&] {
            (void)(*ph)->Heartbeat(nullptr);
            auto l = (*ph)->LookupAndAcquire(ns, key);
            if (!l.ok()) return false;
            (*ph)->Release(*l);
            return l->ref == Ref(0, 9);
          })) {
        return false;
      }
      for (const GrantedExtent& e : *got) {
        if ((*pool)->addr()[e.offset + e.length - 1] != std::byte(0x40 + id)) return false;
      }
      std::this_thread::sleep_for(200ms);  // a few heartbeats
      return (*c)->Leave().ok();
    });
  }
  // While they run, the orchestrator sees three live hosts holding six extents.
  EXPECT_TRUE(WaitFor([&] { return Status().extents_assigned() == 6; })) << Status().DebugString();
  for (pid_t p : hosts) EXPECT_TRUE(Exited0(p));
  const pb::StatusReply s = Status();
  EXPECT_EQ(s.extents_assigned(), 0u) << "leaving hosts give their extents back";
  EXPECT_EQ(s.prefixes_published(), 1u);
  for (std::uint32_t id = 0; id < 3; ++id) EXPECT_EQ(HostState(id), "left");
  // Host 3 is not below max_hosts 4? It is; host 5 is not.
  auto bad = HostClient::Connect(socket_, 5);
  EXPECT_TRUE(absl::IsPermissionDenied(bad.status())) << bad.status();
}

// A host killed with SIGKILL is fenced on the orchestrator's clock and its extents return
// after the capacity lease; a rejoining host gets a new incarnation.
TEST_F(OrchestratorFixture, CrashedHostIsFencedAndItsExtentsReturn) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t h = Host([&] {
    auto c = HostClient::Connect(socket_, 1);
    if (!c.ok() || !(*c)->Grow(3).ok()) return false;
    (*c)->StartHeartbeats();
    char b = 1;
    (void)!write(ready[1], &b, 1);
    pause();
    return true;
  });
  char b;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  EXPECT_EQ(Status().extents_assigned(), 3u);
  kill(h, SIGKILL);
  waitpid(h, nullptr, 0);
  EXPECT_TRUE(WaitFor([&] { return HostState(1) == "fenced"; })) << Hosts().DebugString();
  EXPECT_TRUE(WaitFor([&] { return Status().extents_assigned() == 0; }))
      << "extents return after the capacity lease";
  auto again = HostClient::Connect(socket_, 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->incarnation(), 2u);
}

// kill -9 of the orchestrator while a host keeps publishing: after the restart no extent
// assignment, no published block and no incarnation is lost, and every publication the
// host had posted is applied (the request rings are in shared memory).
TEST_F(OrchestratorFixture, Kill9RestartLosesNothing) {
  int ctl[2], done[2];
  ASSERT_EQ(pipe(ctl), 0);
  ASSERT_EQ(pipe(done), 0);
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const pid_t h = Host([&] {
    auto c = HostClient::Connect(socket_, 2);
    if (!c.ok() || !(*c)->Grow(2).ok()) return false;
    (*c)->StartHeartbeats();
    auto dom = pool::OpenRegion((*c)->domain_spec());
    if (!dom.ok()) return false;
    co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
    co::SteadyClock clock;
    auto ph = co::PrefixHost::Join(mem, clock, 2);
    if (!ph.ok()) return false;
    // Publish until told to stop; count what was accepted into the ring.
    std::uint32_t posted = 0;
    fcntl(ctl[0], F_SETFL, O_NONBLOCK);
    char b;
    for (std::uint32_t i = 0; read(ctl[0], &b, 1) != 1; ++i) {
      const std::uint32_t t[] = {i};
      if ((*ph)->Publish(ns, co::ChainKey(ns, co::PrefixKey{}, t), co::PrefixKey{}, Ref(2, i)).ok()) {
        ++posted;
      }
      (void)(*ph)->Heartbeat(nullptr);
      std::this_thread::sleep_for(2ms);
    }
    const std::uint64_t inc = (*c)->incarnation();
    (void)!write(done[1], &posted, sizeof(posted));
    (void)!write(done[1], &inc, sizeof(inc));
    std::this_thread::sleep_for(300ms);
    const bool ok = (*c)->incarnation() == inc && (*c)->rejoins() == 0 && (*c)->extents().size() == 2;
    if (!ok) {
      std::fprintf(stderr, "host 2: incarnation %llu (was %llu), rejoins %llu, extents %zu\n",
                   static_cast<unsigned long long>((*c)->incarnation()),
                   static_cast<unsigned long long>(inc),
                   static_cast<unsigned long long>((*c)->rejoins()), (*c)->extents().size());
    }
    return ok;
  });
  ASSERT_TRUE(WaitFor([&] { return Status().prefixes_published() >= 20; }));
  StopDaemon(SIGKILL);  // mid-publish
  std::this_thread::sleep_for(100ms);  // the host keeps posting while it is down
  StartDaemon();
  const pb::StatusReply after = Status();
  EXPECT_EQ(after.recovered_at_start(), 2u) << "the extent assignment survived";
  EXPECT_EQ(HostState(2), "live") << "the host's incarnation survived";
  char b = 1;
  ASSERT_EQ(write(ctl[1], &b, 1), 1);
  std::uint32_t posted = 0;
  std::uint64_t inc = 0;
  ASSERT_EQ(read(done[0], &posted, sizeof(posted)), static_cast<ssize_t>(sizeof(posted)));
  ASSERT_EQ(read(done[0], &inc, sizeof(inc)), static_cast<ssize_t>(sizeof(inc)));
  EXPECT_GT(posted, 20u);
  EXPECT_TRUE(WaitFor([&] { return Status().prefixes_published() == posted; }))
      << "published " << Status().prefixes_published() << " of " << posted << " posted";
  EXPECT_TRUE(Exited0(h)) << "the host was neither fenced nor lost its extents";
}

// Drain: the host is told, cannot grow, gives its extents back. A host that is busy or
// stopped long enough to be fenced while draining (here: one heartbeat reply held past
// host_ttl_ms, as a descheduled thread would) rejoins draining, not live: the drain is the
// operator's and outlasts the fence. What the host still holds when it learns is given back,
// whichever incarnation holds it.
TEST_F(OrchestratorFixture, DrainStopsGrowthAndTheHostGivesBack) {
  std::atomic<bool> stall{false};
  HostClientOptions o;
  o.before_heartbeat_applied = [&] {
    if (stall.exchange(false)) std::this_thread::sleep_for(700ms);  // host_ttl_ms is 400
  };
  auto c = HostClient::Connect(socket_, 3, o);
  ASSERT_TRUE(c.ok());
  auto got = (*c)->Grow(2);
  ASSERT_TRUE(got.ok());
  (*c)->StartHeartbeats();
  {
    grpc::ClientContext ctx;
    pb::DrainRequest q;
    q.set_host_id(3);
    pb::DrainReply r;
    ASSERT_TRUE(Stub()->Drain(&ctx, q, &r).ok());
  }
  EXPECT_TRUE(WaitFor([&] { return (*c)->draining(); }));
  EXPECT_TRUE(absl::IsFailedPrecondition((*c)->Grow(1).status()));
  // The rejoin is a new incarnation (the rejoin count rises before its Join is answered, so
  // the incarnation is what says it happened). Until then, and after, the orchestrator may
  // report the host fenced (a heartbeat late again on a busy machine: it rejoins again), but
  // never live.
  const std::uint64_t inc0 = (*c)->incarnation();
  bool seen_live = false;
  auto not_live_until = [&](const std::function<bool(const std::string&)>& done) {
    return WaitFor([&] {
      const std::string st = HostState(3);
      seen_live |= st == "live";
      return done(st);
    });
  };
  stall = true;
  EXPECT_TRUE(not_live_until([&](const std::string& st) {
    return (*c)->incarnation() > inc0 && st == "draining";
  })) << "the stalled host was fenced and rejoined draining";
  EXPECT_TRUE(WaitFor([&] { return (*c)->draining(); })) << "and learns it is still draining";
  EXPECT_TRUE(absl::IsFailedPrecondition((*c)->Grow(1).status()))
      << "a drained host does not grow again after a rejoin";
  EXPECT_TRUE(WaitFor([&] {
    std::vector<std::uint32_t> held;
    for (const GrantedExtent& e : (*c)->extents()) held.push_back(e.index);
    return (held.empty() || (*c)->Shrink(held).ok()) && Status().extents_assigned() == 0;
  }));
  EXPECT_TRUE(not_live_until([](const std::string& st) { return st == "draining"; }));
  EXPECT_FALSE(seen_live) << "the drained host was live again";
}

// A join while the orchestrator is descheduled (SIGSTOP, as a busy machine or an etcd write
// that takes seconds holds it) past one call's 2 s deadline: Connect keeps trying within its
// join budget and joins once the orchestrator runs again. Before, the first deadline failed
// the engine's start (CI: HaRestoreTest's Join after a takeover on a loaded machine). Past the
// budget it fails, saying how many tries and which setting.
TEST_F(OrchestratorFixture, AJoinWaitsOutAStalledOrchestrator) {
  h_.Signal(SIGSTOP);
  std::thread resume([this] {
    std::this_thread::sleep_for(3s);
    h_.Signal(SIGCONT);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto c = HostClient::Connect(socket_, 2);
  resume.join();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2500ms) << "it waited for the stop";
  EXPECT_EQ(HostState(2), "live");
  HostClientOptions short_budget;
  short_budget.join_budget_ms = 2500;
  h_.Signal(SIGSTOP);
  auto late = HostClient::Connect(socket_, 3, short_budget);
  h_.Signal(SIGCONT);
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("join_budget_ms"), std::string::npos) << late.status();
}

// The operator's client (what cxlkvctl uses) reports what the wire says, field by field, and
// its two actions act: drain a host, evict a namespace's prefixes.
TEST_F(OrchestratorFixture, OperatorClientReportsTheDomainAndActs) {
  auto c = HostClient::Connect(socket_, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  auto got = (*c)->Grow(1);
  ASSERT_TRUE(got.ok() && got->size() == 1u);
  (*c)->StartHeartbeats();
  auto op = OperatorClient::Connect(socket_);
  ASSERT_TRUE(op.ok()) << op.status();

  auto st = (*op)->Status();
  ASSERT_TRUE(st.ok()) << st.status();
  const pb::StatusReply wire = Status();
  EXPECT_EQ(st->pool_spec, wire.pool_spec());
  EXPECT_EQ(st->domain_spec, wire.domain_spec());
  EXPECT_EQ(st->pool_bytes, wire.pool_bytes());
  EXPECT_EQ(st->extent_bytes, 16u << 20);
  EXPECT_EQ(st->extents_total, 16u);
  EXPECT_EQ(st->extents_assigned, 1u);
  EXPECT_EQ(st->extents_free, 15u);
  EXPECT_EQ(st->hosts_live, 1u);
  EXPECT_GT(st->uptime_ms, 0);

  auto hosts = (*op)->Hosts();
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  const HostView* me = nullptr;
  for (const HostView& h : *hosts) {
    if (h.host_id == 2) me = &h;
  }
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->state, "live");
  EXPECT_EQ(me->incarnation, (*c)->incarnation());
  EXPECT_EQ(me->extents, 1u);
  EXPECT_NE(me->hostname.find(" pid "), std::string::npos) << me->hostname;

  auto extents = (*op)->Extents();
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_EQ(extents->size(), 16u);
  const ExtentDetail& mine = (*extents)[got->front().index];
  EXPECT_EQ(mine.state, "assigned");
  EXPECT_EQ(mine.host, 2u);
  EXPECT_EQ(mine.incarnation, (*c)->incarnation());
  EXPECT_EQ(mine.offset, got->front().offset);
  EXPECT_EQ(mine.length, got->front().length);
  EXPECT_GT(mine.expires_in_ms, 0);

  auto prefixes = (*op)->Prefixes(0);
  ASSERT_TRUE(prefixes.ok()) << prefixes.status();
  EXPECT_EQ(prefixes->published, 0u);
  EXPECT_TRUE(prefixes->prefixes.empty());

  auto evicted = (*op)->Evict("t/m/l");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(*evicted, 0u);
  EXPECT_TRUE(absl::IsNotFound((*op)->Evict("no/such/ns").status()));

  ASSERT_TRUE((*op)->Drain(2).ok());
  EXPECT_TRUE(WaitFor([&] { return (*c)->draining(); }));
  const absl::Status not_live = (*op)->Drain(3);
  EXPECT_TRUE(absl::IsFailedPrecondition(not_live)) << not_live;
  EXPECT_NE(not_live.message().find("host 3"), std::string::npos) << not_live;

  // Given back, the extent is quarantined under its former holder until the daemon finds
  // no arena in it (which may already have happened: then it is free).
  ASSERT_TRUE((*c)->Shrink({got->front().index}).ok());
  extents = (*op)->Extents();
  ASSERT_TRUE(extents.ok()) << extents.status();
  const ExtentDetail& back = (*extents)[got->front().index];
  if (back.state == "quarantined") {
    EXPECT_EQ(back.host, 2u);
  } else {
    EXPECT_EQ(back.state, "free");
  }

  // Nobody listening: the call fails at once (kUnavailable), not after the deadline.
  auto none = OperatorClient::Connect(h_.dir + "/nobody.sock");
  ASSERT_TRUE(none.ok()) << none.status();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(absl::IsUnavailable((*none)->Status().status()));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_TRUE(absl::IsInvalidArgument(OperatorClient::Connect("tcp:nocolon").status()));
}

// ---- one orchestrator per domain, and the operator boundary (#33) ----------------------------

struct Ran {
  bool exited = false;  // false: still running at the limit (then killed)
  int code = -1;
  std::string out, err;
};

// Runs a program of this build with its output in files under `dir`, for at most `limit`.
Ran RunFor(const std::vector<std::string>& argv, const std::string& dir,
           std::chrono::milliseconds limit = 5s) {
  const std::string out = dir + "/run.out", err = dir + "/run.err";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Ran r;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  r.exited = status != -1 && WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// A second cxlkv-orchestrator of a running domain (the same domain.toml, or a unit started
// twice) is refused before it touches anything, naming the running one; a second domain's
// daemon naming the same pool and prefix domain is refused too. The first daemon and its
// hosts do not notice: same socket, same incarnation, nothing fenced.
TEST_F(OrchestratorFixture, SecondDaemonOfARunningDomainIsRefused) {
  auto c = HostClient::Connect(socket_, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Grow(2).ok());
  (*c)->StartHeartbeats();
  const std::uint64_t inc = (*c)->incarnation();
  struct stat sock_before {};
  ASSERT_EQ(::lstat(socket_.c_str(), &sock_before), 0);

  const std::string me = std::to_string(h_.pid);
  for (const char* flag : {"", "--new-domain"}) {
    std::vector<std::string> argv = {CXLKV_ORCHESTRATOR_BIN, "--config", h_.config};
    if (*flag != 0) argv.emplace_back(flag);
    const Ran r = RunFor(argv, h_.dir);
    ASSERT_TRUE(r.exited) << "a second daemon of the domain started (" << flag << "):\n" << r.err;
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("domain 'itest' is already served by another cxlkv-orchestrator: pid " +
                         me + ", rpc.socket " + socket_),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("Nothing was started or changed"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("or stop it first (systemctl stop, or kill " + me + ")"),
              std::string::npos)
        << r.err;
  }
  // Another domain.toml (its own state file and socket) naming the same regions.
  const std::string other = h_.dir + "/other.toml";
  {
    std::ifstream in(h_.config);
    std::string text(std::istreambuf_iterator<char>(in), {});
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{h_.dir + "/d.state", h_.dir + "/other.state"},
          {socket_, h_.dir + "/other.sock"}}) {
      text.replace(text.find(from), from.size(), to);
    }
    std::ofstream(other) << text;
  }
  const Ran r = RunFor({CXLKV_ORCHESTRATOR_BIN, "--config", other, "--new-domain"}, h_.dir);
  ASSERT_TRUE(r.exited) << "a second domain's daemon started on the same pool:\n" << r.err;
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("domain.pool 'file:" + h_.pool +
                       "?size=256M' is in use by another running orchestrator (pid " + me),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("give this domain its own domain.pool"), std::string::npos) << r.err;
  EXPECT_FALSE(Exists(h_.dir + "/other.state")) << "nothing written";
  EXPECT_FALSE(Exists(h_.dir + "/other.sock"));

  // The first daemon still owns everything; its host saw nothing.
  struct stat sock_after {};
  ASSERT_EQ(::lstat(socket_.c_str(), &sock_after), 0);
  EXPECT_EQ(sock_after.st_ino, sock_before.st_ino) << "the socket was not replaced";
  std::this_thread::sleep_for(1200ms);  // three host TTLs
  EXPECT_EQ(HostState(2), "live");
  EXPECT_EQ((*c)->incarnation(), inc);
  EXPECT_EQ((*c)->rejoins(), 0u);
  EXPECT_EQ((*c)->extents().size(), 2u);
  EXPECT_EQ(Status().extents_assigned(), 2u);
}

// A [[namespace]] whose layout the hosts never build (a typo) is not silent: once blocks of
// namespaces no table names are published, Status and `cxlkvctl status` name the table.
TEST(OrchestratorNamespaces, ATableNoPublicationMatchesIsNamed) {
  OrchestratorProcess h{
      "lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
      "grace_ms = 20\ncapacity_lease_ms = 1000\n"};
  std::ofstream(h.config, std::ios::app)
      << "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"fp16-l8O\"\npin = 2\n";
  h.Start();
  const co::Namespace configured = co::MakeNamespace("t", "m", "l");
  const co::Namespace built = co::MakeNamespace("t", "m", "fp16-l80");  // what the typo meant
  const std::uint32_t tokens[] = {1, 2, 3};
  EXPECT_EQ(h.Status().unmatched_namespaces_size(), 0) << "nothing published: nothing to say";
  const pid_t host = OrchestratorProcess::Fork([&] {
    auto c = HostClient::Connect(h.socket, 0);
    if (!c.ok()) return false;
    (*c)->StartHeartbeats();
    auto dom = pool::OpenRegion((*c)->domain_spec());
    if (!dom.ok()) return false;
    co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
    co::SteadyClock clock;
    auto ph = co::PrefixHost::Join(mem, clock, 0);
    if (!ph.ok()) return false;
    const co::PrefixKey k1 = co::ChainKey(configured, co::PrefixKey{}, tokens);
    const co::PrefixKey k2 = co::ChainKey(built, co::PrefixKey{}, tokens);
    if (!(*ph)->Publish(configured, k1, co::PrefixKey{}, Ref(0, 1)).ok()) return false;
    if (!(*ph)->Publish(built, k2, co::PrefixKey{}, Ref(0, 2)).ok()) return false;
    return WaitFor([&] { return (*ph)->Lookup(built, k2).has_value(); }) && (*c)->Leave().ok();
  });
  ASSERT_TRUE(OrchestratorProcess::Exited0(host));
  const pb::StatusReply s = h.Status();
  ASSERT_EQ(s.unmatched_namespaces_size(), 1) << s.DebugString();
  EXPECT_EQ(s.unmatched_namespaces(0), "t/m/fp16-l8O") << "t/m/l matched a block";
  const Ran r = RunFor({CXLKV_CTL_BIN, "status", "--socket", h.socket}, h.dir);
  ASSERT_TRUE(r.exited && r.code == 0) << r.err;
  EXPECT_NE(r.out.find("[[namespace]] t/m/fp16-l8O matched no published block"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("check its tenant, model and layout"), std::string::npos) << r.out;
}

// rpc.socket: a regular file in the way, and another program's live socket, are refused and
// left as they are, before anything is written; a stale socket (a killed daemon's) is replaced.
TEST(OrchestratorSocket, OnlyAStaleSocketIsReplaced) {
  OrchestratorProcess o("lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n");
  const std::string state = o.dir + "/d.state";
  {
    std::ofstream(o.socket) << "keep me\n";
    const Ran r = RunFor({CXLKV_ORCHESTRATOR_BIN, "--config", o.config, "--new-domain"}, o.dir);
    ASSERT_TRUE(r.exited) << "started over a regular file:\n" << r.err;
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("rpc.socket '" + o.socket +
                         "' exists and is not a socket (a regular file); it was left as it is: "
                         "move it away, or set rpc.socket to another path"),
              std::string::npos)
        << r.err;
    std::ifstream in(o.socket);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep me\n");
    EXPECT_FALSE(Exists(state)) << "refused before the state file was written";
    ASSERT_EQ(unlink(o.socket.c_str()), 0);
  }
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, o.socket.c_str(), sizeof(a.sun_path) - 1);
  {
    // Another program (another domain's daemon) listens there.
    const int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::listen(l, 4), 0);
    struct stat before {};
    ASSERT_EQ(::lstat(o.socket.c_str(), &before), 0);
    const Ran r = RunFor({CXLKV_ORCHESTRATOR_BIN, "--config", o.config, "--new-domain"}, o.dir);
    ASSERT_TRUE(r.exited) << "took over a live socket:\n" << r.err;
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(
        r.err.find("rpc.socket '" + o.socket + "' is in use: a running process answers on it"),
        std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("set rpc.socket to a path of this domain's own"), std::string::npos);
    struct stat after {};
    ASSERT_EQ(::lstat(o.socket.c_str(), &after), 0);
    EXPECT_EQ(after.st_ino, before.st_ino) << "the live socket was left as it is";
    EXPECT_TRUE(AcceptsConnections(o.socket));
    EXPECT_FALSE(Exists(state));
    ::close(l);  // now stale: bound, nobody listening
  }
  ASSERT_TRUE(Exists(o.socket));
  o.Start();  // replaces the stale socket
  grpc::ClientContext ctx;
  pb::StatusReply st;
  EXPECT_TRUE(o.Stub()->Status(&ctx, pb::StatusRequest{}, &st).ok());
  o.Stop(SIGTERM);
  EXPECT_FALSE(Exists(o.socket)) << "a daemon that stops removes its own socket";
}

// pool and prefix_domain naming the same memory: refused by --validate and at start with both
// keys named, and nothing is created.
TEST(OrchestratorValidate, OverlappingRegionsAreRefusedBeforeAnythingIsCreated) {
  const cxlkv::testing::TempDir scratch("overlap", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl, config = dir + "/domain.toml", pool = dir + "/pool";
  std::ofstream(config) << "[domain]\nname = \"o\"\npool = \"file:" << pool
                        << "?size=64M\"\nprefix_domain = \"file:" << dir
                        << "/./pool?size=64M\"\nextent_size = \"16M\"\nstate_file = \"" << dir
                        << "/d.state\"\n[rpc]\nsocket = \"" << dir << "/o.sock\"\n";
  for (const char* mode : {"--validate", "--new-domain"}) {
    const Ran r = RunFor({CXLKV_ORCHESTRATOR_BIN, "--config", config, mode}, dir);
    ASSERT_TRUE(r.exited) << mode << ":\n" << r.err;
    EXPECT_EQ(r.code, 2) << mode << ": " << r.err;
    EXPECT_NE(r.err.find("keys 'domain.pool' and 'domain.prefix_domain' name the same memory"),
              std::string::npos)
        << mode << ": " << r.err;
    EXPECT_FALSE(Exists(pool)) << mode << ": nothing created";
    EXPECT_FALSE(Exists(dir + "/d.state"));
  }
}

// metrics.listen on an address another process holds: named, with the fix (not CivetServer's
// "null context" alone).
TEST(OrchestratorValidate, MetricsAddressInUseIsNamedWithTheFix) {
  const cxlkv::testing::TempDir scratch("metrics", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl, config = dir + "/domain.toml";
  const int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(busy, 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(busy, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string listen = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::ofstream(config) << "[domain]\nname = \"m\"\npool = \"memfd:?size=64M\"\n"
                        << "prefix_domain = \"memfd:?size=4M\"\nextent_size = \"16M\"\n"
                        << "index_entries = 1024\nmax_hosts = 4\nstate_file = \"" << dir
                        << "/d.state\"\n[rpc]\nsocket = \"" << dir << "/o.sock\"\n"
                        << "[metrics]\nlisten = \"" << listen << "\"\n";
  const Ran r = RunFor({CXLKV_ORCHESTRATOR_BIN, "--config", config, "--new-domain"}, dir);
  ::close(busy);
  ASSERT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("metrics.listen '" + listen + "': cannot listen there"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("choose another HOST:PORT, or \"\" to turn metrics off"), std::string::npos)
      << r.err;
  // Refused before anything was written: no state file, no socket.
  struct stat st {};
  EXPECT_NE(::stat((dir + "/d.state").c_str(), &st), 0) << "a state file was written";
  EXPECT_NE(::stat((dir + "/o.sock").c_str(), &st), 0) << "a socket was bound";
}

// Read-only commands never create, extend or write a file; a failed format leaves nothing it
// created.
TEST(CxlkvctlArena, InfoCreatesNothingAndAFailedFormatLeavesNothing) {
  const cxlkv::testing::TempDir scratch("arenactl", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl, file = dir + "/a";
  // info on a missing file, size= given: refused, nothing created.
  Ran r = RunFor({CXLKV_CTL_BIN, "arena", "info", "file:" + file + "?size=4M"}, dir);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(file + ": file does not exist (this command only reads and never creates "
                              "one)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(Exists(file)) << "arena info created the file";
  // info on an empty file with size=: not extended.
  { std::ofstream(file) << ""; }
  r = RunFor({CXLKV_CTL_BIN, "arena", "info", "file:" + file + "?size=4M"}, dir);
  EXPECT_NE(r.code, 0);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "arena info extended the file";
  ASSERT_EQ(unlink(file.c_str()), 0);
  // A file that is no arena (a text file): named as such, not "round it".
  { std::ofstream(file) << "not an arena\n"; }
  r = RunFor({CXLKV_CTL_BIN, "arena", "info", "file:" + file}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("so it holds no arena or domain cxlkv made"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("round it"), std::string::npos) << r.err;
  ASSERT_EQ(unlink(file.c_str()), 0);
  // format on a region too small: refused, and the file it created is gone.
  r = RunFor({CXLKV_CTL_BIN, "arena", "format", "file:" + file + "?size=4096"}, dir);
  ASSERT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("too small"), std::string::npos) << r.err;
  EXPECT_FALSE(Exists(file)) << "a failed format left the file it created";
  // ... but a file that was there before stays.
  { std::ofstream(file) << std::string(4096, '\0'); }
  r = RunFor({CXLKV_CTL_BIN, "arena", "format", "file:" + file}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(Exists(file));
  // --socket longer than a Unix socket path: named, with the fix.
  r = RunFor({CXLKV_CTL_BIN, "status", "--socket", dir + "/" + std::string(120, 's')}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("a Unix socket path holds at most 107: pass a shorter path"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("secure client channel"), std::string::npos) << r.err;
}

// cxlkv-prefix-share (the quickstart's tool) reports a host that dies and returns.
TEST_F(OrchestratorFixture, PrefixShareReportsADeadHostAndReturns) {
  const std::string out = h_.dir + "/share.out", err = h_.dir + "/share.err";
  const pid_t tool = fork();
  if (tool == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    execl(CXLKV_PREFIX_SHARE_BIN, CXLKV_PREFIX_SHARE_BIN, "--socket", socket_.c_str(), "--seconds",
          "2", "--prefixes", "2", "--blocks", "2", "--layout", "llama3-8b", nullptr);
    _exit(127);
  }
  // Its hosts are its children; host 1 (the second) is killed once it runs.
  std::vector<pid_t> hosts;
  ASSERT_TRUE(WaitFor([&] {
    std::ifstream in("/proc/" + std::to_string(tool) + "/task/" + std::to_string(tool) +
                     "/children");
    hosts.clear();
    for (pid_t p = 0; in >> p;) hosts.push_back(p);
    return hosts.size() == 2;
  })) << "the tool did not start two hosts: "
      << std::string(std::istreambuf_iterator<char>(std::ifstream(err).rdbuf()), {});
  std::sort(hosts.begin(), hosts.end());
  const pid_t victim = hosts.size() == 2 ? hosts[1] : -1;
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  pid_t done = 0;
  while ((done = waitpid(tool, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  if (done == 0) {
    kill(tool, SIGKILL);
    waitpid(tool, &status, 0);
    for (pid_t p : hosts) kill(p, SIGKILL);
  }
  ASSERT_NE(done, 0) << "cxlkv-prefix-share did not return after its host died";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::ifstream in(err);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  EXPECT_NE(text.find("cxlkv-prefix-share: host 1 failed: host 1 (pid " + std::to_string(victim) +
                      ") died (signal 9) before reporting"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace cxlkv::orchestrator

namespace cxlkv::testing {
namespace {

namespace pb = ::cxlkv::orchestrator::v1;

// A TCP port nobody listens on now (the daemon binds it right after).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

void WriteSecret(const std::string& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
  ::chmod(path.c_str(), 0600);
}

// `cxlkvctl status` over an endpoint, with the environment given; its exit status.
int CtlStatus(const std::string& where, const std::string& env) {
  const std::string cmd = env + " " + CXLKV_CTL_BIN + " status --socket " + where + " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

constexpr char kTcpTiming[] =
    "lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
    "grace_ms = 20\ncapacity_lease_ms = 1000\n";

// rpc.tcp: a call without the domain's token, or with another, is refused (UNAUTHENTICATED);
// with it, hosts join and operators query over TCP as over the Unix socket.
TEST(OrchestratorTcp, TheTokenAuthorizesTcpCalls) {
  const cxlkv::testing::TempDir scratch("tcp", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl, good = dir + "/good.token", bad = dir + "/bad.token";
  WriteSecret(good, "s3cret-token-of-the-domain-0123456789");
  WriteSecret(bad, "another-token-not-the-domain-s-9876");
  const int port = FreePort();
  OrchestratorProcess o(kTcpTiming, "tcp = \"127.0.0.1:" + std::to_string(port) +
                                        "\"\ntoken_file = \"" + good + "\"\n");
  o.Start();
  const std::string where = "tcp:127.0.0.1:" + std::to_string(port);

  ::unsetenv("CXLKV_RPC_TOKEN_FILE");
  auto none = orchestrator::HostClient::Connect(where, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("CXLKV_RPC_TOKEN_FILE"), std::string::npos)
      << none.status();

  // A raw call without the header: refused by the daemon.
  {
    auto stub = pb::Orchestrator::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                              grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::StatusReply r;
    const grpc::Status st = stub->Status(&ctx, pb::StatusRequest{}, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_NE(st.error_message().find("missing or wrong token"), std::string::npos);
  }

  ::setenv("CXLKV_RPC_TOKEN_FILE", bad.c_str(), 1);
  auto wrong = orchestrator::HostClient::Connect(where, 1);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_EQ(o.HostState(1), "absent");
  EXPECT_NE(CtlStatus(where, "CXLKV_RPC_TOKEN_FILE=" + bad), 0);

  ::setenv("CXLKV_RPC_TOKEN_FILE", good.c_str(), 1);
  auto c = orchestrator::HostClient::Connect(where, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(o.HostState(1), "live");
  auto grown = (*c)->Grow(1);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->size(), 1u);
  EXPECT_EQ(CtlStatus(where, "CXLKV_RPC_TOKEN_FILE=" + good), 0);
  ASSERT_TRUE((*c)->Leave().ok());
  c->reset();
  ::unsetenv("CXLKV_RPC_TOKEN_FILE");
}

// rpc.tls_cert/tls_key: TCP with TLS; a client that trusts the CA (CXLKV_RPC_CA) joins, one
// that speaks plaintext cannot.
TEST(OrchestratorTcp, TlsCarriesTheToken) {
  const cxlkv::testing::TempDir scratch("tls", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl, token = dir + "/rpc.token";
  WriteSecret(token, "s3cret-token-of-the-domain-0123456789");
  const std::string gen =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      dir + "/key.pem -out " + dir + "/cert.pem >/dev/null 2>&1";
  if (std::system(gen.c_str()) != 0) GTEST_SKIP() << "openssl could not make a certificate";
  const int port = FreePort();
  OrchestratorProcess o(kTcpTiming, "tcp = \"127.0.0.1:" + std::to_string(port) +
                                        "\"\ntoken_file = \"" + token + "\"\ntls_cert = \"" + dir +
                                        "/cert.pem\"\ntls_key = \"" + dir + "/key.pem\"\n");
  o.Start();
  // 127.0.0.1, not localhost: gRPC would resolve a name with c-ares, whose resolver leaks a
  // few bytes per lookup (LeakSanitizer in the asan build).
  const std::string where = "tcp:127.0.0.1:" + std::to_string(port);
  ::setenv("CXLKV_RPC_TOKEN_FILE", token.c_str(), 1);
  ::unsetenv("CXLKV_RPC_CA");
  auto plain = orchestrator::HostClient::Connect(where, 2);
  EXPECT_FALSE(plain.ok()) << "a plaintext client reached a TLS endpoint";
  ::setenv("CXLKV_RPC_CA", (dir + "/cert.pem").c_str(), 1);
  auto c = orchestrator::HostClient::Connect(where, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(o.HostState(2), "live");
  EXPECT_EQ(CtlStatus(where, "CXLKV_RPC_TOKEN_FILE=" + token + " CXLKV_RPC_CA=" + dir + "/cert.pem"),
            0);
  c->reset();
  ::unsetenv("CXLKV_RPC_TOKEN_FILE");
  ::unsetenv("CXLKV_RPC_CA");
}

}  // namespace
}  // namespace cxlkv::testing
