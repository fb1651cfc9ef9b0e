// What a serving engine does with pinned host memory, on a real GPU, for the preload shim
// (docs/preload.md, docs/gpu.md). Knows nothing of cxlkv: run it plain and under
// LD_PRELOAD=libcxlkv_preload.so. Linked against the shared CUDA runtime (as PyTorch is), so
// the shim's cudaHostAlloc / cudaMallocHost / cudaHostRegister are the ones it calls.
//
// Steps, each with checksums of real bytes both ways:
//   hostalloc   cudaHostAlloc(Portable|Mapped) of 256 MiB (PyTorch's pinned allocator),
//               cudaHostGetDevicePointer, H2D then D2H through HBM, bandwidth of each
//   mallochost  cudaMallocHost of 64 MiB (the older engines' staging buffers), the same
//   shm         vLLM's offload region: /dev/shm/cxlkv_gpu_engine_<pid>.mmap created O_EXCL,
//               ftruncate'd, mapped MAP_SHARED, populated with MADV_POPULATE_WRITE, one
//               cudaHostRegister(ptr, bytes, 0) of all of it (timed), copies both ways,
//               cudaHostUnregister, unmap, unlink
// For each host buffer it names the mapping /proc/self/maps shows for it, so a run under the
// shim shows whether the pool served it. --expect-pool SUBSTR: the hostalloc and mallochost
// buffers' mappings must contain SUBSTR (e.g. the pool's memfd name).
//
//   preload_gpu_engine [--json FILE] [--expect-pool SUBSTR] [--shm-bytes BYTES]
// Exit status: 0 every check passed (or no device: printed, nothing checked); 1 a check
// failed; 2 usage or setup error.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
int g_failures = 0;
std::vector<std::string> g_json;

void Fail(const std::string& what) {
  std::fprintf(stderr, "preload_gpu_engine: FAILED: %s\n", what.c_str());
  ++g_failures;
}

bool Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  Fail(std::string(what) + ": " + cudaGetErrorString(e) + " (error " + std::to_string(e) + ")");
  return false;
}

std::uint64_t Fnv(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void Pattern(unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
}

// The pathname /proc/self/maps gives the mapping that holds `addr` ("[anon]" for none).
std::string MappingOf(const void* addr) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2) continue;
    if (a < lo || a >= hi) continue;
    std::istringstream in(line);
    std::string f[5], path;
    in >> f[0] >> f[1] >> f[2] >> f[3] >> f[4];
    std::getline(in, path);
    const auto s = path.find_first_not_of(' ');
    return s == std::string::npos ? "[anon]" : path.substr(s);
  }
  return "[not mapped]";
}

std::string Quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += (c == '\n' ? ' ' : c);
  }
  return o + "\"";
}

// H2D of `bytes` from host into dev, zero the host, D2H back, compare. Returns GB/s each way.
void RoundTrip(const char* step, unsigned char* host, void* dev, std::size_t bytes,
               std::uint64_t seed, const std::string& mapping, double register_ms) {
  Pattern(host, bytes, seed);
  const std::uint64_t want = Fnv(host, bytes);
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr, e2 = nullptr;
  if (!Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !Cuda(cudaEventCreate(&e0), "cudaEventCreate") ||
      !Cuda(cudaEventCreate(&e1), "cudaEventCreate") ||
      !Cuda(cudaEventCreate(&e2), "cudaEventCreate")) {
    return;
  }
  float h2d_ms = 0, d2h_ms = 0;
  bool ok = Cuda(cudaEventRecord(e0, s), "cudaEventRecord") &&
            Cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "H2D") &&
            Cuda(cudaEventRecord(e1, s), "cudaEventRecord") &&
            Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (ok) {
    std::memset(host, 0, bytes);
    ok = Cuda(cudaEventRecord(e1, s), "cudaEventRecord") &&
         Cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s), "D2H") &&
         Cuda(cudaEventRecord(e2, s), "cudaEventRecord") &&
         Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  // Timings from a second, warm pass so the first touch of the pages is not in them.
  if (ok) {
    ok = Cuda(cudaEventRecord(e0, s), "cudaEventRecord") &&
         Cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "H2D") &&
         Cuda(cudaEventRecord(e1, s), "cudaEventRecord") &&
         Cuda(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s), "D2H") &&
         Cuda(cudaEventRecord(e2, s), "cudaEventRecord") &&
         Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize") &&
         Cuda(cudaEventElapsedTime(&h2d_ms, e0, e1), "cudaEventElapsedTime") &&
         Cuda(cudaEventElapsedTime(&d2h_ms, e1, e2), "cudaEventElapsedTime");
  }
  const std::uint64_t got = ok ? Fnv(host, bytes) : 0;
  if (ok && got != want) Fail(std::string(step) + ": bytes back from the GPU differ");
  const double gbs_h2d = h2d_ms > 0 ? static_cast<double>(bytes) / (h2d_ms * 1e6) : 0;
  const double gbs_d2h = d2h_ms > 0 ? static_cast<double>(bytes) / (d2h_ms * 1e6) : 0;
  std::printf("%-10s %6zu MiB  mapping %-40s h2d %6.1f GB/s  d2h %6.1f GB/s  %s\n", step,
              bytes / kMiB, mapping.c_str(), gbs_h2d, gbs_d2h,
              ok && got == want ? "checksums match" : "FAILED");
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"step\":\"%s\",\"bytes\":%zu,\"mapping\":%s,\"ok\":%s,\"h2d_GBps\":%.2f,"
                "\"d2h_GBps\":%.2f,\"register_ms\":%.2f}",
                step, bytes, Quote(mapping).c_str(), ok && got == want ? "true" : "false", gbs_h2d,
                gbs_d2h, register_ms);
  g_json.emplace_back(buf);
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2), cudaStreamDestroy(s);
}

void CheckPool(const char* step, const std::string& mapping, const std::string& expect) {
  if (!expect.empty() && mapping.find(expect) == std::string::npos) {
    Fail(std::string(step) + ": the buffer is in mapping '" + mapping + "', not the pool ('" +
         expect + "')");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, expect;
  std::size_t shm_bytes = 1024 * kMiB;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--expect-pool" && i + 1 < argc) {
      expect = argv[++i];
    } else if (a == "--shm-bytes" && i + 1 < argc) {
      shm_bytes = std::strtoull(argv[++i], nullptr, 0);
    } else {
      std::fprintf(stderr,
                   "usage: preload_gpu_engine [--json FILE] [--expect-pool SUBSTR] "
                   "[--shm-bytes BYTES]\n");
      return 2;
    }
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("preload_gpu_engine: skipped, no CUDA device: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    return 0;
  }
  void* dev = nullptr;
  if (!Cuda(cudaMalloc(&dev, std::max<std::size_t>(shm_bytes, 256 * kMiB)), "cudaMalloc")) return 2;

  // PyTorch's pinned allocator: cudaHostAlloc, mapped (zero-copy pointer asked for).
  {
    void* p = nullptr;
    const std::size_t n = 256 * kMiB;
    if (Cuda(cudaHostAlloc(&p, n, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc")) {
      void* dp = nullptr;
      Cuda(cudaHostGetDevicePointer(&dp, p, 0), "cudaHostGetDevicePointer of cudaHostAlloc memory");
      const std::string m = MappingOf(p);
      CheckPool("hostalloc", m, expect);
      RoundTrip("hostalloc", static_cast<unsigned char*>(p), dev, n, 1, m, 0);
      Cuda(cudaFreeHost(p), "cudaFreeHost");
    }
  }
  // Staging buffers of older engines: cudaMallocHost.
  {
    void* p = nullptr;
    const std::size_t n = 64 * kMiB;
    if (Cuda(cudaMallocHost(&p, n), "cudaMallocHost")) {
      const std::string m = MappingOf(p);
      CheckPool("mallochost", m, expect);
      RoundTrip("mallochost", static_cast<unsigned char*>(p), dev, n, 2, m, 0);
      Cuda(cudaFreeHost(p), "cudaFreeHost");
    }
  }
  // vLLM's offload region: one file in /dev/shm, one cudaHostRegister of all of it.
  {
    const std::string path = "/dev/shm/cxlkv_gpu_engine_" + std::to_string(::getpid()) + ".mmap";
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(shm_bytes)) != 0) {
      Fail("create " + path + ": " + std::strerror(errno));
    } else {
      void* p = ::mmap(nullptr, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        Fail("mmap " + path + ": " + std::strerror(errno));
      } else {
#ifdef MADV_POPULATE_WRITE
        if (::madvise(p, shm_bytes, MADV_POPULATE_WRITE) != 0) {
          std::printf("madvise(MADV_POPULATE_WRITE): %s (pages fault in on first use)\n",
                      std::strerror(errno));
        }
#endif
        const auto t0 = std::chrono::steady_clock::now();
        const bool reg = Cuda(cudaHostRegister(p, shm_bytes, 0), "cudaHostRegister of the region");
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        const std::string m = MappingOf(p);
        RoundTrip("shm", static_cast<unsigned char*>(p), dev, shm_bytes, 3, m, reg ? ms : -1);
        if (reg) Cuda(cudaHostUnregister(p), "cudaHostUnregister");
        ::munmap(p, shm_bytes);
      }
      ::close(fd);
    }
    ::unlink(path.c_str());
  }
  cudaFree(dev);
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    j << "{\"failures\":" << g_failures << ",\"steps\":[";
    for (std::size_t i = 0; i < g_json.size(); ++i) j << (i ? "," : "") << g_json[i];
    j << "]}\n";
  }
  std::printf("preload_gpu_engine: %s\n", g_failures == 0 ? "all checks passed" : "FAILED");
  return g_failures == 0 ? 0 : 1;
}
