// Orchestrator HA (docs/ha.md), a leader whose clocks do not count a stop (a stopped VM,
// audit-ha #1): in the test's process (VmClock) and with real processes whose CLOCK_BOOTTIME is
// set back on resume (tests/ha/clock_shim.c; DISABLED_, run by the stress and measure labels).
// The fixture: tests/ha/ha_test.h.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/fence_audit.h"
#include "ha/ha_orchestrator.h"
#include "ha/ha_test.h"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

// A stopped VM's clocks (kvmclock): every reading blocks while frozen, and the clock carries
// on from the held value after the thaw, so the stop is never counted. Freeze() stops the
// whole "VM" at each thread's next reading (the owner's inside its batch: the fenced Mem reads
// the clock before every store).
class VmClock final : public co::Clock {
 public:
  std::int64_t NowMs() override {
    absl::MutexLock l(&mu_);
    if (frozen_) {
      ++blocked_;
      mu_.Await(absl::Condition(
          +[](bool* f) { return !*f; }, &frozen_));
    }
    return base_.NowMs() - lost_;
  }
  void Freeze() {
    absl::MutexLock l(&mu_);
    frozen_ = true;
    since_ = base_.NowMs();
  }
  void Thaw() {
    absl::MutexLock l(&mu_);
    lost_ += base_.NowMs() - since_;
    frozen_ = false;
  }
  int blocked() {
    absl::MutexLock l(&mu_);
    return blocked_;
  }

 private:
  co::SteadyClock base_;
  absl::Mutex mu_;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;
  std::int64_t since_ ABSL_GUARDED_BY(mu_) = 0, lost_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

// Audit-ha #1: the leader's VM stops inside an owner batch, long enough for a successor to be
// elected, and its clocks do not count the stop. On resume its own write gate is open (its
// clock says the deadline is still ahead). The successor must not have written anything by
// then: it waits for the release of the old term, which the old leader writes once it learns
// it was deposed (its next keep-alive finds the lease gone) and stops storing. So every store
// of the old term lands before the successor's first, the fence line never goes back to the
// old epoch, and the successor never resigns over a stale line. (Before the release, the
// successor wrote at once and the resumed leader put its old epoch back: checked.)
TEST_F(HaTest, AResumedLeaderWithFrozenClocksStoresNothingAfterItsSuccessor) {
  const cxlkv::testing::TempDir scratch("ha-frozen", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto config = [&](const std::string& node) {
    return orch::ParseConfig(
        "[domain]\nname = \"frozen\"\npool = \"file:" + dir +
            "/pool?size=64M\"\nprefix_domain = \"file:" + dir +
            "/domain?size=4M\"\nextent_size = \"16M\"\nstate_file = \"" + dir + "/" + node +
            ".state\"\nindex_entries = 1024\nmax_hosts = 4\n[rpc]\nsocket = \"" + dir + "/" + node +
            ".sock\"\n[metrics]\nlisten = \"\"\n[etcd]\nendpoints = " + etcd_->EndpointsToml() +
            "\nnode = \"" + node + "\"\nttl_s = 2\n",
        node + ".toml");
  };
  auto ca = config("a"), cb = config("b");
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_TRUE(cb.ok()) << cb.status();
  VmClock vm;
  auto a = orch::Orchestrator::Open(
      *ca, orch::OpenOptions{.new_domain = true, .clock = &vm, .write_back_agent = false});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Start().ok());
  auto role = [](orch::Orchestrator& o) { return o.status().role; };
  auto epoch = [](orch::Orchestrator& o) { return o.status().epoch; };
  ASSERT_TRUE(Eventually([&] { return role(**a) == "leader"; }, milliseconds(10000)));
  const auto epoch_a = static_cast<std::uint64_t>(epoch(**a));
  auto b = orch::Orchestrator::Open(*cb, orch::OpenOptions{.write_back_agent = false});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->Start().ok());
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().epoch == epoch_a && s.back().batches > 5;
      },
      milliseconds(3000)));

  // The VM stops: the owner thread at its next clock reading (inside a batch), the keep-alive
  // thread too; etcd lets the lease expire and b is elected.
  vm.Freeze();
  auto b_elected = [&] { return (*b)->status().leader_epoch > static_cast<std::int64_t>(epoch_a); };
  ASSERT_TRUE(Eventually(b_elected, milliseconds(15000))) << "b was not elected";
  std::this_thread::sleep_for(milliseconds(700));
  EXPECT_GT(vm.blocked(), 0);
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "b wrote the domain while a's term was not released";
  EXPECT_NE(role(**b), "leader");

  // The VM resumes without counting the stop: a's gate is open by its own clock.
  const std::int64_t thawed = NowMs();
  vm.Thaw();
  ASSERT_TRUE(Eventually([&] { return role(**b) == "leader"; }, milliseconds(10000)))
      << "b did not take over once a released its term";
  const auto epoch_b = static_cast<std::uint64_t>(epoch(**b));
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == epoch_b; }, milliseconds(2000)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_NE(role(**a), "leader");
  EXPECT_EQ(audit.Regression(), 0u) << "the resumed leader wrote its old epoch after b's";
  const std::int64_t released = audit.FirstReleasedMs(epoch_a),
                     b_wrote = audit.FirstWrittenMs(epoch_b);
  EXPECT_GE(released, thawed) << "a's term was released before the VM resumed";
  EXPECT_LE(released, b_wrote) << "b wrote the domain before a's term was released";
  EXPECT_EQ(audit.BatchesAfter(epoch_a, b_wrote), 0u);
  EXPECT_EQ(audit.LastEpoch(), epoch_b);
  std::printf(
      "a released epoch %llu %lld ms after the thaw; b (epoch %llu) wrote %lld ms after "
      "that\n",
      static_cast<unsigned long long>(epoch_a), static_cast<long long>(released - thawed),
      static_cast<unsigned long long>(epoch_b), static_cast<long long>(b_wrote - released));
  // A leader that stops (no agent here) releases its own term on the way out.
  (*b)->Stop();
  {
    const std::string dom = SlurpFile(dir + "/domain");
    co::OwnerReleaseLine rl{};
    std::memcpy(&rl, dom.data() + co::kOwnerReleaseOffset, sizeof(rl));
    EXPECT_TRUE(co::LineValid(rl));
    EXPECT_EQ(rl.epoch, epoch_b) << "a leader that stopped did not release its term";
  }
  (*a)->Stop();
  b->reset();
  a->reset();
}

// The process ids whose parent is `parent` (from /proc).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: pid (comm) state ppid ...; comm may hold spaces: parse after ')'.
    const std::string stat = SlurpFile("/proc/" + name + "/stat");
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (fields >> state >> ppid && ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

std::int64_t BootNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Audit-ha #1 with real processes (issue #29): the leader's "VM" stops — the orchestrator and
// its write-back agent, SIGSTOP — for longer than the TTL, and on resume their CLOCK_BOOTTIME
// is set back by the length of the stop (tests/ha/clock_shim.c, LD_PRELOAD), as a stopped
// VM's guest reads it. The standby is elected meanwhile and must wait: the resumed leader's
// gate is open by its own clock (its agent sees no deadline passed either), it may run more
// batches, learns from its next keep-alive that its lease is gone, steps down and releases;
// only then does the successor write. The fence line never goes back to the old epoch, no
// batch of the old epoch follows the successor's first store, and no extent is lent twice.
// The in-process AResumedLeaderWithFrozenClocksStoresNothingAfterItsSuccessor checks the
// logic deterministically; this runs the real processes, under the stress label only
// (orchestrator_ha_frozen_processes: DISABLED_ here, so that the rpc label's run does not
// start an etcd cluster for it; --gtest_also_run_disabled_tests runs it).
TEST_F(HaTest, DISABLED_AResumedLeaderProcessWithClocksSetBackStoresNothingAfterItsSuccessor) {
  const cxlkv::testing::TempDir scratch("ha-shift", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string shift_file = std::string(tmpl) + "/shift";
  {
    const std::int64_t zero = 0;
    std::ofstream(shift_file, std::ios::binary).write(reinterpret_cast<const char*>(&zero), 8);
  }
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  a.env = {"LD_PRELOAD=" CXLKV_CLOCK_SHIM_SO, "CXLKV_TEST_CLOCK_SHIFT=" + shift_file};
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 2, &inc0, &granted[0]));
  const auto epoch_a = static_cast<std::uint64_t>(a.Status().epoch());
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().epoch == epoch_a && s.back().batches > 5;
      },
      milliseconds(3000)));
  const std::vector<pid_t> agent = ChildrenOf(a.pid);
  ASSERT_EQ(agent.size(), 1u) << "a's write-back agent not found";

  // The VM stops: the orchestrator and its agent.
  const std::int64_t stopped_ns = BootNs();
  ::kill(a.pid, SIGSTOP);
  ::kill(agent[0], SIGSTOP);
  auto etcd = etcd_->NewClient();
  auto leader_epoch = [&]() -> std::int64_t {
    auto key = etcd->Get("/cxlkv/v1/default/domains/hatest/leader");
    return key.ok() && !key->kvs.empty() ? key->kvs[0].create_revision : 0;
  };
  ASSERT_TRUE(Eventually([&] { return leader_epoch() > static_cast<std::int64_t>(epoch_a); },
                         milliseconds(15000)))
      << "b was not elected while a was stopped";
  const auto epoch_b = static_cast<std::uint64_t>(leader_epoch());
  std::this_thread::sleep_for(milliseconds(700));
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "b wrote the domain while a's term was not released";
  EXPECT_NE(b.Role(), "leader");

  // The VM resumes: its BOOTTIME does not count the stop.
  const std::int64_t stop_ns = BootNs() - stopped_ns;
  {
    const int fd = ::open(shift_file.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &stop_ns, sizeof(stop_ns), 0), static_cast<ssize_t>(sizeof(stop_ns)));
    ::close(fd);
  }
  const std::int64_t resumed = NowMs();
  ::kill(agent[0], SIGCONT);
  ::kill(a.pid, SIGCONT);
  ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(10000)))
      << "b did not take over once a released its term";
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == epoch_b; }, milliseconds(2000)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(audit.Regression(), 0u) << "the resumed leader wrote its old epoch after b's";
  const std::int64_t released = audit.FirstReleasedMs(epoch_a),
                     b_wrote = audit.FirstWrittenMs(epoch_b);
  EXPECT_GE(released, resumed) << "a's term was released before the VM resumed";
  EXPECT_LE(released, b_wrote) << "b wrote the domain before a's term was released";
  EXPECT_EQ(audit.BatchesAfter(epoch_a, b_wrote), 0u) << "a batch of the old epoch after b's";
  EXPECT_EQ(audit.LastEpoch(), epoch_b);
  // a resumed with its gate open by its own clock (the stop was not counted), so it learned
  // of the end of its term from etcd, not from its deadline, and its agent did not end it.
  const std::string alog = SlurpFile(a.log);
  EXPECT_NE(
      alog.find(absl::StrCat("stepped down from epoch ", epoch_a, ": the session lease was lost")),
      std::string::npos)
      << "a did not resume with its clocks set back (its gate should have been open):\n"
      << alog;
  EXPECT_EQ(alog.find("stopped past its write deadline"), std::string::npos) << alog;
  EXPECT_EQ(alog.find("fenced on this host's clock"), std::string::npos) << alog;
  std::printf(
      "stopped %lld ms; a released epoch %llu %lld ms after the resume; b (epoch %llu) wrote "
      "%lld ms after that\n",
      static_cast<long long>(stop_ns / 1000000), static_cast<unsigned long long>(epoch_a),
      static_cast<long long>(released - resumed), static_cast<unsigned long long>(epoch_b),
      static_cast<long long>(b_wrote - released));
  // The host follows to b; grants there; nothing lent twice.
  std::uint64_t inc1 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(b, 1, 2, &inc1, &granted[1]));
  ExpectNoExtentLentTwice(b, granted);
}

// Fail-over after a frozen-clock stop of the leader, with hosts heartbeating (issue #29's
// "Measured"; measure label, orchestrator_ha_frozen_reattach_20): each trial stops the
// leader's "VM" — the orchestrator and its write-back agent, SIGSTOP — for CXLKV_HA_STOP_MS
// (default 4000: past the 3 s session TTL, so a standby is elected meanwhile), then resumes it
// with its CLOCK_BOOTTIME set back by the stop (tests/ha/clock_shim.c, a shift file per
// orchestrator that accumulates its stops). The successor may not write until the resumed
// leader released its term, so no host can re-attach during the stop; the figure is the time
// from the resume until every one of CXLKV_HA_HOSTS hosts (default 8; half through the
// endpoint list, half through etcd discovery) follows a newer epoch, with the same checks as
// the kill -9 measurement (incarnations kept, extents valid, nothing lent twice, the fence line
// never back to an older epoch). CXLKV_HA_TRIALS trials (default 1); printed.
TEST_F(HaTest, DISABLED_EveryHostReattachedAfterAFrozenClockStop) {
  int trials = 1;
  if (const char* t = std::getenv("CXLKV_HA_TRIALS")) trials = std::max(1, std::atoi(t));
  std::uint32_t n_hosts = 8;
  if (const char* h = std::getenv("CXLKV_HA_HOSTS")) n_hosts = std::max(2, std::atoi(h));
  int stop_ms = 4000;
  if (const char* s = std::getenv("CXLKV_HA_STOP_MS")) stop_ms = std::max(100, std::atoi(s));
  // Removed however the test ends.
  const cxlkv::testing::TempDir scratch("ha-frozen-reattach", "/tmp");
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  std::vector<std::string> shift_files;
  std::vector<std::int64_t> shift_ns;
  std::vector<std::vector<std::string>> env;
  for (const char* n : {"a", "b", "c"}) {
    shift_files.push_back(absl::StrCat(tmpl, "/shift-", n));
    shift_ns.push_back(0);
    const std::int64_t zero = 0;
    std::ofstream(shift_files.back(), std::ios::binary)
        .write(reinterpret_cast<const char*>(&zero), sizeof(zero));
    env.push_back(
        {"LD_PRELOAD=" CXLKV_CLOCK_SHIM_SO, "CXLKV_TEST_CLOCK_SHIFT=" + shift_files.back()});
  }
  ReattachBed bed;
  ASSERT_TRUE(StartReattachBed(n_hosts, env, &bed));
  auto& orch = bed.orch;
  auto& hosts = bed.hosts;
  const auto& incs = bed.incs;
  FenceAudit audit(d_.domain);
  std::vector<std::int64_t> all, stops;
  for (int trial = 0; trial < trials; ++trial) {
    HaOrchestrator* leader = nullptr;
    ASSERT_TRUE(
        Eventually([&] { return (leader = Leader(bed.all())) != nullptr; }, milliseconds(10000)));
    std::size_t idx = 0;
    while (orch[idx].get() != leader) ++idx;
    // The leader's agent is the one child it forked; wait for it (it starts with the term).
    std::vector<pid_t> agent;
    ASSERT_TRUE(Eventually([&] { return (agent = ChildrenOf(leader->pid)).size() == 1; },
                           milliseconds(5000)))
        << "trial " << trial << ": the leader's write-back agent not found";
    std::int64_t old_epoch = 0;
    for (auto& h : hosts) old_epoch = std::max(old_epoch, h->leader_epoch());
    const std::int64_t stopped_ns = BootNs();
    ::kill(leader->pid, SIGSTOP);
    ::kill(agent[0], SIGSTOP);
    std::this_thread::sleep_for(milliseconds(stop_ms));
    const std::int64_t stop_ns = BootNs() - stopped_ns;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      EXPECT_LE(hosts[h]->leader_epoch(), old_epoch)
          << "trial " << trial << ": host " << h << " followed a new leader during the stop";
    }
    // The VM resumes: its BOOTTIME does not count the stop.
    shift_ns[idx] += stop_ns;
    {
      const int fd = ::open(shift_files[idx].c_str(), O_WRONLY);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pwrite(fd, &shift_ns[idx], sizeof(std::int64_t), 0),
                static_cast<ssize_t>(sizeof(std::int64_t)));
      ::close(fd);
    }
    const std::int64_t t0 = NowMs();
    ::kill(agent[0], SIGCONT);
    ::kill(leader->pid, SIGCONT);
    std::vector<std::int64_t> at;
    ASSERT_TRUE(bed.WaitForEveryHost(old_epoch, t0, &at))
        << "trial " << trial << ": not every host re-attached after the resume";
    std::int64_t worst = 0;
    for (std::uint32_t h = 0; h < n_hosts; ++h) {
      worst = std::max(worst, at[h]);
      EXPECT_EQ(hosts[h]->incarnation(), incs[h]) << "trial " << trial << " host " << h;
      EXPECT_TRUE(hosts[h]->ExtentsValid()) << "trial " << trial << " host " << h;
    }
    all.push_back(worst);
    stops.push_back(stop_ns / 1000000);
    // The resumed leader stepped down and stays a standby.
    ASSERT_TRUE(Eventually([&] { return leader->Role() != "leader"; }, milliseconds(5000)));
  }
  ExpectReattachBedIntact(bed);
  EXPECT_EQ(audit.Regression(), 0u);
  std::vector<std::int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::string times, stopped;
  for (std::int64_t t : all) absl::StrAppend(&times, times.empty() ? "" : " ", t);
  for (std::int64_t t : stops) absl::StrAppend(&stopped, stopped.empty() ? "" : " ", t);
  std::printf(
      "frozen-clock stop of the leader (%d ms asked) -> all %u hosts re-attached after the "
      "resume (heartbeat 100 ms, ttl 3 s), %d trials: median %lld ms, worst %lld ms [%s]; "
      "stops (ms) [%s]\n",
      stop_ms, n_hosts, trials, static_cast<long long>(sorted[sorted.size() / 2]),
      static_cast<long long>(sorted.back()), times.c_str(), stopped.c_str());
  orch.clear();
}

}  // namespace
}  // namespace cxlkv::testing
