// C++ operators new and delete of libcxlkv_preload.so. They exist because Debian's
// libjemalloc (a dependency of the shim, unprefixed) exports its own: without these, the
// process's `new` would bind to jemalloc's default arena. These route through the shim's
// malloc/free, so C++ allocations follow the same policy and ownership rules as C ones.
#include <cstdlib>
#include <new>

#define CXLKV_NEW_EXPORT __attribute__((visibility("default")))

namespace {

void* NewImpl(std::size_t n, std::size_t align, bool nothrow) {
  if (n == 0) n = 1;
  for (;;) {
    void* p =
        align > __STDCPP_DEFAULT_NEW_ALIGNMENT__ ? std::aligned_alloc(align, n) : std::malloc(n);
    if (p != nullptr) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    handler();
  }
}

void* NewNothrow(std::size_t n, std::size_t align) noexcept {
  try {
    return NewImpl(n, align, true);
  } catch (...) {  // a new_handler may throw
    return nullptr;
  }
}

}  // namespace

CXLKV_NEW_EXPORT void* operator new(std::size_t n) { return NewImpl(n, 0, false); }
CXLKV_NEW_EXPORT void* operator new[](std::size_t n) { return NewImpl(n, 0, false); }
CXLKV_NEW_EXPORT void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return NewNothrow(n, 0);
}
CXLKV_NEW_EXPORT void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return NewNothrow(n, 0);
}
CXLKV_NEW_EXPORT void* operator new(std::size_t n, std::align_val_t a) {
  return NewImpl(n, static_cast<std::size_t>(a), false);
}
CXLKV_NEW_EXPORT void* operator new[](std::size_t n, std::align_val_t a) {
  return NewImpl(n, static_cast<std::size_t>(a), false);
}
CXLKV_NEW_EXPORT void* operator new(std::size_t n, std::align_val_t a,
                                    const std::nothrow_t&) noexcept {
  return NewNothrow(n, static_cast<std::size_t>(a));
}
CXLKV_NEW_EXPORT void* operator new[](std::size_t n, std::align_val_t a,
                                      const std::nothrow_t&) noexcept {
  return NewNothrow(n, static_cast<std::size_t>(a));
}

CXLKV_NEW_EXPORT void operator delete(void* p) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete[](void* p) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete(void* p, std::size_t) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
CXLKV_NEW_EXPORT void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
CXLKV_NEW_EXPORT void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
CXLKV_NEW_EXPORT void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}
CXLKV_NEW_EXPORT void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  std::free(p);
}
