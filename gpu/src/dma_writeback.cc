#include "cxlkv/gpu/dma_writeback.h"

#include <algorithm>

#include "cxlkv/coherence/cache.h"

namespace cxlkv::gpu {

absl::string_view DmaWritebackName(DmaWriteback mode) noexcept {
  switch (mode) {
    case DmaWriteback::kWriteBack:
      return "write-back";
    case DmaWriteback::kPlatformWritesMemory:
      return "platform-writes-memory";
  }
  return "unknown";
}

std::vector<HostRange> HostRangesWritten(const PagedCache& cache, std::span<const BlockCopy> blocks,
                                         std::uint32_t layer_begin, std::uint32_t layer_end) {
  const std::uint64_t lo = cache.HostOffset(layer_begin, 0);
  const std::uint64_t len = cache.HostOffset(layer_end, 0) - lo;
  std::vector<HostRange> out;
  if (len == 0) return out;
  out.reserve(blocks.size());
  for (const BlockCopy& b : blocks) out.push_back({b.host_addr + lo, len});
  std::sort(out.begin(), out.end(),
            [](const HostRange& a, const HostRange& b) { return a.addr < b.addr; });
  std::size_t w = 0;
  for (std::size_t i = 1; i < out.size(); ++i) {
    HostRange& last = out[w];
    if (out[i].addr <= last.addr + last.bytes) {
      last.bytes = std::max(last.addr + last.bytes, out[i].addr + out[i].bytes) - last.addr;
    } else {
      out[++w] = out[i];
    }
  }
  out.resize(w + 1);
  return out;
}

std::uint64_t WriteBackHostRanges(std::span<const HostRange> ranges) noexcept {
  std::uint64_t bytes = 0;
  for (const HostRange& r : ranges) {
    coherence::Flush(reinterpret_cast<const void*>(r.addr), r.bytes);
    bytes += r.bytes;
  }
  // Flush only starts the write-back; the fence makes it complete before the caller's next
  // store (the publish).
  coherence::Fence();
  return bytes;
}

}  // namespace cxlkv::gpu
