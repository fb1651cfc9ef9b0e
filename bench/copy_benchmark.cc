// copy_benchmark — filling a KV block: cxlkv::coherence::CopyNt (and each CopyKind) against
// glibc memcpy, into the same cold destination.
//
//   CopyToBlock/<method>/<bytes>   one block-sized copy per iteration; bytes_per_second
//
// Destination: every block of one size class of an arena on a memfd region (one class per
// block size, about 1.06 GiB each, prefaulted once before timing), written in address order
// and wrapping, so each copy lands in lines not touched for over 1 GiB of traffic.
// Source: a 256 MiB anonymous buffer, rotating by one block per copy.
// Methods: memcpy (glibc; leaves the data in cache, not in memory), memcpy_flush (memcpy,
// then coherence::Flush + Fence: the same guarantee CopyNt gives), CopyNt (the kind chosen
// from CPUID) and CopyNtWith:<kind> for every CopyKind.
// Block sizes: 64 KiB, 2 MiB and 5 MiB (Llama-3-70B fp16, 16 tokens).
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/gpu/dma_writeback.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
namespace coherence = cxlkv::coherence;
namespace gpu = cxlkv::gpu;

constexpr std::uint64_t kBlockSizes[] = {64ull << 10, 2ull << 20, 5ull << 20};
constexpr std::size_t kSourceBytes = 256ull << 20;
constexpr const char* kRegionSpec = "memfd:cxlkv-bench-copy?size=3264M";  // 3 x 1088 MiB

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "copy_benchmark: %s\n", msg.c_str());
  std::abort();
}

struct Fixture {
  std::unique_ptr<BlockAllocator> allocator;
  std::vector<std::vector<std::byte*>> blocks;  // per class, ascending addresses
  std::byte* source = nullptr;

  const std::vector<std::byte*>& BlocksOf(std::uint64_t bytes) const {
    for (std::uint32_t c = 0; c < allocator->class_count(); ++c) {
      if (allocator->block_bytes(c) == bytes) return blocks[c];
    }
    Die(absl::StrCat("no size class of ", bytes, " bytes"));
  }
};
Fixture* g_fixture = nullptr;

void SetUp() {
  auto region = cxlkv::pool::OpenRegion(kRegionSpec);
  if (!region.ok()) Die(region.status().ToString());
  cxlkv::pool::FormatOptions options;
  for (std::uint64_t bytes : kBlockSizes) options.classes.push_back({0, bytes, 1});
  auto arena = cxlkv::pool::Arena::Format(*std::move(region), options);
  if (!arena.ok()) Die(arena.status().ToString());
  auto allocator = BlockAllocator::Create(*std::move(arena));
  if (!allocator.ok()) Die(allocator.status().ToString());
  auto* f = new Fixture{*std::move(allocator), {}, nullptr};
  BlockAllocator& a = *f->allocator;
  f->blocks.resize(a.class_count());
  for (std::uint32_t c = 0; c < a.class_count(); ++c) {
    for (BlockHandle h = a.Alloc(c); h.valid(); h = a.Alloc(c)) {
      f->blocks[c].push_back(a.Addr(h));
    }
    std::sort(f->blocks[c].begin(), f->blocks[c].end());
    // Prefault: the first pass over a memfd would otherwise time page faults, not copies.
    for (std::byte* b : f->blocks[c]) std::memset(b, 0x5A, a.block_bytes(c));
  }
  void* src = ::mmap(nullptr, kSourceBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (src == MAP_FAILED) Die("mmap of the 256 MiB source failed");
  f->source = static_cast<std::byte*>(src);
  for (std::size_t i = 0; i < kSourceBytes; i += sizeof(std::uint64_t)) {
    const std::uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(f->source + i, &v, sizeof(v));
  }
  g_fixture = f;

  const coherence::CpuFeatures& cpu = coherence::DetectedCpuFeatures();
  benchmark::AddCustomContext("cpu_copy_features",
                              absl::StrCat("movdir64b=", cpu.movdir64b, " avx512f=", cpu.avx512f,
                                           " clwb=", cpu.clwb, " clflushopt=", cpu.clflushopt));
  benchmark::AddCustomContext("active_copy_kind",
                              std::string(coherence::CopyKindName(coherence::ActiveCopyKind())));
  benchmark::AddCustomContext("active_flush_kind",
                              std::string(coherence::FlushKindName(coherence::ActiveFlushKind())));
  std::string classes;
  for (std::uint32_t c = 0; c < a.class_count(); ++c) {
    absl::StrAppend(&classes, c == 0 ? "" : ", ", a.block_bytes(c), "x", f->blocks[c].size());
  }
  benchmark::AddCustomContext("destination", absl::StrCat(kRegionSpec, ", blocks ", classes));
}

using CopyFn = void (*)(void* dst, const void* src, std::size_t len);

void Memcpy(void* dst, const void* src, std::size_t len) { std::memcpy(dst, src, len); }
void MemcpyFlush(void* dst, const void* src, std::size_t len) {
  std::memcpy(dst, src, len);
  coherence::Flush(dst, len);
  coherence::Fence();
}
void CopyNt(void* dst, const void* src, std::size_t len) { coherence::CopyNt(dst, src, len); }
template <coherence::CopyKind kKind>
void CopyNtWith(void* dst, const void* src, std::size_t len) {
  coherence::CopyNtWith(kKind, dst, src, len);
}

void BM_CopyToBlock(benchmark::State& state, CopyFn copy) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::vector<std::byte*>& dsts = g_fixture->BlocksOf(bytes);
  const std::byte* src = g_fixture->source;
  std::size_t di = 0;
  std::size_t so = 0;
  for (auto _ : state) {
    copy(dsts[di], src + so, bytes);
    if (++di == dsts.size()) di = 0;
    so += bytes;
    if (so + bytes > kSourceBytes) so = 0;
  }
  benchmark::ClobberMemory();
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

void Register(const std::string& method, CopyFn copy, const std::string& label = "") {
  auto* b = benchmark::RegisterBenchmark(absl::StrCat("CopyToBlock/", method).c_str(),
                                         [copy, label](benchmark::State& state) {
                                           BM_CopyToBlock(state, copy);
                                           if (!label.empty()) state.SetLabel(label);
                                         });
  for (std::uint64_t bytes : kBlockSizes) b->Arg(static_cast<std::int64_t>(bytes));
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// The write-back after a D2H copy into a block (gpu/dma_writeback.h), CPU side, per 5 MiB
// block (a Llama-3-70B block of 16 tokens): the lines as a DMA that allocates in the LLC
// leaves them (dirty: written by memset before each iteration, outside the timing), as
// after a write-back (clean, still cached), and not cached at all (evicted). The copy itself
// is the limit it adds to: 5 MiB at PCIe 5 x16's ~55 GB/s (measured on the H200 host) is
// ~95 us.
void BM_DmaWriteback(benchmark::State& state, int lines) {
  constexpr std::size_t kBlock = 5u << 20;
  static std::vector<std::byte>* buf = new std::vector<std::byte>(kBlock + 4096);
  std::byte* p = buf->data() + (64 - reinterpret_cast<std::uintptr_t>(buf->data()) % 64) % 64;
  const gpu::HostRange r{reinterpret_cast<std::uint64_t>(p), kBlock};
  std::memset(p, 1, kBlock);
  for (auto _ : state) {
    state.PauseTiming();
    if (lines == 0) std::memset(p, static_cast<int>(state.iterations() & 0xff), kBlock);
    if (lines == 2) coherence::Invalidate(p, kBlock);
    state.ResumeTiming();
    gpu::WriteBackHostRanges({&r, 1});
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kBlock));
  state.SetLabel(absl::StrCat(coherence::FlushKindName(coherence::ActiveFlushKind()), " + sfence"));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  SetUp();
  using coherence::CopyKind;
  Register("memcpy", &Memcpy);
  Register("memcpy_flush", &MemcpyFlush);
  Register("CopyNt", &CopyNt,
           absl::StrCat("kind ", coherence::CopyKindName(coherence::ActiveCopyKind())));
  // CopyNtWith falls back to the next weaker kind the CPU has; the label says so.
  const coherence::CpuFeatures& cpu = coherence::DetectedCpuFeatures();
  auto with = [&cpu](CopyKind kind, CopyFn fn) {
    CopyKind ran = kind;
    if (ran == CopyKind::kMovdir64b && !cpu.movdir64b) ran = CopyKind::kAvx512Nt;
    if (ran == CopyKind::kAvx512Nt && !cpu.avx512f) ran = CopyKind::kSse2Nt;
    std::string label;
    if (ran != kind) {
      label = absl::StrCat("no ", coherence::CopyKindName(kind), " on this CPU: ran ",
                           coherence::CopyKindName(ran));
    }
    Register(absl::StrCat("CopyNtWith:", coherence::CopyKindName(kind)), fn, label);
  };
  with(CopyKind::kMovdir64b, &CopyNtWith<CopyKind::kMovdir64b>);
  with(CopyKind::kAvx512Nt, &CopyNtWith<CopyKind::kAvx512Nt>);
  with(CopyKind::kSse2Nt, &CopyNtWith<CopyKind::kSse2Nt>);
  const char* kLines[] = {"dirty", "clean", "uncached"};
  for (int lines = 0; lines < 3; ++lines) {
    benchmark::RegisterBenchmark(absl::StrCat("DmaWriteback/", kLines[lines], "/5MiB").c_str(),
                                 [lines](benchmark::State& st) { BM_DmaWriteback(st, lines); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
