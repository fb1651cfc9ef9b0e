// A multithreaded allocation stress program, run under libcxlkv_preload.so (and on its own):
// random sizes on both sides of the threshold, every malloc-family entry point, blocks freed
// by other threads, realloc chains across the threshold, anonymous mmaps trimmed and resized,
// and a fork in the middle whose child checks and rewrites its copy. Every block carries a
// pattern derived from its id and is checked before it is freed, so a block handed to two
// owners, returned to the wrong allocator or corrupted by a fork shows up as a mismatch.
//
// Usage: preload_stress [threads] [ops per thread] [seed]. The seed (else CXLKV_SEED, else
// random) is printed.
// Exit 0 when every check passed.
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

std::atomic<long> failures{0};

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "preload_stress: check failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                 \
      std::fprintf(stderr, "\n");                                        \
      failures.fetch_add(1);                                             \
    }                                                                    \
  } while (0)

struct Block {
  unsigned char* p;
  std::size_t n;
  std::uint64_t id;
  bool is_mmap;
};

unsigned char Pat(std::uint64_t id, std::size_t i) {
  return static_cast<unsigned char>((id * 131 + i * 7) ^ (i >> 9));
}

// Touches the first and last 4 KiB and every 4 KiB in between (cheap on big blocks).
template <typename F>
void ForSampled(std::size_t n, F f) {
  if (n <= 8192) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  for (std::size_t i = 0; i < 4096; ++i) f(i);
  for (std::size_t i = 4096; i < n - 4096; i += 4096) f(i);
  for (std::size_t i = n - 4096; i < n; ++i) f(i);
}

void Fill(const Block& b) {
  ForSampled(b.n, [&](std::size_t i) { b.p[i] = Pat(b.id, i); });
}

bool Verify(const Block& b, std::size_t upto) {
  bool ok = true;
  // The positions Fill wrote, below upto.
  ForSampled(b.n, [&](std::size_t i) { ok = ok && (i >= upto || b.p[i] == Pat(b.id, i)); });
  return ok;
}

std::size_t RandomSize(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0:
      return 0;
    case 1:
    case 2:
    case 3:
      return rng() % 64;
    case 4:
    case 5:
      return rng() % 4096;
    case 6:
    case 7:
      return rng() % 65536;
    case 8:
      return rng() % (1 << 20);
    default:
      return (1 << 20) + rng() % (4 << 20);
  }
}

Block Allocate(std::mt19937_64& rng, std::uint64_t id) {
  Block b{nullptr, RandomSize(rng), id, false};
  void* p = nullptr;
  switch (rng() % 9) {
    case 0:
    case 1:
    case 2:
      p = std::malloc(b.n);
      break;
    case 3: {
      p = std::calloc(1, b.n);
      bool zero = true;
      ForSampled(b.n,
                 [&](std::size_t i) { zero = zero && static_cast<unsigned char*>(p)[i] == 0; });
      CHECK(zero, "calloc(%zu) not zero", b.n);
      break;
    }
    case 4: {
      const std::size_t a = std::size_t{16} << (rng() % 9);  // 16 .. 4096
      CHECK(posix_memalign(&p, a, b.n) == 0, "posix_memalign(%zu, %zu)", a, b.n);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % a == 0, "posix_memalign alignment %zu", a);
      break;
    }
    case 5: {
      const std::size_t a = std::size_t{64} << (rng() % 7);
      p = std::aligned_alloc(a, (b.n + a - 1) / a * a);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % a == 0, "aligned_alloc alignment %zu", a);
      break;
    }
    case 6:
      p = memalign(256, b.n);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "memalign alignment");
      break;
    case 7:
      p = valloc(b.n);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0, "valloc alignment");
      break;
    default:
      if (b.n >= 4096) {
        p = mmap(nullptr, b.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED, "mmap(%zu)", b.n);
        if (p == MAP_FAILED) p = nullptr;
        b.is_mmap = true;
        bool zero = true;
        ForSampled(b.n,
                   [&](std::size_t i) { zero = zero && static_cast<unsigned char*>(p)[i] == 0; });
        CHECK(zero, "anonymous mmap(%zu) not zero", b.n);
      } else {
        p = std::malloc(b.n);
      }
      break;
  }
  CHECK(p != nullptr, "allocation of %zu bytes failed", b.n);
  b.p = static_cast<unsigned char*>(p);
  if (!b.is_mmap && p != nullptr) {
    CHECK(malloc_usable_size(p) >= b.n, "usable size %zu < %zu", malloc_usable_size(p), b.n);
  }
  if (p != nullptr) Fill(b);
  return b;
}

void Release(Block& b) {
  if (b.p == nullptr) return;
  CHECK(Verify(b, b.n), "block %llu (%zu bytes) corrupted", static_cast<unsigned long long>(b.id),
        b.n);
  if (b.is_mmap) {
    // Trim the head page (if any) then the rest, as aligning allocators do.
    if (b.n > 8192) {
      CHECK(munmap(b.p, 4096) == 0, "munmap head");
      CHECK(munmap(b.p + 4096, b.n - 4096) == 0, "munmap rest");
    } else {
      CHECK(munmap(b.p, b.n) == 0, "munmap");
    }
  } else {
    std::free(b.p);
  }
  b.p = nullptr;
}

// Realloc chain: grows and shrinks one block across every size class, checking the prefix.
void ReallocChain(std::mt19937_64& rng, std::uint64_t id) {
  Block b{nullptr, 0, id, false};
  for (int step = 0; step < 24; ++step) {
    const std::size_t n = RandomSize(rng);
    auto* q = static_cast<unsigned char*>(std::realloc(b.p, n));
    if (n == 0) {  // glibc semantics: freed, NULL returned
      b.p = q;
      b.n = 0;
      if (q == nullptr) continue;
    }
    CHECK(q != nullptr, "realloc to %zu failed", n);
    if (q == nullptr) return;
    b.p = q;
    CHECK(Verify(b, std::min(b.n, n)), "realloc %zu -> %zu lost data", b.n, n);
    b.n = n;
    Fill(b);
  }
  std::free(b.p);
}

struct Mailbox {
  std::mutex mu;
  std::vector<Block> blocks;
};

void Worker(int t, int threads, long ops, std::uint64_t seed, std::vector<Mailbox>* boxes) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<std::uint64_t>(t));
  std::vector<Block> mine;
  std::uint64_t next_id = static_cast<std::uint64_t>(t) << 40;
  for (long op = 0; op < ops; ++op) {
    const auto r = rng() % 100;
    if (r < 50 || mine.empty()) {
      mine.push_back(Allocate(rng, next_id++));
    } else if (r < 70) {
      const std::size_t i = rng() % mine.size();
      Release(mine[i]);
      mine[i] = mine.back();
      mine.pop_back();
    } else if (r < 85) {  // hand a block to another thread, which frees it
      const std::size_t i = rng() % mine.size();
      Mailbox& box = (*boxes)[(t + 1 + rng() % (threads > 1 ? threads - 1 : 1)) % threads];
      std::lock_guard<std::mutex> lock(box.mu);
      box.blocks.push_back(mine[i]);
      mine[i] = mine.back();
      mine.pop_back();
    } else if (r < 92) {
      ReallocChain(rng, next_id++);
    } else {  // free what others sent
      std::vector<Block> got;
      {
        std::lock_guard<std::mutex> lock((*boxes)[t].mu);
        got.swap((*boxes)[t].blocks);
      }
      for (Block& b : got) Release(b);
    }
    if (mine.size() > 64) {
      Release(mine.front());
      mine.erase(mine.begin());
    }
  }
  for (Block& b : mine) Release(b);
}

// malloc(0) gives unique non-NULL pointers; free(NULL) and realloc(NULL, n) work.
void EdgeCases() {
  void* a = std::malloc(0);
  void* b = std::malloc(0);
  CHECK(a != nullptr && b != nullptr && a != b, "malloc(0) not unique non-NULL: %p %p", a, b);
  std::free(a);
  std::free(b);
  std::free(nullptr);
  void* c = std::realloc(nullptr, 100);
  CHECK(c != nullptr, "realloc(NULL, 100)");
  std::free(c);
  volatile std::size_t huge = SIZE_MAX / 2;  // volatile: the compiler must not see the overflow
  // The result kept in a volatile: clang may otherwise drop an allocation nothing uses and
  // assume it succeeded (the check then failed in clang builds without calling calloc at all).
  void* volatile overflow = std::calloc(huge, 4);
  CHECK(overflow == nullptr, "calloc overflow not refused");
  std::free(overflow);
  void* d = nullptr;
  CHECK(posix_memalign(&d, 24, 10) == EINVAL, "posix_memalign(24) not EINVAL");
  // An mmap resized with mremap keeps its contents.
  auto* m = static_cast<unsigned char*>(
      mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK(m != MAP_FAILED, "mmap 1 MiB");
  if (m != MAP_FAILED) {
    std::memset(m, 0x77, 1 << 20);
    auto* m2 = static_cast<unsigned char*>(mremap(m, 1 << 20, 3 << 20, MREMAP_MAYMOVE));
    CHECK(m2 != MAP_FAILED, "mremap grow");
    if (m2 != MAP_FAILED) {
      CHECK(m2[0] == 0x77 && m2[(1 << 20) - 1] == 0x77, "mremap lost data");
      m2[(3 << 20) - 1] = 1;
      CHECK(madvise(m2, 1 << 20, MADV_DONTNEED) == 0, "madvise");
      CHECK(m2[0] == 0 && m2[4095] == 0, "MADV_DONTNEED of anonymous memory must read zeros");
      CHECK(munmap(m2, 3 << 20) == 0, "munmap after mremap");
    }
  }
}

// fork with live blocks: the child sees them, writes its own copy, exits; the parent's stay.
void ForkCheck(std::mt19937_64& rng) {
  std::vector<Block> blocks;
  for (int i = 0; i < 32; ++i)
    blocks.push_back(Allocate(rng, 0xF0000 + static_cast<std::uint64_t>(i)));
  const pid_t pid = fork();
  if (pid == 0) {
    long bad = 0;
    for (Block& b : blocks) {
      if (b.p == nullptr) continue;
      bad += !Verify(b, b.n);
      std::memset(b.p, 0xEE, b.n);  // only the child's copy
    }
    std::vector<Block> more;
    for (int i = 0; i < 64; ++i)
      more.push_back(Allocate(rng, 0xF1000 + static_cast<std::uint64_t>(i)));
    for (Block& b : more) {
      bad += b.p != nullptr && !Verify(b, b.n);
      Release(b);
    }
    _exit(bad == 0 && failures.load() == 0 ? 0 : 1);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child failed (status %d)", status);
  for (Block& b : blocks) Release(b);  // verifies the parent's data survived the child
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  const long ops = argc > 2 ? std::atol(argv[2]) : 20000;
  std::uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("CXLKV_SEED")) seed = std::strtoull(s, nullptr, 10);
  if (argc > 3) seed = std::strtoull(argv[3], nullptr, 10);
  std::printf("preload_stress: seed %llu, %d threads x %ld ops\n",
              static_cast<unsigned long long>(seed), threads, ops);
  std::fflush(stdout);
  EdgeCases();
  std::mt19937_64 rng(seed);
  ForkCheck(rng);
  std::vector<Mailbox> boxes(static_cast<std::size_t>(threads));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(Worker, t, threads, ops, seed, &boxes);
  for (auto& th : ts) th.join();
  for (Mailbox& box : boxes) {
    for (Block& b : box.blocks) Release(b);
  }
  ForkCheck(rng);
  if (failures.load() != 0) {
    std::fprintf(stderr, "preload_stress: %ld failures (seed %llu)\n", failures.load(),
                 static_cast<unsigned long long>(seed));
    return 1;
  }
  std::printf("preload_stress: ok\n");
  return 0;
}
