// cxlkv/pool/give_away.h — giving pooled memory away: the one routine every path takes when a
// window of shared memory (an extent of a pooled region) stops being this host's: revocation
// when a capacity lease lapsed, Shrink, leaving the domain, closing an arena or a heap in an
// extent.
//
// Why: caches are physically tagged, and neither unmapping, remapping nor an RPC writes a
// dirty line back. A line this host dirtied may be evicted at any later time — after the
// orchestrator lent the extent to another host, whose arena header, allocation map or heap
// objects it then overwrites with stale bytes (audit #4). So before an extent stops being
// this host's:
//   1. stop this process's stores to it: the window becomes read-only, or is swapped for
//      private memory. mprotect and a MAP_FIXED mmap change the page tables and shoot down
//      every CPU's TLB entries before they return, and a store that was still in a store
//      buffer then is in the (locally coherent) cache by the time the shoot-down completes;
//   2. write back every line of the extent (coherence::Flush: clwb, clflushopt or clflush)
//      and fence (coherence::Fence), so every write-back is complete;
//   3. only then unmap it, tell the orchestrator (Shrink, Leave) or let the lease run out.
//
// Cost: one flush instruction per 64-byte line of the extent whether or not it is cached
// (about 60-80 ms per GiB with clwb on the project's EPYC dev machine, dirty or clean), plus,
// for SwapAndWriteBack, populating a second view of the pages. Paid once per extent given
// away, never on a hot path.
//
// Thread-safety: each call works on the caller's window only; the caller serializes calls
// for one window. Allocation-free and noexcept, and every memory-management call is a raw
// system call: the preload shim calls these with its heap locked, and interposes libc's
// mmap/mremap/munmap.
#ifndef CXLKV_POOL_GIVE_AWAY_H_
#define CXLKV_POOL_GIVE_AWAY_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace cxlkv::pool {

// Writes back every line of [addr, addr + len) and fences: on return the range's bytes are
// in memory, as far as this host's caches are concerned. The range must be readable.
void WriteBackRange(const void* addr, std::uint64_t len) noexcept;

// For a window the process is done with (closing its region, its arena, its heap): makes
// [addr, addr + len) read-only — a store that comes late faults instead of reaching the
// memory after the write-back — then WriteBackRange. The caller unmaps it afterwards.
// addr is page-aligned. Returns 0, or the errno of mprotect (then nothing was written back:
// part of the range is not mapped).
[[nodiscard]] int SealAndWriteBack(std::byte* addr, std::uint64_t len) noexcept;

// For a window code may still be running in (a lease that lapsed): `swap` must replace the
// mapping of [addr, addr + len) (MAP_FIXED) so that this process's later stores miss the
// extent's pages — private memory, usually — and return true; if it cannot, false (the
// window is then made inaccessible here: a fault beats corrupting the next holder). The
// extent's pages are written back through a second view of them made before the swap (the
// same physical lines), which is unmapped afterwards, so no thread of the process faults.
// When the kernel refuses a second view (mremap of this mapping), the window is sealed
// read-only and written back in place before the swap instead: a store another thread
// makes in between faults (SIGSEGV) rather than landing unwritten. addr is page-aligned.
// Returns 0 once the extent is written back and no store can reach it any more; otherwise
// an errno: the swap failed (EFAULT; the window is inaccessible now, and written back), or
// there was neither a second view nor a seal (mprotect's errno: nothing written back).
[[nodiscard]] int SwapAndWriteBack(std::byte* addr, std::uint64_t len,
                                   absl::FunctionRef<bool()> swap) noexcept;

// The usual `swap` for SwapAndWriteBack: private anonymous memory (reads zero) atomically in
// place of [addr, addr + len) (MAP_FIXED; a raw system call, as above). false if the kernel
// refused.
bool SwapForPrivateMemory(std::byte* addr, std::uint64_t len) noexcept;

// ---- Giving away a window someone else owns ---------------------------------------------
//
// PooledArenas revokes extents whose arenas — and so whose Regions — its caller owns: by the
// time the lease lapses the caller may have closed the arena, and the address may already
// be mapped again for something else, which a MAP_FIXED swap would destroy. So the owner of
// the Region tracks it (Region::Track() returns an id), and the revoking side acts through
// WithTrackedRegion: fn(addr, len) runs only while that very Region still maps its memory,
// and the Region's destruction waits until fn has returned. false: the Region is gone (its
// destruction wrote it back already; give_away.h's rule for windows).
bool WithTrackedRegion(std::uint64_t id,
                       absl::FunctionRef<void(std::byte* addr, std::uint64_t len)> fn);

// For Region only: enter a mapping in the table WithTrackedRegion reads, and take it out
// (waiting for a WithTrackedRegion on it to finish).
std::uint64_t TrackRegion(std::byte* addr, std::uint64_t len);
void UntrackRegion(std::uint64_t id);

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_GIVE_AWAY_H_
