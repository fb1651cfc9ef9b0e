// A serving-engine stand-in: allocates its host KV cache buffers the way engines do
// (cudaHostAlloc, Portable|Mapped, and cudaMallocHost), writes and checks them, and on a
// machine with a GPU copies them to the device and back and checks that they are pinned.
// It links the real CUDA runtime (shared, as PyTorch does) and knows nothing of cxlkv: run
// it plain and under LD_PRELOAD=libcxlkv_preload.so.
//
// Output lines the tests read: "devices: N (...)", "cudaHostAlloc failed: ...",
// "device copy ok", "pinned: yes|no", "kv buffers ok". Exit 0 only if every buffer checked out.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t kBlockBytes = 5u << 20;  // Llama-3-70B fp16, 16 tokens per block
constexpr int kBlocks = 8;

unsigned char Pat(int block, std::size_t i) {
  return static_cast<unsigned char>(block * 37 + i * 13 + (i >> 12));
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t dev_err = cudaGetDeviceCount(&devices);
  if (dev_err != cudaSuccess) devices = 0;
  std::printf("devices: %d (%s)\n", devices, cudaGetErrorString(dev_err));

  std::vector<unsigned char*> kv;
  for (int b = 0; b < kBlocks; ++b) {
    void* p = nullptr;
    const cudaError_t err =
        cudaHostAlloc(&p, kBlockBytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
      std::printf("cudaHostAlloc failed: %s (error %d)\n", cudaGetErrorString(err),
                  static_cast<int>(err));
      return 2;
    }
    kv.push_back(static_cast<unsigned char*>(p));
  }
  void* staging = nullptr;
  if (cudaError_t err = cudaMallocHost(&staging, 1u << 20); err != cudaSuccess) {
    std::printf("cudaMallocHost failed: %s (error %d)\n", cudaGetErrorString(err),
                static_cast<int>(err));
    return 2;
  }
  std::memset(staging, 0x42, 1u << 20);

  for (int b = 0; b < kBlocks; ++b) {
    for (std::size_t i = 0; i < kBlockBytes; ++i) kv[b][i] = Pat(b, i);
  }
  for (int b = 0; b < kBlocks; ++b) {
    for (std::size_t i = 0; i < kBlockBytes; ++i) {
      if (kv[b][i] != Pat(b, i)) {
        std::printf("block %d byte %zu corrupted\n", b, i);
        return 3;
      }
    }
  }

  if (devices > 0) {
    cudaPointerAttributes attr{};
    const bool pinned =
        cudaPointerGetAttributes(&attr, kv[0]) == cudaSuccess && attr.type == cudaMemoryTypeHost;
    std::printf("pinned: %s\n", pinned ? "yes" : "no");
    void* dev = nullptr;
    void* mapped = nullptr;
    if (cudaMalloc(&dev, kBlockBytes) != cudaSuccess ||
        cudaMemcpy(dev, kv[3], kBlockBytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(kv[4], dev, kBlockBytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaHostGetDevicePointer(&mapped, kv[5], 0) != cudaSuccess) {
      std::printf("device copy failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 4;
    }
    for (std::size_t i = 0; i < kBlockBytes; ++i) {
      if (kv[4][i] != Pat(3, i)) {
        std::printf("device round trip corrupted byte %zu\n", i);
        return 4;
      }
    }
    cudaFree(dev);
    std::printf("device copy ok\n");
    if (!pinned) return 5;
  } else {
    void* mapped = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&mapped, kv[0], 0);
    std::printf("cudaHostGetDevicePointer without a device: %s\n", cudaGetErrorString(err));
  }

  for (unsigned char* p : kv) {
    if (cudaFreeHost(p) != cudaSuccess) {
      std::printf("cudaFreeHost failed\n");
      return 6;
    }
  }
  if (cudaFreeHost(staging) != cudaSuccess) return 6;
  std::printf("kv buffers ok\n");
  return 0;
}
