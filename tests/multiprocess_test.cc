// Several processes on one arena at once: disjoint blocks, refs passed between processes,
// cross-process free, and every process's blocks returned when it exits.
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <vector>

#include "cxlkv/allocator/block_allocator.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv {
namespace {

using allocator::BlockAllocator;
using allocator::BlockHandle;
using allocator::BlockRef;

std::unique_ptr<BlockAllocator> OpenAllocator(const std::string& spec) {
  auto arena = pool::Arena::Open(testing::MustOpen(spec));
  if (!arena.ok()) return nullptr;
  auto a = BlockAllocator::Create(std::move(*arena));
  return a.ok() ? std::move(*a) : nullptr;
}

// Each worker fills its blocks with its own tag and checks them before freeing: a block
// handed to two processes at once shows up as a foreign tag.
int Worker(const std::string& spec, std::uint32_t tag, std::uint64_t seed) {
  auto a = OpenAllocator(spec);
  if (a == nullptr) return 10;
  std::mt19937_64 rng(seed);
  std::vector<BlockHandle> held;
  for (int i = 0; i < 20000; ++i) {
    if (held.size() < 24 && (rng() % 3 != 0 || held.empty())) {
      BlockHandle h = a->Alloc(0);
      if (!h.valid()) continue;  // momentarily full: the other process holds the rest
      auto* p = reinterpret_cast<std::uint32_t*>(a->Addr(h));
      for (int k = 0; k < 16; ++k) p[k * 64] = tag;
      held.push_back(h);
    } else {
      const std::size_t j = rng() % held.size();
      const auto* p = reinterpret_cast<const std::uint32_t*>(a->Addr(held[j]));
      for (int k = 0; k < 16; ++k) {
        if (p[k * 64] != tag) return 20;  // someone else wrote into our block
      }
      if (a->Free(held[j]) != allocator::FreeResult::kOk) return 30;
      held[j] = held.back();
      held.pop_back();
    }
  }
  return 0;
}

TEST(MultiProcess, TwoProcessesNeverShareABlock) {
  const std::uint64_t seed = testing::TestSeed();
  testing::ShmPath p("mp");
  pool::FormatOptions o;
  o.layout = testing::TinyLayout();
  o.owner_slots = 8;
  { ASSERT_NE(testing::MustFormat(p.spec("512K"), o), nullptr); }  // ~100 blocks: contention
  std::vector<pid_t> pids;
  for (std::uint32_t t = 1; t <= 3; ++t) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(Worker(p.spec(), 0xC0DE0000u + t, seed + t));
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "seed=" << seed;
  }
  auto a = OpenAllocator(p.spec());
  ASSERT_NE(a, nullptr);
  const pool::ArenaUsage u = a->arena().Usage();
  EXPECT_EQ(u.classes[0].free, u.classes[0].total) << "every process returned its blocks";
  EXPECT_EQ(u.owners_active, 1u);
}

TEST(MultiProcess, RefPublishedByOneProcessIsReadAndFreedByAnother) {
  testing::ShmPath p("mpref");
  pool::FormatOptions o;
  o.layout = testing::TinyLayout();
  { ASSERT_NE(testing::MustFormat(p.spec("1M"), o), nullptr); }
  int to_reader[2];
  ASSERT_EQ(::pipe(to_reader), 0);
  const pid_t writer = ::fork();
  if (writer == 0) {
    auto a = OpenAllocator(p.spec());
    if (a == nullptr) ::_exit(1);
    BlockHandle h = a->Alloc(0);
    std::memcpy(a->Addr(h), "kv-block-from-writer", 21);
    if (!a->Persist(h).ok()) ::_exit(2);  // outlive the writer
    const BlockRef ref = a->Ref(h);
    if (::write(to_reader[1], &ref, sizeof(ref)) != sizeof(ref)) ::_exit(3);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const pid_t reader = ::fork();
  if (reader == 0) {
    BlockRef ref;
    if (::read(to_reader[0], &ref, sizeof(ref)) != sizeof(ref)) ::_exit(1);
    auto a = OpenAllocator(p.spec());
    if (a == nullptr) ::_exit(2);
    auto addr = a->Resolve(ref);
    if (!addr.ok()) ::_exit(3);
    if (std::memcmp(*addr, "kv-block-from-writer", 21) != 0) ::_exit(4);
    if (a->Free(BlockHandle{ref.index, ref.generation}) != allocator::FreeResult::kOk) ::_exit(5);
    if (a->Resolve(ref).ok()) ::_exit(6);  // stale after the free
    ::_exit(0);
  }
  ASSERT_EQ(::waitpid(reader, &status, 0), reader);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace cxlkv
