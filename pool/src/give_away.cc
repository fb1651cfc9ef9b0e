// Giving pooled memory away: stop stores, write back, fence (give_away.h).
#include "cxlkv/pool/give_away.h"

#include <sys/mman.h>

#include <cerrno>

#include "cxlkv/coherence/cache.h"

namespace cxlkv::pool {
namespace {

constexpr int kMadvPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14); older headers lack it

}  // namespace

void WriteBackRange(const void* addr, std::uint64_t len) noexcept {
  // Flush only starts each write-back; the fence makes them complete before whatever the
  // caller does next (an unmap, an RPC that lets another host format the extent).
  coherence::Flush(addr, len);
  coherence::Fence();
}

int SealAndWriteBack(std::byte* addr, std::uint64_t len) noexcept {
  if (len == 0) return 0;
  if (::mprotect(addr, len, PROT_READ) != 0) return errno;
  WriteBackRange(addr, len);
  return 0;
}

int SwapAndWriteBack(std::byte* addr, std::uint64_t len, absl::FunctionRef<bool()> swap) noexcept {
  if (len == 0) return swap() ? 0 : EFAULT;
  // A second mapping of the same pages (mremap with old_size 0 duplicates a shared mapping)
  // outlives the swap of the window; it is only read, so it need not be writable.
  void* view = ::mremap(addr, 0, len, MREMAP_MAYMOVE);
  if (view == MAP_FAILED) {
    // No second view (e.g. a device the kernel will not map twice this way): stop stores in
    // place, write back, then swap.
    const int seal = SealAndWriteBack(addr, len);
    if (!swap()) {
      (void)::mprotect(addr, len, PROT_NONE);
      return seal != 0 ? seal : EFAULT;
    }
    return seal;
  }
  (void)::mprotect(view, len, PROT_READ);
  // Page tables for the view in one pass rather than a fault per page during the flush.
  (void)::madvise(view, len, kMadvPopulateRead);
  int rc = 0;
  if (!swap()) {
    (void)::mprotect(addr, len, PROT_NONE);
    rc = EFAULT;
  }
  // The swap shot down every TLB entry of the window: no store of this process reaches the
  // pages any more, and every earlier one is in this host's cache, written back here.
  WriteBackRange(view, len);
  ::munmap(view, len);
  return rc;
}

}  // namespace cxlkv::pool
