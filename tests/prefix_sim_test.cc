// The shared-prefix protocol under a seeded simulation: 8 hosts and an owner on non-coherent
// memory with every failure class of tests/prefix_sim.h on — stale caches, preemption, store
// buffers, asynchronous and torn write-backs, late write-back of dead hosts' lines, crashes
// inside calls (mid-publish, the owner between any two of its stores, a new owner opening the
// same media), suspended and drifting clocks, extents changing hands with their data checked
// on every copy; invariants after every step; then every host stops and everything must be
// reclaimed. CXLKV_SIM_STEPS sets the length (the stress label runs 10^6 steps), CXLKV_SEED
// the seed (printed; replay a failure with it).
#include "prefix_sim.h"

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

std::uint64_t Steps() {
  const char* s = std::getenv("CXLKV_SIM_STEPS");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 100000;
}

unsigned long long U(std::uint64_t v) { return static_cast<unsigned long long>(v); }

void Report(std::uint64_t seed, const PrefixSimulation& sim) {
  const auto st = sim.owner_stats();
  const auto& ev = sim.events();
  const auto& mem = sim.memory_stats();
  std::printf(
      "simulation seed=%llu steps=%llu: published %llu, duplicates %llu, retired %llu, "
      "reclaimed %llu, evicted %llu, fenced %llu, uses %llu, preemptions %llu\n",
      U(seed), U(sim.steps_run()), U(st.published), U(st.duplicates), U(st.retired),
      U(st.reclaimed), U(st.evicted), U(st.hosts_fenced), U(sim.uses()), U(sim.preemptions()));
  std::printf(
      "  store buffer: %llu fills missed a store buffered on another host; %llu loads "
      "ran past own buffered stores, %llu forwarded\n",
      U(mem.missed_buffered), U(mem.reordered_loads), U(mem.forwarded_loads));
  std::printf("  tearing: %llu torn stores, %llu partial write-backs\n", U(mem.torn_stores),
              U(mem.partial_writebacks));
  std::printf("  late write-back: %llu lines landed after their host died, %llu lost\n",
              U(mem.late_lines), U(mem.lost_lines));
  std::printf(
      "  crashes: %llu between calls, %llu inside calls (%llu inside Publish, %llu inside "
      "PublishChain), owner %llu (opened %llu times)\n",
      U(ev.host_crashes), U(ev.host_crashes_in_call), U(ev.publishes_crashed), U(ev.chains_crashed),
      U(ev.owner_crashes), U(ev.owner_opens));
  std::printf("  chains: %llu published in one ring transaction each\n", U(ev.chains_published));
  std::printf("  clocks: %llu host suspends, %llu owner suspends, %llu rate changes\n",
              U(ev.suspends), U(ev.owner_suspends), U(ev.rate_changes));
  std::printf("  extents: %llu given away, %llu lent to another host; %llu copies checked\n",
              U(ev.giveaways), U(ev.extents_reused), U(ev.copies_checked));
}

TEST(PrefixSimulation, EveryFailureClassAtOnce) {
  const std::uint64_t seed = TestSeed();
  const std::uint64_t steps = Steps();
  PrefixSimulation sim(PrefixSimulation::AllFaults(seed));
  const bool ok = sim.Run(steps);
  Report(seed, sim);
  ASSERT_TRUE(ok) << sim.failure() << " (replay: CXLKV_SEED=" << seed << ")";
  // The run exercised what it claims to.
  const auto st = sim.owner_stats();
  const auto& ev = sim.events();
  const auto& mem = sim.memory_stats();
  EXPECT_GT(st.published, 0u);
  EXPECT_GT(st.reclaimed, 0u);
  EXPECT_GT(st.hosts_fenced, 0u);
  EXPECT_GT(sim.uses(), 0u);
  EXPECT_GT(ev.copies_checked, 0u);
  EXPECT_GT(mem.missed_buffered, 0u);
  EXPECT_GT(mem.torn_stores, 0u);
  EXPECT_GT(mem.partial_writebacks, 0u);
  EXPECT_GT(mem.late_lines, 0u);
  EXPECT_GT(ev.host_crashes_in_call, 0u);
  EXPECT_GT(ev.publishes_crashed, 0u);
  EXPECT_GT(ev.chains_published, 0u);
  EXPECT_GT(ev.owner_crashes, 0u);
  EXPECT_GT(ev.suspends, 0u);
  EXPECT_GT(ev.extents_reused, 0u);
  ASSERT_TRUE(sim.Drain()) << sim.failure() << " (replay: CXLKV_SEED=" << seed << ")";
}

}  // namespace
}  // namespace cxlkv::testing
