// coherence/prefix.h: keys, namespaces, and the host/owner flows on a real mapping and on
// the simulator, step by step.
#include <cstring>
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

}  // namespace
}  // namespace cxlkv::coherence
