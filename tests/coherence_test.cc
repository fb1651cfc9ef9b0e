#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/record.h"
#include "gtest/gtest.h"

namespace cxlkv::coherence {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  const std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
}

TEST(Crc32c, HardwareMatchesPortableAndChains) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(4099);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 4099u}) {
    EXPECT_EQ(Crc32c(buf.data(), len), Crc32cPortable(buf.data(), len)) << len;
  }
  const std::uint32_t whole = Crc32c(buf.data(), buf.size());
  const std::uint32_t part = Crc32c(buf.data() + 100, buf.size() - 100, Crc32c(buf.data(), 100));
  EXPECT_EQ(whole, part);
}

struct TestRecord {
  RecordHead head;
  std::uint64_t payload[5];
};
constexpr std::uint64_t kMagic = MakeMagic("TESTREC1");

TEST(Record, SealThenCheck) {
  TestRecord r{};
  r.payload[2] = 42;
  Seal(r, kMagic, 3, 17);
  EXPECT_EQ(r.head.seq, 17u);
  EXPECT_TRUE(Check(r, kMagic, 1, 3, "rec").ok());
}

TEST(Record, EveryDefectIsNamed) {
  TestRecord r{};
  Seal(r, kMagic, 2, 1);

  TestRecord blank{};
  EXPECT_TRUE(absl::IsNotFound(Check(blank, kMagic, 1, 2, "rec")));

  auto foreign = Check(r, MakeMagic("OTHERREC"), 1, 2, "my record");
  EXPECT_TRUE(absl::IsFailedPrecondition(foreign));
  EXPECT_NE(foreign.message().find("my record"), absl::string_view::npos);
  EXPECT_NE(foreign.message().find("foreign"), absl::string_view::npos);

  EXPECT_TRUE(absl::IsUnimplemented(Check(r, kMagic, 3, 4, "rec")));

  TestRecord torn = r;
  torn.payload[4] ^= 1;  // one bit flipped anywhere is caught
  auto st = Check(torn, kMagic, 1, 2, "rec");
  EXPECT_TRUE(absl::IsDataLoss(st));
  EXPECT_NE(st.message().find("checksum"), absl::string_view::npos);

  TestRecord resized = r;
  resized.head.bytes = 8;
  EXPECT_TRUE(absl::IsDataLoss(Check(resized, kMagic, 1, 2, "rec")));
}

TEST(Cache, FeaturesAreConsistent) {
  const CpuFeatures& f = DetectedCpuFeatures();
  EXPECT_TRUE(f.clflush) << "every x86-64 CPU has clflush";
  if (f.clwb) {
    EXPECT_EQ(ActiveFlushKind(), FlushKind::kClwb);
  }
  if (f.movdir64b) {
    EXPECT_EQ(ActiveCopyKind(), CopyKind::kMovdir64b);
  }
  EXPECT_NE(FlushKindName(ActiveFlushKind()), "?");
}

TEST(Cache, FlushAndInvalidateKeepData) {
  std::vector<unsigned char> buf(10000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7);
  for (FlushKind k : {FlushKind::kClwb, FlushKind::kClflushopt, FlushKind::kClflush}) {
    FlushWith(k, buf.data() + 3, buf.size() - 5);
  }
  Fence();
  Invalidate(buf.data() + 1, 0);
  Invalidate(buf.data(), buf.size());
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<unsigned char>(i * 7));
}

// The test seam: an installed observer sees each primitive, with its range, in order, on any
// thread; after its ScopedCacheObserver is gone it sees nothing more.
TEST(Cache, ObserverSeesEachPrimitiveWhileInstalled) {
  struct Log final : CacheObserver {
    std::mutex mu;
    std::vector<std::tuple<CacheOp, const void*, std::size_t>> ops;
    void OnCacheOp(CacheOp op, const void* addr, std::size_t len) noexcept override {
      std::lock_guard l(mu);
      ops.emplace_back(op, addr, len);
    }
  } log;
  std::vector<unsigned char> buf(4096);
  {
    ScopedCacheObserver observe(log);
    Flush(buf.data(), 100);
    FlushWith(FlushKind::kClflush, buf.data() + 64, 64);
    Invalidate(buf.data(), 200);
    Evict(buf.data() + 128, 300);
    std::thread([&] { Fence(); }).join();
  }
  Flush(buf.data(), 100);
  Fence();
  using Op = std::tuple<CacheOp, const void*, std::size_t>;
  const std::vector<Op> want = {
      Op{CacheOp::kFlush, buf.data(), 100}, Op{CacheOp::kFlush, buf.data() + 64, 64},
      Op{CacheOp::kInvalidate, buf.data(), 200}, Op{CacheOp::kEvict, buf.data() + 128, 300},
      Op{CacheOp::kFence, nullptr, 0}};
  EXPECT_EQ(log.ops, want);
}

TEST(Cache, CopyNtEveryKindAlignmentAndLength) {
  std::mt19937 rng(11);
  std::vector<unsigned char> src(70000), dst(70000 + 128);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  for (CopyKind k : {CopyKind::kMovdir64b, CopyKind::kAvx512Nt, CopyKind::kSse2Nt}) {
    for (std::size_t dst_off : {0u, 1u, 31u}) {
      for (std::size_t src_off : {0u, 3u}) {
        for (std::size_t len : {0u, 1u, 63u, 64u, 65u, 4096u, 65537u}) {
          unsigned char* d = reinterpret_cast<unsigned char*>(
              (reinterpret_cast<std::uintptr_t>(dst.data()) + 63) & ~std::uintptr_t{63});
          d += dst_off;
          std::memset(dst.data(), 0xEE, dst.size());
          CopyNtWith(k, d, src.data() + src_off, len);
          ASSERT_EQ(std::memcmp(d, src.data() + src_off, len), 0)
              << CopyKindName(k) << " dst_off=" << dst_off << " len=" << len;
          if (len + dst_off < 70000) {
            ASSERT_EQ(d[len], 0xEE) << "wrote past the end";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cxlkv::coherence
