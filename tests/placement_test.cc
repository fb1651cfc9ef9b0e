// tier/placement.h, reuse_tracker.h and calibrate.h: the placement rule's clauses at their
// boundaries, its monotonicity over random inputs, the README's worked example, the reuse
// tracker and its stats file, calibration JSON, and the [placement] configuration.
#include "cxlkv/tier/placement.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>

#include "cxlkv/tier/calibrate.h"
#include "cxlkv/tier/placement_config.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "gtest/gtest.h"
#include "temp_dir.h"
#include "test_util.h"

namespace cxlkv::tier {

// Readable failures: "cxl-pooled/ttft-forced".
void PrintTo(const Decision& d, std::ostream* os) {
  *os << TierName(d.tier) << "/" << ClauseName(d.clause);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint64_t kLlama70BBytesPerToken = 327680;  // 2 × 80 × 8 × 128 × 2

PlacementRule MustRule(const PlacementParams& p) {
  auto r = PlacementRule::Create(p);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

// Figures chosen so the arithmetic is exact in binary: latencies 0, bandwidths 2^30 B/s.
PlacementParams ExactParams() {
  PlacementParams p;
  p.cxl[0] = {true, {0, 0x1p32}, 3.0};
  p.cxl[1] = {false, {0, 0x1p32}, 2.0};
  p.nvme = {0, 0x1p30};
  p.nvme_iops = 0;
  p.nvme_cost_per_gb = 1.0;
  p.nvme_drive_bytes = 1e9;  // P_nvme = 1
  p.ttft_budget_s = 100;
  p.prefill_tokens_per_s = 1;
  p.queue_depth_weight = 1;
  p.reuse_horizon_s = 1e6;
  return p;
}

int Rank(Tier t) { return static_cast<int>(t); }

// ---- clauses at their boundaries ------------------------------------------------------------

TEST(PlacementRule, BreakEvenFollowsTheFormulaAndIsStrict) {
  const PlacementRule rule = MustRule(ExactParams());
  BlockInputs in;
  in.size_bytes = 1ull << 30;  // busy = S / B = 1 s; I* = 1 × 1 / (S_GB × (3 − 1))
  Explanation e;
  rule.Decide(in, &e);
  const double s_gb = static_cast<double>(in.size_bytes) * 1e-9;
  EXPECT_DOUBLE_EQ(e.nvme_busy_s, 1.0);
  EXPECT_DOUBLE_EQ(e.break_even_s, 1.0 / (s_gb * 2.0));
  EXPECT_DOUBLE_EQ(rule.BreakEvenS(Tier::kCxlExpanded, in.size_bytes, 0), e.break_even_s);
  const double star = e.break_even_s;

  in.reuse_interval_s = star;  // exactly at break-even: CXL no longer pays
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  in.reuse_interval_s = std::nextafter(star, 0.0);
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlExpanded, Clause::kBelowBreakEven}));
  in.reuse_interval_s = std::nextafter(star, kInf);
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
}

TEST(PlacementRule, PerIoCostMakesSmallBlocksStayLonger) {
  PlacementParams p = ExactParams();
  p.nvme_iops = 1000;  // 1 ms of drive time per fetch, whatever the size
  const PlacementRule rule = MustRule(p);
  const double small = rule.BreakEvenS(Tier::kCxlExpanded, 4096, 0);
  const double large = rule.BreakEvenS(Tier::kCxlExpanded, 1ull << 30, 0);
  EXPECT_GT(small, large);
  // I* = P (S/B + 1/IOPS) / (S Δc): for 4 KiB, (4096/2^30 + 1e-3) / (4096e-9 × 2).
  EXPECT_NEAR(small, (4096.0 / 0x1p30 + 1e-3) / (4096e-9 * 2.0), 1e-9 * small);
}

TEST(PlacementRule, TtftBudgetEdge) {
  PlacementParams p = ExactParams();
  BlockInputs in;
  in.size_bytes = 1ull << 31;  // NVMe fetch = 2 s exactly
  in.reuse_interval_s = 1000;  // far above break-even, within the horizon
  p.ttft_budget_s = 2.0;       // fetch == budget: not exceeded
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  p.ttft_budget_s = std::nextafter(2.0, 0.0);
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kCxlExpanded, Clause::kTtftForced}));
  // Beyond the reuse horizon the block is not expected back: no forcing.
  p.reuse_horizon_s = 999;
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  in.reuse_interval_s = kInf;
  p.reuse_horizon_s = 1e6;
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
}

TEST(PlacementRule, RecomputeEqualToFetchKeepsTheBlock) {
  PlacementParams p = ExactParams();
  BlockInputs in;
  in.size_bytes = 1ull << 30;  // NVMe fetch = 1 s exactly
  in.reuse_interval_s = kInf;  // not CXL-eligible: NVMe is the only tier it may live in
  in.tokens = 1;
  p.prefill_tokens_per_s = 1;  // recompute = 1 s exactly
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  p.prefill_tokens_per_s = std::nextafter(1.0, 2.0);  // recompute just under 1 s
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kDrop, Clause::kRecomputeCheaper}));
  // The queue depth scales recompute: at depth 1 (weight 1) it costs 2 s, above the fetch.
  in.queue_depth = 1;
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  // Unknown tokens: recompute never considered.
  in.queue_depth = 0;
  in.tokens = 0;
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
}

TEST(PlacementRule, RecomputeIsComparedWithTheFastestEligibleTier) {
  PlacementParams p = ExactParams();
  BlockInputs in;
  in.size_bytes = 1ull << 30;  // CXL fetch 0.25 s, NVMe 1 s
  in.tokens = 1;
  p.prefill_tokens_per_s = 2;  // recompute 0.5 s
  in.reuse_interval_s = 1e-3;  // below break-even: CXL eligible, and CXL is faster than recompute
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kCxlExpanded, Clause::kBelowBreakEven}));
  p.prefill_tokens_per_s = 8;  // recompute 0.125 s: faster than any fetch
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kDrop, Clause::kRecomputeCheaper}));
}

TEST(PlacementRule, PinOverridesEveryOtherClause) {
  PlacementParams p = ExactParams();
  p.pin_level = 2;
  p.prefill_tokens_per_s = 1e9;  // recompute is nearly free
  const PlacementRule rule = MustRule(p);
  BlockInputs in;
  in.size_bytes = 1ull << 30;
  in.reuse_interval_s = kInf;
  in.tokens = 1;
  in.pin_level = 2;
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlExpanded, Clause::kPinned}));
  in.pin_level = 3;
  in.occupancy = {1.0, 1.0};  // even when CXL is full: the TierManager makes room
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlExpanded, Clause::kPinned}));
  in.pin_level = 1;
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kDrop, Clause::kRecomputeCheaper}));
  p.pin_level = 0;  // override off
  in.pin_level = 3;
  EXPECT_EQ(MustRule(p).Decide(in), (Decision{Tier::kDrop, Clause::kRecomputeCheaper}));
}

TEST(PlacementRule, PressureRaisesDemotion) {
  PlacementParams p;  // defaults: watermarks 0.80 / 0.95, max factor 4
  p.cxl[0].present = false;
  const PlacementRule rule = MustRule(p);
  EXPECT_EQ(rule.PressureFactor(0.0), 1.0);
  EXPECT_EQ(rule.PressureFactor(0.80), 1.0);
  EXPECT_DOUBLE_EQ(rule.PressureFactor(0.875), 2.5);
  EXPECT_DOUBLE_EQ(rule.PressureFactor(0.95), 4.0);
  EXPECT_DOUBLE_EQ(rule.PressureFactor(0.975), 8.0);
  EXPECT_EQ(rule.PressureFactor(1.0), kInf);
  EXPECT_EQ(rule.PressureFactor(std::nan("")), kInf);

  BlockInputs in;
  in.size_bytes = 4000 * kLlama70BBytesPerToken;
  in.reuse_interval_s = 5;
  in.occupancy = {0, 0.5};
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlPooled, Clause::kBelowBreakEven}));
  double last = kInf;
  for (double o : {0.5, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 0.999}) {
    const double star = rule.BreakEvenS(Tier::kCxlPooled, in.size_bytes, o);
    EXPECT_LE(star, last) << "occupancy " << o;
    last = star;
  }
  in.occupancy = {0, 0.97};
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  in.occupancy = {0, 1.0};
  in.size_bytes = 32000 * kLlama70BBytesPerToken;  // NVMe fetch 750 ms > 500 ms budget
  in.reuse_interval_s = 60;                        // above break-even (11.2 s)
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kCxlFull}));
  in.occupancy = {0, 0.5};
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlPooled, Clause::kTtftForced}));
}

// A tier that evicts by itself (retention known) is priced at f = 1 below occupancy 1: its
// LRU eviction is the pressure. Occupancy 1 is still full; +inf or NaN retention: occupancy.
TEST(PlacementRule, ATierThatEvictsIsNotPricedByOccupancy) {
  PlacementParams p;  // watermarks 0.80 / 0.95, max factor 4
  p.cxl[0].present = false;
  const PlacementRule rule = MustRule(p);
  BlockInputs in;
  in.size_bytes = 4000 * kLlama70BBytesPerToken;
  in.reuse_interval_s = 5;  // below I*(f = 1) = 11.2 s, above I* at occupancy 0.97 (1.65 s)
  in.occupancy = {0, 0.97};
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  in.retention_s = {kInf, 40};
  Explanation e;
  EXPECT_EQ(rule.Decide(in, &e), (Decision{Tier::kCxlPooled, Clause::kBelowBreakEven}));
  EXPECT_EQ(e.pressure[1], 1.0);
  EXPECT_TRUE(e.tier_evicts[1]);
  EXPECT_DOUBLE_EQ(e.break_even_s, rule.BreakEvenS(Tier::kCxlPooled, in.size_bytes, 0));
  // The retention's value does not move I*: both the capacity a block takes and its chance of
  // a hit scale with P(used before it is evicted).
  for (double t : {0.001, 1.0, 1e6}) {
    in.retention_s = {kInf, t};
    rule.Decide(in, &e);
    EXPECT_DOUBLE_EQ(e.break_even_s, rule.BreakEvenS(Tier::kCxlPooled, in.size_bytes, 0)) << t;
  }
  // Exactly at I*(f = 1): NVMe, as without eviction.
  in.reuse_interval_s = e.break_even_s;
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  in.reuse_interval_s = std::nextafter(e.break_even_s, 0.0);
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kCxlPooled, Clause::kBelowBreakEven}));
  // Full is full.
  in.occupancy = {0, 1.0};
  EXPECT_EQ(rule.Decide(in), (Decision{Tier::kNvme, Clause::kCxlFull}));
  // NaN or +inf retention: priced by occupancy again.
  in.occupancy = {0, 0.97};
  in.reuse_interval_s = 5;
  for (double t : {kInf, std::nan("")}) {
    in.retention_s = {kInf, t};
    EXPECT_EQ(rule.Decide(in, &e), (Decision{Tier::kNvme, Clause::kAboveBreakEven})) << t;
    EXPECT_FALSE(e.tier_evicts[1]);
    EXPECT_DOUBLE_EQ(e.pressure[1], rule.PressureFactor(0.97));
  }
}

TEST(PlacementRule, PicksTheCxlTierWithTheLowestEffectiveCost) {
  const PlacementRule rule = MustRule(PlacementParams{});  // expanded $5/GB, pooled $4/GB
  BlockInputs in;
  in.size_bytes = 5 << 20;
  in.reuse_interval_s = 0.01;
  EXPECT_EQ(rule.Decide(in).tier, Tier::kCxlPooled);
  in.occupancy = {0.5, 0.9};  // pooled: 4 × 3 = 12 > 5
  EXPECT_EQ(rule.Decide(in).tier, Tier::kCxlExpanded);
  in.occupancy = {1.0, 0.9};  // expanded full
  EXPECT_EQ(rule.Decide(in).tier, Tier::kCxlPooled);
  // A 32,000-token block: the pooled fetch (582 ms) would break the 500 ms budget, the
  // expanded one (437 ms) meets it.
  in.size_bytes = 32000 * kLlama70BBytesPerToken;
  in.occupancy = {0.5, 0.5};
  Explanation e;
  EXPECT_EQ(rule.Decide(in, &e).tier, Tier::kCxlExpanded);
  EXPECT_TRUE(e.cxl_choice_by_ttft);
  in.occupancy = {1.0, 0.5};  // expanded full: the fastest with room
  EXPECT_EQ(rule.Decide(in, &e).tier, Tier::kCxlPooled);
  EXPECT_FALSE(e.cxl_choice_by_ttft);
}

// ---- properties over random inputs -------------------------------------------------------

double LogUniform(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
  return std::exp(u(rng));
}

PlacementParams RandomParams(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  PlacementParams p;
  for (CxlTierParams& t : p.cxl) {
    t.present = u(rng) < 0.8;
    t.figures = {LogUniform(rng, 1e-7, 2e-6), LogUniform(rng, 5e9, 6e10)};
    t.cost_per_gb = LogUniform(rng, 0.5, 20);
  }
  if (!p.cxl[0].present && !p.cxl[1].present) p.cxl[u(rng) < 0.5 ? 0 : 1].present = true;
  p.nvme = {LogUniform(rng, 1e-5, 1e-3), LogUniform(rng, 5e8, 3e10)};
  p.nvme_iops = u(rng) < 0.2 ? 0 : LogUniform(rng, 1e4, 1e7);
  p.nvme_cost_per_gb = LogUniform(rng, 0.01, 1);
  p.nvme_drive_bytes = LogUniform(rng, 1e11, 3e13);
  p.ttft_budget_s = LogUniform(rng, 0.01, 2);
  p.prefill_tokens_per_s = LogUniform(rng, 1e3, 1e5);
  p.queue_depth_weight = u(rng) * 3;
  p.low_watermark = 0.5 + u(rng) * 0.4;
  p.high_watermark = p.low_watermark + (1 - p.low_watermark) * (0.05 + 0.95 * u(rng));
  p.pressure_max_factor = 1 + u(rng) * 9;
  p.reuse_horizon_s = LogUniform(rng, 1, 1e4);
  p.pin_level = static_cast<int>(u(rng) * 4);
  return p;
}

BlockInputs RandomInputs(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  BlockInputs in;
  in.size_bytes = static_cast<std::uint64_t>(LogUniform(rng, 4096, 2e10));
  in.reuse_interval_s = u(rng) < 0.1 ? kInf : LogUniform(rng, 1e-3, 1e5);
  in.tokens = u(rng) < 0.1 ? 0 : static_cast<std::uint32_t>(LogUniform(rng, 1, 1e5));
  in.queue_depth = static_cast<std::uint32_t>(u(rng) * 64);
  in.occupancy = {u(rng) * 1.05, u(rng) * 1.05};
  for (double& t : in.retention_s) {
    const double x = u(rng);
    t = x < 0.5 ? kInf : x < 0.55 ? std::nan("") : LogUniform(rng, 1e-3, 1e5);
  }
  in.pin_level = static_cast<int>(u(rng) * 4);
  return in;
}

TEST(PlacementProperty, LongerReuseIntervalNeverMovesToAFasterTier) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (replay: CXLKV_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    const PlacementRule rule = MustRule(RandomParams(rng));
    BlockInputs a = RandomInputs(rng);
    BlockInputs b = a;
    b.reuse_interval_s = std::uniform_real_distribution<double>(0, 1)(rng) < 0.2
                             ? kInf
                             : a.reuse_interval_s * LogUniform(rng, 1, 1e4);
    const Decision da = rule.Decide(a), db = rule.Decide(b);
    ASSERT_GE(Rank(db.tier), Rank(da.tier))
        << "interval " << a.reuse_interval_s << " -> " << TierName(da.tier) << "/"
        << ClauseName(da.clause) << ", " << b.reuse_interval_s << " -> " << TierName(db.tier) << "/"
        << ClauseName(db.clause);
  }
}

// For S1 < S2 with every other input equal, tier(S2) is never faster than tier(S1) unless the
// TTFT budget moved S2: it is decided by kTtftForced (its NVMe fetch breaks the budget), or its
// CXL tier was chosen because a cheaper one's fetch would break it (cxl_choice_by_ttft).
TEST(PlacementProperty, LargerBlockNeverMovesToAFasterTierExceptByTtft) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (replay: CXLKV_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  int ttft_exceptions = 0;
  for (int i = 0; i < 20000; ++i) {
    const PlacementRule rule = MustRule(RandomParams(rng));
    BlockInputs a = RandomInputs(rng);
    BlockInputs b = a;
    b.size_bytes =
        static_cast<std::uint64_t>(static_cast<double>(a.size_bytes) * LogUniform(rng, 1, 100));
    Explanation eb;
    const Decision da = rule.Decide(a), db = rule.Decide(b, &eb);
    if (db.clause == Clause::kTtftForced || eb.cxl_choice_by_ttft) {
      ttft_exceptions += Rank(db.tier) < Rank(da.tier);
      continue;
    }
    ASSERT_GE(Rank(db.tier), Rank(da.tier))
        << "size " << a.size_bytes << " -> " << TierName(da.tier) << "/" << ClauseName(da.clause)
        << ", " << b.size_bytes << " -> " << TierName(db.tier) << "/" << ClauseName(db.clause);
  }
  RecordProperty("ttft_exceptions", ttft_exceptions);
}

TEST(PlacementProperty, HigherOccupancyNeverPromotes) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (replay: CXLKV_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    const PlacementRule rule = MustRule(RandomParams(rng));
    BlockInputs a = RandomInputs(rng);
    const double o = a.occupancy[0];
    a.occupancy = {o, o};
    // Alike: both tiers priced by occupancy, or both evicting by themselves.
    a.retention_s[1] = std::isinf(a.retention_s[0]) || std::isnan(a.retention_s[0])
                           ? kInf
                           : a.retention_s[0] * LogUniform(rng, 0.5, 2);
    BlockInputs b = a;
    const double o2 = o + std::uniform_real_distribution<double>(0, 0.3)(rng);
    b.occupancy = {o2, o2};
    Explanation ea, eb;
    const Decision da = rule.Decide(a, &ea), db = rule.Decide(b, &eb);
    ASSERT_GE(Rank(db.tier), Rank(da.tier)) << "occupancy " << o << " -> " << o2;
    ASSERT_LE(eb.break_even_s, ea.break_even_s) << "occupancy " << o << " -> " << o2;
  }
}

TEST(PlacementProperty, DecideWithAndWithoutExplanationAgree) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 5000; ++i) {
    const PlacementRule rule = MustRule(RandomParams(rng));
    const BlockInputs in = RandomInputs(rng);
    Explanation e;
    const Decision d = rule.Decide(in, &e);
    ASSERT_EQ(d, rule.Decide(in));
    ASSERT_EQ(d, e.decision);
  }
}

// ---- the README's worked example ------------------------------------------------------------

PlacementParams ExampleConfigParams() {
  const std::string path = std::string(CXLKV_SOURCE_DIR) + "/orchestrator/domain.example.toml";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto c = ParsePlacementConfig(text, path);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->params : PlacementParams{};
}

TEST(ReadmeExample, Llama3_70B) {
  const PlacementParams p = ExampleConfigParams();
  const PlacementRule rule = MustRule(p);
  // A 4,000-token RAG prefix of Llama-3-70B fp16: 320 KiB/token, 1.31 GB.
  BlockInputs rag;
  rag.size_bytes = 4000 * kLlama70BBytesPerToken;
  ASSERT_EQ(rag.size_bytes, 1310720000u);
  rag.tokens = 4000;
  rag.reuse_interval_s = 0.050;  // thousands of requests share it: one every 50 ms
  rag.occupancy = {0.5, 0.5};
  Explanation e;
  EXPECT_EQ(rule.Decide(rag, &e), (Decision{Tier::kCxlPooled, Clause::kBelowBreakEven}));
  EXPECT_NEAR(e.fetch_s[2], 0.0937, 0.00005);  // 80 us + 1.31 GB / 14 GB/s
  EXPECT_NEAR(e.fetch_s[1], 0.0728, 0.00005);  // pooled: 18 GB/s
  EXPECT_NEAR(e.recompute_s, 0.400, 1e-12);    // 4,000 / 10,000 tokens/s
  EXPECT_NEAR(e.break_even_s, 11.2, 0.05);     // 614.4 × 93.6 ms / (1.31 × 3.92)

  // The same prefix reused every 5 s: still CXL at half occupancy, NVMe at 97 %.
  rag.reuse_interval_s = 5;
  EXPECT_EQ(rule.Decide(rag), (Decision{Tier::kCxlPooled, Clause::kBelowBreakEven}));
  rag.occupancy = {0.97, 0.97};
  EXPECT_EQ(rule.Decide(rag, &e), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  EXPECT_NEAR(e.break_even_s, 1.65, 0.01);

  // A one-shot long document (no reuse seen): NVMe; its fetch (94 ms) beats recompute (400 ms).
  BlockInputs doc = rag;
  doc.reuse_interval_s = kNoReuse;
  doc.occupancy = {0.5, 0.5};
  EXPECT_EQ(rule.Decide(doc), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));
  // On a 1.86 GB/s disk (machine-baselines.md) the fetch takes 705 ms: drop at queue depth 0,
  // keep on NVMe from depth 1 (recompute 800 ms).
  PlacementParams slow = p;
  slow.nvme.read_bytes_per_s = 1.86e9;
  const PlacementRule slow_rule = MustRule(slow);
  EXPECT_EQ(slow_rule.Decide(doc, &e), (Decision{Tier::kDrop, Clause::kRecomputeCheaper}));
  EXPECT_NEAR(e.fetch_s[2], 0.7048, 0.0001);
  doc.queue_depth = 1;
  EXPECT_EQ(slow_rule.Decide(doc), (Decision{Tier::kNvme, Clause::kAboveBreakEven}));

  // A 32,000-token document reused every minute: above break-even, but its NVMe fetch
  // (750 ms) breaks the 500 ms TTFT budget: CXL.
  BlockInputs big;
  big.size_bytes = 32000 * kLlama70BBytesPerToken;
  big.tokens = 32000;
  big.reuse_interval_s = 60;
  big.occupancy = {0.5, 0.5};
  EXPECT_EQ(rule.Decide(big, &e), (Decision{Tier::kCxlExpanded, Clause::kTtftForced}));
  EXPECT_NEAR(e.fetch_s[2], 0.7490, 0.0001);
  EXPECT_NEAR(e.fetch_s[1], 0.5825, 0.0001) << "the pooled fetch misses the budget too";
  EXPECT_NEAR(e.fetch_s[0], 0.4369, 0.0001) << "the expanded one meets it";
  EXPECT_TRUE(e.cxl_choice_by_ttft);
}

// ---- explanation ----------------------------------------------------------------------------

TEST(Explanation, TextAndJsonCarryEveryInput) {
  const PlacementRule rule = MustRule(PlacementParams{});
  BlockInputs in;
  in.size_bytes = 1310720000;
  in.reuse_interval_s = 0.05;
  in.tokens = 4000;
  in.queue_depth = 3;
  in.occupancy = {0.25, 0.625};
  in.retention_s = {kInf, 42.5};
  in.pin_level = 1;
  Explanation e;
  rule.Decide(in, &e);
  const std::string text = e.ToText();
  for (const char* want : {"1310720000", "50 ms", "4000", "queue depth       3", "0.25", "0.625",
                           "42.5 s", "evicts by itself", "pin level         1", "below-break-even", "break-even", "recompute",
                           "TTFT budget", "cxl-pooled", "<= decides"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  const nlohmann::json j = nlohmann::json::parse(e.ToJson());
  EXPECT_EQ(j["inputs"]["size_bytes"], 1310720000u);
  EXPECT_DOUBLE_EQ(j["inputs"]["reuse_interval_s"].get<double>(), 0.05);
  EXPECT_EQ(j["inputs"]["tokens"], 4000);
  EXPECT_EQ(j["inputs"]["queue_depth"], 3);
  EXPECT_DOUBLE_EQ(j["inputs"]["occupancy"]["cxl-pooled"].get<double>(), 0.625);
  EXPECT_DOUBLE_EQ(j["inputs"]["retention_s"]["cxl-pooled"].get<double>(), 42.5);
  EXPECT_TRUE(j["inputs"]["retention_s"]["cxl-expanded"].is_null());
  EXPECT_EQ(j["tiers"][1]["pressure_from"], "eviction");
  EXPECT_EQ(j["tiers"][0]["pressure_from"], "occupancy");
  EXPECT_EQ(j["inputs"]["pin_level"], 1);
  EXPECT_EQ(j["decision"]["tier"], "cxl-pooled");
  EXPECT_EQ(j["decision"]["clause"], "below-break-even");
  EXPECT_DOUBLE_EQ(j["figures"]["break_even_s"].get<double>(), e.break_even_s);
  EXPECT_EQ(j["clauses"].back()["clause"], "below-break-even");
  EXPECT_TRUE(j["clauses"].back()["decides"].get<bool>());
  // Infinite figures are null in JSON.
  in.reuse_interval_s = kNoReuse;
  in.tokens = 0;
  rule.Decide(in, &e);
  const nlohmann::json j2 = nlohmann::json::parse(e.ToJson());
  EXPECT_TRUE(j2["inputs"]["reuse_interval_s"].is_null());
  EXPECT_TRUE(j2["figures"]["recompute_s"].is_null());
}

TEST(PlacementParams, ValidateNamesTheKey) {
  PlacementParams p;
  p.low_watermark = 0.9;
  p.high_watermark = 0.9;
  EXPECT_NE(p.Validate().message().find("placement.high_watermark"), std::string::npos);
  p = PlacementParams{};
  p.cxl[0].present = p.cxl[1].present = false;
  EXPECT_NE(p.Validate().message().find("placement.cxl_tiers"), std::string::npos);
  p = PlacementParams{};
  p.nvme.read_bytes_per_s = 0;
  EXPECT_NE(p.Validate().message().find("placement.nvme_read_gbps"), std::string::npos);
  EXPECT_FALSE(PlacementRule::Create(p).ok());
}

// ---- reuse tracker ----------------------------------------------------------------------

coherence::PrefixKey Key(std::uint64_t i) {
  return {i * 0x9E3779B97F4A7C15ull + 1, i ^ 0xABCDEFull};
}

TEST(ReuseTracker, EwmaOfIntervals) {
  auto t = ReuseTracker::Create({1024, 0.25});
  ASSERT_TRUE(t.ok()) << t.status();
  const coherence::PrefixKey k = Key(7);
  EXPECT_EQ(t->ExpectedIntervalS(k, 0), kNoReuse) << "unknown key";
  std::uint64_t now = 1'000'000'000;
  t->Record(k, now, 5 << 20, 16);
  EXPECT_EQ(t->Find(k)->uses, 1u);
  EXPECT_EQ(t->Find(k)->ewma_interval_s, kInf) << "one use: no interval yet";
  EXPECT_EQ(t->ExpectedIntervalS(k, now + 10), kNoReuse);
  const double intervals[] = {0.5, 0.1, 2.0, 0.3, 0.3, 8.0, 0.01};
  double want = 0;
  bool first = true;
  for (double iv : intervals) {
    now += static_cast<std::uint64_t>(iv * 1e9);
    t->Record(k, now);
    want = first ? iv : 0.25 * iv + 0.75 * want;
    first = false;
    EXPECT_NEAR(t->Find(k)->ewma_interval_s, want, 1e-6 * want) << "after " << iv;
  }
  const ReuseStats s = *t->Find(k);
  EXPECT_EQ(s.uses, 8u);
  EXPECT_EQ(s.size_bytes, 5u << 20) << "kept when later uses pass 0";
  EXPECT_EQ(s.tokens, 16u);
  EXPECT_EQ(s.last_seen_ns, now);
  // Expected interval: the EWMA, or the idle time when longer.
  EXPECT_NEAR(t->ExpectedIntervalS(k, now), want, 1e-6 * want);
  EXPECT_NEAR(t->ExpectedIntervalS(k, now + 100'000'000'000ull), 100.0, 1e-9);
  // A clock going backwards counts as a zero interval and does not move last_seen back.
  t->Record(k, now - 5);
  EXPECT_NEAR(t->Find(k)->ewma_interval_s, 0.75 * want, 1e-6 * want);
  EXPECT_EQ(t->Find(k)->last_seen_ns, now);
}

TEST(ReuseTracker, MemoryIsBoundedAndHotKeysSurvive) {
  auto t = ReuseTracker::Create({64, 0.25});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->capacity(), 64u);
  const std::size_t bytes = t->memory_bytes();
  EXPECT_EQ(bytes, 64u * 48);
  const coherence::PrefixKey hot = Key(1u << 30);
  std::uint64_t now = 1;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    t->Record(Key(i), now++);
    if (i % 2 == 0) t->Record(hot, now++);
    ASSERT_LE(t->size(), t->capacity());
  }
  EXPECT_EQ(t->size(), t->capacity()) << "a full table stays full";
  EXPECT_EQ(t->memory_bytes(), bytes);
  ASSERT_TRUE(t->Find(hot).has_value())
      << "the most recently used key in its bucket is never replaced";
  EXPECT_EQ(t->Find(hot)->uses, 50000u);
  EXPECT_NEAR(t->Find(hot)->ewma_interval_s, 3e-9, 1e-12);
  EXPECT_FALSE(t->Find(Key(0)).has_value()) << "old one-shot keys were replaced";
  EXPECT_EQ(t->Entries().size(), t->size());
}

TEST(ReuseTracker, OptionsAreChecked) {
  EXPECT_NE(ReuseTracker::Create({16, 0.25}).status().message().find("tracker_entries"),
            std::string::npos);
  EXPECT_NE(ReuseTracker::Create({64, 0}).status().message().find("reuse_ewma_alpha"),
            std::string::npos);
  EXPECT_EQ(ReuseTracker::Create({100, 0.5})->capacity(), 128u) << "rounded up to a power of two";
}

TEST(ReuseTracker, RecordSaysWhatItSaw) {
  auto t = ReuseTracker::Create({1024, 0.25});
  ASSERT_TRUE(t.ok());
  const coherence::PrefixKey k = Key(3);
  RecordOutcome o = t->Record(k, 1'000'000'000);
  EXPECT_EQ(o.uses, 1u);
  EXPECT_EQ(o.interval_s, kNoReuse);
  o = t->Record(k, 3'500'000'000);
  EXPECT_EQ(o.uses, 2u);
  EXPECT_DOUBLE_EQ(o.interval_s, 2.5);
  o = t->Record(k, 3'000'000'000);  // backwards: a zero interval
  EXPECT_EQ(o.uses, 3u);
  EXPECT_EQ(o.interval_s, 0.0);
}

// A namespace whose new blocks come back with probability p after about T seconds has an
// expected interval per reuse of T / p; the prior says so once it has seen enough, follows a
// change of mix within its window, keeps namespaces apart and bounds how many it learns.
TEST(NamespaceReuse, ExpectedIntervalIsFirstReuseOverProbability) {
  const std::uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (CXLKV_SEED to replay)");
  std::mt19937_64 rng(seed);
  auto t = ReuseTracker::Create({1u << 16, 0.25});
  ASSERT_TRUE(t.ok());
  NamespaceReuseOptions po;
  po.window_blocks = 2048;
  po.alpha = 0.05;
  auto prior = NamespaceReuse::Create(po);
  ASSERT_TRUE(prior.ok()) << prior.status();
  const coherence::Namespace coding = 11, api = 12;
  std::uint64_t next_key = 1;
  // Feeds `n` new blocks of ns, each used again with probability p after `gap_s` (± 20 %).
  auto feed = [&](coherence::Namespace ns, int n, double p, double gap_s) {
    std::uint64_t now = 1'000'000'000'000ull + next_key * 1'000'000ull;
    for (int i = 0; i < n; ++i, ++next_key) {
      const coherence::PrefixKey k = Key(next_key);
      prior->Observe(ns, t->Record(k, now));
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p) {
        const double g = gap_s * std::uniform_real_distribution<double>(0.8, 1.2)(rng);
        prior->Observe(ns, t->Record(k, now + static_cast<std::uint64_t>(g * 1e9)));
        // A third use teaches the prior nothing more.
        prior->Observe(ns, t->Record(k, now + static_cast<std::uint64_t>(3 * g * 1e9)));
      }
    }
  };
  EXPECT_EQ(prior->ExpectedIntervalS(coding), kNoReuse) << "nothing seen";
  feed(coding, 20, 0.6, 30);
  EXPECT_EQ(prior->ExpectedIntervalS(coding), kNoReuse) << "fewer than min_new new blocks";
  feed(coding, 4000, 0.6, 30);
  feed(api, 4000, 0.0, 30);
  const double coding_s = prior->ExpectedIntervalS(coding);
  EXPECT_NEAR(coding_s, 30.0 / 0.6, 0.1 * 30.0 / 0.6);
  EXPECT_NEAR(prior->Find(coding)->reuse_probability(), 0.6, 0.05);
  EXPECT_EQ(prior->ExpectedIntervalS(api), kNoReuse) << "nothing ever came back";
  EXPECT_EQ(prior->Find(api)->reused_total, 0u);
  // The coding namespace turns into one-shot traffic: within a few windows the prior says
  // its new blocks are rarely reused (a long interval), not what it learned before.
  feed(coding, 4 * 2048, 0.05, 30);
  const double after = prior->ExpectedIntervalS(coding);
  EXPECT_GT(after, 8 * coding_s) << "p fell from 0.6 towards 0.05";
  EXPECT_NEAR(prior->Find(coding)->reuse_probability(), 0.05, 0.04);
  // Bounded: a prior with room for two namespaces learns no third.
  po.max_namespaces = 2;
  auto small = NamespaceReuse::Create(po);
  ASSERT_TRUE(small.ok());
  for (coherence::Namespace ns : {1, 2, 3}) small->Observe(ns, RecordOutcome{1, kNoReuse});
  EXPECT_EQ(small->size(), 2u);
  EXPECT_FALSE(small->Find(3).has_value());
  // A reuse of a block first seen before the namespace was learned is not counted as one.
  small->Observe(1, RecordOutcome{2, 5.0});
  small->Observe(1, RecordOutcome{2, 5.0});
  EXPECT_LE(small->Find(1)->reused, small->Find(1)->new_blocks) << "p never exceeds 1";
}

TEST(NamespaceReuse, OptionsAreChecked) {
  NamespaceReuseOptions o;
  o.window_blocks = 0.5;
  EXPECT_NE(NamespaceReuse::Create(o).status().message().find("window_blocks"), std::string::npos);
  o = {};
  o.alpha = 0;
  EXPECT_NE(NamespaceReuse::Create(o).status().message().find("alpha"), std::string::npos);
  o = {};
  o.max_namespaces = 0;
  EXPECT_NE(NamespaceReuse::Create(o).status().message().find("max_namespaces"),
            std::string::npos);
}

// The tier names keys in coherence's one text form (there was a second parser here that took
// 1 to 32 digits): 32 digits, high word first; a short key is refused, naming its length.
TEST(ReuseTracker, PrefixKeyHex) {
  const coherence::PrefixKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(coherence::FormatKey(k), "fedcba98765432100123456789abcdef");
  auto back = coherence::ParseKey(coherence::FormatKey(k));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  EXPECT_NE(coherence::ParseKey("0x1f").status().message().find("has 2 hex digits"),
            std::string::npos);
  EXPECT_NE(coherence::ParseKey("12g4" + std::string(28, '0'))
                .status()
                .message()
                .find("character 3 is not a hex digit"),
            std::string::npos);
  EXPECT_FALSE(coherence::ParseKey(std::string(33, '1')).ok());
  EXPECT_FALSE(coherence::ParseKey("").ok());
}

class StatsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/cxlkv-reuse-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string Bytes() {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void Write(const std::string& b) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << b;
  }
  std::string path_;
};

TEST_F(StatsFile, RoundTrip) {
  auto t = ReuseTracker::Create({256, 0.5});
  ASSERT_TRUE(t.ok());
  for (std::uint64_t i = 0; i < 200; ++i) {
    t->Record(Key(i), 1000 + i, i * 4096, static_cast<std::uint32_t>(i));
    if (i % 3 == 0) t->Record(Key(i), 5000 + i * 7);
  }
  ASSERT_TRUE(t->Save(path_, 99999).ok());
  auto l = ReuseTracker::Load(path_);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->saved_at_ns, 99999u);
  EXPECT_EQ(l->tracker.capacity(), t->capacity());
  EXPECT_EQ(l->tracker.size(), t->size());
  EXPECT_EQ(l->tracker.alpha(), 0.5);
  for (const ReuseStats& s : t->Entries()) {
    auto got = l->tracker.Find(s.key);
    ASSERT_TRUE(got.has_value()) << coherence::FormatKey(s.key);
    EXPECT_EQ(got->uses, s.uses);
    EXPECT_EQ(got->last_seen_ns, s.last_seen_ns);
    EXPECT_EQ(got->size_bytes, s.size_bytes);
    EXPECT_EQ(got->tokens, s.tokens);
    if (std::isinf(s.ewma_interval_s)) {
      EXPECT_TRUE(std::isinf(got->ewma_interval_s));
    } else {
      EXPECT_EQ(got->ewma_interval_s, s.ewma_interval_s);
    }
  }
}

TEST_F(StatsFile, DamageIsDetected) {
  auto t = ReuseTracker::Create({64, 0.25});
  ASSERT_TRUE(t.ok());
  for (std::uint64_t i = 0; i < 20; ++i) t->Record(Key(i), i);
  ASSERT_TRUE(t->Save(path_, 1).ok());
  const std::string good = Bytes();
  ASSERT_EQ(good.size(), 80u + t->size() * 48);

  std::string b = good;
  b[80 + 5] ^= 1;  // an entry byte
  Write(b);
  EXPECT_TRUE(absl::IsDataLoss(ReuseTracker::Load(path_).status()));
  EXPECT_NE(ReuseTracker::Load(path_).status().message().find(path_), std::string::npos);

  b = good;
  b[40] ^= 1;  // a header byte
  Write(b);
  EXPECT_TRUE(absl::IsDataLoss(ReuseTracker::Load(path_).status()));

  Write(good.substr(0, good.size() - 1));
  EXPECT_TRUE(absl::IsDataLoss(ReuseTracker::Load(path_).status()));

  Write(good.substr(0, 40));
  EXPECT_TRUE(absl::IsDataLoss(ReuseTracker::Load(path_).status()));

  b = good;
  b[0] = 'X';  // foreign magic
  Write(b);
  EXPECT_TRUE(absl::IsFailedPrecondition(ReuseTracker::Load(path_).status()));

  std::remove(path_.c_str());
  EXPECT_TRUE(absl::IsNotFound(ReuseTracker::Load(path_).status()));
}

// ---- calibration ----------------------------------------------------------------------------

Calibration SampleCalibration() {
  Calibration c;
  c.memory = MemoryCalibration{"file:/dev/shm/x?size=256M&shared=1",
                               "cxl-pooled",
                               1.7e10,
                               1.5e10,
                               2.5e-7,
                               256ull << 20,
                               2ull << 20};
  c.nvme =
      NvmeCalibration{"/var/lib/cxlkv", 128ull << 20, 7.2e-5, 4.8e-5, 1.86e9, 105739, 16, 1 << 20};
  c.measured_at = "2026-11-21T10:00:00Z";
  c.duration_s = 1.93;
  return c;
}

TEST(Calibration, JsonRoundTripAndApply) {
  const Calibration c = SampleCalibration();
  auto back = CalibrationFromJson(CalibrationToJson(c), "t.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);

  PlacementParams p;
  const std::vector<std::string> changes = ApplyCalibration(c, &p);
  EXPECT_EQ(changes.size(), 5u);
  EXPECT_EQ(p.cxl[1].figures.read_bytes_per_s, 1.7e10);
  EXPECT_EQ(p.cxl[1].figures.latency_s, 2.5e-7);
  EXPECT_EQ(p.cxl[0].figures.read_bytes_per_s, PlacementParams{}.cxl[0].figures.read_bytes_per_s);
  EXPECT_EQ(p.nvme.read_bytes_per_s, 1.86e9);
  EXPECT_EQ(p.nvme.latency_s, 7.2e-5);
  EXPECT_EQ(p.nvme_iops, 105739);
  Calibration dram = c;
  dram.memory->tier = "dram";
  dram.nvme.reset();
  PlacementParams q;
  EXPECT_TRUE(ApplyCalibration(dram, &q).empty()) << "DRAM figures describe no CXL tier";
}

TEST(Calibration, BadJsonNamesTheField) {
  struct Case {
    std::string json, want;
  } cases[] = {
      {"[1]", "t.json: (file): not a JSON object"},
      {"{\"format\":\"other\"}", "t.json: format:"},
      {"{\"format\":{}}", "t.json: format:"},
      {"{\"format\":[1,2]}", "t.json: format:"},
      {"{\"format\":\"cxlkv-calibration\",\"version\":2}", "t.json: version: expected 1"},
      {"{\"format\":\"cxlkv-calibration\",\"version\":1,\"measured_at\":\"x\"}", "holds neither"},
      {"{\"format\":\"cxlkv-calibration\",\"version\":1,\"measured_at\":\"x\",\"nvme\":{\"dir\":\"/"
       "d\","
       "\"file_bytes\":1,\"latency_qd1_s\":-1}}",
       "t.json: nvme.latency_qd1_s: -1 is not a positive figure"},
      {"{\"format\":\"cxlkv-calibration\",\"version\":1,\"measured_at\":\"x\",\"memory\":{"
       "\"source\":\"a\","
       "\"tier\":\"hbm\"}}",
       "t.json: memory.tier: 'hbm'"},
  };
  for (const Case& c : cases) {
    auto got = CalibrationFromJson(c.json, "t.json");
    ASSERT_FALSE(got.ok()) << c.json;
    EXPECT_NE(got.status().message().find(c.want), std::string::npos)
        << "got: " << got.status().message() << "\nwant: " << c.want;
  }
}

// Each figure is positive and finite, yet the rule cannot take it (found by
// fuzz/placement_fuzz): refused when the file is read, naming the file and the rule's field.
TEST(Calibration, FiguresTheRuleRefusesAreRefusedAtLoad) {
  Calibration c = SampleCalibration();
  c.memory->latency_s = 0.028;  // 28 ms: not memory
  auto got = CalibrationFromJson(CalibrationToJson(c), "t.json");
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(got.status()));
  EXPECT_NE(got.status().message().find("t.json: a figure is outside"), std::string::npos)
      << got.status();
  EXPECT_NE(got.status().message().find("latency_ns"), std::string::npos) << got.status();
}

// Real measurements, small and short; only their shape is checked (no timing assertions).
TEST(Calibration, MeasuresMemoryAndNvmeAndSavesThem) {
  CalibrateOptions o;
  o.budget_s = 0.3;
  o.memory_bytes = 16ull << 20;
  o.nvme_file_bytes = 16ull << 20;
  o.nvme_depth = 4;
  const cxlkv::testing::TempDir scratch("cal", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.path();
  auto c = Calibrate(nullptr, dir, o);
  if (!c.ok() && absl::IsFailedPrecondition(c.status())) GTEST_SKIP() << c.status();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->memory && c->nvme);
  EXPECT_EQ(c->memory->tier, "dram");
  EXPECT_GT(c->memory->read_bytes_per_s, 0);
  EXPECT_GT(c->memory->write_bytes_per_s, 0);
  EXPECT_GT(c->memory->latency_s, 0);
  EXPECT_GT(c->nvme->latency_qd1_s, 0);
  EXPECT_GT(c->nvme->read_bytes_per_s, 0);
  EXPECT_GT(c->nvme->iops, 0);
  EXPECT_GE(c->nvme->file_bytes, 8ull << 20);
  const std::string file = std::string(dir) + "/cal.json";
  ASSERT_TRUE(SaveCalibration(*c, file).ok());
  auto back = LoadCalibration(file);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
  std::remove(file.c_str());
  EXPECT_EQ(::rmdir(dir.c_str()), 0) << "the scratch file is gone";
}

TEST(Calibration, RefusesAnArenaAndBadDirectories) {
  auto arena = testing::MustFormat("memfd:cal?size=16M", pool::FormatOptions{});
  ASSERT_NE(arena, nullptr);
  CalibrateOptions o;
  o.budget_s = 0.1;
  auto c = Calibrate(&arena->region(), "", o);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("holds a cxlkv arena"), std::string::npos);
  auto n = CalibrateNvme("/nonexistent-cxlkv-dir", 0.1, o);
  EXPECT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("/nonexistent-cxlkv-dir"), std::string::npos);
  // tmpfs is memory: measuring it as NVMe would be wrong even where it accepts O_DIRECT.
  if (::access("/dev/shm", W_OK) == 0) {
    auto shm = CalibrateNvme("/dev/shm", 0.1, o);
    EXPECT_TRUE(absl::IsFailedPrecondition(shm.status())) << shm.status();
    EXPECT_NE(shm.status().message().find("tmpfs"), std::string::npos) << shm.status();
  }
}

// ---- configuration ----------------------------------------------------------------------

const char kMinimal[] = R"([domain]
pool = "file:/dev/shm/p?size=1G"
prefix_domain = "memfd:?size=16M"
extent_size = "64M"
state_file = "/tmp/x.state"
[rpc]
socket = "/tmp/x.sock"
[[namespace]]
tenant = "acme"
model = "m"
layout = "l"
pin = 3
)";

TEST(PlacementConfig, ExampleAndKeysParse) {
  const PlacementParams p = ExampleConfigParams();
  EXPECT_TRUE(p.Validate().ok());
  EXPECT_EQ(p.ttft_budget_s, 0.5);
  EXPECT_EQ(p.nvme.read_bytes_per_s, 14e9);
  EXPECT_EQ(p.nvme_drive_bytes, 7.68e12);
  const std::string text = std::string(kMinimal) + R"([placement]
ttft_budget_ms = 250
cxl_tiers = ["pooled"]
cxl_pooled_latency_ns = 600
cxl_pooled_read_gbps = 20
nvme_drive_size = "4T"
low_watermark = 0.6
high_watermark = 0.7
pin_level = 3
cooldown_ms = 100
tracker_entries = 1024
reuse_ewma_alpha = 0.5
calibration = "/tmp/cal.json"
)";
  auto c = ParsePlacementConfig(text, "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->params.ttft_budget_s, 0.25);
  EXPECT_FALSE(c->params.cxl[0].present);
  EXPECT_TRUE(c->params.cxl[1].present);
  EXPECT_DOUBLE_EQ(c->params.cxl[1].figures.latency_s, 600e-9);
  EXPECT_EQ(c->params.cxl[1].figures.read_bytes_per_s, 20e9);
  EXPECT_EQ(c->params.nvme_drive_bytes, 4.0 * (1ull << 40));
  EXPECT_EQ(c->params.pin_level, 3);
  EXPECT_DOUBLE_EQ(c->params.cooldown_s, 0.1);
  EXPECT_EQ(c->reuse_tracker.entries, 1024u);
  EXPECT_EQ(c->reuse_tracker.alpha, 0.5);
  EXPECT_EQ(c->calibration, "/tmp/cal.json");
}

TEST(PlacementConfig, NoSectionKeepsTheDefaults) {
  auto c = ParsePlacementConfig(kMinimal, "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  const PlacementParams d;
  EXPECT_EQ(c->params.ttft_budget_s, d.ttft_budget_s);
  EXPECT_EQ(c->params.nvme.read_bytes_per_s, d.nvme.read_bytes_per_s);
  EXPECT_EQ(c->reuse_tracker.entries, ReuseTrackerOptions{}.entries);
  EXPECT_TRUE(c->calibration.empty());
  // A document that is not TOML names its line.
  auto bad = ParsePlacementConfig("[placement\n", "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_EQ(bad.status().message().rfind("t.toml:1: ", 0), 0u) << bad.status();
  // So does a [placement] that is not a table.
  auto scalar = ParsePlacementConfig("placement = 3\n", "t.toml");
  ASSERT_FALSE(scalar.ok());
  EXPECT_NE(scalar.status().message().find("t.toml:1: key 'placement': expected a table"),
            std::string::npos)
      << scalar.status();
}

TEST(PlacementConfig, ErrorsNameTheKeyAndLine) {
  struct Case {
    std::string extra, want;
  } cases[] = {
      {"[placement]\nttft_budget = 5\n", "t.toml:14: key 'placement.ttft_budget': unknown key"},
      {"[placement]\nnvme_read_gbps = \"fast\"\n",
       "t.toml:14: key 'placement.nvme_read_gbps': expected a number"},
      {"[placement]\nlow_watermark = 1.5\n",
       "t.toml:14: key 'placement.low_watermark': 1.5 is out of range"},
      {"[placement]\npin_level = 4\n",
       "t.toml:14: key 'placement.pin_level': 4 is out of range [0, 3]"},
      {"[placement]\ncxl_tiers = [\"hbm\"]\n",
       "t.toml:14: key 'placement.cxl_tiers': unknown CXL tier 'hbm'"},
      {"[placement]\ncxl_tiers = [\"pooled\", \"pooled\"]\n",
       "t.toml:14: key 'placement.cxl_tiers': a tier is listed twice"},
      {"[placement]\ncxl_tiers = []\n",
       "t.toml:14: key 'placement.cxl_tiers': expected a non-empty array"},
      {"[placement]\nnvme_drive_size = \"7X\"\n", "t.toml:14: key 'placement.nvme_drive_size':"},
      {"[placement]\nlow_watermark = 0.9\nhigh_watermark = 0.5\n",
       "t.toml:15: key 'placement.high_watermark': 0.5 must be above low_watermark (0.9)"},
      {"[placement]\ntracker_entries = 8\n",
       "t.toml:14: key 'placement.tracker_entries': 8 is out of range"},
  };
  for (const Case& c : cases) {
    auto got = ParsePlacementConfig(std::string(kMinimal) + c.extra, "t.toml");
    ASSERT_FALSE(got.ok()) << c.extra;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status()));
    EXPECT_NE(got.status().message().find(c.want), std::string::npos)
        << "got: " << got.status().message() << "\nwant: " << c.want;
  }
}

}  // namespace
}  // namespace cxlkv::tier
