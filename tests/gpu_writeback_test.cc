// gpu/dma_writeback.h without a GPU: the host bytes a device-to-host copy writes, and their
// write-back, checked with the cache-call recorder (tests/cache_recorder.h). On one coherent
// machine a missing write-back changes nothing a load can see; only the recorder can tell.
// (On a GPU, tests/gpu_test.cc checks that CopyEngine writes them back before it reports a
// D2H ticket done.)
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cache_recorder.h"
#include "cxlkv/gpu/dma_writeback.h"
#include "cxlkv/gpu/plan.h"
#include "gpu_random_copies.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::gpu {
namespace {

using cxlkv::testing::CacheCall;
using cxlkv::testing::CacheOp;
using cxlkv::testing::CacheRecorder;

// Random geometries and D2H block lists: the ranges are exactly the bytes the copy plan
// writes on the host (every op's destination), no more and no fewer, sorted and disjoint.
TEST(DmaWriteback, RangesAreExactlyTheBytesAD2hPlanWrites) {
  const std::uint64_t seed = cxlkv::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng64(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const testing::RandomCopies rc = testing::MakeRandomCopies(rng64, 6);
    const PagedCache& c = rc.cache;
    const std::uint64_t host_base = testing::RandomCopies::kHostBase, B = c.BlockBytes();
    const std::uint32_t host_blocks = rc.host_blocks;
    const std::vector<BlockCopy>& bs = rc.blocks;
    PlanOptions o;
    o.layer_begin = rc.layer_begin;
    o.layer_end = rc.layer_end;
    auto plan = PlanCopies(c, Direction::kDeviceToHost, bs, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<bool> written(host_blocks * B), covered(host_blocks * B);
    for (const CopyOp& op : plan->ops) {
      for (std::uint64_t i = 0; i < op.bytes; ++i) written[op.dst - host_base + i] = true;
    }
    const std::vector<HostRange> r = HostRangesWritten(c, bs, o.layer_begin, o.layer_end);
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (i > 0) {
        ASSERT_GT(r[i].addr, r[i - 1].addr + r[i - 1].bytes)
            << "iteration " << iter << ": ranges " << i - 1 << " and " << i << " not merged";
      }
      for (std::uint64_t b = 0; b < r[i].bytes; ++b) covered[r[i].addr - host_base + b] = true;
    }
    ASSERT_EQ(covered, written) << "iteration " << iter;
  }
}

// Every byte of every range is written back, and the fence comes after the last write-back:
// a store that publishes the blocks after the call cannot pass the data.
TEST(DmaWriteback, WritesBackEveryRangeThenFences) {
  std::vector<std::uint8_t> mem(1 << 20);
  const auto base = reinterpret_cast<std::uint64_t>(mem.data());
  const std::vector<HostRange> ranges = {
      {base + 64, 4096}, {base + 65536, 5 * 64 + 7}, {base + 300000, 200000}};
  CacheRecorder rec;
  EXPECT_EQ(WriteBackHostRanges(ranges), 4096u + 5 * 64 + 7 + 200000);
  const std::vector<CacheCall> calls = rec.calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().op, CacheOp::kFence) << "no fence after the write-back";
  for (const HostRange& r : ranges) {
    EXPECT_TRUE(rec.Covered(CacheOp::kFlush, reinterpret_cast<const void*>(r.addr), r.bytes))
        << "range at +" << r.addr - base << " (" << r.bytes << " bytes) not written back";
  }
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    EXPECT_EQ(calls[i].op, CacheOp::kFlush) << "call " << i;
  }
}

TEST(DmaWriteback, NothingToWriteBackStillFences) {
  CacheRecorder rec;
  EXPECT_EQ(WriteBackHostRanges({}), 0u);
  EXPECT_EQ(rec.calls(), (std::vector<CacheCall>{{CacheOp::kFence, nullptr, 0}}));
}

TEST(DmaWriteback, ModesHaveNames) {
  EXPECT_EQ(DmaWritebackName(DmaWriteback::kWriteBack), "write-back");
  EXPECT_EQ(DmaWritebackName(DmaWriteback::kPlatformWritesMemory), "platform-writes-memory");
}

}  // namespace
}  // namespace cxlkv::gpu
