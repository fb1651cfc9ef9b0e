#include "cxlkv/preload/stats.h"

#include "absl/strings/str_cat.h"

namespace cxlkv::preload {
namespace {

void Lock(std::atomic_flag& f) noexcept {
  while (f.test_and_set(std::memory_order_acquire)) {
  }
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", c < 0x10 ? "0" : "", absl::Hex(c));
      continue;
    }
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

const char* AllocClassName(AllocClass c) noexcept {
  switch (c) {
    case AllocClass::kMalloc:
      return "malloc";
    case AllocClass::kCuda:
      return "cuda_host";
    case AllocClass::kMmap:
      return "mmap";
  }
  return "?";
}

void ThreadStats::AddTo(StatsSnapshot* s) const noexcept {
  for (int c = 0; c < kAllocClasses; ++c) {
    for (int r = 0; r < kRoutes; ++r) {
      s->allocs[c][r] += allocs[c][r].load(std::memory_order_relaxed);
      s->bytes[c][r] += bytes[c][r].load(std::memory_order_relaxed);
      s->frees[c][r] += frees[c][r].load(std::memory_order_relaxed);
    }
  }
  for (int r = 0; r < kRoutes; ++r) {
    for (int b = 0; b < kSizeBuckets; ++b) {
      s->by_size[r][b] += by_size[r][b].load(std::memory_order_relaxed);
    }
  }
}

void ThreadStats::Reset() noexcept {
  for (int c = 0; c < kAllocClasses; ++c) {
    for (int r = 0; r < kRoutes; ++r) {
      allocs[c][r].store(0, std::memory_order_relaxed);
      bytes[c][r].store(0, std::memory_order_relaxed);
      frees[c][r].store(0, std::memory_order_relaxed);
    }
  }
  for (auto& route : by_size) {
    for (auto& b : route) b.store(0, std::memory_order_relaxed);
  }
  next = prev = nullptr;
  linked = false;
}

void StatsRegistry::Link(ThreadStats* t) noexcept {
  Lock(lock_);
  t->prev = nullptr;
  t->next = head_;
  if (head_ != nullptr) head_->prev = t;
  head_ = t;
  t->linked = true;
  lock_.clear(std::memory_order_release);
}

void StatsRegistry::Retire(ThreadStats* t) noexcept {
  Lock(lock_);
  if (t->linked) {
    t->AddTo(&retired_);
    if (t->prev != nullptr) t->prev->next = t->next;
    if (t->next != nullptr) t->next->prev = t->prev;
    if (head_ == t) head_ = t->next;
    t->linked = false;
  }
  lock_.clear(std::memory_order_release);
}

void StatsRegistry::AfterForkChild() noexcept {
  // Other threads' TLS blocks no longer exist in the child; their counts stay in the
  // parent's totals. The child starts from zero with only the forking thread.
  lock_.clear(std::memory_order_release);
  head_ = nullptr;
  retired_ = StatsSnapshot{};
  reallocs_to_cxl = 0;
  reallocs_to_pass = 0;
  fallbacks = 0;
  cuda_registered = 0;
  cuda_unregistered = 0;
  cuda_split_registrations = 0;
  cuda_split_chunks = 0;
  shm_bound = 0;
  shm_bound_bytes = 0;
  shm_passed = 0;
}

StatsSnapshot StatsRegistry::Snapshot() const noexcept {
  Lock(lock_);
  StatsSnapshot s = retired_;
  for (const ThreadStats* t = head_; t != nullptr; t = t->next) t->AddTo(&s);
  lock_.clear(std::memory_order_release);
  s.reallocs_to_cxl = reallocs_to_cxl.load(std::memory_order_relaxed);
  s.reallocs_to_pass = reallocs_to_pass.load(std::memory_order_relaxed);
  s.fallbacks = fallbacks.load(std::memory_order_relaxed);
  s.cuda_registered = cuda_registered.load(std::memory_order_relaxed);
  s.cuda_unregistered = cuda_unregistered.load(std::memory_order_relaxed);
  s.cuda_split_registrations = cuda_split_registrations.load(std::memory_order_relaxed);
  s.cuda_split_chunks = cuda_split_chunks.load(std::memory_order_relaxed);
  s.shm_bound = shm_bound.load(std::memory_order_relaxed);
  s.shm_bound_bytes = shm_bound_bytes.load(std::memory_order_relaxed);
  s.shm_passed = shm_passed.load(std::memory_order_relaxed);
  return s;
}

std::string RenderStatsJson(const StatsSnapshot& s, const StatsContext& ctx) {
  static constexpr const char* kRouteNames[kRoutes] = {"pass", "cxl"};
  static constexpr const char* kBucketNames[kSizeBuckets] = {"le_64", "le_1k", "le_64k", "le_1m",
                                                             "gt_1m"};
  std::string j =
      absl::StrCat("{\n  \"pid\": ", ctx.pid, ",\n  \"pool\": ", Quote(ctx.pool),
                   ",\n  \"state\": ", Quote(ctx.state), ",\n  \"detail\": ", Quote(ctx.reason),
                   ",\n  \"min_bytes\": ", ctx.min_bytes, ",\n  \"heap_bytes\": ", ctx.heap_bytes,
                   ",\n  \"classes\": {");
  for (int c = 0; c < kAllocClasses; ++c) {
    absl::StrAppend(&j, c ? "," : "", "\n    ", Quote(AllocClassName(static_cast<AllocClass>(c))),
                    ": {");
    for (int r = 0; r < kRoutes; ++r) {
      absl::StrAppend(&j, r ? ", " : "", "\"", kRouteNames[r], "\": {\"allocs\": ", s.allocs[c][r],
                      ", \"bytes\": ", s.bytes[c][r], ", \"frees\": ", s.frees[c][r], "}");
    }
    absl::StrAppend(&j, "}");
  }
  absl::StrAppend(&j, "\n  },\n  \"sizes\": {");
  for (int r = 0; r < kRoutes; ++r) {
    absl::StrAppend(&j, r ? "," : "", "\n    \"", kRouteNames[r], "\": {");
    for (int b = 0; b < kSizeBuckets; ++b) {
      absl::StrAppend(&j, b ? ", " : "", "\"", kBucketNames[b], "\": ", s.by_size[r][b]);
    }
    absl::StrAppend(&j, "}");
  }
  absl::StrAppend(
      &j, "\n  },\n  \"reallocs_to_cxl\": ", s.reallocs_to_cxl,
      ",\n  \"reallocs_to_pass\": ", s.reallocs_to_pass, ",\n  \"fallbacks\": ", s.fallbacks,
      ",\n  \"cuda_registered\": ", s.cuda_registered,
      ",\n  \"cuda_unregistered\": ", s.cuda_unregistered,
      ",\n  \"cuda_split_registrations\": ", s.cuda_split_registrations,
      ",\n  \"cuda_split_chunks\": ", s.cuda_split_chunks, ",\n  \"shm_bound\": ", s.shm_bound,
      ",\n  \"shm_bound_bytes\": ", s.shm_bound_bytes, ",\n  \"shm_passed\": ", s.shm_passed,
      "\n}\n");
  return j;
}

}  // namespace cxlkv::preload
