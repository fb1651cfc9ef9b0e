// Extents leaving this host (audit #4): every path that gives one away — revocation when the
// capacity lease lapsed, Shrink, leaving the domain, and the C API's shrink / close / leave —
// first stops this process's stores to it, writes back every line of it and fences, and
// only then swaps the mapping or tells the orchestrator. Checked structurally (a
// coherence::CacheObserver sees the flushes and fences; on one machine caches are coherent,
// so the missing write-back would have no visible effect here), against a real
// cxlkv-orchestrator whose answers the probes ask for at the moment of the fence.
//
// Also here, for the same observer: GPU registrations and other users of an arena's memory
// end before the extent leaves (audit #8), the C API's copy-out invalidates what it reads
// (audit #5), and its copy into a block is a streaming copy (a tests/cache_recorder.h
// recorder sees it: this binary is linked with the recorder's --wrap options).
//
// The C API is linked statically here (cxlkv_capi_static): libcxlkv.so carries a hidden copy
// of coherence/ that the test's observer could not see.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache_recorder.h"
#include "cache_trace.h"
#include "capi_internal.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/operator_client.h"
#include "cxlkv/orchestrator/pooled_arenas.h"
#include "cxlkv/pool/arena.h"
#include "gtest/gtest.h"
#include "orchestrator_process.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

namespace co = cxlkv::coherence;
using orchestrator::HostClient;
using orchestrator::OperatorClient;
using orchestrator::PooledArenas;

constexpr char kTiming[] =
    "lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
    "grace_ms = 20\ncapacity_lease_ms = 1000\n";
constexpr std::size_t kExtentBytes = 16u << 20;  // OrchestratorProcess's extent_size
constexpr std::uint32_t kHost = 2;

// ",3,7,": the extents the orchestrator lists as assigned to `host` right now.
std::string AssignedTo(OperatorClient& op, std::uint32_t host) {
  auto ext = op.Extents();
  if (!ext.ok()) return "error: " + std::string(ext.status().message());
  std::string out = ",";
  for (const auto& e : *ext) {
    if (e.state == "assigned" && e.host == host) out += std::to_string(e.index) + ",";
  }
  return out;
}
bool Lists(const std::string& assigned, std::uint32_t extent) {
  return assigned.find("," + std::to_string(extent) + ",") != std::string::npos;
}

// The last page of an extent holds 0x5a: a flush that shows it there covers the extent's
// memory (an alias of it, after the window was swapped for private memory).
void MarkLastPage(std::byte* base) { std::memset(base + kExtentBytes - 4096, 0x5a, 4096); }
bool ShowsLastPage(const void* addr) {
  const auto* p = static_cast<const unsigned char*>(addr) + kExtentBytes - 4096;
  for (int i = 0; i < 4096; ++i) {
    if (p[i] != 0x5a) return false;
  }
  return true;
}

// The first full-extent flush at or after `from` whose probe note is `note`, or -1.
int FindExtentFlush(const std::vector<CacheTrace::Event>& ev, const std::string& note,
                    std::size_t from = 0) {
  for (std::size_t i = from; i < ev.size(); ++i) {
    if (!ev[i].is_mark && ev[i].op == co::CacheOp::kFlush && ev[i].len == kExtentBytes &&
        ev[i].note == note) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

pool::FormatOptions SmallBlocks() {
  pool::FormatOptions o;
  o.layout = pool::KvLayout{2, 2, 128, 2, 64, pool::KvLayoutKind::kContiguous};
  return o;
}

struct Joined {
  std::unique_ptr<HostClient> client;
  std::unique_ptr<OperatorClient> op;
};
Joined Join(const OrchestratorProcess& o) {
  Joined j;
  auto c = HostClient::Connect(o.socket, kHost);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return j;
  j.client = std::move(*c);
  j.client->StartHeartbeats();
  auto op = OperatorClient::Connect(o.socket);
  EXPECT_TRUE(op.ok()) << op.status();
  if (op.ok()) j.op = std::move(*op);
  return j;
}

// Resumes a SIGSTOPped orchestrator however the test ends.
struct Resume {
  pid_t pid;
  ~Resume() { kill(pid, SIGCONT); }
};

// The lease lapses (orchestrator stopped): the watchdog swaps the window for private memory
// while the program may still be writing it, so the write-back goes through a second view of
// the extent's pages; it is fenced before the extent counts as revoked.
TEST(PooledArenasGiveAway, RevokeWritesTheExtentBackBeforeItCountsAsRevoked) {
  OrchestratorProcess o(kTiming);
  o.Start();
  Joined j = Join(o);
  ASSERT_NE(j.client, nullptr);
  PooledArenas pa(*j.client);
  CacheTrace trace(kExtentBytes);
  pa.OnRevoke([&](std::uint32_t e) { trace.Mark("revoked " + std::to_string(e)); });
  auto g = pa.Grow(SmallBlocks());
  ASSERT_TRUE(g.ok()) << g.status();
  std::byte* base = g->arena->region().addr();
  ASSERT_EQ(g->arena->region().size_bytes(), kExtentBytes);
  MarkLastPage(base);
  const std::atomic<bool>* revoked = g->revoked;
  trace.SetProbe([&](co::CacheOp op, const void* addr, std::size_t len) -> std::string {
    if (op == co::CacheOp::kFence) return revoked->load() ? "revoked" : "held";
    if (len != kExtentBytes) return "";
    return ShowsLastPage(addr) ? "extent" : "other memory";
  });
  {
    co::ScopedCacheObserver observe(trace);
    Resume resume{o.pid};
    kill(o.pid, SIGSTOP);
    ASSERT_TRUE(WaitFor([&] { return pa.revocations() == 1; })) << "never revoked";
  }
  const auto ev = trace.events();
  const int flush = FindExtentFlush(ev, "extent");
  ASSERT_GE(flush, 0) << "revocation wrote none of the extent back\n" << CacheTrace::Dump(ev);
  const int fence = CacheTrace::FenceAfter(ev, flush);
  ASSERT_GE(fence, 0) << CacheTrace::Dump(ev);
  EXPECT_EQ(ev[fence].note, "held") << "counted as revoked before the write-back was fenced\n"
                                    << CacheTrace::Dump(ev);
  EXPECT_LT(fence, CacheTrace::FindMark(ev, "revoked " + std::to_string(g->extent)))
      << CacheTrace::Dump(ev);
  EXPECT_EQ(base[kExtentBytes - 1], std::byte{0}) << "the window is private memory now";
}

// Shrink after closing the arena: the close wrote the extent back, and the orchestrator
// still listed it as this host's when the write-back was fenced.
TEST(PooledArenasGiveAway, CloseThenShrinkWritesBackBeforeTheRpc) {
  OrchestratorProcess o(kTiming);
  o.Start();
  Joined j = Join(o);
  ASSERT_NE(j.client, nullptr);
  PooledArenas pa(*j.client);
  auto g = pa.Grow(SmallBlocks());
  ASSERT_TRUE(g.ok()) << g.status();
  const auto base = reinterpret_cast<std::uintptr_t>(g->arena->region().addr());
  MarkLastPage(g->arena->region().addr());
  CacheTrace trace(kExtentBytes);
  trace.SetProbe([&](co::CacheOp op, const void*, std::size_t) -> std::string {
    return op == co::CacheOp::kFence ? AssignedTo(*j.op, kHost) : "";
  });
  {
    co::ScopedCacheObserver observe(trace);
    g->arena.reset();
    trace.Mark("shrink");
    ASSERT_TRUE(pa.Shrink(g->extent).ok());
  }
  const auto ev = trace.events();
  const int flush = CacheTrace::FindFlush(ev, base, kExtentBytes);
  ASSERT_GE(flush, 0) << "the extent went back unwritten\n" << CacheTrace::Dump(ev);
  const int fence = CacheTrace::FenceAfter(ev, flush);
  ASSERT_GE(fence, 0) << CacheTrace::Dump(ev);
  EXPECT_TRUE(Lists(ev[fence].note, g->extent)) << CacheTrace::Dump(ev);
  EXPECT_LT(fence, CacheTrace::FindMark(ev, "shrink"));
  EXPECT_FALSE(Lists(AssignedTo(*j.op, kHost), g->extent)) << "Shrink gave it back";
}

// Destroying PooledArenas (leaving the domain) with an arena still open and a raw extent
// held: the arena's extent is swapped and written back, the raw extent's holder is told to
// stop writing (its revoke callback), both before the host leaves.
TEST(PooledArenasGiveAway, DestroyGivesAwayWhatIsStillHeldBeforeLeaving) {
  OrchestratorProcess o(kTiming);
  o.Start();
  Joined j = Join(o);
  ASSERT_NE(j.client, nullptr);
  auto pa = std::make_unique<PooledArenas>(*j.client);
  CacheTrace trace(kExtentBytes);
  auto g = pa->Grow(SmallBlocks());
  ASSERT_TRUE(g.ok()) << g.status();
  std::byte* base = g->arena->region().addr();
  MarkLastPage(base);
  auto raw = pa->GrowRaw([&](std::uint32_t e) { trace.Mark("raw revoke " + std::to_string(e)); });
  ASSERT_TRUE(raw.ok()) << raw.status();
  trace.SetProbe([&](co::CacheOp op, const void* addr, std::size_t len) -> std::string {
    if (op == co::CacheOp::kFence) return AssignedTo(*j.op, kHost);
    return len == kExtentBytes && ShowsLastPage(addr) ? "extent" : "";
  });
  {
    co::ScopedCacheObserver observe(trace);
    pa.reset();
    trace.Mark("leave");
    ASSERT_TRUE(j.client->Leave().ok());
  }
  const auto ev = trace.events();
  const int flush = FindExtentFlush(ev, "extent");
  ASSERT_GE(flush, 0) << "the open arena's extent was left unwritten\n" << CacheTrace::Dump(ev);
  const int fence = CacheTrace::FenceAfter(ev, flush);
  ASSERT_GE(fence, 0) << CacheTrace::Dump(ev);
  EXPECT_TRUE(Lists(ev[fence].note, g->extent)) << CacheTrace::Dump(ev);
  const int leave = CacheTrace::FindMark(ev, "leave");
  EXPECT_LT(fence, leave) << CacheTrace::Dump(ev);
  const int raw_revoke = CacheTrace::FindMark(ev, "raw revoke " + std::to_string(raw->extent));
  EXPECT_GE(raw_revoke, 0) << "the raw extent's holder was never told\n" << CacheTrace::Dump(ev);
  EXPECT_LT(raw_revoke, leave);
  EXPECT_EQ(base[kExtentBytes - 1], std::byte{0}) << "the open arena's window is private now";
}

// The C API: cxlkv_domain_shrink, cxlkv_arena_close and cxlkv_domain_leave (with an arena
// still open) each write the extent back and fence while the orchestrator still lists it as
// this host's, i.e. before the Shrink / Leave RPC.
TEST(CApiGiveAway, ShrinkCloseAndLeaveWriteBackBeforeTheRpc) {
  OrchestratorProcess o(kTiming);
  o.Start();
  auto opc = OperatorClient::Connect(o.socket);
  ASSERT_TRUE(opc.ok()) << opc.status();
  const std::string spec = "orchestrator:" + o.socket;
  cxlkv_domain* d = nullptr;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), kHost, &d), CXLKV_OK) << cxlkv_last_error();
  cxlkv_arena_options opt{};
  opt.layout = cxlkv_kv_layout{2, 2, 128, 2, 64, 0};
  cxlkv_arena* a[3] = {};
  std::uintptr_t base[3] = {};
  std::uint32_t extent[3] = {};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cxlkv_domain_grow(d, &opt, &a[i]), CXLKV_OK) << cxlkv_last_error();
    cxlkv_block_ref ref;
    void* addr = nullptr;
    ASSERT_EQ(cxlkv_alloc(a[i], 0, &ref, &addr), CXLKV_OK);
    std::memset(addr, 0x30 + i, 4096);
    const pool::Region& r = capi::ArenaOf(a[i]).region();
    ASSERT_EQ(r.size_bytes(), kExtentBytes);
    base[i] = reinterpret_cast<std::uintptr_t>(r.addr());
    extent[i] = a[i]->extent;
  }
  CacheTrace trace(kExtentBytes);
  trace.SetProbe([&](co::CacheOp op, const void*, std::size_t) -> std::string {
    return op == co::CacheOp::kFence ? AssignedTo(**opc, kHost) : "";
  });
  {
    co::ScopedCacheObserver observe(trace);
    trace.Mark("shrink");
    EXPECT_EQ(cxlkv_domain_shrink(d, a[0]), CXLKV_OK) << cxlkv_last_error();
    trace.Mark("close");
    cxlkv_arena_close(a[1]);
    trace.Mark("leave");
    cxlkv_domain_leave(d);
    trace.Mark("end");
  }
  const auto ev = trace.events();
  const char* const step[] = {"shrink", "close", "leave", "end"};
  for (int i = 0; i < 3; ++i) {
    const int from = CacheTrace::FindMark(ev, step[i]);
    const int to = CacheTrace::FindMark(ev, step[i + 1]);
    const int flush =
        CacheTrace::FindFlush(ev, base[i], kExtentBytes, static_cast<std::size_t>(from));
    ASSERT_TRUE(flush >= 0 && flush < to) << step[i] << ": the extent went back unwritten\n"
                                          << CacheTrace::Dump(ev);
    const int fence = CacheTrace::FenceAfter(ev, flush);
    ASSERT_TRUE(fence >= 0 && fence < to) << step[i] << "\n" << CacheTrace::Dump(ev);
    EXPECT_TRUE(Lists(ev[fence].note, extent[i]))
        << step[i] << ": the orchestrator had it back before the write-back was fenced\n"
        << CacheTrace::Dump(ev);
  }
  const std::string after = AssignedTo(**opc, kHost);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(Lists(after, extent[i])) << after;
}

// Audit #8: a GPU registration pins the arena's pages, which stay DMA targets whatever
// happens to the mapping. Every use of an arena's memory that bypasses the page tables is
// recorded with the function that ends it (gpu.cc records each cxlkv_gpu_register this way,
// ending it with Drain + Unregister); those run before the extent leaves — revoked, shrunk,
// or the arena closed — while the window still maps the extent, ahead of the write-back and
// the RPC. (No GPU here: the users below stand in for the registrations, through the same
// record.)
TEST(CApiGiveAway, MemoryUsersEndBeforeTheExtentLeaves) {
  OrchestratorProcess o(kTiming);
  o.Start();
  auto opc = OperatorClient::Connect(o.socket);
  ASSERT_TRUE(opc.ok()) << opc.status();
  const std::string spec = "orchestrator:" + o.socket;
  cxlkv_domain* d = nullptr;
  ASSERT_EQ(cxlkv_domain_join(spec.c_str(), kHost, &d), CXLKV_OK) << cxlkv_last_error();
  cxlkv_arena_options opt{};
  opt.layout = cxlkv_kv_layout{2, 2, 128, 2, 64, 0};
  CacheTrace trace(kExtentBytes);
  const int owner = 0;  // any address names the owner of the uses
  std::atomic<bool> stopped{false};
  struct Grown {
    cxlkv_arena* arena = nullptr;
    unsigned char* block = nullptr;
    std::uint32_t extent = 0;
  } g[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cxlkv_domain_grow(d, &opt, &g[i].arena), CXLKV_OK) << cxlkv_last_error();
    cxlkv_block_ref ref;
    void* addr = nullptr;
    ASSERT_EQ(cxlkv_alloc(g[i].arena, 0, &ref, &addr), CXLKV_OK);
    g[i].block = static_cast<unsigned char*>(addr);
    std::memset(g[i].block, 0x40 + i, 4096);
    g[i].extent = g[i].arena->extent;
    MarkLastPage(capi::ArenaOf(g[i].arena).region().addr());
    const unsigned char* block = g[i].block;
    const int value = 0x40 + i;
    const std::uint32_t extent = g[i].extent;
    capi::AddMemoryUser(
        g[i].arena, &owner, static_cast<std::uint64_t>(i + 1), [&, block, value, extent] {
          // Still the extent's memory, and still this host's.
          const bool mapped = block[0] == value && block[4095] == value;
          std::string where = " (orchestrator stopped)";  // asking it would wait for its deadline
          if (!stopped.load())
            where = Lists(AssignedTo(**opc, kHost), extent) ? " held" : " returned";
          trace.Mark("drop " + std::to_string(extent) + (mapped ? " mapped" : " swapped") + where);
        });
  }
  // A use removed before the give-away never runs.
  capi::AddMemoryUser(g[0].arena, &owner, 99, [&] { trace.Mark("removed user ran"); });
  capi::RemoveMemoryUser(&owner, 99);
  trace.SetProbe([&](co::CacheOp op, const void* addr, std::size_t len) -> std::string {
    if (op == co::CacheOp::kFence || len != kExtentBytes) return "";
    return ShowsLastPage(addr) ? "extent" : "";
  });
  {
    co::ScopedCacheObserver observe(trace);
    // Shrink: the use ends, then the write-back, then the RPC.
    trace.Mark("shrink");
    EXPECT_EQ(cxlkv_domain_shrink(d, g[0].arena), CXLKV_OK) << cxlkv_last_error();
    trace.Mark("shrunk");
    // Revocation (orchestrator stopped past the lease): the use ends before the swap.
    Resume resume{o.pid};
    stopped = true;
    kill(o.pid, SIGSTOP);
    cxlkv_block_ref ref;
    ASSERT_TRUE(WaitFor([&] {
      return cxlkv_alloc(g[1].arena, 0, &ref, nullptr) == CXLKV_E_REVOKED;
    })) << "never revoked";
    trace.Mark("revoked");
  }
  const auto ev = trace.events();
  EXPECT_EQ(CacheTrace::FindMark(ev, "removed user ran"), -1) << CacheTrace::Dump(ev);
  const std::string shrink_drop = "drop " + std::to_string(g[0].extent) + " mapped held";
  const int d0 = CacheTrace::FindMark(ev, shrink_drop);
  ASSERT_GE(d0, 0) << "shrink: the use did not end while the extent was still there\n"
                   << CacheTrace::Dump(ev);
  EXPECT_GT(d0, CacheTrace::FindMark(ev, "shrink"));
  const int flush0 = CacheTrace::FindFlush(ev, reinterpret_cast<std::uintptr_t>(g[0].block), 4096);
  ASSERT_GE(flush0, 0) << CacheTrace::Dump(ev);
  EXPECT_LT(d0, flush0) << "the use outlived the write-back\n" << CacheTrace::Dump(ev);
  EXPECT_LT(flush0, CacheTrace::FindMark(ev, "shrunk"));
  const int d1 = CacheTrace::FindMark(
      ev, "drop " + std::to_string(g[1].extent) + " mapped (orchestrator stopped)");
  ASSERT_GE(d1, 0) << "revocation: the use did not end before the window was swapped\n"
                   << CacheTrace::Dump(ev);
  const int flush1 = FindExtentFlush(ev, "extent", static_cast<std::size_t>(d1));
  EXPECT_GE(flush1, 0) << CacheTrace::Dump(ev);
  EXPECT_LT(flush1, CacheTrace::FindMark(ev, "revoked"));
  // Gone from the record: closing the revoked arena runs nothing more.
  cxlkv_domain_leave(d);
  EXPECT_EQ(trace.events().size(), ev.size());
}

// Audit #5 (here because it needs the observer inside the C API): cxlkv_lease_copy_out
// invalidates exactly the block range it reads before the copy, then re-reads the index entry
// (an invalidation of it) after the copy; cxlkv_block_invalidate invalidates the range it
// hands out. A plain domain: no orchestrator needed.
TEST(CApiCopyOut, InvalidatesTheRangeThenCopiesThenValidates) {
  ShmPath dom("copyout-domain");
  cxlkv_domain_geometry geo{};
  geo.max_hosts = 2;
  geo.index_entries = 64;
  const std::uint64_t bytes = (cxlkv_domain_bytes(&geo) + 4095) / 4096 * 4096;
  ASSERT_EQ(cxlkv_domain_format((dom.spec(std::to_string(bytes))).c_str(), &geo), CXLKV_OK)
      << cxlkv_last_error();
  cxlkv_owner* owner = nullptr;
  cxlkv_domain *pub = nullptr, *reader = nullptr;
  ASSERT_EQ(cxlkv_owner_open(dom.spec().c_str(), &owner), CXLKV_OK) << cxlkv_last_error();
  ASSERT_EQ(cxlkv_domain_join(dom.spec().c_str(), 0, &pub), CXLKV_OK) << cxlkv_last_error();
  ASSERT_EQ(cxlkv_domain_join(dom.spec().c_str(), 1, &reader), CXLKV_OK) << cxlkv_last_error();
  cxlkv_pool* pool = nullptr;
  ASSERT_EQ(cxlkv_pool_open("memfd:copyout?size=16M", &pool), CXLKV_OK);
  cxlkv_arena_options opt{};
  opt.layout = cxlkv_kv_layout{2, 2, 64, 2, 16, 0};  // 16 KiB blocks
  cxlkv_arena* arena = nullptr;
  ASSERT_EQ(cxlkv_arena_create(pool, &opt, &arena), CXLKV_OK) << cxlkv_last_error();
  constexpr std::size_t kBlock = 16384;
  std::vector<unsigned char> src(kBlock), dst(kBlock, 0);
  for (std::size_t i = 0; i < kBlock; ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  cxlkv_block_ref ref;
  void* block = nullptr;
  ASSERT_EQ(cxlkv_alloc(arena, 0, &ref, &block), CXLKV_OK);
  cxlkv_copy_to_block(block, src.data(), kBlock);
  const std::uint64_t ns = cxlkv_namespace("t", "m", "l");
  const std::uint32_t tok[] = {1, 2, 3};
  const cxlkv_prefix_key key = cxlkv_prefix_key_chain(ns, nullptr, tok, 3);
  ASSERT_EQ(cxlkv_prefix_publish(pub, ns, &key, nullptr, arena, &ref), CXLKV_OK);
  cxlkv_owner_step(owner);
  ASSERT_EQ(cxlkv_domain_heartbeat(reader, nullptr, nullptr), CXLKV_OK);
  cxlkv_prefix_hit hit;
  ASSERT_EQ(cxlkv_prefix_lookup(reader, ns, &key, &hit), CXLKV_OK);
  cxlkv_lease lease;
  ASSERT_EQ(cxlkv_lease_acquire(reader, &hit, &lease), CXLKV_OK) << cxlkv_last_error();

  const auto lo = reinterpret_cast<std::uintptr_t>(block);
  CacheTrace trace(64);
  trace.SetProbe([&](co::CacheOp op, const void*, std::size_t) -> std::string {
    if (op == co::CacheOp::kFence) return "";
    return std::memcmp(dst.data(), src.data(), kBlock) == 0 ? "copied" : "not copied";
  });
  {
    co::ScopedCacheObserver observe(trace);
    ASSERT_EQ(cxlkv_lease_copy_out(reader, arena, &lease, 0, dst.data(), kBlock), CXLKV_OK)
        << cxlkv_last_error();
    trace.Mark("copied out");
    const void* in_place = nullptr;
    ASSERT_EQ(cxlkv_block_invalidate(reader, arena, &lease, 4096, 100, &in_place), CXLKV_OK);
    EXPECT_EQ(in_place, static_cast<const std::byte*>(block) + 4096);
    trace.Mark("invalidated");
  }
  EXPECT_EQ(dst, src);
  const auto ev = trace.events();
  int inv = -1;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (!ev[i].is_mark && ev[i].op == co::CacheOp::kInvalidate && ev[i].addr == lo &&
        ev[i].len == kBlock) {
      inv = static_cast<int>(i);
      break;
    }
  }
  ASSERT_GE(inv, 0) << "the block was read without invalidating it\n" << CacheTrace::Dump(ev);
  EXPECT_EQ(ev[inv].note, "not copied") << CacheTrace::Dump(ev);
  int validate = -1;
  for (std::size_t i = static_cast<std::size_t>(inv) + 1; i < ev.size(); ++i) {
    if (!ev[i].is_mark && ev[i].op == co::CacheOp::kInvalidate && ev[i].note == "copied") {
      validate = static_cast<int>(i);
      break;
    }
  }
  EXPECT_GE(validate, 0) << "no index entry read after the copy\n" << CacheTrace::Dump(ev);
  EXPECT_LT(validate, CacheTrace::FindMark(ev, "copied out"));
  const int zero_copy = [&] {
    for (std::size_t i = static_cast<std::size_t>(CacheTrace::FindMark(ev, "copied out"));
         i < ev.size(); ++i) {
      if (!ev[i].is_mark && ev[i].op == co::CacheOp::kInvalidate && ev[i].addr == lo + 4096 &&
          ev[i].len == 100) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }();
  EXPECT_GE(zero_copy, 0) << CacheTrace::Dump(ev);
  EXPECT_LT(zero_copy, CacheTrace::FindMark(ev, "invalidated"));
  ASSERT_EQ(cxlkv_lease_release(reader, &lease), CXLKV_OK);
  cxlkv_domain_leave(pub);
  cxlkv_domain_leave(reader);
  cxlkv_owner_close(owner);
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);
}

// cxlkv_copy_to_block fills a block for other hosts: streaming stores over exactly the block's
// range (they bypass this host's cache and are fenced on return), not cached stores that
// would stay here until evicted. On coherent memory only the recorder can tell.
TEST(CApiCopyToBlock, IsOneStreamingCopyOfExactlyTheRange) {
  std::vector<unsigned char> block(4096 + 64), src(4000);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 3 + 1);
  void* const at = block.data() + 64;
  std::vector<CacheCall> calls;
  {
    CacheRecorder rec;
    cxlkv_copy_to_block(at, src.data(), src.size());
    calls = rec.Take();
  }
  EXPECT_EQ(calls, (std::vector<CacheCall>{{CacheOp::kCopyNt, at, src.size()}}));
  EXPECT_EQ(std::memcmp(at, src.data(), src.size()), 0);
}

}  // namespace
}  // namespace cxlkv::testing
