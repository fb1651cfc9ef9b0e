// nvme_benchmark — the NVMe tier (nvme::NvmeStore) at KV block sizes; bench/nvme_vs_fio.sh
// runs it beside fio (io_uring, O_DIRECT, same directory, sizes and depths) and prints ratios.
//
//   NvmeWrite/<bytes>/qd:<n>        Puts of new blocks into free slots, n in flight; bytes/s
//   NvmeRead/<bytes>/qd:<n>         Gets of random stored blocks, n in flight; bytes/s
//   NvmeReadLatency/<bytes>/qd:1    one synchronous Get at a time; time per Get, p50/p99
//   NvmeReadLatencyPaired/<bytes>/qd:1
//                                   a synchronous Get and a bare io_uring read of another stored
//                                   block's payload (fio's QD 1 I/O: one read, O_DIRECT, the same
//                                   file, io_uring set up with fio 3.33's flags), alternating I/O
//                                   by I/O, so load on a shared machine hits both alike; means,
//                                   p50s and bare/Get ratios as counters. Two more arms:
//                                   "hashed", a direct Get's I/O without the store (the read on
//                                   a ring set up as the store's, then XXH3), and "huge", fio's
//                                   read into a buffer in 2 MiB pages: the disk's own time, the
//                                   limit (limit_ratio = huge / Get). "staged": whether the
//                                   store stages reads (NvmeStoreOptions::read_staging, measured
//                                   at Open). The time per iteration covers all four.
// Bytes are payload bytes (a write also moves its slot's 4 KiB header; a read the payload alone).
// One store per block size, capacity CXLKV_NVME_BENCH_MB (default 512) MiB, in CXLKV_NVME_BENCH_DIR
// (default /var/tmp/cxlkv-nvme-bench); each store is removed before the next size. Before the timed
// writes the file is written once in full, so timed writes overwrite allocated blocks (as
// fio's do on its laid-out file); when the store fills, it is emptied untimed.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cxlkv/nvme/nvme_layout.h"
#include "cxlkv/nvme/nvme_store.h"

namespace {

using cxlkv::nvme::NvmeBatch;
using cxlkv::nvme::NvmeKey;
using cxlkv::nvme::NvmeStore;

constexpr std::int64_t kSizes[] = {64 << 10, 256 << 10, 2 << 20};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "nvme_benchmark: %s\n", msg.c_str());
  std::exit(1);
}

std::string BenchDir() {
  const char* d = std::getenv("CXLKV_NVME_BENCH_DIR");
  return d != nullptr ? d : "/var/tmp/cxlkv-nvme-bench";
}

std::uint64_t CapacityBytes() {
  const char* m = std::getenv("CXLKV_NVME_BENCH_MB");
  return (m != nullptr ? std::strtoull(m, nullptr, 10) : 512) << 20;
}

NvmeKey Key(std::uint64_t space, std::uint64_t i) { return NvmeKey{i, space}; }

struct Buffer {
  explicit Buffer(std::uint64_t bytes)
      : p(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes))) {
    for (std::uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 131 + 7);
  }
  ~Buffer() { std::free(p); }
  unsigned char* p;
};

// The store of the current block size; a new size removes the old store first.
struct Fixture {
  std::uint64_t payload = 0;
  std::unique_ptr<NvmeStore> store;
  std::uint64_t slots = 0;
  std::uint64_t write_keys = 0;  // keys of the write benchmark now stored (space 1)
  std::uint64_t read_keys = 0;   // keys of the read benchmarks stored (space 2)

  static Fixture& For(std::uint64_t payload) {
    static Fixture f;
    if (f.payload != payload) f.Reset(payload);
    return f;
  }

  void Reset(std::uint64_t bytes) {
    store.reset();
    const std::string dir = BenchDir();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    cxlkv::nvme::NvmeStoreOptions o;
    o.dir = dir;
    o.payload_bytes = bytes;
    o.capacity_bytes = CapacityBytes();
    o.queue_depth = 64;
    // CXLKV_NVME_READ_STAGING=always|never overrides the store's own choice (auto: measured
    // at Open), for A/B runs of the same build.
    if (const char* e = std::getenv("CXLKV_NVME_READ_STAGING"); e != nullptr) {
      const std::string v = e;
      if (v == "always") {
        o.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kAlways;
      } else if (v == "never") {
        o.read_staging = cxlkv::nvme::NvmeStoreOptions::ReadStaging::kNever;
      } else if (v != "auto") {
        Die("CXLKV_NVME_READ_STAGING must be auto, always or never, not " + v);
      }
    }
    cxlkv::nvme::NvmeOpenReport report;
    auto s = NvmeStore::Open(o, &report);
    if (!s.ok()) Die(std::string(s.status().message()));
    std::fprintf(
        stderr,
        "nvme store, %llu-byte blocks: read probe direct %.1f us, staged %.1f us%s -> "
        "reads %s\n",
        static_cast<unsigned long long>(bytes), report.read_probe_direct_us,
        report.read_probe_staged_us,
        report.read_probe_error.empty() ? "" : (" (" + report.read_probe_error + ")").c_str(),
        report.reads_staged ? "staged" : "direct");
    store = std::move(*s);
    payload = bytes;
    slots = o.capacity_bytes / store->slot_bytes();
    write_keys = read_keys = 0;
  }

  // Stores keys [0, n) of `space` with qd in flight (untimed set-up).
  void Fill(std::uint64_t space, std::uint64_t n) {
    Buffer src(payload);
    std::vector<std::unique_ptr<NvmeBatch>> b(32);
    for (auto& x : b) x = std::make_unique<NvmeBatch>();
    for (std::uint64_t i = 0; i < n; ++i) {
      NvmeBatch& x = *b[i % b.size()];
      store->Wait(x);
      if (!x.first_error().ok()) Die(std::string(x.first_error().message()));
      x.Clear();
      x.AddPut(Key(space, i), src.p, payload);
      (void)store->Submit(x);
    }
    for (auto& x : b) store->Wait(*x);
  }

  void Empty(std::uint64_t space, std::uint64_t n) {
    NvmeBatch d;
    for (std::uint64_t i = 0; i < n; ++i) d.AddDelete(Key(space, i));
    (void)store->Submit(d);
    store->Wait(d);
    store->Drain();
  }
};

// One op per benchmark iteration, `qd` single-op batches in flight: waits for the oldest,
// then submits the next op in its batch (as fio keeps iodepth I/Os in flight).
template <typename MakeOp>
void Pipeline(benchmark::State& state, NvmeStore& store, int qd, MakeOp make) {
  std::vector<std::unique_ptr<NvmeBatch>> b(static_cast<std::size_t>(qd));
  for (auto& x : b) x = std::make_unique<NvmeBatch>();
  std::uint64_t i = 0;
  for (auto _ : state) {
    NvmeBatch& x = *b[i % b.size()];
    store.Wait(x);
    if (!x.first_error().ok()) {
      state.SkipWithError(std::string(x.first_error().message()).c_str());
      break;
    }
    x.Clear();
    make(x, i, state);
    (void)store.Submit(x);
    ++i;
  }
  for (auto& x : b) store.Wait(*x);
}

void NvmeWrite(benchmark::State& state, std::uint64_t bytes, int qd) {
  Fixture& f = Fixture::For(bytes);
  if (f.read_keys != 0) {
    f.Empty(2, f.read_keys);
    f.read_keys = 0;
  }
  if (f.write_keys == 0) {  // write the whole file once: timed writes then overwrite
    f.Fill(1, f.slots);
    f.Empty(1, f.slots);
  }
  Buffer src(bytes);
  const std::uint64_t limit = f.slots - static_cast<std::uint64_t>(qd);
  std::uint64_t next = 0;
  Pipeline(state, *f.store, qd, [&](NvmeBatch& x, std::uint64_t, benchmark::State& st) {
    if (next == limit) {  // full: empty it, untimed
      st.PauseTiming();
      f.store->Drain();
      f.Empty(1, next);
      next = 0;
      st.ResumeTiming();
    }
    x.AddPut(Key(1, next++), src.p, bytes);
  });
  f.store->Drain();
  f.write_keys = next;
  f.Empty(1, next);
  f.write_keys = 0;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void EnsureReadSet(Fixture& f) {
  if (f.read_keys != 0) return;
  f.read_keys = f.slots - 1;
  f.Fill(2, f.read_keys);
}

void NvmeRead(benchmark::State& state, std::uint64_t bytes, int qd) {
  Fixture& f = Fixture::For(bytes);
  EnsureReadSet(f);
  std::vector<std::unique_ptr<Buffer>> dst;
  for (int i = 0; i < qd; ++i) dst.push_back(std::make_unique<Buffer>(bytes));
  std::mt19937_64 rng(42);
  Pipeline(state, *f.store, qd, [&](NvmeBatch& x, std::uint64_t i, benchmark::State&) {
    x.AddGet(Key(2, rng() % f.read_keys), dst[i % dst.size()]->p, bytes);
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void NvmeReadLatency(benchmark::State& state, std::uint64_t bytes) {
  Fixture& f = Fixture::For(bytes);
  EnsureReadSet(f);
  Buffer dst(bytes);
  std::mt19937_64 rng(7);
  std::vector<double> us;
  us.reserve(1 << 16);
  for (auto _ : state) {
    struct timespec a {}, b {};
    ::clock_gettime(CLOCK_MONOTONIC, &a);
    auto n = f.store->Get(Key(2, rng() % f.read_keys), dst.p, bytes);
    ::clock_gettime(CLOCK_MONOTONIC, &b);
    if (!n.ok()) {
      state.SkipWithError(std::string(n.status().message()).c_str());
      break;
    }
    us.push_back(static_cast<double>(b.tv_sec - a.tv_sec) * 1e6 +
                 static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e3);
  }
  if (!us.empty()) {
    std::sort(us.begin(), us.end());
    state.counters["p50_us"] = us[us.size() / 2];
    state.counters["p99_us"] = us[us.size() * 99 / 100];
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

double NowUs() {
  struct timespec t {};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

struct LatencyStats {
  double mean = 0, p50 = 0, p99 = 0;
};
LatencyStats Summarize(std::vector<double>& us) {
  LatencyStats s;
  if (us.empty()) return s;
  for (double x : us) s.mean += x;
  s.mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  s.p50 = us[us.size() / 2];
  s.p99 = us[us.size() * 99 / 100];
  return s;
}

// The reference arms of NvmeReadLatencyPaired: what fio's io_uring engine does at iodepth=1
// (one IORING_OP_READ of the block into one buffer, submit, then wait in a second
// io_uring_enter), on the store's own slots file opened O_DIRECT, reading a stored payload at
// its 4 KiB-aligned offset.
//   kFio      fio's I/O: its ring setup flags (COOP_TASKRUN, SINGLE_ISSUER, DEFER_TASKRUN, as
//             strace of fio 3.33 shows; none where the kernel refuses them), its buffer from
//             malloc, in 4 KiB pages
//   kHashed   the same read on a ring set up as the store's (no flags), then XXH3 of the
//             payload: a direct Get without the store's code
//   kFioHuge  kFio into a buffer in 2 MiB pages: the device's own time for the read, what no
//             reader on this disk can beat
class BareReader {
 public:
  enum class Arm { kFio, kHashed, kFioHuge };
  BareReader(const std::string& path, std::uint64_t bytes, Arm arm) : bytes_(bytes), arm_(arm) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0) Die(absl::StrCat(path, ": open: ", std::strerror(errno)));
    io_uring_params p{};
    if (arm != Arm::kHashed) {
      p.flags =
          IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    }
    if (io_uring_queue_init_params(1, &ring_, &p) < 0) {
      p = io_uring_params{};
      if (int rc = io_uring_queue_init_params(1, &ring_, &p); rc < 0) {
        Die(absl::StrCat("io_uring_queue_init: ", std::strerror(-rc)));
      }
    }
    flags_ = p.flags;
    if (arm == Arm::kFioHuge) {
      map_bytes_ = (bytes + (4 << 20) - 1) / (2 << 20) * (2 << 20);
      void* m =
          ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) Die(absl::StrCat("mmap: ", std::strerror(errno)));
      map_ = m;
      const auto a = (reinterpret_cast<std::uintptr_t>(m) + (2 << 20) - 1) &
                     ~static_cast<std::uintptr_t>((2 << 20) - 1);
      buf_ = reinterpret_cast<void*>(a);
      (void)::madvise(buf_, map_bytes_ - (a - reinterpret_cast<std::uintptr_t>(m)), MADV_HUGEPAGE);
    } else {
      buf_ = std::aligned_alloc(4096, bytes);
    }
    std::memset(buf_, 0, bytes);
  }
  ~BareReader() {
    io_uring_queue_exit(&ring_);
    ::close(fd_);
    if (map_ != nullptr) {
      ::munmap(map_, map_bytes_);
    } else {
      std::free(buf_);
    }
  }
  // offset: of the payload. Returns the payload's XXH3 for kHashed, else 0.
  std::uint64_t Read(std::uint64_t offset) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, fd_, buf_, static_cast<unsigned>(bytes_), offset);
    io_uring_submit(&ring_);
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0 || cqe->res != static_cast<int>(bytes_)) {
      Die(absl::StrCat("bare read at ", offset, ": ", rc < 0 ? rc : cqe->res));
    }
    io_uring_cqe_seen(&ring_, cqe);
    return arm_ == Arm::kHashed ? XXH3_64bits(buf_, bytes_) : 0;
  }
  unsigned flags() const { return flags_; }

 private:
  int fd_ = -1;
  io_uring ring_{};
  unsigned flags_ = 0;
  void* buf_ = nullptr;
  void* map_ = nullptr;
  std::uint64_t map_bytes_ = 0;
  std::uint64_t bytes_;
  Arm arm_;
};

void NvmeReadLatencyPaired(benchmark::State& state, std::uint64_t bytes) {
  Fixture& f = Fixture::For(bytes);
  EnsureReadSet(f);
  std::vector<std::uint64_t> payload_offsets(f.read_keys);
  for (std::uint64_t i = 0; i < f.read_keys; ++i) {
    auto loc = f.store->Locate(Key(2, i));
    if (!loc.ok()) Die(std::string(loc.status().message()));
    payload_offsets[i] = loc->offset + cxlkv::nvme::kNvmeHeaderBytes;
  }
  using Arm = BareReader::Arm;
  BareReader fio(f.store->slots_path(), bytes, Arm::kFio);
  BareReader hashed(f.store->slots_path(), bytes, Arm::kHashed);
  BareReader huge(f.store->slots_path(), bytes, Arm::kFioHuge);
  BareReader* bare[] = {nullptr, &fio, &hashed, &huge};
  constexpr std::uint64_t kArms = 4;  // get, fio, hashed, fio into 2 MiB pages
  Buffer dst(bytes);
  std::mt19937_64 rng(7);
  std::vector<double> us[kArms];
  for (auto& v : us) v.reserve(1 << 16);
  std::uint64_t i = 0, sink = 0;
  for (auto _ : state) {
    for (std::uint64_t k = 0; k < kArms; ++k) {
      const std::uint64_t arm = (i + k) % kArms;  // the order rotates every iteration
      const std::uint64_t key = rng() % f.read_keys;
      const double a = NowUs();
      if (arm == 0) {
        auto n = f.store->Get(Key(2, key), dst.p, bytes);
        if (!n.ok()) {
          state.SkipWithError(std::string(n.status().message()).c_str());
          return;
        }
      } else {
        sink += bare[arm]->Read(payload_offsets[key]);
      }
      us[arm].push_back(NowUs() - a);
    }
    ++i;
  }
  benchmark::DoNotOptimize(sink);
  const LatencyStats g = Summarize(us[0]), r = Summarize(us[1]), h = Summarize(us[2]),
                     l = Summarize(us[3]);
  state.counters["get_mean_us"] = g.mean;
  state.counters["get_p50_us"] = g.p50;
  state.counters["get_p99_us"] = g.p99;
  state.counters["bare_mean_us"] = r.mean;
  state.counters["bare_p50_us"] = r.p50;
  state.counters["bare_p99_us"] = r.p99;
  state.counters["hashed_mean_us"] = h.mean;
  state.counters["hashed_p50_us"] = h.p50;
  state.counters["huge_mean_us"] = l.mean;
  state.counters["huge_p50_us"] = l.p50;
  state.counters["ratio_mean"] = g.mean > 0 ? r.mean / g.mean : 0;
  state.counters["ratio_p50"] = g.p50 > 0 ? r.p50 / g.p50 : 0;
  state.counters["limit_ratio_mean"] = g.mean > 0 ? l.mean / g.mean : 0;
  state.counters["bare_ring_flags"] = static_cast<double>(fio.flags());
  state.counters["staged"] = f.store->stages_reads() ? 1 : 0;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kArms * bytes));
}

void Register() {
  for (std::int64_t size : kSizes) {
    const auto bytes = static_cast<std::uint64_t>(size);
    benchmark::RegisterBenchmark(absl::StrCat("NvmeWrite/", bytes, "/qd:32").c_str(),
                                 [bytes](benchmark::State& s) { NvmeWrite(s, bytes, 32); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(absl::StrCat("NvmeRead/", bytes, "/qd:32").c_str(),
                                 [bytes](benchmark::State& s) { NvmeRead(s, bytes, 32); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    if (bytes <= (256 << 10)) {
      benchmark::RegisterBenchmark(absl::StrCat("NvmeReadLatency/", bytes, "/qd:1").c_str(),
                                   [bytes](benchmark::State& s) { NvmeReadLatency(s, bytes); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(
          absl::StrCat("NvmeReadLatencyPaired/", bytes, "/qd:1").c_str(),
          [bytes](benchmark::State& s) { NvmeReadLatencyPaired(s, bytes); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("nvme_dir", BenchDir());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(BenchDir(), ec);
  return 0;
}
