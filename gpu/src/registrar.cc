#include "cxlkv/gpu/registrar.h"

#include <cuda_runtime_api.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <algorithm>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/gpu/prefault.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::gpu {
namespace {

using internal::CudaStatus;
using internal::NowNs;

constexpr unsigned kRegisterFlags = cudaHostRegisterPortable | cudaHostRegisterMapped;

MappingKind KindOf(const pool::Region& region) {
  switch (region.spec().kind) {
    case pool::SourceKind::kDevdax:
      return MappingKind::kDevdax;
    case pool::SourceKind::kKmem:
      return MappingKind::kKmem;
    case pool::SourceKind::kMemfd:
      return MappingKind::kMemfd;
    case pool::SourceKind::kFile: {
      struct statfs fs {};
      if (::fstatfs(region.fd(), &fs) == 0 &&
          (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC)) {
        return MappingKind::kFileTmpfs;
      }
      return MappingKind::kFileDisk;
    }
  }
  return MappingKind::kHost;
}

}  // namespace

absl::Status ProbeDevice(int device) {
  // cudaGetDeviceCount initializes the runtime but creates no context.
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount: ",
        err == cudaSuccess ? "0 devices"
                           : absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err)),
        " (check nvidia-smi, the driver, and CUDA_VISIBLE_DEVICES)"));
  }
  if (device < 0 || device >= count) {
    return absl::NotFoundError(absl::StrCat("CUDA device ", device, " does not exist: this ",
                                            "process sees ", count, " (0..", count - 1,
                                            "; CUDA_VISIBLE_DEVICES renumbers them)"));
  }
  return absl::OkStatus();
}

Registrar::Registrar(const RegistrarOptions& options)
    : device_(options.device),
      max_chunk_bytes_(options.max_chunk_bytes),
      first_chunk_bytes_(options.first_chunk_bytes),
      prefault_threads_(options.prefault_threads),
      on_progress_(options.on_progress) {}

absl::StatusOr<std::unique_ptr<Registrar>> Registrar::Create(const RegistrarOptions& options) {
  if (absl::Status st = ProbeDevice(options.device); !st.ok()) return st;
  if (options.max_chunk_bytes < kHostPageBytes || options.max_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("registrar: max_chunk_bytes ",
                                                   options.max_chunk_bytes,
                                                   " must be between 4 KiB and 64 GiB"));
  }
  std::unique_ptr<Registrar> r(new Registrar(options));
  std::promise<absl::Status> ready;
  std::future<absl::Status> started = ready.get_future();
  r->thread_ = std::thread([p = r.get(), &ready] { p->Run(&ready); });
  absl::Status st = started.get();
  if (!st.ok()) {
    r->thread_.join();  // Run returns after a failed start
    r->thread_ = std::thread();
    return st;
  }
  return r;
}

Registrar::~Registrar() {
  if (!thread_.joinable()) return;
  {
    base::MutexLock lock(mu_);
    for (const RegistrationInfo* r : table_.All()) {
      cancel_.push_back(r->id);
      jobs_.push_back(Job{Job::Kind::kUnregister, r->id});
    }
    jobs_.push_back(Job{Job::Kind::kStop, 0});
  }
  cv_.NotifyAll();
  thread_.join();
}

void Registrar::Run(std::promise<absl::Status>* ready) {
  // The device first: every later call of this thread, including the implicit primary
  // context creation, goes to device_ (never to the default device 0).
  const std::string what = absl::StrCat("CUDA device ", device_);
  absl::Status st = absl::OkStatus();
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    st = CudaStatus(e, what, "cudaSetDevice");
  }
  int can_map = 0, host_ptr = 0;
  if (st.ok()) {
    if (cudaError_t e = cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device_);
        e != cudaSuccess) {
      st = CudaStatus(e, what, "cudaDeviceGetAttribute");
    } else if (can_map == 0) {
      st = absl::FailedPreconditionError(
          absl::StrCat(what,
                       " cannot map host memory (cudaDevAttrCanMapHostMemory is 0); "
                       "arenas cannot be registered for it"));
    }
  }
  if (st.ok()) {
    cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, device_);
    host_ptr_is_dev_ptr_ = host_ptr != 0;
  }
  const bool ok = st.ok();
  ready->set_value(std::move(st));
  if (!ok) return;

  for (;;) {
    Job job;
    {
      base::MutexLock lock(mu_);
      while (jobs_.empty()) cv_.Wait(mu_);
      job = jobs_.front();
      jobs_.pop_front();
    }
    switch (job.kind) {
      case Job::Kind::kRegister:
        DoRegister(job.id);
        break;
      case Job::Kind::kUnregister:
        DoUnregister(job.id);
        break;
      case Job::Kind::kStop:
        return;
    }
    cv_.NotifyAll();
  }
}

absl::StatusOr<std::uint64_t> Registrar::Enqueue(absl::string_view name, MappingKind kind,
                                                 std::uint64_t addr, std::uint64_t bytes,
                                                 std::uint64_t align) {
  std::uint64_t id;
  {
    base::MutexLock lock(mu_);
    auto added =
        table_.Add(name, kind, addr, bytes, align, max_chunk_bytes_, NowNs(), first_chunk_bytes_);
    if (!added.ok()) return added.status();
    id = *added;
    jobs_.push_back(Job{Job::Kind::kRegister, id});
  }
  cv_.NotifyAll();
  return id;
}

absl::StatusOr<std::uint64_t> Registrar::RegisterArena(const pool::Arena& arena) {
  return RegisterRegion(arena.region());
}

absl::StatusOr<std::uint64_t> Registrar::RegisterRegion(const pool::Region& region) {
  const std::uint64_t align = std::max<std::uint64_t>(region.alignment(), kHostPageBytes);
  return Enqueue(region.name(), KindOf(region), reinterpret_cast<std::uintptr_t>(region.addr()),
                 region.size_bytes(), align);
}

absl::StatusOr<std::uint64_t> Registrar::RegisterRange(void* addr, std::uint64_t bytes,
                                                       absl::string_view name) {
  return Enqueue(name, MappingKind::kHost, reinterpret_cast<std::uintptr_t>(addr), bytes,
                 kHostPageBytes);
}

void Registrar::Unpin(std::uint64_t host_addr, const std::vector<ChunkPlan>& chunks,
                      std::uint32_t n) {
  for (std::uint32_t c = 0; c < n; ++c) {
    // A failure here means the chunk was not registered by us (nothing to undo).
    cudaHostUnregister(reinterpret_cast<void*>(host_addr + chunks[c].offset));
  }
}

void Registrar::DoRegister(std::uint64_t id) {
  std::uint64_t host = 0;
  std::vector<ChunkPlan> chunks;
  std::string name;
  MappingKind kind;
  {
    base::MutexLock lock(mu_);
    const RegistrationInfo* r = table_.Find(id);
    if (r == nullptr || r->state != RegState::kQueued) return;
    host = r->host_addr;
    chunks = r->chunks;
    name = r->name;
    kind = r->kind;
    table_.Find(id)->started_ns = NowNs();
  }
  // Pages allocated on first touch are faulted in by several threads ahead of the pin
  // (prefault.h); devdax pages exist already, and disk files are refused by the pin.
  const bool prefault = kind != MappingKind::kDevdax && kind != MappingKind::kFileDisk;
  const std::uint64_t total = chunks.back().offset + chunks.back().bytes;
  Prefaulter prefaulter(host, total, prefault ? prefault_threads_ : 0);
  for (std::uint32_t c = 0; c < chunks.size(); ++c) {
    {
      base::MutexLock lock(mu_);
      if (std::find(cancel_.begin(), cancel_.end(), id) != cancel_.end()) return;
    }
    void* p = reinterpret_cast<void*>(host + chunks[c].offset);
    const std::int64_t waited = prefaulter.WaitUntil(chunks[c].offset + chunks[c].bytes);
    {
      base::MutexLock lock(mu_);
      table_.Find(id)->prefault_ns += waited;
    }
    const std::int64_t t0 = NowNs();
    cudaError_t err = cudaHostRegister(p, chunks[c].bytes, kRegisterFlags);
    void* dev = nullptr;
    if (err == cudaSuccess) {
      err = cudaHostGetDevicePointer(&dev, p, 0);
      if (err != cudaSuccess) cudaHostUnregister(p);
    }
    const std::int64_t t1 = NowNs();
    if (err != cudaSuccess) {
      // Roll back: a registration is whole or absent.
      Unpin(host, chunks, c);
      absl::Status cause = CudaStatus(err, name, "cudaHostRegister");
      absl::Status st(cause.code(),
                      absl::StrCat(name, " (", MappingKindName(kind), ", ",
                                   base::FormatBytes(chunks.back().offset + chunks.back().bytes),
                                   "): the driver refused to register chunk ", c, " of ",
                                   chunks.size(), " [offset ", chunks[c].offset, ", ",
                                   base::FormatBytes(chunks[c].bytes), "]: ", cudaGetErrorName(err),
                                   ": ", cudaGetErrorString(err), " — ", RefusalHint(kind)));
      RegistrationInfo snap;
      {
        base::MutexLock lock(mu_);
        table_.Failed(id, st, t1);
        snap = *table_.Find(id);
      }
      cv_.NotifyAll();
      if (on_progress_) on_progress_(snap);
      return;
    }
    RegistrationInfo snap;
    {
      base::MutexLock lock(mu_);
      table_.ChunkDone(id, reinterpret_cast<std::uintptr_t>(dev), t0, t1);
      if (on_progress_) snap = *table_.Find(id);
    }
    cv_.NotifyAll();
    if (on_progress_) on_progress_(snap);
  }
}

void Registrar::DoUnregister(std::uint64_t id) {
  std::uint64_t host = 0;
  std::vector<ChunkPlan> chunks;
  std::uint32_t done = 0;
  {
    base::MutexLock lock(mu_);
    const RegistrationInfo* r = table_.Find(id);
    if (r == nullptr) return;
    host = r->host_addr;
    chunks = r->chunks;
    done = r->state == RegState::kFailed ? 0 : r->chunks_done;
  }
  Unpin(host, chunks, done);
  base::MutexLock lock(mu_);
  table_.Unregistered(id);
  table_.Erase(id);
  cancel_.erase(std::remove(cancel_.begin(), cancel_.end(), id), cancel_.end());
}

absl::Status Registrar::Wait(std::uint64_t id) {
  base::MutexLock lock(mu_);
  for (;;) {
    const RegistrationInfo* r = table_.Find(id);
    if (r == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("registration #", id, " does not exist (never ", "made, or unregistered)"));
    }
    switch (r->state) {
      case RegState::kRegistered:
        return absl::OkStatus();
      case RegState::kFailed:
        return r->error;
      case RegState::kUnregistered:
        return absl::CancelledError(
            absl::StrCat("registration #", id, " (", r->name, ") was unregistered"));
      default:
        break;
    }
    cv_.Wait(mu_);
  }
}

absl::StatusOr<RegistrationInfo> Registrar::Info(std::uint64_t id) const {
  base::MutexLock lock(mu_);
  const RegistrationInfo* r = table_.Find(id);
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat("registration #", id, " does not exist"));
  }
  return *r;
}

std::vector<RegistrationInfo> Registrar::List() const {
  base::MutexLock lock(mu_);
  std::vector<RegistrationInfo> out;
  for (const RegistrationInfo* r : table_.All()) out.push_back(*r);
  return out;
}

absl::Status Registrar::Unregister(std::uint64_t id) {
  base::MutexLock lock(mu_);
  if (table_.Find(id) == nullptr) {
    return absl::NotFoundError(absl::StrCat("registration #", id, " does not exist"));
  }
  cancel_.push_back(id);
  jobs_.push_back(Job{Job::Kind::kUnregister, id});
  cv_.NotifyAll();
  while (table_.Find(id) != nullptr) cv_.Wait(mu_);
  return absl::OkStatus();
}

absl::StatusOr<PinnedSpan> Registrar::Lookup(const void* host, std::uint64_t bytes) const {
  base::MutexLock lock(mu_);
  return table_.Lookup(reinterpret_cast<std::uintptr_t>(host), bytes);
}

std::uint64_t Registrar::ChunkEnd(std::uint64_t a) const {
  base::MutexLock lock(mu_);
  auto s = table_.Lookup(a, 1);
  return s.ok() ? s->chunk_host_end : a;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> Registrar::PinnedChunks() const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  base::MutexLock lock(mu_);
  for (const RegistrationInfo* r : table_.All()) {
    if (r->state != RegState::kRegistering && r->state != RegState::kRegistered) continue;
    for (std::uint32_t c = 0; c < r->chunks_done; ++c) {
      const std::uint64_t b = r->host_addr + r->chunks[c].offset;
      out.emplace_back(b, b + r->chunks[c].bytes);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<void*> Registrar::DevicePointer(const void* host) const {
  auto s = Lookup(host, 1);
  if (!s.ok()) return s.status();
  return reinterpret_cast<void*>(s->DeviceAddr(reinterpret_cast<std::uintptr_t>(host)));
}

}  // namespace cxlkv::gpu
