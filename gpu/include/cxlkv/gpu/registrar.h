// cxlkv/gpu/registrar.h — pins KV arenas for one GPU with cudaHostRegister, whole arenas at a
// time, in chunks of at most 64 GiB, on a background thread.
//
// Why a thread of its own: pinning costs time proportional to the size (every page is
// faulted in and locked; measured on an H200 host: ~0.4-0.65 s per GiB when the pages must
// be allocated, ~0.05 s per GiB when they are resident), so start-up queues the arenas and
// serving begins while they pin. To be ready sooner, prefault threads allocate the pages
// ahead of the pin (prefault.h) and chunks grow from a small first one (PlanRampChunks): a
// chunk is usable as soon as it is pinned, before the registration is finished; copies from
// memory not yet pinned are refused with kUnavailable, never silently staged. Every CUDA call
// of the registrar runs on that thread, which selects the device (cudaSetDevice) before any
// other call, so no context is ever created on device 0 by accident and the caller's own
// current device is never changed.
//
// Registrations are tracked (RegistrationTable): overlapping ranges are refused, progress and
// cost (ns per GiB) are reported, a refused chunk rolls back the chunks pinned before it and
// the error names the source, its mapping type and the fix. Destroying the registrar
// unregisters everything; unregister (or destroy the registrar) before unmapping an arena.
//
// Thread-safety: every method may be called from any thread. Callbacks run on the
// registration thread and must not call back into the registrar.
#ifndef CXLKV_GPU_REGISTRAR_H_
#define CXLKV_GPU_REGISTRAR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/gpu/plan.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace cxlkv::gpu {

// Checks that CUDA device `device` exists, without creating a context. kUnavailable: no
// usable CUDA device at all (the message carries cudaGetDeviceCount's error, e.g. "no
// CUDA-capable device is detected" or a driver/runtime mismatch); kNotFound: the ordinal is
// out of range.
absl::Status ProbeDevice(int device);

struct RegistrarOptions {
  int device = 0;
  std::uint64_t max_chunk_bytes = kMaxChunkBytes;
  // The first chunk's size; later chunks double up to max_chunk_bytes (PlanRampChunks), so
  // the start of a large arena is usable long before its end is pinned. 0: every chunk
  // max_chunk_bytes.
  std::uint64_t first_chunk_bytes = 1ull << 30;
  // Threads that fault in a registration's pages ahead of cudaHostRegister (prefault.h), for
  // sources whose pages are allocated on first touch (memfd, tmpfs, kmem, host ranges; not
  // devdax or disk files). 0: none, the driver faults them in on the registration thread.
  unsigned prefault_threads = 8;
  // Called on the registration thread after every chunk and at the end, with a snapshot.
  std::function<void(const RegistrationInfo&)> on_progress;
};

class Registrar {
 public:
  // Probes the device and starts the registration thread, which sets the device and creates
  // its primary context. kUnavailable / kNotFound as ProbeDevice; kFailedPrecondition when
  // the device cannot map host memory.
  static absl::StatusOr<std::unique_ptr<Registrar>> Create(const RegistrarOptions& options);
  // Unregisters everything (waiting for a chunk being pinned), then stops the thread.
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // Queues the whole mapping of an arena's region for registration and returns its id at
  // once. Chunks follow the region's alignment (devdax: the device alignment). kAlreadyExists
  // / kFailedPrecondition: the range is (partly) registered already.
  absl::StatusOr<std::uint64_t> RegisterArena(const pool::Arena& arena);
  absl::StatusOr<std::uint64_t> RegisterRegion(const pool::Region& region);
  // A host range of unknown backing, e.g. the pool the preload hands out as cudaHostAlloc
  // memory. addr and bytes must be multiples of 4 KiB.
  absl::StatusOr<std::uint64_t> RegisterRange(void* addr, std::uint64_t bytes,
                                              absl::string_view name);

  // Blocks until registration `id` is registered (OK) or failed (its error).
  absl::Status Wait(std::uint64_t id);
  // A snapshot of one registration / all of them: state, chunks, bytes done, cost.
  absl::StatusOr<RegistrationInfo> Info(std::uint64_t id) const;
  std::vector<RegistrationInfo> List() const;
  // Unpins a registration (cancelling chunks not yet pinned) and forgets it. Blocks until
  // done. kNotFound for an unknown id.
  absl::Status Unregister(std::uint64_t id);

  // The pinned chunk holding [host, host + bytes) whole (see RegistrationTable::Lookup).
  absl::StatusOr<PinnedSpan> Lookup(const void* host, std::uint64_t bytes) const;
  // The end of the pinned chunk holding host address a (a itself when none does).
  std::uint64_t ChunkEnd(std::uint64_t a) const;
  // Every pinned chunk as [begin, end) host addresses, sorted: a snapshot the copy engine
  // plans a whole submission against with one lock instead of one per piece.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> PinnedChunks() const;
  // Zero-copy: the device address of a pinned host address, for kernels that read blocks in
  // place (from cudaHostGetDevicePointer of its chunk). kNotFound / kUnavailable as Lookup.
  absl::StatusOr<void*> DevicePointer(const void* host) const;

  int device() const noexcept { return device_; }
  // The device uses the host address as the device address of registered memory
  // (cudaDevAttrCanUseHostPointerForRegisteredMem; true with UVA on 64-bit Linux).
  bool host_pointer_is_device_pointer() const noexcept { return host_ptr_is_dev_ptr_; }

 private:
  struct Job {
    enum class Kind { kRegister, kUnregister, kStop } kind;
    std::uint64_t id = 0;
  };
  explicit Registrar(const RegistrarOptions& options);
  absl::StatusOr<std::uint64_t> Enqueue(absl::string_view name, MappingKind kind,
                                        std::uint64_t addr, std::uint64_t bytes,
                                        std::uint64_t align);
  void Run(std::promise<absl::Status>* ready);
  void DoRegister(std::uint64_t id);
  void DoUnregister(std::uint64_t id);
  void Unpin(std::uint64_t host_addr, const std::vector<ChunkPlan>& chunks, std::uint32_t n);

  const int device_;
  const std::uint64_t max_chunk_bytes_;
  const std::uint64_t first_chunk_bytes_;
  const unsigned prefault_threads_;
  const std::function<void(const RegistrationInfo&)> on_progress_;
  bool host_ptr_is_dev_ptr_ = false;

  // Guards the table, the job queue and the cancellations (base::Mutex: docs/architecture.md).
  mutable base::Mutex mu_;
  base::CondVar cv_;  // a job queued, or a registration changed state
  RegistrationTable table_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Ids whose remaining chunks are cancelled.
  std::vector<std::uint64_t> cancel_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_REGISTRAR_H_
