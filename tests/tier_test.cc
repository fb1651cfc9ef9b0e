// TierManager: demotion frees CXL only after NVMe has the block, promotion (batched, async)
// restores it, the cool-down refuses early promotions and says why, the watermarks demote the
// least recently used blocks with hysteresis, a full disk leaves blocks in CXL, a corrupt NVMe
// copy is reported and dropped, and a restart adopts the NVMe blocks. TieredStore: the rule's
// placements read back and explained, prefetch tickets collected once, the baseline
// strategies as their LRU policies, the hooks that see blocks enter and leave CXL, and bad
// options and configs named.
//
// CXL: an arena on a memfd region (through the backend seam). NVMe: a store in a temporary
// directory. Time: a fake clock in TierOptions::now_ms.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cxlkv/tier/tier_manager.h"
#include "cxlkv/tier/tiered_store.h"
#include "gtest/gtest.h"
#include "nvme_test_util.h"
#include "test_util.h"

namespace cxlkv {
namespace {

using testing::BlockIsIntact;
using testing::FillBlock;
using testing::KeyOf;
using tier::Residence;
using tier::Tier;
using tier::TierManager;
using tier::TierOptions;

constexpr std::uint64_t kBlock = 64 << 10;

struct Clock {
  std::atomic<std::int64_t> ms{1000};
  std::function<std::int64_t()> fn() {
    return [this] { return ms.load(); };
  }
};

std::unique_ptr<nvme::NvmeStore> OpenStore(const std::string& dir, std::uint64_t payload,
                                           std::string* skip) {
  nvme::NvmeStoreOptions o;
  o.dir = dir;
  o.payload_bytes = payload;
  o.queue_depth = 32;
  o.grow_bytes = 0;
  auto s = nvme::NvmeStore::Open(o);
  if (!s.ok()) {
    *skip = std::string(s.status().message());
    return nullptr;
  }
  return std::move(*s);
}

std::unique_ptr<TierManager> MakeManager(std::string* skip, const std::string& dir,
                                         TierOptions o, std::uint64_t block = kBlock,
                                         const std::string& region = "4M") {
  pool::FormatOptions fo;
  fo.layout = testing::TinyLayout();
  fo.classes = {{0, block, 1}};
  auto arena = testing::MustFormat("memfd:cxlkv-tier-test?size=" + region, fo);
  if (arena == nullptr) return nullptr;
  auto alloc = allocator::BlockAllocator::Create(std::move(arena));
  EXPECT_TRUE(alloc.ok()) << alloc.status();
  auto store = OpenStore(dir, block, skip);
  if (store == nullptr) return nullptr;
  auto m = TierManager::Create(std::move(*alloc), std::move(store), std::move(o));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

#define MANAGER_OR_SKIP(var, ...)                         \
  std::string var##_skip;                                 \
  auto var = MakeManager(&var##_skip, __VA_ARGS__);       \
  if (var == nullptr && !var##_skip.empty()) GTEST_SKIP() << var##_skip; \
  ASSERT_NE(var, nullptr)

// A new CXL block holding FillBlock(k, version), placed on `target`.
void PlaceNew(TierManager& m, std::uint64_t k, Tier target, std::uint64_t version = 1) {
  allocator::BlockHandle h = m.allocator().Alloc(0);
  ASSERT_TRUE(h.valid());
  FillBlock(m.allocator().Addr(h), m.block_bytes(), k, version);
  ASSERT_TRUE(m.Place(KeyOf(k), h, target).ok());
}

void ExpectInCxl(TierManager& m, std::uint64_t k, std::uint64_t version = 1) {
  auto addr = m.Acquire(KeyOf(k));
  ASSERT_TRUE(addr.ok()) << k << ": " << addr.status();
  std::uint64_t v = 0;
  EXPECT_TRUE(BlockIsIntact(*addr, m.block_bytes(), k, &v)) << "key " << k;
  EXPECT_EQ(v, version) << "key " << k;
  m.Release(KeyOf(k));
}

TEST(TierManager, DemoteFreesCxlAfterNvmeHasItAndPromoteRestores) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.cooldown_ms = 100;
  o.now_ms = clock.fn();
  MANAGER_OR_SKIP(m, dir.path(), o);
  for (std::uint64_t k = 0; k < 4; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  auto addr = m->Acquire(KeyOf(0));
  ASSERT_TRUE(addr.ok());
  const auto ref = *m->allocator().RefOf(*addr);
  m->Release(KeyOf(0));

  ASSERT_TRUE(m->Demote(KeyOf(0)).ok());
  EXPECT_EQ(m->Where(KeyOf(0)), Residence::kNvme);
  EXPECT_TRUE(m->store().Contains(KeyOf(0)));
  EXPECT_FALSE(m->allocator().Resolve(ref).ok()) << "the CXL block must be freed";
  EXPECT_EQ(m->Stats().cxl_blocks, 3u);
  EXPECT_EQ(m->Stats().nvme_blocks, 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(m->Acquire(KeyOf(0)).status()));

  clock.ms += 100;
  ASSERT_TRUE(m->Promote(KeyOf(0)).ok());
  EXPECT_EQ(m->Where(KeyOf(0)), Residence::kCxl);
  ExpectInCxl(*m, 0);
  EXPECT_FALSE(m->store().Contains(KeyOf(0))) << "tiers are exclusive after a promotion";
  EXPECT_EQ(m->Stats().cxl_blocks, 4u);
  for (std::uint64_t k = 1; k < 4; ++k) ExpectInCxl(*m, k);

  // A pinned block is not demoted.
  ASSERT_TRUE(m->Acquire(KeyOf(1)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m->Demote(KeyOf(1))));
  m->Release(KeyOf(1));
  EXPECT_TRUE(m->Demote(KeyOf(1)).ok());
}

TEST(TierManager, PlaceTakesTheTargetTier) {
  testing::TempDir dir("tier");
  TierOptions o;
  MANAGER_OR_SKIP(m, dir.path(), o);
  PlaceNew(*m, 1, Tier::kNvme);
  EXPECT_EQ(m->Where(KeyOf(1)), Residence::kNvme);
  EXPECT_EQ(m->Stats().cxl_blocks, 0u);
  // Placed on NVMe by the rule, not demoted after use: no cool-down.
  EXPECT_TRUE(m->CheckPromote(KeyOf(1)).allowed());

  allocator::BlockHandle h = m->allocator().Alloc(0);
  ASSERT_TRUE(h.valid());
  const auto ref = m->allocator().Ref(h);
  ASSERT_TRUE(m->Place(KeyOf(2), h, Tier::kDrop).ok());
  EXPECT_FALSE(m->Where(KeyOf(2)).has_value());
  EXPECT_FALSE(m->allocator().Resolve(ref).ok()) << "a dropped block is freed";

  PlaceNew(*m, 3, Tier::kCxlExpanded);
  allocator::BlockHandle dup = m->allocator().Alloc(0);
  EXPECT_TRUE(absl::IsAlreadyExists(m->Place(KeyOf(3), dup, Tier::kCxlExpanded)));
  m->allocator().Free(dup);

  ASSERT_TRUE(m->Move(KeyOf(1), Tier::kDrop).ok());
  EXPECT_FALSE(m->store().Contains(KeyOf(1)));
  ASSERT_TRUE(m->Move(KeyOf(3), Tier::kNvme).ok());
  EXPECT_EQ(m->Where(KeyOf(3)), Residence::kNvme);
  EXPECT_EQ(m->Stats().dropped, 2u);
}

// The manager has one CXL arena: a block the rule sends to the pooled CXL tier lives there
// too, and Move to either CXL kind promotes.
TEST(TierManager, BothCxlKindsMeanTheArena) {
  testing::TempDir dir("tier");
  TierOptions o;
  o.cooldown_ms = 0;
  MANAGER_OR_SKIP(m, dir.path(), o);
  PlaceNew(*m, 1, Tier::kCxlPooled);
  EXPECT_EQ(m->Where(KeyOf(1)), Residence::kCxl);
  ExpectInCxl(*m, 1);
  PlaceNew(*m, 2, Tier::kNvme);
  ASSERT_TRUE(m->Move(KeyOf(2), Tier::kCxlPooled).ok());
  EXPECT_EQ(m->Where(KeyOf(2)), Residence::kCxl);
  ExpectInCxl(*m, 2);
  ASSERT_TRUE(m->Move(KeyOf(1), Tier::kNvme).ok());
  ASSERT_TRUE(m->Move(KeyOf(1), Tier::kCxlExpanded).ok());
  ExpectInCxl(*m, 1);
  EXPECT_EQ(m->Stats().cxl_blocks, 2u);
}

TEST(TierManager, PrefetchIsOneBatchAndCompletesAsynchronously) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.cooldown_ms = 10;
  o.now_ms = clock.fn();
  MANAGER_OR_SKIP(m, dir.path(), o);
  std::vector<nvme::NvmeKey> keys;
  for (std::uint64_t k = 0; k < 8; ++k) {
    PlaceNew(*m, k, Tier::kCxlExpanded, 5);
    keys.push_back(KeyOf(k));
  }
  const auto before_demote = m->store().Stats().submit_calls;
  ASSERT_TRUE(m->Demote(keys).ok());
  EXPECT_EQ(m->store().Stats().submit_calls - before_demote, 1u);
  EXPECT_EQ(m->Stats().cxl_blocks, 0u);

  clock.ms += 10;
  tier::PromotionBatch batch;
  int callbacks = 0;
  const auto before = m->store().Stats().submit_calls;
  ASSERT_TRUE(m->Prefetch(keys, batch, [&](tier::PromotionBatch& b) {
                ++callbacks;
                EXPECT_TRUE(b.first_error().ok()) << b.first_error();
              }).ok());
  EXPECT_EQ(m->store().Stats().submit_calls - before, 1u) << "8 reads, one submit";
  m->Wait(batch);
  EXPECT_TRUE(batch.done());
  EXPECT_EQ(callbacks, 1);
  for (std::uint64_t k = 0; k < 8; ++k) ExpectInCxl(*m, k, 5);
  EXPECT_EQ(m->Stats().promotions, 8u);
}

TEST(TierManager, CooldownRefusesEarlyPromotionAndSaysWhy) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.cooldown_ms = 100;
  o.now_ms = clock.fn();
  MANAGER_OR_SKIP(m, dir.path(), o);
  PlaceNew(*m, 0, Tier::kCxlExpanded);
  ASSERT_TRUE(m->Demote(KeyOf(0)).ok());
  clock.ms += 40;
  const tier::PromoteCheck c = m->CheckPromote(KeyOf(0));
  EXPECT_EQ(c.verdict, tier::PromoteVerdict::kCoolingDown);
  EXPECT_EQ(c.demoted_ms_ago, 40);
  EXPECT_EQ(c.retry_after_ms, 60);
  absl::Status st = m->Promote(KeyOf(0));
  ASSERT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("cool-down is 100 ms"), std::string::npos) << st;
  EXPECT_NE(st.message().find("retry in 60 ms"), std::string::npos) << st;
  EXPECT_EQ(m->Where(KeyOf(0)), Residence::kNvme);
  EXPECT_EQ(m->Stats().promotions_refused, 1u);
  EXPECT_EQ(m->Stats().cxl_blocks, 0u) << "a refused promotion holds no CXL block";
  clock.ms += 60;
  EXPECT_TRUE(m->CheckPromote(KeyOf(0)).allowed());
  ASSERT_TRUE(m->Promote(KeyOf(0)).ok());
  ExpectInCxl(*m, 0);
  EXPECT_EQ(m->CheckPromote(KeyOf(0)).verdict, tier::PromoteVerdict::kAlreadyInCxl);
}

TEST(TierManager, WatermarksDemoteLeastRecentlyUsedWithHysteresis) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.high_watermark_blocks = 12;
  o.low_watermark_blocks = 8;
  o.cooldown_ms = 50;
  o.now_ms = clock.fn();
  MANAGER_OR_SKIP(m, dir.path(), o);
  for (std::uint64_t k = 0; k < 12; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 12u) << "at the high watermark nothing moves";
  EXPECT_EQ(m->Stats().demotions, 0u);
  // Touch 0 and 1 (most recently used now); pin 2 (never a victim).
  for (std::uint64_t k : {0, 1}) {
    ASSERT_TRUE(m->Acquire(KeyOf(k)).ok());
    m->Release(KeyOf(k));
  }
  ASSERT_TRUE(m->Acquire(KeyOf(2)).ok());
  PlaceNew(*m, 12, Tier::kCxlExpanded);  // 13 > high: down to low (8): 5 victims
  EXPECT_EQ(m->Stats().cxl_blocks, 8u);
  EXPECT_EQ(m->Stats().watermark_runs, 1u);
  for (std::uint64_t k = 0; k <= 12; ++k) {
    const bool victim = k >= 3 && k <= 7;  // the 5 least recently used, unpinned
    EXPECT_EQ(m->Where(KeyOf(k)), victim ? Residence::kNvme : Residence::kCxl) << "key " << k;
  }
  // Between the watermarks: no demotion (hysteresis).
  for (std::uint64_t k = 13; k < 17; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 12u);
  EXPECT_EQ(m->Stats().watermark_runs, 1u);
  PlaceNew(*m, 17, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 8u);
  EXPECT_EQ(m->Stats().watermark_runs, 2u);
  EXPECT_EQ(m->Where(KeyOf(2)), Residence::kCxl) << "pinned";
  m->Release(KeyOf(2));
  // A victim comes back intact once its cool-down has passed.
  clock.ms += 50;
  ASSERT_TRUE(m->Move(KeyOf(3), Tier::kCxlExpanded).ok());
  ExpectInCxl(*m, 3);
  EXPECT_EQ(m->Stats().cxl_blocks, 9u);
}

// Touch marks keys most recently used, the first one most: a prefix chain passed root first
// loses its tail to the watermarks before its head. Keys untracked are skipped; NVMe-resident
// ones move up the NVMe LRU (so NVMe capacity evicts them last).
TEST(TierManager, TouchOrdersAChainSoItsTailIsEvictedFirst) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.high_watermark_blocks = 8;
  o.low_watermark_blocks = 6;
  o.now_ms = clock.fn();
  o.victim_tier = [](const tier::Key&) { return Tier::kDrop; };
  MANAGER_OR_SKIP(m, dir.path(), o);
  // A chain 0..5 placed root first (so by placement order the root is the oldest), then two
  // unrelated blocks 6, 7 placed after it.
  for (std::uint64_t k = 0; k < 8; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  std::vector<tier::Key> chain;
  for (std::uint64_t k = 0; k < 6; ++k) chain.push_back(KeyOf(k));
  chain.push_back(KeyOf(999));  // not tracked: skipped
  EXPECT_EQ(m->Touch(chain), 6u);
  // Order now, most recent first: 0 1 2 3 4 5 7 6. One more block: 9 > 8, down to 6: three
  // victims, the least recently used: 6, 7, then the chain's tail 5.
  PlaceNew(*m, 8, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 6u);
  for (std::uint64_t k = 0; k <= 8; ++k) {
    const bool gone = k == 5 || k == 6 || k == 7;
    EXPECT_EQ(m->Where(KeyOf(k)).has_value(), !gone) << "key " << k;
  }
  // Order: 8 0 1 2 3 4. Three more blocks push three more out: the chain keeps shrinking
  // from its tail (4, 3, 2), its head stays usable.
  for (std::uint64_t k = 9; k < 12; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  for (std::uint64_t k : {0, 1, 8, 9, 10, 11}) EXPECT_TRUE(m->Where(KeyOf(k)).has_value()) << k;
  for (std::uint64_t k : {2, 3, 4}) EXPECT_FALSE(m->Where(KeyOf(k)).has_value()) << k;
}

// RetentionS: +inf until a watermark run evicts; then the idle time of the youngest victim of
// each run (EWMA over runs), or the time since the last run when that is longer.
TEST(TierManager, RetentionIsTheIdleAgeOfTheYoungestVictim) {
  testing::TempDir dir("tier");
  Clock clock;
  TierOptions o;
  o.high_watermark_blocks = 4;
  o.low_watermark_blocks = 2;
  o.now_ms = clock.fn();
  o.victim_tier = [](const tier::Key&) { return Tier::kDrop; };
  MANAGER_OR_SKIP(m, dir.path(), o);
  const double inf = std::numeric_limits<double>::infinity();
  // Blocks 0..3 placed at t = 1, 2, 3, 4 s; 0 touched at 5 s (order by use: 1 2 3 0).
  for (std::uint64_t k = 0; k < 4; ++k) {
    clock.ms = 1000 * static_cast<std::int64_t>(k + 1);
    PlaceNew(*m, k, Tier::kCxlExpanded);
  }
  EXPECT_EQ(m->RetentionS(), inf);  // at the high watermark, not above it: nothing evicted
  clock.ms = 5000;
  const tier::Key zero = KeyOf(0);
  EXPECT_EQ(m->Touch(std::span<const tier::Key>(&zero, 1)), 1u);
  EXPECT_EQ(m->RetentionS(), inf);
  // Block 4 at 11 s: 5 > 4, down to 2: victims 1, 2, 3 (used at 2, 3, 4 s); the youngest, 3,
  // was idle 7 s.
  clock.ms = 11000;
  PlaceNew(*m, 4, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 2u);
  EXPECT_FALSE(m->Where(KeyOf(3)).has_value());
  EXPECT_TRUE(m->Where(KeyOf(0)).has_value());
  EXPECT_DOUBLE_EQ(m->RetentionS(), 7.0);
  // Later, with no run since: the time since the last run once that is longer.
  clock.ms = 15000;
  EXPECT_DOUBLE_EQ(m->RetentionS(), 7.0);
  clock.ms = 20000;
  EXPECT_DOUBLE_EQ(m->RetentionS(), 9.0);
  // Blocks 5, 6, 7 at 20 s push 5 > 4: down to 2, victims 0 (used at 5 s), 4 (11 s) and 5
  // (20 s): the youngest victim, 5, was idle 0 s. EWMA: 7 + 0.2 × (0 − 7) = 5.6 s.
  for (std::uint64_t k = 5; k < 8; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  EXPECT_EQ(m->Stats().cxl_blocks, 2u);
  EXPECT_DOUBLE_EQ(m->RetentionS(), 5.6);
}

// victim_tier re-decides each watermark victim (drop or demote); release_cxl receives every
// CXL block that was resident under a key (demoted or dropped), and the manager frees none of
// them itself: the callee owns them (a shared index frees them after its readers are gone).
TEST(TierManager, VictimTierAndReleaseHookOwnTheVictims) {
  testing::TempDir dir("tier");
  std::vector<std::pair<tier::Key, allocator::BlockHandle>> released;
  std::vector<tier::Key> asked;
  TierOptions o;
  o.high_watermark_blocks = 8;
  o.low_watermark_blocks = 4;
  o.cooldown_ms = 0;
  o.victim_tier = [&](const tier::Key& k) {
    asked.push_back(k);
    // Even keys are not worth keeping; odd ones go to NVMe.
    for (std::uint64_t i = 0; i < 16; ++i) {
      if (KeyOf(i) == k) return i % 2 == 0 ? Tier::kDrop : Tier::kNvme;
    }
    return Tier::kNvme;
  };
  o.release_cxl = [&](const tier::Key& k, allocator::BlockHandle h) { released.emplace_back(k, h); };
  MANAGER_OR_SKIP(m, dir.path(), o);
  const auto free_blocks = [&] {  // free in the arena or in this process's block cache
    const pool::ClassUsage u = m->allocator().arena().Usage().classes[0];
    return u.free + u.cached;
  };
  const std::uint32_t free0 = free_blocks();
  for (std::uint64_t k = 0; k < 9; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);  // 9 > 8: down to 4
  ASSERT_EQ(asked.size(), 5u) << "one question per victim, least recently used first";
  EXPECT_EQ(asked[0], KeyOf(0));
  EXPECT_EQ(m->Stats().cxl_blocks, 4u);
  EXPECT_EQ(m->Stats().victims_dropped, 3u);  // 0, 2, 4
  EXPECT_EQ(m->Stats().demotions, 2u);        // 1, 3
  for (std::uint64_t k = 0; k < 5; ++k) {
    EXPECT_EQ(m->Where(KeyOf(k)), k % 2 == 0 ? std::nullopt : std::optional(Residence::kNvme))
        << "key " << k;
  }
  ASSERT_EQ(released.size(), 5u) << "demoted and dropped victims both go to the hook";
  EXPECT_EQ(free_blocks(), free0 - 9) << "the manager freed a block the hook owns";
  // A new block dropped at placement was never resident: freed at once, not handed over.
  allocator::BlockHandle h = m->allocator().Alloc(0);
  ASSERT_TRUE(h.valid());
  ASSERT_TRUE(m->Place(KeyOf(20), h, Tier::kDrop).ok());
  EXPECT_EQ(released.size(), 5u);
  // Move(drop) of a CXL block hands it over too; its handle is the one CxlBlock named.
  const auto named = m->CxlBlock(KeyOf(8));
  ASSERT_TRUE(named.has_value());
  EXPECT_FALSE(m->CxlBlock(KeyOf(1)).has_value()) << "on NVMe: no CXL block";
  ASSERT_TRUE(m->Move(KeyOf(8), Tier::kDrop).ok());
  ASSERT_EQ(released.size(), 6u);
  EXPECT_EQ(released.back().first, KeyOf(8));
  EXPECT_EQ(released.back().second.index, named->index);
  for (const auto& [k, blk] : released) {
    EXPECT_EQ(m->allocator().Free(blk), allocator::FreeResult::kOk) << "released twice?";
  }
  EXPECT_EQ(free_blocks(), free0 - 3);  // 5, 6, 7 still in CXL
  ExpectInCxl(*m, 7);
}

// nvme_capacity_blocks bounds the NVMe-only blocks: past it the least recently demoted or
// read are deleted from the store.
TEST(TierManager, NvmeCapacityEvictsTheLeastRecentlyUsed) {
  testing::TempDir dir("tier");
  TierOptions o;
  o.cooldown_ms = 0;
  o.nvme_capacity_blocks = 3;
  MANAGER_OR_SKIP(m, dir.path(), o);
  for (std::uint64_t k = 0; k < 3; ++k) PlaceNew(*m, k, Tier::kNvme);
  std::vector<std::byte> buf(kBlock);
  void* dest = buf.data();
  const tier::Key k0 = KeyOf(0);
  ASSERT_TRUE(m->Read(std::span<const tier::Key>(&k0, 1), std::span<void* const>(&dest, 1),
                      kBlock)
                  .ok());  // 0 is now the most recently used
  PlaceNew(*m, 3, Tier::kNvme);  // evicts 1
  PlaceNew(*m, 4, Tier::kNvme);  // evicts 2
  EXPECT_EQ(m->Stats().nvme_evicted, 2u);
  EXPECT_EQ(m->Stats().nvme_blocks, 3u);
  for (std::uint64_t k = 0; k < 5; ++k) {
    const bool kept = k == 0 || k >= 3;
    EXPECT_EQ(m->Where(KeyOf(k)).has_value(), kept) << "key " << k;
    EXPECT_EQ(m->store().Contains(KeyOf(k)), kept) << "key " << k;
  }
  // A promoted block leaves the NVMe count; demoting it again counts it again.
  ASSERT_TRUE(m->Promote(KeyOf(0)).ok());
  EXPECT_EQ(m->Stats().nvme_blocks, 2u);
  ASSERT_TRUE(m->Demote(KeyOf(0)).ok());
  EXPECT_EQ(m->Stats().nvme_blocks, 3u);
  EXPECT_EQ(m->Stats().nvme_evicted, 2u);
}

// Read copies NVMe blocks out without promoting them, in one batch, and reports per key.
TEST(TierManager, ReadCopiesOutWithoutPromotingAndReportsPerKey) {
  testing::TempDir dir("tier");
  TierOptions o;
  o.cooldown_ms = 0;
  MANAGER_OR_SKIP(m, dir.path(), o);
  // Batched placement straight to NVMe.
  std::vector<tier::Key> keys;
  std::vector<allocator::BlockHandle> blocks;
  for (std::uint64_t k = 0; k < 6; ++k) {
    allocator::BlockHandle h = m->allocator().Alloc(0);
    ASSERT_TRUE(h.valid());
    FillBlock(m->allocator().Addr(h), kBlock, k, 3);
    keys.push_back(KeyOf(k));
    blocks.push_back(h);
  }
  const std::uint64_t submits = m->store().Stats().submit_calls;
  ASSERT_TRUE(m->Place(keys, blocks, Tier::kNvme).ok());
  EXPECT_EQ(m->store().Stats().submit_calls, submits + 1) << "one batch for the six writes";
  EXPECT_EQ(m->Stats().placed_nvme, 6u);
  EXPECT_EQ(m->Stats().demotions, 0u) << "a placement is not a demotion";
  PlaceNew(*m, 6, Tier::kCxlExpanded);
  // Corrupt key 5's copy.
  auto loc = m->store().Locate(KeyOf(5));
  ASSERT_TRUE(loc.ok());
  const int fd = ::open(loc->file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk[4] = {9, 9, 9, 9};
  ASSERT_EQ(::pwrite(fd, junk, 4, static_cast<off_t>(loc->offset + nvme::kNvmeHeaderBytes + 8)), 4);
  ::close(fd);

  const std::vector<tier::Key> want = {KeyOf(0), KeyOf(4), KeyOf(6), KeyOf(99), KeyOf(5)};
  std::vector<std::vector<std::byte>> bufs(want.size(), std::vector<std::byte>(kBlock));
  std::vector<void*> dests;
  for (auto& b : bufs) dests.push_back(b.data());
  std::vector<absl::Status> res;
  absl::Status first = m->Read(want, dests, kBlock, &res);
  EXPECT_FALSE(first.ok());
  ASSERT_EQ(res.size(), want.size());
  for (std::size_t i : {0, 1}) {
    ASSERT_TRUE(res[i].ok()) << res[i];
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(bufs[i].data(), kBlock, i == 0 ? 0 : 4, &v));
    EXPECT_EQ(v, 3u);
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(res[2])) << res[2];
  EXPECT_NE(res[2].message().find("in CXL"), std::string::npos) << res[2];
  EXPECT_TRUE(absl::IsNotFound(res[3])) << res[3];
  EXPECT_TRUE(absl::IsDataLoss(res[4])) << res[4];
  EXPECT_EQ(m->Where(KeyOf(0)), Residence::kNvme) << "read, not promoted";
  EXPECT_FALSE(m->Where(KeyOf(5)).has_value()) << "a lost block is forgotten";
  EXPECT_EQ(m->Stats().nvme_reads, 2u);
  EXPECT_EQ(m->Stats().nvme_blocks, 5u);
}

TEST(TierManager, FullDiskDemotionFailsAndBlocksStayInCxl) {
  std::string why;
  auto fs = testing::SmallFs::Mount(1 << 20, &why);
  if (fs == nullptr) GTEST_SKIP() << why;
  TierOptions o;
  o.high_watermark_blocks = 10;
  o.low_watermark_blocks = 2;
  o.auto_enforce = false;
  o.cooldown_ms = 0;
  MANAGER_OR_SKIP(m, fs->path() + "/store", o, 128 << 10, "8M");
  for (std::uint64_t k = 0; k < 14; ++k) PlaceNew(*m, k, Tier::kCxlExpanded);
  // 12 victims, room for about 7 slots of 132 KiB on the 1 MiB file system.
  auto demoted = m->EnforceWatermarks();
  ASSERT_TRUE(demoted.ok()) << demoted.status();
  EXPECT_GE(*demoted, 3u);
  EXPECT_LT(*demoted, 12u);
  EXPECT_GE(m->Stats().demotion_failures, 1u);
  std::uint64_t in_cxl = 0;
  for (std::uint64_t k = 0; k < 14; ++k) {
    if (m->Where(KeyOf(k)) == Residence::kCxl) {
      ++in_cxl;
      ExpectInCxl(*m, k);  // intact and readable
    }
  }
  EXPECT_EQ(in_cxl, 14u - *demoted);
  // A single demotion now fails with the store's reason; the block stays.
  std::uint64_t still = 0;
  while (m->Where(KeyOf(still)) != Residence::kCxl) ++still;
  absl::Status st = m->Demote(KeyOf(still));
  ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("stays in CXL"), std::string::npos) << st;
  EXPECT_EQ(m->Where(KeyOf(still)), Residence::kCxl);
  ExpectInCxl(*m, still);
  // Blocks that did reach NVMe come back intact.
  std::uint64_t on_nvme = 0;
  while (m->Where(KeyOf(on_nvme)) != Residence::kNvme) ++on_nvme;
  ASSERT_TRUE(m->Promote(KeyOf(on_nvme)).ok());
  ExpectInCxl(*m, on_nvme);
}

TEST(TierManager, CorruptNvmeCopyIsReportedAndDropped) {
  testing::TempDir dir("tier");
  TierOptions o;
  o.cooldown_ms = 0;
  MANAGER_OR_SKIP(m, dir.path(), o);
  PlaceNew(*m, 0, Tier::kNvme);
  PlaceNew(*m, 1, Tier::kNvme);
  auto loc = m->store().Locate(KeyOf(0));
  ASSERT_TRUE(loc.ok());
  const int fd = ::open(loc->file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char junk[4] = {1, 2, 3, 4};
  ASSERT_EQ(::pwrite(fd, junk, 4, static_cast<off_t>(loc->offset + nvme::kNvmeHeaderBytes + 64)),
            4);
  ::close(fd);
  absl::Status st = m->Promote(KeyOf(0));
  ASSERT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find(loc->file), std::string::npos) << st;
  EXPECT_FALSE(m->Where(KeyOf(0)).has_value()) << "a lost block is forgotten";
  EXPECT_EQ(m->Stats().cxl_blocks, 0u) << "its CXL block was given back";
  ASSERT_TRUE(m->Promote(KeyOf(1)).ok());
  ExpectInCxl(*m, 1);
}

TEST(TierManager, RestartAdoptsNvmeBlocks) {
  testing::TempDir dir("tier");
  TierOptions o;
  o.cooldown_ms = 1000000;
  {
    MANAGER_OR_SKIP(m, dir.path(), o);
    for (std::uint64_t k = 0; k < 3; ++k) PlaceNew(*m, k, Tier::kCxlExpanded, 7);
    ASSERT_TRUE(m->Demote(std::vector<nvme::NvmeKey>{KeyOf(0), KeyOf(1)}).ok());
  }
  MANAGER_OR_SKIP(m, dir.path(), o);
  EXPECT_EQ(m->Where(KeyOf(0)), Residence::kNvme);
  EXPECT_EQ(m->Where(KeyOf(1)), Residence::kNvme);
  EXPECT_FALSE(m->Where(KeyOf(2)).has_value()) << "CXL blocks of the old process are gone";
  ASSERT_TRUE(m->Promote(KeyOf(1)).ok()) << "adopted blocks have no cool-down";
  ExpectInCxl(*m, 1, 7);
}

// ---- TieredStore (tiered_store.h): the store the C API's tier and the replay drive ----------

using tier::Outcome;
using tier::Strategy;
using tier::TieredStore;
using tier::TieredStoreOptions;

std::unique_ptr<TieredStore> MakeStore(std::string* skip, const std::string& dir,
                                       TieredStoreOptions o) {
  pool::FormatOptions fo;
  fo.layout = testing::TinyLayout();
  fo.classes = {{16, kBlock, 1}};
  auto arena = testing::MustFormat("memfd:cxlkv-tiered-store-test?size=4M", fo);
  if (arena == nullptr) return nullptr;
  o.nvme.dir = dir;
  o.nvme.queue_depth = 32;
  o.nvme.grow_bytes = 0;
  auto s = TieredStore::Open(std::move(arena), std::move(o));
  if (!s.ok() && s.status().message().find("O_DIRECT") != std::string::npos) {
    *skip = std::string(s.status().message());
    return nullptr;
  }
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

#define STORE_OR_SKIP(var, ...)                                          \
  std::string var##_skip;                                                \
  auto var = MakeStore(&var##_skip, __VA_ARGS__);                        \
  if (var == nullptr && !var##_skip.empty()) GTEST_SKIP() << var##_skip; \
  ASSERT_NE(var, nullptr)

std::vector<nvme::NvmeKey> Chain(std::uint64_t from, std::size_t n) {
  std::vector<nvme::NvmeKey> keys;
  for (std::size_t i = 0; i < n; ++i) keys.push_back(KeyOf(from + i));
  return keys;
}

// Places chain[first..] of `from`'s chain with FillBlock(from + i, version) as their bytes.
std::vector<tier::KeyResult> PlaceChain(TieredStore& s, const std::vector<nvme::NvmeKey>& chain,
                                        std::uint64_t from, std::size_t first = 0,
                                        std::int32_t pin = 0, std::uint64_t version = 1) {
  tier::StoreRequest r;
  r.ns = 7;
  r.chain = chain;
  r.first = first;
  r.pin = pin;
  std::vector<std::byte> buf(s.block_bytes());
  std::vector<tier::KeyResult> res;
  (void)s.Place(
      r,
      [&](std::size_t i) -> const void* {
        FillBlock(buf.data(), buf.size(), from + first + i, version);
        return buf.data();
      },
      &res);
  return res;
}

void ExpectReadsBack(TieredStore& s, std::uint64_t k, Outcome from, std::uint64_t version = 1) {
  std::vector<std::byte> buf(s.block_bytes());
  void* dst = buf.data();
  const nvme::NvmeKey key = KeyOf(k);
  std::vector<tier::KeyResult> res;
  ASSERT_TRUE(s.Read(std::span(&key, 1), std::span(&dst, 1), buf.size(), &res).ok()) << k;
  EXPECT_EQ(res[0].outcome, from) << "key " << k;
  std::uint64_t v = 0;
  EXPECT_TRUE(BlockIsIntact(buf.data(), buf.size(), k, &v)) << "key " << k;
  EXPECT_EQ(v, version) << "key " << k;
}

TEST(TieredStore, RulePlacesPinnedBlocksInCxlAndExplainsThem) {
  testing::TempDir dir("tiered-store");
  Clock clock;
  TieredStoreOptions o;
  o.cxl_blocks = 16;
  o.now_ns = [&clock] { return clock.ms.load() * 1'000'000; };
  STORE_OR_SKIP(s, dir.path(), o);
  const auto chain = Chain(100, 4);
  tier::StoreRequest use;
  use.ns = 7;
  use.chain = chain;
  s->Use(use);
  // Pin level 3 >= the default pin_level 2: the rule keeps them in CXL (clause "pinned").
  auto res = PlaceChain(*s, chain, 100, 0, /*pin=*/3);
  ASSERT_EQ(res.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(res[i].status.ok()) << i << ": " << res[i].status;
    EXPECT_EQ(res[i].outcome, Outcome::kCxl) << i;
    ExpectReadsBack(*s, 100 + i, Outcome::kCxl);
  }
  tier::TieredStoreStats st = s->Stats();
  EXPECT_EQ(st.placed_cxl, 4u);
  EXPECT_EQ(st.uses, 4u);
  EXPECT_EQ(st.placer.decisions, 4u);
  EXPECT_EQ(st.placer.clauses[static_cast<std::size_t>(tier::Clause::kPinned)], 4u);
  EXPECT_EQ(st.tiers.cxl_blocks, 4u);
  EXPECT_EQ(st.cxl_reads, 4u);

  const tier::ExplainReport e = s->Explain(KeyOf(102));
  EXPECT_EQ(e.where, Residence::kCxl);
  ASSERT_TRUE(e.cxl_block.has_value());
  ASSERT_TRUE(e.has_last);
  EXPECT_EQ(e.last.event, tier::MoveEvent::kPlaced);
  EXPECT_TRUE(e.last.by_rule);
  EXPECT_EQ(e.last.decision.clause, tier::Clause::kPinned);
  EXPECT_EQ(e.ns, 7u);
  EXPECT_EQ(e.pin, 3);
  ASSERT_TRUE(e.reuse.has_value());
  EXPECT_EQ(e.reuse->uses, 1u);
  EXPECT_TRUE(e.has_now);
  EXPECT_EQ(e.now.clause, tier::Clause::kPinned);

  // Placed again: held already, nothing copied.
  res = PlaceChain(*s, chain, 100, 0, 3, /*version=*/2);
  for (const auto& k : res) EXPECT_TRUE(k.already_held);
  ExpectReadsBack(*s, 101, Outcome::kCxl, 1);

  // Demoted, then forced back by a prefetch; dropped; a key never placed is missing.
  std::vector<tier::KeyResult> dr;
  ASSERT_TRUE(s->Demote(std::vector<nvme::NvmeKey>{KeyOf(101)}, &dr).ok());
  EXPECT_EQ(dr[0].outcome, Outcome::kNvme);
  ExpectReadsBack(*s, 101, Outcome::kNvme);
  EXPECT_EQ(s->Explain(KeyOf(101)).last.event, tier::MoveEvent::kDemoted);
  tier::StoreRequest pf = use;
  pf.first = 1;
  pf.force = true;
  clock.ms += 10'000'000;  // past the cool-down
  auto ticket = s->Prefetch(pf);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::vector<tier::KeyResult> got;
  ASSERT_TRUE(s->Wait(*ticket, &got).ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].outcome, Outcome::kCxl);
  EXPECT_EQ(s->Explain(KeyOf(101)).last.event, tier::MoveEvent::kPromoted);
  ExpectReadsBack(*s, 101, Outcome::kCxl);
  ASSERT_TRUE(s->Drop(std::vector<nvme::NvmeKey>{KeyOf(103)}, nullptr).ok());
  EXPECT_FALSE(s->Lookup(KeyOf(103)).where.has_value());
  std::vector<std::byte> buf(s->block_bytes());
  void* dst = buf.data();
  const nvme::NvmeKey gone = KeyOf(103);
  EXPECT_TRUE(
      absl::IsNotFound(s->Read(std::span(&gone, 1), std::span(&dst, 1), buf.size(), nullptr)));
}

TEST(TieredStore, TicketsAreCollectedOnce) {
  testing::TempDir dir("tiered-store");
  TieredStoreOptions o;
  STORE_OR_SKIP(s, dir.path(), o);
  EXPECT_TRUE(absl::IsNotFound(s->Poll(42, nullptr)));
  const auto chain = Chain(1, 2);
  tier::StoreRequest r;
  r.chain = chain;
  auto t = s->Prefetch(r);
  ASSERT_TRUE(t.ok());
  std::vector<tier::KeyResult> res;
  ASSERT_TRUE(s->Wait(*t, &res).ok());
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0].outcome, Outcome::kMissing);
  EXPECT_TRUE(absl::IsNotFound(s->Wait(*t, &res))) << "a ticket is collected once";
}

TEST(TieredStore, BaselineStrategiesAreTheirLruPolicies) {
  const auto chain = Chain(10, 6);
  {  // cxl-lru: everything to CXL; at capacity the least recently used are dropped.
    testing::TempDir dir("tiered-store");
    TieredStoreOptions o;
    o.strategy = Strategy::kCxlLru;
    o.cxl_blocks = 4;
    STORE_OR_SKIP(s, dir.path(), o);
    for (const auto& k : PlaceChain(*s, chain, 10)) EXPECT_EQ(k.outcome, Outcome::kCxl);
    const tier::TieredStoreStats st = s->Stats();
    EXPECT_EQ(st.tiers.cxl_blocks, 4u);
    EXPECT_EQ(st.tiers.victims_dropped, 2u);
    EXPECT_EQ(st.tiers.nvme_blocks, 0u);
    EXPECT_FALSE(s->Lookup(KeyOf(10)).where.has_value()) << "the oldest went first";
    EXPECT_EQ(s->Lookup(KeyOf(15)).where, Residence::kCxl);
    EXPECT_EQ(st.placer.decisions, 0u) << "no rule";
  }
  {  // nvme-lru: everything to NVMe; CXL only stages the writes.
    testing::TempDir dir("tiered-store");
    TieredStoreOptions o;
    o.strategy = Strategy::kNvmeLru;
    o.nvme_blocks = 64;
    STORE_OR_SKIP(s, dir.path(), o);
    for (const auto& k : PlaceChain(*s, chain, 10)) EXPECT_EQ(k.outcome, Outcome::kNvme);
    EXPECT_EQ(s->Stats().tiers.cxl_blocks, 0u);
    EXPECT_EQ(s->ArenaUsage().classes[0].allocated, 0u) << "staging blocks freed";
    ExpectReadsBack(*s, 12, Outcome::kNvme);
    tier::StoreRequest r;
    r.chain = chain;
    auto t = s->Prefetch(r);
    ASSERT_TRUE(t.ok());
    std::vector<tier::KeyResult> res;
    ASSERT_TRUE(s->Wait(*t, &res).ok());
    EXPECT_EQ(res[0].outcome, Outcome::kNvme) << "nvme-lru never promotes";
  }
  {  // lru-spill: CXL LRU whose victims are demoted; a prefetch brings them back.
    testing::TempDir dir("tiered-store");
    TieredStoreOptions o;
    o.strategy = Strategy::kLruSpill;
    o.cxl_blocks = 4;
    STORE_OR_SKIP(s, dir.path(), o);
    for (const auto& k : PlaceChain(*s, chain, 10)) EXPECT_EQ(k.outcome, Outcome::kCxl);
    EXPECT_EQ(s->Stats().tiers.demotions, 2u);
    EXPECT_EQ(s->Lookup(KeyOf(10)).where, Residence::kNvme);
    tier::StoreRequest r;
    r.chain = chain;
    r.first = 0;
    auto t = s->Prefetch(r);
    ASSERT_TRUE(t.ok());
    std::vector<tier::KeyResult> res;
    ASSERT_TRUE(s->Wait(*t, &res).ok());
    EXPECT_EQ(res[0].outcome, Outcome::kCxl);
    EXPECT_EQ(res[1].outcome, Outcome::kCxl);
    EXPECT_EQ(s->Stats().tiers.cxl_blocks, 4u) << "the watermarks ran after the promotions";
    EXPECT_EQ(s->Stats().promoted, 2u);
  }
}

TEST(TieredStore, HooksSeeBlocksEnterAndLeaveCxl) {
  testing::TempDir dir("tiered-store");
  TieredStoreOptions o;
  o.strategy = Strategy::kLruSpill;
  o.cxl_blocks = 2;
  int entered = 0, promoted = 0;
  bool refuse = false;
  std::vector<std::pair<nvme::NvmeKey, tier::BlockHandle>> released;
  o.on_cxl = [&](const tier::CxlEntry& e) {
    if (refuse) return absl::UnavailableError("the index is full");
    ++(e.promoted ? promoted : entered);
    EXPECT_NE(e.addr, nullptr);
    return absl::OkStatus();
  };
  o.release_cxl = [&](const nvme::NvmeKey& k, tier::BlockHandle h) { released.emplace_back(k, h); };
  STORE_OR_SKIP(s, dir.path(), o);
  const auto chain = Chain(20, 3);
  PlaceChain(*s, chain, 20);
  EXPECT_EQ(entered, 3);
  ASSERT_EQ(released.size(), 1u) << "one victim left CXL";
  EXPECT_EQ(released[0].first, KeyOf(20));
  const auto allocated = [&] { return s->ArenaUsage().classes[0].allocated; };
  EXPECT_EQ(allocated(), 3u) << "the released block is the hook's until it comes back";
  ASSERT_TRUE(s->ReturnBlock(released[0].second).ok());
  EXPECT_EQ(allocated(), 2u);
  EXPECT_TRUE(absl::IsFailedPrecondition(s->ReturnBlock(released[0].second)));

  tier::StoreRequest r;
  r.chain = chain;
  auto t = s->Prefetch(r);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(s->Wait(*t, nullptr).ok());
  EXPECT_EQ(promoted, 1);

  // A hook's error fails the key, and its block goes back to the arena.
  refuse = true;
  const auto more = Chain(30, 1);
  const std::uint64_t before = allocated();
  const auto res = PlaceChain(*s, more, 30);
  EXPECT_TRUE(absl::IsUnavailable(res[0].status)) << res[0].status;
  EXPECT_EQ(allocated(), before);
  EXPECT_FALSE(s->Lookup(KeyOf(30)).where.has_value());
}

TEST(TieredStore, OpenAndConfigErrorsNameTheFieldAndTheFix) {
  testing::TempDir dir("tiered-store");
  auto defaults = tier::LoadPlacement(nullptr);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->source, "defaults");
  const std::string missing = dir.path() + "/missing.toml";
  auto st = tier::LoadPlacement(missing.c_str()).status();
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_NE(st.message().find("missing.toml"), std::string::npos) << st;
  const std::string bad = dir.path() + "/bad.toml";
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("[placement]\nbogus = 1\n", f);
    std::fclose(f);
  }
  st = tier::LoadPlacement(bad.c_str()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("placement.bogus"), std::string::npos) << st;
  EXPECT_NE(st.message().find("domain.example.toml"), std::string::npos) << st;

  pool::FormatOptions fo;
  fo.layout = testing::TinyLayout();
  fo.classes = {{16, kBlock, 1}};
  auto arena = testing::MustFormat("memfd:cxlkv-tiered-store-test?size=4M", fo);
  ASSERT_NE(arena, nullptr);
  auto alloc = allocator::BlockAllocator::Create(std::move(arena));
  ASSERT_TRUE(alloc.ok());
  TieredStoreOptions o;
  o.nvme.dir = dir.path();
  o.size_class = 3;
  st = TieredStore::Open(**alloc, o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st) && st.message().find("size_class 3") != std::string::npos)
      << st;
  o.size_class = 0;
  o.cxl_blocks = 1u << 30;
  st = TieredStore::Open(**alloc, o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st) && st.message().find("cxl_blocks") != std::string::npos)
      << st;
  o.cxl_blocks = 0;
  o.cxl_tier = Tier::kCxlPooled;  // a tier the rule's parameters do not list
  o.placer.params.cxl[1].present = false;
  st = TieredStore::Open(**alloc, o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st) &&
              st.message().find("placement.cxl_tiers") != std::string::npos)
      << st;
}

}  // namespace
}  // namespace cxlkv
