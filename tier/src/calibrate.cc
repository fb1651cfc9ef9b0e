// Calibration: memcpy bandwidth and pointer-chase latency on a mapping; O_DIRECT read latency,
// bandwidth and IOPS on a scratch file; JSON save/load.
#include "cxlkv/tier/calibrate.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/file.h"
#include "cxlkv/pool/layout.h"

namespace cxlkv::tier {

using base::ErrnoStatus;
using pool::kArenaMagic;
using pool::kFormattingMagic;
using pool::Region;
using pool::SourceKind;
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kLine = 64;
constexpr std::size_t kSector = 4096;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Anonymous, prefaulted, freed on scope exit.
struct AnonBuffer {
  std::byte* addr = nullptr;
  std::size_t bytes = 0;
  explicit AnonBuffer(std::size_t n) : bytes(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                     -1, 0);
    addr = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~AnonBuffer() {
    if (addr != nullptr) ::munmap(addr, bytes);
  }
  AnonBuffer(const AnonBuffer&) = delete;
  AnonBuffer& operator=(const AnonBuffer&) = delete;
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedPtr = std::unique_ptr<std::byte, AlignedFree>;

AlignedPtr AlignedAlloc(std::size_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kSector, bytes) != 0) return nullptr;
  return AlignedPtr(static_cast<std::byte*>(p));
}

// Bytes per second of memcpy(to(i), from(i), block) over rotating offsets for `seconds`.
template <typename Copy>
double CopyRate(double seconds, std::uint64_t block, Copy copy) {
  const Clock::time_point t0 = Clock::now();
  std::uint64_t copied = 0;
  std::uint64_t i = 0;
  double elapsed = 0;
  do {
    copy(i++);
    copied += block;
    elapsed = Since(t0);
  } while (elapsed < seconds);
  return static_cast<double>(copied) / elapsed;
}

}  // namespace

absl::StatusOr<MemoryCalibration> CalibrateMemory(std::byte* addr, std::uint64_t bytes,
                                                  double budget_s, const CalibrateOptions& o) {
  const std::uint64_t block = o.copy_block_bytes;
  if (block < kLine || block % kLine != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibrate: copy block ", block, " bytes is not a positive multiple of 64"));
  }
  bytes = bytes / block * block;
  if (addr == nullptr || bytes < 2 * block) {
    return absl::InvalidArgumentError(absl::StrCat("calibrate: the memory range holds ", bytes,
                                                   " bytes; at least two copy blocks (", 2 * block,
                                                   " bytes) are needed — pass a larger region"));
  }
  const Clock::time_point t0 = Clock::now();
  // The DRAM side of the copies: up to 64 MiB, prefaulted.
  const std::uint64_t buf_bytes = std::min<std::uint64_t>(bytes, 64ull << 20);
  AnonBuffer buf(buf_bytes);
  if (buf.addr == nullptr) return ErrnoStatus(errno, "calibrate: anonymous buffer", "mmap");
  std::memset(buf.addr, 0x5a, buf_bytes);
  // Fault the whole range in before timing anything.
  std::memset(addr, 0xa5, bytes);
  const std::uint64_t blocks = bytes / block;
  const std::uint64_t buf_blocks = buf_bytes / block;
  const double setup = Since(t0);
  const double left = std::max(budget_s - setup, budget_s * 0.3);

  MemoryCalibration m;
  m.bytes = bytes;
  m.block_bytes = block;
  // Alternating strides keep both sides moving; `i * 7` walks every block when the count is odd
  // and most of them otherwise, enough to defeat the caches on large ranges.
  m.write_bytes_per_s = CopyRate(left * 0.3, block, [&](std::uint64_t i) {
    std::memcpy(addr + (i * 7 % blocks) * block, buf.addr + (i % buf_blocks) * block, block);
  });
  m.read_bytes_per_s = CopyRate(left * 0.3, block, [&](std::uint64_t i) {
    std::memcpy(buf.addr + (i % buf_blocks) * block, addr + (i * 7 % blocks) * block, block);
  });

  // Pointer chase: every line holds the offset of the next one on a random cycle (Sattolo),
  // so each load depends on the previous one and the prefetchers cannot guess it.
  const Clock::time_point chase_start = Clock::now();
  const std::uint64_t lines = std::min<std::uint64_t>(bytes / kLine, 1ull << 22);
  std::vector<std::uint32_t> order(lines);
  for (std::uint64_t i = 0; i < lines; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::mt19937_64 rng(0x5eed);
  for (std::uint64_t i = lines - 1; i > 0; --i) {
    std::uniform_int_distribution<std::uint64_t> pick(0, i - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  for (std::uint64_t i = 0; i < lines; ++i) {
    const std::uint64_t next = order[(i + 1) % lines];
    std::memcpy(addr + order[i] * kLine, &next, sizeof(next));
  }
  const double chase_budget = std::max(left * 0.4 - Since(chase_start), left * 0.1);
  std::uint64_t off = 0;
  std::uint64_t loads = 0;
  const Clock::time_point c0 = Clock::now();
  double elapsed = 0;
  do {
    for (int k = 0; k < 4096; ++k) {
      off = *reinterpret_cast<const volatile std::uint64_t*>(addr + off * kLine);
    }
    loads += 4096;
    elapsed = Since(c0);
  } while (elapsed < chase_budget);
  m.latency_s = elapsed / static_cast<double>(loads);
  if (off >= lines) {  // keeps `off` live; a bad link would be a bug above
    return absl::InternalError("calibrate: pointer chase left the range");
  }
  return m;
}

namespace {

// A scratch file opened O_DIRECT and unlinked at once: nothing is left behind, even on a crash.
absl::StatusOr<int> OpenScratch(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return ErrnoStatus(errno, dir, "statfs");
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": is on tmpfs/ramfs (memory, not NVMe); pass --dir on the NVMe file system"));
  }
  std::random_device rd;
  const std::string path =
      absl::StrCat(dir, "/.cxlkv-calibrate-", ::getpid(), "-", static_cast<std::uint64_t>(rd()));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": the file system refuses O_DIRECT (tmpfs?); pass --dir on the NVMe file system"));
    }
    return ErrnoStatus(err, dir, "open scratch file");
  }
  ::unlink(path.c_str());
  return fd;
}

constexpr std::uint32_t kMinReadsPerThread = 16;

struct ReadRun {
  double bytes_per_s = 0;
  double ops_per_s = 0;
  int error = 0;
};

// `depth` threads issue O_DIRECT preads of `io` bytes at random aligned offsets below
// `file_bytes` until `seconds` pass, and each at least kMinReadsPerThread of them: the
// figure rests on a number of samples, not on a window a thread may not even start in (on a
// loaded machine or under a sanitizer, threads started late found the window closed and the
// calibration measured no reads).
ReadRun ReadAtDepth(int fd, std::uint64_t file_bytes, std::uint32_t io, std::uint32_t depth,
                    double seconds) {
  std::atomic<std::uint64_t> ops{0};
  std::atomic<int> error{0};
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  const std::uint64_t slots = file_bytes / io;
  for (std::uint32_t t = 0; t < depth; ++t) {
    threads.emplace_back([&, t] {
      AlignedPtr buf = AlignedAlloc(io);
      if (buf == nullptr) {
        error.store(ENOMEM);
        return;
      }
      std::mt19937_64 rng(t * 7919 + 1);
      std::uniform_int_distribution<std::uint64_t> pick(0, slots - 1);
      for (std::uint32_t done = 0; (done < kMinReadsPerThread || Clock::now() < deadline) &&
                                   error.load(std::memory_order_relaxed) == 0;
           ++done) {
        const ssize_t n = ::pread(fd, buf.get(), io, static_cast<off_t>(pick(rng) * io));
        if (n != static_cast<ssize_t>(io)) {
          error.store(n < 0 ? errno : EIO);
          return;
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double elapsed = Since(t0);
  ReadRun r;
  r.error = error.load();
  r.ops_per_s = static_cast<double>(ops.load()) / elapsed;
  r.bytes_per_s = r.ops_per_s * io;
  return r;
}

}  // namespace

absl::StatusOr<NvmeCalibration> CalibrateNvme(const std::string& dir, double budget_s,
                                              const CalibrateOptions& o) {
  if (o.nvme_io_bytes < kSector || o.nvme_io_bytes % kSector != 0 || o.nvme_depth == 0 ||
      o.nvme_depth > 256) {
    return absl::InvalidArgumentError(absl::StrCat("calibrate: NVMe I/O size ", o.nvme_io_bytes,
                                                   " must be a multiple of 4096 and depth ",
                                                   o.nvme_depth, " within [1, 256]"));
  }
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<int> fd_or = OpenScratch(dir);
  if (!fd_or.ok()) return fd_or.status();
  const int fd = *fd_or;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  // Fill with random bytes (no zero extents the file system could answer without I/O),
  // within a third of the budget.
  const std::uint32_t chunk = std::max<std::uint32_t>(o.nvme_io_bytes, 1u << 20);
  AlignedPtr wbuf = AlignedAlloc(chunk);
  if (wbuf == nullptr)
    return absl::ResourceExhaustedError("calibrate: no memory for the I/O buffer");
  std::mt19937_64 rng(42);
  for (std::size_t i = 0; i < chunk / 8; ++i) {
    const std::uint64_t v = rng();
    std::memcpy(wbuf.get() + i * 8, &v, 8);
  }
  std::uint64_t written = 0;
  while (written + chunk <= o.nvme_file_bytes &&
         (written < 8ull * chunk || Since(t0) < budget_s / 3)) {
    const ssize_t n = ::pwrite(fd, wbuf.get(), chunk, static_cast<off_t>(written));
    if (n != static_cast<ssize_t>(chunk)) {
      if (n < 0 && errno == EINTR) continue;
      const int err = n < 0 ? errno : ENOSPC;
      return ErrnoStatus(err, dir, "write scratch file");
    }
    written += chunk;
  }
  if (::fdatasync(fd) != 0) return ErrnoStatus(errno, dir, "fdatasync scratch file");
  const double left = std::max(budget_s - Since(t0), budget_s * 0.3);

  NvmeCalibration n;
  n.dir = dir;
  n.file_bytes = written;
  n.depth = o.nvme_depth;
  n.io_bytes = std::min<std::uint32_t>(o.nvme_io_bytes, static_cast<std::uint32_t>(written));

  // Queue depth 1, 4 KiB.
  {
    AlignedPtr rbuf = AlignedAlloc(kSector);
    if (rbuf == nullptr)
      return absl::ResourceExhaustedError("calibrate: no memory for the I/O buffer");
    std::uniform_int_distribution<std::uint64_t> pick(0, written / kSector - 1);
    std::vector<double> lat;
    const Clock::time_point q0 = Clock::now();
    while ((lat.size() < 16 || Since(q0) < left * 0.35) && lat.size() < 200000) {
      const Clock::time_point r0 = Clock::now();
      const ssize_t got = ::pread(fd, rbuf.get(), kSector, static_cast<off_t>(pick(rng) * kSector));
      if (got != static_cast<ssize_t>(kSector)) {
        return ErrnoStatus(got < 0 ? errno : EIO, dir, "read scratch file");
      }
      lat.push_back(Since(r0));
    }
    double sum = 0;
    for (double v : lat) sum += v;
    n.latency_qd1_s = sum / static_cast<double>(lat.size());
    std::nth_element(lat.begin(), lat.begin() + static_cast<std::ptrdiff_t>(lat.size() / 2),
                     lat.end());
    n.latency_qd1_p50_s = lat[lat.size() / 2];
  }
  const ReadRun bw = ReadAtDepth(fd, written, n.io_bytes, n.depth, left * 0.35);
  if (bw.error != 0) return ErrnoStatus(bw.error, dir, "read scratch file at depth");
  n.read_bytes_per_s = bw.bytes_per_s;
  const ReadRun iops = ReadAtDepth(fd, written, kSector, n.depth, left * 0.25);
  if (iops.error != 0) return ErrnoStatus(iops.error, dir, "read scratch file at depth");
  n.iops = iops.ops_per_s;
  if (!(n.read_bytes_per_s > 0 && n.iops > 0 && n.latency_qd1_s > 0)) {
    return absl::InternalError(absl::StrCat(dir, ": calibration measured no reads"));
  }
  return n;
}

absl::StatusOr<Calibration> Calibrate(const Region* region, const std::string& nvme_dir,
                                      const CalibrateOptions& o) {
  if (!(o.budget_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibrate: budget ", o.budget_s, " s must be positive"));
  }
  const Clock::time_point t0 = Clock::now();
  const double mem_budget = nvme_dir.empty() ? o.budget_s : o.budget_s * 0.4;
  Calibration c;
  {
    std::uint64_t magic = 0;
    if (region != nullptr && region->size_bytes() >= sizeof(magic)) {
      std::memcpy(&magic, region->addr(), sizeof(magic));
      if (magic == kArenaMagic || magic == kFormattingMagic) {
        return absl::FailedPreconditionError(
            absl::StrCat(region->name(),
                         ": holds a cxlkv arena, and calibration overwrites the memory it "
                         "measures; calibrate on a scratch source such as "
                         "file:/dev/shm/cxlkv-calibrate?size=256M (or the device before it "
                         "is formatted)"));
      }
    }
    MemoryCalibration m;
    if (region != nullptr) {
      auto r = CalibrateMemory(region->addr(), std::min(region->size_bytes(), o.memory_bytes),
                               mem_budget, o);
      if (!r.ok()) return r.status();
      m = *std::move(r);
      m.source = region->spec().ToString();
      m.tier = region->spec().shared                       ? "cxl-pooled"
               : region->spec().kind == SourceKind::kMemfd ? "dram"
                                                           : "cxl-expanded";
    } else {
      AnonBuffer anon(o.memory_bytes);
      if (anon.addr == nullptr) return ErrnoStatus(errno, "calibrate: anonymous memory", "mmap");
      auto r = CalibrateMemory(anon.addr, o.memory_bytes, mem_budget, o);
      if (!r.ok()) return r.status();
      m = *std::move(r);
      m.source = "anonymous";
      m.tier = "dram";
    }
    c.memory = m;
  }
  if (!nvme_dir.empty()) {
    auto n = CalibrateNvme(nvme_dir, std::max(o.budget_s - Since(t0), o.budget_s * 0.3), o);
    if (!n.ok()) return n.status();
    c.nvme = *std::move(n);
  }
  c.duration_s = Since(t0);
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  c.measured_at = buf;
  return c;
}

// ---- JSON ---------------------------------------------------------------------------------

std::string CalibrationToJson(const Calibration& c, int indent) {
  nlohmann::json j = {{"format", "cxlkv-calibration"},
                      {"version", 1},
                      {"measured_at", c.measured_at},
                      {"duration_s", c.duration_s}};
  if (c.memory) {
    const MemoryCalibration& m = *c.memory;
    j["memory"] = {{"source", m.source},
                   {"tier", m.tier},
                   {"read_bytes_per_s", m.read_bytes_per_s},
                   {"write_bytes_per_s", m.write_bytes_per_s},
                   {"latency_s", m.latency_s},
                   {"bytes", m.bytes},
                   {"block_bytes", m.block_bytes}};
  }
  if (c.nvme) {
    const NvmeCalibration& n = *c.nvme;
    j["nvme"] = {{"dir", n.dir},
                 {"file_bytes", n.file_bytes},
                 {"latency_qd1_s", n.latency_qd1_s},
                 {"latency_qd1_p50_s", n.latency_qd1_p50_s},
                 {"read_bytes_per_s", n.read_bytes_per_s},
                 {"iops", n.iops},
                 {"depth", n.depth},
                 {"io_bytes", n.io_bytes}};
  }
  return j.dump(indent);
}

namespace {

class JsonReader {
 public:
  explicit JsonReader(absl::string_view source) : source_(source) {}
  absl::Status Error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", field, ": ", what));
  }
  absl::Status Positive(const nlohmann::json& o, const std::string& section, const char* key,
                        double* out) const {
    const std::string field = section + "." + key;
    auto it = o.find(key);
    if (it == o.end()) return Error(field, "missing");
    if (!it->is_number()) return Error(field, "expected a number");
    const double v = it->get<double>();
    if (!(v > 0) || !std::isfinite(v))
      return Error(field, absl::StrCat(v, " is not a positive figure"));
    *out = v;
    return absl::OkStatus();
  }
  template <typename U>
  absl::Status Unsigned(const nlohmann::json& o, const std::string& section, const char* key,
                        U* out) const {
    const std::string field = section + "." + key;
    auto it = o.find(key);
    if (it == o.end()) return Error(field, "missing");
    if (!it->is_number_unsigned()) return Error(field, "expected a non-negative integer");
    const std::uint64_t v = it->get<std::uint64_t>();
    if (v > std::numeric_limits<U>::max()) return Error(field, "too large");
    *out = static_cast<U>(v);
    return absl::OkStatus();
  }
  absl::Status String(const nlohmann::json& o, const std::string& section, const char* key,
                      std::string* out) const {
    const std::string field = section.empty() ? key : section + "." + key;
    auto it = o.find(key);
    if (it == o.end()) return Error(field, "missing");
    if (!it->is_string()) return Error(field, "expected a string");
    *out = it->get<std::string>();
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

}  // namespace

absl::StatusOr<Calibration> CalibrationFromJson(absl::string_view text, absl::string_view source) {
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  JsonReader r(source);
  if (j.is_discarded() || !j.is_object()) {
    return r.Error("(file)", "not a JSON object (write one with `cxlkvctl calibrate --out FILE`)");
  }
  // (j.value() would throw on a "format" that is not a string: found by placement_fuzz.)
  if (!j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "cxlkv-calibration") {
    return r.Error("format", "expected \"cxlkv-calibration\" (not a calibration file)");
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != 1) {
    return r.Error("version", "expected 1 (written by another cxlkv version?)");
  }
  Calibration c;
  if (auto s = r.String(j, "", "measured_at", &c.measured_at); !s.ok()) return s;
  if (j.contains("duration_s") && j["duration_s"].is_number())
    c.duration_s = j["duration_s"].get<double>();
  if (j.contains("memory")) {
    const nlohmann::json& o = j["memory"];
    if (!o.is_object()) return r.Error("memory", "expected an object");
    MemoryCalibration m;
    absl::Status s = r.String(o, "memory", "source", &m.source);
    if (s.ok()) s = r.String(o, "memory", "tier", &m.tier);
    if (s.ok() && m.tier != "dram" && m.tier != "cxl-expanded" && m.tier != "cxl-pooled") {
      s = r.Error("memory.tier",
                  absl::StrCat("'", m.tier, "' is not dram, cxl-expanded or cxl-pooled"));
    }
    if (s.ok()) s = r.Positive(o, "memory", "read_bytes_per_s", &m.read_bytes_per_s);
    if (s.ok()) s = r.Positive(o, "memory", "write_bytes_per_s", &m.write_bytes_per_s);
    if (s.ok()) s = r.Positive(o, "memory", "latency_s", &m.latency_s);
    if (s.ok()) s = r.Unsigned(o, "memory", "bytes", &m.bytes);
    if (s.ok()) s = r.Unsigned(o, "memory", "block_bytes", &m.block_bytes);
    if (!s.ok()) return s;
    c.memory = m;
  }
  if (j.contains("nvme")) {
    const nlohmann::json& o = j["nvme"];
    if (!o.is_object()) return r.Error("nvme", "expected an object");
    NvmeCalibration n;
    absl::Status s = r.String(o, "nvme", "dir", &n.dir);
    if (s.ok()) s = r.Unsigned(o, "nvme", "file_bytes", &n.file_bytes);
    if (s.ok()) s = r.Positive(o, "nvme", "latency_qd1_s", &n.latency_qd1_s);
    if (s.ok()) s = r.Positive(o, "nvme", "latency_qd1_p50_s", &n.latency_qd1_p50_s);
    if (s.ok()) s = r.Positive(o, "nvme", "read_bytes_per_s", &n.read_bytes_per_s);
    if (s.ok()) s = r.Positive(o, "nvme", "iops", &n.iops);
    if (s.ok()) s = r.Unsigned(o, "nvme", "depth", &n.depth);
    if (s.ok()) s = r.Unsigned(o, "nvme", "io_bytes", &n.io_bytes);
    if (!s.ok()) return s;
    c.nvme = n;
  }
  if (!c.memory && !c.nvme) return r.Error("(file)", "holds neither memory nor nvme figures");
  // Figures the rule could not take (a memory latency of milliseconds, say) are refused here,
  // naming this file, rather than later by the rule. (Found by fuzz/placement_fuzz.)
  PlacementParams check;
  (void)ApplyCalibration(c, &check);
  if (auto st = check.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": a figure is outside what the placement rule accepts: ", st.message()));
  }
  return c;
}

absl::Status SaveCalibration(const Calibration& c, const std::string& path) {
  // The placement rule reads this file at every start: never torn, never empty (base/file.h).
  return base::ReplaceFile(path, CalibrationToJson(c) + "\n", 0644);
}

absl::StatusOr<Calibration> LoadCalibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read calibration '", path,
                     "' (write one with `cxlkvctl calibrate --dir DIR --out FILE`)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return CalibrationFromJson(ss.str(), path);
}

std::vector<std::string> ApplyCalibration(const Calibration& c, PlacementParams* p) {
  std::vector<std::string> changes;
  auto set = [&](const std::string& name, double* field, double v) {
    changes.push_back(absl::StrCat(name, ": ", *field, " -> ", v, " (calibration)"));
    *field = v;
  };
  if (c.memory && c.memory->tier != "dram") {
    const int t = c.memory->tier == "cxl-pooled" ? 1 : 0;
    const std::string k = c.memory->tier;
    set(k + ".latency_s", &p->cxl[t].figures.latency_s, c.memory->latency_s);
    set(k + ".read_bytes_per_s", &p->cxl[t].figures.read_bytes_per_s, c.memory->read_bytes_per_s);
  }
  if (c.nvme) {
    set("nvme.latency_s", &p->nvme.latency_s, c.nvme->latency_qd1_s);
    set("nvme.read_bytes_per_s", &p->nvme.read_bytes_per_s, c.nvme->read_bytes_per_s);
    set("nvme.iops", &p->nvme_iops, c.nvme->iops);
  }
  return changes;
}

}  // namespace cxlkv::tier
