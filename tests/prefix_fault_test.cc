// The protocol compiled with one flush removed (the lease row's, CXLKV_FAULT_DROP_LEASE_FLUSH)
// must be caught by the non-coherent simulator: the owner cannot see the lease, reclaims the
// block, and a host is found using it under a lease it still believes valid.
#include <cstdio>

#include "gtest/gtest.h"
#include "prefix_sim.h"

namespace cxlkv::testing {
namespace {

TEST(PrefixFault, SimulatorCatchesAMissingLeaseFlush) {
  int caught = 0;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    PrefixSimulation::Config c;
    c.seed = seed;
    c.evict_per_mille = 5;  // caches rarely write the row back on their own
    PrefixSimulation sim(c);
    if (!sim.Run(200000)) {
      ++caught;
      std::printf("seed %llu: caught: %s\n", static_cast<unsigned long long>(seed),
                  sim.failure().c_str());
    }
  }
  EXPECT_GE(caught, 3) << "the simulator must expose the missing flush for most seeds";
}

}  // namespace
}  // namespace cxlkv::testing
