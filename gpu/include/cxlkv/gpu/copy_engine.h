// cxlkv/gpu/copy_engine.h — batched asynchronous block copies between registered arenas and
// a paged KV cache in device memory, both directions, with a layer-wise pipeline.
//
// A Submit takes a list of (host block, device page) pairs and one of two methods:
//   kCopyEngine  PlanCopies (plan.h) coalesces the pieces and each op is one
//                cudaMemcpyAsync on the direction's stream (the GPU's DMA engines);
//   kKernel      one launch of the gather/scatter kernel moves every piece, reading or
//                writing the host blocks in place through their zero-copy device addresses
//                (cudaHostGetDevicePointer); best for many small scattered pieces.
// Each Submit records an event and returns a Ticket; Poll/Wait complete it. Host blocks must
// lie in registrations that are finished (Registrar::Wait), else kUnavailable.
//
// Layer-wise: SubmitLayers queues one submission per layer, in layer order, on the
// host-to-device stream, each with its own event, and returns a ticket per layer; a compute
// stream then waits for layer i alone (StreamWait) so layer i loads while layer i-1
// computes. The other way, Submit with `after` = the compute stream stores a layer as soon
// as the compute work queued so far on that stream is done.
//
// Device-to-host copies: once a ticket's copies are done, and before Poll/Wait/Drain report
// it, the engine writes back the host lines they wrote (dma_writeback.h: a DMA write may sit
// dirty in this host's cache, where another host cannot see it), unless the options say the
// platform writes DMA to memory.
//
// Streams: one non-blocking stream per direction, owned by the engine. Completion order
// within a direction is submission order.
//
// Thread-safety: all methods may be called from any thread. Each call makes the engine's
// device current on the calling thread (cudaSetDevice; cheap when it already is) and leaves
// it so: call from threads that drive this device. Tickets of one engine only.
#ifndef CXLKV_GPU_COPY_ENGINE_H_
#define CXLKV_GPU_COPY_ENGINE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/gpu/dma_writeback.h"
#include "cxlkv/gpu/plan.h"
#include "cxlkv/gpu/registrar.h"

namespace cxlkv::gpu {

enum class CopyMethod : std::uint8_t { kCopyEngine, kKernel };

struct CopyEngineOptions {
  // Coalesced copies longer than this are split (see PlanOptions::max_op_bytes).
  std::uint64_t max_op_bytes = 64ull << 20;
  // Descriptor buffers for kernel launches (blocks per launch and launches in flight).
  std::uint32_t max_kernel_blocks = 16384;
  std::uint32_t kernel_slots = 8;
  // What happens to the host lines a device-to-host copy wrote (dma_writeback.h).
  DmaWriteback dma_writeback = DmaWriteback::kWriteBack;
};

struct SubmitOptions {
  CopyMethod method = CopyMethod::kCopyEngine;
  std::uint32_t layer_begin = 0;
  std::uint32_t layer_end = 0;  // 0: all layers
  // When set, the copy starts only after the work queued on this stream so far (e.g. the
  // compute stream that produced the layer being stored).
  cudaStream_t after = nullptr;
  bool has_after = false;  // `after` may legitimately be the legacy default stream (0)
};

using Ticket = std::uint64_t;

struct CopyEngineStats {
  std::uint64_t submits = 0;
  std::uint64_t memcpy_ops = 0;  // cudaMemcpyAsync calls issued
  std::uint64_t segments = 0;    // (block, layer, part) pieces before coalescing
  std::uint64_t kernel_launches = 0;
  std::uint64_t bytes = 0;
  std::uint64_t writeback_bytes = 0;  // host bytes written back after D2H copies
  std::uint64_t writeback_ns = 0;     // time spent writing them back
};

class CopyEngine {
 public:
  // Creates the streams and buffers on the registrar's device. The registrar must outlive
  // the engine.
  static absl::StatusOr<std::unique_ptr<CopyEngine>> Create(Registrar& registrar,
                                                            const CopyEngineOptions& options = {});
  // Waits for everything submitted, then frees streams, events and buffers.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Validates (plan.h rules, plus: every host piece pinned) and enqueues the copies. Nothing
  // is enqueued when validation fails. Cost: O(pieces log pieces) on the host.
  absl::StatusOr<Ticket> Submit(const PagedCache& cache, Direction dir,
                                std::span<const BlockCopy> blocks,
                                const SubmitOptions& options = {});
  // Host-to-device, one submission per layer in order; ticket i completes when layer i of
  // every block is on the device.
  absl::StatusOr<std::vector<Ticket>> SubmitLayers(const PagedCache& cache,
                                                   std::span<const BlockCopy> blocks,
                                                   CopyMethod method = CopyMethod::kCopyEngine);

  // OK when the ticket's copies are done; kUnavailable while they run; the CUDA error when
  // they failed; kNotFound for a ticket this engine never issued.
  absl::Status Poll(Ticket t);
  // Blocks until done (OK) or failed.
  absl::Status Wait(Ticket t);
  // Makes `stream` wait (on the device, not the host) for ticket t.
  absl::Status StreamWait(Ticket t, cudaStream_t stream);
  // Blocks until every copy submitted so far is done (before host memory they use is
  // unregistered: a revoked extent's pages must stop being DMA targets). The first failure
  // seen, as Poll.
  absl::Status Drain();

  CopyEngineStats stats() const;
  cudaStream_t stream(Direction d) const noexcept { return streams_[static_cast<int>(d)]; }
  Registrar& registrar() const noexcept { return registrar_; }

 private:
  struct InFlight {
    Ticket ticket;
    cudaEvent_t event;
    int slot;  // kernel descriptor slot held until done, or -1
    std::vector<HostRange> writeback;  // D2H: host ranges to write back once done
  };
  struct Slot {
    void* host = nullptr;    // pinned staging: block addrs | pages | layer bases
    void* device = nullptr;  // the same, on the device
  };

  CopyEngine(Registrar& registrar, const CopyEngineOptions& options);
  absl::Status Init();
  absl::Status SetDevice() const;
  // Retires finished tickets at the front; with `wait`, waits for the oldest.
  absl::Status RetireLocked(bool wait_oldest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<cudaEvent_t> TakeEventLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int> TakeSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnqueueMemcpy(const PagedCache& cache, Direction dir,
                             std::span<const BlockCopy> blocks, std::uint32_t lb, std::uint32_t le,
                             cudaStream_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnqueueKernel(const PagedCache& cache, Direction dir,
                             std::span<const BlockCopy> blocks, std::uint32_t lb, std::uint32_t le,
                             cudaStream_t s, int slot, bool stage)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Registrar& registrar_;
  const CopyEngineOptions options_;
  cudaStream_t streams_[2] = {nullptr, nullptr};

  // Guards everything below (base::Mutex: docs/architecture.md).
  mutable base::Mutex mu_;
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);  // submission order
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  // The first asynchronous failure seen.
  absl::Status sticky_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
  CopyEngineStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_COPY_ENGINE_H_
