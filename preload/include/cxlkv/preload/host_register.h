// cxlkv/preload/host_register.h — cudaHostRegister of a range larger than one call may pin,
// as a run of smaller calls.
//
// NVIDIA's r580+ drivers refuse a single cudaHostRegister of 512 GiB or more, and a serving
// engine that registers its whole host KV region in one call (vLLM's CPU offload region) then
// falls back to pageable copies. The shim's interposed cudaHostRegister splits such a call
// into chunks of at most `chunk_bytes` (CXLKV_REGISTER_CHUNK), each registered and checked in
// turn; the first refusal unregisters the chunks already done and is returned, so the caller
// sees one call that either pinned everything or nothing. cudaHostUnregister of the range's
// start then unregisters every chunk.
//
// The CUDA runtime's two calls come in through HostRegisterOps, so the splitting, the checks
// and the rollback run the same in the shim (the real runtime) and in unit tests (no GPU).
// Pure apart from the calls; thread-compatible; no allocation.
#ifndef CXLKV_PRELOAD_HOST_REGISTER_H_
#define CXLKV_PRELOAD_HOST_REGISTER_H_

#include <cstddef>
#include <cstdint>

namespace cxlkv::preload {

// cudaError_t values as ints (the shim never includes the CUDA headers): 0 is success.
struct HostRegisterOps {
  int (*register_fn)(void* ctx, void* addr, std::size_t bytes, unsigned flags) = nullptr;
  int (*unregister_fn)(void* ctx, void* addr) = nullptr;
  void* ctx = nullptr;
};

// Chunks of a registration of `bytes` in pieces of `chunk_bytes` (> 0): chunk k starts at
// k * chunk_bytes; the last one holds the remainder.
constexpr std::size_t RegisterChunkCount(std::size_t bytes, std::uint64_t chunk_bytes) noexcept {
  return bytes == 0 ? 0 : static_cast<std::size_t>((bytes - 1) / chunk_bytes + 1);
}

struct ChunkedRegistration {
  int error = 0;           // 0, or the first refusal (what the caller gets back)
  std::size_t chunks = 0;  // chunks planned
  std::size_t failed = 0;  // with error: the chunk refused (0-based)
  int rollback_error = 0;  // with error: the first failure unregistering the done chunks
};

// Registers [addr, addr + bytes) chunk by chunk, stopping at the first refusal; then
// unregisters the chunks done, newest first. bytes > 0 and chunk_bytes > 0.
ChunkedRegistration RegisterInChunks(void* addr, std::size_t bytes, unsigned flags,
                                     std::uint64_t chunk_bytes,
                                     const HostRegisterOps& ops) noexcept;

// Unregisters every chunk of a registration RegisterInChunks made with the same addr, bytes
// and chunk_bytes, each one even after a failure; returns the first failure, or 0.
int UnregisterChunks(void* addr, std::size_t bytes, std::uint64_t chunk_bytes,
                     const HostRegisterOps& ops) noexcept;

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_HOST_REGISTER_H_
