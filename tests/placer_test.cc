// tier/placer.h: what the Placer tells the rule about a block and what it decides — the
// namespace prior for blocks without history, the chain's ancestors while the namespace has
// too little history, CXL pressure priced by retention instead of occupancy once the tier
// evicts, and watermark victims re-decided with CXL full (NVMe, or drop when recomputing beats
// an NVMe fetch). Defaults of PlacementParams throughout: a 5 MiB block breaks even in CXL at
// about 9 s between uses (f = 1), about 2.3 s at occupancy 0.94 (f = 3.8).
#include "cxlkv/tier/placer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace cxlkv::tier {
namespace {

using coherence::Namespace;
using coherence::PrefixKey;

constexpr std::uint64_t kBlockBytes = 5ull << 20;  // 16 tokens of Llama-3-70B fp16
constexpr std::uint32_t kTokens = 16;
constexpr std::uint64_t kSecond = 1'000'000'000;
constexpr Namespace kNs = 7;

// Distinct, well-mixed keys (as ChainKey's XXH3 output is), so no tracker bucket overflows.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
PrefixKey Key(std::uint64_t i) { return PrefixKey{Mix(i), Mix(~i)}; }

Placer MustPlacer(const PlacerOptions& o = {}) {
  auto p = Placer::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

PlacementQuery Query(const PrefixKey& key, std::uint32_t tokens = kTokens, Namespace ns = kNs) {
  PlacementQuery q;
  q.ns = ns;
  q.key = key;
  q.size_bytes = kBlockBytes;
  q.tokens = tokens;
  return q;
}

// CXL with room and not evicting; no queue.
TierState Roomy() {
  TierState s;
  s.occupancy = {0.1, 1.0};  // the replay's shape: one CXL tier, the pooled one absent
  return s;
}

// Teaches the prior of `ns`: 40 new blocks, 20 of them back after 2 s (p = 0.5, so about 4 s
// per reuse: below the ~9 s break-even). Keys start at `first`.
void TeachPrior(Placer& p, Namespace ns, std::uint64_t first, std::uint64_t t0_ns) {
  for (std::uint64_t i = 0; i < 40; ++i)
    p.RecordUse(ns, Key(first + i), t0_ns, kBlockBytes, kTokens);
  for (std::uint64_t i = 0; i < 20; ++i) {
    p.RecordUse(ns, Key(first + i), t0_ns + 2 * kSecond, kBlockBytes, kTokens);
  }
}

TEST(Placer, CreateRefusesBadOptions) {
  PlacerOptions o;
  o.params.low_watermark = 0.99;
  o.params.high_watermark = 0.5;
  EXPECT_TRUE(absl::IsInvalidArgument(Placer::Create(o).status()));
  PlacerOptions t;
  t.tracker.alpha = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Placer::Create(t).status()));
  PlacerOptions n;
  n.prior.window_blocks = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Placer::Create(n).status()));
  n.namespace_prior = false;  // the prior's options are not used then
  EXPECT_TRUE(Placer::Create(n).ok());
}

TEST(Placer, NewBlockTakesTheNamespacePrior) {
  const std::uint64_t t0 = 100 * kSecond, now = t0 + 3 * kSecond;
  Placer with = MustPlacer();
  TeachPrior(with, kNs, 1000, t0);
  const PrefixKey fresh = Key(1);
  const ReuseEstimate e = with.ExpectedReuse(Query(fresh), now);
  EXPECT_EQ(e.source, ReuseSource::kPrior);
  EXPECT_NEAR(e.interval_s, with.prior()->ExpectedIntervalS(kNs), 1e-12);
  EXPECT_GT(e.interval_s, 3.5);
  EXPECT_LT(e.interval_s, 4.5);
  const Decision d = with.Decide(Query(fresh), Roomy(), now);
  EXPECT_EQ(d.tier, Tier::kCxlExpanded);
  EXPECT_EQ(d.clause, Clause::kBelowBreakEven);
  EXPECT_EQ(with.stats().from_prior, 1u);
  EXPECT_EQ(with.stats().decisions, 1u);

  // Without the prior the same history says nothing about a new block: never reused, NVMe.
  PlacerOptions o;
  o.namespace_prior = false;
  Placer without = MustPlacer(o);
  TeachPrior(without, kNs, 1000, t0);
  EXPECT_EQ(without.prior(), nullptr);
  EXPECT_EQ(without.ExpectedReuse(Query(fresh), now).source, ReuseSource::kNone);
  EXPECT_EQ(without.Decide(Query(fresh), Roomy(), now),
            (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  EXPECT_EQ(without.stats().from_prior, 0u);

  // Another namespace learned nothing: its new blocks get no prior.
  EXPECT_EQ(with.ExpectedReuse(Query(fresh, kTokens, kNs + 1), now).source, ReuseSource::kNone);
}

TEST(Placer, OwnHistoryWinsOverThePrior) {
  const std::uint64_t t0 = 100 * kSecond;
  Placer p = MustPlacer();
  TeachPrior(p, kNs, 1000, t0);
  // Used twice, 60 s apart: its own interval (60 s, above break-even), not the prior's ~4 s.
  const PrefixKey k = Key(2);
  p.RecordUse(kNs, k, t0, kBlockBytes, kTokens);
  p.RecordUse(kNs, k, t0 + 60 * kSecond, kBlockBytes, kTokens);
  const ReuseEstimate e = p.ExpectedReuse(Query(k), t0 + 60 * kSecond);
  EXPECT_EQ(e.source, ReuseSource::kOwn);
  EXPECT_DOUBLE_EQ(e.interval_s, 60.0);
  EXPECT_EQ(p.Decide(Query(k), Roomy(), t0 + 60 * kSecond).tier, Tier::kNvme);
  EXPECT_EQ(p.stats().from_prior, 0u);
}

TEST(Placer, ChainInheritanceWhileTheNamespaceHasTooLittleHistory) {
  const std::uint64_t t0 = 100 * kSecond, now = t0 + 2 * kSecond;
  // A chain a -> b -> c: a came back after 2 s, b was seen once, c is new. The namespace has
  // 3 blocks of history, far below the prior's minimum.
  const std::vector<PrefixKey> chain = {Key(10), Key(11), Key(12)};
  auto setup = [&](Placer& p) {
    p.RecordUse(kNs, chain[0], t0, kBlockBytes, kTokens);
    p.RecordUse(kNs, chain[1], t0, kBlockBytes, kTokens);
    p.RecordUse(kNs, chain[0], now, kBlockBytes, kTokens);
  };
  PlacementQuery q = Query(chain[2]);
  q.chain = chain;
  q.pos = 2;

  Placer p = MustPlacer();
  setup(p);
  EXPECT_TRUE(std::isinf(p.prior()->ExpectedIntervalS(kNs))) << "too little history";
  const ReuseEstimate e = p.ExpectedReuse(q, now);
  EXPECT_EQ(e.source, ReuseSource::kAncestor);  // b has none: a's 2 s
  EXPECT_DOUBLE_EQ(e.interval_s, 2.0);
  EXPECT_EQ(p.Decide(q, Roomy(), now), (Decision{Tier::kCxlExpanded, Clause::kBelowBreakEven}));
  EXPECT_EQ(p.stats().from_ancestor, 1u);

  // Only chain[0..pos) are ancestors: the block itself and later ones are not looked at.
  PlacementQuery root = Query(chain[1]);
  root.chain = chain;
  root.pos = 0;
  EXPECT_EQ(p.ExpectedReuse(root, now).source, ReuseSource::kNone);

  // One ancestor up is b (no history): with max_ancestors 1 nothing is inherited.
  PlacerOptions one;
  one.max_ancestors = 1;
  Placer near = MustPlacer(one);
  setup(near);
  EXPECT_EQ(near.ExpectedReuse(q, now).source, ReuseSource::kNone);

  // Inheritance off: never reused, NVMe.
  PlacerOptions off;
  off.inherit_from_chain = false;
  Placer bare = MustPlacer(off);
  setup(bare);
  EXPECT_EQ(bare.Decide(q, Roomy(), now).tier, Tier::kNvme);
  EXPECT_EQ(bare.stats().from_ancestor, 0u);

  // Once the namespace has history, its prior comes first (here ~4 s, not a's 2 s).
  Placer taught = MustPlacer();
  setup(taught);
  TeachPrior(taught, kNs, 1000, t0);
  const ReuseEstimate pe = taught.ExpectedReuse(q, now);
  EXPECT_EQ(pe.source, ReuseSource::kPrior);
  EXPECT_GT(pe.interval_s, 3.0);
}

TEST(Placer, RetentionPricesPressureInsteadOfOccupancy) {
  Placer p = MustPlacer();
  const PlacementRule& rule = p.rule();
  const double occ = 0.94;  // between the watermarks (0.80 / 0.95)
  const double free_i = rule.BreakEvenS(Tier::kCxlExpanded, kBlockBytes, 0.0);
  const double busy_i = rule.BreakEvenS(Tier::kCxlExpanded, kBlockBytes, occ);
  ASSERT_LT(busy_i, free_i);
  // A block used every (busy_i + free_i) / 2 seconds.
  const double interval = (busy_i + free_i) / 2;
  const std::uint64_t t0 = 100 * kSecond;
  const auto t1 = t0 + static_cast<std::uint64_t>(interval * 1e9);
  const PrefixKey k = Key(3);
  p.RecordUse(kNs, k, t0, kBlockBytes, kTokens);
  p.RecordUse(kNs, k, t1, kBlockBytes, kTokens);
  ASSERT_NEAR(p.ExpectedReuse(Query(k), t1).interval_s, interval, 1e-5);  // stored as f32

  TierState filling = Roomy();
  filling.occupancy[0] = occ;  // no retention: the tier fills with nothing leaving
  EXPECT_EQ(p.Decide(Query(k), filling, t1), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));

  TierState evicting = filling;
  evicting.retention_s[0] = 30;  // it evicts LRU blocks idle for 30 s: f = 1 below full
  Explanation why;
  EXPECT_EQ(p.Decide(Query(k), evicting, t1, &why),
            (Decision{Tier::kCxlExpanded, Clause::kBelowBreakEven}));
  EXPECT_TRUE(why.tier_evicts[0]);
  EXPECT_EQ(why.pressure[0], 1.0);
  EXPECT_EQ(why.inputs.retention_s[0], 30.0);
  EXPECT_EQ(why.inputs.occupancy[0], occ);

  // Full is full, retention or not.
  TierState full = evicting;
  full.occupancy[0] = 1.0;
  EXPECT_EQ(p.Decide(Query(k), full, t1).tier, Tier::kNvme);
}

TEST(Placer, VictimIsRedecidedWithCxlFull) {
  const std::uint64_t t0 = 100 * kSecond, now = t0 + kSecond;
  Placer p = MustPlacer();
  const PrefixKey hot = Key(4);
  p.RecordUse(kNs, hot, t0, kBlockBytes, kTokens);
  p.RecordUse(kNs, hot, now, kBlockBytes, kTokens);  // back every second: CXL while it has room
  ASSERT_EQ(p.Decide(Query(hot), Roomy(), now).tier, Tier::kCxlExpanded);

  // 16 tokens take 1.6 ms to recompute, an NVMe fetch ~0.45 ms: demote.
  EXPECT_EQ(p.DecideVictim(Query(hot), Roomy(), now), Tier::kNvme);
  // 4 tokens take 0.4 ms: faster than NVMe (though not than CXL, where it stays while there
  // is room), so a victim is dropped.
  EXPECT_EQ(p.Decide(Query(hot, 4), Roomy(), now).tier, Tier::kCxlExpanded);
  EXPECT_EQ(p.DecideVictim(Query(hot, 4), Roomy(), now), Tier::kDrop);
  // ... unless the GPU is busy: one queued prefill doubles the recompute (0.8 ms).
  TierState queued = Roomy();
  queued.queue_depth = 1;
  EXPECT_EQ(p.DecideVictim(Query(hot, 4), queued, now), Tier::kNvme);
  // A pinned namespace's block: the rule keeps it in CXL, but the watermark needs the room.
  PlacementQuery pinned = Query(hot);
  pinned.pin_level = 3;
  EXPECT_EQ(p.Decide(pinned, Roomy(), now), (Decision{Tier::kCxlExpanded, Clause::kPinned}));
  EXPECT_EQ(p.DecideVictim(pinned, Roomy(), now), Tier::kNvme);

  EXPECT_EQ(p.stats().victims, 4u);
  EXPECT_EQ(p.stats().decisions, 7u);
  std::uint64_t by_clause = 0;
  for (std::uint64_t n : p.stats().clauses) by_clause += n;
  EXPECT_EQ(by_clause, p.stats().decisions);
  EXPECT_EQ(p.stats().clauses[static_cast<int>(Clause::kPinned)], 2u);
  EXPECT_EQ(p.stats().clauses[static_cast<int>(Clause::kRecomputeCheaper)], 1u);
}

// Decide() is the rule on Inputs(): the Placer adds inputs, never a decision of its own.
TEST(Placer, DecideIsTheRuleOnItsInputs) {
  const std::uint64_t t0 = 100 * kSecond;
  Placer p = MustPlacer();
  TeachPrior(p, kNs, 1000, t0);
  for (std::uint64_t i = 0; i < 60; ++i) {
    const std::uint64_t now = t0 + (3 + i) * kSecond;
    PlacementQuery q = Query(Key(500 + i % 7), 1 + static_cast<std::uint32_t>(i % 40));
    if (i % 3 == 0) p.RecordUse(kNs, q.key, now, kBlockBytes, q.tokens);
    TierState s;
    s.occupancy = {static_cast<double>(i % 11) / 10.0, 1.0};
    s.retention_s[0] = i % 2 ? 20.0 : kNoReuse;
    s.queue_depth = static_cast<std::uint32_t>(i % 4);
    const BlockInputs in = p.Inputs(q, s, now);
    EXPECT_EQ(p.Decide(q, s, now), p.rule().Decide(in)) << i;
  }
}

}  // namespace
}  // namespace cxlkv::tier
