// capi_tier_benchmark — the per-call cost of the C API's tier (cxlkv_tier_*, libcxlkv.so):
// place, read and explain, through the public header alone, so one source builds against any
// commit's libcxlkv (bench/capi_tier_before_after.sh builds it against two and runs them
// interleaved; issue #31: the tier before and after it was rebuilt over tier::TieredStore).
//
//   BM_TierPlace/blocks:N        one cxlkv_tier_place of N new blocks (16 KiB each) that the
//       rule keeps in CXL (they follow a hot root block in their request's chain and take its
//       short reuse interval): the rule's decision per block, a non-temporal copy into a new
//       arena block, the watermark check and the chain marked used. Time per call; items =
//       blocks. The placed keys are dropped every 256 calls with the timer paused (the root's
//       use refreshed then too), so the class never fills.
//   BM_TierRead/from:F/blocks:N  one cxlkv_tier_read of N held blocks into 4 KiB-aligned
//       buffers, from CXL (F=0: a pinned copy per block) or NVMe (F=1: one batch read of the
//       store's O_DIRECT slot file; the disk's time is in it). Nothing moves between calls.
//   BM_TierExplain/json:J        one cxlkv_tier_explain of a CXL block (J=0 text, J=1 JSON)
//       into a 64 KiB buffer: the residence, history, last move and the rule's verdict now.
//
// Every call's result is checked (a place that is not IN_CXL, a read that is not from where
// it should be, or any error stops the run with the reason); after the timed reads every
// destination is compared with what was placed. The pool is a memfd; the NVMe store is a
// fresh directory under $CXLKV_BENCH_NVME_DIR, else $TMPDIR, else /tmp (a file system with
// O_DIRECT: not tmpfs), removed at exit.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "cxlkv/cxlkv.h"

namespace {

constexpr std::uint64_t kBlock = 16384;  // layout {2,2,64,2,16}: 16 tokens of 1 KiB
constexpr std::size_t kDropEvery = 256;  // place calls between two (untimed) drops

[[noreturn]] void Die(const std::string& what, int rc) {
  std::fprintf(stderr, "capi_tier_benchmark: %s: %d (%s) %s\n", what.c_str(), rc,
               cxlkv_strerror(rc), cxlkv_last_error());
  std::exit(2);
}

void Check(int rc, const char* what) {
  if (rc != CXLKV_OK) Die(what, rc);
}

// A key's result that is not the residence wanted (or an error).
void Expect(int result, int want, const char* what) {
  if (result == want) return;
  if (result < 0) Die(what, result);
  std::fprintf(stderr,
               "capi_tier_benchmark: %s: residence %d, wanted %d (1 CXL, 2 NVMe, 5 dropped): the "
               "tier decided otherwise than this benchmark assumes\n",
               what, result, want);
  std::exit(2);
}

// Block contents from the key alone, so any copy can be checked.
void Fill(void* dst, std::size_t n, cxlkv_prefix_key k) {
  std::uint64_t x = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) | 1;
  auto* p = static_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, n - i < 8 ? n - i : 8);
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, AlignedFree>;

Buffer Aligned(std::size_t n) {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, n) != 0) Die("posix_memalign", -1);
  return Buffer(p);
}

struct Tier {
  std::string dir;
  cxlkv_pool* pool = nullptr;
  cxlkv_arena* arena = nullptr;
  cxlkv_tier* tier = nullptr;
  std::uint64_t ns = 0;
  cxlkv_prefix_key root{};         // every request's first block, kept hot
  std::uint64_t next_salt = 1000;  // fresh chains for place
  // Held for read and explain: in CXL, and on NVMe.
  std::vector<cxlkv_prefix_key> in_cxl, on_nvme;

  Tier() {
    const char* base = std::getenv("CXLKV_BENCH_NVME_DIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    std::string tmpl = std::string(base) + "/cxlkv-bench-tier-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp under " + std::string(base), -errno);
    dir = tmpl;
    // No cool-down (a dropped key is never held back), and a recompute rate at which a block's
    // 16 tokens cost more than fetching it, so a block with a short reuse interval is kept.
    const std::string cfg = dir + "/bench.toml";
    if (FILE* f = std::fopen(cfg.c_str(), "w"); f != nullptr) {
      std::fputs("[placement]\ncooldown_ms = 0\nrecompute_tokens_per_s = 100000\n", f);
      std::fclose(f);
    } else {
      Die("cannot write " + cfg, -errno);
    }
    Check(cxlkv_pool_open("memfd:bench-tier?size=256M", &pool), "cxlkv_pool_open");
    cxlkv_arena_options ao;
    std::memset(&ao, 0, sizeof(ao));
    ao.layout = cxlkv_kv_layout{2, 2, 64, 2, 16, 0};
    Check(cxlkv_arena_create(pool, &ao, &arena), "cxlkv_arena_create");
    const std::string nvme = dir + "/nvme";
    cxlkv_tier_options o;
    std::memset(&o, 0, sizeof(o));
    o.size_class = 0;
    o.nvme_dir = nvme.c_str();
    o.nvme_blocks = 4096;
    o.config_path = cfg.c_str();
    Check(cxlkv_tier_open(arena, &o, &tier), "cxlkv_tier_open");
    if (cxlkv_tier_block_size(tier) != kBlock) Die("the tier's block size is not 16 KiB", -1);
    ns = cxlkv_namespace("bench", "tier", "capi");
    // Every request's chain starts at one hot root block (a shared system prompt, used
    // twice within microseconds): new blocks after it, with no history of their own, take
    // its short reuse interval and the rule keeps them in CXL.
    unsigned char digest[32];
    for (int i = 0; i < 32; ++i) digest[i] = static_cast<unsigned char>(i);
    Check(cxlkv_prefix_key_from_digest(ns, nullptr, digest, 32, &root),
          "cxlkv_prefix_key_from_digest");
    UseRoot();
    UseRoot();
    // 64 blocks to read and explain from CXL, 64 demoted to NVMe (each after the root).
    in_cxl = Chain(2, 64);
    PlaceInCxl(in_cxl);
    in_cxl.erase(in_cxl.begin());
    on_nvme = Chain(3, 64);
    PlaceInCxl(on_nvme);
    on_nvme.erase(on_nvme.begin());
    std::vector<int> res(on_nvme.size());
    Check(cxlkv_tier_demote(tier, on_nvme.data(), on_nvme.size(), res.data()), "cxlkv_tier_demote");
    for (int x : res) Expect(x, CXLKV_TIER_ON_NVME, "cxlkv_tier_demote (setup)");
  }

  ~Tier() {
    cxlkv_tier_close(tier);
    cxlkv_arena_close(arena);
    cxlkv_pool_close(pool);
    const std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  }

  void UseRoot() {
    std::vector<cxlkv_prefix_key> chain{root};
    cxlkv_tier_request r = Request(chain, 0);
    Check(cxlkv_tier_use(tier, &r), "cxlkv_tier_use");
  }

  // A request's chain: the root, then n fresh keys from 32-byte digests, each chained to the
  // one before (what an engine's chained page hash gives). The request acts on [1, n].
  std::vector<cxlkv_prefix_key> Chain(std::uint64_t salt, std::size_t n) const {
    std::vector<cxlkv_prefix_key> keys(n + 1);
    keys[0] = root;
    for (std::size_t b = 1; b <= n; ++b) {
      unsigned char digest[32];
      for (int i = 0; i < 32; ++i) {
        digest[i] = static_cast<unsigned char>((salt >> (8 * (i % 8))) * 31 + b * 7 + i);
      }
      Check(cxlkv_prefix_key_from_digest(ns, &keys[b - 1], digest, 32, &keys[b]),
            "cxlkv_prefix_key_from_digest");
    }
    return keys;
  }

  cxlkv_tier_request Request(const std::vector<cxlkv_prefix_key>& chain, std::size_t first) const {
    cxlkv_tier_request r;
    std::memset(&r, 0, sizeof(r));
    r.ns = ns;
    r.chain = chain.data();
    r.n = chain.size();
    r.first = first;
    return r;
  }

  // Places chain[1..] with contents from Fill; each must be kept in CXL.
  void PlaceInCxl(const std::vector<cxlkv_prefix_key>& chain) {
    std::vector<Buffer> bufs;
    std::vector<const void*> data;
    for (std::size_t i = 1; i < chain.size(); ++i) {
      bufs.push_back(Aligned(kBlock));
      Fill(bufs.back().get(), kBlock, chain[i]);
      data.push_back(bufs.back().get());
    }
    cxlkv_tier_request r = Request(chain, 1);
    std::vector<int> res(chain.size() - 1);
    Check(cxlkv_tier_place(tier, &r, data.data(), kBlock, res.data()), "cxlkv_tier_place");
    for (int x : res) Expect(x, CXLKV_TIER_IN_CXL, "cxlkv_tier_place (setup)");
  }
};

Tier& TheTier() {
  static Tier* t = new Tier();  // closed in main, after the run
  return *t;
}
Tier* g_tier = nullptr;

void BM_TierPlace(benchmark::State& state) {
  Tier& t = TheTier();
  g_tier = &t;
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<Buffer> bufs;
  std::vector<const void*> data;
  for (std::size_t i = 0; i < n; ++i) {
    bufs.push_back(Aligned(kBlock));
    std::memset(bufs.back().get(), static_cast<int>(i + 1), kBlock);
    data.push_back(bufs.back().get());
  }
  // Chains made ahead of time: kDropEvery calls' worth, dropped and replaced untimed.
  std::vector<std::vector<cxlkv_prefix_key>> chains(kDropEvery);
  auto refill = [&] {
    for (auto& c : chains) c = t.Chain(t.next_salt++, n);
    t.UseRoot();  // the root stays hot however long the run
  };
  refill();
  std::vector<int> res(n);
  std::size_t i = 0;
  for (auto _ : state) {
    if (i == kDropEvery) {
      state.PauseTiming();
      for (auto& c : chains) {
        Check(cxlkv_tier_drop(t.tier, c.data() + 1, n, res.data()), "cxlkv_tier_drop");
      }
      refill();
      i = 0;
      state.ResumeTiming();
    }
    cxlkv_tier_request r = t.Request(chains[i], 1);
    const int rc = cxlkv_tier_place(t.tier, &r, data.data(), kBlock, res.data());
    if (rc != CXLKV_OK || res[0] != CXLKV_TIER_IN_CXL) {
      state.SkipWithError(("cxlkv_tier_place: " + std::to_string(rc) + " residence " +
                           std::to_string(res[0]) + ": " + cxlkv_last_error())
                              .c_str());
      break;
    }
    ++i;
  }
  // After the loop: not timed.
  for (std::size_t j = 0; j < i; ++j) {
    Check(cxlkv_tier_drop(t.tier, chains[j].data() + 1, n, res.data()), "cxlkv_tier_drop");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(BM_TierPlace)->ArgName("blocks")->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond);

void BM_TierRead(benchmark::State& state) {
  Tier& t = TheTier();
  g_tier = &t;
  const bool nvme = state.range(0) != 0;
  const auto n = static_cast<std::size_t>(state.range(1));
  const std::vector<cxlkv_prefix_key> keys(
      (nvme ? t.on_nvme : t.in_cxl).begin(),
      (nvme ? t.on_nvme : t.in_cxl).begin() + static_cast<std::ptrdiff_t>(n));
  const int want = nvme ? CXLKV_TIER_ON_NVME : CXLKV_TIER_IN_CXL;
  std::vector<Buffer> bufs;
  std::vector<void*> dsts;
  for (std::size_t i = 0; i < n; ++i) {
    bufs.push_back(Aligned(kBlock));
    dsts.push_back(bufs.back().get());
  }
  std::vector<int> res(n);
  for (auto _ : state) {
    const int rc = cxlkv_tier_read(t.tier, keys.data(), n, dsts.data(), kBlock, res.data());
    if (rc != CXLKV_OK || res[0] != want) {
      state.SkipWithError(("cxlkv_tier_read: " + std::to_string(rc) + " residence " +
                           std::to_string(res[0]) + ": " + cxlkv_last_error())
                              .c_str());
      break;
    }
  }
  // What was read is what was placed.
  Buffer want_bytes = Aligned(kBlock);
  for (std::size_t i = 0; i < n; ++i) {
    Fill(want_bytes.get(), kBlock, keys[i]);
    if (std::memcmp(want_bytes.get(), dsts[i], kBlock) != 0) {
      state.SkipWithError("a block read differs from the block placed");
      break;
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * kBlock));
}
BENCHMARK(BM_TierRead)
    ->ArgNames({"from", "blocks"})
    ->Args({0, 1})
    ->Args({0, 8})
    ->Args({1, 1})
    ->Args({1, 8})
    ->Unit(benchmark::kMicrosecond);

void BM_TierExplain(benchmark::State& state) {
  Tier& t = TheTier();
  g_tier = &t;
  const std::uint32_t flags = state.range(0) != 0 ? CXLKV_TIER_EXPLAIN_JSON : 0u;
  std::vector<char> buf(65536);
  std::size_t needed = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    const cxlkv_prefix_key& key = t.in_cxl[k++ % t.in_cxl.size()];
    const int rc = cxlkv_tier_explain(t.tier, &key, flags, buf.data(), buf.size(), &needed);
    if (rc != CXLKV_OK) {
      state.SkipWithError(
          ("cxlkv_tier_explain: " + std::to_string(rc) + ": " + cxlkv_last_error()).c_str());
      break;
    }
    benchmark::DoNotOptimize(buf.data());
  }
  state.counters["bytes_out"] = static_cast<double>(needed);
}
BENCHMARK(BM_TierExplain)->ArgName("json")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete g_tier;
  return 0;
}
