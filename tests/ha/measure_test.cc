// Orchestrator HA (docs/ha.md), measurements: failover time after kill -9 of the leader,
// every host re-attached, etcd writes per second with many hosts, prefix leases served during
// a failover and an etcd outage (DISABLED_). bench/RESULTS.md has the commands and figures.
// The fixture: tests/ha/ha_test.h.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/cxl_host.h"
#include "ha/fence_audit.h"
#include "ha/ha_orchestrator.h"
#include "ha/ha_test.h"
#include "ha/http.h"
#include "orchestrator_process.h"

namespace cxlkv::testing {
namespace {

// Failover time after kill -9 of the leader (to a Grow served by the new leader), over
// CXLKV_HA_TRIALS trials (default 3): median and worst, printed.
TEST_F(HaTest, FailoverTimeAfterKillNine) {
  int trials = 3;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::vector<std::unique_ptr<HaOrchestrator>> orch;
  for (const char* n : {"a", "b", "c"})
    orch.push_back(std::make_unique<HaOrchestrator>(d_, *etcd_, n));
  ASSERT_TRUE(StartLeaderAndStandbys(*orch[0], {orch[1].get(), orch[2].get()}));
  FenceAudit audit(d_.domain);
  std::uint64_t inc = 0;
  ASSERT_TRUE(HostCalls::Join(*orch[0], 0, &inc).ok());
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::vector<std::int64_t> times;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<HaOrchestrator*> all;
    for (auto& o : orch) all.push_back(o.get());
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(Eventually([&] { return (leader = Leader(all)) != nullptr; }, milliseconds(10000)));
    leader->Kill(SIGKILL);
    const std::int64_t t0 = NowMs();
    std::vector<std::uint32_t> got;
    // The old leader is not asked: killed, its pid is gone.
    HaOrchestrator* next = FirstToGrant(all, 0, inc, milliseconds(20000), &got);
    ASSERT_NE(next, nullptr) << "trial " << trial << ": no standby served a grant";
    times.push_back(NowMs() - t0);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(granted[0].insert(got[0]).second)
        << "trial " << trial << ": extent " << got[0] << " lent twice";
    // Every extent granted so far is still host 0's at the new leader.
    ExpectNoExtentLentTwice(*next, granted);
    ASSERT_TRUE(leader->Start());  // back as a standby
  }
  EXPECT_EQ(audit.Regression(), 0u);
  std::vector<std::int64_t> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const std::int64_t median = sorted[sorted.size() / 2];
  const std::int64_t worst = sorted.back();
  std::string all_times;
  for (std::int64_t t : times) absl::StrAppend(&all_times, all_times.empty() ? "" : " ", t);
  std::printf(
      "failover (kill -9 of the leader -> a grant served), ttl 3 s, %d trials: median %lld "
      "ms, worst %lld ms [%s]\n",
      trials, static_cast<long long>(median), static_cast<long long>(worst), all_times.c_str());
  EXPECT_LT(median, 5000);
}

// Failover with several hosts following the leader: kill -9 of the leader, then the time until
// every host's heartbeat thread has been answered by the new leader (its leader epoch grew),
// over CXLKV_HA_TRIALS trials (default 1; 20 under the stress label as
// orchestrator_ha_reattach_20) with CXLKV_HA_HOSTS hosts (default 8): half follow through
// their endpoint list, half find the leader in etcd. Median and worst, printed; every host
// keeps its incarnation and extents, nothing is lent twice.
TEST_F(HaTest, EveryHostReattachedAfterKillNine) {
  int trials = 1;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  ReattachBed bed;
  ASSERT_TRUE(StartReattachBed(n_hosts, {}, &bed));
  auto& hosts = bed.hosts;
  const auto& incs = bed.incs;
  FenceAudit audit(d_.domain);
  std::vector<std::int64_t> all, by_list, by_etcd;
  for (int trial = 0; trial < trials; ++trial) {
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(
        Eventually([&] { return (leader = Leader(bed.all())) != nullptr; }, milliseconds(10000)));
    std::int64_t old_epoch = 0;
    for (auto& h : hosts) old_epoch = std::max(old_epoch, h->leader_epoch());
    leader->Kill(SIGKILL);
    const std::int64_t t0 = NowMs();
    std::vector<std::int64_t> at;
    ASSERT_TRUE(bed.WaitForEveryHost(old_epoch, t0, &at))
        << "trial " << trial << ": not every host re-attached";
    std::int64_t worst_list = 0, worst_etcd = 0;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      (h % 2 == 0 ? worst_list : worst_etcd) =
          std::max(h % 2 == 0 ? worst_list : worst_etcd, at[h]);
      EXPECT_EQ(hosts[h]->incarnation(), incs[h]) << "trial " << trial << " host " << h;
      EXPECT_TRUE(hosts[h]->ExtentsValid()) << "trial " << trial << " host " << h;
    }
    all.push_back(std::max(worst_list, worst_etcd));
    by_list.push_back(worst_list);
    by_etcd.push_back(worst_etcd);
    ASSERT_TRUE(leader->Start());  // back as a standby
  }
  ExpectReattachBedIntact(bed);
  EXPECT_EQ(audit.Regression(), 0u);
  auto summary = [](std::vector<std::int64_t> v) {
    std::sort(v.begin(), v.end());
    return absl::StrCat("median ", v[v.size() / 2], " ms, worst ", v.back(), " ms");
  };
  std::string times;
  for (std::int64_t t : all) absl::StrAppend(&times, times.empty() ? "" : " ", t);
  std::printf(
      "kill -9 of the leader -> all %u hosts re-attached (heartbeat 100 ms, ttl 3 s), %d trials: "
      "%s [%s]; endpoint-list hosts %s; etcd-discovery hosts %s\n",
      n_hosts, trials, summary(all).c_str(), times.c_str(), summary(by_list).c_str(),
      summary(by_etcd).c_str());
}

// etcd writes at CXLKV_HA_HOSTS hosts (default 8; 64 under the stress label as
// orchestrator_ha_etcd_writes_64): the hosts join, heartbeat (every 100 ms) for a while, then
// each grows and shrinks one extent in a loop for CXLKV_HA_CHURN_S seconds (default 1). etcd's
// own counters (mvcc txns and puts, raft proposals committed, from its /metrics) and the
// leader's guarded state writes give the writes per second of each phase; printed.
TEST_F(HaTest, EtcdWritesPerSecondWithManyHosts) {
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  double churn_s = 1;
  if (const char* c = std::getenv("CXLKV_HA_CHURN_S")) churn_s = std::max(1.0, std::atof(c));
  const std::vector<int> ports = FreeLoopbackPorts(1);
  HaOrchestrator a(d_, *etcd_, "a", 3, 60000, ports[0], n_hosts),
      b(d_, *etcd_, "b", 3, 60000, 0, n_hosts);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  // One member's counters: every member applies the same writes.
  const int etcd_port = std::atoi(etcd_->endpoints()[0].substr(10).c_str());
  struct Counts {
    double txn = 0, put = 0, proposals = 0, state_writes = 0, etcd_s = 0, etcd_n = 0;
    std::int64_t at_ms = 0;
  };
  auto sample = [&] {
    Counts c;
    const std::string e = Metrics(etcd_port);
    c.txn = MetricValue(e, "etcd_mvcc_txn_total");
    c.put = MetricValue(e, "etcd_mvcc_put_total");
    c.proposals = MetricValue(e, "etcd_server_proposals_committed_total");
    const std::string m = Metrics(ports[0]);
    c.state_writes = MetricValue(m, "cxlkv_ha_state_writes_total");
    c.etcd_s = MetricValue(m, "cxlkv_ha_etcd_request_seconds_sum");
    c.etcd_n = MetricValue(m, "cxlkv_ha_etcd_request_seconds_count");
    c.at_ms = NowMs();
    return c;
  };
  auto report = [&](const char* phase, const Counts& x, const Counts& y) {
    const double s = static_cast<double>(y.at_ms - x.at_ms) / 1000.0;
    std::printf(
        "%u hosts, %s (%.1f s): etcd txn %.1f/s, put %.1f/s, raft proposals %.1f/s; leader's "
        "state writes %.1f/s, its etcd requests %.2f ms on average\n",
        n_hosts, phase, s, (y.txn - x.txn) / s, (y.put - x.put) / s,
        (y.proposals - x.proposals) / s, (y.state_writes - x.state_writes) / s,
        y.etcd_n > x.etcd_n ? 1000 * (y.etcd_s - x.etcd_s) / (y.etcd_n - x.etcd_n) : 0.0);
    return (y.state_writes - x.state_writes) / s;
  };
  ASSERT_TRUE(Eventually([&] { return sample().state_writes >= 0; }, milliseconds(5000)));
  Counts c0 = sample();
  std::vector<std::unique_ptr<orch::HostClient>> hosts(n_hosts);
  {
    std::vector<std::thread> joins;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      joins.emplace_back([&, h] {
        auto c = orch::HostClient::Connect(a.socket, h);
        ASSERT_TRUE(c.ok()) << "host " << h << ": " << c.status();
        (*c)->StartHeartbeats();
        hosts[h] = *std::move(c);
      });
    }
    for (auto& t : joins) t.join();
  }
  for (auto& h : hosts) ASSERT_NE(h, nullptr);
  // The leader's metrics are refreshed every 200 ms: let them catch up with the joins.
  std::this_thread::sleep_for(milliseconds(400));
  Counts c1 = sample();
  report("joining", c0, c1);
  std::this_thread::sleep_for(milliseconds(static_cast<std::int64_t>(churn_s * 1000)));
  Counts c2 = sample();
  report("heartbeats only", c1, c2);
  EXPECT_EQ(c2.txn, c1.txn) << "heartbeats should not write etcd";
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> grows{0}, failures{0};
  absl::Mutex first_mu;
  std::string first_failure;
  auto failed = [&](const absl::Status& st) {
    ++failures;
    absl::MutexLock l(&first_mu);
    if (first_failure.empty()) first_failure = st.ToString();
  };
  std::vector<std::thread> churn;
  for (std::uint32_t h = 0; h < n_hosts; ++h) {
    churn.emplace_back([&, h] {
      while (!stop.load()) {
        auto g = hosts[h]->Grow(1);
        if (!g.ok() || g->empty()) {
          failed(g.ok() ? absl::ResourceExhaustedError("granted none") : g.status());
          std::this_thread::sleep_for(milliseconds(20));
          continue;
        }
        ++grows;
        std::vector<std::uint32_t> back;
        for (const auto& e : *g) back.push_back(e.index);
        if (auto st = hosts[h]->Shrink(back); !st.ok()) failed(st);
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(static_cast<std::int64_t>(churn_s * 1000)));
  Counts c3 = sample();
  stop = true;
  for (auto& t : churn) t.join();
  const double busy = report("every host growing and shrinking in a loop", c2, c3);
  struct stat sb {};
  const long long state_bytes =
      ::stat((a.dir + "/d.state").c_str(), &sb) == 0 ? static_cast<long long>(sb.st_size) : -1;
  std::printf(
      "%u hosts churning: %llu grows (each followed by a shrink), %llu refused or failed%s%s; "
      "the state each write carries: %lld bytes\n",
      n_hosts, static_cast<unsigned long long>(grows.load()),
      static_cast<unsigned long long>(failures.load()),
      first_failure.empty() ? "" : ", first: ", first_failure.c_str(), state_bytes);
  EXPECT_GT(busy, 1.0);
  EXPECT_GT(grows.load(), 0u);
  for (auto& h : hosts) EXPECT_TRUE(h->Leave().ok());
}

// Prefix-lease attempts of a CXL host, counted per 100 ms from a start time, by a thread
// that also heartbeats the host through CXL every 100 ms (what a serving host does).
class LeaseProbe {
 public:
  LeaseProbe(CxlHost& host, const co::PrefixKey& key) : host_(host), key_(key) {
    thread_ = std::thread([this] { Run(); });
  }
  ~LeaseProbe() { Stop(); }
  void Stop() {
    if (!stop_.exchange(true)) thread_.join();
  }
  // Attempts and leases granted with times in [from, to) (ms, NowMs()).
  std::pair<std::uint64_t, std::uint64_t> Count(std::int64_t from, std::int64_t to) {
    absl::MutexLock l(&mu_);
    std::uint64_t tried = 0, served = 0;
    for (const auto& [at, ok] : attempts_) {
      if (at < from || at >= to) continue;
      ++tried;
      served += ok ? 1 : 0;
    }
    return {tried, served};
  }
  // The first refused attempt at or after `from`, and the first granted one after that (-1:
  // none).
  std::pair<std::int64_t, std::int64_t> Gap(std::int64_t from) {
    absl::MutexLock l(&mu_);
    std::int64_t refused = -1, back = -1;
    for (const auto& [at, ok] : attempts_) {
      if (at < from) continue;
      if (refused < 0 && !ok) refused = at;
      if (refused >= 0 && ok) {
        back = at;
        break;
      }
    }
    return {refused, back};
  }

 private:
  void Run() {
    std::int64_t next_beat = 0;
    while (!stop_.load()) {
      const std::int64_t now = NowMs();
      if (now >= next_beat) {
        (void)host_->Heartbeat(nullptr);
        next_beat = now + 100;
      }
      const bool ok = host_.AcquireAndRelease(key_).ok();
      {
        absl::MutexLock l(&mu_);
        attempts_.emplace_back(now, ok);
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  CxlHost& host_;
  const co::PrefixKey key_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::pair<std::int64_t, bool>> attempts_ ABSL_GUARDED_BY(mu_);
};

// Issue #29, measured: the fraction of a host's prefix-lease attempts (one every 5 ms, of a
// published block, through CXL alone) served during a kill -9 fail-over of the leader and
// during an etcd outage (two of three members stopped for 6 s). A measurement, not a check
// of a target: DISABLED_, run by hand with --gtest_also_run_disabled_tests (bench/RESULTS.md
// has the command and the figures). Each window runs from the failure until a leader serves
// again (a Join answered) plus 1 s; the gap is from the first refused attempt to the next
// granted one.
TEST_F(HaTest, DISABLED_LeaseAttemptsServedDuringFailoverAndEtcdOutage) {
  // host_ttl 2 s, the daemon's default: a prefix lease needs a heartbeat the owner
  // acknowledged less than host_ttl − margin (1.5 s) ago.
  HaOrchestrator a(d_, *etcd_, "a", 3, 2000), b(d_, *etcd_, "b", 3, 2000);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  CxlHost host(d_.domain);
  const co::PrefixKey key = host.Key({4, 5, 6});
  ASSERT_TRUE(host.PublishAndWait(key, TestRef(7, 3)));
  LeaseProbe probe(host, key);
  std::this_thread::sleep_for(milliseconds(1000));
  const auto before = probe.Count(NowMs() - 1000, NowMs());
  auto report = [&](const char* what, std::int64_t t0, std::int64_t served_again) {
    const auto [tried, served] = probe.Count(t0, served_again + 1000);
    const auto [refused, back] = probe.Gap(t0);
    std::printf(
        "%s: %llu of %llu lease attempts served (%.1f %%) from the failure until 1 s after a "
        "leader served again (%lld ms); first refusal %lld ms in, leases back %lld ms in\n",
        what, static_cast<unsigned long long>(served), static_cast<unsigned long long>(tried),
        tried == 0 ? 0.0 : 100.0 * static_cast<double>(served) / static_cast<double>(tried),
        static_cast<long long>(served_again - t0),
        static_cast<long long>(refused < 0 ? -1 : refused - t0),
        static_cast<long long>(back < 0 ? -1 : back - t0));
  };
  std::printf("before: %llu of %llu attempts served in 1 s\n",
              static_cast<unsigned long long>(before.second),
              static_cast<unsigned long long>(before.first));
  EXPECT_EQ(before.first, before.second);

  // kill -9 of the leader.
  const std::int64_t killed = NowMs();
  a.Kill(SIGKILL);
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(Eventually([&] { return HostCalls::Join(b, 1, &inc1).ok(); }, milliseconds(15000)));
  const std::int64_t b_serves = NowMs();
  std::this_thread::sleep_for(milliseconds(1500));
  report("kill -9 of the leader", killed, b_serves);

  // etcd outage: two of three members stopped for 6 s.
  const int l = etcd_->LeaderIndex();
  ASSERT_GE(l, 0);
  const int f = (l + 1) % 3;
  const std::int64_t paused = NowMs();
  etcd_->Pause(l);
  etcd_->Pause(f);
  std::this_thread::sleep_for(milliseconds(6000));
  etcd_->Resume(l);
  etcd_->Resume(f);
  std::uint64_t inc3 = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        HaOrchestrator* leader = Leader({&b, &a});
        return leader != nullptr && HostCalls::Join(*leader, 3, &inc3).ok();
      },
      milliseconds(20000)));
  const std::int64_t serves_again = NowMs();
  std::this_thread::sleep_for(milliseconds(1500));
  probe.Stop();
  report("etcd outage (6 s, quorum lost)", paused, serves_again);
}

}  // namespace
}  // namespace cxlkv::testing
