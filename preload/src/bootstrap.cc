// The process's own functions (the next definitions after the shim's: libc's, or a sanitizer
// runtime's) and the bootstrap buffer that serves dlsym's allocations while they are looked up.
//
// Compiled with -fno-sanitize=all in sanitizer builds: the first malloc of the process (from
// the loader or libc, before any sanitizer runtime is initialized) and the runtime's own
// dlsym calls run through here. shim_internal.h has the rule.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "shim_internal.h"

namespace cxlkv::preload::shim {

RealFns real{};
constinit thread_local bool tls_resolving CXLKV_IE = false;
alignas(64) unsigned char boot_buf[kBootBytes];

namespace {

std::atomic<int> resolve_state{0};  // 0: not yet, 1: in progress, 2: done
std::atomic<std::size_t> boot_used{0};

template <typename F>
void Lookup(F*& slot, const char* name) noexcept {
  slot = reinterpret_cast<F*>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

void* BootAlloc(std::size_t n, std::size_t align) noexcept {
  if (align < 16) align = 16;
  for (;;) {
    std::size_t used = boot_used.load(std::memory_order_relaxed);
    std::size_t start = (used + 16 + align - 1) & ~(align - 1);
    if (start + n > kBootBytes || n > kBootBytes) return nullptr;
    if (boot_used.compare_exchange_weak(used, start + n, std::memory_order_relaxed)) {
      std::memcpy(boot_buf + start - 16, &n, sizeof(n));
      return boot_buf + start;
    }
  }
}

std::size_t BootSize(const void* p) noexcept {
  std::size_t n;
  std::memcpy(&n, static_cast<const unsigned char*>(p) - 16, sizeof(n));
  return n;
}

void ResolveReal() noexcept {
  if (resolve_state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (!resolve_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    while (resolve_state.load(std::memory_order_acquire) != 2) {
    }
    return;
  }
  tls_resolving = true;
  Lookup(real.malloc, "malloc");
  Lookup(real.free, "free");
  Lookup(real.calloc, "calloc");
  Lookup(real.realloc, "realloc");
  Lookup(real.posix_memalign, "posix_memalign");
  Lookup(real.aligned_alloc, "aligned_alloc");
  Lookup(real.memalign, "memalign");
  Lookup(real.valloc, "valloc");
  Lookup(real.pvalloc, "pvalloc");
  Lookup(real.malloc_usable_size, "malloc_usable_size");
  Lookup(real.mmap, "mmap");
  Lookup(real.munmap, "munmap");
  Lookup(real.mremap, "mremap");
  Lookup(real.madvise, "madvise");
  Lookup(real.unlink, "unlink");
  Lookup(real.unlinkat, "unlinkat");
  Lookup(real.shm_unlink, "shm_unlink");
  tls_resolving = false;
  resolve_state.store(2, std::memory_order_release);
}

void* RealMmap(void* a, std::size_t n, int prot, int flags, int fd, off_t off) noexcept {
  if (real.mmap == nullptr) {
    return reinterpret_cast<void*>(::syscall(SYS_mmap, a, n, prot, flags, fd, off));
  }
  return real.mmap(a, n, prot, flags, fd, off);
}

int RealMunmap(void* a, std::size_t n) noexcept {
  if (real.munmap == nullptr) return static_cast<int>(::syscall(SYS_munmap, a, n));
  return real.munmap(a, n);
}

}  // namespace cxlkv::preload::shim
