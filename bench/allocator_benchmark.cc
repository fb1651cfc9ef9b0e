// allocator_benchmark — KV block allocation: cxlkv::allocator::BlockAllocator against the
// general-purpose allocators a KV cache would otherwise sit on, all in one run.
//
//   AllocFree/<peer>/<bytes>/threads:N   one alloc, a store to byte 0, one free; per pair
//   BulkAlloc/<peer>/<bytes>             1,024 allocs (each block touched), then 1,024 frees;
//                                        real time per batch, items = blocks
//
// Peers: glibc (its own __libc_memalign/__libc_free, looked up inside libc.so.6), jemalloc
// (mallocx/dallocx), mimalloc (mi_malloc_aligned/mi_free), tcmalloc (tc_posix_memalign/
// tc_free), memkind (memkind_posix_memalign(MEMKIND_DEFAULT)/memkind_free). Several of these
// libraries replace malloc, and two of them also define __libc_memalign, so a plain
// malloc() in this process reaches whichever the loader found first. Each peer is therefore
// called through names only it defines, and main() checks with dladdr() that every entry
// point lives in the library it is meant to measure, aborting otherwise. The JSON context
// records what each name resolved to and which library answers plain malloc().
//
// Every peer gets 64-byte alignment (a cache line, what CopyNt needs); cxlkv blocks are
// 4 KiB-aligned by construction.
#include <dlfcn.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "benchmark/benchmark.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

#ifdef CXLKV_BENCH_JEMALLOC
// jemalloc.h redeclares malloc() and friends with attributes that clash with glibc's
// declarations in C++; only these two entry points are needed.
extern "C" void* mallocx(std::size_t size, int flags);
extern "C" void dallocx(void* ptr, int flags);
#endif
#ifdef CXLKV_BENCH_MIMALLOC
#include <mimalloc.h>
#endif
#ifdef CXLKV_BENCH_TCMALLOC
#include <gperftools/tcmalloc.h>
#endif
#ifdef CXLKV_BENCH_MEMKIND
#include <memkind.h>
#endif

namespace {

using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
using cxlkv::allocator::FreeResult;

constexpr std::size_t kAlignBytes = 64;
constexpr std::int64_t kPairSizes[] = {64 << 10, 256 << 10, 1 << 20, 2 << 20, 8 << 20};
constexpr std::int64_t kBulkSizes[] = {64 << 10, 2 << 20};
constexpr std::size_t kBulkBlocks = 1024;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "allocator_benchmark: %s\n", msg.c_str());
  std::abort();
}

// ---- peers ----------------------------------------------------------------------------------
// Each peer: Name(), Alloc(bytes) -> pointer or nullptr, Free(pointer).

using MemalignFn = void* (*)(std::size_t, std::size_t);
using MallocFn = void* (*)(std::size_t);
using FreeFn = void (*)(void*);
MemalignFn g_libc_memalign = nullptr;
MallocFn g_libc_malloc = nullptr;
FreeFn g_libc_free = nullptr;

struct Glibc {
  static const char* Name() { return "glibc"; }
  static void* Alloc(std::size_t n) noexcept { return g_libc_memalign(kAlignBytes, n); }
  static void Free(void* p) noexcept { g_libc_free(p); }
};
// Plain malloc (16-byte alignment only): glibc's memalign path costs a split and a free of
// the leading remainder per call, so this row shows what the alignment costs glibc.
struct GlibcMalloc {
  static const char* Name() { return "glibc_malloc"; }
  static void* Alloc(std::size_t n) noexcept { return g_libc_malloc(n); }
  static void Free(void* p) noexcept { g_libc_free(p); }
};
#ifdef CXLKV_BENCH_JEMALLOC
struct Jemalloc {
  static const char* Name() { return "jemalloc"; }
  static constexpr int kFlags = 6;  // MALLOCX_LG_ALIGN(6): 64-byte alignment
  static void* Alloc(std::size_t n) noexcept { return mallocx(n, kFlags); }
  static void Free(void* p) noexcept { dallocx(p, kFlags); }
};
#endif
#ifdef CXLKV_BENCH_MIMALLOC
struct Mimalloc {
  static const char* Name() { return "mimalloc"; }
  static void* Alloc(std::size_t n) noexcept { return mi_malloc_aligned(n, kAlignBytes); }
  static void Free(void* p) noexcept { mi_free(p); }
};
#endif
#ifdef CXLKV_BENCH_TCMALLOC
struct Tcmalloc {
  static const char* Name() { return "tcmalloc"; }
  static void* Alloc(std::size_t n) noexcept {
    void* p = nullptr;
    return tc_posix_memalign(&p, kAlignBytes, n) == 0 ? p : nullptr;
  }
  static void Free(void* p) noexcept { tc_free(p); }
};
#endif
#ifdef CXLKV_BENCH_MEMKIND
struct Memkind {
  static const char* Name() { return "memkind"; }
  static void* Alloc(std::size_t n) noexcept {
    void* p = nullptr;
    return memkind_posix_memalign(MEMKIND_DEFAULT, &p, kAlignBytes, n) == 0 ? p : nullptr;
  }
  static void Free(void* p) noexcept { memkind_free(MEMKIND_DEFAULT, p); }
};
#endif

template <class Peer>
void BM_AllocFree(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  unsigned char v = 0;
  for (auto _ : state) {
    auto* p = static_cast<unsigned char*>(Peer::Alloc(bytes));
    if (p == nullptr) [[unlikely]] {
      state.SkipWithError(
          absl::StrCat(Peer::Name(), ": allocation of ", bytes, " bytes failed").c_str());
      break;
    }
    p[0] = v++;
    benchmark::DoNotOptimize(p);
    Peer::Free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

template <class Peer>
void BM_BulkAlloc(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char*> ptrs(kBulkBlocks);
  for (auto _ : state) {
    for (auto& p : ptrs) {
      p = static_cast<unsigned char*>(Peer::Alloc(bytes));
      if (p == nullptr) [[unlikely]] {
        Die(absl::StrCat(Peer::Name(), ": bulk allocation of ", bytes, " bytes failed"));
      }
      p[0] = 1;
    }
    benchmark::DoNotOptimize(ptrs.data());
    benchmark::ClobberMemory();
    for (unsigned char* p : ptrs) Peer::Free(p);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kBulkBlocks));
}

// ---- cxlkv ----------------------------------------------------------------------------------
// One arena, one class per block size, on an 8 GiB memfd (only byte 0 of each block is ever
// touched, so only one page per block becomes resident). Class shares are sized so every
// class has at least 256 blocks (>= 64 per thread) and the 64 KiB and 2 MiB classes have
// over 2,048 for BulkAlloc.
struct CxlkvFixture {
  std::unique_ptr<BlockAllocator> allocator;
  std::uint32_t ClassOf(std::size_t bytes) const {
    for (std::uint32_t c = 0; c < allocator->class_count(); ++c) {
      if (allocator->block_bytes(c) == bytes) return c;
    }
    Die(absl::StrCat("no size class of ", bytes, " bytes"));
  }
};
CxlkvFixture* g_cxlkv = nullptr;

void SetUpCxlkv() {
  auto region = cxlkv::pool::OpenRegion("memfd:cxlkv-bench-alloc?size=8G");
  if (!region.ok()) Die(region.status().ToString());
  cxlkv::pool::FormatOptions options;
  // Weights in units of 128 MiB of blocks: 64K x2, 256K x1, 1M x4, 2M x32, 8M x16.
  const std::uint32_t weights[] = {2, 1, 4, 32, 16};
  for (std::size_t i = 0; i < std::size(kPairSizes); ++i) {
    options.classes.push_back(
        cxlkv::pool::ClassSpec{0, static_cast<std::uint64_t>(kPairSizes[i]), weights[i]});
  }
  auto arena = cxlkv::pool::Arena::Format(*std::move(region), options);
  if (!arena.ok()) Die(arena.status().ToString());
  auto allocator = BlockAllocator::Create(*std::move(arena));
  if (!allocator.ok()) Die(allocator.status().ToString());
  g_cxlkv = new CxlkvFixture{*std::move(allocator)};
  // Fault in the page holding byte 0 of every block once, as a long-running server's arena
  // would be: a fresh memfd page costs a fault (and a page clear) on first touch, which
  // devdax memory never does. The peers' heaps are warmed the same way by their own
  // earlier runs; an allocator that returns memory to the OS (glibc's trim) pays again.
  BlockAllocator& a = *g_cxlkv->allocator;
  for (std::uint32_t c = 0; c < a.class_count(); ++c) {
    std::vector<BlockHandle> all;
    for (BlockHandle h = a.Alloc(c); h.valid(); h = a.Alloc(c)) {
      a.Addr(h)[0] = std::byte{0};
      all.push_back(h);
    }
    if (a.FreeBulk(all.data(), all.size()) != all.size()) Die("prefault: FreeBulk failed");
  }
  a.FlushThreadCache();
  std::string classes;
  for (std::uint32_t c = 0; c < a.class_count(); ++c) {
    const auto& k = a.arena().class_record(c);
    absl::StrAppend(&classes, c == 0 ? "" : ", ", k.block_bytes, "x", k.block_count);
  }
  benchmark::AddCustomContext("cxlkv_arena", absl::StrCat("memfd 8 GiB, classes ", classes));
}

void BM_AllocFreeCxlkv(benchmark::State& state) {
  BlockAllocator& a = *g_cxlkv->allocator;
  const std::uint32_t cls = g_cxlkv->ClassOf(static_cast<std::size_t>(state.range(0)));
  unsigned char v = 0;
  for (auto _ : state) {
    const BlockHandle h = a.Alloc(cls);
    if (!h.valid()) [[unlikely]] {
      state.SkipWithError(a.ExplainAllocFailure(cls).ToString().c_str());
      break;
    }
    std::byte* p = a.Addr(h);
    p[0] = static_cast<std::byte>(v++);
    benchmark::DoNotOptimize(p);
    if (a.Free(h) != FreeResult::kOk) [[unlikely]] {
      state.SkipWithError("cxlkv: Free failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// AllocBulk + FreeBulk: the batch API.
void BM_BulkAllocCxlkv(benchmark::State& state) {
  BlockAllocator& a = *g_cxlkv->allocator;
  const std::uint32_t cls = g_cxlkv->ClassOf(static_cast<std::size_t>(state.range(0)));
  std::vector<BlockHandle> handles(kBulkBlocks);
  for (auto _ : state) {
    if (!a.AllocBulk(cls, kBulkBlocks, handles.data())) [[unlikely]] {
      Die(a.ExplainAllocFailure(cls).ToString());
    }
    for (const BlockHandle& h : handles) a.Addr(h)[0] = std::byte{1};
    benchmark::ClobberMemory();
    if (a.FreeBulk(handles.data(), kBulkBlocks) != kBulkBlocks) [[unlikely]] {
      Die("cxlkv: FreeBulk freed fewer blocks than it was given");
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kBulkBlocks));
}

// The same batch through the single-block calls, as the peers do it.
void BM_BulkLoopCxlkv(benchmark::State& state) {
  BlockAllocator& a = *g_cxlkv->allocator;
  const std::uint32_t cls = g_cxlkv->ClassOf(static_cast<std::size_t>(state.range(0)));
  std::vector<BlockHandle> handles(kBulkBlocks);
  for (auto _ : state) {
    for (BlockHandle& h : handles) {
      h = a.Alloc(cls);
      if (!h.valid()) [[unlikely]]
        Die(a.ExplainAllocFailure(cls).ToString());
      a.Addr(h)[0] = std::byte{1};
    }
    benchmark::ClobberMemory();
    for (const BlockHandle& h : handles) {
      if (a.Free(h) != FreeResult::kOk) [[unlikely]]
        Die("cxlkv: Free failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kBulkBlocks));
}

// ---- resolution checks ----------------------------------------------------------------------

std::string LibraryOf(const void* addr) {
  Dl_info info{};
  if (addr == nullptr || ::dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

template <class Fn>
const void* Addr(Fn* fn) {
  return reinterpret_cast<const void*>(fn);
}

// Aborts unless `what` lives in a library whose path contains `library`.
void ExpectIn(absl::string_view what, const void* addr, absl::string_view library) {
  const std::string found = LibraryOf(addr);
  if (!absl::StrContains(found, library)) {
    Die(absl::StrCat(what, " resolves to ", found, ", not to ", library,
                     ": that peer would not be measured; fix the link order or the lookup"));
  }
  benchmark::AddCustomContext(absl::StrCat("resolves:", what), found);
}

void ResolveGlibc() {
  // dlsym on libc's own handle searches libc.so.6 (and ld.so) only, so a __libc_memalign
  // defined by mimalloc or tcmalloc cannot answer.
  // Runs in main() before any benchmark thread exists, so dlerror() cannot race.
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) {
    Die(absl::StrCat("dlopen(libc.so.6): ", ::dlerror()));  // NOLINT(concurrency-mt-unsafe)
  }
  g_libc_memalign = reinterpret_cast<MemalignFn>(::dlsym(libc, "__libc_memalign"));
  g_libc_malloc = reinterpret_cast<MallocFn>(::dlsym(libc, "__libc_malloc"));
  g_libc_free = reinterpret_cast<FreeFn>(::dlsym(libc, "__libc_free"));
  ExpectIn("glibc.__libc_memalign", Addr(g_libc_memalign), "libc.so.6");
  ExpectIn("glibc.__libc_malloc", Addr(g_libc_malloc), "libc.so.6");
  ExpectIn("glibc.__libc_free", Addr(g_libc_free), "libc.so.6");
}

void CheckPeers() {
  ResolveGlibc();
#ifdef CXLKV_BENCH_JEMALLOC
  ExpectIn("jemalloc.mallocx", Addr(&mallocx), "libjemalloc");
  ExpectIn("jemalloc.dallocx", Addr(&dallocx), "libjemalloc");
#endif
#ifdef CXLKV_BENCH_MIMALLOC
  ExpectIn("mimalloc.mi_malloc_aligned", Addr(&mi_malloc_aligned), "libmimalloc");
  ExpectIn("mimalloc.mi_free", Addr(&mi_free), "libmimalloc");
#endif
#ifdef CXLKV_BENCH_TCMALLOC
  ExpectIn("tcmalloc.tc_posix_memalign", Addr(&tc_posix_memalign), "libtcmalloc");
  ExpectIn("tcmalloc.tc_free", Addr(&tc_free), "libtcmalloc");
#endif
#ifdef CXLKV_BENCH_MEMKIND
  ExpectIn("memkind.memkind_posix_memalign", Addr(&memkind_posix_memalign), "libmemkind");
  ExpectIn("memkind.memkind_free", Addr(&memkind_free), "libmemkind");
#endif
  benchmark::AddCustomContext("process_malloc", LibraryOf(::dlsym(RTLD_DEFAULT, "malloc")));
}

// ---- registration ---------------------------------------------------------------------------

template <class Peer>
void RegisterPeer() {
  auto* pair = benchmark::RegisterBenchmark(absl::StrCat("AllocFree/", Peer::Name()).c_str(),
                                            &BM_AllocFree<Peer>);
  for (std::int64_t bytes : kPairSizes) pair->Arg(bytes);
  pair->Threads(1)->Threads(2);
  auto* bulk = benchmark::RegisterBenchmark(absl::StrCat("BulkAlloc/", Peer::Name()).c_str(),
                                            &BM_BulkAlloc<Peer>);
  for (std::int64_t bytes : kBulkSizes) bulk->Arg(bytes);
  bulk->UseRealTime();
}

#ifdef CXLKV_BENCH_MEMKIND
// MEMKIND_DAX_KMEM is the kind memkind offers for CXL/PMEM memory onlined as a CPU-less NUMA
// node. Where the machine has none, the run records why instead of a figure.
void RegisterMemkindDaxKmem() {
  const int err = memkind_check_available(MEMKIND_DAX_KMEM);
  if (err == 0) {
    benchmark::AddCustomContext("memkind_dax_kmem", "available");
    return;  // a machine with a kmem DAX node: see RESULTS.md to add it as a peer
  }
  char msg[MEMKIND_ERROR_MESSAGE_SIZE] = {};
  memkind_error_message(err, msg, sizeof(msg));
  const std::string why = absl::StrCat("MEMKIND_DAX_KMEM unavailable: memkind_check_available -> ",
                                       err, " \"", msg, "\"");
  benchmark::AddCustomContext("memkind_dax_kmem", why);
  benchmark::RegisterBenchmark("AllocFree/memkind_dax_kmem",
                               [why](benchmark::State& state) {
                                 for (auto _ : state) {
                                   state.SkipWithError(why.c_str());
                                   break;
                                 }
                               })
      ->Arg(64 << 10)
      ->Iterations(1);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CheckPeers();
  SetUpCxlkv();

  auto* pair = benchmark::RegisterBenchmark("AllocFree/cxlkv", &BM_AllocFreeCxlkv);
  for (std::int64_t bytes : kPairSizes) pair->Arg(bytes);
  pair->Threads(1)->Threads(2);
  auto* bulk = benchmark::RegisterBenchmark("BulkAlloc/cxlkv_AllocBulk", &BM_BulkAllocCxlkv);
  for (std::int64_t bytes : kBulkSizes) bulk->Arg(bytes);
  bulk->UseRealTime();
  auto* loop = benchmark::RegisterBenchmark("BulkAlloc/cxlkv_loop", &BM_BulkLoopCxlkv);
  for (std::int64_t bytes : kBulkSizes) loop->Arg(bytes);
  loop->UseRealTime();

  RegisterPeer<Glibc>();
  RegisterPeer<GlibcMalloc>();
#ifdef CXLKV_BENCH_JEMALLOC
  RegisterPeer<Jemalloc>();
#endif
#ifdef CXLKV_BENCH_MIMALLOC
  RegisterPeer<Mimalloc>();
#endif
#ifdef CXLKV_BENCH_TCMALLOC
  RegisterPeer<Tcmalloc>();
#endif
#ifdef CXLKV_BENCH_MEMKIND
  RegisterPeer<Memkind>();
  RegisterMemkindDaxKmem();
#endif

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete g_cxlkv;
  return 0;
}
