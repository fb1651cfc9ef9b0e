// cxlkv/gpu/prefault.h — faulting in the pages of a range on several threads ahead of
// cudaHostRegister, which otherwise faults (allocates and zeroes) every page of a memfd,
// tmpfs or kmem arena itself, on one thread: measured on an H200 host, 410-650 ms per GiB
// for such pages against 40-55 ms per GiB once they are resident (bench/RESULTS.md, GPU).
//
// A Prefaulter starts `threads` workers that populate the range in address order, piece by
// piece, with madvise(MADV_POPULATE_WRITE) (Linux >= 5.14), which allocates the pages
// without changing a byte of them: safe on an arena that holds data. The registration
// thread calls WaitUntil(end of chunk k) before pinning chunk k, so pinning chunk k overlaps
// faulting in the chunks after it. A kernel without MADV_POPULATE_WRITE, or a piece the kernel
// refuses (no memory, a hole in a sparse file), ends prefaulting: the pin faults in what is
// left itself and reports what goes wrong there, as it would without a Prefaulter.
//
// CUDA-free (cxlkv_gpu_plan); tests/gpu_plan_test.cc checks residency with mincore.
// Thread-safety: WaitUntil from one thread at a time; the destructor stops the workers
// (each finishes its piece) and joins them.
#ifndef CXLKV_GPU_PREFAULT_H_
#define CXLKV_GPU_PREFAULT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/base/mutex.h"

namespace cxlkv::gpu {

class Prefaulter {
 public:
  static constexpr std::uint64_t kPieceBytes = 64ull << 20;
  // Starts prefaulting [addr, addr + bytes) (page aligned) on `threads` workers (0: none;
  // WaitUntil then returns at once).
  Prefaulter(std::uint64_t addr, std::uint64_t bytes, unsigned threads);
  ~Prefaulter();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Blocks until every page of [addr, addr + offset) was populated, or prefaulting ended
  // early (see stopped_reason). Returns the nanoseconds it waited.
  std::int64_t WaitUntil(std::uint64_t offset);
  // Empty while prefaulting runs or after it covered the range; else why it ended early
  // (e.g. "madvise(MADV_POPULATE_WRITE): Invalid argument (kernel < 5.14)").
  std::string stopped_reason() const;
  // Bytes populated by the workers so far.
  std::uint64_t bytes_populated() const noexcept {
    return populated_.load(std::memory_order_relaxed);
  }

 private:
  void Work();

  const std::uint64_t addr_, bytes_, pieces_;
  std::atomic<std::uint64_t> next_{0};
  std::atomic<std::uint64_t> populated_{0};
  std::atomic<bool> stop_{false};
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);       // per piece
  std::uint64_t watermark_ ABSL_GUARDED_BY(mu_) = 0;  // pieces [0, watermark_) done
  bool ended_ ABSL_GUARDED_BY(mu_) = false;           // prefaulting stopped early
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_PREFAULT_H_
