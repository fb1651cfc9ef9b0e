// libcxlkv.so alone (no C++ module linked beside it): cxlkv_domain_join("orchestrator:...")
// joins a pooled domain through a running cxlkv-orchestrator.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/cxlkv.h"
#include "gtest/gtest.h"
#include "orchestrator_process.h"

namespace cxlkv::testing {
namespace {

// What cxlkvctl reports for a host (the operator's view, through the control plane).
std::string HostLine(const OrchestratorProcess& o, unsigned host) {
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " hosts --socket " + o.socket;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  char line[512];
  std::string found;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    unsigned id = 0;
    if (std::sscanf(line, "%u", &id) == 1 && id == host) found = line;
  }
  pclose(p);
  return found;
}

TEST(CApiOrchestrator, JoinsThroughTheOrchestrator) {
  // Nothing here waits for an expiry: TTLs far longer than a cxlkvctl run on a busy machine
  // (under ASan one took over 400 ms, and the host was declared dead before its heartbeat).
  OrchestratorProcess o(
      "lease_ttl_ms = 10000\nhost_ttl_ms = 10000\nheartbeat_period_ms = 250\n"
      "grace_ms = 20\ncapacity_lease_ms = 10000\n");
  o.Start();
  cxlkv_domain* d = nullptr;
  const std::string spec = "orchestrator:" + o.socket;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), 2, &d), CXLKV_OK) << cxlkv_last_error();
  EXPECT_NE(HostLine(o, 2).find("live"), std::string::npos) << HostLine(o, 2);
  EXPECT_EQ(cxlkv_domain_heartbeat(d, nullptr, nullptr), CXLKV_OK);
  cxlkv_domain_leave(d);
  EXPECT_NE(HostLine(o, 2).find("left"), std::string::npos) << HostLine(o, 2);
  cxlkv_domain* bad = nullptr;
  EXPECT_EQ(cxlkv_domain_join(spec.c_str(), 7, &bad), CXLKV_E_PERMISSION)
      << "host 7 is not below max_hosts 4";
  EXPECT_NE(std::string(cxlkv_last_error()).find("not allowed"), std::string::npos)
      << cxlkv_last_error();
}

// `cxlkvctl status`: extents assigned, free, quarantined.
struct ExtentCounts {
  unsigned assigned = 0, free = 0, quarantined = 0;
};
ExtentCounts Extents(const OrchestratorProcess& o) {
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " status --socket " + o.socket;
  FILE* p = popen(cmd.c_str(), "r");
  ExtentCounts c;
  if (p == nullptr) return c;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    unsigned total = 0, mib = 0;
    std::sscanf(line, "extents %u of %u MiB: %u assigned, %u free, %u quarantined", &total, &mib,
                &c.assigned, &c.free, &c.quarantined);
  }
  pclose(p);
  return c;
}

// Small blocks (2 * 2 layers * 2 heads * 128 dims * 2 bytes * 64 tokens = 256 KiB) so that a
// 16 MiB extent holds dozens.
constexpr size_t kBlockBytes = 2 * 2 * 2 * 128 * 2 * 64;
cxlkv_arena_options SmallBlocks() {
  cxlkv_arena_options o{};
  o.layout = cxlkv_kv_layout{2, 2, 128, 2, 64, 0};
  return o;
}

constexpr char kTiming[] =
    "lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
    "grace_ms = 20\ncapacity_lease_ms = 1000\n";

// Host 0 grows an arena in an extent of the pool, writes and publishes prefix blocks there,
// and is killed. Host 1 finds them, resolves them in host 0's extent and reads them under a
// lease. The dead host's extent is quarantined — not lent again — while host 1 still holds
// a lease on a block in it, and returns to the free pool once the block is reclaimed.
TEST(CApiOrchestrator, ExtentArenasShareBlocksAndStayQuarantinedWhileLeased) {
  // Longer TTLs than kTiming: this test polls cxlkvctl between its renewals.
  OrchestratorProcess o("lease_ttl_ms = 2000\nhost_ttl_ms = 2000\nheartbeat_period_ms = 100\n"
                        "grace_ms = 20\ncapacity_lease_ms = 2000\n");
  o.Start();
  const std::string spec = "orchestrator:" + o.socket;
  const uint64_t ns = cxlkv_namespace("t", "m", "l");
  constexpr int kBlocks = 4;
  auto key_of = [&](int i) {
    const uint32_t tok[] = {static_cast<uint32_t>(1000 + i)};
    return cxlkv_prefix_key_chain(ns, nullptr, tok, 1);
  };
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t publisher = fork();
  ASSERT_GE(publisher, 0);
  if (publisher == 0) {
    cxlkv_domain* d = nullptr;
    if (cxlkv_domain_join(spec.c_str(), 0, &d) != CXLKV_OK) _exit(2);
    cxlkv_arena* a = nullptr;
    const cxlkv_arena_options opt = SmallBlocks();
    if (cxlkv_domain_grow(d, &opt, &a) != CXLKV_OK) _exit(3);
    for (int i = 0; i < kBlocks; ++i) {
      cxlkv_block_ref ref;
      void* addr = nullptr;
      if (cxlkv_alloc(a, 0, &ref, &addr) != CXLKV_OK) _exit(4);
      std::memset(addr, 0x30 + i, cxlkv_block_size(a, 0));
      const cxlkv_prefix_key k = key_of(i);
      if (cxlkv_prefix_publish(d, ns, &k, nullptr, a, &ref) != CXLKV_OK) _exit(5);
    }
    for (;;) {  // heartbeats until killed
      (void)cxlkv_domain_heartbeat(d, a, nullptr);
      char b = 1;
      (void)!write(ready[1], &b, 1);
      usleep(20000);
    }
  }
  char b;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  EXPECT_EQ(Extents(o).assigned, 1u);

  cxlkv_domain* d = nullptr;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), 1, &d), CXLKV_OK) << cxlkv_last_error();
  cxlkv_lease leases[kBlocks];
  for (int i = kBlocks - 1; i >= 0; --i) {  // block 0's lease last: it is kept
    const cxlkv_prefix_key k = key_of(i);
    cxlkv_prefix_hit hit;
    ASSERT_TRUE(WaitFor([&] {
      (void)cxlkv_domain_heartbeat(d, nullptr, nullptr);
      return cxlkv_prefix_lookup(d, ns, &k, &hit) == CXLKV_OK &&
             cxlkv_lease_acquire(d, &hit, &leases[i]) == CXLKV_OK;
    })) << "block " << i << ": " << cxlkv_last_error();
    const void* addr = nullptr;
    ASSERT_EQ(cxlkv_domain_resolve(d, &hit.ref, &addr), CXLKV_OK) << cxlkv_last_error();
    // Read through copy-out (invalidate, copy, validate): the resolved address is another
    // host's memory, and a plain load may return a line this host cached earlier.
    std::vector<unsigned char> copy(kBlockBytes);
    ASSERT_EQ(cxlkv_lease_copy_out(d, nullptr, &leases[i], 0, copy.data(), copy.size()), CXLKV_OK)
        << "block " << i << ": " << cxlkv_last_error();
    for (size_t off = 0; off < copy.size(); ++off) {
      ASSERT_EQ(copy[off], 0x30 + i) << "block " << i << " offset " << off;
    }
    // The whole block, and not a byte past it.
    EXPECT_EQ(cxlkv_lease_copy_out(d, nullptr, &leases[i], 0, copy.data(), copy.size() + 1),
              CXLKV_E_INVALID);
    EXPECT_NE(std::string(cxlkv_last_error()).find("of " + std::to_string(kBlockBytes) + " bytes"),
              std::string::npos)
        << cxlkv_last_error();
    const void* in_place = nullptr;
    ASSERT_EQ(cxlkv_block_invalidate(d, nullptr, &leases[i], 0, kBlockBytes, &in_place), CXLKV_OK);
    EXPECT_EQ(in_place, addr);
    EXPECT_EQ(cxlkv_lease_validate(d, &leases[i]), CXLKV_OK) << "the copy counts";
  }
  for (int i = 1; i < kBlocks; ++i) ASSERT_EQ(cxlkv_lease_release(d, &leases[i]), CXLKV_OK);

  kill(publisher, SIGKILL);
  waitpid(publisher, nullptr, 0);
  // Keep the lease while the orchestrator notices the death: renewed by a thread of its own
  // every 100 ms, so a slow cxlkvctl poll (seconds under ASan on a busy machine) does not let
  // it lapse.
  std::atomic<bool> keeping{true};
  std::atomic<int> renew_failures{0};
  std::thread keeper([&] {
    while (keeping.load()) {
      if (cxlkv_lease_renew(d, &leases[0]) != CXLKV_OK) ++renew_failures;
      (void)cxlkv_domain_heartbeat(d, nullptr, nullptr);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const bool quarantined =
      WaitFor([&] { return Extents(o).quarantined == 1; }, std::chrono::milliseconds(30000));
  keeping = false;
  keeper.join();
  EXPECT_EQ(renew_failures.load(), 0) << "the lease lapsed while it was renewed every 100 ms";
  ASSERT_TRUE(quarantined) << "the dead host's extent is quarantined after its capacity lease\n"
                           <<
      [&] {
        std::string out;
        FILE* p =
            popen((std::string(CXLKV_CTL_BIN) + " extents --socket " + o.socket).c_str(), "r");
        char line[512];
        while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) out += line;
        if (p != nullptr) pclose(p);
        return out;
      }();
  // Well past grace and the capacity lease: the leased block still holds the extent.
  for (int t = 0; t < 25; ++t) {
    ASSERT_EQ(cxlkv_lease_renew(d, &leases[0]), CXLKV_OK) << cxlkv_last_error();
    (void)cxlkv_domain_heartbeat(d, nullptr, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(Extents(o).quarantined, 1u) << "lent again while a lease on a block in it is held";
  EXPECT_EQ(cxlkv_lease_validate(d, &leases[0]), CXLKV_E_STALE)
      << "the revoked arena's entry was retired: a copy no longer counts";
  {
    std::vector<unsigned char> copy(4096);
    EXPECT_EQ(cxlkv_lease_copy_out(d, nullptr, &leases[0], 0, copy.data(), copy.size()),
              CXLKV_E_STALE)
        << "copy-out validates: " << cxlkv_last_error();
  }
  ASSERT_EQ(cxlkv_lease_release(d, &leases[0]), CXLKV_OK);
  ASSERT_TRUE(WaitFor([&] {
    (void)cxlkv_domain_heartbeat(d, nullptr, nullptr);
    return Extents(o).quarantined == 0;
  })) << "the extent returns once its blocks are reclaimed";
  const unsigned free_now = Extents(o).free;
  // Host 1 grows into the pool (possibly the same extent): a fresh arena.
  cxlkv_arena* mine = nullptr;
  const cxlkv_arena_options opt = SmallBlocks();
  ASSERT_EQ(cxlkv_domain_grow(d, &opt, &mine), CXLKV_OK) << cxlkv_last_error();
  EXPECT_EQ(Extents(o).free, free_now - 1);
  cxlkv_block_ref ref;
  ASSERT_EQ(cxlkv_alloc(mine, 0, &ref, nullptr), CXLKV_OK);
  ASSERT_EQ(cxlkv_domain_shrink(d, mine), CXLKV_OK) << cxlkv_last_error();
  EXPECT_TRUE(WaitFor([&] { return Extents(o).free == free_now; }))
      << "no published block in it: free again at once";
  cxlkv_domain_leave(d);
}

// The orchestrator stops answering (SIGSTOP) for longer than the capacity lease: the host
// revokes its extent itself before the orchestrator could lend it again. Its arena then
// fails every call with CXLKV_E_REVOKED and its memory no longer reaches the pool.
TEST(CApiOrchestrator, ExtentIsRevokedWhenTheLeaseLapses) {
  OrchestratorProcess o(kTiming);
  o.Start();
  const std::string spec = "orchestrator:" + o.socket;
  cxlkv_domain* d = nullptr;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), 2, &d), CXLKV_OK) << cxlkv_last_error();
  cxlkv_arena* a = nullptr;
  const cxlkv_arena_options opt = SmallBlocks();
  ASSERT_EQ(cxlkv_domain_grow(d, &opt, &a), CXLKV_OK) << cxlkv_last_error();
  cxlkv_block_ref ref;
  void* addr = nullptr;
  ASSERT_EQ(cxlkv_alloc(a, 0, &ref, &addr), CXLKV_OK);
  std::memset(addr, 0x5a, 4096);
  kill(o.pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // > capacity lease (1 s)
  EXPECT_EQ(cxlkv_alloc(a, 0, &ref, nullptr), CXLKV_E_REVOKED) << cxlkv_last_error();
  EXPECT_NE(std::string(cxlkv_last_error()).find("capacity lease lapsed"), std::string::npos)
      << cxlkv_last_error();
  // This process's view is private now: a write here cannot reach the pool.
  std::memset(addr, 0x77, 4096);
  kill(o.pid, SIGCONT);
  FILE* f = std::fopen(o.pool.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<unsigned char> pool_bytes(256u << 20);
  ASSERT_EQ(std::fread(pool_bytes.data(), 1, pool_bytes.size(), f), pool_bytes.size());
  std::fclose(f);
  size_t x77 = 0, x5a = 0;
  for (size_t i = 0; i + 4096 <= pool_bytes.size(); i += 4096) {
    x77 += pool_bytes[i] == 0x77 && pool_bytes[i + 4095] == 0x77;
    x5a += pool_bytes[i] == 0x5a && pool_bytes[i + 4095] == 0x5a;
  }
  EXPECT_EQ(x77, 0u) << "a write after revocation reached the pool";
  EXPECT_EQ(x5a, 1u) << "the write before it did";
  EXPECT_EQ(cxlkv_domain_shrink(d, a), CXLKV_OK) << "closing a revoked arena is fine";
  cxlkv_domain_leave(d);
}

}  // namespace
}  // namespace cxlkv::testing
