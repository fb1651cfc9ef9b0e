// Fuzzes the arena header and allocation-map parser (ValidateHeaderBytes + ValidateMap) on
// arbitrary region images. When the first byte is odd the header is re-sealed before
// parsing, so the fuzzer gets past the checksum and explores the geometry and map checks.
// CXLKV_FUZZ_WRITE_SEED=PATH writes a valid small arena image as a seed and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

using namespace cxlkv::pool;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("CXLKV_FUZZ_WRITE_SEED");
  if (path == nullptr) return 0;
  FormatOptions o;
  o.layout = KvLayout{1, 1, 64, 2, 16, KvLayoutKind::kContiguous};
  o.classes = {{16, 0, 1}, {32, 0, 1}};
  o.owner_slots = 4;
  auto a = Arena::Format(*OpenRegion("memfd:seed?size=96K"), o);
  if (!a.ok()) std::abort();
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) std::abort();
  const auto& r = (*a)->region();
  // Only the metadata: the fuzzer's input is the image, blocks are irrelevant to parsing.
  std::fwrite(r.addr(), 1, r.size_bytes(), f);
  std::fclose(f);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool reseal = data[0] & 1;
  // The image is the region: 8-byte aligned, as a mapping would be.
  std::vector<std::uint64_t> image((size + 7) / 8);
  std::memcpy(image.data(), data, size);
  auto* base = reinterpret_cast<std::byte*>(image.data());
  if (reseal && size >= sizeof(ArenaHeader)) {
    ArenaHeader h;
    std::memcpy(&h, base, sizeof(h));
    h.region_bytes = size;  // let geometry checks run against this image
    cxlkv::coherence::Seal(h, kArenaMagic, kArenaVersion, h.head.seq);
    std::memcpy(base, &h, sizeof(h));
  }
  ArenaHeader h;
  if (ValidateHeaderBytes(base, size, "fuzz", &h).ok()) {
    (void)ValidateMap(h, base, "fuzz");
  }
  return 0;
}
