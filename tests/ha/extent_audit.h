// The HA tests' audit of capacity leases: samples every millisecond which hosts hold each
// extent valid (HostClient::ExtentValid, on each host's own clock) — "no extent is valid on
// two hosts at any instant". The hosts it watches must outlive it.
#ifndef CXLKV_TESTS_HA_EXTENT_AUDIT_H_
#define CXLKV_TESTS_HA_EXTENT_AUDIT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/client.h"
#include "eventually.h"

namespace cxlkv::testing {

class ExtentAudit {
 public:
  ExtentAudit() : thread_([this] { Run(); }) {}
  ~ExtentAudit() {
    stop_ = true;
    thread_.join();
  }
  ExtentAudit(const ExtentAudit&) = delete;
  ExtentAudit& operator=(const ExtentAudit&) = delete;
  void Watch(orchestrator::HostClient* h) {
    absl::MutexLock l(&mu_);
    hosts_.push_back(h);
  }
  // "" when no sample found an extent valid on two hosts; else the first such sample.
  std::string FirstDoubleHolding() {
    absl::MutexLock l(&mu_);
    return first_double_;
  }
  std::uint64_t samples() {
    absl::MutexLock l(&mu_);
    return samples_;
  }

 private:
  void Run() {
    while (!stop_.load()) {
      {
        absl::MutexLock l(&mu_);
        std::map<std::uint32_t, std::uint32_t> holder;
        for (orchestrator::HostClient* h : hosts_) {
          for (const orchestrator::GrantedExtent& e : h->extents()) {
            if (!h->ExtentValid(e.index)) continue;
            auto [it, fresh] = holder.emplace(e.index, h->host_id());
            if (!fresh && it->second != h->host_id() && first_double_.empty()) {
              first_double_ =
                  absl::StrCat("at ", NowMs(), " ms extent ", e.index, " was valid on host ",
                               it->second, " and on host ", h->host_id());
            }
          }
        }
        ++samples_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<orchestrator::HostClient*> hosts_ ABSL_GUARDED_BY(mu_);
  std::string first_double_ ABSL_GUARDED_BY(mu_);
  std::uint64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_EXTENT_AUDIT_H_
