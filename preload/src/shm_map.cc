// Shared-memory files backed by the pool (CXLKV_SHM; cxl/preload/shm_backing.h): what the
// interposed mmap, munmap and unlink family call once start-up has created the backing.
//
// Instrumented in sanitizer builds: reached only behind hot.shm_on, which start-up sets.
#include <sys/mman.h>

#include <cerrno>

#include "cxlkv/preload/shm_backing.h"
#include "log.h"
#include "shim_internal.h"

namespace cxlkv::preload::shim {

ShmBacking* shm = nullptr;

void* ShmMmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t off,
              bool* handled) noexcept {
  *handled = false;
  if (shm == nullptr) return nullptr;
  ShmBacking::Mapped m;
  {
    Guard g;  // the backing's own mmaps, opens and allocations pass through
    m = shm->Map(addr, len, prot, flags, fd, off);
  }
  switch (m.outcome) {
    case ShmBacking::Outcome::kNotMatched:
      if (m.matched) registry.shm_passed.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    case ShmBacking::Outcome::kFailed:
      *handled = true;
      errno = m.err;
      return MAP_FAILED;
    case ShmBacking::Outcome::kMapped:
      *handled = true;
      if (m.bound) {
        registry.shm_bound.fetch_add(1, std::memory_order_relaxed);
        registry.shm_bound_bytes.fetch_add(m.bytes, std::memory_order_relaxed);
      } else {
        registry.shm_passed.fetch_add(1, std::memory_order_relaxed);
      }
      return m.addr;
  }
  return nullptr;
}

std::size_t ShmUnmapLength(void* addr, std::size_t len) noexcept {
  if (shm == nullptr || shm->tracked() == 0 || InShim()) return len;
  Guard g;
  return shm->UnmapLength(addr, len);
}

void ShmMunmapped(void* addr, std::size_t len) noexcept {
  if (shm == nullptr || shm->tracked() == 0 || InShim()) return;
  const int saved = errno;
  {
    Guard g;
    shm->Unmapped(addr, len);
  }
  errno = saved;
}

void ShmUnlinked(int dirfd, const char* path, const struct stat& st) noexcept {
  if (shm == nullptr || InShim()) return;
  const int saved = errno;
  {
    Guard g;
    shm->Unlinked(dirfd, path, st);
  }
  errno = saved;
}

}  // namespace cxlkv::preload::shim
