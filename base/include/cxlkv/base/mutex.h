// cxlkv/base/mutex.h — std::mutex and std::condition_variable with clang's thread-safety
// capability attributes, so that ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED on the data a
// lock guards are checked at compile time (-Wthread-safety, on in clang builds: cmake/
// CxlkvFlags.cmake).
//
// Why not absl::Mutex, which carries the attributes already: Debian's libabsl is built
// without ThreadSanitizer, so TSan sees neither its locks nor its waits and reports races
// that are not there (the TSan preset skips the absl::Mutex tests of coordinator_test for
// that). std::mutex is pthread's, which TSan intercepts. This wrapper adds no state and no
// code: Lock/Unlock are std::mutex's, CondVar waits on the same std::mutex.
//
//   base::Mutex mu_;
//   int n_ ABSL_GUARDED_BY(mu_);
//   void Helper() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//   { base::MutexLock l(mu_); ++n_; }         // scoped
//   while (n_ == 0) cv_.Wait(mu_);            // a loop, not a predicate lambda: clang does
//                                             // not carry the held lock into a lambda
//
// Thread-safety: as std::mutex and std::condition_variable.
#ifndef CXLKV_BASE_MUTEX_H_
#define CXLKV_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace cxlkv::base {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable over a base::Mutex (std::condition_variable underneath).
class CondVar {
 public:
  // Releases mu, waits for a notify (or a spurious wake-up), takes mu again.
  void Wait(Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu.mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();
  }
  // Wait, or until `deadline`: false when the deadline passed (mu is held again either way).
  bool WaitUntil(Mutex& mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> l(mu.mu_, std::adopt_lock);
    const bool notified = cv_.wait_until(l, deadline) == std::cv_status::no_timeout;
    l.release();
    return notified;
  }
  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cxlkv::base

#endif  // CXLKV_BASE_MUTEX_H_
