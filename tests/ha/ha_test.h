// The HA tests' fixture (tests/ha/*_test.cc): a 3-member etcd cluster on loopback
// (tests/etcd_cluster.h) and the files of one domain, shared by the test's cxlkv-orchestrator
// processes (tests/ha/ha_orchestrator.h), each with its own socket and state-file cache. Hosts
// are played by the test through the control-plane stub (join, grow, heartbeat).
//
// Checks after each failure: one leader serves grants, the state (membership, extents)
// survived, no extent is lent twice, and an audit of the domain's fence line (sampled every
// millisecond from the shared file, tests/ha/fence_audit.h) shows no epoch writing after a
// newer one started.
//
// Skipped without Debian's etcd-server. CXLKV_HA_TRIALS sets the failover trials of the
// measurements (default 3; the stress label runs 20 and prints the median and worst).
#ifndef CXLKV_TESTS_HA_HA_TEST_H_
#define CXLKV_TESTS_HA_HA_TEST_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/orchestrator/client.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/ha_orchestrator.h"

namespace cxlkv::testing {

class HaTest : public EtcdClusterTest {
 protected:
  // The one orchestrator that serves now (nullptr: none, or more than one).
  HaOrchestrator* Leader(const std::vector<HaOrchestrator*>& all) {
    HaOrchestrator* found = nullptr;
    for (HaOrchestrator* o : all) {
      if (o->pid > 0 && o->Role() == "leader") {
        if (found != nullptr) return nullptr;
        found = o;
      }
    }
    return found;
  }
  // The re-attach measurements' setup: orchestrators a (the leader), b and c (standbys), each
  // with `env` on top of the test's environment when given one, and `n_hosts` hosts that
  // joined, grew one extent each and heartbeat every 100 ms, the even ones through the
  // endpoint list, the odd ones through etcd discovery.
  struct ReattachBed {
    std::vector<std::unique_ptr<HaOrchestrator>> orch;
    std::vector<std::unique_ptr<orch::HostClient>> hosts;
    std::map<std::uint32_t, std::set<std::uint32_t>> granted;
    std::vector<std::uint64_t> incs;
    // Waits (20 s) until every host follows a leader of an epoch above `old_epoch`; (*at)[h]
    // is the ms from `t0` at which host h was first seen doing so.
    bool WaitForEveryHost(std::int64_t old_epoch, std::int64_t t0,
                          std::vector<std::int64_t>* at) const {
      at->assign(hosts.size(), -1);
      return Eventually(
          [&] {
            bool every = true;
            for (std::size_t h = 0; h < hosts.size(); ++h) {
              if ((*at)[h] < 0 && hosts[h]->leader_epoch() > old_epoch) (*at)[h] = NowMs() - t0;
              every = every && (*at)[h] >= 0;
            }
            return every;
          },
          std::chrono::milliseconds(20000));
    }
    std::vector<HaOrchestrator*> all() const {
      std::vector<HaOrchestrator*> v;
      for (const auto& o : orch) v.push_back(o.get());
      return v;
    }
  };
  ::testing::AssertionResult StartReattachBed(std::uint32_t n_hosts,
                                              const std::vector<std::vector<std::string>>& env,
                                              ReattachBed* bed) {
    const char* names[] = {"a", "b", "c"};
    for (std::size_t i = 0; i < 3; ++i) {
      bed->orch.push_back(
          std::make_unique<HaOrchestrator>(d_, *etcd_, names[i], 3, 60000, 0, n_hosts));
      if (i < env.size()) bed->orch.back()->env = env[i];
    }
    if (auto started =
            StartLeaderAndStandbys(*bed->orch[0], {bed->orch[1].get(), bed->orch[2].get()});
        !started) {
      return started;
    }
    std::string list;
    for (auto& o : bed->orch) absl::StrAppend(&list, list.empty() ? "" : ",", o->socket);
    const std::string spec = EtcdSpec(*etcd_, "hatest");
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      auto c = orch::HostClient::Connect(h % 2 == 0 ? list : spec, h);
      if (!c.ok()) return ::testing::AssertionFailure() << "host " << h << ": " << c.status();
      auto g = (*c)->Grow(1);
      if (!g.ok()) return ::testing::AssertionFailure() << "host " << h << ": " << g.status();
      for (const auto& e : *g) bed->granted[h].insert(e.index);
      (*c)->StartHeartbeats();
      bed->incs.push_back((*c)->incarnation());
      bed->hosts.push_back(*std::move(c));
    }
    return ::testing::AssertionSuccess();
  }
  // After the trials: no host rejoined, each holds what it was granted, the leader lends
  // nothing twice; then the hosts leave.
  void ExpectReattachBedIntact(ReattachBed& bed) {
    for (std::uint32_t h = 0; h < bed.hosts.size(); ++h) {
      EXPECT_EQ(bed.hosts[h]->rejoins(), 0u) << "host " << h;
      std::set<std::uint32_t> held;
      for (const auto& e : bed.hosts[h]->extents()) held.insert(e.index);
      EXPECT_EQ(held, bed.granted[h]) << "host " << h;
    }
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(Eventually([&] { return (leader = Leader(bed.all())) != nullptr; },
                           std::chrono::milliseconds(10000)));
    ExpectNoExtentLentTwice(*leader, bed.granted);
    for (auto& h : bed.hosts) EXPECT_TRUE(h->Leave().ok());
  }
  SharedDomain d_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_HA_TEST_H_
