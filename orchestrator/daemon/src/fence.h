// The leader's fence in the domain region (orchestrator HA, docs/ha.md; private to the
// daemon): the fence line (coherence::OwnerFenceLine), the release, a Mem that drops stores
// once the leader's write deadline passed, and the single orchestrator's mark
// (coherence::SingleOwnerLine) that keeps it and elected ones apart across machines.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_FENCE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_FENCE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"

namespace cxlkv::orchestrator {

// Whether this process may write the shared domain now (the election's fence).
class WriteGate {
 public:
  virtual ~WriteGate() = default;
  // Cheap: called before every store to the domain.
  virtual bool WriteAllowed() const = 0;
};

// Reads the fence line as its writer last flushed it (invalidate, read, check the CRC; a torn
// line is re-read a few times). False if it never validated: the writer died writing it, or
// the memory is corrupt.
bool ReadFenceLine(coherence::Mem& mem, coherence::OwnerFenceLine* out);

// Seals the line, stores it, flushes it and fences: once this returns, any host that
// invalidates and reads the line sees it (or a later one).
void WriteFenceLine(coherence::Mem& mem, const coherence::OwnerFenceLine& line);

// Reads the release line (coherence::OwnerReleaseLine) as its writer last flushed it, like
// ReadFenceLine. False if it never validated.
bool ReadReleaseLine(coherence::Mem& mem, coherence::OwnerReleaseLine* out);

// Writes back every line of the domain range [0, len) from this machine's caches (clwb: the
// whole coherence domain of this machine, other processes' dirty lines included), fences,
// and only then seals, stores, flushes and fences the release line. Call it only once no
// process of the released term stores to the domain again (the gate closed and the owner
// quiet, or the process dead). The release line is written through `mem` as given: a
// deposed leader's fenced view would drop it.
void ReleaseTerm(coherence::Mem& mem, std::uint64_t len, const coherence::OwnerReleaseLine& line);

// Writes back every line of the domain range [0, len) from this machine's caches (clwb, in
// chunks), then fences: every store this machine made to the domain before the call is in
// memory once it returns. ReleaseTerm's first step; a single orchestrator's release too.
void WriteBackDomain(coherence::Mem& mem, std::uint64_t len);

// The single owner's mark (coherence::SingleOwnerLine), read and written like the fence line:
// ReadSingleOwnerLine is false if the line never validated; WriteSingleOwnerLine seals, stores,
// flushes and fences it.
bool ReadSingleOwnerLine(coherence::Mem& mem, coherence::SingleOwnerLine* out);
void WriteSingleOwnerLine(coherence::Mem& mem, const coherence::SingleOwnerLine& line);

// "a single cxlkv-orchestrator (no [etcd]) on host 'H', pid P": who a mark names, for messages.
std::string DescribeSingleOwner(const coherence::SingleOwnerLine& line);

// How long a reader waits for a serving mark to move before it calls it still: twenty of its
// writer's owner periods, within [200 ms, 1 s] (scheduling on a loaded machine stays well
// below; a live owner bumps it every period).
std::int64_t SingleOwnerStillAfterMs(const coherence::SingleOwnerLine& line);

// Whether the mark `seen` (read just before) changes within `wait_ms`: its owner is alive and
// running batches. Reads the line every few milliseconds; *now: the last read. Costs up to
// wait_ms of sleeping.
bool SingleOwnerAdvances(coherence::Mem& mem, const coherence::SingleOwnerLine& seen,
                         std::int64_t wait_ms, coherence::SingleOwnerLine* now);

// What a successor must wait for before its first store, given the fence line it found and
// the release line it reads now: true when the term the fence line names was released (or
// no elected term ever owned the domain). A torn fence line (`fence_valid` false) is
// released only by a release line different from `release_at_start` (the one seen when the
// wait began): its term is unknown, so the next release is taken to be its.
bool TermReleased(bool fence_valid, const coherence::OwnerFenceLine& fence, bool release_valid,
                  const coherence::OwnerReleaseLine& release,
                  const coherence::OwnerReleaseLine& release_at_start);

// A Mem whose stores (Write, WriteNt) reach the memory only while the gate allows them; after
// that they are dropped and counted. Reads, flushes and fences pass through: a store made
// while allowed may still be flushed after (the window is the store-to-flush time of one
// line, nanoseconds unless the process is stopped exactly there). Dropping every store from
// some point on leaves the domain as a crash of the writer at that point would, which the
// prefix protocol recovers from (PrefixOwner::Open repairs torn lines). Thread-compatible,
// like the Mem it wraps.
class FencedMem final : public coherence::Mem {
 public:
  FencedMem(coherence::Mem& inner, const WriteGate& gate) : inner_(inner), gate_(gate) {}
  std::uint64_t size_bytes() const override { return inner_.size_bytes(); }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override {
    inner_.Read(offset, dst, len);
  }
  void Write(std::uint64_t offset, const void* src, std::size_t len) override {
    if (!gate_.WriteAllowed()) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    inner_.Write(offset, src, len);
  }
  void WriteNt(std::uint64_t offset, const void* src, std::size_t len) override {
    if (!gate_.WriteAllowed()) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    inner_.WriteNt(offset, src, len);
  }
  void Flush(std::uint64_t offset, std::size_t len) override { inner_.Flush(offset, len); }
  void Invalidate(std::uint64_t offset, std::size_t len) override {
    inner_.Invalidate(offset, len);
  }
  void Evict(std::uint64_t offset, std::size_t len) override { inner_.Evict(offset, len); }
  void Fence() override { inner_.Fence(); }
  void FullFence() override { inner_.FullFence(); }
  // Stores dropped since construction.
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  coherence::Mem& inner_;
  const WriteGate& gate_;
  std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_FENCE_H_
