// gpu/ on a real GPU (ctest label `gpu`): registration of each arena type, copies both ways
// with checksums, the gather/scatter kernel against a host reference, layer-wise pipeline
// order, a refused chunk rolled back, a 100+ GiB arena registered in 64 GiB chunks, and the
// write-back of the host lines a device-to-host copy wrote before its ticket completes (the
// binary is linked with the cache-call recorder, tests/cache_recorder.h).
// Without a CUDA device every test skips with cudaGetDeviceCount's reason.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache_recorder.h"
#include "cxlkv/gpu/copy_engine.h"
#include "cxlkv/gpu/registrar.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::gpu {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;

#define ASSERT_CUDA(expr)                                                       \
  do {                                                                          \
    const cudaError_t e_ = (expr);                                              \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << ": " \
                               << cudaGetErrorString(e_);                       \
  } while (0)

std::uint64_t Fnv(const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void Fill(void* p, std::size_t n, std::mt19937_64& rng) {
  auto* w = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < n / 8; ++i) w[i] = rng();
}

// Device memory freed at scope end.
struct DeviceBuffer {
  void* p = nullptr;
  std::uint64_t bytes = 0;
  explicit DeviceBuffer(std::uint64_t n) : bytes(n) {
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(p); }
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status st = ProbeDevice(0);
    if (!st.ok()) GTEST_SKIP() << "no GPU to test on: " << st.message();
    seed_ = cxlkv::testing::TestSeed();
    rng_.seed(seed_);
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }
  std::unique_ptr<Registrar> MakeRegistrar(std::uint64_t max_chunk = kMaxChunkBytes) {
    RegistrarOptions o;
    o.max_chunk_bytes = max_chunk;
    auto r = Registrar::Create(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }
  // A region of `spec`, registered and waited for; its status, or OK.
  absl::Status RegisterAndWait(Registrar& reg, const pool::Region& region, std::uint64_t* id) {
    auto r = reg.RegisterRegion(region);
    if (!r.ok()) return r.status();
    *id = *r;
    return reg.Wait(*r);
  }
  // Round trip through the device: blocks -> pages -> other blocks, checksummed.
  void RoundTrip(Registrar& reg, std::byte* base, std::uint64_t bytes, CopyMethod method) {
    auto engine = CopyEngine::Create(reg);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const PagedCache shape = PagedCache::Contiguous(0x1000, 4, 2, 4096, 16);
    const std::uint64_t B = shape.BlockBytes();  // 32 KiB
    const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::uint64_t>(16, bytes / B / 2));
    ASSERT_GT(n, 0u);
    DeviceBuffer dev(shape.page_count * B);
    ASSERT_NE(dev.p, nullptr);
    const PagedCache cache = PagedCache::Contiguous(dev.addr(), 4, 2, 4096, 16);
    std::vector<BlockCopy> in, out;
    std::vector<std::uint64_t> sums;
    for (std::uint32_t i = 0; i < n; ++i) {
      std::byte* src = base + i * B;
      Fill(src, B, rng_);
      sums.push_back(Fnv(src, B));
      in.push_back({reinterpret_cast<std::uintptr_t>(src), n - 1 - i});
      std::byte* dst = base + bytes - (i + 1) * B;
      std::memset(dst, 0, B);
      out.push_back({reinterpret_cast<std::uintptr_t>(dst), n - 1 - i});
    }
    SubmitOptions so;
    so.method = method;
    auto t1 = (*engine)->Submit(cache, Direction::kHostToDevice, in, so);
    ASSERT_TRUE(t1.ok()) << t1.status();
    // The directions have their own streams: the store waits for the load on the device.
    ASSERT_TRUE((*engine)->StreamWait(*t1, (*engine)->stream(Direction::kDeviceToHost)).ok());
    auto t2 = (*engine)->Submit(cache, Direction::kDeviceToHost, out, so);
    ASSERT_TRUE(t2.ok()) << t2.status();
    ASSERT_TRUE((*engine)->Wait(*t2).ok());
    EXPECT_TRUE((*engine)->Poll(*t1).ok());
    for (std::uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ(Fnv(reinterpret_cast<void*>(out[i].host_addr), B), sums[i]) << "block " << i;
    }
  }

  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(GpuTest, RegistersMemfdArena) {
  auto reg = MakeRegistrar(16 * kMiB);
  ASSERT_NE(reg, nullptr);
  auto region = pool::OpenRegion("memfd:gpu-test?size=64M");
  ASSERT_TRUE(region.ok()) << region.status();
  std::uint64_t id = 0;
  ASSERT_TRUE(RegisterAndWait(*reg, **region, &id).ok());
  auto info = reg->Info(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, RegState::kRegistered);
  EXPECT_EQ(info->kind, MappingKind::kMemfd);
  EXPECT_EQ(info->chunks.size(), 4u);
  EXPECT_EQ(info->chunks_done, 4u);
  EXPECT_EQ(info->bytes_done, 64 * kMiB);
  EXPECT_GT(info->NsPerGiB(), 0);
  std::printf("memfd 64 MiB in 4 chunks: %.1f ms per GiB\n", info->NsPerGiB() / 1e6);
  // Zero-copy pointers exist for every chunk.
  for (std::uint64_t off : {std::uint64_t{0}, 20 * kMiB, 64 * kMiB - 4096}) {
    auto p = reg->DevicePointer((*region)->addr() + off);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(*p, nullptr);
  }
  // The same range again, or a part of it: refused with the registration named.
  EXPECT_EQ(reg->RegisterRegion(**region).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(reg->RegisterRange((*region)->addr() + 4096, 4096, "part").status().code(),
            absl::StatusCode::kFailedPrecondition);
  RoundTrip(*reg, (*region)->addr(), (*region)->size_bytes(), CopyMethod::kCopyEngine);
  RoundTrip(*reg, (*region)->addr(), (*region)->size_bytes(), CopyMethod::kKernel);
  ASSERT_TRUE(reg->Unregister(id).ok());
  EXPECT_EQ(reg->Lookup((*region)->addr(), 1).status().code(), absl::StatusCode::kNotFound);
  // Unpinned for real: the driver accepts the range again.
  ASSERT_CUDA(cudaHostRegister((*region)->addr(), 4096, cudaHostRegisterDefault));
  ASSERT_CUDA(cudaHostUnregister((*region)->addr()));
}

TEST_F(GpuTest, RegistersFormattedArenaInTmpfsFile) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  cxlkv::testing::ShmPath path("gpu");
  pool::FormatOptions fo;
  fo.layout = pool::KvLayout{4, 2, 64, 2, 16, pool::KvLayoutKind::kContiguous};
  auto arena = pool::Arena::Format(cxlkv::testing::MustOpen(path.spec("32M")), fo);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto id = reg->RegisterArena(**arena);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(reg->Wait(*id).ok());
  EXPECT_EQ(reg->Info(*id)->kind, MappingKind::kFileTmpfs);
  const pool::Region& r = (*arena)->region();
  // Blocks from the arena's data area: leave the header alone.
  const std::uint64_t data = (*arena)->class_record(0).data_offset;
  RoundTrip(*reg, r.addr() + data, r.size_bytes() - data, CopyMethod::kCopyEngine);
}

TEST_F(GpuTest, DiskFileArenaRegistersOrIsRefusedWithTheFix) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  const char* tmp = std::getenv("CXLKV_TEST_DISK_DIR");
  const std::string path =
      std::string(tmp ? tmp : "/var/tmp") + "/cxlkv-gpu-test-" + std::to_string(::getpid());
  auto region = pool::OpenRegion("file:" + path + "?size=16M");
  ::unlink(path.c_str());
  ASSERT_TRUE(region.ok()) << region.status();
  std::uint64_t id = 0;
  const absl::Status st = RegisterAndWait(*reg, **region, &id);
  auto info = reg->Info(id);
  ASSERT_TRUE(info.ok());
  if (info->kind != MappingKind::kFileDisk) GTEST_SKIP() << path << " is on tmpfs";
  if (st.ok()) {
    std::printf("this driver/kernel pins shared file pages on disk file systems\n");
    RoundTrip(*reg, (*region)->addr(), (*region)->size_bytes(), CopyMethod::kCopyEngine);
  } else {
    std::printf("refused, as reported: %s\n", std::string(st.message()).c_str());
    EXPECT_NE(st.message().find("file on a disk file system"), std::string::npos) << st;
    EXPECT_NE(st.message().find(RefusalHint(MappingKind::kFileDisk)), std::string::npos);
    EXPECT_EQ(info->state, RegState::kFailed);
  }
}

TEST_F(GpuTest, RegistersKmemArena) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  // The highest memory node: the CXL node when there is one; node 0 exercises the same
  // mapping (shmem bound with mbind) elsewhere.
  absl::StatusOr<std::unique_ptr<pool::Region>> region = absl::NotFoundError("no node");
  for (int node = 8; node >= 0 && !region.ok(); --node) {
    region = pool::OpenRegion("kmem:node=" + std::to_string(node) + "?size=32M");
  }
  if (!region.ok()) GTEST_SKIP() << "no kmem source: " << region.status();
  std::uint64_t id = 0;
  const absl::Status st = RegisterAndWait(*reg, **region, &id);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(reg->Info(id)->kind, MappingKind::kKmem);
  RoundTrip(*reg, (*region)->addr(), (*region)->size_bytes(), CopyMethod::kKernel);
}

TEST_F(GpuTest, RegistersDevdaxWhenPresent) {
  const char* dev = std::getenv("CXLKV_TEST_DEVDAX");
  const std::string path = dev ? dev : "/dev/dax0.0";
  if (::access(path.c_str(), R_OK | W_OK) != 0) {
    GTEST_SKIP() << path << " is not present (set CXLKV_TEST_DEVDAX=/dev/daxX.Y)";
  }
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  auto region = pool::OpenRegion("devdax:" + path);
  ASSERT_TRUE(region.ok()) << region.status();
  std::uint64_t id = 0;
  const absl::Status st = RegisterAndWait(*reg, **region, &id);
  if (!st.ok()) {
    // A refusal must say so, with the devdax fix.
    EXPECT_NE(st.message().find(RefusalHint(MappingKind::kDevdax)), std::string::npos) << st;
    GTEST_SKIP() << "the driver refuses devdax here: " << st.message();
  }
  for (const ChunkPlan& c : reg->Info(id)->chunks) {
    EXPECT_EQ(c.offset % (*region)->alignment(), 0u);
  }
  RoundTrip(*reg, (*region)->addr(), std::min<std::uint64_t>((*region)->size_bytes(), kGiB),
            CopyMethod::kCopyEngine);
}

TEST_F(GpuTest, RefusedChunkRollsBackTheChunksBeforeIt) {
  auto reg = MakeRegistrar(4 * kMiB);
  ASSERT_NE(reg, nullptr);
  // Three chunks; the third is not mapped, so the driver must refuse it.
  void* p = ::mmap(nullptr, 12 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* base = static_cast<std::byte*>(p);
  ASSERT_EQ(::munmap(base + 8 * kMiB, 4 * kMiB), 0);
  auto id = reg->RegisterRange(base, 12 * kMiB, "test range");
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Status st = reg->Wait(*id);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("test range"), std::string::npos) << st;
  EXPECT_NE(st.message().find("chunk 2 of 3"), std::string::npos) << st;
  EXPECT_EQ(reg->Info(*id)->state, RegState::kFailed);
  // Chunks 0 and 1 were unpinned: the driver accepts them again.
  ASSERT_CUDA(cudaHostRegister(base, 8 * kMiB, cudaHostRegisterDefault));
  ASSERT_CUDA(cudaHostUnregister(base));
  ASSERT_TRUE(reg->Unregister(*id).ok());
  ::munmap(base, 8 * kMiB);
}

// The gather/scatter kernel and the DMA path against a reference built on the host from
// the cache geometry, for contiguous and layer-separate caches, both directions.
TEST_F(GpuTest, GatherScatterMatchesHostReference) {
  auto reg = MakeRegistrar(8 * kMiB);  // blocks straddle chunk ends
  ASSERT_NE(reg, nullptr);
  auto region = pool::OpenRegion("memfd:gpu-gather?size=64M");
  ASSERT_TRUE(region.ok());
  std::uint64_t id = 0;
  ASSERT_TRUE(RegisterAndWait(*reg, **region, &id).ok());
  auto engine = CopyEngine::Create(*reg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::byte* host = (*region)->addr();

  const std::uint32_t layers = 6, pages = 96, n = 64;
  for (std::uint32_t kv : {1u, 2u}) {
    for (bool separate : {false, true}) {
      for (CopyMethod m : {CopyMethod::kKernel, CopyMethod::kCopyEngine}) {
        SCOPED_TRACE(::testing::Message() << "kv " << kv << " separate " << separate << " method "
                                          << static_cast<int>(m));
        const std::uint64_t chunk = 3 * 1024 + 16 * (rng_() % 8);  // odd sizes too
        const std::uint64_t span = std::uint64_t{layers} * kv * chunk * pages;
        DeviceBuffer dev(span);
        ASSERT_NE(dev.p, nullptr);
        PagedCache c;
        if (separate) {
          std::vector<std::uint64_t> bases;
          for (std::uint32_t l = 0; l < layers; ++l)
            bases.push_back(dev.addr() + l * kv * chunk * pages);
          c = PagedCache::LayerSeparate(bases, kv, chunk, pages);
        } else {
          c = PagedCache::Contiguous(dev.addr(), layers, kv, chunk, pages);
        }
        ASSERT_TRUE(c.Validate().ok());
        const std::uint64_t B = c.BlockBytes();
        // Scattered host blocks (16-byte aligned, random gaps) and random pages.
        std::vector<std::uint32_t> page_ids(pages);
        std::iota(page_ids.begin(), page_ids.end(), 0u);
        std::shuffle(page_ids.begin(), page_ids.end(), rng_);
        std::vector<BlockCopy> blocks;
        // Start just below the first 8 MiB chunk end, so some blocks straddle it.
        std::uint64_t off = 8 * kMiB - 4 * B;
        for (std::uint32_t i = 0; i < n; ++i) {
          off += 16 * (rng_() % 1024);
          blocks.push_back({reinterpret_cast<std::uintptr_t>(host) + off, page_ids[i]});
          off += B;
        }
        ASSERT_LE(off, (*region)->size_bytes());
        Fill(host + 8 * kMiB - 4 * B, off - (8 * kMiB - 4 * B), rng_);
        std::vector<std::uint8_t> image(span);
        Fill(image.data(), span, rng_);
        ASSERT_CUDA(cudaMemcpy(dev.p, image.data(), span, cudaMemcpyHostToDevice));
        // Reference: each piece placed by the geometry formulas.
        std::vector<std::uint8_t> want = image;
        for (const BlockCopy& b : blocks) {
          for (std::uint32_t l = 0; l < layers; ++l) {
            for (std::uint32_t k = 0; k < kv; ++k) {
              std::memcpy(&want[c.DeviceAddr(b.page, l, k) - dev.addr()],
                          reinterpret_cast<const void*>(b.host_addr + c.HostOffset(l, k)), chunk);
            }
          }
        }
        SubmitOptions so;
        so.method = m;
        auto t = (*engine)->Submit(c, Direction::kHostToDevice, blocks, so);
        if (m == CopyMethod::kKernel && !reg->host_pointer_is_device_pointer()) {
          // Blocks across two registrations have no single device address here.
          EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
          continue;
        }
        ASSERT_TRUE(t.ok()) << t.status();
        ASSERT_TRUE((*engine)->Wait(*t).ok());
        std::vector<std::uint8_t> got(span);
        ASSERT_CUDA(cudaMemcpy(got.data(), dev.p, span, cudaMemcpyDeviceToHost));
        ASSERT_TRUE(got == want) << "device image differs from the host reference";

        // Scatter back into the same host blocks, cleared first, and compare piece by piece.
        const std::vector<BlockCopy>& back = blocks;
        for (const BlockCopy& b : back) std::memset(reinterpret_cast<void*>(b.host_addr), 0, B);
        auto t2 = (*engine)->Submit(c, Direction::kDeviceToHost, back, so);
        ASSERT_TRUE(t2.ok()) << t2.status();
        ASSERT_TRUE((*engine)->Wait(*t2).ok());
        for (const BlockCopy& b : back) {
          for (std::uint32_t l = 0; l < layers; ++l) {
            for (std::uint32_t k = 0; k < kv; ++k) {
              ASSERT_EQ(std::memcmp(reinterpret_cast<const void*>(b.host_addr + c.HostOffset(l, k)),
                                    &want[c.DeviceAddr(b.page, l, k) - dev.addr()], chunk),
                        0)
                  << "page " << b.page << " layer " << l << " part " << k;
            }
          }
        }
      }
    }
  }
  const CopyEngineStats s = (*engine)->stats();
  EXPECT_GT(s.kernel_launches, 0u);
  EXPECT_GT(s.memcpy_ops, 0u);
}

// Layer i's compute waits for layer i's load only: the snapshot a compute stream takes right
// after StreamWait holds the loaded data, and tickets complete in layer order.
TEST_F(GpuTest, LayerwisePipelineOrder) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  const std::uint32_t layers = 8, n = 128;
  const std::uint64_t chunk = 128 * 1024;  // 32 MiB per layer: ~1 ms over PCIe
  auto region = pool::OpenRegion(
      "memfd:gpu-layers?size=" + std::to_string(n * layers * 2 * chunk / kMiB + 1) + "M");
  ASSERT_TRUE(region.ok()) << region.status();
  std::uint64_t id = 0;
  ASSERT_TRUE(RegisterAndWait(*reg, **region, &id).ok());
  auto engine = CopyEngine::Create(*reg);
  ASSERT_TRUE(engine.ok());
  const std::uint64_t layer_bytes = 2 * chunk * n;
  DeviceBuffer cache_mem(layers * layer_bytes), snap(layers * layer_bytes), early(layer_bytes);
  ASSERT_TRUE(cache_mem.p && snap.p && early.p);
  std::vector<std::uint64_t> bases;
  for (std::uint32_t l = 0; l < layers; ++l) bases.push_back(cache_mem.addr() + l * layer_bytes);
  const PagedCache c = PagedCache::LayerSeparate(bases, 2, chunk, n);
  std::vector<BlockCopy> blocks;
  for (std::uint32_t i = 0; i < n; ++i) {
    blocks.push_back({reinterpret_cast<std::uintptr_t>((*region)->addr()) + i * c.BlockBytes(), i});
  }
  Fill((*region)->addr(), n * c.BlockBytes(), rng_);
  for (CopyMethod m : {CopyMethod::kCopyEngine, CopyMethod::kKernel}) {
    SCOPED_TRACE(static_cast<int>(m));
    ASSERT_CUDA(cudaMemset(cache_mem.p, 0, layers * layer_bytes));
    ASSERT_CUDA(cudaMemset(snap.p, 0, layers * layer_bytes));
    cudaStream_t compute;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    auto tickets = (*engine)->SubmitLayers(c, blocks, m);
    ASSERT_TRUE(tickets.ok()) << tickets.status();
    ASSERT_EQ(tickets->size(), layers);
    // Control: the last layer read without waiting is not loaded yet (the copies of the
    // layers before it take milliseconds), which shows this test can see a missing wait.
    ASSERT_CUDA(cudaMemcpyAsync(early.p, reinterpret_cast<void*>(bases[layers - 1]), layer_bytes,
                                cudaMemcpyDeviceToDevice, compute));
    for (std::uint32_t l = 0; l < layers; ++l) {
      ASSERT_TRUE((*engine)->StreamWait((*tickets)[l], compute).ok());
      ASSERT_CUDA(cudaMemcpyAsync(static_cast<std::byte*>(snap.p) + l * layer_bytes,
                                  reinterpret_cast<void*>(bases[l]), layer_bytes,
                                  cudaMemcpyDeviceToDevice, compute));
    }
    // Completion order: a later layer is never done before an earlier one. Polled from the
    // last layer down, so an earlier layer is always polled after a later one in a sweep.
    std::vector<bool> seen(layers, false);
    while (!seen[layers - 1]) {
      for (std::uint32_t l = layers; l-- > 0;) {
        const absl::Status st = (*engine)->Poll((*tickets)[l]);
        ASSERT_TRUE(st.ok() || absl::IsUnavailable(st)) << st;
        seen[l] = st.ok();
      }
      for (std::uint32_t l = 1; l < layers; ++l) {
        ASSERT_TRUE(seen[l - 1] || !seen[l]) << "layer " << l << " done before layer " << l - 1;
      }
    }
    ASSERT_CUDA(cudaStreamSynchronize(compute));
    ASSERT_CUDA(cudaStreamDestroy(compute));
    std::vector<std::uint8_t> got(layers * layer_bytes), first(layer_bytes);
    ASSERT_CUDA(cudaMemcpy(got.data(), snap.p, got.size(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(first.data(), early.p, first.size(), cudaMemcpyDeviceToHost));
    for (std::uint32_t l = 0; l < layers; ++l) {
      for (std::uint32_t i = 0; i < n; ++i) {
        for (std::uint32_t k = 0; k < 2; ++k) {
          const std::uint64_t dev_off = l * layer_bytes + k * c.kv_stride_bytes + i * chunk;
          ASSERT_EQ(
              std::memcmp(&got[dev_off],
                          reinterpret_cast<const void*>(blocks[i].host_addr + c.HostOffset(l, k)),
                          chunk),
              0)
              << "layer " << l << " block " << i << " part " << k
              << ": compute ran before its load";
        }
      }
    }
    const std::uint64_t expect_last = Fnv(&got[(layers - 1) * layer_bytes], layer_bytes);
    EXPECT_NE(Fnv(first.data(), layer_bytes), expect_last)
        << "the unsynchronized read already saw layer " << layers - 1
        << "; the ordering checks above could not have failed";
  }
}

// A device-to-host copy's host lines leave this host's cache before the ticket is reported
// done (gpu/dma_writeback.h: on platforms where DMA writes allocate in the LLC they would
// otherwise sit there, invisible to another host), with either method, layer ranges too;
// and not at all when the caller states the platform writes DMA to memory.
TEST_F(GpuTest, DeviceToHostLinesAreWrittenBackBeforeTheTicketCompletes) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  auto region = pool::OpenRegion("memfd:gpu-writeback?size=8M");
  ASSERT_TRUE(region.ok()) << region.status();
  std::uint64_t id = 0;
  ASSERT_TRUE(RegisterAndWait(*reg, **region, &id).ok());
  std::byte* base = (*region)->addr();
  const PagedCache shape = PagedCache::Contiguous(0x1000, 4, 2, 4096, 16);
  const std::uint64_t B = shape.BlockBytes();
  DeviceBuffer dev(16 * B);
  ASSERT_NE(dev.p, nullptr);
  const PagedCache cache = PagedCache::Contiguous(dev.addr(), 4, 2, 4096, 16);
  for (const DmaWriteback mode : {DmaWriteback::kWriteBack, DmaWriteback::kPlatformWritesMemory}) {
    for (const CopyMethod method : {CopyMethod::kCopyEngine, CopyMethod::kKernel}) {
      SCOPED_TRACE(::testing::Message() << DmaWritebackName(mode) << ", "
                                        << (method == CopyMethod::kKernel ? "kernel" : "dma"));
      CopyEngineOptions eo;
      eo.dma_writeback = mode;
      auto engine = CopyEngine::Create(*reg, eo);
      ASSERT_TRUE(engine.ok()) << engine.status();
      // Every other block slot, so the ranges do not merge into one.
      std::vector<BlockCopy> out;
      for (std::uint32_t i = 0; i < 8; ++i) {
        out.push_back({reinterpret_cast<std::uintptr_t>(base + 2 * i * B), i});
      }
      SubmitOptions so;
      so.method = method;
      so.layer_begin = 1;
      so.layer_end = 3;
      cxlkv::testing::CacheRecorder rec;
      auto t = (*engine)->Submit(cache, Direction::kDeviceToHost, out, so);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE((*engine)->Wait(*t).ok());
      const auto calls = rec.calls();
      const std::uint64_t lo = shape.HostOffset(1, 0), len = shape.HostOffset(3, 0) - lo;
      if (mode == DmaWriteback::kWriteBack) {
        for (const BlockCopy& b : out) {
          EXPECT_TRUE(rec.Covered(cxlkv::testing::CacheOp::kFlush,
                                  reinterpret_cast<const void*>(b.host_addr + lo), len))
              << "block at +" << b.host_addr - reinterpret_cast<std::uintptr_t>(base)
              << " not written back when Wait returned";
        }
        ASSERT_FALSE(calls.empty());
        EXPECT_EQ(calls.back().op, cxlkv::testing::CacheOp::kFence);
        EXPECT_EQ((*engine)->stats().writeback_bytes, out.size() * len);
      } else {
        for (const auto& c : calls) EXPECT_NE(c.op, cxlkv::testing::CacheOp::kFlush);
        EXPECT_EQ((*engine)->stats().writeback_bytes, 0u);
      }
    }
  }
  ASSERT_TRUE(reg->Unregister(id).ok());
}

// 100+ GiB in 64 GiB chunks. The memfd's pages are allocated when pinned, so this needs the
// memory: skipped, with the figures, when the machine lacks it. (A sparse file on disk does
// not help: pinning faults in and dirties every page of it; see docs/gpu.md.)
TEST_F(GpuTest, Registers100GiBArenaInChunks) {
  std::uint64_t gib = 100;
  if (const char* s = std::getenv("CXLKV_GPU_BIG_GIB")) gib = std::strtoull(s, nullptr, 10);
  const std::uint64_t bytes = gib * kGiB + 2 * kMiB;  // an odd last chunk
  const std::uint64_t avail = static_cast<std::uint64_t>(::sysconf(_SC_AVPHYS_PAGES)) *
                              static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (avail < bytes + 8 * kGiB) {
    GTEST_SKIP() << "needs " << (bytes >> 30) + 8 << " GiB of free memory to pin a " << gib
                 << " GiB arena, this machine has " << (avail >> 30)
                 << " GiB free (CXLKV_GPU_BIG_GIB sets the size)";
  }
  std::vector<RegistrationInfo> progress;
  std::mutex mu;
  RegistrarOptions o;
  o.on_progress = [&](const RegistrationInfo& r) {
    std::lock_guard<std::mutex> lock(mu);
    progress.push_back(r);
  };
  auto reg = Registrar::Create(o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto region = pool::OpenRegion("memfd:gpu-big?size=" + std::to_string(bytes));
  ASSERT_TRUE(region.ok()) << region.status();
  auto id = (*reg)->RegisterRegion(**region);
  ASSERT_TRUE(id.ok());
  // Registration is asynchronous: the call returned before pinning 100 GiB.
  EXPECT_NE((*reg)->Info(*id)->state, RegState::kRegistered);
  ASSERT_TRUE((*reg)->Wait(*id).ok());
  auto info = (*reg)->Info(*id);
  // Chunks ramp from 1 GiB up to 64 GiB (RegistrarOptions::first_chunk_bytes).
  auto plan = PlanRampChunks(bytes, (*region)->alignment() < 4096 ? 4096 : (*region)->alignment(),
                             RegistrarOptions{}.first_chunk_bytes);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(info->chunks, *plan);
  ASSERT_GT(info->chunks.size(), (bytes + kMaxChunkBytes - 1) / kMaxChunkBytes);
  for (const ChunkPlan& c : info->chunks) EXPECT_LE(c.bytes, kMaxChunkBytes);
  EXPECT_EQ(info->bytes_done, bytes);
  const double wall_s = static_cast<double>(info->finished_ns - info->started_ns) / 1e9;
  std::printf(
      "%llu GiB in %zu chunks: %.2f s (%.1f ms per GiB), first chunk (%.1f GiB) usable after "
      "%.3f s; %.1f ms per GiB inside cudaHostRegister, %.2f s waiting for prefault\n",
      static_cast<unsigned long long>(gib), info->chunks.size(), wall_s,
      wall_s * 1e3 / static_cast<double>(gib),
      static_cast<double>(info->chunks[0].bytes) / static_cast<double>(kGiB),
      static_cast<double>(info->first_chunk_ns - info->started_ns) / 1e9, info->NsPerGiB() / 1e6,
      static_cast<double>(info->prefault_ns) / 1e9);
  EXPECT_LT(info->first_chunk_ns, info->finished_ns) << "the first chunk was not usable early";
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(progress.size(), info->chunks.size());
    for (std::size_t i = 0; i < progress.size(); ++i) EXPECT_EQ(progress[i].chunks_done, i + 1);
  }
  // Copies work in the last chunk, past 64 GiB.
  RoundTrip(**reg, (*region)->addr() + bytes - 64 * kMiB, 64 * kMiB, CopyMethod::kCopyEngine);
  ASSERT_TRUE((*reg)->Unregister(*id).ok());
}

// No stray context: a registrar on device 1 creates no context on device 0.
TEST_F(GpuTest, RegistrarOnAnotherDeviceLeavesDevice0Alone) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << count;
  using PrimaryCtxGetState = int (*)(int, unsigned*, int*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  ASSERT_CUDA(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                               cudaEnableDefault, &q));
  ASSERT_NE(fn, nullptr);
  auto state = reinterpret_cast<PrimaryCtxGetState>(fn);
  unsigned flags = 0;
  int active = -1;
  ASSERT_EQ(state(0, &flags, &active), 0);
  if (active) GTEST_SKIP() << "device 0 already has a context in this process";
  RegistrarOptions o;
  o.device = 1;
  auto reg = Registrar::Create(o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto region = pool::OpenRegion("memfd:gpu-dev1?size=8M");
  ASSERT_TRUE(region.ok());
  auto id = (*reg)->RegisterRegion(**region);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*reg)->Wait(*id).ok());
  ASSERT_EQ(state(0, &flags, &active), 0);
  EXPECT_EQ(active, 0) << "a context appeared on device 0";
  ASSERT_EQ(state(1, &flags, &active), 0);
  EXPECT_EQ(active, 1);
}

TEST_F(GpuTest, CopiesFromUnregisteredOrPendingMemoryAreRefused) {
  auto reg = MakeRegistrar();
  ASSERT_NE(reg, nullptr);
  auto engine = CopyEngine::Create(*reg);
  ASSERT_TRUE(engine.ok());
  DeviceBuffer dev(1 * kMiB);
  const PagedCache c = PagedCache::Contiguous(dev.addr(), 1, 1, 4096, 16);
  std::vector<std::uint8_t> pageable(64 * 1024);
  const std::uint64_t a = (reinterpret_cast<std::uintptr_t>(pageable.data()) + 15) & ~15ull;
  auto t = (*engine)->Submit(c, Direction::kHostToDevice, std::vector<BlockCopy>{{a, 0}});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound) << t.status();
  EXPECT_NE(t.status().message().find("register the arena first"), std::string::npos);
  EXPECT_EQ((*engine)->Poll(12345).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace cxlkv::gpu
