// placement_benchmark: the cost of one placement decision (with and without filling an
// Explanation) and of one ReuseTracker update, against a plain std::unordered_map EWMA (the
// unbounded structure one would write first) measured in the same run.
//
//   Decide/explain:0|1           one PlacementRule::Decide over 4,096 varied blocks
//   ExplainText                  Decide + Explanation::ToText (the CLI path)
//   TrackerRecord/entries:N/keys:K    Record() of K distinct keys (zipf-like mix) into N slots
//   UnorderedMapEwma/keys:K      the same updates into std::unordered_map
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "cxlkv/tier/placement.h"
#include "cxlkv/tier/reuse_tracker.h"

namespace {

using cxlkv::tier::BlockInputs;
using cxlkv::tier::Explanation;
using cxlkv::tier::PlacementParams;
using cxlkv::tier::PlacementRule;

std::vector<BlockInputs> Blocks() {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<BlockInputs> v(4096);
  for (BlockInputs& b : v) {
    b.size_bytes = static_cast<std::uint64_t>(std::exp(std::log(65536.0) + u(rng) * std::log(2e5)));
    b.reuse_interval_s =
        u(rng) < 0.1 ? cxlkv::tier::kNoReuse : std::exp(std::log(1e-3) + u(rng) * 18);
    b.tokens = static_cast<std::uint32_t>(b.size_bytes / 327680 + 1);
    b.queue_depth = static_cast<std::uint32_t>(u(rng) * 32);
    b.occupancy = {u(rng), u(rng)};
    b.pin_level = u(rng) < 0.05 ? 3 : 0;
  }
  return v;
}

void BM_Decide(benchmark::State& state) {
  const PlacementRule rule = *PlacementRule::Create(PlacementParams{});
  const std::vector<BlockInputs> blocks = Blocks();
  const bool explain = state.range(0) != 0;
  Explanation why;
  std::size_t i = 0;
  for (auto _ : state) {
    const auto d = explain ? rule.Decide(blocks[i], &why) : rule.Decide(blocks[i]);
    benchmark::DoNotOptimize(d);
    i = (i + 1) & 4095;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Decide)->ArgName("explain")->Arg(0)->Arg(1);

void BM_ExplainText(benchmark::State& state) {
  const PlacementRule rule = *PlacementRule::Create(PlacementParams{});
  const std::vector<BlockInputs> blocks = Blocks();
  Explanation why;
  std::size_t i = 0;
  for (auto _ : state) {
    rule.Decide(blocks[i], &why);
    benchmark::DoNotOptimize(why.ToText());
    i = (i + 1) & 4095;
  }
}
BENCHMARK(BM_ExplainText);

// Keys drawn from a skewed mix: 80 % of uses go to 20 % of the keys.
std::vector<cxlkv::coherence::PrefixKey> KeyStream(std::int64_t keys) {
  std::mt19937_64 rng(2);
  std::uniform_int_distribution<std::int64_t> hot(0, std::max<std::int64_t>(keys / 5, 1) - 1);
  std::uniform_int_distribution<std::int64_t> any(0, keys - 1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<cxlkv::coherence::PrefixKey> v(1 << 20);
  for (auto& k : v) {
    const std::uint64_t id = static_cast<std::uint64_t>(u(rng) < 0.8 ? hot(rng) : any(rng));
    k = {id * 0x9E3779B97F4A7C15ull + 0x1234567ull, id * 0xC2B2AE3D27D4EB4Full};
  }
  return v;
}

void BM_TrackerRecord(benchmark::State& state) {
  auto tracker =
      *cxlkv::tier::ReuseTracker::Create({static_cast<std::uint32_t>(state.range(0)), 0.25});
  const auto keys = KeyStream(state.range(1));
  std::uint64_t now = 0;
  std::size_t i = 0;
  for (auto _ : state) {
    tracker.Record(keys[i], now += 1000, 5 << 20, 16);
    i = (i + 1) & 0xFFFFF;
  }
  state.counters["memory_bytes"] = static_cast<double>(tracker.memory_bytes());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TrackerRecord)
    ->ArgNames({"entries", "keys"})
    ->Args({65536, 16384})
    ->Args({65536, 1 << 20})
    ->Args({1 << 22, 1 << 20});

struct KeyHash {
  std::size_t operator()(const cxlkv::coherence::PrefixKey& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};
struct MapEntry {
  std::uint64_t last_seen_ns = 0;
  double ewma_s = 0;
  std::uint32_t uses = 0;
};

void BM_UnorderedMapEwma(benchmark::State& state) {
  std::unordered_map<cxlkv::coherence::PrefixKey, MapEntry, KeyHash> map;
  const auto keys = KeyStream(state.range(0));
  std::uint64_t now = 0;
  std::size_t i = 0;
  for (auto _ : state) {
    now += 1000;
    MapEntry& e = map[keys[i]];
    if (e.uses > 0) {
      const double iv = static_cast<double>(now - e.last_seen_ns) * 1e-9;
      e.ewma_s = e.uses == 1 ? iv : 0.25 * iv + 0.75 * e.ewma_s;
    }
    ++e.uses;
    e.last_seen_ns = now;
    i = (i + 1) & 0xFFFFF;
  }
  state.counters["entries"] = static_cast<double>(map.size());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UnorderedMapEwma)->ArgName("keys")->Arg(16384)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
