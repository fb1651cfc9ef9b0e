// gpu_benchmark — the GPU kit (docs/gpu.md "The GPU kit"; cases planned by gpu/kit.h): how
// fast a GPU reads and writes the tier, how long until a registered tier is ready, and whether
// a block the GPU wrote is safe to publish. Built with CUDA only.
//
//   Copy/<dir>/<source>/<chunk>   one cudaMemcpyAsync per chunk, a batch (1 GiB, less when the
//        device or the host lack the memory) per iteration, GPU-timed (events).
//        dir: h2d, d2h. source: hostalloc (cudaHostAlloc: the reference; goal: arena >= 95 %
//        of it), arena (a memfd arena registered by the Registrar), remote (the same bound to a
//        NUMA node other than the GPU's), pageable (malloc'd).
//   Streams/<source>/<n>   n concurrent loads of batch/8 in 2 MiB copies, one stream each,
//        issued round-robin from one thread: the aggregate rate (does it add up?).
//   Gather/<method>/<layout>/<piece>, GatherBlocks64K/<method>/<layout>/<blocks>   scattered
//        arena blocks into random pages of a paged cache: one gather kernel launch against one
//        cudaMemcpyAsync per piece (KVBM contiguous, vLLM per-layer separate).
//   WriteBack/<n>x<block>   n blocks copied D2H into arena blocks of a /dev/shm pool file by the
//        copy engine (which writes the lines back before the ticket completes), persisted, then
//        read through a second mapping of the file and compared with the device's bytes.
//   Register/<mode>/<size>   a cold memfd registered until usable: chunked (as shipped:
//        prefault threads, chunks ramping from 1 GiB), prefault+one-call (one
//        cudaHostRegister after a prefault on every CPU), one-call (one cudaHostRegister, the
//        driver faults the pages in); "one" up to the registrar's 64 GiB chunk cap, 64 GiB
//        chunks above it. s_per_GiB, pin_s_per_GiB, first_chunk_ms.
//   RegisterUnderTraffic/<size>   the latency of 64 KiB H2D copies (one at a time, synchronised)
//        before and while a registration of <size> runs: p50/p99 idle and during.
//
// Flags of its own (before Google Benchmark's):
//   --kit_plan              print the plan (sizes, what runs, what is skipped and why), exit
//   --kit_machine=SPEC      plan for an assumed machine (gpu/kit.h ParseKitMachine) instead
//                           of this one: the dry run on a machine without a device
//   --kit_budget_s=S        the time the cases may take (default 200)
//   --kit_json=FILE         write the plan, the records and the summary as JSON
// After the run it prints one labelled "kit:" line per question and size (gpu/kit.h
// KitSummary). Without a CUDA device it prints the plan (everything skipped, with why) and
// exits 0 without measuring anything.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/file.h"
#include "cxlkv/gpu/copy_engine.h"
#include "cxlkv/gpu/kit.h"
#include "cxlkv/gpu/registrar.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

namespace gpu = cxlkv::gpu;
namespace pool = cxlkv::pool;
constexpr std::uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr std::uint64_t kGatherBytes = 256 * kMiB;  // the gather cases' cache and sources
constexpr std::uint64_t kStreamCopyBytes = 2 * kMiB;
constexpr std::uint64_t kTrafficCopyBytes = 64 << 10;
constexpr int kMaxStreams = 8;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "gpu_benchmark: %s\n", msg.c_str());
  std::abort();
}

#define CUDA_OR_DIE(expr)                                                          \
  do {                                                                             \
    const cudaError_t e_ = (expr);                                                 \
    if (e_ != cudaSuccess) Die(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
  } while (0)

gpu::KitPlan g_plan;
gpu::KitRecords g_records;

// The emulated CXL arena the copy cases read: one class of 8 MiB blocks, data area >= bytes.
pool::FormatOptions ArenaFormat() {
  pool::FormatOptions fo;
  fo.layout = pool::KvLayout{8, 8, 128, 2, 256, pool::KvLayoutKind::kContiguous};
  return fo;
}

std::unique_ptr<pool::Arena> MakeArena(const std::string& spec_prefix, std::uint64_t bytes) {
  auto region = pool::OpenRegion(absl::StrCat(spec_prefix, "?size=", bytes + 32 * kMiB));
  if (!region.ok()) Die(absl::StrCat(spec_prefix, ": ", region.status().message()));
  auto arena = pool::Arena::Format(std::move(*region), ArenaFormat());
  if (!arena.ok()) Die(absl::StrCat(spec_prefix, ": ", arena.status().message()));
  if ((*arena)->class_record(0).data_offset + bytes > (*arena)->region().size_bytes()) {
    Die(absl::StrCat(spec_prefix, ": arena data area is smaller than ", bytes, " bytes"));
  }
  return std::move(*arena);
}

std::byte* DataOf(const pool::Arena& a) {
  return a.region().addr() + a.class_record(0).data_offset;
}

struct Fixture {
  std::uint64_t batch = 0;
  std::unique_ptr<gpu::Registrar> registrar;
  std::unique_ptr<gpu::CopyEngine> engine;
  std::unique_ptr<pool::Arena> arena, remote;
  std::byte* hostalloc = nullptr;
  std::byte* pageable = nullptr;
  void* device = nullptr;  // batch bytes of HBM
  cudaStream_t streams[kMaxStreams] = {};
  cudaEvent_t start = nullptr, stop = nullptr, done[kMaxStreams] = {};
};

Fixture& F() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    x->batch = g_plan.copy_batch_bytes;
    auto reg = gpu::Registrar::Create({});
    if (!reg.ok()) Die(std::string(reg.status().message()));
    x->registrar = std::move(*reg);
    x->arena = MakeArena("memfd:cxlkv-kit-arena", x->batch);
    if (g_plan.remote_node >= 0) {
      x->remote = MakeArena(absl::StrCat("kmem:node=", g_plan.remote_node), x->batch);
    }
    for (pool::Arena* a : {x->arena.get(), x->remote.get()}) {
      if (a == nullptr) continue;
      auto id = x->registrar->RegisterArena(*a);
      if (!id.ok()) Die(std::string(id.status().message()));
      if (auto st = x->registrar->Wait(*id); !st.ok()) Die(std::string(st.message()));
      std::memset(DataOf(*a), 1, x->batch);
    }
    auto engine = gpu::CopyEngine::Create(*x->registrar);
    if (!engine.ok()) Die(std::string(engine.status().message()));
    x->engine = std::move(*engine);
    CUDA_OR_DIE(cudaSetDevice(0));
    CUDA_OR_DIE(
        cudaHostAlloc(reinterpret_cast<void**>(&x->hostalloc), x->batch, cudaHostAllocDefault));
    x->pageable = static_cast<std::byte*>(std::aligned_alloc(4096, x->batch));
    if (x->pageable == nullptr) Die("aligned_alloc of the pageable source failed");
    std::memset(x->hostalloc, 1, x->batch);
    std::memset(x->pageable, 1, x->batch);
    CUDA_OR_DIE(cudaMalloc(&x->device, x->batch));
    for (int i = 0; i < kMaxStreams; ++i) {
      CUDA_OR_DIE(cudaStreamCreateWithFlags(&x->streams[i], cudaStreamNonBlocking));
      CUDA_OR_DIE(cudaEventCreateWithFlags(&x->done[i], cudaEventDisableTiming));
    }
    CUDA_OR_DIE(cudaEventCreate(&x->start));
    CUDA_OR_DIE(cudaEventCreate(&x->stop));
    return x;
  }();
  return *f;
}

std::byte* Source(const std::string& which) {
  Fixture& f = F();
  if (which == "arena") return DataOf(*f.arena);
  if (which == "remote") return DataOf(*f.remote);
  if (which == "hostalloc") return f.hostalloc;
  return f.pageable;
}

// GPU time of what `enqueue` puts on stream s (and streams that s waits for).
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

void RecordRate(const gpu::KitCase& c, double bytes, double seconds) {
  gpu::KitRecord r;
  r.values["bytes_per_second"] = seconds > 0 ? bytes / seconds : 0;
  r.values["seconds"] = seconds;
  g_records[c.name] = r;
}

void BM_Copy(benchmark::State& state, const gpu::KitCase& c) {
  Fixture& f = F();
  const std::uint64_t n = f.batch / c.bytes;
  std::byte* host = Source(c.source);
  auto* dev = static_cast<std::byte*>(f.device);
  double total_s = 0;
  for (auto _ : state) {
    const double s = TimeOnStream(
        [&] {
          for (std::uint64_t i = 0; i < n; ++i) {
            if (c.h2d) {
              CUDA_OR_DIE(cudaMemcpyAsync(dev + i * c.bytes, host + i * c.bytes, c.bytes,
                                          cudaMemcpyHostToDevice, f.streams[0]));
            } else {
              CUDA_OR_DIE(cudaMemcpyAsync(host + i * c.bytes, dev + i * c.bytes, c.bytes,
                                          cudaMemcpyDeviceToHost, f.streams[0]));
            }
          }
        },
        f.streams[0]);
    state.SetIterationTime(s);
    total_s += s;
  }
  const double bytes = static_cast<double>(state.iterations() * n * c.bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  RecordRate(c, bytes, total_s);
}

// n loads of c.bytes, one stream each, their 2 MiB copies issued round-robin; the time from
// the first copy's start to the last load's end.
void BM_Streams(benchmark::State& state, const gpu::KitCase& c) {
  Fixture& f = F();
  std::byte* host = Source(c.source);
  auto* dev = static_cast<std::byte*>(f.device);
  const std::uint64_t pieces = c.bytes / kStreamCopyBytes;
  double total_s = 0;
  for (auto _ : state) {
    const double s = TimeOnStream(
        [&] {
          for (std::uint32_t i = 1; i < c.count; ++i)
            CUDA_OR_DIE(cudaStreamWaitEvent(f.streams[i], f.start, 0));
          for (std::uint64_t j = 0; j < pieces; ++j) {
            for (std::uint32_t i = 0; i < c.count; ++i) {
              const std::uint64_t off = i * c.bytes + j * kStreamCopyBytes;
              CUDA_OR_DIE(cudaMemcpyAsync(dev + off, host + off, kStreamCopyBytes,
                                          cudaMemcpyHostToDevice, f.streams[i]));
            }
          }
          for (std::uint32_t i = 1; i < c.count; ++i) {
            CUDA_OR_DIE(cudaEventRecord(f.done[i], f.streams[i]));
            CUDA_OR_DIE(cudaStreamWaitEvent(f.streams[0], f.done[i], 0));
          }
        },
        f.streams[0]);
    state.SetIterationTime(s);
    total_s += s;
  }
  const double bytes =
      static_cast<double>(state.iterations() * c.count * pieces * kStreamCopyBytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["loads"] = c.count;
  RecordRate(c, bytes, total_s);
}

// n blocks of 8 layers x K,V x piece, every other block slot of the arena, loaded into random
// pages of a cache of `pages` pages (contiguous or one tensor per layer), by one kernel launch
// or one cudaMemcpyAsync per piece.
void RunGather(benchmark::State& state, const gpu::KitCase& c, std::uint32_t pages, std::uint32_t n,
               unsigned seed) {
  Fixture& f = F();
  const bool kernel = absl::StartsWith(c.source, "kernel");
  const bool separate = absl::EndsWith(c.source, "separate");
  const std::uint32_t layers = 8, kv = 2;
  const std::uint64_t chunk = c.bytes;
  const auto base = reinterpret_cast<std::uintptr_t>(f.device);
  gpu::PagedCache cache;
  if (separate) {
    std::vector<std::uint64_t> bases;
    for (std::uint32_t l = 0; l < layers; ++l) bases.push_back(base + l * kv * chunk * pages);
    cache = gpu::PagedCache::LayerSeparate(bases, kv, chunk, pages);
  } else {
    cache = gpu::PagedCache::Contiguous(base, layers, kv, chunk, pages);
  }
  const std::uint64_t block = cache.BlockBytes();
  std::vector<std::uint32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0u);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(seed));
  std::vector<gpu::BlockCopy> blocks;
  for (std::uint32_t i = 0; i < n; ++i) {
    blocks.push_back(
        {reinterpret_cast<std::uintptr_t>(DataOf(*f.arena)) + 2ull * i * block, page_ids[i]});
  }
  gpu::SubmitOptions so;
  so.method = kernel ? gpu::CopyMethod::kKernel : gpu::CopyMethod::kCopyEngine;
  cudaStream_t s = f.engine->stream(gpu::Direction::kHostToDevice);
  double total_s = 0;
  for (auto _ : state) {
    const double t = TimeOnStream(
        [&] {
          auto ticket = f.engine->Submit(cache, gpu::Direction::kHostToDevice, blocks, so);
          if (!ticket.ok()) Die(std::string(ticket.status().message()));
        },
        s);
    state.SetIterationTime(t);
    total_s += t;
  }
  const double bytes = static_cast<double>(state.iterations() * n * block);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["pieces"] = static_cast<double>(std::uint64_t{n} * layers * kv);
  RecordRate(c, bytes, total_s);
}

void BM_Gather(benchmark::State& state, const gpu::KitCase& c) {
  if (c.count == 0) {  // 256 MiB of blocks scattered over every other slot
    const auto pages = static_cast<std::uint32_t>(kGatherBytes / (8 * 2 * c.bytes));
    RunGather(state, c, pages, pages / 2, 7);
  } else {  // c.count blocks of 64 KiB (8 layers x K,V x 4 KiB)
    RunGather(state, c, 2048, c.count, 11);
  }
}

// D2H into arena blocks of a pool file, persisted, then read through a second mapping.
void BM_WriteBack(benchmark::State& state, const gpu::KitCase& c) {
  Fixture& f = F();
  const std::string path = absl::StrCat("/dev/shm/cxlkv-kit-writeback-", ::getpid());
  const std::uint64_t block = c.bytes, n = c.count;
  {
    auto region =
        pool::OpenRegion(absl::StrCat("file:", path, "?size=", 2 * n * block + 32 * kMiB));
    if (!region.ok()) Die(std::string(region.status().message()));
    auto arena = pool::Arena::Format(std::move(*region), ArenaFormat());
    if (!arena.ok()) Die(std::string(arena.status().message()));
    if ((*arena)->class_record(0).block_bytes != block)
      Die("write-back arena: unexpected block size");
    auto alloc = cxlkv::allocator::BlockAllocator::Create(std::move(*arena));
    if (!alloc.ok()) Die(std::string(alloc.status().message()));
    auto id = f.registrar->RegisterArena((*alloc)->arena());
    if (!id.ok()) Die(std::string(id.status().message()));
    if (auto st = f.registrar->Wait(*id); !st.ok()) Die(std::string(st.message()));
    std::vector<cxlkv::allocator::BlockHandle> handles(n);
    if (!(*alloc)->AllocBulk(0, n, handles.data())) Die("write-back arena: no room for the blocks");
    // The device's bytes: a seeded pattern, one page per block.
    std::vector<std::byte> pattern(n * block);
    std::mt19937_64 rng(20261206);
    for (std::size_t i = 0; i < pattern.size(); i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(&pattern[i], &v, 8);
    }
    CUDA_OR_DIE(cudaMemcpy(f.device, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
    const gpu::PagedCache cache =
        gpu::PagedCache::Contiguous(reinterpret_cast<std::uintptr_t>(f.device), 8, 2, block / 16,
                                    static_cast<std::uint32_t>(n));
    std::vector<gpu::BlockCopy> copies;
    for (std::uint32_t i = 0; i < n; ++i) {
      copies.push_back({reinterpret_cast<std::uintptr_t>((*alloc)->Addr(handles[i])), i});
    }
    double total_s = 0;
    for (auto _ : state) {
      state.PauseTiming();
      for (const auto& h : handles) std::memset((*alloc)->Addr(h), 0, block);  // stale bytes
      state.ResumeTiming();
      const auto t0 = std::chrono::steady_clock::now();
      auto ticket = f.engine->Submit(cache, gpu::Direction::kDeviceToHost, copies);
      if (!ticket.ok()) Die(std::string(ticket.status().message()));
      if (auto st = f.engine->Wait(*ticket); !st.ok()) Die(std::string(st.message()));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      state.SetIterationTime(s);
      total_s += s;
    }
    // Publish: each block handed to nobody, its map word in memory.
    std::vector<cxlkv::allocator::BlockRef> refs;
    for (const auto& h : handles) {
      if (auto st = (*alloc)->Persist(h); !st.ok()) Die(std::string(st.message()));
      refs.push_back((*alloc)->Ref(h));
    }
    // A second mapping of the same file, as another process or host of the pool opens it.
    auto second = pool::OpenRegion(absl::StrCat("file:", path));
    if (!second.ok()) Die(std::string(second.status().message()));
    pool::OpenOptions oo;
    oo.read_only = true;
    auto view = pool::Arena::Open(std::move(*second), oo);
    if (!view.ok()) Die(std::string(view.status().message()));
    std::uint32_t matched = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      auto p = (*view)->Resolve(refs[i].arena, refs[i].index, refs[i].generation);
      if (p.ok() && *p != (*alloc)->Addr(handles[i]) &&
          std::memcmp(*p, &pattern[i * block], block) == 0) {
        ++matched;
      }
    }
    RecordRate(c, static_cast<double>(state.iterations() * n * block), total_s);
    g_records[c.name].values["blocks"] = static_cast<double>(n);
    g_records[c.name].values["matched"] = matched;
    if (matched != n)
      state.SkipWithError(
          "a block read through the second mapping differs from the device's bytes");
    if (auto st = f.registrar->Unregister(*id); !st.ok()) Die(std::string(st.message()));
  }
  ::unlink(path.c_str());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * block));
}

// One registrar per mode (and size, for the one-call modes), kept to the end of the process
// (never destroyed: no CUDA calls from static destructors).
gpu::Registrar& RegistrarFor(const std::string& mode, std::uint64_t bytes) {
  static auto* regs = new std::map<std::string, gpu::Registrar*>;
  const std::string key = absl::StrCat(mode, "/", mode == "chunked" ? 0 : bytes);
  gpu::Registrar*& r = (*regs)[key];
  if (r == nullptr) {
    gpu::RegistrarOptions o;  // chunked: as shipped
    if (mode != "chunked") {
      o.first_chunk_bytes = 0;
      // One cudaHostRegister for the whole region, up to the registrar's 64 GiB chunk cap.
      o.max_chunk_bytes = std::min(bytes, gpu::kMaxChunkBytes);
      o.prefault_threads = mode == "one-call" ? 0 : std::max(1u, g_plan.machine.host_cpus);
    }
    auto made = gpu::Registrar::Create(o);
    if (!made.ok()) Die(std::string(made.status().message()));
    r = made->release();
  }
  return *r;
}

void BM_Register(benchmark::State& state, const gpu::KitCase& c) {
  gpu::Registrar& reg = RegistrarFor(c.source, c.bytes);
  const double gib = static_cast<double>(c.bytes) / static_cast<double>(kGiB);
  gpu::KitRecord rec;
  for (auto _ : state) {
    auto region = pool::OpenRegion(absl::StrCat("memfd:cxlkv-kit-register?size=", c.bytes));
    if (!region.ok()) Die(std::string(region.status().message()));
    auto id = reg.RegisterRegion(**region);
    absl::Status st = id.ok() ? reg.Wait(*id) : id.status();
    if (!st.ok()) {
      rec.error = std::string(st.message());
      state.SkipWithError(rec.error.c_str());
      if (id.ok()) (void)reg.Unregister(*id);
      break;
    }
    const auto info = reg.Info(*id);
    // From the registration thread taking it up to the last chunk pinned: prefaulting
    // included, queueing not.
    const double wall_s = static_cast<double>(info->finished_ns - info->started_ns) / 1e9;
    state.SetIterationTime(wall_s);
    rec.values = {
        {"s_per_GiB", wall_s / gib},
        {"pin_s_per_GiB", info->NsPerGiB() / 1e9},
        {"first_chunk_ms", static_cast<double>(info->first_chunk_ns - info->started_ns) / 1e6},
        {"chunks", static_cast<double>(info->chunks.size())}};
    if (auto u = reg.Unregister(*id); !u.ok()) Die(std::string(u.message()));
  }
  for (const auto& [k, v] : rec.values) state.counters[k] = v;
  g_records[c.name] = rec;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

// 64 KiB H2D copies from the registered arena, one at a time: their latency before and while
// a registration (as shipped) of c.bytes runs on the registrar's thread.
void BM_RegisterUnderTraffic(benchmark::State& state, const gpu::KitCase& c) {
  Fixture& f = F();
  gpu::Registrar& reg = RegistrarFor("chunked", c.bytes);
  std::byte* src = DataOf(*f.arena);
  auto one_copy_us = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_OR_DIE(
        cudaMemcpyAsync(f.device, src, kTrafficCopyBytes, cudaMemcpyHostToDevice, f.streams[1]));
    CUDA_OR_DIE(cudaStreamSynchronize(f.streams[1]));
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  gpu::KitRecord rec;
  for (auto _ : state) {
    std::vector<double> idle, during;
    for (int i = 0; i < 3000; ++i) idle.push_back(one_copy_us());
    auto region = pool::OpenRegion(absl::StrCat("memfd:cxlkv-kit-traffic?size=", c.bytes));
    if (!region.ok()) Die(std::string(region.status().message()));
    auto id = reg.RegisterRegion(**region);
    if (!id.ok()) Die(std::string(id.status().message()));
    for (;;) {
      const auto info = reg.Info(*id);
      if (!info.ok() || info->state == gpu::RegState::kRegistered ||
          info->state == gpu::RegState::kFailed)
        break;
      during.push_back(one_copy_us());
    }
    if (auto st = reg.Wait(*id); !st.ok()) {
      rec.error = std::string(st.message());
      state.SkipWithError(rec.error.c_str());
      break;
    }
    if (during.size() < 100) {  // too few to say anything of the registration's effect
      rec.error =
          absl::StrCat("the registration ended after ", during.size(), " copies ran beside it");
      state.SkipWithError(rec.error.c_str());
      (void)reg.Unregister(*id);
      break;
    }
    const auto info = reg.Info(*id);
    state.SetIterationTime(static_cast<double>(info->finished_ns - info->started_ns) / 1e9);
    rec.values = {{"p50_idle_us", Percentile(idle, 0.5)},
                  {"p99_idle_us", Percentile(idle, 0.99)},
                  {"p50_during_us", Percentile(during, 0.5)},
                  {"p99_during_us", Percentile(during, 0.99)},
                  {"copies_during", static_cast<double>(during.size())},
                  {"s_per_GiB", static_cast<double>(info->finished_ns - info->started_ns) / 1e9 /
                                    (static_cast<double>(c.bytes) / static_cast<double>(kGiB))}};
    if (auto u = reg.Unregister(*id); !u.ok()) Die(std::string(u.message()));
  }
  for (const auto& [k, v] : rec.values) state.counters[k] = v;
  g_records[c.name] = rec;
}

void Register() {
  for (const gpu::KitCase& c : g_plan.cases) {
    if (!c.skipped.empty()) continue;
    void (*fn)(benchmark::State&, const gpu::KitCase&) = nullptr;
    bool once = false;
    switch (c.group) {
      case gpu::KitGroup::kCopy:
        fn = BM_Copy;
        break;
      case gpu::KitGroup::kStreams:
        fn = BM_Streams;
        break;
      case gpu::KitGroup::kGather:
        fn = BM_Gather;
        break;
      case gpu::KitGroup::kWriteBack:
        fn = BM_WriteBack;
        break;
      case gpu::KitGroup::kRegister:
        fn = BM_Register;
        once = true;
        break;
      case gpu::KitGroup::kRegisterUnderTraffic:
        fn = BM_RegisterUnderTraffic;
        once = true;
        break;
    }
    const gpu::KitCase* cp = &c;
    auto* b = benchmark::RegisterBenchmark(c.name.c_str(),
                                           [fn, cp](benchmark::State& st) { fn(st, *cp); });
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (once) b->Iterations(1);
  }
}

// This machine: the host from /proc and /sys, the device from CUDA.
gpu::KitMachine ProbeMachine() {
  gpu::KitMachine m = gpu::ReadHostMachine();
  if (!gpu::ProbeDevice(0).ok() || cudaSetDevice(0) != cudaSuccess) return m;
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return m;
  m.device_free_bytes = free_bytes;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) m.device_name = prop.name;
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, 0) == cudaSuccess)
    m.gpu_numa_node = gpu::NumaNodeOfPciDevice(bus);
  return m;
}

void WriteJson(const std::string& path) {
  if (path.empty()) return;
  if (auto st = cxlkv::base::ReplaceFile(path, gpu::KitJson(g_plan, g_records)); !st.ok()) {
    std::fprintf(stderr, "gpu_benchmark: --kit_json: %s\n", std::string(st.message()).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool plan_only = false;
  std::string machine_spec, json_path;
  gpu::KitOptions ko;
  // Our flags out of argv before Google Benchmark reads it.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kit_plan") {
      plan_only = true;
    } else if (absl::StartsWith(a, "--kit_machine=")) {
      machine_spec = a.substr(14);
    } else if (absl::StartsWith(a, "--kit_json=")) {
      json_path = a.substr(11);
    } else if (absl::StartsWith(a, "--kit_budget_s=")) {
      if (!absl::SimpleAtod(a.substr(15), &ko.budget_s) || ko.budget_s <= 0) {
        std::fprintf(stderr,
                     "gpu_benchmark: --kit_budget_s '%s' is not a positive number of seconds\n",
                     a.substr(15).c_str());
        return 2;
      }
    } else if (absl::StartsWith(a, "--kit_")) {
      std::fprintf(
          stderr,
          "gpu_benchmark: unknown flag %s (the kit's flags: --kit_plan, --kit_machine=SPEC, "
          "--kit_budget_s=S, --kit_json=FILE)\n",
          a.c_str());
      return 2;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  gpu::KitMachine machine;
  if (!machine_spec.empty()) {
    auto m = gpu::ParseKitMachine(machine_spec);
    if (!m.ok()) {
      std::fprintf(stderr, "gpu_benchmark: %s\n", std::string(m.status().message()).c_str());
      return 2;
    }
    machine = *m;
  } else {
    machine = ProbeMachine();
  }
  g_plan = gpu::PlanKit(machine, ko);
  for (const std::string& line : gpu::FormatKitPlan(g_plan)) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (plan_only) {
    WriteJson(json_path);
    return 0;
  }
  if (const absl::Status st = gpu::ProbeDevice(0); !st.ok()) {
    std::printf("gpu_benchmark: skipped, nothing measured: %s\n",
                std::string(st.message()).c_str());
    WriteJson(json_path);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const std::string& line : gpu::KitSummary(g_plan, g_records))
    std::printf("%s\n", line.c_str());
  WriteJson(json_path);
  return 0;
}
