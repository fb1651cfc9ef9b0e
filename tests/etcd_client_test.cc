// The etcd client and the leader election (orchestrator/etcd) against a real 3-member etcd
// cluster on loopback (tests/etcd_cluster.h); skipped without Debian's etcd-server.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/election.h"
#include "cxlkv/orchestrator/etcd.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

namespace ed = ::cxlkv::orchestrator::etcd;
using std::chrono::milliseconds;

// This suite polls every 20 ms (some of its conditions are reads from etcd).
bool Eventually(const std::function<bool()>& cond, milliseconds limit) {
  return ::cxlkv::testing::Eventually(cond, limit, milliseconds(20));
}

// One cluster for the suite: starting etcd takes a second or two.
class EtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (EtcdBinary().empty()) return;
    cluster_ = new EtcdCluster(3);
    std::string why;
    if (!cluster_->Start(&why)) {
      start_error_ = new std::string(why);
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override {
    CXLKV_SKIP_WITHOUT_ETCD();
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
    client_ = cluster_->NewClient();
    ASSERT_NE(client_, nullptr);
    prefix_ = absl::StrCat("/test/",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
  }

  static EtcdCluster* cluster_;
  static std::string* start_error_;
  std::unique_ptr<ed::Client> client_;
  std::string prefix_;
};
EtcdCluster* EtcdTest::cluster_ = nullptr;
std::string* EtcdTest::start_error_ = nullptr;

TEST(EtcdClient, RejectsBadEndpoints) {
  ed::ClientOptions o;
  EXPECT_TRUE(absl::IsInvalidArgument(ed::Client::Create(o).status()));
  o.endpoints = {"127.0.0.1"};
  EXPECT_TRUE(absl::IsInvalidArgument(ed::Client::Create(o).status()));
  o.endpoints = {"127.0.0.1:70000"};
  EXPECT_TRUE(absl::IsInvalidArgument(ed::Client::Create(o).status()));
  o.endpoints = {"localhost:2379"};
  EXPECT_TRUE(ed::Client::Create(o).ok());
}

TEST(EtcdClient, PrefixEnd) {
  EXPECT_EQ(ed::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(ed::PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(ed::PrefixEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(EtcdClient, UnreachableIsUnavailableOrDeadline) {
  ed::ClientOptions o;
  o.endpoints = {absl::StrCat("127.0.0.1:", FreeLoopbackPorts(1)[0])};
  o.call_timeout_ms = 500;
  auto c = ed::Client::Create(o);
  ASSERT_TRUE(c.ok());
  const auto st = (*c)->Get("/x").status();
  EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find(o.endpoints[0]), std::string::npos) << st;
}

// A process that ends without running its destructors (a sanitizer's abort, ctest's timeout)
// takes its etcd members with it: none is left holding its ports and data directory.
TEST(EtcdClusterHarness, MembersDieWithTheProcessThatStartedThem) {
  CXLKV_SKIP_WITHOUT_ETCD();
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);  // the member must not hold the pipe open
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only the fork and exec of a member here: nothing that needs another thread of the test.
    ::close(out[0]);
    EtcdCluster c(1);
    c.SpawnMembers();
    const std::string said = std::to_string(c.pid(0)) + " " + c.dir() + "\n";
    const bool ok = ::write(out[1], said.data(), said.size()) == static_cast<ssize_t>(said.size());
    ::_exit(ok ? 0 : 1);  // no destructor: as an abort would end it
  }
  ::close(out[1]);
  std::string said;
  char buf[512];
  for (ssize_t n;
       said.find('\n') == std::string::npos && (n = ::read(out[0], buf, sizeof buf)) > 0;) {
    said.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::istringstream in(said);
  pid_t member = -1;
  std::string dir;
  in >> member >> dir;
  ASSERT_GT(member, 0) << said;
  ASSERT_EQ(dir.rfind("/tmp/cxlkv-etcd-", 0), 0u) << said;
  // Gone, or a zombie waiting for the process that adopted it.
  const auto gone = [member] {
    if (::kill(member, 0) != 0) return errno == ESRCH;
    std::ifstream stat("/proc/" + std::to_string(member) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const std::size_t paren = text.rfind(')');
    return paren != std::string::npos && text.size() > paren + 2 && text[paren + 2] == 'Z';
  };
  EXPECT_TRUE(Eventually(gone, milliseconds(20000)))
      << "etcd member " << member << " outlived the process that started it";
  ::kill(member, SIGKILL);  // whatever the verdict, nothing stays behind
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

TEST_F(EtcdTest, PutGetDeleteAndRevisions) {
  auto h1 = client_->Put(prefix_ + "a", "1");
  ASSERT_TRUE(h1.ok()) << h1.status();
  auto h2 = client_->Put(prefix_ + "b", "2");
  ASSERT_TRUE(h2.ok());
  EXPECT_GT(h2->revision, h1->revision);
  EXPECT_NE(h2->cluster_id, 0u);
  auto h3 = client_->Put(prefix_ + "a", "3");
  ASSERT_TRUE(h3.ok());

  auto one = client_->Get(prefix_ + "a");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].value, "3");
  EXPECT_EQ(one->kvs[0].create_revision, h1->revision);
  EXPECT_EQ(one->kvs[0].mod_revision, h3->revision);
  EXPECT_EQ(one->kvs[0].version, 2);

  auto all = client_->Get(prefix_, ed::PrefixEnd(prefix_));
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->kvs.size(), 2u);
  EXPECT_EQ(all->kvs[0].key, prefix_ + "a");  // sorted by key
  EXPECT_EQ(all->kvs[1].key, prefix_ + "b");

  auto gone = client_->Delete(prefix_, ed::PrefixEnd(prefix_));
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, 2);
  auto none = client_->Get(prefix_ + "a");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->kvs.empty());
}

TEST_F(EtcdTest, TxnCreateIfAbsentAndGuardedUpdate) {
  using C = ed::Compare;
  const std::string k = prefix_ + "leader";
  auto first = client_->Txn({C::CreateRevision(k, C::Result::kEqual, 0)}, {ed::Op::Put(k, "me")},
                            {ed::Op::Get(k)});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded);
  const std::int64_t created = first->header.revision;

  auto second = client_->Txn({C::CreateRevision(k, C::Result::kEqual, 0)}, {ed::Op::Put(k, "you")},
                             {ed::Op::Get(k)});
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->results.size(), 1u);
  ASSERT_EQ(second->results[0].kvs.size(), 1u);
  EXPECT_EQ(second->results[0].kvs[0].value, "me");
  EXPECT_EQ(second->results[0].kvs[0].create_revision, created);

  // Guarded by the revision read: the first writer wins, the stale one fails.
  const std::string s = prefix_ + "state";
  auto put = client_->Put(s, "v1");
  ASSERT_TRUE(put.ok());
  const std::int64_t seen = put->revision;
  auto a = client_->Txn({C::CreateRevision(k, C::Result::kEqual, created),
                         C::ModRevision(s, C::Result::kEqual, seen)},
                        {ed::Op::Put(s, "v2")}, {ed::Op::Get(s)});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->succeeded);
  auto b = client_->Txn({C::ModRevision(s, C::Result::kEqual, seen)}, {ed::Op::Put(s, "v3")},
                        {ed::Op::Get(s)});
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->succeeded);
  EXPECT_EQ(b->results[0].kvs[0].value, "v2");
  // Value compare, and a delete in a branch.
  auto d = client_->Txn({C::Value(s, C::Result::kEqual, "v2")}, {ed::Op::Delete(s)}, {});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->succeeded);
  ASSERT_EQ(d->results.size(), 1u);
  EXPECT_EQ(d->results[0].deleted, 1);
}

TEST_F(EtcdTest, LeaseKeepsKeysAliveAndTakesThemAlong) {
  auto l = client_->GrantLease(2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_GE(l->ttl_s, 2);
  ASSERT_TRUE(client_->Put(prefix_ + "k", "v", l->id).ok());
  auto kv = client_->Get(prefix_ + "k");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->kvs[0].lease, l->id);
  // Kept alive past its TTL: the key stays.
  for (int i = 0; i < 5; ++i) {
    auto ttl = client_->KeepAliveOnce(l->id);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_GE(*ttl, 1);
    std::this_thread::sleep_for(milliseconds(600));
  }
  EXPECT_EQ(client_->Get(prefix_ + "k")->kvs.size(), 1u);
  EXPECT_TRUE(client_->LeaseTimeToLive(l->id).ok());
  // Revoked: the key goes at once, and the lease is unknown from then on.
  ASSERT_TRUE(client_->RevokeLease(l->id).ok());
  EXPECT_TRUE(client_->Get(prefix_ + "k")->kvs.empty());
  EXPECT_TRUE(absl::IsNotFound(client_->KeepAliveOnce(l->id).status()));
  EXPECT_TRUE(client_->RevokeLease(l->id).ok());  // already gone: fine

  // Not kept alive: it expires by itself, and its key with it.
  auto l2 = client_->GrantLease(2);
  ASSERT_TRUE(l2.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "k2", "v", l2->id).ok());
  const std::int64_t t0 = NowMs();
  EXPECT_TRUE(
      Eventually([&] { return client_->Get(prefix_ + "k2")->kvs.empty(); }, milliseconds(6000)));
  EXPECT_GE(NowMs() - t0, 1000);  // not before its TTL (less the time the Put took)
  EXPECT_TRUE(absl::IsNotFound(client_->LeaseTimeToLive(l2->id).status()));
}

TEST_F(EtcdTest, WatchSeesChangesInOrderAndReplaysHistory) {
  auto start = client_->Put(prefix_ + "x", "0");
  ASSERT_TRUE(start.ok());
  auto w = client_->NewWatch(prefix_, ed::PrefixEnd(prefix_), 0, /*prev_kv=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(client_->Put(prefix_ + "x", "1").ok());
  ASSERT_TRUE(client_->Put(prefix_ + "y", "2").ok());
  ASSERT_TRUE(client_->Delete(prefix_ + "x").ok());
  std::vector<ed::Event> got;
  ASSERT_TRUE(Eventually(
      [&] {
        auto ev = (*w)->Next(milliseconds(100));
        EXPECT_TRUE(ev.ok()) << ev.status();
        if (ev.ok()) got.insert(got.end(), ev->begin(), ev->end());
        return got.size() >= 3;
      },
      milliseconds(5000)));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, ed::Event::Type::kPut);
  EXPECT_EQ(got[0].kv.value, "1");
  EXPECT_EQ(got[0].prev_kv.value, "0");
  EXPECT_EQ(got[1].kv.key, prefix_ + "y");
  EXPECT_EQ(got[2].type, ed::Event::Type::kDelete);
  EXPECT_EQ(got[2].kv.key, prefix_ + "x");
  EXPECT_LT(got[0].kv.mod_revision, got[1].kv.mod_revision);
  EXPECT_GE((*w)->last_revision(), got[2].kv.mod_revision);

  // From an old revision: the same history again, from the first put on.
  auto replay = client_->NewWatch(prefix_ + "x", "", start->revision);
  ASSERT_TRUE(replay.ok());
  std::vector<ed::Event> again;
  ASSERT_TRUE(Eventually(
      [&] {
        auto ev = (*replay)->Next(milliseconds(100));
        if (ev.ok()) again.insert(again.end(), ev->begin(), ev->end());
        return again.size() >= 3;
      },
      milliseconds(5000)));
  EXPECT_EQ(again[0].kv.value, "0");
  EXPECT_EQ(again[2].type, ed::Event::Type::kDelete);
  // Nothing more: Next times out with no events.
  auto quiet = (*replay)->Next(milliseconds(200));
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->empty());
}

// A member that stops answering (SIGSTOP) is left for another: reads succeed within the call
// timeout. Its own cluster: stopping members disturbs the suite's.
TEST(EtcdFailover, StoppedMemberIsSkipped) {
  CXLKV_SKIP_WITHOUT_ETCD();
  EtcdCluster cluster(3);
  std::string why;
  ASSERT_TRUE(cluster.Start(&why)) << why;
  // A client whose first endpoint is a follower (the raft leader stays up: the cluster works).
  const int leader = cluster.LeaderIndex();
  ASSERT_GE(leader, 0);
  const int victim = (leader + 1) % cluster.size();
  ed::ClientOptions o;
  for (int i = 0; i < cluster.size(); ++i) {
    o.endpoints.push_back(cluster.endpoints()[(victim + i) % cluster.size()]);
  }
  o.call_timeout_ms = 3000;
  auto c = ed::Client::Create(o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put("/f/k", "v").ok());
  ASSERT_EQ((*c)->current_endpoint(), 0u);
  cluster.Pause(victim);
  for (int i = 0; i < 6; ++i) {
    const std::int64_t t0 = NowMs();
    auto g = (*c)->Get("/f/k");
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_LT(NowMs() - t0, 3000);
    EXPECT_NE((*c)->current_endpoint(), 0u) << "read " << i << " took " << NowMs() - t0 << " ms";
  }
  // A write goes to the member the reads moved to.
  EXPECT_TRUE((*c)->Put("/f/k", "w").ok());
  cluster.Resume(victim);
}

// ---- the election ---------------------------------------------------------------------------

struct Candidate {
  std::unique_ptr<ed::Client> client;
  std::unique_ptr<ed::LeaderElection> election;
  std::atomic<std::int64_t> epoch{0};
  std::atomic<std::int64_t> elected_at{0}, lost_at{0};
  std::atomic<int> wins{0}, losses{0};
  absl::Mutex mu;
  std::string why;
  // The election first: its threads call the callbacks, which touch the members above.
  ~Candidate() {
    if (election) election->Stop();
  }

  void Start(const EtcdCluster& cluster, const std::string& key, const std::string& name,
             std::int64_t ttl_s = 2, cxlkv::coherence::Clock* clock = nullptr) {
    client = cluster.NewClient(1000);
    ed::ElectionOptions o;
    o.clock = clock;
    o.leader_key = key;
    o.candidate_prefix = key + "-candidates/";
    o.value = name;
    o.ttl_s = ttl_s;
    o.retry_ms = 100;
    o.log = [](const std::string&) {};
    ed::LeaderElection::Callbacks cb;
    cb.elected = [this](const ed::Term& t) {
      epoch = t.epoch;
      elected_at = NowMs();
      ++wins;
      return absl::OkStatus();
    };
    cb.lost = [this](const ed::Term&, const std::string& w) {
      lost_at = NowMs();
      ++losses;
      epoch = 0;
      absl::MutexLock l(&mu);
      why = w;
    };
    auto e = ed::LeaderElection::Start(*client, o, cb);
    ASSERT_TRUE(e.ok()) << e.status();
    election = *std::move(e);
  }
};

TEST_F(EtcdTest, OneLeaderEpochIsCreateRevisionAndHandoverRaisesIt) {
  const std::string key = prefix_ + "leader";
  Candidate a, b;
  a.Start(*cluster_, key, "a");
  b.Start(*cluster_, key, "b");
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0 || b.epoch != 0; }, milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE((a.epoch != 0) != (b.epoch != 0)) << "exactly one leads";
  Candidate& leader = a.epoch != 0 ? a : b;
  Candidate& standby = a.epoch != 0 ? b : a;
  EXPECT_TRUE(leader.election->WriteAllowed());
  EXPECT_FALSE(standby.election->WriteAllowed());
  auto kv = client_->Get(key);
  ASSERT_TRUE(kv.ok());
  ASSERT_EQ(kv->kvs.size(), 1u);
  EXPECT_EQ(kv->kvs[0].create_revision, leader.epoch.load());
  EXPECT_EQ(kv->kvs[0].value, &leader == &a ? "a" : "b");
  // Both registered as candidates under their leases.
  auto cands = client_->Get(key + "-candidates/", ed::PrefixEnd(key + "-candidates/"));
  ASSERT_TRUE(cands.ok());
  EXPECT_EQ(cands->kvs.size(), 2u);
  // Still one leader after a few keep-alive periods.
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_TRUE(leader.election->WriteAllowed());
  EXPECT_EQ(standby.wins.load(), 0);

  // The leader stops: its lease is revoked, the standby wins at once with a higher epoch.
  const std::int64_t old_epoch = leader.epoch;
  const std::int64_t t0 = NowMs();
  leader.election->Stop();
  ASSERT_TRUE(Eventually([&] { return standby.epoch != 0; }, milliseconds(3000)));
  EXPECT_LT(NowMs() - t0, 1500) << "a revoked lease hands over without waiting for the TTL";
  EXPECT_GT(standby.epoch.load(), old_epoch);
  EXPECT_TRUE(standby.election->WriteAllowed());
}

TEST_F(EtcdTest, ResignClosesTheFenceAtOnceAndHandsOver) {
  const std::string key = prefix_ + "leader";
  Candidate a;
  a.Start(*cluster_, key, "a");
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0; }, milliseconds(5000)));
  Candidate b;
  b.Start(*cluster_, key, "b");
  std::this_thread::sleep_for(milliseconds(300));
  const std::int64_t first = a.epoch;
  a.election->Resign("test");
  EXPECT_FALSE(a.election->WriteAllowed());  // before Resign returned
  ASSERT_TRUE(Eventually([&] { return a.losses.load() == 1; }, milliseconds(2000)));
  {
    absl::MutexLock l(&a.mu);
    EXPECT_EQ(a.why, "test");
  }
  // Someone leads again with a higher epoch (b, or a after its retry pause).
  ASSERT_TRUE(Eventually([&] { return a.epoch > first || b.epoch > first; }, milliseconds(3000)));
}

// A clock the test moves (what the gate sees is all that matters here).
class MovableClock final : public cxlkv::coherence::Clock {
 public:
  std::int64_t NowMs() override { return base_.NowMs() + offset_.load(); }
  void Move(std::int64_t ms) { offset_ += ms; }

 private:
  cxlkv::coherence::SteadyClock base_;
  std::atomic<std::int64_t> offset_{0};
};

// Audit-ha #5: once WriteAllowed found the deadline passed (a store was dropped), nothing
// reopens the gate in that session: not a deadline that moves ahead again (the clock moved
// back here stands for a keep-alive answered just after the deadline that extends it), not a
// keep-alive answered later. Otherwise stores after the gap land and the dropped ones in the
// middle are lost, which no crash produces. (Before the sticky gate: open again at once.)
TEST_F(EtcdTest, TheWriteGateOnceClosedStaysClosedInTheSession) {
  const std::string key = prefix_ + "leader";
  MovableClock clock;
  Candidate a;
  a.Start(*cluster_, key, "a", /*ttl_s=*/3, &clock);
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0; }, milliseconds(5000)));
  ASSERT_TRUE(a.election->WriteAllowed());
  const std::int64_t past = a.election->write_deadline_ms() - clock.NowMs() + 1;
  clock.Move(past);
  EXPECT_FALSE(a.election->WriteAllowed()) << "the deadline passed";
  clock.Move(-past);
  EXPECT_LT(clock.NowMs(), a.election->write_deadline_ms());
  EXPECT_FALSE(a.election->WriteAllowed()) << "the gate reopened within the session";
  // The next keep-alive (every TTL/3) ends the session instead of extending it.
  ASSERT_TRUE(Eventually([&] { return a.losses.load() == 1; }, milliseconds(3000)));
  // Closed until a new session's term: the candidate campaigns again at once, and its new
  // gate may open between a look at `wins` and WriteAllowed (seen once under ASan), so an open
  // gate must be that new term's, whose `elected` follows.
  const int wins_before = a.wins.load();
  for (int i = 0; i < 20 && a.wins.load() == wins_before; ++i) {
    if (a.election->WriteAllowed()) {
      EXPECT_TRUE(Eventually([&] { return a.wins.load() > wins_before; }, milliseconds(2000)))
          << "the gate opened again without a new term";
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  // A new session, a new term, a new gate.
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0; }, milliseconds(5000)));
  EXPECT_TRUE(a.election->WriteAllowed());
}

// The leader key deleted by hand while the leader's lease lives: the next leader does not
// start before the old one's fence closed.
// The election's write gate as a rule (write_deadline.h), on a clock the test names: the
// deadline is a keep-alive's send + TTL − margin; a keep-alive back after the deadline does
// not renew; once a caller found the deadline passed the gate stays closed until a new
// session (the rule the non-coherence simulator's owner term runs on, tests/prefix_sim.h).
TEST(WriteDeadline, MovesWithKeepAlivesAndOnceClosedStaysClosed) {
  orchestrator::WriteDeadline gate;
  EXPECT_FALSE(gate.Allowed(0)) << "no session, no writes";
  gate.Start(/*sent_ms=*/1000, /*ttl_ms=*/3000, /*margin_ms=*/750);
  EXPECT_EQ(gate.until(), 3250);
  EXPECT_TRUE(gate.Allowed(3249));
  // A keep-alive sent at 2000, back at 2100: the deadline moves to 2000 + 3000 − 750.
  EXPECT_TRUE(gate.Renew(2000, 3000, 750, 2100));
  EXPECT_EQ(gate.until(), 4250);
  // One sent earlier than the last, answered late: never moves the deadline back.
  EXPECT_TRUE(gate.Renew(1500, 3000, 750, 2200));
  EXPECT_EQ(gate.until(), 4250);
  // Back only after the deadline: refused, the session is over.
  EXPECT_FALSE(gate.Renew(4000, 3000, 750, 4250));
  EXPECT_EQ(gate.until(), 4250);
  // Found passed: closed, and a deadline that moves on does not reopen it (audit-ha #5).
  EXPECT_FALSE(gate.Allowed(4250));
  EXPECT_TRUE(gate.closed());
  EXPECT_FALSE(gate.Allowed(100));
  EXPECT_FALSE(gate.Renew(4300, 3000, 750, 100));
  // Closed by the session's end alike; a new session reopens it.
  gate.Start(5000, 3000, 750);
  EXPECT_TRUE(gate.Allowed(5000));
  gate.Close();
  EXPECT_FALSE(gate.Allowed(5000));
  gate.End();
  EXPECT_EQ(gate.until(), 0);
}

TEST_F(EtcdTest, LeaderKeyDeletedByHandNoOverlap) {
  const std::string key = prefix_ + "leader";
  Candidate a;
  a.Start(*cluster_, key, "a", /*ttl_s=*/2);
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0; }, milliseconds(5000)));
  Candidate b;
  b.Start(*cluster_, key, "b", 2);
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(a.election->WriteAllowed());
  ASSERT_EQ(*client_->Delete(key), 1);
  // Poll a's fence and b's election together.
  std::int64_t a_closed = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        if (a_closed == 0 && !a.election->WriteAllowed()) a_closed = NowMs();
        return b.epoch != 0 || (a.epoch != 0 && a.wins.load() > 1);
      },
      milliseconds(10000)));
  ASSERT_NE(a_closed, 0) << "a new leader while the old one may still write";
  const std::int64_t next = b.epoch != 0 ? b.elected_at.load() : a.elected_at.load();
  EXPECT_GE(next, a_closed);
}

// The fence closes on the leader's own clock when etcd stops answering its keep-alives (here:
// quorum lost, two of three members stopped), no later than its last answered keep-alive's
// send time + TTL - margin; and no other candidate is elected before that deadline.
TEST(EtcdElectionFence, ClosesWhenKeepAlivesGoUnansweredBeforeAnySuccessor) {
  CXLKV_SKIP_WITHOUT_ETCD();
  EtcdCluster cluster(3);
  std::string why;
  ASSERT_TRUE(cluster.Start(&why)) << why;
  const std::string key = "/fence/leader";
  Candidate a, b;
  a.Start(cluster, key, "a", /*ttl_s=*/3);
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0; }, milliseconds(5000)));
  b.Start(cluster, key, "b", 3);
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(a.election->WriteAllowed());
  const std::int64_t deadline_before = a.election->write_deadline_ms();

  // Stop the raft leader and one follower: no quorum, no keep-alive is answered.
  const int l = cluster.LeaderIndex();
  ASSERT_GE(l, 0);
  const int f = (l + 1) % 3;
  cluster.Pause(l);
  cluster.Pause(f);
  // The fence closes by the deadline of the last keep-alive answered before the stop (the
  // deadline moves only forward, by at most one more answered keep-alive).
  std::int64_t closed_at = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        if (a.election->WriteAllowed()) return false;
        closed_at = a.election->clock().NowMs();
        return true;
      },
      milliseconds(6000)));
  // At most one more keep-alive (TTL/3 later) was answered after deadline_before was read;
  // 500 ms of slack for this thread's polling on a loaded machine.
  EXPECT_LE(closed_at, deadline_before + 3000 / 3 + 500);
  ASSERT_TRUE(Eventually([&] { return a.losses.load() == 1; }, milliseconds(2000)));
  {
    absl::MutexLock lk(&a.mu);
    EXPECT_NE(a.why.find("keep-alive"), std::string::npos) << a.why;
  }
  const std::int64_t a_lost = a.lost_at;
  cluster.Resume(l);
  cluster.Resume(f);
  // Someone leads again (a new term), and whoever it is was elected after a's fence closed.
  ASSERT_TRUE(Eventually([&] { return a.epoch != 0 || b.epoch != 0; }, milliseconds(15000)));
  const std::int64_t next = a.epoch != 0 ? a.elected_at.load() : b.elected_at.load();
  EXPECT_GT(next, a_lost);
}

// etcd with authentication (issue #29, audit-ha #7): a client given a user gets a token
// (Auth.Authenticate) and sends it with every call: puts, guarded transactions, leases and
// their keep-alives, watches and an election all work; a client without a user, or with a
// wrong password, is refused, the latter naming the user. One member of its own (auth on).
TEST(EtcdAuth, AClientWithAUserWorksAndOthersAreRefused) {
  CXLKV_SKIP_WITHOUT_ETCD();
  CXLKV_SKIP_WITHOUT_ETCDCTL();
  EtcdCluster etcd(1);
  std::string why;
  ASSERT_TRUE(etcd.Start(&why)) << why;
  ASSERT_TRUE(etcd.Ctl("user add root:rootpw --interactive=false", &why)) << why;
  ASSERT_TRUE(etcd.Ctl("auth enable", &why)) << why;
  ed::ClientOptions o;
  o.endpoints = etcd.endpoints();
  o.call_timeout_ms = 2000;
  o.user = "root";
  o.password = "rootpw";
  auto c = ed::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Put("/auth/a", "1").ok());
  auto got = (*c)->Get("/auth/a");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  using C = ed::Compare;
  auto txn = (*c)->Txn({C::ModRevision("/auth/a", C::Result::kEqual, got->kvs[0].mod_revision)},
                       {ed::Op::Put("/auth/a", "2")}, {});
  ASSERT_TRUE(txn.ok() && txn->succeeded) << txn.status();
  auto lease = (*c)->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE((*c)->KeepAliveOnce(lease->id, 1000).ok());
  auto w = (*c)->NewWatch("/auth/", ed::PrefixEnd("/auth/"), 0, false);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*c)->Put("/auth/b", "3").ok());
  std::vector<ed::Event> events;
  ASSERT_TRUE(Eventually(
      [&] {
        auto ev = (*w)->Next(milliseconds(100));
        if (ev.ok()) events.insert(events.end(), ev->begin(), ev->end());
        return !events.empty();
      },
      milliseconds(3000)));
  EXPECT_EQ(events[0].kv.key, "/auth/b");
  // A leader election through the authenticated client.
  ed::ElectionOptions eo;
  eo.leader_key = "/auth/election/leader";
  eo.candidate_prefix = "/auth/election/c/";
  eo.value = "me";
  eo.ttl_s = 2;
  std::atomic<std::int64_t> epoch{0};
  ed::LeaderElection::Callbacks cb;
  cb.elected = [&](const ed::Term& t) {
    epoch = t.epoch;
    return absl::OkStatus();
  };
  cb.lost = [](const ed::Term&, const std::string&) {};
  auto e = ed::LeaderElection::Start(**c, eo, std::move(cb));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(Eventually([&] { return epoch.load() > 0; }, milliseconds(5000)));
  (*e)->Stop();

  ed::ClientOptions none = o;
  none.user.clear();
  auto anon = ed::Client::Create(none);
  ASSERT_TRUE(anon.ok());
  EXPECT_FALSE((*anon)->Get("/auth/a").ok()) << "etcd answered a client without a user";
  ed::ClientOptions wrong = o;
  wrong.password = "not-the-password";
  auto bad = ed::Client::Create(wrong);
  ASSERT_TRUE(bad.ok());
  auto refused = (*bad)->Get("/auth/a");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'root'"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("etcd.password_file"), std::string::npos)
      << refused.status();
}

// etcd over TLS: a member serving clients with a certificate for 127.0.0.1 signed by a CA the
// test makes (openssl); a client given the CA (ClientOptions::ca_pem, etcd.ca) reads and
// writes; a plaintext client gets no answer.
TEST(EtcdTls, AClientWithTheCaSpeaksTls) {
  CXLKV_SKIP_WITHOUT_ETCD();
  if (::access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/openssl";
  const cxlkv::testing::TempDir scratch("etcd-tls", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::ofstream(dir + "/san.ext") << "subjectAltName=IP:127.0.0.1\n";
  const std::string cmd =
      "cd " + dir + " && openssl req -x509" + ec +
      " -keyout ca.key -out ca.pem -days 1 -subj /CN=cxlkv-test-ca && openssl req" + ec +
      " -keyout m.key -out m.csr -subj /CN=127.0.0.1 && openssl x509 -req -in m.csr -CA ca.pem "
      "-CAkey ca.key -CAcreateserial -out m.pem -days 1 -extfile san.ext";
  ASSERT_EQ(std::system(("(" + cmd + ") >" + dir + "/openssl.log 2>&1").c_str()), 0)
      << "see " << dir << "/openssl.log";
  std::stringstream ca;
  ca << std::ifstream(dir + "/ca.pem").rdbuf();
  {
    EtcdCluster etcd(1);
    etcd.UseTls(dir + "/m.pem", dir + "/m.key", ca.str());
    std::string why;
    ASSERT_TRUE(etcd.Start(&why)) << why;
    auto c = etcd.NewClient();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->Put("/tls/a", "1").ok());
    auto got = c->Get("/tls/a");
    ASSERT_TRUE(got.ok() && got->kvs.size() == 1) << got.status();
    ed::ClientOptions plain;
    plain.endpoints = etcd.endpoints();
    plain.call_timeout_ms = 500;
    auto p = ed::Client::Create(plain);
    ASSERT_TRUE(p.ok());
    EXPECT_FALSE((*p)->Get("/tls/a").ok()) << "a plaintext client was answered";
  }
}

}  // namespace
}  // namespace cxlkv::testing
