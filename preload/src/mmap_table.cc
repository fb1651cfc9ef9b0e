// Anonymous private mmaps served from the CXL heap: the table of those mappings, and munmap
// and mremap of them (the entry points are in interpose.cc).
//
// Instrumented in sanitizer builds: an mmap reaches this file only once the heap is active,
// a munmap/mremap only for an address inside the heap's range, which is empty before start-up.
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "cxlkv/preload/mapping_table.h"
#include "log.h"
#include "shim_internal.h"

namespace cxlkv::preload::shim {

pthread_mutex_t mmap_mu = PTHREAD_MUTEX_INITIALIZER;

namespace {

constinit MappingTable<16384> mappings;  // mmap_mu
std::atomic<bool> once_mmap_table{false};

// Unmaps [a, a + len) where it overlaps CXL mappings; mmap_mu held.
void UnmapCxlLocked(std::uintptr_t a, std::size_t len) noexcept {
  // Each overlapping mapping once, in address order.
  for (std::uintptr_t cur = a; cur < a + len;) {
    Mapping* m = mappings.FirstOverlap(cur, a + len);
    if (m == nullptr) return;
    const std::uintptr_t m_end = m->base + m->bytes;
    const UnmapEffect e = ApplyUnmap(*m, a, len);
    if (e.release) {
      void* base = reinterpret_cast<void*>(m->base);
      // The program may have unmapped pieces, changed protections or advised the pages:
      // map the pool's pages back over the whole block before the heap reuses it.
      (void)heap->RestoreMapping(base, m->bytes);
      mappings.Erase(m);
      CountFree(AllocClass::kMmap, Route::kCxl);
      heap->Free(base);
    } else if (e.hole_hi > e.hole_lo) {
      // An inaccessible placeholder: the hole faults like unmapped memory, and nothing else
      // can be mapped into the heap's address range.
      (void)RealMmap(reinterpret_cast<void*>(e.hole_lo), e.hole_hi - e.hole_lo, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    cur = m_end;
  }
}

}  // namespace

void* MmapCxl(std::size_t len) noexcept {
  const std::size_t bytes = (len + kPage - 1) & ~(kPage - 1);
  void* p;
  {
    Guard g;
    p = HeapAlloc(bytes, kPage, /*zero=*/true);
    if (p != nullptr) {
      pthread_mutex_lock(&mmap_mu);
      const bool ok = mappings.Insert(reinterpret_cast<std::uintptr_t>(p), bytes);
      pthread_mutex_unlock(&mmap_mu);
      if (!ok) {
        heap->Free(p);
        p = nullptr;
        if (FirstTime(once_mmap_table)) {
          Logf(LogLevel::kWarn, "more than 16384 CXL mmaps at once; further ones pass through");
        }
      }
    }
  }
  if (p != nullptr) {
    CountAlloc(AllocClass::kMmap, Route::kCxl, len);
  } else {
    Fallback(AllocClass::kMmap, len);
  }
  return p;
}

void UnmapCxl(std::uintptr_t a, std::size_t len) noexcept {
  Guard g;
  pthread_mutex_lock(&mmap_mu);
  UnmapCxlLocked(a, len);
  pthread_mutex_unlock(&mmap_mu);
}

void* MremapCxl(void* old, std::size_t old_len, std::size_t new_len, int flags,
                void* new_addr) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(old);
  if (a % kPage != 0 || new_len == 0 || (flags & MREMAP_DONTUNMAP) != 0) {
    errno = EINVAL;
    return MAP_FAILED;
  }
  old_len = (old_len + kPage - 1) & ~(kPage - 1);
  new_len = (new_len + kPage - 1) & ~(kPage - 1);
  if (new_len <= old_len && (flags & MREMAP_FIXED) == 0) {
    if (new_len < old_len) (void)Munmap(reinterpret_cast<void*>(a + new_len), old_len - new_len);
    return old;
  }
  if ((flags & MREMAP_MAYMOVE) == 0) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  void* q = (flags & MREMAP_FIXED) != 0 ? RealMmap(new_addr, new_len, PROT_READ | PROT_WRITE,
                                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                                        : ::mmap(nullptr, new_len, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q == MAP_FAILED) return MAP_FAILED;
  std::memcpy(q, old, std::min(old_len, new_len));
  (void)Munmap(old, old_len);
  return q;
}

}  // namespace cxlkv::preload::shim
