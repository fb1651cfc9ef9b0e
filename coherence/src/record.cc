#include "cxlkv/coherence/record.h"

#include <cstddef>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/crc32c.h"

namespace cxlkv::coherence {

std::uint32_t RecordCrc(const void* record, std::size_t bytes) noexcept {
  constexpr std::size_t kCrcAt = offsetof(RecordHead, crc);
  constexpr std::uint32_t kZero = 0;
  const auto* p = static_cast<const unsigned char*>(record);
  std::uint32_t crc = Crc32c(p, kCrcAt);
  crc = Crc32c(&kZero, sizeof(kZero), crc);
  return Crc32c(p + kCrcAt + sizeof(kZero), bytes - kCrcAt - sizeof(kZero), crc);
}

void SealRecord(void* record, std::size_t bytes, std::uint64_t magic, std::uint32_t version,
                std::uint64_t seq) noexcept {
  auto* head = static_cast<RecordHead*>(record);
  head->magic = magic;
  head->version = version;
  head->bytes = static_cast<std::uint32_t>(bytes);
  head->seq = seq;
  head->reserved = 0;
  head->crc = RecordCrc(record, bytes);
}

absl::Status CheckRecord(const void* record, std::size_t bytes, std::uint64_t magic,
                         std::uint32_t min_version, std::uint32_t max_version,
                         absl::string_view what) {
  const auto* head = static_cast<const RecordHead*>(record);
  if (head->magic == 0) {
    return absl::NotFoundError(absl::StrFormat("%s: no record here (magic is zero)", what));
  }
  if (head->magic != magic) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: foreign data (magic %#018x, expected %#018x); it was not written by cxlkv or "
        "belongs to another record type",
        what, head->magic, magic));
  }
  if (head->version < min_version || head->version > max_version) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: format version %u is not supported by this build (supports %u..%u); use a "
        "matching cxlkv release",
        what, head->version, min_version, max_version));
  }
  if (head->bytes != bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: record size %u does not match the expected %u bytes (corrupt or truncated)", what,
        head->bytes, bytes));
  }
  const std::uint32_t crc = RecordCrc(record, bytes);
  if (crc != head->crc) {
    return absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch (stored %#010x, computed %#010x): the record is corrupt or "
        "was torn by a concurrent writer",
        what, head->crc, crc));
  }
  return absl::OkStatus();
}

}  // namespace cxlkv::coherence
