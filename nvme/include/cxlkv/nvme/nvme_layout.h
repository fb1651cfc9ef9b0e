// cxlkv/nvme/nvme_layout.h — the on-disk format of the NVMe tier (see docs/nvme.md).
//
// A store is a directory holding two files:
//   cxlkv-nvme.meta   4 KiB: NvmeMetaRecord (sealed), written once when the store is created
//   cxlkv-nvme.slots  slot[0], slot[1], ... each slot_bytes long, at offset slot * slot_bytes
// A slot is one 4 KiB header block followed by the payload, padded to 4 KiB:
//   +0      NvmeSlotHeader (sealed record), rest of the 4 KiB block zero
//   +4096   payload_bytes bytes of the KV block, zero padding to the slot's 4 KiB boundary
// Both parts go to the device in one O_DIRECT write. A slot is valid when its header's
// CRC32C (which covers key, sequence, length and the payload's XXH3-64) checks, its store uuid
// is this store's, its slot field is its own index, and its payload hashes to payload_xxh3.
// A torn write fails one of these; a retired slot has its header block overwritten with
// zeros (a tombstone), so it reads as never written.
//
// These are on-media structs, not shared memory: one process owns a store at a time (flock
// on the meta file), so they carry no cache-line discipline. Fixed-width fields, sizes and
// offsets pinned below.
#ifndef CXLKV_NVME_NVME_LAYOUT_H_
#define CXLKV_NVME_NVME_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "cxlkv/coherence/record.h"

namespace cxlkv::nvme {

inline constexpr std::uint64_t kNvmeMetaMagic = coherence::MakeMagic("CXLKVNVM");
inline constexpr std::uint64_t kNvmeSlotMagic = coherence::MakeMagic("CXLKVNVS");
inline constexpr std::uint32_t kNvmeVersion = 1;
// O_DIRECT granularity used for every offset, length and buffer address. 4 KiB suits 4Kn
// NVMe namespaces as well as 512e ones.
inline constexpr std::uint64_t kNvmeIoAlignBytes = 4096;
inline constexpr std::uint64_t kNvmeHeaderBytes = 4096;
inline constexpr std::uint64_t kNvmeMetaBytes = 4096;
// Largest payload one slot may be configured for (a whole 70B-class block of 64 tokens fits).
inline constexpr std::uint64_t kNvmeMaxPayloadBytes = 1ull << 30;

struct NvmeMetaRecord {
  coherence::RecordHead head;  // magic kNvmeMetaMagic, version kNvmeVersion
  std::uint8_t uuid[16];       // stamped into every slot header
  std::uint64_t created_unix_ns;
  std::uint64_t slot_bytes;              // header + payload capacity, multiple of 4 KiB
  std::uint64_t payload_capacity_bytes;  // largest payload a slot holds
  std::uint64_t header_bytes;            // kNvmeHeaderBytes
  std::uint64_t reserved[4];
};
static_assert(sizeof(NvmeMetaRecord) == 112);
static_assert(offsetof(NvmeMetaRecord, uuid) == 32);
static_assert(offsetof(NvmeMetaRecord, slot_bytes) == 56);
static_assert(sizeof(NvmeMetaRecord) <= kNvmeMetaBytes);

struct NvmeSlotHeader {
  coherence::RecordHead head;  // magic kNvmeSlotMagic; seq: the store's write sequence
  std::uint8_t store_uuid[16];
  std::uint64_t key_lo;
  std::uint64_t key_hi;
  std::uint64_t slot;  // index this slot was written at (catches misdirected writes)
  std::uint64_t payload_bytes;
  std::uint64_t payload_xxh3;  // XXH3-64 of the payload_bytes bytes
  std::uint64_t reserved[2];
};
static_assert(sizeof(NvmeSlotHeader) == 104);
static_assert(offsetof(NvmeSlotHeader, store_uuid) == 32);
static_assert(offsetof(NvmeSlotHeader, key_lo) == 48);
static_assert(offsetof(NvmeSlotHeader, payload_xxh3) == 80);
static_assert(sizeof(NvmeSlotHeader) <= kNvmeHeaderBytes);

}  // namespace cxlkv::nvme

#endif  // CXLKV_NVME_NVME_LAYOUT_H_
