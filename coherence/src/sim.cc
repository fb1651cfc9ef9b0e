#include "cxlkv/coherence/sim.h"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace cxlkv::coherence {

namespace {
constexpr std::uint8_t kAllWords = 0xFF;

// Bit w set for every 8-byte word of a line that bytes [in, in + len) touch.
std::uint8_t WordsOf(std::size_t in, std::size_t len) {
  std::uint8_t m = 0;
  for (std::size_t w = in / 8; w <= (in + len - 1) / 8; ++w)
    m |= static_cast<std::uint8_t>(1u << w);
  return m;
}
}  // namespace

SimMemory::SimMemory(std::uint64_t size_bytes, std::uint64_t seed, const SimOptions& options)
    : owned_((size_bytes + 63) / 64 * 64),
      media_(owned_),
      seeds_(seed),
      rng_(seed ^ 0xA11CE),
      options_(options) {}

SimMemory::SimMemory(std::span<std::byte> media, std::uint64_t seed, const SimOptions& options)
    : media_(media.first(media.size() / 64 * 64)),
      seeds_(seed),
      rng_(seed ^ 0xA11CE),
      options_(options) {}

SimMemory::~SimMemory() = default;

std::unique_ptr<SimMemory::HostView> SimMemory::NewView(std::uint32_t evict_per_mille) {
  return std::make_unique<HostView>(*this, seeds_(), evict_per_mille);
}

void SimMemory::ReadMedia(std::uint64_t offset, void* dst, std::size_t len) const {
  std::memcpy(dst, media_.data() + offset, len);
}

void SimMemory::Issue(const HostView* issuer, std::uint64_t line,
                      const std::array<std::byte, 64>& data, std::uint8_t words) {
  // A newer write-back of the same line by the same host merges into the older one: the
  // host's own write-backs of one line reach memory in order.
  for (InFlight& w : in_flight_) {
    if (w.issuer == issuer && w.line == line) {
      for (std::size_t b = 0; b < 8; ++b) {
        if (words & (1u << b)) std::memcpy(w.data.data() + 8 * b, data.data() + 8 * b, 8);
      }
      w.left |= words;
      return;
    }
  }
  in_flight_.push_back(InFlight{line, data, words, issuer});
}

void SimMemory::Apply(InFlight& w, std::uint8_t words) {
  for (std::size_t b = 0; b < 8; ++b) {
    if (words & (1u << b)) {
      std::memcpy(media_.data() + w.line * 64 + 8 * b, w.data.data() + 8 * b, 8);
    }
  }
  w.left = static_cast<std::uint8_t>(w.left & ~words);
}

void SimMemory::CompleteAll(const HostView* issuer) {
  if (in_flight_.empty()) return;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < in_flight_.size(); ++i) {
    InFlight& w = in_flight_[i];
    if (issuer == nullptr || w.issuer == issuer) {
      Apply(w, w.left);
    } else {
      in_flight_[kept++] = w;
    }
  }
  in_flight_.resize(kept);
}

void SimMemory::CompleteLine(const HostView* issuer, std::uint64_t line) {
  for (std::size_t i = 0; i < in_flight_.size(); ++i) {
    if (in_flight_[i].issuer == issuer && in_flight_[i].line == line) {
      Apply(in_flight_[i], in_flight_[i].left);
      in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

void SimMemory::Progress() {
  if (in_flight_.empty() || rng_() % 1000 >= options_.writeback_progress_per_mille) return;
  const std::size_t i = rng_() % in_flight_.size();
  InFlight& w = in_flight_[i];
  std::uint8_t words = w.left;
  if (rng_() & 1) {
    // Part of the line: a fill by another host now sees some new words and some old ones.
    words = static_cast<std::uint8_t>(words & rng_());
    if (words == 0) words = static_cast<std::uint8_t>(w.left & -w.left);
  }
  if (words != w.left) ++stats_.partial_writebacks;
  Apply(w, words);
  if (w.left == 0) in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
}

void SimMemory::Settle() {
  for (HostView* v : views_) {
    if (!v->crashed_) v->DrainStoreBuffer();
  }
  CompleteAll(nullptr);
}

void SimMemory::Tick() {
  if (!options_.late_writeback) return;
  for (HostView* v : views_) v->TickLate();
}

SimMemory::HostView::HostView(SimMemory& media, std::uint64_t seed, std::uint32_t evict_per_mille)
    : media_(media), rng_(seed), evict_per_mille_(evict_per_mille) {
  media_.views_.push_back(this);
}

SimMemory::HostView::~HostView() {
  auto& v = media_.views_;
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
  media_.CompleteAll(this);  // nothing may name this view after it is gone
}

void SimMemory::HostView::Access() {
  crashed_ = false;  // in use again: the same machine, whose own cache is coherent to it
  MaybeEvict();
  if (media_.options_.async_writeback) media_.Progress();
  if (!sb_.empty() && rng_() % 1000 < media_.options_.store_drain_per_mille) DrainOne();
}

SimMemory::HostView::Line& SimMemory::HostView::Fill(std::uint64_t line) {
  auto [it, inserted] = lines_.try_emplace(line);
  if (inserted) {
    // This host's own write-back of the line is ordered before its refill of it.
    if (media_.options_.async_writeback) media_.CompleteLine(this, line);
    if (media_.options_.store_buffer) CountMissedStores(line);
    std::memcpy(it->second.data.data(), media_.media_.data() + line * 64, 64);
  }
  return it->second;
}

void SimMemory::HostView::CountMissedStores(std::uint64_t line) {
  for (const HostView* v : media_.views_) {
    if (v == this) continue;
    for (const SbOp& op : v->sb_) {
      if (op.line == line && (op.kind == SbOp::kStore || op.kind == SbOp::kNt)) {
        ++media_.stats_.missed_buffered;
        return;
      }
    }
  }
}

void SimMemory::HostView::WriteBack(std::uint64_t line, const Line& l) {
  if (media_.options_.async_writeback) {
    media_.Issue(this, line, l.data, kAllWords);
  } else {
    std::memcpy(media_.media_.data() + line * 64, l.data.data(), 64);
  }
}

void SimMemory::HostView::WriteBackLine(std::uint64_t line) {
  auto it = lines_.find(line);
  if (it != lines_.end() && it->second.dirty) {
    WriteBack(line, it->second);
    it->second.dirty = false;
  }
}

void SimMemory::HostView::MaybeEvict() {
  if (lines_.empty() || rng_() % 1000 >= evict_per_mille_) return;
  auto it = lines_.begin();
  std::advance(it, static_cast<long>(rng_() % lines_.size()));
  if (it->second.dirty) WriteBack(it->first, it->second);
  lines_.erase(it);
}

void SimMemory::HostView::StoreToCache(std::uint64_t offset, const std::byte* src,
                                       std::size_t len) {
  // A torn store: the writer is interrupted after `cut` bytes and the line holding the last
  // of them is evicted right then, half written; the rest of the store follows later.
  std::size_t cut = len;
  const std::uint32_t tear = media_.options_.tear_per_mille;
  if (tear != 0 && len > 8 && rng_() % 1000 < tear) {
    cut = 8 * (1 + rng_() % ((len - 1) / 8));
  }
  auto apply = [&](std::uint64_t off, const std::byte* p, std::size_t n) {
    while (n > 0) {
      const std::uint64_t line = off / 64, in = off % 64;
      const std::size_t k = std::min<std::size_t>(n, 64 - in);
      Line& l = Fill(line);
      std::memcpy(l.data.data() + in, p, k);
      l.dirty = true;
      p += k;
      off += k;
      n -= k;
    }
  };
  apply(offset, src, cut);
  if (cut == len) return;
  const std::uint64_t torn = (offset + cut - 1) / 64;
  Line& l = lines_.at(torn);
  WriteBack(torn, l);
  if (media_.options_.async_writeback) media_.CompleteLine(this, torn);
  l.dirty = false;
  ++media_.stats_.torn_stores;
  apply(offset + cut, src + cut, len - cut);
}

void SimMemory::HostView::StoreNt(std::uint64_t line, std::uint8_t in, std::uint8_t len,
                                  const std::byte* src) {
  // A streaming store takes the line out of this cache (written back first if dirty), then
  // goes to memory.
  auto it = lines_.find(line);
  if (it != lines_.end()) {
    if (it->second.dirty) WriteBack(line, it->second);
    lines_.erase(it);
  }
  if (media_.options_.async_writeback) {
    std::array<std::byte, 64> data;
    std::memcpy(data.data(), media_.media_.data() + line * 64, 64);
    std::memcpy(data.data() + in, src, len);
    media_.Issue(this, line, data, WordsOf(in, len));
  } else {
    std::memcpy(media_.media_.data() + line * 64 + in, src, len);
  }
}

void SimMemory::HostView::Read(std::uint64_t offset, void* dst, std::size_t len) {
  Access();
  auto* out = static_cast<std::byte*>(dst);
  const std::uint64_t start = offset;
  const std::size_t total = len;
  while (len > 0) {
    const std::uint64_t line = offset / 64, in = offset % 64;
    const std::size_t n = std::min<std::size_t>(len, 64 - in);
    std::memcpy(out, Fill(line).data.data() + in, n);
    out += n;
    offset += n;
    len -= n;
  }
  if (sb_.empty()) return;
  // Store-to-load forwarding: this host's buffered stores, oldest first, so the newest wins.
  ++media_.stats_.reordered_loads;
  bool forwarded = false;
  auto* base = static_cast<std::byte*>(dst);
  for (const SbOp& op : sb_) {
    if (op.kind != SbOp::kStore && op.kind != SbOp::kNt) continue;
    const std::uint64_t lo = std::max(start, op.line * 64 + op.in);
    const std::uint64_t hi = std::min(start + total, op.line * 64 + op.in + op.len);
    if (lo >= hi) continue;
    std::memcpy(base + (lo - start), op.data.data() + (lo - op.line * 64), hi - lo);
    forwarded = true;
  }
  if (forwarded) ++media_.stats_.forwarded_loads;
}

void SimMemory::HostView::Peek(std::uint64_t offset, void* dst, std::size_t len) const {
  auto* out = static_cast<std::byte*>(dst);
  std::memcpy(out, media_.media_.data() + offset, len);
  auto overlay = [&](std::uint64_t lo, const std::byte* src, std::size_t n) {
    const std::uint64_t a = std::max(offset, lo), b = std::min(offset + len, lo + n);
    if (a < b) std::memcpy(out + (a - offset), src + (a - lo), b - a);
  };
  for (const InFlight& w : media_.in_flight_) {
    if (w.issuer != this) continue;
    for (std::size_t b = 0; b < 8; ++b) {
      if (w.left & (1u << b)) overlay(w.line * 64 + 8 * b, w.data.data() + 8 * b, 8);
    }
  }
  for (std::uint64_t line = offset / 64; len > 0 && line <= (offset + len - 1) / 64; ++line) {
    auto it = lines_.find(line);
    if (it != lines_.end() && it->second.dirty) overlay(line * 64, it->second.data.data(), 64);
  }
  for (const SbOp& op : sb_) {
    if (op.kind == SbOp::kStore || op.kind == SbOp::kNt) {
      overlay(op.line * 64 + op.in, op.data.data() + op.in, op.len);
    }
  }
}

void SimMemory::HostView::Write(std::uint64_t offset, const void* src, std::size_t len) {
  Access();
  const auto* p = static_cast<const std::byte*>(src);
  if (!media_.options_.store_buffer) {
    StoreToCache(offset, p, len);
  } else {
    while (len > 0) {
      const std::uint64_t line = offset / 64, in = offset % 64;
      const std::size_t n = std::min<std::size_t>(len, 64 - in);
      SbOp op{SbOp::kStore, static_cast<std::uint8_t>(in), static_cast<std::uint8_t>(n), line, {}};
      std::memcpy(op.data.data() + in, p, n);
      sb_.push_back(op);
      p += n;
      offset += n;
      len -= n;
    }
  }
  if (on_store_) on_store_();
}

void SimMemory::HostView::WriteNt(std::uint64_t offset, const void* src, std::size_t len) {
  Access();
  const auto* p = static_cast<const std::byte*>(src);
  while (len > 0) {
    const std::uint64_t line = offset / 64, in = offset % 64;
    const std::size_t n = std::min<std::size_t>(len, 64 - in);
    if (media_.options_.store_buffer) {
      SbOp op{SbOp::kNt, static_cast<std::uint8_t>(in), static_cast<std::uint8_t>(n), line, {}};
      std::memcpy(op.data.data() + in, p, n);
      sb_.push_back(op);
    } else {
      StoreNt(line, static_cast<std::uint8_t>(in), static_cast<std::uint8_t>(n), p);
    }
    p += n;
    offset += n;
    len -= n;
  }
  if (on_store_) on_store_();
}

void SimMemory::HostView::Flush(std::uint64_t offset, std::size_t len) {
  if (len == 0) return;
  for (std::uint64_t line = offset / 64; line <= (offset + len - 1) / 64; ++line) {
    if (media_.options_.store_buffer) {
      // clwb is ordered after the older stores to its line: it waits in the FIFO behind them.
      sb_.push_back(SbOp{SbOp::kClwb, 0, 0, line, {}});
    } else {
      WriteBackLine(line);
    }
  }
}

void SimMemory::HostView::Invalidate(std::uint64_t offset, std::size_t len) {
  FullFence();  // the fence Invalidate ends with completes earlier evictions too
  Drop(offset, len);
  // Drop's own write-backs (of dirty lines) complete under the same mfence.
  if (!media_.options_.fault_full_fence_is_sfence) media_.CompleteAll(this);
}

void SimMemory::HostView::Evict(std::uint64_t offset, std::size_t len) {
  pending_evictions_.emplace_back(offset, len);
}

void SimMemory::HostView::Fence() {
  if (on_fence_) on_fence_();
  if (sb_.empty()) {
    media_.CompleteAll(this);
  } else {
    // sfence: this host's write-backs complete before any later store — a marker in the FIFO.
    sb_.push_back(SbOp{SbOp::kSfence, 0, 0, 0, {}});
  }
}

void SimMemory::HostView::FullFence() {
  if (on_fence_) on_fence_();
  if (media_.options_.fault_full_fence_is_sfence) {
    // Fault injection: an "mfence" that is only an sfence. Flushes and evictions still
    // complete (they are ordered by any fence); buffered stores stay buffered past later loads.
    ApplyEvictions();
    if (sb_.empty()) {
      media_.CompleteAll(this);
    } else {
      sb_.push_back(SbOp{SbOp::kSfence, 0, 0, 0, {}});
    }
    return;
  }
  DrainStoreBuffer();
  ApplyEvictions();
  media_.CompleteAll(this);
}

void SimMemory::HostView::ApplyEvictions() {
  for (const auto& [offset, len] : pending_evictions_) Drop(offset, len);
  pending_evictions_.clear();
}

void SimMemory::HostView::Drop(std::uint64_t offset, std::size_t len) {
  if (len == 0) return;
  for (std::uint64_t line = offset / 64; line <= (offset + len - 1) / 64; ++line) {
    DrainThrough(line);  // clflushopt is ordered after the older stores to its line
    auto it = lines_.find(line);
    if (it == lines_.end()) continue;
    if (it->second.dirty) WriteBack(line, it->second);
    lines_.erase(it);
  }
}

void SimMemory::HostView::DrainOne() {
  const SbOp op = sb_.front();
  sb_.pop_front();
  switch (op.kind) {
    case SbOp::kStore:
      StoreToCache(op.line * 64 + op.in, op.data.data() + op.in, op.len);
      break;
    case SbOp::kNt:
      StoreNt(op.line, op.in, op.len, op.data.data() + op.in);
      break;
    case SbOp::kClwb:
      WriteBackLine(op.line);
      break;
    case SbOp::kSfence:
      media_.CompleteAll(this);
      break;
  }
}

void SimMemory::HostView::DrainThrough(std::uint64_t line) {
  if (sb_.empty()) return;
  std::size_t last = sb_.size();
  for (std::size_t i = sb_.size(); i-- > 0;) {
    if (sb_[i].kind != SbOp::kSfence && sb_[i].line == line) {
      last = i;
      break;
    }
  }
  if (last == sb_.size()) return;
  for (std::size_t i = 0; i <= last; ++i) DrainOne();
}

void SimMemory::HostView::DrainStoreBuffer() {
  while (!sb_.empty()) DrainOne();
}

void SimMemory::HostView::WriteBackAll() {
  DrainStoreBuffer();
  for (auto& [line, l] : lines_) {
    if (l.dirty) {
      WriteBack(line, l);
      l.dirty = false;
    }
  }
  media_.CompleteAll(this);
}

void SimMemory::HostView::Crash() {
  sb_.clear();  // stores not yet in the cache die with the host
  // Write-backs already on their way each land or are lost, older before newer.
  for (std::size_t i = 0; i < media_.in_flight_.size();) {
    InFlight& w = media_.in_flight_[i];
    if (w.issuer != this) {
      ++i;
      continue;
    }
    if (rng_() & 1) media_.Apply(w, w.left);
    media_.in_flight_.erase(media_.in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  pending_evictions_.clear();
  const bool late = media_.options_.late_writeback;
  for (auto it = lines_.begin(); it != lines_.end();) {
    Line& l = it->second;
    if (!l.dirty) {
      it = lines_.erase(it);
      continue;
    }
    if (rng_() & 1) {
      if (late) {  // stays in the machine's cache, to land at some later time
        ++it;
        continue;
      }
      std::memcpy(media_.media_.data() + it->first * 64, l.data.data(), 64);
    } else {
      ++media_.stats_.lost_lines;
    }
    it = lines_.erase(it);
  }
  crashed_ = !lines_.empty();
}

void SimMemory::HostView::Abandon() {
  DrainStoreBuffer();
  media_.CompleteAll(this);
  pending_evictions_.clear();
  for (auto it = lines_.begin(); it != lines_.end();) {
    it = it->second.dirty ? std::next(it) : lines_.erase(it);
  }
  crashed_ = !lines_.empty();
}

std::size_t SimMemory::HostView::dirty_lines() const {
  std::size_t n = 0;
  for (const auto& [line, l] : lines_) n += l.dirty ? 1 : 0;
  return n;
}

void SimMemory::HostView::TickLate() {
  if (!crashed_) return;
  for (auto it = lines_.begin(); it != lines_.end();) {
    if (!it->second.dirty) {  // written back since the crash (WriteBackAll): nothing to land
      it = lines_.erase(it);
      continue;
    }
    if (rng_() % 1000 < media_.options_.late_land_per_mille) {
      if (media_.on_late_land_) media_.on_late_land_(*this, it->first * 64);
      std::memcpy(media_.media_.data() + it->first * 64, it->second.data.data(), 64);
      ++media_.stats_.late_lines;
      it = lines_.erase(it);
    } else {
      ++it;
    }
  }
  if (lines_.empty()) crashed_ = false;
}

}  // namespace cxlkv::coherence
