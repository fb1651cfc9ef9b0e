// gpu_benchmark — moving KV blocks between host memory and HBM (built with CUDA only).
//
//   Copy/<dir>/<source>/<block_bytes>   one cudaMemcpyAsync per block, 256 MiB per iteration,
//                                       GPU-timed (events); bytes_per_second.
//       dir:    h2d, d2h
//       source: arena     blocks of an emulated CXL arena (memfd), registered by the
//                         Registrar (cudaHostRegister Portable|Mapped, 64 GiB chunks)
//               hostalloc cudaHostAlloc memory (the target: arena >= 95 % of it)
//               pageable  malloc'd memory (what an unregistered arena would get)
//   Gather/<method>/<layout>/<chunk_bytes>  256 MiB of scattered blocks into random pages
//       method: kernel (one gather launch), memcpy (one cudaMemcpyAsync per piece)
//       layout: contiguous (KVBM fully contiguous, 8 layers x K,V), separate (vLLM per-layer
//               tensors [2][pages][chunk], 8 layers): pieces of chunk_bytes
//   GatherBlocks64K/<method>/<layout>/<blocks>  64-1,024 blocks of 64 KiB (8 layers x K,V x
//                            4 KiB) into random pages: kernel vs one cudaMemcpyAsync per piece
//   Register/<registrar>/<state>/<GiB>   a memfd of GiB registered until usable: registrar
//                            prefault+ramp (as shipped: prefault threads, chunks from 1 GiB) or
//                            plain (the driver faults pages in, 64 GiB chunks); state cold
//                            (pages not yet allocated) or warm (prefaulted by memset);
//                            counters ms_per_GiB (wall), pin_ms_per_GiB (inside
//                            cudaHostRegister), first_chunk_ms (first chunk usable).
// Without a CUDA device it prints why and exits 0 without running anything.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cxlkv/gpu/copy_engine.h"
#include "cxlkv/gpu/registrar.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

namespace gpu = cxlkv::gpu;
constexpr std::uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr std::uint64_t kBatchBytes = 256 * kMiB;
constexpr std::uint64_t kBlockSizes[] = {64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "gpu_benchmark: %s\n", msg.c_str());
  std::abort();
}

#define CUDA_OR_DIE(expr)                                                          \
  do {                                                                             \
    const cudaError_t e_ = (expr);                                                 \
    if (e_ != cudaSuccess) Die(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
  } while (0)

struct Fixture {
  std::unique_ptr<gpu::Registrar> registrar;
  std::unique_ptr<gpu::CopyEngine> engine;
  std::unique_ptr<cxlkv::pool::Arena> arena;
  std::byte* arena_data = nullptr;  // kBatchBytes of the arena's data area, registered
  std::byte* hostalloc = nullptr;
  std::byte* pageable = nullptr;
  void* device = nullptr;  // kBatchBytes of HBM
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

Fixture& F() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    auto reg = gpu::Registrar::Create({});
    if (!reg.ok()) Die(std::string(reg.status().message()));
    x->registrar = std::move(*reg);
    // The emulated CXL arena: one class of 8 MiB blocks on a memfd, a little over 256 MiB.
    cxlkv::pool::FormatOptions fo;
    fo.layout = cxlkv::pool::KvLayout{8, 8, 128, 2, 256, cxlkv::pool::KvLayoutKind::kContiguous};
    auto region = cxlkv::pool::OpenRegion("memfd:cxlkv-bench-gpu?size=288M");
    if (!region.ok()) Die(std::string(region.status().message()));
    auto arena = cxlkv::pool::Arena::Format(std::move(*region), fo);
    if (!arena.ok()) Die(std::string(arena.status().message()));
    x->arena = std::move(*arena);
    x->arena_data = x->arena->region().addr() + x->arena->class_record(0).data_offset;
    if (x->arena->class_record(0).data_offset + kBatchBytes > x->arena->region().size_bytes()) {
      Die("arena data area is smaller than one batch");
    }
    auto id = x->registrar->RegisterArena(*x->arena);
    if (!id.ok()) Die(std::string(id.status().message()));
    if (auto st = x->registrar->Wait(*id); !st.ok()) Die(std::string(st.message()));
    auto engine = gpu::CopyEngine::Create(*x->registrar);
    if (!engine.ok()) Die(std::string(engine.status().message()));
    x->engine = std::move(*engine);
    CUDA_OR_DIE(cudaSetDevice(0));
    CUDA_OR_DIE(
        cudaHostAlloc(reinterpret_cast<void**>(&x->hostalloc), kBatchBytes, cudaHostAllocDefault));
    x->pageable = static_cast<std::byte*>(std::aligned_alloc(4096, kBatchBytes));
    std::memset(x->arena_data, 1, kBatchBytes);
    std::memset(x->hostalloc, 1, kBatchBytes);
    std::memset(x->pageable, 1, kBatchBytes);
    CUDA_OR_DIE(cudaMalloc(&x->device, kBatchBytes));
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
    CUDA_OR_DIE(cudaEventCreate(&x->start));
    CUDA_OR_DIE(cudaEventCreate(&x->stop));
    return x;
  }();
  return *f;
}

std::byte* Source(int which) {
  Fixture& f = F();
  return which == 0 ? f.arena_data : which == 1 ? f.hostalloc : f.pageable;
}

// GPU time of what `enqueue` puts on the fixture's stream.
template <typename Fn>
double TimeOnStream(Fn enqueue, cudaStream_t s) {
  Fixture& f = F();
  CUDA_OR_DIE(cudaEventRecord(f.start, s));
  enqueue();
  CUDA_OR_DIE(cudaEventRecord(f.stop, s));
  CUDA_OR_DIE(cudaEventSynchronize(f.stop));
  float ms = 0;
  CUDA_OR_DIE(cudaEventElapsedTime(&ms, f.start, f.stop));
  return ms / 1e3;
}

void BM_Copy(benchmark::State& state, bool h2d, int source) {
  Fixture& f = F();
  const std::uint64_t block = static_cast<std::uint64_t>(state.range(0));
  const std::uint64_t n = kBatchBytes / block;
  std::byte* host = Source(source);
  auto* dev = static_cast<std::byte*>(f.device);
  for (auto _ : state) {
    state.SetIterationTime(TimeOnStream(
        [&] {
          for (std::uint64_t i = 0; i < n; ++i) {
            if (h2d) {
              CUDA_OR_DIE(cudaMemcpyAsync(dev + i * block, host + i * block, block,
                                          cudaMemcpyHostToDevice, f.stream));
            } else {
              CUDA_OR_DIE(cudaMemcpyAsync(host + i * block, dev + i * block, block,
                                          cudaMemcpyDeviceToHost, f.stream));
            }
          }
        },
        f.stream));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * block));
}

// n blocks of 8 layers x K,V x chunk, every other block slot of the arena, loaded into random
// pages of a cache of `pages` pages (contiguous or one tensor per layer), by one kernel launch
// or one cudaMemcpyAsync per piece.
void RunGather(benchmark::State& state, bool kernel, bool separate, std::uint64_t chunk,
               std::uint32_t pages, std::uint32_t n, unsigned seed) {
  Fixture& f = F();
  const std::uint32_t layers = 8, kv = 2;
  const auto base = reinterpret_cast<std::uintptr_t>(f.device);
  gpu::PagedCache c;
  if (separate) {
    std::vector<std::uint64_t> bases;
    for (std::uint32_t l = 0; l < layers; ++l) bases.push_back(base + l * kv * chunk * pages);
    c = gpu::PagedCache::LayerSeparate(bases, kv, chunk, pages);
  } else {
    c = gpu::PagedCache::Contiguous(base, layers, kv, chunk, pages);
  }
  const std::uint64_t block = c.BlockBytes();
  std::vector<std::uint32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0u);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(seed));
  std::vector<gpu::BlockCopy> blocks;
  for (std::uint32_t i = 0; i < n; ++i) {
    blocks.push_back(
        {reinterpret_cast<std::uintptr_t>(f.arena_data) + 2ull * i * block, page_ids[i]});
  }
  gpu::SubmitOptions so;
  so.method = kernel ? gpu::CopyMethod::kKernel : gpu::CopyMethod::kCopyEngine;
  cudaStream_t s = f.engine->stream(gpu::Direction::kHostToDevice);
  for (auto _ : state) {
    state.SetIterationTime(TimeOnStream(
        [&] {
          auto t = f.engine->Submit(c, gpu::Direction::kHostToDevice, blocks, so);
          if (!t.ok()) Die(std::string(t.status().message()));
        },
        s));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * block));
  state.counters["pieces"] = static_cast<double>(std::uint64_t{n} * layers * kv);
  state.counters["memcpy_ops_total"] = static_cast<double>(f.engine->stats().memcpy_ops);
}

// 256 MiB of blocks of 8 layers x K,V x chunk, scattered in the arena (every other block
// slot) and loaded into random pages.
void BM_Gather(benchmark::State& state, bool kernel, bool separate) {
  const std::uint64_t chunk = static_cast<std::uint64_t>(state.range(0));
  const auto pages = static_cast<std::uint32_t>(kBatchBytes / (8 * 2 * chunk));
  RunGather(state, kernel, separate, chunk, pages, pages / 2, 7);
}

// Gather of N blocks of 64 KiB (8 layers x K,V x 4 KiB chunks) into random pages: the
// issue's comparison of one kernel launch against one cudaMemcpyAsync per piece, by block
// count.
void BM_GatherBlocks(benchmark::State& state, bool kernel, bool separate) {
  RunGather(state, kernel, separate, 4096, 2048, static_cast<std::uint32_t>(state.range(0)), 11);
}

// The registrar as shipped (prefault threads, chunks ramping from 1 GiB) and as before them
// (the driver faults pages in on the registration thread, 64 GiB chunks).
gpu::Registrar& RegistrarFor(bool fast) {
  static gpu::Registrar* plain = [] {
    gpu::RegistrarOptions o;
    o.prefault_threads = 0;
    o.first_chunk_bytes = 0;
    auto r = gpu::Registrar::Create(o);
    if (!r.ok()) Die(std::string(r.status().message()));
    return r->release();
  }();
  return fast ? *F().registrar : *plain;
}

void BM_Register(benchmark::State& state, bool warm, bool fast) {
  gpu::Registrar& reg = RegistrarFor(fast);
  const std::uint64_t bytes = static_cast<std::uint64_t>(state.range(0)) * kGiB;
  double ns_per_gib = 0, wall_ms_per_gib = 0, first_ms = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto region = cxlkv::pool::OpenRegion(absl::StrCat("memfd:cxlkv-bench-reg?size=", bytes));
    if (!region.ok()) Die(std::string(region.status().message()));
    if (warm) std::memset((*region)->addr(), 0, bytes);
    state.ResumeTiming();
    auto id = reg.RegisterRegion(**region);
    if (!id.ok()) Die(std::string(id.status().message()));
    if (auto st = reg.Wait(*id); !st.ok()) Die(std::string(st.message()));
    auto info = reg.Info(*id);
    // From the registration thread taking it up to the last chunk pinned: prefaulting
    // included, queueing not.
    const double wall_ns = static_cast<double>(info->finished_ns - info->started_ns);
    state.SetIterationTime(wall_ns / 1e9);
    ns_per_gib = info->NsPerGiB();
    wall_ms_per_gib = wall_ns / 1e6 / static_cast<double>(state.range(0));
    first_ms = static_cast<double>(info->first_chunk_ns - info->started_ns) / 1e6;
    state.PauseTiming();
    if (auto st = reg.Unregister(*id); !st.ok()) Die(std::string(st.message()));
    region->reset();
    state.ResumeTiming();
  }
  state.counters["ms_per_GiB"] = wall_ms_per_gib;
  state.counters["pin_ms_per_GiB"] = ns_per_gib / 1e6;  // inside cudaHostRegister alone
  state.counters["first_chunk_ms"] = first_ms;          // until the first chunk was usable
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void Register() {
  const char* dirs[] = {"d2h", "h2d"};
  const char* sources[] = {"arena", "hostalloc", "pageable"};
  for (int d = 0; d < 2; ++d) {
    for (int s = 0; s < 3; ++s) {
      auto* b =
          benchmark::RegisterBenchmark(absl::StrCat("Copy/", dirs[d], "/", sources[s]).c_str(),
                                       [d, s](benchmark::State& st) { BM_Copy(st, d == 1, s); });
      for (std::uint64_t bs : kBlockSizes) b->Arg(static_cast<std::int64_t>(bs));
      b->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
  for (bool kernel : {true, false}) {
    for (bool separate : {false, true}) {
      auto* b = benchmark::RegisterBenchmark(
          absl::StrCat("Gather/", kernel ? "kernel" : "memcpy", "/",
                       separate ? "separate" : "contiguous")
              .c_str(),
          [kernel, separate](benchmark::State& st) { BM_Gather(st, kernel, separate); });
      for (std::int64_t chunk : {4 << 10, 16 << 10, 64 << 10, 256 << 10}) b->Arg(chunk);
      b->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
  for (bool kernel : {true, false}) {
    for (bool separate : {false, true}) {
      auto* b = benchmark::RegisterBenchmark(
          absl::StrCat("GatherBlocks64K/", kernel ? "kernel" : "memcpy", "/",
                       separate ? "separate" : "contiguous")
              .c_str(),
          [kernel, separate](benchmark::State& st) { BM_GatherBlocks(st, kernel, separate); });
      for (std::int64_t n : {64, 128, 256, 512, 1024}) b->Arg(n);
      b->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  }
  for (bool fast : {true, false}) {
    for (bool warm : {false, true}) {
      auto* b = benchmark::RegisterBenchmark(
          absl::StrCat("Register/", fast ? "prefault+ramp" : "plain", "/", warm ? "warm" : "cold")
              .c_str(),
          [warm, fast](benchmark::State& st) { BM_Register(st, warm, fast); });
      b->Arg(1)->Arg(4)->Arg(16)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const absl::Status st = gpu::ProbeDevice(0); !st.ok()) {
    std::printf("gpu_benchmark: skipped, nothing measured: %s\n",
                std::string(st.message()).c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
