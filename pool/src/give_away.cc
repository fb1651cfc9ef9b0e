// Giving pooled memory away: stop stores, write back, fence (give_away.h).
#include "cxlkv/pool/give_away.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/cache.h"

namespace cxlkv::pool {
namespace {

constexpr int kMadvPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14); older headers lack it

// Raw system calls: this code also runs inside the preload shim (its heap's revocation and
// destruction), which interposes mmap, mremap and munmap to serve the program's memory from
// the very heap being given away; a call through libc would come back into it (and an
// mremap of a heap address would be emulated there as a copy, not a second view).
int SysMprotect(void* addr, std::uint64_t len, int prot) {
  return static_cast<int>(::syscall(SYS_mprotect, addr, len, prot));
}
void* SysMremapView(void* addr, std::uint64_t len) {
  return reinterpret_cast<void*>(::syscall(SYS_mremap, addr, 0, len, MREMAP_MAYMOVE, nullptr));
}
int SysMunmap(void* addr, std::uint64_t len) {
  return static_cast<int>(::syscall(SYS_munmap, addr, len));
}
int SysMadvise(void* addr, std::uint64_t len, int advice) {
  return static_cast<int>(::syscall(SYS_madvise, addr, len, advice));
}

}  // namespace

bool SwapForPrivateMemory(std::byte* addr, std::uint64_t len) noexcept {
  const long p = ::syscall(SYS_mmap, addr, len, PROT_READ | PROT_WRITE,
                           MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == reinterpret_cast<long>(addr);
}

void WriteBackRange(const void* addr, std::uint64_t len) noexcept {
  // Flush only starts each write-back; the fence makes them complete before whatever the
  // caller does next (an unmap, an RPC that lets another host format the extent).
  coherence::Flush(addr, len);
  coherence::Fence();
}

int SealAndWriteBack(std::byte* addr, std::uint64_t len) noexcept {
  if (len == 0) return 0;
  if (SysMprotect(addr, len, PROT_READ) != 0) return errno;
  WriteBackRange(addr, len);
  return 0;
}

int SwapAndWriteBack(std::byte* addr, std::uint64_t len, absl::FunctionRef<bool()> swap) noexcept {
  if (len == 0) return swap() ? 0 : EFAULT;
  // A second mapping of the same pages (mremap with old_size 0 duplicates a shared mapping)
  // outlives the swap of the window; it is only read, so it need not be writable.
  void* view = SysMremapView(addr, len);
  if (view == MAP_FAILED) {
    // No second view (e.g. a device the kernel will not map twice this way): stop stores in
    // place, write back, then swap.
    const int seal = SealAndWriteBack(addr, len);
    if (!swap()) {
      (void)SysMprotect(addr, len, PROT_NONE);
      return seal != 0 ? seal : EFAULT;
    }
    return seal;
  }
  (void)SysMprotect(view, len, PROT_READ);
  // Page tables for the view in one pass rather than a fault per page during the flush.
  (void)SysMadvise(view, len, kMadvPopulateRead);
  int rc = 0;
  if (!swap()) {
    (void)SysMprotect(addr, len, PROT_NONE);
    rc = EFAULT;
  }
  // The swap shot down every TLB entry of the window: no store of this process reaches the
  // pages any more, and every earlier one is in this host's cache, written back here.
  WriteBackRange(view, len);
  (void)SysMunmap(view, len);
  return rc;
}

namespace {

struct Tracked {
  std::byte* addr;
  std::uint64_t len;
};
base::Mutex tracked_mu;
std::uint64_t tracked_next ABSL_GUARDED_BY(tracked_mu) = 1;
std::map<std::uint64_t, Tracked>& TrackedRegions() {
  static auto* regions = new std::map<std::uint64_t, Tracked>();  // used until exit
  return *regions;
}

}  // namespace

std::uint64_t TrackRegion(std::byte* addr, std::uint64_t len) {
  base::MutexLock l(tracked_mu);
  const std::uint64_t id = tracked_next++;
  TrackedRegions().emplace(id, Tracked{addr, len});
  return id;
}

void UntrackRegion(std::uint64_t id) {
  base::MutexLock l(tracked_mu);
  TrackedRegions().erase(id);
}

bool WithTrackedRegion(std::uint64_t id,
                       absl::FunctionRef<void(std::byte* addr, std::uint64_t len)> fn) {
  base::MutexLock l(tracked_mu);
  auto it = TrackedRegions().find(id);
  if (it == TrackedRegions().end()) return false;
  fn(it->second.addr, it->second.len);
  return true;
}

}  // namespace cxlkv::pool
