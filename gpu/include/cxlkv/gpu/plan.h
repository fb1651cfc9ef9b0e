// cxlkv/gpu/plan.h — the CUDA-free half of gpu/: registration chunk planning and bookkeeping,
// the device-side paged KV cache geometry, and the planning of block copies.
//
// Everything here is plain C++ over integers (addresses are std::uint64_t), built whether or
// not the CUDA toolkit is present, and unit-tested without a GPU. The CUDA half
// (registrar.h, copy_engine.h) executes these plans; it never decides chunking, overlap or
// coalescing by itself.
//
//   PlanChunks        splits a host range into cudaHostRegister calls of at most 64 GiB,
//                     on boundaries of the source's alignment (never inside a device page).
//   RegistrationTable the registrations of one device: ranges, per-chunk state and device
//                     addresses, overlap detection, and "is [p, p+n) pinned, in which chunk".
//   PagedCache        where the bytes of page p, layer l, K/V part k live on the device:
//                     contiguous pages (Dynamo KVBM "fully contiguous") or one tensor per
//                     layer (vLLM; KVBM "layer separate"), with K and V together or apart.
//   PlanCopies        a list of (host block, device page) pairs -> the fewest copies:
//                     validated, split at pinned-chunk boundaries, contiguous runs coalesced.
//
// A host block is always ordered layer-major: layer l, part k of a block starts at
// (l * kv_parts + k) * chunk_bytes from the block's start. This is the arena block layout
// (docs/gpu.md) for both KvLayoutKinds; only the device side varies.
//
// Thread-safety: functions are pure; a RegistrationTable is not synchronized (the Registrar
// guards its table with a mutex).
#ifndef CXLKV_GPU_PLAN_H_
#define CXLKV_GPU_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/kv_layout.h"

namespace cxlkv::gpu {

// The most one cudaHostRegister call pins (docs/gpu.md: whole arenas, in chunks of at most 64 GiB).
inline constexpr std::uint64_t kMaxChunkBytes = 64ull << 30;
inline constexpr std::uint64_t kHostPageBytes = 4096;
// Copies and the gather kernel move 16-byte vectors: blocks, pages and chunks are aligned so.
inline constexpr std::uint64_t kCopyAlignBytes = 16;
inline constexpr std::uint32_t kMaxLayers = 1024;

// ---- registration planning --------------------------------------------------------------

struct ChunkPlan {
  std::uint64_t offset = 0;  // from the start of the registered range
  std::uint64_t bytes = 0;
  bool operator==(const ChunkPlan&) const = default;
};

// Splits [0, bytes) into chunks of at most max_chunk_bytes whose boundaries are multiples of
// align_bytes (the source's page or device alignment; a power of two, >= 4 KiB). All chunks
// but the last have the same size, floor(max_chunk_bytes / align_bytes) * align_bytes.
// kInvalidArgument names the bad value: bytes 0 or not a multiple of 4 KiB, align not a
// power of two or below 4 KiB, max_chunk_bytes below align_bytes.
absl::StatusOr<std::vector<ChunkPlan>> PlanChunks(std::uint64_t bytes, std::uint64_t align_bytes,
                                                  std::uint64_t max_chunk_bytes = kMaxChunkBytes);

// Ready sooner: chunks that grow from first_chunk_bytes, doubling up to max_chunk_bytes
// (each rounded down to align_bytes, at least align_bytes), so the first part of a large
// arena is pinned and usable in a fraction of the time the whole takes, while the chunk
// count stays logarithmic (100 GiB from 1 GiB: 1, 2, 4, 8, 16, 32, 37 GiB). first_chunk_bytes
// 0 or >= max_chunk_bytes: PlanChunks. Errors as PlanChunks.
absl::StatusOr<std::vector<ChunkPlan>> PlanRampChunks(
    std::uint64_t bytes, std::uint64_t align_bytes, std::uint64_t first_chunk_bytes,
    std::uint64_t max_chunk_bytes = kMaxChunkBytes);

// What backs a registered range; chooses the hint when the driver refuses it.
enum class MappingKind : std::uint8_t {
  kDevdax,     // /dev/daxX.Y: ZONE_DEVICE pages
  kKmem,       // shmem bound to a (CXL) NUMA node
  kMemfd,      // memfd (shmem)
  kFileTmpfs,  // a file on tmpfs or hugetlbfs (/dev/shm)
  kFileDisk,   // a file on a disk file system (ext4, xfs, ...)
  kHost,       // a host range of unknown backing (RegisterRange)
};
absl::string_view MappingKindName(MappingKind kind) noexcept;
// The fix to suggest when cudaHostRegister refuses a mapping of this kind.
absl::string_view RefusalHint(MappingKind kind) noexcept;

enum class RegState : std::uint8_t {
  kQueued,        // accepted, waiting for the registration thread
  kRegistering,   // some chunks pinned
  kRegistered,    // every chunk pinned; copies may use it
  kFailed,        // a chunk was refused; the chunks pinned before it were unpinned
  kUnregistered,  // unpinned (or cancelled before it finished)
};
absl::string_view RegStateName(RegState state) noexcept;

// One registration as reported: progress and cost.
struct RegistrationInfo {
  std::uint64_t id = 0;
  std::string name;  // e.g. "/dev/dax0.0" or "/dev/shm/pool0"
  MappingKind kind = MappingKind::kHost;
  std::uint64_t host_addr = 0;
  std::uint64_t bytes = 0;
  std::vector<ChunkPlan> chunks;
  std::vector<std::uint64_t> chunk_device_addr;  // cudaHostGetDevicePointer, per pinned chunk
  std::uint32_t chunks_done = 0;                 // pinned so far, in order
  std::uint64_t bytes_done = 0;
  RegState state = RegState::kQueued;
  absl::Status error;            // set in kFailed
  std::int64_t queued_ns = 0;    // CLOCK_MONOTONIC
  std::int64_t started_ns = 0;   // first chunk began
  std::int64_t finished_ns = 0;  // last chunk ended (or the failure)
  std::int64_t register_ns = 0;  // time spent inside cudaHostRegister, all chunks
  std::int64_t first_chunk_ns = 0;  // when chunk 0 became usable (CLOCK_MONOTONIC; 0: not yet)
  std::int64_t prefault_ns = 0;     // time the registration waited for its pages to be faulted
                                    // in by the prefault threads (Registrar: prefault_threads)
  // Cost of pinning, ns per GiB pinned (0 until a chunk is done).
  double NsPerGiB() const;
};

// Where a pinned host range lies: its registration and chunk.
struct PinnedSpan {
  std::uint64_t id = 0;
  std::uint32_t chunk = 0;
  std::uint64_t chunk_host_begin = 0;
  std::uint64_t chunk_host_end = 0;
  std::uint64_t chunk_device_addr = 0;
  // Device address of host address a inside this chunk.
  std::uint64_t DeviceAddr(std::uint64_t a) const {
    return chunk_device_addr + (a - chunk_host_begin);
  }
};

// The registrations of one device. Ranges of live registrations (not failed, not
// unregistered) never overlap: Add refuses an overlap, naming the registration in the way.
class RegistrationTable {
 public:
  // Plans the chunks and records a kQueued registration. kAlreadyExists: exactly this range
  // is already registered (the message names its id); kFailedPrecondition: it overlaps
  // another live registration; kInvalidArgument: a null/unaligned address or bad size.
  absl::StatusOr<std::uint64_t> Add(absl::string_view name, MappingKind kind,
                                    std::uint64_t host_addr, std::uint64_t bytes,
                                    std::uint64_t align_bytes, std::uint64_t max_chunk_bytes,
                                    std::int64_t now_ns, std::uint64_t first_chunk_bytes = 0);
  // nullptr for an unknown id.
  RegistrationInfo* Find(std::uint64_t id);
  const RegistrationInfo* Find(std::uint64_t id) const;
  // State transitions, applied by the registration thread. Chunks are pinned in order.
  void ChunkDone(std::uint64_t id, std::uint64_t device_addr, std::int64_t begin_ns,
                 std::int64_t end_ns);
  void Failed(std::uint64_t id, absl::Status error, std::int64_t now_ns);
  void Unregistered(std::uint64_t id);
  // Forgets a registration that is no longer live (failed or unregistered).
  void Erase(std::uint64_t id);

  // The pinned chunk holding [host_addr, host_addr + bytes) whole. kNotFound: no live
  // registration covers host_addr; kUnavailable: its registration is not finished (the
  // message says how far it is); kOutOfRange: the range runs past the chunk's end (split it
  // at chunk_host_end: PlanCopies does).
  absl::StatusOr<PinnedSpan> Lookup(std::uint64_t host_addr, std::uint64_t bytes) const;
  // Every registration, in id order.
  std::vector<const RegistrationInfo*> All() const;
  std::size_t size() const { return regs_.size(); }

 private:
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, RegistrationInfo> regs_;       // by id
  std::map<std::uint64_t, std::uint64_t> live_by_addr_;  // host_addr -> id, live only
};

// ---- the device-side paged KV cache -----------------------------------------------------

// Device address of (page p, layer l, part k) =
//   layer_base[l] + k * kv_stride_bytes + p * page_stride_bytes, spanning chunk_bytes.
// kv_parts is 1 when K and V of a layer are adjacent in a page, 2 when they are apart.
struct PagedCache {
  std::uint32_t layers = 0;
  std::uint32_t kv_parts = 1;
  std::uint32_t page_count = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t page_stride_bytes = 0;
  std::uint64_t kv_stride_bytes = 0;
  std::vector<std::uint64_t> layer_base;

  // Bytes of one block / page, all layers: layers * kv_parts * chunk_bytes.
  std::uint64_t BlockBytes() const { return std::uint64_t{layers} * kv_parts * chunk_bytes; }
  std::uint64_t DeviceAddr(std::uint32_t page, std::uint32_t layer, std::uint32_t part) const {
    return layer_base[layer] + part * kv_stride_bytes + std::uint64_t{page} * page_stride_bytes;
  }
  // Offset of (layer, part) inside a host block.
  std::uint64_t HostOffset(std::uint32_t layer, std::uint32_t part) const {
    return (std::uint64_t{layer} * kv_parts + part) * chunk_bytes;
  }
  // Device bytes the cache spans from its lowest to its highest address.
  std::uint64_t SpanBytes() const;

  // Checks the geometry: layers in 1..1024, kv_parts 1 or 2, page_count > 0, chunk_bytes
  // and every base and stride multiples of 16, and no two (page, layer, part) pieces
  // overlapping. kInvalidArgument names the field or the two pieces that collide.
  absl::Status Validate() const;

  // One allocation of page_count pages, each a whole block in host block order (Dynamo
  // KVBM "fully contiguous"): one copy per run of consecutive pages and blocks.
  static PagedCache Contiguous(std::uint64_t base, std::uint32_t layers, std::uint32_t kv_parts,
                               std::uint64_t chunk_bytes, std::uint32_t page_count);
  // One tensor per layer (vLLM's per-layer KV cache, KVBM "layer separate"). kv_parts 2:
  // each layer tensor is [2][page_count][chunk] (vLLM FlashAttention: K half, then V half);
  // kv_parts 1: [page_count][chunk] with K and V together in the chunk.
  static PagedCache LayerSeparate(std::vector<std::uint64_t> layer_base, std::uint32_t kv_parts,
                                  std::uint64_t chunk_bytes, std::uint32_t page_count);
  // chunk_bytes of a model layout: kv_parts 2 -> one of K or V of one layer of one block,
  // kv_parts 1 -> both. The block then matches layout.BlockBytes().
  static std::uint64_t ChunkBytesOf(const pool::KvLayout& layout, std::uint32_t kv_parts);
};

// ---- copy planning ------------------------------------------------------------------------

enum class Direction : std::uint8_t { kHostToDevice, kDeviceToHost };
absl::string_view DirectionName(Direction d) noexcept;

// One block to move: its address in this process (inside a registered arena) and its page.
struct BlockCopy {
  std::uint64_t host_addr = 0;
  std::uint32_t page = 0;
};

// One cudaMemcpyAsync.
struct CopyOp {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
  bool operator==(const CopyOp&) const = default;
};

struct PlanOptions {
  std::uint32_t layer_begin = 0;
  std::uint32_t layer_end = 0;  // 0: all layers
  // Longer coalesced copies are split (0: no limit), so one batch does not hold the copy
  // engine for long in front of the next layer's copies.
  std::uint64_t max_op_bytes = 0;
  // The end of the pinned chunk that holds host address a (a copy may not span two
  // cudaHostRegister ranges). Empty: the host side is one range.
  std::function<std::uint64_t(std::uint64_t)> host_chunk_end;
};

struct CopyPlan {
  std::vector<CopyOp> ops;
  std::uint64_t bytes = 0;
  std::size_t segments = 0;  // (block, layer, part) pieces before coalescing
};

// Validates blocks against the cache (host address non-null and 16-byte aligned, page <
// page_count, layer range inside the cache, no two blocks writing the same destination:
// a page for kHostToDevice, overlapping host blocks for kDeviceToHost) and returns the
// copies. Ops are sorted by source address; coalescing joins pieces adjacent on both sides.
// Errors are kInvalidArgument and name the list position(s) at fault.
absl::StatusOr<CopyPlan> PlanCopies(const PagedCache& cache, Direction dir,
                                    std::span<const BlockCopy> blocks, const PlanOptions& options);

// Validation alone (what PlanCopies checks before planning); the gather kernel path uses it.
absl::Status ValidateBlocks(const PagedCache& cache, Direction dir,
                            std::span<const BlockCopy> blocks, std::uint32_t layer_begin,
                            std::uint32_t layer_end);

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_PLAN_H_
