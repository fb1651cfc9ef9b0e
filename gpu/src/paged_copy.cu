// The gather/scatter kernel: scattered KV blocks in registered host memory <-> a paged KV
// cache in device memory, in one launch (docs/gpu.md, "the gather kernel").
#include "paged_copy.h"

namespace cxlkv::gpu::internal {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kUnroll = 4;  // loads in flight per thread: PCIe/C2C latency hiding

// Grid: x = block index, y = (layer - layer_begin) * kv_parts + part. Each thread block
// moves one chunk of chunk_bytes with 16-byte loads and stores.
__global__ void __launch_bounds__(kThreads)
    PagedCopyKernel(PagedCopyArgs args, PagedCopyGeometry g) {
  const unsigned b = blockIdx.x;
  const unsigned piece = blockIdx.y;
  const unsigned layer = g.layer_begin + piece / g.kv_parts;
  const unsigned part = piece % g.kv_parts;
  const std::uint64_t host =
      args.block_addr[b] + (std::uint64_t{layer} * g.kv_parts + part) * g.chunk_bytes;
  const std::uint64_t dev = args.layer_base[layer] + std::uint64_t{part} * g.kv_stride_bytes +
                            std::uint64_t{args.page[b]} * g.page_stride_bytes;
  const uint4* src = reinterpret_cast<const uint4*>(g.to_device ? host : dev);
  uint4* dst = reinterpret_cast<uint4*>(g.to_device ? dev : host);
  const std::uint64_t n = g.chunk_bytes / sizeof(uint4);
  const std::uint64_t step = std::uint64_t{kThreads} * kUnroll;
  std::uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += step) {
    uint4 v[kUnroll];
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) v[u] = src[i + u * kThreads];
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) dst[i + u * kThreads] = v[u];
  }
  for (; i < n; i += kThreads) dst[i] = src[i];
}

}  // namespace

cudaError_t LaunchPagedCopy(const PagedCopyArgs& args, const PagedCopyGeometry& g,
                            cudaStream_t stream) {
  if (args.n_blocks == 0 || g.layer_count == 0) return cudaSuccess;
  const dim3 grid(args.n_blocks, g.layer_count * g.kv_parts);
  PagedCopyKernel<<<grid, kThreads, 0, stream>>>(args, g);
  return cudaGetLastError();
}

}  // namespace cxlkv::gpu::internal
