// Orchestrator HA (docs/ha.md), the domain's record at a takeover: epochs and etcd keys
// (issue #29). A state older than the domain is refused; etcd restored or rebuilt (real
// etcdctl: HaRestoreTest, the stress label); a new leader's epoch is above every epoch the
// domain records; a candidate with the wrong keys stops. The fixture: tests/ha/ha_test.h.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/extent_audit.h"
#include "ha/fence_audit.h"
#include "ha/ha_orchestrator.h"
#include "ha/ha_test.h"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

// ---- the domain's record at a takeover: epochs and etcd keys (issue #29) --------------------

// Audit-ha #3: etcd restored from a backup (here: P/state put back as it was before a Grow).
// The domain's fence line records the state's generation at every save, so a successor finds
// etcd's state older than the domain and refuses it, naming the key and what to do, instead
// of lending again the extents granted since. No orchestrator serves; no extent is lent to
// two hosts. (Before the generation check: b took over from the old state and granted host
// 1 the extents host 0 holds: checked.)
TEST_F(HaTest, AStateOlderThanTheDomainIsRefused) {
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  auto etcd = etcd_->NewClient();
  const std::string key = "/cxlkv/v1/default/domains/hatest/state";
  std::map<std::uint32_t, std::set<std::uint32_t>> granted;
  std::uint64_t inc0 = 0;
  ASSERT_TRUE(HostCalls::JoinAndGrow(a, 0, 1, &inc0, &granted[0]));
  auto backup = etcd->Get(key);
  ASSERT_TRUE(backup.ok() && !backup->kvs.empty()) << backup.status();
  std::vector<std::uint32_t> more;
  ASSERT_TRUE(HostCalls::Grow(a, 0, inc0, 4, &more).ok());
  ASSERT_EQ(more.size(), 4u);
  granted[0].insert(more.begin(), more.end());
  std::this_thread::sleep_for(milliseconds(100));  // a batch or two: the fence line has it
  // The "restore", then the leader dies: b must take over from etcd.
  ASSERT_TRUE(etcd->Put(key, backup->kvs[0].value).ok());
  // Every election b wins from here on puts the leader key (a is dead).
  auto leader_watch = etcd->NewWatch("/cxlkv/v1/default/domains/hatest/leader");
  ASSERT_TRUE(leader_watch.ok()) << leader_watch.status();
  a.Kill(SIGKILL);
  const std::int64_t t0 = NowMs();
  bool refused_logged = false;
  int elections = 0;
  while (NowMs() - t0 < 8000) {
    std::uint64_t inc1 = 0;
    if (HostCalls::Join(b, 1, &inc1).ok()) {
      std::vector<std::uint32_t> got;
      if (HostCalls::Grow(b, 1, inc1, 8, &got).ok()) granted[1].insert(got.begin(), got.end());
    }
    refused_logged =
        SlurpFile(b.log).find("older than the domain's own record") != std::string::npos;
    auto ev = (*leader_watch)->Next(milliseconds(200));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const orch::etcd::Event& e : *ev) {
      if (e.type == orch::etcd::Event::Type::kPut) ++elections;
    }
  }
  EXPECT_TRUE(refused_logged) << SlurpFile(b.log);
  // A host is told the refusal by the orchestrator that answered (before: "no orchestrator
  // answered; if one runs, check that it allows uid ..."), with what the operator must do.
  auto host = orch::HostClient::Connect(b.socket, 2);
  ASSERT_FALSE(host.ok());
  const std::string told(host.status().message());
  EXPECT_NE(told.find("older than the domain's own record"), std::string::npos) << told;
  EXPECT_NE(told.find("--new-domain"), std::string::npos) << told;
  EXPECT_EQ(told.find("no orchestrator answered"), std::string::npos) << told;
  // The refused candidate backs off (500 ms, doubling, capped) instead of campaigning every
  // 500 ms, and logs the reason once while it does not change (before: three long lines at
  // every election).
  EXPECT_GE(elections, 2);
  EXPECT_LE(elections, 5) << "b was elected " << elections << " times in 8 s";
  std::size_t logged = 0;
  const std::string blog_now = SlurpFile(b.log);
  for (std::size_t at = blog_now.find("older than the domain's own record");
       at != std::string::npos; at = blog_now.find("older than the domain's own record", at + 1)) {
    ++logged;
  }
  EXPECT_EQ(logged, 1u) << blog_now;
  EXPECT_NE(b.Role(), "leader");
  EXPECT_TRUE(granted[1].empty()) << "b served from the restored (older) state";
  for (const std::uint32_t e : granted[1]) {
    EXPECT_EQ(granted[0].count(e), 0u) << "extent " << e << " lent to host 0 and host 1";
  }
  const std::string blog = SlurpFile(b.log);
  EXPECT_NE(blog.find(key), std::string::npos) << "the refusal names the state's key:\n" << blog;
  EXPECT_NE(blog.find("--new-domain"), std::string::npos) << blog;
}

// etcd's own restores (issue #29), with real etcdctl; under the `stress` label
// (orchestrator_ha_etcd_restore: about 20 s each).
class HaRestoreTest : public HaTest {
 protected:
  void SetUp() override {
    CXLKV_SKIP_WITHOUT_ETCDCTL();
    HaTest::SetUp();
    snapshot_ = etcd_->dir() + "/backup.db";
  }
  std::string snapshot_;
};

// etcd restored from a snapshot (a new cluster id, revisions back to the snapshot's), then
// rebuilt empty; an orchestrator given the wrong etcd.domain meanwhile. Epochs derive from the
// domain's record as well as etcd's revision, so each new leader's epoch is above every one
// the domain saw: no epoch names two terms, and a host that heard the old terms accepts the
// new leader without a restart, keeping its incarnation and extents. The wrong-domain
// orchestrator refuses the domain (its fence line names other etcd keys), also after the
// leader's kill -9 released its term. Sampled: no extent valid on two hosts at any instant.
// (Before: the leader after the restore served at an epoch below the hosts' and they refused
// it until restarted; checked.)
TEST_F(HaRestoreTest, RestoredOrRebuiltEtcdEpochsStayUniqueAndHostsFollow) {
  HaOrchestrator a(d_, *etcd_, "a", /*ttl_s=*/2), b(d_, *etcd_, "b", /*ttl_s=*/2);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  const std::string list = a.socket + "," + b.socket;
  auto h0 = orch::HostClient::Connect(list, 0);
  ASSERT_TRUE(h0.ok()) << h0.status();
  // Declared before the audit, which samples them until it is destroyed.
  absl::StatusOr<std::unique_ptr<orch::HostClient>> h1 = absl::UnavailableError("not yet");
  ExtentAudit extents;
  ASSERT_TRUE((*h0)->Grow(2).ok());
  extents.Watch(h0->get());
  (*h0)->StartHeartbeats();
  // A wrong etcd.domain (operator error), started as a new domain there: elected under its
  // own keys, it must refuse the domain, whose fence line names other keys, even once the
  // leader's term is released.
  HaOrchestrator c(d_, *etcd_, "c", /*ttl_s=*/2);
  c.AppendToEtcdSection("domain = \"wrong\"");
  (void)c.Start(/*new_domain=*/true);  // refused at its first election: it may be gone already

  std::string why;
  ASSERT_TRUE(etcd_->SnapshotSave(snapshot_, &why)) << why;
  // Other users of the same etcd move its revision on after the backup.
  auto kv = etcd_->NewClient();
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(kv->Put("/another-app/key", std::to_string(i)).ok());
  const std::int64_t epoch_a = a.Status().epoch();
  a.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_a; }, milliseconds(15000)))
      << "the host did not follow b";
  const std::int64_t epoch_b = (*h0)->leader_epoch();
  ASSERT_TRUE(a.Start());  // a standby again
  EXPECT_NE(c.Role(), "leader");

  // The restore: revisions back to the snapshot's, under a new cluster token.
  ASSERT_TRUE(etcd_->RestoreSnapshot(snapshot_, "cxlkv-restored", &why)) << why;
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_b; }, milliseconds(20000)))
      << "the host did not accept the leader elected after the restore (epoch " << audit.LastEpoch()
      << ", the host's " << (*h0)->leader_epoch() << ")";
  const std::int64_t epoch_r = (*h0)->leader_epoch();
  EXPECT_EQ(audit.LastEpoch(), static_cast<std::uint64_t>(epoch_r));
  EXPECT_EQ((*h0)->extents().size(), 2u);
  EXPECT_EQ((*h0)->rejoins(), 0u);

  // etcd rebuilt empty: the leader's state file (a cache, current) is imported.
  ASSERT_TRUE(etcd_->RebuildEmpty("cxlkv-rebuilt", &why)) << why;
  ASSERT_TRUE(Eventually([&] { return (*h0)->leader_epoch() > epoch_r; }, milliseconds(20000)))
      << "the host did not accept the leader elected after the rebuild";
  EXPECT_EQ((*h0)->extents().size(), 2u);
  EXPECT_EQ((*h0)->rejoins(), 0u);
  h1 = orch::HostClient::Connect(list, 1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  extents.Watch(h1->get());
  ASSERT_TRUE((*h1)->Grow(2).ok());
  std::this_thread::sleep_for(milliseconds(300));

  EXPECT_EQ(extents.FirstDoubleHolding(), "");
  EXPECT_GT(extents.samples(), 1000u);
  EXPECT_EQ(audit.Regression(), 0u) << "an older epoch wrote after a newer one";
  EXPECT_EQ(audit.EpochOfTwoTerms(), 0u) << "one epoch named two terms";
  EXPECT_NE(c.Role(), "leader");
  const std::string clog = SlurpFile(c.log);
  EXPECT_NE(clog.find("belongs to orchestrators elected under other etcd keys"), std::string::npos)
      << clog;
  EXPECT_EQ(clog.find("cxlkv-orchestrator: leader of domain"), std::string::npos) << clog;
  // It gave up at once (campaigns no more) and exited saying why.
  ASSERT_TRUE(c.Exited(milliseconds(1000))) << clog;
  EXPECT_TRUE(WIFEXITED(c.exit_status) && WEXITSTATUS(c.exit_status) == 1) << c.exit_status;
}

// etcd restored from a snapshot taken before a Grow: its state is older than the domain's
// record, so every takeover refuses it, naming the key and the fix; the operator's fix is
// one orchestrator started with --new-domain, which replaces the state with one that
// quarantines every extent: the host that held extents loses them (it must rejoin) before
// anyone else can be lent them. Sampled: no extent valid on two hosts at any instant.
TEST_F(HaRestoreTest, AStateOlderThanTheDomainTakesNewDomainWhichQuarantinesEverything) {
  HaOrchestrator a(d_, *etcd_, "a", /*ttl_s=*/2, /*capacity_lease_ms=*/3000),
      b(d_, *etcd_, "b", /*ttl_s=*/2, /*capacity_lease_ms=*/3000);
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  FenceAudit audit(d_.domain);
  const std::string list = a.socket + "," + b.socket;
  auto h0 = orch::HostClient::Connect(list, 0);
  ASSERT_TRUE(h0.ok()) << h0.status();
  // Declared before the audit, which samples them until it is destroyed.
  absl::StatusOr<std::unique_ptr<orch::HostClient>> h1 = absl::UnavailableError("not yet");
  ExtentAudit extents;
  ASSERT_TRUE((*h0)->Grow(1).ok());
  extents.Watch(h0->get());
  (*h0)->StartHeartbeats();
  std::string why;
  ASSERT_TRUE(etcd_->SnapshotSave(snapshot_, &why)) << why;
  ASSERT_TRUE((*h0)->Grow(3).ok());  // after the backup
  ASSERT_EQ((*h0)->extents().size(), 4u);
  const std::uint64_t epoch_a = audit.LastEpoch();

  ASSERT_TRUE(etcd_->RestoreSnapshot(snapshot_, "cxlkv-restored", &why)) << why;
  // The snapshot holds the leader's session lease: the leader may lead on from its memory (a
  // newer state than etcd's) until its next state write, whose guard then fails (P/state is
  // not at the revision it wrote last): it resigns. A Grow makes that write now.
  auto refused = (*h0)->Grow(1);
  EXPECT_FALSE(refused.ok()) << "a Grow was served from the state etcd lost";
  const std::string key = "/cxlkv/v1/default/domains/hatest/state";
  ASSERT_TRUE(Eventually(
      [&] {
        return SlurpFile(a.log).find("older than the domain's own record") != std::string::npos ||
               SlurpFile(b.log).find("older than the domain's own record") != std::string::npos;
      },
      milliseconds(15000)))
      << "no takeover refused the restored state";
  EXPECT_EQ(audit.LastEpoch(), epoch_a) << "a leader took the restored (older) state over";
  const std::string refusal = SlurpFile(a.log) + SlurpFile(b.log);
  EXPECT_NE(refusal.find(key), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--new-domain"), std::string::npos) << refusal;

  // The operator's fix: stop them, start one with --new-domain.
  a.Kill(SIGTERM);
  b.Kill(SIGTERM);
  ASSERT_TRUE(b.Start(/*new_domain=*/true));
  ASSERT_TRUE(Eventually([&] { return b.Role() == "leader"; }, milliseconds(15000)))
      << SlurpFile(b.log);
  EXPECT_GT(audit.LastEpoch(), epoch_a);
  EXPECT_NE(SlurpFile(b.log).find("every extent quarantined"), std::string::npos)
      << SlurpFile(b.log);
  h1 = orch::HostClient::Connect(b.socket, 1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  extents.Watch(h1->get());
  // Nothing is lent until the quarantine (a full capacity lease) ends; then h1 gets extents
  // h0 held, which h0 no longer uses.
  std::vector<orch::GrantedExtent> got;
  ASSERT_TRUE(Eventually(
      [&] {
        auto g = (*h1)->Grow(4);
        if (g.ok()) got.insert(got.end(), g->begin(), g->end());
        return got.size() >= 4;
      },
      milliseconds(15000)))
      << "the quarantine never ended";
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(extents.FirstDoubleHolding(), "");
  EXPECT_GT(extents.samples(), 1000u);
  EXPECT_FALSE((*h0)->ExtentsValid() && !(*h0)->extents().empty())
      << "the host of the forgotten state still uses its extents";
  EXPECT_EQ(audit.Regression(), 0u);
  EXPECT_EQ(audit.EpochOfTwoTerms(), 0u);
}

// The domain file's fence and release lines, read and written by the test while no
// orchestrator of the domain runs.
struct DomainLines {
  explicit DomainLines(std::string file) : path(std::move(file)) {}
  co::OwnerFenceLine Fence() const {
    const std::string dom = SlurpFile(path);
    co::OwnerFenceLine f{};
    std::memcpy(&f, dom.data() + co::kOwnerFenceOffset, sizeof(f));
    return f;
  }
  co::OwnerReleaseLine Release() const {
    const std::string dom = SlurpFile(path);
    co::OwnerReleaseLine r{};
    std::memcpy(&r, dom.data() + co::kOwnerReleaseOffset, sizeof(r));
    return r;
  }
  template <class Line>
  void Write(std::size_t offset, const Line& line) const {
    std::ofstream(path, std::ios::in | std::ios::out | std::ios::binary)
        .seekp(static_cast<std::streamoff>(offset))
        .write(reinterpret_cast<const char*>(&line), sizeof(line));
  }
  std::string path;
};

// Epochs derive from the domain's record as well as etcd's revision (docs/ha.md "Election and
// epoch"): a new leader's epoch is one above the highest epoch the fence or release line
// names when that is above etcd's revision (an etcd restored or replaced issues revisions
// again), so no epoch names two terms and hosts accept the new leader. Three records, each
// above etcd's revision: fence and release line alike (the last term released); the fence
// line alone (its term released by an operator through etcd); the release line alone (the
// fence line torn by a writer that died writing it, released after the wait began). Each
// fails when its line is left out of the derivation, and the first without the "+ 1" or with
// the revision as the epoch.
TEST_F(HaTest, ANewLeadersEpochIsAboveEveryEpochTheDomainRecords) {
  const cxlkv::testing::TempDir scratch("ha-epochs", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "epochs", etcd_.get()), "epochs.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  DomainLines lines(dir + "/domain");
  auto etcd = etcd_->NewClient();
  const std::string where = "/cxlkv/v1/default/domains/epochs";
  // Opens the domain, waits until this one leads (after `meanwhile`, run once it was elected),
  // and returns the epoch it leads at; stopped on return (its term released).
  auto lead = [&](bool new_domain, const std::function<void()>& meanwhile) -> std::int64_t {
    auto o = orch::Orchestrator::Open(
        *c, orch::OpenOptions{.new_domain = new_domain, .write_back_agent = false});
    EXPECT_TRUE(o.ok()) << o.status();
    if (!o.ok()) return 0;
    EXPECT_TRUE((*o)->Start().ok());
    auto role = [&] { return (*o)->status().role; };
    if (meanwhile) {
      EXPECT_TRUE(Eventually(
          [&] {
            auto r = etcd->Get(where + "/leader");
            return r.ok() && !r->kvs.empty();
          },
          milliseconds(10000)));
      meanwhile();
    }
    EXPECT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
    std::int64_t epoch = 0;
    { epoch = (*o)->status().epoch; }
    (*o)->Stop();
    o->reset();
    return epoch;
  };
  const std::int64_t first = lead(/*new_domain=*/true, nullptr);
  ASSERT_GT(first, 0);
  auto revision = [&] {
    auto r = etcd->Get(where + "/leader");
    return r.ok() ? r->header.revision : 0;
  };

  // 1. Both lines name X, far above etcd's revision: the next epoch is X + 1.
  const std::uint64_t x = static_cast<std::uint64_t>(first) + 1000;
  co::OwnerFenceLine f = lines.Fence();
  co::OwnerReleaseLine r = lines.Release();
  ASSERT_TRUE(co::LineValid(f) && co::LineValid(r));
  ASSERT_EQ(r.epoch, static_cast<std::uint64_t>(first)) << "the first term was not released";
  f.epoch = x;
  r.epoch = x;
  co::SealLine(f);
  co::SealLine(r);
  lines.Write(co::kOwnerFenceOffset, f);
  lines.Write(co::kOwnerReleaseOffset, r);
  const std::int64_t second = lead(false, nullptr);
  EXPECT_EQ(second, static_cast<std::int64_t>(x) + 1)
      << "the epoch is not one above the domain's record (etcd revision " << revision() << ")";

  // 2. The fence line names Y, above the release line's epoch; an operator releases Y.
  const std::uint64_t y = x + 1000;
  f = lines.Fence();
  ASSERT_TRUE(co::LineValid(f));
  f.epoch = y;
  co::SealLine(f);
  lines.Write(co::kOwnerFenceOffset, f);
  ASSERT_LT(lines.Release().epoch, y);
  ASSERT_TRUE(etcd->Put(where + "/released", std::to_string(y)).ok());
  const std::int64_t third = lead(false, nullptr);
  EXPECT_EQ(third, static_cast<std::int64_t>(y) + 1)
      << "the fence line's epoch was left out of the derivation";
  ASSERT_TRUE(etcd->Delete(where + "/released").ok());

  // 3. The fence line torn, the release line names Z, written after the wait began.
  const std::uint64_t z = y + 1000;
  f = lines.Fence();
  f.crc ^= 1;  // torn: its writer died writing it
  lines.Write(co::kOwnerFenceOffset, f);
  const std::int64_t fourth = lead(false, [&] {
    std::this_thread::sleep_for(milliseconds(300));  // waiting for a release now
    co::OwnerReleaseLine rel = lines.Release();
    rel.epoch = z;
    rel.at_ms += 1;
    co::SealLine(rel);
    lines.Write(co::kOwnerReleaseOffset, rel);
  });
  EXPECT_EQ(fourth, static_cast<std::int64_t>(z) + 1)
      << "the release line's epoch was left out of the derivation";
}

// A candidate with a wrong etcd.cluster/etcd.domain (elected under its own keys at once) is
// refused by the domain's fence line, which names the keys of the domain's leaders. That
// does not heal: it campaigns no more (its session ends, nothing of it stays in etcd) and
// exits with the error naming the setting. In process first (fatal(), etcd), then as a
// process (exit status 1, its log). The domain's leader is not disturbed.
TEST_F(HaTest, AWrongKeysCandidateStopsCampaigningAndExits) {
  HaOrchestrator a(d_, *etcd_, "a");
  ASSERT_TRUE(StartLeaderAndStandbys(a, {}));
  FenceAudit audit(d_.domain);
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() != 0; }, milliseconds(2000)));
  const std::uint64_t epoch_a = audit.LastEpoch();
  auto etcd = etcd_->NewClient();
  const std::string wrong = "/cxlkv/v1/default/domains/wrong/";
  auto wrong_keys = [&] {
    auto r = etcd->Get(wrong, orch::etcd::PrefixEnd(wrong));
    return r.ok() ? r->kvs.size() : std::size_t{1000};
  };

  HaOrchestrator b(d_, *etcd_, "b");
  b.AppendToEtcdSection("domain = \"wrong\"");
  auto c = orch::ParseConfig(SlurpFile(b.config_path()), b.config_path());
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  ASSERT_TRUE(Eventually([&] { return !(*o)->fatal().ok(); }, milliseconds(10000)))
      << "the wrong-keys candidate did not give up";
  const std::string why(absl::Status((*o)->fatal()).message());
  EXPECT_NE(why.find("etcd.cluster or etcd.domain is wrong"), std::string::npos) << why;
  EXPECT_NE(why.find(wrong.substr(0, wrong.size() - 1)), std::string::npos) << why;
  EXPECT_NE(why.find("campaigns no more"), std::string::npos) << why;
  // Its session ends (the lease revoked: no candidate or leader key of it), and it never
  // campaigns again: well past the election's retry pause (500 ms), not one change under its
  // keys (a watch sees even a campaign refused within milliseconds).
  EXPECT_TRUE(Eventually([&] { return wrong_keys() == 0; }, milliseconds(3000)));
  auto watch = etcd->NewWatch(wrong, orch::etcd::PrefixEnd(wrong));
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::vector<std::string> changed;
  const std::int64_t t0 = NowMs();
  while (NowMs() - t0 < 1500) {
    auto ev = (*watch)->Next(milliseconds(100));
    ASSERT_TRUE(ev.ok()) << ev.status();
    for (const orch::etcd::Event& e : *ev) changed.push_back(e.kv.key);
  }
  EXPECT_TRUE(changed.empty()) << "the wrong-keys candidate campaigned again: " << changed.size()
                               << " changes, the first " << changed[0];
  { EXPECT_NE((*o)->status().role, "leader"); }
  (*o)->Stop();
  o->reset();

  // As a process: it exits with status 1, saying why.
  (void)b.Start(/*new_domain=*/true);
  ASSERT_TRUE(b.Exited(milliseconds(10000))) << "the wrong-keys orchestrator did not exit:\n"
                                             << SlurpFile(b.log);
  EXPECT_TRUE(WIFEXITED(b.exit_status) && WEXITSTATUS(b.exit_status) == 1) << b.exit_status;
  const std::string blog = SlurpFile(b.log);
  EXPECT_NE(blog.find("exiting: domain.prefix_domain"), std::string::npos) << blog;
  EXPECT_NE(blog.find("etcd.cluster or etcd.domain is wrong"), std::string::npos) << blog;
  EXPECT_EQ(wrong_keys(), 0u);
  EXPECT_EQ(a.Role(), "leader");
  EXPECT_EQ(audit.LastEpoch(), epoch_a);
  EXPECT_EQ(audit.Regression(), 0u);
}

}  // namespace
}  // namespace cxlkv::testing
