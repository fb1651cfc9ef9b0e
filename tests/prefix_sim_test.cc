// The shared-prefix protocol under a seeded simulation: 8 hosts on non-coherent memory with
// crashes, pauses, restarts and drifting clocks; invariants after every step; then every
// host stops and everything must be reclaimed. CXLKV_SIM_STEPS sets the length (the stress
// label runs 10^6 steps), CXLKV_SEED the seed (printed; replay a failure with it).
#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "prefix_sim.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

std::uint64_t Steps() {
  const char* s = std::getenv("CXLKV_SIM_STEPS");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 100000;
}

TEST(PrefixSimulation, EightHostsWithCrashesPausesAndStaleCaches) {
  const std::uint64_t seed = TestSeed();
  const std::uint64_t steps = Steps();
  PrefixSimulation::Config c;
  c.seed = seed;
  PrefixSimulation sim(c);
  const bool ok = sim.Run(steps);
  const auto& st = sim.owner_stats();
  std::printf("simulation seed=%llu steps=%llu: published %llu, duplicates %llu, retired %llu, "
              "reclaimed %llu, evicted %llu, fenced %llu, uses %llu, preemptions %llu\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(st.published),
              static_cast<unsigned long long>(st.duplicates),
              static_cast<unsigned long long>(st.retired),
              static_cast<unsigned long long>(st.reclaimed),
              static_cast<unsigned long long>(st.evicted),
              static_cast<unsigned long long>(st.hosts_fenced),
              static_cast<unsigned long long>(sim.uses()),
              static_cast<unsigned long long>(sim.preemptions()));
  ASSERT_TRUE(ok) << sim.failure() << " (replay: CXLKV_SEED=" << seed << ")";
  // The run exercised what it claims to.
  EXPECT_GT(st.published, 0u);
  EXPECT_GT(st.reclaimed, 0u);
  EXPECT_GT(st.hosts_fenced, 0u);
  EXPECT_GT(sim.uses(), 0u);
  ASSERT_TRUE(sim.Drain()) << sim.failure() << " (replay: CXLKV_SEED=" << seed << ")";
}

}  // namespace
}  // namespace cxlkv::testing
