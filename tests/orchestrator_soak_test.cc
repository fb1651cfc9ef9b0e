// Soak: cxlkv-orchestrator and three host processes for CXLKV_SOAK_SECONDS (default 60) with
// random faults — hosts SIGKILLed and restarted, hosts stopped (SIGSTOP) long enough to be
// fenced, the orchestrator kill -9'd and restarted — while the hosts grow and shrink
// capacity, publish KV blocks from their arenas, lease and read each other's blocks (every
// byte checked), and collect returned blocks. At the end every prefix is evicted and every
// host collects its returns: no extent may remain assigned and no block may remain
// allocated or persisted in any arena. Seeded (CXLKV_SEED, printed).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"
#include "orchestrator_process.h"
#include "temp_dir.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

namespace co = ::cxlkv::coherence;
namespace opb = ::cxlkv::orchestrator::v1;
using allocator::BlockAllocator;
using allocator::BlockHandle;

constexpr std::uint32_t kHosts = 3;
constexpr std::uint32_t kKeys = 48;
const co::Namespace kNs = co::MakeNamespace("t", "m", "l");

std::uint64_t Seed() {
  const char* s = std::getenv("CXLKV_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : std::random_device{}();
}

co::PrefixKey Key(std::uint32_t k) {
  const std::uint32_t t[] = {k};
  return co::ChainKey(kNs, co::PrefixKey{}, t);
}

std::uint64_t Pattern(const co::BlockRef& r) {
  return (std::uint64_t{r.index} << 32 | r.generation) * 0x9E3779B97F4A7C15ull ^ r.arena[0];
}

std::string g_arenas;  // a directory in /dev/shm, set by the test before it forks
std::string ArenaPath(std::uint32_t host) { return g_arenas + "/arena-" + std::to_string(host); }

struct Worlds {
  std::vector<std::unique_ptr<pool::Arena>> peers;  // every host's arena, read-only
};

// Frees blocks the owner handed back to this host.
void Collect(co::PrefixHost& host, BlockAllocator& alloc) {
  std::vector<co::BlockRef> back;
  (void)host.Heartbeat(&back);
  for (const co::BlockRef& r : back) (void)alloc.Free(BlockHandle{r.index, r.generation});
}

// One host process: runs until killed, or until `stop` exists (then collects and leaves).
bool HostMain(const std::string& socket, std::uint32_t id, std::uint64_t seed,
              const std::string& stop_file, bool collect_only) {
  auto fail = [id](const std::string& what) {
    std::fprintf(stderr, "host %u: %s\n", id, what.c_str());
    return false;
  };
  auto client = orchestrator::HostClient::Connect(socket, id);
  for (int i = 0; i < 50 && !client.ok() && absl::IsUnavailable(client.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the orchestrator restarts
    client = orchestrator::HostClient::Connect(socket, id);
  }
  if (!client.ok()) return fail("join: " + std::string(client.status().message()));
  client.value()->StartHeartbeats();
  auto region = pool::OpenRegion("file:" + ArenaPath(id));
  if (!region.ok()) return fail("region: " + std::string(region.status().message()));
  auto arena = pool::Arena::Open(std::move(*region));
  if (!arena.ok()) return fail("arena: " + std::string(arena.status().message()));
  (*arena)->Recover();  // a killed predecessor's blocks come back
  auto alloc = BlockAllocator::Create(std::move(*arena));
  if (!alloc.ok()) return fail("alloc: " + std::string(alloc.status().message()));
  Worlds w;
  for (std::uint32_t h = 0; h < kHosts; ++h) {
    pool::OpenOptions ro;
    ro.read_only = true;
    auto r = pool::OpenRegion("file:" + ArenaPath(h));
    if (!r.ok()) return fail("r: " + std::string(r.status().message()));
    auto a = pool::Arena::Open(std::move(*r), ro);
    if (!a.ok()) return fail("a: " + std::string(a.status().message()));
    w.peers.push_back(std::move(*a));
  }
  auto dom = pool::OpenRegion(client.value()->domain_spec());
  if (!dom.ok()) return fail("dom: " + std::string(dom.status().message()));
  co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
  co::SteadyClock clock;
  auto host = co::PrefixHost::Join(mem, clock, id);
  if (!host.ok()) return fail("host: " + std::string(host.status().message()));
  if (collect_only) {
    for (int i = 0; i < 100; ++i) {
      Collect(**host, **alloc);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const absl::Status left = client.value()->Leave();
    return left.ok() || fail("leave: " + std::string(left.message()));
  }
  std::mt19937_64 rng(seed);
  std::vector<orchestrator::GrantedExtent> extents;
  while (access(stop_file.c_str(), F_OK) != 0) {
    const auto op = rng() % 10;
    if (op == 0) {
      (void)client.value()->Grow(1);
    } else if (op == 1) {
      const auto held = client.value()->extents();
      if (!held.empty()) (void)client.value()->Shrink({held[rng() % held.size()].index});
    } else if (op < 4) {
      const BlockHandle b = (*alloc)->Alloc(0);
      if (!b.valid()) {
        Collect(**host, **alloc);
        continue;
      }
      co::BlockRef ref{};
      std::memcpy(ref.arena, (*alloc)->arena().uuid().data(), 16);
      ref.index = b.index;
      ref.generation = b.generation;
      const std::uint64_t v = Pattern(ref);
      co::CopyNt((*alloc)->Addr(b), &v, sizeof(v));
      if (!(*host)->Publish(kNs, Key(static_cast<std::uint32_t>(rng() % kKeys)), co::PrefixKey{},
                            ref, [&] { return (*alloc)->Persist(b).ok(); })
               .ok()) {
        (void)(*alloc)->Free(b);
      }
    } else if (op < 8) {
      std::vector<co::PrefixKey> keys;
      for (int k = 0; k < 3; ++k) keys.push_back(Key(static_cast<std::uint32_t>(rng() % kKeys)));
      std::vector<co::Lease> leases;
      if (!(*host)->AcquireChain(kNs, keys, &leases).ok()) continue;
      for (const co::Lease& l : leases) {
        for (const auto& peer : w.peers) {
          if (std::memcmp(peer->uuid().data(), l.ref.arena, 16) != 0) continue;
          auto addr = peer->Resolve(peer->uuid(), l.ref.index, l.ref.generation);
          std::uint64_t v = 0;
          if (addr.ok()) {
            co::Invalidate(*addr, sizeof(v));
            std::memcpy(&v, *addr, sizeof(v));
          }
          if ((*host)->ValidateAfterCopy(l).ok() && (!addr.ok() || v != Pattern(l.ref))) {
            std::fprintf(stderr, "host %u: a validated lease read wrong data\n", id);
            return false;
          }
        }
      }
      (*host)->ReleaseAll(leases);
    } else {
      if (rng() % 4 == 0) (void)(*host)->Retire(kNs, Key(static_cast<std::uint32_t>(rng() % kKeys)));
      Collect(**host, **alloc);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (int i = 0; i < 20; ++i) Collect(**host, **alloc);
  const absl::Status left = client.value()->Leave();
  return left.ok() || fail("leave: " + std::string(left.message()));
}

TEST(OrchestratorSoak, RandomFaultsLeakNothing) {
  const std::uint64_t seed = Seed();
  const char* secs_env = std::getenv("CXLKV_SOAK_SECONDS");
  const int seconds = secs_env != nullptr ? std::atoi(secs_env) : 60;
  std::printf("soak seed=%llu seconds=%d (replay: CXLKV_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), seconds, static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  OrchestratorProcess h(
      "lease_ttl_ms = 300\nhost_ttl_ms = 300\nheartbeat_period_ms = 50\ngrace_ms = 20\n"
      "capacity_lease_ms = 600\n");
  h.Start();
  // The hosts' arena files, removed with this directory however the test ends.
  const cxlkv::testing::TempDir arenas("soak", "/dev/shm");
  ASSERT_FALSE(arenas.path().empty());
  g_arenas = arenas.path();
  // Each host's arena (a file the host process reopens after every restart).
  for (std::uint32_t i = 0; i < kHosts; ++i) {
    pool::FormatOptions o;
    o.layout = TinyLayout();
    o.force = true;
    auto a = pool::Arena::Format(MustOpen("file:" + ArenaPath(i) + "?size=8M"), o);
    ASSERT_TRUE(a.ok()) << a.status();
  }
  const std::string stop = h.dir + "/stop";
  std::mt19937_64 rng(seed);
  std::vector<pid_t> pids(kHosts, -1);
  auto spawn = [&](std::uint32_t i) {
    const std::uint64_t s = rng();
    pids[i] =
        OrchestratorProcess::Fork([&, i, s] { return HostMain(h.socket, i, s, stop, false); });
  };
  for (std::uint32_t i = 0; i < kHosts; ++i) spawn(i);
  int kills = 0, stops = 0, restarts = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 600));
    const auto f = rng() % 10;
    const auto i = static_cast<std::uint32_t>(rng() % kHosts);
    if (f < 4) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
      spawn(i);
      ++kills;
    } else if (f < 7) {
      kill(pids[i], SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 700));  // maybe fenced
      kill(pids[i], SIGCONT);
      ++stops;
    } else if (f < 8) {
      h.Stop(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
      h.Start();
      ++restarts;
    }
  }
  // Wind down: hosts stop, leave. The operator evicts the namespace; each host id collects
  // what the owner hands back.
  ASSERT_EQ(creat(stop.c_str(), 0600) >= 0, true);
  for (std::uint32_t i = 0; i < kHosts; ++i) {
    EXPECT_TRUE(OrchestratorProcess::Exited0(pids[i])) << "host " << i << " failed";
  }
  {
    grpc::ClientContext ctx;
    opb::EvictRequest q;
    q.set_ns("t/m/l");
    opb::EvictReply r;
    ASSERT_TRUE(h.Stub()->Evict(&ctx, q, &r).ok());
  }
  const bool drained = WaitFor(
      [&] {
        for (std::uint32_t i = 0; i < kHosts; ++i) {
          EXPECT_TRUE(OrchestratorProcess::Exited0(
              OrchestratorProcess::Fork([&, i] { return HostMain(h.socket, i, 0, stop, true); })));
        }
        grpc::ClientContext ctx;
        opb::PrefixesRequest q;
        opb::PrefixesReply r;
        if (!h.Stub()->Prefixes(&ctx, q, &r).ok()) return false;
        return r.published() == 0 && r.retired() == 0;
      },
      std::chrono::milliseconds(20000));
  EXPECT_TRUE(drained) << "the index never drained";
  EXPECT_TRUE(WaitFor([&] {
    const auto st = h.Status();
    return st.extents_assigned() == 0 && st.extents_quarantined() == 0;
  })) << "extents leaked: " << h.Status().DebugString();
  std::uint64_t leaked = 0;
  for (std::uint32_t i = 0; i < kHosts; ++i) {
    auto a = pool::Arena::Open(MustOpen("file:" + ArenaPath(i)));
    ASSERT_TRUE(a.ok());
    (*a)->Recover();
    const pool::ClassUsage u = (*a)->Usage().classes[0];
    leaked += u.allocated + u.persisted;
    EXPECT_EQ(u.allocated + u.persisted, 0u) << "host " << i << "'s arena: " << u.allocated
                                             << " allocated, " << u.persisted << " persisted";
  }
  const opb::StatusReply st = h.Status();
  std::printf("soak: %d host kills, %d stops, %d orchestrator kill -9; %llu prefixes reclaimed "
              "since the last restart; %llu blocks leaked\n",
              kills, stops, restarts, static_cast<unsigned long long>(st.prefixes_reclaimed()),
              static_cast<unsigned long long>(leaked));
}

}  // namespace
}  // namespace cxlkv::testing
