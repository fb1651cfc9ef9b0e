#include "cxlkv/gpu/copy_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "paged_copy.h"

namespace cxlkv::gpu {
namespace {

using internal::CudaStatus;

constexpr const char* kWhat = "copy engine";

std::uint64_t AlignUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Staging layout of one kernel slot: block addresses, pages, layer bases.
struct StageLayout {
  std::uint64_t pages_off, bases_off, bytes;
  StageLayout(std::uint64_t n_blocks, std::uint64_t layers) {
    pages_off = 8 * n_blocks;
    bases_off = AlignUp(pages_off + 4 * n_blocks, 16);
    bytes = bases_off + 8 * layers;
  }
};

}  // namespace

CopyEngine::CopyEngine(Registrar& registrar, const CopyEngineOptions& options)
    : registrar_(registrar), options_(options) {}

absl::StatusOr<std::unique_ptr<CopyEngine>> CopyEngine::Create(Registrar& registrar,
                                                               const CopyEngineOptions& options) {
  if (options.max_kernel_blocks == 0 || options.kernel_slots == 0) {
    return absl::InvalidArgumentError(
        "copy engine: max_kernel_blocks and kernel_slots must be at least 1");
  }
  std::unique_ptr<CopyEngine> e(new CopyEngine(registrar, options));
  if (absl::Status st = e->Init(); !st.ok()) return st;
  return e;
}

absl::Status CopyEngine::SetDevice() const {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == registrar_.device()) return absl::OkStatus();
  CXLKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(registrar_.device()), kWhat);
  return absl::OkStatus();
}

absl::Status CopyEngine::Init() {
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  for (cudaStream_t& s : streams_) {
    CXLKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), kWhat);
  }
  const StageLayout layout(options_.max_kernel_blocks, kMaxLayers);
  base::MutexLock lock(mu_);  // no other thread sees the engine yet: for the analysis
  slots_.resize(options_.kernel_slots);
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    CXLKV_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&slots_[i].host, layout.bytes, cudaHostAllocDefault),
                               kWhat);
    CXLKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&slots_[i].device, layout.bytes), kWhat);
    free_slots_.push_back(static_cast<int>(i));
  }
  return absl::OkStatus();
}

CopyEngine::~CopyEngine() {
  if (!SetDevice().ok()) return;  // the device is gone: nothing can be freed on it
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  for (InFlight& f : in_flight_) {
    // Done now (the streams drained): their D2H lines leave the cache as Poll would have.
    if (!f.writeback.empty()) WriteBackHostRanges(f.writeback);
    cudaEventDestroy(f.event);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  for (Slot& s : slots_) {
    if (s.host != nullptr) cudaFreeHost(s.host);
    if (s.device != nullptr) cudaFree(s.device);
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

absl::Status CopyEngine::RetireLocked(bool wait_oldest) {
  if (wait_oldest && !in_flight_.empty()) {
    const cudaError_t e = cudaEventSynchronize(in_flight_.front().event);
    if (e != cudaSuccess && sticky_.ok()) sticky_ = CudaStatus(e, kWhat, "cudaEventSynchronize");
  }
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    const cudaError_t e = cudaEventQuery(it->event);
    if (e == cudaErrorNotReady) {
      ++it;
      continue;
    }
    if (e != cudaSuccess && sticky_.ok()) sticky_ = CudaStatus(e, kWhat, "cudaEventQuery");
    // The copies are done: before anyone learns so (and may publish the blocks), the lines
    // a device-to-host copy wrote leave this host's cache (dma_writeback.h).
    if (!it->writeback.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      stats_.writeback_bytes += WriteBackHostRanges(it->writeback);
      stats_.writeback_ns +=
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
    }
    free_events_.push_back(it->event);
    if (it->slot >= 0) free_slots_.push_back(it->slot);
    it = in_flight_.erase(it);
  }
  return sticky_;
}

absl::StatusOr<cudaEvent_t> CopyEngine::TakeEventLocked() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CXLKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kWhat);
  return e;
}

absl::StatusOr<int> CopyEngine::TakeSlotLocked() {
  while (free_slots_.empty()) {
    if (in_flight_.empty()) return absl::InternalError("copy engine: kernel slots lost");
    if (absl::Status st = RetireLocked(/*wait_oldest=*/true); !st.ok()) return st;
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

absl::Status CopyEngine::EnqueueMemcpy(const PagedCache& cache, Direction dir,
                                       std::span<const BlockCopy> blocks, std::uint32_t lb,
                                       std::uint32_t le, cudaStream_t s) {
  PlanOptions po;
  po.layer_begin = lb;
  po.layer_end = le;
  po.max_op_bytes = options_.max_op_bytes;
  // One snapshot of the pinned chunks for the whole plan (a lock per piece would cost more
  // than the planning for layer-separate caches: 2 x layers pieces per block).
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> pinned = registrar_.PinnedChunks();
  auto chunk_of = [&](std::uint64_t a) {
    auto it = std::upper_bound(pinned.begin(), pinned.end(),
                               std::pair<std::uint64_t, std::uint64_t>{a, ~0ull});
    return it == pinned.begin() || std::prev(it)->second <= a ? pinned.end() : std::prev(it);
  };
  po.host_chunk_end = [&](std::uint64_t a) {
    auto it = chunk_of(a);
    return it == pinned.end() ? a : it->second;
  };
  auto plan = PlanCopies(cache, dir, blocks, po);
  if (!plan.ok()) return plan.status();
  // Every host side must be pinned before anything is queued: a copy from pageable memory
  // would silently run synchronously through a staging buffer.
  for (const CopyOp& op : plan->ops) {
    const std::uint64_t host = dir == Direction::kHostToDevice ? op.src : op.dst;
    auto it = chunk_of(host);
    if (it == pinned.end() || host + op.bytes > it->second) {
      // The registrar says why (not registered, still pinning, across a chunk end).
      auto span = registrar_.Lookup(reinterpret_cast<const void*>(host), op.bytes);
      return span.ok() ? absl::InternalError("copy engine: pinned chunks changed while planning")
                       : span.status();
    }
  }
  for (const CopyOp& op : plan->ops) {
    CXLKV_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(reinterpret_cast<void*>(op.dst), reinterpret_cast<const void*>(op.src),
                        op.bytes, cudaMemcpyDefault, s),
        kWhat);
  }
  stats_.memcpy_ops += plan->ops.size();
  stats_.segments += plan->segments;
  stats_.bytes += plan->bytes;
  return absl::OkStatus();
}

absl::Status CopyEngine::EnqueueKernel(const PagedCache& cache, Direction dir,
                                       std::span<const BlockCopy> blocks, std::uint32_t lb,
                                       std::uint32_t le, cudaStream_t s, int slot, bool stage) {
  // Stage the descriptors: device-visible block addresses, pages and layer bases (once for
  // the launches of a layer-wise submission, which share the slot).
  const StageLayout layout(blocks.size(), cache.layers);
  auto* host = static_cast<std::byte*>(slots_[slot].host);
  auto* addrs = reinterpret_cast<std::uint64_t*>(host);
  auto* pages = reinterpret_cast<std::uint32_t*>(host + layout.pages_off);
  auto* bases = reinterpret_cast<std::uint64_t*>(host + layout.bases_off);
  const std::uint64_t block_bytes = cache.BlockBytes();
  for (std::size_t i = 0; stage && i < blocks.size(); ++i) {
    const BlockCopy& b = blocks[i];
    auto first = registrar_.Lookup(reinterpret_cast<const void*>(b.host_addr), 1);
    if (!first.ok()) return first.status();
    if (b.host_addr + block_bytes <= first->chunk_host_end) {
      addrs[i] = first->DeviceAddr(b.host_addr);
    } else {
      // The block spans chunks: fine when device addresses are the host addresses.
      auto last =
          registrar_.Lookup(reinterpret_cast<const void*>(b.host_addr + block_bytes - 1), 1);
      if (!last.ok()) return last.status();
      if (!registrar_.host_pointer_is_device_pointer()) {
        return absl::FailedPreconditionError(
            absl::StrCat("block list entry ", i,
                         " spans two registration chunks and this device does not "
                         "use host addresses for registered memory; use CopyMethod::kCopyEngine"));
      }
      addrs[i] = b.host_addr;
    }
    pages[i] = b.page;
  }
  if (stage) {
    std::memcpy(bases, cache.layer_base.data(), sizeof(*bases) * cache.layers);
    CXLKV_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(slots_[slot].device, host, layout.bytes, cudaMemcpyHostToDevice, s), kWhat);
  }
  const auto* dev = static_cast<const std::byte*>(slots_[slot].device);
  internal::PagedCopyArgs args{reinterpret_cast<const std::uint64_t*>(dev),
                               reinterpret_cast<const std::uint32_t*>(dev + layout.pages_off),
                               reinterpret_cast<const std::uint64_t*>(dev + layout.bases_off),
                               static_cast<std::uint32_t>(blocks.size())};
  // One launch for the layer range (a layer-wise submission launches once per layer and
  // records an event between them).
  const internal::PagedCopyGeometry g{cache.chunk_bytes,
                                      cache.page_stride_bytes,
                                      cache.kv_stride_bytes,
                                      cache.kv_parts,
                                      lb,
                                      le - lb,
                                      dir == Direction::kHostToDevice ? 1u : 0u};
  CXLKV_CUDA_RETURN_IF_ERROR(internal::LaunchPagedCopy(args, g, s), kWhat);
  stats_.kernel_launches += 1;
  stats_.segments += blocks.size() * (le - lb) * cache.kv_parts;
  stats_.bytes += blocks.size() * (le - lb) * cache.kv_parts * cache.chunk_bytes;
  return absl::OkStatus();
}

absl::StatusOr<Ticket> CopyEngine::Submit(const PagedCache& cache, Direction dir,
                                          std::span<const BlockCopy> blocks,
                                          const SubmitOptions& options) {
  const std::uint32_t lb = options.layer_begin;
  const std::uint32_t le = options.layer_end == 0 ? cache.layers : options.layer_end;
  if (absl::Status st = ValidateBlocks(cache, dir, blocks, lb, le); !st.ok()) return st;
  if (options.method == CopyMethod::kKernel && blocks.size() > options_.max_kernel_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel copy of ", blocks.size(), " blocks: at most ", options_.max_kernel_blocks,
        " per submission (CopyEngineOptions::max_kernel_blocks); split the list"));
  }
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  base::MutexLock lock(mu_);
  if (absl::Status st = RetireLocked(false); !st.ok()) return st;
  cudaStream_t s = stream(dir);
  auto ev = TakeEventLocked();
  if (!ev.ok()) return ev.status();
  int slot = -1;
  absl::Status st;
  if (options.has_after || options.after != nullptr) {
    // The copy starts after the work queued so far on `after`: an event on it, waited here.
    st = [&]() -> absl::Status {
      CXLKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(*ev, options.after), kWhat);
      CXLKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, *ev, 0), kWhat);
      return absl::OkStatus();
    }();
  }
  if (st.ok() && options.method == CopyMethod::kKernel) {
    auto taken = TakeSlotLocked();
    if (!taken.ok()) {
      st = taken.status();
    } else {
      slot = *taken;
      st = EnqueueKernel(cache, dir, blocks, lb, le, s, slot, /*stage=*/true);
    }
  } else if (st.ok()) {
    st = EnqueueMemcpy(cache, dir, blocks, lb, le, s);
  }
  if (st.ok()) {
    if (cudaError_t e = cudaEventRecord(*ev, s); e != cudaSuccess) {
      st = CudaStatus(e, kWhat, "cudaEventRecord");
    }
  }
  if (!st.ok()) {
    free_events_.push_back(*ev);
    if (slot >= 0) {
      // The staging copy may have been queued: free the slot only after the stream drains.
      cudaStreamSynchronize(s);
      free_slots_.push_back(slot);
    }
    return st;
  }
  const Ticket t = next_ticket_++;
  std::vector<HostRange> writeback;
  if (dir == Direction::kDeviceToHost && options_.dma_writeback == DmaWriteback::kWriteBack) {
    writeback = HostRangesWritten(cache, blocks, lb, le);
  }
  in_flight_.push_back(InFlight{t, *ev, slot, std::move(writeback)});
  ++stats_.submits;
  return t;
}

absl::StatusOr<std::vector<Ticket>> CopyEngine::SubmitLayers(const PagedCache& cache,
                                                             std::span<const BlockCopy> blocks,
                                                             CopyMethod method) {
  constexpr Direction dir = Direction::kHostToDevice;
  if (absl::Status st = ValidateBlocks(cache, dir, blocks, 0, cache.layers); !st.ok()) return st;
  if (method == CopyMethod::kKernel && blocks.size() > options_.max_kernel_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel copy of ", blocks.size(), " blocks: at most ", options_.max_kernel_blocks,
        " per submission (CopyEngineOptions::max_kernel_blocks); split the list"));
  }
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  // Check every piece is pinned before the first layer is queued.
  const std::uint64_t block_bytes = cache.BlockBytes();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (std::uint64_t a : {blocks[i].host_addr, blocks[i].host_addr + block_bytes - 1}) {
      if (auto span = registrar_.Lookup(reinterpret_cast<const void*>(a), 1); !span.ok()) {
        return absl::Status(span.status().code(),
                            absl::StrCat("block list entry ", i, ": ", span.status().message()));
      }
    }
  }
  std::vector<Ticket> tickets;
  base::MutexLock lock(mu_);
  if (absl::Status st = RetireLocked(false); !st.ok()) return st;
  cudaStream_t s = stream(dir);
  int slot = -1;
  if (method == CopyMethod::kKernel) {
    auto taken = TakeSlotLocked();
    if (!taken.ok()) return taken.status();
    slot = *taken;
  }
  for (std::uint32_t l = 0; l < cache.layers; ++l) {
    auto ev = TakeEventLocked();
    absl::Status st = ev.status();
    if (st.ok()) {
      st = method == CopyMethod::kKernel
               ? EnqueueKernel(cache, dir, blocks, l, l + 1, s, slot, /*stage=*/l == 0)
               : EnqueueMemcpy(cache, dir, blocks, l, l + 1, s);
    }
    if (st.ok()) {
      if (cudaError_t e = cudaEventRecord(*ev, s); e != cudaSuccess) {
        st = CudaStatus(e, kWhat, "cudaEventRecord");
      }
    }
    if (!st.ok()) {
      // Layers already queued keep their tickets' events; the caller sees the error and
      // the queued layers still complete (the slot is released with the last of them).
      if (ev.ok()) free_events_.push_back(*ev);
      if (slot >= 0) {
        cudaStreamSynchronize(s);
        free_slots_.push_back(slot);
      }
      return st;
    }
    const Ticket t = next_ticket_++;
    // The slot's descriptors serve every layer: released with the last layer.
    in_flight_.push_back(InFlight{t, *ev, l + 1 == cache.layers ? slot : -1, {}});
    tickets.push_back(t);
    ++stats_.submits;
  }
  return tickets;
}

absl::Status CopyEngine::Poll(Ticket t) {
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  base::MutexLock lock(mu_);
  if (t == 0 || t >= next_ticket_) {
    return absl::NotFoundError(absl::StrCat("ticket ", t, " was not issued by this engine"));
  }
  absl::Status st = RetireLocked(false);  // not const: returned by move
  for (const InFlight& f : in_flight_) {
    if (f.ticket == t) {
      return st.ok() ? absl::UnavailableError(absl::StrCat("ticket ", t, " is still copying")) : st;
    }
  }
  return st;
}

absl::Status CopyEngine::Wait(Ticket t) {
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  for (;;) {
    cudaEvent_t ev = nullptr;
    {
      base::MutexLock lock(mu_);
      if (t == 0 || t >= next_ticket_) {
        return absl::NotFoundError(absl::StrCat("ticket ", t, " was not issued by this engine"));
      }
      absl::Status st = RetireLocked(false);  // not const: returned by move
      for (const InFlight& f : in_flight_) {
        if (f.ticket == t) ev = f.event;
      }
      if (ev == nullptr) return st;
    }
    // The event may be retired and reused by another thread meanwhile; then this waits for
    // later work too, and the loop looks again.
    cudaEventSynchronize(ev);
  }
}

absl::Status CopyEngine::Drain() {
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  for (cudaStream_t s : streams_) {
    if (s == nullptr) continue;
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return CudaStatus(e, kWhat, "cudaStreamSynchronize");
  }
  base::MutexLock lock(mu_);
  return RetireLocked(false);
}

absl::Status CopyEngine::StreamWait(Ticket t, cudaStream_t stream) {
  if (absl::Status st = SetDevice(); !st.ok()) return st;
  base::MutexLock lock(mu_);
  if (t == 0 || t >= next_ticket_) {
    return absl::NotFoundError(absl::StrCat("ticket ", t, " was not issued by this engine"));
  }
  for (const InFlight& f : in_flight_) {
    if (f.ticket == t) {
      CXLKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, f.event, 0), kWhat);
      return absl::OkStatus();
    }
  }
  return sticky_;  // already complete (retired)
}

CopyEngineStats CopyEngine::stats() const {
  base::MutexLock lock(mu_);
  return stats_;
}

}  // namespace cxlkv::gpu
