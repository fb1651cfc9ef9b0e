// cxlkv/preload/cxl_heap.h — a general-purpose heap in CXL memory.
//
// Two backends, chosen by the source spec:
//   devdax, file, memfd: a jemalloc arena (Debian's libjemalloc, called through its explicit
//     API: mallocx/rallocx/dallocx/sallocx/mallctl) whose extent hooks take their memory from
//     a cxlkv arena in the region: each extent is a run of contiguous arena blocks claimed
//     with pool::Arena::ClaimRun under this process's owner slot. So several processes share
//     one pool safely, and the blocks of a process that dies return to the pool on the next
//     open (pool::Arena::Recover). A blank region is formatted with one class of 256 KiB
//     blocks; an existing cxlkv arena is used as it is (its smallest class). Ownership of a
//     pointer is its address: inside the region's mapping.
//   kmem: memkind's MEMKIND_DAX_KMEM (CPU-less NUMA nodes onlined as system RAM); ownership
//     through memkind_detect_kind (no address range).
//
// Thread-safety: every method may be called from any thread. jemalloc serializes the arena;
// the extent source has its own lock.
//
// fork: the region is a MAP_SHARED mapping, so after fork() parent and child would write
// the same heap pages. PrepareFork() (atfork prepare, in the parent) copies the runs this
// process holds into a private anonymous shadow; ChildAfterFork() moves the shadow over
// them (mremap, no copy), so the child keeps a private copy of its heap, as with ordinary
// anonymous memory, and later takes new runs under its own owner slot. The cost is one copy
// of the CXL bytes this process holds, per fork (vfork/posix_spawn pay nothing).
#ifndef CXLKV_PRELOAD_CXL_HEAP_H_
#define CXLKV_PRELOAD_CXL_HEAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/spec.h"
#include "cxlkv/preload/policy.h"

namespace cxlkv::preload {

inline constexpr std::uint64_t kChunkBytes = 256u << 10;  // block size of a blank pool
// Address space a pooled heap reserves for the extents it may be lent (PROT_NONE, no memory).
inline constexpr std::uint64_t kPooledReserveBytes = 1ull << 40;

// Capacity lent by a domain's orchestrator, one extent at a time (the shim implements it over
// libcxlkv.so's cxlkv_domain_grow_extent).
class ExtentSource {
 public:
  struct Extent {
    std::uint32_t index = 0;
    std::uint64_t length = 0;
    std::string spec;  // the window's source spec
  };
  virtual ~ExtentSource() = default;
  // One more extent. revoke(ctx, index) is called from another thread when its lease lapsed;
  // when it returns, the heap no longer writes the window.
  virtual absl::StatusOr<Extent> Grow(void (*revoke)(void* ctx, std::uint32_t extent),
                                      void* ctx) = 0;
  virtual void Shrink(std::uint32_t extent) = 0;
  virtual std::string Describe() const = 0;
};

// Opens the cxlkv arena of a devdax: or file: pool as the shim uses it: a blank region (its
// first page all zero) is formatted with one class of kChunkBytes blocks, an existing arena is
// opened as it is, anything else is refused. Open and format run under flock on the pool, so
// processes starting at once do not both format it. (The heap and the CXLKV_SHM bindings of
// one process open the same pool this way, each with its own owner slot.)
absl::StatusOr<std::unique_ptr<pool::Arena>> OpenPoolArena(const pool::SourceSpec& spec);

class CxlHeap {
 public:
  // Opens (formatting it if blank) the pool and sets the heap up. Errors name the source
  // and the fix (foreign data, too small, no kmem node, jemalloc refused the arena).
  static absl::StatusOr<std::unique_ptr<CxlHeap>> Open(const pool::SourceSpec& spec);
  // A heap in extents of a pooled domain: starts empty (Alloc returns nullptr) until Grow()
  // maps the first extent into its address reservation of reserve_bytes; each Grow() adds
  // one (a fresh cxlkv arena formatted in the extent). When an extent's lease lapses, its
  // runs are swapped for private memory holding the same bytes (docs/preload.md).
  static absl::StatusOr<std::unique_ptr<CxlHeap>> OpenPooled(std::unique_ptr<ExtentSource> source,
                                                             std::uint64_t reserve_bytes);
  virtual ~CxlHeap() = default;

  // Whether Grow() can add capacity (a pooled heap, not in a forked child).
  virtual bool CanGrow() const noexcept { return false; }
  // One more extent from the source. Not from inside Alloc (it calls the orchestrator).
  virtual absl::Status Grow() noexcept {
    return absl::FailedPreconditionError("this heap does not grow");
  }
  // Extents revoked so far.
  virtual std::uint64_t revocations() const noexcept { return 0; }
  // A pooled heap: fn(ctx, addr, len) runs before an extent mapped at [addr, addr + len)
  // stops being the heap's (revoked, or given back when the heap is destroyed), while it
  // still maps the extent: end every use of that memory that bypasses the page tables there
  // (CUDA registrations of it; audit #8). For a revocation it runs on the domain's watchdog
  // thread with the heap's locks held: it must not allocate from this heap.
  virtual void OnGiveAway(void (*fn)(void* ctx, void* addr, std::size_t len), void* ctx) noexcept {
    (void)fn;
    (void)ctx;
  }

  // nullptr when the pool cannot serve the request (full, alignment beyond the region's).
  // align is a power of two (0: default alignment of 16).
  virtual void* Alloc(std::size_t bytes, std::size_t align, bool zero) noexcept = 0;
  virtual void Free(void* p) noexcept = 0;
  // Resizes a block of this heap; nullptr (p untouched) when the heap cannot.
  virtual void* Realloc(void* p, std::size_t bytes) noexcept = 0;
  virtual std::size_t UsableSize(const void* p) const noexcept = 0;
  // Whether p (not NULL) was allocated here. Exact for the address-range backend.
  virtual bool Owns(const void* p) const noexcept = 0;
  // The addresses Owns() is true for, when it is one range; {0, 0} otherwise.
  virtual AddressRange range() const noexcept = 0;

  // Puts the pool's memory back under [addr, addr + bytes) (a range of this heap that the
  // process unmapped, protected or replaced): a new MAP_FIXED mapping of the same pages.
  virtual bool RestoreMapping(void* addr, std::size_t bytes) noexcept = 0;

  virtual void PrepareFork() noexcept = 0;
  virtual void ParentAfterFork() noexcept = 0;
  virtual void ChildAfterFork() noexcept = 0;

  // Pool bytes this process holds for the heap (claimed runs), for stats.
  virtual std::uint64_t held_bytes() const noexcept = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_CXL_HEAP_H_
