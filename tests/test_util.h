// Shared helpers for cxlkv tests: memfd- and file-backed arenas through the backend seam.
#ifndef CXLKV_TESTS_TEST_UTIL_H_
#define CXLKV_TESTS_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"
#include "gtest/gtest.h"

namespace cxlkv::testing {

// A small layout: 2*1*1*64*2 = 256 bytes/token, 16 tokens = 4 KiB blocks.
inline pool::KvLayout TinyLayout() {
  return pool::KvLayout{1, 1, 64, 2, 16, pool::KvLayoutKind::kContiguous};
}

inline std::unique_ptr<pool::Region> MustOpen(const std::string& spec) {
  auto r = pool::OpenRegion(spec);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

inline std::unique_ptr<pool::Arena> MustFormat(const std::string& spec,
                                               const pool::FormatOptions& o) {
  auto a = pool::Arena::Format(MustOpen(spec), o);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

// A unique path in /dev/shm, removed when the object dies.
class ShmPath {
 public:
  explicit ShmPath(const std::string& tag) {
    path_ = "/dev/shm/cxlkv-test-" + tag + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter_++);
    ::unlink(path_.c_str());
  }
  ~ShmPath() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  std::string spec(const std::string& size) const { return "file:" + path_ + "?size=" + size; }
  std::string spec() const { return "file:" + path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// Seed from CXLKV_SEED or the clock; tests print it so a failure can be replayed.
inline std::uint64_t TestSeed() {
  if (const char* s = std::getenv("CXLKV_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_TEST_UTIL_H_
