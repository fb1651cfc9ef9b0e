// The LMCache visibility library over the non-coherence simulator's seam, for the
// qualification kit's --sim-fabric run (docs/lmcache.md "Qualification"; test-only, never
// installed). Built from the same objects as liblmcache_shared_l1_visibility.so, with
// coherence::Flush / Invalidate / Evict / Fence linker-wrapped: inside the window this file
// hands out they act on this process's simulated cache (coherence/sim.h), so each process is
// one host with a private, non-coherent cache over the shared pool file, which is the media.
// The kit writes and reads the region through cxlkv_sim_write / cxlkv_sim_read (this host's
// cache), and passes window addresses to lmcache_shared_l1_visibility_v1 as it would mapped
// ones. Any library loaded with it as --library: this one (the real steps: the gates pass) or
// one that does nothing (written lines never reach the media: the visibility gate fails).
//
// One region per process; calls from one thread at a time (the kit's processes are
// single-threaded). Errors: a negative errno.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "cxlkv/coherence/sim.h"

namespace {

namespace co = ::cxlkv::coherence;

struct Fabric {
  std::byte* media = nullptr;   // the pool file's region, mapped shared
  std::byte* window = nullptr;  // addresses handed to the library (never touched)
  std::size_t size = 0;
  std::uint64_t offset = 0;  // in the pool file
  std::unique_ptr<co::SimMemory> sim;
  std::unique_ptr<co::SimMemory::HostView> view;
};
Fabric* fabric = nullptr;

// The window's offset of [addr, addr + len), or -1 when it is not inside.
std::int64_t InWindow(const void* addr, std::size_t len) {
  if (fabric == nullptr) return -1;
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const auto w = reinterpret_cast<std::uintptr_t>(fabric->window);
  if (a < w || a - w > fabric->size || len > fabric->size - (a - w)) return -1;
  return static_cast<std::int64_t>(a - w);
}

}  // namespace

extern "C" {

// Maps [offset, offset + size) of the pool file as this host's media and returns the window's
// base (0 on error, errno set). size and offset: multiples of the page size. Evictions by the
// cache itself are off (a line reaches the media only when the library writes it back). The
// same region again (a second mapping in one process): the same window and cache; another is
// EBUSY.
__attribute__((visibility("default"))) void* cxlkv_sim_attach(const char* pool,
                                                              std::uint64_t offset,
                                                              std::uint64_t size,
                                                              std::uint64_t seed) {
  if (fabric != nullptr) {
    if (fabric->size == size && fabric->offset == offset) return fabric->window;
    errno = EBUSY;
    return nullptr;
  }
  const int fd = ::open(pool, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* media =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  ::close(fd);
  if (media == MAP_FAILED) return nullptr;
  void* window =
      ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (window == MAP_FAILED) {
    ::munmap(media, size);
    return nullptr;
  }
  auto* f = new Fabric();
  f->media = static_cast<std::byte*>(media);
  f->window = static_cast<std::byte*>(window);
  f->size = size;
  f->offset = offset;
  f->sim = std::make_unique<co::SimMemory>(std::span<std::byte>(f->media, size), seed);
  f->view = f->sim->NewView(/*evict_per_mille=*/0);
  fabric = f;
  return window;
}

// This host's stores and loads (through its simulated cache).
__attribute__((visibility("default"))) int cxlkv_sim_write(std::uint64_t offset, const void* src,
                                                           std::size_t len) {
  if (fabric == nullptr || offset > fabric->size || len > fabric->size - offset) return -EINVAL;
  fabric->view->Write(offset, src, len);
  return 0;
}
__attribute__((visibility("default"))) int cxlkv_sim_read(std::uint64_t offset, void* dst,
                                                          std::size_t len) {
  if (fabric == nullptr || offset > fabric->size || len > fabric->size - offset) return -EINVAL;
  fabric->view->Read(offset, dst, len);
  return 0;
}

// The cache operations of the visibility library's objects (-Wl,--wrap): the window's go to
// this host's simulated cache, anything else to the hardware.
void __real__ZN5cxlkv9coherence5FlushEPKvm(const void* addr, std::size_t len) noexcept;
void __real__ZN5cxlkv9coherence10InvalidateEPKvm(const void* addr, std::size_t len) noexcept;
void __real__ZN5cxlkv9coherence5EvictEPKvm(const void* addr, std::size_t len) noexcept;
void __real__ZN5cxlkv9coherence5FenceEv() noexcept;

void __wrap__ZN5cxlkv9coherence5FlushEPKvm(const void* addr, std::size_t len) noexcept {
  const std::int64_t at = InWindow(addr, len);
  if (at < 0) return __real__ZN5cxlkv9coherence5FlushEPKvm(addr, len);
  fabric->view->Flush(static_cast<std::uint64_t>(at), len);
}
void __wrap__ZN5cxlkv9coherence10InvalidateEPKvm(const void* addr, std::size_t len) noexcept {
  const std::int64_t at = InWindow(addr, len);
  if (at < 0) return __real__ZN5cxlkv9coherence10InvalidateEPKvm(addr, len);
  fabric->view->Invalidate(static_cast<std::uint64_t>(at), len);
}
void __wrap__ZN5cxlkv9coherence5EvictEPKvm(const void* addr, std::size_t len) noexcept {
  const std::int64_t at = InWindow(addr, len);
  if (at < 0) return __real__ZN5cxlkv9coherence5EvictEPKvm(addr, len);
  fabric->view->Evict(static_cast<std::uint64_t>(at), len);
}
void __wrap__ZN5cxlkv9coherence5FenceEv() noexcept {
  if (fabric != nullptr) fabric->view->Fence();
  __real__ZN5cxlkv9coherence5FenceEv();
}

}  // extern "C"
