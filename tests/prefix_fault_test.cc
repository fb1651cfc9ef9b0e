// Each failure class of the non-coherence simulator against the protection that meets it: the
// protocol (or its caller) with that protection removed must fail under the class, and the
// real protocol must not (tests/prefix_sim_test.cc runs it under every class at once).
//
// This file builds several binaries (tests/CMakeLists.txt): prefix_fault_test runs the real
// protocol with faults injected at run time (a Mem whose mfence is an sfence, a give-away path
// without write-back, a commit after the announcement, clocks that lose a suspend, too small
// a margin); prefix_fault_<name>_test links a copy of the protocol compiled with one
// CXLKV_FAULT_* switch (coherence/src), and runs only the test for that switch: lease_flush
// (no flush of the lease row), crc (no CRC check on shared lines), dup_ref (no refusal of a
// PUBLISH naming a block already named).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "prefix_sim.h"
#if !defined(CXLKV_FAULT_DROP_LEASE_FLUSH) && !defined(CXLKV_FAULT_NO_CRC_CHECK) && \
    !defined(CXLKV_FAULT_NO_DUP_REF_CHECK)
#include "fence.h"  // orchestrator HA's release (orchestrator/daemon/src)
namespace co_ha = ::cxlkv::coherence;
#endif

namespace cxlkv::testing {
namespace {

unsigned long long U(std::uint64_t v) { return static_cast<unsigned long long>(v); }

// Runs the simulation over seeds 1..n with `tweak` applied to the config, then drains it (every
// live host's requests applied, every entry reclaimed once the hosts stop); returns the
// violations found (one per seed at most, each printed).
std::vector<std::string> Failures(int n, std::uint64_t steps,
                                  const std::function<void(PrefixSimulation::Config&)>& tweak,
                                  const char* what) {
  std::vector<std::string> failures;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(n); ++seed) {
    PrefixSimulation::Config c;
    c.seed = seed;
    tweak(c);
    PrefixSimulation sim(c);
    if (!sim.Run(steps) || !sim.Drain()) {
      failures.push_back(sim.failure());
      std::printf("%s, seed %llu: caught: %s\n", what, U(seed), sim.failure().c_str());
    }
  }
  return failures;
}

int Caught(int n, std::uint64_t steps, const std::function<void(PrefixSimulation::Config&)>& tweak,
           const char* what) {
  return static_cast<int>(Failures(n, steps, tweak, what).size());
}

#if !defined(CXLKV_FAULT_DROP_LEASE_FLUSH) && !defined(CXLKV_FAULT_NO_CRC_CHECK) && \
    !defined(CXLKV_FAULT_NO_DUP_REF_CHECK)
#define CXLKV_REAL_PROTOCOL 1
#endif

#ifdef CXLKV_REAL_PROTOCOL
// A publisher and a reader around one published block, each step taken by hand.
struct World {
  World(const DomainGeometry& geometry, const SimOptions& options, std::uint32_t margin_ms = 0)
      : g(geometry), media(DomainBytes(g), 42, options) {
    ov = media.NewView(0);
    v0 = media.NewView(0);
    v1 = media.NewView(0);
    EXPECT_TRUE(FormatDomain(*ov, g).ok());
    media.Settle();
    owner = std::move(*PrefixOwner::Open(*ov, oc));
    PrefixHost::Options o;
    o.margin_ms = margin_ms;
    publisher = std::move(*PrefixHost::Join(*v0, c0, 0, o));
    reader = std::move(*PrefixHost::Join(*v1, c1, 1, o));
    for (int i = 0; i < 3; ++i) Beat();
    const std::uint32_t token = 1;
    key = ChainKey(ns, PrefixKey{}, std::span(&token, 1));
    block.arena[0] = 1;
    block.index = 7;
    block.generation = 1;
    EXPECT_TRUE(publisher->Publish(ns, key, PrefixKey{}, block).ok());
    Pass(10);
    owner->Step();
    Pass(10);
  }
  // Time passes: store buffers drain and write-backs complete (as they do in nanoseconds).
  void Pass(std::int64_t ms) {
    now += ms;
    media.Settle();
  }
  void Beat() {
    EXPECT_TRUE(publisher->Heartbeat(nullptr).ok());
    EXPECT_TRUE(reader->Heartbeat(nullptr).ok());
    Pass(10);
    owner->Step();
    Pass(10);
  }

  DomainGeometry g;
  SimMemory media;
  std::int64_t now = 0;
  std::unique_ptr<SimMemory::HostView> ov, v0, v1;
  SimClock oc{&now, 0, 1.0}, c0{&now, 0, 1.0}, c1{&now, 0, 1.0};
  std::unique_ptr<PrefixOwner> owner;
  std::unique_ptr<PrefixHost> publisher, reader;
  Namespace ns = MakeNamespace("t", "m", "l");
  PrefixKey key;
  BlockRef block{};
};

// The reader leases the block (one Acquire, or AcquireChain), the owner retires it and, after
// `grace_ms`, reclaims: true if it freed the block while the reader's lease was valid.
bool FreedUnderLease(const SimOptions& o, std::uint32_t grace_ms, bool chain) {
  World w(DomainGeometry{2, 16, 4, 4, 400, 4000, grace_ms}, o);
  std::vector<Lease> leases;
  if (chain) {
    auto n = w.reader->AcquireChain(w.ns, std::span(&w.key, 1), &leases);
    EXPECT_TRUE(n.ok() && *n == 1) << n.status();
  } else {
    auto lease = w.reader->LookupAndAcquire(w.ns, w.key);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (lease.ok()) leases.push_back(*lease);
  }
  if (leases.empty()) return false;
  EXPECT_TRUE(w.owner->RetireKey(w.ns, w.key).ok());
  if (grace_ms > 0) w.Pass(grace_ms);
  const std::uint32_t freed = w.owner->Reclaim();
  return freed > 0 && w.c1.NowMs() <= leases[0].deadline_ms;
}

SimOptions StoreBuffer(bool weak_full_fence) {
  SimOptions o;
  o.store_buffer = true;
  o.store_drain_per_mille = 0;  // nothing drains on its own: the widest window
  o.fault_full_fence_is_sfence = weak_full_fence;
  return o;
}
#endif

#ifdef CXLKV_REAL_PROTOCOL

// Store buffer. Acquire is Dekker's pattern against retire-then-scan: the reader stores its
// lease row and loads the entry; the owner stores RETIRED and (after grace) loads the rows.
// Two things each keep them apart: a full fence between each side's store and load (the
// reader's is the mfence its re-read of the entry starts with, the owner's the one its lease
// scan starts with), and the grace period, during which any store buffer drains. With both
// gone — every mfence an sfence, grace 0 — the reader's row is still in its store buffer when
// the owner scans, and the block is freed under a lease. The simulator without a store buffer
// cannot tell.
TEST(PrefixFault, StoreBufferCatchesAnMfenceThatIsOnlyAnSfence) {
  SimOptions weak_no_sb;
  weak_no_sb.fault_full_fence_is_sfence = true;
  for (const bool chain : {false, true}) {
    EXPECT_TRUE(FreedUnderLease(StoreBuffer(true), 0, chain))
        << "an sfence where an mfence belongs must be caught (chain " << chain << ")";
    EXPECT_FALSE(FreedUnderLease(StoreBuffer(false), 0, chain)) << "the real protocol";
    EXPECT_FALSE(FreedUnderLease(weak_no_sb, 0, chain))
        << "no store buffer: the simulator cannot tell the fences apart";
    EXPECT_FALSE(FreedUnderLease(StoreBuffer(true), 40, chain)) << "grace alone keeps them apart";
  }
}

// The same fences without the grace period to help, under every failure class but tearing
// (HeavyTearingPassesWithTheCrcCheck covers it): the fences alone keep acquire and retire
// apart. (Acquire, AcquireChain and Renew once had a second mfence right after the lease row;
// this run, with that fence weakened to an sfence, is what showed it redundant.)
TEST(PrefixFault, AcquireAndRetireStayApartWithoutAGracePeriod) {
  for (const bool chain : {false, true}) {
    EXPECT_FALSE(FreedUnderLease(StoreBuffer(false), 0, chain)) << "chain " << chain;
  }
  EXPECT_EQ(Caught(
                3, 50000,
                [](PrefixSimulation::Config& c) {
                  const std::uint64_t seed = c.seed;
                  c = PrefixSimulation::AllFaults(seed);
                  c.geometry.grace_ms = 0;
                  c.memory.tear_per_mille = 0;
                },
                "grace 0"),
            0);
}

// Late write-back + extents changing hands: a host that gives an extent away without writing
// it back leaves dirty lines (a block it was still filling) that reach memory after the next
// holder wrote its own blocks there: readers copy wrong data under leases that validate.
// The give-away path that writes back and fences is safe under the same seeds.
TEST(PrefixFault, ExtentGivenAwayWithoutWriteBackIsCaught) {
  auto handoff = [](bool writeback) {
    return [writeback](PrefixSimulation::Config& c) {
      c.extent_handoff = true;
      c.giveaway_per_mille = 100;
      c.giveaway_writeback = writeback;
      c.memory.late_writeback = true;
    };
  };
  EXPECT_GE(Caught(10, 50000, handoff(false), "give-away without write-back"), 5)
      << "the simulator must expose a give-away path that does not write back";
  EXPECT_EQ(Caught(3, 30000, handoff(true), "give-away with write-back"), 0);
}

// Crashes inside the publish path: Publish's `commit` (persist the block) runs after the
// request is durable and before it is announced. A caller that persists only after Publish
// returned loses, at a crash in between, a block the owner then publishes: the restarted
// publisher never persisted it and frees it.
TEST(PrefixFault, CommitAfterTheAnnouncementIsCaughtByCrashesMidPublish) {
  auto crashes = [](bool late_commit) {
    return [late_commit](PrefixSimulation::Config& c) {
      c.host_crash_per_100k = 2000;
      c.commit_after_publish = late_commit;
    };
  };
  EXPECT_GE(Caught(5, 20000, crashes(true), "commit after the announcement"), 4);
  EXPECT_EQ(Caught(5, 20000, crashes(false), "commit inside Publish"), 0);
}

// Clock drift: a lease ends `margin` before lease_ttl on the host's clock, which must cover
// the drift between the host's and the owner's clocks over a TTL. Host at 0.95, owner at
// 1.05 (10% apart: 40 ms over a 400 ms TTL): a 1 ms margin lets the owner free the block
// while the host's deadline is still ahead; the default 100 ms does not.
TEST(PrefixFault, DriftBeyondTheMarginIsCaught) {
  auto freed_under_lease = [](std::uint32_t margin_ms) {
    World w(DomainGeometry{2, 16, 4, 4, 400, 100000, 0}, SimOptions{}, margin_ms);
    w.c1.set_rate(0.95);
    w.oc.set_rate(1.05);
    auto lease = w.reader->LookupAndAcquire(w.ns, w.key);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return false;
    EXPECT_TRUE(w.owner->RetireKey(w.ns, w.key).ok());
    bool violated = false;
    for (int t = 0; t < 600 && !violated; ++t) {
      w.Pass(1);
      const bool freed = w.owner->Reclaim() > 0 || w.owner->retired_entries() == 0;
      violated = freed && w.c1.NowMs() <= lease->deadline_ms;
      if (freed) break;
    }
    return violated;
  };
  EXPECT_TRUE(freed_under_lease(1)) << "a margin below the drift must be caught";
  EXPECT_FALSE(freed_under_lease(0)) << "the default margin (lease_ttl / 4)";
}

// Suspends. With clocks that count the suspended time (CLOCK_BOOTTIME) the protocol is safe.
// With clocks that lose it (CLOCK_MONOTONIC across S3, kvmclock across a VM stop) a host wakes
// with leases that look valid on blocks the owner reclaimed meanwhile: audit #6. The host must
// notice the pause at its next acquire, renew or heartbeat (docs/coherence.md, "Paused hosts");
// leases held across the pause are promised again only once acquired or renewed after it, and
// a copy only once ValidateAfterCopy passed. Before that detection, 3 seeds of 3 failed here.
TEST(PrefixFault, SuspendsThatLoseTimeArePassedByPauseDetection) {
  auto suspends = [](bool lose) {
    return [lose](PrefixSimulation::Config& c) {
      c.clock_faults = true;
      c.freeze_loses_time = lose;
      c.tokens = 2;  // few keys: a leased key is retired during a suspend more often
    };
  };
  EXPECT_EQ(Caught(1, 40000, suspends(false), "suspend counted"), 0);
  EXPECT_EQ(Caught(3, 40000, suspends(true), "suspend loses time"), 0);
}

// The same suspends, with data used in place as long as the lease looks valid on the host's
// clock, without validating after use: blocks reclaimed during the suspend are used after it.
// Nothing the host does between the resume and its next call can notice the pause, so in-place
// users must validate after use (docs/coherence.md, "Paused hosts").
TEST(PrefixFault, ZeroCopyUseAcrossASuspendThatLosesTimeIsCaught) {
  // 8 seeds since the schedule changed with the chain publish (issue #21): 6 of 8 caught.
  EXPECT_GE(Caught(
                8, 40000,
                [](PrefixSimulation::Config& c) {
                  c.clock_faults = true;
                  c.freeze_loses_time = true;
                  c.zero_copy_across_suspends = true;
                  c.tokens = 2;
                },
                "zero-copy across a suspend that loses time"),
            3);
}

// Owner fail-over (not a feature today): a dead owner replaced on another machine while the
// old one lives on, its cache holding what the dead process left dirty. Those lines land
// late, over what the new owner wrote: entries revert, blocks are published twice or after
// their return. The protection is the same as for extents: the old machine's cache is written
// back (or the machine reset) before the new owner opens; with it, fail-over is safe here.
TEST(PrefixFault, OwnerFailoverWithoutTheOldMachinesWriteBackIsCaught) {
  auto failover = [](bool writeback) {
    return [writeback](PrefixSimulation::Config& c) {
      c = PrefixSimulation::AllFaults(c.seed);
      c.owner_crash_per_100k = 200;
      c.owner_failover = true;
      c.failover_writeback = writeback;
      c.memory.late_land_per_mille = 1;
    };
  };
  // 10 seeds: the chain publish and the owner's batch apply (issue #21) changed the schedule
  // so that 2 of 10 were caught (seeds 1 and 5); with the probe-length invariant checked, a
  // late line that reverts an entry is mostly caught by it: 8 of 10 (issue #21's owner rework).
  EXPECT_GE(Caught(10, 100000, failover(false), "fail-over, no write-back"), 2);
  EXPECT_EQ(Caught(3, 60000, failover(true), "fail-over after write-back"), 0);
}

// The same fail-over, driven by orchestrator HA's own code (docs/ha.md, "The fence", layer
// 4; orchestrator/daemon/src/fence.cc): the old machine's write-back agent releases the old
// term (ReleaseTerm: the domain range written back, then the release line), the successor
// finds it released (TermReleased, the test AwaitRelease polls) and claims the domain
// (WriteFenceLine) before the new owner opens. No other write-back: with the release, zero
// violations; the run without it is the no-write-back case above.
TEST(PrefixFault, OwnerFailoverThroughOrchestratorHasReleaseIsSafe) {
  // write_back false: the release line alone, without the domain range written back first
  // (what the takeover had before issue #29: nothing of the old machine written back).
  auto release = [](bool write_back) {
    return [write_back](Mem& old_machine, Mem& new_machine, std::uint64_t len) -> std::string {
      co_ha::OwnerFenceLine fence{};
      const bool fence_valid = orchestrator::ReadFenceLine(new_machine, &fence);
      co_ha::OwnerReleaseLine at_start{};
      if (!orchestrator::ReadReleaseLine(new_machine, &at_start)) at_start = {};
      co_ha::OwnerReleaseLine r{};
      r.epoch = fence.epoch;
      r.by = co_ha::kReleasedByAgent;
      orchestrator::ReleaseTerm(old_machine, write_back ? len : 0, r);
      old_machine.FullFence();  // the agent's process runs on: its stores drain
      co_ha::OwnerReleaseLine now{};
      const bool release_valid = orchestrator::ReadReleaseLine(new_machine, &now);
      if (!orchestrator::TermReleased(fence_valid, fence, release_valid, now, at_start)) {
        return "the successor does not find epoch " + std::to_string(fence.epoch) + " released";
      }
      co_ha::OwnerFenceLine claim{};
      claim.epoch = fence.epoch + 1;
      orchestrator::WriteFenceLine(new_machine, claim);
      return "";
    };
  };
  std::uint32_t late = 50, crash = 200;
  if (const char* v = std::getenv("CXLKV_HA_LATE")) late = static_cast<std::uint32_t>(std::atoi(v));
  if (const char* v = std::getenv("CXLKV_HA_CRASH"))
    crash = static_cast<std::uint32_t>(std::atoi(v));
  auto failover = [&](bool write_back) {
    return [&, write_back](PrefixSimulation::Config& c) {
      c = PrefixSimulation::AllFaults(c.seed);
      c.owner_crash_per_100k = crash;
      c.owner_failover = true;
      c.failover_writeback = false;
      c.failover_release = release(write_back);
      c.memory.late_land_per_mille = late;
    };
  };
  int seeds = 5;
  std::uint64_t steps = 60000;
  if (const char* v = std::getenv("CXLKV_HA_SEEDS")) seeds = std::atoi(v);
  if (const char* v = std::getenv("CXLKV_SIM_STEPS")) steps = std::strtoull(v, nullptr, 10);
  // Without the write-back some seeds are caught (the schedule needs an old line to land
  // late over one the new owner depends on: 1 of seeds 1-5 at these rates), not every seed;
  // with it, none.
  EXPECT_GE(Caught(seeds, steps, failover(false), "HA release without the write-back"), 1);
  EXPECT_EQ(Caught(seeds, steps, failover(true), "HA release"), 0);
}

// Orchestrator HA's fail-over in full (docs/ha.md, "The fence"), on the non-coherence
// simulator: the owner holds an election term whose write gate (the election's rule: a
// deadline on the owner's own clock, sticky once passed) guards every store through HA's
// FencedMem; the owner process is killed, stopped with its clock counting (SIGSTOP) or
// frozen (a VM stop), or stalls past its deadline; a successor on another machine takes
// over only once the old term is released (ReleaseTerm by the old machine — its agent, or
// the old leader stepping down — and TermReleased, then WriteFenceLine). The simulator
// checks, besides every protocol invariant, that no line the old machine held dirty reaches
// memory after the successor took over.
class HaOwnerMem final : public Mem {
 public:
  explicit HaOwnerMem(Mem& machine, std::function<bool()> allowed)
      : gate_(std::move(allowed)), fenced_(machine, gate_) {}
  std::uint64_t size_bytes() const override { return fenced_.size_bytes(); }
  void Read(std::uint64_t o, void* d, std::size_t n) override { fenced_.Read(o, d, n); }
  void Write(std::uint64_t o, const void* s, std::size_t n) override { fenced_.Write(o, s, n); }
  void WriteNt(std::uint64_t o, const void* s, std::size_t n) override { fenced_.WriteNt(o, s, n); }
  void Flush(std::uint64_t o, std::size_t n) override { fenced_.Flush(o, n); }
  void Invalidate(std::uint64_t o, std::size_t n) override { fenced_.Invalidate(o, n); }
  void Evict(std::uint64_t o, std::size_t n) override { fenced_.Evict(o, n); }
  void Fence() override { fenced_.Fence(); }
  void FullFence() override { fenced_.FullFence(); }

 private:
  class Gate final : public orchestrator::WriteGate {
   public:
    explicit Gate(std::function<bool()> f) : f_(std::move(f)) {}
    bool WriteAllowed() const override { return f_(); }

   private:
    std::function<bool()> f_;
  };
  Gate gate_;
  orchestrator::FencedMem fenced_;
};

// The old term's release as HA does it (agent.cc, Orchestrator::StepDown: ReleaseTerm) and
// the successor's wait and claim (Orchestrator::AwaitRelease, TakeOver). write_back false:
// the release line alone, without the domain range written back first.
std::function<std::string(Mem&, Mem&, std::uint64_t)> HaRelease(bool write_back) {
  return [write_back](Mem& old_machine, Mem& new_machine, std::uint64_t len) -> std::string {
    co_ha::OwnerFenceLine fence{};
    const bool fence_valid = orchestrator::ReadFenceLine(new_machine, &fence);
    co_ha::OwnerReleaseLine at_start{};
    if (!orchestrator::ReadReleaseLine(new_machine, &at_start)) at_start = {};
    co_ha::OwnerReleaseLine r{};
    r.epoch = fence.epoch;
    r.by = co_ha::kReleasedByAgent;
    orchestrator::ReleaseTerm(old_machine, write_back ? len : 0, r);
    old_machine.FullFence();  // the releasing process runs on: its stores drain
    co_ha::OwnerReleaseLine now{};
    const bool release_valid = orchestrator::ReadReleaseLine(new_machine, &now);
    if (!orchestrator::TermReleased(fence_valid, fence, release_valid, now, at_start)) {
      return "the successor does not find epoch " + std::to_string(fence.epoch) + " released";
    }
    co_ha::OwnerFenceLine claim{};
    claim.epoch = fence.epoch + 1;
    orchestrator::WriteFenceLine(new_machine, claim);
    return "";
  };
}

std::function<void(PrefixSimulation::Config&)> HaFailover(bool write_back) {
  return [write_back](PrefixSimulation::Config& c) {
    c = PrefixSimulation::AllFaults(c.seed);
    c.owner_failover = true;
    c.owner_term_ms = 300;
    c.owner_mem = [](Mem& machine, std::function<bool()> allowed) -> std::unique_ptr<Mem> {
      return std::make_unique<HaOwnerMem>(machine, std::move(allowed));
    };
    c.owner_crash_per_100k = 400;  // kill -9 (its agent releases)
    c.owner_stop_per_100k = 400;   // stops: killed by the agent, SIGSTOP, VM stop
    c.failover_release = HaRelease(write_back);
    // A dead process's dirty lines stay in its live machine's cache for seconds (about
    // 1000 steps), not milliseconds: longer than a takeover takes.
    c.memory.late_land_per_mille = 1;
  };
}

std::uint64_t EnvSteps(std::uint64_t fallback) {
  const char* v = std::getenv("CXLKV_SIM_STEPS");
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}
int EnvSeeds(int fallback) {
  const char* v = std::getenv("CXLKV_HA_SEEDS");
  return v != nullptr ? std::atoi(v) : fallback;
}

// Short (CI): without the old machine's write-back every seed is caught (each run stops at
// its first violation: seeds 1-5 by step 7,033, seeds 1-10 by step 7,591); with it, none.
// CXLKV_SIM_STEPS and CXLKV_HA_SEEDS run the release's arm longer (docs/ha.md: 10^6 steps
// × 5 seeds); CXLKV_HA_BUG_STEPS bounds the other arm.
TEST(PrefixFault, HaTakeoverWithoutTheWriteBackIsCaughtOnEverySeed) {
  const int seeds = EnvSeeds(5);
  const std::uint64_t steps = EnvSteps(2000);
  std::uint64_t bug_steps = 20000;
  if (const char* v = std::getenv("CXLKV_HA_BUG_STEPS")) bug_steps = std::strtoull(v, nullptr, 10);
  EXPECT_EQ(Caught(seeds, bug_steps, HaFailover(false), "HA takeover, release without write-back"),
            seeds)
      << "every seed must be caught";
  PrefixSimulation::Events total;
  std::uint64_t late = 0;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    PrefixSimulation::Config c;
    c.seed = seed;
    HaFailover(true)(c);
    PrefixSimulation sim(c);
    const bool ok = sim.Run(steps) && sim.Drain();
    EXPECT_TRUE(ok) << "HA takeover with the release, seed " << seed << ": " << sim.failure();
    const PrefixSimulation::Events& e = sim.events();
    total.failovers += e.failovers;
    total.owner_stops += e.owner_stops;
    total.owner_step_downs += e.owner_step_downs;
    total.owner_stores_dropped += e.owner_stores_dropped;
    total.owner_crashes += e.owner_crashes;
    late += sim.memory_stats().late_lines;
  }
  std::printf(
      "HA takeover with the release: %d seeds x %llu steps: %llu fail-overs (%llu owner "
      "crashes, %llu stops, %llu step-downs), %llu stores dropped by the fenced Mem, %llu late "
      "lines landed\n",
      seeds, U(steps), U(total.failovers), U(total.owner_crashes), U(total.owner_stops),
      U(total.owner_step_downs), U(total.owner_stores_dropped), U(late));
  // The run must have exercised what it claims.
  EXPECT_GT(total.failovers, 0u);
  EXPECT_GT(total.owner_stops, 0u);
  EXPECT_GT(total.owner_stores_dropped, 0u);
}

// Tearing, the real protocol: the same heavy tearing the no-CRC build is caught under (see
// TornLinesAreCaughtWithoutTheCrcCheck), with crashes of hosts and the owner, so that torn
// lines also outlive their writers. Every torn line fails its CRC and is read again; a line
// that stays torn (its writer died) is rebuilt or quarantined (audit findings #12, #13).
TEST(PrefixFault, HeavyTearingPassesWithTheCrcCheck) {
  EXPECT_EQ(Caught(
                4, 50000,
                [](PrefixSimulation::Config& c) {
                  c.memory.tear_per_mille = 200;
                  c.memory.async_writeback = true;
                  c.memory.writeback_progress_per_mille = 1000;
                  c.host_crash_per_100k = 200;
                  c.owner_crash_per_100k = 20;
                },
                "heavy tearing"),
            0);
}

// Owner crashes, the real protocol: a new owner opens the same media after the old one died
// between any two of its stores. Every failure class on, the owner crashing some 500 times
// per 10^5 steps, its dirty lines landing late. Audit finding #2 (a stale incarnation's
// request replayed by the new owner handed back a block the index still publishes) showed up
// here before its fix.
TEST(PrefixFault, FrequentOwnerCrashesPass) {
  EXPECT_EQ(Caught(
                3, 60000,
                [](PrefixSimulation::Config& c) {
                  c = PrefixSimulation::AllFaults(c.seed);
                  c.owner_crash_per_100k = 200;
                  c.memory.late_land_per_mille = 1;
                },
                "frequent owner crashes"),
            0);
}

#endif  // CXLKV_REAL_PROTOCOL

#ifdef CXLKV_FAULT_DROP_LEASE_FLUSH
// The protocol compiled with the lease row's flush removed: the owner cannot see the lease,
// reclaims the block, and a host is found using it under a lease it still believes valid.
TEST(PrefixFault, SimulatorCatchesAMissingLeaseFlush) {
  const int caught = Caught(
      5, 200000,
      [](PrefixSimulation::Config& c) {
        c.evict_per_mille = 5;  // caches rarely write the row back on their own
      },
      "no lease-row flush");
  EXPECT_GE(caught, 3) << "the simulator must expose the missing flush for most seeds";
}
#endif

#ifdef CXLKV_FAULT_NO_CRC_CHECK
// Tearing: the protocol compiled to accept a shared line without checking its CRC (no retry
// of a torn read). Torn stores and write-backs landing in parts then hand readers lines that
// mix two versions (a new key with an old block, a request slot whose second line is stale).
TEST(PrefixFault, TornLinesAreCaughtWithoutTheCrcCheck) {
  auto tearing = [](PrefixSimulation::Config& c) {
    c.memory.tear_per_mille = 200;
    c.memory.async_writeback = true;
    c.memory.writeback_progress_per_mille = 1000;
    c.host_crash_per_100k = 200;
  };
  EXPECT_GE(Caught(6, 100000, tearing, "no CRC check"), 4);
  // The same protocol without tearing is not caught: the CRC check is what tearing needs.
  EXPECT_EQ(Caught(
                2, 30000, [](PrefixSimulation::Config&) {}, "no CRC check, no tearing"),
            0);
}
#endif

#ifdef CXLKV_FAULT_NO_DUP_REF_CHECK
// Owner crashes: the protocol compiled without the owner's refusal of a PUBLISH naming a
// block already in the index. A new owner replays requests its crashed predecessor applied but
// did not acknowledge (the entry was written, ring_head was not); without the refusal the
// replay finds the key published and hands the block back while the entry still names it.
TEST(PrefixFault, OwnerCrashReplaysAreCaughtWithoutTheDuplicateCheck) {
  auto crashes = [](PrefixSimulation::Config& c) { c.owner_crash_per_100k = 200; };
  EXPECT_GE(Caught(6, 100000, crashes, "no duplicate-ref check, owner crashes"), 4);
  // Without owner crashes nothing replays a request, and the same protocol passes.
  EXPECT_EQ(Caught(
                2, 30000, [](PrefixSimulation::Config&) {}, "no duplicate-ref check"),
            0);
}
#endif

}  // namespace
}  // namespace cxlkv::testing
