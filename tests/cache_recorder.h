// Records the cache-line operations (coherence/cache.h: Flush, Invalidate, Evict, Fence,
// CopyNt) that code under test issues, for structural tests: "this path writes back that
// range". On a machine whose memory is coherent a missing flush changes nothing a load can
// see, so such a test is the only one that can tell (docs/mutation.md).
//
// How: the test binary is linked with `-Wl,--wrap=<symbol>` for each of the five functions
// (tests/CMakeLists.txt: cxlkv_record_cache_ops(<target>)). The linker then sends every call
// made from another object file to a wrapper in cache_recorder.cc, which logs it and calls
// the real function, so the program behaves as before. Calls inside cache.cc itself (the
// flushes within CopyNt) are not seen.
//
// Thread-safe (one mutex); a recorder logs the calls of every thread while it lives.
#ifndef CXLKV_TESTS_CACHE_RECORDER_H_
#define CXLKV_TESTS_CACHE_RECORDER_H_

#include <cstddef>
#include <vector>

namespace cxlkv::testing {

enum class CacheOp { kFlush, kInvalidate, kEvict, kFence, kCopyNt };

struct CacheCall {
  CacheOp op;
  const void* addr;  // nullptr for kFence
  std::size_t len;   // 0 for kFence
  bool operator==(const CacheCall&) const = default;
};

// Logs calls from construction to destruction; at most one recorder at a time.
class CacheRecorder {
 public:
  CacheRecorder();
  ~CacheRecorder();
  CacheRecorder(const CacheRecorder&) = delete;
  CacheRecorder& operator=(const CacheRecorder&) = delete;

  // The calls so far, in order; Take() also clears the log.
  std::vector<CacheCall> calls() const;
  std::vector<CacheCall> Take();
  // Whether calls of `op` together cover every byte of [addr, addr + len).
  bool Covered(CacheOp op, const void* addr, std::size_t len) const;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_CACHE_RECORDER_H_
