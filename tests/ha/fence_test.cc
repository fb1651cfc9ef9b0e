// Orchestrator HA (docs/ha.md), the fence: the fenced Mem and the fence and release lines on
// the non-coherence simulator (Fence.*, no etcd); then a leader in the test's process whose
// own clock passed its write deadline, a foreign fence line, owner writes outside the loop.
// The fixture: tests/ha/ha_test.h.
#include "fence.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/coherence/sim.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "cxlkv/orchestrator/operator_client.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/fence_audit.h"
#include "ha/fence_file.h"
#include "ha/ha_orchestrator.h"
#include "ha/ha_test.h"
#include "ha/jumping_clock.h"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

// ---- the fence, without etcd ------------------------------------------------------------------

class Gate final : public orch::WriteGate {
 public:
  bool WriteAllowed() const override { return open.load(); }
  std::atomic<bool> open{true};
};

TEST(Fence, FencedMemDropsStoresOnceTheGateCloses) {
  std::vector<std::byte> buf(8192);
  co::DirectMem direct(buf.data(), buf.size());
  Gate gate;
  orch::FencedMem mem(direct, gate);
  const std::uint64_t one = 1, two = 2;
  mem.Write(64, &one, sizeof(one));
  mem.Flush(64, sizeof(one));
  gate.open = false;
  mem.Write(64, &two, sizeof(two));
  mem.WriteNt(128, &two, sizeof(two));
  mem.Fence();
  std::uint64_t at64 = 0, at128 = 0;
  mem.Read(64, &at64, sizeof(at64));
  mem.Read(128, &at128, sizeof(at128));
  EXPECT_EQ(at64, 1u);
  EXPECT_EQ(at128, 0u);
  EXPECT_EQ(mem.dropped(), 2u);
  gate.open = true;  // (an election never reopens a closed gate; the Mem does not care)
  mem.Write(64, &two, sizeof(two));
  mem.Read(64, &at64, sizeof(at64));
  EXPECT_EQ(at64, 2u);
}

// The release (docs/ha.md "Release") on the non-coherence simulator: a store the old machine
// made but never wrote back (its process stopped or killed between the store and the clwb)
// reaches memory before the release line does, so a successor on another machine that sees
// the release finds it. Without the write-back of the domain range, the store would still sit
// in the old machine's cache, to land over the successor's lines at any later time (audit-ha
// #2).
TEST(Fence, ReleaseWritesTheOldMachinesCacheBackBeforeTheReleaseLine) {
  co::SimMemory media(64 * 1024, 1, co::SimOptions{});
  auto old_machine = media.NewView(0);
  auto successor = media.NewView(0);
  const std::uint64_t entry = 8192, value = 0xAB;
  old_machine->Write(entry, &value, sizeof(value));  // dirty in its cache, never flushed
  std::uint64_t seen = 0;
  successor->Invalidate(entry, sizeof(seen));
  successor->Read(entry, &seen, sizeof(seen));
  ASSERT_EQ(seen, 0u) << "the simulator lost its non-coherence";
  co::OwnerReleaseLine r{};
  ASSERT_TRUE(orch::ReadReleaseLine(*successor, &r));  // all zero: nothing released yet
  EXPECT_EQ(r.epoch, 0u);
  co::OwnerReleaseLine w{};
  w.epoch = 5;
  w.cluster_id = 9;
  w.by = co::kReleasedByAgent;
  orch::ReleaseTerm(*old_machine, media.size_bytes(), w);
  ASSERT_TRUE(orch::ReadReleaseLine(*successor, &r));
  EXPECT_EQ(r.epoch, 5u);
  EXPECT_EQ(r.cluster_id, 9u);
  EXPECT_EQ(r.version, co::kOwnerReleaseVersion);
  successor->Invalidate(entry, sizeof(seen));
  successor->Read(entry, &seen, sizeof(seen));
  EXPECT_EQ(seen, value) << "the release line was visible before the old machine's store";
  // Lies in the header page, before the fence line, clear of the header.
  EXPECT_EQ(co::kOwnerReleaseOffset + 64, co::kOwnerFenceOffset);
}

// Machines without coherence whose write-backs complete only at a fence, and an Evict only at
// the next full fence: a dropped flush, fence or invalidate on either side shows.
co::SimOptions HeldWriteBacks() {
  co::SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  return o;
}

// The single orchestrator's mark between machines without coherence (the candidate on another
// machine reads it, tests/ha/one_owner_test.cc across machines): a reader that read the line
// before (its cache holds the old copy) sees the mark and then the release once the writer's
// call returned. Write-backs complete only at a fence and an Evict only at the next full fence,
// so a missing flush, fence or invalidate on either side shows.
TEST(Fence, TheSingleOwnerMarkCrossesMachinesWithoutCoherence) {
  co::SimMemory media(64 * 1024, 2, HeldWriteBacks());
  auto single = media.NewView(0);
  auto candidate = media.NewView(0);
  co::SingleOwnerLine seen{};
  ASSERT_TRUE(orch::ReadSingleOwnerLine(*candidate, &seen));  // cached now: all zero
  EXPECT_EQ(seen.state, 0u);
  co::SingleOwnerLine mark{};
  mark.seq = 1;
  mark.started_ms = 77;
  mark.state = co::kSingleServing;
  mark.pid = 4242;
  mark.period_ms = 10;
  orch::WriteSingleOwnerLine(*single, mark);
  ASSERT_TRUE(orch::ReadSingleOwnerLine(*candidate, &seen));
  EXPECT_EQ(seen.state, co::kSingleServing) << "the candidate read its stale copy of the mark";
  EXPECT_EQ(seen.pid, 4242u);
  EXPECT_EQ(seen.version, co::kSingleOwnerVersion);
  mark.state = co::kSingleReleased;
  orch::WriteSingleOwnerLine(*single, mark);
  ASSERT_TRUE(orch::ReadSingleOwnerLine(*candidate, &seen));
  EXPECT_EQ(seen.state, co::kSingleReleased) << "the release did not reach the candidate";
}

// A single orchestrator's release (DomainCore::ReleaseSingleLocked, single_owner.cc) writes
// its machine's cache of the whole domain back before the mark says released: a candidate on
// another machine then reads every store of the run, including ones past the first 1 MiB
// chunk and in the last partial one (the write-back goes in chunks). Killed here, not by the
// processes' tests: on one coherent machine a dropped write-back cannot show.
TEST(Fence, ASingleOrchestratorsReleaseWritesBackTheWholeDomain) {
  const std::uint64_t len = (std::uint64_t{2} << 20) + 4096;  // two chunks and a partial one
  co::SimMemory media(len, 1, HeldWriteBacks());
  auto single = media.NewView(0);
  auto candidate = media.NewView(0);
  const std::uint64_t offsets[] = {0, 4096, (std::uint64_t{1} << 20) + 64, len - 64};
  for (const std::uint64_t off : offsets) {
    const std::uint64_t value = 0xC0DE0000 + off;
    single->Write(off, &value, sizeof(value));  // dirty in its cache, never flushed
  }
  std::uint64_t seen = 0;
  candidate->Invalidate(offsets[1], sizeof(seen));
  candidate->Read(offsets[1], &seen, sizeof(seen));
  ASSERT_EQ(seen, 0u) << "the simulator lost its non-coherence";
  orch::WriteBackDomain(*single, media.size_bytes());
  for (const std::uint64_t off : offsets) {
    candidate->Invalidate(off, sizeof(seen));
    candidate->Read(off, &seen, sizeof(seen));
    EXPECT_EQ(seen, 0xC0DE0000 + off) << "offset " << off << " not in memory after the write-back";
  }
}

// The fence and release lines between machines without coherence: a reader on another
// machine that read the line before (its cache holds the old copy) sees the latest once the
// writer's call returned. Write-backs here complete only at a fence, and an Evict only at the
// next full fence, so a missing flush, fence or invalidate on either side shows.
TEST(Fence, LinesCrossMachinesWithoutCoherence) {
  co::SimMemory media(64 * 1024, 2, HeldWriteBacks());
  auto writer = media.NewView(0);
  auto reader = media.NewView(0);
  // Each line is read (and so cached) right before the writer writes it, and read again right
  // after with nothing in between: only the read's own invalidate can drop the stale copy.
  co::OwnerFenceLine f{};
  co::OwnerReleaseLine r{};
  ASSERT_TRUE(orch::ReadFenceLine(*reader, &f));  // cached now: all zero
  co::OwnerFenceLine w{};
  w.epoch = 12;
  w.cluster_id = 5;
  orch::WriteFenceLine(*writer, w);
  ASSERT_TRUE(orch::ReadFenceLine(*reader, &f));
  EXPECT_EQ(f.epoch, 12u);
  ASSERT_TRUE(orch::ReadReleaseLine(*reader, &r));  // cached now: all zero
  co::OwnerReleaseLine rl{};
  rl.epoch = 12;
  rl.cluster_id = 5;
  orch::ReleaseTerm(*writer, media.size_bytes(), rl);
  ASSERT_TRUE(orch::ReadReleaseLine(*reader, &r));
  EXPECT_EQ(r.epoch, 12u);
}

// The fenced view passes every flush, invalidate, eviction and fence through (only stores are
// gated): a leader's write-backs and a successor's fresh reads go through it.
TEST(Fence, FencedMemPassesCacheOperationsThrough) {
  co::SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  co::SimMemory media(64 * 1024, 3, o);
  auto va = media.NewView(0);
  auto vb = media.NewView(0);
  Gate gate;
  orch::FencedMem a(*va, gate), b(*vb, gate);
  const std::uint64_t x = 4096 * 2, y = 4096 * 3, one = 1, two = 2;
  std::uint64_t got = 0;
  b.Read(x, &got, sizeof(got));  // cached by b
  b.Read(y, &got, sizeof(got));
  a.Write(x, &one, sizeof(one));
  a.Flush(x, sizeof(one));
  a.Fence();
  b.Invalidate(x, sizeof(got));
  b.Read(x, &got, sizeof(got));
  EXPECT_EQ(got, 1u) << "a's flush or fence, or b's invalidate, did not pass";
  a.Write(y, &two, sizeof(two));
  a.Flush(y, sizeof(two));
  a.FullFence();
  b.Evict(y, sizeof(got));
  b.FullFence();
  b.Read(y, &got, sizeof(got));
  EXPECT_EQ(got, 2u) << "a's full fence, or b's eviction or full fence, did not pass";
}

// What a successor waits for: the release of exactly the term the fence line names.
TEST(Fence, ASuccessorWaitsForTheReleaseOfTheTermTheFenceLineNames) {
  co::OwnerFenceLine f{};
  co::OwnerReleaseLine none{}, r{};
  EXPECT_TRUE(orch::TermReleased(true, f, true, none, none)) << "never elected: nothing to wait";
  f.epoch = 10;
  f.cluster_id = 3;
  EXPECT_FALSE(orch::TermReleased(true, f, true, none, none));
  EXPECT_FALSE(orch::TermReleased(true, f, false, r, none)) << "a torn release line";
  r.epoch = 9;
  r.cluster_id = 3;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "an older term's release";
  r.epoch = 11;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "another term's release";
  r.epoch = 10;
  r.cluster_id = 4;
  EXPECT_FALSE(orch::TermReleased(true, f, true, r, none)) << "a foreign cluster's epoch 10";
  r.cluster_id = 3;
  EXPECT_TRUE(orch::TermReleased(true, f, true, r, none));
  // A torn fence line: its term is unknown; only a release written after the wait began.
  EXPECT_FALSE(orch::TermReleased(false, f, true, r, r));
  co::OwnerReleaseLine later = r;
  later.at_ms = 1;
  EXPECT_TRUE(orch::TermReleased(false, f, true, later, r));
}

TEST(Fence, LineRoundTripsAndATornLineDoesNotValidate) {
  std::vector<std::byte> buf(8192);
  co::DirectMem mem(buf.data(), buf.size());
  co::OwnerFenceLine l{};
  ASSERT_TRUE(orch::ReadFenceLine(mem, &l));  // all zero: never elected, valid
  EXPECT_EQ(l.epoch, 0u);
  co::OwnerFenceLine w{};
  w.epoch = 42;
  w.cluster_id = 7;
  w.batches = 3;
  orch::WriteFenceLine(mem, w);
  ASSERT_TRUE(orch::ReadFenceLine(mem, &l));
  EXPECT_EQ(l.epoch, 42u);
  EXPECT_EQ(l.cluster_id, 7u);
  EXPECT_EQ(l.batches, 3u);
  EXPECT_EQ(l.version, co::kOwnerFenceVersion);
  // Lies where the header page says, beside the owner's clock line and clear of the header.
  EXPECT_EQ(co::kOwnerFenceOffset + 64, co::kOwnerClockOffset);
  EXPECT_GE(co::kOwnerFenceOffset, sizeof(co::DomainHeader));
  buf[co::kOwnerFenceOffset + 8] ^= std::byte{1};  // a torn write: half old, half new
  EXPECT_FALSE(orch::ReadFenceLine(mem, &l));
}

// A single orchestrator (no [etcd]) refuses a domain that elected orchestrators owned.
TEST(Fence, ASingleOrchestratorRefusesAnElectedDomain) {
  const cxlkv::testing::TempDir scratch("ha-single", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "s", nullptr), "single.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  {
    auto first = orch::Orchestrator::Open(*c, orch::OpenOptions{.new_domain = true});
    ASSERT_TRUE(first.ok()) << first.status();
  }
  // Reopens fine as long as no elected leader wrote the fence line.
  ASSERT_TRUE(orch::Orchestrator::Open(*c).ok());
  ASSERT_NO_FATAL_FAILURE(WriteFenceLineInFile(dir + "/domain", 9, 1));
  auto refused = orch::Orchestrator::Open(*c);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("[etcd]"), std::string::npos) << refused.status();
}

// ---- the fence on the leader's own clock, in process --------------------------------------------

// Once the write deadline passed on the leader's clock, not one more byte of the domain
// changes, even though the process runs on and etcd still holds its lease: the owner's
// batches stop at the deadline (before the election notices and steps down). Then it steps
// down and, alone, is elected again at a higher epoch. (With the owner's checks and the fenced
// Mem removed, the next owner batch writes within a few milliseconds and this test fails.)
TEST_F(HaTest, WritesStopAtTheDeadlineOnTheLeadersOwnClock) {
  const cxlkv::testing::TempDir scratch("ha-inproc", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "inproc", etcd_.get()), "inproc.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  JumpingClock clock;
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .clock = &clock, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  auto epoch = [&] { return (*o)->status().epoch; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  const std::int64_t first = epoch();
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().batches > 5;
      },
      milliseconds(3000)));

  std::string before;
  {
    // No owner batch runs while the test holds the lock: none is half done at the jump.
    orch::Orchestrator::Hold l(**o);
    clock.Jump(10'000);
    before = SlurpFile(dir + "/domain");
    EXPECT_EQ(l.Role(), "standby");
    EXPECT_TRUE(absl::IsUnavailable(l.Serving()));
  }
  // Well before a re-election could write (it pauses 500 ms after stepping down). The one
  // store a deposed leader still makes is its release (docs/ha.md "The fence", layer 4):
  // every other byte stays as it was.
  std::this_thread::sleep_for(milliseconds(300));
  std::string after = SlurpFile(dir + "/domain");
  ASSERT_EQ(after.size(), before.size());
  co::OwnerReleaseLine released{};
  std::memcpy(&released, after.data() + co::kOwnerReleaseOffset, sizeof(released));
  EXPECT_TRUE(co::LineValid(released));
  EXPECT_EQ(released.epoch, static_cast<std::uint64_t>(first));
  EXPECT_EQ(released.by, co::kReleasedByLeader);
  std::memcpy(after.data() + co::kOwnerReleaseOffset, before.data() + co::kOwnerReleaseOffset,
              sizeof(released));
  EXPECT_TRUE(after == before) << "the domain changed after the leader's write deadline passed";

  // Stepped down, campaigned again, and leads at a higher epoch (it is the only candidate).
  ASSERT_TRUE(
      Eventually([&] { return role() == "leader" && epoch() > first; }, milliseconds(10000)));
  ASSERT_TRUE(Eventually([&] { return audit.LastEpoch() == static_cast<std::uint64_t>(epoch()); },
                         milliseconds(2000)));
  EXPECT_EQ(audit.Regression(), 0u);
  (*o)->Stop();
  o->reset();
}

// Bad input: a fence line this leader did not write (a forged or foreign one: another
// cluster's leader, an operator's mistake) appears while it leads. Its next owner batch reads
// the line first and stops: not one byte of the domain changes after the line appeared, but
// the release (this leader's write-back and release line, written as it steps down). Its next
// election is refused while the line names an epoch not older than etcd's, saying why.
TEST_F(HaTest, AForeignFenceLineStopsTheLeaderBeforeItsNextStore) {
  const cxlkv::testing::TempDir scratch("ha-foreign", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(InProcessToml(dir, "foreign", etcd_.get()), "foreign.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  FenceAudit audit(dir + "/domain");
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = audit.samples();
        return !s.empty() && s.back().batches > 5;
      },
      milliseconds(3000)));
  std::string before;
  co::OwnerFenceLine forged{};
  {
    // No batch is half done while the test holds the lock.
    orch::Orchestrator::Hold l(**o);
    before = SlurpFile(dir + "/domain");
    std::memcpy(&forged, before.data() + co::kOwnerFenceOffset, sizeof(forged));
    forged.epoch += 1000;
    forged.batches = 0;
    co::SealLine(forged);
    std::memcpy(before.data() + co::kOwnerFenceOffset, &forged, sizeof(forged));
    std::ofstream(dir + "/domain", std::ios::in | std::ios::out | std::ios::binary)
        .seekp(static_cast<std::streamoff>(co::kOwnerFenceOffset))
        .write(reinterpret_cast<const char*>(&forged), sizeof(forged));
  }
  ASSERT_TRUE(Eventually([&] { return role() != "leader"; }, milliseconds(2000)))
      << "the leader kept leading under a foreign fence line";
  std::this_thread::sleep_for(milliseconds(300));
  std::string after = SlurpFile(dir + "/domain");
  ASSERT_EQ(after.size(), before.size());
  co::OwnerFenceLine now{};
  std::memcpy(&now, after.data() + co::kOwnerFenceOffset, sizeof(now));
  EXPECT_EQ(now.epoch, forged.epoch) << "the foreign fence line was overwritten";
  // It stepped down (the election too, not only the owner): its term is released.
  co::OwnerReleaseLine released{};
  std::memcpy(&released, after.data() + co::kOwnerReleaseOffset, sizeof(released));
  EXPECT_TRUE(co::LineValid(released));
  EXPECT_EQ(released.epoch, forged.epoch - 1000) << "the deposed leader did not step down";
  // The release line is the one store a deposed leader still makes.
  std::memcpy(after.data() + co::kOwnerReleaseOffset, before.data() + co::kOwnerReleaseOffset,
              sizeof(co::OwnerReleaseLine));
  EXPECT_TRUE(after == before) << "the domain changed after a foreign fence line appeared";
  EXPECT_NE(role(), "leader") << "elected again over a fence line naming a newer epoch";
  (*o)->Stop();
  o->reset();
}

// Owner writes outside the owner loop, and the state's generation in the domain's record
// (audit-ha #3), with the loop asleep (owner_period_ms 10 s: after the takeover no batch runs
// during the test). Each state write records its generation in the fence line at once (not
// only at the next batch: an etcd restored in between would go unnoticed); an operator's Evict
// checks the fence line first and records itself in it; under a foreign fence line the Evict
// is refused and the leader steps down.
TEST_F(HaTest, OwnerWritesOutsideTheLoopCheckAndRecordTheFenceLine) {
  const cxlkv::testing::TempDir scratch("ha-outside", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  auto c = orch::ParseConfig(
      InProcessToml(dir, "outside", etcd_.get(),
                    "[timing]\nowner_period_ms = 10000\n"
                    "[[namespace]]\ntenant = \"t\"\nmodel = \"m\"\nlayout = \"l\"\n"),
      "outside.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  auto role = [&] { return (*o)->status().role; };
  ASSERT_TRUE(Eventually([&] { return role() == "leader"; }, milliseconds(10000)));
  auto fence = [&] {
    const std::string dom = SlurpFile(dir + "/domain");
    co::OwnerFenceLine f{};
    std::memcpy(&f, dom.data() + co::kOwnerFenceOffset, sizeof(f));
    EXPECT_TRUE(co::LineValid(f));
    return f;
  };
  auto host = orch::HostClient::Connect(dir + "/o.sock", 0);
  ASSERT_TRUE(host.ok()) << host.status();
  auto grown = (*host)->Grow(1);
  ASSERT_TRUE(grown.ok()) << grown.status();
  // etcd's generation is the one the domain records.
  auto etcd = etcd_->NewClient();
  auto state = etcd->Get("/cxlkv/v1/default/domains/outside/state");
  ASSERT_TRUE(state.ok() && !state->kvs.empty()) << state.status();
  const std::string& text = state->kvs[0].value;
  const std::size_t at = text.find("\"generation\":");
  ASSERT_NE(at, std::string::npos) << text;
  const std::uint64_t gen = std::strtoull(text.c_str() + at + 13, nullptr, 10);
  EXPECT_GE(gen, 3u) << "takeover, join, grow: three writes";
  EXPECT_EQ(fence().state_gen, gen) << "the domain does not record the state's generation";
  // An operator's evict: checked and recorded.
  auto op = orch::OperatorClient::Connect(dir + "/o.sock");
  ASSERT_TRUE(op.ok()) << op.status();
  const std::uint64_t batches = fence().batches;
  auto evicted = (*op)->Evict("t/m/l");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(fence().batches, batches + 1) << "the evict did not record itself in the line";
  // A foreign fence line: the next evict is refused, the leader steps down.
  co::OwnerFenceLine forged = fence();
  forged.epoch += 1000;
  co::SealLine(forged);
  std::ofstream(dir + "/domain", std::ios::in | std::ios::out | std::ios::binary)
      .seekp(static_cast<std::streamoff>(co::kOwnerFenceOffset))
      .write(reinterpret_cast<const char*>(&forged), sizeof(forged));
  auto refused = (*op)->Evict("t/m/l");
  EXPECT_FALSE(refused.ok()) << "an owner write under a foreign fence line";
  EXPECT_TRUE(Eventually([&] { return role() != "leader"; }, milliseconds(2000)));
  EXPECT_EQ(fence().epoch, forged.epoch);
  // The election stepped down too (its term released), not only the owner.
  EXPECT_TRUE(Eventually(
      [&] {
        const std::string dom = SlurpFile(dir + "/domain");
        co::OwnerReleaseLine r{};
        std::memcpy(&r, dom.data() + co::kOwnerReleaseOffset, sizeof(r));
        return co::LineValid(r) && r.epoch == forged.epoch - 1000;
      },
      milliseconds(2000)))
      << "the leader did not step down under a foreign fence line";
  host->reset();
  (*o)->Stop();
  o->reset();
}

}  // namespace
}  // namespace cxlkv::testing
