// allocator/: fast path, caches, bulk, refs, misuse detection, threads, fork.
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <thread>
#include <vector>

#include "cxlkv/allocator/block_allocator.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::allocator {
namespace {

using cxlkv::testing::MustFormat;
using cxlkv::testing::TinyLayout;

std::unique_ptr<BlockAllocator> MakeAllocator(const std::string& spec = "memfd:?size=8M",
                                              std::vector<pool::ClassSpec> classes = {}) {
  pool::FormatOptions o;
  o.layout = TinyLayout();
  o.classes = std::move(classes);
  o.owner_slots = 32;
  auto a = BlockAllocator::Create(MustFormat(spec, o));
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

TEST(BlockAllocator, AllocWriteFreeReuse) {
  auto a = MakeAllocator();
  const BlockHandle h = a->Alloc(0);
  ASSERT_TRUE(h.valid());
  std::byte* p = a->Addr(h);
  std::memset(p, 0x5A, a->block_bytes(0));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  auto resolved = a->Resolve(a->Ref(h));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, p);
  auto ref = a->RefOf(p);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*ref, a->Ref(h));
  EXPECT_EQ(a->Free(h), FreeResult::kOk);
  const BlockHandle again = a->Alloc(0);
  EXPECT_EQ(again.index, h.index) << "the magazine is LIFO: the hot block comes back";
  EXPECT_EQ(again.generation, h.generation + 1);
  EXPECT_EQ(a->Free(again), FreeResult::kOk);
}

TEST(BlockAllocator, DetectsDoubleFreeStaleAndForeign) {
  auto a = MakeAllocator();
  const BlockHandle h = a->Alloc(0);
  ASSERT_EQ(a->Free(h), FreeResult::kOk);
  EXPECT_EQ(a->Free(h), FreeResult::kDoubleFree);
  const BlockHandle reused = a->Alloc(0);
  ASSERT_EQ(reused.index, h.index);
  EXPECT_EQ(a->Free(h), FreeResult::kStaleGeneration) << "old handle must not free the reuse";
  EXPECT_TRUE(a->Resolve(a->Ref(reused)).ok());
  auto stale = a->Resolve(a->Ref(h));
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.status().message().find("stale"), absl::string_view::npos);
  EXPECT_EQ(a->Free(BlockHandle{a->arena().total_blocks() + 5, 0}), FreeResult::kForeign);
  BlockRef other = a->Ref(reused);
  other.arena[0] ^= 1;
  EXPECT_FALSE(a->Resolve(other).ok());
  int local = 0;
  EXPECT_FALSE(a->RefOf(&local).ok());
  EXPECT_FALSE(a->RefOf(a->Addr(reused) + 64).ok()) << "interior pointer is not a block";
  EXPECT_EQ(a->Free(reused), FreeResult::kOk);
  EXPECT_EQ(a->Stats().bad_frees, 3u);
}

TEST(BlockAllocator, ExhaustionIsReportedAndRecoverable) {
  auto a = MakeAllocator("memfd:?size=1M");
  std::vector<BlockHandle> hs;
  for (;;) {
    BlockHandle h = a->Alloc(0);
    if (!h.valid()) break;
    hs.push_back(h);
  }
  const std::uint32_t total = a->arena().class_record(0).block_count;
  EXPECT_EQ(hs.size(), total) << "one thread must be able to take every block";
  const absl::Status why = a->ExplainAllocFailure(0);
  EXPECT_TRUE(absl::IsResourceExhausted(why));
  EXPECT_NE(why.message().find("full"), absl::string_view::npos) << why;
  EXPECT_TRUE(absl::IsInvalidArgument(a->ExplainAllocFailure(7)));
  EXPECT_FALSE(a->Alloc(7).valid());
  EXPECT_EQ(a->FreeBulk(hs.data(), hs.size()), hs.size());
  EXPECT_TRUE(a->Alloc(0).valid());
}

TEST(BlockAllocator, SizeClasses) {
  auto a = MakeAllocator("memfd:?size=8M", {{16, 0, 1}, {0, 65536, 1}, {32, 0, 1}});
  ASSERT_EQ(a->class_count(), 3u);
  EXPECT_EQ(a->block_bytes(1), 65536u);
  EXPECT_EQ(a->block_bytes(2), 8192u);
  std::set<std::byte*> seen;
  for (std::uint32_t c = 0; c < 3; ++c) {
    for (int i = 0; i < 5; ++i) {
      BlockHandle h = a->Alloc(c);
      ASSERT_TRUE(h.valid());
      EXPECT_TRUE(seen.insert(a->Addr(h)).second);
      EXPECT_EQ(pool::WordClass(a->arena().word(h.index).load()), c);
    }
  }
}

TEST(BlockAllocator, BulkIsAllOrNothing) {
  auto a = MakeAllocator("memfd:?size=1M");
  const std::uint32_t total = a->arena().class_record(0).block_count;
  std::vector<BlockHandle> hs(total + 1);
  EXPECT_FALSE(a->AllocBulk(0, total + 1, hs.data()));
  EXPECT_EQ(a->Stats().usage.classes[0].allocated, 0u) << "a failed bulk alloc rolled back";
  ASSERT_TRUE(a->AllocBulk(0, total, hs.data()));
  std::set<std::uint32_t> unique;
  for (std::uint32_t i = 0; i < total; ++i) unique.insert(hs[i].index);
  EXPECT_EQ(unique.size(), total);
  EXPECT_FALSE(a->Alloc(0).valid());
  EXPECT_EQ(a->FreeBulk(hs.data(), total), total);
  EXPECT_EQ(a->FreeBulk(hs.data(), total), 0u) << "second bulk free is all double frees";
}

TEST(BlockAllocator, ThreadsGetDistinctBlocksAndReturnThemOnExit) {
  auto a = MakeAllocator("memfd:?size=16M");
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::vector<std::uint32_t>> held(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<BlockHandle> mine;
      for (int r = 0; r < kRounds; ++r) {
        BlockHandle h = a->Alloc(0);
        ASSERT_TRUE(h.valid());
        *reinterpret_cast<int*>(a->Addr(h)) = t;
        mine.push_back(h);
        if (mine.size() > 8) {
          ASSERT_EQ(*reinterpret_cast<int*>(a->Addr(mine.front())), t) << "block shared!";
          ASSERT_EQ(a->Free(mine.front()), FreeResult::kOk);
          mine.erase(mine.begin());
        }
      }
      for (auto h : mine) held[t].push_back(h.index);
      // Keep these allocated; the thread's cache drains when it exits.
    });
  }
  for (auto& th : ts) th.join();
  std::set<std::uint32_t> all;
  for (auto& v : held) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kThreads) * 8);
  const pool::ArenaUsage u = a->arena().Usage();
  EXPECT_EQ(u.classes[0].cached, 0u) << "exited threads returned their caches";
  EXPECT_EQ(u.classes[0].allocated, all.size());
  const AllocatorStats s = a->Stats();
  EXPECT_EQ(s.classes[0].allocs, static_cast<std::uint64_t>(kThreads) * kRounds);
}

TEST(BlockAllocator, CloseReturnsOwnedBlocksButKeepsPersisted) {
  testing::ShmPath p("persist");
  BlockRef kept, dropped;
  {
    auto a = MakeAllocator(p.spec("4M"));
    BlockHandle h1 = a->Alloc(0), h2 = a->Alloc(0);
    std::memcpy(a->Addr(h1), "persisted", 10);
    ASSERT_TRUE(a->Persist(h1).ok());
    EXPECT_FALSE(a->Persist(h1).ok()) << "already persisted";
    kept = a->Ref(h1);
    dropped = a->Ref(h2);
  }
  auto arena = pool::Arena::Open(testing::MustOpen(p.spec()));
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto a = BlockAllocator::Create(std::move(*arena));
  ASSERT_TRUE(a.ok());
  auto addr = (*a)->Resolve(kept);
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_STREQ(reinterpret_cast<const char*>(*addr), "persisted");
  EXPECT_FALSE((*a)->Resolve(dropped).ok()) << "an unpersisted block died with its owner";
  EXPECT_EQ((*a)->Free(BlockHandle{kept.index, kept.generation}), FreeResult::kOk);
  EXPECT_EQ((*a)->Stats().usage.classes[0].persisted, 0u);
}

TEST(BlockAllocator, ForkedChildGetsItsOwnSlotAndCanFreeParentBlocks) {
  auto a = MakeAllocator();
  BlockHandle parent_block = a->Alloc(0);
  BlockHandle cached_in_parent = a->Alloc(0);
  ASSERT_EQ(a->Free(cached_in_parent), FreeResult::kOk);  // sits in the parent's magazine
  const std::uint32_t parent_owner = a->arena().owner_id();
  const pid_t pid = ::fork();
  if (pid == 0) {
    BlockHandle h = a->Alloc(0);
    int rc = 0;
    if (!h.valid()) rc |= 1;
    if (h.index == cached_in_parent.index) rc |= 2;  // must not reuse the parent's cache
    if (a->arena().owner_id() == parent_owner) rc |= 4;
    if (a->Free(parent_block) != FreeResult::kOk) rc |= 8;  // cross-process free
    if (a->Free(h) != FreeResult::kOk) rc |= 16;
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(a->Free(parent_block), FreeResult::kDoubleFree) << "the child freed it";
  a->arena().Recover();  // the child exited: its slot is reclaimed
  EXPECT_EQ(a->arena().Usage().owners_active, 1u);
  EXPECT_TRUE(a->Alloc(0).valid());
}

#ifdef CXLKV_ASAN
TEST(BlockAllocatorDeathTest, UseAfterFreeIsCaughtByAsan) {
  auto a = MakeAllocator();
  BlockHandle h = a->Alloc(0);
  std::byte* p = a->Addr(h);
  p[0] = std::byte{1};
  ASSERT_EQ(a->Free(h), FreeResult::kOk);
  EXPECT_DEATH({ p[10] = std::byte{2}; }, "use-after-poison");
}
#endif

}  // namespace
}  // namespace cxlkv::allocator
