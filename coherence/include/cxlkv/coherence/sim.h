// cxlkv/coherence/sim.h — a non-coherent shared-memory simulator.
//
// SimMemory is the media; each HostView is one host's (one machine's) window onto it with a
// private cache of 64-byte lines. Reads fill lines from the media once and then keep returning
// the cached copy (stale as it may be); writes dirty the cached line; only Flush writes a line
// back and only Invalidate drops it (Evict does at the next FullFence). Like real caches, a
// view also evicts lines on its own (seeded, deterministic): a dirty line may reach the media
// early, a clean one may be refreshed. Crash() loses the host's dirty lines (each one is
// written back or lost at random). So protocol code that forgets a Flush or an Invalidate
// sees — or leaves others seeing — stale data, and the tests fail.
//
// SimOptions switches on the hardware's other failure classes, each on its own (all off by
// default, which is the behaviour described above):
//   - store_buffer: x86-TSO store buffers. A store waits in a per-view FIFO before it reaches
//     the cache; a later load of another address may run before it (store→load reordering);
//     the view's own loads see it (store-to-load forwarding). Only FullFence (mfence) — and so
//     Invalidate, which ends with one — drains the buffer before later loads.
//   - async_writeback: a write-back (clwb, an eviction) is in flight until the issuing view's
//     next Fence or FullFence; meanwhile it may reach the media in part, 8 bytes at a time, so
//     another view's fill can see a line that is half old, half new.
//   - tear_per_mille: a store is interrupted between two of its 8-byte words and the line is
//     evicted right then (a writer descheduled in the middle of a memcpy): the media holds a
//     torn line — within a line, or across the lines of a multi-line record — until the writer
//     writes back the rest.
//   - late_writeback: Crash() keeps (or loses) each dirty line instead of settling it at once;
//     kept lines reach the media at random later Tick()s, as from a machine that hung and came
//     back or a dead process whose machine lives on. A live view's dirty lines always arrive
//     late in this sense: memory given away without a Flush leaves them to eviction.
//   - fault_full_fence_is_sfence: fault injection, not hardware: FullFence and Invalidate's
//     fence act as an sfence (DirectMem::FullFence written as _mm_sfence). With the store buffer
//     on, buffered stores then stay buffered past later loads.
//
// What sfence and mfence mean here (x86): stores leave the store buffer in program order, so
// store→store order holds without any fence. clwb/clflushopt of a line are ordered after older
// stores to that line, and sfence orders them before every later store — but sfence does not
// make later loads wait, so "store; clwb; sfence; load" may load before the store is visible.
// mfence waits until every earlier store is visible and every earlier clwb/clflushopt has
// completed before any later load. The simulator keeps clwb in the store buffer's FIFO (a
// little stronger than x86, which orders clwb only with stores to its own line), an sfence is
// a marker there that completes the view's write-backs when it drains, and FullFence drains
// everything, then completes every write-back and pending eviction.
//
// Not thread-safe: the simulation is single-threaded and deterministic from its seed.
#ifndef CXLKV_COHERENCE_SIM_H_
#define CXLKV_COHERENCE_SIM_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "cxlkv/coherence/mem.h"

namespace cxlkv::coherence {

struct SimOptions {
  bool store_buffer = false;
  // Chance, per access of a view, that the oldest entry of its store buffer drains.
  std::uint32_t store_drain_per_mille = 300;
  bool async_writeback = false;
  // Chance, per access of any view, that one write-back in flight makes progress (all of its
  // remaining words or a random part of them).
  std::uint32_t writeback_progress_per_mille = 300;
  // Chance, per store of more than 8 bytes, that it is torn (see above).
  std::uint32_t tear_per_mille = 0;
  bool late_writeback = false;
  // Chance, per Tick and per line a crashed view still holds, that the line lands.
  std::uint32_t late_land_per_mille = 50;
  bool fault_full_fence_is_sfence = false;
};

// What the failure classes did (to show that a run exercised them).
struct SimStats {
  std::uint64_t torn_stores = 0;         // stores whose line was written back half done
  std::uint64_t partial_writebacks = 0;  // write-backs that reached the media in parts
  std::uint64_t forwarded_loads = 0;     // loads served (partly) from the view's store buffer
  std::uint64_t reordered_loads = 0;     // loads that ran while older stores were buffered
  std::uint64_t missed_buffered = 0;     // fills that missed a store buffered on another host
  std::uint64_t late_lines = 0;          // lines of crashed views that landed after the crash
  std::uint64_t lost_lines = 0;          // dirty lines a crash lost
};

class SimMemory {
 public:
  SimMemory(std::uint64_t size_bytes, std::uint64_t seed, const SimOptions& options = {});
  // The media is `media` (a multiple of 64 bytes; it must outlive this SimMemory), e.g. a
  // mapping other processes map too: each process then simulates its own host's cache over
  // one shared media (the LMCache qualification kit's simulated fabric, docs/lmcache.md).
  SimMemory(std::span<std::byte> media, std::uint64_t seed, const SimOptions& options = {});
  ~SimMemory();
  SimMemory(const SimMemory&) = delete;
  SimMemory& operator=(const SimMemory&) = delete;

  class HostView;
  // A new view with an empty cache. evict_per_mille: chance, per access, that one random
  // cached line is evicted. The view must not outlive this SimMemory.
  std::unique_ptr<HostView> NewView(std::uint32_t evict_per_mille = 20);

  // What memory holds, bypassing every cache (for invariant checks).
  void ReadMedia(std::uint64_t offset, void* dst, std::size_t len) const;
  std::uint64_t size_bytes() const { return media_.size(); }

  // Time passes (a simulated millisecond or more): every store buffer drains and every
  // write-back in flight completes — real hardware takes nanoseconds to microseconds for
  // both.
  void Settle();
  // One step of a simulation: lands some of the lines crashed views still hold.
  void Tick();
  const SimOptions& options() const { return options_; }
  const SimStats& stats() const { return stats_; }
  // Called as a line a crashed or abandoned view still held lands late (Tick), before it
  // reaches the media: the view and the line's offset (for a simulation's invariants).
  void set_on_late_land(std::function<void(const HostView&, std::uint64_t)> f) {
    on_late_land_ = std::move(f);
  }

 private:
  struct InFlight {
    std::uint64_t line;
    std::array<std::byte, 64> data;
    std::uint8_t left;  // bit w: word w (8 bytes) has not reached the media yet
    const HostView* issuer;
  };
  void Issue(const HostView* issuer, std::uint64_t line, const std::array<std::byte, 64>& data,
             std::uint8_t words);
  void CompleteAll(const HostView* issuer);
  void CompleteLine(const HostView* issuer, std::uint64_t line);
  void Progress();
  void Apply(InFlight& w, std::uint8_t words);

  std::vector<std::byte> owned_;  // the media when this SimMemory allocated it
  std::span<std::byte> media_;
  std::mt19937_64 seeds_;
  std::mt19937_64 rng_;
  SimOptions options_;
  SimStats stats_;
  std::vector<InFlight> in_flight_;
  std::vector<HostView*> views_;
  std::function<void(const HostView&, std::uint64_t)> on_late_land_;
};

class SimMemory::HostView final : public Mem {
 public:
  HostView(SimMemory& media, std::uint64_t seed, std::uint32_t evict_per_mille);
  ~HostView() override;
  std::uint64_t size_bytes() const override { return media_.size_bytes(); }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override;
  void Write(std::uint64_t offset, const void* src, std::size_t len) override;
  // Streaming stores: the lines leave this cache (written back first if dirty) and the bytes
  // go to the media, there once Fence() returns.
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
  // Called after every store (Write, WriteNt) is issued and before anything else: a crash
  // there leaves the store's line dirty (a crash point between a store and its flush).
  void set_on_store(std::function<void()> f) { on_store_ = std::move(f); }

  // The host died: its store buffer is lost, write-backs in flight land or are lost, and each
  // dirty line is lost or reaches the media — at once, or (late_writeback) at a random later
  // Tick or when the view is used again (the same machine: its own cache is coherent to it).
  void Crash();
  // No process of this machine touches the memory through this view again, but the machine
  // lives on: its store buffer drains, its write-backs in flight complete, and each line it
  // still holds dirty reaches the media at a random later Tick (late_writeback), as a cache
  // evicts on its own — never lost. For a machine whose owner process died or stepped down
  // and that another machine took over from.
  void Abandon();
  // Lines this view holds dirty (not yet written back).
  std::size_t dirty_lines() const;
  // Drains the store buffer now (stores reach this cache, their clwbs are issued).
  void DrainStoreBuffer();
  // Writes every dirty line back now and completes this host's write-backs in flight (a
  // whole-cache write-back, wbinvd-like, e.g. by the machine's agent after its process died).
  void WriteBackAll();
  // What this host would load after Invalidate, without touching anything: its buffered
  // stores, else its dirty lines, else its write-backs in flight, else memory (for a
  // simulation's invariant checks and diagnostics).
  void Peek(std::uint64_t offset, void* dst, std::size_t len) const;
  std::size_t cached_lines() const { return lines_.size(); }
  std::size_t buffered_stores() const { return sb_.size(); }

 private:
  friend class SimMemory;
  struct Line {
    std::array<std::byte, 64> data;
    bool dirty = false;
  };
  // One store-buffer entry: a store of up to one line, a streaming store, a clwb, an sfence.
  struct SbOp {
    enum Kind : std::uint8_t { kStore, kNt, kClwb, kSfence } kind;
    std::uint8_t in;  // offset inside the line
    std::uint8_t len;
    std::uint64_t line;
    std::array<std::byte, 64> data;
  };
  void Access();  // per access: random eviction, write-back progress, store-buffer drain
  Line& Fill(std::uint64_t line);
  void CountMissedStores(std::uint64_t line);
  void StoreToCache(std::uint64_t offset, const std::byte* src, std::size_t len);
  void StoreNt(std::uint64_t line, std::uint8_t in, std::uint8_t len, const std::byte* src);
  void WriteBackLine(std::uint64_t line);  // clwb: if cached and dirty
  void WriteBack(std::uint64_t line, const Line& l);
  void Drop(std::uint64_t offset, std::size_t len);
  void DrainOne();
  void DrainThrough(std::uint64_t line);  // drains up to the newest entry touching line
  void ApplyEvictions();
  void MaybeEvict();
  void Revive();  // first access after Crash(): the machine is back
  void TickLate();

  SimMemory& media_;
  std::mt19937_64 rng_;
  std::uint32_t evict_per_mille_;
  std::unordered_map<std::uint64_t, Line> lines_;
  std::deque<SbOp> sb_;
  std::vector<std::pair<std::uint64_t, std::size_t>> pending_evictions_;
  std::function<void()> on_fence_;
  std::function<void()> on_store_;
  bool crashed_ = false;  // since Crash(), until the next access: only dirty lines cached
};

// A simulated host clock: global time scaled by a rate close to 1, plus an offset. It can
// freeze (a suspend, a stopped VM), resume, jump and change its rate (drift).
class SimClock final : public Clock {
 public:
  SimClock(const std::int64_t* global_ms, std::int64_t offset_ms, double rate)
      : global_ms_(global_ms), offset_ms_(offset_ms), rate_(rate) {}
  std::int64_t NowMs() override {
    if (on_read_) on_read_();
    return Reading();
  }
  // Called before every reading: a simulation may let time pass (a stall) and others act.
  void set_on_read(std::function<void()> f) { on_read_ = std::move(f); }
  // The reading without the hook (for a simulation's own invariant checks).
  std::int64_t PeekMs() const { return Reading(); }

  // Stops the clock: readings hold still until Resume(), which carries on from the held
  // value, so the stopped time is never counted — as CLOCK_MONOTONIC across a suspend, or
  // kvmclock across a stopped VM, read. Jump() after Resume() counts it instead.
  void Freeze() {
    if (frozen_) return;
    Rebase();
    frozen_ = true;
  }
  void Resume() {
    if (!frozen_) return;
    frozen_ = false;
    base_ms_ = *global_ms_;
  }
  // Steps the clock by delta_ms at once (frozen or not): forward, a suspension counted on
  // resume (CLOCK_BOOTTIME); backward, a clock that lost time.
  void Jump(std::int64_t delta_ms) { offset_ms_ += delta_ms; }
  // From now on the clock runs at `rate` (global milliseconds per its millisecond): drift.
  void set_rate(double rate) {
    Rebase();
    rate_ = rate;
  }
  bool frozen() const { return frozen_; }
  double rate() const { return rate_; }

 private:
  std::int64_t Reading() const {
    if (frozen_) return offset_ms_;
    return offset_ms_ +
           static_cast<std::int64_t>(static_cast<double>(*global_ms_ - base_ms_) * rate_);
  }
  void Rebase() {
    if (frozen_) return;
    offset_ms_ = Reading();
    base_ms_ = *global_ms_;
  }

  const std::int64_t* global_ms_;
  std::int64_t offset_ms_;
  std::int64_t base_ms_ = 0;  // global time at which offset_ms_ was the reading
  double rate_;
  bool frozen_ = false;
  std::function<void()> on_read_;
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_SIM_H_
