// Busy hosts (issue #39, docs/coherence.md "Busy hosts"): a host that is descheduled, stopped
// or slow in the middle of reading a shared block keeps reading it. The host's clock is a
// manual one the test moves; a copy that "takes" time moves it from inside the read (the
// seam: a block memory whose reads advance the clock), so each schedule is exact, not timing
// luck. Where a host waits for an acknowledgement, the owner steps in a process of its own,
// as it does in the orchestrator.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cxlkv/coherence/prefix.h"
#include "gtest/gtest.h"

namespace cxlkv::coherence {
namespace {

// A clock the test moves, shared with the owner's process (it lives in the shared mapping).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(std::atomic<std::int64_t>* now) : now_(now) {}
  std::int64_t NowMs() override { return now_->load(); }
  void Advance(std::int64_t ms) { now_->fetch_add(ms); }

 private:
  std::atomic<std::int64_t>* now_;
};

// Block memory whose next `slow_reads` Reads each take `ms_per_read` on the host's clock. It
// also counts reads of bytes not invalidated since they were last read (`unfetched_reads`):
// another host wrote the block, so every read must follow an Invalidate of its range.
class SlowMem final : public Mem {
 public:
  SlowMem(std::byte* base, std::uint64_t size, ManualClock& clock)
      : mem_(base, size), clock_(clock) {}
  std::uint64_t size_bytes() const override { return mem_.size_bytes(); }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override {
    ++reads;
    if (offset < fresh_from_ || offset + len > fresh_to_) ++unfetched_reads;
    fresh_from_ = fresh_to_ = 0;
    if (slow_reads > 0) {
      --slow_reads;
      clock_.Advance(ms_per_read);
    }
    mem_.Read(offset, dst, len);
  }
  void Write(std::uint64_t o, const void* s, std::size_t n) override { mem_.Write(o, s, n); }
  void WriteNt(std::uint64_t o, const void* s, std::size_t n) override { mem_.WriteNt(o, s, n); }
  void Flush(std::uint64_t o, std::size_t n) override { mem_.Flush(o, n); }
  void Invalidate(std::uint64_t o, std::size_t n) override {
    fresh_from_ = o;
    fresh_to_ = o + n;
    mem_.Invalidate(o, n);
  }
  void Evict(std::uint64_t o, std::size_t n) override { mem_.Evict(o, n); }
  void Fence() override { mem_.Fence(); }
  void FullFence() override { mem_.FullFence(); }

  int slow_reads = 0;
  std::int64_t ms_per_read = 0;
  int reads = 0;
  int unfetched_reads = 0;

 private:
  std::uint64_t fresh_from_ = 0, fresh_to_ = 0;  // the range the last Invalidate dropped
  DirectMem mem_;
  ManualClock& clock_;
};

constexpr std::size_t kBlock = 64 << 10;
// lease_ttl 1000 ms, margin 250: a fresh lease lasts 750 ms; host_ttl 1000; grace 20.
const DomainGeometry kGeometry{4, 64, 8, 8, 1000, 1000, 20};

// What the reader's process shares with the owner's: the clock, a stop flag, the region.
struct Shared {
  std::atomic<std::int64_t> now{1000};
  std::atomic<bool> stop{false};
  alignas(64) std::byte region[1];  // DomainBytes(kGeometry) of them (the mapping is larger)
};

// Owner, publisher (host 0) and reader (host 1) on one region, all on one manual clock.
// StartOwner forks the owner into a process of its own that steps every 200 us, as the
// orchestrator's owner loop does, while this process is the reader (processes, as on real
// hosts: the region is shared memory, not memory of one process's threads).
struct Bed {
  explicit Bed(std::uint32_t ack_wait_ms)
      : map_bytes(sizeof(Shared) + DomainBytes(kGeometry)),
        shared(Map(map_bytes)),
        clock(&shared->now),
        blocks(kBlock),
        mem(shared->region, DomainBytes(kGeometry)),
        block_mem(blocks.data(), kBlock, clock) {
    EXPECT_TRUE(FormatDomain(mem, kGeometry).ok());
    owner = std::move(*PrefixOwner::Open(mem, clock));
    PrefixHost::Options o;
    o.ack_wait_ms = ack_wait_ms;
    publisher = std::move(*PrefixHost::Join(mem, clock, 0, o));
    reader = std::move(*PrefixHost::Join(mem, clock, 1, o));
    for (std::size_t i = 0; i < kBlock; ++i) blocks[i] = std::byte(i * 7 + 3);
    BlockRef ref{};
    ref.arena[0] = 9;
    ref.index = 4;
    ref.generation = 1;
    EXPECT_TRUE(publisher->Publish(ns, key, PrefixKey{}, ref).ok());
    owner->Step();
    EXPECT_TRUE(publisher->Heartbeat(nullptr).ok());
    EXPECT_TRUE(reader->Heartbeat(nullptr).ok());
    owner->Step();  // acknowledges both
    EXPECT_TRUE(reader->Heartbeat(nullptr).ok());
  }
  ~Bed() {
    StopOwner();
    ::munmap(shared, map_bytes);
  }
  static Shared* Map(std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return new (p) Shared();
  }
  // From here on the owner steps in its own process; this one must not use `owner` again.
  void StartOwner() {
    owner_pid = ::fork();
    ASSERT_GE(owner_pid, 0);
    if (owner_pid == 0) {
      while (!shared->stop.load()) {
        owner->Step();
        ::usleep(200);
      }
      ::_exit(0);
    }
  }
  void StopOwner() {
    if (owner_pid <= 0) return;
    shared->stop.store(true);
    ::waitpid(owner_pid, nullptr, 0);
    owner_pid = -1;
  }
  Lease LeaseIt() {
    std::vector<Lease> got;
    auto n = reader->AcquireChain(ns, std::span(&key, 1), &got);
    EXPECT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(n.ok() ? *n : 0u, 1u);
    return got.empty() ? Lease{} : got[0];
  }
  bool CopyIsTheBlock(const std::vector<std::byte>& got) const {
    return std::memcmp(got.data(), blocks.data(), kBlock) == 0;
  }

  const Namespace ns = MakeNamespace("t", "m", "l");
  const std::uint32_t token = 5;
  const PrefixKey key = ChainKey(ns, PrefixKey{}, std::span(&token, 1));
  std::size_t map_bytes;
  Shared* shared;
  ManualClock clock;
  std::vector<std::byte> blocks;
  DirectMem mem;
  SlowMem block_mem;
  std::unique_ptr<PrefixOwner> owner;
  std::unique_ptr<PrefixHost> publisher, reader;
  pid_t owner_pid = -1;
};

// The cause of #39 in one schedule: the host is descheduled for longer than the lease during
// the copy. CopyOut discards the copy (correctly: the lease expired), and the block is lost
// to the request. ReadLeased takes the lease again on the same entry and generation and
// copies again: the request gets the block, and no copy made past a deadline counts.
TEST(BusyHost, ALeaseThatExpiresDuringTheCopyIsTakenAgainAndTheCopyRetried) {
  Bed b(/*ack_wait_ms=*/2000);
  b.StartOwner();
  std::vector<std::byte> got(kBlock);
  {
    Lease l = b.LeaseIt();
    b.block_mem.slow_reads = 1;
    b.block_mem.ms_per_read = 800;  // past the lease's 750 ms
    EXPECT_TRUE(absl::IsDeadlineExceeded(b.reader->CopyOut(l, b.block_mem, 0, got.data(), kBlock)))
        << "the lease expired during the copy: CopyOut must discard it";
    b.reader->Release(l);
  }
  Lease l = b.LeaseIt();
  b.block_mem.slow_reads = 1;
  b.block_mem.reads = 0;
  const absl::Status st = b.reader->ReadLeased(l, b.block_mem, 0, got.data(), kBlock);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(b.CopyIsTheBlock(got));
  EXPECT_EQ(b.block_mem.reads, 2) << "the copy made past the deadline was made again";
  EXPECT_EQ(b.block_mem.unfetched_reads, 0) << "each copy invalidates the range it reads";
  const PrefixHost::Stats s = b.reader->stats();
  EXPECT_EQ(s.copies_retried, 1u);
  EXPECT_EQ(s.leases_retaken, 1u);
  EXPECT_GE(s.copies_discarded, 1u) << "CopyOut's discard above is counted";
  EXPECT_GE(l.deadline_ms, b.clock.NowMs()) << "the lease returned is the live one";
  b.reader->Release(l);
  EXPECT_EQ(b.reader->leases_held(), 0u);
}

// A lease with less time left than a copy takes at the slowest rate this host measured is
// renewed before the copy, so the copy counts the first time.
TEST(BusyHost, ALeaseShortOfTheCopyIsRenewedBeforeIt) {
  Bed b(/*ack_wait_ms=*/2000);
  b.StartOwner();
  std::vector<std::byte> got(kBlock);
  // One slow copy (300 ms for 64 KiB) teaches the host its slowest rate.
  Lease first = b.LeaseIt();
  b.block_mem.slow_reads = 1;
  b.block_mem.ms_per_read = 300;
  ASSERT_TRUE(b.reader->ReadLeased(first, b.block_mem, 0, got.data(), kBlock).ok());
  b.reader->Release(first);
  // A lease with 250 ms left, and a copy that takes 300 ms again.
  Lease l = b.LeaseIt();
  b.clock.Advance(l.deadline_ms - b.clock.NowMs() - 250);
  ASSERT_TRUE(b.reader->Heartbeat(nullptr).ok());  // the host runs, so it beats
  b.block_mem.slow_reads = 1;
  b.block_mem.reads = 0;
  const std::uint64_t renewed = b.reader->stats().leases_renewed_for_copy;
  const absl::Status st = b.reader->ReadLeased(l, b.block_mem, 0, got.data(), kBlock);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(b.CopyIsTheBlock(got));
  EXPECT_EQ(b.block_mem.reads, 1) << "renewed first: one copy sufficed";
  EXPECT_EQ(b.block_mem.unfetched_reads, 0);
  EXPECT_EQ(b.reader->stats().leases_renewed_for_copy, renewed + 1);
  EXPECT_EQ(b.reader->stats().copies_retried, 0u);
  b.reader->Release(l);
}

// A block retired while it is read is a miss, not something to retry: ReadLeased stops.
TEST(BusyHost, ABlockRetiredDuringTheReadIsAMissNotARetry) {
  Bed b(/*ack_wait_ms=*/0);
  std::vector<std::byte> got(kBlock);
  Lease l = b.LeaseIt();
  ASSERT_TRUE(b.publisher->Retire(b.ns, b.key).ok());
  b.owner->Step();  // RETIRED(g+1): the lease still keeps the block, but the copy must not count
  const absl::Status st = b.reader->ReadLeased(l, b.block_mem, 0, got.data(), kBlock);
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  EXPECT_EQ(b.block_mem.reads, 1);
  EXPECT_EQ(b.reader->stats().copies_retried, 0u);
  EXPECT_EQ(b.reader->stats().copies_discarded, 1u);
  b.reader->Release(l);
}

// A host stopped longer than host_ttl is fenced. When it runs again its next acquire learns
// it (kAborted: its leases are gone) and the one after leases again at once, waiting for the
// owner's acknowledgement of its new incarnation instead of failing until a later heartbeat.
TEST(BusyHost, AStoppedHostLeasesAgainOnTheAcquireAfterItLearnsItWasFenced) {
  Bed b(/*ack_wait_ms=*/2000);
  Lease held = b.LeaseIt();
  // Stopped 1.5 s: the owner (on the same clock) sees no beat for host_ttl and fences it.
  b.owner->Step();  // it has seen the reader's last beat
  b.clock.Advance(1500);
  b.owner->Step();
  ASSERT_EQ(b.owner->stats().hosts_fenced, 2u) << "both hosts stopped beating";
  b.StartOwner();
  std::vector<Lease> got;
  auto n = b.reader->AcquireChain(b.ns, std::span(&b.key, 1), &got);
  EXPECT_TRUE(absl::IsAborted(n.status())) << n.status();
  EXPECT_FALSE(b.reader->ValidateAfterCopy(held).ok()) << "the fenced incarnation's lease is void";
  n = b.reader->AcquireChain(b.ns, std::span(&b.key, 1), &got);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(b.reader->stats().rejoins_after_fence, 1u);
  b.reader->ReleaseAll(got);
}

// Without the wait (ack_wait_ms 0, the simulator's setting) the same acquire fails until a
// later heartbeat is acknowledged: the behaviour the wait replaces on real hosts.
TEST(BusyHost, WithoutTheAckWaitTheAcquireAfterAFenceFails) {
  Bed b(/*ack_wait_ms=*/0);
  b.owner->Step();
  b.clock.Advance(1500);
  b.owner->Step();
  std::vector<Lease> got;
  EXPECT_TRUE(absl::IsAborted(b.reader->AcquireChain(b.ns, std::span(&b.key, 1), &got).status()));
  auto n = b.reader->AcquireChain(b.ns, std::span(&b.key, 1), &got);
  EXPECT_TRUE(absl::IsUnavailable(n.status())) << n.status();
  EXPECT_EQ(b.reader->stats().leases_refused_late, 1u);
}

}  // namespace
}  // namespace cxlkv::coherence
