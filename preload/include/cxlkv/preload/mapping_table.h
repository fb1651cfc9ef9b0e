// cxlkv/preload/mapping_table.h — the anonymous mmaps the shim served from CXL.
//
// munmap/mremap/madvise of such a range must reach the shim, and programs unmap parts of
// their mappings (the over-allocate-then-trim idiom for alignment). A Mapping keeps its
// full extent and its live part [live_lo, live_hi): unmapping a head or a tail shrinks the
// live part; unmapping a piece in the middle leaves a hole (the caller covers it with an
// inaccessible placeholder, so it faults as unmapped memory would) and the live part
// unchanged. When the live part is empty the whole block goes back to the heap.
//
// A sorted fixed array (no allocation); not thread-safe: the caller holds its lock.
#ifndef CXLKV_PRELOAD_MAPPING_TABLE_H_
#define CXLKV_PRELOAD_MAPPING_TABLE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cxlkv::preload {

struct Mapping {
  std::uintptr_t base = 0;
  std::uintptr_t bytes = 0;
  std::uintptr_t live_lo = 0;
  std::uintptr_t live_hi = 0;
};

struct UnmapEffect {
  bool release = false;        // the live part is empty: free the whole block
  std::uintptr_t hole_lo = 0;  // [hole_lo, hole_hi): cover with a placeholder
  std::uintptr_t hole_hi = 0;
};

// Unmaps [a, a + len) from m (the caller checked they overlap). Pure.
constexpr UnmapEffect ApplyUnmap(Mapping& m, std::uintptr_t a, std::uintptr_t len) noexcept {
  const std::uintptr_t lo = std::max(a, m.base);
  const std::uintptr_t hi = std::min(a + len, m.base + m.bytes);
  UnmapEffect e;
  if (lo >= hi) return e;
  if (lo <= m.live_lo && hi >= m.live_hi) {
    m.live_lo = m.live_hi = lo;
    e.release = true;
    return e;
  }
  if (lo <= m.live_lo && hi > m.live_lo) {
    m.live_lo = hi;
  } else if (hi >= m.live_hi && lo < m.live_hi) {
    m.live_hi = lo;
  }
  e.hole_lo = lo;
  e.hole_hi = hi;
  return e;
}

template <std::size_t kCapacity>
class MappingTable {
 public:
  bool Insert(std::uintptr_t base, std::uintptr_t bytes) noexcept {
    if (n_ == kCapacity) return false;
    std::size_t i = LowerBound(base);
    std::copy_backward(items_ + i, items_ + n_, items_ + n_ + 1);
    items_[i] = Mapping{base, bytes, base, base + bytes};
    ++n_;
    return true;
  }
  // The mapping whose full extent contains addr, or nullptr.
  Mapping* FindContaining(std::uintptr_t addr) noexcept {
    std::size_t i = LowerBound(addr + 1);  // first base > addr
    if (i == 0) return nullptr;
    Mapping& m = items_[i - 1];
    return addr - m.base < m.bytes ? &m : nullptr;
  }
  // The first mapping that overlaps [lo, hi), or nullptr.
  Mapping* FirstOverlap(std::uintptr_t lo, std::uintptr_t hi) noexcept {
    if (Mapping* m = FindContaining(lo)) return m;
    std::size_t i = LowerBound(lo);
    return i < n_ && items_[i].base < hi ? &items_[i] : nullptr;
  }
  void Erase(Mapping* m) noexcept {
    const auto i = static_cast<std::size_t>(m - items_);
    std::copy(items_ + i + 1, items_ + n_, items_ + i);
    --n_;
  }
  std::size_t size() const noexcept { return n_; }

 private:
  std::size_t LowerBound(std::uintptr_t base) const noexcept {
    return static_cast<std::size_t>(
        std::lower_bound(items_, items_ + n_, base,
                         [](const Mapping& m, std::uintptr_t b) { return m.base < b; }) -
        items_);
  }
  Mapping items_[kCapacity];
  std::size_t n_ = 0;
};

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_MAPPING_TABLE_H_
