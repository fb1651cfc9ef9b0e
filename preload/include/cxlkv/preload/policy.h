// cxlkv/preload/policy.h — what the shim sends to CXL, and who owns a pointer.
//
// The policy is a pure function of the request: cuda host allocations go to CXL, malloc-family
// and anonymous private mmap requests of at least min_bytes go to CXL, everything else (and
// everything while the heap is inactive or while the shim itself is allocating) passes
// through to the process's own allocator. Ownership is decided by address, never by a
// header in front of the block: a pointer inside the bootstrap buffer is the bootstrap's,
// one inside the CXL heap's range is CXL's, anything else belongs to the process's own
// allocator (including memory allocated before the shim was loaded or by another allocator).
// All functions are noexcept and thread-safe, and constexpr except the address comparisons.
#ifndef CXLKV_PRELOAD_POLICY_H_
#define CXLKV_PRELOAD_POLICY_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace cxlkv::preload {

enum class AllocClass : std::uint8_t { kMalloc = 0, kCuda = 1, kMmap = 2 };
inline constexpr int kAllocClasses = 3;
enum class Route : std::uint8_t { kPass = 0, kCxl = 1 };
inline constexpr int kRoutes = 2;

constexpr Route Decide(AllocClass cls, std::size_t bytes, std::uint64_t min_bytes, bool heap_active,
                       bool in_shim) noexcept {
  if (!heap_active || in_shim) return Route::kPass;
  if (cls == AllocClass::kCuda) return Route::kCxl;
  return bytes >= min_bytes ? Route::kCxl : Route::kPass;
}

// An mmap the shim may serve from CXL: anonymous, private, read-write, no address hint, no
// flags whose semantics a heap block cannot keep (fixed placement, shared with children,
// stack growth, huge pages, locked).
constexpr bool MmapEligible(const void* addr, int prot, int flags, int fd,
                            long long offset) noexcept {
  constexpr int kRefused =
      MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_GROWSDOWN | MAP_STACK | MAP_HUGETLB | MAP_LOCKED;
  return addr == nullptr && fd == -1 && offset == 0 && (flags & MAP_ANONYMOUS) != 0 &&
         (flags & MAP_TYPE) == MAP_PRIVATE && (flags & kRefused) == 0 &&
         prot == (PROT_READ | PROT_WRITE);
}

struct AddressRange {
  std::uintptr_t lo = 0;
  std::uintptr_t bytes = 0;
  // Not constexpr: a pointer-to-integer cast never is (clang rejects the declaration).
  bool Contains(const void* p) const noexcept {
    return reinterpret_cast<std::uintptr_t>(p) - lo < bytes;  // one compare (wraps below lo)
  }
};

enum class Owner : std::uint8_t { kNull, kBootstrap, kCxl, kProcess };

constexpr Owner OwnerOf(const void* p, AddressRange bootstrap, AddressRange cxl) noexcept {
  if (p == nullptr) return Owner::kNull;
  if (cxl.Contains(p)) return Owner::kCxl;
  if (bootstrap.Contains(p)) return Owner::kBootstrap;
  return Owner::kProcess;
}

// What realloc(p, n) does, from p's owner and where a fresh n-byte block would go.
enum class ReallocPlan : std::uint8_t {
  kMalloc,        // p is NULL: malloc(n)
  kFree,          // n == 0 and p is not NULL: free(p), return NULL (glibc's behaviour)
  kResizeCxl,     // both in CXL: resize in place or move inside the heap
  kCxlToPass,     // shrinks below the threshold: move to the process allocator
  kPassToCxl,     // grows to the threshold: move from the process allocator into CXL
  kResizePass,    // both pass-through: the process allocator's realloc
  kFromBootstrap  // p came from the bootstrap buffer: allocate by policy and copy
};

constexpr ReallocPlan PlanRealloc(Owner owner, std::size_t n, Route route_for_n) noexcept {
  if (owner == Owner::kNull) return ReallocPlan::kMalloc;
  if (n == 0) return ReallocPlan::kFree;
  if (owner == Owner::kBootstrap) return ReallocPlan::kFromBootstrap;
  if (owner == Owner::kCxl) {
    return route_for_n == Route::kCxl ? ReallocPlan::kResizeCxl : ReallocPlan::kCxlToPass;
  }
  return route_for_n == Route::kCxl ? ReallocPlan::kPassToCxl : ReallocPlan::kResizePass;
}

// Size buckets of the statistics: <=64 B, <=1 KiB, <=64 KiB, <=1 MiB, larger.
inline constexpr int kSizeBuckets = 5;
constexpr int SizeBucket(std::size_t bytes) noexcept {
  return bytes <= 64            ? 0
         : bytes <= 1024        ? 1
         : bytes <= (64u << 10) ? 2
         : bytes <= (1u << 20)  ? 3
                                : 4;
}

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_POLICY_H_
