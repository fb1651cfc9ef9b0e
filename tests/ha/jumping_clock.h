// A clock for an orchestrator run in the test's process, moved forward by the test.
#ifndef CXLKV_TESTS_HA_JUMPING_CLOCK_H_
#define CXLKV_TESTS_HA_JUMPING_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "cxlkv/coherence/mem.h"
#include "ha/namespaces.h"

namespace cxlkv::testing {

// CLOCK_BOOTTIME plus an offset the test moves forward: from the inside, a process stopped for
// a while sees exactly this (its clock jumped; etcd's lease may have lived on or not).
class JumpingClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return base_.NowMs() + offset_.load(); }
  void Jump(std::int64_t ms) { offset_ += ms; }

 private:
  co::SteadyClock base_;
  std::atomic<std::int64_t> offset_{0};
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_JUMPING_CLOCK_H_
