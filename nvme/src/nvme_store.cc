// NvmeStore: open and scan, the batch submission path, completion reaping and retirement.
#include "cxlkv/nvme/nvme_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/file.h"
#include "cxlkv/pool/region.h"

namespace cxlkv::nvme {

using base::ErrnoStatus;
using base::ErrnoText;
namespace {

constexpr std::uint64_t RoundUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::size_t kReapBatch = 64;
constexpr std::size_t kMaxProblems = 64;
constexpr std::uint64_t kScanBufferBytes = 64ull << 20;  // read buffers of one scan round

[[noreturn]] void Bug(const char* what, int err = 0) {
  std::fprintf(stderr, "cxlkv NvmeStore bug: %s%s%s\n", what, err != 0 ? ": " : "",
               err != 0 ? ErrnoText(err).c_str() : "");
  std::abort();
}

std::byte* AlignedAlloc(std::uint64_t bytes) {
  void* p = std::aligned_alloc(kNvmeIoAlignBytes, RoundUp(bytes, kNvmeIoAlignBytes));
  if (p == nullptr) Bug("out of memory for an I/O buffer");
  return static_cast<std::byte*>(p);
}

// Staging memory: 2 MiB aligned and advised into transparent huge pages, faulted in at once
// so the first read into it does not pay for the faults. Whether the kernel gave huge pages
// (THP may be off) is not assumed: CalibrateReads measures what staging buys.
constexpr std::uint64_t kStagePageBytes = 2ull << 20;

std::byte* StagingAlloc(std::uint64_t bytes) {
  const std::uint64_t len = RoundUp(bytes, kStagePageBytes);
  void* raw = ::mmap(nullptr, len + kStagePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Trim to a 2 MiB-aligned run of len bytes.
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = RoundUp(base, kStagePageBytes);
  if (start != base) ::munmap(raw, start - base);
  if (const std::uintptr_t tail = base + len + kStagePageBytes - (start + len); tail != 0) {
    ::munmap(reinterpret_cast<void*>(start + len), tail);
  }
  auto* p = reinterpret_cast<std::byte*>(start);
  (void)::madvise(p, len, MADV_HUGEPAGE);  // EINVAL where THP is compiled out: 4 KiB pages
  std::memset(p, 0, len);
  return p;
}

bool Aligned(const void* p, std::uint64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % kNvmeIoAlignBytes == 0 &&
         bytes % kNvmeIoAlignBytes == 0;
}

std::uint64_t NowUnixNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

// The meta page's file in the store's directory.
constexpr char kMetaName[] = "cxlkv-nvme.meta";

// A write that could not be stored for lack of room is kResourceExhausted, whichever errno
// the file system chose; everything else goes through the pool's errno seam.
absl::Status WriteError(int err, absl::string_view object, absl::string_view call) {
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(absl::StrCat(
        object, ": ", call, ": ", ErrnoText(err),
        " — free space on that file system (or raise the quota / file size limit) or open the "
        "store with a smaller capacity_bytes; blocks already stored are intact"));
  }
  return ErrnoStatus(err, object, call);
}

std::string FsType(int fd) {
  struct statfs sf {};
  if (::fstatfs(fd, &sf) != 0) return "unknown";
  switch (static_cast<unsigned long>(sf.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x65735546:
      return "fuse";
    case 0x6969:
      return "nfs";
    case 0x794c7630:
      return "overlayfs";
    default:
      return absl::StrFormat("type %#lx", static_cast<unsigned long>(sf.f_type));
  }
}

// The error of an operation on a key the store at `dir` does not hold.
absl::Status NoBlockError(absl::string_view dir, const NvmeKey& key) {
  return absl::NotFoundError(absl::StrCat(dir, ": no block ", coherence::FormatKey(key)));
}

}  // namespace

// ---- NvmeBatch ------------------------------------------------------------------------------

void NvmeBatch::AddPut(const NvmeKey& key, const void* data, std::uint64_t bytes) {
  ops_.push_back(Op{NvmeOpKind::kPut, key, data, nullptr, bytes, {}, 0, 0});
}
void NvmeBatch::AddGet(const NvmeKey& key, void* dest, std::uint64_t capacity_bytes) {
  ops_.push_back(Op{NvmeOpKind::kGet, key, nullptr, dest, capacity_bytes, {}, 0, 0});
}
void NvmeBatch::AddDelete(const NvmeKey& key) {
  ops_.push_back(Op{NvmeOpKind::kDelete, key, nullptr, nullptr, 0, {}, 0, 0});
}
void NvmeBatch::Clear() { ops_.clear(); }

absl::Status NvmeBatch::first_error() const {
  for (const Op& op : ops_) {
    if (!op.status.ok()) return op.status;
  }
  return absl::OkStatus();
}

// ---- in-flight I/O --------------------------------------------------------------------------

struct NvmeStore::Io {
  enum class Kind : std::uint8_t { kPut, kGet, kTombstone };
  Kind kind = Kind::kPut;
  NvmeBatch* batch = nullptr;
  std::size_t op = 0;
  NvmeKey key;
  std::uint64_t slot = 0;
  std::uint64_t seq = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t payload_xxh3 = 0;  // a put's (for the index), a get's expected (from it)
  std::byte* header = nullptr;     // kNvmeHeaderBytes, aligned, owned
  std::byte* bounce = nullptr;     // aligned, owned, bounce_capacity bytes
  std::uint64_t bounce_capacity = 0;
  std::byte* staging = nullptr;  // a get's buffer from the store's staging pool, while in flight
  bool bounced = false;          // the read lands in `landed` (bounce or staging), not in dest
  std::byte* landed = nullptr;
  void* dest = nullptr;
  std::uint64_t dest_capacity = 0;
  std::uint64_t expect_bytes = 0;
  struct iovec iov[2] = {};
  int iovcnt = 0;
  absl::Status verdict;  // gets: the outcome of Verify, computed outside the lock

  Io() : header(AlignedAlloc(kNvmeHeaderBytes)) {}
  ~Io() {
    std::free(header);
    std::free(bounce);
  }
  std::byte* Bounce(std::uint64_t bytes) {
    if (bounce_capacity < bytes) {
      std::free(bounce);
      bounce = AlignedAlloc(bytes);
      bounce_capacity = bytes;
    }
    bounced = true;
    landed = bounce;
    return bounce;
  }
};

NvmeStore::Io* NvmeStore::NewIo() {
  if (io_free_.empty()) {
    io_all_.push_back(std::make_unique<Io>());
    io_free_.push_back(io_all_.back().get());
  }
  Io* io = io_free_.back();
  io_free_.pop_back();
  io->batch = nullptr;
  io->bounced = false;
  io->landed = nullptr;
  io->dest = nullptr;
  io->verdict = absl::OkStatus();
  return io;
}

void NvmeStore::FreeIo(Io* io) {
  if (io->staging != nullptr) staging_free_.push_back(std::exchange(io->staging, nullptr));
  io_free_.push_back(io);
}

// Every staging buffer has the same size: the largest block rounded up to 2 MiB.
std::uint64_t NvmeStore::StagingBufferBytes() const {
  return RoundUp(payload_span_bytes_, kStagePageBytes);
}

std::byte* NvmeStore::Stage(Io* io) {
  std::byte* p = nullptr;
  if (!staging_free_.empty()) {
    p = staging_free_.back();
    staging_free_.pop_back();
  } else {
    if (stats_.staging_bytes + StagingBufferBytes() > staging_limit_) return nullptr;
    p = StagingAlloc(StagingBufferBytes());
    if (p == nullptr) return nullptr;  // no memory for it now: read directly
    stats_.staging_bytes += StagingBufferBytes();
  }
  io->staging = p;
  io->bounced = true;
  io->landed = p;
  ++stats_.staged_gets;
  return p;
}

void NvmeStore::AddDirectDestination(const void* base, std::uint64_t bytes) {
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  base::MutexLock l(mu_);
  direct_ranges_.emplace_back(b, b + bytes);
}

bool NvmeStore::IsDirectDestination(const void* p, std::uint64_t bytes) const {
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  for (const auto& [begin, end] : direct_ranges_) {
    if (b >= begin && b + bytes <= end) return true;
  }
  return false;
}

std::string NvmeStore::SlotName(std::uint64_t slot) const {
  return absl::StrCat(slots_path_, ": slot ", slot, " at offset ", slot * slot_bytes_);
}

// ---- open -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const NvmeStoreOptions& options,
                                                           NvmeOpenReport* report) {
  std::unique_ptr<NvmeStore> s(new NvmeStore());
  NvmeOpenReport local;
  if (auto st = s->Init(options, report != nullptr ? report : &local); !st.ok()) return st;
  return s;
}

absl::Status NvmeStore::Init(const NvmeStoreOptions& o, NvmeOpenReport* report) {
  if (o.dir.empty()) return absl::InvalidArgumentError("NvmeStore: options.dir is empty");
  if (o.payload_bytes == 0 || o.payload_bytes > kNvmeMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(o.dir, ": payload_bytes ", o.payload_bytes,
                                                   " must be in 1..", kNvmeMaxPayloadBytes,
                                                   " (the KV block size)"));
  }
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.dir, ": queue_depth ", o.queue_depth, " must be in 1..4096"));
  }
  dir_ = o.dir;
  meta_path_ = dir_ + "/" + kMetaName;
  slots_path_ = dir_ + "/cxlkv-nvme.slots";
  payload_bytes_ = o.payload_bytes;
  payload_span_bytes_ = RoundUp(o.payload_bytes, kNvmeIoAlignBytes);
  slot_bytes_ = kNvmeHeaderBytes + payload_span_bytes_;
  queue_depth_ = o.queue_depth;
  preallocate_ = o.preallocate;
  write_flags_ = o.dsync ? RWF_DSYNC : 0;
  grow_slots_ = std::max<std::uint64_t>(1, o.grow_bytes / slot_bytes_);
  if (o.capacity_bytes != 0) {
    capacity_slots_ = o.capacity_bytes / slot_bytes_;
    if (capacity_slots_ == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.dir, ": capacity_bytes ", o.capacity_bytes, " is less than one slot (", slot_bytes_,
          " bytes: a ", kNvmeHeaderBytes, "-byte header + the payload rounded to 4 KiB)"));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), dir_, "mkdir");
  }
  dir_fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) return ErrnoStatus(errno, dir_, "open");
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_,
          ": the NVMe store is open in another process (it holds the directory's flock); "
          "stop that process or use another directory"));
    }
    return ErrnoStatus(errno, dir_, "flock");
  }
  if (auto st = OpenMeta(o); !st.ok()) return st;
  if (auto st = OpenSlots(); !st.ok()) return st;

  ring_ = std::make_unique<io_uring>();
  if (int rc = io_uring_queue_init(queue_depth_, ring_.get(), 0); rc < 0) {
    ring_.reset();
    if (rc == -ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat(dir_, ": io_uring_queue_init(", queue_depth_, "): ", ErrnoText(-rc),
                       " — lower queue_depth or raise RLIMIT_MEMLOCK (ulimit -l)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, ": io_uring is unavailable: io_uring_queue_init: ", ErrnoText(-rc),
        " — check sysctl kernel.io_uring_disabled and the container's seccomp profile"));
  }
  zero_header_ = AlignedAlloc(kNvmeHeaderBytes);
  std::memset(zero_header_, 0, kNvmeHeaderBytes);
  staging_limit_ = o.staging_bytes;
  if (o.read_staging == NvmeStoreOptions::ReadStaging::kAuto) {
    CalibrateReads(report);
  } else {
    stage_reads_ = o.read_staging == NvmeStoreOptions::ReadStaging::kAlways;
  }
  report->reads_staged = stage_reads_;
  return Scan(o.verify_payloads_on_open, report);
}

absl::Status NvmeStore::OpenMeta(const NvmeStoreOptions& o) {
  const base::UniqueFd fd(::open(meta_path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid() && errno != ENOENT) return ErrnoStatus(errno, meta_path_, "open");
  NvmeMetaRecord meta{};
  if (fd.valid()) {
    const ssize_t n = ::pread(fd.get(), &meta, sizeof(meta), 0);
    if (n < 0) return ErrnoStatus(errno, meta_path_, "read");
    if (static_cast<std::size_t>(n) != sizeof(meta)) {
      return absl::DataLossError(absl::StrCat(meta_path_, ": truncated (", n,
                                              " bytes); the store's metadata is lost — remove ",
                                              dir_, " to start an empty store"));
    }
    if (auto st = coherence::Check(meta, kNvmeMetaMagic, kNvmeVersion, kNvmeVersion, meta_path_);
        !st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat(st.message(), " — remove ", dir_, " to start an empty store"));
    }
    if (meta.payload_capacity_bytes != o.payload_bytes || meta.slot_bytes != slot_bytes_ ||
        meta.header_bytes != kNvmeHeaderBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": the store was created for blocks of ", meta.payload_capacity_bytes,
                       " bytes (slots of ", meta.slot_bytes, "), not ", o.payload_bytes,
                       "; open it with payload_bytes=", meta.payload_capacity_bytes,
                       " or use another directory"));
    }
    std::memcpy(uuid_, meta.uuid, sizeof(uuid_));
    return absl::OkStatus();
  }
  // A new store: write the meta record to a temporary name and rename it into place, so a
  // crash leaves either no store or a complete one.
  if (::getrandom(uuid_, sizeof(uuid_), 0) != sizeof(uuid_)) {
    return ErrnoStatus(errno, dir_, "getrandom");
  }
  std::memcpy(meta.uuid, uuid_, sizeof(uuid_));
  meta.created_unix_ns = NowUnixNs();
  meta.slot_bytes = slot_bytes_;
  meta.payload_capacity_bytes = payload_bytes_;
  meta.header_bytes = kNvmeHeaderBytes;
  coherence::Seal(meta, kNvmeMetaMagic, kNvmeVersion, 1);
  std::vector<char> page(kNvmeMetaBytes, 0);
  std::memcpy(page.data(), &meta, sizeof(meta));
  // base::ReplaceFileAt in the directory this store holds open: a crash leaves no store or a
  // complete one.
  if (auto st = base::ReplaceFileAt(dir_fd_, dir_, kMetaName,
                                    {absl::string_view(page.data(), page.size())}, 0600);
      !st.ok()) {
    return st;
  }
  // Slots of an earlier store in this directory (its meta file deleted) carry another uuid
  // and are never indexed; start the file afresh so they do not count against capacity.
  ::unlink(slots_path_.c_str());
  return absl::OkStatus();
}

absl::Status NvmeStore::OpenSlots() {
  slots_fd_ = ::open(slots_path_.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (slots_fd_ < 0) {
    if (errno == EINVAL) {
      const base::UniqueFd probe(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      return absl::FailedPreconditionError(absl::StrCat(
          dir_, ": the file system (", probe.valid() ? FsType(probe.get()) : "unknown",
          ") does not support O_DIRECT; put the NVMe store on ext4 or xfs on the NVMe device "
          "(tmpfs needs Linux 6.6 or later)"));
    }
    return ErrnoStatus(errno, slots_path_, "open");
  }
  struct stat st {};
  if (::fstat(slots_fd_, &st) != 0) return ErrnoStatus(errno, slots_path_, "fstat");
  const std::uint64_t n = static_cast<std::uint64_t>(st.st_size) / slot_bytes_;
  base::MutexLock l(mu_);
  slots_.assign(n, Slot{});
  return absl::OkStatus();
}

absl::Status NvmeStore::WriteSync(std::uint64_t offset, const std::byte* buf, std::uint64_t bytes) {
  const ssize_t n = ::pwrite(slots_fd_, buf, bytes, static_cast<off_t>(offset));
  if (n < 0) return WriteError(errno, slots_path_, "write");
  if (static_cast<std::uint64_t>(n) != bytes) {
    return WriteError(ENOSPC, slots_path_, "write (short)");
  }
  return absl::OkStatus();
}

// Reads every slot's header (or whole slot), io_uring at queue depth, and rebuilds the index:
// the highest sequence of a key wins; older versions are retired (tombstoned) before the store
// is used, so a later delete of the winner cannot bring an old version back.
absl::Status NvmeStore::Scan(bool verify_payloads, NvmeOpenReport* report) {
  base::MutexLock l(mu_);
  const std::uint64_t total = slots_.size();
  const std::uint64_t read_bytes = verify_payloads ? slot_bytes_ : kNvmeHeaderBytes;
  const std::uint64_t depth =
      std::clamp<std::uint64_t>(kScanBufferBytes / read_bytes, 1, queue_depth_);
  std::vector<std::byte*> bufs(depth);
  for (auto& b : bufs) b = AlignedAlloc(read_bytes);
  std::vector<std::uint64_t> superseded;
  std::uint64_t max_seq = 0;
  absl::Status failure;
  auto problem = [&](std::string msg) {
    ++report->corrupt;
    if (report->problems.size() < kMaxProblems) report->problems.push_back(std::move(msg));
  };
  for (std::uint64_t first = 0; first < total && failure.ok(); first += depth) {
    const std::uint64_t count = std::min(depth, total - first);
    for (std::uint64_t i = 0; i < count; ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) Bug("scan: submission queue smaller than its depth");
      io_uring_prep_read(sqe, slots_fd_, bufs[i], static_cast<unsigned>(read_bytes),
                         (first + i) * slot_bytes_);
      io_uring_sqe_set_data64(sqe, i);
    }
    int rc;
    do {
      rc = io_uring_submit_and_wait(ring_.get(), static_cast<unsigned>(count));
    } while (rc == -EINTR);
    if (rc < 0) Bug("scan: io_uring_submit_and_wait", -rc);
    std::vector<int> res(count, 0);
    for (std::uint64_t got = 0; got < count;) {
      io_uring_cqe* cqe = nullptr;
      do {
        rc = io_uring_wait_cqe(ring_.get(), &cqe);
      } while (rc == -EINTR);
      if (rc < 0) Bug("scan: io_uring_wait_cqe", -rc);
      res[io_uring_cqe_get_data64(cqe)] = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      ++got;
    }
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint64_t slot = first + i;
      ++report->slots_scanned;
      if (res[i] < 0) {
        failure = ErrnoStatus(-res[i], SlotName(slot), "read");
        break;
      }
      if (static_cast<std::uint64_t>(res[i]) != read_bytes) {
        problem(absl::StrCat(SlotName(slot), ": short read (", res[i], " of ", read_bytes,
                             " bytes); slot dropped"));
        continue;
      }
      NvmeSlotHeader h;
      std::memcpy(&h, bufs[i], sizeof(h));
      absl::Status st =
          coherence::Check(h, kNvmeSlotMagic, kNvmeVersion, kNvmeVersion, SlotName(slot));
      if (absl::IsNotFound(st)) continue;  // never written, or retired
      if (st.ok() && std::memcmp(h.store_uuid, uuid_, sizeof(uuid_)) != 0) {
        st = absl::DataLossError(absl::StrCat(SlotName(slot), ": written by another store"));
      } else if (st.ok() &&
                 (h.slot != slot || h.payload_bytes == 0 || h.payload_bytes > payload_bytes_)) {
        st = absl::DataLossError(absl::StrCat(SlotName(slot), ": header names slot ", h.slot,
                                              " and ", h.payload_bytes, " payload bytes"));
      } else if (st.ok() && verify_payloads &&
                 XXH3_64bits(bufs[i] + kNvmeHeaderBytes, h.payload_bytes) != h.payload_xxh3) {
        st = absl::DataLossError(absl::StrCat(SlotName(slot), ": key ",
                                              coherence::FormatKey({h.key_lo, h.key_hi}),
                                              ": payload checksum mismatch"));
        superseded.push_back(slot);  // a valid header over a bad payload: retire it
      }
      if (!st.ok()) {
        problem(absl::StrCat(st.message(), "; slot dropped"));
        continue;
      }
      max_seq = std::max(max_seq, h.head.seq);
      const NvmeKey key{h.key_lo, h.key_hi};
      auto [it, inserted] =
          index_.try_emplace(key, IndexEntry{slot, h.head.seq, h.payload_bytes, h.payload_xxh3});
      if (!inserted) {
        ++report->superseded;
        if (it->second.seq < h.head.seq) {
          superseded.push_back(it->second.slot);
          slots_[it->second.slot].state = SlotState::kFree;
          it->second = IndexEntry{slot, h.head.seq, h.payload_bytes, h.payload_xxh3};
        } else {
          superseded.push_back(slot);
          continue;
        }
      }
      slots_[slot].state = SlotState::kLive;
    }
  }
  for (auto* b : bufs) std::free(b);
  if (!failure.ok()) return failure;
  for (std::uint64_t slot : superseded) {
    if (auto st = WriteSync(slot * slot_bytes_, zero_header_, kNvmeHeaderBytes); !st.ok()) {
      return st;
    }
    ++stats_.tombstones;
  }
  for (std::uint64_t slot = total; slot-- > 0;) {
    if (slots_[slot].state != SlotState::kLive) free_slots_.push_back(slot);
  }
  for (const auto& [key, e] : index_) stats_.payload_bytes += e.payload_bytes;
  next_seq_ = max_seq + 1;
  report->blocks_indexed = index_.size();
  return absl::OkStatus();
}

// ---- read staging -------------------------------------------------------------------------

// Writes one probe block (the store's block size, at most 2 MiB) to a file beside the slots,
// then reads it back alternately into 4 KiB pages and into a staging buffer plus the copy
// out, kRounds times each after one warm-up of each, and compares the medians. The same bytes
// are read every time, so the disk's cache treats both arms alike; what differs is only the
// buffer the read fills. The probe file is unlinked as soon as it is open. A probe that
// fails (a full file system, no memory) leaves reads direct and says why in the report.
void NvmeStore::CalibrateReads(NvmeOpenReport* report) {
  constexpr int kRounds = 7;
  const std::uint64_t bytes = std::min(payload_span_bytes_, kStagePageBytes);
  const std::string path = dir_ + "/cxlkv-nvme.read-probe";
  const base::UniqueFd fd(
      ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    report->read_probe_error = ErrnoStatus(errno, path, "open").ToString();
    return;
  }
  ::unlink(path.c_str());
  std::byte* staging = StagingAlloc(bytes);
  std::byte* pages = AlignedAlloc(bytes);
  auto cleanup = absl::MakeCleanup([&] {
    if (staging != nullptr) ::munmap(staging, RoundUp(bytes, kStagePageBytes));
    std::free(pages);
  });
  if (staging == nullptr) {
    report->read_probe_error = ErrnoStatus(errno, path, "mmap (staging buffer)").ToString();
    return;
  }
  for (std::uint64_t i = 0; i < bytes; ++i) staging[i] = static_cast<std::byte>(i * 131 + 17);
  std::memcpy(pages, staging, bytes);
  if (::pwrite(fd.get(), staging, bytes, 0) != static_cast<ssize_t>(bytes)) {
    report->read_probe_error = WriteError(errno, path, "write").ToString();
    return;
  }
  std::vector<double> us[2];  // direct, staged
  for (int i = 0; i < 2 * (kRounds + 1); ++i) {
    const int arm = i % 2;
    struct timespec a {
    }, b{};
    ::clock_gettime(CLOCK_MONOTONIC, &a);
    const ssize_t n = ::pread(fd.get(), arm == 0 ? pages : staging, bytes, 0);
    if (n == static_cast<ssize_t>(bytes) && arm == 1) std::memcpy(pages, staging, bytes);
    ::clock_gettime(CLOCK_MONOTONIC, &b);
    if (n != static_cast<ssize_t>(bytes)) {
      report->read_probe_error =
          (n < 0 ? ErrnoStatus(errno, path, "read")
                 : absl::DataLossError(absl::StrCat(path, ": short read of the probe")))
              .ToString();
      return;
    }
    if (i >= 2) {
      us[arm].push_back(static_cast<double>(b.tv_sec - a.tv_sec) * 1e6 +
                        static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e3);
    }
  }
  for (auto& v : us) std::sort(v.begin(), v.end());
  report->read_probe_bytes = bytes;
  report->read_probe_direct_us = us[0][kRounds / 2];
  report->read_probe_staged_us = us[1][kRounds / 2];
  stage_reads_ = report->read_probe_staged_us * 10 < report->read_probe_direct_us * 9;
}

NvmeStore::~NvmeStore() {
  if (ring_ != nullptr) {
    Drain();
    io_uring_queue_exit(ring_.get());
  }
  if (slots_fd_ >= 0) ::close(slots_fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);  // releases the flock
  std::free(zero_header_);
  for (std::byte* p : staging_free_) ::munmap(p, StagingBufferBytes());
}

// ---- slots ----------------------------------------------------------------------------------

absl::Status NvmeStore::Grow(const NvmeKey& key) {
  const std::uint64_t have = slots_.size();
  std::uint64_t want = have + grow_slots_;
  if (capacity_slots_ != 0) want = std::min(want, capacity_slots_);
  if (want <= have) {
    ++stats_.out_of_space;
    return absl::ResourceExhaustedError(absl::StrCat(
        dir_, ": store full: all ", have, " slots (capacity_bytes allows ", capacity_slots_, " of ",
        slot_bytes_, " bytes) hold blocks or are being retired; cannot store block ",
        coherence::FormatKey(key),
        " — delete blocks, or open the store with a larger capacity_bytes"));
  }
  if (preallocate_) {
    int rc = 0;
    for (std::uint64_t target : {want, have + 1}) {
      rc = ::fallocate(slots_fd_, 0, static_cast<off_t>(have * slot_bytes_),
                       static_cast<off_t>((target - have) * slot_bytes_));
      if (rc == 0) {
        want = target;
        break;
      }
      if (errno == EOPNOTSUPP) {
        preallocate_ = false;  // this file system cannot reserve: writes extend the file
        break;
      }
      if (errno != ENOSPC && errno != EDQUOT && errno != EFBIG) break;
    }
    if (rc != 0 && preallocate_) {
      ++stats_.out_of_space;
      return WriteError(
          errno, slots_path_,
          absl::StrCat("cannot grow to ", (have + 1) * slot_bytes_, " bytes for block ",
                       coherence::FormatKey(key), ": fallocate"));
    }
  }
  if (!preallocate_) {
    if (::ftruncate(slots_fd_, static_cast<off_t>(want * slot_bytes_)) != 0) {
      ++stats_.out_of_space;
      return WriteError(errno, slots_path_,
                        absl::StrCat("cannot grow to ", want * slot_bytes_, " bytes for block ",
                                     coherence::FormatKey(key), ": ftruncate"));
    }
  }
  slots_.resize(want);
  for (std::uint64_t slot = want; slot-- > have;) free_slots_.push_back(slot);
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> NvmeStore::TakeSlot(const NvmeKey& key) {
  if (free_slots_.empty()) {
    if (auto st = Grow(key); !st.ok()) return st;
  }
  const std::uint64_t slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot].state = SlotState::kWriting;
  return slot;
}

void NvmeStore::Retire(std::uint64_t slot) {
  if (slots_[slot].readers != 0) {
    slots_[slot].state = SlotState::kRetirePending;  // the last reader queues the tombstone
    return;
  }
  slots_[slot].state = SlotState::kRetiring;
  tombstone_queue_.push_back(slot);
}

void NvmeStore::IssueTombstones() {
  while (!tombstone_queue_.empty()) {
    Io* io = NewIo();
    io->kind = Io::Kind::kTombstone;
    io->slot = tombstone_queue_.back();
    io->iov[0] = {zero_header_, kNvmeHeaderBytes};
    io->iovcnt = 1;
    io->expect_bytes = kNvmeHeaderBytes;
    if (!Queue(io)) {
      FreeIo(io);
      return;  // no room: retried after the next completions
    }
    tombstone_queue_.pop_back();
  }
}

// ---- submission -----------------------------------------------------------------------------

bool NvmeStore::Queue(Io* io) {
  if (in_flight_ + unsubmitted_ >= queue_depth_) return false;
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe == nullptr) Bug("submission queue full below the queue depth");
  const auto offset = io->slot * slot_bytes_;
  if (io->kind == Io::Kind::kGet) {  // the payload, after the slot's header
    io_uring_prep_read(sqe, slots_fd_, io->iov[0].iov_base,
                       static_cast<unsigned>(io->iov[0].iov_len), offset + kNvmeHeaderBytes);
  } else {
    io_uring_prep_writev(sqe, slots_fd_, io->iov, static_cast<unsigned>(io->iovcnt), offset);
    sqe->rw_flags = write_flags_;
  }
  io_uring_sqe_set_data(sqe, io);
  ++unsubmitted_;
  return true;
}

void NvmeStore::SubmitQueued() {
  while (unsubmitted_ != 0) {
    const int rc = io_uring_submit(ring_.get());
    if (rc > 0) {
      in_flight_ += static_cast<std::uint64_t>(rc);
      unsubmitted_ -= std::min<std::uint32_t>(unsubmitted_, static_cast<std::uint32_t>(rc));
      ++stats_.submit_calls;
    } else if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
      // Transient (kernel memory, a completion backlog): the SQEs stay queued; try again.
      std::this_thread::yield();
    } else {
      Bug("io_uring_submit", rc < 0 ? -rc : 0);
    }
  }
}

void NvmeStore::CompleteOp(NvmeBatch* batch, std::size_t i, absl::Status status,
                           std::uint64_t bytes, std::vector<NvmeBatch*>* finished) {
  NvmeBatch::Op& op = batch->ops_[i];
  op.status = std::move(status);
  op.result_bytes = bytes;
  ReleaseOne(batch, finished);
}

void NvmeStore::ReleaseOne(NvmeBatch* batch, std::vector<NvmeBatch*>* finished) {
  if (--batch->pending_ != 0) return;
  if (!batch->callback_) {
    batch->done_.store(true, std::memory_order_release);  // waiters woken after unlock
  } else {
    finished->push_back(batch);
  }
}

absl::Status NvmeStore::Submit(NvmeBatch& batch, NvmeBatch::Callback done) {
  if (!batch.done()) {
    return absl::FailedPreconditionError(
        "NvmeStore::Submit: the batch is still in flight; Wait for it before reusing it");
  }
  const std::size_t n = batch.ops_.size();
  // Payload hashes and size checks outside the lock: they touch only the caller's data.
  for (std::size_t i = 0; i < n; ++i) {
    NvmeBatch::Op& op = batch.ops_[i];
    op.status = absl::OkStatus();
    op.result_bytes = 0;
    if (op.kind == NvmeOpKind::kPut && op.bytes != 0 && op.bytes <= payload_bytes_) {
      op.put_xxh3 = XXH3_64bits(op.src, op.bytes);
    }
  }
  std::vector<NvmeBatch*> finished;
  mu_.Lock();
  batch.callback_ = std::move(done);
  batch.pending_ = n + 1;  // +1 until every op is queued, so no completion finishes it early
  batch.done_.store(false, std::memory_order_relaxed);
  for (std::size_t i = 0; i < n; ++i) {
    NvmeBatch::Op& op = batch.ops_[i];
    Io* io = nullptr;
    if (op.kind == NvmeOpKind::kDelete) {
      auto it = index_.find(op.key);
      if (it == index_.end()) {
        CompleteOp(&batch, i, NoBlockError(dir_, op.key), 0, &finished);
        continue;
      }
      stats_.payload_bytes -= it->second.payload_bytes;
      Retire(it->second.slot);
      index_.erase(it);
      ++stats_.deletes;
      CompleteOp(&batch, i, absl::OkStatus(), 0, &finished);
      continue;
    }
    if (op.kind == NvmeOpKind::kPut) {
      if (op.bytes == 0 || op.bytes > payload_bytes_) {
        CompleteOp(&batch, i,
                   absl::InvalidArgumentError(absl::StrCat(
                       dir_, ": block ", coherence::FormatKey(op.key), " of ", op.bytes,
                       " bytes; this store holds blocks of 1..", payload_bytes_, " bytes")),
                   0, &finished);
        continue;
      }
      auto slot = TakeSlot(op.key);
      if (!slot.ok()) {
        CompleteOp(&batch, i, slot.status(), 0, &finished);
        continue;
      }
      io = NewIo();
      io->kind = Io::Kind::kPut;
      io->slot = *slot;
      io->seq = next_seq_++;
      io->payload_bytes = op.bytes;
      io->payload_xxh3 = op.put_xxh3;
      std::memset(io->header, 0, kNvmeHeaderBytes);
      auto* h = reinterpret_cast<NvmeSlotHeader*>(io->header);
      std::memcpy(h->store_uuid, uuid_, sizeof(uuid_));
      h->key_lo = op.key.lo;
      h->key_hi = op.key.hi;
      h->slot = io->slot;
      h->payload_bytes = op.bytes;
      h->payload_xxh3 = op.put_xxh3;
      coherence::Seal(*h, kNvmeSlotMagic, kNvmeVersion, io->seq);
      const std::uint64_t span = RoundUp(op.bytes, kNvmeIoAlignBytes);
      void* src = const_cast<void*>(op.src);  // iovec is not const; a write only reads it
      if (!Aligned(src, op.bytes)) {
        std::byte* b = io->Bounce(span);
        std::memcpy(b, op.src, op.bytes);
        std::memset(b + op.bytes, 0, span - op.bytes);
        src = b;
      }
      io->iov[0] = {io->header, kNvmeHeaderBytes};
      io->iov[1] = {src, span};
      io->iovcnt = 2;
      io->expect_bytes = kNvmeHeaderBytes + span;
    } else {  // kGet
      auto it = index_.find(op.key);
      if (it == index_.end()) {
        CompleteOp(&batch, i, NoBlockError(dir_, op.key), 0, &finished);
        continue;
      }
      const IndexEntry e = it->second;
      if (op.bytes < e.payload_bytes) {
        CompleteOp(&batch, i,
                   absl::InvalidArgumentError(absl::StrCat(
                       dir_, ": block ", coherence::FormatKey(op.key), " has ", e.payload_bytes,
                       " bytes; the destination holds only ", op.bytes)),
                   0, &finished);
        continue;
      }
      io = NewIo();
      io->kind = Io::Kind::kGet;
      io->key = op.key;
      io->slot = e.slot;
      io->seq = e.seq;
      io->payload_bytes = e.payload_bytes;
      io->payload_xxh3 = e.payload_xxh3;
      io->dest = op.dest;
      io->dest_capacity = op.bytes;
      const std::uint64_t span = RoundUp(e.payload_bytes, kNvmeIoAlignBytes);
      void* into = op.dest;
      if (stage_reads_ && !IsDirectDestination(op.dest, e.payload_bytes)) {
        if (std::byte* st = Stage(io); st != nullptr) into = st;
      }
      if (into == op.dest && (!Aligned(op.dest, span) || op.bytes < span)) into = io->Bounce(span);
      // The payload alone: the index holds what the header would be checked for.
      io->iov[0] = {into, span};
      io->iovcnt = 1;
      io->expect_bytes = span;
      ++slots_[e.slot].readers;
    }
    io->batch = &batch;
    io->op = i;
    io->key = op.key;
    while (!Queue(io)) {
      // The ring is full: send what is queued and wait for completions to make room.
      SubmitQueued();
      const std::uint64_t seen = reaped_;
      mu_.Unlock();
      cv_.NotifyAll();  // in_flight_ grew: a waiter may take the reaper role
      WaitProgress(seen);
      mu_.Lock();
    }
  }
  IssueTombstones();
  SubmitQueued();
  ReleaseOne(&batch, &finished);  // the +1 above
  mu_.Unlock();
  cv_.NotifyAll();
  RunCallbacks(finished);
  return absl::OkStatus();
}

absl::Status NvmeStore::Prefetch(std::span<const NvmeKey> keys, std::span<void* const> dests,
                                 std::uint64_t dest_bytes, NvmeBatch& batch,
                                 NvmeBatch::Callback done) {
  if (keys.size() != dests.size()) {
    return absl::InvalidArgumentError(absl::StrCat(dir_, ": Prefetch of ", keys.size(),
                                                   " keys into ", dests.size(), " destinations"));
  }
  if (!batch.done()) {
    return absl::FailedPreconditionError(
        "NvmeStore::Prefetch: the batch is still in flight; Wait for it before reusing it");
  }
  batch.Clear();
  for (std::size_t i = 0; i < keys.size(); ++i) batch.AddGet(keys[i], dests[i], dest_bytes);
  return Submit(batch, std::move(done));
}

// ---- completion -----------------------------------------------------------------------------

void NvmeStore::Verify(Io* io, int res) const {
  // The message's prefix (file, slot, offset, key) is formatted only when a check fails: a
  // good read costs one pass of XXH3 over the payload, nothing more.
  auto where = [&] {
    return absl::StrCat(SlotName(io->slot), ": key ", coherence::FormatKey(io->key));
  };
  const std::uint64_t n = io->payload_bytes;
  const std::byte* payload = io->bounced ? io->landed : static_cast<const std::byte*>(io->dest);
  absl::Status st;
  if (res < 0) {
    st = ErrnoStatus(-res, where(), "read");
  } else if (static_cast<std::uint64_t>(res) != io->expect_bytes) {
    st = absl::DataLossError(absl::StrCat(where(), ": short read (", res, " of ", io->expect_bytes,
                                          " bytes): the file was truncated"));
  } else if (const std::uint64_t got = XXH3_64bits(payload, n); got != io->payload_xxh3) {
    // Damaged on the device, or the slot rewritten behind the store's back (another process,
    // a copy of another slot): either way not the bytes this store wrote there.
    st = absl::DataLossError(absl::StrFormat(
        "%s: payload checksum mismatch (the store wrote %016x, the data hashes to %016x): "
        "damaged on the device or overwritten behind the store's back",
        where(), io->payload_xxh3, got));
  }
  // Staged: the copy out after the hash reads the payload from the cache (+2 us at 256 KiB;
  // hashing and copying in pieces took longer, the hash running slower in streaming form).
  if (st.ok()) {
    if (io->bounced) std::memcpy(io->dest, io->landed, n);
  } else if (absl::IsDataLoss(st)) {
    st = absl::DataLossError(
        absl::StrCat(st.message(), "; the block was dropped from the store — recompute it"));
    std::memset(io->dest, 0, std::min(n, io->dest_capacity));  // whatever it held before
  }
  io->verdict = std::move(st);
}

void NvmeStore::Apply(const Completion& c, std::vector<NvmeBatch*>* finished) {
  Io* io = c.io;
  switch (io->kind) {
    case Io::Kind::kPut: {
      if (c.res >= 0 && static_cast<std::uint64_t>(c.res) == io->expect_bytes) {
        const IndexEntry written{io->slot, io->seq, io->payload_bytes, io->payload_xxh3};
        auto [it, inserted] = index_.try_emplace(io->key, written);
        if (inserted || it->second.seq < io->seq) {
          if (!inserted) {
            stats_.payload_bytes -= it->second.payload_bytes;
            Retire(it->second.slot);  // the older version, now superseded on media too
            it->second = written;
          }
          stats_.payload_bytes += io->payload_bytes;
          slots_[io->slot].state = SlotState::kLive;
        } else {
          Retire(io->slot);  // a later put of the same key completed first
        }
        ++stats_.puts;
        CompleteOp(io->batch, io->op, absl::OkStatus(), io->payload_bytes, finished);
      } else {
        // Nothing in the index changed; the slot may hold part of this write: retire it.
        absl::Status st = c.res < 0 ? WriteError(-c.res, SlotName(io->slot), "write")
                                    : WriteError(ENOSPC, SlotName(io->slot),
                                                 absl::StrCat("write (short: ", c.res, " of ",
                                                              io->expect_bytes, " bytes)"));
        if (absl::IsResourceExhausted(st)) ++stats_.out_of_space;
        Retire(io->slot);
        CompleteOp(io->batch, io->op,
                   absl::Status(st.code(), absl::StrCat(st.message(), " (block ",
                                                        coherence::FormatKey(io->key), ")")),
                   0, finished);
      }
      break;
    }
    case Io::Kind::kGet: {
      Slot& s = slots_[io->slot];
      --s.readers;
      if (io->verdict.ok()) {
        ++stats_.gets;
        CompleteOp(io->batch, io->op, absl::OkStatus(), io->payload_bytes, finished);
      } else {
        if (absl::IsDataLoss(io->verdict)) {
          ++stats_.data_loss;
          auto it = index_.find(io->key);
          if (it != index_.end() && it->second.slot == io->slot && it->second.seq == io->seq) {
            stats_.payload_bytes -= it->second.payload_bytes;
            index_.erase(it);
            if (s.state == SlotState::kLive) s.state = SlotState::kRetirePending;
          }
        }
        CompleteOp(io->batch, io->op, std::move(io->verdict), 0, finished);
      }
      if (s.readers == 0 && s.state == SlotState::kRetirePending) Retire(io->slot);
      break;
    }
    case Io::Kind::kTombstone:
      // A failed tombstone leaves an old header that a restart may index again: the version
      // it holds was complete, so it reads back right (or a newer one wins by sequence).
      if (c.res == static_cast<int>(kNvmeHeaderBytes)) ++stats_.tombstones;
      slots_[io->slot].state = SlotState::kFree;
      free_slots_.push_back(io->slot);
      break;
  }
  FreeIo(io);
}

std::size_t NvmeStore::Reap(bool block) {
  io_uring_cqe* cqes[kReapBatch];
  if (block) {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(ring_.get(), &cqe);
    } while (rc == -EINTR);
    if (rc < 0) Bug("io_uring_wait_cqe", -rc);
  }
  const unsigned n = io_uring_peek_batch_cqe(ring_.get(), cqes, kReapBatch);
  Completion done[kReapBatch];
  for (unsigned i = 0; i < n; ++i) {
    done[i] = Completion{static_cast<Io*>(io_uring_cqe_get_data(cqes[i])), cqes[i]->res};
  }
  io_uring_cq_advance(ring_.get(), n);
  // Acquire the lock once so that the submitters' writes to these Ios are visible (the kernel
  // orders them, but a race detector sees only the lock).
  { base::MutexLock sync(mu_); }
  for (unsigned i = 0; i < n; ++i) {
    if (done[i].io->kind == Io::Kind::kGet) Verify(done[i].io, done[i].res);
  }
  std::vector<NvmeBatch*> finished;
  {
    base::MutexLock l(mu_);
    for (unsigned i = 0; i < n; ++i) Apply(done[i], &finished);
    in_flight_ -= n;
    reaped_ += n;
    IssueTombstones();
    SubmitQueued();
    reaping_ = false;
  }
  cv_.NotifyAll();
  RunCallbacks(finished);
  return n;
}

void NvmeStore::RunCallbacks(std::vector<NvmeBatch*>& finished) {
  if (finished.empty()) return;
  for (NvmeBatch* b : finished) {
    NvmeBatch::Callback cb = std::move(b->callback_);
    b->callback_ = nullptr;
    cb(*b);
  }
  // done() turns true only after the callback returned, so a waiter never frees a batch whose
  // callback is still running. Set under the store lock, then waiters are woken.
  {
    base::MutexLock l(mu_);
    for (NvmeBatch* b : finished) b->done_.store(true, std::memory_order_release);
  }
  cv_.NotifyAll();
}

// Each wait below blocks on the store lock until its goal holds, or until no thread reads
// the completion queue while I/O is in flight; then this thread takes that role. A batch that
// is complete but whose callback still runs elsewhere has no I/O in flight: its waiter sleeps
// until RunCallbacks marks it done (under the lock, then a notify wakes it).
void NvmeStore::WaitProgress(std::uint64_t seen_reaped) {
  {
    base::MutexLock l(mu_);
    while (!(reaped_ != seen_reaped || (!reaping_ && in_flight_ != 0))) cv_.Wait(mu_);
    if (reaped_ != seen_reaped) return;
    reaping_ = true;
  }
  Reap(/*block=*/true);
}

void NvmeStore::Wait(NvmeBatch& batch) {
  for (;;) {
    {
      base::MutexLock l(mu_);
      while (!(batch.done() || (!reaping_ && in_flight_ != 0))) cv_.Wait(mu_);
      if (batch.done()) return;
      reaping_ = true;
    }
    Reap(/*block=*/true);
  }
}

std::size_t NvmeStore::Poll() {
  {
    base::MutexLock l(mu_);
    if (reaping_ || in_flight_ == 0) return 0;
    reaping_ = true;
  }
  return Reap(/*block=*/false);
}

void NvmeStore::Drain() {
  for (;;) {
    {
      base::MutexLock l(mu_);
      while (!(in_flight_ == 0 || !reaping_)) cv_.Wait(mu_);
      if (in_flight_ == 0) {
        if (unsubmitted_ != 0 || !tombstone_queue_.empty()) Bug("work queued on an idle ring");
        return;
      }
      reaping_ = true;
    }
    Reap(/*block=*/true);
  }
}

// ---- synchronous wrappers and queries -------------------------------------------------------

absl::Status NvmeStore::Put(const NvmeKey& key, const void* data, std::uint64_t bytes) {
  NvmeBatch b;
  b.AddPut(key, data, bytes);
  if (auto st = Submit(b); !st.ok()) return st;
  Wait(b);
  return b.status(0);
}

absl::StatusOr<std::uint64_t> NvmeStore::Get(const NvmeKey& key, void* dest,
                                             std::uint64_t capacity_bytes) {
  NvmeBatch b;
  b.AddGet(key, dest, capacity_bytes);
  if (auto st = Submit(b); !st.ok()) return st;
  Wait(b);
  if (!b.status(0).ok()) return b.status(0);
  return b.bytes(0);
}

absl::Status NvmeStore::Delete(const NvmeKey& key) {
  NvmeBatch b;
  b.AddDelete(key);
  if (auto st = Submit(b); !st.ok()) return st;
  Wait(b);
  return b.status(0);
}

bool NvmeStore::Contains(const NvmeKey& key) const {
  base::MutexLock l(mu_);
  return index_.contains(key);
}

std::vector<NvmeKey> NvmeStore::Keys() const {
  base::MutexLock l(mu_);
  std::vector<NvmeKey> keys;
  keys.reserve(index_.size());
  for (const auto& [key, e] : index_) keys.push_back(key);
  return keys;
}

absl::StatusOr<NvmeStore::Location> NvmeStore::Locate(const NvmeKey& key) const {
  base::MutexLock l(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return NoBlockError(dir_, key);
  }
  return Location{slots_path_, it->second.slot, it->second.slot * slot_bytes_,
                  it->second.payload_bytes};
}

absl::Status NvmeStore::Sync() {
  if (::fdatasync(slots_fd_) != 0) return WriteError(errno, slots_path_, "fdatasync");
  return absl::OkStatus();
}

NvmeStats NvmeStore::Stats() const {
  base::MutexLock l(mu_);
  NvmeStats s = stats_;
  s.blocks = index_.size();
  s.slots_in_file = slots_.size();
  s.slots_free = free_slots_.size();
  s.capacity_slots = capacity_slots_;
  s.in_flight = in_flight_;
  return s;
}

}  // namespace cxlkv::nvme
