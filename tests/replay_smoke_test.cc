// The trace replay (bench/replay, issue #7) on tiny traces: each workload's hit rate lands in
// its declared band when CXL is unbounded, bytes are accounted consistently, every block read
// back (from the arena or from NVMe) matches what was written, and the replay's counts agree
// with the counts the real components keep themselves — so a replay that bypassed the
// allocator, the prefix index or the NVMe store would fail here.
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "replay.h"
#include "test_util.h"
#include "trace.h"

namespace cxlkv::replay {
namespace {

ReplayOptions Tiny(Policy policy, std::uint32_t cxl_blocks, const std::string& tag) {
  ReplayOptions o;
  o.policy = policy;
  o.profile.name = "tiny";
  o.profile.bytes_per_token = 256;  // 4 KiB blocks, moved at full size
  o.profile.scale = 1;
  o.params.cxl[1].present = false;
  o.params.nvme = {90e-6, 2e9};
  o.params.cxl[0].figures = {500e-9, 8e9};
  o.cxl_blocks = cxl_blocks;
  o.nvme_blocks = 1u << 16;
  o.tag = tag;
  o.nvme_dir = "/tmp/cxlkv-replay-test-" + tag + "-" + std::to_string(::getpid());
  return o;
}

Trace Make(const std::string& name, std::uint32_t requests, std::uint64_t seed) {
  TraceSpec s;
  s.name = name;
  s.requests = requests;
  s.seed = seed;
  auto t = GenerateTrace(s);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Trace{};
}

// What every run must satisfy, whatever the policy.
void CheckAccounting(const ReplayResult& r, const ReplayOptions& o) {
  const std::uint64_t moved = o.profile.MovedBlockBytes();
  const std::uint64_t modeled = o.profile.ModeledBlockBytes();
  EXPECT_EQ(r.verify_failures, 0u);
  EXPECT_EQ(r.index_mismatches, 0u);
  EXPECT_EQ(r.nvme_read_errors, 0u);
  EXPECT_EQ(r.store_data_loss, 0u);
  EXPECT_EQ(r.cxl_hits + r.nvme_hits + r.misses, r.lookup_blocks);
  for (const TierBytes* t : {&r.cxl_read, &r.cxl_write, &r.nvme_read, &r.nvme_write}) {
    EXPECT_EQ(t->moved_bytes, t->blocks * moved);
    EXPECT_EQ(t->modeled_bytes, t->blocks * modeled);
  }
  // CXL: every block written was published through the owner, every eviction came back
  // through the owner's return ring and was freed in the arena; what is left resident is
  // exactly what the arena holds persisted.
  EXPECT_EQ(r.owner_published, r.cxl_write.blocks);
  EXPECT_EQ(r.cxl_read.blocks, r.cxl_hits + r.demotions);
  EXPECT_EQ(r.owner_published - r.owner_reclaimed, r.cxl_resident_end);
  EXPECT_EQ(r.arena_persisted_end, r.cxl_resident_end);
  EXPECT_LE(r.cxl_resident_end, o.cxl_blocks);
  // NVMe: the store's own counts of completed puts and gets are the replay's.
  EXPECT_EQ(r.store_puts, r.nvme_write.blocks);
  EXPECT_EQ(r.store_gets, r.nvme_read.blocks);
  EXPECT_EQ(r.nvme_read.blocks, r.nvme_hits);
  EXPECT_EQ(r.store_blocks_end, r.nvme_resident_end);
  EXPECT_EQ(r.ttft_s.size(), r.requests);
}

TEST(ReplaySmoke, HitRatesInDeclaredBandsWithUnboundedCxl) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  const struct {
    const char* name;
    Workload w;
    std::uint32_t requests;
  } cases[] = {{"api", Workload::kApi, 240}, {"coding", Workload::kCoding, 180},
               {"rag", Workload::kRag, 180}, {"oneshot", Workload::kOneShot, 12}};
  // The bands are the generator's long-run hit rates; a finite trace's rate scatters around
  // them (at 60 requests, rag reached 0.92 for 1 seed in 40 — a flaky CI failure). Three
  // times as many requests, and 0.02 either side for what remains of the scatter.
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const Trace t = Make(c.name, c.requests, seed);
    const ReplayOptions o = Tiny(Policy::kCxlLru, 65536, std::string("band-") + c.name);
    auto r = RunReplay(t, o);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckAccounting(*r, o);
    EXPECT_EQ(r->cxl_write.blocks, r->cxl_resident_end) << "unbounded: nothing evicted";
    const HitBand band = DeclaredBand(c.w);
    constexpr double kScatter = 0.02;
    EXPECT_GE(r->HitRate(), band.lo - (c.w == Workload::kOneShot ? 0 : kScatter));
    EXPECT_LE(r->HitRate(), band.hi + (c.w == Workload::kOneShot ? 0 : kScatter));
    if (c.w != Workload::kOneShot) {
      EXPECT_GT(r->cxl_hits, 0u);
    }
  }
}

TEST(ReplaySmoke, TiersExercisedAndConsistentUnderPressure) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  const Trace t = Make("mixed", 120, seed);
  for (Policy p : {Policy::kRule, Policy::kLruSpill, Policy::kNvmeLru, Policy::kRecompute}) {
    SCOPED_TRACE(std::string(PolicyName(p)));
    // CXL far smaller than the working set: blocks must move between the tiers.
    const ReplayOptions o = Tiny(p, 512, std::string("mixed-") + std::string(PolicyName(p)));
    auto r = RunReplay(t, o);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckAccounting(*r, o);
    if (p == Policy::kLruSpill) {
      EXPECT_GT(r->demotions, 0u);
      EXPECT_GT(r->nvme_hits, 0u);
      EXPECT_GT(r->promotions, 0u);
    }
    if (p == Policy::kRule) {
      EXPECT_GT(r->nvme_write.blocks, 0u);
      EXPECT_GT(r->nvme_hits + r->cxl_hits, 0u);
      // New blocks took their namespace's prior once it had seen enough of them.
      EXPECT_GT(r->prior_reuse, 0u);
      // The TierManager's watermarks (0.95 of 512) bound what stays in CXL.
      EXPECT_LE(r->cxl_resident_end, static_cast<std::uint32_t>(o.params.high_watermark * 512));
    }
    if (p == Policy::kNvmeLru) {
      EXPECT_EQ(r->cxl_write.blocks, 0u);
      EXPECT_GT(r->nvme_hits, 0u);
    }
    if (p == Policy::kRecompute) {
      EXPECT_EQ(r->HitRate(), 0.0);
    }
  }
}

// A watermark victim cannot stay in CXL, so the rule re-decides it between NVMe and drop
// only: where recomputing a block is faster than fetching it from NVMe (here 16 us vs 92 us
// at any queue depth), every victim is dropped — none is demoted, however hot (a hot block
// would be "below break-even" for CXL, which is not on offer to a victim).
TEST(ReplaySmoke, RuleDropsVictimsWhenRecomputeBeatsNvme) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  const Trace t = Make("coding", 80, seed);
  // 1,024 blocks: a few conversations fit (a coding prompt is up to ~300 blocks, so at 256
  // one request could flush everything before its next turn, and no hit would be certain),
  // and 80 requests still overflow it many times.
  ReplayOptions o = Tiny(Policy::kRule, 1024, "victims");
  o.params.prefill_tokens_per_s = 1e6;  // 16 tokens: 16 us
  o.params.queue_depth_weight = 0;
  auto r = RunReplay(t, o);
  ASSERT_TRUE(r.ok()) << r.status();
  CheckAccounting(*r, o);
  EXPECT_GT(r->evicted_dropped, 0u) << "the watermarks ran";
  EXPECT_EQ(r->demotions, 0u);
  EXPECT_GT(r->cxl_hits, 0u) << "CXL (0.5 us) still beats recompute";
}

// NVMe capacity (nvme_blocks) is the TierManager's: past it the least recently used NVMe
// blocks are deleted from the store, and the replay's counts still agree with the store's.
TEST(ReplaySmoke, NvmeCapacityEvictsThroughTheTierManager) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  const Trace t = Make("mixed", 60, seed);
  for (Policy p : {Policy::kLruSpill, Policy::kNvmeLru}) {
    SCOPED_TRACE(std::string(PolicyName(p)));
    ReplayOptions o = Tiny(p, 256, std::string("nvcap-") + std::string(PolicyName(p)));
    o.nvme_blocks = 300;
    auto r = RunReplay(t, o);
    ASSERT_TRUE(r.ok()) << r.status();
    CheckAccounting(*r, o);
    EXPECT_GT(r->nvme_evicted, 0u);
    EXPECT_LE(r->nvme_resident_end, 300u);
    EXPECT_EQ(r->store_blocks_end, r->nvme_resident_end);
  }
}

// UnlimitedCxlTtft is computed from the trace, not replayed. With CXL large enough to evict
// nothing, cxl-lru's replay must give exactly its TTFTs (same keys, same hits, same queue);
// at a small CXL no policy may give any request a shorter TTFT than the bound.
TEST(ReplaySmoke, UnlimitedCxlBoundMatchesAnUnboundedReplayAndIsBelowEveryPolicy) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  const Trace t = Make("mixed", 120, seed);
  const ReplayOptions big = Tiny(Policy::kCxlLru, 65536, "bound-big");
  const std::vector<double> bound = UnlimitedCxlTtft(t, big);
  ASSERT_EQ(bound.size(), t.requests.size());
  auto unbounded = RunReplay(t, big);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_EQ(unbounded->cxl_write.blocks, unbounded->cxl_resident_end) << "nothing evicted";
  ASSERT_EQ(unbounded->ttft_s.size(), bound.size());
  for (std::size_t i = 0; i < bound.size(); ++i) {
    ASSERT_EQ(unbounded->ttft_s[i], bound[i]) << "request " << i;
  }
  for (Policy p : {Policy::kRule, Policy::kCxlLru, Policy::kLruSpill, Policy::kNvmeLru,
                   Policy::kRecompute}) {
    SCOPED_TRACE(std::string(PolicyName(p)));
    const ReplayOptions o = Tiny(p, 512, std::string("bound-") + std::string(PolicyName(p)));
    auto r = RunReplay(t, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->ttft_s.size(), bound.size());
    std::size_t above = 0;
    for (std::size_t i = 0; i < bound.size(); ++i) {
      ASSERT_LE(bound[i], r->ttft_s[i]) << "request " << i;
      above += bound[i] < r->ttft_s[i];
    }
    if (p != Policy::kRecompute) continue;
    EXPECT_GT(above, 0u) << "recomputing everything is slower than unlimited CXL somewhere";
  }
}

}  // namespace
}  // namespace cxlkv::replay
