// LMCache's shared-L1 visibility ABI (integrations/lmcache, docs/lmcache.md):
//   - structurally: publish writes back and fences exactly the caller's range, acquire
//     invalidates exactly it (tests/cache_recorder.h sees every cache.h call);
//   - by effect on memory without hardware coherence: the same code on two hosts of the
//     non-coherent simulator (coherence/sim.h) moves an object from one to the other, and
//     each step left out leaves the reader with stale bytes;
//   - bad input: each error of the ABI, and no cache operation issued for it;
//   - the shared object exports the v1 symbol and nothing else.
// The ctypes side (LMCache's own loader, two processes) is tests/lmcache/visibility_ctypes.py.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cache_recorder.h"
#include "cxlkv/coherence/sim.h"
#include "cxlkv/lmcache/range_visibility.h"
#include "cxlkv/lmcache/visibility.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::testing {
namespace {

constexpr std::uint32_t kPublish = LMCACHE_SHARED_L1_VISIBILITY_PUBLISH;
constexpr std::uint32_t kAcquire = LMCACHE_SHARED_L1_VISIBILITY_ACQUIRE;
constexpr const char* kMode = LMCACHE_SHARED_L1_VISIBILITY_MODE;

// A 1 MiB memfd mapped MAP_SHARED: what LMCache maps from its device-DAX node.
class Mapping {
 public:
  Mapping() {
    fd_ = ::memfd_create("lmcache-visibility-test", MFD_CLOEXEC);
    EXPECT_GE(fd_, 0) << "memfd_create: errno " << errno;
    EXPECT_EQ(::ftruncate(fd_, kBytes), 0);
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<std::byte*>(p);
  }
  ~Mapping() {
    ::munmap(base_, kBytes);
    ::close(fd_);
  }
  static constexpr std::size_t kBytes = 1 << 20;
  int fd() const { return fd_; }
  std::byte* at(std::size_t off) const { return base_ + off; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
};

const CacheCall kFenceCall{CacheOp::kFence, nullptr, 0};

TEST(LmcacheVisibility, PublishWritesBackAndFencesExactlyTheRange) {
  Mapping m;
  // Whole lines, a partial last line, one byte, and a range spanning many pages.
  for (std::size_t len :
       {std::size_t{64}, std::size_t{100}, std::size_t{1}, std::size_t{5} << 16}) {
    SCOPED_TRACE(len);
    std::memset(m.at(4096), 0x5A, len);
    CacheRecorder rec;
    ASSERT_EQ(
        lmcache_shared_l1_visibility_v1(kMode, kPublish, m.fd(), m.at(4096), 8192 + 4096, len, 7),
        0);
    EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kFlush, m.at(4096), len}, kFenceCall}))
        << "publish must write back the whole range, then fence (a flush alone only starts "
           "the write-back)";
  }
}

TEST(LmcacheVisibility, AcquireInvalidatesExactlyTheRange) {
  Mapping m;
  for (std::size_t len : {std::size_t{64}, std::size_t{100}, std::size_t{5} << 16}) {
    SCOPED_TRACE(len);
    CacheRecorder rec;
    ASSERT_EQ(lmcache_shared_l1_visibility_v1(kMode, kAcquire, m.fd(), m.at(128), 128, len, 1), 0);
    EXPECT_EQ(rec.Take(), (std::vector<CacheCall>{{CacheOp::kInvalidate, m.at(128), len}}))
        << "acquire must evict the whole range with the fence (Invalidate, not Evict)";
  }
}

TEST(LmcacheVisibility, PublishAndAcquireKeepTheBytes) {
  Mapping m;
  std::vector<unsigned char> want(3000);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<unsigned char>(i * 7);
  std::memcpy(m.at(0), want.data(), want.size());
  ASSERT_EQ(lmcache_shared_l1_visibility_v1(kMode, kPublish, m.fd(), m.at(0), 0, want.size(), 1),
            0);
  ASSERT_EQ(lmcache_shared_l1_visibility_v1(kMode, kAcquire, m.fd(), m.at(0), 0, want.size(), 1),
            0);
  EXPECT_EQ(std::memcmp(m.at(0), want.data(), want.size()), 0);
}

struct BadCase {
  const char* what;
  const char* mode;
  std::uint32_t op;
  int fd;               // -2: the mapping's descriptor; -3: a closed one
  std::ptrdiff_t addr;  // from the mapping's base; kNullAddr: NULL; kTopAddr: near the top
  std::uint64_t device_offset;
  std::size_t length;
  int want;
};
constexpr std::ptrdiff_t kNullAddr = -1, kTopAddr = -2;

TEST(LmcacheVisibility, BadInputIsAnErrnoAndTouchesNothing) {
  Mapping m;
  int closed = ::dup(m.fd());
  ASSERT_GE(closed, 0);
  ::close(closed);
  const BadCase cases[] = {
      {"no mode", nullptr, kPublish, -2, 0, 0, 64, -EINVAL},
      {"unknown mode", "coherent", kPublish, -2, 0, 0, 64, -EOPNOTSUPP},
      {"mode in other case", "SOFTWARE_FENCED", kAcquire, -2, 0, 0, 64, -EOPNOTSUPP},
      {"empty mode", "", kAcquire, -2, 0, 0, 64, -EOPNOTSUPP},
      {"operation 0", kMode, 0, -2, 0, 0, 64, -EINVAL},
      {"operation 3", kMode, 3, -2, 0, 0, 64, -EINVAL},
      {"negative fd", kMode, kPublish, -1, 0, 0, 64, -EBADF},
      {"closed fd", kMode, kAcquire, -3, 0, 0, 64, -EBADF},
      {"null address", kMode, kPublish, -2, kNullAddr, 0, 64, -EFAULT},
      {"misaligned address", kMode, kPublish, -2, 8, 8, 64, -EINVAL},
      {"misaligned device offset", kMode, kAcquire, -2, 64, 65, 64, -EINVAL},
      {"zero length", kMode, kPublish, -2, 0, 0, 0, -EINVAL},
      {"address range wraps", kMode, kPublish, -2, kTopAddr, 0, 128, -EINVAL},
      {"offset range wraps", kMode, kAcquire, -2, 0, ~std::uint64_t{63}, 128, -EINVAL},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    void* addr = c.addr == kNullAddr  ? nullptr
                 : c.addr == kTopAddr ? reinterpret_cast<void*>(~std::uintptr_t{63})
                                      : static_cast<void*>(m.at(static_cast<std::size_t>(c.addr)));
    const int fd = c.fd == -2 ? m.fd() : c.fd == -3 ? closed : c.fd;
    CacheRecorder rec;
    EXPECT_EQ(lmcache_shared_l1_visibility_v1(c.mode, c.op, fd, addr, c.device_offset, c.length, 1),
              c.want);
    EXPECT_TRUE(rec.Take().empty()) << "a refused call must not touch memory";
  }
}

// The version is the symbol's name: a loader asking for another version finds nothing, and
// nothing of coherence/ leaks out of the library to clash with another copy in the process.
TEST(LmcacheVisibility, SharedObjectExportsTheV1SymbolOnly) {
  void* h = ::dlopen(CXLKV_LMCACHE_VISIBILITY_SO, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << ::dlerror();
  auto* fn = reinterpret_cast<decltype(&lmcache_shared_l1_visibility_v1)>(
      ::dlsym(h, "lmcache_shared_l1_visibility_v1"));
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(::dlsym(h, "lmcache_shared_l1_visibility_v2"), nullptr);
  EXPECT_EQ(::dlsym(h, "lmcache_shared_l1_visibility"), nullptr);
  EXPECT_EQ(::dlsym(h, "_ZN5cxlkv9coherence5FlushEPKvm"), nullptr);
  EXPECT_EQ(::dlsym(h, "_ZN5cxlkv7lmcache12PublishRangeERNS_9coherence3MemEmm"), nullptr);
  Mapping m;
  std::memset(m.at(0), 1, 256);
  EXPECT_EQ(fn(kMode, kPublish, m.fd(), m.at(0), 0, 256, 3), 0);
  EXPECT_EQ(fn(kMode, kAcquire, m.fd(), m.at(0), 0, 256, 3), 0);
  EXPECT_EQ(fn("coherent", kAcquire, m.fd(), m.at(0), 0, 256, 3), -EOPNOTSUPP);
  ::dlclose(h);
}

// One object moved between two hosts that share memory without hardware coherence. The
// reader has cached the range before (an older object at the same offset); write-backs are
// in flight until the writer's next fence and land in parts. Every round must read exactly
// what the writer wrote; leaving out the publish's write-back or fence, or the acquire's
// eviction or its fence, fails it.
TEST(LmcacheVisibility, MovesObjectsBetweenNonCoherentHosts) {
  const std::uint64_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (replay: CXLKV_SEED=" << seed << ")");
  coherence::SimOptions o;
  o.async_writeback = true;
  coherence::SimMemory media(1 << 16, seed, o);
  auto writer = media.NewView(0);
  auto reader = media.NewView(0);
  std::mt19937_64 rng(seed);
  int stale_without_acquire = 0;
  for (int round = 0; round < 200; ++round) {
    const std::uint64_t off = 64 * (rng() % 512);
    const std::size_t len = 1 + rng() % (std::min<std::uint64_t>(4096, (1 << 16) - off) - 1);
    std::vector<unsigned char> old_bytes(len), bytes(len), got(len);
    // The reader holds the range's lines (clean) from an earlier read.
    reader->Read(off, old_bytes.data(), len);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    writer->Write(off, bytes.data(), len);
    lmcache::PublishRange(*writer, off, len);
    // (the coordinator's commit, then the reader's lookup: messages, not this memory)
    reader->Read(off, got.data(), len);
    if (got != bytes) ++stale_without_acquire;
    lmcache::AcquireRange(*reader, off, len);
    reader->Read(off, got.data(), len);
    ASSERT_EQ(got, bytes) << "round " << round << ": the reader saw stale bytes of [" << off
                          << ", +" << len << ")";
  }
  // The simulation is meaningful: without the acquire the reader would have been stale.
  EXPECT_GT(stale_without_acquire, 100);
}

}  // namespace
}  // namespace cxlkv::testing
