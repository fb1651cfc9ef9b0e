#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/crc32c.h"
#include "cxlkv/coherence/mem.h"
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

// The delta of a word is what XORing it into a message does to Crc32c, wherever the word
// sits and whatever the rest of the message holds.
TEST(Crc32c, WordDeltaMatchesTheWholeCrc) {
  std::mt19937_64 rng(11);
  for (std::size_t trailing : {0u, 4u, 36u, 44u, 100u}) {
    const Crc32cWordDelta delta(trailing);
    for (int trial = 0; trial < 200; ++trial) {
      const std::size_t before = rng() % 24;
      std::vector<unsigned char> msg(before + 8 + trailing);
      for (auto& b : msg) b = static_cast<unsigned char>(rng());
      const std::uint32_t crc = Crc32c(msg.data(), msg.size());
      std::uint64_t bits = rng();
      if (trial % 4 == 0) bits &= 0xFF00ull << (8 * (trial % 7));  // sparse words too
      for (std::size_t b = 0; b < 8; ++b) {
        msg[before + b] = static_cast<unsigned char>(msg[before + b] ^ (bits >> (8 * b)));
      }
      EXPECT_EQ(crc ^ delta(bits), Crc32c(msg.data(), msg.size()))
          << "trailing " << trailing << " before " << before << " bits " << bits;
    }
  }
  // Compile time, as PrefixHost uses it for lease rows.
  static constexpr Crc32cWordDelta kAtEnd(0);
  static_assert(kAtEnd(0) == 0);
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

TEST(Cache, MaskCpuFeaturesClearsTheNamedOnesAndReportsUnknownNames) {
  CpuFeatures all;
  all.clwb = all.clflushopt = all.clflush = all.movdir64b = all.avx512f = all.sse42 = true;
  std::string unknown;
  const CpuFeatures m = MaskCpuFeatures(all, " movdir64b,avx512f , clwb,,avx2,clflush", &unknown);
  EXPECT_FALSE(m.movdir64b);
  EXPECT_FALSE(m.avx512f);
  EXPECT_FALSE(m.clwb);
  EXPECT_TRUE(m.clflushopt);
  EXPECT_TRUE(m.sse42);
  EXPECT_TRUE(m.clflush) << "clflush cannot be disabled";
  EXPECT_EQ(unknown, "'avx2', 'clflush'");
  unknown.clear();
  const CpuFeatures n = MaskCpuFeatures(all, "clflushopt,sse42", &unknown);
  EXPECT_FALSE(n.clflushopt);
  EXPECT_FALSE(n.sse42);
  EXPECT_TRUE(n.movdir64b);
  EXPECT_EQ(unknown, "");
}

// Run by cpu_disable_test with CXLKV_CPU_DISABLE set (tests/CMakeLists.txt): the process uses
// none of the disabled instructions, as on a CPU without them.
TEST(Cache, DisabledFeaturesAreNotUsed) {
  const char* disable = std::getenv("CXLKV_CPU_DISABLE");
  if (disable == nullptr) GTEST_SKIP() << "CXLKV_CPU_DISABLE is not set (cpu_disable_test sets it)";
  CpuFeatures all;
  all.clwb = all.clflushopt = all.clflush = all.movdir64b = all.avx512f = all.sse42 = true;
  const CpuFeatures off = MaskCpuFeatures(all, disable, nullptr);
  const CpuFeatures& f = DetectedCpuFeatures();
  if (!off.movdir64b) {
    EXPECT_FALSE(f.movdir64b);
    EXPECT_NE(ActiveCopyKind(), CopyKind::kMovdir64b);
  }
  if (!off.avx512f) {
    EXPECT_FALSE(f.avx512f);
    EXPECT_NE(ActiveCopyKind(), CopyKind::kAvx512Nt);
  }
  if (!off.movdir64b && !off.avx512f) {
    EXPECT_EQ(ActiveCopyKind(), CopyKind::kSse2Nt);
  }
  if (!off.clwb) {
    EXPECT_FALSE(f.clwb);
    EXPECT_NE(ActiveFlushKind(), FlushKind::kClwb);
  }
  if (!off.sse42) {
    EXPECT_FALSE(f.sse42);
  }
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

// DirectMem on ordinary memory: every primitive leaves the bytes where the calls put them,
// streaming stores (WriteNt) included, whatever the alignment.
TEST(DirectMem, EveryPrimitiveKeepsTheBytes) {
  alignas(64) static std::byte region[8192];
  std::memset(region, 0, sizeof(region));
  DirectMem m(region, sizeof(region));
  EXPECT_EQ(m.size_bytes(), sizeof(region));
  std::vector<unsigned char> src(300), back(300);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 13 + 1);
  for (std::uint64_t off : {0u, 64u, 200u}) {
    m.WriteNt(off, src.data(), src.size());
    m.Fence();
    m.Invalidate(off, src.size());
    m.Read(off, back.data(), back.size());
    EXPECT_EQ(back, src) << "WriteNt at " << off;
  }
  m.Write(4096, src.data(), src.size());
  m.Flush(4096, src.size());
  m.FullFence();
  m.Evict(4096, src.size());
  m.FullFence();
  std::fill(back.begin(), back.end(), 0);
  m.Read(4096, back.data(), back.size());
  EXPECT_EQ(back, src);
}

// Flush, Invalidate and Evict issue their instruction on every line of the range and on no
// line past it. On coherent memory no load can tell a skipped line, but the MMU can: like a
// load, clwb / clflushopt / clflush fault on a page without access. The range ends in (or
// just before) such a page.
TEST(CacheDeathTest, EachFlushReachesTheLastLineOfItsRangeAndNoFurther) {
  const long page = ::sysconf(_SC_PAGESIZE);
  auto* map =
      static_cast<std::byte*>(::mmap(nullptr, 2 * static_cast<std::size_t>(page),
                                     PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  std::memset(map, 1, static_cast<std::size_t>(page));
  ASSERT_EQ(::mprotect(map + page, static_cast<std::size_t>(page), PROT_NONE), 0);
  std::byte* const near_end = map + page - 100;  // 100 bytes from here end at the boundary
  const std::vector<std::pair<const char*, void (*)(const void*, std::size_t)>> ops = {
      {"Flush", [](const void* p, std::size_t n) { Flush(p, n); }},
      {"Invalidate", [](const void* p, std::size_t n) { Invalidate(p, n); }},
      {"Evict", [](const void* p, std::size_t n) { Evict(p, n); }},
      {"FlushWith(clwb)", [](const void* p, std::size_t n) { FlushWith(FlushKind::kClwb, p, n); }},
      {"FlushWith(clflushopt)",
       [](const void* p, std::size_t n) { FlushWith(FlushKind::kClflushopt, p, n); }},
      {"FlushWith(clflush)",
       [](const void* p, std::size_t n) { FlushWith(FlushKind::kClflush, p, n); }},
  };
  for (const auto& [name, op] : ops) {
    op(near_end, 100);  // the whole range is accessible: no fault
    EXPECT_DEATH(op(near_end, 101), "") << name << " skipped the range's last line";
  }
  ::munmap(map, 2 * static_cast<std::size_t>(page));
}

}  // namespace
}  // namespace cxlkv::coherence
