// cxlkv/gpu/dma_writeback.h — making bytes a GPU wrote by DMA into arena blocks reach memory
// before anyone publishes them to another host (docs/gpu.md, docs/coherence.md).
//
// A device-to-host copy is neither of the two ways the publish rule accepts (streaming
// stores, or stores + Flush): on platforms whose PCIe writes allocate in the last-level cache
// (Intel's "Allocating Write Flows", on by default on Granite Rapids; DDIO on earlier Xeons)
// the copied lines can sit dirty in the writing host's cache, and another host reading the
// CXL memory sees the old bytes. So after every D2H copy completes, the copy engine writes
// back the host lines it wrote (coherence::Flush, then one Fence) before it reports the copy
// done (CopyEngine::Poll / Wait / Drain; the C API's cxlkv_gpu_poll / cxlkv_gpu_wait). clwb
// and clflushopt write back a dirty line whoever dirtied it, the CPU or a DMA, and cost
// little on a line that is not dirty.
//
// A caller whose platform is configured to write DMA to memory, not into the cache, may say
// so (DmaWriteback::kPlatformWritesMemory) and skip the write-back: the BIOS setting named in
// docs/gpu.md must then be off on every host of the domain.
//
// CUDA-free: built and tested without a GPU (tests/gpu_plan_test.cc, with the cache-call
// recorder).
#ifndef CXLKV_GPU_DMA_WRITEBACK_H_
#define CXLKV_GPU_DMA_WRITEBACK_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/strings/string_view.h"
#include "cxlkv/gpu/plan.h"

namespace cxlkv::gpu {

enum class DmaWriteback : std::uint8_t {
  // After a D2H copy completes, write back every host line it wrote (the default).
  kWriteBack,
  // The caller states that DMA writes go to memory, not into the LLC, on this platform
  // (Intel: "Allocating Write Flows" / DDIO disabled for the GPU's root port in the BIOS).
  kPlatformWritesMemory,
};
absl::string_view DmaWritebackName(DmaWriteback mode) noexcept;

struct HostRange {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  bool operator==(const HostRange&) const = default;
};

// The host bytes a device-to-host copy of `blocks`, layers [layer_begin, layer_end), writes:
// sorted by address, adjacent and overlapping ranges merged. Host blocks are layer-major
// (plan.h), so a layer range of one block is one contiguous range. Assumes the list passed
// ValidateBlocks.
std::vector<HostRange> HostRangesWritten(const PagedCache& cache, std::span<const BlockCopy> blocks,
                                         std::uint32_t layer_begin, std::uint32_t layer_end);

// Writes back every line of every range (coherence::Flush), then one coherence::Fence: on
// return the bytes are in memory as far as this host's caches go. Returns the bytes covered.
std::uint64_t WriteBackHostRanges(std::span<const HostRange> ranges) noexcept;

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_DMA_WRITEBACK_H_
