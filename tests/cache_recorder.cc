// The linker-wrapped cache operations behind tests/cache_recorder.h.
#include "cache_recorder.h"

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace cxlkv::testing {
namespace {

std::mutex mu;
bool recording = false;
std::vector<CacheCall>* log_calls = nullptr;

void Record(CacheOp op, const void* addr, std::size_t len) {
  std::lock_guard l(mu);
  if (recording) log_calls->push_back(CacheCall{op, addr, len});
}

}  // namespace

CacheRecorder::CacheRecorder() {
  std::lock_guard l(mu);
  log_calls = new std::vector<CacheCall>();
  recording = true;
}

CacheRecorder::~CacheRecorder() {
  std::lock_guard l(mu);
  recording = false;
  delete log_calls;
  log_calls = nullptr;
}

std::vector<CacheCall> CacheRecorder::calls() const {
  std::lock_guard l(mu);
  return *log_calls;
}

std::vector<CacheCall> CacheRecorder::Take() {
  std::lock_guard l(mu);
  std::vector<CacheCall> out;
  out.swap(*log_calls);
  return out;
}

bool CacheRecorder::Covered(CacheOp op, const void* addr, std::size_t len) const {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;
  for (const CacheCall& c : calls()) {
    if (c.op != op) continue;
    const auto b = reinterpret_cast<std::uintptr_t>(c.addr);
    spans.emplace_back(b, b + c.len);
  }
  std::sort(spans.begin(), spans.end());
  std::uintptr_t at = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t end = at + len;
  for (const auto& [b, e] : spans) {
    if (b > at) break;
    at = std::max(at, e);
    if (at >= end) return true;
  }
  return at >= end;
}

}  // namespace cxlkv::testing

// The wrappers: names as the linker's --wrap builds them from the mangled C++ names of
// cxlkv::coherence::{Flush, Invalidate, Evict, Fence, CopyNt}.
using cxlkv::testing::CacheOp;
using cxlkv::testing::Record;
extern "C" {
void __real__ZN5cxlkv9coherence5FlushEPKvm(const void*, std::size_t) noexcept;
void __real__ZN5cxlkv9coherence10InvalidateEPKvm(const void*, std::size_t) noexcept;
void __real__ZN5cxlkv9coherence5EvictEPKvm(const void*, std::size_t) noexcept;
void __real__ZN5cxlkv9coherence5FenceEv() noexcept;
void __real__ZN5cxlkv9coherence6CopyNtEPvPKvm(void*, const void*, std::size_t) noexcept;

void __wrap__ZN5cxlkv9coherence5FlushEPKvm(const void* addr, std::size_t len) noexcept {
  Record(CacheOp::kFlush, addr, len);
  __real__ZN5cxlkv9coherence5FlushEPKvm(addr, len);
}
void __wrap__ZN5cxlkv9coherence10InvalidateEPKvm(const void* addr, std::size_t len) noexcept {
  Record(CacheOp::kInvalidate, addr, len);
  __real__ZN5cxlkv9coherence10InvalidateEPKvm(addr, len);
}
void __wrap__ZN5cxlkv9coherence5EvictEPKvm(const void* addr, std::size_t len) noexcept {
  Record(CacheOp::kEvict, addr, len);
  __real__ZN5cxlkv9coherence5EvictEPKvm(addr, len);
}
void __wrap__ZN5cxlkv9coherence5FenceEv() noexcept {
  Record(CacheOp::kFence, nullptr, 0);
  __real__ZN5cxlkv9coherence5FenceEv();
}
void __wrap__ZN5cxlkv9coherence6CopyNtEPvPKvm(void* dst, const void* src,
                                              std::size_t len) noexcept {
  Record(CacheOp::kCopyNt, dst, len);
  __real__ZN5cxlkv9coherence6CopyNtEPvPKvm(dst, src, len);
}
}  // extern "C"
