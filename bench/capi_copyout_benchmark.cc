// capi_copyout_benchmark — reading a shared prefix through the C API alone (libcxlkv.so), the
// loop bench/python_copyout.py runs from Python through the cxlkv package, so the two
// measure the same thing and the difference is the binding's cost.
//
//   BM_CapiChainCopyOut/block_bytes:B/chain:C   one request's prefix of C published blocks of
//       B bytes: cxlkv_lease_acquire_chain over the C keys (lookup + lease in one pass),
//       then cxlkv_lease_copy_out of every whole block (invalidate, copy, validate) into its
//       own slot of a destination buffer, then cxlkv_lease_release_many. Time per request
//       (UseRealTime); items = blocks, bytes = block bytes copied. The reader heartbeats every
//       100 ms from its loop (counted in), the owner role steps every 2 ms on a thread of its
//       own, as the domain's reclaimer would.
//
// Host 0 publishes the C blocks (random bytes) into an arena in a file in /dev/shm; host 1,
// with its own pool and arena handles on that file (as another process would have), reads
// them. After the timed loop every destination slot is compared with what was published.
// Files go to /dev/shm/cxlkv-bench-copyout-<pid>-*, removed at exit.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "cxlkv/cxlkv.h"

namespace {

[[noreturn]] void Die(const std::string& what, int rc) {
  std::fprintf(stderr, "capi_copyout_benchmark: %s: %d (%s) %s\n", what.c_str(), rc,
               cxlkv_strerror(rc), cxlkv_last_error());
  std::abort();
}

void Check(int rc, const char* what) {
  if (rc != CXLKV_OK) Die(what, rc);
}

struct Setup {
  std::string domain_path, pool_path;
  cxlkv_owner* owner = nullptr;
  std::atomic<bool> stop{false};
  std::thread owner_thread;
  cxlkv_pool *pub_pool = nullptr, *read_pool = nullptr;
  cxlkv_arena *pub_arena = nullptr, *read_arena = nullptr;
  cxlkv_domain *pub = nullptr, *reader = nullptr;
  uint64_t ns = 0;
  std::vector<cxlkv_prefix_key> keys;
  std::vector<std::vector<unsigned char>> data;
  uint64_t block_bytes = 0;

  Setup(uint64_t block, size_t chain) : block_bytes(block) {
    const std::string tag =
        "/dev/shm/cxlkv-bench-copyout-" + std::to_string(getpid()) + "-" + std::to_string(block);
    domain_path = tag + "-domain";
    pool_path = tag + "-pool";
    cxlkv_domain_geometry g{};
    const uint64_t dbytes = (cxlkv_domain_bytes(&g) + 4095) / 4096 * 4096;
    const std::string dspec = "file:" + domain_path + "?size=" + std::to_string(dbytes);
    Check(cxlkv_domain_format(dspec.c_str(), &g), "cxlkv_domain_format");
    Check(cxlkv_owner_open(dspec.c_str(), &owner), "cxlkv_owner_open");
    owner_thread = std::thread([this] {
      while (!stop.load(std::memory_order_relaxed)) {
        cxlkv_owner_step(owner);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    // One layer, one head, 1-byte elements, 16 tokens: blocks of exactly `block` bytes.
    cxlkv_arena_options o{};
    o.layout = cxlkv_kv_layout{1, 1, static_cast<uint32_t>(block / 32), 1, 16, 0};
    const std::string pspec =
        "file:" + pool_path + "?size=" + std::to_string(block * (chain + 4) + (8u << 20));
    Check(cxlkv_pool_open(pspec.c_str(), &pub_pool), "cxlkv_pool_open");
    Check(cxlkv_arena_create(pub_pool, &o, &pub_arena), "cxlkv_arena_create");
    const std::string rspec = "file:" + pool_path;
    Check(cxlkv_pool_open(rspec.c_str(), &read_pool), "cxlkv_pool_open (reader)");
    Check(cxlkv_arena_open(read_pool, nullptr, &read_arena), "cxlkv_arena_open (reader)");
    Check(cxlkv_domain_join(dspec.c_str(), 0, &pub), "cxlkv_domain_join 0");
    Check(cxlkv_domain_join(dspec.c_str(), 1, &reader), "cxlkv_domain_join 1");
    ns = cxlkv_namespace("bench", "copyout", std::to_string(block).c_str());
    std::mt19937_64 rng(block);
    const cxlkv_prefix_key* parent = nullptr;
    std::vector<uint32_t> tokens(16);
    keys.resize(chain);
    for (size_t i = 0; i < chain; ++i) {
      for (uint32_t t = 0; t < 16; ++t) tokens[t] = static_cast<uint32_t>(i * 16 + t);
      keys[i] = cxlkv_prefix_key_chain(ns, parent, tokens.data(), tokens.size());
      data.emplace_back(block);
      for (auto& b : data.back()) b = static_cast<unsigned char>(rng());
      cxlkv_block_ref ref;
      void* addr = nullptr;
      Check(cxlkv_alloc(pub_arena, 0, &ref, &addr), "cxlkv_alloc");
      cxlkv_copy_to_block(addr, data.back().data(), block);
      Check(cxlkv_prefix_publish(pub, ns, &keys[i], parent, pub_arena, &ref),
            "cxlkv_prefix_publish");
      parent = &keys[i];
    }
    cxlkv_prefix_hit hit;
    for (int i = 0; cxlkv_prefix_lookup(reader, ns, &keys.back(), &hit) != CXLKV_OK; ++i) {
      if (i > 5000) Die("the owner did not apply the publications", -1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ~Setup() {
    stop = true;
    owner_thread.join();
    cxlkv_domain_leave(reader);
    cxlkv_domain_leave(pub);
    cxlkv_arena_close(read_arena);
    cxlkv_arena_close(pub_arena);
    cxlkv_pool_close(read_pool);
    cxlkv_pool_close(pub_pool);
    cxlkv_owner_close(owner);
    unlink(domain_path.c_str());
    unlink(pool_path.c_str());
  }
};

std::map<std::pair<uint64_t, size_t>, std::unique_ptr<Setup>> g_setups;

Setup& SetupFor(uint64_t block, size_t chain) {
  auto& s = g_setups[{block, chain}];
  if (!s) s = std::make_unique<Setup>(block, chain);
  return *s;
}

void BM_CapiChainCopyOut(benchmark::State& state) {
  const auto block = static_cast<uint64_t>(state.range(0));
  const auto chain = static_cast<size_t>(state.range(1));
  Setup& s = SetupFor(block, chain);
  std::vector<unsigned char> dst(block * chain);
  std::memset(dst.data(), 0, dst.size());  // fault the pages in before timing
  std::vector<cxlkv_lease> leases(chain);
  auto next_beat = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_beat) {
      if (cxlkv_domain_heartbeat(s.reader, s.read_arena, nullptr) != CXLKV_OK) {
        state.SkipWithError(cxlkv_last_error());
        break;
      }
      next_beat = now + std::chrono::milliseconds(100);
    }
    size_t n = 0;
    int rc = cxlkv_lease_acquire_chain(s.reader, s.ns, s.keys.data(), chain, leases.data(), &n);
    if (rc == CXLKV_E_FULL) {  // not confirmed by the owner yet: beat and retry
      next_beat = now;
      continue;
    }
    if (rc != CXLKV_OK || n != chain) {
      state.SkipWithError("acquire_chain did not lease the whole chain");
      break;
    }
    for (size_t i = 0; i < n; ++i) {
      rc = cxlkv_lease_copy_out(s.reader, s.read_arena, &leases[i], 0, dst.data() + i * block,
                                block);
      if (rc != CXLKV_OK) {
        state.SkipWithError(cxlkv_last_error());
        break;
      }
    }
    cxlkv_lease_release_many(s.reader, leases.data(), n);
  }
  for (size_t i = 0; i < chain; ++i) {
    if (std::memcmp(dst.data() + i * block, s.data[i].data(), block) != 0) {
      state.SkipWithError("a copied block differs from the published one");
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * chain));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * chain * block));
}

// The validated copy-out alone against memcpy of the same blocks, interleaved in one loop so
// that both see the same machine: each iteration (1) evicts the blocks' lines untimed
// (cxlkv_block_invalidate) and times a plain memcpy of every block from memory, then (2) times
// cxlkv_lease_copy_out of every block (its own eviction, copy and validation); cold:1 evicts
// the blocks again, untimed, before (2) as well, so both copies start with the block out of
// this cache (cold:0: the copy-out also pays for evicting what the memcpy cached). The chain's
// leases are taken before the loop and again, untimed, every 100 ms. Counters: memcpy_GBps,
// copyout_GBps and copyout_vs_memcpy (their ratio; the target is >= 0.95).
void BM_CapiCopyOutVsMemcpy(benchmark::State& state) {
  const auto block = static_cast<uint64_t>(state.range(0));
  const auto chain = static_cast<size_t>(state.range(1));
  const bool cold = state.range(2) != 0;
  Setup& s = SetupFor(block, chain);
  std::vector<unsigned char> dst(block * chain);
  std::memset(dst.data(), 0, dst.size());
  std::vector<cxlkv_lease> leases(chain);
  std::vector<const void*> src(chain);
  auto take = [&]() -> bool {
    size_t n = 0;
    for (int tries = 0; tries < 100; ++tries) {
      if (cxlkv_domain_heartbeat(s.reader, s.read_arena, nullptr) != CXLKV_OK) return false;
      const int rc =
          cxlkv_lease_acquire_chain(s.reader, s.ns, s.keys.data(), chain, leases.data(), &n);
      if (rc == CXLKV_OK && n == chain) break;
      if (rc == CXLKV_OK) cxlkv_lease_release_many(s.reader, leases.data(), n);
      n = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return n == chain;
  };
  using Clock = std::chrono::steady_clock;
  double memcpy_s = 0, copyout_s = 0;
  auto retake = Clock::now();
  bool held = false;
  for (auto _ : state) {
    if (!held || Clock::now() >= retake) {
      if (held) cxlkv_lease_release_many(s.reader, leases.data(), chain);
      held = take();
      if (!held) {
        state.SkipWithError("could not lease the chain");
        break;
      }
      retake = Clock::now() + std::chrono::milliseconds(100);
    }
    for (size_t i = 0; i < chain; ++i) {
      Check(cxlkv_block_invalidate(s.reader, s.read_arena, &leases[i], 0, block, &src[i]),
            "cxlkv_block_invalidate");
    }
    const auto t0 = Clock::now();
    for (size_t i = 0; i < chain; ++i) std::memcpy(dst.data() + i * block, src[i], block);
    benchmark::ClobberMemory();
    // The memcpy brought the blocks into this cache; a reader copying a block out usually
    // does not hold it (it copies each block once). Both copies start from memory.
    if (cold) {
      for (size_t i = 0; i < chain; ++i) {
        Check(cxlkv_block_invalidate(s.reader, s.read_arena, &leases[i], 0, block, &src[i]),
              "cxlkv_block_invalidate");
      }
    }
    const auto t1 = Clock::now();
    for (size_t i = 0; i < chain; ++i) {
      Check(cxlkv_lease_copy_out(s.reader, s.read_arena, &leases[i], 0, dst.data() + i * block,
                                 block),
            "cxlkv_lease_copy_out");
    }
    benchmark::ClobberMemory();
    const auto t2 = Clock::now();
    memcpy_s += std::chrono::duration<double>(t1 - t0).count();
    copyout_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t2 - t1).count());
  }
  if (held) cxlkv_lease_release_many(s.reader, leases.data(), chain);
  for (size_t i = 0; i < chain; ++i) {
    if (std::memcmp(dst.data() + i * block, s.data[i].data(), block) != 0) {
      state.SkipWithError("a copied block differs from the published one");
    }
  }
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(chain * block);
  state.counters["memcpy_GBps"] = bytes / memcpy_s / 1e9;
  state.counters["copyout_GBps"] = bytes / copyout_s / 1e9;
  state.counters["copyout_vs_memcpy"] = memcpy_s / copyout_s;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_CapiCopyOutVsMemcpy)
    ->ArgNames({"block_bytes", "chain", "cold"})
    ->ArgsProduct({{64 << 10, 2 << 20, 5 << 20}, {8}, {1, 0}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CapiChainCopyOut)
    ->ArgNames({"block_bytes", "chain"})
    ->Args({64 << 10, 8})
    ->Args({5 << 20, 8})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_setups.clear();
  return 0;
}
