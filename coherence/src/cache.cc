// Flush / invalidate / fence / streaming copy, chosen by CPUID at first use.
#include "cxlkv/coherence/cache.h"

#include <cpuid.h>
#include <immintrin.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace cxlkv::coherence {
namespace {

std::uint64_t XGetBv() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.clflush = (d >> 19) & 1;
    f.sse42 = (c >> 20) & 1;
    const bool osxsave = (c >> 27) & 1;
    unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
    if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) {
      f.clflushopt = (b7 >> 23) & 1;
      f.clwb = (b7 >> 24) & 1;
      f.movdir64b = (c7 >> 28) & 1;
      // AVX-512 needs the OS to save opmask and ZMM state (XCR0 bits 1,2,5,6,7).
      f.avx512f = ((b7 >> 16) & 1) && osxsave && ((XGetBv() & 0xE6) == 0xE6);
    }
  }
  return f;
}

__attribute__((target("clwb"))) void FlushClwb(const char* p, const char* end) noexcept {
  for (; p < end; p += kCacheLineBytes) _mm_clwb(const_cast<char*>(p));
}
__attribute__((target("clflushopt"))) void FlushClflushopt(const char* p,
                                                           const char* end) noexcept {
  for (; p < end; p += kCacheLineBytes) _mm_clflushopt(const_cast<char*>(p));
}
void FlushClflush(const char* p, const char* end) noexcept {
  for (; p < end; p += kCacheLineBytes) _mm_clflush(p);
}

FlushKind Strongest(FlushKind want, const CpuFeatures& f) {
  if (want == FlushKind::kClwb && !f.clwb) want = FlushKind::kClflushopt;
  if (want == FlushKind::kClflushopt && !f.clflushopt) want = FlushKind::kClflush;
  return want;
}

CopyKind Strongest(CopyKind want, const CpuFeatures& f) {
  if (want == CopyKind::kMovdir64b && !f.movdir64b) want = CopyKind::kAvx512Nt;
  if (want == CopyKind::kAvx512Nt && !f.avx512f) want = CopyKind::kSse2Nt;
  return want;
}

__attribute__((target("movdir64b"))) void LinesMovdir64b(char* d, const char* s,
                                                         std::size_t lines) noexcept {
  for (std::size_t i = 0; i < lines; ++i) _movdir64b(d + i * 64, s + i * 64);
}
// Four lines per iteration, loads ahead of stores, so more source misses are in flight
// while the write-combining buffers drain. (A software prefetch of the source made no
// measurable difference on Zen 5; see bench/RESULTS.md.)
__attribute__((target("avx512f"))) void LinesAvx512(char* d, const char* s,
                                                    std::size_t lines) noexcept {
  std::size_t i = 0;
  for (; i + 4 <= lines; i += 4) {
    const char* p = s + i * 64;
    const __m512i a = _mm512_loadu_si512(p);
    const __m512i b = _mm512_loadu_si512(p + 64);
    const __m512i c = _mm512_loadu_si512(p + 128);
    const __m512i e = _mm512_loadu_si512(p + 192);
    auto* q = reinterpret_cast<__m512i*>(d + i * 64);
    _mm512_stream_si512(q, a);
    _mm512_stream_si512(q + 1, b);
    _mm512_stream_si512(q + 2, c);
    _mm512_stream_si512(q + 3, e);
  }
  for (; i < lines; ++i) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i * 64), _mm512_loadu_si512(s + i * 64));
  }
}
void LinesSse2(char* d, const char* s, std::size_t lines) noexcept {
  for (std::size_t i = 0; i < lines * 4; ++i) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 16));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i * 16), v);
  }
}

// CPUID's features less those $CXLKV_CPU_DISABLE names; an unknown name said once.
CpuFeatures DetectUsable() {
  const char* disable = std::getenv("CXLKV_CPU_DISABLE");
  if (disable == nullptr) return Detect();
  std::string unknown;
  const CpuFeatures f = MaskCpuFeatures(Detect(), disable, &unknown);
  if (!unknown.empty()) {
    std::fprintf(stderr,
                 "cxlkv: CXLKV_CPU_DISABLE: unknown feature(s) %s ignored (known: clwb, "
                 "clflushopt, movdir64b, avx512f, sse42)\n",
                 unknown.c_str());
  }
  return f;
}

// Cached decisions; computed on first use (static init is thread-safe).
struct Active {
  CpuFeatures features = DetectUsable();
  FlushKind flush = Strongest(FlushKind::kClwb, features);
  FlushKind invalidate = Strongest(FlushKind::kClflushopt, features);
  CopyKind copy = Strongest(CopyKind::kMovdir64b, features);
};
const Active& Get() noexcept {
  static const Active active;
  return active;
}

void FlushRange(FlushKind kind, const void* addr, std::size_t len) noexcept {
  if (len == 0) return;
  const auto start = reinterpret_cast<std::uintptr_t>(addr) & ~(kCacheLineBytes - 1);
  const char* p = reinterpret_cast<const char*>(start);
  const char* end = static_cast<const char*>(addr) + len;
  switch (kind) {
    case FlushKind::kClwb:
      FlushClwb(p, end);
      break;
    case FlushKind::kClflushopt:
      FlushClflushopt(p, end);
      break;
    case FlushKind::kClflush:
      FlushClflush(p, end);
      break;
  }
}

// The test observer (cache.h). `observer` is read on every primitive; `in_flight` counts the
// callers between seeing it set and returning from its callback. Both are seq_cst so that
// uninstalling (store nullptr, then wait for in_flight == 0) and notifying (count, then load
// again) cannot miss each other: whichever comes second in the total order sees the first.
std::atomic<CacheObserver*> observer{nullptr};
std::atomic<int> in_flight{0};

inline void Notify(CacheOp op, const void* addr, std::size_t len) noexcept {
  if (observer.load(std::memory_order_relaxed) == nullptr) [[likely]] {
    return;
  }
  in_flight.fetch_add(1);
  if (CacheObserver* o = observer.load(); o != nullptr) o->OnCacheOp(op, addr, len);
  in_flight.fetch_sub(1);
}

}  // namespace

ScopedCacheObserver::ScopedCacheObserver(CacheObserver& o) noexcept {
  CacheObserver* none = nullptr;
  if (!observer.compare_exchange_strong(none, &o)) {
    std::fprintf(stderr, "cxlkv: a second ScopedCacheObserver while one is installed\n");
    std::abort();
  }
}

ScopedCacheObserver::~ScopedCacheObserver() {
  observer.store(nullptr);
  while (in_flight.load() != 0) std::this_thread::yield();
}

CpuFeatures MaskCpuFeatures(CpuFeatures f, absl::string_view disable, std::string* unknown) {
  for (absl::string_view name : absl::StrSplit(disable, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    if (name == "clwb") {
      f.clwb = false;
    } else if (name == "clflushopt") {
      f.clflushopt = false;
    } else if (name == "movdir64b") {
      f.movdir64b = false;
    } else if (name == "avx512f") {
      f.avx512f = false;
    } else if (name == "sse42") {
      f.sse42 = false;
    } else if (unknown != nullptr) {
      absl::StrAppend(unknown, unknown->empty() ? "" : ", ", "'", name, "'");
    }
  }
  return f;
}

const CpuFeatures& DetectedCpuFeatures() noexcept { return Get().features; }
FlushKind ActiveFlushKind() noexcept { return Get().flush; }
FlushKind ActiveInvalidateKind() noexcept { return Get().invalidate; }
CopyKind ActiveCopyKind() noexcept { return Get().copy; }

absl::string_view FlushKindName(FlushKind kind) noexcept {
  switch (kind) {
    case FlushKind::kClwb:
      return "clwb";
    case FlushKind::kClflushopt:
      return "clflushopt";
    case FlushKind::kClflush:
      return "clflush";
  }
  return "?";
}

absl::string_view CopyKindName(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::kMovdir64b:
      return "movdir64b";
    case CopyKind::kAvx512Nt:
      return "avx512-nt";
    case CopyKind::kSse2Nt:
      return "sse2-nt";
  }
  return "?";
}

void Flush(const void* addr, std::size_t len) noexcept {
  Notify(CacheOp::kFlush, addr, len);
  FlushRange(Get().flush, addr, len);
}

void FlushWith(FlushKind kind, const void* addr, std::size_t len) noexcept {
  Notify(CacheOp::kFlush, addr, len);
  FlushRange(Strongest(kind, Get().features), addr, len);
}

void Invalidate(const void* addr, std::size_t len) noexcept {
  Notify(CacheOp::kInvalidate, addr, len);
  FlushRange(Get().invalidate, addr, len);
  // clflushopt is ordered only by fences; mfence also keeps later loads behind the evictions.
  _mm_mfence();
}

void Evict(const void* addr, std::size_t len) noexcept {
  Notify(CacheOp::kEvict, addr, len);
  FlushRange(Get().invalidate, addr, len);
}

void Fence() noexcept {
  Notify(CacheOp::kFence, nullptr, 0);
  _mm_sfence();
}

void CopyNtWith(CopyKind kind, void* dst, const void* src, std::size_t len) noexcept {
  kind = Strongest(kind, Get().features);
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Head up to the first line boundary and the tail after the last full line are written
  // with ordinary stores and flushed, so every byte is in memory at the final fence.
  const std::size_t mis = reinterpret_cast<std::uintptr_t>(d) & (kCacheLineBytes - 1);
  if (mis != 0) {
    const std::size_t head = std::min(len, kCacheLineBytes - mis);
    std::memcpy(d, s, head);
    Flush(d, head);
    d += head;
    s += head;
    len -= head;
  }
  const std::size_t lines = len / kCacheLineBytes;
  switch (kind) {
    case CopyKind::kMovdir64b:
      LinesMovdir64b(d, s, lines);
      break;
    case CopyKind::kAvx512Nt:
      LinesAvx512(d, s, lines);
      break;
    case CopyKind::kSse2Nt:
      LinesSse2(d, s, lines);
      break;
  }
  const std::size_t done = lines * kCacheLineBytes;
  if (len > done) {
    std::memcpy(d + done, s + done, len - done);
    Flush(d + done, len - done);
  }
  _mm_sfence();
}

void CopyNt(void* dst, const void* src, std::size_t len) noexcept {
  CopyNtWith(Get().copy, dst, src, len);
}

}  // namespace cxlkv::coherence
