// cxlkv/lmcache/range_visibility.h — the two operations behind LMCache's visibility ABI
// (visibility.h), on the Mem seam (coherence/mem.h), so the exported function runs them on
// the caller's mapping (DirectMem) and the tests run the same code on the non-coherent
// simulator (coherence/sim.h) and under the cache-call recorder.
//
// The rule they implement is coherence/cache.h's: a writer makes a range visible with
// write-back + store fence before the store that announces it; a reader drops its cached
// copies (with a full fence) before loading. Stateless and thread-compatible: concurrent
// calls on different Mems, or on one DirectMem, are fine.
#ifndef CXLKV_LMCACHE_RANGE_VISIBILITY_H_
#define CXLKV_LMCACHE_RANGE_VISIBILITY_H_

#include <cstddef>
#include <cstdint>

#include "cxlkv/coherence/mem.h"

namespace cxlkv::lmcache {

// Publish: every line of [offset, offset + len) that this host holds dirty is written back,
// and the write-backs complete before any later store of this thread becomes visible (the
// coordinator's commit that makes the object readable). A host that then acquires the range
// reads these bytes.
void PublishRange(coherence::Mem& mem, std::uint64_t offset, std::size_t len);

// Acquire: every line of [offset, offset + len) leaves this host's cache (written back first
// if dirty, so nothing is lost), and later loads wait for that: they fetch what memory holds,
// i.e. what the last publisher wrote back.
void AcquireRange(coherence::Mem& mem, std::uint64_t offset, std::size_t len);

// The ABI's argument checks (visibility.h lists them), in that order: 0, or the negative
// errno lmcache_shared_l1_visibility_v1 returns without touching memory.
int CheckVisibilityArguments(const char* mode, std::uint32_t operation, int device_fd,
                             const void* mapped_address, std::uint64_t device_offset,
                             std::size_t length) noexcept;

}  // namespace cxlkv::lmcache

#endif  // CXLKV_LMCACHE_RANGE_VISIBILITY_H_
