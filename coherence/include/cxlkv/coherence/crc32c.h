// cxlkv/coherence/crc32c.h — CRC32C (Castagnoli), the checksum on every on-media record.
// Uses the SSE4.2 crc32 instruction when CPUID reports it, else a table. Thread-safe, pure.
#ifndef CXLKV_COHERENCE_CRC32C_H_
#define CXLKV_COHERENCE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace cxlkv::coherence {

// Extends `crc` (0 to start) over [data, data+len). Crc32c("123456789", 9) == 0xE3069283.
std::uint32_t Crc32c(const void* data, std::size_t len, std::uint32_t crc = 0) noexcept;

// The portable table implementation, exposed so tests can compare it with the hardware path.
std::uint32_t Crc32cPortable(const void* data, std::size_t len, std::uint32_t crc = 0) noexcept;

// CRC32C is affine over GF(2): XORing bits into a message changes its CRC by an amount that
// depends only on those bits and how many bytes of the message follow them, not on the rest
// of the message. A Crc32cWordDelta gives that amount for one 8-byte (little-endian) word of a
// message with `trailing_bytes` bytes after it: a record whose CRC is known with the word zero
// is resealed with the word set by one XOR of the delta, the same value Crc32c computes over
// the whole record. Eight table lookups (8 KiB of tables, built at compile time), no
// dependency chain through the record's bytes. Thread-safe, pure.
class Crc32cWordDelta {
 public:
  explicit constexpr Crc32cWordDelta(std::size_t trailing_bytes) noexcept : t_{} {
    std::uint32_t byte_crc[256]{};  // one byte into a zero register (reflected 0x82F63B78)
    for (std::uint32_t v = 0; v < 256; ++v) {
      std::uint32_t c = v;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      byte_crc[v] = c;
    }
    for (std::size_t b = 0; b < 8; ++b) {
      for (std::uint32_t v = 0; v < 256; ++v) {
        std::uint32_t c = byte_crc[v];  // byte b of the word is v, every other byte zero
        for (std::size_t z = 0; z < 7 - b + trailing_bytes; ++z) c = (c >> 8) ^ byte_crc[c & 0xFF];
        t_[b][v] = c;
      }
    }
  }
  // The change to the message's CRC when its word is XORed with `bits`.
  constexpr std::uint32_t operator()(std::uint64_t bits) const noexcept {
    std::uint32_t d = 0;
    for (std::size_t b = 0; b < 8; ++b) d ^= t_[b][(bits >> (8 * b)) & 0xFF];
    return d;
  }

 private:
  std::uint32_t t_[8][256];
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_CRC32C_H_
