// The gather/scatter kernel's launch interface: plain structs, shared by paged_copy.cu (nvcc)
// and copy_engine.cc (the host compiler). No absl or pool types, so nvcc compiles only this.
#ifndef CXLKV_GPU_SRC_PAGED_COPY_H_
#define CXLKV_GPU_SRC_PAGED_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cxlkv::gpu::internal {

// Mirrors PagedCache plus the layer range and direction of one launch.
struct PagedCopyGeometry {
  std::uint64_t chunk_bytes;  // multiple of 16
  std::uint64_t page_stride_bytes;
  std::uint64_t kv_stride_bytes;
  std::uint32_t kv_parts;
  std::uint32_t layer_begin;
  std::uint32_t layer_count;
  std::uint32_t to_device;  // 1: host blocks -> pages, 0: pages -> host blocks
};

// Device-resident arrays of one launch (n_blocks entries, layer_base has the cache's layers).
struct PagedCopyArgs {
  const std::uint64_t* block_addr;  // device-visible address of each host block (zero-copy)
  const std::uint32_t* page;        // page of each block
  const std::uint64_t* layer_base;  // device address of page 0 of each layer
  std::uint32_t n_blocks;
};

// One launch moves every (block, layer, part) piece: one thread block per piece, 16-byte
// vector loads, four in flight per thread. Returns the launch error (cudaGetLastError).
cudaError_t LaunchPagedCopy(const PagedCopyArgs& args, const PagedCopyGeometry& g,
                            cudaStream_t stream);

}  // namespace cxlkv::gpu::internal

#endif  // CXLKV_GPU_SRC_PAGED_COPY_H_
