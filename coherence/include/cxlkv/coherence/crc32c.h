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

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_CRC32C_H_
