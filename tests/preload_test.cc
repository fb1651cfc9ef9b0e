// Unit tests of the preload shim's parts that need no LD_PRELOAD: settings, policy and
// ownership, the mmap table, the pointer set, statistics, and the CXL heap itself (memfd and
// file pools, in this process).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cache_trace.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/preload/cxl_heap.h"
#include "cxlkv/preload/mapping_table.h"
#include "cxlkv/preload/pointer_set.h"
#include "cxlkv/preload/policy.h"
#include "cxlkv/preload/settings.h"
#include "cxlkv/preload/stats.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::preload {
namespace {

// ---- settings ---------------------------------------------------------------------------------

Settings Load(std::vector<std::string> env, std::vector<std::string>* errors) {
  std::vector<const char*> envp;
  for (const auto& e : env) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  return LoadSettings(envp.data(), errors);
}

TEST(Settings, DefaultsWithoutEnvironment) {
  std::vector<std::string> errors;
  Settings s = Load({"HOME=/root", "PATH=/bin"}, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(s.pool.empty());
  EXPECT_EQ(s.min_bytes, kDefaultMinBytes);
  EXPECT_EQ(s.log_level, LogLevel::kWarn);
  EXPECT_TRUE(s.stats_path.empty());
}

// Other cxlkv tools' variables are theirs; a near miss of one of the shim's keys is an error.
TEST(Settings, OnlyNearMissesOfOurKeysAreErrors) {
  std::vector<std::string> errors;
  Settings s = Load({"CXLKV_POOL=memfd:?size=64M", "CXLKV_SEED=7", "CXLKV_ORCHESTRATOR_SOCKET=/x",
                     "CXLKV_BIN=/cxlkv/bin"},
                    &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(s.pool, "memfd:?size=64M");
  for (const char* typo : {"CXLKV_MIN_BYTE=4K", "CXLKV_MINBYTES=4K", "CXLKV_POLL=memfd:?size=1M",
                           "CXLKV_STAT=/tmp/s", "CXLKV_PRELOAD_THRESHOLD=1"}) {
    errors.clear();
    s = Load({"CXLKV_POOL=memfd:?size=64M", typo}, &errors);
    ASSERT_EQ(errors.size(), 1u) << typo;
    EXPECT_NE(errors[0].find("unknown setting"), std::string::npos) << errors[0];
    EXPECT_TRUE(s.pool.empty()) << typo << ": a bad setting turns the shim to pass-through";
  }
}

TEST(Settings, EnvironmentKeys) {
  std::vector<std::string> errors;
  Settings s = Load({"CXLKV_POOL=memfd:?size=64M", "CXLKV_MIN_BYTES=4K",
                     "CXLKV_LOG=debug,/tmp/x.%p.log", "CXLKV_STATS=/tmp/s.json"},
                    &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(s.pool, "memfd:?size=64M");
  EXPECT_EQ(s.min_bytes, 4096u);
  EXPECT_EQ(s.log_level, LogLevel::kDebug);
  EXPECT_EQ(s.log_path, "/tmp/x.%p.log");
  EXPECT_EQ(s.stats_path, "/tmp/s.json");
  EXPECT_EQ(ExpandPid("/tmp/x.%p.log", 42), "/tmp/x.42.log");
  EXPECT_EQ(ExpandPid("/tmp/%%p%", 7), "/tmp/%7%");
}

TEST(Settings, UnknownKeysAndBadValuesAreErrorsAndDisableThePool) {
  std::vector<std::string> errors;
  Settings s = Load({"CXLKV_POOL=memfd:?size=64M", "CXLKV_MINBYTES=4K"}, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("CXLKV_MINBYTES"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("CXLKV_MIN_BYTES"), std::string::npos) << errors[0];  // the fix
  EXPECT_TRUE(s.pool.empty());

  errors.clear();
  s = Load({"CXLKV_POOL=nvme:/dev/nvme0", "CXLKV_MIN_BYTES=12Q", "CXLKV_LOG=loud"}, &errors);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_NE(errors[0].find("CXLKV_POOL"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("min_bytes '12Q'"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("off, error, warn, info or debug"), std::string::npos) << errors[2];
}

TEST(Settings, ConfigFileWithEnvironmentOverride) {
  testing::ShmPath f("cfg");
  {
    std::ofstream out(f.path());
    out << "# cxlkv preload\npool = file:/dev/shm/kv?size=1G\nmin_bytes = 64K  # large only\n"
           "log = info\n\nstats=/tmp/st.json\n";
  }
  std::vector<std::string> errors;
  Settings s = Load({"CXLKV_CONFIG=" + f.path(), "CXLKV_MIN_BYTES=1M"}, &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(s.pool, "file:/dev/shm/kv?size=1G");
  EXPECT_EQ(s.min_bytes, 1u << 20);  // the environment wins
  EXPECT_EQ(s.log_level, LogLevel::kInfo);
  EXPECT_EQ(s.stats_path, "/tmp/st.json");
  EXPECT_EQ(s.config_path, f.path());

  {
    std::ofstream out(f.path());
    out << "pool = memfd:?size=1G\nminbytes = 1\njust text\n";
  }
  errors.clear();
  s = Load({"CXLKV_CONFIG=" + f.path()}, &errors);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find(f.path() + ":2: unknown key 'minbytes'"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find(":3: 'just text' is not 'key = value'"), std::string::npos) << errors[1];
  EXPECT_TRUE(s.pool.empty());

  errors.clear();
  s = Load({"CXLKV_CONFIG=/nonexistent/cxlkv.conf"}, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("/nonexistent/cxlkv.conf: cannot open"), std::string::npos);
}

// ---- policy and ownership ---------------------------------------------------------------------

TEST(Policy, Decide) {
  constexpr std::uint64_t kMin = 1024;
  EXPECT_EQ(Decide(AllocClass::kMalloc, 1023, kMin, true, false), Route::kPass);
  EXPECT_EQ(Decide(AllocClass::kMalloc, 1024, kMin, true, false), Route::kCxl);
  EXPECT_EQ(Decide(AllocClass::kMmap, 1 << 20, kMin, true, false), Route::kCxl);
  EXPECT_EQ(Decide(AllocClass::kCuda, 1, kMin, true, false), Route::kCxl);  // always
  EXPECT_EQ(Decide(AllocClass::kCuda, 1 << 30, kMin, false, false), Route::kPass);
  EXPECT_EQ(Decide(AllocClass::kMalloc, 1 << 30, kMin, true, true), Route::kPass);  // guard
  EXPECT_EQ(Decide(AllocClass::kMalloc, 0, 0, true, false), Route::kCxl);
  static_assert(Decide(AllocClass::kMalloc, 5, ~0ull, true, false) == Route::kPass);
}

TEST(Policy, MmapEligibility) {
  constexpr int kRw = PROT_READ | PROT_WRITE;
  constexpr int kAnon = MAP_PRIVATE | MAP_ANONYMOUS;
  EXPECT_TRUE(MmapEligible(nullptr, kRw, kAnon, -1, 0));
  EXPECT_TRUE(MmapEligible(nullptr, kRw, kAnon | MAP_NORESERVE | MAP_POPULATE, -1, 0));
  EXPECT_FALSE(MmapEligible(reinterpret_cast<void*>(0x1000000), kRw, kAnon, -1, 0));  // hint
  EXPECT_FALSE(MmapEligible(nullptr, PROT_READ, kAnon, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw | PROT_EXEC, kAnon, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, MAP_SHARED_VALIDATE | MAP_ANONYMOUS, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, kAnon | MAP_FIXED, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, kAnon | MAP_STACK, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, kAnon | MAP_HUGETLB, -1, 0));
  EXPECT_FALSE(MmapEligible(nullptr, kRw, MAP_PRIVATE, 3, 0));  // a file
}

TEST(Policy, OwnershipByAddressRange) {
  alignas(16) static char boot[256];
  const AddressRange b{reinterpret_cast<std::uintptr_t>(boot), sizeof(boot)};
  // The heap's range: reserved for real (PROT_NONE), so no other allocation — the malloc
  // below included — can land in it. (A fixed 0x7f0000000000 did, under ASLR, in one CI run.)
  void* reserved = ::mmap(nullptr, 1ull << 30, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(reserved);
  const AddressRange cxl{base, 1ull << 30};
  EXPECT_EQ(OwnerOf(nullptr, b, cxl), Owner::kNull);
  EXPECT_EQ(OwnerOf(boot + 17, b, cxl), Owner::kBootstrap);
  EXPECT_EQ(OwnerOf(boot + sizeof(boot), b, cxl), Owner::kProcess);  // one past the end
  EXPECT_EQ(OwnerOf(reinterpret_cast<void*>(base), b, cxl), Owner::kCxl);
  EXPECT_EQ(OwnerOf(reinterpret_cast<void*>(base + (1ull << 30) - 1), b, cxl), Owner::kCxl);
  EXPECT_EQ(OwnerOf(reinterpret_cast<void*>(base + (1ull << 30)), b, cxl), Owner::kProcess);
  EXPECT_EQ(OwnerOf(reinterpret_cast<void*>(base - 1), b, cxl), Owner::kProcess);
  // An empty range (no heap) owns nothing, not even address 0 + x.
  EXPECT_EQ(OwnerOf(reinterpret_cast<void*>(8), b, AddressRange{}), Owner::kProcess);
  // Memory from another allocator (the process's own, before the shim) is the process's.
  void* p = std::malloc(32);
  EXPECT_EQ(OwnerOf(p, b, cxl), Owner::kProcess);
  std::free(p);
  ::munmap(reserved, 1ull << 30);
}

TEST(Policy, ReallocAcrossTheThresholdBothWays) {
  EXPECT_EQ(PlanRealloc(Owner::kNull, 10, Route::kPass), ReallocPlan::kMalloc);
  EXPECT_EQ(PlanRealloc(Owner::kCxl, 0, Route::kPass), ReallocPlan::kFree);
  EXPECT_EQ(PlanRealloc(Owner::kProcess, 0, Route::kPass), ReallocPlan::kFree);
  EXPECT_EQ(PlanRealloc(Owner::kCxl, 1 << 20, Route::kCxl), ReallocPlan::kResizeCxl);
  EXPECT_EQ(PlanRealloc(Owner::kCxl, 16, Route::kPass), ReallocPlan::kCxlToPass);
  EXPECT_EQ(PlanRealloc(Owner::kProcess, 1 << 20, Route::kCxl), ReallocPlan::kPassToCxl);
  EXPECT_EQ(PlanRealloc(Owner::kProcess, 16, Route::kPass), ReallocPlan::kResizePass);
  EXPECT_EQ(PlanRealloc(Owner::kBootstrap, 16, Route::kPass), ReallocPlan::kFromBootstrap);
  EXPECT_EQ(PlanRealloc(Owner::kBootstrap, 1 << 20, Route::kCxl), ReallocPlan::kFromBootstrap);
}

TEST(Policy, SizeBuckets) {
  EXPECT_EQ(SizeBucket(0), 0);
  EXPECT_EQ(SizeBucket(64), 0);
  EXPECT_EQ(SizeBucket(65), 1);
  EXPECT_EQ(SizeBucket(1024), 1);
  EXPECT_EQ(SizeBucket(65536), 2);
  EXPECT_EQ(SizeBucket(65537), 3);
  EXPECT_EQ(SizeBucket(1 << 20), 3);
  EXPECT_EQ(SizeBucket((1 << 20) + 1), 4);
}

// ---- the mmap table ---------------------------------------------------------------------------

TEST(MappingTable, TrimHeadTailHoleAndRelease) {
  MappingTable<8> t;
  constexpr std::uintptr_t kBase = 0x100000, kBytes = 0x10000;
  ASSERT_TRUE(t.Insert(kBase, kBytes));
  ASSERT_TRUE(t.Insert(0x300000, 0x1000));
  ASSERT_TRUE(t.Insert(0x200000, 0x1000));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.FindContaining(kBase - 1), nullptr);
  ASSERT_NE(t.FindContaining(kBase + kBytes - 1), nullptr);
  EXPECT_EQ(t.FindContaining(kBase + kBytes), nullptr);
  EXPECT_EQ(t.FindContaining(0x200800)->base, 0x200000u);
  EXPECT_EQ(t.FirstOverlap(0x1f0000, 0x200001)->base, 0x200000u);
  EXPECT_EQ(t.FirstOverlap(0x1f0000, 0x200000), nullptr);

  Mapping* m = t.FindContaining(kBase);
  // The trim idiom: drop the head, then the tail; then a hole; then the rest.
  UnmapEffect e = ApplyUnmap(*m, kBase - 0x1000, 0x3000);
  EXPECT_FALSE(e.release);
  EXPECT_EQ(e.hole_lo, kBase);
  EXPECT_EQ(e.hole_hi, kBase + 0x2000);
  EXPECT_EQ(m->live_lo, kBase + 0x2000);
  e = ApplyUnmap(*m, kBase + 0xe000, 0x4000);
  EXPECT_EQ(m->live_hi, kBase + 0xe000);
  EXPECT_EQ(e.hole_hi, kBase + kBytes);
  e = ApplyUnmap(*m, kBase + 0x5000, 0x1000);  // a hole in the middle: live part unchanged
  EXPECT_FALSE(e.release);
  EXPECT_EQ(m->live_lo, kBase + 0x2000);
  EXPECT_EQ(m->live_hi, kBase + 0xe000);
  e = ApplyUnmap(*m, kBase + 0x2000, 0xc000);
  EXPECT_TRUE(e.release);
  t.Erase(m);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.FindContaining(kBase), nullptr);

  MappingTable<1> full;
  EXPECT_TRUE(full.Insert(1 << 20, 4096));
  EXPECT_FALSE(full.Insert(2 << 20, 4096));
}

TEST(PointerSet, InsertContainsEraseAndCapacity) {
  auto set = std::make_unique<PointerSet<64>>();
  std::vector<std::unique_ptr<int>> owned;
  for (int i = 0; i < 48; ++i) {
    owned.push_back(std::make_unique<int>(i));
    ASSERT_TRUE(set->Insert(owned.back().get())) << i;
  }
  int other = 0;
  EXPECT_FALSE(set->Insert(&other));  // 3/4 full
  EXPECT_FALSE(set->Contains(&other));
  for (auto& p : owned) EXPECT_TRUE(set->Contains(p.get()));
  for (int i = 0; i < 48; i += 2) EXPECT_TRUE(set->Erase(owned[i].get()));
  for (int i = 0; i < 48; ++i) EXPECT_EQ(set->Contains(owned[i].get()), i % 2 == 1);
  EXPECT_FALSE(set->Erase(&other));
  EXPECT_TRUE(set->Insert(&other));  // tombstones are reused
  EXPECT_TRUE(set->Contains(&other));
  EXPECT_FALSE(set->Contains(nullptr));
}

// ---- statistics --------------------------------------------------------------------------------

TEST(Stats, ThreadsFoldIntoTheSnapshotAndJson) {
  StatsRegistry reg;
  static ThreadStats a{}, b{};
  reg.Link(&a);
  reg.Link(&b);
  a.CountAlloc(AllocClass::kMalloc, Route::kCxl, 100);
  a.CountAlloc(AllocClass::kMalloc, Route::kPass, 10);
  b.CountAlloc(AllocClass::kCuda, Route::kCxl, 5 << 20);
  b.CountFree(AllocClass::kCuda, Route::kCxl);
  reg.Retire(&a);                                     // a thread exits: its counts stay
  a.CountAlloc(AllocClass::kMalloc, Route::kCxl, 1);  // not linked any more: not counted
  reg.fallbacks = 3;
  StatsSnapshot s = reg.Snapshot();
  EXPECT_EQ(s.allocs[0][1], 1u);
  EXPECT_EQ(s.bytes[0][1], 100u);
  EXPECT_EQ(s.allocs[0][0], 1u);
  EXPECT_EQ(s.allocs[1][1], 1u);
  EXPECT_EQ(s.frees[1][1], 1u);
  EXPECT_EQ(s.by_size[1][4], 1u);  // 5 MiB
  EXPECT_EQ(s.by_size[1][1], 1u);  // 100 B
  EXPECT_EQ(s.fallbacks, 3u);
  StatsContext ctx{7, "memfd:?size=1G", "cxl", "heap \"x\"", 64, 1 << 20};
  const std::string j = RenderStatsJson(s, ctx);
  EXPECT_NE(j.find("\"cuda_host\": {\"pass\": {\"allocs\": 0, \"bytes\": 0, \"frees\": 0}, "
                   "\"cxl\": {\"allocs\": 1, \"bytes\": 5242880, \"frees\": 1}}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"detail\": \"heap \\\"x\\\"\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"fallbacks\": 3"), std::string::npos) << j;
  reg.Retire(&b);
}

// ---- the CXL heap, in this process
// ---------------------------------------------------------------

std::unique_ptr<CxlHeap> MustOpenHeap(const std::string& spec) {
  auto parsed = pool::ParseSourceSpec(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto h = CxlHeap::Open(*parsed);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

TEST(CxlHeap, AllocationsLiveInThePoolRange) {
  auto h = MustOpenHeap("memfd:?size=64M");
  ASSERT_NE(h, nullptr);
  const AddressRange r = h->range();
  ASSERT_GT(r.bytes, 32u << 20);
  std::set<void*> seen;
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4096},
                        std::size_t{100000}, std::size_t{3} << 20}) {
    void* p = h->Alloc(n, 0, false);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_TRUE(r.Contains(p));
    EXPECT_TRUE(h->Owns(p));
    EXPECT_TRUE(seen.insert(p).second) << "not unique: " << p;  // malloc(0) included
    EXPECT_GE(h->UsableSize(p), n);
    std::memset(p, 0xab, n);
    live.emplace_back(p, n);
  }
  void* z = h->Alloc(1 << 16, 0, true);
  ASSERT_NE(z, nullptr);
  for (int i = 0; i < (1 << 16); ++i) ASSERT_EQ(static_cast<unsigned char*>(z)[i], 0) << i;
  void* a = h->Alloc(1000, 1 << 16, false);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % (1 << 16), 0u);
  // Realloc keeps the contents.
  auto* q = static_cast<unsigned char*>(h->Realloc(live[3].first, 1 << 20));
  ASSERT_NE(q, nullptr);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(q[i], 0xab);
  live[3].first = q;
  int on_stack = 0;
  EXPECT_FALSE(h->Owns(&on_stack));
  void* m = std::malloc(64);
  EXPECT_FALSE(h->Owns(m));
  std::free(m);
  for (auto& [p, n] : live) h->Free(p);
  h->Free(z);
  h->Free(a);
  EXPECT_GT(h->held_bytes(), 0u);
  EXPECT_NE(h->Describe().find("jemalloc arena"), std::string::npos) << h->Describe();
}

TEST(CxlHeap, FullPoolReturnsNullAndKeepsWorking) {
  auto h = MustOpenHeap("memfd:?size=8M");
  ASSERT_NE(h, nullptr);
  std::vector<void*> got;
  for (int i = 0; i < 100; ++i) {
    void* p = h->Alloc(1 << 20, 0, false);
    if (p == nullptr) break;
    got.push_back(p);
  }
  EXPECT_GT(got.size(), 0u);
  EXPECT_LT(got.size(), 8u);  // metadata and the arena's own pages take some
  EXPECT_EQ(h->Alloc(64u << 20, 0, false), nullptr);
  EXPECT_NE(h->Alloc(32, 0, false), nullptr);  // small blocks still fit in a run
  for (void* p : got) h->Free(p);
  EXPECT_NE(h->Alloc(1 << 20, 0, false), nullptr);  // freed memory is reused
}

TEST(CxlHeap, ProcessesShareAFilePoolWithoutOverlap) {
  testing::ShmPath path("preload-heap");
  auto h1 = MustOpenHeap(path.spec("32M"));
  ASSERT_NE(h1, nullptr);
  void* p1 = h1->Alloc(4 << 20, 0, false);
  ASSERT_NE(p1, nullptr);
  std::memset(p1, 0x11, 4 << 20);
  const auto off1 =
      static_cast<std::uintptr_t>(static_cast<char*>(p1) - reinterpret_cast<char*>(h1->range().lo));
  // A second process opens the same (now formatted) pool and gets different blocks.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    auto parsed = pool::ParseSourceSpec(path.spec());
    auto h2 = CxlHeap::Open(*parsed);
    std::uintptr_t off2 = ~0ull;
    if (h2.ok()) {
      void* p2 = (*h2)->Alloc(4 << 20, 0, false);
      if (p2 != nullptr) {
        std::memset(p2, 0x22, 4 << 20);
        off2 = static_cast<std::uintptr_t>(static_cast<char*>(p2) -
                                           reinterpret_cast<char*>((*h2)->range().lo));
      }
    }
    (void)!::write(fds[1], &off2, sizeof(off2));
    ::_exit(0);
  }
  ::close(fds[1]);
  std::uintptr_t off2 = 0;
  ASSERT_EQ(::read(fds[0], &off2, sizeof(off2)), static_cast<ssize_t>(sizeof(off2)));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_NE(off2, ~0ull) << "the second process could not allocate from the shared pool";
  EXPECT_TRUE(off2 + (4 << 20) <= off1 || off1 + (4 << 20) <= off2) << off1 << " " << off2;
  for (int i = 0; i < (4 << 20); i += 4096) {
    ASSERT_EQ(static_cast<unsigned char*>(p1)[i], 0x11) << "the other process wrote our block";
  }
  h1->Free(p1);
}

TEST(CxlHeap, ForeignDataIsNotFormatted) {
  testing::ShmPath path("preload-foreign");
  {
    std::ofstream out(path.path());
    std::string junk(1 << 20, 'x');
    out << junk;
  }
  auto parsed = pool::ParseSourceSpec(path.spec());
  auto h = CxlHeap::Open(*parsed);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("formats only a blank pool"), std::string::npos)
      << h.status();
  std::ifstream in(path.path());
  std::string first(8, '\0');
  in.read(first.data(), 8);
  EXPECT_EQ(first, "xxxxxxxx");  // untouched
}

TEST(CxlHeap, KmemWithoutADaxKmemNodeIsAClearError) {
  auto parsed = pool::ParseSourceSpec("kmem:node=0");
  ASSERT_TRUE(parsed.ok());
  auto h = CxlHeap::Open(*parsed);
  if (h.ok()) GTEST_SKIP() << "this machine has a dax-kmem node: " << (*h)->Describe();
  EXPECT_NE(h.status().message().find("kmem:node=0"), std::string::npos) << h.status();
}

// fork: the child keeps a private copy of the heap (as with anonymous memory), the parent's
// blocks are untouched by the child's writes, and the child can allocate afresh.
TEST(CxlHeap, ForkGivesTheChildAPrivateCopy) {
  auto h = MustOpenHeap("memfd:?size=64M");
  ASSERT_NE(h, nullptr);
  auto* p = static_cast<unsigned char*>(h->Alloc(1 << 20, 0, false));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 1 << 20);
  h->PrepareFork();
  const pid_t pid = ::fork();
  if (pid == 0) {
    h->ChildAfterFork();
    int bad = 0;
    for (int i = 0; i < (1 << 20); ++i) bad += p[i] != 0x5a;  // the parent's data, copied
    std::memset(p, 0xc3, 1 << 20);                            // private to the child
    void* q = h->Alloc(2 << 20, 0, false);                    // new blocks, new owner slot
    if (q == nullptr)
      bad += 1000;
    else
      std::memset(q, 1, 2 << 20);
    h->Free(p);
    ::_exit(bad == 0 ? 0 : 1);
  }
  h->ParentAfterFork();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < (1 << 20); ++i) ASSERT_EQ(p[i], 0x5a) << "child wrote the parent's heap";
  h->Free(p);
}

// ---- a pooled heap giving its extents away (audit #4) ----------------------------------------

// Extents of a file pool, lent the way the orchestrator lends them (a window spec each), and
// the heap's calls back recorded in the trace: "shrink N" when it gives extent N back. The
// test plays the domain's watchdog by calling revoke() itself.
class FileExtents final : public ExtentSource {
 public:
  FileExtents(std::string path, std::uint64_t extent_bytes, cxlkv::testing::CacheTrace* trace)
      : path_(std::move(path)), extent_bytes_(extent_bytes), trace_(trace) {}
  absl::StatusOr<Extent> Grow(void (*revoke)(void*, std::uint32_t), void* ctx) override {
    revoke_ = revoke;
    ctx_ = ctx;
    Extent e;
    e.index = next_++;
    e.length = extent_bytes_;
    e.spec = "file:" + path_ + "?offset=" + std::to_string(e.index * extent_bytes_) +
             "&length=" + std::to_string(extent_bytes_);
    return e;
  }
  void Shrink(std::uint32_t extent) override { trace_->Mark("shrink " + std::to_string(extent)); }
  std::string Describe() const override { return "test extents of " + path_; }
  void Revoke(std::uint32_t extent) const { revoke_(ctx_, extent); }

 private:
  std::string path_;
  std::uint64_t extent_bytes_;
  cxlkv::testing::CacheTrace* trace_;
  std::uint32_t next_ = 0;
  void (*revoke_)(void*, std::uint32_t) = nullptr;
  void* ctx_ = nullptr;
};

constexpr std::uint64_t kExtentBytes = 16u << 20;

// A pooled heap over one extent with a 1 MiB object holding 0x5a; *source is the heap's.
std::unique_ptr<CxlHeap> PooledHeapWithObject(const cxlkv::testing::ShmPath& pool,
                                              cxlkv::testing::CacheTrace* trace,
                                              FileExtents** source, unsigned char** object) {
  EXPECT_TRUE(pool::OpenRegion(pool.spec("64M")).ok());  // creates the pool file
  auto src = std::make_unique<FileExtents>(pool.path(), kExtentBytes, trace);
  *source = src.get();
  auto h = CxlHeap::OpenPooled(std::move(src), 1ull << 30);
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return nullptr;
  EXPECT_TRUE((*h)->Grow().ok());
  *object = static_cast<unsigned char*>((*h)->Alloc(1 << 20, 0, false));
  EXPECT_NE(*object, nullptr);
  if (*object != nullptr) std::memset(*object, 0x5a, 1 << 20);
  return std::move(*h);
}

// Where the heap mapped its first extent: the first address of its reservation aligned like
// the extent's length.
std::uintptr_t SlabBase(const CxlHeap& h) {
  return (h.range().lo + kExtentBytes - 1) & ~std::uintptr_t{kExtentBytes - 1};
}

// What a flush of the extent's length shows where the object lies: the object's bytes mean
// the flushed range is (a view of) the extent's memory, not the private copy that replaced it.
cxlkv::testing::CacheTrace::Probe ObjectProbe(std::uintptr_t slab, const unsigned char* object) {
  return [slab, object](coherence::CacheOp op, const void* addr, std::size_t len) -> std::string {
    if (op == coherence::CacheOp::kFence || len != kExtentBytes) return "";
    const auto* at =
        static_cast<const unsigned char*>(addr) + (reinterpret_cast<std::uintptr_t>(object) - slab);
    for (int i = 0; i < (1 << 20); i += 4096) {
      if (at[i] != 0x5a) return "not the object";
    }
    return "object";
  };
}

// Revocation (the lease lapsed): the slab's pages become private memory holding the same
// bytes, and every line this process dirtied in the extent is written back — through a
// second view of the extent's pages, since the process keeps running in the window — and
// fenced before Revoke returns, i.e. before the extent can be lent again.
TEST(PooledHeapGiveAway, RevokeWritesTheExtentBackBeforeItReturns) {
  cxlkv::testing::ShmPath pool("heap-revoke");
  cxlkv::testing::CacheTrace trace(kExtentBytes);
  FileExtents* source = nullptr;
  unsigned char* p = nullptr;
  auto h = PooledHeapWithObject(pool, &trace, &source, &p);
  ASSERT_NE(h, nullptr);
  ASSERT_NE(p, nullptr);
  const std::uintptr_t slab = SlabBase(*h);
  trace.SetProbe(ObjectProbe(slab, p));
  {
    coherence::ScopedCacheObserver observe(trace);
    source->Revoke(0);
    trace.Mark("revoke returned");
  }
  EXPECT_EQ(h->revocations(), 1u);
  for (int i = 0; i < (1 << 20); ++i) ASSERT_EQ(p[i], 0x5a) << "the object lost its bytes";
  const auto ev = trace.events();
  int flush = -1;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (!ev[i].is_mark && ev[i].op == coherence::CacheOp::kFlush && ev[i].len == kExtentBytes &&
        ev[i].note == "object") {
      flush = static_cast<int>(i);
      break;
    }
  }
  ASSERT_GE(flush, 0) << "revocation wrote none of the extent back\n" << trace.Dump(ev);
  const int fence = cxlkv::testing::CacheTrace::FenceAfter(ev, flush);
  ASSERT_GE(fence, 0) << trace.Dump(ev);
  EXPECT_LT(fence, cxlkv::testing::CacheTrace::FindMark(ev, "revoke returned")) << trace.Dump(ev);
  h.reset();  // a revoked extent is not given back (it is no longer the heap's)
  EXPECT_EQ(cxlkv::testing::CacheTrace::FindMark(trace.events(), "shrink 0"), -1);
}

// Destroying the heap gives each extent back: written back and fenced before Shrink.
TEST(PooledHeapGiveAway, DestroyWritesEachExtentBackBeforeShrink) {
  cxlkv::testing::ShmPath pool("heap-destroy");
  cxlkv::testing::CacheTrace trace(kExtentBytes);
  FileExtents* source = nullptr;
  unsigned char* p = nullptr;
  auto h = PooledHeapWithObject(pool, &trace, &source, &p);
  ASSERT_NE(h, nullptr);
  const std::uintptr_t slab = SlabBase(*h);
  {
    coherence::ScopedCacheObserver observe(trace);
    h->Free(p);
    h.reset();
  }
  const auto ev = trace.events();
  const int flush = cxlkv::testing::CacheTrace::FindFlush(ev, slab, kExtentBytes);
  ASSERT_GE(flush, 0) << "the extent went back without a write-back\n" << trace.Dump(ev);
  const int fence = cxlkv::testing::CacheTrace::FenceAfter(ev, flush);
  const int shrink = cxlkv::testing::CacheTrace::FindMark(ev, "shrink 0");
  ASSERT_GE(fence, 0) << trace.Dump(ev);
  ASSERT_GE(shrink, 0) << trace.Dump(ev);
  EXPECT_LT(fence, shrink) << "given back before the write-back was fenced\n" << trace.Dump(ev);
}

// Audit #8 in the heap: the give-away hook (where the shim unregisters CUDA registrations of
// the extent) runs before the extent leaves — on revocation before the swap and the write-
// back, on destruction before the write-back and Shrink — while the window still maps it.
TEST(PooledHeapGiveAway, TheGiveAwayHookRunsFirstWhileTheExtentIsMapped) {
  for (const bool revoke : {true, false}) {
    SCOPED_TRACE(revoke ? "revoke" : "destroy");
    cxlkv::testing::ShmPath pool(revoke ? "heap-hook-revoke" : "heap-hook-destroy");
    cxlkv::testing::CacheTrace trace(kExtentBytes);
    FileExtents* source = nullptr;
    unsigned char* p = nullptr;
    auto h = PooledHeapWithObject(pool, &trace, &source, &p);
    ASSERT_NE(h, nullptr);
    ASSERT_NE(p, nullptr);
    struct Hook {
      cxlkv::testing::CacheTrace* trace;
      const unsigned char* object;
    } hook{&trace, p};
    h->OnGiveAway(
        [](void* ctx, void* addr, std::size_t len) {
          auto* k = static_cast<Hook*>(ctx);
          const auto lo = reinterpret_cast<std::uintptr_t>(addr);
          const auto o = reinterpret_cast<std::uintptr_t>(k->object);
          const bool holds = lo <= o && o < lo + len && len == kExtentBytes;
          k->trace->Mark(std::string("give away ") +
                         (holds && k->object[0] == 0x5a ? "mapped" : "?"));
        },
        &hook);
    const std::uintptr_t slab = SlabBase(*h);
    {
      coherence::ScopedCacheObserver observe(trace);
      if (revoke) {
        source->Revoke(0);
        h->Free(p);
      } else {
        h->Free(p);
      }
      h.reset();
    }
    const auto ev = trace.events();
    const int hook_at = cxlkv::testing::CacheTrace::FindMark(ev, "give away mapped");
    ASSERT_GE(hook_at, 0) << cxlkv::testing::CacheTrace::Dump(ev);
    int flush = -1;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (!ev[i].is_mark && ev[i].op == coherence::CacheOp::kFlush && ev[i].len == kExtentBytes) {
        flush = static_cast<int>(i);
        break;
      }
    }
    ASSERT_GE(flush, 0) << cxlkv::testing::CacheTrace::Dump(ev);
    EXPECT_LT(hook_at, flush) << cxlkv::testing::CacheTrace::Dump(ev);
    if (!revoke) {
      EXPECT_LT(hook_at, cxlkv::testing::CacheTrace::FindMark(ev, "shrink 0"));
    }
    EXPECT_EQ(
        std::count_if(ev.begin(), ev.end(),
                      [](const auto& e) { return e.is_mark && e.note.rfind("give away", 0) == 0; }),
        1)
        << "once per extent\n"
        << cxlkv::testing::CacheTrace::Dump(ev);
    (void)slab;
  }
}

}  // namespace
}  // namespace cxlkv::preload
