// The non-coherence simulator's failure classes, each on its own (coherence/sim.h): x86 store
// buffers, asynchronous and torn write-backs, late write-back after a crash, and clocks that
// freeze, jump and drift. Each test shows the behaviour the class adds and that it is off by
// default.
#include "cxlkv/coherence/sim.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace cxlkv::coherence {
namespace {

std::uint64_t Load(SimMemory::HostView& v, std::uint64_t off) {
  std::uint64_t x = 0;
  v.Read(off, &x, sizeof(x));
  return x;
}
std::uint64_t Media(const SimMemory& m, std::uint64_t off) {
  std::uint64_t x = 0;
  m.ReadMedia(off, &x, sizeof(x));
  return x;
}
void Store(SimMemory::HostView& v, std::uint64_t off, std::uint64_t x) {
  v.Write(off, &x, sizeof(x));
}

// The store-buffering litmus test: each host stores its flag, writes it back, fences, then
// loads the other's flag (a line it never cached). Returns what the two loads saw.
std::pair<std::uint64_t, std::uint64_t> Litmus(const SimOptions& o, bool full_fence) {
  SimMemory m(4096, 1, o);
  auto a = m.NewView(0), b = m.NewView(0);
  Store(*a, 0, 1);
  a->Flush(0, 8);
  Store(*b, 64, 1);
  b->Flush(64, 8);
  if (full_fence) {
    a->FullFence();
    b->FullFence();
  } else {
    a->Fence();
    b->Fence();
  }
  return {Load(*a, 64), Load(*b, 0)};
}

TEST(SimMemory, StoreBufferLetsALoadPassAnEarlierStoreUntilAFullFence) {
  SimOptions sb;
  sb.store_buffer = true;
  sb.store_drain_per_mille = 0;  // nothing drains on its own: the widest window
  // sfence: both loads run before either store is visible (forbidden under mfence).
  EXPECT_EQ(Litmus(sb, false), std::make_pair(std::uint64_t{0}, std::uint64_t{0}));
  // mfence: at least one host sees the other's flag (here both do).
  EXPECT_EQ(Litmus(sb, true), std::make_pair(std::uint64_t{1}, std::uint64_t{1}));
  // An "mfence" that is only an sfence (fault injection) is caught the same way...
  SimOptions weak = sb;
  weak.fault_full_fence_is_sfence = true;
  EXPECT_EQ(Litmus(weak, true), std::make_pair(std::uint64_t{0}, std::uint64_t{0}));
  // ...and without a store buffer the simulator cannot tell the two fences apart.
  SimOptions none;
  none.fault_full_fence_is_sfence = true;
  EXPECT_EQ(Litmus(none, false), std::make_pair(std::uint64_t{1}, std::uint64_t{1}));
}

TEST(SimMemory, StoreBufferForwardsToTheHostsOwnLoads) {
  SimOptions o;
  o.store_buffer = true;
  o.store_drain_per_mille = 0;
  SimMemory m(4096, 1, o);
  auto a = m.NewView(0), b = m.NewView(0);
  Store(*a, 8, 42);
  a->Flush(8, 8);
  a->Fence();
  EXPECT_EQ(Load(*a, 8), 42u);  // its own store, from the buffer
  EXPECT_EQ(Media(m, 8), 0u);   // not yet in the cache, let alone memory
  b->Invalidate(8, 8);
  EXPECT_EQ(Load(*b, 8), 0u);
  EXPECT_EQ(m.stats().forwarded_loads, 1u);
  // Invalidate ends with an mfence: the buffer drains, the clwb behind the store writes back.
  a->Invalidate(128, 8);
  EXPECT_EQ(Media(m, 8), 42u);
}

TEST(SimMemory, TornStoreLeavesAHalfWrittenLineUntilTheRestIsWrittenBack) {
  SimOptions o;
  o.tear_per_mille = 1000;
  SimMemory m(4096, 3, o);
  auto a = m.NewView(0);
  std::uint64_t ones[16];
  std::memset(ones, 0xFF, sizeof(ones));
  // One line: a prefix of its 8-byte words is new, the rest old — never all, never none.
  a->Write(0, ones, 64);
  int fresh = 0;
  for (int w = 0; w < 8; ++w) fresh += Media(m, 8 * w) == ~0ull;
  EXPECT_GT(fresh, 0);
  EXPECT_LT(fresh, 8);
  for (int w = 0; w < fresh; ++w) EXPECT_EQ(Media(m, 8 * w), ~0ull) << "a prefix: word " << w;
  a->Flush(0, 64);
  for (int w = 0; w < 8; ++w) EXPECT_EQ(Media(m, 8 * w), ~0ull);
  // Two lines (a 128-byte record): the cut may fall on the line boundary or inside either.
  a->Write(128, ones, 128);
  int new_words = 0;
  for (int w = 0; w < 16; ++w) new_words += Media(m, 128 + 8 * w) == ~0ull;
  EXPECT_GT(new_words, 0);
  EXPECT_LT(new_words, 16);
  EXPECT_EQ(m.stats().torn_stores, 2u);
}

TEST(SimMemory, WriteBackIsInFlightUntilTheFenceAndMayLandInParts) {
  SimOptions o;
  o.async_writeback = true;
  o.writeback_progress_per_mille = 0;
  {
    SimMemory m(4096, 5, o);
    auto a = m.NewView(0), b = m.NewView(0);
    Store(*a, 0, 7);
    a->Flush(0, 8);
    b->Invalidate(0, 8);
    EXPECT_EQ(Load(*b, 0), 0u);  // clwb issued, not complete
    a->Fence();                  // sfence: complete before any later store
    b->Invalidate(0, 8);
    EXPECT_EQ(Load(*b, 0), 7u);
  }
  // With progress on, another host's fill can see the line half written back.
  o.writeback_progress_per_mille = 1000;
  SimMemory m(1 << 16, 6, o);
  auto a = m.NewView(0), b = m.NewView(0);
  int partial = 0;
  for (std::uint64_t line = 0; line < 64; ++line) {
    std::uint64_t ones[8];
    std::memset(ones, 0xFF, sizeof(ones));
    a->Write(line * 64, ones, 64);
    a->Flush(line * 64, 64);
    std::uint64_t seen[8];
    b->Invalidate(line * 64, 64);
    b->Read(line * 64, seen, 64);  // this access lets one write-back make progress first
    int fresh = 0;
    for (std::uint64_t w : seen) {
      EXPECT_TRUE(w == 0 || w == ~0ull);  // 8-byte granularity: words are whole
      fresh += w == ~0ull;
    }
    partial += fresh > 0 && fresh < 8;
    a->Fence();
  }
  EXPECT_GT(partial, 0);
  EXPECT_GT(m.stats().partial_writebacks, 0u);
}

TEST(SimMemory, LateWriteBackLandsLinesOfACrashedHostAtLaterTicks) {
  SimOptions o;
  o.late_writeback = true;
  o.late_land_per_mille = 0;
  SimMemory m(1 << 16, 9, o);
  auto a = m.NewView(0);
  for (std::uint64_t line = 0; line < 32; ++line) Store(*a, line * 64, line + 1);
  a->Crash();
  auto landed = [&] {
    int n = 0;
    for (std::uint64_t line = 0; line < 32; ++line) n += Media(m, line * 64) == line + 1;
    return n;
  };
  EXPECT_EQ(landed(), 0);  // nothing settled at the crash
  const auto lost = static_cast<int>(m.stats().lost_lines);
  EXPECT_GT(lost, 0);
  EXPECT_LT(lost, 32);
  // The host's machine still holds the rest, written back at some later time.
  o.late_land_per_mille = 1000;
  SimMemory m2(1 << 16, 9, o);
  auto c = m2.NewView(0);
  for (std::uint64_t line = 0; line < 32; ++line) Store(*c, line * 64, line + 1);
  c->Crash();
  m2.Tick();
  int n = 0;
  for (std::uint64_t line = 0; line < 32; ++line) n += Media(m2, line * 64) == line + 1;
  EXPECT_EQ(n, 32 - static_cast<int>(m2.stats().lost_lines));
  EXPECT_EQ(m2.stats().late_lines, static_cast<std::uint64_t>(n));
  // Used again (the same machine), the host sees its own kept lines: its cache is coherent.
  for (std::uint64_t line = 0; line < 32; ++line) {
    const std::uint64_t v = Load(*a, line * 64);
    EXPECT_TRUE(v == line + 1 || v == 0);
  }
  EXPECT_EQ(landed(), 0);
}

TEST(SimMemory, CrashSettlesAtOnceWithoutLateWriteBack) {
  SimMemory m(1 << 16, 9);
  auto a = m.NewView(0);
  for (std::uint64_t line = 0; line < 32; ++line) Store(*a, line * 64, line + 1);
  a->Crash();
  int n = 0;
  for (std::uint64_t line = 0; line < 32; ++line) n += Media(m, line * 64) == line + 1;
  EXPECT_EQ(n + static_cast<int>(m.stats().lost_lines), 32);
  EXPECT_EQ(a->cached_lines(), 0u);
}

TEST(SimClock, FreezesResumesJumpsAndDrifts) {
  std::int64_t now = 1000;
  SimClock c(&now, 50, 1.0);
  EXPECT_EQ(c.NowMs(), 1050);
  c.Freeze();
  now += 500;
  EXPECT_EQ(c.NowMs(), 1050);  // suspended
  c.Resume();
  EXPECT_EQ(c.NowMs(), 1050);  // CLOCK_MONOTONIC: the span is lost
  now += 10;
  EXPECT_EQ(c.NowMs(), 1060);
  c.Freeze();
  now += 300;
  c.Resume();
  c.Jump(300);  // CLOCK_BOOTTIME: the span is counted
  EXPECT_EQ(c.NowMs(), 1360);
  c.set_rate(0.5);
  now += 100;
  EXPECT_EQ(c.NowMs(), 1410);
  c.Jump(-5);  // a clock that lost time
  EXPECT_EQ(c.NowMs(), 1405);
  c.Freeze();
  c.Jump(20);  // counted while frozen too
  EXPECT_EQ(c.NowMs(), 1425);
}

}  // namespace
}  // namespace cxlkv::coherence
