#include "cxlkv/gpu/prefault.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (uapi/asm-generic/mman-common.h)
#endif

namespace cxlkv::gpu {

Prefaulter::Prefaulter(std::uint64_t addr, std::uint64_t bytes, unsigned threads)
    : addr_(addr), bytes_(bytes), pieces_((bytes + kPieceBytes - 1) / kPieceBytes) {
  done_.assign(pieces_, false);
  if (threads == 0) {
    ended_ = true;
    reason_ = "no prefault threads";
    return;
  }
  const unsigned n = static_cast<unsigned>(std::min<std::uint64_t>(threads, pieces_));
  for (unsigned i = 0; i < n; ++i) workers_.emplace_back([this] { Work(); });
}

Prefaulter::~Prefaulter() {
  stop_.store(true, std::memory_order_relaxed);
  for (std::thread& t : workers_) t.join();
}

void Prefaulter::Work() {
  for (;;) {
    if (stop_.load(std::memory_order_relaxed)) return;
    const std::uint64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces_) return;
    const std::uint64_t off = i * kPieceBytes;
    const std::uint64_t len = std::min(kPieceBytes, bytes_ - off);
    const int rc = ::madvise(reinterpret_cast<void*>(addr_ + off), len, MADV_POPULATE_WRITE);
    const int err = rc == 0 ? 0 : errno;
    base::MutexLock lock(mu_);
    if (err != 0) {
      if (!ended_) {
        ended_ = true;
        reason_ =
            absl::StrCat("madvise(MADV_POPULATE_WRITE) at offset ", off, ": ", base::ErrnoText(err),
                         err == EINVAL ? " (kernel < 5.14, or a mapping it cannot populate)" : "");
      }
      stop_.store(true, std::memory_order_relaxed);
    } else {
      populated_.fetch_add(len, std::memory_order_relaxed);
      done_[i] = true;
      while (watermark_ < pieces_ && done_[watermark_]) ++watermark_;
    }
    cv_.NotifyAll();
  }
}

std::int64_t Prefaulter::WaitUntil(std::uint64_t offset) {
  const std::uint64_t need = std::min(pieces_, (offset + kPieceBytes - 1) / kPieceBytes);
  const auto t0 = std::chrono::steady_clock::now();
  base::MutexLock lock(mu_);
  while (!ended_ && watermark_ < need) cv_.Wait(mu_);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

std::string Prefaulter::stopped_reason() const {
  base::MutexLock lock(mu_);
  return reason_;
}

}  // namespace cxlkv::gpu
