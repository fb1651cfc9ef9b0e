// coherence/prefix.h: keys, namespaces, and the host/owner flows on a real mapping and on
// the simulator, step by step.
#include "cxlkv/coherence/prefix.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cxlkv/coherence/sim.h"
// White box: a key's probe start, to make two keys share one.
#include "../coherence/src/domain_internal.h"
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

// Write-backs that complete only at their issuer's next fence: x86 gives no bound on when a
// clwb completes until an sfence or mfence, so every record a call writes must be fenced
// before the call returns, or the other side acts on it only after this host's next call.
SimOptions WriteBacksHeldToTheNextFence() {
  SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  return o;
}

TEST(Prefix, PublishLookupLeaseRetireReclaimWithWriteBacksHeldToTheNextFence) {
  SimMemory media(4 << 20, 42, WriteBacksHeldToTheNextFence());
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

// A configured namespace whose name differs from the one the hosts build (a `layout` typo in
// [[namespace]]) matches no publication while others fill: the owner counts both, so the
// orchestrator can name it. Duplicates and rejected publications count for nothing.
TEST(Prefix, PublicationsAreCountedPerConfiguredNamespace) {
  ManualClock clock;
  SimMemory media(4 << 20, 11);
  auto ov = media.NewView(0), av = media.NewView(0);
  Domain d(*ov, clock);
  auto a = std::move(*PrefixHost::Join(*av, clock, 0));
  const Namespace built = MakeNamespace("t", "m", "fp16-l80");
  const Namespace typo = MakeNamespace("t", "m", "fp16-l8O");
  const Namespace other = MakeNamespace("u", "m", "fp16-l80");
  ASSERT_TRUE(a->Publish(built, ChainKey(built, PrefixKey{}, kTokens), PrefixKey{}, Ref(1)).ok());
  d.owner->ApplyRequests();
  EXPECT_EQ(d.owner->published_under_others(), 0u) << "nothing is counted before a pin level";
  d.owner->SetPinLevel(typo, 2);
  d.owner->SetPinLevel(other, 1);
  const PrefixKey k2 = ChainKey(built, ChainKey(built, PrefixKey{}, kTokens), kTokens);
  ASSERT_TRUE(a->Publish(built, k2, PrefixKey{}, Ref(2)).ok());
  ASSERT_TRUE(a->Publish(built, k2, PrefixKey{}, Ref(3)).ok());  // a duplicate
  ASSERT_TRUE(a->Publish(other, ChainKey(other, PrefixKey{}, kTokens), PrefixKey{}, Ref(4)).ok());
  d.owner->ApplyRequests();
  EXPECT_EQ(d.owner->published_under(typo), 0u);
  EXPECT_EQ(d.owner->published_under(other), 1u);
  EXPECT_EQ(d.owner->published_under(built), 0u) << "never configured";
  EXPECT_EQ(d.owner->published_under_others(), 1u) << "the duplicate is not a publication";
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

TEST(Prefix, ChainLeasesWithWriteBacksHeldToTheNextFence) {
  SimMemory media(4 << 20, 43, WriteBacksHeldToTheNextFence());
  auto owner = media.NewView(0), a = media.NewView(0), b = media.NewView(0);
  ChainLeases(*owner, *a, *b);
}

// Evict orders nothing: on the simulator, as on hardware, a read before the fence may still
// return the stale copy; after FullFence it returns memory.
// The domain's publish key (DomainKeyLine): none in a new domain; the owner's key, once
// created, is what another host reads, on a non-coherent simulator whose views keep stale
// lines (a reader that cached the empty line before must drop it) and with write-backs held
// to the writer's next fence (the key must be written back and fenced before it is used).
// Seeds vary each view's evictions; the seed is printed.
TEST(DomainKey, CreatedOnceAndReadByEveryHost) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    SimMemory media(4 << 20, seed, seed % 2 == 0 ? WriteBacksHeldToTheNextFence() : SimOptions{});
    auto owner = media.NewView(0), reader = media.NewView(0);
    ASSERT_TRUE(FormatDomain(*owner, DomainGeometry{4, 64, 4, 4, 1000, 1000, 50}).ok());
    owner->Flush(0, 4096);
    owner->FullFence();
    // The reader looks before there is a key (and keeps the empty line in its cache).
    auto none = ReadDomainKey(*reader);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(*none, "");
    auto made = CreateDomainKey(*owner, 1234);
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_EQ(made->size(), 64u);
    EXPECT_EQ(made->find_first_not_of("0123456789abcdef"), std::string::npos) << *made;
    auto seen = ReadDomainKey(*reader);
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_EQ(*seen, *made) << "another host must read the key the owner created";
    // The owner's own reading, and a second domain's key differs (random per domain).
    auto again = ReadDomainKey(*owner);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *made);
    SimMemory other(4 << 20, seed);
    auto o2 = other.NewView(0);
    ASSERT_TRUE(FormatDomain(*o2, DomainGeometry{4, 64, 4, 4, 1000, 1000, 50}).ok());
    auto k2 = CreateDomainKey(*o2, 1);
    ASSERT_TRUE(k2.ok());
    EXPECT_NE(*k2, *made);
  }
}

// A torn key line (its writer died between two words) reads as kDataLoss, never as a key;
// the owner writes a new one over it. A line of a newer version is refused by name.
TEST(DomainKey, TornLineIsDataLossAndANewerVersionIsRefused) {
  SimMemory media(4 << 20, 5);
  auto v = media.NewView(0);
  ASSERT_TRUE(FormatDomain(*v, DomainGeometry{4, 64, 4, 4, 1000, 1000, 50}).ok());
  auto made = CreateDomainKey(*v, 7);
  ASSERT_TRUE(made.ok());
  DomainKeyLine l{};
  v->Read(kDomainKeyOffset, &l, sizeof(l));
  l.secret[3] ^= 0x5a;  // half written: the CRC no longer matches
  v->Write(kDomainKeyOffset, &l, sizeof(l));
  auto torn = ReadDomainKey(*v);
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kDataLoss) << torn.status();
  auto fresh = CreateDomainKey(*v, 8);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(*fresh, *made);
  auto read = ReadDomainKey(*v);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, *fresh);
  v->Read(kDomainKeyOffset, &l, sizeof(l));
  l.version = kDomainKeyVersion + 1;
  SealLine(l);
  v->Write(kDomainKeyOffset, &l, sizeof(l));
  auto newer = ReadDomainKey(*v);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition) << newer.status();
  EXPECT_NE(newer.status().message().find("version"), std::string::npos) << newer.status();
}

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
    ASSERT_TRUE(
        a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(i)).ok());
  }
  const std::uint32_t t = 9;
  const absl::Status full =
      a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(9));
  EXPECT_TRUE(absl::IsUnavailable(full)) << full;
  d.owner->ApplyRequests();
  EXPECT_TRUE(
      a->Publish(ns, ChainKey(ns, PrefixKey{}, std::span(&t, 1)), PrefixKey{}, Ref(9)).ok());

  SimMemory blank(1 << 20, 1);
  auto bv = blank.NewView(0);
  EXPECT_TRUE(absl::IsNotFound(ReadDomainHeader(*bv).status()));
  EXPECT_FALSE(PrefixHost::Join(*av, clock, 99).ok()) << "host id beyond the domain";
}

// ---- the directed schedules of the protocol audit ------------------------------------------
//
// Each test below replays one finding of the audit (issue #17) on the simulator and failed on
// the code before its fix.

// Two hosts and an owner on the simulator, each with a clock of its own on one global time
// (a test may stop or step one), joined and acknowledged by t = 20. `god` is a view only the
// test uses, to change memory behind the protocol's back (what a crash leaves).
struct World {
  explicit World(const DomainGeometry& geometry = {2, 16, 4, 4, 400, 4000, 40},
                 std::int64_t host1_offset_ms = 0, double host1_rate = 1.0,
                 const SimOptions& options = {}, std::uint64_t seed = 42)
      : g(geometry),
        media(DomainBytes(geometry), seed, options),
        ov(media.NewView(0)),
        v0(media.NewView(0)),
        v1(media.NewView(0)),
        god(media.NewView(0)),
        oc(&now, 0, 1.0),
        c0(&now, 0, 1.0),
        c1(&now, host1_offset_ms, host1_rate) {
    EXPECT_TRUE(FormatDomain(*ov, g).ok());
    owner = std::move(*PrefixOwner::Open(*ov, oc));
    h0 = std::move(*PrefixHost::Join(*v0, c0, 0));
    h1 = std::move(*PrefixHost::Join(*v1, c1, 1));
    for (int i = 0; i < 2; ++i) {
      Beat();
      now += 10;
    }
    EXPECT_TRUE(h0->Heartbeat(nullptr).ok());
    EXPECT_TRUE(h1->Heartbeat(nullptr).ok());
  }
  void Beat() {
    EXPECT_TRUE(h0->Heartbeat(nullptr).ok());
    EXPECT_TRUE(h1->Heartbeat(nullptr).ok());
    owner->Step();
  }
  PrefixKey Key(std::uint32_t i) const { return ChainKey(ns, PrefixKey{}, std::span(&i, 1)); }
  std::uint64_t HostRowOff(std::uint32_t host) const {
    return owner->header().host_rows_offset + std::uint64_t{host} * kLine;
  }
  std::uint64_t OwnerLineOff(std::uint32_t host) const {
    return owner->header().owner_area_offset + std::uint64_t{host} * kLine;
  }
  std::uint64_t EntryOff(std::uint32_t i) const {
    return owner->header().index_offset + std::uint64_t{i} * sizeof(IndexEntry);
  }
  template <typename T>
  T MediaAt(std::uint64_t off) const {
    T t;
    media.ReadMedia(off, &t, sizeof(t));
    return t;
  }
  template <typename T>
  void SetMedia(std::uint64_t off, const T& t) {
    god->Write(off, &t, sizeof(t));
    god->Invalidate(off, sizeof(t));  // writes the line back and drops it
  }
  // A line half-written by a writer that died: one byte new, the CRC the old line's.
  template <typename T>
  void Tear(std::uint64_t off) {
    T t = MediaAt<T>(off);
    reinterpret_cast<unsigned char*>(&t)[8] ^= 0x5A;
    SetMedia(off, t);
  }

  DomainGeometry g;
  std::int64_t now = 0;
  SimMemory media;
  std::unique_ptr<SimMemory::HostView> ov, v0, v1, god;
  SimClock oc, c0, c1;
  std::unique_ptr<PrefixOwner> owner;
  std::unique_ptr<PrefixHost> h0, h1;
  const Namespace ns = MakeNamespace("t", "m", "l");
};

// Audit #1. The owner times a lease row's change on its own clock. A clock sample taken before
// it read the row credits a renewal that landed during an owner stall with an earlier time than
// it had, and the row then expires before the host's deadline for it. Here the owner stalls
// 150 ms inside a Reclaim's lease scan (at its second fence, after two clock readings) while
// host 1 renews.
TEST(PrefixAudit, OwnerStallDuringLeaseScanDoesNotExpireALiveLease) {
  World w;  // lease_ttl 400, margin 100
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->deadline_ms, 400);
  ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
  w.now = 200;
  int reads = 0, fences = 0;
  bool renewed = false;
  absl::Status renew;
  w.oc.set_on_read([&] { ++reads; });
  w.ov->set_on_fence([&] {
    if (renewed || ++fences < 2 || reads < 2) return;
    renewed = true;
    w.now = 350;  // the owner stood still here for 150 ms
    renew = w.h1->Renew(*lease);
  });
  EXPECT_EQ(w.owner->Reclaim(), 0u);
  w.oc.set_on_read({});
  w.ov->set_on_fence({});
  ASSERT_TRUE(renewed);
  ASSERT_TRUE(renew.ok()) << renew;
  ASSERT_EQ(lease->deadline_ms, 650);
  w.now = 605;
  EXPECT_EQ(w.owner->Reclaim(), 0u) << "the owner freed the block at 605 under a lease that is "
                                       "valid until 650 on the host's clock";
  w.h1->Release(*lease);
  EXPECT_EQ(w.owner->Reclaim(), 1u);
}

// Audit #2. The owner applies a PUBLISH (the entry is in memory) and dies before its owner line
// — which says the request was consumed — reaches memory; the publisher restarts meanwhile, as
// a new incarnation. The next owner replays the request, finds it from an older incarnation,
// and must not hand the block back: the index still publishes it.
TEST(PrefixAudit, StaleIncarnationPublishNeverReturnsAPublishedBlock) {
  World w;
  const OwnerHostLine before = w.MediaAt<OwnerHostLine>(w.OwnerLineOff(0));
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  EXPECT_EQ(w.owner->ApplyRequests(), 1u);
  ASSERT_EQ(w.owner->published_entries(), 1u);
  w.SetMedia(w.OwnerLineOff(0), before);  // the owner line never left the dead owner's cache
  w.owner.reset();
  w.ov->Crash();
  const std::uint64_t old_incarnation = w.h0->incarnation();
  w.h0.reset();
  w.v0->Crash();
  w.h0 = std::move(*PrefixHost::Join(*w.v0, w.c0, 0));
  ASSERT_GT(w.h0->incarnation(), old_incarnation);
  auto reopened = PrefixOwner::Open(*w.ov, w.oc);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  w.owner = std::move(*reopened);
  std::vector<BlockRef> back;
  for (int i = 0; i < 3; ++i) {
    w.owner->Step();
    w.now += 10;
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
  }
  const auto hit = w.h1->Lookup(w.ns, w.Key(1));
  ASSERT_TRUE(hit.has_value()) << "the publication survived the owner's crash";
  for (const BlockRef& r : back) {
    EXPECT_NE(r, hit->ref) << "the block went back to its publisher (which frees and reuses it) "
                              "while the index still publishes it";
  }
}

// Audit #7. A torn host row (its writer died mid-line) must not hide that host's lease rows
// from the owner's scan: a lease row that is held and fresh keeps its block.
TEST(PrefixAudit, TornHostRowHidesNoLease) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
  w.now = 200;
  w.Tear<HostRow>(w.HostRowOff(1));
  EXPECT_EQ(w.owner->Reclaim(), 0u) << "freed at 200 under a lease valid until "
                                    << lease->deadline_ms << " (host 1's row was unreadable)";
  // Host 1's next heartbeat writes its row whole again; released, the block goes.
  w.h1->Release(*lease);
  ASSERT_TRUE(w.h1->Heartbeat(nullptr).ok());
  EXPECT_EQ(w.owner->Reclaim(), 1u);
}

// Audit #7, liveness: a host that died with its row torn never writes it again. Its lease rows
// still count while fresh, and stop counting once unchanged for a lease TTL.
TEST(PrefixAudit, TornHostRowOfADeadHostStillLetsItsLeasesExpire) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
  w.h1.reset();
  w.v1->Crash();
  w.Tear<HostRow>(w.HostRowOff(1));
  w.now = 200;
  EXPECT_EQ(w.owner->Reclaim(), 0u)
      << "freed at 200 under a lease valid until " << lease->deadline_ms;
  w.now = 200 + w.g.lease_ttl_ms + 1;
  EXPECT_EQ(w.owner->Reclaim(), 1u) << "the dead host's lease row never expired";
}

// Audit #12. A host whose process died with its own row torn must come back as a new
// incarnation that can publish and collect returns again; the old code reused the dead
// incarnation and restarted its return ring at 0, so the owner waited forever for ring room.
TEST(PrefixAudit, TornOwnHostRowDoesNotWedgeTheHostId) {
  World w;  // ring_slots 4
  std::set<std::uint32_t> back;
  auto cycle = [&](std::uint32_t i) {
    if (!w.h0->Publish(w.ns, w.Key(i), PrefixKey{}, Ref(100 + i)).ok()) return;
    w.owner->Step();
    (void)w.owner->RetireKey(w.ns, w.Key(i));
    w.now += 50;  // past grace
    w.owner->Step();
    std::vector<BlockRef> got;
    EXPECT_TRUE(w.h0->Heartbeat(&got).ok());
    EXPECT_TRUE(w.h1->Heartbeat(nullptr).ok());
    for (const BlockRef& r : got) back.insert(r.index);
  };
  for (std::uint32_t i = 0; i < 6; ++i) cycle(i);
  ASSERT_EQ(back.size(), 6u);
  const std::uint64_t old_incarnation = w.h0->incarnation();
  w.h0.reset();
  w.v0->Crash();
  w.Tear<HostRow>(w.HostRowOff(0));
  auto joined = PrefixHost::Join(*w.v0, w.c0, 0);
  ASSERT_TRUE(joined.ok()) << joined.status();
  w.h0 = std::move(*joined);
  EXPECT_GT(w.h0->incarnation(), old_incarnation) << "the dead process's incarnation was reused";
  // The returns the dead process may not have freed come again first (at least once).
  for (int i = 0; i < 2; ++i) {
    w.owner->Step();
    w.now += 10;
    std::vector<BlockRef> again;
    ASSERT_TRUE(w.h0->Heartbeat(&again).ok());
  }
  back.clear();
  for (std::uint32_t i = 10; i < 14; ++i) cycle(i);
  for (std::uint32_t i = 10; i < 14; ++i) {
    EXPECT_EQ(back.count(100 + i), 1u)
        << "block " << 100 + i << " published after the rejoin "
        << "never came back (published " << w.owner->stats().published << ")";
  }
}

// Audit #13. One torn line the owner wrote (it died mid-write) must not keep every later owner
// from opening the domain. The entry is quarantined: kept retired while a lease may name it,
// then freed without a return (its block is unknown: leaked, and counted).
TEST(PrefixAudit, TornIndexEntryIsQuarantinedAndTheOwnerStillOpens) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(1)).ok());
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(2)).ok());
  w.owner->Step();
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::uint32_t torn = lease->entry;
  w.Tear<IndexEntry>(w.EntryOff(torn));
  w.owner.reset();
  w.ov->Crash();
  auto reopened = PrefixOwner::Open(*w.ov, w.oc);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  w.owner = std::move(*reopened);
  EXPECT_EQ(w.owner->stats().quarantined, 1u);
  EXPECT_FALSE(w.h1->Lookup(w.ns, w.Key(1)).has_value());
  EXPECT_TRUE(w.h1->Lookup(w.ns, w.Key(2)).has_value()) << "the other entry is untouched";
  PrefixOwner::ArenaId seven{};
  seven[0] = 7;
  EXPECT_EQ(w.owner->EntriesNaming(seven), 2u)
      << "while the quarantined entry may be leased, its unknown block may be in any arena";
  for (int i = 0; i < 3; ++i) {
    w.now += 50;
    w.Beat();
  }
  EXPECT_EQ(w.owner->entry(torn).state, static_cast<std::uint8_t>(EntryState::kRetired))
      << "freed while host 1 still leases the entry";
  w.h1->Release(*lease);
  std::vector<BlockRef> back;
  for (int i = 0; i < 3; ++i) {
    w.now += 50;
    w.Beat();
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
  }
  EXPECT_NE(w.owner->entry(torn).state, static_cast<std::uint8_t>(EntryState::kRetired))
      << "the quarantined entry never drained";
  EXPECT_TRUE(back.empty()) << "a block was returned for an entry whose block is unknown";
  EXPECT_EQ(w.owner->EntriesNaming(seven), 1u);
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(3)).ok());
  w.owner->Step();
  EXPECT_TRUE(w.h1->Lookup(w.ns, w.Key(1)).has_value()) << "the key can be published again";
}

// Audit #13, the owner's other lines: a torn owner line is rebuilt from the host's own lines.
TEST(PrefixAudit, TornOwnerLineIsRebuiltFromTheHostRow) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(1)).ok());
  w.owner->Step();
  w.Tear<OwnerHostLine>(w.OwnerLineOff(0));
  w.owner.reset();
  w.ov->Crash();
  auto reopened = PrefixOwner::Open(*w.ov, w.oc);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  w.owner = std::move(*reopened);
  EXPECT_EQ(w.owner->stats().owner_lines_rebuilt, 1u);
  for (int i = 0; i < 2; ++i) {
    w.now += 10;
    w.Beat();
  }
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(2)).ok());
  w.owner->Step();
  EXPECT_TRUE(w.h1->Lookup(w.ns, w.Key(1)).has_value());
  EXPECT_TRUE(w.h1->Lookup(w.ns, w.Key(2)).has_value()) << "host 0 publishes again";
  EXPECT_TRUE(w.h0->Heartbeat(nullptr).ok()) << "host 0 was not fenced by the rebuilt line";
}

// Reads of index entries through the Mem seam.
class CountingMem final : public Mem {
 public:
  CountingMem(Mem& inner, std::uint64_t lo, std::uint64_t hi) : inner_(inner), lo_(lo), hi_(hi) {}
  std::uint64_t size_bytes() const override { return inner_.size_bytes(); }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override {
    if (offset >= lo_ && offset < hi_) reads += (len + 63) / 64;  // index lines, not calls
    inner_.Read(offset, dst, len);
  }
  void Write(std::uint64_t o, const void* s, std::size_t n) override { inner_.Write(o, s, n); }
  void WriteNt(std::uint64_t o, const void* s, std::size_t n) override { inner_.WriteNt(o, s, n); }
  void Flush(std::uint64_t o, std::size_t n) override { inner_.Flush(o, n); }
  void Invalidate(std::uint64_t o, std::size_t n) override { inner_.Invalidate(o, n); }
  void Evict(std::uint64_t o, std::size_t n) override { inner_.Evict(o, n); }
  void Fence() override { inner_.Fence(); }
  void FullFence() override { inner_.FullFence(); }
  std::uint64_t reads = 0;

 private:
  Mem& inner_;
  std::uint64_t lo_, hi_;
};

// The owner's stores, flushes and fences in order, through the Mem seam.
class RecordingMem final : public Mem {
 public:
  enum Kind : std::uint8_t { kWrite, kFlush, kFence };
  struct Op {
    Kind kind;
    std::uint64_t offset;
  };
  explicit RecordingMem(Mem& inner) : inner_(inner) {}
  std::uint64_t size_bytes() const override { return inner_.size_bytes(); }
  void Read(std::uint64_t o, void* d, std::size_t n) override { inner_.Read(o, d, n); }
  void Write(std::uint64_t o, const void* s, std::size_t n) override {
    ops.push_back({kWrite, o});
    inner_.Write(o, s, n);
  }
  void WriteNt(std::uint64_t o, const void* s, std::size_t n) override {
    ops.push_back({kWrite, o});
    inner_.WriteNt(o, s, n);
  }
  void Flush(std::uint64_t o, std::size_t n) override {
    ops.push_back({kFlush, o});
    inner_.Flush(o, n);
  }
  void Invalidate(std::uint64_t o, std::size_t n) override {
    ops.push_back({kFence, o});  // ends with an mfence
    inner_.Invalidate(o, n);
  }
  void Evict(std::uint64_t o, std::size_t n) override { inner_.Evict(o, n); }
  void Fence() override {
    ops.push_back({kFence, 0});
    inner_.Fence();
  }
  void FullFence() override {
    ops.push_back({kFence, 0});
    inner_.FullFence();
  }
  std::vector<Op> ops;

 private:
  Mem& inner_;
};

// Audit-ha #9. Inside the owner's batch, a raised probe length (the home line) must be fenced
// before the entry it now covers is stored: clwb's of two lines are not ordered with each
// other, so without a fence the entry can reach memory first (and a crash then leaves it
// past the length readers stop at). The HA simulation caught this as "a published entry
// lies past its start slot's probe length" after an owner crash (seed 1, step 54,416).
TEST(PrefixAudit, RaisedProbeLengthIsFencedBeforeTheEntryItCovers) {
  World w;
  RecordingMem rec(*w.ov);
  struct DropOwnerFirst {  // the owner goes before `rec`, whatever ends the test
    World& w;
    ~DropOwnerFirst() { w.owner.reset(); }
  } drop_owner_first{w};
  w.owner.reset();
  w.owner = std::move(*PrefixOwner::Open(rec, w.oc));
  const DomainHeader& h = w.owner->header();
  // Two keys with one probe start.
  std::map<std::uint32_t, std::uint32_t> first_with_start;
  std::uint32_t a = 0, b = 0;
  for (std::uint32_t i = 0;; ++i) {
    const std::uint32_t start = internal::ProbeStart(h, w.ns, w.Key(i));
    const auto [it, fresh] = first_with_start.try_emplace(start, i);
    if (!fresh) {
      a = it->second;
      b = i;
      break;
    }
  }
  const std::uint32_t home = internal::ProbeStart(h, w.ns, w.Key(a));
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(a), PrefixKey{}, Ref(1)).ok());
  w.owner->ApplyRequests();
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(b), PrefixKey{}, Ref(2)).ok());
  rec.ops.clear();
  w.owner->ApplyRequests();
  const std::uint64_t home_off = w.EntryOff(home);
  const std::uint64_t slot_off = w.EntryOff((home + 1) % h.index_entries);
  std::ptrdiff_t home_store = -1, slot_store = -1;
  for (std::size_t k = 0; k < rec.ops.size(); ++k) {
    if (rec.ops[k].kind != RecordingMem::kWrite) continue;
    if (rec.ops[k].offset == home_off && home_store < 0)
      home_store = static_cast<std::ptrdiff_t>(k);
    if (rec.ops[k].offset == slot_off && slot_store < 0)
      slot_store = static_cast<std::ptrdiff_t>(k);
  }
  ASSERT_GE(home_store, 0) << "the batch did not raise the home line's probe length";
  ASSERT_GT(slot_store, home_store) << "the entry was stored before its home line";
  bool fenced = false;
  for (std::ptrdiff_t k = home_store; k < slot_store; ++k) {
    fenced = fenced || rec.ops[static_cast<std::size_t>(k)].kind == RecordingMem::kFence;
  }
  EXPECT_TRUE(fenced) << "no fence between the home line's store (probe length raised) and "
                         "the store of the entry it covers";
  ASSERT_TRUE(w.h1->Lookup(w.ns, w.Key(b)).has_value());
}

// Audit #15. After publish / retire / reclaim churn, a lookup of a key that is not there must
// stop after a few entries, not probe the whole index; and keys still published are found.
TEST(PrefixAudit, MissAfterChurnProbesAFewEntriesNotTheIndex) {
  World w({2, 64, 4, 4, 400, 4000, 40});
  for (std::uint32_t j = 0; j < 8; ++j) {  // never retired
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1000 + j), PrefixKey{}, Ref(1000 + j)).ok());
    if (j % 4 == 3) w.owner->Step();
  }
  for (std::uint32_t c = 0; c < 640; ++c) {
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(c), PrefixKey{}, Ref(c)).ok());
    w.owner->Step();
    ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(c)).ok()) << "cycle " << c;
    w.now += 50;
    w.owner->Step();
    std::vector<BlockRef> back;
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
  }
  ASSERT_EQ(w.owner->stats().reclaimed, 640u);
  ASSERT_EQ(w.owner->published_entries(), 8u);
  const DomainHeader& h = w.owner->header();
  CountingMem counting(*w.v1, h.index_offset,
                       h.index_offset + h.index_entries * sizeof(IndexEntry));
  w.h1.reset();
  w.h1 = std::move(*PrefixHost::Join(counting, w.c1, 1));
  std::uint64_t worst = 0;
  for (std::uint32_t m = 5000; m < 5040; ++m) {
    counting.reads = 0;
    EXPECT_FALSE(w.h1->Lookup(w.ns, w.Key(m)).has_value());
    worst = std::max(worst, counting.reads);
  }
  EXPECT_LE(worst, 9u) << "a miss read " << worst << " of " << h.index_entries
                       << " index entries with 8 live keys";
  for (std::uint32_t j = 0; j < 8; ++j) {
    const auto hit = w.h1->Lookup(w.ns, w.Key(1000 + j));
    ASSERT_TRUE(hit.has_value()) << "live key " << j << " lost after churn";
    EXPECT_EQ(hit->ref, Ref(1000 + j));
  }
}

// Eviction under pressure converts published entries into retired ones, which hold their index
// slots until their grace has passed and they are reclaimed: evicting frees nothing at once.
// The owner evicts the published entries beyond max_load once, not again at every step until
// the reclaim (the engine adapters' removal test found 224 publishes into a 256-entry index
// leaving none published: each step evicted another max_load's excess).
TEST(Prefix, EvictionUnderPressureKeepsMaxLoadOfTheIndexPublished) {
  World w({2, 64, 4, 64, 400, 4000, 40});
  const std::uint32_t limit = 48;  // max_load 0.75 of 64 entries
  for (std::uint32_t i = 0; i < 56; ++i) {
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(i), PrefixKey{}, Ref(i)).ok()) << i;
  }
  for (int step = 0; step < 10; ++step) w.owner->Step();  // no time passes: nothing reclaimed
  EXPECT_EQ(w.owner->published_entries(), limit);
  EXPECT_EQ(w.owner->retired_entries(), 56u - limit);
  EXPECT_EQ(w.owner->stats().evicted, 56u - limit);
  for (int round = 0; round < 4; ++round) {  // the grace passes: the evicted are reclaimed
    w.now += 30;
    w.Beat();
  }
  EXPECT_EQ(w.owner->stats().reclaimed, 56u - limit);
  EXPECT_EQ(w.owner->published_entries(), limit);
  std::uint32_t hits = 0;
  for (std::uint32_t i = 0; i < 56; ++i) hits += w.h1->Lookup(w.ns, w.Key(i)).has_value() ? 1 : 0;
  EXPECT_EQ(hits, limit);
}

// Issue #21 (audit #15 at load). With the index kept 70 % full through many publish /
// retire / reclaim cycles, tombstones fill the empty slots a miss used to stop at; a lookup
// of an absent key must still read about as many entries as a hit, not walk the clusters.
TEST(PrefixAudit, MissAt70PercentAfterChurnCostsAboutAHit) {
  World w({2, 256, 4, 64, 400, 4000, 40});
  constexpr std::uint32_t kLive = 179;  // 70 % of 256
  constexpr std::uint32_t kBatch = 4;   // 179 + 4 new + 4 retired stay under the eviction limit
  std::vector<BlockRef> back;
  std::uint32_t next = 0, oldest = 0;
  auto publish = [&](std::uint32_t n) {
    for (std::uint32_t j = 0; j < n; ++j, ++next) {
      ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(next), PrefixKey{}, Ref(next)).ok()) << next;
      if (next % 32 == 31) w.owner->ApplyRequests();
    }
    w.owner->ApplyRequests();
  };
  publish(kLive);
  ASSERT_EQ(w.owner->published_entries(), kLive);
  for (std::uint32_t c = 0; c < 1280; ++c) {  // 5,120 cycles: 20 times the index
    publish(kBatch);
    for (std::uint32_t j = 0; j < kBatch; ++j, ++oldest) {
      ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(oldest)).ok()) << oldest;
    }
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
    ASSERT_TRUE(w.h1->Heartbeat(nullptr).ok());
    w.owner->Step();
  }
  ASSERT_EQ(w.owner->published_entries(), kLive);
  ASSERT_GT(w.owner->stats().reclaimed, 5000u);
  const DomainHeader& h = w.owner->header();
  CountingMem counting(*w.v1, h.index_offset,
                       h.index_offset + h.index_entries * sizeof(IndexEntry));
  w.h1.reset();
  w.h1 = std::move(*PrefixHost::Join(counting, w.c1, 1));
  for (std::uint32_t k = oldest; k < next; ++k) {
    ASSERT_TRUE(w.h1->Lookup(w.ns, w.Key(k)).has_value()) << "live key " << k << " lost";
  }
  const double hit = static_cast<double>(counting.reads) / kLive;
  counting.reads = 0;
  constexpr std::uint32_t kMisses = 200;
  for (std::uint32_t m = 0; m < kMisses; ++m) {
    EXPECT_FALSE(w.h1->Lookup(w.ns, w.Key(1000000 + m)).has_value());
  }
  const double miss = static_cast<double>(counting.reads) / kMisses;
  EXPECT_LE(miss, 2 * hit) << "a miss read " << miss << " entries on average, a hit " << hit;
}

// Audit #17. Every acquire that finds no recent acknowledgement sends a heartbeat and
// remembers its send time; while the owner is down that list must not grow without bound —
// and when the owner comes back, what it acknowledges must still count.
TEST(PrefixAudit, UnacknowledgedHeartbeatsStayBoundedWhileTheOwnerIsDown) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  const auto hit = w.h1->Lookup(w.ns, w.Key(1));
  ASSERT_TRUE(hit.has_value());
  w.now += 10000;  // the owner is down from here: nothing is acknowledged
  for (int i = 0; i < 100000; ++i) {
    auto l = w.h1->Acquire(*hit);
    ASSERT_TRUE(absl::IsUnavailable(l.status())) << l.status();
  }
  EXPECT_LE(w.h1->unacked_heartbeats(), 64u);
  w.owner->Step();  // back: it acknowledges the latest heartbeat it finds
  ASSERT_TRUE(w.h1->Heartbeat(nullptr).ok());
  auto l = w.h1->Acquire(*hit);
  EXPECT_TRUE(l.ok()) << l.status();
}

// Audit #6. A host whose clock stood still (a VM stop under kvmclock; a suspend on a clock
// that does not count it) while the owner fenced it and reclaimed the block it leased: on
// resume the lease looks valid by its own clock, but Renew must not promise it, and the copy
// check must not accept it.
TEST(PrefixAudit, FrozenHostClockDoesNotKeepALeaseOnAReclaimedBlock) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  w.c1.Freeze();
  while (w.now < 2050) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    if (w.now == 1500) {
      ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
    }
    w.owner->Step();
  }
  ASSERT_EQ(w.owner->stats().hosts_fenced, 1u);
  ASSERT_EQ(w.owner->stats().reclaimed, 1u);
  w.c1.Resume();
  ASSERT_LE(w.c1.NowMs(), lease->deadline_ms) << "by its own clock the lease looks valid";
  const absl::Status renew = w.h1->Renew(*lease);
  EXPECT_FALSE(renew.ok()) << "Renew promised a lease until " << lease->deadline_ms
                           << " on a block reclaimed at owner time 1500+";
  EXPECT_FALSE(w.h1->ValidateAfterCopy(*lease).ok());
  EXPECT_EQ(w.h1->leases_held(), 0u);
}

// Audit #6: the same stop, but the owner only fenced the host (the entry is still published).
// The fenced host's lease rows no longer count, so a renewal must not be promised either.
TEST(PrefixAudit, FrozenHostRenewsNothingAfterItWasFenced) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  w.c1.Freeze();
  while (w.now < 2050) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    w.owner->Step();
  }
  ASSERT_EQ(w.owner->stats().hosts_fenced, 1u);
  w.c1.Resume();
  const absl::Status renew = w.h1->Renew(*lease);
  EXPECT_FALSE(renew.ok()) << "a fenced host renewed its lease";
  EXPECT_EQ(w.h1->leases_held(), 0u);
  EXPECT_TRUE(absl::IsAborted(w.h1->Heartbeat(nullptr))) << "the fence is seen at the heartbeat";
}

// Audit #6: a stop that ends before the owner fences the host. By its own clock the host is
// live (its last acknowledged heartbeat looks recent) and its lease unexpired; renewed now, the
// lease would outlast the fence the owner is about to write and the reclaim after it. The host
// must notice that its clock stood still and drop its leases; after a fresh acknowledgement it
// takes leases again.
TEST(PrefixAudit, PausedHostIsCaughtBeforeTheOwnerFencesIt) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  w.c1.Freeze();
  while (w.now < 900) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    w.owner->Step();
  }
  ASSERT_EQ(w.owner->stats().hosts_fenced, 0u) << "the stop is shorter than host_ttl";
  w.c1.Resume();
  const absl::Status renew = w.h1->Renew(*lease);
  // What the renewal would have led to: the fence, then the reclaim, while the host's clock
  // still shows the lease valid.
  while (w.now < 1200) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    if (w.now == 1100) {
      ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
    }
    w.owner->Step();
  }
  EXPECT_FALSE(renew.ok()) << "renewed after a stop of 800 ms: valid until " << lease->deadline_ms
                           << " on the host's clock (now " << w.c1.NowMs() << "), the owner "
                           << "fenced the host (" << w.owner->stats().hosts_fenced
                           << ") and reclaimed the block (" << w.owner->stats().reclaimed << ")";
  EXPECT_EQ(w.h1->leases_held(), 0u);
  // Back to normal: a heartbeat the owner acknowledges lets the host take leases again.
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(8)).ok());
  for (int i = 0; i < 3; ++i) {
    (void)w.h1->Heartbeat(nullptr);  // kAborted once: fenced meanwhile, rejoined
    w.owner->Step();
    w.now += 10;
  }
  auto again = w.h1->LookupAndAcquire(w.ns, w.Key(2));
  EXPECT_TRUE(again.ok()) << again.status();
}

// Audit #6: a clock that steps back (loses time) is the same hazard as one that stood still.
TEST(PrefixAudit, ClockThatStepsBackIsTakenForAPause) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  while (w.now < 300) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    w.owner->Step();
  }
  w.c1.Jump(-250);
  EXPECT_FALSE(w.h1->Renew(*lease).ok()) << "renewed on a clock that lost 250 ms";
  EXPECT_EQ(w.h1->leases_held(), 0u);
  EXPECT_EQ(w.h1->pauses_detected(), 1u);
}

// Audit #6: a clock that counts the stop (CLOCK_BOOTTIME across a suspend) jumps forward on
// resume; the lease has expired by it and nothing is promised.
TEST(PrefixAudit, ClockThatCountsTheStopExpiresTheLease) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  w.owner->Step();
  w.now = 100;
  auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  w.c1.Freeze();
  while (w.now < 2050) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    if (w.now == 1500) {
      ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
    }
    w.owner->Step();
  }
  w.c1.Resume();
  w.c1.Jump(1950);
  EXPECT_TRUE(absl::IsDeadlineExceeded(w.h1->Renew(*lease)));
  EXPECT_FALSE(w.h1->ValidateAfterCopy(*lease).ok());
  EXPECT_TRUE(absl::IsAborted(w.h1->Heartbeat(nullptr))) << "fenced meanwhile";
  EXPECT_EQ(w.h1->leases_held(), 0u);
}

// Audit #6, the other way round: clocks that differ in offset and rate (within the drift the
// protocol allows), and an owner that stalls and then catches up, are no pause.
TEST(PrefixAudit, SkewedClocksAndAStalledOwnerAreNoPause) {
  for (const double rate : {0.99, 1.01}) {
    World w({2, 16, 4, 4, 400, 1000, 40}, /*host1_offset_ms=*/-50000, rate);
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
    w.owner->Step();
    ASSERT_TRUE(w.h1->Heartbeat(nullptr).ok());
    auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
    ASSERT_TRUE(lease.ok()) << lease.status();
    for (int step = 1; step <= 120; ++step) {
      w.now += 25;
      const bool owner_stalled = step > 40 && step <= 60;  // 500 ms without an owner round
      if (!owner_stalled) w.owner->Step();
      if (step % 4 != 0) continue;
      ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
      ASSERT_TRUE(w.h1->Heartbeat(nullptr).ok()) << "rate " << rate << ", step " << step;
      ASSERT_TRUE(w.h1->Renew(*lease).ok()) << "rate " << rate << ", step " << step;
    }
    EXPECT_EQ(w.h1->pauses_detected(), 0u) << "rate " << rate;
    EXPECT_TRUE(w.h1->ValidateAfterCopy(*lease).ok());
  }
}

// Directed schedules for single-call weakenings the seeded simulation cannot tell apart from
// the correct code (scripts/mutate-protocol, docs/mutation.md): each leaves a stale copy in
// one host's cache, or keeps a write in the writer's, exactly where the call matters.

// FormatDomain's contract: the domain is in memory when it returns. Another host joins with
// nothing else run on the formatting host (an owner's Open would write the header back with
// its own Invalidate and hide a missing Flush).
TEST(PrefixDirected, FormattedDomainIsInMemoryWhenFormatReturns) {
  for (const bool held : {false, true}) {
    ManualClock clock;
    SimMemory media(4 << 20, 21, held ? WriteBacksHeldToTheNextFence() : SimOptions{});
    auto fv = media.NewView(0), hv = media.NewView(0);
    ASSERT_TRUE(FormatDomain(*fv, {4, 64, 4, 4, 1000, 1000, 50}).ok());
    auto h = PrefixHost::Join(*hv, clock, 0);
    EXPECT_TRUE(h.ok()) << "the header is not in memory (write-backs held to the next fence: "
                        << held << "): " << h.status();
  }
}

// A format over a used region, cut by a crash at any point after its header was stored:
// whatever of it reached memory, a valid header never stands over the old tables. The tables
// must be in memory before the header is written, not merely on their way with it.
TEST(PrefixDirected, FormatCutByACrashNeverLeavesAHeaderOverOldTables) {
  struct Crashed {};
  const DomainGeometry g{4, 64, 4, 4, 1000, 1000, 50};
  int headers_landed = 0;
  for (std::uint64_t seed = 1; seed <= 32; ++seed) {
    SimMemory media(4 << 20, seed, WriteBacksHeldToTheNextFence());
    auto old = media.NewView(0), fv = media.NewView(0), check = media.NewView(0);
    ASSERT_TRUE(FormatDomain(*old, g).ok());
    const std::uint64_t end = DomainBytes(g);
    const std::vector<std::byte> junk(end - 4096, std::byte{0xA5});  // the old domain's data
    old->Write(4096, junk.data(), junk.size());
    old->Flush(4096, junk.size());
    old->FullFence();
    bool header_stored = false;
    fv->set_on_store([&] {
      std::uint64_t first = 0;
      fv->Peek(0, &first, sizeof(first));
      header_stored = first != 0;  // the zeroing writes 0 there first; the header does not
    });
    fv->set_on_fence([&] {
      if (header_stored) throw Crashed{};
    });
    try {
      (void)FormatDomain(*fv, g);
    } catch (const Crashed&) {
      fv->Crash();
    }
    fv->set_on_store({});
    fv->set_on_fence({});
    if (!ReadDomainHeader(*check).ok()) continue;  // the header was lost: no domain, fine
    ++headers_landed;
    std::vector<std::byte> tables(end - 4096);
    media.ReadMedia(4096, tables.data(), tables.size());
    const auto left =
        std::find_if(tables.begin(), tables.end(), [](std::byte b) { return b != std::byte{0}; });
    EXPECT_EQ(left, tables.end()) << "a valid header over old table bytes at offset "
                                  << 4096 + (left - tables.begin()) << " (seed " << seed << ")";
  }
  EXPECT_GT(headers_landed, 0) << "no crash landed the header: the test tested nothing";
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
void ChainDoesNotLeaseAnEntryRetiredBetweenLookupAndLease(const SimOptions& options) {
  ManualClock clock;
  SimMemory media(4 << 20, 24, options);
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
  // The owner retires the first key at b's first fence after b stored a lease row: after b's
  // lookup read the entry, before b's re-validation. (`in_memory`: what memory holds; else
  // what b would load, its own stores included.)
  const DomainHeader h = d.owner->header();
  auto b_row_held = [&](bool in_memory) {
    for (std::uint32_t r = 0; r < h.lease_rows; ++r) {
      LeaseRow row;
      const std::uint64_t off =
          h.lease_rows_offset + (std::uint64_t{1} * h.lease_rows + r) * sizeof(row);
      if (in_memory) {
        media.ReadMedia(off, &row, sizeof(row));
      } else {
        bv->Peek(off, &row, sizeof(row));
      }
      if (row.held != 0) return true;
    }
    return false;
  };
  bool retired = false;
  bv->set_on_fence([&] {
    if (!retired && b_row_held(false)) retired = d.owner->RetireKey(ns, keys[0]).ok();
  });
  std::vector<Lease> got;
  auto n = b->AcquireChain(ns, keys, &got);
  bv->set_on_fence({});
  ASSERT_TRUE(retired) << "the schedule must retire the entry between lookup and lease";
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u) << "leased an entry retired before the lease took hold (re-validation read "
                       "its cached copy)";
  EXPECT_EQ(b->leases_held(), 0u);
  EXPECT_FALSE(b_row_held(true)) << "the row of the failed lease is cleared in memory";
  clock.now += 100;  // past grace: nothing holds the retired block
  EXPECT_EQ(d.owner->Reclaim(), 1u);
}

TEST(PrefixDirected, ChainDoesNotLeaseAnEntryRetiredBetweenLookupAndLease) {
  for (const bool held : {false, true}) {
    SCOPED_TRACE(held ? "write-backs held to the next fence" : "write-backs at once");
    ChainDoesNotLeaseAnEntryRetiredBetweenLookupAndLease(held ? WriteBacksHeldToTheNextFence()
                                                              : SimOptions{});
  }
}

// After a pause a host drops its leases (audit #6). The rows it clears must be in memory when
// the call that noticed the pause returns, so that the owner reclaims those blocks at once
// rather than a lease TTL later. Each call that notices a pause: Renew, Acquire (with a lease
// held from before), AcquireChain (with none: its own rows are all it clears).
TEST(PrefixDirected, RowsDroppedAfterAPauseAreInMemoryWhenTheCallReturns) {
  const char* const calls[] = {"Renew", "Acquire", "AcquireChain"};
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(calls[call]);
    // TTLs far longer than the test: a row still held in memory keeps its block.
    World w({2, 16, 4, 4, 4000, 100000, 40}, 0, 1.0, WriteBacksHeldToTheNextFence());
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(8)).ok());
    w.owner->Step();
    w.now += 100;
    auto lease = w.h1->LookupAndAcquire(w.ns, w.Key(1));
    ASSERT_TRUE(lease.ok()) << lease.status();
    if (call == 2) w.h1->Release(*lease);
    const auto hit = w.h1->Lookup(w.ns, w.Key(2));
    ASSERT_TRUE(hit.has_value());
    w.c1.Freeze();  // 800 ms stand still on host 1's clock (tolerance: 500)
    for (int i = 0; i < 16; ++i) {
      w.now += 50;
      ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
      w.owner->Step();
    }
    w.c1.Resume();
    absl::Status st;
    if (call == 0) {
      st = w.h1->Renew(*lease);
    } else if (call == 1) {
      st = w.h1->Acquire(*hit).status();
    } else {
      std::vector<Lease> got;
      const PrefixKey key = w.Key(2);
      st = w.h1->AcquireChain(w.ns, std::span(&key, 1), &got).status();
    }
    ASSERT_FALSE(st.ok()) << "the pause went unnoticed";
    EXPECT_EQ(w.h1->pauses_detected(), 1u) << st;
    EXPECT_EQ(w.h1->leases_held(), 0u);
    ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
    ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(2)).ok());
    w.now += 50;  // past grace
    EXPECT_EQ(w.owner->Reclaim(), 2u) << "a row the host dropped is still held in memory";
  }
}

// AcquireChain judges a pause by the owner's clock line as memory holds it, not by the copy an
// earlier call left in this host's cache (the chain form of
// PausedHostIsCaughtBeforeTheOwnerFencesIt).
TEST(PrefixDirected, ChainNoticesAPauseByTheOwnersCurrentClock) {
  World w({2, 16, 4, 4, 400, 1000, 40});
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(8)).ok());
  w.owner->Step();
  w.now = 100;
  const PrefixKey k1 = w.Key(1), k2 = w.Key(2);
  std::vector<Lease> first;
  auto n = w.h1->AcquireChain(w.ns, std::span(&k1, 1), &first);  // reads the clock line
  ASSERT_TRUE(n.ok() && *n == 1) << n.status();
  w.h1->ReleaseAll(first);
  w.c1.Freeze();
  while (w.now < 900) {
    w.now += 50;
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
    w.owner->Step();
  }
  w.c1.Resume();
  std::vector<Lease> got;
  const auto again = w.h1->AcquireChain(w.ns, std::span(&k2, 1), &got);
  EXPECT_TRUE(absl::IsUnavailable(again.status()))
      << "leased after its clock stood still for 800 ms, judged by a cached clock line: "
      << again.status();
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(w.h1->leases_held(), 0u);
}

// Returns need room in the publisher's return ring. Room is spent only on entries that are
// reclaimed now: retired entries still leased — here more of them than the ring has slots,
// and earlier in the index than the unleased ones — must not use it up and starve the
// publisher's other returns for as long as the leases last.
TEST(PrefixAudit, LongLeasesDoNotStarveThePublishersOtherReturns) {
  // 4 return slots, 8 lease rows, leases far longer than the test.
  World w({2, 32, 8, 4, 100000, 100000, 40});
  std::vector<std::pair<std::uint32_t, std::uint32_t>> by_entry;  // (entry, key)
  for (std::uint32_t k = 1; k <= 8; ++k) {
    ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(k), PrefixKey{}, Ref(k)).ok());
    if (k % 4 == 0) w.Beat();  // 4 request slots
  }
  w.Beat();
  for (std::uint32_t k = 1; k <= 8; ++k) {
    const auto hit = w.h1->Lookup(w.ns, w.Key(k));
    ASSERT_TRUE(hit.has_value()) << "key " << k;
    by_entry.emplace_back(hit->entry, k);
  }
  std::sort(by_entry.begin(), by_entry.end());
  // The 6 entries first in index order are leased; the last 2 are not.
  std::vector<Lease> leases;
  for (std::size_t i = 0; i < 6; ++i) {
    auto l = w.h1->LookupAndAcquire(w.ns, w.Key(by_entry[i].second));
    ASSERT_TRUE(l.ok()) << l.status();
    leases.push_back(*l);
  }
  for (std::uint32_t k = 1; k <= 8; ++k) ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(k)).ok());
  w.now += 50;  // past grace
  EXPECT_EQ(w.owner->Reclaim(), 2u) << "the unleased entries wait behind leased ones";
  std::vector<BlockRef> back;
  ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
  std::set<std::uint32_t> got;
  for (const BlockRef& r : back) got.insert(r.index);
  EXPECT_EQ(got, (std::set<std::uint32_t>{by_entry[6].second, by_entry[7].second}));
  // Released: the rest go back as fast as host 0 takes them, 4 slots at a time.
  w.h1->ReleaseAll(leases);
  for (int round = 0; round < 4 && got.size() < 8; ++round) {
    EXPECT_LE(w.owner->Reclaim(), 2u) << "2 of the ring's 4 slots hold returns not yet taken";
    back.clear();
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());  // takes them; the next beat acknowledges
    for (const BlockRef& r : back) got.insert(r.index);
  }
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(w.owner->retired_entries(), 0u);
}

// ---- chain publish (PrefixHost::PublishChain, issue #21) ------------------------------------

std::vector<PublishItem> ChainItems(const World& w, std::uint32_t first, std::uint32_t n) {
  std::vector<PublishItem> items;
  PrefixKey parent{};
  for (std::uint32_t i = first; i < first + n; ++i) {
    items.push_back(PublishItem{w.Key(i), parent, Ref(i)});
    parent = items.back().key;
  }
  return items;
}

std::uint64_t RequestSlotOff(const World& w, std::uint32_t host, std::uint64_t seq) {
  const DomainHeader& h = w.owner->header();
  return h.request_rings_offset +
         (std::uint64_t{host} * h.ring_slots + (seq - 1) % h.ring_slots) * sizeof(RequestSlot);
}

// One transaction: the owner sees none of the chain until the host row announces it, then all
// of it, and the chain costs the host two fences (the slots', the host row's) whatever its
// length. The slots are in memory when `commit` runs, write-backs held to the next fence: a
// commit that persists the blocks must never make a block outlive the process whose request
// could still be lost.
TEST(PrefixChain, ChainIsOneTransactionInMemoryBeforeCommit) {
  World w({2, 64, 4, 4, 400, 4000, 40}, 0, 1.0, WriteBacksHeldToTheNextFence());
  const std::vector<PublishItem> items = ChainItems(w, 1, 3);
  int fences = 0;
  w.v0->set_on_fence([&] { ++fences; });
  bool committed = false;
  const std::uint64_t tail_before = w.MediaAt<HostRow>(w.HostRowOff(0)).ring_tail;
  ASSERT_TRUE(w.h0->PublishChain(w.ns, items,
                                 [&] {
                                   committed = true;
                                   for (std::uint64_t i = 1; i <= items.size(); ++i) {
                                     const auto slot = w.MediaAt<RequestSlot>(
                                         RequestSlotOff(w, 0, tail_before + i));
                                     EXPECT_TRUE(LineValid(slot) && slot.seq == tail_before + i)
                                         << "request " << i << " of the chain is not in memory "
                                         << "when commit runs";
                                   }
                                   EXPECT_EQ(w.owner->ApplyRequests(), 0u)
                                       << "the owner saw part of the chain before it was "
                                          "announced";
                                   return true;
                                 })
                  .ok());
  w.v0->set_on_fence({});
  EXPECT_TRUE(committed);
  EXPECT_EQ(fences, 2) << "a chain costs the slots' fence and the host row's";
  EXPECT_EQ(w.MediaAt<HostRow>(w.HostRowOff(0)).ring_tail, tail_before + 3);
  EXPECT_EQ(w.owner->ApplyRequests(), 3u);
  for (const PublishItem& it : items) {
    const auto hit = w.h1->Lookup(w.ns, it.key);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->ref, it.ref);
  }
  EXPECT_TRUE(w.h0->PublishChain(w.ns, {}).ok()) << "an empty chain posts nothing";
  EXPECT_EQ(w.h0->RequestsPending(true), 0u);
}

// Ring full mid-chain: a chain that does not fit the ring's free slots writes nothing (not
// even the slots that would fit) and reports kUnavailable; once the owner drains, it goes in
// whole. A chain longer than the ring can never fit: kInvalidArgument.
TEST(PrefixChain, ChainThatDoesNotFitTheRingPostsNothing) {
  World w;  // ring_slots 4
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(1)).ok());
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(2), PrefixKey{}, Ref(2)).ok());
  const std::vector<PublishItem> items = ChainItems(w, 10, 3);
  const RequestSlot slot3 = w.MediaAt<RequestSlot>(RequestSlotOff(w, 0, 3));
  bool committed = false;
  const absl::Status full = w.h0->PublishChain(w.ns, items, [&] { return committed = true; });
  EXPECT_TRUE(absl::IsUnavailable(full)) << full;
  EXPECT_FALSE(committed);
  const RequestSlot after = w.MediaAt<RequestSlot>(RequestSlotOff(w, 0, 3));
  EXPECT_EQ(std::memcmp(&slot3, &after, sizeof(after)), 0) << "a slot was written";
  EXPECT_EQ(w.MediaAt<HostRow>(w.HostRowOff(0)).ring_tail, 2u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(w.h0->WaitForRingRoom(3, 0)));
  EXPECT_EQ(w.owner->ApplyRequests(), 2u);
  EXPECT_TRUE(w.h0->WaitForRingRoom(3, 0).ok());
  ASSERT_TRUE(w.h0->PublishChain(w.ns, items).ok());
  EXPECT_EQ(w.owner->ApplyRequests(), 3u);
  EXPECT_EQ(w.owner->published_entries(), 5u);
  EXPECT_TRUE(absl::IsInvalidArgument(w.h0->PublishChain(w.ns, ChainItems(w, 20, 5))));
  EXPECT_TRUE(absl::IsInvalidArgument(w.h0->WaitForRingRoom(5, 0)));
}

// A stale incarnation's chain: announced, then the publisher restarts before the owner applies
// it. The owner publishes none of it and hands every block back, once.
TEST(PrefixChain, StaleIncarnationsChainIsReturnedWhole) {
  World w;
  const std::vector<PublishItem> items = ChainItems(w, 1, 3);
  ASSERT_TRUE(w.h0->PublishChain(w.ns, items).ok());
  w.h0.reset();
  w.v0->Crash();
  w.h0 = std::move(*PrefixHost::Join(*w.v0, w.c0, 0));
  std::vector<BlockRef> back;
  for (int i = 0; i < 3; ++i) {
    w.owner->Step();
    w.now += 10;
    ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
  }
  EXPECT_EQ(w.owner->published_entries(), 0u);
  std::set<std::uint32_t> got;
  for (const BlockRef& r : back) EXPECT_TRUE(got.insert(r.index).second) << "returned twice";
  EXPECT_EQ(got, (std::set<std::uint32_t>{1, 2, 3}));
}

// A crash at every store of a chain publish (and inside its commit): after the publisher
// restarts and the owner runs, nothing is published for the dead incarnation, no block comes
// back twice, and every block whose commit ran (made to outlive the process) comes back.
TEST(PrefixChain, CrashAtAnyStoreOfAChainLeaksNothing) {
  struct Died {};
  for (int crash_at = 1; crash_at <= 12; ++crash_at) {
    for (bool in_commit : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "crash at store " << crash_at << (in_commit ? " in commit" : ""));
      World w;
      const std::vector<PublishItem> items = ChainItems(w, 1, 3);
      int stores = 0;
      bool committed = false;
      if (!in_commit) {
        w.v0->set_on_store([&] {
          if (++stores == crash_at) throw Died{};
        });
      }
      bool died = false;
      try {
        (void)w.h0->PublishChain(w.ns, items, [&] {
          committed = true;
          if (in_commit) throw Died{};
          return true;
        });
      } catch (const Died&) {
        died = true;
      }
      w.v0->set_on_store({});
      if (!died) continue;  // fewer stores than crash_at
      w.h0.reset();
      w.v0->Crash();
      w.h0 = std::move(*PrefixHost::Join(*w.v0, w.c0, 0));
      std::vector<BlockRef> back;
      for (int i = 0; i < 4; ++i) {
        w.owner->Step();
        w.now += 10;
        ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
      }
      EXPECT_EQ(w.owner->published_entries(), 0u) << "a dead incarnation's chain was published";
      std::set<std::uint32_t> got;
      for (const BlockRef& r : back) EXPECT_TRUE(got.insert(r.index).second) << "returned twice";
      if (committed) {
        EXPECT_EQ(got, (std::set<std::uint32_t>{1, 2, 3}))
            << "a committed block of the chain leaked";
      }
      // The host id works on: a new chain goes in whole.
      ASSERT_TRUE(w.h0->PublishChain(w.ns, ChainItems(w, 10, 3)).ok());
      w.owner->ApplyRequests();
      EXPECT_EQ(w.owner->published_entries(), 3u);
    }
  }
}

// The owner applies a chain in one batch: its entries are stored and flushed, fenced once, and
// then the owner line says the requests were consumed. An owner that dies at any store of that
// batch, with write-backs held until the fence (so whatever was not fenced may be lost while a
// later line lands), must leave each block of the chain published or its request pending for
// the next owner: never consumed without an entry (the block would leak).
TEST(PrefixChain, OwnerCrashAtAnyStoreOfAnAppliedChainLosesNoBlock) {
  struct Died {};
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    for (int crash_at = 1; crash_at <= 5; ++crash_at) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << ", owner dies at store " << crash_at);
      SimOptions o = WriteBacksHeldToTheNextFence();
      World w({2, 64, 4, 4, 400, 4000, 40}, 0, 1.0, o, seed);
      const std::vector<PublishItem> items = ChainItems(w, 1, 3);
      ASSERT_TRUE(w.h0->PublishChain(w.ns, items).ok());
      int stores = 0;
      w.ov->set_on_store([&] {
        if (++stores == crash_at) throw Died{};
      });
      bool died = false;
      try {
        w.owner->ApplyRequests();
      } catch (const Died&) {
        died = true;
      }
      w.ov->set_on_store({});
      if (!died) continue;
      w.owner.reset();
      w.ov->Crash();
      w.owner = std::move(*PrefixOwner::Open(*w.ov, w.oc));
      std::vector<BlockRef> back;
      for (int i = 0; i < 3; ++i) {
        w.owner->Step();
        w.now += 10;
        ASSERT_TRUE(w.h0->Heartbeat(&back).ok());
      }
      for (const PublishItem& it : items) {
        const auto hit = w.h1->Lookup(w.ns, it.key);
        EXPECT_TRUE(hit.has_value() && hit->ref == it.ref)
            << "block " << it.ref.index << " is neither published nor pending: it leaked";
      }
      EXPECT_TRUE(back.empty());
    }
  }
}

// ---- the owner's private memory (issue #21) -------------------------------------------------

// RssAnon of this process in KiB (private memory: a memfd mapping counts as RssShmem).
std::int64_t RssAnonKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The owner keeps no copy of the index and no node per named block: what it holds privately
// per index entry is a few bytes, whatever the load. Opened on a 2^20-entry domain 60 %
// published (written straight into the index, as a previous owner would have left it), its
// private memory grows by under 40 B an entry; the layout before issue #21 (a 64 B copy of
// every entry, 24 B of EntryInfo and a hash-set node per named block) took about 120.
TEST(PrefixOwnerMemory, PrivateMemoryPerEntryIsBoundedWhateverTheLoad) {
  if (kSanitized) GTEST_SKIP() << "sanitizer shadow memory counts as private memory";
  DomainGeometry g{4, 1u << 20, 4, 4, 400, 4000, 40};
  auto region =
      pool::OpenRegion("memfd:?size=" + std::to_string((DomainBytes(g) + 4095) / 4096 * 4096));
  ASSERT_TRUE(region.ok()) << region.status();
  DirectMem mem((*region)->addr(), (*region)->size_bytes());
  ASSERT_TRUE(FormatDomain(mem, g).ok());
  auto header = ReadDomainHeader(mem);
  ASSERT_TRUE(header.ok()) << header.status();
  const std::uint32_t n = header->index_entries;
  const std::uint32_t published = n / 10 * 6;
  for (std::uint32_t i = 0; i < published; ++i) {
    IndexEntry e{};
    e.key[0] = 0x9E3779B97F4A7C15ull * (i + 1);
    e.key[1] = i + 1;
    e.ns = 1;
    e.ref = Ref(i);
    e.ref.arena[1] = static_cast<std::uint8_t>(i % 64);
    e.entry_gen = 1;
    e.state = static_cast<std::uint8_t>(EntryState::kPublished);
    e.publisher = static_cast<std::uint8_t>(i % 4);
    SealLine(e);
    mem.Write(header->index_offset + std::uint64_t{i} * sizeof(IndexEntry), &e, sizeof(e));
  }
  ManualClock clock;
  const std::int64_t before_kib = RssAnonKib();
  ASSERT_GE(before_kib, 0) << "no RssAnon in /proc/self/status";
  auto owner = PrefixOwner::Open(mem, clock);
  ASSERT_TRUE(owner.ok()) << owner.status();
  const std::int64_t grown_kib = RssAnonKib() - before_kib;
  EXPECT_EQ((*owner)->published_entries(), published);
  EXPECT_EQ((*owner)->stats().quarantined, 0u);
  const double per_entry = static_cast<double>(grown_kib) * 1024.0 / n;
  EXPECT_LT(per_entry, 40.0) << "the owner's private memory grew by " << grown_kib
                             << " KiB opening " << n << " entries (" << published << " published)";
  EXPECT_LE((*owner)->bookkeeping_bytes(), PrefixOwner::kBookkeepingBytesPerEntry * n);
  // Entries read back from the shared index carry what the owner decides on.
  const IndexEntry e = (*owner)->entry(published - 1);
  EXPECT_EQ(e.state, static_cast<std::uint8_t>(EntryState::kPublished));
  EXPECT_EQ(e.ref.index, published - 1);
  EXPECT_EQ((*owner)->entry_state(published), EntryState::kEmpty);
}

// The set of named blocks (a block may be named by one entry only) is an open-addressing
// table of entry numbers: with 40 of 64 entries named in 128 slots its runs collide, and
// freeing entries must leave every other named block still found. A deletion that only
// cleared its slot would lose blocks behind it, and a second publish of one would be taken.
// Fail-over to a machine whose cache holds old index lines (a standby that had read the index,
// or hosts' lookups on that machine): Open must read every line from memory — the chunk
// evicted, one full fence, then the loads — never this machine's cached copy. Here the index is
// cached clean on the new owner's machine, then the old owner retires the entry: a new owner
// that trusted its cache would find it still published and hand out its block again.
TEST(PrefixOwnerMemory, OpenReadsTheIndexFromMemoryNotFromThisMachinesCache) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(1), PrefixKey{}, Ref(7)).ok());
  ASSERT_EQ(w.owner->ApplyRequests(), 1u);
  const DomainHeader h = w.owner->header();
  const std::size_t bytes = std::size_t{h.index_entries} * sizeof(IndexEntry);
  auto standby = w.media.NewView(0);
  std::vector<IndexEntry> cached(h.index_entries);
  standby->Invalidate(h.index_offset, bytes);
  standby->Read(h.index_offset, cached.data(), bytes);
  ASSERT_EQ(std::count_if(cached.begin(), cached.end(),
                          [](const IndexEntry& e) {
                            return e.state == static_cast<std::uint8_t>(EntryState::kPublished);
                          }),
            1);
  ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(1)).ok());
  w.media.Settle();
  w.owner.reset();
  auto o = PrefixOwner::Open(*standby, w.oc);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ((*o)->published_entries(), 0u) << "the new owner read a stale cached index line";
  EXPECT_EQ((*o)->retired_entries(), 1u);
}

TEST(PrefixOwnerMemory, NamedBlocksStayExactThroughReclaims) {
  World w({2, 64, 4, 4, 400, 4000, 40});
  auto publish = [&](std::uint32_t key, std::uint32_t ref) {
    const absl::Status st = w.h0->Publish(w.ns, w.Key(key), PrefixKey{}, Ref(ref));
    ASSERT_TRUE(st.ok()) << st;
    w.owner->ApplyRequests();  // the ring holds 4 requests: one at a time
    ASSERT_TRUE(w.h0->Heartbeat(nullptr).ok());
  };
  PrefixOwner::ArenaId seven{};
  seven[0] = 7;
  for (std::uint32_t r = 0; r < 40; ++r) publish(r, r);
  ASSERT_EQ(w.owner->stats().published, 40u);
  ASSERT_EQ(w.owner->EntriesNaming(seven), 40u);
  for (std::uint32_t r = 0; r < 40; ++r) publish(100 + r, r);  // every block already named
  EXPECT_EQ(w.owner->stats().published, 40u);
  EXPECT_EQ(w.owner->stats().rejected, 40u);
  for (std::uint32_t r = 0; r < 40; r += 2) ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(r)).ok());
  EXPECT_EQ(w.owner->EntriesNaming(seven), 40u) << "retired entries still name their blocks";
  std::set<std::uint32_t> back;
  for (int round = 0; round < 20 && back.size() < 20; ++round) {
    w.now += 50;
    w.Beat();
    std::vector<BlockRef> got;
    ASSERT_TRUE(w.h0->Heartbeat(&got).ok());
    for (const BlockRef& b : got) back.insert(b.index);
  }
  ASSERT_EQ(back.size(), 20u);
  EXPECT_EQ(w.owner->EntriesNaming(seven), 20u);
  for (std::uint32_t r = 0; r < 40; ++r) publish(200 + r, r);
  EXPECT_EQ(w.owner->stats().published, 60u) << "each freed block is accepted once more";
  EXPECT_EQ(w.owner->stats().rejected, 60u) << "a block still named is refused";
  EXPECT_EQ(w.owner->EntriesNaming(seven), 40u);
  for (std::uint32_t r = 0; r < 40; ++r) {
    EXPECT_EQ(w.h1->Lookup(w.ns, w.Key(200 + r)).has_value(), r % 2 == 0) << "block " << r;
  }
}

// ---- entries of the owner's own: region objects (PublishOwn, docs/lmcache.md) ---------------

RegionObject Obj(std::uint64_t offset, std::uint64_t generation) {
  return RegionObject{offset, 4096 + offset % 7, generation, 0xC0FFEEu};
}

TEST(PrefixOwn, RegionRefRoundTripsAndNoArenaIdReadsAsOne) {
  const RegionObject o{(std::uint64_t{1} << 48) - 64, 0xFFFFFFFFull, ~0ull, 77};
  const auto ref = RegionRef(o);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(AsRegionObject(*ref), o);
  EXPECT_EQ(AsRegionObject(*RegionRef(Obj(0, 1))), Obj(0, 1));
  EXPECT_FALSE(RegionRef(RegionObject{std::uint64_t{1} << 48, 1, 1, 0}).ok()) << "offset";
  EXPECT_FALSE(RegionRef(RegionObject{0, 0, 1, 0}).ok()) << "length 0";
  EXPECT_FALSE(RegionRef(RegionObject{0, std::uint64_t{1} << 32, 1, 0}).ok()) << "length";
  EXPECT_FALSE(RegionRef(RegionObject{0, 1, 0, 0}).ok()) << "generation 0";
  // An arena block's ref: the arena id is a version-4 UUID (0x4? in byte 6).
  BlockRef block = Ref(9);
  for (unsigned v = 0; v < 256; ++v) {
    block.arena[6] = static_cast<std::uint8_t>(0x40 | (v & 0x0F));
    block.arena[7] = static_cast<std::uint8_t>(v);
    EXPECT_FALSE(AsRegionObject(block).has_value()) << v;
  }
}

// The owner publishes a region object; a host finds and leases it like any block; the owner's
// process retires it, and the ref comes back to that process (never to a host's ring) only
// once no lease names it: then, and only then, may the range be granted again.
TEST(PrefixOwn, OwnEntryIsLeasedByHostsAndComesBackOnlyAfterItsLeases) {
  World w;
  const PrefixKey k = w.Key(1);
  const BlockRef ref = *RegionRef(Obj(2 << 20, 41));
  ASSERT_TRUE(w.owner->PublishOwn(w.ns, k, ref).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(w.owner->PublishOwn(w.ns, k, *RegionRef(Obj(4 << 20, 42)))));
  EXPECT_TRUE(absl::IsInvalidArgument(w.owner->PublishOwn(w.ns, w.Key(2), ref)))
      << "a ref named twice";
  EXPECT_TRUE(absl::IsInvalidArgument(w.owner->PublishOwn(w.ns, w.Key(3), Ref(3))))
      << "an arena block is published by its host, not by the owner";
  std::vector<Lease> leases;
  const PrefixKey keys[] = {k};
  auto n = w.h1->AcquireChain(w.ns, keys, &leases);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(AsRegionObject(leases[0].ref), Obj(2 << 20, 41));
  EXPECT_EQ(w.h1->Lookup(w.ns, k)->publisher, kOwnerPublisher);

  ASSERT_TRUE(w.owner->RetireKey(w.ns, k).ok());
  for (int round = 0; round < 4; ++round) {  // past the grace, the lease still held
    w.now += 30;
    ASSERT_TRUE(w.h1->Renew(leases[0]).ok());
    w.Beat();
  }
  EXPECT_TRUE(w.owner->TakeReclaimedOwn().empty()) << "leased: the range stays the index's";
  EXPECT_FALSE(w.h1->ValidateAfterCopy(leases[0]).ok()) << "a copy after the retire is refused";
  w.h1->Release(leases[0]);
  w.now += 30;
  w.Beat();
  const auto back = w.owner->TakeReclaimedOwn();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0], ref);
  EXPECT_TRUE(w.owner->TakeReclaimedOwn().empty()) << "handed back once";
  EXPECT_EQ(w.owner->stats().own_reclaimed, 1u);
  std::vector<BlockRef> returned;
  ASSERT_TRUE(w.h0->Heartbeat(&returned).ok());
  ASSERT_TRUE(w.h1->Heartbeat(&returned).ok());
  EXPECT_TRUE(returned.empty()) << "no host is handed the owner's range";
  // The range is free: the same offset, a new generation, published again.
  ASSERT_TRUE(w.owner->PublishOwn(w.ns, k, *RegionRef(Obj(2 << 20, 43))).ok());
  EXPECT_EQ(AsRegionObject(w.h0->Lookup(w.ns, k)->ref)->generation, 43u);
}

// A region ref in a host's request would let readers take a range of the owner's region for
// that host's object: refused, and the key stays absent.
TEST(PrefixOwn, AHostCannotPublishARegionRef) {
  World w;
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(5), PrefixKey{}, *RegionRef(Obj(0, 9))).ok());
  const std::uint64_t rejected = w.owner->stats().rejected;
  w.Beat();
  EXPECT_EQ(w.owner->stats().rejected, rejected + 1);
  EXPECT_FALSE(w.h1->Lookup(w.ns, w.Key(5)).has_value());
}

// A restarted owner's process reconciles its objects with what the index holds: OwnEntries
// lists the published and the retired own entries; the retired one still comes back after
// its grace, through the new owner.
TEST(PrefixOwn, ARestartedOwnerListsItsEntriesAndStillHandsBackTheRetired) {
  World w;
  ASSERT_TRUE(w.owner->PublishOwn(w.ns, w.Key(1), *RegionRef(Obj(0, 1))).ok());
  ASSERT_TRUE(w.owner->PublishOwn(w.ns, w.Key(2), *RegionRef(Obj(8192, 2))).ok());
  ASSERT_TRUE(w.h0->Publish(w.ns, w.Key(3), PrefixKey{}, Ref(3)).ok());
  w.Beat();
  ASSERT_TRUE(w.owner->RetireKey(w.ns, w.Key(2)).ok());
  w.owner = std::move(*PrefixOwner::Open(*w.ov, w.oc));
  auto own = w.owner->OwnEntries();
  std::sort(own.begin(), own.end(),
            [](const auto& a, const auto& b) { return a.ref.index < b.ref.index; });
  ASSERT_EQ(own.size(), 2u) << "the host's block is not the owner's";
  EXPECT_EQ(AsRegionObject(own[0].ref), Obj(0, 1));
  EXPECT_TRUE(own[0].published);
  EXPECT_EQ(AsRegionObject(own[1].ref), Obj(8192, 2));
  EXPECT_FALSE(own[1].published);
  EXPECT_EQ(own[1].key, w.Key(2));
  for (int round = 0; round < 4; ++round) {
    w.now += 30;
    w.Beat();
  }
  const auto back = w.owner->TakeReclaimedOwn();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(AsRegionObject(back[0]), Obj(8192, 2));
  EXPECT_EQ(w.owner->EntriesNaming(PrefixOwner::ArenaId{7}), 1u)
      << "own entries are counted under no arena; the host's block is";
}

TEST(PrefixOwn, ADomainOf255HostsHasNoIdForTheOwner) {
  SimMemory media(DomainBytes({255, 16, 1, 1, 400, 4000, 40}), 1);
  auto view = media.NewView(0);
  ASSERT_TRUE(FormatDomain(*view, {255, 16, 1, 1, 400, 4000, 40}).ok());
  ManualClock clock;
  auto owner = std::move(*PrefixOwner::Open(*view, clock));
  const auto st =
      owner->PublishOwn(MakeNamespace("t", "m", "l"), PrefixKey{1, 2}, *RegionRef(Obj(0, 1)));
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("max_hosts 254"), std::string::npos) << st;
}
}  // namespace
}  // namespace cxlkv::coherence
