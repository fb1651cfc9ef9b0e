// cxlkv/pool/layout.h — the on-media format of an arena. Every shared struct of pool/ is here.
//
//   offset 0            ArenaHeader (sealed record, immutable after format), 4 KiB reserved
//   owner_table_offset  OwnerSlot[owner_slots], one cache line each, one per attached process
//   map_offset          BlockWord[total_blocks]: the allocation map, the single source of truth
//   class.hint_offset   per class, a bitmap with one bit per block: 1 = "probably free"
//   class.data_offset   per class, block_count blocks of stride_bytes, aligned to data_align
//
// All positions are byte offsets from the start of the region (never pointers). The header
// is written once, by Format, and sealed last; a region whose header carries the
// kFormattingMagic was being formatted when its writer died and may be formatted again.
//
// Allocation map word (64 bits): generation (32) | owner (16) | state (2) | class (3) | 0.
//   owner 0 = nobody (free, or allocated and persisted); otherwise owner slot index + 1.
//   state kFree: in the free pool; kCached: reserved in an owner's per-thread cache, not
//   handed out; kAllocated: handed out. The generation is bumped each time a block is freed,
//   so a BlockRef taken before the free no longer resolves.
// Crash consistency: every map transition is one atomic store or CAS of one word. The hint
// bitmap is only a hint: a claimer takes bits and then CASes the word from kFree, so a bit
// lost by a crash is repaired by any later RepairHints() and a stale bit costs one failed
// CAS. A dead owner's kCached and kAllocated words return to kFree (RecoverDeadOwners).
//
// Cross-host note: the map relies on atomics, so one arena is shared by the processes of one
// host (coherent memory). Hosts of a CXL domain share memory through the coherence layer's
// owner protocol, not through this map.
#ifndef CXLKV_POOL_LAYOUT_H_
#define CXLKV_POOL_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cxlkv/coherence/record.h"

namespace cxlkv::pool {

inline constexpr std::uint64_t kArenaMagic = coherence::MakeMagic("CXLKVARN");
inline constexpr std::uint64_t kFormattingMagic = coherence::MakeMagic("CXLKVFMT");
inline constexpr std::uint32_t kArenaVersion = 1;
inline constexpr std::uint64_t kHeaderReservedBytes = 4096;
inline constexpr std::uint32_t kMaxClasses = 8;
inline constexpr std::uint32_t kMaxOwnerSlots = 4096;
inline constexpr std::uint64_t kBlockAlignBytes = 4096;  // stride granularity
inline constexpr std::uint64_t kMaxBlocks = 1ull << 31;

// How a block's bytes are ordered (same meaning as vLLM / Dynamo KVBM layouts).
enum class KvLayoutKind : std::uint32_t { kContiguous = 0, kLayerSeparate = 1 };

struct KvLayoutRecord {
  std::uint32_t layers;
  std::uint32_t kv_heads;
  std::uint32_t head_dim;
  std::uint32_t dtype_bytes;
  std::uint32_t tokens_per_block;
  std::uint32_t kind;  // KvLayoutKind
  std::uint32_t reserved[2];
};
static_assert(sizeof(KvLayoutRecord) == 32);

struct ClassRecord {
  std::uint64_t block_bytes;   // useful bytes of one block
  std::uint64_t stride_bytes;  // block_bytes rounded up to kBlockAlignBytes
  std::uint32_t block_count;
  std::uint32_t first_index;       // global index of the class's first block
  std::uint32_t tokens_per_block;  // 0 when the class was sized in bytes
  std::uint32_t reserved0;
  std::uint64_t hint_offset;  // ceil(block_count / 64) words
  std::uint64_t data_offset;  // first block; aligned to data_align_bytes
  std::uint64_t reserved1[2];
};
static_assert(sizeof(ClassRecord) == 64);

struct ArenaHeader {
  coherence::RecordHead head;  // magic kArenaMagic, version kArenaVersion
  std::uint8_t uuid[16];
  std::uint64_t created_unix_ns;
  std::uint64_t region_bytes;
  std::uint64_t data_align_bytes;
  std::uint64_t owner_table_offset;
  std::uint32_t owner_slots;
  std::uint32_t class_count;
  std::uint64_t map_offset;
  std::uint32_t total_blocks;
  std::uint32_t reserved0;
  std::uint64_t metadata_bytes;  // header + owner table + map + hints, before alignment
  std::uint64_t data_end_offset;
  KvLayoutRecord layout;
  std::uint8_t reserved1[48];
  ClassRecord classes[kMaxClasses];
};
static_assert(sizeof(ArenaHeader) == 712);
static_assert(offsetof(ArenaHeader, uuid) == 32);
static_assert(offsetof(ArenaHeader, layout) == 120);
static_assert(offsetof(ArenaHeader, classes) == 200);
static_assert(sizeof(ArenaHeader) <= kHeaderReservedBytes);

// ---- owner slots ------------------------------------------------------------------------
// Slot state word: state (8) | pid (32) | epoch (24). Claimed by CAS kSlotFree -> kSlotClaiming
// carrying the claimer's pid, then the identity fields are written and the state becomes
// kSlotActive. Reclaimed by CAS kSlotActive -> kSlotReclaiming carrying the reclaimer's pid.
enum SlotState : std::uint8_t {
  kSlotFree = 0,
  kSlotClaiming = 1,
  kSlotActive = 2,
  kSlotReclaiming = 3,
};

struct alignas(64) OwnerSlot {
  std::atomic<std::uint64_t> state;
  std::uint64_t start_ticks;   // /proc/PID/stat starttime, against PID reuse
  std::uint64_t boot_id_hash;  // hash of /proc/sys/kernel/random/boot_id
  std::uint64_t machine_hash;  // hash of /etc/machine-id (or hostname)
  std::uint64_t pidns_ino;     // inode of /proc/self/ns/pid
  std::uint64_t attached_unix_ns;
  std::uint32_t crc;  // CRC32C of the five identity fields above
  std::uint32_t reserved[3];
};
static_assert(sizeof(OwnerSlot) == 64);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

constexpr std::uint64_t SlotWord(SlotState s, std::uint32_t pid, std::uint32_t epoch) {
  return static_cast<std::uint64_t>(s) | (static_cast<std::uint64_t>(pid) << 8) |
         (static_cast<std::uint64_t>(epoch & 0xFFFFFF) << 40);
}
constexpr SlotState SlotWordState(std::uint64_t w) { return static_cast<SlotState>(w & 0xFF); }
constexpr std::uint32_t SlotWordPid(std::uint64_t w) { return static_cast<std::uint32_t>(w >> 8); }
constexpr std::uint32_t SlotWordEpoch(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> 40) & 0xFFFFFF;
}

// ---- allocation map -----------------------------------------------------------------------
enum BlockState : std::uint8_t { kFree = 0, kCached = 1, kAllocated = 2 };

using BlockWord = std::atomic<std::uint64_t>;

inline constexpr unsigned kOwnerShift = 32;
inline constexpr unsigned kStateShift = 48;
inline constexpr unsigned kClassShift = 50;
inline constexpr std::uint64_t kGenMask = 0xFFFFFFFFull;
inline constexpr std::uint64_t kReservedMask = ~((1ull << 53) - 1);

constexpr std::uint64_t PackWord(BlockState state, std::uint32_t owner, std::uint32_t gen,
                                 std::uint32_t cls) {
  return gen | (static_cast<std::uint64_t>(owner & 0xFFFF) << kOwnerShift) |
         (static_cast<std::uint64_t>(state) << kStateShift) |
         (static_cast<std::uint64_t>(cls & 7) << kClassShift);
}
constexpr std::uint32_t WordGen(std::uint64_t w) { return static_cast<std::uint32_t>(w); }
constexpr std::uint32_t WordOwner(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> kOwnerShift) & 0xFFFF;
}
constexpr BlockState WordState(std::uint64_t w) {
  return static_cast<BlockState>((w >> kStateShift) & 3);
}
constexpr std::uint32_t WordClass(std::uint64_t w) {
  return static_cast<std::uint32_t>(w >> kClassShift) & 7;
}

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_LAYOUT_H_
