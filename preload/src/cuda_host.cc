// CUDA host allocations and registrations: the interposed cudaHostAlloc / cudaMallocHost /
// cudaFreeHost / cudaHostGetDevicePointer / cudaHostRegister / cudaHostUnregister, the CUDA
// runtime the program uses (looked up, never linked), the one-time registration of the whole
// heap, the table of cuda host blocks served from CXL, and the split of registrations larger
// than one driver call may pin (host_register.h).
//
// Instrumented in sanitizer builds, unlike the malloc-family entry points: only a program
// calls these, never the loader, libc or a sanitizer runtime while it starts, so they run
// after start-up; the CXL paths also need an active heap.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cxlkv/gpu/plan.h"
#include "cxlkv/preload/host_register.h"
#include "log.h"
#include "shim_internal.h"

namespace cxlkv::preload::shim {

pthread_mutex_t cuda_mu = PTHREAD_MUTEX_INITIALIZER;
std::atomic<std::uint64_t> register_chunk_bytes{kDefaultRegisterChunkBytes};

namespace {

using cudaError_t = int;
constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorInvalidValue = 1;
constexpr cudaError_t kCudaErrorInitialization = 3;
constexpr cudaError_t kCudaErrorNoDevice = 100;
constexpr unsigned kRegisterPortable = 1, kRegisterMapped = 2;

struct CudaFns {
  cudaError_t (*HostAlloc)(void**, std::size_t, unsigned);
  cudaError_t (*MallocHost)(void**, std::size_t);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*HostGetDevicePointer)(void**, void*, unsigned);
  cudaError_t (*HostRegister)(void*, std::size_t, unsigned);
  cudaError_t (*HostUnregister)(void*);
  cudaError_t (*GetDeviceCount)(int*);
  const char* (*GetErrorString)(cudaError_t);
};
CudaFns cuda{};
pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
bool cuda_can_register = false;
cudaError_t cuda_no_register_error = kCudaErrorNoDevice;
char cuda_reason[256] = "";

template <typename F>
void CudaLookup(void* handle, F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(handle != nullptr ? ::dlsym(handle, name) : ::dlsym(RTLD_NEXT, name));
}

void ResolveCuda() noexcept {
  Guard g;
  // The runtime the program already uses (the next definition after ours); when the program
  // reached us without one loaded, the runtime on the library path.
  void* handle = nullptr;
  if (::dlsym(RTLD_NEXT, "cudaHostRegister") == nullptr) {
    for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      handle = ::dlopen(so, RTLD_NOW | RTLD_NOLOAD);
      if (handle == nullptr) handle = ::dlopen(so, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
    }
  }
  CudaLookup(handle, cuda.HostAlloc, "cudaHostAlloc");
  CudaLookup(handle, cuda.MallocHost, "cudaMallocHost");
  CudaLookup(handle, cuda.FreeHost, "cudaFreeHost");
  CudaLookup(handle, cuda.HostGetDevicePointer, "cudaHostGetDevicePointer");
  CudaLookup(handle, cuda.HostRegister, "cudaHostRegister");
  CudaLookup(handle, cuda.HostUnregister, "cudaHostUnregister");
  CudaLookup(handle, cuda.GetDeviceCount, "cudaGetDeviceCount");
  CudaLookup(handle, cuda.GetErrorString, "cudaGetErrorString");
  if (cuda.HostRegister == nullptr || cuda.GetDeviceCount == nullptr) {
    std::snprintf(cuda_reason, sizeof(cuda_reason),
                  "no CUDA runtime (libcudart) in the process or on the library path");
    return;
  }
  int devices = 0;
  const cudaError_t err = cuda.GetDeviceCount(&devices);
  if (err != kCudaSuccess || devices == 0) {
    cuda_no_register_error = err != kCudaSuccess ? err : kCudaErrorNoDevice;
    std::snprintf(cuda_reason, sizeof(cuda_reason), "cudaGetDeviceCount: %s (error %d)",
                  cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "no device", err);
    return;
  }
  cuda_can_register = true;
  std::snprintf(cuda_reason, sizeof(cuda_reason), "%d CUDA device(s)", devices);
}

struct CudaBlock {
  std::uintptr_t addr;
  std::size_t bytes;
  bool registered;        // pinned: by the whole-heap registration, or by its own call
  bool own_registration;  // registered alone (the heap has no fixed range or refused)
};

// The whole heap is registered once, at the first cuda host allocation served from CXL, in
// chunks of at most 64 GiB (gpu::PlanChunks) — never per block: per-block registration pays
// the driver's pinning cost on every allocation and fragments the GPU's mappings. Not at
// start-up: the shim is loaded into every process of a serving stack (tokenizers, workers
// without a GPU), and registering would create a CUDA context in each of them.
enum class HeapPin : std::uint8_t { kNo, kYes, kFailed };
pthread_once_t heap_pin_once = PTHREAD_ONCE_INIT;
HeapPin heap_pin = HeapPin::kNo;

void PinHeap() noexcept {
  Guard g;
  const AddressRange r = heap->range();
  if (r.bytes == 0) {
    Logf(LogLevel::kInfo,
         "the CXL heap has no fixed range (%s); cuda host blocks are "
         "registered one by one",
         state_reason);
    heap_pin = HeapPin::kFailed;
    return;
  }
  auto plan = gpu::PlanChunks(
      r.bytes, kPage,
      std::min(gpu::kMaxChunkBytes, register_chunk_bytes.load(std::memory_order_relaxed)));
  if (!plan.ok()) {
    Logf(LogLevel::kWarn,
         "cannot plan the heap's registration: %s; cuda host blocks are "
         "registered one by one",
         std::string(plan.status().message()).c_str());
    heap_pin = HeapPin::kFailed;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t done = 0;
  for (; done < plan->size(); ++done) {
    const gpu::ChunkPlan& c = (*plan)[done];
    const cudaError_t err = cuda.HostRegister(reinterpret_cast<void*>(r.lo + c.offset), c.bytes,
                                              kRegisterPortable | kRegisterMapped);
    if (err != kCudaSuccess) {
      Logf(LogLevel::kWarn,
           "cudaHostRegister of heap chunk %zu (%llu bytes at offset %llu) failed: %s (error %d); "
           "cuda host blocks are registered one by one",
           done, static_cast<unsigned long long>(c.bytes),
           static_cast<unsigned long long>(c.offset),
           cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "?", err);
      for (std::size_t k = 0; k < done; ++k) {
        cuda.HostUnregister(reinterpret_cast<void*>(r.lo + (*plan)[k].offset));
      }
      heap_pin = HeapPin::kFailed;
      return;
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Logf(LogLevel::kInfo, "registered the CXL heap for CUDA: %llu bytes in %zu chunk(s), %.1f ms",
       static_cast<unsigned long long>(r.bytes), plan->size(), ms);
  heap_pin = HeapPin::kYes;
}
constexpr std::size_t kMaxCudaBlocks = 4096;
CudaBlock cuda_blocks[kMaxCudaBlocks];  // cuda_mu
std::size_t cuda_nblocks = 0;           // cuda_mu

// Finds the block containing p; cuda_mu held.
CudaBlock* FindCudaBlock(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t i = 0; i < cuda_nblocks; ++i) {
    if (a - cuda_blocks[i].addr < cuda_blocks[i].bytes) return &cuda_blocks[i];
  }
  return nullptr;
}

std::atomic<bool> once_cuda_skip{false}, once_cuda_reg_fail{false}, once_cuda_table{false};

// Serves a cuda host allocation from CXL. Returns false to let the real runtime serve it.
bool CudaHostAllocCxl(void** out, std::size_t size) noexcept {
  if (RouteFor(AllocClass::kCuda, size) != Route::kCxl) return false;
  pthread_once(&cuda_once, &ResolveCuda);
  const std::size_t bytes = ((size == 0 ? 1 : size) + kPage - 1) & ~(kPage - 1);
  void* p = CxlAlloc(AllocClass::kCuda, bytes, kPage, false);
  if (p == nullptr) return false;
  bool registered = false, own = false;
  Guard g;
  if (cuda_can_register) pthread_once(&heap_pin_once, &PinHeap);
  if (cuda_can_register && heap_pin == HeapPin::kYes) {
    registered = true;
  } else if (cuda_can_register) {
    const cudaError_t err = cuda.HostRegister(p, bytes, kRegisterPortable | kRegisterMapped);
    if (err != kCudaSuccess) {
      if (FirstTime(once_cuda_reg_fail)) {
        Logf(LogLevel::kWarn,
             "cudaHostRegister of %zu CXL bytes failed: %s (error %d); cuda host allocations "
             "that cannot be registered are served by the CUDA runtime instead",
             bytes, cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "?", err);
      }
      heap->Free(p);
      registry.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    registered = own = true;
  } else if (FirstTime(once_cuda_skip)) {
    Logf(LogLevel::kWarn,
         "cuda host allocations are served from CXL without registration (not pinned): %s",
         cuda_reason);
  }
  pthread_mutex_lock(&cuda_mu);
  const bool room = cuda_nblocks < kMaxCudaBlocks;
  if (room) {
    cuda_blocks[cuda_nblocks++] =
        CudaBlock{reinterpret_cast<std::uintptr_t>(p), bytes, registered, own};
  }
  pthread_mutex_unlock(&cuda_mu);
  if (!room) {
    if (own) cuda.HostUnregister(p);
    heap->Free(p);
    if (FirstTime(once_cuda_table)) {
      Logf(LogLevel::kWarn,
           "more than %zu CXL cuda host blocks at once; further ones are served "
           "by the CUDA runtime",
           kMaxCudaBlocks);
    }
    return false;
  }
  (registered ? registry.cuda_registered : registry.cuda_unregistered)
      .fetch_add(1, std::memory_order_relaxed);
  Logf(LogLevel::kDebug, "cuda host block %p (%zu bytes) in CXL, %s", p, bytes,
       registered ? "registered" : "not registered");
  *out = p;
  return true;
}

// Registrations the shim split into chunks (cudaHostRegister above register_chunk_bytes):
// cudaHostUnregister of the start address undoes every chunk. cuda_mu.
struct SplitRegistration {
  std::uintptr_t addr;
  std::size_t bytes;
  std::uint64_t chunk_bytes;
};
constexpr std::size_t kMaxSplits = 64;
SplitRegistration splits[kMaxSplits];  // cuda_mu
std::size_t nsplits = 0;               // cuda_mu

int RealRegister(void*, void* addr, std::size_t bytes, unsigned flags) {
  return cuda.HostRegister(addr, bytes, flags);
}
int RealUnregister(void*, void* addr) { return cuda.HostUnregister(addr); }
const char* CudaErrorText(cudaError_t err) {
  return cuda.GetErrorString != nullptr ? cuda.GetErrorString(err) : "?";
}

}  // namespace
}  // namespace cxlkv::preload::shim

// ---- exported symbols ---------------------------------------------------------------------

using namespace cxlkv::preload;        // NOLINT: the entry points below are the C ABI
using namespace cxlkv::preload::shim;  // NOLINT

CXLKV_EXPORT int cudaHostAlloc(void** ptr, std::size_t size, unsigned flags) {
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  ResolveReal();
  if (CudaHostAllocCxl(ptr, size)) return kCudaSuccess;
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.HostAlloc == nullptr) return kCudaErrorInitialization;
  const cudaError_t err = cuda.HostAlloc(ptr, size, flags);
  if (err == kCudaSuccess) CountAlloc(AllocClass::kCuda, Route::kPass, size);
  return err;
}

CXLKV_EXPORT int cudaMallocHost(void** ptr, std::size_t size) {
  if (ptr == nullptr) return kCudaErrorInvalidValue;
  ResolveReal();
  if (CudaHostAllocCxl(ptr, size)) return kCudaSuccess;
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.MallocHost == nullptr) return kCudaErrorInitialization;
  const cudaError_t err = cuda.MallocHost(ptr, size);
  if (err == kCudaSuccess) CountAlloc(AllocClass::kCuda, Route::kPass, size);
  return err;
}

CXLKV_EXPORT int cudaFreeHost(void* p) {
  if (p != nullptr && OwnerOfPtr(p) == Owner::kCxl) {
    pthread_mutex_lock(&cuda_mu);
    CudaBlock* b = FindCudaBlock(p);
    CudaBlock found{};
    const bool ok = b != nullptr && b->addr == reinterpret_cast<std::uintptr_t>(p);
    if (ok) {
      found = *b;
      *b = cuda_blocks[--cuda_nblocks];
    }
    pthread_mutex_unlock(&cuda_mu);
    if (!ok) return kCudaErrorInvalidValue;  // not a cuda host block (malloc'ed, or interior)
    Guard g;
    if (found.own_registration) cuda.HostUnregister(p);
    CountFree(AllocClass::kCuda, Route::kCxl);
    heap->Free(p);
    return kCudaSuccess;
  }
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.FreeHost == nullptr) return kCudaErrorInitialization;
  if (p != nullptr) CountFree(AllocClass::kCuda, Route::kPass);
  return cuda.FreeHost(p);
}

CXLKV_EXPORT int cudaHostGetDevicePointer(void** dev, void* host, unsigned flags) {
  pthread_once(&cuda_once, &ResolveCuda);
  if (host != nullptr && OwnerOfPtr(host) == Owner::kCxl) {
    pthread_mutex_lock(&cuda_mu);
    const CudaBlock* b = FindCudaBlock(host);
    const bool known = b != nullptr, registered = known && b->registered;
    pthread_mutex_unlock(&cuda_mu);
    if (!known) return kCudaErrorInvalidValue;
    if (!registered) return cuda_no_register_error;
  }
  if (cuda.HostGetDevicePointer == nullptr) return kCudaErrorInitialization;
  return cuda.HostGetDevicePointer(dev, host, flags);
}

// One call for the whole range, as the program asked, when the driver can take it; above the
// chunk limit, one call per chunk, each checked, all undone on the first refusal (NVIDIA's
// r580+ drivers refuse a single registration of 512 GiB or more; vLLM registers its whole
// CPU offload region at once and falls back to pageable copies when that fails).
CXLKV_EXPORT int cudaHostRegister(void* ptr, std::size_t size, unsigned flags) {
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.HostRegister == nullptr) return kCudaErrorInitialization;
  const std::uint64_t chunk = register_chunk_bytes.load(std::memory_order_relaxed);
  if (ptr == nullptr || size <= chunk) return cuda.HostRegister(ptr, size, flags);
  if (cuda.HostUnregister == nullptr) return kCudaErrorInitialization;
  Guard g;
  // The table entry is taken first (bytes 0: registration in progress), so that threads
  // registering at once cannot overfill it.
  pthread_mutex_lock(&cuda_mu);
  const bool room = nsplits < kMaxSplits;
  if (room) splits[nsplits++] = SplitRegistration{reinterpret_cast<std::uintptr_t>(ptr), 0, chunk};
  pthread_mutex_unlock(&cuda_mu);
  auto settle = [&](bool keep) {
    pthread_mutex_lock(&cuda_mu);
    for (std::size_t i = 0; i < nsplits; ++i) {
      if (splits[i].addr != reinterpret_cast<std::uintptr_t>(ptr) || splits[i].bytes != 0) continue;
      if (keep) {
        splits[i].bytes = size;
      } else {
        splits[i] = splits[--nsplits];
      }
      break;
    }
    pthread_mutex_unlock(&cuda_mu);
  };
  if (!room) {
    Logf(LogLevel::kWarn,
         "cudaHostRegister of %zu bytes at %p: more than %zu split registrations at once; "
         "passed to the driver in one call",
         size, ptr, kMaxSplits);
    return cuda.HostRegister(ptr, size, flags);
  }
  const HostRegisterOps ops{&RealRegister, &RealUnregister, nullptr};
  const auto t0 = std::chrono::steady_clock::now();
  const ChunkedRegistration r = RegisterInChunks(ptr, size, flags, chunk, ops);
  if (r.error != kCudaSuccess) {
    Logf(LogLevel::kWarn,
         "cudaHostRegister of %zu bytes at %p in %zu chunks of at most %llu bytes: chunk %zu "
         "failed: %s (error %d); the %zu chunk(s) before it were unregistered%s",
         size, ptr, r.chunks, static_cast<unsigned long long>(chunk), r.failed,
         CudaErrorText(r.error), r.error, r.failed, r.rollback_error != 0 ? " (with errors)" : "");
    settle(false);
    return r.error;
  }
  settle(true);
  registry.cuda_split_registrations.fetch_add(1, std::memory_order_relaxed);
  registry.cuda_split_chunks.fetch_add(r.chunks, std::memory_order_relaxed);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Logf(LogLevel::kInfo,
       "cudaHostRegister of %zu bytes at %p: %zu chunks of at most %llu bytes, %.1f ms", size, ptr,
       r.chunks, static_cast<unsigned long long>(chunk), ms);
  return kCudaSuccess;
}

CXLKV_EXPORT int cudaHostUnregister(void* ptr) {
  pthread_once(&cuda_once, &ResolveCuda);
  if (cuda.HostUnregister == nullptr) return kCudaErrorInitialization;
  pthread_mutex_lock(&cuda_mu);
  SplitRegistration found{};
  for (std::size_t i = 0; i < nsplits; ++i) {
    if (splits[i].addr == reinterpret_cast<std::uintptr_t>(ptr) && splits[i].bytes != 0) {
      found = splits[i];
      splits[i] = splits[--nsplits];
      break;
    }
  }
  pthread_mutex_unlock(&cuda_mu);
  if (found.addr == 0) return cuda.HostUnregister(ptr);
  Guard g;
  const HostRegisterOps ops{&RealRegister, &RealUnregister, nullptr};
  const int err = UnregisterChunks(ptr, found.bytes, found.chunk_bytes, ops);
  if (err != kCudaSuccess) {
    Logf(LogLevel::kWarn,
         "cudaHostUnregister of the %zu bytes at %p registered in chunks: %s "
         "(error %d)",
         found.bytes, ptr, CudaErrorText(err), err);
  }
  return err;
}
