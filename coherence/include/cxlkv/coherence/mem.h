// cxlkv/coherence/mem.h — one host's view of the shared domain memory, and clocks.
//
// The protocol code (prefix.h) touches shared memory only through Mem, by offset, so it runs
// unchanged on a real mapping (DirectMem: flush/invalidate instructions) and on the
// non-coherent simulator (sim.h: each host sees its own cached copy of every line until it
// flushes or invalidates). Clock is injected the same way: the simulator gives each host a
// clock of its own (offset and rate differ), as real hosts have.
//
// A Mem is used by one thread at a time unless the implementation says otherwise.
#ifndef CXLKV_COHERENCE_MEM_H_
#define CXLKV_COHERENCE_MEM_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace cxlkv::coherence {

class Mem {
 public:
  virtual ~Mem() = default;
  virtual std::uint64_t size_bytes() const = 0;
  // Loads through this host's cache: may return a stale copy until Invalidate().
  virtual void Read(std::uint64_t offset, void* dst, std::size_t len) = 0;
  // Stores into this host's cache: others may not see them until Flush().
  virtual void Write(std::uint64_t offset, const void* src, std::size_t len) = 0;
  // Streaming stores: in memory once Fence() returns; no Flush needed.
  virtual void WriteNt(std::uint64_t offset, const void* src, std::size_t len) = 0;
  // Writes back the dirty lines of the range (clwb). Orders nothing by itself.
  virtual void Flush(std::uint64_t offset, std::size_t len) = 0;
  // Writes back and drops the lines of the range, then fences, so the next Read fetches
  // what memory holds now (clflushopt + mfence).
  virtual void Invalidate(std::uint64_t offset, std::size_t len) = 0;
  // Invalidate without the fence (clflushopt only): evict several ranges, then FullFence()
  // once before reading any of them.
  virtual void Evict(std::uint64_t offset, std::size_t len) = 0;
  // Store fence (sfence): earlier stores, flushes and streaming stores complete first.
  virtual void Fence() = 0;
  // Full fence (mfence): also keeps later loads behind earlier stores.
  virtual void FullFence() = 0;
  // A hint that changes no Read's result: loads from each listed line (offsets of 64-byte
  // lines) so that the Reads of those lines that follow find them on their way. The loads are
  // plain loads, independent of each other, so their misses overlap (as many as the core can
  // keep in flight) where a run of Reads would wait on some of them in turn. A load is a
  // load: after a FullFence, it fetches what a Read there would. Default: nothing.
  virtual void Preload(std::span<const std::uint64_t> line_offsets) { (void)line_offsets; }
};

// A real mapping: Read/Write are memcpy, the rest are the cache.h instructions.
// Thread-compatible; several DirectMems may view the same memory from different threads.
class DirectMem final : public Mem {
 public:
  DirectMem(std::byte* base, std::uint64_t size_bytes) : base_(base), size_(size_bytes) {}
  std::uint64_t size_bytes() const override { return size_; }
  void Read(std::uint64_t offset, void* dst, std::size_t len) override;
  void Write(std::uint64_t offset, const void* src, std::size_t len) override;
  void WriteNt(std::uint64_t offset, const void* src, std::size_t len) override;
  void Flush(std::uint64_t offset, std::size_t len) override;
  void Invalidate(std::uint64_t offset, std::size_t len) override;
  void Evict(std::uint64_t offset, std::size_t len) override;
  void Fence() override;
  void FullFence() override;
  void Preload(std::span<const std::uint64_t> line_offsets) override;
  std::byte* base() const { return base_; }

 private:
  std::byte* base_;
  std::uint64_t size_;
};

// Milliseconds on some host's own clock; only differences are meaningful.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::int64_t NowMs() = 0;
};

// CLOCK_BOOTTIME: monotonic, and counts time the machine spent suspended.
class SteadyClock final : public Clock {
 public:
  std::int64_t NowMs() override;
};

}  // namespace cxlkv::coherence

#endif  // CXLKV_COHERENCE_MEM_H_
