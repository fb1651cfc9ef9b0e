#include "cxlkv/preload/host_register.h"

#include <algorithm>

namespace cxlkv::preload {
namespace {

void* ChunkAddr(void* addr, std::size_t k, std::uint64_t chunk_bytes) noexcept {
  return static_cast<unsigned char*>(addr) + k * chunk_bytes;
}

}  // namespace

ChunkedRegistration RegisterInChunks(void* addr, std::size_t bytes, unsigned flags,
                                     std::uint64_t chunk_bytes,
                                     const HostRegisterOps& ops) noexcept {
  ChunkedRegistration r;
  r.chunks = RegisterChunkCount(bytes, chunk_bytes);
  for (std::size_t k = 0; k < r.chunks; ++k) {
    const std::uint64_t off = k * chunk_bytes;
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, bytes - off));
    const int err = ops.register_fn(ops.ctx, ChunkAddr(addr, k, chunk_bytes), n, flags);
    if (err == 0) continue;
    r.error = err;
    r.failed = k;
    // All or nothing: a caller told "refused" must not hold part of the range pinned.
    for (std::size_t j = k; j-- > 0;) {
      const int uerr = ops.unregister_fn(ops.ctx, ChunkAddr(addr, j, chunk_bytes));
      if (uerr != 0 && r.rollback_error == 0) r.rollback_error = uerr;
    }
    return r;
  }
  return r;
}

int UnregisterChunks(void* addr, std::size_t bytes, std::uint64_t chunk_bytes,
                     const HostRegisterOps& ops) noexcept {
  int first = 0;
  const std::size_t chunks = RegisterChunkCount(bytes, chunk_bytes);
  for (std::size_t k = 0; k < chunks; ++k) {
    const int err = ops.unregister_fn(ops.ctx, ChunkAddr(addr, k, chunk_bytes));
    if (err != 0 && first == 0) first = err;
  }
  return first;
}

}  // namespace cxlkv::preload
