// gpu/plan.h without a GPU: registration chunk planning and bookkeeping, paged-cache
// geometry, copy validation, coalescing and splitting.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "cxlkv/gpu/plan.h"
#include "cxlkv/gpu/prefault.h"
#include "cxlkv/pool/region.h"
#include "gpu_random_copies.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::gpu {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

// ---- chunk planning -----------------------------------------------------------------------

TEST(PlanChunks, SplitsAt64GiBOnAlignment) {
  auto c = PlanChunks(100 * kGiB + 2 * kMiB, 2 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[0], (ChunkPlan{0, 64 * kGiB}));
  EXPECT_EQ((*c)[1], (ChunkPlan{64 * kGiB, 36 * kGiB + 2 * kMiB}));
}

TEST(PlanChunks, ExactMultipleAndSmall) {
  auto c = PlanChunks(128 * kGiB, 4096);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[1].bytes, 64 * kGiB);
  auto one = PlanChunks(8 * kMiB, 4096);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<ChunkPlan>{{0, 8 * kMiB}}));
}

TEST(PlanChunks, ChunksNeverEndInsideADevicePage) {
  // A 1 GiB-aligned devdax device and a chunk limit that is not a multiple of it.
  auto c = PlanChunks(10 * kGiB, kGiB, 3 * kGiB + 5 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  std::uint64_t total = 0;
  for (const ChunkPlan& p : *c) {
    EXPECT_EQ(p.offset % kGiB, 0u);
    EXPECT_LE(p.bytes, 3 * kGiB + 5 * kMiB);
    EXPECT_EQ(p.offset, total);
    total += p.bytes;
  }
  EXPECT_EQ(total, 10 * kGiB);
  EXPECT_EQ(c->size(), 4u);  // 3 + 3 + 3 + 1 GiB
}

TEST(PlanChunks, EveryChunkAtMostTheLimitAndTheyTile) {
  std::mt19937_64 rng(cxlkv::testing::TestSeed());
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t align = 4096ull << (rng() % 19);  // 4 KiB .. 1 GiB
    const std::uint64_t max = align * (1 + rng() % 64) + rng() % align;
    // Up to ~1,000 chunks, sizes in pages.
    const std::uint64_t bytes = 4096 * (1 + rng() % (max / 4096 * (1 + rng() % 1000)));
    auto c = PlanChunks(bytes, align, max);
    ASSERT_TRUE(c.ok()) << c.status();
    std::uint64_t off = 0;
    for (const ChunkPlan& p : *c) {
      ASSERT_EQ(p.offset, off);
      ASSERT_GT(p.bytes, 0u);
      ASSERT_LE(p.bytes, max);
      ASSERT_EQ(p.offset % align, 0u);
      off += p.bytes;
    }
    ASSERT_EQ(off, bytes);
  }
}

TEST(PlanRampChunks, DoublesFromTheFirstChunkToTheLimit) {
  auto c = PlanRampChunks(100 * kGiB + 2 * kMiB, 2 * kMiB, kGiB);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::uint64_t> sizes;
  for (const ChunkPlan& p : *c) sizes.push_back(p.bytes);
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{kGiB, 2 * kGiB, 4 * kGiB, 8 * kGiB, 16 * kGiB,
                                               32 * kGiB, 37 * kGiB + 2 * kMiB}));
  // Past the limit the chunks stay at the limit.
  auto big = PlanRampChunks(300 * kGiB, 4096, 16 * kGiB);
  ASSERT_TRUE(big.ok());
  sizes.clear();
  for (const ChunkPlan& p : *big) sizes.push_back(p.bytes);
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{16 * kGiB, 32 * kGiB, 64 * kGiB, 64 * kGiB,
                                               64 * kGiB, 60 * kGiB}));
  // 0, or a first chunk at the limit: PlanChunks.
  EXPECT_EQ(*PlanRampChunks(100 * kGiB, 4096, 0), *PlanChunks(100 * kGiB, 4096));
  EXPECT_EQ(*PlanRampChunks(100 * kGiB, 4096, 64 * kGiB), *PlanChunks(100 * kGiB, 4096));
  EXPECT_EQ(PlanRampChunks(5000, 4096, kGiB).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanRampChunks, TilesOnAlignmentWithinTheLimit) {
  const std::uint64_t seed = cxlkv::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t align = 4096ull << (rng() % 19);  // 4 KiB .. 1 GiB
    const std::uint64_t max = align * (1 + rng() % 64);
    const std::uint64_t first = rng() % (2 * max);
    // At most ~200 chunks of the limit (plus the ramp), so the check stays fast.
    const std::uint64_t bytes = 4096 * (1 + rng() % (max / 4096 * 200));
    auto c = PlanRampChunks(bytes, align, first, max);
    ASSERT_TRUE(c.ok()) << c.status();
    std::uint64_t off = 0;
    for (std::size_t k = 0; k < c->size(); ++k) {
      const ChunkPlan& p = (*c)[k];
      ASSERT_EQ(p.offset, off);
      ASSERT_GT(p.bytes, 0u);
      ASSERT_LE(p.bytes, max);
      if (k + 1 < c->size()) {
        ASSERT_EQ(p.bytes % align, 0u) << "chunk " << k << " ends inside a device page";
        if (k > 0) {
          ASSERT_GE(p.bytes, (*c)[k - 1].bytes) << "chunks shrink at " << k;
        }
      }
      off += p.bytes;
    }
    ASSERT_EQ(off, bytes);
  }
}

// Pages of a memfd are resident (mincore) once WaitUntil covers them, and the bytes there
// are untouched: prefaulting an arena that holds data changes nothing in it.
TEST(Prefaulter, PopulatesInOrderWithoutChangingBytes) {
  const std::uint64_t bytes = 4 * Prefaulter::kPieceBytes + 8 * 4096;  // an odd last piece
  auto region = pool::OpenRegion("memfd:prefault-test?size=" + std::to_string(bytes));
  ASSERT_TRUE(region.ok()) << region.status();
  std::byte* base = (*region)->addr();
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  base[0] = std::byte{0x5a};          // data already there
  base[bytes - 1] = std::byte{0xa5};  // in the last page
  auto resident = [&](std::uint64_t off, std::uint64_t len) {
    std::vector<unsigned char> v(len / page);
    if (::mincore(base + off, len, v.data()) != 0) return std::uint64_t{0};
    std::uint64_t n = 0;
    for (unsigned char x : v) n += x & 1;
    return n * page;
  };
  // A cold memfd has no pages (only the two just written).
  ASSERT_LE(resident(0, bytes), 2 * page);
  {
    Prefaulter p(reinterpret_cast<std::uint64_t>(base), bytes, 3);
    p.WaitUntil(Prefaulter::kPieceBytes);
    if (!p.stopped_reason().empty()) GTEST_SKIP() << "prefault unavailable: " << p.stopped_reason();
    EXPECT_EQ(resident(0, Prefaulter::kPieceBytes), Prefaulter::kPieceBytes);
    p.WaitUntil(bytes);
    EXPECT_EQ(resident(0, bytes), bytes);
    EXPECT_EQ(p.bytes_populated(), bytes);
  }
  EXPECT_EQ(base[0], std::byte{0x5a});
  EXPECT_EQ(base[bytes - 1], std::byte{0xa5});
  EXPECT_EQ(base[bytes / 2], std::byte{0});
}

// A range the kernel cannot populate ends prefaulting with the reason; WaitUntil returns.
TEST(Prefaulter, AnUnpopulatableRangeEndsWithTheReason) {
  void* p =
      ::mmap(nullptr, 2 * Prefaulter::kPieceBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  {
    Prefaulter pf(reinterpret_cast<std::uint64_t>(p), 2 * Prefaulter::kPieceBytes, 2);
    pf.WaitUntil(2 * Prefaulter::kPieceBytes);
    EXPECT_NE(pf.stopped_reason().find("MADV_POPULATE_WRITE"), std::string::npos)
        << pf.stopped_reason();
  }
  Prefaulter none(reinterpret_cast<std::uint64_t>(p), 2 * Prefaulter::kPieceBytes, 0);
  none.WaitUntil(2 * Prefaulter::kPieceBytes);  // no threads: returns at once
  EXPECT_EQ(none.stopped_reason(), "no prefault threads");
  ::munmap(p, 2 * Prefaulter::kPieceBytes);
}

TEST(PlanChunks, BadInputNamesTheValue) {
  EXPECT_EQ(PlanChunks(0, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(PlanChunks(5000, 4096).status().message().find("multiple of 4 KiB"), std::string::npos);
  EXPECT_NE(PlanChunks(kMiB, 3 * 4096).status().message().find("power of two"), std::string::npos);
  EXPECT_NE(PlanChunks(4 * kGiB, kGiB, kMiB).status().message().find("alignment"),
            std::string::npos);
}

// ---- registration bookkeeping -------------------------------------------------------------

TEST(RegistrationTable, TracksChunksProgressAndCost) {
  RegistrationTable t;
  const std::uint64_t base = 0x7f0000000000;
  auto id =
      t.Add("/dev/shm/pool0", MappingKind::kFileTmpfs, base, 130 * kGiB, 4096, kMaxChunkBytes, 100);
  ASSERT_TRUE(id.ok()) << id.status();
  const RegistrationInfo* r = t.Find(*id);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->state, RegState::kQueued);
  EXPECT_EQ(r->chunks.size(), 3u);  // 64 + 64 + 2 GiB

  // Nothing is pinned yet: a lookup says how far registration is.
  auto early = t.Lookup(base, 4096);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("0 of 3 chunks"), std::string::npos);

  t.ChunkDone(*id, base, 1000, 1000 + 64'000'000'000);  // 64 GiB in 64 s: 1 s/GiB
  EXPECT_EQ(r->state, RegState::kRegistering);
  EXPECT_EQ(r->bytes_done, 64 * kGiB);
  EXPECT_DOUBLE_EQ(r->NsPerGiB(), 1e9);
  EXPECT_TRUE(t.Lookup(base + 10 * kGiB, kMiB).ok());
  EXPECT_EQ(t.Lookup(base + 64 * kGiB, kMiB).status().code(), absl::StatusCode::kUnavailable);

  t.ChunkDone(*id, base + 64 * kGiB, 2000, 3000);
  t.ChunkDone(*id, base + 128 * kGiB + 0x1000, 4000, 5000);  // device addr may differ
  EXPECT_EQ(r->state, RegState::kRegistered);
  EXPECT_EQ(r->bytes_done, 130 * kGiB);
  EXPECT_EQ(r->started_ns, 1000);
  EXPECT_EQ(r->finished_ns, 5000);

  auto last = t.Lookup(base + 129 * kGiB, kMiB);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->chunk, 2u);
  EXPECT_EQ(last->chunk_host_begin, base + 128 * kGiB);
  EXPECT_EQ(last->chunk_host_end, base + 130 * kGiB);
  EXPECT_EQ(last->DeviceAddr(base + 129 * kGiB), base + 129 * kGiB + 0x1000);

  // A range across the 64 GiB boundary must be split there.
  auto across = t.Lookup(base + 64 * kGiB - 4096, 8192);
  EXPECT_EQ(across.status().code(), absl::StatusCode::kOutOfRange);
  // Outside every registration.
  EXPECT_EQ(t.Lookup(base + 130 * kGiB, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.Lookup(base - 1, 1).status().code(), absl::StatusCode::kNotFound);
}

// Ramped chunks (1, 2, 4, ... GiB) are not equal: a lookup finds the chunk by its offsets.
// The first chunks are usable while later ones are still pinning.
TEST(RegistrationTable, LooksUpRampedChunksByOffset) {
  RegistrationTable t;
  const std::uint64_t base = 0x7f0000000000;
  auto id = t.Add("memfd", MappingKind::kMemfd, base, 100 * kGiB, 4096, kMaxChunkBytes, 100, kGiB);
  ASSERT_TRUE(id.ok()) << id.status();
  const RegistrationInfo* r = t.Find(*id);
  ASSERT_EQ(r->chunks.size(), 7u);  // 1, 2, 4, 8, 16, 32, 37 GiB
  std::uint64_t dev = 0x10000000000;
  t.ChunkDone(*id, dev, 1000, 2000);                // chunk 0: [0, 1 GiB)
  t.ChunkDone(*id, dev + 0x100000000, 2000, 3000);  // chunk 1: [1, 3 GiB), device addr apart
  EXPECT_EQ(r->first_chunk_ns, 2000);
  auto a = t.Lookup(base + kGiB - kMiB, kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->chunk, 0u);
  auto b = t.Lookup(base + 2 * kGiB, kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->chunk, 1u);
  EXPECT_EQ(b->chunk_host_begin, base + kGiB);
  EXPECT_EQ(b->chunk_host_end, base + 3 * kGiB);
  EXPECT_EQ(b->DeviceAddr(base + 2 * kGiB), dev + 0x100000000 + kGiB);
  // Chunk 2 ([3, 7 GiB)) is not pinned yet.
  EXPECT_EQ(t.Lookup(base + 3 * kGiB, kMiB).status().code(), absl::StatusCode::kUnavailable);
  // Across the end of chunk 0.
  EXPECT_EQ(t.Lookup(base + kGiB - kMiB, 2 * kMiB).status().code(), absl::StatusCode::kOutOfRange);
  for (std::uint32_t c = 2; c < 7; ++c) t.ChunkDone(*id, dev + c * 0x1000000000, 3000, 4000);
  auto last = t.Lookup(base + 99 * kGiB, kMiB);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->chunk, 6u);
  EXPECT_EQ(last->chunk_host_begin, base + 63 * kGiB);
}

TEST(RegistrationTable, RefusesOverlapsAndNamesTheOther) {
  RegistrationTable t;
  const std::uint64_t a = 0x100000000;
  auto first = t.Add("/dev/dax0.0", MappingKind::kDevdax, a, 4 * kGiB, 2 * kMiB, kMaxChunkBytes, 0);
  ASSERT_TRUE(first.ok());
  auto same = t.Add("again", MappingKind::kHost, a, 4 * kGiB, 4096, kMaxChunkBytes, 0);
  EXPECT_EQ(same.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(same.status().message().find("#1"), std::string::npos);
  // Partial overlaps at either end and inside.
  for (auto [begin, bytes] :
       std::vector<std::pair<std::uint64_t, std::uint64_t>>{{a - kGiB, 2 * kGiB},
                                                            {a + 3 * kGiB, 2 * kGiB},
                                                            {a + kGiB, kGiB},
                                                            {a - kGiB, 8 * kGiB}}) {
    auto r = t.Add("x", MappingKind::kHost, begin, bytes, 4096, kMaxChunkBytes, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << begin;
    EXPECT_NE(r.status().message().find("/dev/dax0.0"), std::string::npos);
  }
  // Adjacent ranges are fine.
  EXPECT_TRUE(t.Add("below", MappingKind::kHost, a - kGiB, kGiB, 4096, kMaxChunkBytes, 0).ok());
  EXPECT_TRUE(t.Add("above", MappingKind::kHost, a + 4 * kGiB, kGiB, 4096, kMaxChunkBytes, 0).ok());
  EXPECT_EQ(t.size(), 3u);
  // Bad addresses.
  EXPECT_EQ(t.Add("null", MappingKind::kHost, 0, kGiB, 4096, kMaxChunkBytes, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Add("odd", MappingKind::kHost, a + 100 * kGiB + 1, kGiB, 4096, kMaxChunkBytes, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RegistrationTable, FailedAndUnregisteredFreeTheRange) {
  RegistrationTable t;
  const std::uint64_t a = 0x200000000;
  auto id = t.Add("file", MappingKind::kFileDisk, a, 2 * kGiB, 4096, kGiB, 0);
  ASSERT_TRUE(id.ok());
  t.ChunkDone(*id, a, 0, 10);
  t.Failed(*id, absl::UnimplementedError("refused"), 20);
  const RegistrationInfo* r = t.Find(*id);
  EXPECT_EQ(r->state, RegState::kFailed);
  EXPECT_EQ(r->chunks_done, 0u);  // rolled back
  EXPECT_EQ(t.Lookup(a, 1).status().code(), absl::StatusCode::kNotFound);
  // The range can be registered again; the failed record stays until erased.
  auto again = t.Add("file", MappingKind::kFileDisk, a, 2 * kGiB, 4096, kGiB, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *id);
  t.Erase(*id);
  EXPECT_EQ(t.Find(*id), nullptr);
  // A live registration is not erased; unregistering it frees the range.
  t.Erase(*again);
  ASSERT_NE(t.Find(*again), nullptr);
  t.Unregistered(*again);
  EXPECT_EQ(t.Find(*again)->state, RegState::kUnregistered);
  EXPECT_TRUE(t.Add("file", MappingKind::kFileDisk, a, 2 * kGiB, 4096, kGiB, 0).ok());
}

TEST(RegistrationTable, ManyRangesRandomOverlapAgainstABruteForceOracle) {
  std::mt19937_64 rng(cxlkv::testing::TestSeed());
  RegistrationTable t;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t b = (1 + rng() % 4096) * 4096;
    const std::uint64_t n = (1 + rng() % 64) * 4096;
    bool overlaps = false;
    for (auto [lb, ln] : live) overlaps |= b < lb + ln && lb < b + n;
    auto r = t.Add("r", MappingKind::kHost, b, n, 4096, kMaxChunkBytes, 0);
    ASSERT_EQ(r.ok(), !overlaps) << "range " << b << "+" << n << ": " << r.status();
    if (r.ok()) live.emplace_back(b, n);
  }
}

// ---- paged cache geometry -----------------------------------------------------------------

TEST(PagedCache, ContiguousAndLayerSeparateAddresses) {
  const PagedCache c = PagedCache::Contiguous(0x10000, 4, 2, 256, 10);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_EQ(c.BlockBytes(), 4u * 2 * 256);
  EXPECT_EQ(c.DeviceAddr(0, 0, 0), 0x10000u);
  EXPECT_EQ(c.DeviceAddr(0, 0, 1), 0x10000u + 256);
  EXPECT_EQ(c.DeviceAddr(0, 1, 0), 0x10000u + 512);
  EXPECT_EQ(c.DeviceAddr(3, 2, 1), 0x10000u + 3 * 2048 + 2 * 512 + 256);
  EXPECT_EQ(c.SpanBytes(), 10u * 2048);

  // vLLM: per layer [2][pages][chunk].
  const PagedCache v = PagedCache::LayerSeparate({0x100000, 0x900000}, 2, 512, 100);
  ASSERT_TRUE(v.Validate().ok()) << v.Validate();
  EXPECT_EQ(v.DeviceAddr(7, 1, 0), 0x900000u + 7 * 512);
  EXPECT_EQ(v.DeviceAddr(7, 1, 1), 0x900000u + 100 * 512 + 7 * 512);
  EXPECT_EQ(v.HostOffset(1, 1), 3u * 512);
}

TEST(PagedCache, ChunkBytesFollowTheModelLayout) {
  const pool::KvLayout l = pool::Llama3_70B();  // 80 layers, 8 heads, 128 dim, fp16, 16 tokens
  EXPECT_EQ(PagedCache::ChunkBytesOf(l, 2), 8u * 128 * 2 * 16);
  const PagedCache c =
      PagedCache::Contiguous(0x1000, l.layers, 2, PagedCache::ChunkBytesOf(l, 2), 4);
  EXPECT_EQ(c.BlockBytes(), l.BlockBytes());
  const PagedCache one =
      PagedCache::Contiguous(0x1000, l.layers, 1, PagedCache::ChunkBytesOf(l, 1), 4);
  EXPECT_EQ(one.BlockBytes(), l.BlockBytes());
}

TEST(PagedCache, ValidateRejectsOverlapsAndBadFields) {
  PagedCache c = PagedCache::LayerSeparate({0x100000, 0x100000 + 1024}, 2, 512, 100);
  auto st = c.Validate();  // layer 1 starts inside layer 0's K half
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st;

  c = PagedCache::Contiguous(0x1000, 2, 2, 256, 4);
  c.page_stride_bytes = 512;  // pages on top of each other's layers
  EXPECT_FALSE(c.Validate().ok());
  c = PagedCache::Contiguous(0x1000, 2, 3, 256, 4);
  EXPECT_NE(c.Validate().message().find("kv_parts"), std::string::npos);
  c = PagedCache::Contiguous(0x1000, 2, 2, 100, 4);
  EXPECT_NE(c.Validate().message().find("chunk_bytes"), std::string::npos);
  c = PagedCache::Contiguous(0x1000, 2, 2, 256, 4);
  c.layer_base.pop_back();
  EXPECT_NE(c.Validate().message().find("layer bases"), std::string::npos);
  c = PagedCache::Contiguous(0x1008, 2, 2, 256, 4);
  EXPECT_NE(c.Validate().message().find("16-byte"), std::string::npos);
  c = PagedCache::Contiguous(0x1000, 0, 2, 256, 4);
  EXPECT_FALSE(c.Validate().ok());
  c = PagedCache::Contiguous(0x1000, 2, 2, 256, 0);
  EXPECT_NE(c.Validate().message().find("page_count"), std::string::npos);
  // Interleaved layers at one stride are fine (KV of one page side by side).
  c = PagedCache::Contiguous(0x1000, 8, 2, 256, 1);
  EXPECT_TRUE(c.Validate().ok());
}

// ---- copy planning ------------------------------------------------------------------------

// Applies a plan to byte images of the host and device address ranges.
struct Images {
  std::uint64_t host_base, dev_base;
  std::vector<std::uint8_t> host, dev;
  std::uint8_t* At(std::uint64_t a) {
    if (a >= host_base && a < host_base + host.size()) return &host[a - host_base];
    return &dev[a - dev_base];
  }
  void Apply(const CopyPlan& p) {
    for (const CopyOp& op : p.ops) std::memmove(At(op.dst), At(op.src), op.bytes);
  }
};

// Reference: every (block, layer, part) piece copied on its own.
void Reference(Images& im, const PagedCache& c, Direction d, const std::vector<BlockCopy>& bs,
               std::uint32_t lb, std::uint32_t le) {
  for (const BlockCopy& b : bs) {
    for (std::uint32_t l = lb; l < le; ++l) {
      for (std::uint32_t k = 0; k < c.kv_parts; ++k) {
        std::uint8_t* h = im.At(b.host_addr + c.HostOffset(l, k));
        std::uint8_t* v = im.At(c.DeviceAddr(b.page, l, k));
        if (d == Direction::kHostToDevice) {
          std::memcpy(v, h, c.chunk_bytes);
        } else {
          std::memcpy(h, v, c.chunk_bytes);
        }
      }
    }
  }
}

TEST(PlanCopies, ContiguousRunsCoalesceIntoOneCopy) {
  const std::uint64_t host = 0x7f0000000000, dev = 0x600000000;
  const PagedCache c = PagedCache::Contiguous(dev, 4, 2, 4096, 64);
  std::vector<BlockCopy> bs;
  for (std::uint32_t i = 0; i < 16; ++i) bs.push_back({host + i * c.BlockBytes(), 8 + i});
  auto p = PlanCopies(c, Direction::kHostToDevice, bs, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->segments, 16u * 4 * 2);
  ASSERT_EQ(p->ops.size(), 1u);
  EXPECT_EQ(p->ops[0], (CopyOp{host, dev + 8 * c.BlockBytes(), 16 * c.BlockBytes()}));
  EXPECT_EQ(p->bytes, 16 * c.BlockBytes());
  // The same list in reverse order coalesces as well (ops are sorted by source).
  std::reverse(bs.begin(), bs.end());
  auto r = PlanCopies(c, Direction::kHostToDevice, bs, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ops, p->ops);
}

TEST(PlanCopies, BreaksRunsWherePagesOrBlocksAreNotAdjacent) {
  const std::uint64_t host = 0x7f0000000000, dev = 0x600000000;
  const PagedCache c = PagedCache::Contiguous(dev, 2, 1, 1024, 64);
  const std::uint64_t B = c.BlockBytes();
  const std::vector<BlockCopy> bs = {{host, 0},
                                     {host + B, 1},       // run 1
                                     {host + 2 * B, 5},   // page gap
                                     {host + 4 * B, 6},   // host gap
                                     {host + 5 * B, 7}};  // joins the previous
  auto p = PlanCopies(c, Direction::kHostToDevice, bs, {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ops, (std::vector<CopyOp>{{host, dev, 2 * B},
                                         {host + 2 * B, dev + 5 * B, B},
                                         {host + 4 * B, dev + 6 * B, 2 * B}}));
}

TEST(PlanCopies, LayerSeparateGivesOneCopyPerLayerPartRun) {
  const std::uint64_t host = 0x7f0000000000;
  const PagedCache c = PagedCache::LayerSeparate({0x100000, 0x200000, 0x300000}, 2, 512, 64);
  std::vector<BlockCopy> bs;
  for (std::uint32_t i = 0; i < 10; ++i) bs.push_back({host + i * c.BlockBytes(), 20 + i});
  auto p = PlanCopies(c, Direction::kHostToDevice, bs, {});
  ASSERT_TRUE(p.ok());
  // Host pieces of one (layer, part) are one block apart: no host-side run to join.
  EXPECT_EQ(p->ops.size(), 10u * 3 * 2);
  // A layer range plans only those layers.
  PlanOptions one;
  one.layer_begin = 1;
  one.layer_end = 2;
  auto l1 = PlanCopies(c, Direction::kHostToDevice, bs, one);
  ASSERT_TRUE(l1.ok());
  EXPECT_EQ(l1->ops.size(), 10u * 2);
  for (const CopyOp& op : l1->ops) {
    EXPECT_GE(op.dst, 0x200000u);
    EXPECT_LT(op.dst, 0x300000u);
  }
}

TEST(PlanCopies, SplitsAtPinnedChunkEndsAndTheOpLimit) {
  const std::uint64_t host = 0x7f0000000000, dev = 0x600000000;
  const PagedCache c = PagedCache::Contiguous(dev, 1, 1, 64 * kKiB, 64);
  std::vector<BlockCopy> bs;
  for (std::uint32_t i = 0; i < 8; ++i) bs.push_back({host + i * 64 * kKiB, i});
  PlanOptions o;
  // Chunks end every 96 KiB: block 1 straddles the first boundary.
  o.host_chunk_end = [&](std::uint64_t a) {
    return host + ((a - host) / (96 * kKiB) + 1) * 96 * kKiB;
  };
  auto p = PlanCopies(c, Direction::kHostToDevice, bs, o);
  ASSERT_TRUE(p.ok());
  std::uint64_t total = 0;
  for (const CopyOp& op : p->ops) {
    const std::uint64_t end = o.host_chunk_end(op.src);
    EXPECT_LE(op.src + op.bytes, end) << "op crosses a chunk end";
    total += op.bytes;
  }
  EXPECT_EQ(total, 8 * 64 * kKiB);
  EXPECT_EQ(p->ops.size(), 6u);  // 512 KiB in 96 KiB chunks: 5 full + 32 KiB
  o.max_op_bytes = 32 * kKiB;
  auto q = PlanCopies(c, Direction::kHostToDevice, bs, o);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->ops.size(), 16u);
  for (const CopyOp& op : q->ops) EXPECT_LE(op.bytes, 32 * kKiB);
}

TEST(PlanCopies, ValidationNamesTheEntries) {
  const PagedCache c = PagedCache::Contiguous(0x600000000, 2, 2, 256, 8);
  const std::uint64_t B = c.BlockBytes();
  auto dup = PlanCopies(c, Direction::kHostToDevice,
                        std::vector<BlockCopy>{{0x10000, 3}, {0x20000, 1}, {0x30000, 3}}, {});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("entries 0 and 2"), std::string::npos) << dup.status();
  EXPECT_NE(dup.status().message().find("page 3"), std::string::npos);
  // The same page twice is fine when reading it out into two blocks.
  EXPECT_TRUE(PlanCopies(c, Direction::kDeviceToHost,
                         std::vector<BlockCopy>{{0x10000, 3}, {0x20000, 3}}, {})
                  .ok());
  auto overlap = PlanCopies(c, Direction::kDeviceToHost,
                            std::vector<BlockCopy>{{0x10000, 1}, {0x10000 + B - 16, 2}}, {});
  EXPECT_NE(overlap.status().message().find("overlapping host blocks"), std::string::npos);
  auto page = PlanCopies(c, Direction::kHostToDevice, std::vector<BlockCopy>{{0x10000, 8}}, {});
  EXPECT_NE(page.status().message().find("entry 0: page 8"), std::string::npos);
  auto null = PlanCopies(c, Direction::kHostToDevice, std::vector<BlockCopy>{{0, 1}}, {});
  EXPECT_NE(null.status().message().find("non-null"), std::string::npos);
  auto odd = PlanCopies(c, Direction::kHostToDevice, std::vector<BlockCopy>{{0x10008, 1}}, {});
  EXPECT_NE(odd.status().message().find("16-byte"), std::string::npos);
  PlanOptions o;
  o.layer_begin = 1;
  o.layer_end = 3;
  auto layers = PlanCopies(c, Direction::kHostToDevice, std::vector<BlockCopy>{{0x10000, 1}}, o);
  EXPECT_NE(layers.status().message().find("layer range"), std::string::npos);
  // An empty list is a valid, empty plan.
  auto empty = PlanCopies(c, Direction::kHostToDevice, std::vector<BlockCopy>{}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->ops.empty());
}

// Random block lists on random geometries: the coalesced plan moves exactly the bytes the
// piece-by-piece reference moves, in both directions.
TEST(PlanCopies, MatchesPieceByPieceReferenceOnRandomLists) {
  const std::uint64_t seed = cxlkv::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng64(seed);
  auto rng = [&] { return static_cast<std::uint32_t>(rng64()); };
  for (int iter = 0; iter < 200; ++iter) {
    const testing::RandomCopies rc = testing::MakeRandomCopies(rng64, 5);
    const PagedCache& c = rc.cache;
    ASSERT_TRUE(c.Validate().ok()) << c.Validate();
    const std::uint64_t host_base = testing::RandomCopies::kHostBase;
    const std::uint64_t dev_base = testing::RandomCopies::kDevBase;
    const std::uint32_t layers = c.layers, kv = c.kv_parts, pages = c.page_count;
    const std::uint64_t chunk = c.chunk_bytes, B = c.BlockBytes();
    const std::uint32_t host_blocks = rc.host_blocks;
    const std::uint32_t n = static_cast<std::uint32_t>(rc.blocks.size());
    const std::vector<BlockCopy>& bs = rc.blocks;
    const Direction d = rng() % 2 ? Direction::kHostToDevice : Direction::kDeviceToHost;
    PlanOptions o;
    o.layer_begin = rc.layer_begin;
    o.layer_end = rc.layer_end;
    if (rng() % 2) o.max_op_bytes = 16 * (1 + rng() % 64);
    const std::uint64_t chunk_span = 4096 * (1 + rng() % 4);
    if (rng() % 2) {
      o.host_chunk_end = [&](std::uint64_t a) {
        return host_base + ((a - host_base) / chunk_span + 1) * chunk_span;
      };
    }
    auto p = PlanCopies(c, d, bs, o);
    ASSERT_TRUE(p.ok()) << p.status();

    Images got{host_base, dev_base, std::vector<std::uint8_t>(host_blocks * B),
               std::vector<std::uint8_t>(c.SpanBytes() + layers * kv * pages * chunk)};
    for (auto& v : got.host) v = static_cast<std::uint8_t>(rng());
    for (auto& v : got.dev) v = static_cast<std::uint8_t>(rng());
    Images want = got;
    got.Apply(*p);
    Reference(want, c, d, bs, o.layer_begin, o.layer_end);
    ASSERT_EQ(got.host, want.host) << "iteration " << iter;
    ASSERT_EQ(got.dev, want.dev) << "iteration " << iter;
    std::uint64_t moved = 0;
    for (const CopyOp& op : p->ops) {
      moved += op.bytes;
      if (o.max_op_bytes) {
        ASSERT_LE(op.bytes, o.max_op_bytes);
      }
      if (o.host_chunk_end) {
        const std::uint64_t h = d == Direction::kHostToDevice ? op.src : op.dst;
        ASSERT_LE(h + op.bytes, o.host_chunk_end(h));
      }
    }
    ASSERT_EQ(moved, p->bytes);
    ASSERT_EQ(p->bytes, n * (o.layer_end - o.layer_begin) * kv * chunk);
    ASSERT_LE(p->ops.size(), p->segments * (o.max_op_bytes || o.host_chunk_end ? 64 : 1));
  }
}

TEST(Names, EveryKindHasAHint) {
  for (MappingKind k : {MappingKind::kDevdax, MappingKind::kKmem, MappingKind::kMemfd,
                        MappingKind::kFileTmpfs, MappingKind::kFileDisk, MappingKind::kHost}) {
    EXPECT_FALSE(MappingKindName(k).empty());
    EXPECT_GT(RefusalHint(k).size(), 20u);
  }
  EXPECT_EQ(RegStateName(RegState::kRegistered), "registered");
  EXPECT_EQ(DirectionName(Direction::kDeviceToHost), "device-to-host");
}

}  // namespace
}  // namespace cxlkv::gpu
