// The HA tests' audit of the domain's fence line: which epoch wrote the domain when.
#ifndef CXLKV_TESTS_HA_FENCE_AUDIT_H_
#define CXLKV_TESTS_HA_FENCE_AUDIT_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/coherence/domain_layout.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/namespaces.h"

namespace cxlkv::testing {

// Samples the domain's fence line from the shared file every millisecond: the audit of which
// epoch wrote the domain when.
class FenceAudit {
 public:
  explicit FenceAudit(const std::string& domain_file) {
    fd_ = ::open(domain_file.c_str(), O_RDONLY);
    EXPECT_GE(fd_, 0) << domain_file;
    base_ = static_cast<const std::byte*>(::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd_, 0));
    EXPECT_NE(base_, MAP_FAILED);
    thread_ = std::thread([this] { Run(); });
  }
  ~FenceAudit() {
    stop_ = true;
    thread_.join();
    ::munmap(const_cast<std::byte*>(base_), 4096);
    ::close(fd_);
  }

  struct Sample {
    std::int64_t at_ms;
    std::uint64_t epoch, batches;
    std::uint64_t released;  // the release line's epoch (0: none)
    std::int64_t took_over_ms = 0;
  };
  // Every change seen (epoch or batch count), in time order.
  std::vector<Sample> samples() {
    absl::MutexLock l(&mu_);
    return samples_;
  }
  // The first epoch that wrote after a newer one had written: 0 when none did.
  std::uint64_t Regression() {
    std::uint64_t newest = 0;
    for (const Sample& s : samples()) {
      if (s.epoch < newest) return s.epoch;
      newest = std::max(newest, s.epoch);
    }
    return 0;
  }
  // An epoch that named two terms (two takeovers): 0 when none did.
  std::uint64_t EpochOfTwoTerms() {
    std::map<std::uint64_t, std::int64_t> took_over;
    for (const Sample& s : samples()) {
      auto [it, fresh] = took_over.emplace(s.epoch, s.took_over_ms);
      if (!fresh && it->second != s.took_over_ms) return s.epoch;
    }
    return 0;
  }
  std::uint64_t LastEpoch() {
    absl::MutexLock l(&mu_);
    return samples_.empty() ? 0 : samples_.back().epoch;
  }
  // Batches written by `epoch` after time t (ms).
  std::uint64_t BatchesAfter(std::uint64_t epoch, std::int64_t t) {
    std::uint64_t first = 0, last = 0;
    bool any = false;
    for (const Sample& s : samples()) {
      if (s.epoch != epoch || s.at_ms < t) continue;
      if (!any) first = s.batches;
      last = s.batches;
      any = true;
    }
    return any ? last - first + 1 : 0;
  }
  // When the fence line first named `epoch`, and when the release line first named it (-1:
  // never).
  std::int64_t FirstWrittenMs(std::uint64_t epoch) {
    for (const Sample& s : samples()) {
      if (s.epoch == epoch) return s.at_ms;
    }
    return -1;
  }
  std::int64_t FirstReleasedMs(std::uint64_t epoch) {
    for (const Sample& s : samples()) {
      if (s.released == epoch) return s.at_ms;
    }
    return -1;
  }

 private:
  void Run() {
    co::OwnerFenceLine prev{};
    std::uint64_t prev_released = 0;
    while (!stop_.load()) {
      co::OwnerFenceLine l;
      std::memcpy(&l, base_ + co::kOwnerFenceOffset, sizeof(l));
      co::OwnerReleaseLine r;
      std::memcpy(&r, base_ + co::kOwnerReleaseOffset, sizeof(r));
      const std::uint64_t released = co::LineValid(r) ? r.epoch : prev_released;
      if (co::LineValid(l) &&
          (l.epoch != prev.epoch || l.batches != prev.batches || released != prev_released)) {
        absl::MutexLock lock(&mu_);
        samples_.push_back(Sample{NowMs(), l.epoch, l.batches, released, l.took_over_ms});
        prev = l;
        prev_released = released;
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

  int fd_ = -1;
  const std::byte* base_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_FENCE_AUDIT_H_
