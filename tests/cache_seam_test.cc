// Code that publishes shared memory issues exactly the cache.h operations its contract
// promises, over the ranges asked for: DirectMem (the Mem seam on a real mapping) and an
// arena's format. On coherent memory no load can tell a missing write-back, so the calls
// themselves are checked (tests/cache_recorder.h).
#include <cstring>
#include <vector>

#include "cache_recorder.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/pool/arena.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

using coherence::DirectMem;

TEST(DirectMemSeam, EachPrimitiveIsItsCacheOperationOverTheSameRange) {
  alignas(64) static std::byte region[8192];
  DirectMem m(region, sizeof(region));
  const std::byte* base = region;
  CacheRecorder rec;

  m.Flush(128, 100);
  EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kFlush, base + 128, 100}}));
  m.Invalidate(256, 64);
  EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kInvalidate, base + 256, 64}}))
      << "Invalidate must fence after the eviction (Evict alone does not)";
  m.Evict(512, 10);
  EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kEvict, base + 512, 10}}));
  m.Fence();
  EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kFence, nullptr, 0}}));

  std::vector<unsigned char> src(200, 0x5A);
  m.WriteNt(64, src.data(), src.size());
  EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kCopyNt, base + 64, 200}}))
      << "WriteNt must use streaming stores (plain stores stay in this host's cache)";
  EXPECT_EQ(std::memcmp(region + 64, src.data(), src.size()), 0);

  // Plain loads and stores issue nothing.
  m.Write(1024, src.data(), 8);
  m.Read(1024, src.data(), 8);
  EXPECT_TRUE(rec.Take().empty());
}

TEST(CacheRecorder, CoveredJoinsAdjacentCalls) {
  alignas(64) static std::byte buf[256];
  CacheRecorder rec;
  DirectMem m(buf, sizeof(buf));
  m.Flush(0, 64);
  m.Flush(64, 100);
  EXPECT_TRUE(rec.Covered(CacheOp::kFlush, buf, 164));
  EXPECT_FALSE(rec.Covered(CacheOp::kFlush, buf, 165));
  EXPECT_FALSE(rec.Covered(CacheOp::kInvalidate, buf, 1));
}

// Arena::Format's publication order (pool/src/arena.cc): the formatting mark, then the
// owner table, map and hints, then the header, then the final magic word, each written back
// and fenced before the next store, so a crash or a reader on another host sees a formatting
// mark or a complete arena, never a header over stale tables.
TEST(ArenaSeam, FormatWritesBackEachStepBeforeTheNext) {
  pool::FormatOptions o;
  o.layout = TinyLayout();
  auto region = MustOpen("memfd:?size=4M");
  ASSERT_NE(region, nullptr);
  const std::byte* base = region->addr();
  CacheRecorder rec;
  auto arena = pool::Arena::Format(std::move(region), o);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const pool::ArenaHeader& h = (*arena)->header();
  const std::vector<CacheCall> calls = rec.Take();
  const std::uint64_t tables = h.metadata_bytes - h.owner_table_offset;
  const CacheCall fence{CacheOp::kFence, nullptr, 0};
  const std::vector<CacheCall> want = {
      {CacheOp::kFlush, base, 8},
      fence,  // formatting mark
      {CacheOp::kFlush, base + h.owner_table_offset, tables},
      fence,  // tables
      {CacheOp::kFlush, base, pool::kHeaderReservedBytes},
      fence,  // header
      {CacheOp::kFlush, base, 8},
      fence,  // final magic
  };
  ASSERT_GE(calls.size(), want.size());
  EXPECT_EQ(std::vector<CacheCall>(calls.begin(),
                                   calls.begin() + static_cast<std::ptrdiff_t>(want.size())),
            want)
      << "Format must write back and fence each step before the next";
}

}  // namespace
}  // namespace cxlkv::testing
