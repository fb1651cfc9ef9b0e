// Random copy lists for gpu/'s planning tests (gpu_plan_test, gpu_writeback_test): a paged
// cache of random geometry (contiguous or one tensor per layer, K and V together or apart)
// and a valid list of (host block, page) pairs with a random layer range.
#ifndef CXLKV_TESTS_GPU_RANDOM_COPIES_H_
#define CXLKV_TESTS_GPU_RANDOM_COPIES_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cxlkv/gpu/plan.h"

namespace cxlkv::gpu::testing {

struct RandomCopies {
  static constexpr std::uint64_t kHostBase = 0x100000, kDevBase = 0x40000000;
  PagedCache cache;
  std::vector<BlockCopy> blocks;  // host blocks distinct, pages distinct
  std::uint32_t host_blocks = 0;  // the host side spans [kHostBase, + host_blocks * block)
  std::uint32_t layer_begin = 0, layer_end = 0;
};

// Up to max_layers layers, 4..43 pages, chunks of 16..128 bytes; the host blocks and pages
// are shuffled, each sorted in half the cases (runs that coalesce).
inline RandomCopies MakeRandomCopies(std::mt19937_64& rng64, std::uint32_t max_layers) {
  auto rng = [&] { return static_cast<std::uint32_t>(rng64()); };
  RandomCopies r;
  const std::uint32_t layers = 1 + rng() % max_layers, kv = 1 + rng() % 2, pages = 4 + rng() % 40;
  const std::uint64_t chunk = 16 * (1 + rng() % 8);
  if (rng() % 2) {
    r.cache = PagedCache::Contiguous(RandomCopies::kDevBase, layers, kv, chunk, pages);
  } else {
    std::vector<std::uint64_t> bases;
    for (std::uint32_t l = 0; l < layers; ++l) {
      bases.push_back(RandomCopies::kDevBase + l * kv * pages * chunk);
    }
    r.cache = PagedCache::LayerSeparate(bases, kv, chunk, pages);
  }
  const std::uint64_t b = r.cache.BlockBytes();
  r.host_blocks = pages + 8;
  const std::uint32_t n = 1 + rng() % pages;
  std::vector<std::uint32_t> hb(r.host_blocks), pg(pages);
  for (std::uint32_t i = 0; i < r.host_blocks; ++i) hb[i] = i;
  for (std::uint32_t i = 0; i < pages; ++i) pg[i] = i;
  std::shuffle(hb.begin(), hb.end(), rng64);
  std::shuffle(pg.begin(), pg.end(), rng64);
  if (rng() % 2) std::sort(hb.begin(), hb.begin() + n);
  if (rng() % 2) std::sort(pg.begin(), pg.begin() + n);
  for (std::uint32_t i = 0; i < n; ++i)
    r.blocks.push_back({RandomCopies::kHostBase + hb[i] * b, pg[i]});
  r.layer_begin = rng() % layers;
  r.layer_end = r.layer_begin + 1 + rng() % (layers - r.layer_begin);
  return r;
}

}  // namespace cxlkv::gpu::testing

#endif  // CXLKV_TESTS_GPU_RANDOM_COPIES_H_
