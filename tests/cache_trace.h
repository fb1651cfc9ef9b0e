// CacheTrace: the process's cache maintenance (coherence::CacheObserver) and the test's own
// marks ("the RPC went out", "revoked") in one order, for structural tests of write-back and
// invalidation. On one machine caches are coherent, so a missing clwb or clflushopt has no
// visible effect here; what a test can check is that the code issued it over the right
// range, and in the right order with the step it must precede.
//
// Install it with coherence::ScopedCacheObserver for the test's duration. Small operations
// (the prefix protocol's per-line flushes) are dropped unless they are at least min_len
// bytes; fences are always kept. A probe, when set, runs on the issuing thread just before
// a large operation's instruction and before the first fence that follows it on that thread
// (the memory is still mapped then); its answer is stored with the event.
#ifndef CXLKV_TESTS_CACHE_TRACE_H_
#define CXLKV_TESTS_CACHE_TRACE_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/coherence/cache.h"

namespace cxlkv::testing {

class CacheTrace final : public coherence::CacheObserver {
 public:
  using Probe =
      std::function<std::string(coherence::CacheOp op, const void* addr, std::size_t len)>;

  struct Event {
    bool is_mark = false;
    coherence::CacheOp op = coherence::CacheOp::kFence;
    std::uintptr_t addr = 0;
    std::size_t len = 0;
    std::thread::id thread;
    std::string note;  // the probe's answer, or the mark's text
    bool Covers(std::uintptr_t lo, std::size_t n) const {
      return !is_mark && op != coherence::CacheOp::kFence && addr <= lo && lo + n <= addr + len;
    }
  };

  explicit CacheTrace(std::size_t min_len = 4096) : min_len_(min_len) {}

  void SetProbe(Probe probe) {
    std::lock_guard l(mu_);
    probe_ = std::move(probe);
  }

  // A step of the test's own (an RPC, a callback) in the same order as the cache operations.
  void Mark(const std::string& what) {
    Event e;
    e.is_mark = true;
    e.thread = std::this_thread::get_id();
    e.note = what;
    std::lock_guard l(mu_);
    events_.push_back(std::move(e));
  }

  void OnCacheOp(coherence::CacheOp op, const void* addr, std::size_t len) noexcept override {
    const bool large = op != coherence::CacheOp::kFence && len >= min_len_;
    if (op != coherence::CacheOp::kFence && !large) return;
    Event e;
    e.op = op;
    e.addr = reinterpret_cast<std::uintptr_t>(addr);
    e.len = len;
    e.thread = std::this_thread::get_id();
    Probe probe;
    {
      std::lock_guard l(mu_);
      bool run = large;
      if (!large) {  // a fence: probe the first one after a large operation on this thread
        for (std::size_t i = 0; i < pending_.size(); ++i) {
          if (pending_[i] == e.thread) {
            pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
            run = true;
            break;
          }
        }
      } else {
        pending_.push_back(e.thread);
      }
      if (run) probe = probe_;
    }
    // Outside the lock: a probe may take long (an RPC to the orchestrator).
    if (probe) e.note = probe(op, addr, len);
    std::lock_guard l(mu_);
    events_.push_back(std::move(e));
  }

  std::vector<Event> events() const {
    std::lock_guard l(mu_);
    return events_;
  }

  // Index of the first event at or after `from` that is a write-back (Flush) covering
  // [lo, lo + n), or -1.
  static int FindFlush(const std::vector<Event>& ev, std::uintptr_t lo, std::size_t n,
                       std::size_t from = 0) {
    for (std::size_t i = from; i < ev.size(); ++i) {
      if (ev[i].op == coherence::CacheOp::kFlush && ev[i].Covers(lo, n)) return static_cast<int>(i);
    }
    return -1;
  }
  // Index of the first fence after event `after` issued by the same thread, or -1.
  static int FenceAfter(const std::vector<Event>& ev, int after) {
    if (after < 0) return -1;
    for (std::size_t i = static_cast<std::size_t>(after) + 1; i < ev.size(); ++i) {
      if (!ev[i].is_mark && ev[i].op == coherence::CacheOp::kFence &&
          ev[i].thread == ev[static_cast<std::size_t>(after)].thread) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  // Index of the first mark with this text, or -1.
  static int FindMark(const std::vector<Event>& ev, const std::string& what) {
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].is_mark && ev[i].note == what) return static_cast<int>(i);
    }
    return -1;
  }
  // The log, for failure messages.
  static std::string Dump(const std::vector<Event>& ev) {
    static const char* const kOps[] = {"flush", "invalidate", "evict", "fence"};
    std::ostringstream os;
    os << ev.size() << " events:\n";
    for (std::size_t i = 0; i < ev.size(); ++i) {
      os << "  " << i << ": ";
      if (ev[i].is_mark) {
        os << "mark '" << ev[i].note << "'\n";
        continue;
      }
      os << kOps[static_cast<int>(ev[i].op)];
      if (ev[i].op != coherence::CacheOp::kFence) {
        os << " [0x" << std::hex << ev[i].addr << ", +0x" << ev[i].len << std::dec << ")";
      }
      if (!ev[i].note.empty()) os << " note '" << ev[i].note << "'";
      os << "\n";
    }
    return os.str();
  }

 private:
  const std::size_t min_len_;
  mutable std::mutex mu_;
  Probe probe_;
  std::vector<std::thread::id> pending_;  // threads whose next fence is probed
  std::vector<Event> events_;
};

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_CACHE_TRACE_H_
