#include "cxlkv/coherence/mem.h"

#include <immintrin.h>
#include <time.h>

#include <cstring>

#include "cxlkv/coherence/cache.h"

namespace cxlkv::coherence {

void DirectMem::Read(std::uint64_t offset, void* dst, std::size_t len) {
  std::memcpy(dst, base_ + offset, len);
}
void DirectMem::Write(std::uint64_t offset, const void* src, std::size_t len) {
  std::memcpy(base_ + offset, src, len);
}
void DirectMem::WriteNt(std::uint64_t offset, const void* src, std::size_t len) {
  std::byte* dst = base_ + offset;
  if (len == kCacheLineBytes &&
      (reinterpret_cast<std::uintptr_t>(dst) & (kCacheLineBytes - 1)) == 0) [[likely]] {
    // One line record (a lease row): four streaming stores that the write-combining buffer
    // sends as one full-line write; no fence here (the caller's Fence/FullFence completes it,
    // as Mem::WriteNt says), so a batch of rows drains under one fence.
    const auto* s = static_cast<const __m128i*>(src);
    auto* d = reinterpret_cast<__m128i*>(dst);
    for (int i = 0; i < 4; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
    return;
  }
  CopyNt(dst, src, len);
}
void DirectMem::Flush(std::uint64_t offset, std::size_t len) {
  coherence::Flush(base_ + offset, len);
}
void DirectMem::Invalidate(std::uint64_t offset, std::size_t len) {
  coherence::Invalidate(base_ + offset, len);
}
void DirectMem::Evict(std::uint64_t offset, std::size_t len) {
  coherence::Evict(base_ + offset, len);
}
void DirectMem::Fence() { coherence::Fence(); }
void DirectMem::Preload(std::span<const std::uint64_t> line_offsets) {
  // One 8-byte load a line, folded into a value the compiler must keep: nothing waits on
  // them but the register, so the core issues them as fast as it decodes them.
  std::uint64_t folded = 0;
  for (const std::uint64_t off : line_offsets) {
    std::uint64_t v;
    std::memcpy(&v, base_ + off, sizeof(v));
    folded ^= v;
  }
  asm volatile("" : : "r"(folded));
}
void DirectMem::FullFence() { _mm_mfence(); }

std::int64_t SteadyClock::NowMs() {
  struct timespec ts {};
  // BOOTTIME keeps counting while the machine is suspended, so deadlines pass during a
  // suspend as they do on the owner's clock; MONOTONIC stops. (A stopped VM's clocks all
  // stop: PrefixHost detects that against the owner's clock.)
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace cxlkv::coherence
