// coherence/prefix.h: keys, namespaces, and the host/owner flows on a real mapping and on
// the simulator, step by step.
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "cxlkv/coherence/prefix.h"
#include "cxlkv/coherence/sim.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"

namespace cxlkv::coherence {
namespace {

class ManualClock final : public Clock {
 public:
  std::int64_t NowMs() override { return now; }
  std::int64_t now = 1000;
};

BlockRef Ref(std::uint32_t index) {
  BlockRef r{};
  r.arena[0] = 7;
  r.index = index;
  r.generation = 3;
  return r;
}

const std::uint32_t kTokens[] = {101, 102, 103, 104};

TEST(PrefixKey, ChainsAndSeparatesNamespaces) {
  const Namespace a = MakeNamespace("tenant-a", "llama3-70b", "L=80,H=8");
  const Namespace b = MakeNamespace("tenant-b", "llama3-70b", "L=80,H=8");
  EXPECT_NE(a, b);
  EXPECT_NE(MakeNamespace("ab", "c", ""), MakeNamespace("a", "bc", ""));
  const PrefixKey k1 = ChainKey(a, PrefixKey{}, kTokens);
  EXPECT_EQ(k1, ChainKey(a, PrefixKey{}, kTokens)) << "deterministic";
  EXPECT_NE(k1, ChainKey(b, PrefixKey{}, kTokens)) << "namespace is part of the key";
  const PrefixKey k2 = ChainKey(a, k1, kTokens);
  EXPECT_NE(k2, k1) << "the parent is part of the key";
  const std::uint32_t other[] = {101, 102, 103, 105};
  EXPECT_NE(ChainKey(a, PrefixKey{}, other), k1);
}

struct Domain {
  explicit Domain(Mem& m, Clock& c, DomainGeometry g = {4, 64, 4, 4, 1000, 1000, 50}) {
    EXPECT_TRUE(FormatDomain(m, g).ok());
    owner = std::move(*PrefixOwner::Open(m, c));
  }
  std::unique_ptr<PrefixOwner> owner;
};

void PublishAndLease(Mem& owner_mem, Mem& a_mem, Mem& b_mem) {
  ManualClock clock;
  Domain d(owner_mem, clock);
  auto a = std::move(*PrefixHost::Join(a_mem, clock, 0));
  auto b = std::move(*PrefixHost::Join(b_mem, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const PrefixKey key = ChainKey(ns, PrefixKey{}, kTokens);

  EXPECT_FALSE(b->Lookup(ns, key).has_value());
  ASSERT_TRUE(a->Publish(ns, key, PrefixKey{}, Ref(5)).ok());
  EXPECT_FALSE(b->Lookup(ns, key).has_value()) << "not before the owner applied it";
  EXPECT_EQ(d.owner->ApplyRequests(), 1u);
  // Leases need a heartbeat the owner acknowledged (it has seen both hosts join).
  EXPECT_TRUE(absl::IsUnavailable(b->Acquire(Hit{0, 0, Ref(5), 0}).status()));
  EXPECT_EQ(d.owner->FenceExpiredHosts(), 0u);
  const auto hit = b->Lookup(ns, key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->ref, Ref(5));
  EXPECT_EQ(hit->publisher, 0u);
  EXPECT_FALSE(b->Lookup(MakeNamespace("other", "m", "l"), key).has_value())
      << "a hit never crosses namespaces";

  auto lease = b->Acquire(*hit);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(b->ValidateAfterCopy(*lease).ok());
  // Retired while leased: the block stays until the lease is released.
  ASSERT_TRUE(d.owner->RetireKey(ns, key).ok());
  EXPECT_FALSE(b->Lookup(ns, key).has_value()) << "retired entries are not found";
  EXPECT_FALSE(b->ValidateAfterCopy(*lease).ok()) << "a copy after retirement is discarded";
  clock.now += 100;  // past grace
  EXPECT_EQ(d.owner->Reclaim(), 0u) << "leased: not reclaimed";
  b->Release(*lease);
  EXPECT_EQ(d.owner->Reclaim(), 1u);
  d.owner->Step();
  std::vector<BlockRef> returned;
  ASSERT_TRUE(a->Heartbeat(&returned).ok());
  ASSERT_EQ(returned.size(), 1u);
  EXPECT_EQ(returned[0], Ref(5)) << "the block goes back to its publisher";
}

TEST(Prefix, PublishLookupLeaseRetireReclaimOnAMapping) {
  auto region = pool::OpenRegion("memfd:?size=4M");
  ASSERT_TRUE(region.ok());
  DirectMem owner((*region)->addr(), (*region)->size_bytes());
  DirectMem a((*region)->addr(), (*region)->size_bytes());
  DirectMem b((*region)->addr(), (*region)->size_bytes());
  PublishAndLease(owner, a, b);
}

TEST(Prefix, PublishLookupLeaseRetireReclaimOnTheSimulator) {
  SimMemory media(4 << 20, 42);
  auto owner = media.NewView(0), a = media.NewView(0), b = media.NewView(0);
  PublishAndLease(*owner, *a, *b);
}

TEST(Prefix, LookupTakesNoLeaseAndDuplicatesGoBack) {
  ManualClock clock;
  SimMemory media(4 << 20, 7);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const PrefixKey key = ChainKey(ns, PrefixKey{}, kTokens);
  ASSERT_TRUE(a->Publish(ns, key, PrefixKey{}, Ref(1)).ok());
  ASSERT_TRUE(b->Publish(ns, key, PrefixKey{}, Ref(2)).ok());  // same prefix, later
  d.owner->ApplyRequests();
  EXPECT_EQ(d.owner->stats().published, 1u);
  EXPECT_EQ(d.owner->stats().duplicates, 1u);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(b->Lookup(ns, key).has_value());
  ASSERT_TRUE(d.owner->RetireKey(ns, key).ok());
  clock.now += 100;
  EXPECT_EQ(d.owner->Reclaim(), 1u) << "lookups alone never pin a block";
  d.owner->Step();
  std::vector<BlockRef> returned;
  ASSERT_TRUE(b->Heartbeat(&returned).ok());
  ASSERT_EQ(returned.size(), 1u);
  EXPECT_EQ(returned[0], Ref(2)) << "the duplicate went back to its writer";
}

TEST(Prefix, StalledHostIsFencedAndRejoins) {
  ManualClock clock;
  SimMemory media(4 << 20, 9);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const PrefixKey key = ChainKey(ns, PrefixKey{}, kTokens);
  ASSERT_TRUE(a->Publish(ns, key, PrefixKey{}, Ref(1)).ok());
  d.owner->Step();
  auto lease = b->LookupAndAcquire(ns, key);
  ASSERT_TRUE(lease.ok());
  const std::uint64_t inc = b->incarnation();
  // b stalls; a keeps beating. The owner fences b after host_ttl on its clock.
  for (int i = 0; i < 30; ++i) {
    clock.now += 100;
    ASSERT_TRUE(a->Heartbeat(nullptr).ok());
    d.owner->Step();
  }
  EXPECT_EQ(d.owner->stats().hosts_fenced, 1u);
  EXPECT_GT(clock.now, lease->deadline_ms) << "b's lease ended on its own clock first";
  ASSERT_TRUE(d.owner->RetireKey(ns, key).ok());
  clock.now += 100;
  EXPECT_EQ(d.owner->Reclaim(), 1u) << "a fenced host's lease does not hold a block";
  const absl::Status st = b->Heartbeat(nullptr);
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_GT(b->incarnation(), inc);
  EXPECT_EQ(b->leases_held(), 0u);
}

// A chain of keys, as a request's prefix gives them: block i's key chains on block i-1's.
std::vector<PrefixKey> Chain(Namespace ns, std::size_t n) {
  std::vector<PrefixKey> keys;
  PrefixKey parent{};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t tokens[] = {static_cast<std::uint32_t>(i), 7, 8, 9};
    parent = ChainKey(ns, parent, tokens);
    keys.push_back(parent);
  }
  return keys;
}

void ChainLeases(Mem& owner_mem, Mem& a_mem, Mem& b_mem) {
  ManualClock clock;
  Domain d(owner_mem, clock, {4, 64, 8, 16, 1000, 1000, 50});
  auto a = std::move(*PrefixHost::Join(a_mem, clock, 0));
  auto b = std::move(*PrefixHost::Join(b_mem, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const std::vector<PrefixKey> keys = Chain(ns, 12);
  // The first 6 blocks of the prefix are published; block 6 is not; 7.. are (a gap).
  for (std::uint32_t i = 0; i < 12; ++i) {
    if (i == 6) continue;
    ASSERT_TRUE(a->Publish(ns, keys[i], i ? keys[i - 1] : PrefixKey{}, Ref(100 + i)).ok());
  }
  d.owner->Step();
  std::vector<Lease> leases;
  auto n = b->AcquireChain(ns, keys, &leases);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 6u) << "the longest published run at the start of the prefix";
  ASSERT_EQ(leases.size(), 6u);
  EXPECT_EQ(b->leases_held(), 6u);
  for (std::uint32_t i = 0; i < 6; ++i) {
    EXPECT_EQ(leases[i].ref, Ref(100 + i)) << "leases in key order";
    EXPECT_TRUE(b->ValidateAfterCopy(leases[i]).ok());
    for (std::uint32_t j = 0; j < i; ++j) EXPECT_NE(leases[i].id, leases[j].id);
  }
  // A miss at the first key takes nothing.
  std::vector<Lease> none;
  auto miss = b->AcquireChain(ns, std::span(keys).subspan(6), &none);
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(*miss, 0u);
  EXPECT_TRUE(none.empty());
  // Leases from a chain hold blocks against retire + reclaim like single ones.
  ASSERT_TRUE(d.owner->RetireKey(ns, keys[2]).ok());
  clock.now += 100;
  EXPECT_EQ(d.owner->Reclaim(), 0u) << "leased: not reclaimed";
  EXPECT_FALSE(b->ValidateAfterCopy(leases[2]).ok());
  // Only 8 lease rows: a run longer than the rows left is cut, not failed.
  std::vector<Lease> more;
  auto cut = b->AcquireChain(ns, std::span(keys).subspan(7), &more);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(*cut, 2u) << "8 rows, 6 held";
  EXPECT_EQ(b->leases_held(), 8u);
  std::vector<Lease> full;
  EXPECT_TRUE(absl::IsResourceExhausted(b->AcquireChain(ns, keys, &full).status()));
  b->ReleaseAll(more);
  b->ReleaseAll(leases);
  b->ReleaseAll(leases);  // twice: a no-op
  EXPECT_EQ(b->leases_held(), 0u);
  EXPECT_EQ(d.owner->Reclaim(), 1u) << "released: the retired block goes";
  // A chain cut short by a retirement between lookup and lease: keys[2] is retired, so a
  // chain from keys[0] stops at 2 (Lookup already skips it: retired entries do not match).
  std::vector<Lease> again;
  auto two = b->AcquireChain(ns, keys, &again);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, 2u);
  b->ReleaseAll(again);
}

TEST(Prefix, ChainLeasesOnAMapping) {
  auto region = pool::OpenRegion("memfd:?size=4M");
  ASSERT_TRUE(region.ok());
  DirectMem owner((*region)->addr(), (*region)->size_bytes());
  DirectMem a((*region)->addr(), (*region)->size_bytes());
  DirectMem b((*region)->addr(), (*region)->size_bytes());
  ChainLeases(owner, a, b);
}

TEST(Prefix, ChainLeasesOnTheSimulator) {
  SimMemory media(4 << 20, 43);
  auto owner = media.NewView(0), a = media.NewView(0), b = media.NewView(0);
  ChainLeases(*owner, *a, *b);
}

// Evict orders nothing: on the simulator, as on hardware, a read before the fence may still
// return the stale copy; after FullFence it returns memory.
TEST(SimMemory, EvictTakesEffectAtTheFullFence) {
  SimMemory media(4096, 1);
  auto reader = media.NewView(0), writer = media.NewView(0);
  std::uint64_t v = 1, got = 0;
  reader->Read(0, &got, sizeof(got));
  EXPECT_EQ(got, 0u);
  writer->Write(0, &v, sizeof(v));
  writer->Flush(0, sizeof(v));
  reader->Evict(0, sizeof(got));
  reader->Read(0, &got, sizeof(got));
  EXPECT_EQ(got, 0u) << "no fence yet: the stale line is still there";
  reader->Evict(0, sizeof(got));
  reader->FullFence();
  reader->Read(0, &got, sizeof(got));
  EXPECT_EQ(got, 1u);
}

// A clock that runs a hook on one chosen call: the hook is what happens while the host is
// stalled right after that clock sample (other hosts and the owner keep going).
class StallingClock final : public Clock {
 public:
  std::int64_t NowMs() override {
    const std::int64_t t = now;
    if (stall_on_call > 0 && --stall_on_call == 0) stall();
    return t;
  }
  std::int64_t now = 1000;
  int stall_on_call = 0;
  std::function<void()> stall;
};

// Renew samples the clock, then writes the lease row again. A host that stalls between the
// two past its old deadline, but not long enough to be fenced, may find on waking that the
// owner judged the old row expired (unchanged for lease_ttl on its clock) and reclaimed the
// block — while the deadline counted from the sample is still ahead. Renew must look at the
// clock again after the write instead of promising a lease on a reclaimed block. SPIN found
// this (coherence/model, BUG_RENEW_NO_SECOND_LOOK); this is the same schedule.
TEST(Prefix, RenewThatStalledPastItsDeadlineLosesTheLease) {
  StallingClock clock;  // lease_ttl 1000, host_ttl 1000, grace 50; margin 250
  SimMemory media(4 << 20, 11);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const PrefixKey key = ChainKey(ns, PrefixKey{}, kTokens);
  const std::uint32_t other_tokens[] = {9, 9, 9};
  const PrefixKey other = ChainKey(ns, PrefixKey{}, other_tokens);
  ASSERT_TRUE(a->Publish(ns, key, PrefixKey{}, Ref(4)).ok());
  ASSERT_TRUE(a->Publish(ns, other, PrefixKey{}, Ref(5)).ok());
  d.owner->Step();
  auto lease = b->LookupAndAcquire(ns, key);  // at t = 1000: deadline 1750
  ASSERT_TRUE(lease.ok()) << lease.status();
  // Another block, retired but leased (by a, renewing), keeps the owner scanning lease rows
  // every step: it watches b's row from now on.
  auto a_lease = a->LookupAndAcquire(ns, other);
  ASSERT_TRUE(a_lease.ok()) << a_lease.status();
  ASSERT_TRUE(d.owner->RetireKey(ns, other).ok());
  d.owner->Step();
  // Both hosts beat and are acknowledged until t = 1700; b's lease is not renewed.
  for (int i = 0; i < 7; ++i) {
    clock.now += 100;
    ASSERT_TRUE(a->Heartbeat(nullptr).ok());
    ASSERT_TRUE(a->Renew(*a_lease).ok());
    ASSERT_TRUE(b->Heartbeat(nullptr).ok());
    d.owner->Step();
  }
  // b renews at 1700 (before its deadline) and stalls right after the clock sample until
  // 2200: past the old deadline, not past host_ttl. Meanwhile the owner retires the entry
  // and reclaims the block once the old row has been unchanged for lease_ttl.
  bool retired = false;
  clock.stall_on_call = 1;
  clock.stall = [&] {
    for (int i = 0; i < 5; ++i) {
      clock.now += 100;
      ASSERT_TRUE(a->Heartbeat(nullptr).ok());
      ASSERT_TRUE(a->Renew(*a_lease).ok());
      if (!retired) retired = d.owner->RetireKey(ns, key).ok();
      d.owner->Step();
    }
  };
  const std::uint64_t reclaimed_before = d.owner->stats().reclaimed;
  const absl::Status st = b->Renew(*lease);
  ASSERT_TRUE(retired);
  ASSERT_EQ(d.owner->stats().hosts_fenced, 0u) << "the stall is shorter than host_ttl";
  ASSERT_GT(d.owner->stats().reclaimed, reclaimed_before)
      << "the schedule must reclaim the block during the stall";
  if (st.ok()) {
    EXPECT_GT(clock.now, lease->deadline_ms)
        << "Renew promised a lease (deadline " << lease->deadline_ms << ", now " << clock.now
        << ") on a block the owner reclaimed";
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_EQ(b->leases_held(), 0u) << "the lost lease's row is given back";
}

// More blocks come back than the publisher's return ring holds, and the owner crashes (its
// unflushed lines lost) while most of them wait: every block still reaches its publisher.
// The waiting returns live in the index (retired entries), not in the owner's memory.
TEST(Prefix, ReturnsThatWaitForRingRoomSurviveAnOwnerCrash) {
  ManualClock clock;
  SimMemory media(4 << 20, 11);
  auto ov = media.NewView(0), av = media.NewView(0);
  Domain d(*ov, clock);  // ring_slots = 4
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  const Namespace ns = MakeNamespace("t", "m", "l");
  constexpr std::uint32_t kBlocks = 12;
  for (std::uint32_t i = 0; i < kBlocks; ++i) {
    const std::uint32_t tok[] = {i};
    ASSERT_TRUE(a->Publish(ns, ChainKey(ns, PrefixKey{}, tok), PrefixKey{}, Ref(100 + i)).ok());
    if (i % 4 == 3) d.owner->ApplyRequests();
  }
  ASSERT_EQ(d.owner->published_entries(), kBlocks);
  for (std::uint32_t i = 0; i < kBlocks; ++i) {
    const std::uint32_t tok[] = {i};
    ASSERT_TRUE(d.owner->RetireKey(ns, ChainKey(ns, PrefixKey{}, tok)).ok());
  }
  clock.now += 100;  // past grace
  EXPECT_EQ(d.owner->Reclaim(), 4u) << "only as many as the return ring has room for";
  EXPECT_EQ(d.owner->Reclaim(), 0u) << "the ring is full until the publisher collects";
  EXPECT_GT(d.owner->stats().returns_waiting, 0u);
  ov->Crash();  // the owner dies; a new one opens the domain
  d.owner.reset();
  d.owner = std::move(*PrefixOwner::Open(*ov, clock));
  std::map<std::uint32_t, int> back;
  for (int round = 0; round < 20 && back.size() < kBlocks; ++round) {
    std::vector<BlockRef> returned;
    ASSERT_TRUE(a->Heartbeat(&returned).ok());
    for (const BlockRef& r : returned) ++back[r.index];
    clock.now += 100;
    d.owner->Step();
  }
  ASSERT_EQ(back.size(), kBlocks) << "a block the owner had reclaimed was lost in the crash";
  for (const auto& [index, n] : back) {
    EXPECT_GE(index, 100u);
    EXPECT_EQ(n, 1) << "block " << index << " returned " << n << " times";
  }
  EXPECT_EQ(d.owner->published_entries(), 0u);
}

// An arena whose extent goes back to the pool: its entries are retired, a leased one stays
// until its lease is released, reclaim returns nothing to the (dead) publisher even when its
// return ring is full, later publishes into the arena are rejected, and EntriesNaming says
// when the memory may be lent again. Other arenas are untouched.
TEST(Prefix, RevokedArenaDrainsWithoutReturnsAndRefusesPublishes) {
  ManualClock clock;
  SimMemory media(4 << 20, 13);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock);  // ring_slots = 4
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  auto in_arena = [](std::uint8_t arena, std::uint32_t index) {
    BlockRef r = Ref(index);
    r.arena[0] = arena;
    return r;
  };
  auto key = [&](std::uint32_t i) {
    const std::uint32_t tok[] = {i};
    return ChainKey(ns, PrefixKey{}, tok);
  };
  // Arena 1 gets 8 published blocks (more than host a's return ring holds), arena 2 one.
  for (std::uint32_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(a->Publish(ns, key(i), PrefixKey{}, in_arena(1, i)).ok());
    if (i % 4 == 3) d.owner->ApplyRequests();
  }
  ASSERT_TRUE(a->Publish(ns, key(100), PrefixKey{}, in_arena(2, 0)).ok());
  d.owner->ApplyRequests();
  d.owner->FenceExpiredHosts();  // acknowledges b's heartbeat: b may take leases
  PrefixOwner::ArenaId one{}, two{};
  one[0] = 1;
  two[0] = 2;
  ASSERT_EQ(d.owner->EntriesNaming(one), 8u);
  ASSERT_EQ(d.owner->EntriesNaming(two), 1u);
  auto hit = b->Lookup(ns, key(3));
  ASSERT_TRUE(hit.has_value());
  auto lease = b->Acquire(*hit);
  ASSERT_TRUE(lease.ok()) << lease.status();

  EXPECT_EQ(d.owner->RevokeArena(one), 8u);
  EXPECT_EQ(d.owner->RevokeArena(one), 0u) << "idempotent";
  EXPECT_FALSE(b->Lookup(ns, key(0)).has_value());
  EXPECT_FALSE(b->ValidateAfterCopy(*lease).ok()) << "a copy from a revoked arena is discarded";
  EXPECT_TRUE(b->Lookup(ns, key(100)).has_value()) << "another arena is untouched";
  // A late publish into the revoked arena is refused.
  ASSERT_TRUE(a->Publish(ns, key(50), PrefixKey{}, in_arena(1, 50)).ok());
  const auto rejected = d.owner->stats().rejected;
  d.owner->ApplyRequests();
  EXPECT_EQ(d.owner->stats().rejected, rejected + 1);
  EXPECT_FALSE(b->Lookup(ns, key(50)).has_value());

  clock.now += 100;  // past grace; host a never collects returns (it may be dead)
  EXPECT_EQ(d.owner->Reclaim(), 7u) << "all but the leased one, whatever a's ring holds";
  EXPECT_EQ(d.owner->EntriesNaming(one), 1u) << "the leased block still pins the extent";
  b->Release(*lease);
  EXPECT_EQ(d.owner->Reclaim(), 1u);
  EXPECT_EQ(d.owner->EntriesNaming(one), 0u) << "now the extent may be lent again";
  EXPECT_EQ(d.owner->EntriesNaming(two), 1u);
  std::vector<BlockRef> returned;
  ASSERT_TRUE(a->Heartbeat(&returned).ok());
  for (const BlockRef& r : returned) {
    EXPECT_NE(r.arena[0], 1) << "a block of a revoked arena was returned";
  }
}

TEST(Prefix, RingFullIsReportedAndHeaderChecked) {
  ManualClock clock;
  SimMemory media(4 << 20, 3);
  auto ov = media.NewView(0), av = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  const Namespace ns = MakeNamespace("t", "m", "l");
  for (std::uint32_t i = 0; i < 4; ++i) {
    const std::uint32_t t = i;
    ASSERT_TRUE(a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(i)).ok());
  }
  const std::uint32_t t = 9;
  const absl::Status full = a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(9));
  EXPECT_TRUE(absl::IsUnavailable(full)) << full;
  d.owner->ApplyRequests();
  EXPECT_TRUE(a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(9)).ok());

  SimMemory blank(1 << 20, 1);
  auto bv = blank.NewView(0);
  EXPECT_TRUE(absl::IsNotFound(ReadDomainHeader(*bv).status()));
  EXPECT_FALSE(PrefixHost::Join(*av, clock, 99).ok()) << "host id beyond the domain";
}

// Directed schedules for single-call weakenings the seeded simulation cannot tell apart from
// the correct code (scripts/mutate-protocol, docs/mutation.md): each leaves a stale copy in
// one host's cache, or keeps a write in the writer's, exactly where the call matters.

// FormatDomain's contract: the domain is in memory when it returns. Another host joins with
// nothing else run on the formatting host (an owner's Open would write the header back with
// its own Invalidate and hide a missing Flush).
TEST(PrefixDirected, FormattedDomainIsInMemoryWhenFormatReturns) {
  ManualClock clock;
  SimMemory media(4 << 20, 21);
  auto fv = media.NewView(0), hv = media.NewView(0);
  ASSERT_TRUE(FormatDomain(*fv, {4, 64, 4, 4, 1000, 1000, 50}).ok());
  auto h = PrefixHost::Join(*hv, clock, 0);
  EXPECT_TRUE(h.ok()) << "the header stayed in the formatting host's cache: " << h.status();
}

// A host that starts before the domain is formatted reads the header region (not found),
// keeping those lines in its cache; after the format it must read memory, not its copy.
TEST(PrefixDirected, HostThatLookedBeforeFormatJoinsAfterIt) {
  ManualClock clock;
  SimMemory media(4 << 20, 22);
  auto ov = media.NewView(0), hv = media.NewView(0);
  const absl::Status early = PrefixHost::Join(*hv, clock, 0).status();
  ASSERT_TRUE(absl::IsNotFound(early)) << early;
  Domain d(*ov, clock);
  auto h = PrefixHost::Join(*hv, clock, 0);
  EXPECT_TRUE(h.ok()) << "joined against its stale copy of the unformatted header: " << h.status();
}

// Acquire's re-validation must read the entry from memory, not the copy its Lookup left in
// this host's cache: an entry retired in between is not leased.
TEST(PrefixDirected, AcquireDoesNotLeaseAnEntryRetiredAfterTheLookup) {
  ManualClock clock;
  SimMemory media(4 << 20, 25);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const PrefixKey key = ChainKey(ns, PrefixKey{}, kTokens);
  ASSERT_TRUE(a->Publish(ns, key, PrefixKey{}, Ref(6)).ok());
  d.owner->Step();
  const auto hit = b->Lookup(ns, key);
  ASSERT_TRUE(hit.has_value());
  ASSERT_TRUE(d.owner->RetireKey(ns, key).ok());
  const absl::StatusOr<Lease> lease = b->Acquire(*hit);
  EXPECT_TRUE(absl::IsNotFound(lease.status()))
      << "leased an entry retired after the lookup (re-validation read its cached copy): "
      << lease.status();
  EXPECT_EQ(b->leases_held(), 0u);
}

// AcquireChain's lookup must drop the index lines it read on an earlier call: keys that
// missed then and are published now are leased, not missed again from the cached copy.
TEST(PrefixDirected, ChainSeesEntriesPublishedSinceItsLastLook) {
  ManualClock clock;
  SimMemory media(4 << 20, 23);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock, {4, 64, 8, 16, 1000, 1000, 50});
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const std::vector<PrefixKey> keys = Chain(ns, 3);
  d.owner->Step();  // acknowledges b's heartbeat
  std::vector<Lease> none;
  auto miss = b->AcquireChain(ns, keys, &none);
  ASSERT_TRUE(miss.ok()) << miss.status();
  ASSERT_EQ(*miss, 0u) << "nothing published yet";
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(a->Publish(ns, keys[i], i ? keys[i - 1] : PrefixKey{}, Ref(200 + i)).ok());
  }
  d.owner->Step();
  std::vector<Lease> got;
  auto n = b->AcquireChain(ns, keys, &got);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, keys.size()) << "the chain read its cached copy of the index (all empty)";
  b->ReleaseAll(got);
}

// AcquireChain's re-validation must read the entries again from memory after its lease
// rows are there: an entry the owner retired between the lookup and the lease is not leased
// (the chain form of "the block was retired before the lease took hold").
TEST(PrefixDirected, ChainDoesNotLeaseAnEntryRetiredBetweenLookupAndLease) {
  ManualClock clock;
  SimMemory media(4 << 20, 24);
  auto ov = media.NewView(0), av = media.NewView(0), bv = media.NewView(0);
  Domain d(*ov, clock, {4, 64, 8, 16, 1000, 1000, 50});
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  auto b = std::move(*PrefixHost::Join(*bv, clock, 1));
  const Namespace ns = MakeNamespace("t", "m", "l");
  const std::vector<PrefixKey> keys = Chain(ns, 2);
  for (std::uint32_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(a->Publish(ns, keys[i], i ? keys[i - 1] : PrefixKey{}, Ref(300 + i)).ok());
  }
  d.owner->Step();
  // The owner retires the first key at b's first fence after one of b's lease rows reached
  // memory held: after b's lookup read the entry, before b's re-validation.
  const DomainHeader h = d.owner->header();
  auto b_row_held = [&] {
    for (std::uint32_t r = 0; r < h.lease_rows; ++r) {
      LeaseRow row;
      media.ReadMedia(h.lease_rows_offset + (std::uint64_t{1} * h.lease_rows + r) * sizeof(row),
                      &row, sizeof(row));
      if (row.held != 0) return true;
    }
    return false;
  };
  bool retired = false;
  bv->set_on_fence([&] {
    if (!retired && b_row_held()) retired = d.owner->RetireKey(ns, keys[0]).ok();
  });
  std::vector<Lease> got;
  auto n = b->AcquireChain(ns, keys, &got);
  bv->set_on_fence({});
  ASSERT_TRUE(retired) << "the schedule must retire the entry between lookup and lease";
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u) << "leased an entry retired before the lease took hold (re-validation read "
                       "its cached copy)";
  EXPECT_EQ(b->leases_held(), 0u);
  EXPECT_FALSE(b_row_held()) << "the row of the failed lease is cleared again";
  clock.now += 100;  // past grace: nothing holds the retired block
  EXPECT_EQ(d.owner->Reclaim(), 1u);
}

}  // namespace
}  // namespace cxlkv::coherence
