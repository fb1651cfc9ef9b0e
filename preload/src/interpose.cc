// The interposed malloc-family and mmap-family entry points of libcxlkv_preload.so, with
// their pass-through and ownership paths. shim_internal.h has the map of the shim's files
// and the rules; docs/preload.md the design.
//
// Compiled with -fno-sanitize=all in sanitizer builds: these run before the sanitizer
// runtime is initialized (the loader, libc, libstdc++ and the runtime itself allocate while
// they start), and before the shim's own start-up. Whatever they call before start-up is in
// this file or bootstrap.cc; they reach the instrumented files only behind an active heap,
// an address inside its range, or statistics being on.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "shim_internal.h"

namespace cxlkv::preload::shim {

Route RouteFor(AllocClass c, std::size_t n) noexcept {
  return Decide(c, n, hot.min_bytes.load(std::memory_order_relaxed), Active(), InShim());
}

Owner OwnerOfPtr(const void* p) noexcept {
  const Owner o = OwnerOf(p, BootRange(), CxlRange());
  if (o == Owner::kProcess && hot.slow_owner.load(std::memory_order_relaxed) && heap->Owns(p)) {
    return Owner::kCxl;
  }
  return o;
}

int Munmap(void* addr, std::size_t len) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const AddressRange r = CxlRange();
  if (r.bytes == 0 || a + len <= r.lo || a >= r.lo + r.bytes) {
    if (!hot.shm_on.load(std::memory_order_relaxed)) return RealMunmap(addr, len);
    // A CXLKV_SHM extent this process mapped may be gone now.
    len = ShmUnmapLength(addr, len);
    const int rc = RealMunmap(addr, len);
    if (rc == 0) ShmMunmapped(addr, len);
    return rc;
  }
  if (a % kPage != 0 || len == 0) {
    errno = EINVAL;
    return -1;
  }
  len = (len + kPage - 1) & ~(kPage - 1);
  // Parts outside the heap's range are the process's own mappings.
  if (a < r.lo) (void)RealMunmap(addr, r.lo - a);
  if (a + len > r.lo + r.bytes) {
    (void)RealMunmap(reinterpret_cast<void*>(r.lo + r.bytes), a + len - (r.lo + r.bytes));
  }
  UnmapCxl(a, len);
  return 0;
}

namespace {

// ---- the malloc family: what the entry points do past their fast paths ---------------------

void* PassMalloc(std::size_t n) noexcept {
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  return real.malloc(n);
}

__attribute__((noinline)) void* MallocSlow(std::size_t n) noexcept {
  if (tls_resolving) return BootAlloc(n, 16);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, 0, false)) return p;
  }
  return PassMalloc(n);
}

__attribute__((noinline)) void FreeSlow(void* p) noexcept {
  switch (OwnerOfPtr(p)) {
    case Owner::kNull:
    case Owner::kBootstrap:
      return;
    case Owner::kCxl:
      FreeCxl(p);
      return;
    case Owner::kProcess:
      break;
  }
  ResolveReal();
  CountFree(AllocClass::kMalloc, Route::kPass);
  real.free(p);
}

std::size_t UsableSize(void* p) noexcept {
  switch (OwnerOfPtr(p)) {
    case Owner::kNull:
      return 0;
    case Owner::kBootstrap:
      return BootSize(p);
    case Owner::kCxl: {
      Guard g;
      return heap->UsableSize(p);
    }
    case Owner::kProcess:
      break;
  }
  ResolveReal();
  return real.malloc_usable_size != nullptr ? real.malloc_usable_size(p) : 0;
}

void* AlignedAlloc(std::size_t align, std::size_t n) noexcept {
  // align is a power of two here.
  if (tls_resolving) return BootAlloc(n, align);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, align, false)) return p;
  }
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  void* p = nullptr;
  if (real.posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, n) != 0) {
    errno = ENOMEM;
    return nullptr;
  }
  return p;
}

void* Realloc(void* p, std::size_t n) noexcept {
  if (tls_resolving && p == nullptr) return BootAlloc(n, 16);
  ResolveReal();
  const Owner owner = OwnerOfPtr(p);
  switch (PlanRealloc(owner, n, RouteFor(AllocClass::kMalloc, n))) {
    case ReallocPlan::kMalloc:
      return ::malloc(n);
    case ReallocPlan::kFree:
      ::free(p);
      return nullptr;
    case ReallocPlan::kFromBootstrap: {
      void* q = ::malloc(n);
      if (q != nullptr) std::memcpy(q, p, std::min(n, BootSize(p)));
      return q;
    }
    case ReallocPlan::kResizePass:
      return real.realloc(p, n);
    case ReallocPlan::kResizeCxl: {
      void* q;
      {
        Guard g;
        q = heap->Realloc(p, n);
      }
      if (q != nullptr) return q;
      Fallback(AllocClass::kMalloc, n);
      // The pool cannot hold the larger block: move it to the process allocator.
      q = PassMalloc(n);
      if (q == nullptr) return nullptr;
      std::size_t old;
      {
        Guard g;
        old = heap->UsableSize(p);
      }
      std::memcpy(q, p, std::min(n, old));
      FreeCxl(p);
      registry.reallocs_to_pass.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
    case ReallocPlan::kCxlToPass: {
      void* q = PassMalloc(n);
      if (q == nullptr) return nullptr;
      std::size_t old;
      {
        Guard g;
        old = heap->UsableSize(p);
      }
      std::memcpy(q, p, std::min(n, old));
      FreeCxl(p);
      registry.reallocs_to_pass.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
    case ReallocPlan::kPassToCxl: {
      void* q = CxlAlloc(AllocClass::kMalloc, n, 0, false);
      if (q == nullptr) return real.realloc(p, n);
      const std::size_t old = real.malloc_usable_size != nullptr ? real.malloc_usable_size(p) : n;
      std::memcpy(q, p, std::min(n, old));
      CountFree(AllocClass::kMalloc, Route::kPass);
      real.free(p);
      registry.reallocs_to_cxl.fetch_add(1, std::memory_order_relaxed);
      return q;
    }
  }
  return nullptr;
}

}  // namespace

}  // namespace cxlkv::preload::shim

// ---- exported symbols ---------------------------------------------------------------------

using namespace cxlkv::preload;        // NOLINT: the entry points below are the C ABI
using namespace cxlkv::preload::shim;  // NOLINT

CXLKV_EXPORT void* malloc(std::size_t n) noexcept {
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed)) [[likely]]
    return real.malloc(n);
  return MallocSlow(n);
}

CXLKV_EXPORT void free(void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a - hot.cxl_lo.load(std::memory_order_relaxed) <
      hot.cxl_bytes.load(std::memory_order_relaxed)) [[unlikely]] {
    FreeCxl(p);
    return;
  }
  if (hot.free_fast.load(std::memory_order_relaxed) && !BootRange().Contains(p)) [[likely]] {
    real.free(p);  // free(NULL) included: the process allocator ignores it
    return;
  }
  FreeSlow(p);
}

CXLKV_EXPORT void* calloc(std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed)) [[likely]] {
    return real.calloc(count, size);
  }
  if (tls_resolving) return BootAlloc(n, 16);
  ResolveReal();
  if (RouteFor(AllocClass::kMalloc, n) == Route::kCxl) {
    if (void* p = CxlAlloc(AllocClass::kMalloc, n, 0, true)) return p;
  }
  CountAlloc(AllocClass::kMalloc, Route::kPass, n);
  return real.calloc(count, size);
}

CXLKV_EXPORT void* realloc(void* p, std::size_t n) noexcept {
  // Fast path: a process-owned (or NULL) block that stays below the threshold.
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n < hot.fast_min_bytes.load(std::memory_order_relaxed) &&
      a - hot.cxl_lo.load(std::memory_order_relaxed) >=
          hot.cxl_bytes.load(std::memory_order_relaxed) &&
      hot.free_fast.load(std::memory_order_relaxed) && !BootRange().Contains(p)) [[likely]] {
    return real.realloc(p, n);
  }
  return Realloc(p, n);
}

CXLKV_EXPORT void* reallocarray(void* p, std::size_t count, std::size_t size) noexcept {
  std::size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return nullptr;
  }
  return Realloc(p, n);
}

CXLKV_EXPORT int posix_memalign(void** out, std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0 || align % sizeof(void*) != 0) return EINVAL;
  const int saved = errno;
  void* p = AlignedAlloc(align, n);
  errno = saved;
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

CXLKV_EXPORT void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return AlignedAlloc(align, n);
}

CXLKV_EXPORT void* memalign(std::size_t align, std::size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {  // glibc rounds up to a power of two
    std::size_t a = 1;
    while (a < align && a != 0) a <<= 1;
    if (a == 0) {
      errno = EINVAL;
      return nullptr;
    }
    align = a;
  }
  return AlignedAlloc(align, n);
}

CXLKV_EXPORT void* valloc(std::size_t n) noexcept { return AlignedAlloc(kPage, n); }

CXLKV_EXPORT void* pvalloc(std::size_t n) noexcept {
  std::size_t rounded;
  if (__builtin_add_overflow(n, kPage - 1, &rounded)) {
    errno = ENOMEM;
    return nullptr;
  }
  return AlignedAlloc(kPage, (rounded & ~(kPage - 1)) == 0 ? kPage : rounded & ~(kPage - 1));
}

CXLKV_EXPORT std::size_t malloc_usable_size(void* p) noexcept { return UsableSize(p); }

CXLKV_EXPORT void* mmap(void* addr, std::size_t len, int prot, int flags, int fd,
                        off_t off) noexcept {
  // A shared mapping of a file CXLKV_SHM names (vLLM's offload region): backed by the pool.
  if (fd >= 0 && hot.shm_on.load(std::memory_order_relaxed) && !InShim() &&
      ((flags & MAP_TYPE) == MAP_SHARED || (flags & MAP_TYPE) == MAP_SHARED_VALIDATE)) {
    bool handled = false;
    void* p = ShmMmap(addr, len, prot, flags, fd, off, &handled);
    if (handled) return p;
  }
  if (len >= hot.mmap_min_bytes.load(std::memory_order_relaxed) && !InShim() &&
      MmapEligible(addr, prot, flags, fd, off) && Active()) {
    if (void* p = MmapCxl(len)) return p;
  }
  if (len != 0 && !InShim() && Active() && MmapEligible(addr, prot, flags, fd, off)) {
    CountAlloc(AllocClass::kMmap, Route::kPass, len);
  }
  return RealMmap(addr, len, prot, flags, fd, off);
}

CXLKV_EXPORT void* mmap64(void* addr, std::size_t len, int prot, int flags, int fd,
                          off_t off) noexcept {
  return mmap(addr, len, prot, flags, fd, off);
}

CXLKV_EXPORT int munmap(void* addr, std::size_t len) noexcept { return Munmap(addr, len); }

CXLKV_EXPORT void* mremap(void* old, std::size_t old_len, std::size_t new_len, int flags,
                          ...) noexcept {
  void* new_addr = nullptr;
  if ((flags & MREMAP_FIXED) != 0) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (!CxlRange().Contains(old)) {
    ResolveReal();
    if (real.mremap == nullptr) {
      return reinterpret_cast<void*>(::syscall(SYS_mremap, old, old_len, new_len, flags, new_addr));
    }
    return real.mremap(old, old_len, new_len, flags, new_addr);
  }
  // A block of the CXL heap (an mmap the shim served): emulate the resize.
  return MremapCxl(old, old_len, new_len, flags, new_addr);
}

CXLKV_EXPORT int madvise(void* addr, std::size_t len, int advice) noexcept {
  if (CxlRange().Contains(addr) && (advice == MADV_DONTNEED || advice == MADV_FREE)) {
    // Private anonymous semantics on shared pool pages: DONTNEED reads back zeros, FREE may
    // keep or drop the contents (keeping them is allowed). Nothing is given back to the pool.
    if (advice == MADV_DONTNEED) std::memset(addr, 0, len);
    return 0;
  }
  ResolveReal();
  if (real.madvise == nullptr) return static_cast<int>(::syscall(SYS_madvise, addr, len, advice));
  return real.madvise(addr, len, advice);
}

// ---- unlink: a CXLKV_SHM file's extent is freed once the file is gone and nobody maps it ----

namespace {

int RealUnlinkat(int dirfd, const char* path, int flags) noexcept {
  ResolveReal();
  if (real.unlinkat == nullptr) {
    return static_cast<int>(::syscall(SYS_unlinkat, dirfd, path, flags));
  }
  return real.unlinkat(dirfd, path, flags);
}

// lstat before the unlink (the inode names the sidecar); nothing unless CXLKV_SHM is on.
bool StatBefore(int dirfd, const char* path, struct stat* st) noexcept {
  return hot.shm_on.load(std::memory_order_relaxed) && !InShim() && path != nullptr &&
         ::fstatat(dirfd, path, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st->st_mode);
}

}  // namespace

CXLKV_EXPORT int unlink(const char* path) noexcept {
  struct stat st;
  const bool watch = StatBefore(AT_FDCWD, path, &st);
  ResolveReal();
  const int rc = real.unlink != nullptr ? real.unlink(path) : RealUnlinkat(AT_FDCWD, path, 0);
  if (rc == 0 && watch) ShmUnlinked(AT_FDCWD, path, st);
  return rc;
}

CXLKV_EXPORT int unlinkat(int dirfd, const char* path, int flags) noexcept {
  struct stat st;
  const bool watch = (flags & AT_REMOVEDIR) == 0 && StatBefore(dirfd, path, &st);
  const int rc = RealUnlinkat(dirfd, path, flags);
  if (rc == 0 && watch) ShmUnlinked(dirfd, path, st);
  return rc;
}

// Not noexcept: glibc declares shm_unlink without __THROW (a cancellation point).
CXLKV_EXPORT int shm_unlink(const char* name) {
  // glibc's shm_unlink removes /dev/shm/<name without its leading slashes>.
  char path[512] = "";
  if (name != nullptr) {
    while (*name == '/') ++name;
    std::snprintf(path, sizeof(path), "/dev/shm/%s", name);
  }
  struct stat st;
  const bool watch = name != nullptr && StatBefore(AT_FDCWD, path, &st);
  ResolveReal();
  int rc;
  if (real.shm_unlink != nullptr) {
    rc = real.shm_unlink(name);
  } else {
    rc = RealUnlinkat(AT_FDCWD, path, 0);
  }
  if (rc == 0 && watch) ShmUnlinked(AT_FDCWD, path, st);
  return rc;
}
