// Validation of untrusted arena images: header seal, geometry, owner slots, map words.
// Everything here reads a region that another (possibly buggy or hostile) writer produced,
// so every offset is bounds-checked before use. Fuzzed by fuzz/arena_fuzz.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/arena.h"

namespace cxlkv::pool {
namespace {

absl::Status Corrupt(absl::string_view what, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat(
      what, ": arena metadata is corrupt: ", problem,
      "; the region was not modified. Restore it, or reformat with --force to discard it"));
}

bool RangeOk(std::uint64_t off, std::uint64_t len, std::uint64_t limit) {
  return off <= limit && len <= limit - off;
}

std::uint64_t HintWords(std::uint64_t blocks) { return (blocks + 63) / 64; }

// How much of a region with a zeroed header page is checked before it counts as blank.
constexpr std::uint64_t kBlankScanBytes = 16ull << 20;

}  // namespace

absl::Status ValidateHeaderBytes(const std::byte* base, std::uint64_t region_bytes,
                                 absl::string_view what, ArenaHeader* out) {
  if (region_bytes < kHeaderReservedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": region of ", region_bytes, " bytes is too small to hold an arena"));
  }
  ArenaHeader h;
  std::memcpy(&h, base, sizeof(h));
  if (h.head.magic == kFormattingMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     ": formatting of this arena was interrupted; format it again "
                     "(`cxlkvctl arena format`)"));
  }
  if (h.head.magic == 0) {
    bool all_zero = true;
    for (std::size_t i = 0; i < kHeaderReservedBytes && all_zero; ++i) {
      all_zero = base[i] == std::byte{0};
    }
    if (all_zero) {
      // Blank means blank: a header page zeroed by accident (a stray memset, a partial
      // restore) leaves the owner table and the block map behind it, which format would
      // discard. The metadata follows the header at the front of the region, so its first
      // kBlankScanBytes decide.
      const std::uint64_t end = std::min<std::uint64_t>(region_bytes, kBlankScanBytes);
      std::uint64_t first_set = end;
      for (std::uint64_t i = kHeaderReservedBytes; i < end; ++i) {
        if (base[i] != std::byte{0}) {
          first_set = i;
          break;
        }
      }
      if (first_set != end) {
        return absl::DataLossError(absl::StrCat(
            what, ": the header page is zeroed but the region is not blank (byte ", first_set,
            " is set: an arena's owner table or block map?); the region was not modified. "
            "Restore it from a backup, or format with --force to discard what it holds"));
      }
      return absl::NotFoundError(
          absl::StrCat(what,
                       ": no arena here (the region is blank); format one with "
                       "`cxlkvctl arena format <spec>` or cxlkv_arena_create()"));
    }
  }
  const std::string header_what = absl::StrCat(what, ": arena header");
  if (auto st = coherence::Check(h, kArenaMagic, kArenaVersion, kArenaVersion, header_what);
      !st.ok()) {
    if (absl::IsUnimplemented(st)) return st;  // a newer format: the fix is a matching release
    return absl::Status(st.code(), absl::StrCat(st.message(),
                                                "; the region was not modified. Check the spec "
                                                "names an arena; restore it from a backup, or "
                                                "format with --force to discard it"));
  }
  if (auto st = ValidateGeometry(h, region_bytes, what); !st.ok()) return st;
  *out = h;
  return absl::OkStatus();
}

absl::Status ValidateGeometry(const ArenaHeader& h, std::uint64_t region_bytes,
                              absl::string_view what) {
  if (h.region_bytes != region_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the arena was formatted for ", h.region_bytes, " bytes but the region has ",
        region_bytes,
        "; open it with its original size (size=, or the window's length=); a file that shrank "
        "was truncated: restore it from a backup, or format with --force to discard it"));
  }
  if (h.class_count == 0 || h.class_count > kMaxClasses) {
    return Corrupt(what, absl::StrCat("class_count ", h.class_count));
  }
  if (h.owner_slots == 0 || h.owner_slots > kMaxOwnerSlots) {
    return Corrupt(what, absl::StrCat("owner_slots ", h.owner_slots));
  }
  if (h.data_align_bytes < kBlockAlignBytes || (h.data_align_bytes & (h.data_align_bytes - 1))) {
    return Corrupt(what, absl::StrCat("data alignment ", h.data_align_bytes));
  }
  if (h.owner_table_offset < kHeaderReservedBytes || h.owner_table_offset % 64 != 0 ||
      !RangeOk(h.owner_table_offset, std::uint64_t{h.owner_slots} * sizeof(OwnerSlot),
               region_bytes)) {
    return Corrupt(what, "owner table outside the region");
  }
  const std::uint64_t owners_end =
      h.owner_table_offset + std::uint64_t{h.owner_slots} * sizeof(OwnerSlot);
  if (h.total_blocks == 0 || h.total_blocks > kMaxBlocks) {
    return Corrupt(what, absl::StrCat("total_blocks ", h.total_blocks));
  }
  if (h.map_offset < owners_end || h.map_offset % 64 != 0 ||
      !RangeOk(h.map_offset, std::uint64_t{h.total_blocks} * 8, region_bytes)) {
    return Corrupt(what, "allocation map outside the region or overlapping the owner table");
  }
  std::uint64_t meta_end = h.map_offset + std::uint64_t{h.total_blocks} * 8;
  std::uint64_t next_index = 0;
  std::uint64_t data_end = 0;
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const ClassRecord& k = h.classes[c];
    const std::string cls = absl::StrCat("class ", c);
    if (k.block_bytes == 0 || k.block_bytes % 64 != 0 || k.stride_bytes < k.block_bytes ||
        k.stride_bytes % kBlockAlignBytes != 0 ||
        k.stride_bytes > (4ull << 30) + kBlockAlignBytes) {
      return Corrupt(
          what, absl::StrCat(cls, ": block size ", k.block_bytes, " / stride ", k.stride_bytes));
    }
    if (k.block_count == 0 || k.first_index != next_index) {
      return Corrupt(what, absl::StrCat(cls, ": block range does not follow the previous class"));
    }
    next_index += k.block_count;
    if (next_index > h.total_blocks) return Corrupt(what, absl::StrCat(cls, ": too many blocks"));
    if (k.hint_offset < meta_end || k.hint_offset % 64 != 0 ||
        !RangeOk(k.hint_offset, HintWords(k.block_count) * 8, region_bytes)) {
      return Corrupt(what, absl::StrCat(cls, ": free hints outside the region or overlapping"));
    }
    meta_end = k.hint_offset + HintWords(k.block_count) * 8;
    const std::uint64_t bytes = std::uint64_t{k.block_count} * k.stride_bytes;
    if (k.data_offset % h.data_align_bytes != 0 || k.data_offset < std::max(meta_end, data_end) ||
        !RangeOk(k.data_offset, bytes, region_bytes)) {
      return Corrupt(what, absl::StrCat(cls, ": blocks outside the region or overlapping"));
    }
    data_end = k.data_offset + bytes;
  }
  if (next_index != h.total_blocks) return Corrupt(what, "classes do not cover total_blocks");
  if (data_end != h.data_end_offset) return Corrupt(what, "data_end_offset mismatch");
  for (std::uint32_t c = h.class_count; c < kMaxClasses; ++c) {
    const auto* p = reinterpret_cast<const unsigned char*>(&h.classes[c]);
    for (std::size_t i = 0; i < sizeof(ClassRecord); ++i) {
      if (p[i] != 0) return Corrupt(what, absl::StrCat("unused class ", c, " is not zero"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMap(const ArenaHeader& h, const std::byte* base, absl::string_view what) {
  const auto* slots = reinterpret_cast<const OwnerSlot*>(base + h.owner_table_offset);
  for (std::uint32_t s = 0; s < h.owner_slots; ++s) {
    const std::uint64_t w = slots[s].state.load(std::memory_order_acquire);
    if (SlotWordState(w) > kSlotReclaiming) {
      return Corrupt(
          what, absl::StrCat("owner slot ", s, " has state ", static_cast<int>(SlotWordState(w))));
    }
  }
  const auto* words = reinterpret_cast<const BlockWord*>(base + h.map_offset);
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const ClassRecord& k = h.classes[c];
    for (std::uint32_t i = k.first_index; i < k.first_index + k.block_count; ++i) {
      const std::uint64_t w = words[i].load(std::memory_order_relaxed);
      const char* problem = nullptr;
      if (w & kReservedMask) {
        problem = "reserved bits set";
      } else if (WordClass(w) != c) {
        problem = "class bits do not match the block's class";
      } else if (WordState(w) > kAllocated) {
        problem = "invalid state";
      } else if (WordOwner(w) > h.owner_slots) {
        problem = "owner outside the owner table";
      } else if (WordState(w) == kFree && WordOwner(w) != 0) {
        problem = "free block has an owner";
      } else if (WordState(w) == kCached && WordOwner(w) == 0) {
        problem = "cached block has no owner";
      }
      if (problem != nullptr) {
        return Corrupt(what, absl::StrCat("map word of block ", i, " (class ", c, ") = 0x",
                                          absl::Hex(w), ": ", problem));
      }
    }
  }
  return absl::OkStatus();
}

ArenaUsage ScanUsage(const ArenaHeader& h, const std::byte* base) {
  ArenaUsage u;
  u.region_bytes = h.region_bytes;
  u.metadata_bytes = h.metadata_bytes;
  const auto* slots = reinterpret_cast<const OwnerSlot*>(base + h.owner_table_offset);
  for (std::uint32_t s = 0; s < h.owner_slots; ++s) {
    if (SlotWordState(slots[s].state.load(std::memory_order_acquire)) == kSlotActive) {
      ++u.owners_active;
    }
  }
  const auto* words = reinterpret_cast<const BlockWord*>(base + h.map_offset);
  for (std::uint32_t c = 0; c < h.class_count; ++c) {
    const ClassRecord& k = h.classes[c];
    ClassUsage cu;
    cu.block_bytes = k.block_bytes;
    cu.stride_bytes = k.stride_bytes;
    cu.total = k.block_count;
    std::uint32_t run = 0;
    for (std::uint32_t i = 0; i < k.block_count; ++i) {
      const std::uint64_t w = words[k.first_index + i].load(std::memory_order_relaxed);
      switch (WordState(w)) {
        case kFree:
          ++cu.free;
          ++run;
          break;
        case kCached:
          ++cu.cached;
          run = 0;
          break;
        default:
          if (WordOwner(w) == 0) {
            ++cu.persisted;
          } else {
            ++cu.allocated;
          }
          run = 0;
      }
      cu.largest_free_run = std::max(cu.largest_free_run, run);
    }
    u.classes.push_back(cu);
  }
  return u;
}

}  // namespace cxlkv::pool
