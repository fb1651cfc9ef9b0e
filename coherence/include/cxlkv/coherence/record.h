// cxlkv/coherence/record.h — the checksummed, versioned record every on-media header uses.
//
// A record is a trivially copyable struct whose first member is a RecordHead. Seal() stamps
// magic, version, size and sequence and computes CRC32C over the whole record with the crc
// field taken as zero. Check() validates a record read from shared or persistent memory and
// says precisely what is wrong: foreign (magic), unsupported version, truncated (size),
// corrupt or torn (crc). Readers of records that another host may be rewriting retry on a
// kDataLoss result after Invalidate().
#ifndef CXLKV_COHERENCE_RECORD_H_
#define CXLKV_COHERENCE_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cxlkv::coherence {

struct RecordHead {
  std::uint64_t magic;     // identifies the record type; 8 ASCII bytes by convention
  std::uint32_t version;   // format version of the record type
  std::uint32_t bytes;     // size of the whole record, head included
  std::uint64_t seq;       // bumped by the single writer on every rewrite
  std::uint32_t crc;       // CRC32C of the record with this field zero
  std::uint32_t reserved;  // zero
};
static_assert(sizeof(RecordHead) == 32);
static_assert(std::is_trivially_copyable_v<RecordHead>);

// Packs 8 ASCII characters into a magic number (first character in the low byte).
constexpr std::uint64_t MakeMagic(const char (&s)[9]) {
  std::uint64_t m = 0;
  for (int i = 7; i >= 0; --i) m = (m << 8) | static_cast<unsigned char>(s[i]);
  return m;
}

// CRC of `bytes` bytes at `record` with the head's crc field read as zero.
std::uint32_t RecordCrc(const void* record, std::size_t bytes) noexcept;

// Stamps the head and checksum of a record of `bytes` bytes (bytes >= sizeof(RecordHead)).
void SealRecord(void* record, std::size_t bytes, std::uint64_t magic, std::uint32_t version,
                std::uint64_t seq) noexcept;

// Validates a record. `what` names it in errors (e.g. "/dev/dax0.0: arena header").
// Errors: kNotFound if the magic is zero (never written), kFailedPrecondition for a foreign
// magic, kUnimplemented for a version outside [min_version, max_version], kDataLoss for a
// size or checksum mismatch.
absl::Status CheckRecord(const void* record, std::size_t bytes, std::uint64_t magic,
                         std::uint32_t min_version, std::uint32_t max_version,
                         absl::string_view what);

template <typename T>
void Seal(T& record, std::uint64_t magic, std::uint32_t version, std::uint64_t seq) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  SealRecord(&record, sizeof(T), magic, version, seq);
}

template <typename T>
absl::Status Check(const T& record, std::uint64_t magic, std::uint32_t min_version,
                   std::uint32_t max_version, absl::string_view what) {
  static_assert(std::is_trivially_copyable_v<T>);
  return CheckRecord(&record, sizeof(T), magic, min_version, max_version, what);
}

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_RECORD_H_
