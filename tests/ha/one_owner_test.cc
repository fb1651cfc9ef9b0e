// One owner per domain in every mode (docs/orchestrator.md "One orchestrator per domain",
// docs/ha.md "A single orchestrator beside elected ones"): a single orchestrator (no [etcd])
// and orchestrators elected through etcd on one domain refuse each other, in both orders, on
// one machine (the region locks) and across machines (what the domain itself records: the
// fence line and the single owner's mark). "Another machine" is played in this process by
// orchestrators opened without the region locks (OpenOptions::lock_regions), so that only the
// domain's own lines can tell them apart. Hosts hold extents throughout, and a sampler checks
// every millisecond that no extent is valid on two hosts at once.
//
// The orchestrators run in this process (Orchestrator::Open), on a real 3-member etcd
// (tests/etcd_cluster.h; skipped without Debian's etcd-server).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "fence.h"
#include "gtest/gtest.h"
#include "ha/extent_audit.h"
#include "ha/fence_file.h"
#include "ha/namespaces.h"

namespace cxlkv::testing {
namespace {

// One domain's files (a 128 MiB pool of 8 extents, a 4 MiB prefix domain) in a temporary
// directory, and a subdirectory of each orchestrator's own (its socket and state file).
class Bed {
 public:
  Bed() {
    char tmpl[] = "/tmp/cxlkv-one-owner-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  ~Bed() {
    const std::string cmd = "rm -rf " + dir_;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  Bed(const Bed&) = delete;
  Bed& operator=(const Bed&) = delete;

  std::string socket(const std::string& who) const { return Own(who) + "/o.sock"; }
  std::string state(const std::string& who) const { return Own(who) + "/d.state"; }
  std::string domain_file() const { return dir_ + "/domain"; }

  // Orchestrator `who` of the domain: single without `etcd`, a candidate with it.
  absl::StatusOr<std::unique_ptr<orch::Orchestrator>> Open(const std::string& who,
                                                           const EtcdCluster* etcd,
                                                           const orch::OpenOptions& options) {
    std::string t =
        absl::StrCat("[domain]\nname = \"one\"\npool = \"file:", dir_,
                     "/pool?size=128M&reserve=0\"\nprefix_domain = \"file:", dir_,
                     "/domain?size=4M\"\nextent_size = \"16M\"\nstate_file = \"", state(who),
                     "\"\nindex_entries = 1024\nmax_hosts = 4\n[rpc]\nsocket = \"", socket(who),
                     "\"\n[metrics]\nlisten = \"\"\n[capacity]\ndefault_share = 1.0\n");
    if (etcd != nullptr) {
      absl::StrAppend(&t, "[etcd]\nendpoints = ", etcd->EndpointsToml(), "\nnode = \"", who,
                      "\"\nttl_s = 3\n");
    }
    auto c = orch::ParseConfig(t, who + ".toml");
    if (!c.ok()) return c.status();
    return orch::Orchestrator::Open(*c, options);
  }

  // Copies `from`'s state file to `to`'s (an operator handing a domain's state over).
  void CopyState(const std::string& from, const std::string& to) const {
    std::error_code ec;
    std::filesystem::copy_file(state(from), state(to),
                               std::filesystem::copy_options::overwrite_existing, ec);
    EXPECT_FALSE(ec) << state(from) << " -> " << state(to) << ": " << ec.message();
  }

  // The domain's fence line and the single owner's mark, as the file holds them now.
  co::OwnerFenceLine FenceLine() const { return Line<co::OwnerFenceLine>(co::kOwnerFenceOffset); }
  co::SingleOwnerLine Mark() const { return Line<co::SingleOwnerLine>(co::kSingleOwnerOffset); }

 private:
  std::string Own(const std::string& who) const {
    const std::string d = dir_ + "/" + who;
    ::mkdir(d.c_str(), 0755);
    return d;
  }
  template <typename T>
  T Line(std::uint64_t offset) const {
    T l{};
    const int fd = ::open(domain_file().c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << domain_file();
    if (fd < 0) return l;
    EXPECT_EQ(::pread(fd, &l, sizeof(l), static_cast<off_t>(offset)),
              static_cast<ssize_t>(sizeof(l)));
    ::close(fd);
    return l;
  }
  std::string dir_;
};

std::string Role(orch::Orchestrator& o) { return o.status().role; }

// An orchestrator on another machine: it cannot see this one's region locks (and forks no
// write-back agent in this test process).
constexpr orch::OpenOptions kOtherMachine{.write_back_agent = false, .lock_regions = false};

class OneOwnerTest : public EtcdClusterTest {
 protected:
  // Host 0 joins the single orchestrator, grows 3 extents and heartbeats.
  void StartHost0(const Bed& bed) {
    auto h = orch::HostClient::Connect(bed.socket("single"), 0);
    ASSERT_TRUE(h.ok()) << h.status();
    host0_ = *std::move(h);
    auto g = host0_->Grow(3);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(g->size(), 3u);
    host0_->StartHeartbeats();
    sampler_.Watch(host0_.get());
  }
  // For `ms`: host 1 tries to join `ha` and grow 3 extents there, while the candidate must not
  // lead. What it was told, in *refused.
  void Host1TriesTheCandidate(const Bed& bed, orch::Orchestrator& ha, std::int64_t ms,
                              std::string* refused) {
    const std::int64_t t0 = NowMs();
    bool led = false;
    while (NowMs() - t0 < ms) {
      if (host1_ == nullptr) {
        auto c = orch::HostClient::Connect(bed.socket("ha"), 1);
        if (c.ok()) {
          host1_ = *std::move(c);
          sampler_.Watch(host1_.get());
        } else {
          *refused = std::string(c.status().message());
        }
      }
      if (host1_ != nullptr) (void)host1_->Grow(3);
      led = led || Role(ha) == "leader";
      std::this_thread::sleep_for(milliseconds(100));
    }
    EXPECT_FALSE(led) << "the candidate took over a domain that a live single orchestrator owns";
    EXPECT_EQ(host1_, nullptr) << "host 1 joined the candidate; it holds "
                               << (host1_ ? host1_->extents().size() : 0) << " extents";
  }
  std::unique_ptr<orch::HostClient> host0_, host1_;
  ExtentAudit sampler_;  // after the hosts: it stops before they go
};

// The order of the report (#40): a single orchestrator serves, host 0 holds extents 0-2; a
// candidate with [etcd] starts on another machine, on the same pool and prefix domain, with its
// own state file (a copy of the single's taken before any grant) and socket. It is elected and
// must refuse the domain: before, it wrote the fence line, took the domain over beside the
// single (which never noticed) and granted host 1 extents 0-2 while host 0 held them valid.
// Then the handover an operator makes: the single's state file to the candidate, the single
// stopped (it marks the domain released); the candidate takes over, host 0's extents intact.
TEST_F(OneOwnerTest, ACandidateOnAnotherMachineRefusesALiveSingleOrchestrator) {
  Bed bed;
  auto single = bed.Open("single", nullptr, {.new_domain = true, .lock_regions = false});
  ASSERT_TRUE(single.ok()) << single.status();
  bed.CopyState("single", "ha");
  ASSERT_TRUE((*single)->Start().ok());
  ASSERT_NO_FATAL_FAILURE(StartHost0(bed));
  auto ha = bed.Open("ha", etcd_.get(), kOtherMachine);
  ASSERT_TRUE(ha.ok()) << ha.status();
  ASSERT_TRUE((*ha)->Start().ok());

  std::string refused;
  Host1TriesTheCandidate(bed, **ha, 6000, &refused);
  EXPECT_EQ(sampler_.FirstDoubleHolding(), "");
  EXPECT_EQ(bed.FenceLine().epoch, 0u) << "the candidate claimed the domain";
  // The host is told why, by the orchestrator that answered.
  EXPECT_NE(refused.find("single cxlkv-orchestrator"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("no orchestrator answered"), std::string::npos) << refused;
  EXPECT_TRUE((*ha)->fatal().ok()) << "a refused candidate waits; it does not exit";
  EXPECT_EQ(Role(**single), "single");
  EXPECT_TRUE(host0_->HeartbeatOnce().ok()) << "the single orchestrator stopped serving";

  // The handover.
  bed.CopyState("single", "ha");
  (*single)->Stop();
  single->reset();
  const co::SingleOwnerLine mark = bed.Mark();
  EXPECT_TRUE(co::LineValid(mark));
  EXPECT_EQ(mark.state, co::kSingleReleased);
  ASSERT_TRUE(Eventually([&] { return Role(**ha) == "leader"; }, milliseconds(20000)))
      << "the candidate did not take over once the single orchestrator released the domain";
  auto h1 = orch::HostClient::Connect(bed.socket("ha"), 1);
  ASSERT_TRUE(h1.ok()) << h1.status();
  host1_ = *std::move(h1);
  sampler_.Watch(host1_.get());
  auto g = host1_->Grow(3);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const orch::GrantedExtent& e : *g) EXPECT_GE(e.index, 3u) << "host 0's extent lent again";
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(sampler_.FirstDoubleHolding(), "");
  EXPECT_GT(sampler_.samples(), 1000u);
  (*ha)->Stop();
}

// The other order across machines: a candidate stands by (etcd names a leader that is the
// test's own key), and a single orchestrator starts on another machine: nothing in the domain
// tells it of a candidate that never led, so it serves, and host 0 holds extents. When the
// candidate is elected it must refuse the domain: before, it took it over beside the single.
TEST_F(OneOwnerTest, ACandidateElectedAfterASingleOrchestratorStartedElsewhereRefusesIt) {
  Bed bed;
  {
    // The domain ran in single mode once (no hosts) and was stopped: its state file is what a
    // candidate imports.
    auto first = bed.Open("single", nullptr, {.new_domain = true, .lock_regions = false});
    ASSERT_TRUE(first.ok()) << first.status();
  }
  bed.CopyState("single", "ha");
  auto etcd = etcd_->NewClient();
  auto lease = etcd->GrantLease(60);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(
      etcd->Put("/cxlkv/v1/default/domains/one/leader", "{\"node\":\"test\"}", lease->id).ok());
  auto ha = bed.Open("ha", etcd_.get(), kOtherMachine);
  ASSERT_TRUE(ha.ok()) << ha.status();
  ASSERT_TRUE((*ha)->Start().ok());
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_EQ(Role(**ha), "standby");

  auto single = bed.Open("single", nullptr, {.lock_regions = false});
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->Start().ok());
  ASSERT_NO_FATAL_FAILURE(StartHost0(bed));
  ASSERT_TRUE(etcd->RevokeLease(lease->id).ok());  // the candidate campaigns and wins now

  std::string refused;
  Host1TriesTheCandidate(bed, **ha, 6000, &refused);
  EXPECT_EQ(sampler_.FirstDoubleHolding(), "");
  EXPECT_EQ(bed.FenceLine().epoch, 0u) << "the candidate claimed the domain";
  EXPECT_NE(refused.find("single cxlkv-orchestrator"), std::string::npos) << refused;
  EXPECT_TRUE((*single)->fatal().ok());
  EXPECT_TRUE(host0_->HeartbeatOnce().ok()) << "the single orchestrator stopped serving";
  (*ha)->Stop();
  (*single)->Stop();
}

// On one machine the region locks decide, at Open, in both orders: a single orchestrator
// locks the pool and the prefix domain exclusively, candidates with [etcd] share them. Before,
// candidates took no region lock: each order started a second owner.
TEST_F(OneOwnerTest, OnOneMachineTheRegionLocksKeepSingleAndElectedOrchestratorsApart) {
  Bed bed;
  auto single = bed.Open("single", nullptr, {.new_domain = true});
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->Start().ok());
  ASSERT_NO_FATAL_FAILURE(StartHost0(bed));
  bed.CopyState("single", "ha");
  auto refused = bed.Open("ha", etcd_.get(), {.write_back_agent = false});
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("single cxlkv-orchestrator"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(host0_->HeartbeatOnce().ok());
  EXPECT_EQ(host0_->extents().size(), 3u);
  (*single)->Stop();
  single->reset();

  // Candidates first: two of them share the regions; a single orchestrator is refused.
  bed.CopyState("single", "ha");
  bed.CopyState("single", "ha2");
  auto a = bed.Open("ha", etcd_.get(), {.write_back_agent = false});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = bed.Open("ha2", etcd_.get(), {.write_back_agent = false});
  ASSERT_TRUE(b.ok()) << b.status();
  auto again = bed.Open("single", nullptr, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("[etcd]"), std::string::npos) << again.status();
  EXPECT_EQ(sampler_.FirstDoubleHolding(), "");
}

// A running single orchestrator re-reads the fence line in its batches: once another owner
// wrote it (an elected leader that started at the same instant, or one built before the
// single owner's mark existed), it stops owning at once: no owner batch, grant or heartbeat
// answer more, its mark released, and fatal() (main exits with status 1). Before, it never
// looked at the line after Open and went on owning beside the leader.
TEST_F(OneOwnerTest, ASingleOrchestratorStopsOwningOnceAnotherOwnerWroteTheFenceLine) {
  Bed bed;
  auto single = bed.Open("single", nullptr, {.new_domain = true});
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->Start().ok());
  ASSERT_NO_FATAL_FAILURE(StartHost0(bed));
  ASSERT_NO_FATAL_FAILURE(WriteFenceLineInFile(bed.domain_file(), 9, 1));
  ASSERT_TRUE(Eventually([&] { return !(*single)->fatal().ok(); }, milliseconds(3000)))
      << "the single orchestrator did not notice the fence line";
  const std::string why((*single)->fatal().message());
  EXPECT_NE(why.find("epoch 9"), std::string::npos) << why;
  auto grow = host0_->Grow(1);
  EXPECT_FALSE(grow.ok());
  EXPECT_NE(grow.status().message().find("stopped owning"), std::string::npos) << grow.status();
  EXPECT_FALSE(host0_->HeartbeatOnce().ok());
  const co::SingleOwnerLine mark = bed.Mark();
  EXPECT_TRUE(co::LineValid(mark));
  EXPECT_EQ(mark.state, co::kSingleReleased);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(bed.Mark().seq, mark.seq) << "owner batches went on";
  (*single)->Stop();
}

// Two single orchestrators on two machines sharing the memory (no region lock between them):
// the second is refused while the first runs (its mark moves), and starts once the first
// released the domain. A serving mark that does not move (its run was killed and never
// released it) is taken over after the wait, saying so. Before, nothing kept them apart.
TEST(OneOwner, ASecondSingleOrchestratorOnAnotherMachineIsRefusedWhileTheFirstRuns) {
  Bed bed;
  auto first = bed.Open("single", nullptr, {.new_domain = true, .lock_regions = false});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Start().ok());
  bed.CopyState("single", "single2");
  auto second = bed.Open("single2", nullptr, {.lock_regions = false});
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("single cxlkv-orchestrator"), std::string::npos)
      << second.status();
  EXPECT_EQ(Role(**first), "single");
  EXPECT_TRUE((*first)->fatal().ok()) << (*first)->fatal();
  (*first)->Stop();
  first->reset();
  EXPECT_EQ(bed.Mark().state, co::kSingleReleased);
  second = bed.Open("single2", nullptr, {.lock_regions = false});
  ASSERT_TRUE(second.ok()) << second.status();
  second->reset();

  // A run that ended without releasing its mark (kill -9 on another machine): its mark says
  // serving and never moves.
  co::SingleOwnerLine dead = bed.Mark();
  dead.state = co::kSingleServing;
  dead.pid = 1;
  std::memcpy(dead.host, "elsewhere", 10);
  {
    const int fd = ::open(bed.domain_file().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    co::DirectMem mem(static_cast<std::byte*>(p), 4096);
    orch::WriteSingleOwnerLine(mem, dead);
    ::munmap(p, 4096);
    ::close(fd);
  }
  const std::int64_t t0 = NowMs();
  auto after_dead = bed.Open("single2", nullptr, {.lock_regions = false});
  ASSERT_TRUE(after_dead.ok()) << after_dead.status();
  EXPECT_GE(NowMs() - t0, orch::SingleOwnerStillAfterMs(dead)) << "it did not watch the mark";
  const co::SingleOwnerLine mine = bed.Mark();
  EXPECT_EQ(mine.state, co::kSingleServing);
  EXPECT_EQ(mine.pid, static_cast<std::uint32_t>(::getpid()));
}

}  // namespace
}  // namespace cxlkv::testing
