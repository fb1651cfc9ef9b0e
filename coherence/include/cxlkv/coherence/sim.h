// cxlkv/coherence/sim.h — a non-coherent shared-memory simulator.
//
// SimMemory is the media; each HostView is one host's window onto it with a private cache of
// 64-byte lines. Reads fill lines from the media once and then keep returning the cached copy
// (stale as it may be); writes dirty the cached line; only Flush writes a line back and only
// Invalidate drops it (Evict does at the next FullFence). Like real caches, a view also evicts lines on its own (seeded,
// deterministic): a dirty line may reach the media early, a clean one may be refreshed.
// Crash() loses the host's dirty lines (each one is written back or lost at random).
// So protocol code that forgets a Flush or an Invalidate sees — or leaves others seeing —
// stale data, and the tests fail.
//
// Not thread-safe: the simulation is single-threaded and deterministic from its seed.
#ifndef CXLKV_COHERENCE_SIM_H_
#define CXLKV_COHERENCE_SIM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "cxlkv/coherence/mem.h"

namespace cxlkv::coherence {

class SimMemory {
 public:
  SimMemory(std::uint64_t size_bytes, std::uint64_t seed);

  class HostView;
  // A new view with an empty cache. evict_per_mille: chance, per access, that one random
  // cached line is evicted.
  std::unique_ptr<HostView> NewView(std::uint32_t evict_per_mille = 20);

  // What memory holds, bypassing every cache (for invariant checks).
  void ReadMedia(std::uint64_t offset, void* dst, std::size_t len) const;
  std::uint64_t size_bytes() const { return media_.size(); }

 private:
  std::vector<std::byte> media_;
  std::mt19937_64 seeds_;
};

class SimMemory::HostView final : public Mem {
 public:
  HostView(SimMemory& media, std::uint64_t seed, std::uint32_t evict_per_mille);
  std::uint64_t size_bytes() const override { return media_.size_bytes(); }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override;
  void Write(std::uint64_t offset, const void* src, std::size_t len) override;
  void WriteNt(std::uint64_t offset, const void* src, std::size_t len) override;
  void Flush(std::uint64_t offset, std::size_t len) override;
  void Invalidate(std::uint64_t offset, std::size_t len) override;
  // Evicted lines stay readable (stale) until the next FullFence or Invalidate, so a read
  // that skips the fence after Evict sees the old copy.
  void Evict(std::uint64_t offset, std::size_t len) override;
  void Fence() override;
  void FullFence() override;
  // Called at every fence, before it takes effect: a simulation runs other hosts (or lets
  // time pass) there, so that a call's steps interleave with theirs as on real hardware.
  void set_on_fence(std::function<void()> f) { on_fence_ = std::move(f); }

  // The host died: each dirty line reaches the media or is lost (coin flip); cache emptied.
  void Crash();
  std::size_t cached_lines() const { return lines_.size(); }

 private:
  struct Line {
    std::array<std::byte, 64> data;
    bool dirty = false;
  };
  Line& Fill(std::uint64_t line);
  void Drop(std::uint64_t offset, std::size_t len);
  std::vector<std::pair<std::uint64_t, std::size_t>> pending_evictions_;
  std::function<void()> on_fence_;
  void WriteBack(std::uint64_t line, const Line& l);
  void MaybeEvict();

  SimMemory& media_;
  std::mt19937_64 rng_;
  std::uint32_t evict_per_mille_;
  std::unordered_map<std::uint64_t, Line> lines_;
};

// A simulated host clock: global time scaled by a rate close to 1, plus an offset.
class SimClock final : public Clock {
 public:
  SimClock(const std::int64_t* global_ms, std::int64_t offset_ms, double rate)
      : global_ms_(global_ms), offset_ms_(offset_ms), rate_(rate) {}
  std::int64_t NowMs() override {
    if (on_read_) on_read_();
    return frozen_ ? held_ms_ : Running();
  }
  // Called before every reading: a simulation may let time pass (a stall) and others act.
  void set_on_read(std::function<void()> f) { on_read_ = std::move(f); }

  // Stops the clock: readings hold still until Resume(), which carries on from the held
  // value, so the stopped time is never counted. A VM stopped under kvmclock, or a host
  // suspended whose clock does not count the suspension (CLOCK_MONOTONIC), reads like this.
  void Freeze() {
    if (!frozen_) held_ms_ = Running();
    frozen_ = true;
  }
  void Resume() {
    if (frozen_) offset_ms_ += held_ms_ - Running();
    frozen_ = false;
  }
  // Steps the clock by delta_ms at once: forward, a suspension counted on resume
  // (CLOCK_BOOTTIME); backward, a clock that lost time.
  void Jump(std::int64_t delta_ms) {
    offset_ms_ += delta_ms;
    held_ms_ += delta_ms;
  }

 private:
  std::int64_t Running() const {
    return offset_ms_ + static_cast<std::int64_t>(static_cast<double>(*global_ms_) * rate_);
  }

  const std::int64_t* global_ms_;
  std::int64_t offset_ms_;
  double rate_;
  std::function<void()> on_read_;
  bool frozen_ = false;
  std::int64_t held_ms_ = 0;
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_SIM_H_
