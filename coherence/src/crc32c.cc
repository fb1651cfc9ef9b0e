// CRC32C: SSE4.2 crc32 instruction when present, else a byte table (reflected 0x82F63B78).
#include "cxlkv/coherence/crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

#include "cxlkv/coherence/cache.h"

namespace cxlkv::coherence {
namespace {

constexpr std::array<std::uint32_t, 256> MakeTable() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = MakeTable();

__attribute__((target("sse4.2"))) std::uint32_t Crc32cHw(const unsigned char* p, std::size_t len,
                                                         std::uint32_t crc) noexcept {
  std::uint64_t c = ~crc;
  while (len >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    len -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  if (len >= 4) {  // a line record's tail (60 = 7 x 8 + 4): one step instead of four
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    c32 = _mm_crc32_u32(c32, v);
    p += 4;
    len -= 4;
  }
  while (len-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

}  // namespace

std::uint32_t Crc32cPortable(const void* data, std::size_t len, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (len-- > 0) c = kTable[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::uint32_t Crc32c(const void* data, std::size_t len, std::uint32_t crc) noexcept {
  static const bool hw = DetectedCpuFeatures().sse42;
  if (hw) return Crc32cHw(static_cast<const unsigned char*>(data), len, crc);
  return Crc32cPortable(data, len, crc);
}

}  // namespace cxlkv::coherence
