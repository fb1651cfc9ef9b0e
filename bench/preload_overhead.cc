// preload_overhead: a measured harness for libcxlkv_preload.so, run as separate processes
// (the shim can only be loaded with LD_PRELOAD): bench/preload_overhead.sh runs it plain,
// under the shim and under other allocators, interleaved, and reports medians.
//
//   preload_overhead small THREADS OPS   mixed small allocations (8 B .. 4 KiB: malloc, free,
//                                        calloc, realloc) over a 4096-slot working set per
//                                        thread; prints ns per operation
//   preload_overhead large BYTES ITERS   malloc(BYTES), write one byte per 4 KiB page, free;
//                                        prints ns per allocation (touch included)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

std::uint64_t sink = 0;

double Small(int threads, long ops) {
  std::vector<std::thread> ts;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([t, ops, &sums] {
      constexpr std::size_t kSlots = 4096, kTable = 1 << 16;
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      std::vector<std::uint32_t> sizes(kTable), picks(kTable);
      for (std::size_t i = 0; i < kTable; ++i) {
        const auto r = rng() % 100;
        sizes[i] = static_cast<std::uint32_t>(r < 60   ? 8 + rng() % 56
                                              : r < 90 ? 64 + rng() % 448
                                                       : 512 + rng() % 3584);
        picks[i] = static_cast<std::uint32_t>(rng() % kSlots);
      }
      std::vector<char*> slot(kSlots, nullptr);
      std::uint64_t sum = 0;
      for (long i = 0; i < ops; ++i) {
        const std::size_t k = picks[static_cast<std::size_t>(i) & (kTable - 1)];
        const std::size_t n = sizes[(static_cast<std::size_t>(i) * 7) & (kTable - 1)];
        char*& s = slot[k];
        switch (i & 15) {
          case 0:
            s = static_cast<char*>(std::realloc(s, n));
            break;
          case 1:
            std::free(s);
            s = static_cast<char*>(std::calloc(1, n));
            break;
          default:
            std::free(s);
            s = static_cast<char*>(std::malloc(n));
        }
        s[0] = static_cast<char>(i);
        sum += static_cast<unsigned char>(s[n - 1]);
      }
      for (char* s : slot) std::free(s);
      sums[static_cast<std::size_t>(t)] = sum;
    });
  }
  for (auto& th : ts) th.join();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  for (auto s : sums) sink += s;
  return ns / static_cast<double>(ops);  // per operation, per thread (threads run in parallel)
}

double Large(std::size_t bytes, long iters) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) {
    auto* p = static_cast<volatile char*>(std::malloc(bytes));
    for (std::size_t o = 0; o < bytes; o += 4096) p[o] = static_cast<char>(i);
    sink += static_cast<unsigned char>(p[bytes / 2]);
    std::free(const_cast<char*>(p));
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return ns / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s small THREADS OPS | large BYTES ITERS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "small") {
    std::printf("%.3f\n", Small(std::atoi(argv[2]), std::atol(argv[3])));
  } else if (mode == "large") {
    std::printf("%.1f\n", Large(std::strtoull(argv[2], nullptr, 10), std::atol(argv[3])));
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  return sink == 42 ? 1 : 0;  // keep the work observable
}
