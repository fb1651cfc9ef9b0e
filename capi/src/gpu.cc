// The C API's GPU functions (cxlkv.h, "GPU access"): a thin translation to gpu/'s Registrar
// and CopyEngine. Built without CUDA, every function reports CXLKV_E_NO_CUDA.
#include <memory>
#include <string>
#include <vector>

#include "capi_internal.h"
#include "cxlkv/config.h"
#include "cxlkv/cxlkv.h"

#if CXLKV_HAVE_CUDA
#include "absl/strings/str_cat.h"
#include "cxlkv/gpu/copy_engine.h"
#include "cxlkv/gpu/registrar.h"
#endif

#if CXLKV_HAVE_CUDA

namespace gpu = cxlkv::gpu;

struct cxlkv_gpu {
  std::unique_ptr<gpu::Registrar> registrar;
  std::unique_ptr<gpu::CopyEngine> engine;  // destroyed first: waits for its copies
};

namespace {

using cxlkv::capi::Fail;

// Status -> code for the GPU calls: kUnavailable means "not finished yet" here (a
// registration still pinning, a copy still running); driver failures are CXLKV_E_CUDA.
int GpuFail(const absl::Status& st) {
  if (st.ok()) return CXLKV_OK;
  int code = CXLKV_E_CUDA;
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
      code = CXLKV_E_INVALID;
      break;
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      code = CXLKV_E_NOT_FOUND;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = CXLKV_E_EXISTS;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = CXLKV_E_MISMATCH;
      break;
    case absl::StatusCode::kUnavailable:
      code = CXLKV_E_PENDING;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = CXLKV_E_FULL;
      break;
    default:
      break;
  }
  return Fail(code, std::string(st.message()));
}

}  // namespace

CXLKV_API int cxlkv_gpu_open(int device, cxlkv_gpu** out) {
  return cxlkv_gpu_open_with(device, nullptr, out);
}

CXLKV_API int cxlkv_gpu_open_with(int device, const cxlkv_gpu_options* options, cxlkv_gpu** out) {
  if (out == nullptr) return Fail(CXLKV_E_INVALID, "out must be set");
  gpu::CopyEngineOptions eo;
  if (options != nullptr) {
    if (options->dma_writeback == CXLKV_GPU_DMA_PLATFORM_WRITES_MEMORY) {
      eo.dma_writeback = gpu::DmaWriteback::kPlatformWritesMemory;
    } else if (options->dma_writeback != CXLKV_GPU_DMA_WRITE_BACK) {
      return Fail(CXLKV_E_INVALID,
                  absl::StrCat("cxlkv_gpu_options.dma_writeback = ", options->dma_writeback,
                               " is not CXLKV_GPU_DMA_WRITE_BACK (0) or "
                               "CXLKV_GPU_DMA_PLATFORM_WRITES_MEMORY (1)"));
    }
    if (options->reserved != 0) {
      return Fail(CXLKV_E_INVALID, "cxlkv_gpu_options.reserved must be 0");
    }
  }
  gpu::RegistrarOptions ro;
  ro.device = device;
  auto registrar = gpu::Registrar::Create(ro);
  if (!registrar.ok()) {
    const absl::StatusCode c = registrar.status().code();
    if (c == absl::StatusCode::kUnavailable || c == absl::StatusCode::kNotFound) {
      return Fail(CXLKV_E_NO_DEVICE, std::string(registrar.status().message()));
    }
    return GpuFail(registrar.status());
  }
  auto engine = gpu::CopyEngine::Create(**registrar, eo);
  if (!engine.ok()) return GpuFail(engine.status());
  *out = new cxlkv_gpu{std::move(*registrar), std::move(*engine)};
  return CXLKV_OK;
}

CXLKV_API void cxlkv_gpu_close(cxlkv_gpu* g) {
  if (g == nullptr) return;
  cxlkv::capi::RemoveMemoryUsers(g);  // the registrar unregisters everything as it goes
  g->engine.reset();
  delete g;
}

CXLKV_API int cxlkv_gpu_register(cxlkv_gpu* g, const cxlkv_arena* arena, uint64_t* registration) {
  if (g == nullptr || arena == nullptr || registration == nullptr) {
    return Fail(CXLKV_E_INVALID, "gpu, arena and registration must be set");
  }
  if (cxlkv::capi::Revoked(arena)) return cxlkv::capi::FailRevoked(arena);
  auto id = g->registrar->RegisterArena(cxlkv::capi::ArenaOf(arena));
  if (!id.ok()) return GpuFail(id.status());
  // Pinned pages stay DMA targets whatever happens to the mapping: before the arena's extent
  // is given away (revoked, shrunk) or the arena closes, the copies in flight finish and the
  // registration goes (audit #8). Copies naming its blocks then fail with CXLKV_E_NOT_FOUND.
  const std::uint64_t reg = *id;
  cxlkv::capi::AddMemoryUser(arena, g, reg, [g, reg] {
    (void)g->engine->Drain();
    (void)g->registrar->Unregister(reg);
  });
  *registration = reg;
  return CXLKV_OK;
}

namespace {

// cxlkv_gpu_register_poll (register_wait ends with it too).
int RegisterPoll(cxlkv_gpu* g, uint64_t registration, cxlkv_gpu_registration_stats* stats) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  auto info = g->registrar->Info(registration);
  if (!info.ok()) return GpuFail(info.status());
  if (stats != nullptr) {
    *stats = cxlkv_gpu_registration_stats{};
    stats->bytes = info->bytes;
    stats->bytes_done = info->bytes_done;
    stats->chunks = static_cast<uint32_t>(info->chunks.size());
    stats->chunks_done = info->chunks_done;
    stats->elapsed_ns =
        (info->finished_ns != 0 ? info->finished_ns : info->queued_ns) - info->queued_ns;
    stats->ns_per_gib = info->NsPerGiB();
    switch (info->state) {
      case gpu::RegState::kQueued:
        stats->state = CXLKV_GPU_QUEUED;
        break;
      case gpu::RegState::kRegistering:
        stats->state = CXLKV_GPU_REGISTERING;
        break;
      case gpu::RegState::kRegistered:
        stats->state = CXLKV_GPU_REGISTERED;
        break;
      case gpu::RegState::kFailed:
      case gpu::RegState::kUnregistered:
        stats->state = CXLKV_GPU_FAILED;
        break;
    }
  }
  switch (info->state) {
    case gpu::RegState::kRegistered:
      return CXLKV_OK;
    case gpu::RegState::kFailed:
      return info->error.code() == absl::StatusCode::kResourceExhausted
                 ? Fail(CXLKV_E_FULL, std::string(info->error.message()))
                 : Fail(CXLKV_E_CUDA, std::string(info->error.message()));
    default:
      return Fail(CXLKV_E_PENDING, "registration #" + std::to_string(registration) +
                                       " is still pinning (" + std::to_string(info->chunks_done) +
                                       " of " + std::to_string(info->chunks.size()) + " chunks)");
  }
}

}  // namespace

CXLKV_API int cxlkv_gpu_register_poll(cxlkv_gpu* g, uint64_t registration,
                                      cxlkv_gpu_registration_stats* stats) {
  return RegisterPoll(g, registration, stats);
}

CXLKV_API int cxlkv_gpu_register_wait(cxlkv_gpu* g, uint64_t registration) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  const absl::Status st = g->registrar->Wait(registration);
  if (st.ok()) return CXLKV_OK;
  if (absl::IsNotFound(st)) return GpuFail(st);
  return RegisterPoll(g, registration, nullptr);
}

CXLKV_API int cxlkv_gpu_unregister(cxlkv_gpu* g, uint64_t registration) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  cxlkv::capi::RemoveMemoryUser(g, registration);
  return GpuFail(g->registrar->Unregister(registration));
}

CXLKV_API int cxlkv_gpu_device_pointer(cxlkv_gpu* g, const void* host, void** device) {
  if (g == nullptr || host == nullptr || device == nullptr) {
    return Fail(CXLKV_E_INVALID, "gpu, host and device must be set");
  }
  auto p = g->registrar->DevicePointer(host);
  if (!p.ok()) return GpuFail(p.status());
  *device = *p;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_gpu_copy_blocks(cxlkv_gpu* g, const cxlkv_gpu_cache* cache, int direction,
                                    const cxlkv_gpu_block* blocks, size_t n, uint32_t layer_begin,
                                    uint32_t layer_end, uint32_t flags, uint64_t* ticket) {
  if (g == nullptr || cache == nullptr || ticket == nullptr || (blocks == nullptr && n != 0)) {
    return Fail(CXLKV_E_INVALID, "gpu, cache, blocks and ticket must be set");
  }
  if (direction != CXLKV_GPU_TO_DEVICE && direction != CXLKV_GPU_TO_HOST) {
    return Fail(CXLKV_E_INVALID, "direction must be CXLKV_GPU_TO_DEVICE or CXLKV_GPU_TO_HOST");
  }
  if ((flags & ~CXLKV_GPU_KERNEL) != 0) {
    return Fail(CXLKV_E_INVALID, "unknown flags: only CXLKV_GPU_KERNEL is defined");
  }
  if (cache->layer_base == nullptr || cache->layers == 0 || cache->layers > gpu::kMaxLayers) {
    return Fail(CXLKV_E_INVALID, "cache: layers must be 1..1024 with layer_base set");
  }
  gpu::PagedCache c;
  c.layers = cache->layers;
  c.kv_parts = cache->kv_parts;
  c.page_count = cache->page_count;
  c.chunk_bytes = cache->chunk_bytes;
  c.page_stride_bytes = cache->page_stride_bytes;
  c.kv_stride_bytes = cache->kv_stride_bytes;
  c.layer_base.assign(cache->layer_base, cache->layer_base + cache->layers);
  std::vector<gpu::BlockCopy> list(n);
  for (size_t i = 0; i < n; ++i) {
    list[i] = gpu::BlockCopy{reinterpret_cast<std::uintptr_t>(blocks[i].host), blocks[i].page};
  }
  gpu::SubmitOptions so;
  so.method = (flags & CXLKV_GPU_KERNEL) ? gpu::CopyMethod::kKernel : gpu::CopyMethod::kCopyEngine;
  so.layer_begin = layer_begin;
  so.layer_end = layer_end;
  auto t = g->engine->Submit(c,
                             direction == CXLKV_GPU_TO_DEVICE ? gpu::Direction::kHostToDevice
                                                              : gpu::Direction::kDeviceToHost,
                             list, so);
  if (!t.ok()) return GpuFail(t.status());
  *ticket = *t;
  return CXLKV_OK;
}

CXLKV_API int cxlkv_gpu_poll(cxlkv_gpu* g, uint64_t ticket) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  return GpuFail(g->engine->Poll(ticket));
}

CXLKV_API int cxlkv_gpu_wait(cxlkv_gpu* g, uint64_t ticket) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  return GpuFail(g->engine->Wait(ticket));
}

CXLKV_API int cxlkv_gpu_stream_wait(cxlkv_gpu* g, uint64_t ticket, void* cuda_stream) {
  if (g == nullptr) return Fail(CXLKV_E_INVALID, "gpu must be set");
  return GpuFail(g->engine->StreamWait(ticket, static_cast<cudaStream_t>(cuda_stream)));
}

#else  // !CXLKV_HAVE_CUDA

namespace {

int NoCuda() {
  return cxlkv::capi::Fail(
      CXLKV_E_NO_CUDA,
      "libcxlkv was built without CUDA (no CUDA toolkit at build time, or "
      "CXLKV_WITH_CUDA=OFF): GPU registration and copies are unavailable; rebuild with the "
      "CUDA toolkit installed (-DCXLKV_WITH_CUDA=ON makes its absence an error)");
}

}  // namespace

struct cxlkv_gpu {};

CXLKV_API int cxlkv_gpu_open(int, cxlkv_gpu** out) {
  if (out != nullptr) *out = nullptr;
  return NoCuda();
}
CXLKV_API int cxlkv_gpu_open_with(int, const cxlkv_gpu_options*, cxlkv_gpu** out) {
  if (out != nullptr) *out = nullptr;
  return NoCuda();
}
CXLKV_API void cxlkv_gpu_close(cxlkv_gpu*) {}
CXLKV_API int cxlkv_gpu_register(cxlkv_gpu*, const cxlkv_arena*, uint64_t*) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_register_poll(cxlkv_gpu*, uint64_t, cxlkv_gpu_registration_stats*) {
  return NoCuda();
}
CXLKV_API int cxlkv_gpu_register_wait(cxlkv_gpu*, uint64_t) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_unregister(cxlkv_gpu*, uint64_t) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_device_pointer(cxlkv_gpu*, const void*, void**) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_copy_blocks(cxlkv_gpu*, const cxlkv_gpu_cache*, int, const cxlkv_gpu_block*,
                                    size_t, uint32_t, uint32_t, uint32_t, uint64_t*) {
  return NoCuda();
}
CXLKV_API int cxlkv_gpu_poll(cxlkv_gpu*, uint64_t) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_wait(cxlkv_gpu*, uint64_t) { return NoCuda(); }
CXLKV_API int cxlkv_gpu_stream_wait(cxlkv_gpu*, uint64_t, void*) { return NoCuda(); }

#endif  // CXLKV_HAVE_CUDA
