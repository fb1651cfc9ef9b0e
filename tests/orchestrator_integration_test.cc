// cxlkv-orchestrator with several host processes on a shared file pool: join/leave, host
// crash and fencing, orchestrator kill -9 and restart while hosts publish, drain.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"
#include "orchestrator.grpc.pb.h"

namespace cxlkv::orchestrator {
namespace {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;
using namespace std::chrono_literals;

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

class OrchestratorFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cxlkv-orch-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string tag = std::to_string(getpid());
    pool_ = "/dev/shm/cxlkv-orch-pool-" + tag;
    domain_ = "/dev/shm/cxlkv-orch-domain-" + tag;
    socket_ = dir_ + "/o.sock";
    config_ = dir_ + "/domain.toml";
    std::ofstream(config_) << "[domain]\nname = \"itest\"\n"
                           << "pool = \"file:" << pool_ << "?size=256M\"\n"
                           << "prefix_domain = \"file:" << domain_ << "?size=4M\"\n"
                           << "extent_size = \"16M\"\nstate_file = \"" << dir_ << "/d.state\"\n"
                           << "index_entries = 1024\nmax_hosts = 4\n"
                           << "[rpc]\nsocket = \"" << socket_ << "\"\n[metrics]\nlisten = \"\"\n"
                           << "[timing]\nlease_ttl_ms = 400\nhost_ttl_ms = 400\n"
                           << "heartbeat_period_ms = 50\ngrace_ms = 20\ncapacity_lease_ms = 1000\n"
                           << "[capacity]\ndefault_share = 0.5\n"
                           << "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"l\"\n";
    StartDaemon();
  }
  void TearDown() override {
    StopDaemon(SIGTERM);
    unlink(pool_.c_str());
    unlink(domain_.c_str());
    std::string cmd = "rm -rf " + dir_;
    ASSERT_EQ(system(cmd.c_str()), 0);
  }

  void StartDaemon() {
    daemon_ = fork();
    ASSERT_GE(daemon_, 0);
    if (daemon_ == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      execl(CXLKV_ORCHESTRATOR_BIN, CXLKV_ORCHESTRATOR_BIN, "--config", config_.c_str(), nullptr);
      _exit(127);
    }
    ASSERT_TRUE(WaitFor([&] {
      const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, socket_.c_str(), sizeof(a.sun_path) - 1);
      const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
      return ok;
    })) << "the orchestrator did not come up";
  }
  void StopDaemon(int sig) {
    if (daemon_ <= 0) return;
    kill(daemon_, sig);
    int status = 0;
    waitpid(daemon_, &status, 0);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    daemon_ = -1;
  }

  std::unique_ptr<pb::Orchestrator::Stub> Stub() {
    return pb::Orchestrator::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }
  pb::HostsReply Hosts() {
    grpc::ClientContext ctx;
    pb::HostsReply r;
    EXPECT_TRUE(Stub()->Hosts(&ctx, pb::HostsRequest{}, &r).ok());
    return r;
  }
  pb::StatusReply Status() {
    grpc::ClientContext ctx;
    pb::StatusReply r;
    EXPECT_TRUE(Stub()->Status(&ctx, pb::StatusRequest{}, &r).ok());
    return r;
  }
  std::string HostState(std::uint32_t id) {
    const pb::HostsReply r = Hosts();
    for (const auto& h : r.hosts()) {
      if (h.host_id() == id) return h.state();
    }
    return "absent";
  }

  // Runs body in a child process; returns its pid. The child exits 0 if body returns true.
  pid_t Host(const std::function<bool()>& body) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body() ? 0 : 1);
    return pid;
  }
  static bool Exited0(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::string dir_, pool_, domain_, socket_, config_;
  pid_t daemon_ = -1;
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
    return (*c)->incarnation() == inc && (*c)->rejoins() == 0 && (*c)->extents().size() == 2;
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

// Drain: the host is told, cannot grow, gives its extents back.
TEST_F(OrchestratorFixture, DrainStopsGrowthAndTheHostGivesBack) {
  auto c = HostClient::Connect(socket_, 3);
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
  std::vector<std::uint32_t> all;
  for (const GrantedExtent& e : *got) all.push_back(e.index);
  ASSERT_TRUE((*c)->Shrink(all).ok());
  EXPECT_EQ(Status().extents_assigned(), 0u);
  EXPECT_EQ(HostState(3), "draining");
}

}  // namespace
}  // namespace cxlkv::orchestrator
