// cxlkv/preload/pointer_set.h — a lock-free set of live pointers, for heaps whose blocks are
// not one address range (memkind's kmem kinds): free() asks Contains() for every pointer it
// does not otherwise recognise, so lookups take no lock and no allocation.
//
// Open addressing with linear probing over a fixed table (no allocation, no resize):
// Insert CASes an empty or erased slot, Erase writes a tombstone, Contains probes until an
// empty slot. Insert fails when the table is kMaxLoad full; the caller then does not serve
// the allocation from the heap. Thread-safe; a pointer is inserted once (after its
// allocation) and erased once (before its free), so concurrent operations on one pointer do
// not happen in a correct program.
#ifndef CXLKV_PRELOAD_POINTER_SET_H_
#define CXLKV_PRELOAD_POINTER_SET_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace cxlkv::preload {

template <std::size_t kSlots>  // a power of two
class PointerSet {
  static_assert((kSlots & (kSlots - 1)) == 0);

 public:
  bool Insert(const void* p) noexcept {
    if (count_.load(std::memory_order_relaxed) >= kSlots / 4 * 3) return false;
    const std::uintptr_t key = Key(p);
    for (std::size_t i = Hash(key), n = 0; n < kSlots; i = (i + 1) & (kSlots - 1), ++n) {
      std::uintptr_t v = slots_[i].load(std::memory_order_relaxed);
      if ((v == kEmpty || v == kTomb) &&
          slots_[i].compare_exchange_strong(v, key, std::memory_order_release)) {
        count_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
    return false;
  }
  bool Contains(const void* p) const noexcept { return Find(Key(p)) != nullptr; }
  bool Erase(const void* p) noexcept {
    std::atomic<std::uintptr_t>* s = Find(Key(p));
    if (s == nullptr) return false;
    s->store(kTomb, std::memory_order_release);
    count_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  std::size_t size() const noexcept { return count_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uintptr_t kEmpty = 0;
  static constexpr std::uintptr_t kTomb = 1;
  static std::uintptr_t Key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  static std::size_t Hash(std::uintptr_t k) noexcept {
    return static_cast<std::size_t>((k >> 4) * 0x9E3779B97F4A7C15ull >> 20) & (kSlots - 1);
  }
  std::atomic<std::uintptr_t>* Find(std::uintptr_t key) const noexcept {
    if (key <= kTomb) return nullptr;
    for (std::size_t i = Hash(key), n = 0; n < kSlots; i = (i + 1) & (kSlots - 1), ++n) {
      const std::uintptr_t v = slots_[i].load(std::memory_order_acquire);
      if (v == key) return const_cast<std::atomic<std::uintptr_t>*>(&slots_[i]);
      if (v == kEmpty) return nullptr;
    }
    return nullptr;
  }
  std::atomic<std::uintptr_t> slots_[kSlots] = {};
  std::atomic<std::size_t> count_{0};
};

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_POINTER_SET_H_
