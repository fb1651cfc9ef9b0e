// cxlkv/preload/layout.h — the shim's one record that other processes read: the binding of a
// shared-memory file (CXLKV_SHM) to an extent of a devdax: or file: pool.
//
// A process that maps a matching file, say /dev/shm/vllm_offload_X.mmap, for the first time
// claims a run of the pool's blocks, persists them (owner 0: they outlive the process) and
// writes this record into a sidecar file beside it, /dev/shm/.vllm_offload_X.mmap.<ino>.<btime>
// .cxlkv, named after the file's inode and birth time so a new file of the same name never
// meets an old binding. Every later process that maps the same file reads the record and
// maps the same extent, so they all share its memory as they would share the file's pages.
//
// Sidecar file: [ShmBindingRecord][std::uint32_t generation of each block, block_count of
// them]. Little-endian, fixed-width fields; the record is sealed (coherence/record.h: magic,
// version, size, CRC32C) and gens_crc covers the generations.
//
// Locks (open file description locks, F_OFD_SETLK, on the sidecar; released by the kernel when
// the last descriptor of the description closes, so also when a process dies):
//   byte 0  exclusive while a process reads or writes the record (binding, collecting);
//   byte 1  shared by every process that maps the extent, for as long as it does (the
//           descriptor stays open; a forked child shares it, exec closes it).
// A collector frees the extent (Arena::FreeShared of each block, then unlinks the sidecar)
// only with byte 0 held, once the file is gone and byte 1 can be taken exclusively: nobody
// maps the extent any more.
//
// Same-host only: the sidecar lives on the host's tmpfs, and the pool's map words are written
// back by Persist/FreeShared as for any persisted block (pool/arena.h).
#ifndef CXLKV_PRELOAD_LAYOUT_H_
#define CXLKV_PRELOAD_LAYOUT_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cxlkv/coherence/record.h"

namespace cxlkv::preload {

inline constexpr std::uint64_t kShmBindingMagic = coherence::MakeMagic("CXLKVSHM");
inline constexpr std::uint32_t kShmBindingVersion = 1;
inline constexpr const char* kShmSidecarSuffix = ".cxlkv";
inline constexpr off_t kShmRecordLockByte = 0;
inline constexpr off_t kShmMapperLockByte = 1;

enum class ShmBindingState : std::uint32_t {
  kBound = 1,        // the extent below backs the file
  kPassThrough = 2,  // the pool could not (full): every process maps the file itself
};

struct ShmBindingRecord {
  coherence::RecordHead head;      // magic "CXLKVSHM", version 1, bytes = sizeof(*this)
  std::uint64_t file_dev = 0;      // st_dev of the bound file
  std::uint64_t file_ino = 0;      // st_ino
  std::int64_t file_btime_ns = 0;  // statx birth time; 0 where the file system has none
  std::uint64_t file_bytes = 0;    // the file's size when it was bound
  std::uint32_t state = 0;         // ShmBindingState
  std::uint32_t cls = 0;           // the pool arena's class of the blocks
  std::uint8_t arena_uuid[16] = {};
  std::uint32_t first_block = 0;  // global index of the run's first block
  std::uint32_t block_count = 0;
  std::uint64_t extent_bytes = 0;   // block_count * stride: what a mapping may cover
  std::uint64_t source_offset = 0;  // of the first block in the pool's device or file
  std::uint32_t gens_crc = 0;       // CRC32C of the block_count generations after the record
  std::uint32_t reserved = 0;
  char pool[256] = {};    // the pool's spec, NUL-terminated (for people and tools)
  char reason[200] = {};  // kPassThrough: why
};
static_assert(std::is_trivially_copyable_v<ShmBindingRecord>);
static_assert(sizeof(ShmBindingRecord) == 576);
static_assert(offsetof(ShmBindingRecord, file_dev) == 32);
static_assert(offsetof(ShmBindingRecord, state) == 64);
static_assert(offsetof(ShmBindingRecord, arena_uuid) == 72);
static_assert(offsetof(ShmBindingRecord, first_block) == 88);
static_assert(offsetof(ShmBindingRecord, source_offset) == 104);
static_assert(offsetof(ShmBindingRecord, pool) == 120);
static_assert(offsetof(ShmBindingRecord, reason) == 376);

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_LAYOUT_H_
