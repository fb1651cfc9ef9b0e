// lmcache_shared_l1_visibility_v1 (cxlkv/lmcache/visibility.h) over the Mem seam
// (cxlkv/lmcache/range_visibility.h). docs/lmcache.md has the contract and how LMCache uses it.
#include "cxlkv/lmcache/visibility.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/lmcache/range_visibility.h"

namespace cxlkv::lmcache {

void PublishRange(coherence::Mem& mem, std::uint64_t offset, std::size_t len) {
  // The object's bytes may still sit dirty in this host's cache (the D2H copy, or the CPU's
  // own stores): write every line back. A reader on another host that acquires after the
  // coordinator's commit fetches memory, so it sees them only once they are there.
  mem.Flush(offset, len);
  // clwb/clflushopt only start the write-back. The fence makes them complete before the
  // caller's next store — the commit RPC's effects, or a flag in the pool — so no host can
  // learn of the object before its bytes are in memory.
  mem.Fence();
}

void AcquireRange(coherence::Mem& mem, std::uint64_t offset, std::size_t len) {
  // Lines of the range this host cached earlier (an older object at the same offset, a
  // prefetch) would be read instead of memory: drop them. Invalidate writes back dirty ones
  // first (nothing of this host's is lost) and ends with a full fence, so the reads that
  // follow cannot run ahead of the eviction.
  mem.Invalidate(offset, len);
}

int CheckVisibilityArguments(const char* mode, std::uint32_t operation, int device_fd,
                             const void* mapped_address, std::uint64_t device_offset,
                             std::size_t length) noexcept {
  if (mode == nullptr) return -EINVAL;
  if (std::strcmp(mode, LMCACHE_SHARED_L1_VISIBILITY_MODE) != 0) return -EOPNOTSUPP;
  if (operation != LMCACHE_SHARED_L1_VISIBILITY_PUBLISH &&
      operation != LMCACHE_SHARED_L1_VISIBILITY_ACQUIRE) {
    return -EINVAL;
  }
  if (device_fd < 0 || ::fcntl(device_fd, F_GETFD) < 0) return -EBADF;
  if (mapped_address == nullptr) return -EFAULT;
  const auto addr = reinterpret_cast<std::uintptr_t>(mapped_address);
  constexpr std::uint64_t kLine = LMCACHE_SHARED_L1_VISIBILITY_GRANULARITY;
  static_assert(kLine == coherence::kCacheLineBytes);
  if (addr % kLine != 0 || device_offset % kLine != 0 || length == 0) return -EINVAL;
  std::uintptr_t addr_end = 0;
  std::uint64_t offset_end = 0;
  if (__builtin_add_overflow(addr, length, &addr_end) ||
      __builtin_add_overflow(device_offset, std::uint64_t{length}, &offset_end)) {
    return -EINVAL;
  }
  return 0;
}

}  // namespace cxlkv::lmcache

extern "C" __attribute__((visibility("default"))) int lmcache_shared_l1_visibility_v1(
    const char* mode, std::uint32_t operation, int device_fd, void* mapped_address,
    std::uint64_t device_offset, std::size_t length, std::uint64_t generation) {
  (void)generation;  // LMCache's object generation: nothing here depends on it
  using cxlkv::lmcache::CheckVisibilityArguments;
  if (const int err = CheckVisibilityArguments(mode, operation, device_fd, mapped_address,
                                               device_offset, length);
      err != 0) {
    return err;
  }
  // A Mem over exactly the caller's range: offset 0 is mapped_address.
  cxlkv::coherence::DirectMem range(static_cast<std::byte*>(mapped_address), length);
  if (operation == LMCACHE_SHARED_L1_VISIBILITY_PUBLISH) {
    cxlkv::lmcache::PublishRange(range, 0, length);
  } else {
    cxlkv::lmcache::AcquireRange(range, 0, length);
  }
  return 0;
}
