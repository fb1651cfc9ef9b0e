// Crash consistency: a child process allocates and frees from two threads (and recovers the
// previous child's leftovers) until it is SIGKILLed at a random instant; the parent then
// checks that the map is consistent: every block is free, owned by a live process, or
// persisted; nothing the parent holds was touched; every free block can be claimed once.
//
// Iterations: CXLKV_CRASH_ITERATIONS (default 50; the stress label runs 1,000).
// Seed: CXLKV_SEED (printed on every run and on failure).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cxlkv/allocator/block_allocator.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv {
namespace {

using allocator::BlockAllocator;
using allocator::BlockHandle;

int Iterations() {
  const char* s = std::getenv("CXLKV_CRASH_ITERATIONS");
  return s != nullptr ? std::atoi(s) : 50;
}

pool::FormatOptions Options() {
  pool::FormatOptions o;
  o.layout = testing::TinyLayout();
  o.classes = {{16, 0, 2}, {32, 0, 1}};
  o.owner_slots = 8;
  return o;
}

// The child's workload: never returns.
[[noreturn]] void ChildChurn(const std::string& spec, std::uint64_t seed) {
  auto arena = pool::Arena::Open(testing::MustOpen(spec));  // recovers the previous child
  if (!arena.ok()) ::_exit(3);
  auto a = BlockAllocator::Create(std::move(*arena));
  if (!a.ok()) ::_exit(4);
  auto work = [&](std::uint64_t s) {
    std::mt19937_64 rng(s);
    std::vector<BlockHandle> held;
    for (;;) {
      const auto op = rng() % 10;
      const auto cls = static_cast<std::uint32_t>(rng() % 2);
      if (op < 5 || held.empty()) {
        BlockHandle h = (*a)->Alloc(cls);
        if (h.valid()) {
          std::memset((*a)->Addr(h), 0x11, 64);
          held.push_back(h);
        }
      } else if (op < 8) {
        const std::size_t i = rng() % held.size();
        if ((*a)->Free(held[i]) != allocator::FreeResult::kOk) ::_exit(5);
        held[i] = held.back();
        held.pop_back();
      } else if (op == 8) {
        BlockHandle bulk[17];
        if ((*a)->AllocBulk(cls, 17, bulk)) held.insert(held.end(), bulk, bulk + 17);
      } else {
        (*a)->FlushThreadCache();
        (*a)->arena().Recover();
      }
      if (held.size() > 200) {
        if ((*a)->FreeBulk(held.data(), 100) != 100) ::_exit(6);
        held.erase(held.begin(), held.begin() + 100);
      }
    }
  };
  std::thread t(work, seed * 2 + 1);
  work(seed * 2);
  ::_exit(0);
}

struct Held {
  std::uint32_t index;
  std::uint32_t gen;
};

void CheckInvariants(BlockAllocator& parent, const std::vector<Held>& held,
                     const std::vector<Held>& persisted, std::uint64_t seed, int iter) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed << " iteration=" << iter
                                    << " (replay: CXLKV_SEED=" << seed << ")");
  pool::Arena& arena = parent.arena();
  arena.Recover();
  ASSERT_TRUE(pool::ValidateMap(arena.header(), arena.region().addr(), "crash arena").ok());
  const std::uint32_t me = arena.owner_id();
  std::set<std::uint32_t> mine;
  for (const Held& h : held) {
    const std::uint64_t w = arena.word(h.index).load();
    ASSERT_EQ(pool::WordState(w), pool::kAllocated) << "block " << h.index;
    ASSERT_EQ(pool::WordOwner(w), me);
    ASSERT_EQ(pool::WordGen(w), h.gen);
    mine.insert(h.index);
  }
  for (const Held& h : persisted) {
    const std::uint64_t w = arena.word(h.index).load();
    ASSERT_EQ(pool::WordState(w), pool::kAllocated);
    ASSERT_EQ(pool::WordOwner(w), 0u);
    ASSERT_EQ(pool::WordGen(w), h.gen);
  }
  std::uint32_t free_total = 0;
  for (std::uint32_t i = 0; i < arena.total_blocks(); ++i) {
    const std::uint64_t w = arena.word(i).load();
    const auto state = pool::WordState(w);
    // No block may be left to a dead owner: only the parent (me) owns anything now.
    ASSERT_TRUE(pool::WordOwner(w) == 0 || pool::WordOwner(w) == me) << "block " << i;
    if (state == pool::kFree) ++free_total;
    if (state == pool::kCached) {
      ASSERT_EQ(pool::WordOwner(w), me);
    }
  }
  // Every free block is claimable exactly once and none of them is one we hold.
  parent.FlushThreadCache();
  std::uint32_t claimed_total = 0;
  for (std::uint32_t c = 0; c < arena.class_count(); ++c) {
    std::vector<std::uint32_t> got(arena.class_record(c).block_count);
    const std::size_t n = arena.ClaimBatch(c, got.data(), got.size());
    std::set<std::uint32_t> unique(got.begin(), got.begin() + n);
    ASSERT_EQ(unique.size(), n);
    for (auto i : unique) ASSERT_EQ(mine.count(i), 0u) << "held block " << i << " handed out";
    arena.ReleaseCached(got.data(), n);
    claimed_total += static_cast<std::uint32_t>(n);
  }
  ASSERT_EQ(claimed_total + static_cast<std::uint32_t>(held.size() + persisted.size()),
            arena.total_blocks())
      << "blocks leaked or double-counted (free words: " << free_total << ")";
}

TEST(CrashConsistency, KillAtRandomPointsThenReopen) {
  const std::uint64_t seed = testing::TestSeed();
  const int iterations = Iterations();
  std::printf("crash test: seed=%llu iterations=%d\n", static_cast<unsigned long long>(seed),
              iterations);
  testing::ShmPath p("crash");
  const std::string spec = p.spec("8M");
  auto made = BlockAllocator::Create(testing::MustFormat(spec, Options()));
  ASSERT_TRUE(made.ok());
  BlockAllocator& parent = **made;
  std::vector<Held> held, persisted;
  for (int i = 0; i < 40; ++i) {
    BlockHandle h = parent.Alloc(static_cast<std::uint32_t>(i % 2));
    ASSERT_TRUE(h.valid());
    if (i < 6) {
      ASSERT_TRUE(parent.Persist(h).ok());
      persisted.push_back({h.index, h.generation});
    } else {
      held.push_back({h.index, h.generation});
    }
  }
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < iterations; ++iter) {
    const std::uint64_t child_seed = rng();
    const auto delay_us = static_cast<int>(rng() % 4000);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ChildChurn(p.spec(), child_seed);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited by itself with " << WEXITSTATUS(status)
                                     << " (seed=" << seed << " iteration=" << iter << ")";
    CheckInvariants(parent, held, persisted, seed, iter);
    if (HasFatalFailure()) return;
  }
}

TEST(CrashConsistency, KillDuringFormatLeavesARegionThatFormatsAgain) {
  const std::uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::ShmPath p("crashfmt");
  const std::string spec = p.spec("64M");
  { ASSERT_NE(testing::MustOpen(spec), nullptr); }
  for (int iter = 0; iter < 10; ++iter) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      pool::FormatOptions o = Options();
      o.force = true;
      for (;;) {
        auto a = pool::Arena::Format(testing::MustOpen(p.spec()), o);
        if (!a.ok()) ::_exit(2);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "seed=" << seed;
    // A complete arena, an interrupted format, or (killed before the first write) a blank
    // region: never a half-valid arena.
    auto opened = pool::Arena::Open(testing::MustOpen(p.spec()));
    if (!opened.ok()) {
      // Killed before its first write the region is still blank; otherwise mid-format.
      ASSERT_TRUE(absl::IsNotFound(opened.status()) ||
                  opened.status().message().find("interrupted") != absl::string_view::npos)
          << opened.status() << " seed=" << seed;
      pool::FormatOptions o = Options();  // no force needed after an interrupted format
      ASSERT_TRUE(pool::Arena::Format(testing::MustOpen(p.spec()), o).ok());
    }
  }
}

}  // namespace
}  // namespace cxlkv
