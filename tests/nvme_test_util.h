// Helpers for the NVMe tier's tests: a scratch directory on a disk file system, a small
// size-limited file system for the disk-full paths, and block contents that carry their key
// and version so a reader can tell a right block from a wrong one.
#ifndef CXLKV_TESTS_NVME_TEST_UTIL_H_
#define CXLKV_TESTS_NVME_TEST_UTIL_H_

#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "cxlkv/nvme/nvme_store.h"
#include "temp_dir.h"

namespace cxlkv::testing {

// A tmpfs of `bytes` mounted on a fresh directory: a real file system that fills up. Needs
// CAP_SYS_ADMIN. The process first moves into its own mount namespace (when it can), so the
// mount is invisible to the rest of the machine and goes away with the process even if the
// test dies. Mount() returns null and says why in *why_not when it cannot be done.
class SmallFs {
 public:
  static std::unique_ptr<SmallFs> Mount(std::uint64_t bytes, std::string* why_not) {
    static const bool private_ns = [] {
      if (::unshare(CLONE_NEWNS) != 0) return false;
      return ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    }();
    (void)private_ns;
    auto fs = std::unique_ptr<SmallFs>(new SmallFs("smallfs"));
    if (fs->dir_.path().empty()) {
      *why_not = "cannot create a mount point in the temporary directory";
      return nullptr;
    }
    const std::string opts = "size=" + std::to_string(bytes) + ",mode=0700";
    if (::mount("cxlkv-test", fs->dir_.path().c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      *why_not = std::string("mounting a ") + std::to_string(bytes >> 10) +
                 " KiB tmpfs needs root (CAP_SYS_ADMIN): mount: " + std::strerror(errno);
      return nullptr;
    }
    fs->mounted_ = true;
    return fs;
  }
  ~SmallFs() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  const std::string& path() const { return dir_.path(); }

 private:
  explicit SmallFs(const std::string& tag) : dir_(tag) {}
  TempDir dir_;
  bool mounted_ = false;
};

inline std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline nvme::NvmeKey KeyOf(std::uint64_t i) { return nvme::NvmeKey{Mix(i), Mix(~i)}; }

// Block contents: [key index][version] then a stream derived from both.
inline void FillBlock(void* dst, std::uint64_t bytes, std::uint64_t key, std::uint64_t version) {
  auto* p = static_cast<unsigned char*>(dst);
  std::uint64_t head[2] = {key, version};
  std::uint64_t state = Mix(key * 1315423911u + version);
  for (std::uint64_t i = 0; i < bytes; i += 8) {
    std::uint64_t word = i < 16 ? head[i / 8] : (state = Mix(state));
    std::memcpy(p + i, &word, std::min<std::uint64_t>(8, bytes - i));
  }
}

// True when dst holds exactly FillBlock(key, version) for the version it names.
inline bool BlockIsIntact(const void* dst, std::uint64_t bytes, std::uint64_t key,
                          std::uint64_t* version) {
  if (bytes < 16) return false;
  std::uint64_t head[2];
  std::memcpy(head, dst, sizeof(head));
  if (head[0] != key) return false;
  *version = head[1];
  std::string expect(bytes, '\0');
  FillBlock(expect.data(), bytes, key, head[1]);
  return std::memcmp(expect.data(), dst, bytes) == 0;
}

// A 4 KiB-aligned buffer (what O_DIRECT wants), freed with the object.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::uint64_t bytes)
      : p_(static_cast<unsigned char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))),
        bytes_(bytes) {}
  ~AlignedBuffer() { std::free(p_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  unsigned char* data() const { return p_; }
  std::uint64_t size() const { return bytes_; }

 private:
  unsigned char* p_;
  std::uint64_t bytes_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_NVME_TEST_UTIL_H_
