// DirectMem, the Mem seam on a real mapping, issues exactly the cache.h operation each of its
// primitives promises, over the range asked for. On coherent memory no load can tell a
// missing write-back, so the calls themselves are checked (tests/cache_recorder.h).
#include <cstring>
#include <vector>

#include "cache_recorder.h"
#include "cxlkv/coherence/mem.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace cxlkv::testing
