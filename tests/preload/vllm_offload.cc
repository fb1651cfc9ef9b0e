// vLLM's CPU KV offload region, step for step, for tests of the preload shim's CXLKV_SHM and
// chunked cudaHostRegister (docs/preload.md). Knows nothing of cxlkv: run it plain and under
// LD_PRELOAD=libcxlkv_preload.so.
//
// What vLLM does (vllm/v1/kv_offload/cpu/shared_offload_region.py and host_register.py,
// 2026): every TP worker opens /dev/shm/vllm_offload_<id>.mmap — the first with
// O_CREAT|O_EXCL|O_TRUNC (0600) and ftruncate()s it, the others wait until it has its size —
// maps the whole file MAP_SHARED read-write, populates its own slice with
// MADV_POPULATE_WRITE block by block (page by page where a block fails), takes tensors over
// the slice, and registers the whole mapping with one cudaHostRegister(ptr, bytes, 0), which
// may fail: then it warns and copies from pageable memory. At exit it unregisters the base,
// unmaps, closes, and the creator unlinks the file.
//
//   vllm_offload PATH BYTES [--rank R --world W] [--block BYTES] [--populate madvise|map|none]
//                [--expect-node N] [--barrier DIR] [--hold FILE] [--open open|shm_open]
//
// --open shm_open: PATH is /dev/shm/NAME, opened with shm_open("/NAME") and removed with
// shm_unlink (what other engines do) instead of open and unlink (vLLM).
// The worker writes a pattern into its slice, then (--barrier: waits for the other ranks'
// marker files there) checks every slice of every rank. --expect-node N: every page of the
// mapping must be on NUMA node N (move_pages). --hold FILE: after the checks, waits until FILE
// exists before cleaning up (so a test can look at the pool and the file meanwhile). The
// CUDA runtime is loaded at run time (libcudart.so.13/.12/.so, RTLD_GLOBAL) and its
// cudaHostRegister looked up in the global scope, as a program linked against it binds: under
// the shim that is the shim's. One summary line starts with "vllm_offload: {" (JSON).
// Exit status: 0 checks passed; 1 a check failed; 2 usage or setup error.
#include <dlfcn.h>
#include <fcntl.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kPage = 4096;
constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14)

[[noreturn]] void Die(int code, const std::string& msg) {
  std::fprintf(stderr, "vllm_offload: %s\n", msg.c_str());
  std::fflush(nullptr);
  ::_exit(code);
}

std::string ErrnoText() {
  char buf[128];
  return ::strerror_r(errno, buf, sizeof(buf));
}

int ToInt(const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0') Die(2, "not a number: " + v);
  return static_cast<int>(n);
}

unsigned char Pat(int rank, std::size_t i) {
  return static_cast<unsigned char>(static_cast<std::size_t>(rank) * 71 + i * 13 + (i >> 12) + 1);
}

bool Exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

void WaitFor(const std::string& p, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!Exists(p)) {
    if (std::chrono::steady_clock::now() > end) Die(2, "timed out waiting for " + p);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

using RegisterFn = int (*)(void*, std::size_t, unsigned);
using UnregisterFn = int (*)(void*);
using ErrorStringFn = const char* (*)(int);

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    Die(2,
        "usage: vllm_offload PATH BYTES [--rank R --world W] [--block BYTES] "
        "[--populate madvise|map|none] [--expect-node N] [--barrier DIR] [--hold FILE] "
        "[--open open|shm_open]");
  }
  const std::string path = argv[1];
  const std::size_t requested = std::strtoull(argv[2], nullptr, 0);
  int rank = 0, world = 1, expect_node = -1;
  std::size_t block = 2u << 20;
  std::string populate = "madvise", barrier, hold;
  bool use_shm_open = false;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") {
      rank = ToInt(v);
    } else if (k == "--world") {
      world = ToInt(v);
    } else if (k == "--block") {
      block = std::strtoull(v.c_str(), nullptr, 0);
    } else if (k == "--populate") {
      populate = v;
    } else if (k == "--expect-node") {
      expect_node = ToInt(v);
    } else if (k == "--barrier") {
      barrier = v;
    } else if (k == "--hold") {
      hold = v;
    } else if (k == "--open") {
      use_shm_open = v == "shm_open";
    } else {
      Die(2, "unknown option " + k);
    }
  }
  if (world < 1 || rank < 0 || rank >= world || requested == 0 || block == 0) {
    Die(2, "bad rank/world/size/block");
  }
  const std::size_t bytes = (requested + kPage - 1) / kPage * kPage;

  // 1. Exclusive create, or open and wait for the creator's ftruncate.
  const std::string shm_name = path.substr(path.rfind('/'));  // "/NAME"
  auto open_file = [&](int oflags, mode_t mode) {
    return use_shm_open ? ::shm_open(shm_name.c_str(), oflags, mode)
                        : ::open(path.c_str(), oflags | O_CLOEXEC, mode);
  };
  if (use_shm_open && path.rfind("/dev/shm/", 0) != 0)
    Die(2, "--open shm_open needs /dev/shm/NAME");
  bool creator = true;
  int fd = open_file(O_CREAT | O_EXCL | O_RDWR | O_TRUNC, 0600);
  if (fd >= 0) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      Die(2, "ftruncate: " + ErrnoText());
  } else if (errno == EEXIST) {
    creator = false;
    fd = open_file(O_RDWR, 0);
    if (fd < 0) Die(2, "open " + path + ": " + ErrnoText());
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    struct stat st {};
    while (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) < bytes) {
      if (std::chrono::steady_clock::now() > end) Die(2, "timed out waiting for the file's size");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } else {
    Die(2, "open " + path + ": " + ErrnoText());
  }

  // 2. The whole file, shared (older vLLM: with MAP_POPULATE).
  const int flags = MAP_SHARED | (populate == "map" ? MAP_POPULATE : 0);
  auto* base =
      static_cast<unsigned char*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0));
  if (base == MAP_FAILED) Die(2, "mmap: " + ErrnoText());

  // 3. This worker's slice, populated block by block, page by page where a block fails.
  const std::size_t per = bytes / static_cast<std::size_t>(world) / kPage * kPage;
  unsigned char* mine = base + static_cast<std::size_t>(rank) * per;
  std::size_t page_fallbacks = 0;
  if (populate == "madvise") {
    for (std::size_t off = 0; off < per; off += block) {
      const std::size_t n = std::min(block, per - off);
      if (::madvise(mine + off, n, kMadvPopulateWrite) == 0) continue;
      for (std::size_t p = 0; p < n; p += kPage) {
        ++page_fallbacks;
        if (::madvise(mine + off + p, kPage, kMadvPopulateWrite) != 0) mine[off + p] = 0;
      }
    }
  }

  // 4. One cudaHostRegister of the whole mapping, flags 0; a failure is a warning.
  std::string registered = "no CUDA runtime";
  bool pinned = false;
  UnregisterFn unregister_fn = nullptr;
  for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (::dlopen(so, RTLD_NOW | RTLD_GLOBAL) != nullptr) break;
  }
  auto register_fn = reinterpret_cast<RegisterFn>(::dlsym(RTLD_DEFAULT, "cudaHostRegister"));
  unregister_fn = reinterpret_cast<UnregisterFn>(::dlsym(RTLD_DEFAULT, "cudaHostUnregister"));
  auto error_string = reinterpret_cast<ErrorStringFn>(::dlsym(RTLD_DEFAULT, "cudaGetErrorString"));
  if (register_fn != nullptr) {
    const int err = register_fn(base, bytes, 0);
    pinned = err == 0;
    registered = pinned ? "yes"
                        : "failed: " + std::string(error_string ? error_string(err) : "?") +
                              " (error " + std::to_string(err) + "), pageable copies";
    if (!pinned)
      std::fprintf(stderr, "vllm_offload: warning: cudaHostRegister %s\n", registered.c_str());
  }

  // 5. Tensors over the slice: write this rank's pattern.
  for (std::size_t i = 0; i < per; ++i) mine[i] = Pat(rank, i);
  if (!barrier.empty()) {
    const std::string me = barrier + "/written." + std::to_string(rank);
    const int m = ::open(me.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (m >= 0) ::close(m);
    for (int r = 0; r < world; ++r) WaitFor(barrier + "/written." + std::to_string(r), 60);
  }
  int bad_rank = -1;
  std::size_t bad_at = 0;
  const int check_to = barrier.empty() ? rank + 1 : world;
  for (int r = barrier.empty() ? rank : 0; r < check_to && bad_rank < 0; ++r) {
    const unsigned char* s = base + static_cast<std::size_t>(r) * per;
    for (std::size_t i = 0; i < per; ++i) {
      if (s[i] != Pat(r, i)) {
        bad_rank = r;
        bad_at = i;
        break;
      }
    }
  }

  // 6. Where the pages are: move_pages in query mode, and the mapping's memory policy.
  std::map<int, std::size_t> nodes;
  const std::size_t npages = bytes / kPage;
  std::vector<void*> pages(npages);
  std::vector<int> status(npages, -1);
  for (std::size_t i = 0; i < npages; ++i) pages[i] = base + i * kPage;
  if (move_pages(0, npages, pages.data(), nullptr, status.data(), 0) == 0) {
    for (int s : status) ++nodes[s];
  } else {
    nodes[-1000 - errno] = npages;
  }
  int mode = -1;
  unsigned long mask[16] = {};
  if (get_mempolicy(&mode, mask, 1024, base, MPOL_F_ADDR) != 0) mode = -1;
  std::string policy = mode == MPOL_BIND ? "bind:" : mode == MPOL_DEFAULT ? "default" : "other:";
  if (mode == MPOL_BIND) {
    bool first = true;
    for (int n = 0; n < 1024; ++n) {
      if ((mask[n / 64] >> (n % 64)) & 1) {
        policy += (first ? "" : ",") + std::to_string(n);
        first = false;
      }
    }
  }
  bool nodes_ok = true;
  if (expect_node >= 0) nodes_ok = nodes.size() == 1 && nodes.begin()->first == expect_node;

  std::string node_json;
  for (const auto& [n, c] : nodes) {
    node_json +=
        (node_json.empty() ? "" : ", ") + ("\"" + std::to_string(n) + "\": " + std::to_string(c));
  }
  std::printf(
      "vllm_offload: {\"rank\": %d, \"world\": %d, \"creator\": %s, \"bytes\": %zu, "
      "\"slice\": %zu, \"data_ok\": %s, \"nodes\": {%s}, \"policy\": \"%s\", "
      "\"registered\": \"%s\", \"page_fallbacks\": %zu, \"base\": \"%p\"}\n",
      rank, world, creator ? "true" : "false", bytes, per, bad_rank < 0 ? "true" : "false",
      node_json.c_str(), policy.c_str(), registered.c_str(), page_fallbacks,
      static_cast<void*>(base));
  std::fflush(stdout);
  if (bad_rank >= 0) {
    std::fprintf(stderr, "vllm_offload: rank %d's slice differs at byte %zu\n", bad_rank, bad_at);
  }
  if (!nodes_ok) std::fprintf(stderr, "vllm_offload: pages not all on node %d\n", expect_node);
  if (!hold.empty()) WaitFor(hold, 120);

  // 7. Cleanup as vLLM does it.
  if (pinned && unregister_fn != nullptr) {
    if (const int err = unregister_fn(base); err != 0) {
      std::fprintf(stderr, "vllm_offload: cudaHostUnregister failed: error %d\n", err);
      return 1;
    }
  }
  if (::munmap(base, bytes) != 0) {
    std::fprintf(stderr, "vllm_offload: munmap failed: %s\n", ErrnoText().c_str());
    return 1;
  }
  ::close(fd);
  if (creator) use_shm_open ? ::shm_unlink(shm_name.c_str()) : ::unlink(path.c_str());
  return bad_rank < 0 && nodes_ok ? 0 : 1;
}
