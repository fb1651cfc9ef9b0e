#include "cxlkv/coherence/sim.h"

#include <cstring>

namespace cxlkv::coherence {

SimMemory::SimMemory(std::uint64_t size_bytes, std::uint64_t seed)
    : media_((size_bytes + 63) / 64 * 64), seeds_(seed) {}

std::unique_ptr<SimMemory::HostView> SimMemory::NewView(std::uint32_t evict_per_mille) {
  return std::make_unique<HostView>(*this, seeds_(), evict_per_mille);
}

void SimMemory::ReadMedia(std::uint64_t offset, void* dst, std::size_t len) const {
  std::memcpy(dst, media_.data() + offset, len);
}

SimMemory::HostView::HostView(SimMemory& media, std::uint64_t seed, std::uint32_t evict_per_mille)
    : media_(media), rng_(seed), evict_per_mille_(evict_per_mille) {}

SimMemory::HostView::Line& SimMemory::HostView::Fill(std::uint64_t line) {
  auto [it, inserted] = lines_.try_emplace(line);
  if (inserted) std::memcpy(it->second.data.data(), media_.media_.data() + line * 64, 64);
  return it->second;
}

void SimMemory::HostView::WriteBack(std::uint64_t line, const Line& l) {
  std::memcpy(media_.media_.data() + line * 64, l.data.data(), 64);
}

void SimMemory::HostView::MaybeEvict() {
  if (lines_.empty() || rng_() % 1000 >= evict_per_mille_) return;
  auto it = lines_.begin();
  std::advance(it, static_cast<long>(rng_() % lines_.size()));
  if (it->second.dirty) WriteBack(it->first, it->second);
  lines_.erase(it);
}

void SimMemory::HostView::Read(std::uint64_t offset, void* dst, std::size_t len) {
  MaybeEvict();
  auto* out = static_cast<std::byte*>(dst);
  while (len > 0) {
    const std::uint64_t line = offset / 64, in = offset % 64;
    const std::size_t n = std::min<std::size_t>(len, 64 - in);
    std::memcpy(out, Fill(line).data.data() + in, n);
    out += n;
    offset += n;
    len -= n;
  }
}

void SimMemory::HostView::Write(std::uint64_t offset, const void* src, std::size_t len) {
  MaybeEvict();
  const auto* p = static_cast<const std::byte*>(src);
  while (len > 0) {
    const std::uint64_t line = offset / 64, in = offset % 64;
    const std::size_t n = std::min<std::size_t>(len, 64 - in);
    Line& l = Fill(line);
    std::memcpy(l.data.data() + in, p, n);
    l.dirty = true;
    p += n;
    offset += n;
    len -= n;
  }
}

void SimMemory::HostView::WriteNt(std::uint64_t offset, const void* src, std::size_t len) {
  // Streaming stores bypass the cache: the media gets the bytes, the cached copy goes.
  Write(offset, src, len);
  Invalidate(offset, len);
}

void SimMemory::HostView::Flush(std::uint64_t offset, std::size_t len) {
  if (len == 0) return;
  for (std::uint64_t line = offset / 64; line <= (offset + len - 1) / 64; ++line) {
    auto it = lines_.find(line);
    if (it != lines_.end() && it->second.dirty) {
      WriteBack(line, it->second);
      it->second.dirty = false;
    }
  }
}

void SimMemory::HostView::Invalidate(std::uint64_t offset, std::size_t len) {
  FullFence();  // the fence Invalidate ends with completes earlier evictions too
  Drop(offset, len);
}

void SimMemory::HostView::Evict(std::uint64_t offset, std::size_t len) {
  pending_evictions_.emplace_back(offset, len);
}

void SimMemory::HostView::Fence() {
  if (on_fence_) on_fence_();
}

void SimMemory::HostView::FullFence() {
  if (on_fence_) on_fence_();
  for (const auto& [offset, len] : pending_evictions_) Drop(offset, len);
  pending_evictions_.clear();
}

void SimMemory::HostView::Drop(std::uint64_t offset, std::size_t len) {
  if (len == 0) return;
  for (std::uint64_t line = offset / 64; line <= (offset + len - 1) / 64; ++line) {
    auto it = lines_.find(line);
    if (it == lines_.end()) continue;
    if (it->second.dirty) WriteBack(line, it->second);
    lines_.erase(it);
  }
}

void SimMemory::HostView::Crash() {
  for (auto& [line, l] : lines_) {
    if (l.dirty && (rng_() & 1)) WriteBack(line, l);
  }
  lines_.clear();
  pending_evictions_.clear();
}

}  // namespace cxlkv::coherence
